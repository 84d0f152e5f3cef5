//! [`Claim`]: one batch's transaction, from the claim of its rows to their marks and the
//! commit (docs/relay.md, *One batch* and *Order*).

use std::collections::HashMap;
use std::fmt;

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};
use tokio::time::Instant;
use tracing::Instrument;
use uuid::Uuid;

use super::lanes::{Lane, Waiting};
use super::message::Trace;
use super::publish::{self, Settled};
use super::row::{Row, Tid};
use super::sql;
use super::stats::{self, BatchReport};
use super::{Relay, LOCK_NAMESPACE};
use crate::error::{Error, Result};
use crate::table::OUTBOX_EVENTS;

/// A claimed batch: its rows are locked in an open transaction until [`commit`](Self::commit).
///
/// Dropping a claim without committing rolls the transaction back, as a crash would: rows that
/// were published stay unpublished and are republished (same id) by a later batch.
pub struct Claim<'r> {
    relay: &'r Relay,
    tx: Transaction<'static, Postgres>,
    rows: Vec<Row>,
    /// Indices into `rows` of the acknowledged rows.
    acked: Vec<usize>,
    /// Indices into `rows` of the rows whose publish failed, with the failure's reason.
    failed: Vec<(usize, &'static str)>,
    report: BatchReport,
    published: bool,
    /// The partitions the claim took rows from.
    lane: Lane,
    /// The backed-off subjects the claim skipped.
    excluded: Vec<String>,
}

impl fmt::Debug for Claim<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("rows", &self.rows.len())
            .field("report", &self.report)
            .finish_non_exhaustive()
    }
}

impl<'r> Claim<'r> {
    /// Claims the rows of `lane` in `tx` (a new transaction): the batch settings, the claim,
    /// and the cut of each subject at its first hole.
    pub(super) async fn begin(
        relay: &'r Relay,
        mut tx: Transaction<'static, Postgres>,
        lane: Lane,
    ) -> Result<Claim<'r>> {
        let span = tracing::debug_span!("outbox.claim", claimed = tracing::field::Empty);
        async {
            // a statement of its own rather than part of BEGIN: if it fails, dropping the
            // transaction rolls it back and the pooled connection comes back clean
            sqlx::query(sql::SETTINGS)
                .execute(&mut *tx)
                .await
                .map_err(|e| OUTBOX_EVENTS.error(e))?;
            let config = &relay.config;
            let excluded = relay
                .backoff
                .excluded(Instant::now(), config.backoff_max * 2);
            let rows: Vec<Row> = sqlx::query_as(sql::CLAIM)
                .bind(config.batch_size as i64)
                .bind(config.max_attempts)
                .bind(&excluded)
                .bind(LOCK_NAMESPACE)
                .bind(config.partitions)
                .bind(lane.count)
                .bind(lane.index)
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| OUTBOX_EVENTS.error(e))?;
            let claimed = rows.len();
            let rows = drop_gaps(&mut tx, rows, &excluded, config.partitions, lane).await?;
            tracing::Span::current().record("claimed", claimed);
            let skipped = claimed - rows.len();
            Ok(Claim {
                relay,
                tx,
                rows,
                acked: Vec::new(),
                failed: Vec::new(),
                report: BatchReport {
                    claimed,
                    skipped,
                    ..BatchReport::default()
                },
                published: false,
                lane,
                excluded,
            })
        }
        .instrument(span)
        .await
    }

    /// [`WAITING`](sql::WAITING), in this batch's transaction (and with its settings).
    pub(super) async fn waiting(&mut self) -> Result<Waiting> {
        let found: Option<i32> = sqlx::query_scalar(sql::WAITING)
            .bind(self.relay.config.max_attempts)
            .bind(&self.excluded)
            .bind(self.relay.config.partitions)
            .bind(self.lane.count)
            .bind(self.lane.index)
            .fetch_optional(&mut *self.tx)
            .await
            .map_err(|e| OUTBOX_EVENTS.error(e))?;
        Ok(match found {
            Some(_) => Waiting::Elsewhere,
            None => Waiting::Nothing,
        })
    }

    /// Number of rows claimed.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the claim is empty.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The claimed event ids, in `created_at` order.
    pub fn ids(&self) -> Vec<Uuid> {
        self.rows.iter().map(|r| r.id).collect()
    }

    /// Publishes the claimed rows, pipelined across subjects, under one deadline (see
    /// docs/relay.md) and returns what happened; nothing is written to the table until
    /// [`commit`](Self::commit). Calling it again does nothing and returns the same report.
    pub async fn publish(&mut self) -> BatchReport {
        if self.published {
            return self.report;
        }
        self.published = true;
        let trace = Trace::new();
        let span =
            tracing::debug_span!("outbox.publish", rows = self.rows.len(), trace_id = %trace.id());
        let settled = publish::publish(
            &self.rows,
            &self.relay.jetstream,
            &self.relay.config,
            &trace,
        )
        .instrument(span)
        .await;
        self.settle(settled);
        self.report
    }

    /// Applies what publishing came to: the report, the subjects' backoff, the logs.
    fn settle(&mut self, settled: Settled) {
        let Settled {
            acked,
            duplicates,
            failed,
            skipped,
        } = settled;
        let config = &self.relay.config;
        self.report.published += acked.len();
        self.report.duplicates += duplicates;
        self.report.skipped += skipped;
        self.report.failed += failed.len();
        self.relay.backoff.settle(
            acked.iter().map(|&i| self.rows[i].subject.as_str()),
            failed.iter().map(|(i, _)| self.rows[*i].subject.as_str()),
            Instant::now(),
            config,
        );
        for (i, failure) in &failed {
            let row = &self.rows[*i];
            if row.attempts + 1 >= config.max_attempts {
                self.report.capped += 1;
                tracing::error!(
                    id = %row.id,
                    event_type = %row.event_type,
                    subject = %row.subject,
                    attempts = row.attempts + 1,
                    reason = failure.reason(),
                    error = %failure,
                    "outbox event reached the attempt cap: it is left unpublished and its subject is held until its attempts are reset",
                );
            } else {
                tracing::debug!(id = %row.id, event_type = %row.event_type, reason = failure.reason(), error = %failure, "outbox publish failed");
            }
        }
        if let Some((_, first)) = failed.first() {
            tracing::warn!(
                failed = failed.len(),
                published = self.report.published,
                first_reason = first.reason(),
                first_error = %first,
                "outbox relay: publishes failed; their subjects back off"
            );
        }
        self.acked = acked;
        self.failed = failed.into_iter().map(|(i, f)| (i, f.reason())).collect();
    }

    /// Marks the acknowledged rows published and the failed rows' `attempts + 1`, in one
    /// statement each, and commits. Publishes first if [`publish`](Self::publish) was not
    /// called.
    ///
    /// The commit is asynchronous (`synchronous_commit = off` for this transaction only): a
    /// Postgres crash can forget the marks of the last fraction of a second, and those rows are
    /// then republished under the same ids, which the stream's duplicate window and the
    /// consumers' dedupe absorb. Nothing can be lost this way: the events themselves were
    /// committed synchronously by the emitting transaction.
    pub async fn commit(mut self) -> Result<BatchReport> {
        self.publish().await;
        let failed: Vec<usize> = self.failed.iter().map(|&(i, _)| i).collect();
        for (statement, rows) in [
            (sql::MARK_PUBLISHED, &self.acked),
            (sql::MARK_FAILED, &failed),
        ] {
            if rows.is_empty() {
                continue;
            }
            let ctids: Vec<Tid> = rows.iter().map(|&i| self.rows[i].ctid).collect();
            let marked = sqlx::query(statement)
                .bind(&ctids)
                .execute(&mut *self.tx)
                .await
                .map_err(|e| OUTBOX_EVENTS.error(e))?
                .rows_affected();
            if marked != ctids.len() as u64 {
                // cannot happen while the rows are locked; if it does, roll back: the rows
                // stay unpublished and are republished under the same ids
                return Err(Error::Database(sqlx::Error::Protocol(format!(
                    "outbox mark updated {marked} of {} claimed rows; the batch is rolled back",
                    ctids.len()
                ))));
            }
        }
        let Claim {
            relay,
            tx,
            rows,
            acked,
            failed,
            report,
            ..
        } = self;
        tx.commit().await.map_err(|e| OUTBOX_EVENTS.error(e))?;
        relay.counters.add(&report);
        stats::record_batch(relay.config.max_attempts, &rows, &acked, &failed, &report);
        Ok(report)
    }

    /// Rolls the claim back without publishing: its rows and subjects are free for the next
    /// claim, of this relay or another.
    pub(super) async fn release(self) -> Result<BatchReport> {
        let report = self.report;
        self.tx
            .rollback()
            .await
            .map_err(|e| OUTBOX_EVENTS.error(e))?;
        Ok(report)
    }
}

/// Cuts each subject's claimed rows at the first hole (see [`GAPS`](sql::GAPS), run when
/// [`UNCLAIMED`](sql::UNCLAIMED) finds rows the claim does not hold): a batch always holds a
/// gap-free prefix of each subject's unpublished rows. The cut rows stay locked and untouched
/// until the transaction ends; a later batch takes them, after the hole.
async fn drop_gaps(
    tx: &mut Transaction<'static, Postgres>,
    rows: Vec<Row>,
    excluded: &[String],
    partitions: i32,
    lane: Lane,
) -> Result<Vec<Row>> {
    let Some(latest) = rows.iter().map(|r| r.created_at).max() else {
        return Ok(rows);
    };
    let in_range: i64 = sqlx::query_scalar(sql::UNCLAIMED)
        .bind(latest)
        .bind(excluded)
        .bind(partitions)
        .bind(lane.count)
        .bind(lane.index)
        .fetch_one(&mut **tx)
        .await
        .map_err(|e| OUTBOX_EVENTS.error(e))?;
    if in_range == rows.len() as i64 {
        return Ok(rows);
    }
    // rows are in created_at order: the last one seen per subject is its newest
    let mut newest: HashMap<&str, DateTime<Utc>> = HashMap::new();
    for row in &rows {
        newest.insert(row.subject.as_str(), row.created_at);
    }
    let (subjects, lasts): (Vec<&str>, Vec<DateTime<Utc>>) = newest.into_iter().unzip();
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let holes: HashMap<String, DateTime<Utc>> = sqlx::query_as(sql::GAPS)
        .bind(&subjects)
        .bind(&lasts)
        .bind(latest)
        .bind(&ids)
        .fetch_all(&mut **tx)
        .await
        .map_err(|e| OUTBOX_EVENTS.error(e))?
        .into_iter()
        .collect();
    if holes.is_empty() {
        return Ok(rows);
    }
    tracing::debug!(
        subjects = holes.len(),
        "outbox claim cut subjects at an older event it does not hold"
    );
    Ok(rows
        .into_iter()
        .filter(|r| {
            holes
                .get(&r.subject)
                .is_none_or(|hole| r.created_at < *hole)
        })
        .collect())
}
