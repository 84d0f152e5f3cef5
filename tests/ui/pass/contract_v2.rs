// The generated v2 types: constants, subjects, the inlined schema, and the payload of each
// passing the runtime's schema validation.
use outbox_runtime::{EmitEvent, OutboxEvent, Schemas, PLATFORM_SUBJECT};
use outbox_ui::contract_v2::{
    ChargeSucceeded, Currency, InvoiceIssued, InvoicePaid, Line, UsageRecorded,
};

fn valid<E: OutboxEvent>(event: &E) {
    let schemas = Schemas::new().with::<E>().expect("SCHEMA compiles");
    let data = serde_json::to_value(event).expect("serializes");
    if let Err(e) = schemas.validate(E::EVENT_TYPE, &data) {
        panic!("{} payload {data} is invalid: {e}", E::EVENT_TYPE);
    }
}

fn emittable<E: EmitEvent>() {}

fn main() {
    let id = uuid::Uuid::from_u128(42);
    let issued = InvoiceIssued {
        invoice_id: id,
        customer_id: uuid::Uuid::nil(),
        amount_cents: 1200,
        currency: Currency::Eur,
        lines: vec![Line {
            sku: "seat".parse().expect("a non-empty sku"),
            quantity: std::num::NonZeroU64::MIN,
            unit_price_cents: 1200,
        }],
        issued_at: chrono::Utc::now(),
        note: None,
    };
    assert_eq!(InvoiceIssued::EVENT_TYPE, "billing.invoice.issued");
    assert_eq!(InvoiceIssued::SOURCE, "billing");
    assert_eq!(InvoiceIssued::SUBJECT_PROPERTY, Some("invoice_id"));
    assert_eq!(issued.subject(), id.to_string());
    let schema: serde_json::Value = serde_json::from_str(InvoiceIssued::SCHEMA).expect("JSON");
    assert_eq!(schema["properties"]["currency"]["$ref"], "#/$defs/Currency");
    assert_eq!(schema["$defs"]["Currency"]["enum"][0], "eur");
    valid(&issued);
    emittable::<InvoiceIssued>();

    let paid = InvoicePaid {
        invoice_id: id,
        settled_at: chrono::Utc::now(),
    };
    valid(&paid);

    let usage = UsageRecorded {
        meter: "api_calls".into(),
        quantity: 2.5,
        billable: true,
        region: None,
        labels: [("plan".to_owned(), "pro".to_owned())].into(),
        recorded_at: chrono::Utc::now(),
    };
    assert_eq!(UsageRecorded::SUBJECT_PROPERTY, None);
    assert_eq!(usage.subject(), PLATFORM_SUBJECT);
    valid(&usage);

    let charge = ChargeSucceeded {
        charge_id: "ch_1".into(),
        invoice_id: id,
        amount_cents: 5,
    };
    assert_eq!(charge.subject(), "ch_1");
    valid(&charge);
}
