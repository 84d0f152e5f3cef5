//! Names of the metrics this crate records through the [`metrics`](https://docs.rs/metrics)
//! facade. Install any exporter (Prometheus, StatsD, ...) to collect them.

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
/// Histogram: rows claimed per committed relay batch.
pub const BATCH_SIZE: &str = "outbox_relay_batch_size";
/// Histogram: seconds from a row's `created_at` to its publish ack (commit-to-ack lag, plus
/// the transaction's own duration).
pub const PUBLISH_LAG: &str = "outbox_publish_lag_seconds";
/// Counter: rows that reached the attempt cap; the relay leaves them alone and holds their
/// subject until an operator resets `attempts`. Labelled `event_type`.
pub const AT_CAP: &str = "outbox_events_at_attempt_cap_total";

/// Gauge: age in seconds of the oldest unpublished row (0 when there is none). Alert on it.
pub const OLDEST_UNPUBLISHED_AGE: &str = "outbox_oldest_unpublished_age_seconds";
/// Gauge: unpublished rows (the backlog).
pub const UNPUBLISHED: &str = "outbox_unpublished";
/// Gauge: unpublished rows at or past the attempt cap right now. Alert on any.
pub const ROWS_AT_CAP: &str = "outbox_rows_at_attempt_cap";
/// Gauge: Unix time in seconds of the last refresh of the three gauges above. They keep their
/// last values while Postgres cannot be read; alert when this falls behind the clock.
pub const GAUGES_REFRESHED_AT: &str = "outbox_gauges_refreshed_at_seconds";
/// Counter: rows deleted by retention, labelled `table`.
pub const PRUNED: &str = "outbox_retention_deleted_total";

/// Counter: deliveries whose handler committed, labelled `consumer`.
pub const CONSUMER_HANDLED: &str = "outbox_consumer_handled_total";
/// Counter: deliveries of an event id the consumer had already handled: acked, not handled.
/// A rising rate means the relay or the consumer is struggling.
pub const CONSUMER_DUPLICATES: &str = "outbox_consumer_duplicates_total";
/// Counter: handler failures (each is rolled back and retried), labelled `consumer`.
pub const CONSUMER_FAILURES: &str = "outbox_consumer_failures_total";
/// Counter: messages terminated after their last allowed delivery failed. Alert on any.
pub const CONSUMER_GAVE_UP: &str = "outbox_consumer_gave_up_total";
/// Counter: deliveries that were redeliveries (JetStream delivery count above 1).
pub const CONSUMER_REDELIVERIES: &str = "outbox_consumer_redeliveries_total";
/// Counter: messages that could not be decoded (not an envelope, wrong type, invalid payload).
pub const CONSUMER_REJECTED: &str = "outbox_consumer_rejected_total";
