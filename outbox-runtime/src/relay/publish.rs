//! Publishing a claim's rows: one chain per subject, pipelined across subjects, under one
//! deadline (docs/relay.md, *One batch* and *Order*). Nothing here touches the database: the
//! result is a [`Settled`] that the claim applies.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::IntoFuture;

use async_nats::connection::State;
use async_nats::jetstream;
use async_nats::jetstream::context::PublishError;
use async_nats::jetstream::publish::PublishAck;
use chrono::Utc;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use tokio::time::{sleep_until, Instant};

use super::config::RelayConfig;
use super::message::{message, Trace};
use super::row::Row;
use crate::metrics as names;

/// Why a row's publish failed (one more attempt on the row).
#[derive(Debug)]
pub(super) enum Failure {
    /// JetStream (or the client) refused the publish or its ack.
    Publish(PublishError),
    /// The NATS connection was down: publishing fails at once instead of waiting.
    NotConnected,
    /// The envelope could not be serialized.
    Envelope(serde_json::Error),
    /// No ack before the batch deadline.
    Deadline,
}

impl Failure {
    /// A short name for the cause, for the `reason` label of
    /// [`PUBLISH_FAILURES`](crate::metrics::PUBLISH_FAILURES) and for log lines: async-nats's
    /// publish error kind, or the relay's own reason.
    pub(super) fn reason(&self) -> &'static str {
        use async_nats::jetstream::context::PublishErrorKind as Kind;
        match self {
            Failure::Publish(e) => match e.kind() {
                Kind::StreamNotFound => "no_stream",
                Kind::WrongLastMessageId | Kind::WrongLastSequence => "expectation",
                Kind::TimedOut => "timeout",
                Kind::BrokenPipe => "broken_pipe",
                Kind::MaxAckPending => "max_ack_pending",
                Kind::MaxPayloadExceeded => "max_payload",
                Kind::Other => "other",
            },
            Failure::NotConnected => "not_connected",
            Failure::Envelope(_) => "envelope",
            Failure::Deadline => "deadline",
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Publish(e) => write!(f, "{e}"),
            Failure::NotConnected => f.write_str("not connected to NATS"),
            Failure::Envelope(e) => write!(f, "{e}"),
            Failure::Deadline => f.write_str("no ack before the batch deadline"),
        }
    }
}

/// What publishing a claim came to: indices into the claim's rows.
#[derive(Debug, Default)]
pub(super) struct Settled {
    /// Acknowledged (duplicates included), in ack order.
    pub(super) acked: Vec<usize>,
    /// Of `acked`, acks flagged as duplicates.
    pub(super) duplicates: usize,
    /// Attempted and failed, each with its reason.
    pub(super) failed: Vec<(usize, Failure)>,
    /// Not attempted: after a failure in their subject's chain, after the deadline, or at the
    /// attempt cap.
    pub(super) skipped: usize,
}

/// The rows of each subject as a chain in claim order: the first row of every subject is
/// ready at once, a row's successor when the row is acknowledged.
#[derive(Debug)]
pub(super) struct Chains {
    next: Vec<Option<usize>>,
    ready: VecDeque<usize>,
}

impl Chains {
    /// Chains over rows whose subjects are `subjects`, in order.
    pub(super) fn new<'a>(subjects: impl ExactSizeIterator<Item = &'a str>) -> Chains {
        let mut next = vec![None; subjects.len()];
        let mut ready = VecDeque::new();
        let mut last: HashMap<&str, usize> = HashMap::with_capacity(subjects.len());
        for (i, subject) in subjects.enumerate() {
            match last.insert(subject, i) {
                Some(previous) => next[previous] = Some(i),
                None => ready.push_back(i),
            }
        }
        Chains { next, ready }
    }

    /// The next row to send, if any is ready.
    pub(super) fn pop_ready(&mut self) -> Option<usize> {
        self.ready.pop_front()
    }

    /// Row `i` is stored: its subject's next row may go.
    pub(super) fn acked(&mut self, i: usize) {
        self.ready.extend(self.next[i]);
    }

    /// The rows after `i` in its chain: they are not attempted once `i` failed.
    pub(super) fn rest_after(&self, i: usize) -> usize {
        std::iter::successors(self.next[i], |&j| self.next[j]).count()
    }
}

/// One batch's publishing state: the chains and what has been settled so far.
struct Run<'a> {
    rows: &'a [Row],
    config: &'a RelayConfig,
    chains: Chains,
    settled: Settled,
    /// Rows sent and awaiting their ack.
    flying: Vec<bool>,
    expired: bool,
}

impl Run<'_> {
    fn fail(&mut self, i: usize, failure: Failure) {
        self.settled.failed.push((i, failure));
        self.settled.skipped += self.chains.rest_after(i);
    }

    fn ack(&mut self, i: usize, result: Result<PublishAck, PublishError>) {
        self.flying[i] = false;
        match result {
            Ok(ack) => {
                self.settled.acked.push(i);
                if ack.duplicate {
                    self.settled.duplicates += 1;
                }
                let lag = (Utc::now() - self.rows[i].created_at)
                    .to_std()
                    .unwrap_or_default();
                metrics::histogram!(names::PUBLISH_LAG).record(lag.as_secs_f64());
                // the subject's next event goes out only now that this one is stored
                self.chains.acked(i);
            }
            Err(e) => self.fail(i, Failure::Publish(e)),
        }
    }

    /// The message of ready row `i`, or `None` when it is not sent: at the cap or out of time
    /// (it and the rest of its chain are skipped), or failing before any send.
    fn prepare(
        &mut self,
        i: usize,
        trace: &Trace,
        state: State,
    ) -> Option<(Vec<u8>, async_nats::HeaderMap)> {
        if self.rows[i].attempts >= self.config.max_attempts || self.expired {
            self.settled.skipped += 1 + self.chains.rest_after(i);
            return None;
        }
        if state != State::Connected {
            self.fail(i, Failure::NotConnected);
            return None;
        }
        match message(&self.rows[i], trace, i) {
            Ok(m) => Some(m),
            Err(e) => {
                self.fail(i, Failure::Envelope(e));
                None
            }
        }
    }

    /// The deadline passed: every row still awaiting its ack failed.
    fn expire_flying(&mut self) {
        let flying: Vec<usize> = (0..self.flying.len()).filter(|&i| self.flying[i]).collect();
        for i in flying {
            self.fail(i, Failure::Deadline);
        }
    }
}

/// Publishes `rows` through `jetstream`: each subject's rows one after the other (the next
/// sent on the previous one's ack), all subjects at once, every send and ack before
/// `ack_timeout` from now.
pub(super) async fn publish(
    rows: &[Row],
    jetstream: &jetstream::Context,
    config: &RelayConfig,
    trace: &Trace,
) -> Settled {
    let client = jetstream.client();
    let mut run = Run {
        rows,
        config,
        chains: Chains::new(rows.iter().map(|r| r.subject.as_str())),
        settled: Settled::default(),
        flying: vec![false; rows.len()],
        expired: false,
    };
    // One timer for the whole batch, raced against every send and every wait for acks.
    let expiry = sleep_until(Instant::now() + config.ack_timeout);
    tokio::pin!(expiry);
    let mut in_flight = FuturesUnordered::new();
    let mut acks = Vec::new();
    loop {
        for (i, result) in acks.drain(..) {
            run.ack(i, result);
        }
        while let Some(i) = run.chains.pop_ready() {
            let Some((body, headers)) = run.prepare(i, trace, client.connection_state()) else {
                continue;
            };
            let send =
                jetstream.publish_with_headers(rows[i].event_type.clone(), headers, body.into());
            tokio::pin!(send);
            // A send may wait for an ack slot of the context (`max_ack_inflight`), which only
            // the acks in flight free: keep collecting them meanwhile.
            let sent = loop {
                tokio::select! {
                    biased;
                    sent = &mut send => break Some(sent),
                    Some(done) = in_flight.next(), if !in_flight.is_empty() => acks.push(done),
                    () = &mut expiry => break None,
                }
            };
            match sent {
                Some(Ok(ack)) => {
                    run.flying[i] = true;
                    in_flight.push(ack.into_future().map(move |r| (i, r)));
                }
                Some(Err(e)) => run.fail(i, Failure::Publish(e)),
                None => {
                    run.expired = true;
                    run.fail(i, Failure::Deadline);
                }
            }
        }
        if !acks.is_empty() {
            continue; // acks collected while sending may make more rows ready
        }
        if in_flight.is_empty() {
            break;
        }
        if !run.expired {
            tokio::select! {
                biased;
                Some(done) = in_flight.next() => {
                    acks.push(done);
                    continue;
                }
                () = &mut expiry => {}
            }
        }
        run.expire_flying();
        break;
    }
    run.settled
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chains(subjects: &[&str]) -> Chains {
        Chains::new(subjects.iter().copied())
    }

    fn drain_ready(c: &mut Chains) -> Vec<usize> {
        std::iter::from_fn(|| c.pop_ready()).collect()
    }

    #[test]
    fn the_first_row_of_every_subject_is_ready_at_once() {
        let mut c = chains(&["a", "b", "a", "c", "b", "a"]);
        assert_eq!(drain_ready(&mut c), [0, 1, 3]);
    }

    #[test]
    fn an_ack_readies_the_next_row_of_its_subject_only() {
        let mut c = chains(&["a", "b", "a", "c", "b", "a"]);
        drain_ready(&mut c);
        c.acked(0);
        assert_eq!(drain_ready(&mut c), [2]);
        c.acked(3);
        assert!(drain_ready(&mut c).is_empty(), "c has no next row");
        c.acked(2);
        c.acked(1);
        assert_eq!(drain_ready(&mut c), [5, 4]);
    }

    #[test]
    fn a_failure_skips_the_rest_of_its_chain() {
        let c = chains(&["a", "b", "a", "c", "b", "a"]);
        assert_eq!(c.rest_after(0), 2, "rows 2 and 5");
        assert_eq!(c.rest_after(2), 1);
        assert_eq!(c.rest_after(5), 0);
        assert_eq!(c.rest_after(1), 1);
        assert_eq!(c.rest_after(3), 0);
    }

    #[test]
    fn an_empty_claim_has_no_chains() {
        let mut c = chains(&[]);
        assert!(drain_ready(&mut c).is_empty());
    }
}
