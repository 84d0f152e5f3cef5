//! The relays of a run, slot by slot: each a task of the harness (`Relay::connect` and
//! `Relay::run`) or an `outbox relay` process, behind its slot's proxies. The fleet starts,
//! stops, kills, freezes and thaws them as the schedule says, and watches for a relay that
//! ends without being asked to.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use chrono::Utc;
use outbox_runtime::{Relay, RelayConfig};
use tokio::sync::{oneshot, Mutex};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::history::{Fault, History, RelayEnd, Time};
use crate::proxy::RelayPaths;
use crate::schedule::{FreezeHow, Path, RelayKind, RELAY_SLOTS};

/// How long a process may take to start: its start-up checks connect to Postgres (a 5 s
/// acquire timeout) and NATS (a 5 s connection timeout), then look at the tables and the
/// streams. An exit within it is a refused start. It counts as up once its `LISTEN` session
/// is seen (docs/relay.md, *Wake-up*), or when this has passed.
pub const START_ALLOWANCE: Duration = Duration::from_secs(15);
/// The relays' `backoff_max` (`--backoff-max`): short, so that a row that spent attempts in a
/// freeze is tried again within seconds of its end (the default, 5 min, would make every run
/// wait that long).
pub const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// How a relay of the run is configured: the defaults, but for `lanes` and [`BACKOFF_MAX`].
pub fn relay_config(lanes: usize) -> RelayConfig {
    RelayConfig {
        lanes,
        backoff_max: BACKOFF_MAX,
        ..RelayConfig::default()
    }
}

/// A relay running in a slot.
#[derive(Debug)]
enum Running {
    Task {
        record: usize,
        stop: Option<oneshot::Sender<()>>,
        handle: JoinHandle<TaskEnd>,
    },
    Process {
        record: usize,
        child: Child,
        log: PathBuf,
        spawned: Time,
        ready: bool,
    },
}

impl Running {
    fn record(&self) -> usize {
        match self {
            Running::Task { record, .. } | Running::Process { record, .. } => *record,
        }
    }
}

/// How a relay that was not asked to stop ended.
#[derive(Debug)]
enum Ending {
    /// It failed its start-up checks.
    Refused(String),
    /// It ended after it was up.
    Died(String),
}

/// How long after a relay ended on its own its slot gets one again (while it wants one).
const RESTART_AFTER: chrono::Duration = chrono::Duration::seconds(2);

/// How a relay task ended.
#[derive(Debug)]
enum TaskEnd {
    /// `Relay::connect` failed.
    Refused(String),
    /// `Relay::run` returned.
    Returned(Result<(), String>),
}

/// One slot: its proxies, and the relay in it.
#[derive(Debug)]
pub struct Slot {
    /// Its network paths.
    pub paths: RelayPaths,
    state: Mutex<SlotState>,
}

#[derive(Debug, Default)]
struct SlotState {
    running: Option<Running>,
    /// The kind the schedule last asked for, while it wants a relay in the slot.
    wanted: Option<RelayKind>,
    /// Since when the relay's Postgres sessions are frozen, and how (for the lock samples).
    frozen_since: Option<(Time, FreezeHow)>,
    /// A relay that refused to start is started again at this time.
    retry_at: Option<Time>,
}

/// The relays of a run.
#[derive(Debug)]
pub struct Fleet {
    /// The slots.
    pub slots: Vec<Slot>,
    history: Arc<History>,
    lanes: usize,
    /// URL of Postgres for the relay role, per slot (through its proxy).
    pg_urls: Vec<String>,
    logs: PathBuf,
}

impl Fleet {
    /// A fleet of [`RELAY_SLOTS`] empty slots with their proxies.
    pub async fn new(
        servers: &crate::servers::Servers,
        history: Arc<History>,
        lanes: usize,
        logs: PathBuf,
    ) -> Fleet {
        let mut slots = Vec::new();
        let mut pg_urls = Vec::new();
        for _ in 0..RELAY_SLOTS {
            let paths = RelayPaths::start(servers.pg.port, &servers.node_ports).await;
            pg_urls.push(servers.relay_url(paths.pg.port()));
            slots.push(Slot {
                paths,
                state: Mutex::new(SlotState::default()),
            });
        }
        Fleet {
            slots,
            history,
            lanes,
            pg_urls,
            logs,
        }
    }

    /// Starts a relay of `kind` in `slot` (one that runs is left alone).
    pub async fn join(&self, slot: usize, kind: RelayKind) {
        let mut state = self.slots[slot].state.lock().await;
        state.wanted = Some(kind);
        state.retry_at = None;
        if state.running.is_none() {
            state.running = Some(self.spawn(slot, kind).await);
            forget_signal_freeze(&mut state);
        }
    }

    async fn spawn(&self, slot: usize, kind: RelayKind) -> Running {
        // a path silenced by a fault stays silent for the new relay too; a process frozen by a
        // signal is not this one
        let paths = &self.slots[slot].paths;
        let record = self.history.relay(slot, kind);
        let name = self.history.relay_name(record);
        let (db, nats) = (self.pg_urls[slot].clone(), paths.nats_url());
        match kind {
            RelayKind::Task => {
                let (stop, stopped) = oneshot::channel::<()>();
                let config = relay_config(self.lanes);
                let history = self.history.clone();
                // the lanes' log lines carry the relay's name
                let span = tracing::info_span!("relay", name = %name);
                let handle = tokio::spawn(
                    async move {
                        let relay = match connect(&db, &nats, config).await {
                            Ok(relay) => relay,
                            Err(e) => return TaskEnd::Refused(e),
                        };
                        history.relay_ready(record, Utc::now());
                        let run = relay.run(async {
                            let _ = stopped.await;
                        });
                        TaskEnd::Returned(run.await.map_err(|e| e.to_string()))
                    }
                    .instrument(span),
                );
                self.history.note(format!("{name} started as a task"));
                Running::Task {
                    record,
                    stop: Some(stop),
                    handle,
                }
            }
            RelayKind::Process => {
                let log = self.logs.join(format!("{name}.log"));
                let child = match outbox_binary() {
                    Ok(bin) => Command::new(bin)
                        .args(["relay", "--lanes", &self.lanes.to_string()])
                        .args(["--backoff-max", &BACKOFF_MAX.as_secs().to_string()])
                        .env_clear()
                        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                        .env("DATABASE_URL", &db)
                        .env("NATS_URL", &nats)
                        .env("OUTBOX_LOG", "info,sqlx=warn")
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(
                            std::fs::File::create(&log)
                                .map(Stdio::from)
                                .unwrap_or_else(|_| Stdio::null()),
                        )
                        .spawn()
                        .unwrap_or_else(|e| panic!("run the outbox binary: {e}")),
                    Err(e) => panic!("{e}"),
                };
                self.history
                    .note(format!("{name} started as process {}", child.id()));
                Running::Process {
                    record,
                    child,
                    log,
                    spawned: Utc::now(),
                    ready: false,
                }
            }
        }
    }

    /// Stops the relay in `slot` gracefully, within `bound`; the slot stays empty.
    pub async fn leave(&self, slot: usize, bound: Duration) {
        let mut state = self.slots[slot].state.lock().await;
        state.wanted = None;
        state.retry_at = None;
        let Some(running) = state.running.take() else {
            self.history.note(format!("r{slot} has no relay to stop"));
            return;
        };
        let record = running.record();
        let fault = self.history.fault(Fault::RelayLeft(slot));
        let end = match running {
            Running::Task {
                mut stop, handle, ..
            } => {
                if let Some(stop) = stop.take() {
                    let _ = stop.send(());
                }
                let abort = handle.abort_handle();
                match tokio::time::timeout(bound, handle).await {
                    Ok(Ok(TaskEnd::Returned(Ok(())))) => RelayEnd::Left,
                    Ok(Ok(TaskEnd::Returned(Err(e)))) => {
                        RelayEnd::StopLate(format!("Relay::run returned an error: {e}"))
                    }
                    Ok(Ok(TaskEnd::Refused(e))) => RelayEnd::StartRefused(e),
                    Ok(Err(e)) => RelayEnd::StopLate(format!("the relay task failed: {e}")),
                    Err(_) => {
                        abort.abort();
                        RelayEnd::StopLate(format!("Relay::run did not return within {bound:?}"))
                    }
                }
            }
            Running::Process { mut child, log, .. } => {
                signal(child.id(), "TERM");
                let deadline = tokio::time::Instant::now() + bound;
                loop {
                    match child.try_wait() {
                        Ok(Some(status)) if status.success() => break RelayEnd::Left,
                        Ok(Some(status)) => {
                            break RelayEnd::StopLate(format!(
                                "exited with {status} when asked to stop: {}",
                                log_tail(&log)
                            ))
                        }
                        _ if tokio::time::Instant::now() >= deadline => {
                            let _ = child.kill();
                            let _ = child.wait();
                            break RelayEnd::StopLate(format!(
                                "did not exit within {bound:?} of SIGTERM: {}",
                                log_tail(&log)
                            ));
                        }
                        _ => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
            }
        };
        self.history.healed(fault);
        self.history.relay_ended(record, end);
    }

    /// Kills the relay in `slot`: a task is aborted and its connections cut (what the kernel
    /// does to a dead process's sockets), a process gets SIGKILL.
    pub async fn kill(&self, slot: usize) {
        let mut state = self.slots[slot].state.lock().await;
        state.wanted = None;
        state.retry_at = None;
        let Some(running) = state.running.take() else {
            self.history.note(format!("r{slot} has no relay to kill"));
            return;
        };
        self.history.instant_fault(Fault::RelayKilled(slot));
        let record = running.record();
        match running {
            Running::Task { handle, .. } => {
                handle.abort();
                for path in RelayPaths::ALL {
                    self.slots[slot].paths.cut(path);
                }
                let _ = handle.await;
            }
            Running::Process { mut child, .. } => {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        self.history.relay_ended(record, RelayEnd::Killed);
    }

    /// Freezes the relay in `slot` as `how` says (a task, which gets no signal, by its
    /// proxies); returns the fault's index and how it froze it, or `None` when the slot has no
    /// relay.
    pub async fn freeze(&self, slot: usize, how: FreezeHow) -> Option<(usize, FreezeHow)> {
        let mut state = self.slots[slot].state.lock().await;
        let how = match (&state.running, how) {
            (None, _) => {
                self.history.note(format!("r{slot} has no relay to freeze"));
                return None;
            }
            (Some(Running::Process { child, .. }), FreezeHow::Signal) => {
                signal(child.id(), "STOP");
                FreezeHow::Signal
            }
            _ => {
                for path in RelayPaths::ALL {
                    self.slots[slot].paths.freeze(path);
                }
                FreezeHow::Proxies
            }
        };
        state.frozen_since = Some((Utc::now(), how));
        Some((self.history.fault(Fault::RelayFrozen(slot, how)), how))
    }

    /// Thaws what [`freeze`](Self::freeze) froze (fault `fault`, frozen as `how`).
    pub async fn thaw(&self, slot: usize, (fault, how): (usize, FreezeHow)) {
        let mut state = self.slots[slot].state.lock().await;
        match how {
            FreezeHow::Signal => {
                if let Some(Running::Process { child, .. }) = &state.running {
                    signal(child.id(), "CONT");
                }
            }
            FreezeHow::Proxies => {
                for path in RelayPaths::ALL {
                    self.slots[slot].paths.thaw(path);
                }
            }
        }
        state.frozen_since = None;
        self.history.healed(fault);
    }

    /// Silences one path of `slot`; returns the fault's index.
    pub async fn freeze_path(&self, slot: usize, path: Path) -> usize {
        let mut state = self.slots[slot].state.lock().await;
        self.slots[slot].paths.freeze(path);
        if path == Path::Postgres {
            state.frozen_since = Some((Utc::now(), FreezeHow::Proxies));
        }
        self.history.fault(Fault::RelayPathFrozen(slot, path))
    }

    /// Lets one path of `slot` carry bytes again (fault `fault`).
    pub async fn thaw_path(&self, slot: usize, path: Path, fault: usize) {
        let mut state = self.slots[slot].state.lock().await;
        self.slots[slot].paths.thaw(path);
        if path == Path::Postgres {
            state.frozen_since = None;
        }
        self.history.healed(fault);
    }

    /// Cuts one path of `slot`.
    pub async fn cut_path(&self, slot: usize, path: Path) {
        let _state = self.slots[slot].state.lock().await;
        self.history.instant_fault(Fault::RelayPathCut(slot, path));
        self.slots[slot].paths.cut(path);
    }

    /// Looks at every relay: one that ended without being asked is recorded, and the slot
    /// gets a relay again [`RESTART_AFTER`] later while it wants one; a process that has
    /// outlived its start-up allowance without showing its `LISTEN` session counts as up.
    /// `faulty(since, slot)` tells whether a fault that could stop a start was on since that
    /// time: a start refused with none on is a relay's death.
    pub async fn watch(&self, faulty: impl Fn(Time, usize) -> bool) {
        for (slot, s) in self.slots.iter().enumerate() {
            let mut state = s.state.lock().await;
            let now = Utc::now();
            let Some(running) = state.running.as_mut() else {
                if let (Some(kind), Some(at)) = (state.wanted, state.retry_at) {
                    if now >= at {
                        state.retry_at = None;
                        state.running = Some(self.spawn(slot, kind).await);
                        forget_signal_freeze(&mut state);
                    }
                }
                continue;
            };
            let Some((record, ending)) = self.ending(running, now).await else {
                continue;
            };
            state.running = None;
            state.retry_at = Some(now + RESTART_AFTER);
            let end = match ending {
                Ending::Refused(why) if faulty(self.history.relay_spawned(record), slot) => {
                    RelayEnd::StartRefused(why)
                }
                Ending::Refused(why) => {
                    RelayEnd::Died(format!("refused to start with no fault on: {why}"))
                }
                Ending::Died(why) => RelayEnd::Died(why),
            };
            self.history.relay_ended(record, end);
        }
    }

    /// How `running` ended, if it did (its record and why); marks a process up once its
    /// start-up allowance has passed.
    async fn ending(&self, running: &mut Running, now: Time) -> Option<(usize, Ending)> {
        let allowance = chrono::Duration::from_std(START_ALLOWANCE).expect("short");
        match running {
            Running::Task { handle, record, .. } => {
                if !handle.is_finished() {
                    return None;
                }
                let ending = match handle.await {
                    Ok(TaskEnd::Refused(e)) => Ending::Refused(e),
                    Ok(TaskEnd::Returned(Ok(()))) => {
                        Ending::Died("Relay::run returned without being asked to stop".into())
                    }
                    Ok(TaskEnd::Returned(Err(e))) => {
                        Ending::Died(format!("Relay::run returned an error: {e}"))
                    }
                    Err(e) => Ending::Died(format!("the relay task failed: {e}")),
                };
                Some((*record, ending))
            }
            Running::Process {
                child,
                record,
                log,
                spawned,
                ready,
            } => match child.try_wait() {
                Ok(Some(status)) => {
                    let why = format!("exited with {status}: {}", log_tail(log));
                    let ending = if !*ready && now - *spawned < allowance {
                        Ending::Refused(why)
                    } else {
                        Ending::Died(why)
                    };
                    Some((*record, ending))
                }
                _ => {
                    if !*ready && now >= *spawned + allowance {
                        *ready = true;
                        self.history.relay_ready(*record, *spawned + allowance);
                    }
                    None
                }
            },
        }
    }

    /// The Postgres sessions of relays whose sessions are frozen: (relay record, frozen
    /// since, client ports).
    pub async fn frozen_sessions(&self) -> Vec<(usize, Time, Vec<u16>)> {
        let mut out = Vec::new();
        for s in &self.slots {
            let state = s.state.lock().await;
            if let (Some((since, _)), Some(running)) = (state.frozen_since, &state.running) {
                out.push((running.record(), since, s.paths.pg_sessions()));
            }
        }
        out
    }

    /// The processes started and not yet up: (slot, relay record, the ports its slot's
    /// Postgres sessions come from).
    pub async fn starting(&self) -> Vec<(usize, usize, Vec<u16>)> {
        let mut out = Vec::new();
        for (slot, s) in self.slots.iter().enumerate() {
            let state = s.state.lock().await;
            if let Some(Running::Process {
                record,
                ready: false,
                ..
            }) = &state.running
            {
                out.push((slot, *record, s.paths.pg_sessions()));
            }
        }
        out
    }

    /// The process of record `record` in `slot` is up now (its LISTEN session was seen).
    pub async fn up(&self, slot: usize, record: usize) {
        let mut state = self.slots[slot].state.lock().await;
        if let Some(Running::Process {
            record: r, ready, ..
        }) = &mut state.running
        {
            if *r == record && !*ready {
                *ready = true;
                self.history.relay_ready(record, Utc::now());
            }
        }
    }

    /// Whether any slot has a relay running or wanted.
    pub async fn any_relay(&self) -> bool {
        for s in &self.slots {
            let state = s.state.lock().await;
            if state.running.is_some() || state.wanted.is_some() {
                return true;
            }
        }
        false
    }

    /// Thaws every relay and path (the run's end).
    pub async fn thaw_all(&self) {
        for s in &self.slots {
            let mut state = s.state.lock().await;
            if let Some(Running::Process { child, .. }) = &state.running {
                signal(child.id(), "CONT");
            }
            s.paths.thaw_everything();
            state.frozen_since = None;
        }
    }

    /// Stops every relay gracefully (the run's end).
    pub async fn stop_all(&self, bound: Duration) {
        let stops = (0..self.slots.len()).map(|slot| self.leave_quietly(slot, bound));
        futures::future::join_all(stops).await;
    }

    async fn leave_quietly(&self, slot: usize, bound: Duration) {
        let running = self.slots[slot].state.lock().await.running.is_some();
        if running {
            self.leave(slot, bound).await;
        } else {
            let mut state = self.slots[slot].state.lock().await;
            state.wanted = None;
            state.retry_at = None;
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // processes never outlive the run, whatever ended it
        for s in &self.slots {
            if let Ok(mut state) = s.state.try_lock() {
                match state.running.take() {
                    Some(Running::Process { mut child, .. }) => {
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                    Some(Running::Task { handle, .. }) => handle.abort(),
                    None => {}
                }
            }
        }
    }
}

/// A relay task's relay: `Relay::connect` to one node; to several (a cluster, whose URLs
/// `Relay::connect` does not take as a list), `Relay::new` on a pool and a client made the
/// way `Relay::connect` makes them.
async fn connect(db: &str, nats: &str, config: RelayConfig) -> Result<Relay, String> {
    let urls: Vec<&str> = nats.split(',').collect();
    if urls.len() == 1 {
        return Relay::connect(db, nats, config)
            .await
            .map_err(|e| e.to_string());
    }
    let wait = config.ack_timeout.max(Duration::from_secs(5));
    let pool = outbox_runtime::connect::postgres(
        db,
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(config.pool_size())
            .acquire_timeout(wait),
    )
    .await
    .map_err(|e| e.to_string())?;
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(wait)
        .connect(urls.as_slice())
        .await
        .map_err(|e| outbox_runtime::connect::nats_error(nats, e).to_string())?;
    Relay::new(pool, async_nats::jetstream::new(client), config)
        .await
        .map_err(|e| e.to_string())
}

/// A relay started while its slot's relay was frozen by a signal is not frozen itself (a freeze
/// of its proxies holds for it too).
fn forget_signal_freeze(state: &mut SlotState) {
    if matches!(state.frozen_since, Some((_, FreezeHow::Signal))) {
        state.frozen_since = None;
    }
}

/// Sends `signal` to process `pid` (one the harness started).
fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The last lines of a relay process's log.
fn log_tail(path: &std::path::Path) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

/// The `outbox` binary: `OUTBOX_BIN` when set; else built from this workspace with cargo
/// (`cargo build -p outbox-cli --bin outbox`, a no-op when it is fresh), so that a run never
/// drives a stale relay.
pub fn outbox_binary() -> Result<PathBuf, String> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            if let Some(bin) = std::env::var_os("OUTBOX_BIN") {
                return Ok(PathBuf::from(bin));
            }
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
            let mut command = Command::new(cargo);
            // without what cargo sets for the test or run that started the harness (package
            // variables, library paths), which would make this build's fingerprints differ
            // from a plain `cargo build`'s and rebuild the binary each time the context changes
            for (key, _) in std::env::vars_os() {
                let key = key.to_string_lossy();
                let from_cargo = key.starts_with("CARGO_")
                    && !["CARGO_HOME", "CARGO_TARGET_DIR"].contains(&key.as_ref())
                    && ![
                        "CARGO_BUILD_",
                        "CARGO_PROFILE_",
                        "CARGO_NET_",
                        "CARGO_HTTP_",
                        "CARGO_REGISTR",
                        "CARGO_TERM_",
                    ]
                    .iter()
                    .any(|p| key.starts_with(p));
                if from_cargo || key == "LD_LIBRARY_PATH" || key.starts_with("RUST_") {
                    command.env_remove(key.as_ref());
                }
            }
            command.args(["build", "-p", "outbox-cli", "--bin", "outbox"]);
            command.args([
                "--message-format=json-render-diagnostics",
                "--manifest-path",
            ]);
            command.arg(manifest);
            if !cfg!(debug_assertions) {
                command.arg("--release");
            }
            let output = command
                .stderr(Stdio::inherit())
                .output()
                .map_err(|e| format!("cannot run cargo to build the outbox binary: {e}"))?;
            if !output.status.success() {
                return Err(format!(
                    "`cargo build -p outbox-cli` failed ({}); set OUTBOX_BIN to an outbox binary",
                    output.status
                ));
            }
            String::from_utf8_lossy(&output.stdout)
                .lines()
                .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
                .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == "outbox")
                .find_map(|v| v["executable"].as_str().map(PathBuf::from))
                .ok_or_else(|| "cargo built no outbox binary; set OUTBOX_BIN".to_owned())
        })
        .clone()
}
