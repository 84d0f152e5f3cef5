//! [`Relay::run`]: the lanes' batch loops until shutdown, and the tasks beside them
//! (docs/relay.md, *Lanes*, *Wake-up*, *Failures and shutdown*).

use std::future::Future;
use std::time::Duration;

use async_nats::connection::State;
use tokio::sync::watch;
use tokio::time::{sleep, sleep_until, Instant};

use super::floor::Floor;
use super::lanes::{Lane, LaneState, Next, Outcome, Waiting};
use super::listen::{self, AbortOnDrop, Signals};
use super::members::{self, Share};
use super::settle::Effects;
use super::{sql, Relay};
use crate::error::Result;
use uuid::Uuid;

/// How often a running relay refreshes the backlog gauges and sweeps stale retry schedules.
const GAUGE_INTERVAL: Duration = Duration::from_secs(10);
/// How often a running relay checks the streams of the event types it publishes.
const STREAM_CHECK_INTERVAL: Duration = Duration::from_secs(60);
/// How long `run` waits for its batches after shutdown, beyond `ack_timeout`.
const SHUTDOWN_MARGIN: Duration = Duration::from_secs(15);
/// How often a lane waiting for the NATS connection looks at it (no network involved).
const RECONNECT_POLL: Duration = Duration::from_millis(100);
/// How long `run` waits for its `LISTEN` connection before it joins the other relays.
const LISTEN_FIRST: Duration = Duration::from_secs(2);
/// The longest a due retry is left to the fallback poll.
const MIN_RETRY_WAIT: Duration = Duration::from_millis(20);

impl Relay {
    /// Runs batches, in [`RelayConfig::lanes`](super::RelayConfig::lanes) loops at once, until
    /// `shutdown` completes, then returns. The batches in progress when it completes are
    /// finished and committed first (each within `ack_timeout` and a few statement timeouts).
    ///
    /// While it runs, it also refreshes the backlog gauges (`outbox_unpublished`,
    /// `outbox_oldest_unpublished_age_seconds`, `outbox_rows_at_attempt_cap`) at start and every
    /// 10 s, sends its `LISTEN` heartbeat, and checks the streams of the types it publishes.
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
        crate::metrics::register_relay();
        let signals = Signals {
            commits: watch::channel(()).0,
            releases: watch::channel(()).0,
            members: watch::channel(()).0,
            listening: watch::channel(false).0,
        };
        let mut listening = signals.listening.subscribe();
        let _tasks = [
            AbortOnDrop(tokio::spawn(listen::listen(
                self.pool.clone(),
                signals.clone(),
            ))),
            AbortOnDrop(tokio::spawn(listen::heartbeat(self.pool.clone()))),
            AbortOnDrop(tokio::spawn(super::wake::hold(
                self.pool.clone(),
                self.sleepers.clone(),
                signals.commits.clone(),
            ))),
            AbortOnDrop(tokio::spawn(housekeeping(
                self.pool.clone(),
                self.config.max_attempts,
            ))),
        ];
        let (stop, stopped) = watch::channel(false);
        // this relay's row in outbox_relays, and its share of the partitions; listening first,
        // so that a relay joining after this one's first heartbeat is heard of at once
        let _ = tokio::time::timeout(LISTEN_FIRST, listening.wait_for(|up| *up)).await;
        let me = Uuid::new_v4();
        let (partitions, lanes) = (self.config.partitions, self.config.lanes);
        let share = match members::beat(&self.pool, me, partitions, lanes, true).await {
            Ok(members) => {
                metrics::gauge!(crate::metrics::RELAYS).set(members.len() as f64);
                Share::of(me, &members, lanes)
            }
            Err(e) => {
                tracing::warn!(error = %e, "outbox relay could not join outbox_relays; it claims from every partition until its heartbeat works");
                Share::alone(lanes)
            }
        };
        let (share, shares) = watch::channel(share);
        // aborted if `run` is dropped: a cancelled relay stops beating, as a killed one would
        let mut membership = AbortOnDrop(tokio::spawn(members::keep(
            self.pool.clone(),
            me,
            partitions,
            lanes,
            share,
            signals.clone(),
            stopped.clone(),
        )));
        let lanes = futures::future::join_all(
            (0..lanes).map(|slot| self.run_lane(slot, shares.clone(), &signals, stopped.clone())),
        );
        let streams = self.check_streams(stopped.clone());
        tokio::pin!(lanes, streams);
        let mut left = false;
        tokio::select! {
            _ = &mut lanes => {}
            () = &mut streams => {}
            () = shutdown => {
                stop.send_replace(true);
                // the others take this relay's partitions now (their locks wait for its last
                // batches), rather than after its batches end
                let _ = tokio::time::timeout(members::LEASE, &mut membership.0).await;
                members::leave(&self.pool, me).await;
                left = true;
                // a batch in progress finishes (publishing is bounded by ack_timeout, each
                // statement by the statement timeouts); past this bound it is given up, which
                // leaves its rows unpublished, as a crash would
                let bound = self.config.ack_timeout + SHUTDOWN_MARGIN;
                if tokio::time::timeout(bound, lanes).await.is_err() {
                    tracing::warn!(?bound, "outbox relay stopped without finishing its batches: Postgres did not answer; their rows stay unpublished and go out again later");
                }
            }
        }
        if !left {
            stop.send_replace(true);
            let _ = tokio::time::timeout(members::LEASE, &mut membership.0).await;
            members::leave(&self.pool, me).await;
        }
        Ok(())
    }

    /// One batch loop, on the partitions of lane `slot` of this relay's share, until `stop`
    /// turns true.
    async fn run_lane(
        &self,
        slot: usize,
        mut shares: watch::Receiver<Share>,
        signals: &Signals,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut wake = signals.commits.subscribe();
        let mut releases = signals.releases.subscribe();
        let mut floor = Floor::new(self.config.floor_check());
        let mut current = None;
        let mut state = LaneState::default();
        loop {
            let Some(lane) = shares
                .borrow_and_update()
                .lane(slot, self.config.partitions)
            else {
                // more slots than partitions, and this one has none: rest until the share
                // changes
                tokio::select! {
                    _ = stop.changed() => return,
                    changed = shares.changed() => if changed.is_err() { return } else { continue },
                }
            };
            if current != Some(lane) {
                // a floor only holds for the partitions it was found over
                floor.reset();
                current = Some(lane);
            }
            if releases.has_changed().unwrap_or(false) {
                releases.borrow_and_update();
                self.streams.forget_uncaptured();
                floor.reset();
            }
            // Commits announced before this claim are covered by it: only later ones count.
            wake.borrow_and_update();
            let result = self.lane_batch(lane, &mut floor).await;
            let commit_seen = wake.has_changed().unwrap_or(false);
            let (outcome, next_retry) = match &result {
                Ok((outcome, next_retry)) => (*outcome, *next_retry),
                Err(_) => (Outcome::Error, None),
            };
            let next = state.next(outcome, commit_seen, &self.config);
            if let (Err(e), Next::Backoff(wait)) = (&result, next) {
                tracing::warn!(error = %e, retry_in = ?wait, "outbox relay batch failed");
            }
            if *stop.borrow() {
                return;
            }
            if !self.pause(next, next_retry, &mut wake, &mut stop).await {
                return;
            }
        }
    }

    /// Waits as `next` says; `false` when the relay is stopping.
    async fn pause(
        &self,
        next: Next,
        next_retry: Option<Duration>,
        wake: &mut watch::Receiver<()>,
        stop: &mut watch::Receiver<bool>,
    ) -> bool {
        let now = Instant::now();
        let (until, end_on_commit) = match next {
            Next::Again => {
                // a commit announced during the batch is covered by the next claim
                wake.borrow_and_update();
                return true;
            }
            Next::Contended(wait) => {
                // a row committed just now may not be announced yet: its notification ends the
                // pause
                (now + wait, true)
            }
            Next::Backoff(wait) => (now + wait, false),
            Next::Reconnect(wait) => return self.reconnect(now + wait, stop).await,
            Next::Idle => {
                let mut until = now + self.config.poll_interval;
                if let Some(retry) = next_retry {
                    until = until.min(now + retry.max(MIN_RETRY_WAIT));
                }
                let ends = [self.pauses.next_end(now), self.cut_pauses.next_end(now)];
                if let Some(end) = ends.into_iter().flatten().min() {
                    until = until.min(end);
                }
                (until, true)
            }
        };
        // a lane waiting for commits has the relay hold the wake lock, so that emits notify
        let _sleeping = matches!(next, Next::Idle).then(|| self.sleepers.enter());
        tokio::select! {
            _ = stop.changed() => false,
            _ = sleep_until(until) => true,
            _ = wake.changed(), if end_on_commit => true,
        }
    }

    /// Waits until the NATS connection is back, or `until`; `false` when the relay is stopping.
    async fn reconnect(&self, until: Instant, stop: &mut watch::Receiver<bool>) -> bool {
        let client = self.jetstream.client();
        while Instant::now() < until && client.connection_state() != State::Connected {
            tokio::select! {
                _ = stop.changed() => return false,
                _ = sleep(RECONNECT_POLL) => {}
            }
        }
        true
    }

    /// One batch of `lane`, reduced to what the lane's next step depends on.
    async fn lane_batch(
        &self,
        lane: Lane,
        floor: &mut Floor,
    ) -> Result<(Outcome, Option<Duration>)> {
        let (effects, waiting) = self.run_lane_once(lane, floor).await?;
        let now = Instant::now();
        effects.pause(self, now);
        effects.apply(floor);
        let r = effects.report;
        let outcome = if r.published > 0 || r.held > 0 {
            Outcome::Published
        } else if r.failed > 0 {
            Outcome::Failed
        } else if r.not_attempted > 0 {
            let connected = self.jetstream.client().connection_state() == State::Connected;
            Outcome::NotAttempted { connected }
        } else {
            Outcome::Empty(waiting)
        };
        let next_retry = effects
            .next_retry
            .map(|s| Duration::from_secs_f64(s.max(0.0)));
        Ok((outcome, next_retry))
    }

    /// One batch on `lane`, and for a batch that did nothing, whether rows it could not take
    /// are waiting.
    async fn run_lane_once(&self, lane: Lane, floor: &mut Floor) -> Result<(Effects, Waiting)> {
        let mut claim = super::Claim::begin(self, lane, floor, None).await?;
        if claim.is_empty() {
            let waiting = claim.waiting().await?;
            return Ok((claim.release().await?, waiting));
        }
        let r = claim.publish().await;
        let waiting = if r.published + r.failed + r.held + r.not_attempted == 0 {
            claim.waiting().await?
        } else {
            Waiting::Nothing
        };
        Ok((claim.finish().await?, waiting))
    }

    /// Checks the streams of the event types this relay publishes (the backlog's at start,
    /// then every type it has published), until `stop`.
    async fn check_streams(&self, mut stop: watch::Receiver<bool>) {
        let horizon = self.config.retry_horizon();
        let mut first = true;
        loop {
            let mut types: Vec<String> = self.config.checked_event_types();
            if first {
                let backlog = sqlx::query_scalar::<_, String>(sql::BACKLOG_TYPES)
                    .bind(1_000i64)
                    .fetch_all(&self.pool);
                if let Ok(Ok(found)) = tokio::time::timeout(Duration::from_secs(10), backlog).await
                {
                    types.extend(
                        found
                            .into_iter()
                            .filter(|t| crate::naming::check_event_type(t).is_ok()),
                    );
                }
                first = false;
            }
            types.extend(self.streams.seen());
            types.sort();
            types.dedup();
            for event_type in types {
                if self.streams.is_stale(&event_type) {
                    self.streams
                        .capture(&self.jetstream, &event_type, horizon)
                        .await;
                }
            }
            tokio::select! {
                _ = stop.changed() => return,
                _ = sleep(STREAM_CHECK_INTERVAL) => {}
            }
        }
    }
}

/// The backlog gauges and the sweep of stale retry schedules, at start and every
/// [`GAUGE_INTERVAL`]: the gauges operators alert on exist wherever a relay runs.
async fn housekeeping(pool: sqlx::PgPool, max_attempts: i32) {
    let mut tick = tokio::time::interval(GAUGE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = crate::status::record_gauges(&pool, max_attempts).await {
            tracing::debug!(error = %e, "outbox backlog gauges not refreshed");
        }
        match sqlx::query(sql::SWEEP).execute(&pool).await {
            Ok(done) if done.rows_affected() > 0 => tracing::info!(
                released = done.rows_affected(),
                "outbox relay dropped retry schedules whose event is no longer unpublished (published or deleted by hand)"
            ),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "outbox retry schedules not swept"),
        }
    }
}
