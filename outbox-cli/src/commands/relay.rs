//! `outbox relay`: run the relay until SIGINT or SIGTERM, with metrics, probes, a progress
//! line, and spans and metrics over OTLP when the `OTEL_*` variables ask for them.
//!
//! It waits for servers that cannot be reached at start ([`start`]), so that a relay started
//! before them, or during their outage, comes up with them.
//!
//! On SIGTERM (or SIGINT) it stops claiming, finishes the batches in progress and gives the
//! relay lease up: within `RelayConfig::shutdown_bound` (`ack_timeout + 20 s`), after which it exits 1
//! without waiting further (the rows of an unfinished batch stay unpublished and go out
//! again later, as after a crash). Sending what the exporters hold takes at most 5 s more
//! ([`FLUSH_TIMEOUT`](crate::telemetry::FLUSH_TIMEOUT)), so the process ends within
//! `ack_timeout + 25 s` of the signal: 30 s with the defaults.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use outbox_runtime::{Relay, RelayConfig};

use crate::args::{renamed, secs, DbArgs, NatsArgs, RelayArgs};
use crate::error::{CliError, Result};
use crate::probes::{self, Probes};
use crate::recorder::Recorders;
use crate::telemetry::Telemetry;
use crate::{connect, render};

pub async fn run(args: RelayArgs, telemetry: &Telemetry) -> Result<ExitCode> {
    let config = RelayConfig {
        batch_size: args.batch_size,
        lanes: args.lanes,
        max_attempts: args.max_attempts,
        backoff_base: secs(args.backoff_base, "backoff-base")?,
        backoff_max: secs(args.backoff_max, "backoff-max")?,
        poll_interval: secs(args.poll_interval, "poll-interval")?,
        ack_timeout: secs(args.ack_timeout, "ack-timeout")?,
        event_types: renamed(args.event_types, args.subject, "event-type", "subject"),
        ..RelayConfig::default()
    };
    let probes = Arc::new(Probes::default());
    let prometheus = match args.metrics_addr {
        Some(addr) => {
            let recorder = prometheus_builder()
                .map_err(|source| CliError::Metrics { addr, source })?
                .build_recorder();
            probes::serve(addr, recorder.handle(), probes.clone()).await?;
            tracing::info!(%addr, "serving /metrics (Prometheus), /healthz and /readyz");
            Some(recorder)
        }
        None => None,
    };
    let recorders = Recorders {
        prometheus,
        #[cfg(feature = "opentelemetry")]
        otel: telemetry
            .meter()
            .map(crate::recorder::otel::OtelRecorder::new),
    };
    recorders.install();
    if telemetry.exports_traces() {
        tracing::info!("sending the publish spans over OTLP");
    }
    let bound = config.shutdown_bound();
    let signal = shutdown_signal();
    tokio::pin!(signal);
    let relay = tokio::select! {
        relay = start(&args.db, &args.nats, config) => Arc::new(relay?),
        () = &mut signal => {
            tracing::info!("stopped before the relay started");
            return Ok(ExitCode::SUCCESS);
        }
    };
    probes.started(relay.clone());
    let signalled = tokio::sync::Notify::new();
    let shutdown = async {
        signal.await;
        probes.stopping();
        signalled.notify_one();
        tracing::info!(?bound, "stopping: finishing the batch in progress");
    };
    // past the bound the process exits without the relay's word: what a crash would leave
    let deadline = async {
        signalled.notified().await;
        tokio::time::sleep(bound).await;
    };
    tokio::select! {
        result = relay.run(shutdown) => result?,
        _ = progress(&relay) => {}
        () = deadline => {
            tracing::error!(?bound, "the relay did not stop in time; exiting: the rows of its unfinished batches stay unpublished and go out again later");
            return Ok(ExitCode::from(1));
        }
    }
    if std::io::stderr().is_terminal() {
        // ends the progress line
        eprintln!();
    }
    tracing::info!("relay stopped cleanly");
    Ok(ExitCode::SUCCESS)
}

/// The first wait between start attempts while Postgres or NATS cannot be reached; it doubles
/// up to [`START_RETRY_MAX`].
const START_RETRY_MIN: Duration = Duration::from_secs(1);
/// The longest wait between start attempts: short, so that a relay started during an outage
/// publishes within seconds of its end (the attempts are cheap: a connection to each server).
const START_RETRY_MAX: Duration = Duration::from_secs(5);

/// Connects and runs the relay's start-up checks, again and again while a server cannot be
/// reached or Postgres is not accepting connections yet (it is starting, recovering, or has
/// no connection slot left): a relay started before its servers, or during their outage, comes
/// up with them instead of exiting. Each failed attempt is a warning naming the server and why.
/// Anything else (a refused login, TLS, a missing table or stream, a configuration error) ends
/// the command at once: waiting would not change it.
async fn start(db: &DbArgs, nats: &NatsArgs, config: RelayConfig) -> Result<Relay> {
    let (database_url, nats_url) = (&db.database_url, &nats.nats_url);
    let auth = connect::nats_auth(nats);
    let mut wait = START_RETRY_MIN;
    loop {
        match Relay::connect_with(database_url, nats_url, &auth, config.clone()).await {
            Ok(relay) => return Ok(relay),
            Err(e) if worth_retrying(&e) => {
                let error = match e {
                    // the start-up checks' statements: Postgres starting, out of connections
                    e @ outbox_runtime::Error::Database(_) => CliError::postgres(database_url, e),
                    e => CliError::relay_start(database_url, nats_url, e),
                };
                tracing::warn!(retry_in = ?wait, "{error}");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(START_RETRY_MAX);
            }
            Err(e) => return Err(CliError::relay_start(database_url, nats_url, e)),
        }
    }
}

/// Whether a start attempt that failed with `error` may succeed later without anyone changing
/// anything: a server that does not answer, a NATS server whose JetStream does not answer yet
/// (a cluster electing its leaders), or a Postgres error of the kind
/// [`is_transient`](outbox_runtime::consumer::is_transient) names (the connection lost,
/// `57P03` starting up, too many connections).
fn worth_retrying(error: &outbox_runtime::Error) -> bool {
    use outbox_runtime::Error;
    match error {
        Error::Unreachable { .. } => true,
        // an answer with an error (the account has no JetStream) is no reason to wait
        Error::JetStream { source, .. } => source.is_some(),
        e => outbox_runtime::consumer::is_transient(e),
    }
}

/// A Prometheus exporter with the buckets of every histogram the runtime records
/// (`outbox_runtime::metrics::histogram_buckets`), so that they are exported as histograms
/// rather than summaries.
fn prometheus_builder() -> Result<PrometheusBuilder, metrics_exporter_prometheus::BuildError> {
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in outbox_runtime::metrics::histogram_buckets() {
        builder = builder.set_buckets_for_metric(Matcher::Full((*name).to_owned()), buckets)?;
    }
    Ok(builder)
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called, not when the
/// future is first polled, so a signal that arrives while the relay starts or runs its first
/// batch still stops it cleanly instead of killing the process.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let interrupt = signal(SignalKind::interrupt()).ok();
        let terminate = signal(SignalKind::terminate()).ok();
        async move {
            // a handler that could not be installed never fires
            let recv = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = recv(interrupt) => {}
                _ = recv(terminate) => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Once a second on a terminal (every 10 s as a log line otherwise): published/s, backlog and
/// the oldest unpublished age. Never returns.
async fn progress(relay: &Relay) {
    let tty = std::io::stderr().is_terminal();
    let every = if tty {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(10)
    };
    let mut last = (Instant::now(), relay.stats().published);
    loop {
        tokio::time::sleep(every).await;
        let max_attempts = relay.config().max_attempts;
        // the relay refreshes the gauges itself; this only reads the numbers for the line
        let Ok(s) = outbox_runtime::status::status(relay.pool(), max_attempts).await else {
            continue;
        };
        let (now, published) = (Instant::now(), relay.stats().published);
        let rate =
            published.saturating_sub(last.1) as f64 / now.duration_since(last.0).as_secs_f64();
        last = (now, published);
        let line = format!(
            "published/s {rate:>8.0}   backlog {:>8}   oldest unpublished {:>7}   at cap {}",
            s.unpublished,
            render::age(s.oldest_unpublished_age),
            s.at_cap
        );
        if tty {
            eprint!("\r{line}");
        } else {
            tracing::info!(
                published_per_second = rate,
                backlog = s.unpublished,
                oldest_unpublished_seconds = s.oldest_unpublished_age.map(|a| a.as_secs_f64()),
                at_cap = s.at_cap,
                "{line}"
            );
        }
    }
}
