//! Consumers against operator mistakes and foreign producers: a durable or stream deleted
//! while running, a durable configured differently, two types under one name, a durable
//! created again after its dedupe rows were pruned, dead letters in the event's own stream,
//! and format details at decode.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy};
use outbox_runtime::consumer::{
    decode_with, Consumer, ConsumerConfig, Delivery, FormatCheck, Handler, HandlerError, Transient,
};
use outbox_runtime::{OutboxEvent, StorageType, StreamSpec};
use outbox_testkit::{eventually, TestDb};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use tracing::instrument::WithSubscriber;
use uuid::Uuid;

use crate::consumer::{counter, setup, AccountOpened, Flaky, Record, Setup, STREAM};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(
    event_type = "accounts.account.closed",
    source = "accounts",
    schema = "schemas/consumer/accounts.account.closed.schema.json"
)]
struct AccountClosed {
    account_id: Uuid,
    closed_at: String,
}

struct Ignore;

impl Handler<AccountClosed> for Ignore {
    async fn handle(
        &self,
        _: &Delivery<AccountClosed>,
        _: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// Counts the log lines (info and above) of the futures it is attached to.
struct LineCounter(Arc<AtomicUsize>);

impl tracing::Subscriber for LineCounter {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::INFO
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if event.metadata().level() <= &tracing::Level::INFO {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Runs `consumer` in the background, counting its log lines in `lines`.
fn spawn_counted<H: Handler<AccountOpened>>(
    consumer: Consumer<AccountOpened, H>,
    lines: Arc<AtomicUsize>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = async move {
        consumer
            .run(async {
                let _ = stopped.await;
            })
            .await
            .expect("the consumer runs");
    };
    let task = tokio::spawn(run.with_subscriber(LineCounter(lines)));
    (stop, task)
}

async fn durable_exists(s: &Setup, name: &str) -> bool {
    match s.js.get_stream(STREAM).await {
        Ok(stream) => stream.consumer_info(name).await.is_ok(),
        Err(_) => false,
    }
}

#[tokio::test]
async fn a_deleted_durable_or_stream_is_retried_at_a_bounded_rate_and_nothing_is_lost() {
    let s = setup(Duration::from_secs(60)).await;
    for n in 0..5 {
        s.emit(n).await;
    }
    s.drain().await;
    let name = "deleted-durable";
    let lines = Arc::new(AtomicUsize::new(0));
    let (stop, task) = spawn_counted(s.consumer(name, Record), lines.clone());
    eventually(
        Duration::from_secs(10),
        "the first five handled",
        || async { s.effects().await.0 == 5 },
    )
    .await;

    // An operator deletes the durable while it runs.
    let before = lines.load(Ordering::SeqCst);
    s.js.get_stream(STREAM)
        .await
        .expect("stream")
        .delete_consumer(name)
        .await
        .expect("delete the durable");
    for n in 5..10 {
        s.emit(n).await;
    }
    s.drain().await;
    eventually(
        Duration::from_secs(30),
        "the durable back and every event handled",
        || async { s.effects().await.0 == 10 },
    )
    .await;
    assert!(
        durable_exists(&s, name).await,
        "the durable was created again"
    );
    let durable_lines = lines.load(Ordering::SeqCst) - before;
    assert_eq!(s.effects().await, (10, 10), "nothing lost, nothing twice");

    // The stream is deleted; for 3 s the consumer finds none; then it is created again.
    let before = lines.load(Ordering::SeqCst);
    s.js.delete_stream(STREAM).await.expect("delete the stream");
    tokio::time::sleep(Duration::from_secs(3)).await;
    StreamSpec {
        name: STREAM.into(),
        subjects: vec!["accounts.>".into()],
        storage: StorageType::Memory,
        ..Default::default()
    }
    .ensure(&s.js)
    .await
    .expect("create the stream again");
    for n in 10..13 {
        s.emit(n).await;
    }
    s.drain().await;
    eventually(
        Duration::from_secs(30),
        "the durable back on the new stream and the new events handled",
        || async { s.effects().await.0 == 13 },
    )
    .await;
    let stream_lines = lines.load(Ordering::SeqCst) - before;
    drop(stop);
    task.await.expect("consumer task");
    assert_eq!(s.effects().await, (13, 13));
    // Measured: a handful of lines each (one per try, 100 ms doubling to 5 s), not thousands.
    assert!(
        durable_lines <= 12,
        "{durable_lines} log lines while the durable was gone"
    );
    assert!(
        stream_lines <= 20,
        "{stream_lines} log lines while the stream was gone"
    );
    eprintln!("log lines: durable deleted {durable_lines}, stream deleted {stream_lines}");
}

#[tokio::test]
async fn a_durable_with_another_filter_or_max_deliver_is_refused_at_start_naming_each_difference() {
    let s = setup(Duration::from_secs(60)).await;
    let name = "misconfigured";
    let stream = s.js.get_stream(STREAM).await.expect("stream");
    stream
        .create_consumer(pull::Config {
            durable_name: Some(name.into()),
            filter_subject: "accounts.account.closed".into(),
            ack_policy: AckPolicy::Explicit,
            ack_wait: Duration::from_secs(1),
            max_deliver: 5,
            ..Default::default()
        })
        .await
        .expect("an operator's durable");
    let err = s
        .consumer(name, Record)
        .run(async {})
        .await
        .expect_err("refused at start")
        .to_string();
    for expected in [
        "durable consumer `misconfigured` on stream `ACCOUNTS`",
        "filter subject is `accounts.account.closed`",
        "needs `accounts.account.opened`",
        "max_deliver is 5",
        "nats consumer rm ACCOUNTS misconfigured",
    ] {
        assert!(err.contains(expected), "{expected:?} not in: {err}");
    }
    assert!(!err.contains("ack_wait"), "ack_wait is the same: {err}");
    let info = stream.consumer_info(name).await.expect("still there");
    assert_eq!(info.config.max_deliver, 5, "nothing changed on the server");
}

#[tokio::test]
async fn two_consumer_types_under_one_name_are_refused_at_start() {
    let s = setup(Duration::from_secs(60)).await;
    let name = "shared-name";
    s.consumer(name, Record)
        .durable()
        .await
        .expect("the first type");
    let config = || ConsumerConfig::new(name, STREAM);
    let second =
        Consumer::<AccountClosed, _>::new(s.db.pool.clone(), s.js.clone(), config(), Ignore);
    let err = second.run(async {}).await.expect_err("refused").to_string();
    assert!(
        err.contains("`shared-name` is registered to event type `accounts.account.opened`")
            && err.contains("decodes `accounts.account.closed`"),
        "{err}"
    );
    // Another service's database does not know the name: the durable's filter refuses it.
    let elsewhere = TestDb::new().await;
    let second =
        Consumer::<AccountClosed, _>::new(elsewhere.pool.clone(), s.js.clone(), config(), Ignore);
    let err = second.durable().await.expect_err("refused").to_string();
    assert!(
        err.contains("filter subject is `accounts.account.opened`"),
        "{err}"
    );
}

/// How the dedupe rows of the first five events disappear before the durable is reset.
enum Pruned {
    /// By retention, which records the horizon.
    ByRetention,
    /// By hand, outside the crate; `ConsumerConfig::keep_dedupe` bounds the replay.
    ByHand,
}

/// Five events consumed, their dedupe rows pruned after `keep`, the durable deleted, two more
/// events: the durable created again applies the two, not the five again.
async fn reset_after_pruning(pruned: Pruned) {
    let s = setup(Duration::from_secs(60)).await;
    let name = "reset";
    let keep = Duration::from_secs(3);
    let consumer = || {
        let mut config = ConsumerConfig::new(name, STREAM);
        if matches!(pruned, Pruned::ByHand) {
            config.keep_dedupe = Some(keep);
        }
        config.retry_base = Duration::from_millis(50);
        config.ack_wait = Duration::from_secs(1);
        Consumer::new(s.db.pool.clone(), s.js.clone(), config, Record)
    };
    for n in 0..5 {
        s.emit(n).await;
    }
    s.drain().await;
    let (stop, task) = crate::consumer::spawn(consumer());
    eventually(Duration::from_secs(10), "five handled", || async {
        s.effects().await.0 == 5
    })
    .await;
    drop(stop);
    task.await.expect("consumer task");
    tokio::time::sleep(keep + Duration::from_millis(500)).await;
    let deleted = match pruned {
        Pruned::ByRetention => outbox_runtime::retention::prune_dedupe(&s.db.pool, keep, 100)
            .await
            .expect("prune"),
        Pruned::ByHand => sqlx::query("delete from outbox_consumed")
            .execute(&s.db.pool)
            .await
            .expect("delete")
            .rows_affected(),
    };
    assert_eq!(deleted, 5);
    // An operator resets the durable.
    s.js.get_stream(STREAM)
        .await
        .expect("stream")
        .delete_consumer(name)
        .await
        .expect("delete the durable");
    for n in 5..7 {
        s.emit(n).await;
    }
    s.drain().await;
    let (stop, task) = crate::consumer::spawn(consumer());
    eventually(
        Duration::from_secs(10),
        "the two new ones handled",
        || async { s.effects().await.0 >= 7 },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    drop(stop);
    task.await.expect("consumer task");
    assert_eq!(
        s.effects().await,
        (7, 7),
        "the five older events were not applied again"
    );
}

#[tokio::test]
async fn a_durable_created_again_after_retention_pruned_the_dedupe_rows_applies_nothing_twice() {
    reset_after_pruning(Pruned::ByRetention).await;
}

#[tokio::test]
async fn a_durable_created_again_after_dedupe_rows_were_deleted_by_hand_starts_at_keep_dedupe() {
    reset_after_pruning(Pruned::ByHand).await;
}

#[tokio::test]
async fn a_durable_created_again_with_no_dedupe_row_ever_pruned_replays_the_stream_safely() {
    let s = setup(Duration::from_secs(60)).await;
    let name = "replay";
    for n in 0..3 {
        s.emit(n).await;
    }
    s.drain().await;
    let (stop, task) = crate::consumer::spawn(s.consumer(name, Record));
    eventually(Duration::from_secs(10), "three handled", || async {
        s.effects().await.0 == 3
    })
    .await;
    drop(stop);
    task.await.expect("consumer task");
    s.js.get_stream(STREAM)
        .await
        .expect("stream")
        .delete_consumer(name)
        .await
        .expect("delete the durable");
    let (stop, task) = crate::consumer::spawn(s.consumer(name, Record));
    eventually(Duration::from_secs(10), "the stream replayed", || async {
        counter("outbox_consumer_duplicates_total", name) == 3
    })
    .await;
    drop(stop);
    task.await.expect("consumer task");
    assert_eq!(s.effects().await, (3, 3), "replayed as duplicates");
}

#[tokio::test]
async fn a_dead_letter_in_the_events_own_stream_is_stored_with_its_reason_and_original_id() {
    let s = setup(Duration::from_secs(60)).await;
    let id = s.emit(1).await;
    s.drain().await;
    let name = "dead-letters";
    let subject = "accounts.deadletter.opened";
    let mut config = crate::consumer::quick_config(name, 2);
    config.dead_letter = Some(subject.into());
    let flaky = Flaky {
        calls: Arc::new(AtomicU32::new(0)),
        fail: u32::MAX,
    };
    let (stop, task) = crate::consumer::spawn(Consumer::new(
        s.db.pool.clone(),
        s.js.clone(),
        config,
        flaky,
    ));
    eventually(Duration::from_secs(10), "given up", || async {
        counter("outbox_consumer_gave_up_total", name) == 1
    })
    .await;
    drop(stop);
    task.await.expect("consumer task");
    let stream = s.js.get_stream(STREAM).await.expect("stream");
    let letter = stream
        .get_last_raw_message_by_subject(subject)
        .await
        .expect("the dead letter is stored in the event's own stream");
    let header = |name: &str| {
        letter
            .headers
            .get(name)
            .map(|v| v.as_str().to_owned())
            .unwrap_or_else(|| panic!("header {name} on the dead letter"))
    };
    assert_eq!(header("Outbox-Original-Id"), id.to_string());
    assert_eq!(
        header("Nats-Msg-Id"),
        format!(
            "dead-letter:{name}:{id}:{}",
            header("Outbox-Original-Sequence")
        )
    );
    assert_eq!(header("Outbox-Dead-Letter-Kind"), "gave-up");
    assert_eq!(header("Outbox-Rejected-By"), name);
    assert_eq!(header("Outbox-Original-Subject"), AccountOpened::EVENT_TYPE);
    assert!(
        header("Outbox-Rejected-Reason").contains("flaky failure 2"),
        "{}",
        header("Outbox-Rejected-Reason")
    );
    let body: serde_json::Value = serde_json::from_slice(&letter.payload).expect("json");
    assert_eq!(body["id"], id.to_string(), "the original payload");
    assert_eq!(counter("outbox_consumer_dead_letters_total", name), 1);
    let attempts: Vec<i32> = sqlx::query_scalar("select attempts from outbox_consumer_attempts")
        .fetch_all(&s.db.pool)
        .await
        .expect("attempts");
    assert_eq!(
        attempts,
        [2],
        "the attempts row stays, so a redelivery already on its way is not handled again"
    );
}

/// Fails every call but its third, which fails transiently.
struct FailsButThirdTransiently {
    calls: Arc<AtomicU32>,
}

impl Handler<AccountOpened> for FailsButThirdTransiently {
    async fn handle(
        &self,
        _: &Delivery<AccountOpened>,
        _: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if call == 3 {
            return Err(Box::new(Transient(
                format!("transient failure {call}").into(),
            )));
        }
        Err(format!("failure {call}").into())
    }
}

/// An operator replays a dead letter (its payload published back to the event's subject, under
/// the event's id) and the event gives up again, within the letters' duplicate window. Each
/// replay is a stream message of its own, and so is its letter: a replay that gives up is never
/// left without one, even where the operator deleted the first. Without its attempts row
/// deleted, a replay whose first delivery does not reach the handler (here it fails
/// transiently) gives up at its next; with the row deleted, it has `max_attempts` again.
#[tokio::test]
async fn a_replayed_dead_letter_that_gives_up_again_is_dead_lettered_again() {
    // the events' duplicate window is short, so a replay under the event's id is stored
    let s = setup(Duration::from_millis(200)).await;
    let id = s.emit(1).await;
    s.drain().await;
    s.letters_stream().await;
    let name = "replayed";
    let mut config = crate::consumer::quick_config(name, 2);
    config.dead_letter = Some("letters.replayed".into());
    let calls = Arc::new(AtomicU32::new(0));
    let handler = FailsButThirdTransiently {
        calls: calls.clone(),
    };
    let (stop, task) = crate::consumer::spawn(Consumer::new(
        s.db.pool.clone(),
        s.js.clone(),
        config,
        handler,
    ));
    let letters = || outbox_testkit::stream_len(&s.js, "LETTERS");
    let letter_stream = s.js.get_stream("LETTERS").await.expect("stream");
    let last_letter = || async {
        letter_stream
            .get_last_raw_message_by_subject("letters.replayed")
            .await
            .expect("a letter")
    };
    eventually(Duration::from_secs(10), "the first letter", || async {
        letters().await == 1
    })
    .await;
    let first = last_letter().await;
    // replays the letter past the events' duplicate window; returns its stream sequence
    let replay = || async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", id.to_string().as_str());
        let stored =
            s.js.publish_with_headers(AccountOpened::EVENT_TYPE, headers, first.payload.clone())
                .await
                .expect("replay")
                .await
                .expect("the replay stored");
        assert!(!stored.duplicate, "the replay is stored past the window");
        stored.sequence
    };
    let msg_id = |letter: &async_nats::jetstream::message::StreamMessage| {
        letter
            .headers
            .get("Nats-Msg-Id")
            .map(|v| v.as_str().to_owned())
    };

    // as it is: the replay's first delivery fails transiently, its next gives up at once
    let sequence = replay().await;
    eventually(Duration::from_secs(10), "the replay's letter", || async {
        letters().await == 2
    })
    .await;
    assert_eq!(
        msg_id(&last_letter().await),
        Some(format!("dead-letter:{name}:{id}:{sequence}"))
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "no attempt after the transient one"
    );

    // with its attempts row deleted: two attempts, then a letter
    sqlx::query("delete from outbox_consumer_attempts where consumer = $1 and event_id = $2")
        .bind(name)
        .bind(id)
        .execute(&s.db.pool)
        .await
        .expect("delete the attempts row");
    let sequence = replay().await;
    eventually(
        Duration::from_secs(10),
        "the second replay's letter",
        || async { letters().await == 3 },
    )
    .await;
    assert_eq!(
        msg_id(&last_letter().await),
        Some(format!("dead-letter:{name}:{id}:{sequence}"))
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(stop);
    task.await.expect("consumer task");
    assert_eq!(letters().await, 3);
    assert_eq!(calls.load(Ordering::SeqCst), 5, "two more attempts");
    assert_eq!(counter("outbox_consumer_dead_letters_total", name), 3);
    assert_eq!(s.effects().await, (0, 0));
}

#[test]
fn format_details_another_validator_accepts_are_not_rejected_by_default() {
    let body = |closed_at: &str, account_id: &str| {
        serde_json::to_vec(&serde_json::json!({
            "specversion": "1.0", "id": Uuid::now_v7(), "type": AccountClosed::EVENT_TYPE,
            "source": "accounts", "subject": "s", "time": "2026-11-30T12:00:00Z",
            "datacontenttype": "application/json",
            "data": { "account_id": account_id, "closed_at": closed_at },
        }))
        .expect("json")
    };
    let account = Uuid::now_v7().to_string();
    // A date-time without an offset: RFC 3339 wants one, other validators let it pass (and
    // draft 2020-12 makes formats annotations unless asked).
    let no_offset = body("2026-11-30T12:00:00", &account);
    let lenient = decode_with::<AccountClosed>(&no_offset, FormatCheck::Lenient)
        .expect("the default accepts it");
    assert_eq!(lenient.data.closed_at, "2026-11-30T12:00:00");
    let strict = decode_with::<AccountClosed>(&no_offset, FormatCheck::Strict)
        .expect_err("strict checks formats");
    assert!(
        strict.reason.contains("/closed_at") && strict.reason.contains("format"),
        "{}",
        strict.reason
    );
    // the reason goes into logs and dead-letter headers: the rule, never the value
    assert!(
        !strict.reason.contains("2026-11-30T12:00:00"),
        "{}",
        strict.reason
    );
    // What breaks the Rust type is still rejected, whatever the format setting.
    let not_a_uuid = body("2026-11-30T12:00:00Z", "not-a-uuid");
    let rejected = decode_with::<AccountClosed>(&not_a_uuid, FormatCheck::Lenient)
        .expect_err("a uuid field that does not parse");
    assert!(
        rejected
            .reason
            .contains("does not fit `accounts.account.closed`"),
        "{}",
        rejected.reason
    );
    assert!(
        rejected
            .reason
            .contains("at `/account_id` (format): is not a valid `uuid`")
            && !rejected.reason.contains("not-a-uuid"),
        "names the field and the rule, not the value: {}",
        rejected.reason
    );
}
