#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(event_type = "billing.usage.recorded", subject = "meter_id")]
pub struct UsageRecorded {
    pub meter: String,
    pub quantity: f64,
    pub billable: bool,
    pub recorded_at: chrono::DateTime<chrono::Utc>,
    pub labels: std::collections::HashMap<String, String>,
}

fn main() {}
