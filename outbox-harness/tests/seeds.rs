//! The harness's fixed budget for every test run: a few seeds of half a minute each, over one
//! nats-server and a three-node cluster, with relays as tasks and as `outbox relay` processes,
//! one held subject of 100,000 rows, and a consumer. Every property must hold in every seed; a failure
//! prints each violation with its part of the history and the command that replays it.
//!
//! Longer runs: `cargo run -p outbox-harness -- --minutes 60` (docs/harness.md).

use std::time::Duration;

use outbox_harness::schedule::{self, RelayMode, Settings, Topology};
use outbox_harness::{report, run_seed, Options};

/// (seed, topology, relays, held rows): every topology and kind of relay at least once, a
/// consumer (seed 106 draws one, beside a burst writer on its type), and another role (seed 108
/// holds both wake-up locks' keys shared, and floods the channel while a relay is frozen).
const BUDGET: [(u64, Topology, RelayMode, Option<u64>); 4] = [
    (101, Topology::Single, RelayMode::Task, Some(100_000)),
    (108, Topology::Single, RelayMode::Process, None),
    (103, Topology::Cluster, RelayMode::Mixed, None),
    (106, Topology::Cluster, RelayMode::Mixed, None),
];

/// The settings of a budget seed.
fn settings(topology: Topology, relays: RelayMode, held_rows: Option<u64>) -> Settings {
    Settings {
        topology: Some(topology),
        relays,
        duration: Duration::from_secs(30),
        focus: None,
        held_rows,
    }
}

/// How many seeds of the budget draw a schedule that `has`.
fn budget_seeds_with(has: impl Fn(&schedule::Schedule) -> bool) -> usize {
    BUDGET
        .iter()
        .filter(|(seed, topology, relays, held_rows)| {
            has(&schedule::generate(
                *seed,
                &settings(*topology, *relays, *held_rows),
            ))
        })
        .count()
}

#[test]
fn the_fixed_seeds_run_a_consumer_and_another_role() {
    assert!(
        budget_seeds_with(|s| s.consumers.is_some()) >= 1,
        "no seed of the budget draws a consumer: pick one that does (`--dry-run` prints it)"
    );
    let intrudes = |s: &schedule::Schedule| {
        s.ops
            .iter()
            .any(|op| matches!(op.action, schedule::Action::Intrude { .. }))
    };
    assert!(
        budget_seeds_with(intrudes) >= 1,
        "no seed of the budget draws another role: pick one that does (`--dry-run` prints it)"
    );
}

#[test]
fn the_relay_keeps_its_promises_over_the_fixed_seeds() {
    if let Err(e) = outbox_harness::servers::preflight() {
        panic!("{e}");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a runtime");
    outbox_harness::capture_relay_logs();
    eprintln!(
        "nats-server: {}",
        outbox_harness::servers::nats_server_version()
    );
    let mut results = Vec::new();
    for (seed, topology, relays, held_rows) in BUDGET {
        let options = Options {
            settings: settings(topology, relays, held_rows),
            ..Options::default()
        };
        let result = runtime.block_on(run_seed(seed, &options));
        eprintln!("{}", result.verdict());
        results.push(result);
    }
    let failed: Vec<String> = results
        .iter()
        .filter(|r| !r.passed())
        .map(|r| format!("{}\n{}", r.verdict(), r.details))
        .collect();
    assert!(
        failed.is_empty(),
        "the relay broke a promise:\n{}\n{}",
        failed.join("\n"),
        report::summary(&results)
    );
}
