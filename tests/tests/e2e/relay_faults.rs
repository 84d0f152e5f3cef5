//! Rows and locks a relay meets in ordinary operation that must not park healthy events: rows
//! of one instant written by SQL, a lock taken by hand on a subject's head, rows no relay can
//! publish (poison), overlapping writers of one subject, and many relays beside an application
//! on Postgres's default lock table.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::relay::LOCK_NAMESPACE;
use outbox_runtime::{EmitExt, Relay, RelayConfig};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{
    emit_committed, eventually, open_schemas, raw_event, run_relay, unique_token,
};
use sqlx::PgPool;
use uuid::Uuid;

/// Inserts `n` rows of `subject` in one SQL transaction, the way another service following the
/// contract's DDL would: random ids, the column default for `created_at`. Returns their ids in
/// the relay's order.
async fn insert_same_instant(pool: &PgPool, event_type: &str, subject: &str, n: i64) -> Vec<Uuid> {
    sqlx::query_scalar(
        "insert into outbox_events (id, event_type, source, subject, time, data) \
         select gen_random_uuid(), $1, 'backfill', $2, now(), jsonb_build_object('n', g) \
           from generate_series(1, $3) g \
         returning id",
    )
    .bind(event_type)
    .bind(subject)
    .bind(n)
    .fetch_all(pool)
    .await
    .map(|mut ids: Vec<Uuid>| {
        ids.sort(); // one instant: the relay orders them by id
        ids
    })
    .expect("insert the backfill")
}

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

/// The ids of the test's stream per envelope subject, in stream order.
async fn stream_by_subject(ctx: &Ctx) -> HashMap<String, Vec<Uuid>> {
    let mut seen: HashMap<String, Vec<Uuid>> = HashMap::new();
    for m in ctx.read_stream().await {
        seen.entry(m.envelope.subject.clone())
            .or_default()
            .push(m.envelope.id);
    }
    seen
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_one_instant_are_published_in_id_order_beside_other_subjects() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("backfill.row.imported");
    let schemas = open_schemas(std::slice::from_ref(&event_type));
    let backfill = insert_same_instant(ctx.pool(), &event_type, "same-instant", 600).await;
    let mut others = HashMap::new();
    for n in 0..10 {
        let subject = format!("other-{n}");
        let id = emit_committed(
            ctx.pool(),
            &schemas,
            raw_event(&event_type, "billing", &subject).numbered(n),
        )
        .await;
        others.insert(subject, vec![id]);
    }
    let relay = relay(&ctx, RelayConfig::default()).await;
    let (stop, running) = run_relay(relay.clone());
    eventually(
        Duration::from_secs(20),
        "the backfill and the other subjects published",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    stop.send(()).unwrap();
    running.await.unwrap();
    let seen = stream_by_subject(&ctx).await;
    assert_eq!(seen["same-instant"], backfill, "one instant, ordered by id");
    for (subject, ids) in &others {
        assert_eq!(&seen[subject], ids);
    }
    assert_eq!(relay.stats().skipped, 0, "no batch was cut");
    ctx.delete_stream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_by_hand_on_a_subjects_head_holds_that_subject_only() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("locked.row.changed");
    let schemas = open_schemas(std::slice::from_ref(&event_type));
    let locked = insert_ordered(ctx.pool(), &event_type, "locked", 600).await;
    // an operator's open `select ... for update` on the subject's oldest row
    let mut operator = ctx.pool().begin().await.unwrap();
    sqlx::query("select 1 from outbox_events where id = $1 for update")
        .bind(locked[0])
        .execute(&mut *operator)
        .await
        .unwrap();
    let relay = relay(&ctx, RelayConfig::default()).await;
    let (stop, running) = run_relay(relay.clone());
    let mut others = Vec::new();
    for n in 0..50 {
        let event = raw_event(&event_type, "billing", format!("other-{n}")).numbered(n);
        others.push(emit_committed(ctx.pool(), &schemas, event).await);
    }
    eventually(
        Duration::from_secs(10),
        "the other subjects flow past the locked one",
        || async { published(ctx.pool(), &others).await == 50 },
    )
    .await;
    assert_eq!(
        published(ctx.pool(), &locked).await,
        0,
        "nothing of the locked subject overtakes its head"
    );
    operator.rollback().await.unwrap();
    eventually(
        Duration::from_secs(30),
        "the subject resumes when the lock goes",
        || async { published(ctx.pool(), &locked).await == 600 },
    )
    .await;
    stop.send(()).unwrap();
    running.await.unwrap();
    assert_eq!(stream_by_subject(&ctx).await["locked"], locked, "in order");
    ctx.delete_stream().await;
}

/// A poison row written by SQL, with a healthy row of the same subject behind it.
struct Poison {
    name: &'static str,
    subject: String,
    head: Uuid,
    behind: Uuid,
}

async fn insert_poison(
    pool: &PgPool,
    name: &'static str,
    event_type: &str,
    subject: &str,
    time: &str,
    data: &str,
) -> Poison {
    let insert = |event_type: String, time: String, data: String, offset: i32| {
        let pool = pool.clone();
        let subject = subject.to_owned();
        async move {
            sqlx::query_scalar::<_, Uuid>(sqlx::AssertSqlSafe(format!(
                "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
                 values (gen_random_uuid(), $1, 'hand', $2, {time}, {data}, clock_timestamp() + interval '{offset} microseconds') \
                 returning id"
            )))
            .bind(event_type)
            .bind(subject)
            .fetch_one(&pool)
            .await
            .unwrap_or_else(|e| panic!("insert the {name} row: {e}"))
        }
    };
    let head = insert(event_type.to_owned(), time.to_owned(), data.to_owned(), 0).await;
    let healthy_type = event_type.split('.').next().unwrap().to_owned() + ".healthy.row.behind";
    let behind = insert(healthy_type, "now()".into(), "'{}'::jsonb".into(), 1).await;
    Poison {
        name,
        subject: subject.to_owned(),
        head,
        behind,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_rows_are_held_alone_with_their_subject_and_never_stop_the_relay() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let healthy_type = ctx.event_type("healthy.row.changed");
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data) \
         select gen_random_uuid(), $1, 'billing', 'healthy-' || (g % 100), now(), jsonb_build_object('n', g) \
           from generate_series(1, 1000) g",
    )
    .bind(&healthy_type)
    .execute(ctx.pool())
    .await
    .unwrap();
    let p = &ctx.prefix;
    let nowhere = format!("{}.acme.order.created", unique_token()); // no stream captures it
    let ok_type = ctx.event_type("acme.order.created");
    let deep = format!("'{}{}'::jsonb", "[".repeat(200), "]".repeat(200));
    let big = "jsonb_build_object('blob', repeat('x', 2 * 1024 * 1024))".to_owned();
    let poisons = vec![
        insert_poison(
            ctx.pool(),
            "infinite time",
            &ok_type,
            "p-time",
            "'infinity'",
            "'{}'::jsonb",
        )
        .await,
        insert_poison(
            ctx.pool(),
            "wildcard type",
            &format!("{p}.acme.order.*"),
            "p-wild",
            "now()",
            "'{}'::jsonb",
        )
        .await,
        insert_poison(
            ctx.pool(),
            "5,000-character type",
            &format!("{p}.{}", "x".repeat(5_000)),
            "p-long",
            "now()",
            "'{}'::jsonb",
        )
        .await,
        insert_poison(ctx.pool(), "2 MB payload", &ok_type, "p-big", "now()", &big).await,
        insert_poison(
            ctx.pool(),
            "type no stream captures",
            &nowhere,
            "p-nostream",
            "now()",
            "'{}'::jsonb",
        )
        .await,
        insert_poison(
            ctx.pool(),
            "JSON nested 200 deep",
            &ok_type,
            "p-deep",
            "now()",
            &deep,
        )
        .await,
        insert_poison(
            ctx.pool(),
            "poison on platform",
            &ok_type,
            "platform",
            "'-infinity'",
            "'{}'::jsonb",
        )
        .await,
    ];
    let client = outbox_testkit::connect_nats(&outbox_testkit::nats_url()).await;
    let config = RelayConfig::default();
    let pool = ctx.db.new_pool(config.pool_size()).await;
    let relay = Arc::new(
        Relay::new(pool, async_nats::jetstream::new(client.clone()), config)
            .await
            .unwrap(),
    );
    let (stop, running) = run_relay(relay.clone());
    eventually(
        Duration::from_secs(10),
        "the healthy subjects drain",
        || async {
            sqlx::query_scalar::<_, i64>(
                "select count(*) from outbox_events where event_type = $1 and published_at is null",
            )
            .bind(&healthy_type)
            .fetch_one(ctx.pool())
            .await
            .unwrap()
                == 0
        },
    )
    .await;
    eventually(Duration::from_secs(10), "every poison row held", || async {
        outbox_runtime::status::status(ctx.pool(), 20)
            .await
            .unwrap()
            .held_total
            == poisons.len() as i64
    })
    .await;
    assert!(!running.is_finished(), "the relay is still running");
    let status = outbox_runtime::status::status(ctx.pool(), 20)
        .await
        .unwrap();
    for poison in &poisons {
        let held = status
            .held
            .iter()
            .find(|h| h.id == poison.head)
            .unwrap_or_else(|| {
                panic!(
                    "the {} row is held and listed: {:?}",
                    poison.name, status.held
                )
            });
        assert!(!held.reason.is_empty(), "{}: a reason", poison.name);
        assert_eq!(held.subject, poison.subject);
        let behind: (i32, bool) = sqlx::query_as(
            "select attempts, published_at is not null from outbox_events where id = $1",
        )
        .bind(poison.behind)
        .fetch_one(ctx.pool())
        .await
        .unwrap();
        assert_eq!(
            behind,
            (0, false),
            "{}: the row behind it waits, never attempted",
            poison.name
        );
        eprintln!("{}: {}", poison.name, held.reason);
    }
    let reason = |name: &str| {
        let head = poisons.iter().find(|p| p.name == name).unwrap().head;
        status
            .held
            .iter()
            .find(|h| h.id == head)
            .unwrap()
            .reason
            .clone()
    };
    assert!(reason("infinite time").contains("infinity"));
    assert!(reason("wildcard type").contains("wildcard"));
    assert!(reason("5,000-character type").contains("bytes"));
    assert!(reason("2 MB payload").contains("max_payload"));
    assert!(reason("type no stream captures").contains("no stream captures"));
    assert!(reason("JSON nested 200 deep").contains("200 levels"));
    assert!(
        client
            .statistics()
            .connects
            .load(std::sync::atomic::Ordering::Relaxed)
            <= 2,
        "the relay's connection dropped at most once"
    );
    stop.send(()).unwrap();
    running.await.unwrap();
    ctx.delete_stream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_writers_of_one_subject_reach_the_stream_in_commit_order() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("account.balance.changed");
    let schemas = open_schemas(std::slice::from_ref(&event_type));
    let relay = relay(&ctx, RelayConfig::default()).await;
    let (stop, running) = run_relay(relay.clone());

    // Without a lock between them: the earlier emit commits last, and is published last.
    let mut earlier = ctx.pool().begin().await.unwrap();
    let first = earlier
        .emit_raw(
            &schemas,
            raw_event(&event_type, "ledger", "acct-1")
                .numbered(1)
                .build(),
        )
        .await
        .unwrap();
    let second = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&event_type, "ledger", "acct-1").numbered(2),
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "the later emit, committed first, is published",
        || async { published(ctx.pool(), &[second]).await == 1 },
    )
    .await;
    earlier.commit().await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the earlier emit is published once it commits",
        || async { published(ctx.pool(), &[first]).await == 1 },
    )
    .await;
    assert_eq!(
        stream_by_subject(&ctx).await["acct-1"],
        [second, first],
        "commit order, not emit order"
    );

    // Writers that serialise on the entity's row: emit order, commit order and stream order agree.
    sqlx::query("create table accounts (id text primary key, balance int not null)")
        .execute(ctx.pool())
        .await
        .unwrap();
    sqlx::query("insert into accounts values ('acct-2', 0)")
        .execute(ctx.pool())
        .await
        .unwrap();
    let mut one = ctx.pool().begin().await.unwrap();
    sqlx::query("update accounts set balance = balance + 1 where id = 'acct-2'")
        .execute(&mut *one)
        .await
        .unwrap();
    let a = one
        .emit_raw(
            &schemas,
            raw_event(&event_type, "ledger", "acct-2")
                .numbered(1)
                .build(),
        )
        .await
        .unwrap();
    let pool = ctx.pool().clone();
    let schemas2 = schemas.clone();
    let event_type2 = event_type.clone();
    let other = tokio::spawn(async move {
        let mut two = pool.begin().await.unwrap();
        // waits for the first writer's row lock
        sqlx::query("update accounts set balance = balance + 1 where id = 'acct-2'")
            .execute(&mut *two)
            .await
            .unwrap();
        let b = two
            .emit_raw(
                &schemas2,
                raw_event(&event_type2, "ledger", "acct-2")
                    .numbered(2)
                    .build(),
            )
            .await
            .unwrap();
        two.commit().await.unwrap();
        b
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    one.commit().await.unwrap();
    let b = other.await.unwrap();
    eventually(Duration::from_secs(10), "both published", || async {
        published(ctx.pool(), &[a, b]).await == 2
    })
    .await;
    assert_eq!(stream_by_subject(&ctx).await["acct-2"], [a, b]);
    stop.send(()).unwrap();
    running.await.unwrap();
    ctx.delete_stream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_relays_of_two_lanes_stay_inside_the_default_lock_table_beside_an_application() {
    const RELAYS: usize = 8;
    const EVENTS: i64 = 20_000;
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("busy.row.changed");
    let mut expected: HashMap<String, Vec<Uuid>> = HashMap::new();
    let ids: Vec<(Uuid, String)> = sqlx::query_as(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
         select gen_random_uuid(), $1, 'billing', 's-' || (g % 5000), now(), jsonb_build_object('n', g), \
                now() + g * interval '1 microsecond' \
           from generate_series(1, $2) g order by g returning id, subject",
    )
    .bind(&event_type)
    .bind(EVENTS)
    .fetch_all(ctx.pool())
    .await
    .unwrap();
    for (id, subject) in ids {
        expected.entry(subject).or_default().push(id);
    }
    // the application: transactions that take many locks of their own while the relays drain
    let app = ctx.db.new_pool(4).await;
    let stop_app = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut app_tasks = Vec::new();
    for worker in 0..4i32 {
        let (app, stop_app) = (app.clone(), stop_app.clone());
        app_tasks.push(tokio::spawn(async move {
            let mut done = 0u64;
            while !stop_app.load(std::sync::atomic::Ordering::Relaxed) {
                let mut tx = app
                    .begin()
                    .await
                    .expect("the application's transaction begins");
                sqlx::query("select pg_advisory_xact_lock($1, g) from generate_series(1, 40) g")
                    .bind(1000 + worker)
                    .execute(&mut *tx)
                    .await
                    .expect("the application's locks (no `out of shared memory`)");
                tx.commit().await.expect("the application commits");
                done += 1;
            }
            done
        }));
    }
    let mut relays = Vec::new();
    for _ in 0..RELAYS {
        let r = relay(
            &ctx,
            RelayConfig {
                lanes: 2,
                ..Default::default()
            },
        )
        .await;
        relays.push((r.clone(), run_relay(r)));
    }
    let mut most_locks = 0i64;
    let started = std::time::Instant::now();
    while ctx.db.unpublished().await > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the relays did not drain the backlog"
        );
        let locks: i64 = sqlx::query_scalar(
            "select count(*) from pg_locks where locktype = 'advisory' and classid = $1::oid and granted \
               and objid::int8 < 4294967295 \
               and database = (select oid from pg_database where datname = current_database())",
        )
        .bind(LOCK_NAMESPACE as i64)
        .fetch_one(ctx.pool())
        .await
        .unwrap();
        most_locks = most_locks.max(locks);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop_app.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in app_tasks {
        assert!(
            task.await.unwrap() > 0,
            "the application ran beside the relays"
        );
    }
    let partitions = RelayConfig::default().partitions as i64;
    eprintln!("at most {most_locks} relay advisory locks at once (bound: {partitions})");
    assert!(
        most_locks <= partitions,
        "{most_locks} relay advisory locks, more than the {partitions} partitions"
    );
    for (relay, (stop, running)) in relays {
        stop.send(()).unwrap();
        running.await.unwrap();
        assert_eq!(relay.stats().failed, 0);
    }
    assert_eq!(
        stream_by_subject(&ctx).await,
        expected,
        "every event once, each subject in order"
    );
    ctx.delete_stream().await;
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
    const STEADY: Duration = Duration::from_secs(60);
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
    eventually(
        Duration::from_secs(120),
        "every failing subject held",
        || async {
            outbox_runtime::status::status(ctx.pool(), 20)
                .await
                .unwrap()
                .held_total
                == FAILING
        },
    )
    .await;
    tokio::time::sleep(STATS_FLUSH).await;
    let before = unpublished_index_reads(ctx.pool()).await;

    // A steady 200 events a second of a healthy type, for a minute.
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

/// A lane's floor follows the rows it publishes: once a backlog is drained, the lane's
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
    // with this backlog before floors followed); one that starts after them, a few pages
    // (4.4). Each lane also looks below its floor once a second while events come (a walk
    // of the whole index, by design), so the slower the machine emits, the more those looks
    // weigh in the mean (10.1 on a busy CI machine): the bound is a quarter of a walk.
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
/// start, older than every backlog row), notifies and commits: the row must go out at once,
/// not at the lane's look below its floor (every `6 * poll_interval`, a minute here).
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
        // one lane: the backlog's floor is the one the later row meets
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
    // well before the poll (10 s) and the look below the floor (60 s)
    eventually(
        Duration::from_secs(5),
        "the older transaction's row published once it commits",
        || async { published(ctx.pool(), &[id]).await == 1 },
    )
    .await;
    stop.send(()).unwrap();
    running.await.unwrap();
}

/// The floor never passes a transaction that was running when the batch that moved it began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_older_than_a_drained_backlog_is_published_when_it_commits() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let pool = ctx.db.new_pool(RelayConfig::default().pool_size()).await;
    an_older_transactions_row_after_a_drain(&ctx, pool).await;
    ctx.delete_stream().await;
}

/// The same, with the relay on a role that cannot see the other role's sessions (no
/// `pg_read_all_stats`): not knowing when they began, its floors stay where they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_cannot_see_every_session_does_not_pass_an_older_transaction() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
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
    pool.close().await;
    for statement in [format!("drop owned by {role}"), format!("drop role {role}")] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(ctx.pool())
            .await
            .unwrap();
    }
    ctx.delete_stream().await;
}

/// A row set unpublished again by hand (as an operator might, or as a Postgres crash that
/// forgot a batch's marks leaves it) lies behind the lane's floor once a backlog has been
/// drained: with no subject parked the lane looks there every second, so it goes out within
/// the fallback poll, not at the long look of `6 * poll_interval` (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_set_unpublished_by_hand_behind_the_floor_goes_out_within_the_poll() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("ledger.entry.posted");
    let backlog = insert_ordered(ctx.pool(), &event_type, "acct-1", 2_000).await;
    let relay = relay(
        &ctx,
        RelayConfig {
            lanes: 1,
            ..RelayConfig::default()
        },
    )
    .await;
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
