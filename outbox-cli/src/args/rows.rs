//! The flags of the commands that read or change the outbox table's rows: `status`, `unblock`,
//! `prune` and `verify`.

use chrono::{DateTime, Utc};
use clap::Args;
use outbox_runtime::RelayConfig;
use uuid::Uuid;

use super::{DbArgs, NatsArgs};

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The relay's attempt cap (rows at or past it count as capped).
    #[arg(long, default_value_t = RelayConfig::default().max_attempts)]
    pub max_attempts: i32,
    /// Exit 1 when the oldest unpublished event is older than this many seconds.
    #[arg(long)]
    pub max_age: Option<f64>,
    /// Exit 1 when more rows than this are unpublished.
    #[arg(long)]
    pub max_backlog: Option<i64>,
    /// Exit 1 when more rows than this are at the attempt cap.
    #[arg(long)]
    pub max_at_cap: Option<i64>,
    /// Exit 1 when more rows than this are held (at the cap, or refused for good).
    #[arg(long)]
    pub max_held: Option<i64>,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["id", "event_type", "subject", "all"])))]
pub struct UnblockArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Event ids to unblock (repeatable).
    #[arg(long)]
    pub id: Vec<Uuid>,
    /// Every capped row of this event type.
    #[arg(long)]
    pub event_type: Option<String>,
    /// Every capped row of this subject (the entity key).
    #[arg(long)]
    pub subject: Option<String>,
    /// Every capped row.
    #[arg(long)]
    pub all: bool,
    /// The relay's attempt cap.
    #[arg(long, default_value_t = RelayConfig::default().max_attempts)]
    pub max_attempts: i32,
}

#[derive(Debug, Args)]
pub struct PruneArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Keep published rows this many hours.
    #[arg(long, default_value_t = 168.0)]
    pub keep_hours: f64,
    /// Keep consumer dedupe rows this many hours (omit to leave them).
    #[arg(long)]
    pub keep_dedupe_hours: Option<f64>,
    /// Rows per delete statement (at least 1).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..))]
    pub batch_size: i64,
    /// The share of the run's time spent in delete statements, in percent (1 to 100): after
    /// each full batch it waits so that deletes leave the database to the relay the rest of
    /// the time. 100 deletes without pausing.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub busy_percent: u8,
    /// Only count what would be deleted.
    #[arg(long)]
    pub dry_run: bool,
}

/// `outbox verify`'s arguments.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub nats: NatsArgs,
    /// The stream to compare with.
    #[arg(long, default_value = "OUTBOX")]
    pub stream: String,
    /// Rows published at or after this: an RFC 3339 time (`2026-05-01T00:00:00Z`) or an age
    /// (`90m`, `24h`, `7d`: that long ago). Keep it inside the stream's and the table's
    /// retention.
    #[arg(long, value_parser = when)]
    pub from: DateTime<Utc>,
    /// Rows published before this (a time or an age, as --from) [default: now].
    #[arg(long, value_parser = when)]
    pub to: Option<DateTime<Utc>>,
    /// Set the missing rows unpublished again (attempts 0, in one transaction), so that the
    /// relay publishes them again with their original ids. Rows published less than the
    /// stream's duplicate window ago are left (the stream would drop them as duplicates):
    /// run again later.
    #[arg(long)]
    pub republish: bool,
    /// Rows held in memory at once (and suspects per page of the second pass).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub page_size: u64,
    /// Seconds within which the relay usually marks a row after the stream stored it; rows
    /// not found within it are looked for again over the stream's duplicate window.
    #[arg(long, default_value_t = 2.0)]
    pub lag: f64,
    /// The largest difference between the NATS servers' and Postgres's clocks, in seconds.
    #[arg(long, default_value_t = 2.0)]
    pub clock_skew: f64,
    /// Print the report as JSON (the first 100 missing rows; the count is complete).
    #[arg(long)]
    pub json: bool,
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
    let age = std::time::Duration::try_from_secs_f64(n * seconds).map_err(|_| bad())?;
    let age = chrono::Duration::from_std(age).map_err(|_| bad())?;
    Utc::now().checked_sub_signed(age).ok_or_else(bad)
}
