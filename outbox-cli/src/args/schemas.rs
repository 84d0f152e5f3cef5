//! The flags of the commands on a schemas folder: `check`, `lock` and `gen`.

use std::path::PathBuf;

use clap::Args;
use outbox_codegen::evolution::{Level, Mode};

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The schemas folder.
    #[arg(default_value = "schemas/events")]
    pub dir: PathBuf,
    #[command(flatten)]
    pub gate: GateArgs,
}

#[derive(Debug, Args)]
pub struct LockArgs {
    /// The schemas folder.
    #[arg(default_value = "schemas/events")]
    pub dir: PathBuf,
    /// Lock this type even though it breaks its released schema (repeatable). For a type whose
    /// schema is gone, drops it from the lock.
    #[arg(long, value_name = "TYPE")]
    pub allow_breaking: Vec<String>,
    #[command(flatten)]
    pub gate: GateArgs,
}

#[derive(Debug, Args)]
pub struct GenArgs {
    /// The schemas folder.
    #[arg(default_value = "schemas/events")]
    pub dir: PathBuf,
    /// The service name (the envelopes' `source`).
    #[arg(long, default_value = "service")]
    pub source: String,
    /// Event types this service only consumes (NATS-style patterns, repeatable).
    #[arg(long)]
    pub consumes: Vec<String>,
}

/// The schema evolution gate's settings (as `outbox_codegen::Config` has them in build.rs).
#[derive(Debug, Args)]
pub struct GateArgs {
    /// The lock file [default: beside the folder, named after it: schemas/events.lock].
    #[arg(long)]
    pub lock: Option<PathBuf>,
    /// `rust` checks the wire rules and the rules that protect generated Rust code; `wire`
    /// only the first.
    #[arg(long, default_value = "rust")]
    pub level: Level,
    /// The compatibility mode of every type (`backward`, `forward` or `full`) [default: the
    /// mode each type has in the lock; `full` for new types].
    #[arg(long)]
    pub compatibility: Option<Mode>,
    /// The mode of one type, as `TYPE=MODE` (repeatable); wins over --compatibility.
    #[arg(long, value_name = "TYPE=MODE", value_parser = type_mode)]
    pub compatibility_for: Vec<(String, Mode)>,
}

fn type_mode(s: &str) -> std::result::Result<(String, Mode), String> {
    let (event_type, mode) = s.split_once('=').ok_or_else(|| {
        format!("expected TYPE=MODE, like `billing.invoice.paid=backward`, got `{s}`")
    })?;
    Ok((event_type.to_owned(), mode.parse()?))
}

#[derive(Debug, Args)]
pub struct AsyncApiArgs {
    /// The schemas folder.
    #[arg(default_value = "schemas/events")]
    pub dir: PathBuf,
    /// The service name (the envelopes' `source`, as the build script sets it).
    #[arg(long, default_value = "service")]
    pub source: String,
    /// The JetStream stream that stores the events (e.g. BILLING).
    #[arg(long)]
    pub stream: String,
    /// The NATS server consumers connect to, as host[:port].
    #[arg(long, default_value = "localhost:4222")]
    pub server: String,
    /// The document's title [default: "<source> events"].
    #[arg(long)]
    pub title: Option<String>,
    /// The version of the contract the document describes (its `info.version`).
    #[arg(long, default_value = "1.0.0")]
    pub api_version: String,
    /// Event types this service only consumes (NATS-style patterns, repeatable): left out.
    #[arg(long)]
    pub consumes: Vec<String>,
    /// Write the document to this file instead of stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}
