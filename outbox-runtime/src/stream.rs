//! The JetStream stream that stores the outbox's events.
//!
//! The relay publishes every row on the subject `event_type` and counts a row as published only
//! when a stream acknowledges it, so a stream must capture each event type it relays. JetStream
//! drops a message whose `Nats-Msg-Id` it has already stored within the stream's duplicate
//! window; the relay republishes a row under the same id after a crash or a lost ack, so the
//! window must cover the relay's retry horizon (see
//! [`RelayConfig::retry_horizon`](crate::RelayConfig::retry_horizon)).
//!
//! A stream must also keep what it acknowledged, where consumers look for it: once the relay has
//! marked a row published and retention has pruned it, the stream holds the only copy.
//! [`unsafe_settings`] names the settings that lose acknowledged messages (interest or
//! work-queue retention, `no_ack`, message and byte limits, asynchronous persistence) or store
//! them under another subject (a subject transform); [`durability_warning`] the single-replica
//! case.
//!
//! [`StreamSpec::ensure`] creates the stream, or checks an existing one and says precisely what
//! differs. [`check_captures`] finds, for each subject, the stream that captures it; the relay
//! runs it at start.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::{self, stream};

use crate::error::{Error, Result};

/// How a stream keeps its messages.
pub use async_nats::jetstream::stream::StorageType;

/// The stream a service's events go to: a server-side configuration, `Default` style.
///
/// ```no_run
/// # async fn run() -> outbox_runtime::Result<()> {
/// use outbox_runtime::StreamSpec;
///
/// let client = async_nats::connect("nats://127.0.0.1:4222").await.unwrap();
/// let jetstream = async_nats::jetstream::new(client);
/// let info = StreamSpec {
///     name: "BILLING".into(),
///     subjects: vec!["billing.>".into()],
///     ..Default::default()
/// }
/// .ensure(&jetstream)
/// .await?;
/// assert_eq!(info.config.name, "BILLING");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSpec {
    /// The stream name (no whitespace, `.`, `*` or `>`). Default `OUTBOX`.
    pub name: String,
    /// The subjects it captures: event types, or wildcards such as `billing.>`. Required.
    pub subjects: Vec<String>,
    /// File (default) or memory storage.
    pub storage: StorageType,
    /// How long JetStream remembers a `Nats-Msg-Id` to drop a republished duplicate.
    /// Default 10 minutes: it covers the default relay's retry horizon (5 min 5 s).
    pub duplicate_window: Duration,
    /// How long messages are kept; zero keeps them until another limit removes them (default).
    pub max_age: Duration,
    /// Number of replicas in a cluster. Default 1.
    pub replicas: usize,
}

impl Default for StreamSpec {
    fn default() -> Self {
        Self {
            name: "OUTBOX".into(),
            subjects: Vec::new(),
            storage: StorageType::File,
            duplicate_window: Duration::from_secs(600),
            max_age: Duration::ZERO,
            replicas: 1,
        }
    }
}

impl StreamSpec {
    /// A spec with default settings for `name` capturing `subjects` (for example the event types
    /// of [`Schemas::event_types`](crate::Schemas::event_types)).
    ///
    /// ```
    /// let spec = outbox_runtime::StreamSpec::new("BILLING", ["billing.invoice.paid"]);
    /// assert_eq!(spec.subjects, ["billing.invoice.paid"]);
    /// ```
    pub fn new<S: Into<String>>(
        name: impl Into<String>,
        subjects: impl IntoIterator<Item = S>,
    ) -> Self {
        Self {
            name: name.into(),
            subjects: subjects.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    fn validate(&self) -> Result<()> {
        let bad_name = self.name.is_empty()
            || self
                .name
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, '.' | '*' | '>' | '/' | '\\'));
        if bad_name {
            return Err(self.error(
                "invalid stream name: it must be non-empty, without whitespace, `.`, `*`, `>`, `/` or `\\`",
            ));
        }
        if self.subjects.is_empty() {
            return Err(
                self.error("no subjects: list the event types (or a wildcard) the stream captures")
            );
        }
        if self.duplicate_window.is_zero() {
            return Err(self.error(
                "duplicate window is zero: JetStream would store every republished row again",
            ));
        }
        if !self.max_age.is_zero() && self.duplicate_window > self.max_age {
            return Err(self.error("duplicate window is longer than max_age: JetStream refuses it"));
        }
        Ok(())
    }

    fn error(&self, reason: impl Into<String>) -> Error {
        Error::Stream {
            stream: self.name.clone(),
            reason: reason.into(),
        }
    }

    /// The JetStream configuration this spec describes.
    pub fn to_config(&self) -> stream::Config {
        stream::Config {
            name: self.name.clone(),
            subjects: self.subjects.clone(),
            storage: self.storage,
            duplicate_window: self.duplicate_window,
            max_age: self.max_age,
            num_replicas: self.replicas,
            ..Default::default()
        }
    }

    /// The ways `config` differs from this spec, in words (empty when it matches).
    ///
    /// ```
    /// use outbox_runtime::{StorageType, StreamSpec};
    ///
    /// let spec = StreamSpec::new("BILLING", ["billing.>"]);
    /// let mut config = spec.to_config();
    /// assert!(spec.differences(&config).is_empty());
    /// config.storage = StorageType::Memory;
    /// assert_eq!(spec.differences(&config), ["storage is memory, expected file"]);
    /// ```
    pub fn differences(&self, config: &stream::Config) -> Vec<String> {
        let mut out = Vec::new();
        let mut want = self.subjects.clone();
        let mut have = config.subjects.clone();
        want.sort();
        have.sort();
        if want != have {
            out.push(format!("subjects are {have:?}, expected {want:?}"));
        }
        if config.storage != self.storage {
            out.push(format!(
                "storage is {}, expected {}",
                storage_name(config.storage),
                storage_name(self.storage)
            ));
        }
        if config.duplicate_window != self.duplicate_window {
            out.push(format!(
                "duplicate window is {:?}, expected {:?}",
                config.duplicate_window, self.duplicate_window
            ));
        }
        if config.max_age != self.max_age {
            out.push(format!(
                "max age is {:?}, expected {:?}",
                config.max_age, self.max_age
            ));
        }
        if config.num_replicas.max(1) != self.replicas.max(1) {
            out.push(format!(
                "replicas are {}, expected {}",
                config.num_replicas, self.replicas
            ));
        }
        out
    }

    /// Creates the stream, or checks that the existing stream of this name matches the spec.
    ///
    /// An existing stream that differs is left untouched and reported as [`Error::Stream`]
    /// listing every difference, so that a deployment never silently changes a stream's
    /// retention. Returns the stream's info.
    ///
    /// ```no_run
    /// # async fn run(jetstream: async_nats::jetstream::Context) -> outbox_runtime::Result<()> {
    /// let spec = outbox_runtime::StreamSpec::new("BILLING", ["billing.>"]);
    /// spec.ensure(&jetstream).await?; // creates it
    /// spec.ensure(&jetstream).await?; // finds it as specified
    /// # Ok(()) }
    /// ```
    pub async fn ensure(&self, jetstream: &jetstream::Context) -> Result<stream::Info> {
        self.validate()?;
        match jetstream.get_stream(&self.name).await {
            Ok(mut existing) => {
                let info = existing
                    .info()
                    .await
                    .map_err(|e| Error::nats(format!("reading stream `{}`", self.name), e))?
                    .clone();
                let unsafe_settings = unsafe_settings(&info.config);
                if !unsafe_settings.is_empty() {
                    return Err(self.error(unsafe_reason(&unsafe_settings)));
                }
                let diff = self.differences(&info.config);
                if diff.is_empty() {
                    Ok(info)
                } else {
                    Err(self.error(format!(
                        "exists but differs from the spec: {}; update or recreate it (`nats stream edit {}`), or change the spec",
                        diff.join("; "),
                        self.name
                    )))
                }
            }
            Err(e) if is_not_found(&e) => {
                let mut created = jetstream
                    .create_stream(self.to_config())
                    .await
                    .map_err(|e| self.error(format!("cannot be created: {e}")))?;
                Ok(created
                    .info()
                    .await
                    .map_err(|e| Error::nats(format!("reading stream `{}`", self.name), e))?
                    .clone())
            }
            Err(e) => Err(Error::nats(format!("looking up stream `{}`", self.name), e)),
        }
    }
}

/// The settings of `config` under which the stream can lose a message it acknowledged (or can
/// never acknowledge one), or stores it under another subject than the event type it was
/// published on (a `subject_transform`: consumers filtering on the type would never see it),
/// each in words with its fix; empty when there are none.
///
/// A source's subject transforms are not among them: they rename the messages the stream
/// copies from another stream, never the ones published to it.
///
/// ```
/// use async_nats::jetstream::stream::{Config, RetentionPolicy};
///
/// let safe = Config { name: "BILLING".into(), ..Default::default() };
/// assert!(outbox_runtime::unsafe_settings(&safe).is_empty());
/// let interest = Config { retention: RetentionPolicy::Interest, ..safe };
/// assert!(outbox_runtime::unsafe_settings(&interest)[0].starts_with("retention is interest"));
/// ```
pub fn unsafe_settings(config: &stream::Config) -> Vec<String> {
    use stream::{DiscardPolicy, PersistenceMode, RetentionPolicy};
    let mut out = Vec::new();
    let keep_by_age = "use limits retention (the default) and expire messages with max_age";
    match config.retention {
        RetentionPolicy::Limits => {}
        RetentionPolicy::Interest => out.push(format!(
            "retention is interest: a message is deleted once the consumers that exist have acknowledged it, so a consumer created later (or re-created) never sees it; {keep_by_age}"
        )),
        RetentionPolicy::WorkQueue => out.push(format!(
            "retention is workqueue: a message is deleted once one consumer acknowledged it, so other consumers never see it; {keep_by_age}"
        )),
    }
    if config.no_ack {
        out.push(
            "no_ack is set: the stream acknowledges no publish, so the relay can never mark a row published; unset it".into(),
        );
    }
    let limit_effect = match config.discard {
        DiscardPolicy::Old => "deletes the oldest messages when it is reached, whether consumers read them or not",
        DiscardPolicy::New => "refuses new messages when it is reached, which leaves the relay's rows at the attempt cap",
    };
    let limits = [
        ("max_msgs", config.max_messages),
        ("max_bytes", config.max_bytes),
        ("max_msgs_per_subject", config.max_messages_per_subject),
    ];
    for (name, value) in limits {
        if value > 0 {
            out.push(format!(
                "{name} is {value}: the stream {limit_effect}; set it to -1 (unlimited) and expire messages with max_age"
            ));
        }
    }
    if config.persist_mode == Some(PersistenceMode::Async) {
        out.push(
            "persist_mode is async: the stream acknowledges a message before it is stored; use the default persistence".into(),
        );
    }
    if config.sealed {
        out.push("the stream is sealed: it takes no new messages".into());
    }
    if config.mirror.is_some() {
        out.push(
            "the stream is a mirror: it takes no published messages; publish to its origin".into(),
        );
    }
    if let Some(t) = config
        .subject_transform
        .as_ref()
        .filter(|t| t.destination != t.source)
    {
        let source = if t.source.is_empty() { ">" } else { &t.source };
        out.push(format!(
            "subject_transform maps `{source}` to `{}`: the stream stores a message under another subject than the event type it was published on, where consumers filtering on the type never see it; remove the transform",
            t.destination
        ));
    }
    out
}

/// A warning for a stream with a single replica, or `None` for a replicated one: one server
/// holds each message it acknowledged, and (unless that server runs with
/// `jetstream { sync_interval: always }`) not yet on disk, so a crash of that machine loses
/// acknowledged messages (docs/operations.md, *Deployment*).
pub fn durability_warning(config: &stream::Config) -> Option<String> {
    (config.num_replicas <= 1).then(|| {
        format!(
            "stream `{}` has one replica: a message it acknowledged is on one server, and on disk only after the server's next sync (every 2 minutes by default) unless the server runs with `sync_interval: always`; a crash can lose published events whose rows are pruned. Use 3 replicas in production",
            config.name
        )
    })
}

fn unsafe_reason(settings: &[String]) -> String {
    format!(
        "cannot be trusted with the outbox's events, which count as published once it acknowledges them: {}",
        settings.join("; ")
    )
}

/// [`Error::Stream`] for stream `name` when `config` has [`unsafe_settings`].
pub(crate) fn check_safe(name: &str, config: &stream::Config) -> Result<()> {
    let settings = unsafe_settings(config);
    if settings.is_empty() {
        return Ok(());
    }
    Err(Error::Stream {
        stream: name.to_owned(),
        reason: unsafe_reason(&settings),
    })
}

fn storage_name(storage: StorageType) -> &'static str {
    match storage {
        StorageType::File => "file",
        StorageType::Memory => "memory",
    }
}

/// Whether `e` says that the stream does not exist.
pub(crate) fn is_not_found(e: &jetstream::context::GetStreamError) -> bool {
    matches!(
        e.kind(),
        jetstream::context::GetStreamErrorKind::JetStream(js)
            if js.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
    )
}

/// Finds the stream that captures each of `subjects` (literal subjects, such as event types).
///
/// Returns the infos keyed by stream name, or [`Error::Stream`] naming every subject no stream
/// captures (a publish to it would fail with "no responders" on every attempt).
///
/// ```no_run
/// # async fn run(jetstream: async_nats::jetstream::Context) -> outbox_runtime::Result<()> {
/// let streams = outbox_runtime::check_captures(&jetstream, ["billing.invoice.paid"]).await?;
/// assert_eq!(streams.len(), 1);
/// # Ok(()) }
/// ```
pub async fn check_captures<S: AsRef<str>>(
    jetstream: &jetstream::Context,
    subjects: impl IntoIterator<Item = S>,
) -> Result<BTreeMap<String, stream::Info>> {
    let mut found = BTreeMap::new();
    let mut missing = Vec::new();
    for subject in subjects {
        let subject = subject.as_ref();
        match jetstream.stream_by_subject(subject).await {
            Ok(name) => {
                if let std::collections::btree_map::Entry::Vacant(slot) = found.entry(name) {
                    let reading = || format!("reading stream `{}`", slot.key());
                    let mut s = jetstream
                        .get_stream(slot.key())
                        .await
                        .map_err(|e| Error::nats(reading(), e))?;
                    let info = s.info().await.map_err(|e| Error::nats(reading(), e))?;
                    slot.insert(info.clone());
                }
            }
            Err(e) if e.kind() == jetstream::context::GetStreamByNameErrorKind::NotFound => {
                missing.push(subject.to_owned());
            }
            Err(e) => {
                return Err(Error::nats(
                    format!("looking up the stream of `{subject}`"),
                    e,
                ))
            }
        }
    }
    if missing.is_empty() {
        Ok(found)
    } else {
        Err(Error::Stream {
            stream: "(none)".into(),
            reason: format!(
                "no stream captures {}: create one with `StreamSpec::ensure` (or `nats stream add --subjects ...`) before starting the relay",
                missing
                    .iter()
                    .map(|s| format!("`{s}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stream::{Config, DiscardPolicy, PersistenceMode, RetentionPolicy};

    fn safe() -> Config {
        StreamSpec::new("BILLING", ["billing.>"]).to_config()
    }

    #[test]
    fn what_the_spec_creates_is_safe() {
        assert!(unsafe_settings(&safe()).is_empty());
        let aged = Config {
            max_age: Duration::from_secs(86_400),
            ..safe()
        };
        assert!(
            unsafe_settings(&aged).is_empty(),
            "max_age is retention, not loss"
        );
    }

    #[test]
    fn every_setting_that_loses_acknowledged_messages_is_named_with_its_fix() {
        let cases: Vec<(Config, &str, &str)> = vec![
            (
                Config {
                    retention: RetentionPolicy::Interest,
                    ..safe()
                },
                "retention is interest",
                "limits retention",
            ),
            (
                Config {
                    retention: RetentionPolicy::WorkQueue,
                    ..safe()
                },
                "retention is workqueue",
                "limits retention",
            ),
            (
                Config {
                    no_ack: true,
                    ..safe()
                },
                "no_ack is set",
                "unset it",
            ),
            (
                Config {
                    max_messages: 10,
                    ..safe()
                },
                "max_msgs is 10: the stream deletes the oldest",
                "-1 (unlimited)",
            ),
            (
                Config {
                    max_bytes: 1 << 20,
                    discard: DiscardPolicy::New,
                    ..safe()
                },
                "max_bytes is 1048576: the stream refuses new messages",
                "-1 (unlimited)",
            ),
            (
                Config {
                    max_messages_per_subject: 1,
                    ..safe()
                },
                "max_msgs_per_subject is 1",
                "-1 (unlimited)",
            ),
            (
                Config {
                    persist_mode: Some(PersistenceMode::Async),
                    ..safe()
                },
                "persist_mode is async",
                "default persistence",
            ),
            (
                Config {
                    sealed: true,
                    ..safe()
                },
                "sealed",
                "no new messages",
            ),
            (
                Config {
                    subject_transform: Some(stream::SubjectTransform {
                        source: "billing.>".into(),
                        destination: "moved.>".into(),
                    }),
                    ..safe()
                },
                "subject_transform maps `billing.>` to `moved.>`",
                "remove the transform",
            ),
            (
                Config {
                    subject_transform: Some(stream::SubjectTransform {
                        source: String::new(),
                        destination: "moved.>".into(),
                    }),
                    ..safe()
                },
                "subject_transform maps `>` to `moved.>`",
                "consumers filtering on the type never see it",
            ),
        ];
        for (config, setting, fix) in cases {
            let found = unsafe_settings(&config);
            assert_eq!(found.len(), 1, "{found:?}");
            assert!(
                found[0].contains(setting) && found[0].contains(fix),
                "{setting}: {}",
                found[0]
            );
            let error = check_safe("BILLING", &config).unwrap_err().to_string();
            assert!(
                error.contains("BILLING") && error.contains(setting),
                "{error}"
            );
        }
        let unlimited = Config {
            max_messages: -1,
            max_bytes: -1,
            max_messages_per_subject: -1,
            ..safe()
        };
        assert!(unsafe_settings(&unlimited).is_empty(), "-1 is unlimited");
        let identity = Config {
            subject_transform: Some(stream::SubjectTransform {
                source: "billing.>".into(),
                destination: "billing.>".into(),
            }),
            ..safe()
        };
        assert!(
            unsafe_settings(&identity).is_empty(),
            "a transform onto the same subjects moves nothing"
        );
    }

    #[test]
    fn one_replica_is_warned_about_and_three_are_not() {
        let warning = durability_warning(&safe()).unwrap();
        assert!(
            warning.contains("`BILLING` has one replica")
                && warning.contains("sync_interval: always"),
            "{warning}"
        );
        let r3 = Config {
            num_replicas: 3,
            ..safe()
        };
        assert_eq!(durability_warning(&r3), None);
    }
}
