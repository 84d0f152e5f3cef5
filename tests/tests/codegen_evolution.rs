//! The schema evolution gate through the public API, on copies of the example service's
//! contract (`schemas/events`): the words of the errors for a few representative breaks
//! (golden files in `golden/evolution/`, `UPDATE_GOLDEN=1` rewrites them), the notes of
//! compatible changes, and the lock file.
//!
//! Each test works on its own temporary copy; none builds a crate (that is
//! `codegen_evolution_build.rs`).

use std::fs;
use std::path::{Path, PathBuf};

use outbox_codegen::evolution::{Level, Mode, Rule};
use outbox_codegen::{Config, Error, LockedStatus};
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A copy of `schemas/events` (with its `defs/`), locked as it is.
struct Contract {
    tmp: tempfile::TempDir,
}

impl Contract {
    fn locked() -> Self {
        let tmp = tempfile::tempdir().expect("temp dir");
        copy_dir(
            &repo().join("schemas/events"),
            &tmp.path().join("schemas/events"),
        );
        let contract = Contract { tmp };
        contract
            .config()
            .write_lock(contract.dir(), &[])
            .expect("the example contract locks");
        contract
    }

    fn dir(&self) -> PathBuf {
        self.tmp.path().join("schemas/events")
    }

    fn lock(&self) -> PathBuf {
        self.tmp.path().join("schemas/events.lock")
    }

    fn config(&self) -> Config {
        let mut config = Config::new();
        config.source("billing");
        config
    }

    /// Rewrites the JSON file `name` (relative to the schema folder) with `edit`.
    fn edit(&self, name: &str, edit: impl FnOnce(&mut Value)) {
        let path = self.dir().join(name);
        let mut doc: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        edit(&mut doc);
        fs::write(&path, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    }

    /// The gate's problems and notes for the folder under `config`, as `outbox check` prints
    /// them, with the temporary folder shown as `<tmp>`.
    fn check(&self, config: &Config) -> String {
        let checked = config.check(self.dir());
        let mut lines: Vec<String> = checked.problems.iter().map(ToString::to_string).collect();
        lines.extend(checked.notes.iter().map(|n| format!("note: {n}")));
        lines
            .join("\n")
            .replace(&self.tmp.path().display().to_string(), "<tmp>")
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

/// `text` is `golden/evolution/<name>.txt` (rewritten with `UPDATE_GOLDEN=1`).
fn assert_golden(name: &str, text: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("golden/evolution/{name}.txt"));
    let text = format!("{text}\n");
    if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, &text).unwrap();
        return;
    }
    let expected = fs::read_to_string(&path).unwrap_or_default();
    assert!(
        expected == text,
        "{} differs; run `UPDATE_GOLDEN=1 cargo test -p outbox-tests --test codegen_evolution` and review the diff\n--- expected\n{expected}--- got\n{text}",
        path.display()
    );
}

#[test]
fn the_committed_lock_is_the_example_contract_and_relocking_changes_no_byte() {
    let committed = fs::read_to_string(repo().join("schemas/events.lock"))
        .expect("schemas/events.lock is committed");
    let contract = Contract::locked();
    let written = fs::read_to_string(contract.lock()).unwrap();
    assert!(
        written == committed,
        "schemas/events.lock is not what `outbox lock schemas/events` writes; run it and commit the file"
    );
    let again = contract.config().write_lock(contract.dir(), &[]).unwrap();
    assert!(!again.written, "an unchanged folder leaves the lock alone");
    assert!(again
        .types
        .iter()
        .all(|(_, status)| *status == LockedStatus::Unchanged));
    assert_eq!(fs::read_to_string(contract.lock()).unwrap(), committed);
}

#[test]
fn a_required_property_and_a_shared_enum_value_removed() {
    let c = Contract::locked();
    c.edit("defs/common.json", |d| {
        d["$defs"]["Plan"]["enum"] = serde_json::json!(["pro", "enterprise"]);
    });
    c.edit("billing.subscription.created.schema.json", |d| {
        d["required"].as_array_mut().unwrap().push("trial".into());
    });
    assert_golden("required_and_shared_enum", &c.check(&c.config()));
}

#[test]
fn a_property_removed_from_a_closed_object_and_a_renamed_type() {
    let c = Contract::locked();
    c.edit("billing.subscription.cancelled.schema.json", |d| {
        d["properties"].as_object_mut().unwrap().remove("comment");
        d["title"] = "SubscriptionEnded".into();
    });
    assert_golden("closed_removal_and_rename", &c.check(&c.config()));
    // At the wire level only, the rename is not a break.
    let mut wire = c.config();
    wire.compatibility_level(Level::Wire);
    let text = c.check(&wire);
    assert!(text.contains("property-removed-closed"), "{text}");
    assert!(!text.contains("rust-type-renamed"), "{text}");
}

#[test]
fn a_compatible_change_passes_with_a_note() {
    let c = Contract::locked();
    c.edit("billing.subscription.cancelled.schema.json", |d| {
        d["properties"]["comment"]["maxLength"] = 1000.into();
        d["description"] = "A subscription ended.".into();
    });
    // Longer comments break old consumers, which `backward` allows.
    let mut backward = c.config();
    backward.compatibility_for("billing.subscription.cancelled", Mode::Backward);
    assert_golden("compatible_note", &c.check(&backward));
    // `full` (the lock's mode) does not.
    let text = c.check(&c.config());
    assert!(
        text.contains("length-relaxed (wire): breaks old consumers"),
        "{text}"
    );
    assert!(
        text.contains("mode `full`, from <tmp>/schemas/events.lock"),
        "{text}"
    );
}

#[test]
fn an_unknown_keyword_and_a_removed_type() {
    let c = Contract::locked();
    c.edit("billing.subscription.created.schema.json", |d| {
        d["properties"]["customer_id"]["x-pii"] = true.into();
    });
    fs::remove_file(
        c.dir()
            .join("billing.subscription.plan_changed.schema.json"),
    )
    .unwrap();
    assert_golden("unknown_and_removed", &c.check(&c.config()));
}

#[test]
fn lock_refuses_breaks_unless_allowed_by_name() {
    let c = Contract::locked();
    c.edit("billing.subscription.created.schema.json", |d| {
        d["required"].as_array_mut().unwrap().push("trial".into());
    });
    let err = c.config().write_lock(c.dir(), &[]).unwrap_err();
    assert!(
        matches!(&err, Error::Incompatible { event_type, .. } if event_type == "billing.subscription.created"),
        "{err}"
    );
    let before = fs::read_to_string(c.lock()).unwrap();

    let err = c
        .config()
        .write_lock(c.dir(), &["billing.subscription.nope".into()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("`--allow-breaking billing.subscription.nope`: billing.subscription.nope is neither an event type"), "{err}");
    assert_eq!(
        fs::read_to_string(c.lock()).unwrap(),
        before,
        "a refused lock writes nothing"
    );

    let locked = c
        .config()
        .write_lock(c.dir(), &["billing.subscription.created".into()])
        .unwrap();
    assert!(locked.written);
    assert!(locked.types.contains(&(
        "billing.subscription.created".to_owned(),
        LockedStatus::BreakingAllowed
    )));
    assert_eq!(c.check(&c.config()), "", "the new baseline has no break");
}

#[test]
fn a_new_major_type_beside_the_old_one_passes() {
    let c = Contract::locked();
    let old = c.dir().join("billing.subscription.created.schema.json");
    let mut v2: Value = serde_json::from_str(&fs::read_to_string(&old).unwrap()).unwrap();
    v2["title"] = "SubscriptionCreatedV2".into();
    v2["required"].as_array_mut().unwrap().push("trial".into());
    fs::write(
        c.dir().join("billing.subscription.created.v2.schema.json"),
        serde_json::to_string_pretty(&v2).unwrap(),
    )
    .unwrap();
    let text = c.check(&c.config());
    assert_eq!(
        text,
        "note: `billing.subscription.created.v2` is not in <tmp>/schemas/events.lock yet: it is not protected until released with `outbox lock <tmp>/schemas/events`"
    );
    let locked = c.config().write_lock(c.dir(), &[]).unwrap();
    assert!(locked.types.contains(&(
        "billing.subscription.created.v2".to_owned(),
        LockedStatus::New
    )));
    assert_eq!(c.check(&c.config()), "");
}

#[test]
fn modes_come_from_the_build_then_the_lock() {
    let c = Contract::locked();
    c.config()
        .compatibility_for("billing.subscription.cancelled", Mode::Backward)
        .write_lock(c.dir(), &[])
        .unwrap();
    let lock = fs::read_to_string(c.lock()).unwrap();
    assert!(lock.contains("\"mode\": \"backward\""), "{lock}");
    c.edit("billing.subscription.cancelled.schema.json", |d| {
        d["properties"]["comment"]["maxLength"] = 1000.into();
    });
    // The lock's mode applies without a setting, and a setting wins over it.
    assert!(c.check(&c.config()).starts_with("note: "));
    let mut full = c.config();
    full.compatibility(Mode::Full);
    assert!(c.check(&full).contains("mode `full`, configured"));
    // Relocking keeps the recorded mode.
    c.config().write_lock(c.dir(), &[]).unwrap();
    assert!(fs::read_to_string(c.lock())
        .unwrap()
        .contains("\"mode\": \"backward\""));
}

#[test]
fn every_rule_is_in_the_documentation_table() {
    let doc = fs::read_to_string(repo().join("docs/schema-evolution.md")).unwrap();
    let missing: Vec<&str> = Rule::ALL
        .iter()
        .map(|r| r.id())
        .filter(|id| !doc.contains(&format!("| `{id}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/schema-evolution.md has no row for {missing:?}"
    );
}
