//! The flags of the commands on the JetStream stream: `stream ensure` and `tail`.

use clap::Args;
use outbox_runtime::StreamSpec;

use super::NatsArgs;

#[derive(Debug, Args)]
pub struct EnsureArgs {
    #[command(flatten)]
    pub nats: NatsArgs,
    /// Stream name.
    #[arg(long, default_value = "OUTBOX")]
    pub name: String,
    /// Event types it captures (or wildcards such as `billing.>`; repeatable).
    #[arg(
        long = "event-type",
        value_name = "EVENT_TYPE",
        required_unless_present = "subject"
    )]
    pub event_types: Vec<String>,
    /// The old name of --event-type (deprecated: it goes in the next release).
    #[arg(long = "subject", value_name = "EVENT_TYPE", hide = true)]
    pub subject: Vec<String>,
    /// Duplicate window in seconds; must cover the relay's retry horizon.
    #[arg(long, default_value_t = StreamSpec::default().duplicate_window.as_secs())]
    pub duplicate_window: u64,
    /// Keep messages in memory instead of files.
    #[arg(long)]
    pub memory: bool,
    /// Replicas in a JetStream cluster: 3 in production (one warns that a single replica
    /// can lose acknowledged messages in a crash).
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    /// Print, after the check, the permissions the relay's NATS user needs to publish into
    /// this stream (a `permissions` block for the server's configuration).
    #[arg(long)]
    pub print_permissions: bool,
}

#[derive(Debug, Args)]
pub struct TailArgs {
    #[command(flatten)]
    pub nats: NatsArgs,
    /// Event types (or wildcards such as `billing.>`) to follow.
    #[arg(required = true, value_name = "EVENT_TYPE")]
    pub event_types: Vec<String>,
    /// The stream to read (default: the one that captures the first event type).
    #[arg(long)]
    pub stream: Option<String>,
    /// Start from the first stored event instead of new ones.
    #[arg(long)]
    pub all: bool,
    /// Stop after this many events.
    #[arg(long)]
    pub count: Option<u64>,
}
