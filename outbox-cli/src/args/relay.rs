//! `outbox relay`'s flags: the connections and [`RelayConfig`]'s settings.

use clap::Args;
use outbox_runtime::RelayConfig;

use super::{DbArgs, NatsArgs};

#[derive(Debug, Args)]
pub struct RelayArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub nats: NatsArgs,
    /// Rows claimed per transaction.
    #[arg(long, default_value_t = RelayConfig::default().batch_size)]
    pub batch_size: usize,
    /// Batch loops run at once, each on its own share of the subject partitions.
    #[arg(long, default_value_t = RelayConfig::default().lanes)]
    pub lanes: usize,
    /// Publish attempts after which a row is left alone until unblocked.
    #[arg(long, default_value_t = RelayConfig::default().max_attempts)]
    pub max_attempts: i32,
    /// First backoff after a failure, in seconds (doubles per failure).
    #[arg(long, default_value_t = RelayConfig::default().backoff_base.as_secs_f64())]
    pub backoff_base: f64,
    /// Backoff ceiling, in seconds.
    #[arg(long, default_value_t = RelayConfig::default().backoff_max.as_secs_f64())]
    pub backoff_max: f64,
    /// Fallback poll interval, in seconds (the relay also wakes on every commit).
    #[arg(long, default_value_t = RelayConfig::default().poll_interval.as_secs_f64())]
    pub poll_interval: f64,
    /// Deadline for a batch's acks, in seconds.
    #[arg(long, default_value_t = RelayConfig::default().ack_timeout.as_secs_f64())]
    pub ack_timeout: f64,
    /// Serve /metrics (Prometheus), /healthz (liveness) and /readyz (readiness) on this
    /// address (e.g. 127.0.0.1:9187).
    #[arg(long)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Event types the relay must be able to publish: at start it checks that a stream
    /// captures each and that its duplicate window covers the retry horizon (repeatable).
    #[arg(long = "event-type", value_name = "EVENT_TYPE")]
    pub event_types: Vec<String>,
    /// The old name of --event-type (deprecated: it goes in the next release).
    #[arg(long = "subject", value_name = "EVENT_TYPE", hide = true)]
    pub subject: Vec<String>,
}
