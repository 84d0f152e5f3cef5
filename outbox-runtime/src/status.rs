//! What operators alert on: the backlog, the oldest unpublished event, attempts, the held rows
//! and why each is held, the subjects backing off and why; and `unblock`, which releases held
//! rows so that they publish again.

use std::time::Duration;

use serde::Serialize;
use sqlx::{PgPool, Row};
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::metrics as m;
use crate::table::{OUTBOX_EVENTS, OUTBOX_RETRIES};

/// A snapshot of the outbox table's unpublished rows.
///
/// The held subjects' rows (each held row and the rows of its subject waiting behind it) are
/// counted in [`Status::unpublished`] and [`Status::held_unpublished`], and left out of
/// [`Status::oldest_unpublished_age`]: that one is the age of what the relay should be
/// publishing, which an operator's release does not wait on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    /// Rows not yet acknowledged by the broker, the held subjects' included.
    pub unpublished: i64,
    /// Age of the oldest unpublished row (by `created_at`) that the relay should be publishing:
    /// rows of subjects backing off after a failed publish count (the relay retries them, and
    /// their delay is real), rows of held subjects do not (they wait for an operator, and
    /// [`Status::oldest_held_age`] has them). `None` when there is no such row.
    #[serde(with = "secs")]
    pub oldest_unpublished_age: Option<Duration>,
    /// Unpublished rows of held subjects: each held row and the later rows of its subject,
    /// which wait behind it until an operator releases it.
    pub held_unpublished: i64,
    /// Age of the oldest of them.
    #[serde(with = "secs")]
    pub oldest_held_age: Option<Duration>,
    /// Unpublished rows at or past the attempt cap: the relay leaves them alone until
    /// [`unblock`]ed, and holds the later events of their subjects behind them.
    pub at_cap: i64,
    /// The attempt cap these figures were computed against.
    pub max_attempts: i32,
    /// Unpublished rows per attempt count, ascending: `(attempts, rows)`.
    pub attempts: Vec<(i32, i64)>,
    /// The same figures per event type, sorted by type.
    pub by_type: Vec<TypeStatus>,
    /// Subjects backing off after a failed publish (their next attempt is scheduled).
    pub backing_off: i64,
    /// The subjects backing off, longest first (at most [`BACKING_OFF_SHOWN`];
    /// [`Status::backing_off`] counts them all), each with the reason of its last failure.
    pub backing_off_subjects: Vec<BackingOff>,
    /// Every reason the subjects back off for, with how many subjects each: every subject
    /// backing off is counted under its reason (the most frequent first, at most
    /// [`BACKING_OFF_SHOWN`] reasons).
    pub backing_off_reasons: Vec<ReasonCount>,
    /// The held rows, oldest first (at most [`HELD_SHOWN`]; [`Status::held_total`] counts
    /// them all): each holds its subject until an operator releases it.
    pub held: Vec<Held>,
    /// All held rows.
    pub held_total: i64,
}

/// How many held rows [`status`] lists.
pub const HELD_SHOWN: i64 = 100;

/// How many subjects backing off, and how many of their reasons, [`status`] lists.
pub const BACKING_OFF_SHOWN: i64 = 100;

/// A subject backing off after a failed publish, with the reason.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackingOff {
    /// The event whose attempt failed (the schedule's; the relay tries the subject's oldest
    /// unpublished event next, which is this one unless an older one was written since).
    pub id: Uuid,
    /// Its event type.
    pub event_type: String,
    /// The subject.
    pub subject: String,
    /// Attempts so far.
    pub attempts: i32,
    /// Why its last publish failed: the broker's answer, or the relay's own reason.
    pub reason: String,
    /// How long until the relay tries it again (zero: due now).
    #[serde(with = "secs")]
    pub retry_in: Option<Duration>,
}

/// A reason subjects back off for, and how many do.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReasonCount {
    /// The reason, as [`BackingOff::reason`] says it.
    pub reason: String,
    /// The subjects backing off for it.
    pub subjects: i64,
}

/// A held row, with the reason.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct Held {
    /// The event id.
    pub id: Uuid,
    /// Its event type, as the row has it.
    pub event_type: String,
    /// The held subject.
    pub subject: String,
    /// Attempts so far.
    pub attempts: i32,
    /// Why it is held.
    pub reason: String,
    /// The cause, as a label (`no_stream`, `unsafe_stream`, `attempt_cap`, ...: the `cause` of
    /// `outbox_events_held_total`); `None` for a hold written before the relay recorded it.
    /// The relay releases a `no_stream` or `unsafe_stream` hold by itself once a safe stream
    /// captures the type; the others wait for [`unblock`].
    pub cause: Option<String>,
}

/// [`Status`] figures for one event type.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TypeStatus {
    /// The event type.
    pub event_type: String,
    /// Unpublished rows of this type, the held subjects' included.
    pub unpublished: i64,
    /// Age of its oldest unpublished row that the relay should be publishing (rows of held
    /// subjects left out, as in [`Status::oldest_unpublished_age`]).
    #[serde(with = "secs")]
    pub oldest_unpublished_age: Option<Duration>,
    /// Its rows at the attempt cap.
    pub at_cap: i64,
}

mod secs {
    use serde::Serializer;
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }
}

fn age(secs: Option<f64>) -> Option<Duration> {
    secs.map(|s| Duration::from_secs_f64(s.max(0.0)))
}

fn db(e: sqlx::Error) -> Error {
    OUTBOX_EVENTS.error(e)
}

/// Reads the [`Status`] of the outbox table, counting rows with `attempts >= max_attempts` as
/// capped (pass the relay's `max_attempts`).
///
/// It scans the unpublished rows through the partial index, so its cost grows with the
/// backlog, not with the table (the held subjects are looked up in the relay's small retry
/// schedule, `outbox_retries`).
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> outbox_runtime::Result<()> {
/// let status = outbox_runtime::status::status(&pool, 20).await?;
/// if status.at_cap > 0 {
///     eprintln!("{} events need an operator", status.at_cap);
/// }
/// # Ok(()) }
/// ```
pub async fn status(pool: &PgPool, max_attempts: i32) -> Result<Status> {
    // a subject is held while its retry schedule has no retry time (docs/relay.md)
    let rows = sqlx::query(
        "select e.event_type, e.attempts, h.subject is not null as held, count(*) as n, \
                extract(epoch from now() - min(e.created_at))::float8 as age \
           from outbox_events e \
           left join (select subject from outbox_retries where retry_at is null) h \
             on h.subject = e.subject \
          where e.published_at is null \
          group by 1, 2, 3 order by 1, 2, 3",
    )
    .fetch_all(pool)
    .await
    .map_err(db)?;
    let mut status = Status {
        unpublished: 0,
        oldest_unpublished_age: None,
        held_unpublished: 0,
        oldest_held_age: None,
        at_cap: 0,
        max_attempts,
        attempts: Vec::new(),
        by_type: Vec::new(),
        backing_off: 0,
        backing_off_subjects: Vec::new(),
        backing_off_reasons: Vec::new(),
        held: Vec::new(),
        held_total: 0,
    };
    for row in rows {
        let event_type: String = row.try_get("event_type")?;
        let attempts: i32 = row.try_get("attempts")?;
        let held: bool = row.try_get("held")?;
        let n: i64 = row.try_get("n")?;
        let held_age = age(row.try_get("age")?);
        let capped = if attempts >= max_attempts { n } else { 0 };
        status.unpublished += n;
        status.at_cap += capped;
        // the age the relay answers for; a held subject's rows have their own
        let row_age = if held {
            status.held_unpublished += n;
            status.oldest_held_age = status.oldest_held_age.max(held_age);
            None
        } else {
            held_age
        };
        status.oldest_unpublished_age = status.oldest_unpublished_age.max(row_age);
        match status.attempts.iter_mut().find(|(a, _)| *a == attempts) {
            Some((_, count)) => *count += n,
            None => status.attempts.push((attempts, n)),
        }
        match status.by_type.last_mut() {
            Some(t) if t.event_type == event_type => {
                t.unpublished += n;
                t.at_cap += capped;
                t.oldest_unpublished_age = t.oldest_unpublished_age.max(row_age);
            }
            _ => status.by_type.push(TypeStatus {
                event_type,
                unpublished: n,
                oldest_unpublished_age: row_age,
                at_cap: capped,
            }),
        }
    }
    status.attempts.sort_unstable();
    let (held_total, backing_off): (i64, i64) = sqlx::query_as(
        "select count(*) filter (where retry_at is null), count(*) filter (where retry_at is not null) \
           from outbox_retries",
    )
    .fetch_one(pool)
    .await
    .map_err(|e| OUTBOX_RETRIES.error(e))?;
    status.held_total = held_total;
    status.backing_off = backing_off;
    if backing_off > 0 {
        backing_off_of(pool, &mut status).await?;
    }
    if held_total > 0 {
        status.held = sqlx::query_as(
            "select e.id, e.event_type, e.subject, e.attempts, r.reason, r.cause \
               from outbox_retries r join outbox_events e on e.id = r.event_id \
              where r.retry_at is null and e.published_at is null \
              order by r.since, e.id limit $1",
        )
        .bind(HELD_SHOWN)
        .fetch_all(pool)
        .await
        .map_err(|e| OUTBOX_RETRIES.error(e))?;
    }
    Ok(status)
}

/// Fills [`Status::backing_off_subjects`] and [`Status::backing_off_reasons`].
async fn backing_off_of(pool: &PgPool, status: &mut Status) -> Result<()> {
    let rows: Vec<(Uuid, String, String, i32, String, Option<f64>)> = sqlx::query_as(
        "select e.id, e.event_type, e.subject, e.attempts, r.reason, \
                extract(epoch from r.retry_at - now())::float8 \
           from outbox_retries r join outbox_events e on e.id = r.event_id \
          where r.retry_at is not null and e.published_at is null \
          order by r.since, e.id limit $1",
    )
    .bind(BACKING_OFF_SHOWN)
    .fetch_all(pool)
    .await
    .map_err(|e| OUTBOX_RETRIES.error(e))?;
    status.backing_off_subjects = rows
        .into_iter()
        .map(
            |(id, event_type, subject, attempts, reason, retry_in)| BackingOff {
                id,
                event_type,
                subject,
                attempts,
                reason,
                retry_in: age(retry_in),
            },
        )
        .collect();
    let reasons: Vec<(String, i64)> = sqlx::query_as(
        "select reason, count(*) from outbox_retries where retry_at is not null \
          group by reason order by count(*) desc, reason limit $1",
    )
    .bind(BACKING_OFF_SHOWN)
    .fetch_all(pool)
    .await
    .map_err(|e| OUTBOX_RETRIES.error(e))?;
    status.backing_off_reasons = reasons
        .into_iter()
        .map(|(reason, subjects)| ReasonCount { reason, subjects })
        .collect();
    Ok(())
}

/// Publishes the gauges an alert needs: `outbox_oldest_unpublished_age_seconds` (held subjects'
/// rows left out), `outbox_unpublished`, `outbox_unpublished_held`, `outbox_rows_held` and
/// `outbox_rows_at_attempt_cap`, then `outbox_gauges_refreshed_at_seconds` (the Unix time of
/// this refresh: when a refresh fails, the others keep their last values and this one falls
/// behind the clock).
/// [`Relay::run`](crate::Relay::run) calls it every 10 s while it runs; call it yourself where
/// no relay runs in the process that exports metrics.
pub async fn record_gauges(pool: &PgPool, max_attempts: i32) -> Result<Status> {
    let s = status(pool, max_attempts).await?;
    metrics::gauge!(m::OLDEST_UNPUBLISHED_AGE)
        .set(s.oldest_unpublished_age.map_or(0.0, |d| d.as_secs_f64()));
    metrics::gauge!(m::UNPUBLISHED).set(s.unpublished as f64);
    metrics::gauge!(m::UNPUBLISHED_HELD).set(s.held_unpublished as f64);
    metrics::gauge!(m::ROWS_AT_CAP).set(s.at_cap as f64);
    metrics::gauge!(m::ROWS_HELD).set(s.held_total as f64);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    metrics::gauge!(m::GAUGES_REFRESHED_AT).set(now.as_secs_f64());
    Ok(s)
}

/// Which held rows [`unblock`] releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unblock {
    /// These event ids.
    Ids(Vec<Uuid>),
    /// Every held row of this event type.
    EventType(String),
    /// Every held row of this subject.
    Subject(String),
    /// Every held row.
    All,
}

/// Releases the held rows that `which` selects: rows the relay holds (at the attempt cap, or
/// refused for good: no stream for their type, an unsafe stream, a type stored under another
/// subject, over `max_payload`, a row it cannot read) and
/// rows at or past `max_attempts`. Their `attempts` go back to 0 and their subject's retry
/// comes due now, so the relay publishes them again, with their original id, then the events
/// held behind them, in order (the relay itself releases the subject once the held row is
/// published, so no later event of the subject can overtake it). Returns their ids. The relay
/// is woken at once.
///
/// Fix the cause first (a stream for the type, a larger `max_payload`, the row itself), or
/// the rows will be held again.
pub async fn unblock(pool: &PgPool, which: &Unblock, max_attempts: i32) -> Result<Vec<Uuid>> {
    let (filter, ids, text) = match which {
        Unblock::Ids(ids) => ("e.id = any($2)", ids.clone(), String::new()),
        Unblock::EventType(t) => ("e.event_type = $3", Vec::new(), t.clone()),
        Unblock::Subject(s) => ("e.subject = $3", Vec::new(), s.clone()),
        Unblock::All => ("true", Vec::new(), String::new()),
    };
    let sql = format!(
        "with target as ( \
           select e.id from outbox_events e \
            where e.published_at is null \
              and ($2::uuid[] is not null and $3::text is not null) and {filter} \
              and (e.attempts >= $1 \
                   or exists (select 1 from outbox_retries r where r.event_id = e.id and r.retry_at is null))), \
         reset as (update outbox_events e set attempts = 0 from target t where e.id = t.id \
                    returning e.id, e.subject, e.created_at), \
         heads as (select distinct on (subject) subject, id from reset order by subject, created_at, id), \
         due as (insert into outbox_retries as r (subject, event_id, retry_at, reason) \
                  select subject, id, now(), 'released by an operator: it goes now' from heads \
                  on conflict (subject) do update set retry_at = now(), reason = excluded.reason, cause = null \
                  returning 1), \
         wake as (select pg_notify('{}', '') from (select 1 from target limit 1) x) \
         select id from reset, (select count(*) from wake) w, (select count(*) from due) d",
        crate::NOTIFY_CHANNEL,
    );
    // `filter` is one of the fixed clauses above; the values go in as bind parameters
    let ids: Vec<Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(max_attempts)
        .bind(ids)
        .bind(text)
        .fetch_all(pool)
        .await
        .map_err(|e| OUTBOX_RETRIES.error(e))?;
    for id in &ids {
        tracing::info!(event_id = %id, "released: the relay will publish it again");
    }
    Ok(ids)
}
