//! Finding and loading the event's schema at compile time.

use std::path::{Path, PathBuf};

use outbox_schema::{load_event, EventSchema};
use syn::LitStr;

use crate::attr::Attrs;
use crate::ctxt::Ctxt;

/// The loaded schema, with the path as messages show it.
pub(crate) struct Loaded {
    pub(crate) schema: EventSchema,
    /// Relative to the crate when the file is inside it, absolute otherwise.
    pub(crate) shown: String,
    /// Every file the schema was built from, absolute, for `include_bytes!` tracking.
    pub(crate) files: Vec<PathBuf>,
}

/// Where the schema of `event_type` is: `schema = ".."` (relative to `CARGO_MANIFEST_DIR`, or
/// absolute), else `CARGO_MANIFEST_DIR/schemas/events/<event_type>.schema.json`.
pub(crate) fn locate(manifest_dir: &Path, event_type: &str, schema: Option<&str>) -> PathBuf {
    match schema {
        Some(path) if Path::new(path).is_absolute() => PathBuf::from(path),
        Some(path) => manifest_dir.join(path),
        None => manifest_dir
            .join("schemas")
            .join("events")
            .join(outbox_schema::naming::schema_file_name(event_type)),
    }
}

fn shown(manifest_dir: &Path, path: &Path) -> String {
    path.strip_prefix(manifest_dir)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Loads the schema for the struct's `event_type`. Errors are spanned on the `schema` literal
/// when it is given, else on the `event_type` literal.
pub(crate) fn load(cx: &Ctxt, attrs: &Attrs, event_type: &LitStr) -> Option<Loaded> {
    let span_lit = attrs.schema.as_ref().unwrap_or(event_type);
    let Some(manifest_dir) = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from) else {
        cx.error_spanned_by(
            span_lit,
            "`CARGO_MANIFEST_DIR` is not set, so the schema cannot be found; build with cargo",
        );
        return None;
    };
    let event_type_text = event_type.value();
    let path = locate(
        &manifest_dir,
        &event_type_text,
        attrs.schema.as_ref().map(LitStr::value).as_deref(),
    );
    let path_shown = shown(&manifest_dir, &path);
    if !path.is_file() {
        let fix = if attrs.schema.is_some() {
            "fix the path in `schema = \"..\"` (relative to the crate's Cargo.toml, or absolute)"
        } else {
            "create it, or point `#[outbox(schema = \"..\")]` at the schema file"
        };
        cx.error_spanned_by(
            span_lit,
            format!("no schema for `{event_type_text}`: `{path_shown}` does not exist; {fix}"),
        );
        return None;
    }
    let root = path.parent().unwrap_or(&manifest_dir).to_path_buf();
    let schema = match load_event(&path, &root) {
        Ok(schema) => schema,
        Err(err) => {
            let problems: Vec<String> = err
                .into_list()
                .iter()
                .map(|e| {
                    let text = e.to_string();
                    let prefix = path.display().to_string();
                    match text.strip_prefix(&prefix) {
                        Some(rest) => format!("{path_shown}{rest}"),
                        None => text,
                    }
                })
                .collect();
            cx.error_spanned_by(
                span_lit,
                format!(
                    "the schema for `{event_type_text}` is not usable; fix it:\n{}",
                    problems.join("\n")
                ),
            );
            return None;
        }
    };
    if schema.event_type != event_type_text {
        cx.error_spanned_by(
            event_type,
            format!(
                "event type `{event_type_text}` does not match its schema file `{path_shown}`, \
                 which is for `{}`; use `event_type = \"{}\"` or point `schema = \"..\"` at \
                 `{}`",
                schema.event_type,
                schema.event_type,
                outbox_schema::naming::schema_file_name(&event_type_text)
            ),
        );
        return None;
    }
    let files = schema
        .files
        .iter()
        .map(|f| std::fs::canonicalize(f).unwrap_or_else(|_| manifest_dir.join(f)))
        .collect();
    Some(Loaded {
        schema,
        shown: path_shown,
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_schema_files() {
        let dir = Path::new("/srv/billing");
        assert_eq!(
            locate(dir, "billing.plan.changed", None),
            Path::new("/srv/billing/schemas/events/billing.plan.changed.schema.json")
        );
        assert_eq!(
            locate(dir, "billing.plan.changed", Some("contract/x.schema.json")),
            Path::new("/srv/billing/contract/x.schema.json")
        );
        assert_eq!(
            locate(dir, "billing.plan.changed", Some("/etc/x.schema.json")),
            Path::new("/etc/x.schema.json")
        );
        assert_eq!(
            shown(dir, Path::new("/srv/billing/schemas/a.json")),
            "schemas/a.json"
        );
        assert_eq!(shown(dir, Path::new("/etc/a.json")), "/etc/a.json");
    }
}
