//! What operators see and do: retention pruning under load without ever deleting an
//! unpublished row, its window and dry run, its refusal of a batch below one, its pace, its
//! turns between the two tables. (Status during a broker outage, which stops a private server,
//! is in the `outage` binary.)

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

#[tokio::test]
async fn migrate_builds_again_a_published_index_a_failed_concurrent_build_left_invalid() {
    let ctx = Ctx::new().await;
    let pool = ctx.pool();
    let valid = || async {
        sqlx::query_scalar::<_, Option<bool>>(
            "select i.indisvalid from pg_index i join pg_class c on c.oid = i.indexrelid \
              where c.relname = 'outbox_events_published_idx'",
        )
        .fetch_optional(pool)
        .await
        .unwrap()
        .flatten()
    };
    assert_eq!(valid().await, Some(true), "0009 builds the index");

    for recorded in [false, true] {
        sqlx::query("drop index outbox_events_published_idx")
            .execute(pool)
            .await
            .unwrap();
        if !recorded {
            // the build failed, so sqlx did not record 0009
            sqlx::query("delete from _sqlx_migrations where version = 9")
                .execute(pool)
                .await
                .unwrap();
        }
        // a concurrent build that fails: it waits for an older snapshot and times out
        let mut old = pool.begin().await.unwrap();
        sqlx::query("set transaction isolation level repeatable read")
            .execute(&mut *old)
            .await
            .unwrap();
        sqlx::query("select count(*) from outbox_events")
            .execute(&mut *old)
            .await
            .unwrap();
        let mut build = pool.acquire().await.unwrap();
        sqlx::query("set statement_timeout = '500ms'")
            .execute(&mut *build)
            .await
            .unwrap();
        let failed = sqlx::raw_sql(
            "create index concurrently outbox_events_published_idx on outbox_events (published_at) \
             where published_at is not null",
        )
        .execute(&mut *build)
        .await;
        assert!(failed.is_err(), "the build times out");
        sqlx::query("reset statement_timeout")
            .execute(&mut *build)
            .await
            .unwrap();
        drop(build);
        old.rollback().await.unwrap();
        assert_eq!(
            valid().await,
            Some(false),
            "the failed build left it invalid"
        );

        outbox_runtime::migrate(pool).await.unwrap();
        assert_eq!(
            valid().await,
            Some(true),
            "migrate built it again (0009 recorded before: {recorded})"
        );
    }
}

#[tokio::test]
async fn dedupe_pruning_deletes_only_the_rows_past_the_keep_in_batches() {
    let ctx = Ctx::new().await;
    let pool = ctx.pool();
    // 2,500 old dedupe rows and 500 kept ones, interleaved
    sqlx::query(
        "insert into outbox_consumed (consumer, event_id, consumed_at) \
         select 'c' || i % 3, gen_random_uuid(), \
                case when i % 6 = 0 then now() - interval '1 day' else now() - interval '20 days' end \
           from generate_series(1, 3000) as g(i)",
    )
    .execute(pool)
    .await
    .unwrap();
    let keep = Duration::from_secs(14 * 24 * 3600);
    // batches of 1,000: three statements, the last short
    assert_eq!(
        retention::prune_dedupe(pool, keep, 1000).await.unwrap(),
        2500
    );
    let (left, old): (i64, i64) = sqlx::query_as(
        "select count(*), count(*) filter (where consumed_at < now() - interval '14 days') \
           from outbox_consumed",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!((left, old), (500, 0));
    assert_eq!(retention::prune_dedupe(pool, keep, 1000).await.unwrap(), 0);
}

/// Inserts `n` dedupe rows consumed 20 days ago (outside a 14-day keep).
async fn insert_old_dedupe(pool: &sqlx::PgPool, n: i64) {
    sqlx::query(
        "insert into outbox_consumed (consumer, event_id, consumed_at) \
         select 'c', gen_random_uuid(), now() - interval '20 days' from generate_series(1, $1)",
    )
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

/// Holds `outbox_events` in `share` mode (reads go through, deletes wait) until the returned
/// transaction ends.
async fn hold_outbox_events(pool: &sqlx::PgPool) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("lock table outbox_events in share mode")
        .execute(&mut *lock)
        .await
        .unwrap();
    lock
}

/// A pool of two connections to the test's database whose statements give up on a lock after
/// 200 ms.
async fn pool_giving_up_on_locks(ctx: &Ctx) -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(ctx.db.options.clone().options([("lock_timeout", "200ms")]))
        .await
        .unwrap()
}

/// Runs `task` until the returned sender sends (or is dropped).
fn run_retention(
    task: retention::Retention,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        task.run(async {
            let _ = stopped.await;
        })
        .await
    });
    (stop, running)
}

/// Published rows and dedupe rows past their keep.
async fn expired_rows(pool: &sqlx::PgPool) -> (i64, i64) {
    sqlx::query_as(
        "select (select count(*) from outbox_events where published_at < now() - interval '7 days'), \
                (select count(*) from outbox_consumed where consumed_at < now() - interval '14 days')",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_pass_takes_the_tables_in_turns_so_a_published_backlog_holds_off_no_dedupe_pruning() {
    let ctx = Ctx::new().await;
    let pool = ctx.pool();
    insert_expired(pool, 1_000).await;
    insert_old_dedupe(pool, 1_000).await;
    // ten rows per statement at 5% busy: each statement is followed by a pause 19 times as
    // long, so the pass lasts long enough to be watched
    let config = retention::RetentionConfig {
        batch_size: 10,
        busy_percent: 5,
        ..Default::default()
    };
    let task = retention::Retention::new(pool.clone(), config).expect("a valid configuration");
    let (stop, running) = run_retention(task);
    // the published table's second statement comes after the dedupe table's first
    eventually(
        Duration::from_secs(60),
        "two statements' published rows deleted",
        || async { expired_rows(pool).await.0 <= 980 },
    )
    .await;
    stop.send(()).unwrap();
    running.await.unwrap();
    let (published, dedupe) = expired_rows(pool).await;
    assert!(
        published > 0,
        "the pass was stopped before its published rows ran out"
    );
    assert!(
        dedupe <= 990,
        "dedupe rows waited for the published backlog: {dedupe} of 1,000 left while published rows went down to {published}"
    );
}

#[tokio::test]
async fn a_pass_whose_published_prune_fails_still_prunes_dedupe_rows_and_returns_the_error() {
    let warnings = outbox_tests::warnings::Warnings::default();
    let _recording = warnings.record();
    let ctx = Ctx::new().await;
    let pool = ctx.pool();
    insert_expired(pool, 50).await;
    insert_old_dedupe(pool, 50).await;
    // the task's statements give up on a lock after 200 ms; the test holds outbox_events
    let task_pool = pool_giving_up_on_locks(&ctx).await;
    let lock = hold_outbox_events(pool).await;
    let task = retention::Retention::new(task_pool, retention::RetentionConfig::default())
        .expect("a valid configuration");
    let e = task.run_once().await.unwrap_err().to_string();
    assert!(
        e.contains("lock timeout"),
        "the published prune's error: {e}"
    );
    let logged = warnings.messages();
    assert!(
        logged
            .iter()
            .any(|m| m.contains("outbox_events") && m.contains("goes on with the other table")),
        "the failure is logged naming its table as the pass goes on: {logged:?}"
    );
    lock.rollback().await.unwrap();
    assert_eq!(
        expired_rows(pool).await,
        (50, 0),
        "the published rows are kept, the dedupe rows pruned"
    );
    // the next pass takes the rest
    assert_eq!(task.run_once().await.unwrap(), (50, 0));
}

/// A pass's published prune fails once (a lock timeout) while its dedupe prune has hours of
/// rows ahead: the published table is tried again within the same pass a minute later, not
/// set aside until the dedupe rows run out. (The interval between passes is an hour: only the
/// same pass can prune the published rows.) About a minute long.
#[tokio::test]
async fn a_table_whose_statement_failed_is_tried_again_a_minute_later_in_the_same_pass() {
    let warnings = outbox_tests::warnings::Warnings::default();
    let _recording = warnings.record();
    let ctx = Ctx::new().await;
    let pool = ctx.pool();
    insert_expired(pool, 20).await;
    // one row a statement, busy 1%: far more than the test's minutes
    insert_old_dedupe(pool, 100_000).await;
    let task_pool = pool_giving_up_on_locks(&ctx).await;
    let lock = hold_outbox_events(pool).await;
    let config = retention::RetentionConfig {
        batch_size: 1,
        busy_percent: 1,
        interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let task = retention::Retention::new(task_pool, config).expect("a valid configuration");
    let (stop, running) = run_retention(task);
    eventually(
        Duration::from_secs(30),
        "the published prune's failure logged",
        || async {
            warnings
                .messages()
                .iter()
                .any(|m| m.contains("outbox_events"))
        },
    )
    .await;
    lock.rollback().await.unwrap();
    let failed_at = std::time::Instant::now();
    eventually(
        Duration::from_secs(120),
        "the published rows pruned in the same pass",
        || async { expired_rows(pool).await.0 == 0 },
    )
    .await;
    let waited = failed_at.elapsed();
    let dedupe_left = expired_rows(pool).await.1;
    stop.send(()).unwrap();
    running.await.unwrap();
    assert!(
        dedupe_left > 0,
        "the dedupe prune was still going: the same pass tried the published table again"
    );
    assert!(
        waited >= Duration::from_secs(50),
        "the failed table waited about a minute, not {waited:?}"
    );
}

/// Inserts `n` published rows of subject `ops-<i>`, published 9 days ago (outside a 7-day keep).
async fn insert_expired(pool: &sqlx::PgPool, n: i64) {
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at, published_at) \
         select gen_random_uuid(), 'ops.row.changed', 'ops', 'ops-' || i, now(), '{}', \
                now() - interval '10 days', now() - interval '9 days' - i * interval '1 second' \
           from generate_series(1, $1) as g(i)",
    )
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

/// `prune_published` with a week's keep and batches of 1,000, which must not wait for rows
/// other transactions hold (it fails after 20 s if it does).
async fn prune_a_week_without_waiting(pool: &sqlx::PgPool) -> u64 {
    let week = Duration::from_secs(7 * 24 * 3600);
    tokio::time::timeout(
        Duration::from_secs(20),
        retention::prune_published(pool, week, 1000),
    )
    .await
    .expect("the prune passes over a held row, it does not wait for it")
    .expect("prune")
}

#[tokio::test]
async fn a_row_being_set_unpublished_is_passed_over_and_kept() {
    let ctx = Ctx::new().await;
    let pool = ctx.pool();
    insert_expired(pool, 100).await;
    let republished: Uuid =
        sqlx::query_scalar("select id from outbox_events where subject = 'ops-50'")
            .fetch_one(pool)
            .await
            .unwrap();
    // `outbox verify --republish` sets the row unpublished; its transaction is still open
    // while the prune runs
    let mut republish = pool.begin().await.unwrap();
    sqlx::query("update outbox_events set published_at = null where id = $1")
        .bind(republished)
        .execute(&mut *republish)
        .await
        .unwrap();
    assert_eq!(
        prune_a_week_without_waiting(pool).await,
        99,
        "every expired row but the one being republished"
    );
    republish.commit().await.unwrap();
    assert_eq!(prune_a_week_without_waiting(pool).await, 0);
    let left: Vec<(Uuid, Option<chrono::DateTime<chrono::Utc>>)> =
        sqlx::query_as("select id, published_at from outbox_events")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(
        left,
        vec![(republished, None)],
        "the republished row waits for the relay"
    );
}

#[tokio::test]
async fn a_published_row_locked_elsewhere_is_passed_over_and_every_other_row_pruned() {
    let ctx = Ctx::new().await;
    let pool = ctx.pool();
    insert_expired(pool, 2_500).await;
    // an operator's open `select … for update` on one expired row, in the second batch
    let mut operator = pool.begin().await.unwrap();
    let held: Uuid =
        sqlx::query_scalar("select id from outbox_events where subject = 'ops-1200' for update")
            .fetch_one(&mut *operator)
            .await
            .unwrap();
    // `skip locked` fills the second batch from the rows after the held one
    assert_eq!(
        prune_a_week_without_waiting(pool).await,
        2_499,
        "every expired row but the held one, in one pass"
    );
    let left: Vec<Uuid> = sqlx::query_scalar("select id from outbox_events")
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(left, vec![held]);
    operator.rollback().await.unwrap();
    assert_eq!(prune_a_week_without_waiting(pool).await, 1);
}

/// Inserts an unpublished row about `subject`, created `age_secs` ago, with `attempts`.
async fn unpublished_row(pool: &sqlx::PgPool, subject: &str, attempts: i32, age_secs: f64) -> Uuid {
    let id = Uuid::now_v7();
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at, attempts) \
         values ($1, 'ops.row.changed', 'ops', $2, now(), '{}'::jsonb, \
                 now() - make_interval(secs => $3), $4)",
    )
    .bind(id)
    .bind(subject)
    .bind(age_secs)
    .bind(attempts)
    .execute(pool)
    .await
    .expect("insert a row");
    id
}

#[tokio::test]
async fn the_oldest_unpublished_age_leaves_held_subjects_out_and_their_rows_have_a_gauge_of_their_own(
) {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use outbox_runtime::metrics as m;
    use outbox_runtime::status;

    let db = outbox_testkit::TestDb::new().await;
    let pool = &db.pool;
    // subject `held`: its head at the cap, two hours old, and a row behind it; subject
    // `backing`: a row retried in a minute, ten minutes old; subject `fresh`: a new row
    let head = unpublished_row(pool, "held", 20, 7_200.0).await;
    unpublished_row(pool, "held", 0, 3_600.0).await;
    let backing = unpublished_row(pool, "backing", 2, 600.0).await;
    unpublished_row(pool, "fresh", 0, 5.0).await;
    // the relay's schedules for them, as it writes them
    sqlx::query(
        "insert into outbox_retries (subject, event_id, retry_at, reason) values \
           ('held', $1, null, 'it is at the attempt cap (20 of 20)'), \
           ('backing', $2, now() + interval '1 minute', 'maximum messages exceeded')",
    )
    .bind(head)
    .bind(backing)
    .execute(pool)
    .await
    .expect("schedules");

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let s = {
        // this test's thread only: other tests' relays refresh the process's gauges
        let _local = metrics::set_default_local_recorder(&recorder);
        status::record_gauges(pool, 20).await.expect("gauges")
    };
    let gauges: std::collections::HashMap<String, f64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Gauge(v) => Some((key.key().name().to_owned(), v.into_inner())),
            _ => None,
        })
        .collect();

    assert_eq!(
        (
            s.unpublished,
            s.held_unpublished,
            s.held_total,
            s.backing_off
        ),
        (4, 2, 1, 1),
        "{s:?}"
    );
    let oldest = s
        .oldest_unpublished_age
        .expect("rows to publish")
        .as_secs_f64();
    assert!(
        (600.0..700.0).contains(&oldest),
        "the backing-off row is the oldest the relay should publish, not the held one: {s:?}"
    );
    let held = s.oldest_held_age.expect("held rows").as_secs_f64();
    assert!((7_200.0..7_300.0).contains(&held), "{s:?}");
    assert_eq!(s.by_type.len(), 1);
    assert_eq!(s.by_type[0].unpublished, 4);
    assert_eq!(
        s.by_type[0].oldest_unpublished_age,
        s.oldest_unpublished_age
    );
    assert!(
        (600.0..700.0).contains(&gauges[m::OLDEST_UNPUBLISHED_AGE]),
        "{gauges:?}"
    );
    assert_eq!(gauges[m::UNPUBLISHED], 4.0);
    assert_eq!(gauges[m::UNPUBLISHED_HELD], 2.0);
    assert_eq!(gauges[m::ROWS_HELD], 1.0);
    assert_eq!(gauges[m::ROWS_AT_CAP], 1.0);

    // Only the held subject left: nothing for the relay to publish, however old the held rows.
    sqlx::query("delete from outbox_events where subject <> 'held'")
        .execute(pool)
        .await
        .expect("publish the others");
    let s = status::status(pool, 20).await.expect("status");
    assert_eq!((s.unpublished, s.held_unpublished), (2, 2));
    assert_eq!(s.oldest_unpublished_age, None, "{s:?}");
}
