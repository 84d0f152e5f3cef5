//! `latency`: commit-to-stream latency at a steady 1,000 events/s (`--rate=N` for another
//! rate: `--rate=10` is a quiet service, whose relay waits for commits between events).
//!
//! An emitter commits one event per transaction (`emit_raw`, validated against
//! `bench.order.placed`, 1,000 subjects in round robin) on a fixed schedule, one every
//! millisecond (at the default rate) for 10 s, or for 30 s below 100 events/s; each emit runs in its own task on a pool of 32 connections, so a slow
//! commit does not shift the schedule. One relay runs with its LISTEN/NOTIFY wake-up (fallback
//! poll 5 s, the default). An ordered JetStream consumer on the stream reads every message.
//!
//! Latency of an event = the moment the consumer sees its message − the moment just before its
//! transaction's `COMMIT` was sent (both `Instant`s of this process). The first second is a
//! warm-up and left out. The database's own view (`published_at − created_at`, insert to mark)
//! is printed too. `--cluster` runs it on a private three-node cluster with an R3 stream instead
//! of `NATS_URL`. Last line: `p50_ms=<x> p99_ms=<y>`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull::OrderedConfig};
use futures::StreamExt;
use outbox_runtime::{EmitExt, Relay, RelayConfig, Schemas};
use outbox_testkit::raw_event;
use uuid::Uuid;

use crate::common::{self, BenchStream};

/// Events per second: `--rate`, default 1,000.
fn rate() -> u64 {
    common::option("rate").unwrap_or(1_000).clamp(1, 100_000)
}

/// One committed event: its schedule index, id, the moment before `COMMIT`, the commit's time.
type Committed = (u64, Uuid, Instant, Duration);
const SUBJECTS: u64 = 1_000;

/// Runs the benchmark and prints its figures.
pub fn run() {
    common::print_command();
    common::runtime().block_on(bench(common::quick()));
}

async fn bench(quick: bool) {
    let rate = rate();
    let seconds: u64 = match (quick, rate < 100) {
        (true, _) => 3,
        (false, false) => 10,
        (false, true) => 30,
    };
    let warmup = if quick { rate / 2 } else { rate };
    let db = common::database().await;
    let _cluster = common::cluster().await;
    let client = common::connect_nats().await;
    let stream = BenchStream::new(&client).await;
    let event_type = format!("{}.order.placed", stream.prefix);
    let schemas = Arc::new(
        Schemas::from_pairs([(event_type.as_str(), common::ORDER_SCHEMA)]).expect("schema"),
    );
    println!(
        "{rate} events/s for {seconds} s, one event per transaction, {SUBJECTS} subjects, 1 relay (LISTEN/NOTIFY), first {warmup} events left out"
    );

    // the consumer: every message's id and the moment it was seen
    let consumer = stream
        .js
        .get_stream(&stream.name)
        .await
        .expect("the stream")
        .create_consumer(OrderedConfig::default())
        .await
        .expect("an ordered consumer");
    let mut messages = consumer.messages().await.expect("consume");
    let total = seconds * rate;
    let reader = tokio::spawn(async move {
        let mut seen: HashMap<Uuid, Instant> = HashMap::with_capacity(total as usize);
        while (seen.len() as u64) < total {
            let next = tokio::time::timeout(Duration::from_secs(30), messages.next()).await;
            let msg = next
                .expect("every event reaches the stream within 30 s")
                .expect("the consumer does not end")
                .expect("a message");
            let at = Instant::now();
            let id = msg
                .headers
                .as_ref()
                .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                .and_then(|v| v.as_str().parse().ok())
                .expect("a Nats-Msg-Id");
            seen.insert(id, at);
        }
        seen
    });

    // the relay
    let relay_client = common::connect_nats().await;
    let config = RelayConfig {
        event_types: vec![event_type.clone()],
        lanes: common::lanes(),
        ..Default::default()
    };
    let relay = Relay::new(
        db.new_pool(config.pool_size()).await,
        jetstream::new(relay_client),
        config,
    )
    .await
    .expect("start the relay");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let relay = tokio::spawn(async move {
        let mut stopped = stopped;
        relay
            .run(async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await
            .expect("relay run");
        relay.stats()
    });

    // the emitter
    let committed: Arc<Mutex<Vec<Committed>>> =
        Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
    let subjects: Vec<Uuid> = (0..SUBJECTS).map(|_| Uuid::now_v7()).collect();
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let emit_pool = db.new_pool(32).await;
    let mut emits = Vec::with_capacity(total as usize);
    let schedule_started = Instant::now();
    for i in 0..total {
        tick.tick().await;
        let (pool, schemas, committed) = (emit_pool.clone(), schemas.clone(), committed.clone());
        let subject = subjects[(i % SUBJECTS) as usize];
        let event = raw_event(&event_type, "bench", subject.to_string())
            .data(common::payload(i, subject))
            .build();
        emits.push(tokio::spawn(async move {
            let mut tx = pool.begin().await.expect("begin");
            let id = tx.emit_raw(&schemas, event).await.expect("emit");
            let before_commit = Instant::now();
            tx.commit().await.expect("commit");
            let commit = before_commit.elapsed();
            committed
                .lock()
                .expect("lock")
                .push((i, id, before_commit, commit));
        }));
    }
    for e in emits {
        e.await.expect("emit task");
    }
    let schedule = schedule_started.elapsed();
    let seen = reader.await.expect("consumer task");
    let _ = stop.send(true);
    let stats = relay.await.expect("relay task");

    let committed = std::mem::take(&mut *committed.lock().expect("lock"));
    let mut latencies: Vec<f64> = Vec::with_capacity(committed.len());
    let mut commits: Vec<f64> = Vec::with_capacity(committed.len());
    let mut after_commit: Vec<f64> = Vec::with_capacity(committed.len());
    for (i, id, before_commit, commit) in &committed {
        if *i < warmup {
            continue;
        }
        let at = seen.get(id).expect("every committed event was seen");
        latencies.push(common::ms(at.duration_since(*before_commit)));
        commits.push(common::ms(*commit));
        after_commit.push(common::ms(
            at.saturating_duration_since(*before_commit + *commit),
        ));
    }
    latencies.sort_by(f64::total_cmp);
    commits.sort_by(f64::total_cmp);
    after_commit.sort_by(f64::total_cmp);
    let db_view: Vec<f64> = sqlx::query_scalar(
        "select extract(epoch from published_at - created_at)::float8 * 1000 from outbox_events
          order by created_at offset $1",
    )
    .bind(warmup as i64)
    .fetch_all(&db.pool)
    .await
    .expect("published_at - created_at");
    let mut db_view = db_view;
    db_view.sort_by(f64::total_cmp);
    println!(
        "schedule: {total} events in {:.2} s ({:.0} events/s offered)",
        schedule.as_secs_f64(),
        total as f64 / schedule.as_secs_f64()
    );
    println!(
        "relay: {} batches, {:.1} rows per batch",
        stats.batches,
        stats.published as f64 / stats.batches.max(1) as f64
    );
    println!(
        "emitter commit: p50 {:.2} ms, p99 {:.2} ms",
        common::percentile(&commits, 50.0),
        common::percentile(&commits, 99.0)
    );
    println!(
        "commit returned to consumer: p50 {:.2} ms, p99 {:.2} ms",
        common::percentile(&after_commit, 50.0),
        common::percentile(&after_commit, 99.0)
    );
    println!(
        "database view (published_at - created_at): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        common::percentile(&db_view, 50.0),
        common::percentile(&db_view, 99.0),
        db_view[db_view.len() - 1]
    );
    println!(
        "commit to consumer: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms ({} events)",
        common::percentile(&latencies, 50.0),
        common::percentile(&latencies, 90.0),
        common::percentile(&latencies, 99.0),
        common::percentile(&latencies, 99.9),
        latencies[latencies.len() - 1],
        latencies.len()
    );
    stream.delete().await;
    drop(db);
    println!(
        "p50_ms={:.2} p99_ms={:.2}",
        common::percentile(&latencies, 50.0),
        common::percentile(&latencies, 99.0)
    );
}
