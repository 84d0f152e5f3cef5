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
//! Rows expire as fast as they were published a keep earlier. A pass whose rows expired more
//! than two intervals ago ([`RetentionConfig::interval`]: 2 minutes by default; a pass that
//! keeps up starts at most one behind) is behind; then, every 5 seconds of full statements, it compares how much
//! published time its rows covered (their `published_at`, or `consumed_at` for dedupe rows)
//! with the time that passed, and sets the share that would cover twice as much: more when it
//! moves slower than that, less (down to the floor) when faster. Less behind, it keeps to its
//! floor: a pass slowed down by a busy database (a relay draining after an outage)
//! does not take more of it. So the table stays bounded whenever the database can delete rows
//! as fast as the service publishes them with one connection busy at most `max_busy_percent`
//! of its time; the rows left to delete are then a few intervals of the service's. An old
//! backlog (retention that did not run for a week) is behind too: it is deleted at the share
//! that covers its published time twice as fast as the clock, which is the floor unless the
//! service published it faster than the floor deletes. At the floor, one retention task
//! deleted about 1,100 rows a second on a 12 GB table with its expired rows scattered, 700
//! beside a relay draining at full speed (docs/performance.md, *Retention that waits its
//! turn*). Keep one retention task per database (each takes its own share). A pass takes the
//! published and the dedupe table each at its own share and its own pauses, a statement of one
//! running in the other's pause. The share in use is the gauge `outbox_retention_busy_percent`
//! (by `table`; 0 when no pass runs). [`prune_published_paced`] and `outbox prune` keep the
//! share they are given.
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
use futures::future::BoxFuture;
use sqlx::{PgConnection, PgPool};
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

/// The longest wait after one statement, however long it took (a statement that waited for a
/// table lock, behind a `vacuum full` or a migration, is no measure of its cost).
const MAX_PAUSE: Duration = Duration::from_secs(60);

/// How long a pass busy at most `percent` of its time waits after a statement that took
/// `statement`: at most [`MAX_PAUSE`].
fn pause_after(statement: Duration, percent: u8) -> Duration {
    let percent = u32::from(percent.clamp(1, 100));
    (statement * (100 - percent) / percent).min(MAX_PAUSE)
}

/// The statement [`prune_published`] runs (`$1` the cutoff, `$2` the batch; it returns how
/// many rows it deleted and the newest `published_at` among them, in seconds since 1970, so
/// that a row written by hand with `-infinity` decodes): the oldest rows
/// published before the cutoff, through `outbox_events_published_idx`, locked with `skip
/// locked` (a row another transaction holds is passed over), deleted by their `ctid`s: no
/// primary-key probe per row, and a locked, published row does not move. The delete checks the
/// condition again on each row it reaches: a `ctid` is unique within one table only, so in a
/// table with partitions or child tables another row may have the same one, and such a row is
/// deleted only when it is spent too (there the delete may wait for such a row that another
/// transaction holds: the relay refuses such a table). Shown for the benchmark and the tests.
#[doc(hidden)]
pub const PRUNE_PUBLISHED: &str = "with deleted as ( \
     delete from outbox_events where ctid = any(array( \
       select ctid from outbox_events \
        where published_at is not null and published_at < $1::timestamptz \
        order by published_at limit $2 for update skip locked)) \
       and published_at is not null and published_at < $1::timestamptz \
     returning published_at) \
   select count(*), extract(epoch from max(published_at))::float8 from deleted";

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

/// How long retention waits for Postgres's answer to one of its statements before it gives
/// the statement up and closes its connection: a network path that goes silent without a
/// reset would otherwise hold the pass, and every later one, for good. The pass fails, and the
/// next one starts an interval later.
pub const STATEMENT_ANSWER: Duration = Duration::from_secs(30);

/// The server's own bounds on each retention statement, each in a transaction of its own
/// (never looser than the session's own settings): its wait for locks ends after 20 s (behind
/// a `vacuum full`, say) and the statement after [`STATEMENT_SERVER`], before the client gives
/// up; a session left idle in its transaction (its client gone silent) is ended after
/// [`STATEMENT_ANSWER`], and its transaction rolled back. So no backend of a given-up statement
/// waits on, or lasts more than a minute past it. `$1`, `$2`, `$3`: the three bounds in
/// milliseconds.
const BOUNDS: &str = "select set_config(s.name, case when s.setting::int8 between 1 and b.ms \
       then s.setting else b.ms::text end, true) \
  from pg_settings s \
  join (values ('lock_timeout', $1::int8), ('statement_timeout', $2::int8), \
               ('idle_in_transaction_session_timeout', $3::int8)) as b(name, ms) \
    on b.name = s.name";

/// See [`BOUNDS`].
const LOCK_SERVER: Duration = Duration::from_secs(20);
/// See [`BOUNDS`].
const STATEMENT_SERVER: Duration = Duration::from_secs(25);

/// `statement` in a transaction of its own on a connection of `pool`, with the server's
/// [`BOUNDS`], answered within [`STATEMENT_ANSWER`]; its errors name `table`. Unanswered, the
/// connection is closed rather than returned to the pool (the pool would test it with a round
/// trip that gets no answer either).
async fn answered<T>(
    pool: &PgPool,
    table: Table,
    statement: impl for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, sqlx::Result<T>>,
) -> Result<T> {
    use sqlx::Connection as _;
    let mut conn = pool.acquire().await.map_err(|e| table.error(e))?;
    let work = async {
        let mut tx = conn.begin().await?;
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        sqlx::query(BOUNDS)
            .bind(ms(LOCK_SERVER))
            .bind(ms(STATEMENT_SERVER))
            .bind(ms(STATEMENT_ANSWER))
            .execute(&mut *tx)
            .await?;
        let answer = statement(&mut tx).await?;
        tx.commit().await?;
        Ok(answer)
    };
    let outcome = tokio::time::timeout(STATEMENT_ANSWER, work).await;
    match outcome {
        Ok(result) => result.map_err(|e| table.error(e)),
        Err(_) => {
            conn.close_on_drop();
            Err(Error::Database(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "retention on {}: Postgres did not answer within {STATEMENT_ANSWER:?}; the connection is closed",
                    table.name
                ),
            ))))
        }
    }
}

/// `now() - keep` on the database's clock.
async fn cutoff(pool: &PgPool, table: Table, keep: Duration) -> Result<DateTime<Utc>> {
    answered(pool, table, |c| {
        Box::pin(
            sqlx::query_scalar("select now() - $1::interval")
                .bind(interval(keep))
                .fetch_one(c),
        )
    })
    .await
}

/// One table's part of a pass: `statement` (`$1` a fixed cutoff, `$2` the batch) deletes from
/// `table`, which names its errors and its metric, at the share of its time `pace` sets.
struct Prune {
    statement: &'static str,
    table: Table,
    cutoff: DateTime<Utc>,
    /// When the cutoff was read: the rows of the cutoff expired this long before now.
    since: Instant,
    pace: Pace,
    deleted: u64,
    done: bool,
    /// When its next statement is due (after the pause of the last one).
    next: Instant,
    /// The last statement's error, and when the prune tries again.
    failed: Option<(Error, Instant)>,
}

impl Prune {
    /// Published rows older than `keep`.
    async fn published(pool: &PgPool, keep: Duration, pace: Pace) -> Result<Prune> {
        Ok(Prune::new(
            PRUNE_PUBLISHED,
            OUTBOX_EVENTS,
            cutoff(pool, OUTBOX_EVENTS, keep).await?,
            pace,
        ))
    }

    /// Dedupe rows older than `keep`, once their cutoff is recorded as the dedupe horizon;
    /// `None` when there is none.
    async fn dedupe(pool: &PgPool, keep: Duration, pace: Pace) -> Result<Option<Prune>> {
        let cutoff = cutoff(pool, OUTBOX_CONSUMED, keep).await?;
        let any: bool = answered(pool, OUTBOX_CONSUMED, |c| {
            Box::pin(
                sqlx::query_scalar(
                    "select exists (select 1 from outbox_consumed where consumed_at < $1)",
                )
                .bind(cutoff)
                .fetch_one(c),
            )
        })
        .await?;
        if !any {
            return Ok(None);
        }
        answered(pool, DEDUPE_HORIZON, |c| {
            Box::pin(
                sqlx::query(
                    "insert into outbox_dedupe_horizon as h (pruned_before) values ($1) \
                     on conflict (id) do update set pruned_before = greatest(h.pruned_before, excluded.pruned_before)",
                )
                .bind(cutoff)
                .execute(c),
            )
        })
        .await?;
        Ok(Some(Prune::new(
            PRUNE_DEDUPE,
            OUTBOX_CONSUMED,
            cutoff,
            pace,
        )))
    }

    fn new(statement: &'static str, table: Table, cutoff: DateTime<Utc>, pace: Pace) -> Prune {
        let now = Instant::now();
        Prune {
            statement,
            table,
            cutoff,
            since: now,
            pace,
            deleted: 0,
            done: false,
            next: now,
            failed: None,
        }
    }

    /// How long ago the newest row of its last statement (`newest`, in seconds since 1970)
    /// expired, in seconds: how far behind the rows expiring the prune is.
    fn behind(&self, newest: f64) -> f64 {
        let cutoff = self.cutoff.timestamp_micros() as f64 / 1e6;
        cutoff - newest + self.since.elapsed().as_secs_f64()
    }

    /// Whether the prune still deletes: not done, and not waiting after a failed statement.
    fn going(&self) -> bool {
        !self.done && self.failed.is_none()
    }

    /// When the prune runs its next statement: after its pause, or at its retry.
    fn due(&self) -> Instant {
        self.failed.as_ref().map_or(self.next, |(_, at)| *at)
    }
}

/// Sets the share gauge of each table to 0 when a pass ends, however it ends (done, an error,
/// or dropped at shutdown): no share is shown for a pass that no longer runs.
struct ShareGauges(Vec<&'static str>);

impl Drop for ShareGauges {
    fn drop(&mut self) {
        for table in &self.0 {
            metrics::gauge!(m::PRUNE_SHARE, "table" => *table).set(0.0);
        }
    }
}

/// Runs the `prunes` until each has run a statement that deleted fewer than `batch` rows: each
/// statement when its prune is due, pausing each prune after its statement so that its
/// statements take the share of the time its [`Pace`] sets (timed on a connection already
/// taken from the pool: waiting for one is not the statement's cost). A prune's pause lets the
/// other's statements run: a table with hours of backlog does not hold off the other, and each
/// table's share is its own. A failed statement is logged naming its table, and its prune tries
/// again after [`MAX_PAUSE`] while another prune goes on; once none goes on, the first error is
/// returned (alone, a prune returns its error at once, as the pass's next start tries again).
/// Each statement's rows count in the metric as it completes (a pass can run for hours at a low
/// share), and in its prune's `deleted`; the total is returned. `skip locked` fills a batch
/// from the rows after a held one, so a short batch means no unheld row is left.
async fn in_turns(pool: &PgPool, prunes: &mut [Prune], batch: i64) -> Result<u64> {
    let _shares = ShareGauges(prunes.iter().map(|p| p.table.name).collect());
    while prunes.iter().any(Prune::going) {
        // the prune due first (the first of those due at once), done ones aside
        let i = (0..prunes.len())
            .filter(|&i| !prunes[i].done)
            .min_by_key(|&i| prunes[i].due())
            .expect("a prune that goes on is not done");
        tokio::time::sleep_until(prunes[i].due()).await;
        let prune = &mut prunes[i];
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
                let now = Instant::now();
                let share = match newest {
                    Some(newest) => prune.pace.after(now, newest, prune.behind(newest)),
                    None => prune.pace.share,
                };
                metrics::gauge!(m::PRUNE_SHARE, "table" => table).set(f64::from(share));
                prune.next = now + pause_after(took, share);
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
    match prunes.iter_mut().find_map(|p| p.failed.take()) {
        Some((e, _)) => Err(e),
        None => Ok(prunes.iter().map(|p| p.deleted).sum()),
    }
}

/// One of `prune`'s statements: the rows it deleted, the newest time among them
/// (`published_at` or `consumed_at`, in seconds since 1970; infinite for a row written by
/// hand with `-infinity`), and how long it took once it had its connection.
async fn delete_once(
    pool: &PgPool,
    prune: &Prune,
    batch: i64,
) -> Result<(u64, Option<f64>, Duration)> {
    let mut started = None;
    let (n, newest): (i64, Option<f64>) = answered(pool, prune.table, |c| {
        started = Some(Instant::now());
        Box::pin(
            sqlx::query_as(prune.statement)
                .bind(prune.cutoff)
                .bind(batch)
                .fetch_one(c),
        )
    })
    .await?;
    let took = started.map_or(Duration::ZERO, |t| t.elapsed());
    Ok((n.unsigned_abs(), newest, took))
}

/// How much faster than the clock a pass that catches up moves through its table's time (the
/// `published_at` or `consumed_at` of the rows it deletes): twice, so that it gains on the
/// rows expiring (which expire as fast as they were published a keep earlier) by a second
/// every second.
const PACE_TARGET: f64 = 2.0;

/// How long a prune runs at one share before it measures its progress and sets the next.
const PACE_WINDOW: Duration = Duration::from_secs(5);

/// A prune's share of the time: `floor` while it keeps up with the rows expiring; while it is
/// more than `allowance` behind them, the share that moves it through its table's time
/// [`PACE_TARGET`] times as fast as the clock, at most `ceiling`. Every [`PACE_WINDOW`] of full
/// statements it compares the table time its rows covered with the time that passed and
/// scales its share by how far that is from the target (its rate grows with its share: the
/// pause after a statement is what the share sets).
#[derive(Debug, Clone)]
struct Pace {
    floor: u8,
    ceiling: u8,
    /// How far behind the rows expiring the prune may be before it takes more than its floor,
    /// in seconds (two intervals of a [`Retention`]: a pass that keeps up starts at most one
    /// behind). Within it, a pass slowed by a busy database (a relay draining) keeps to its
    /// floor.
    allowance: f64,
    share: u8,
    /// When the window began, and the newest row time deleted then (seconds since 1970).
    window: Option<(Instant, f64)>,
}

impl Pace {
    /// Always `share` (`outbox prune`, [`prune_published_paced`]).
    fn fixed(share: u8) -> Pace {
        Pace::following(share, share, Duration::ZERO)
    }

    /// From `floor` to `ceiling` (a [`Retention`] pass) once more than `allowance` behind,
    /// starting at `floor`.
    fn following(floor: u8, ceiling: u8, allowance: Duration) -> Pace {
        Pace {
            floor,
            ceiling: ceiling.max(floor),
            allowance: allowance.as_secs_f64(),
            share: floor,
            window: None,
        }
    }

    /// The share for the pause after a full statement that ended `now`, whose newest row is
    /// from `newest` (seconds since 1970) and expired `behind` seconds ago. A time that is not
    /// finite (a row written by hand with `-infinity`) measures nothing.
    fn after(&mut self, now: Instant, newest: f64, behind: f64) -> u8 {
        if !newest.is_finite() {
            return self.share;
        }
        match self.window {
            Some((since, from)) if now.duration_since(since) >= PACE_WINDOW => {
                self.share = if behind < self.allowance {
                    self.floor
                } else {
                    let wall = now.duration_since(since).as_secs_f64();
                    next_share(self.share, wall, newest - from).clamp(self.floor, self.ceiling)
                };
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
/// covered`, rounded up, from 1 to 100 (no table time covered: 100).
fn next_share(share: u8, wall: f64, covered: f64) -> u8 {
    if covered <= 0.0 {
        return 100;
    }
    // an infinite quotient (a covered time next to nothing) clamps to 100 too
    (f64::from(share) * PACE_TARGET * wall / covered)
        .ceil()
        .clamp(1.0, 100.0) as u8
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

/// [`prune_dedupe`]'s statement, as [`PRUNE_PUBLISHED`] (dedupe rows are never updated), the
/// condition checked again on the rows it deletes.
const PRUNE_DEDUPE: &str = "with deleted as ( \
     delete from outbox_consumed where ctid = any(array( \
       select ctid from outbox_consumed \
        where consumed_at < $1 \
        order by consumed_at limit $2 for update skip locked)) \
       and consumed_at < $1 \
     returning consumed_at) \
   select count(*), extract(epoch from max(consumed_at))::float8 from deleted";

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

    /// One pass: prunes published rows and dedupe rows, each at its own pace, a statement of
    /// one in the pause of the other, so that hours of published backlog do not hold off dedupe
    /// pruning. A statement that fails on one table does not stop the other: it is logged
    /// (at warn, naming the table), the table is tried again a minute later while the other
    /// goes on, and once neither goes on the first error is returned. Returns `(published,
    /// dedupe)` counts.
    pub async fn run_once(&self) -> Result<(u64, u64)> {
        let c = &self.config;
        let mut prunes = Vec::with_capacity(2);
        let mut failed = None;
        let pace = Pace::following(c.busy_percent, c.max_busy_percent, c.interval * 2);
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
        // rows all published at the same instant: no table time covered at all, or less
        assert_eq!(next_share(10, 5.0, 0.0), 100);
        assert_eq!(next_share(10, 5.0, -1.0), 100);
    }

    #[test]
    fn a_pace_measures_over_its_window_and_stays_within_its_floor_and_ceiling() {
        let start = Instant::now();
        let secs = |s: u64| start + Duration::from_secs(s);
        // an hour behind: catching up
        let behind = 3_600.0;
        let mut pace = Pace::following(10, 60, Duration::from_secs(120));
        assert_eq!(pace.after(secs(0), 0.0, behind), 10, "starts at its floor");
        // within the window: unchanged, however slow
        assert_eq!(pace.after(secs(4), 0.0, behind), 10);
        // 5 s covered 1 s of table time: wants 100, held at the ceiling
        assert_eq!(pace.after(secs(5), 1.0, behind), 60);
        // 5 s covered 60 s at 60%: wants 10
        assert_eq!(pace.after(secs(10), 61.0, behind), 10);
        // a time that is not finite measures nothing
        assert_eq!(pace.after(secs(20), f64::NEG_INFINITY, behind), 10);
        // a fixed pace never moves
        let mut fixed = Pace::fixed(10);
        fixed.after(secs(0), 0.0, behind);
        assert_eq!(fixed.after(secs(5), 0.0, behind), 10);
    }

    #[test]
    fn a_pace_less_than_its_allowance_behind_keeps_to_its_floor() {
        let start = Instant::now();
        let secs = |s: u64| start + Duration::from_secs(s);
        let mut pace = Pace::following(10, 100, Duration::from_secs(120));
        // rows that expired a minute ago, deleted slower than the clock (a busy database)
        pace.after(secs(0), 0.0, 60.0);
        assert_eq!(pace.after(secs(5), 1.0, 60.0), 10);
        // ten minutes behind, as slow: it catches up
        assert_eq!(pace.after(secs(10), 2.0, 600.0), 100);
        // back within the allowance: down to its floor
        assert_eq!(pace.after(secs(15), 200.0, 100.0), 10);
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
