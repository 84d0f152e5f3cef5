//! `outbox check`: lint a schemas folder and run the schema evolution gate on it.

use std::path::Path;
use std::process::ExitCode;

use crate::args::{CheckArgs, GateArgs};

pub fn run(args: &CheckArgs) -> ExitCode {
    let checked = gate(&args.gate).check(&args.dir);
    for note in &checked.notes {
        println!("note: {note}");
    }
    problems(&args.dir, &checked.problems).unwrap_or_else(|| {
        println!("{}: ok", args.dir.display());
        ExitCode::SUCCESS
    })
}

/// The codegen's configuration for the gate's flags (as build.rs would set it).
pub fn gate(args: &GateArgs) -> outbox_codegen::Config {
    let mut config = outbox_codegen::Config::new();
    config.source("check").compatibility_level(args.level);
    if let Some(lock) = &args.lock {
        config.lock_file(lock);
    }
    if let Some(mode) = args.compatibility {
        config.compatibility(mode);
    }
    for (event_type, mode) in &args.compatibility_for {
        config.compatibility_for(event_type, *mode);
    }
    config
}

/// Prints `problems` and a count, and gives exit status 1; `None` when there are none.
pub fn problems(dir: &Path, problems: &[outbox_codegen::Error]) -> Option<ExitCode> {
    if problems.is_empty() {
        return None;
    }
    for p in problems {
        println!("{p}");
    }
    println!("{} problem(s) in {}", problems.len(), dir.display());
    Some(ExitCode::from(1))
}
