//! Why a publish did not succeed, as the relay judges it (docs/relay.md, *Failures*): the
//! publish error with its kind, or the relay's own reason (not connected, the deadline, an
//! election, a reconnect, an unverified duplicate).

use std::fmt;

use async_nats::jetstream;
use async_nats::jetstream::context::{PublishError, PublishErrorKind as Kind};
use async_nats::jetstream::ErrorCode;

/// Why a publish did not succeed.
#[derive(Debug)]
pub(super) enum Failure {
    /// JetStream (or the client) refused the publish or its ack.
    Publish(PublishError),
    /// The NATS connection was down: nothing was sent.
    NotConnected,
    /// No ack before the batch deadline.
    Deadline,
    /// The stream that captures the type could not take it (an election), after the retries.
    Election,
    /// No ack came while the stream changed leader (or could not say who leads it).
    LeaderChange,
    /// No ack came, and the connection to NATS was lost and made again during the batch: the
    /// message or its ack went with the old connection.
    Reconnected,
    /// A server older than 2.11 acknowledged it as a duplicate of a message the stream does
    /// not hold (the id outlived a message lost in a leader change).
    UnverifiedDuplicate,
    /// The stream is storing a message of the same id right now (JetStream error 10158, "duplicate
    /// message id is in process"): an earlier send of this row, whose ack was lost to a leader
    /// change, is still going through. The next send gets its ack, or a duplicate's.
    InProcess,
}

/// JetStream's "duplicate message id is in process" (409).
pub(super) const DUPLICATE_IN_PROCESS: ErrorCode = ErrorCode(10158);

impl Failure {
    /// A short name for the cause, for the `reason` label of the failure metrics and for log
    /// lines: async-nats's publish error kind, or the relay's own reason.
    pub(super) fn reason(&self) -> &'static str {
        match self {
            Failure::Publish(e) => match e.kind() {
                Kind::StreamNotFound => "no_responders",
                Kind::WrongLastMessageId | Kind::WrongLastSequence => "expectation",
                Kind::TimedOut => "timeout",
                Kind::BrokenPipe => "broken_pipe",
                Kind::MaxAckPending => "max_ack_pending",
                Kind::MaxPayloadExceeded => "max_payload",
                Kind::Other => "other",
            },
            Failure::NotConnected => "not_connected",
            Failure::Deadline => "deadline",
            Failure::Election => "election",
            Failure::LeaderChange => "leader_change",
            Failure::Reconnected => "reconnected",
            Failure::UnverifiedDuplicate => "unverified_duplicate",
            Failure::InProcess => "in_process",
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Publish(e) => match std::error::Error::source(e) {
                Some(source) => write!(f, "{e}: {source}"),
                None => write!(f, "{e}"),
            },
            Failure::NotConnected => f.write_str("not connected to NATS"),
            Failure::Deadline => f.write_str("no ack before the batch deadline"),
            Failure::Election => f.write_str(
                "the stream could not take the message (no responders, or JetStream temporarily unavailable: a leader election)",
            ),
            Failure::LeaderChange => f.write_str(
                "no ack came while the stream changed leader (or could not say who leads it): the ack was lost to an election",
            ),
            Failure::Reconnected => f.write_str(
                "no ack came, and the connection to NATS was lost and made again meanwhile",
            ),
            Failure::UnverifiedDuplicate => f.write_str(
                "the server (older than 2.11) acknowledged a duplicate whose message the stream does not hold; it is sent again until the stream's duplicate window forgets its id",
            ),
            Failure::InProcess => f.write_str(
                "the stream is storing a message of the same id right now (an earlier send whose ack was lost to a leader change)",
            ),
        }
    }
}

/// The JetStream API error code behind a publish error, if there is one.
pub(super) fn jetstream_code(e: &PublishError) -> Option<ErrorCode> {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<jetstream::Error>())
        .map(jetstream::Error::error_code)
}

/// Whether a server of `version` (as its `INFO` says, `2.10.24`) is older than 2.11, whose
/// fixes keep a message id out of the dedupe map when its message was lost in a leader change;
/// an unreadable version counts as older.
pub(super) fn before_2_11(version: &str) -> bool {
    let mut parts = version
        .trim_start_matches('v')
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u64>());
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor) < (2, 11),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_acks_are_checked_on_servers_before_2_11() {
        for old in ["2.9.10", "2.10.24", "v2.10.0", "1.4.1", "", "dev"] {
            assert!(before_2_11(old), "{old}");
        }
        for new in ["2.11.0", "2.11.0-RC.1", "2.12.1", "2.15.1", "3.0.0"] {
            assert!(!before_2_11(new), "{new}");
        }
    }
}
