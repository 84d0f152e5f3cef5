//! A shop that places orders: the order row and its `shop.order.placed` event commit together,
//! and a consumer of the event records an invoice once.

use outbox_runtime::consumer::{Delivery, Handler, HandlerError};
use outbox_runtime::EmitExt;
use sqlx::PgConnection;
use uuid::Uuid;

/// The event contract, generated from `schemas/events` at build time.
pub mod events {
    include!(concat!(env!("OUT_DIR"), "/outbox_events.rs"));
}

use events::OrderPlaced;

/// The shop's tables.
pub const SCHEMA: &str = "
create table if not exists orders (id uuid primary key, total_cents bigint not null);
create table if not exists invoices (order_id uuid primary key, event_id uuid not null)";

/// Places an order inside `tx`: its row and its event.
pub async fn place(tx: &mut PgConnection, total_cents: u32) -> outbox_runtime::Result<Uuid> {
    let id = Uuid::now_v7();
    sqlx::query("insert into orders (id, total_cents) values ($1, $2)")
        .bind(id)
        .bind(i64::from(total_cents))
        .execute(&mut *tx)
        .await?; // sqlx 0.9's error is the outbox's: one sqlx in the tree
    tx.emit(OrderPlaced {
        order_id: id,
        total_cents: total_cents.into(),
    })
    .await?;
    Ok(id)
}

/// Records an invoice per placed order.
pub struct Invoice;

impl Handler<OrderPlaced> for Invoice {
    async fn handle(
        &self,
        delivery: &Delivery<OrderPlaced>,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        sqlx::query("insert into invoices (order_id, event_id) values ($1, $2)")
            .bind(delivery.event().order_id)
            .bind(delivery.id())
            .execute(tx)
            .await?;
        Ok(())
    }
}
