//! The cursor: where a lane's claims start, and the sweep below it (docs/relay.md, *The
//! cursor*).
//!
//! Order never depends on the cursor: a batch publishes a subject's rows only when it holds
//! every older unpublished row of that subject, before the cursor too
//! ([`CLAIM_CUT`](super::sql::CLAIM_CUT)). The cursor only saves reading, and keeps a row
//! prompt: the rows of held subjects and the index entries of published rows before it are not
//! read again at every batch, and the rows that matter lie after it.
//!
//! Its one invariant: every unpublished row before [`Cursor::start`] was, when the cursor
//! passed it, either parked (its subject has a retry schedule) or not yet committed by a
//! transaction that began after the horizon ([`Horizon`](super::horizon::Horizon)), so that a
//! row committed later by a transaction running then has a `created_at` at or after the
//! cursor, as long as its writer gives it a `created_at` at or after its transaction's start
//! (`emit`'s `clock_timestamp()`, the column's default `now()`). A row that appears before the
//! cursor anyway (a `created_at` written by hand in the past, a writer whose clock is behind,
//! a mark lost in a crash) is found by the sweep, which reads below the cursor in steps of the
//! window's size, one step a second.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::position::{Position, Stamp};

/// How often a lane sweeps below its cursor.
pub(super) const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// How long a committed batch's first position is remembered: the marks of a batch commit
/// asynchronously, and a Postgres crash may forget those of the last fraction of a second.
const RECENT: Duration = Duration::from_secs(10);

/// What a read of up to `limit` rows of a range found ([`RANGE`](super::sql::RANGE), or the
/// window's [`WINDOW`](super::sql::WINDOW)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Window {
    /// The rows read: the range's unpublished rows, up to the limit.
    pub(super) rows: i64,
    /// The first of them whose subject is not parked (locked or not).
    pub(super) first_claimable: Option<Position>,
    /// The last of them.
    pub(super) last: Option<Position>,
}

impl Window {
    fn full(&self, limit: i64) -> bool {
        self.rows >= limit
    }
}

/// A lane's cursor and its sweep.
#[derive(Debug)]
pub(super) struct Cursor {
    /// Every unpublished row before it was parked when the cursor passed it (inclusive).
    start: Position,
    /// Where the next claim starts, when not at `start`: after a window that published nothing
    /// (its rows are locked by another transaction, paused, or cut behind such a row), the
    /// next claim reads the window after it, so that rows the cursor cannot pass never hold
    /// the rest of the lane up.
    scan: Option<Position>,
    /// The sweep's next step starts here (inclusive).
    sweep_from: Position,
    next_sweep: Instant,
    /// The first position of each batch committed within [`RECENT`].
    recent: VecDeque<(Instant, Position)>,
}

impl Cursor {
    /// A cursor at the start of the table.
    pub(super) fn new(now: Instant) -> Cursor {
        Cursor {
            start: Position::START,
            scan: None,
            sweep_from: Position::START,
            next_sweep: now + SWEEP_EVERY,
            recent: VecDeque::new(),
        }
    }

    /// The cursor: the lane's windows and claims read from here.
    pub(super) fn start(&self) -> Position {
        self.start
    }

    /// Where the next claim reads from, when not from [`start`](Self::start).
    pub(super) fn scan(&self) -> Option<Position> {
        self.scan.filter(|s| *s > self.start)
    }

    /// A claim read up to `bound` (a full window) and published nothing: the next one reads
    /// the window after it; otherwise the next one reads from the cursor again.
    pub(super) fn scanned(&mut self, bound: Option<Position>, published: bool) {
        self.scan = match bound {
            Some(bound) if !published => Some(bound.after()),
            _ => None,
        };
    }

    /// Moves on after a read of up to `limit` rows from [`start`](Self::start): to its first
    /// claimable row (or past the rows it read, when none of them is), but never past the
    /// horizon `safe` (when there is none yet, the cursor stays). Returns the position the
    /// claim must not pass: the window's last row, when the window was full. Rows after it
    /// may be any number of a held subject's (after the horizon too, while a long or prepared
    /// transaction holds it back), which the next batches pass a window at a time, by the
    /// cursor or, past the horizon, by the scan ([`scanned`](Self::scanned)).
    pub(super) fn advance(
        &mut self,
        window: &Window,
        limit: i64,
        safe: Option<Stamp>,
    ) -> Option<Position> {
        let cap = safe.map(Position::at_start_of);
        let full = window.full(limit);
        let candidate = match (window.first_claimable, window.last) {
            (Some(first), _) => first,
            // every row read is parked, the last one too: on past it
            (None, Some(last)) if full => last.after(),
            // every row there is to read is parked
            _ => Position::at_start_of(Stamp::INFINITY),
        };
        if let Some(cap) = cap {
            self.start = self.start.max(candidate.min(cap));
        }
        bound(window, limit)
    }

    /// Moves back to `to`, when it is before the cursor: a row there can be claimed.
    pub(super) fn pull_back(&mut self, to: Position) {
        self.start = self.start.min(to);
    }

    /// The range the sweep reads next, `[from, to)`, when a step is due at `now`.
    pub(super) fn sweep_due(&self, now: Instant) -> Option<(Position, Position)> {
        (now >= self.next_sweep && self.sweep_from < self.start)
            .then_some((self.sweep_from, self.start))
    }

    /// When the next sweep step is due, if there is anything below the cursor to sweep: a
    /// cursor at the start of the table (no horizon yet: samples refused, or a transaction
    /// running since the relay's first sample) has none, and a waiting lane does not wake for
    /// it (it would wake at once, its step being overdue, and claim in a loop).
    pub(super) fn next_sweep(&self) -> Option<Instant> {
        (self.sweep_from < self.start).then_some(self.next_sweep)
    }

    /// A sweep step read `window` (up to `limit` rows) at `now`: a claimable row there sends
    /// the cursor back to the start of the table, so that the windows find the first claimable
    /// row again (the step began where the last one ended: an older row of the same subject may
    /// lie before it, and must go out first), and the next step starts over from the
    /// beginning; otherwise the next step goes on after the rows read, or starts over when it
    /// read to the cursor. Returns the row found, if any.
    pub(super) fn swept(&mut self, window: &Window, limit: i64, now: Instant) -> Option<Position> {
        self.next_sweep = now + SWEEP_EVERY;
        if let Some(found) = window.first_claimable {
            self.pull_back(Position::START);
            self.sweep_from = Position::START;
            return Some(found);
        }
        self.sweep_from = match window.last {
            Some(last) if window.full(limit) => last.after(),
            _ => Position::START,
        };
        None
    }

    /// A batch whose first row was at `first` committed at `now`.
    pub(super) fn committed(&mut self, first: Position, now: Instant) {
        while self
            .recent
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > RECENT)
        {
            self.recent.pop_front();
        }
        self.recent.push_back((now, first));
    }

    /// The connection to Postgres was lost: the marks of the batches committed just before may
    /// be lost with it (they commit asynchronously), so the cursor goes back before them.
    pub(super) fn lost_marks(&mut self) {
        if let Some(first) = self.recent.iter().map(|(_, p)| *p).min() {
            self.pull_back(first);
        }
        self.recent.clear();
    }
}

/// The last row of a full window: a claim (from the cursor or a scan) does not read past it.
pub(super) fn bound(window: &Window, limit: i64) -> Option<Position> {
    match (window.full(limit), window.last) {
        (true, Some(last)) => Some(last),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    fn p(at: i64, id: u128) -> Position {
        Position {
            at: Stamp(at),
            id: Uuid::from_u128(id),
        }
    }

    fn window(rows: i64, first_claimable: Option<Position>, last: Option<Position>) -> Window {
        Window {
            rows,
            first_claimable,
            last,
        }
    }

    const LIMIT: i64 = 3;

    #[test]
    fn the_cursor_moves_to_the_first_claimable_row_and_never_past_the_horizon() {
        let now = Instant::now();
        let mut c = Cursor::new(now);
        let hi = c.advance(
            &window(2, Some(p(10, 1)), Some(p(20, 1))),
            LIMIT,
            Some(Stamp(100)),
        );
        assert_eq!(c.start(), p(10, 1));
        assert_eq!(
            hi, None,
            "a window that is not full does not bound the claim"
        );
        c.advance(
            &window(1, Some(p(150, 1)), Some(p(150, 1))),
            LIMIT,
            Some(Stamp(100)),
        );
        assert_eq!(
            c.start(),
            Position::at_start_of(Stamp(100)),
            "the horizon caps it"
        );
    }

    #[test]
    fn without_a_horizon_the_cursor_stays_where_it_is() {
        let mut c = Cursor::new(Instant::now());
        c.advance(&window(1, Some(p(10, 1)), Some(p(10, 1))), LIMIT, None);
        assert_eq!(c.start(), Position::START);
    }

    #[test]
    fn a_window_of_parked_rows_is_passed_a_window_at_a_time() {
        let mut c = Cursor::new(Instant::now());
        let safe = Some(Stamp(1_000));
        let hi = c.advance(&window(LIMIT, None, Some(p(30, 3))), LIMIT, safe);
        assert_eq!(c.start(), p(30, 4), "past its last row");
        assert_eq!(hi, Some(p(30, 3)), "and the claim does not read past it");
        c.advance(&window(1, None, Some(p(40, 1))), LIMIT, safe);
        assert_eq!(
            c.start(),
            Position::at_start_of(Stamp(1_000)),
            "every row there is parked: on to the horizon"
        );
    }

    #[test]
    fn a_full_window_bounds_the_claim_past_the_horizon_too() {
        // a long transaction holds the horizon back, and a held subject's rows fill the
        // window after it: the claim reads that window, and the scan the ones after it
        let mut c = Cursor::new(Instant::now());
        let hi = c.advance(
            &window(LIMIT, None, Some(p(500, 1))),
            LIMIT,
            Some(Stamp(100)),
        );
        assert_eq!(c.start(), Position::at_start_of(Stamp(100)), "capped");
        assert_eq!(hi, Some(p(500, 1)));
        c.scanned(hi, false);
        assert_eq!(c.scan(), Some(p(500, 2)), "the next claim reads on");
        let hi = c.advance(
            &window(LIMIT, Some(p(5, 1)), Some(p(500, 1))),
            LIMIT,
            Some(Stamp(100)),
        );
        assert_eq!(hi, Some(p(500, 1)));
        let hi = c.advance(
            &window(LIMIT, Some(p(5, 1)), Some(p(50, 1))),
            LIMIT,
            Some(Stamp(100)),
        );
        assert_eq!(hi, Some(p(50, 1)));
    }

    #[test]
    fn the_cursor_never_moves_back_by_advancing_only_by_pulling_back() {
        let mut c = Cursor::new(Instant::now());
        c.advance(
            &window(1, Some(p(50, 1)), Some(p(50, 1))),
            LIMIT,
            Some(Stamp(100)),
        );
        c.advance(
            &window(1, Some(p(20, 1)), Some(p(20, 1))),
            LIMIT,
            Some(Stamp(100)),
        );
        assert_eq!(c.start(), p(50, 1));
        c.pull_back(p(20, 1));
        assert_eq!(c.start(), p(20, 1));
        c.pull_back(p(60, 1));
        assert_eq!(c.start(), p(20, 1));
    }

    #[test]
    fn the_sweep_steps_below_the_cursor_once_a_second_and_pulls_it_back_to_what_it_finds() {
        let t0 = Instant::now();
        let mut c = Cursor::new(t0);
        c.advance(
            &window(1, Some(p(500, 1)), Some(p(500, 1))),
            LIMIT,
            Some(Stamp(1_000)),
        );
        assert_eq!(c.sweep_due(t0), None, "not yet");
        assert_eq!(c.next_sweep(), Some(t0 + SWEEP_EVERY));
        let t1 = t0 + SWEEP_EVERY;
        assert_eq!(c.sweep_due(t1), Some((Position::START, p(500, 1))));
        // a full step of parked rows: the next goes on after them
        assert_eq!(
            c.swept(&window(LIMIT, None, Some(p(30, 1))), LIMIT, t1),
            None
        );
        assert_eq!(c.sweep_due(t1), None, "a second later");
        let t2 = t1 + SWEEP_EVERY;
        assert_eq!(c.sweep_due(t2), Some((p(30, 2), p(500, 1))));
        // it finds a claimable row: the windows start over (an older row of its subject may lie
        // before the step's start), and so does the sweep
        assert_eq!(
            c.swept(&window(2, Some(p(40, 7)), Some(p(45, 1))), LIMIT, t2),
            Some(p(40, 7))
        );
        assert_eq!(c.start(), Position::START);
        let t3 = t2 + SWEEP_EVERY;
        assert_eq!(c.sweep_due(t3), None, "nothing lies before the start");
        c.advance(
            &window(1, Some(p(20, 1)), Some(p(20, 1))),
            LIMIT,
            Some(Stamp(1_000)),
        );
        assert_eq!(
            c.start(),
            p(20, 1),
            "the first claimable row, older than the one found"
        );
        assert_eq!(c.sweep_due(t3), Some((Position::START, p(20, 1))));
        // a step that read to the cursor starts over too
        c.swept(&window(1, None, Some(p(1, 1))), LIMIT, t3);
        assert_eq!(
            c.sweep_due(t3 + SWEEP_EVERY),
            Some((Position::START, p(20, 1)))
        );
    }

    #[test]
    fn a_window_that_published_nothing_is_read_past_and_a_publish_goes_back_to_the_cursor() {
        let mut c = Cursor::new(Instant::now());
        let safe = Some(Stamp(1_000));
        let bound = c.advance(&window(LIMIT, Some(p(10, 1)), Some(p(30, 1))), LIMIT, safe);
        assert_eq!(c.scan(), None);
        c.scanned(bound, false);
        assert_eq!(c.scan(), Some(p(30, 2)), "the next window");
        c.scanned(Some(p(60, 1)), false);
        assert_eq!(c.scan(), Some(p(60, 2)));
        c.scanned(None, false);
        assert_eq!(c.scan(), None, "it read to the end: back to the cursor");
        c.scanned(bound, false);
        c.scanned(Some(p(60, 1)), true);
        assert_eq!(c.scan(), None, "it published: back to the cursor");
        c.scanned(Some(p(5, 1)), false);
        assert_eq!(c.scan(), None, "a scan behind the cursor is no scan");
    }

    #[test]
    fn a_cursor_at_the_start_has_nothing_to_sweep() {
        let t0 = Instant::now();
        let c = Cursor::new(t0);
        assert_eq!(c.sweep_due(t0 + SWEEP_EVERY * 5), None);
        assert_eq!(c.next_sweep(), None, "nothing to wake for");
    }

    #[test]
    fn lost_marks_take_the_cursor_back_before_the_recent_batches() {
        let t0 = Instant::now();
        let mut c = Cursor::new(t0);
        c.advance(
            &window(1, Some(p(900, 1)), Some(p(900, 1))),
            LIMIT,
            Some(Stamp(1_000)),
        );
        c.committed(p(100, 1), t0);
        c.committed(p(700, 1), t0 + RECENT + Duration::from_secs(1));
        c.committed(p(800, 1), t0 + RECENT + Duration::from_secs(2));
        c.lost_marks();
        assert_eq!(
            c.start(),
            p(700, 1),
            "a batch older than RECENT is not taken back"
        );
        c.lost_marks();
        assert_eq!(c.start(), p(700, 1), "nothing recent is left");
    }
}
