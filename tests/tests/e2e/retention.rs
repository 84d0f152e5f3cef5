//! Retention: pruning under load without ever deleting an unpublished row, its window and dry
//! run, its refusal of a batch below one, its pace, and the pages a prune statement reads.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::{retention, Relay, RelayConfig, Schemas};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{emit_committed, eventually, free_port, open_schemas, raw_event, run_relay};
use uuid::Uuid;

use crate::retention_passes::{hold_outbox_events, run_retention};

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

#[tokio::test]
async fn a_paced_retention_task_waits_after_each_statement_and_ends_its_pass_at_shutdown() {
    let ctx = Ctx::new().await;
    let pool = ctx.pool();
    // 2,000 expired rows among 4,000, one deleted per statement
    insert_published(pool, 4_000, 2).await;
    let week = Duration::from_secs(7 * 24 * 3600);
    let prunable = || async { retention::count_prunable(pool, week).await.unwrap() };

    // the first statement is made to take at least 300 ms: it waits for a table lock the test
    // holds (`share` lets reads through and holds deletes)
    let lock = hold_outbox_events(pool).await;
    let task_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(ctx.db.options.clone())
        .await
        .unwrap();
    // busy 10% of its time: after that statement, 2.7 s or more without one
    let config = retention::RetentionConfig {
        batch_size: 1,
        busy_percent: 10,
        keep_dedupe: None,
        ..Default::default()
    };
    let task = retention::Retention::new(task_pool.clone(), config).expect("a valid configuration");
    let (stop, running) = run_retention(task);
    eventually(
        Duration::from_secs(10),
        "the task's delete waiting for the lock",
        || async {
            sqlx::query_scalar::<_, bool>(
                "select exists (select 1 from pg_locks \
                  where relation = 'outbox_events'::regclass and not granted)",
            )
            .fetch_one(pool)
            .await
            .unwrap()
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    lock.commit().await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the first statement's row deleted",
        || async { prunable().await < 2_000 },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        prunable().await,
        1_999,
        "the task, busy 10% of its time, deleted again within 1.5 s of a statement of 300 ms"
    );
    // the pass has minutes left at this pace: shutdown ends it
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("shutdown ends a paced pass at once")
        .expect("the retention task");
    // a statement in flight at shutdown completes on the database before its connection
    // comes back: closing the pool waits for it
    task_pool.close().await;
    let left = prunable().await;
    assert!(left > 0, "the pass was ended before its rows ran out");
    // nothing lost: an unpaced prune takes the rest, the unexpired rows stay
    assert_eq!(
        retention::prune_published(pool, week, 1000).await.unwrap(),
        left as u64
    );
    let kept: i64 = sqlx::query_scalar("select count(*) from outbox_events")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(kept, 2_000, "only expired rows were deleted");
}

/// The pages one prune statement reads (shared buffers hit and read, from `EXPLAIN (ANALYZE,
/// BUFFERS)`), and whether its plan reads `outbox_events_published_idx`. The statement is
/// `prune_published`'s (keep 7 days, 1,000 rows), rolled back.
async fn prune_statement_pages(pool: &sqlx::PgPool) -> (i64, bool) {
    let mut tx = pool.begin().await.unwrap();
    let explain = format!(
        "explain (analyze, buffers, format json) {}",
        retention::PRUNE_PUBLISHED
    );
    let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
        .bind(chrono::Utc::now() - chrono::Duration::days(7))
        .bind(1000_i64)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let top = &plan[0]["Plan"];
    let pages =
        top["Shared Hit Blocks"].as_i64().unwrap() + top["Shared Read Blocks"].as_i64().unwrap();
    (
        pages,
        plan.to_string().contains("outbox_events_published_idx"),
    )
}

/// Inserts `n` published rows, every `expired_every`th of them published 9 days ago (outside
/// a 7-day keep), the others a day ago, interleaved.
async fn insert_published(pool: &sqlx::PgPool, n: i64, expired_every: i64) {
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at, published_at) \
         select gen_random_uuid(), 'ops.row.changed', 'ops', 'row-' || i % 100, now(), \
                jsonb_build_object('note', repeat('x', 200)), now() - interval '10 days', \
                case when i % $2 = 0 then now() - interval '9 days' else now() - interval '1 day' end \
           from generate_series(1, $1) as g(i)",
    )
    .bind(n)
    .bind(expired_every)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("vacuum analyze outbox_events")
        .execute(pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_prune_statement_reads_as_many_pages_however_large_the_table() {
    let ctx = Ctx::new().await;
    let pool = ctx.pool();
    // 1,000 expired rows scattered through 30,000 published ones
    insert_published(pool, 30_000, 30).await;
    let (small, indexed) = prune_statement_pages(pool).await;
    assert!(indexed, "the prune statement reads the published index");
    // four times the table, with the same 1,000 expired rows
    insert_published(pool, 90_000, i64::MAX).await;
    let (large, indexed) = prune_statement_pages(pool).await;
    assert!(indexed, "the prune statement reads the published index");
    assert!(
        large * 2 < small * 3,
        "one prune statement read {small} pages of the table of 30,000 rows and {large} of the table of 120,000"
    );
    let week = Duration::from_secs(7 * 24 * 3600);
    assert_eq!(
        retention::prune_published(pool, week, 1000).await.unwrap(),
        1000
    );
    assert_eq!(retention::count_prunable(pool, week).await.unwrap(), 0);
}

/// Retention whose path to Postgres goes silent without a reset (a frozen network path, a
/// dropped route): its pass gives the statement up after `STATEMENT_ANSWER`, fails naming
/// the table, and closes that connection (the server ends the session left in its
/// transaction); once the path carries bytes again the next pass deletes the expired rows.
/// Without the bound, the pass, and every later one, waited for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retention_pass_whose_path_goes_silent_fails_within_its_bound_and_the_next_prunes() {
    let ctx = Ctx::new().await;
    insert_published(ctx.pool(), 20, 2).await;
    let direct = ctx.pool().connect_options().as_ref().clone();
    let proxy =
        outbox_testkit::TcpProxy::start(format!("{}:{}", direct.get_host(), direct.get_port()))
            .await;
    // the pool hands its idle connection out untested, as when the path goes silent between
    // the pool's test and the statement (a tested one would time out in `acquire` instead)
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(5))
        .test_before_acquire(false)
        .connect_with(direct.host("127.0.0.1").port(proxy.port()))
        .await
        .unwrap();
    let config = five_days_of_published_rows();
    let task = retention::Retention::new(pool.clone(), config).unwrap();
    // the pool holds an open connection when the path goes silent
    // (back in it once the pool's check on release has its answer)
    sqlx::query("select 1").execute(&pool).await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the connection idle in the pool",
        || std::future::ready(pool.num_idle() == 1),
    )
    .await;
    proxy.freeze();
    let bound = retention::STATEMENT_ANSWER + Duration::from_secs(20);
    let started = std::time::Instant::now();
    let pass = tokio::time::timeout(bound, task.run_once())
        .await
        .unwrap_or_else(|_| panic!("the pass still waited after {bound:?}"));
    eprintln!("the pass failed after {:?}", started.elapsed());
    let err = pass.expect_err("a pass on a silent path fails").to_string();
    assert!(
        err.contains("outbox_events") && err.contains("did not answer"),
        "the error names the table and says why: {err}"
    );
    proxy.thaw();
    let (published, dedupe) = tokio::time::timeout(bound, task.run_once())
        .await
        .expect("the next pass ends")
        .expect("the next pass works");
    assert_eq!((published, dedupe), (10, 0), "the ten expired rows");
    let left: i64 = sqlx::query_scalar("select count(*) from outbox_events")
        .fetch_one(ctx.pool())
        .await
        .unwrap();
    assert_eq!(left, 10, "the rows inside the window stay");
}

/// A retention statement waiting behind a table lock (a `vacuum full`, a migration) is ended
/// by the server after 20 s, before its client gives up: the pass fails naming the lock
/// timeout, and no backend of it is left waiting, so passes that keep meeting the lock do not
/// pile up sessions. Once the lock is gone the next pass prunes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retention_statement_behind_a_table_lock_is_ended_by_the_server_and_leaves_no_session() {
    let ctx = Ctx::new().await;
    insert_published(ctx.pool(), 20, 2).await;
    let config = five_days_of_published_rows();
    let task = retention::Retention::new(ctx.pool().clone(), config).unwrap();
    let mut lock = ctx.pool().begin().await.unwrap();
    sqlx::query("lock table outbox_events in access exclusive mode")
        .execute(&mut *lock)
        .await
        .unwrap();
    let pass = tokio::time::timeout(retention::STATEMENT_ANSWER, task.run_once())
        .await
        .expect("the server ends the statement before the client gives up");
    let err = pass.expect_err("a pass behind the lock fails").to_string();
    assert!(
        err.contains("lock timeout"),
        "the error names the lock timeout: {err}"
    );
    let waiting = crate::relay_replicas::waiting_statements(&ctx).await;
    assert!(
        waiting.is_empty(),
        "no retention session still waits for the lock: {waiting:?}"
    );
    lock.rollback().await.unwrap();
    let (published, _) = task.run_once().await.expect("the next pass works");
    assert_eq!(published, 10, "the ten expired rows");
}

/// Retention keeping five days of published rows, and leaving dedupe rows: of
/// [`insert_published`]'s rows, those published nine days ago go.
fn five_days_of_published_rows() -> retention::RetentionConfig {
    retention::RetentionConfig {
        keep_published: Duration::from_secs(5 * 24 * 3600),
        keep_dedupe: None,
        ..Default::default()
    }
}
