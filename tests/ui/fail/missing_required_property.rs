// The schema requires `currency`; the struct has no field for it. The stub impl keeps the
// `emit` below from adding errors of its own.
use outbox_runtime::EmitExt;

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
    pub lines: Vec<Line>,
    pub issued_at: chrono::DateTime<chrono::Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

async fn issue(conn: &mut sqlx::PgConnection, event: InvoiceIssued) -> outbox_runtime::Result<()> {
    conn.emit(event).await?;
    Ok(())
}

fn main() {
    let _ = issue;
}
