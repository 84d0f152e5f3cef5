//! The relay's start-up checks (docs/relay.md, *Start-up checks*): each fails with an error
//! that names what is wrong and how to fix it.

use async_nats::connection::State;
use async_nats::jetstream;
use serde_json::Value;
use sqlx::PgPool;
use tokio::time::timeout;

use super::config::RelayConfig;
use crate::error::{Error, Result};
use crate::table::{OUTBOX_EVENTS, OUTBOX_RELAY_LEASE, OUTBOX_RETRIES, TRACE_CONTEXT_MIGRATION};

/// The pool allows a connection per lane and two for the lease, the gauges and the horizon's
/// samples, each held for a statement (the wake lock's and the `LISTEN` connection are opened
/// beside the pool).
pub(super) fn pool_size(pool: &PgPool, config: &RelayConfig) -> Result<()> {
    let connections = pool.options().get_max_connections() as usize;
    if connections < config.lanes + 2 {
        return Err(Error::Config(format!(
            "the relay's pool allows {connections} connections, and a relay with {} lanes needs at least {} (one per lane, and two for the lease, the gauges and the horizon's samples; RelayConfig::pool_size() gives {}): raise the pool's max_connections or lower RelayConfig::lanes",
            config.lanes,
            config.lanes + 2,
            config.pool_size()
        )));
    }
    Ok(())
}

/// The server's version, whether it is a standby, and whether the outbox table is partitioned
/// or has child tables (the name resolved as the relay's statements resolve it, through the
/// search path): one round trip.
const SERVER: &str = "select current_setting('server_version_num')::int, pg_is_in_recovery(), \
       c.relkind = 'p' or exists (select 1 from pg_inherits i where i.inhparent = c.oid) \
     from pg_class c where c.oid = 'outbox_events'::regclass::oid";

/// Postgres answers, is recent enough, and has the outbox table, the relay's retry
/// schedule and the relay lease; the outbox table is one plain table.
pub(super) async fn tables(pool: &PgPool) -> Result<()> {
    let target = || {
        let o = pool.connect_options();
        format!("{}:{}", o.get_host(), o.get_port())
    };
    let unreachable = |e: sqlx::Error| Error::unreachable("postgres", target(), e);
    for table in [OUTBOX_EVENTS, OUTBOX_RETRIES, OUTBOX_RELAY_LEASE] {
        // the table names are the crate's own constants, never input
        let probe = sqlx::AssertSqlSafe(format!("select 1 from {} limit 0", table.name));
        sqlx::query(probe).execute(pool).await.map_err(|e| {
            if super::is_connection_error(&e) {
                unreachable(e)
            } else {
                table.error(e)
            }
        })?;
    }
    let (version, standby, split): (i32, bool, bool) =
        sqlx::query_as(SERVER).fetch_one(pool).await.map_err(|e| {
            if super::is_connection_error(&e) {
                unreachable(e)
            } else {
                Error::Database(e)
            }
        })?;
    if version < 130_000 {
        return Err(Error::Config(format!(
            "Postgres {}.{} is too old for the relay, which needs 13 or later (pg_current_snapshot, incremental sorts)",
            version / 10_000,
            version % 10_000 / 100
        )));
    }
    if standby {
        // a failover's DNS may still point at the old primary, or not yet at the new one:
        // `outbox relay` waits (as for a server that does not answer) until this is the primary
        return Err(Error::unreachable(
            "postgres",
            target(),
            "the server is a standby (in recovery), which takes no writes, and the relay needs the primary",
        ));
    }
    if split {
        return Err(Error::Config(format!(
            "{} has partitions or child tables: the relay marks the rows it claimed by their ctid, which is unique within one table only, so it runs on one plain table; keep the table as the migrations create it, and delete spent rows with Retention (docs/operations.md, *Retention sizing*)",
            OUTBOX_EVENTS.name
        )));
    }
    Ok(())
}

/// The index the claim's cut probes per subject (migration 0012): without it each probe reads
/// the lane's unpublished rows from the start of the table, and a batch over a backlog runs
/// past its statement timeout, so the relay refuses to start rather than publish nothing.
pub(super) const SUBJECT_INDEX: &str = "outbox_events_unpublished_subject_idx";

/// [`SUBJECT_INDEX`] exists on the outbox table and is valid.
pub(super) async fn subject_index(pool: &PgPool) -> Result<()> {
    let mut conn = pool.acquire().await?;
    let (valid, statement) = crate::migrate::concurrent_index(&mut conn, SUBJECT_INDEX).await?;
    let problem = match valid {
        Some(true) => return Ok(()),
        Some(false) => "is not valid yet (a concurrent build still running, or one that failed)",
        None => "does not exist",
    };
    Err(Error::MissingIndex {
        index: SUBJECT_INDEX,
        problem,
        migration: "0012_outbox_unpublished_subject_idx.sql",
        statement,
    })
}

/// Whether the outbox table has the trace context columns of migration 0007; without them the
/// relay publishes as before, and says once (here, at start) that it carries no traces.
pub(super) async fn trace_columns(pool: &PgPool) -> Result<bool> {
    match sqlx::query(super::sql::TRACE_COLUMNS).execute(pool).await {
        Ok(_) => Ok(true),
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42703") => {
            tracing::warn!(
                table = OUTBOX_EVENTS.name,
                migration = TRACE_CONTEXT_MIGRATION,
                "outbox relay: the outbox table has no trace context columns (traceparent, tracestate), so traces will not be carried from the emitting request to consumers; apply migrations/{TRACE_CONTEXT_MIGRATION} (`outbox migrate`) to carry them"
            );
            Ok(false)
        }
        Err(e) => Err(OUTBOX_EVENTS.error(e)),
    }
}

/// NATS answers with JetStream enabled for this account.
pub(super) async fn jetstream(jetstream: &jetstream::Context, config: &RelayConfig) -> Result<()> {
    let client = jetstream.client();
    let info = client.server_info();
    let target = format!("{}:{}", info.host, info.port);
    let info_request = jetstream.request::<_, _, Value>("INFO", &b""[..]);
    match timeout(config.ack_timeout, info_request).await {
        Ok(Ok(answer)) => match answer.get("error") {
            Some(error) => Err(Error::JetStream {
                target,
                problem: format!("refuses this account: {error}"),
                source: None,
            }),
            None => Ok(()),
        },
        Ok(Err(e)) if client.connection_state() == State::Connected => Err(Error::JetStream {
            target,
            problem:
                "does not answer; is the server started with JetStream enabled (`nats-server -js`)?"
                    .into(),
            source: Some(Box::new(e)),
        }),
        Ok(Err(e)) => Err(Error::unreachable("nats", target, e)),
        Err(_) => Err(Error::unreachable(
            "nats",
            target,
            format!("no answer within {:?}", config.ack_timeout),
        )),
    }
}

/// A stream captures each of [`RelayConfig::event_types`], keeps what it acknowledges (no
/// [`unsafe_settings`](crate::unsafe_settings)), and has a duplicate window that covers
/// [`RelayConfig::retry_horizon`] (the stream check that follows at start warns about a
/// single replica, once per stream).
pub(super) async fn streams(jetstream: &jetstream::Context, config: &RelayConfig) -> Result<()> {
    let event_types = config.checked_event_types();
    if event_types.is_empty() {
        return Ok(());
    }
    let horizon = config.retry_horizon();
    for (name, info) in crate::stream::check_captures(jetstream, &event_types).await? {
        crate::stream::check_safe(&name, &info.config)?;
        if info.config.duplicate_window < horizon {
            return Err(Error::Stream {
                stream: name,
                reason: format!(
                    "duplicate window {:?} is shorter than the relay's retry horizon {:?} (ack_timeout + backoff_max + 15 s, RelayConfig::retry_horizon): a republished row could be stored twice; raise the stream's duplicate_window or lower backoff_max",
                    info.config.duplicate_window, horizon
                ),
            });
        }
    }
    Ok(())
}
