//! The NATS message of a row: the CloudEvents envelope as its body, and its headers
//! (`Nats-Msg-Id`, `Content-Type`, `traceparent`).

use async_nats::{HeaderMap, HeaderName};
use uuid::Uuid;

use super::row::{Event, Row};
use crate::envelope::EnvelopeRef;
use crate::CONTENT_TYPE;

const CONTENT_TYPE_HEADER: HeaderName = HeaderName::from_static("Content-Type");
const TRACEPARENT_HEADER: HeaderName = HeaderName::from_static("traceparent");

/// The W3C trace of one batch: each message carries its own span id under it, so a consumer's
/// span (which records the header) links to this publish.
#[derive(Debug)]
pub(super) struct Trace {
    id: String,
    span_base: u64,
}

impl Trace {
    /// A new random trace.
    pub(super) fn new() -> Trace {
        Trace {
            id: Uuid::new_v4().simple().to_string(),
            span_base: Uuid::new_v4().as_u64_pair().0,
        }
    }

    /// The trace id (32 hex digits).
    pub(super) fn id(&self) -> &str {
        &self.id
    }

    /// The `traceparent` (version 00, sampled) of the `i`-th row of the batch: the batch's
    /// random span base plus the row's position, unique in the trace and never zero.
    pub(super) fn traceparent(&self, i: usize) -> String {
        let span_id = self.span_base.wrapping_add(i as u64 + 1).max(1);
        format!("00-{}-{span_id:016x}-01", self.id)
    }
}

/// The body and headers of the `i`-th row of a batch, whose columns are `event`.
pub(super) fn message(
    row: &Row,
    event: &Event,
    trace: &Trace,
    i: usize,
) -> serde_json::Result<(Vec<u8>, HeaderMap)> {
    let body = EnvelopeRef::new(
        row.id,
        &event.event_type,
        &event.source,
        &row.subject,
        event.time,
        &event.data,
    )
    .to_vec()?;
    // Owned values move into the map; the names are constants.
    let mut headers = HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, hyphenated(row.id));
    headers.insert(CONTENT_TYPE_HEADER, CONTENT_TYPE);
    headers.insert(TRACEPARENT_HEADER, trace.traceparent(i));
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
    use super::*;

    #[test]
    fn traceparents_are_w3c_and_unique_per_row() {
        let trace = Trace::new();
        let a = trace.traceparent(0);
        let b = trace.traceparent(1);
        assert_ne!(a, b);
        for tp in [&a, &b] {
            let parts: Vec<&str> = tp.split('-').collect();
            assert_eq!(parts.len(), 4, "{tp}");
            assert_eq!(parts[0], "00");
            assert_eq!(parts[1], trace.id());
            assert_eq!(parts[1].len(), 32);
            assert_eq!(parts[2].len(), 16);
            assert_ne!(parts[2], "0000000000000000", "a span id is never zero");
            assert_eq!(parts[3], "01");
        }
    }

    #[test]
    fn the_message_id_is_the_hyphenated_uuid() {
        let id = Uuid::now_v7();
        assert_eq!(hyphenated(id), id.to_string());
    }
}
