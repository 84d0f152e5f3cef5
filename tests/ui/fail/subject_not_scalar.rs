// The subject is the entity an event is about: a string, uuid or integer. `labels` is an
// object and `quantity` a (fractional) number.
#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(event_type = "billing.usage.recorded", subject = "labels")]
pub struct UsageRecorded {
    pub meter: String,
    pub quantity: f64,
    pub billable: bool,
    pub recorded_at: chrono::DateTime<chrono::Utc>,
    pub labels: std::collections::HashMap<String, String>,
}

#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(event_type = "billing.usage.recorded", subject = "quantity")]
pub struct UsageQuantity {
    pub meter: String,
    pub quantity: f64,
    pub billable: bool,
    pub recorded_at: chrono::DateTime<chrono::Utc>,
    pub labels: std::collections::HashMap<String, String>,
}

fn main() {}
