//! Reading schema files: their JSON (a syntax error names its line and column), their canonical
//! path (which identifies a file) and the path messages show (normalized, not resolved).

use std::fs;
use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};

/// The JSON document in the file at `path`; errors name the file as `shown`.
pub(crate) fn read_json(path: &Path, shown: &Path) -> Result<Value> {
    let text = fs::read_to_string(path).map_err(|source| Error::Io {
        path: shown.to_owned(),
        source,
    })?;
    parse_json(shown, &text)
}

/// `text` as JSON; a syntax error is an [`Error::Schema`] at the root of `path`.
pub(crate) fn parse_json(path: &Path, text: &str) -> Result<Value> {
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

/// The canonical form of `path`, which must exist.
pub(crate) fn canonical(path: &Path) -> Result<PathBuf> {
    fs::canonicalize(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })
}

/// Lexically removes `.` and `..` components (for display: no file system access).
pub(crate) fn normalize(path: &Path) -> PathBuf {
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
    use crate::fixture::{one_message, Folder};

    #[test]
    fn syntax_errors_name_line_and_column_once() {
        let m = parse_json(Path::new("x.json"), "{\n  \"a\": }")
            .unwrap_err()
            .to_string();
        assert_eq!(
            m,
            "x.json: at the root: not valid JSON: expected value at line 2, column 8; fix the syntax"
        );
    }

    #[test]
    fn missing_files_are_io_errors_under_the_shown_name() {
        let f = Folder::new();
        let err = read_json(&f.path().join("nope.json"), Path::new("defs/nope.json")).unwrap_err();
        assert!(
            matches!(err, Error::Io { ref path, .. } if path == Path::new("defs/nope.json")),
            "{err:?}"
        );
        assert!(canonical(&f.path().join("nope")).is_err());
    }

    #[test]
    fn paths_normalize_for_display() {
        assert_eq!(
            normalize(Path::new("a/./b/../c.json")),
            PathBuf::from("a/c.json")
        );
        assert_eq!(
            normalize(Path::new("../a/../../b")),
            PathBuf::from("../../b")
        );
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
}
