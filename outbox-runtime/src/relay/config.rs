//! [`RelayConfig`]: the relay's settings and the schedules derived from them.

use std::time::Duration;

use crate::error::{Error, Result};

/// The relay's settings: a server-side configuration, `Default` style. What each one does is
/// specified in the
/// repository's `docs/relay.md`.
///
/// ```
/// use std::time::Duration;
/// use outbox_runtime::RelayConfig;
///
/// let config = RelayConfig {
///     batch_size: 500,
///     backoff_max: Duration::from_secs(60),
///     event_types: vec!["billing.invoice.paid".into()],
///     ..Default::default()
/// };
/// assert_eq!(config.backoff(1), Duration::from_secs(1));
/// assert_eq!(config.backoff(3), Duration::from_secs(4));
/// assert_eq!(config.backoff(30), Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayConfig {
    /// Rows claimed per batch. Default 500: per-batch costs are amortised over more rows while
    /// a batch stays a few milliseconds of row locks (docs/performance.md).
    pub batch_size: usize,
    /// The deadline for all publishes and acks of one batch. Default 5 s.
    pub ack_timeout: Duration,
    /// The wait after the first failure; it doubles with each consecutive failure. Default 1 s.
    pub backoff_base: Duration,
    /// The longest wait between retries. Default 5 min.
    pub backoff_max: Duration,
    /// Attempts after which a row is left alone and its subject held. Default 20.
    pub max_attempts: i32,
    /// The fallback poll, for notifications lost while the listener reconnects. Default 5 s.
    pub poll_interval: Duration,
    /// Subject partitions the lanes share out (a subject's partition is a hash of it). Default
    /// 1024, which the unpublished index of migration 0010 bounds, so that a lane reads only its
    /// own rows (docs/relay.md, *Lanes*).
    pub partitions: i32,
    /// Batch loops the relay holding the lease runs at once, each on its share of the
    /// partitions; the pool must allow `lanes + 2` connections. Between 1 and 64, at most
    /// `partitions`. Default 2 (docs/relay.md, *Lanes*).
    pub lanes: usize,
    /// Event types this relay is expected to publish. At start it checks that a stream captures
    /// each one and that the stream's duplicate window covers
    /// [`retry_horizon`](Self::retry_horizon). Empty (the default) skips the check.
    pub event_types: Vec<String>,
    /// The old name of [`event_types`](Self::event_types), which the relay still reads (the two
    /// lists are checked together); it goes in the next release. "Subject" is the entity key
    /// of an event everywhere else.
    #[deprecated(
        since = "0.1.0",
        note = "renamed `event_types` (a subject is an event's entity key); the relay checks both lists until this field goes in the next release"
    )]
    pub subjects: Vec<String>,
}

/// The longest pause of a lane after failed batches (Postgres or the broker down).
pub(crate) const LOOP_BACKOFF_MAX: Duration = Duration::from_secs(5);

// the deprecated `subjects` is set here like every field
#[allow(deprecated)]
impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            batch_size: 500,
            ack_timeout: Duration::from_secs(5),
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            max_attempts: 20,
            poll_interval: Duration::from_secs(5),
            partitions: 1024,
            lanes: 2,
            event_types: Vec::new(),
            subjects: Vec::new(),
        }
    }
}

impl RelayConfig {
    /// Checks that every value can work; [`Error::Config`] says which one does not.
    ///
    /// ```
    /// let config = outbox_runtime::RelayConfig { batch_size: 0, ..Default::default() };
    /// assert!(config.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<()> {
        let fail = |m: &str| Err(Error::Config(m.to_owned()));
        if self.batch_size == 0 || self.batch_size > 10_000 {
            return fail("relay batch_size must be between 1 and 10000");
        }
        if self.ack_timeout.is_zero() {
            return fail("relay ack_timeout must be greater than zero");
        }
        if self.backoff_base.is_zero() {
            return fail("relay backoff_base must be greater than zero, or a broker outage becomes a hot loop");
        }
        if self.backoff_max < self.backoff_base {
            return fail("relay backoff_max must be at least backoff_base");
        }
        if self.max_attempts < 1 {
            return fail("relay max_attempts must be at least 1");
        }
        if self.poll_interval.is_zero() {
            return fail("relay poll_interval must be greater than zero");
        }
        if self.partitions < 1 {
            return fail("relay partitions must be at least 1");
        }
        if self.lanes == 0 || self.lanes > 64 || self.lanes > self.partitions as usize {
            return fail("relay lanes must be between 1 and 64, and at most partitions");
        }
        Ok(())
    }

    /// The event types the start-up check looks at: [`event_types`](Self::event_types), then
    /// those still given under the deprecated name `subjects`, once each.
    ///
    /// Code that sets the old field compiles, with a deprecation warning (the unit test below
    /// checks that its types are checked):
    ///
    /// ```
    /// #![allow(deprecated)]
    /// let config = outbox_runtime::RelayConfig {
    ///     subjects: vec!["billing.invoice.paid".into()],
    ///     ..Default::default()
    /// };
    /// ```
    ///
    /// and the warning is there: denied, it is an error.
    ///
    /// ```compile_fail
    /// #![deny(deprecated)]
    /// let config = outbox_runtime::RelayConfig {
    ///     subjects: vec!["billing.invoice.paid".into()],
    ///     ..Default::default()
    /// };
    /// ```
    ///
    /// The new field alone warns about nothing.
    ///
    /// ```
    /// #![deny(deprecated)]
    /// let config = outbox_runtime::RelayConfig {
    ///     event_types: vec!["billing.invoice.paid".into()],
    ///     ..Default::default()
    /// };
    /// ```
    pub(crate) fn checked_event_types(&self) -> Vec<String> {
        #[allow(deprecated)]
        let old_name = &self.subjects;
        let mut types = self.event_types.clone();
        for t in old_name {
            if !types.contains(t) {
                types.push(t.clone());
            }
        }
        types
    }

    /// The wait after `failures` consecutive failures: `backoff_base * 2^(failures - 1)`, capped
    /// at `backoff_max` (zero for no failure).
    pub fn backoff(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let factor = 1u32 << (failures - 1).min(30);
        self.backoff_base
            .checked_mul(factor)
            .unwrap_or(self.backoff_max)
            .min(self.backoff_max)
    }

    /// The connections a relay's pool should allow: one per lane, one for the lease, one for
    /// the backlog gauges, and two to spare. The wake lock's and the `LISTEN` connections are
    /// opened beside the pool, with the pool's connect options, so that the server can end them
    /// by itself when the relay freezes (the server counts them: `lanes + 6` connections in
    /// all).
    /// [`Relay::connect`](crate::Relay::connect) opens a pool of this size;
    /// [`Relay::new`](crate::Relay::new) refuses a pool of fewer than `lanes + 2`.
    ///
    /// ```
    /// let config = outbox_runtime::RelayConfig { lanes: 2, ..Default::default() };
    /// assert_eq!(config.pool_size(), 6);
    /// ```
    pub fn pool_size(&self) -> u32 {
        u32::try_from(self.lanes).map_or(u32::MAX, |l| l.saturating_add(4))
    }

    /// The longest time between two publishes of one row while the broker answers: the
    /// first one's deadline (`ack_timeout`), the longest backoff (`backoff_max`), then at most
    /// a lane's pause after a failed batch (5 s) and one batch's statements (10 s) until a lane
    /// takes it again (lanes wake when a retry comes due, whatever `poll_interval` says).
    /// A stream's duplicate window must be at least this long, so that a row whose ack was lost
    /// is recognised as a duplicate when it is republished. (A broker outage adds its own
    /// length, which no window can cover: the consumers' dedupe absorbs those duplicates.)
    ///
    /// ```
    /// let horizon = outbox_runtime::RelayConfig::default().retry_horizon();
    /// assert_eq!(horizon.as_secs(), 5 + 300 + 5 + 10);
    /// ```
    pub fn retry_horizon(&self) -> Duration {
        self.ack_timeout + self.backoff_max + LOOP_BACKOFF_MAX + super::tx::STATEMENT_TIMEOUT
    }

    /// The longest [`Relay::run`](crate::Relay::run) takes to return after its `shutdown`
    /// future completes: its batches finish within `ack_timeout + 15 s` (past that they are
    /// given up, leaving their rows unpublished as a crash would), then it gives the relay lease
    /// up, waiting 5 s at most.
    ///
    /// ```
    /// let config = outbox_runtime::RelayConfig::default();
    /// assert_eq!(config.shutdown_bound().as_secs(), 5 + 15 + 5);
    /// ```
    pub fn shutdown_bound(&self) -> Duration {
        self.ack_timeout + super::run::SHUTDOWN_MARGIN + super::lease::LEASE
    }

    /// How long a batch's transaction may wait for the relay: longer than its publishing
    /// (`ack_timeout`), short enough that a frozen relay's locks go within seconds.
    pub(crate) fn idle_in_transaction_timeout(&self) -> Duration {
        self.ack_timeout + Duration::from_secs(5)
    }

    /// The lane's wait after `failures` consecutive failed batches: [`backoff`](Self::backoff),
    /// but never longer than [`LOOP_BACKOFF_MAX`], so that the relay is back within seconds of
    /// the end of an outage however long it was.
    pub(crate) fn loop_backoff(&self, failures: u32) -> Duration {
        self.backoff(failures).min(LOOP_BACKOFF_MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::RelayConfig;

    /// Code written against the old field name still compiles (with a deprecation warning,
    /// allowed here) and its event types are checked with the new field's.
    #[test]
    #[allow(deprecated)]
    fn the_deprecated_subjects_are_checked_with_the_event_types() {
        let old = RelayConfig {
            subjects: vec!["billing.invoice.paid".into(), "billing.invoice.sent".into()],
            ..Default::default()
        };
        assert!(old.validate().is_ok());
        assert_eq!(
            old.checked_event_types(),
            ["billing.invoice.paid", "billing.invoice.sent"]
        );
        let both = RelayConfig {
            event_types: vec![
                "billing.invoice.sent".into(),
                "billing.invoice.voided".into(),
            ],
            ..old
        };
        assert_eq!(
            both.checked_event_types(),
            [
                "billing.invoice.sent",
                "billing.invoice.voided",
                "billing.invoice.paid"
            ]
        );
        assert!(RelayConfig::default().checked_event_types().is_empty());
    }
}
