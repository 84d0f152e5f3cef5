//! JSON Schema event contracts to typed Rust events, for build scripts.
//!
//! A service keeps one JSON Schema per event type in `schemas/events/` (the rules are in
//! `docs/event-naming.md`). This crate turns that folder into Rust types at build time, so a
//! change of contract is a compile error in the code that emits or reads the event.
//!
//! # Set up
//!
//! ```toml
//! # Cargo.toml of the service
//! [dependencies]
//! outbox-runtime = "0.1"      # the derive the generated code uses, emit, relay, ...
//! serde = { version = "1", features = ["derive"] }
//! serde_json = "1"
//! chrono = { version = "0.4", features = ["serde"] }   # when a schema uses format date-time/date
//! uuid = { version = "1", features = ["serde"] }       # when a schema uses format uuid
//! regress = "0.12"                                      # when a schema uses `pattern`
//!
//! [build-dependencies]
//! outbox-codegen = "0.1"
//! ```
//!
//! The generated code names its dependencies by absolute path (`::serde`, `::serde_json`,
//! `::chrono`, `::uuid`, `::regress`, `::outbox_runtime`), so the service depends on each crate
//! its schemas need: `serde`, `serde_json` and `outbox-runtime` always; `chrono` for
//! `date-time` and `date` formats, `uuid` for `uuid`, `regress` for `pattern`. A missing one is
//! a plain "unresolved crate" error pointing at the generated file.
//!
//! ```no_run
//! // build.rs, inside `fn main()`:
//! outbox_codegen::Config::new()
//!     .source("billing")                 // the envelope's `source`; default: CARGO_PKG_NAME
//!     .consumes(["payments.>"])          // types this service only reads (see below)
//!     .compile("schemas/events")         // every <event_type>.schema.json in it
//!     .unwrap();
//! ```
//!
//! or, with the defaults, `outbox_codegen::compile("schemas/events").unwrap()`. Then include the
//! output in a module of the service:
//!
//! ```text
//! // src/events.rs
//! include!(concat!(env!("OUT_DIR"), "/outbox_events.rs"));
//! ```
//!
//! The step writes `$OUT_DIR/outbox_events.rs` only when its content changed (so nothing is
//! recompiled when the schemas did not change), and prints `cargo:rerun-if-changed` for the
//! folder and for every file it read, shared definition files included.
//!
//! # What is generated
//!
//! For `schemas/events/billing.subscription.created.schema.json`:
//!
//! ```json
//! {
//!   "title": "SubscriptionCreated",
//!   "type": "object",
//!   "x-outbox-subject": "subscription_id",
//!   "required": ["subscription_id", "plan", "seats", "started_at"],
//!   "properties": {
//!     "subscription_id": { "type": "string", "format": "uuid" },
//!     "plan": { "$ref": "defs/common.json#/$defs/Plan" },
//!     "seats": { "type": "integer", "minimum": 1 },
//!     "started_at": { "type": "string", "format": "date-time" },
//!     "trial": { "type": "object", "properties": { "ends_at": { "type": "string", "format": "date-time" } } }
//!   }
//! }
//! ```
//!
//! the generated file holds (trimmed):
//!
//! ```text
//! #[allow(clippy::all, missing_docs, /* ... */)]
//! mod outbox_generated {
//!     #[derive(::serde::Deserialize, ::serde::Serialize, Clone, Debug, PartialEq)]
//!     #[derive(::outbox_runtime::OutboxEvent)]
//!     #[outbox(
//!         event_type = "billing.subscription.created",
//!         source = "billing",
//!         subject = "subscription_id",
//!         schema = "schemas/events/billing.subscription.created.schema.json"
//!     )]
//!     pub struct SubscriptionCreated {
//!         pub subscription_id: ::uuid::Uuid,
//!         pub plan: Plan,
//!         pub seats: ::std::num::NonZeroU64,
//!         pub started_at: ::chrono::DateTime<::chrono::offset::Utc>,
//!         pub trial: ::std::option::Option<SubscriptionCreatedTrial>,
//!     }
//!     pub enum Plan { Free, Pro, Enterprise }
//!     pub struct SubscriptionCreatedTrial { /* ... */ }
//!     pub mod error { /* ConversionError, for patterns and string lengths */ }
//!
//!     /// `(event_type, self-contained schema JSON)` for every type, sorted.
//!     pub const EVENT_SCHEMAS: &[(&str, &str)] = &[/* ... */];
//! }
//! pub use self::outbox_generated::*;
//! ```
//!
//! - Every root event struct derives `outbox_runtime::OutboxEvent`, which fixes the event type,
//!   source and subject property at compile time, checks the struct against its schema, and
//!   makes the type emittable (`EmitEvent`). The `schema` path is relative to
//!   `CARGO_MANIFEST_DIR` when the folder is inside the crate (absolute otherwise), so the
//!   generated code is the same on every machine.
//! - Definitions (`$defs`, including those inlined from shared definition files) and inline
//!   objects and enums become their own types, named by their definition name or by the parent
//!   type and property (`SubscriptionCreatedTrial`). Strings with a `pattern` or length become
//!   newtypes that check on construction (`"ABC".parse()?`, `try_into()?`) and on decoding.
//! - `EVENT_SCHEMAS` feeds the runtime's untyped registry.
//!
//! # Emitting and consuming: `.consumes`
//!
//! By default a service emits every event type of its folder. A service that also keeps the
//! schemas of events it only reads lists them with [`Config::consumes`]: those types are still
//! generated (to decode deliveries) but marked `consume_only`, so they lack the `EmitEvent`
//! marker trait and emitting one is a compile error at the `emit` call.
//!
//! Patterns match event types token by token, like NATS subjects: `*` matches exactly one token,
//! `>` (last only) one or more. `payments.>` matches every `payments` type, `payments.*.paid`
//! matches `payments.invoice.paid`, and `payments.*` matches nothing with three tokens.
//!
//! # Errors
//!
//! Every problem is an [`Error`] that names the file, the JSON pointer and what to change, for
//! example
//!
//! ```text
//! schemas/events/billing.subscription.created.schema.json: at /properties/plan/$ref: `$ref` points to `defs/comon.json`, which does not exist (looked for schemas/events/defs/comon.json); fix the path, which is relative to this file
//! ```
//!
//! All problems of the folder are collected and reported at once ([`Error::Many`], one a line);
//! [`check`] returns them as a list (`outbox check` prints it). What is checked (besides the
//! schema evolution gate, below):
//! the file name is a valid event type; the file is JSON and a valid JSON Schema (draft 2020-12
//! or draft-07, by meta-schema validation); the root is `"type": "object"`; `title` is a Rust type
//! name no other schema uses; `x-outbox-subject` names a required string, uuid or integer
//! property; every `$ref` resolves inside the folder; and the type generator (typify) can take
//! the schema. Typify's errors and panics become [`Error::Schema`] at the definition or property
//! it failed on, never a panic of the build script.
//!
//! # Schema evolution
//!
//! A released event type must not change in a way its consumers cannot read. `outbox lock`
//! records every type's schema in a lock file beside the folder (`schemas/events.lock`), and
//! the build step compares each schema with it under a compatibility mode (`backward`,
//! `forward` or `full`, the default) and level (`wire`, or `rust`, the default). A breaking
//! change is an [`Error::Incompatible`] listing each change with its JSON pointer, rule and
//! whom it breaks, and the fixes; a compatible change is a cargo warning to refresh the lock.
//! See [`evolution`] and `docs/schema-evolution.md`. The builder takes the settings:
//!
//! ```no_run
//! use outbox_codegen::evolution::{Level, Mode};
//!
//! // build.rs, inside `fn main()`:
//! outbox_codegen::Config::new()
//!     .compatibility(Mode::Full)                                  // every type, over the lock
//!     .compatibility_for("billing.invoice.paid", Mode::Backward)  // one type
//!     .compatibility_level(Level::Rust)
//!     .lock_file("schemas/events.lock")                           // the default for schemas/events
//!     .compile("schemas/events")
//!     .unwrap();
//! ```
//!
//! # What the types do not enforce
//!
//! The types are generated by [typify](https://docs.rs/typify), which ignores `const`, most
//! numeric bounds (`maximum`, `exclusiveMinimum`, `multipleOf`, ...), formats other than `uuid`,
//! `date-time` and `date`, `uniqueItems` and array lengths. The runtime validates every payload
//! against its schema before the insert, so those constraints still hold for every event in the
//! outbox; they are runtime errors, not compile errors.
//!
//! # Without a build script
//!
//! [`Config::generate`] returns the Rust without writing it (`outbox gen` prints it), and
//! [`schema::load_event`] / [`schema::load_dir`] load and check schemas for other tools (the
//! derive uses them).
//!
//! # For consumers in other languages
//!
//! [`AsyncApi`] writes an AsyncAPI 3.0 document of the folder (`outbox asyncapi`): the
//! subjects, the CloudEvents envelope and its headers, each event's resolved schema, and the
//! rules a consumer must follow. See [`asyncapi`].
pub mod asyncapi;
mod config;
mod decorate;
pub mod evolution;
mod output;
mod pattern;
mod typify_driver;
mod typify_input;

pub use outbox_schema::{error, naming};

/// Loading and checking event schemas, from `outbox-schema` (the derive uses the same crate).
pub mod schema {
    pub use outbox_schema::{load_dir, load_event, schema_files, EventSchema};
}

pub use asyncapi::AsyncApi;
pub use config::{check, compile, Checked, Config, Locked, LockedStatus};
pub use error::{Error, Result};
pub use output::DEFAULT_OUT_FILE;
pub use schema::{load_dir, load_event, EventSchema};
