// `note` is optional and not nullable: `None` must be skipped, not written as `null`.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Line {
    pub sku: String,
    pub quantity: u32,
    pub unit_price_cents: u64,
}

#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(event_type = "billing.invoice.issued")]
pub struct InvoiceIssued {
    pub invoice_id: uuid::Uuid,
    pub customer_id: uuid::Uuid,
    pub amount_cents: u64,
    pub currency: String,
    pub lines: Vec<Line>,
    pub issued_at: chrono::DateTime<chrono::Utc>,
    pub note: Option<String>,
}

fn main() {}
