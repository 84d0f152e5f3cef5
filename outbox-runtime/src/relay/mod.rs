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
//! emits' notifications, with a fallback poll, while it holds the relay lease (one relay of a
//! table publishes at a time; the others stand by); failures back off per subject, and a row
//! at [`RelayConfig::max_attempts`] holds its subject until an operator releases it.
//!
//! The guarantees, and the behaviour in every case (order across relays, lanes, backoff, the
//! attempt cap, wake-up, failures and shutdown, the start-up checks), are specified in the
//! repository's `docs/relay.md`; the measurements behind the choices are in
//! `docs/performance.md`.

mod backoff;
mod checks;
mod claim;
mod config;
mod cursor;
mod elections;
mod failure;
mod held;
mod horizon;
mod lanes;
mod lease;
mod listen;
mod message;
mod position;
mod publish;
mod row;
mod run;
mod settle;
mod sql;
mod stats;
mod streams;
mod tx;
mod wake;

use std::fmt;
use std::time::Duration;

use async_nats::jetstream;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use uuid::Uuid;

pub use claim::Claim;
pub use config::RelayConfig;
pub use stats::{BatchReport, RelayHealth, RelayStats, STALLED_AFTER};

use crate::error::Result;
use crate::table::OUTBOX_RETRIES;

/// The batch's first statements (`begin`, then its settings, with a statement and lock timeout
/// and an idle timeout in milliseconds) and the main claim (`$1` limit, `$2` partitions, `$3`
/// lanes, `$4` lane, `$5`/`$6` the cursor, `$7`/`$8` the last position it may read or nulls,
/// `$9` paused subjects), verbatim. Shown for the tests that check the claim's plan.
#[doc(hidden)]
pub fn batch_settings(statement_ms: u128, idle_ms: u128) -> String {
    sql::begin_settings(statement_ms, idle_ms)
}
#[doc(hidden)]
pub const CLAIM_STATEMENT: &str = sql::CLAIM;
/// The cursor's window with the retry schedule's columns (`$1` partitions, `$2` lanes, `$3`
/// lane, `$4`/`$5` the cursor, `$6`/`$7` nulls, `$8` limit), verbatim.
#[doc(hidden)]
pub const WINDOW_STATEMENT: &str = sql::WINDOW;
/// The main claim with its cut at holes (the parameters of [`CLAIM_STATEMENT`]), verbatim.
#[doc(hidden)]
pub const CLAIM_CUT_STATEMENT: &str = sql::CLAIM_CUT;

/// First key of the relay's one advisory lock, the wake lock
/// ([`WAKE_KEY`](crate::WAKE_KEY)), so that it does not collide with the application's own
/// advisory locks.
pub const LOCK_NAMESPACE: i32 = 0x6f62_7872;

/// How long a relay first leaves out a subject it could not attempt (the broker could not take
/// it); it doubles while that goes on, up to [`PAUSE_MAX`], and a publish of the subject ends it.
const PAUSE_BASE: Duration = Duration::from_millis(250);
const PAUSE_MAX: Duration = Duration::from_secs(10);

/// A held row, as [`Relay::held`] lists it: it cannot be published as it is, and the later
/// events of its subject wait behind it until an operator releases it (`outbox unblock`).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct HeldEvent {
    /// The event id.
    pub id: Uuid,
    /// The event type (NATS subject), as the row has it.
    pub event_type: String,
    /// The held subject.
    pub subject: String,
    /// Attempts so far.
    pub attempts: i32,
    /// Why it is held: the broker's answer, or the relay's check that refused it.
    pub reason: String,
    /// When its subject was first parked.
    pub since: DateTime<Utc>,
    /// When it was emitted (`None` when the row's `created_at` is not a real instant).
    pub created_at: Option<DateTime<Utc>>,
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
///     RelayConfig { event_types: vec!["billing.invoice.paid".into()], ..Default::default() },
/// )
/// .await?;
/// relay.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
/// # Ok(()) }
/// ```
pub struct Relay {
    pool: PgPool,
    jetstream: jetstream::Context,
    config: RelayConfig,
    /// Subjects this relay leaves out of its claims for a few seconds after the broker could not
    /// take them ([`PAUSE_BASE`] doubling). A claim filter only: the cursor does not pass them.
    pauses: backoff::SubjectBackoff,
    /// The NATS client's connection count when the pauses were last looked at: a reconnect
    /// ends the pauses of the subjects the broker could not take.
    connects_seen: std::sync::atomic::AtomicU64,
    /// What the relay knows of the streams; shared with its housekeeping task.
    streams: std::sync::Arc<streams::Streams>,
    counters: stats::Counters,
    /// What [`Relay::health`] reports.
    health: std::sync::Arc<stats::Health>,
    /// The rows published over the last second, for the lanes' wake-up.
    recent: stats::Recent,
    /// The wake lock, for the lanes waiting for commits.
    waker: std::sync::Arc<wake::Waker>,
    /// The horizon the cursors stay behind, sampled as the batches ask.
    horizon: horizon::SharedHorizon,
    /// The cursor of [`Relay::claim`]'s batches (every partition).
    cursor: tokio::sync::Mutex<cursor::Cursor>,
    /// Whether the table has the trace context columns (migration 0007).
    trace_columns: bool,
}

impl fmt::Debug for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("config", &self.config)
            .field("stats", &self.counters.snapshot())
            .finish_non_exhaustive()
    }
}

/// Whether `e` says the connection failed rather than the statement: among them a protocol
/// error (the stream closed or garbled mid-message), after which the connection is unusable.
pub(crate) fn is_connection_error(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
    )
}

impl Relay {
    /// Connects to Postgres and NATS, then runs the start-up checks of [`Relay::new`]: as
    /// [`connect_with`](Self::connect_with) with no NATS login beyond the URL's.
    ///
    /// An address where nothing answers, or where a Postgres standby answers instead of the
    /// primary, fails with [`Error::Unreachable`](crate::Error::Unreachable), a failed TLS handshake or certificate
    /// check with [`Error::Tls`](crate::Error::Tls), a refused login with
    /// [`Error::Authentication`](crate::Error::Authentication) (see
    /// [`connect::postgres`](crate::connect::postgres) and
    /// [`connect::nats`](crate::connect::nats)). TLS to Postgres comes from the URL's
    /// `sslmode` and `sslrootcert`.
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
        Relay::connect_with(
            database_url,
            nats_url,
            &crate::connect::NatsAuth::default(),
            config,
        )
        .await
    }

    /// Connects to Postgres (a pool of [`RelayConfig::pool_size`]) and to NATS with `auth`'s
    /// login and TLS ([`NatsAuth`](crate::connect::NatsAuth): user and password, token, nkey,
    /// `.creds` file, CA, client certificate), then runs the start-up checks of
    /// [`Relay::new`]. `nats_url` may list a cluster's servers, comma separated. Failures are
    /// those of [`connect`](Self::connect); the `outbox relay` command starts its relay here.
    ///
    /// ```no_run
    /// # async fn run() -> outbox_runtime::Result<()> {
    /// use outbox_runtime::connect::NatsAuth;
    /// use outbox_runtime::{Relay, RelayConfig};
    ///
    /// let relay = Relay::connect_with(
    ///     "postgres://billing@db.internal/billing?sslmode=verify-full&sslrootcert=/etc/billing/db-ca.pem",
    ///     "tls://nats.internal:4222",
    ///     &NatsAuth::new().nkey(std::env::var("NATS_NKEY").unwrap_or_default()),
    ///     RelayConfig::default(),
    /// )
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_with(
        database_url: &str,
        nats_url: &str,
        auth: &crate::connect::NatsAuth,
        config: RelayConfig,
    ) -> Result<Relay> {
        config.validate()?;
        let timeout = config.ack_timeout.max(Duration::from_secs(5));
        let pool = crate::connect::postgres(
            database_url,
            PgPoolOptions::new()
                .max_connections(config.pool_size())
                .acquire_timeout(timeout),
        )
        .await?;
        let options = async_nats::ConnectOptions::new()
            .name("outbox relay")
            .connection_timeout(timeout);
        let client = crate::connect::nats(nats_url, auth, options).await?;
        Relay::new(pool, jetstream::new(client), config).await
    }

    /// A relay on `pool` publishing through `jetstream`, after checking that it can work: the
    /// configuration is valid, the pool allows a connection per lane and one for `LISTEN`
    /// ([`RelayConfig::lanes`] + 1), Postgres answers and has the outbox table, NATS answers with
    /// JetStream enabled, and a stream with a long enough duplicate window captures each of
    /// [`RelayConfig::event_types`]. A table without the trace context columns (migration 0007)
    /// is no error: the relay publishes without them and warns once.
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
        checks::tables(&pool).await?;
        checks::subject_index(&pool).await?;
        let trace_columns = checks::trace_columns(&pool).await?;
        checks::jetstream(&jetstream, &config).await?;
        checks::streams(&jetstream, &config).await?;
        let connects_seen = std::sync::atomic::AtomicU64::new(publish::connects(&jetstream));
        let elections = elections::Elections::listen(&jetstream.client()).await;
        Ok(Relay {
            pool,
            jetstream,
            connects_seen,
            pauses: backoff::SubjectBackoff::new(PAUSE_BASE, PAUSE_MAX),
            streams: std::sync::Arc::new(streams::Streams::new(elections)),
            counters: stats::Counters::default(),
            health: std::sync::Arc::new(stats::Health::new(config.lanes)),
            recent: stats::Recent::default(),
            waker: Default::default(),
            horizon: Default::default(),
            cursor: tokio::sync::Mutex::new(cursor::Cursor::new(tokio::time::Instant::now())),
            config,
            trace_columns,
        })
    }

    /// The relay's configuration.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// The pool the relay works on (the outbox table's database).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Whether this relay carries the trace context stored with each event: the outbox table
    /// has migration 0007's `traceparent` and `tracestate` columns (checked at start, which
    /// warns once when they are missing). See [`crate::trace`].
    ///
    /// ```no_run
    /// # async fn run(relay: outbox_runtime::Relay) {
    /// if !relay.carries_trace_context() {
    ///     eprintln!("apply migrations/0007_outbox_trace_context.sql to carry traces");
    /// }
    /// # }
    /// ```
    pub fn carries_trace_context(&self) -> bool {
        self.trace_columns
    }

    /// The subjects this relay's claims leave out at `now`: paused after not being attempted
    /// (pauses that ended over a minute ago are forgotten).
    fn paused(&self, now: tokio::time::Instant) -> Vec<String> {
        // subjects left out while the broker was unreachable are tried again as soon as the
        // client has reconnected, not when their pause (up to 10 s) ends
        let connects = publish::connects(&self.jetstream);
        let seen = self
            .connects_seen
            .swap(connects, std::sync::atomic::Ordering::Relaxed);
        if connects != seen {
            self.pauses.clear();
        }
        self.pauses.excluded(now, Duration::from_secs(60))
    }

    /// Whether this relay would take an ack of stream `name` that did not come as lost to a
    /// leader election within `window` (docs/relay.md, *Failures*): what the cluster tests
    /// check against elections they make.
    #[doc(hidden)]
    pub async fn stream_elected_within(&self, name: &str, window: Duration) -> bool {
        self.streams
            .elected_recently(&self.jetstream, name, window)
            .await
    }

    /// Totals since the relay was created.
    pub fn stats(&self) -> RelayStats {
        self.counters.snapshot()
    }

    /// How the relay is doing while [`run`](Self::run) runs: whether it holds the lease,
    /// reaches Postgres and NATS, and whether a lane's batches keep failing. What a readiness
    /// probe asks ([`RelayHealth::is_ready`]).
    ///
    /// ```no_run
    /// # fn probe(relay: &outbox_runtime::Relay) {
    /// let health = relay.health();
    /// if !health.is_ready() {
    ///     eprintln!("not ready: {health:?}");
    /// }
    /// # }
    /// ```
    pub fn health(&self) -> RelayHealth {
        self.health.snapshot()
    }

    /// The held rows, oldest first: each holds its subject, with the reason.
    ///
    /// ```no_run
    /// # async fn run(relay: outbox_runtime::Relay) -> outbox_runtime::Result<()> {
    /// for event in relay.held().await? {
    ///     eprintln!("{} ({}) is held: {}", event.id, event.event_type, event.reason);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn held(&self) -> Result<Vec<HeldEvent>> {
        sqlx::query_as(sql::HELD)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| OUTBOX_RETRIES.error(e))
    }

    /// Claims a batch: the first step of [`run_once`](Self::run_once), for callers that drive
    /// the steps themselves. It claims from every partition, whatever
    /// [`RelayConfig::lanes`] says, and whether or not this relay holds the lease (order does not
    /// rest on it: docs/relay.md, *Order*). It reads on past rows it cannot claim (a held
    /// subject's, however many): an empty claim means nothing can be claimed now.
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
        let mut cursor = self.cursor.lock().await;
        loop {
            let claim = Claim::begin(
                self,
                lanes::Lane::ALL,
                &mut cursor,
                Some(&self.cursor),
                None,
            )
            .await?;
            if !claim.reads_on() {
                return Ok(claim);
            }
            // a full window of rows it could not claim (a held subject's): the rows after it
            // may be claimable, and the next claim reads them (as a lane's next batch would)
            let effects = claim.release().await?;
            effects.apply(&mut cursor, tokio::time::Instant::now());
        }
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
            return Ok(claim.release().await?.report);
        }
        claim.publish().await;
        claim.commit().await
    }
}
