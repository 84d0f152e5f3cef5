//! Events that can never be published as they are (payload over max_payload, no stream for the
//! subject) are held at once with their reason, and do not hold back other subjects.

use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::{Relay, RelayConfig, StorageType, StreamSpec};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{
    emit_committed, eventually, open_schemas, raw_event, read_stream, run_relay, unique_token,
};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

async fn attempts(pool: &PgPool, id: Uuid) -> (i32, bool) {
    sqlx::query_as("select attempts, published_at is not null from outbox_events where id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Emits and commits an event of `event_type` from `billing` about `subject`.
async fn emit(pool: &PgPool, event_type: &str, subject: &str, data: serde_json::Value) -> Uuid {
    let schemas = open_schemas(&[event_type.to_owned()]);
    let event = raw_event(event_type, "billing", subject).data(data);
    emit_committed(pool, &schemas, event).await
}

#[tokio::test]
async fn refused_events_are_held_at_once_with_the_brokers_reason_and_hold_only_their_subject() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let pool = ctx.pool().clone();
    let paid = ctx.event_type("billing.invoice.paid");
    // A subject no stream captures (yet): every publish fails with "no responders".
    let orphan_prefix = unique_token();
    let orphan = format!("{orphan_prefix}.billing.invoice.paid");

    let max_payload = ctx.client.server_info().max_payload;
    let too_big = emit(
        &pool,
        &paid,
        "inv-big",
        json!({ "blob": "x".repeat(max_payload + 1) }),
    )
    .await;
    let after_big = emit(&pool, &paid, "inv-big", json!({ "n": 2 })).await;
    let no_stream = emit(&pool, &orphan, "inv-orphan", json!({ "n": 1 })).await;
    let after_no_stream = emit(&pool, &orphan, "inv-orphan", json!({ "n": 2 })).await;
    let mut good = Vec::new();
    for i in 0..10 {
        good.push(emit(&pool, &paid, &format!("inv-{i}"), json!({ "n": i })).await);
    }

    // One batch: the refused events are held at once (no hour of retries for what can never
    // succeed), their followers are not attempted, every other subject is published.
    let relay = Arc::new(
        Relay::new(
            pool.clone(),
            ctx.js.clone(),
            RelayConfig {
                max_attempts: 3,
                backoff_base: Duration::from_millis(20),
                backoff_max: Duration::from_millis(40),
                poll_interval: Duration::from_millis(100),
                ..Default::default()
            },
        )
        .await
        .unwrap(),
    );
    let report = relay.run_once().await.unwrap();
    assert_eq!(report.claimed, 14);
    assert_eq!(report.published, 10);
    assert_eq!((report.held, report.failed), (2, 0));
    assert_eq!(
        report.skipped, 2,
        "the followers of the refused events wait"
    );
    // the oversized one was never sent (the relay's own check); the broker refused the other
    assert_eq!(attempts(&pool, too_big).await, (0, false));
    assert_eq!(attempts(&pool, no_stream).await, (1, false));
    assert_eq!(attempts(&pool, after_big).await, (0, false));
    assert_eq!(attempts(&pool, after_no_stream).await, (0, false));
    for id in &good {
        assert_eq!(attempts(&pool, *id).await, (0, true));
    }
    let held = relay.held().await.unwrap();
    let held_ids: Vec<Uuid> = held.iter().map(|h| h.id).collect();
    assert_eq!(held_ids, [too_big, no_stream]);
    assert!(held[0].reason.contains("max_payload"), "{}", held[0].reason);
    assert!(
        held[1].reason.contains("no stream captures") && held[1].reason.contains(&orphan),
        "{}",
        held[1].reason
    );

    // A running relay leaves them alone while other subjects keep flowing.
    let (stop, running) = run_relay(relay.clone());
    let late = emit(&pool, &paid, "inv-late", json!({ "n": 99 })).await;
    eventually(
        Duration::from_secs(30),
        "a later event of another subject is published",
        || async { attempts(&pool, late).await.1 },
    )
    .await;
    stop.send(()).unwrap();
    running.await.unwrap();
    let report = relay.run_once().await.unwrap();
    assert_eq!(report.claimed, 0, "held subjects are not claimed");
    assert_eq!(attempts(&pool, too_big).await, (0, false));
    assert_eq!(attempts(&pool, no_stream).await, (1, false));
    assert_eq!(attempts(&pool, after_big).await, (0, false));
    assert_eq!(attempts(&pool, after_no_stream).await, (0, false));
    assert_eq!(relay.stats().held, 2);
    assert_eq!(relay.stats().failed, 0);

    // An operator fixes the cause (a stream for the orphan subject) and releases the row: the
    // held subject drains in order.
    let orphan_stream = StreamSpec {
        name: orphan_prefix.to_uppercase(),
        subjects: vec![format!("{orphan_prefix}.>")],
        storage: StorageType::Memory,
        ..Default::default()
    };
    orphan_stream.ensure(&ctx.js).await.unwrap();
    let released = outbox_runtime::status::unblock(
        &pool,
        &outbox_runtime::status::Unblock::Ids(vec![no_stream]),
        3,
    )
    .await
    .unwrap();
    assert_eq!(released, [no_stream]);
    while relay.run_once().await.unwrap().claimed > 0 {}
    assert_eq!(attempts(&pool, no_stream).await, (0, true));
    assert_eq!(attempts(&pool, after_no_stream).await, (0, true));
    let order: Vec<Uuid> = read_stream(&ctx.js, &orphan_stream.name)
        .await
        .iter()
        .map(|m| m.envelope.id)
        .collect();
    assert_eq!(order, [no_stream, after_no_stream]);
    assert_eq!(attempts(&pool, after_big).await, (0, false), "still held");

    let _ = ctx.js.delete_stream(&orphan_stream.name).await;
    ctx.delete_stream().await;
}
