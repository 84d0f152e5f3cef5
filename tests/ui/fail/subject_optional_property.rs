// `region` is optional: an event without it would have no subject.
#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(event_type = "billing.usage.recorded", subject = "region")]
pub struct UsageRecorded {
    pub meter: String,
    pub quantity: f64,
    pub billable: bool,
    pub recorded_at: chrono::DateTime<chrono::Utc>,
    pub labels: std::collections::HashMap<String, String>,
    #[serde(default)]
    pub region: Option<String>,
}

fn main() {}
