#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(event_type = "billing.invoice.paid", source = "billing")]
#[outbox(source = "invoices", consume_only, consume_only)]
pub struct InvoicePaid {
    pub invoice_id: uuid::Uuid,
    pub settled_at: chrono::DateTime<chrono::Utc>,
}

fn main() {}
