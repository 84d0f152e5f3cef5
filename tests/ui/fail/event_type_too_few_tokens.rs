#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(event_type = "billing.invoice_issued")]
pub struct InvoiceIssued {
    pub invoice_id: uuid::Uuid,
}

fn main() {}
