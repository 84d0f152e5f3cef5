//! What another role sharing the database can do to the relay: take its advisory lock keys,
//! send notifications on its channel, or release a held subject without `outbox unblock`'s
//! notification. Each delays the relay within a stated bound, and steers nothing.

use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::relay::LOCK_NAMESPACE;
use outbox_runtime::{Relay, RelayConfig, NOTIFY_CHANNEL, NOTIFY_KEY, WAKE_KEY};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{emit_committed, eventually, open_schemas, raw_event, run_relay};
use uuid::Uuid;

/// Whether event `id` is marked published.
pub(crate) async fn published(ctx: &Ctx, id: Uuid) -> bool {
    sqlx::query_scalar("select published_at is not null from outbox_events where id = $1")
        .bind(id)
        .fetch_one(ctx.pool())
        .await
        .unwrap()
}

/// How long after its commit each of `n` events, emitted one at a time, was published (the
/// slowest), and whether the relay made more than `max_claims_per_s` claims a second meanwhile.
async fn slowest_of(ctx: &Ctx, relay: &Relay, ty: &str, n: usize) -> (Duration, f64) {
    let schemas = open_schemas(&[ty.to_owned()]);
    let claims = relay.stats().claims;
    let started = std::time::Instant::now();
    let mut slowest = Duration::ZERO;
    for i in 0..n {
        let id = emit_committed(
            ctx.pool(),
            &schemas,
            raw_event(ty, "billing", format!("s-{}", i % 3)).numbered(i),
        )
        .await;
        let committed = std::time::Instant::now();
        eventually(Duration::from_secs(10), "the event published", || async {
            published(ctx, id).await
        })
        .await;
        slowest = slowest.max(committed.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let per_second = (relay.stats().claims - claims) as f64 / started.elapsed().as_secs_f64();
    (slowest, per_second)
}

/// Another role holds one of the relay's lock keys: the notify lock exclusively (emits notify
/// on every commit) or shared (the relay can never take it), or the wake lock either way (the
/// relay can never know that emits in flight have ended). The relay's lanes linger, claiming
/// at most 20 times a second each, and every event still goes out within a claim and a 50 ms
/// linger of its commit. Nothing another role holds stops the relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_holding_the_relays_lock_keys_only_delays_it_within_a_bound() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let ty = ctx.event_type("billing.invoice.paid");
    let config = RelayConfig {
        event_types: vec![ty.clone()],
        poll_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    for (how, key) in [
        (None, NOTIFY_KEY),
        (Some("pg_advisory_lock"), NOTIFY_KEY),
        (Some("pg_advisory_lock_shared"), NOTIFY_KEY),
        (Some("pg_advisory_lock"), WAKE_KEY),
        (Some("pg_advisory_lock_shared"), WAKE_KEY),
    ] {
        let mut foreign = ctx.pool().acquire().await.unwrap();
        if let Some(how) = how {
            sqlx::query(sqlx::AssertSqlSafe(format!("select {how}($1, $2)")))
                .bind(LOCK_NAMESPACE)
                .bind(key)
                .execute(&mut *foreign)
                .await
                .unwrap();
        }
        let relay = Arc::new(
            Relay::new(ctx.pool().clone(), ctx.js.clone(), config.clone())
                .await
                .unwrap(),
        );
        let (stop, running) = run_relay(relay.clone());
        let (slowest, claims_per_s) = slowest_of(&ctx, &relay, &ty, 8).await;
        let held = how.map_or("nothing".to_owned(), |how| format!("{how}({key})"));
        eprintln!(
            "{held} held by another role: slowest event {slowest:?}, {claims_per_s:.0} claims/s"
        );
        assert!(
            slowest < Duration::from_secs(2),
            "{held} held by another role: an event waited {slowest:?}"
        );
        assert!(
            claims_per_s < 200.0,
            "{held} held by another role: {claims_per_s:.0} claims/s, a hot loop"
        );
        stop.send(()).unwrap();
        running.await.unwrap();
        let _ = foreign.detach();
    }
    ctx.delete_stream().await;
}

/// Notifications on the relay's channel from another role (any role may send them) only wake
/// it: a flood of them makes it claim, coalesced while a claim runs, and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_notifications_from_another_role_only_makes_the_relay_claim() {
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
    let id = emit_committed(ctx.pool(), &schemas, raw_event(&ty, "billing", "a").build()).await;
    eventually(Duration::from_secs(10), "published", || async {
        published(&ctx, id).await
    })
    .await;
    let claims = relay.stats().claims;
    let started = std::time::Instant::now();
    let (mut sent, mut woken) = (0u64, 0u64);
    let lanes = RelayConfig::default().lanes as u64;
    while started.elapsed() < Duration::from_secs(2) {
        for payload in ["", "release", "relays", "0", "1023"] {
            // a partition wakes the lane that owns it; anything else wakes every lane
            woken += if payload.parse::<u16>().is_ok() {
                1
            } else {
                lanes
            };
            sqlx::query("select pg_notify($1, $2)")
                .bind(NOTIFY_CHANNEL)
                .bind(payload)
                .execute(ctx.pool())
                .await
                .unwrap();
            sent += 1;
        }
    }
    let claimed = relay.stats().claims - claims;
    let seconds = started.elapsed().as_secs() + 1;
    // at most a claim per lane each notification wakes (fewer, coalesced while a claim runs),
    // and each lane's claims on its own clock: its sweep once a second, and its lingering
    // claims (1 ms doubling to 50 ms) after an empty claim while the wake lock is not held, at
    // most 28 a second
    let bound = woken + lanes * seconds * 30;
    eprintln!("{sent} notifications woke {woken} lanes and made {claimed} claims (bound {bound})");
    assert!(
        claimed <= bound,
        "at most a claim per lane a notification wakes, and the lanes' own"
    );
    let id = emit_committed(ctx.pool(), &schemas, raw_event(&ty, "billing", "a").build()).await;
    eventually(
        Duration::from_secs(10),
        "published after the flood",
        || async { published(&ctx, id).await },
    )
    .await;
    assert_eq!(relay.stats().published, 2);
    assert_eq!(relay.stats().failed, 0);
    stop.send(()).unwrap();
    running.await.unwrap();
    ctx.delete_stream().await;
}

/// A held subject released without `outbox unblock`'s notification (its schedule made due by
/// hand, or the notification lost while the relay's listener reconnected): the relay's lanes
/// wake for their sweep once a second and find it due; its held row goes out first, then the
/// rows behind it, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_notification_is_lost_is_published_within_seconds_in_order() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let ty = ctx.event_type("billing.invoice.paid");
    // outside the test's prefix: the test's stream does not capture it
    let nowhere = format!("{}.held.row.changed", outbox_testkit::unique_token());
    let schemas = open_schemas(std::slice::from_ref(&ty));
    let config = RelayConfig {
        poll_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let relay = Arc::new(
        Relay::new(ctx.pool().clone(), ctx.js.clone(), config)
            .await
            .unwrap(),
    );
    let (stop, running) = run_relay(relay.clone());
    // a head of a type no stream captures is held, and an event of the subject waits behind it
    let head = Uuid::now_v7();
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
         values ($1, $2, 'billing', 'S', now(), '{}', clock_timestamp())",
    )
    .bind(head)
    .bind(&nowhere)
    .execute(ctx.pool())
    .await
    .unwrap();
    eventually(Duration::from_secs(20), "the head held", || async {
        sqlx::query_scalar::<_, bool>(
            "select exists (select 1 from outbox_retries where event_id = $1 and retry_at is null)",
        )
        .bind(head)
        .fetch_one(ctx.pool())
        .await
        .unwrap()
    })
    .await;
    let behind = emit_committed(ctx.pool(), &schemas, raw_event(&ty, "billing", "S").build()).await;
    // a stream now captures the head's type; the release comes with no notification
    outbox_runtime::StreamSpec {
        name: format!("{}_HELD", ctx.stream_name()),
        subjects: vec![nowhere.clone()],
        ..ctx.stream_spec()
    }
    .ensure(&ctx.js)
    .await
    .unwrap();
    sqlx::query("update outbox_retries set retry_at = now() where event_id = $1")
        .bind(head)
        .execute(ctx.pool())
        .await
        .unwrap();
    let released = std::time::Instant::now();
    eventually(Duration::from_secs(10), "both published", || async {
        published(&ctx, head).await && published(&ctx, behind).await
    })
    .await;
    let took = released.elapsed();
    eprintln!("published {took:?} after the silent release");
    let order: Vec<Uuid> = sqlx::query_scalar(
        "select id from outbox_events where subject = 'S' order by published_at, id",
    )
    .fetch_all(ctx.pool())
    .await
    .unwrap();
    assert_eq!(order, [head, behind], "the head first");
    assert!(took < Duration::from_secs(5), "the release waited {took:?}");
    stop.send(()).unwrap();
    running.await.unwrap();
    ctx.js
        .delete_stream(format!("{}_HELD", ctx.stream_name()))
        .await
        .unwrap();
    ctx.delete_stream().await;
}

/// The relay's NATS user with exactly the permissions `RelayPermissions` gives (what `outbox
/// stream ensure --print-permissions` prints) publishes and holds as a relay does, on a private
/// server; it can publish nothing else, so a row written by another role with another event
/// type cannot reach another subject through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_user_with_the_printed_permissions_publishes_and_nothing_else() {
    let token = outbox_testkit::unique_token();
    let stream = format!("PERM_{token}");
    let event_types = format!("{token}.>");
    let permissions = outbox_runtime::RelayPermissions::new(&stream, [event_types.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("nats.conf");
    std::fs::write(
        &config,
        format!(
            "authorization {{\n  users = [\n    {{ user: \"admin\", password: \"admin\" }}\n    {{ user: \"relay\", password: \"relay\", {permissions} }}\n  ]\n}}\n"
        ),
    )
    .unwrap();
    let server = outbox_testkit::NatsServer::spawn_config(outbox_testkit::NatsServerConfig {
        args: vec!["-c".into(), config.display().to_string()],
        ..Default::default()
    })
    .await;
    let admin = outbox_runtime::connect::nats(
        &server.url(),
        &outbox_runtime::connect::NatsAuth::new().user_and_password("admin", "admin"),
        async_nats::ConnectOptions::new(),
    )
    .await
    .expect("the admin logs in");
    let admin_js = async_nats::jetstream::new(admin);
    outbox_runtime::StreamSpec {
        name: stream.clone(),
        subjects: vec![event_types.clone()],
        ..Default::default()
    }
    .ensure(&admin_js)
    .await
    .unwrap();

    let db = outbox_testkit::TestDb::new().await;
    let ty = format!("{token}.invoice.paid");
    let elsewhere = format!("{}.invoice.paid", outbox_testkit::unique_token());
    let relay = Arc::new(
        Relay::connect_with(
            &db.url(),
            &server.url(),
            &outbox_runtime::connect::NatsAuth::new().user_and_password("relay", "relay"),
            RelayConfig {
                event_types: vec![ty.clone()],
                ..Default::default()
            },
        )
        .await
        .expect("the relay starts with its permissions"),
    );
    let (stop, running) = run_relay(relay.clone());
    let schemas = open_schemas(&[ty.clone(), elsewhere.clone()]);
    let mut ids = Vec::new();
    for n in 0..20 {
        ids.push(
            emit_committed(
                &db.pool,
                &schemas,
                raw_event(&ty, "billing", format!("s-{}", n % 4)).numbered(n),
            )
            .await,
        );
    }
    // a row of a type outside the relay's permissions, written by another role
    let outside = emit_committed(
        &db.pool,
        &schemas,
        raw_event(&elsewhere, "billing", "x").build(),
    )
    .await;
    eventually(
        Duration::from_secs(20),
        "the relay's events published",
        || async {
            let n: i64 = sqlx::query_scalar(
            "select count(*) from outbox_events where published_at is not null and id = any($1)",
        )
        .bind(&ids)
        .fetch_one(&db.pool)
        .await
        .unwrap();
            n == ids.len() as i64
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !sqlx::query_scalar::<_, bool>(
            "select published_at is not null from outbox_events where id = $1"
        )
        .bind(outside)
        .fetch_one(&db.pool)
        .await
        .unwrap(),
        "a row of another subject space went out through the relay's user"
    );
    assert!(
        relay.health().holds_lease,
        "its round trips through the server work"
    );
    stop.send(()).unwrap();
    running.await.unwrap();
    let stored = admin_js
        .get_stream(&stream)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .messages;
    assert_eq!(stored, ids.len() as u64);
}

/// Overloads another role may create in `public` (every role may on Postgres 13 and 14), each
/// recording that it ran, then doing what the built-in does. Postgres prefers an exact match
/// of argument types in any schema of the search path over a built-in reached by an implicit
/// cast: `unnest(anyarray)` for a `text[]` or a `uuid[]`, `numeric * numeric` (or `float8 *
/// float8`) for a product with an `int4`, `oid = oid` for `oid = regclass`; and sqlx looks up a
/// type it does not know with a statement of its own (an `int4 = oid` join, `array_agg` of
/// `name`s).
const TRAPS: &str = "
create sequence trap_float8_times_int4;
create sequence trap_numeric_times_int4;
create sequence trap_unnest_text;
create sequence trap_unnest_uuid;
create sequence trap_oid_eq_regclass;
create sequence trap_int4_eq_oid;
create sequence trap_array_agg_name;
create function trap_times(float8, int4) returns float8 language plpgsql as $$ begin
  perform pg_catalog.nextval('public.trap_float8_times_int4');
  return $1 operator(pg_catalog.*) $2::float8; end $$;
create operator public.* (leftarg = float8, rightarg = int4, function = trap_times);
create function trap_times(numeric, int4) returns numeric language plpgsql as $$ begin
  perform pg_catalog.nextval('public.trap_numeric_times_int4');
  return $1 operator(pg_catalog.*) $2::numeric; end $$;
create operator public.* (leftarg = numeric, rightarg = int4, function = trap_times);
create function public.unnest(text[]) returns setof text language plpgsql as $$ begin
  perform pg_catalog.nextval('public.trap_unnest_text');
  return query select pg_catalog.unnest($1); end $$;
create function public.unnest(uuid[]) returns setof uuid language plpgsql as $$ begin
  perform pg_catalog.nextval('public.trap_unnest_uuid');
  return query select pg_catalog.unnest($1); end $$;
create function trap_eq(oid, regclass) returns bool language plpgsql as $$ begin
  perform pg_catalog.nextval('public.trap_oid_eq_regclass');
  return $1 operator(pg_catalog.=) $2::oid; end $$;
create operator public.= (leftarg = oid, rightarg = regclass, function = trap_eq);
create function trap_eq(int4, oid) returns bool language plpgsql as $$ begin
  perform pg_catalog.nextval('public.trap_int4_eq_oid');
  return $1::oid operator(pg_catalog.=) $2; end $$;
create operator public.= (leftarg = int4, rightarg = oid, function = trap_eq);
create function trap_agg(name[]) returns name[] language plpgsql as $$ begin
  perform pg_catalog.nextval('public.trap_array_agg_name');
  return $1; end $$;
create aggregate public.array_agg(name)
  (sfunc = pg_catalog.array_append, stype = name[], finalfunc = trap_agg);
";

/// The traps of [`TRAPS`] that ran since they were planted or [`reset`] (their sequences count
/// outside transactions, so a trap that ran in a transaction rolled back counts too).
async fn fired(pool: &sqlx::PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "select c.relname::text from pg_sequence q join pg_class c on c.oid = q.seqrelid \
          where c.relname::text like 'trap\\_%' and pg_sequence_last_value(q.seqrelid) is not null \
          order by 1",
    )
    .fetch_all(pool)
    .await
    .expect("read the traps")
}

/// Every trap of [`TRAPS`] as not run.
async fn reset(pool: &sqlx::PgPool) {
    for trap in fired(pool).await {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "alter sequence {trap} restart"
        )))
        .execute(pool)
        .await
        .expect("reset a trap");
    }
}

/// [`TRAPS`] planted, `migrate`, the relay (its start-up checks, claims, marks and horizon
/// samples), a consumer (its dedupe insert) and `verify` (a row missing from the stream) run
/// beside them, and none runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_and_operators_another_role_creates_in_public_run_nowhere() {
    use crate::consumer::{setup, spawn, Record, STREAM};
    use outbox_runtime::verify::{verify, VerifyOptions};

    let s = setup(Duration::from_secs(60)).await;
    sqlx::raw_sql(TRAPS)
        .execute(&s.db.pool)
        .await
        .expect("plant the traps");
    // the traps work: statements written as the components' were before fire each
    sqlx::query(
        "select (extract(epoch from now()) * 1000)::int8, \
                (select count(*) from unnest(array['a']::text[])), \
                (select count(*) from unnest(array[gen_random_uuid()]::uuid[])), \
                (select count(*) from pg_class where oid = 'outbox_events'::regclass), \
                (select count(*) from pg_type where 27 = oid), \
                (select array_agg(typname) from pg_type where false)",
    )
    .execute(&s.db.pool)
    .await
    .unwrap();
    // (`extract` gives a `numeric` since Postgres 14: the `float8` trap is for 13)
    assert_eq!(
        fired(&s.db.pool).await,
        [
            "trap_array_agg_name",
            "trap_int4_eq_oid",
            "trap_numeric_times_int4",
            "trap_oid_eq_regclass",
            "trap_unnest_text",
            "trap_unnest_uuid"
        ],
        "each trap fires where it could"
    );
    reset(&s.db.pool).await;
    assert!(fired(&s.db.pool).await.is_empty(), "the traps are reset");

    // migrate's look at its indexes, the relay's start-up checks, and every statement on
    // connections that have not looked up a type yet
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(RelayConfig::default().pool_size())
        .connect_with(s.db.options.clone())
        .await
        .unwrap();
    outbox_runtime::migrate(&pool).await.expect("migrate");
    let relay = Arc::new(
        Relay::new(pool.clone(), s.js.clone(), RelayConfig::default())
            .await
            .unwrap(),
    );
    let (stop_relay, relay_running) = run_relay(relay.clone());
    let (stop_consumer, consuming) = spawn(s.consumer("foreign", Record));
    for n in 0..5 {
        s.emit(n).await;
    }
    eventually(Duration::from_secs(20), "five events applied", || async {
        s.effects().await.0 == 5
    })
    .await;
    // the horizon's samples run every 200 ms beside the batches
    tokio::time::sleep(Duration::from_millis(600)).await;
    stop_relay.send(()).unwrap();
    relay_running.await.unwrap();
    let _ = stop_consumer.send(());
    consuming.await.unwrap();

    // a row marked published by hand (after the stream's first message), which the stream
    // never had: verify looks it up
    let missing = s.emit(5).await;
    sqlx::query("update outbox_events set published_at = now() where id = $1")
        .bind(missing)
        .execute(&s.db.pool)
        .await
        .unwrap();
    let now = chrono::Utc::now();
    let report = verify(
        &s.db.pool,
        &s.js,
        &VerifyOptions::new(STREAM, now - chrono::TimeDelta::hours(1), now),
        |_| {},
    )
    .await
    .expect("verify");
    assert_eq!(report.missing, 1, "verify found the row: {report:?}");

    let fired = fired(&s.db.pool).await;
    assert!(fired.is_empty(), "another role's code ran: {fired:?}");
}

/// A role that may create schemas in the database (`create` on it) creates one named after a
/// component's login role, holding an `outbox_events` of its own, which the default
/// `search_path` (`"$user", public`) reads first. The path pinned in the URL, as
/// docs/operations.md says to where such roles exist, resolves the outbox's tables in `public`.
#[tokio::test]
async fn a_schema_named_after_a_components_role_is_not_read_with_the_path_pinned_in_the_url() {
    use crate::migrate::Private;
    use sqlx::postgres::PgPoolOptions;

    let private = Private::new("migrator").await;
    private
        .admin("outbox")
        .await
        .execute_all(&[
            "create role relayer login",
            "create role mallory login",
            "grant create on database outbox to mallory",
        ])
        .await;
    outbox_runtime::migrate(&private.pool("migrator", 2).await)
        .await
        .expect("migrate");
    sqlx::raw_sql(
        "create schema relayer; grant usage on schema relayer to relayer; \
         create table relayer.outbox_events (id uuid); \
         grant select, update on relayer.outbox_events to relayer",
    )
    .execute(&private.pool("mallory", 1).await)
    .await
    .expect("mallory shadows the table");
    let schema_of_events = |url: String| async move {
        let pool = outbox_runtime::connect::postgres(&url, PgPoolOptions::new().max_connections(1))
            .await
            .expect("connect");
        let schema: String = sqlx::query_scalar(
            "select n.nspname::text from pg_class c join pg_namespace n on n.oid = c.relnamespace \
              where c.oid = to_regclass('outbox_events')",
        )
        .fetch_one(&pool)
        .await
        .expect("resolve outbox_events");
        schema
    };
    let url = private.url("relayer", "outbox");
    assert_eq!(
        schema_of_events(url.clone()).await,
        "relayer",
        "the default path reads mallory's table: nothing is tested otherwise"
    );
    assert_eq!(
        schema_of_events(format!("{url}?options=-c%20search_path%3Dpublic")).await,
        "public"
    );
}
