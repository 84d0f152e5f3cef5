//! Resolved event schemas in the form typify can take: each root named by its title, the
//! definitions of the whole folder in one namespace (they become Rust types in one module),
//! and references only to `#` or to root definitions.

use std::collections::{BTreeMap, HashMap};

use outbox_schema::pointer::escape_token;
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::schema::EventSchema;

/// What typify gets for one event: its root (named by the title) and its definitions.
pub(crate) struct TypifyInput {
    pub(crate) title: String,
    pub(crate) root: Value,
    pub(crate) defs: BTreeMap<String, Value>,
}

/// The definitions of the folder so far: name -> the first event that defines it, and how.
type Namespace<'e> = BTreeMap<String, (&'e EventSchema, Value)>;

/// Splits each resolved schema into a root and definitions; every problem of every schema is
/// reported.
pub(crate) fn typify_inputs(events: &[EventSchema]) -> Result<Vec<TypifyInput>> {
    let titles: HashMap<&str, &EventSchema> =
        events.iter().map(|e| (e.title.as_str(), e)).collect();
    let mut errors = Vec::new();
    let mut inputs = Vec::new();
    let mut folder = Namespace::new();
    for event in events {
        let mut doc = event.resolved.clone();
        check_refs(event, &mut doc, String::new(), &mut errors);
        let root_map = doc.as_object_mut().expect("an event schema is an object");
        let defs = take_defs(event, root_map, &titles, &mut errors);
        add_to_folder(event, &defs, &mut folder, &mut errors);
        root_map.remove("$schema");
        root_map.remove("$id");
        inputs.push(TypifyInput {
            title: event.title.clone(),
            root: doc,
            defs,
        });
    }
    match Error::from_list(errors) {
        Some(e) => Err(e),
        None => Ok(inputs),
    }
}

/// Removes `definitions` and `$defs` from the root and returns them as one map. A definition
/// may not take an event's title (both would be the same Rust type), nor mean two things.
fn take_defs(
    event: &EventSchema,
    root: &mut Map<String, Value>,
    titles: &HashMap<&str, &EventSchema>,
    errors: &mut Vec<Error>,
) -> BTreeMap<String, Value> {
    let mut defs: BTreeMap<String, Value> = BTreeMap::new();
    for keyword in ["definitions", "$defs"] {
        let Some(Value::Object(map)) = root.remove(keyword) else {
            continue;
        };
        for (name, def) in map {
            let pointer = format!("/{keyword}/{}", escape_token(&name));
            if let Some(other) = titles.get(name.as_str()) {
                errors.push(Error::schema(
                    &event.path,
                    pointer,
                    format!(
                        "the definition `{name}` has the name of the event type {} (its `title`); rename the definition",
                        other.event_type
                    ),
                ));
                continue;
            }
            match defs.get(&name) {
                Some(existing) if *existing != def => errors.push(Error::schema(
                    &event.path,
                    pointer,
                    format!(
                        "`$defs` and `definitions` both define `{name}`, differently; rename one"
                    ),
                )),
                _ => {
                    defs.insert(name, def);
                }
            }
        }
    }
    defs
}

/// Adds the definitions of `event` to the folder's namespace; a name another event defines
/// differently is an error.
fn add_to_folder<'e>(
    event: &'e EventSchema,
    defs: &BTreeMap<String, Value>,
    folder: &mut Namespace<'e>,
    errors: &mut Vec<Error>,
) {
    for (name, def) in defs {
        match folder.get(name) {
            Some((first, value)) if value != def => errors.push(Error::schema(
                &event.path,
                format!("/$defs/{}", escape_token(name)),
                format!(
                    "{} defines a different `{name}`; all definitions of the folder become Rust types in one module, so each name must mean one thing: rename one, or move the shared definition into a definition file that both `$ref`",
                    first.path.display()
                ),
            )),
            Some(_) => {}
            None => {
                folder.insert(name.clone(), (event, def.clone()));
            }
        }
    }
}

/// Rewrites `"$ref": "#"` to the event's own name and refuses references typify cannot follow.
fn check_refs(event: &EventSchema, value: &mut Value, at: String, errors: &mut Vec<Error>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                let child_at = format!("{at}/{}", escape_token(key));
                if key == "$ref" {
                    if let Value::String(reference) = child {
                        if reference == "#" {
                            *reference = format!("#/$defs/{}", event.title);
                        } else if !is_root_def_ref(reference) {
                            errors.push(Error::schema(
                                &event.path,
                                child_at,
                                format!(
                                    "the reference `{reference}` points inside a schema; the type generator follows only references to root definitions: move the target into the root `$defs` and refer to it as `#/$defs/<Name>`"
                                ),
                            ));
                        }
                    }
                } else if !matches!(key.as_str(), "enum" | "const" | "default" | "examples") {
                    check_refs(event, child, child_at, errors);
                }
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter_mut().enumerate() {
                check_refs(event, child, format!("{at}/{i}"), errors);
            }
        }
        _ => {}
    }
}

/// Whether `reference` names a root definition: `#/$defs/<Name>` or `#/definitions/<Name>`.
fn is_root_def_ref(reference: &str) -> bool {
    ["#/$defs/", "#/definitions/"].iter().any(|prefix| {
        reference
            .strip_prefix(prefix)
            .is_some_and(|name| !name.is_empty() && !name.contains('/'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::PathBuf;

    fn event(event_type: &str, title: &str, resolved: Value) -> EventSchema {
        EventSchema {
            path: PathBuf::from(format!("{event_type}.schema.json")),
            event_type: event_type.to_owned(),
            title: title.to_owned(),
            subject: None,
            resolved,
            files: Vec::new(),
        }
    }

    fn messages(events: &[EventSchema]) -> Vec<String> {
        match typify_inputs(events) {
            Ok(_) => Vec::new(),
            Err(e) => e.into_list().iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn root_def_refs() {
        assert!(is_root_def_ref("#/$defs/Money"));
        assert!(is_root_def_ref("#/definitions/Money"));
        assert!(!is_root_def_ref("#/properties/a"));
        assert!(!is_root_def_ref("#/$defs/Money/properties/a"));
        assert!(!is_root_def_ref("#/$defs/"));
    }

    #[test]
    fn roots_and_definitions_are_split() {
        let events = [event(
            "a.b.c",
            "Created",
            json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "$id": "x",
                "type": "object",
                "properties": { "me": { "$ref": "#" }, "m": { "$ref": "#/definitions/Money" } },
                "definitions": { "Money": { "type": "integer" } },
                "$defs": { "Money": { "type": "integer" }, "Code": { "type": "string" } }
            }),
        )];
        let inputs = typify_inputs(&events).unwrap();
        let input = &inputs[0];
        assert_eq!(input.title, "Created");
        assert_eq!(
            input.root,
            json!({
                "type": "object",
                "properties": { "me": { "$ref": "#/$defs/Created" }, "m": { "$ref": "#/definitions/Money" } }
            })
        );
        assert_eq!(input.defs.keys().collect::<Vec<_>>(), ["Code", "Money"]);
    }

    #[test]
    fn one_namespace_for_the_folder() {
        let a = event(
            "a.b.c",
            "Created",
            json!({ "type": "object", "$defs": { "Money": { "type": "integer" }, "Deleted": {} } }),
        );
        let b = event(
            "a.b.d",
            "Deleted",
            json!({
                "type": "object",
                "properties": { "x": { "$ref": "#/$defs/Money/properties/y" } },
                "$defs": { "Money": { "type": "string" } },
                "definitions": { "Money": { "type": "number" } }
            }),
        );
        let got = messages(&[a, b]);
        let want = [
            "a.b.c.schema.json: at /$defs/Deleted: the definition `Deleted` has the name of the event type a.b.d",
            "a.b.d.schema.json: at /properties/x/$ref: the reference `#/$defs/Money/properties/y` points inside a schema",
            "a.b.d.schema.json: at /$defs/Money: `$defs` and `definitions` both define `Money`, differently",
            "a.b.d.schema.json: at /$defs/Money: a.b.c.schema.json defines a different `Money`",
        ];
        assert_eq!(got.len(), want.len(), "{got:#?}");
        for (got, want) in got.iter().zip(want) {
            assert!(got.starts_with(want), "\n got: {got}\nwant: {want}");
        }
    }
}
