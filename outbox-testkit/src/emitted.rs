//! Reading back what a transaction has emitted, before it commits.

use chrono::{DateTime, Utc};
use outbox_runtime::OutboxEvent;
use sqlx::PgConnection;
use uuid::Uuid;

/// One event a transaction has emitted: its envelope's id, subject and time, and the event.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Emitted<E> {
    /// The event id (the envelope's `id`, the message's `Nats-Msg-Id`).
    pub id: Uuid,
    /// The envelope's `subject`.
    pub subject: String,
    /// The envelope's `time`.
    pub time: DateTime<Utc>,
    /// The event, decoded from the row's `data`.
    pub event: E,
}

/// The events of type `E` that the transaction behind `tx` has inserted into `outbox_events`
/// and not yet committed, in the order they were emitted: the `tx.emit(..)` calls of the code
/// under test, whatever it committed before or other connections insert meanwhile. Events
/// emitted in a savepoint (a nested `begin`) count while it stands; after a rollback to it they
/// are gone, as they would be from the table.
///
/// An event counts when the transaction inserted it: a row created before the transaction
/// began and updated in it is not one (nor is a row the transaction inserts with a
/// `created_at` in the past).
///
/// Call it before the transaction commits or rolls back. It reads the rows whose inserting
/// transaction is still in progress, and only the transaction's own such rows are visible to
/// it. It fails the test when a row's `data` does not decode as `E`.
///
/// ```no_run
/// # use outbox_runtime::{EmitExt, OutboxEvent};
/// # #[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
/// # #[outbox(event_type = "billing.subscription.cancelled", subject = "subscription_id",
/// #          schema = "schemas/events/billing.subscription.cancelled.schema.json")]
/// # struct SubscriptionCancelled { subscription_id: uuid::Uuid, reason: String, effective: String,
/// #   cancelled_at: chrono::DateTime<chrono::Utc> }
/// # async fn example(pool: sqlx::PgPool, id: uuid::Uuid) {
/// let mut tx = pool.begin().await.unwrap();
/// tx.emit(SubscriptionCancelled {
///     subscription_id: id,
///     reason: "customer_request".into(),
///     effective: "immediately".into(),
///     cancelled_at: chrono::Utc::now(),
/// })
/// .await
/// .unwrap();
/// let emitted = outbox_testkit::emitted::<SubscriptionCancelled>(&mut tx).await;
/// assert_eq!(emitted.len(), 1);
/// assert_eq!(emitted[0].subject, id.to_string());
/// # }
/// ```
pub async fn emitted<E: OutboxEvent>(tx: &mut PgConnection) -> Vec<Emitted<E>> {
    // A row's xmin, as the full transaction id: the transaction's own id (`top`) plus the
    // row's 32-bit distance from it. The transaction's rows (its savepoints' too) and those of
    // transactions that began after it are at a distance of 0 or more; of those, the ones
    // still in progress are the transaction's own, as no other transaction's uncommitted rows
    // are visible. A row this transaction only updated has its xmin too, so rows created
    // before the transaction began are left out (`now()` is its start; an emit's `created_at`
    // is `clock_timestamp()`). (`age(xmin)` would not do: it measures from a value fixed at the first call
    // in the transaction, which may come before the transaction has an id.)
    let rows: Vec<(Uuid, String, DateTime<Utc>, serde_json::Value)> = sqlx::query_as(
        "with me as (select pg_current_xact_id()::text::int8 as top), \
              o as (select o.id, o.subject, o.time, o.data, o.created_at, me.top, \
                           (o.xmin::text::int8 - (me.top & 4294967295) + 4294967296) \
                             % 4294967296 as distance \
                      from outbox_events o, me \
                     where o.event_type = $1 and o.published_at is null \
                       and o.created_at >= now()) \
         select id, subject, time, data from o \
          where case when distance < 2147483648 \
                     then pg_xact_status((top + distance)::text::xid8) = 'in progress' end \
          order by created_at, id",
    )
    .bind(E::EVENT_TYPE)
    .fetch_all(tx)
    .await
    .unwrap_or_else(|e| panic!("emitted::<{}>: reading outbox_events: {e}", E::EVENT_TYPE));
    rows.into_iter()
        .map(|(id, subject, time, data)| Emitted {
            id,
            subject,
            time,
            event: serde_json::from_value(data).unwrap_or_else(|e| {
                panic!(
                    "emitted::<{}>: event {id} does not decode as {}: {e}",
                    E::EVENT_TYPE,
                    std::any::type_name::<E>()
                )
            }),
        })
        .collect()
}
