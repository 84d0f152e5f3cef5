//! What operators see of a broker outage: status and its figures while a private
//! nats-server is stopped, a capped row held and then unblocked (same id, order kept).

use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::status::{status, unblock, Unblock};
use outbox_runtime::{Relay, RelayConfig, Schemas, StorageType, StreamSpec};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{emit_committed, eventually, open_schemas, raw_event, run_relay, NatsServer};
use uuid::Uuid;

/// Emits and commits an event of `event_type` from `ops` about `subject`, payload `{"n": n}`.
async fn emit(ctx: &Ctx, schemas: &Schemas, event_type: &str, subject: &str, n: i64) -> Uuid {
    let event = raw_event(event_type, "ops", subject).numbered(n);
    emit_committed(ctx.pool(), schemas, event).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_an_outage_then_a_capped_row_which_unblock_publishes_with_its_id() {
    let mut server = NatsServer::spawn().await;
    let ctx = Ctx::with_nats(&server.url()).await;
    StreamSpec {
        storage: StorageType::File,
        ..ctx.stream_spec()
    }
    .ensure(&ctx.js)
    .await
    .expect("stream");
    let event_type = ctx.event_type("ops.row.changed");
    let schemas = open_schemas(std::slice::from_ref(&event_type));
    let config = RelayConfig {
        ack_timeout: Duration::from_millis(500),
        backoff_base: Duration::from_millis(50),
        backoff_max: Duration::from_millis(200),
        max_attempts: 3,
        poll_interval: Duration::from_millis(100),
        ..Default::default()
    };
    let cap = config.max_attempts;
    let relay = Arc::new(
        Relay::new(ctx.pool().clone(), ctx.js.clone(), config)
            .await
            .expect("relay"),
    );
    let (stop, task) = run_relay(relay.clone());

    let before = emit(&ctx, &schemas, &event_type, "a", 0).await;
    eventually(
        Duration::from_secs(10),
        "the first event published",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    let idle = status(ctx.pool(), cap).await.expect("status");
    assert_eq!(
        (idle.unpublished, idle.at_cap, idle.oldest_unpublished_age),
        (0, 0, None)
    );

    server.stop();
    let stuck = emit(&ctx, &schemas, &event_type, "b", 1).await;
    eventually(
        Duration::from_secs(10),
        "attempts rise while the broker is down",
        || async {
            let s = status(ctx.pool(), cap).await.expect("status");
            s.unpublished == 1 && s.attempts.iter().any(|(a, n)| *a >= 1 && *n == 1)
        },
    )
    .await;
    let first = status(ctx.pool(), cap)
        .await
        .expect("status")
        .oldest_unpublished_age
        .expect("an age");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let later = status(ctx.pool(), cap)
        .await
        .expect("status")
        .oldest_unpublished_age
        .expect("an age");
    assert!(
        later > first,
        "oldest unpublished age grows: {first:?} then {later:?}"
    );

    eventually(
        Duration::from_secs(20),
        "the row reaches the attempt cap",
        || async { status(ctx.pool(), cap).await.expect("status").at_cap == 1 },
    )
    .await;
    // A later event of the same subject is held behind the capped one.
    let held = emit(&ctx, &schemas, &event_type, "b", 2).await;
    server.start().await;
    let other = emit(&ctx, &schemas, &event_type, "c", 3).await;
    eventually(
        Duration::from_secs(20),
        "other subjects flow again",
        || async {
            // Marked, not merely in the stream: an ack can miss the deadline of a broker that
            // just restarted, and then the row is still unpublished for a while.
            sqlx::query_scalar::<_, bool>(
                "select published_at is not null from outbox_events where id = $1",
            )
            .bind(other)
            .fetch_one(ctx.pool())
            .await
            .expect("row")
        },
    )
    .await;
    let s = status(ctx.pool(), cap).await.expect("status");
    assert_eq!(
        (s.unpublished, s.at_cap),
        (2, 1),
        "capped row and the one held behind it: {s:?}"
    );
    let by_type = &s.by_type[0];
    assert_eq!(
        (
            by_type.event_type.as_str(),
            by_type.unpublished,
            by_type.at_cap
        ),
        (event_type.as_str(), 2, 1)
    );
    let listed: Vec<Uuid> = relay
        .capped()
        .await
        .expect("capped")
        .iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(listed, vec![stuck]);

    let unblocked = unblock(ctx.pool(), &Unblock::Ids(vec![stuck]), cap)
        .await
        .expect("unblock");
    assert_eq!(unblocked, vec![stuck]);
    eventually(
        Duration::from_secs(20),
        "the unblocked row and the held one publish",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    drop(stop);
    task.await.expect("relay task");

    let delivered = ctx.read_stream().await;
    let ids: Vec<Uuid> = delivered.iter().map(|d| d.envelope.id).collect();
    let pos = |id: Uuid| ids.iter().position(|i| *i == id).expect("in the stream");
    assert!(pos(before) < pos(stuck), "{ids:?}");
    assert!(pos(stuck) < pos(held), "subject b keeps its order: {ids:?}");
    let msg = &delivered[pos(stuck)];
    assert_eq!(
        msg.msg_id,
        stuck.to_string(),
        "republished with its original id"
    );
    assert_eq!(ids.iter().filter(|i| **i == stuck).count(), 1);
    let s = status(ctx.pool(), cap).await.expect("status");
    assert_eq!((s.unpublished, s.at_cap), (0, 0));
}
