//! Emit, relay and consume through the published crates, against a real Postgres
//! (`DATABASE_URL`) and a private nats-server (`NATS_SERVER_BIN`, or `nats-server` on `PATH`).

use std::time::Duration;

use outbox_runtime::consumer::{Consumer, ConsumerConfig};
use outbox_runtime::{Relay, RelayConfig, StreamSpec};
use outbox_testkit::{connect_nats, drain, emitted, wait_handled, NatsServer, TestDb};
use outside_shop::events::OrderPlaced;
use outside_shop::{place, Invoice, SCHEMA};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn a_placed_order_is_emitted_relayed_and_invoiced_once() {
    let db = TestDb::new().await;
    sqlx::raw_sql(SCHEMA).execute(&db.pool).await.unwrap();
    let nats = NatsServer::spawn().await;
    let js = async_nats::jetstream::new(connect_nats(&nats.url()).await);
    StreamSpec::new("SHOP", ["shop.>"])
        .ensure(&js)
        .await
        .unwrap();

    let mut tx = db.pool.begin().await.unwrap();
    let order = place(&mut tx, 1_250).await.unwrap();
    let events = emitted::<OrderPlaced>(&mut tx).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].event.order_id, order);
    tx.commit().await.unwrap();

    let relay = Relay::new(db.pool.clone(), js.clone(), RelayConfig::default())
        .await
        .unwrap();
    assert_eq!(drain(&relay).await.published, 1);

    let consumer = Consumer::new(
        db.pool.clone(),
        js.clone(),
        ConsumerConfig::new("shop-invoice", "SHOP"),
        Invoice,
    );
    consumer.durable().await.unwrap();
    let stop = CancellationToken::new();
    let running = {
        let stop = stop.clone();
        tokio::spawn(async move { consumer.run(stop.cancelled_owned()).await })
    };
    wait_handled(
        &db.pool,
        "shop-invoice",
        events[0].id,
        Duration::from_secs(30),
    )
    .await;
    stop.cancel();
    running.await.unwrap().unwrap();

    let invoices: Vec<(uuid::Uuid, uuid::Uuid)> =
        sqlx::query_as("select order_id, event_id from invoices")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(invoices, vec![(order, events[0].id)]);
}
