//! The tables the crate reads and writes, each with the migration that creates it, so that a
//! missing table is reported as such.

use crate::error::Error;

/// A table of the outbox's migrations.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Table {
    /// Its name.
    pub(crate) name: &'static str,
    /// The migration (under `migrations/`) that creates it.
    pub(crate) migration: &'static str,
}

/// The outbox table.
pub(crate) const OUTBOX_EVENTS: Table = Table {
    name: "outbox_events",
    migration: "0001_outbox_events.sql",
};

/// The consumers' dedupe table.
pub(crate) const OUTBOX_CONSUMED: Table = Table {
    name: "outbox_consumed",
    migration: "0002_outbox_consumer.sql",
};

/// The consumers' per-subject positions.
pub(crate) const SUBJECT_POSITIONS: Table = Table {
    name: "outbox_subject_positions",
    migration: "0002_outbox_consumer.sql",
};

/// The relay's retry schedule.
pub(crate) const CONSUMER_ATTEMPTS: Table = Table {
    name: "outbox_consumer_attempts",
    migration: "0006_consumer_attempts.sql",
};

pub(crate) const CONSUMER_NAMES: Table = Table {
    name: "outbox_consumer_names",
    migration: "0006_consumer_attempts.sql",
};

pub(crate) const SUBJECT_SEQUENCES: Table = Table {
    name: "outbox_subject_sequences",
    migration: "0006_consumer_attempts.sql",
};

pub(crate) const DEDUPE_HORIZON: Table = Table {
    name: "outbox_dedupe_horizon",
    migration: "0006_consumer_attempts.sql",
};

pub(crate) const OUTBOX_RETRIES: Table = Table {
    name: "outbox_retries",
    migration: "0005_outbox_retries.sql",
};

/// The relay lease: which of the relays running on the table publishes.
pub(crate) const OUTBOX_RELAY_LEASE: Table = Table {
    name: "outbox_relay_lease",
    migration: "0011_outbox_relay_lease.sql",
};

/// The migration that adds the trace context columns (`traceparent`, `tracestate`) to the
/// outbox table.
pub(crate) const TRACE_CONTEXT_MIGRATION: &str = "0007_outbox_trace_context.sql";

impl Table {
    /// `e`, with "relation does not exist" turned into [`Error::MissingTable`] naming this
    /// table's migration.
    pub(crate) fn error(&self, e: sqlx::Error) -> Error {
        if let sqlx::Error::Database(db) = &e {
            if db.code().as_deref() == Some("42P01") {
                return Error::MissingTable {
                    table: self.name,
                    migration: self.migration,
                };
            }
        }
        Error::Database(e)
    }
}
