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

/// The relay's view of an [`Envelope`]: the same JSON, serialized from borrowed fields and the
/// row's payload as Postgres rendered it, without copying them into owned strings first.
#[derive(Serialize)]
pub(crate) struct EnvelopeRef<'a> {
    specversion: &'static str,
    id: Uuid,
    #[serde(rename = "type")]
    event_type: &'a str,
    source: &'a str,
    subject: &'a str,
    time: DateTime<Utc>,
    datacontenttype: &'static str,
    data: &'a serde_json::value::RawValue,
}

impl<'a> EnvelopeRef<'a> {
    pub(crate) fn new(
        id: Uuid,
        event_type: &'a str,
        source: &'a str,
        subject: &'a str,
        time: DateTime<Utc>,
        data: &'a serde_json::value::RawValue,
    ) -> Self {
        Self {
            specversion: SPEC_VERSION,
            id,
            event_type,
            source,
            subject,
            time,
            datacontenttype: DATA_CONTENT_TYPE,
            data,
        }
    }

    /// The JSON body, in a buffer sized for it up front: the keys, the fixed values, the id
    /// and a time with nanoseconds take 185 bytes; the margin covers escapes in the strings.
    pub(crate) fn to_vec(&self) -> serde_json::Result<Vec<u8>> {
        let mut body = Vec::with_capacity(self.capacity());
        serde_json::to_writer(&mut body, self)?;
        Ok(body)
    }

    fn capacity(&self) -> usize {
        256 + self.event_type.len() + self.source.len() + self.subject.len() + self.data.get().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relays_envelope_is_the_public_envelope() {
        let id = Uuid::now_v7();
        let time = Utc::now();
        let data = r#"{"seats": 3, "note": "caf\u00e9 \"quoted\""}"#;
        let raw = serde_json::value::RawValue::from_string(data.to_owned()).unwrap();
        let borrowed = EnvelopeRef::new(id, "billing.seat.added", "billing", "sub 42", time, &raw)
            .to_vec()
            .unwrap();
        let owned = serde_json::to_vec(&Envelope::new(
            id,
            "billing.seat.added",
            "billing",
            "sub 42",
            time,
            &*raw,
        ))
        .unwrap();
        assert_eq!(
            String::from_utf8(borrowed).unwrap(),
            String::from_utf8(owned).unwrap()
        );
    }

    #[test]
    fn the_body_fits_the_buffer_sized_for_it() {
        let data = serde_json::value::RawValue::from_string(r#"{"a":1}"#.to_owned()).unwrap();
        // a time with nanoseconds, the longest the envelope writes
        let time = DateTime::from_timestamp(1_764_590_400, 123_456_789).unwrap();
        let envelope = EnvelopeRef::new(Uuid::now_v7(), "t", "s", "x", time, &data);
        let body = envelope.to_vec().unwrap();
        assert!(String::from_utf8_lossy(&body).contains(".123456789Z"));
        assert_eq!(
            body.capacity(),
            envelope.capacity(),
            "the buffer never grew"
        );
    }
}
