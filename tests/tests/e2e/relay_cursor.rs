//! The cursor (docs/relay.md, *The cursor*): what a lane's statements read stays bounded
//! whatever waits behind held subjects and however many rows were published before, and a row
//! the cursor could have passed (an older transaction's, a row set unpublished by hand) goes
//! out at once or within the sweep's second, whatever the relay's role can see.

use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::{Relay, RelayConfig};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{
    emit_committed, eventually, open_schemas, raw_event, run_relay, unique_token,
};
use sqlx::PgPool;
use uuid::Uuid;

/// Inserts `n` rows of `subject`, each at its own instant, in one statement.
async fn insert_ordered(pool: &PgPool, event_type: &str, subject: &str, n: i64) -> Vec<Uuid> {
    sqlx::query_scalar(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
         select gen_random_uuid(), $1, 'backfill', $2, now(), jsonb_build_object('n', g), \
                now() + g * interval '1 microsecond' \
           from generate_series(1, $3) g \
         order by g \
         returning id",
    )
    .bind(event_type)
    .bind(subject)
    .bind(n)
    .fetch_all(pool)
    .await
    .expect("insert the rows")
}

async fn published(pool: &PgPool, ids: &[Uuid]) -> i64 {
    sqlx::query_scalar(
        "select count(*) from outbox_events where id = any($1) and published_at is not null",
    )
    .bind(ids)
    .fetch_one(pool)
    .await
    .expect("count published")
}

async fn relay(ctx: &Ctx, config: RelayConfig) -> Arc<Relay> {
    let pool = ctx.db.new_pool(config.pool_size()).await;
    relay_on(ctx, pool, config).await
}

/// A relay on `pool` (another role's connections, say) and the test's stream.
async fn relay_on(ctx: &Ctx, pool: PgPool, config: RelayConfig) -> Arc<Relay> {
    Arc::new(
        Relay::new(pool, ctx.js.clone(), config)
            .await
            .expect("relay"),
    )
}

/// A relay with one lane on the test's database and stream.
async fn one_lane(ctx: &Ctx) -> Arc<Relay> {
    relay(
        ctx,
        RelayConfig {
            lanes: 1,
            ..RelayConfig::default()
        },
    )
    .await
}

/// Waits, up to `within`, until `heads` rows are held (`outbox status`).
async fn held_heads(ctx: &Ctx, heads: i64, within: Duration) {
    eventually(within, "the held subjects' heads held", || async {
        outbox_runtime::status::status(ctx.pool(), 20)
            .await
            .unwrap()
            .held_total
            == heads
    })
    .await;
}

/// `(idx_scan, idx_tup_read)` of the unpublished index the relay's statements read (migration
/// 0010's): how many range scans they made of it, and how many entries they read.
async fn unpublished_index_reads(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as(
        "select idx_scan, idx_tup_read from pg_stat_user_indexes \
          where indexrelname = 'outbox_events_unpublished_partition_idx'",
    )
    .fetch_one(pool)
    .await
    .expect("the index's statistics")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_thousand_held_subjects_cost_a_steady_stream_nothing() {
    const FAILING: i64 = 50_000;
    const STEADY: Duration = Duration::from_secs(20);
    // Postgres flushes a backend's statistics at most every second, an idle one's after 10 s
    const STATS_FLUSH: Duration = Duration::from_secs(11);
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let nowhere = format!("{}.acme.order.created", unique_token()); // no stream captures it
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
         select gen_random_uuid(), $1, 'billing', 'failing-' || g, now(), '{}'::jsonb, \
                now() - interval '1 minute' + g * interval '1 microsecond' \
           from generate_series(1, $2) g",
    )
    .bind(&nowhere)
    .bind(FAILING)
    .execute(ctx.pool())
    .await
    .unwrap();
    let relay = relay(&ctx, RelayConfig::default()).await;
    let (stop, running) = run_relay(relay.clone());
    held_heads(&ctx, FAILING, Duration::from_secs(120)).await;
    tokio::time::sleep(STATS_FLUSH).await;
    let before = unpublished_index_reads(ctx.pool()).await;

    // A steady 200 events a second of a healthy type, for 20 seconds: 4,000 events, enough
    // claims to tell 50,000 entries read again per scan from a few.
    let healthy = ctx.event_type("steady.row.changed");
    let schemas = open_schemas(std::slice::from_ref(&healthy));
    let started = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    let mut n = 0i64;
    while started.elapsed() < STEADY {
        tick.tick().await;
        emit_committed(
            ctx.pool(),
            &schemas,
            raw_event(&healthy, "billing", format!("h-{}", n % 100)).numbered(n),
        )
        .await;
        n += 1;
    }
    eventually(
        Duration::from_secs(10),
        "every healthy event published",
        || async { ctx.db.unpublished().await == FAILING },
    )
    .await;
    tokio::time::sleep(STATS_FLUSH).await;
    let after = unpublished_index_reads(ctx.pool()).await;
    let (scans, read) = (after.0 - before.0, after.1 - before.1);
    let lag_ms: Vec<f64> = sqlx::query_scalar(
        "select percentile_cont(array[0.5, 0.99]) within group \
                (order by extract(epoch from published_at - created_at) * 1000) \
           from outbox_events where event_type = $1 and created_at > $2::timestamptz",
    )
    .bind(&healthy)
    .bind(chrono::Utc::now() - chrono::Duration::from_std(STEADY / 2 + STATS_FLUSH * 2).unwrap())
    .fetch_one(ctx.pool())
    .await
    .unwrap();
    eprintln!(
        "{n} healthy events beside {FAILING} held subjects: {scans} scans of the unpublished index read {read} entries ({:.1} per scan); emit-to-publish over the second half p50 {:.1} ms, p99 {:.1} ms",
        read as f64 / scans.max(1) as f64,
        lag_ms[0],
        lag_ms[1]
    );
    assert!(scans > 0, "the relay scanned the index");
    assert!(
        read / scans.max(1) < 1_000,
        "the relay's statements read the held rows again: {read} entries in {scans} scans, with {FAILING} held rows"
    );
    stop.send(()).unwrap();
    running.await.unwrap();
    ctx.delete_stream().await;
}

/// `(idx_scan, blocks hit and read)` of migration 0010's unpublished index, which the claims
/// read: how many range scans the relay's statements made of it, and how many of its pages.
async fn partition_index_pages(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as(
        "select s.idx_scan, io.idx_blks_hit + io.idx_blks_read \
           from pg_stat_user_indexes s join pg_statio_user_indexes io using (indexrelid) \
          where s.indexrelname = 'outbox_events_unpublished_partition_idx'",
    )
    .fetch_one(pool)
    .await
    .expect("the index's statistics")
}

/// A lane's cursor follows the rows it publishes: once a backlog is drained, the lane's
/// statements start after it and do not walk its entries, left in the unpublished indexes
/// until a vacuum, at every batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_backlogs_index_entries_are_not_walked_again_at_every_batch() {
    const BACKLOG: i64 = 20_000;
    const AFTER: i64 = 200;
    // Postgres flushes a backend's statistics at most every second, an idle one's after 10 s
    const STATS_FLUSH: Duration = Duration::from_secs(11);
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    // the dead entries stay for the whole test
    sqlx::query("alter table outbox_events set (autovacuum_enabled = false)")
        .execute(ctx.pool())
        .await
        .unwrap();
    let event_type = ctx.event_type("ledger.entry.posted");
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
         select gen_random_uuid(), $1, 'backfill', 'acct-' || (g % 500), now(), '{}'::jsonb, \
                now() + g * interval '1 microsecond' \
           from generate_series(1, $2) g",
    )
    .bind(&event_type)
    .bind(BACKLOG)
    .execute(ctx.pool())
    .await
    .unwrap();
    let relay = relay(&ctx, RelayConfig::default()).await;
    let (stop, running) = run_relay(relay.clone());
    eventually(Duration::from_secs(60), "the backlog published", || async {
        ctx.db.unpublished().await == 0
    })
    .await;
    tokio::time::sleep(STATS_FLUSH).await;
    let before = partition_index_pages(ctx.pool()).await;

    let schemas = open_schemas(std::slice::from_ref(&event_type));
    for n in 0..AFTER {
        emit_committed(
            ctx.pool(),
            &schemas,
            raw_event(&event_type, "ledger", format!("acct-{}", n % 50)).numbered(n),
        )
        .await;
    }
    eventually(
        Duration::from_secs(30),
        "every later event published",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    tokio::time::sleep(STATS_FLUSH).await;
    let after = partition_index_pages(ctx.pool()).await;
    let (scans, pages) = (after.0 - before.0, after.1 - before.1);
    let backlog_pages: i64 = sqlx::query_scalar(
        "select (pg_relation_size('outbox_events_unpublished_partition_idx') / 8192)::int8",
    )
    .fetch_one(ctx.pool())
    .await
    .unwrap();
    eprintln!(
        "{AFTER} events after a drained backlog of {BACKLOG}: {scans} scans of the partition index read {pages} pages ({:.1} per scan; the index has {backlog_pages})",
        pages as f64 / scans.max(1) as f64
    );
    assert!(scans > 0, "the relay scanned the index");
    assert!(
        backlog_pages > 50,
        "the drained backlog left {backlog_pages} pages of entries: too few to tell"
    );
    // A statement that walks the drained entries reads the whole index (124.9 pages a scan
    // with this backlog when statements started at the table's start); one that starts after
    // them, a few pages. Each lane also sweeps below its cursor once a second (a window's
    // walk, over the drained entries while they stay in the index), so the slower the machine
    // emits, the more the sweeps weigh in the mean: the bound is a quarter of a walk.
    assert!(
        pages / scans.max(1) < backlog_pages / 4,
        "the relay's statements walked the drained backlog's entries again: {pages} pages in {scans} scans, the index has {backlog_pages}"
    );
    stop.send(()).unwrap();
    running.await.unwrap();
    ctx.delete_stream().await;
}

/// A transaction begins, a backlog written after it is drained by a relay of one lane on
/// `relay_pool`, then the transaction writes a row with the column default `created_at` (its
/// start, older than every backlog row), notifies and commits: the row must go out at once, not
/// at the lane's sweep below its cursor.
async fn an_older_transactions_row_after_a_drain(ctx: &Ctx, relay_pool: PgPool) {
    let event_type = ctx.event_type("ledger.entry.posted");
    let mut older = ctx.pool().begin().await.unwrap();
    let started: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("select now()")
        .fetch_one(&mut *older)
        .await
        .unwrap();
    let backlog = insert_ordered(ctx.pool(), &event_type, "acct-1", 2_000).await;
    let config = RelayConfig {
        poll_interval: Duration::from_secs(10),
        // one lane: the backlog's cursor is the one the later row meets
        lanes: 1,
        ..RelayConfig::default()
    };
    let relay = relay_on(ctx, relay_pool, config).await;
    let (stop, running) = run_relay(relay.clone());
    eventually(Duration::from_secs(30), "the backlog published", || async {
        published(ctx.pool(), &backlog).await == backlog.len() as i64
    })
    .await;
    let id: Uuid = sqlx::query_scalar(
        "insert into outbox_events (id, event_type, source, subject, time, data) \
         values (gen_random_uuid(), $1, 'by-hand', 'acct-2', now(), '{}') returning id",
    )
    .bind(&event_type)
    .fetch_one(&mut *older)
    .await
    .unwrap();
    let created: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("select created_at from outbox_events where id = $1")
            .bind(id)
            .fetch_one(&mut *older)
            .await
            .unwrap();
    assert_eq!(
        created, started,
        "the row's created_at is its transaction's start"
    );
    sqlx::query("select pg_notify($1, '')")
        .bind(outbox_runtime::NOTIFY_CHANNEL)
        .execute(&mut *older)
        .await
        .unwrap();
    older.commit().await.unwrap();
    // well before the poll (10 s)
    eventually(
        Duration::from_secs(5),
        "the older transaction's row published once it commits",
        || async { published(ctx.pool(), &[id]).await == 1 },
    )
    .await;
    stop.send(()).unwrap();
    running.await.unwrap();
}

/// The cursor never passes the start of a transaction that was running when it moved (the
/// horizon).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_older_than_a_drained_backlog_is_published_when_it_commits() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let pool = ctx.db.new_pool(RelayConfig::default().pool_size()).await;
    an_older_transactions_row_after_a_drain(&ctx, pool).await;
    ctx.delete_stream().await;
}

/// The same, with the relay on a role that cannot see the other role's sessions in
/// `pg_stat_activity` (no `pg_read_all_stats`): the horizon comes from `pg_locks`, which every
/// role reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_cannot_see_every_session_does_not_pass_an_older_transaction() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let (role, pool) = role_pool(&ctx).await;
    let hidden: i64 = sqlx::query_scalar(
        "select count(*) from pg_stat_activity \
          where datname = current_database() and backend_type is null",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        hidden > 0,
        "the relay's role sees every session: nothing is tested"
    );
    an_older_transactions_row_after_a_drain(&ctx, pool.clone()).await;
    drop_role(&ctx, &role, pool).await;
    ctx.delete_stream().await;
}

/// A role with every privilege on the test database's tables and nothing more, and a pool of
/// the relay's size on it.
async fn role_pool(ctx: &Ctx) -> (String, PgPool) {
    let role = format!("relay_{}", unique_token().to_lowercase());
    for statement in [
        format!("create role {role} login"),
        format!("grant all on all tables in schema public to {role}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(ctx.pool())
            .await
            .unwrap();
    }
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(RelayConfig::default().pool_size())
        .connect_with(ctx.db.options.clone().username(&role))
        .await
        .expect("connect as the relay's role");
    (role, pool)
}

/// Closes `pool` and drops the role of [`role_pool`].
async fn drop_role(ctx: &Ctx, role: &str, pool: PgPool) {
    pool.close().await;
    for statement in [format!("drop owned by {role}"), format!("drop role {role}")] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(ctx.pool())
            .await
            .unwrap();
    }
}

/// Where `select` on `pg_locks`, `pg_stat_activity` or `pg_prepared_xacts` is revoked from
/// `public`, the relay cannot sample the running transactions for its horizon; batches driven by
/// their caller (`Relay::run_once`) publish all the same, each row once and in order
/// (`Relay::run`'s lanes: the CLI's `process::a_relay_that_cannot_sample_...`). Each view in
/// turn, on a subject of its own, granted again before the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_publish_in_order_where_the_running_transactions_cannot_be_sampled() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("ledger.entry.posted");
    let (role, pool) = role_pool(&ctx).await;
    let mut expected = Vec::new();
    for view in ["pg_locks", "pg_stat_activity", "pg_prepared_xacts"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "revoke select on pg_catalog.{view} from public"
        )))
        .execute(ctx.pool())
        .await
        .unwrap();
        let refused = sqlx::query(sqlx::AssertSqlSafe(format!("select count(*) from {view}")))
            .execute(&pool)
            .await
            .expect_err("the role can read the view: nothing is tested");
        assert!(
            refused.to_string().contains("permission denied"),
            "{view}: {refused}"
        );
        let ids = insert_ordered(ctx.pool(), &event_type, &format!("acct-{view}"), 300).await;
        let relay = relay_on(&ctx, pool.clone(), RelayConfig::default()).await;
        let drained = outbox_testkit::drain(&relay).await;
        assert_eq!(drained.published, ids.len(), "{view}: every row published");
        expected.extend(ids.iter().map(Uuid::to_string));
        let stored: Vec<String> = ctx
            .read_stream()
            .await
            .into_iter()
            .map(|m| m.msg_id)
            .collect();
        assert_eq!(
            stored, expected,
            "{view}: the stream has each row once, in order"
        );
        drop(relay);
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "grant select on pg_catalog.{view} to public"
        )))
        .execute(ctx.pool())
        .await
        .unwrap();
    }
    drop_role(&ctx, &role, pool).await;
    ctx.delete_stream().await;
}

/// A row set unpublished again by hand (as an operator might, or as a Postgres crash that
/// forgot a batch's marks leaves it) lies behind the lane's cursor once a backlog has been
/// drained: the lane's sweep finds it within a second or so, not at the fallback poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_set_unpublished_by_hand_behind_the_cursor_goes_out_within_the_sweep() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("ledger.entry.posted");
    let backlog = insert_ordered(ctx.pool(), &event_type, "acct-1", 2_000).await;
    let relay = one_lane(&ctx).await;
    let (stop, running) = run_relay(relay.clone());
    eventually(Duration::from_secs(30), "the backlog published", || async {
        published(ctx.pool(), &backlog).await == backlog.len() as i64
    })
    .await;
    let first = backlog[0];
    sqlx::query("update outbox_events set published_at = null where id = $1")
        .bind(first)
        .execute(ctx.pool())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(12),
        "the row set unpublished by hand published again",
        || async { published(ctx.pool(), &[first]).await == 1 },
    )
    .await;
    stop.send(()).unwrap();
    running.await.unwrap();
    ctx.delete_stream().await;
}

/// A sweep that finds a row before the cursor sends the cursor back to the start of the table,
/// behind a held subject's rows: the lane reads past them window after window at once, not one
/// window per wake-up (with 10,000 rows held, that was 20 wake-ups: 20 s when nothing else
/// commits), so a healthy event committed then goes out at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_sweep_finds_a_row_the_lane_reads_past_a_held_subjects_rows_at_once() {
    const HELD: i64 = 10_000;
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let nowhere = format!("{}.acme.order.created", unique_token()); // no stream captures it
    let held = insert_ordered(ctx.pool(), &nowhere, "held-1", HELD).await;
    let event_type = ctx.event_type("ledger.entry.posted");
    let schemas = open_schemas(std::slice::from_ref(&event_type));
    let relay = one_lane(&ctx).await;
    let (stop, running) = run_relay(relay.clone());
    held_heads(&ctx, 1, Duration::from_secs(60)).await;
    let first = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&event_type, "billing", "acct-1").numbered(1),
    )
    .await;
    eventually(
        Duration::from_secs(60),
        "a healthy event published",
        || async { published(ctx.pool(), &[first]).await == 1 },
    )
    .await;
    // a row written by hand in the past: the sweep finds it and the cursor starts over
    let past: Uuid = sqlx::query_scalar(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
         values (gen_random_uuid(), $1, 'billing', 'acct-2', now(), '{}', '1999-12-31 23:59:59+00') \
         returning id",
    )
    .bind(&event_type)
    .fetch_one(ctx.pool())
    .await
    .unwrap();
    // the sweep steps a window a second below the cursor, from where its last step ended: it
    // may take a second per window held before the cursor (docs/relay.md, *The sweep*)
    eventually(
        Duration::from_secs(HELD as u64 / 500 + 20),
        "the row written in the past published",
        || async { published(ctx.pool(), &[past]).await == 1 },
    )
    .await;
    let next = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&event_type, "billing", "acct-1").numbered(2),
    )
    .await;
    eventually(
        Duration::from_secs(8),
        "the next healthy event published past the held rows",
        || async { published(ctx.pool(), &[next]).await == 1 },
    )
    .await;
    assert_eq!(
        published(ctx.pool(), &held).await,
        0,
        "the held subject's rows wait behind its head"
    );
    stop.send(()).unwrap();
    running.await.unwrap();
    ctx.delete_stream().await;
}

/// A transaction that runs for long holds the horizon, and so the cursor, back; a held
/// subject's rows committed after it fill the window at the cursor. Rows committed after them
/// are found by reading on, window after window, not when the long transaction ends (the
/// claim used to stop at a window with nothing claimable in it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_subjects_rows_after_a_long_transactions_start_hold_nothing_else_up() {
    const HELD: i64 = 5_000;
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("ledger.entry.posted");
    let schemas = open_schemas(std::slice::from_ref(&event_type));
    let relay = one_lane(&ctx).await;
    let (stop, running) = run_relay(relay.clone());
    let first = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&event_type, "billing", "acct-1").numbered(1),
    )
    .await;
    eventually(Duration::from_secs(30), "the relay publishes", || async {
        published(ctx.pool(), &[first]).await == 1
    })
    .await;
    // begun after the relay's first look at the running transactions, so its start is known
    // and the horizon stays just before it
    let mut long = ctx.pool().begin().await.unwrap();
    sqlx::query("select txid_current()")
        .execute(&mut *long)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let nowhere = format!("{}.acme.order.created", unique_token()); // no stream captures it
    let held = insert_ordered(ctx.pool(), &nowhere, "held-1", HELD).await;
    held_heads(&ctx, 1, Duration::from_secs(30)).await;
    let next = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&event_type, "billing", "acct-1").numbered(2),
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "the next healthy event published while the long transaction runs",
        || async { published(ctx.pool(), &[next]).await == 1 },
    )
    .await;
    assert_eq!(published(ctx.pool(), &held).await, 0);
    long.rollback().await.unwrap();
    stop.send(()).unwrap();
    running.await.unwrap();
    ctx.delete_stream().await;
}

/// `Relay::run_once` behind a held subject's rows: one call reads past the windows of rows it
/// cannot claim and publishes what follows them, so that a caller's
/// `while relay.run_once().await?.claimed > 0 {}` does not stop at the first such window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_once_reads_past_a_held_subjects_rows_in_one_call() {
    const HELD: i64 = 2_000;
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("ledger.entry.posted");
    let schemas = open_schemas(std::slice::from_ref(&event_type));
    let held = insert_ordered(ctx.pool(), &event_type, "held-1", HELD).await;
    sqlx::query(
        "insert into outbox_retries (subject, event_id, retry_at, reason) \
         values ('held-1', $1, null, 'held by the test')",
    )
    .bind(held[0])
    .execute(ctx.pool())
    .await
    .unwrap();
    let mut healthy = Vec::new();
    for n in 0..10 {
        healthy.push(
            emit_committed(
                ctx.pool(),
                &schemas,
                raw_event(&event_type, "billing", format!("acct-{n}")).numbered(n),
            )
            .await,
        );
    }
    let relay = relay(&ctx, RelayConfig::default()).await;
    let report = relay.run_once().await.expect("one batch");
    assert_eq!(
        report.published, 10,
        "one call publishes the events after the held rows: {report:?}"
    );
    assert_eq!(published(ctx.pool(), &healthy).await, 10);
    assert_eq!(published(ctx.pool(), &held).await, 0);
    ctx.delete_stream().await;
}

/// A row whose `created_at` lies before the cursor (a writer whose clock is a minute behind the
/// database's, inserting by hand) and a newer row of its subject committed right after it: the
/// newer one is not published until the older one is, even by a claim that runs before the
/// sweep has found the older one. `Relay::run_once` makes the interleaving exact: the first call
/// moves the cursor and sweeps, the next ones run within the sweep's second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_dated_before_the_cursor_goes_out_before_the_newer_rows_of_its_subject() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("ledger.entry.posted");
    let schemas = open_schemas(std::slice::from_ref(&event_type));
    let relay = relay(&ctx, RelayConfig::default()).await;
    let warm = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&event_type, "billing", "acct-warm"),
    )
    .await;
    while published(ctx.pool(), &[warm]).await == 0 {
        relay.run_once().await.expect("a batch");
    }
    // a second later the horizon (sampled every 200 ms at most) has moved on, and the cursor
    // with it; the next call's sweep finds nothing before it, and the next sweep is a second
    // away
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    relay.run_once().await.expect("a batch");
    relay.run_once().await.expect("a batch");
    let late: Uuid = sqlx::query_scalar(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
         values (gen_random_uuid(), $1, 'skewed', 'acct-1', now(), '{\"n\": 1}', \
                 clock_timestamp() - interval '60 seconds') \
         returning id",
    )
    .bind(&event_type)
    .fetch_one(ctx.pool())
    .await
    .unwrap();
    let newer = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&event_type, "billing", "acct-1").numbered(2),
    )
    .await;
    let report = relay.run_once().await.expect("a batch");
    assert_eq!(
        published(ctx.pool(), &[newer]).await,
        published(ctx.pool(), &[late]).await,
        "the newer row goes out only with or after the older one: {report:?}"
    );
    eventually(Duration::from_secs(10), "both rows published", || async {
        relay.run_once().await.expect("a batch");
        published(ctx.pool(), &[late, newer]).await == 2
    })
    .await;
    let order: Vec<String> = ctx
        .read_stream()
        .await
        .into_iter()
        .filter(|d| d.envelope.subject == "acct-1")
        .map(|d| d.msg_id)
        .collect();
    assert_eq!(order, vec![late.to_string(), newer.to_string()]);
    ctx.delete_stream().await;
}

/// A transaction running at the relay's first sample began at an unknown time: until it ends
/// the relay has no horizon, and its cursors stay at the start of the table, with nothing
/// below them to sweep. Its idle lanes then wait for a commit or the poll as any lane does; they
/// used to wake for their overdue sweep at once, and claim in a loop. A commit meanwhile is
/// published, read from the start of the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_relay_without_a_horizon_waits_instead_of_claiming_in_a_loop() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("ledger.entry.posted");
    let schemas = open_schemas(std::slice::from_ref(&event_type));
    let mut open = ctx.pool().begin().await.unwrap();
    sqlx::query("select 1").execute(&mut *open).await.unwrap();
    let relay = relay(&ctx, RelayConfig::default()).await;
    let (stop, running) = run_relay(relay.clone());
    let first = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&event_type, "billing", "acct-1").numbered(1),
    )
    .await;
    eventually(
        Duration::from_secs(15),
        "the first event published",
        || async { published(ctx.pool(), &[first]).await == 1 },
    )
    .await;
    // past the lanes' first sweep step (a second after they start), which is overdue from
    // then on for a cursor with nothing below it
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = relay.stats().claims;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let claims = relay.stats().claims - before;
    // two lanes, each waking for the poll (5 s) at most once in 3 s; in a loop, thousands
    assert!(claims <= 10, "{claims} claims in 3 s by an idle relay");
    let second = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&event_type, "billing", "acct-1").numbered(2),
    )
    .await;
    eventually(Duration::from_secs(15), "a commit published", || async {
        published(ctx.pool(), &[second]).await == 1
    })
    .await;
    open.rollback().await.unwrap();
    stop.send(()).unwrap();
    running.await.unwrap();
    let stored: Vec<String> = ctx
        .read_stream()
        .await
        .into_iter()
        .map(|m| m.msg_id)
        .collect();
    assert_eq!(
        stored,
        [first.to_string(), second.to_string()],
        "each once, in order"
    );
    ctx.delete_stream().await;
}
