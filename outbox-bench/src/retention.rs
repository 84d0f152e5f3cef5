//! `retention`: relay throughput with and without a retention task deleting history.
//!
//! Each run starts from a table holding 500,000 rows published 8 days ago and a backlog of
//! 50,000 unpublished rows (1,000 subjects), vacuumed and analyzed. One relay drains the
//! backlog; in the *with* runs a task calls
//! [`prune_published`](outbox_runtime::retention::prune_published) (keep 7 days, 1,000 rows per
//! statement) in a loop on its own pool meanwhile, so it deletes the history while the relay
//! works. Runs alternate; figures are medians. Last line:
//! `relay_with_retention_ratio=<median rate with / median rate without>`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::retention::prune_published;

use crate::common::{self, BenchStream};

const SUBJECTS: i64 = 1_000;
const KEEP: Duration = Duration::from_secs(7 * 24 * 3600);
const AGE: Duration = Duration::from_secs(8 * 24 * 3600);

/// Runs the benchmark and prints its figures.
pub fn run() {
    common::print_command();
    common::runtime().block_on(bench(common::quick()));
}

async fn bench(quick: bool) {
    let (history, backlog): (i64, i64) = if quick {
        (50_000, 5_000)
    } else {
        (500_000, 50_000)
    };
    let rounds = if quick { 1 } else { 3 };
    let db = common::database().await;
    let client = common::connect_nats().await;
    let stream = BenchStream::new(&client).await;
    println!(
        "backlog {backlog} events, history {history} published rows (8 days old, keep 7 days), {rounds} rounds, 1 relay"
    );
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        for pruning in [false, true] {
            common::truncate(&db).await;
            stream.purge().await;
            common::fill_published(&db.pool, &stream.prefix, history, SUBJECTS, AGE).await;
            common::fill_backlog(&db.pool, &stream.prefix, backlog, SUBJECTS).await;
            common::vacuum(&db).await;

            let stop = Arc::new(AtomicBool::new(false));
            let pruner = pruning.then(|| {
                let stop = stop.clone();
                let options = db.options.clone();
                tokio::spawn(async move {
                    let pool = sqlx::postgres::PgPoolOptions::new()
                        .max_connections(2)
                        .connect_with(options)
                        .await
                        .expect("connect the retention pool");
                    let mut pruned = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let n = prune_published(&pool, KEEP, 1_000).await.expect("prune");
                        pruned += n;
                        if n == 0 {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                    pruned
                })
            });
            let rate = crate::relay::drain(&db, &stream, 1, backlog).await;
            let left: i64 = sqlx::query_scalar(
                "select count(*) from outbox_events where published_at < now() - interval '7 days'",
            )
            .fetch_one(&db.pool)
            .await
            .expect("count history");
            stop.store(true, Ordering::Relaxed);
            if let Some(p) = pruner {
                let pruned = p.await.expect("retention task");
                println!(
                    "  retention: {} history rows deleted while the relay drained, {pruned} in all",
                    history - left
                );
                with.push(rate);
            } else {
                without.push(rate);
            }
        }
        println!(
            "round {round}: without retention {:.0} events/s, with retention {:.0} events/s",
            without[without.len() - 1],
            with[with.len() - 1]
        );
    }
    let (without, with) = (common::median(&mut without), common::median(&mut with));
    stream.delete().await;
    drop(db);
    println!("relay_without_retention_events_per_s={without:.0}");
    println!("relay_with_retention_events_per_s={with:.0}");
    println!("relay_with_retention_ratio={:.3}", with / without);
}
