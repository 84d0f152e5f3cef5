//! `relay`: relay throughput draining a pre-filled backlog, against raw JetStream publishing of
//! the same envelopes in the same process.
//!
//! Each round fills `outbox_events` with 100,000 unpublished rows (1,000 subjects in round
//! robin, four event types, about 330-byte payloads) in one statement, then:
//!
//! - **raw**: reads the rows back and publishes their envelopes (bodies serialized before the
//!   clock starts, fresh ids so that nothing is a duplicate) with the relay's headers, in
//!   windows of 256 publish futures whose acks are then awaited together;
//! - **relay x1**: one [`Relay::run`] drains the backlog;
//! - **relay x2**, **relay x4**: two and four relays (each with its own pool and NATS
//!   connection, as separate processes) drain a backlog of the same size.
//!
//! The relays run before their backlog is written, as a service's relays do when a backlog
//! builds (a broker outage): started on the empty table and settled (one holding the lease,
//! the others standing by, each lane asleep), then the backlog is written and a notification wakes them;
//! the clock starts at the notification. `--cold` starts them on the written backlog instead,
//! their joining, connecting and first planning inside the timing (a deploy that finds a
//! backlog).
//!
//! Options: `--quick` (10,000 events, one round), `--events=N` (backlog size), `--batch=N`
//! (relay batch size, default `RelayConfig::default().batch_size`), `--lanes=N` (batch loops
//! per relay, default `RelayConfig::default().lanes`), `--window=N` (raw publishes in flight,
//! default 256), `--cluster` (a private three-node cluster with an R3 stream instead of
//! `NATS_URL`: raw and relay both publish to it), `--relays=N` (only the relay xN drain, each
//! round: for a profiler, no baseline and no ratio), `--cold` (above).
//!
//! All publish to one stream (file storage, purged between runs). The last lines:
//! `relay_x2_vs_x1_ratio=` and `relay_x4_vs_x1_ratio=` (medians of the rounds' ratios, each
//! against the x1 run of the same round), then
//! `relay_vs_raw_ratio=<median relay x1 rate / median raw rate>`.

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use async_nats::HeaderMap;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use outbox_runtime::{Envelope, Relay, RelayConfig, CONTENT_TYPE};
use outbox_testkit::TestDb;
use uuid::Uuid;

use crate::common::{self, BenchStream};

const SUBJECTS: i64 = 1_000;

/// Raw publishing's window: publishes in flight before their acks are awaited together.
fn window() -> usize {
    common::option("window").map_or(256, |w| w as usize)
}

fn batch_size() -> usize {
    common::option("batch").map_or(RelayConfig::default().batch_size, |b| b as usize)
}

/// The relays' configuration: defaults but for `--batch` and `--lanes`.
fn relay_config(stream: &BenchStream) -> RelayConfig {
    RelayConfig {
        event_types: stream.event_types(),
        batch_size: batch_size(),
        lanes: common::lanes(),
        ..Default::default()
    }
}

/// Runs the benchmark and prints its figures.
pub fn run() {
    common::print_command();
    common::runtime().block_on(bench(common::quick()));
}

async fn bench(quick: bool) {
    let events = common::option("events").map_or(if quick { 10_000 } else { 100_000 }, |n| {
        i64::try_from(n).expect("--events fits in an i64")
    });
    let rounds = if quick { 1 } else { 3 };
    let db = common::database().await;
    let _cluster = common::cluster().await;
    let client = common::connect_nats().await;
    let stream = BenchStream::new(&client).await;
    println!(
        "backlog {events} events, {SUBJECTS} subjects, relay batch {}, {} lanes per relay, raw window {}, {rounds} rounds, stream {} (file storage)",
        batch_size(),
        common::lanes(),
        window(),
        stream.name
    );

    let start = Start::from_args();
    if let Some(relays) = common::option("relays") {
        // one kind alone, for a profiler: no baseline, no ratio
        for round in 1..=rounds {
            let rate = drain_backlog(&db, &stream, relays.max(1) as usize, events, start).await;
            println!("round {round}: relay x{relays} {rate:.0} events/s");
        }
        stream.delete().await;
        return;
    }
    let (mut raw, mut one, mut two, mut four) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut two_ratio, mut four_ratio) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        refill(&db, &stream, events).await;
        if round == 1 {
            let bytes = common::payload_bytes(&db.pool).await;
            println!("payload (data) {bytes:.0} bytes on average");
        }
        let messages = envelopes(&db).await;
        let cpu = common::CpuTicks::now();
        let processes = common::ProcessTicks::now();
        let took = raw_publish(&stream.js, &messages).await;
        raw.push(events as f64 / took.as_secs_f64());
        println!(
            "  raw: {events} events in {:.0} ms, machine CPU {:.0}% busy; {}",
            common::ms(took),
            cpu.busy_since(),
            processes.per_event_since(events as u64)
        );

        one.push(drain_backlog(&db, &stream, 1, events, start).await);
        two.push(drain_backlog(&db, &stream, 2, events, start).await);
        four.push(drain_backlog(&db, &stream, 4, events, start).await);
        let x1 = one[one.len() - 1];
        two_ratio.push(two[two.len() - 1] / x1);
        four_ratio.push(four[four.len() - 1] / x1);
        if round == 1 {
            refill(&db, &stream, events).await;
            steps(&db, &stream).await;
        }
        println!(
            "round {round}: raw {:.0} events/s, relay x1 {:.0} events/s, relay x2 {:.0} events/s, relay x4 {:.0} events/s",
            raw[raw.len() - 1],
            one[one.len() - 1],
            two[two.len() - 1],
            four[four.len() - 1]
        );
    }
    let (raw, one, two, four) = (
        common::median(&mut raw),
        common::median(&mut one),
        common::median(&mut two),
        common::median(&mut four),
    );
    stream.delete().await;
    drop(db);
    println!("raw_jetstream_events_per_s={raw:.0}");
    println!("relay_x1_events_per_s={one:.0}");
    println!("relay_x2_events_per_s={two:.0}");
    println!("relay_x4_events_per_s={four:.0}");
    println!("relay_x4_vs_raw_ratio={:.2}", four / raw);
    println!("relay_x2_vs_x1_ratio={:.2}", common::median(&mut two_ratio));
    println!(
        "relay_x4_vs_x1_ratio={:.2}",
        common::median(&mut four_ratio)
    );
    println!("relay_vs_raw_ratio={:.2}", one / raw);
}

/// An empty table and stream, then `events` unpublished rows, vacuumed and analyzed.
async fn refill(db: &TestDb, stream: &BenchStream, events: i64) {
    common::truncate(db).await;
    stream.purge().await;
    backlog(db, stream, events).await;
}

/// `events` unpublished rows, vacuumed and analyzed.
async fn backlog(db: &TestDb, stream: &BenchStream, events: i64) {
    common::fill_backlog(&db.pool, &stream.prefix, events, SUBJECTS).await;
    common::vacuum(db).await;
}

/// [`drain`] of a fresh backlog of `events` rows, from an empty table and stream.
async fn drain_backlog(
    db: &TestDb,
    stream: &BenchStream,
    relays: usize,
    events: i64,
    start: Start,
) -> f64 {
    common::truncate(db).await;
    stream.purge().await;
    drain(
        db,
        stream,
        relays,
        events,
        start,
        backlog(db, stream, events),
    )
    .await
}

struct Message {
    subject: String,
    id: String,
    body: Bytes,
}

/// The backlog's envelopes, in `created_at` order, under fresh ids.
async fn envelopes(db: &TestDb) -> Vec<Message> {
    type Row = (
        String,
        String,
        String,
        DateTime<Utc>,
        sqlx::types::Json<serde_json::Value>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "select event_type, source, subject, time, data from outbox_events order by created_at",
    )
    .fetch_all(&db.pool)
    .await
    .expect("read the backlog");
    rows.into_iter()
        .map(|(event_type, source, subject, time, data)| {
            let id = Uuid::now_v7();
            let envelope = Envelope::new(id, event_type.as_str(), source, subject, time, &data.0);
            Message {
                body: serde_json::to_vec(&envelope).expect("serialize").into(),
                subject: event_type,
                id: id.to_string(),
            }
        })
        .collect()
}

/// Publishes `messages` in windows: every publish of a window sent, then its acks awaited.
async fn raw_publish(js: &jetstream::Context, messages: &[Message]) -> Duration {
    let started = Instant::now();
    for window in messages.chunks(window()) {
        let mut acks = Vec::with_capacity(window.len());
        for m in window {
            let mut headers = HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, m.id.as_str());
            headers.insert("Content-Type", CONTENT_TYPE);
            let ack = js
                .publish_with_headers(m.subject.clone(), headers, m.body.clone())
                .await
                .expect("publish");
            acks.push(ack.into_future());
        }
        for ack in futures::future::join_all(acks).await {
            let ack = ack.expect("a PubAck");
            assert!(!ack.duplicate, "raw publishes use fresh ids");
        }
    }
    started.elapsed()
}

/// How the relays of a [`drain`] meet their backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Running already, as a service's relays are when a backlog builds (a broker outage):
    /// started on the empty table, settled (one holding the lease, the others standing by,
    /// each lane's first claim made), then the backlog is written and they are woken. The default.
    Warm,
    /// Started on the backlog (`--cold`): their joining, their connections and their first
    /// statements' planning are inside the timing, as after a deploy that finds a backlog.
    Cold,
}

impl Start {
    /// `--cold` or the default.
    pub fn from_args() -> Start {
        if std::env::args().skip(2).any(|a| a == "--cold") {
            Start::Cold
        } else {
            Start::Warm
        }
    }
}

/// Runs `relays` relays until they have published the `events` rows `fill` writes (an empty
/// table before it); returns events per second, from the moment the relays can see the
/// backlog ([`Start`]).
pub async fn drain(
    db: &TestDb,
    stream: &BenchStream,
    relays: usize,
    events: i64,
    start: Start,
    fill: impl std::future::Future<Output = ()>,
) -> f64 {
    // cold: the backlog is there before the relays start; warm: written once they settled
    let mut fill = Some(fill);
    if start == Start::Cold {
        fill.take().expect("the backlog is written once").await;
    }
    let mut started_relays = Vec::with_capacity(relays);
    for _ in 0..relays {
        let client = common::connect_nats().await;
        let config = relay_config(stream);
        let pool = db.new_pool(config.pool_size()).await;
        let relay = Relay::new(pool, jetstream::new(client), config)
            .await
            .expect("start a relay");
        started_relays.push(Arc::new(relay));
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut cpu = common::CpuTicks::now();
    let mut processes = common::ProcessTicks::now();
    let mut started = Instant::now();
    let tasks: Vec<_> = started_relays
        .iter()
        .map(|relay| {
            let relay = relay.clone();
            let mut stopped = stopped.clone();
            tokio::spawn(async move {
                relay
                    .run(async move {
                        let _ = stopped.wait_for(|s| *s).await;
                    })
                    .await
            })
        })
        .collect();
    let published = |rs: &[Arc<Relay>]| rs.iter().map(|r| r.stats().published).sum::<u64>();
    if let Some(fill) = fill {
        settle(&started_relays).await;
        fill.await;
        cpu = common::CpuTicks::now();
        processes = common::ProcessTicks::now();
        started = Instant::now();
        // a plain insert sends no notification: this one wakes the sleeping lanes
        sqlx::query("select pg_notify($1, 'bench')")
            .bind(outbox_runtime::NOTIFY_CHANNEL)
            .execute(&db.pool)
            .await
            .expect("wake the relays");
    }
    while published(&started_relays) < events as u64 {
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the relays did not drain the backlog within 10 minutes"
        );
    }
    let took = started.elapsed();
    let busy = cpu.busy_since();
    let per_event = processes.per_event_since(events as u64);
    let _ = stop.send(true);
    for task in tasks {
        task.await.expect("relay task").expect("relay run");
    }
    let batches: u64 = started_relays.iter().map(|r| r.stats().batches).sum();
    let duplicates: u64 = started_relays.iter().map(|r| r.stats().duplicates).sum();
    assert_eq!(db.unpublished().await, 0, "the backlog is drained");
    assert_eq!(
        stream.len().await,
        events as u64,
        "every event is in the stream once"
    );
    println!(
        "  relay x{relays}: {events} events in {:.0} ms, {batches} batches ({:.0} rows each), {duplicates} duplicate acks, machine CPU {busy:.0}% busy; {per_event}",
        common::ms(took),
        events as f64 / batches.max(1) as f64
    );
    events as f64 / took.as_secs_f64()
}

/// Until every relay runs and one of them holds the lease (the others stand by), then two
/// seconds more: each lane of the holder, finding the table empty, waits for commits.
async fn settle(relays: &[Arc<Relay>]) {
    let since = Instant::now();
    loop {
        let running = relays.iter().filter(|r| r.health().running).count();
        let holders = relays.iter().filter(|r| r.health().holds_lease).count();
        if running == relays.len() && holders == 1 {
            break;
        }
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "{running} of {} relays running and {holders} holding the lease after 30 s",
            relays.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
}

/// Drains the backlog with one relay driven step by step ([`Relay::claim`],
/// [`Claim::publish`](outbox_runtime::Claim::publish),
/// [`Claim::commit`](outbox_runtime::Claim::commit)) and prints the median time of each step
/// per batch: where a batch's time goes.
async fn steps(db: &TestDb, stream: &BenchStream) {
    // one batch at a time: `claim` takes every partition, whatever the lanes
    let config = relay_config(stream);
    let pool = db.new_pool(config.pool_size()).await;
    let relay = Relay::new(pool, jetstream::new(common::connect_nats().await), config)
        .await
        .expect("start a relay");
    let (mut claim_ms, mut publish_ms, mut mark_ms) = (Vec::new(), Vec::new(), Vec::new());
    let started = Instant::now();
    let mut published = 0;
    loop {
        let t0 = Instant::now();
        let mut claim = relay.claim().await.expect("claim");
        let t1 = Instant::now();
        if claim.is_empty() {
            break;
        }
        published += claim.publish().await.published;
        let t2 = Instant::now();
        claim.commit().await.expect("commit");
        let t3 = Instant::now();
        claim_ms.push(common::ms(t1 - t0));
        publish_ms.push(common::ms(t2 - t1));
        mark_ms.push(common::ms(t3 - t2));
    }
    let took = started.elapsed();
    println!(
        "  relay x1 step by step: {published} events in {:.0} ms; per batch (median): claim {:.2} ms, publish {:.2} ms, mark and commit {:.2} ms",
        common::ms(took),
        common::median(&mut claim_ms),
        common::median(&mut publish_ms),
        common::median(&mut mark_ms)
    );
}
