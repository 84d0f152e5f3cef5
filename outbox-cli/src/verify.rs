//! `outbox verify`: is every row the table calls published in the stream?

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Args;
use outbox_runtime::verify::{self, Phase, VerifyEvent, VerifyOptions, VerifyReport};

use crate::connect::{self, DbArgs, NatsArgs};
use crate::{CliError, Result};

/// `outbox verify`'s arguments.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    db: DbArgs,
    #[command(flatten)]
    nats: NatsArgs,
    /// The stream to compare with.
    #[arg(long, default_value = "OUTBOX")]
    stream: String,
    /// Rows published at or after this: an RFC 3339 time (`2026-05-01T00:00:00Z`) or an age
    /// (`90m`, `24h`, `7d`: that long ago). Keep it inside the stream's and the table's
    /// retention.
    #[arg(long, value_parser = when)]
    from: DateTime<Utc>,
    /// Rows published before this (a time or an age, as --from) [default: now].
    #[arg(long, value_parser = when)]
    to: Option<DateTime<Utc>>,
    /// Set the missing rows unpublished again (attempts 0, in one transaction), so that the
    /// relay publishes them again with their original ids. Rows published less than the
    /// stream's duplicate window ago are left (the stream would drop them as duplicates):
    /// run again later.
    #[arg(long)]
    republish: bool,
    /// Rows held in memory at once (and suspects per page of the second pass).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    page_size: u64,
    /// Seconds within which the relay usually marks a row after the stream stored it; rows
    /// not found within it are looked for again over the stream's duplicate window.
    #[arg(long, default_value_t = 2.0)]
    lag: f64,
    /// The largest difference between the NATS servers' and Postgres's clocks, in seconds.
    #[arg(long, default_value_t = 2.0)]
    clock_skew: f64,
    /// Print the report as JSON (the first 100 missing rows; the count is complete).
    #[arg(long)]
    json: bool,
}

/// A time: RFC 3339, or an age (`<n>s`, `<n>m`, `<n>h`, `<n>d`) before now.
fn when(s: &str) -> std::result::Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    let bad = || {
        format!(
            "expected an RFC 3339 time (2026-05-01T00:00:00Z) or an age (90m, 24h, 7d), got `{s}`"
        )
    };
    let (number, unit) = s.split_at(s.len().saturating_sub(1));
    let seconds = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        _ => return Err(bad()),
    };
    let n: f64 = number.parse().map_err(|_| bad())?;
    let age = Duration::try_from_secs_f64(n * seconds).map_err(|_| bad())?;
    let age = chrono::Duration::from_std(age).map_err(|_| bad())?;
    Utc::now().checked_sub_signed(age).ok_or_else(bad)
}

fn secs(s: f64, flag: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| {
        CliError::msg(format!(
            "--{flag} must be a non-negative number of seconds, got {s}"
        ))
    })
}

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
            crate::commands::shown(&row.event_type),
            crate::commands::shown(&row.subject),
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
        let mut v = serde_json::to_value(&report).map_err(|e| CliError::msg(e.to_string()))?;
        v["gaps"] = serde_json::json!(report.gaps());
        v["all_present"] = serde_json::json!(report.all_present());
        println!("{v:#}");
    } else {
        print!("{}", render(&report, args.republish));
    }
    Ok(if report.all_present() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn render(r: &VerifyReport, republish: bool) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "stream {}, rows published from {} to {}: {} row(s), {} present, {} missing",
        r.stream,
        r.from.to_rfc3339(),
        r.to.to_rfc3339(),
        r.rows,
        r.present,
        r.missing
    );
    if r.not_captured > 0 {
        let _ = writeln!(
            out,
            "skipped {} row(s) of event types stream {} does not capture",
            r.not_captured, r.stream
        );
    }
    for gap in r.gaps() {
        let _ = writeln!(out, "NOT VERIFIED: {gap}");
    }
    if republish && r.missing > 0 {
        let _ = writeln!(
            out,
            "republished {} row(s): the relay publishes them again with their original ids",
            r.republished
        );
        if r.deferred > 0 {
            let until = r
                .deferred_until
                .map_or_else(String::new, |t| t.to_rfc3339());
            let _ = writeln!(
                out,
                "left {} row(s) as published: published less than the stream's duplicate \
                 window ago, the stream would drop them as duplicates; run again after {until}",
                r.deferred
            );
        }
    } else if r.missing > 0 {
        let _ = writeln!(
            out,
            "MISSING: {} published row(s) are not in stream {} (`--republish` sets them \
             unpublished so the relay publishes them again)",
            r.missing, r.stream
        );
    }
    if r.all_present() {
        let _ = writeln!(out, "ok: every row of the range is in the stream");
    }
    out
}
