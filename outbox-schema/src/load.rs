//! Loading one event schema ([`load_event`]) or a folder of them ([`load_dir`]): the steps in
//! order, each rule in its own module.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::draft::Draft;
use crate::error::{Error, Result};
use crate::resolve::{self, Origin};
use crate::{naming, read, rules, subject};

/// One event schema, loaded, checked and made self-contained.
#[derive(Debug, Clone, PartialEq)]
pub struct EventSchema {
    /// The schema file, as it was given to [`load_event`] (or found by [`load_dir`]).
    pub path: PathBuf,
    /// The event type, from the file name `<event_type>.schema.json`.
    pub event_type: String,
    /// The schema's `title`: the Rust type name of the event.
    pub title: String,
    /// The JSON property named by `x-outbox-subject`, if any (a required string, uuid or
    /// integer property). Without it, the envelope's subject is `platform`.
    pub subject: Option<String>,
    /// The schema made self-contained: every cross-file `$ref` inlined into the root `$defs`
    /// and rewritten to `#/$defs/<Name>`; local references are kept as written.
    pub resolved: Value,
    /// Every file read to build it: the schema first, then each referenced file once, in the
    /// order they were first referenced. Track these for `rerun-if-changed`.
    pub files: Vec<PathBuf>,
}

/// Loads the event schema at `path`, checks it and inlines its cross-file references.
///
/// `root` is the schema folder: relative references must stay under it. For a schema in
/// `schemas/events/`, `root` is `schemas/events` (the file's parent folder).
///
/// All problems found in the file are returned at once ([`Error::Many`] when there are several).
/// The uniqueness of `title` across schemas is checked by [`load_dir`], which sees them all.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// std::fs::create_dir(dir.path().join("defs"))?;
/// std::fs::write(
///     dir.path().join("defs/common.json"),
///     r#"{ "$defs": { "Money": { "type": "integer", "minimum": 0 } } }"#,
/// )?;
/// let path = dir.path().join("billing.invoice.paid.schema.json");
/// std::fs::write(
///     &path,
///     r#"{
///         "title": "InvoicePaid",
///         "type": "object",
///         "x-outbox-subject": "invoice_id",
///         "required": ["invoice_id", "amount"],
///         "properties": {
///             "invoice_id": { "type": "string", "format": "uuid" },
///             "amount": { "$ref": "defs/common.json#/$defs/Money" }
///         }
///     }"#,
/// )?;
///
/// let event = outbox_schema::load_event(&path, dir.path())?;
/// assert_eq!(event.event_type, "billing.invoice.paid");
/// assert_eq!(event.title, "InvoicePaid");
/// assert_eq!(event.subject.as_deref(), Some("invoice_id"));
/// assert_eq!(event.resolved["properties"]["amount"]["$ref"], "#/$defs/Money");
/// assert_eq!(event.resolved["$defs"]["Money"]["minimum"], 0);
/// assert_eq!(event.files.len(), 2);
/// # Ok(()) }
/// ```
pub fn load_event(path: &Path, root: &Path) -> Result<EventSchema> {
    let mut errors = Vec::new();
    let event_type = keep(rules::event_type_of(path), &mut errors);
    let doc = match read::read_json(path, path) {
        Ok(doc) => doc,
        Err(e @ Error::Io { .. }) => return Err(e),
        Err(e) => {
            errors.push(e);
            return Err(Error::from_list(errors).expect("one error at least"));
        }
    };
    let root_dir = read::canonical(root)?;
    let file = read::canonical(path)?;

    let draft = keep(
        Draft::of(&doc, Draft::Draft202012).map_err(|m| Error::schema(path, "/$schema", m)),
        &mut errors,
    );
    if let Some(draft) = draft {
        errors.extend(draft.validate(path, &doc));
    }
    if let Err(e) = rules::check_is_object(path, &doc) {
        errors.push(e);
        return Err(Error::from_list(errors).expect("one error at least"));
    }
    keep(rules::check_root_type(path, &doc), &mut errors);
    let title = keep(rules::title_of(path, &doc), &mut errors);

    let origin = Origin {
        file,
        shown: path.to_owned(),
        root_dir,
        draft: draft.unwrap_or(Draft::Draft202012),
    };
    let mut inlined = resolve::inline(origin, doc);
    errors.append(&mut inlined.errors);
    let subject = keep(subject::check_subject(path, &inlined.resolved), &mut errors).flatten();

    if let Some(e) = Error::from_list(errors) {
        return Err(e);
    }
    Ok(EventSchema {
        path: path.to_owned(),
        event_type: event_type.expect("no errors"),
        title: title.expect("no errors"),
        subject,
        resolved: inlined.resolved,
        files: inlined.files,
    })
}

/// The value of `result`, or `None` with its error added to `errors`: a file's checks go on
/// after a problem, so one run reports all of them.
fn keep<T>(result: Result<T>, errors: &mut Vec<Error>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(e) => {
            errors.push(e);
            None
        }
    }
}

/// Loads every `<event_type>.schema.json` file directly in `dir`, sorted by event type.
///
/// Every problem of every file is collected, and so are titles used by more than one schema;
/// when anything is wrong the result is the whole list ([`Error::Many`] when there are several).
/// A folder without event schemas is an error too. Other `.json` files (directly in `dir` or in
/// sub-folders) are shared definition files, read only when a schema refers to them.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// for (event_type, title) in [("a.b.created", "Created"), ("a.b.deleted", "Deleted")] {
///     std::fs::write(
///         dir.path().join(format!("{event_type}.schema.json")),
///         format!(r#"{{ "title": "{title}", "type": "object" }}"#),
///     )?;
/// }
/// let events = outbox_schema::load_dir(dir.path())?;
/// let types: Vec<_> = events.iter().map(|e| e.event_type.as_str()).collect();
/// assert_eq!(types, ["a.b.created", "a.b.deleted"]);
/// # Ok(()) }
/// ```
pub fn load_dir(dir: &Path) -> Result<Vec<EventSchema>> {
    let paths = schema_files(dir)?;
    if paths.is_empty() {
        return Err(Error::Config(format!(
            "{}: no event schemas found; add files named `<event_type>.schema.json` (like `billing.subscription.created.schema.json`) directly in this folder",
            dir.display()
        )));
    }
    let mut errors = Vec::new();
    let mut events: Vec<EventSchema> = Vec::new();
    for path in paths {
        match load_event(&path, dir) {
            Ok(event) => events.push(event),
            Err(e) => errors.push(e),
        }
    }
    events.sort_by(|a, b| a.event_type.cmp(&b.event_type));
    errors.extend(rules::check_unique_titles(&events));
    match Error::from_list(errors) {
        Some(e) => Err(e),
        None => Ok(events),
    }
}

/// The `<something>.schema.json` files directly in `dir`, sorted by file name. Their names are
/// checked by [`load_event`], not here.
pub fn schema_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let io = |source| Error::Io {
        path: dir.to_owned(),
        source,
    };
    let mut paths = Vec::new();
    for entry in fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let is_file = entry.file_type().map_err(io)?.is_file();
        let name = entry.file_name();
        if is_file
            && name
                .to_str()
                .is_some_and(|n| n.ends_with(naming::SCHEMA_SUFFIX))
        {
            paths.push(entry.path());
        }
    }
    paths.sort();
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::{event, messages, Folder};
    use serde_json::json;

    #[test]
    fn loads_a_plain_schema() {
        let f = Folder::new();
        let path = f.json(
            "a.b.created.schema.json",
            event(json!({ "x-outbox-subject": "id" })),
        );
        let e = f.load(&path).unwrap();
        assert_eq!(e.event_type, "a.b.created");
        assert_eq!(e.title, "Created");
        assert_eq!(e.subject.as_deref(), Some("id"));
        assert_eq!(e.files, vec![path.clone()]);
        assert_eq!(e.resolved, event(json!({ "x-outbox-subject": "id" })));
    }

    #[test]
    fn load_dir_sorts_collects_and_checks_titles() {
        let f = Folder::new();
        f.json("b.x.created.schema.json", event(json!({})));
        f.json(
            "a.x.created.schema.json",
            event(json!({ "title": "First" })),
        );
        f.json("a.x.dup.schema.json", event(json!({})));
        f.json("defs/common.json", json!({}));
        f.json("shared.json", json!({}));
        f.write("bad.x.y.schema.json", "nope");
        let list = messages(load_dir(f.0.path()).unwrap_err());
        assert_eq!(list.len(), 2, "{list:#?}");
        assert!(
            list[0].contains("bad.x.y.schema.json: at the root: not valid JSON"),
            "{list:#?}"
        );
        assert!(
            list[1].contains(
                "b.x.created.schema.json: at /title: the title `Created` is already used by"
            ),
            "{list:#?}"
        );
        assert!(list[1].contains("a.x.dup.schema.json"), "{list:#?}");

        fs::remove_file(f.0.path().join("bad.x.y.schema.json")).unwrap();
        fs::remove_file(f.0.path().join("b.x.created.schema.json")).unwrap();
        let events = load_dir(f.0.path()).unwrap();
        let types: Vec<_> = events.iter().map(|e| e.event_type.as_str()).collect();
        assert_eq!(types, ["a.x.created", "a.x.dup"]);

        let empty = Folder::new();
        let m = load_dir(empty.0.path()).unwrap_err().to_string();
        assert!(m.contains("no event schemas found"), "{m}");
    }
}
