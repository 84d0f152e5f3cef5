//! `outbox verify`: is every row the table calls published in the stream?

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use chrono::Utc;
use outbox_runtime::verify::{self, Phase, VerifyEvent, VerifyOptions};

use crate::args::{secs, VerifyArgs};
use crate::connect;
use crate::error::Result;
use crate::render::{self, shown};

/// Runs `outbox verify`: 0 when every row of the range is in the stream, 1 when some are
/// missing or part of the range is outside retention, 2 on an error (from the caller).
pub async fn run(args: VerifyArgs) -> Result<ExitCode> {
    let to = args.to.unwrap_or_else(Utc::now);
    let mut options = VerifyOptions::new(args.stream.clone(), args.from, to);
    options.republish = args.republish;
    options.page_size = usize::try_from(args.page_size).unwrap_or(usize::MAX);
    options.lag = secs(args.lag, "lag")?;
    options.clock_skew = secs(args.clock_skew, "clock-skew")?;
    let pool = connect::pool(&args.db, 1).await?;
    let js = connect::jetstream(&args.nats).await?;
    let tty = std::io::stderr().is_terminal();
    let json = args.json;
    let report = verify::verify(&pool, &js, &options, |event| match event {
        VerifyEvent::Missing(row) if !json => println!(
            "missing {}  {}  subject {}  created {}  published {}",
            row.id,
            shown(&row.event_type),
            shown(&row.subject),
            row.created_at.to_rfc3339(),
            row.published_at.to_rfc3339()
        ),
        VerifyEvent::Progress(p) if tty => {
            let pass = match p.phase {
                Phase::Rows => "rows",
                _ => "rows not found near their publish time",
            };
            let percent = p.done as f64 * 100.0 / p.total.max(1) as f64;
            eprint!(
                "\r{pass} {}/{} ({percent:.0}%)   messages read {}   missing {}   ",
                p.done, p.total, p.messages_read, p.missing
            );
            let _ = std::io::stderr().flush();
        }
        _ => {}
    })
    .await?;
    if tty {
        eprintln!();
    }
    if json {
        let mut v = serde_json::to_value(&report)?;
        v["gaps"] = serde_json::json!(report.gaps());
        v["all_present"] = serde_json::json!(report.all_present());
        println!("{v:#}");
    } else {
        print!("{}", render::verify(&report, args.republish));
    }
    Ok(if report.all_present() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
