//! What the relay knows of the streams behind its event types: whether a stream captures a
//! type (so that "no responders" tells an election from a missing stream), whether that
//! stream keeps what it acknowledges and its duplicate window covers the relay's retry horizon
//! (checked when a type is first published and again every few minutes), and who leads it (so
//! that an ack lost to a leader change costs no attempt) (docs/relay.md, *Streams*).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::context::GetStreamByNameErrorKind;
use tokio::time::Instant;

use super::elections::Elections;

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

/// A stream's leadership as the relay last read it: the leader's server name and when it
/// became leader (by the server's clock, when the server says), or `None` without a leader.
type Leadership = Option<(String, Option<String>)>;

/// What the relay saw of a stream's leadership: the last reading, and when it last changed
/// (or could not be read).
#[derive(Debug, Clone)]
struct Watch {
    leader: Leadership,
    changed: Option<Instant>,
}

/// At the relay's first look at a stream's leadership there is nothing to compare with: a
/// leader that became leader this recently (by the server's clock against this host's) counts
/// as newly elected.
const RECENT_LEADER: Duration = Duration::from_secs(30);

/// The relay's cache of stream lookups, by event type, the types it published, and the
/// leadership of the streams behind them.
#[derive(Debug, Default)]
pub(super) struct Streams {
    by_type: Mutex<HashMap<String, Entry>>,
    seen: Mutex<std::collections::BTreeSet<String>>,
    leaders: Mutex<HashMap<String, Watch>>,
    /// Streams already warned about (one replica, or settings that lose messages).
    warned: Mutex<std::collections::BTreeSet<String>>,
    /// The elections JetStream announced.
    elections: Elections,
}

impl Streams {
    /// A cache that also hears the elections JetStream announces (see [`Elections`]).
    pub(super) fn new(elections: Elections) -> Streams {
        Streams {
            elections,
            ..Streams::default()
        }
    }

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

    /// The stream that captures `event_type`, if the cache knows it.
    pub(super) fn cached_stream(&self, event_type: &str) -> Option<String> {
        match self.fresh(event_type, Instant::now()) {
            Some(Capture::Stream { name }) => Some(name),
            _ => None,
        }
    }

    /// Whether stream `name` changed leader, or could not say who leads it, within `window`
    /// as this relay saw it: an ack that did not come in that time was lost to an election,
    /// not refused. Reads the stream's info (waiting a second at most); at the first look, a
    /// leader elected within [`RECENT_LEADER`] (or one that does not say since when) counts as
    /// new. An election JetStream announced within `window` counts too, even when the same
    /// server leads again (a server before 2.12 does not say since when it leads).
    pub(super) async fn elected_recently(
        &self,
        jetstream: &jetstream::Context,
        name: &str,
        window: Duration,
    ) -> bool {
        let read = async {
            let mut stream = jetstream.get_stream(name).await.ok()?;
            let info = stream.info().await.ok()?;
            Some(info.cluster.clone())
        };
        let current = match tokio::time::timeout(Duration::from_secs(1), read).await {
            Ok(Some(None)) => return false, // a single server: no election to wait out
            Ok(Some(Some(cluster))) => {
                let recent = cluster
                    .leader_since
                    .and_then(|t| async_nats::datetime::add_std_duration(t, RECENT_LEADER).ok())
                    .map(|recent_until| recent_until > async_nats::datetime::now())
                    .unwrap_or(true);
                (leadership(&cluster), recent)
            }
            // the stream cannot answer: it is electing (or the meta leader is)
            _ => (None, true),
        };
        let changed = self.note(name, current.0, current.1);
        changed.is_some_and(|at| at.elapsed() < window) || self.elections.within(name, window)
    }

    /// Remembers stream `name`'s `leadership` (`None`: no leader, or none could be read);
    /// returns when it last changed. At the first look it counts as changed now if `recent`.
    fn note(&self, name: &str, leadership: Leadership, recent: bool) -> Option<Instant> {
        let now = Instant::now();
        let mut leaders = self.leaders.lock().unwrap_or_else(|p| p.into_inner());
        let watch = leaders.entry(name.to_owned()).or_insert_with(|| Watch {
            leader: leadership.clone(),
            changed: recent.then_some(now),
        });
        if watch.leader != leadership || leadership.is_none() {
            watch.leader = leadership;
            watch.changed = Some(now);
        }
        watch.changed
    }

    /// Remembers stream `name`'s leadership from its info, as read by a check.
    fn note_leader(&self, name: &str, cluster: Option<&jetstream::stream::ClusterInfo>) {
        if let Some(cluster) = cluster {
            self.note(name, leadership(cluster), false);
        }
    }

    /// Whether stream `name` was not warned about yet (and is now).
    fn first_warning(&self, name: &str) -> bool {
        self.warned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_owned())
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
                self.check_stream(jetstream, &name, horizon).await;
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

fn leadership(cluster: &jetstream::stream::ClusterInfo) -> Leadership {
    let since = cluster.leader_since.map(|t| t.to_string());
    cluster.leader.clone().map(|l| (l, since))
}

impl Streams {
    /// Reads stream `name`'s configuration and leadership. Warns when it remembers message ids
    /// for less than `horizon` (a row republished after that, its ack lost, would be stored
    /// twice), when it has settings that lose acknowledged messages (the
    /// [`UNSAFE_STREAM`](crate::metrics::UNSAFE_STREAM) gauge, an error each time), and once when
    /// it has a single replica.
    async fn check_stream(&self, jetstream: &jetstream::Context, name: &str, horizon: Duration) {
        let read = async {
            let mut stream = jetstream
                .get_stream(name)
                .await
                .map_err(|e| e.to_string())?;
            stream.info().await.cloned().map_err(|e| e.to_string())
        };
        let info = match read.await {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!(stream = name, error = %e, "outbox relay could not read a stream's configuration");
                return;
            }
        };
        self.note_leader(name, info.cluster.as_ref());
        let window = info.config.duplicate_window;
        let short = window < horizon;
        metrics::gauge!(crate::metrics::SHORT_DUPLICATE_WINDOW, "stream" => name.to_owned())
            .set(if short { 1.0 } else { 0.0 });
        if short {
            tracing::warn!(
                stream = name,
                duplicate_window = ?window,
                retry_horizon = ?horizon,
                "stream `{name}` remembers message ids for {window:?}, less than the relay's retry horizon of {horizon:?}: an event republished after a lost ack may be stored twice (consumers still dedupe it); raise the stream's duplicate_window to at least {horizon:?} (`outbox stream ensure --duplicate-window {}`), or lower the relay's backoff_max",
                horizon.as_secs() + 1
            );
        }
        let unsafe_settings = crate::stream::unsafe_settings(&info.config);
        metrics::gauge!(crate::metrics::UNSAFE_STREAM, "stream" => name.to_owned())
            .set(if unsafe_settings.is_empty() { 0.0 } else { 1.0 });
        if !unsafe_settings.is_empty() {
            tracing::error!(
                stream = name,
                "stream `{name}` can lose messages it acknowledged, and the outbox marks a row published on that ack: {}",
                unsafe_settings.join("; ")
            );
        }
        if let Some(warning) = crate::stream::durability_warning(&info.config) {
            if self.first_warning(name) {
                tracing::warn!(stream = name, "{warning}");
            }
        }
    }
}
