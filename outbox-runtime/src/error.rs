//! The crate's error type.

use std::fmt;

/// One way a payload breaks its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaViolation {
    /// JSON pointer into `data` (`""` is the whole payload).
    pub pointer: String,
    /// The schema keyword that failed (`required`, `pattern`, `minimum`, ...).
    pub keyword: String,
    /// What is wrong, in words.
    pub message: String,
}

impl fmt::Display for SchemaViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = if self.pointer.is_empty() {
            "/"
        } else {
            &self.pointer
        };
        write!(f, "at `{at}` ({}): {}", self.keyword, self.message)
    }
}

fn list(violations: &[SchemaViolation]) -> String {
    violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `data` does not satisfy the event type's JSON Schema. Nothing was sent to the database.
    #[error("`{event_type}` payload does not match its schema: {}", list(.violations))]
    InvalidPayload {
        /// The event type whose schema rejected the payload.
        event_type: String,
        /// Every violation found, each with its JSON pointer and rule.
        violations: Vec<SchemaViolation>,
    },
    /// The untyped path was given an event type no registered schema describes.
    #[error("unknown event type `{event_type}`: no schema is registered for it (known: {known})")]
    UnknownEventType {
        /// The type asked for.
        event_type: String,
        /// The registered types, comma separated.
        known: String,
    },
    /// An event type, subject or source that breaks the naming rules of docs/event-naming.md.
    #[error("invalid {what} `{value}`: {reason}")]
    InvalidName {
        /// `event type`, `subject` or `source`.
        what: &'static str,
        /// The rejected value.
        value: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// The schema compiled into an event type is not a usable JSON Schema.
    #[error("the schema of `{event_type}` does not compile: {reason}")]
    InvalidSchema {
        /// The event type.
        event_type: String,
        /// What the validator said.
        reason: String,
    },
    /// The outbox table (or the consumer dedupe table) does not exist in this database.
    #[error("table `{table}` does not exist: run the outbox migrations first (`outbox migrate`, or `outbox_runtime::migrate(&pool)`, which applies migrations/{migration})")]
    MissingTable {
        /// The missing table.
        table: &'static str,
        /// The migration that creates it.
        migration: &'static str,
    },
    /// An index the relay needs is missing from `outbox_events`, or not valid yet (a
    /// concurrent build still running, or one that failed): the relay does not start without
    /// it.
    #[error(
        "index `{index}` of outbox_events {problem}: the relay needs it (migrations/{migration}); \
         build it without holding writes with `{statement};` (outside a transaction, as the \
         table's owner; after a failed build, `drop index concurrently if exists {index};` \
         first), or run `outbox migrate` on an empty table, then start the relay again"
    )]
    MissingIndex {
        /// The index.
        index: &'static str,
        /// What is wrong with it: missing, or not valid yet.
        problem: &'static str,
        /// The migration that creates it.
        migration: &'static str,
        /// The statement that builds it without holding writes.
        statement: String,
    },
    /// A column the crate writes is missing from a table of the outbox's migrations (with the
    /// `opentelemetry` feature, emit writes the trace context columns of migration 0007).
    #[error("column `{column}` of table `{table}` does not exist: run the outbox migrations (`outbox migrate`, or `outbox_runtime::migrate(&pool)`, which applies migrations/{migration})")]
    MissingColumn {
        /// The table.
        table: &'static str,
        /// The missing column.
        column: &'static str,
        /// The migration that adds it.
        migration: &'static str,
    },
    /// A database error.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// Applying the outbox migrations failed.
    #[error("migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// `_sqlx_migrations` records a migration under one of the outbox's version numbers with
    /// different content: the service's own sqlx migrations use the same numbers.
    #[error(
        "migration {version} recorded in `_sqlx_migrations` is not the outbox's: the service's own \
         sqlx migrations use the same version numbers; copy `migrations/*.sql` into the service's \
         migrations folder (numbered after its own) instead of calling `outbox_runtime::migrate`"
    )]
    MigrationConflict {
        /// The version both sets of migrations claim.
        version: i64,
    },
    /// [`migrate`](crate::migrate()) would have to build an index of `outbox_events` on a table
    /// with rows, which holds every write to the table until the build ends: it builds nothing,
    /// and names the statements that build the index without holding writes.
    #[error(
        "index `{index}` of outbox_events {problem}, and the table has rows: building it in a \
         migration would hold every write to the table until the build ends, so migrate does \
         not; run {statements} (each on its own, outside a transaction, as the table's owner), \
         then migrate again"
    )]
    IndexNotBuilt {
        /// The index.
        index: &'static str,
        /// What is wrong with it.
        problem: &'static str,
        /// The statements to run, in order.
        statements: String,
    },
    /// A statement of [`migrate`](crate::migrate()) waited for a lock longer than it may (a
    /// statement waiting for a table lock holds the writes that queue behind it) and gave up
    /// with nothing of it applied.
    #[error(
        "{what} waited over {}s for a lock (a long transaction, or an index build, holds its \
         table) and gave up, so that writes to the table waited no longer; nothing of it was \
         applied: run migrate again once that transaction or build is over",
        waited.as_secs()
    )]
    MigrationBlocked {
        /// What waited: a migration, or the build of an index.
        what: String,
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// Serialising an event or envelope failed.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// A NATS or JetStream operation failed. `source` is async-nats's error, whose `kind()`
    /// tells (for example) a refused publish from a timeout: downcast it, e.g. to
    /// `async_nats::jetstream::context::PublishError`.
    #[error("nats: {action}: {source}")]
    Nats {
        /// What was being done, in words.
        action: String,
        /// async-nats's error.
        #[source]
        source: BoxError,
    },
    /// The NATS server answers but JetStream does not work for this connection (not enabled,
    /// or the account has no JetStream).
    #[error("JetStream at {target} {problem}")]
    JetStream {
        /// The server's address.
        target: String,
        /// What is wrong and how to fix it.
        problem: String,
        /// The client's error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// The JetStream stream does not fit the relay (missing, subjects not captured, duplicate
    /// window shorter than the retry horizon, ...).
    #[error("stream `{stream}`: {reason}")]
    Stream {
        /// The stream name.
        stream: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A configuration value that cannot work.
    #[error("configuration: {0}")]
    Config(String),
    /// The TLS connection to Postgres or NATS failed: the server offers no TLS, its certificate
    /// did not verify (wrong CA, or it names another host), or this build has no TLS.
    #[error("TLS to {service} at {target} failed: {source}; {fix}")]
    Tls {
        /// `postgres` or `nats`.
        service: &'static str,
        /// The address tried (URL without credentials).
        target: String,
        /// What to change, in words.
        fix: String,
        /// What the client said.
        #[source]
        source: BoxError,
    },
    /// The server answered and refused the login (user, password, or a `pg_hba.conf` rule).
    #[error("{service} at {target} refused the login: {source}; {fix}")]
    Authentication {
        /// `postgres` or `nats`.
        service: &'static str,
        /// The address tried (URL without credentials).
        target: String,
        /// What to change, in words.
        fix: String,
        /// What the server said.
        #[source]
        source: BoxError,
    },
    /// Postgres or NATS could not be reached.
    #[error("cannot reach {service} at {target}: {source}; check that it is running and that the address is right")]
    Unreachable {
        /// `postgres` or `nats`.
        service: &'static str,
        /// The address tried (URL without credentials).
        target: String,
        /// What the client said.
        #[source]
        source: BoxError,
    },
}

/// Another library's error, kept whole (its type and kind) as the [`source`] of ours.
///
/// [`source`]: std::error::Error::source
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

impl Error {
    /// A failed NATS operation: `action` says what was being done.
    pub(crate) fn nats(action: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Nats {
            action: action.into(),
            source: source.into(),
        }
    }

    /// `service` at `target` (an address without credentials) could not be reached.
    pub(crate) fn unreachable(
        service: &'static str,
        target: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Unreachable {
            service,
            target: target.into(),
            source: source.into(),
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
