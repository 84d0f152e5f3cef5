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
mod naming;
pub mod order;
pub mod redact;
pub mod relay;
pub mod retention;
pub mod status;
pub mod stream;
mod table;
pub mod trace;
mod validate;
pub mod verify;

pub use emit::{EmitExt, RawEvent, NOTIFY_CHANNEL, WAKE_KEY};
pub use envelope::{Envelope, CONTENT_TYPE, DATA_CONTENT_TYPE, SPEC_VERSION};
pub use error::{BoxError, Error, Result, SchemaViolation};
pub use event::{EmitEvent, OutboxEvent, PLATFORM_SUBJECT};
pub use relay::{BatchReport, Claim, Relay, RelayConfig, RelayStats};
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
///   (the relay's claim read it until 0005 replaced it with its own table; kept, as it costs
///   nothing on the emit path);
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
/// - `0008_outbox_relays.sql`: the running relays (`outbox_relays`, unlogged), one row each
///   with a heartbeat, so that several relays share the subject partitions out between them.
/// - `0009_outbox_published_idx.sql`: retention's index, the published rows by `published_at`
///   (a prune statement reads a bounded number of pages however large the table). Its build
///   holds writes to the table: on a large table build it `concurrently` beforehand (the
///   file gives the statement) and the migration finds it.
/// - `0010_outbox_unpublished_partition_idx.sql`: the unpublished rows by `(created_at, id)`
///   and subject partition, so that a relay's lane skips the other lanes' rows inside the
///   index. Built like 0009 (the file gives the `concurrently` statement).
///
/// Run them with [`migrate`], or copy the files into the service's own migrations folder (they
/// are idempotent: `create ... if not exists`, and a storage setting).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Applies [`MIGRATOR`] to `pool`.
///
/// sqlx records migrations in one table, `_sqlx_migrations`, shared with the service's own
/// `sqlx::migrate!` migrations. This tolerates the service's entries (it ignores versions it does
/// not know), and the service's migrator must do the same for the outbox's
/// (`set_ignore_missing(true)`); `sqlx migrate add` names files by timestamp, so the versions do
/// not collide. If the service numbers its migrations 1, 2, 3, … they do collide and this
/// returns [`Error::MigrationConflict`]: copy the outbox's files into the service's folder
/// instead.
///
/// A concurrent build of `outbox_events_published_idx` (0009) or
/// `outbox_events_unpublished_partition_idx` (0010) that failed (cancelled, a connection lost)
/// leaves an invalid index behind, which `if not exists` would take for done: this drops it
/// and builds it again (a build still in progress is left alone).
///
/// ```no_run
/// # async fn run() -> outbox_runtime::Result<()> {
/// let pool = sqlx::PgPool::connect("postgres://root@127.0.0.1/test").await?;
/// outbox_runtime::migrate(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn migrate(pool: &sqlx::PgPool) -> Result<()> {
    // a concurrent build that failed leaves an invalid index that `if not exists` would take
    // for done: drop it, and build it again below
    let mut rebuild = Vec::new();
    for (name, build) in BUILT_CONCURRENTLY {
        if drop_invalid_index(pool, name).await? {
            rebuild.push(build);
        }
    }
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.set_ignore_missing(true);
    match migrator.run(pool).await {
        Ok(()) => {}
        Err(sqlx::migrate::MigrateError::VersionMismatch(version)) => {
            return Err(Error::MigrationConflict { version })
        }
        Err(e) => return Err(e.into()),
    }
    for build in rebuild {
        sqlx::raw_sql(build).execute(pool).await?;
    }
    Ok(())
}

/// The indexes whose migrations say to build them `concurrently` beforehand on a large table,
/// with their migrations: retention's (0009) and the lanes' (0010).
const BUILT_CONCURRENTLY: [(&str, &str); 2] = [
    (
        "outbox_events_published_idx",
        include_str!("../migrations/0009_outbox_published_idx.sql"),
    ),
    (
        "outbox_events_unpublished_partition_idx",
        include_str!("../migrations/0010_outbox_unpublished_partition_idx.sql"),
    ),
];

/// Drops the index `name` of `outbox_events` when it is invalid (a concurrent build of it
/// failed) and no build of it is in progress; whether it did.
async fn drop_invalid_index(pool: &sqlx::PgPool, name: &str) -> Result<bool> {
    let invalid: Option<String> = sqlx::query_scalar(
        "select c.oid::regclass::text from pg_index i join pg_class c on c.oid = i.indexrelid \
          where i.indrelid = to_regclass('outbox_events') \
            and c.relname = $1 and not i.indisvalid \
            and not exists (select 1 from pg_stat_progress_create_index p \
                             where p.index_relid = c.oid)",
    )
    .bind(name)
    .fetch_optional(pool)
    .await?;
    let Some(index) = invalid else {
        return Ok(false);
    };
    tracing::warn!(
        %index,
        "{name} is invalid (a concurrent build of it failed); dropping it and building it again"
    );
    // the name is the catalog's own, quoted by `regclass`
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("drop index if exists {index}")))
        .execute(pool)
        .await?;
    Ok(true)
}

#[doc(hidden)]
pub mod __private {
    pub use serde_json;
}
