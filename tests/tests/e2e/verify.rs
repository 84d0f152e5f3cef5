//! `verify`: the published rows of a range against the stream's messages. Messages deleted from
//! the stream are reported, exactly; `republish` puts them back through a relay with their
//! original ids; a range reaching before the stream's first message is reported; many small
//! pages find the same as one; a row marked long after its message was stored is still found.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_runtime::verify::{verify, Phase, VerifyEvent, VerifyOptions, VerifyReport};
use outbox_runtime::{Relay, RelayConfig, StreamSpec};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{eventually, run_relay};
use uuid::Uuid;

/// Inserts `n` unpublished rows of `event_type` over `subjects` subjects, as a backfill would.
async fn insert_rows(ctx: &Ctx, event_type: &str, n: i64, subjects: i64) {
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data) \
         select gen_random_uuid(), $1, 'verify', 's' || (g % $3), now(), jsonb_build_object('n', g) \
           from generate_series(1, $2) g",
    )
    .bind(event_type)
    .bind(n)
    .bind(subjects)
    .execute(ctx.pool())
    .await
    .expect("insert rows");
}

/// A relay on the test's table, running in the background.
async fn start_relay(
    ctx: &Ctx,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let relay = Relay::new(ctx.pool().clone(), ctx.js.clone(), RelayConfig::default())
        .await
        .expect("relay");
    run_relay(Arc::new(relay))
}

/// Runs a relay until nothing is unpublished, then stops it.
async fn drain(ctx: &Ctx) {
    let (stop, task) = start_relay(ctx).await;
    eventually(Duration::from_secs(60), "every row published", || async {
        ctx.db.unpublished().await == 0
    })
    .await;
    drop(stop);
    task.await.expect("relay task");
}

/// The oldest `published_at` of the table.
async fn first_published(ctx: &Ctx) -> DateTime<Utc> {
    sqlx::query_scalar("select min(published_at) from outbox_events")
        .fetch_one(ctx.pool())
        .await
        .expect("min(published_at)")
}

/// Deletes the stream messages at `positions` (indexes into the stream order); their ids.
async fn delete_messages(ctx: &Ctx, positions: &[usize]) -> HashSet<Uuid> {
    let messages = ctx.read_stream().await;
    let stream = ctx.js.get_stream(ctx.stream_name()).await.expect("stream");
    let mut ids = HashSet::new();
    for &p in positions {
        let m = &messages[p];
        assert!(stream.delete_message(m.seq).await.expect("delete"));
        ids.insert(m.envelope.id);
    }
    ids
}

/// Verifies `[from, now + 1 s)` of the test's stream with `tune` applied to the options.
async fn run_verify(
    ctx: &Ctx,
    from: DateTime<Utc>,
    tune: impl FnOnce(&mut VerifyOptions),
) -> (VerifyReport, Vec<Uuid>) {
    let to = Utc::now() + chrono::Duration::seconds(1);
    let mut options = VerifyOptions::new(ctx.stream_name(), from, to);
    tune(&mut options);
    let mut reported = Vec::new();
    let report = verify(ctx.pool(), &ctx.js, &options, |e| {
        if let VerifyEvent::Missing(row) = e {
            reported.push(row.id);
        }
    })
    .await
    .expect("verify");
    (report, reported)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_messages_are_reported_exactly_and_republish_puts_them_back_with_their_ids() {
    let ctx = Ctx::new().await;
    // A 1 s duplicate window: once it has passed, the stream no longer remembers the deleted
    // messages' ids, so their republished messages are stored, not dropped as duplicates.
    StreamSpec {
        duplicate_window: Duration::from_secs(1),
        ..ctx.stream_spec()
    }
    .ensure(&ctx.js)
    .await
    .expect("stream");
    let event_type = ctx.event_type("verify.row.changed");
    insert_rows(&ctx, &event_type, 200, 7).await;
    drain(&ctx).await;
    let deleted = delete_messages(&ctx, &[3, 50, 51, 120, 199]).await;
    let from = first_published(&ctx).await;

    let (report, reported) = run_verify(&ctx, from, |_| {}).await;
    assert_eq!(reported.iter().copied().collect::<HashSet<_>>(), deleted);
    assert_eq!(reported.len(), deleted.len(), "each missing row once");
    assert_eq!((report.rows, report.present, report.missing), (200, 195, 5));
    assert!(report.gaps().is_empty(), "{:?}", report.gaps());
    assert!(!report.all_present());
    assert_eq!(
        report.republished, 0,
        "nothing republished without the option"
    );

    tokio::time::sleep(Duration::from_secs(3)).await; // past the duplicate window
                                                      // A relay that runs meanwhile (its lanes past these rows) is woken and takes them.
    let (stop, task) = start_relay(&ctx).await;
    let (report, _) = run_verify(&ctx, from, |o| o.republish = true).await;
    assert_eq!(
        (report.missing, report.republished, report.deferred),
        (5, 5, 0)
    );
    eventually(
        Duration::from_secs(30),
        "the republished rows published",
        || async { ctx.db.unpublished().await == 0 },
    )
    .await;
    drop(stop);
    task.await.expect("relay task");
    let messages = ctx.read_stream().await;
    assert_eq!(messages.len(), 200, "the 195 left and the 5 republished");
    let again: HashSet<Uuid> = messages
        .iter()
        .filter(|m| deleted.contains(&m.envelope.id))
        .map(|m| {
            assert_eq!(
                m.msg_id,
                m.envelope.id.to_string(),
                "published under its own id"
            );
            m.envelope.id
        })
        .collect();
    assert_eq!(again, deleted);
    let (report, reported) = run_verify(&ctx, from, |_| {}).await;
    assert!(report.all_present(), "{report:?}");
    assert!(reported.is_empty());
    ctx.delete_stream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn republish_leaves_rows_whose_ids_the_stream_still_remembers() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await; // the default 10 minute duplicate window
    let event_type = ctx.event_type("verify.row.changed");
    insert_rows(&ctx, &event_type, 20, 3).await;
    drain(&ctx).await;
    let deleted = delete_messages(&ctx, &[5, 6]).await;
    let from = first_published(&ctx).await;
    let (report, reported) = run_verify(&ctx, from, |o| o.republish = true).await;
    assert_eq!(reported.into_iter().collect::<HashSet<_>>(), deleted);
    assert_eq!(
        (report.missing, report.republished, report.deferred),
        (2, 0, 2)
    );
    let until = report.deferred_until.expect("a time to run again");
    assert!(
        until > Utc::now() + chrono::Duration::seconds(500),
        "{until}"
    );
    assert_eq!(ctx.db.unpublished().await, 0, "no row set unpublished");
    // Why: inside the window a deleted message's id is still remembered, and publishing it
    // again is acknowledged as a duplicate without being stored.
    let id = deleted.iter().next().expect("a deleted id");
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", id.to_string().as_str());
    let before = ctx.stream_len().await;
    let ack = ctx
        .js
        .publish_with_headers(event_type.clone(), headers, "{}".into())
        .await
        .expect("publish")
        .await
        .expect("ack");
    assert!(
        ack.duplicate,
        "the stream remembers the deleted message's id"
    );
    assert_eq!(ctx.stream_len().await, before, "nothing stored");
    ctx.delete_stream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_starting_before_the_streams_first_message_is_reported() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("verify.row.changed");
    insert_rows(&ctx, &event_type, 30, 3).await;
    drain(&ctx).await;
    let from = first_published(&ctx).await;
    // The stream forgets the first 30 (as max_age or a purge would); 20 more come after.
    let stream = ctx.js.get_stream(ctx.stream_name()).await.expect("stream");
    stream.purge().await.expect("purge");
    insert_rows(&ctx, &event_type, 20, 3).await;
    drain(&ctx).await;

    let (report, reported) = run_verify(&ctx, from, |_| {}).await;
    assert!(
        reported.is_empty(),
        "rows before the stream are not called missing"
    );
    assert_eq!(report.rows, 50);
    assert_eq!(
        (report.before_stream, report.present, report.missing),
        (30, 20, 0)
    );
    let gaps = report.gaps();
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    assert!(gaps[0].contains("first message"), "{gaps:?}");
    assert!(gaps[0].contains("30 row(s)"), "{gaps:?}");
    assert!(!report.all_present());

    // From the stream's first message on, the range is whole again.
    let first = report.stream_first.expect("the stream has messages");
    let (report, _) = run_verify(&ctx, first, |_| {}).await;
    assert!(report.all_present(), "{:?}", report.gaps());
    assert_eq!(report.present, 20);
    ctx.delete_stream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_small_pages_find_exactly_the_missing_rows_and_skip_other_streams_types() {
    const ROWS: i64 = 3_000;
    const PAGE: usize = 100;
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("verify.row.changed");
    insert_rows(&ctx, &event_type, ROWS, 50).await;
    drain(&ctx).await;
    let positions: Vec<usize> = (0..40).map(|i| 1 + i * 73).collect();
    let deleted = delete_messages(&ctx, &positions).await;
    // Rows of a type this stream does not capture (another stream's), marked published.
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data, published_at) \
         select gen_random_uuid(), 'elsewhere.row.changed', 'verify', 'x', now(), '{}', now() \
           from generate_series(1, 25)",
    )
    .execute(ctx.pool())
    .await
    .expect("insert other rows");
    let from = first_published(&ctx).await;

    let mut pages = HashMap::<Phase, u64>::new();
    let mut last_done = 0;
    let to = Utc::now() + chrono::Duration::seconds(1);
    let mut options = VerifyOptions::new(ctx.stream_name(), from, to);
    options.page_size = PAGE;
    let mut reported = HashSet::new();
    let report = verify(ctx.pool(), &ctx.js, &options, |e| match e {
        VerifyEvent::Missing(row) => assert!(reported.insert(row.id), "reported twice"),
        VerifyEvent::Progress(p) => {
            *pages.entry(p.phase).or_default() += 1;
            if p.phase == Phase::Rows {
                assert!(
                    p.done - last_done <= PAGE as u64,
                    "a page is at most {PAGE} rows"
                );
                last_done = p.done;
                assert_eq!(p.total, ROWS as u64 + 25);
            }
        }
        _ => {}
    })
    .await
    .expect("verify");
    assert_eq!(reported, deleted);
    assert_eq!(
        pages[&Phase::Rows],
        (ROWS as u64 + 25).div_ceil(PAGE as u64)
    );
    assert_eq!(pages[&Phase::Suspects], 1, "40 suspects: one page");
    assert_eq!((report.rows, report.missing), (ROWS as u64, 40));
    assert_eq!(report.present, ROWS as u64 - 40);
    assert_eq!(report.not_captured, 25);
    assert_eq!(report.missing_rows.len(), 40);
    assert!(report.gaps().is_empty(), "{:?}", report.gaps());

    // With room for the whole stream in the reader's recent ids (8 pages of 1,000), the first
    // pass reads each message once however the pages overlap, and the second pass (the 40
    // suspects, from a duplicate window before the first) reads them once more.
    let (report, reported) = run_verify(&ctx, from, |o| {
        o.page_size = 1_000;
        o.clock_skew = Duration::ZERO;
    })
    .await;
    assert_eq!(reported.into_iter().collect::<HashSet<_>>(), deleted);
    assert_eq!(report.messages_read, 2 * (ROWS as u64 - 40));
    ctx.delete_stream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_marked_long_after_its_message_was_stored_is_found() {
    // A publish whose mark was lost is republished, the stream answers "duplicate" and the row
    // is marked long after its message was stored: the second pass, over the duplicate
    // window, finds it.
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("verify.row.changed");
    let ids: Vec<Uuid> = (0..5).map(|_| Uuid::now_v7()).collect();
    for id in &ids {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", id.to_string().as_str());
        ctx.js
            .publish_with_headers(event_type.clone(), headers, "{}".into())
            .await
            .expect("publish")
            .await
            .expect("ack");
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data, published_at) \
         select i, $2, 'verify', 's', now(), '{}', now() from unnest($1::uuid[]) i",
    )
    .bind(&ids)
    .bind(&event_type)
    .execute(ctx.pool())
    .await
    .expect("insert rows marked now");
    let from = first_published(&ctx).await;
    // The first pass reads only the stream messages stored from `from - 1 s` on.
    let (report, reported) = run_verify(&ctx, from, |o| {
        o.lag = Duration::from_millis(500);
        o.clock_skew = Duration::from_millis(500);
    })
    .await;
    assert!(
        reported.is_empty(),
        "found in the second pass: {reported:?}"
    );
    assert_eq!((report.rows, report.present), (5, 5));
    ctx.delete_stream().await;
}
