//! `$ref` resolution: every reference of an event schema is checked, and the values it reaches
//! in other files are inlined into the root's `$defs`, so the schema is self-contained.
//!
//! A value reached in another file is named by the last token of its pointer (or, for a whole
//! file, by that file's `title`) and its `$ref` becomes `#/$defs/<Name>`. References inside the
//! inlined value are resolved the same way, relative to the file they were written in.
//! References into the event schema itself stay as written.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::draft::Draft;
use crate::error::{Error, Result};
use crate::pointer::{encode_pointer, encode_token, escape_token, percent_decode, unescape_token};
use crate::read::{self, normalize};
use crate::reference::{is_data_keyword, split_reference};

/// The event schema being resolved.
pub(crate) struct Origin {
    /// Its canonical path.
    pub(crate) file: PathBuf,
    /// Its path as messages show it.
    pub(crate) shown: PathBuf,
    /// The canonical schema folder, which references must not leave.
    pub(crate) root_dir: PathBuf,
    /// Its draft, also the draft of definition files that declare none.
    pub(crate) draft: Draft,
}

/// The outcome of [`inline`].
pub(crate) struct Inlined {
    /// The schema with every cross-file value inlined and its `$ref`s rewritten.
    pub(crate) resolved: Value,
    /// The event schema, then every definition file read, in the order first referenced.
    pub(crate) files: Vec<PathBuf>,
    /// Every reference that does not resolve, and every definition file that is not usable.
    pub(crate) errors: Vec<Error>,
}

/// Resolves every `$ref` of `doc`, the event schema at `origin`, which must be an object.
pub(crate) fn inline(origin: Origin, doc: Value) -> Inlined {
    let mut resolver = Resolver {
        local_defs: local_def_names(&doc),
        docs: HashMap::new(),
        files: vec![origin.shown.clone()],
        defs: BTreeMap::new(),
        errors: Vec::new(),
        origin,
    };
    let root_file = resolver.origin.file.clone();
    resolver.docs.insert(
        root_file.clone(),
        Doc {
            display: resolver.origin.shown.clone(),
            value: doc.clone(),
        },
    );
    let mut resolved = doc;
    resolver.rewrite(&mut resolved, &root_file, String::new());
    if !resolver.defs.is_empty() {
        let root = resolved
            .as_object_mut()
            .expect("an event schema is an object");
        let defs = root
            .entry("$defs")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(defs) = defs {
            for (name, def) in std::mem::take(&mut resolver.defs) {
                defs.insert(name, def.value);
            }
        }
    }
    Inlined {
        resolved,
        files: resolver.files,
        errors: resolver.errors,
    }
}

/// The root's own definitions (`$defs` first, then `definitions`): name -> pointer.
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

/// A document read so far, by canonical path.
struct Doc {
    display: PathBuf,
    value: Value,
}

/// A value inlined into the root's `$defs`.
struct Def {
    /// Where it was found: the canonical file and the pointer in it.
    file: PathBuf,
    pointer: String,
    /// The value as written, to tell a second reference to the same value from a clash.
    source: Value,
    /// The value with its own references rewritten.
    value: Value,
}

struct Resolver {
    origin: Origin,
    docs: HashMap<PathBuf, Doc>,
    files: Vec<PathBuf>,
    /// Inlined definitions by name.
    defs: BTreeMap<String, Def>,
    /// The root's own `$defs` / `definitions`: name -> pointer.
    local_defs: BTreeMap<String, String>,
    errors: Vec<Error>,
}

/// Where a `$ref` is written: its document (canonical), as messages show it, and the pointer
/// of the `$ref` in it.
struct Site<'a> {
    doc: &'a Path,
    shown: PathBuf,
    at: &'a str,
}

impl Site<'_> {
    fn error(&self, message: String) -> Error {
        Error::schema(&self.shown, self.at, message)
    }
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
        let site = Site {
            doc,
            shown: self.display(doc),
            at,
        };
        match self.try_resolve(reference, &site) {
            Ok(new) => Some(new),
            Err(e) => {
                self.errors.push(e);
                None
            }
        }
    }

    fn try_resolve(&mut self, reference: &str, site: &Site<'_>) -> Result<String> {
        let (file_part, pointer) = split_reference(reference).map_err(|m| site.error(m))?;
        let target = if file_part.is_empty() {
            site.doc.to_owned()
        } else {
            self.target_file(file_part, site)?
        };
        let target_doc = &self.docs[&target];
        let Some(found) = target_doc.value.pointer(&pointer).cloned() else {
            return Err(site.error(format!(
                "`$ref` `{reference}` points to nothing: {} has no value at `{pointer}`; fix the pointer or add the definition",
                target_doc.display.display()
            )));
        };
        if target == self.origin.file {
            // A reference into the event schema itself stays local.
            return Ok(format!("#{}", encode_pointer(&pointer)));
        }
        let name = self
            .def_name(reference, &target, &pointer, &found)
            .map_err(|m| site.error(m))?;
        if let Some(local) = self.local_defs.get(&name) {
            return self
                .reuse_local(&name, local, &target, &pointer, &found)
                .map_err(|m| site.error(m));
        }
        if let Some(existing) = self.defs.get(&name) {
            if existing.file == target && existing.pointer == pointer || existing.source == found {
                return Ok(format!("#/$defs/{}", encode_token(&name)));
            }
            return Err(site.error(format!(
                "two different definitions are named `{name}`: `{}` in {} and `{pointer}` in {}; rename one of them",
                existing.pointer,
                self.display(&existing.file).display(),
                self.display(&target).display()
            )));
        }
        self.inline_def(&name, target, pointer, found);
        Ok(format!("#/$defs/{}", encode_token(&name)))
    }

    /// The canonical path of the file `file_part` (relative to the site's document), read
    /// when it is referred to for the first time.
    fn target_file(&mut self, file_part: &str, site: &Site<'_>) -> Result<PathBuf> {
        let relative = percent_decode(file_part);
        let joined = site.doc.parent().unwrap_or(Path::new("")).join(&relative);
        let shown = normalize(&site.shown.parent().unwrap_or(Path::new("")).join(&relative));
        let Ok(target) = fs::canonicalize(&joined) else {
            return Err(site.error(format!(
                "`$ref` points to `{relative}`, which does not exist (looked for {}); fix the path, which is relative to this file",
                shown.display()
            )));
        };
        if !target.starts_with(&self.origin.root_dir) {
            return Err(site.error(format!(
                "`$ref` points to {}, outside the schema folder {}; move the definition into a file under the schema folder",
                shown.display(),
                self.origin.root_dir.display()
            )));
        }
        if !self.docs.contains_key(&target) {
            self.read_doc(&target, &shown)?;
        }
        Ok(target)
    }

    /// The name a value from another file gets in the root's `$defs`: the last token of its
    /// pointer, or the `title` of a whole file.
    fn def_name(
        &self,
        reference: &str,
        target: &Path,
        pointer: &str,
        found: &Value,
    ) -> Result<String, String> {
        if !pointer.is_empty() {
            let last = pointer.rsplit('/').next().unwrap_or_default();
            return Ok(unescape_token(last));
        }
        match found.get("title").and_then(Value::as_str) {
            Some(title) => Ok(title.to_owned()),
            None => Err(format!(
                "`$ref` `{reference}` names the whole file {}, which has no `title` to name its type; add a `title` to that file or refer to one of its definitions (`#/$defs/Name`)",
                self.docs[target].display.display()
            )),
        }
    }

    /// A value from another file whose name the root already defines (at `local`): the
    /// root's definition when it is the same value, else a clash.
    fn reuse_local(
        &self,
        name: &str,
        local: &str,
        target: &Path,
        pointer: &str,
        found: &Value,
    ) -> Result<String, String> {
        let root_doc = &self.docs[&self.origin.file].value;
        if root_doc.pointer(local) == Some(found) {
            return Ok(format!("#{}", encode_pointer(local)));
        }
        Err(format!(
            "two different definitions are named `{name}`: `{local}` in {} and `{pointer}` in {}; rename one of them",
            self.origin.shown.display(),
            self.docs[target].display.display()
        ))
    }

    /// Adds `found` (at `pointer` in `target`) to the root's `$defs` as `name`, with its own
    /// references resolved.
    fn inline_def(&mut self, name: &str, target: PathBuf, pointer: String, found: Value) {
        // Registered before its references are resolved, so a reference back to it (a
        // recursive type) finds it instead of inlining it again, forever.
        self.defs.insert(
            name.to_owned(),
            Def {
                file: target.clone(),
                pointer: pointer.clone(),
                source: found.clone(),
                value: Value::Null,
            },
        );
        let mut value = found;
        self.rewrite(&mut value, &target, pointer);
        if let Some(def) = self.defs.get_mut(name) {
            def.value = value;
        }
    }

    /// Reads a definition file; it must be JSON and valid under its draft (the event
    /// schema's when it declares none).
    fn read_doc(&mut self, target: &Path, shown: &Path) -> Result<()> {
        let value = read::read_json(target, shown)?;
        self.files.push(shown.to_owned());
        let draft = Draft::of(&value, self.origin.draft)
            .map_err(|m| Error::schema(shown, "/$schema", m))?;
        if let Some(e) = Error::from_list(draft.validate(shown, &value)) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::{event, one_message, Folder};
    use serde_json::json;

    #[test]
    fn local_definitions_prefer_defs() {
        let doc = json!({
            "$defs": { "A": {}, "B/C": {} },
            "definitions": { "A": {}, "D": {} }
        });
        let names = local_def_names(&doc);
        assert_eq!(names["A"], "/$defs/A");
        assert_eq!(names["B/C"], "/$defs/B~1C");
        assert_eq!(names["D"], "/definitions/D");
    }

    #[test]
    fn data_is_not_resolved() {
        let f = Folder::new();
        let path = f.json(
            "a.b.created.schema.json",
            event(json!({ "properties": {
                "id": { "type": "string" },
                "p": { "const": { "$ref": "nowhere.json" }, "examples": [{ "$ref": "#/x" }] }
            } })),
        );
        let r = f.load(&path).unwrap().resolved;
        assert_eq!(r["properties"]["p"]["const"]["$ref"], "nowhere.json");
        assert_eq!(r["properties"]["p"]["examples"][0]["$ref"], "#/x");
    }

    #[test]
    fn recursive_definitions_are_inlined_once() {
        let f = Folder::new();
        f.json(
            "defs/tree.json",
            json!({ "$defs": { "Node": {
                "type": "object",
                "properties": { "children": { "type": "array", "items": { "$ref": "#/$defs/Node" } } }
            } } }),
        );
        let path = f.json(
            "a.b.created.schema.json",
            event(json!({ "properties": {
                "id": { "type": "string" },
                "root": { "$ref": "defs/tree.json#/$defs/Node" }
            } })),
        );
        let e = f.load(&path).unwrap();
        let r = &e.resolved;
        assert_eq!(r["properties"]["root"]["$ref"], "#/$defs/Node");
        assert_eq!(
            r["$defs"]["Node"]["properties"]["children"]["items"]["$ref"],
            "#/$defs/Node"
        );
        assert_eq!(r["$defs"].as_object().unwrap().len(), 1);
        assert_eq!(e.files.len(), 2);
    }

    #[test]
    fn whole_file_without_title() {
        let f = Folder::new();
        f.json("defs/address.json", json!({ "type": "object" }));
        let path = f.json(
            "a.b.created.schema.json",
            event(json!({ "properties": { "id": { "type": "string" }, "to": { "$ref": "defs/address.json" } } })),
        );
        let m = one_message(f.load(&path).unwrap_err());
        assert!(
            m.contains("at /properties/to/$ref: `$ref` `defs/address.json` names the whole file"),
            "{m}"
        );
        assert!(m.contains("which has no `title`"), "{m}");
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
}
