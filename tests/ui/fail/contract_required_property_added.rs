// v2 of billing.invoice.issued made `currency` required; this code was written for v1.
use outbox_ui::contract_v2::InvoiceIssued;

fn issue(invoice_id: uuid::Uuid, customer_id: uuid::Uuid) -> InvoiceIssued {
    InvoiceIssued {
        invoice_id,
        customer_id,
        amount_cents: 1200,
        lines: Vec::new(),
        issued_at: chrono::Utc::now(),
        note: None,
    }
}

fn main() {
    let _ = issue(uuid::Uuid::nil(), uuid::Uuid::nil());
}
