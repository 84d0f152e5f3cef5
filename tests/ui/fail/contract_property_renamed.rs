// v2 of billing.invoice.paid renamed `paid_at` to `settled_at`; this code was written for v1.
use outbox_ui::contract_v2::InvoicePaid;

fn paid(invoice_id: uuid::Uuid) -> InvoicePaid {
    InvoicePaid {
        invoice_id,
        paid_at: chrono::Utc::now(),
    }
}

fn main() {
    let _ = paid(uuid::Uuid::nil());
}
