//! Test helpers: a temporary schema folder and a small valid event schema to vary.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::load::{load_event, EventSchema};

/// A temporary schema folder.
pub(crate) struct Folder(pub(crate) tempfile::TempDir);

impl Folder {
    pub(crate) fn new() -> Self {
        Folder(tempfile::tempdir().unwrap())
    }

    pub(crate) fn path(&self) -> &Path {
        self.0.path()
    }

    pub(crate) fn write(&self, name: &str, value: &str) -> PathBuf {
        let path = self.0.path().join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, value).unwrap();
        path
    }

    pub(crate) fn json(&self, name: &str, value: Value) -> PathBuf {
        self.write(name, &serde_json::to_string_pretty(&value).unwrap())
    }

    /// [`load_event`] with this folder as the schema folder.
    pub(crate) fn load(&self, path: &Path) -> Result<EventSchema> {
        load_event(path, self.0.path())
    }
}

/// A valid event schema (`Created`, a required uuid `id`) with the top-level keys of `extra`
/// replaced.
pub(crate) fn event(extra: Value) -> Value {
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

/// Each single problem of `e`, displayed.
pub(crate) fn messages(e: Error) -> Vec<String> {
    e.into_list().iter().map(ToString::to_string).collect()
}

/// The only problem of `e`, displayed; fails the test when there are several.
pub(crate) fn one_message(e: Error) -> String {
    let list = messages(e);
    assert_eq!(list.len(), 1, "{list:#?}");
    list.into_iter().next().unwrap()
}
