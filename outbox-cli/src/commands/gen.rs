//! `outbox gen`: print the Rust a build script would generate.

use std::process::ExitCode;

use crate::args::GenArgs;
use crate::error::Result;

pub fn run(args: GenArgs) -> Result<ExitCode> {
    let code = outbox_codegen::Config::new()
        .source(args.source)
        .consumes(args.consumes)
        .generate(&args.dir)?;
    print!("{code}");
    Ok(ExitCode::SUCCESS)
}
