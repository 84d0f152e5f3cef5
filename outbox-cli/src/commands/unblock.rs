//! `outbox unblock`: let held rows publish again.

use std::process::ExitCode;

use outbox_runtime::status::Unblock;

use crate::args::UnblockArgs;
use crate::connect;
use crate::error::Result;

pub async fn run(args: UnblockArgs) -> Result<ExitCode> {
    let pool = connect::pool(&args.db, 1).await?;
    let which = if !args.id.is_empty() {
        Unblock::Ids(args.id)
    } else if let Some(t) = args.event_type {
        Unblock::EventType(t)
    } else if let Some(s) = args.subject {
        Unblock::Subject(s)
    } else {
        Unblock::All
    };
    let ids = outbox_runtime::status::unblock(&pool, &which, args.max_attempts).await?;
    for id in &ids {
        println!("unblocked {id}");
    }
    println!("{} row(s) will be published again", ids.len());
    Ok(ExitCode::SUCCESS)
}
