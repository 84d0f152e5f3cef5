//! Several relays, and several lanes of one relay, on one table: every committed event reaches
//! the stream once, each subject's events arrive in created_at order, one relay holds the lease
//! and publishes while the others stand by, a dead holder's place is taken within seconds, any
//! number of batches publishing at once (no lease: the step API) still keep each subject's
//! order, and a relay that finds every row held by another transaction claims again soon.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::{EmitExt, Relay, RelayConfig, Schemas};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{emit_committed, eventually, open_schemas, raw_event, run_relay};
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
    assert_eq!(
        published_by.iter().filter(|&&n| n > 0).count(),
        1,
        "one relay holds the lease and publishes, the others stand by: {published_by:?}"
    );

    assert_stream_matches(&ctx, &expected, EVENTS).await;
    ctx.delete_stream().await;
}

/// Order does not rest on the lease: four loops driving batches with the step API
/// (`Relay::run_once`, which takes no lease) over one table at once, while a writer emits,
/// publish every event once and each subject in order. Each batch publishes a subject's rows
/// only while it holds every unpublished row of the subject before them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_of_four_relays_at_once_without_the_lease_keep_each_subjects_order() {
    const STEPPED: usize = 8_000;
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let types = vec![ctx.event_type("billing.subscription.created")];
    let schemas = open_schemas(&types);
    let config = RelayConfig {
        event_types: types.clone(),
        batch_size: 100,
        ..Default::default()
    };
    let mut expected = HashMap::new();
    emit(ctx.pool(), &schemas, &types, 0..STEPPED / 2, &mut expected).await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut loops = Vec::new();
    for _ in 0..RELAYS {
        let pool = ctx.db.new_pool(config.pool_size()).await;
        let relay = Relay::new(pool, ctx.js.clone(), config.clone())
            .await
            .unwrap();
        let done = done.clone();
        loops.push(tokio::spawn(async move {
            let mut cut = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let report = relay.run_once().await.unwrap();
                cut += report.skipped;
                if report.claimed == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            (relay.stats().published, cut)
        }));
    }
    emit(
        ctx.pool(),
        &schemas,
        &types,
        STEPPED / 2..STEPPED,
        &mut expected,
    )
    .await;
    eventually(
        Duration::from_secs(300),
        "every event published",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut published_by = Vec::new();
    for l in loops {
        published_by.push(l.await.unwrap());
    }
    eprintln!("published and cut per loop: {published_by:?}");
    assert_eq!(
        published_by.iter().map(|(p, _)| p).sum::<u64>(),
        STEPPED as u64
    );
    assert!(
        published_by.iter().filter(|(p, _)| *p > 0).count() > 1,
        "the loops published at once: {published_by:?}"
    );
    assert_stream_matches(&ctx, &expected, STEPPED).await;
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

/// The relay's batches open at once in the test's database: backends in a transaction whose
/// last statement was one of the relay's.
async fn open_batches(ctx: &Ctx) -> i64 {
    sqlx::query_scalar(
        "select count(*) from pg_stat_activity \
          where datname = current_database() and xact_start is not null \
            and pid <> pg_backend_pid() and query not like 'select count(*) from pg_stat_activity%'",
    )
    .fetch_one(ctx.pool())
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_relays_lanes_run_batches_at_once_and_keep_each_subjects_order() {
    const LANES: usize = 4;
    const BACKLOG: usize = 12_000;
    let (ctx, types, expected) = one_type_backlog(BACKLOG).await;
    let config = RelayConfig {
        event_types: types,
        lanes: LANES,
        ..Default::default()
    };
    let (relay, stop, running) = start_relay(&ctx, config).await;
    let mut samples_with_two_lanes = 0;
    while ctx.db.unpublished().await > 0 {
        if open_batches(&ctx).await >= 2 {
            samples_with_two_lanes += 1;
        }
    }
    stop.send(()).unwrap();
    running.await.unwrap();
    assert_eq!(relay.stats().published, BACKLOG as u64);
    assert_eq!(
        relay.stats().skipped,
        0,
        "the lanes' subjects are disjoint: nothing was cut"
    );
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

    let released = std::time::Instant::now();
    while ctx.db.unpublished().await > 0 {
        // (the poll is an hour away: only the lanes' own retries get here; the bound leaves
        // room for a loaded machine)
        assert!(
            released.elapsed() < Duration::from_secs(30),
            "the relay did not publish the released rows (no notification was sent for them)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).unwrap();
    running.await.unwrap();
    assert_eq!(relay.stats().published, BACKLOG as u64);
    assert_stream_matches(&ctx, &expected, BACKLOG).await;
    ctx.delete_stream().await;
}

/// The relay lease's holder, if its lease runs.
async fn lease_holder(ctx: &Ctx) -> Option<Uuid> {
    sqlx::query_scalar("select holder from outbox_relay_lease where expires_at > now()")
        .fetch_optional(ctx.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_lease_holders_place_is_taken_within_seconds_and_order_holds() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let types = vec![ctx.event_type("billing.subscription.created")];
    let schemas = open_schemas(&types);
    let config = RelayConfig {
        event_types: types.clone(),
        ..Default::default()
    };
    let mut expected = HashMap::new();
    let mut next = 0;
    emit(ctx.pool(), &schemas, &types, 0..5_000, &mut expected).await;
    next += 5_000;

    // four relays, each with a pool of its own (as four processes)
    let mut relays = Vec::new();
    for _ in 0..RELAYS {
        let pool = ctx.db.new_pool(config.pool_size()).await;
        let relay = Arc::new(
            Relay::new(pool.clone(), ctx.js.clone(), config.clone())
                .await
                .unwrap(),
        );
        let (stop, running) = run_relay(relay.clone());
        relays.push((relay, stop, running, pool));
    }
    eventually(Duration::from_secs(30), "one relay publishes", || async {
        relays.iter().any(|(r, ..)| r.stats().published > 0)
    })
    .await;
    let first = lease_holder(&ctx).await.expect("a relay holds the lease");
    let holder = relays
        .iter()
        .position(|(r, ..)| r.stats().published > 0)
        .unwrap();
    assert_eq!(
        relays
            .iter()
            .filter(|(r, ..)| r.stats().published > 0)
            .count(),
        1,
        "one relay publishes"
    );

    // the holder dies mid-drain: its task is dropped without a shutdown (its batch rolled back,
    // its lease left to run out, as a killed process leaves it), and its connections go
    let (killed, _, running, pool) = relays.remove(holder);
    running.abort();
    let _ = running.await;
    pool.close().await;
    let killed_at = std::time::Instant::now();
    let before: Vec<u64> = relays.iter().map(|(r, ..)| r.stats().published).collect();
    assert_eq!(before, [0, 0, 0]);
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
        if relays.iter().any(|(r, ..)| r.stats().published > 0) {
            break killed_at.elapsed();
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(20),
            "no relay took the lease over within 20 s of the holder's death"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let second = lease_holder(&ctx).await.expect("a relay holds the lease");
    assert_ne!(first, second, "another relay holds it");
    eventually(
        Duration::from_secs(300),
        "every event published",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    let mut published_by = vec![killed.stats().published];
    for (relay, stop, running, _) in relays {
        stop.send(()).unwrap();
        running.await.unwrap();
        published_by.push(relay.stats().published);
    }
    eprintln!("the holder's place taken {taken_over:?} after it died; published: {published_by:?}");
    assert!(
        taken_over >= Duration::from_secs(2),
        "taken over after {taken_over:?}, before the dead holder's lease could run out"
    );
    assert_eq!(
        published_by.iter().filter(|&&n| n > 0).count(),
        2,
        "the dead holder and one successor published: {published_by:?}"
    );
    assert_eq!(
        lease_holder(&ctx).await,
        None,
        "the stopped relays gave the lease up"
    );
    assert_stream_matches(&ctx, &expected, next).await;
    ctx.delete_stream().await;
}

/// The lease holder's path to Postgres goes silent while Postgres sends it a claim far larger
/// than the sockets' buffers hold (500 rows of 64 KiB): the server's session blocks sending,
/// busy, so neither its idle timeout nor a statement timeout ends it, and it would hold the
/// claimed rows, and their subjects, until TCP gave up. The batch's `tcp_user_timeout`
/// (`ack_timeout + 5 s`) makes the server drop that connection; the relay that takes the lease
/// over publishes every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_whose_path_goes_silent_while_postgres_sends_its_claim_gives_its_rows_up() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("billing.document.attached");
    let config = RelayConfig {
        event_types: vec![event_type.clone()],
        ..Default::default()
    };
    let direct = ctx.pool().connect_options().as_ref().clone();
    let proxy =
        outbox_testkit::TcpProxy::start(format!("{}:{}", direct.get_host(), direct.get_port()))
            .await;
    let through_proxy = sqlx::postgres::PgPoolOptions::new()
        .max_connections(config.pool_size())
        .connect_with(direct.clone().host("127.0.0.1").port(proxy.port()))
        .await
        .expect("a pool through the proxy");
    let silent = Arc::new(
        Relay::new(through_proxy, ctx.js.clone(), config.clone())
            .await
            .expect("the relay behind the proxy"),
    );
    let (stop_silent, running_silent) = run_relay(silent.clone());
    eventually(
        Duration::from_secs(20),
        "the relay holds the lease",
        || async { lease_holder(&ctx).await.is_some() },
    )
    .await;
    // a megabyte more of answers, then none: the claim's rows stop on their way
    proxy.freeze_answers_after(1 << 20);
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
         select gen_random_uuid(), $1, 'documents', 'document-' || (g % 50), now(), \
                jsonb_build_object('n', g, 'pad', repeat('x', 65536)), \
                now() + g * interval '1 microsecond' \
           from generate_series(1, 500) g \
         returning id",
    )
    .bind(&event_type)
    .fetch_all(ctx.pool())
    .await
    .expect("insert the large rows");
    eventually(
        Duration::from_secs(20),
        "the silent relay's session blocked sending",
        || async {
            sqlx::query_scalar::<_, bool>(
                "select exists (select 1 from pg_stat_activity \
                  where wait_event = 'ClientWrite' and datname = current_database())",
            )
            .fetch_one(ctx.pool())
            .await
            .expect("read the sessions")
        },
    )
    .await;
    let took_over = ctx.db.new_pool(config.pool_size()).await;
    let successor = Arc::new(
        Relay::new(took_over, ctx.js.clone(), config.clone())
            .await
            .expect("the successor"),
    );
    let (stop, running) = run_relay(successor.clone());
    eventually(
        Duration::from_secs(60),
        "every row published by the successor",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    stop.send(()).unwrap();
    running.await.unwrap();
    proxy.thaw();
    drop(stop_silent);
    running_silent.abort();
    let _ = running_silent.await;
    let seen: HashSet<Uuid> = ctx
        .read_stream()
        .await
        .into_iter()
        .map(|m| m.envelope.id)
        .collect();
    assert!(
        ids.iter().all(|id| seen.contains(id)),
        "every row in the stream"
    );
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

/// A 5,000-row backlog, analyzed, and a connection in a transaction with the batch's settings
/// on which `statement` is prepared as `plan_of`: the relay prepares its statements, and its
/// settings force the generic plan.
async fn prepared_in_a_batch(statement: &str) -> (Ctx, sqlx::pool::PoolConnection<sqlx::Postgres>) {
    let (ctx, _, _) = one_type_backlog(5_000).await;
    sqlx::query("analyze outbox_events")
        .execute(ctx.pool())
        .await
        .unwrap();
    let mut tx = ctx.pool().acquire().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(outbox_runtime::relay::batch_settings(
        5000, 10000,
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "prepare plan_of as {statement}"
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    (ctx, tx)
}

/// Whether `plan` scans `index` with an `Index Cond` that `cond` accepts.
fn scans_with(plan: &serde_json::Value, index: &str, cond: impl Fn(&str) -> bool) -> bool {
    plan_nodes(&plan[0]["Plan"])
        .iter()
        .any(|n| n["Index Name"] == index && n["Index Cond"].as_str().is_some_and(&cond))
}

/// A lane's claim reads only its own partitions' rows: its partition range is a condition of
/// migration 0010's index (an `Index Cond`), so the other lanes' rows are never fetched from
/// the table. Checked on the relay's own statement and settings, in the generic plan its
/// prepared statement runs, over an analyzed backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lanes_claim_bounds_its_partition_range_in_the_index() {
    let (_ctx, mut tx) = prepared_in_a_batch(outbox_runtime::relay::CLAIM_STATEMENT).await;
    let defaults = RelayConfig::default();
    assert_eq!(
        defaults.partitions, 1024,
        "the index holds the partition of 1024"
    );
    for (lanes, lane) in [(4, 1), (2, 0), (16, 15)] {
        let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "explain (format json) execute plan_of(500, {}, {lanes}, {lane}, \
             '-infinity', '00000000-0000-0000-0000-000000000000', null, null, '{{}}')",
            defaults.partitions
        )))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        let bounded = scans_with(&plan, "outbox_events_unpublished_partition_idx", |c| {
            c.contains("hashtext")
        });
        assert!(
            bounded,
            "lane {lane} of {lanes}: the claim does not bound its partitions in \
             outbox_events_unpublished_partition_idx; its plan:\n{plan:#}"
        );
    }
    sqlx::query("rollback").execute(&mut *tx).await.unwrap();
}

/// The claim's look for older rows of its subjects (the cut at holes, docs/relay.md, *Order*)
/// is one probe of migration 0012's index per claimed subject, bounded by the subject's hash
/// and the subject's last claimed row: it reads no other subject's rows, wherever the cursor is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claims_look_for_older_rows_probes_the_subject_index() {
    let (_ctx, mut tx) = prepared_in_a_batch(outbox_runtime::relay::CLAIM_CUT_STATEMENT).await;
    let plan: serde_json::Value = sqlx::query_scalar(
        "explain (format json) execute plan_of(500, 1024, 1, 0, \
         '-infinity', '00000000-0000-0000-0000-000000000000', null, null, '{}')",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let probe = scans_with(&plan, "outbox_events_unpublished_subject_idx", |c| {
        c.contains("hashtext(subject) = hashtext(") && c.contains("created_at <=")
    });
    assert!(
        probe,
        "the cut does not probe outbox_events_unpublished_subject_idx by subject; its plan:\n{plan:#}"
    );
    sqlx::query("rollback").execute(&mut *tx).await.unwrap();
}

/// The batch's window reads the retry schedule (is a retry due, when is the next) through its
/// index of due retries, in the generic plan the relay's prepared statement runs: two probes,
/// whatever the schedule holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_windows_look_at_the_retry_schedule_probes_its_index() {
    let (_ctx, mut tx) = prepared_in_a_batch(outbox_runtime::relay::WINDOW_STATEMENT).await;
    let plan: serde_json::Value = sqlx::query_scalar(
        "explain (format json) execute plan_of(1024, 2, 1, \
         '-infinity', '00000000-0000-0000-0000-000000000000', null, null, 500)",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let nodes = plan_nodes(&plan[0]["Plan"]);
    let on_schedule = |index: &str| {
        nodes
            .iter()
            .filter(|n| n["Relation Name"] == "outbox_retries" && n["Index Name"] == index)
            .count()
    };
    let seq_scans = nodes
        .iter()
        .filter(|n| n["Node Type"] == "Seq Scan")
        .count();
    // the due retry and the next one through the index of due retries; the parked subjects of
    // the window by the schedule's primary key
    assert!(
        on_schedule("outbox_retries_due_idx") == 2 && seq_scans == 0,
        "the window does not probe outbox_retries_due_idx for the schedule; its plan:\n{plan:#}"
    );
    assert!(
        scans_with(&plan, "outbox_events_unpublished_partition_idx", |c| c
            .contains("hashtext")),
        "the window does not read its lane's rows by the partition index; its plan:\n{plan:#}"
    );
    sqlx::query("rollback").execute(&mut *tx).await.unwrap();
}

/// The statements of backends of the test's database that wait for a lock.
pub(crate) async fn waiting_statements(ctx: &Ctx) -> Vec<String> {
    sqlx::query_scalar(
        "select query from pg_stat_activity \
          where datname = current_database() and wait_event_type = 'Lock'",
    )
    .fetch_all(ctx.pool())
    .await
    .unwrap()
}

/// A relay standing by at start reads nothing of the backlog beside the holder's first
/// batches: not the backlog's event types (its stream check waits until it holds the lease),
/// and not the backlog gauges for its first 5 s. Seen through a lock: the test holds
/// `outbox_events` exclusively, so any statement of the relay on it waits, and shows in
/// `pg_stat_activity`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_standing_by_reads_nothing_of_the_backlog_until_its_first_gauges() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let ty = ctx.event_type("billing.invoice.paid");
    let schemas = open_schemas(std::slice::from_ref(&ty));
    let id = emit_committed(ctx.pool(), &schemas, raw_event(&ty, "billing", "a").build()).await;
    // another relay holds the lease for a minute
    sqlx::query(
        "insert into outbox_relay_lease (name, holder, acquired_at, expires_at) \
         values ('relay', gen_random_uuid(), now(), now() + interval '1 minute')",
    )
    .execute(ctx.pool())
    .await
    .unwrap();
    let relay = Arc::new(
        Relay::new(ctx.pool().clone(), ctx.js.clone(), RelayConfig::default())
            .await
            .unwrap(),
    );
    let mut lock = ctx.pool().begin().await.unwrap();
    sqlx::query("lock table outbox_events in access exclusive mode")
        .execute(&mut *lock)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let (stop, running) = run_relay(relay.clone());
    // the lease is tried at once, and the other relay holds it
    eventually(Duration::from_secs(10), "the relay to run", || async {
        relay.health().running
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let early = waiting_statements(&ctx).await;
    let looked = started.elapsed();
    assert!(
        !relay.health().holds_lease,
        "the other relay holds the lease"
    );
    assert!(
        looked < Duration::from_secs(5),
        "the test looked {looked:?} after the start, past the 5 s it checks"
    );
    assert!(
        early.is_empty(),
        "a relay standing by read the backlog at start: {early:?}"
    );
    // its first gauges come 5 s in, and wait for the lock like any statement on the table:
    // the observation above would have seen them
    eventually(
        Duration::from_secs(20),
        "the first gauges to wait",
        || async {
            waiting_statements(&ctx)
                .await
                .iter()
                .any(|q| q.contains("count(*)"))
        },
    )
    .await;
    assert!(
        !waiting_statements(&ctx)
            .await
            .iter()
            .any(|q| q.contains("distinct event_type")),
        "a relay standing by read the backlog's event types"
    );
    lock.rollback().await.unwrap();
    // the lease is handed over: the relay reads the backlog's types and publishes
    sqlx::query("delete from outbox_relay_lease")
        .execute(ctx.pool())
        .await
        .unwrap();
    eventually(Duration::from_secs(15), "published", || {
        crate::relay_foreign::published(&ctx, id)
    })
    .await;
    stop.send(()).unwrap();
    running.await.unwrap();
    ctx.delete_stream().await;
}
