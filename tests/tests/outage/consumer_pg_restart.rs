//! The consumer's own database restarted under two replicas: transient failures are retried
//! without spending the give-up budget, and every event takes effect exactly once.

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use outbox_runtime::consumer::{Consumer, ConsumerConfig, Delivery, Handler, HandlerError};
use outbox_runtime::{Envelope, OutboxEvent, StorageType, StreamSpec};
use outbox_testkit::{connect_nats, eventually, NatsServer, PgServer};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(
    event_type = "accounts.account.opened",
    source = "accounts",
    schema = "schemas/consumer/accounts.account.opened.schema.json"
)]
struct AccountOpened {
    account_id: Uuid,
    owner: String,
    n: i64,
}

/// Records each event, taking a little while (so the restart falls in the middle).
struct SlowRecord;

impl Handler<AccountOpened> for SlowRecord {
    async fn handle(
        &self,
        delivery: &Delivery<AccountOpened>,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(10)).await;
        sqlx::query("insert into effects (event_id, n) values ($1, $2)")
            .bind(delivery.id())
            .bind(delivery.event().n)
            .execute(tx)
            .await?;
        Ok(())
    }
}

async fn pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .connect(url)
        .await
        .expect("connect to the private Postgres")
}

async fn effects(pool: &PgPool) -> Option<(i64, i64)> {
    sqlx::query_as("select count(*), count(distinct event_id) from effects")
        .fetch_one(pool)
        .await
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_survive_a_30_s_postgres_restart_and_apply_each_event_once() {
    const EVENTS: i64 = 1_000;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("install the debugging recorder");

    let pg = PgServer::spawn();
    let check = pool(&pg.url()).await;
    outbox_runtime::migrate(&check).await.expect("migrate");
    sqlx::query("create table effects (event_id uuid not null, n bigint not null)")
        .execute(&check)
        .await
        .expect("create the handler's table");
    let nats = NatsServer::spawn().await;
    let js = async_nats::jetstream::new(connect_nats(&nats.url()).await);
    StreamSpec {
        name: "ACCOUNTS".into(),
        subjects: vec!["accounts.>".into()],
        storage: StorageType::Memory,
        ..Default::default()
    }
    .ensure(&js)
    .await
    .expect("stream");
    // Fifty subjects, so retries of one subject hold its later events while others flow.
    let accounts: Vec<Uuid> = (0..50).map(|_| Uuid::now_v7()).collect();
    for n in 0..EVENTS {
        let account = accounts[n as usize % accounts.len()];
        let envelope = Envelope::new(
            Uuid::now_v7(),
            AccountOpened::EVENT_TYPE,
            "accounts",
            account.to_string(),
            chrono::Utc::now(),
            AccountOpened {
                account_id: account,
                owner: "o".into(),
                n,
            },
        );
        js.publish(
            AccountOpened::EVENT_TYPE,
            serde_json::to_vec(&envelope).expect("json").into(),
        )
        .await
        .expect("publish")
        .await
        .expect("ack");
    }

    let name = "restart";
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let mut config = ConsumerConfig::new(name, "ACCOUNTS");
        config.retry_base = Duration::from_millis(100);
        config.retry_max = Duration::from_secs(2);
        config.ack_wait = Duration::from_secs(10);
        let consumer = Consumer::new(pool(&pg.url()).await, js.clone(), config, SlowRecord);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            consumer
                .run(async {
                    let _ = stopped.await;
                })
                .await
                .expect("the consumer survives the restart");
        });
        replicas.push((stop, task));
    }
    eventually(Duration::from_secs(30), "a third applied", || async {
        effects(&check).await.is_some_and(|(n, _)| n >= EVENTS / 3)
    })
    .await;
    pg.stop();
    tokio::time::sleep(Duration::from_secs(30)).await;
    pg.start();
    eventually(Duration::from_secs(120), "every event applied", || async {
        effects(&check).await.is_some_and(|(n, _)| n >= EVENTS)
    })
    .await;
    // Redeliveries still in flight find their dedupe rows.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (stop, task) in replicas {
        drop(stop);
        task.await.expect("replica");
    }
    assert_eq!(
        effects(&check).await,
        Some((EVENTS, EVENTS)),
        "each event took effect exactly once"
    );
    let attempts: i64 = sqlx::query_scalar("select count(*) from outbox_consumer_attempts")
        .fetch_one(&check)
        .await
        .expect("count attempts");
    assert_eq!(attempts, 0, "no handler attempt was counted");

    let mut totals = std::collections::HashMap::<String, u64>::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if let DebugValue::Counter(n) = value {
            *totals.entry(key.key().name().to_owned()).or_default() += n;
        }
    }
    let total = |metric: &str| totals.get(metric).copied().unwrap_or(0);
    assert_eq!(total("outbox_consumer_gave_up_total"), 0);
    assert_eq!(total("outbox_consumer_failures_total"), 0);
    assert!(
        total("outbox_consumer_transient_failures_total") > 0,
        "the outage was felt: {totals:?}"
    );
    eprintln!(
        "handled {}, duplicates {}, transient failures {}, held {}, redeliveries {}",
        total("outbox_consumer_handled_total"),
        total("outbox_consumer_duplicates_total"),
        total("outbox_consumer_transient_failures_total"),
        total("outbox_consumer_held_total"),
        total("outbox_consumer_redeliveries_total"),
    );
}
