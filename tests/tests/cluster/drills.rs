//! A three-node JetStream cluster with an R3 stream under two relays, 20,000 events over 1,000
//! subjects (half before the fault, half emitted through it), and one fault per test: stream
//! leader step-downs in a loop, `kill -9` of the stream leader, SIGSTOP of the stream leader,
//! `kill -9` of the meta leader. After each: every committed event is in the stream once or
//! more (duplicates counted), each subject in commit order, no attempt spent by any row (the
//! publishes the fault stopped count as not attempted, by reason), and the backlog drained
//! within 60 s of the fault's end.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::{EmitExt, Relay, RelayConfig, Schemas, StorageType, StreamSpec};
use outbox_testkit::{eventually, open_schemas, raw_event, read_stream, run_relay, NatsCluster};
use outbox_testkit::{unique_token, TestDb};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use uuid::Uuid;

const SUBJECTS: usize = 1_000;
const BEFORE: usize = 10_000;
const DURING: usize = 10_000;
const PER_TX: usize = 100;

type Expected = Arc<Mutex<HashMap<String, Vec<Uuid>>>>;

/// A relay running in the background, and how to stop it.
type Running = (Arc<Relay>, (oneshot::Sender<()>, JoinHandle<()>));

struct Drill {
    cluster: NatsCluster,
    db: TestDb,
    js: async_nats::jetstream::Context,
    client: async_nats::Client,
    stream: String,
    event_type: String,
    schemas: Arc<Schemas>,
    expected: Expected,
    relays: Vec<Running>,
}

impl Drill {
    async fn start() -> Drill {
        outbox_tests::recorded::install();
        // the relays' warnings (with the first error of a failed batch) go to the test's
        // output, shown on a failure or with --nocapture
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_test_writer()
            .try_init();
        let cluster = NatsCluster::spawn(3).await;
        let client = cluster.connect().await;
        let js = async_nats::jetstream::new(client.clone());
        let prefix = unique_token();
        let stream = prefix.to_uppercase();
        let spec = StreamSpec {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            storage: StorageType::File,
            replicas: 3,
            ..StreamSpec::default()
        };
        cluster.create_stream(&js, spec.to_config()).await;
        let event_type = format!("{prefix}.billing.invoice.paid");
        let db = TestDb::new().await;
        let mut relays = Vec::new();
        for _ in 0..2 {
            let config = RelayConfig {
                event_types: vec![event_type.clone()],
                ..RelayConfig::default()
            };
            let pool = db.new_pool(config.pool_size()).await;
            let client = cluster.connect().await;
            let relay = Relay::new(pool, async_nats::jetstream::new(client), config)
                .await
                .expect("the relay starts on the cluster");
            let relay = Arc::new(relay);
            relays.push((relay.clone(), run_relay(relay)));
        }
        let schemas = Arc::new(open_schemas(std::slice::from_ref(&event_type)));
        let drill = Drill {
            cluster,
            db,
            js,
            client,
            stream,
            event_type,
            schemas,
            expected: Expected::default(),
            relays,
        };
        drill.emitter(0, BEFORE, Duration::ZERO).await.unwrap();
        drill
    }

    /// Emits events `from..from + count`, `PER_TX` to a transaction, `pause` between
    /// transactions, recording each subject's ids in commit order.
    fn emitter(&self, from: usize, count: usize, pause: Duration) -> JoinHandle<()> {
        let (pool, schemas, event_type) = (
            self.db.pool.clone(),
            self.schemas.clone(),
            self.event_type.clone(),
        );
        let expected = self.expected.clone();
        tokio::spawn(async move {
            for chunk in (from..from + count).collect::<Vec<_>>().chunks(PER_TX) {
                let mut tx = pool.begin().await.unwrap();
                let mut ids = Vec::with_capacity(chunk.len());
                for &n in chunk {
                    let subject = format!("inv-{}", n % SUBJECTS);
                    let event = raw_event(&event_type, "billing", &subject).numbered(n as u64);
                    ids.push((subject, tx.emit_raw(&schemas, event.build()).await.unwrap()));
                }
                tx.commit().await.unwrap();
                {
                    let mut expected = expected.lock().unwrap();
                    for (subject, id) in ids {
                        expected.entry(subject).or_default().push(id);
                    }
                }
                tokio::time::sleep(pause).await;
            }
        })
    }

    /// Emits the second half through the fault (about 10 s of it).
    fn emit_during(&self) -> JoinHandle<()> {
        self.emitter(BEFORE, DURING, Duration::from_millis(100))
    }

    async fn stream_leader(&self) -> String {
        self.cluster.stream_leader(&self.js, &self.stream).await
    }

    /// The checks after a fault that ended at `fault_over`.
    async fn finish(mut self, fault_over: Instant, fault: &str) {
        eventually(
            Duration::from_secs(60),
            "the backlog drains within 60 s of the fault's end",
            || async { self.db.unpublished().await == 0 },
        )
        .await;
        let drained = fault_over.elapsed();
        let mut not_attempted = 0;
        for (relay, (stop, running)) in std::mem::take(&mut self.relays) {
            stop.send(()).unwrap();
            running.await.unwrap();
            let stats = relay.stats();
            assert_eq!(stats.held, 0, "{fault}: nothing held: {stats:?}");
            not_attempted += stats.not_attempted;
        }
        let (max_attempts, with_attempts): (i32, i64) = sqlx::query_as(
            "select coalesce(max(attempts), 0), count(*) filter (where attempts > 0) from outbox_events",
        )
        .fetch_one(&self.db.pool)
        .await
        .unwrap();
        let messages = read_stream(&self.js, &self.stream).await;
        let mut seen: HashMap<String, Vec<Uuid>> = HashMap::new();
        let mut stored = HashSet::new();
        let mut duplicates = 0;
        for m in &messages {
            if stored.insert(m.envelope.id) {
                seen.entry(m.envelope.subject.clone())
                    .or_default()
                    .push(m.envelope.id);
            } else {
                duplicates += 1;
            }
        }
        let reasons = outbox_tests::recorded::counter_by(
            outbox_runtime::metrics::PUBLISH_FAILURES,
            &[("event_type", &self.event_type)],
            "reason",
        );
        let not_attempted_reasons = outbox_tests::recorded::counter_by(
            outbox_runtime::metrics::NOT_ATTEMPTED,
            &[("event_type", &self.event_type)],
            "reason",
        );
        eprintln!(
            "{fault}: {} messages ({duplicates} duplicates), drained {drained:?} after the fault, {not_attempted} publishes not attempted, {with_attempts} rows with attempts (max {max_attempts}); failures by reason: {reasons:?}; not attempted by reason: {not_attempted_reasons:?}",
            messages.len()
        );
        // every attempt a row spent is a publish failure the metric counts by reason (the
        // failures that cost none are counted apart, as not attempted)
        let spent: u64 = reasons.values().sum();
        assert!(
            spent >= with_attempts as u64,
            "{fault}: {with_attempts} rows spent an attempt, but only {spent} publish failures were counted: {reasons:?}"
        );
        let expected = self.expected.lock().unwrap().clone();
        let committed: usize = expected.values().map(Vec::len).sum();
        assert_eq!(committed, BEFORE + DURING);
        assert_eq!(
            stored.len(),
            committed,
            "{fault}: every committed event is in the stream"
        );
        for (subject, ids) in &expected {
            assert_eq!(
                seen.get(subject),
                Some(ids),
                "{fault}: {subject} in commit order"
            );
        }
        // An election costs no attempt: every publish it stopped counts as not attempted
        // (docs/relay.md, *Failures*), which the metric above shows by reason.
        assert_eq!(
            (with_attempts, max_attempts),
            (0, 0),
            "{fault}: the election cost attempts ({with_attempts} rows spent some, max {max_attempts}); failures by reason: {reasons:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_leader_step_downs_lose_nothing_and_cost_no_attempt() {
    let drill = Drill::start().await;
    let emitting = drill.emit_during();
    for _ in 0..10 {
        let answer = drill.cluster.step_down(&drill.client, &drill.stream).await;
        eprintln!("step-down: {answer:?}");
        tokio::time::sleep(Duration::from_millis(1_500)).await;
    }
    emitting.await.unwrap();
    drill.finish(Instant::now(), "step-downs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_stream_leader_loses_nothing_and_costs_no_attempt() {
    let mut drill = Drill::start().await;
    let emitting = drill.emit_during();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = drill.stream_leader().await;
    drill.cluster.node(&leader).server.signal("KILL");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let node = drill.cluster.node(&leader);
    node.server.stop(); // reap it
    node.server.start().await;
    emitting.await.unwrap();
    drill
        .finish(Instant::now(), "kill -9 of the stream leader")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freezing_the_stream_leader_loses_nothing_and_costs_no_attempt() {
    let mut drill = Drill::start().await;
    let emitting = drill.emit_during();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = drill.stream_leader().await;
    drill.cluster.node(&leader).server.signal("STOP");
    tokio::time::sleep(Duration::from_secs(10)).await;
    drill.cluster.node(&leader).server.signal("CONT");
    emitting.await.unwrap();
    drill
        .finish(Instant::now(), "SIGSTOP of the stream leader")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_meta_leader_loses_nothing_and_costs_no_attempt() {
    let mut drill = Drill::start().await;
    let emitting = drill.emit_during();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = drill.cluster.meta_leader().await;
    drill.cluster.node(&leader).server.signal("KILL");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let node = drill.cluster.node(&leader);
    node.server.stop();
    node.server.start().await;
    emitting.await.unwrap();
    drill
        .finish(Instant::now(), "kill -9 of the meta leader")
        .await;
}
