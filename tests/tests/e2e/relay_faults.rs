//! Rows and locks a relay meets in ordinary operation that must not park healthy events: rows
//! of one instant written by SQL, a lock taken by hand on a subject's head, rows no relay can
//! publish (poison), overlapping writers of one subject.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

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
