//! Applying the outbox migrations without holding writes to `outbox_events` (see
//! [`migrate`](crate::migrate())): one lock for the whole run, taken by polling; statements that
//! give up on a lock after [`LOCK_WAIT`]; and the indexes that a large table needs built
//! `concurrently` (0009, 0010, 0012) settled here instead of by their migrations' statements.
//!
//! Why not build those indexes concurrently here: a concurrent build waits for every
//! transaction older than its phases, so it deadlocks with anything that waits for the
//! migrating session (a second process waiting for the migration lock with a blocking call,
//! a second concurrent build on the table), and one started at a service's start is cancelled
//! whenever the start is (a health check restarting it mid-build leaves an invalid index behind
//! each time). An operator runs the statement once, on a session that lives as long as it needs.

use std::time::{Duration, Instant};

use sqlx::migrate::{Migrate, MigrateError, Migration, Migrator};
use sqlx::{Connection, PgConnection, PgPool};

use crate::error::{Error, Result};

/// The longest a statement of `migrate` waits for a lock. A statement that needs a lock which
/// conflicts with writes (an `alter table`, an index build) holds every write that comes after it
/// while it waits; past this it gives up, having changed nothing.
pub(crate) const LOCK_WAIT: Duration = Duration::from_secs(2);

/// The longest an index build on an empty `outbox_events` may take: it holds writes meanwhile (a
/// table with no live rows can still be large with dead ones).
const EMPTY_BUILD_LIMIT: Duration = Duration::from_secs(5);

/// How often a `migrate` waiting for another one's lock tries again, and how often it says so.
const LOCK_POLL: Duration = Duration::from_millis(100);
const LOCK_SAY_EVERY: Duration = Duration::from_secs(10);

/// An index of `outbox_events` that a large table needs built `concurrently`, with the
/// migration that creates it.
#[derive(Debug)]
struct ConcurrentIndex {
    version: i64,
    name: &'static str,
    /// What follows `create index ... <name>` in its migration.
    definition: &'static str,
}

/// The indexes whose migrations say to build them `concurrently` beforehand on a large table:
/// retention's (0009), the lanes' (0010) and the subjects' (0012). Their migrations' statements
/// hold writes while they read the table, so `migrate` never runs them on a table with rows.
const BUILT_CONCURRENTLY: [ConcurrentIndex; 3] = [
    ConcurrentIndex {
        version: 9,
        name: "outbox_events_published_idx",
        definition: "on outbox_events (published_at) where published_at is not null",
    },
    ConcurrentIndex {
        version: 10,
        name: "outbox_events_unpublished_partition_idx",
        definition: "on outbox_events (created_at, id, ((hashtext(subject) & 2147483647) % 1024)) \
                     where published_at is null",
    },
    ConcurrentIndex {
        version: 12,
        name: "outbox_events_unpublished_subject_idx",
        definition:
            "on outbox_events ((hashtext(subject)), created_at, id) where published_at is null",
    },
];

/// The index of [`BUILT_CONCURRENTLY`] named `name` (one of the crate's own names): whether it
/// is valid (`None` when it does not exist), and the statement that builds it without holding
/// writes.
pub(crate) async fn concurrent_index(
    conn: &mut PgConnection,
    name: &str,
) -> Result<(Option<bool>, String)> {
    let index = BUILT_CONCURRENTLY
        .iter()
        .find(|i| i.name == name)
        .expect("one of migrate's concurrent builds");
    let valid = index.found(conn).await?.map(|(_, valid)| valid);
    Ok((valid, index.create_concurrently()))
}

impl ConcurrentIndex {
    /// The statement that builds it in a transaction (its migration's).
    fn create(&self) -> String {
        format!(
            "create index if not exists {} {}",
            self.name, self.definition
        )
    }

    /// The statement that builds it without holding writes.
    fn create_concurrently(&self) -> String {
        format!(
            "create index concurrently if not exists {} {}",
            self.name, self.definition
        )
    }

    /// The index's name as the catalog has it (quoted and qualified by `regclass`), and
    /// whether it is valid; `None` when it does not exist.
    async fn found(&self, conn: &mut PgConnection) -> Result<Option<(String, bool)>> {
        Ok(sqlx::query_as(
            "select c.oid::regclass::text, i.indisvalid \
               from pg_index i join pg_class c on c.oid = i.indexrelid \
              where i.indrelid = to_regclass('outbox_events')::oid and c.relname = $1",
        )
        .bind(self.name)
        .fetch_optional(&mut *conn)
        .await?)
    }

    /// Checks the index after the migrations before its own ran: records its migration when the
    /// index exists (valid, or being built), builds it when the table is empty, and otherwise
    /// returns the statements that build it without holding writes.
    async fn settle(&self, conn: &mut PgConnection, migrator: &Migrator) -> Result<()> {
        let migration = migrator
            .iter()
            .find(|m| m.version == self.version)
            .ok_or_else(|| {
                Error::Config(format!(
                    "migration {} is not among the outbox's migrations",
                    self.version
                ))
            })?;
        let table = migrator.table_name.as_ref();
        match self.found(conn).await? {
            Some((_, true)) => record(conn, table, migration).await,
            Some((qualified, false)) => {
                let builders = builders(conn).await?;
                if !builders.is_empty() {
                    tracing::warn!(
                        index = self.name,
                        ?builders,
                        "{} is invalid and may be being built: the sessions {builders:?} hold \
                         outbox_events as a concurrent build does (or a vacuum), so migrate leaves \
                         it alone; it is valid once the build ends, and if the build fails the \
                         next migrate says how to build it",
                        self.name
                    );
                    return record(conn, table, migration).await;
                }
                // a build that ended between the two reads left it valid
                if matches!(self.found(conn).await?, Some((_, true))) {
                    return record(conn, table, migration).await;
                }
                // abandoned: its build failed, and no session builds it
                if self
                    .build_on_empty(conn, Some(&qualified), table, migration)
                    .await?
                {
                    tracing::warn!(
                        index = self.name,
                        "{} was invalid (a concurrent build of it failed); the table is empty, so \
                         it was dropped and built again",
                        self.name
                    );
                    return Ok(());
                }
                Err(Error::IndexNotBuilt {
                    index: self.name,
                    problem:
                        "is invalid: a concurrent build of it failed, and no session builds it",
                    statements: format!(
                        "`drop index concurrently if exists {qualified};` then `{};`",
                        self.create_concurrently()
                    ),
                })
            }
            None => {
                if self.build_on_empty(conn, None, table, migration).await? {
                    return Ok(());
                }
                Err(Error::IndexNotBuilt {
                    index: self.name,
                    problem: "is missing",
                    statements: format!("`{};`", self.create_concurrently()),
                })
            }
        }
    }

    /// Builds the index (dropping the abandoned `invalid` one first) and records its migration,
    /// in one transaction, if `outbox_events` has no rows; whether it did. The table is locked
    /// first (waiting at most [`LOCK_WAIT`]) so that no row comes in between the check and the
    /// build, and the build may take at most [`EMPTY_BUILD_LIMIT`].
    async fn build_on_empty(
        &self,
        conn: &mut PgConnection,
        invalid: Option<&str>,
        table: &str,
        migration: &Migration,
    ) -> Result<bool> {
        let mut tx = conn.begin().await?;
        sqlx::query("select set_config('statement_timeout', $1, true)")
            .bind(millis(EMPTY_BUILD_LIMIT))
            .execute(&mut *tx)
            .await?;
        // share mode holds writes, as the build does; dropping an index needs the table whole
        let mode = if invalid.is_some() {
            "access exclusive"
        } else {
            "share"
        };
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "lock table outbox_events in {mode} mode"
        )))
        .execute(&mut *tx)
        .await
        .map_err(|e| blocked(e, format!("locking outbox_events to build {}", self.name)))?;
        let rows: bool = sqlx::query_scalar("select exists (select 1 from outbox_events)")
            .fetch_one(&mut *tx)
            .await?;
        if rows {
            tx.rollback().await?;
            return Ok(false);
        }
        if let Some(index) = invalid {
            // the name is the catalog's own, quoted by `regclass`
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("drop index {index}")))
                .execute(&mut *tx)
                .await?;
        }
        sqlx::raw_sql(sqlx::AssertSqlSafe(self.create()))
            .execute(&mut *tx)
            .await
            .map_err(|e| blocked(e, format!("building {} on the empty table", self.name)))?;
        record(&mut tx, table, migration).await?;
        tx.commit().await?;
        Ok(true)
    }
}

/// Applies the outbox migrations through `pool` (see [`migrate`](crate::migrate())).
pub(crate) async fn run(pool: &PgPool) -> Result<()> {
    // A session of its own: the lock and the settings live and die with it.
    let mut conn = pool.acquire().await?.detach();
    let result = locked(&mut conn).await;
    // ending the session releases the lock
    let _ = conn.close().await;
    result
}

async fn locked(conn: &mut PgConnection) -> Result<()> {
    lock(conn).await?;
    foreign_tables(conn).await?;
    sqlx::query("select set_config('lock_timeout', $1, false)")
        .bind(millis(LOCK_WAIT))
        .execute(&mut *conn)
        .await?;
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.set_ignore_missing(true);
    // this session holds sqlx's lock already (`lock`)
    migrator.set_locking(false);
    for index in &BUILT_CONCURRENTLY {
        apply(&migrator, conn, Some(index.version - 1)).await?;
        index.settle(conn, &migrator).await?;
    }
    apply(&migrator, conn, None).await
}

/// Runs `migrator`'s pending migrations up to `to` (all of them with `None`).
async fn apply(migrator: &Migrator, conn: &mut PgConnection, to: Option<i64>) -> Result<()> {
    // `run_direct` is `run_to`/`run` on a connection, without their `Acquire` bound (which
    // no future holding it is `Send` for every lifetime of)
    let result = migrator.run_direct(to, conn, false).await;
    match result {
        Ok(()) => Ok(()),
        Err(MigrateError::VersionMismatch(version)) => Err(Error::MigrationConflict { version }),
        Err(MigrateError::ExecuteMigration(e, version)) if is_lock_timeout(&e) => {
            Err(Error::MigrationBlocked {
                what: format!("migration {version}"),
                waited: LOCK_WAIT,
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// The tables the migrations create, and sqlx's record of them.
const TABLES: [&str; 11] = [
    "_sqlx_migrations",
    "outbox_events",
    "outbox_relays",
    "outbox_consumed",
    "outbox_subject_positions",
    "outbox_retries",
    "outbox_consumer_attempts",
    "outbox_consumer_names",
    "outbox_subject_sequences",
    "outbox_dedupe_horizon",
    "outbox_relay_lease",
];

/// Refuses to migrate when a name of [`TABLES`] resolves (through the session's `search_path`)
/// to a relation owned by neither a superuser, nor the migrating role or a role it is a member
/// of (by grants: a superuser's rights over every role do not count): another role created it
/// (in a schema it may create in: `public` on Postgres 13 and 14 by default, or a schema named
/// after the migrating role), and the migrations (`create table if not exists`) would use it,
/// with its triggers, as the outbox's.
async fn foreign_tables(conn: &mut PgConnection) -> Result<()> {
    let foreign: Vec<(String, String)> = sqlx::query_as(
        "with recursive mine(role) as ( \
           select oid from pg_catalog.pg_roles where rolname = current_user \
           union select m.roleid from pg_catalog.pg_auth_members m join mine on m.member = mine.role) \
         select c.oid::regclass::text, pg_catalog.pg_get_userbyid(c.relowner)::text \
           from pg_catalog.unnest($1::text[]) as t(name) \
           join pg_catalog.pg_class c on c.oid = pg_catalog.to_regclass(t.name)::oid \
           join pg_catalog.pg_roles o on o.oid = c.relowner \
          where not o.rolsuper and c.relowner not in (select role from mine) \
          order by 1",
    )
    .bind(&TABLES[..])
    .fetch_all(&mut *conn)
    .await?;
    if foreign.is_empty() {
        return Ok(());
    }
    let listed: Vec<String> = foreign
        .iter()
        .map(|(table, owner)| format!("`{table}` (owned by `{owner}`)"))
        .collect();
    let user: String = sqlx::query_scalar("select current_user::text")
        .fetch_one(&mut *conn)
        .await?;
    Err(Error::Config(format!(
        "outbox migrate refuses to use {}: the migrations create these tables, and the role \
         migrating (`{user}`) neither owns them nor is a member of their owner, so another role \
         created them and could run its own code (a trigger) as whoever writes them. Drop them \
         if no outbox ever used them, or migrate as their owner; and let only the migration role \
         create in the schema (on Postgres 13 and 14: `revoke create on schema public from \
         public`, docs/operations.md, *Roles*)",
        listed.join(", ")
    )))
}

/// Records `migration` as applied (without running its statement) unless it is.
async fn record(conn: &mut PgConnection, table: &str, migration: &Migration) -> Result<()> {
    // the table name is sqlx's, not input
    let recorded: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "select exists (select 1 from {table} where version = $1)"
    )))
    .bind(migration.version)
    .fetch_one(&mut *conn)
    .await?;
    if !recorded {
        conn.skip(table, migration).await?;
    }
    Ok(())
}

/// The other sessions that hold `outbox_events` in the mode a concurrent index build holds it
/// for its whole run, from the moment its index appears until it is valid (a vacuum or an
/// analyze holds it so too). `pg_locks` shows every session's locks to every role, where
/// `pg_stat_progress_create_index` hides other roles' builds from a role without
/// `pg_read_all_stats`.
async fn builders(conn: &mut PgConnection) -> Result<Vec<i32>> {
    Ok(sqlx::query_scalar(
        "select distinct l.pid from pg_locks l \
          where l.locktype = 'relation' and l.relation = to_regclass('outbox_events')::oid \
            and l.database = (select oid from pg_database where datname = current_database()) \
            and l.mode = 'ShareUpdateExclusiveLock' and l.granted \
            and l.pid <> pg_backend_pid() \
          order by l.pid",
    )
    .fetch_all(&mut *conn)
    .await?)
}

/// Takes the migration lock for this session: sqlx's own (so that the service's migrations and
/// the outbox's never run at once), by trying every [`LOCK_POLL`] rather than waiting in one
/// statement. A waiting statement holds a snapshot, which a concurrent index build on any table
/// of the database waits for; tries that end at once hold nothing.
async fn lock(conn: &mut PgConnection) -> Result<()> {
    let database: String = sqlx::query_scalar("select current_database()")
        .fetch_one(&mut *conn)
        .await?;
    let key = lock_key(&database);
    let started = Instant::now();
    let mut said = Duration::ZERO;
    loop {
        let taken: bool = sqlx::query_scalar("select pg_try_advisory_lock($1)")
            .bind(key)
            .fetch_one(&mut *conn)
            .await?;
        if taken {
            return Ok(());
        }
        if started.elapsed() >= said + LOCK_SAY_EVERY {
            said = started.elapsed();
            // a bigint key is shown as its two halves, the low one in `objid`
            let holders: Vec<i32> = sqlx::query_scalar(
                "select pid from pg_locks \
                  where locktype = 'advisory' and granted and objsubid = 1 \
                    and database = (select oid from pg_database where datname = current_database()) \
                    and classid::bigint = $1 and objid::bigint = $2",
            )
            .bind(i64::from((key >> 32) as u32))
            .bind(i64::from(key as u32))
            .fetch_all(&mut *conn)
            .await?;
            tracing::info!(waited = ?said, ?holders, "outbox migrate waits for the migration lock, which another migration holds");
        }
        tokio::time::sleep(LOCK_POLL).await;
    }
}

/// sqlx's migration lock key for `database`: `0x3d32ad9e` times the CRC-32 of its name
/// (sqlx-postgres's `generate_lock_id`).
fn lock_key(database: &str) -> i64 {
    0x3d32_ad9e * i64::from(crc32(database.as_bytes()))
}

/// CRC-32 (ISO-HDLC, as zlib's), bit by bit: a few names, once per run.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn millis(d: Duration) -> String {
    d.as_millis().to_string()
}

fn is_lock_timeout(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| code == "55P03")
}

/// `e`, or [`Error::MigrationBlocked`] naming `what` when it is a lock timeout.
fn blocked(e: sqlx::Error, what: String) -> Error {
    if is_lock_timeout(&e) {
        Error::MigrationBlocked {
            what,
            waited: LOCK_WAIT,
        }
    } else {
        e.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_zlibs() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn every_table_a_migration_creates_is_checked_for_its_owner() {
        let migrator = sqlx::migrate!("./migrations");
        let mut created = Vec::new();
        for migration in migrator.iter() {
            let words: Vec<&str> = migration.sql.as_str().split_whitespace().collect();
            for (i, w) in words.iter().enumerate() {
                if w.eq_ignore_ascii_case("table") && i > 0 {
                    let before = words[i - 1].to_ascii_lowercase();
                    if before == "create" || before == "unlogged" {
                        let name = words[i + 1..]
                            .iter()
                            .find(|w| !["if", "not", "exists"].contains(&&*w.to_lowercase()))
                            .expect("a name");
                        created.push(name.trim_end_matches('(').to_owned());
                    }
                }
            }
        }
        assert!(created.len() >= 10, "{created:?}");
        for table in &created {
            assert!(TABLES.contains(&table.as_str()), "{table} is not in TABLES");
        }
    }

    /// The statements `migrate` runs and names are the migrations' own.
    #[test]
    fn the_index_statements_are_their_migrations() {
        let migrator = sqlx::migrate!("./migrations");
        for index in &BUILT_CONCURRENTLY {
            let migration = migrator
                .iter()
                .find(|m| m.version == index.version)
                .expect("the migration");
            let statement: String = migration
                .sql
                .as_str()
                .lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join(" ");
            let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
            assert_eq!(
                words(&statement),
                format!("{};", words(&index.create())),
                "migration {}",
                index.version
            );
            assert_eq!(
                index.create_concurrently().replacen(" concurrently", "", 1),
                index.create()
            );
        }
    }
}
