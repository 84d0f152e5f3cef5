//! Retention: pruning spent rows without ever touching an unpublished one.
//!
//! A published row (`published_at is not null`) is spent once no consumer can still need it
//! replayed; a dedupe row is spent once its event can no longer be delivered again. Both are
//! deleted in batches with `for update skip locked`, the relay's own discipline, so retention
//! never waits on (or blocks) a relay. Unpublished rows are never retention material: they are
//! an incident, and they show in [`crate::status`].
//!
//! # Pace
//!
//! A deleted row costs the database more than a published one: on a table whose expired rows
//! lie scattered, each dirties a page of its own. A pass that deleted as fast as it could
//! would take a draining relay's share of the database, at the moment the relay matters most
//! (catching up after an outage). So a [`Retention`] pass spends a share of its time in
//! statements and waits between them, as Postgres's cost-based vacuum delay does: at least
//! [`RetentionConfig::busy_percent`] (10% by default), and more while it falls behind the rows
//! expiring, up to [`RetentionConfig::max_busy_percent`] (100%).
//!
//! Rows expire as fast as they were published a keep earlier. Every 5 seconds of full
//! statements, a pass compares how much published time its rows covered (their `published_at`,
//! or `consumed_at` for dedupe rows) with the time that passed. At the floor it usually covers
//! far more: an old backlog, left by retention that did not run, is deleted at the floor and
//! leaves the database to the service. Where it covers less than twice the time that passed,
//! it raises its share so that it would (its rate grows with its share), and lowers it again,
//! down to the floor, once it is ahead. So the table stays bounded whenever the database can
//! delete rows as fast as the service publishes them with one connection busy at most
//! `max_busy_percent` of its time. At the floor, one retention task deleted about 1,100 rows a
//! second on a 12 GB table with its expired rows scattered, 700 beside a relay draining at
//! full speed (docs/performance.md, *Retention that waits its turn*). Keep one retention task
//! per database (each takes its own share). A pass takes the published and the dedupe table in
//! turns, one statement of each, each at its own share. The share in use is the gauge
//! `outbox_retention_busy_percent` (by `table`). [`prune_published_paced`] and `outbox prune`
//! keep the share they are given.
//!
//! # Sizing
//!
//! Keep published rows at least as long as the slowest consumer's redelivery window plus the
//! longest plausible consumer outage ([`RetentionConfig::check`] enforces it), and keep dedupe
//! rows at least as long as a message can be redelivered to the consumer: the stream's
//! `max_age` when it has one, otherwise the same window.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::metrics as m;
use crate::table::{Table, DEDUPE_HORIZON, OUTBOX_CONSUMED, OUTBOX_EVENTS};

/// Retention settings (defaults: keep 7 days of published rows and 14 days of dedupe rows,
/// delete 1,000 rows per statement, busy 10% of a pass's time and up to 100% while it falls
/// behind, a pass every minute).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionConfig {
    /// Published rows older than this (by `published_at`) are deleted.
    pub keep_published: Duration,
    /// Dedupe rows older than this (by `consumed_at`) are deleted; `None` leaves them.
    pub keep_dedupe: Option<Duration>,
    /// Rows per delete statement.
    pub batch_size: i64,
    /// Pause between runs of [`Retention::run`].
    pub interval: Duration,
    /// The least share of a pass's time spent in delete statements, in percent (1 to 100):
    /// after a statement that deleted a full batch, the pass waits `(100 - share) / share`
    /// times as long as the statement took (at 10, a 30 ms statement is followed by 270 ms
    /// without one). 100 deletes without pausing. A pass that falls behind the rows expiring
    /// raises its share, up to [`max_busy_percent`](Self::max_busy_percent). See *Pace* in the
    /// module docs.
    pub busy_percent: u8,
    /// The most share a pass takes to keep up with the rows expiring, in percent
    /// (`busy_percent` to 100). Equal to `busy_percent`, the pace is fixed.
    pub max_busy_percent: u8,
    /// How long the slowest consumer may take to ask for a redelivery (its ack wait times its
    /// max deliveries, typically). Used by [`RetentionConfig::check`].
    pub redelivery_window: Duration,
    /// The longest consumer outage to survive. Used by [`RetentionConfig::check`].
    pub max_outage: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            keep_published: Duration::from_secs(7 * 24 * 3600),
            keep_dedupe: Some(Duration::from_secs(14 * 24 * 3600)),
            batch_size: 1_000,
            interval: Duration::from_secs(60),
            busy_percent: 10,
            max_busy_percent: 100,
            redelivery_window: Duration::from_secs(3600),
            max_outage: Duration::from_secs(3 * 24 * 3600),
        }
    }
}

impl RetentionConfig {
    /// Checks the sizing rule: published rows outlive the redelivery window plus the outage,
    /// dedupe rows outlive published rows, batches are positive, the busy share is 1 to 100
    /// and its ceiling is from the share to 100.
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox_runtime::retention::RetentionConfig;
    ///
    /// let too_short = RetentionConfig { keep_published: Duration::from_secs(60), ..Default::default() };
    /// assert!(too_short.check().is_err());
    /// assert!(RetentionConfig::default().check().is_ok());
    /// ```
    pub fn check(&self) -> Result<()> {
        let need = self.redelivery_window + self.max_outage;
        if self.keep_published < need {
            return Err(Error::Config(format!(
                "keep_published ({:?}) is shorter than redelivery_window + max_outage ({need:?}): \
                 a consumer recovering from an outage could need rows already deleted; keep them longer",
                self.keep_published
            )));
        }
        if let Some(dedupe) = self.keep_dedupe {
            if dedupe < self.keep_published {
                return Err(Error::Config(format!(
                    "keep_dedupe ({dedupe:?}) is shorter than keep_published ({:?}): a replay of a \
                     still-kept event would be handled twice; keep dedupe rows at least as long",
                    self.keep_published
                )));
            }
        }
        check_batch(self.batch_size)?;
        check_busy(self.busy_percent)?;
        if !(self.busy_percent..=100).contains(&self.max_busy_percent) {
            return Err(Error::Config(format!(
                "the prune's busiest share (max_busy_percent) must be from busy_percent ({}) to 100 percent, got {}",
                self.busy_percent, self.max_busy_percent
            )));
        }
        Ok(())
    }
}

fn interval(d: Duration) -> sqlx::postgres::types::PgInterval {
    sqlx::postgres::types::PgInterval {
        months: 0,
        days: 0,
        microseconds: i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
    }
}

/// `batch` rows per delete statement: a loop that runs until a statement deletes fewer than
/// `batch` would never end at 0.
fn check_batch(batch: i64) -> Result<()> {
    if batch <= 0 {
        return Err(Error::Config(format!(
            "the prune batch size (batch_size) must be positive, got {batch}"
        )));
    }
    Ok(())
}

fn check_busy(percent: u8) -> Result<()> {
    if !(1..=100).contains(&percent) {
        return Err(Error::Config(format!(
            "the prune's busy share (busy_percent) must be 1 to 100 percent, got {percent}"
        )));
    }
    Ok(())
}

/// The longest wait after one statement, however long it took (a statement that waited
/// minutes for a table lock, behind a `vacuum full` or a migration, is no measure of its cost).
const MAX_PAUSE: Duration = Duration::from_secs(60);

/// How long a pass busy at most `percent` of its time waits after a statement that took
/// `statement`: at most [`MAX_PAUSE`].
fn pause_after(statement: Duration, percent: u8) -> Duration {
    let percent = u32::from(percent.clamp(1, 100));
    (statement * (100 - percent) / percent).min(MAX_PAUSE)
}

/// The statement [`prune_published`] runs (`$1` the cutoff, `$2` the batch; it returns how
/// many rows it deleted and the newest `published_at` among them): the oldest rows
/// published before the cutoff, through `outbox_events_published_idx`, locked with `skip
/// locked` (a row another transaction holds is passed over), deleted by their `ctid`s: no
/// primary-key probe per row, and a locked, published row does not move. Shown for the
/// benchmark and the tests.
#[doc(hidden)]
pub const PRUNE_PUBLISHED: &str = "with deleted as ( \
     delete from outbox_events where ctid = any(array( \
       select ctid from outbox_events \
        where published_at is not null and published_at < $1::timestamptz \
        order by published_at limit $2 for update skip locked)) \
     returning published_at) \
   select count(*), max(published_at) from deleted";

/// Deletes published rows whose `published_at` is older than `keep` (on the database's clock,
/// when the call starts), `batch` rows per statement, until none is left. Returns how many
/// were deleted. Unpublished rows are never selected. A row another transaction holds (an
/// operator's `select … for update`, an `outbox verify --republish` in progress) is passed
/// over, never waited for; a later call takes it. A `batch` below 1 is an [`Error::Config`],
/// before any statement. It deletes without pausing: [`prune_published_paced`] leaves the
/// database to others between its statements.
pub async fn prune_published(pool: &PgPool, keep: Duration, batch: i64) -> Result<u64> {
    prune_published_paced(pool, keep, batch, 100).await
}

/// [`prune_published`], busy at most `busy_percent` of its time (1 to 100, as
/// [`RetentionConfig::busy_percent`]; outside that range an [`Error::Config`], before any
/// statement).
pub async fn prune_published_paced(
    pool: &PgPool,
    keep: Duration,
    batch: i64,
    busy_percent: u8,
) -> Result<u64> {
    check_batch(batch)?;
    check_busy(busy_percent)?;
    let prune = Prune::published(pool, keep, Pace::fixed(busy_percent)).await?;
    in_turns(pool, &mut [prune], batch).await
}

/// `now() - keep` on the database's clock.
async fn cutoff(pool: &PgPool, keep: Duration) -> Result<DateTime<Utc>> {
    Ok(sqlx::query_scalar("select now() - $1::interval")
        .bind(interval(keep))
        .fetch_one(pool)
        .await?)
}

/// One table's part of a pass: `statement` (`$1` a fixed cutoff, `$2` the batch) deletes from
/// `table`, which names its errors and its metric, at the share of its time `pace` sets.
struct Prune {
    statement: &'static str,
    table: Table,
    cutoff: DateTime<Utc>,
    pace: Pace,
    deleted: u64,
    done: bool,
    /// The last statement's error, and when the prune tries again.
    failed: Option<(Error, Instant)>,
}

impl Prune {
    /// Published rows older than `keep`.
    async fn published(pool: &PgPool, keep: Duration, pace: Pace) -> Result<Prune> {
        Ok(Prune::new(
            PRUNE_PUBLISHED,
            OUTBOX_EVENTS,
            cutoff(pool, keep).await?,
            pace,
        ))
    }

    /// Dedupe rows older than `keep`, once their cutoff is recorded as the dedupe horizon;
    /// `None` when there is none.
    async fn dedupe(pool: &PgPool, keep: Duration, pace: Pace) -> Result<Option<Prune>> {
        let cutoff = cutoff(pool, keep).await?;
        let any: bool = sqlx::query_scalar(
            "select exists (select 1 from outbox_consumed where consumed_at < $1)",
        )
        .bind(cutoff)
        .fetch_one(pool)
        .await
        .map_err(|e| OUTBOX_CONSUMED.error(e))?;
        if !any {
            return Ok(None);
        }
        sqlx::query(
            "insert into outbox_dedupe_horizon as h (pruned_before) values ($1) \
             on conflict (id) do update set pruned_before = greatest(h.pruned_before, excluded.pruned_before)",
        )
        .bind(cutoff)
        .execute(pool)
        .await
        .map_err(|e| DEDUPE_HORIZON.error(e))?;
        Ok(Some(Prune::new(
            PRUNE_DEDUPE,
            OUTBOX_CONSUMED,
            cutoff,
            pace,
        )))
    }

    fn new(statement: &'static str, table: Table, cutoff: DateTime<Utc>, pace: Pace) -> Prune {
        Prune {
            statement,
            table,
            cutoff,
            pace,
            deleted: 0,
            done: false,
            failed: None,
        }
    }

    /// Whether the prune still deletes: not done, and not waiting after a failed statement.
    fn going(&self) -> bool {
        !self.done && self.failed.is_none()
    }

    /// Whether the prune runs a statement at its turn: not done, and not before its retry.
    fn due(&self) -> bool {
        !self.done
            && self
                .failed
                .as_ref()
                .is_none_or(|(_, at)| *at <= Instant::now())
    }
}

/// Runs the `prunes` in turns, one statement of each, until each has run one that deleted
/// fewer than `batch` rows, pausing after each so that its statements take the share of the
/// time its [`Pace`] sets (timed on a connection already taken from the pool: waiting for one
/// is not the statement's cost). In turns, so that a table with hours of backlog does not hold off the
/// other. A failed statement is logged naming its table, and its prune tries again after
/// [`MAX_PAUSE`] while another prune goes on; once none goes on, the first error is returned
/// (alone, a prune returns its error at once, as the pass's next start tries again). Each
/// statement's rows count in the metric as it completes (a pass can run for hours at a low
/// share), and in its prune's `deleted`; the total is returned. `skip locked` fills a batch
/// from the rows after a held one, so a short batch means no unheld row is left.
async fn in_turns(pool: &PgPool, prunes: &mut [Prune], batch: i64) -> Result<u64> {
    while prunes.iter().any(Prune::going) {
        for i in 0..prunes.len() {
            let prune = &mut prunes[i];
            if !prune.due() {
                continue;
            }
            match delete_once(pool, prune, batch).await {
                Ok((n, newest, took)) => {
                    prune.failed = None;
                    let table = prune.table.name;
                    metrics::counter!(m::PRUNED, "table" => table).increment(n);
                    prune.deleted += n;
                    if n < batch as u64 {
                        prune.done = true;
                        metrics::gauge!(m::PRUNE_SHARE, "table" => table).set(0.0);
                        continue;
                    }
                    let share = match newest {
                        Some(newest) => prune.pace.after(Instant::now(), newest),
                        None => prune.pace.share,
                    };
                    metrics::gauge!(m::PRUNE_SHARE, "table" => table).set(f64::from(share));
                    let pause = pause_after(took, share);
                    if !pause.is_zero() {
                        tokio::time::sleep(pause).await;
                    }
                }
                Err(e) => {
                    let table = prune.table.name;
                    let others_go = prunes.iter().enumerate().any(|(j, p)| j != i && p.going());
                    if others_go {
                        tracing::warn!(
                            table,
                            error = %e,
                            "retention could not delete from {table}; the pass goes on with the other table and tries again in a minute"
                        );
                    }
                    prunes[i].failed = Some((e, Instant::now() + MAX_PAUSE));
                }
            }
        }
    }
    match prunes.iter_mut().find_map(|p| p.failed.take()) {
        Some((e, _)) => Err(e),
        None => Ok(prunes.iter().map(|p| p.deleted).sum()),
    }
}

/// One of `prune`'s statements: the rows it deleted, the newest time among them
/// (`published_at` or `consumed_at`), and how long it took once it had its connection.
async fn delete_once(
    pool: &PgPool,
    prune: &Prune,
    batch: i64,
) -> Result<(u64, Option<DateTime<Utc>>, Duration)> {
    let mut conn = pool.acquire().await?;
    let started = Instant::now();
    let (n, newest): (i64, Option<DateTime<Utc>>) = sqlx::query_as(prune.statement)
        .bind(prune.cutoff)
        .bind(batch)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| prune.table.error(e))?;
    Ok((n.unsigned_abs(), newest, started.elapsed()))
}

/// How much faster than the clock a pass that keeps up moves through its table's time (the
/// `published_at` or `consumed_at` of the rows it deletes): twice, so that a pass that fell
/// behind by a minute catches up within a minute, while rows keep expiring at the rate they
/// were published.
const PACE_TARGET: f64 = 2.0;

/// How long a prune runs at one share before it measures its progress and sets the next.
const PACE_WINDOW: Duration = Duration::from_secs(5);

/// A prune's share of the time: at least `floor`, at most `ceiling`, between them the share
/// that moves it through its table's time [`PACE_TARGET`] times as fast as the clock. Rows
/// expire as fast as they were published (or consumed) a keep earlier, so a prune that moves
/// slower than the clock falls further behind with every second, and one that moves faster
/// deletes rows as fast as they expire and catches up with those that wait. Every
/// [`PACE_WINDOW`] of full statements it compares the table time its rows covered with the
/// time that passed and scales its share by how far that is from the target (its rate grows
/// with its share: the pause after a statement is what the share sets).
#[derive(Debug, Clone)]
struct Pace {
    floor: u8,
    ceiling: u8,
    share: u8,
    /// When the window began, and the newest row time deleted then.
    window: Option<(Instant, DateTime<Utc>)>,
}

impl Pace {
    /// Always `share` (`outbox prune`, [`prune_published_paced`]).
    fn fixed(share: u8) -> Pace {
        Pace::following(share, share)
    }

    /// From `floor` to `ceiling` (a [`Retention`] pass), starting at `floor`.
    fn following(floor: u8, ceiling: u8) -> Pace {
        Pace {
            floor,
            ceiling: ceiling.max(floor),
            share: floor,
            window: None,
        }
    }

    /// The share for the pause after a full statement that ended `now` and whose newest row
    /// is from `newest`.
    fn after(&mut self, now: Instant, newest: DateTime<Utc>) -> u8 {
        match self.window {
            Some((since, from)) if now.duration_since(since) >= PACE_WINDOW => {
                let wall = now.duration_since(since).as_secs_f64();
                let covered = (newest - from).to_std().unwrap_or_default().as_secs_f64();
                self.share = next_share(self.share, wall, covered).clamp(self.floor, self.ceiling);
                self.window = Some((now, newest));
            }
            Some(_) => {}
            None => self.window = Some((now, newest)),
        }
        self.share
    }
}

/// The share that would have moved a prune through `covered` seconds of its table's time in
/// `wall` seconds at [`PACE_TARGET`], given it ran at `share`: `share * PACE_TARGET * wall /
/// covered`, rounded up, at most 100 (no table time covered at all: 100).
fn next_share(share: u8, wall: f64, covered: f64) -> u8 {
    let wanted = f64::from(share) * PACE_TARGET * wall / covered;
    if wanted.is_finite() {
        wanted.ceil().clamp(1.0, 100.0) as u8
    } else {
        100
    }
}

/// How many published rows [`prune_published`] would delete now (a dry run).
pub async fn count_prunable(pool: &PgPool, keep: Duration) -> Result<i64> {
    sqlx::query_scalar(
        "select count(*) from outbox_events where published_at is not null and published_at < now() - $1",
    )
    .bind(interval(keep))
    .fetch_one(pool)
    .await
    .map_err(|e| OUTBOX_EVENTS.error(e))
}

/// [`prune_dedupe`]'s statement, as [`PRUNE_PUBLISHED`] (dedupe rows are never updated).
const PRUNE_DEDUPE: &str = "with deleted as ( \
     delete from outbox_consumed where ctid = any(array( \
       select ctid from outbox_consumed \
        where consumed_at < $1 \
        order by consumed_at limit $2 for update skip locked)) \
     returning consumed_at) \
   select count(*), max(consumed_at) from deleted";

/// Deletes dedupe rows (`outbox_consumed`) older than `keep`, in batches, passing over rows
/// other transactions hold, as [`prune_published`] does, without pausing
/// ([`prune_dedupe_paced`] pauses). Returns how many. A `batch` below 1 is an
/// [`Error::Config`], before any statement.
///
/// Before deleting, it records the cutoff in `outbox_dedupe_horizon` (migration `0006`): a
/// consumer whose durable is created again starts at messages stored since the newest cutoff,
/// so an event whose dedupe row is gone is not applied twice (see [`crate::consumer`]).
pub async fn prune_dedupe(pool: &PgPool, keep: Duration, batch: i64) -> Result<u64> {
    prune_dedupe_paced(pool, keep, batch, 100).await
}

/// [`prune_dedupe`], busy at most `busy_percent` of its time, as [`prune_published_paced`].
pub async fn prune_dedupe_paced(
    pool: &PgPool,
    keep: Duration,
    batch: i64,
    busy_percent: u8,
) -> Result<u64> {
    check_batch(batch)?;
    check_busy(busy_percent)?;
    match Prune::dedupe(pool, keep, Pace::fixed(busy_percent)).await? {
        Some(prune) => in_turns(pool, &mut [prune], batch).await,
        None => Ok(0),
    }
}

/// A retention task: prunes on a schedule, at a pace from [`RetentionConfig::busy_percent`] to
/// [`RetentionConfig::max_busy_percent`] (*Pace* in the module docs).
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> outbox_runtime::Result<()> {
/// use outbox_runtime::retention::{Retention, RetentionConfig};
///
/// let retention = Retention::new(pool, RetentionConfig::default())?;
/// tokio::spawn(async move { retention.run(std::future::pending()).await });
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Retention {
    pool: PgPool,
    config: RetentionConfig,
}

impl Retention {
    /// A retention task; fails when `config` breaks the sizing rule ([`RetentionConfig::check`]).
    pub fn new(pool: PgPool, config: RetentionConfig) -> Result<Self> {
        config.check()?;
        Ok(Self { pool, config })
    }

    /// One pass: prunes published rows and dedupe rows in turns, one statement of each,
    /// pausing between statements, so that hours of published backlog do not hold off dedupe
    /// pruning. A statement that fails on one table does not stop the other: it is logged
    /// (at warn, naming the table), the table is tried again a minute later while the other
    /// goes on, and once neither goes on the first error is returned. Returns `(published,
    /// dedupe)` counts.
    pub async fn run_once(&self) -> Result<(u64, u64)> {
        let c = &self.config;
        let mut prunes = Vec::with_capacity(2);
        let mut failed = None;
        let pace = Pace::following(c.busy_percent, c.max_busy_percent);
        match Prune::published(&self.pool, c.keep_published, pace.clone()).await {
            Ok(prune) => prunes.push(prune),
            Err(e) => failed = Some(e),
        }
        if let Some(keep) = c.keep_dedupe {
            match Prune::dedupe(&self.pool, keep, pace).await {
                Ok(prune) => prunes.extend(prune),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        let ran = in_turns(&self.pool, &mut prunes, c.batch_size).await;
        let deleted = |table: Table| {
            let prune = prunes.iter().find(|p| p.table.name == table.name);
            prune.map_or(0, |p| p.deleted)
        };
        let (published, dedupe) = (deleted(OUTBOX_EVENTS), deleted(OUTBOX_CONSUMED));
        if published + dedupe > 0 {
            tracing::info!(published, dedupe, "retention pruned spent rows");
        }
        match failed {
            Some(e) => Err(e),
            None => ran.map(|_| (published, dedupe)),
        }
    }

    /// Runs [`Retention::run_once`] every `interval` until `shutdown` resolves, which also
    /// ends a pass between its statements or during one (the statement in flight may still
    /// complete on the database; whatever it leaves, the next start takes). Errors are logged
    /// and the next pass tries again.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            let pass = tokio::select! {
                _ = &mut shutdown => return,
                pass = self.run_once() => pass,
            };
            if let Err(e) = pass {
                tracing::warn!(error = %e, "retention pass failed; retrying next interval");
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(self.config.interval) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_waits_so_its_statements_take_their_share_of_the_time() {
        let ms = Duration::from_millis;
        assert_eq!(pause_after(ms(30), 10), ms(270));
        assert_eq!(pause_after(ms(30), 50), ms(30));
        assert_eq!(pause_after(ms(30), 1), ms(2_970));
        assert_eq!(pause_after(ms(30), 100), Duration::ZERO);
        // a statement that waited for a table lock does not stop pruning for hours
        assert_eq!(pause_after(Duration::from_secs(600), 10), MAX_PAUSE);
        assert_eq!(pause_after(ms(1_000), 1), MAX_PAUSE);
    }

    #[test]
    fn a_prune_behind_the_clock_raises_its_share_and_one_ahead_lowers_it() {
        // at 10%, 5 s of statements covered 1 s of published time: rows expire five times as
        // fast as they go; the share that covers 10 s in 5 s is ten times as large
        assert_eq!(next_share(10, 5.0, 1.0), 100);
        assert_eq!(next_share(10, 5.0, 5.0), 20);
        assert_eq!(next_share(40, 5.0, 20.0), 20);
        // far ahead: down to 1 (the pace clamps it to its floor)
        assert_eq!(next_share(10, 5.0, 3_600.0), 1);
        // rows all published at the same instant: no table time covered at all
        assert_eq!(next_share(10, 5.0, 0.0), 100);
    }

    #[test]
    fn a_pace_measures_over_its_window_and_stays_within_its_floor_and_ceiling() {
        let start = Instant::now();
        let t0 = Utc::now();
        let secs = |s: u64| start + Duration::from_secs(s);
        let table = |s: i64| t0 + chrono::Duration::seconds(s);
        let mut pace = Pace::following(10, 60);
        assert_eq!(pace.after(secs(0), table(0)), 10, "starts at its floor");
        // within the window: unchanged, however slow
        assert_eq!(pace.after(secs(4), table(0)), 10);
        // 5 s covered 1 s of table time: wants 100, held at the ceiling
        assert_eq!(pace.after(secs(5), table(1)), 60);
        // 5 s covered 60 s at 60%: wants 10
        assert_eq!(pace.after(secs(10), table(61)), 10);
        // a fixed pace never moves
        let mut fixed = Pace::fixed(10);
        fixed.after(secs(0), table(0));
        assert_eq!(fixed.after(secs(5), table(0)), 10);
    }

    #[test]
    fn a_ceiling_below_the_share_or_above_100_is_refused_naming_the_field() {
        for (busy, max) in [(10, 9), (10, 101), (50, 1)] {
            let config = RetentionConfig {
                busy_percent: busy,
                max_busy_percent: max,
                ..Default::default()
            };
            let e = config.check().unwrap_err().to_string();
            assert!(
                e.contains("max_busy_percent") && e.contains(&max.to_string()),
                "{e}"
            );
        }
        for (busy, max) in [(10, 10), (10, 100), (100, 100)] {
            let config = RetentionConfig {
                busy_percent: busy,
                max_busy_percent: max,
                ..Default::default()
            };
            config.check().unwrap();
        }
    }

    #[test]
    fn a_busy_share_outside_1_to_100_is_refused_naming_the_field() {
        for bad in [0, 101, 255] {
            let config = RetentionConfig {
                busy_percent: bad,
                ..Default::default()
            };
            let e = config.check().unwrap_err().to_string();
            assert!(
                e.contains("busy_percent") && e.contains(&bad.to_string()),
                "{e}"
            );
        }
        for good in [1, 10, 100] {
            let config = RetentionConfig {
                busy_percent: good,
                ..Default::default()
            };
            config.check().unwrap();
        }
    }
}
