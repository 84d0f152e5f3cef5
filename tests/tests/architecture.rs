//! ARCHITECTURE.md stays true: every path it names (in backticks, from the repository's root)
//! exists, and every folder of the crates' sources and tests is named in it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_owned()
}

/// The backticked spans of `text` that are paths: only path characters, and a `/` or the
/// extension of a file the repository keeps (`x-outbox-subject`, `RelayConfig::event_types`
/// or `billing.invoice.paid` are not).
fn named_paths(text: &str) -> Vec<String> {
    const EXTENSIONS: [&str; 8] = [
        ".rs", ".md", ".sql", ".toml", ".yml", ".yaml", ".json", ".lock",
    ];
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| {
            !span.is_empty()
                && span
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
                && (span.contains('/') || EXTENSIONS.iter().any(|e| span.ends_with(e)))
        })
        .map(str::to_owned)
        .collect()
}

/// The folders below `<crate>/src` and `<crate>/tests` of every crate in the repository (a
/// folder whose Cargo.toml has a `[package]`, outside `target`), as `a/b/` from the root.
fn source_folders(root: &Path) -> Vec<String> {
    fn below(dir: &Path, root: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                let relative = path.strip_prefix(root).expect("below the root");
                out.push(format!("{}/", relative.display()));
                below(&path, root, out);
            }
        }
    }
    fn crates(dir: &Path, out: &mut Vec<PathBuf>) {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
        if manifest.contains("[package]") {
            out.push(dir.to_owned());
        }
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let skipped = name.starts_with('.') || name == "target" || name == "src";
            if entry.path().is_dir() && !skipped {
                crates(&entry.path(), out);
            }
        }
    }
    let mut roots = Vec::new();
    crates(root, &mut roots);
    let mut folders = Vec::new();
    for krate in roots {
        for part in ["src", "tests"] {
            below(&krate.join(part), root, &mut folders);
        }
    }
    folders.sort();
    folders
}

#[test]
fn every_path_architecture_md_names_exists_and_every_source_folder_is_named() {
    let root = repo_root();
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let named = named_paths(&text);
    // a parser that finds nothing would pass whatever the file says
    assert!(
        named.len() > 50,
        "only {} paths found: {named:?}",
        named.len()
    );

    let missing: Vec<&String> = named
        .iter()
        .filter(|p| {
            let path = root.join(p);
            if p.ends_with('/') {
                !path.is_dir()
            } else {
                !path.exists()
            }
        })
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist (paths are from the repository's root): {missing:?}"
    );

    let named: BTreeSet<&str> = named.iter().map(String::as_str).collect();
    let folders = source_folders(&root);
    assert!(
        folders.iter().any(|f| f == "outbox-runtime/src/relay/"),
        "the walk finds the source folders: {folders:?}"
    );
    let unnamed: Vec<&String> = folders
        .iter()
        .filter(|f| !named.contains(f.as_str()))
        .collect();
    assert!(
        unnamed.is_empty(),
        "source folders ARCHITECTURE.md does not name (as `path/`, from the root): {unnamed:?}"
    );
}

#[test]
fn only_path_like_spans_count_as_paths() {
    let text = "`outbox-runtime/src/relay/` and `docs/relay.md`, `ARCHITECTURE.md`; not \
                `x-outbox-subject`, `RelayConfig::event_types`, `billing.invoice.paid`, \
                `#[derive(OutboxEvent)]` or `(created_at, id)`";
    assert_eq!(
        named_paths(text),
        [
            "outbox-runtime/src/relay/",
            "docs/relay.md",
            "ARCHITECTURE.md"
        ]
    );
}
