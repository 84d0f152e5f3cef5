//! The open-loop load: transactions arrive as a Poisson process at the offered rate, whatever
//! the database's answers, and wait their turn on their connection; so a database that slows
//! down shows as latency and a lower achieved rate, not as a lower offered rate.
//!
//! A generator task draws the arrivals (exponential waits, a mean of `1 / rate`) and hands each
//! to one of the shape's connections at random; each connection's task runs its transactions one
//! after the other. A transaction writes `per_tx` events of subjects its connection owns (subject
//! `i` belongs to connection `i % connections`), so each subject's events are committed in the
//! order of their `revision`, which the readers check.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_runtime::{EmitExt, OutboxEvent};
use serde::{Deserialize, Serialize};
use sqlx::{Connection, PgConnection};
use tokio::time::Instant;
use uuid::Uuid;

use super::readers::InFlight;
use super::stats::{Histogram, Rng};

/// The soak's event: an order revised, its `revision` counting its order's events from 0.
#[derive(Debug, Clone, Serialize, Deserialize, OutboxEvent)]
#[outbox(
    event_type = "bench.order.revised",
    source = "bench",
    schema = "schemas/events/bench.order.revised.schema.json"
)]
pub struct OrderRevised {
    pub order_id: Uuid,
    pub revision: u64,
    customer_id: Uuid,
    amount_cents: u64,
    currency: String,
    lines: Vec<Line>,
    placed_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Line {
    sku: String,
    qty: u32,
    price_cents: u64,
}

impl OrderRevised {
    fn new(order_id: Uuid, revision: u64) -> OrderRevised {
        let i = revision.wrapping_add(order_id.as_u64_pair().1);
        OrderRevised {
            order_id,
            revision,
            customer_id: Uuid::now_v7(),
            amount_cents: (i * 37) % 100_000 + 2449,
            currency: "EUR".into(),
            lines: vec![
                Line {
                    sku: format!("SKU-{}", i % 1000),
                    qty: 1 + (i % 5) as u32,
                    price_cents: 1999,
                },
                Line {
                    sku: format!("SKU-{}", i % 777),
                    qty: 1,
                    price_cents: 450,
                },
            ],
            placed_at: Utc::now(),
            note: Some("leave it at the front desk and ring twice".into()),
        }
    }
}

/// The plain insert of the baseline: the row `emit` writes, without its validation and without
/// any wake-up (no notification, no advisory lock).
const INSERT: &str =
    "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
     values ($1, $2, $3, $4, $5, $6, clock_timestamp())";

/// What a transaction writes its events with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// [`INSERT`]: the baseline.
    Insert,
    /// `tx.emit(..)`: validated, and notifying while a relay waits.
    Emit,
}

/// Connections and events per transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub connections: usize,
    pub per_tx: usize,
}

impl Shape {
    /// `8 conns, 1/tx`.
    pub fn label(self) -> String {
        format!("{} conns, {}/tx", self.connections, self.per_tx)
    }

    /// `8c_1tx`, for figure names.
    pub fn key(self) -> String {
        format!("{}c_{}tx", self.connections, self.per_tx)
    }
}

/// The subjects (orders) and the next revision of each. A subject is written by one
/// connection at a time, so its revisions follow its commits.
#[derive(Debug)]
pub struct Subjects {
    ids: Vec<Uuid>,
    next: Vec<AtomicU64>,
}

impl Subjects {
    /// `n` subjects of this run.
    pub fn new(n: usize) -> Subjects {
        let run = Uuid::now_v7().as_u64_pair().1;
        Subjects {
            ids: (0..n as u64).map(|i| Uuid::from_u64_pair(run, i)).collect(),
            next: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Starts every subject's revisions at 0 again (the baseline's rows are gone).
    pub fn reset(&self) {
        for n in &self.next {
            n.store(0, Ordering::Relaxed);
        }
    }

    /// Events written so far (since the last reset), per subject id.
    pub fn written(&self) -> impl Iterator<Item = (Uuid, u64)> + '_ {
        self.ids
            .iter()
            .zip(&self.next)
            .map(|(id, n)| (*id, n.load(Ordering::Relaxed)))
    }

    /// Events written so far, all subjects.
    pub fn total(&self) -> u64 {
        self.next.iter().map(|n| n.load(Ordering::Relaxed)).sum()
    }
}

/// Figures of a span of time (a step, a minute): events offered and committed, and each
/// transaction's latency from its arrival to its commit's return.
#[derive(Debug, Default)]
pub struct Tally(Mutex<Counts>);

/// What a [`Tally`] holds.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    /// Events whose transactions arrived.
    pub offered: u64,
    /// Events committed.
    pub committed: u64,
    /// Arrival to commit returned, per transaction; a transaction still waiting for its
    /// connection when its step ended counts with its wait so far.
    pub latency: Histogram,
}

impl Tally {
    fn offered(&self, events: u64) {
        self.0.lock().expect("tally").offered += events;
    }

    fn committed(&self, events: u64, latency: Duration) {
        let mut c = self.0.lock().expect("tally");
        c.committed += events;
        c.latency.record(latency);
    }

    fn counted(&self, events: u64) {
        self.0.lock().expect("tally").committed += events;
    }

    fn waited(&self, latency: Duration) {
        self.0.lock().expect("tally").latency.record(latency);
    }

    /// The figures so far, which start again from zero.
    pub fn take(&self) -> Counts {
        std::mem::take(&mut *self.0.lock().expect("tally"))
    }
}

/// What the load shares with the rest of the run.
#[derive(Debug, Clone)]
pub struct Load {
    pub subjects: Arc<Subjects>,
    /// The current minute's figures, which the reporter takes each minute.
    pub minute: Arc<Tally>,
    /// Where emits register their commits, for the readers' latencies (outbox phase only).
    pub in_flight: Option<Arc<InFlight>>,
}

/// One step's result.
#[derive(Debug, Clone)]
pub struct StepResult {
    /// Events offered per second (the arrivals drawn, not the nominal rate).
    pub offered: f64,
    /// Events committed per second within the step.
    pub achieved: f64,
    /// Arrival to commit.
    pub latency: Histogram,
}

impl StepResult {
    /// Whether the step kept up: at least 97% of the offered events committed within it, and
    /// the median latency at most `max_p50_ms`. A queue that grows through the step pushes the
    /// median up with it; the p99 is no test, since a few stalls of the disk's flushes of a
    /// hundred milliseconds and more (common on shared machines) set it at any load.
    pub fn sustained(&self, max_p50_ms: f64) -> bool {
        let p50 = self.latency.percentile_ms(50.0).unwrap_or(f64::INFINITY);
        self.achieved >= 0.97 * self.offered && p50 <= max_p50_ms
    }

    /// `offered 4,000/s, achieved 3,990/s (0.998), commit p50 .. ms`.
    pub fn line(&self) -> String {
        format!(
            "offered {}/s, achieved {}/s ({:.3}), commit {}",
            thousands(self.offered),
            thousands(self.achieved),
            self.achieved / self.offered.max(f64::MIN_POSITIVE),
            self.latency.summary()
        )
    }
}

/// `12,345` (rounded).
pub fn thousands(x: f64) -> String {
    let n = x.round() as i64;
    let digits = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

/// Opens `shape.connections` connections named `application_name`.
pub async fn connect(
    options: &sqlx::postgres::PgConnectOptions,
    shape: Shape,
    application_name: &str,
) -> Vec<PgConnection> {
    let options = options.clone().application_name(application_name);
    let mut conns = Vec::with_capacity(shape.connections);
    for _ in 0..shape.connections {
        conns.push(
            PgConnection::connect_with(&options)
                .await
                .expect("connect the load's connections"),
        );
    }
    conns
}

/// One transaction of `per_tx` events of subjects in `owned`; returns the moment its commit
/// returned.
async fn transaction(
    conn: &mut PgConnection,
    writer: Writer,
    per_tx: usize,
    owned: &[usize],
    rng: &mut Rng,
    load: &Load,
) -> Instant {
    let mut tx = conn.begin().await.expect("begin");
    let mut ids = Vec::with_capacity(per_tx);
    for _ in 0..per_tx {
        let s = owned[rng.below(owned.len())];
        let revision = load.subjects.next[s].fetch_add(1, Ordering::Relaxed);
        let event = OrderRevised::new(load.subjects.ids[s], revision);
        match writer {
            Writer::Insert => {
                let data = serde_json::to_value(&event).expect("serialize");
                sqlx::query(INSERT)
                    .bind(Uuid::now_v7())
                    .bind(OrderRevised::EVENT_TYPE)
                    .bind(OrderRevised::SOURCE)
                    .bind(event.order_id.to_string())
                    .bind(Utc::now())
                    .bind(sqlx::types::Json(&data))
                    .execute(&mut *tx)
                    .await
                    .expect("insert");
            }
            Writer::Emit => ids.push(tx.emit(event).await.expect("emit")),
        }
    }
    if let Some(in_flight) = &load.in_flight {
        in_flight.committing(&ids, Instant::now());
    }
    tx.commit().await.expect("commit");
    Instant::now()
}

/// The subjects connection `worker` of `connections` owns.
fn owned(subjects: usize, connections: usize, worker: usize) -> Vec<usize> {
    (worker..subjects).step_by(connections).collect()
}

/// Every connection commits transactions back to back for `secs`: the closed-loop rate, in
/// events per second, from which the open-loop search starts.
pub async fn closed_loop(
    conns: &mut Vec<PgConnection>,
    shape: Shape,
    writer: Writer,
    secs: f64,
    load: &Load,
) -> f64 {
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(secs);
    let committed = Arc::new(AtomicU64::new(0));
    let subjects = load.subjects.ids.len();
    let tasks: Vec<_> = std::mem::take(conns)
        .into_iter()
        .enumerate()
        .map(|(w, mut conn)| {
            let (load, committed) = (load.clone(), committed.clone());
            let owned = owned(subjects, shape.connections, w);
            tokio::spawn(async move {
                let mut rng = Rng::from_clock();
                loop {
                    let done =
                        transaction(&mut conn, writer, shape.per_tx, &owned, &mut rng, &load).await;
                    if done > deadline {
                        break;
                    }
                    committed.fetch_add(shape.per_tx as u64, Ordering::Relaxed);
                    load.minute.counted(shape.per_tx as u64);
                }
                conn
            })
        })
        .collect();
    for task in tasks {
        conns.push(task.await.expect("load task"));
    }
    committed.load(Ordering::Relaxed) as f64 / secs
}

/// Offers `rate` events a second for `secs` over `conns`, open loop; waits for the
/// transactions in progress at the end, and counts those that had not started as waiting
/// until then.
pub async fn step(
    conns: &mut Vec<PgConnection>,
    shape: Shape,
    writer: Writer,
    rate: f64,
    secs: f64,
    load: &Load,
) -> StepResult {
    let tally = Arc::new(Tally::default());
    let subjects = load.subjects.ids.len();
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(secs);
    let mut queues = Vec::with_capacity(shape.connections);
    let tasks: Vec<_> = std::mem::take(conns)
        .into_iter()
        .enumerate()
        .map(|(w, mut conn)| {
            let (sender, mut arrivals) = tokio::sync::mpsc::unbounded_channel::<Instant>();
            queues.push(sender);
            let (load, tally) = (load.clone(), tally.clone());
            let owned = owned(subjects, shape.connections, w);
            tokio::spawn(async move {
                let mut rng = Rng::from_clock();
                while let Some(arrived) = arrivals.recv().await {
                    if Instant::now() >= deadline {
                        tally.waited(deadline - arrived);
                        load.minute.waited(deadline - arrived);
                        continue;
                    }
                    let done =
                        transaction(&mut conn, writer, shape.per_tx, &owned, &mut rng, &load).await;
                    let events = if done <= deadline {
                        shape.per_tx as u64
                    } else {
                        0
                    };
                    tally.committed(events, done - arrived);
                    load.minute.committed(shape.per_tx as u64, done - arrived);
                }
                conn
            })
        })
        .collect();

    // the arrivals: a Poisson process of transactions, each handed to a connection at random
    let per_second = rate / shape.per_tx as f64;
    let mut rng = Rng::from_clock();
    let mut next = started + rng.exponential(per_second);
    while next < deadline {
        tokio::time::sleep_until(next).await;
        // the timer wakes on the millisecond: every arrival due by now goes, stamped with its
        // time plus the timer's millisecond of slack (lateness beyond that counts: a generator
        // starved of CPU is part of the run)
        let now = Instant::now();
        while next <= now && next < deadline {
            let stamp = now.min(next + Duration::from_millis(1));
            queues[rng.below(queues.len())]
                .send(stamp)
                .expect("the connection's task runs");
            tally.offered(shape.per_tx as u64);
            load.minute.offered(shape.per_tx as u64);
            next += rng.exponential(per_second);
        }
    }
    drop(queues);
    for task in tasks {
        conns.push(task.await.expect("load task"));
    }
    let counts = tally.take();
    StepResult {
        offered: counts.offered as f64 / secs,
        achieved: counts.committed as f64 / secs,
        latency: counts.latency,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_in_thousands() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1_234.0), "1,234");
        assert_eq!(thousands(12_345_678.0), "12,345,678");
        assert_eq!(thousands(-1_000.0), "-1,000");
    }

    #[test]
    fn each_subject_belongs_to_one_connection() {
        let all: Vec<usize> = (0..3).flat_map(|w| owned(10, 3, w)).collect();
        let mut sorted = all.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
    }
}
