//! Dead letters: a message that gave up, or cannot be decoded, copied to a subject of the
//! operator's choice before it is terminated.

use async_nats::jetstream::{self, Message};
use async_nats::HeaderMap;

use crate::error::{Error, Result};

/// Why a message is dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// The handler failed `max_attempts` times.
    GaveUp,
    /// The message cannot be decoded.
    Undecodable,
}

impl Kind {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Kind::GaveUp => "gave-up",
            Kind::Undecodable => "undecodable",
        }
    }
}

/// One dead letter to publish.
#[derive(Debug)]
pub(super) struct Letter<'a> {
    pub(super) kind: Kind,
    pub(super) consumer: &'a str,
    /// The event id, or the message's `Nats-Msg-Id`, or its stream position.
    pub(super) original_id: String,
    pub(super) reason: &'a str,
}

/// Header values are one line of visible text: control characters become spaces and long
/// reasons are cut (at a character boundary).
fn header_value(text: &str) -> String {
    const MAX: usize = 1024;
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if out.len() > MAX {
        let mut cut = MAX;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
    }
    out
}

/// The headers of the dead letter of `message`: its own, without the ones that would make
/// JetStream dedupe or refuse the copy, and the letter's.
fn headers(message: &Message, letter: &Letter<'_>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(original) = &message.headers {
        for (name, values) in original.iter() {
            let lower = AsRef::<str>::as_ref(name).to_ascii_lowercase();
            if lower == "nats-msg-id" || lower.starts_with("nats-expected-") {
                continue;
            }
            for value in values {
                headers.append(name.clone(), value.clone());
            }
        }
    }
    let original_id = header_value(&letter.original_id);
    let sequence = message.info().ok().map(|info| info.stream_sequence);
    headers.insert(
        "Nats-Msg-Id",
        letter_id(letter.consumer, &original_id, sequence).as_str(),
    );
    headers.insert("Outbox-Dead-Letter-Kind", letter.kind.as_str());
    headers.insert(
        "Outbox-Rejected-Reason",
        header_value(letter.reason).as_str(),
    );
    headers.insert("Outbox-Rejected-By", letter.consumer);
    headers.insert("Outbox-Original-Id", original_id.as_str());
    headers.insert(
        "Outbox-Original-Subject",
        header_value(message.subject.as_str()).as_str(),
    );
    if let Ok(info) = message.info() {
        headers.insert("Outbox-Original-Stream", info.stream);
        headers.insert(
            "Outbox-Original-Sequence",
            info.stream_sequence.to_string().as_str(),
        );
    }
    headers
}

/// The letter's `Nats-Msg-Id`: one per consumer and stream message, the same on every try, so
/// the stream keeps one letter of a message however many tries store it; a replay of the
/// event is another stream message, so its letter is stored even within the letters'
/// duplicate window.
fn letter_id(consumer: &str, original_id: &str, sequence: Option<u64>) -> String {
    match sequence {
        Some(sequence) => format!("dead-letter:{consumer}:{original_id}:{sequence}"),
        None => format!("dead-letter:{consumer}:{original_id}"),
    }
}

/// Whether the stream stored a letter on this try or had it already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stored {
    /// Stored now.
    Now,
    /// An earlier try of this very letter was stored (its ack was lost, or a redelivery of a
    /// message that gave up sent it again).
    Before,
}

/// Publishes the dead letter of `message` to `subject` and waits for the stream's ack.
///
/// The letter's `Nats-Msg-Id` is its own and the same on every try, so an ack flagged
/// `duplicate` means an earlier try of this very letter was stored: the letter is in the
/// stream either way. The stream the ack names is logged.
pub(super) async fn publish(
    js: &jetstream::Context,
    subject: &str,
    message: &Message,
    letter: &Letter<'_>,
) -> Result<Stored> {
    let action = || {
        format!(
            "dead-lettering {} to `{subject}` (a stream must capture it)",
            letter.original_id
        )
    };
    let ack = js
        .publish_with_headers(
            subject.to_owned(),
            headers(message, letter),
            message.payload.clone(),
        )
        .await
        .map_err(|e| Error::nats(action(), e))?
        .await
        .map_err(|e| Error::nats(action(), e))?;
    if ack.duplicate {
        tracing::info!(consumer = letter.consumer, original_id = %letter.original_id, stream = %ack.stream,
            sequence = ack.sequence, "dead letter already stored by an earlier try");
        Ok(Stored::Before)
    } else {
        tracing::info!(consumer = letter.consumer, original_id = %letter.original_id, stream = %ack.stream,
            sequence = ack.sequence, kind = letter.kind.as_str(), "dead letter stored");
        Ok(Stored::Now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_letter_is_named_by_its_consumer_event_and_stream_message() {
        assert_eq!(
            letter_id("billing", "e1", Some(7)),
            "dead-letter:billing:e1:7"
        );
        assert_ne!(
            letter_id("billing", "e1", Some(7)),
            letter_id("billing", "e1", Some(9)),
            "a replay is another message"
        );
        assert_eq!(letter_id("billing", "e1", None), "dead-letter:billing:e1");
    }

    #[test]
    fn header_values_are_one_line_and_bounded() {
        assert_eq!(header_value("a\nb\tc"), "a b c");
        let long = "é".repeat(1000);
        let cut = header_value(&long);
        assert!(cut.len() <= 1024 && cut.chars().all(|c| c == 'é'));
    }
}
