//! The relay: the loop that moves committed rows from `outbox_events` to JetStream.
//!
//! A batch is one short transaction: [`Relay::claim`] locks up to
//! [`RelayConfig::batch_size`] unpublished rows (`for update skip locked`, plus an advisory
//! lock on each row's subject partition), [`Claim::publish`] sends them to JetStream, each
//! subject's rows one after the other and all subjects at once, under one deadline, and
//! [`Claim::commit`] marks the acknowledged rows `published_at` and the failed ones
//! `attempts + 1`, then commits. Nothing is marked without an ack.
//!
//! [`Relay::run`] runs batches in [`RelayConfig::lanes`] loops until shutdown, woken by the
//! emits' notifications, with a fallback poll; failures back off per subject, and a row at
//! [`RelayConfig::max_attempts`] holds its subject until an operator resets it.
//!
//! The guarantees, and the behaviour in every case (order across relays, lanes, backoff, the
//! attempt cap, wake-up, failures and shutdown, the start-up checks), are specified in the
//! repository's `docs/relay.md`; the measurements behind the choices are in
//! `docs/performance.md`.

mod backoff;
mod checks;
mod claim;
mod config;
mod lanes;
mod listen;
mod message;
mod publish;
mod row;
mod run;
mod sql;
mod stats;

use std::fmt;
use std::time::Duration;

use async_nats::jetstream;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::time::Instant;
use uuid::Uuid;

pub use claim::Claim;
pub use config::RelayConfig;
pub use stats::{BatchReport, RelayStats};

use crate::error::{Error, Result};
use crate::redact;
use crate::table::OUTBOX_EVENTS;

/// First key of the relay's advisory locks (`pg_try_advisory_xact_lock(LOCK_NAMESPACE, partition)`),
/// so that they do not collide with the application's own advisory locks.
pub const LOCK_NAMESPACE: i32 = 0x6f62_7872;

/// An unpublished row that reached the attempt cap, as [`Relay::capped`] lists it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct CappedEvent {
    /// The event id.
    pub id: Uuid,
    /// The event type (NATS subject).
    pub event_type: String,
    /// The held subject.
    pub subject: String,
    /// Attempts so far.
    pub attempts: i32,
    /// When it was emitted.
    pub created_at: DateTime<Utc>,
}

/// The publisher loop of the outbox. See the [module docs](self) for its behaviour.
///
/// ```no_run
/// # async fn run() -> outbox_runtime::Result<()> {
/// use outbox_runtime::{Relay, RelayConfig};
///
/// let relay = Relay::connect(
///     "postgres://root@127.0.0.1/test",
///     "nats://127.0.0.1:4222",
///     RelayConfig { subjects: vec!["billing.invoice.paid".into()], ..Default::default() },
/// )
/// .await?;
/// relay.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
/// # Ok(()) }
/// ```
pub struct Relay {
    pool: PgPool,
    jetstream: jetstream::Context,
    config: RelayConfig,
    backoff: backoff::SubjectBackoff,
    counters: stats::Counters,
    sharing: lanes::Sharing,
}

impl fmt::Debug for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("config", &self.config)
            .field("stats", &self.counters.snapshot())
            .finish_non_exhaustive()
    }
}

fn is_connection_error(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
    )
}

impl Relay {
    /// Connects to Postgres and NATS, then runs the start-up checks of [`Relay::new`].
    ///
    /// An address where nothing answers fails with [`Error::Unreachable`].
    ///
    /// ```no_run
    /// # async fn run() -> outbox_runtime::Result<()> {
    /// let relay = outbox_runtime::Relay::connect(
    ///     "postgres://root@127.0.0.1/test",
    ///     "nats://127.0.0.1:4222",
    ///     Default::default(),
    /// )
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(database_url: &str, nats_url: &str, config: RelayConfig) -> Result<Relay> {
        config.validate()?;
        let pool = PgPoolOptions::new()
            .max_connections(config.pool_size())
            .acquire_timeout(config.ack_timeout.max(Duration::from_secs(5)))
            .connect(database_url)
            .await
            .map_err(|e| {
                if is_connection_error(&e) {
                    let reason = redact::password_in(&e.to_string(), database_url);
                    Error::unreachable("postgres", redact::url(database_url), reason)
                } else {
                    Error::Database(e)
                }
            })?;
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(config.ack_timeout.max(Duration::from_secs(5)))
            .connect(nats_url)
            .await
            .map_err(|e| Error::unreachable("nats", redact::url(nats_url), e))?;
        Relay::new(pool, jetstream::new(client), config).await
    }

    /// A relay on `pool` publishing through `jetstream`, after checking that it can work: the
    /// configuration is valid, the pool allows a connection per lane and one for `LISTEN`
    /// ([`RelayConfig::lanes`] + 1), Postgres answers and has the outbox table, NATS answers with
    /// JetStream enabled, and a stream with a long enough duplicate window captures each of
    /// [`RelayConfig::subjects`].
    ///
    /// ```no_run
    /// # async fn run(pool: sqlx::PgPool, client: async_nats::Client) -> outbox_runtime::Result<()> {
    /// let relay = outbox_runtime::Relay::new(
    ///     pool,
    ///     async_nats::jetstream::new(client),
    ///     outbox_runtime::RelayConfig::default(),
    /// )
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub async fn new(
        pool: PgPool,
        jetstream: jetstream::Context,
        config: RelayConfig,
    ) -> Result<Relay> {
        config.validate()?;
        checks::pool_size(&pool, &config)?;
        checks::table(&pool).await?;
        checks::jetstream(&jetstream, &config).await?;
        checks::streams(&jetstream, &config).await?;
        Ok(Relay {
            pool,
            jetstream,
            config,
            backoff: backoff::SubjectBackoff::default(),
            counters: stats::Counters::default(),
            sharing: lanes::Sharing::default(),
        })
    }

    /// The relay's configuration.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// Totals since the relay was created.
    pub fn stats(&self) -> RelayStats {
        self.counters.snapshot()
    }

    /// The subjects this relay is currently backing off, with their consecutive failures.
    pub fn backed_off(&self) -> Vec<(String, u32)> {
        self.backoff.backed_off(Instant::now())
    }

    /// The unpublished rows at the attempt cap, oldest first: each holds its subject.
    ///
    /// ```no_run
    /// # async fn run(relay: outbox_runtime::Relay) -> outbox_runtime::Result<()> {
    /// for event in relay.capped().await? {
    ///     eprintln!("{} ({}) is stuck after {} attempts", event.id, event.event_type, event.attempts);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn capped(&self) -> Result<Vec<CappedEvent>> {
        sqlx::query_as(sql::CAPPED)
            .bind(self.config.max_attempts)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| OUTBOX_EVENTS.error(e))
    }

    /// Claims a batch: the first step of [`run_once`](Self::run_once), for callers that drive
    /// the steps themselves. It claims from every partition, whatever
    /// [`RelayConfig::lanes`] says.
    ///
    /// ```no_run
    /// # async fn run(relay: outbox_runtime::Relay) -> outbox_runtime::Result<()> {
    /// let mut claim = relay.claim().await?;
    /// claim.publish().await;
    /// let report = claim.commit().await?;
    /// println!("published {}", report.published);
    /// # Ok(()) }
    /// ```
    pub async fn claim(&self) -> Result<Claim<'_>> {
        self.claim_lane(lanes::Lane::ALL).await
    }

    async fn claim_lane(&self, lane: lanes::Lane) -> Result<Claim<'_>> {
        let tx = self
            .pool
            .begin()
            .await
            .map_err(|e| OUTBOX_EVENTS.error(e))?;
        Claim::begin(self, tx, lane).await
    }

    /// One batch: claim, publish, mark, commit. Like [`claim`](Self::claim), it claims from
    /// every partition.
    ///
    /// ```no_run
    /// # async fn run(relay: outbox_runtime::Relay) -> outbox_runtime::Result<()> {
    /// while relay.run_once().await?.claimed > 0 {}
    /// # Ok(()) }
    /// ```
    pub async fn run_once(&self) -> Result<BatchReport> {
        let mut claim = self.claim().await?;
        if claim.is_empty() {
            return claim.release().await;
        }
        claim.publish().await;
        claim.commit().await
    }
}
