//! Idempotent consumers: a durable JetStream pull consumer whose handler runs inside a Postgres
//! transaction that also records the event id, so each event takes effect once.
//!
//! For every message the consumer:
//!
//! 1. decodes the CloudEvents envelope, checks its `type`, validates `data` against the event
//!    type's schema (formats per [`ConsumerConfig::formats`], lenient by default) and
//!    deserialises it into the generated type. A message that fails here can never succeed: it
//!    is reported (error log with the event id and the reason, counter
//!    `outbox_consumer_rejected_total`) and handled by [`Undecodable`]: terminated (the
//!    default) or copied to a dead-letter subject and then terminated;
//! 2. holds it if an earlier event of the same subject is waiting for a retry at this consumer
//!    (nak'd to come back after it, not counted: [`Outcome::Held`]), so a retry never reorders
//!    a subject; other subjects keep flowing;
//! 3. begins a transaction and inserts `(consumer, event_id)` into `outbox_consumed`
//!    (migration `0002`). The primary key refuses a second insert: that delivery is a
//!    duplicate, so the handler is not called, the message is acked and
//!    `outbox_consumer_duplicates_total` counts it;
//! 4. calls the [`Handler`] with the event, its envelope metadata and the transaction;
//! 5. on `Ok`, commits and only then acks. On `Err`, or a panic in the handler (caught, with
//!    its message as the error), undoes the handler's writes and naks with a growing delay.
//!    A transient error ([`is_transient`]: the database connection lost, a serialization
//!    failure, a deadlock, a lock timeout, or a [`Transient`] handler error) is retried without
//!    counting; any other failure counts one attempt in `outbox_consumer_attempts` (migration
//!    `0006`), in the message's transaction (rolled back to a savepoint taken before the
//!    handler), so a redelivery on another replica waiting on the dedupe row reads the count
//!    when the row is let go. The budget is not JetStream's delivery count, which also counts
//!    the consumer's own outages and held events. After [`ConsumerConfig::max_attempts`] failures the message
//!    gives up: it is published to [`ConsumerConfig::dead_letter`] when one is set (and the
//!    publish acknowledged), terminated, logged at error level and counted in
//!    `outbox_consumer_gave_up_total`: never dropped silently.
//!
//! # Replicas
//!
//! Several replicas may run under one durable name: JetStream shares the messages between
//! them, and the dedupe row makes a message delivered to two of them take effect once. The
//! hold of step 2 is per process: across replicas, a handler whose effect depends on order
//! asks [`Delivery::freshness`], which compares stream positions in the database and is right
//! under concurrency (see [`crate::order`] for the two ordering bases and what each
//! guarantees).
//!
//! # The durable
//!
//! [`Consumer::durable`] registers the consumer name to its event type (a second type under
//! the name is refused at start), checks an existing durable against the configuration (a
//! difference is an error naming it), and creates a missing one. When the durable disappears
//! while running (deleted by an operator, or with its stream), [`Consumer::run`] retries at a
//! bounded rate (100 ms doubling to 5 s, one log line per try) and creates it again; a durable
//! created again starts at the dedupe horizon (where [`crate::retention`] pruned dedupe rows,
//! or [`ConsumerConfig::keep_dedupe`]) rather than at the start of the stream, so events whose
//! dedupe rows were pruned are not applied twice.
//! docs/consumers.md says how to reset a consumer.

use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::Arc;

use async_nats::jetstream;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::envelope::Envelope;
use crate::error::Result;
use crate::order::{self, Freshness, Position};
use crate::OutboxEvent;

mod config;
mod dead_letter;
mod decode;
mod durable;
mod hold;
mod process;
mod retry;
mod run;

pub use config::{ConsumerConfig, FormatCheck, Undecodable};
pub use decode::{decode, decode_with, Rejection};
pub use process::Outcome;
pub use retry::{is_transient, Transient};

/// What a handler returns when it fails; the message is retried.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// One delivery of an event to a handler.
#[derive(Debug, Clone)]
pub struct Delivery<E> {
    /// The decoded envelope; `envelope.data` is the typed event.
    pub envelope: Envelope<E>,
    /// How many times this message has been delivered, this one included (1 = first time).
    pub delivered: u64,
    /// The message's sequence number in the stream.
    pub stream_sequence: u64,
    /// When the stream was created (with the sequence, the message's place in stream order).
    pub stream_created: DateTime<Utc>,
    /// The message's W3C `traceparent` header: the relay's publish span of this message (with
    /// the `opentelemetry` feature, the parent of the `outbox.consume` span the handler runs
    /// in). The context the event was emitted in is the envelope's `traceparent`.
    pub traceparent: Option<String>,
    consumer: Arc<str>,
}

impl<E> Delivery<E> {
    /// The event id: the dedupe key.
    pub fn id(&self) -> Uuid {
        self.envelope.id
    }

    /// The typed event.
    pub fn event(&self) -> &E {
        &self.envelope.data
    }

    /// The consumer (durable) name this delivery came through.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// The message's place in stream order.
    pub fn position(&self) -> Position {
        Position::Stream {
            created: self.stream_created,
            sequence: self.stream_sequence,
        }
    }

    /// Whether this event is newer than what this consumer already applied for its subject,
    /// in stream order ([`order::advance_in_stream`]: the stream's sequence, which does not
    /// depend on the emitting hosts' clocks). Right when replicas race: of two transactions
    /// on one subject, the older event is [`Freshness::Stale`] even if it waited for the
    /// newer one's commit. Call it in the handler's transaction, so the position moves only if
    /// the handler commits. For the event-time basis use [`order::advance`] with
    /// `delivery.envelope.time`.
    pub async fn freshness(&self, tx: &mut PgConnection) -> Result<Freshness> {
        order::advance_in_stream(
            tx,
            &self.consumer,
            &self.envelope.subject,
            self.stream_created,
            self.stream_sequence,
        )
        .await
    }
}

/// The user's code for one event type.
///
/// `handle` runs inside the transaction that also records the event id; it should write only
/// to the database through `tx` (the seed's rule 4: record the intent, let an idempotent
/// worker do outside effects), and leave the transaction to the consumer: a handler that ends
/// it (`commit`, `rollback` sent as SQL) breaks the dedupe, and its failures cannot be
/// counted. The transaction runs at read committed. Returning `Err` undoes its writes and
/// retries the message (counting an attempt unless the error [is transient](is_transient)). A
/// panic is caught and counts as an attempt that failed, with the panic's message as its
/// error: the consumer goes on, and the message gives up after
/// [`ConsumerConfig::max_attempts`] like any other failure.
///
/// ```
/// use outbox_runtime::consumer::{Delivery, Handler, HandlerError};
///
/// # #[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
/// # #[outbox(event_type = "billing.subscription.cancelled", subject = "subscription_id",
/// #          schema = "schemas/events/billing.subscription.cancelled.schema.json")]
/// # struct SubscriptionCancelled { subscription_id: uuid::Uuid, reason: String, effective: String,
/// #   cancelled_at: chrono::DateTime<chrono::Utc> }
/// struct RecordChurn;
///
/// impl Handler<SubscriptionCancelled> for RecordChurn {
///     async fn handle(
///         &self,
///         delivery: &Delivery<SubscriptionCancelled>,
///         tx: &mut sqlx::PgConnection,
///     ) -> Result<(), HandlerError> {
///         sqlx::query("insert into churn (subscription_id, at) values ($1, $2)")
///             .bind(delivery.event().subscription_id)
///             .bind(delivery.envelope.time)
///             .execute(tx)
///             .await?;
///         Ok(())
///     }
/// }
/// ```
pub trait Handler<E>: Send + Sync + 'static {
    /// Applies one event inside `tx`.
    fn handle(
        &self,
        delivery: &Delivery<E>,
        tx: &mut PgConnection,
    ) -> impl Future<Output = std::result::Result<(), HandlerError>> + Send;
}

/// A durable pull consumer for one event type `E` with handler `H`.
///
/// ```no_run
/// # use outbox_runtime::consumer::{Consumer, ConsumerConfig, Delivery, Handler, HandlerError};
/// # #[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
/// # #[outbox(event_type = "billing.subscription.cancelled", subject = "subscription_id",
/// #          schema = "schemas/events/billing.subscription.cancelled.schema.json")]
/// # struct SubscriptionCancelled { subscription_id: uuid::Uuid, reason: String, effective: String,
/// #   cancelled_at: chrono::DateTime<chrono::Utc> }
/// # struct RecordChurn;
/// # impl Handler<SubscriptionCancelled> for RecordChurn {
/// #     async fn handle(&self, _: &Delivery<SubscriptionCancelled>, _: &mut sqlx::PgConnection) -> Result<(), HandlerError> { Ok(()) }
/// # }
/// # async fn run(pool: sqlx::PgPool, js: async_nats::jetstream::Context) -> outbox_runtime::Result<()> {
/// let mut config = ConsumerConfig::new("churn", "BILLING");
/// config.dead_letter = Some("deadletter.churn".into());
/// let consumer = Consumer::<SubscriptionCancelled, _>::new(pool, js, config, RecordChurn);
/// consumer.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Consumer<E, H> {
    pool: PgPool,
    js: jetstream::Context,
    config: ConsumerConfig,
    handler: H,
    name: Arc<str>,
    holds: hold::Holds,
    /// Consecutive transient failures: the pause before the next message grows with them.
    transient_streak: AtomicU32,
    /// The stream's creation time in microseconds since the epoch (0 until the durable is
    /// opened).
    stream_created_micros: AtomicI64,
    _event: std::marker::PhantomData<fn() -> E>,
}

impl<E: OutboxEvent, H: Handler<E>> Consumer<E, H> {
    /// A consumer of `E` (filter subject `E::EVENT_TYPE`) that runs `handler`.
    pub fn new(pool: PgPool, js: jetstream::Context, config: ConsumerConfig, handler: H) -> Self {
        let name = Arc::from(config.name.as_str());
        Self {
            pool,
            js,
            config,
            handler,
            name,
            holds: hold::Holds::default(),
            transient_streak: AtomicU32::new(0),
            stream_created_micros: AtomicI64::new(0),
            _event: std::marker::PhantomData,
        }
    }

    /// A [`Delivery`] of `envelope` through this consumer (for [`Consumer::apply`]). Its
    /// `stream_created` is the stream's, once [`Consumer::durable`] opened it (the Unix epoch
    /// before).
    pub fn delivery(
        &self,
        envelope: Envelope<E>,
        delivered: u64,
        stream_sequence: u64,
        traceparent: Option<String>,
    ) -> Delivery<E> {
        let micros = self.stream_created_micros.load(Ordering::Relaxed);
        Delivery {
            envelope,
            delivered,
            stream_sequence,
            stream_created: DateTime::from_timestamp_micros(micros).unwrap_or_default(),
            traceparent,
            consumer: self.name.clone(),
        }
    }

    fn set_stream_created(&self, nanos: i128) {
        let micros = i64::try_from(nanos / 1_000).unwrap_or(0);
        self.stream_created_micros.store(micros, Ordering::Relaxed);
    }
}
