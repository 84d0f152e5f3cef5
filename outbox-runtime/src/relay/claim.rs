//! [`Claim`]: one batch's transaction, from the claim of its rows to their marks and the
//! commit (docs/relay.md, *One batch*, *Order* and *Parked subjects, and the floor*).

use std::collections::{HashMap, HashSet};
use std::fmt;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::Row as _;
use tokio::time::Instant;
use tracing::Instrument;
use uuid::Uuid;

use super::floor::Floor;
use super::lanes::{Lane, Waiting};
use super::position::{Position, Stamp};
use super::publish::{self, Publisher, Settled};
use super::row::{Row, Tid};
use super::settle::Effects;
use super::sql;
use super::stats::BatchReport;
use super::tx::{timed, Tx, STATEMENT_TIMEOUT};
use super::{Relay, LOCK_NAMESPACE};
use crate::error::Result;
use crate::table::{OUTBOX_EVENTS, OUTBOX_RETRIES};

/// A claimed batch: its rows are locked in an open transaction until [`commit`](Self::commit).
///
/// Dropping a claim without committing ends the transaction as a crash would (the connection
/// is closed): rows that were published stay unpublished and are republished (same id) by a
/// later batch.
pub struct Claim<'r> {
    relay: &'r Relay,
    tx: Tx,
    rows: Vec<Row>,
    /// The first `due` rows are heads whose retry was due (their subjects are parked).
    due: usize,
    settled: Option<Settled>,
    report: BatchReport,
    lane: Lane,
    floor: Position,
    /// Subjects this claim left out: paused by this relay, or cut at a hole.
    paused: Vec<String>,
    /// Subjects cut at a hole another transaction holds.
    cut: Vec<String>,
    /// Seconds until the earliest retry is due, on the database's clock.
    next_retry: Option<f64>,
    /// Whether the claim may have read rows after the floor it had to pass (parked or paused
    /// subjects): unless it did, a look ahead of the floor has nothing to skip.
    passed: bool,
    /// Whether the claim holds every unpublished row of the lane from the floor to its last
    /// row (step 4's count), nothing cut.
    exact: bool,
    /// The floor to move back when a parked head is published, for claims made through
    /// [`Relay::claim`] (a lane applies its batch's effects itself).
    shared_floor: Option<&'r tokio::sync::Mutex<Floor>>,
}

impl fmt::Debug for Claim<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("rows", &self.rows.len())
            .field("report", &self.report)
            .finish_non_exhaustive()
    }
}

/// Which claim statement [`Claim::fetch`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    /// [`CLAIM_DUE`](sql::CLAIM_DUE): the heads whose retry is due.
    Due,
    /// [`CLAIM`](sql::CLAIM): the claimable rows after the floor.
    Main,
}

/// What the batch learns first ([`SETTINGS`](sql::SETTINGS)).
struct Start {
    parked: bool,
    /// A parked subject's retry is due now.
    due: bool,
    next_retry: Option<f64>,
    xmin: u64,
    xmax: u64,
    /// When the oldest transaction running on the database began, if this session sees them
    /// all and it was asked for ([`SETTINGS`](sql::SETTINGS)).
    oldest: Option<DateTime<Utc>>,
}

impl<'r> Claim<'r> {
    /// Claims the rows of `lane` after its floor: the heads whose retry is due, then the
    /// claimable rows, each subject cut at its first hole.
    pub(super) async fn begin(
        relay: &'r Relay,
        lane: Lane,
        floor: &mut Floor,
        shared_floor: Option<&'r tokio::sync::Mutex<Floor>>,
    ) -> Result<Claim<'r>> {
        let span = tracing::debug_span!("outbox.claim", claimed = tracing::field::Empty);
        async {
            let mut tx = Tx::begin(&relay.pool).await?;
            let read_oldest = floor.wants_oldest(Instant::now());
            let start = settings(&mut tx, relay, read_oldest).await?;
            let now = Instant::now();
            if read_oldest {
                floor.read_oldest(start.oldest, now);
            }
            floor.begin(start.xmin);
            let paused = relay.paused(now);
            if floor.wants_check(now, start.parked) {
                if let Some(below) =
                    below_floor(&mut tx, relay, lane, floor.position(), &paused).await?
                {
                    floor.pull_back(below);
                }
            }
            if floor.wants_advance(now, start.parked) {
                let to = advance(&mut tx, relay, lane, floor.position(), &paused).await?;
                let to = to.map(|to| floor.behind_oldest(to));
                floor.advanced(to, start.xmax, now);
            }
            let mut claim = Claim {
                relay,
                tx,
                rows: Vec::new(),
                due: 0,
                settled: None,
                report: BatchReport::default(),
                lane,
                floor: floor.position(),
                paused,
                cut: Vec::new(),
                next_retry: start.next_retry,
                passed: false,
                exact: false,
                shared_floor,
            };
            if start.due {
                claim.rows = claim
                    .fetch(Which::Due, relay.config.batch_size, None)
                    .await?;
                claim.due = claim.rows.len();
            }
            claim.claim_rows().await?;
            floor.passed(claim.passed);
            claim.report.claimed = claim.rows.len() + claim.report.skipped;
            tracing::Span::current().record("claimed", claim.report.claimed);
            Ok(claim)
        }
        .instrument(span)
        .await
    }

    /// [`CLAIM_DUE`](sql::CLAIM_DUE) or [`CLAIM`](sql::CLAIM) (after `after`, or the floor), up
    /// to `limit` rows; with the trace context columns when the table has them.
    async fn fetch(
        &mut self,
        which: Which,
        limit: usize,
        after: Option<Position>,
    ) -> Result<Vec<Row>> {
        let config = &self.relay.config;
        let lane = self.lane;
        let from = after.unwrap_or(self.floor);
        let statement = match (which, self.relay.trace_columns) {
            (Which::Due, false) => sql::CLAIM_DUE,
            (Which::Due, true) => sql::CLAIM_DUE_TRACED,
            (Which::Main, false) => sql::CLAIM,
            (Which::Main, true) => sql::CLAIM_TRACED,
        };
        let query = sqlx::query(statement)
            .bind(limit as i64)
            .bind(config.partitions)
            .bind(lane.count)
            .bind(lane.index)
            .bind(LOCK_NAMESPACE);
        let query = if which == Which::Main {
            query.bind(from.at_text()).bind(from.id).bind(&self.paused)
        } else {
            query
        };
        let rows: Vec<PgRow> = timed(OUTBOX_RETRIES, query.fetch_all(self.tx.conn())).await?;
        rows.iter()
            .map(Row::decode)
            .collect::<sqlx::Result<Vec<Row>>>()
            .map_err(|e| OUTBOX_EVENTS.error(e))
    }

    /// The main claim, cut at holes; when the cut leaves room in a full claim, once more after
    /// it without the cut subjects, so that one subject's hole never uses up the batch.
    async fn claim_rows(&mut self) -> Result<()> {
        let limit = self.relay.config.batch_size - self.due;
        if limit == 0 {
            self.passed = true; // nothing read: nothing known
            return Ok(());
        }
        let mut rows = self.fetch(Which::Main, limit, None).await?;
        let full = rows.len() == limit;
        // a claim that is not full read its range to the end: what it passed is not counted
        self.passed = !full;
        let last = rows.last().map(|r| r.position);
        let mut cut = self.cut_holes(&mut rows).await?;
        if full && !cut.is_empty() {
            self.paused.extend(cut.iter().cloned());
            let room = limit - rows.len();
            let mut more = self.fetch(Which::Main, room, last).await?;
            rows.append(&mut more);
            cut.extend(self.cut_holes(&mut rows).await?);
        }
        self.exact &= cut.is_empty();
        if !cut.is_empty() && rows.is_empty() && self.due == 0 {
            metrics::counter!(crate::metrics::CUT_BATCHES).increment(1);
            tracing::warn!(
                subjects = cut.len(),
                first = %cut[0],
                "outbox relay: every row this batch claimed waits behind an older row of its subject that another transaction holds (another relay's batch that just committed, or a lock taken outside the relay); those subjects pause briefly, the others go on"
            );
        }
        self.rows.append(&mut rows);
        self.cut = cut;
        Ok(())
    }

    /// Cuts each subject of `rows` (after the due heads) at its first hole: an unpublished row
    /// after the floor, not after the subject's last claimed row, that the claim does not hold
    /// ([`UNCLAIMED`](sql::UNCLAIMED) first: when it counts exactly the claim, there is none).
    /// Returns the subjects cut; their rows stay locked and untouched until the transaction
    /// ends, and count as skipped.
    async fn cut_holes(&mut self, rows: &mut Vec<Row>) -> Result<Vec<String>> {
        let Some(last) = rows.iter().map(|r| r.position).max() else {
            return Ok(Vec::new());
        };
        let lane = self.lane;
        let (in_range, unpublished): (i64, i64) = timed(
            OUTBOX_EVENTS,
            sqlx::query_as(sql::UNCLAIMED)
                .bind(self.relay.config.partitions)
                .bind(lane.count)
                .bind(lane.index)
                .bind(self.floor.at_text())
                .bind(self.floor.id)
                .bind(last.at_text())
                .bind(last.id)
                .bind(&self.paused)
                .bind(rows.len() as i64)
                .fetch_one(self.tx.conn()),
        )
        .await?;
        self.passed |= unpublished > in_range;
        self.exact = unpublished == rows.len() as i64;
        if in_range == rows.len() as i64 {
            return Ok(Vec::new());
        }
        let holes = self.holes(rows).await?;
        if holes.is_empty() {
            return Ok(Vec::new());
        }
        let before = rows.len();
        rows.retain(|r| holes.get(&r.subject).is_none_or(|hole| r.position < *hole));
        self.report.skipped += before - rows.len();
        let cut: Vec<String> = holes.into_keys().collect();
        tracing::debug!(
            subjects = cut.len(),
            "outbox claim cut subjects at an older event it does not hold"
        );
        Ok(cut)
    }

    /// [`GAPS`](sql::GAPS) for the subjects of `rows`: each subject's first hole.
    async fn holes(&mut self, rows: &[Row]) -> Result<HashMap<String, Position>> {
        let mut last: HashMap<&str, Position> = HashMap::new();
        for row in rows {
            last.insert(row.subject.as_str(), row.position); // in order: the last one wins
        }
        let subjects: Vec<&str> = last.keys().copied().collect();
        let ats: Vec<String> = last.values().map(Position::at_text).collect();
        let ids: Vec<Uuid> = last.values().map(|p| p.id).collect();
        let held: Vec<Uuid> = self.rows.iter().chain(rows).map(|r| r.id).collect();
        let conn = self.tx.conn();
        timed(
            OUTBOX_EVENTS,
            sqlx::query(sql::NESTLOOP_OFF).execute(&mut *conn),
        )
        .await?;
        let found: Vec<PgRow> = timed(
            OUTBOX_EVENTS,
            sqlx::query(sql::GAPS)
                .bind(&subjects)
                .bind(&ats)
                .bind(&ids)
                .bind(self.floor.at_text())
                .bind(self.floor.id)
                .bind(&held)
                .fetch_all(&mut *conn),
        )
        .await?;
        timed(
            OUTBOX_EVENTS,
            sqlx::query(sql::NESTLOOP_ON).execute(&mut *conn),
        )
        .await?;
        let mut holes = HashMap::new();
        for row in &found {
            let subject: String = row.try_get(0).map_err(|e| OUTBOX_EVENTS.error(e))?;
            let micros: i64 = row
                .try_get_unchecked(1)
                .map_err(|e| OUTBOX_EVENTS.error(e))?;
            let id: Uuid = row.try_get(2).map_err(|e| OUTBOX_EVENTS.error(e))?;
            // an unreadable instant is before every claimed row: the whole subject is cut
            let at = Stamp::from_pg_micros(micros).unwrap_or(Stamp::NegInfinity);
            holes.insert(subject, Position { at, id });
        }
        Ok(holes)
    }

    /// [`WAITING`](sql::WAITING), in this batch's transaction (and with its settings).
    pub(super) async fn waiting(&mut self) -> Result<Waiting> {
        let lane = self.lane;
        let found: Option<i32> = timed(
            OUTBOX_EVENTS,
            sqlx::query_scalar(sql::WAITING)
                .bind(self.relay.config.partitions)
                .bind(lane.count)
                .bind(lane.index)
                .bind(self.floor.at_text())
                .bind(self.floor.id)
                .bind(&self.paused)
                .fetch_optional(self.tx.conn()),
        )
        .await?;
        Ok(match found {
            Some(_) => Waiting::Elsewhere,
            None => Waiting::Nothing,
        })
    }

    /// Number of rows claimed (and not cut).
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the claim is empty.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The claimed event ids, in the relay's order per subject.
    pub fn ids(&self) -> Vec<Uuid> {
        self.rows.iter().map(|r| r.id).collect()
    }

    /// Publishes the claimed rows, pipelined across subjects, under one deadline (see
    /// docs/relay.md) and returns what happened; nothing is written to the table until
    /// [`commit`](Self::commit). Calling it again does nothing and returns the same report.
    pub async fn publish(&mut self) -> BatchReport {
        if self.settled.is_some() {
            return self.report;
        }
        // each message has a span of its own, outbox.publish, which this one links to
        let span = tracing::debug_span!("outbox.batch", rows = self.rows.len());
        let to = Publisher {
            jetstream: &self.relay.jetstream,
            config: &self.relay.config,
            streams: &self.relay.streams,
        };
        let settled = publish::publish(&self.rows, to).instrument(span).await;
        self.report
            .apply(&settled, &self.rows, self.relay.config.max_attempts);
        self.settled = Some(settled);
        self.report
    }

    /// Marks the acknowledged rows published and the failed rows' `attempts + 1`, parks the
    /// subjects that failed or are held, and commits. Publishes first if
    /// [`publish`](Self::publish) was not called.
    ///
    /// The commit is asynchronous (`synchronous_commit = off` for this transaction only): a
    /// Postgres crash can forget the marks of the last fraction of a second, and those rows are
    /// then republished under the same ids, which the stream's duplicate window and the
    /// consumers' dedupe absorb. Nothing can be lost this way: the events themselves were
    /// committed synchronously by the emitting transaction.
    pub async fn commit(self) -> Result<BatchReport> {
        let shared = self.shared_floor;
        let relay = self.relay;
        let effects = self.finish().await?;
        effects.pause(relay, Instant::now());
        if let Some(floor) = shared {
            // only back: a caller driving the steps hears no `release` (`outbox unblock`,
            // `verify --republish`), so its floor does not follow the rows it publishes
            let mut floor = floor.lock().await;
            for position in &effects.released {
                floor.pull_back(*position);
            }
        }
        Ok(effects.report)
    }

    /// [`commit`](Self::commit), returning what the lane makes of it too.
    pub(super) async fn finish(mut self) -> Result<Effects> {
        self.publish().await;
        let settled = self.settled.take().unwrap_or_default();
        let cleared = self.cleared(&settled);
        let mut effects = Effects::new(
            self.relay,
            &self.rows,
            self.due,
            &settled,
            self.cut,
            self.report,
            self.next_retry,
        );
        effects.cleared = cleared;
        super::settle::write(&mut self.tx, self.relay, &self.rows, self.due, &settled).await?;
        self.tx.commit().await?;
        super::settle::record(self.relay, &self.rows, &settled, &self.report);
        Ok(effects)
    }

    /// The last row of a batch that held every unpublished row of the lane from the floor to
    /// there (no due head, nothing cut) and had every one acknowledged: the lane's floor may
    /// follow it ([`Floor::cleared`]).
    fn cleared(&self, settled: &Settled) -> Option<Position> {
        if !self.exact || self.due > 0 || settled.acked.len() != self.rows.len() {
            return None;
        }
        self.rows.iter().map(|r| r.position).max()
    }

    /// Rolls the claim back without publishing: its rows and subjects are free for the next
    /// claim, of this relay or another.
    pub(super) async fn release(self) -> Result<Effects> {
        let effects = Effects::new(
            self.relay,
            &self.rows,
            0,
            &Settled::default(),
            self.cut,
            self.report,
            self.next_retry,
        );
        self.tx.rollback().await?;
        Ok(effects)
    }
}

/// [`SETTINGS`](sql::SETTINGS): the batch's own settings, and what it needs to know first.
async fn settings(tx: &mut Tx, relay: &Relay, read_oldest: bool) -> Result<Start> {
    let statement_ms = STATEMENT_TIMEOUT.as_millis().to_string();
    let idle_ms = relay
        .config
        .idle_in_transaction_timeout()
        .as_millis()
        .to_string();
    let row: PgRow = timed(
        OUTBOX_RETRIES,
        sqlx::query(sql::SETTINGS)
            .bind(statement_ms)
            .bind(idle_ms)
            .bind(read_oldest)
            .fetch_one(tx.conn()),
    )
    .await?;
    let get = |e| OUTBOX_RETRIES.error(e);
    let xid = |s: String| s.parse::<u64>().unwrap_or(0);
    Ok(Start {
        parked: row.try_get("parked").map_err(get)?,
        due: row.try_get("due").map_err(get)?,
        next_retry: row.try_get("next_retry").map_err(get)?,
        xmin: xid(row.try_get("xmin").map_err(get)?),
        xmax: xid(row.try_get("xmax").map_err(get)?),
        oldest: row.try_get("oldest").map_err(get)?,
    })
}

/// [`ADVANCE`](sql::ADVANCE): where the lane's floor may move.
async fn advance(
    tx: &mut Tx,
    relay: &Relay,
    lane: Lane,
    floor: Position,
    paused: &[String],
) -> Result<Option<Position>> {
    let row: Option<PgRow> = timed(
        OUTBOX_RETRIES,
        sqlx::query(sql::ADVANCE)
            .bind(relay.config.partitions)
            .bind(lane.count)
            .bind(lane.index)
            .bind(floor.at_text())
            .bind(floor.id)
            .bind(paused)
            .fetch_optional(tx.conn()),
    )
    .await?;
    let Some(row) = row else { return Ok(None) };
    let stamp = |i: usize| -> Option<Stamp> {
        let micros: Option<i64> = row.try_get_unchecked(i).ok().flatten();
        micros.and_then(|m| Stamp::from_pg_micros(m).ok())
    };
    let Some(settled) = stamp(2) else {
        return Ok(None);
    };
    let mut to = Position {
        at: settled,
        id: Uuid::max(),
    };
    let first: Option<Uuid> = row.try_get(1).map_err(|e| OUTBOX_EVENTS.error(e))?;
    if let Some(first) = first {
        // an unreadable instant is not a place for the floor: stay where it is
        let Some(at) = stamp(0) else { return Ok(None) };
        to = to.min(Position { at, id: first }.before());
    }
    Ok(Some(to))
}

/// [`BELOW_FLOOR`](sql::BELOW_FLOOR): a claimable row that appeared at or before the floor.
async fn below_floor(
    tx: &mut Tx,
    relay: &Relay,
    lane: Lane,
    floor: Position,
    paused: &[String],
) -> Result<Option<Position>> {
    let row: Option<PgRow> = timed(
        OUTBOX_RETRIES,
        sqlx::query(sql::BELOW_FLOOR)
            .bind(relay.config.partitions)
            .bind(lane.count)
            .bind(lane.index)
            .bind(floor.at_text())
            .bind(floor.id)
            .bind(paused)
            .fetch_optional(tx.conn()),
    )
    .await?;
    let Some(row) = row else { return Ok(None) };
    let micros: i64 = row
        .try_get_unchecked(0)
        .map_err(|e| OUTBOX_EVENTS.error(e))?;
    let id: Uuid = row.try_get(1).map_err(|e| OUTBOX_EVENTS.error(e))?;
    let at = Stamp::from_pg_micros(micros).unwrap_or(Stamp::NegInfinity);
    tracing::info!(%id, "outbox relay found a row older than the rows it had passed (an old created_at); it goes out now");
    Ok(Some(Position { at, id }))
}

/// The ctids of `indices` into `rows`.
pub(super) fn ctids(rows: &[Row], indices: impl IntoIterator<Item = usize>) -> Vec<Tid> {
    indices.into_iter().map(|i| rows[i].ctid).collect()
}

/// The distinct subjects of `rows` at `indices`, in order.
pub(super) fn subjects(rows: &[Row], indices: impl IntoIterator<Item = usize>) -> Vec<&str> {
    let mut seen = HashSet::new();
    indices
        .into_iter()
        .map(|i| rows[i].subject.as_str())
        .filter(|s| seen.insert(*s))
        .collect()
}
