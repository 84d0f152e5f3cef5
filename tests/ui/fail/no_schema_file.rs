// There is no schemas/events/billing.invoice.voided.schema.json.
#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(event_type = "billing.invoice.voided", subject = "invoice_id")]
pub struct InvoiceVoided {
    pub invoice_id: uuid::Uuid,
}

fn main() {}
