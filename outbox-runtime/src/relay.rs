//! The relay: the loop that moves committed rows from `outbox_events` to JetStream.
//!
//! # One batch
//!
//! A batch is one short transaction ([`Relay::claim`], [`Claim::publish`], [`Claim::commit`]):
//!
//! 1. **Claim** up to [`RelayConfig::batch_size`] unpublished rows in `created_at` order,
//!    `for update skip locked`, skipping the subjects this relay is backing off and the subjects
//!    that are held (below). The claim also takes a transaction-scoped advisory lock on a hash
//!    partition of each row's `subject` (`pg_try_advisory_xact_lock`); rows whose partition is
//!    locked by another relay's open batch are skipped.
//! 2. **Publish** each row on the NATS subject `event_type`, with the CloudEvents
//!    [`Envelope`](crate::Envelope) as the body and the headers `Nats-Msg-Id: <id>`,
//!    `Content-Type: application/cloudevents+json` and a W3C `traceparent` (one trace per batch,
//!    recorded as `trace_id` on the `outbox.publish` span). Publishing is pipelined across
//!    subjects and sequential within one: the first event of every subject in the batch is sent
//!    at once, and a subject's next event is sent when the previous one is acknowledged, so one
//!    subject never has two events in flight while the connection stays busy. All publishes
//!    share one deadline, [`RelayConfig::ack_timeout`], counted from the start of publishing.
//!    When the NATS connection is down, publishing fails at once instead of waiting on the
//!    broker.
//! 3. **Mark**: the acknowledged rows get `published_at` in one statement, the rows whose
//!    publish failed get `attempts = attempts + 1` in one statement, then the transaction commits.
//!    A duplicate ack (JetStream already stored that `Nats-Msg-Id`) counts as acknowledged.
//!    The commit is asynchronous (`synchronous_commit = off`, for this transaction only): a
//!    Postgres crash may forget the last marks, and those rows are then republished under the
//!    same ids, which the duplicate window and the consumers' dedupe absorb.
//!
//! Rows locks are held only for the claim, the bounded publish and two updates. Dropping a
//! [`Claim`] without committing rolls the transaction back, exactly as a crash does: the rows
//! stay unpublished and the next batch republishes them under the same id, which JetStream
//! drops as a duplicate inside its duplicate window.
//!
//! # Lanes
//!
//! [`Relay::run`] runs [`RelayConfig::lanes`] batch loops at once (default 2), each with its own
//! transaction, so that one lane's Postgres work (claim, mark, commit: about half of a batch's
//! time) overlaps another lane's publishing. A lane claims only from its share of the subject
//! partitions (`partition % lanes == lane`, tested before the partition's advisory lock is
//! taken), so the lanes of one relay never compete for a row or a lock and each subject belongs
//! to one lane. Lanes of different relays would compete for the same rows, and a claim that
//! finds the rows it wants held by another transaction scans the backlog for nothing. So a
//! relay that meets another transaction's locks (a batch that published nothing while rows
//! emitted before it were waiting, and no commit was announced during it) runs one lane on
//! every partition for the next 10 s, its other lanes resting (an all-partition batch never
//! runs beside one of its own lane batches), and splits again when that time passes without
//! such a find. A lane whose share has no rows reads past the other lanes' rows to find that
//! out: with a backlog concentrated on a few subjects, and commits waking the idle lanes,
//! `lanes: 1` avoids that reading.
//! [`Relay::claim`] and [`Relay::run_once`] claim from every partition.
//!
//! # Order
//!
//! Order is per `subject` (the entity an event is about), across any number of relays on one
//! table: events with the same subject reach the stream in `created_at` order.
//!
//! - Across relays, the advisory lock makes one transaction at a time the only relay of a
//!   partition (`(hashtext(subject) & 0x7fffffff) % partitions`, [`RelayConfig::partitions`]).
//! - A claim may test a row while another relay holds its partition and a later row of the same
//!   subject after that relay committed (Postgres does not promise to test rows in `created_at`
//!   order); the claim then holds some of a subject's rows but not an older one. Unless the
//!   claim holds every unpublished row up to its newest one, outside the subjects this relay
//!   backs off (counted by a second query), a third query finds, per subject, the oldest
//!   unpublished row older than the subject's newest claimed row that the claim does not hold,
//!   and cuts the subject's rows there: a batch only ever publishes a gap-free prefix of each
//!   subject's unpublished rows.
//! - Within a batch, a subject's events go out one after the other, each after the previous
//!   one's ack; once one fails, its later events in the batch are not published and their
//!   `attempts` are not incremented (they were not attempted).
//! - `created_at` is the emit time (`clock_timestamp()`): two transactions that emit for the same
//!   subject are ordered by emit time, so writers of one entity should serialise on its row, as
//!   they normally do.
//!
//! # Backoff
//!
//! A failed publish backs its subject off in this relay's memory: the n-th consecutive failure
//! excludes the subject from this relay's claims for `backoff_base * 2^(n-1)`, capped at
//! [`RelayConfig::backoff_max`]; a success clears it. (The table has no last-attempt column, so
//! the schedule is per relay: N relays may each retry a failing subject on their own schedule.)
//! A batch in which nothing was published and something failed (the broker is down) also backs
//! the whole loop off on the same schedule; any success resets it. A broker outage is therefore
//! never a hot loop.
//!
//! # Attempt cap
//!
//! A row whose `attempts` reach [`RelayConfig::max_attempts`] is left alone: it is logged at error
//! level, counted in [`metrics::AT_CAP`](crate::metrics::AT_CAP), listed by [`Relay::capped`],
//! and stays visible to any status query as an unpublished row with `attempts >= max_attempts`.
//! Its subject is **held**: the later events of that subject wait behind it, unpublished, so
//! that the subject's order is never broken. Other subjects are not held back (the claim excludes
//! held subjects in SQL, helped by the small partial index of migration
//! `0003_outbox_retrying_idx.sql` on the subjects of rows that failed at least once). Resetting
//! the row's `attempts` to 0 releases the subject.
//!
//! # Wake-up
//!
//! Every emit notifies the channel [`NOTIFY_CHANNEL`] when its transaction commits. The relay
//! listens on it (`LISTEN`), and after a batch that published anything claims again at once
//! (one empty claim ends a drained backlog). After a batch that published nothing, it checks
//! whether rows are waiting that it could not take. If a commit was announced meanwhile, they
//! may be new rows, and it claims again at once. If not, other transactions hold them (another
//! relay's batch: its row locks, its partitions' advisory locks, or an older row of a claimed
//! subject), and it claims again after 10 ms, doubling while that lasts up to the poll
//! interval (another relay's commit sends no notification; an emit's commit ends the wait).
//! Otherwise it waits for a notification, the fallback poll
//! ([`RelayConfig::poll_interval`]), the earliest subject retry, a loop backoff, or shutdown. A
//! lost listener connection is re-established (the relay claims once after each reconnect,
//! since notifications may have been missed), and the poll keeps rows moving meanwhile.
//!
//! # Failures and shutdown
//!
//! A Postgres or NATS outage makes batches fail; each lane logs, backs off and keeps going (the
//! pool and the NATS client reconnect by themselves), and nothing is lost because nothing is
//! marked without an ack. [`Relay::run`] returns when its `shutdown` future completes: a batch in
//! progress is never cut short (it is bounded by `ack_timeout`), it commits, and then its lane
//! ends.
//!
//! # Start-up checks
//!
//! [`Relay::new`] fails with a clear [`Error`] when Postgres or NATS is unreachable
//! ([`Error::Unreachable`]), when the table is missing ([`Error::MissingTable`], naming the
//! migration), when no stream captures one of [`RelayConfig::subjects`], or when such a stream's
//! duplicate window is shorter than [`RelayConfig::retry_horizon`] ([`Error::Stream`]).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::{Future, IntoFuture};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream;
use async_nats::jetstream::context::PublishError;
use async_nats::jetstream::publish::PublishAck;
use async_nats::{HeaderMap, HeaderName};
use chrono::{DateTime, Utc};
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use serde_json::value::RawValue;
use serde_json::Value;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::types::Oid;
use sqlx::postgres::{
    PgArgumentBuffer, PgHasArrayType, PgListener, PgPoolOptions, PgTypeInfo, PgValueFormat,
    PgValueRef,
};
use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::watch;
use tokio::time::{sleep_until, timeout, Instant};
use tracing::Instrument;
use uuid::Uuid;

use crate::envelope::EnvelopeRef;
use crate::error::{Error, Result};
use crate::{metrics as names, CONTENT_TYPE, NOTIFY_CHANNEL};

/// First key of the relay's advisory locks (`pg_try_advisory_xact_lock(LOCK_NAMESPACE, partition)`),
/// so that they do not collide with the application's own advisory locks.
pub const LOCK_NAMESPACE: i32 = 0x6f62_7872;

const TABLE: &str = "outbox_events";
const MIGRATION: &str = "0001_outbox_events.sql";

/// The batch transaction's own settings, set at its start, for it alone:
///
/// - `synchronous_commit = off`: the marks' commit does not wait for the WAL flush (see
///   [`Claim::commit`]);
/// - no sequential or bitmap scans: the claim then reads the unpublished index in `created_at`
///   order and stops at the batch size. With statistics gathered while the backlog was small,
///   Postgres otherwise filters every unpublished row (taking the advisory lock of every
///   partition it can) and sorts afterwards;
/// - no nested loops: the gap query's anti-join against the claimed ids stays a hash join. Once
///   the prepared statement switches to a generic plan (after five executions), the planner
///   takes the id array for 10 elements and otherwise scans it once per candidate row: 12 ms
///   instead of 2.6 ms per 500-row claim, measured in the `relay` bench. No other statement of
///   the batch joins;
/// - generic plans only: with the settings above every statement of the batch has one sensible
///   plan whatever its parameters (an ordered range of the unpublished index, the TID scan of
///   the marks, the gap query's hash joins), and Postgres otherwise planned the claim and the
///   count again at every batch, because a generic plan's estimate for `created_at <= $1` is
///   higher than a custom plan's (about 3% of Postgres's time in the `relay` bench).
const SETTINGS: &str = "select set_config('synchronous_commit', 'off', true), \
        set_config('enable_seqscan', 'off', true), \
        set_config('enable_bitmapscan', 'off', true), \
        set_config('enable_nestloop', 'off', true), \
        set_config('plan_cache_mode', 'force_generic_plan', true)";

/// The claim. `subject <> all($3)` skips the subjects this relay backs off; `not in` skips
/// subjects held by a row at the attempt cap; the advisory lock skips partitions another relay's
/// batch holds.
///
/// The held subjects are an uncorrelated subquery, which Postgres runs once per claim (a hashed
/// subplan while the held subjects fit in `hash_mem`), whatever the statistics say. As a
/// correlated `not exists`, a planner working from statistics gathered while the backlog was
/// empty ran it once per candidate row, each a scan of every unpublished row: 22 ms instead of
/// 1 ms for a 500-row backlog, quadratic beyond.
/// `attempts > 0` is the predicate of `outbox_events_retrying_idx` (migration 0003), so the
/// subquery can read that small index.
const CLAIM: &str = "\
select id, event_type, source, subject, time, data, created_at, attempts, ctid
  from outbox_events o
 where published_at is null
   and attempts < $2
   and subject <> all($3)
   and subject not in (select h.subject from outbox_events h
                        where h.published_at is null
                          and h.attempts > 0
                          and h.attempts >= $2)
   and case when (hashtext(subject) & 2147483647) % $5 % $6 = $7
            then pg_try_advisory_xact_lock($4, (hashtext(subject) & 2147483647) % $5)
       end
 order by created_at
 limit $1
   for update skip locked";

/// Whether a row of one lane is waiting that the batch's claim did not take: [`CLAIM`] without
/// its locks, for rows emitted before the batch began (`now()` is the transaction's start, on
/// the database's clock), in `created_at` order so that the unpublished index answers it
/// whatever the statistics say. It runs inside the batch (after an empty claim, or a claim
/// whose rows were all cut), so the batch's own cut rows count too: they wait behind a row
/// another transaction holds.
const WAITING: &str = "\
select 1
  from outbox_events
 where published_at is null
   and created_at < now()
   and attempts < $1
   and subject <> all($2)
   and subject not in (select h.subject from outbox_events h
                        where h.published_at is null
                          and h.attempts > 0
                          and h.attempts >= $1)
   and (hashtext(subject) & 2147483647) % $3 % $4 = $5
 order by created_at
 limit 1";

/// How long a relay with several lanes runs one lane only after it last found rows held by
/// another transaction (another relay): lanes of several relays compete for the same rows, and
/// a claim that finds its rows held scans the whole backlog for nothing.
const SHARING_HOLD: Duration = Duration::from_secs(10);

/// How soon a relay claims again after a batch in which other transactions held every row it
/// could have published ([`WAITING`]).
const CONTENDED_RETRY: Duration = Duration::from_millis(10);

/// The check before [`GAPS`]: the unpublished rows up to the claim's newest, outside the
/// subjects this relay backs off (`$2`, the list the claim excluded), in the claim's lane
/// (`$3`-`$5`: partitions, lanes, lane; a subject's rows are all in one lane). The claimed rows are among
/// them, locked by this transaction; when they are all of them, no claimed subject can have a
/// hole and the gap query is not run. One range of the unpublished index, without the joins:
/// about a third of the gap query's time in the `relay` bench, where a lone relay's claims have
/// no holes. Any other row in the range (another relay's batch, a held subject's rows, a row
/// committed since the claim began) sends the claim through [`GAPS`]: with several relays on
/// the table, or while a subject is held, most claims run both.
const UNCLAIMED: &str = "\
select count(*)
  from outbox_events
 where published_at is null
   and created_at <= $1
   and subject <> all($2)
   and (hashtext(subject) & 2147483647) % $3 % $4 = $5";

/// For each subject of a claim, the oldest unpublished row not newer than the subject's newest
/// claimed row that the claim does not hold (a row sharing that `created_at` counts, and the
/// cut then drops the claimed rows of the same instant too): a hole before or among the
/// claimed rows. The claim tested that row while another relay held its partition (or its row
/// lock), and later rows after that relay committed; Postgres may also test rows in physical
/// rather than `created_at` order (a plan that sorts after filtering), so the hole can be
/// anywhere. Publishing past it would overtake it. `$1`/`$2`: each claimed subject with its
/// newest claimed `created_at`; `$3`: the latest of those, so the scan is a range of the
/// unpublished index; `$4`: the claimed ids.
const GAPS: &str = "\
select o.subject, min(o.created_at)
  from outbox_events o
  join unnest($1::text[], $2::timestamptz[]) as f(subject, last_created)
    on o.subject = f.subject
 where o.published_at is null
   and o.created_at <= $3
   and o.created_at <= f.last_created
   and not exists (select 1 from unnest($4::uuid[]) as c(id) where c.id = o.id)
 group by o.subject";

/// The marks address the claimed rows by `ctid`: the claim's row locks keep every claimed row
/// where it is until this transaction updates it, and a TID scan does not descend the primary
/// key index, whose depth grows with the table's history. (`outbox_events` must stay a plain
/// table: in a partitioned one a `ctid` is not unique, and [`Claim::commit`] would refuse every
/// batch.)
const MARK_PUBLISHED: &str =
    "update outbox_events set published_at = clock_timestamp() where ctid = any($1)";
const MARK_FAILED: &str = "update outbox_events set attempts = attempts + 1 where ctid = any($1)";

/// The relay's settings: a server-side configuration, `Default` style.
///
/// ```
/// use std::time::Duration;
/// use outbox_runtime::RelayConfig;
///
/// let config = RelayConfig {
///     batch_size: 500,
///     backoff_max: Duration::from_secs(60),
///     subjects: vec!["billing.invoice.paid".into()],
///     ..Default::default()
/// };
/// assert_eq!(config.backoff(1), Duration::from_secs(1));
/// assert_eq!(config.backoff(3), Duration::from_secs(4));
/// assert_eq!(config.backoff(30), Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayConfig {
    /// Rows claimed per batch. Default 500: per-batch costs (three statements, a commit, one
    /// ack deadline) are amortised over more rows (the `relay` bench drains about 20% faster
    /// than with 256), while a batch stays a few milliseconds of row locks.
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
    /// Number of subject partitions for the advisory locks that order subjects across relays.
    /// More partitions let more relays work in parallel; every relay on a table must use the
    /// same value. Default 1024.
    pub partitions: i32,
    /// Batch loops this relay runs at once, each an open transaction of its own claiming from
    /// its share of the partitions (`partition % lanes`), so that one lane's Postgres work
    /// (claim, mark, commit) overlaps another's publishing. Lanes of one relay never compete
    /// for a row; while another relay works on the table, the relay runs one lane only (see
    /// the [module docs](self), *Lanes*). The pool must allow `lanes + 1` connections (one per
    /// lane and one for `LISTEN`). Between 1 and 64, and at most
    /// [`partitions`](Self::partitions). Default 2: on a two-core machine that also runs Postgres
    /// and NATS, one relay drains a backlog about 15-25% faster than with one lane, and three
    /// or four lanes add nothing there (see the README's performance section).
    pub lanes: usize,
    /// NATS subjects (event types) this relay is expected to publish. At start it checks that a
    /// stream captures each one and that the stream's duplicate window covers
    /// [`retry_horizon`](Self::retry_horizon). Empty (the default) skips the check.
    pub subjects: Vec<String>,
}

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

    /// The connections a relay's pool should allow: one per lane, one for `LISTEN` and one for
    /// the backlog gauges. [`Relay::connect`] opens a pool of this size; [`Relay::new`] refuses
    /// a pool of fewer than `lanes + 1`.
    ///
    /// ```
    /// let config = outbox_runtime::RelayConfig { lanes: 2, ..Default::default() };
    /// assert_eq!(config.pool_size(), 4);
    /// ```
    pub fn pool_size(&self) -> u32 {
        u32::try_from(self.lanes).map_or(u32::MAX, |l| l.saturating_add(2))
    }

    /// The longest time between two attempts at one row: `backoff_max + ack_timeout`. A
    /// stream's duplicate window must be at least this long, so that a row whose ack was lost is
    /// recognised as a duplicate when it is republished.
    pub fn retry_horizon(&self) -> Duration {
        self.backoff_max + self.ack_timeout
    }
}

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
    /// before an older row it does not hold (see the module docs, *Order*). Their `attempts` are
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

#[derive(Debug, Default)]
struct Counters {
    batches: AtomicU64,
    claimed: AtomicU64,
    published: AtomicU64,
    duplicates: AtomicU64,
    failed: AtomicU64,
    skipped: AtomicU64,
    capped: AtomicU64,
}

impl Counters {
    fn add(&self, r: &BatchReport) {
        self.batches.fetch_add(1, Relaxed);
        self.claimed.fetch_add(r.claimed as u64, Relaxed);
        self.published.fetch_add(r.published as u64, Relaxed);
        self.duplicates.fetch_add(r.duplicates as u64, Relaxed);
        self.failed.fetch_add(r.failed as u64, Relaxed);
        self.skipped.fetch_add(r.skipped as u64, Relaxed);
        self.capped.fetch_add(r.capped as u64, Relaxed);
    }

    fn snapshot(&self) -> RelayStats {
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

/// The share of the subject partitions one batch loop of a relay claims from: the partitions
/// `p` with `p % count == index`.
#[derive(Debug, Clone, Copy)]
struct Lane {
    index: i32,
    count: i32,
}

impl Lane {
    /// Every partition.
    const ALL: Lane = Lane { index: 0, count: 1 };
}

/// A subject this relay is backing off.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    failures: u32,
    next_try: Instant,
}

/// An unpublished row that reached the attempt cap, as [`Relay::capped`] lists it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct CappedEvent {
    /// The event id.
    pub id: Uuid,
    /// The event type (NATS subject).
    pub event_type: String,
    /// The held subject.
    pub subject: String,
    /// Attempts so far.
    pub attempts: i32,
    /// When it was emitted.
    pub created_at: DateTime<Utc>,
}

/// The publisher loop of the outbox. See the [module docs](self) for its behaviour.
///
/// ```no_run
/// # async fn run() -> outbox_runtime::Result<()> {
/// use outbox_runtime::{Relay, RelayConfig};
///
/// let relay = Relay::connect(
///     "postgres://root@127.0.0.1/test",
///     "nats://127.0.0.1:4222",
///     RelayConfig { subjects: vec!["billing.invoice.paid".into()], ..Default::default() },
/// )
/// .await?;
/// relay.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
/// # Ok(()) }
/// ```
pub struct Relay {
    pool: PgPool,
    jetstream: jetstream::Context,
    config: RelayConfig,
    backoffs: Mutex<HashMap<String, Backoff>>,
    counters: Counters,
    /// Until when this relay shares the table with another relay and runs one lane only.
    sharing_until: Mutex<Option<Instant>>,
    /// Read by each lane batch, written by an all-partition batch of [`Relay::run`].
    lane_gate: tokio::sync::RwLock<()>,
}

impl fmt::Debug for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("config", &self.config)
            .field("stats", &self.counters.snapshot())
            .finish_non_exhaustive()
    }
}

/// `postgres://user:pw@host/db` -> `postgres://host/db`, for error messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

fn is_connection_error(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
    )
}

fn db_error(e: sqlx::Error) -> Error {
    Error::from_db(e, TABLE, MIGRATION)
}

impl Relay {
    /// Connects to Postgres and NATS, then runs the start-up checks of [`Relay::new`].
    ///
    /// An address where nothing answers fails with [`Error::Unreachable`].
    ///
    /// ```no_run
    /// # async fn run() -> outbox_runtime::Result<()> {
    /// let relay = outbox_runtime::Relay::connect(
    ///     "postgres://root@127.0.0.1/test",
    ///     "nats://127.0.0.1:4222",
    ///     Default::default(),
    /// )
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(database_url: &str, nats_url: &str, config: RelayConfig) -> Result<Relay> {
        config.validate()?;
        let pool = PgPoolOptions::new()
            .max_connections(config.pool_size())
            .acquire_timeout(config.ack_timeout.max(Duration::from_secs(5)))
            .connect(database_url)
            .await
            .map_err(|e| {
                if is_connection_error(&e) {
                    Error::Unreachable {
                        service: "postgres",
                        target: redact(database_url),
                        reason: e.to_string(),
                    }
                } else {
                    Error::Database(e)
                }
            })?;
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(config.ack_timeout.max(Duration::from_secs(5)))
            .connect(nats_url)
            .await
            .map_err(|e| Error::Unreachable {
                service: "nats",
                target: redact(nats_url),
                reason: e.to_string(),
            })?;
        Relay::new(pool, jetstream::new(client), config).await
    }

    /// A relay on `pool` publishing through `jetstream`, after checking that it can work: the
    /// configuration is valid, the pool allows a connection per lane and one for `LISTEN`
    /// ([`RelayConfig::lanes`] + 1), Postgres answers and has the outbox table, NATS answers with
    /// JetStream enabled, and a stream with a long enough duplicate window captures each of
    /// [`RelayConfig::subjects`].
    ///
    /// ```no_run
    /// # async fn run(pool: sqlx::PgPool, client: async_nats::Client) -> outbox_runtime::Result<()> {
    /// let relay = outbox_runtime::Relay::new(
    ///     pool,
    ///     async_nats::jetstream::new(client),
    ///     outbox_runtime::RelayConfig::default(),
    /// )
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub async fn new(
        pool: PgPool,
        jetstream: jetstream::Context,
        config: RelayConfig,
    ) -> Result<Relay> {
        config.validate()?;
        let connections = pool.options().get_max_connections() as usize;
        if connections <= config.lanes {
            return Err(Error::Config(format!(
                "the relay's pool allows {connections} connections, and a relay with {} lanes needs at least {} (one per lane and one for LISTEN): raise the pool's max_connections or lower RelayConfig::lanes",
                config.lanes,
                config.lanes + 1
            )));
        }
        sqlx::query("select 1 from outbox_events limit 0")
            .execute(&pool)
            .await
            .map_err(|e| {
                if is_connection_error(&e) {
                    let o = pool.connect_options();
                    Error::Unreachable {
                        service: "postgres",
                        target: format!("{}:{}", o.get_host(), o.get_port()),
                        reason: e.to_string(),
                    }
                } else {
                    db_error(e)
                }
            })?;
        let client = jetstream.client();
        let info = client.server_info();
        let target = format!("{}:{}", info.host, info.port);
        let info_request = jetstream.request::<_, _, Value>("INFO", &b""[..]);
        match timeout(config.ack_timeout, info_request).await {
            Ok(Ok(answer)) => {
                if let Some(error) = answer.get("error") {
                    return Err(Error::Nats(format!(
                        "JetStream at {target} refuses this account: {error}"
                    )));
                }
            }
            Ok(Err(e)) if client.connection_state() == State::Connected => {
                return Err(Error::Nats(format!(
                    "JetStream does not answer at {target}: {e}; is the server started with JetStream enabled (`nats-server -js`)?"
                )))
            }
            Ok(Err(e)) => {
                return Err(Error::Unreachable {
                    service: "nats",
                    target,
                    reason: e.to_string(),
                })
            }
            Err(_) => {
                return Err(Error::Unreachable {
                    service: "nats",
                    target,
                    reason: format!("no answer within {:?}", config.ack_timeout),
                })
            }
        }
        if !config.subjects.is_empty() {
            let horizon = config.retry_horizon();
            for (name, info) in crate::stream::check_captures(&jetstream, &config.subjects).await? {
                if info.config.duplicate_window < horizon {
                    return Err(Error::Stream {
                        stream: name,
                        reason: format!(
                            "duplicate window {:?} is shorter than the relay's retry horizon {:?} (backoff_max + ack_timeout): a republished row could be stored twice; raise the stream's duplicate_window or lower backoff_max",
                            info.config.duplicate_window, horizon
                        ),
                    });
                }
            }
        }
        Ok(Relay {
            pool,
            jetstream,
            config,
            backoffs: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            sharing_until: Mutex::new(None),
            lane_gate: tokio::sync::RwLock::new(()),
        })
    }

    /// The relay's configuration.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// Totals since the relay was created.
    pub fn stats(&self) -> RelayStats {
        self.counters.snapshot()
    }

    /// The subjects this relay is currently backing off, with their consecutive failures.
    pub fn backed_off(&self) -> Vec<(String, u32)> {
        let now = Instant::now();
        let mut v: Vec<(String, u32)> = self
            .backoffs()
            .iter()
            .filter(|(_, b)| b.next_try > now)
            .map(|(s, b)| (s.clone(), b.failures))
            .collect();
        v.sort();
        v
    }

    fn backoffs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Backoff>> {
        self.backoffs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The unpublished rows at the attempt cap, oldest first: each holds its subject.
    ///
    /// ```no_run
    /// # async fn run(relay: outbox_runtime::Relay) -> outbox_runtime::Result<()> {
    /// for event in relay.capped().await? {
    ///     eprintln!("{} ({}) is stuck after {} attempts", event.id, event.event_type, event.attempts);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn capped(&self) -> Result<Vec<CappedEvent>> {
        sqlx::query_as(
            "select id, event_type, subject, attempts, created_at from outbox_events \
             where published_at is null and attempts >= $1 order by created_at",
        )
        .bind(self.config.max_attempts)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    /// Claims a batch: the first step of [`run_once`](Self::run_once), for callers that drive
    /// the steps themselves. It claims from every partition, whatever
    /// [`RelayConfig::lanes`] says.
    ///
    /// ```no_run
    /// # async fn run(relay: outbox_runtime::Relay) -> outbox_runtime::Result<()> {
    /// let mut claim = relay.claim().await?;
    /// claim.publish().await;
    /// let report = claim.commit().await?;
    /// println!("published {}", report.published);
    /// # Ok(()) }
    /// ```
    pub async fn claim(&self) -> Result<Claim<'_>> {
        self.claim_lane(Lane::ALL).await
    }

    async fn claim_lane(&self, lane: Lane) -> Result<Claim<'_>> {
        let tx = self.pool.begin().await.map_err(db_error)?;
        self.claim_in(tx, lane).await
    }

    async fn claim_in(
        &self,
        mut tx: Transaction<'static, Postgres>,
        lane: Lane,
    ) -> Result<Claim<'_>> {
        let span = tracing::debug_span!("outbox.claim", claimed = tracing::field::Empty);
        async {
            // a statement of its own rather than part of BEGIN: if it fails, dropping the
            // transaction rolls it back and the pooled connection comes back clean
            sqlx::query(SETTINGS)
                .execute(&mut *tx)
                .await
                .map_err(db_error)?;
            let excluded = self.excluded_subjects();
            let rows: Vec<Row> = sqlx::query_as(CLAIM)
                .bind(self.config.batch_size as i64)
                .bind(self.config.max_attempts)
                .bind(&excluded)
                .bind(LOCK_NAMESPACE)
                .bind(self.config.partitions)
                .bind(lane.count)
                .bind(lane.index)
                .fetch_all(&mut *tx)
                .await
                .map_err(db_error)?;
            let claimed = rows.len();
            let rows = drop_gaps(&mut tx, rows, &excluded, self.config.partitions, lane).await?;
            tracing::Span::current().record("claimed", claimed);
            let skipped = claimed - rows.len();
            Ok(Claim {
                relay: self,
                tx,
                rows,
                acked: Vec::new(),
                failed: Vec::new(),
                report: BatchReport {
                    claimed,
                    skipped,
                    ..BatchReport::default()
                },
                published: false,
                lane,
                excluded,
            })
        }
        .instrument(span)
        .await
    }

    fn excluded_subjects(&self) -> Vec<String> {
        let now = Instant::now();
        let forget = self.config.backoff_max * 2;
        let mut backoffs = self.backoffs();
        // A subject another relay published meanwhile is never seen again here: forget it.
        backoffs.retain(|_, b| b.next_try + forget > now);
        backoffs
            .iter()
            .filter(|(_, b)| b.next_try > now)
            .map(|(s, _)| s.clone())
            .collect()
    }

    fn next_subject_retry(&self) -> Option<Instant> {
        let now = Instant::now();
        self.backoffs()
            .values()
            .map(|b| b.next_try)
            .filter(|t| *t > now)
            .min()
    }

    /// One batch: claim, publish, mark, commit. Like [`claim`](Self::claim), it claims from
    /// every partition.
    ///
    /// ```no_run
    /// # async fn run(relay: outbox_runtime::Relay) -> outbox_runtime::Result<()> {
    /// while relay.run_once().await?.claimed > 0 {}
    /// # Ok(()) }
    /// ```
    pub async fn run_once(&self) -> Result<BatchReport> {
        let mut claim = self.claim().await?;
        if claim.is_empty() {
            return claim.release().await;
        }
        claim.publish().await;
        claim.commit().await
    }

    /// Runs batches, in [`RelayConfig::lanes`] loops at once, until `shutdown` completes, then
    /// returns. The batches in progress when it completes are finished and committed first.
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
        let gauges = tokio::spawn(refresh_gauges(self.pool.clone(), self.config.max_attempts));
        let _gauges = AbortOnDrop(gauges);
        let (stop, stopped) = watch::channel(false);
        let count = self.config.lanes as i32;
        let lanes =
            futures::future::join_all((0..count).map(|index| {
                self.run_lane(Lane { index, count }, wake.subscribe(), stopped.clone())
            }));
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
        let mut loop_failures = 0u32;
        let mut contended = 0u32;
        loop {
            let mut pause = None;
            let mut end_pause_on_commit = false;
            let mut again = false;
            let mut this_lane = lane;
            if lane.count > 1 {
                if let Some(until) = self.sharing() {
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
            // An all-partition batch never overlaps this relay's own lane batches, whose rows
            // it would take for another relay's.
            let outcome = if lane.count > 1 && this_lane.count == 1 {
                let _alone = self.lane_gate.write().await;
                self.run_lane_once(this_lane).await
            } else {
                let _shared = self.lane_gate.read().await;
                self.run_lane_once(this_lane).await
            };
            match outcome {
                Ok((r, _)) if r.published > 0 => {
                    loop_failures = 0;
                    contended = 0;
                    again = true;
                }
                Ok((r, _)) if r.failed > 0 => {
                    loop_failures = loop_failures.saturating_add(1);
                    pause = Some(self.config.backoff(loop_failures));
                }
                Ok((_, Waiting::Elsewhere)) if wake.has_changed().unwrap_or(false) => {
                    // a commit was announced during the batch: the waiting rows may be its own
                    wake.borrow_and_update();
                    again = true;
                }
                Ok((_, Waiting::Elsewhere)) => {
                    self.share();
                    let wait = CONTENDED_RETRY.saturating_mul(1 << contended.min(16));
                    pause = Some(wait.min(self.config.poll_interval));
                    // a row committed just now may not be announced yet: its notification
                    // ends the pause
                    end_pause_on_commit = true;
                    contended = contended.saturating_add(1);
                }
                Ok((_, Waiting::Nothing)) => contended = 0,
                Err(e) => {
                    loop_failures = loop_failures.saturating_add(1);
                    let wait = self.config.backoff(loop_failures);
                    tracing::warn!(error = %e, retry_in = ?wait, "outbox relay batch failed");
                    pause = Some(wait);
                }
            }
            if *stop.borrow() {
                return;
            }
            if again {
                continue;
            }
            let now = Instant::now();
            let until = match pause {
                Some(p) => now + p,
                None => {
                    let poll = now + self.config.poll_interval;
                    self.next_subject_retry().map_or(poll, |t| t.min(poll))
                }
            };
            tokio::select! {
                _ = stop.changed() => return,
                _ = sleep_until(until) => {}
                _ = wake.changed(), if pause.is_none() || end_pause_on_commit => {}
            }
        }
    }

    /// When another relay's locks were last seen plus [`SHARING_HOLD`], if that is still ahead.
    fn sharing(&self) -> Option<Instant> {
        let until = *self.sharing_until.lock().unwrap_or_else(|p| p.into_inner());
        until.filter(|t| *t > Instant::now())
    }

    /// Runs one lane for the next [`SHARING_HOLD`].
    fn share(&self) {
        *self.sharing_until.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Instant::now() + SHARING_HOLD);
    }

    /// One batch on `lane`, and for a batch that published nothing and failed nothing, whether
    /// rows it could not take are waiting (see [`WAITING`]).
    async fn run_lane_once(&self, lane: Lane) -> Result<(BatchReport, Waiting)> {
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

/// Whether rows a batch could not take are waiting ([`WAITING`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiting {
    /// No unpublished row of the lane is claimable but for other transactions' locks.
    Nothing,
    /// Some are: held by another transaction (row lock, partition lock, or an older row of
    /// their subject), or committed after the claim's snapshot.
    Elsewhere,
}

/// Cuts each subject's claimed rows at the first hole (see [`GAPS`], run when [`UNCLAIMED`]
/// finds rows the claim does not hold): only the rows older than the oldest unpublished row
/// the claim does not hold are kept, so a batch always holds a gap-free prefix of each
/// subject's unpublished rows. The cut rows stay locked and untouched
/// until the transaction ends; a later batch takes them, after the hole.
async fn drop_gaps(
    tx: &mut Transaction<'static, Postgres>,
    rows: Vec<Row>,
    excluded: &[String],
    partitions: i32,
    lane: Lane,
) -> Result<Vec<Row>> {
    let Some(latest) = rows.iter().map(|r| r.created_at).max() else {
        return Ok(rows);
    };
    let in_range: i64 = sqlx::query_scalar(UNCLAIMED)
        .bind(latest)
        .bind(excluded)
        .bind(partitions)
        .bind(lane.count)
        .bind(lane.index)
        .fetch_one(&mut **tx)
        .await
        .map_err(db_error)?;
    if in_range == rows.len() as i64 {
        return Ok(rows);
    }
    // rows are in created_at order: the last one seen per subject is its newest
    let mut newest: HashMap<&str, DateTime<Utc>> = HashMap::new();
    for row in &rows {
        newest.insert(row.subject.as_str(), row.created_at);
    }
    let (subjects, lasts): (Vec<&str>, Vec<DateTime<Utc>>) = newest.into_iter().unzip();
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let holes: HashMap<String, DateTime<Utc>> = sqlx::query_as(GAPS)
        .bind(&subjects)
        .bind(&lasts)
        .bind(latest)
        .bind(&ids)
        .fetch_all(&mut **tx)
        .await
        .map_err(db_error)?
        .into_iter()
        .collect();
    if holes.is_empty() {
        return Ok(rows);
    }
    tracing::debug!(
        subjects = holes.len(),
        "outbox claim cut subjects at an older event it does not hold"
    );
    Ok(rows
        .into_iter()
        .filter(|r| {
            holes
                .get(&r.subject)
                .is_none_or(|hole| r.created_at < *hole)
        })
        .collect())
}

/// How often a running relay refreshes the backlog gauges.
const GAUGE_INTERVAL: Duration = Duration::from_secs(10);

/// [`crate::status::record_gauges`] at start and every [`GAUGE_INTERVAL`], for as long as the
/// relay runs: the gauges operators alert on exist wherever a relay runs, in a service or in
/// `outbox relay`.
async fn refresh_gauges(pool: PgPool, max_attempts: i32) {
    let mut tick = tokio::time::interval(GAUGE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = crate::status::record_gauges(&pool, max_attempts).await {
            tracing::debug!(error = %e, "outbox backlog gauges not refreshed");
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Forwards `outbox_events` notifications to `wake`, reconnecting on error.
async fn listen(pool: PgPool, wake: watch::Sender<()>, retry: Duration) {
    loop {
        match PgListener::connect_with(&pool).await {
            Ok(mut listener) => match listener.listen(NOTIFY_CHANNEL).await {
                Ok(()) => {
                    // Rows committed while not listening were not announced.
                    wake.send_replace(());
                    loop {
                        match listener.try_recv().await {
                            Ok(_) => {
                                wake.send_replace(());
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "outbox relay lost its LISTEN connection; polling until it is back");
                                break;
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "outbox relay cannot LISTEN; polling"),
            },
            Err(e) => {
                tracing::warn!(error = %e, "outbox relay cannot open its LISTEN connection; polling")
            }
        }
        tokio::time::sleep(retry).await;
    }
}

#[derive(Debug)]
struct Row {
    id: Uuid,
    event_type: String,
    source: String,
    subject: String,
    time: DateTime<Utc>,
    /// Passed through as Postgres rendered it: never parsed, only copied into the envelope.
    data: sqlx::types::Json<Box<RawValue>>,
    created_at: DateTime<Utc>,
    attempts: i32,
    /// Where the row is, for the marks (stable while the claim holds the row's lock).
    ctid: Tid,
}

/// A row's physical address (`ctid`: block number and line pointer), exchanged in Postgres's
/// binary form, so that neither side formats or parses it as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tid {
    block: u32,
    line: u16,
}

/// `tid` and `tid[]`: built-in types with fixed OIDs.
impl sqlx::Type<Postgres> for Tid {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(Oid(27))
    }
}

impl PgHasArrayType for Tid {
    fn array_type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(Oid(1010))
    }
}

impl sqlx::Decode<'_, Postgres> for Tid {
    fn decode(value: PgValueRef<'_>) -> std::result::Result<Self, BoxDynError> {
        match value.format() {
            PgValueFormat::Binary => match *value.as_bytes()? {
                [b0, b1, b2, b3, l0, l1] => Ok(Tid {
                    block: u32::from_be_bytes([b0, b1, b2, b3]),
                    line: u16::from_be_bytes([l0, l1]),
                }),
                ref other => Err(format!("a binary tid has 6 bytes, not {}", other.len()).into()),
            },
            PgValueFormat::Text => {
                let text = value.as_str()?;
                let (block, line) = text
                    .strip_prefix('(')
                    .and_then(|t| t.strip_suffix(')'))
                    .and_then(|t| t.split_once(','))
                    .ok_or_else(|| format!("`{text}` is not a tid"))?;
                Ok(Tid {
                    block: block.parse()?,
                    line: line.parse()?,
                })
            }
        }
    }
}

impl sqlx::Encode<'_, Postgres> for Tid {
    fn encode_by_ref(
        &self,
        buf: &mut PgArgumentBuffer,
    ) -> std::result::Result<IsNull, BoxDynError> {
        buf.extend_from_slice(&self.block.to_be_bytes());
        buf.extend_from_slice(&self.line.to_be_bytes());
        Ok(IsNull::No)
    }
}

/// Decoded by position, in [`CLAIM`]'s column order: a claim decodes thousands of rows a
/// second, and by name each column would cost a lookup.
impl sqlx::FromRow<'_, sqlx::postgres::PgRow> for Row {
    fn from_row(row: &sqlx::postgres::PgRow) -> sqlx::Result<Self> {
        use sqlx::Row as _;
        Ok(Row {
            id: row.try_get(0)?,
            event_type: row.try_get(1)?,
            source: row.try_get(2)?,
            subject: row.try_get(3)?,
            time: row.try_get(4)?,
            data: row.try_get(5)?,
            created_at: row.try_get(6)?,
            attempts: row.try_get(7)?,
            ctid: row.try_get(8)?,
        })
    }
}

/// A claimed batch: its rows are locked in an open transaction until [`commit`](Self::commit).
///
/// Dropping a claim without committing rolls the transaction back, as a crash would: rows that
/// were published stay unpublished and are republished (same id) by a later batch.
pub struct Claim<'r> {
    relay: &'r Relay,
    tx: Transaction<'static, Postgres>,
    rows: Vec<Row>,
    /// Indices into `rows` of the acknowledged rows.
    acked: Vec<usize>,
    /// Indices into `rows` of the rows whose publish failed.
    failed: Vec<usize>,
    report: BatchReport,
    published: bool,
    /// The partitions the claim took rows from.
    lane: Lane,
    /// The backed-off subjects the claim skipped.
    excluded: Vec<String>,
}

impl fmt::Debug for Claim<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("rows", &self.rows.len())
            .field("report", &self.report)
            .finish_non_exhaustive()
    }
}

enum Failure {
    Refused(String),
    Deadline,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Refused(e) => f.write_str(e),
            Failure::Deadline => f.write_str("no ack before the batch deadline"),
        }
    }
}

impl Claim<'_> {
    /// [`WAITING`], in this batch's transaction (and with its settings).
    async fn waiting(&mut self) -> Result<Waiting> {
        let found: Option<i32> = sqlx::query_scalar(WAITING)
            .bind(self.relay.config.max_attempts)
            .bind(&self.excluded)
            .bind(self.relay.config.partitions)
            .bind(self.lane.count)
            .bind(self.lane.index)
            .fetch_optional(&mut *self.tx)
            .await
            .map_err(db_error)?;
        Ok(match found {
            Some(_) => Waiting::Elsewhere,
            None => Waiting::Nothing,
        })
    }

    /// Number of rows claimed.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the claim is empty.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The claimed event ids, in `created_at` order.
    pub fn ids(&self) -> Vec<Uuid> {
        self.rows.iter().map(|r| r.id).collect()
    }

    /// Publishes the claimed rows, pipelined across subjects, under one deadline (see the module
    /// docs) and returns what happened; nothing is written to the table until
    /// [`commit`](Self::commit).
    /// Calling it again does nothing and returns the same report.
    pub async fn publish(&mut self) -> BatchReport {
        if self.published {
            return self.report;
        }
        self.published = true;
        // One W3C trace per batch; each message carries its own span id under it, so a
        // consumer's span (which records the header) links to this publish.
        let trace_id = Uuid::new_v4().simple().to_string();
        let span_base = Uuid::new_v4().as_u64_pair().0;
        let span = tracing::debug_span!("outbox.publish", rows = self.rows.len(), %trace_id);
        self.publish_chains(&trace_id, span_base)
            .instrument(span)
            .await;
        self.report
    }

    async fn publish_chains(&mut self, trace_id: &str, span_base: u64) {
        let config = &self.relay.config;
        let jetstream = &self.relay.jetstream;
        let client = jetstream.client();
        let deadline = Instant::now() + config.ack_timeout;

        // Each subject's rows form a chain, in created_at order: `next[i]` is the row after
        // row `i` in its subject, and the first row of every subject is sent at once.
        let mut next: Vec<Option<usize>> = vec![None; self.rows.len()];
        let mut ready: VecDeque<usize> = VecDeque::new();
        {
            let mut last: HashMap<&str, usize> = HashMap::with_capacity(self.rows.len());
            for (i, row) in self.rows.iter().enumerate() {
                match last.insert(row.subject.as_str(), i) {
                    Some(previous) => next[previous] = Some(i),
                    None => ready.push_back(i),
                }
            }
        }
        // The rest of a chain after `i` is not attempted: counted as skipped.
        let skip_after = |i: usize, skipped: &mut usize| {
            let mut at = next[i];
            while let Some(j) = at {
                *skipped += 1;
                at = next[j];
            }
        };
        let mut failures: Vec<(usize, Failure)> = Vec::new();
        // Row `i` failed: it counts as an attempt, the rest of its chain as skipped.
        let mut fail = |i: usize, failure: Failure, skipped: &mut usize| {
            failures.push((i, failure));
            skip_after(i, skipped);
        };

        // One timer for the whole batch, raced against every send and every wait for acks.
        let expiry = sleep_until(deadline);
        tokio::pin!(expiry);
        let mut expired = false;
        let mut in_flight = FuturesUnordered::new();
        let mut flying = vec![false; self.rows.len()];
        let mut acks: Vec<(usize, Result<PublishAck, PublishError>)> = Vec::new();
        loop {
            for (i, result) in acks.drain(..) {
                flying[i] = false;
                match result {
                    Ok(ack) => {
                        self.acked.push(i);
                        self.report.published += 1;
                        if ack.duplicate {
                            self.report.duplicates += 1;
                        }
                        let lag = (Utc::now() - self.rows[i].created_at)
                            .to_std()
                            .unwrap_or_default();
                        metrics::histogram!(names::PUBLISH_LAG).record(lag.as_secs_f64());
                        // the subject's next event goes out only now that this one is stored
                        ready.extend(next[i]);
                    }
                    Err(e) => {
                        fail(i, Failure::Refused(e.to_string()), &mut self.report.skipped);
                    }
                }
            }
            while let Some(i) = ready.pop_front() {
                let row = &self.rows[i];
                if row.attempts >= config.max_attempts || expired {
                    // at the cap (held), or out of time: this row and the rest are not attempted
                    self.report.skipped += 1;
                    skip_after(i, &mut self.report.skipped);
                    continue;
                }
                if client.connection_state() != State::Connected {
                    fail(
                        i,
                        Failure::Refused("not connected to NATS".into()),
                        &mut self.report.skipped,
                    );
                    continue;
                }
                let envelope = EnvelopeRef::new(
                    row.id,
                    &row.event_type,
                    &row.source,
                    &row.subject,
                    row.time,
                    &row.data.0,
                );
                let body = match envelope.to_vec() {
                    Ok(b) => b,
                    Err(e) => {
                        fail(i, Failure::Refused(e.to_string()), &mut self.report.skipped);
                        continue;
                    }
                };
                // Owned values move into the map; the names are constants.
                let mut headers = HeaderMap::new();
                headers.insert(async_nats::header::NATS_MESSAGE_ID, hyphenated(row.id));
                headers.insert(CONTENT_TYPE_HEADER, CONTENT_TYPE);
                headers.insert(
                    TRACEPARENT_HEADER,
                    traceparent(trace_id, span_base.wrapping_add(i as u64 + 1)),
                );
                let send =
                    jetstream.publish_with_headers(row.event_type.clone(), headers, body.into());
                tokio::pin!(send);
                // A send may wait for an ack slot of the context (`max_ack_inflight`), which
                // only the acks in flight free: keep collecting them meanwhile.
                let sent = loop {
                    tokio::select! {
                        biased;
                        sent = &mut send => break Some(sent),
                        Some(done) = in_flight.next(), if !in_flight.is_empty() => acks.push(done),
                        () = &mut expiry => break None,
                    }
                };
                match sent {
                    Some(Ok(ack)) => {
                        flying[i] = true;
                        in_flight.push(ack.into_future().map(move |r| (i, r)));
                    }
                    Some(Err(e)) => {
                        fail(i, Failure::Refused(e.to_string()), &mut self.report.skipped);
                    }
                    None => {
                        expired = true;
                        fail(i, Failure::Deadline, &mut self.report.skipped);
                    }
                }
            }
            if !acks.is_empty() {
                continue; // acks collected while sending may make more rows ready
            }
            if in_flight.is_empty() {
                break;
            }
            if !expired {
                tokio::select! {
                    biased;
                    Some(done) = in_flight.next() => {
                        acks.push(done);
                        continue;
                    }
                    () = &mut expiry => {}
                }
            }
            // the deadline passed: every row still awaiting its ack failed
            for (i, _) in flying.iter().enumerate().filter(|(_, f)| **f) {
                fail(i, Failure::Deadline, &mut self.report.skipped);
            }
            break;
        }

        // Update the in-memory backoff of the subjects touched by this batch.
        let now = Instant::now();
        let mut backoffs = self.relay.backoffs();
        if !backoffs.is_empty() {
            for &i in &self.acked {
                backoffs.remove(&self.rows[i].subject);
            }
        }
        for (i, failure) in &failures {
            let row = &self.rows[*i];
            self.failed.push(*i);
            self.report.failed += 1;
            let entry = backoffs.entry(row.subject.clone()).or_insert(Backoff {
                failures: 0,
                next_try: now,
            });
            entry.failures += 1;
            entry.next_try = now + config.backoff(entry.failures);
            if row.attempts + 1 >= config.max_attempts {
                self.report.capped += 1;
                tracing::error!(
                    id = %row.id,
                    event_type = %row.event_type,
                    subject = %row.subject,
                    attempts = row.attempts + 1,
                    error = %failure,
                    "outbox event reached the attempt cap: it is left unpublished and its subject is held until its attempts are reset",
                );
            } else {
                tracing::debug!(id = %row.id, event_type = %row.event_type, error = %failure, "outbox publish failed");
            }
        }
        if !failures.is_empty() {
            let (_, first) = &failures[0];
            tracing::warn!(
                failed = failures.len(),
                published = self.report.published,
                first_error = %first,
                "outbox relay: publishes failed; their subjects back off"
            );
        }
    }

    /// Marks the acknowledged rows published and the failed rows' `attempts + 1`, in one
    /// statement each, and commits. Publishes first if [`publish`](Self::publish) was not
    /// called.
    ///
    /// The commit is asynchronous (`synchronous_commit = off` for this transaction only): it
    /// returns before its WAL record is flushed. A Postgres crash can therefore forget the marks
    /// of the last fraction of a second; those rows are unpublished again and are republished
    /// under the same ids: JetStream drops them as duplicates when Postgres is back within the
    /// stream's duplicate window, and the consumers' dedupe absorbs them otherwise. Nothing can
    /// be lost this way, since the events themselves were committed synchronously by the
    /// emitting transaction, and order holds because the WAL keeps the marks in commit order.
    pub async fn commit(mut self) -> Result<BatchReport> {
        self.publish().await;
        for (sql, rows) in [(MARK_PUBLISHED, &self.acked), (MARK_FAILED, &self.failed)] {
            if rows.is_empty() {
                continue;
            }
            let ctids: Vec<Tid> = rows.iter().map(|&i| self.rows[i].ctid).collect();
            let marked = sqlx::query(sql)
                .bind(&ctids)
                .execute(&mut *self.tx)
                .await
                .map_err(db_error)?
                .rows_affected();
            if marked != ctids.len() as u64 {
                // cannot happen while the rows are locked; if it does, roll back: the rows
                // stay unpublished and are republished under the same ids
                return Err(Error::Database(sqlx::Error::Protocol(format!(
                    "outbox mark updated {marked} of {} claimed rows; the batch is rolled back",
                    ctids.len()
                ))));
            }
        }
        let Claim {
            relay,
            tx,
            rows,
            acked,
            failed,
            report,
            ..
        } = self;
        tx.commit().await.map_err(db_error)?;
        relay.counters.add(&report);
        metrics::histogram!(names::BATCH_SIZE).record(report.claimed as f64);
        record_metrics(relay.config.max_attempts, &rows, &acked, &failed, &report);
        Ok(report)
    }

    /// Rolls the claim back without publishing: its rows and subjects are free for the next
    /// claim, of this relay or another.
    async fn release(self) -> Result<BatchReport> {
        let report = self.report;
        self.tx.rollback().await.map_err(db_error)?;
        Ok(report)
    }
}

/// The per-type counters of a committed batch, one increment per type and counter.
fn record_metrics(
    max_attempts: i32,
    rows: &[Row],
    acked: &[usize],
    failed: &[usize],
    report: &BatchReport,
) {
    #[derive(Default)]
    struct PerType {
        published: u64,
        failed: u64,
        capped: u64,
    }
    let mut per_type: HashMap<&str, PerType> = HashMap::new();
    for &i in acked {
        per_type.entry(&rows[i].event_type).or_default().published += 1;
    }
    for &i in failed {
        let row = &rows[i];
        let t = per_type.entry(&row.event_type).or_default();
        t.failed += 1;
        if row.attempts + 1 >= max_attempts {
            t.capped += 1;
        }
    }
    for (event_type, t) in per_type {
        if t.published > 0 {
            metrics::counter!(names::PUBLISHED, "event_type" => event_type.to_owned())
                .increment(t.published);
        }
        if t.failed > 0 {
            metrics::counter!(names::PUBLISH_FAILURES, "event_type" => event_type.to_owned())
                .increment(t.failed);
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

const CONTENT_TYPE_HEADER: HeaderName = HeaderName::from_static("Content-Type");
const TRACEPARENT_HEADER: HeaderName = HeaderName::from_static("traceparent");

/// The id as the `Nats-Msg-Id` header's value: the hyphenated form, without going through
/// `Display`.
fn hyphenated(id: Uuid) -> String {
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    id.hyphenated().encode_lower(&mut buf).to_owned()
}

/// A W3C `traceparent` (version 00, sampled) in trace `trace_id` with span id `span_id`
/// (the batch's random base plus the row's position: unique in the trace, never zero).
fn traceparent(trace_id: &str, span_id: u64) -> String {
    format!("00-{trace_id}-{:016x}-01", span_id.max(1))
}
