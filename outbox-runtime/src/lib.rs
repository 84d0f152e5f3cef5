//! A transactional outbox for Postgres and NATS JetStream, with event contracts checked at
//! compile time.
#![doc = include_str!("../README.md")]

pub mod connect;
pub mod consumer;
mod emit;
mod envelope;
mod error;
mod event;
pub mod metrics;
mod migrate;
mod naming;
pub mod order;
pub mod permissions;
pub mod redact;
pub mod relay;
pub mod retention;
pub mod status;
pub mod stream;
mod table;
pub mod trace;
mod validate;
pub mod verify;

pub use emit::{EmitExt, RawEvent, NOTIFY_CHANNEL, NOTIFY_KEY, WAKE_KEY};
pub use envelope::{Envelope, CONTENT_TYPE, DATA_CONTENT_TYPE, SPEC_VERSION};
pub use error::{BoxError, Error, Result, SchemaViolation};
pub use event::{EmitEvent, OutboxEvent, PLATFORM_SUBJECT};
pub use permissions::RelayPermissions;
pub use relay::{BatchReport, Claim, Relay, RelayConfig, RelayHealth, RelayStats};
pub use stream::{check_captures, durability_warning, unsafe_settings, StorageType, StreamSpec};
pub use validate::Schemas;
pub use verify::{verify, VerifyOptions, VerifyReport};

/// `#[derive(OutboxEvent)]`: see [`OutboxEvent`] and the crate docs.
pub use outbox_macros::OutboxEvent;

/// The outbox migrations (`migrations/` at the repository root, which `outbox-runtime/migrations`
/// links to, so that the packaged crate carries the same files):
///
/// - `0001_outbox_events.sql`: the outbox table and its partial index, exactly as the contract
///   gives them;
/// - `0002_outbox_consumer.sql`: the consumer dedupe table (`outbox_consumed`) and the
///   per-subject positions of [`order`];
/// - `0003_outbox_retrying_idx.sql`: a small partial index on the subjects of rows that failed
///   (the relay's claim read it until 0005 replaced it with its own table; 0013 drops it);
/// - `0004_outbox_events_fillfactor.sql`: `fillfactor = 50` on the outbox table, so that the
///   relay's mark writes each row's new version on the row's own page (a quarter less time per
///   mark; the table ends up no larger);
/// - `0005_outbox_retries.sql`: the relay's retry schedule (`outbox_retries`), one row per
///   subject whose oldest unpublished event failed or is held, shared by every relay;
/// - `0006_consumer_attempts.sql`: the consumers' own state: handler attempts (the give-up
///   budget), the consumer names in use (one event type per name), per-subject positions in
///   stream order, and the dedupe horizon retention records (see [`consumer`], [`order`] and
///   [`retention`]);
/// - `0007_outbox_trace_context.sql`: two nullable columns of the outbox table, `traceparent`
///   and `tracestate`, the W3C trace context of the span each event was emitted in (see
///   [`trace`]). The contract's columns are unchanged; emit writes them only with the
///   `opentelemetry` feature, and a relay on a table without them works and says so at start.
/// - `0008_outbox_relays.sql`: the running relays' table of an earlier relay, which shared the
///   subject partitions out between relays; 0011 drops it.
/// - `0009_outbox_published_idx.sql`: retention's index, the published rows by `published_at`
///   (a prune statement reads a bounded number of pages however large the table). Its
///   statement holds writes to the table while it builds: [`migrate`] runs it only on an empty
///   table, and on one with rows names the `create index concurrently` statement (the file
///   gives it too) to run first.
/// - `0010_outbox_unpublished_partition_idx.sql`: the unpublished rows by `(created_at, id)`
///   and subject partition, so that a relay's lane skips the other lanes' rows inside the
///   index. Built like 0009 (the file gives the `concurrently` statement).
/// - `0011_outbox_relay_lease.sql`: the relay lease (`outbox_relay_lease`), which says which of
///   the relays running on the table publishes (docs/relay.md, *Several relays*), drops
///   0008's table, and gives `outbox_retries` the nullable `cause` of each hold (the relay
///   releases by itself the holds a stream caused: docs/relay.md, *Held rows*).
/// - `0012_outbox_unpublished_subject_idx.sql`: the unpublished rows by `(hashtext(subject),
///   created_at, id)`, so that before a batch publishes a subject's rows it finds the
///   subject's oldest unpublished row in one probe, wherever it lies (docs/relay.md, *Order*).
///   Built like 0009 (the file gives the `concurrently` statement). The relay needs it:
///   `Relay::new` on a table without it (or with its build still running) returns
///   [`Error::MissingIndex`], naming that statement.
/// - `0013_outbox_drop_retrying_idx.sql`: drops 0003's index, which no statement reads, and
///   which indexed `subject` itself (a row with a subject over 2,704 bytes could not be marked
///   failed once in it).
///
/// Run them with [`migrate`], or copy the files into the service's own migrations folder (they
/// are idempotent: `create ... if not exists`, and a storage setting). Run as they are (by
/// this migrator or a copy), 0009, 0010 and 0012 build their indexes in the migration's transaction,
/// holding writes: on a table with rows, build them `concurrently` first, or use [`migrate`].
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Applies [`MIGRATOR`] to `pool`, without ever holding writes to `outbox_events` for longer
/// than a lock wait of 2 s.
///
/// sqlx records migrations in one table, `_sqlx_migrations`, shared with the service's own
/// `sqlx::migrate!` migrations. This tolerates the service's entries (it ignores versions it does
/// not know), and the service's migrator must do the same for the outbox's
/// (`set_ignore_missing(true)`); `sqlx migrate add` names files by timestamp, so the versions do
/// not collide. If the service numbers its migrations 1, 2, 3, … they do collide and this
/// returns [`Error::MigrationConflict`]: copy the outbox's files into the service's folder
/// instead (and build the indexes of 0009, 0010 and 0012 yourself, as below).
///
/// - **One lock for the whole run**: sqlx's migration lock of the database (so the service's
///   migrations and these never run at once), taken by trying every 100 ms rather than by a
///   statement that waits (which would hold a snapshot that any concurrent index build waits
///   for). Several processes may call this at once: one migrates, the others wait and then find
///   nothing to do.
/// - **Lock waits of at most 2 s**: a statement that waits for a table lock holds every write
///   that queues behind it, so each gives up after 2 s, with [`Error::MigrationBlocked`] and
///   nothing of its migration applied: run it again once the long transaction (or index
///   build) that held the table is over.
/// - **No index build on a table with rows**: the indexes of 0009, 0010 and 0012 are checked here, not
///   by their migrations' statements, which would hold writes for the whole build (minutes on
///   tens of millions of rows). Present, valid or being built, the migration is recorded; missing
///   on an empty table, it is built at once; missing on a table with rows, or left invalid by a
///   concurrent build that failed, this returns [`Error::IndexNotBuilt`] with the `create
///   index concurrently` statement (and the `drop index concurrently` before it) to run, and
///   changes nothing. An invalid index counts as being built while another session holds
///   `outbox_events` in the mode a concurrent build holds it (`pg_locks`, which every role can
///   read), so a build in progress is never dropped, whoever runs it.
/// - **No table another role created**: a table the migrations create (or `_sqlx_migrations`)
///   that exists already, owned by neither a superuser nor the migrating role or a role it is a
///   member of by grants, was made by someone else, and `create table if not exists` would take
///   it, with its triggers, as the outbox's: this returns [`Error::Config`] naming it and its
///   owner, and applies nothing.
///
/// ```no_run
/// # async fn run() -> outbox_runtime::Result<()> {
/// let pool = sqlx::PgPool::connect("postgres://root@127.0.0.1/test").await?;
/// outbox_runtime::migrate(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn migrate(pool: &sqlx::PgPool) -> Result<()> {
    migrate::run(pool).await
}

#[doc(hidden)]
pub mod __private {
    pub use serde_json;
}
