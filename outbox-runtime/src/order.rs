//! Per-subject ordering for consumers: "compare time per subject before acting on anything
//! order-dependent".
//!
//! The outbox publishes a subject's events in order, but delivery is at least once: a
//! redelivery can arrive after a newer event of the same subject. [`advance`] keeps, in the
//! consumer's own database (`outbox_subject_positions`, migration `0002`), the newest event
//! `time` applied per `(consumer, subject)`, and tells a handler whether the event in hand is
//! older than what it already applied. Call it inside the handler's transaction, so the
//! position moves only if the handler's writes commit.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::error::Result;
use crate::table::SUBJECT_POSITIONS;

/// Whether an event is newer than what a consumer already applied for its subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// No newer event was applied: act on it. The subject's position now is this event's time.
    Fresh,
    /// An event with a later `time` was already applied: do not overwrite its effect.
    Stale {
        /// The time of the newest event already applied for this subject.
        applied: DateTime<Utc>,
    },
}

impl Freshness {
    /// `true` for [`Freshness::Fresh`].
    pub fn is_fresh(&self) -> bool {
        matches!(self, Freshness::Fresh)
    }
}

/// Records that `consumer` applies an event of `subject` stated at `time`, unless a later one
/// was already applied; returns which.
///
/// Events with equal times are both fresh. Use it in the handler's transaction:
///
/// ```no_run
/// # async fn handler(tx: &mut sqlx::PgConnection, subject: &str, time: chrono::DateTime<chrono::Utc>) -> outbox_runtime::Result<()> {
/// use outbox_runtime::order::{advance, Freshness};
///
/// match advance(tx, "plan-projection", subject, time).await? {
///     Freshness::Fresh => { /* update the projection */ }
///     Freshness::Stale { applied } => tracing::debug!(%applied, "older than what we have; skipped"),
/// }
/// # Ok(()) }
/// ```
pub async fn advance(
    conn: &mut PgConnection,
    consumer: &str,
    subject: &str,
    time: DateTime<Utc>,
) -> Result<Freshness> {
    let applied: DateTime<Utc> = sqlx::query_scalar(
        "insert into outbox_subject_positions as p (consumer, subject, applied_time) \
         values ($1, $2, $3) \
         on conflict (consumer, subject) do update \
           set applied_time = greatest(p.applied_time, excluded.applied_time) \
         returning (select applied_time from outbox_subject_positions \
                     where consumer = $1 and subject = $2)",
    )
    .bind(consumer)
    .bind(subject)
    .bind(time)
    .fetch_one(conn)
    .await
    .map_err(|e| SUBJECT_POSITIONS.error(e))
    .map(|previous: Option<DateTime<Utc>>| previous.unwrap_or(time))?;
    Ok(if applied > time {
        Freshness::Stale { applied }
    } else {
        Freshness::Fresh
    })
}
