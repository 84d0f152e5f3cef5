//! The streams behind the event types, as they change under a running relay (docs/relay.md,
//! *Streams* and *Held rows*): a stream deleted and re-created, a stream that turns unsafe, a
//! stream or an account that stores the relay's messages under another subject, and a stream
//! that refuses publishes while its subjects back off.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::stream::{Config, DiscardPolicy, SubjectTransform};
use outbox_runtime::{Relay, RelayConfig};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{eventually, run_relay, NatsServer};
use sqlx::PgPool;
use tokio::time::Instant;
use uuid::Uuid;

/// Inserts one row of `event_type` about `subject`, at its own instant, as another service
/// following the contract's DDL would (no notification: the relay finds it by its poll).
async fn insert(pool: &PgPool, event_type: &str, subject: &str) -> Uuid {
    sqlx::query_scalar(
        "insert into outbox_events (id, event_type, source, subject, time, data, created_at) \
         values (gen_random_uuid(), $1, 'billing', $2, now(), '{}'::jsonb, clock_timestamp()) \
         returning id",
    )
    .bind(event_type)
    .bind(subject)
    .fetch_one(pool)
    .await
    .expect("insert a row")
}

async fn unpublished(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from outbox_events where published_at is null")
        .fetch_one(pool)
        .await
        .expect("count unpublished")
}

async fn schedules(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from outbox_retries")
        .fetch_one(pool)
        .await
        .expect("count schedules")
}

/// A relay on the test's database and `ctx.js` that polls every 100 ms (the rows here are
/// inserted by SQL, which sends no notification).
async fn relay(ctx: &Ctx, event_types: Vec<String>) -> Arc<Relay> {
    let config = RelayConfig {
        event_types,
        poll_interval: Duration::from_millis(100),
        ..RelayConfig::default()
    };
    let pool = ctx.db.new_pool(config.pool_size()).await;
    Arc::new(
        Relay::new(pool, ctx.js.clone(), config)
            .await
            .expect("relay"),
    )
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

async fn update_stream(ctx: &Ctx, edit: impl FnOnce(&mut Config)) {
    let mut stream = ctx.js.get_stream(ctx.stream_name()).await.expect("stream");
    let mut config = stream.info().await.expect("stream info").config.clone();
    edit(&mut config);
    ctx.js
        .update_stream(config)
        .await
        .expect("update the stream");
}

/// The held rows' reasons and attempts, by id.
async fn held(ctx: &Ctx) -> HashMap<Uuid, (String, i32)> {
    let status = outbox_runtime::status::status(ctx.pool(), 20)
        .await
        .expect("status");
    status
        .held
        .into_iter()
        .map(|h| (h.id, (h.reason, h.attempts)))
        .collect()
}

/// A stream deleted while 100 subjects emit, and created again 5 s later: the subjects the
/// relay held as "no stream" go again by themselves once the stream captures their type,
/// within the relay's housekeeping interval (10 s) and a few batches, each in its order. The
/// relay starts without `event_types`, so that it has not looked the stream up before it is
/// deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_deleted_and_created_again_while_a_hundred_subjects_emit_resumes_by_itself() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let paid = ctx.event_type("billing.invoice.paid");
    let relay = relay(&ctx, Vec::new()).await;
    let (stop, running) = run_relay(relay.clone());

    let (done, mut stopping) = tokio::sync::oneshot::channel::<()>();
    let emitter = {
        let pool = ctx.pool().clone();
        let paid = paid.clone();
        tokio::spawn(async move {
            let mut emitted: Vec<(String, Uuid, Instant)> = Vec::new();
            for n in 0.. {
                let subject = format!("s-{}", n % 100);
                let id = insert(&pool, &paid, &subject).await;
                emitted.push((subject, id, Instant::now()));
                tokio::select! {
                    _ = &mut stopping => break,
                    () = tokio::time::sleep(Duration::from_millis(10)) => {}
                }
            }
            emitted
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    ctx.delete_stream().await;
    let deleted = Instant::now();
    eventually(
        Duration::from_secs(5),
        "subjects held while no stream captures their type",
        || async { !held(&ctx).await.is_empty() },
    )
    .await;
    tokio::time::sleep_until(deleted + Duration::from_secs(5)).await;
    let held_then = held(&ctx).await;
    assert!(
        held_then
            .values()
            .all(|(reason, _)| reason.contains("no stream captures")),
        "{held_then:?}"
    );
    ctx.ensure_stream().await;
    let created = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    done.send(()).unwrap();
    let emitted = emitter.await.unwrap();

    // the bound: one housekeeping interval (10 s), then the released heads and the rows
    // behind them; 25 s leaves room for a loaded machine
    eventually(
        Duration::from_secs(25),
        "every row published, without `outbox unblock`",
        || async { unpublished(ctx.pool()).await == 0 },
    )
    .await;
    let took = created.elapsed();
    eprintln!(
        "{} rows, {} subjects held at the re-creation; all published {took:?} after it",
        emitted.len(),
        held_then.len()
    );
    assert_eq!(schedules(ctx.pool()).await, 0, "no schedule is left");

    // every row emitted after the deletion is in the new stream, in its subject's order
    let stored = stream_by_subject(&ctx).await;
    let mut expected: HashMap<String, Vec<Uuid>> = HashMap::new();
    for (subject, id, at) in &emitted {
        if *at > deleted {
            expected.entry(subject.clone()).or_default().push(*id);
        }
    }
    assert_eq!(expected.len(), 100);
    for (subject, ids) in &expected {
        let in_stream = stored.get(subject).cloned().unwrap_or_default();
        let tail = &in_stream[in_stream.len().saturating_sub(ids.len())..];
        assert_eq!(
            tail,
            ids.as_slice(),
            "subject {subject}: in order, none missing"
        );
    }
    stop.send(()).unwrap();
    running.await.unwrap();
    ctx.delete_stream().await;
}

/// A stream given a setting that can lose acknowledged messages while the relay runs (here
/// `max_msgs` with discard new) is refused as it would be at start: the rows of its types are
/// held with the stream's name and the setting, without an attempt, and nothing more goes into
/// it; once the setting is undone, they go by themselves, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_turns_unsafe_while_the_relay_runs_holds_its_types_rows_until_fixed() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let paid = ctx.event_type("billing.invoice.paid");
    let relay = relay(&ctx, vec![paid.clone()]).await;
    let (stop, running) = run_relay(relay.clone());
    let mut emitted: Vec<(String, Uuid)> = Vec::new();
    for n in 0..10 {
        let subject = format!("early-{}", n % 5);
        emitted.push((subject.clone(), insert(ctx.pool(), &paid, &subject).await));
    }
    eventually(
        Duration::from_secs(10),
        "the first rows published",
        || async { unpublished(ctx.pool()).await == 0 },
    )
    .await;

    update_stream(&ctx, |c| {
        c.max_messages = 1_000_000;
        c.discard = DiscardPolicy::New;
    })
    .await;
    let changed = Instant::now();
    let mut n = 0;
    while held(&ctx).await.is_empty() {
        assert!(
            changed.elapsed() < Duration::from_secs(25),
            "no row held 25 s after the stream turned unsafe"
        );
        let subject = format!("late-{}", n % 5);
        emitted.push((subject.clone(), insert(ctx.pool(), &paid, &subject).await));
        n += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "held {:?} after the stream turned unsafe",
        changed.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stored = ctx.stream_len().await;
    for n in 0..10 {
        let subject = format!("refused-{n}");
        emitted.push((subject.clone(), insert(ctx.pool(), &paid, &subject).await));
    }
    eventually(
        Duration::from_secs(10),
        "every subject with rows to publish held",
        || async {
            let s = outbox_runtime::status::status(ctx.pool(), 20)
                .await
                .unwrap();
            s.held_unpublished == s.unpublished && s.held_total >= 10
        },
    )
    .await;
    for (id, (reason, attempts)) in held(&ctx).await {
        assert!(
            reason.contains(&ctx.stream_name()) && reason.contains("max_msgs is 1000000"),
            "{id}: the reason names the stream and the setting: {reason}"
        );
        assert_eq!(attempts, 0, "{id}: no attempt spent: {reason}");
    }
    assert_eq!(ctx.stream_len().await, stored, "nothing more went into it");

    update_stream(&ctx, |c| {
        c.max_messages = -1;
        c.discard = DiscardPolicy::Old;
    })
    .await;
    let fixed = Instant::now();
    eventually(
        Duration::from_secs(25),
        "the held rows published once the stream is safe, without `outbox unblock`",
        || async { unpublished(ctx.pool()).await == 0 },
    )
    .await;
    eprintln!("released {:?} after the fix", fixed.elapsed());
    assert_eq!(schedules(ctx.pool()).await, 0);
    let by_subject = stream_by_subject(&ctx).await;
    let mut expected: HashMap<String, Vec<Uuid>> = HashMap::new();
    for (subject, id) in &emitted {
        expected.entry(subject.clone()).or_default().push(*id);
    }
    for (subject, ids) in &expected {
        assert_eq!(by_subject.get(subject), Some(ids), "subject {subject}");
    }
    let attempts: i64 = sqlx::query_scalar("select coalesce(sum(attempts), 0) from outbox_events")
        .fetch_one(ctx.pool())
        .await
        .unwrap();
    assert_eq!(attempts, 0, "no attempt was spent on the unsafe stream");
    stop.send(()).unwrap();
    running.await.unwrap();
    ctx.delete_stream().await;
}

/// A stream whose subject transform stores the type under another subject is refused: by
/// `StreamSpec::ensure`, by the relay at start, and, for a type the relay meets in its
/// backlog, by holding its rows unpublished with the transform named.
#[tokio::test]
async fn a_stream_that_transforms_the_types_subject_is_refused() {
    let ctx = Ctx::new().await;
    let mut config = ctx.stream_spec().to_config();
    config.subject_transform = Some(SubjectTransform {
        source: format!("{}.>", ctx.prefix),
        destination: format!("{}.moved.>", ctx.prefix),
    });
    ctx.js
        .create_stream(config)
        .await
        .expect("a stream with a transform");
    let paid = ctx.event_type("billing.invoice.paid");

    let ensured = ctx
        .stream_spec()
        .ensure(&ctx.js)
        .await
        .unwrap_err()
        .to_string();
    assert!(ensured.contains("subject_transform"), "{ensured}");

    let config = RelayConfig {
        event_types: vec![paid.clone()],
        ..RelayConfig::default()
    };
    let pool = ctx.db.new_pool(config.pool_size()).await;
    let refused = Relay::new(pool, ctx.js.clone(), config)
        .await
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains(&ctx.stream_name()) && refused.contains("subject_transform"),
        "the relay refuses to start: {refused}"
    );

    let relay = relay(&ctx, Vec::new()).await;
    let id = insert(ctx.pool(), &paid, "inv-1").await;
    let report = relay.run_once().await.unwrap();
    assert_eq!((report.published, report.held), (0, 1), "{report:?}");
    let (reason, attempts) = held(&ctx).await.remove(&id).expect("the row is held");
    assert!(
        reason.contains("subject_transform") && reason.contains(&format!("{}.moved.>", ctx.prefix)),
        "{reason}"
    );
    assert_eq!(attempts, 0);
    assert_eq!(ctx.stream_len().await, 0, "nothing was sent");
    ctx.delete_stream().await;
}

/// An account subject mapping that moves the type to another subject (here into the same
/// stream, so the ack comes from the stream that captures the type) is found from what the
/// stream stored: the row is not marked published but held, naming the subject it was stored
/// under, and the type's other rows are held without being sent.
#[tokio::test]
async fn an_account_mapping_that_moves_the_type_holds_its_rows() {
    let prefix = outbox_testkit::unique_token();
    let paid = format!("{prefix}.billing.invoice.paid");
    let moved = format!("{prefix}.moved.invoice.paid");
    let dir = tempfile::tempdir().expect("a config dir");
    let file = dir.path().join("mappings.conf");
    std::fs::write(&file, format!("mappings = {{ \"{paid}\": \"{moved}\" }}\n"))
        .expect("write the server config");
    let server = NatsServer::spawn_with(&["-c", file.to_str().expect("utf-8 path")]).await;
    let mut ctx = Ctx::with_nats(&server.url()).await;
    ctx.prefix = prefix;
    ctx.ensure_stream().await;
    let other = ctx.event_type("billing.invoice.sent");

    let relay = relay(&ctx, Vec::new()).await;
    let mapped = insert(ctx.pool(), &paid, "inv-1").await;
    let unmapped = insert(ctx.pool(), &other, "inv-2").await;
    let report = relay.run_once().await.unwrap();
    assert_eq!((report.published, report.held), (1, 1), "{report:?}");
    let held_now = held(&ctx).await;
    let (reason, _) = held_now.get(&mapped).expect("the mapped row is held");
    assert!(
        reason.contains(&moved) && reason.contains("mapping"),
        "the reason names where it went: {reason}"
    );
    assert!(!held_now.contains_key(&unmapped));
    let stored = ctx.stream_len().await;

    let later = insert(ctx.pool(), &paid, "inv-3").await;
    let report = relay.run_once().await.unwrap();
    assert_eq!((report.published, report.held), (0, 1), "{report:?}");
    assert!(held(&ctx).await.contains_key(&later));
    assert_eq!(ctx.stream_len().await, stored, "the later row was not sent");
    let published: i64 = sqlx::query_scalar(
        "select count(*) from outbox_events where event_type = $1 and published_at is not null",
    )
    .bind(&paid)
    .fetch_one(ctx.pool())
    .await
    .unwrap();
    assert_eq!(
        published, 0,
        "no row of the mapped type counts as published"
    );
}

/// A stream that refuses publishes (a `max_msgs` limit reached, with discard new) leaves the
/// subjects backing off, and `outbox status --json` says why for each: the broker's answer.
/// The relay here looked the stream up while it was safe and drives its batches itself, so no
/// housekeeping finds the setting first.
#[tokio::test]
async fn subjects_backing_off_show_the_brokers_reason_in_status() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let paid = ctx.event_type("billing.invoice.paid");
    let relay = relay(&ctx, vec![paid.clone()]).await;
    insert(ctx.pool(), &paid, "first").await;
    assert_eq!(relay.run_once().await.unwrap().published, 1);
    update_stream(&ctx, |c| {
        c.max_messages = 1;
        c.discard = DiscardPolicy::New;
    })
    .await;
    for n in 0..150 {
        insert(ctx.pool(), &paid, &format!("s-{n}")).await;
    }
    let report = relay.run_once().await.unwrap();
    assert_eq!(report.failed, 150, "{report:?}");

    let status = outbox_runtime::status::status(ctx.pool(), 20)
        .await
        .unwrap();
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["backing_off"], 150, "{json:#}");
    let by_reason = json["backing_off_reasons"]
        .as_array()
        .unwrap_or_else(|| panic!("the reasons of the subjects backing off: {json:#}"));
    let counted: i64 = by_reason
        .iter()
        .map(|r| {
            let reason = r["reason"].as_str().unwrap_or_default();
            assert!(reason.contains("maximum messages exceeded"), "{r}");
            r["subjects"].as_i64().unwrap_or_default()
        })
        .sum();
    assert_eq!(counted, 150, "every subject's reason: {by_reason:?}");
    eprintln!("backing off: {by_reason:?}");
    let listed = json["backing_off_subjects"].as_array().expect("listed");
    assert_eq!(listed.len(), 100, "the first 100 listed");
    for entry in listed {
        assert!(
            entry["reason"]
                .as_str()
                .unwrap_or_default()
                .contains("maximum messages exceeded")
                && entry["subject"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("s-")
                && entry["retry_in"].as_f64().is_some(),
            "{entry}"
        );
    }
    ctx.delete_stream().await;
}
