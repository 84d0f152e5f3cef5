//! The [`OutboxEvent`] trait: what an event type fixes at compile time.

use serde::{de::DeserializeOwned, Serialize};

/// An event type whose contract is fixed at compile time.
///
/// Implement it with `#[derive(OutboxEvent)]` (re-exported from this crate) or let
/// `outbox-codegen` generate the type from its JSON Schema; implementing it by hand skips the
/// compile-time checks against the schema and is not recommended.
///
/// ```
/// use outbox_runtime::OutboxEvent;
///
/// # mod hidden {
/// #[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
/// #[outbox(
///     event_type = "billing.subscription.created",
///     subject = "subscription_id",
///     schema = "schemas/events/billing.subscription.created.schema.json",
/// )]
/// pub struct Created {
///     pub subscription_id: uuid::Uuid,
///     pub customer_id: uuid::Uuid,
///     pub plan: String,
///     pub seats: u32,
///     pub started_at: chrono::DateTime<chrono::Utc>,
///     #[serde(default, skip_serializing_if = "Option::is_none")]
///     pub trial: Option<serde_json::Value>,
/// }
/// # }
/// # use hidden::Created;
/// assert_eq!(Created::EVENT_TYPE, "billing.subscription.created");
/// assert_eq!(Created::SUBJECT_PROPERTY, Some("subscription_id"));
/// ```
pub trait OutboxEvent: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// `<domain>.<entity>.<action>[.v<N>]`: the envelope's `type` and the NATS subject.
    const EVENT_TYPE: &'static str;
    /// The emitting service: the envelope's `source`.
    const SOURCE: &'static str;
    /// The JSON property that carries the envelope's `subject`, from `x-outbox-subject` or
    /// `#[outbox(subject = "..")]`. `None` means the subject is [`PLATFORM_SUBJECT`].
    const SUBJECT_PROPERTY: Option<&'static str>;
    /// The event's JSON Schema, self-contained (cross-file `$ref`s inlined). `data` is validated
    /// against it before the insert.
    const SCHEMA: &'static str;

    /// The envelope's `subject` for this event: the value of [`Self::SUBJECT_PROPERTY`], or
    /// [`PLATFORM_SUBJECT`].
    fn subject(&self) -> String;
}

/// The subject of an event that is not about one entity.
pub const PLATFORM_SUBJECT: &str = "platform";

/// Marks the event types this service may emit.
///
/// The derive implements it unless the type is consume-only (`.consumes([..])` in the build
/// script, or `#[outbox(consume_only)]`), so emitting an event this service only reads is a
/// compile error at the `emit` call.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is consumed by this service, not emitted by it",
    label = "consume-only event type: this service may decode it but not emit it",
    note = "only the service that owns an event type emits it; if this service owns it, remove it from `.consumes([..])` in build.rs (or drop `#[outbox(consume_only)]`)"
)]
pub trait EmitEvent: OutboxEvent {}
