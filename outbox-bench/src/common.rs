//! What the modes share: the command line, a fresh database (the test kit's), a private
//! stream, the benchmark payload, and statistics.
//!
//! Defaults (the test kit's): `DATABASE_URL=postgres://root@127.0.0.1/test`,
//! `NATS_URL=nats://127.0.0.1:4222`. With `--cluster`, the `relay` and `latency` modes start a
//! private three-node JetStream cluster (the test kit's, on loopback ports) and use it instead
//! of `NATS_URL`, with a stream of 3 replicas.

use std::sync::OnceLock;
use std::time::Duration;

use async_nats::jetstream;
use outbox_runtime::{StorageType, StreamSpec};
use outbox_testkit::{database_url, nats_url, unique_name, NatsCluster, TestDb};
use sqlx::PgPool;

/// The schema of the benchmark payload (`bench.order.placed`), for untyped emits.
pub const ORDER_SCHEMA: &str = include_str!("../schemas/events/bench.order.placed.schema.json");

/// Whether `--quick` was given (smaller sizes, for a smoke run).
pub fn quick() -> bool {
    std::env::args().skip(2).any(|a| a == "--quick")
}

/// The cluster's URLs, once [`cluster`] started one.
static CLUSTER_URLS: OnceLock<String> = OnceLock::new();

/// With `--cluster`: a private three-node JetStream cluster, which [`connect_nats`] and
/// [`BenchStream::new`] use from then on (streams get 3 replicas). Keep it for the run.
pub async fn cluster() -> Option<NatsCluster> {
    if !std::env::args().skip(2).any(|a| a == "--cluster") {
        return None;
    }
    let cluster = NatsCluster::spawn(3).await;
    CLUSTER_URLS
        .set(cluster.urls())
        .expect("one cluster per run");
    println!(
        "cluster: 3 nodes ({}), streams with 3 replicas",
        cluster.urls()
    );
    Some(cluster)
}

fn nats() -> String {
    CLUSTER_URLS.get().cloned().unwrap_or_else(nats_url)
}

/// Prints the command that reproduces this run, and the services it talks to.
pub fn print_command() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    println!(
        "command: cargo run -p outbox-bench --release -- {}",
        args.join(" ")
    );
    println!(
        "services: DATABASE_URL={} NATS_URL={}",
        database_url(),
        nats_url()
    );
}

/// A multi-threaded runtime with one worker per core.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A name unique to this run: `b` and 12 lowercase hex digits (a valid subject token).
pub fn unique_token() -> String {
    unique_name("b")
}

/// A database of its own for the run (`outbox_bench_<token>`), with the outbox migrations
/// applied and a pool of 8 connections; dropped when the value is dropped.
pub async fn database() -> TestDb {
    TestDb::builder()
        .name(format!("outbox_bench_{}", unique_token()))
        .create()
        .await
}

/// Empties `outbox_events`.
pub async fn truncate(db: &TestDb) {
    sqlx::query("truncate outbox_events")
        .execute(&db.pool)
        .await
        .expect("truncate outbox_events");
}

/// `vacuum analyze outbox_events` (the server may run with autovacuum off; the benchmarks
/// measure a table in the state autovacuum would keep it in).
pub async fn vacuum(db: &TestDb) {
    sqlx::query("vacuum analyze outbox_events")
        .execute(&db.pool)
        .await
        .expect("vacuum analyze outbox_events");
}

/// Connects to `NATS_URL`, failing with the command that starts it.
pub async fn connect_nats() -> async_nats::Client {
    outbox_testkit::connect_nats(&nats()).await
}

/// A stream of this run capturing `<prefix>.>`, with file storage and the default duplicate
/// window, as a service's stream has; [`BenchStream::delete`] removes it.
pub struct BenchStream {
    /// JetStream on the connection that created it.
    pub js: jetstream::Context,
    /// The subject prefix: every event type of the run starts with `<prefix>.`.
    pub prefix: String,
    /// The stream name.
    pub name: String,
}

impl BenchStream {
    /// Creates the stream.
    pub async fn new(client: &async_nats::Client) -> BenchStream {
        let prefix = unique_token();
        let js = jetstream::new(client.clone());
        let name = prefix.to_uppercase();
        let spec = StreamSpec {
            name: name.clone(),
            subjects: vec![format!("{prefix}.>")],
            storage: StorageType::File,
            replicas: if CLUSTER_URLS.get().is_some() { 3 } else { 1 },
            ..Default::default()
        };
        // a new cluster elects its first meta leader in the first seconds
        let mut tries = 0;
        while let Err(e) = spec.ensure(&js).await {
            tries += 1;
            assert!(tries < 100, "create the benchmark stream: {e}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        BenchStream { js, prefix, name }
    }

    /// The event types the backlog uses.
    pub fn event_types(&self) -> Vec<String> {
        ["placed", "paid", "shipped", "cancelled"]
            .iter()
            .map(|a| format!("{}.order.{a}", self.prefix))
            .collect()
    }

    /// Removes every message (between runs, so each run sees the same stream state).
    pub async fn purge(&self) {
        let stream = self.js.get_stream(&self.name).await.expect("the stream");
        stream.purge().await.expect("purge the stream");
    }

    /// Messages in the stream.
    pub async fn len(&self) -> u64 {
        let mut stream = self.js.get_stream(&self.name).await.expect("the stream");
        stream.info().await.expect("stream info").state.messages
    }

    /// Deletes the stream.
    pub async fn delete(&self) {
        let _ = self.js.delete_stream(&self.name).await;
    }
}

/// The payload every mode uses, as SQL over `i` (row number) and `s` (subject number): valid
/// against `bench.order.placed`, about 330 bytes of JSON.
pub const PAYLOAD_SQL: &str = "jsonb_build_object(
    'order_id', md5('order' || s)::uuid,
    'customer_id', md5('customer' || i)::uuid,
    'amount_cents', (i * 37) % 100000 + 2449,
    'currency', 'EUR',
    'lines', jsonb_build_array(
        jsonb_build_object('sku', 'SKU-' || (i % 1000), 'qty', 1 + i % 5, 'price_cents', 1999),
        jsonb_build_object('sku', 'SKU-' || (i % 777), 'qty', 1, 'price_cents', 450)),
    'placed_at', to_char(now() at time zone 'utc', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
    'note', 'leave it at the front desk and ring twice')";

/// Inserts `n` unpublished rows in one statement: `subjects` distinct subjects in round robin,
/// the four event types of `stream`, `created_at` increasing, ids ordered by time as UUIDv7
/// ids are (microseconds of `created_at`, then random hex). Returns the time it took.
pub async fn fill_backlog(pool: &PgPool, prefix: &str, n: i64, subjects: i64) -> Duration {
    fill(pool, prefix, n, subjects, None).await
}

/// Inserts `n` rows published `published_ago` ago (history), in one statement.
pub async fn fill_published(
    pool: &PgPool,
    prefix: &str,
    n: i64,
    subjects: i64,
    published_ago: Duration,
) -> Duration {
    fill(pool, prefix, n, subjects, Some(published_ago)).await
}

async fn fill(
    pool: &PgPool,
    prefix: &str,
    n: i64,
    subjects: i64,
    published_ago: Option<Duration>,
) -> Duration {
    let (created, published) = match published_ago {
        None => ("now() + i * interval '1 microsecond'", "null::timestamptz"),
        Some(_) => (
            "now() - $4 * interval '1 second' - interval '1 minute' + i * interval '1 microsecond'",
            "now() - $4 * interval '1 second'",
        ),
    };
    let sql = format!(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at, published_at)
         select (lpad(to_hex((extract(epoch from {created}) * 1000000)::bigint), 14, '0')
                 || substr(md5(i::text || random()::text), 1, 18))::uuid,
                $1 || '.order.' || (array['placed','paid','shipped','cancelled'])[1 + i % 4],
                'bench',
                md5('order' || s)::uuid::text,
                now(),
                {PAYLOAD_SQL},
                {created},
                {published}
           from generate_series(1, $2) as g(i), lateral (select i % $3 as s) as x"
    );
    let started = std::time::Instant::now();
    // the text is the bench's own; the values go in as bind parameters
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(prefix)
        .bind(n)
        .bind(subjects)
        .bind(published_ago.map_or(0.0, |d| d.as_secs_f64()))
        .execute(pool)
        .await
        .expect("fill outbox_events");
    started.elapsed()
}

/// Average size of `data` and of the whole row's text, in bytes.
pub async fn payload_bytes(pool: &PgPool) -> f64 {
    sqlx::query_scalar("select coalesce(avg(length(data::text)), 0)::float8 from outbox_events")
        .fetch_one(pool)
        .await
        .expect("payload size")
}

/// A payload like the backlog's, for emits from Rust.
pub fn payload(i: u64, subject: uuid::Uuid) -> serde_json::Value {
    serde_json::json!({
        "order_id": subject,
        "customer_id": uuid::Uuid::now_v7(),
        "amount_cents": (i * 37) % 100_000 + 2449,
        "currency": "EUR",
        "lines": [
            {"sku": format!("SKU-{}", i % 1000), "qty": 1 + i % 5, "price_cents": 1999},
            {"sku": format!("SKU-{}", i % 777), "qty": 1, "price_cents": 450}
        ],
        "placed_at": chrono::Utc::now(),
        "note": "leave it at the front desk and ring twice"
    })
}

/// The median of `values` (sorted in place).
pub fn median(values: &mut [f64]) -> f64 {
    assert!(!values.is_empty(), "no samples");
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// The `p`-th percentile (0..=100) of `sorted`, nearest rank.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    assert!(!sorted.is_empty(), "no samples");
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Milliseconds of `d`.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `--lanes=N`, or the relay's default lane count.
pub fn lanes() -> usize {
    option("lanes").map_or(outbox_runtime::RelayConfig::default().lanes, |l| l as usize)
}

/// The value of `--<name>=<n>`, if given.
pub fn option(name: &str) -> Option<u64> {
    let prefix = format!("--{name}=");
    std::env::args().skip(2).find_map(|a| {
        a.strip_prefix(&prefix).map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("--{name} takes a positive integer, got `{v}`"))
        })
    })
}

/// Busy and total CPU time of the whole machine so far (`/proc/stat`, in clock ticks), to tell
/// whether a run was bound by the CPU (every process counts: Postgres, nats-server, this one).
#[derive(Debug, Clone, Copy)]
pub struct CpuTicks {
    busy: u64,
    total: u64,
}

impl CpuTicks {
    /// Reads `/proc/stat` (zeros where it does not exist).
    pub fn now() -> CpuTicks {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let fields: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|f| f.parse().ok())
            .collect();
        let total: u64 = fields.iter().sum();
        let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
        CpuTicks {
            busy: total - idle,
            total,
        }
    }

    /// The share of the machine's CPU time that was busy since `self`, in percent.
    pub fn busy_since(self) -> f64 {
        let now = CpuTicks::now();
        let total = now.total.saturating_sub(self.total).max(1);
        100.0 * now.busy.saturating_sub(self.busy) as f64 / total as f64
    }
}

/// CPU time used so far by the processes a run involves, per kind: every `postgres` process,
/// every `nats-server` process, and this process (`/proc/<pid>/stat`, in clock ticks). Other
/// clients of the same servers count too, so on a shared machine this is an upper bound.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessTicks {
    postgres: u64,
    nats: u64,
    bench: u64,
}

impl ProcessTicks {
    /// Reads `/proc` (zeros where it does not exist).
    pub fn now() -> ProcessTicks {
        let mut t = ProcessTicks::default();
        let me = std::process::id().to_string();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return t;
        };
        for entry in dir.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !name.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                continue;
            };
            let comm = &stat[open + 1..close];
            let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
            // utime and stime are fields 14 and 15 of the line, 12 and 13 after the comm
            let ticks = |i: usize| {
                fields
                    .get(i)
                    .and_then(|f| f.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let used = ticks(11) + ticks(12);
            if *name == me {
                t.bench += used;
            } else if comm == "postgres" {
                t.postgres += used;
            } else if comm == "nats-server" {
                t.nats += used;
            }
        }
        t
    }

    /// CPU microseconds per event used since `self` by Postgres, nats-server and this process.
    pub fn per_event_since(self, events: u64) -> String {
        let now = ProcessTicks::now();
        // clock ticks are 1/100 s on Linux
        let us = |a: u64, b: u64| a.saturating_sub(b) as f64 * 10_000.0 / events.max(1) as f64;
        format!(
            "CPU per event: postgres {:.0} us, nats-server {:.0} us, bench process {:.0} us",
            us(now.postgres, self.postgres),
            us(now.nats, self.nats),
            us(now.bench, self.bench)
        )
    }
}
