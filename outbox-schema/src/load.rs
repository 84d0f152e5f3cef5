//! Loading one event schema ([`load_event`]) or a folder of them ([`load_dir`]).

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Component, Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::naming;
use crate::pointer::{encode_pointer, encode_token, escape_token, percent_decode, unescape_token};

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

/// The JSON Schema drafts accepted in `$schema`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Draft {
    Draft7,
    Draft202012,
}

impl Draft {
    fn of(doc: &Value, default: Draft) -> std::result::Result<Draft, String> {
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

    let event_type = match event_type_of(path) {
        Ok(event_type) => Some(event_type),
        Err(e) => {
            errors.push(e);
            None
        }
    };

    let text = fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })?;
    let doc = match parse_json(path, &text) {
        Ok(doc) => doc,
        Err(e) => {
            errors.push(e);
            return Err(Error::from_list(errors).expect("one error at least"));
        }
    };
    let root_canon = canonical(root)?;
    let file_canon = canonical(path)?;

    let draft = match Draft::of(&doc, Draft::Draft202012) {
        Ok(draft) => Some(draft),
        Err(message) => {
            errors.push(Error::schema(path, "/$schema", message));
            None
        }
    };
    if let Some(draft) = draft {
        errors.extend(meta_validate(path, &doc, draft));
    }

    if !doc.is_object() {
        errors.push(Error::schema(
            path,
            "",
            "an event schema must be a JSON object with `\"type\": \"object\"`",
        ));
        return Err(Error::from_list(errors).expect("one error at least"));
    }

    match doc.get("type") {
        Some(Value::String(t)) if t == "object" => {}
        Some(other) => errors.push(Error::schema(
            path,
            "/type",
            format!("the root schema has type {other}; an event payload is a JSON object: set `\"type\": \"object\"`"),
        )),
        None => errors.push(Error::schema(
            path,
            "",
            "the root schema has no `type`; an event payload is a JSON object: add `\"type\": \"object\"`",
        )),
    }

    let title = match doc.get("title") {
        Some(Value::String(title)) => match naming::check_type_name(title) {
            Ok(()) => Some(title.clone()),
            Err(why) => {
                errors.push(Error::schema(
                    path,
                    "/title",
                    format!("`title` is the Rust type name of the event, and `{title}` is not one: {why}"),
                ));
                None
            }
        },
        Some(other) => {
            errors.push(Error::schema(
                path,
                "/title",
                format!("`title` must be a string (the Rust type name of the event, like \"SubscriptionCreated\"), found {other}"),
            ));
            None
        }
        None => {
            errors.push(Error::schema(
                path,
                "",
                "the schema has no `title`; add one: it is the Rust type name of the event, like \"SubscriptionCreated\"",
            ));
            None
        }
    };

    let mut resolver = Resolver {
        root_dir: root_canon,
        root_file: file_canon.clone(),
        root_display: path.to_owned(),
        docs: HashMap::new(),
        files: vec![path.to_owned()],
        defs: BTreeMap::new(),
        local_defs: local_def_names(&doc),
        errors: Vec::new(),
        draft: draft.unwrap_or(Draft::Draft202012),
    };
    resolver.docs.insert(
        file_canon.clone(),
        Doc {
            display: path.to_owned(),
            value: doc.clone(),
        },
    );
    let mut resolved = doc;
    resolver.rewrite(&mut resolved, &file_canon, String::new());
    errors.append(&mut resolver.errors);
    if !resolver.defs.is_empty() {
        let root = resolved.as_object_mut().expect("checked above");
        let defs = root
            .entry("$defs")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(defs) = defs {
            for (name, def) in std::mem::take(&mut resolver.defs) {
                defs.insert(name, def.value);
            }
        }
    }

    let subject = match check_subject(path, &resolved) {
        Ok(subject) => subject,
        Err(e) => {
            errors.push(e);
            None
        }
    };

    if let Some(e) = Error::from_list(errors) {
        return Err(e);
    }
    Ok(EventSchema {
        path: path.to_owned(),
        event_type: event_type.expect("no errors"),
        title: title.expect("no errors"),
        subject,
        resolved,
        files: resolver.files,
    })
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
    let mut titles: HashMap<&str, &EventSchema> = HashMap::new();
    for event in &events {
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

fn event_type_of(path: &Path) -> Result<String> {
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

fn parse_json(path: &Path, text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| {
        Error::schema(
            path,
            "",
            format!(
                "not valid JSON: {} at line {}, column {}; fix the syntax",
                strip_position(&e),
                e.line(),
                e.column()
            ),
        )
    })
}

/// serde_json's message without its own " at line x column y" suffix.
fn strip_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(i) => text[..i].to_owned(),
        None => text,
    }
}

fn canonical(path: &Path) -> Result<PathBuf> {
    fs::canonicalize(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })
}

fn meta_validate(path: &Path, doc: &Value, draft: Draft) -> Vec<Error> {
    let validator = match draft {
        Draft::Draft7 => jsonschema::draft7::meta::validator(),
        Draft::Draft202012 => jsonschema::draft202012::meta::validator(),
    };
    let mut seen = std::collections::HashSet::new();
    validator
        .iter_errors(doc)
        .filter_map(|e| {
            let pointer = e.instance_path().to_string();
            let message = format!(
                "not a valid JSON Schema ({}): {e}; fix the value so it matches the JSON Schema specification",
                draft.name()
            );
            seen.insert((pointer.clone(), message.clone()))
                .then(|| Error::schema(path, pointer, message))
        })
        .collect()
}

fn local_def_names(doc: &Value) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for keyword in ["$defs", "definitions"] {
        if let Some(Value::Object(defs)) = doc.get(keyword) {
            for name in defs.keys() {
                names
                    .entry(name.clone())
                    .or_insert_with(|| format!("/{keyword}/{}", escape_token(name)));
            }
        }
    }
    names
}

/// Checks `x-outbox-subject` against the resolved schema.
fn check_subject(path: &Path, resolved: &Value) -> Result<Option<String>> {
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

struct Doc {
    display: PathBuf,
    value: Value,
}

struct Def {
    file: PathBuf,
    pointer: String,
    source: Value,
    value: Value,
}

struct Resolver {
    root_dir: PathBuf,
    root_file: PathBuf,
    root_display: PathBuf,
    docs: HashMap<PathBuf, Doc>,
    files: Vec<PathBuf>,
    /// Inlined definitions by name.
    defs: BTreeMap<String, Def>,
    /// The root's own `$defs` / `definitions`: name -> pointer.
    local_defs: BTreeMap<String, String>,
    errors: Vec<Error>,
    draft: Draft,
}

impl Resolver {
    /// Rewrites every `$ref` in `value`, which sits at `at` in the document `doc`.
    fn rewrite(&mut self, value: &mut Value, doc: &Path, at: String) {
        match value {
            Value::Object(map) => {
                for (key, child) in map.iter_mut() {
                    let child_at = format!("{at}/{}", escape_token(key));
                    if key == "$ref" {
                        if let Value::String(reference) = child {
                            if let Some(new) = self.resolve(reference, doc, &child_at) {
                                *reference = new;
                            }
                        }
                    } else if !is_data_keyword(key) {
                        self.rewrite(child, doc, child_at);
                    }
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter_mut().enumerate() {
                    self.rewrite(child, doc, format!("{at}/{i}"));
                }
            }
            _ => {}
        }
    }

    fn display(&self, doc: &Path) -> PathBuf {
        self.docs
            .get(doc)
            .map_or_else(|| doc.to_owned(), |d| d.display.clone())
    }

    /// The new text of `reference`, written at `at` in `doc`; `None` (and an error recorded)
    /// when it does not resolve.
    fn resolve(&mut self, reference: &str, doc: &Path, at: &str) -> Option<String> {
        let display = self.display(doc);
        let fail = |this: &mut Self, message: String| {
            this.errors.push(Error::schema(&display, at, message));
            None
        };
        if has_scheme(reference) {
            return fail(
                self,
                format!(
                    "remote reference `{reference}` is not supported; copy the definition into a `.json` file under the schema folder and refer to it by relative path (like `defs/common.json#/$defs/Name`)"
                ),
            );
        }
        let (file_part, fragment) = match reference.split_once('#') {
            Some((file, fragment)) => (file, fragment),
            None => (reference, ""),
        };
        let pointer = percent_decode(fragment);
        if !pointer.is_empty() && !pointer.starts_with('/') {
            return fail(
                self,
                format!(
                    "`$ref` fragment `#{fragment}` is an anchor; use a JSON pointer like `#/$defs/Name`"
                ),
            );
        }

        // The target document.
        let target = if file_part.is_empty() {
            doc.to_owned()
        } else {
            let relative = percent_decode(file_part);
            let joined = doc.parent().unwrap_or(Path::new("")).join(&relative);
            let shown = normalize(&display.parent().unwrap_or(Path::new("")).join(&relative));
            let Ok(target) = fs::canonicalize(&joined) else {
                return fail(
                    self,
                    format!(
                        "`$ref` points to `{relative}`, which does not exist (looked for {}); fix the path, which is relative to this file",
                        shown.display()
                    ),
                );
            };
            if !target.starts_with(&self.root_dir) {
                return fail(
                    self,
                    format!(
                        "`$ref` points to {}, outside the schema folder {}; move the definition into a file under the schema folder",
                        shown.display(),
                        self.root_dir.display()
                    ),
                );
            }
            if !self.docs.contains_key(&target) {
                match self.read_doc(&target, &shown) {
                    Ok(()) => {}
                    Err(e) => {
                        self.errors.push(e);
                        return None;
                    }
                }
            }
            target
        };

        let target_doc = &self.docs[&target];
        let Some(found) = target_doc.value.pointer(&pointer).cloned() else {
            let target_display = target_doc.display.clone();
            return fail(
                self,
                format!(
                    "`$ref` `{reference}` points to nothing: {} has no value at `{pointer}`; fix the pointer or add the definition",
                    target_display.display()
                ),
            );
        };

        if target == self.root_file {
            // A reference into the event schema itself stays local.
            return Some(format!("#{}", encode_pointer(&pointer)));
        }

        // A value in another file: inline it into the root `$defs`.
        let name = if pointer.is_empty() {
            match found.get("title").and_then(Value::as_str) {
                Some(title) => title.to_owned(),
                None => {
                    let shown = self.docs[&target].display.clone();
                    return fail(
                        self,
                        format!(
                            "`$ref` `{reference}` names the whole file {}, which has no `title` to name its type; add a `title` to that file or refer to one of its definitions (`#/$defs/Name`)",
                            shown.display()
                        ),
                    );
                }
            }
        } else {
            let last = pointer.rsplit('/').next().unwrap_or_default();
            unescape_token(last)
        };

        if let Some(local) = self.local_defs.get(&name) {
            let root_doc = &self.docs[&self.root_file].value;
            if root_doc.pointer(local) == Some(&found) {
                return Some(format!("#{}", encode_pointer(local)));
            }
            let (target_display, root_display) = (
                self.docs[&target].display.clone(),
                self.root_display.clone(),
            );
            return fail(
                self,
                format!(
                    "two different definitions are named `{name}`: `{local}` in {} and `{pointer}` in {}; rename one of them",
                    root_display.display(),
                    target_display.display()
                ),
            );
        }
        if let Some(existing) = self.defs.get(&name) {
            if existing.file == target && existing.pointer == pointer || existing.source == found {
                return Some(format!("#/$defs/{}", encode_token(&name)));
            }
            let message = format!(
                "two different definitions are named `{name}`: `{}` in {} and `{pointer}` in {}; rename one of them",
                existing.pointer,
                self.display(&existing.file).display(),
                self.display(&target).display()
            );
            return fail(self, message);
        }

        self.defs.insert(
            name.clone(),
            Def {
                file: target.clone(),
                pointer: pointer.clone(),
                source: found.clone(),
                value: Value::Null,
            },
        );
        let mut value = found;
        self.rewrite(&mut value, &target, pointer);
        if let Some(def) = self.defs.get_mut(&name) {
            def.value = value;
        }
        Some(format!("#/$defs/{}", encode_token(&name)))
    }

    fn read_doc(&mut self, target: &Path, shown: &Path) -> Result<()> {
        let text = fs::read_to_string(target).map_err(|source| Error::Io {
            path: shown.to_owned(),
            source,
        })?;
        let value = parse_json(shown, &text)?;
        self.files.push(shown.to_owned());
        let draft =
            Draft::of(&value, self.draft).map_err(|m| Error::schema(shown, "/$schema", m))?;
        if let Some(e) = Error::from_list(meta_validate(shown, &value, draft)) {
            return Err(e);
        }
        self.docs.insert(
            target.to_owned(),
            Doc {
                display: shown.to_owned(),
                value,
            },
        );
        Ok(())
    }
}

/// Keywords whose values are data, not schemas: a `$ref` key inside them is not a reference.
fn is_data_keyword(key: &str) -> bool {
    matches!(key, "enum" | "const" | "default" | "examples")
}

fn has_scheme(reference: &str) -> bool {
    match reference.split_once(':') {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && !scheme.contains(['/', '#', '?'])
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        }
        None => false,
    }
}

/// Lexically removes `.` and `..` components (for display: no file system access).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if matches!(out.components().next_back(), Some(Component::Normal(_))) {
                    out.pop();
                } else {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Folder(tempfile::TempDir);

    impl Folder {
        fn new() -> Self {
            Folder(tempfile::tempdir().unwrap())
        }
        fn write(&self, name: &str, value: &str) -> PathBuf {
            let path = self.0.path().join(name);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(&path, value).unwrap();
            path
        }
        fn json(&self, name: &str, value: Value) -> PathBuf {
            self.write(name, &serde_json::to_string_pretty(&value).unwrap())
        }
        fn load(&self, path: &Path) -> Result<EventSchema> {
            load_event(path, self.0.path())
        }
    }

    fn event(extra: Value) -> Value {
        let mut base = json!({
            "title": "Created",
            "type": "object",
            "required": ["id"],
            "properties": { "id": { "type": "string", "format": "uuid" } }
        });
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        base
    }

    fn messages(e: Error) -> Vec<String> {
        e.into_list().iter().map(ToString::to_string).collect()
    }

    fn one_message(e: Error) -> String {
        let list = messages(e);
        assert_eq!(list.len(), 1, "{list:#?}");
        list.into_iter().next().unwrap()
    }

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
    fn malformed_json() {
        let f = Folder::new();
        let path = f.write(
            "a.b.created.schema.json",
            "{ \"title\": \"X\",\n  \"type\": }",
        );
        let m = one_message(f.load(&path).unwrap_err());
        assert!(
            m.contains("a.b.created.schema.json: at the root: not valid JSON"),
            "{m}"
        );
        assert!(m.contains("line 2, column"), "{m}");
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

    #[test]
    fn inlines_cross_file_refs() {
        let f = Folder::new();
        f.json(
            "defs/common.json",
            json!({
                "$defs": {
                    "Money": {
                        "type": "object",
                        "properties": { "currency": { "$ref": "#/$defs/Currency" }, "cents": { "type": "integer" } }
                    },
                    "Currency": { "$ref": "currency.json" }
                }
            }),
        );
        f.json(
            "defs/currency.json",
            json!({ "title": "CurrencyCode", "type": "string", "enum": ["eur", "usd"] }),
        );
        let path = f.json(
            "a.b.created.schema.json",
            event(json!({
                "properties": {
                    "id": { "type": "string" },
                    "price": { "$ref": "defs/common.json#/$defs/Money" },
                    "again": { "$ref": "./defs/../defs/common.json#/$defs/Money" },
                    "local": { "$ref": "#/$defs/Local" }
                },
                "$defs": { "Local": { "type": "boolean" } }
            })),
        );
        let e = f.load(&path).unwrap();
        let r = &e.resolved;
        assert_eq!(r["properties"]["price"]["$ref"], "#/$defs/Money");
        assert_eq!(r["properties"]["again"]["$ref"], "#/$defs/Money");
        assert_eq!(r["properties"]["local"]["$ref"], "#/$defs/Local");
        assert_eq!(
            r["$defs"]["Money"]["properties"]["currency"]["$ref"],
            "#/$defs/Currency"
        );
        assert_eq!(
            r["$defs"]["Currency"]["$ref"], "#/$defs/CurrencyCode",
            "{r:#}"
        );
        assert_eq!(r["$defs"]["CurrencyCode"]["enum"], json!(["eur", "usd"]));
        assert_eq!(r["$defs"]["Local"]["type"], "boolean");
        let names: Vec<_> = e
            .files
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["a.b.created.schema.json", "common.json", "currency.json"]
        );
    }

    #[test]
    fn whole_file_ref_is_named_by_its_title() {
        let f = Folder::new();
        f.json("defs/address.json", json!({ "title": "Address", "type": "object", "properties": { "city": { "type": "string" } } }));
        let path = f.json(
            "a.b.created.schema.json",
            event(json!({ "properties": { "id": { "type": "string" }, "to": { "$ref": "defs/address.json" } } })),
        );
        let r = f.load(&path).unwrap().resolved;
        assert_eq!(r["properties"]["to"]["$ref"], "#/$defs/Address");
        assert_eq!(
            r["$defs"]["Address"]["properties"]["city"]["type"],
            "string"
        );
    }

    #[test]
    fn unresolvable_refs() {
        let f = Folder::new();
        f.json(
            "defs/common.json",
            json!({ "$defs": { "Money": { "type": "integer" } } }),
        );
        f.json(
            "defs/other.json",
            json!({ "$defs": { "Money": { "type": "string" } } }),
        );
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("x.json"), "{}").unwrap();
        let escape = format!(
            "../{}/x.json",
            outside.path().file_name().unwrap().to_str().unwrap()
        );
        let cases = [
            (
                json!({ "$ref": "defs/missing.json#/$defs/X" }),
                "/properties/p/$ref: `$ref` points to `defs/missing.json`, which does not exist",
            ),
            (
                json!({ "$ref": "defs/common.json#/$defs/Nope" }),
                "has no value at `/$defs/Nope`",
            ),
            (
                json!({ "$ref": "#/$defs/Nope" }),
                "has no value at `/$defs/Nope`",
            ),
            (
                json!({ "$ref": "https://example.com/s.json" }),
                "remote reference `https://example.com/s.json` is not supported",
            ),
            (json!({ "$ref": escape }), "outside the schema folder"),
            (json!({ "$ref": "#anchor" }), "is an anchor"),
        ];
        for (i, (prop, says)) in cases.into_iter().enumerate() {
            let path = f.json(
                &format!("a.b.c{i}.schema.json"),
                event(json!({ "properties": { "id": { "type": "string" }, "p": prop } })),
            );
            let m = one_message(f.load(&path).unwrap_err());
            assert!(m.contains(says), "{m}");
            assert!(m.contains(&format!("a.b.c{i}.schema.json")), "{m}");
        }
    }

    #[test]
    fn two_definitions_under_one_name() {
        let f = Folder::new();
        f.json(
            "defs/common.json",
            json!({ "$defs": { "Money": { "type": "integer" } } }),
        );
        f.json(
            "defs/other.json",
            json!({ "$defs": { "Money": { "type": "string" } } }),
        );
        let path = f.json(
            "a.b.created.schema.json",
            event(json!({ "properties": {
                "id": { "type": "string" },
                "a": { "$ref": "defs/common.json#/$defs/Money" },
                "b": { "$ref": "defs/other.json#/$defs/Money" }
            } })),
        );
        let m = one_message(f.load(&path).unwrap_err());
        assert!(
            m.contains("at /properties/b/$ref: two different definitions are named `Money`"),
            "{m}"
        );

        let path = f.json(
            "a.b.local.schema.json",
            event(json!({
                "properties": { "id": { "type": "string" }, "a": { "$ref": "defs/common.json#/$defs/Money" } },
                "$defs": { "Money": { "type": "number" } }
            })),
        );
        let m = one_message(f.load(&path).unwrap_err());
        assert!(
            m.contains("two different definitions are named `Money`: `/$defs/Money`"),
            "{m}"
        );
    }

    #[test]
    fn invalid_definition_file() {
        let f = Folder::new();
        f.write("defs/common.json", "{ \"$defs\": ");
        let path = f.json(
            "a.b.created.schema.json",
            event(json!({ "properties": { "id": { "type": "string" }, "a": { "$ref": "defs/common.json#/$defs/Money" } } })),
        );
        let m = one_message(f.load(&path).unwrap_err());
        assert!(
            m.contains("common.json: at the root: not valid JSON"),
            "{m}"
        );
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

    #[test]
    fn pointer_helpers() {
        assert_eq!(percent_decode("/$defs/A%20B"), "/$defs/A B");
        assert_eq!(percent_decode("%"), "%");
        assert_eq!(encode_token("a/b c"), "a~1b%20c");
        assert!(has_scheme("https://x"));
        assert!(has_scheme("urn:x"));
        assert!(!has_scheme("defs/a.json#/x:y"));
        assert_eq!(
            normalize(Path::new("a/./b/../c.json")),
            PathBuf::from("a/c.json")
        );
    }
}
