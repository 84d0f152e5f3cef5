#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(event_type = "billing.*.issued")]
pub struct AnyIssued {
    pub invoice_id: uuid::Uuid,
}

#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(event_type = "billing.invoice.>")]
pub struct AnyInvoiceEvent {
    pub invoice_id: uuid::Uuid,
}

fn main() {}
