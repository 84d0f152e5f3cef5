//! What operators alert on: the backlog, the oldest unpublished event, attempts, rows at the
//! attempt cap; and `unblock`, which lets capped rows publish again.

use std::time::Duration;

use serde::Serialize;
use sqlx::{PgPool, Row};
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::metrics as m;
use crate::table::OUTBOX_EVENTS;

/// A snapshot of the outbox table's unpublished rows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    /// Rows not yet acknowledged by the broker.
    pub unpublished: i64,
    /// Age of the oldest unpublished row (by `created_at`), if any.
    #[serde(with = "secs")]
    pub oldest_unpublished_age: Option<Duration>,
    /// Unpublished rows at or past the attempt cap: the relay leaves them alone until
    /// [`unblock`]ed, and holds the later events of their subjects behind them.
    pub at_cap: i64,
    /// The attempt cap these figures were computed against.
    pub max_attempts: i32,
    /// Unpublished rows per attempt count, ascending: `(attempts, rows)`.
    pub attempts: Vec<(i32, i64)>,
    /// The same figures per event type, sorted by type.
    pub by_type: Vec<TypeStatus>,
}

/// [`Status`] figures for one event type.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TypeStatus {
    /// The event type.
    pub event_type: String,
    /// Unpublished rows of this type.
    pub unpublished: i64,
    /// Age of its oldest unpublished row.
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
/// backlog, not with the table.
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
    let rows = sqlx::query(
        "select event_type, attempts, count(*) as n, \
                extract(epoch from now() - min(created_at))::float8 as age \
           from outbox_events where published_at is null \
          group by event_type, attempts order by event_type, attempts",
    )
    .fetch_all(pool)
    .await
    .map_err(db)?;
    let mut status = Status {
        unpublished: 0,
        oldest_unpublished_age: None,
        at_cap: 0,
        max_attempts,
        attempts: Vec::new(),
        by_type: Vec::new(),
    };
    for row in rows {
        let event_type: String = row.try_get("event_type")?;
        let attempts: i32 = row.try_get("attempts")?;
        let n: i64 = row.try_get("n")?;
        let row_age = age(row.try_get("age")?);
        let capped = if attempts >= max_attempts { n } else { 0 };
        status.unpublished += n;
        status.at_cap += capped;
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
    Ok(status)
}

/// Publishes the gauges an alert needs: `outbox_oldest_unpublished_age_seconds`,
/// `outbox_unpublished` and `outbox_rows_at_attempt_cap`, then
/// `outbox_gauges_refreshed_at_seconds` (the Unix time of this refresh: when a refresh fails,
/// the others keep their last values and this one falls behind the clock).
/// [`Relay::run`](crate::Relay::run) calls it every 10 s while it runs; call it yourself where
/// no relay runs in the process that exports metrics.
pub async fn record_gauges(pool: &PgPool, max_attempts: i32) -> Result<Status> {
    let s = status(pool, max_attempts).await?;
    metrics::gauge!(m::OLDEST_UNPUBLISHED_AGE)
        .set(s.oldest_unpublished_age.map_or(0.0, |d| d.as_secs_f64()));
    metrics::gauge!(m::UNPUBLISHED).set(s.unpublished as f64);
    metrics::gauge!(m::ROWS_AT_CAP).set(s.at_cap as f64);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    metrics::gauge!(m::GAUGES_REFRESHED_AT).set(now.as_secs_f64());
    Ok(s)
}

/// Which capped rows [`unblock`] resets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unblock {
    /// These event ids.
    Ids(Vec<Uuid>),
    /// Every capped row of this event type.
    EventType(String),
    /// Every capped row of this subject.
    Subject(String),
    /// Every capped row.
    All,
}

/// Resets `attempts` to 0 on the unpublished rows at or past `max_attempts` that `which`
/// selects, so the relay publishes them again, with their original id. Returns their ids.
///
/// Only capped, unpublished rows are touched; fix the cause first (a stream for the subject, a
/// larger `max_payload`), or the rows will climb back to the cap. The relay is woken at once.
pub async fn unblock(pool: &PgPool, which: &Unblock, max_attempts: i32) -> Result<Vec<Uuid>> {
    let (filter, ids, text) = match which {
        Unblock::Ids(ids) => ("id = any($2)", ids.clone(), String::new()),
        Unblock::EventType(t) => ("event_type = $3", Vec::new(), t.clone()),
        Unblock::Subject(s) => ("subject = $3", Vec::new(), s.clone()),
        Unblock::All => ("true", Vec::new(), String::new()),
    };
    let sql = format!(
        "with reset as ( \
           update outbox_events set attempts = 0 \
            where published_at is null and attempts >= $1 \
              and ($2::uuid[] is not null and $3::text is not null) and {filter} \
           returning id), \
         wake as (select pg_notify('{}', '') from reset limit 1) \
         select id from reset, (select count(*) from wake) w",
        crate::NOTIFY_CHANNEL
    );
    let ids: Vec<Uuid> = sqlx::query_scalar(&sql)
        .bind(max_attempts)
        .bind(ids)
        .bind(text)
        .fetch_all(pool)
        .await
        .map_err(db)?;
    for id in &ids {
        tracing::info!(event_id = %id, "unblocked: attempts reset, the relay will publish it again");
    }
    Ok(ids)
}

/// [`record_gauges`] at start and every `interval`, for as long as the relay that runs it: the
/// gauges operators alert on exist wherever a relay runs, in a service or in `outbox relay`.
pub(crate) async fn refresh_gauges(pool: PgPool, max_attempts: i32, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = record_gauges(&pool, max_attempts).await {
            tracing::debug!(error = %e, "outbox backlog gauges not refreshed");
        }
    }
}
