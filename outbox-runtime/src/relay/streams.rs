//! What the relay knows of the streams behind its event types: whether a stream captures a
//! type (so that "no responders" tells an election from a missing stream), whether that
//! stream keeps what it acknowledges where consumers look for it and its duplicate window
//! covers the relay's retry horizon (checked before a type is first published, and every
//! stream again every 10 s), whether the server stores the type's messages under the type (an
//! ack's stored message read back, once a minute per type), and who leads it (so that an ack
//! lost to a leader change costs no attempt) (docs/relay.md, *Streams*).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::context::GetStreamByNameErrorKind;
use tokio::time::Instant;

use super::elections::Elections;
use super::held::{mapped, unsafe_stream, Hold};

/// How long a lookup that found the type's stream is trusted (its duplicate window is checked
/// again after it).
const FRESH_FOR: Duration = Duration::from_secs(300);
/// How long "no stream captures it" is trusted: rows of the type are held without another try
/// meanwhile, so a stream created for it is noticed within seconds.
const NOTHING_FRESH_FOR: Duration = Duration::from_secs(10);
/// How long a failed lookup (the API did not answer) is remembered: the next publish of the
/// type asks again.
const RETRY_LOOKUP_AFTER: Duration = Duration::from_secs(5);
/// How often the subject a type's messages are stored under is read back from an ack (or
/// sooner, when an ack names another stream than the one that captures the type).
const SUBJECT_CHECK_EVERY: Duration = Duration::from_secs(60);
/// How long a type found stored under another subject stays so without a hold of that cause
/// left in the table: an operator's release (`outbox unblock`) makes the relay try it again.
const MAPPED_AT_LEAST: Duration = Duration::from_secs(60);

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

/// What the last reading of a stream's configuration said, to log a change once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Reading {
    /// [`unsafe_settings`](crate::unsafe_settings): empty when it is safe.
    unsafe_settings: Vec<String>,
    /// Its duplicate window is shorter than the relay's retry horizon.
    short_window: bool,
}

/// The subject the server stores a type's messages under, as an ack's message read back said.
#[derive(Debug, Clone)]
enum Stored {
    /// Under the type itself, as last checked then (or the check could not be made then).
    AsPublished { checked: Instant },
    /// Under `subject`, in `stream`: an account subject mapping (or a transform the relay had
    /// not read yet) moved it.
    Elsewhere {
        stream: String,
        subject: String,
        since: Instant,
    },
}

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
    /// Streams already warned about (one replica).
    warned: Mutex<std::collections::BTreeSet<String>>,
    /// Per stream, its last reading, and when it was made.
    readings: Mutex<HashMap<String, (Reading, Instant)>>,
    /// Per event type, the subject its messages are stored under.
    stored: Mutex<HashMap<String, Stored>>,
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
    /// seen for the first time (or again after [`FRESH_FOR`]) has its configuration checked
    /// ([`check_stream`](Self::check_stream)).
    pub(super) async fn capture(
        &self,
        jetstream: &jetstream::Context,
        event_type: &str,
        horizon: Duration,
    ) -> Capture {
        if let Some(c) = self.fresh(event_type, Instant::now()) {
            return c;
        }
        self.refresh(jetstream, event_type, horizon).await
    }

    /// The stream that captures `event_type`, asked of JetStream now whatever the cache says
    /// (a "no responders" may mean the stream is gone), and its configuration read unless it
    /// was read within [`FRESH_FOR`] (the relay's housekeeping reads it every 10 s).
    pub(super) async fn refresh(
        &self,
        jetstream: &jetstream::Context,
        event_type: &str,
        horizon: Duration,
    ) -> Capture {
        let now = Instant::now();
        let (capture, fresh_for) = match jetstream.stream_by_subject(event_type).await {
            Ok(name) => {
                if self.read_within(&name, FRESH_FOR).is_none() {
                    self.check_stream(jetstream, &name, horizon).await;
                }
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
    /// Reads stream `name`'s configuration and leadership, and remembers what it says for the
    /// types it captures ([`refusal`](Self::refusal)). Logs a change: a duplicate window
    /// shorter than `horizon` (a row republished after it, its ack lost, would be stored twice)
    /// at warn, settings that lose acknowledged messages or store them elsewhere (the
    /// [`UNSAFE_STREAM`](crate::metrics::UNSAFE_STREAM) gauge) at error, and their end; and
    /// once a single replica.
    async fn check_stream(&self, jetstream: &jetstream::Context, name: &str, horizon: Duration) {
        let read = async {
            let mut stream = jetstream.get_stream(name).await.map_err(|e| {
                if crate::stream::is_not_found(&e) {
                    None
                } else {
                    Some(e.to_string())
                }
            })?;
            stream
                .info()
                .await
                .cloned()
                .map_err(|e| Some(e.to_string()))
        };
        let info = match tokio::time::timeout(Duration::from_secs(1), read).await {
            Ok(Ok(info)) => info,
            Ok(Err(None)) => {
                // deleted: the types it captured are looked up again when they are published
                self.readings
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(name);
                return;
            }
            Ok(Err(Some(e))) => {
                tracing::debug!(stream = name, error = %e, "outbox relay could not read a stream's configuration");
                return;
            }
            Err(_) => {
                tracing::debug!(
                    stream = name,
                    "outbox relay could not read a stream's configuration: no answer within 1 s"
                );
                return;
            }
        };
        self.note_leader(name, info.cluster.as_ref());
        let window = info.config.duplicate_window;
        let reading = Reading {
            unsafe_settings: crate::stream::unsafe_settings(&info.config),
            short_window: window < horizon,
        };
        metrics::gauge!(crate::metrics::SHORT_DUPLICATE_WINDOW, "stream" => name.to_owned())
            .set(if reading.short_window { 1.0 } else { 0.0 });
        metrics::gauge!(crate::metrics::UNSAFE_STREAM, "stream" => name.to_owned()).set(
            if reading.unsafe_settings.is_empty() {
                0.0
            } else {
                1.0
            },
        );
        let before = self
            .readings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_owned(), (reading.clone(), Instant::now()));
        let was = before.as_ref().map(|(r, _)| r);
        if reading.short_window && was.is_none_or(|r| !r.short_window) {
            tracing::warn!(
                stream = name,
                duplicate_window = ?window,
                retry_horizon = ?horizon,
                "stream `{name}` remembers message ids for {window:?}, less than the relay's retry horizon of {horizon:?}: an event republished after a lost ack may be stored twice (consumers still dedupe it); raise the stream's duplicate_window to at least {horizon:?} (`outbox stream ensure --duplicate-window {}`), or lower the relay's backoff_max",
                horizon.as_secs() + 1
            );
        }
        let settings = &reading.unsafe_settings;
        if !settings.is_empty() && was.is_none_or(|r| &r.unsafe_settings != settings) {
            tracing::error!(
                stream = name,
                "stream `{name}` cannot be trusted with the outbox's events, which count as published once it acknowledges them: {}; the relay sends it none, and holds the rows of the types it captures until it is fixed",
                settings.join("; ")
            );
        } else if settings.is_empty() && was.is_some_and(|r| !r.unsafe_settings.is_empty()) {
            tracing::info!(
                stream = name,
                "stream `{name}` is safe again: the relay publishes into it, and releases the rows it held for it"
            );
        }
        if let Some(warning) = crate::stream::durability_warning(&info.config) {
            if self.first_warning(name) {
                tracing::warn!(stream = name, "{warning}");
            }
        }
    }

    /// Reads the configuration of every stream read before ([`check_stream`]
    /// (Self::check_stream)), a second at most each: a stream changed while the relay runs is
    /// seen at the next call (the relay's housekeeping, every 10 s).
    pub(super) async fn recheck(&self, jetstream: &jetstream::Context, horizon: Duration) {
        let names: Vec<String> = {
            let readings = self.readings.lock().unwrap_or_else(|p| p.into_inner());
            readings.keys().cloned().collect()
        };
        for name in names {
            self.check_stream(jetstream, &name, horizon).await;
        }
    }

    /// Why the relay must not send a message of `event_type` now, if it must not: the type is
    /// stored under another subject, or the stream that last captured it has
    /// [`unsafe_settings`](crate::unsafe_settings) as last read.
    pub(super) fn refusal(&self, event_type: &str) -> Option<Hold> {
        let stored = self.stored.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(Stored::Elsewhere {
            stream, subject, ..
        }) = stored.get(event_type)
        {
            return Some(mapped(event_type, stream, subject));
        }
        drop(stored);
        let name = {
            let by_type = self.by_type.lock().unwrap_or_else(|p| p.into_inner());
            match &by_type.get(event_type)?.capture {
                Capture::Stream { name } => name.clone(),
                Capture::Nothing | Capture::Unknown => return None,
            }
        };
        let readings = self.readings.lock().unwrap_or_else(|p| p.into_inner());
        let settings = &readings.get(&name)?.0.unsafe_settings;
        (!settings.is_empty()).then(|| unsafe_stream(event_type, &name, settings))
    }

    /// Stream `name`'s last reading, if it was made within `within`.
    fn read_within(&self, name: &str, within: Duration) -> Option<Reading> {
        let readings = self.readings.lock().unwrap_or_else(|p| p.into_inner());
        readings
            .get(name)
            .filter(|(_, at)| at.elapsed() < within)
            .map(|(r, _)| r.clone())
    }

    /// Whether an ack of `event_type` from stream `acked_by` should have its stored message
    /// read back: the type's subject was not checked within [`SUBJECT_CHECK_EVERY`], or the
    /// ack comes from another stream than the one that captures the type.
    pub(super) fn subject_check_due(&self, event_type: &str, acked_by: &str) -> bool {
        let other_stream = self
            .cached_stream(event_type)
            .is_some_and(|s| s != acked_by);
        let stored = self.stored.lock().unwrap_or_else(|p| p.into_inner());
        other_stream
            || match stored.get(event_type) {
                Some(Stored::AsPublished { checked }) => checked.elapsed() >= SUBJECT_CHECK_EVERY,
                Some(Stored::Elsewhere { .. }) | None => true,
            }
    }

    /// Stream `stream` stored a message of `event_type` under `subject` (`None`: it could not
    /// be read back, which is taken as it is until the next check). Returns the hold when that
    /// is not the type: the type's messages are then refused ([`refusal`](Self::refusal))
    /// until no hold of that cause is left ([`forget_mapped`](Self::forget_mapped)).
    pub(super) fn stored_under(
        &self,
        event_type: &str,
        stream: &str,
        subject: Option<&str>,
    ) -> Option<Hold> {
        let now = Instant::now();
        let (entry, hold) = match subject {
            Some(subject) if subject != event_type => {
                tracing::error!(
                    event_type,
                    stream,
                    stored_as = subject,
                    "outbox relay: the server stored an event under another subject than its type (an account subject mapping?): consumers filtering on the type never see it; the type's rows are held"
                );
                let entry = Stored::Elsewhere {
                    stream: stream.to_owned(),
                    subject: subject.to_owned(),
                    since: now,
                };
                (entry, Some(mapped(event_type, stream, subject)))
            }
            _ => (Stored::AsPublished { checked: now }, None),
        };
        if self.cached_stream(event_type).is_some_and(|s| s != stream) {
            // another stream took it than the one last looked up: look it up again
            self.by_type
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(event_type);
        }
        self.stored
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(event_type.to_owned(), entry);
        hold
    }

    /// The types found stored elsewhere for [`MAPPED_AT_LEAST`], of which `held` (the types
    /// with rows held for that cause) are not: an operator released them, so the relay tries
    /// them again (and holds them again if the mapping is still there).
    pub(super) fn forget_mapped(&self, held: &std::collections::HashSet<String>) {
        let mut stored = self.stored.lock().unwrap_or_else(|p| p.into_inner());
        stored.retain(|event_type, s| match s {
            Stored::Elsewhere { since, .. } => {
                since.elapsed() < MAPPED_AT_LEAST || held.contains(event_type)
            }
            Stored::AsPublished { .. } => true,
        });
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::relay::held::HoldCause;

    const TYPE: &str = "billing.invoice.paid";

    /// A cache where `TYPE` is captured by `stream`, read with `unsafe_settings`.
    fn captured_by(stream: &str, unsafe_settings: &[&str]) -> Streams {
        let streams = Streams::default();
        let now = Instant::now();
        let entry = Entry {
            capture: Capture::Stream {
                name: stream.into(),
            },
            until: now + FRESH_FOR,
        };
        streams.by_type.lock().unwrap().insert(TYPE.into(), entry);
        let reading = Reading {
            unsafe_settings: unsafe_settings.iter().map(|s| s.to_string()).collect(),
            short_window: false,
        };
        streams
            .readings
            .lock()
            .unwrap()
            .insert(stream.into(), (reading, now));
        streams
    }

    #[test]
    fn the_types_of_an_unsafe_stream_are_refused_and_of_a_safe_one_not() {
        let hold = captured_by("BILLING", &["max_msgs is 100: ..."])
            .refusal(TYPE)
            .expect("refused");
        assert_eq!(hold.cause, HoldCause::UnsafeStream);
        assert!(
            hold.reason.contains("`BILLING`") && hold.reason.contains("max_msgs is 100"),
            "{}",
            hold.reason
        );
        assert!(captured_by("BILLING", &[]).refusal(TYPE).is_none());
        assert!(
            Streams::default().refusal(TYPE).is_none(),
            "a type never looked up is not refused here (it is looked up before it is sent)"
        );
        assert!(captured_by("BILLING", &["sealed"])
            .refusal("billing.invoice.sent")
            .is_none());
    }

    #[test]
    fn a_type_stored_under_another_subject_is_refused_until_no_hold_of_it_is_left() {
        let streams = captured_by("BILLING", &[]);
        assert!(streams.stored_under(TYPE, "BILLING", Some(TYPE)).is_none());
        assert!(
            streams.stored_under(TYPE, "BILLING", None).is_none(),
            "what cannot be read back counts as stored where published"
        );
        let hold = streams
            .stored_under(TYPE, "BILLING", Some("billing.moved.paid"))
            .expect("held");
        assert_eq!(hold.cause, HoldCause::Mapped);
        assert!(
            hold.reason.contains("billing.moved.paid"),
            "{}",
            hold.reason
        );
        assert_eq!(
            streams.refusal(TYPE).map(|h| h.cause),
            Some(HoldCause::Mapped)
        );

        let none_held = HashSet::new();
        streams.forget_mapped(&none_held);
        assert!(
            streams.refusal(TYPE).is_some(),
            "kept for a while: the batch that holds the row may not have committed yet"
        );
        let long_ago = Instant::now()
            .checked_sub(MAPPED_AT_LEAST + Duration::from_secs(1))
            .expect("an instant a minute ago");
        if let Some(Stored::Elsewhere { since, .. }) = streams.stored.lock().unwrap().get_mut(TYPE)
        {
            *since = long_ago;
        }
        streams.forget_mapped(&HashSet::from([TYPE.to_owned()]));
        assert!(streams.refusal(TYPE).is_some(), "its rows are still held");
        streams.forget_mapped(&none_held);
        assert!(
            streams.refusal(TYPE).is_none(),
            "an operator released them: the type is tried again"
        );
    }

    #[test]
    fn a_types_stored_subject_is_checked_once_a_minute_or_when_another_stream_acks() {
        let streams = captured_by("BILLING", &[]);
        assert!(streams.subject_check_due(TYPE, "BILLING"), "never checked");
        streams.stored_under(TYPE, "BILLING", Some(TYPE));
        assert!(!streams.subject_check_due(TYPE, "BILLING"));
        assert!(
            streams.subject_check_due(TYPE, "ELSEWHERE"),
            "an ack from another stream than the type's"
        );
        if let Some(Stored::AsPublished { checked }) = streams.stored.lock().unwrap().get_mut(TYPE)
        {
            *checked = Instant::now()
                .checked_sub(SUBJECT_CHECK_EVERY)
                .expect("an instant a minute ago");
        }
        assert!(streams.subject_check_due(TYPE, "BILLING"), "a minute later");
        streams.stored_under(TYPE, "ELSEWHERE", Some(TYPE));
        assert!(
            streams.cached_stream(TYPE).is_none(),
            "another stream stored it: the type is looked up again"
        );
    }
}
