// billing.invoice.paid has `additionalProperties: false`.
#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(event_type = "billing.invoice.paid")]
pub struct InvoicePaid {
    pub invoice_id: uuid::Uuid,
    pub settled_at: chrono::DateTime<chrono::Utc>,
    pub paid_by: String,
}

fn main() {}
