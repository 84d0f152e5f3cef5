//! What operators see and do: status and its figures during a broker outage, a capped row
//! held and then unblocked (same id, order kept), and retention pruning under load without
//! ever deleting an unpublished row.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::status::{status, unblock, Unblock};
use outbox_runtime::{retention, Relay, RelayConfig, Schemas, StorageType, StreamSpec};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{
    emit_committed, eventually, free_port, open_schemas, raw_event, run_relay, NatsServer,
};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_under_load_prunes_spent_rows_and_never_an_unpublished_one() {
    const OLD: i64 = 20_000;
    const NEW: i64 = 3_000;
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("ops.row.changed");
    let schemas = open_schemas(std::slice::from_ref(&event_type));
    // A history of spent rows, published two days ago.
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at, published_at) \
         select gen_random_uuid(), $1, 'ops', 's' || (g % 100), now() - interval '2 days', '{}'::jsonb, \
                now() - interval '2 days', now() - interval '2 days' \
           from generate_series(1, $2) g",
    )
    .bind(&event_type)
    .bind(OLD)
    .execute(ctx.pool())
    .await
    .expect("insert spent rows");

    let relay = Arc::new(
        Relay::new(ctx.pool().clone(), ctx.js.clone(), RelayConfig::default())
            .await
            .expect("relay"),
    );
    let (stop, task) = run_relay(relay);
    // Retention as aggressive as it can be: every published row is spent at once.
    let pruning = {
        let pool = ctx.pool().clone();
        tokio::spawn(async move {
            let mut deleted = 0;
            for _ in 0..200 {
                deleted += retention::prune_published(&pool, Duration::ZERO, 500)
                    .await
                    .expect("prune");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            deleted
        })
    };
    let mut emitted = HashSet::new();
    for n in 0..NEW {
        emitted.insert(emit(&ctx, &schemas, &event_type, &format!("s{}", n % 100), n).await);
    }
    eventually(Duration::from_secs(60), "everything published", || async {
        ctx.db.unpublished().await == 0
    })
    .await;
    let deleted = pruning.await.expect("retention task");
    drop(stop);
    task.await.expect("relay task");

    let published: HashSet<Uuid> = ctx
        .read_stream()
        .await
        .iter()
        .map(|d| d.envelope.id)
        .collect();
    let lost: Vec<&Uuid> = emitted.difference(&published).collect();
    assert!(
        lost.is_empty(),
        "{} emitted events never reached the stream: {lost:?}",
        lost.len()
    );
    assert!(
        deleted >= OLD as u64,
        "the spent history was pruned ({deleted} rows)"
    );
    // What retention left is only ever published rows.
    let left_unpublished: i64 =
        sqlx::query_scalar("select count(*) from outbox_events where published_at is null")
            .fetch_one(ctx.pool())
            .await
            .expect("count");
    assert_eq!(left_unpublished, 0);
    ctx.delete_stream().await;
}

#[tokio::test]
async fn retention_keeps_rows_inside_the_window_and_counts_a_dry_run() {
    let ctx = Ctx::new().await;
    let event_type = ctx.event_type("ops.row.changed");
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at, published_at, attempts) values \
         (gen_random_uuid(), $1, 'ops', 'a', now(), '{}', now() - interval '10 days', now() - interval '9 days', 0), \
         (gen_random_uuid(), $1, 'ops', 'a', now(), '{}', now() - interval '1 hour', now() - interval '1 hour', 0), \
         (gen_random_uuid(), $1, 'ops', 'a', now(), '{}', now() - interval '30 days', null, 25)",
    )
    .bind(&event_type)
    .execute(ctx.pool())
    .await
    .expect("insert rows");
    let week = Duration::from_secs(7 * 24 * 3600);
    assert_eq!(
        retention::count_prunable(ctx.pool(), week)
            .await
            .expect("dry run"),
        1
    );
    assert_eq!(
        retention::prune_published(ctx.pool(), week, 10)
            .await
            .expect("prune"),
        1
    );
    // The 30-day-old unpublished row is an incident, not retention material.
    assert_eq!(
        retention::prune_published(ctx.pool(), Duration::ZERO, 10)
            .await
            .expect("prune"),
        1
    );
    let left: Vec<(Option<chrono::DateTime<chrono::Utc>>, i32)> =
        sqlx::query_as("select published_at, attempts from outbox_events")
            .fetch_all(ctx.pool())
            .await
            .expect("rows");
    assert_eq!(left.len(), 1);
    assert_eq!(left[0], (None, 25));
}

#[tokio::test]
async fn a_prune_batch_below_one_is_refused_before_any_statement() {
    // a pool that has never connected, to a port nothing listens on: a statement would fail
    // with a connection error, so a configuration error shows that none was sent
    let url = format!("postgres://root@127.0.0.1:{}/test", free_port());
    let pool = sqlx::postgres::PgPoolOptions::new()
        .connect_lazy(&url)
        .expect("a lazy pool");
    for batch in [0, -5] {
        let published = retention::prune_published(&pool, Duration::ZERO, batch).await;
        let dedupe = retention::prune_dedupe(&pool, Duration::ZERO, batch).await;
        for result in [published, dedupe] {
            let err = result.expect_err("a batch below 1 would never end the delete loop");
            assert!(
                matches!(err, outbox_runtime::Error::Config(_))
                    && err.to_string().contains(&format!("got {batch}")),
                "{err}"
            );
        }
    }
}
