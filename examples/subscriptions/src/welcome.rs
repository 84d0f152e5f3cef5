//! The welcome consumer: when a subscription is created, record that the customer should be
//! welcomed. The intent is a row written in the consumer's transaction (the contract's rule 4);
//! a redelivery finds the event id already recorded and changes nothing.

use outbox_runtime::consumer::{Delivery, Handler, HandlerError};
use sqlx::PgConnection;

use crate::events::SubscriptionCreated;

/// Records a welcome intent per created subscription.
#[derive(Debug, Clone, Copy)]
pub struct RecordWelcome;

impl Handler<SubscriptionCreated> for RecordWelcome {
    async fn handle(
        &self,
        delivery: &Delivery<SubscriptionCreated>,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        let event = delivery.event();
        sqlx::query(
            "insert into welcome_intents (subscription_id, customer_id, event_id) \
             values ($1, $2, $3) on conflict (subscription_id) do nothing",
        )
        .bind(event.subscription_id)
        .bind(event.customer_id)
        .bind(delivery.id())
        .execute(tx)
        .await?;
        tracing::info!(subscription_id = %event.subscription_id, event_id = %delivery.id(), "welcome intent recorded");
        Ok(())
    }
}
