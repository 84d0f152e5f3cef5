//! `outbox`: run, watch and repair a service's transactional outbox.
//!
//! Every command reads `DATABASE_URL` / `NATS_URL` (and the NATS credential variables) from the
//! environment or flags; `outbox <command> --help` says what each does. The flags are in
//! `args/`, each command's work in `commands/`, what they print in `render.rs`.

mod args;
mod commands;
mod connect;
mod error;
mod render;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command, StreamCommand};
use commands::{
    asyncapi, check, gen, lock, migrate, prune, relay, status, stream, tail, unblock, verify,
};
use error::Result;

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
    match runtime.block_on(run(cli.command)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs one command; its exit status, or the error that makes it exit 2.
async fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Migrate { db } => migrate::run(db).await,
        Command::Relay(args) => relay::run(args).await,
        Command::Status(args) => status::run(args).await,
        Command::Check(args) => Ok(check::run(&args)),
        Command::Lock(args) => Ok(lock::run(&args)),
        Command::Gen(args) => gen::run(args),
        Command::Asyncapi(args) => asyncapi::run(args),
        Command::Tail(args) => tail::run(args).await,
        Command::Unblock(args) => unblock::run(args).await,
        Command::Prune(args) => prune::run(args).await,
        Command::Stream(StreamCommand::Ensure(args)) => stream::ensure(args).await,
        Command::Verify(args) => verify::run(args).await,
    }
}
