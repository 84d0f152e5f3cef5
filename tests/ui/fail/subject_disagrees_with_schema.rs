// billing.invoice.paid says `"x-outbox-subject": "invoice_id"`.
#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(event_type = "billing.invoice.paid", subject = "settled_at")]
pub struct InvoicePaid {
    pub invoice_id: uuid::Uuid,
    pub settled_at: chrono::DateTime<chrono::Utc>,
}

fn main() {}
