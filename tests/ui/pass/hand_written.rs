// Hand-written structs against the schemas in `schemas/events/` of the compiling crate, with
// serde renames, skipped and flattened fields, and every `#[outbox(..)]` key.
use std::collections::HashMap;

use outbox_runtime::{EmitEvent, OutboxEvent, Schemas, PLATFORM_SUBJECT};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Line {
    pub sku: String,
    pub quantity: std::num::NonZeroU32,
    pub unit_price_cents: u64,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Currency {
    Eur,
    Usd,
}

/// Source defaults to the package name; the subject comes from `x-outbox-subject`.
#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(event_type = "billing.invoice.issued")]
pub struct Issued {
    #[serde(rename = "invoice_id")]
    pub id: uuid::Uuid,
    pub customer_id: uuid::Uuid,
    pub amount_cents: u32,
    pub currency: Currency,
    pub lines: Vec<Line>,
    pub issued_at: chrono::DateTime<chrono::Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(skip)]
    pub cached_total: u64,
}

/// An open schema: a flattened map carries extra properties; `region` is nullable.
#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(
    event_type = "billing.usage.recorded",
    source = "metering",
    subject = "meter",
    schema = "schemas/events/billing.usage.recorded.schema.json"
)]
#[serde(rename_all = "snake_case")]
pub struct Usage {
    pub meter: String,
    pub quantity: f32,
    pub billable: bool,
    pub recorded_at: chrono::DateTime<chrono::Utc>,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(flatten)]
    pub extra: HashMap<String, serde_json::Value>,
}

/// Read here, emitted elsewhere.
#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(event_type = "payments.charge.succeeded", consume_only)]
pub struct Charge {
    pub charge_id: String,
    pub invoice_id: uuid::Uuid,
    pub amount_cents: i64,
}

fn emittable<E: EmitEvent>() {}

fn valid<E: OutboxEvent>(event: &E) {
    let schemas = Schemas::new().with::<E>().expect("SCHEMA compiles");
    let data = serde_json::to_value(event).expect("serializes");
    if let Err(e) = schemas.validate(E::EVENT_TYPE, &data) {
        panic!("{} payload {data} is invalid: {e}", E::EVENT_TYPE);
    }
}

fn main() {
    let id = uuid::Uuid::from_u128(9);
    let issued = Issued {
        id,
        customer_id: uuid::Uuid::nil(),
        amount_cents: 300,
        currency: Currency::Usd,
        lines: vec![Line {
            sku: "seat".into(),
            quantity: std::num::NonZeroU32::MIN,
            unit_price_cents: 300,
        }],
        issued_at: chrono::Utc::now(),
        note: None,
        cached_total: 300,
    };
    assert_eq!(Issued::EVENT_TYPE, "billing.invoice.issued");
    assert_eq!(Issued::SOURCE, env!("CARGO_PKG_NAME"));
    assert_eq!(Issued::SUBJECT_PROPERTY, Some("invoice_id"));
    assert_eq!(issued.subject(), id.to_string());
    valid(&issued);
    emittable::<Issued>();

    let usage = Usage {
        meter: "api_calls".into(),
        quantity: 1.5,
        billable: false,
        recorded_at: chrono::Utc::now(),
        region: None,
        extra: [("labels".to_owned(), serde_json::json!({"plan": "pro"}))].into(),
    };
    assert_eq!(Usage::SOURCE, "metering");
    assert_eq!(usage.subject(), "api_calls");
    assert_ne!(usage.subject(), PLATFORM_SUBJECT);
    valid(&usage);

    let charge = Charge {
        charge_id: "ch_9".into(),
        invoice_id: id,
        amount_cents: 1,
    };
    assert_eq!(charge.subject(), "ch_9");
    valid(&charge);
}
