//! `outbox relay`: run the relay until SIGINT or SIGTERM, with metrics and a progress line.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use outbox_runtime::{Relay, RelayConfig};

use crate::args::{renamed, secs, RelayArgs};
use crate::error::{CliError, Result};
use crate::{connect, render};

pub async fn run(args: RelayArgs) -> Result<ExitCode> {
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
    if let Some(addr) = args.metrics_addr {
        prometheus_builder()
            .and_then(|builder| builder.with_http_listener(addr).install())
            .map_err(|source| CliError::Metrics { addr, source })?;
        tracing::info!(%addr, "serving Prometheus metrics");
    }
    let signal = shutdown_signal();
    let (database_url, nats_url) = (&args.db.database_url, &args.nats.nats_url);
    let auth = connect::nats_auth(&args.nats);
    let relay = Relay::connect_with(database_url, nats_url, &auth, config)
        .await
        .map_err(|e| CliError::relay_start(database_url, nats_url, e))?;
    let shutdown = async {
        signal.await;
        tracing::info!("stopping: finishing the batch in progress");
    };
    tokio::select! {
        result = relay.run(shutdown) => result?,
        _ = progress(&relay) => {}
    }
    eprintln!();
    tracing::info!("relay stopped cleanly");
    Ok(ExitCode::SUCCESS)
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
            tracing::info!("{line}");
        }
    }
}
