// v2 of billing.invoice.refunded made `refund` a decimal string; this code was written for v1,
// where it was an integer number of cents.
use outbox_ui::contract_v2::InvoiceRefunded;

fn refunded(invoice_id: uuid::Uuid, cents: u64) -> InvoiceRefunded {
    InvoiceRefunded {
        invoice_id,
        refund: cents,
    }
}

fn main() {
    let _ = refunded(uuid::Uuid::nil(), 1200);
}
