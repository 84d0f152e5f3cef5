//! The two readers of the stream, and what they check.
//!
//! - **The stream reader**: an ordered consumer that reads every message as JetStream stored
//!   it: the latency from the emitting transaction's commit to the message in the stream (the
//!   `latency` mode's figure), and, per subject, whether the revisions come in order, once each.
//! - **The service's consumer**: [`outbox_runtime::consumer`] under one durable name in two
//!   replicas, each with its own pool and NATS connection, deduping by event id. Its handler
//!   records each event it applies in `soak_applied`, in the transaction the consumer commits:
//!   at the end, every event emitted must be there once, and each subject's revisions must
//!   rise with the stream sequence.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull::OrderedConfig};
use futures::StreamExt;
use outbox_runtime::consumer::{Consumer, ConsumerConfig, Delivery, Handler, HandlerError};
use serde::Deserialize;
use sqlx::{PgConnection, PgPool};
use tokio::time::Instant;
use uuid::Uuid;

use super::load::OrderRevised;
use super::stats::Histogram;

/// The durable name of the service's consumer.
pub const CONSUMER: &str = "soak";
/// The consumer's record of the events it applied.
pub const APPLIED_TABLE: &str = "create table soak_applied ( \
    event_id uuid not null, subject text not null, revision bigint not null, \
    stream_seq bigint not null)";

const STREAM_READER: u8 = 1;
const CONSUMER_READER: u8 = 2;

/// Latencies from commit to each reader, per step and for the current minute.
#[derive(Debug, Default, Clone)]
pub struct ReadLatency {
    /// Commit to the stream reader.
    pub stream: Histogram,
    /// Commit to the consumer's handler.
    pub consumer: Histogram,
}

/// The emitted events not yet seen by both readers: when each was committed, in which step.
#[derive(Debug, Default)]
pub struct InFlight {
    committing: Mutex<HashMap<Uuid, (Instant, usize, u8)>>,
    /// The step emits belong to from now on.
    pub step: AtomicUsize,
    per_step: Mutex<Vec<ReadLatency>>,
    minute: Mutex<ReadLatency>,
}

impl InFlight {
    /// `ids` are about to commit (the moment just before `COMMIT` is sent).
    pub fn committing(&self, ids: &[Uuid], at: Instant) {
        let step = self.step.load(Ordering::Relaxed);
        let mut map = self.committing.lock().expect("in flight");
        for id in ids {
            map.insert(*id, (at, step, 0));
        }
    }

    /// `reader` sees `id` now: its latency counts, in its step and in the minute.
    fn seen(&self, id: Uuid, reader: u8) -> bool {
        let now = Instant::now();
        let (at, step) = {
            let mut map = self.committing.lock().expect("in flight");
            let Some(entry) = map.get_mut(&id) else {
                return false;
            };
            if entry.2 & reader != 0 {
                return false;
            }
            entry.2 |= reader;
            let (at, step, seen) = *entry;
            if seen == STREAM_READER | CONSUMER_READER {
                map.remove(&id);
            }
            (at, step)
        };
        let latency = now - at;
        let record = |r: &mut ReadLatency| match reader {
            STREAM_READER => r.stream.record(latency),
            _ => r.consumer.record(latency),
        };
        {
            let mut per_step = self.per_step.lock().expect("per step");
            if per_step.len() <= step {
                per_step.resize(step + 1, ReadLatency::default());
            }
            record(&mut per_step[step]);
        }
        record(&mut self.minute.lock().expect("minute"));
        true
    }

    /// The current minute's latencies, which start again from zero.
    pub fn take_minute(&self) -> ReadLatency {
        std::mem::take(&mut *self.minute.lock().expect("minute"))
    }

    /// The latencies of step `step`'s events.
    pub fn of_step(&self, step: usize) -> ReadLatency {
        let per_step = self.per_step.lock().expect("per step");
        per_step.get(step).cloned().unwrap_or_default()
    }
}

/// What the stream reader found: messages, and per subject whether each revision came next.
#[derive(Debug, Default, Clone)]
pub struct StreamCheck {
    /// Messages read.
    pub messages: u64,
    /// Messages whose revision was not above the last one of their subject: a second copy in
    /// the stream (or an event stored after a later one of its subject).
    pub repeated: u64,
    /// Messages whose revision skipped one or more of their subject's (an event stored later
    /// than a later one of its subject, or never).
    pub skipped: u64,
    /// The next revision expected per subject.
    pub next: HashMap<String, u64>,
}

#[derive(Deserialize)]
struct Body {
    id: Uuid,
    subject: String,
    data: Revision,
}

#[derive(Deserialize)]
struct Revision {
    revision: u64,
}

/// Reads stream `stream` from its start with an ordered consumer until `stop`, checking each
/// subject's revisions and timing each message from its commit.
pub async fn read_stream(
    js: jetstream::Context,
    stream: String,
    in_flight: Arc<InFlight>,
    stop: Arc<AtomicBool>,
    check: Arc<Mutex<StreamCheck>>,
) {
    let consumer = js
        .get_stream(&stream)
        .await
        .expect("the stream")
        .create_consumer(OrderedConfig::default())
        .await
        .expect("an ordered consumer");
    let mut messages = consumer.messages().await.expect("read the stream");
    while !stop.load(Ordering::Relaxed) {
        let next = tokio::time::timeout(Duration::from_millis(200), messages.next()).await;
        let Ok(next) = next else { continue };
        let message = next
            .expect("the ordered consumer does not end")
            .expect("a message");
        let body: Body =
            serde_json::from_slice(&message.payload).expect("an OrderRevised envelope");
        in_flight.seen(body.id, STREAM_READER);
        let mut check = check.lock().expect("stream check");
        check.messages += 1;
        let next = check.next.entry(body.subject).or_insert(0);
        let revision = body.data.revision;
        if revision < *next {
            check.repeated += 1;
        } else {
            let skipped = revision > *next;
            *next = revision + 1;
            if skipped {
                check.skipped += 1;
            }
        }
    }
}

/// The handler of the service's consumer: records the event in `soak_applied`, in the
/// consumer's transaction, and its latency from commit.
#[derive(Debug)]
struct Apply {
    in_flight: Arc<InFlight>,
    handled: Arc<AtomicU64>,
}

impl Handler<OrderRevised> for Apply {
    async fn handle(
        &self,
        delivery: &Delivery<OrderRevised>,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        sqlx::query(
            "insert into soak_applied (event_id, subject, revision, stream_seq) values ($1, $2, $3, $4)",
        )
        .bind(delivery.id())
        .bind(&delivery.envelope.subject)
        .bind(i64::try_from(delivery.event().revision)?)
        .bind(i64::try_from(delivery.stream_sequence)?)
        .execute(tx)
        .await?;
        self.in_flight.seen(delivery.id(), CONSUMER_READER);
        self.handled.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The service's consumer, running in `replicas` replicas until stopped.
#[derive(Debug)]
pub struct Replicas {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stop: tokio::sync::watch::Sender<bool>,
    /// Handler calls so far, every replica.
    pub handled: Arc<AtomicU64>,
}

impl Replicas {
    /// Starts `replicas` consumers of `stream` under [`CONSUMER`], each on a pool of its own
    /// (`pool()` makes one) and a NATS connection of its own (`nats()`).
    pub async fn start<P, N>(
        replicas: usize,
        stream: &str,
        in_flight: Arc<InFlight>,
        pool: impl Fn() -> P,
        nats: impl Fn() -> N,
    ) -> Replicas
    where
        P: std::future::Future<Output = PgPool>,
        N: std::future::Future<Output = async_nats::Client>,
    {
        let handled = Arc::new(AtomicU64::new(0));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut tasks = Vec::with_capacity(replicas);
        for _ in 0..replicas {
            let handler = Apply {
                in_flight: in_flight.clone(),
                handled: handled.clone(),
            };
            let consumer = Consumer::new(
                pool().await,
                jetstream::new(nats().await),
                ConsumerConfig::new(CONSUMER, stream),
                handler,
            );
            let mut stopped = stopped.clone();
            tasks.push(tokio::spawn(async move {
                consumer
                    .run(async move {
                        let _ = stopped.wait_for(|s| *s).await;
                    })
                    .await
                    .expect("the consumer runs");
            }));
        }
        Replicas {
            tasks,
            stop,
            handled,
        }
    }

    /// Stops every replica once its message in hand is finished.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            task.await.expect("consumer replica");
        }
    }
}

/// Messages the consumer's durable has not had acked: not yet delivered, or delivered and not
/// yet acked.
pub async fn pending(js: &jetstream::Context, stream: &str) -> u64 {
    let stream = js.get_stream(stream).await.expect("the stream");
    let info = stream
        .consumer_info(CONSUMER)
        .await
        .expect("the consumer's durable");
    info.num_pending + info.num_ack_pending as u64
}

/// What `soak_applied` says against what was emitted.
#[derive(Debug, Clone, Copy, Default)]
pub struct Applied {
    /// Rows: events applied, a second application counting again.
    pub rows: i64,
    /// Events applied more than once (beyond what dedupe caught).
    pub duplicated: i64,
    /// Events emitted that were neither applied nor left for the consumer in its durable (acked
    /// without taking effect, or never in the stream).
    pub lost: i64,
    /// Applied events whose revision is not above the one before them in stream order, in
    /// their subject.
    pub reordered: i64,
}

/// Checks `soak_applied` against `emitted` (events per subject), `pending` of them still
/// waiting in the consumer's durable.
pub async fn check_applied(pool: &PgPool, emitted: &[(Uuid, u64)], pending: u64) -> Applied {
    let (rows, distinct): (i64, i64) =
        sqlx::query_as("select count(*), count(distinct event_id) from soak_applied")
            .fetch_one(pool)
            .await
            .expect("count soak_applied");
    let reordered: i64 = sqlx::query_scalar(
        "select count(*) from ( \
           select revision, lag(revision) over (partition by subject order by stream_seq) as before \
             from soak_applied) as a \
          where revision <= before",
    )
    .fetch_one(pool)
    .await
    .expect("check the order");
    // each subject's revisions are 0..n: the events emitted and applied are those below n
    let (subjects, counts): (Vec<String>, Vec<i64>) = emitted
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(s, n)| (s.to_string(), *n as i64))
        .unzip();
    let found: i64 = sqlx::query_scalar(
        "select count(*) from (select distinct a.subject, a.revision \
           from soak_applied a join unnest($1::text[], $2::int8[]) as e(subject, n) \
             on a.subject = e.subject and a.revision < e.n) as d",
    )
    .bind(&subjects)
    .bind(&counts)
    .fetch_one(pool)
    .await
    .expect("match the applied events");
    let total: i64 = counts.iter().sum();
    Applied {
        rows,
        duplicated: rows - distinct,
        // a message applied whose ack the server had not counted yet is in both: at least once
        lost: (total - found - pending as i64).max(0),
        reordered,
    }
}
