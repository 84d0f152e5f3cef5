//! `x-outbox-subject`: the property whose value is the envelope's subject must be a required
//! string (any format, e.g. `uuid`) or integer property.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::naming;
use crate::pointer::{escape_token, percent_decode};

/// The subject property `x-outbox-subject` names, checked against the resolved schema (so a
/// subject whose type sits behind an inlined `$ref` is seen); `None` without the keyword.
pub(crate) fn check_subject(path: &Path, resolved: &Value) -> Result<Option<String>> {
    let Some(value) = resolved.get(naming::SUBJECT_KEYWORD) else {
        return Ok(None);
    };
    let pointer = format!("/{}", naming::SUBJECT_KEYWORD);
    let Some(property) = value.as_str() else {
        return Err(Error::schema(
            path,
            pointer,
            format!(
                "`{}` must be a string naming a property, found {value}",
                naming::SUBJECT_KEYWORD
            ),
        ));
    };
    let Some(schema) = resolved.get("properties").and_then(|p| p.get(property)) else {
        return Err(Error::schema(
            path,
            pointer,
            format!(
                "`{}` names `{property}`, which is not in `properties`; name an existing property or add it",
                naming::SUBJECT_KEYWORD
            ),
        ));
    };
    let required = resolved
        .get("required")
        .and_then(Value::as_array)
        .is_some_and(|r| r.iter().any(|v| v.as_str() == Some(property)));
    if !required {
        return Err(Error::schema(
            path,
            pointer,
            format!(
                "the subject property `{property}` must be required (every event has a subject): add \"{property}\" to `required`"
            ),
        ));
    }
    let schema = follow_local_refs(resolved, schema);
    match schema.get("type").and_then(Value::as_str) {
        Some("string" | "integer") => Ok(Some(property.to_owned())),
        _ => Err(Error::schema(
            path,
            format!("/properties/{}", escape_token(property)),
            format!(
                "the subject property `{property}` has type {}; a subject is a string (`\"type\": \"string\"`, optionally with `\"format\": \"uuid\"`) or an integer (`\"type\": \"integer\"`)",
                schema.get("type").map_or_else(|| "(none)".to_owned(), Value::to_string)
            ),
        )),
    }
}

/// Follows `$ref`s inside one document (up to a fixed depth, so cycles end).
fn follow_local_refs<'a>(doc: &'a Value, mut schema: &'a Value) -> &'a Value {
    for _ in 0..32 {
        let Some(target) = schema
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix('#'))
            .and_then(|fragment| doc.pointer(&percent_decode(fragment)))
        else {
            break;
        };
        schema = target;
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::{event, one_message, Folder};
    use serde_json::json;

    #[test]
    fn no_keyword_no_subject() {
        assert_eq!(
            check_subject(Path::new("e"), &event(json!({}))).unwrap(),
            None
        );
    }

    #[test]
    fn local_refs_are_followed_and_cycles_end() {
        let doc = json!({
            "$defs": {
                "Id": { "$ref": "#/$defs/Inner%20Id" },
                "Inner Id": { "type": "integer" },
                "Loop": { "$ref": "#/$defs/Loop" }
            }
        });
        let id = json!({ "$ref": "#/$defs/Id" });
        assert_eq!(follow_local_refs(&doc, &id), &json!({ "type": "integer" }));
        let looped = json!({ "$ref": "#/$defs/Loop" });
        assert_eq!(follow_local_refs(&doc, &looped), &doc["$defs"]["Loop"]);
        // A reference that does not resolve, or to another file, is where the search stops.
        let other = json!({ "$ref": "other.json#/$defs/Id" });
        assert_eq!(follow_local_refs(&doc, &other), &other);
    }

    #[test]
    fn subject_rules() {
        let f = Folder::new();
        let cases = [
            (
                json!({ "x-outbox-subject": 3 }),
                "/x-outbox-subject: `x-outbox-subject` must be a string",
            ),
            (
                json!({ "x-outbox-subject": "nope" }),
                "names `nope`, which is not in `properties`",
            ),
            (
                json!({ "x-outbox-subject": "n", "properties": { "id": {"type": "string"}, "n": { "type": "integer" } } }),
                "add \"n\" to `required`",
            ),
            (
                json!({ "x-outbox-subject": "id", "properties": { "id": { "type": "number" } } }),
                "at /properties/id: the subject property `id` has type \"number\"",
            ),
        ];
        for (i, (extra, says)) in cases.into_iter().enumerate() {
            let path = f.json(&format!("a.b.c{i}.schema.json"), event(extra));
            let m = one_message(f.load(&path).unwrap_err());
            assert!(m.contains(says), "{m}");
        }
        // An integer subject behind a local reference is fine.
        let path = f.json(
            "a.b.ok.schema.json",
            event(json!({
                "x-outbox-subject": "id",
                "properties": { "id": { "$ref": "#/definitions/Id" } },
                "definitions": { "Id": { "type": "integer" } }
            })),
        );
        assert_eq!(f.load(&path).unwrap().subject.as_deref(), Some("id"));
    }
}
