//! Events for the untyped path: [`RawEventBuilder`], permissive schemas, and an emit that
//! commits on its own.

use chrono::{DateTime, Utc};
use outbox_runtime::{EmitExt, RawEvent, Schemas};
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

/// Builds a [`RawEvent`]: what every event says (type, source, subject) up front, the rest
/// with a default: payload `{}`, time `None` (the emit's own clock).
///
/// ```
/// use outbox_testkit::raw_event;
/// use serde_json::json;
///
/// let event = raw_event("billing.invoice.paid", "billing", "inv-1").numbered(7).build();
/// assert_eq!(event.data, json!({ "n": 7 }));
/// assert_eq!(event.time, None);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[must_use = "a builder does nothing until it is built"]
pub struct RawEventBuilder {
    event: RawEvent,
}

/// An event of `event_type` from `source` about `subject`: [`RawEventBuilder::new`].
pub fn raw_event(
    event_type: impl Into<String>,
    source: impl Into<String>,
    subject: impl Into<String>,
) -> RawEventBuilder {
    RawEventBuilder::new(event_type, source, subject)
}

impl RawEventBuilder {
    /// An event of `event_type` (the NATS subject too) from the service `source` about the
    /// entity `subject` (`platform` for none), with payload `{}` and no time.
    pub fn new(
        event_type: impl Into<String>,
        source: impl Into<String>,
        subject: impl Into<String>,
    ) -> RawEventBuilder {
        RawEventBuilder {
            event: RawEvent {
                event_type: event_type.into(),
                source: source.into(),
                subject: subject.into(),
                time: None,
                data: json!({}),
            },
        }
    }

    /// The payload.
    pub fn data(mut self, data: Value) -> RawEventBuilder {
        self.event.data = data;
        self
    }

    /// The payload `{"n": n}`: an event that says which of a sequence it is, so a test can
    /// check the order it arrives in.
    pub fn numbered(self, n: impl Into<serde_json::Number>) -> RawEventBuilder {
        self.data(json!({ "n": n.into() }))
    }

    /// When the state change happened.
    pub fn time(mut self, time: DateTime<Utc>) -> RawEventBuilder {
        self.event.time = Some(time);
        self
    }

    /// The event.
    pub fn build(self) -> RawEvent {
        self.event
    }
}

impl From<RawEventBuilder> for RawEvent {
    fn from(builder: RawEventBuilder) -> RawEvent {
        builder.build()
    }
}

/// `Schemas` with one permissive object schema per event type.
pub fn open_schemas(event_types: &[String]) -> Schemas {
    const SCHEMA: &str = r#"{"type":"object"}"#;
    Schemas::from_pairs(event_types.iter().map(|t| (t.as_str(), SCHEMA))).expect("schemas")
}

/// Emits `event` through the untyped path in a transaction of its own, commits, and returns
/// the event id.
pub async fn emit_committed(pool: &PgPool, schemas: &Schemas, event: impl Into<RawEvent>) -> Uuid {
    let mut tx = pool.begin().await.expect("begin");
    let id = tx.emit_raw(schemas, event.into()).await.expect("emit");
    tx.commit().await.expect("commit");
    id
}
