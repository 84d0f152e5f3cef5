//! `outbox`: run, watch and repair a service's transactional outbox.
//!
//! Every command reads `DATABASE_URL` / `NATS_URL` (and the NATS credential variables) from the
//! environment or flags; `outbox <command> --help` says what each does. The flags are in
//! `args/`, each command's work in `commands/`, what they print in `render.rs`.

mod args;
mod commands;
mod connect;
mod error;
mod probes;
mod recorder;
mod render;
mod telemetry;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command, LogFormat, StreamCommand};
use commands::{
    asyncapi, check, gen, lock, migrate, prune, relay, status, stream, tail, unblock, verify,
};
use error::Result;
use telemetry::Telemetry;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let format = cli.log_format;
    // only the relay, a long-running process, exports spans and metrics
    let export = matches!(cli.command, Command::Relay(_));
    let telemetry = match telemetry::init(format, export) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            fail(format, &e.to_string());
            return ExitCode::from(2);
        }
    };
    let code = match runtime.block_on(run(cli.command, &telemetry)) {
        Ok(code) => code,
        Err(e) => {
            fail(format, &e.to_string());
            ExitCode::from(2)
        }
    };
    // tasks still running (the probes' listener) end here; a blocking task stuck on a dead
    // connection does not hold the exit up past a second
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    // outside the runtime: the exporters send from threads of their own
    telemetry.shutdown();
    code
}

/// Says why the command failed: `error: ...` on stderr, or a JSON log line in that format.
fn fail(format: LogFormat, error: &str) {
    match format {
        LogFormat::Text => eprintln!("error: {error}"),
        LogFormat::Json => tracing::error!(error, "the command failed"),
    }
}

/// Runs one command; its exit status, or the error that makes it exit 2.
async fn run(command: Command, telemetry: &Telemetry) -> Result<ExitCode> {
    match command {
        Command::Migrate { db } => migrate::run(db).await,
        Command::Relay(args) => relay::run(args, telemetry).await,
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
