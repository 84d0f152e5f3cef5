//! What operators see of a broker outage: status and its figures while a private
//! nats-server is stopped (the backlog ages, no attempt is spent), then a row the broker refuses
//! for good, held with its reason, which unblock publishes with its id, order kept.

use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::status::{status, unblock, Unblock};
use outbox_runtime::{Relay, RelayConfig, Schemas, StorageType, StreamSpec};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{
    emit_committed, eventually, open_schemas, raw_event, run_relay, unique_token, NatsServer,
};
use uuid::Uuid;

/// Emits and commits an event of `event_type` from `ops` about `subject`, payload `{"n": n}`.
async fn emit(ctx: &Ctx, schemas: &Schemas, event_type: &str, subject: &str, n: i64) -> Uuid {
    let event = raw_event(event_type, "ops", subject).numbered(n);
    emit_committed(ctx.pool(), schemas, event).await
}

async fn is_published(ctx: &Ctx, id: Uuid) -> bool {
    sqlx::query_scalar::<_, bool>(
        "select published_at is not null from outbox_events where id = $1",
    )
    .bind(id)
    .fetch_one(ctx.pool())
    .await
    .expect("row")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_an_outage_then_a_held_row_which_unblock_publishes_with_its_id() {
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
    // A type no stream captures yet: the broker answers "no responders", and the relay holds it.
    let orphan_prefix = unique_token();
    let orphan_type = format!("{orphan_prefix}.ops.row.changed");
    let schemas = open_schemas(&[event_type.clone(), orphan_type.clone()]);
    let config = RelayConfig {
        ack_timeout: Duration::from_millis(500),
        backoff_base: Duration::from_millis(50),
        backoff_max: Duration::from_millis(200),
        max_attempts: 3,
        // longer than the test: only a notification (the unblock's) can wake the relay in time
        poll_interval: Duration::from_secs(120),
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
        (
            idle.unpublished,
            idle.at_cap,
            idle.held_total,
            idle.oldest_unpublished_age
        ),
        (0, 0, 0, None)
    );

    // The broker goes away: the row waits, ages, and spends no attempt however long it lasts.
    server.stop();
    let waiting = emit(&ctx, &schemas, &event_type, "b", 1).await;
    let first = status(ctx.pool(), cap)
        .await
        .expect("status")
        .oldest_unpublished_age
        .expect("an age");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = status(ctx.pool(), cap).await.expect("status");
    assert_eq!(during.unpublished, 1);
    assert_eq!(
        during.attempts,
        [(0, 1)],
        "a publish that never reached the broker is no attempt: {during:?}"
    );
    assert!(
        during.oldest_unpublished_age.expect("an age") > first,
        "oldest unpublished age grows: {first:?} then {:?}",
        during.oldest_unpublished_age
    );
    server.start().await;
    eventually(
        Duration::from_secs(15),
        "the waiting row publishes once the broker is back",
        || async { is_published(&ctx, waiting).await },
    )
    .await;

    // A row of a type no stream captures is held at once, with its reason; a later event of
    // its subject waits behind it; other subjects flow.
    let stuck = emit(&ctx, &schemas, &orphan_type, "c", 2).await;
    let behind = emit(&ctx, &schemas, &orphan_type, "c", 3).await;
    let other = emit(&ctx, &schemas, &event_type, "d", 4).await;
    eventually(
        Duration::from_secs(10),
        "the refused row is held",
        || async { status(ctx.pool(), cap).await.expect("status").held_total == 1 },
    )
    .await;
    eventually(Duration::from_secs(10), "other subjects flow", || async {
        is_published(&ctx, other).await
    })
    .await;
    let s = status(ctx.pool(), cap).await.expect("status");
    assert_eq!(
        (s.unpublished, s.held_total),
        (2, 1),
        "the held row and the one behind it: {s:?}"
    );
    assert_eq!(s.held.len(), 1);
    assert_eq!(s.held[0].id, stuck);
    assert!(
        s.held[0].reason.contains("no stream captures") && s.held[0].reason.contains(&orphan_type),
        "the reason names the cause and the type: {}",
        s.held[0].reason
    );
    let listed: Vec<Uuid> = relay
        .held()
        .await
        .expect("held")
        .iter()
        .map(|h| h.id)
        .collect();
    assert_eq!(listed, vec![stuck]);

    // The operator fixes the cause, then releases the row: it and the one behind it publish
    // at once (the relay's poll is two minutes away), the held one first, with its own id.
    let orphan_stream = StreamSpec {
        name: orphan_prefix.to_uppercase(),
        subjects: vec![format!("{orphan_prefix}.>")],
        storage: StorageType::Memory,
        ..Default::default()
    };
    orphan_stream.ensure(&ctx.js).await.expect("stream");
    let unblocked = unblock(ctx.pool(), &Unblock::Ids(vec![stuck]), cap)
        .await
        .expect("unblock");
    assert_eq!(unblocked, vec![stuck]);
    eventually(
        Duration::from_secs(10),
        "the released row and the one behind it publish",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    drop(stop);
    task.await.expect("relay task");

    let delivered = ctx.read_stream().await;
    let ids: Vec<Uuid> = delivered.iter().map(|d| d.envelope.id).collect();
    let pos = |id: Uuid| ids.iter().position(|i| *i == id).expect("in the stream");
    assert!(pos(before) < pos(waiting), "{ids:?}");
    assert_eq!(ids.iter().filter(|i| **i == waiting).count(), 1);
    let orphans: Vec<Uuid> = outbox_testkit::read_stream(&ctx.js, &orphan_stream.name)
        .await
        .iter()
        .map(|d| d.envelope.id)
        .collect();
    assert_eq!(orphans, [stuck, behind], "subject c keeps its order");
    let s = status(ctx.pool(), cap).await.expect("status");
    assert_eq!((s.unpublished, s.at_cap, s.held_total), (0, 0, 0));
    let _ = ctx.js.delete_stream(&orphan_stream.name).await;
}
