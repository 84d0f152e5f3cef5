//! The schedule: every operation of a run and its time, drawn from the seed alone.
//!
//! A schedule is data: the sequential writers with their emits, and a list of operations
//! (transactions on shared subjects, poison rows, repairs, relays joining and failing, broker
//! and Postgres faults), each at a virtual time from the run's start. [`generate`] is a pure
//! function of the seed and the [`Settings`], so that a seed replays the same schedule; the
//! run executes it in real time and records what happened ([`crate::history`]).

use std::fmt;
use std::time::Duration;

use crate::rng::Rng;

mod draw;
mod focus;

use draw::Draft;

/// The event types of the healthy workload; the run's stream captures `hx.>`.
pub const EVENT_TYPES: [&str; 4] = [
    "hx.account.changed",
    "hx.order.placed",
    "hx.invoice.paid",
    "hx.user.renamed",
];

/// What the run's main stream captures.
pub const STREAM_SUBJECTS: &str = "hx.>";

/// The most relays a run has at once.
pub const RELAY_SLOTS: usize = 3;

/// One nats-server, or a three-node JetStream cluster with a stream of three replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// One nats-server.
    Single,
    /// Three nodes, an R3 stream.
    Cluster,
}

/// How relays run: as tasks of the harness (`Relay::connect` and `Relay::run`), as `outbox
/// relay` processes, or each join drawn between the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayMode {
    /// Tasks only.
    Task,
    /// Processes only.
    Process,
    /// Drawn per join.
    Mixed,
}

/// One relay's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayKind {
    /// A task of the harness.
    Task,
    /// An `outbox relay` process.
    Process,
}

/// Schedules biased towards one of the findings the harness is known to reproduce (see
/// docs/harness.md): the same seed still draws the details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Focus {
    /// A broker outage with one held row anywhere, sequential writers emitting through it.
    Reorder,
    /// Rows with `created_at` in year 50000 and before Christ among healthy writers.
    Lane,
    /// Late commits (a default-now() transaction that sleeps before its insert, prepared
    /// transactions, long transactions) while a row is held elsewhere.
    Late,
    /// Two relays, one whose NATS path goes silent for 35-50 s, many subjects emitting.
    Freeze,
    /// Two relays frozen in turn while they wait for commits.
    Idle,
}

/// What shapes a schedule besides the seed; every field is in a failing run's replay command.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The topology, or `None` to draw it from the seed.
    pub topology: Option<Topology>,
    /// How relays run.
    pub relays: RelayMode,
    /// How long the schedule's operations go on (faults that start near the end run past it).
    pub duration: Duration,
    /// A bias towards one finding.
    pub focus: Option<Focus>,
    /// A held subject with this many rows behind its head, if any.
    pub held_rows: Option<u64>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            topology: None,
            relays: RelayMode::Mixed,
            duration: Duration::from_secs(60),
            focus: None,
            held_rows: None,
        }
    }
}

/// How a row's `created_at` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreatedAt {
    /// The column default, `now()`: the transaction's start.
    Default,
    /// `clock_timestamp()`: the insert's time.
    Clock,
    /// `clock_timestamp()` plus this many milliseconds: a writer whose clock is off, by hand.
    Skewed(i64),
    /// This literal, by hand.
    Fixed(&'static str),
}

impl CreatedAt {
    /// Whether the value is written by hand, earlier than the insert's own clock: a row the
    /// spec lets wait for a lane's look below its floor.
    pub fn by_hand_in_past(self) -> bool {
        match self {
            CreatedAt::Skewed(ms) => ms < 0,
            CreatedAt::Fixed(at) => at != FUTURE,
            CreatedAt::Default | CreatedAt::Clock => false,
        }
    }
}

/// Explicit `created_at` values in the past, for rows written by hand.
const PAST: [&str; 2] = ["2001-09-09 01:46:40+00", "1999-12-31 23:59:59+00"];
/// An explicit `created_at` value in the future.
const FUTURE: &str = "2100-01-01 00:00:00+00";

/// How a row is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Insert {
    /// `outbox_runtime`'s emit of a `RawEvent` (`created_at` is `clock_timestamp()`; it
    /// notifies a waiting relay).
    Emit,
    /// A plain SQL insert, as a writer in another language does (it notifies nobody).
    Raw(CreatedAt),
}

/// The transaction around an event's insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Insert and commit.
    Plain,
    /// Begin, sleep, insert, commit: with the column default, the row's `created_at` is the
    /// transaction's start, older than rows committed meanwhile.
    SleepBefore(Duration),
    /// Begin, insert, sleep, commit.
    SleepAfter(Duration),
    /// Insert, `PREPARE TRANSACTION`, and `COMMIT PREPARED` this much later.
    Prepared(Duration),
    /// Insert, then roll back.
    RolledBack,
}

impl Shape {
    /// How long the transaction stays open beyond its statements.
    pub fn held_open(self) -> Duration {
        match self {
            Shape::SleepBefore(d) | Shape::SleepAfter(d) | Shape::Prepared(d) => d,
            Shape::Plain | Shape::RolledBack => Duration::ZERO,
        }
    }
}

/// One event to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventSpec {
    /// The entity it is about.
    pub subject: String,
    /// Its event type.
    pub event_type: String,
    /// How it is written.
    pub insert: Insert,
}

/// One emit of a sequential writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emit {
    /// When, at the earliest (a writer emits one event at a time: a long transaction delays
    /// the next).
    pub at: Duration,
    /// The event.
    pub event: EventSpec,
    /// Its transaction.
    pub shape: Shape,
}

/// A sequential writer: it owns its subjects and emits one event at a time, each committed (or
/// failed) before the next; the checker holds each of its subjects to its emit order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writer {
    /// `w<n>`.
    pub name: String,
    /// The subjects it owns.
    pub subjects: Vec<String>,
    /// Its emits, in order.
    pub emits: Vec<Emit>,
}

/// A row the relay cannot publish as it is, one kind per case docs/relay.md lists under *Held
/// rows* (text that is not UTF-8 cannot be stored in a UTF-8 database, so it is not among them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoisonKind {
    /// `created_at` is `infinity`.
    CreatedAtInfinity,
    /// `time` is `infinity`.
    TimeInfinity,
    /// `created_at` in year 50000 (epoch milliseconds stored as seconds).
    CreatedAtYear50000,
    /// `created_at` before Christ.
    CreatedAtBc,
    /// `data` nested deeper than the relay's JSON parser allows.
    DeepJson,
    /// `attempts` at the relay's cap.
    AtAttemptCap,
    /// An event type with a wildcard.
    Wildcard,
    /// An event type with `$`.
    Dollar,
    /// An event type with whitespace.
    Whitespace,
    /// An event type over 255 bytes.
    LongType,
    /// A message over the server's `max_payload` (1 MiB).
    OverMaxPayload,
    /// An event type no stream captures (until a repair creates one).
    Uncaptured,
    /// A message over the stream's `max_msg_size` but within `max_payload`.
    OverMaxMsgSize,
}

impl PoisonKind {
    /// Every kind.
    pub const ALL: [PoisonKind; 13] = [
        PoisonKind::CreatedAtInfinity,
        PoisonKind::TimeInfinity,
        PoisonKind::CreatedAtYear50000,
        PoisonKind::CreatedAtBc,
        PoisonKind::DeepJson,
        PoisonKind::AtAttemptCap,
        PoisonKind::Wildcard,
        PoisonKind::Dollar,
        PoisonKind::Whitespace,
        PoisonKind::LongType,
        PoisonKind::OverMaxPayload,
        PoisonKind::Uncaptured,
        PoisonKind::OverMaxMsgSize,
    ];

    /// Whether docs/relay.md says the relay holds such a row. A `created_at` in year 50000 or
    /// before Christ is a real instant the relay can read: it may publish the row or hold it
    /// with a reason, as long as the row stops nothing else.
    pub fn held_by_spec(self) -> bool {
        !matches!(
            self,
            PoisonKind::CreatedAtYear50000 | PoisonKind::CreatedAtBc
        )
    }

    /// Whether the row's `created_at` is the poison: its place in `(created_at, id)` order is
    /// not its emit order, so it gets no followers.
    pub fn in_created_at(self) -> bool {
        matches!(
            self,
            PoisonKind::CreatedAtInfinity
                | PoisonKind::CreatedAtYear50000
                | PoisonKind::CreatedAtBc
        )
    }
}

/// Where a relay's network path goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// To the nats-server(s).
    Nats,
    /// To Postgres.
    Postgres,
}

/// How something is frozen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreezeHow {
    /// SIGSTOP, then SIGCONT (processes only).
    Signal,
    /// Every proxy in front of it stops forwarding, then forwards again.
    Proxies,
}

/// Which broker node a fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    /// This node (the only one of a single server is 0).
    Index(usize),
    /// The node leading the stream when the fault starts.
    StreamLeader,
}

/// What another role, sharing the database with no rights on its tables, does to the relays: any
/// role may take their advisory lock keys and send notifications on their channel
/// (docs/operations.md, *What another role can do to the relay*).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intrusion {
    /// Holds the notify lock exclusively: no relay can take it, and every emit notifies.
    NotifyLock,
    /// Holds the notify lock shared: no relay can take it.
    NotifyLockShared,
    /// Holds the wake lock exclusively: emits cannot take it shared, and notify.
    WakeLock,
    /// Holds the wake lock shared, as an emit that never ends: no relay can learn that the
    /// emits in flight have ended, and its lanes linger.
    WakeLockShared,
    /// Sends notifications on the relays' channel, about a thousand a second: empty, `release`,
    /// a partition's number, words the relay does not know.
    Flood,
}

impl Intrusion {
    /// Every intrusion, in the order the schedule draws them.
    pub const ALL: [Intrusion; 5] = [
        Intrusion::NotifyLock,
        Intrusion::NotifyLockShared,
        Intrusion::WakeLock,
        Intrusion::WakeLockShared,
        Intrusion::Flood,
    ];
}

/// One operation of the schedule besides the sequential writers' emits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A transaction on shared subjects (not held to an order).
    Transaction {
        /// `t<n>`.
        label: String,
        /// Its events.
        events: Vec<EventSpec>,
        /// Its shape.
        shape: Shape,
    },
    /// A poison row on its own subject, then `followers` healthy events on that subject, each
    /// in a transaction of its own.
    Poison {
        /// Its number in the run.
        id: usize,
        /// What is wrong with it.
        kind: PoisonKind,
        /// Healthy events behind it.
        followers: usize,
    },
    /// Fixes the poison row's cause (the row, or a stream for its type), then `outbox unblock
    /// --id` it.
    Repair {
        /// Which poison row.
        poison: usize,
    },
    /// `outbox unblock --id` the poison row without fixing it: it is held again.
    Unblock {
        /// Which poison row.
        poison: usize,
    },
    /// A held subject: a poison head (an uncaptured type) and `rows` rows behind it.
    HeldMany {
        /// Rows behind the head.
        rows: u64,
    },
    /// A relay starts in a slot.
    RelayJoin {
        /// The slot.
        relay: usize,
        /// As a task or a process.
        kind: RelayKind,
    },
    /// The relay in a slot stops gracefully (shutdown future, or SIGTERM).
    RelayLeave {
        /// The slot.
        relay: usize,
    },
    /// The relay in a slot is killed: its task aborted and its connections cut, or SIGKILL.
    RelayKill {
        /// The slot.
        relay: usize,
    },
    /// The relay in a slot freezes, then thaws.
    RelayFreeze {
        /// The slot.
        relay: usize,
        /// SIGSTOP, or all its proxies.
        how: FreezeHow,
        /// For how long.
        length: Duration,
    },
    /// One network path of a relay goes silent (no close, no reset), then comes back.
    RelayPathFreeze {
        /// The slot.
        relay: usize,
        /// Which path.
        path: Path,
        /// For how long.
        length: Duration,
    },
    /// One network path of a relay is cut: its connections close (it may reconnect at once).
    RelayPathCut {
        /// The slot.
        relay: usize,
        /// Which path.
        path: Path,
    },
    /// A broker node is killed (SIGKILL) and restarted later on its store.
    BrokerKill {
        /// Which node.
        node: Node,
        /// How long it stays down.
        down: Duration,
    },
    /// A broker node freezes (SIGSTOP, or every relay's proxy to it), then thaws.
    BrokerFreeze {
        /// Which node.
        node: Node,
        /// How.
        how: FreezeHow,
        /// For how long.
        length: Duration,
    },
    /// The stream's leader steps down (cluster only).
    StepDown,
    /// Postgres stops (fast, or immediate: a crash) and starts again.
    PgRestart {
        /// `pg_ctl -m immediate`.
        immediate: bool,
        /// How long it stays down.
        down: Duration,
    },
    /// `pg_terminate_backend` of every backend of the relay role.
    PgKillConnections,
    /// `select` on `pg_locks` revoked from `public` (the relays cannot sample the running
    /// transactions for their horizon), then granted again.
    PgRevokeLocks {
        /// For how long.
        length: Duration,
    },
    /// Another role interferes with the relays (it excuses nothing).
    Intrude {
        /// How.
        how: Intrusion,
        /// For how long.
        length: Duration,
    },
}

/// The retention task that runs beside the relays for the whole run (`outbox_runtime`'s
/// `Retention`, as the retention role): a keep of seconds, so that it deletes published rows
/// while relays claim, publish and mark theirs, and autovacuum hands the freed slots to new
/// rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionPlan {
    /// `keep_published` (`keep_dedupe` is twice that).
    pub keep: Duration,
    /// The pause between passes.
    pub interval: Duration,
    /// Rows per delete statement.
    pub batch_size: i64,
    /// `busy_percent` (`max_busy_percent` is the default, 100).
    pub busy_percent: u8,
    /// When the task's path to Postgres goes silent without a reset (from the run's start),
    /// and for how long: up to [`SILENCE_LONGEST`], past its statements' bound
    /// (`retention::STATEMENT_ANSWER`). The last ends when the harness stops the task at the
    /// latest.
    pub silences: Vec<(Duration, Duration)>,
}

/// The longest silence of the retention task's path.
pub const SILENCE_LONGEST: Duration = Duration::from_secs(60);

impl RetentionPlan {
    /// Three runs in four get a retention task, drawn from a generator of its own.
    /// Half of them have their path silenced once or twice, each starting within a third of
    /// `duration` after the last (drawn after the rest, so the other fields of a seed's plan
    /// are as before).
    fn draw(mut rng: Rng, duration: Duration) -> Option<RetentionPlan> {
        rng.chance(0.75).then(|| {
            let mut plan = RetentionPlan {
                keep: rng.millis(Duration::from_millis(500), Duration::from_secs(15)),
                interval: rng.millis(Duration::from_millis(200), Duration::from_secs(5)),
                batch_size: rng.pick(&[1, 10, 100, 1_000]),
                busy_percent: rng.pick(&[10, 50, 100]),
                silences: Vec::new(),
            };
            let silences = if rng.chance(0.5) {
                rng.between(1, 2)
            } else {
                0
            };
            // early, so that a long one ends (or the run stops) past the statements' bound
            let within = (duration / 3).max(Duration::from_secs(1));
            let mut from = Duration::ZERO;
            for _ in 0..silences {
                let at = from + rng.millis(Duration::ZERO, within);
                let long = rng.pick(&[
                    Duration::from_secs(1),
                    Duration::from_secs(5),
                    SILENCE_LONGEST,
                ]);
                let length = rng.millis(long / 2, long);
                plan.silences.push((at, length));
                from = at + length;
            }
            plan
        })
    }
}

/// The service's consumer, in runs that have one: replicas of `outbox_runtime`'s `Consumer`
/// under one durable, deduping, whose handler fails some events on purpose (by the event's id,
/// [`crate::consumers::Fate`]); each replica is killed now and then, and comes back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerPlan {
    /// How many replicas run.
    pub replicas: usize,
    /// `ConsumerConfig::ack_wait`: a slow handler outlasts it.
    pub ack_wait: Duration,
    /// When a replica is killed (its task aborted, the message in hand abandoned; from the
    /// run's start), which, and how long it stays down.
    pub kills: Vec<(Duration, usize, Duration)>,
    /// When a replica's path to Postgres or to every node goes silent (no close, no reset;
    /// from the run's start), which, and for how long; each ends within the schedule.
    pub silences: Vec<(Duration, usize, Path, Duration)>,
}

impl ConsumerPlan {
    /// Half the runs get a consumer, drawn from a generator of its own: two or three replicas,
    /// each kill 3-15 s after the last, down 0.5-5 s; each silence of a replica's path 4-20 s
    /// after the last began, for 1-20 s.
    fn draw(mut rng: Rng, duration: Duration) -> Option<ConsumerPlan> {
        rng.chance(0.5).then(|| {
            let replicas = rng.pick(&[2, 3]);
            let ack_wait = rng.millis(Duration::from_secs(2), Duration::from_secs(5));
            let mut kills = Vec::new();
            let mut at = Duration::ZERO;
            loop {
                at += rng.millis(Duration::from_secs(3), Duration::from_secs(15));
                if at >= duration {
                    break;
                }
                let replica = rng.index(replicas);
                let down = rng.millis(Duration::from_millis(500), Duration::from_secs(5));
                kills.push((at, replica, down));
            }
            // drawn after the rest, so that the kills of a seed are as they were
            let mut silences = Vec::new();
            let mut at = Duration::ZERO;
            loop {
                at += rng.millis(Duration::from_secs(4), Duration::from_secs(20));
                let replica = rng.index(replicas);
                let path = rng.pick(&[Path::Postgres, Path::Nats]);
                let length = rng.millis(Duration::from_secs(1), Duration::from_secs(20));
                if at + length >= duration {
                    break;
                }
                silences.push((at, replica, path, length));
            }
            ConsumerPlan {
                replicas,
                ack_wait,
                kills,
                silences,
            }
        })
    }
}

/// An operation and its time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// From the run's start.
    pub at: Duration,
    /// What.
    pub action: Action,
}

/// A run's schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// The seed it was drawn from.
    pub seed: u64,
    /// The topology.
    pub topology: Topology,
    /// `RelayConfig::lanes` of every relay.
    pub lanes: usize,
    /// The sequential writers.
    pub writers: Vec<Writer>,
    /// Everything else, by time.
    pub ops: Vec<Op>,
    /// When the last operation starts, at the latest.
    pub duration: Duration,
    /// The retention task, if the run has one.
    pub retention: Option<RetentionPlan>,
    /// The consumer, if the run has one.
    pub consumers: Option<ConsumerPlan>,
}

impl Schedule {
    /// A short digest of the whole schedule, printed with each run so that a replay shows it
    /// drew the same one.
    pub fn digest(&self) -> String {
        let text = format!("{self:?}");
        let h = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        format!("{h:016x}")
    }

    /// The subjects of poison row `id`.
    pub fn poison_subject(id: usize) -> String {
        format!("p{id}")
    }

    /// How many operations of each sort the schedule has, for the run's one-line verdict.
    pub fn counts(&self) -> (usize, usize, usize) {
        let emits = self.writers.iter().map(|w| w.emits.len()).sum::<usize>()
            + self
                .ops
                .iter()
                .filter_map(|op| match &op.action {
                    Action::Transaction { events, .. } => Some(events.len()),
                    _ => None,
                })
                .sum::<usize>();
        let poison = self
            .ops
            .iter()
            .filter(|op| matches!(op.action, Action::Poison { .. } | Action::HeldMany { .. }))
            .count();
        let faults = self.ops.iter().filter(|op| op.action.is_fault()).count();
        (emits, poison, faults)
    }
}

impl Action {
    /// Whether this is a fault (anything but the workload and relays joining).
    pub fn is_fault(&self) -> bool {
        !matches!(
            self,
            Action::Transaction { .. }
                | Action::Poison { .. }
                | Action::Repair { .. }
                | Action::Unblock { .. }
                | Action::HeldMany { .. }
                | Action::RelayJoin { .. }
        )
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = |d: &Duration| format!("{:.1} s", d.as_secs_f64());
        match self {
            Action::Transaction {
                label,
                events,
                shape,
            } => write!(
                f,
                "transaction {label} of {} event(s), {shape:?}",
                events.len()
            ),
            Action::Poison {
                id,
                kind,
                followers,
            } => write!(f, "poison p{id} {kind:?} with {followers} follower(s)"),
            Action::Repair { poison } => write!(f, "repair p{poison} and unblock it"),
            Action::Unblock { poison } => write!(f, "unblock p{poison} without a repair"),
            Action::HeldMany { rows } => write!(f, "held subject with {rows} rows"),
            Action::RelayJoin { relay, kind } => write!(f, "relay r{relay} joins ({kind:?})"),
            Action::RelayLeave { relay } => write!(f, "relay r{relay} leaves"),
            Action::RelayKill { relay } => write!(f, "relay r{relay} killed"),
            Action::RelayFreeze { relay, how, length } => {
                write!(f, "relay r{relay} frozen ({how:?}) for {}", secs(length))
            }
            Action::RelayPathFreeze {
                relay,
                path,
                length,
            } => write!(
                f,
                "relay r{relay}'s {path:?} path silent for {}",
                secs(length)
            ),
            Action::RelayPathCut { relay, path } => write!(f, "relay r{relay}'s {path:?} path cut"),
            Action::BrokerKill { node, down } => {
                write!(f, "broker {node:?} killed for {}", secs(down))
            }
            Action::BrokerFreeze { node, how, length } => {
                write!(f, "broker {node:?} frozen ({how:?}) for {}", secs(length))
            }
            Action::StepDown => write!(f, "stream leader steps down"),
            Action::PgRestart { immediate, down } => write!(
                f,
                "postgres {} restart, down {}",
                if *immediate { "immediate" } else { "fast" },
                secs(down)
            ),
            Action::PgKillConnections => write!(f, "postgres terminates the relay role's backends"),
            Action::PgRevokeLocks { length } => {
                write!(
                    f,
                    "select on pg_locks revoked from public for {}",
                    secs(length)
                )
            }
            Action::Intrude { how, length } => {
                write!(f, "another role: {how:?} for {}", secs(length))
            }
        }
    }
}

/// Draws the schedule of `seed`.
pub fn generate(seed: u64, settings: &Settings) -> Schedule {
    let root = Rng::new(seed);
    let mut shape = root.fork("shape");
    let drawn_topology = if shape.chance(0.5) {
        Topology::Single
    } else {
        Topology::Cluster
    };
    let lanes = shape.pick(&[1, 2]);
    let retention = RetentionPlan::draw(root.fork("retention"), settings.duration);
    let consumers = ConsumerPlan::draw(root.fork("consumers"), settings.duration);
    let mut draft = Draft {
        seed,
        root,
        settings: settings.clone(),
        topology: settings.topology.unwrap_or(drawn_topology),
        lanes,
        writers: Vec::new(),
        ops: Vec::new(),
        duration: settings.duration,
        poisons: 0,
        transactions: 0,
    };
    match settings.focus {
        None => draft.everything(),
        Some(Focus::Reorder) => draft.reorder(),
        Some(Focus::Lane) => draft.lane(),
        Some(Focus::Late) => draft.late(),
        Some(Focus::Freeze) => draft.freeze(),
        Some(Focus::Idle) => draft.idle(),
    }
    if let Some(rows) = settings.held_rows {
        let at = draft.root.fork("held-many").secs(2, 5);
        draft.push(at, Action::HeldMany { rows });
    }
    draft.finish(retention, consumers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_draws_one_schedule_and_another_seed_another() {
        let settings = Settings::default();
        let a = generate(7, &settings);
        assert_eq!(a, generate(7, &settings));
        assert_eq!(a.digest(), generate(7, &settings).digest());
        assert_ne!(a.digest(), generate(8, &settings).digest());
        assert!(a.ops.windows(2).all(|w| w[0].at <= w[1].at));
    }

    #[test]
    fn schedules_draw_every_kind_of_operation_over_a_few_seeds() {
        let settings = Settings {
            topology: Some(Topology::Cluster),
            ..Settings::default()
        };
        let mut seen = std::collections::BTreeSet::new();
        let mut kinds = std::collections::BTreeSet::new();
        let mut intrusions = std::collections::BTreeSet::new();
        for seed in 0..40 {
            let s = generate(seed, &settings);
            for op in &s.ops {
                let name = format!("{:?}", op.action);
                seen.insert(name.split([' ', '{']).next().unwrap().to_owned());
                if let Action::Poison { kind, .. } = op.action {
                    kinds.insert(format!("{kind:?}"));
                }
                if let Action::Intrude { how, .. } = op.action {
                    intrusions.insert(format!("{how:?}"));
                }
            }
            for w in &s.writers {
                for e in &w.emits {
                    seen.insert(
                        format!("{:?}", e.shape)
                            .split('(')
                            .next()
                            .unwrap()
                            .to_owned(),
                    );
                }
            }
        }
        for expected in [
            "Transaction",
            "Poison",
            "Repair",
            "Unblock",
            "RelayJoin",
            "RelayLeave",
            "RelayKill",
            "RelayFreeze",
            "RelayPathFreeze",
            "RelayPathCut",
            "BrokerKill",
            "BrokerFreeze",
            "StepDown",
            "PgRestart",
            "PgKillConnections",
            "PgRevokeLocks",
            "Intrude",
            "Plain",
            "SleepBefore",
            "SleepAfter",
            "Prepared",
            "RolledBack",
        ] {
            assert!(
                seen.contains(expected),
                "no {expected} in 40 seeds: {seen:?}"
            );
        }
        assert_eq!(kinds.len(), PoisonKind::ALL.len(), "{kinds:?}");
        assert_eq!(intrusions.len(), Intrusion::ALL.len(), "{intrusions:?}");
    }

    #[test]
    fn a_relay_slot_is_never_given_an_operation_while_it_has_no_relay() {
        for seed in 0..200 {
            let s = generate(seed, &Settings::default());
            let mut running = [false; RELAY_SLOTS];
            for op in &s.ops {
                match op.action {
                    Action::RelayJoin { relay, .. } => {
                        assert!(!running[relay], "seed {seed}: r{relay} joins twice");
                        running[relay] = true;
                    }
                    Action::RelayLeave { relay } | Action::RelayKill { relay } => {
                        assert!(running[relay], "seed {seed}: r{relay} is not running");
                        running[relay] = false;
                    }
                    Action::RelayFreeze { relay, .. }
                    | Action::RelayPathFreeze { relay, .. }
                    | Action::RelayPathCut { relay, .. } => {
                        assert!(running[relay], "seed {seed}: r{relay} is not running")
                    }
                    _ => {}
                }
            }
        }
    }
}
