//! The harness's fixed budget for every test run: a few seeds of half a minute each, over one
//! nats-server and a three-node cluster, with relays as tasks and as `outbox relay` processes,
//! one held subject of 100,000 rows, and a consumer; each seed an `outbox-harness` process, two
//! at a time. Every property must hold in every seed; a failure prints each violation with its
//! part of the history and the command that replays it.
//!
//! Longer runs: `cargo run -p outbox-harness -- --minutes 60` (docs/harness.md).

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use outbox_harness::schedule::{self, RelayMode, Settings, Topology};
use outbox_harness::Options;

/// (seed, topology, relays, held rows): every topology and kind of relay at least once, a
/// consumer (seed 106 draws one, beside a burst writer on its type), and another role (seed 108
/// holds both wake-up locks' keys shared, and floods the channel while a relay is frozen).
/// Listed longest first (about 80, 75, 70 and 45 s here), so that the two seeds at a time end
/// together.
const BUDGET: [(u64, Topology, RelayMode, Option<u64>); 4] = [
    (106, Topology::Cluster, RelayMode::Mixed, None),
    (108, Topology::Single, RelayMode::Process, None),
    (103, Topology::Cluster, RelayMode::Mixed, None),
    (101, Topology::Single, RelayMode::Task, Some(100_000)),
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
    eprintln!(
        "nats-server: {}",
        outbox_harness::servers::nats_server_version()
    );
    // Each seed runs in an `outbox-harness` process of its own (its own Postgres and
    // nats-servers on free ports, its own logs), two at a time: a seed spends most of its
    // half minute, and its faults' tails, waiting.
    let next = AtomicUsize::new(0);
    let outcomes: Mutex<Vec<(u64, Outcome)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..AT_ONCE {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(&(seed, topology, relays, held_rows)) = BUDGET.get(i) else {
                    return;
                };
                let outcome = run(seed, topology, relays, held_rows);
                eprintln!("{}", outcome.verdict);
                outcomes.lock().expect("the outcomes").push((seed, outcome));
            });
        }
    });
    let mut outcomes = outcomes.into_inner().expect("the outcomes");
    outcomes.sort_by_key(|(seed, _)| *seed);
    assert_eq!(outcomes.len(), BUDGET.len(), "every seed of the budget ran");
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|(_, o)| !o.passed)
        .map(|(seed, o)| format!("seed {seed}: {}\n{}", o.verdict, o.output))
        .collect();
    assert!(
        failed.is_empty(),
        "the relay broke a promise (or a run could not be judged):\n{}",
        failed.join("\n")
    );
}

/// How many seeds run at once.
const AT_ONCE: usize = 2;

/// What one seed's process said.
struct Outcome {
    passed: bool,
    /// The verdict line (`seed N ... PASS|FAIL`), or why there is none.
    verdict: String,
    /// Everything the process printed: each violation with its part of the history and the
    /// command that replays it.
    output: String,
}

/// Runs one seed of the budget as `outbox-harness --seed ...`, whose exit status is 0 only
/// when every property held.
fn run(seed: u64, topology: Topology, relays: RelayMode, held_rows: Option<u64>) -> Outcome {
    let options = Options {
        settings: settings(topology, relays, held_rows),
        ..Options::default()
    };
    let output = Command::new(env!("CARGO_BIN_EXE_outbox-harness"))
        .args(options.args(seed, topology))
        .output()
        .unwrap_or_else(|e| panic!("run outbox-harness for seed {seed}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let verdict = text
        .lines()
        .find(|l| l.starts_with(&format!("seed {seed} ")))
        .map_or_else(
            || format!("seed {seed}: no verdict ({})", output.status),
            str::to_owned,
        );
    Outcome {
        // exit status 0 only when every property held, and the verdict says so too
        passed: output.status.success() && verdict.contains(" PASS "),
        verdict,
        output: text,
    }
}
