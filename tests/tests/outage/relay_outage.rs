//! A broker outage: with a test-owned nats-server stopped for several seconds, attempts grow
//! within the backoff schedule, and everything drains in order per subject after it restarts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::{Relay, RelayConfig, StorageType, StreamSpec};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{emit_committed, eventually, open_schemas, raw_event, run_relay, NatsServer};
use tokio::time::Instant;
use uuid::Uuid;

/// The most attempts one subject can make in `window` when consecutive attempts are spaced by
/// at least `config.backoff(1)`, `config.backoff(2)`, ...
fn max_attempts_within(config: &RelayConfig, window: Duration) -> u32 {
    let mut n = 1;
    let mut elapsed = Duration::ZERO;
    loop {
        elapsed += config.backoff(n);
        if elapsed > window {
            return n;
        }
        n += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_backs_off_and_drains_in_order_after_restart() {
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
    let config = RelayConfig {
        ack_timeout: Duration::from_secs(1),
        backoff_base: Duration::from_millis(200),
        backoff_max: Duration::from_secs(2),
        max_attempts: 1000,
        poll_interval: Duration::from_millis(500),
        subjects: vec![paid.clone()],
        ..Default::default()
    };
    let relay = Arc::new(
        Relay::new(ctx.pool().clone(), ctx.js.clone(), config.clone())
            .await
            .unwrap(),
    );
    let (stop, running) = run_relay(relay.clone());

    let mut expected: HashMap<String, Vec<Uuid>> = HashMap::new();
    let (pool, schemas, paid) = (ctx.pool(), &schemas, &paid);
    let emit = move |subject: String, n: usize| {
        let event = raw_event(paid, "billing", subject).numbered(n);
        emit_committed(pool, schemas, event)
    };
    for n in 0..8 {
        let subject = format!("inv-{}", n % 4);
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
    let before = relay.stats();
    assert_eq!(before.failed, 0);

    server.stop();
    let stopped_at = Instant::now();
    for n in 8..58 {
        let subject = format!("inv-{}", n % 10);
        expected
            .entry(subject.clone())
            .or_default()
            .push(emit(subject, n).await);
    }
    eventually(
        Duration::from_secs(30),
        "attempts grow while the broker is down",
        || async {
            sqlx::query_scalar::<_, i32>("select coalesce(max(attempts), 0) from outbox_events")
                .fetch_one(ctx.pool())
                .await
                .unwrap()
                >= 3
        },
    )
    .await;
    tokio::time::sleep_until(stopped_at + Duration::from_secs(4)).await;
    assert!(
        ctx.db.unpublished().await > 0,
        "nothing is published while the broker is down"
    );

    server.start().await;
    eventually(
        Duration::from_secs(60),
        "everything drains after the restart",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    let window = stopped_at.elapsed();
    stop.send(()).unwrap();
    running.await.unwrap();

    // Count the attempts: each failed publish added one to its row.
    let per_subject: Vec<(String, i64)> = sqlx::query_as(
        "select subject, sum(attempts)::int8 from outbox_events group by subject order by subject",
    )
    .fetch_all(ctx.pool())
    .await
    .unwrap();
    let total: i64 = per_subject.iter().map(|(_, n)| n).sum();
    let stats = relay.stats();
    assert_eq!(
        total as u64, stats.failed,
        "every failed publish counted once on its row"
    );
    let bound = max_attempts_within(&config, window);
    eprintln!(
        "outage window {window:?}: {total} failed attempts over {} subjects, at most {bound} per subject by the schedule; per subject {per_subject:?}",
        per_subject.len()
    );
    for (subject, attempts) in &per_subject {
        assert!(
            *attempts <= i64::from(bound),
            "{subject}: {attempts} attempts exceed the backoff schedule ({bound} in {window:?})"
        );
    }
    assert!(per_subject.iter().any(|(_, n)| *n >= 3), "attempts grew");

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
    assert_eq!(seen, expected, "each subject in created_at order");
}
