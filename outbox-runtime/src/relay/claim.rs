//! [`Claim`]: one batch's transaction, from the claim of its rows to their marks and the
//! commit (docs/relay.md, *One batch*, *Order* and *The cursor*).

use std::collections::HashSet;
use std::fmt;

use sqlx::postgres::PgRow;
use sqlx::Row as _;
use tokio::time::Instant;
use tracing::Instrument;
use uuid::Uuid;

use super::cursor::{Cursor, Window};
use super::lanes::Lane;
use super::position::{Position, Stamp};
use super::publish::{self, Publisher, Settled};
use super::row::Row;
use super::settle::Effects;
use super::sql;
use super::stats::BatchReport;
use super::tx::{timed, Came, Kept, Tx, STATEMENT_TIMEOUT};
use super::Relay;
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
    /// Seconds until the earliest retry is due, on the database's clock.
    next_retry: Option<f64>,
    /// The cursor to move back when a parked head is published, for claims made through
    /// [`Relay::claim`] (a lane applies its batch's effects itself).
    shared_cursor: Option<&'r tokio::sync::Mutex<Cursor>>,
    /// The last position the claim could read (a full window's), if any.
    bound: Option<Position>,
    /// Where the connection goes when the transaction ends: a lane's, kept for its next batch.
    kept: Option<&'r mut Kept>,
}

impl fmt::Debug for Claim<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("rows", &self.rows.len())
            .field("report", &self.report)
            .finish_non_exhaustive()
    }
}

/// What the batch learns of the retry schedule with its window ([`WINDOW`](sql::WINDOW)).
struct Start {
    /// A parked subject's retry is due now.
    due: bool,
    next_retry: Option<f64>,
}

impl<'r> Claim<'r> {
    /// Claims the rows of `lane` from its cursor: the heads whose retry is due, then the
    /// claimable rows, each subject cut at its first hole. On `kept`'s connection if it has
    /// one, which gets the connection back when the transaction ends.
    pub(super) async fn begin(
        relay: &'r Relay,
        lane: Lane,
        cursor: &mut Cursor,
        shared_cursor: Option<&'r tokio::sync::Mutex<Cursor>>,
        mut kept: Option<&'r mut Kept>,
    ) -> Result<Claim<'r>> {
        let span = tracing::debug_span!("outbox.claim", claimed = tracing::field::Empty);
        async {
            let (mut tx, came) = Tx::acquire(&relay.pool, kept.as_deref_mut()).await?;
            if came == Came::Replaced {
                cursor.lost_marks();
            }
            // a lane's relay samples beside its batches (`Relay::run`); a claim of its own
            // (`Relay::claim`, driven by its caller) samples on its connection before its
            // transaction, where an error Postgres answers with (a revoked `pg_locks`) aborts
            // nothing
            let lane_run = shared_cursor.is_none();
            if !lane_run && relay.horizon.wants_sample(Instant::now()) {
                relay.horizon.sample_on(tx.conn()).await?;
            }
            begin_settings(&mut tx, relay).await?;
            let safe = if lane_run {
                relay.horizon.for_lane(Instant::now())
            } else {
                relay.horizon.safe()
            };
            let limit = relay.config.batch_size as i64;
            let now = Instant::now();
            if let Some((from, to)) = cursor.sweep_due(now) {
                let step = range(&mut tx, relay, lane, from, Some(to), limit).await?;
                if let Some(found) = cursor.swept(&step, limit, now) {
                    tracing::info!(position = %found, "outbox relay found a row before its cursor (a created_at older than its transaction, written by hand or by a clock behind the database's); it goes out now");
                }
            }
            let (window, start) = window(&mut tx, relay, lane, cursor.start(), limit).await?;
            let mut bound = cursor.advance(&window, limit, safe);
            // the claim reads from the cursor, now at the window's first claimable row
            let mut from = cursor.start();
            let scanning = cursor.scan();
            if let Some(scan) = scanning {
                let ahead = range(&mut tx, relay, lane, scan, None, limit).await?;
                from = scan;
                bound = super::cursor::bound(&ahead, limit);
            }
            tracing::debug!(
                lane = lane.index,
                cursor = %cursor.start(),
                scan = ?cursor.scan(),
                horizon = ?safe,
                window = window.rows,
                first_claimable = ?window.first_claimable,
                bound = ?bound,
                "outbox claim reads"
            );
            let mut claim = Claim {
                relay,
                tx,
                rows: Vec::new(),
                due: 0,
                settled: None,
                report: BatchReport::default(),
                next_retry: start.next_retry,
                shared_cursor,
                bound,
                kept,
            };
            let size = relay.config.batch_size;
            if start.due {
                claim.rows = claim.fetch_due(lane, size).await?;
                claim.due = claim.rows.len();
            }
            // a window with nothing claimable, read from the cursor, leaves the claim nothing
            // to find but rows committed since, which the next batch finds (or their
            // notification announces)
            let nothing = window.first_claimable.is_none() && scanning.is_none();
            if claim.due < size && !nothing {
                let paused = relay.paused(Instant::now());
                let (mut rows, cut) = claim
                    .fetch(lane, size - claim.due, from, bound, &paused)
                    .await?;
                claim.rows.append(&mut rows);
                claim.cut(cut);
            }
            relay.counters.claimed();
            claim.report.claimed = claim.rows.len() + claim.report.skipped;
            tracing::Span::current().record("claimed", claim.report.claimed);
            Ok(claim)
        }
        .instrument(span)
        .await
    }

    /// [`CLAIM_DUE`](sql::CLAIM_DUE), up to `limit` rows; with the trace context columns when
    /// the table has them.
    async fn fetch_due(&mut self, lane: Lane, limit: usize) -> Result<Vec<Row>> {
        let statement = if self.relay.trace_columns {
            sql::CLAIM_DUE_TRACED
        } else {
            sql::CLAIM_DUE
        };
        let query = sqlx::query(statement)
            .bind(limit as i64)
            .bind(self.relay.config.partitions)
            .bind(lane.count)
            .bind(lane.index);
        decode(timed(OUTBOX_RETRIES, query.fetch_all(self.tx.conn())).await?)
    }

    /// [`CLAIM_CUT`](sql::CLAIM_CUT) from `from`, up to and including `bound` if any, up to
    /// `limit` rows, leaving the `paused` subjects out; with the ids of the rows after a hole of
    /// their subject.
    async fn fetch(
        &mut self,
        lane: Lane,
        limit: usize,
        from: Position,
        bound: Option<Position>,
        paused: &[String],
    ) -> Result<(Vec<Row>, HashSet<Uuid>)> {
        let statement = if self.relay.trace_columns {
            sql::CLAIM_CUT_TRACED
        } else {
            sql::CLAIM_CUT
        };
        let query = sqlx::query(statement)
            .bind(limit as i64)
            .bind(self.relay.config.partitions)
            .bind(lane.count)
            .bind(lane.index)
            .bind(from.at)
            .bind(from.id)
            .bind(bound.map(|b| b.at))
            .bind(bound.map(|b| b.id))
            .bind(paused);
        let found = timed(OUTBOX_RETRIES, query.fetch_all(self.tx.conn())).await?;
        let mut cut = HashSet::new();
        for row in &found {
            if row
                .try_get::<bool, _>("cut")
                .map_err(|e| OUTBOX_EVENTS.error(e))?
            {
                cut.insert(row.try_get(0).map_err(|e| OUTBOX_EVENTS.error(e))?);
            }
        }
        Ok((decode(found)?, cut))
    }

    /// Cuts the rows of `cut` (each after a hole of its subject; never a due head, whose
    /// subject the claim leaves out): they stay locked and untouched until the transaction
    /// ends, and count as skipped.
    fn cut(&mut self, cut: HashSet<Uuid>) {
        if cut.is_empty() {
            return;
        }
        self.rows.retain(|row| !cut.contains(&row.id));
        self.report.skipped += cut.len();
        if self.rows.is_empty() {
            metrics::counter!(crate::metrics::CUT_BATCHES).increment(1);
            tracing::warn!(
                rows = cut.len(),
                "outbox relay: every row this batch claimed waits behind an older row of its subject that it does not hold: another transaction locks it (a batch of a relay whose lease just ran out, or a lock taken outside the relay), or its created_at lies before the cursor (written by hand, or by a clock behind the database's: the sweep reaches it within a second); they go once it is published"
            );
        } else {
            tracing::debug!(
                rows = cut.len(),
                "outbox claim cut subjects at an older event it does not hold (another transaction's, or one before the cursor)"
            );
        }
    }

    /// Whether the claim took nothing from a full window: the rows after that window are
    /// still to be read.
    pub(super) fn reads_on(&self) -> bool {
        self.rows.is_empty() && self.bound.is_some()
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
        let shared = self.shared_cursor;
        let relay = self.relay;
        let effects = self.finish().await?;
        effects.pause(relay, Instant::now());
        if let Some(cursor) = shared {
            let mut cursor = cursor.lock().await;
            effects.apply(&mut cursor, Instant::now());
        }
        Ok(effects.report)
    }

    /// [`commit`](Self::commit), returning what the lane makes of it too.
    pub(super) async fn finish(mut self) -> Result<Effects> {
        self.publish().await;
        let settled = self.settled.take().unwrap_or_default();
        let effects = Effects::new(
            self.relay,
            &self.rows,
            self.due,
            &settled,
            self.report,
            self.next_retry,
            self.bound,
        );
        super::settle::write(&mut self.tx, self.relay, &self.rows, self.due, &settled).await?;
        self.tx.commit(self.kept).await?;
        super::settle::record(self.relay, &self.rows, &settled, &self.report);
        Ok(effects)
    }

    /// Rolls the claim back without publishing: its rows and subjects are free for the next
    /// claim, of this relay or another.
    pub(super) async fn release(self) -> Result<Effects> {
        let effects = Effects::new(
            self.relay,
            &self.rows,
            0,
            &Settled::default(),
            self.report,
            self.next_retry,
            self.bound,
        );
        self.tx.rollback(self.kept).await?;
        Ok(effects)
    }
}

/// Decodes claimed rows ([`Row::decode`]).
fn decode(rows: Vec<PgRow>) -> Result<Vec<Row>> {
    rows.iter()
        .map(Row::decode)
        .collect::<sqlx::Result<Vec<Row>>>()
        .map_err(|e| OUTBOX_EVENTS.error(e))
}

/// [`begin_settings`](sql::begin_settings): the batch's transaction and its own settings.
async fn begin_settings(tx: &mut Tx, relay: &Relay) -> Result<()> {
    let statement = sql::begin_settings(
        STATEMENT_TIMEOUT.as_millis(),
        relay.config.idle_in_transaction_timeout().as_millis(),
    );
    // numbers only, the relay's own
    timed(
        OUTBOX_EVENTS,
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement)).execute(tx.conn()),
    )
    .await?;
    Ok(())
}

/// [`RANGE`](sql::RANGE) of `lane`: up to `limit` unpublished rows from `from` on, before `to`
/// if any.
async fn range(
    tx: &mut Tx,
    relay: &Relay,
    lane: Lane,
    from: Position,
    to: Option<Position>,
    limit: i64,
) -> Result<Window> {
    let row = read_range(tx, sql::RANGE, relay, lane, from, to, limit).await?;
    decode_window(&row)
}

/// [`WINDOW`](sql::WINDOW): the cursor's window of `lane` from `from`, up to `limit` rows, and
/// what the batch needs to know of the retry schedule.
async fn window(
    tx: &mut Tx,
    relay: &Relay,
    lane: Lane,
    from: Position,
    limit: i64,
) -> Result<(Window, Start)> {
    let row = read_range(tx, sql::WINDOW, relay, lane, from, None, limit).await?;
    let get = |e| OUTBOX_RETRIES.error(e);
    let start = Start {
        due: row.try_get("due").map_err(get)?,
        next_retry: row.try_get("next_retry").map_err(get)?,
    };
    Ok((decode_window(&row)?, start))
}

/// Runs `statement`, [`RANGE`](sql::RANGE) or one with its parameters.
async fn read_range(
    tx: &mut Tx,
    statement: &'static str,
    relay: &Relay,
    lane: Lane,
    from: Position,
    to: Option<Position>,
    limit: i64,
) -> Result<PgRow> {
    timed(
        OUTBOX_RETRIES,
        sqlx::query(statement)
            .bind(relay.config.partitions)
            .bind(lane.count)
            .bind(lane.index)
            .bind(from.at)
            .bind(from.id)
            .bind(to.map(|p| p.at))
            .bind(to.map(|p| p.id))
            .bind(limit)
            .fetch_one(tx.conn()),
    )
    .await
}

/// The [`Window`] a range statement read.
fn decode_window(row: &PgRow) -> Result<Window> {
    let get = |e| OUTBOX_EVENTS.error(e);
    let position = |at: &str, id: &str| -> Result<Option<Position>> {
        let at: Option<Stamp> = row.try_get(at).map_err(get)?;
        let id: Option<Uuid> = row.try_get(id).map_err(get)?;
        Ok(at.zip(id).map(|(at, id)| Position { at, id }))
    };
    Ok(Window {
        rows: row.try_get("rows").map_err(get)?,
        first_claimable: position("first_at", "first_id")?,
        last: position("last_at", "last_id")?,
    })
}

/// The ctids of `indices` into `rows`, in text form (the marks' parameter).
pub(super) fn ctids(rows: &[Row], indices: impl IntoIterator<Item = usize>) -> Vec<String> {
    indices
        .into_iter()
        .map(|i| rows[i].ctid.to_text())
        .collect()
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
