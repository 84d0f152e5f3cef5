//! The NATS message of a row: the CloudEvents envelope as its body (with the trace context the
//! event was emitted in as its `traceparent`/`tracestate` extension attributes), and its
//! headers (`Nats-Msg-Id`, `Content-Type`, `traceparent`, `tracestate`).

use async_nats::{HeaderMap, HeaderName};
use uuid::Uuid;

use super::row::{Event, Row};
use crate::envelope::EnvelopeRef;
use crate::trace::TraceContext;
use crate::CONTENT_TYPE;

const CONTENT_TYPE_HEADER: HeaderName = HeaderName::from_static("Content-Type");
const TRACEPARENT_HEADER: HeaderName = HeaderName::from_static(crate::trace::TRACEPARENT);
const TRACESTATE_HEADER: HeaderName = HeaderName::from_static(crate::trace::TRACESTATE);

/// The body and headers of `row`, whose columns are `event`; `sent_in` is the context the
/// message is sent in (its publish span's, see [`super::publish`]), carried by the trace
/// headers.
pub(super) fn message(
    row: &Row,
    event: &Event,
    sent_in: &TraceContext,
) -> serde_json::Result<(Vec<u8>, HeaderMap)> {
    let body = EnvelopeRef::new(
        row.id,
        &event.event_type,
        &event.source,
        &row.subject,
        event.time,
        &event.data,
    )
    .traced(row.trace.as_ref())
    .to_vec()?;
    // Owned values move into the map; the names are constants.
    let mut headers = HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, hyphenated(row.id));
    headers.insert(CONTENT_TYPE_HEADER, CONTENT_TYPE);
    headers.insert(TRACEPARENT_HEADER, sent_in.traceparent());
    if let Some(state) = sent_in.tracestate() {
        headers.insert(TRACESTATE_HEADER, state);
    }
    Ok((body, headers))
}

/// The id as the `Nats-Msg-Id` header's value: the hyphenated form, without going through
/// `Display`.
fn hyphenated(id: Uuid) -> String {
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    id.hyphenated().encode_lower(&mut buf).to_owned()
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use serde_json::value::RawValue;

    use super::super::position::{Position, Stamp};
    use super::*;

    fn row(trace: Option<TraceContext>) -> (Row, Event) {
        let id = Uuid::now_v7();
        let row = Row {
            id,
            ctid: super::super::row::tests_tid(),
            position: Position { at: Stamp(0), id },
            subject: "s".into(),
            attempts: 0,
            event: Err(String::new()),
            trace,
        };
        let event = Event {
            event_type: "billing.invoice.paid".into(),
            source: "billing".into(),
            time: Utc::now(),
            data: RawValue::from_string("{}".into()).unwrap(),
        };
        (row, event)
    }

    fn header(headers: &HeaderMap, name: &str) -> Option<String> {
        headers.get(name).map(|v| v.as_str().to_owned())
    }

    #[test]
    fn the_envelope_carries_the_emit_context_and_the_headers_the_send_context() {
        let emitted = TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            Some("vendor=emit"),
        )
        .unwrap();
        let sent = TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01",
            Some("vendor=send"),
        )
        .unwrap();
        let (row, event) = row(Some(emitted.clone()));
        let (body, headers) = message(&row, &event, &sent).unwrap();
        let envelope: crate::Envelope = serde_json::from_slice(&body).unwrap();
        assert_eq!(envelope.traceparent.as_deref(), Some(emitted.traceparent()));
        assert_eq!(envelope.tracestate.as_deref(), Some("vendor=emit"));
        assert_eq!(
            header(&headers, "traceparent").as_deref(),
            Some(sent.traceparent())
        );
        assert_eq!(
            header(&headers, "tracestate").as_deref(),
            Some("vendor=send")
        );
        assert_eq!(header(&headers, "Nats-Msg-Id"), Some(row.id.to_string()));
    }

    #[test]
    fn a_row_without_a_context_has_no_extension_attributes_and_a_root_header() {
        let (row, event) = row(None);
        let root = TraceContext::new_root();
        let (body, headers) = message(&row, &event, &root).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(json.get("traceparent").is_none(), "{json}");
        assert!(json.get("tracestate").is_none(), "{json}");
        assert_eq!(
            header(&headers, "traceparent").as_deref(),
            Some(root.traceparent())
        );
        assert_eq!(header(&headers, "tracestate"), None);
    }

    #[test]
    fn the_message_id_is_the_hyphenated_uuid() {
        let id = Uuid::now_v7();
        assert_eq!(hyphenated(id), id.to_string());
    }
}
