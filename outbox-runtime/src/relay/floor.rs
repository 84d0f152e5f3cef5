//! A lane's floor: the position at or before which every unpublished row of the lane is
//! parked (its subject held or backing off), so that the lane's statements start after it and
//! read neither the parked rows nor the index entries of rows published since, at every batch.
//! It moves behind the rows the lane publishes and over a leading run of parked rows, and back
//! before a row that appears below it (docs/relay.md, *Parked subjects, and the floor*).

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use uuid::Uuid;

use super::position::{Position, Stamp};

/// How often a lane advances its floor while subjects are parked.
const ADVANCE_EVERY: Duration = Duration::from_millis(100);
/// How often a lane reads when the oldest running transaction began (the bound of a floor that
/// follows the published rows). An older reading is a valid bound for a later batch (every
/// transaction running at the later batch began before the earlier reading or after it), so a
/// reading this old only keeps the floor up to this far behind.
const OLDEST_EVERY: Duration = Duration::from_millis(200);
/// How often a lane looks below its floor while no subject is parked: what lies there then is
/// published rows' entries, cheap to pass, and a row set unpublished again by hand (or whose
/// mark a Postgres crash forgot) goes out within this.
const UNPARKED_CHECK_EVERY: Duration = Duration::from_secs(1);

/// A candidate floor, usable once every transaction that was running when it was found has
/// ended: only those could still commit a row before it.
#[derive(Debug, Clone, Copy)]
struct Pending {
    to: Position,
    /// The snapshot's `xmax` when the candidate was found: it is settled when the oldest running
    /// transaction (`xmin`) is at least this.
    xmax: u64,
}

/// One lane's floor.
#[derive(Debug)]
pub(super) struct Floor {
    at: Position,
    pending: Option<Pending>,
    last_advance: Option<Instant>,
    /// Whether the lane's last claim read rows after the floor that it had to pass: only then
    /// can a look ahead move the floor over something.
    passed: bool,
    /// A row inserted with an old `created_at` (the column's default `now()` in a long
    /// transaction) can appear below the floor: the lane looks there this often while subjects
    /// are parked ([`UNPARKED_CHECK_EVERY`] otherwise).
    check_every: Duration,
    last_check: Instant,
    /// When the oldest transaction running on the database began, at the last reading (`None`:
    /// unknown, the floor does not follow the published rows), and when that reading was.
    oldest: Option<DateTime<Utc>>,
    oldest_read: Option<Instant>,
}

impl Floor {
    /// A floor at the start, which looks below itself every `check_every`.
    pub(super) fn new(check_every: Duration) -> Floor {
        Floor {
            at: Position::START,
            pending: None,
            last_advance: None,
            passed: true,
            check_every,
            last_check: Instant::now(),
            oldest: None,
            oldest_read: None,
        }
    }

    /// The floor the batch's statements start after.
    pub(super) fn position(&self) -> Position {
        self.at
    }

    /// At the start of a batch, whose snapshot's oldest running transaction is `xmin`: a
    /// pending candidate promoted once it is settled.
    pub(super) fn begin(&mut self, xmin: u64) {
        if let Some(p) = self.pending {
            if xmin >= p.xmax {
                self.at = self.at.max(p.to);
                self.pending = None;
            }
        }
    }

    /// Whether the batch should look ahead of the floor: subjects are parked, the last claim
    /// passed rows after the floor ([`passed`](Self::passed)), no candidate is waiting, and the
    /// last look is not too recent.
    pub(super) fn wants_advance(&self, now: Instant, parked: bool) -> bool {
        let due = self.last_advance.is_none_or(|t| now >= t + ADVANCE_EVERY);
        parked && self.passed && self.pending.is_none() && due
    }

    /// What the batch's claim read: whether it passed rows after the floor (a claim that
    /// returned fewer rows than it asked for counts as having passed some).
    pub(super) fn passed(&mut self, passed: bool) {
        self.passed = passed;
    }

    /// What a look ahead found: where the floor may move (before the lane's first claimable
    /// row, and a second behind the database's clock), with the snapshot's `xmax`.
    pub(super) fn advanced(&mut self, to: Option<Position>, xmax: u64, now: Instant) {
        self.last_advance = Some(now);
        if let Some(to) = to.filter(|to| *to > self.at) {
            self.pending = Some(Pending { to, xmax });
        }
    }

    /// Whether the batch should read when the oldest running transaction began: never read,
    /// or [`OLDEST_EVERY`] ago.
    pub(super) fn wants_oldest(&self, now: Instant) -> bool {
        self.oldest_read.is_none_or(|t| now >= t + OLDEST_EVERY)
    }

    /// What the reading found (read just before the batch's claim).
    pub(super) fn read_oldest(&mut self, oldest: Option<DateTime<Utc>>, now: Instant) {
        self.oldest = oldest;
        self.oldest_read = Some(now);
    }

    /// `to`, or the position just before the last reading of the oldest running transaction's
    /// start when that is earlier: no floor passes the start of a transaction that was running
    /// when the batch that moves it began (the reading was made before its claim).
    pub(super) fn behind_oldest(&self, to: Position) -> Position {
        match self.oldest {
            Some(oldest) => to.min(Position {
                at: Stamp::At(oldest),
                id: Uuid::nil(),
            }),
            None => to,
        }
    }

    /// A batch held and published every unpublished row of the lane from the floor to `last`:
    /// the floor moves there at once, but never past the start of the oldest transaction
    /// running when the batch began ([`behind_oldest`](Self::behind_oldest)), whose rows, and
    /// every later transaction's, have a `created_at` at or after it; not at all while that
    /// start is unknown (this session cannot see every other). A candidate not beyond it is
    /// dropped.
    pub(super) fn cleared(&mut self, last: Position) {
        if self.oldest.is_none() {
            return;
        }
        let to = self.behind_oldest(last);
        if to > self.at {
            self.at = to;
            if self.pending.is_some_and(|p| p.to <= to) {
                self.pending = None;
            }
        }
    }

    /// A row at `to` became claimable (its subject's parked head was published): the floor
    /// moves back before it, and a candidate beyond it is dropped.
    pub(super) fn pull_back(&mut self, to: Position) {
        self.at = self.at.min(to.before());
        self.pending = None;
        self.passed = true;
    }

    /// Whether the batch should look below the floor for a row that appeared there (it is
    /// above the start, and the last look is [`check_every`](Floor::new) old while subjects are
    /// `parked`, [`UNPARKED_CHECK_EVERY`] old otherwise); the look is then counted as made.
    pub(super) fn wants_check(&mut self, now: Instant, parked: bool) -> bool {
        let every = if parked {
            self.check_every
        } else {
            self.check_every.min(UNPARKED_CHECK_EVERY)
        };
        if self.at == Position::START || now < self.last_check + every {
            return false;
        }
        self.last_check = now;
        true
    }

    /// Back to the start (an operator released held subjects).
    pub(super) fn reset(&mut self) {
        self.at = Position::START;
        self.pending = None;
        self.last_advance = None;
        self.passed = true;
    }
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};
    use uuid::Uuid;

    use super::super::position::Stamp;
    use super::*;

    fn at(secs: i64, id: u128) -> Position {
        Position {
            at: Stamp::At(Utc.timestamp_opt(secs, 0).unwrap()),
            id: Uuid::from_u128(id),
        }
    }

    fn floor() -> Floor {
        Floor::new(Duration::from_secs(30))
    }

    #[test]
    fn the_oldest_transaction_is_read_now_and_then_and_kept_between() {
        let mut f = floor();
        let now = Instant::now();
        assert!(f.wants_oldest(now), "never read");
        assert_eq!(f.oldest, None, "unknown until read");
        let t = Utc.timestamp_opt(10, 0).unwrap();
        f.read_oldest(Some(t), now);
        assert!(!f.wants_oldest(now + OLDEST_EVERY / 2));
        assert_eq!(f.oldest, Some(t), "kept between readings");
        assert!(f.wants_oldest(now + OLDEST_EVERY));
        f.read_oldest(None, now + OLDEST_EVERY);
        assert_eq!(f.oldest, None, "a reading that could not see every session");
        f.reset();
        assert!(
            !f.wants_oldest(now + OLDEST_EVERY),
            "a reset keeps the reading"
        );
    }

    #[test]
    fn a_cleared_batch_moves_the_floor_on_at_once_and_never_back() {
        let mut f = floor();
        let now = Instant::now();
        // a reading after every position of the test: it bounds nothing
        f.read_oldest(Some(Utc.timestamp_opt(1_000, 0).unwrap()), now);
        f.advanced(Some(at(2, 2)), 100, now);
        f.cleared(at(3, 1));
        assert_eq!(f.position(), at(3, 1), "no settling: the batch began after");
        f.begin(100);
        assert_eq!(f.position(), at(3, 1), "the older candidate was dropped");
        f.cleared(at(1, 1));
        assert_eq!(
            f.position(),
            at(3, 1),
            "a cleared batch never moves it back"
        );
        f.advanced(Some(at(5, 5)), 200, now + ADVANCE_EVERY);
        f.cleared(at(4, 4));
        f.begin(200);
        assert_eq!(f.position(), at(5, 5), "a candidate beyond it stays");
        f.pull_back(at(4, 9));
        assert_eq!(
            f.position(),
            at(4, 9).before(),
            "a released head still pulls it back"
        );
    }

    #[test]
    fn the_floor_moves_over_the_leading_parked_run_once_settled() {
        let mut f = floor();
        let now = Instant::now();
        assert!(
            !f.wants_advance(now, false),
            "nothing parked: nothing to skip"
        );
        assert!(f.wants_advance(now, true));
        f.advanced(Some(at(2, 2)), 100, now);
        assert!(
            !f.wants_advance(now + ADVANCE_EVERY, true),
            "a candidate waits"
        );
        assert_eq!(
            f.position(),
            Position::START,
            "not before the candidate is settled"
        );
        f.begin(99);
        assert_eq!(
            f.position(),
            Position::START,
            "a transaction older than the look runs"
        );
        f.begin(100);
        assert_eq!(f.position(), at(2, 2));
        assert!(!f.wants_advance(now, true), "not twice within the interval");
        assert!(f.wants_advance(now + ADVANCE_EVERY, true));
    }

    #[test]
    fn the_floor_looks_ahead_only_after_a_claim_that_passed_rows() {
        let mut f = floor();
        let now = Instant::now();
        f.passed(false);
        assert!(
            !f.wants_advance(now, true),
            "a full claim that read only what it took: nothing to skip"
        );
        f.passed(true);
        assert!(f.wants_advance(now, true));
        f.passed(false);
        f.pull_back(at(1, 1));
        assert!(
            f.wants_advance(now, true),
            "a released head: the rows behind it may be parked again"
        );
        f.passed(false);
        f.reset();
        assert!(f.wants_advance(now, true), "back at the start");
    }

    #[test]
    fn a_look_that_finds_no_parked_run_leaves_the_floor() {
        let mut f = floor();
        let now = Instant::now();
        f.advanced(Some(at(2, 2)), 1, now);
        f.begin(1);
        f.advanced(None, 2, now + ADVANCE_EVERY);
        f.advanced(Some(at(1, 1)), 2, now + ADVANCE_EVERY * 2);
        f.begin(5);
        assert_eq!(f.position(), at(2, 2), "never backwards by a look");
    }

    #[test]
    fn a_released_head_pulls_the_floor_back_before_it() {
        let mut f = floor();
        let now = Instant::now();
        f.advanced(Some(at(5, 5)), 1, now);
        f.begin(1);
        assert_eq!(f.position(), at(5, 5));
        f.pull_back(at(1, 1));
        assert!(f.position() < at(1, 1));
        assert_eq!(f.position().at, at(1, 1).at);
    }

    #[test]
    fn a_pull_back_drops_a_candidate_beyond_it() {
        let mut f = floor();
        let now = Instant::now();
        f.advanced(Some(at(5, 5)), 10, now);
        f.pull_back(at(3, 3));
        f.begin(10);
        assert_eq!(
            f.position(),
            Position::START,
            "the candidate would have skipped the released rows"
        );
    }

    #[test]
    fn the_floor_looks_below_itself_periodically_and_moves_back() {
        let mut f = Floor::new(Duration::from_secs(30));
        let now = Instant::now();
        assert!(
            !f.wants_check(now + Duration::from_secs(31), true),
            "nothing below the start"
        );
        f.advanced(Some(at(5, 5)), 1, now);
        f.begin(1);
        assert!(!f.wants_check(now, true), "not yet");
        let later = now + Duration::from_secs(31);
        assert!(f.wants_check(later, true));
        assert!(!f.wants_check(later, true), "once per period");
        assert!(
            !f.wants_check(later + Duration::from_millis(999), false),
            "nothing parked: once a second"
        );
        assert!(f.wants_check(later + UNPARKED_CHECK_EVERY, false));
        assert!(
            !f.wants_check(later + Duration::from_secs(2), true),
            "parked again: the long period"
        );
        f.pull_back(at(2, 2));
        assert!(f.position() < at(2, 2));
        f.reset();
        assert_eq!(f.position(), Position::START);
    }
}
