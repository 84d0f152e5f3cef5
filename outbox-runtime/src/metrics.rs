//! Names of the metrics this crate records through the [`metrics`](https://docs.rs/metrics)
//! facade. Install any exporter (Prometheus, StatsD, ...) to collect them.
//!
//! Histograms need buckets to be aggregated across replicas (a Prometheus exporter without
//! them renders summaries, which `histogram_quantile` cannot read): [`histogram_buckets`] gives
//! the buckets of every histogram recorded here, for the exporter you install.

/// Counter: events inserted by `emit`, labelled `event_type`.
pub const EMITTED: &str = "outbox_events_emitted_total";

/// Counter: rows the relay published (acknowledged by JetStream), labelled `event_type`.
pub const PUBLISHED: &str = "outbox_events_published_total";
/// Counter: publish attempts that failed (error, refusal or no ack before the deadline),
/// labelled `event_type` and `reason`: async-nats's publish error kind (`timeout`,
/// `no_stream`, `max_payload`, `broken_pipe`, `max_ack_pending`, `expectation`, `other`) or the
/// relay's own (`not_connected`, `deadline`, `envelope`). Each one adds 1 to the row's
/// `attempts`.
pub const PUBLISH_FAILURES: &str = "outbox_publish_failures_total";
/// Counter: publishes JetStream acknowledged as duplicates of a message it already stored under
/// the same `Nats-Msg-Id` (a republish after a crash or a lost ack). Counted as published too.
pub const DUPLICATES: &str = "outbox_publish_duplicates_total";
/// Counter: rows held because they cannot be published as they are, labelled `event_type` and
/// `cause`: `attempt_cap`, `no_stream` (no stream captures the type), `max_payload`,
/// `refused` (the stream's own limits), `invalid_event_type`, `unreadable` (a column the relay
/// cannot read). Each holds its subject until an operator releases it. Alert on any.
pub const HELD: &str = "outbox_events_held_total";
/// Counter: rows a batch did not attempt because the broker could not take them, labelled
/// `event_type` and `reason`: `not_connected`; `election` for "no responders" or "JetStream
/// temporarily unavailable" while a stream captures the type; `leader_change` for no ack while
/// the stream changed leader; `reconnected` for no ack across a reconnect; `in_process` for
/// "duplicate message id is in process"; `unverified_duplicate` for a duplicate ack from a
/// server older than 2.11 for a message the stream does not hold; `deadline`, `timeout` or an
/// error kind while the connection was down; `max_ack_pending`. No attempt is counted on the
/// row; it goes again shortly.
pub const NOT_ATTEMPTED: &str = "outbox_publish_not_attempted_total";
/// Counter: batches whose every claimed row waited behind an older row of its subject that
/// another transaction held (a lock taken outside the relay, typically). Those subjects pause.
pub const CUT_BATCHES: &str = "outbox_relay_batches_cut_total";
/// Gauge: 1 when the stream (label `stream`) remembers message ids for less than the relay's
/// retry horizon, so that a republished event may be stored twice; 0 once it does.
pub const SHORT_DUPLICATE_WINDOW: &str = "outbox_stream_duplicate_window_short";
/// Gauge, by `stream`: 1 while the stream has settings under which it can lose messages it
/// acknowledged (interest or work-queue retention, `no_ack`, message or byte limits,
/// asynchronous persistence), else 0.
pub const UNSAFE_STREAM: &str = "outbox_stream_unsafe";
/// Gauge: 1 while the relay's `LISTEN` connection is up and answers its heartbeat, 0 while it
/// is not (the relay then finds new rows by its fallback poll only).
pub const LISTENING: &str = "outbox_relay_listening";
/// Gauge: 1 while this relay holds the relay lease and publishes, 0 while it stands by
/// (docs/relay.md, *Several relays*): across a table's relays it sums to 1, or to 0 while none
/// reaches both Postgres and NATS.
pub const LEASE_HELD: &str = "outbox_relay_lease_held";
/// Counter: relay batches that failed: a statement of the batch or its connection failed, or
/// its transaction did not commit (the lane logs the error at warn, pauses up to 5 s and tries
/// again). Unlabelled, one series per relay process, registered at 0 when the relay starts.
/// A lane whose every batch fails adds one at least every 5 s while the other lanes may still
/// publish; the rules alert when it rises through 10 minutes (`OutboxRelayBatchesFailing`).
pub const BATCH_FAILURES: &str = "outbox_relay_batch_failures_total";
/// Histogram: rows claimed per committed relay batch.
pub const BATCH_SIZE: &str = "outbox_relay_batch_size";
/// Histogram: seconds from a row's `created_at` to its publish ack (commit-to-ack lag, plus
/// the transaction's own duration), labelled `event_type`.
pub const PUBLISH_LAG: &str = "outbox_publish_lag_seconds";
/// Counter: rows that reached the attempt cap; the relay leaves them alone and holds their
/// subject until an operator resets `attempts`. Labelled `event_type`.
pub const AT_CAP: &str = "outbox_events_at_attempt_cap_total";

/// Gauge: age in seconds of the oldest unpublished row the relay should be publishing (0 when
/// there is none): rows of subjects backing off count, rows of held subjects do not (they
/// have [`UNPUBLISHED_HELD`] and [`ROWS_HELD`]). Alert on it: it rises only while the relay is
/// late, not while an event waits for an operator.
pub const OLDEST_UNPUBLISHED_AGE: &str = "outbox_oldest_unpublished_age_seconds";
/// Gauge: unpublished rows (the backlog), the held subjects' included.
pub const UNPUBLISHED: &str = "outbox_unpublished";
/// Gauge: unpublished rows of held subjects: each held row and the rows of its subject that
/// wait behind it. `outbox_unpublished` minus this is the backlog the relay should be
/// publishing.
pub const UNPUBLISHED_HELD: &str = "outbox_unpublished_held";
/// Gauge: unpublished rows at or past the attempt cap right now. Alert on any.
pub const ROWS_AT_CAP: &str = "outbox_rows_at_attempt_cap";
/// Gauge: rows held right now (at the attempt cap, or refused for good): each holds its
/// subject until an operator releases it (`outbox unblock`). Alert on any.
pub const ROWS_HELD: &str = "outbox_rows_held";
/// Gauge: Unix time in seconds of the last refresh of the gauges above. They keep their
/// last values while Postgres cannot be read; alert when this falls behind the clock.
pub const GAUGES_REFRESHED_AT: &str = "outbox_gauges_refreshed_at_seconds";
/// Counter: rows deleted by retention, labelled `table`.
pub const PRUNED: &str = "outbox_retention_deleted_total";
/// Gauge: the share of its time a retention pass spends deleting from `table` now, in percent
/// (`busy_percent` while it keeps up, more while it catches up); 0 once the pass is done with
/// the table.
pub const PRUNE_SHARE: &str = "outbox_retention_busy_percent";

/// Counter: deliveries whose handler committed, labelled `consumer`.
pub const CONSUMER_HANDLED: &str = "outbox_consumer_handled_total";
/// Counter: deliveries of an event id the consumer had already handled: acked, not handled.
/// A rising rate means the relay or the consumer is struggling.
pub const CONSUMER_DUPLICATES: &str = "outbox_consumer_duplicates_total";
/// Counter: handler failures counted against `max_attempts` (each is rolled back and retried,
/// or gives up), labelled `consumer`.
pub const CONSUMER_FAILURES: &str = "outbox_consumer_failures_total";
/// Counter: messages terminated after their last allowed handler attempt failed (dead-lettered
/// first when a dead-letter subject is set). Alert on any.
pub const CONSUMER_GAVE_UP: &str = "outbox_consumer_gave_up_total";
/// Counter: deliveries that were redeliveries (JetStream delivery count above 1).
pub const CONSUMER_REDELIVERIES: &str = "outbox_consumer_redeliveries_total";
/// Counter: messages that could not be decoded (not an envelope, wrong type, invalid payload).
pub const CONSUMER_REJECTED: &str = "outbox_consumer_rejected_total";
/// Counter: transient failures (a lost database connection, a serialization failure, a
/// deadlock, a lock timeout, a [`Transient`](crate::consumer::Transient) handler error),
/// labelled `consumer`: retried without counting an attempt. A sustained rate means the
/// consumer's database is in trouble.
pub const CONSUMER_TRANSIENT: &str = "outbox_consumer_transient_failures_total";
/// Counter: deliveries held back (nak'd without handling) behind an earlier, failing event of
/// the same subject, labelled `consumer`.
pub const CONSUMER_HELD: &str = "outbox_consumer_held_total";
/// Counter: dead letters published, labelled `consumer` and `kind` (`gave-up`,
/// `undecodable`).
pub const CONSUMER_DEAD_LETTERS: &str = "outbox_consumer_dead_letters_total";

/// Registers the relay's unlabelled counters at 0. A Prometheus exporter renders a counter
/// only once it exists, and `increase` misses the first increment of a series that appears:
/// a counter alerted on exists from the start.
pub(crate) fn register_relay() {
    for name in [CUT_BATCHES, DUPLICATES, BATCH_FAILURES] {
        metrics::counter!(name).increment(0);
    }
}

/// Registers `consumer`'s counters at 0 (see [`register_relay`]).
pub(crate) fn register_consumer(consumer: &str) {
    for name in [
        CONSUMER_HANDLED,
        CONSUMER_DUPLICATES,
        CONSUMER_FAILURES,
        CONSUMER_GAVE_UP,
        CONSUMER_REDELIVERIES,
        CONSUMER_REJECTED,
        CONSUMER_TRANSIENT,
        CONSUMER_HELD,
    ] {
        metrics::counter!(name, "consumer" => consumer.to_owned()).increment(0);
    }
}

/// Upper bounds of the latency buckets, in seconds: 0.5 ms to 60 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];
/// Upper bounds of the batch-size buckets: 1 row to the largest batch a relay takes (10,000).
const BATCH_SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
];

/// Every histogram this crate records, with the upper bounds of its buckets (ascending;
/// the exporter adds `+Inf`): [`PUBLISH_LAG`] from 0.5 ms to 60 s, [`BATCH_SIZE`] from 1 row to
/// the largest batch a relay takes (10,000). Give them to the exporter you install, e.g. with
/// metrics-exporter-prometheus:
///
/// ```
/// use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
///
/// # fn main() -> Result<(), metrics_exporter_prometheus::BuildError> {
/// let mut builder = PrometheusBuilder::new();
/// for (name, buckets) in outbox_runtime::metrics::histogram_buckets() {
///     builder = builder.set_buckets_for_metric(Matcher::Full(name.to_string()), buckets)?;
/// }
/// # Ok(()) }
/// ```
pub fn histogram_buckets() -> &'static [(&'static str, &'static [f64])] {
    &[
        (PUBLISH_LAG, LATENCY_BUCKETS),
        (BATCH_SIZE, BATCH_SIZE_BUCKETS),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_ascend_and_the_batch_buckets_reach_the_largest_batch() {
        for (name, buckets) in histogram_buckets() {
            assert!(!buckets.is_empty(), "{name} has no buckets");
            assert!(
                buckets.windows(2).all(|w| w[0] < w[1]),
                "{name}'s buckets do not ascend: {buckets:?}"
            );
        }
        assert_eq!(LATENCY_BUCKETS.first(), Some(&0.0005));
        assert_eq!(LATENCY_BUCKETS.last(), Some(&60.0));
        let largest = crate::RelayConfig {
            batch_size: 10_000,
            ..Default::default()
        };
        assert!(largest.validate().is_ok());
        let over = crate::RelayConfig {
            batch_size: 10_001,
            ..Default::default()
        };
        assert!(
            over.validate().is_err(),
            "the relay takes larger batches than the batch-size buckets reach"
        );
        assert_eq!(BATCH_SIZE_BUCKETS.last(), Some(&10_000.0));
    }

    /// Every `histogram!` in this crate's source names a constant that has buckets.
    #[test]
    fn every_recorded_histogram_has_buckets() {
        let mut found = 0;
        let mut dirs = vec![std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src"
        ))];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("read the source folder") {
                let path = entry.expect("a source entry").path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                if path.ends_with("metrics.rs") {
                    continue; // this file: its test names the macro
                }
                let text = std::fs::read_to_string(&path).expect("read a source file");
                for call in text.split("histogram!(names::").skip(1) {
                    let constant: String = call
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                        .collect();
                    let name = match constant.as_str() {
                        "PUBLISH_LAG" => PUBLISH_LAG,
                        "BATCH_SIZE" => BATCH_SIZE,
                        other => panic!(
                            "{}: histogram `{other}` is not in histogram_buckets() (add it there and here)",
                            path.display()
                        ),
                    };
                    assert!(histogram_buckets().iter().any(|(n, _)| *n == name));
                    found += 1;
                }
            }
        }
        assert!(
            found >= 2,
            "found {found} histogram! calls; the scan reads the wrong files"
        );
    }
}
