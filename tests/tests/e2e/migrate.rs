//! `outbox_runtime::migrate` never holds writes: a DBA's concurrent index build under another
//! role is left alone while migrations and emits go on, an index missing on a table with rows
//! (or left invalid by a failed build) is named, not built, a statement waiting for a table lock
//! gives up after 2 s, and the run holds sqlx's migration lock throughout.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_runtime::{EmitExt, Error, Schemas};
use outbox_testkit::{eventually, open_schemas, raw_event, PgServer, TestDb};
use sqlx::migrate::Migrate;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

const INDEX: &str = "outbox_events_published_idx";
const BUILD: &str = "create index concurrently if not exists outbox_events_published_idx \
                     on outbox_events (published_at) where published_at is not null";

/// A private Postgres (roles are the whole server's, so tests that create them get their own),
/// with a database `outbox`.
pub(crate) struct Private {
    pub(crate) pg: PgServer,
}

impl Private {
    /// A new server.
    pub(crate) async fn spawn() -> Private {
        Private {
            pg: PgServer::spawn(),
        }
    }

    /// A new server, and its database `outbox` owned by the role `owner` (created here).
    pub(crate) async fn new(owner: &str) -> Private {
        let private = Private::spawn().await;
        private
            .admin("postgres")
            .await
            .execute_all(&[
                &format!("create role {owner} login"),
                &format!("create database outbox owner {owner}"),
            ])
            .await;
        private
    }

    /// `role`'s URL of `database`.
    pub(crate) fn url(&self, role: &str, database: &str) -> String {
        format!("postgres://{role}@127.0.0.1:{}/{database}", self.pg.port)
    }

    /// A connection of the superuser to `database`.
    pub(crate) async fn admin(&self, database: &str) -> Admin {
        Admin(
            PgConnection::connect(&self.url("root", database))
                .await
                .expect("connect as the superuser"),
        )
    }

    /// A pool of `role` on `outbox`.
    pub(crate) async fn pool(&self, role: &str, size: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(size)
            .connect(&self.url(role, "outbox"))
            .await
            .unwrap_or_else(|e| panic!("connect as {role}: {e}"))
    }
}

/// A superuser's connection.
pub(crate) struct Admin(pub(crate) PgConnection);

impl Admin {
    /// Runs each statement, in order.
    pub(crate) async fn execute_all(&mut self, statements: &[&str]) {
        for statement in statements {
            sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_string()))
                .execute(&mut self.0)
                .await
                .unwrap_or_else(|e| panic!("{statement}: {e}"));
        }
    }
}

/// The index `INDEX`'s oid and whether it is valid, if it exists.
async fn published_index(pool: &PgPool) -> Option<(u32, bool)> {
    sqlx::query_as::<_, (sqlx::postgres::types::Oid, bool)>(
        "select c.oid, i.indisvalid from pg_index i join pg_class c on c.oid = i.indexrelid \
          where c.relname = $1",
    )
    .bind(INDEX)
    .fetch_optional(pool)
    .await
    .expect("read the index")
    .map(|(oid, valid)| (oid.0, valid))
}

async fn recorded(pool: &PgPool, version: i64) -> bool {
    sqlx::query_scalar("select exists (select 1 from _sqlx_migrations where version = $1)")
        .bind(version)
        .fetch_one(pool)
        .await
        .expect("read _sqlx_migrations")
}

/// Emits `n` events about subjects `s0` to `s99` through `pool`.
async fn emit_rows(pool: &PgPool, schemas: &Schemas, n: i64) {
    let mut tx = pool.begin().await.expect("begin");
    for i in 0..n {
        let event = raw_event("ops.row.changed", "ops", format!("s{}", i % 100)).numbered(i);
        tx.emit_raw(schemas, event.build()).await.expect("emit");
    }
    tx.commit().await.expect("commit");
}

/// The database as an upgrade finds it: rows in the table, the index of 0009 missing and 0009
/// not applied.
async fn without_the_published_index(pool: &PgPool) {
    for statement in [
        "drop index outbox_events_published_idx",
        "delete from _sqlx_migrations where version = 9",
    ] {
        sqlx::query(statement)
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_leaves_another_roles_concurrent_build_alone_and_never_holds_emits() {
    // The table's owner migrates and emits; a DBA, a role of its own that may build indexes
    // on the owner's tables (a member of it) but whose sessions the owner cannot see in
    // pg_stat_progress_create_index, builds the index concurrently meanwhile.
    let private = Private::new("migrator").await;
    private
        .admin("postgres")
        .await
        .execute_all(&["create role dba login in role migrator"])
        .await;
    let pool = private.pool("migrator", 6).await;
    outbox_runtime::migrate(&pool)
        .await
        .expect("migrate the empty database");
    let schemas = open_schemas(&["ops.row.changed".to_owned()]);
    emit_rows(&pool, &schemas, 2_000).await;
    without_the_published_index(&pool).await;

    // The index missing on a table with rows is not built: the error says how.
    let refused = outbox_runtime::migrate(&pool)
        .await
        .expect_err("the index is missing on a table with rows");
    assert!(
        matches!(refused, Error::IndexNotBuilt { index: INDEX, .. }),
        "{refused}"
    );
    assert!(refused.to_string().contains(BUILD), "{refused}");
    assert_eq!(published_index(&pool).await, None, "nothing was built");
    assert!(!recorded(&pool, 9).await, "0009 is not recorded");

    // The DBA builds it concurrently; an old snapshot (another session's report) keeps the
    // build waiting in its last phase, the index there but invalid.
    let mut report = private.admin("outbox").await;
    report
        .execute_all(&[
            "begin isolation level repeatable read",
            "select count(*) from outbox_events",
        ])
        .await;
    let mut dba = PgConnection::connect(&private.url("dba", "outbox"))
        .await
        .expect("connect as the DBA");
    let build = tokio::spawn(async move {
        let built = sqlx::raw_sql(BUILD).execute(&mut dba).await;
        (built.map(|_| ()), Instant::now())
    });
    eventually(
        Duration::from_secs(20),
        "the DBA's build creates the index",
        || async { published_index(&pool).await.is_some() },
    )
    .await;
    let (building, valid) = published_index(&pool).await.expect("the index");
    assert!(!valid, "the build waits for the old snapshot");
    let progress_hidden: bool = sqlx::query_scalar(
        "select bool_and(index_relid is null) from pg_stat_progress_create_index",
    )
    .fetch_one(&pool)
    .await
    .expect("read pg_stat_progress_create_index");
    assert!(
        progress_hidden,
        "the owner cannot see which index the DBA builds"
    );

    // Meanwhile two processes migrate over and over, and another emits, timing each emit.
    let stop = Arc::new(AtomicBool::new(false));
    let migrations = (0..2)
        .map(|_| {
            let (pool, stop) = (pool.clone(), stop.clone());
            tokio::spawn(async move {
                let mut runs = 0;
                while !stop.load(Ordering::Relaxed) {
                    if let Err(e) = outbox_runtime::migrate(&pool).await {
                        return Err(e.to_string());
                    }
                    runs += 1;
                }
                Ok(runs)
            })
        })
        .collect::<Vec<_>>();
    let slowest = Arc::new(Mutex::new(Duration::ZERO));
    let emitting = {
        let (pool, stop, slowest, schemas) =
            (pool.clone(), stop.clone(), slowest.clone(), schemas.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let mut tx = pool.begin().await.expect("begin");
                let event = raw_event("ops.row.changed", "ops", format!("s{}", n % 100));
                tx.emit_raw(&schemas, event.numbered(n).build())
                    .await
                    .expect("emit");
                tx.commit().await.expect("commit");
                let took = started.elapsed();
                let mut slowest = slowest.lock().expect("not poisoned");
                *slowest = (*slowest).max(took);
                n += 1;
            }
            n
        })
    };
    // Eight seconds of building, then the report ends and the build completes.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let released = Instant::now();
    report.execute_all(&["commit"]).await;
    let (built, done) = tokio::time::timeout(Duration::from_secs(30), build)
        .await
        .expect("the build ends once the snapshot is gone (no deadlock)")
        .expect("build task");
    built.expect("the DBA's build succeeds");
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut runs = 0;
    for migration in migrations {
        runs += tokio::time::timeout(Duration::from_secs(30), migration)
            .await
            .expect("migrate returns (no deadlock)")
            .expect("migrate task")
            .expect("migrate succeeds while the DBA builds");
    }
    let emitted = tokio::time::timeout(Duration::from_secs(30), emitting)
        .await
        .expect("the emits return (no deadlock)")
        .expect("emit task");
    let slowest = *slowest.lock().expect("not poisoned");
    eprintln!(
        "{runs} migrations and {emitted} emits during the build; slowest emit {slowest:?}; \
         the build ended {:?} after the snapshot did",
        done.duration_since(released)
    );

    assert!(runs >= 10, "migrate ran {runs} times during the build");
    assert!(emitted >= 100, "{emitted} emits during the build");
    // A migration that held writes for the build would have held this emit for the eight
    // seconds; migrate's lock waits end at 2 s.
    assert!(
        slowest < Duration::from_secs(4),
        "an emit waited {slowest:?} during the build"
    );
    assert_eq!(
        published_index(&pool).await,
        Some((building, true)),
        "the DBA's own index, valid"
    );
    assert!(
        recorded(&pool, 9).await,
        "0009 recorded once the index exists"
    );
    outbox_runtime::migrate(&pool)
        .await
        .expect("migrate after the build");
    assert_eq!(published_index(&pool).await, Some((building, true)));
}

/// An index left invalid by a failed concurrent build on a table with rows.
async fn failed_build(pool: &PgPool) {
    // a concurrent build that fails: it waits for an older snapshot and times out
    let mut old = pool.begin().await.expect("begin");
    sqlx::query("set transaction isolation level repeatable read")
        .execute(&mut *old)
        .await
        .expect("repeatable read");
    sqlx::query("select count(*) from outbox_events")
        .execute(&mut *old)
        .await
        .expect("an old snapshot");
    let mut build = PgConnection::connect_with(&*pool.connect_options())
        .await
        .expect("connect");
    sqlx::query("set statement_timeout = '500ms'")
        .execute(&mut build)
        .await
        .expect("set statement_timeout");
    let failed = sqlx::raw_sql(BUILD).execute(&mut build).await;
    assert!(failed.is_err(), "the build times out");
    build.close().await.expect("close");
    old.rollback().await.expect("rollback");
}

#[tokio::test]
async fn an_index_a_failed_build_left_invalid_on_a_table_with_rows_is_named_not_dropped() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    emit_rows(pool, &open_schemas(&["ops.row.changed".to_owned()]), 500).await;
    without_the_published_index(pool).await;
    failed_build(pool).await;
    let (invalid, valid) = published_index(pool)
        .await
        .expect("the failed build's index");
    assert!(!valid);

    let refused = outbox_runtime::migrate(pool)
        .await
        .expect_err("an invalid index on a table with rows");
    let message = refused.to_string();
    assert!(
        matches!(refused, Error::IndexNotBuilt { index: INDEX, .. }),
        "{message}"
    );
    assert!(
        message.contains("drop index concurrently if exists outbox_events_published_idx")
            && message.contains(BUILD),
        "{message}"
    );
    assert_eq!(
        published_index(pool).await,
        Some((invalid, false)),
        "nothing dropped"
    );

    // The operator runs what the error says; migrate then records 0009.
    for statement in [
        "drop index concurrently if exists outbox_events_published_idx",
        BUILD,
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    outbox_runtime::migrate(pool).await.expect("migrate");
    assert!(matches!(published_index(pool).await, Some((_, true))));
    assert!(recorded(pool, 9).await);
}

#[tokio::test]
async fn a_migration_waiting_for_a_table_lock_gives_up_after_two_seconds_and_holds_emits_no_longer()
{
    let db = TestDb::new().await;
    let pool = &db.pool;
    let schemas = open_schemas(&["ops.row.changed".to_owned()]);
    // 0007 to apply again: its `alter table` needs the table to itself
    sqlx::query("delete from _sqlx_migrations where version = 7")
        .execute(pool)
        .await
        .expect("forget 0007");
    // a long reader holds the table
    let mut reader = pool.begin().await.expect("begin");
    sqlx::query("select count(*) from outbox_events")
        .execute(&mut *reader)
        .await
        .expect("read");

    let started = Instant::now();
    let migrating = {
        let pool = pool.clone();
        tokio::spawn(async move { outbox_runtime::migrate(&pool).await })
    };
    // an emit queues behind the waiting `alter table`
    tokio::time::sleep(Duration::from_millis(500)).await;
    let emitted = Instant::now();
    emit_rows(pool, &schemas, 1).await;
    let emit_waited = emitted.elapsed();
    let refused = migrating
        .await
        .expect("migrate task")
        .expect_err("0007 cannot lock the table");
    let migrate_took = started.elapsed();
    assert!(
        matches!(&refused, Error::MigrationBlocked { what, .. } if what == "migration 7"),
        "{refused}"
    );
    assert!(
        migrate_took < Duration::from_secs(5),
        "migrate gave up after {migrate_took:?}"
    );
    assert!(
        emit_waited < Duration::from_secs(4),
        "the emit waited {emit_waited:?}"
    );
    assert!(!recorded(pool, 7).await, "0007 was not applied");
    reader.rollback().await.expect("rollback");
    outbox_runtime::migrate(pool)
        .await
        .expect("migrate once the reader is gone");
    assert!(recorded(pool, 7).await);
}

#[tokio::test]
async fn migrate_holds_sqlxs_migration_lock_so_it_waits_for_the_services_migrator() {
    let db = TestDb::new().await;
    // the service's migrator, in the middle of its run, holds sqlx's lock
    let mut service = PgConnection::connect_with(&db.options)
        .await
        .expect("connect");
    service.lock().await.expect("sqlx's migration lock");
    let migrating = {
        let pool = db.pool.clone();
        tokio::spawn(async move { outbox_runtime::migrate(&pool).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !migrating.is_finished(),
        "migrate waits for the service's migrator"
    );
    service.unlock().await.expect("unlock");
    tokio::time::timeout(Duration::from_secs(5), migrating)
        .await
        .expect("migrate goes on once the lock is free")
        .expect("migrate task")
        .expect("migrate");
}

/// A role that may create in the schema where the migrations create their tables (`public` on
/// Postgres 13 and 14 by default) creates one of them first, with a trigger that would run its
/// code as whoever writes the table. The migrations' `create table if not exists` would take it
/// as the outbox's: `migrate` refuses, names the table and its owner, and applies nothing. The
/// same holds for sqlx's own `_sqlx_migrations`, whose every insert the trigger would see.
#[tokio::test]
async fn a_table_another_role_created_before_the_migrations_is_refused_not_used() {
    let private = Private::new("migrator").await;
    private
        .admin("outbox")
        .await
        .execute_all(&[
            "create role mallory login",
            "grant create on schema public to mallory",
        ])
        .await;
    let mallory = private.pool("mallory", 1).await;
    let migrator = private.pool("migrator", 2).await;
    for table in ["outbox_relay_lease", "_sqlx_migrations"] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "create table {table} (version bigint); \
             create function mallorys() returns trigger language plpgsql as \
               $$ begin raise exception 'mallory''s code ran'; end $$; \
             create trigger mallorys before insert on {table} \
               for each row execute function mallorys();"
        )))
        .execute(&mallory)
        .await
        .expect("mallory creates the table");
        let refused = outbox_runtime::migrate(&migrator)
            .await
            .expect_err("migrate uses another role's table");
        let said = refused.to_string();
        assert!(matches!(refused, Error::Config(_)), "{said}");
        for part in [
            &format!("`{table}` (owned by `mallory`)"),
            "revoke create on schema public from public",
        ] {
            assert!(said.contains(part), "{part} in: {said}");
        }
        let events: Option<String> =
            sqlx::query_scalar("select to_regclass('outbox_events')::text")
                .fetch_one(&migrator)
                .await
                .unwrap();
        assert_eq!(events, None, "nothing was migrated");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "drop table {table}; drop function mallorys();"
        )))
        .execute(&mallory)
        .await
        .expect("mallory drops it");
    }
    // a superuser may do anything with mallory's table, but did not create it
    sqlx::raw_sql("create table outbox_retries (subject text)")
        .execute(&mallory)
        .await
        .expect("mallory creates a table");
    let refused = outbox_runtime::migrate(&private.pool("root", 2).await)
        .await
        .expect_err("a superuser's migrate uses another role's table");
    assert!(
        refused
            .to_string()
            .contains("`outbox_retries` (owned by `mallory`)"),
        "{refused}"
    );
    sqlx::raw_sql("drop table outbox_retries")
        .execute(&mallory)
        .await
        .expect("mallory drops it");
    outbox_runtime::migrate(&migrator)
        .await
        .expect("migrate once the tables are gone");
}
