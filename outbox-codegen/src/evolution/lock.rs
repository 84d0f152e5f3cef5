//! The lock file: per event type, the schema as released and its compatibility mode. `outbox
//! lock` writes it beside the schema folder and it is checked in; the build reads it.
//!
//! The format is pretty-printed JSON (two-space indent, a final newline) with the keys of every
//! object sorted, so it diffs line by line and writing the same folder twice gives the same
//! bytes:
//!
//! ```json
//! {
//!   "about": "Released event schemas, the baseline of the schema evolution gate ...",
//!   "events": {
//!     "billing.subscription.created": {
//!       "mode": "full",
//!       "schema": { "$defs": { "Plan": { ... } }, "properties": { ... }, "title": "SubscriptionCreated", ... }
//!     }
//!   },
//!   "version": 1
//! }
//! ```
//!
//! The schema is the *normalized* schema: what the loader makes of the file (every cross-file
//! `$ref` inlined into the root's `$defs` and pointing there, local references as written), with
//! the keys of every object sorted. Nothing else is rewritten: annotations stay, so the lock is
//! the contract as it was published.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::Mode;
use crate::error::{Error, Result};

/// The version of the lock file format this crate reads and writes.
pub const LOCK_VERSION: u64 = 1;

const ABOUT: &str = "Released event schemas, the baseline of the schema evolution gate: each type's schema as published (shared definitions inlined) and its compatibility mode. Written by `outbox lock`; check it in. See docs/schema-evolution.md.";

/// The contents of a lock file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Lock {
    /// Per event type, sorted.
    pub events: BTreeMap<String, LockEntry>,
}

/// One released event type.
#[derive(Debug, Clone, PartialEq)]
pub struct LockEntry {
    /// The compatibility mode the type was locked with.
    pub mode: Mode,
    /// The normalized schema ([`normalize`]).
    pub schema: Value,
}

impl Lock {
    /// Reads the lock file at `path`; `None` when there is none.
    ///
    /// # Errors
    ///
    /// The file cannot be read, or is not a lock file of this format.
    pub fn read(path: &Path) -> Result<Option<Lock>> {
        match fs::read_to_string(path) {
            Ok(text) => Lock::parse(&text, path).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::Io {
                path: path.to_owned(),
                source,
            }),
        }
    }

    /// Parses the text of a lock file; `path` is for the messages.
    ///
    /// ```
    /// use outbox_codegen::evolution::{Lock, Mode};
    ///
    /// let text = r#"{ "version": 1, "events": {
    ///     "a.b.c": { "mode": "backward", "schema": { "title": "C", "type": "object" } } } }"#;
    /// let lock = Lock::parse(text, "events.lock".as_ref()).unwrap();
    /// assert_eq!(lock.events["a.b.c"].mode, Mode::Backward);
    /// ```
    ///
    /// # Errors
    ///
    /// Not JSON, another version, or an entry without a valid mode or schema; the error names
    /// the file and the JSON pointer.
    pub fn parse(text: &str, path: &Path) -> Result<Lock> {
        let fix = "restore it from version control, or write it again with `outbox lock`";
        let doc: Value = serde_json::from_str(text).map_err(|e| {
            Error::schema(
                path,
                "",
                format!("the lock file is not valid JSON ({e}); {fix}"),
            )
        })?;
        match doc.get("version").and_then(Value::as_u64) {
            Some(LOCK_VERSION) => {}
            Some(other) => {
                return Err(Error::schema(
                    path,
                    "/version",
                    format!("lock file version {other} is not supported (this outbox-codegen reads version {LOCK_VERSION}); upgrade outbox-codegen, or {fix}"),
                ))
            }
            None => {
                return Err(Error::schema(
                    path,
                    "/version",
                    format!("the lock file has no `version`; {fix}"),
                ))
            }
        }
        let Some(events) = doc.get("events").and_then(Value::as_object) else {
            return Err(Error::schema(
                path,
                "/events",
                format!("the lock file has no `events` object; {fix}"),
            ));
        };
        let mut lock = Lock::default();
        let mut errors = Vec::new();
        for (event_type, entry) in events {
            let at = format!(
                "/events/{}",
                outbox_schema::pointer::escape_token(event_type)
            );
            let mode = entry
                .get("mode")
                .and_then(Value::as_str)
                .ok_or_else(|| "no `mode`".to_owned())
                .and_then(|m| m.parse::<Mode>());
            let schema = entry.get("schema").filter(|s| s.is_object());
            match (mode, schema) {
                (Ok(mode), Some(schema)) => {
                    lock.events.insert(
                        event_type.clone(),
                        LockEntry {
                            mode,
                            schema: schema.clone(),
                        },
                    );
                }
                (Err(why), _) => errors.push(Error::schema(
                    path,
                    format!("{at}/mode"),
                    format!("{why}; {fix}"),
                )),
                (_, None) => errors.push(Error::schema(
                    path,
                    format!("{at}/schema"),
                    format!("the entry has no `schema` object; {fix}"),
                )),
            }
        }
        match Error::from_list(errors) {
            Some(e) => Err(e),
            None => Ok(lock),
        }
    }

    /// The lock file's text: pretty JSON with sorted keys and a final newline.
    pub fn to_text(&self) -> String {
        let mut events = Map::new();
        for (event_type, entry) in &self.events {
            let mut e = Map::new();
            e.insert("mode".into(), Value::String(entry.mode.to_string()));
            e.insert("schema".into(), normalize(&entry.schema));
            events.insert(event_type.clone(), Value::Object(e));
        }
        let mut doc = Map::new();
        doc.insert("about".into(), Value::String(ABOUT.into()));
        doc.insert("events".into(), Value::Object(events));
        doc.insert("version".into(), Value::from(LOCK_VERSION));
        let mut text = serde_json::to_string_pretty(&normalize(&Value::Object(doc)))
            .expect("a Value serializes");
        text.push('\n');
        text
    }
}

/// `schema` with the keys of every object sorted (the form the lock records). Arrays keep
/// their order: in `enum`, `required` or `allOf` it does not change what the schema accepts,
/// but it is what the author wrote.
///
/// ```
/// use serde_json::json;
///
/// let schema = json!({ "type": "object", "properties": { "b": {}, "a": {} } });
/// let text = serde_json::to_string(&outbox_codegen::evolution::normalize(&schema)).unwrap();
/// assert_eq!(text, r#"{"properties":{"a":{},"b":{}},"type":"object"}"#);
/// ```
pub fn normalize(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let mut sorted = Map::new();
            for key in keys {
                sorted.insert(key.clone(), normalize(&map[key]));
            }
            Value::Object(sorted)
        }
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        other => other.clone(),
    }
}

/// The lock file of a schema folder when none is set: beside the folder, named after it with
/// `.lock` (`schemas/events` has `schemas/events.lock`).
///
/// ```
/// use std::path::Path;
///
/// let lock = outbox_codegen::evolution::default_lock_file(Path::new("schemas/events/"));
/// assert_eq!(lock, Path::new("schemas/events.lock"));
/// ```
pub fn default_lock_file(dir: &Path) -> PathBuf {
    let named = |dir: &Path| {
        dir.file_name().map(|name| {
            let mut file = name.to_owned();
            file.push(".lock");
            dir.with_file_name(file)
        })
    };
    named(dir)
        .or_else(|| fs::canonicalize(dir).ok().and_then(|d| named(&d)))
        .unwrap_or_else(|| dir.join("events.lock"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_is_sorted_pretty_and_round_trips() {
        let mut lock = Lock::default();
        lock.events.insert(
            "b.x.created".into(),
            LockEntry {
                mode: Mode::Full,
                schema: json!({ "type": "object", "title": "Created", "enum": [3, 1] }),
            },
        );
        lock.events.insert(
            "a.x.created".into(),
            LockEntry {
                mode: Mode::Backward,
                schema: json!({ "title": "First", "type": "object" }),
            },
        );
        let text = lock.to_text();
        assert!(text.ends_with("}\n"));
        let a = text.find("\"a.x.created\"").unwrap();
        let b = text.find("\"b.x.created\"").unwrap();
        assert!(a < b);
        assert!(
            text.contains("\"enum\": [\n          3,\n          1\n        ],"),
            "arrays keep their order: {text}"
        );
        let again = Lock::parse(&text, Path::new("x.lock")).unwrap();
        assert_eq!(again, lock);
        assert_eq!(again.to_text(), text, "the same lock gives the same bytes");
    }

    #[test]
    fn bad_lock_files_say_where() {
        let cases = [
            ("{", "at the root: the lock file is not valid JSON"),
            (
                r#"{ "events": {} }"#,
                "at /version: the lock file has no `version`",
            ),
            (
                r#"{ "version": 9, "events": {} }"#,
                "lock file version 9 is not supported",
            ),
            (
                r#"{ "version": 1 }"#,
                "at /events: the lock file has no `events` object",
            ),
            (
                r#"{ "version": 1, "events": { "a.b.c": { "mode": "both", "schema": {} } } }"#,
                "at /events/a.b.c/mode: unknown compatibility mode `both`",
            ),
            (
                r#"{ "version": 1, "events": { "a.b.c": { "mode": "full" } } }"#,
                "at /events/a.b.c/schema: the entry has no `schema` object",
            ),
        ];
        for (text, says) in cases {
            let e = Lock::parse(text, Path::new("s.lock"))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("s.lock: "), "{e}");
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn missing_lock_is_none_and_default_paths() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Lock::read(&dir.path().join("none.lock")).unwrap(), None);
        assert_eq!(
            default_lock_file(Path::new("tests/schemas/v1")),
            Path::new("tests/schemas/v1.lock")
        );
        let here = default_lock_file(Path::new("."));
        assert!(
            here.to_string_lossy().ends_with(".lock"),
            "{}",
            here.display()
        );
    }
}
