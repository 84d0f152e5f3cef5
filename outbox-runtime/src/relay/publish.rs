//! Publishing a claim's rows: one chain per subject, pipelined across subjects, under one
//! deadline; each row ends acknowledged, failed, not attempted or held (docs/relay.md, *One
//! batch* and *Failures*). Nothing here touches the database: the result is a [`Settled`] that
//! the claim applies.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::future::IntoFuture;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream;
use async_nats::jetstream::context::PublishError;
use async_nats::jetstream::publish::PublishAck;
use chrono::Utc;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use tokio::time::{sleep, sleep_until, timeout, Instant};

use super::config::RelayConfig;
pub(super) use super::failure::Failure;
use super::failure::{before_2_11, classify, Ask, Facts, Lookup, Verdict};
use super::held::{check, fits};
pub(super) use super::held::{Hold, HoldCause};
use super::message::message;
use super::row::Row;
use super::streams::{Capture, Streams};
use crate::metrics as names;
use crate::trace::{Roots, TraceContext};

/// How often, and how far apart, a publish answered by "no responders" (a stream electing a
/// leader) or "JetStream temporarily unavailable" is sent again within the batch.
const ELECTION_RETRIES: u8 = 2;
const ELECTION_RETRY_DELAY: Duration = Duration::from_millis(250);
/// The longest wait for a stream lookup while classifying a failure.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(1);

/// What publishing a claim came to: indices into the claim's rows.
#[derive(Debug, Default)]
pub(super) struct Settled {
    /// Acknowledged (duplicates included), in ack order.
    pub(super) acked: Vec<usize>,
    /// Of `acked`, acks flagged as duplicates.
    pub(super) duplicates: usize,
    /// Attempted and failed: one more attempt each, and their subject backs off (or is held,
    /// at the attempt cap).
    pub(super) failed: Vec<(usize, FailedAttempt)>,
    /// Never reached the broker, or reached it while it could take nothing (an election): no
    /// attempt spent.
    pub(super) not_attempted: Vec<(usize, Failure)>,
    /// Cannot be published as they are: held with their subject.
    pub(super) held: Vec<(usize, Hold)>,
    /// Not tried: after a row of their subject that did not succeed, or after the deadline.
    pub(super) skipped: usize,
}

/// A publish the broker answered with a failure, or left without an ack while it could answer.
#[derive(Debug)]
pub(super) struct FailedAttempt {
    pub(super) failure: Failure,
    /// This attempt was the row's last: it reached `max_attempts`, and its subject is held.
    pub(super) at_cap: bool,
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

    /// Row `i` is to be sent again.
    fn again(&mut self, i: usize) {
        self.ready.push_back(i);
    }

    /// The rows after `i` in its chain: they are not tried once `i` did not succeed.
    pub(super) fn rest_after(&self, i: usize) -> usize {
        std::iter::successors(self.next[i], |&j| self.next[j]).count()
    }
}

/// What publishing needs of the relay.
#[derive(Debug, Clone, Copy)]
pub(super) struct Publisher<'a> {
    pub(super) jetstream: &'a jetstream::Context,
    pub(super) config: &'a RelayConfig,
    pub(super) streams: &'a Streams,
}

/// Where a row is in its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Leg {
    /// Not sent yet, or done with.
    #[default]
    Ground,
    /// Sent and awaiting its ack.
    Flying,
    /// Waiting to be sent again (an election may be ending).
    Waiting,
}

/// One row's flight through its batch.
#[derive(Debug, Default)]
struct Flight {
    leg: Leg,
    /// How often it was sent again within the batch.
    retries: u8,
    /// The context it is sent in (its `traceparent` header), once it was prepared: the same on
    /// every send of the row within the batch.
    sent_in: Option<TraceContext>,
    /// Its `outbox.publish` span, from its first send to its ack or its end.
    #[cfg(feature = "opentelemetry")]
    span: Option<tracing::Span>,
}

/// One batch's publishing state.
struct Run<'a> {
    rows: &'a [Row],
    to: Publisher<'a>,
    chains: Chains,
    settled: Settled,
    /// Each row's flight, by index.
    flights: Vec<Flight>,
    deadline: Instant,
    expired: bool,
    /// The client's connection count when the batch started.
    connects: u64,
    /// Per stream, whether it changed leader during this batch (asked once per batch).
    elections: HashMap<String, bool>,
    /// Per event type, the stream that captures it, as looked up during this batch (once per
    /// type, an unanswered lookup included: a silent broker costs each type one wait, not each
    /// row), and whether it was asked of the broker (rather than the relay's cache).
    captures: HashMap<String, (Capture, bool)>,
    /// Whether a duplicate ack is checked against the stream before it counts (servers older
    /// than 2.11, whose dedupe map could outlive a message lost in a leader change).
    verify_duplicates: bool,
    /// New roots for the rows that have no trace context to send.
    roots: Roots,
    /// The types whose stored subject was read back from an ack in this batch (once per type
    /// and batch at most), and of them, those stored under another subject, with their hold.
    subjects_checked: HashSet<String>,
    stored_elsewhere: HashMap<String, Hold>,
}

/// A message as a stream stored it, read back at an ack's sequence.
struct StoredMessage {
    subject: String,
    id: Option<String>,
}

impl<'a> Run<'a> {
    /// The state of a batch of `rows` that starts now.
    fn new(rows: &'a [Row], to: Publisher<'a>) -> Run<'a> {
        Run {
            rows,
            to,
            chains: Chains::new(rows.iter().map(|r| r.subject.as_str())),
            settled: Settled::default(),
            flights: rows.iter().map(|_| Flight::default()).collect(),
            deadline: Instant::now() + to.config.ack_timeout,
            expired: false,
            connects: connects(to.jetstream),
            elections: HashMap::new(),
            captures: HashMap::new(),
            verify_duplicates: before_2_11(&to.jetstream.client().server_info().version),
            roots: Roots::new(),
            subjects_checked: HashSet::new(),
            stored_elsewhere: HashMap::new(),
        }
    }

    /// The context row `i` is sent in: its publish span's (a child of the context the event
    /// was emitted in, or a new root), or without one (no `opentelemetry` feature, no
    /// OpenTelemetry layer, or the span filtered out) the emit context itself, or a new random
    /// root.
    fn sent_in(&mut self, i: usize) -> TraceContext {
        if let Some(cx) = &self.flights[i].sent_in {
            return cx.clone();
        }
        #[cfg(feature = "opentelemetry")]
        let spanned = self.publish_span(i);
        #[cfg(not(feature = "opentelemetry"))]
        let spanned = None;
        let cx = spanned
            .or_else(|| self.rows[i].trace.clone())
            .unwrap_or_else(|| self.roots.next());
        self.flights[i].sent_in = Some(cx.clone());
        cx
    }

    /// Opens row `i`'s `outbox.publish` span, parented by the context the event was emitted in
    /// (a root of its own without one), and links the batch span (the current one) to it.
    #[cfg(feature = "opentelemetry")]
    fn publish_span(&mut self, i: usize) -> Option<TraceContext> {
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;

        let row = &self.rows[i];
        let span = tracing::info_span!(
            parent: None,
            "outbox.publish",
            "otel.kind" = "producer",
            "messaging.system" = "nats",
            "messaging.operation.type" = "send",
            "messaging.destination.name" = row.event_type(),
            "messaging.message.id" = %row.id,
            "otel.status_code" = tracing::field::Empty,
            "otel.status_description" = tracing::field::Empty,
        );
        if let Some(emitted) = &row.trace {
            emitted.continue_in(&span);
        }
        let started = span.context().span().span_context().clone();
        let cx = TraceContext::of_span_context(&started)?;
        tracing::Span::current().add_link(started);
        self.flights[i].span = Some(span);
        Some(cx)
    }

    /// Row `i` is done with: its publish span ends, with an error status and `why` unless it
    /// was acknowledged.
    #[cfg_attr(not(feature = "opentelemetry"), allow(unused_variables))]
    fn end_span(&mut self, i: usize, why: Option<&dyn std::fmt::Display>) {
        #[cfg(feature = "opentelemetry")]
        if let Some(span) = self.flights[i].span.take() {
            if let Some(why) = why {
                span.record("otel.status_code", "error");
                span.record("otel.status_description", tracing::field::display(why));
            }
        }
    }

    /// Row `i`'s publish was answered with `result`.
    async fn answered<'f>(
        &mut self,
        i: usize,
        result: Result<PublishAck, PublishError>,
        delayed: &mut FuturesUnordered<futures::future::BoxFuture<'f, usize>>,
    ) {
        self.flights[i].leg = Leg::Ground;
        match result {
            Ok(ack) => match self.stored(i, &ack).await {
                Ok(()) => self.acked(i, ack),
                Err(verdict) => self.settle(i, verdict),
            },
            Err(e) => self.failed(i, Failure::Publish(e), delayed).await,
        }
    }

    /// Whether `ack` of row `i` counts: `Err` with what it comes to when the stream stored the
    /// message under another subject than the row's type (an account subject mapping), or when
    /// a duplicate ack points at a message the stream does not hold as the row's (a server
    /// before 2.11, or a message stored elsewhere). The stored message is read back only when
    /// a check is due: a duplicate from a server before 2.11, and the first ack of a type in a
    /// batch whose subject was not checked within a minute or that another stream than the
    /// type's acknowledged.
    async fn stored(&mut self, i: usize, ack: &PublishAck) -> Result<(), Verdict> {
        let rows = self.rows;
        let event_type = rows[i].event_type();
        if let Some(hold) = self.stored_elsewhere.get(event_type) {
            // sent before its type was found moved in this batch: moved too
            return Err(Verdict::Held(hold.clone()));
        }
        let check_duplicate = ack.duplicate && self.verify_duplicates;
        let check_subject = !self.subjects_checked.contains(event_type)
            && self.to.streams.subject_check_due(event_type, &ack.stream);
        if !check_duplicate && !check_subject {
            return Ok(());
        }
        let stored = self.read_back(ack).await;
        let elsewhere = stored.as_ref().is_some_and(|m| m.subject != event_type);
        if ack.duplicate && elsewhere {
            // the id is the stream's from an earlier send that went elsewhere: sent again until
            // the duplicate window forgets it (then a mapping still there holds the type)
            return Err(Verdict::NotAttempted(Failure::UnverifiedDuplicate));
        }
        if check_subject {
            self.subjects_checked.insert(event_type.to_owned());
            let subject = stored.as_ref().map(|m| m.subject.as_str());
            let streams = self.to.streams;
            if let Some(hold) = streams.stored_under(event_type, &ack.stream, subject) {
                self.stored_elsewhere
                    .insert(event_type.to_owned(), hold.clone());
                return Err(Verdict::Held(hold));
            }
        }
        let id = rows[i].id.to_string();
        if check_duplicate && stored.and_then(|m| m.id).as_deref() != Some(id.as_str()) {
            return Err(Verdict::NotAttempted(Failure::UnverifiedDuplicate));
        }
        Ok(())
    }

    fn connected(&self) -> bool {
        self.to.jetstream.client().connection_state() == State::Connected
    }

    /// Whether the client connected again since the batch started.
    fn reconnected(&self) -> bool {
        connects(self.to.jetstream) != self.connects
    }

    /// Row `i` (and the rest of its chain) is done with, without success.
    fn settle(&mut self, i: usize, verdict: Verdict) {
        self.flights[i].leg = Leg::Ground;
        match &verdict {
            Verdict::Retry => unreachable!("a retry is not an end"),
            Verdict::Failed { failure: f, .. } | Verdict::NotAttempted(f) => {
                self.end_span(i, Some(f));
            }
            Verdict::Held(h) => self.end_span(i, Some(&h.reason)),
        }
        let settled = &mut self.settled;
        match verdict {
            Verdict::Retry => unreachable!("a retry is not an end"),
            Verdict::Failed { failure, at_cap } => {
                settled.failed.push((i, FailedAttempt { failure, at_cap }));
            }
            Verdict::NotAttempted(f) => settled.not_attempted.push((i, f)),
            Verdict::Held(h) => settled.held.push((i, h)),
        }
        self.settled.skipped += self.chains.rest_after(i);
    }

    fn acked(&mut self, i: usize, ack: PublishAck) {
        self.flights[i].leg = Leg::Ground;
        self.end_span(i, None);
        self.settled.acked.push(i);
        if ack.duplicate {
            self.settled.duplicates += 1;
        }
        if let Some(created) = self.rows[i].position.at.to_chrono() {
            let lag = (Utc::now() - created).to_std().unwrap_or_default();
            let event_type = self.rows[i].event_type().to_owned();
            metrics::histogram!(names::PUBLISH_LAG, "event_type" => event_type)
                .record(lag.as_secs_f64());
        }
        // the subject's next event goes out only now that this one is stored
        self.chains.acked(i);
    }

    /// What row `i` knows now, before any lookup.
    fn facts(&self, i: usize) -> Facts {
        let row = &self.rows[i];
        let flight = &self.flights[i];
        let time_left = self.deadline.saturating_duration_since(Instant::now());
        Facts {
            connected: self.connected(),
            reconnected: self.reconnected(),
            may_retry: flight.retries < ELECTION_RETRIES && time_left > ELECTION_RETRY_DELAY,
            last_attempt: row.attempts + 1 >= self.to.config.max_attempts,
            capture: self.captures.get(row.event_type()).cloned(),
            elected: None,
        }
    }

    /// What `failure` of row `i` comes to ([`classify`]), with the lookups it asks for made
    /// here: once per type (and per stream) and batch, a second at most each.
    async fn judge(&mut self, i: usize, failure: Failure) -> Verdict {
        let rows = self.rows;
        let event_type = rows[i].event_type();
        let mut facts = self.facts(i);
        let mut failure = failure;
        loop {
            if let Some((Capture::Stream { name }, _)) = &facts.capture {
                facts.elected = self.elections.get(name).copied();
            }
            match classify(failure, event_type, &facts) {
                Ok(verdict) => return verdict,
                Err(Ask { failure: f, lookup }) => {
                    failure = f;
                    match lookup {
                        Lookup::Capture { fresh } => {
                            facts.capture = Some(self.capture_of(event_type, fresh).await);
                        }
                        Lookup::Election { name } => {
                            let elected = self.elected(&name).await;
                            facts.elected = Some(elected);
                        }
                    }
                }
            }
        }
    }

    /// `failure` of row `i`: settled, or scheduled to be sent again.
    async fn failed<'f>(
        &mut self,
        i: usize,
        failure: Failure,
        delayed: &mut FuturesUnordered<futures::future::BoxFuture<'f, usize>>,
    ) {
        self.flights[i].leg = Leg::Ground;
        match self.judge(i, failure).await {
            Verdict::Retry => {
                self.flights[i].retries += 1;
                self.flights[i].leg = Leg::Waiting;
                delayed.push(sleep(ELECTION_RETRY_DELAY).map(move |()| i).boxed());
            }
            verdict => self.settle(i, verdict),
        }
    }

    /// The message of ready row `i`, or `None` when it is not sent: out of time (it and the
    /// rest of its chain are skipped), or held by the relay's own checks or because its type's
    /// stream is unsafe, or its type stored elsewhere ([`Streams::refusal`]).
    fn prepare(&mut self, i: usize) -> Option<(Vec<u8>, async_nats::HeaderMap)> {
        if self.expired {
            self.settled.skipped += 1 + self.chains.rest_after(i);
            return None;
        }
        let max_payload = self.to.jetstream.client().server_info().max_payload;
        let rows = self.rows;
        let streams = self.to.streams;
        let checked = check(&rows[i], self.to.config)
            .and_then(|event| match streams.refusal(&event.event_type) {
                Some(hold) => Err(hold),
                None => Ok(event),
            })
            .and_then(|event| {
                message(&rows[i], event, &self.sent_in(i))
                    .map_err(|e| Hold::new(HoldCause::Unreadable, e.to_string()))
            })
            .and_then(|(body, headers)| fits(body, headers, max_payload));
        match checked {
            Ok(m) => Some(m),
            Err(hold) => {
                self.settle(i, Verdict::Held(hold));
                None
            }
        }
    }

    /// The stream that captures `event_type`: from this batch's lookups, the relay's cache
    /// (unless `fresh`: a "no responders" asks the broker again), or looked up (a second at
    /// most), once per type and batch; with whether it was asked of the broker.
    async fn capture_of(&mut self, event_type: &str, fresh: bool) -> (Capture, bool) {
        if let Some(known) = self.captures.get(event_type) {
            if known.1 || !fresh {
                return known.clone();
            }
        }
        let streams = self.to.streams;
        let known = match streams.cached_stream(event_type) {
            Some(name) if !fresh => (Capture::Stream { name }, false),
            _ if fresh => (refresh(self.to, event_type).await, true),
            _ => (lookup(self.to, event_type).await, true),
        };
        self.captures.insert(event_type.to_owned(), known.clone());
        known
    }

    /// Whether stream `name` changed leader within two ack timeouts: asked once per batch.
    async fn elected(&mut self, name: &str) -> bool {
        if let Some(&elected) = self.elections.get(name) {
            return elected;
        }
        let window = 2 * self.to.config.ack_timeout;
        let elected = self
            .to
            .streams
            .elected_recently(self.to.jetstream, name, window)
            .await;
        self.elections.insert(name.to_owned(), elected);
        elected
    }

    /// The message `ack` points at, as its stream stored it (a second at most); `None` when it
    /// cannot be read (no answer, no permission, gone).
    async fn read_back(&self, ack: &PublishAck) -> Option<StoredMessage> {
        let read = async {
            let stream = self
                .to
                .jetstream
                .get_stream_no_info(&ack.stream)
                .await
                .ok()?;
            let message = stream.get_raw_message(ack.sequence).await.ok()?;
            let id = message
                .headers
                .get(async_nats::header::NATS_MESSAGE_ID)
                .map(|v| v.as_str().to_owned());
            Some(StoredMessage {
                subject: message.subject.to_string(),
                id,
            })
        };
        let stored = timeout(LOOKUP_TIMEOUT, read).await.ok().flatten();
        if stored.is_none() {
            tracing::debug!(stream = %ack.stream, sequence = ack.sequence, "outbox relay could not read back an acknowledged message");
        }
        stored
    }

    /// The deadline passed: rows awaiting their ack failed (or were not attempted, if their
    /// stream changed leader meanwhile), rows waiting for a retry were not attempted.
    async fn expire(&mut self) {
        // the streams, and then their elections, of every row awaiting its ack, looked up at
        // once: each lookup waits a second at most, so a silent broker holds the batch about
        // two seconds past its deadline, however many types and streams it has
        let flying: BTreeSet<&str> = (0..self.rows.len())
            .filter(|&i| self.flights[i].leg == Leg::Flying)
            .map(|i| self.rows[i].event_type())
            .filter(|t| !self.captures.contains_key(*t))
            .collect();
        let to = self.to;
        let found = futures::future::join_all(flying.into_iter().map(|t| async move {
            let known = match to.streams.cached_stream(t) {
                Some(name) => (Capture::Stream { name }, false),
                None => (lookup(to, t).await, true),
            };
            (t.to_owned(), known)
        }))
        .await;
        self.captures.extend(found);
        let streams: BTreeSet<String> = self
            .captures
            .values()
            .filter_map(|c| match c {
                (Capture::Stream { name }, _) if !self.elections.contains_key(name) => {
                    Some(name.clone())
                }
                _ => None,
            })
            .collect();
        let window = 2 * to.config.ack_timeout;
        let elected = futures::future::join_all(streams.into_iter().map(|name| async move {
            let elected = to
                .streams
                .elected_recently(to.jetstream, &name, window)
                .await;
            (name, elected)
        }))
        .await;
        self.elections.extend(elected);
        for i in 0..self.rows.len() {
            match self.flights[i].leg {
                Leg::Flying => {
                    let verdict = self.judge(i, Failure::Deadline).await;
                    self.settle(i, verdict);
                }
                Leg::Waiting => self.settle(i, Verdict::NotAttempted(Failure::Election)),
                Leg::Ground => {}
            }
        }
    }
}

/// Publishes `rows`: each subject's rows one after the other (the next sent on the previous
/// one's ack), all subjects at once, every send and ack before `ack_timeout` from now.
pub(super) async fn publish(rows: &[Row], to: Publisher<'_>) -> Settled {
    look_up_streams(rows, to).await;
    let mut run = Run::new(rows, to);
    // One timer for the whole batch, raced against every send and every wait.
    let expiry = sleep_until(run.deadline);
    tokio::pin!(expiry);
    let mut in_flight = FuturesUnordered::new();
    let mut delayed = FuturesUnordered::new();
    let mut done: Vec<(usize, Result<PublishAck, PublishError>)> = Vec::new();
    loop {
        for (i, result) in std::mem::take(&mut done) {
            run.answered(i, result, &mut delayed).await;
        }
        while let Some(i) = run.chains.pop_ready() {
            let Some((body, headers)) = run.prepare(i) else {
                continue;
            };
            if !run.connected() {
                run.failed(i, Failure::NotConnected, &mut delayed).await;
                continue;
            }
            let event_type = run.rows[i].event_type().to_owned();
            let send = to
                .jetstream
                .publish_with_headers(event_type, headers, body.into());
            tokio::pin!(send);
            // A send may wait for an ack slot of the context (`max_ack_inflight`), which only
            // the acks in flight free: keep collecting them meanwhile.
            let sent = loop {
                tokio::select! {
                    biased;
                    sent = &mut send => break Some(sent),
                    Some(d) = in_flight.next(), if !in_flight.is_empty() => done.push(d),
                    () = &mut expiry => break None,
                }
            };
            match sent {
                Some(Ok(ack)) => {
                    run.flights[i].leg = Leg::Flying;
                    in_flight.push(ack.into_future().map(move |r| (i, r)));
                }
                Some(Err(e)) => run.failed(i, Failure::Publish(e), &mut delayed).await,
                None => {
                    run.expired = true;
                    run.flights[i].leg = Leg::Flying; // sent or not, its fate is the deadline's
                }
            }
        }
        if !done.is_empty() {
            continue; // acks collected while sending may make more rows ready
        }
        if run.expired || (in_flight.is_empty() && delayed.is_empty()) {
            break;
        }
        tokio::select! {
            biased;
            Some(d) = in_flight.next(), if !in_flight.is_empty() => done.push(d),
            Some(i) = delayed.next(), if !delayed.is_empty() => {
                run.flights[i].leg = Leg::Ground;
                run.chains.again(i);
            }
            () = &mut expiry => run.expired = true,
        }
    }
    run.expire().await;
    run.settled
}

/// Looks up, at once, the streams of the types of `rows` that the relay has not looked up
/// lately, before anything is sent: a type's stream is found, and its configuration read
/// ([`Streams::refusal`] then refuses an unsafe one), before the type's first publish, not
/// after. Each lookup waits [`LOOKUP_TIMEOUT`] at most, and a type looked up within five
/// minutes is not asked again, so this costs a batch nothing in the steady state.
async fn look_up_streams(rows: &[Row], to: Publisher<'_>) {
    let stale: BTreeSet<&str> = rows
        .iter()
        .map(Row::event_type)
        .filter(|t| crate::naming::check_event_type(t).is_ok() && to.streams.is_stale(t))
        .collect();
    futures::future::join_all(stale.into_iter().map(|t| lookup(to, t))).await;
}

/// Looks up the stream that captures `event_type`, waiting [`LOOKUP_TIMEOUT`] at most.
async fn lookup(to: Publisher<'_>, event_type: &str) -> Capture {
    let horizon = to.config.retry_horizon();
    timeout(
        LOOKUP_TIMEOUT,
        to.streams.capture(to.jetstream, event_type, horizon),
    )
    .await
    .unwrap_or(Capture::Unknown)
}

/// Asks JetStream which stream captures `event_type` now, whatever the relay's cache says,
/// waiting [`LOOKUP_TIMEOUT`] at most.
async fn refresh(to: Publisher<'_>, event_type: &str) -> Capture {
    let horizon = to.config.retry_horizon();
    timeout(
        LOOKUP_TIMEOUT,
        to.streams.refresh(to.jetstream, event_type, horizon),
    )
    .await
    .unwrap_or(Capture::Unknown)
}

/// How often the client has connected (reconnects included).
pub(super) fn connects(jetstream: &jetstream::Context) -> u64 {
    let stats = jetstream.client().statistics();
    stats.connects.load(std::sync::atomic::Ordering::Relaxed)
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
    fn a_row_sent_again_keeps_its_chain_waiting() {
        let mut c = chains(&["a", "a", "b"]);
        assert_eq!(drain_ready(&mut c), [0, 2]);
        c.again(0);
        assert_eq!(
            drain_ready(&mut c),
            [0],
            "only the row itself, not its successor"
        );
        c.acked(0);
        assert_eq!(drain_ready(&mut c), [1]);
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
