//! The JetStream stream that stores the outbox's events.
//!
//! The relay publishes every row on the subject `event_type` and counts a row as published only
//! when a stream acknowledges it, so a stream must capture each event type it relays. JetStream
//! drops a message whose `Nats-Msg-Id` it has already stored within the stream's duplicate
//! window; the relay republishes a row under the same id after a crash or a lost ack, so the
//! window must cover the relay's retry horizon (see
//! [`RelayConfig::retry_horizon`](crate::RelayConfig::retry_horizon)).
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

fn storage_name(storage: StorageType) -> &'static str {
    match storage {
        StorageType::File => "file",
        StorageType::Memory => "memory",
    }
}

fn is_not_found(e: &jetstream::context::GetStreamError) -> bool {
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
