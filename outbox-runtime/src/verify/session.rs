//! The Postgres side of a verification: a connection of its own holding the cursor over the
//! range's rows and two temporary tables, the suspects and the missing ids.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{Connection, PgConnection, PgPool};
use uuid::Uuid;

use super::MissingRow;
use crate::error::{Error, Result};
use crate::table::OUTBOX_EVENTS;

/// The cursor over the range's published rows, oldest mark first.
const DECLARE: &str = "declare outbox_verify_rows scroll cursor with hold for \
    select id, event_type, published_at from outbox_events \
     where published_at >= $1 and published_at < $2 \
     order by published_at, id";
/// The rows not found near their publish time, and the missing ones.
const TEMP_TABLES: &[&str] = &[
    "create temp table outbox_verify_suspects \
       (id uuid primary key, published_at timestamptz not null)",
    "create index on outbox_verify_suspects (published_at, id)",
    "create temp table outbox_verify_missing (id uuid primary key)",
];

/// What [`Session::republish`] did.
pub(super) struct Republished {
    pub(super) republished: u64,
    pub(super) deferred: u64,
    pub(super) deferred_until: Option<DateTime<Utc>>,
}

/// A connection of the verification's own (detached from the pool, so that its cursor and
/// temporary tables end with it, whatever happens).
pub(super) struct Session {
    conn: PgConnection,
    rows_total: u64,
}

fn db(e: sqlx::Error) -> Error {
    OUTBOX_EVENTS.error(e)
}

impl Session {
    /// Declares the cursor over the published rows of `[from, to)` (materialized at commit,
    /// so no snapshot stays open) and creates the temporary tables.
    pub(super) async fn open(
        pool: &PgPool,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Self> {
        let mut conn = pool.acquire().await.map_err(db)?.detach();
        let mut tx = conn.begin().await.map_err(db)?;
        sqlx::query(DECLARE)
            .bind(from)
            .bind(to)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        let rows_total = sqlx::query("move forward all in outbox_verify_rows")
            .execute(&mut conn)
            .await
            .map_err(db)?
            .rows_affected();
        sqlx::query("move absolute 0 in outbox_verify_rows")
            .execute(&mut conn)
            .await
            .map_err(db)?;
        for statement in TEMP_TABLES {
            sqlx::query(*statement)
                .execute(&mut conn)
                .await
                .map_err(db)?;
        }
        Ok(Self { conn, rows_total })
    }

    /// Published rows in the range (of every event type).
    pub(super) fn rows_total(&self) -> u64 {
        self.rows_total
    }

    /// The oldest `published_at` of the table.
    pub(super) async fn table_first(&mut self) -> Result<Option<DateTime<Utc>>> {
        sqlx::query_scalar("select min(published_at) from outbox_events")
            .fetch_one(&mut self.conn)
            .await
            .map_err(db)
    }

    /// The next `n` rows of the range: id, event type, `published_at`.
    pub(super) async fn next_rows(
        &mut self,
        n: usize,
    ) -> Result<Vec<(Uuid, String, DateTime<Utc>)>> {
        // `n` is a number: nothing from input is spliced into the text
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "fetch forward {n} from outbox_verify_rows"
        )))
        .persistent(false)
        .fetch_all(&mut self.conn)
        .await
        .map_err(db)
    }

    /// Records rows not found near their publish time.
    pub(super) async fn add_suspects(&mut self, rows: &HashMap<Uuid, DateTime<Utc>>) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let (ids, times): (Vec<Uuid>, Vec<DateTime<Utc>>) = rows.iter().unzip();
        sqlx::query(
            "insert into outbox_verify_suspects (id, published_at) \
             select * from unnest($1::uuid[], $2::timestamptz[]) on conflict do nothing",
        )
        .bind(ids)
        .bind(times)
        .execute(&mut self.conn)
        .await
        .map_err(db)?;
        Ok(())
    }

    /// How many suspects there are.
    pub(super) async fn suspects_total(&mut self) -> Result<u64> {
        let n: i64 = sqlx::query_scalar("select count(*) from outbox_verify_suspects")
            .fetch_one(&mut self.conn)
            .await
            .map_err(db)?;
        Ok(n.max(0) as u64)
    }

    /// The next `n` suspects after `after` (by `(published_at, id)`).
    pub(super) async fn next_suspects(
        &mut self,
        after: Option<(DateTime<Utc>, Uuid)>,
        n: usize,
    ) -> Result<Vec<(Uuid, DateTime<Utc>)>> {
        let (time, id) = after.unzip();
        sqlx::query_as(
            "select id, published_at from outbox_verify_suspects \
              where $1::timestamptz is null or (published_at, id) > ($1, $2::uuid) \
              order by published_at, id limit $3",
        )
        .bind(time)
        .bind(id)
        .bind(i64::try_from(n).unwrap_or(i64::MAX))
        .fetch_all(&mut self.conn)
        .await
        .map_err(db)
    }

    /// Records `rows` as missing and returns them as the table has them now, by
    /// `published_at` (a row deleted or set unpublished meanwhile is left out).
    pub(super) async fn add_missing(
        &mut self,
        rows: &HashMap<Uuid, DateTime<Utc>>,
    ) -> Result<Vec<MissingRow>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = rows.keys().copied().collect();
        sqlx::query_as(
            "with added as ( \
               insert into outbox_verify_missing (id) select pg_catalog.unnest($1::uuid[]) \
               on conflict do nothing returning id) \
             select e.id, e.event_type, e.subject, e.created_at, e.published_at \
               from outbox_events e join added a on a.id = e.id \
              where e.published_at is not null \
              order by e.published_at, e.id",
        )
        .bind(ids)
        .fetch_all(&mut self.conn)
        .await
        .map_err(db)
    }

    /// Sets the missing rows unpublished (and their attempts to 0), in one transaction,
    /// except those published less than `window` ago (the stream's duplicate window and the
    /// clock skew), and wakes the relays, sending their lanes back to the start.
    pub(super) async fn republish(&mut self, window: Duration) -> Result<Republished> {
        let window = sqlx::postgres::types::PgInterval {
            months: 0,
            days: 0,
            microseconds: i64::try_from(window.as_micros()).unwrap_or(i64::MAX),
        };
        let mut tx = self.conn.begin().await.map_err(db)?;
        let (deferred, deferred_until): (i64, Option<DateTime<Utc>>) = sqlx::query_as(
            "select count(*), max(e.published_at) + $1 \
               from outbox_events e join outbox_verify_missing m on m.id = e.id \
              where e.published_at is not null and e.published_at >= now() - $1",
        )
        .bind(window)
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
        let republished = sqlx::query(
            "update outbox_events e set published_at = null, attempts = 0 \
               from outbox_verify_missing m \
              where m.id = e.id and e.published_at is not null and e.published_at < now() - $1",
        )
        .bind(window)
        .execute(&mut *tx)
        .await
        .map_err(db)?
        .rows_affected();
        if republished > 0 {
            // the rows lie before the relay's cursors: its sweep finds them within seconds
            // (docs/relay.md, *The cursor*); the notification wakes an idle relay for it
            sqlx::query("select pg_notify($1, '')")
                .bind(crate::NOTIFY_CHANNEL)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        tx.commit().await.map_err(db)?;
        tracing::info!(
            republished,
            deferred,
            "verify: missing rows set unpublished again"
        );
        Ok(Republished {
            republished,
            deferred: deferred.max(0) as u64,
            deferred_until,
        })
    }

    /// Closes the connection (the cursor and temporary tables go with it).
    pub(super) async fn close(self) {
        let _ = self.conn.close().await;
    }
}
