#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(
    event_type = "billing.invoice.settled",
    schema = "schemas/events/billing.invoice.paid.schema.json"
)]
pub struct InvoiceSettled {
    pub invoice_id: uuid::Uuid,
    pub settled_at: chrono::DateTime<chrono::Utc>,
}

fn main() {}
