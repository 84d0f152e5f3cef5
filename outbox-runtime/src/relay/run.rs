//! [`Relay::run`]: the lanes' batch loops, until shutdown (docs/relay.md, *Lanes*,
//! *Wake-up*, *Failures and shutdown*).

use std::future::Future;

use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

use super::lanes::{Lane, LaneState, Next, Outcome, Waiting};
use super::listen::{listen, AbortOnDrop};
use super::Relay;
use crate::error::Result;

/// How often a running relay refreshes the backlog gauges.
const GAUGE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

impl Relay {
    /// Runs batches, in [`RelayConfig::lanes`](super::RelayConfig::lanes) loops at once, until
    /// `shutdown` completes, then returns. The batches in progress when it completes are
    /// finished and committed first.
    ///
    /// While it runs, it also refreshes the backlog gauges (`outbox_unpublished`,
    /// `outbox_oldest_unpublished_age_seconds`, `outbox_rows_at_attempt_cap`) at start and every
    /// 10 s, with one [`status`](crate::status::status) query.
    ///
    /// Errors inside the loop (Postgres or NATS down) are logged and retried with backoff;
    /// `run` itself only returns `Ok`.
    ///
    /// ```no_run
    /// # async fn run(relay: outbox_runtime::Relay) -> outbox_runtime::Result<()> {
    /// relay.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
    /// # Ok(()) }
    /// ```
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let (wake, _) = watch::channel(());
        let listener = tokio::spawn(listen(
            self.pool.clone(),
            wake.clone(),
            self.config.poll_interval,
        ));
        let _listener = AbortOnDrop(listener);
        let gauges = tokio::spawn(crate::status::refresh_gauges(
            self.pool.clone(),
            self.config.max_attempts,
            GAUGE_INTERVAL,
        ));
        let _gauges = AbortOnDrop(gauges);
        let (stop, stopped) = watch::channel(false);
        let lanes = futures::future::join_all(
            Lane::all(self.config.lanes)
                .map(|lane| self.run_lane(lane, wake.subscribe(), stopped.clone())),
        );
        tokio::pin!(lanes);
        tokio::select! {
            _ = &mut lanes => {}
            () = shutdown => {
                stop.send_replace(true);
                lanes.await;
            }
        }
        Ok(())
    }

    /// One batch loop, on `lane`'s partitions, until `stop` turns true.
    async fn run_lane(
        &self,
        lane: Lane,
        mut wake: watch::Receiver<()>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut state = LaneState::default();
        loop {
            let mut this_lane = lane;
            if lane.count > 1 {
                if let Some(until) = self.sharing.until() {
                    // another relay works on the table: lane 0 takes every partition, and the
                    // other lanes rest until the sharing ends
                    if lane.index > 0 {
                        tokio::select! {
                            _ = stop.changed() => return,
                            _ = sleep_until(until) => continue,
                        }
                    }
                    this_lane = Lane::ALL;
                }
            }
            // Commits announced before this claim are covered by it: only later ones count.
            wake.borrow_and_update();
            let result = self.lane_batch(lane, this_lane).await;
            let commit_seen = wake.has_changed().unwrap_or(false);
            let outcome = *result.as_ref().unwrap_or(&Outcome::Error);
            let next = state.next(outcome, commit_seen, &self.config);
            if let (Err(e), Next::Backoff(wait)) = (&result, next) {
                tracing::warn!(error = %e, retry_in = ?wait, "outbox relay batch failed");
            }
            if *stop.borrow() {
                return;
            }
            let now = Instant::now();
            let (until, end_on_commit) = match next {
                Next::Again => {
                    // a commit announced during the batch is covered by the next claim
                    wake.borrow_and_update();
                    continue;
                }
                Next::Contended(wait) => {
                    self.sharing.found_another_relay();
                    // a row committed just now may not be announced yet: its notification
                    // ends the pause
                    (now + wait, true)
                }
                Next::Backoff(wait) => (now + wait, false),
                Next::Idle => {
                    let poll = now + self.config.poll_interval;
                    let retry = self.backoff.next_retry(now);
                    (retry.map_or(poll, |t| t.min(poll)), true)
                }
            };
            tokio::select! {
                _ = stop.changed() => return,
                _ = sleep_until(until) => {}
                _ = wake.changed(), if end_on_commit => {}
            }
        }
    }

    /// One batch of `lane` (the lane itself, or every partition while sharing), reduced to
    /// what the lane's next step depends on. An all-partition batch never runs beside this
    /// relay's own lane batches, whose rows it would take for another relay's.
    async fn lane_batch(&self, lane: Lane, this_lane: Lane) -> Result<Outcome> {
        let (report, waiting) = if lane.count > 1 && this_lane.count == 1 {
            let _alone = self.sharing.gate.write().await;
            self.run_lane_once(this_lane).await?
        } else {
            let _shared = self.sharing.gate.read().await;
            self.run_lane_once(this_lane).await?
        };
        Ok(if report.published > 0 {
            Outcome::Published
        } else if report.failed > 0 {
            Outcome::Failed
        } else {
            Outcome::Empty(waiting)
        })
    }

    /// One batch on `lane`, and for a batch that published nothing and failed nothing, whether
    /// rows it could not take are waiting.
    async fn run_lane_once(&self, lane: Lane) -> Result<(super::BatchReport, Waiting)> {
        let mut claim = self.claim_lane(lane).await?;
        if claim.is_empty() {
            let waiting = claim.waiting().await?;
            return Ok((claim.release().await?, waiting));
        }
        let report = claim.publish().await;
        let waiting = if report.published == 0 && report.failed == 0 {
            claim.waiting().await?
        } else {
            Waiting::Nothing
        };
        Ok((claim.commit().await?, waiting))
    }
}
