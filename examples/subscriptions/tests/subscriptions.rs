//! The service's own tests, written the way a service built on the outbox tests itself: with
//! `outbox-testkit` against a real Postgres and a private nats-server, and no sleeps.
//!
//! They need Postgres at `DATABASE_URL` (default `postgres://root@127.0.0.1/test`) and a
//! `nats-server` binary (`NATS_SERVER_BIN`, or on `PATH`); `scripts/services` provides both.

use std::time::Duration;

use outbox_runtime::{Relay, RelayConfig, StreamSpec};
use outbox_testkit::{connect_nats, drain, emitted, read_stream, wait_handled, NatsServer, TestDb};
use subscriptions::api::{open, CreateSubscription};
use subscriptions::events::{Plan, SubscriptionCreated};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

fn request(customer_id: Uuid, seats: u64) -> CreateSubscription {
    CreateSubscription {
        customer_id,
        plan: Plan::Pro,
        seats,
        trial_days: None,
        coupon: None,
    }
}

async fn database() -> TestDb {
    let db = TestDb::empty().await;
    subscriptions::migrate(&db.pool)
        .await
        .expect("the service's tables");
    db
}

/// Rows in `outbox_events`, published or not.
async fn outbox_rows(db: &TestDb) -> i64 {
    sqlx::query_scalar("select count(*) from outbox_events")
        .fetch_one(&db.pool)
        .await
        .expect("count")
}

#[tokio::test]
async fn opening_a_subscription_emits_its_created_event_in_the_same_transaction() {
    let db = database().await;
    let customer = Uuid::now_v7();

    let mut tx = db.pool.begin().await.expect("begin");
    let opened = open(&mut tx, request(customer, 3)).await.expect("opened");
    let events = emitted::<SubscriptionCreated>(&mut tx).await;
    assert_eq!(events.len(), 1, "one event: {events:?}");
    assert_eq!(events[0].id, opened.event_id);
    assert_eq!(events[0].subject, opened.subscription_id.to_string());
    assert_eq!(events[0].event.customer_id, customer);
    assert_eq!(events[0].event.plan, Plan::Pro);
    assert_eq!(events[0].event.seats.get(), 3);

    // rolled back, the row and its event are gone together
    tx.rollback().await.expect("rollback");
    assert_eq!(outbox_rows(&db).await, 0);
}

#[tokio::test]
async fn a_subscription_past_the_seat_limit_is_refused_before_anything_commits() {
    let db = database().await;
    let customer = Uuid::now_v7();

    let mut tx = db.pool.begin().await.expect("begin");
    open(&mut tx, request(customer, 6_000))
        .await
        .expect("the first");
    let refused = open(&mut tx, request(customer, 6_000)).await;
    assert!(refused.is_err(), "the second passes the limit: {refused:?}");
    // the refusal leaves the transaction to the caller, with both events in it: the handler
    // drops it, and nothing of the request is ever published
    assert_eq!(emitted::<SubscriptionCreated>(&mut tx).await.len(), 2);
    drop(tx);
    assert_eq!(outbox_rows(&db).await, 0);
}

#[tokio::test]
async fn a_created_subscription_is_published_and_welcomed_once() {
    let db = database().await;
    let nats = NatsServer::spawn().await;
    let js = async_nats::jetstream::new(connect_nats(&nats.url()).await);
    StreamSpec::new(subscriptions::STREAM, ["billing.>"])
        .ensure(&js)
        .await
        .expect("the stream");

    let customer = Uuid::now_v7();
    let mut tx = db.pool.begin().await.expect("begin");
    let opened = open(&mut tx, request(customer, 2)).await.expect("opened");
    tx.commit().await.expect("commit");

    let relay = Relay::new(db.pool.clone(), js.clone(), RelayConfig::default())
        .await
        .expect("the relay");
    assert_eq!(drain(&relay).await.published, 1);
    let stored = read_stream(&js, subscriptions::STREAM).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].msg_id, opened.event_id.to_string());

    let consumer = subscriptions::welcome_consumer(db.pool.clone(), js.clone());
    consumer.durable().await.expect("the durable");
    let stop = CancellationToken::new();
    let running = {
        let stop = stop.clone();
        tokio::spawn(async move { consumer.run(stop.cancelled_owned()).await })
    };
    wait_handled(
        &db.pool,
        subscriptions::WELCOME_CONSUMER,
        opened.event_id,
        Duration::from_secs(30),
    )
    .await;
    stop.cancel();
    running
        .await
        .expect("the consumer task")
        .expect("the consumer");

    let welcomed: Vec<(Uuid, Uuid)> =
        sqlx::query_as("select subscription_id, event_id from welcome_intents")
            .fetch_all(&db.pool)
            .await
            .expect("intents");
    assert_eq!(welcomed, vec![(opened.subscription_id, opened.event_id)]);
}
