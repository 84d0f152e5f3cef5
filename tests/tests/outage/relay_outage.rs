//! A broker outage: four relays with the default configuration, a test-owned nats-server
//! stopped for a minute while 500 subjects emit. A publish that never reached the broker spends
//! no attempt, so nothing nears the cap however long the outage lasts, and everything drains in
//! order per subject within seconds of the restart.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::{Relay, RelayConfig, StorageType, StreamSpec};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{emit_committed, eventually, open_schemas, raw_event, run_relay, NatsServer};
use tokio::time::Instant;
use uuid::Uuid;

const RELAYS: usize = 4;
const SUBJECTS: usize = 500;
const OUTAGE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_relays_ride_out_a_minute_long_broker_outage_without_spending_attempts() {
    let mut server = NatsServer::spawn().await;
    let ctx = Ctx::with_nats(&server.url()).await;
    StreamSpec {
        storage: StorageType::File, // survives the restart
        ..ctx.stream_spec()
    }
    .ensure(&ctx.js)
    .await
    .unwrap();
    let paid = ctx.event_type("billing.invoice.paid");
    let schemas = open_schemas(std::slice::from_ref(&paid));
    let mut relays = Vec::new();
    for _ in 0..RELAYS {
        let config = RelayConfig {
            event_types: vec![paid.clone()],
            ..Default::default()
        };
        let pool = ctx.db.new_pool(config.pool_size()).await;
        let client = outbox_testkit::connect_nats(&server.url()).await;
        let relay = Arc::new(
            Relay::new(pool, async_nats::jetstream::new(client), config)
                .await
                .unwrap(),
        );
        relays.push((relay.clone(), run_relay(relay)));
    }

    let mut expected: HashMap<String, Vec<Uuid>> = HashMap::new();
    let (pool, schemas, paid) = (ctx.pool(), &schemas, &paid);
    let emit = move |subject: String, n: usize| {
        let event = raw_event(paid, "billing", subject).numbered(n);
        emit_committed(pool, schemas, event)
    };
    for n in 0..20 {
        let subject = format!("inv-{}", n % 10);
        expected
            .entry(subject.clone())
            .or_default()
            .push(emit(subject, n).await);
    }
    eventually(
        Duration::from_secs(20),
        "the first events published",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;

    server.stop();
    let stopped_at = Instant::now();
    // the subjects emit through the outage, one event each every 100 ms or so
    let mut n = 20;
    while stopped_at.elapsed() < OUTAGE - Duration::from_secs(5) || n < 20 + SUBJECTS {
        let subject = format!("inv-{}", n % SUBJECTS);
        expected
            .entry(subject.clone())
            .or_default()
            .push(emit(subject, n).await);
        n += 1;
        if n >= 20 + SUBJECTS {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep_until(stopped_at + OUTAGE).await;
    let attempts: i64 =
        sqlx::query_scalar("select coalesce(sum(attempts), 0)::int8 from outbox_events")
            .fetch_one(ctx.pool())
            .await
            .unwrap();
    assert_eq!(
        attempts, 0,
        "publishes that never reached the broker spend no attempt"
    );
    assert!(
        ctx.db.unpublished().await >= SUBJECTS as i64,
        "nothing published while the broker is down"
    );

    server.start().await;
    let restarted = Instant::now();
    eventually(
        Duration::from_secs(10),
        "everything drains within 10 s of the restart",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    eprintln!(
        "{} events emitted during a {OUTAGE:?} outage drained {:?} after the restart",
        n - 20,
        restarted.elapsed()
    );
    for (relay, (stop, running)) in relays {
        stop.send(()).unwrap();
        running.await.unwrap();
        assert_eq!((relay.stats().failed, relay.stats().held), (0, 0));
    }
    let (max_attempts, held): (i32, i64) = sqlx::query_as(
        "select coalesce(max(attempts), 0), (select count(*) from outbox_retries) from outbox_events",
    )
    .fetch_one(ctx.pool())
    .await
    .unwrap();
    assert_eq!(
        (max_attempts, held),
        (0, 0),
        "no row neared the cap, no subject was parked"
    );

    let messages = ctx.read_stream().await;
    let total_events: usize = expected.values().map(Vec::len).sum();
    assert_eq!(
        messages.len(),
        total_events,
        "every event stored exactly once"
    );
    let mut seen: HashMap<String, Vec<Uuid>> = HashMap::new();
    for m in &messages {
        seen.entry(m.envelope.subject.clone())
            .or_default()
            .push(m.envelope.id);
    }
    assert_eq!(seen, expected, "each subject in emit order");
}
