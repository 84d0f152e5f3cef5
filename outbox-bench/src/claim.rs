//! `claim`: one relay batch with 1,000,000 published rows in the table, against an empty table.
//!
//! Two databases: *empty* (only the batch) and *full* (1,000,000 published rows of history,
//! filled by one `insert .. select .. from generate_series` statement). A sample, in each
//! database in turn: insert one default batch of unpublished rows (500 rows, 500 subjects), `vacuum analyze`, then time
//! one batch through the relay's public steps, [`Relay::claim`] (claim query and its gap
//! check), [`Claim::publish`](outbox_runtime::Claim::publish) (to JetStream, acks awaited) and
//! [`Claim::commit`](outbox_runtime::Claim::commit) (mark published, commit); then delete the
//! batch's rows, so both tables keep their size. Figures are medians.
//!
//! Last line: `claim_full_vs_empty_ratio=<median full batch / median empty batch>` (the whole
//! batch: claim + publish + mark + commit). The claim + mark + commit part without the publish
//! is printed as its own ratio.

use std::time::{Duration, Instant};

use async_nats::jetstream;
use outbox_runtime::{Relay, RelayConfig};
use outbox_testkit::TestDb;
use uuid::Uuid;

use crate::common::{self, BenchStream};

/// The relay's default batch size.
fn batch() -> i64 {
    RelayConfig::default().batch_size as i64
}

struct Table {
    label: &'static str,
    db: TestDb,
    relay: Relay,
    claim: Vec<f64>,
    publish: Vec<f64>,
    mark: Vec<f64>,
    total: Vec<f64>,
}

/// Runs the benchmark and prints its figures.
pub fn run() {
    common::print_command();
    common::runtime().block_on(bench(common::quick()));
}

async fn bench(quick: bool) {
    let history: i64 = if quick { 100_000 } else { 1_000_000 };
    let samples = if quick { 7 } else { 31 };
    let client = common::connect_nats().await;
    let stream = BenchStream::new(&client).await;
    println!(
        "batch {} rows; full table: {history} published rows; {samples} samples per table, interleaved",
        batch()
    );
    let mut tables = Vec::new();
    for (label, rows) in [("empty", 0), ("full", history)] {
        let db = common::database().await;
        if rows > 0 {
            let took = common::fill_published(
                &db.pool,
                &stream.prefix,
                rows,
                1_000,
                Duration::from_secs(3600),
            )
            .await;
            println!(
                "filled {rows} published rows in {:.1} s",
                took.as_secs_f64()
            );
        }
        common::vacuum(&db).await;
        let relay = Relay::new(
            db.new_pool(4).await,
            jetstream::new(common::connect_nats().await),
            RelayConfig {
                subjects: stream.event_types(),
                ..Default::default()
            },
        )
        .await
        .expect("start a relay");
        tables.push(Table {
            label,
            db,
            relay,
            claim: Vec::new(),
            publish: Vec::new(),
            mark: Vec::new(),
            total: Vec::new(),
        });
    }
    // warm up both: connections, prepared statements, caches
    for t in &mut tables {
        sample(t, &stream.prefix).await;
        sample(t, &stream.prefix).await;
        t.claim.clear();
        t.publish.clear();
        t.mark.clear();
        t.total.clear();
    }
    for s in 0..samples {
        for k in 0..2 {
            let t = &mut tables[(k + s) % 2];
            sample(t, &stream.prefix).await;
        }
        stream.purge().await;
    }
    let mut medians = Vec::new();
    for t in &mut tables {
        let claim = common::median(&mut t.claim);
        let publish = common::median(&mut t.publish);
        let mark = common::median(&mut t.mark);
        let total = common::median(&mut t.total);
        println!(
            "{:<5}: batch {total:.2} ms = claim {claim:.2} ms + publish {publish:.2} ms + mark and commit {mark:.2} ms",
            t.label
        );
        medians.push((claim, mark, total));
    }
    let (empty, full) = (medians[0], medians[1]);
    println!(
        "claim_and_mark_full_vs_empty_ratio={:.3} (claim + mark + commit, no publish: {:.2} ms vs {:.2} ms)",
        (full.0 + full.1) / (empty.0 + empty.1),
        full.0 + full.1,
        empty.0 + empty.1
    );
    println!("claim_only_full_vs_empty_ratio={:.3}", full.0 / empty.0);
    stream.delete().await;
    drop(tables);
    println!("claim_full_vs_empty_ratio={:.3}", full.2 / empty.2);
}

async fn sample(t: &mut Table, prefix: &str) {
    common::fill_backlog(&t.db.pool, prefix, batch(), 1_000).await;
    common::vacuum(&t.db).await;
    let started = Instant::now();
    let mut claim = t.relay.claim().await.expect("claim");
    let claimed = started.elapsed();
    assert_eq!(
        claim.len() as i64,
        batch(),
        "the claim takes the whole batch"
    );
    let ids: Vec<Uuid> = claim.ids();
    let report = claim.publish().await;
    let published = started.elapsed();
    claim.commit().await.expect("mark and commit");
    let total = started.elapsed();
    assert_eq!(report.published as i64, batch(), "every row is published");
    t.claim.push(common::ms(claimed));
    t.publish.push(common::ms(published - claimed));
    t.mark.push(common::ms(total - published));
    t.total.push(common::ms(total));
    sqlx::query("delete from outbox_events where id = any($1)")
        .bind(&ids)
        .execute(&t.db.pool)
        .await
        .expect("delete the batch");
}
