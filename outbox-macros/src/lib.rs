//! `#[derive(OutboxEvent)]`: an event struct checked against its JSON Schema at compile time.
//!
//! Use it through `outbox-runtime`, which re-exports it; the runtime's `OutboxEvent` docs have
//! a compiled example. The shape:
//!
//! ```text
//! #[derive(serde::Serialize, serde::Deserialize, outbox_runtime::OutboxEvent)]
//! #[outbox(event_type = "billing.subscription.created", subject = "subscription_id")]
//! pub struct SubscriptionCreated {
//!     pub subscription_id: uuid::Uuid,
//!     pub seats: u32,
//! }
//! ```
//!
//! The keys of `#[outbox(..)]`:
//!
//! | key | meaning |
//! |---|---|
//! | `event_type = ".."` | required; `<domain>.<entity>.<action>[.v<N>]` |
//! | `source = ".."` | the emitting service; default: the crate's package name |
//! | `subject = ".."` | the JSON property that is the envelope's subject; default: the schema's `x-outbox-subject`, else `platform` |
//! | `schema = ".."` | the schema file, relative to `CARGO_MANIFEST_DIR` or absolute; default: `schemas/events/<event_type>.schema.json` |
//! | `consume_only` | the type may be decoded but not emitted (no `EmitEvent` impl) |
//!
//! The schema is read at compile time and tracked, so editing it rebuilds the crate. The struct
//! is checked against it: every required property has a non-`Option` field (an `Option` only
//! when the property is nullable), optional properties are `Option` (or `#[serde(default)]`),
//! a closed schema (`additionalProperties: false`) has no extra fields, JSON types match the
//! Rust types, serde `rename`, `rename_all`, `skip`, `default` and `flatten` are respected.
//! The rules are listed in the `check` module. Every error points at the field, type or
//! attribute literal to change.
//!
//! The derive is staged like serde's: `ast` (the struct and its serde attributes), `attr` (the
//! `#[outbox(..)]` keys), `schema` (loading, through `outbox-schema`), `check` (struct against
//! schema, one rule per method of `Checker`; `compat` for types, `suggest` for the words of
//! its messages), `expand`. Errors are collected across stages in a `Ctxt`, checked once at
//! the end; with any error, the output is the errors plus a stub impl, so the user sees the
//! real errors and nothing that follows from them.

mod ast;
mod attr;
mod check;
mod compat;
mod ctxt;
mod expand;
mod json;
mod schema;
mod suggest;
mod ty;

use proc_macro::TokenStream;
use syn::DeriveInput;

use crate::ast::Container;
use crate::attr::Attrs;
use crate::check::{Checker, Schema};
use crate::ctxt::Ctxt;

/// Derives `outbox_runtime::OutboxEvent` (and `outbox_runtime::EmitEvent` unless
/// `#[outbox(consume_only)]`), checking the struct against its JSON Schema. See the crate docs.
#[proc_macro_derive(OutboxEvent, attributes(outbox))]
pub fn derive_outbox_event(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as DeriveInput);
    derive(&input).into()
}

fn derive(input: &DeriveInput) -> proc_macro2::TokenStream {
    let cx = Ctxt::new();
    let Some(cont) = Container::from_ast(&cx, input) else {
        return compile_errors(cx.check());
    };
    let attrs = Attrs::from_attrs(&cx, cont.attrs, cont.ident_span());
    let mut output = None;
    if let Some(event_type) = &attrs.event_type {
        if let Some(loaded) = schema::load(&cx, &attrs, event_type) {
            let schema = Schema::new(
                &loaded.schema.resolved,
                &loaded.shown,
                loaded.schema.subject.as_deref(),
            );
            let checked = Checker::new(&cx, &cont, &attrs, event_type, schema).check();
            if !cx.has_errors() {
                output = Some(expand::expand(
                    &cont,
                    &attrs,
                    &event_type.value(),
                    &loaded,
                    &checked,
                ));
            }
        }
    }
    match (cx.check(), output) {
        (Ok(()), Some(tokens)) => tokens,
        (result, _) => {
            let mut tokens = compile_errors(result);
            tokens.extend(expand::stub(&cont, &attrs));
            tokens
        }
    }
}

/// One `compile_error!` for each error collected.
fn compile_errors(result: syn::Result<()>) -> proc_macro2::TokenStream {
    result
        .err()
        .map_or_else(proc_macro2::TokenStream::new, |e| e.to_compile_error())
}
