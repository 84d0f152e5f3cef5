//! Order at the consumer: freshness that is right when replicas race on a subject, an order
//! that does not trust the emitting hosts' clocks, and a retry that does not reorder its
//! subject.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use outbox_runtime::consumer::{
    Consumer, ConsumerConfig, Delivery, Handler, HandlerError, Outcome,
};
use outbox_runtime::order::{advance, advance_in_stream, Freshness, Position};
use outbox_runtime::{Envelope, OutboxEvent};
use outbox_testkit::eventually;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::consumer::{counter, setup, spawn, AccountOpened, STREAM};

/// Applies an event to `projection` only when it is fresh (stream order), remembering each
/// verdict; the event numbered `hold` keeps its transaction open for `hold_for` after taking
/// the subject's row lock, and says so on `locked`.
struct Project {
    verdicts: Arc<Mutex<Vec<(i64, Freshness)>>>,
    hold: Option<(i64, Arc<tokio::sync::Notify>)>,
    hold_for: Duration,
}

impl Project {
    fn new() -> Self {
        Project {
            verdicts: Arc::default(),
            hold: None,
            hold_for: Duration::ZERO,
        }
    }
}

impl Handler<AccountOpened> for Project {
    async fn handle(
        &self,
        delivery: &Delivery<AccountOpened>,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        let freshness = delivery.freshness(tx).await?;
        let n = delivery.event().n;
        self.verdicts.lock().expect("verdicts").push((n, freshness));
        if freshness.is_fresh() {
            sqlx::query(
                "insert into projection (account_id, n) values ($1, $2) \
                 on conflict (account_id) do update set n = excluded.n",
            )
            .bind(delivery.event().account_id)
            .bind(n)
            .execute(&mut *tx)
            .await?;
        }
        if let Some((held, locked)) = &self.hold {
            if *held == n {
                locked.notify_one();
                tokio::time::sleep(self.hold_for).await;
            }
        }
        Ok(())
    }
}

async fn projection_table(pool: &PgPool) {
    sqlx::query("create table projection (account_id uuid primary key, n bigint not null)")
        .execute(pool)
        .await
        .expect("create the projection");
}

async fn projected(pool: &PgPool, account: Uuid) -> Option<i64> {
    sqlx::query_scalar("select n from projection where account_id = $1")
        .bind(account)
        .fetch_optional(pool)
        .await
        .expect("read the projection")
}

fn envelope(account: Uuid, n: i64, time: DateTime<Utc>) -> Envelope<AccountOpened> {
    Envelope::new(
        Uuid::now_v7(),
        AccountOpened::EVENT_TYPE,
        "accounts",
        account.to_string(),
        time,
        AccountOpened {
            account_id: account,
            owner: "o".into(),
            n,
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_event_on_a_second_replica_waiting_for_a_newer_ones_lock_is_stale() {
    let s = setup(Duration::from_secs(60)).await;
    projection_table(&s.db.pool).await;
    let locked = Arc::new(tokio::sync::Notify::new());
    let newer_handler = Project {
        hold: Some((20, locked.clone())),
        hold_for: Duration::from_millis(1_500),
        ..Project::new()
    };
    let older_handler = Project::new();
    let older_verdicts = older_handler.verdicts.clone();
    // Two replicas under one durable name; an ack wait longer than the hold (the server ends
    // a message's transaction idle for longer)
    let config = || {
        let mut config = ConsumerConfig::new("race", STREAM);
        config.ack_wait = Duration::from_secs(10);
        config
    };
    let replica_a = Arc::new(Consumer::new(
        s.db.pool.clone(),
        s.js.clone(),
        config(),
        newer_handler,
    ));
    let replica_b = Consumer::new(s.db.pool.clone(), s.js.clone(), config(), older_handler);
    replica_a.durable().await.expect("durable");
    replica_b.durable().await.expect("durable");
    let account = Uuid::now_v7();
    let newer = replica_a.delivery(envelope(account, 20, Utc::now()), 1, 20, None);
    let older = replica_b.delivery(envelope(account, 10, Utc::now()), 2, 10, None);
    let stream_created = newer.stream_created;
    assert!(
        stream_created > DateTime::UNIX_EPOCH,
        "the stream's creation time"
    );

    let newer_task = {
        let replica_a = replica_a.clone();
        tokio::spawn(async move { replica_a.apply(&newer).await })
    };
    locked.notified().await;
    let started = Instant::now();
    let outcome = replica_b
        .apply(&older)
        .await
        .expect("apply the older event");
    assert!(
        started.elapsed() >= Duration::from_millis(1_000),
        "the older event waited for the newer one's row lock ({:?})",
        started.elapsed()
    );
    assert_eq!(outcome, Outcome::Handled);
    assert_eq!(
        newer_task.await.expect("task").expect("apply the newer"),
        Outcome::Handled
    );
    assert_eq!(
        older_verdicts.lock().expect("verdicts").as_slice(),
        [(
            10,
            Freshness::Stale {
                applied: Position::Stream {
                    created: stream_created,
                    sequence: 20
                }
            }
        )]
    );
    assert_eq!(
        projected(&s.db.pool, account).await,
        Some(20),
        "the newer state stays"
    );
}

/// `first` advances in a transaction held open while `second` runs in another; returns the
/// second's verdict, after checking that it waited for the first's commit.
async fn race<F, G, A, B>(pool: &PgPool, first: F, second: G) -> Freshness
where
    F: FnOnce(sqlx::Transaction<'static, sqlx::Postgres>) -> A,
    A: std::future::Future<Output = sqlx::Transaction<'static, sqlx::Postgres>>,
    G: FnOnce(sqlx::Transaction<'static, sqlx::Postgres>) -> B + Send + 'static,
    B: std::future::Future<Output = Freshness> + Send,
{
    let tx = first(pool.begin().await.expect("begin")).await;
    let pool2 = pool.clone();
    let waiting = tokio::spawn(async move {
        let tx = pool2.begin().await.expect("begin");
        second(tx).await
    });
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        !waiting.is_finished(),
        "the second transaction waits for the subject's row"
    );
    tx.commit().await.expect("commit the first");
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the second finishes after the commit")
        .expect("task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advance_raced_directly_returns_stale_for_the_older_event_on_both_bases() {
    let s = setup(Duration::from_secs(60)).await;
    let pool = &s.db.pool;
    let t = |secs: i64| DateTime::from_timestamp(1_700_000_000 + secs, 0).expect("time");
    let created = t(0);
    for existing in [false, true] {
        let subject = format!("acct-{existing}");
        if existing {
            // The subject already has an older position, committed before the race.
            let mut c = pool.acquire().await.expect("conn");
            advance(&mut c, "c", &subject, t(5)).await.expect("advance");
            advance_in_stream(&mut c, "c", &subject, created, 5)
                .await
                .expect("advance");
        }
        let (s1, s2) = (subject.clone(), subject.clone());
        let verdict = race(
            pool,
            |mut tx| async move {
                let f = advance(&mut tx, "c", &s1, t(20)).await.expect("advance");
                assert!(f.is_fresh());
                tx
            },
            move |mut tx| async move {
                let f = advance(&mut tx, "c", &s2, t(10)).await.expect("advance");
                tx.commit().await.expect("commit");
                f
            },
        )
        .await;
        assert_eq!(
            verdict,
            Freshness::Stale {
                applied: Position::Time(t(20))
            },
            "event time, row existing before: {existing}"
        );
        let (s1, s2) = (subject.clone(), subject.clone());
        let verdict = race(
            pool,
            |mut tx| async move {
                let f = advance_in_stream(&mut tx, "c", &s1, created, 20)
                    .await
                    .expect("advance");
                assert!(f.is_fresh());
                tx
            },
            move |mut tx| async move {
                let f = advance_in_stream(&mut tx, "c", &s2, created, 10)
                    .await
                    .expect("advance");
                tx.commit().await.expect("commit");
                f
            },
        )
        .await;
        assert_eq!(
            verdict,
            Freshness::Stale {
                applied: Position::Stream {
                    created,
                    sequence: 20
                }
            },
            "stream order, row existing before: {existing}"
        );
    }
    // Equal positions are fresh; a stream created later is above every sequence of the old one.
    let mut c = pool.acquire().await.expect("conn");
    assert!(advance(&mut c, "c", "acct-true", t(20))
        .await
        .expect("advance")
        .is_fresh());
    assert!(advance_in_stream(&mut c, "c", "acct-true", created, 20)
        .await
        .expect("advance")
        .is_fresh());
    assert!(advance_in_stream(&mut c, "c", "acct-true", t(1), 1)
        .await
        .expect("advance")
        .is_fresh());
    assert!(!advance_in_stream(&mut c, "c", "acct-true", created, 30)
        .await
        .expect("advance")
        .is_fresh());
}

#[tokio::test]
async fn an_event_stamped_by_a_clock_a_second_ahead_does_not_hide_the_next_one() {
    let s = setup(Duration::from_secs(60)).await;
    projection_table(&s.db.pool).await;
    let account = Uuid::now_v7();
    // Host A's clock runs 1 s ahead; host B's event is newer (committed and published after).
    let now = Utc::now();
    let ahead = envelope(account, 1, now + chrono::TimeDelta::seconds(1));
    let newer = envelope(account, 2, now);
    for e in [&ahead, &newer] {
        s.js.publish(
            AccountOpened::EVENT_TYPE,
            serde_json::to_vec(e).expect("json").into(),
        )
        .await
        .expect("publish")
        .await
        .expect("ack");
    }
    let handler = Project::new();
    let verdicts = handler.verdicts.clone();
    let name = "skewed";
    let (stop, task) = spawn(s.consumer(name, handler));
    eventually(Duration::from_secs(10), "both handled", || async {
        counter("outbox_consumer_handled_total", name) == 2
    })
    .await;
    drop(stop);
    task.await.expect("consumer task");
    assert_eq!(
        projected(&s.db.pool, account).await,
        Some(2),
        "the newer one applies"
    );
    assert!(verdicts
        .lock()
        .expect("verdicts")
        .iter()
        .all(|(_, f)| f.is_fresh()));
    // The event-time basis, by contrast, trusts the clocks: it calls the newer one stale.
    let mut c = s.db.pool.acquire().await.expect("conn");
    advance(&mut c, "by-time", "a", ahead.time)
        .await
        .expect("advance");
    assert!(!advance(&mut c, "by-time", "a", newer.time)
        .await
        .expect("advance")
        .is_fresh());
}

/// Records the order effects apply in; fails once on event `n = 1` of `account`.
struct FailOnce {
    account: Uuid,
    failed: AtomicBool,
}

impl Handler<AccountOpened> for FailOnce {
    async fn handle(
        &self,
        delivery: &Delivery<AccountOpened>,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        let e = delivery.event();
        if e.account_id == self.account && e.n == 1 && !self.failed.swap(true, Ordering::SeqCst) {
            return Err("the first try of event 1 fails".into());
        }
        sqlx::query("insert into applied (account_id, n) values ($1, $2)")
            .bind(e.account_id)
            .bind(e.n)
            .execute(tx)
            .await?;
        Ok(())
    }
}

#[tokio::test]
async fn a_failing_event_holds_its_subjects_later_events_and_lets_other_subjects_flow() {
    let s = setup(Duration::from_secs(60)).await;
    sqlx::query(
        "create table applied (seq bigserial primary key, account_id uuid not null, n bigint not null)",
    )
    .execute(&s.db.pool)
    .await
    .expect("create the table");
    let held = Uuid::now_v7();
    let others: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
    for n in 1..=3 {
        s.emit_for(held, n).await;
        s.emit_for(others[n as usize - 1], n).await;
    }
    s.drain().await;
    let name = "hold";
    let mut consumer_config = outbox_runtime::consumer::ConsumerConfig::new(name, "ACCOUNTS");
    consumer_config.retry_base = Duration::from_millis(300);
    consumer_config.retry_max = Duration::from_secs(1);
    consumer_config.ack_wait = Duration::from_secs(5);
    let consumer = outbox_runtime::consumer::Consumer::new(
        s.db.pool.clone(),
        s.js.clone(),
        consumer_config,
        FailOnce {
            account: held,
            failed: AtomicBool::new(false),
        },
    );
    let (stop, task) = spawn(consumer);
    eventually(Duration::from_secs(15), "all six applied", || async {
        counter("outbox_consumer_handled_total", name) == 6
    })
    .await;
    drop(stop);
    task.await.expect("consumer task");
    let rows: Vec<(i64, Uuid, i64)> =
        sqlx::query_as("select seq, account_id, n from applied order by seq")
            .fetch_all(&s.db.pool)
            .await
            .expect("read");
    let of_held: Vec<i64> = rows.iter().filter(|r| r.1 == held).map(|r| r.2).collect();
    assert_eq!(
        of_held,
        [1, 2, 3],
        "the subject's effects in order: {rows:?}"
    );
    let first_of_held = rows.iter().position(|r| r.1 == held).expect("applied");
    assert_eq!(
        first_of_held, 3,
        "the other subjects flowed while event 1 waited for its retry: {rows:?}"
    );
    assert!(counter("outbox_consumer_held_total", name) >= 2);
    assert_eq!(counter("outbox_consumer_failures_total", name), 1);
}
