//! What a run did and when, on the wall clock Postgres, the nats-servers and the harness share:
//! every event written and its outcome, every fault's window, every relay's life, the poison
//! rows and their repairs, and the locks frozen relays were seen to hold. The checker judges
//! the run from this and the final state; the report quotes the parts a violation concerns.

use std::sync::Mutex;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::schedule::{FreezeHow, Insert, Intrusion, Path, PoisonKind, RelayKind, Shape};

/// A wall-clock time.
pub type Time = DateTime<Utc>;

/// Why an event was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A healthy event.
    Healthy,
    /// Poison row `id` itself.
    Poison(usize),
    /// A healthy event behind poison row `id`, on its subject.
    Follower(usize),
    /// A row behind the head of the held subject with many rows (written in bulk).
    HeldMany,
}

/// How an event's transaction ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Still running.
    Pending,
    /// Committed (the time the commit returned).
    Committed(Time),
    /// Certainly not committed: it failed before its commit, or was refused.
    Failed(Time, String),
    /// Its commit was sent and no answer came (a lost connection): the table says whether it
    /// committed.
    Unknown(Time, String),
    /// Rolled back on purpose.
    RolledBack(Time),
}

/// One event the harness wrote (or tried to).
#[derive(Debug, Clone)]
pub struct EventRecord {
    /// `w1#12` (writer and emit), `t7.2` (transaction and event), `p3` (a poison row), `p3.f1`
    /// (its follower).
    pub label: String,
    /// Its id, once known (an emit that failed before returning one wrote nothing).
    pub id: Option<Uuid>,
    /// The entity.
    pub subject: String,
    /// Its event type (as written).
    pub event_type: String,
    /// How it was written.
    pub insert: Insert,
    /// Its transaction.
    pub shape: Shape,
    /// Sequential writer and position in its emit order.
    pub writer: Option<(usize, usize)>,
    /// Why it was written.
    pub role: Role,
    /// When its transaction began.
    pub began: Time,
    /// How its transaction ended.
    pub outcome: Outcome,
}

impl EventRecord {
    /// When its commit returned, if it did.
    pub fn committed_at(&self) -> Option<Time> {
        match self.outcome {
            Outcome::Committed(t) => Some(t),
            _ => None,
        }
    }
}

/// A fault, and its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A broker node killed, until restarted.
    BrokerDown(usize),
    /// A broker node frozen, until thawed.
    BrokerFrozen(usize, FreezeHow),
    /// The stream's leader stepped down.
    StepDown,
    /// Postgres down (immediate: a crash), until started.
    PgDown(bool),
    /// The relay role's backends terminated.
    PgKill,
    /// A relay killed.
    RelayKilled(usize),
    /// A relay left gracefully, until its stop returned.
    RelayLeft(usize),
    /// A relay frozen, until thawed.
    RelayFrozen(usize, FreezeHow),
    /// A relay's path silent, until it came back.
    RelayPathFrozen(usize, Path),
    /// A relay's path cut.
    RelayPathCut(usize, Path),
    /// `pg_locks` not readable by the relays' role, until granted again: it excuses nothing
    /// (the relays publish as before, their cursors held where they are).
    LocksRevoked,
    /// Another role interfering with the relays, until it let go: it excuses nothing (the
    /// relays publish as before, within a linger).
    Intruder(Intrusion),
}

impl Fault {
    /// Whether the fault excuses a late publish: every fault but those of the catalog and of
    /// another role, which the relays must publish through as before.
    pub fn excuses(self) -> bool {
        !matches!(self, Fault::LocksRevoked | Fault::Intruder(_))
    }

    /// The relay slot a relay-local fault hits.
    pub fn relay(self) -> Option<usize> {
        match self {
            Fault::RelayKilled(r)
            | Fault::RelayLeft(r)
            | Fault::RelayFrozen(r, _)
            | Fault::RelayPathFrozen(r, _)
            | Fault::RelayPathCut(r, _) => Some(r),
            _ => None,
        }
    }

    /// Whether the relay's Postgres sessions are frozen with it (nothing it holds can be
    /// released by the relay itself).
    pub fn freezes_relay_sessions(self) -> bool {
        matches!(
            self,
            Fault::RelayFrozen(..) | Fault::RelayPathFrozen(_, Path::Postgres)
        )
    }
}

/// A fault's window.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    /// The fault.
    pub fault: Fault,
    /// When it began.
    pub start: Time,
    /// When it healed (`None`: it did not, which the run's end heals).
    pub end: Option<Time>,
}

/// How a relay's life ended.
#[derive(Debug, Clone, PartialEq)]
pub enum RelayEnd {
    /// Stopped gracefully when asked, in time.
    Left,
    /// Asked to stop, and did not return within the bound (the message says what happened).
    StopLate(String),
    /// Killed by the harness.
    Killed,
    /// Refused to start (a start-up check failed while a fault was on): not a relay's death.
    StartRefused(String),
    /// Ended without being asked: a task that returned or panicked, a process that exited.
    Died(String),
}

/// One relay's life in a slot.
#[derive(Debug, Clone)]
pub struct RelayRecord {
    /// The slot.
    pub slot: usize,
    /// Its number among the slot's relays.
    pub incarnation: usize,
    /// Task or process.
    pub kind: RelayKind,
    /// When it was started.
    pub spawned: Time,
    /// When it was up: a task's `Relay::connect` returned; a process's start-up allowance ran
    /// out without it exiting.
    pub ready: Option<Time>,
    /// How and when it ended.
    pub ended: Option<(Time, RelayEnd)>,
}

impl RelayRecord {
    /// `r1.2` (slot 1, second relay in it).
    pub fn name(&self) -> String {
        format!("r{}.{}", self.slot, self.incarnation)
    }
}

/// A poison row and what the schedule did to it.
#[derive(Debug, Clone)]
pub struct PoisonRecord {
    /// Its number.
    pub id: usize,
    /// What is wrong with it.
    pub kind: PoisonKind,
    /// Its subject.
    pub subject: String,
    /// Its id (whether it committed, the table says).
    pub head: Uuid,
    /// When its cause was fixed and it was unblocked (the unblock's return).
    pub repaired: Option<Time>,
    /// When it was unblocked without a fix.
    pub unblocked: Vec<Time>,
    /// Many rows behind it (the held subject of `--held-rows`).
    pub rows_behind: u64,
}

/// A lock a frozen relay's session was seen to hold.
#[derive(Debug, Clone)]
pub struct LockSample {
    /// The relay (`r0.1`).
    pub relay: String,
    /// When its freeze began.
    pub frozen_since: Time,
    /// When the lock was seen.
    pub at: Time,
    /// The backend's pid.
    pub pid: i32,
    /// The lock, as `pg_locks` shows it.
    pub lock: String,
}

/// The retention task of a run.
#[derive(Debug, Clone)]
pub struct RetentionRecord {
    /// Its `keep_published`.
    pub keep: std::time::Duration,
    /// Its pause between passes.
    pub interval: std::time::Duration,
    /// Its passes that failed: when, and why.
    pub failed: Vec<(Time, String)>,
    /// How it ended: `None` while it runs or when the harness stopped it; a panic otherwise.
    pub died: Option<(Time, String)>,
    /// When its path to Postgres went silent, and when it carried bytes again or the task
    /// stopped (`None` while it lasts).
    pub silences: Vec<(Time, Option<Time>)>,
}

/// The consumer of a run: how its replicas ended, each time they did.
#[derive(Debug, Clone, Default)]
pub struct ConsumerRecord {
    /// Replicas that ended without being asked to: a panic, or a configuration conflict (a
    /// `run` that returned another error failed at start, where a broker or database that does
    /// not answer is one: it is only noted, and started again a second later).
    pub died: Vec<(Time, usize, String)>,
    /// Replicas that, asked to stop at the end, had not stopped within the bound.
    pub stopped_late: Vec<(Time, usize)>,
    /// When a replica was killed, and which.
    pub kills: Vec<(Time, usize)>,
    /// When a replica's path went silent, and which.
    pub silences: Vec<(Time, usize)>,
}

/// Everything recorded during a run.
#[derive(Debug, Default)]
pub struct Recorded {
    /// The events, in the order they were begun.
    pub events: Vec<EventRecord>,
    /// The faults.
    pub faults: Vec<FaultRecord>,
    /// The relays.
    pub relays: Vec<RelayRecord>,
    /// The poison rows.
    pub poisons: Vec<PoisonRecord>,
    /// Locks seen held by frozen relays.
    pub locks: Vec<LockSample>,
    /// The retention task, if the run had one.
    pub retention: Option<RetentionRecord>,
    /// The consumer, if the run had one.
    pub consumers: Option<ConsumerRecord>,
    /// Every operation as it ran, in words.
    pub log: Vec<(Time, String)>,
}

/// The history of one run: [`Recorded`] behind a lock, written by the run's tasks.
#[derive(Debug)]
pub struct History {
    /// When the run's schedule started.
    pub start: Time,
    inner: Mutex<Recorded>,
}

/// Seconds since the run's start, for the report.
pub fn since(start: Time, t: Time) -> f64 {
    (t - start).num_milliseconds() as f64 / 1000.0
}

impl History {
    /// An empty history starting now.
    pub fn new() -> History {
        History {
            start: Utc::now(),
            inner: Mutex::new(Recorded::default()),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Recorded) -> T) -> T {
        f(&mut self.inner.lock().expect("the history"))
    }

    /// Changes the record of the retention task (made by [`History::retention_started`]).
    pub fn retention(&self, f: impl FnOnce(&mut RetentionRecord)) {
        self.with(|r| r.retention.as_mut().map(f));
    }

    /// The retention task starts, keeping published rows `keep`.
    pub fn retention_started(&self, keep: std::time::Duration, interval: std::time::Duration) {
        self.with(|r| {
            r.retention = Some(RetentionRecord {
                keep,
                interval,
                failed: Vec::new(),
                died: None,
                silences: Vec::new(),
            })
        });
    }

    /// Changes the record of the consumer, making it if needed.
    pub fn consumers(&self, f: impl FnOnce(&mut ConsumerRecord)) {
        self.with(|r| f(r.consumers.get_or_insert_with(ConsumerRecord::default)));
    }

    /// A line of the operations log.
    pub fn note(&self, line: impl Into<String>) {
        let line = line.into();
        self.with(|r| r.log.push((Utc::now(), line)));
    }

    /// Records an event about to be written; returns its index.
    pub fn event(&self, event: EventRecord) -> usize {
        self.with(|r| {
            r.events.push(event);
            r.events.len() - 1
        })
    }

    /// Sets event `n`'s id.
    pub fn event_id(&self, n: usize, id: Uuid) {
        self.with(|r| r.events[n].id = Some(id));
    }

    /// Sets event `n`'s outcome.
    pub fn outcome(&self, n: usize, outcome: Outcome) {
        self.with(|r| r.events[n].outcome = outcome);
    }

    /// A fault begins now; returns its index.
    pub fn fault(&self, fault: Fault) -> usize {
        self.with(|r| {
            r.faults.push(FaultRecord {
                fault,
                start: Utc::now(),
                end: None,
            });
            r.faults.len() - 1
        })
    }

    /// A point fault (a cut, a kill of connections): it begins and ends now.
    pub fn instant_fault(&self, fault: Fault) {
        let n = self.fault(fault);
        self.healed(n);
    }

    /// Fault `n` healed now.
    pub fn healed(&self, n: usize) {
        self.with(|r| r.faults[n].end = Some(Utc::now()));
    }

    /// Faults not healed yet heal now (the run's end).
    pub fn heal_all(&self) {
        let now = Utc::now();
        self.with(|r| {
            for f in r.faults.iter_mut().filter(|f| f.end.is_none()) {
                f.end = Some(now);
            }
        });
    }

    /// A relay started now in `slot`; returns its index.
    pub fn relay(&self, slot: usize, kind: RelayKind) -> usize {
        self.with(|r| {
            let incarnation = r.relays.iter().filter(|x| x.slot == slot).count();
            r.relays.push(RelayRecord {
                slot,
                incarnation,
                kind,
                spawned: Utc::now(),
                ready: None,
                ended: None,
            });
            r.relays.len() - 1
        })
    }

    /// Relay `n` is up (at `at`).
    pub fn relay_ready(&self, n: usize, at: Time) {
        self.with(|r| r.relays[n].ready = Some(at));
    }

    /// Relay `n` ended now, as `end` says (a relay ends once).
    pub fn relay_ended(&self, n: usize, end: RelayEnd) {
        self.with(|r| {
            if r.relays[n].ended.is_none() {
                r.relays[n].ended = Some((Utc::now(), end));
            }
        });
    }

    /// When relay `n` was started.
    pub fn relay_spawned(&self, n: usize) -> Time {
        self.with(|r| r.relays[n].spawned)
    }

    /// Whether a fault that could stop a relay in `slot` from starting was on at any time
    /// since `since`: any fault but another slot's, or another role's.
    pub fn faulty_since(&self, since: Time, slot: usize) -> bool {
        self.with(|r| {
            r.faults.iter().any(|f| {
                f.fault.relay().is_none_or(|s| s == slot)
                    && !matches!(f.fault, Fault::Intruder(_))
                    && f.end.is_none_or(|end| end >= since)
            })
        })
    }

    /// Relay `n`'s name.
    pub fn relay_name(&self, n: usize) -> String {
        self.with(|r| r.relays[n].name())
    }

    /// Records a poison row; its id is its number.
    pub fn poison(&self, record: PoisonRecord) {
        self.with(|r| r.poisons.push(record));
    }

    /// Changes poison row `id`'s record.
    pub fn poison_update(&self, id: usize, f: impl FnOnce(&mut PoisonRecord)) {
        self.with(|r| {
            if let Some(p) = r.poisons.iter_mut().find(|p| p.id == id) {
                f(p);
            }
        });
    }

    /// Poison row `id`'s record.
    pub fn poison_record(&self, id: usize) -> Option<PoisonRecord> {
        self.with(|r| r.poisons.iter().find(|p| p.id == id).cloned())
    }

    /// A lock seen held by a frozen relay.
    pub fn lock(&self, sample: LockSample) {
        self.with(|r| r.locks.push(sample));
    }

    /// A copy of everything recorded.
    pub fn snapshot(&self) -> Recorded {
        self.with(|r| Recorded {
            events: r.events.clone(),
            faults: r.faults.clone(),
            relays: r.relays.clone(),
            poisons: r.poisons.clone(),
            locks: r.locks.clone(),
            retention: r.retention.clone(),
            consumers: r.consumers.clone(),
            log: r.log.clone(),
        })
    }
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

impl Fault {
    /// The fault in words, for the report.
    pub fn describe(self) -> String {
        match self {
            Fault::BrokerDown(n) => format!("broker node {n} down"),
            Fault::BrokerFrozen(n, FreezeHow::Signal) => {
                format!("broker node {n} frozen (SIGSTOP)")
            }
            Fault::BrokerFrozen(n, FreezeHow::Proxies) => {
                format!("broker node {n} silent to every relay (proxies)")
            }
            Fault::StepDown => "stream leader stepped down (until a leader is known)".into(),
            Fault::PgDown(true) => "postgres down (immediate: a crash)".into(),
            Fault::PgDown(false) => "postgres down (fast)".into(),
            Fault::PgKill => "postgres terminated the relay role's backends".into(),
            Fault::RelayKilled(r) => format!("relay r{r} killed"),
            Fault::RelayLeft(r) => format!("relay r{r} stopping"),
            Fault::RelayFrozen(r, FreezeHow::Signal) => format!("relay r{r} frozen (SIGSTOP)"),
            Fault::RelayFrozen(r, FreezeHow::Proxies) => {
                format!("relay r{r} frozen (all its paths silent)")
            }
            Fault::RelayPathFrozen(r, p) => format!("relay r{r}'s {p:?} path silent"),
            Fault::RelayPathCut(r, p) => format!("relay r{r}'s {p:?} path cut"),
            Fault::LocksRevoked => "select on pg_locks revoked from public".into(),
            Fault::Intruder(how) => format!("another role: {how:?}"),
        }
    }
}
