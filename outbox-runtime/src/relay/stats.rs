//! What the relay counts: the report of one batch, the totals since start, and the metrics a
//! committed batch records.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::row::Row;
use crate::metrics as names;

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows acknowledged by JetStream (duplicates included) and marked published.
    pub published: usize,
    /// Of `published`, acks that JetStream flagged as duplicates.
    pub duplicates: usize,
    /// Rows whose publish failed; their `attempts` grew by one.
    pub failed: usize,
    /// Rows claimed but not attempted: an earlier event of their subject failed in this batch,
    /// the deadline passed first, the row is at the attempt cap, or the claim cut its subject
    /// before an older row it does not hold (docs/relay.md, *Order*). Their `attempts` are
    /// unchanged.
    pub skipped: usize,
    /// Of `failed`, rows that reached the attempt cap with this failure.
    pub capped: usize,
}

/// Totals since the relay was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Batches committed.
    pub batches: u64,
    /// Rows claimed.
    pub claimed: u64,
    /// Rows published (duplicates included).
    pub published: u64,
    /// Duplicate acks.
    pub duplicates: u64,
    /// Failed publish attempts (each one `attempts + 1` on its row).
    pub failed: u64,
    /// Rows claimed but not attempted.
    pub skipped: u64,
    /// Rows that reached the attempt cap.
    pub capped: u64,
}

/// The relay's running totals, shared by its lanes.
#[derive(Debug, Default)]
pub(super) struct Counters {
    batches: AtomicU64,
    claimed: AtomicU64,
    published: AtomicU64,
    duplicates: AtomicU64,
    failed: AtomicU64,
    skipped: AtomicU64,
    capped: AtomicU64,
}

impl Counters {
    pub(super) fn add(&self, r: &BatchReport) {
        self.batches.fetch_add(1, Relaxed);
        self.claimed.fetch_add(r.claimed as u64, Relaxed);
        self.published.fetch_add(r.published as u64, Relaxed);
        self.duplicates.fetch_add(r.duplicates as u64, Relaxed);
        self.failed.fetch_add(r.failed as u64, Relaxed);
        self.skipped.fetch_add(r.skipped as u64, Relaxed);
        self.capped.fetch_add(r.capped as u64, Relaxed);
    }

    pub(super) fn snapshot(&self) -> RelayStats {
        RelayStats {
            batches: self.batches.load(Relaxed),
            claimed: self.claimed.load(Relaxed),
            published: self.published.load(Relaxed),
            duplicates: self.duplicates.load(Relaxed),
            failed: self.failed.load(Relaxed),
            skipped: self.skipped.load(Relaxed),
            capped: self.capped.load(Relaxed),
        }
    }
}

/// The metrics of a committed batch: its size, and one increment per event type and counter.
pub(super) fn record_batch(
    max_attempts: i32,
    rows: &[Row],
    acked: &[usize],
    failed: &[(usize, &'static str)],
    report: &BatchReport,
) {
    #[derive(Default)]
    struct PerType {
        published: u64,
        capped: u64,
    }
    metrics::histogram!(names::BATCH_SIZE).record(report.claimed as f64);
    let mut per_type: HashMap<&str, PerType> = HashMap::new();
    for &i in acked {
        per_type.entry(&rows[i].event_type).or_default().published += 1;
    }
    let mut failures: HashMap<(&str, &'static str), u64> = HashMap::new();
    for &(i, reason) in failed {
        let row = &rows[i];
        *failures.entry((&row.event_type, reason)).or_default() += 1;
        if row.attempts + 1 >= max_attempts {
            per_type.entry(&row.event_type).or_default().capped += 1;
        }
    }
    for ((event_type, reason), n) in failures {
        metrics::counter!(names::PUBLISH_FAILURES, "event_type" => event_type.to_owned(), "reason" => reason)
            .increment(n);
    }
    for (event_type, t) in per_type {
        if t.published > 0 {
            metrics::counter!(names::PUBLISHED, "event_type" => event_type.to_owned())
                .increment(t.published);
        }
        if t.capped > 0 {
            metrics::counter!(names::AT_CAP, "event_type" => event_type.to_owned())
                .increment(t.capped);
        }
    }
    if report.duplicates > 0 {
        metrics::counter!(names::DUPLICATES).increment(report.duplicates as u64);
    }
}
