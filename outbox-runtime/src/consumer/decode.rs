//! Decoding a message body into the consumer's typed envelope, or saying why it cannot be.

use uuid::Uuid;

use super::config::FormatCheck;
use crate::envelope::{Envelope, SPEC_VERSION};
use crate::redact;
use crate::validate::compiled_with_formats;
use crate::{Error, OutboxEvent};

/// Why a message cannot be decoded into the consumer's event type: it would fail on every
/// redelivery, so it is handled by the [`Undecodable`](super::Undecodable) policy instead of
/// retried.
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

/// Decodes a message body into a typed envelope with the default format check
/// ([`FormatCheck::Lenient`]), or says why not (with the id when known).
///
/// ```
/// # #[derive(Debug, serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
/// # #[outbox(event_type = "billing.subscription.cancelled", subject = "subscription_id",
/// #          schema = "schemas/events/billing.subscription.cancelled.schema.json")]
/// # struct SubscriptionCancelled { subscription_id: uuid::Uuid, reason: String, effective: String,
/// #   cancelled_at: chrono::DateTime<chrono::Utc> }
/// use outbox_runtime::consumer::decode;
///
/// let rejection = decode::<SubscriptionCancelled>(b"not json").unwrap_err();
/// assert!(rejection.reason.contains("not a CloudEvents envelope"));
/// ```
pub fn decode<E: OutboxEvent>(payload: &[u8]) -> Result<Envelope<E>, Rejection> {
    decode_with(payload, FormatCheck::default())
}

/// [`decode`] with the given format check: the envelope is parsed, its `specversion` and
/// `type` checked, `data` validated against `E`'s schema (its `format` keywords only under
/// [`FormatCheck::Strict`]) and deserialised into `E`.
pub fn decode_with<E: OutboxEvent>(
    payload: &[u8],
    formats: FormatCheck,
) -> Result<Envelope<E>, Rejection> {
    let raw: Envelope<serde_json::Value> = serde_json::from_slice(payload).map_err(|e| {
        let id = serde_json::from_slice::<serde_json::Value>(payload)
            .ok()
            .and_then(|v| v.get("id")?.as_str()?.parse().ok());
        Rejection::new(
            id,
            format!("not a CloudEvents envelope: {}", redact::decode_error(&e)),
        )
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
    compiled_with_formats::<E>(formats == FormatCheck::Strict)
        .and_then(|c| c.check(E::EVENT_TYPE, &raw.data))
        .map_err(|e| Rejection::new(id, e.to_string()))?;
    let data = E::deserialize(&raw.data).map_err(|e| {
        // A string the lenient check let through (a `format` it does not assert) is the usual
        // cause; the strict check names its field and rule, where the type's message would
        // quote the value.
        let located = compiled_with_formats::<E>(true)
            .and_then(|c| c.check(E::EVENT_TYPE, &raw.data))
            .err();
        let why = match located {
            Some(Error::InvalidPayload { violations, .. }) => violations
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
            _ => redact::decode_error(&e),
        };
        Rejection::new(
            id,
            format!("payload does not fit `{}`: {why}", E::EVENT_TYPE),
        )
    })?;
    Ok(Envelope {
        specversion: raw.specversion,
        id: raw.id,
        event_type: raw.event_type,
        source: raw.source,
        subject: raw.subject,
        time: raw.time,
        datacontenttype: raw.datacontenttype,
        traceparent: raw.traceparent,
        tracestate: raw.tracestate,
        data,
    })
}
