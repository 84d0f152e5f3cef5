//! A `LISTEN` connection that goes silent without a reset (a network path that drops packets):
//! the relay notices by its heartbeat, listens again, and wakes on commits again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::{Relay, RelayConfig};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{emit_committed, eventually, open_schemas, raw_event, run_relay};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use uuid::Uuid;

/// A TCP proxy in front of Postgres whose connections can be frozen one by one: a frozen
/// connection stops carrying bytes either way, and nobody is told (no reset, no close).
#[derive(Clone, Default)]
struct Proxy {
    /// Per connection, by the port Postgres sees it come from: whether it is frozen.
    frozen: Arc<Mutex<HashMap<u16, Arc<AtomicBool>>>>,
}

impl Proxy {
    /// Listens on a free port and forwards to `upstream`; returns the port.
    async fn start(&self, upstream: String) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let frozen = self.frozen.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let flag = Arc::new(AtomicBool::new(false));
                let seen_as = server.local_addr().unwrap().port();
                frozen.lock().unwrap().insert(seen_as, flag.clone());
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw, flag.clone()));
                tokio::spawn(pipe(sr, cw, flag));
            }
        });
        port
    }

    /// Freezes the connection Postgres sees coming from `port`.
    fn freeze(&self, port: u16) {
        self.frozen.lock().unwrap()[&port].store(true, Ordering::SeqCst);
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        while frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(50)).await; // hold the bytes: a silent path
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn published(ctx: &Ctx, id: Uuid) -> bool {
    sqlx::query_scalar("select published_at is not null from outbox_events where id = $1")
        .bind(id)
        .fetch_one(ctx.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_listen_connection_is_noticed_and_replaced() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("quiet.row.changed");
    let schemas = open_schemas(std::slice::from_ref(&event_type));
    let proxy = Proxy::default();
    let options: PgConnectOptions = ctx.db.options.clone();
    let upstream = format!("{}:{}", options.get_host(), options.get_port());
    let port = proxy.start(upstream).await;
    // the poll is longer than the test: only a notification can wake the relay in time
    let config = RelayConfig {
        poll_interval: Duration::from_secs(300),
        lanes: 1,
        ..Default::default()
    };
    let pool = PgPoolOptions::new()
        .max_connections(config.pool_size())
        .connect_with(options.clone().host("127.0.0.1").port(port))
        .await
        .unwrap();
    let relay = Arc::new(
        Relay::new(pool.clone(), ctx.js.clone(), config)
            .await
            .unwrap(),
    );
    let (stop, running) = run_relay(relay.clone());

    let first = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&event_type, "ops", "a").numbered(1),
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "a commit wakes the relay",
        || async { published(&ctx, first).await },
    )
    .await;

    // Freeze the listener's connection: the backend that ran LISTEN.
    let listener_port: i32 = sqlx::query_scalar(
        "select client_port from pg_stat_activity where datname = current_database() and query like 'LISTEN%'",
    )
    .fetch_one(ctx.pool())
    .await
    .expect("the relay's listener");
    proxy.freeze(listener_port as u16);

    let during = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&event_type, "ops", "b").numbered(2),
    )
    .await;
    eventually(
        Duration::from_secs(45),
        "the relay notices the silence, listens again and catches up (its poll is 5 minutes away)",
        || async { published(&ctx, during).await },
    )
    .await;
    let after = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&event_type, "ops", "c").numbered(3),
    )
    .await;
    // 60 s for a loaded machine (a clean-clone CI run missed 15 s once, right after the
    // listener was replaced): still far inside the 5-minute poll, so only a commit's
    // notification can have woken the relay
    eventually(
        Duration::from_secs(60),
        "commits wake the relay again",
        || async { published(&ctx, after).await },
    )
    .await;
    stop.send(()).unwrap();
    running.await.unwrap();
    // the silent connection was the listener's own: every connection of the relay's pool is
    // back in it (sqlx's `UNLISTEN *` on a dropped listener hangs on a silent connection)
    eventually(
        Duration::from_secs(10),
        "the relay's pool has all its connections back once the relay stopped",
        || async { pool.num_idle() == pool.size() as usize },
    )
    .await;
    ctx.delete_stream().await;
}
