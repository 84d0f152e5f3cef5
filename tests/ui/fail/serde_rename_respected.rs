// The derive checks the JSON names serde writes: `rename_all` turns `invoice_id` into
// `invoiceId`, which billing.invoice.paid does not have.
#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(event_type = "billing.invoice.paid")]
#[serde(rename_all = "camelCase")]
pub struct InvoicePaid {
    pub invoice_id: uuid::Uuid,
    #[serde(rename = "settled_at")]
    pub settled: chrono::DateTime<chrono::Utc>,
}

fn main() {}
