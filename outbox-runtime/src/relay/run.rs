//! [`Relay::run`]: the lease, the lanes' batch loops while this relay holds it, and the tasks
//! beside them (docs/relay.md, *Several relays*, *Lanes*, *Wake-up*, *Failures*).

use std::future::Future;
use std::time::Duration;

use async_nats::connection::State;
use tokio::sync::watch;
use tokio::time::{sleep, sleep_until, Instant};
use uuid::Uuid;

use super::cursor::Cursor;
use super::lanes::{BatchOutcome, Lane, LaneState, LaneStep};
use super::lease::{self, Term};
use super::listen::{self, AbortOnDrop, Signals};
use super::tx::Kept;
use super::{sql, Relay};
use crate::error::Result;

/// How often a running relay refreshes the backlog gauges and moves stale retry schedules on.
const GAUGE_INTERVAL: Duration = Duration::from_secs(10);
/// How often a running relay checks the streams of the event types it publishes.
const STREAM_CHECK_INTERVAL: Duration = Duration::from_secs(60);
/// How long `run` waits for its batches after shutdown, beyond `ack_timeout`.
pub(super) const SHUTDOWN_MARGIN: Duration = Duration::from_secs(15);
/// How often a lane waiting for the NATS connection looks at it (no network involved).
const RECONNECT_POLL: Duration = Duration::from_millis(100);
/// How often a lane without a term looks whether the relay took the lease.
const TERM_POLL: Duration = Duration::from_secs(1);
/// Below this many rows published a second, an idle lane waits for notifications at once
/// (they cost little at that rate); above it, it lingers first, claiming again after 1 ms,
/// 2 ms, 4 ms, 8 ms, and waits for notifications only once it has found nothing for that long
/// (every emit would notify while it waits, and Postgres serialises the commits of notifying
/// transactions: a steady load is cheaper found by claims than announced).
const BUSY_ROWS_PER_SECOND: u64 = 200;
/// See [`BUSY_ROWS_PER_SECOND`].
const LINGER_BEFORE_WAITING: Duration = Duration::from_millis(16);
/// The longest a due retry is left to the fallback poll.
const MIN_RETRY_WAIT: Duration = Duration::from_millis(20);

impl Relay {
    /// Runs until `shutdown` completes, then returns. While this relay holds the relay lease
    /// (one relay of a table does at a time: docs/relay.md, *Several relays*), it runs
    /// batches in [`RelayConfig::lanes`](super::RelayConfig::lanes) loops at once; otherwise it
    /// stands by and takes the lease over when the holder's runs out. The batches in progress
    /// when `shutdown` completes are finished and committed first (each within `ack_timeout`
    /// and a few statement timeouts), and the lease is given up.
    ///
    /// While it runs, it also refreshes the backlog gauges (`outbox_unpublished`,
    /// `outbox_oldest_unpublished_age_seconds`, `outbox_rows_at_attempt_cap`) at start (5 s in
    /// when it stands by) and every 10 s, and checks the streams of the types it publishes.
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
        let signals = Signals::new(self.config.lanes, self.config.partitions);
        let me = Uuid::new_v4();
        let (stop, stopped) = watch::channel(false);
        let (terms, term) = watch::channel(None);
        let _tasks = [
            AbortOnDrop(tokio::spawn(listen::listen(
                self.pool.clone(),
                signals.clone(),
            ))),
            AbortOnDrop(tokio::spawn(super::wake::hold(
                self.pool.clone(),
                self.waker.clone(),
            ))),
            AbortOnDrop(tokio::spawn(housekeeping(
                self.pool.clone(),
                self.config.max_attempts,
                self.jetstream.clone(),
                self.streams.clone(),
                self.config.retry_horizon(),
                term.clone(),
            ))),
        ];
        // aborted if `run` is dropped: a cancelled relay stops renewing, as a killed one would
        let mut lease = AbortOnDrop(tokio::spawn(lease::keep(
            self.pool.clone(),
            self.jetstream.client(),
            me,
            terms,
            self.health.clone(),
            stopped.clone(),
        )));
        let _running = Running::start(&self.health);
        let count = self.config.lanes as i32;
        let lanes = futures::future::join_all((0..count).map(|index| {
            let lane = Lane { index, count };
            self.run_lane(lane, term.clone(), &signals, stopped.clone())
        }));
        let streams = self.check_streams(term.clone(), stopped.clone());
        // the horizon's samples, as the lanes' batches ask for them
        let sampling = self.horizon.keep_sampling(&self.pool);
        tokio::pin!(lanes, streams, sampling);
        tokio::select! {
            _ = &mut lanes => {}
            () = &mut streams => {}
            () = &mut sampling => {}
            () = shutdown => {
                stop.send_replace(true);
                // a batch in progress finishes (publishing is bounded by ack_timeout, each
                // statement by the statement timeouts); past this bound it is given up, which
                // leaves its rows unpublished, as a crash would
                let bound = self.config.ack_timeout + SHUTDOWN_MARGIN;
                // the sampler goes on meanwhile, so that a sample under way does not keep its
                // pooled connection from the lease until `run` returns
                let finished = tokio::select! {
                    done = tokio::time::timeout(bound, lanes) => done.is_ok(),
                    () = &mut sampling => false,
                };
                if !finished {
                    tracing::warn!(?bound, "outbox relay stopped without finishing its batches: Postgres did not answer; their rows stay unpublished and go out again later");
                }
            }
        }
        stop.send_replace(true);
        // the lease is given up, so that a relay standing by takes over at once
        let _ = tokio::time::timeout(lease::LEASE, &mut lease.0).await;
        Ok(())
    }

    /// One batch loop on `lane`, during each of this relay's terms, until `stop` turns true.
    async fn run_lane(
        &self,
        lane: Lane,
        mut terms: watch::Receiver<Option<Term>>,
        signals: &Signals,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut wake = signals.commits[lane.index as usize].subscribe();
        let mut armed = self.waker.changed.subscribe();
        loop {
            let term = loop {
                if *stop.borrow() {
                    return;
                }
                if let Some(t) = *terms.borrow_and_update() {
                    if t.runs(Instant::now()) {
                        break t;
                    }
                }
                tokio::select! {
                    _ = stop.changed() => {}
                    _ = terms.changed() => {}
                    () = sleep(TERM_POLL) => {}
                }
            };
            // a new term starts from the start of the table: another relay published meanwhile
            let mut cursor = Cursor::new(Instant::now());
            let mut state = LaneState::default();
            // the lane's connection between its batches, back to the pool when the term ends
            let mut kept = Kept::default();
            loop {
                let now = Instant::now();
                let current = *terms.borrow_and_update();
                let Some(current) = current.filter(|t| t.number == term.number && t.runs(now))
                else {
                    break;
                };
                // Commits announced before this claim are covered by it: only later ones count.
                wake.borrow_and_update();
                armed.borrow_and_update();
                let epoch = self.waker.epoch();
                let result = self.lane_batch(lane, &mut cursor, &mut kept).await;
                self.health.batch(lane.index as usize, result.is_err());
                let (outcome, next_retry) = match &result {
                    Ok(done) => *done,
                    Err(e) => {
                        metrics::counter!(crate::metrics::BATCH_FAILURES).increment(1);
                        if let crate::Error::Database(db) = e {
                            if super::is_connection_error(db) {
                                cursor.lost_marks();
                            }
                        }
                        (BatchOutcome::Error, None)
                    }
                };
                let step = state.next(outcome, &self.config);
                if let (Err(e), LaneStep::Backoff(wait)) = (&result, step) {
                    tracing::warn!(error = %e, retry_in = ?wait, lane = lane.index, "outbox relay batch failed");
                }
                if *stop.borrow() {
                    return;
                }
                let waits = Waits {
                    epoch,
                    next_retry,
                    next_sweep: cursor.next_sweep(),
                    term_ends: current.until,
                };
                if !self
                    .pause(step, waits, &mut wake, &mut armed, &mut terms, &mut stop)
                    .await
                {
                    return;
                }
            }
        }
    }

    /// Waits as `step` says; `false` when the relay is stopping.
    async fn pause(
        &self,
        step: LaneStep,
        waits: Waits,
        wake: &mut watch::Receiver<()>,
        armed: &mut watch::Receiver<u64>,
        terms: &mut watch::Receiver<Option<Term>>,
        stop: &mut watch::Receiver<bool>,
    ) -> bool {
        let now = Instant::now();
        let (until, end_on_commit) = match step {
            LaneStep::Again => return true,
            LaneStep::Backoff(wait) => (now + wait, false),
            LaneStep::Reconnect(wait) => return self.reconnect(now + wait, stop).await,
            LaneStep::Wait { linger } => {
                let busy = self.recent.per_second(now) >= BUSY_ROWS_PER_SECOND;
                let may_wait = self.waker.armed_since(waits.epoch);
                let wants = may_wait || !busy || linger >= LINGER_BEFORE_WAITING;
                let _want = wants.then(|| self.waker.want());
                let until = if may_wait {
                    // emits notify: wait for a commit, the fallback poll, the next retry, the
                    // next sweep, the end of a subject's pause or of the term
                    let mut until = now + self.config.poll_interval;
                    if let Some(retry) = waits.next_retry {
                        until = until.min(now + retry.max(MIN_RETRY_WAIT));
                    }
                    if let Some(end) = self.pauses.next_end(now) {
                        until = until.min(end);
                    }
                    if let Some(sweep) = waits.next_sweep {
                        until = until.min(sweep);
                    }
                    until.min(waits.term_ends)
                } else {
                    // emits do not notify (the lock is not held, or was taken during the
                    // claim): claim again soon, or as soon as the lock is granted
                    now + linger
                };
                return tokio::select! {
                    _ = stop.changed() => false,
                    () = sleep_until(until) => true,
                    _ = wake.changed() => true,
                    _ = armed.changed() => true,
                    _ = terms.changed() => true,
                };
            }
        };
        tokio::select! {
            _ = stop.changed() => false,
            () = sleep_until(until) => true,
            _ = wake.changed(), if end_on_commit => true,
        }
    }

    /// Waits until the NATS connection is back, or `until`; `false` when the relay is stopping.
    async fn reconnect(&self, until: Instant, stop: &mut watch::Receiver<bool>) -> bool {
        let client = self.jetstream.client();
        while Instant::now() < until && client.connection_state() != State::Connected {
            tokio::select! {
                _ = stop.changed() => return false,
                () = sleep(RECONNECT_POLL) => {}
            }
        }
        true
    }

    /// One batch of `lane`, reduced to what the lane's next step depends on: its outcome, and
    /// when the next retry comes due.
    async fn lane_batch(
        &self,
        lane: Lane,
        cursor: &mut Cursor,
        kept: &mut Kept,
    ) -> Result<(BatchOutcome, Option<Duration>)> {
        let mut claim = super::Claim::begin(self, lane, cursor, None, Some(kept)).await?;
        // what `Relay::claim` reads on after, the lane's next batch reads at once
        let reads_on = claim.reads_on();
        let effects = if claim.is_empty() {
            claim.release().await?
        } else {
            claim.publish().await;
            claim.finish().await?
        };
        let now = Instant::now();
        effects.pause(self, now);
        effects.apply(cursor, now);
        let r = effects.report;
        self.recent.published(r.published as u64, now);
        let outcome = if r.published > 0 || r.held > 0 {
            BatchOutcome::Published
        } else if r.failed > 0 {
            BatchOutcome::Failed
        } else if r.not_attempted > 0 {
            let connected = self.jetstream.client().connection_state() == State::Connected;
            BatchOutcome::NotAttempted { connected }
        } else if reads_on {
            BatchOutcome::Moved
        } else {
            BatchOutcome::Empty
        };
        let next_retry = effects
            .next_retry
            .map(|s| Duration::from_secs_f64(s.max(0.0)));
        Ok((outcome, next_retry))
    }

    /// Checks the streams of the event types this relay publishes (the backlog's once it
    /// first holds the lease, then every type it has published), until `stop`. A relay
    /// standing by publishes nothing, and does not read the backlog's types: a deploy of
    /// several relays onto a large backlog reads them once, not once a relay, beside the
    /// holder's batches.
    async fn check_streams(
        &self,
        mut terms: watch::Receiver<Option<Term>>,
        mut stop: watch::Receiver<bool>,
    ) {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = terms.wait_for(Option::is_some) => {}
        }
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
                () = sleep(STREAM_CHECK_INTERVAL) => {}
            }
        }
    }
}

/// Marks the relay running in its health until dropped.
struct Running<'a>(&'a super::stats::Health);

impl<'a> Running<'a> {
    fn start(health: &'a super::stats::Health) -> Running<'a> {
        health
            .running
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Running(health)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering::Relaxed;
        self.0.running.store(false, Relaxed);
        self.0.holds_lease.store(false, Relaxed);
        for lane in &self.0.lane_failures {
            lane.store(0, Relaxed);
        }
    }
}

/// What a waiting lane also wakes for.
#[derive(Debug, Clone, Copy)]
struct Waits {
    /// The wake lock's epoch when the batch began ([`Waker::armed_since`](super::wake::Waker)).
    epoch: u64,
    next_retry: Option<Duration>,
    /// The next sweep step, when there is anything to sweep.
    next_sweep: Option<Instant>,
    term_ends: Instant,
}

/// At start (once the relay holds the lease, or [`LEASE`](lease::LEASE) after the start when
/// it stands by) and every [`GAUGE_INTERVAL`]: the backlog gauges (the gauges operators alert
/// on exist wherever a relay runs; read over the whole backlog, a relay standing by does not
/// read them beside the holder's first batches), the stale retry schedules, the configuration
/// of every stream the relay has met (a stream that turned unsafe is refused from then on: its
/// types' rows are held), and the holds a stream caused, released once a safe stream captures
/// their type (docs/relay.md, *Held rows*).
async fn housekeeping(
    pool: sqlx::PgPool,
    max_attempts: i32,
    jetstream: async_nats::jetstream::Context,
    streams: std::sync::Arc<super::streams::Streams>,
    horizon: Duration,
    mut terms: watch::Receiver<Option<Term>>,
) {
    let _ = tokio::time::timeout(lease::LEASE, terms.wait_for(Option::is_some)).await;
    let mut tick = tokio::time::interval(GAUGE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = crate::status::record_gauges(&pool, max_attempts).await {
            tracing::debug!(error = %e, "outbox backlog gauges not refreshed");
        }
        if let Err(e) = move_stale_schedules(&pool).await {
            tracing::debug!(error = %e, "outbox retry schedules not looked at");
        }
        streams.recheck(&jetstream, horizon).await;
        if let Err(e) = super::held::release_cleared(&pool, &jetstream, &streams, horizon).await {
            tracing::debug!(error = %e, "outbox holds of fixed streams not looked at");
        }
    }
}

/// Retry schedules whose event is no longer unpublished (published or deleted by hand) move
/// on to their subject's next unpublished event, due now ([`REPOINT`](sql::REPOINT)), so that
/// the subject is released in order by the lane that publishes it.
async fn move_stale_schedules(pool: &sqlx::PgPool) -> sqlx::Result<()> {
    let stale: Vec<String> = sqlx::query_scalar(sql::STALE).fetch_all(pool).await?;
    for subject in stale {
        let moved: i64 = sqlx::query_scalar(sql::REPOINT)
            .bind(&subject)
            .fetch_one(pool)
            .await?;
        if moved > 0 {
            tracing::info!(subject = %crate::naming::shorten(&subject), "outbox relay moved a retry schedule whose event is no longer unpublished (published or deleted by hand) on to the subject's next event");
        }
    }
    Ok(())
}
