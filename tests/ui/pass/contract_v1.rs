// The code of the `contract_*` fail cases, unchanged, against the v1 contract it was written
// for: it compiles, so those cases fail because of the contract change alone.
use outbox_runtime::{EmitEvent, OutboxEvent};
use outbox_ui::contract_v1::{
    ChargeSucceeded, InvoiceIssued, InvoicePaid, InvoiceRefunded, SubscriptionRenewed,
    SubscriptionRenewedPlan,
};

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

fn paid(invoice_id: uuid::Uuid) -> InvoicePaid {
    InvoicePaid {
        invoice_id,
        paid_at: chrono::Utc::now(),
    }
}

fn refunded(invoice_id: uuid::Uuid, cents: u64) -> InvoiceRefunded {
    InvoiceRefunded {
        invoice_id,
        refund: cents,
    }
}

fn renewed(subscription_id: uuid::Uuid) -> SubscriptionRenewed {
    SubscriptionRenewed {
        subscription_id,
        plan: SubscriptionRenewedPlan::Legacy,
        period: std::num::NonZeroU64::MIN,
    }
}

fn emittable<E: EmitEvent>(event: &E) -> String {
    event.subject()
}

fn main() {
    let id = uuid::Uuid::from_u128(7);
    assert_eq!(emittable(&issue(id, uuid::Uuid::nil())), id.to_string());
    assert_eq!(emittable(&paid(id)), id.to_string());
    assert_eq!(emittable(&refunded(id, 1200)), id.to_string());
    assert_eq!(emittable(&renewed(id)), id.to_string());
    // A consumed type decodes; only emitting it is refused.
    let charge: ChargeSucceeded = serde_json::from_value(serde_json::json!({
        "charge_id": "ch_1", "invoice_id": id, "amount_cents": 1200
    }))
    .expect("a valid payload decodes");
    assert_eq!(charge.subject(), "ch_1");
    assert_eq!(ChargeSucceeded::SOURCE, "billing");
}
