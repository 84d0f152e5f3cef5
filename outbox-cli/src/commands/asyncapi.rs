//! `outbox asyncapi`: write the AsyncAPI 3.0 document of a schemas folder
//! ([`outbox_codegen::AsyncApi`] does the work).

use std::process::ExitCode;

use crate::args::AsyncApiArgs;
use crate::error::{CliError, Result};

pub fn run(args: AsyncApiArgs) -> Result<ExitCode> {
    let mut api = outbox_codegen::AsyncApi::new(args.source, args.stream);
    api.server(args.server)
        .version(args.api_version)
        .consumes(args.consumes);
    if let Some(title) = args.title {
        api.title(title);
    }
    let document = api.generate(&args.dir)?;
    match args.output {
        Some(path) => std::fs::write(&path, document).map_err(|source| CliError::Write {
            path: path.clone(),
            source,
        })?,
        None => print!("{document}"),
    }
    Ok(ExitCode::SUCCESS)
}
