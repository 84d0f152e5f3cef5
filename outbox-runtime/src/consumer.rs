//! Idempotent consumers: a durable JetStream pull consumer whose handler runs inside a Postgres
//! transaction that also records the event id, so each event takes effect once.
//!
//! For every message the consumer:
//!
//! 1. decodes the CloudEvents envelope, checks its `type`, validates `data` against the event
//!    type's schema and deserialises it into the generated type. A message that fails here can
//!    never succeed: it is reported (error log with the event id and the reason, counter
//!    `outbox_consumer_rejected_total`) and handled by [`Undecodable`]: terminated (the default)
//!    or copied to a dead-letter subject and then terminated;
//! 2. begins a transaction and inserts `(consumer, event_id)` into `outbox_consumed`
//!    (migration `0002`). The primary key refuses a second insert: that delivery is a
//!    duplicate, so the handler is not called, the message is acked and
//!    `outbox_consumer_duplicates_total` counts it;
//! 3. calls the [`Handler`] with the event, its envelope metadata and the transaction;
//! 4. on `Ok`, commits and only then acks. On `Err`, rolls back and naks with a growing delay;
//!    once a message has been delivered [`ConsumerConfig::max_deliveries`] times it is
//!    terminated, logged at error level and counted in `outbox_consumer_gave_up_total`:
//!    never dropped silently.
//!
//! Several replicas may run under one durable name: JetStream shares the messages between
//! them, and the dedupe row makes a message delivered to two of them take effect once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, AckKind};
use futures::StreamExt;
use sqlx::{PgConnection, PgPool};
use tracing::Instrument;
use uuid::Uuid;

use crate::envelope::{Envelope, SPEC_VERSION};
use crate::error::{Error, Result};
use crate::metrics as m;
use crate::order::{self, Freshness};
use crate::table::OUTBOX_CONSUMED;
use crate::validate::compiled_for;
use crate::OutboxEvent;

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
    /// The W3C `traceparent` the relay put on the message, if any.
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

    /// Whether this event is newer than what this consumer already applied for its subject
    /// (see [`crate::order`]). Call it in the handler's transaction.
    pub async fn freshness(&self, tx: &mut PgConnection) -> Result<Freshness> {
        order::advance(
            tx,
            &self.consumer,
            &self.envelope.subject,
            self.envelope.time,
        )
        .await
    }
}

/// The user's code for one event type.
///
/// `handle` runs inside the transaction that also records the event id; it should write only
/// to the database through `tx` (the seed's rule 4: record the intent, let an idempotent
/// worker do outside effects). Returning `Err` rolls everything back and retries the message.
///
/// ```
/// use outbox_runtime::consumer::{Delivery, Handler, HandlerError};
///
/// # #[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
/// # #[outbox(event_type = "billing.subscription.cancelled", subject = "subscription_id",
/// #          schema = "../schemas/events/billing.subscription.cancelled.schema.json")]
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

/// What to do with a message that cannot be decoded (not an envelope, another event type, a
/// payload that breaks the schema). Redelivering it would fail forever, so it is never retried.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Undecodable {
    /// Report it and terminate it (JetStream stops redelivering; the message stays in the
    /// stream for inspection).
    #[default]
    Terminate,
    /// Report it, publish it unchanged to `subject` (with the reason in the header
    /// `Outbox-Rejected-Reason`), then terminate it. If that publish fails the message is
    /// nak'd and tried again later.
    DeadLetter {
        /// Where rejected messages go (a stream must capture it).
        subject: String,
    },
}

/// Settings of a [`Consumer`] (server-side values with defaults, like async-nats' configs).
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// The durable consumer name, also the `consumer` column of the dedupe table.
    pub name: String,
    /// The stream to consume from.
    pub stream: String,
    /// How long JetStream waits for an ack before redelivering (default 30 s). A handler must
    /// finish within it.
    pub ack_wait: Duration,
    /// Deliveries after which a failing message is terminated and reported (default 5).
    pub max_deliveries: u64,
    /// First retry delay after a handler error; doubles per delivery (default 1 s).
    pub retry_base: Duration,
    /// Retry delay ceiling (default 60 s).
    pub retry_max: Duration,
    /// Policy for messages that cannot be decoded.
    pub undecodable: Undecodable,
}

impl ConsumerConfig {
    /// A config for durable `name` on `stream`, other values default.
    pub fn new(name: impl Into<String>, stream: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            stream: stream.into(),
            ack_wait: Duration::from_secs(30),
            max_deliveries: 5,
            retry_base: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
            undecodable: Undecodable::Terminate,
        }
    }

    fn retry_delay(&self, delivered: u64) -> Duration {
        let exp = delivered.saturating_sub(1).min(30) as u32;
        self.retry_base
            .saturating_mul(2u32.saturating_pow(exp))
            .min(self.retry_max)
    }
}

/// What happened to one message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran and its transaction committed; the message was acked.
    Handled,
    /// The event id was already recorded: acked without calling the handler.
    Duplicate,
    /// The handler failed; the message was nak'd to come back after `delay`.
    Retry {
        /// The nak delay.
        delay: Duration,
        /// The handler's error.
        error: String,
    },
    /// The handler failed on the last allowed delivery: the message was terminated.
    GaveUp {
        /// The handler's error.
        error: String,
    },
    /// The message could not be decoded; handled by the [`Undecodable`] policy.
    Rejected {
        /// The event id, when the envelope had one.
        event_id: Option<Uuid>,
        /// Why it was rejected.
        reason: String,
    },
}

/// A durable pull consumer for one event type `E` with handler `H`.
///
/// ```no_run
/// # use outbox_runtime::consumer::{Consumer, ConsumerConfig, Delivery, Handler, HandlerError};
/// # #[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
/// # #[outbox(event_type = "billing.subscription.cancelled", subject = "subscription_id",
/// #          schema = "../schemas/events/billing.subscription.cancelled.schema.json")]
/// # struct SubscriptionCancelled { subscription_id: uuid::Uuid, reason: String, effective: String,
/// #   cancelled_at: chrono::DateTime<chrono::Utc> }
/// # struct RecordChurn;
/// # impl Handler<SubscriptionCancelled> for RecordChurn {
/// #     async fn handle(&self, _: &Delivery<SubscriptionCancelled>, _: &mut sqlx::PgConnection) -> Result<(), HandlerError> { Ok(()) }
/// # }
/// # async fn run(pool: sqlx::PgPool, js: async_nats::jetstream::Context) -> outbox_runtime::Result<()> {
/// let consumer = Consumer::<SubscriptionCancelled, _>::new(
///     pool,
///     js,
///     ConsumerConfig::new("churn", "BILLING"),
///     RecordChurn,
/// );
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
            _event: std::marker::PhantomData,
        }
    }

    /// Creates the durable consumer on the stream if it does not exist, and returns it.
    pub async fn durable(&self) -> Result<jetstream::consumer::PullConsumer> {
        let stream = self
            .js
            .get_stream(&self.config.stream)
            .await
            .map_err(|e| Error::Stream {
                stream: self.config.stream.clone(),
                reason: format!("cannot open it ({e}); create it first (`outbox stream ensure`)"),
            })?;
        stream
            .get_or_create_consumer(
                &self.config.name,
                pull::Config {
                    durable_name: Some(self.config.name.clone()),
                    filter_subject: E::EVENT_TYPE.to_owned(),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait: self.config.ack_wait,
                    // The cap is enforced here (terminate and report), not by the server, which
                    // would stop redelivering silently.
                    max_deliver: -1,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| {
                Error::nats(
                    format!("creating the durable consumer `{}`", self.config.name),
                    e,
                )
            })
    }

    /// Consumes until `shutdown` resolves. The message in hand is finished (committed and
    /// acked, or rolled back and nak'd) before it returns.
    ///
    /// Transient NATS errors (a broker restart) are logged and the subscription is re-made
    /// with a capped backoff; database errors nak the message so it is retried.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> Result<()> {
        crate::metrics::register_consumer(&self.name);
        let consumer = self.durable().await?;
        tokio::pin!(shutdown);
        let mut pause = Duration::from_millis(100);
        loop {
            let mut messages = tokio::select! {
                _ = &mut shutdown => return Ok(()),
                m = consumer.messages() => match m {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(consumer = %self.name, error = %e, "cannot pull; retrying");
                        tokio::select! {
                            _ = &mut shutdown => return Ok(()),
                            _ = tokio::time::sleep(pause) => {}
                        }
                        pause = (pause * 2).min(Duration::from_secs(5));
                        continue;
                    }
                },
            };
            loop {
                let next = tokio::select! {
                    _ = &mut shutdown => return Ok(()),
                    next = messages.next() => next,
                };
                match next {
                    Some(Ok(message)) => {
                        pause = Duration::from_millis(100);
                        if let Err(e) = self.process(message).await {
                            tracing::warn!(consumer = %self.name, error = %e, "message not finished; it will be redelivered");
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(consumer = %self.name, error = %e, "pull stream error; re-subscribing");
                        break;
                    }
                    None => break,
                }
            }
        }
    }

    /// Handles one message end to end (decode, dedupe, handler, commit, ack) and says what
    /// happened. [`Consumer::run`] calls it for every message.
    pub async fn process(&self, message: jetstream::Message) -> Result<Outcome> {
        let (delivered, stream_sequence) = message
            .info()
            .map(|i| (i.delivered.max(1) as u64, i.stream_sequence))
            .unwrap_or((1, 0));
        let traceparent = message
            .headers
            .as_ref()
            .and_then(|h| h.get("traceparent"))
            .map(|v| v.as_str().to_owned());
        let span = tracing::info_span!(
            "outbox.consume",
            consumer = %self.name,
            event_type = E::EVENT_TYPE,
            event_id = tracing::field::Empty,
            delivered,
            traceparent = traceparent.as_deref().unwrap_or(""),
        );
        if delivered > 1 {
            metrics::counter!(m::CONSUMER_REDELIVERIES, "consumer" => self.name.to_string())
                .increment(1);
        }
        let envelope = match decode::<E>(&message.payload) {
            Ok(envelope) => envelope,
            Err(rejection) => return self.reject(&message, rejection).await,
        };
        span.record("event_id", tracing::field::display(envelope.id));
        let delivery = self.delivery(envelope, delivered, stream_sequence, traceparent);
        let outcome = self.apply(&delivery).instrument(span).await;
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                // A database error: nothing committed; let the message come back.
                let delay = self.config.retry_delay(delivered);
                message
                    .ack_with(AckKind::Nak(Some(delay)))
                    .await
                    .map_err(|e| Error::nats("nak-ing a message", e))?;
                return Err(e);
            }
        };
        let labels = [("consumer", self.name.to_string())];
        match &outcome {
            Outcome::Handled => {
                // A lost ack only means a redelivery, which the dedupe row turns into a
                // duplicate: no need to wait for the server to confirm it.
                message
                    .ack()
                    .await
                    .map_err(|e| Error::nats("acking a message", e))?;
                metrics::counter!(m::CONSUMER_HANDLED, &labels).increment(1);
            }
            Outcome::Duplicate => {
                message
                    .ack()
                    .await
                    .map_err(|e| Error::nats("acking a message", e))?;
                metrics::counter!(m::CONSUMER_DUPLICATES, &labels).increment(1);
                tracing::info!(consumer = %self.name, event_id = %delivery.id(), "duplicate delivery acked, not handled");
            }
            Outcome::Retry { delay, error } => {
                message
                    .ack_with(AckKind::Nak(Some(*delay)))
                    .await
                    .map_err(|e| Error::nats("nak-ing a message", e))?;
                metrics::counter!(m::CONSUMER_FAILURES, &labels).increment(1);
                tracing::warn!(consumer = %self.name, event_id = %delivery.id(), delivered, error = %error, ?delay, "handler failed; retrying");
            }
            Outcome::GaveUp { error } => {
                message
                    .ack_with(AckKind::Term)
                    .await
                    .map_err(|e| Error::nats("terminating a message", e))?;
                metrics::counter!(m::CONSUMER_FAILURES, &labels).increment(1);
                metrics::counter!(m::CONSUMER_GAVE_UP, &labels).increment(1);
                tracing::error!(consumer = %self.name, event_id = %delivery.id(), delivered, error = %error,
                    "handler failed on the last allowed delivery; message terminated (it stays in the stream)");
            }
            // `apply` never rejects: decoding happened before it.
            Outcome::Rejected { .. } => {}
        }
        Ok(outcome)
    }

    /// A [`Delivery`] of `envelope` through this consumer (for [`Consumer::apply`]).
    pub fn delivery(
        &self,
        envelope: Envelope<E>,
        delivered: u64,
        stream_sequence: u64,
        traceparent: Option<String>,
    ) -> Delivery<E> {
        Delivery {
            envelope,
            delivered,
            stream_sequence,
            traceparent,
            consumer: self.name.clone(),
        }
    }

    /// The database half of [`Consumer::process`], without touching the message: in one
    /// transaction, records the event id (a duplicate returns [`Outcome::Duplicate`] and writes
    /// nothing), runs the handler, and commits on success. For callers that ack themselves.
    pub async fn apply(&self, delivery: &Delivery<E>) -> Result<Outcome> {
        let mut tx = self.pool.begin().await?;
        let fresh = sqlx::query(
            "insert into outbox_consumed (consumer, event_id) values ($1, $2) \
             on conflict do nothing",
        )
        .bind(&*self.name)
        .bind(delivery.id())
        .execute(&mut *tx)
        .await
        .map_err(|e| OUTBOX_CONSUMED.error(e))?
        .rows_affected()
            == 1;
        if !fresh {
            tx.rollback().await?;
            return Ok(Outcome::Duplicate);
        }
        match self.handler.handle(delivery, &mut tx).await {
            Ok(()) => {
                tx.commit().await?;
                Ok(Outcome::Handled)
            }
            Err(error) => {
                tx.rollback().await?;
                let error = error.to_string();
                if delivery.delivered >= self.config.max_deliveries {
                    Ok(Outcome::GaveUp { error })
                } else {
                    Ok(Outcome::Retry {
                        delay: self.config.retry_delay(delivery.delivered),
                        error,
                    })
                }
            }
        }
    }

    async fn reject(&self, message: &jetstream::Message, rejection: Rejection) -> Result<Outcome> {
        let Rejection { event_id, reason } = rejection;
        let id = event_id
            .map(|i| i.to_string())
            .unwrap_or_else(|| "unknown".into());
        tracing::error!(consumer = %self.name, event_id = %id, subject = %message.subject, reason = %reason,
            "undecodable message rejected");
        metrics::counter!(m::CONSUMER_REJECTED, "consumer" => self.name.to_string()).increment(1);
        if let Undecodable::DeadLetter { subject } = &self.config.undecodable {
            let mut headers = message.headers.clone().unwrap_or_default();
            headers.insert("Outbox-Rejected-Reason", reason.as_str());
            headers.insert("Outbox-Rejected-By", &*self.name);
            let sent = async {
                self.js
                    .publish_with_headers(subject.clone(), headers, message.payload.clone())
                    .await?
                    .await?;
                Ok::<_, async_nats::Error>(())
            }
            .await;
            if let Err(e) = sent {
                message
                    .ack_with(AckKind::Nak(Some(self.config.retry_max)))
                    .await
                    .map_err(|e| Error::nats("nak-ing a message", e))?;
                return Err(Error::nats(
                    format!("dead-lettering {id} to `{subject}`"),
                    e,
                ));
            }
        }
        message
            .ack_with(AckKind::Term)
            .await
            .map_err(|e| Error::nats("terminating a message", e))?;
        Ok(Outcome::Rejected { event_id, reason })
    }
}

/// Why a message cannot be decoded into the consumer's event type: it would fail on every
/// redelivery, so it is handled by the [`Undecodable`] policy instead of retried.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Rejection {
    /// The event id, when the message had a readable one.
    pub event_id: Option<Uuid>,
    /// What is wrong with the message.
    pub reason: String,
}

impl Rejection {
    fn new(event_id: Option<Uuid>, reason: impl Into<String>) -> Self {
        Rejection {
            event_id,
            reason: reason.into(),
        }
    }
}

/// Decodes a message body into a typed envelope, or says why not (with the id when known).
pub fn decode<E: OutboxEvent>(payload: &[u8]) -> std::result::Result<Envelope<E>, Rejection> {
    let raw: Envelope<serde_json::Value> = serde_json::from_slice(payload).map_err(|e| {
        let id = serde_json::from_slice::<serde_json::Value>(payload)
            .ok()
            .and_then(|v| v.get("id")?.as_str()?.parse().ok());
        Rejection::new(id, format!("not a CloudEvents envelope: {e}"))
    })?;
    let id = Some(raw.id);
    if raw.specversion != SPEC_VERSION {
        return Err(Rejection::new(
            id,
            format!("unsupported CloudEvents specversion `{}`", raw.specversion),
        ));
    }
    if raw.event_type != E::EVENT_TYPE {
        return Err(Rejection::new(
            id,
            format!(
                "event type `{}` is not `{}`, the type this consumer decodes",
                raw.event_type,
                E::EVENT_TYPE
            ),
        ));
    }
    compiled_for::<E>()
        .and_then(|c| c.check(E::EVENT_TYPE, &raw.data))
        .map_err(|e| Rejection::new(id, e.to_string()))?;
    let data: E = serde_json::from_value(raw.data).map_err(|e| {
        Rejection::new(id, format!("payload does not fit `{}`: {e}", E::EVENT_TYPE))
    })?;
    Ok(Envelope {
        specversion: raw.specversion,
        id: raw.id,
        event_type: raw.event_type,
        source: raw.source,
        subject: raw.subject,
        time: raw.time,
        datacontenttype: raw.datacontenttype,
        data,
    })
}
