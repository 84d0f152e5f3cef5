//! What a batch writes before it commits, what it records after, and what its lane makes of
//! it: the marks, the retry schedule of the subjects that failed or are held, the metrics and
//! log lines (docs/relay.md, *Failures* and *Held rows*).

use std::collections::HashMap;

use tokio::time::Instant;
use uuid::Uuid;

use super::claim::{ctids, subjects};
use super::cursor::Cursor;
use super::position::Position;
use super::publish::{FailedAttempt, HoldCause, Settled};
use super::row::Row;
use super::sql;
use super::stats::BatchReport;
use super::tx::{timed, Tx};
use super::Relay;
use crate::error::{Error, Result};
use crate::metrics as names;
use crate::table::{OUTBOX_EVENTS, OUTBOX_RETRIES};

/// What a committed (or released) batch means for its lane.
#[derive(Debug)]
pub(super) struct Effects {
    pub(super) report: BatchReport,
    /// Parked heads that were published: their subjects' later rows lie before the cursor.
    pub(super) released: Vec<Position>,
    /// Subjects not attempted (an election, the connection): left out for a while, longer
    /// each time.
    pub(super) not_attempted: Vec<String>,
    /// Subjects published, when this relay has paused subjects (their pauses end).
    pub(super) published: Vec<String>,
    /// Seconds until the earliest retry is due, on the database's clock.
    pub(super) next_retry: Option<f64>,
    /// The batch's first row: its marks may be lost with the connection
    /// ([`Cursor::lost_marks`]).
    pub(super) first: Option<Position>,
    /// The last position the claim could read, if it was bounded.
    pub(super) bound: Option<Position>,
}

impl Effects {
    pub(super) fn new(
        relay: &Relay,
        rows: &[Row],
        due: usize,
        settled: &Settled,
        report: BatchReport,
        next_retry: Option<f64>,
        bound: Option<Position>,
    ) -> Effects {
        let released = settled
            .acked
            .iter()
            .filter(|&&i| i < due)
            .map(|&i| rows[i].position)
            .collect();
        let owned = |indices: Vec<&str>| indices.into_iter().map(str::to_owned).collect();
        let not_attempted = owned(subjects(
            rows,
            settled.not_attempted.iter().map(|(i, _)| *i),
        ));
        let published = if relay.pauses.is_empty() {
            Vec::new()
        } else {
            owned(subjects(rows, settled.acked.iter().copied()))
        };
        Effects {
            report,
            released,
            not_attempted,
            published,
            next_retry,
            first: rows.iter().map(|r| r.position).min(),
            bound,
        }
    }

    /// Moves `cursor` as the committed batch requires: back to each published parked head (the
    /// rows of its subject behind it are free now), and remembers the batch's first row.
    pub(super) fn apply(&self, cursor: &mut Cursor, now: Instant) {
        for position in &self.released {
            cursor.pull_back(*position);
        }
        if let Some(first) = self.first {
            cursor.committed(first, now);
        }
        cursor.scanned(self.bound, self.report.published + self.report.held > 0);
    }

    /// Pauses, in `relay`, the subjects this batch could not take, and ends the pauses of
    /// those it published.
    pub(super) fn pause(&self, relay: &Relay, now: Instant) {
        let published = self.published.iter().map(String::as_str);
        let not_attempted = self.not_attempted.iter().map(String::as_str);
        relay.pauses.settle(published, not_attempted, now);
    }
}

/// The marks and the retry schedule, in the batch's transaction.
pub(super) async fn write(
    tx: &mut Tx,
    relay: &Relay,
    rows: &[Row],
    due: usize,
    settled: &Settled,
) -> Result<()> {
    let published = ctids(rows, settled.acked.iter().copied());
    let attempted = ctids(
        rows,
        settled.failed.iter().map(|(i, _)| *i).chain(
            settled
                .held
                .iter()
                .filter(|(_, h)| h.cause.attempted())
                .map(|(i, _)| *i),
        ),
    );
    for (statement, ctids) in [
        (sql::MARK_PUBLISHED, published),
        (sql::MARK_FAILED, attempted),
    ] {
        if ctids.is_empty() {
            continue;
        }
        let marked = timed(
            OUTBOX_EVENTS,
            sqlx::query(statement).bind(&ctids).execute(tx.conn()),
        )
        .await?
        .rows_affected();
        if marked != ctids.len() as u64 {
            // cannot happen while the rows are locked; if it does, give the batch up: the rows
            // stay unpublished and are republished under the same ids
            return Err(Error::Database(sqlx::Error::Protocol(format!(
                "outbox mark updated {marked} of {} claimed rows; the batch is rolled back",
                ctids.len()
            ))));
        }
    }
    park(tx, relay, rows, settled).await?;
    let released: Vec<Uuid> = settled
        .acked
        .iter()
        .filter(|&&i| i < due)
        .map(|&i| rows[i].id)
        .collect();
    if !released.is_empty() {
        timed(
            OUTBOX_RETRIES,
            sqlx::query(sql::UNPARK).bind(&released).execute(tx.conn()),
        )
        .await?;
    }
    Ok(())
}

/// Schedules the next try of each failed row's subject, and holds the held rows, in
/// `outbox_retries` ([`PARK`](sql::PARK)).
async fn park(tx: &mut Tx, relay: &Relay, rows: &[Row], settled: &Settled) -> Result<()> {
    let config = &relay.config;
    let mut ids = Vec::new();
    let mut delays: Vec<Option<f64>> = Vec::new();
    let mut reasons = Vec::new();
    let mut causes: Vec<Option<&str>> = Vec::new();
    for (i, failed) in &settled.failed {
        let row = &rows[*i];
        let failure = &failed.failure;
        ids.push(row.id);
        if failed.at_cap {
            delays.push(None);
            reasons.push(format!(
                "it reached the attempt cap ({}): {failure}",
                config.max_attempts
            ));
            causes.push(Some(HoldCause::AtCap.label()));
        } else {
            delays.push(Some(
                config.backoff((row.attempts + 1) as u32).as_secs_f64() * 1000.0,
            ));
            reasons.push(failure.to_string());
            causes.push(None);
        }
    }
    for (i, hold) in &settled.held {
        ids.push(rows[*i].id);
        delays.push(None);
        reasons.push(hold.reason.clone());
        causes.push(Some(hold.cause.label()));
    }
    if !ids.is_empty() {
        timed(
            OUTBOX_RETRIES,
            sqlx::query(sql::PARK)
                .bind(&ids)
                .bind(&delays)
                .bind(&reasons)
                .bind(&causes)
                .execute(tx.conn()),
        )
        .await?;
    }
    Ok(())
}

/// The counters, metrics and log lines of a committed batch.
pub(super) fn record(relay: &Relay, rows: &[Row], settled: &Settled, report: &BatchReport) {
    relay.counters.add(report);
    metrics::histogram!(names::BATCH_SIZE).record(report.claimed as f64);
    let type_of = |i: usize| rows[i].event_type().to_owned();
    let mut published: HashMap<String, u64> = HashMap::new();
    for &i in &settled.acked {
        *published.entry(type_of(i)).or_default() += 1;
    }
    relay.streams.saw(published.keys().map(String::as_str));
    for (event_type, n) in published {
        metrics::counter!(names::PUBLISHED, "event_type" => event_type).increment(n);
    }
    for (i, failed) in &settled.failed {
        let row = &rows[*i];
        let failure = &failed.failure;
        metrics::counter!(names::PUBLISH_FAILURES, "event_type" => type_of(*i), "reason" => failure.reason()).increment(1);
        if failed.at_cap {
            metrics::counter!(names::AT_CAP, "event_type" => type_of(*i)).increment(1);
            tracing::error!(id = %row.id, subject = %row.subject, attempts = row.attempts + 1, reason = failure.reason(), error = %failure,
                "outbox event reached the attempt cap: it is held, with the later events of its subject, until an operator releases it (`outbox unblock`)");
        } else {
            tracing::debug!(id = %row.id, subject = %row.subject, reason = failure.reason(), error = %failure, "outbox publish failed; the subject backs off");
        }
    }
    for (i, hold) in &settled.held {
        let row = &rows[*i];
        metrics::counter!(names::HELD, "event_type" => crate::naming::shorten(&type_of(*i)).into_owned(), "cause" => hold.cause.label()).increment(1);
        if hold.cause == HoldCause::AtCap {
            metrics::counter!(names::AT_CAP, "event_type" => type_of(*i)).increment(1);
        }
        if hold.cause.releases_itself() {
            tracing::error!(id = %row.id, subject = %crate::naming::shorten(&row.subject), cause = hold.cause.label(), reason = %hold.reason,
                "outbox event held: its type's stream is missing or unsafe; the later events of its subject wait behind it until a safe stream captures the type, then the relay releases it by itself");
        } else {
            tracing::error!(id = %row.id, subject = %crate::naming::shorten(&row.subject), cause = hold.cause.label(), reason = %hold.reason,
                "outbox event held: it cannot be published as it is; the later events of its subject wait behind it until an operator releases it (`outbox unblock`)");
        }
    }
    let mut not_attempted: HashMap<(String, &'static str), u64> = HashMap::new();
    for (i, failure) in &settled.not_attempted {
        *not_attempted
            .entry((type_of(*i), failure.reason()))
            .or_default() += 1;
    }
    for ((event_type, reason), n) in not_attempted {
        metrics::counter!(names::NOT_ATTEMPTED, "event_type" => event_type, "reason" => reason)
            .increment(n);
    }
    if report.duplicates > 0 {
        metrics::counter!(names::DUPLICATES).increment(report.duplicates as u64);
    }
    if let Some((_, FailedAttempt { failure: first, .. })) = settled.failed.first() {
        tracing::warn!(failed = settled.failed.len(), published = report.published, first_reason = first.reason(), first_error = %first,
            "outbox relay: publishes failed; their subjects back off");
    }
    if let Some((_, first)) = settled.not_attempted.first() {
        tracing::info!(not_attempted = settled.not_attempted.len(), published = report.published, reason = first.reason(), error = %first,
            "outbox relay: events not attempted (the broker could not take them); no attempt is counted, they go again shortly");
    }
}
