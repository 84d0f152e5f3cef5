//! The consumer's settings.

use std::time::Duration;

/// What to do with a message that cannot be decoded (not an envelope, another event type, a
/// payload that breaks the schema). Redelivering it would fail forever, so it is never retried.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Undecodable {
    /// Report it and terminate it (JetStream stops redelivering; the message stays in the
    /// stream for inspection).
    #[default]
    Terminate,
    /// Report it, publish it to `subject` as a dead letter (see
    /// [`ConsumerConfig::dead_letter`] for the headers), then terminate it. If that publish
    /// fails the message is nak'd and tried again later.
    DeadLetter {
        /// Where rejected messages go (a stream must capture it).
        subject: String,
    },
}

/// How strictly [`decode`](super::decode_with) checks the JSON Schema `format` keywords
/// (`date-time`, `email`, `uri`, …) of an event's payload.
///
/// Producers in other languages validate formats with their own validators, which disagree on
/// details (a `date-time` without seconds, an internationalised `email`). A consumer that
/// terminated such an event would drop a fact its producer committed, so the default ignores
/// formats: the rest of the schema is still checked, and a value that does not fit the Rust
/// type (a `uuid` or `DateTime` field that does not parse) is still rejected by
/// deserialisation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FormatCheck {
    /// Formats are annotations: not checked (the default).
    #[default]
    Lenient,
    /// Formats are assertions, as the emit path checks them: a payload whose string breaks its
    /// format is rejected.
    Strict,
}

/// Settings of a [`Consumer`](super::Consumer) (server-side values with defaults, like
/// async-nats' configs).
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// The durable consumer name, also the `consumer` column of the dedupe table. One name
    /// serves one event type (refused at start otherwise).
    pub name: String,
    /// The stream to consume from.
    pub stream: String,
    /// How long JetStream waits for an ack before redelivering (default 30 s). A handler must
    /// finish within it. It also bounds how long the message's transaction may sit idle (the
    /// handler awaiting something other than the database, or a replica whose process or path
    /// froze): Postgres ends the session then (`idle_in_transaction_session_timeout`, set for
    /// that transaction only, unless the session's own is shorter), so that a redelivery to
    /// another replica does not wait on the event's dedupe row for good; the handler's try
    /// then fails transiently (`25P03`). So does a path that goes silent while the server
    /// sends a result (`tcp_user_timeout`, likewise: the server drops the connection).
    pub ack_wait: Duration,
    /// Handler failures after which a message gives up (default 5): it goes to
    /// [`dead_letter`](Self::dead_letter) when set, is terminated and reported. Counted in the
    /// consumer's database (`outbox_consumer_attempts`); transient database errors (a lost
    /// connection, a serialization failure, a deadlock, a lock timeout) and JetStream
    /// redeliveries are not failures of the handler and do not count.
    pub max_attempts: u32,
    /// First retry delay after a handler failure; doubles per attempt (default 1 s). Also the
    /// first pause after a transient error, doubling while they last.
    pub retry_base: Duration,
    /// Retry delay ceiling (default 60 s).
    pub retry_max: Duration,
    /// Policy for messages that cannot be decoded.
    pub undecodable: Undecodable,
    /// Where messages that gave up are published (default none: they are only terminated and
    /// reported). The dead letter is the original payload with the original headers, except
    /// `Nats-Msg-Id`, which is the letter's own (`dead-letter:<consumer>:<original id>:<stream
    /// sequence>`, so a retried publish is deduped, a replayed event that gives up again gets a
    /// letter of its own, and a letter in the event's own stream is not mistaken for the
    /// event), plus `Outbox-Dead-Letter-Kind` (`gave-up` or `undecodable`),
    /// `Outbox-Rejected-Reason`, `Outbox-Rejected-By` (the consumer), `Outbox-Original-Id`,
    /// `Outbox-Original-Subject`, `Outbox-Original-Stream` and `Outbox-Original-Sequence`. A
    /// stream must capture the subject; the publish is acknowledged before the original is
    /// terminated.
    pub dead_letter: Option<String>,
    /// How long dedupe rows are kept, when something other than
    /// [`retention::prune_dedupe`](crate::retention::prune_dedupe) prunes them (default `None`).
    /// When this consumer's durable is created again (deleted by an operator, or with its
    /// stream), it starts at messages stored since the dedupe horizon instead of the whole
    /// stream: older events may have lost their dedupe rows and would take effect twice. The
    /// horizon is the newest cutoff `prune_dedupe` recorded (table `outbox_dedupe_horizon`),
    /// or `now - keep_dedupe` if that is later. With neither, nothing was pruned, and the
    /// whole stream is replayed safely.
    pub keep_dedupe: Option<Duration>,
    /// Format checking at decode (default [`FormatCheck::Lenient`]).
    pub formats: FormatCheck,
}

impl ConsumerConfig {
    /// A config for durable `name` on `stream`, other values default.
    pub fn new(name: impl Into<String>, stream: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            stream: stream.into(),
            ack_wait: Duration::from_secs(30),
            max_attempts: 5,
            retry_base: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
            undecodable: Undecodable::Terminate,
            dead_letter: None,
            keep_dedupe: None,
            formats: FormatCheck::Lenient,
        }
    }

    /// `retry_base` doubled `n - 1` times, capped at `retry_max` (`n` = 1 gives `retry_base`).
    pub(crate) fn backoff(&self, n: u32) -> Duration {
        let exp = n.saturating_sub(1).min(30);
        self.retry_base
            .saturating_mul(2u32.saturating_pow(exp))
            .min(self.retry_max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_base_and_stops_at_the_cap() {
        let config = ConsumerConfig::new("c", "S");
        let delays: Vec<u64> = (1..=8).map(|n| config.backoff(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(config.backoff(u32::MAX), Duration::from_secs(60));
        assert_eq!(config.backoff(0), Duration::from_secs(1));
    }
}
