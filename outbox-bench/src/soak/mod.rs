//! `soak`: a production day, compressed. A steady open-loop load below and at the database's
//! capacity, with everything a service runs beside it, reported each minute.
//!
//! 1. **Baseline.** Plain inserts of the outbox row, with no wake-up mechanism, by an
//!    open-loop generator (Poisson arrivals, 10,000 subjects) in four shapes: 8 and 32
//!    connections, one and ten events per transaction. For each shape it finds the capacity:
//!    the closed-loop rate first, then open-loop steps that bisect towards the highest rate the
//!    database sustains (at least 97% of the offered events committed within the step, median
//!    commit latency at most `--max-p50-ms`); then it measures the commit latency at 50%, 80%
//!    and 100% of that capacity.
//! 2. **Outbox.** The same offered loads, with `tx.emit`, while everything else runs: two
//!    `outbox relay` processes (the CLI, one holding the lease, one standing by), the
//!    service's consumer in two replicas deduping (`outbox_runtime::consumer`), the retention
//!    task at its defaults but for a keep short enough that it deletes during the run,
//!    `outbox status` and the relays' metrics endpoints polled every 15 s as Prometheus would,
//!    and a rolling restart of the relays halfway through. An ordered reader of the stream
//!    times each event from its commit to the stream.
//! 3. **Report.** Each step ends with its line (emit against the baseline at the same load);
//!    each minute with a block of lines: offered against achieved commits, emit commit latency
//!    against the baseline's, commit to stream and to consumer, the unpublished backlog,
//!    expired rows not yet deleted, the tables' sizes, each relay's memory, Postgres
//!    connections and file descriptors, CPU per event. At the end: every step's figures, the
//!    correctness check (`correctness: ... lost=0 duplicated=0 reordered=0
//!    backlog_at_end=0`), and last the summary line of ratios.
//!
//! Options: `--minutes=N` (default 5: the whole run; the outbox phase gets what the baseline
//! leaves), `--rate=N` (every step offers N events a second instead of fractions of a
//! searched capacity: `--rate=1000` for the latency figures, `--rate=10` for a quiet service),
//! `--connections=N` and `--per-tx=N` (one shape instead of four), `--subjects=N` (default
//! 10,000), `--keep-secs=N` (retention's keep of published rows, default 60; dedupe rows twice
//! that), `--retention-max-busy=N` (retention's `max_busy_percent`, default 100: give 10 for
//! the fixed pace of its floor), `--max-p50-ms=N` (the search's latency bound, default 50), `--drain-secs=N` (how
//! long the end waits for the relays and readers to catch up, default 60), `--cluster` (three
//! private nats-servers and an R3 stream instead of one), `--outbox-bin=PATH` (the relays'
//! binary; default the one next to this binary, built first when run through cargo).
//!
//! Postgres is `DATABASE_URL`'s server (a database of the run's own, dropped at the end); NATS
//! is private nats-servers the run starts and stops (`NATS_SERVER_BIN`). Exits 1 when an event
//! was lost, applied twice or out of order, or the backlog did not drain.

mod load;
mod probe;
mod processes;
mod readers;
mod report;
mod stats;
mod vacuum;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use outbox_runtime::retention::{Retention, RetentionConfig};
use outbox_runtime::{OutboxEvent, StreamSpec};
use outbox_testkit::{NatsCluster, NatsServer, TestDb};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};
use tokio::time::Instant;

use crate::common;
use load::{thousands, Load, OrderRevised, Shape, StepResult, Subjects, Tally, Writer};
use probe::{CpuMeter, Kind};
use processes::{Polls, RelayProcess};
use readers::{InFlight, Replicas, StreamCheck};
use report::{p99, ratio, step_label, Progress, Reporting};

/// The stream of the run (on its private nats-servers).
const STREAM: &str = "SOAK";
/// Loads of the outbox phase, as fractions of the baseline's capacity.
const FRACTIONS: [f64; 3] = [0.5, 0.8, 1.0];

/// The command line.
#[derive(Debug, Clone)]
struct Options {
    minutes: u64,
    rate: Option<f64>,
    shapes: Vec<Shape>,
    subjects: usize,
    keep: Duration,
    retention_max_busy: u8,
    max_p50_ms: f64,
    drain: Duration,
    cluster: bool,
    outbox_bin: Option<PathBuf>,
}

/// The value of `--<name>=<text>`, if given.
fn text_option(name: &str) -> Option<String> {
    let prefix = format!("--{name}=");
    std::env::args()
        .skip(2)
        .find_map(|a| a.strip_prefix(&prefix).map(str::to_owned))
}

impl Options {
    fn from_args() -> Options {
        let connections: Vec<usize> = match common::option("connections") {
            Some(n) => vec![n.max(1) as usize],
            None => vec![8, 32],
        };
        let per_tx: Vec<usize> = match common::option("per-tx") {
            Some(n) => vec![n.max(1) as usize],
            None => vec![1, 10],
        };
        let shapes = connections
            .iter()
            .flat_map(|&c| {
                per_tx.iter().map(move |&p| Shape {
                    connections: c,
                    per_tx: p,
                })
            })
            .collect();
        let subjects = common::option("subjects").map_or(10_000, |s| s as usize);
        let most = connections.iter().copied().max().unwrap_or(1);
        assert!(
            subjects >= most,
            "--subjects={subjects}: at least one subject per connection ({most})"
        );
        Options {
            minutes: common::option("minutes").unwrap_or(5).max(1),
            rate: common::option("rate").map(|r| r.max(1) as f64),
            shapes,
            subjects,
            keep: Duration::from_secs(common::option("keep-secs").unwrap_or(60).max(2)),
            retention_max_busy: common::option("retention-max-busy")
                .map_or(RetentionConfig::default().max_busy_percent, |p| {
                    p.clamp(1, 100) as u8
                }),
            max_p50_ms: common::option("max-p50-ms").unwrap_or(50) as f64,
            drain: Duration::from_secs(common::option("drain-secs").unwrap_or(60)),
            cluster: std::env::args().skip(2).any(|a| a == "--cluster"),
            outbox_bin: text_option("outbox-bin").map(PathBuf::from),
        }
    }
}

/// Runs the soak and prints its figures.
pub fn run() {
    common::print_command();
    let options = Options::from_args();
    let passed = common::runtime().block_on(soak(options));
    if !passed {
        std::process::exit(1);
    }
}

/// A pool of `n` connections on the run's database named `application_name`.
async fn pool(db: &TestDb, n: u32, application_name: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(n)
        .connect_with(db.options.clone().application_name(application_name))
        .await
        .expect("connect to the run's database")
}

/// The private nats-servers of the run.
enum Nats {
    One(NatsServer),
    Cluster(NatsCluster),
}

impl Nats {
    async fn start(cluster: bool) -> Nats {
        if cluster {
            Nats::Cluster(NatsCluster::spawn(3).await)
        } else {
            Nats::One(NatsServer::spawn().await)
        }
    }

    fn urls(&self) -> String {
        match self {
            Nats::One(s) => s.url(),
            Nats::Cluster(c) => c.urls(),
        }
    }

    fn pids(&self) -> Vec<u32> {
        match self {
            Nats::One(s) => s.pid().into_iter().collect(),
            Nats::Cluster(c) => c.nodes.iter().filter_map(|n| n.server.pid()).collect(),
        }
    }

    async fn connect(&self) -> async_nats::Client {
        match self {
            Nats::One(s) => outbox_testkit::connect_nats(&s.url()).await,
            Nats::Cluster(c) => c.connect().await,
        }
    }

    fn replicas(&self) -> usize {
        match self {
            Nats::One(_) => 1,
            Nats::Cluster(_) => 3,
        }
    }
}

/// One shape's baseline: its capacity (when searched) and a step at each load.
#[derive(Debug, Clone)]
struct Baseline {
    shape: Shape,
    capacity: Option<f64>,
    /// `(fraction of the capacity, or 1 with --rate; offered rate; result)`.
    steps: Vec<(f64, f64, StepResult)>,
}

/// One step of the outbox phase and what it measured.
#[derive(Debug, Clone)]
struct OutboxStep {
    shape: Shape,
    fraction: f64,
    rate: f64,
    /// The baseline step at the same shape and load.
    baseline: StepResult,
    result: Option<StepResult>,
    backlog_at_end: i64,
    label: String,
}

async fn soak(options: Options) -> bool {
    let started = Instant::now();
    let db = common::database().await;
    let probe_pool = pool(&db, 2, "soak-probe").await;
    let mut probe_conn =
        PgConnection::connect_with(&db.options.clone().application_name("soak-probe"))
            .await
            .expect("connect");
    let backend: i32 = sqlx::query_scalar("select pg_backend_pid()")
        .fetch_one(&mut probe_conn)
        .await
        .expect("pg_backend_pid");
    let autovacuum = vacuum::Settings::read(&mut probe_conn).await;
    probe_conn.close().await.ok();
    let cpu = Arc::new(Mutex::new(CpuMeter::new(backend as u32, &db.name)));
    let nats = Nats::start(options.cluster).await;
    // CPU time is read every second from here to the end, so that a process that exits (a
    // shape's connections, a restarted relay) loses at most a second of it
    let relay_pids = Arc::new(Mutex::new(Vec::new()));
    let stop_cpu = Arc::new(AtomicBool::new(false));
    let cpu_task = {
        let (cpu, relay_pids, nats_pids) = (cpu.clone(), relay_pids.clone(), nats.pids());
        let stop = stop_cpu.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                {
                    let mut cpu = cpu.lock().expect("cpu");
                    let relays = relay_pids.lock().expect("relay pids").clone();
                    cpu.watch(relays, nats_pids.clone());
                    cpu.read();
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    let js = jetstream::new(nats.connect().await);
    // a service's stream: file storage, the default duplicate window, every message kept (a
    // consumer that falls behind must still find them; the store goes with the run)
    let spec = StreamSpec {
        name: STREAM.into(),
        subjects: vec![OrderRevised::EVENT_TYPE.into()],
        replicas: nats.replicas(),
        ..Default::default()
    };
    // a new cluster elects its first meta leader in the first seconds
    let mut tries = 0;
    while let Err(e) = spec.ensure(&js).await {
        tries += 1;
        assert!(tries < 100, "create the soak's stream: {e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let shapes: Vec<String> = options.shapes.iter().map(|s| s.label()).collect();
    println!(
        "soak: {} min, shapes [{}], {} subjects, {}; keep {} s; nats-server {} ({}); Postgres CPU {}",
        options.minutes,
        shapes.join("; "),
        thousands(options.subjects as f64),
        match options.rate {
            Some(r) => format!("every step at {}/s", thousands(r)),
            None => "loads 50%, 80% and 100% of each shape's insert capacity".into(),
        },
        options.keep.as_secs(),
        outbox_testkit::nats_server_binary().display(),
        if options.cluster { "3 nodes, R3 stream" } else { "1 node" },
        if cpu.lock().expect("cpu").sees_postgres() {
            "read from /proc"
        } else {
            "not visible (the server is not on this machine)"
        }
    );

    let subjects = Arc::new(Subjects::new(options.subjects));
    let minute = Arc::new(Tally::default());
    let load = Load {
        subjects: subjects.clone(),
        minute: minute.clone(),
        in_flight: None,
    };
    println!("\n== baseline: plain inserts, no wake-up, nothing else running");
    let baseline_cpu = postgres_cpu(&cpu);
    let mut baselines = Vec::new();
    for &shape in &options.shapes {
        baselines.push(baseline(&db, shape, &options, &load).await);
    }
    let baseline_cpu = postgres_cpu(&cpu).saturating_sub(baseline_cpu);
    let baseline_us = baseline_cpu.as_secs_f64() * 1e6 / minute.take().committed.max(1) as f64;

    // the outbox phase gets what the baseline left of the run, at least 5 s a step
    let plan: Vec<OutboxStep> = baselines
        .iter()
        .flat_map(|b| {
            b.steps.iter().map(|(fraction, rate, result)| OutboxStep {
                shape: b.shape,
                fraction: *fraction,
                rate: *rate,
                baseline: result.clone(),
                result: None,
                backlog_at_end: 0,
                label: step_label(b.shape, *fraction, *rate, options.rate.is_some()),
            })
        })
        .collect();
    // (less 30 s for starting the relays and readers and for the end's drain)
    let left = (options.minutes as f64 * 60.0 - started.elapsed().as_secs_f64() - 30.0).max(0.0);
    let step_secs = (left / plan.len() as f64).max(5.0);

    println!(
        "\n== outbox: the same loads with tx.emit, {step_secs:.0} s a step, with two relays, two consumer replicas, retention (keep {} s), status polls, a rolling restart halfway",
        options.keep.as_secs()
    );
    common::truncate(&db).await;
    common::vacuum(&db).await;
    subjects.reset();
    sqlx::query(readers::APPLIED_TABLE)
        .execute(&db.pool)
        .await
        .expect("create soak_applied");
    if autovacuum.server_runs_it() {
        println!("autovacuum: the server's own");
    } else {
        println!(
            "autovacuum: off on this server, so the run vacuums as it would ({})",
            autovacuum.describe()
        );
    }

    // the readers
    let in_flight = Arc::new(InFlight::default());
    let stop_reader = Arc::new(AtomicBool::new(false));
    let stream_check = Arc::new(Mutex::new(StreamCheck::default()));
    let reader = tokio::spawn(readers::read_stream(
        jetstream::new(nats.connect().await),
        STREAM.into(),
        in_flight.clone(),
        stop_reader.clone(),
        stream_check.clone(),
    ));
    let replicas = Replicas::start(
        2,
        STREAM,
        in_flight.clone(),
        || pool(&db, 2, "soak-consumer"),
        || nats.connect(),
    )
    .await;

    // the relays
    let bin = processes::outbox_binary(options.outbox_bin.clone());
    let logs = std::env::temp_dir().join(format!("outbox-soak-{}", common::unique_token()));
    std::fs::create_dir_all(&logs).expect("a directory for the relays' logs");
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .ok()
        .map(chrono::DateTime::<chrono::Utc>::from)
        .map_or_else(
            || "?".into(),
            |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        );
    println!(
        "relays: {} relay (built {built}), logs in {}",
        bin.display(),
        logs.display()
    );
    let mut relays = Vec::new();
    for name in ["soak-relay-1", "soak-relay-2"] {
        let mut relay = RelayProcess::start(
            &bin,
            name,
            &db.url(),
            &nats.urls(),
            OrderRevised::EVENT_TYPE,
            &logs,
        );
        relay.wait_running(Duration::from_secs(60)).await;
        relay_pids.lock().expect("relay pids").extend(relay.pid());
        relays.push(Arc::new(tokio::sync::Mutex::new(relay)));
    }

    // retention, at its defaults but for the keep (and the sizing rule's windows under it)
    let stop_all = Arc::new(AtomicBool::new(false));
    let retention = {
        let config = RetentionConfig {
            keep_published: options.keep,
            keep_dedupe: Some(options.keep * 2),
            redelivery_window: options.keep / 2,
            max_outage: options.keep / 2,
            ..Default::default()
        };
        let config = RetentionConfig {
            max_busy_percent: options.retention_max_busy.max(config.busy_percent),
            ..config
        };
        let task = Retention::new(pool(&db, 2, "soak-retention").await, config)
            .expect("the retention configuration");
        let stop = stop_all.clone();
        tokio::spawn(async move {
            task.run(async move {
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await;
        })
    };
    let vacuums = Arc::new(AtomicU64::new(0));
    let vacuuming = (!autovacuum.server_runs_it()).then(|| {
        let options = db.options.clone().application_name("soak-vacuum");
        let (stop, vacuums) = (stop_all.clone(), vacuums.clone());
        tokio::spawn(async move {
            let conn = PgConnection::connect_with(&options).await.expect("connect");
            vacuum::run(conn, autovacuum, stop, vacuums).await;
        })
    });
    let polls = Arc::new(Mutex::new(Polls::default()));
    let poller = tokio::spawn(processes::poll(
        bin.clone(),
        processes::with_application_name(&db.url(), "soak-status"),
        relays.clone(),
        polls.clone(),
        stop_all.clone(),
    ));

    // the steps, and the minute reporter beside them
    let plan = Arc::new(Mutex::new(plan));
    let progress = Arc::new(Mutex::new(Progress::default()));
    let phase_started = Instant::now();
    let phase_cpu = postgres_cpu(&cpu);
    let phase_secs = step_secs * plan.lock().expect("plan").len() as f64;
    let mut minutes_done = Vec::new();
    let reporter = {
        let reporting = Reporting {
            probe: probe_pool.clone(),
            keep: options.keep,
            minute: minute.clone(),
            in_flight: in_flight.clone(),
            handled: replicas.handled.clone(),
            stream_check: stream_check.clone(),
            relays: relays.clone(),
            cpu: cpu.clone(),
            polls: polls.clone(),
            vacuums: vacuums.clone(),
            progress: progress.clone(),
            plan: plan.clone(),
            started: phase_started,
        };
        let stop = stop_all.clone();
        tokio::spawn(async move { reporting.run(stop).await })
    };
    let restarts = {
        let (relays, progress) = (relays.clone(), progress.clone());
        let pids = relay_pids.clone();
        let at = phase_started + Duration::from_secs_f64(phase_secs * 0.45);
        tokio::spawn(async move {
            processes::rolling_restart(relays, phase_started, at, progress, pids).await
        })
    };
    let emit_load = Load {
        in_flight: Some(in_flight.clone()),
        ..load.clone()
    };
    let steps = plan.lock().expect("plan").len();
    let mut conns: Vec<PgConnection> = Vec::new();
    let mut shape_now = None;
    for i in 0..steps {
        let (shape, rate, label) = {
            let plan = plan.lock().expect("plan");
            (plan[i].shape, plan[i].rate, plan[i].label.clone())
        };
        settle(&probe_pool, rate).await;
        if shape_now != Some(shape) {
            for c in conns.drain(..) {
                c.close().await.ok();
            }
            conns = load::connect(&db.options, shape, "soak-emit").await;
            shape_now = Some(shape);
        }
        in_flight.step.store(i, Ordering::Relaxed);
        {
            let mut p = progress.lock().expect("progress");
            p.current = Some(i);
            p.touched.push(i);
        }
        let result = load::step(&mut conns, shape, Writer::Emit, rate, step_secs, &emit_load).await;
        let backlog = probe::backlog(&probe_pool).await;
        let mut plan = plan.lock().expect("plan");
        let step = &mut plan[i];
        println!(
            "outbox {label}: {}; baseline commit {}: p99 ratio {}; backlog {backlog}",
            result.line(),
            step.baseline.latency.summary(),
            ratio(p99(&result.latency), p99(&step.baseline.latency)),
        );
        step.result = Some(result);
        step.backlog_at_end = backlog;
    }
    progress.lock().expect("progress").current = None;
    for c in conns.drain(..) {
        c.close().await.ok();
    }
    restarts.await.expect("the rolling restart");

    // the end: the relays drain, the readers catch up
    let emitted = subjects.total();
    let drained = drain(
        &probe_pool,
        emitted,
        &replicas.handled,
        &stream_check,
        options.drain,
    )
    .await;
    stop_all.store(true, Ordering::Relaxed);
    minutes_done.extend(reporter.await.expect("the reporter"));
    poller.await.expect("the poller");
    retention.await.expect("the retention task");
    if let Some(v) = vacuuming {
        v.await.expect("the vacuum task");
    }
    for relay in &relays {
        let mut relay = relay.lock().await;
        let (took, clean) = relay.stop().await;
        if !clean {
            println!("{} did not stop within 30 s of SIGTERM: killed", relay.name);
        } else if took > Duration::from_secs(5) {
            println!("{} took {:.1} s to stop", relay.name, took.as_secs_f64());
        }
    }
    replicas.stop().await;
    // the replicas acked the message each had in hand: give the server a moment to count it
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pending = readers::pending(&js, STREAM).await;
    stop_reader.store(true, Ordering::Relaxed);
    reader.await.expect("the stream reader");
    let phase_cpu = postgres_cpu(&cpu).saturating_sub(phase_cpu);
    stop_cpu.store(true, Ordering::Relaxed);
    cpu_task.await.expect("the CPU readings");

    // what the readers found
    let written: Vec<(uuid::Uuid, u64)> = subjects.written().collect();
    let applied = readers::check_applied(&probe_pool, &written, pending).await;
    let backlog_at_end = probe::backlog(&probe_pool).await;
    let stream = stream_check.lock().expect("stream check").clone();
    let plan = plan.lock().expect("plan").clone();
    report::steps(&baselines, &plan, &in_flight, options.rate.is_some());
    let passed = report::correctness(&written, applied, pending, &stream, backlog_at_end, drained);
    if !passed {
        println!("the relays' logs stay in {}", logs.display());
    } else {
        let _ = std::fs::remove_dir_all(&logs);
    }
    report::summary(
        &baselines,
        &plan,
        &minutes_done,
        &in_flight,
        options.keep,
        (baseline_us, phase_cpu),
        emitted,
        options.rate.is_some(),
    );
    drop(relays);
    drop(nats);
    drop(db);
    passed
}

/// Postgres's CPU time so far: this database's backends and the server's own processes, read
/// afresh.
fn postgres_cpu(cpu: &Mutex<CpuMeter>) -> Duration {
    let mut cpu = cpu.lock().expect("cpu");
    cpu.read();
    cpu.total(Kind::Backends) + cpu.total(Kind::PgBackground)
}

/// One shape's baseline: the capacity search (unless `--rate`), then a step at each load.
async fn baseline(db: &TestDb, shape: Shape, options: &Options, load: &Load) -> Baseline {
    common::truncate(db).await;
    common::vacuum(db).await;
    let mut conns = load::connect(&db.options, shape, "soak-insert").await;
    let label = shape.label();
    let (capacity, loads): (Option<f64>, Vec<(f64, f64)>) = match options.rate {
        Some(rate) => (None, vec![(1.0, rate)]),
        None => {
            let closed = load::closed_loop(&mut conns, shape, Writer::Insert, 2.0, load).await;
            println!("baseline {label}: closed loop {}/s", thousands(closed));
            let capacity = search(&mut conns, shape, closed, options.max_p50_ms, load).await;
            println!("baseline {label}: capacity {}/s", thousands(capacity));
            let loads = FRACTIONS.iter().map(|f| (*f, f * capacity)).collect();
            (Some(capacity), loads)
        }
    };
    let mut steps = Vec::new();
    for (fraction, rate) in loads {
        let result = load::step(&mut conns, shape, Writer::Insert, rate, 4.0, load).await;
        println!(
            "baseline {}: {}",
            step_label(shape, fraction, rate, options.rate.is_some()),
            result.line()
        );
        steps.push((fraction, rate, result));
    }
    for c in conns {
        c.close().await.ok();
    }
    Baseline {
        shape,
        capacity,
        steps,
    }
}

/// The highest open-loop rate the inserts sustain, bisecting in four 3-second steps from 90%
/// of the closed-loop rate (up by 15% while every step keeps up).
async fn search(
    conns: &mut Vec<PgConnection>,
    shape: Shape,
    closed: f64,
    max_p50_ms: f64,
    load: &Load,
) -> f64 {
    let (mut low, mut high): (Option<f64>, Option<f64>) = (None, None);
    let mut rate = 0.9 * closed;
    let mut best_achieved: f64 = 0.0;
    for n in 1..=4 {
        let result = load::step(conns, shape, Writer::Insert, rate, 3.0, load).await;
        let kept_up = result.sustained(max_p50_ms);
        best_achieved = best_achieved.max(result.achieved);
        println!(
            "baseline {}: search {n} at {}/s: {}: {}",
            shape.label(),
            thousands(rate),
            result.line(),
            if kept_up {
                "sustained"
            } else {
                "not sustained"
            }
        );
        if kept_up {
            low = Some(rate);
        } else {
            high = Some(rate);
        }
        rate = match (low, high) {
            (Some(l), Some(h)) => (l + h) / 2.0,
            (Some(l), None) => l * 1.15,
            (None, Some(h)) => h * 0.7,
            (None, None) => unreachable!("each step sets one"),
        };
    }
    low.unwrap_or_else(|| {
        println!(
            "baseline {}: no step was sustained; the capacity is the best achieved rate",
            shape.label()
        );
        best_achieved
    })
}

/// Before a step: until the relays' backlog is below a twentieth of a second of the step's
/// rate (at least 100 rows), at most 15 s, so that each step starts with the relays caught up.
async fn settle(probe: &PgPool, rate: f64) {
    let started = Instant::now();
    let bound = (rate / 20.0).max(100.0) as i64;
    loop {
        let backlog = probe::backlog(probe).await;
        if backlog <= bound {
            return;
        }
        if started.elapsed() > Duration::from_secs(15) {
            println!("  (the relays did not catch up within 15 s: the step starts with a backlog of {backlog})");
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// After the last step: until nothing is unpublished and both readers have every emitted
/// event, at most `within`. Whether the relays got there (nothing unpublished, the stream
/// reader has every event); the consumer may stay behind (one transaction per message, it can
/// be slower than the load), and what it has not handled is counted from its durable.
async fn drain(
    probe: &PgPool,
    emitted: u64,
    handled: &AtomicU64,
    stream: &Mutex<StreamCheck>,
    within: Duration,
) -> bool {
    let started = Instant::now();
    let mut relays_done = None;
    loop {
        let backlog = probe::backlog(probe).await;
        let read = stream.lock().expect("stream check").messages;
        let handled = handled.load(Ordering::Relaxed);
        if backlog == 0 && read >= emitted && relays_done.is_none() {
            relays_done = Some(started.elapsed());
            println!(
                "end: nothing unpublished, and the stream reader had all {emitted} events, {:.1} s after the last step",
                started.elapsed().as_secs_f64()
            );
        }
        if relays_done.is_some() && handled >= emitted {
            println!(
                "end: the consumer had handled them all {:.1} s after the last step",
                started.elapsed().as_secs_f64()
            );
            return true;
        }
        if started.elapsed() > within {
            if relays_done.is_none() {
                println!(
                    "end: not drained within {} s: {backlog} unpublished, the stream reader had {read} of {emitted} events",
                    within.as_secs()
                );
            }
            println!(
                "end: the consumer had handled {handled} of {emitted} events after {} s; it stops there",
                within.as_secs()
            );
            return relays_done.is_some();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
