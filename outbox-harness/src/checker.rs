//! The checker: the run's history and its final state (the table, the retry schedule, every
//! stream) against the relay's promises, one property at a time. docs/harness.md states each
//! property and its bound exactly; this is that text in code.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use uuid::Uuid;

use crate::consumers::{Fate, CONSUMED_TYPE, STOP_BOUND};
use crate::history::{
    since, EventRecord, Fault, Outcome, PoisonRecord, Recorded, RelayEnd, Role, Time,
};
use crate::schedule::{Insert, Path, PoisonKind};
use crate::servers::RETENTION_ROLE;
use crate::workload::HELD_MANY_SUBJECT;

mod bound;
mod state;

pub use bound::Bounds;
use bound::{add, Timeline};

/// What a retention pass on a silent path may take beyond its interval and its statements'
/// bound before it fails: the pause after its last statement, the pool's 5 s to open a
/// connection, a busy machine.
const SILENCE_SLACK: std::time::Duration = std::time::Duration::from_secs(10);
pub use state::{Final, Message, Retry, Row};

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
    /// Only the retention task deleted rows, each published at least its keep before; its
    /// passes failed only around a Postgres outage, and it never panicked.
    Pruned,
    /// Every event of the consumer's type in the stream was applied once, or, if its handler
    /// fails it every time, given up into one dead letter and never applied.
    Consumed,
    /// No consumer replica ended unless the harness killed or stopped it, and stops came in
    /// time.
    ConsumersAlive,
}

impl Property {
    /// Every property, in the order the report gives them.
    pub const ALL: [Property; 11] = [
        Property::Delivered,
        Property::CommittedOnly,
        Property::Order,
        Property::Marks,
        Property::Held,
        Property::RelaysAlive,
        Property::Attempts,
        Property::LocksReleased,
        Property::Pruned,
        Property::Consumed,
        Property::ConsumersAlive,
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
            Property::Pruned => "pruned",
            Property::Consumed => "consumed",
            Property::ConsumersAlive => "consumers-alive",
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
        out.extend(self.pruned());
        out.extend(self.consumed());
        out.extend(self.consumers_alive());
        out
    }

    fn poison(&self, id: usize) -> Option<&PoisonRecord> {
        self.rec.poisons.iter().find(|p| p.id == id)
    }

    /// The row poison `p` stands for in the table: its head, or, when the head's insert left
    /// no row and its followers are of the same type no stream captures, the first follower
    /// in the table (held in its place, for the same cause).
    fn poison_head(&self, p: &PoisonRecord) -> Option<Uuid> {
        if self.fin.rows.contains_key(&p.head) {
            return Some(p.head);
        }
        if p.kind != PoisonKind::Uncaptured {
            return None;
        }
        self.rec
            .events
            .iter()
            .filter(|e| e.role == Role::Follower(p.id))
            .filter_map(|e| e.id)
            .find(|id| self.fin.rows.contains_key(id))
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
        let head = match e.role {
            Role::Poison(p) | Role::Follower(p) => self.poison(p).and_then(|p| self.poison_head(p)),
            Role::Healthy | Role::HeldMany => None,
        };
        let role = match e.role {
            Role::Follower(p) if head == Some(id) => Role::Poison(p),
            role => role,
        };
        match role {
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
                match (head.is_some(), poison.repaired) {
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

    /// The most attempts of a row of `subject` (poison rows aside).
    fn subject_attempts(&self) -> HashMap<&str, i32> {
        let poison: HashSet<Uuid> = self.rec.poisons.iter().map(|p| p.head).collect();
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
        let excuses = Timeline {
            rec: self.rec,
            bounds: self.bounds,
            healed: self.healed,
            end: self.fin.at,
        }
        .excuses();
        let attempts = self.subject_attempts();
        // the subjects with a row before the cursor (a BC row is one too): the sweep finds it,
        // and the newer rows of its subject wait for it
        let swept: HashSet<&str> = self
            .rec
            .events
            .iter()
            .filter(|e| {
                let bc = matches!(e.role, Role::Poison(p)
                    if self.poison(p).is_some_and(|p| p.kind == PoisonKind::CreatedAtBc));
                bc || matches!(e.insert, Insert::Raw(c) if c.by_hand_in_past())
            })
            .map(|e| e.subject.as_str())
            .collect();
        let mut out = Vec::new();
        for e in &self.rec.events {
            let (Some(id), Some(ready)) = (e.id, self.ready(e)) else {
                continue;
            };
            let mut base = b.steady;
            if matches!(e.insert, Insert::Raw(_)) {
                base += b.poll; // a plain insert notifies nobody
            }
            if swept.contains(e.subject.as_str()) {
                base += b.sweep;
            }
            base += b.backoff(attempts.get(e.subject.as_str()).copied().unwrap_or(0));
            let deadline = bound::deadline(ready, base, &excuses);
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
            // indexed: a burst writer's subject has thousands of events
            let labels: HashMap<Uuid, &str> = emitted.iter().map(|(_, id, l)| (*id, *l)).collect();
            let label = |id: &Uuid| labels.get(id).map_or(id.to_string(), |l| (*l).to_owned());
            let in_stream: Vec<&Uuid> = stream_order
                .iter()
                .filter(|id| labels.contains_key(id))
                .collect();
            for (k, got) in in_stream.iter().enumerate() {
                if **got == expected[k] {
                    continue;
                }
                let want = expected[k];
                let what = if in_stream.contains(&&want) {
                    // the stream order from the first difference, 20 events at most
                    let shown: Vec<String> =
                        in_stream[k..].iter().take(20).map(|id| label(id)).collect();
                    format!(
                        "subject {subject}: the stream has {} before {}, emitted (and committed) in the other order; stream order from there: [{}{}]",
                        label(got),
                        label(&want),
                        shown.join(", "),
                        if in_stream.len() - k > 20 { ", ..." } else { "" }
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
            let Some(head) = self.poison_head(p) else {
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

    /// P10: in a run with a consumer, each event of [`CONSUMED_TYPE`] in a stream was applied
    /// exactly once and has no dead letter, unless its fate is [`Fate::Doomed`]: then it has
    /// exactly one dead letter and was never applied. One whose fate is [`Fate::SlowToFail`]
    /// may end either way, not both. An event the stream holds more than once (published again
    /// past the duplicate window) is replayed by each copy after it gave up: one letter per
    /// copy at most. Nothing else was applied or dead-lettered.
    fn consumed(&self) -> Vec<Violation> {
        if self.rec.consumers.is_none() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut streamed: BTreeMap<Uuid, (&str, usize)> = BTreeMap::new();
        for m in &self.fin.messages {
            if m.event_type == CONSUMED_TYPE {
                streamed.entry(m.id).or_insert((&m.subject, 0)).1 += 1;
            }
        }
        let count = |counts: &HashMap<Uuid, usize>, id: &Uuid| counts.get(id).copied().unwrap_or(0);
        for (id, &(subject, copies)) in &streamed {
            let fate = Fate::of(*id);
            let (applied, letters) = (
                count(&self.fin.applied, id),
                count(&self.fin.dead_letters, id),
            );
            let expected = match fate {
                Fate::Doomed => "0 and 1",
                Fate::SlowToFail => "1 and 0, or 0 and 1",
                _ => "1 and 0",
            };
            let ok = match (applied, letters) {
                (0, 1..) => matches!(fate, Fate::Doomed | Fate::SlowToFail) && letters <= copies,
                (1, 0) => fate != Fate::Doomed,
                _ => false,
            };
            if !ok {
                out.push(Violation {
                    property: Property::Consumed,
                    what: format!(
                        "event {id} (subject {subject}, its handler's fate {fate:?}) was applied {applied} time(s) and has {letters} dead letter(s); expected {expected}"
                    ),
                    subjects: vec![subject.to_owned()],
                    ids: vec![*id],
                    span: None,
                });
            }
        }
        for (what, counts) in [
            ("applied", &self.fin.applied),
            ("dead-lettered", &self.fin.dead_letters),
        ] {
            for id in counts.keys().filter(|id| !streamed.contains_key(id)) {
                out.push(Violation {
                    property: Property::Consumed,
                    what: format!(
                        "event {id} was {what}, but no stream holds it as a {CONSUMED_TYPE}"
                    ),
                    subjects: Vec::new(),
                    ids: vec![*id],
                    span: None,
                });
            }
        }
        out
    }

    /// P11: no consumer replica ended unless the harness killed it or asked it to stop, and
    /// each asked stopped within [`STOP_BOUND`] (a `run` that failed at start is started again
    /// a second later, and is no violation).
    fn consumers_alive(&self) -> Vec<Violation> {
        let Some(c) = &self.rec.consumers else {
            return Vec::new();
        };
        let died = c.died.iter().map(|(at, n, why)| {
            (
                *at,
                format!(
                    "consumer replica {n} ended at {:+.1} s without being asked to: {why}",
                    since(self.origin, *at)
                ),
            )
        });
        let late = c.stopped_late.iter().map(|(at, n)| {
            (
                *at,
                format!(
                    "consumer replica {n}, asked to stop, had not stopped within {:.0} s",
                    STOP_BOUND.as_secs_f64()
                ),
            )
        });
        died.chain(late)
            .map(|(at, what)| Violation {
                property: Property::ConsumersAlive,
                what,
                subjects: Vec::new(),
                ids: Vec::new(),
                span: Some((at - chrono::Duration::seconds(10), at)),
            })
            .collect()
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
        // a poison row's attempts are its hold's (a type no stream captures, a message the
        // stream refuses: the broker's refusal counts), spent before its repair; P5 judges it
        let poison: HashSet<Uuid> = self.rec.poisons.iter().map(|p| p.head).collect();
        let mut out = Vec::new();
        for (id, row) in &self.fin.rows {
            if row.attempts == 0 || row.subject == HELD_MANY_SUBJECT || poison.contains(id) {
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

    /// P9: every deleted row was deleted by the retention task's role, published at least the
    /// task's keep before the delete (on the database's clock, as retention's cutoff); every
    /// failed pass of the task fell in a Postgres outage or a silence of its path, or within R
    /// after it; a silence longer than the task's interval, its statements' bound and
    /// [`SILENCE_SLACK`] saw a pass fail within that; the task did not panic.
    fn pruned(&self) -> Vec<Violation> {
        let mut out = Vec::new();
        let retention = self.rec.retention.as_ref();
        for (id, row) in &self.fin.rows {
            let Some((at, by)) = &row.pruned else {
                continue;
            };
            let why = match (retention, row.published_at) {
                _ if by != RETENTION_ROLE => format!("by role {by}, not {RETENTION_ROLE}"),
                (None, _) => "while the run had no retention task".to_owned(),
                (Some(_), None) => "while it was not published".to_owned(),
                (Some(r), Some(published)) => {
                    let age = *at - published;
                    if age >= chrono::Duration::from_std(r.keep).expect("short") {
                        continue;
                    }
                    format!(
                        "{:.3} s after it was published at {:+.1} s, under the keep of {:.3} s",
                        age.num_milliseconds() as f64 / 1000.0,
                        since(self.origin, published),
                        r.keep.as_secs_f64()
                    )
                }
            };
            out.push(Violation {
                property: Property::Pruned,
                what: format!(
                    "{id} (subject {}) was deleted at {:+.1} s {why}",
                    row.subject,
                    since(self.origin, *at)
                ),
                subjects: vec![row.subject.clone()],
                ids: vec![*id],
                span: Some((*at, *at)),
            });
        }
        let Some(r) = retention else { return out };
        for (at, why) in &r.failed {
            let outage = self.rec.faults.iter().any(|f| {
                matches!(f.fault, Fault::PgDown(_))
                    && f.start <= *at
                    && add(f.end.unwrap_or(self.healed), self.bounds.recovery) >= *at
            });
            let silence = r.silences.iter().any(|(start, end)| {
                *start <= *at && end.is_none_or(|end| add(end, self.bounds.recovery) >= *at)
            });
            let excused = outage || silence;
            if !excused {
                out.push(Violation {
                    property: Property::Pruned,
                    what: format!(
                        "a retention pass failed at {:+.1} s, with Postgres up: {why}",
                        since(self.origin, *at)
                    ),
                    subjects: Vec::new(),
                    ids: Vec::new(),
                    span: Some((*at, *at)),
                });
            }
        }
        // a silence longer than a pause, a statement's bound and some slack fails a pass
        // within it: nothing waits for an answer for good
        let bound = r.interval + outbox_runtime::retention::STATEMENT_ANSWER + SILENCE_SLACK;
        for (start, end) in &r.silences {
            let Some(end) = end else { continue };
            let by = add(*start, bound);
            if *end < by {
                continue;
            }
            if !r.failed.iter().any(|(at, _)| start <= at && *at <= by) {
                out.push(Violation {
                    property: Property::Pruned,
                    what: format!(
                        "retention's path was silent from {:+.1} s to {:+.1} s, and no pass failed within {:.1} s of its start",
                        since(self.origin, *start),
                        since(self.origin, *end),
                        bound.as_secs_f64()
                    ),
                    subjects: Vec::new(),
                    ids: Vec::new(),
                    span: Some((*start, *end)),
                });
            }
        }
        if let Some((at, why)) = &r.died {
            out.push(Violation {
                property: Property::Pruned,
                what: format!("the retention task panicked: {why}"),
                subjects: Vec::new(),
                ids: Vec::new(),
                span: Some((*at, *at)),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    //! Each property on a small history made by hand: one that keeps it, and one that breaks
    //! it, so that no property is a check that cannot fail.

    use std::time::Duration;

    use chrono::{TimeZone, Utc};

    use super::*;
    use crate::history::{ConsumerRecord, FaultRecord, LockSample, RelayRecord, RetentionRecord};
    use crate::schedule::{CreatedAt, FreezeHow, RelayKind, Shape};

    fn t(secs: f64) -> Time {
        Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap()
            + chrono::Duration::milliseconds((secs * 1000.0) as i64)
    }

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    /// A history with relay r0 up from 0 s to the end, and the final state read at 100 s.
    struct Case {
        rec: Recorded,
        fin: Final,
        bounds: Bounds,
    }

    /// Poison row 0 of `kind` on subject `p0`, its head `head`.
    fn poison_p0(kind: PoisonKind, head: Uuid, repaired: Option<Time>) -> PoisonRecord {
        PoisonRecord {
            id: 0,
            kind,
            subject: "p0".into(),
            head,
            repaired,
            unblocked: Vec::new(),
            rows_behind: 0,
        }
    }

    impl Case {
        fn new() -> Case {
            let mut rec = Recorded::default();
            rec.relays.push(relay(0, 0.0, None));
            Case {
                rec,
                fin: Final {
                    rows: HashMap::new(),
                    retries: Vec::new(),
                    messages: Vec::new(),
                    applied: HashMap::new(),
                    dead_letters: HashMap::new(),
                    at: t(100.0),
                },
                bounds: Bounds::new(Duration::from_secs(10), false, 0),
            }
        }

        /// Event `n` of writer 0 on `subject`, committed at `at`, its row published at `stored`
        /// (and stored then) if given.
        fn event(&mut self, n: u128, subject: &str, at: f64, stored: Option<f64>) {
            self.rec.events.push(EventRecord {
                label: format!("w0#{n}"),
                id: Some(id(n)),
                subject: subject.into(),
                event_type: "hx.account.changed".into(),
                insert: Insert::Emit,
                shape: Shape::Plain,
                writer: Some((0, n as usize)),
                role: Role::Healthy,
                began: t(at),
                outcome: Outcome::Committed(t(at)),
            });
            self.fin.rows.insert(
                id(n),
                Row {
                    subject: subject.into(),
                    created_at: String::new(),
                    published_at: stored.map(t),
                    attempts: 0,
                    pruned: None,
                },
            );
            if let Some(s) = stored {
                self.store(n, subject, s);
            }
        }

        fn store(&mut self, n: u128, subject: &str, at: f64) {
            let seq = self.fin.messages.len() as u64 + 1;
            self.fin.messages.push(Message {
                stream: "HX".into(),
                seq,
                msg_id: id(n).to_string(),
                id: id(n),
                subject: subject.into(),
                event_type: "hx.account.changed".into(),
                stored_at: t(at),
            });
        }

        fn fault(&mut self, fault: Fault, start: f64, end: f64) {
            self.rec.faults.push(FaultRecord {
                fault,
                start: t(start),
                end: Some(t(end)),
            });
        }

        fn check(&self) -> Vec<Violation> {
            Checker::new(&self.rec, &self.fin, &self.bounds, t(0.0), t(90.0)).check()
        }

        fn violated(&self) -> Vec<Property> {
            self.check().iter().map(|v| v.property).collect()
        }
    }

    fn relay(slot: usize, ready: f64, ended: Option<(f64, RelayEnd)>) -> RelayRecord {
        RelayRecord {
            slot,
            incarnation: 0,
            kind: RelayKind::Task,
            spawned: t(ready),
            ready: Some(t(ready)),
            ended: ended.map(|(at, end)| (t(at), end)),
        }
    }

    #[test]
    fn a_run_where_every_event_goes_out_at_once_keeps_every_property() {
        let mut case = Case::new();
        case.event(1, "s", 1.0, Some(1.1));
        case.event(2, "s", 2.0, Some(2.1));
        assert!(case.check().is_empty(), "{:?}", case.check());
    }

    #[test]
    fn delivered_holds_a_row_to_b_and_a_fault_stretches_it_until_the_relay_is_back() {
        let mut case = Case::new();
        case.event(1, "s", 1.0, Some(12.0));
        assert_eq!(
            case.violated(),
            [Property::Delivered],
            "11 s after its commit"
        );
        case.event(2, "t", 1.0, None);
        assert_eq!(case.check().len(), 2, "one late, one missing");

        let mut case = Case::new();
        case.event(1, "s", 1.0, Some(39.0));
        case.fault(Fault::BrokerDown(0), 0.5, 20.0);
        // 20 s + R (10 s) + B (10 s)
        assert!(case.check().is_empty(), "{:?}", case.check());
        case.fin.messages[0].stored_at = t(41.0);
        assert_eq!(case.violated(), [Property::Delivered]);
    }

    #[test]
    fn another_role_and_a_revoked_catalog_excuse_nothing() {
        for fault in [
            Fault::Intruder(crate::schedule::Intrusion::WakeLockShared),
            Fault::Intruder(crate::schedule::Intrusion::Flood),
            Fault::LocksRevoked,
        ] {
            let mut case = Case::new();
            case.fault(fault, 0.5, 30.0);
            case.event(1, "s", 1.0, Some(10.5));
            assert!(case.check().is_empty(), "{fault:?}: {:?}", case.check());
            // 12 s after its commit, during the fault: as late as without it
            case.fin.messages[0].stored_at = t(13.0);
            assert_eq!(case.violated(), [Property::Delivered], "{fault:?}");
        }
    }

    #[test]
    fn a_fault_of_one_relay_is_excused_only_until_another_takes_over() {
        let mut case = Case::new();
        case.rec.relays.push(relay(1, 0.0, None));
        case.fault(Fault::RelayPathFrozen(0, Path::Nats), 1.0, 60.0);
        case.event(1, "s", 2.0, Some(59.0));
        // the other relay is up: 1 s + T (16 s) + B (10 s)
        assert_eq!(case.violated(), [Property::Delivered]);
        case.rec.relays.pop();
        // alone, the relay is excused until its path is back, and R after
        assert!(case.check().is_empty(), "{:?}", case.check());
    }

    #[test]
    fn a_plain_insert_may_wait_for_the_poll_and_a_past_written_by_hand_for_the_sweep() {
        let mut case = Case::new();
        // B is 10 s; a plain insert gets the poll (1 s) more, a past written by hand the
        // sweep (1 s with nothing held) on top
        case.event(1, "s", 1.0, Some(11.5));
        assert_eq!(case.violated(), [Property::Delivered]);
        case.rec.events[0].insert = Insert::Raw(CreatedAt::Default);
        assert!(case.check().is_empty(), "B + poll");
        case.fin.messages[0].stored_at = t(12.5);
        assert_eq!(case.violated(), [Property::Delivered]);
        case.rec.events[0].insert = Insert::Raw(CreatedAt::Skewed(-20_000));
        assert!(case.check().is_empty(), "B + poll + sweep");
        case.fin.messages[0].stored_at = t(13.5);
        assert_eq!(case.violated(), [Property::Delivered]);
    }

    #[test]
    fn rows_held_before_the_cursor_stretch_the_sweep_by_a_second_per_window() {
        let mut case = Case::new();
        case.bounds = Bounds::new(Duration::from_secs(10), false, 5_000);
        case.event(1, "s", 1.0, Some(18.5));
        case.rec.events[0].insert = Insert::Raw(CreatedAt::Skewed(-20_000));
        // 5,000 held rows are 10 windows of 500: B + poll + 1 s + 10 s
        assert!(case.check().is_empty(), "{:?}", case.check());
        case.fin.messages[0].stored_at = t(23.5);
        assert_eq!(case.violated(), [Property::Delivered]);
    }

    #[test]
    fn committed_only_refuses_a_rolled_back_or_unknown_event_in_the_stream() {
        let mut case = Case::new();
        case.event(1, "s", 1.0, Some(1.1));
        case.rec.events[0].outcome = Outcome::RolledBack(t(1.0));
        case.fin.rows.clear();
        assert_eq!(case.violated(), [Property::CommittedOnly]);
        case.rec.events.clear();
        assert_eq!(
            case.violated(),
            [Property::CommittedOnly],
            "no writer wrote it"
        );
    }

    #[test]
    fn order_refuses_a_reorder_and_a_gap_of_a_sequential_writer() {
        let mut case = Case::new();
        case.event(1, "s", 1.0, None);
        case.event(2, "s", 2.0, None);
        case.store(2, "s", 3.0);
        case.store(1, "s", 4.0);
        for n in [1, 2] {
            case.fin.rows.get_mut(&id(n)).unwrap().published_at = Some(t(4.0));
        }
        assert_eq!(case.violated(), [Property::Order]);
        assert!(case.check()[0].what.contains("w0#2 before w0#1"));

        let mut case = Case::new();
        case.event(1, "s", 1.0, None);
        case.event(2, "s", 2.0, Some(2.1));
        let violated = case.violated();
        assert!(violated.contains(&Property::Order), "{violated:?}");
        assert!(case
            .check()
            .iter()
            .any(|v| v.property == Property::Order && v.what.contains("a gap")));
    }

    #[test]
    fn marks_refuses_a_row_marked_published_that_no_stream_holds() {
        let mut case = Case::new();
        case.event(1, "s", 1.0, Some(1.1));
        case.fin.messages.clear();
        assert!(case.violated().contains(&Property::Marks));
    }

    #[test]
    fn held_wants_each_poison_row_held_with_a_reason_and_nothing_else() {
        let mut case = Case::new();
        let head = id(9);
        case.rec
            .poisons
            .push(poison_p0(PoisonKind::Uncaptured, head, None));
        case.fin.rows.insert(
            head,
            Row {
                subject: "p0".into(),
                created_at: String::new(),
                published_at: None,
                attempts: 0,
                pruned: None,
            },
        );
        assert_eq!(case.violated(), [Property::Held], "not held");
        case.fin.retries.push(Retry {
            subject: "p0".into(),
            event_id: head,
            retry_at: None,
            reason: "no stream captures ux0.thing.changed".into(),
        });
        assert!(case.check().is_empty(), "{:?}", case.check());
        case.fin.retries[0].reason.clear();
        assert_eq!(case.violated(), [Property::Held], "held with no reason");

        let mut case = Case::new();
        case.event(1, "s", 1.0, None);
        case.fin.retries.push(Retry {
            subject: "s".into(),
            event_id: id(1),
            retry_at: None,
            reason: "at the attempt cap".into(),
        });
        assert!(
            case.violated().contains(&Property::Held),
            "a healthy row held"
        );
    }

    /// Seed 5004: the insert of an uncaptured poison row timed out and left no row; its first
    /// follower, of the same type, was held in its place (`no_stream`), and is the poison row
    /// to the checker: held until repaired, then due.
    #[test]
    fn an_uncaptured_poisons_follower_stands_for_a_head_that_left_no_row() {
        let mut case = Case::new();
        case.rec
            .poisons
            .push(poison_p0(PoisonKind::Uncaptured, id(9), None));
        case.event(1, "p0", 5.0, None);
        case.event(2, "p0", 6.0, None);
        for e in &mut case.rec.events {
            e.role = Role::Follower(0);
        }
        case.fin.retries.push(Retry {
            subject: "p0".into(),
            event_id: id(1),
            retry_at: None,
            reason: "no stream captures ux0.thing.changed".into(),
        });
        assert!(case.check().is_empty(), "{:?}", case.check());
        // repaired at 50 s: both are due then, and in no stream at the end
        case.rec.poisons[0].repaired = Some(t(50.0));
        case.fin.retries.clear();
        assert_eq!(case.violated(), [Property::Delivered, Property::Delivered]);
        case.store(1, "p0", 52.0);
        case.store(2, "p0", 52.5);
        assert!(case.check().is_empty(), "{:?}", case.check());
    }

    #[test]
    fn relays_alive_refuses_a_relay_that_ended_unasked_or_stopped_late() {
        let mut case = Case::new();
        case.rec.relays[0].ended = Some((t(50.0), RelayEnd::Killed));
        assert!(case.check().is_empty());
        case.rec.relays[0].ended = Some((t(50.0), RelayEnd::Died("exited with 101".into())));
        assert_eq!(case.violated(), [Property::RelaysAlive]);
        case.rec.relays[0].ended = Some((t(50.0), RelayEnd::StopLate("40 s".into())));
        assert_eq!(case.violated(), [Property::RelaysAlive]);
    }

    #[test]
    fn consumed_wants_each_event_applied_once_and_a_doomed_one_only_in_the_dead_letters() {
        let n_of = |fate| (1..10_000u128).find(|n| Fate::of(id(*n)) == fate).unwrap();
        let (plain, doomed, slow) = (
            n_of(Fate::Plain),
            n_of(Fate::Doomed),
            n_of(Fate::SlowToFail),
        );
        let mut case = Case::new();
        case.event(plain, "s1", 1.0, Some(1.1));
        case.event(doomed, "s2", 2.0, Some(2.1));
        case.event(slow, "s3", 3.0, Some(3.1));
        // a run without a consumer asks nothing of one
        assert!(case.check().is_empty(), "{:?}", case.check());
        case.rec.consumers = Some(ConsumerRecord::default());
        assert_eq!(
            case.violated(),
            [Property::Consumed, Property::Consumed, Property::Consumed]
        );
        case.fin.applied.insert(id(plain), 1);
        case.fin.dead_letters.insert(id(doomed), 1);
        // slow to fail: applied, or dead-lettered, not both
        case.fin.applied.insert(id(slow), 1);
        assert!(case.check().is_empty(), "{:?}", case.check());
        case.fin.dead_letters.insert(id(slow), 1);
        assert_eq!(
            case.violated(),
            [Property::Consumed],
            "applied and dead-lettered"
        );
        case.fin.applied.remove(&id(slow));
        assert!(case.check().is_empty(), "{:?}", case.check());
        // applied twice
        case.fin.applied.insert(id(plain), 2);
        assert_eq!(case.violated(), [Property::Consumed]);
        case.fin.applied.insert(id(plain), 1);
        // a doomed event applied as well as dead-lettered
        case.fin.applied.insert(id(doomed), 1);
        assert_eq!(case.violated(), [Property::Consumed]);
        case.fin.applied.remove(&id(doomed));
        // a healthy one dead-lettered as well as applied
        case.fin.dead_letters.insert(id(plain), 1);
        assert_eq!(case.violated(), [Property::Consumed]);
        case.fin.dead_letters.remove(&id(plain));
        // two dead letters
        case.fin.dead_letters.insert(id(doomed), 2);
        assert_eq!(case.violated(), [Property::Consumed]);
        // ... unless the stream holds the event twice: each copy is a replay
        let copy = case.fin.messages[1].clone();
        case.fin.messages.push(copy);
        assert!(case.check().is_empty(), "{:?}", case.check());
        case.fin.messages.pop();
        case.fin.dead_letters.insert(id(doomed), 1);
        // an event of another type is not the consumer's
        case.fin.messages[0].event_type = "hx.order.placed".into();
        assert_eq!(
            case.violated(),
            [Property::Consumed],
            "applied, and not consumed"
        );
        case.fin.applied.remove(&id(plain));
        assert!(case.check().is_empty(), "{:?}", case.check());
    }

    #[test]
    fn consumers_alive_refuses_a_replica_that_died_or_stopped_late() {
        let mut case = Case::new();
        let mut record = ConsumerRecord::default();
        record.kills.push((t(10.0), 0));
        case.rec.consumers = Some(record);
        assert!(case.check().is_empty(), "{:?}", case.check());
        let c = case.rec.consumers.as_mut().unwrap();
        c.died.push((t(20.0), 1, "it panicked: boom".into()));
        assert_eq!(case.violated(), [Property::ConsumersAlive]);
        let c = case.rec.consumers.as_mut().unwrap();
        c.died.clear();
        c.stopped_late.push((t(95.0), 1));
        assert_eq!(case.violated(), [Property::ConsumersAlive]);
    }

    #[test]
    fn a_bc_row_may_wait_for_the_sweep() {
        let mut case = Case::new();
        case.bounds = Bounds::new(Duration::from_secs(10), false, 20_000);
        case.event(1, "p0", 1.0, Some(40.0));
        assert!(case.violated().contains(&Property::Delivered));
        case.rec.events[0].role = Role::Poison(0);
        case.rec
            .poisons
            .push(poison_p0(PoisonKind::CreatedAtBc, id(1), None));
        // B + 1 s + 40 windows of 500 held rows before the cursor
        assert!(
            !case.violated().contains(&Property::Delivered),
            "{:?}",
            case.check()
        );
    }

    #[test]
    fn a_repaired_poison_rows_attempt_is_its_holds() {
        let mut case = Case::new();
        case.event(1, "p0", 1.0, Some(3.0));
        case.fin.rows.get_mut(&id(1)).unwrap().attempts = 1;
        assert!(case.violated().contains(&Property::Attempts));
        case.rec
            .poisons
            .push(poison_p0(PoisonKind::Uncaptured, id(1), Some(t(2.0))));
        assert!(
            !case.violated().contains(&Property::Attempts),
            "{:?}",
            case.check()
        );
    }

    #[test]
    fn attempts_are_excused_only_by_a_fault_that_may_cost_one() {
        let mut case = Case::new();
        case.event(1, "s", 1.0, Some(3.0));
        case.fin.rows.get_mut(&id(1)).unwrap().attempts = 2;
        assert_eq!(case.violated(), [Property::Attempts]);
        case.fault(Fault::BrokerDown(0), 0.5, 2.0);
        assert_eq!(
            case.violated(),
            [Property::Attempts],
            "a broker down costs none"
        );
        case.fault(Fault::BrokerFrozen(0, FreezeHow::Signal), 0.5, 2.0);
        assert!(case.check().is_empty(), "{:?}", case.check());
        case.bounds.strict_attempts = true;
        assert_eq!(
            case.violated(),
            [Property::Attempts],
            "strictly, only a frozen relay"
        );
        case.fault(Fault::RelayFrozen(0, FreezeHow::Signal), 0.5, 2.0);
        assert!(case.check().is_empty(), "{:?}", case.check());
    }

    #[test]
    fn locks_released_refuses_a_lock_held_past_its_bound_into_a_freeze() {
        let mut case = Case::new();
        let sample = |at: f64| LockSample {
            relay: "r0.0".into(),
            frozen_since: t(10.0),
            at: t(at),
            pid: 42,
            lock: "advisory ExclusiveLock key (1, 2, 2)".into(),
        };
        case.rec.locks.push(sample(20.0));
        assert!(case.check().is_empty(), "10 s into the freeze");
        case.rec.locks.push(sample(26.0));
        assert_eq!(case.violated(), [Property::LocksReleased]);
    }

    #[test]
    fn pruned_refuses_a_row_deleted_early_unpublished_or_by_another_role_and_a_failed_pass() {
        let mut case = Case::new();
        case.event(1, "s", 1.0, Some(3.0));
        let retention = || RetentionRecord {
            keep: Duration::from_secs(5),
            interval: Duration::from_secs(1),
            failed: Vec::new(),
            died: None,
            silences: Vec::new(),
        };
        let prune = |case: &mut Case, at: f64, by: &str| {
            case.fin.rows.get_mut(&id(1)).unwrap().pruned = Some((t(at), by.into()));
        };
        prune(&mut case, 9.0, RETENTION_ROLE);
        assert_eq!(case.violated(), [Property::Pruned], "no retention task");
        case.rec.retention = Some(retention());
        assert!(case.check().is_empty(), "{:?}", case.check());
        prune(&mut case, 7.0, RETENTION_ROLE);
        assert_eq!(case.violated(), [Property::Pruned], "4 s after its publish");
        prune(&mut case, 9.0, "root");
        assert_eq!(case.violated(), [Property::Pruned], "another role");
        prune(&mut case, 9.0, RETENTION_ROLE);
        case.fin.rows.get_mut(&id(1)).unwrap().published_at = None;
        assert!(case.violated().contains(&Property::Pruned), "unpublished");

        let mut case = Case::new();
        case.rec.retention = Some(retention());
        case.rec.retention.as_mut().unwrap().failed = vec![(t(20.0), "connection refused".into())];
        assert_eq!(case.violated(), [Property::Pruned], "Postgres was up");
        case.fault(Fault::PgDown(true), 5.0, 12.0);
        assert!(case.check().is_empty(), "within R of the outage");
        case.rec.retention.as_mut().unwrap().failed[0].0 = t(30.0);
        assert_eq!(case.violated(), [Property::Pruned], "past R");
        case.rec.retention.as_mut().unwrap().failed.clear();
        case.rec.retention.as_mut().unwrap().died = Some((t(40.0), "a panic".into()));
        assert_eq!(case.violated(), [Property::Pruned], "it panicked");
    }

    #[test]
    fn pruned_excuses_a_pass_failed_in_a_silence_and_requires_one_in_a_long_silence() {
        let mut case = Case::new();
        case.rec.retention = Some(RetentionRecord {
            keep: Duration::from_secs(5),
            interval: Duration::from_secs(1),
            failed: vec![(t(40.0), "Postgres did not answer".into())],
            died: None,
            silences: vec![(t(10.0), Some(t(15.0)))],
        });
        // R is 5 s or more, and less than 25 s
        fn r(case: &mut Case) -> &mut RetentionRecord {
            case.rec.retention.as_mut().unwrap()
        }
        assert_eq!(
            case.violated(),
            [Property::Pruned],
            "past R after the silence"
        );
        r(&mut case).silences[0].1 = Some(t(35.0));
        assert!(case.check().is_empty(), "within R of the silence");
        // 1 s + 30 s + 10 s: a silence of 60 s sees a pass fail by 51 s
        r(&mut case).silences[0].1 = Some(t(70.0));
        assert!(case.check().is_empty(), "failed 30 s in");
        r(&mut case).failed[0].0 = t(55.0);
        assert_eq!(case.violated(), [Property::Pruned], "no failure by 51 s");
        r(&mut case).failed.clear();
        assert_eq!(case.violated(), [Property::Pruned], "no failure at all");
        r(&mut case).silences[0].1 = Some(t(40.0));
        assert!(case.check().is_empty(), "30 s: shorter than the bound");
        r(&mut case).silences[0].1 = None;
        assert!(case.check().is_empty(), "stopped during the silence");
    }
}
