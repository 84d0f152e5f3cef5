//! The gate's table: schema changes with their verdict per mode and level, and the rules
//! that make it.

mod arrays;
mod combinators;
mod leaf;
mod objects;
mod others;
mod refs;

use std::path::PathBuf;

use serde_json::{json, Value};

use super::*;
use crate::typify_driver;

/// The changes of one event whose released schema is `old` and current schema is `new`, at
/// both levels, as the build finds them (without files: the schemas are given resolved).
fn changes(old: &Value, new: &Value) -> Result<Vec<Change>, String> {
    let event = |schema: &Value| EventSchema {
        path: PathBuf::from("t.case.changed.schema.json"),
        event_type: "t.case.changed".into(),
        title: schema["title"].as_str().unwrap().to_owned(),
        subject: schema
            .get("x-outbox-subject")
            .and_then(Value::as_str)
            .map(str::to_owned),
        resolved: schema.clone(),
        files: Vec::new(),
    };
    let (released, current) = (event(old), event(new));
    let mut lock = Lock::default();
    lock.events.insert(
        "t.case.changed".into(),
        LockEntry {
            mode: Mode::Full,
            schema: old.clone(),
        },
    );
    let settings = Settings::default();
    let events = [current];
    let mut report = compare_wire(&events, Some(&lock), "t.lock".as_ref(), &settings);
    if !needs_rust(&report, &events, Some(&lock)).is_empty() {
        let (_, new_types) = typify_driver::generate(&events, true)
            .map_err(|e| format!("the new schema does not generate: {e}"))?;
        let old_types = typify_driver::rust_types(std::slice::from_ref(&released))
            .map_err(|e| format!("the old schema does not generate: {e}"))?;
        add_rust(
            &mut report,
            &events[0],
            &released,
            &old_types,
            &new_types.unwrap(),
        );
    }
    Ok(report.types.remove(0).changes)
}

/// The verdicts as six characters, `x` for fails and `.` for passes: wire level under
/// backward, forward, full, a space, then rust level under the same modes.
fn verdicts(changes: &[Change]) -> String {
    let mut text = String::new();
    for level in [Level::Wire, Level::Rust] {
        if level == Level::Rust {
            text.push(' ');
        }
        for mode in [Mode::Backward, Mode::Forward, Mode::Full] {
            let fails = changes.iter().any(|c| c.is_breaking(mode, level));
            text.push(if fails { 'x' } else { '.' });
        }
    }
    text
}

/// The ids of the rules that break under `full` at the rust level, sorted, each once.
fn breaking_rules(changes: &[Change]) -> Vec<&'static str> {
    let mut ids: Vec<&'static str> = changes
        .iter()
        .filter(|c| c.is_breaking(Mode::Full, Level::Rust))
        .map(|c| c.rule.id())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// An event schema with these properties (and `required`), open unless `extra` says more.
fn event(properties: Value, required: &[&str], extra: Value) -> Value {
    let mut schema = json!({
        "title": "Evt",
        "type": "object",
        "properties": properties,
        "required": required,
    });
    for (k, v) in extra.as_object().unwrap() {
        schema[k] = v.clone();
    }
    schema
}

/// An event with one optional property `p` of schema `p`.
fn prop(p: Value) -> Value {
    event(
        json!({ "id": { "type": "string" }, "p": p }),
        &["id"],
        json!({}),
    )
}

/// An event with one required property `p` of schema `p`.
fn req(p: Value) -> Value {
    event(
        json!({ "id": { "type": "string" }, "p": p }),
        &["id", "p"],
        json!({}),
    )
}

struct Case {
    name: &'static str,
    old: Value,
    new: Value,
    verdicts: &'static str,
    rules: &'static [&'static str],
    /// The type generator does not take the schema (the build fails with its error before
    /// the gate matters): only the wire level is checked, and its three verdicts given.
    wire_only: bool,
}

fn case(
    name: &'static str,
    old: Value,
    new: Value,
    verdicts: &'static str,
    rules: &'static [&'static str],
) -> Case {
    Case {
        name,
        old,
        new,
        verdicts,
        rules,
        wire_only: false,
    }
}

fn wire_case(
    name: &'static str,
    old: Value,
    new: Value,
    verdicts: &'static str,
    rules: &'static [&'static str],
) -> Case {
    Case {
        wire_only: true,
        ..case(name, old, new, verdicts, rules)
    }
}

/// Definitions shared by the `$ref` cases.
fn with_defs(properties: Value, defs: Value) -> Value {
    event(properties, &["id"], json!({ "$defs": defs }))
}

fn closed(properties: Value) -> Value {
    event(
        properties,
        &["id"],
        json!({ "additionalProperties": false }),
    )
}

/// `{ "type": "string" }`.
fn s() -> Value {
    json!({ "type": "string" })
}

/// `{ "type": "integer" }`.
fn i() -> Value {
    json!({ "type": "integer" })
}

/// Every case of the table, family by family.
fn cases() -> Vec<Case> {
    [
        leaf::types(),
        leaf::consts_and_enums(),
        leaf::required(),
        objects::open_content_model(),
        objects::closed_content_model(),
        objects::additional_properties(),
        objects::added_partially_open(),
        objects::removed_partially_open(),
        objects::pattern_properties(),
        objects::property_counts_and_names(),
        leaf::strings(),
        leaf::numbers(),
        arrays::items(),
        arrays::draft7_tuples(),
        refs::targets(),
        refs::siblings_and_definitions(),
        combinators::any_of(),
        combinators::one_of(),
        combinators::all_of_and_not(),
        others::cases(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

#[test]
fn table() {
    let mut failures = Vec::new();
    for c in cases() {
        let found = if c.wire_only {
            wire::compare(&c.old, &c.new)
        } else {
            match changes(&c.old, &c.new) {
                Ok(found) => found,
                Err(e) => {
                    failures.push(format!("{}: {e}", c.name));
                    continue;
                }
            }
        };
        let mut got = (verdicts(&found), breaking_rules(&found));
        if c.wire_only {
            got.0.truncate(3);
        }
        if got.0 != c.verdicts || got.1 != c.rules {
            failures.push(format!(
                "{}:\n  expected {} {:?}\n       got {} {:?}\n  changes: {:#?}",
                c.name, c.verdicts, c.rules, got.0, got.1, found
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The wire level alone, for schemas the type generator does not take.
fn wire(old: Value, new: Value) -> Vec<(&'static str, String, bool, bool)> {
    wire::compare(&old, &new)
        .into_iter()
        .map(|c| {
            (
                c.rule.id(),
                c.pointer,
                c.breaks.old_consumers,
                c.breaks.new_consumers,
            )
        })
        .collect()
}

/// Backward and forward swapped, full kept: what the verdict of the reverse change must be.
fn mirrored(wire: &str) -> String {
    let c: Vec<char> = wire.chars().collect();
    [c[1], c[0], c[2]].iter().collect()
}

#[test]
fn every_change_reversed_mirrors_its_wire_verdict() {
    let mut failures = Vec::new();
    for c in cases() {
        let reversed = wire::compare(&c.new, &c.old);
        let got = verdicts(&reversed)[..3].to_owned();
        let want = mirrored(&c.verdicts[..3]);
        if got != want {
            failures.push(format!(
                "{} reversed: expected {want}, got {got}: {reversed:#?}",
                c.name
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_table_covers_every_rule() {
    let mut seen = std::collections::BTreeSet::new();
    for c in cases() {
        let found = if c.wire_only {
            wire::compare(&c.old, &c.new)
        } else {
            changes(&c.old, &c.new).unwrap()
        };
        seen.extend(found.iter().map(|c| c.rule));
        seen.extend(wire::compare(&c.new, &c.old).iter().map(|c| c.rule));
    }
    let missing: Vec<&str> = Rule::ALL
        .iter()
        .filter(|r| !seen.contains(r) && **r != Rule::EventTypeRemoved)
        .map(|r| r.id())
        .collect();
    assert!(
        missing.is_empty(),
        "rules no case of the table shows: {missing:?}"
    );
    assert!(cases().len() >= 60, "{} cases", cases().len());
}
