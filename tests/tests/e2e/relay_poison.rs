//! Events the broker refuses (payload over max_payload, no stream for the subject) are retried
//! with backoff, capped, reported, and do not hold back other subjects.

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
async fn refused_events_back_off_reach_the_cap_and_hold_only_their_subject() {
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

    // Phase 1: a relay with a long backoff. The refused events fail once, their followers are not
    // attempted, every other subject is published, and nothing is retried at once.
    let patient = Relay::new(
        pool.clone(),
        ctx.js.clone(),
        RelayConfig {
            max_attempts: 3,
            backoff_base: Duration::from_secs(3600),
            backoff_max: Duration::from_secs(3600),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let report = patient.run_once().await.unwrap();
    assert_eq!(report.claimed, 14);
    assert_eq!(report.published, 10);
    assert_eq!(report.failed, 2);
    assert_eq!(
        report.skipped, 2,
        "the followers of the refused events wait"
    );
    assert_eq!(attempts(&pool, too_big).await, (1, false));
    assert_eq!(attempts(&pool, no_stream).await, (1, false));
    assert_eq!(attempts(&pool, after_big).await, (0, false));
    assert_eq!(attempts(&pool, after_no_stream).await, (0, false));
    for id in &good {
        assert_eq!(attempts(&pool, *id).await, (0, true));
    }
    assert_eq!(
        patient.backed_off(),
        [("inv-big".to_owned(), 1), ("inv-orphan".to_owned(), 1)]
    );
    assert_eq!(
        patient.run_once().await.unwrap().claimed,
        0,
        "backed-off subjects are not claimed"
    );

    // Phase 2: a relay with a short backoff retries them up to the cap, while other subjects
    // keep flowing.
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
    let (stop, running) = run_relay(relay.clone());
    eventually(
        Duration::from_secs(30),
        "both refused events at the cap",
        || async {
            attempts(&pool, too_big).await.0 == 3 && attempts(&pool, no_stream).await.0 == 3
        },
    )
    .await;
    let late = emit(&pool, &paid, "inv-late", json!({ "n": 99 })).await;
    eventually(
        Duration::from_secs(30),
        "a later event of another subject is published",
        || async { attempts(&pool, late).await.1 },
    )
    .await;
    stop.send(()).unwrap();
    running.await.unwrap();

    // Past the cap the rows are left alone, reported, and their subjects stay held.
    let report = relay.run_once().await.unwrap();
    assert_eq!(report.claimed, 0);
    assert_eq!(attempts(&pool, too_big).await, (3, false));
    assert_eq!(attempts(&pool, no_stream).await, (3, false));
    assert_eq!(attempts(&pool, after_big).await, (0, false));
    assert_eq!(attempts(&pool, after_no_stream).await, (0, false));
    assert_eq!(relay.stats().capped, 2);
    assert_eq!(
        relay.stats().failed,
        4,
        "two retries each after the first relay's attempt"
    );
    let capped: Vec<Uuid> = relay.capped().await.unwrap().iter().map(|c| c.id).collect();
    assert_eq!(capped, [too_big, no_stream]);

    // An operator fixes the cause (a stream for the orphan subject) and resets attempts: the
    // held subject drains in order.
    let orphan_stream = StreamSpec {
        name: orphan_prefix.to_uppercase(),
        subjects: vec![format!("{orphan_prefix}.>")],
        storage: StorageType::Memory,
        ..Default::default()
    };
    orphan_stream.ensure(&ctx.js).await.unwrap();
    sqlx::query("update outbox_events set attempts = 0 where id = $1")
        .bind(no_stream)
        .execute(&pool)
        .await
        .unwrap();
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
