//! The test kit's own promises, against a real Postgres and nats-server: `emitted` reads only
//! the transaction's own events, `drain` publishes everything committed and fails naming what it
//! could not publish, `wait_handled` returns once the handler committed and fails naming the
//! handler's last error.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use outbox_runtime::consumer::{Delivery, Handler, HandlerError};
use outbox_runtime::{EmitExt, Relay, RelayConfig};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{drain, emit_committed, emitted, open_schemas, raw_event, wait_handled};
use sqlx::{Acquire, PgConnection};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::consumer::{setup, AccountOpened};

fn opened(n: i64) -> AccountOpened {
    AccountOpened {
        account_id: Uuid::now_v7(),
        owner: format!("owner-{n}"),
        n,
    }
}

/// The message of the panic `future` ends in.
async fn panic_message(future: impl std::future::Future<Output = ()>) -> String {
    let panic = AssertUnwindSafe(future)
        .catch_unwind()
        .await
        .expect_err("it fails the test");
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

#[tokio::test]
async fn emitted_reads_the_transactions_own_events_and_its_savepoints() {
    let ctx = Ctx::new().await;
    let pool = ctx.pool();
    // committed before, and unpublished
    let mut before = pool.begin().await.unwrap();
    before.emit(opened(1)).await.unwrap();
    before.commit().await.unwrap();

    let mut tx = pool.begin().await.unwrap();
    tx.emit(opened(3)).await.unwrap();
    // another transaction, begun after this one wrote: uncommitted, then committed
    let mut other = pool.begin().await.unwrap();
    other.emit(opened(2)).await.unwrap();
    assert_eq!(ns(&emitted::<AccountOpened>(&mut tx).await), [3]);
    other.commit().await.unwrap();
    // a released savepoint counts, a rolled-back one does not
    {
        let mut kept = tx.begin().await.unwrap();
        kept.emit(opened(4)).await.unwrap();
        kept.commit().await.unwrap();
        let mut dropped = tx.begin().await.unwrap();
        dropped.emit(opened(5)).await.unwrap();
        assert_eq!(ns(&emitted::<AccountOpened>(&mut dropped).await), [3, 4, 5]);
        dropped.rollback().await.unwrap();
    }
    tx.emit(opened(6)).await.unwrap();
    // an older row this transaction only updates is not one it emitted
    sqlx::query(
        "update outbox_events set attempts = attempts + 1 \
          where event_type = 'accounts.account.opened' and (data->>'n')::int = 1",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    // another type is not read as this one
    let schemas = open_schemas(&[ctx.event_type("thing.made")]);
    tx.emit_raw(
        &schemas,
        raw_event(ctx.event_type("thing.made"), "t", "s").into(),
    )
    .await
    .unwrap();

    let events = emitted::<AccountOpened>(&mut tx).await;
    assert_eq!(ns(&events), [3, 4, 6]);
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "select id from outbox_events where event_type = 'accounts.account.opened' \
          and (data->>'n')::int in (3, 4, 6) order by created_at, id",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    assert_eq!(events.iter().map(|e| e.id).collect::<Vec<_>>(), ids);
    assert_eq!(events[0].subject, events[0].event.account_id.to_string());
    tx.commit().await.unwrap();

    // a later transaction has emitted nothing yet; asked before it has a transaction id, and
    // again after another transaction took the next id and it emitted
    let mut later = pool.begin().await.unwrap();
    assert!(emitted::<AccountOpened>(&mut later).await.is_empty());
    let mut between = pool.begin().await.unwrap();
    between.emit(opened(7)).await.unwrap();
    between.commit().await.unwrap();
    later.emit(opened(8)).await.unwrap();
    assert_eq!(ns(&emitted::<AccountOpened>(&mut later).await), [8]);
    later.rollback().await.unwrap();
    // a plain connection outside a transaction: each statement its own transaction
    let mut conn = pool.acquire().await.unwrap();
    let conn: &mut PgConnection = conn.acquire().await.unwrap();
    assert!(emitted::<AccountOpened>(conn).await.is_empty());
}

fn ns(events: &[outbox_testkit::Emitted<AccountOpened>]) -> Vec<i64> {
    events.iter().map(|e| e.event.n).collect()
}

#[tokio::test]
async fn drain_publishes_everything_committed_and_names_an_event_it_could_not_publish() {
    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let published = ctx.event_type("order.placed");
    let schemas = open_schemas(std::slice::from_ref(&published));
    for n in 0..5 {
        emit_committed(
            ctx.pool(),
            &schemas,
            raw_event(&published, "shop", format!("order-{}", n % 2)).numbered(n),
        )
        .await;
    }
    let relay = Relay::new(ctx.pool().clone(), ctx.js.clone(), RelayConfig::default())
        .await
        .unwrap();
    let drained = drain(&relay).await;
    assert_eq!(drained.published, 5);
    assert_eq!(drained.duplicates, 0);
    assert_eq!(ctx.stream_len().await, 5);
    assert_eq!(ctx.db.unpublished().await, 0);
    let again = drain(&relay).await;
    assert_eq!((again.batches, again.published), (1, 0));

    // a row another transaction locks for a moment: drain waits for it instead of returning
    let locked = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&published, "shop", "order-7").numbered(7),
    )
    .await;
    let mut lock = ctx.pool().begin().await.unwrap();
    sqlx::query("select 1 from outbox_events where id = $1 for update")
        .bind(locked)
        .execute(&mut *lock)
        .await
        .unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        lock.rollback().await.unwrap();
    });
    assert_eq!(drain(&relay).await.published, 1);
    release.await.unwrap();
    assert_eq!(ctx.db.unpublished().await, 0);

    // a type no stream captures is held, and drain says which event and why
    let stray = format!("{}x.order.placed", ctx.prefix);
    let schemas = open_schemas(std::slice::from_ref(&stray));
    let id = emit_committed(ctx.pool(), &schemas, raw_event(&stray, "shop", "order-9")).await;
    let message = panic_message(async {
        drain(&relay).await;
    })
    .await;
    assert!(message.contains("1 event(s) held"), "{message}");
    assert!(message.contains(&id.to_string()), "{message}");
    assert!(message.contains(&stray), "{message}");
    assert!(message.contains("no stream"), "{message}");
    // still held, it is not claimable: the next drain names it all the same
    let message = panic_message(async {
        drain(&relay).await;
    })
    .await;
    assert!(message.contains("an event is held"), "{message}");
    assert!(message.contains(&id.to_string()), "{message}");
    ctx.delete_stream().await;
}

/// Fails on the event numbered 1, with a reason the test looks for.
struct FailOnOne;

impl Handler<AccountOpened> for FailOnOne {
    async fn handle(
        &self,
        delivery: &Delivery<AccountOpened>,
        _tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        if delivery.event().n == 1 {
            return Err("account ledger is closed".into());
        }
        Ok(())
    }
}

#[tokio::test]
async fn wait_handled_returns_once_handled_and_names_the_handlers_last_error() {
    let setup = setup(Duration::from_secs(120)).await;
    let good = setup.emit(0).await;
    let bad = setup.emit(1).await;
    drain(&setup.relay).await;
    let consumer = setup.consumer_capped("testkit-wait", FailOnOne, 1_000);
    consumer.durable().await.unwrap();
    let stop = CancellationToken::new();
    let running = {
        let stop = stop.clone();
        tokio::spawn(async move { consumer.run(stop.cancelled_owned()).await })
    };

    wait_handled(
        &setup.db.pool,
        "testkit-wait",
        good,
        Duration::from_secs(30),
    )
    .await;
    let message = panic_message(wait_handled(
        &setup.db.pool,
        "testkit-wait",
        bad,
        Duration::from_secs(3),
    ))
    .await;
    assert!(message.contains(&bad.to_string()), "{message}");
    assert!(message.contains("account ledger is closed"), "{message}");
    // an event the consumer never saw says so
    let never = Uuid::now_v7();
    let message = panic_message(wait_handled(
        &setup.db.pool,
        "testkit-wait",
        never,
        Duration::from_millis(100),
    ))
    .await;
    assert!(message.contains("recorded no failure"), "{message}");
    stop.cancel();
    running.await.unwrap().unwrap();
}
