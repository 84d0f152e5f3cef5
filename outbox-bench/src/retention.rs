//! `retention`: what pruning costs on a large table whose expired rows lie scattered through
//! it, as months of deletes and reuse leave them.
//!
//! The table holds `--rows=N` published rows (default 20,000,000; `--quick` 400,000), one in
//! `--expired-every=K` (default 20) published 9 to 10 days ago (past the default keep of 7
//! days) at random places, the others within the last 6 days; vacuumed and analyzed. Two
//! parts:
//!
//! - **Pages per prune statement**, from `EXPLAIN (ANALYZE, BUFFERS)` (shared buffers hit and
//!   read): the first statement and the n-th (after n - 1 committed ones; n = 100, or fewer on
//!   a table too small to hold 2n thousand expired rows) of
//!   [`prune_published`](outbox_runtime::retention::prune_published)'s statement, which takes
//!   its batch oldest first through migration 0009's index; then the same for the statement
//!   before 0009 (no order, no index: a scan from the table's start until it meets its rows),
//!   first and n-th, with the index dropped in a transaction that is rolled back. Lines
//!   `prune_pages_first=`, `prune_pages_nth=`, `prune_pages_unindexed_first=`,
//!   `prune_pages_unindexed_nth=`.
//! - **The relay with and without pruning**: one relay drains a backlog of `--backlog=N` rows
//!   (default 50,000; 1,000 subjects) on that table, started before the backlog is written as
//!   in `relay` (`--cold` starts it on the backlog). Three kinds of run alternate:
//!   - *without* retention;
//!   - *with* the runtime's retention task (`Retention::run`, the default configuration: keep
//!     7 days, 1,000 rows a statement, busy at most 10% of the time, or `--busy-percent=P`)
//!     pruning the expired rows meanwhile, on its own pool;
//!   - *unpaced*: as many rows deleted as the relay publishes, the prune statement each time
//!     the stream has gained 1,000 messages, whatever that costs the relay (a retention that
//!     keeps pace with a relay draining at full speed).
//!
//!   The pruner starts once the backlog is written, as the relay is woken; each *with* and
//!   *unpaced* run prints the rows it deleted by then and when the drain ended. The order of
//!   the kinds turns each round. Figures are medians. Last lines:
//!   `relay_with_retention_ratio=<median rate with / median rate without>`,
//!   `retention_rows_per_s=` (the task's deletes per second of drain, median),
//!   `retention_alone_rows_per_s=` (the task for 10 s with no relay running, after the rounds)
//!   and `relay_with_unpaced_retention_ratio=`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_runtime::retention::{self, Retention, RetentionConfig};
use sqlx::PgPool;

use crate::common::{self, BenchStream, PAYLOAD_SQL};

const SUBJECTS: i64 = 1_000;
/// Rows per insert statement while filling the table.
const CHUNK: i64 = 1_000_000;

/// A prune statement of the runtime with its parameters written in: keep 7 days, 1,000 rows.
fn literal(statement: &str) -> String {
    statement
        .replace("$1::timestamptz", "now() - interval '7 days'")
        .replace("$2", "1000")
}
/// The statement before migration 0009: no order, so no index to follow.
const PRUNE_UNINDEXED: &str = "delete from outbox_events where id in ( \
    select id from outbox_events \
     where published_at is not null and published_at < now() - interval '7 days' \
     limit 1000 for update skip locked)";

/// Runs the benchmark and prints its figures.
pub fn run() {
    common::print_command();
    common::runtime().block_on(bench(common::quick()));
}

async fn bench(quick: bool) {
    let rows =
        common::option("rows").map_or(if quick { 400_000 } else { 20_000_000 }, |r| r as i64);
    let every = common::option("expired-every").map_or(20, |e| e.max(1) as i64);
    let backlog = common::option("backlog")
        .map_or(if quick { 5_000 } else { 50_000 }, |b| b.max(1_000) as i64);
    let busy =
        common::option("busy-percent").map_or(RetentionConfig::default().busy_percent, |p| {
            match u8::try_from(p) {
                Ok(p @ 1..=100) => p,
                _ => panic!("--busy-percent takes 1 to 100, got {p}"),
            }
        });
    let rounds = common::option("rounds").map_or(if quick { 1 } else { 3 }, |r| r.max(1));
    let db = common::database().await;
    let client = common::connect_nats().await;
    let stream = BenchStream::new(&client).await;
    println!(
        "{rows} published rows, 1 in {every} expired (keep 7 days) at random places; backlog {backlog} events, {rounds} rounds, 1 relay; retention busy {busy}%"
    );
    let filled = Instant::now();
    fill_history(&db.pool, &stream.prefix, rows, every).await;
    common::vacuum(&db).await;
    let sizes: (String, String, String) = sqlx::query_as(
        "select pg_size_pretty(pg_relation_size('outbox_events')), \
                pg_size_pretty(pg_relation_size('outbox_events_published_idx')), \
                pg_size_pretty(pg_relation_size('outbox_events_pkey'))",
    )
    .fetch_one(&db.pool)
    .await
    .expect("sizes");
    println!(
        "filled in {:.0} s: table {}, published index {}, primary key {}",
        filled.elapsed().as_secs_f64(),
        sizes.0,
        sizes.1,
        sizes.2
    );
    // the history's ids are older than any backlog row's (both are ordered by time)
    let history_end: uuid::Uuid =
        sqlx::query_scalar("select id from outbox_events order by id desc limit 1")
            .fetch_one(&db.pool)
            .await
            .expect("the newest history id");

    // the n-th statement meets as many expired rows as the first
    let nth = (rows / every / 2_000).clamp(2, 100);
    pages(&db.pool, nth).await;

    // rounds alternate: no pruning, the runtime's retention task, and an unpaced prune that
    // keeps the relay's pace
    let mut rates: [Vec<f64>; 3] = Default::default();
    let mut retention_rates = Vec::new();
    for round in 1..=rounds {
        // the order turns each round: no kind always meets the index entries another left
        let mut kinds = Kind::ALL;
        kinds.rotate_left((round as usize - 1) % Kind::ALL.len());
        for kind in kinds {
            stream.purge().await;
            // the pruner starts once the backlog is written, just before the relay is woken
            let mut pruner = None;
            let fill = async {
                common::fill_backlog(&db.pool, &stream.prefix, backlog, SUBJECTS).await;
                sqlx::query("analyze outbox_events")
                    .execute(&db.pool)
                    .await
                    .expect("analyze");
                let options = db.options.clone();
                pruner = Some(match kind {
                    Kind::Without => return,
                    Kind::Paced => Pruner::start(&db.pool, |stop| paced(options, busy, stop)).await,
                    Kind::Unpaced => {
                        let (js, name) = (stream.js.clone(), stream.name.clone());
                        Pruner::start(&db.pool, |stop| unpaced(options, js, name, stop)).await
                    }
                });
            };
            let start = crate::relay::Start::from_args();
            let rate = crate::relay::drain(&db, &stream, 1, backlog, start, fill).await;
            if let Some(pruner) = pruner {
                let (deleted, left, window) = pruner.finish(&db.pool).await;
                let per_s = deleted as f64 / window.as_secs_f64();
                println!(
                    "  {}: {deleted} expired rows deleted while the relay drained ({per_s:.0} rows/s over {:.2} s)",
                    kind.name(),
                    window.as_secs_f64(),
                );
                if left < 1_000 {
                    println!(
                        "  warning: {left} expired rows left, so later runs prune less than they would; give a smaller --expired-every or more --rows"
                    );
                }
                if kind == Kind::Paced {
                    retention_rates.push(per_s);
                }
            }
            rates[kind as usize].push(rate);
            println!("  {}: {rate:.0} events/s", kind.name());
            // the backlog goes, so every run meets the same table
            sqlx::query("delete from outbox_events where id > $1")
                .bind(history_end)
                .execute(&db.pool)
                .await
                .expect("delete the backlog");
        }
        let last = |kind: Kind| rates[kind as usize][rates[kind as usize].len() - 1];
        println!(
            "round {round}: without retention {:.0} events/s, with the retention task {:.0} events/s, with unpaced retention {:.0} events/s",
            last(Kind::Without),
            last(Kind::Paced),
            last(Kind::Unpaced)
        );
    }
    let [without, with, unpaced] = rates.map(|mut r| common::median(&mut r));
    let retention_rate = common::median(&mut retention_rates);
    // the task alone, as it catches up once the relay is idle
    let alone = {
        let options = db.options.clone();
        let pruner = Pruner::start(&db.pool, |stop| paced(options, busy, stop)).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        let (deleted, _, window) = pruner.finish(&db.pool).await;
        println!(
            "the retention task alone: {deleted} expired rows deleted in {:.1} s",
            window.as_secs_f64()
        );
        deleted as f64 / window.as_secs_f64()
    };
    stream.delete().await;
    drop(db);
    println!("relay_without_retention_events_per_s={without:.0}");
    println!("relay_with_retention_events_per_s={with:.0}");
    println!("relay_with_unpaced_retention_events_per_s={unpaced:.0}");
    println!("relay_with_retention_ratio={:.3}", with / without);
    println!("retention_rows_per_s={retention_rate:.0}");
    println!("retention_alone_rows_per_s={alone:.0}");
    println!(
        "relay_with_unpaced_retention_ratio={:.3}",
        unpaced / without
    );
}

/// The kinds of run, in the order they alternate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Without,
    Paced,
    Unpaced,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Without, Kind::Paced, Kind::Unpaced];

    fn name(self) -> &'static str {
        match self {
            Kind::Without => "without retention",
            Kind::Paced => "with the retention task",
            Kind::Unpaced => "with unpaced retention",
        }
    }
}

/// The expired rows left (published over 7 days ago), through the published index.
async fn expired(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "select count(*) from outbox_events \
          where published_at is not null and published_at < now() - interval '7 days'",
    )
    .fetch_one(pool)
    .await
    .expect("count the expired rows")
}

/// A pruner task on a pool of its own, and the expired rows there were when it started.
struct Pruner {
    task: tokio::task::JoinHandle<()>,
    stop: Arc<AtomicBool>,
    expired_before: i64,
    since: Instant,
}

impl Pruner {
    /// Counts the expired rows, then spawns the task `prune(stop)`, which runs until `stop`.
    async fn start<F>(pool: &PgPool, prune: impl FnOnce(Arc<AtomicBool>) -> F) -> Pruner
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let expired_before = expired(pool).await;
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(prune(stop.clone()));
        Pruner {
            task,
            stop,
            expired_before,
            since: Instant::now(),
        }
    }

    /// Stops the task: the rows it deleted, the expired rows left, and how long it ran. The
    /// task closes its pool first, so a statement in flight has committed.
    async fn finish(self, pool: &PgPool) -> (i64, i64, Duration) {
        let window = self.since.elapsed();
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("retention task");
        let left = expired(pool).await;
        (self.expired_before - left, left, window)
    }
}

/// A pool of two connections for a pruner.
async fn pruner_pool(options: sqlx::postgres::PgConnectOptions) -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .expect("connect the retention pool")
}

/// The runtime's retention task, default configuration but `busy_percent`, until `stop`.
async fn paced(options: sqlx::postgres::PgConnectOptions, busy: u8, stop: Arc<AtomicBool>) {
    let pool = pruner_pool(options).await;
    let config = RetentionConfig {
        busy_percent: busy,
        ..Default::default()
    };
    let task = Retention::new(pool.clone(), config).expect("the retention configuration");
    task.run(async {
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    pool.close().await;
}

/// Deletes as many expired rows as the relay publishes: a 1,000-row prune statement whenever
/// the stream has gained 1,000 messages since the last, until `stop`.
async fn unpaced(
    options: sqlx::postgres::PgConnectOptions,
    js: async_nats::jetstream::Context,
    name: String,
    stop: Arc<AtomicBool>,
) {
    let statement = literal(retention::PRUNE_PUBLISHED);
    let pool = pruner_pool(options).await;
    // one handle, its count read each tick: a request per tick, not two
    let mut published = js.get_stream(&name).await.expect("the stream");
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let (mut statements, mut short) = (0, 0);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let messages = published.info().await.expect("stream info").state.messages;
        if messages < (statements + 1) * 1_000 {
            continue;
        }
        // the statement answers how many rows it deleted (and the newest)
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(statement.clone()))
            .fetch_one(&pool)
            .await
            .expect("prune");
        statements += 1;
        short += u64::from(n < 1_000);
    }
    if short > 0 {
        println!(
            "  warning: {short} unpaced prune statements found fewer than 1,000 expired rows, so this run pruned less than the relay published"
        );
    }
    pool.close().await;
}

/// Inserts `rows` published rows in statements of [`CHUNK`]: ids and `created_at` ordered by
/// time 10 days ago, `published_at` 9 to 10 days ago for one row in `every` at random, else
/// within the last 6 days. The table is filled at fillfactor 100 (as marks and vacuums leave
/// its pages), then set back to migration 0004's 50.
async fn fill_history(pool: &PgPool, prefix: &str, rows: i64, every: i64) {
    sqlx::query("alter table outbox_events set (fillfactor = 100)")
        .execute(pool)
        .await
        .expect("fillfactor");
    let created = "now() - interval '10 days' + i * interval '1 microsecond'";
    let sql = format!(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at, published_at)
         select (lpad(to_hex((extract(epoch from {created}) * 1000000)::bigint), 14, '0')
                 || substr(md5(i::text || random()::text), 1, 18))::uuid,
                $1 || '.order.placed', 'bench', md5('order' || s)::uuid::text, now(),
                {PAYLOAD_SQL}, {created},
                case when random() < 1.0 / $5 then now() - interval '9 days' - random() * interval '1 day'
                     else now() - random() * interval '6 days' end
           from generate_series($2::int8, $3::int8) as g(i), lateral (select i % $4 as s) as x"
    );
    let mut from = 1;
    while from <= rows {
        let to = (from + CHUNK - 1).min(rows);
        // the text is the bench's own; the values go in as bind parameters
        sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .bind(prefix)
            .bind(from)
            .bind(to)
            .bind(SUBJECTS)
            .bind(every as f64)
            .execute(pool)
            .await
            .expect("fill the history");
        from = to + 1;
    }
    sqlx::query("alter table outbox_events set (fillfactor = 50)")
        .execute(pool)
        .await
        .expect("fillfactor");
}

/// Shared buffers one statement touched (hit and read) and its time in ms, by `EXPLAIN
/// (ANALYZE, BUFFERS)` on `conn` (the statement runs).
async fn explain(conn: &mut sqlx::PgConnection, statement: &str) -> (i64, f64) {
    let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "explain (analyze, buffers, format json) {statement}"
    )))
    .fetch_one(conn)
    .await
    .expect("explain");
    let top = &plan[0]["Plan"];
    let blocks = |k: &str| top[k].as_i64().unwrap_or(0);
    (
        blocks("Shared Hit Blocks") + blocks("Shared Read Blocks"),
        plan[0]["Execution Time"].as_f64().unwrap_or(0.0),
    )
}

/// [`explain`] in a transaction that is rolled back: nothing is deleted.
async fn explain_only(pool: &PgPool, statement: &str) -> (i64, f64) {
    let mut tx = pool.begin().await.expect("begin");
    let figures = explain(&mut tx, statement).await;
    tx.rollback().await.expect("rollback");
    figures
}

/// The pages of the first and the `nth` prune statement, with and without the index.
async fn pages(pool: &PgPool, nth: i64) {
    let prune = literal(retention::PRUNE_PUBLISHED);
    let (first, first_ms) = explain_only(pool, &prune).await;
    for _ in 1..nth {
        sqlx::query(sqlx::AssertSqlSafe(prune.clone()))
            .execute(pool)
            .await
            .expect("prune");
    }
    let (hundredth, hundredth_ms) = explain_only(pool, &prune).await;
    println!(
        "prune statement through the published index: first {first} pages ({first_ms:.1} ms), statement {nth}: {hundredth} pages ({hundredth_ms:.1} ms)"
    );
    // before 0009: the same table without the index, statements that scan until they meet
    // their rows; 99 of them and the 100th in one transaction, rolled back
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("drop index outbox_events_published_idx")
        .execute(&mut *tx)
        .await
        .expect("drop the index");
    let (un_first, un_first_ms) = explain(&mut tx, PRUNE_UNINDEXED).await;
    // explain analyze ran the delete: 1 statement done; each next one scans past the rows
    // the ones before it read (the unexpired, and the deleted ones until a vacuum)
    for _ in 2..nth {
        sqlx::query(PRUNE_UNINDEXED)
            .execute(&mut *tx)
            .await
            .expect("prune");
    }
    let (un_nth, un_nth_ms) = explain(&mut tx, PRUNE_UNINDEXED).await;
    tx.rollback().await.expect("rollback");
    println!(
        "prune statement before 0009 (no index): first {un_first} pages ({un_first_ms:.1} ms), statement {nth}: {un_nth} pages ({un_nth_ms:.1} ms)"
    );
    println!("prune_pages_first={first}");
    println!("prune_pages_nth={hundredth}");
    println!("prune_pages_unindexed_first={un_first}");
    println!("prune_pages_unindexed_nth={un_nth}");
}
