//! The compile-fail suite: a contract change, or a struct that does not fit its schema, is a
//! compile error at the user's own line, and the message says the fix.
//!
//! `fail/*.rs` must fail to compile with exactly the errors in the `.stderr` beside each;
//! `pass/*.rs` must compile and run. Regenerate the `.stderr` files after a deliberate message
//! change with `TRYBUILD=overwrite cargo test -p outbox-ui`, then read each diff.
//!
//! trybuild builds the cases against this crate's dependencies in a target directory of its
//! own, so the crate depends on nothing the cases do not use.

use std::fs;
use std::path::{Path, PathBuf};

/// trybuild compiles the cases as binaries of a crate at `<target>/tests/trybuild/outbox-ui`,
/// so that is the `CARGO_MANIFEST_DIR` the derive sees. The hand-written cases find their
/// schemas where a real crate keeps them, `schemas/events/` beside its Cargo.toml: copy the
/// current contract (`tests/schemas/v2`) there.
fn stage_schemas() -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("CARGO_TARGET_TMPDIR is <target>/tmp");
    let events = target.join("tests/trybuild/outbox-ui/schemas/events");
    if events.exists() {
        fs::remove_dir_all(&events).expect("remove the previous copy of the schemas");
    }
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas/v2"),
        &events,
    );
    events
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap_or_else(|e| panic!("create {}: {e}", to.display()));
    for entry in fs::read_dir(from).unwrap_or_else(|e| panic!("read {}: {e}", from.display())) {
        let entry = entry.expect("a directory entry");
        let path = entry.path();
        if path.is_dir() {
            copy_dir(&path, &to.join(entry.file_name()));
        } else {
            fs::copy(&path, to.join(entry.file_name()))
                .unwrap_or_else(|e| panic!("copy {}: {e}", path.display()));
        }
    }
}

#[test]
fn ui() {
    let events = stage_schemas();
    assert!(events.join("billing.invoice.issued.schema.json").is_file());
    let t = trybuild::TestCases::new();
    t.compile_fail("fail/*.rs");
    t.pass("pass/*.rs");
}
