//! What the relay knows of the streams behind its event types: whether a stream captures a
//! type (so that "no responders" tells an election from a missing stream) and whether that
//! stream's duplicate window covers the relay's retry horizon, checked when a type is first
//! published and again every few minutes (docs/relay.md, *Streams*).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::context::GetStreamByNameErrorKind;
use tokio::time::Instant;

/// How long a lookup that found the type's stream is trusted (its duplicate window is checked
/// again after it).
const FRESH_FOR: Duration = Duration::from_secs(300);
/// How long "no stream captures it" is trusted: rows of the type are held without another try
/// meanwhile, so a stream created for it is noticed within seconds.
const NOTHING_FRESH_FOR: Duration = Duration::from_secs(10);
/// How long a failed lookup (the API did not answer) is remembered: the next publish of the
/// type asks again.
const RETRY_LOOKUP_AFTER: Duration = Duration::from_secs(5);

/// The stream that captures an event type, as last looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Capture {
    /// Stream `name` captures it.
    Stream { name: String },
    /// No stream captures it: every publish would get "no responders".
    Nothing,
    /// The lookup failed (JetStream did not answer): unknown.
    Unknown,
}

#[derive(Debug, Clone)]
struct Entry {
    capture: Capture,
    until: Instant,
}

/// The most event types the relay remembers having published (for the periodic check).
const SEEN_MAX: usize = 10_000;

/// The relay's cache of stream lookups, by event type, and the types it published.
#[derive(Debug, Default)]
pub(super) struct Streams {
    by_type: Mutex<HashMap<String, Entry>>,
    seen: Mutex<std::collections::BTreeSet<String>>,
}

impl Streams {
    /// Remembers that `event_types` were published.
    pub(super) fn saw<'a>(&self, event_types: impl IntoIterator<Item = &'a str>) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        for t in event_types {
            if seen.len() < SEEN_MAX && !seen.contains(t) {
                seen.insert(t.to_owned());
            }
        }
    }

    /// The event types published so far.
    pub(super) fn seen(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.iter().cloned().collect()
    }

    fn fresh(&self, event_type: &str, now: Instant) -> Option<Capture> {
        let map = self.by_type.lock().unwrap_or_else(|p| p.into_inner());
        map.get(event_type)
            .filter(|e| e.until > now)
            .map(|e| e.capture.clone())
    }

    /// Forgets every "no stream captures it": held rows were released, perhaps because the
    /// stream now exists.
    pub(super) fn forget_uncaptured(&self) {
        let mut map = self.by_type.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, e| e.capture != Capture::Nothing);
    }

    /// Whether a lookup of `event_type` is due (never made, or stale).
    pub(super) fn is_stale(&self, event_type: &str) -> bool {
        self.fresh(event_type, Instant::now()).is_none()
    }

    /// The stream that captures `event_type`, from the cache or asked of JetStream; a stream
    /// seen for the first time (or again after [`FRESH_FOR`]) has its duplicate window checked
    /// against `horizon`, with a warning when it is shorter.
    pub(super) async fn capture(
        &self,
        jetstream: &jetstream::Context,
        event_type: &str,
        horizon: Duration,
    ) -> Capture {
        let now = Instant::now();
        if let Some(c) = self.fresh(event_type, now) {
            return c;
        }
        let (capture, fresh_for) = match jetstream.stream_by_subject(event_type).await {
            Ok(name) => {
                check_window(jetstream, &name, horizon).await;
                (Capture::Stream { name }, FRESH_FOR)
            }
            Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => {
                (Capture::Nothing, NOTHING_FRESH_FOR)
            }
            Err(e) => {
                tracing::debug!(event_type, error = %e, "outbox relay could not look up the stream of an event type");
                (Capture::Unknown, RETRY_LOOKUP_AFTER)
            }
        };
        let entry = Entry {
            capture: capture.clone(),
            until: now + fresh_for,
        };
        self.by_type
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(event_type.to_owned(), entry);
        capture
    }
}

/// Warns when stream `name` remembers message ids for less than `horizon`: a row republished
/// after that (its ack was lost, then it backed off) would be stored twice.
async fn check_window(jetstream: &jetstream::Context, name: &str, horizon: Duration) {
    let info = match jetstream.get_stream(name).await {
        Ok(mut stream) => stream.info().await.map(|i| i.config.duplicate_window),
        Err(e) => {
            tracing::debug!(stream = name, error = %e, "outbox relay could not read a stream's configuration");
            return;
        }
    };
    match info {
        Ok(window) if window < horizon => {
            metrics::gauge!(crate::metrics::SHORT_DUPLICATE_WINDOW, "stream" => name.to_owned())
                .set(1.0);
            tracing::warn!(
                stream = name,
                duplicate_window = ?window,
                retry_horizon = ?horizon,
                "stream `{name}` remembers message ids for {window:?}, less than the relay's retry horizon of {horizon:?}: an event republished after a lost ack may be stored twice (consumers still dedupe it); raise the stream's duplicate_window to at least {horizon:?} (`outbox stream ensure --duplicate-window {}`), or lower the relay's backoff_max",
                horizon.as_secs() + 1
            );
        }
        Ok(_) => {
            metrics::gauge!(crate::metrics::SHORT_DUPLICATE_WINDOW, "stream" => name.to_owned())
                .set(0.0);
        }
        Err(e) => {
            tracing::debug!(stream = name, error = %e, "outbox relay could not read a stream's configuration")
        }
    }
}
