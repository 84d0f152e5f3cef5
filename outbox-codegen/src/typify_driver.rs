//! Running typify: every schema of the folder in one type space, its errors and panics turned
//! into [`Error::Schema`] at the definition or property it failed on, never a panic of the build
//! script.

use std::cell::Cell;
use std::collections::HashSet;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

use outbox_schema::pointer::escape_token;
use serde_json::{Map, Value};
use typify::{TypeSpace, TypeSpaceSettings};

use crate::error::{Error, Result};
use crate::evolution::rust::RustTypes;
use crate::schema::EventSchema;
use crate::typify_input::{typify_inputs, TypifyInput};

/// The Rust typify generates for `events`, parsed, before decoration; with `types`, also the
/// generated types as the schema evolution gate reads them.
pub(crate) fn generate(
    events: &[EventSchema],
    types: bool,
) -> Result<(syn::File, Option<RustTypes>)> {
    let inputs = typify_inputs(events)?;
    let (tokens, rust_types) = run_typify(&inputs, events, types)?;
    let file: syn::File = syn::parse2(tokens).map_err(|e| {
        Error::Config(format!(
            "the Rust generated from the schemas does not parse ({e}); this is a bug in the code generator"
        ))
    })?;
    check_unique_items(&file)?;
    Ok((file, rust_types))
}

/// The types typify generates for `events` (released schemas, from the lock), without the
/// code. The error is the generator's, in brief.
pub(crate) fn rust_types(events: &[EventSchema]) -> Result<RustTypes, String> {
    let inputs = typify_inputs(events).map_err(|e| e.to_string())?;
    let space = build_space(all_pairs(&inputs))?;
    Ok(RustTypes::of(&space))
}

/// typify's settings: plain structs without builder types (events are built with struct
/// literals), and `PartialEq` on every type.
fn settings() -> TypeSpaceSettings {
    let mut settings = TypeSpaceSettings::default();
    settings
        .with_struct_builder(false)
        .with_derive("PartialEq".to_owned());
    settings
}

thread_local! {
    /// Whether this thread is inside [`quietly`].
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Installs, once, a panic hook that says nothing for threads inside [`quietly`] and passes
/// every other panic to the hook that was there before. Swapping the process-wide hook around
/// each call would make concurrent calls (the gate generates the released schemas' types
/// while the build renders its own) wait for each other.
fn install_quiet_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
}

/// Runs `f`, turning a panic into its message, without printing the panic.
fn quietly<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    install_quiet_hook();
    let was = QUIET.with(|q| q.replace(true));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    result.map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_owned())
    })
}

/// The gist of a generator message: its first line, without the dump of the schema that
/// typify appends.
fn brief(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    let cut = [": {", ": Object(", ": Bool(", " Object(", " SchemaObject"]
        .iter()
        .filter_map(|marker| line.find(marker))
        .min()
        .unwrap_or(line.len());
    let gist = line[..cut].trim_end();
    if gist.chars().count() > 200 {
        format!("{}...", gist.chars().take(200).collect::<String>())
    } else {
        gist.to_owned()
    }
}

/// `(name, schema)` pairs in one type space; the error is typify's error or panic.
fn build_space(pairs: Vec<(String, Value)>) -> Result<TypeSpace, String> {
    let mut schemas = Vec::with_capacity(pairs.len());
    for (name, value) in pairs {
        let schema: schemars::schema::Schema = serde_json::from_value(value)
            .map_err(|e| format!("the schema of `{name}` has an unexpected shape ({e})"))?;
        schemas.push((name, schema));
    }
    quietly(move || {
        let mut space = TypeSpace::new(&settings());
        space
            .add_ref_types(schemas)
            .map_err(|e| brief(&e.to_string()))?;
        Ok(space)
    })
    .map_err(|panic| brief(&panic))
    .and_then(|r| r)
}

/// The code of a type space; rendering can panic too.
fn render(space: &TypeSpace) -> Result<proc_macro2::TokenStream, String> {
    quietly(|| space.to_stream()).map_err(|panic| brief(&panic))
}

/// Converts `(name, schema)` pairs in one type space to code.
fn convert(pairs: Vec<(String, Value)>) -> Result<proc_macro2::TokenStream, String> {
    render(&build_space(pairs)?)
}

/// The `(name, schema)` pairs of one event: its definitions, then its root.
fn pairs_of(input: &TypifyInput) -> Vec<(String, Value)> {
    let mut pairs: Vec<(String, Value)> = input
        .defs
        .iter()
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    pairs.push((input.title.clone(), input.root.clone()));
    pairs
}

/// The pairs of every input, each name once (definitions shared by several events are the
/// same value: `typify_inputs` checked it).
fn all_pairs(inputs: &[TypifyInput]) -> Vec<(String, Value)> {
    let mut all: Vec<(String, Value)> = Vec::new();
    let mut names = HashSet::new();
    for input in inputs {
        for (name, value) in pairs_of(input) {
            if names.insert(name.clone()) {
                all.push((name, value));
            }
        }
    }
    all
}

fn run_typify(
    inputs: &[TypifyInput],
    events: &[EventSchema],
    types: bool,
) -> Result<(proc_macro2::TokenStream, Option<RustTypes>)> {
    let converted = build_space(all_pairs(inputs)).and_then(|space| {
        let rust_types = types.then(|| RustTypes::of(&space));
        Ok((render(&space)?, rust_types))
    });
    match converted {
        Ok(done) => Ok(done),
        Err(batch_error) => {
            // Find the schemas (and the place inside them) the generator cannot take.
            let errors: Vec<Error> = inputs
                .iter()
                .zip(events)
                .filter_map(|(input, event)| locate_failure(input, event))
                .collect();
            Err(Error::from_list(errors).unwrap_or_else(|| {
                Error::Config(format!(
                    "the type generator cannot take the schemas together: {batch_error}; check that no two schemas define types with the same name"
                ))
            }))
        }
    }
}

/// If `input` alone fails in typify, the error naming the smallest part found to fail.
fn locate_failure(input: &TypifyInput, event: &EventSchema) -> Option<Error> {
    let whole = convert(pairs_of(input)).err()?;
    let any = || Value::Object(Map::new());
    let message = |why: &str| {
        format!(
            "the type generator cannot take this schema: {why}; simplify this construct (for example use a plain `type`, an `enum` of strings, or a `$ref` to a definition), or use `{{}}` to accept any JSON value here"
        )
    };
    // A definition alone (the others accept anything).
    for name in input.defs.keys() {
        let mut pairs: Vec<(String, Value)> = input
            .defs
            .keys()
            .map(|n| {
                (
                    n.clone(),
                    if n == name {
                        input.defs[n].clone()
                    } else {
                        any()
                    },
                )
            })
            .collect();
        pairs.push((input.title.clone(), serde_json::json!({ "type": "object" })));
        if let Err(why) = convert(pairs) {
            return Some(Error::schema(
                &event.path,
                format!("/$defs/{}", escape_token(name)),
                message(&why),
            ));
        }
    }
    // A property alone.
    if let Some(Value::Object(properties)) = input.root.get("properties") {
        for (property, schema) in properties {
            let mut root = input.root.clone();
            root["properties"] =
                Value::Object(Map::from_iter([(property.clone(), schema.clone())]));
            if let Some(Value::Array(required)) = root.get_mut("required") {
                required.retain(|r| r.as_str() == Some(property));
            }
            let mut pairs: Vec<(String, Value)> =
                input.defs.keys().map(|n| (n.clone(), any())).collect();
            pairs.push((input.title.clone(), root));
            if let Err(why) = convert(pairs) {
                return Some(Error::schema(
                    &event.path,
                    format!("/properties/{}", escape_token(property)),
                    message(&why),
                ));
            }
        }
    }
    Some(Error::schema(&event.path, "", message(&whole)))
}

/// Two top-level types with one name (from inline `title`s in different schemas) would not
/// compile; say so before the user sees rustc's error.
fn check_unique_items(file: &syn::File) -> Result<()> {
    let mut seen = HashSet::new();
    let mut errors = Vec::new();
    for item in &file.items {
        let ident = match item {
            syn::Item::Struct(i) => &i.ident,
            syn::Item::Enum(i) => &i.ident,
            syn::Item::Type(i) => &i.ident,
            _ => continue,
        };
        if !seen.insert(ident.to_string()) {
            errors.push(Error::Config(format!(
                "two generated types are named `{ident}`; give the inline schemas titled `{ident}` different titles, or move one definition into a shared definition file and `$ref` it"
            )));
        }
    }
    match Error::from_list(errors) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quietly_turns_panics_into_messages() {
        assert_eq!(quietly(|| 3), Ok(3));
        assert_eq!(
            quietly(|| -> () { panic!("boom {}", 1) }),
            Err("boom 1".to_owned())
        );
        assert_eq!(
            quietly(|| -> () { panic!("static") }),
            Err("static".to_owned())
        );
        assert_eq!(
            brief("not yet implemented: unhandled not schema Object(\n  SchemaObject {"),
            "not yet implemented: unhandled not schema"
        );
        assert_eq!(
            brief("if/then/else schemas are not supported: {\n"),
            "if/then/else schemas are not supported"
        );
    }

    #[test]
    fn quietly_works_on_several_threads_at_once() {
        let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|i| scope.spawn(move || quietly(|| -> () { panic!("thread {i}") })))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (i, result) in results.into_iter().enumerate() {
            assert_eq!(result, Err(format!("thread {i}")));
        }
        assert!(!QUIET.with(Cell::get), "the flag is reset after each call");
    }

    #[test]
    fn failures_are_located() {
        let input = TypifyInput {
            title: "Created".into(),
            root: serde_json::json!({
                "type": "object",
                "properties": {
                    "ok": { "type": "string" },
                    "bad": { "if": { "type": "string" }, "then": { "minLength": 1 } }
                }
            }),
            defs: Default::default(),
        };
        let event = EventSchema {
            path: "a.b.c.schema.json".into(),
            event_type: "a.b.c".into(),
            title: "Created".into(),
            subject: None,
            resolved: Value::Null,
            files: Vec::new(),
        };
        let e = locate_failure(&input, &event).expect("typify refuses if/then");
        let m = e.to_string();
        assert!(
            m.starts_with(
                "a.b.c.schema.json: at /properties/bad: the type generator cannot take this schema"
            ),
            "{m}"
        );

        let fine = TypifyInput {
            root: serde_json::json!({ "type": "object", "properties": { "ok": { "type": "string" } } }),
            ..input
        };
        assert!(locate_failure(&fine, &event).is_none());
    }
}
