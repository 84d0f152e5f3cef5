//! `outbox`: run, watch and repair a service's transactional outbox.
//!
//! Every command reads `DATABASE_URL` / `NATS_URL` (and the NATS credential variables) from the
//! environment or flags; `outbox <command> --help` says what each does.

mod commands;
mod connect;
mod verify;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

/// What went wrong, for a human (secrets already redacted).
#[derive(Debug)]
pub struct CliError(String);

impl CliError {
    /// An error from a message.
    pub fn msg(m: impl Into<String>) -> Self {
        CliError(m.into())
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<outbox_runtime::Error> for CliError {
    fn from(e: outbox_runtime::Error) -> Self {
        CliError(e.to_string())
    }
}

/// `Result` with the CLI's error.
pub type Result<T> = std::result::Result<T, CliError>;

/// Run, watch and repair a transactional outbox (Postgres `outbox_events` -> NATS JetStream).
#[derive(Debug, Parser)]
#[command(name = "outbox", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: commands::Command,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("OUTBOX_LOG").unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("info,typify_impl=warn,typify=warn")
            }),
        )
        .with_writer(std::io::stderr)
        // colour codes only on a terminal: a log file or a journal gets plain lines
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(commands::run(cli.command)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
