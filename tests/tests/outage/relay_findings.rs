//! Each finding of the review of the relay as it was before its cursor, lease and wake-up
//! locks, pinned as a fixed scenario (the seeded harness, `outbox-harness`, looks for them and
//! their kind at random). Each failed on that relay.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::{Relay, RelayConfig, StorageType, StreamSpec};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{
    emit_committed, eventually, open_schemas, raw_event, run_relay, unique_token, NatsServer,
    PgServer, PgServerConfig, TestDb,
};
use sqlx::PgPool;
use tokio::time::Instant;
use uuid::Uuid;

/// A row written with SQL: `created_at` as the expression `created_at` says.
async fn insert(pool: &PgPool, event_type: &str, subject: &str, created_at: &str) -> Uuid {
    let id = Uuid::now_v7();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
         values ($1, $2, 'billing', $3, now(), '{{}}', {created_at})"
    )))
    .bind(id)
    .bind(event_type)
    .bind(subject)
    .execute(pool)
    .await
    .unwrap();
    id
}

/// Whether `id` is marked published.
async fn published(pool: &PgPool, id: Uuid) -> bool {
    sqlx::query_scalar("select published_at is not null from outbox_events where id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The stream's event ids per subject, in stream order (first occurrence).
async fn stream_by_subject(ctx: &Ctx) -> HashMap<String, Vec<Uuid>> {
    let mut seen: HashMap<String, Vec<Uuid>> = HashMap::new();
    for m in ctx.read_stream().await {
        let ids = seen.entry(m.envelope.subject.clone()).or_default();
        if !ids.contains(&m.envelope.id) {
            ids.push(m.envelope.id);
        }
    }
    seen
}

/// A row held for good, elsewhere: its type has no stream.
async fn held_elsewhere(ctx: &Ctx) -> Uuid {
    let nowhere = format!("{}.nowhere.row.changed", unique_token());
    let id = insert(ctx.pool(), &nowhere, "held-elsewhere", "clock_timestamp()").await;
    eventually(
        Duration::from_secs(20),
        "the row elsewhere held",
        || async {
            sqlx::query_scalar::<_, bool>(
            "select exists (select 1 from outbox_retries where event_id = $1 and retry_at is null)",
        )
        .bind(id)
        .fetch_one(ctx.pool())
        .await
        .unwrap()
        },
    )
    .await;
    id
}

/// A login role with the relay's grants (`ops/postgres/grants.sql`), no superuser, no
/// `pg_read_all_stats`: it sees no other role's transactions in `pg_stat_activity`. Returns
/// its pool on the test's database.
async fn relay_role_pool(db: &TestDb, config: &RelayConfig) -> (String, PgPool) {
    let role = format!("relay_{}", unique_token());
    for statement in [
        format!("create role {role} login"),
        format!("grant select, update (published_at, attempts) on outbox_events to {role}"),
        format!("grant select, insert, update, delete on outbox_retries to {role}"),
        format!("grant select, insert, update on outbox_relay_lease to {role}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&db.pool)
            .await
            .unwrap();
    }
    let options = db.options.clone().username(&role);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(config.pool_size())
        .connect_with(options)
        .await
        .unwrap();
    (role, pool)
}

/// Drops a role of [`relay_role_pool`] once its pool is closed.
async fn drop_role(db: &TestDb, role: &str) {
    for statement in [format!("drop owned by {role}"), format!("drop role {role}")] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&db.pool)
            .await
            .unwrap();
    }
}

/// The old relay's floor treated subjects paused in its memory (not attempted while the broker
/// was down) as parked and passed their rows: a sequential writer's two events, the first
/// emitted during a broker outage, reached the stream reversed, with one row held anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_writers_events_keep_their_order_across_a_broker_outage_with_a_row_held_elsewhere() {
    let mut server = NatsServer::spawn().await;
    let ctx = Ctx::with_nats(&server.url()).await;
    StreamSpec {
        storage: StorageType::File,
        ..ctx.stream_spec()
    }
    .ensure(&ctx.js)
    .await
    .unwrap();
    let ty = ctx.event_type("billing.invoice.paid");
    let schemas = open_schemas(std::slice::from_ref(&ty));
    let config = RelayConfig {
        lanes: 1,
        ..Default::default()
    };
    let pool = ctx.db.new_pool(config.pool_size()).await;
    let client = outbox_testkit::connect_nats(&server.url()).await;
    let relay = Arc::new(
        Relay::new(pool, async_nats::jetstream::new(client), config)
            .await
            .unwrap(),
    );
    let (stop, running) = run_relay(relay.clone());
    held_elsewhere(&ctx).await;

    server.stop();
    let e1 = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&ty, "billing", "S").numbered(1),
    )
    .await;
    // the relay tries e1 while the broker is down, and keeps looking for a while
    tokio::time::sleep(Duration::from_secs(8)).await;
    let e2 = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&ty, "billing", "S").numbered(2),
    )
    .await;
    server.start().await;
    eventually(Duration::from_secs(30), "both published", || async {
        published(ctx.pool(), e1).await && published(ctx.pool(), e2).await
    })
    .await;
    stop.send(()).unwrap();
    running.await.unwrap();
    assert_eq!(
        stream_by_subject(&ctx).await["S"],
        [e1, e2],
        "in emit order"
    );
    assert_eq!(relay.stats().failed, 0, "the outage spent no attempt");
    ctx.delete_stream().await;
}

/// The old relay bound positions as text through chrono's RFC 3339: a `created_at` in the year
/// 50000 (epoch milliseconds stored as seconds) or before the common era failed every batch of
/// its lane, for as long as the row existed, without holding it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_created_at_in_the_year_50000_or_before_the_common_era_stops_no_lane() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let ty = ctx.event_type("billing.invoice.paid");
    let schemas = open_schemas(std::slice::from_ref(&ty));
    let relay = Arc::new(
        Relay::new(ctx.pool().clone(), ctx.js.clone(), RelayConfig::default())
            .await
            .unwrap(),
    );
    let (stop, running) = run_relay(relay.clone());
    // the relay's cursors move on first, as they did before the odd rows appeared
    let first = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&ty, "billing", "first").build(),
    )
    .await;
    eventually(
        Duration::from_secs(20),
        "the first event published",
        || async { published(ctx.pool(), first).await },
    )
    .await;
    let far = insert(ctx.pool(), &ty, "far", "'50000-01-01 00:00:00+00'").await;
    let bc = insert(ctx.pool(), &ty, "bc", "'0100-06-01 00:00:00+00 BC'").await;
    let mut healthy = Vec::new();
    for n in 0..20 {
        let subject = format!("healthy-{n}");
        healthy.push(
            emit_committed(
                ctx.pool(),
                &schemas,
                raw_event(&ty, "billing", subject).build(),
            )
            .await,
        );
    }
    eventually(
        Duration::from_secs(20),
        "every row published, the odd ones too",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    stop.send(()).unwrap();
    running.await.unwrap();
    let stream = stream_by_subject(&ctx).await;
    assert_eq!(stream["far"], [far]);
    assert_eq!(stream["bc"], [bc]);
    assert_eq!(stream.len(), 23);
    assert_eq!(
        relay.stats().held,
        0,
        "a real instant is no reason to hold a row"
    );
    ctx.delete_stream().await;
}

/// The old relay's floor moved past rows whose transaction was still running when the relay's
/// role could not see every session: a transaction that slept before its insert, with the
/// column's default `now()` (its start) for `created_at`, committed a row older than rows
/// already published, and with one row held elsewhere it waited 24 s for the slow look below
/// the floor. Also a sequential writer's next event must follow it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_row_of_a_long_transaction_goes_out_at_once_and_first_with_an_unprivileged_relay() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let ty = ctx.event_type("billing.invoice.paid");
    let schemas = open_schemas(std::slice::from_ref(&ty));
    let config = RelayConfig::default();
    let (role, pool) = relay_role_pool(&ctx.db, &config).await;
    let relay = Arc::new(
        Relay::new(pool.clone(), ctx.js.clone(), config)
            .await
            .unwrap(),
    );
    let (stop, running) = run_relay(relay.clone());
    held_elsewhere(&ctx).await;

    // a transaction that starts now, sleeps, and inserts with the default created_at
    let mut long = ctx.pool().begin().await.unwrap();
    sqlx::query("select pg_sleep(0)")
        .execute(&mut *long)
        .await
        .unwrap();
    let late = Uuid::now_v7();
    // meanwhile other subjects flow, so the relay's cursor moves on
    let flowing = Instant::now();
    let mut n = 0;
    while flowing.elapsed() < Duration::from_secs(4) {
        emit_committed(
            ctx.pool(),
            &schemas,
            raw_event(&ty, "billing", format!("flow-{}", n % 20)).numbered(n),
        )
        .await;
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data) \
         values ($1, $2, 'billing', 'late', now(), '{}')",
    )
    .bind(late)
    .bind(&ty)
    .execute(&mut *long)
    .await
    .unwrap();
    long.commit().await.unwrap();
    let committed = Instant::now();
    // the same writer's next event, emitted after the commit
    let next = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&ty, "billing", "late").build(),
    )
    .await;
    eventually(
        Duration::from_secs(20),
        "the late row published",
        || async { published(ctx.pool(), late).await },
    )
    .await;
    let took = committed.elapsed();
    eventually(
        Duration::from_secs(20),
        "the next one published",
        || async { published(ctx.pool(), next).await },
    )
    .await;
    eprintln!("the late row published {took:?} after its commit");
    stop.send(()).unwrap();
    running.await.unwrap();
    pool.close().await;
    drop_role(&ctx.db, &role).await;
    assert_eq!(
        stream_by_subject(&ctx).await["late"],
        [late, next],
        "in emit order"
    );
    assert!(
        took < Duration::from_secs(3),
        "the late row waited {took:?}: the relay passed it"
    );
    ctx.delete_stream().await;
}

/// Prepared transactions never appear in `pg_stat_activity`: the old relay passed their rows,
/// and one committed 15 s after its insert, with a subject held elsewhere, was published
/// 8.6-14.9 s after `COMMIT PREPARED`. A private Postgres allows prepared transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_transactions_row_goes_out_at_once_and_before_the_writers_next() {
    let pg = PgServer::spawn_config(PgServerConfig {
        settings: vec![("max_prepared_transactions".into(), "10".into())],
        ..Default::default()
    });
    let db = TestDb::builder().server(pg.url()).create().await;
    let client = outbox_testkit::connect_nats(&outbox_testkit::nats_url()).await;
    let ctx = Ctx {
        db,
        js: async_nats::jetstream::new(client.clone()),
        client,
        prefix: unique_token(),
    };
    ctx.ensure_stream().await;
    let ty = ctx.event_type("billing.invoice.paid");
    let schemas = open_schemas(std::slice::from_ref(&ty));
    let config = RelayConfig::default();
    let (role, pool) = relay_role_pool(&ctx.db, &config).await;
    let relay = Arc::new(
        Relay::new(pool.clone(), ctx.js.clone(), config)
            .await
            .unwrap(),
    );
    let (stop, running) = run_relay(relay.clone());
    held_elsewhere(&ctx).await;

    let gid = unique_token();
    let mut conn = ctx.pool().acquire().await.unwrap();
    sqlx::query("begin").execute(&mut *conn).await.unwrap();
    let prepared = Uuid::now_v7();
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
         values ($1, $2, 'billing', 'two-phase', now(), '{}', clock_timestamp())",
    )
    .bind(prepared)
    .bind(&ty)
    .execute(&mut *conn)
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("prepare transaction '{gid}'")))
        .execute(&mut *conn)
        .await
        .unwrap();
    let flowing = Instant::now();
    let mut n = 0;
    while flowing.elapsed() < Duration::from_secs(5) {
        emit_committed(
            ctx.pool(),
            &schemas,
            raw_event(&ty, "billing", format!("flow-{}", n % 20)).numbered(n),
        )
        .await;
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sqlx::query(sqlx::AssertSqlSafe(format!("commit prepared '{gid}'")))
        .execute(ctx.pool())
        .await
        .unwrap();
    let committed = Instant::now();
    let next = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&ty, "billing", "two-phase").build(),
    )
    .await;
    eventually(
        Duration::from_secs(20),
        "the prepared row published",
        || async { published(ctx.pool(), prepared).await },
    )
    .await;
    let took = committed.elapsed();
    eventually(
        Duration::from_secs(20),
        "the next one published",
        || async { published(ctx.pool(), next).await },
    )
    .await;
    eprintln!("the prepared transaction's row published {took:?} after COMMIT PREPARED");
    stop.send(()).unwrap();
    running.await.unwrap();
    pool.close().await;
    drop(conn);
    drop_role(&ctx.db, &role).await;
    assert_eq!(
        stream_by_subject(&ctx).await["two-phase"],
        [prepared, next],
        "in emit order"
    );
    assert!(
        took < Duration::from_secs(3),
        "the prepared transaction's row waited {took:?}"
    );
    ctx.delete_stream().await;
}

/// The old relay waited for its wake lock with a lock timeout, so an idle relay beside another
/// ended a statement in an error about once a second: 86,000 `ERROR` lines a day in the server's
/// log from a healthy pair. Two idle relays on a private server, a few events between them:
/// nothing in its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_idle_relays_leave_no_error_in_the_servers_log() {
    let pg = PgServer::spawn();
    let db = TestDb::builder().server(pg.url()).create().await;
    let client = outbox_testkit::connect_nats(&outbox_testkit::nats_url()).await;
    let ctx = Ctx {
        db,
        js: async_nats::jetstream::new(client.clone()),
        client,
        prefix: unique_token(),
    };
    ctx.ensure_stream().await;
    let ty = ctx.event_type("billing.invoice.paid");
    let schemas = open_schemas(std::slice::from_ref(&ty));
    let config = RelayConfig::default();
    let mut relays = Vec::new();
    for _ in 0..2 {
        let pool = ctx.db.new_pool(config.pool_size()).await;
        let relay = Arc::new(
            Relay::new(pool, ctx.js.clone(), config.clone())
                .await
                .unwrap(),
        );
        relays.push(run_relay(relay));
    }
    let started = Instant::now();
    let mut n = 0;
    while started.elapsed() < Duration::from_secs(15) {
        emit_committed(
            ctx.pool(),
            &schemas,
            raw_event(&ty, "billing", format!("s-{}", n % 5)).numbered(n),
        )
        .await;
        n += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eventually(Duration::from_secs(10), "every event published", || async {
        ctx.db.unpublished().await == 0
    })
    .await;
    for (stop, running) in relays {
        stop.send(()).unwrap();
        running.await.unwrap();
    }
    let errors: Vec<String> = pg
        .log()
        .lines()
        .filter(|l| l.contains("ERROR:") || l.contains("FATAL:"))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        errors,
        Vec::<String>::new(),
        "the relays left errors in the server's log"
    );
    ctx.delete_stream().await;
}

/// A broker frozen without a reset (SIGSTOP: the connection stays up, nothing answers): a batch
/// in flight ends about two seconds after its ack deadline, whatever its rows (the old relay
/// looked each row's stream up for a second, one after the other, and ran about 20 s past its
/// deadline until Postgres ended its transaction), and the rows are published once the broker
/// answers again, in order, without an attempt spent on a broker that never got them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_ends_within_seconds_of_its_deadline_while_the_broker_is_frozen() {
    let server = NatsServer::spawn().await;
    let ctx = Ctx::with_nats(&server.url()).await;
    ctx.ensure_stream().await;
    let ty = ctx.event_type("billing.invoice.paid");
    let schemas = open_schemas(std::slice::from_ref(&ty));
    let config = RelayConfig {
        ack_timeout: Duration::from_secs(2),
        lanes: 1,
        ..Default::default()
    };
    let pool = ctx.db.new_pool(config.pool_size()).await;
    let client = outbox_testkit::connect_nats(&server.url()).await;
    let relay = Arc::new(
        Relay::new(pool, async_nats::jetstream::new(client), config)
            .await
            .unwrap(),
    );
    let (stop, running) = run_relay(relay.clone());
    let first = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&ty, "billing", "s-0").build(),
    )
    .await;
    eventually(Duration::from_secs(20), "the first published", || async {
        published(ctx.pool(), first).await
    })
    .await;
    let pid = server.pid().expect("the server runs");
    server.signal("STOP");
    // 200 rows of 50 event types (none of which the relay has looked up yet) and subjects
    let mut ids = Vec::new();
    for n in 0..200 {
        let ty = ctx.event_type(&format!("kind{}.row.changed", n % 50));
        let schemas = open_schemas(std::slice::from_ref(&ty));
        ids.push(
            emit_committed(
                ctx.pool(),
                &schemas,
                raw_event(&ty, "billing", format!("s-{}", n % 20)).numbered(n),
            )
            .await,
        );
    }
    let emitted = Instant::now();
    let settled = relay.stats().not_attempted + relay.stats().failed;
    eventually(
        Duration::from_secs(30),
        "a batch settles while the broker is frozen",
        || async { relay.stats().not_attempted + relay.stats().failed > settled },
    )
    .await;
    let took = emitted.elapsed();
    eprintln!(
        "a batch settled {took:?} after the rows were emitted, the broker frozen (pid {pid})"
    );
    server.signal("CONT");
    eventually(
        Duration::from_secs(60),
        "every row published once the broker answers",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    stop.send(()).unwrap();
    running.await.unwrap();
    assert!(
        took < Duration::from_secs(2 + 2 + 5),
        "the batch ran {took:?}: its ack deadline is 2 s"
    );
    assert_eq!(
        relay.stats().failed,
        0,
        "no attempt spent on a frozen broker"
    );
    ctx.delete_stream().await;
}
