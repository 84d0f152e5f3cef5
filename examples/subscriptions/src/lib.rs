//! An example service built on the outbox: the contract's sequence diagram, end to end.
//!
//! - `POST /v1/subscriptions` inserts a subscription and emits `billing.subscription.created`
//!   in one transaction, then answers `201 Created`;
//! - `POST /v1/subscriptions/{id}/plan` and `POST /v1/subscriptions/{id}/cancel` do the same
//!   for `billing.subscription.plan_changed` and `billing.subscription.cancelled`;
//! - the relay runs as a worker task and publishes committed events to the `BILLING` stream;
//! - a consumer of `billing.subscription.created` records a "welcome" intent idempotently (it
//!   writes the intent in its own transaction; sending the email is another worker's job);
//!   a message that gives up goes to `billing.deadletter.welcome`;
//! - retention deletes published events and dedupe rows past their keep (7 and 14 days);
//! - `GET /metrics` serves Prometheus metrics, `GET /healthz` answers when the database does;
//! - every request runs in an `http.request` span; with the `opentelemetry` feature it continues
//!   the caller's `traceparent` header, and the events it emits carry its trace to the consumer
//!   (docs/tracing.md; install a `tracing_opentelemetry` layer to export the spans);
//! - SIGINT/SIGTERM stop it gracefully: requests drain, the relay finishes its batch.
//!
//! Invalid requests get a 4xx with a JSON body `{"error": "...", "detail": "..."}`, never a 500.
//!
//! Run it with `scripts/demo` (it starts Postgres and nats-server, drives the service with
//! curl and shows the event on the stream), or as `cargo run -p example-subscriptions` beside
//! your own services (`DATABASE_URL`, `NATS_URL`, `BIND`; defaults in [`Config::from_env`]).

pub mod api;
pub mod events;
pub mod welcome;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use outbox_runtime::consumer::{Consumer, ConsumerConfig};
use outbox_runtime::retention::{Retention, RetentionConfig};
use outbox_runtime::{Relay, RelayConfig, StreamSpec};
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

/// The stream the service's events go to.
pub const STREAM: &str = "BILLING";
/// The durable name of the welcome consumer (and its dedupe key).
pub const WELCOME_CONSUMER: &str = "billing-welcome";
/// Where the welcome consumer puts messages that gave up (captured by the `BILLING` stream's
/// `billing.>`; docs/consumers.md says how to retry one).
pub const WELCOME_DEAD_LETTER: &str = "billing.deadletter.welcome";

/// What the service needs to start, from the environment.
#[derive(Debug, Clone)]
pub struct Config {
    /// `DATABASE_URL` (default `postgres://root@127.0.0.1/test`).
    pub database_url: String,
    /// `NATS_URL` (default `nats://127.0.0.1:4222`).
    pub nats_url: String,
    /// `BIND` (default `127.0.0.1:3000`); port 0 picks a free one.
    pub bind: SocketAddr,
    /// The relay's settings.
    pub relay: RelayConfig,
}

/// Errors that stop the service from starting or running.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// The outbox failed (connection, migration, stream, relay).
    #[error(transparent)]
    Outbox(#[from] outbox_runtime::Error),
    /// A database error outside the outbox.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// Binding or serving HTTP failed.
    #[error("http: {0}")]
    Io(#[from] std::io::Error),
}

impl Config {
    /// Reads `DATABASE_URL`, `NATS_URL` and `BIND`.
    pub fn from_env() -> Result<Self, Error> {
        let var = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
        let bind = var("BIND", "127.0.0.1:3000");
        Ok(Self {
            database_url: var("DATABASE_URL", "postgres://root@127.0.0.1/test"),
            nats_url: var("NATS_URL", "nats://127.0.0.1:4222"),
            bind: bind
                .parse()
                .map_err(|e| Error::Config(format!("BIND `{bind}` is not an address: {e}")))?,
            relay: RelayConfig {
                event_types: events::EVENT_SCHEMAS
                    .iter()
                    .map(|(t, _)| (*t).to_owned())
                    .collect(),
                ..RelayConfig::default()
            },
        })
    }
}

/// The application's own tables (the outbox's come from `outbox_runtime::migrate`).
const SCHEMA: &str = "
create table if not exists subscriptions (
  id           uuid        primary key,
  customer_id  uuid        not null,
  plan         text        not null,
  seats        int         not null,
  status       text        not null default 'active',
  created_at   timestamptz not null default now()
);
create table if not exists welcome_intents (
  subscription_id uuid        primary key,
  customer_id     uuid        not null,
  event_id        uuid        not null,
  recorded_at     timestamptz not null default now()
)";

/// Creates the outbox's tables (`outbox_runtime::migrate`) and the service's own, when missing.
pub async fn migrate(pool: &sqlx::PgPool) -> Result<(), Error> {
    outbox_runtime::migrate(pool).await?;
    sqlx::raw_sql(SCHEMA).execute(pool).await?;
    Ok(())
}

/// The welcome consumer of [`start`], on `pool` and `js`.
pub fn welcome_consumer(
    pool: sqlx::PgPool,
    js: async_nats::jetstream::Context,
) -> Consumer<events::SubscriptionCreated, welcome::RecordWelcome> {
    let mut welcome = ConsumerConfig::new(WELCOME_CONSUMER, STREAM);
    welcome.dead_letter = Some(WELCOME_DEAD_LETTER.into());
    Consumer::new(pool, js, welcome, welcome::RecordWelcome)
}

/// A running service: its address, and how to stop it.
#[derive(Debug)]
pub struct Running {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), Error>>,
}

impl Running {
    /// Stops it gracefully and waits until every task has finished.
    pub async fn stop(self) -> Result<(), Error> {
        self.stop.cancel();
        self.task
            .await
            .map_err(|e| Error::Config(format!("service task failed: {e}")))?
    }
}

/// Starts the service (HTTP, relay, consumer) in the background.
pub async fn start(config: Config) -> Result<Running, Error> {
    // the error says why (unreachable, TLS, the login) and the fix, without the URL's secrets
    let pool = outbox_runtime::connect::postgres(
        &config.database_url,
        PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(5)),
    )
    .await?;
    migrate(&pool).await?;

    let client = async_nats::connect(&config.nats_url).await.map_err(|e| {
        Error::Config(format!(
            "cannot connect to NATS at {} ({e}); is nats-server running? (`scripts/services` starts one)",
            outbox_runtime::redact::url(&config.nats_url)
        ))
    })?;
    let js = async_nats::jetstream::new(client);
    StreamSpec::new(STREAM, ["billing.>"]).ensure(&js).await?;

    let relay = Relay::new(pool.clone(), js.clone(), config.relay.clone()).await?;
    let consumer = welcome_consumer(pool.clone(), js.clone());
    consumer.durable().await?;
    let retention = Retention::new(pool.clone(), RetentionConfig::default())?;

    let metrics = prometheus();
    let app = api::router(api::AppState { pool, metrics });
    let listener = tokio::net::TcpListener::bind(config.bind).await?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "subscriptions service listening");

    let stop = CancellationToken::new();
    let task = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let http =
                axum::serve(listener, app).with_graceful_shutdown(stop.clone().cancelled_owned());
            let (http, relay, consumer, ()) = tokio::join!(
                std::future::IntoFuture::into_future(http),
                relay.run(stop.clone().cancelled_owned()),
                consumer.run(stop.clone().cancelled_owned()),
                retention.run(stop.clone().cancelled_owned()),
            );
            http?;
            relay?;
            consumer?;
            Ok(())
        })
    };
    Ok(Running { addr, stop, task })
}

/// The process's Prometheus recorder, installed on first use (several services in one process,
/// as in the tests, share it). `None` when another recorder was installed before.
fn prometheus() -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    static HANDLE: std::sync::OnceLock<Option<metrics_exporter_prometheus::PrometheusHandle>> =
        std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
            // histograms with buckets, so that they aggregate across replicas
            let mut builder = PrometheusBuilder::new();
            for (name, buckets) in outbox_runtime::metrics::histogram_buckets() {
                builder = builder
                    .set_buckets_for_metric(Matcher::Full((*name).to_owned()), buckets)
                    .ok()?;
            }
            builder.install_recorder().ok()
        })
        .clone()
}

/// Runs the service until `shutdown` completes.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    let running = start(config).await?;
    shutdown.await;
    running.stop().await
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
