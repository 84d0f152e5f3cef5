//! Names of the metrics this crate records through the [`metrics`](https://docs.rs/metrics)
//! facade. Install any exporter (Prometheus, StatsD, ...) to collect them.

/// Counter: events inserted by `emit`, labelled `event_type`.
pub const EMITTED: &str = "outbox_events_emitted_total";
