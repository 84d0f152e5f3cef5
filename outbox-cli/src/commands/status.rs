//! `outbox status`: the backlog, attempts and held rows, and the thresholds crossed.

use std::process::ExitCode;

use crate::args::StatusArgs;
use crate::error::Result;
use crate::{connect, render};

pub async fn run(args: StatusArgs) -> Result<ExitCode> {
    let pool = connect::pool(&args.db, 1).await?;
    let s = outbox_runtime::status::status(&pool, args.max_attempts).await?;
    let mut crossed = Vec::new();
    if let (Some(max), Some(age)) = (args.max_age, s.oldest_unpublished_age) {
        if age.as_secs_f64() > max {
            crossed.push(format!(
                "oldest unpublished event is {:.1}s old (max {max}s)",
                age.as_secs_f64()
            ));
        }
    }
    if let Some(max) = args.max_backlog.filter(|m| s.unpublished > *m) {
        crossed.push(format!("{} unpublished (max {max})", s.unpublished));
    }
    if let Some(max) = args.max_held.filter(|m| s.held_total > *m) {
        crossed.push(format!("{} row(s) held (max {max})", s.held_total));
    }
    if let Some(max) = args.max_at_cap.filter(|m| s.at_cap > *m) {
        crossed.push(format!(
            "{} row(s) at the attempt cap (max {max})",
            s.at_cap
        ));
    }
    if args.json {
        let mut v = serde_json::to_value(&s)?;
        v["thresholds_crossed"] = serde_json::json!(crossed);
        println!("{v:#}");
    } else {
        print!("{}", render::status(&s));
        for c in &crossed {
            println!("THRESHOLD: {c}");
        }
    }
    Ok(if crossed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
