//! The subcommands.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use futures::StreamExt;
use outbox_codegen::evolution::{Level, Mode};
use outbox_codegen::LockedStatus;
use outbox_runtime::status::{Status, Unblock};
use outbox_runtime::{RelayConfig, StreamSpec};
use uuid::Uuid;

use crate::connect::{self, DbArgs, NatsArgs};
use crate::{CliError, Result};

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply the outbox migrations (the outbox table and the consumer dedupe tables).
    Migrate {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Run the relay: publish committed events to JetStream until SIGINT/SIGTERM.
    Relay(RelayArgs),
    /// Show the backlog, the oldest unpublished event, attempts and capped rows.
    ///
    /// Exits 1 when a threshold given by --max-* is crossed, so it can back an alert.
    Status(StatusArgs),
    /// Lint a schemas folder with the codegen's rules and report every problem at once.
    ///
    /// Runs the schema evolution gate too, as the build does: every schema is compared with
    /// its released version in the lock file (written by `outbox lock`), and a breaking change
    /// is a problem. Compatible changes are notes. Exits 1 when there is a problem.
    Check {
        /// The schemas folder.
        #[arg(default_value = "schemas/events")]
        dir: PathBuf,
        #[command(flatten)]
        gate: GateArgs,
    },
    /// Record the schemas of a folder as released, in its lock file.
    ///
    /// The lock holds every event type's schema (shared definitions inlined, keys sorted) and
    /// its compatibility mode; check it in. From then on the build and `outbox check` fail on
    /// a breaking change to a released type. A type with a breaking change is only locked
    /// again when named by `--allow-breaking`: do that once every consumer can take it, or
    /// publish the new shape as a new major type (`<event_type>.v2`) instead.
    Lock(LockArgs),
    /// Print the Rust the build script would generate for a schemas folder.
    Gen {
        /// The schemas folder.
        #[arg(default_value = "schemas/events")]
        dir: PathBuf,
        /// The service name (the envelopes' `source`).
        #[arg(long, default_value = "service")]
        source: String,
        /// Event types this service only consumes (NATS-style patterns, repeatable).
        #[arg(long)]
        consumes: Vec<String>,
    },
    /// Follow events on the stream and print their envelopes.
    Tail(TailArgs),
    /// Let capped rows publish again (attempts reset to 0, same id).
    Unblock(UnblockArgs),
    /// Delete published rows (and consumer dedupe rows) past their retention.
    Prune(PruneArgs),
    /// Manage the JetStream stream the relay publishes to.
    #[command(subcommand)]
    Stream(StreamCommand),
    /// Check that every row published in a time range is in the stream (by `Nats-Msg-Id`).
    ///
    /// Reports every published row missing from the stream; with --republish sets them
    /// unpublished again so the relay republishes them with their original ids. Reads rows
    /// and stream in pages, in bounded memory. Exits 0 when every row is there, 1 when rows
    /// are missing (republished or not) or the range reaches outside the stream's or the
    /// table's retention, 2 on an error.
    Verify(crate::verify::VerifyArgs),
}

/// The schema evolution gate's settings (as `outbox_codegen::Config` has them in build.rs).
#[derive(Debug, Args)]
pub struct GateArgs {
    /// The lock file [default: beside the folder, named after it: schemas/events.lock].
    #[arg(long)]
    lock: Option<PathBuf>,
    /// `rust` checks the wire rules and the rules that protect generated Rust code; `wire`
    /// only the first.
    #[arg(long, default_value = "rust")]
    level: Level,
    /// The compatibility mode of every type (`backward`, `forward` or `full`) [default: the
    /// mode each type has in the lock; `full` for new types].
    #[arg(long)]
    compatibility: Option<Mode>,
    /// The mode of one type, as `TYPE=MODE` (repeatable); wins over --compatibility.
    #[arg(long, value_name = "TYPE=MODE", value_parser = type_mode)]
    compatibility_for: Vec<(String, Mode)>,
}

impl GateArgs {
    fn config(&self) -> outbox_codegen::Config {
        let mut config = outbox_codegen::Config::new();
        config.source("check").compatibility_level(self.level);
        if let Some(lock) = &self.lock {
            config.lock_file(lock);
        }
        if let Some(mode) = self.compatibility {
            config.compatibility(mode);
        }
        for (event_type, mode) in &self.compatibility_for {
            config.compatibility_for(event_type, *mode);
        }
        config
    }
}

fn type_mode(s: &str) -> std::result::Result<(String, Mode), String> {
    let (event_type, mode) = s.split_once('=').ok_or_else(|| {
        format!("expected TYPE=MODE, like `billing.invoice.paid=backward`, got `{s}`")
    })?;
    Ok((event_type.to_owned(), mode.parse()?))
}

#[derive(Debug, Args)]
pub struct LockArgs {
    /// The schemas folder.
    #[arg(default_value = "schemas/events")]
    dir: PathBuf,
    /// Lock this type even though it breaks its released schema (repeatable). For a type whose
    /// schema is gone, drops it from the lock.
    #[arg(long, value_name = "TYPE")]
    allow_breaking: Vec<String>,
    #[command(flatten)]
    gate: GateArgs,
}

#[derive(Debug, Args)]
pub struct RelayArgs {
    #[command(flatten)]
    db: DbArgs,
    #[command(flatten)]
    nats: NatsArgs,
    /// Rows claimed per transaction.
    #[arg(long, default_value_t = RelayConfig::default().batch_size)]
    batch_size: usize,
    /// Batch loops run at once, each on its own share of the subject partitions.
    #[arg(long, default_value_t = RelayConfig::default().lanes)]
    lanes: usize,
    /// Publish attempts after which a row is left alone until unblocked.
    #[arg(long, default_value_t = RelayConfig::default().max_attempts)]
    max_attempts: i32,
    /// First backoff after a failure, in seconds (doubles per failure).
    #[arg(long, default_value_t = RelayConfig::default().backoff_base.as_secs_f64())]
    backoff_base: f64,
    /// Backoff ceiling, in seconds.
    #[arg(long, default_value_t = RelayConfig::default().backoff_max.as_secs_f64())]
    backoff_max: f64,
    /// Fallback poll interval, in seconds (the relay also wakes on every commit).
    #[arg(long, default_value_t = RelayConfig::default().poll_interval.as_secs_f64())]
    poll_interval: f64,
    /// Deadline for a batch's acks, in seconds.
    #[arg(long, default_value_t = RelayConfig::default().ack_timeout.as_secs_f64())]
    ack_timeout: f64,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9187).
    #[arg(long)]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Event types the relay must be able to publish: at start it checks that a stream
    /// captures each and that its duplicate window covers the retry horizon (repeatable).
    #[arg(long)]
    subject: Vec<String>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// The relay's attempt cap (rows at or past it count as capped).
    #[arg(long, default_value_t = RelayConfig::default().max_attempts)]
    max_attempts: i32,
    /// Exit 1 when the oldest unpublished event is older than this many seconds.
    #[arg(long)]
    max_age: Option<f64>,
    /// Exit 1 when more rows than this are unpublished.
    #[arg(long)]
    max_backlog: Option<i64>,
    /// Exit 1 when more rows than this are at the attempt cap.
    #[arg(long)]
    max_at_cap: Option<i64>,
    /// Exit 1 when more rows than this are held (at the cap, or refused for good).
    #[arg(long)]
    max_held: Option<i64>,
}

#[derive(Debug, Args)]
pub struct TailArgs {
    #[command(flatten)]
    nats: NatsArgs,
    /// Subjects (event types or wildcards) to follow.
    #[arg(required = true)]
    subjects: Vec<String>,
    /// The stream to read (default: the one that captures the first subject).
    #[arg(long)]
    stream: Option<String>,
    /// Start from the first stored event instead of new ones.
    #[arg(long)]
    all: bool,
    /// Stop after this many events.
    #[arg(long)]
    count: Option<u64>,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["id", "event_type", "subject", "all"])))]
pub struct UnblockArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Event ids to unblock (repeatable).
    #[arg(long)]
    id: Vec<Uuid>,
    /// Every capped row of this event type.
    #[arg(long)]
    event_type: Option<String>,
    /// Every capped row of this subject.
    #[arg(long)]
    subject: Option<String>,
    /// Every capped row.
    #[arg(long)]
    all: bool,
    /// The relay's attempt cap.
    #[arg(long, default_value_t = RelayConfig::default().max_attempts)]
    max_attempts: i32,
}

#[derive(Debug, Args)]
pub struct PruneArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Keep published rows this many hours.
    #[arg(long, default_value_t = 168.0)]
    keep_hours: f64,
    /// Keep consumer dedupe rows this many hours (omit to leave them).
    #[arg(long)]
    keep_dedupe_hours: Option<f64>,
    /// Rows per delete statement (at least 1).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..))]
    batch_size: i64,
    /// The share of the run's time spent in delete statements, in percent (1 to 100): after
    /// each full batch it waits so that deletes leave the database to the relay the rest of
    /// the time. 100 deletes without pausing.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u8).range(1..=100))]
    busy_percent: u8,
    /// Only count what would be deleted.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, Subcommand)]
pub enum StreamCommand {
    /// Create the stream, or check that an existing one matches.
    Ensure {
        #[command(flatten)]
        nats: NatsArgs,
        /// Stream name.
        #[arg(long, default_value = "OUTBOX")]
        name: String,
        /// Subjects it captures (event types or wildcards such as `billing.>`; repeatable).
        #[arg(long = "subject", required = true)]
        subjects: Vec<String>,
        /// Duplicate window in seconds; must cover the relay's retry horizon.
        #[arg(long, default_value_t = StreamSpec::default().duplicate_window.as_secs())]
        duplicate_window: u64,
        /// Keep messages in memory instead of files.
        #[arg(long)]
        memory: bool,
        /// Replicas in a JetStream cluster: 3 in production (one warns that a single replica
        /// can lose acknowledged messages in a crash).
        #[arg(long, default_value_t = 1)]
        replicas: usize,
    },
}

fn secs(s: f64, flag: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| {
        CliError::msg(format!(
            "--{flag} must be a non-negative number of seconds, got {s}"
        ))
    })
}

fn hours(h: f64, flag: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(h * 3600.0).map_err(|_| {
        CliError::msg(format!(
            "--{flag} must be a non-negative number of hours, got {h}"
        ))
    })
}

pub async fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Migrate { db } => {
            let pool = connect::pool(&db, 1).await?;
            outbox_runtime::migrate(&pool).await?;
            // the outbox's own entries: the table may also hold the service's migrations
            let ours: Vec<i64> = outbox_runtime::MIGRATOR.iter().map(|m| m.version).collect();
            let applied: Vec<(i64, String)> = sqlx::query_as(
                "select version, description from _sqlx_migrations \
                  where version = any($1) order by version",
            )
            .bind(&ours)
            .fetch_all(&pool)
            .await
            .map_err(|e| CliError::msg(e.to_string()))?;
            for (version, description) in applied {
                println!("applied {version:04} {description}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Relay(args) => relay(args).await,
        Command::Status(args) => status(args).await,
        Command::Check { dir, gate } => Ok(check(&dir, &gate)),
        Command::Lock(args) => Ok(lock(&args)),
        Command::Gen {
            dir,
            source,
            consumes,
        } => {
            let code = outbox_codegen::Config::new()
                .source(source)
                .consumes(consumes)
                .generate(&dir)
                .map_err(|e| CliError::msg(e.to_string()))?;
            print!("{code}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Tail(args) => tail(args).await,
        Command::Unblock(args) => {
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
        Command::Prune(args) => prune(args).await,
        Command::Verify(args) => crate::verify::run(args).await,
        Command::Stream(StreamCommand::Ensure {
            nats,
            name,
            subjects,
            duplicate_window,
            memory,
            replicas,
        }) => {
            let js = connect::jetstream(&nats).await?;
            let spec = StreamSpec {
                name,
                subjects,
                duplicate_window: Duration::from_secs(duplicate_window),
                storage: if memory {
                    outbox_runtime::StorageType::Memory
                } else {
                    outbox_runtime::StorageType::File
                },
                replicas,
                ..StreamSpec::default()
            };
            let info = spec.ensure(&js).await?;
            println!(
                "stream {} ok: subjects {}, duplicate window {}s, {} replica(s), {} message(s)",
                info.config.name,
                info.config.subjects.join(", "),
                info.config.duplicate_window.as_secs(),
                info.config.num_replicas.max(1),
                info.state.messages
            );
            if let Some(warning) = outbox_runtime::durability_warning(&info.config) {
                eprintln!("warning: {warning}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn check(dir: &std::path::Path, gate: &GateArgs) -> ExitCode {
    let checked = gate.config().check(dir);
    for note in &checked.notes {
        println!("note: {note}");
    }
    problems(dir, &checked.problems).unwrap_or_else(|| {
        println!("{}: ok", dir.display());
        ExitCode::SUCCESS
    })
}

/// Prints `problems` and a count, and gives exit status 1; `None` when there are none.
fn problems(dir: &std::path::Path, problems: &[outbox_codegen::Error]) -> Option<ExitCode> {
    if problems.is_empty() {
        return None;
    }
    for p in problems {
        println!("{p}");
    }
    println!("{} problem(s) in {}", problems.len(), dir.display());
    Some(ExitCode::from(1))
}

fn lock(args: &LockArgs) -> ExitCode {
    let locked = match args
        .gate
        .config()
        .write_lock(&args.dir, &args.allow_breaking)
    {
        Ok(locked) => locked,
        Err(e) => return problems(&args.dir, &e.into_list()).expect("an error is a problem"),
    };
    for (event_type, status) in &locked.types {
        let status = match status {
            LockedStatus::New => "new",
            LockedStatus::Unchanged => "unchanged",
            LockedStatus::Compatible => "changed compatibly",
            LockedStatus::BreakingAllowed => "changed incompatibly, allowed by --allow-breaking",
            LockedStatus::Dropped => "gone, dropped from the lock (--allow-breaking)",
            _ => "locked",
        };
        println!("{event_type}: {status}");
    }
    let n = locked.types.len();
    if locked.written {
        println!("wrote {} ({n} event type(s))", locked.lock_file.display());
    } else {
        println!(
            "{} is up to date ({n} event type(s))",
            locked.lock_file.display()
        );
    }
    ExitCode::SUCCESS
}

async fn status(args: StatusArgs) -> Result<ExitCode> {
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
        let mut v = serde_json::to_value(&s).map_err(|e| CliError::msg(e.to_string()))?;
        v["thresholds_crossed"] = serde_json::json!(crossed);
        println!("{v:#}");
    } else {
        print!("{}", render_status(&s));
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

fn age(d: Option<Duration>) -> String {
    match d {
        None => "-".into(),
        Some(d) if d.as_secs() >= 3600 => format!("{:.1}h", d.as_secs_f64() / 3600.0),
        Some(d) if d.as_secs() >= 60 => format!("{:.1}m", d.as_secs_f64() / 60.0),
        Some(d) => format!("{:.1}s", d.as_secs_f64()),
    }
}

fn render_status(s: &Status) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "unpublished          {}", s.unpublished);
    let _ = writeln!(
        out,
        "oldest unpublished   {}",
        age(s.oldest_unpublished_age)
    );
    let _ = writeln!(out, "at attempt cap ({})  {}", s.max_attempts, s.at_cap);
    let _ = writeln!(out, "held                 {}", s.held_total);
    let _ = writeln!(
        out,
        "on held subjects     {} row(s), oldest {}",
        s.held_unpublished,
        age(s.oldest_held_age)
    );
    let _ = writeln!(out, "backing off          {} subject(s)", s.backing_off);
    let attempts: Vec<String> = s.attempts.iter().map(|(a, n)| format!("{a}:{n}")).collect();
    let _ = writeln!(
        out,
        "attempts             {}",
        if attempts.is_empty() {
            "-".into()
        } else {
            attempts.join("  ")
        }
    );
    if !s.by_type.is_empty() {
        let width = s
            .by_type
            .iter()
            .map(|t| shown(&t.event_type).chars().count())
            .max()
            .unwrap_or(10)
            .max(10);
        let _ = writeln!(
            out,
            "\n{:<width$}  {:>11}  {:>8}  {:>6}",
            "event type", "unpublished", "oldest", "at cap"
        );
        for t in &s.by_type {
            let _ = writeln!(
                out,
                "{:<width$}  {:>11}  {:>8}  {:>6}",
                shown(&t.event_type),
                t.unpublished,
                age(t.oldest_unpublished_age),
                t.at_cap
            );
        }
    }
    if !s.held.is_empty() {
        let _ = writeln!(
            out,
            "\nheld (each holds its subject; release with `outbox unblock`):"
        );
        for h in &s.held {
            let _ = writeln!(
                out,
                "{}  {}  subject {}  attempts {}: {}",
                h.id,
                shown(&h.event_type),
                shown(&h.subject),
                h.attempts,
                h.reason
            );
        }
        if s.held_total > s.held.len() as i64 {
            let _ = writeln!(out, "... and {} more", s.held_total - s.held.len() as i64);
        }
    }
    out
}

/// A value from the table, cut to fit a line (rows written by hand can hold anything).
pub(crate) fn shown(value: &str) -> String {
    const WIDTH: usize = 60;
    let printable: String = value
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if printable.chars().count() <= WIDTH {
        return printable;
    }
    let head: String = printable.chars().take(WIDTH).collect();
    format!("{head}… ({} bytes)", value.len())
}

async fn prune(args: PruneArgs) -> Result<ExitCode> {
    let pool = connect::pool(&args.db, 1).await?;
    // both keeps are checked before any row is deleted
    let keep = hours(args.keep_hours, "keep-hours")?;
    let keep_dedupe = args
        .keep_dedupe_hours
        .map(|h| hours(h, "keep-dedupe-hours").map(|keep| (h, keep)))
        .transpose()?;
    if args.dry_run {
        let n = outbox_runtime::retention::count_prunable(&pool, keep).await?;
        println!(
            "would delete {n} published row(s) older than {}h (dry run)",
            args.keep_hours
        );
        return Ok(ExitCode::SUCCESS);
    }
    let (batch, busy) = (args.batch_size, args.busy_percent);
    let n = outbox_runtime::retention::prune_published_paced(&pool, keep, batch, busy).await?;
    println!(
        "deleted {n} published row(s) older than {}h",
        args.keep_hours
    );
    if let Some((h, keep)) = keep_dedupe {
        let n = outbox_runtime::retention::prune_dedupe_paced(&pool, keep, batch, busy).await?;
        println!("deleted {n} dedupe row(s) older than {h}h");
    }
    Ok(ExitCode::SUCCESS)
}

async fn tail(args: TailArgs) -> Result<ExitCode> {
    use async_nats::jetstream::consumer::{pull, DeliverPolicy};
    let js = connect::jetstream(&args.nats).await?;
    let stream_name = match args.stream {
        Some(s) => s,
        None => js
            .stream_by_subject(args.subjects[0].clone())
            .await
            .map_err(|e| {
                CliError::msg(format!(
                    "no stream captures `{}` ({e}); pass --stream or create one with `outbox stream ensure`",
                    args.subjects[0]
                ))
            })?,
    };
    let stream = js
        .get_stream(&stream_name)
        .await
        .map_err(|e| CliError::msg(format!("cannot open stream `{stream_name}`: {e}")))?;
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subjects: args.subjects.clone(),
            deliver_policy: if args.all {
                DeliverPolicy::All
            } else {
                DeliverPolicy::New
            },
            ..Default::default()
        })
        .await
        .map_err(|e| CliError::msg(format!("cannot follow `{stream_name}`: {e}")))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| CliError::msg(format!("cannot follow `{stream_name}`: {e}")))?;
    eprintln!(
        "following {} on stream {stream_name} (Ctrl-C to stop)",
        args.subjects.join(", ")
    );
    let mut seen = 0u64;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let next = tokio::select! {
            _ = &mut ctrl_c => break,
            next = messages.next() => next,
        };
        let Some(message) = next else { break };
        let message = message.map_err(|e| CliError::msg(format!("stream error: {e}")))?;
        println!("{}", render_envelope(&message.subject, &message.payload));
        seen += 1;
        if args.count.is_some_and(|c| seen >= c) {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn render_envelope(subject: &str, payload: &[u8]) -> String {
    match serde_json::from_slice::<outbox_runtime::Envelope>(payload) {
        Ok(e) => format!(
            "{} {} id={} source={} subject={}\n  {}",
            e.time.to_rfc3339(),
            e.event_type,
            e.id,
            e.source,
            e.subject,
            serde_json::to_string(&e.data).unwrap_or_default()
        ),
        Err(err) => format!(
            "{subject}: not a CloudEvents envelope ({err}): {}",
            String::from_utf8_lossy(payload)
        ),
    }
}

async fn relay(args: RelayArgs) -> Result<ExitCode> {
    let config = RelayConfig {
        batch_size: args.batch_size,
        lanes: args.lanes,
        max_attempts: args.max_attempts,
        backoff_base: secs(args.backoff_base, "backoff-base")?,
        backoff_max: secs(args.backoff_max, "backoff-max")?,
        poll_interval: secs(args.poll_interval, "poll-interval")?,
        ack_timeout: secs(args.ack_timeout, "ack-timeout")?,
        subjects: args.subject,
        ..RelayConfig::default()
    };
    if let Some(addr) = args.metrics_addr {
        prometheus_builder()?
            .with_http_listener(addr)
            .install()
            .map_err(|e| CliError::msg(format!("cannot serve metrics on {addr}: {e}")))?;
        tracing::info!(%addr, "serving Prometheus metrics");
    }
    let signal = shutdown_signal();
    config.validate()?;
    let pool = connect::pool(&args.db, config.pool_size()).await?;
    let js = connect::jetstream(&args.nats).await?;
    let relay = outbox_runtime::Relay::new(pool.clone(), js, config).await?;
    let shutdown = async {
        signal.await;
        tracing::info!("stopping: finishing the batch in progress");
    };
    tokio::select! {
        result = relay.run(shutdown) => result?,
        _ = progress(&relay, &pool) => {}
    }
    eprintln!();
    tracing::info!("relay stopped cleanly");
    Ok(ExitCode::SUCCESS)
}

/// A Prometheus exporter with the buckets of every histogram the runtime records
/// (`outbox_runtime::metrics::histogram_buckets`), so that they are exported as histograms
/// rather than summaries.
fn prometheus_builder() -> Result<metrics_exporter_prometheus::PrometheusBuilder> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in outbox_runtime::metrics::histogram_buckets() {
        builder = builder
            .set_buckets_for_metric(Matcher::Full((*name).to_owned()), buckets)
            .map_err(|e| CliError::msg(format!("buckets of {name}: {e}")))?;
    }
    Ok(builder)
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called, not when the
/// future is first polled, so a signal that arrives while the relay starts or runs its first
/// batch still stops it cleanly instead of killing the process.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let interrupt = signal(SignalKind::interrupt()).ok();
        let terminate = signal(SignalKind::terminate()).ok();
        async move {
            // a handler that could not be installed never fires
            let recv = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = recv(interrupt) => {}
                _ = recv(terminate) => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Once a second on a terminal (every 10 s as a log line otherwise): published/s, backlog and
/// the oldest unpublished age. Never returns.
async fn progress(relay: &outbox_runtime::Relay, pool: &sqlx::PgPool) {
    let tty = std::io::stderr().is_terminal();
    let every = if tty {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(10)
    };
    let mut last = (std::time::Instant::now(), relay.stats().published);
    loop {
        tokio::time::sleep(every).await;
        let max_attempts = relay.config().max_attempts;
        // the relay refreshes the gauges itself; this only reads the numbers for the line
        let Ok(s) = outbox_runtime::status::status(pool, max_attempts).await else {
            continue;
        };
        let (now, published) = (std::time::Instant::now(), relay.stats().published);
        let rate =
            published.saturating_sub(last.1) as f64 / now.duration_since(last.0).as_secs_f64();
        last = (now, published);
        let line = format!(
            "published/s {rate:>8.0}   backlog {:>8}   oldest unpublished {:>7}   at cap {}",
            s.unpublished,
            age(s.oldest_unpublished_age),
            s.at_cap
        );
        if tty {
            eprint!("\r{line}");
        } else {
            tracing::info!("{line}");
        }
    }
}
