//! The CloudEvents 1.0 envelope published for every outbox row.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// CloudEvents spec version this crate publishes.
pub const SPEC_VERSION: &str = "1.0";
/// The envelope's `datacontenttype`.
pub const DATA_CONTENT_TYPE: &str = "application/json";
/// The NATS `Content-Type` header of a structured CloudEvents message.
pub const CONTENT_TYPE: &str = "application/cloudevents+json";

/// A CloudEvents 1.0 event in structured JSON mode, as the relay publishes it.
///
/// `T` is the payload: [`serde_json::Value`] for untyped use, or a generated event type.
///
/// ```
/// use outbox_runtime::Envelope;
///
/// let json = r#"{"specversion":"1.0","id":"01936f0e-7a5c-7cc3-8f3e-1d2f6f1b7c10",
///   "type":"billing.subscription.cancelled","source":"billing","subject":"42",
///   "time":"2026-11-30T12:00:00Z","datacontenttype":"application/json","data":{"reason":"x"}}"#;
/// let envelope: Envelope = serde_json::from_str(json).unwrap();
/// assert_eq!(envelope.event_type, "billing.subscription.cancelled");
/// assert_eq!(envelope.data["reason"], "x");
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope<T = serde_json::Value> {
    /// Always `"1.0"`.
    pub specversion: String,
    /// The outbox row's id (UUIDv7): the dedupe key of every consumer.
    pub id: Uuid,
    /// The event type, which is also the NATS subject.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The emitting service.
    pub source: String,
    /// The entity the event is about, or `platform`.
    pub subject: String,
    /// When the state change happened.
    pub time: DateTime<Utc>,
    /// Always `"application/json"`.
    pub datacontenttype: String,
    /// The payload, valid against the event type's schema.
    pub data: T,
}

impl<T> Envelope<T> {
    /// An envelope with the fixed CloudEvents fields filled in.
    pub fn new(
        id: Uuid,
        event_type: impl Into<String>,
        source: impl Into<String>,
        subject: impl Into<String>,
        time: DateTime<Utc>,
        data: T,
    ) -> Self {
        Self {
            specversion: SPEC_VERSION.to_owned(),
            id,
            event_type: event_type.into(),
            source: source.into(),
            subject: subject.into(),
            time,
            datacontenttype: DATA_CONTENT_TYPE.to_owned(),
            data,
        }
    }
}
