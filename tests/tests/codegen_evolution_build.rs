//! The schema evolution gate in a real build: a small crate whose build script runs the
//! codegen on a locked copy of the example contract, built with `cargo build`. A breaking edit
//! fails the build with the listed changes; a compatible edit builds (with a warning to
//! refresh the lock); `--allow-breaking` and a `.v2` type beside the old one both get it
//! building again.
//!
//! The crate's only dependency is `outbox-codegen`, as a build dependency (its build script
//! does what a service's does; the generated file is written but not compiled, which the
//! golden suite and the example service cover). It lives at `<target>/tmp/evolution-e2e` and is
//! built `--offline`, with the workspace's `Cargo.lock`, into the workspace's own target
//! directory (cargo releases its lock before it runs the tests), so it reuses the codegen's
//! compiled dependencies and only its build script is compiled: about 10 s on a fresh target,
//! 3 s after.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use outbox_codegen::Config;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_owned()
}

/// The workspace's target directory.
fn target() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("CARGO_TARGET_TMPDIR is <target>/tmp")
        .to_owned()
}

struct Crate {
    root: PathBuf,
}

impl Crate {
    /// The crate, with `schemas/events` copied and locked (`billing.subscription.cancelled`
    /// under `backward`, the others `full`). Always the same path, so its artifacts are
    /// reused rather than piling up.
    fn new() -> Self {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("evolution-e2e");
        if root.exists() {
            fs::remove_dir_all(&root).expect("remove the previous crate");
        }
        fs::create_dir_all(&root).unwrap();
        let root = root.as_path();
        let codegen = repo().join("outbox-codegen");
        fs::write(
            root.join("Cargo.toml"),
            format!(
                r#"[package]
name = "evolution-e2e"
version = "0.0.0"
edition = "2021"
publish = false

[build-dependencies]
outbox-codegen = {{ path = {:?} }}

[workspace]

[profile.dev.package."*"]
debug = false
"#,
                codegen.display().to_string()
            ),
        )
        .unwrap();
        fs::copy(repo().join("Cargo.lock"), root.join("Cargo.lock")).unwrap();
        fs::create_dir_all(root.join("src")).unwrap();
        fs::write(root.join("src/main.rs"), "fn main() {}\n").unwrap();
        fs::write(
            root.join("build.rs"),
            r#"fn main() {
    if let Err(e) = outbox_codegen::Config::new()
        .source("billing")
        .compile("schemas/events")
    {
        panic!("\n{e}\n");
    }
}
"#,
        )
        .unwrap();
        copy_dir(&repo().join("schemas/events"), &root.join("schemas/events"));
        let krate = Crate {
            root: root.to_owned(),
        };
        let mut config = Config::new();
        config.source("billing").compatibility_for(
            "billing.subscription.cancelled",
            outbox_codegen::evolution::Mode::Backward,
        );
        config
            .write_lock(krate.schemas(), &[])
            .expect("the contract locks");
        krate
    }

    fn schemas(&self) -> PathBuf {
        self.root.join("schemas/events")
    }

    fn edit(&self, name: &str, edit: impl FnOnce(&mut Value)) {
        let path = self.schemas().join(name);
        let mut doc: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        edit(&mut doc);
        fs::write(&path, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    }

    /// `cargo build`: whether it succeeded, and what it printed (stderr, where cargo puts a
    /// failed build script's output and the warnings).
    fn build(&self) -> (bool, String) {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .args(["build", "--offline", "--color", "never"])
            .current_dir(&self.root)
            .env("CARGO_TARGET_DIR", target())
            .env_remove("CARGO_MANIFEST_DIR")
            .output()
            .expect("run cargo build");
        let text = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.success(), text)
    }

    fn assert_builds(&self, what: &str) -> String {
        let (ok, text) = self.build();
        assert!(ok, "{what}: the build failed:\n{text}");
        text
    }

    fn assert_fails(&self, what: &str) -> String {
        let (ok, text) = self.build();
        assert!(!ok, "{what}: the build succeeded:\n{text}");
        text
    }
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn assert_says(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(
            text.contains(part),
            "the build output does not say\n  {part}\nin\n{text}"
        );
    }
}

#[test]
fn a_breaking_edit_fails_the_build_until_allowed_or_published_as_v2() {
    let c = Crate::new();
    let text = c.assert_builds("the locked contract");
    assert!(
        !text.contains("outbox-codegen:"),
        "no warning for an unchanged contract:\n{text}"
    );

    // A reason removed: older events may carry it.
    let drop_fraud = |d: &mut Value| {
        d["properties"]["reason"]["enum"] =
            serde_json::json!(["customer_request", "payment_failed"]);
    };
    c.edit("billing.subscription.cancelled.schema.json", drop_fraud);
    let text = c.assert_fails("a removed enum value");
    assert_says(
        &text,
        &[
            "schemas/events/billing.subscription.cancelled.schema.json: 2 breaking changes to the released event type `billing.subscription.cancelled` (mode `backward`, from schemas/events.lock, level `rust`):",
            "  - at /properties/reason/enum: value \"fraud\" removed",
            "    enum-value-removed (wire): breaks new consumers: they reject events published before this change",
            "    rust-variant-removed (rust): breaks Rust code generated from the released schema",
            "publish the new shape as the new major type `billing.subscription.cancelled.v2`",
            "accept it knowingly: outbox lock schemas/events --allow-breaking billing.subscription.cancelled",
        ],
    );

    // Back as released, plus a new optional property: old consumers (closed model) would
    // reject it, which `backward` allows.
    c.edit("billing.subscription.cancelled.schema.json", |d| {
        d["properties"]["reason"]["enum"] =
            serde_json::json!(["customer_request", "payment_failed", "fraud"]);
        d["properties"]["refund_id"] = serde_json::json!({ "type": "string", "format": "uuid" });
    });
    let text = c.assert_builds("a compatible edit");
    assert_says(
        &text,
        &["warning: evolution-e2e@0.0.0: outbox-codegen: `billing.subscription.cancelled` changed compatibly (mode `backward`) since schemas/events.lock: property-added-closed at /properties/refund_id; run `outbox lock schemas/events` to record it"],
    );

    // The break again, accepted by name (what `outbox lock --allow-breaking` does).
    c.edit("billing.subscription.cancelled.schema.json", drop_fraud);
    c.assert_fails("a removed enum value, again");
    Config::new()
        .source("billing")
        .write_lock(c.schemas(), &["billing.subscription.cancelled".to_owned()])
        .expect("the break is allowed");
    let text = c.assert_builds("the break allowed");
    assert!(
        !text.contains("outbox-codegen:"),
        "the lock is fresh:\n{text}"
    );

    // Another break, published as a new major type instead: the old file stays as released.
    let created = c.schemas().join("billing.subscription.created.schema.json");
    let released = fs::read_to_string(&created).unwrap();
    c.edit("billing.subscription.created.schema.json", |d| {
        d["required"].as_array_mut().unwrap().push("trial".into());
    });
    let text = c.assert_fails("trial made required");
    assert_says(&text, &["  - at /required: `trial` became required"]);
    let mut v2: Value = serde_json::from_str(&fs::read_to_string(&created).unwrap()).unwrap();
    v2["title"] = "SubscriptionCreatedV2".into();
    fs::write(
        c.schemas()
            .join("billing.subscription.created.v2.schema.json"),
        serde_json::to_string_pretty(&v2).unwrap(),
    )
    .unwrap();
    fs::write(&created, released).unwrap();
    let text = c.assert_builds("the change as billing.subscription.created.v2");
    assert_says(
        &text,
        &["outbox-codegen: `billing.subscription.created.v2` is not in schemas/events.lock yet"],
    );
}
