//! The JSON Schema drafts a schema may declare in `$schema`, and validation against the
//! draft's meta-schema.

use std::collections::HashSet;
use std::path::Path;

use serde_json::Value;

use crate::error::Error;

/// The JSON Schema drafts accepted in `$schema`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Draft {
    Draft7,
    Draft202012,
}

impl Draft {
    /// The draft `doc` declares, or `default` when it has no `$schema`. The error says what to
    /// write instead; it belongs at `/$schema`.
    pub(crate) fn of(doc: &Value, default: Draft) -> Result<Draft, String> {
        let Some(declared) = doc.get("$schema") else {
            return Ok(default);
        };
        let Some(uri) = declared.as_str() else {
            return Err("`$schema` must be a string; use \"https://json-schema.org/draft/2020-12/schema\" or \"http://json-schema.org/draft-07/schema#\"".into());
        };
        let uri = uri.trim_end_matches('#');
        let uri = uri
            .strip_prefix("https://")
            .or_else(|| uri.strip_prefix("http://"))
            .unwrap_or(uri);
        match uri {
            "json-schema.org/draft/2020-12/schema" => Ok(Draft::Draft202012),
            "json-schema.org/draft-07/schema" => Ok(Draft::Draft7),
            _ => Err(format!(
                "unsupported `$schema` {declared}; use \"https://json-schema.org/draft/2020-12/schema\" (or omit it) or \"http://json-schema.org/draft-07/schema#\""
            )),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Draft::Draft7 => "draft-07",
            Draft::Draft202012 => "draft 2020-12",
        }
    }

    /// Every place where `doc` (the file `path`) breaks this draft's meta-schema, each once.
    pub(crate) fn validate(self, path: &Path, doc: &Value) -> Vec<Error> {
        let validator = match self {
            Draft::Draft7 => jsonschema::draft7::meta::validator(),
            Draft::Draft202012 => jsonschema::draft202012::meta::validator(),
        };
        // A value that breaks several keywords of the meta-schema can produce the same
        // message more than once.
        let mut seen = HashSet::new();
        validator
            .iter_errors(doc)
            .filter_map(|e| {
                let pointer = e.instance_path().to_string();
                let message = format!(
                    "not a valid JSON Schema ({}): {e}; fix the value so it matches the JSON Schema specification",
                    self.name()
                );
                seen.insert((pointer.clone(), message.clone()))
                    .then(|| Error::schema(path, pointer, message))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::{event, one_message, Folder};
    use serde_json::json;

    #[test]
    fn declared_drafts() {
        let of = |doc: Value| Draft::of(&doc, Draft::Draft202012);
        assert_eq!(of(json!({})), Ok(Draft::Draft202012));
        assert_eq!(
            Draft::of(&json!({}), Draft::Draft7),
            Ok(Draft::Draft7),
            "a definition file without `$schema` takes its event schema's draft"
        );
        for uri in [
            "https://json-schema.org/draft/2020-12/schema",
            "http://json-schema.org/draft/2020-12/schema#",
        ] {
            assert_eq!(
                of(json!({ "$schema": uri })),
                Ok(Draft::Draft202012),
                "{uri}"
            );
        }
        for uri in [
            "http://json-schema.org/draft-07/schema#",
            "https://json-schema.org/draft-07/schema",
        ] {
            assert_eq!(of(json!({ "$schema": uri })), Ok(Draft::Draft7), "{uri}");
        }
        let err = of(json!({ "$schema": "http://json-schema.org/draft-04/schema#" })).unwrap_err();
        assert!(
            err.starts_with("unsupported `$schema` \"http://json-schema.org/draft-04/schema#\""),
            "{err}"
        );
        let err = of(json!({ "$schema": 7 })).unwrap_err();
        assert!(err.starts_with("`$schema` must be a string"), "{err}");
    }

    #[test]
    fn meta_schema_errors_are_reported_once_each() {
        let doc = json!({ "type": "object", "properties": { "a": { "type": "strnig" } } });
        let errors = Draft::Draft202012.validate(Path::new("x.json"), &doc);
        assert_eq!(errors.len(), 1, "{errors:#?}");
        let m = errors[0].to_string();
        assert!(
            m.starts_with("x.json: at /properties/a/type: not a valid JSON Schema (draft 2020-12)"),
            "{m}"
        );
        assert!(Draft::Draft7
            .validate(Path::new("x.json"), &json!({ "type": "object" }))
            .is_empty());
    }

    #[test]
    fn invalid_json_schema() {
        let f = Folder::new();
        let path = f.json(
            "a.b.created.schema.json",
            event(json!({ "properties": { "id": { "type": "strnig" } } })),
        );
        let m = one_message(f.load(&path).unwrap_err());
        assert!(
            m.contains("at /properties/id/type: not a valid JSON Schema (draft 2020-12)"),
            "{m}"
        );

        let path = f.json(
            "a.b.other.schema.json",
            event(json!({
                "$schema": "http://json-schema.org/draft-07/schema#",
                "required": "id"
            })),
        );
        let m = one_message(f.load(&path).unwrap_err());
        assert!(
            m.contains("at /required: not a valid JSON Schema (draft-07)"),
            "{m}"
        );

        let path = f.json(
            "a.b.third.schema.json",
            event(json!({ "$schema": "http://json-schema.org/draft-04/schema#" })),
        );
        let m = one_message(f.load(&path).unwrap_err());
        assert!(m.contains("at /$schema: unsupported `$schema`"), "{m}");
    }
}
