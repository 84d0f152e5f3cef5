//! The relay's start-up checks against a real Postgres and nats-server (a missing table, an
//! unreachable server, a stream that does not fit, a configuration that cannot work), and what
//! the migrations leave for it (the claim's index, the mark's page layout, the shared sqlx
//! history).

use std::time::Duration;

use outbox_runtime::{EmitExt, Error, Relay, RelayConfig, StorageType, StreamSpec};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{
    connect_nats, database_url, free_port, nats_url, open_schemas, raw_event, PgServer, TestDb,
};

/// Why `Relay::new` on `pool` (and the local NATS) refuses to start.
async fn refused(pool: &sqlx::PgPool) -> Error {
    let nats = connect_nats(&nats_url()).await;
    Relay::new(
        pool.clone(),
        async_nats::jetstream::new(nats),
        RelayConfig::default(),
    )
    .await
    .unwrap_err()
}

#[tokio::test]
async fn a_missing_table_names_the_migration_to_run() {
    let db = TestDb::empty().await;
    let schemas = open_schemas(&["billing.invoice.paid".to_owned()]);
    let mut conn = db.pool.acquire().await.unwrap();
    let err = conn
        .emit_raw(
            &schemas,
            raw_event("billing.invoice.paid", "billing", "inv-1").build(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::MissingTable {
                table: "outbox_events",
                migration: "0001_outbox_events.sql"
            }
        ),
        "{err:?}"
    );
    drop(conn);

    let err = refused(&db.pool).await;
    let message = err.to_string();
    assert!(matches!(err, Error::MissingTable { .. }), "{err:?}");
    assert!(message.contains("0001_outbox_events.sql"), "{message}");
    assert!(message.contains("outbox migrate"), "{message}");
}

/// A standby answers the relay's reads and refuses its writes: pointed at one (a failover's
/// DNS not yet moved), the relay refuses to start as if the primary did not answer, and `outbox
/// relay` waits for it.
#[tokio::test]
async fn a_standby_is_refused_as_not_the_primary() {
    let pg = tokio::task::spawn_blocking(PgServer::spawn).await.unwrap();
    let url = pg.url();
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    outbox_runtime::migrate(&pool).await.unwrap();
    pool.close().await;
    let pg = tokio::task::spawn_blocking(move || {
        pg.restart_as_standby();
        pg
    })
    .await
    .unwrap();
    let err = Relay::connect(&url, &nats_url(), RelayConfig::default())
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, Error::Unreachable { .. }), "{err:?}");
    assert!(message.contains("is a standby (in recovery)"), "{message}");
    drop(pg);
}

/// The relay marks the rows it claimed by `ctid`, unique within one table only: it refuses an
/// outbox table with partitions or child tables, whose rows could share one.
#[tokio::test]
async fn an_outbox_table_with_child_tables_is_refused() {
    let ctx = Ctx::new().await;
    sqlx::query("create table outbox_events_2026_12 () inherits (outbox_events)")
        .execute(ctx.pool())
        .await
        .unwrap();
    let err = refused(ctx.pool()).await;
    let message = err.to_string();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(
        message.contains("outbox_events has partitions or child tables"),
        "{message}"
    );
}

#[tokio::test]
async fn unreachable_postgres_or_nats_at_start_is_a_clear_error() {
    let dead_pg = format!("postgres://root:secret@127.0.0.1:{}/test", free_port());
    let err = Relay::connect(&dead_pg, &nats_url(), RelayConfig::default())
        .await
        .unwrap_err();
    match &err {
        Error::Unreachable {
            service: "postgres",
            target,
            ..
        } => assert!(!target.contains("secret"), "credentials leak: {target}"),
        other => panic!("expected Unreachable postgres, got {other:?}"),
    }
    assert!(
        err.to_string().starts_with("cannot reach postgres at"),
        "{err}"
    );
    // secrets in the query are redacted the same way, in the message and in the value
    let in_query = format!(
        "postgres://root@127.0.0.1:{}/test?password=q-s3cret&sslpassword=k-s3cret&sslmode=prefer",
        free_port()
    );
    let err = Relay::connect(&in_query, &nats_url(), RelayConfig::default())
        .await
        .unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(matches!(err, Error::Unreachable { .. }), "{err:?}");
    assert!(
        !shown.contains("q-s3cret") && !shown.contains("k-s3cret"),
        "a query secret leaks: {shown}"
    );
    assert!(
        shown.contains("password=***&sslpassword=***&sslmode=prefer"),
        "{shown}"
    );

    // a proxy in front of a server that is down accepts the connection and closes it before
    // Postgres answers (pgbouncer, a load balancer): unreachable too, so that the `outbox
    // relay` command waits for it rather than exiting
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let behind_proxy = format!(
        "postgres://root@127.0.0.1:{}/test",
        listener.local_addr().unwrap().port()
    );
    let closer = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            // reads the client's first message (the SSLRequest), then closes
            let mut request = [0u8; 8];
            let _ = socket.read_exact(&mut request).await;
        }
    });
    let err = Relay::connect(&behind_proxy, &nats_url(), RelayConfig::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Unreachable {
                service: "postgres",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("proxy"), "{err}");
    closer.abort();

    let dead_nats = format!("nats://127.0.0.1:{}", free_port());
    let err = Relay::connect(&database_url(), &dead_nats, RelayConfig::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Unreachable { service: "nats", target, .. } if *target == dead_nats),
        "{err:?}"
    );
}

#[tokio::test]
async fn the_relay_refuses_a_stream_that_does_not_fit() {
    let ctx = Ctx::new().await;
    let paid = ctx.event_type("billing.invoice.paid");
    let config = RelayConfig {
        event_types: vec![paid.clone()],
        ..Default::default()
    };

    // No stream captures the subject.
    let err = Relay::new(ctx.pool().clone(), ctx.js.clone(), config.clone())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Stream { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains(&format!("no stream captures `{paid}`")),
        "{err}"
    );

    // A stream whose duplicate window is shorter than the retry horizon (5 min 20 s).
    let short = StreamSpec {
        duplicate_window: Duration::from_secs(30),
        ..ctx.stream_spec()
    };
    short.ensure(&ctx.js).await.unwrap();
    let err = Relay::new(ctx.pool().clone(), ctx.js.clone(), config.clone())
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains(&ctx.stream_name()) && message.contains("duplicate window 30s"),
        "{message}"
    );

    // With a shorter backoff ceiling the same stream fits.
    Relay::new(
        ctx.pool().clone(),
        ctx.js.clone(),
        RelayConfig {
            backoff_max: Duration::from_secs(5),
            ..config
        },
    )
    .await
    .unwrap();

    // ensure() on the existing stream: matches its own spec, reports every difference otherwise.
    short.ensure(&ctx.js).await.unwrap();
    let err = StreamSpec {
        storage: StorageType::File,
        ..short.clone()
    }
    .ensure(&ctx.js)
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("storage is memory, expected file"),
        "{err}"
    );
    ctx.delete_stream().await;
}

#[tokio::test]
async fn an_unworkable_configuration_is_refused() {
    let ctx = Ctx::new().await;
    for config in [
        RelayConfig {
            batch_size: 0,
            ..Default::default()
        },
        RelayConfig {
            backoff_base: Duration::ZERO,
            ..Default::default()
        },
        RelayConfig {
            max_attempts: 0,
            ..Default::default()
        },
        RelayConfig {
            partitions: 0,
            ..Default::default()
        },
        RelayConfig {
            lanes: 0,
            ..Default::default()
        },
        RelayConfig {
            lanes: 8,
            partitions: 4,
            ..Default::default()
        },
    ] {
        let err = Relay::new(ctx.pool().clone(), ctx.js.clone(), config)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err:?}");
    }
    // a pool too small for the lanes and the listener would wait forever for a connection
    let small = ctx.db.new_pool(2).await;
    let err = Relay::new(
        small,
        ctx.js.clone(),
        RelayConfig {
            lanes: 2,
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("allows 2 connections, and a relay with 2 lanes needs at least 4"),
        "{err}"
    );
    let err = StreamSpec {
        name: "bad.name".into(),
        subjects: vec!["x.y".into()],
        ..Default::default()
    }
    .ensure(&ctx.js)
    .await
    .unwrap_err();
    assert!(err.to_string().contains("invalid stream name"), "{err}");
}

/// A relay on a table without migration 0012's index (a copy of the migrations without it, or
/// its concurrent build still running) refuses to start, naming the statement that builds it:
/// without it every claim over a backlog would run past its statement timeout.
#[tokio::test]
async fn a_relay_without_the_subject_index_names_the_statement_that_builds_it() {
    let db = TestDb::new().await;
    sqlx::query("drop index outbox_events_unpublished_subject_idx")
        .execute(&db.pool)
        .await
        .unwrap();
    let err = refused(&db.pool).await;
    assert!(
        matches!(
            err,
            Error::MissingIndex {
                index: "outbox_events_unpublished_subject_idx",
                problem: "does not exist",
                ..
            }
        ),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains(
            "create index concurrently if not exists outbox_events_unpublished_subject_idx \
             on outbox_events ((hashtext(subject)), created_at, id) where published_at is null;"
        ),
        "{message}"
    );
}

/// A row with a subject longer than a B-tree entry can hold (the column is text of any length)
/// is emitted, marked failed and published: no index holds the subject itself.
#[tokio::test]
async fn a_subject_of_any_length_is_emitted_marked_and_published() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("billing.invoice.paid");
    let schemas = open_schemas(std::slice::from_ref(&event_type));
    let subject: String = (0..400)
        .map(|n| format!("{n:x}-{}", n * 7919 % 65_536))
        .collect();
    assert!(subject.len() > 3_000);
    let mut conn = ctx.pool().acquire().await.unwrap();
    let id = conn
        .emit_raw(
            &schemas,
            raw_event(&event_type, "billing", &subject).build(),
        )
        .await
        .expect("an emit with a long subject");
    drop(conn);
    // as a failed attempt's mark does
    sqlx::query("update outbox_events set attempts = attempts + 1 where id = $1")
        .bind(id)
        .execute(ctx.pool())
        .await
        .expect("a failed attempt marked");
    let relay = Relay::new(ctx.pool().clone(), ctx.js.clone(), RelayConfig::default())
        .await
        .expect("relay");
    while relay.run_once().await.expect("a batch").claimed > 0 {}
    let published: bool =
        sqlx::query_scalar("select published_at is not null from outbox_events where id = $1")
            .bind(id)
            .fetch_one(ctx.pool())
            .await
            .unwrap();
    assert!(published);
    let stored = ctx.read_stream().await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].envelope.subject, subject);
    ctx.delete_stream().await;
}

/// The relay's indexes are there, and 0003's, which indexed `subject` itself (a subject over
/// 2,704 bytes could not be marked failed), is gone.
#[tokio::test]
async fn the_migrations_leave_the_relays_indexes_and_no_index_of_the_subject_itself() {
    let db = TestDb::new().await;
    let indexes: Vec<String> = sqlx::query_scalar(
        "select indexname::text from pg_indexes where tablename = 'outbox_events' order by 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        !indexes.contains(&"outbox_events_retrying_idx".to_owned()),
        "{indexes:?}"
    );
    assert!(indexes.contains(&"outbox_events_unpublished_idx".to_owned()));
    assert!(
        indexes.contains(&"outbox_events_unpublished_partition_idx".to_owned()),
        "{indexes:?}"
    );
    assert!(
        indexes.contains(&"outbox_events_unpublished_subject_idx".to_owned()),
        "{indexes:?}"
    );
}

#[tokio::test]
async fn the_mark_writes_each_rows_new_version_on_the_rows_own_page() {
    let db = TestDb::new().await;
    // rows of the relay bench's size, inserted unpublished as an emit inserts them
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data)
         select gen_random_uuid(), 'billing.invoice.paid', 'billing', 'invoice-' || i, now(),
                jsonb_build_object('note', repeat('x', 300), 'n', i)
           from generate_series(1, 2000) as g(i)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    // the relay's mark; `before` reads the statement's snapshot, so it sees the old versions
    let (marked, moved): (i64, i64) = sqlx::query_as(
        "with before as (select id, ctid from outbox_events),
              marked as (update outbox_events set published_at = clock_timestamp()
                          returning id, ctid)
         select count(*),
                count(*) filter (where (before.ctid::text::point)[0]
                                       <> (marked.ctid::text::point)[0])
           from before join marked using (id)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(marked, 2000);
    assert_eq!(
        moved, 0,
        "the new versions stay on their rows' pages (migration 0004's fillfactor)"
    );
}

/// A service migrations folder in a temporary directory, with one file.
async fn service_migrator(file: &str) -> (tempfile::TempDir, sqlx::migrate::Migrator) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    std::fs::write(
        dir.path().join(file),
        "create table accounts (id bigint primary key);",
    )
    .expect("write the service's migration");
    let mut migrator = sqlx::migrate::Migrator::new(dir.path())
        .await
        .expect("read the service's migrations");
    migrator.set_ignore_missing(true);
    (dir, migrator)
}

#[tokio::test]
async fn migrate_shares_the_sqlx_history_with_the_services_own_migrations() {
    // timestamped versions, as `sqlx migrate add` names them: both sides coexist, in any order
    let db = TestDb::empty().await;
    let (_dir, service) = service_migrator("20240101000000_accounts.sql").await;
    service
        .run(&db.pool)
        .await
        .expect("the service migrates first");
    outbox_runtime::migrate(&db.pool)
        .await
        .expect("the outbox migrates beside it");
    service.run(&db.pool).await.expect("the service again");
    outbox_runtime::migrate(&db.pool)
        .await
        .expect("the outbox again");
    let versions: Vec<i64> =
        sqlx::query_scalar("select version from _sqlx_migrations order by version")
            .fetch_all(&db.pool)
            .await
            .expect("the migration history");
    let mut expected: Vec<i64> = outbox_runtime::MIGRATOR.iter().map(|m| m.version).collect();
    expected.push(20240101000000);
    assert_eq!(versions, expected);
    assert!(db.unpublished().await == 0, "the outbox table is there");

    // a service numbering its migrations 1, 2, 3 collides: said plainly, nothing half-applied
    let db = TestDb::empty().await;
    let (_dir, service) = service_migrator("0001_accounts.sql").await;
    service.run(&db.pool).await.expect("the service migrates");
    let err = outbox_runtime::migrate(&db.pool)
        .await
        .expect_err("version 1 is taken");
    assert!(
        matches!(err, outbox_runtime::Error::MigrationConflict { version: 1 }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("_sqlx_migrations") && text.contains("copy `migrations/*.sql`"),
        "{text}"
    );
    let outbox_table: bool = sqlx::query_scalar("select to_regclass('outbox_events') is not null")
        .fetch_one(&db.pool)
        .await
        .expect("query the catalog");
    assert!(!outbox_table, "nothing of the outbox was applied");
}
