//! Reading the ids of a stream's messages stored in a span of time, headers only.

use std::collections::VecDeque;
use std::time::Duration;

use async_nats::jetstream::consumer::pull::{Ordered, OrderedConfig};
use async_nats::jetstream::{self, consumer::DeliverPolicy};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use uuid::Uuid;

use crate::error::{Error, Result};

/// How long a read may wait for the stream's next message before it gives up.
const PATIENCE: Duration = Duration::from_secs(30);

/// The stream being verified: its subjects, duplicate window and first message, and a scan
/// that moves forward through it, keeping the ids of the messages it read most recently, so
/// that a window overlapping the last one does not read the overlap again.
pub(super) struct StreamReader {
    stream: jetstream::stream::Stream,
    name: String,
    subjects: Vec<String>,
    duplicate_window: Duration,
    first: Option<DateTime<Utc>>,
    messages_read: u64,
    scan: Option<Scan>,
    /// Messages read, oldest first, at most `capacity`.
    recent: VecDeque<(NatsTime, Option<Uuid>)>,
    capacity: usize,
}

type NatsTime = async_nats::datetime::DateTime;

/// An ordered consumer reading forward from `start`.
struct Scan {
    messages: Ordered,
    /// Every message stored at or after `start` that was read is in `recent`, except those
    /// stored at or before `dropped` (left out of `recent` for its capacity).
    start: NatsTime,
    dropped: Option<NatsTime>,
    /// The first message read past the last window's end, not handed out yet.
    peeked: Option<(NatsTime, Option<Uuid>)>,
    /// Nothing was pending after the last message read.
    at_end: bool,
}

impl Scan {
    /// Whether every message stored from `start` on that the scan has read is still known.
    fn covers(&self, start: NatsTime) -> bool {
        start >= self.start && self.dropped.is_none_or(|d| start > d)
    }
}

impl StreamReader {
    /// Opens stream `name`; an absent one is an [`Error::Stream`]. The reader keeps the ids of
    /// up to `capacity` messages it read last.
    pub(super) async fn open(js: &jetstream::Context, name: &str, capacity: usize) -> Result<Self> {
        let mut stream = js.get_stream(name).await.map_err(|e| Error::Stream {
            stream: name.to_owned(),
            reason: format!(
                "cannot open it to verify against ({e}); check the name (`--stream`), or \
                 create it with `outbox stream ensure`"
            ),
        })?;
        let info = stream
            .info()
            .await
            .map_err(|e| Error::nats(format!("read the state of stream `{name}`"), e))?;
        let first = match info.state.messages {
            0 => None,
            _ => Some(to_chrono(info.state.first_timestamp)),
        };
        Ok(Self {
            subjects: info.config.subjects.clone(),
            duplicate_window: info.config.duplicate_window,
            stream,
            name: name.to_owned(),
            first,
            messages_read: 0,
            scan: None,
            recent: VecDeque::new(),
            capacity: capacity.max(1),
        })
    }

    /// When the stream's first message was stored, as the run started (`None`: empty).
    pub(super) fn first_time(&self) -> Option<DateTime<Utc>> {
        self.first
    }

    /// How long the stream remembers a message id.
    pub(super) fn duplicate_window(&self) -> Duration {
        self.duplicate_window
    }

    /// Messages read so far (a message read twice counts twice).
    pub(super) fn messages_read(&self) -> u64 {
        self.messages_read
    }

    /// Whether the stream captures subject `event_type`.
    pub(super) fn captures(&self, event_type: &str) -> bool {
        self.subjects.iter().any(|p| subject_matches(p, event_type))
    }

    fn error(&self, what: &str, e: impl Into<async_nats::Error>) -> Error {
        Error::nats(format!("{what} stream `{}`", self.name), e.into())
    }

    /// Calls `seen` with the `Nats-Msg-Id` of every message stored from `start` until the first
    /// one stored after `end` (or the stream's last message), in stream order; ids that are not
    /// UUIDs (another writer's messages) are skipped. Windows are expected to move forward:
    /// what the last windows read from `start` on is not read again, when it is still known.
    pub(super) async fn read(
        &mut self,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
        mut seen: impl FnMut(Uuid),
    ) -> Result<()> {
        let start = to_nats(start).map_err(|e| self.error("convert a start time to read", e))?;
        let end = to_nats(end).map_err(|e| self.error("convert an end time to read", e))?;
        while let Some(&(t, _)) = self.recent.front().filter(|(t, _)| *t < start) {
            self.recent.pop_front();
            self.forget(t);
        }
        if !self.scan.as_ref().is_some_and(|s| s.covers(start)) {
            self.restart(start).await?;
        }
        for (_, id) in self.recent.iter().filter(|(t, _)| *t <= end) {
            id.map(&mut seen);
        }
        if let Some((t, id)) = self.scan.as_mut().and_then(|s| s.peeked.take()) {
            if t > end {
                self.scan_mut().peeked = Some((t, id));
                return Ok(());
            }
            self.keep(t, id, &mut seen);
        }
        self.advance(end, &mut seen).await
    }

    fn scan_mut(&mut self) -> &mut Scan {
        self.scan.as_mut().expect("a scan is open")
    }

    /// A message stored at `t` is no longer in `recent`.
    fn forget(&mut self, t: NatsTime) {
        if let Some(scan) = self.scan.as_mut() {
            scan.dropped = Some(scan.dropped.map_or(t, |d| d.max(t)));
        }
    }

    /// Hands out a message in the window and remembers it.
    fn keep(&mut self, t: NatsTime, id: Option<Uuid>, seen: &mut impl FnMut(Uuid)) {
        if self.recent.len() >= self.capacity {
            if let Some((oldest, _)) = self.recent.pop_front() {
                self.forget(oldest);
            }
        }
        self.recent.push_back((t, id));
        id.map(seen);
    }

    /// A new consumer from `start`, and nothing remembered.
    async fn restart(&mut self, start: NatsTime) -> Result<()> {
        tracing::debug!(stream = %self.name, %start, "verify: reading the stream from a new start");
        self.scan = None;
        self.recent.clear();
        let consumer = self
            .stream
            .create_consumer(OrderedConfig {
                deliver_policy: DeliverPolicy::ByStartTime { start_time: start },
                headers_only: true,
                ..Default::default()
            })
            .await
            .map_err(|e| self.error("create a consumer on", e))?;
        // what is stored from `start` on, counted when the consumer was created
        let at_end = consumer.cached_info().num_pending == 0;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| self.error("read", e))?;
        self.scan = Some(Scan {
            messages,
            start,
            dropped: None,
            peeked: None,
            at_end,
        });
        Ok(())
    }

    /// Reads on until the first message stored after `end`, or the end of the stream.
    async fn advance(&mut self, end: NatsTime, seen: &mut impl FnMut(Uuid)) -> Result<()> {
        loop {
            // Every row being verified was marked before the verification began, so its
            // message was stored before any consumer of this reader was created: once nothing
            // is pending, nothing more can be relevant.
            if self.scan_mut().at_end {
                return Ok(());
            }
            let next = tokio::time::timeout(PATIENCE, self.scan_mut().messages.next()).await;
            let message = match next {
                Ok(Some(Ok(message))) => message,
                Ok(Some(Err(e))) => return Err(self.error("read", e)),
                Ok(None) => return Err(self.error("read", "the consumer ended")),
                Err(_) => {
                    let e = format!("no message within {PATIENCE:?} although more were pending");
                    return Err(self.error("read", e));
                }
            };
            let info = message.info().map_err(|e| self.error("read", e))?;
            let (t, pending) = (info.published, info.pending);
            let id = message
                .headers
                .as_ref()
                .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                .and_then(|v| Uuid::parse_str(v.as_str()).ok());
            self.messages_read += 1;
            let scan = self.scan_mut();
            scan.at_end = pending == 0;
            if t > end {
                scan.peeked = Some((t, id));
                return Ok(());
            }
            self.keep(t, id, seen);
        }
    }
}

/// Whether NATS subject pattern `pattern` (`*` one token, `>` the rest) matches `subject`.
pub(super) fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut subject = subject.split('.');
    for token in pattern.split('.') {
        match (token, subject.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (t, Some(s)) if t == s => {}
            _ => return false,
        }
    }
    subject.next().is_none()
}

/// A chrono time as async-nats's (whichever time crate it is built with).
fn to_nats(
    t: DateTime<Utc>,
) -> std::result::Result<async_nats::datetime::DateTime, async_nats::Error> {
    let nanos = t.timestamp_nanos_opt().unwrap_or(if t.timestamp() < 0 {
        i64::MIN
    } else {
        i64::MAX
    });
    async_nats::datetime::from_nanos(i128::from(nanos))
}

/// An async-nats time as chrono's. async-nats's time type depends on a feature of that crate
/// (chrono or time) that any crate of the build may switch on, so this uses only what both
/// offer, `from_nanos` and ordering: a binary search over nanoseconds, exact, for a handful of
/// values per run.
fn to_chrono(t: NatsTime) -> DateTime<Utc> {
    let (mut lo, mut hi) = (0i64, i64::MAX); // 1970 to 2262
    let at = |n: i64| async_nats::datetime::from_nanos(i128::from(n)).ok();
    if at(lo).is_none_or(|lo| t <= lo) {
        return DateTime::<Utc>::UNIX_EPOCH;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match at(mid) {
            Some(m) if m < t => lo = mid,
            _ => hi = mid,
        }
    }
    DateTime::from_timestamp_nanos(hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_patterns_match_as_nats_does() {
        assert!(subject_matches("billing.>", "billing.invoice.paid"));
        assert!(!subject_matches("billing.>", "billing"));
        assert!(subject_matches("billing.*.paid", "billing.invoice.paid"));
        assert!(!subject_matches("billing.*", "billing.invoice.paid"));
        assert!(subject_matches("a.b", "a.b"));
        assert!(!subject_matches("a.b", "a.b.c"));
        assert!(!subject_matches("a.b.c", "a.b"));
        assert!(subject_matches(">", "anything.at.all"));
    }

    #[test]
    fn times_convert_both_ways_exactly() {
        let t = DateTime::from_timestamp_nanos(1_796_000_000_123_456_789);
        assert_eq!(to_chrono(to_nats(t).expect("in range")), t);
        assert_eq!(
            to_chrono(to_nats(DateTime::<Utc>::UNIX_EPOCH).expect("in range")),
            DateTime::<Utc>::UNIX_EPOCH
        );
    }
}
