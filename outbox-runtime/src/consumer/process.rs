//! One message end to end: decode, hold, dedupe, handler, commit, then ack, nak or terminate.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use futures::FutureExt;
use tracing::Instrument;
use uuid::Uuid;

use super::dead_letter::{self, Kind, Letter, Stored};
use super::decode::{decode_with, Rejection};
use super::retry::{count_attempt, forget_attempts, is_transient, recorded_attempts};
use super::{Consumer, Delivery, Handler, Undecodable};
use crate::error::{Error, Result};
use crate::metrics as m;
use crate::table::OUTBOX_CONSUMED;
use crate::OutboxEvent;

/// What happened to one message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran and its transaction committed; the message was acked.
    Handled,
    /// The event id was already recorded: acked without calling the handler.
    Duplicate,
    /// The handler failed (attempt `attempt` of `max_attempts`); the message was nak'd to come
    /// back after `delay`.
    Retry {
        /// The nak delay.
        delay: Duration,
        /// The handler's error.
        error: String,
        /// Handler failures of this event so far, this one included.
        attempt: u32,
    },
    /// A transient failure (the database, or a [`Transient`](super::Transient) handler
    /// error): nak'd to come back after `delay`, no attempt counted.
    Transient {
        /// The nak delay, also the consumer's pause before its next message.
        delay: Duration,
        /// What failed.
        error: String,
    },
    /// An earlier event of the same subject waits for a retry at this consumer: nak'd
    /// unhandled to come back after `delay`, no attempt counted.
    Held {
        /// The nak delay.
        delay: Duration,
        /// The stream sequence of the earlier event.
        behind: u64,
    },
    /// The handler failed on the last allowed attempt: the message was dead-lettered (when a
    /// subject is configured) and terminated.
    GaveUp {
        /// The handler's error.
        error: String,
        /// The dead-letter subject, if one is configured: [`Consumer::process`] published the
        /// letter there; a caller of [`Consumer::apply`] is to.
        dead_letter: Option<String>,
        /// It had given up on an earlier delivery: this one was already on its way (an
        /// `ack_wait` redelivery of a slow attempt), or comes back because the delivery that
        /// gave up could not store its dead letter (the publish failed, or the process ended
        /// first). Terminated without calling the handler and not counted again; its dead
        /// letter is published again first, and the stream drops the copy of a letter it
        /// already holds (same `Nats-Msg-Id`, within its duplicate window). A replay of an
        /// event that gave up, delivered again (its first delivery held, failed transiently
        /// or lost with its replica), ends here too, with a letter of its own (another stream
        /// message), logged at info and not counted in `outbox_consumer_gave_up_total`.
        earlier: bool,
    },
    /// The message could not be decoded; handled by the [`Undecodable`] policy.
    Rejected {
        /// The event id, when the envelope had one.
        event_id: Option<Uuid>,
        /// Why it was rejected.
        reason: String,
    },
}

impl<E: OutboxEvent, H: Handler<E>> Consumer<E, H> {
    /// Handles one message end to end (decode, hold, dedupe, handler, commit, ack) and says
    /// what happened. [`Consumer::run`] calls it for every message. An `Err` means the
    /// message could not be acked, nak'd or dead-lettered: it comes back after the ack wait.
    pub async fn process(&self, message: jetstream::Message) -> Result<Outcome> {
        let (delivered, stream_sequence) = message
            .info()
            .map(|i| (i.delivered.max(1) as u64, i.stream_sequence))
            .unwrap_or((1, 0));
        let header = |name: &str| {
            message
                .headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_owned())
        };
        let traceparent = header(crate::trace::TRACEPARENT);
        let span = tracing::info_span!(
            "outbox.consume",
            consumer = %self.name,
            event_type = E::EVENT_TYPE,
            event_id = tracing::field::Empty,
            delivered,
            traceparent = traceparent.as_deref().unwrap_or(""),
            "otel.kind" = "consumer",
        );
        // the handler's span continues the trace of the message's publish span
        #[cfg(feature = "opentelemetry")]
        if let Some(sent_in) = traceparent.as_deref().and_then(|tp| {
            crate::trace::TraceContext::parse(tp, header(crate::trace::TRACESTATE).as_deref())
        }) {
            sent_in.continue_in(&span);
        }
        if delivered > 1 {
            metrics::counter!(m::CONSUMER_REDELIVERIES, "consumer" => self.name.to_string())
                .increment(1);
        }
        let envelope = match decode_with::<E>(&message.payload, self.config.formats) {
            Ok(envelope) => envelope,
            Err(rejection) => return self.reject(&message, delivered, rejection).await,
        };
        span.record("event_id", tracing::field::display(envelope.id));
        let delivery = self.delivery(envelope, delivered, stream_sequence, traceparent);
        let subject = &delivery.envelope.subject;
        let outcome = match self.holds.blocked(subject, stream_sequence) {
            Some((behind, due)) => {
                let delay = due.max(self.config.retry_base).min(self.config.retry_max);
                Outcome::Held { delay, behind }
            }
            None => match self.apply(&delivery).instrument(span).await {
                Ok(outcome) => outcome,
                Err(e) => self.transient(e.to_string()),
            },
        };
        self.settle(&message, &delivery, outcome).await
    }

    /// A transient failure's outcome: the delay grows with the consecutive ones.
    fn transient(&self, error: String) -> Outcome {
        let streak = self.transient_streak.fetch_add(1, Ordering::Relaxed) + 1;
        Outcome::Transient {
            delay: self.config.backoff(streak),
            error,
        }
    }

    /// How long a held entry outlives its expected return before it is forgotten.
    fn hold_grace(&self) -> Duration {
        self.config.ack_wait + self.config.retry_max
    }

    /// Acks, naks or terminates `message` as `outcome` says, with its metrics, log and hold.
    async fn settle(
        &self,
        message: &jetstream::Message,
        delivery: &Delivery<E>,
        outcome: Outcome,
    ) -> Result<Outcome> {
        let labels = [("consumer", self.name.to_string())];
        let (subject, sequence, id) = (
            &delivery.envelope.subject,
            delivery.stream_sequence,
            delivery.id(),
        );
        match &outcome {
            Outcome::Handled | Outcome::Duplicate => {
                self.transient_streak.store(0, Ordering::Relaxed);
                self.holds.release(subject, sequence);
                // A lost ack only means a redelivery, which the dedupe row turns into a
                // duplicate: no need to wait for the server to confirm it.
                ack(message, AckKind::Ack).await?;
                if outcome == Outcome::Handled {
                    metrics::counter!(m::CONSUMER_HANDLED, &labels).increment(1);
                } else {
                    metrics::counter!(m::CONSUMER_DUPLICATES, &labels).increment(1);
                    tracing::info!(consumer = %self.name, event_id = %id, "duplicate delivery acked, not handled");
                }
            }
            Outcome::Retry {
                delay,
                error,
                attempt,
            } => {
                self.holds
                    .hold(subject, sequence, *delay, self.hold_grace());
                ack(message, AckKind::Nak(Some(*delay))).await?;
                metrics::counter!(m::CONSUMER_FAILURES, &labels).increment(1);
                tracing::warn!(consumer = %self.name, event_id = %id, attempt, max_attempts = self.config.max_attempts,
                    error = %error, ?delay, "handler failed; retrying (the subject's later events wait)");
            }
            Outcome::Transient { delay, error } => {
                self.holds
                    .hold(subject, sequence, *delay, self.hold_grace());
                ack(message, AckKind::Nak(Some(*delay))).await?;
                metrics::counter!(m::CONSUMER_TRANSIENT, &labels).increment(1);
                tracing::warn!(consumer = %self.name, event_id = %id, error = %error, ?delay,
                    "transient failure; retrying without counting an attempt");
            }
            Outcome::Held { delay, behind } => {
                self.holds
                    .hold(subject, sequence, *delay, self.hold_grace());
                ack(message, AckKind::Nak(Some(*delay))).await?;
                metrics::counter!(m::CONSUMER_HELD, &labels).increment(1);
                tracing::debug!(consumer = %self.name, event_id = %id, behind, ?delay,
                    "held behind an earlier event of its subject");
            }
            Outcome::GaveUp {
                error,
                dead_letter,
                earlier,
            } => {
                self.give_up(message, delivery, error, dead_letter.as_deref(), *earlier)
                    .await?;
            }
            // Decoding happened before: a rejection never reaches here.
            Outcome::Rejected { .. } => {}
        }
        Ok(outcome)
    }

    /// Dead-letters (when configured) and terminates a message that gave up: on the delivery
    /// whose attempt was the last allowed (counted and reported then), or on a later one
    /// (`earlier`), which sends the letter again in case that delivery could not.
    async fn give_up(
        &self,
        message: &jetstream::Message,
        delivery: &Delivery<E>,
        error: &str,
        dead_letter: Option<&str>,
        earlier: bool,
    ) -> Result<()> {
        let id = delivery.id();
        // The attempts row that says so is committed: the message has given up, whatever
        // happens to its letter, and a redelivery finds the row and is not handled again.
        if !earlier {
            let labels = [("consumer", self.name.to_string())];
            metrics::counter!(m::CONSUMER_FAILURES, &labels).increment(1);
            metrics::counter!(m::CONSUMER_GAVE_UP, &labels).increment(1);
            tracing::error!(consumer = %self.name, event_id = %id, max_attempts = self.config.max_attempts,
                error = %error, dead_letter = dead_letter.unwrap_or(""),
                "handler failed on the last allowed attempt; the message gives up (dead-lettered when configured, then terminated; it stays in the stream)");
        }
        if let Some(subject) = dead_letter {
            let letter = Letter {
                kind: Kind::GaveUp,
                consumer: &self.name,
                original_id: id.to_string(),
                reason: error,
            };
            // on failure the message is nak'd: its redelivery gives up again, without the
            // handler, and sends the letter again
            self.send_dead_letter(message, subject, &letter).await?;
        }
        ack(message, AckKind::Term).await?;
        self.holds
            .release(&delivery.envelope.subject, delivery.stream_sequence);
        if earlier {
            tracing::info!(consumer = %self.name, event_id = %id, dead_letter = dead_letter.unwrap_or(""),
                "a redelivery of a message that gave up earlier: terminated without handling");
        }
        Ok(())
    }

    /// Publishes `letter`; on failure naks `message` (it comes back and tries again).
    async fn send_dead_letter(
        &self,
        message: &jetstream::Message,
        subject: &str,
        letter: &Letter<'_>,
    ) -> Result<()> {
        match dead_letter::publish(&self.js, subject, message, letter).await {
            Err(e) => {
                ack(message, AckKind::Nak(Some(self.config.retry_max))).await?;
                Err(e)
            }
            // a letter an earlier try stored is counted once
            Ok(Stored::Before) => Ok(()),
            Ok(Stored::Now) => {
                metrics::counter!(m::CONSUMER_DEAD_LETTERS, "consumer" => self.name.to_string(),
                    "kind" => letter.kind.as_str())
                .increment(1);
                Ok(())
            }
        }
    }

    /// The database half of [`Consumer::process`], without touching the message: in one
    /// transaction, records the event id (a duplicate returns [`Outcome::Duplicate`] and writes
    /// nothing), runs the handler, and commits on success. A handler failure is classified
    /// ([`is_transient`]) and, unless transient, counted in `outbox_consumer_attempts` in the
    /// same transaction (the handler's writes rolled back to a savepoint), which then deletes
    /// the dedupe row and commits. An `Err` is a failure of the consumer's own statements
    /// (never counted). For callers that ack themselves.
    pub async fn apply(&self, delivery: &Delivery<E>) -> Result<Outcome> {
        // Read committed, whatever the session's default: a redelivery that waited on the
        // dedupe row must read the attempt counted meanwhile, which a snapshot taken before
        // the wait (repeatable read, serializable) would not show.
        let mut tx = self
            .pool
            .begin_with("begin isolation level read committed")
            .await?;
        // The dedupe row is locked until the transaction ends, and a redelivery of the event
        // to another replica waits on it. A replica whose path or process freezes would keep
        // it waiting for good: the server ends a session idle in this transaction for the ack
        // wait (by then JetStream redelivers the message anyway), and drops its connection
        // when what it sends stays unacknowledged that long (a server blocked sending a large
        // result to a silent path is not idle), or sooner where the session already has a
        // shorter setting (the idle timeout's text, `1500ms` or `1min`, is an interval's; the
        // TCP user timeout shows as milliseconds without a unit).
        let fresh = sqlx::query(
            "with timeout as ( \
               select set_config('idle_in_transaction_session_timeout', \
                        case when t.idle between 1 and $3 then t.idle::text else $3::text end, \
                        true), \
                      set_config('tcp_user_timeout', \
                        case when t.tcp between 1 and $3 then t.tcp::text else $3::text end, \
                        true) \
                 from (select (extract(epoch from \
                         current_setting('idle_in_transaction_session_timeout')::interval) \
                         operator(pg_catalog.*) 1000)::int8 as idle, \
                       current_setting('tcp_user_timeout')::int8 as tcp) t) \
             insert into outbox_consumed (consumer, event_id) select $1, $2 from timeout \
             on conflict do nothing",
        )
        .bind(&*self.name)
        .bind(delivery.id())
        .bind(idle_timeout_ms(self.config.ack_wait))
        .execute(&mut *tx)
        .await
        .map_err(|e| OUTBOX_CONSUMED.error(e))?
        .rows_affected()
            == 1;
        if !fresh {
            tx.rollback().await?;
            return Ok(Outcome::Duplicate);
        }
        if delivery.delivered > 1 {
            let attempts = recorded_attempts(&mut tx, &self.name, delivery.id()).await?;
            if let Some((n, error)) = attempts.filter(|(n, _)| *n >= self.config.max_attempts) {
                tx.rollback().await?;
                return Ok(Outcome::GaveUp {
                    error: format!("gave up after {n} attempts: {error}"),
                    dead_letter: self.config.dead_letter.clone(),
                    earlier: true,
                });
            }
        }
        // The handler's writes can be undone without letting go of the dedupe row: a failed
        // attempt is counted while the row still holds back a redelivery on another replica
        // (one that came after the ack wait), so that redelivery reads the count. Counted after
        // the row's release, it could run the handler once more after the last attempt had
        // given up: applied and dead-lettered.
        sqlx::query("savepoint outbox_handler")
            .execute(&mut *tx)
            .await?;
        // A panic in the handler is one of its failures, with the panic's message: caught
        // here, so that it neither ends the consumer nor comes back forever to every replica.
        let handled = AssertUnwindSafe(self.handler.handle(delivery, &mut tx))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| Err(Box::new(Panicked(panic_message(&*panic)))));
        let error = match handled {
            Ok(()) => {
                // Only a redelivery can have attempts recorded.
                if delivery.delivered > 1 {
                    forget_attempts(&mut tx, &self.name, delivery.id()).await?;
                }
                tx.commit().await?;
                return Ok(Outcome::Handled);
            }
            Err(error) => error,
        };
        let transient = is_transient(&*error);
        let error = error.to_string();
        // After a panic too, the handler's writes, whatever it had sent, are undone.
        if transient {
            // No attempt spent: the dedupe row goes with the rest. A connection the server
            // ended cannot roll back (the server did); the handler's error says why, 25P03
            // for a transaction idle past the ack wait.
            let _ = tx.rollback().await;
            return Ok(self.transient(error));
        }
        sqlx::query("rollback to savepoint outbox_handler")
            .execute(&mut *tx)
            .await?;
        self.transient_streak.store(0, Ordering::Relaxed);
        // counted, and the dedupe row let go of, in one commit
        let attempt = count_attempt(&mut tx, &self.name, delivery.id(), &error).await?;
        tx.commit().await?;
        Ok(if attempt >= self.config.max_attempts {
            Outcome::GaveUp {
                error,
                dead_letter: self.config.dead_letter.clone(),
                earlier: false,
            }
        } else {
            Outcome::Retry {
                delay: self.config.backoff(attempt),
                error,
                attempt,
            }
        })
    }

    async fn reject(
        &self,
        message: &jetstream::Message,
        delivered: u64,
        rejection: Rejection,
    ) -> Result<Outcome> {
        let Rejection { event_id, reason } = rejection;
        let id = event_id.map(|i| i.to_string()).unwrap_or_else(|| {
            message
                .headers
                .as_ref()
                .and_then(|h| h.get("Nats-Msg-Id"))
                .map(|v| v.as_str().to_owned())
                .or_else(|| {
                    message
                        .info()
                        .ok()
                        .map(|i| format!("sequence-{}", i.stream_sequence))
                })
                .unwrap_or_else(|| "unknown".into())
        });
        let letter = Letter {
            kind: Kind::Undecodable,
            consumer: &self.name,
            original_id: id,
            reason: &reason,
        };
        // Counted and logged at its first delivery, whatever happens to its letter: a try
        // whose publish fails (or whose ack is lost) naks the message, and it comes back.
        if delivered == 1 {
            tracing::error!(consumer = %self.name, event_id = %letter.original_id, subject = %message.subject,
                reason = %reason, "undecodable message rejected");
            metrics::counter!(m::CONSUMER_REJECTED, "consumer" => self.name.to_string())
                .increment(1);
        }
        if let Undecodable::DeadLetter { subject } = &self.config.undecodable {
            self.send_dead_letter(message, subject, &letter).await?;
        }
        ack(message, AckKind::Term).await?;
        Ok(Outcome::Rejected { event_id, reason })
    }
}

/// `idle_in_transaction_session_timeout` for a message's transaction: the ack wait in
/// milliseconds, at least 1 (0 would turn the timeout off) and at most what the setting takes.
fn idle_timeout_ms(ack_wait: Duration) -> i64 {
    ack_wait.as_millis().clamp(1, i32::MAX as u128) as i64
}

/// A handler that panicked: an attempt that failed, with the panic's message as its reason.
#[derive(Debug)]
struct Panicked(String);

impl std::fmt::Display for Panicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the handler panicked: {}", self.0)
    }
}

impl std::error::Error for Panicked {}

/// The message a panic was raised with (`panic!` gives a `&str` or a `String`).
fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

async fn ack(message: &jetstream::Message, kind: AckKind) -> Result<()> {
    let action = match kind {
        AckKind::Ack => "acking a message",
        AckKind::Nak(_) => "nak-ing a message",
        AckKind::Term => "terminating a message",
        _ => "answering a message",
    };
    message
        .ack_with(kind)
        .await
        .map_err(|e| Error::nats(action, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_timeout_is_the_ack_wait_within_what_postgres_takes() {
        assert_eq!(idle_timeout_ms(Duration::from_secs(30)), 30_000);
        // 0 would turn the timeout off
        assert_eq!(idle_timeout_ms(Duration::ZERO), 1);
        assert_eq!(
            idle_timeout_ms(Duration::from_secs(40 * 24 * 3600)),
            i64::from(i32::MAX)
        );
    }
}
