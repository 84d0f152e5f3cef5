#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(event_type = "billing.invoice.paid")]
pub enum InvoiceEvent {
    Paid { invoice_id: uuid::Uuid },
}

fn main() {}
