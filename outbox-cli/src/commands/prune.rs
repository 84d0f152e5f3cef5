//! `outbox prune`: delete published rows (and dedupe rows) past their retention, paced.

use std::process::ExitCode;

use outbox_runtime::retention;

use crate::args::{hours, PruneArgs};
use crate::connect;
use crate::error::Result;

pub async fn run(args: PruneArgs) -> Result<ExitCode> {
    let pool = connect::pool(&args.db, 1).await?;
    // both keeps are checked before any row is deleted
    let keep = hours(args.keep_hours, "keep-hours")?;
    let keep_dedupe = args
        .keep_dedupe_hours
        .map(|h| hours(h, "keep-dedupe-hours").map(|keep| (h, keep)))
        .transpose()?;
    if args.dry_run {
        let n = retention::count_prunable(&pool, keep).await?;
        println!(
            "would delete {n} published row(s) older than {}h (dry run)",
            args.keep_hours
        );
        return Ok(ExitCode::SUCCESS);
    }
    let (batch, busy) = (args.batch_size, args.busy_percent);
    let n = retention::prune_published_paced(&pool, keep, batch, busy).await?;
    println!(
        "deleted {n} published row(s) older than {}h",
        args.keep_hours
    );
    if let Some((h, keep)) = keep_dedupe {
        let n = retention::prune_dedupe_paced(&pool, keep, batch, busy).await?;
        println!("deleted {n} dedupe row(s) older than {h}h");
    }
    Ok(ExitCode::SUCCESS)
}
