//! The content model of objects: properties added and removed (open, closed or partially open
//! objects), `patternProperties`, `additionalProperties`, `propertyNames`, the property count
//! and `dependentRequired`.

use std::borrow::Cow;
use std::collections::BTreeSet;

use outbox_schema::pointer::escape_token;
use serde_json::{Map, Value};

use super::refs::has_ref;
use super::values::{accepts_nothing, is_trivially_true, summary, union};
use super::{At, Walker};
use crate::evolution::rules::Rule;
use crate::evolution::Breaks;

impl Walker<'_> {
    pub(super) fn object_model(
        &mut self,
        old: &Map<String, Value>,
        new: &Map<String, Value>,
        at: &At,
    ) {
        let empty = Map::new();
        let old_props = old
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let new_props = new
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let names: BTreeSet<&String> = old_props.keys().chain(new_props.keys()).collect();
        for name in names {
            let here = at.keys("properties", name);
            match (old_props.get(name), new_props.get(name)) {
                (Some(o), Some(n)) => self.node(o, n, &here),
                (Some(o), None) => {
                    let governing = governing(new, name, &at.new);
                    self.property_removed(name, o, governing, &here);
                }
                (None, Some(n)) => {
                    let governing = governing(old, name, &at.old);
                    self.property_added(name, n, governing, &here);
                }
                (None, None) => {}
            }
        }
        self.pattern_properties(old, new, at);
        self.additional_properties(old, new, at);
        for (keyword, min) in [("minProperties", true), ("maxProperties", false)] {
            self.bound(
                keyword,
                old,
                new,
                at,
                min,
                (Rule::PropertyCountTightened, Rule::PropertyCountRelaxed),
            );
        }
        if old.contains_key("propertyNames") || new.contains_key("propertyNames") {
            let any = Value::Bool(true);
            self.node(
                old.get("propertyNames").unwrap_or(&any),
                new.get("propertyNames").unwrap_or(&any),
                &at.key("propertyNames"),
            );
        }
        self.dependent_required(old, new, at);
    }

    fn property_removed(&mut self, name: &str, old: &Value, now: Governing<'_>, here: &At) {
        match now {
            Governing::Closed => {
                if !accepts_nothing(old) {
                    self.push(
                        Rule::PropertyRemovedClosed,
                        here.old.clone(),
                        &here.via,
                        format!("property `{name}` removed, and the object allows no other properties: events that have it are rejected"),
                        Breaks::NEW,
                    );
                }
            }
            Governing::Open => {
                if !is_trivially_true(old) {
                    self.push(
                        Rule::PropertyRemovedOpen,
                        here.old.clone(),
                        &here.via,
                        format!("property `{name}` removed, and the object allows any other property: new events may hold any value under its name"),
                        Breaks::OLD,
                    );
                }
            }
            Governing::Schema(schema, pointer) => {
                let at = At {
                    old: here.old.clone(),
                    new: pointer.clone(),
                    via: here.via.clone(),
                };
                let sub = self.sub(old, &schema, &at);
                let breaks = union(&sub);
                self.push(
                    Rule::PropertyRemovedPartial,
                    here.old.clone(),
                    &here.via,
                    format!(
                        "property `{name}` removed; its name now falls under `{pointer}`, which differs: {}",
                        summary(&sub)
                    ),
                    breaks,
                );
            }
        }
    }

    fn property_added(&mut self, name: &str, new: &Value, was: Governing<'_>, here: &At) {
        match was {
            Governing::Closed => {
                if !accepts_nothing(new) {
                    self.push(
                        Rule::PropertyAddedClosed,
                        here.new.clone(),
                        &here.via,
                        format!("property `{name}` added to an object that allowed no other properties: old consumers reject events that have it"),
                        Breaks::OLD,
                    );
                }
            }
            Governing::Open => {
                if !is_trivially_true(new) {
                    self.push(
                        Rule::PropertyAddedOpen,
                        here.new.clone(),
                        &here.via,
                        format!("property `{name}` added to an object that allowed any other property: older events may hold other values under this name"),
                        Breaks::NEW,
                    );
                }
            }
            Governing::Schema(schema, pointer) => {
                let at = At {
                    old: pointer.clone(),
                    new: here.new.clone(),
                    via: here.via.clone(),
                };
                let sub = self.sub(&schema, new, &at);
                let breaks = union(&sub);
                self.push(
                    Rule::PropertyAddedPartial,
                    here.new.clone(),
                    &here.via,
                    format!(
                        "property `{name}` added; its name fell under `{pointer}`, which differs: {}",
                        summary(&sub)
                    ),
                    breaks,
                );
            }
        }
    }

    fn pattern_properties(&mut self, old: &Map<String, Value>, new: &Map<String, Value>, at: &At) {
        let empty = Map::new();
        let old_patterns = old
            .get("patternProperties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let new_patterns = new
            .get("patternProperties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let patterns: BTreeSet<&String> = old_patterns.keys().chain(new_patterns.keys()).collect();
        for pattern in patterns {
            let here = at.keys("patternProperties", pattern);
            match (old_patterns.get(pattern), new_patterns.get(pattern)) {
                (Some(o), Some(n)) => self.node(o, n, &here),
                (Some(o), None) => {
                    let (rest, pointer) = additional(new, &at.new);
                    let sub = self.sub(
                        o,
                        &rest,
                        &At {
                            new: pointer.clone(),
                            ..here.clone()
                        },
                    );
                    self.push(
                        Rule::PatternPropertyRemoved,
                        here.old.clone(),
                        &here.via,
                        format!(
                            "`patternProperties` `{pattern}` removed; names it matched fall under `{pointer}`, which differs: {}",
                            summary(&sub)
                        ),
                        union(&sub),
                    );
                }
                (None, Some(n)) => {
                    let (rest, pointer) = additional(old, &at.old);
                    let sub = self.sub(
                        &rest,
                        n,
                        &At {
                            old: pointer.clone(),
                            ..here.clone()
                        },
                    );
                    self.push(
                        Rule::PatternPropertyAdded,
                        here.new.clone(),
                        &here.via,
                        format!(
                            "`patternProperties` `{pattern}` added; names it matches fell under `{pointer}`, which differs: {}",
                            summary(&sub)
                        ),
                        union(&sub),
                    );
                }
                (None, None) => {}
            }
        }
    }

    fn additional_properties(
        &mut self,
        old: &Map<String, Value>,
        new: &Map<String, Value>,
        at: &At,
    ) {
        let (o, n) = (
            old.get("additionalProperties"),
            new.get("additionalProperties"),
        );
        if o == n && !o.is_some_and(has_ref) {
            return;
        }
        let here = at.key("additionalProperties");
        let pointer = if n.is_some() {
            here.new.clone()
        } else {
            here.old.clone()
        };
        let (narrowed, widened) = (
            Rule::AdditionalPropertiesNarrowed,
            Rule::AdditionalPropertiesWidened,
        );
        use Model::{Closed, Open, Schema};
        let (rule, message, breaks) = match (Model::of(o), Model::of(n)) {
            (Open, Open) | (Closed, Closed) => return,
            (Schema(o), Schema(n)) => return self.node(o, n, &here),
            (Open, Closed) => (narrowed, "`additionalProperties` became `false`: events with properties not declared here are rejected", Breaks::NEW),
            (Open, Schema(_)) => (narrowed, "`additionalProperties` now gives a schema: undeclared properties of older events may not match it", Breaks::NEW),
            (Schema(_), Closed) => (narrowed, "`additionalProperties` became `false`: undeclared properties its schema allowed are rejected", Breaks::NEW),
            (Closed, Open) => (widened, "`additionalProperties: false` removed: new events may hold undeclared properties, which old consumers reject", Breaks::OLD),
            (Closed, Schema(_)) => (widened, "`additionalProperties` was `false` and now gives a schema: new events may hold undeclared properties, which old consumers reject", Breaks::OLD),
            (Schema(_), Open) => (widened, "`additionalProperties` no longer restricts undeclared properties", Breaks::OLD),
        };
        self.push(rule, pointer, &at.via, message.to_owned(), breaks);
    }

    fn dependent_required(&mut self, old: &Map<String, Value>, new: &Map<String, Value>, at: &At) {
        let deps = |node: &Map<String, Value>, name: &str| -> BTreeSet<String> {
            node.get("dependentRequired")
                .and_then(|d| d.get(name))
                .and_then(Value::as_array)
                .map(|list| {
                    list.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let names: BTreeSet<String> = [old, new]
            .iter()
            .filter_map(|node| node.get("dependentRequired").and_then(Value::as_object))
            .flat_map(|map| map.keys().cloned())
            .collect();
        for name in names {
            let (o, n) = (deps(old, &name), deps(new, &name));
            let here = at.keys("dependentRequired", &name);
            for added in n.difference(&o) {
                self.push(
                    Rule::RequiredAdded,
                    here.new.clone(),
                    &at.via,
                    format!("`{added}` became required when `{name}` is present"),
                    Breaks::NEW,
                );
            }
            for removed in o.difference(&n) {
                self.push(
                    Rule::RequiredRemoved,
                    here.old.clone(),
                    &at.via,
                    format!("`{removed}` is no longer required when `{name}` is present"),
                    Breaks::OLD,
                );
            }
        }
    }
}

/// The schema that applies to property `name` of an object where it is not declared: the
/// `patternProperties` its name matches (all of them, if several), else `additionalProperties`.
enum Governing<'v> {
    Open,
    Closed,
    /// The schema and its pointer.
    Schema(Cow<'v, Value>, String),
}

fn governing<'v>(node: &'v Map<String, Value>, name: &str, at: &str) -> Governing<'v> {
    let matching: Vec<(&String, &Value)> = node
        .get("patternProperties")
        .and_then(Value::as_object)
        .map(|patterns| {
            patterns
                .iter()
                .filter(|(pattern, _)| {
                    regress::Regex::new(pattern).is_ok_and(|re| re.find(name).is_some())
                })
                .collect()
        })
        .unwrap_or_default();
    match matching.as_slice() {
        [] => match Model::of(node.get("additionalProperties")) {
            Model::Open => Governing::Open,
            Model::Closed => Governing::Closed,
            Model::Schema(s) => {
                Governing::Schema(Cow::Borrowed(s), format!("{at}/additionalProperties"))
            }
        },
        [(pattern, schema)] => Governing::Schema(
            Cow::Borrowed(*schema),
            format!("{at}/patternProperties/{}", escape_token(pattern)),
        ),
        [(pattern, _), ..] => Governing::Schema(
            Cow::Owned(serde_json::json!({
                "allOf": matching.iter().map(|(_, s)| (*s).clone()).collect::<Vec<_>>()
            })),
            format!("{at}/patternProperties/{}", escape_token(pattern)),
        ),
    }
}

/// The schema for undeclared property names (`true` when absent) and its pointer.
fn additional(node: &Map<String, Value>, at: &str) -> (Value, String) {
    (
        node.get("additionalProperties")
            .cloned()
            .unwrap_or(Value::Bool(true)),
        format!("{at}/additionalProperties"),
    )
}

/// What `additionalProperties` makes of the content model.
enum Model<'v> {
    Open,
    Closed,
    Schema(&'v Value),
}

impl<'v> Model<'v> {
    fn of(value: Option<&'v Value>) -> Self {
        match value {
            None => Model::Open,
            Some(v) if is_trivially_true(v) => Model::Open,
            Some(Value::Bool(false)) => Model::Closed,
            Some(v) => Model::Schema(v),
        }
    }
}
