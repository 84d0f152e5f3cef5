//! What the relay counts: the report of one batch and the totals since start.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::publish::{HoldCause, Settled};
use super::row::Row;

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows acknowledged by JetStream (duplicates included) and marked published.
    pub published: usize,
    /// Of `published`, acks that JetStream flagged as duplicates.
    pub duplicates: usize,
    /// Rows whose publish failed; their `attempts` grew by one and their subject backs off.
    pub failed: usize,
    /// Rows that never reached the broker, or reached it while it could take nothing (not
    /// connected, a stream electing a leader): no attempt is counted.
    pub not_attempted: usize,
    /// Rows held: they cannot be published as they are (docs/relay.md, *Held rows*).
    pub held: usize,
    /// Rows claimed but not tried: an earlier event of their subject did not succeed in this
    /// batch, the deadline passed first, or the claim cut their subject before an older row it
    /// does not hold (docs/relay.md, *Order*). Their `attempts` are unchanged.
    pub skipped: usize,
    /// Rows that reached the attempt cap in this batch (they are among `held` or `failed`).
    pub capped: usize,
}

impl BatchReport {
    /// Adds what publishing came to. (`_rows` and `_max_attempts` are no longer read: whether a
    /// failure reached the attempt cap is decided where it is classified, and carried.)
    pub(super) fn apply(&mut self, settled: &Settled, _rows: &[Row], _max_attempts: i32) {
        self.published += settled.acked.len();
        self.duplicates += settled.duplicates;
        self.failed += settled.failed.len();
        self.not_attempted += settled.not_attempted.len();
        self.held += settled.held.len();
        self.skipped += settled.skipped;
        self.capped += settled
            .failed
            .iter()
            .filter(|(_, failed)| failed.at_cap)
            .count()
            + settled
                .held
                .iter()
                .filter(|(_, h)| h.cause == HoldCause::AtCap)
                .count();
    }
}

/// Totals since the relay was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Claims made, the ones that found nothing included: each is a transaction of the relay's.
    pub claims: u64,
    /// Batches committed (claims that found rows).
    pub batches: u64,
    /// Rows claimed.
    pub claimed: u64,
    /// Rows published (duplicates included).
    pub published: u64,
    /// Duplicate acks.
    pub duplicates: u64,
    /// Failed publish attempts (each one `attempts + 1` on its row).
    pub failed: u64,
    /// Rows not attempted (the broker could not take them).
    pub not_attempted: u64,
    /// Rows held.
    pub held: u64,
    /// Rows claimed but not attempted.
    pub skipped: u64,
    /// Rows that reached the attempt cap.
    pub capped: u64,
}

/// The relay's running totals, shared by its lanes.
#[derive(Debug, Default)]
pub(super) struct Counters {
    claims: AtomicU64,
    batches: AtomicU64,
    claimed: AtomicU64,
    published: AtomicU64,
    duplicates: AtomicU64,
    failed: AtomicU64,
    not_attempted: AtomicU64,
    held: AtomicU64,
    skipped: AtomicU64,
    capped: AtomicU64,
}

impl Counters {
    /// A claim was made.
    pub(super) fn claimed(&self) {
        self.claims.fetch_add(1, Relaxed);
    }

    pub(super) fn add(&self, r: &BatchReport) {
        self.batches.fetch_add(1, Relaxed);
        self.claimed.fetch_add(r.claimed as u64, Relaxed);
        self.published.fetch_add(r.published as u64, Relaxed);
        self.duplicates.fetch_add(r.duplicates as u64, Relaxed);
        self.failed.fetch_add(r.failed as u64, Relaxed);
        self.not_attempted
            .fetch_add(r.not_attempted as u64, Relaxed);
        self.held.fetch_add(r.held as u64, Relaxed);
        self.skipped.fetch_add(r.skipped as u64, Relaxed);
        self.capped.fetch_add(r.capped as u64, Relaxed);
    }

    pub(super) fn snapshot(&self) -> RelayStats {
        RelayStats {
            claims: self.claims.load(Relaxed),
            batches: self.batches.load(Relaxed),
            claimed: self.claimed.load(Relaxed),
            published: self.published.load(Relaxed),
            duplicates: self.duplicates.load(Relaxed),
            failed: self.failed.load(Relaxed),
            not_attempted: self.not_attempted.load(Relaxed),
            held: self.held.load(Relaxed),
            skipped: self.skipped.load(Relaxed),
            capped: self.capped.load(Relaxed),
        }
    }
}

/// How a running relay is doing, for liveness and readiness probes ([`Relay::health`]).
///
/// [`Relay::health`]: super::Relay::health
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayHealth {
    /// Whether [`Relay::run`](super::Relay::run) is running.
    pub running: bool,
    /// Whether this relay holds the relay lease and publishes; `false` while it stands by.
    pub holds_lease: bool,
    /// Whether the relay's last statement to Postgres (its lease, renewed or tried every
    /// second) worked: `false` when it got no answer, and when Postgres refused it (logged at
    /// warn).
    pub postgres_reachable: bool,
    /// Whether a message to itself through the NATS server came back within the last few
    /// seconds.
    pub nats_reachable: bool,
    /// Lanes whose last [`STALLED_AFTER`] batches or more failed in a row.
    pub stalled_lanes: usize,
}

/// Failed batches in a row after which a lane counts as stalled ([`RelayHealth`]).
pub const STALLED_AFTER: u32 = 3;

impl RelayHealth {
    /// Ready to publish: running, Postgres and NATS reachable, and no lane stalled. A relay
    /// standing by is ready too when it could take the lease over.
    pub fn is_ready(&self) -> bool {
        self.running && self.postgres_reachable && self.nats_reachable && self.stalled_lanes == 0
    }
}

/// The cells behind [`RelayHealth`], written by the relay's tasks.
#[derive(Debug)]
pub(super) struct Health {
    pub(super) running: std::sync::atomic::AtomicBool,
    pub(super) holds_lease: std::sync::atomic::AtomicBool,
    pub(super) postgres: std::sync::atomic::AtomicBool,
    pub(super) nats: std::sync::atomic::AtomicBool,
    /// Per lane, its failed batches in a row.
    pub(super) lane_failures: Vec<std::sync::atomic::AtomicU32>,
}

impl Health {
    pub(super) fn new(lanes: usize) -> Health {
        use std::sync::atomic::{AtomicBool, AtomicU32};
        Health {
            running: AtomicBool::new(false),
            holds_lease: AtomicBool::new(false),
            postgres: AtomicBool::new(false),
            nats: AtomicBool::new(false),
            lane_failures: (0..lanes).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    pub(super) fn snapshot(&self) -> RelayHealth {
        RelayHealth {
            running: self.running.load(Relaxed),
            holds_lease: self.holds_lease.load(Relaxed),
            postgres_reachable: self.postgres.load(Relaxed),
            nats_reachable: self.nats.load(Relaxed),
            stalled_lanes: self
                .lane_failures
                .iter()
                .filter(|f| f.load(Relaxed) >= STALLED_AFTER)
                .count(),
        }
    }

    /// Lane `lane`'s batch failed (`true`) or did not.
    pub(super) fn batch(&self, lane: usize, failed: bool) {
        if let Some(cell) = self.lane_failures.get(lane) {
            if failed {
                cell.fetch_add(1, Relaxed);
            } else {
                cell.store(0, Relaxed);
            }
        }
    }
}

/// The rows a relay published over the last second or so, for the lanes' choice between
/// waiting for notifications and lingering ([`Relay::run`](super::Relay::run), *Wake-up*).
#[derive(Debug, Default)]
pub(super) struct Recent {
    inner: std::sync::Mutex<RecentInner>,
}

#[derive(Debug, Default)]
struct RecentInner {
    /// The second being counted: when it began, and its rows.
    since: Option<tokio::time::Instant>,
    rows: u64,
    /// The rows of the last whole second.
    last: u64,
}

impl Recent {
    const SECOND: std::time::Duration = std::time::Duration::from_secs(1);

    fn roll(inner: &mut RecentInner, now: tokio::time::Instant) {
        match inner.since {
            Some(since) if now.saturating_duration_since(since) < Self::SECOND => {}
            Some(since) if now.saturating_duration_since(since) < Self::SECOND * 2 => {
                inner.last = inner.rows;
                inner.rows = 0;
                inner.since = Some(since + Self::SECOND);
            }
            _ => {
                inner.last = 0;
                inner.rows = 0;
                inner.since = Some(now);
            }
        }
    }

    /// `rows` were published at `now`.
    pub(super) fn published(&self, rows: u64, now: tokio::time::Instant) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        Self::roll(&mut inner, now);
        inner.rows += rows;
    }

    /// The rows of the last whole second, or of the current one if more.
    pub(super) fn per_second(&self, now: tokio::time::Instant) -> u64 {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        Self::roll(&mut inner, now);
        inner.last.max(inner.rows)
    }
}

#[cfg(test)]
mod recent_tests {
    use super::Recent;
    use std::time::Duration;
    use tokio::time::Instant;

    #[test]
    fn the_rate_is_the_last_whole_second_or_the_current_one_if_more() {
        let r = Recent::default();
        let t0 = Instant::now();
        r.published(30, t0);
        assert_eq!(r.per_second(t0), 30);
        r.published(50, t0 + Duration::from_millis(1_200));
        assert_eq!(
            r.per_second(t0 + Duration::from_millis(1_300)),
            50,
            "this second's 50 > last's 30"
        );
        assert_eq!(
            r.per_second(t0 + Duration::from_millis(2_100)),
            50,
            "the last whole second"
        );
        assert_eq!(
            r.per_second(t0 + Duration::from_secs(5)),
            0,
            "seconds without rows"
        );
    }
}
