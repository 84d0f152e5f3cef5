//! The horizon: an instant before which no transaction still running on the database began,
//! read without any privilege (docs/relay.md, *The cursor*).
//!
//! A row committed later by a transaction running now has a `created_at` at or after that
//! transaction's start (when its writer uses `emit`'s `clock_timestamp()` or the column's
//! default `now()`), so a cursor that stays before the horizon never passes a row that is yet
//! to commit. Postgres tells a role without `pg_read_all_stats` neither when other roles'
//! transactions began nor whether they are in one (`pg_stat_activity` hides it), and prepared
//! transactions are not sessions at all; but every role can read `pg_locks`, where every
//! running transaction holds the lock on its own virtual transaction id from its start, and
//! `pg_prepared_xacts`. So the relay samples which transactions run, now and then, and a
//! transaction first seen in a sample began after the sample before it (the instants are the
//! database's, `statement_timestamp()`, read before the locks are). A transaction already
//! running at the relay's first sample, or a prepared one that cannot be traced to a sampled
//! one, began at an unknown time: the horizon stays at `-infinity` until it ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row as _};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::position::Stamp;
use super::tx::{timed, Tx};
use crate::error::{Error, Result};
use crate::table::OUTBOX_EVENTS;

/// Added to the distance between a sample and a transaction's start: the instant `now()`
/// returns is taken as the first statement of the transaction arrives, just before its
/// virtual transaction id is locked (a backend descheduled in between could take some time).
pub(super) const MARGIN_MICROS: i64 = 1_000_000;

/// One sample: the instant it was taken (before the locks were read), the running
/// transactions of the database (a key unique to each: backend pid and virtual transaction
/// id, with its transaction id once it has one), and the prepared transactions' ids.
#[derive(Debug, Clone, Default)]
pub(super) struct Sample {
    pub(super) at: Option<Stamp>,
    pub(super) running: Vec<(String, Option<String>)>,
    pub(super) prepared: Vec<String>,
}

/// A running transaction as [`SAMPLE`](super::sql::SAMPLE) reads it, `pid:vxid:xid` (the last
/// part empty without a transaction id): its key (`pid:vxid`) and its transaction id.
pub(super) fn running(text: &str) -> (String, Option<String>) {
    match text.rsplit_once(':') {
        Some((key, "")) => (key.to_owned(), None),
        Some((key, xid)) => (key.to_owned(), Some(xid.to_owned())),
        None => (text.to_owned(), None),
    }
}

/// The relay's record of the running transactions over its samples.
#[derive(Debug, Default)]
pub(super) struct Horizon {
    /// The previous sample's instant (`None` before the first).
    last: Option<Stamp>,
    /// Each running transaction of the last sample: the latest instant it is known to have
    /// begun after (`None`: unknown, it was running at the first sample).
    began_after: HashMap<String, Option<Stamp>>,
    /// The same, by transaction id, for the transactions that have one: a prepared
    /// transaction keeps its id but not its virtual one.
    by_xid: HashMap<String, Option<Stamp>>,
    /// The horizon after the last sample.
    safe: Option<Stamp>,
}

impl Horizon {
    /// The horizon: no transaction running at the last sample began before it.
    pub(super) fn safe(&self) -> Option<Stamp> {
        self.safe
    }

    /// Takes `sample` into account and returns the new horizon. A sample without an instant
    /// (the read failed) changes nothing.
    pub(super) fn observe(&mut self, sample: Sample) -> Option<Stamp> {
        let Some(at) = sample.at else {
            return self.safe;
        };
        if self.last.is_some_and(|last| at <= last) {
            // taken before the last one it is compared with (two lanes sampled at once)
            return self.safe;
        }
        let before = self.last;
        let mut began_after = HashMap::with_capacity(sample.running.len());
        let mut by_xid = HashMap::new();
        for (key, xid) in sample.running {
            let after = self.began_after.get(&key).copied().unwrap_or(before);
            if let Some(xid) = xid {
                by_xid.insert(xid, after);
            }
            began_after.insert(key, after);
        }
        // a prepared transaction whose id was not seen running began after the previous
        // sample, or was one of the transactions running then that are gone now (preparing
        // it gave its virtual id up) before their ids were seen
        let gone = self
            .began_after
            .iter()
            .filter(|(key, _)| !began_after.contains_key(*key))
            .map(|(_, after)| *after)
            .fold(before, min_known);
        for xid in sample.prepared {
            let after = self.by_xid.get(&xid).copied().unwrap_or(gone);
            by_xid.insert(xid, after);
        }
        let oldest = by_xid
            .values()
            .chain(began_after.values())
            .copied()
            .fold(Some(at), min_known);
        self.last = Some(at);
        self.began_after = began_after;
        self.by_xid = by_xid;
        // never earlier than the last one: every bound above was the previous sample's
        // instant or a bound the previous horizon was already at or before
        self.safe = oldest.map(|t| t.minus_micros(MARGIN_MICROS));
        self.safe
    }
}

/// How often the relay samples the running transactions, at most: only while batches run
/// (they ask for a sample as they start), so an idle relay samples at its lanes' sweeps (at
/// their polls, while it has no horizon and its cursors have nothing below them to sweep).
const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// How often, at most, while Postgres refuses the samples (a view revoked from `public`): each
/// refusal is an error in the server's log, and a grant given back is seen within this.
const REFUSED_SAMPLE_EVERY: Duration = Duration::from_secs(10);

/// The relay's [`Horizon`], shared by its lanes, which read it at every batch. The samples are
/// taken beside the batches, not in them ([`keep_sampling`](Self::keep_sampling)), so that a
/// batch neither waits for one nor fails with it (`pg_locks` revoked from `public`). A batch
/// uses the horizon of the samples taken before it, which is never later than one taken in it
/// would be: the horizon only moves on.
#[derive(Debug, Default)]
pub(super) struct SharedHorizon {
    inner: std::sync::Mutex<(Horizon, Option<Instant>)>,
    /// A batch asked for a sample.
    asked: Notify,
    /// Held through a sample and its observation: samples never overlap, so each is observed
    /// after every sample whose locks were read before its own (`Relay::claim` samples too).
    sampling: tokio::sync::Mutex<()>,
    /// Postgres refused the last sample: warned once until one works, and samples are asked
    /// for every [`REFUSED_SAMPLE_EVERY`] meanwhile.
    refused: AtomicBool,
}

impl SharedHorizon {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Horizon, Option<Instant>)> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a sample is wanted at `now`: none was asked for within [`SAMPLE_EVERY`], or
    /// within [`REFUSED_SAMPLE_EVERY`] while Postgres refuses them.
    pub(super) fn wants_sample(&self, now: Instant) -> bool {
        let every = if self.refused.load(Ordering::Relaxed) {
            REFUSED_SAMPLE_EVERY
        } else {
            SAMPLE_EVERY
        };
        let mut inner = self.lock();
        let wants = inner
            .1
            .is_none_or(|t| now.saturating_duration_since(t) >= every);
        if wants {
            inner.1 = Some(now);
        }
        wants
    }

    /// The horizon for a lane's batch starting at `now`; asks
    /// [`keep_sampling`](Self::keep_sampling) for a sample when it is due, without waiting
    /// for it.
    pub(super) fn for_lane(&self, now: Instant) -> Option<Stamp> {
        if self.wants_sample(now) {
            // a permit is kept while a sample is under way: the ask is never lost
            self.asked.notify_one();
        }
        self.safe()
    }

    /// Takes a sample on `pool` whenever a lane asks ([`for_lane`](Self::for_lane)), until
    /// dropped ([`sample_on`](Self::sample_on)). A connection that gave no answer is closed.
    pub(super) async fn keep_sampling(&self, pool: &PgPool) {
        loop {
            self.asked.notified().await;
            let outcome = match Tx::acquire(pool, None).await {
                Ok((mut tx, _)) => self.sample_on(tx.conn()).await.map(|()| tx.release()),
                Err(e) => Err(e),
            };
            // a failed Tx was dropped: its connection is closed, as a batch's would be
            if let Err(e) = outcome {
                tracing::debug!(error = %e, "outbox relay could not sample the running transactions");
            }
        }
    }

    /// Samples the running transactions on `conn` and observes the sample. An error Postgres
    /// answers with changes nothing and leaves `conn` as it was: the cursors stay where they
    /// are, and the batches go on; a refusal (a privilege on `pg_locks` revoked) is logged at
    /// warn, once until a sample works again, and the next sample waits
    /// [`REFUSED_SAMPLE_EVERY`] (each later refusal at debug). Any other error (no answer
    /// within the batches' bound, a connection that failed) is returned, and `conn` is not to
    /// be used again.
    pub(super) async fn sample_on(&self, conn: &mut PgConnection) -> Result<()> {
        let _one = self.sampling.lock().await;
        match take(conn).await {
            Ok(sample) => {
                if self.refused.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        "outbox relay samples the running transactions again; its cursors move on"
                    );
                }
                self.observe(sample);
                Ok(())
            }
            Err(Error::Database(sqlx::Error::Database(db))) => {
                if !super::lease::refusal(db.code().as_deref()) {
                    tracing::debug!(error = %db, "outbox relay could not sample the running transactions");
                } else if self.refused.swap(true, Ordering::Relaxed) {
                    tracing::debug!(error = %db, "outbox relay's sample of the running transactions was refused again; it asks again in {REFUSED_SAMPLE_EVERY:?}");
                } else {
                    tracing::warn!(error = %db, "outbox relay could not sample the running transactions (pg_locks, pg_stat_activity, pg_prepared_xacts: readable by every role unless revoked); it goes on publishing, but its cursors stay where they are, so its claims read more of the table's index until it can (it asks again every {REFUSED_SAMPLE_EVERY:?})");
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// [`Horizon::observe`].
    pub(super) fn observe(&self, sample: Sample) -> Option<Stamp> {
        self.lock().0.observe(sample)
    }

    /// [`Horizon::safe`].
    pub(super) fn safe(&self) -> Option<Stamp> {
        self.lock().0.safe()
    }
}

/// A sample ([`SAMPLE`](super::sql::SAMPLE)) read on `conn`, within the batches' bound on an
/// answer.
async fn take(conn: &mut PgConnection) -> Result<Sample> {
    let row: PgRow = timed(
        OUTBOX_EVENTS,
        sqlx::query(super::sql::SAMPLE).fetch_one(conn),
    )
    .await?;
    let get = |e| OUTBOX_EVENTS.error(e);
    let list = |text: Option<String>| -> Vec<String> {
        text.unwrap_or_default()
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let micros: Option<i64> = row.try_get("sampled_at").map_err(get)?;
    Ok(Sample {
        at: micros.map(Stamp),
        running: list(row.try_get("running").map_err(get)?)
            .iter()
            .map(|r| running(r))
            .collect(),
        prepared: list(row.try_get("prepared").map_err(get)?),
    })
}

/// The earlier of two lower bounds, `None` being "unknown" (the earliest of all).
fn min_known(a: Option<Stamp>, b: Option<Stamp>) -> Option<Stamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000; // a second, in microseconds

    fn sample(at: i64, running: &[(&str, Option<&str>)], prepared: &[&str]) -> Sample {
        Sample {
            at: Some(Stamp(at)),
            running: running
                .iter()
                .map(|(k, x)| ((*k).to_owned(), x.map(str::to_owned)))
                .collect(),
            prepared: prepared.iter().map(|x| (*x).to_owned()).collect(),
        }
    }

    fn safe(h: &Horizon) -> Option<i64> {
        h.safe().map(|s| s.0)
    }

    #[test]
    fn transactions_running_at_the_first_sample_hold_the_horizon_until_they_end() {
        let mut h = Horizon::default();
        h.observe(sample(10 * S, &[("1:3/1", None)], &[]));
        assert_eq!(safe(&h), None, "it may have begun at any time");
        h.observe(sample(11 * S, &[("1:3/1", None), ("2:4/9", None)], &[]));
        assert_eq!(safe(&h), None);
        h.observe(sample(12 * S, &[("2:4/9", None)], &[]));
        assert_eq!(
            safe(&h),
            Some(10 * S - MARGIN_MICROS),
            "4/9 began after the first sample"
        );
    }

    #[test]
    fn with_nothing_running_the_horizon_is_the_sample_itself() {
        let mut h = Horizon::default();
        h.observe(sample(10 * S, &[], &[]));
        assert_eq!(safe(&h), Some(10 * S - MARGIN_MICROS));
        h.observe(sample(11 * S, &[("5:1/1", None)], &[]));
        assert_eq!(
            safe(&h),
            Some(10 * S - MARGIN_MICROS),
            "1/1 began after 10 s"
        );
    }

    #[test]
    fn a_prepared_transaction_keeps_the_start_its_running_self_was_seen_with() {
        let mut h = Horizon::default();
        h.observe(sample(10 * S, &[], &[]));
        h.observe(sample(11 * S, &[("7:2/5", Some("900"))], &[]));
        // prepared: its virtual id is gone, its transaction id stays
        h.observe(sample(20 * S, &[], &["900"]));
        assert_eq!(safe(&h), Some(10 * S - MARGIN_MICROS));
        h.observe(sample(30 * S, &[], &[]));
        assert_eq!(
            safe(&h),
            Some(30 * S - MARGIN_MICROS),
            "committed: the horizon moves on"
        );
    }

    #[test]
    fn a_prepared_transaction_never_seen_with_its_id_counts_from_the_oldest_that_went() {
        let mut h = Horizon::default();
        h.observe(sample(10 * S, &[], &[]));
        h.observe(sample(11 * S, &[("7:2/5", None), ("8:3/1", None)], &[]));
        // 2/5 got an id and prepared between two samples
        h.observe(sample(12 * S, &[("8:3/1", None)], &["901"]));
        assert_eq!(safe(&h), Some(10 * S - MARGIN_MICROS));
        let mut fresh = Horizon::default();
        fresh.observe(sample(10 * S, &[], &["55"]));
        assert_eq!(
            safe(&fresh),
            None,
            "prepared before the relay looked: unknown"
        );
    }

    #[test]
    fn a_running_transaction_reads_as_its_key_and_its_id() {
        assert_eq!(running("12:3/4:"), ("12:3/4".to_owned(), None));
        assert_eq!(
            running("12:3/4:900"),
            ("12:3/4".to_owned(), Some("900".to_owned()))
        );
    }

    #[test]
    fn a_sample_older_than_the_last_one_is_ignored() {
        let mut h = Horizon::default();
        h.observe(sample(10 * S, &[], &[]));
        h.observe(sample(12 * S, &[("1:1/1", None)], &[]));
        h.observe(sample(11 * S, &[], &[]));
        assert_eq!(safe(&h), Some(10 * S - MARGIN_MICROS));
    }

    #[test]
    fn a_failed_sample_changes_nothing() {
        let mut h = Horizon::default();
        h.observe(sample(10 * S, &[], &[]));
        h.observe(Sample::default());
        assert_eq!(safe(&h), Some(10 * S - MARGIN_MICROS));
        h.observe(sample(20 * S, &[], &[]));
        assert_eq!(safe(&h), Some(20 * S - MARGIN_MICROS));
        // a transaction first seen now began after the failed read's predecessor at least
        h.observe(sample(21 * S, &[("9:1/1", None)], &[]));
        assert_eq!(safe(&h), Some(20 * S - MARGIN_MICROS));
    }

    #[test]
    fn samples_are_asked_for_every_200_ms_and_every_10_s_while_refused() {
        let shared = SharedHorizon::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert!(shared.wants_sample(at(0)), "the first sample");
        assert!(!shared.wants_sample(at(199)));
        assert!(shared.wants_sample(at(200)));
        shared.refused.store(true, Ordering::Relaxed);
        assert!(!shared.wants_sample(at(400)), "refused: not at 200 ms");
        assert!(!shared.wants_sample(at(10_199)));
        assert!(shared.wants_sample(at(10_200)), "refused: again after 10 s");
        shared.refused.store(false, Ordering::Relaxed);
        assert!(
            shared.wants_sample(at(10_400)),
            "given back: every 200 ms again"
        );
    }
}
