//! Waiting until a consumer has handled an event, instead of sleeping for a guessed time.

use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

/// How often [`wait_handled`] looks.
const POLL: Duration = Duration::from_millis(10);

/// Waits until the consumer named `consumer` ([`ConsumerConfig::name`]) has handled the
/// event `id`: its handler returned `Ok` and the transaction that records the event in
/// `outbox_consumed` committed, so whatever the handler wrote is visible through `pool`.
///
/// It fails the test after `limit`, saying whether the handler failed on the event (with its
/// attempts and last error, from `outbox_consumer_attempts`) or never saw it.
///
/// [`ConsumerConfig::name`]: outbox_runtime::consumer::ConsumerConfig
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool, event_id: uuid::Uuid) {
/// use std::time::Duration;
///
/// outbox_testkit::wait_handled(&pool, "billing-welcome", event_id, Duration::from_secs(10)).await;
/// # }
/// ```
pub async fn wait_handled(pool: &PgPool, consumer: &str, id: Uuid, limit: Duration) {
    let end = tokio::time::Instant::now() + limit;
    loop {
        let handled: bool = sqlx::query_scalar(
            "select exists (select 1 from outbox_consumed where consumer = $1 and event_id = $2)",
        )
        .bind(consumer)
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("wait_handled: reading outbox_consumed: {e}"));
        if handled {
            return;
        }
        if tokio::time::Instant::now() >= end {
            let attempts: Option<(i32, String)> = sqlx::query_as(
                "select attempts, last_error from outbox_consumer_attempts \
                  where consumer = $1 and event_id = $2",
            )
            .bind(consumer)
            .bind(id)
            .fetch_optional(pool)
            .await
            .unwrap_or_else(|e| panic!("wait_handled: reading outbox_consumer_attempts: {e}"));
            match attempts {
                Some((attempts, last_error)) => panic!(
                    "wait_handled: after {limit:?}, consumer `{consumer}` has not handled event {id}: its handler failed {attempts} time(s), last with: {last_error}"
                ),
                None => panic!(
                    "wait_handled: after {limit:?}, consumer `{consumer}` has not handled event {id} and recorded no failure for it: is the consumer running, was the event published (see `drain`), and does the consumer's filter take its type? (a handler that gave up or a message that did not decode is in the consumer's error log)"
                ),
            }
        }
        tokio::time::sleep(POLL).await;
    }
}
