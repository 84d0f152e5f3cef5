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
