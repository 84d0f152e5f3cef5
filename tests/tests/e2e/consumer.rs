//! Idempotent consumers against a real Postgres and a real (private) nats-server: duplicates
//! handled once, retries, replicas sharing a durable, undecodable messages, and the metrics
//! that report each.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use outbox_runtime::consumer::{
    decode, Consumer, ConsumerConfig, Delivery, Handler, HandlerError, Outcome, Undecodable,
};
use outbox_runtime::{EmitExt, OutboxEvent, Relay, RelayConfig, StorageType, StreamSpec};
use outbox_testkit::{connect_nats, eventually, NatsServer, TestDb};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(
    event_type = "accounts.account.opened",
    source = "accounts",
    schema = "schemas/consumer/accounts.account.opened.schema.json"
)]
pub(crate) struct AccountOpened {
    pub(crate) account_id: Uuid,
    pub(crate) owner: String,
    pub(crate) n: i64,
}

pub(crate) const STREAM: &str = "ACCOUNTS";

/// The total of counter `name` for `consumer` so far.
pub(crate) fn counter(name: &str, consumer: &str) -> u64 {
    outbox_tests::recorded::counter(name, &[("consumer", consumer)])
}

/// A private broker with the fixture's stream, and a migrated database with the handler's table.
pub(crate) struct Setup {
    pub(crate) db: TestDb,
    _nats: NatsServer,
    pub(crate) js: async_nats::jetstream::Context,
    pub(crate) relay: Relay,
}

pub(crate) async fn setup(duplicate_window: Duration) -> Setup {
    outbox_tests::recorded::install();
    let db = TestDb::new().await;
    sqlx::query("create table effects (event_id uuid not null, account_id uuid not null, n bigint not null)")
        .execute(&db.pool)
        .await
        .expect("create the handler's table");
    let nats = NatsServer::spawn().await;
    let js = async_nats::jetstream::new(connect_nats(&nats.url()).await);
    StreamSpec {
        name: STREAM.into(),
        subjects: vec!["accounts.>".into()],
        storage: StorageType::Memory,
        duplicate_window,
        ..Default::default()
    }
    .ensure(&js)
    .await
    .expect("create the stream");
    let relay = Relay::new(
        db.pool.clone(),
        js.clone(),
        RelayConfig {
            backoff_max: Duration::from_secs(1),
            ..Default::default()
        },
    )
    .await
    .expect("a relay");
    Setup {
        db,
        _nats: nats,
        js,
        relay,
    }
}

impl Setup {
    pub(crate) async fn emit(&self, n: i64) -> Uuid {
        self.emit_for(Uuid::now_v7(), n).await
    }

    /// Emits event `n` about `account_id` (the event's subject).
    pub(crate) async fn emit_for(&self, account_id: Uuid, n: i64) -> Uuid {
        let mut tx = self.db.pool.begin().await.expect("begin");
        let id = tx
            .emit(AccountOpened {
                account_id,
                owner: format!("owner-{n}"),
                n,
            })
            .await
            .expect("emit");
        tx.commit().await.expect("commit");
        id
    }

    /// Runs the relay until the table has nothing left to publish.
    pub(crate) async fn drain(&self) {
        outbox_testkit::drain(&self.relay).await;
    }

    pub(crate) async fn effects(&self) -> (i64, i64) {
        sqlx::query_as("select count(*), count(distinct event_id) from effects")
            .fetch_one(&self.db.pool)
            .await
            .expect("count effects")
    }

    /// Creates `LETTERS`, a stream of its own for dead letters to `letters.>`.
    pub(crate) async fn letters_stream(&self) {
        StreamSpec {
            name: "LETTERS".into(),
            subjects: vec!["letters.>".into()],
            storage: StorageType::Memory,
            ..Default::default()
        }
        .ensure(&self.js)
        .await
        .expect("create the letters' stream");
    }

    pub(crate) fn consumer<H: Handler<AccountOpened>>(
        &self,
        name: &str,
        handler: H,
    ) -> Consumer<AccountOpened, H> {
        self.consumer_capped(
            name,
            handler,
            ConsumerConfig::new(name, STREAM).max_attempts,
        )
    }

    pub(crate) fn consumer_capped<H: Handler<AccountOpened>>(
        &self,
        name: &str,
        handler: H,
        max_attempts: u32,
    ) -> Consumer<AccountOpened, H> {
        let config = quick_config(name, max_attempts);
        Consumer::new(self.db.pool.clone(), self.js.clone(), config, handler)
    }
}

/// The suite's consumer configuration: durable `name` on the fixture's stream, giving up after
/// `max_attempts`, with retries from 50 ms to 200 ms and an ack wait of 1 s.
pub(crate) fn quick_config(name: &str, max_attempts: u32) -> ConsumerConfig {
    let mut config = ConsumerConfig::new(name, STREAM);
    config.max_attempts = max_attempts;
    config.retry_base = Duration::from_millis(50);
    config.retry_max = Duration::from_millis(200);
    config.ack_wait = Duration::from_secs(1);
    config
}

/// Records every handled event in `effects`.
pub(crate) struct Record;

impl Handler<AccountOpened> for Record {
    async fn handle(
        &self,
        delivery: &Delivery<AccountOpened>,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        sqlx::query("insert into effects (event_id, account_id, n) values ($1, $2, $3)")
            .bind(delivery.id())
            .bind(delivery.event().account_id)
            .bind(delivery.event().n)
            .execute(tx)
            .await?;
        Ok(())
    }
}

/// Runs `consumer` in the background until the returned sender is dropped or fires.
pub(crate) fn spawn<H: Handler<AccountOpened>>(
    consumer: Consumer<AccountOpened, H>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        consumer
            .run(async {
                let _ = stopped.await;
            })
            .await
            .expect("the consumer runs");
    });
    (stop, task)
}

#[tokio::test]
async fn a_republished_event_is_handled_once_and_counted_as_a_duplicate() {
    // A short duplicate window, so JetStream stores the relay's republish a second time, as it
    // would after a crash outlasting the window.
    let s = setup(Duration::from_millis(200)).await;
    let id = s.emit(1).await;
    s.drain().await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The mark is lost (as when the relay dies after the ack): the row is published again.
    sqlx::query("update outbox_events set published_at = null where id = $1")
        .bind(id)
        .execute(&s.db.pool)
        .await
        .expect("unmark");
    s.drain().await;
    let mut info = s.js.get_stream(STREAM).await.expect("stream");
    assert_eq!(
        info.info().await.expect("info").state.messages,
        2,
        "the stream holds the event twice"
    );

    let name = "dup-republished";
    let (stop, task) = spawn(s.consumer(name, Record));
    eventually(Duration::from_secs(10), "both copies consumed", || async {
        counter("outbox_consumer_handled_total", name)
            + counter("outbox_consumer_duplicates_total", name)
            == 2
    })
    .await;
    drop(stop);
    task.await.expect("consumer task");
    assert_eq!(s.effects().await, (1, 1), "handled once");
    assert_eq!(counter("outbox_consumer_handled_total", name), 1);
    assert_eq!(counter("outbox_consumer_duplicates_total", name), 1);
}

#[tokio::test]
async fn a_redelivery_after_a_lost_ack_is_acked_without_handling() {
    let s = setup(Duration::from_secs(60)).await;
    s.emit(7).await;
    s.drain().await;
    let name = "dup-lost-ack";
    let consumer = s.consumer(name, Record);
    let durable = consumer.durable().await.expect("durable consumer");
    let mut messages = durable.messages().await.expect("pull");
    let first = messages.next().await.expect("a message").expect("ok");
    // The relay's publish trace travels with the message (W3C traceparent).
    let traceparent = first
        .headers
        .as_ref()
        .and_then(|h| h.get("traceparent"))
        .map(|v| v.as_str().to_owned())
        .expect("a traceparent header");
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(
        (parts[0], parts[1].len(), parts[2].len(), parts[3]),
        ("00", 32, 16, "01")
    );
    assert!(parts[1..3]
        .iter()
        .all(|p| p.chars().all(|c| c.is_ascii_hexdigit())));
    // Handle and commit, but never ack: the ack is lost.
    let envelope = decode::<AccountOpened>(&first.payload).expect("decodes");
    let delivery = consumer.delivery(envelope, 1, 1, None);
    assert_eq!(
        consumer.apply(&delivery).await.expect("apply"),
        Outcome::Handled
    );
    // After the ack wait JetStream delivers it again; this time the dedupe row refuses it.
    let again = tokio::time::timeout(Duration::from_secs(10), messages.next())
        .await
        .expect("redelivered within the ack wait")
        .expect("a message")
        .expect("ok");
    assert_eq!(again.info().expect("info").delivered, 2);
    assert_eq!(
        consumer.process(again).await.expect("process"),
        Outcome::Duplicate
    );
    assert_eq!(s.effects().await, (1, 1), "handled once");
    assert_eq!(counter("outbox_consumer_duplicates_total", name), 1);
    assert_eq!(counter("outbox_consumer_redeliveries_total", name), 1);
}

/// Fails the first `fail` calls (after writing, so a rollback must undo the write).
pub(crate) struct Flaky {
    pub(crate) calls: Arc<AtomicU32>,
    pub(crate) fail: u32,
}

impl Handler<AccountOpened> for Flaky {
    async fn handle(
        &self,
        delivery: &Delivery<AccountOpened>,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        Record.handle(delivery, tx).await?;
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if call <= self.fail {
            return Err(format!("flaky failure {call}").into());
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_handler_that_fails_twice_then_succeeds_takes_effect_once() {
    let s = setup(Duration::from_secs(60)).await;
    s.emit(3).await;
    s.drain().await;
    let name = "flaky";
    let calls = Arc::new(AtomicU32::new(0));
    let (stop, task) = spawn(s.consumer(
        name,
        Flaky {
            calls: calls.clone(),
            fail: 2,
        },
    ));
    eventually(
        Duration::from_secs(10),
        "handled after two failures",
        || async { counter("outbox_consumer_handled_total", name) == 1 },
    )
    .await;
    drop(stop);
    task.await.expect("consumer task");
    assert_eq!(calls.load(Ordering::SeqCst), 3, "two failures, one success");
    assert_eq!(
        s.effects().await,
        (1, 1),
        "the failed attempts' writes were rolled back"
    );
    assert_eq!(counter("outbox_consumer_failures_total", name), 2);
    assert_eq!(counter("outbox_consumer_gave_up_total", name), 0);
}

#[tokio::test]
async fn a_handler_that_always_fails_is_terminated_and_reported_after_the_cap() {
    let s = setup(Duration::from_secs(60)).await;
    s.emit(4).await;
    s.drain().await;
    let name = "hopeless";
    let calls = Arc::new(AtomicU32::new(0));
    let flaky = Flaky {
        calls: calls.clone(),
        fail: u32::MAX,
    };
    let (stop, task) = spawn(s.consumer_capped(name, flaky, 3));
    eventually(Duration::from_secs(10), "given up", || async {
        counter("outbox_consumer_gave_up_total", name) == 1
    })
    .await;
    // Terminated: no further delivery comes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(stop);
    task.await.expect("consumer task");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "handled exactly max_attempts times"
    );
    assert_eq!(s.effects().await, (0, 0));
}

/// The delivery that gives up cannot store its dead letter (no stream captures the subject
/// yet): the message comes back, and a redelivery stores the letter without calling the
/// handler again. Found by the harness, where a stream leader on a frozen node refused the
/// letter and the redelivery terminated the message without one.
#[tokio::test]
async fn a_dead_letter_that_could_not_be_stored_when_its_event_gave_up_is_stored_by_a_redelivery() {
    let s = setup(Duration::from_secs(60)).await;
    let id = s.emit(5).await;
    s.drain().await;
    let name = "unlettered";
    let calls = Arc::new(AtomicU32::new(0));
    let mut config = quick_config(name, 2);
    config.dead_letter = Some("letters.unlettered".into());
    let flaky = Flaky {
        calls: calls.clone(),
        fail: u32::MAX,
    };
    let (stop, task) = spawn(Consumer::new(
        s.db.pool.clone(),
        s.js.clone(),
        config,
        flaky,
    ));
    eventually(Duration::from_secs(10), "given up", || async {
        counter("outbox_consumer_gave_up_total", name) == 1
    })
    .await;
    // a few redeliveries fail to store it too, then a stream captures the subject
    tokio::time::sleep(Duration::from_millis(700)).await;
    s.letters_stream().await;
    eventually(Duration::from_secs(10), "the letter stored", || async {
        outbox_testkit::stream_len(&s.js, "LETTERS").await == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(stop);
    task.await.expect("consumer task");
    assert_eq!(
        outbox_testkit::stream_len(&s.js, "LETTERS").await,
        1,
        "one letter, and the message terminated after it"
    );
    let letter =
        s.js.get_stream("LETTERS")
            .await
            .expect("stream")
            .get_last_raw_message_by_subject("letters.unlettered")
            .await
            .expect("the dead letter");
    let original = letter
        .headers
        .get("Outbox-Original-Id")
        .map(|v| v.as_str().to_owned());
    assert_eq!(original, Some(id.to_string()));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the handler ran max_attempts times, no more"
    );
    assert_eq!(counter("outbox_consumer_gave_up_total", name), 1);
    assert_eq!(counter("outbox_consumer_dead_letters_total", name), 1);
    assert_eq!(s.effects().await, (0, 0));
}

/// An undecodable message whose dead letter cannot be stored yet (no stream captures the
/// subject) comes back until it can: it is counted as rejected once, at its first delivery, not
/// at every try.
#[tokio::test]
async fn an_undecodable_message_is_counted_once_however_many_tries_its_letter_takes() {
    let s = setup(Duration::from_secs(60)).await;
    s.js.publish(AccountOpened::EVENT_TYPE, "not an envelope".into())
        .await
        .expect("publish")
        .await
        .expect("stored");
    let name = "garbage";
    let mut config = quick_config(name, 2);
    config.undecodable = Undecodable::DeadLetter {
        subject: "letters.garbage".into(),
    };
    let (stop, task) = spawn(Consumer::new(
        s.db.pool.clone(),
        s.js.clone(),
        config,
        Record,
    ));
    // a few tries fail to store the letter (each comes back after retry_max, 200 ms)
    eventually(Duration::from_secs(10), "two tries more", || async {
        counter("outbox_consumer_redeliveries_total", name) >= 2
    })
    .await;
    assert_eq!(counter("outbox_consumer_rejected_total", name), 1);
    assert_eq!(counter("outbox_consumer_dead_letters_total", name), 0);
    s.letters_stream().await;
    eventually(Duration::from_secs(10), "the letter stored", || async {
        outbox_testkit::stream_len(&s.js, "LETTERS").await == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(stop);
    task.await.expect("consumer task");
    assert_eq!(counter("outbox_consumer_rejected_total", name), 1);
    assert_eq!(counter("outbox_consumer_dead_letters_total", name), 1);
    assert_eq!(outbox_testkit::stream_len(&s.js, "LETTERS").await, 1);
}

/// Silences its own path to Postgres (no close, no reset), then records the event: the
/// write never arrives, and the transaction that holds the event's dedupe row waits. With
/// `mid_result`, it first sends a query whose result is far larger than the socket buffers
/// hold, made slowly (a megabyte every 10 ms for 10 s), and silences its path 300 ms into it:
/// the server blocks sending, a session that is not idle.
struct SilencesItsPath {
    proxy: Arc<outbox_testkit::TcpProxy>,
    calls: Arc<AtomicU32>,
    mid_result: bool,
}

impl Handler<AccountOpened> for SilencesItsPath {
    async fn handle(
        &self,
        delivery: &Delivery<AccountOpened>,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if !self.mid_result {
            self.proxy.freeze();
            return Record.handle(delivery, tx).await;
        }
        let read = async {
            let mut rows = sqlx::query(
                "select repeat('x', 1048576), pg_sleep(0.01) from generate_series(1, 1000)",
            )
            .fetch(&mut *tx);
            while let Some(row) = rows.next().await {
                row?;
            }
            Ok::<(), sqlx::Error>(())
        };
        let silence = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            self.proxy.freeze();
        };
        tokio::join!(read, silence).0?;
        Record.handle(delivery, tx).await
    }
}

/// Replica a of consumer `name` silences its path to Postgres in its handler
/// ([`SilencesItsPath`]); replica b, direct, must handle the redelivered event `within`, once.
async fn a_silent_replica_does_not_hold_the_event(name: &str, mid_result: bool, within: Duration) {
    let s = setup(Duration::from_secs(60)).await;
    s.emit(1).await;
    s.drain().await;
    let direct = s.db.pool.connect_options().as_ref().clone();
    let proxy = Arc::new(
        outbox_testkit::TcpProxy::start(format!("{}:{}", direct.get_host(), direct.get_port()))
            .await,
    );
    let silent_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(direct.clone().host("127.0.0.1").port(proxy.port()))
        .await
        .expect("a pool through the proxy");
    let config = || {
        let mut config = quick_config(name, ConsumerConfig::new(name, STREAM).max_attempts);
        config.ack_wait = Duration::from_secs(2);
        config
    };
    let calls = Arc::new(AtomicU32::new(0));
    let silencing = SilencesItsPath {
        proxy: proxy.clone(),
        calls: calls.clone(),
        mid_result,
    };
    let (stop_a, task_a) = spawn(Consumer::new(
        silent_pool,
        s.js.clone(),
        config(),
        silencing,
    ));
    eventually(Duration::from_secs(10), "replica a in its handler", || {
        std::future::ready(calls.load(Ordering::SeqCst) == 1)
    })
    .await;
    let (stop_b, task_b) = spawn(Consumer::new(
        s.db.pool.clone(),
        s.js.clone(),
        config(),
        Record,
    ));
    // redelivered after the ack wait, the event waits for replica a's session to end
    eventually(
        within,
        "the event handled by replica b while replica a's path is silent",
        || async { s.effects().await == (1, 1) },
    )
    .await;
    proxy.thaw();
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop((stop_a, stop_b));
    task_b.await.expect("replica b lives to its shutdown");
    task_a.await.expect("replica a lives to its shutdown");
    assert_eq!(s.effects().await, (1, 1), "once");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "replica a got it once");
}

/// A replica whose path to Postgres goes silent in the middle of a message (a frozen network
/// path, a frozen process) leaves its transaction open, holding the event's dedupe row. The
/// server ends that session once it has been idle in its transaction for the ack wait, so the
/// redelivery to another replica handles the event, once, instead of waiting on the row for
/// as long as the path stays silent (and handling nothing else meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_database_path_goes_silent_mid_message_does_not_hold_the_event_from_the_others(
) {
    a_silent_replica_does_not_hold_the_event("silent", false, Duration::from_secs(15)).await;
}

/// Fails its first call, but only once another session waits on the message's transaction
/// (a redelivery of the event on another replica, waiting on the dedupe row), or after 15 s;
/// records the event on any later call.
struct FailsOnceWaitedOn {
    calls: Arc<AtomicU32>,
    waited_on: Arc<std::sync::atomic::AtomicBool>,
}

impl Handler<AccountOpened> for FailsOnceWaitedOn {
    async fn handle(
        &self,
        delivery: &Delivery<AccountOpened>,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) > 0 {
            return Record.handle(delivery, tx).await;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        // statements keep the transaction busy, so the idle timeout does not end it
        while tokio::time::Instant::now() < deadline {
            let waited_on: bool = sqlx::query_scalar(
                "select exists (select 1 from pg_locks \
                  where not granted and pg_backend_pid() = any(pg_blocking_pids(pid)))",
            )
            .fetch_one(&mut *tx)
            .await?;
            if waited_on {
                self.waited_on.store(true, Ordering::SeqCst);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err("the last attempt fails while a redelivery waits".into())
    }
}

/// The last allowed attempt fails while an `ack_wait` redelivery of the event, on another
/// replica, waits on its dedupe row. The failure is counted before the row is let go, so the
/// redelivery finds the event given up: dead-lettered once, never applied. Counted after the
/// row's release, the redelivery ran the handler again, and the event was both applied and
/// dead-lettered. The replicas' sessions default to repeatable read, whose snapshot, taken
/// before the wait, would not show the count: the message's transaction is read committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_waiting_on_a_failing_last_attempt_finds_the_event_given_up() {
    let s = setup(Duration::from_secs(60)).await;
    let id = s.emit(1).await;
    s.drain().await;
    s.letters_stream().await;
    let options = s.db.pool.connect_options().as_ref().clone();
    let repeatable = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.options([("default_transaction_isolation", "repeatable read")]))
        .await
        .expect("a pool of repeatable read sessions");
    let name = "busy-last";
    let mut config = quick_config(name, 1);
    config.dead_letter = Some("letters.busy-last".into());
    let calls = Arc::new(AtomicU32::new(0));
    let waited_on = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let a = Arc::new(Consumer::new(
        repeatable.clone(),
        s.js.clone(),
        config.clone(),
        FailsOnceWaitedOn {
            calls: calls.clone(),
            waited_on: waited_on.clone(),
        },
    ));
    let b = Consumer::new(repeatable, s.js.clone(), config, Record);
    // The test pulls for both replicas, so the redelivery cannot go to the busy one.
    let durable = a.durable().await.expect("open the durable");
    let pull = || async {
        durable
            .fetch()
            .max_messages(1)
            .expires(Duration::from_secs(10))
            .messages()
            .await
            .expect("pull")
            .next()
            .await
            .expect("a message within 10 s")
            .expect("a message")
    };
    let first = pull().await;
    let started = calls.clone();
    let replica_a = {
        let a = a.clone();
        tokio::spawn(async move { a.process(first).await })
    };
    // replica a holds the dedupe row before the redelivery (after the ack wait, 1 s) is pulled
    eventually(Duration::from_secs(10), "replica a in its handler", || {
        std::future::ready(started.load(Ordering::SeqCst) == 1)
    })
    .await;
    let again = pull().await;
    assert!(again.info().expect("info").delivered > 1, "a redelivery");
    let by_b = b.process(again).await.expect("replica b settles it");
    let by_a = replica_a
        .await
        .expect("replica a's task")
        .expect("replica a settles it");
    assert!(
        waited_on.load(Ordering::SeqCst),
        "replica b waited on replica a's attempt"
    );
    assert!(
        matches!(by_a, Outcome::GaveUp { earlier: false, .. }),
        "replica a's last attempt gives up: {by_a:?}"
    );
    assert!(
        matches!(by_b, Outcome::GaveUp { earlier: true, .. }),
        "replica b finds it given up: {by_b:?}"
    );
    assert_eq!(s.effects().await, (0, 0), "never applied");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "one attempt, the allowed one"
    );
    assert_eq!(
        outbox_testkit::stream_len(&s.js, "LETTERS").await,
        1,
        "one dead letter"
    );
    let letter =
        s.js.get_stream("LETTERS")
            .await
            .expect("stream")
            .get_last_raw_message_by_subject("letters.busy-last")
            .await
            .expect("the dead letter");
    let original = letter
        .headers
        .get("Outbox-Original-Id")
        .map(|v| v.as_str().to_owned());
    assert_eq!(original, Some(id.to_string()));
}

/// A failed attempt deletes the dedupe row it inserted as it counts itself. Where the delete
/// cannot (a row-level security policy hides the row from it), the attempt is not committed:
/// committed with its dedupe row, it would record the event as consumed, never applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_whose_dedupe_row_cannot_be_deleted_records_nothing() {
    let s = setup(Duration::from_secs(60)).await;
    let id = s.emit(1).await;
    s.drain().await;
    let role = format!("rls_consumer_{}", Uuid::now_v7().simple());
    for statement in [
        format!("create role {role} login"),
        format!("grant select, insert, update, delete on all tables in schema public to {role}"),
        "alter table outbox_consumed enable row level security".into(),
        format!("create policy added on outbox_consumed for insert to {role} with check (true)"),
        format!("create policy seen on outbox_consumed for select to {role} using (true)"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&s.db.pool)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    let options = s.db.pool.connect_options().as_ref().clone();
    let as_role = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options.username(&role))
        .await
        .expect("a pool of the role");
    let name = "hidden";
    let consumer = Consumer::new(
        as_role.clone(),
        s.js.clone(),
        quick_config(name, 1),
        Flaky {
            calls: Arc::new(AtomicU32::new(0)),
            fail: u32::MAX,
        },
    );
    let durable = consumer.durable().await.expect("open the durable");
    let message = durable
        .fetch()
        .max_messages(1)
        .expires(Duration::from_secs(10))
        .messages()
        .await
        .expect("pull")
        .next()
        .await
        .expect("a message within 10 s")
        .expect("a message");
    let outcome = consumer.process(message).await.expect("settled");
    let recorded: (i64, i64) = sqlx::query_as(
        "select (select count(*) from outbox_consumed where event_id = $1), \
                (select count(*) from outbox_consumer_attempts where event_id = $1)",
    )
    .bind(id)
    .fetch_one(&s.db.pool)
    .await
    .expect("read as the owner");
    as_role.close().await;
    for statement in [format!("drop owned by {role}"), format!("drop role {role}")] {
        sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&s.db.pool)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    match &outcome {
        Outcome::Transient { error, .. } => {
            assert!(error.contains("could not be deleted"), "{error}")
        }
        other => panic!("a transient failure, retried: {other:?}"),
    }
    assert_eq!(recorded, (0, 0), "neither consumed nor counted");
}

/// Like the replica above whose path goes silent between its statements, but while the server
/// sends it a large result: the session is busy, not idle, so the idle timeout does not end
/// it. Its connection's TCP user timeout, the ack wait during the message's transaction, does,
/// and the event is handled once elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_path_goes_silent_while_the_server_sends_it_a_result_does_not_hold_the_event(
) {
    a_silent_replica_does_not_hold_the_event("silent-mid-result", true, Duration::from_secs(30))
        .await;
}

/// The session's idle-in-transaction timeout and TCP user timeout, as `SHOW` has them (the
/// latter in milliseconds, without a unit).
const TIMEOUTS: &str = "select current_setting('idle_in_transaction_session_timeout') \
    || ' ' || current_setting('tcp_user_timeout')";

/// Reads the idle-in-transaction and TCP user timeouts of the message's transaction.
struct ReadsItsTimeout {
    seen: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Handler<AccountOpened> for ReadsItsTimeout {
    async fn handle(
        &self,
        _: &Delivery<AccountOpened>,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        let timeouts: String = sqlx::query_scalar(TIMEOUTS).fetch_one(tx).await?;
        self.seen.lock().expect("seen").push(timeouts);
        Ok(())
    }
}

/// A message's transaction may sit idle, or leave what the server sends unacknowledged, for the
/// ack wait, or for less where the session already says so (a role's or a connection's setting
/// is not loosened); the session's own settings are back once the transaction ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_messages_transaction_may_sit_idle_for_the_ack_wait_or_the_sessions_shorter_timeout() {
    let s = setup(Duration::from_secs(60)).await;
    s.emit(1).await;
    s.drain().await;
    let options = s.db.pool.connect_options().as_ref().clone();
    let stricter = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options.options([
            ("idle_in_transaction_session_timeout", "700"),
            ("tcp_user_timeout", "500"),
        ]))
        .await
        .expect("a pool whose sessions have shorter timeouts");
    for (name, pool, expected) in [
        ("timeout-default", s.db.pool.clone(), "3s 3000"),
        ("timeout-stricter", stricter.clone(), "700ms 500"),
    ] {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut config = ConsumerConfig::new(name, STREAM);
        config.ack_wait = Duration::from_secs(3);
        let handler = ReadsItsTimeout { seen: seen.clone() };
        let (stop, task) = spawn(Consumer::new(pool, s.js.clone(), config, handler));
        eventually(Duration::from_secs(10), "the event handled", || {
            std::future::ready(!seen.lock().expect("seen").is_empty())
        })
        .await;
        drop(stop);
        task.await.expect("consumer task");
        assert_eq!(seen.lock().expect("seen").as_slice(), [expected], "{name}");
    }
    let after: String = sqlx::query_scalar(TIMEOUTS)
        .fetch_one(&stricter)
        .await
        .expect("read the settings");
    assert_eq!(
        after, "700ms 500",
        "the session's own settings once the transaction ended"
    );
}

#[tokio::test]
async fn two_replicas_share_ten_thousand_events_and_each_takes_effect_once() {
    const EVENTS: i64 = 10_000;
    let s = setup(Duration::from_secs(60)).await;
    // Emit in a few large transactions (the order of emits within one is kept).
    let mut tx = s.db.pool.begin().await.expect("begin");
    for n in 0..EVENTS {
        tx.emit(AccountOpened {
            account_id: Uuid::now_v7(),
            owner: "replicas".into(),
            n,
        })
        .await
        .expect("emit");
        if n % 2_000 == 1_999 {
            tx.commit().await.expect("commit");
            tx = s.db.pool.begin().await.expect("begin");
        }
    }
    tx.commit().await.expect("commit");
    s.drain().await;

    let name = "replicas";
    let (stop_a, task_a) = spawn(s.consumer(name, Record));
    let (stop_b, task_b) = spawn(s.consumer(name, Record));
    eventually(Duration::from_secs(120), "every event handled", || async {
        s.effects().await.0 >= EVENTS
    })
    .await;
    drop((stop_a, stop_b));
    task_a.await.expect("replica a");
    task_b.await.expect("replica b");
    assert_eq!(
        s.effects().await,
        (EVENTS, EVENTS),
        "each event took effect exactly once"
    );
    let dedupe: i64 =
        sqlx::query_scalar("select count(*) from outbox_consumed where consumer = $1")
            .bind(name)
            .fetch_one(&s.db.pool)
            .await
            .expect("count dedupe rows");
    assert_eq!(dedupe, EVENTS);
}

/// Records every handled event like [`Record`], after its write panics on event `poison`.
struct PanicsOn {
    poison: i64,
}

impl Handler<AccountOpened> for PanicsOn {
    async fn handle(
        &self,
        delivery: &Delivery<AccountOpened>,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        Record.handle(delivery, tx).await?;
        if delivery.event().n == self.poison {
            panic!("poison account {}", delivery.event().account_id);
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_is_a_failed_attempt_that_gives_up_into_the_dead_letters_and_both_replicas_live(
) {
    const GOOD: i64 = 100;
    let s = setup(Duration::from_secs(60)).await;
    let poison_account = Uuid::now_v7();
    for n in 0..GOOD / 2 {
        s.emit(n).await;
    }
    let poison = s.emit_for(poison_account, GOOD).await;
    for n in GOOD / 2..GOOD {
        s.emit(n).await;
    }
    s.drain().await;

    let name = "panicking";
    let subject = "accounts.deadletter.panicking";
    let replica = || {
        let mut config = quick_config(name, 3);
        config.dead_letter = Some(subject.into());
        Consumer::new(
            s.db.pool.clone(),
            s.js.clone(),
            config,
            PanicsOn { poison: GOOD },
        )
    };
    let (stop_a, task_a) = spawn(replica());
    let (stop_b, task_b) = spawn(replica());
    eventually(
        Duration::from_secs(30),
        "the good events handled and the poison one given up",
        || async {
            s.effects().await.0 >= GOOD && counter("outbox_consumer_gave_up_total", name) >= 1
        },
    )
    .await;
    // Terminated: no replica gets it again, and both are still running.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !task_a.is_finished() && !task_b.is_finished(),
        "a replica stopped"
    );
    drop((stop_a, stop_b));
    task_a.await.expect("replica a lives to its shutdown");
    task_b.await.expect("replica b lives to its shutdown");

    assert_eq!(
        s.effects().await,
        (GOOD, GOOD),
        "each good event took effect once, and the poison one's write was rolled back"
    );
    let poisoned: i64 = sqlx::query_scalar("select count(*) from effects where event_id = $1")
        .bind(poison)
        .fetch_one(&s.db.pool)
        .await
        .expect("count");
    assert_eq!(poisoned, 0);
    assert_eq!(counter("outbox_consumer_gave_up_total", name), 1);
    assert_eq!(counter("outbox_consumer_failures_total", name), 3);
    assert_eq!(counter("outbox_consumer_handled_total", name), GOOD as u64);
    let attempts: Vec<(i32, String)> = sqlx::query_as(
        "select attempts, last_error from outbox_consumer_attempts where consumer = $1",
    )
    .bind(name)
    .fetch_all(&s.db.pool)
    .await
    .expect("attempts");
    let panic_message = format!("the handler panicked: poison account {poison_account}");
    assert_eq!(attempts, [(3, panic_message.clone())]);

    let letter =
        s.js.get_stream(STREAM)
            .await
            .expect("stream")
            .get_last_raw_message_by_subject(subject)
            .await
            .expect("the dead letter");
    let header = |name: &str| {
        letter
            .headers
            .get(name)
            .map(|v| v.as_str().to_owned())
            .unwrap_or_else(|| panic!("header {name} on the dead letter"))
    };
    assert_eq!(header("Outbox-Original-Id"), poison.to_string());
    assert_eq!(header("Outbox-Dead-Letter-Kind"), "gave-up");
    assert!(
        header("Outbox-Rejected-Reason").contains(&panic_message),
        "{}",
        header("Outbox-Rejected-Reason")
    );
}

#[tokio::test]
async fn undecodable_messages_are_rejected_with_the_id_and_reason_and_the_consumer_goes_on() {
    let s = setup(Duration::from_secs(60)).await;
    let name = "bad-input";
    let consumer = s.consumer(name, Record);
    let durable = consumer.durable().await.expect("durable consumer");
    let good = serde_json::to_value(AccountOpened {
        account_id: Uuid::now_v7(),
        owner: "x".into(),
        n: 1,
    })
    .expect("json");
    let envelope = |event_type: &str, data: serde_json::Value| {
        serde_json::json!({
            "specversion": "1.0", "id": Uuid::now_v7(), "type": event_type, "source": "accounts",
            "subject": "s", "time": "2026-11-30T12:00:00Z", "datacontenttype": "application/json",
            "data": data,
        })
    };
    let wrong_type = envelope("accounts.account.closed", good.clone());
    let mut invalid_data = good.clone();
    invalid_data["n"] = serde_json::json!(-4242);
    invalid_data["owner"] = serde_json::json!(["s3cret-card-4111"]);
    let invalid = envelope(AccountOpened::EVENT_TYPE, invalid_data);
    let bodies: Vec<Vec<u8>> = vec![
        b"this is not json".to_vec(),
        serde_json::to_vec(&wrong_type).expect("json"),
        serde_json::to_vec(&invalid).expect("json"),
    ];
    for body in &bodies {
        s.js.publish(AccountOpened::EVENT_TYPE, body.clone().into())
            .await
            .expect("publish")
            .await
            .expect("ack");
    }
    let mut messages = durable.messages().await.expect("pull");
    let mut outcomes = Vec::new();
    for _ in 0..bodies.len() {
        let m = messages.next().await.expect("a message").expect("ok");
        outcomes.push(
            consumer
                .process(m)
                .await
                .expect("process never fails on bad input"),
        );
    }
    let reasons: Vec<(Option<Uuid>, String)> = outcomes
        .into_iter()
        .map(|o| match o {
            Outcome::Rejected { event_id, reason } => (event_id, reason),
            other => panic!("expected a rejection, got {other:?}"),
        })
        .collect();
    assert_eq!(reasons[0].0, None);
    assert!(
        reasons[0].1.contains("not a CloudEvents envelope"),
        "{}",
        reasons[0].1
    );
    assert_eq!(
        reasons[1].0.map(|i| i.to_string()),
        wrong_type["id"].as_str().map(String::from)
    );
    assert!(
        reasons[1]
            .1
            .contains("`accounts.account.closed` is not `accounts.account.opened`"),
        "{}",
        reasons[1].1
    );
    assert_eq!(
        reasons[2].0.map(|i| i.to_string()),
        invalid["id"].as_str().map(String::from)
    );
    assert!(
        reasons[2].1.contains("/n") && reasons[2].1.contains("minimum"),
        "{}",
        reasons[2].1
    );
    // the reason is logged and put in dead-letter headers: the rule, never the value
    assert!(
        reasons[2]
            .1
            .contains("at `/owner` (type): must be of type string")
            && !reasons[2].1.contains("4242")
            && !reasons[2].1.contains("s3cret"),
        "{}",
        reasons[2].1
    );
    assert_eq!(counter("outbox_consumer_rejected_total", name), 3);

    // Terminated, not redelivered; a valid event after them is handled.
    s.emit(9).await;
    s.drain().await;
    let next = tokio::time::timeout(Duration::from_secs(10), messages.next())
        .await
        .expect("the valid event arrives")
        .expect("a message")
        .expect("ok");
    assert_eq!(
        consumer.process(next).await.expect("process"),
        Outcome::Handled
    );
    assert_eq!(s.effects().await, (1, 1));
}
