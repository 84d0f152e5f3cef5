//! Why a publish did not succeed, and what that comes to (docs/relay.md, *Failures*): the
//! publish error with its kind, or the relay's own reason (not connected, the deadline, an
//! election, a reconnect, an unverified duplicate); and [`classify`], the failure table, which
//! decides from what the relay knows at that moment whether the row is sent again, failed (an
//! attempt), not attempted or held.

use std::fmt;

use async_nats::jetstream;
use async_nats::jetstream::context::{PublishError, PublishErrorKind as Kind};
use async_nats::jetstream::ErrorCode;

use super::held::{no_stream, Hold, HoldCause};
use super::streams::Capture;

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
    /// The stream acknowledged it as a duplicate of a message it does not hold as this row's:
    /// on a server older than 2.11, the id outlived a message lost in a leader change; or the
    /// message of that id was stored under another subject (an earlier send, moved by a
    /// mapping).
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
            // async-nats's error says its source itself ("publish failed: <the broker's
            // answer>"): written once
            Failure::Publish(e) => write!(f, "{e}"),
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
                "the stream acknowledged a duplicate whose message it does not hold as this event's (lost in a leader change on a server older than 2.11, or stored under another subject); it is sent again until the stream's duplicate window forgets its id",
            ),
            Failure::InProcess => f.write_str(
                "the stream is storing a message of the same id right now (an earlier send whose ack was lost to a leader change)",
            ),
        }
    }
}

/// What a failed publish comes to.
#[derive(Debug)]
pub(super) enum Verdict {
    /// Send it again within the batch, after a short delay (an election may be ending).
    Retry,
    /// Attempted and failed: one more attempt, and the subject backs off, or is held when the
    /// attempt was the row's last (`at_cap`).
    Failed { failure: Failure, at_cap: bool },
    /// Never reached the broker, or reached it while it could take nothing: no attempt.
    NotAttempted(Failure),
    /// It cannot be published as it is: held with its subject.
    Held(Hold),
}

/// What the relay knows when it classifies a failure. The lookups are `None` until asked for
/// ([`Ask`]): they cost a request to the broker, and only some failures need them.
#[derive(Debug, Clone, Default)]
pub(super) struct Facts {
    /// The NATS connection is up now.
    pub(super) connected: bool,
    /// The client connected again since the batch started.
    pub(super) reconnected: bool,
    /// A send within the batch is left to the row (it was sent again fewer than the election
    /// retries, and the deadline leaves room for the delay).
    pub(super) may_retry: bool,
    /// An attempt now would be the row's last (`attempts + 1 >= max_attempts`).
    pub(super) last_attempt: bool,
    /// The stream that captures the row's type, and whether it was asked of the broker for
    /// this failure (`fresh`) or is what the relay last knew.
    pub(super) capture: Option<(Capture, bool)>,
    /// Whether the type's stream changed leader within two ack timeouts, or cannot say who
    /// leads it.
    pub(super) elected: Option<bool>,
}

/// A lookup [`classify`] needs before it can decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Lookup {
    /// The stream that captures the type: asked of the broker now (`fresh`: a "no responders"
    /// must tell a missing stream from an election), or as last known.
    Capture { fresh: bool },
    /// Whether stream `name` changed leader lately.
    Election { name: String },
}

/// [`classify`] cannot decide yet: it hands the failure back with the lookup it needs.
#[derive(Debug)]
pub(super) struct Ask {
    pub(super) failure: Failure,
    pub(super) lookup: Lookup,
}

/// The failure table (docs/relay.md, *Failures*): what `failure` of a row of `event_type`
/// comes to, given `facts`; or the lookup it needs first.
pub(super) fn classify(failure: Failure, event_type: &str, facts: &Facts) -> Result<Verdict, Ask> {
    let connected = facts.connected;
    let failed = |failure| Verdict::Failed {
        failure,
        at_cap: facts.last_attempt,
    };
    let ask = |failure, lookup| Err(Ask { failure, lookup });
    let election_or_no_stream = |failure| match &facts.capture {
        Some((Capture::Nothing, true)) => Ok(Verdict::Held(no_stream(event_type))),
        Some((_, true)) if facts.may_retry => Ok(Verdict::Retry),
        Some((_, true)) => Ok(Verdict::NotAttempted(Failure::Election)),
        _ => ask(failure, Lookup::Capture { fresh: true }),
    };
    match failure {
        Failure::NotConnected => Ok(Verdict::NotAttempted(failure)),
        Failure::Deadline | Failure::Election if !connected => Ok(Verdict::NotAttempted(failure)),
        Failure::Deadline | Failure::LeaderChange => timed_out(failure, facts),
        Failure::Election
        | Failure::Reconnected
        | Failure::UnverifiedDuplicate
        | Failure::InProcess => Ok(Verdict::NotAttempted(failure)),
        Failure::Publish(ref e) => match e.kind() {
            Kind::MaxPayloadExceeded => {
                let reason = format!("its message is larger than the server's max_payload: {e}");
                Ok(Verdict::Held(Hold::new(HoldCause::TooLarge, reason)))
            }
            Kind::MaxAckPending => Ok(Verdict::NotAttempted(failure)),
            Kind::TimedOut if connected => timed_out(failure, facts),
            Kind::StreamNotFound => election_or_no_stream(failure),
            Kind::Other => match jetstream_code(e) {
                Some(ErrorCode::CLUSTER_NOT_AVAILABLE) => election_or_no_stream(failure),
                // an earlier send of this row is being stored: costs no attempt
                Some(DUPLICATE_IN_PROCESS) => Ok(Verdict::NotAttempted(Failure::InProcess)),
                Some(ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM) => {
                    let reason = format!("the stream refuses it: {failure}");
                    Ok(Verdict::Held(Hold::new(HoldCause::Refused, reason)))
                }
                _ if !connected || facts.reconnected => Ok(Verdict::NotAttempted(failure)),
                _ => Ok(failed(failure)),
            },
            _ if !connected || facts.reconnected => Ok(Verdict::NotAttempted(failure)),
            _ => Ok(failed(failure)),
        },
    }
}

/// No ack came in time: an attempt, unless the connection went meanwhile, or the type's
/// stream changed leader within two ack timeouts or cannot say who leads it (then the ack was
/// lost to the election).
fn timed_out(failure: Failure, facts: &Facts) -> Result<Verdict, Ask> {
    if !facts.connected {
        return Ok(Verdict::NotAttempted(Failure::Deadline));
    }
    if facts.reconnected {
        return Ok(Verdict::NotAttempted(Failure::Reconnected));
    }
    let elected = match &facts.capture {
        None => {
            let lookup = Lookup::Capture { fresh: false };
            return Err(Ask { failure, lookup });
        }
        Some((Capture::Nothing, _)) => false,
        Some((Capture::Unknown, _)) => true,
        Some((Capture::Stream { name }, _)) => match facts.elected {
            Some(elected) => elected,
            None => {
                let lookup = Lookup::Election { name: name.clone() };
                return Err(Ask { failure, lookup });
            }
        },
    };
    if elected {
        Ok(Verdict::NotAttempted(Failure::LeaderChange))
    } else {
        Ok(Verdict::Failed {
            failure: Failure::Deadline,
            at_cap: facts.last_attempt,
        })
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

    const TYPE: &str = "billing.invoice.paid";

    fn stream() -> Capture {
        Capture::Stream {
            name: "BILLING".into(),
        }
    }

    /// Connected since the batch began, a retry left, far from the cap, nothing looked up.
    fn calm() -> Facts {
        Facts {
            connected: true,
            reconnected: false,
            may_retry: true,
            last_attempt: false,
            capture: None,
            elected: None,
        }
    }

    /// The broker's answer with JetStream error `code`.
    fn broker(code: u64, description: &str) -> Failure {
        let error: jetstream::Error = serde_json::from_value(serde_json::json!({
            "code": 503, "err_code": code, "description": description,
        }))
        .expect("a JetStream error");
        Failure::Publish(PublishError::with_source(Kind::Other, error))
    }

    fn publish(kind: Kind) -> Failure {
        Failure::Publish(PublishError::new(kind))
    }

    fn decided(failure: Failure, facts: &Facts) -> Verdict {
        match classify(failure, TYPE, facts) {
            Ok(verdict) => verdict,
            Err(ask) => panic!("decides without a lookup, asked for {:?}", ask.lookup),
        }
    }

    fn asks(failure: Failure, facts: &Facts) -> Lookup {
        match classify(failure, TYPE, facts) {
            Ok(verdict) => panic!("needs a lookup first, decided {verdict:?}"),
            Err(ask) => ask.lookup,
        }
    }

    fn not_attempted(verdict: Verdict) -> &'static str {
        match verdict {
            Verdict::NotAttempted(f) => f.reason(),
            other => panic!("not attempted, found {other:?}"),
        }
    }

    fn failed(verdict: Verdict) -> (&'static str, bool) {
        match verdict {
            Verdict::Failed { failure, at_cap } => (failure.reason(), at_cap),
            other => panic!("failed, found {other:?}"),
        }
    }

    fn held(verdict: Verdict) -> Hold {
        match verdict {
            Verdict::Held(hold) => hold,
            other => panic!("held, found {other:?}"),
        }
    }

    // *Failures*, "not attempted": the connection is down.
    #[test]
    fn nothing_sent_while_the_connection_is_down_is_not_attempted() {
        let down = Facts {
            connected: false,
            ..calm()
        };
        assert_eq!(
            not_attempted(decided(Failure::NotConnected, &down)),
            "not_connected"
        );
        assert_eq!(
            not_attempted(decided(Failure::NotConnected, &calm())),
            "not_connected"
        );
    }

    // "no responders" or "JetStream temporarily unavailable" while a stream captures the
    // type: sent again twice, 250 ms apart, then not attempted.
    #[test]
    fn an_election_is_retried_within_the_batch_then_not_attempted() {
        let unavailable = || broker(10008, "JetStream system temporarily unavailable");
        for failure in [|| publish(Kind::StreamNotFound), unavailable] {
            assert_eq!(
                asks(failure(), &calm()),
                Lookup::Capture { fresh: true },
                "a missing stream and an election look alike until the broker is asked"
            );
            let cached = Facts {
                capture: Some((stream(), false)),
                ..calm()
            };
            assert_eq!(
                asks(failure(), &cached),
                Lookup::Capture { fresh: true },
                "what the relay last knew is not enough: the stream may be gone"
            );
            let captured = Facts {
                capture: Some((stream(), true)),
                ..calm()
            };
            assert!(matches!(decided(failure(), &captured), Verdict::Retry));
            let retried = Facts {
                may_retry: false,
                ..captured.clone()
            };
            assert_eq!(not_attempted(decided(failure(), &retried)), "election");
            let unknown = Facts {
                capture: Some((Capture::Unknown, true)),
                may_retry: false,
                ..calm()
            };
            assert_eq!(
                not_attempted(decided(failure(), &unknown)),
                "election",
                "a lookup the broker does not answer is an election too"
            );
        }
        let down = Facts {
            connected: false,
            ..calm()
        };
        assert_eq!(not_attempted(decided(Failure::Election, &down)), "election");
    }

    // an ack timeout or the deadline while the connection is down.
    #[test]
    fn no_ack_while_the_connection_is_down_is_not_attempted() {
        let down = Facts {
            connected: false,
            ..calm()
        };
        for failure in [Failure::Deadline, Failure::LeaderChange] {
            assert_eq!(not_attempted(decided(failure, &down)), "deadline");
        }
        assert_eq!(
            not_attempted(decided(publish(Kind::TimedOut), &down)),
            "timeout"
        );
        assert_eq!(
            not_attempted(decided(publish(Kind::BrokenPipe), &down)),
            "broken_pipe"
        );
    }

    // after the connection was lost and made again during the batch.
    #[test]
    fn no_ack_after_a_reconnect_is_not_attempted() {
        let reconnected = Facts {
            reconnected: true,
            ..calm()
        };
        for failure in [Failure::Deadline, publish(Kind::TimedOut)] {
            assert_eq!(not_attempted(decided(failure, &reconnected)), "reconnected");
        }
        assert_eq!(
            not_attempted(decided(broker(10077, "stream store failed"), &reconnected)),
            "other",
            "an error answered on the old connection: the broker may not have seen it whole"
        );
    }

    // while the type's stream changed leader within two ack timeouts, or cannot say who
    // leads it.
    #[test]
    fn no_ack_while_the_stream_changes_leader_is_not_attempted() {
        assert_eq!(
            asks(Failure::Deadline, &calm()),
            Lookup::Capture { fresh: false }
        );
        let captured = Facts {
            capture: Some((stream(), false)),
            ..calm()
        };
        assert_eq!(
            asks(Failure::Deadline, &captured),
            Lookup::Election {
                name: "BILLING".into()
            }
        );
        let elected = Facts {
            elected: Some(true),
            ..captured
        };
        for failure in [Failure::Deadline, publish(Kind::TimedOut)] {
            assert_eq!(not_attempted(decided(failure, &elected)), "leader_change");
        }
        let leaderless = Facts {
            capture: Some((Capture::Unknown, false)),
            ..calm()
        };
        assert_eq!(
            not_attempted(decided(Failure::Deadline, &leaderless)),
            "leader_change"
        );
    }

    // a duplicate ack from a server older than 2.11 for a message the stream does not hold.
    #[test]
    fn an_unverified_duplicate_is_not_attempted() {
        assert_eq!(
            not_attempted(decided(Failure::UnverifiedDuplicate, &calm())),
            "unverified_duplicate"
        );
    }

    // "duplicate message id is in process" (JetStream error 10158).
    #[test]
    fn a_duplicate_in_process_is_not_attempted() {
        let in_process = broker(10158, "duplicate message id is in process");
        assert_eq!(not_attempted(decided(in_process, &calm())), "in_process");
        assert_eq!(
            not_attempted(decided(Failure::InProcess, &calm())),
            "in_process"
        );
    }

    // the client's own limit on acks in flight: nothing reached the broker.
    #[test]
    fn the_clients_ack_limit_is_not_an_attempt() {
        assert_eq!(
            not_attempted(decided(publish(Kind::MaxAckPending), &calm())),
            "max_ack_pending"
        );
    }

    // "failed": the broker answered with an error.
    #[test]
    fn an_error_the_broker_answered_is_an_attempt() {
        let refused = || broker(10077, "maximum messages exceeded");
        assert_eq!(failed(decided(refused(), &calm())), ("other", false));
        assert_eq!(
            failed(decided(publish(Kind::WrongLastSequence), &calm())),
            ("expectation", false)
        );
        let last = Facts {
            last_attempt: true,
            ..calm()
        };
        assert_eq!(
            failed(decided(refused(), &last)),
            ("other", true),
            "the attempt that reaches max_attempts says so, once"
        );
    }

    // "failed": no ack before the deadline while the connection was up and the stream kept
    // its leader.
    #[test]
    fn no_ack_while_connected_and_the_leader_stays_is_an_attempt() {
        let stable = Facts {
            capture: Some((stream(), false)),
            elected: Some(false),
            ..calm()
        };
        for failure in [Failure::Deadline, publish(Kind::TimedOut)] {
            assert_eq!(failed(decided(failure, &stable)), ("deadline", false));
        }
        let nowhere = Facts {
            capture: Some((Capture::Nothing, false)),
            last_attempt: true,
            ..calm()
        };
        assert_eq!(
            failed(decided(Failure::Deadline, &nowhere)),
            ("deadline", true)
        );
    }

    // "held": larger than the server's max_payload.
    #[test]
    fn a_message_over_max_payload_is_held() {
        let hold = held(decided(publish(Kind::MaxPayloadExceeded), &calm()));
        assert_eq!(hold.cause, HoldCause::TooLarge);
        assert!(hold.reason.contains("max_payload"), "{}", hold.reason);
    }

    // "held": a type no stream captures, as the broker says when asked after "no responders".
    #[test]
    fn a_type_no_stream_captures_is_held() {
        let nothing = Facts {
            capture: Some((Capture::Nothing, true)),
            ..calm()
        };
        let hold = held(decided(publish(Kind::StreamNotFound), &nothing));
        assert_eq!(hold.cause, HoldCause::NoStream);
        assert!(hold.reason.contains(TYPE), "{}", hold.reason);
    }

    #[test]
    fn a_brokers_answer_is_said_once() {
        let refused = broker(10077, "maximum messages exceeded");
        assert_eq!(
            refused.to_string(),
            "publish failed: maximum messages exceeded (code 503, error code 10077)"
        );
    }

    // "held": refused by the stream for good (over its max_msg_size).
    #[test]
    fn a_message_the_stream_refuses_for_good_is_held() {
        let too_big = broker(10054, "message size exceeds maximum allowed");
        let hold = held(decided(too_big, &calm()));
        assert_eq!(hold.cause, HoldCause::Refused);
        assert!(
            hold.reason.contains("message size exceeds maximum allowed"),
            "{}",
            hold.reason
        );
    }

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
