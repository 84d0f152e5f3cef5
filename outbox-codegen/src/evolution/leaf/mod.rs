//! The keywords of one schema node that constrain its own value (`type`, `enum`, `const`,
//! `format`, `pattern`, lengths, numeric ranges) and `required`, compared by
//! [`json_schema_diff`].
//!
//! The crate is given one node at a time, cut down to these keywords: no subschemas and no
//! `$ref`s, so its limits do not apply here (it recurses through `$ref`s without a cycle check,
//! ignores `patternProperties`, and reads `additionalProperties` only when both sides set it).
//! The walker of this module's parent does the structure. The crate diffs in one direction
//! (a change is breaking when the new schema rejects a value the old one accepted), so each
//! node is diffed both ways: old to new finds what breaks new consumers, new to old what
//! breaks old consumers.
//!
//! Two things are prepared first. `type` is compared on its own, with the types an `enum` or
//! `const` leaves (`{ "enum": ["a"] }` accepts strings only, so adding `"type": "string"`
//! changes nothing), and the other keywords without `type`, so the crate never splits a
//! multi-type node (when it does, it compares the moved keywords against nothing). A `const`
//! that is an object or an array is compared here, not by the crate, which turns it into
//! property schemas.

mod kinds;

use std::collections::BTreeSet;

use json_schema_diff::ChangeKind;
use serde_json::{Map, Value};

use super::rules::Rule;
use super::Breaks;
use kinds::{describe, mirror};

/// The keywords compared here.
pub(crate) const KEYWORDS: &[&str] = &[
    "type",
    "enum",
    "const",
    "format",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "required",
];

/// One change of a node's own keywords.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LeafChange {
    pub(crate) rule: Rule,
    /// The keyword the change is about (the last token of its pointer).
    pub(crate) keyword: &'static str,
    pub(crate) message: String,
    pub(crate) breaks: Breaks,
}

/// The changes of the keywords in [`KEYWORDS`] between two schema nodes.
pub(crate) fn compare(old: &Map<String, Value>, new: &Map<String, Value>) -> Vec<LeafChange> {
    let mut changes = Vec::new();
    let (old_types, new_types) = (types_of(old), types_of(new));
    if old_types != new_types {
        let mut found = Found::default();
        found.diff(
            &type_view(old_types.as_ref()),
            &type_view(new_types.as_ref()),
            true,
        );
        // One message for the whole set rather than one per type added or removed.
        for mut change in found.group() {
            if change.rule == Rule::TypeChanged {
                change.message = format!(
                    "type {} became {}",
                    types_text(old_types.as_ref()),
                    types_text(new_types.as_ref())
                );
            }
            changes.push(change);
        }
    }
    let (old_rest, new_rest) = (rest_view(old), rest_view(new));
    let mut found = Found::default();
    if old_rest != new_rest {
        found.diff(&old_rest, &new_rest, false);
    }
    compare_structured_const(old, new, &mut found.changes);
    changes.extend(found.group());
    changes
}

/// `string`, `string or null`, `any`, `nothing`.
fn types_text(types: Option<&BTreeSet<&'static str>>) -> String {
    match types {
        None => "any".to_owned(),
        Some(types) if types.is_empty() => "nothing".to_owned(),
        Some(types) => types
            .iter()
            .map(|t| format!("`{t}`"))
            .collect::<Vec<_>>()
            .join(" or "),
    }
}

/// The types a node's values can have: its `type`, narrowed to the types of its `enum` or
/// `const` values when it has one. `None` is any type.
fn types_of(node: &Map<String, Value>) -> Option<BTreeSet<&'static str>> {
    let declared: Option<BTreeSet<&'static str>> = node.get("type").map(|t| match t {
        Value::String(s) => type_name(s).into_iter().collect(),
        Value::Array(list) => list
            .iter()
            .filter_map(Value::as_str)
            .filter_map(type_name)
            .collect(),
        _ => BTreeSet::new(),
    });
    let values: Option<Vec<&Value>> = match (node.get("const"), node.get("enum")) {
        (Some(c), _) => Some(vec![c]),
        (None, Some(Value::Array(list))) => Some(list.iter().collect()),
        _ => None,
    };
    let Some(values) = values else {
        return declared;
    };
    let mut types = BTreeSet::new();
    for value in values {
        let own = value_type(value);
        let allowed = match &declared {
            None => Some(own),
            Some(declared) if declared.contains(own) => Some(own),
            // An integral number is an integer; `number` also accepts integers.
            Some(declared) if own == "integer" && declared.contains("number") => Some("number"),
            Some(declared) if own == "number" && declared.contains("integer") => value
                .as_f64()
                .is_some_and(|f| f.fract() == 0.0)
                .then_some("integer"),
            Some(_) => None,
        };
        types.extend(allowed);
    }
    Some(types)
}

fn type_name(name: &str) -> Option<&'static str> {
    Some(match name {
        "string" => "string",
        "number" => "number",
        "integer" => "integer",
        "object" => "object",
        "array" => "array",
        "boolean" => "boolean",
        "null" => "null",
        _ => return None,
    })
}

/// The JSON Schema type of a JSON value (`integer` for whole numbers).
pub(in crate::evolution) fn value_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `{ "type": [..] }` for a set of types, `{}` for any, and a schema nothing matches for none.
fn type_view(types: Option<&BTreeSet<&'static str>>) -> Value {
    match types {
        None => Value::Object(Map::new()),
        Some(types) if types.is_empty() => serde_json::json!({ "not": {} }),
        Some(types) => serde_json::json!({ "type": types.iter().collect::<Vec<_>>() }),
    }
}

/// The node's keywords of [`KEYWORDS`] other than `type`; an object or array `const` is left
/// out (see [`compare_structured_const`]).
fn rest_view(node: &Map<String, Value>) -> Value {
    let mut view = Map::new();
    for &keyword in &KEYWORDS[1..] {
        if let Some(value) = node.get(keyword) {
            if keyword == "const" && (value.is_object() || value.is_array()) {
                continue;
            }
            view.insert(keyword.to_owned(), value.clone());
        }
    }
    Value::Object(view)
}

/// A `const` that is an object or an array: added, removed or changed.
fn compare_structured_const(
    old: &Map<String, Value>,
    new: &Map<String, Value>,
    changes: &mut Vec<LeafChange>,
) {
    let structured = |v: Option<&Value>| v.filter(|v| v.is_object() || v.is_array()).cloned();
    let (o, n) = (structured(old.get("const")), structured(new.get("const")));
    if o == n {
        return;
    }
    let (message, breaks) = match (&o, &n) {
        (None, Some(n)) if old.get("const").is_none() => {
            (format!("`const` {} added", short(n)), Breaks::NEW)
        }
        (Some(o), None) if new.get("const").is_none() => {
            (format!("`const` {} removed", short(o)), Breaks::OLD)
        }
        _ => (
            format!(
                "`const` {} became {}",
                old.get("const").map_or_else(|| "(none)".into(), short),
                new.get("const").map_or_else(|| "(none)".into(), short)
            ),
            Breaks::BOTH,
        ),
    };
    changes.push(LeafChange {
        rule: Rule::ConstChanged,
        keyword: "const",
        message,
        breaks,
    });
}

/// Changes found so far, before grouping.
#[derive(Default)]
struct Found {
    changes: Vec<LeafChange>,
}

impl Found {
    /// Diffs `old` against `new` both ways and records every change in old-to-new terms, with
    /// the consumers each direction breaks. In the type view only type changes count, in the
    /// other view only the others.
    fn diff(&mut self, old: &Value, new: &Value, types: bool) {
        let keep = |kind: &ChangeKind| {
            matches!(
                kind,
                ChangeKind::TypeAdd { .. } | ChangeKind::TypeRemove { .. }
            ) == types
        };
        let run = |a: &Value, b: &Value| -> Option<Vec<ChangeKind>> {
            json_schema_diff::diff(a.clone(), b.clone())
                .ok()
                .map(|changes| {
                    changes
                        .into_iter()
                        .map(|c| c.change)
                        .filter(|k| keep(k))
                        .collect()
                })
        };
        let (Some(forward), Some(mut backward)) = (run(old, new), run(new, old)) else {
            // The views are plain JSON Schema; should the crate refuse one anyway, the change
            // is reported as not understood rather than passed.
            self.changes.push(LeafChange {
                rule: Rule::UnknownKeyword,
                keyword: if types { "type" } else { "enum" },
                message: format!(
                    "{} became {}; the check could not compare them, so the change is treated as breaking",
                    short(old),
                    short(new)
                ),
                breaks: Breaks::BOTH,
            });
            return;
        };
        for kind in forward {
            let mirror = mirror(&kind);
            let old_consumers = match backward.iter().position(|k| *k == mirror) {
                Some(i) => backward.swap_remove(i).is_breaking(),
                None => false,
            };
            let breaks = Breaks {
                old_consumers,
                new_consumers: kind.is_breaking(),
            };
            self.record(&kind, breaks);
        }
        // Whatever only the reverse diff saw, in old-to-new terms.
        for kind in backward {
            let breaks = Breaks {
                old_consumers: kind.is_breaking(),
                new_consumers: false,
            };
            self.record(&mirror(&kind), breaks);
        }
    }

    fn record(&mut self, kind: &ChangeKind, breaks: Breaks) {
        if let Some((rule, keyword, message)) = describe(kind, breaks) {
            self.changes.push(LeafChange {
                rule,
                keyword,
                message,
                breaks,
            });
        }
    }

    /// One change per rule and keyword: the messages joined, the consumers combined.
    fn group(self) -> Vec<LeafChange> {
        let mut grouped: Vec<LeafChange> = Vec::new();
        for change in self.changes {
            match grouped
                .iter_mut()
                .find(|g| g.rule == change.rule && g.keyword == change.keyword)
            {
                Some(g) => {
                    if !g.message.contains(&change.message) {
                        g.message = format!("{}; {}", g.message, change.message);
                    }
                    g.breaks = g.breaks.or(change.breaks);
                }
                None => grouped.push(change),
            }
        }
        grouped
    }
}

/// A bound as written: `1`, not `1.0`.
pub(crate) fn number_text(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        format!("{value}")
    }
}

/// A JSON value for a message, cut at 60 characters.
pub(crate) fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 60 {
        format!("{}...", text.chars().take(57).collect::<String>())
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn leaf(old: Value, new: Value) -> Vec<(Rule, &'static str, bool, bool)> {
        compare(old.as_object().unwrap(), new.as_object().unwrap())
            .into_iter()
            .map(|c| {
                (
                    c.rule,
                    c.keyword,
                    c.breaks.old_consumers,
                    c.breaks.new_consumers,
                )
            })
            .collect()
    }

    #[test]
    fn types_from_enums_and_consts() {
        let t = |v: Value| types_of(v.as_object().unwrap());
        assert_eq!(t(json!({})), None);
        assert_eq!(
            t(json!({ "enum": ["a", 1, null] })),
            Some(["integer", "null", "string"].into_iter().collect())
        );
        assert_eq!(
            t(json!({ "type": "number", "enum": [1, 2.5] })),
            Some(["number"].into_iter().collect())
        );
        assert_eq!(
            t(json!({ "type": "string", "const": 3 })),
            Some(BTreeSet::new())
        );
    }

    #[test]
    fn a_type_an_enum_already_implies_changes_nothing() {
        assert_eq!(
            leaf(
                json!({ "enum": ["a", "b"] }),
                json!({ "type": "string", "enum": ["a", "b"] })
            ),
            []
        );
    }

    #[test]
    fn both_directions_are_found() {
        assert_eq!(
            leaf(json!({ "type": "string" }), json!({ "type": "integer" })),
            [(Rule::TypeChanged, "type", true, true)]
        );
        assert_eq!(
            leaf(json!({ "type": "integer" }), json!({ "type": "number" })),
            [(Rule::TypeChanged, "type", true, false)]
        );
        assert_eq!(
            leaf(json!({ "enum": ["a", "b"] }), json!({ "enum": ["a", "c"] })),
            [
                (Rule::EnumValueRemoved, "enum", false, true),
                (Rule::EnumValueAdded, "enum", true, false)
            ]
        );
        assert_eq!(
            leaf(json!({ "maxLength": 5 }), json!({ "maxLength": 3 })),
            [(Rule::LengthTightened, "maxLength", false, true)]
        );
        assert_eq!(
            leaf(json!({ "minimum": 1 }), json!({ "exclusiveMinimum": 1 })),
            [(Rule::NumericBoundTightened, "exclusiveMinimum", false, true)]
        );
        assert_eq!(
            leaf(
                json!({ "const": { "a": 1 } }),
                json!({ "const": { "a": 2 } })
            ),
            [(Rule::ConstChanged, "const", true, true)]
        );
    }

    #[test]
    fn multi_type_nodes_keep_their_other_keywords() {
        // json-schema-diff splits `["string", "null"]` into branches and would see
        // `maxLength` appear from nowhere.
        assert_eq!(
            leaf(
                json!({ "type": ["string", "null"], "maxLength": 5 }),
                json!({ "type": "string", "maxLength": 5 })
            ),
            [(Rule::TypeChanged, "type", false, true)]
        );
    }
}
