//! `outbox-harness`: runs seeds of the relay's fault-and-workload harness and prints a verdict
//! per seed and a summary (docs/harness.md). Exits 1 when a property failed in any seed, 2
//! when a seed could not be judged or the servers cannot be run.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use outbox_harness::schedule::{RelayMode, Topology};
use outbox_harness::{parse_focus, report, run_seed, Options};

/// Run the relay against a seeded schedule of writes and faults, and check its promises.
#[derive(Debug, Parser)]
#[command(name = "outbox-harness")]
struct Args {
    /// Replay this one seed.
    #[arg(long, conflicts_with_all = ["seeds", "minutes", "first_seed"])]
    seed: Option<u64>,
    /// Run this many seeds (with --minutes, whichever ends first).
    #[arg(long)]
    seeds: Option<u64>,
    /// Run seeds for this many minutes (a long run: 120 s schedules and a held subject of
    /// 100,000 rows unless said otherwise).
    #[arg(long)]
    minutes: Option<f64>,
    /// The first seed of --seeds/--minutes [default: drawn from the clock, and printed].
    #[arg(long)]
    first_seed: Option<u64>,
    /// One nats-server or a three-node cluster [default: drawn from each seed].
    #[arg(long)]
    topology: Option<TopologyArg>,
    /// Relays as tasks, as `outbox relay` processes, or drawn per relay.
    #[arg(long, default_value = "mixed")]
    relay: RelayArg,
    /// How long each schedule's operations go on, in seconds [default: 60; 120 with --minutes].
    #[arg(long)]
    duration: Option<u64>,
    /// Bias the schedules towards one finding: reorder, lane, late, freeze, idle.
    #[arg(long, value_parser = parse_focus)]
    focus: Option<outbox_harness::schedule::Focus>,
    /// A held subject with this many rows behind its head [default: none; 100000 with
    /// --minutes]; 0 for none.
    #[arg(long)]
    held_rows: Option<u64>,
    /// B: the seconds a healthy relay may take to publish a committed row (docs/harness.md).
    #[arg(long, default_value_t = 10.0)]
    bound: f64,
    /// Require no attempt spent on a frozen broker or a silent NATS path either (only a frozen
    /// relay may spend one).
    #[arg(long)]
    strict_attempts: bool,
    /// Print each schedule before running it.
    #[arg(long)]
    print_schedule: bool,
    /// Print each schedule and run nothing.
    #[arg(long)]
    dry_run: bool,
    /// Keep every run's logs (a failing run's are always kept).
    #[arg(long)]
    keep_logs: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum TopologyArg {
    Single,
    Cluster,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum RelayArg {
    Task,
    Process,
    Mixed,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if !args.bound.is_finite() || args.bound <= 0.0 {
        eprintln!(
            "error: --bound must be a positive number of seconds, got {}",
            args.bound
        );
        return ExitCode::from(2);
    }
    let long = args.minutes.is_some();
    let options = Options {
        settings: outbox_harness::schedule::Settings {
            topology: args.topology.map(|t| match t {
                TopologyArg::Single => Topology::Single,
                TopologyArg::Cluster => Topology::Cluster,
            }),
            relays: match args.relay {
                RelayArg::Task => RelayMode::Task,
                RelayArg::Process => RelayMode::Process,
                RelayArg::Mixed => RelayMode::Mixed,
            },
            duration: Duration::from_secs(args.duration.unwrap_or(if long { 120 } else { 60 })),
            focus: args.focus,
            held_rows: match args.held_rows {
                Some(0) => None,
                Some(n) => Some(n),
                None if long => Some(100_000),
                None => None,
            },
        },
        bound: Duration::from_secs_f64(args.bound),
        strict_attempts: args.strict_attempts,
        keep_logs: args.keep_logs,
        print_schedule: args.print_schedule,
    };
    if args.dry_run {
        let first = args.seed.or(args.first_seed).unwrap_or(1);
        for seed in first..first + args.seeds.unwrap_or(1) {
            outbox_harness::print_schedule(&outbox_harness::schedule::generate(
                seed,
                &options.settings,
            ));
        }
        return ExitCode::SUCCESS;
    }
    if let Err(e) = outbox_harness::servers::preflight() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let (first, count) = match args.seed {
        Some(seed) => (seed, Some(1)),
        None => {
            let first = args.first_seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_secs() % 1_000_000)
            });
            (first, args.seeds.or(if long { None } else { Some(1) }))
        }
    };
    println!(
        "nats-server: {}",
        outbox_harness::servers::nats_server_version()
    );
    if args.seed.is_none() {
        println!("seeds from {first} (--first-seed {first} runs them again)");
    }
    let deadline = args
        .minutes
        .map(|m| Instant::now() + Duration::from_secs_f64(m * 60.0));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a runtime");
    outbox_harness::capture_relay_logs();
    let mut results = Vec::new();
    let mut seed = first;
    loop {
        if count.is_some_and(|n| results.len() as u64 >= n)
            || deadline.is_some_and(|d| Instant::now() >= d)
        {
            break;
        }
        let result = runtime.block_on(run_seed(seed, &options));
        println!("{}", result.verdict());
        if !result.passed() {
            print!("{}", result.details);
        }
        results.push(result);
        seed += 1;
    }
    print!("{}", report::summary(&results));
    if results.iter().any(|r| r.error.is_some()) {
        ExitCode::from(2)
    } else if results.iter().all(|r| r.passed()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
