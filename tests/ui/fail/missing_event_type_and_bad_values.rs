#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(subject = invoice_id, consume_only = true)]
pub struct InvoicePaid {
    pub invoice_id: uuid::Uuid,
}

fn main() {}
