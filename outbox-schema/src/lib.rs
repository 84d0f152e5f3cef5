//! Loading and checking outbox event schemas: one `<event_type>.schema.json` file in, one
//! self-contained [`EventSchema`] out. The code generator (`outbox-codegen`) and the derive
//! (`outbox-macros`) both load schemas through this crate, so they apply the same rules.
//!
//! What is checked (every rule of `docs/event-naming.md` that a file can break):
//!
//! - the file name is `<event_type>.schema.json` with a valid event type
//!   ([`naming::check_event_type`]);
//! - the file is JSON and a valid JSON Schema, draft 2020-12 (the default when `$schema` is
//!   absent) or draft-07, by meta-schema validation;
//! - the root schema is `"type": "object"` (an event payload is an object);
//! - `title` exists and is a Rust type name ([`naming::check_type_name`]); [`load_dir`] also
//!   checks that no two schemas share a title;
//! - `x-outbox-subject`, when present, names a required property of type `string` (any format,
//!   e.g. `uuid`) or `integer`;
//! - every `$ref` resolves: local ones (`#/$defs/..`, `#/definitions/..`) to a value in the
//!   same file, relative ones (`defs/common.json#/$defs/Money`) to a value in another file
//!   under the schema folder. Remote (`http:`, `https:`, `urn:` ...) references are refused.
//!
//! Cross-file references are inlined: the referenced value is copied into the root's `$defs`
//! under the last segment of its pointer (or the referenced file's `title` when the reference
//! names a whole file) and the `$ref` is rewritten to `#/$defs/<Name>`. References inside the
//! copied values are resolved the same way, relative to the file they were written in.
//!
//! Shared definition files are the `.json` files of the schema folder that are not
//! `<event_type>.schema.json` files directly in it (for example `defs/common.json`). They are
//! read only when a schema refers to them.

mod draft;
pub mod error;
#[cfg(test)]
mod fixture;
mod load;
pub mod naming;
pub mod pointer;
mod read;
mod reference;
mod resolve;
mod rules;
mod subject;

pub use error::{Error, Result};
pub use load::{load_dir, load_event, schema_files, EventSchema};
