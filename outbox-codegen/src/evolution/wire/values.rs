//! Small helpers about schema values: merging keywords into a branch, what a schema accepts
//! at a glance (anything, nothing, which types and values), and summing changes up.

use std::collections::BTreeSet;

use crate::evolution::leaf::value_type;
use serde_json::{Map, Value};

use super::ANNOTATIONS;
use crate::evolution::{Breaks, Change};

/// `branch` with the keywords of `rest` added; when both set a keyword differently, both are
/// kept under `allOf`.
pub(super) fn merge(branch: &Value, rest: &Map<String, Value>) -> Value {
    if rest.is_empty() {
        return branch.clone();
    }
    match branch {
        Value::Bool(false) => Value::Bool(false),
        Value::Bool(true) => Value::Object(rest.clone()),
        Value::Object(map) => {
            let mut merged = map.clone();
            for (key, value) in rest {
                match merged.get(key) {
                    None => {
                        merged.insert(key.clone(), value.clone());
                    }
                    Some(existing) if existing == value => {}
                    Some(_) => {
                        return serde_json::json!({
                            "allOf": [Value::Object(rest.clone()), branch.clone()]
                        });
                    }
                }
            }
            Value::Object(merged)
        }
        other => other.clone(),
    }
}

pub(super) fn list(node: &Map<String, Value>, keyword: &str) -> Vec<Value> {
    node.get(keyword)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

pub(super) fn any_key(old: &Map<String, Value>, new: &Map<String, Value>, keys: &[&str]) -> bool {
    keys.iter()
        .any(|k| old.contains_key(*k) || new.contains_key(*k))
}

/// `true`, `{}`, or a schema of annotations only: any value matches.
pub(super) fn is_trivially_true(schema: &Value) -> bool {
    match schema {
        Value::Bool(b) => *b,
        Value::Object(map) => map.keys().all(|k| ANNOTATIONS.contains(&k.as_str())),
        _ => false,
    }
}

/// `false`, or `{ "not": {} }`: no value matches.
pub(super) fn accepts_nothing(schema: &Value) -> bool {
    match schema {
        Value::Bool(b) => !*b,
        Value::Object(map) => map.get("not").is_some_and(is_trivially_true),
        _ => false,
    }
}

/// The types a schema's values can have (`None`: any), as its `type`, `const` or `enum` say.
pub(super) fn types(schema: &Value) -> Option<BTreeSet<String>> {
    let declared: Option<BTreeSet<String>> = match schema.get("type") {
        Some(Value::String(t)) => Some([t.clone()].into()),
        Some(Value::Array(list)) => Some(
            list.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
        ),
        _ => None,
    };
    declared.or_else(|| {
        values(schema).map(|values| values.iter().map(|v| value_type(v).to_owned()).collect())
    })
}

/// Whether two type sets share a value (`integer` is a `number`).
pub(super) fn overlap(a: &BTreeSet<String>, b: &BTreeSet<String>) -> bool {
    let number = |s: &BTreeSet<String>| s.contains("number") || s.contains("integer");
    a.intersection(b).next().is_some()
        || (number(a) && (b.contains("number")) || number(b) && a.contains("number"))
}

/// The values a schema allows when it lists them (`const` or `enum`).
pub(super) fn values(schema: &Value) -> Option<Vec<Value>> {
    if let Some(c) = schema.get("const") {
        return Some(vec![c.clone()]);
    }
    schema.get("enum").and_then(Value::as_array).cloned()
}

/// Whom any of `changes` breaks.
pub(super) fn union(changes: &[Change]) -> Breaks {
    changes
        .iter()
        .fold(Breaks::NONE, |acc, change| acc.or(change.breaks))
}

/// The breaking ones of `changes` in a few words, for a change that sums them up.
pub(super) fn summary(changes: &[Change]) -> String {
    let words: Vec<String> = changes
        .iter()
        .filter(|c| c.breaks.any())
        .map(|c| format!("{} ({})", c.message, c.rule))
        .collect();
    match words.len() {
        0 => "only in annotations".to_owned(),
        1..=3 => words.join("; "),
        n => format!("{}; and {} more", words[..3].join("; "), n - 3),
    }
}
