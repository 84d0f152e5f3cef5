//! The rules of `docs/event-naming.md` for an event schema file as a whole: its name is
//! `<event_type>.schema.json`, its root is an object schema, its `title` is a Rust type name,
//! and no two schemas of a folder share a title. (`x-outbox-subject` is in `subject.rs`.)

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::load::EventSchema;
use crate::naming;

/// The event type named by the file name `<event_type>.schema.json`.
pub(crate) fn event_type_of(path: &Path) -> Result<String> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let Some(event_type) = name.strip_suffix(naming::SCHEMA_SUFFIX) else {
        return Err(Error::FileName {
            file: path.to_owned(),
            message: format!(
                "an event schema file is named `<event_type>{}`; rename `{name}` accordingly (like `billing.subscription.created{}`)",
                naming::SCHEMA_SUFFIX,
                naming::SCHEMA_SUFFIX
            ),
        });
    };
    naming::check_event_type(event_type).map_err(|why| Error::FileName {
        file: path.to_owned(),
        message: format!(
            "invalid event type `{event_type}` in the file name: {why}; rename the file to `<event_type>{}`",
            naming::SCHEMA_SUFFIX
        ),
    })?;
    Ok(event_type.to_owned())
}

/// The document is a JSON object; every later rule looks inside it, so without one there is
/// nothing more to check.
pub(crate) fn check_is_object(path: &Path, doc: &Value) -> Result<()> {
    if doc.is_object() {
        return Ok(());
    }
    Err(Error::schema(
        path,
        "",
        "an event schema must be a JSON object with `\"type\": \"object\"`",
    ))
}

/// The root schema is `"type": "object"`: an event payload is a JSON object.
pub(crate) fn check_root_type(path: &Path, doc: &Value) -> Result<()> {
    match doc.get("type") {
        Some(Value::String(t)) if t == "object" => Ok(()),
        Some(other) => Err(Error::schema(
            path,
            "/type",
            format!("the root schema has type {other}; an event payload is a JSON object: set `\"type\": \"object\"`"),
        )),
        None => Err(Error::schema(
            path,
            "",
            "the root schema has no `type`; an event payload is a JSON object: add `\"type\": \"object\"`",
        )),
    }
}

/// The schema's `title`, which is the Rust type name of the event.
pub(crate) fn title_of(path: &Path, doc: &Value) -> Result<String> {
    match doc.get("title") {
        Some(Value::String(title)) => match naming::check_type_name(title) {
            Ok(()) => Ok(title.clone()),
            Err(why) => Err(Error::schema(
                path,
                "/title",
                format!("`title` is the Rust type name of the event, and `{title}` is not one: {why}"),
            )),
        },
        Some(other) => Err(Error::schema(
            path,
            "/title",
            format!("`title` must be a string (the Rust type name of the event, like \"SubscriptionCreated\"), found {other}"),
        )),
        None => Err(Error::schema(
            path,
            "",
            "the schema has no `title`; add one: it is the Rust type name of the event, like \"SubscriptionCreated\"",
        )),
    }
}

/// One error for every event whose title an earlier event of `events` already uses.
pub(crate) fn check_unique_titles(events: &[EventSchema]) -> Vec<Error> {
    let mut errors = Vec::new();
    let mut titles: HashMap<&str, &EventSchema> = HashMap::new();
    for event in events {
        if let Some(first) = titles.get(event.title.as_str()) {
            errors.push(Error::schema(
                &event.path,
                "/title",
                format!(
                    "the title `{}` is already used by {} (`{}`); each event needs its own Rust type name: rename one of them",
                    event.title,
                    first.path.display(),
                    first.event_type
                ),
            ));
        } else {
            titles.insert(&event.title, event);
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::{event, messages, one_message, Folder};
    use serde_json::json;

    #[test]
    fn file_names() {
        let ok = event_type_of(Path::new("schemas/billing.plan.changed.v2.schema.json"));
        assert_eq!(ok.unwrap(), "billing.plan.changed.v2");
        for (name, says) in [
            (
                "billing.plan.changed.json",
                "rename `billing.plan.changed.json` accordingly",
            ),
            (
                "billing.plan.schema.json",
                "invalid event type `billing.plan` in the file name: it has 2 tokens",
            ),
            (
                ".schema.json",
                "invalid event type `` in the file name: it is empty",
            ),
        ] {
            let err = event_type_of(Path::new(name)).unwrap_err();
            assert!(matches!(err, Error::FileName { .. }), "{err:?}");
            assert!(err.to_string().contains(says), "{name}: {err}");
        }
    }

    #[test]
    fn root_type_and_title() {
        let p = Path::new("e.schema.json");
        assert!(check_is_object(p, &json!({})).is_ok());
        assert!(check_is_object(p, &json!([]))
            .unwrap_err()
            .to_string()
            .contains("must be a JSON object"));
        assert!(check_root_type(p, &json!({ "type": "object" })).is_ok());
        let m = check_root_type(p, &json!({})).unwrap_err().to_string();
        assert!(
            m.starts_with("e.schema.json: at the root: the root schema has no `type`"),
            "{m}"
        );
        assert_eq!(
            title_of(p, &json!({ "title": "PlanChanged" })).unwrap(),
            "PlanChanged"
        );
        let m = title_of(p, &json!({ "title": 3 })).unwrap_err().to_string();
        assert!(
            m.starts_with("e.schema.json: at /title: `title` must be a string"),
            "{m}"
        );
    }

    #[test]
    fn bad_file_name() {
        let f = Folder::new();
        let path = f.json("a.B.created.schema.json", event(json!({})));
        let m = one_message(f.load(&path).unwrap_err());
        assert!(
            m.contains("a.B.created.schema.json: invalid event type `a.B.created`"),
            "{m}"
        );
        assert!(m.contains("uppercase"), "{m}");
        let path = f.json("created.json", event(json!({})));
        let m = one_message(f.load(&path).unwrap_err());
        assert!(m.contains("rename `created.json`"), "{m}");
    }

    #[test]
    fn root_must_be_an_object_with_a_title() {
        let f = Folder::new();
        let path = f.json("a.b.created.schema.json", json!({ "type": "string" }));
        let list = messages(f.load(&path).unwrap_err());
        assert_eq!(list.len(), 2, "{list:#?}");
        assert!(
            list[0].contains("at /type: the root schema has type \"string\""),
            "{list:#?}"
        );
        assert!(
            list[1].contains("at the root: the schema has no `title`"),
            "{list:#?}"
        );

        let path = f.json(
            "a.b.x.schema.json",
            event(json!({ "title": "created event" })),
        );
        let m = one_message(f.load(&path).unwrap_err());
        assert!(m.contains("at /title: `title` is the Rust type name of the event, and `created event` is not one"), "{m}");
    }
}
