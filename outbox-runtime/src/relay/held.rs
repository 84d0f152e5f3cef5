//! Rows the relay holds: they cannot be published as they are, so each waits, with its
//! subject, for an operator, or for a stream that captures its type safely (docs/relay.md,
//! *Held rows*); the relay's own checks of a row before it is sent, and the release of the
//! holds a stream caused once it is fixed.

use std::collections::HashSet;
use std::time::Duration;

use async_nats::jetstream;
use sqlx::PgPool;

use super::config::RelayConfig;
use super::row::{Event, Row};
use super::sql;
use super::streams::{Capture, Streams};

/// The longest wait for a stream lookup while releasing holds.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// Room for the headers beside the body within the server's `max_payload`.
const HEADERS_ALLOWANCE: usize = 256;

/// Why a row is held: it cannot be published as it is, so it waits, with its subject, for an
/// operator (docs/relay.md, *Held rows*).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HoldCause {
    /// A column cannot be read (an infinite timestamp, text that is not UTF-8, JSON too deep).
    Unreadable,
    /// Its `event_type` breaks the naming rules (a wildcard, `$`, whitespace, too long...).
    BadType,
    /// It reached the attempt cap.
    AtCap,
    /// Its message is larger than the server's `max_payload`.
    TooLarge,
    /// No stream captures its type.
    NoStream,
    /// The stream refused it for good (larger than the stream's `max_msg_size`).
    Refused,
    /// The stream that captures its type has settings under which it can lose what it
    /// acknowledged, or stores messages under another subject ([`unsafe_settings`]): the
    /// relay sends nothing into it.
    ///
    /// [`unsafe_settings`]: crate::unsafe_settings
    UnsafeStream,
    /// The server stored a message of its type under another subject (an account subject
    /// mapping): consumers filtering on the type would not see it.
    Mapped,
}

impl HoldCause {
    /// Every cause, for the tests and for reading a cause back from its label.
    pub(super) const ALL: [HoldCause; 8] = [
        HoldCause::Unreadable,
        HoldCause::BadType,
        HoldCause::AtCap,
        HoldCause::TooLarge,
        HoldCause::NoStream,
        HoldCause::Refused,
        HoldCause::UnsafeStream,
        HoldCause::Mapped,
    ];

    /// Whether the broker saw the publish (the row gets one more attempt).
    pub(super) fn attempted(self) -> bool {
        matches!(self, HoldCause::NoStream | HoldCause::Refused)
    }

    /// Whether the relay releases the hold by itself, once a stream captures the type and is
    /// safe (the relay's housekeeping looks every 10 s), instead of waiting for an operator:
    /// the cause is a stream's, which the relay can read back.
    pub(super) fn releases_itself(self) -> bool {
        matches!(self, HoldCause::NoStream | HoldCause::UnsafeStream)
    }

    /// The `cause` label of [`HELD`](crate::metrics::HELD).
    pub(super) fn label(self) -> &'static str {
        match self {
            HoldCause::Unreadable => "unreadable",
            HoldCause::BadType => "invalid_event_type",
            HoldCause::AtCap => "attempt_cap",
            HoldCause::TooLarge => "max_payload",
            HoldCause::NoStream => "no_stream",
            HoldCause::Refused => "refused",
            HoldCause::UnsafeStream => "unsafe_stream",
            HoldCause::Mapped => "subject_mapping",
        }
    }
}

/// A held row's cause and reason.
#[derive(Debug, Clone)]
pub(super) struct Hold {
    pub(super) cause: HoldCause,
    pub(super) reason: String,
}

impl Hold {
    pub(super) fn new(cause: HoldCause, reason: impl Into<String>) -> Hold {
        Hold {
            cause,
            reason: reason.into(),
        }
    }
}

/// A row of `event_type`, which no stream captures.
pub(super) fn no_stream(event_type: &str) -> Hold {
    let reason = format!(
        "no stream captures `{event_type}`: create one (`outbox stream ensure`); the relay releases the row by itself within seconds of a stream capturing the type"
    );
    Hold::new(HoldCause::NoStream, reason)
}

/// A row of `event_type`, whose stream `stream` has `settings` that lose what it acknowledged
/// or store it elsewhere ([`unsafe_settings`](crate::unsafe_settings)).
pub(super) fn unsafe_stream(event_type: &str, stream: &str, settings: &[String]) -> Hold {
    let reason = format!(
        "stream `{stream}`, which captures `{event_type}`, cannot be trusted with the outbox's events, so the relay sends it none: {}; the relay releases the row by itself within seconds of the stream being fixed",
        settings.join("; ")
    );
    Hold::new(HoldCause::UnsafeStream, reason)
}

/// A row of `event_type`, a message of which stream `stream` stored under `stored_as`.
pub(super) fn mapped(event_type: &str, stream: &str, stored_as: &str) -> Hold {
    let reason = format!(
        "the server stored a `{event_type}` message under `{stored_as}` in stream `{stream}`: an account subject mapping (or a transform) moves the type where consumers filtering on `{event_type}` never see it, so it does not count as published; remove the mapping, then release the row (`outbox unblock`)"
    );
    Hold::new(HoldCause::Mapped, reason)
}

/// Releases the holds a stream caused ([`HoldCause::releases_itself`]) of the types a safe
/// stream captures now, each type looked up afresh: due now, so the lane that owns the subject
/// publishes its held head, then the rows behind it, in order (the schedule is never dropped
/// here: only a publish of the head releases the subject). Then lets the relay try again the
/// types it found stored under another subject whose holds an operator released.
pub(super) async fn release_cleared(
    pool: &PgPool,
    jetstream: &jetstream::Context,
    streams: &Streams,
    horizon: Duration,
) -> sqlx::Result<()> {
    let causes: Vec<&str> = HoldCause::ALL
        .iter()
        .filter(|c| c.releases_itself())
        .map(|c| c.label())
        .collect();
    let types: Vec<String> = sqlx::query_scalar(sql::HELD_TYPES)
        .bind(&causes)
        .fetch_all(pool)
        .await?;
    for event_type in types {
        if crate::naming::check_event_type(&event_type).is_err() {
            continue;
        }
        let lookup = streams.refresh(jetstream, &event_type, horizon);
        let capture = tokio::time::timeout(LOOKUP_TIMEOUT, lookup)
            .await
            .unwrap_or(Capture::Unknown);
        let Capture::Stream { name } = capture else {
            continue;
        };
        if streams.refusal(&event_type).is_some() {
            continue;
        }
        let reason = format!(
            "stream `{name}` captures `{event_type}` and is safe: the relay released the row by itself, and it goes now"
        );
        let released: i64 = sqlx::query_scalar(sql::RELEASE_HELD)
            .bind(&event_type)
            .bind(&causes)
            .bind(reason)
            .bind(crate::NOTIFY_CHANNEL)
            .fetch_one(pool)
            .await?;
        if released > 0 {
            tracing::info!(
                event_type = %crate::naming::shorten(&event_type),
                stream = %name,
                subjects = released,
                "outbox relay released the subjects it held for their type's stream: a safe stream captures the type now"
            );
        }
    }
    let mapped: HashSet<String> = sqlx::query_scalar(sql::HELD_TYPES)
        .bind([HoldCause::Mapped.label()])
        .fetch_all(pool)
        .await?
        .into_iter()
        .collect();
    streams.forget_mapped(&mapped);
    Ok(())
}

/// The relay's own checks of a row before it is sent (docs/relay.md, *Held rows*).
pub(super) fn check<'r>(row: &'r Row, config: &RelayConfig) -> Result<&'r Event, Hold> {
    let event = row.event.as_ref().map_err(|why| {
        Hold::new(
            HoldCause::Unreadable,
            format!("the row cannot be published: {why}"),
        )
    })?;
    if row.attempts >= config.max_attempts {
        let reason = format!(
            "it is at the attempt cap ({} of {})",
            row.attempts, config.max_attempts
        );
        return Err(Hold::new(HoldCause::AtCap, reason));
    }
    let depth = json_depth(event.data.get());
    if depth > MAX_JSON_DEPTH {
        let reason = format!(
            "its data nests {depth} levels deep, deeper than consumers' JSON parsers accept ({MAX_JSON_DEPTH})"
        );
        return Err(Hold::new(HoldCause::Unreadable, reason));
    }
    crate::naming::check_event_type(&event.event_type).map_err(|why| {
        let shown = crate::naming::shorten(&event.event_type);
        Hold::new(
            HoldCause::BadType,
            format!("invalid event type `{shown}`: {why}"),
        )
    })?;
    Ok(event)
}

/// The deepest nesting a consumer's JSON parser accepts: serde_json's default recursion limit
/// (the consumers of this crate use it; most parsers stop near there).
const MAX_JSON_DEPTH: usize = 128;

/// How deeply `json` nests arrays and objects (valid JSON, as Postgres rendered it): one pass
/// over its bytes, skipping strings.
fn json_depth(json: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in json.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// The message, if it fits the server's `max_payload` with its headers.
pub(super) fn fits(
    body: Vec<u8>,
    headers: async_nats::HeaderMap,
    max_payload: usize,
) -> Result<(Vec<u8>, async_nats::HeaderMap), Hold> {
    if max_payload > 0 && body.len() + HEADERS_ALLOWANCE > max_payload {
        let reason = format!(
            "its message has {} bytes, more than the server's max_payload of {max_payload} (raise max_payload, or make the event smaller)",
            body.len()
        );
        return Err(Hold::new(HoldCause::TooLarge, reason));
    }
    Ok((body, headers))
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;

    #[test]
    fn only_the_brokers_refusals_count_as_attempts() {
        use HoldCause::*;
        for cause in [Unreadable, BadType, AtCap, TooLarge] {
            assert!(!cause.attempted(), "{cause:?} is the relay's own check");
        }
        assert!(NoStream.attempted() && Refused.attempted());
        for cause in [UnsafeStream, Mapped] {
            assert!(
                !cause.attempted(),
                "{cause:?}: nothing failed at the broker"
            );
        }
    }

    #[test]
    fn only_a_streams_causes_release_themselves() {
        for cause in HoldCause::ALL {
            assert_eq!(
                cause.releases_itself(),
                matches!(cause, HoldCause::NoStream | HoldCause::UnsafeStream),
                "{cause:?}"
            );
        }
        let labels: std::collections::BTreeSet<_> =
            HoldCause::ALL.iter().map(|c| c.label()).collect();
        assert_eq!(labels.len(), HoldCause::ALL.len(), "one label each");
    }

    fn row(event_type: &str, attempts: i32, event_ok: bool) -> Row {
        use super::super::position::{Position, Stamp};
        let id = uuid::Uuid::now_v7();
        let event = if event_ok {
            Ok(Event {
                event_type: event_type.to_owned(),
                source: "billing".into(),
                time: Utc::now(),
                data: serde_json::value::RawValue::from_string("{}".into()).unwrap(),
            })
        } else {
            Err("its time is infinity: the envelope needs a real instant".to_owned())
        };
        Row {
            id,
            ctid: super::super::row::tests_tid(),
            position: Position { at: Stamp(0), id },
            subject: "s".into(),
            attempts,
            event,
            trace: None,
        }
    }

    #[test]
    fn the_relays_own_checks_hold_what_it_must_not_publish() {
        let config = RelayConfig::default();
        assert!(check(&row("billing.invoice.paid", 0, true), &config).is_ok());
        let held = |r: Row| check(&r, &config).unwrap_err();
        let unreadable = held(row("billing.invoice.paid", 0, false));
        assert_eq!(unreadable.cause, HoldCause::Unreadable);
        assert!(
            unreadable.reason.contains("infinity"),
            "{}",
            unreadable.reason
        );
        let capped = held(row("billing.invoice.paid", 20, true));
        assert_eq!(capped.cause, HoldCause::AtCap);
        assert!(capped.reason.contains("20 of 20"), "{}", capped.reason);
        let wildcard = held(row("acme.order.*", 0, true));
        assert_eq!(wildcard.cause, HoldCause::BadType);
        assert!(wildcard.reason.contains("wildcard"), "{}", wildcard.reason);
        let long = held(row(&format!("a.b.{}", "c".repeat(5_000)), 0, true));
        assert_eq!(long.cause, HoldCause::BadType);
        assert!(
            long.reason.len() < 400,
            "the reason quotes the type shortened: {}",
            long.reason
        );
    }

    #[test]
    fn nesting_is_measured_outside_strings() {
        assert_eq!(json_depth("{}"), 1);
        assert_eq!(json_depth(r#"{"a":[1,{"b":[]}]}"#), 4);
        assert_eq!(
            json_depth(r#"{"s":"[[[[{{{{\"]]]"}"#),
            1,
            "brackets inside a string do not count"
        );
        assert_eq!(json_depth("3"), 0);
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert_eq!(json_depth(&deep), 200);
    }

    #[test]
    fn a_message_over_max_payload_is_held_with_the_sizes() {
        let hold = fits(vec![0; 2_000], async_nats::HeaderMap::new(), 1_024).unwrap_err();
        assert_eq!(hold.cause, HoldCause::TooLarge);
        assert!(
            hold.reason.contains("2000 bytes") && hold.reason.contains("1024"),
            "{}",
            hold.reason
        );
        assert!(fits(vec![0; 100], async_nats::HeaderMap::new(), 1_024).is_ok());
    }
}
