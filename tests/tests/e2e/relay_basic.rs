//! The relay against a real Postgres and nats-server: commit and rollback, the wake-up on
//! commit, and the errors it gives for bad input and a broken setup.

use std::time::Duration;

use outbox_runtime::{EmitExt, Error, Relay, RelayConfig, Schemas};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{
    emit_committed, eventually, open_schemas, raw_event, run_relay, Delivered, TestDb,
};
use serde_json::json;
use uuid::Uuid;

/// A relay for `event_type` on the test's table and NATS connection, with default settings.
async fn relay_for(ctx: &Ctx, event_type: &str) -> Relay {
    let config = RelayConfig {
        event_types: vec![event_type.to_owned()],
        ..Default::default()
    };
    Relay::new(ctx.pool().clone(), ctx.js.clone(), config)
        .await
        .unwrap()
}

/// An open transaction holding the row lock of event `id` (roll it back to release it).
async fn lock_row(ctx: &Ctx, id: Uuid) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = ctx.pool().begin().await.unwrap();
    sqlx::query("select 1 from outbox_events where id = $1 for update")
        .bind(id)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx
}

/// One committed event of `event_type` on `subject` per `n`, with data `{"n": n}`; their ids.
async fn emit_each(
    ctx: &Ctx,
    schemas: &Schemas,
    event_type: &str,
    subject: &str,
    ns: std::ops::Range<i64>,
) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for n in ns {
        let event = raw_event(event_type, "billing", subject).numbered(n);
        ids.push(emit_committed(ctx.pool(), schemas, event).await);
    }
    ids
}

/// The ids of `subject`'s events, in stream order.
fn ids_of(messages: &[Delivered], subject: &str) -> Vec<Uuid> {
    messages
        .iter()
        .filter(|m| m.envelope.subject == subject)
        .map(|m| m.envelope.id)
        .collect()
}

#[tokio::test]
async fn a_committed_event_is_published_and_a_rolled_back_one_never_is() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let paid = ctx.event_type("billing.invoice.paid");
    let schemas = open_schemas(std::slice::from_ref(&paid));

    let mut tx = ctx.pool().begin().await.unwrap();
    let rolled_back = tx
        .emit_raw(
            &schemas,
            raw_event(&paid, "billing", "inv-1").numbered(1).build(),
        )
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let mut tx = ctx.pool().begin().await.unwrap();
    let committed = tx
        .emit_raw(
            &schemas,
            raw_event(&paid, "billing", "inv-2").numbered(2).build(),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let relay = relay_for(&ctx, &paid).await;
    let report = relay.run_once().await.unwrap();
    assert_eq!(report.claimed, 1);
    assert_eq!(report.published, 1);
    assert_eq!(relay.run_once().await.unwrap().claimed, 0);

    let messages = ctx.read_stream().await;
    assert_eq!(
        messages.len(),
        1,
        "only the committed event reaches the stream"
    );
    let m = &messages[0];
    assert_eq!(m.msg_id, committed.to_string());
    assert_eq!(m.subject, paid);
    assert_eq!(m.content_type, "application/cloudevents+json");
    assert_eq!(m.envelope.id, committed);
    assert_eq!(m.envelope.event_type, paid);
    assert_eq!(m.envelope.source, "billing");
    assert_eq!(m.envelope.subject, "inv-2");
    assert_eq!(m.envelope.specversion, "1.0");
    assert_eq!(m.envelope.datacontenttype, "application/json");
    assert_eq!(m.envelope.data, json!({"n": 2}));
    assert!(messages.iter().all(|m| m.envelope.id != rolled_back));

    let published: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("select published_at from outbox_events where id = $1")
            .bind(committed)
            .fetch_one(ctx.pool())
            .await
            .unwrap();
    assert!(published.is_some());
    let rows: i64 = sqlx::query_scalar("select count(*) from outbox_events")
        .fetch_one(ctx.pool())
        .await
        .unwrap();
    assert_eq!(rows, 1, "the rolled-back row does not exist");
    ctx.delete_stream().await;
}

#[tokio::test]
async fn the_running_relay_wakes_on_commit_and_stops_on_shutdown() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let created = ctx.event_type("billing.subscription.created");
    let schemas = open_schemas(std::slice::from_ref(&created));
    // A fallback poll far longer than the test: only the notification can wake the relay.
    let relay = Relay::new(
        ctx.pool().clone(),
        ctx.js.clone(),
        RelayConfig {
            poll_interval: Duration::from_secs(3600),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let pool = ctx.pool().clone();
    let relay = std::sync::Arc::new(relay);
    let (stop, running) = run_relay(relay.clone());
    // Let the relay reach its wait (first empty batch, LISTEN in place) before emitting.
    eventually(Duration::from_secs(10), "the relay listens", || async {
        sqlx::query_scalar::<_, i64>(
            "select count(*) from pg_stat_activity where query ilike 'listen%' and datname = current_database()",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
            > 0
    })
    .await;

    let mut ids = Vec::new();
    for i in 0..3 {
        let mut tx = pool.begin().await.unwrap();
        ids.push(
            tx.emit_raw(
                &schemas,
                raw_event(&created, "billing", format!("sub-{i}"))
                    .data(json!({"i": i}))
                    .build(),
            )
            .await
            .unwrap(),
        );
        tx.commit().await.unwrap();
    }
    eventually(
        Duration::from_secs(10),
        "three events published",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;

    stop.send(()).unwrap();
    running.await.unwrap();
    assert_eq!(relay.stats().published, 3);
    // three subjects: order across them is not promised (the relay's lanes publish them
    // side by side), so compare the sets
    let mut got: Vec<Uuid> = ctx
        .read_stream()
        .await
        .iter()
        .map(|m| m.envelope.id)
        .collect();
    got.sort();
    ids.sort();
    assert_eq!(got, ids);
    ctx.delete_stream().await;
}

#[tokio::test]
async fn bad_payloads_and_unknown_types_are_refused_before_the_insert() {
    let db = TestDb::new().await;
    let schemas = Schemas::from_pairs([(
        "billing.invoice.paid",
        r#"{"type":"object","required":["invoice_id"],"properties":{"invoice_id":{"type":"string"},"amount":{"type":"integer","minimum":0}}}"#,
    )])
    .unwrap();
    let mut tx = db.pool.begin().await.unwrap();

    let err = tx
        .emit_raw(
            &schemas,
            raw_event("billing.invoice.paid", "billing", "inv-1")
                .data(json!({"amount": -3}))
                .build(),
        )
        .await
        .unwrap_err();
    match &err {
        Error::InvalidPayload {
            event_type,
            violations,
        } => {
            assert_eq!(event_type, "billing.invoice.paid");
            assert!(violations.iter().any(|v| v.keyword == "required"));
            assert!(violations
                .iter()
                .any(|v| v.keyword == "minimum" && v.pointer == "/amount"));
        }
        other => panic!("expected InvalidPayload, got {other:?}"),
    }

    let err = tx
        .emit_raw(
            &schemas,
            raw_event("billing.invoice.voided", "billing", "inv-1").build(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::UnknownEventType { event_type, known } if event_type == "billing.invoice.voided" && known == "billing.invoice.paid"),
        "{err:?}"
    );

    // The transaction is still usable, and nothing was inserted.
    tx.emit_raw(
        &schemas,
        raw_event("billing.invoice.paid", "billing", "inv-1")
            .data(json!({"invoice_id": "inv-1"}))
            .build(),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.unpublished().await, 1);
}

#[tokio::test]
async fn a_claim_with_a_hole_in_a_subject_publishes_only_the_rows_before_it() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let changed = ctx.event_type("billing.account.changed");
    let schemas = open_schemas(std::slice::from_ref(&changed));
    let ids = emit_each(&ctx, &schemas, &changed, "acct-1", 0..5).await;
    let other = emit_each(&ctx, &schemas, &changed, "acct-2", 9..10).await;

    // Another transaction holds the third row's lock (as a claim that tested it earlier, under
    // a partition lock since released, would): the claim skips it and takes the rows around it.
    let holder = lock_row(&ctx, ids[2]).await;
    let relay = relay_for(&ctx, &changed).await;
    let report = relay.run_once().await.unwrap();
    assert_eq!(
        report.claimed, 5,
        "every row but the locked one: {report:?}"
    );
    assert_eq!(
        report.published, 3,
        "acct-1 is cut at the hole, acct-2 goes: {report:?}"
    );
    // order is per subject: the stream read one subject at a time
    let messages = ctx.read_stream().await;
    assert_eq!(
        ids_of(&messages, "acct-1"),
        [ids[0], ids[1]],
        "nothing of acct-1 overtakes the held row"
    );
    assert_eq!(ids_of(&messages, "acct-2"), other);
    let untouched: i64 = sqlx::query_scalar(
        "select count(*) from outbox_events where id = any($1) and published_at is null and attempts = 0",
    )
    .bind(&ids[2..])
    .fetch_one(ctx.pool())
    .await
    .unwrap();
    assert_eq!(untouched, 3, "the cut rows are left as they were");

    holder.rollback().await.unwrap();
    // the cut subject pauses for a moment in this relay, then goes on
    assert_eq!(publish_until_drained(&ctx, &relay).await, 3);
    assert_eq!(
        ids_of(&ctx.read_stream().await, "acct-1"),
        ids,
        "acct-1 in emit order"
    );
    ctx.delete_stream().await;
}

/// Runs batches until nothing is left unpublished (a subject cut at a hole pauses in the relay
/// for a moment first); returns how many rows they published.
async fn publish_until_drained(ctx: &Ctx, relay: &Relay) -> usize {
    let mut published = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while ctx.db.unpublished().await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cut rows were not published"
        );
        published += relay.run_once().await.unwrap().published;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    published
}

#[tokio::test]
async fn a_held_row_sharing_the_claimed_rows_instant_holds_its_subject() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let changed = ctx.event_type("billing.account.changed");
    let schemas = open_schemas(std::slice::from_ref(&changed));
    let ids = emit_each(&ctx, &schemas, &changed, "acct-1", 0..2).await;
    // the same created_at (a clock step, or two emits in one microsecond)
    sqlx::query(
        "update outbox_events set created_at = (select min(created_at) from outbox_events)",
    )
    .execute(ctx.pool())
    .await
    .unwrap();
    let holder = lock_row(&ctx, ids[0]).await;
    let relay = relay_for(&ctx, &changed).await;
    let report = relay.run_once().await.unwrap();
    assert_eq!(
        (report.claimed, report.published),
        (1, 0),
        "the claimed row waits for the held one of the same instant: {report:?}"
    );
    holder.rollback().await.unwrap();
    assert_eq!(publish_until_drained(&ctx, &relay).await, 2);
    assert_eq!(ctx.read_stream().await.len(), 2);
    ctx.delete_stream().await;
}

#[tokio::test]
async fn a_batch_publishes_each_subjects_events_in_order() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let paid = ctx.event_type("billing.invoice.paid");
    let schemas = open_schemas(std::slice::from_ref(&paid));
    // four events for each of three subjects, interleaved: one batch holds all twelve, and a
    // subject's next event goes out only once the previous one is stored
    let subjects = ["inv-a", "inv-b", "inv-c"];
    let mut emitted = Vec::new();
    for n in 0..4 {
        for subject in subjects {
            let event = raw_event(&paid, "billing", subject).numbered(n);
            emitted.push(emit_committed(ctx.pool(), &schemas, event).await);
        }
    }

    let relay = relay_for(&ctx, &paid).await;
    let report = relay.run_once().await.unwrap();
    assert_eq!((report.claimed, report.published), (12, 12));
    assert_eq!((report.failed, report.skipped), (0, 0));

    let messages = ctx.read_stream().await;
    let mut stored: Vec<Uuid> = messages.iter().map(|m| m.envelope.id).collect();
    for subject in subjects {
        let order: Vec<i64> = messages
            .iter()
            .filter(|m| m.envelope.subject == subject)
            .map(|m| m.envelope.data["n"].as_i64().unwrap())
            .collect();
        assert_eq!(order, [0, 1, 2, 3], "{subject}'s events in the stream");
    }
    stored.sort();
    emitted.sort();
    assert_eq!(stored, emitted, "every event stored once");
    ctx.delete_stream().await;
}

#[tokio::test]
async fn a_batch_wider_than_the_contexts_ack_window_is_published_whole() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let paid = ctx.event_type("billing.invoice.paid");
    let schemas = open_schemas(std::slice::from_ref(&paid));
    for i in 0..40 {
        emit_each(&ctx, &schemas, &paid, &format!("inv-{i}"), i..i + 1).await;
    }
    // 40 subjects, so 40 first events sent at once, through a context that lets 8 acks be
    // pending: each send past the eighth waits for an ack slot, which only the relay's
    // collecting of acks frees
    let narrow = async_nats::jetstream::context::ContextBuilder::new()
        .max_ack_inflight(8)
        .build(ctx.client.clone());
    let config = RelayConfig {
        ack_timeout: Duration::from_secs(3),
        ..Default::default()
    };
    let relay = Relay::new(ctx.pool().clone(), narrow, config)
        .await
        .unwrap();
    let report = relay.run_once().await.unwrap();
    assert_eq!((report.claimed, report.published), (40, 40), "{report:?}");
    assert_eq!((report.failed, report.skipped), (0, 0), "{report:?}");
    assert_eq!(ctx.stream_len().await, 40);
    ctx.delete_stream().await;
}

/// A lane keeps its connection between batches; one that the server ends while the lane waits
/// (an administrator's `pg_terminate_backend`, a server-wide `idle_session_timeout`) is checked
/// before the next batch and replaced: the next event goes out without a failed batch. The
/// relay's connections are told apart by their `application_name`; only the ones idle after a
/// batch's `commit` or `rollback` for 150 ms or more are ended (not the `LISTEN` or wake-up
/// connections, which have their own tests), so the lanes' next batch finds them idle past
/// the check's threshold. A current-thread runtime: the relay runs on the test's thread, where
/// the recording subscriber is the default.
#[tokio::test]
async fn a_lanes_connection_ended_while_it_waits_is_replaced_without_a_failed_batch() {
    let warnings = outbox_tests::warnings::Warnings::default();
    let _recording = warnings.record();
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let created = ctx.event_type("billing.subscription.created");
    let schemas = open_schemas(std::slice::from_ref(&created));
    let name = format!("outbox-kept-{}", Uuid::new_v4().simple());
    let config = RelayConfig {
        poll_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(config.pool_size())
        .connect_with(ctx.db.options.clone().application_name(&name))
        .await
        .unwrap();
    let relay = Relay::new(pool, ctx.js.clone(), config).await.unwrap();
    let relay = std::sync::Arc::new(relay);
    let (stop, running) = run_relay(relay.clone());
    let emit = |i: u32| {
        emit_committed(
            ctx.pool(),
            &schemas,
            raw_event(&created, "billing", format!("sub-{i}"))
                .data(json!({"i": i}))
                .build(),
        )
    };
    let first = emit(0).await;
    eventually(
        Duration::from_secs(10),
        "the first event published",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    // both lanes' connections, idle after a batch for long enough that the next batch checks
    // them, ended in one statement (or neither: a lane may be in a batch now)
    let end_idle_lanes = "with idle as materialized ( \
           select pid from pg_stat_activity where application_name = $1 and state = 'idle' \
              and query in ('commit', 'rollback') \
              and state_change < now() - interval '150 milliseconds') \
         select case when (select count(*) from idle) >= 2 \
                     then (select count(pg_terminate_backend(pid)) from idle) else 0 end";
    eventually(
        Duration::from_secs(10),
        "both lanes' idle connections ended",
        || async {
            sqlx::query_scalar::<_, i64>(end_idle_lanes)
                .bind(&name)
                .fetch_one(ctx.pool())
                .await
                .unwrap()
                >= 2
        },
    )
    .await;
    let second = emit(1).await;
    eventually(
        Duration::from_secs(5),
        "the next event published",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    stop.send(()).unwrap();
    running.await.unwrap();
    let got: Vec<Uuid> = ctx
        .read_stream()
        .await
        .iter()
        .map(|m| m.envelope.id)
        .collect();
    assert_eq!(got, [first, second]);
    let mut warned = warnings.messages();
    warned.retain(|m| !m.contains("has one replica"));
    assert_eq!(warned, Vec::<String>::new(), "no batch failed");
    ctx.delete_stream().await;
}
