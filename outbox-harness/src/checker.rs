//! The checker: the run's history and its final state (the table, the retry schedule, every
//! stream) against the relay's promises, one property at a time. docs/harness.md states each
//! property and its bound exactly; this is that text in code.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use futures::TryStreamExt;
use outbox_runtime::RelayConfig;
use uuid::Uuid;

use crate::history::{
    since, EventRecord, Fault, Outcome, PoisonRecord, Recorded, RelayEnd, Role, Time,
};
use crate::relays::BACKOFF_MAX;
use crate::schedule::{FreezeHow, Insert, Path};
use crate::servers::Servers;
use crate::workload::HELD_MANY_SUBJECT;

/// A promise of the relay the checker verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Property {
    /// Every committed, publishable event is in a stream within its bound.
    Delivered,
    /// No event in a stream that was rolled back or never committed.
    CommittedOnly,
    /// Per subject of a sequential writer, the stream holds a prefix of its committed events,
    /// in emit order.
    Order,
    /// No row is marked published that no stream holds.
    Marks,
    /// The poison rows are held with a reason, and nothing else is.
    Held,
    /// No relay ended unless the harness stopped or killed it, and stops came in time.
    RelaysAlive,
    /// No attempt was spent where no publish could have reached the broker.
    Attempts,
    /// A frozen relay's sessions let go of their locks in time.
    LocksReleased,
}

impl Property {
    /// Every property, in the order the report gives them.
    pub const ALL: [Property; 8] = [
        Property::Delivered,
        Property::CommittedOnly,
        Property::Order,
        Property::Marks,
        Property::Held,
        Property::RelaysAlive,
        Property::Attempts,
        Property::LocksReleased,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Property::Delivered => "delivered",
            Property::CommittedOnly => "committed-only",
            Property::Order => "order",
            Property::Marks => "marks",
            Property::Held => "held",
            Property::RelaysAlive => "relays-alive",
            Property::Attempts => "attempts",
            Property::LocksReleased => "locks-released",
        }
    }
}

impl fmt::Display for Property {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One violation, with what the report needs to quote the history it concerns.
#[derive(Debug, Clone)]
pub struct Violation {
    /// The property.
    pub property: Property,
    /// What is wrong, in words.
    pub what: String,
    /// The subjects whose events the report shows.
    pub subjects: Vec<String>,
    /// Further events the report shows.
    pub ids: Vec<Uuid>,
    /// The time span whose faults and relay events the report shows.
    pub span: Option<(Time, Time)>,
}

/// The bounds the checker holds the relay to, all derived from the relay's documented
/// timeouts (docs/harness.md, *The bound*).
#[derive(Debug, Clone)]
pub struct Bounds {
    /// B: how long a healthy relay may take to publish a committed row it was told of.
    pub steady: Duration,
    /// The relays' `poll_interval`: a row written by a plain insert notifies nobody.
    pub poll: Duration,
    /// How often a lane looks below its floor while subjects are parked (6 × `poll_interval`):
    /// the documented wait of a row whose `created_at` was written by hand in the past.
    pub sweep: Duration,
    /// R: how long after a fault heals the relay may take to be back (a NATS reconnect's
    /// delay, one `ack_timeout`, a lane's longest pause after failed batches).
    pub recovery: Duration,
    /// T: how long a fault of one relay may hold its subjects while another relay is up (the
    /// batch's locks, `ack_timeout` + 5 s, then the 5 s heartbeat lease and a beat).
    pub takeover: Duration,
    /// The relays' `backoff_base` and `backoff_max`: a row that spent attempts waits its
    /// backoff.
    pub backoff_base: Duration,
    /// See `backoff_base`.
    pub backoff_max: Duration,
    /// How long a graceful stop may take (`ack_timeout` + 15 s, and 10 s of margin).
    pub stop: Duration,
    /// How long a frozen relay's sessions may keep a lock (`ack_timeout` + 5 s, and 5 s of
    /// margin).
    pub locks: Duration,
    /// How long after a freeze ends an attempt it caused may still be counted (`ack_timeout`
    /// + 5 s).
    pub attempt_tail: Duration,
    /// Whether a silent NATS path or a frozen broker must cost no attempt either (the goal of
    /// issue 30; the spec today lets a deadline missed while the connection looked up count
    /// as a failure).
    pub strict_attempts: bool,
}

impl Bounds {
    /// The bounds with `steady` as B, for relays configured as [`crate::relays::relay_config`].
    pub fn new(steady: Duration, strict_attempts: bool) -> Bounds {
        let config = RelayConfig::default();
        let ack = config.ack_timeout;
        Bounds {
            steady,
            poll: config.poll_interval,
            sweep: config.poll_interval * 6,
            recovery: Duration::from_secs(4) + ack + Duration::from_secs(1),
            takeover: ack + Duration::from_secs(5) + Duration::from_secs(6),
            backoff_base: config.backoff_base,
            backoff_max: BACKOFF_MAX,
            stop: ack + Duration::from_secs(15) + Duration::from_secs(10),
            locks: ack + Duration::from_secs(5) + Duration::from_secs(5),
            attempt_tail: ack + Duration::from_secs(5),
            strict_attempts,
        }
    }

    fn backoff(&self, attempts: i32) -> Duration {
        if attempts <= 0 {
            return Duration::ZERO;
        }
        let factor = 1u32 << (attempts - 1).min(20) as u32;
        (self.backoff_base * factor).min(self.backoff_max)
    }
}

/// A row of `outbox_events` at the end.
#[derive(Debug, Clone)]
pub struct Row {
    /// Its subject.
    pub subject: String,
    /// `created_at` as text (it may be no real instant).
    pub created_at: String,
    /// When it was marked published.
    pub published_at: Option<Time>,
    /// Its attempts.
    pub attempts: i32,
}

/// A row of `outbox_retries` at the end.
#[derive(Debug, Clone)]
pub struct Retry {
    /// The parked subject.
    pub subject: String,
    /// Its head.
    pub event_id: Uuid,
    /// When it is tried again; `None`: held.
    pub retry_at: Option<Time>,
    /// Why.
    pub reason: String,
}

/// A message of a stream.
#[derive(Debug, Clone)]
pub struct Message {
    /// The stream.
    pub stream: String,
    /// Its sequence there.
    pub seq: u64,
    /// Its `Nats-Msg-Id`.
    pub msg_id: String,
    /// The envelope's id.
    pub id: Uuid,
    /// The envelope's subject (the entity).
    pub subject: String,
    /// When the stream stored it.
    pub stored_at: Time,
}

/// The final state: read once the relays have stopped.
#[derive(Debug, Clone)]
pub struct Final {
    /// Every row, by id.
    pub rows: HashMap<Uuid, Row>,
    /// The retry schedule.
    pub retries: Vec<Retry>,
    /// Every stream's messages.
    pub messages: Vec<Message>,
    /// When it was read.
    pub at: Time,
}

impl Final {
    /// Reads the table, the retry schedule and every stream.
    pub async fn read(servers: &Servers) -> Final {
        type RowTuple = (Uuid, String, String, Option<Time>, i32);
        let rows: Vec<RowTuple> = sqlx::query_as(
            "select id, subject, created_at::text, published_at, attempts from outbox_events",
        )
        .fetch_all(&servers.admin)
        .await
        .expect("read outbox_events");
        let retries: Vec<(String, Uuid, Option<Time>, String)> =
            sqlx::query_as("select subject, event_id, retry_at, reason from outbox_retries")
                .fetch_all(&servers.admin)
                .await
                .expect("read outbox_retries");
        let names: Vec<String> = servers
            .js
            .stream_names()
            .try_collect()
            .await
            .expect("list the streams");
        let mut messages = Vec::new();
        for name in names {
            for d in outbox_testkit::read_stream(&servers.js, &name).await {
                messages.push(Message {
                    stream: name.clone(),
                    seq: d.seq,
                    msg_id: d.msg_id,
                    id: d.envelope.id,
                    subject: d.envelope.subject,
                    stored_at: d.stored_at,
                });
            }
        }
        Final {
            rows: rows
                .into_iter()
                .map(|(id, subject, created_at, published_at, attempts)| {
                    (
                        id,
                        Row {
                            subject,
                            created_at,
                            published_at,
                            attempts,
                        },
                    )
                })
                .collect(),
            retries: retries
                .into_iter()
                .map(|(subject, event_id, retry_at, reason)| Retry {
                    subject,
                    event_id,
                    retry_at,
                    reason,
                })
                .collect(),
            messages,
            at: chrono::Utc::now(),
        }
    }
}

/// A window in which the relay is excused from publishing in time, and why.
#[derive(Debug, Clone)]
struct Excuse {
    start: Time,
    end: Time,
}

fn add(t: Time, d: Duration) -> Time {
    t + chrono::Duration::from_std(d).expect("a short duration")
}

/// The judge of one run.
#[derive(Debug)]
pub struct Checker<'a> {
    rec: &'a Recorded,
    fin: &'a Final,
    bounds: &'a Bounds,
    /// When everything had healed (the schedule's end).
    healed: Time,
    /// The run's time zero, for the report's times.
    origin: Time,
    /// First appearance of each id in any stream: (stored at, stream, seq).
    first: HashMap<Uuid, (Time, String, u64)>,
}

impl<'a> Checker<'a> {
    /// A checker of `rec` and `fin`; `origin` is the run's time zero, `healed` when its last
    /// fault healed.
    pub fn new(
        rec: &'a Recorded,
        fin: &'a Final,
        bounds: &'a Bounds,
        origin: Time,
        healed: Time,
    ) -> Self {
        let mut first: HashMap<Uuid, (Time, String, u64)> = HashMap::new();
        for m in &fin.messages {
            let candidate = (m.stored_at, m.stream.clone(), m.seq);
            first
                .entry(m.id)
                .and_modify(|f| {
                    if candidate < *f {
                        *f = candidate.clone();
                    }
                })
                .or_insert(candidate);
        }
        Checker {
            rec,
            fin,
            bounds,
            healed,
            origin,
            first,
        }
    }

    /// Every violation, property by property.
    pub fn check(&self) -> Vec<Violation> {
        let mut out = Vec::new();
        out.extend(self.delivered());
        out.extend(self.committed_only());
        out.extend(self.order());
        out.extend(self.marks());
        out.extend(self.held());
        out.extend(self.relays_alive());
        out.extend(self.attempts());
        out.extend(self.locks_released());
        out
    }

    fn poison(&self, id: usize) -> Option<&PoisonRecord> {
        self.rec.poisons.iter().find(|p| p.id == id)
    }

    /// When event `e` became publishable, or `None` if it never did (not committed, a poison
    /// row not repaired, or behind one).
    fn ready(&self, e: &EventRecord) -> Option<Time> {
        let id = e.id?;
        self.fin.rows.get(&id)?;
        let committed = match &e.outcome {
            Outcome::Committed(t) | Outcome::Unknown(t, _) | Outcome::Failed(t, _) => *t,
            Outcome::RolledBack(t) => *t,
            Outcome::Pending => self.healed,
        };
        match e.role {
            Role::Healthy => Some(committed),
            Role::Poison(p) => {
                let poison = self.poison(p)?;
                match poison.repaired {
                    Some(r) => Some(r.max(committed)),
                    // a row the relay may publish or hold: unless held, it is to be published
                    None if !poison.kind.held_by_spec() && !self.is_held(id) => Some(committed),
                    None => None,
                }
            }
            Role::Follower(p) => {
                let poison = self.poison(p)?;
                let head_in = poison.head.is_some_and(|h| self.fin.rows.contains_key(&h));
                match (head_in, poison.repaired) {
                    (false, _) => Some(committed),
                    (true, Some(r)) => Some(r.max(committed)),
                    (true, None) => None,
                }
            }
            Role::HeldMany => None,
        }
    }

    /// Whether the row is held at the end.
    fn is_held(&self, id: Uuid) -> bool {
        self.fin
            .retries
            .iter()
            .any(|r| r.event_id == id && r.retry_at.is_none())
    }

    /// The windows that excuse a late publish: every fault, until it healed and the relay had
    /// `recovery` to be back; a fault of one relay while another was up, only until the others
    /// take its subjects (`takeover`); and every span with no healthy relay.
    fn excuses(&self) -> Vec<Excuse> {
        let b = self.bounds;
        let mut out = Vec::new();
        for f in &self.rec.faults {
            let end = f.end.unwrap_or(self.healed);
            let healed = add(end, b.recovery);
            let until = match f.fault.relay() {
                Some(slot) if self.healthy_other(slot, f.start) => {
                    healed.min(add(f.start, b.takeover))
                }
                _ => healed,
            };
            out.push(Excuse {
                start: f.start,
                end: until,
            });
        }
        // spans without a healthy relay, from the run's start
        let mut points: Vec<Time> =
            vec![self.rec.relays.first().map_or(self.healed, |r| r.spawned)];
        for r in &self.rec.relays {
            points.extend(r.ready);
            points.extend(r.ended.as_ref().map(|(t, _)| *t));
        }
        for f in &self.rec.faults {
            points.push(f.start);
            points.extend(f.end);
        }
        points.push(self.fin.at);
        points.sort();
        points.dedup();
        let mut gap_start: Option<Time> = None;
        for pair in points.windows(2) {
            let mid = pair[0] + (pair[1] - pair[0]) / 2;
            let none = !(0..crate::schedule::RELAY_SLOTS).any(|s| self.healthy(s, mid));
            match (none, gap_start) {
                (true, None) => gap_start = Some(pair[0]),
                (false, Some(start)) => {
                    out.push(Excuse {
                        start,
                        end: add(pair[0], b.recovery),
                    });
                    gap_start = None;
                }
                _ => {}
            }
        }
        if let Some(start) = gap_start {
            out.push(Excuse {
                start,
                end: self.fin.at,
            });
        }
        out
    }

    /// Whether a relay was up in `slot` at `t`, and no fault of that relay was on.
    fn healthy(&self, slot: usize, t: Time) -> bool {
        let up = self.rec.relays.iter().any(|r| {
            r.slot == slot
                && r.ready.is_some_and(|ready| ready <= t)
                && r.ended.as_ref().is_none_or(|(end, _)| *end > t)
        });
        up && !self.rec.faults.iter().any(|f| {
            f.fault.relay() == Some(slot)
                && !matches!(f.fault, Fault::RelayPathCut(..))
                && f.start <= t
                && f.end.is_none_or(|end| end >= t)
        })
    }

    fn healthy_other(&self, slot: usize, t: Time) -> bool {
        (0..crate::schedule::RELAY_SLOTS).any(|s| s != slot && self.healthy(s, t))
    }

    /// The most attempts of a row of `subject` (poison rows aside).
    fn subject_attempts(&self) -> HashMap<&str, i32> {
        let poison: HashSet<Uuid> = self.rec.poisons.iter().filter_map(|p| p.head).collect();
        let mut most: HashMap<&str, i32> = HashMap::new();
        for (id, row) in &self.fin.rows {
            if row.attempts > 0 && !poison.contains(id) {
                let m = most.entry(row.subject.as_str()).or_default();
                *m = (*m).max(row.attempts);
            }
        }
        most
    }

    /// P1: every committed, publishable event is in a stream by its deadline.
    fn delivered(&self) -> Vec<Violation> {
        let b = self.bounds;
        let excuses = self.excuses();
        let attempts = self.subject_attempts();
        let mut out = Vec::new();
        for e in &self.rec.events {
            let (Some(id), Some(ready)) = (e.id, self.ready(e)) else {
                continue;
            };
            let mut base = b.steady;
            if matches!(e.insert, Insert::Raw(_)) {
                base += b.poll; // a plain insert notifies nobody
            }
            if matches!(e.insert, Insert::Raw(c) if c.by_hand_in_past()) {
                base += b.sweep;
            }
            base += b.backoff(attempts.get(e.subject.as_str()).copied().unwrap_or(0));
            let mut deadline = add(ready, base);
            loop {
                let mut moved = false;
                for x in &excuses {
                    if x.start < deadline && x.end > ready && add(x.end, base) > deadline {
                        deadline = add(x.end, base);
                        moved = true;
                    }
                }
                if !moved {
                    break;
                }
            }
            let span = Some((ready, deadline.max(ready)));
            match self.first.get(&id) {
                Some((at, _, _)) if *at <= deadline => {}
                Some((at, stream, seq)) => out.push(Violation {
                    property: Property::Delivered,
                    what: format!(
                        "{} ({id}, subject {}) publishable at {:+.1} s, deadline {:+.1} s (allowance {:.0} s), stored in {stream} #{seq} at {:+.1} s: {:.1} s late",
                        e.label,
                        e.subject,
                        since(self.origin, ready),
                        since(self.origin, deadline),
                        base.as_secs_f64(),
                        since(self.origin, *at),
                        (*at - deadline).num_milliseconds() as f64 / 1000.0
                    ),
                    subjects: vec![e.subject.clone()],
                    ids: vec![id],
                    span,
                }),
                None => {
                    let row = &self.fin.rows[&id];
                    let parked = self
                        .fin
                        .retries
                        .iter()
                        .find(|r| r.subject == e.subject)
                        .map_or("its subject is not parked".to_owned(), |r| {
                            format!(
                                "its subject is parked ({}) behind {}: {}",
                                r.retry_at.map_or("held".to_owned(), |t| format!(
                                    "retry at {:+.1} s",
                                    since(self.origin, t)
                                )),
                                r.event_id,
                                r.reason
                            )
                        });
                    out.push(Violation {
                        property: Property::Delivered,
                        what: format!(
                            "{} ({id}, subject {}) publishable at {:+.1} s, deadline {:+.1} s, is in no stream at the end ({:+.1} s); the row: published_at {}, attempts {}; {parked}",
                            e.label,
                            e.subject,
                            since(self.origin, ready),
                            since(self.origin, deadline),
                            since(self.origin, self.fin.at),
                            row.published_at.map_or("null".to_owned(), |t| format!("{:+.1} s", since(self.origin, t))),
                            row.attempts
                        ),
                        subjects: vec![e.subject.clone()],
                        ids: vec![id],
                        span,
                    });
                }
            }
        }
        out
    }

    /// P2: every message is of a committed row, and none of a rolled-back event.
    fn committed_only(&self) -> Vec<Violation> {
        let by_id: HashMap<Uuid, &EventRecord> = self
            .rec
            .events
            .iter()
            .filter_map(|e| e.id.map(|id| (id, e)))
            .collect();
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for m in &self.fin.messages {
            if self.fin.rows.contains_key(&m.id) || !seen.insert(m.id) {
                continue;
            }
            let what = match by_id.get(&m.id) {
                Some(e) => format!(
                    "{} ({}, subject {}) is in {} #{} but was never committed: {:?}",
                    e.label, m.id, m.subject, m.stream, m.seq, e.outcome
                ),
                None => format!(
                    "{} #{} holds {} (subject {}), which no writer wrote and the table does not have",
                    m.stream, m.seq, m.id, m.subject
                ),
            };
            out.push(Violation {
                property: Property::CommittedOnly,
                what,
                subjects: vec![m.subject.clone()],
                ids: vec![m.id],
                span: None,
            });
        }
        out
    }

    /// P3: per subject of a sequential writer (and of a poison row with its followers), the
    /// stream holds a prefix of its committed events, in emit order.
    fn order(&self) -> Vec<Violation> {
        let mut sequences: BTreeMap<&str, Vec<(usize, Uuid, &str)>> = BTreeMap::new();
        for e in &self.rec.events {
            if let (Some((_, seq)), Some(id)) = (e.writer, e.id) {
                if self.fin.rows.contains_key(&id) {
                    sequences.entry(e.subject.as_str()).or_default().push((
                        seq,
                        id,
                        e.label.as_str(),
                    ));
                }
            }
        }
        let mut streamed: HashMap<&str, Vec<(Time, &str, u64, Uuid)>> = HashMap::new();
        for m in &self.fin.messages {
            streamed.entry(m.subject.as_str()).or_default().push((
                m.stored_at,
                m.stream.as_str(),
                m.seq,
                m.id,
            ));
        }
        let mut out = Vec::new();
        for (subject, mut emitted) in sequences {
            emitted.sort_by_key(|(seq, _, _)| *seq);
            let mut messages = streamed.remove(subject).unwrap_or_default();
            messages.sort();
            let mut stream_order = Vec::new();
            let mut seen = HashSet::new();
            for (_, _, _, id) in messages {
                if seen.insert(id) {
                    stream_order.push(id);
                }
            }
            let expected: Vec<Uuid> = emitted.iter().map(|(_, id, _)| *id).collect();
            let label = |id: &Uuid| {
                emitted
                    .iter()
                    .find(|(_, i, _)| i == id)
                    .map_or(id.to_string(), |(_, _, l)| (*l).to_owned())
            };
            let in_stream: Vec<&Uuid> = stream_order
                .iter()
                .filter(|id| expected.contains(id))
                .collect();
            for (k, got) in in_stream.iter().enumerate() {
                if **got == expected[k] {
                    continue;
                }
                let want = expected[k];
                let what = if in_stream.contains(&&want) {
                    format!(
                        "subject {subject}: the stream has {} before {}, emitted (and committed) in the other order; stream order: [{}]",
                        label(got),
                        label(&want),
                        in_stream.iter().map(|id| label(id)).collect::<Vec<_>>().join(", ")
                    )
                } else {
                    format!(
                        "subject {subject}: the stream has {} while {}, emitted and committed before it, is not in the stream (a gap)",
                        label(got),
                        label(&want)
                    )
                };
                out.push(Violation {
                    property: Property::Order,
                    what,
                    subjects: vec![subject.to_owned()],
                    ids: Vec::new(),
                    span: None,
                });
                break;
            }
        }
        out
    }

    /// P4: every row marked published is in a stream.
    fn marks(&self) -> Vec<Violation> {
        let in_streams: HashSet<&str> = self
            .fin
            .messages
            .iter()
            .map(|m| m.msg_id.as_str())
            .collect();
        let mut out = Vec::new();
        for (id, row) in &self.fin.rows {
            if let Some(at) = row.published_at {
                if !in_streams.contains(id.to_string().as_str()) {
                    out.push(Violation {
                        property: Property::Marks,
                        what: format!(
                            "{id} (subject {}) is marked published at {:+.1} s and no stream holds a message with its Nats-Msg-Id",
                            row.subject,
                            since(self.origin, at)
                        ),
                        subjects: vec![row.subject.clone()],
                        ids: vec![*id],
                        span: Some((at, at)),
                    });
                }
            }
        }
        out
    }

    /// P5: each poison row not repaired is held (a retry schedule row with no retry time and
    /// a reason), and no other row is held.
    fn held(&self) -> Vec<Violation> {
        let held: HashMap<Uuid, &Retry> = self
            .fin
            .retries
            .iter()
            .filter(|r| r.retry_at.is_none())
            .map(|r| (r.event_id, r))
            .collect();
        let mut out = Vec::new();
        let mut expected = HashSet::new();
        for p in &self.rec.poisons {
            let Some(head) = p.head.filter(|h| self.fin.rows.contains_key(h)) else {
                continue;
            };
            if p.repaired.is_some() {
                continue;
            }
            expected.insert(head);
            let published =
                self.first.contains_key(&head) || self.fin.rows[&head].published_at.is_some();
            if !p.kind.held_by_spec() && !held.contains_key(&head) {
                if !published {
                    out.push(Violation {
                        property: Property::Held,
                        what: format!(
                            "p{} ({:?}), {head}, is neither published nor held (created_at {}, attempts {})",
                            p.id, p.kind, self.fin.rows[&head].created_at, self.fin.rows[&head].attempts
                        ),
                        subjects: vec![p.subject.clone()],
                        ids: vec![head],
                        span: None,
                    });
                }
                continue;
            }
            let row = &self.fin.rows[&head];
            let label = if p.rows_behind > 0 {
                format!(
                    "the head of {} ({} rows behind it)",
                    p.subject, p.rows_behind
                )
            } else {
                format!("p{} ({:?})", p.id, p.kind)
            };
            let problem = match held.get(&head) {
                Some(r) if r.reason.trim().is_empty() => Some("is held with no reason".to_owned()),
                Some(_) => None,
                None if published => Some("was published instead of held".to_owned()),
                None => Some(
                    match self.fin.retries.iter().find(|r| r.subject == p.subject) {
                        Some(r) => format!(
                            "is not held: its subject backs off (retry at {:+.1} s) behind {}: {}",
                            r.retry_at.map_or(0.0, |t| since(self.origin, t)),
                            r.event_id,
                            r.reason
                        ),
                        None => format!(
                        "is not held, and nothing parks its subject (created_at {}, attempts {})",
                        row.created_at, row.attempts
                    ),
                    },
                ),
            };
            if let Some(problem) = problem {
                out.push(Violation {
                    property: Property::Held,
                    what: format!("{label}, {head}, {problem}"),
                    subjects: vec![p.subject.clone()],
                    ids: vec![head],
                    span: None,
                });
            }
        }
        for (id, r) in &held {
            if !expected.contains(id) {
                out.push(Violation {
                    property: Property::Held,
                    what: format!(
                        "{id} (subject {}) is held and is no unrepaired poison row: {}",
                        r.subject, r.reason
                    ),
                    subjects: vec![r.subject.clone()],
                    ids: vec![*id],
                    span: None,
                });
            }
        }
        out
    }

    /// P6: no relay ended unless stopped or killed, and every stop returned within its bound.
    fn relays_alive(&self) -> Vec<Violation> {
        let mut out = Vec::new();
        for r in &self.rec.relays {
            let Some((at, end)) = &r.ended else { continue };
            let what = match end {
                RelayEnd::Died(why) => format!(
                    "relay {} ({:?}) ended at {:+.1} s without being asked to: {why}",
                    r.name(),
                    r.kind,
                    since(self.origin, *at)
                ),
                RelayEnd::StopLate(why) => format!(
                    "relay {} ({:?}), asked to stop, did not stop cleanly within {:.0} s: {why}",
                    r.name(),
                    r.kind,
                    self.bounds.stop.as_secs_f64()
                ),
                _ => continue,
            };
            out.push(Violation {
                property: Property::RelaysAlive,
                what,
                subjects: Vec::new(),
                ids: Vec::new(),
                span: Some((r.spawned, *at)),
            });
        }
        out
    }

    /// Whether fault `f` may cost attempts: a broker that stops answering while the
    /// connection looks up, a relay's silent NATS path, a frozen relay (its deadlines pass
    /// while it sleeps). Strictly, only the frozen relay.
    fn may_spend(&self, f: Fault) -> bool {
        match f {
            Fault::RelayFrozen(..) => true,
            Fault::BrokerFrozen(..) | Fault::RelayPathFrozen(_, Path::Nats) => {
                !self.bounds.strict_attempts
            }
            _ => false,
        }
    }

    /// P7: a row that is not a poison row has `attempts = 0` unless, between its becoming
    /// publishable and its first publish, a fault that may cost attempts was on (or had ended
    /// less than `attempt_tail` before).
    fn attempts(&self) -> Vec<Violation> {
        let by_id: HashMap<Uuid, &EventRecord> = self
            .rec
            .events
            .iter()
            .filter_map(|e| e.id.map(|id| (id, e)))
            .collect();
        let mut out = Vec::new();
        for (id, row) in &self.fin.rows {
            if row.attempts == 0 || row.subject == HELD_MANY_SUBJECT {
                continue;
            }
            let Some(e) = by_id.get(id) else { continue };
            let Some(ready) = self.ready(e) else { continue };
            let until = self.first.get(id).map_or(self.fin.at, |(t, _, _)| *t);
            let excused = self.rec.faults.iter().any(|f| {
                self.may_spend(f.fault)
                    && f.start <= until
                    && add(f.end.unwrap_or(self.healed), self.bounds.attempt_tail) >= ready
            });
            if !excused {
                out.push(Violation {
                    property: Property::Attempts,
                    what: format!(
                        "{} ({id}, subject {}) spent {} attempt(s) between {:+.1} s and {:+.1} s, when no fault that may cost one was on{}",
                        e.label,
                        row.subject,
                        row.attempts,
                        since(self.origin, ready),
                        since(self.origin, until),
                        if self.bounds.strict_attempts { " (strict: only a frozen relay may)" } else { "" }
                    ),
                    subjects: vec![row.subject.clone()],
                    ids: vec![*id],
                    span: Some((ready, until)),
                });
            }
        }
        out
    }

    /// P8: no lock is seen held by a frozen relay's session longer than `locks` after its
    /// freeze began.
    fn locks_released(&self) -> Vec<Violation> {
        let mut worst: BTreeMap<(String, i32, String), (Time, Time, Time)> = BTreeMap::new();
        for s in &self.rec.locks {
            if s.at - s.frozen_since < chrono::Duration::from_std(self.bounds.locks).expect("short")
            {
                continue;
            }
            let key = (s.relay.clone(), s.pid, s.lock.clone());
            let e = worst.entry(key).or_insert((s.frozen_since, s.at, s.at));
            e.1 = e.1.min(s.at);
            e.2 = e.2.max(s.at);
        }
        worst
            .into_iter()
            .map(|((relay, pid, lock), (since_t, first, last))| Violation {
                property: Property::LocksReleased,
                what: format!(
                    "relay {relay}, frozen since {:+.1} s: its session (pid {pid}) still held {lock} {:.1} s into the freeze, and at {:+.1} s (bound {:.0} s)",
                    since(self.origin, since_t),
                    (last - since_t).num_milliseconds() as f64 / 1000.0,
                    since(self.origin, last),
                    self.bounds.locks.as_secs_f64()
                ),
                subjects: Vec::new(),
                ids: Vec::new(),
                span: Some((since_t, first)),
            })
            .collect()
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
        }
    }
}
