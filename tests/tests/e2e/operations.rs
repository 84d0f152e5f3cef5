//! What operators see and do: retention pruning under load without ever deleting an
//! unpublished row, its window and dry run, and its refusal of a batch below one. (Status
//! during a broker outage, which stops a private server, is in the `outage` binary.)

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::{retention, Relay, RelayConfig, Schemas};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{emit_committed, eventually, free_port, open_schemas, raw_event, run_relay};
use uuid::Uuid;

/// Emits and commits an event of `event_type` from `ops` about `subject`, payload `{"n": n}`.
async fn emit(ctx: &Ctx, schemas: &Schemas, event_type: &str, subject: &str, n: i64) -> Uuid {
    let event = raw_event(event_type, "ops", subject).numbered(n);
    emit_committed(ctx.pool(), schemas, event).await
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
