//! Reading the ids of a stream's messages stored in a span of time, headers only.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull::OrderedConfig, consumer::DeliverPolicy};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use uuid::Uuid;

use crate::error::{Error, Result};

/// How long a read may wait for the stream's next message before it gives up.
const PATIENCE: Duration = Duration::from_secs(30);

/// The stream being verified: its subjects, duplicate window and first message.
pub(super) struct StreamReader {
    stream: jetstream::stream::Stream,
    name: String,
    subjects: Vec<String>,
    duplicate_window: Duration,
    first: Option<DateTime<Utc>>,
    messages_read: u64,
}

impl StreamReader {
    /// Opens stream `name`; an absent one is an [`Error::Stream`].
    pub(super) async fn open(js: &jetstream::Context, name: &str) -> Result<Self> {
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

    /// Messages read so far.
    pub(super) fn messages_read(&self) -> u64 {
        self.messages_read
    }

    /// Whether the stream captures subject `event_type`.
    pub(super) fn captures(&self, event_type: &str) -> bool {
        self.subjects.iter().any(|p| subject_matches(p, event_type))
    }

    /// Calls `seen` with the `Nats-Msg-Id` of every message stored from `start` until the first
    /// one stored after `end` (or the stream's last message), in stream order. Ids that are not
    /// UUIDs (another writer's messages) are skipped.
    pub(super) async fn read(
        &mut self,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
        mut seen: impl FnMut(Uuid),
    ) -> Result<()> {
        let name = self.name.clone();
        let nats = |what: &str, e: async_nats::Error| {
            Error::nats(format!("{what} stream `{name}` from {start}"), e)
        };
        let info = self
            .stream
            .info()
            .await
            .map_err(|e| nats("read the state of", e.into()))?;
        if info.state.messages == 0 || to_chrono(info.state.last_timestamp) < start {
            return Ok(()); // nothing stored at or after `start`: a consumer would wait
        }
        let start_time = to_nats(start).map_err(|e| nats("convert the start time to read", e))?;
        let end_time = to_nats(end).map_err(|e| nats("convert the end time to read", e))?;
        let consumer = self
            .stream
            .create_consumer(OrderedConfig {
                deliver_policy: DeliverPolicy::ByStartTime { start_time },
                headers_only: true,
                ..Default::default()
            })
            .await
            .map_err(|e| nats("create a consumer on", e.into()))?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| nats("read", e.into()))?;
        loop {
            let message = match tokio::time::timeout(PATIENCE, messages.next()).await {
                Ok(Some(Ok(message))) => message,
                Ok(Some(Err(e))) => return Err(nats("read", e.into())),
                Ok(None) => return Err(nats("read", "the consumer ended".into())),
                Err(_) => {
                    return Err(nats(
                        "read",
                        format!("no message within {PATIENCE:?} although more were pending").into(),
                    ))
                }
            };
            let info = message.info().map_err(|e| nats("read", e))?;
            if info.published > end_time {
                return Ok(());
            }
            let pending = info.pending;
            self.messages_read += 1;
            let id = message
                .headers
                .as_ref()
                .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                .and_then(|v| Uuid::parse_str(v.as_str()).ok());
            if let Some(id) = id {
                seen(id);
            }
            if pending == 0 {
                return Ok(());
            }
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
fn to_chrono(t: async_nats::datetime::DateTime) -> DateTime<Utc> {
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
