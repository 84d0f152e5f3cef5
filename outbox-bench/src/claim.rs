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
//! Two more databases hold rows the relay must leave alone, older than every batch: *backing
//! off* has 5,000 subjects whose one row failed and waits for its retry (a row each in
//! `outbox_retries`, due in a day), *held* has 100,000 rows queued behind one held subject.
//! Their claims are compared with the empty table's: a claim must not read what waits.
//!
//! Last lines: `claim_backing_off_vs_plain_ratio=` and `claim_held_backlog_vs_plain_ratio=`
//! (the claim step), then `claim_full_vs_empty_ratio=<median full batch / median empty batch>`
//! (the whole batch: claim + publish + mark + commit). The claim + mark + commit part without
//! the publish is printed as its own ratio.

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
    let (backing_off, held) = if quick {
        (1_000, 20_000)
    } else {
        (5_000, 100_000)
    };
    let mut tables = Vec::new();
    for (label, rows) in [
        ("empty", 0),
        ("full", history),
        ("backing off", 0),
        ("held", 0),
    ] {
        let db = common::database().await;
        match label {
            "backing off" => park(&db, &stream.prefix, "backoff", backing_off, backing_off).await,
            "held" => park(&db, &stream.prefix, "held", held, 1).await,
            _ => {}
        }
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
                event_types: stream.event_types(),
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
        for k in 0..tables.len() {
            let n = tables.len();
            let t = &mut tables[(k + s) % n];
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
    let (empty, full, backing, behind_held) = (medians[0], medians[1], medians[2], medians[3]);
    println!(
        "claim_backing_off_vs_plain_ratio={:.3} ({backing_off} subjects backing off: claim {:.2} ms vs {:.2} ms)",
        backing.0 / empty.0,
        backing.0,
        empty.0
    );
    println!(
        "claim_held_backlog_vs_plain_ratio={:.3} ({held} rows behind a held subject: claim {:.2} ms vs {:.2} ms)",
        behind_held.0 / empty.0,
        behind_held.0,
        empty.0
    );
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

/// `rows` old rows over `subjects` subjects, each subject parked in `outbox_retries` by its
/// oldest row: backing off (due in a day) when every subject has one row, held otherwise.
async fn park(db: &TestDb, prefix: &str, kind: &str, rows: i64, subjects: i64) {
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at)
         select gen_random_uuid(), $1 || '.order.placed', 'bench', $2 || '-' || (g % $4), now(),
                '{}'::jsonb, now() - interval '1 hour' + g * interval '1 microsecond'
           from generate_series(1, $3) g",
    )
    .bind(prefix)
    .bind(kind)
    .bind(rows)
    .bind(subjects)
    .execute(&db.pool)
    .await
    .expect("insert the parked rows");
    sqlx::query(
        "insert into outbox_retries (subject, event_id, retry_at, reason)
         select distinct on (subject) subject, id,
                case when $2 then now() + interval '1 day' end, 'bench'
           from outbox_events where subject like $1 || '-%' order by subject, created_at, id",
    )
    .bind(kind)
    .bind(rows == subjects)
    .execute(&db.pool)
    .await
    .expect("park their subjects");
    println!("{kind}: {rows} rows over {subjects} parked subject(s)");
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
