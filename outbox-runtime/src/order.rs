//! Per-subject ordering for consumers: "compare time per subject before acting on anything
//! order-dependent".
//!
//! The outbox publishes a subject's events in order, but delivery is at least once: a
//! redelivery can arrive after a newer event of the same subject. The functions here keep, in
//! the consumer's own database, the newest position applied per `(consumer, subject)`, and tell
//! a handler whether the event in hand is older than what it already applied. Call them inside
//! the handler's transaction, so the position moves only if the handler's writes commit.
//!
//! # Two ordering bases
//!
//! - **Stream order** ([`advance_in_stream`], used by [`crate::consumer::Delivery::freshness`]):
//!   the message's sequence in the JetStream stream, after the stream's creation time (so a
//!   stream deleted and created again starts above the old one). The relay publishes each
//!   subject's events in `created_at` order, one transaction per subject at a time across
//!   relays, so the stream holds a subject's events in the order their rows were committed. It
//!   does not depend on any host's clock. It does not hold across streams (a consumer reads one
//!   stream), and a row republished after its first copy left the stream's duplicate window
//!   gets a new, higher sequence: the dedupe row makes that copy a duplicate as long as the
//!   dedupe row is kept.
//! - **Event time** ([`advance`]): the envelope's `time`, stated by the emitting service
//!   (`Utc::now()` on its host unless it set one). It orders events across streams and
//!   services, but only as well as those hosts' clocks agree: with two hosts 50 ms apart, an
//!   event emitted within 50 ms after another can look older than it. Use it when the
//!   events of a subject come from several streams, or when the time is a business time.
//!
//! Both are right under concurrency: the value stored after the statement decides, read from
//! the row the statement locked, so of two transactions racing on one subject the older event
//! is stale even if it waited for the newer one's commit. Equal positions are fresh.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::error::Result;
use crate::table::{SUBJECT_POSITIONS, SUBJECT_SEQUENCES};

/// Whether an event is newer than what a consumer already applied for its subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// No newer event was applied: act on it. The subject's position now is this event's.
    Fresh,
    /// A later event was already applied: do not overwrite its effect.
    Stale {
        /// The position of the newest event already applied for this subject.
        applied: Position,
    },
}

impl Freshness {
    /// `true` for [`Freshness::Fresh`].
    pub fn is_fresh(&self) -> bool {
        matches!(self, Freshness::Fresh)
    }
}

/// Where an event stands in its subject's order, on one of the two bases (see the module
/// docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Position {
    /// The envelope's `time`.
    Time(DateTime<Utc>),
    /// The message's place in its stream.
    Stream {
        /// When the stream was created (JetStream's stream info).
        created: DateTime<Utc>,
        /// The message's stream sequence.
        sequence: u64,
    },
}

/// Records that `consumer` applies an event of `subject` stated at `time`, unless a later one
/// was already applied; returns which. The event-time basis: see the module docs for what it
/// guarantees, and [`advance_in_stream`] for the basis that does not trust clocks.
///
/// Events with equal times are both fresh. Use it in the handler's transaction:
///
/// ```no_run
/// # async fn handler(tx: &mut sqlx::PgConnection, subject: &str, time: chrono::DateTime<chrono::Utc>) -> outbox_runtime::Result<()> {
/// use outbox_runtime::order::{advance, Freshness};
///
/// match advance(tx, "plan-projection", subject, time).await? {
///     Freshness::Fresh => { /* update the projection */ }
///     Freshness::Stale { applied } => tracing::debug!(?applied, "older than what we have; skipped"),
/// }
/// # Ok(()) }
/// ```
pub async fn advance(
    conn: &mut PgConnection,
    consumer: &str,
    subject: &str,
    time: DateTime<Utc>,
) -> Result<Freshness> {
    // `returning` gives the row as this statement left it; `p` in `do update` is the newest
    // committed version of the row, locked (the statement waits for a racing transaction and
    // then reads its result), never the statement's snapshot.
    let applied: DateTime<Utc> = sqlx::query_scalar(
        "insert into outbox_subject_positions as p (consumer, subject, applied_time) \
         values ($1, $2, $3) \
         on conflict (consumer, subject) do update \
           set applied_time = greatest(p.applied_time, excluded.applied_time) \
         returning applied_time",
    )
    .bind(consumer)
    .bind(subject)
    .bind(time)
    .fetch_one(conn)
    .await
    .map_err(|e| SUBJECT_POSITIONS.error(e))?;
    Ok(if applied > time {
        Freshness::Stale {
            applied: Position::Time(applied),
        }
    } else {
        Freshness::Fresh
    })
}

/// Records that `consumer` applies the message at `sequence` of the stream created at
/// `stream_created` for `subject`, unless a later position was already applied; returns which.
/// The stream-order basis (table `outbox_subject_sequences`, migration `0006`); the consumer's
/// [`Delivery::freshness`](crate::consumer::Delivery::freshness) calls it with the message's
/// own position.
///
/// ```no_run
/// # async fn handler(tx: &mut sqlx::PgConnection, created: chrono::DateTime<chrono::Utc>) -> outbox_runtime::Result<()> {
/// use outbox_runtime::order::advance_in_stream;
///
/// if advance_in_stream(tx, "plan-projection", "sub-7", created, 42).await?.is_fresh() {
///     /* update the projection */
/// }
/// # Ok(()) }
/// ```
pub async fn advance_in_stream(
    conn: &mut PgConnection,
    consumer: &str,
    subject: &str,
    stream_created: DateTime<Utc>,
    sequence: u64,
) -> Result<Freshness> {
    let sequence_i64 = i64::try_from(sequence).unwrap_or(i64::MAX);
    // Postgres keeps microseconds: compare what it stores, not the nanoseconds JetStream gives.
    let stream_created = DateTime::from_timestamp_micros(stream_created.timestamp_micros())
        .unwrap_or(stream_created);
    let (created, applied): (DateTime<Utc>, i64) = sqlx::query_as(
        "insert into outbox_subject_sequences as p \
           (consumer, subject, stream_created, applied_sequence) values ($1, $2, $3, $4) \
         on conflict (consumer, subject) do update set \
           stream_created = case when (excluded.stream_created, excluded.applied_sequence) \
               > (p.stream_created, p.applied_sequence) \
             then excluded.stream_created else p.stream_created end, \
           applied_sequence = case when (excluded.stream_created, excluded.applied_sequence) \
               > (p.stream_created, p.applied_sequence) \
             then excluded.applied_sequence else p.applied_sequence end \
         returning stream_created, applied_sequence",
    )
    .bind(consumer)
    .bind(subject)
    .bind(stream_created)
    .bind(sequence_i64)
    .fetch_one(conn)
    .await
    .map_err(|e| SUBJECT_SEQUENCES.error(e))?;
    Ok(if (created, applied) > (stream_created, sequence_i64) {
        Freshness::Stale {
            applied: Position::Stream {
                created,
                sequence: u64::try_from(applied).unwrap_or(0),
            },
        }
    } else {
        Freshness::Fresh
    })
}
