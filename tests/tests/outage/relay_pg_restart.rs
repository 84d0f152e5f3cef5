//! A Postgres restart under a running relay: it logs, backs off, reconnects (pool and LISTEN)
//! and resumes; nothing committed is lost and each subject stays in order.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::{EmitExt, Relay, RelayConfig, StorageType, StreamSpec};
use outbox_testkit::{
    connect_nats, eventually, nats_url, open_schemas, raw_event, read_stream, unique_token,
    PgServer,
};
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_survives_a_postgres_restart_and_loses_nothing() {
    let pg = PgServer::spawn();
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .connect(&pg.url())
        .await
        .expect("connect to the private Postgres");
    outbox_runtime::migrate(&pool).await.expect("migrate");

    let prefix = unique_token();
    let js = async_nats::jetstream::new(connect_nats(&nats_url()).await);
    let stream = prefix.to_uppercase();
    StreamSpec {
        name: stream.clone(),
        subjects: vec![format!("{prefix}.>")],
        storage: StorageType::Memory,
        ..Default::default()
    }
    .ensure(&js)
    .await
    .expect("stream");
    let event_type = format!("{prefix}.ledger.entry_posted");
    let schemas = open_schemas(std::slice::from_ref(&event_type));
    let relay = Arc::new(
        Relay::new(
            pool.clone(),
            js.clone(),
            RelayConfig {
                backoff_base: Duration::from_millis(100),
                backoff_max: Duration::from_millis(500),
                poll_interval: Duration::from_millis(500),
                ..Default::default()
            },
        )
        .await
        .expect("relay"),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = {
        let relay = relay.clone();
        tokio::spawn(async move {
            relay
                .run(async {
                    let _ = stopped.await;
                })
                .await
                .expect("the relay survives the restart");
        })
    };

    let emit = |n: i64| {
        let pool = pool.clone();
        let schemas = schemas.clone();
        let event = raw_event(&event_type, "ledger", format!("account-{}", n % 7))
            .numbered(n)
            .build();
        async move {
            let mut tx = pool.begin().await?;
            let id = tx
                .emit_raw(&schemas, event)
                .await
                .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
            tx.commit().await?;
            Ok::<Uuid, sqlx::Error>(id)
        }
    };
    let mut committed = Vec::new();
    for n in 0..50 {
        committed.push((n, emit(n).await.expect("emit before the restart")));
    }
    eventually(
        Duration::from_secs(15),
        "the first events published",
        || async { read_stream(&js, &stream).await.len() == 50 },
    )
    .await;

    pg.stop();
    // While the database is down, emits fail (their transactions never commit) and the relay
    // keeps retrying with backoff.
    assert!(emit(1_000).await.is_err(), "no database, no emit");
    tokio::time::sleep(Duration::from_secs(2)).await;
    pg.start();

    for n in 50..100 {
        let id = loop {
            match emit(n).await {
                Ok(id) => break id,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        committed.push((n, id));
    }
    eventually(
        Duration::from_secs(30),
        "every committed event published",
        || async { read_stream(&js, &stream).await.len() >= 100 },
    )
    .await;
    drop(stop);
    task.await.expect("relay task");

    let delivered = read_stream(&js, &stream).await;
    let ids: Vec<Uuid> = delivered.iter().map(|d| d.envelope.id).collect();
    for (n, id) in &committed {
        assert_eq!(
            ids.iter().filter(|i| *i == id).count(),
            1,
            "event {n} published exactly once"
        );
    }
    assert_eq!(
        delivered.len(),
        committed.len(),
        "nothing else was published"
    );
    let mut last: HashMap<String, i64> = HashMap::new();
    for d in &delivered {
        let n = d.envelope.data["n"].as_i64().expect("n");
        if let Some(prev) = last.insert(d.envelope.subject.clone(), n) {
            assert!(
                prev < n,
                "subject {} out of order: {prev} then {n}",
                d.envelope.subject
            );
        }
    }
    let _ = js.delete_stream(&stream).await;
}
