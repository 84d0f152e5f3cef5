//! A seeded fault-and-workload harness for the outbox relay (docs/harness.md).
//!
//! Each run draws a [`schedule`] from a seed: writers (typed emits and plain inserts, with
//! every kind of `created_at`, long, prepared and rolled-back transactions), poison rows and
//! their repairs, relays joining, leaving, killed, frozen and cut off, broker kills, freezes
//! and step-downs, Postgres restarts and connection kills. It runs the schedule in real time
//! against a Postgres and nats-servers of its own ([`servers`]), with every relay behind
//! proxies that can silence or cut its paths ([`proxy`]), records what happened
//! ([`history`]), and when every fault has healed, judges the relay's promises one property
//! at a time ([`checker`]). Most runs also delete published rows as they go ([`retention`]);
//! half of them consume one event type with replicas that are killed and come back, and
//! whose handler fails some events on purpose ([`consumers`]). The same seed draws the same
//! schedule.
//!
//! The relay is driven through its public surfaces only: `Relay::connect` and `Relay::run`,
//! the `outbox relay` and `outbox unblock` commands, the contract's tables and the streams.

pub mod checker;
pub mod consumers;
pub mod history;
pub mod ops;
pub mod proxy;
pub mod relays;
pub mod report;
pub mod retention;
pub mod rng;
pub mod schedule;
pub mod servers;
pub mod workload;

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use tokio::time::Instant;

use crate::checker::{Bounds, Checker, Final};
use crate::consumers::ConsumerFleet;
use crate::history::{History, Recorded};
use crate::relays::Fleet;
use crate::report::SeedResult;
use crate::retention::RetentionTask;
use crate::schedule::{Focus, RelayKind, RelayMode, Settings, Topology};
use crate::servers::Servers;
use crate::workload::Workload;

/// Everything that shapes a run besides its seed.
#[derive(Debug, Clone)]
pub struct Options {
    /// What shapes the schedule.
    pub settings: Settings,
    /// B, the steady bound of [`Bounds::steady`].
    pub bound: Duration,
    /// [`Bounds::strict_attempts`].
    pub strict_attempts: bool,
    /// Keep every run's logs (a failing run's are always kept).
    pub keep_logs: bool,
    /// Print each schedule before running it.
    pub print_schedule: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            settings: Settings::default(),
            bound: Duration::from_secs(10),
            strict_attempts: false,
            keep_logs: false,
            print_schedule: false,
        }
    }
}

impl Options {
    /// The command that replays `seed` with these options (and `topology`, which the seed
    /// may have drawn).
    pub fn replay(&self, seed: u64, topology: Topology) -> String {
        format!(
            "cargo run -p outbox-harness -- {}",
            self.args(seed, topology).join(" ")
        )
    }

    /// The `outbox-harness` arguments that run `seed` with these options (and `topology`).
    pub fn args(&self, seed: u64, topology: Topology) -> Vec<String> {
        let s = &self.settings;
        let mut args = vec![
            "--seed".to_owned(),
            seed.to_string(),
            "--topology".to_owned(),
            name(topology),
            "--relay".to_owned(),
            name(s.relays),
            "--duration".to_owned(),
            s.duration.as_secs().to_string(),
        ];
        if let Some(focus) = s.focus {
            args.extend(["--focus".to_owned(), name(focus)]);
        }
        if let Some(rows) = s.held_rows {
            args.extend(["--held-rows".to_owned(), rows.to_string()]);
        }
        if self.bound != Options::default().bound {
            args.extend(["--bound".to_owned(), self.bound.as_secs_f64().to_string()]);
        }
        if self.strict_attempts {
            args.push("--strict-attempts".to_owned());
        }
        args
    }
}

/// A lowercase name of an option's value (`Single` is `single`).
fn name(value: impl std::fmt::Debug) -> String {
    format!("{value:?}").to_lowercase()
}

/// Where the relay tasks' logs go: the current run's file.
static RELAY_LOG: Mutex<Option<std::fs::File>> = Mutex::new(None);

/// A writer into [`RELAY_LOG`].
struct RunLog;

impl Write for RunLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match RELAY_LOG.lock().expect("the log").as_mut() {
            Some(file) => file.write(buf),
            None => Ok(buf.len()),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Sends the relay tasks' logs (info and up, or what `OUTBOX_HARNESS_LOG` says, in
/// `RUST_LOG`'s syntax) to each run's `relays.log`; call once per process (a second call does
/// nothing).
pub fn capture_relay_logs() {
    let filter = std::env::var("OUTBOX_HARNESS_LOG")
        .unwrap_or_else(|_| "outbox_runtime=info,sqlx=warn".to_owned());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_ansi(false)
        .with_writer(|| RunLog)
        .try_init();
}

/// Runs `seed`: its servers, its schedule, the heal and the check. A panic of the harness
/// itself comes back as a result that could not be judged.
pub async fn run_seed(seed: u64, options: &Options) -> SeedResult {
    let schedule = schedule::generate(seed, &options.settings);
    let shape = format!(
        "{}/{} lanes {}",
        name(schedule.topology),
        name(options.settings.relays),
        schedule.lanes
    );
    let replay = options.replay(seed, schedule.topology);
    let digest = schedule.digest();
    if options.print_schedule {
        print_schedule(&schedule);
    }
    let started = std::time::Instant::now();
    let dir = tempfile::Builder::new()
        .prefix(&format!("outbox-harness-{seed}-"))
        .tempdir()
        .expect("a directory for the run's logs");
    let outcome = judge(schedule, options, dir.path().to_path_buf()).await;
    *RELAY_LOG.lock().expect("the log") = None;
    let (stats, violations, mut details, error) = match outcome {
        Ok((stats, violations, details)) => (stats, violations, details, None),
        Err(e) => (String::new(), Vec::new(), String::new(), Some(e)),
    };
    let passed = error.is_none() && violations.is_empty();
    if !passed || options.keep_logs {
        details.push_str(&format!("  logs: {}\n", dir.keep().display()));
    }
    SeedResult {
        seed,
        shape,
        digest,
        elapsed: started.elapsed().as_secs_f64(),
        stats,
        violations,
        error,
        replay,
        details,
    }
}

/// Runs `schedule` in a task of its own, after making sure the `outbox` binary is there (a
/// build during the run would stall it); a panic of the harness comes back as why the run
/// could not be judged.
async fn judge(
    schedule: schedule::Schedule,
    options: &Options,
    logs: PathBuf,
) -> Result<(String, Vec<checker::Violation>, String), String> {
    tokio::task::spawn_blocking(relays::outbox_binary)
        .await
        .expect("look for the outbox binary")?;
    let options = options.clone();
    let task = tokio::spawn(async move { execute(schedule, &options, logs).await });
    task.await
        .map_err(|e| format!("the harness failed: {}", panic_message(e)))
}

/// What a task that did not finish left: its panic's message, or why it was cancelled.
pub(crate) fn panic_message(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(panic) => panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "a panic".to_owned()),
        Err(e) => e.to_string(),
    }
}

/// The run itself: (stats, violations, details).
async fn execute(
    schedule: schedule::Schedule,
    options: &Options,
    logs: PathBuf,
) -> (String, Vec<checker::Violation>, String) {
    let bounds = Bounds::new(
        options.bound,
        options.strict_attempts,
        schedule
            .ops
            .iter()
            .map(|op| match op.action {
                schedule::Action::HeldMany { rows } => rows,
                _ => 0,
            })
            .sum(),
    );
    if let Ok(file) = std::fs::File::create(logs.join("relays.log")) {
        *RELAY_LOG.lock().expect("the log") = Some(file);
    }
    let servers = Arc::new(Servers::start(schedule.topology).await);
    let history = Arc::new(History::new());
    let start = Instant::now();
    let fleet = Arc::new(Fleet::new(&servers, history.clone(), schedule.lanes, logs.clone()).await);
    let mut consumers = match &schedule.consumers {
        Some(plan) => {
            Some(ConsumerFleet::start(&servers, history.clone(), plan.clone(), start).await)
        }
        None => None,
    };
    let retention = match &schedule.retention {
        Some(plan) => Some(
            RetentionTask::start(
                &servers,
                history.clone(),
                plan.clone(),
                consumers.is_some(),
                start,
            )
            .await,
        ),
        None => None,
    };
    let workload = Arc::new(Workload::new(servers.clone(), history.clone(), start));
    let run = Arc::new(ops::Run::new(
        servers.clone(),
        fleet.clone(),
        workload,
        history.clone(),
        start,
        bounds.stop,
    ));
    let (stop_monitor, stopped) = tokio::sync::watch::channel(false);
    // in a set, so that a panic of the harness aborts it with the run
    let mut monitor = tokio::task::JoinSet::new();
    monitor.spawn(run.clone().monitor(stopped));
    history.note(format!("schedule {} starts", schedule.digest()));

    run.execute(&schedule).await;

    // heal: every relay and path thawed, every node running, a relay to publish
    fleet.thaw_all().await;
    {
        let mut broker = servers.broker.lock().await;
        for n in 0..servers.node_ports.len() {
            if broker.node(n).pid().is_none() {
                broker.node(n).start().await;
            }
        }
    }
    if let Some(consumers) = &mut consumers {
        consumers.heal().await;
    }
    history.heal_all();
    if !fleet.any_relay().await {
        let kind = match options.settings.relays {
            RelayMode::Process => RelayKind::Process,
            _ => RelayKind::Task,
        };
        history.note("the schedule left no relay: one joins to finish the run");
        fleet.join(0, kind).await;
    }
    let healed = Utc::now();
    history.note("every fault healed");
    settle(&servers, &history, &bounds).await;
    if let Some(consumers) = &consumers {
        consumers.settle(&servers, &history).await;
    }

    fleet.stop_all(bounds.stop).await;
    if let Some(retention) = retention {
        retention.stop(&history).await;
    }
    if let Some(consumers) = consumers {
        consumers.stop().await;
    }
    let _ = stop_monitor.send(true);
    while monitor.join_next().await.is_some() {}
    history.note("every relay stopped; reading the final state");
    let fin = Final::read(&servers).await;
    let rec = history.snapshot();
    let violations = Checker::new(&rec, &fin, &bounds, history.start, healed).check();
    let stats = stats(&rec, &fin, healed);
    let details = if violations.is_empty() {
        String::new()
    } else {
        report::details(
            schedule.seed,
            &violations,
            &rec,
            &fin,
            history.start,
            &options.replay(schedule.seed, schedule.topology),
        )
    };
    if let Ok(mut file) = std::fs::File::create(logs.join("violations.log")) {
        for v in &violations {
            let _ = writeln!(file, "[{}] {}", v.property, v.what);
        }
    }
    if let Ok(mut file) = std::fs::File::create(logs.join("history.log")) {
        for (at, line) in &rec.log {
            let _ = writeln!(file, "{:+8.2} {line}", history::since(history.start, *at));
        }
    }
    (stats, violations, details)
}

/// Waits until everything publishable is published and every poison row not repaired is
/// held, or until the longest bound after the heal has passed (a relay that never gets there
/// is for the checker to judge).
async fn settle(servers: &Servers, history: &History, bounds: &Bounds) {
    let rec = history.snapshot();
    // the longest allowance any row still has after the heal; a row written by hand in the
    // past may also wait for a lane's look below its floor
    let mut limit =
        bounds.recovery + bounds.steady + bounds.poll + bounds.backoff_max + Duration::from_secs(5);
    if rec.events.iter().any(|e| {
        matches!(e.insert, schedule::Insert::Raw(c) if c.by_hand_in_past())
            && e.began + chrono::Duration::from_std(limit + bounds.sweep).expect("short")
                > Utc::now()
    }) {
        limit += bounds.sweep;
    }
    let end = Instant::now() + limit;
    // the poison rows not repaired: those the spec holds must be held; a year-50000 or BC row
    // published or held
    let unrepaired = || rec.poisons.iter().filter(|p| p.repaired.is_none());
    let parked: Vec<String> = unrepaired().map(|p| p.subject.clone()).collect();
    let held: Vec<String> = unrepaired()
        .filter(|p| p.kind.held_by_spec())
        .map(|p| p.subject.clone())
        .collect();
    let either: Vec<String> = unrepaired()
        .filter(|p| !p.kind.held_by_spec())
        .map(|p| p.subject.clone())
        .collect();
    while Instant::now() < end {
        let waiting: Result<(i64, i64, i64), _> = sqlx::query_as(
            "select (select count(*) from outbox_events where published_at is null and subject <> all($1)), \
                    (select count(*) from outbox_retries where retry_at is null and subject = any($2)), \
                    (select count(*) from outbox_events e where e.subject = any($3) and e.published_at is null \
                        and not exists (select 1 from outbox_retries r where r.event_id = e.id and r.retry_at is null))",
        )
        .bind(&parked)
        .bind(&held)
        .bind(&either)
        .fetch_one(&servers.admin)
        .await;
        if let Ok((0, n, 0)) = waiting {
            if n == held.len() as i64 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The counts of a verdict line.
fn stats(rec: &Recorded, fin: &Final, healed: chrono::DateTime<Utc>) -> String {
    let written = rec.events.iter().filter(|e| e.id.is_some()).count();
    let committed = rec
        .events
        .iter()
        .filter(|e| e.id.is_some_and(|id| fin.rows.contains_key(&id)))
        .count();
    let published = fin
        .rows
        .values()
        .filter(|r| r.published_at.is_some())
        .count();
    let unique: std::collections::HashSet<_> = fin.messages.iter().map(|m| m.id).collect();
    let held = fin.retries.iter().filter(|r| r.retry_at.is_none()).count();
    let pruned = fin.rows.values().filter(|r| r.pruned.is_some()).count();
    let mut line = format!(
        "events {written} committed {committed} published {published} (pruned {pruned}) stored {} (dup {}) held {held} faults {} relays {}",
        unique.len(),
        fin.messages.len() - unique.len(),
        // the relays' stops at the end are no fault of the schedule's
        rec.faults.iter().filter(|f| f.start < healed).count(),
        rec.relays.len()
    );
    if let Some(c) = &rec.consumers {
        line.push_str(&format!(
            " consumed {} (dead letters {}, replica kills {}, silences {})",
            fin.applied.values().sum::<usize>(),
            fin.dead_letters.values().sum::<usize>(),
            c.kills.len(),
            c.silences.len()
        ));
    }
    line
}

/// Prints `schedule`: its writers' long transactions and every operation but the shared
/// transactions.
pub fn print_schedule(schedule: &schedule::Schedule) {
    println!(
        "schedule of seed {}: {:?}, {} lane(s), {} s",
        schedule.seed,
        schedule.topology,
        schedule.lanes,
        schedule.duration.as_secs()
    );
    match &schedule.retention {
        Some(plan) => println!("  retention: {plan:?}"),
        None => println!("  no retention"),
    }
    match &schedule.consumers {
        Some(plan) => println!("  consumer: {plan:?}"),
        None => println!("  no consumer"),
    }
    for w in &schedule.writers {
        println!(
            "  writer {} on {:?}: {} emits",
            w.name,
            w.subjects,
            w.emits.len()
        );
        for e in w.emits.iter().filter(|e| e.shape != schedule::Shape::Plain) {
            println!(
                "    {:7.2} {} {:?} {:?}",
                e.at.as_secs_f64(),
                e.event.subject,
                e.event.insert,
                e.shape
            );
        }
    }
    for op in &schedule.ops {
        if !matches!(op.action, schedule::Action::Transaction { .. }) {
            println!("  {:7.2} {}", op.at.as_secs_f64(), op.action);
        }
    }
}

/// Parses a focus name.
pub fn parse_focus(s: &str) -> Result<Focus, String> {
    Ok(match s {
        "reorder" => Focus::Reorder,
        "lane" => Focus::Lane,
        "late" => Focus::Late,
        "freeze" => Focus::Freeze,
        "idle" => Focus::Idle,
        other => {
            return Err(format!(
                "unknown focus `{other}`: reorder, lane, late, freeze or idle"
            ))
        }
    })
}
