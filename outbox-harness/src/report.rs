//! What a run prints: one line per seed, and for a failing seed each violated property with
//! the part of the history it concerns (its subject's events, the faults and relay changes
//! around them), not the whole log; and a summary at the end.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use chrono::Duration;
use uuid::Uuid;

use crate::checker::{Final, Property, Violation};
use crate::history::{since, EventRecord, Outcome, Recorded, Time};

/// How many violations of one property a report details.
const DETAILED: usize = 3;
/// How many events of a subject a violation's history shows at most.
const EVENTS_SHOWN: usize = 16;

/// The result of one seed.
#[derive(Debug)]
pub struct SeedResult {
    /// The seed.
    pub seed: u64,
    /// `single/task`, `cluster/mixed`, ...
    pub shape: String,
    /// The schedule's digest.
    pub digest: String,
    /// How long the run took, in seconds.
    pub elapsed: f64,
    /// Counts for the verdict line.
    pub stats: String,
    /// The violations, if the run got to the check.
    pub violations: Vec<Violation>,
    /// Why the run could not be judged (the harness failed), if it could not.
    pub error: Option<String>,
    /// The command that replays it.
    pub replay: String,
    /// The detailed report of a failing run.
    pub details: String,
}

impl SeedResult {
    /// Whether every property held.
    pub fn passed(&self) -> bool {
        self.error.is_none() && self.violations.is_empty()
    }

    /// The violated properties and their counts.
    pub fn failed_properties(&self) -> BTreeMap<Property, usize> {
        let mut counts = BTreeMap::new();
        for v in &self.violations {
            *counts.entry(v.property).or_insert(0) += 1;
        }
        counts
    }

    /// The seed's one-line verdict.
    pub fn verdict(&self) -> String {
        let verdict = if let Some(e) = &self.error {
            format!("ERROR {e}")
        } else if self.violations.is_empty() {
            "PASS".to_owned()
        } else {
            let failed: Vec<String> = self
                .failed_properties()
                .into_iter()
                .map(|(p, n)| format!("{p}({n})"))
                .collect();
            format!("FAIL {}", failed.join(" "))
        };
        format!(
            "seed {} {} schedule {} {:6.1} s  {verdict}  [{}]",
            self.seed, self.shape, self.digest, self.elapsed, self.stats
        )
    }
}

/// The details of a failing run: each violated property, up to [`DETAILED`] violations with
/// their history, and the replay command.
pub fn details(
    seed: u64,
    violations: &[Violation],
    rec: &Recorded,
    fin: &Final,
    origin: Time,
    replay: &str,
) -> String {
    let mut out = String::new();
    let mut by_property: BTreeMap<Property, Vec<&Violation>> = BTreeMap::new();
    for v in violations {
        by_property.entry(v.property).or_default().push(v);
    }
    for (property, list) in by_property {
        let _ = writeln!(
            out,
            "  seed {seed} violates {property} ({} violation(s)):",
            list.len()
        );
        for v in list.iter().take(DETAILED) {
            let _ = writeln!(out, "    - {}", v.what);
            out.push_str(&history_of(v, rec, fin, origin));
        }
        if list.len() > DETAILED {
            let _ = writeln!(out, "    ... and {} more", list.len() - DETAILED);
        }
    }
    let _ = writeln!(out, "  replay: {replay}");
    out
}

/// The part of the history violation `v` concerns.
fn history_of(v: &Violation, rec: &Recorded, fin: &Final, origin: Time) -> String {
    let mut out = String::new();
    let t = |at: Time| format!("{:+7.2}", since(origin, at));
    let first: HashMap<Uuid, (Time, &str, u64)> = {
        let mut m: HashMap<Uuid, (Time, &str, u64)> = HashMap::new();
        for msg in &fin.messages {
            let c = (msg.stored_at, msg.stream.as_str(), msg.seq);
            m.entry(msg.id)
                .and_modify(|f| {
                    if c < *f {
                        *f = c
                    }
                })
                .or_insert(c);
        }
        m
    };
    // the events of its subjects (the ones named first, then those nearest its span)
    let mut events: Vec<&EventRecord> = rec
        .events
        .iter()
        .filter(|e| v.subjects.contains(&e.subject) || e.id.is_some_and(|id| v.ids.contains(&id)))
        .collect();
    if events.len() > EVENTS_SHOWN {
        let centre = v.span.map_or(origin, |(a, _)| a);
        events.sort_by_key(|e| {
            let named = e.id.is_some_and(|id| v.ids.contains(&id));
            (!named, (e.began - centre).num_milliseconds().abs())
        });
        events.truncate(EVENTS_SHOWN);
        events.sort_by_key(|e| e.began);
        let _ = writeln!(
            out,
            "      (the {EVENTS_SHOWN} events of its subject nearest to it)"
        );
    }
    for e in events {
        let outcome = match &e.outcome {
            Outcome::Committed(at) => format!("committed {}", t(*at)),
            Outcome::Unknown(at, why) => format!("commit unanswered {} ({why})", t(*at)),
            Outcome::Failed(at, why) => format!("failed {} ({})", t(*at), short(why)),
            Outcome::RolledBack(at) => format!("rolled back {}", t(*at)),
            Outcome::Pending => "never ended".to_owned(),
        };
        let fate = match e.id {
            Some(id) => {
                let stored = first
                    .get(&id)
                    .map_or("in no stream".to_owned(), |(at, s, seq)| {
                        format!("stored {s}#{seq} at {}", t(*at))
                    });
                let row = fin.rows.get(&id).map_or("no row".to_owned(), |r| {
                    let pruned = r.pruned.as_ref().map_or(String::new(), |(at, by)| {
                        format!(", deleted at {} by {by}", t(*at))
                    });
                    format!(
                        "row created_at {}, published_at {}, attempts {}{pruned}",
                        r.created_at,
                        r.published_at.map_or("null".to_owned(), t),
                        r.attempts
                    )
                });
                format!("{id}; {stored}; {row}")
            }
            None => "no id".to_owned(),
        };
        let _ = writeln!(
            out,
            "      {} {} {} [{:?}, {:?}] began, {outcome}; {fate}",
            t(e.began),
            e.label,
            e.event_type,
            e.insert,
            e.shape
        );
    }
    for p in rec
        .poisons
        .iter()
        .filter(|p| v.subjects.contains(&p.subject))
    {
        let _ = writeln!(
            out,
            "      poison p{} {:?}: repaired {}, unblocked without repair at [{}]",
            p.id,
            p.kind,
            p.repaired.map_or("never".to_owned(), t),
            p.unblocked
                .iter()
                .map(|u| t(*u))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for r in fin
        .retries
        .iter()
        .filter(|r| v.subjects.contains(&r.subject))
    {
        let _ = writeln!(
            out,
            "      outbox_retries at the end: {} behind {}, {}: {}",
            r.subject,
            r.event_id,
            r.retry_at
                .map_or("held".to_owned(), |at| format!("retry at {}", t(at))),
            r.reason
        );
    }
    // faults and relays around its span (from 30 s before)
    let span = v.span.or_else(|| {
        let times: Vec<Time> = rec
            .events
            .iter()
            .filter(|e| v.subjects.contains(&e.subject))
            .map(|e| e.began)
            .collect();
        Some((*times.iter().min()?, *times.iter().max()?))
    });
    if let Some((a, b)) = span {
        let (a, b) = (a - Duration::seconds(30), b + Duration::seconds(5));
        for f in &rec.faults {
            let end = f.end.unwrap_or(b);
            if f.start <= b && end >= a {
                let _ = writeln!(
                    out,
                    "      fault {}..{} {}",
                    t(f.start),
                    f.end.map_or("(not healed)".to_owned(), t),
                    f.fault.describe()
                );
            }
        }
        for r in &rec.relays {
            let end = r.ended.as_ref().map(|(at, _)| *at);
            if r.spawned <= b && end.is_none_or(|e| e >= a) {
                let _ = writeln!(
                    out,
                    "      relay {} ({:?}) started {}, up {}, ended {}",
                    r.name(),
                    r.kind,
                    t(r.spawned),
                    r.ready.map_or("never".to_owned(), t),
                    r.ended
                        .as_ref()
                        .map_or("no".to_owned(), |(at, how)| format!("{} ({how:?})", t(*at)))
                );
            }
        }
    }
    out
}

fn short(s: &str) -> String {
    let s = s.replace('\n', " ");
    if s.len() > 120 {
        format!("{}...", &s[..s.floor_char_boundary(120)])
    } else {
        s
    }
}

/// The summary of several seeds.
pub fn summary(results: &[SeedResult]) -> String {
    let mut out = String::new();
    let failed: Vec<&SeedResult> = results.iter().filter(|r| !r.passed()).collect();
    let mut by_property: BTreeMap<Property, Vec<u64>> = BTreeMap::new();
    for r in results {
        for p in r.failed_properties().keys() {
            by_property.entry(*p).or_default().push(r.seed);
        }
    }
    let _ = writeln!(
        out,
        "summary: {} seed(s), {} passed, {} failed{}",
        results.len(),
        results.len() - failed.len(),
        failed.len(),
        if results.iter().any(|r| r.error.is_some()) {
            format!(
                " ({} could not be judged)",
                results.iter().filter(|r| r.error.is_some()).count()
            )
        } else {
            String::new()
        }
    );
    for p in Property::ALL {
        let seeds = by_property.get(&p);
        let _ = writeln!(
            out,
            "  {:<15} {}",
            p.name(),
            seeds.map_or("held in every seed".to_owned(), |s| format!(
                "violated in {} seed(s): {}",
                s.len(),
                s.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
            ))
        );
    }
    for r in failed {
        let _ = writeln!(out, "  replay seed {}: {}", r.seed, r.replay);
    }
    out
}
