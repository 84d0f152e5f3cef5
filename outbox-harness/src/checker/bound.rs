//! The bound of the `delivered` property: B after a row becomes publishable, stretched by the
//! windows in which the relay is excused (docs/harness.md, *The bound*), and the other limits
//! the checker holds the relay to.

use std::time::Duration;

use outbox_runtime::RelayConfig;

use crate::history::{Fault, Recorded, Time};
use crate::relays::BACKOFF_MAX;
use crate::schedule::RELAY_SLOTS;

/// The bounds the checker holds the relay to, all derived from the relay's documented
/// timeouts (docs/harness.md, *The bound*).
#[derive(Debug, Clone)]
pub struct Bounds {
    /// B: how long a healthy relay may take to publish a committed row it was told of.
    pub steady: Duration,
    /// A row written by a plain insert notifies nobody: the relay's lanes wake for their sweep
    /// once a second whatever happens (docs/relay.md, *Wake-up*).
    pub poll: Duration,
    /// The documented wait of a row whose `created_at` was written by hand in the past: the
    /// lanes' sweep below their cursors, a second, and a second per `batch_size` parked rows
    /// before the cursor (docs/relay.md, *The cursor*).
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
    /// The bounds with `steady` as B, for relays configured as [`crate::relays::relay_config`],
    /// in a run with `held_rows` rows behind a held subject.
    pub fn new(steady: Duration, strict_attempts: bool, held_rows: u64) -> Bounds {
        let config = RelayConfig::default();
        let ack = config.ack_timeout;
        let windows = held_rows.div_ceil(config.batch_size as u64) as u32;
        Bounds {
            steady,
            poll: Duration::from_secs(1),
            sweep: Duration::from_secs(1) * (1 + windows),
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

    pub(super) fn backoff(&self, attempts: i32) -> Duration {
        if attempts <= 0 {
            return Duration::ZERO;
        }
        let factor = 1u32 << (attempts - 1).min(20) as u32;
        (self.backoff_base * factor).min(self.backoff_max)
    }
}

/// A window in which the relay is excused from publishing in time, and why.
#[derive(Debug, Clone)]
pub(super) struct Excuse {
    pub(super) start: Time,
    pub(super) end: Time,
}

pub(super) fn add(t: Time, d: Duration) -> Time {
    t + chrono::Duration::from_std(d).expect("a short duration")
}

/// The relays' lives and the faults of a run, as the excuses see them.
#[derive(Debug)]
pub(super) struct Timeline<'a> {
    pub(super) rec: &'a Recorded,
    pub(super) bounds: &'a Bounds,
    /// When the run's last fault healed.
    pub(super) healed: Time,
    /// When the final state was read.
    pub(super) end: Time,
}

impl Timeline<'_> {
    /// The windows that excuse a late publish: every fault, until it healed and the relay had
    /// `recovery` to be back; a fault of one relay while another was up, only until the others
    /// take its subjects (`takeover`); and every span with no healthy relay.
    pub(super) fn excuses(&self) -> Vec<Excuse> {
        let b = self.bounds;
        let mut out = Vec::new();
        for f in &self.rec.faults {
            if !f.fault.excuses() {
                continue;
            }
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
        points.push(self.end);
        points.sort();
        points.dedup();
        let mut gap_start: Option<Time> = None;
        for pair in points.windows(2) {
            let mid = pair[0] + (pair[1] - pair[0]) / 2;
            let none = !(0..RELAY_SLOTS).any(|s| self.healthy(s, mid));
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
                end: self.end,
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
        (0..RELAY_SLOTS).any(|s| s != slot && self.healthy(s, t))
    }
}

/// The deadline of a row publishable at `ready` with allowance `base`: `ready + base`, moved
/// to `end + base` by every excuse that overlaps the wait so far, until none does.
pub(super) fn deadline(ready: Time, base: Duration, excuses: &[Excuse]) -> Time {
    let mut deadline = add(ready, base);
    loop {
        let mut moved = false;
        for x in excuses {
            if x.start < deadline && x.end > ready && add(x.end, base) > deadline {
                deadline = add(x.end, base);
                moved = true;
            }
        }
        if !moved {
            return deadline;
        }
    }
}
