//! Emitting events inside the caller's transaction.

use std::future::Future;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;
use tracing::Instrument;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::table::OUTBOX_EVENTS;
use crate::validate::{validated_data, Schemas};
use crate::EmitEvent;

/// The channel the relay listens on. An emit notifies it while a relay waits for commits (see
/// [`NOTIFY_KEY`]); Postgres delivers the notification only when the emitting transaction
/// commits, and folds the notifications of one transaction into one.
pub const NOTIFY_CHANNEL: &str = notify_channel!();

/// [`NOTIFY_CHANNEL`], as a literal for the statements that name it.
macro_rules! notify_channel {
    () => {
        "outbox_events"
    };
}
pub(crate) use notify_channel;

/// The advisory lock `(LOCK_NAMESPACE, NOTIFY_KEY)` that tells an emit whether a relay waits
/// for commits: a relay with an idle lane holds it exclusively (docs/relay.md, *Wake-up*). An
/// emit looks whether it is held (it takes it shared and lets it go at once: it never holds
/// it), and notifies when it is.
pub const NOTIFY_KEY: i32 = -2;

/// The advisory lock `(LOCK_NAMESPACE, WAKE_KEY)` that an emit holds shared until its
/// transaction ends, taken before it looks at [`NOTIFY_KEY`]: a relay that took
/// `NOTIFY_KEY` then takes this one exclusively (without waiting: it tries again) to know that
/// every emit that looked before it did has ended, and claims once more. An emit that cannot
/// take it shared (a relay holds it for that moment) notifies. Emits never wait on either.
pub const WAKE_KEY: i32 = -1;

/// [`LOCK_NAMESPACE`](crate::relay::LOCK_NAMESPACE) and [`WAKE_KEY`], as literals.
macro_rules! wake_lock {
    () => {
        "1868724338, -1"
    };
}
pub(crate) use wake_lock;

/// [`LOCK_NAMESPACE`](crate::relay::LOCK_NAMESPACE) and [`NOTIFY_KEY`], as literals.
macro_rules! notify_lock {
    () => {
        "1868724338, -2"
    };
}
pub(crate) use notify_lock;

/// The partition is computed from the bound subject, not read back from the row: a `returning`
/// that names a column needs `select` on it, which the emitting role does not have
/// (`ops/postgres/grants.sql`).
///
/// The end of both inserts: the notification, sent unless the emit holds [`WAKE_KEY`] shared
/// and [`NOTIFY_KEY`] is free. The `case` fixes the order: the first lock is held before the
/// second is looked at. Its payload is the partition of 1024 of the event's subject, so that
/// only the relay's lane that owns it claims.
macro_rules! announced {
    () => {
        concat!(
            " select pg_notify('",
            notify_channel!(),
            "', partition::text) from inserted",
            " where not case when pg_try_advisory_xact_lock_shared(",
            wake_lock!(),
            ") then case when pg_try_advisory_lock_shared(",
            notify_lock!(),
            ") then pg_advisory_unlock_shared(",
            notify_lock!(),
            ") else false end else false end"
        )
    };
}

/// `created_at` is `clock_timestamp()` rather than the column default `now()`, so two events
/// emitted in one transaction keep their emit order (`now()` is the transaction's start time for
/// every statement in it). The wake-up rides in the same statement: no extra round trip.
/// Without the `opentelemetry` feature the trace columns are not named (they stay null), so the
/// insert also works on a table without migration 0007.
#[cfg(not(feature = "opentelemetry"))]
const INSERT: &str = concat!(
    "with inserted as (",
    " insert into outbox_events (id, event_type, source, subject, time, data, created_at)",
    " values ($1, $2, $3, $4, $5, $6, clock_timestamp())",
    " returning (hashtext($4::text) & 2147483647) % 1024 as partition)",
    announced!()
);

/// The insert with the trace context of the emitting span (`$7`, `$8`: null outside one), in
/// the same statement.
#[cfg(feature = "opentelemetry")]
const INSERT: &str = concat!(
    "with inserted as (",
    " insert into outbox_events",
    " (id, event_type, source, subject, time, data, created_at, traceparent, tracestate)",
    " values ($1, $2, $3, $4, $5, $6, clock_timestamp(), $7, $8)",
    " returning (hashtext($4::text) & 2147483647) % 1024 as partition)",
    announced!()
);

/// An event without a compile-time type, for tools and tests.
///
/// It is validated against the schema registered for its type in a [`Schemas`] registry; an
/// event type the registry does not know is refused.
#[derive(Debug, Clone, PartialEq)]
pub struct RawEvent {
    /// The event type (and NATS subject).
    pub event_type: String,
    /// The emitting service.
    pub source: String,
    /// The entity the event is about, or `platform`.
    pub subject: String,
    /// When the state change happened; `None` means now.
    pub time: Option<DateTime<Utc>>,
    /// The payload.
    pub data: Value,
}

/// `emit` on a Postgres connection or transaction: the event is inserted into `outbox_events`
/// inside the caller's transaction, so it commits or rolls back with the domain write.
///
/// Implemented for [`PgConnection`]; a `sqlx::Transaction<'_, Postgres>` and a pooled
/// connection reach it through `Deref`, so `tx.emit(..)` just works.
///
/// The payload is validated against the event's JSON Schema before any statement is sent: a
/// payload that fails returns [`Error::InvalidPayload`] naming each JSON pointer and rule, and
/// the caller's transaction is untouched and still usable.
///
/// ```no_run
/// # use outbox_runtime::{EmitExt, OutboxEvent};
/// # #[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
/// # #[outbox(event_type = "billing.subscription.cancelled", subject = "subscription_id",
/// #          schema = "schemas/events/billing.subscription.cancelled.schema.json")]
/// # struct SubscriptionCancelled { subscription_id: uuid::Uuid, reason: String, effective: String,
/// #   cancelled_at: chrono::DateTime<chrono::Utc> }
/// # async fn handler(pool: sqlx::PgPool, id: uuid::Uuid) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// sqlx::query("update subscriptions set cancelled = true where id = $1")
///     .bind(id)
///     .execute(&mut *tx)
///     .await?;
/// let event_id = tx
///     .emit(SubscriptionCancelled {
///         subscription_id: id,
///         reason: "customer_request".into(),
///         effective: "immediately".into(),
///         cancelled_at: chrono::Utc::now(),
///     })
///     .await?;
/// tx.commit().await?; // the row and the event commit together
/// # let _ = event_id; Ok(()) }
/// ```
pub trait EmitExt {
    /// Emits `event` with `time` = now. Returns the event id (UUIDv7), generated before the
    /// insert: the envelope's `id` on every publish of this event.
    fn emit<E: EmitEvent>(&mut self, event: E) -> impl Future<Output = Result<Uuid>> + Send;

    /// Emits `event` stating when the state change happened.
    fn emit_at<E: EmitEvent>(
        &mut self,
        event: E,
        time: DateTime<Utc>,
    ) -> impl Future<Output = Result<Uuid>> + Send;

    /// Emits an untyped event, validated against `schemas`.
    fn emit_raw(
        &mut self,
        schemas: &Schemas,
        event: RawEvent,
    ) -> impl Future<Output = Result<Uuid>> + Send;
}

impl EmitExt for PgConnection {
    fn emit<E: EmitEvent>(&mut self, event: E) -> impl Future<Output = Result<Uuid>> + Send {
        self.emit_at(event, Utc::now())
    }

    fn emit_at<E: EmitEvent>(
        &mut self,
        event: E,
        time: DateTime<Utc>,
    ) -> impl Future<Output = Result<Uuid>> + Send {
        let prepared = validated_data(&event).map(|data| Row {
            event_type: E::EVENT_TYPE,
            source: E::SOURCE,
            subject: event.subject(),
            time,
            data,
        });
        async move { insert(self, prepared?).await }
    }

    fn emit_raw(
        &mut self,
        schemas: &Schemas,
        event: RawEvent,
    ) -> impl Future<Output = Result<Uuid>> + Send {
        let checked = check_raw(schemas, &event);
        async move {
            checked?;
            let row = Row {
                event_type: &event.event_type,
                source: &event.source,
                subject: event.subject.clone(),
                time: event.time.unwrap_or_else(Utc::now),
                data: event.data,
            };
            insert(self, row).await
        }
    }
}

fn check_raw(schemas: &Schemas, event: &RawEvent) -> Result<()> {
    crate::naming::check_event_type(&event.event_type).map_err(|reason| Error::InvalidName {
        what: "event type",
        value: crate::naming::shorten(&event.event_type).into_owned(),
        reason,
    })?;
    for (what, value) in [("source", &event.source), ("subject", &event.subject)] {
        if value.is_empty() {
            return Err(Error::InvalidName {
                what,
                value: value.clone(),
                reason: "must not be empty".into(),
            });
        }
    }
    schemas.validate(&event.event_type, &event.data)
}

struct Row<'a> {
    event_type: &'a str,
    source: &'a str,
    subject: String,
    time: DateTime<Utc>,
    data: Value,
}

async fn insert(conn: &mut PgConnection, row: Row<'_>) -> Result<Uuid> {
    let id = Uuid::now_v7();
    // the caller's span, before the emit's own (a child of it) is entered
    #[cfg(feature = "opentelemetry")]
    let trace = crate::trace::TraceContext::current();
    let span = tracing::debug_span!("outbox.emit", event_type = row.event_type, %id);
    let query = sqlx::query(INSERT)
        .bind(id)
        .bind(row.event_type)
        .bind(row.source)
        .bind(&row.subject)
        .bind(row.time)
        .bind(sqlx::types::Json(&row.data));
    #[cfg(feature = "opentelemetry")]
    let query = query
        .bind(trace.as_ref().map(|t| t.traceparent()))
        .bind(trace.as_ref().and_then(|t| t.tracestate()));
    query
        .execute(conn)
        .instrument(span)
        .await
        .map_err(insert_error)?;
    metrics::counter!(crate::metrics::EMITTED, "event_type" => row.event_type.to_owned())
        .increment(1);
    Ok(id)
}

/// An insert's error: a missing table or (with the `opentelemetry` feature) missing trace
/// columns name the migration that creates them.
fn insert_error(e: sqlx::Error) -> Error {
    #[cfg(feature = "opentelemetry")]
    if let sqlx::Error::Database(db) = &e {
        if db.code().as_deref() == Some("42703") {
            return Error::MissingColumn {
                table: OUTBOX_EVENTS.name,
                column: "traceparent",
                migration: crate::table::TRACE_CONTEXT_MIGRATION,
            };
        }
    }
    OUTBOX_EVENTS.error(e)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_insert_holds_the_wake_lock_before_it_looks_at_the_notify_lock() {
        let insert = super::INSERT;
        let wake = insert.find(concat!(
            "pg_try_advisory_xact_lock_shared(",
            wake_lock!(),
            ")"
        ));
        let notify = insert.find(concat!("pg_try_advisory_lock_shared(", notify_lock!(), ")"));
        assert!(wake.is_some() && notify.is_some(), "{insert}");
        assert!(
            wake < notify,
            "the case tests the wake lock first: {insert}"
        );
        assert!(insert.contains(concat!(
            "then pg_advisory_unlock_shared(",
            notify_lock!(),
            ")"
        )));
    }
}
