//! An AsyncAPI 3.0 document of a schemas folder: what a consumer in any language needs to read
//! the events a service publishes through the outbox (`outbox asyncapi` writes it).
//!
//! - one channel per event type, whose address is the NATS subject (the event type), on one
//!   server: the NATS server whose JetStream stream stores the events;
//! - one message per event type (named by the schema's `title`): the CloudEvents 1.0 envelope
//!   in structured JSON mode, its NATS headers (`Nats-Msg-Id`, `Content-Type`, `traceparent`,
//!   `tracestate`), and as its `data` the event's schema, loaded and resolved as the build
//!   script does it ([`load_dir`](crate::load_dir): shared definitions inlined into the schema's
//!   `$defs`);
//! - the subject (the envelope's `subject`, from the property named by `x-outbox-subject`) and
//!   the rules consumers must follow (dedupe on the id, order per subject only) as descriptions;
//! - one `send` operation per channel: the document describes the publishing service.
//!
//! Each event schema is a component schema named by its `title`; its local `$ref`s
//! (`#/$defs/Money`) are rewritten to point inside it (`#/components/schemas/<title>/$defs/Money`),
//! so they mean in the document what they meant in the file.
//!
//! The output is deterministic: object keys sorted at every level, two-space indentation, a
//! final newline. The same schemas and settings give the same bytes.

use std::path::Path;

use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::pattern::{check_pattern, pattern_matches};
use crate::schema::{load_dir, EventSchema};

/// The AsyncAPI version written.
pub const ASYNCAPI_VERSION: &str = "3.0.0";

/// The key of the one server in `servers`.
const SERVER: &str = "nats";

/// The settings of an AsyncAPI document: who publishes (the envelopes' `source`), the stream
/// that stores the events and the NATS server it is on.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// std::fs::write(
///     dir.path().join("billing.invoice.paid.schema.json"),
///     r#"{ "title": "InvoicePaid", "type": "object", "x-outbox-subject": "invoice_id",
///          "required": ["invoice_id"], "properties": { "invoice_id": { "type": "string" } } }"#,
/// )?;
/// let json = outbox_codegen::AsyncApi::new("billing", "BILLING")
///     .server("nats.internal:4222")
///     .generate(dir.path())?;
/// let doc: serde_json::Value = serde_json::from_str(&json)?;
/// assert_eq!(doc["asyncapi"], "3.0.0");
/// assert_eq!(doc["channels"]["billing.invoice.paid"]["address"], "billing.invoice.paid");
/// assert_eq!(doc["servers"]["nats"]["host"], "nats.internal:4222");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct AsyncApi {
    source: String,
    stream: String,
    server: String,
    title: Option<String>,
    version: String,
    consumes: Vec<String>,
}

impl AsyncApi {
    /// A document of the events `source` (the envelopes' `source`, as the build script's
    /// [`Config::source`](crate::Config::source)) publishes to the JetStream stream `stream`.
    /// The server defaults to `localhost:4222`, the title to `<source> events`, the version
    /// to `1.0.0`.
    pub fn new(source: impl Into<String>, stream: impl Into<String>) -> AsyncApi {
        AsyncApi {
            source: source.into(),
            stream: stream.into(),
            server: "localhost:4222".into(),
            title: None,
            version: "1.0.0".into(),
            consumes: Vec::new(),
        }
    }

    /// The NATS server, as `host[:port]` (AsyncAPI's `host`: no scheme).
    pub fn server(&mut self, host: impl Into<String>) -> &mut AsyncApi {
        self.server = host.into();
        self
    }

    /// The document's title (`info.title`).
    pub fn title(&mut self, title: impl Into<String>) -> &mut AsyncApi {
        self.title = Some(title.into());
        self
    }

    /// The version of the contract the document describes (`info.version`).
    pub fn version(&mut self, version: impl Into<String>) -> &mut AsyncApi {
        self.version = version.into();
        self
    }

    /// Event types the service only consumes (NATS-style patterns, as the build script's
    /// [`Config::consumes`](crate::Config::consumes)): left out, since the service does not
    /// publish them.
    pub fn consumes<I, S>(&mut self, patterns: I) -> &mut AsyncApi
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.consumes.extend(patterns.into_iter().map(Into::into));
        self
    }

    /// The document of the schemas folder `dir`, as JSON text (deterministic: see the
    /// [module docs](self)). Every problem of the folder or the settings is reported at once.
    pub fn generate(&self, dir: &Path) -> Result<String> {
        let mut errors = self.setting_errors();
        let events = match load_dir(dir) {
            Ok(events) => events,
            Err(e) => {
                errors.push(e);
                Vec::new()
            }
        };
        if let Some(e) = Error::from_list(errors) {
            return Err(e);
        }
        let published: Vec<&EventSchema> = events
            .iter()
            .filter(|e| {
                !self
                    .consumes
                    .iter()
                    .any(|p| pattern_matches(p, &e.event_type))
            })
            .collect();
        if published.is_empty() {
            return Err(Error::Config(format!(
                "{}: every event type matches a --consumes pattern; the document would describe no event",
                dir.display()
            )));
        }
        Ok(to_text(&self.document(&published)))
    }

    fn setting_errors(&self) -> Vec<Error> {
        let mut errors = Vec::new();
        let config = |m: String| Error::Config(m);
        if self.source.trim().is_empty() {
            errors.push(config(
                "the source (the envelopes' `source`) is empty".into(),
            ));
        }
        if self.stream.is_empty()
            || self
                .stream
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
        {
            errors.push(config(format!(
                "`{}` is not a JetStream stream name (no spaces, `.`, `*`, `>`, `/` or `\\`)",
                self.stream
            )));
        }
        if self.server.is_empty() || self.server.contains("://") || self.server.contains('/') {
            errors.push(config(format!(
                "server `{}`: give the NATS server as host[:port], like `nats.internal:4222` (no scheme)",
                self.server
            )));
        }
        if self.version.trim().is_empty() {
            errors.push(config("the document's version is empty".into()));
        }
        for pattern in &self.consumes {
            if let Err(why) = check_pattern(pattern) {
                errors.push(config(format!(
                    "invalid consumes pattern `{pattern}`: {why}"
                )));
            }
        }
        errors
    }

    /// The document of `events`.
    fn document(&self, events: &[&EventSchema]) -> Value {
        let mut channels = Map::new();
        let mut operations = Map::new();
        let mut messages = Map::new();
        let mut schemas = Map::new();
        for event in events {
            let (event_type, title) = (&event.event_type, &event.title);
            let channel_ref = format!("#/channels/{}", escape(event_type));
            channels.insert(
                event_type.clone(),
                json!({
                    "address": event_type,
                    "title": title,
                    "description": format!(
                        "Events of type `{event_type}`, published on the NATS subject of that name \
                         and stored in JetStream stream `{}`.",
                        self.stream
                    ),
                    "servers": [{ "$ref": format!("#/servers/{SERVER}") }],
                    "messages": { title.as_str(): { "$ref": format!("#/components/messages/{title}") } },
                }),
            );
            operations.insert(
                format!("send{title}"),
                json!({
                    "action": "send",
                    "title": format!("Publish {event_type}"),
                    "description": format!(
                        "The outbox relay publishes every committed `{event_type}` event of `{}` \
                         at least once.",
                        self.source
                    ),
                    "channel": { "$ref": channel_ref },
                    "messages": [{ "$ref": format!("{channel_ref}/messages/{title}") }],
                }),
            );
            messages.insert(title.clone(), self.message(event));
            let mut schema = event.resolved.clone();
            if let Some(root) = schema.as_object_mut() {
                // the dialect is said once, in info.description: `$schema` belongs at a
                // document's root, and a component is not one
                root.remove("$schema");
            }
            rewrite_refs(&mut schema, &format!("#/components/schemas/{title}"));
            schemas.insert(title.clone(), schema);
        }
        schemas.insert("OutboxHeaders".into(), headers());
        let title = self
            .title
            .clone()
            .unwrap_or_else(|| format!("{} events", self.source));
        json!({
            "asyncapi": ASYNCAPI_VERSION,
            "info": {
                "title": title,
                "version": self.version,
                "description": self.overview(),
            },
            "defaultContentType": CONTENT_TYPE,
            "servers": {
                SERVER: {
                    "host": self.server,
                    "protocol": "nats",
                    "description": format!(
                        "The NATS server with JetStream. The events are stored in stream `{}`: \
                         read them with a durable JetStream consumer on it, filtered by the \
                         channels' subjects.",
                        self.stream
                    ),
                },
            },
            "channels": channels,
            "operations": operations,
            "components": {
                "messages": messages,
                "schemas": schemas,
            },
        })
    }

    /// The message of `event`: the envelope around its schema, and the headers.
    fn message(&self, event: &EventSchema) -> Value {
        let (event_type, title) = (&event.event_type, &event.title);
        let subject = match &event.subject {
            Some(property) => json!({
                "type": "string",
                "description": format!(
                    "The entity the event is about: the payload's `{property}` property \
                     (`x-outbox-subject`), as text. The unit of order: events about one subject \
                     are published in the order they were emitted."
                ),
            }),
            None => json!({
                "const": "platform",
                "description": "Always `platform`: this event type names no entity \
                                (no `x-outbox-subject`), so all its events share one subject.",
            }),
        };
        let subject_rule = match &event.subject {
            Some(property) => format!(
                "Subject: the envelope's `subject` is the payload's `{property}` property, as text."
            ),
            None => "Subject: always `platform` (the schema names no `x-outbox-subject` property)."
                .to_owned(),
        };
        let summary = event
            .resolved
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| format!("A `{event_type}` event."));
        json!({
            "name": event_type,
            "title": title,
            "summary": summary,
            "description": format!("{subject_rule}\n\n{CONSUMER_RULES}"),
            "contentType": CONTENT_TYPE,
            "headers": { "$ref": "#/components/schemas/OutboxHeaders" },
            "payload": {
                "type": "object",
                "description": "A CloudEvents 1.0 event in structured JSON mode: the envelope, \
                                with the event in `data`.",
                "required": [
                    "specversion", "id", "type", "source", "subject", "time",
                    "datacontenttype", "data"
                ],
                "properties": {
                    "specversion": { "const": "1.0" },
                    "id": {
                        "type": "string",
                        "format": "uuid",
                        "description": "The event's id (a UUIDv7), the same on every delivery \
                                        of the event: the key to dedupe on. Equal to the \
                                        `Nats-Msg-Id` header.",
                    },
                    "type": {
                        "const": event_type,
                        "description": "The event type, which is also the NATS subject.",
                    },
                    "source": {
                        "const": self.source,
                        "description": "The service that emitted the event.",
                    },
                    "subject": subject,
                    "time": {
                        "type": "string",
                        "format": "date-time",
                        "description": "When the state change happened (RFC 3339).",
                    },
                    "datacontenttype": { "const": "application/json" },
                    "traceparent": {
                        "type": "string",
                        "pattern": TRACEPARENT_PATTERN,
                        "description": "CloudEvents distributed-tracing extension: the W3C \
                                        trace context the event was emitted in. Absent when \
                                        it was emitted outside a trace.",
                    },
                    "tracestate": {
                        "type": "string",
                        "description": "The vendors' `tracestate` that came with \
                                        `traceparent`, if any.",
                    },
                    "data": { "$ref": format!("#/components/schemas/{title}") },
                },
            },
        })
    }

    fn overview(&self) -> String {
        format!(
            "The events `{source}` publishes through its transactional outbox: each is written \
             in the same Postgres transaction as the change it reports, and a relay publishes it \
             to NATS JetStream (stream `{stream}`), on the subject named by its type, once \
             JetStream has stored it. Every message is a CloudEvents 1.0 envelope in structured \
             JSON mode (`{CONTENT_TYPE}`) whose `data` is valid against the event type's JSON \
             Schema (the component schema named by the message's title; the schemas are written \
             in JSON Schema draft 2020-12 or draft-07, as their files say).\n\n{CONSUMER_RULES}",
            source = self.source,
            stream = self.stream,
        )
    }
}

/// The NATS `Content-Type` of every message (the runtime's `CONTENT_TYPE`).
const CONTENT_TYPE: &str = "application/cloudevents+json";

/// A W3C `traceparent`, version 00.
const TRACEPARENT_PATTERN: &str = "^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$";

/// What every consumer must do, in every message's description and the document's.
const CONSUMER_RULES: &str = "Consumers must: (1) dedupe on the envelope's `id` (equal to the \
`Nats-Msg-Id` header): delivery is at least once, and a relay that crashed between the broker's \
ack and its own bookkeeping publishes the event again, with the same id, as does a redelivery. \
Record the id under a unique constraint in the same transaction as the handler's effect, and \
acknowledge a duplicate without acting on it twice. (2) Rely on order per subject only: events \
about one subject (the envelope's `subject`) are published in the order they were emitted, \
whatever their type; events about different subjects are unordered. A redelivery can arrive \
late and out of sequence, so compare the stream sequence or the envelope's `time` per subject \
before acting on anything order-dependent. (3) Ignore envelope attributes and headers they do \
not know (CloudEvents extensions).";

/// The headers of every message.
fn headers() -> Value {
    json!({
        "type": "object",
        "description": "The NATS headers of every message the relay publishes.",
        "required": ["Nats-Msg-Id", "Content-Type", "traceparent"],
        "properties": {
            "Nats-Msg-Id": {
                "type": "string",
                "format": "uuid",
                "description": "The event's id (the envelope's `id`), hyphenated. JetStream \
                                stores a message once per id within the stream's duplicate \
                                window; consumers dedupe on it beyond that window.",
            },
            "Content-Type": { "const": CONTENT_TYPE },
            "traceparent": {
                "type": "string",
                "pattern": TRACEPARENT_PATTERN,
                "description": "W3C trace context to continue in the consumer's span: the \
                                relay's publish span, or the context the event was emitted in, \
                                or a new root when it has none.",
            },
            "tracestate": {
                "type": "string",
                "description": "The vendors' trace state that goes with `traceparent`, if any.",
            },
        },
    })
}

/// `value`'s local `$ref`s (`#...`) rewritten to the same place under `base`, in schema
/// positions only: the values of `const`, `enum`, `default` and `examples` are data, left as
/// they are.
fn rewrite_refs(value: &mut Value, base: &str) {
    match value {
        Value::Object(map) => {
            for (key, item) in map.iter_mut() {
                match key.as_str() {
                    "const" | "enum" | "default" | "examples" | "example" => {}
                    "$ref" => {
                        if let Some(pointer) = item.as_str().and_then(|r| r.strip_prefix('#')) {
                            *item = Value::String(format!("{base}{pointer}"));
                        }
                    }
                    _ => rewrite_refs(item, base),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| rewrite_refs(item, base)),
        _ => {}
    }
}

/// `token` as a JSON pointer token (RFC 6901).
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// `value` as text with every object's keys sorted, whatever order serde_json's maps keep
/// (insertion order with its `preserve_order` feature), and a final newline.
fn to_text(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(&sorted(value)).expect("a JSON value serializes");
    text.push('\n');
    text
}

fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&map[k])))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    const PAID: &str = r##"{
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "InvoicePaid",
        "description": "An invoice was paid.",
        "type": "object",
        "x-outbox-subject": "invoice_id",
        "required": ["invoice_id", "amount"],
        "properties": {
            "invoice_id": { "type": "string", "format": "uuid" },
            "amount": { "$ref": "defs/common.json#/$defs/Money" },
            "refund": { "$ref": "#/$defs/Refund" },
            "note": { "const": { "$ref": "#/not/a/reference" } }
        },
        "$defs": { "Refund": { "type": "object", "properties": { "amount": { "$ref": "defs/common.json#/$defs/Money" } } } }
    }"##;
    const MONEY: &str = r#"{ "$defs": { "Money": { "type": "integer", "minimum": 0 } } }"#;
    const TICK: &str = r#"{ "title": "ClockTicked", "type": "object" }"#;

    fn billing() -> tempfile::TempDir {
        folder(&[
            ("billing.invoice.paid.schema.json", PAID),
            ("defs/common.json", MONEY),
            ("platform.clock.ticked.schema.json", TICK),
        ])
    }

    fn document(api: &AsyncApi, dir: &Path) -> Value {
        serde_json::from_str(&api.generate(dir).unwrap()).unwrap()
    }

    #[test]
    fn one_channel_message_and_operation_per_event_type_on_the_streams_server() {
        let dir = billing();
        let doc = document(
            AsyncApi::new("billing", "BILLING")
                .server("nats.internal:4222")
                .version("2.1.0"),
            dir.path(),
        );
        assert_eq!(doc["asyncapi"], "3.0.0");
        assert_eq!(doc["info"]["title"], "billing events");
        assert_eq!(doc["info"]["version"], "2.1.0");
        let server = &doc["servers"]["nats"];
        assert_eq!(server["host"], "nats.internal:4222");
        assert_eq!(server["protocol"], "nats");
        assert!(server["description"]
            .as_str()
            .unwrap()
            .contains("`BILLING`"));
        let channels = doc["channels"].as_object().unwrap();
        assert_eq!(
            channels.keys().collect::<Vec<_>>(),
            ["billing.invoice.paid", "platform.clock.ticked"]
        );
        let paid = &channels["billing.invoice.paid"];
        assert_eq!(paid["address"], "billing.invoice.paid");
        assert_eq!(paid["servers"][0]["$ref"], "#/servers/nats");
        assert_eq!(
            paid["messages"]["InvoicePaid"]["$ref"],
            "#/components/messages/InvoicePaid"
        );
        let send = &doc["operations"]["sendInvoicePaid"];
        assert_eq!(send["action"], "send");
        assert_eq!(send["channel"]["$ref"], "#/channels/billing.invoice.paid");
        assert_eq!(
            send["messages"][0]["$ref"],
            "#/channels/billing.invoice.paid/messages/InvoicePaid"
        );
    }

    #[test]
    fn a_message_is_the_envelope_with_its_headers_and_the_schema_as_data() {
        let dir = billing();
        let doc = document(&AsyncApi::new("billing", "BILLING"), dir.path());
        let message = &doc["components"]["messages"]["InvoicePaid"];
        assert_eq!(message["name"], "billing.invoice.paid");
        assert_eq!(message["summary"], "An invoice was paid.");
        assert_eq!(message["contentType"], "application/cloudevents+json");
        assert_eq!(
            message["headers"]["$ref"],
            "#/components/schemas/OutboxHeaders"
        );
        let headers = &doc["components"]["schemas"]["OutboxHeaders"];
        assert_eq!(
            headers["required"],
            json!(["Nats-Msg-Id", "Content-Type", "traceparent"])
        );
        assert_eq!(
            headers["properties"]["Content-Type"]["const"],
            "application/cloudevents+json"
        );
        assert!(headers["properties"]["tracestate"].is_object());
        let envelope = &message["payload"]["properties"];
        assert_eq!(envelope["type"]["const"], "billing.invoice.paid");
        assert_eq!(envelope["source"]["const"], "billing");
        assert_eq!(envelope["specversion"]["const"], "1.0");
        assert_eq!(envelope["data"]["$ref"], "#/components/schemas/InvoicePaid");
        assert!(envelope["traceparent"]["pattern"].is_string());
    }

    #[test]
    fn the_schema_is_resolved_as_the_build_resolves_it_and_its_refs_point_inside_it() {
        let dir = billing();
        let doc = document(&AsyncApi::new("billing", "BILLING"), dir.path());
        let schema = &doc["components"]["schemas"]["InvoicePaid"];
        let loaded = crate::load_event(
            &dir.path().join("billing.invoice.paid.schema.json"),
            dir.path(),
        )
        .unwrap();
        // the build's resolution: the shared definition inlined into $defs
        assert_eq!(schema["$defs"]["Money"], loaded.resolved["$defs"]["Money"]);
        assert_eq!(schema["$defs"]["Money"]["minimum"], 0);
        let inside = "#/components/schemas/InvoicePaid/$defs/";
        assert_eq!(
            schema["properties"]["amount"]["$ref"],
            format!("{inside}Money")
        );
        assert_eq!(
            schema["properties"]["refund"]["$ref"],
            format!("{inside}Refund")
        );
        assert_eq!(
            schema["$defs"]["Refund"]["properties"]["amount"]["$ref"],
            format!("{inside}Money")
        );
        // data is not a schema: a `$ref` inside a `const` stays as written
        assert_eq!(
            schema["properties"]["note"]["const"]["$ref"],
            "#/not/a/reference"
        );
        assert_eq!(schema["x-outbox-subject"], "invoice_id");
        assert!(schema.get("$schema").is_none());
    }

    #[test]
    fn the_subject_and_the_consumer_rules_are_described() {
        let dir = billing();
        let doc = document(&AsyncApi::new("billing", "BILLING"), dir.path());
        let messages = &doc["components"]["messages"];
        let paid = messages["InvoicePaid"]["description"].as_str().unwrap();
        assert!(
            paid.contains("the payload's `invoice_id` property"),
            "{paid}"
        );
        for rule in ["dedupe on the envelope's `id`", "order per subject only"] {
            assert!(paid.contains(rule), "{paid}");
            assert!(
                doc["info"]["description"].as_str().unwrap().contains(rule),
                "{rule}"
            );
        }
        let subject = &messages["InvoicePaid"]["payload"]["properties"]["subject"];
        assert!(subject["description"]
            .as_str()
            .unwrap()
            .contains("`invoice_id`"));
        let tick = &messages["ClockTicked"]["payload"]["properties"]["subject"];
        assert_eq!(tick["const"], "platform");
        assert_eq!(
            messages["ClockTicked"]["summary"],
            "A `platform.clock.ticked` event."
        );
    }

    #[test]
    fn the_same_schemas_give_the_same_bytes_with_keys_sorted() {
        let dir = billing();
        let api = AsyncApi::new("billing", "BILLING");
        let first = api.generate(dir.path()).unwrap();
        assert_eq!(first, api.generate(dir.path()).unwrap());
        // the same schema with its keys in another order: the same document
        let reordered: Value = serde_json::from_str(PAID).unwrap();
        let other = folder(&[
            (
                "billing.invoice.paid.schema.json",
                &serde_json::to_string(&sorted(&reordered)).unwrap(),
            ),
            ("defs/common.json", MONEY),
            ("platform.clock.ticked.schema.json", TICK),
        ]);
        assert_eq!(first, api.generate(other.path()).unwrap());
        assert!(first.ends_with("}\n"));
        assert!(first.starts_with("{\n  \"asyncapi\": \"3.0.0\",\n  \"channels\""));
    }

    #[test]
    fn consumed_types_are_left_out() {
        let dir = billing();
        let doc = document(
            AsyncApi::new("billing", "BILLING").consumes(["platform.>"]),
            dir.path(),
        );
        assert!(doc["channels"].get("platform.clock.ticked").is_none());
        assert!(doc["components"]["messages"].get("ClockTicked").is_none());
        let all = AsyncApi::new("billing", "BILLING")
            .consumes(["*.*.*"])
            .generate(dir.path())
            .unwrap_err();
        assert!(all.to_string().contains("describe no event"), "{all}");
    }

    #[test]
    fn bad_settings_and_a_bad_folder_are_reported_together() {
        let dir = folder(&[("billing.invoice.paid.schema.json", "{ not json")]);
        let err = AsyncApi::new("billing", "BILL.ING")
            .server("nats://localhost:4222")
            .consumes(["Billing.>"])
            .generate(dir.path())
            .unwrap_err()
            .to_string();
        for part in [
            "`BILL.ING` is not a JetStream stream name",
            "give the NATS server as host[:port]",
            "invalid consumes pattern `Billing.>`",
            "billing.invoice.paid.schema.json",
        ] {
            assert!(err.contains(part), "{part} missing from:\n{err}");
        }
    }
}
