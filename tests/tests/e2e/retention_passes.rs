//! Retention's passes: dedupe pruning in batches, the turns between the two tables, a table
//! whose statement failed, and rows it must pass over (being set unpublished, locked elsewhere).

use std::time::Duration;

use outbox_runtime::retention;
use outbox_testkit::eventually;
use outbox_testkit::suite::Ctx;
use uuid::Uuid;

/// Emits and commits an event of `event_type` from `ops` about `subject`, payload `{"n": n}`.

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
pub(crate) async fn hold_outbox_events(
    pool: &sqlx::PgPool,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
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
pub(crate) fn run_retention(
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
        // a fixed pace: rows all consumed at one instant would have the pass catch up at 100%
        busy_percent: 1,
        max_busy_percent: 1,
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
    insert_published_every(pool, n, -9.0 * 86_400.0, -1.0).await;
}

/// Inserts `n` published rows, row `i` (from 1) published `start + i * step` seconds from now.
async fn insert_published_every(pool: &sqlx::PgPool, n: i64, start: f64, step: f64) {
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at, published_at) \
         select gen_random_uuid(), 'ops.row.changed', 'ops', 'ops-' || i, now(), '{}', \
                now() - interval '10 days', \
                now() + make_interval(secs => $2) + i * make_interval(secs => $3) \
           from generate_series(1, $1) as g(i)",
    )
    .bind(n)
    .bind(start)
    .bind(step)
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

/// The largest value gauge `name` showed while `run` ran, sampled every 100 ms on this thread
/// (the retention task runs here: a current-thread runtime), with a recorder of this test's own.
async fn highest_gauge_while(name: &str, run: impl std::future::Future<Output = ()>) -> f64 {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let mut highest = 0.0_f64;
    tokio::pin!(run);
    loop {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            if let (true, DebugValue::Gauge(v)) = (key.key().name() == name, value) {
                highest = highest.max(v.into_inner());
            }
        }
        tokio::select! {
            () = &mut run => return highest,
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// Inserts `n` rows published 8 days ago (outside a 7-day keep), 100 µs apart: three seconds of
/// published time per 30,000 rows, as a service publishing 10,000 a second leaves them.
async fn insert_dense_expired(pool: &sqlx::PgPool, n: i64) {
    insert_published_every(pool, n, -8.0 * 86_400.0, 0.000_1).await;
}

/// Rows that expired faster than the pass's floor deletes them (published at 10,000 a
/// second): the pass measures that it moves through their published time slower than the
/// clock and raises its share above `busy_percent`, and prunes them all; with the ceiling at
/// the floor the share stays there. The share is read from `outbox_retention_busy_percent`.
#[tokio::test]
async fn a_pass_behind_the_rows_expiring_raises_its_share_and_one_at_a_fixed_pace_does_not() {
    use outbox_runtime::metrics::PRUNE_SHARE;
    let ctx = Ctx::new().await;
    let pool = ctx.pool();
    insert_dense_expired(pool, 30_000).await;
    let config = retention::RetentionConfig {
        batch_size: 10,
        busy_percent: 5,
        keep_dedupe: None,
        interval: Duration::from_secs(3600),
        ..Default::default()
    };

    // fixed at 5%: ten rows a statement, each followed by a pause 19 times as long (here about
    // 1,000 rows, 0.1 s of published time, a second); stopped after one measuring window and
    // more, with rows left
    let fixed = retention::Retention::new(
        pool.clone(),
        retention::RetentionConfig {
            max_busy_percent: 5,
            ..config.clone()
        },
    )
    .expect("a valid configuration");
    let highest = highest_gauge_while(PRUNE_SHARE, async {
        let _ = tokio::time::timeout(Duration::from_secs(8), fixed.run_once()).await;
    })
    .await;
    assert_eq!(highest, 5.0, "a fixed pace stays at its share");
    let left = retention::count_prunable(pool, Duration::from_secs(7 * 24 * 3600))
        .await
        .unwrap();
    assert!(
        left > 0,
        "the fixed pass was stopped before its rows ran out"
    );

    // following: from 5% up to 100
    let following = retention::Retention::new(pool.clone(), config).expect("a valid configuration");
    let mut pruned = 0;
    let highest = highest_gauge_while(PRUNE_SHARE, async {
        pruned = following.run_once().await.expect("the pass").0;
    })
    .await;
    assert!(
        highest > 5.0,
        "the pass raised its share above its floor of 5 (highest seen: {highest})"
    );
    assert_eq!(pruned, left as u64, "the pass pruned every expired row");
    assert_eq!(
        retention::count_prunable(pool, Duration::from_secs(7 * 24 * 3600))
            .await
            .unwrap(),
        0
    );
}

/// Rows written by hand with any value the column allows: one published at `-infinity` (the
/// oldest of all, deleted first and alone in its statement) and one at `infinity` (never
/// expired). The pass measures nothing from the first, deletes it with the others, keeps the
/// second.
#[tokio::test]
async fn a_row_published_at_minus_infinity_is_pruned_and_one_at_infinity_is_kept() {
    let ctx = Ctx::new().await;
    let pool = ctx.pool();
    insert_expired(pool, 20).await;
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at, published_at) \
         values (gen_random_uuid(), 'ops.row.changed', 'ops', 'ops-a', now(), '{}', now(), '-infinity'), \
                (gen_random_uuid(), 'ops.row.changed', 'ops', 'ops-b', now(), '{}', now(), 'infinity')",
    )
    .execute(pool)
    .await
    .unwrap();
    let config = retention::RetentionConfig {
        batch_size: 1,
        busy_percent: 100,
        keep_dedupe: None,
        ..Default::default()
    };
    let task = retention::Retention::new(pool.clone(), config).expect("a valid configuration");
    assert_eq!(task.run_once().await.unwrap(), (21, 0));
    let left: Vec<String> = sqlx::query_scalar("select published_at::text from outbox_events")
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(left, ["infinity"]);
}

/// A table with a child table holds two heaps under one name, each numbering its rows from
/// `(0,1)`: the first spent row of each table and the first live one of the other share a
/// `ctid`. Each delete checks its condition again on the rows it reaches, so only spent rows
/// go, from whichever table.
#[tokio::test]
async fn a_live_row_of_a_child_table_sharing_a_spent_rows_ctid_is_kept() {
    let ctx = Ctx::new().await;
    let pool = ctx.pool();
    for statement in [
        "create table outbox_events_child () inherits (outbox_events)",
        "create table outbox_consumed_child () inherits (outbox_consumed)",
        // the parents' first rows: spent
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at, published_at) \
         values (gen_random_uuid(), 'ops.row.changed', 'ops', 'spent', now(), '{}', now(), now() - interval '30 days')",
        "insert into outbox_consumed (consumer, event_id, consumed_at) \
         values ('c', gen_random_uuid(), now() - interval '30 days')",
        // the children's first rows: one not published, one consumed just now
        "insert into outbox_events_child (id, event_type, source, subject, time, data, created_at) \
         values (gen_random_uuid(), 'ops.row.changed', 'ops', 'live', now(), '{}', now())",
        "insert into outbox_consumed_child (consumer, event_id, consumed_at) \
         values ('live', gen_random_uuid(), now())",
    ] {
        sqlx::query(statement).execute(pool).await.unwrap();
    }
    let same: bool = sqlx::query_scalar(
        "select (select ctid from only outbox_events) = (select ctid from outbox_events_child) \
            and (select ctid from only outbox_consumed) = (select ctid from outbox_consumed_child)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(
        same,
        "the test's premise: the spent and the live rows share a ctid"
    );

    let week = Duration::from_secs(7 * 24 * 3600);
    assert_eq!(retention::prune_published(pool, week, 10).await.unwrap(), 1);
    assert_eq!(retention::prune_dedupe(pool, week, 10).await.unwrap(), 1);
    let left: Vec<String> = sqlx::query_scalar(
        "select subject from outbox_events union all select consumer from outbox_consumed",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(left, ["live", "live"]);
}
