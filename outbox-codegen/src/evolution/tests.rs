//! The gate's table: schema changes with their verdict per mode and level, and the rules
//! that make it.

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

fn cases() -> Vec<Case> {
    let s = || json!({ "type": "string" });
    let i = || json!({ "type": "integer" });
    vec![
        // ---- type ----------------------------------------------------------------------
        case(
            "type narrowed",
            prop(json!({ "type": ["string", "integer"] })),
            prop(s()),
            "x.x xxx",
            &["rust-field-type-changed", "type-changed"],
        ),
        case(
            "type widened: integer to number",
            prop(i()),
            prop(json!({ "type": "number" })),
            ".xx xxx",
            &["rust-field-type-changed", "type-changed"],
        ),
        case(
            "type changed",
            prop(s()),
            prop(i()),
            "xxx xxx",
            &["rust-field-type-changed", "type-changed"],
        ),
        case(
            "null allowed on a required property",
            req(s()),
            req(json!({ "type": ["string", "null"] })),
            ".xx xxx",
            &["rust-field-type-changed", "type-changed"],
        ),
        case(
            "type added where any value was allowed",
            prop(json!({})),
            prop(s()),
            "x.x xxx",
            &["rust-field-type-changed", "type-changed"],
        ),
        case(
            "type the enum implies, written out",
            prop(json!({ "enum": ["a", "b"] })),
            prop(json!({ "type": "string", "enum": ["a", "b"] })),
            "... ...",
            &[],
        ),
        // ---- const and enum ------------------------------------------------------------
        case(
            "const changed",
            prop(json!({ "const": "a" })),
            prop(json!({ "const": "b" })),
            "xxx xxx",
            &["const-changed"],
        ),
        case(
            "const added",
            prop(s()),
            prop(json!({ "type": "string", "const": "a" })),
            "x.x x.x",
            &["const-changed"],
        ),
        case(
            "const removed",
            prop(json!({ "type": "string", "const": "a" })),
            prop(s()),
            ".xx .xx",
            &["const-changed"],
        ),
        case(
            "enum value removed",
            prop(json!({ "type": "string", "enum": ["a", "b"] })),
            prop(json!({ "type": "string", "enum": ["a"] })),
            "x.x xxx",
            &["enum-value-removed", "rust-variant-removed"],
        ),
        case(
            "enum value added",
            prop(json!({ "type": "string", "enum": ["a"] })),
            prop(json!({ "type": "string", "enum": ["a", "b"] })),
            ".xx xxx",
            &["enum-value-added", "rust-variant-added"],
        ),
        case(
            "enum added",
            prop(s()),
            prop(json!({ "type": "string", "enum": ["a"] })),
            "x.x xxx",
            &["enum-added", "rust-field-type-changed"],
        ),
        case(
            "enum removed",
            prop(json!({ "type": "string", "enum": ["a"] })),
            prop(s()),
            ".xx xxx",
            &["enum-removed", "rust-field-type-changed"],
        ),
        case(
            "enum reordered",
            prop(json!({ "type": "string", "enum": ["a", "b"] })),
            prop(json!({ "type": "string", "enum": ["b", "a"] })),
            "... ...",
            &[],
        ),
        // ---- required ------------------------------------------------------------------
        case(
            "required added",
            prop(s()),
            req(s()),
            "x.x xxx",
            &["required-added", "rust-field-type-changed"],
        ),
        case(
            "required removed",
            req(s()),
            prop(s()),
            ".xx xxx",
            &["required-removed", "rust-field-type-changed"],
        ),
        case(
            "required added with a default keeps the Rust type",
            prop(json!({ "type": "string", "default": "x" })),
            req(json!({ "type": "string", "default": "x" })),
            "x.x x.x",
            &["required-added"],
        ),
        case(
            "dependentRequired added",
            prop(s()),
            event(
                json!({ "id": s(), "p": s() }),
                &["id"],
                json!({ "dependentRequired": { "p": ["id"] } }),
            ),
            "x.x x.x",
            &["required-added"],
        ),
        // ---- open content model --------------------------------------------------------
        case(
            "property added to an open object",
            event(json!({ "id": s() }), &["id"], json!({})),
            prop(s()),
            "x.x x.x",
            &["property-added-open"],
        ),
        case(
            "property of any value added to an open object",
            event(json!({ "id": s() }), &["id"], json!({})),
            prop(json!({})),
            "... ...",
            &[],
        ),
        case(
            "property removed from an open object",
            prop(s()),
            event(json!({ "id": s() }), &["id"], json!({})),
            ".xx xxx",
            &["property-removed-open", "rust-field-removed"],
        ),
        case(
            "nested: property added to an open inner object",
            prop(json!({ "type": "object", "properties": { "a": s() } })),
            prop(json!({ "type": "object", "properties": { "a": s(), "b": i() } })),
            "x.x x.x",
            &["property-added-open"],
        ),
        // ---- closed content model ------------------------------------------------------
        case(
            "property added to a closed object",
            closed(json!({ "id": s() })),
            closed(json!({ "id": s(), "p": s() })),
            ".xx .xx",
            &["property-added-closed"],
        ),
        case(
            "required property added to a closed object",
            closed(json!({ "id": s() })),
            event(
                json!({ "id": s(), "p": s() }),
                &["id", "p"],
                json!({ "additionalProperties": false }),
            ),
            "xxx xxx",
            &["property-added-closed", "required-added"],
        ),
        case(
            "property removed from a closed object",
            closed(json!({ "id": s(), "p": s() })),
            closed(json!({ "id": s() })),
            "x.x xxx",
            &["property-removed-closed", "rust-field-removed"],
        ),
        case(
            "property renamed in a closed object",
            closed(json!({ "id": s(), "a": s() })),
            closed(json!({ "id": s(), "b": s() })),
            "xxx xxx",
            &[
                "property-added-closed",
                "property-removed-closed",
                "rust-field-removed",
            ],
        ),
        case(
            "nested: property removed from a closed inner object",
            prop(
                json!({ "type": "object", "properties": { "a": s(), "b": s() }, "additionalProperties": false }),
            ),
            prop(
                json!({ "type": "object", "properties": { "a": s() }, "additionalProperties": false }),
            ),
            "x.x xxx",
            &["property-removed-closed", "rust-field-removed"],
        ),
        case(
            "additionalProperties narrowed: absent to false",
            prop(s()),
            event(
                json!({ "id": s(), "p": s() }),
                &["id"],
                json!({ "additionalProperties": false }),
            ),
            "x.x x.x",
            &["additional-properties-narrowed"],
        ),
        case(
            "additionalProperties widened: false to absent",
            closed(json!({ "id": s() })),
            event(json!({ "id": s() }), &["id"], json!({})),
            ".xx .xx",
            &["additional-properties-widened"],
        ),
        case(
            "additionalProperties narrowed: any to a schema",
            event(json!({ "id": s() }), &["id"], json!({})),
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": s() }),
            ),
            "x.x x.x",
            &["additional-properties-narrowed"],
        ),
        case(
            "additionalProperties schema widened",
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": s() }),
            ),
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": { "type": ["string", "integer"] } }),
            ),
            ".xx xxx",
            &["rust-field-type-changed", "type-changed"],
        ),
        // ---- partially open content model ----------------------------------------------
        case(
            "property added under additionalProperties, same schema",
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": s() }),
            ),
            event(
                json!({ "id": s(), "p": s() }),
                &["id"],
                json!({ "additionalProperties": s() }),
            ),
            "... ...",
            &[],
        ),
        case(
            "property added under additionalProperties, other type",
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": s() }),
            ),
            event(
                json!({ "id": s(), "p": i() }),
                &["id"],
                json!({ "additionalProperties": s() }),
            ),
            "xxx xxx",
            &["property-added-partial"],
        ),
        case(
            "property added under patternProperties, narrower",
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": false, "patternProperties": { "^x_": s() } }),
            ),
            event(
                json!({ "id": s(), "x_a": { "type": "string", "maxLength": 3 } }),
                &["id"],
                json!({ "additionalProperties": false, "patternProperties": { "^x_": s() } }),
            ),
            "x.x x.x",
            &["property-added-partial"],
        ),
        case(
            "property added not matching patternProperties of a closed object",
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": false, "patternProperties": { "^x_": s() } }),
            ),
            event(
                json!({ "id": s(), "y": i() }),
                &["id"],
                json!({ "additionalProperties": false, "patternProperties": { "^x_": s() } }),
            ),
            ".xx .xx",
            &["property-added-closed"],
        ),
        case(
            "property removed under patternProperties, wider",
            event(
                json!({ "id": s(), "x_a": { "type": "string", "maxLength": 3 } }),
                &["id"],
                json!({ "additionalProperties": false, "patternProperties": { "^x_": s() } }),
            ),
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": false, "patternProperties": { "^x_": s() } }),
            ),
            ".xx xxx",
            &["property-removed-partial", "rust-field-removed"],
        ),
        case(
            "property removed under additionalProperties, same schema",
            event(
                json!({ "id": s(), "p": s() }),
                &["id"],
                json!({ "additionalProperties": s() }),
            ),
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": s() }),
            ),
            "... xxx",
            &["rust-field-removed"],
        ),
        case(
            "patternProperties added to a closed object",
            closed(json!({ "id": s() })),
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": false, "patternProperties": { "^x_": s() } }),
            ),
            ".xx .xx",
            &["pattern-property-added"],
        ),
        case(
            "patternProperties removed from a closed object",
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "additionalProperties": false, "patternProperties": { "^x_": s() } }),
            ),
            closed(json!({ "id": s() })),
            "x.x x.x",
            &["pattern-property-removed"],
        ),
        case(
            "patternProperties schema narrowed",
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "patternProperties": { "^x_": s() } }),
            ),
            event(
                json!({ "id": s() }),
                &["id"],
                json!({ "patternProperties": { "^x_": { "type": "string", "maxLength": 3 } } }),
            ),
            "x.x x.x",
            &["length-tightened"],
        ),
        case(
            "minProperties added",
            prop(s()),
            event(
                json!({ "id": s(), "p": s() }),
                &["id"],
                json!({ "minProperties": 2 }),
            ),
            "x.x x.x",
            &["property-count-tightened"],
        ),
        case(
            "maxProperties raised",
            event(
                json!({ "id": s(), "p": s() }),
                &["id"],
                json!({ "maxProperties": 2 }),
            ),
            event(
                json!({ "id": s(), "p": s() }),
                &["id"],
                json!({ "maxProperties": 5 }),
            ),
            ".xx .xx",
            &["property-count-relaxed"],
        ),
        case(
            "propertyNames pattern added",
            prop(s()),
            event(
                json!({ "id": s(), "p": s() }),
                &["id"],
                json!({ "propertyNames": { "pattern": "^[a-z]+$" } }),
            ),
            "x.x x.x",
            &["pattern-added"],
        ),
        // ---- strings -------------------------------------------------------------------
        case(
            "pattern added",
            prop(s()),
            prop(json!({ "type": "string", "pattern": "^[a-z]+$" })),
            "x.x xxx",
            &["pattern-added", "rust-field-type-changed"],
        ),
        case(
            "pattern changed",
            prop(json!({ "type": "string", "pattern": "^[a-z]+$" })),
            prop(json!({ "type": "string", "pattern": "^[a-z0-9]+$" })),
            "xxx xxx",
            &["pattern-changed"],
        ),
        case(
            "pattern removed",
            prop(json!({ "type": "string", "pattern": "^[a-z]+$" })),
            prop(s()),
            ".xx xxx",
            &["pattern-removed", "rust-field-type-changed"],
        ),
        case(
            "format added",
            prop(s()),
            prop(json!({ "type": "string", "format": "uuid" })),
            "x.x xxx",
            &["format-added", "rust-field-type-changed"],
        ),
        case(
            "format changed",
            prop(json!({ "type": "string", "format": "date-time" })),
            prop(json!({ "type": "string", "format": "date" })),
            "xxx xxx",
            &["format-changed", "rust-field-type-changed"],
        ),
        case(
            "format removed",
            prop(json!({ "type": "string", "format": "uuid" })),
            prop(s()),
            ".xx xxx",
            &["format-removed", "rust-field-type-changed"],
        ),
        case(
            "maxLength lowered",
            prop(json!({ "type": "string", "maxLength": 10 })),
            prop(json!({ "type": "string", "maxLength": 5 })),
            "x.x x.x",
            &["length-tightened"],
        ),
        case(
            "minLength lowered",
            prop(json!({ "type": "string", "minLength": 3 })),
            prop(json!({ "type": "string", "minLength": 1 })),
            ".xx .xx",
            &["length-relaxed"],
        ),
        case(
            "maxLength added",
            prop(s()),
            prop(json!({ "type": "string", "maxLength": 5 })),
            "x.x xxx",
            &["length-tightened", "rust-field-type-changed"],
        ),
        // ---- numbers -------------------------------------------------------------------
        case(
            "minimum raised from 0 to 1",
            prop(json!({ "type": "integer", "minimum": 0 })),
            prop(json!({ "type": "integer", "minimum": 1 })),
            "x.x xxx",
            &["numeric-bound-tightened", "rust-field-type-changed"],
        ),
        case(
            "minimum raised from 1 to 5",
            prop(json!({ "type": "integer", "minimum": 1 })),
            prop(json!({ "type": "integer", "minimum": 5 })),
            "x.x xxx",
            &["numeric-bound-tightened", "rust-field-type-changed"],
        ),
        case(
            "maximum raised",
            prop(json!({ "type": "integer", "maximum": 10 })),
            prop(json!({ "type": "integer", "maximum": 20 })),
            ".xx .xx",
            &["numeric-bound-relaxed"],
        ),
        case(
            "exclusiveMaximum added",
            prop(json!({ "type": "number" })),
            prop(json!({ "type": "number", "exclusiveMaximum": 1 })),
            "x.x x.x",
            &["numeric-bound-tightened"],
        ),
        case(
            "exclusiveMinimum to the same minimum",
            prop(json!({ "type": "number", "exclusiveMinimum": 0 })),
            prop(json!({ "type": "number", "minimum": 0 })),
            ".xx .xx",
            &["numeric-bound-relaxed"],
        ),
        case(
            "multipleOf added",
            prop(i()),
            prop(json!({ "type": "integer", "multipleOf": 5 })),
            "x.x x.x",
            &["multiple-of-tightened"],
        ),
        case(
            "multipleOf 2 to 4",
            prop(json!({ "type": "integer", "multipleOf": 2 })),
            prop(json!({ "type": "integer", "multipleOf": 4 })),
            "x.x x.x",
            &["multiple-of-tightened"],
        ),
        case(
            "multipleOf 4 to 2",
            prop(json!({ "type": "integer", "multipleOf": 4 })),
            prop(json!({ "type": "integer", "multipleOf": 2 })),
            ".xx .xx",
            &["multiple-of-relaxed"],
        ),
        case(
            "multipleOf 2 to 3",
            prop(json!({ "type": "integer", "multipleOf": 2 })),
            prop(json!({ "type": "integer", "multipleOf": 3 })),
            "xxx xxx",
            &["multiple-of-relaxed", "multiple-of-tightened"],
        ),
        // ---- arrays --------------------------------------------------------------------
        case(
            "minItems added",
            prop(json!({ "type": "array", "items": s() })),
            prop(json!({ "type": "array", "items": s(), "minItems": 1 })),
            "x.x x.x",
            &["item-bound-tightened"],
        ),
        case(
            "maxItems raised",
            prop(json!({ "type": "array", "items": s(), "maxItems": 3 })),
            prop(json!({ "type": "array", "items": s(), "maxItems": 9 })),
            ".xx .xx",
            &["item-bound-relaxed"],
        ),
        case(
            "uniqueItems added",
            prop(json!({ "type": "array", "items": s() })),
            prop(json!({ "type": "array", "items": s(), "uniqueItems": true })),
            "x.x xxx",
            &["rust-field-type-changed", "unique-items-added"],
        ),
        case(
            "uniqueItems removed",
            prop(json!({ "type": "array", "items": s(), "uniqueItems": true })),
            prop(json!({ "type": "array", "items": s() })),
            ".xx xxx",
            &["rust-field-type-changed", "unique-items-removed"],
        ),
        case(
            "items type changed",
            prop(json!({ "type": "array", "items": s() })),
            prop(json!({ "type": "array", "items": i() })),
            "xxx xxx",
            &["rust-field-type-changed", "type-changed"],
        ),
        case(
            "nested: required added in array items",
            prop(
                json!({ "type": "array", "items": { "type": "object", "properties": { "a": s() } } }),
            ),
            prop(
                json!({ "type": "array", "items": { "type": "object", "properties": { "a": s() }, "required": ["a"] } }),
            ),
            "x.x xxx",
            &["required-added", "rust-field-type-changed"],
        ),
        wire_case(
            "contains added",
            prop(json!({ "type": "array", "items": s() })),
            prop(json!({ "type": "array", "items": s(), "contains": { "const": "x" } })),
            "x.x",
            &["contains-added"],
        ),
        wire_case(
            "draft-07 tuple position changed",
            event(
                json!({ "id": s(), "p": { "type": "array", "items": [s(), i()], "additionalItems": false } }),
                &["id"],
                json!({ "$schema": "http://json-schema.org/draft-07/schema#" }),
            ),
            event(
                json!({ "id": s(), "p": { "type": "array", "items": [s(), s()], "additionalItems": false } }),
                &["id"],
                json!({ "$schema": "http://json-schema.org/draft-07/schema#" }),
            ),
            "xxx",
            &["type-changed"],
        ),
        wire_case(
            "draft-07 tuple position added",
            event(
                json!({ "id": s(), "p": { "type": "array", "items": [s()], "additionalItems": false } }),
                &["id"],
                json!({ "$schema": "http://json-schema.org/draft-07/schema#" }),
            ),
            event(
                json!({ "id": s(), "p": { "type": "array", "items": [s(), i()], "additionalItems": false } }),
                &["id"],
                json!({ "$schema": "http://json-schema.org/draft-07/schema#" }),
            ),
            ".xx",
            &["type-changed"],
        ),
        // ---- $ref ----------------------------------------------------------------------
        case(
            "$ref target gained an enum value",
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/Plan" } }),
                json!({ "Plan": { "type": "string", "enum": ["free", "pro"] } }),
            ),
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/Plan" } }),
                json!({ "Plan": { "type": "string", "enum": ["free", "pro", "team"] } }),
            ),
            ".xx xxx",
            &["enum-value-added", "rust-variant-added"],
        ),
        case(
            "$ref retargeted to an equal definition",
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/A" } }),
                json!({ "A": { "type": "string", "enum": ["x"] } }),
            ),
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/B" } }),
                json!({ "B": { "type": "string", "enum": ["x"] } }),
            ),
            "... xxx",
            &["rust-type-renamed"],
        ),
        case(
            "$ref retargeted to a narrower definition",
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/Wide" } }),
                json!({ "Wide": { "type": "integer", "minimum": 0 }, "Narrow": { "type": "integer", "minimum": 0, "maximum": 9 } }),
            ),
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/Narrow" } }),
                json!({ "Wide": { "type": "integer", "minimum": 0 }, "Narrow": { "type": "integer", "minimum": 0, "maximum": 9 } }),
            ),
            "x.x xxx",
            &[
                "numeric-bound-tightened",
                "rust-field-type-changed",
                "rust-type-renamed",
            ],
        ),
        case(
            "inline schema moved into a definition",
            prop(json!({ "type": "string", "enum": ["a", "b"] })),
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/Choice" } }),
                json!({ "Choice": { "type": "string", "enum": ["a", "b"] } }),
            ),
            "... xxx",
            &["rust-type-renamed"],
        ),
        case(
            "keyword beside $ref added",
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/Count" } }),
                json!({ "Count": { "type": "integer" } }),
            ),
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/Count", "maximum": 9 } }),
                json!({ "Count": { "type": "integer" } }),
            ),
            "x.x xxx",
            &["numeric-bound-tightened", "rust-field-type-changed"],
        ),
        case(
            "recursive definition gains a required property",
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/Node" } }),
                json!({ "Node": { "type": "object", "properties": { "name": s(), "children": { "type": "array", "items": { "$ref": "#/$defs/Node" } } } } }),
            ),
            with_defs(
                json!({ "id": s(), "p": { "$ref": "#/$defs/Node" } }),
                json!({ "Node": { "type": "object", "required": ["name"], "properties": { "name": s(), "children": { "type": "array", "items": { "$ref": "#/$defs/Node" } } } } }),
            ),
            "x.x xxx",
            &["required-added", "rust-field-type-changed"],
        ),
        case(
            "definition nobody uses removed",
            with_defs(
                json!({ "id": s() }),
                json!({ "Spare": { "type": "string", "enum": ["x"] } }),
            ),
            event(json!({ "id": s() }), &["id"], json!({})),
            "... xxx",
            &["rust-type-removed"],
        ),
        // ---- combinators ---------------------------------------------------------------
        case(
            "anyOf branch added",
            prop(json!({ "anyOf": [s(), i()] })),
            prop(json!({ "anyOf": [s(), i(), { "type": "boolean" }] })),
            ".xx xxx",
            &["anyof-branch-added", "rust-variant-added"],
        ),
        case(
            "anyOf branch removed",
            prop(json!({ "anyOf": [s(), i()] })),
            prop(json!({ "anyOf": [s()] })),
            "x.x xxx",
            &["anyof-branch-removed", "rust-field-type-changed"],
        ),
        case(
            "anyOf branches reordered",
            prop(json!({ "anyOf": [s(), i()] })),
            prop(json!({ "anyOf": [i(), s()] })),
            "... ...",
            &[],
        ),
        case(
            "type made nullable through anyOf",
            req(json!({ "type": "string", "maxLength": 5 })),
            req(json!({ "anyOf": [{ "type": "string", "maxLength": 5 }, { "type": "null" }] })),
            ".xx xxx",
            &["anyof-branch-added", "rust-field-type-changed"],
        ),
        case(
            "anyOf branch narrowed",
            prop(json!({ "anyOf": [s(), i()] })),
            prop(json!({ "anyOf": [{ "type": "string", "maxLength": 3 }, i()] })),
            "x.x xxx",
            &["length-tightened", "rust-field-type-changed"],
        ),
        case(
            "oneOf branch added, disjoint type",
            prop(json!({ "oneOf": [s(), i()] })),
            prop(json!({ "oneOf": [s(), i(), { "type": "boolean" }] })),
            ".xx xxx",
            &["oneof-branch-added", "rust-variant-added"],
        ),
        case(
            "oneOf branch added, may overlap",
            prop(json!({ "oneOf": [{ "type": "object", "properties": { "a": s() } }] })),
            prop(
                json!({ "oneOf": [{ "type": "object", "properties": { "a": s() } }, { "type": "object", "properties": { "b": s() } }] }),
            ),
            "xxx xxx",
            &["oneof-branch-added", "rust-type-changed"],
        ),
        case(
            "oneOf branch added, told apart by a discriminator",
            prop(
                json!({ "oneOf": [{ "type": "object", "required": ["kind"], "properties": { "kind": { "const": "a" } } }] }),
            ),
            prop(
                json!({ "oneOf": [{ "type": "object", "required": ["kind"], "properties": { "kind": { "const": "a" } } }, { "type": "object", "required": ["kind"], "properties": { "kind": { "const": "b" } } }] }),
            ),
            ".xx xxx",
            &[
                "oneof-branch-added",
                "rust-variant-added",
                "rust-variant-removed",
            ],
        ),
        case(
            "oneOf branch removed",
            prop(json!({ "oneOf": [s(), i()] })),
            prop(json!({ "oneOf": [s()] })),
            "x.x xxx",
            &["oneof-branch-removed", "rust-field-type-changed"],
        ),
        case(
            "anyOf became oneOf",
            prop(json!({ "anyOf": [s(), i()] })),
            prop(json!({ "oneOf": [s(), i()] })),
            "x.x x.x",
            &["combinator-changed"],
        ),
        case(
            "allOf branch added",
            prop(json!({ "allOf": [s()] })),
            prop(json!({ "allOf": [s(), { "maxLength": 3 }] })),
            "x.x xxx",
            &["allof-branch-added", "rust-field-type-changed"],
        ),
        case(
            "allOf branch removed",
            prop(json!({ "allOf": [s(), { "maxLength": 3 }] })),
            prop(json!({ "allOf": [s()] })),
            ".xx xxx",
            &["allof-branch-removed", "rust-field-type-changed"],
        ),
        wire_case(
            "not added",
            prop(s()),
            prop(json!({ "type": "string", "not": { "const": "x" } })),
            "x.x",
            &["not-added"],
        ),
        wire_case(
            "not schema widened",
            prop(json!({ "not": s() })),
            prop(json!({ "not": { "type": ["string", "integer"] } })),
            "x.x",
            &["not-changed"],
        ),
        // ---- everything else -----------------------------------------------------------
        case(
            "unknown keyword added",
            prop(s()),
            prop(json!({ "type": "string", "x-unit": "cents" })),
            "xxx xxx",
            &["unknown-keyword"],
        ),
        case(
            "description changed",
            prop(json!({ "type": "string", "description": "a" })),
            prop(json!({ "type": "string", "description": "b" })),
            "... ...",
            &[],
        ),
        case(
            "inner title changed",
            prop(json!({ "type": "object", "title": "Inner", "properties": { "a": s() } })),
            prop(json!({ "type": "object", "title": "Outer", "properties": { "a": s() } })),
            "... xxx",
            &["rust-type-renamed"],
        ),
        case(
            "event title changed",
            prop(s()),
            {
                let mut e = prop(s());
                e["title"] = "Renamed".into();
                e
            },
            "... xxx",
            &["rust-type-renamed"],
        ),
        case(
            "subject property changed",
            event(
                json!({ "id": s(), "other": s() }),
                &["id", "other"],
                json!({ "x-outbox-subject": "id" }),
            ),
            event(
                json!({ "id": s(), "other": s() }),
                &["id", "other"],
                json!({ "x-outbox-subject": "other" }),
            ),
            "... xxx",
            &["rust-subject-changed"],
        ),
    ]
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

#[test]
fn tuples_of_draft_2020_12() {
    let tuple =
        |items: Value| prop(json!({ "type": "array", "prefixItems": items, "items": false }));
    assert_eq!(
        wire(
            tuple(json!([{ "type": "string" }, { "type": "integer" }])),
            tuple(json!([{ "type": "string" }, { "type": "string" }]))
        ),
        [(
            "type-changed",
            "/properties/p/prefixItems/1/type".to_owned(),
            true,
            true
        )]
    );
    // A position added where no item was allowed: old consumers reject the longer arrays.
    assert_eq!(
        wire(
            tuple(json!([{ "type": "string" }])),
            tuple(json!([{ "type": "string" }, { "type": "integer" }]))
        ),
        [(
            "type-changed",
            "/properties/p/prefixItems/1".to_owned(),
            true,
            false
        )]
    );
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

#[test]
fn documentation_does_not_need_the_rust_level() {
    let a = json!({ "description": "a", "properties": { "description": { "type": "string", "examples": ["x"] } } });
    let docs = json!({ "description": "b", "properties": { "description": { "type": "string" } } });
    assert!(same_but_docs(&a, &docs), "only documentation differs");
    // A property named `description` is a property, and `enum` values are data.
    let renamed = json!({ "description": "a", "properties": { "summary": { "type": "string" } } });
    assert!(!same_but_docs(&a, &renamed));
    let data = |v: &str| json!({ "enum": [{ "description": v }] });
    assert!(!same_but_docs(&data("x"), &data("y")));
    assert!(
        !same_but_docs(&json!({ "title": "A" }), &json!({ "title": "B" })),
        "a title names a type"
    );
}
