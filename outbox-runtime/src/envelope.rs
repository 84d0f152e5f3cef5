//! The CloudEvents 1.0 envelope published for every outbox row.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::trace::TraceContext;

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
    /// The CloudEvents distributed-tracing extension: the W3C `traceparent` of the span the
    /// event was emitted in (the trace it started in), absent when the row has none (see
    /// [`trace`](crate::trace)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The `tracestate` that came with [`traceparent`](Self::traceparent), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
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
            traceparent: None,
            tracestate: None,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tracestate: Option<&'a str>,
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
            traceparent: None,
            tracestate: None,
            data,
        }
    }

    /// With the trace context the event was emitted in, as the extension attributes.
    pub(crate) fn traced(mut self, trace: Option<&'a TraceContext>) -> Self {
        self.traceparent = trace.map(TraceContext::traceparent);
        self.tracestate = trace.and_then(TraceContext::tracestate);
        self
    }

    /// The JSON body, in a buffer sized for it up front: the keys, the fixed values, the id
    /// and a time with nanoseconds take 185 bytes; the margin covers escapes in the strings.
    pub(crate) fn to_vec(&self) -> serde_json::Result<Vec<u8>> {
        let mut body = Vec::with_capacity(self.capacity());
        serde_json::to_writer(&mut body, self)?;
        Ok(body)
    }

    fn capacity(&self) -> usize {
        // `,"traceparent":""` and `,"tracestate":""` take 17 and 16 bytes
        let trace = self.traceparent.map_or(0, |t| 17 + t.len())
            + self.tracestate.map_or(0, |t| 16 + t.len());
        256 + self.event_type.len()
            + self.source.len()
            + self.subject.len()
            + self.data.get().len()
            + trace
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
    fn the_trace_context_is_carried_as_the_cloudevents_extension_attributes() {
        let data = serde_json::value::RawValue::from_string(r#"{"a":1}"#.to_owned()).unwrap();
        let time = Utc::now();
        let id = Uuid::now_v7();
        let plain = EnvelopeRef::new(id, "t.e.a", "s", "x", time, &data)
            .to_vec()
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&plain).unwrap();
        assert!(json.get("traceparent").is_none() && json.get("tracestate").is_none());

        let trace = TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            Some("vendor=opaque"),
        )
        .unwrap();
        let traced = EnvelopeRef::new(id, "t.e.a", "s", "x", time, &data).traced(Some(&trace));
        let body = traced.to_vec().unwrap();
        assert_eq!(body.capacity(), traced.capacity(), "the buffer never grew");
        let envelope: Envelope = serde_json::from_slice(&body).unwrap();
        assert_eq!(envelope.traceparent.as_deref(), Some(trace.traceparent()));
        assert_eq!(envelope.tracestate.as_deref(), Some("vendor=opaque"));
        // and an envelope without them (an older relay's) still reads
        let old: Envelope = serde_json::from_slice(&plain).unwrap();
        assert_eq!((old.traceparent, old.tracestate), (None, None));
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
