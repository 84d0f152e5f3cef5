//! The wake-up locks: an emit notifies only while a relay waits for commits, and no event waits for
//! the fallback poll in any interleaving of an emit with a relay going to sleep. Every relay
//! here polls once an hour, so an event it did not hear of would wait for the lanes' own
//! wake-ups (their sweep, once a second) at best.

use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::relay::LOCK_NAMESPACE;
use outbox_runtime::{EmitExt, Relay, RelayConfig, Schemas, NOTIFY_CHANNEL, NOTIFY_KEY};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{emit_committed, eventually, open_schemas, raw_event, run_relay};
use sqlx::postgres::PgListener;
use uuid::Uuid;

const HOUR: Duration = Duration::from_secs(3600);

/// The notify lock's exclusive entries in `pg_locks` for the test's database (advisory locks
/// are per database): (granted, waiting). A relay holds it while its lanes wait for commits.
async fn notify_lock(ctx: &Ctx) -> (i64, i64) {
    sqlx::query_as(
        "select count(*) filter (where granted), count(*) filter (where not granted) \
           from pg_locks where locktype = 'advisory' and classid = $1::int8::oid \
            and objid = ($2::int8 & 4294967295)::oid and objsubid = 2 and mode = 'ExclusiveLock' \
            and database = (select oid from pg_database where datname = current_database())",
    )
    .bind(i64::from(LOCK_NAMESPACE))
    .bind(i64::from(NOTIFY_KEY))
    .fetch_one(ctx.pool())
    .await
    .unwrap()
}

/// A listener on the emit channel, and the emits' notifications it has received so far (an
/// emit's payload is its subject's partition, a number).
struct Announcements(PgListener);

impl Announcements {
    async fn new(ctx: &Ctx) -> Announcements {
        let mut listener = PgListener::connect_with(ctx.pool()).await.unwrap();
        listener.listen(NOTIFY_CHANNEL).await.unwrap();
        Announcements(listener)
    }

    /// The emits' notifications received within `wait`.
    async fn within(&mut self, wait: Duration) -> usize {
        let mut n = 0;
        let end = tokio::time::Instant::now() + wait;
        while let Ok(Ok(Some(note))) = tokio::time::timeout_at(end, self.0.try_recv()).await {
            if note.payload().parse::<u16>().is_ok() {
                n += 1;
            }
        }
        n
    }
}

fn setup(ctx: &Ctx) -> (String, Schemas, RelayConfig) {
    let ty = ctx.event_type("billing.invoice.paid");
    let schemas = open_schemas(std::slice::from_ref(&ty));
    let config = RelayConfig {
        event_types: vec![ty.clone()],
        poll_interval: HOUR,
        ..Default::default()
    };
    (ty, schemas, config)
}

async fn published(ctx: &Ctx, id: Uuid) -> bool {
    sqlx::query_scalar(
        "select exists (select 1 from outbox_events where id = $1 and published_at is not null)",
    )
    .bind(id)
    .fetch_one(ctx.pool())
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emits_send_no_notification_while_no_relay_waits() {
    let ctx = Ctx::new().await;
    let (ty, schemas, _) = setup(&ctx);
    let mut heard = Announcements::new(&ctx).await;
    for n in 0..20 {
        emit_committed(
            ctx.pool(),
            &schemas,
            raw_event(&ty, "billing", "inv-1").numbered(n),
        )
        .await;
    }
    assert_eq!(heard.within(Duration::from_millis(500)).await, 0);
    // someone holding the notify lock exclusively, as a waiting relay does, makes them notify
    let mut holder = ctx.pool().acquire().await.unwrap();
    sqlx::query("select pg_advisory_lock($1, $2)")
        .bind(LOCK_NAMESPACE)
        .bind(NOTIFY_KEY)
        .execute(&mut *holder)
        .await
        .unwrap();
    emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&ty, "billing", "inv-1").numbered(20),
    )
    .await;
    assert_eq!(heard.within(Duration::from_secs(5)).await, 1);
    let _ = holder.detach();
}

/// The classic lost wake-up, forced: the emit checks for a waiting relay before the relay goes
/// to sleep (so it sends no notification) and commits after the relay's last claim. The relay
/// takes the notify lock at once (later emits notify), but cannot take the wake lock while the
/// emit holds it shared: its lanes linger, claiming now and then (never in a hot loop), and
/// the event is published once it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emit_that_did_not_notify_is_published_once_its_transaction_commits() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let (ty, schemas, config) = setup(&ctx);
    let mut heard = Announcements::new(&ctx).await;

    // no relay waits: the emit takes the wake lock shared, and its transaction stays open
    let mut tx = ctx.pool().begin().await.unwrap();
    let id = tx
        .emit_raw(&schemas, raw_event(&ty, "billing", "inv-1").build())
        .await
        .unwrap();

    // the relay claims (the row is not committed, so it finds nothing), takes the notify lock,
    // and cannot take the wake lock
    let relay = Arc::new(
        Relay::new(ctx.pool().clone(), ctx.js.clone(), config)
            .await
            .unwrap(),
    );
    let (stop, running) = run_relay(relay.clone());
    eventually(Duration::from_secs(15), "the relay claims", || async {
        relay.stats().claims > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let claims = relay.stats().claims;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let lingered = relay.stats().claims - claims;
    assert!(
        lingered > 0,
        "the lanes keep claiming while the wake lock is not theirs"
    );
    assert!(
        lingered < 200,
        "{lingered} claims in a second: the lanes' pause grows to 50 ms, not a hot loop"
    );
    assert_eq!(
        notify_lock(&ctx).await,
        (1, 0),
        "the relay holds the notify lock, waiting for nothing"
    );
    assert!(!published(&ctx, id).await);

    let committed = std::time::Instant::now();
    tx.commit().await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the event is published",
        || async { published(&ctx, id).await },
    )
    .await;
    let took = committed.elapsed();
    assert_eq!(
        heard.within(Duration::from_millis(100)).await,
        0,
        "the emit sent no notification"
    );
    eprintln!("published {took:?} after its commit, without a notification");
    assert_eq!(
        notify_lock(&ctx).await,
        (1, 0),
        "the relay still holds the notify lock"
    );

    // the next emit notifies, and is published at once
    let id = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&ty, "billing", "inv-2").build(),
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "the second event is published",
        || async { published(&ctx, id).await },
    )
    .await;
    assert_eq!(
        heard.within(Duration::from_secs(1)).await,
        1,
        "the second emit notified"
    );

    stop.send(()).unwrap();
    running.await.unwrap();
    assert_eq!(relay.stats().published, 2);
    // the lock's connection is closed on drop, in the background: the server ends its backend
    // (and lets the lock go) moments after `run` returns
    eventually(
        Duration::from_secs(5),
        "a stopped relay holds no notify lock",
        || async { notify_lock(&ctx).await == (0, 0) },
    )
    .await;
    ctx.delete_stream().await;
}

/// A burst from 16 connections, one event per transaction, while the relay drains (its lanes
/// busy: the emits stop notifying) and is restarted halfway: every event is published soon
/// after its commit, none waits for the poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_from_sixteen_connections_across_a_relay_restart_waits_for_no_poll() {
    const CONNECTIONS: usize = 16;
    const EACH: usize = 625;
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let (ty, schemas, config) = setup(&ctx);
    let emitters = ctx.db.new_pool(CONNECTIONS as u32).await;
    let start_relay = || async {
        let pool = ctx.db.new_pool(config.pool_size()).await;
        let relay = Arc::new(
            Relay::new(pool, ctx.js.clone(), config.clone())
                .await
                .unwrap(),
        );
        let (stop, running) = run_relay(relay.clone());
        (relay, stop, running)
    };
    let first = start_relay().await;

    let burst: Vec<_> = (0..CONNECTIONS)
        .map(|c| {
            let (pool, schemas, ty) = (emitters.clone(), schemas.clone(), ty.clone());
            tokio::spawn(async move {
                for n in 0..EACH {
                    let event = raw_event(&ty, "billing", format!("inv-{c}-{}", n % 7)).numbered(n);
                    emit_committed(&pool, &schemas, event).await;
                }
            })
        })
        .collect();
    // halfway through, the relay is replaced
    eventually(
        Duration::from_secs(120),
        "half the burst emitted",
        || async {
            let n: i64 = sqlx::query_scalar("select count(*) from outbox_events")
                .fetch_one(ctx.pool())
                .await
                .unwrap();
            n >= (CONNECTIONS * EACH / 2) as i64
        },
    )
    .await;
    let (_, stop, running) = first;
    stop.send(()).unwrap();
    running.await.unwrap();
    let (second, stop, running) = start_relay().await;
    for task in burst {
        task.await.unwrap();
    }
    let emitted = std::time::Instant::now();
    eventually(Duration::from_secs(60), "every event published", || async {
        ctx.db.unpublished().await == 0
    })
    .await;
    eprintln!("drained {:?} after the last emit", emitted.elapsed());
    // each event's wait from its insert to its publish, on the database's clock
    let slowest: f64 = sqlx::query_scalar(
        "select extract(epoch from max(published_at - created_at))::float8 from outbox_events",
    )
    .fetch_one(ctx.pool())
    .await
    .unwrap();
    eprintln!("slowest event: {slowest:.3} s from insert to publish");
    assert!(
        slowest < 30.0,
        "an event waited {slowest:.1} s: it was heard of by no relay"
    );
    assert_eq!(ctx.stream_len().await, (CONNECTIONS * EACH) as u64);
    stop.send(()).unwrap();
    running.await.unwrap();
    assert!(second.stats().published > 0);
    ctx.delete_stream().await;
}

/// Two relays on one table behind one open emitting transaction: one of them holds the lease
/// and publishes every event once the transaction commits; the other stands by, takes no wake
/// lock and publishes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_two_relays_behind_one_emit_the_lease_holder_publishes_every_row() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let (ty, schemas, config) = setup(&ctx);
    let mut tx = ctx.pool().begin().await.unwrap();
    let mut ids = Vec::new();
    for n in 0..60 {
        let event = raw_event(&ty, "billing", format!("inv-{n}")).build();
        ids.push(tx.emit_raw(&schemas, event).await.unwrap());
    }
    let mut relays = Vec::new();
    for _ in 0..2 {
        let pool = ctx.db.new_pool(config.pool_size()).await;
        let relay = Arc::new(
            Relay::new(pool, ctx.js.clone(), config.clone())
                .await
                .unwrap(),
        );
        relays.push((relay.clone(), run_relay(relay)));
    }
    eventually(Duration::from_secs(15), "one relay claims", || async {
        relays.iter().any(|(r, _)| r.stats().claims > 0)
    })
    .await;
    tx.commit().await.unwrap();
    eventually(
        Duration::from_secs(10),
        "every event is published",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    eventually(
        Duration::from_secs(5),
        "the holder waits for commits, holding the notify lock alone",
        || async { notify_lock(&ctx).await == (1, 0) },
    )
    .await;
    // read before stopping: once the holder stops and gives the lease up, the other takes it
    // over and claims (an empty batch) before its own stop arrives
    let mut by_relay: Vec<(u64, u64)> = relays
        .iter()
        .map(|(relay, _)| (relay.stats().published, relay.stats().claims))
        .collect();
    for (_, (stop, running)) in relays {
        stop.send(()).unwrap();
        running.await.unwrap();
    }
    by_relay.sort();
    assert_eq!(
        by_relay[0],
        (0, 0),
        "the relay standing by made no claim: {by_relay:?}"
    );
    assert_eq!(by_relay[1].0, ids.len() as u64);
    ctx.delete_stream().await;
}

/// Two idle relays for a few seconds: the lease holder holds the notify lock and the other
/// waits for nothing, so neither warns (a lock wait ended by a timeout would also leave an
/// error in the server's log). A current-thread runtime: the relays run on the test's thread,
/// where the recording subscriber is the default.
#[tokio::test]
async fn two_idle_relays_hold_one_notify_lock_and_warn_of_nothing() {
    let warnings = outbox_tests::warnings::Warnings::default();
    let _recording = warnings.record();
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let (_, _, config) = setup(&ctx);
    let mut relays = Vec::new();
    for _ in 0..2 {
        let pool = ctx.db.new_pool(config.pool_size()).await;
        let relay = Relay::new(pool, ctx.js.clone(), config.clone())
            .await
            .unwrap();
        relays.push(run_relay(Arc::new(relay)));
    }
    eventually(
        Duration::from_secs(15),
        "one relay holds the notify lock",
        || async { notify_lock(&ctx).await == (1, 0) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(notify_lock(&ctx).await, (1, 0), "nobody waits for it");
    for (stop, running) in relays {
        stop.send(()).unwrap();
        running.await.unwrap();
    }
    // the test's stream has one replica, which the relays warn of once
    let mut warned = warnings.messages();
    warned.retain(|m| !m.contains("has one replica"));
    assert_eq!(warned, Vec::<String>::new(), "idle relays warn of nothing");
    ctx.delete_stream().await;
}

/// The relay holding the lease dies while three run, and events are emitted at once: a relay
/// standing by takes the lease over once it runs out (5 s) and publishes them, though the
/// lanes' poll is an hour away.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_standing_by_publishes_without_waiting_for_the_poll_once_the_holder_dies() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let (ty, schemas, config) = setup(&ctx);
    let mut relays = Vec::new();
    for _ in 0..3 {
        let pool = ctx.db.new_pool(config.pool_size()).await;
        let relay = Arc::new(
            Relay::new(pool.clone(), ctx.js.clone(), config.clone())
                .await
                .unwrap(),
        );
        relays.push((relay.clone(), run_relay(relay), pool));
    }
    // the holder: the relay that holds the notify lock once idle
    eventually(
        Duration::from_secs(15),
        "one relay holds the lease",
        || async { notify_lock(&ctx).await == (1, 0) },
    )
    .await;
    let first = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&ty, "billing", "first").build(),
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "the first event is published",
        || async { published(&ctx, first).await },
    )
    .await;
    let holder = relays
        .iter()
        .position(|(r, _, _)| r.stats().published > 0)
        .expect("the holder published it");
    // it dies without giving the lease up
    let (_, (_, running), pool) = relays.remove(holder);
    running.abort();
    let _ = running.await;
    pool.close().await;
    let died = std::time::Instant::now();
    for n in 0..300 {
        emit_committed(
            ctx.pool(),
            &schemas,
            raw_event(&ty, "billing", format!("inv-{n}")).build(),
        )
        .await;
    }
    eventually(
        Duration::from_secs(20),
        "every event is published",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    eprintln!(
        "published by the new holder {:?} after the old one died",
        died.elapsed()
    );
    let mut published_by = Vec::new();
    for (relay, (stop, running), _) in relays {
        stop.send(()).unwrap();
        running.await.unwrap();
        published_by.push(relay.stats().published);
    }
    published_by.sort();
    assert_eq!(published_by, [0, 300], "one survivor took over");
    ctx.delete_stream().await;
}
