// billing.usage.recorded: `quantity` is a number, `billable` a boolean, `recorded_at` a
// date-time string, and `labels` maps to strings.
#[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
#[outbox(event_type = "billing.usage.recorded")]
pub struct UsageRecorded {
    pub meter: String,
    pub quantity: u64,
    pub billable: String,
    pub recorded_at: uuid::Uuid,
    #[serde(default)]
    pub labels: std::collections::HashMap<String, i64>,
    #[serde(default)]
    pub region: Option<String>,
}

fn main() {}
