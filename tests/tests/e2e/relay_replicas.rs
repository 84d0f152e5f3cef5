//! Several relays, and several lanes of one relay, on one table: every committed event reaches
//! the stream once, each subject's events arrive in created_at order, the relays' lanes keep to
//! slots of their own and a dead relay's slots are taken over within seconds, and a relay that
//! finds every row held by another transaction claims again soon.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::relay::LOCK_NAMESPACE;
use outbox_runtime::{EmitExt, Relay, RelayConfig, Schemas};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{eventually, open_schemas, raw_event, run_relay};
use sqlx::PgPool;
use uuid::Uuid;

const EVENTS: usize = 20_000;
const SUBJECTS: u64 = 500;
const RELAYS: usize = 4;
const PER_TX: usize = 500;

/// A row as the failure report shows it: id, created_at, published_at, attempts.
type RowState = (
    Uuid,
    chrono::DateTime<chrono::Utc>,
    Option<chrono::DateTime<chrono::Utc>>,
    i32,
);

/// A fixed bijective mix of `n` (splitmix64's finaliser): pseudo-random, reproducible subjects.
fn scramble(mut n: u64) -> u64 {
    n = (n ^ (n >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    n = (n ^ (n >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    n ^ (n >> 31)
}

/// Emits events `from..to`, `PER_TX` per transaction, recording each subject's ids in order.
async fn emit(
    pool: &PgPool,
    schemas: &Schemas,
    types: &[String],
    events: std::ops::Range<usize>,
    expected: &mut HashMap<String, Vec<Uuid>>,
) {
    let mut tx = pool.begin().await.unwrap();
    for n in events {
        let subject = format!("sub-{}", scramble(n as u64) % SUBJECTS);
        let event = raw_event(&types[n % types.len()], "billing", &subject)
            .numbered(n)
            .build();
        let id = tx.emit_raw(schemas, event).await.unwrap();
        expected.entry(subject).or_default().push(id);
        if (n + 1) % PER_TX == 0 {
            tx.commit().await.unwrap();
            tx = pool.begin().await.unwrap();
        }
    }
    tx.commit().await.unwrap();
}

/// A test context with its stream and one event type, and `events` events of that type emitted
/// before any relay runs; returns the ids each subject should reach the stream with, in order.
async fn one_type_backlog(events: usize) -> (Ctx, Vec<String>, HashMap<String, Vec<Uuid>>) {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let types = vec![ctx.event_type("billing.subscription.created")];
    let schemas = open_schemas(&types);
    let mut expected = HashMap::new();
    emit(ctx.pool(), &schemas, &types, 0..events, &mut expected).await;
    (ctx, types, expected)
}

/// A relay with `config` on the test's pool, running until the sender fires.
async fn start_relay(
    ctx: &Ctx,
    config: RelayConfig,
) -> (
    Arc<Relay>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let relay = Arc::new(
        Relay::new(ctx.pool().clone(), ctx.js.clone(), config)
            .await
            .unwrap(),
    );
    let (stop, running) = run_relay(relay.clone());
    (relay, stop, running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_relays_publish_every_event_once_in_order_per_subject() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let types = [
        ctx.event_type("billing.subscription.created"),
        ctx.event_type("billing.subscription.renewed"),
        ctx.event_type("billing.subscription.cancelled"),
    ];
    let schemas = open_schemas(&types);
    let config = RelayConfig {
        event_types: types.to_vec(),
        ..Default::default()
    };

    // One writer, so created_at order is commit order. Subjects are pseudo-random, so a subject
    // has several events in one batch and in the batches other relays claim at the same time.
    // Half the events are a backlog when the relays start, half arrive while they run.
    let mut expected: HashMap<String, Vec<Uuid>> = HashMap::new();
    let started = std::time::Instant::now();
    emit(ctx.pool(), &schemas, &types, 0..EVENTS / 2, &mut expected).await;

    let mut relays = Vec::new();
    for _ in 0..RELAYS {
        // a pool per relay, as in separate processes
        let pool = ctx.db.new_pool(config.pool_size()).await;
        let relay = Arc::new(
            Relay::new(pool, ctx.js.clone(), config.clone())
                .await
                .unwrap(),
        );
        let (stop, running) = run_relay(relay.clone());
        relays.push((relay, stop, running));
    }
    let relays_started = std::time::Instant::now();
    emit(
        ctx.pool(),
        &schemas,
        &types,
        EVENTS / 2..EVENTS,
        &mut expected,
    )
    .await;
    let emitted = started.elapsed();

    eventually(
        Duration::from_secs(300),
        "every event published",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    let (relays, runs): (Vec<_>, Vec<_>) = relays
        .into_iter()
        .map(|(relay, stop, running)| {
            stop.send(()).unwrap();
            (relay, running)
        })
        .unzip();
    for running in runs {
        running.await.unwrap();
    }
    let published_by: Vec<u64> = relays.iter().map(|r| r.stats().published).collect();
    eprintln!(
        "emitted {EVENTS} in {emitted:?}; relays ran {:?} until drained; published per relay: {published_by:?}",
        relays_started.elapsed()
    );
    assert_eq!(published_by.iter().sum::<u64>(), EVENTS as u64);
    assert!(
        published_by.iter().filter(|&&n| n > 0).count() > 1,
        "the relays shared the work: {published_by:?}"
    );

    assert_stream_matches(&ctx, &expected, EVENTS).await;
    ctx.delete_stream().await;
}

/// The stream holds each expected event once, every subject's in the expected (created_at)
/// order; on a mismatch, what the table and the stream say about the first such subject.
async fn assert_stream_matches(ctx: &Ctx, expected: &HashMap<String, Vec<Uuid>>, events: usize) {
    let messages = ctx.read_stream().await;
    assert_eq!(messages.len(), events, "one message per committed event");
    let distinct: HashSet<Uuid> = messages.iter().map(|m| m.envelope.id).collect();
    assert_eq!(distinct.len(), events, "no event stored twice");
    let mut seen: HashMap<String, Vec<Uuid>> = HashMap::new();
    for m in &messages {
        assert_eq!(m.msg_id, m.envelope.id.to_string());
        seen.entry(m.envelope.subject.clone())
            .or_default()
            .push(m.envelope.id);
    }
    assert_eq!(seen.len(), expected.len());
    let out_of_order: Vec<&String> = expected
        .iter()
        .filter(|(subject, ids)| seen.get(*subject) != Some(ids))
        .map(|(subject, _)| subject)
        .collect();
    if let Some(subject) = out_of_order.first() {
        // what the table and the stream say about the first such subject
        let rows: Vec<RowState> = sqlx::query_as(
            "select id, created_at, published_at, attempts from outbox_events \
                  where subject = $1 order by created_at",
        )
        .bind(subject.as_str())
        .fetch_all(ctx.pool())
        .await
        .unwrap();
        let seq: HashMap<Uuid, u64> = messages.iter().map(|m| (m.envelope.id, m.seq)).collect();
        let detail: Vec<String> = rows
            .iter()
            .map(|(id, created, published, attempts)| {
                format!(
                    "{id} created {} published {} attempts {attempts} stream seq {:?}",
                    created.format("%H:%M:%S%.6f"),
                    published
                        .map(|p| p.format("%H:%M:%S%.6f").to_string())
                        .unwrap_or_default(),
                    seq.get(id)
                )
            })
            .collect();
        panic!(
            "{} subjects reached the stream out of created_at order: {:?}\nfirst one, {subject}, by created_at:\n{}",
            out_of_order.len(),
            out_of_order.iter().take(5).collect::<Vec<_>>(),
            detail.join("\n")
        );
    }
}

/// Per backend holding relay partition locks in the test's database (not the wake lock, key
/// -1): the slots of its partitions, out of `lanes` (slot `k` of `n` is the range of
/// partitions `[k * 1024 / n, (k + 1) * 1024 / n)`).
async fn partitions_held(ctx: &Ctx, lanes: usize) -> Vec<(i32, Vec<i64>)> {
    sqlx::query_as(
        "select pid, array_agg(distinct objid::int8 * $2 / 1024 order by objid::int8 * $2 / 1024) from pg_locks \
          where locktype = 'advisory' and classid = $1::int8::oid and objsubid = 2 \
            and objid::int8 < 4294967295 \
            and database = (select oid from pg_database where datname = current_database()) \
          group by pid",
    )
    .bind(i64::from(LOCK_NAMESPACE))
    .bind(lanes as i64)
    .fetch_all(ctx.pool())
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_relays_lanes_hold_disjoint_partitions_and_keep_each_subjects_order() {
    const LANES: usize = 4;
    const BACKLOG: usize = 12_000;
    let (ctx, types, expected) = one_type_backlog(BACKLOG).await;
    let config = RelayConfig {
        event_types: types,
        lanes: LANES,
        ..Default::default()
    };
    let (relay, stop, running) = start_relay(&ctx, config).await;

    // While the backlog drains, every open batch (one backend each) holds advisory locks only
    // on partitions of its own lane: one slot of LANES per backend.
    let mut samples_with_two_lanes = 0;
    while ctx.db.unpublished().await > 0 {
        let held = partitions_held(&ctx, LANES).await;
        for (pid, slots_of) in &held {
            assert_eq!(
                slots_of.len(),
                1,
                "backend {pid} holds partitions of several lanes (slots of {LANES}: {slots_of:?})"
            );
        }
        if held.len() >= 2 {
            samples_with_two_lanes += 1;
        }
    }
    stop.send(()).unwrap();
    running.await.unwrap();
    assert_eq!(relay.stats().published, BACKLOG as u64);
    assert!(
        samples_with_two_lanes > 0,
        "no sample saw two lanes with open batches at once"
    );
    assert_stream_matches(&ctx, &expected, BACKLOG).await;
    ctx.delete_stream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_that_finds_every_row_held_claims_again_soon() {
    const BACKLOG: usize = 6_000;
    let (ctx, types, expected) = one_type_backlog(BACKLOG).await;
    // Another transaction (as a frozen relay's batch would) holds every row.
    let mut holder = ctx.pool().begin().await.unwrap();
    sqlx::query("select 1 from outbox_events for update")
        .execute(&mut *holder)
        .await
        .unwrap();
    // The rows were announced before the relay listened, and the poll is longer than the
    // test: only the retry after finding rows held can find them once they are free.
    let config = RelayConfig {
        event_types: types,
        poll_interval: Duration::from_secs(3600),
        lanes: 2,
        ..Default::default()
    };
    let (relay, stop, running) = start_relay(&ctx, config).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        ctx.db.unpublished().await,
        BACKLOG as i64,
        "the rows are held"
    );
    holder.rollback().await.unwrap();

    // The lanes keep to their own partitions meanwhile: one slot of 2 per
    // open batch.
    let released = std::time::Instant::now();
    while ctx.db.unpublished().await > 0 {
        // (the poll is an hour away: only the retry after finding rows held gets here; the
        // bound leaves room for a loaded machine)
        assert!(
            released.elapsed() < Duration::from_secs(30),
            "the relay did not publish the released rows (no notification was sent for them)"
        );
        for (pid, slots_of) in partitions_held(&ctx, 2).await {
            assert_eq!(
                slots_of.len(),
                1,
                "backend {pid} holds partitions of both lanes"
            );
        }
    }
    stop.send(()).unwrap();
    running.await.unwrap();
    assert_eq!(relay.stats().published, BACKLOG as u64);
    assert_stream_matches(&ctx, &expected, BACKLOG).await;
    ctx.delete_stream().await;
}

/// Per relay (the application name of its pool) and backend holding relay partition locks: the
/// slots of its partitions, out of `slots` (as [`partitions_held`]).
async fn slots_held(ctx: &Ctx, slots: i64) -> Vec<(String, i32, Vec<i64>)> {
    sqlx::query_as(
        "select a.application_name, l.pid, \
                array_agg(distinct l.objid::int8 * $2 / 1024 order by l.objid::int8 * $2 / 1024) \
           from pg_locks l join pg_stat_activity a on a.pid = l.pid \
          where l.locktype = 'advisory' and l.classid = $1::int8::oid and l.objsubid = 2 \
            and l.objid::int8 < 4294967295 \
            and l.database = (select oid from pg_database where datname = current_database()) \
          group by a.application_name, l.pid",
    )
    .bind(i64::from(LOCK_NAMESPACE))
    .bind(slots)
    .fetch_all(ctx.pool())
    .await
    .unwrap()
}

/// The running relays `outbox_relays` lists (seen within the last 5 s).
async fn relays_listed(ctx: &Ctx) -> i64 {
    sqlx::query_scalar(
        "select count(*) from outbox_relays where seen_at > now() - interval '5 seconds'",
    )
    .fetch_one(ctx.pool())
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relays_take_disjoint_slots_and_a_killed_relays_partitions_are_taken_over_within_seconds() {
    const LANES: usize = 2;
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let types = vec![ctx.event_type("billing.subscription.created")];
    let schemas = open_schemas(&types);
    let config = RelayConfig {
        event_types: types.clone(),
        lanes: LANES,
        ..Default::default()
    };
    let mut expected = HashMap::new();
    let mut next = 0;
    emit(ctx.pool(), &schemas, &types, 0..5_000, &mut expected).await;
    next += 5_000;

    // four relays, each with a pool of its own (as four processes) named after it
    let mut relays = Vec::new();
    for n in 0..RELAYS {
        let options = ctx
            .db
            .options
            .clone()
            .application_name(&format!("relay-{n}"));
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(config.pool_size())
            .connect_with(options)
            .await
            .unwrap();
        let relay = Arc::new(
            Relay::new(pool.clone(), ctx.js.clone(), config.clone())
                .await
                .unwrap(),
        );
        let (stop, running) = run_relay(relay.clone());
        relays.push((relay, stop, running, pool));
    }
    eventually(Duration::from_secs(30), "four relays listed", || async {
        relays_listed(&ctx).await == RELAYS as i64
    })
    .await;
    // the last to join told the others, which share the partitions anew within a heartbeat
    tokio::time::sleep(Duration::from_secs(2)).await;

    // While they drain a steady flow, every relay works and every slot of four is worked on
    // (four relays of two lanes together run about as many lanes as one: one slot each; a
    // relay can change slots while the machine is loaded, when a late heartbeat drops it from
    // the others' shares for a moment, so its slot is not asserted).
    let slots = RELAYS as i64;
    let mut seen: HashMap<String, HashSet<i64>> = HashMap::new();
    let mut last: HashMap<String, i64> = HashMap::new();
    let sampling = std::time::Instant::now();
    while sampling.elapsed() < Duration::from_secs(4)
        || seen.values().flatten().collect::<HashSet<_>>().len() < slots as usize
        || seen.len() < RELAYS
    {
        assert!(
            sampling.elapsed() < Duration::from_secs(60),
            "not every slot and relay was seen at work: {seen:?}"
        );
        emit(
            ctx.pool(),
            &schemas,
            &types,
            next..next + 200,
            &mut expected,
        )
        .await;
        next += 200;
        for (relay, _, slots_of) in slots_held(&ctx, slots).await {
            if let [slot] = slots_of[..] {
                last.insert(relay.clone(), slot);
            }
            seen.entry(relay).or_default().extend(slots_of);
        }
    }
    eprintln!("slots each relay was seen working on (mod {slots}): {seen:?}");
    // the slot relay-3 worked on last
    let dead = vec![*last
        .get("relay-3")
        .expect("relay-3 was seen working on one slot")];

    // relay-3 dies mid-drain: its task is dropped without a shutdown (its batch rolled back,
    // its row left in outbox_relays, as a killed process leaves it)
    let (killed, _, running, pool) = relays.pop().unwrap();
    running.abort();
    let _ = running.await;
    // and its connections go, as a dead process's do
    pool.close().await;
    let killed_at: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("select clock_timestamp()")
        .fetch_one(ctx.pool())
        .await
        .unwrap();
    assert!(
        killed.stats().published > 0,
        "relay-3 published before it died"
    );

    // its partitions: the others take them once its heartbeat is 5 s old
    let taken_over = loop {
        emit(
            ctx.pool(),
            &schemas,
            &types,
            next..next + 200,
            &mut expected,
        )
        .await;
        next += 200;
        let published: i64 = sqlx::query_scalar(
            "select count(*) from outbox_events \
              where published_at > $1 and (hashtext(subject) & 2147483647) % 1024 * $2 / 1024 = any($3)",
        )
        .bind(killed_at)
        .bind(slots)
        .bind(&dead)
        .fetch_one(ctx.pool())
        .await
        .unwrap();
        let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("select clock_timestamp()")
            .fetch_one(ctx.pool())
            .await
            .unwrap();
        let since = (now - killed_at).to_std().unwrap_or_default();
        if published > 0 {
            break since;
        }
        assert!(
            since < Duration::from_secs(20),
            "relay-3's partitions were not taken over within 20 s of its death"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        taken_over >= Duration::from_secs(3),
        "its partitions were taken after {taken_over:?}, before its heartbeat could be stale: \
         were they its own?"
    );
    assert_eq!(relays_listed(&ctx).await, (RELAYS - 1) as i64);

    eventually(
        Duration::from_secs(300),
        "every event published",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    for (relay, stop, running, _) in relays {
        stop.send(()).unwrap();
        running.await.unwrap();
        assert!(relay.stats().published > 0);
    }
    let left: i64 = sqlx::query_scalar("select count(*) from outbox_relays")
        .fetch_one(ctx.pool())
        .await
        .unwrap();
    assert_eq!(
        left, 1,
        "the stopped relays deleted their rows; the killed one's stays until it is an hour old"
    );
    eprintln!("relay-3's partitions taken over {taken_over:?} after it died");
    assert_stream_matches(&ctx, &expected, next).await;
    ctx.delete_stream().await;
}

/// Every plan node of `plan` (an `EXPLAIN (FORMAT JSON)` plan), depth first.
fn plan_nodes(plan: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut nodes = vec![plan];
    if let Some(children) = plan["Plans"].as_array() {
        for child in children {
            nodes.extend(plan_nodes(child));
        }
    }
    nodes
}

/// A lane's claim reads only its own partitions' rows: its partition range is a condition of
/// migration 0010's index (an `Index Cond`), so the other lanes' rows are never fetched from
/// the table. Checked on the relay's own statement and settings, in the generic plan its
/// prepared statement runs, over an analyzed backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lanes_claim_bounds_its_partition_range_in_the_index() {
    let (ctx, _, _) = one_type_backlog(5_000).await;
    sqlx::query("analyze outbox_events")
        .execute(ctx.pool())
        .await
        .unwrap();
    let mut tx = ctx.pool().begin().await.unwrap();
    sqlx::query(outbox_runtime::relay::BATCH_SETTINGS)
        .bind("5000")
        .bind("10000")
        .bind(false)
        .execute(&mut *tx)
        .await
        .unwrap();
    // the relay prepares the claim, and its settings force the generic plan
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "prepare claim_plan as {}",
        outbox_runtime::relay::CLAIM_STATEMENT
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    let defaults = RelayConfig::default();
    assert_eq!(
        defaults.partitions, 1024,
        "the index holds the partition of 1024"
    );
    for (lanes, lane) in [(4, 1), (2, 0), (16, 15)] {
        let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "explain (format json) execute claim_plan(500, {}, {lanes}, {lane}, {LOCK_NAMESPACE}, \
             '-infinity', '00000000-0000-0000-0000-000000000000', '{{}}')",
            defaults.partitions
        )))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        let nodes = plan_nodes(&plan[0]["Plan"]);
        let bounded = nodes.iter().any(|n| {
            n["Index Name"] == "outbox_events_unpublished_partition_idx"
                && n["Index Cond"]
                    .as_str()
                    .is_some_and(|c| c.contains("hashtext"))
        });
        assert!(
            bounded,
            "lane {lane} of {lanes}: the claim does not bound its partitions in \
             outbox_events_unpublished_partition_idx; its plan:\n{plan:#}"
        );
    }
    tx.rollback().await.unwrap();
}
