//! The command line: every subcommand's flags and arguments, as clap types (the work is in
//! `commands/`, one file a subcommand).

mod connection;
mod relay;
mod rows;
mod schemas;
mod stream;

use std::time::Duration;

use clap::{Parser, Subcommand};

pub use connection::{DbArgs, NatsArgs};
pub use relay::RelayArgs;
pub use rows::{PruneArgs, StatusArgs, UnblockArgs, VerifyArgs};
pub use schemas::{AsyncApiArgs, CheckArgs, GateArgs, GenArgs, LockArgs};
pub use stream::{EnsureArgs, TailArgs};

use crate::error::{CliError, Result};

/// Run, watch and repair a transactional outbox (Postgres `outbox_events` -> NATS JetStream).
#[derive(Debug, Parser)]
#[command(name = "outbox", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log lines as plain text, or as one JSON object a line (for a log pipeline).
    #[arg(
        long,
        global = true,
        value_enum,
        env = "OUTBOX_LOG_FORMAT",
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Plain lines (coloured on a terminal).
    Text,
    /// One JSON object a line: `timestamp`, `level`, `target`, `fields` (with `message`), and
    /// the current `span`.
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply the outbox migrations (the outbox table and the consumer dedupe tables).
    Migrate {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Run the relay: publish committed events to JetStream until SIGINT/SIGTERM.
    ///
    /// A relay started while Postgres or NATS cannot be reached waits for them, warning at each
    /// attempt (1 s apart, doubling up to 5 s); a refused login, TLS, a missing table or stream
    /// ends it at once with exit 2.
    Relay(RelayArgs),
    /// Show the backlog, the oldest unpublished event, attempts and capped rows.
    ///
    /// Exits 1 when a threshold given by --max-* is crossed, so it can back an alert.
    Status(StatusArgs),
    /// Lint a schemas folder with the codegen's rules and report every problem at once.
    ///
    /// Runs the schema evolution gate too, as the build does: every schema is compared with
    /// its released version in the lock file (written by `outbox lock`), and a breaking change
    /// is a problem. Compatible changes are notes. Exits 1 when there is a problem.
    Check(CheckArgs),
    /// Record the schemas of a folder as released, in its lock file.
    ///
    /// The lock holds every event type's schema (shared definitions inlined, keys sorted) and
    /// its compatibility mode; check it in. From then on the build and `outbox check` fail on
    /// a breaking change to a released type. A type with a breaking change is only locked
    /// again when named by `--allow-breaking`: do that once every consumer can take it, or
    /// publish the new shape as a new major type (`<event_type>.v2`) instead.
    Lock(LockArgs),
    /// Print the Rust the build script would generate for a schemas folder.
    Gen(GenArgs),
    /// Write the AsyncAPI 3.0 document of a schemas folder, for consumers in any language.
    ///
    /// One channel per event type (the NATS subject), on the stream's server; one message per
    /// type: the CloudEvents envelope, its headers and the event's schema, `$ref`s resolved as
    /// the build resolves them; the subject and the rules consumers must follow (dedupe on the
    /// id, order per subject) as descriptions. The same schemas give the same bytes.
    Asyncapi(AsyncApiArgs),
    /// Follow events on the stream and print their envelopes.
    Tail(TailArgs),
    /// Let capped rows publish again (attempts reset to 0, same id).
    Unblock(UnblockArgs),
    /// Delete published rows (and consumer dedupe rows) past their retention.
    Prune(PruneArgs),
    /// Manage the JetStream stream the relay publishes to.
    #[command(subcommand)]
    Stream(StreamCommand),
    /// Check that every row published in a time range is in the stream (by `Nats-Msg-Id`).
    ///
    /// Reports every published row missing from the stream; with --republish sets them
    /// unpublished again so the relay republishes them with their original ids. Reads rows
    /// and stream in pages, in bounded memory. Exits 0 when every row is there, 1 when rows
    /// are missing (republished or not) or the range reaches outside the stream's or the
    /// table's retention, 2 on an error.
    Verify(VerifyArgs),
}

#[derive(Debug, Subcommand)]
pub enum StreamCommand {
    /// Create the stream, or check that an existing one matches.
    Ensure(EnsureArgs),
}

/// `value` seconds given to `--flag`, as a duration.
pub fn secs(value: f64, flag: &'static str) -> Result<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| CliError::NotADuration {
        flag,
        unit: "seconds",
        value,
    })
}

/// `value` hours given to `--flag`, as a duration.
pub fn hours(value: f64, flag: &'static str) -> Result<Duration> {
    Duration::try_from_secs_f64(value * 3600.0).map_err(|_| CliError::NotADuration {
        flag,
        unit: "hours",
        value,
    })
}

/// The values of a renamed flag: the new name's, then the old name's, with a warning on
/// stderr when the old name was used (it goes in the next release).
pub fn renamed(
    mut new: Vec<String>,
    old: Vec<String>,
    new_name: &str,
    old_name: &str,
) -> Vec<String> {
    if !old.is_empty() {
        eprintln!(
            "warning: --{old_name} is deprecated and goes in the next release; use --{new_name} (a subject is an event's entity key)"
        );
        new.extend(old);
    }
    new
}
