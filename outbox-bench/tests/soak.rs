//! The soak's smoke test: a minute of `outbox-bench soak` at a low rate, checked for
//! correctness only. Every shape runs, the two relays are restarted one after the other,
//! retention and the status polls run; what must hold is that no event is lost, none is applied
//! twice, none comes out of order for its subject, and the backlog drains. It asserts no
//! timing: speed is the benchmark's to report.
//!
//! Needs `DATABASE_URL`'s Postgres and a nats-server binary (`NATS_SERVER_BIN`, or
//! `scripts/services`), like the suites. The relays run the `outbox` binary cargo built next to
//! the benchmark's: `cargo test --workspace` builds both; run alone, this test builds it when it
//! is missing, and uses it as it is otherwise (`cargo build -p outbox-cli` after changing the
//! relay).

use std::path::Path;
use std::process::Command;

/// The value of `name=` in `line`.
fn figure<'a>(line: &'a str, name: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {name}= in `{line}`"))
        .trim_end_matches(':')
}

#[test]
fn a_minute_of_soak_loses_reorders_and_duplicates_nothing_and_drains() {
    let bench = env!("CARGO_BIN_EXE_outbox-bench");
    let mut soak = Command::new(bench);
    soak.args([
        "soak",
        "--minutes=1",
        "--rate=40",
        "--subjects=200",
        "--keep-secs=20",
        "--drain-secs=120",
    ]);
    let outbox = Path::new(bench).with_file_name("outbox");
    if outbox.is_file() {
        // the binary `cargo test` built beside this one; building it again here with this
        // package's features alone would rebuild the runtime
        soak.arg(format!("--outbox-bin={}", outbox.display()));
    }
    let output = soak.output().expect("run outbox-bench soak");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the soak failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("correctness: "))
        .unwrap_or_else(|| panic!("no correctness line:\n{stdout}"));
    let number = |name: &str| -> u64 {
        figure(line, name)
            .parse()
            .unwrap_or_else(|e| panic!("{name} in `{line}`: {e}"))
    };
    let emitted = number("emitted");
    assert!(emitted > 0, "nothing was emitted: {line}");
    assert_eq!(number("applied"), emitted, "{line}");
    for zero in [
        "consumer_pending",
        "lost",
        "duplicated",
        "reordered",
        "stream_skipped",
        "stream_missing",
        "backlog_at_end",
    ] {
        assert_eq!(number(zero), 0, "{zero} in {line}");
    }
    assert_eq!(figure(line, "drained"), "true", "{line}");
    assert!(number("stream_messages") >= emitted, "{line}");
    // the run did what it says: both relays restarted, and it reported a minute and a summary
    for relay in ["soak-relay-1", "soak-relay-2"] {
        assert!(
            stdout.contains(&format!("{relay} restarted")),
            "{relay} was not restarted:\n{stdout}"
        );
    }
    assert!(
        stdout.contains("\nminute 1 ("),
        "no minute block:\n{stdout}"
    );
    assert!(
        stdout
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("summary: ")
                && l.contains("emit_caught_up_vs_insert_capacity_ratio=")
                && l.contains("retention_backlog_growth_rows_per_min=")),
        "the last line is not the summary:\n{stdout}"
    );
}
