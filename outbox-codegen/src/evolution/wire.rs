//! The wire comparison: the released schema and the current one walked side by side, every
//! difference classified by a [`Rule`] and by whom it breaks.
//!
//! A change *narrows* when the current schema rejects a value the released one accepted: a new
//! consumer (validating or decoding with the current schema) cannot read an event published
//! before, which breaks `backward`. It *widens* when the current schema accepts a value the
//! released one rejected: an old consumer cannot read an event published after, which breaks
//! `forward`. `full` is both. Where the check cannot tell (a regular expression changed, a
//! keyword it does not know), it says both.
//!
//! Each node's own keywords (`type`, `enum`, `const`, `format`, `pattern`, lengths, ranges,
//! `required`) go to [`leaf`], which hands them to `json-schema-diff`. The structure is
//! walked here:
//!
//! - **Content model.** For every property name on either side, the schema that applies to it
//!   on each side is compared: the declared property, else the `patternProperties` its name
//!   matches, else `additionalProperties` (absent means any value: an *open* model; `false` a
//!   *closed* one; a schema a *partially open* one). A property added to an open model narrows
//!   (older events may hold anything under that name), added to a closed one widens (old
//!   consumers reject the new property), added to a partially open one is compared with the
//!   schema its name had. Removal is the mirror image.
//! - **Arrays.** Each tuple position (`prefixItems`, or draft-07's array `items`) is compared
//!   with the schema it has on the other side (its tuple entry or the rest schema), then the
//!   rest schemas; `minItems`, `maxItems`, `minContains`, `maxContains`, `uniqueItems`,
//!   `contains`.
//! - **`$ref`.** Followed on both sides, with the keywords beside it (which apply too, as in
//!   draft 2020-12). Each pair of targets is compared once, so recursive schemas end; a change
//!   inside a definition is reported at the definition, with the place it was reached from.
//!   When only one side is a reference, its target is compared with the other side inline.
//! - **Combinators.** `allOf` branches are paired (equal ones first, then the most alike) and
//!   compared; an added branch narrows, a removed one widens. `anyOf` and `oneOf` are
//!   disjunctions: each side becomes its list of branches with the keywords beside the
//!   combinator merged in (a node without one is a list of itself), so `{type: string}` to
//!   `{anyOf: [{type: string}, {type: null}]}` is one branch added, not a rewrite. A removed
//!   branch narrows only if no branch on the other side accepts all it accepted; an added one
//!   widens only if no old branch covers it. A `oneOf` branch added that may overlap another
//!   (not told apart by type, by `const`/`enum` values or by a required discriminator
//!   property) also narrows: a value matching both fails `oneOf`. `not` reverses the change
//!   under it.
//! - **Everything else** is an annotation (`title`, `description`, `examples`, `default`, ...:
//!   a note, never breaking) or a keyword the check does not understand (`if`/`then`/`else`,
//!   `unevaluatedProperties`, `dependentSchemas`, extensions, ...): when it differs, it is
//!   reported as `unknown-keyword` and breaks both.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashSet};

use outbox_schema::pointer::{escape_token, percent_decode};
use serde_json::{Map, Value};

use super::leaf::{self, number_text, short};
use super::rules::Rule;
use super::{Breaks, Change};

/// Compares the released schema `old` with the current schema `new` (both self-contained:
/// every `$ref` local).
pub(crate) fn compare(old: &Value, new: &Value) -> Vec<Change> {
    if old == new {
        return Vec::new();
    }
    let mut walker = Walker::new(old, new);
    walker.node(old, new, &At::root());
    walker.changes
}

/// Keywords about a node's own value, compared by [`leaf`].
const OBJECT_KEYWORDS: &[&str] = &[
    "properties",
    "patternProperties",
    "additionalProperties",
    "minProperties",
    "maxProperties",
    "propertyNames",
    "dependentRequired",
];
const ARRAY_KEYWORDS: &[&str] = &[
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
];
const OTHER_KEYWORDS: &[&str] = &[
    "multipleOf",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "$ref",
    // Containers of definitions: compared where a `$ref` reaches them.
    "$defs",
    "definitions",
];
/// Keywords that document and never validate.
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "$comment",
    "examples",
    "default",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$schema",
    "$id",
    "$anchor",
    "x-outbox-subject",
];

/// A depth no real schema reaches; past it the comparison stops and says so.
const MAX_DEPTH: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Draft {
    Draft7,
    Draft202012,
}

fn draft_of(root: &Value) -> Draft {
    match root.get("$schema").and_then(Value::as_str) {
        Some(uri) if uri.contains("draft-07") || uri.contains("draft-06") => Draft::Draft7,
        _ => Draft::Draft202012,
    }
}

/// Where the walk is: the pointer in the released schema, the pointer in the current one,
/// and the place a `$ref` was followed from, if any.
#[derive(Debug, Clone)]
pub(crate) struct At {
    old: String,
    new: String,
    via: Option<String>,
}

impl At {
    fn root() -> Self {
        At {
            old: String::new(),
            new: String::new(),
            via: None,
        }
    }

    fn key(&self, key: &str) -> At {
        let token = escape_token(key);
        At {
            old: format!("{}/{token}", self.old),
            new: format!("{}/{token}", self.new),
            via: self.via.clone(),
        }
    }

    fn keys(&self, first: &str, second: &str) -> At {
        self.key(first).key(second)
    }

    /// Where a `$ref` jumps to: the targets' pointers, reached from here.
    fn jump(&self, old: String, new: String) -> At {
        At {
            via: Some(self.via.clone().unwrap_or_else(|| self.new.clone())),
            old,
            new,
        }
    }
}

struct Walker<'r> {
    old_root: &'r Value,
    new_root: &'r Value,
    old_draft: Draft,
    new_draft: Draft,
    /// Pairs of (released, current) pointers already compared through a `$ref`.
    seen: HashSet<(String, String)>,
    changes: Vec<Change>,
    depth: usize,
}

impl<'r> Walker<'r> {
    fn new(old_root: &'r Value, new_root: &'r Value) -> Self {
        Walker {
            old_root,
            new_root,
            old_draft: draft_of(old_root),
            new_draft: draft_of(new_root),
            seen: HashSet::new(),
            changes: Vec::new(),
            depth: 0,
        }
    }

    /// The changes between `old` and `new` on their own, without reporting them: for
    /// decisions (is this branch covered?) and for changes summarized into one.
    fn sub(&self, old: &Value, new: &Value, at: &At) -> Vec<Change> {
        let mut walker = Walker {
            old_root: self.old_root,
            new_root: self.new_root,
            old_draft: self.old_draft,
            new_draft: self.new_draft,
            seen: HashSet::new(),
            changes: Vec::new(),
            depth: self.depth,
        };
        walker.node(old, new, at);
        walker.changes
    }

    fn push(
        &mut self,
        rule: Rule,
        pointer: String,
        via: &Option<String>,
        message: String,
        breaks: Breaks,
    ) {
        if !breaks.any() && rule != Rule::AnnotationChanged {
            return;
        }
        self.changes.push(Change {
            rule,
            pointer,
            via: via.clone(),
            message,
            breaks,
        });
    }

    /// Compares two schemas (objects or booleans) at `at`.
    fn node(&mut self, old: &Value, new: &Value, at: &At) {
        if old == new && !has_ref(old) {
            return;
        }
        if self.depth >= MAX_DEPTH {
            self.push(
                Rule::UnknownKeyword,
                at.new.clone(),
                &at.via,
                format!("the schemas nest deeper than {MAX_DEPTH} levels here; the check stops and treats the rest as breaking"),
                Breaks::BOTH,
            );
            return;
        }
        self.depth += 1;
        let (old_ref, new_ref) = (ref_of(old), ref_of(new));
        if old_ref.is_some() || new_ref.is_some() {
            self.references(old, new, old_ref, new_ref, at);
        } else {
            match (old, new) {
                (Value::Object(o), Value::Object(n)) => self.objects(o, n, at),
                _ => self.booleans(old, new, at),
            }
        }
        self.depth -= 1;
    }

    /// At least one side is `true` or `false` (or not a schema at all).
    fn booleans(&mut self, old: &Value, new: &Value, at: &At) {
        let empty = Map::new();
        match (old == &Value::Bool(false), new == &Value::Bool(false)) {
            (true, true) => {}
            (true, false) => self.push(
                Rule::TypeChanged,
                at.new.clone(),
                &at.via,
                "no value was allowed here, now some are".into(),
                Breaks::OLD,
            ),
            (false, true) => self.push(
                Rule::TypeChanged,
                at.new.clone(),
                &at.via,
                "no value is allowed here any more".into(),
                Breaks::NEW,
            ),
            (false, false) => self.objects(
                old.as_object().unwrap_or(&empty),
                new.as_object().unwrap_or(&empty),
                at,
            ),
        }
    }

    /// At least one side is a `$ref` (with or without keywords beside it).
    fn references(
        &mut self,
        old: &Value,
        new: &Value,
        old_ref: Option<&str>,
        new_ref: Option<&str>,
        at: &At,
    ) {
        let mut targets = [None, None];
        for (slot, reference, root, pointer) in [
            (0, old_ref, self.old_root, &at.old),
            (1, new_ref, self.new_root, &at.new),
        ] {
            let Some(reference) = reference else { continue };
            match resolve(root, reference) {
                Some(target) => targets[slot] = Some(target),
                None => {
                    self.push(
                        Rule::UnknownKeyword,
                        format!("{pointer}/$ref"),
                        &at.via,
                        format!("`$ref` `{reference}` does not resolve; the check cannot compare it, so it is treated as breaking"),
                        Breaks::BOTH,
                    );
                    return;
                }
            }
        }
        let [old_target, new_target] = targets;
        match (old_target, new_target) {
            (Some((old_at, old_def)), Some((new_at, new_def))) => {
                if self.seen.insert((old_at.clone(), new_at.clone())) {
                    self.node(old_def, new_def, &at.jump(old_at, new_at));
                }
                // The keywords beside `$ref` apply as well.
                let (old_rest, new_rest) = (siblings(old), siblings(new));
                if old_rest != new_rest {
                    self.objects(&old_rest, &new_rest, at);
                }
            }
            (Some((old_at, old_def)), None) => {
                if self.seen.insert((old_at.clone(), at.new.clone())) {
                    let merged = merge(old_def, &siblings(old));
                    let jumped = At {
                        old: old_at,
                        new: at.new.clone(),
                        via: at.via.clone(),
                    };
                    self.node(&merged, new, &jumped);
                }
            }
            (None, Some((new_at, new_def))) => {
                if self.seen.insert((at.old.clone(), new_at.clone())) {
                    let merged = merge(new_def, &siblings(new));
                    self.node(old, &merged, &at.jump(at.old.clone(), new_at));
                }
            }
            (None, None) => {}
        }
    }

    fn objects(&mut self, old: &Map<String, Value>, new: &Map<String, Value>, at: &At) {
        if is_disjunction(old) || is_disjunction(new) {
            self.disjunction(old, new, at);
        } else {
            self.keywords(old, new, at);
        }
    }

    /// Two schema objects without `anyOf`/`oneOf`, keyword by keyword.
    fn keywords(&mut self, old: &Map<String, Value>, new: &Map<String, Value>, at: &At) {
        for change in leaf::compare(old, new) {
            let pointer = if new.contains_key(change.keyword) {
                format!("{}/{}", at.new, change.keyword)
            } else {
                format!("{}/{}", at.old, change.keyword)
            };
            self.push(change.rule, pointer, &at.via, change.message, change.breaks);
        }
        if any_key(old, new, OBJECT_KEYWORDS) {
            self.object_model(old, new, at);
        }
        if any_key(old, new, ARRAY_KEYWORDS) {
            self.array_model(old, new, at);
        }
        self.multiple_of(old, new, at);
        self.all_of(old, new, at);
        self.not(old, new, at);
        self.others(old, new, at);
    }

    // ---- objects ----------------------------------------------------------------------

    fn object_model(&mut self, old: &Map<String, Value>, new: &Map<String, Value>, at: &At) {
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

    // ---- arrays -----------------------------------------------------------------------

    fn array_model(&mut self, old: &Map<String, Value>, new: &Map<String, Value>, at: &At) {
        let any = Value::Bool(true);
        let (old_tuple, old_rest) = tuple_view(old, self.old_draft);
        let (new_tuple, new_rest) = tuple_view(new, self.new_draft);
        let rest_at = |rest: &Option<(&str, &Value)>, base: &str| {
            format!("{base}/{}", rest.map_or("items", |(k, _)| k))
        };
        let (old_rest_at, new_rest_at) = (rest_at(&old_rest, &at.old), rest_at(&new_rest, &at.new));
        let old_rest_schema = old_rest.map_or(&any, |(_, v)| v);
        let new_rest_schema = new_rest.map_or(&any, |(_, v)| v);
        for i in 0..old_tuple.len().max(new_tuple.len()) {
            let (o, o_at) = match old_tuple.get(i) {
                Some((key, v)) => (*v, format!("{}/{key}/{i}", at.old)),
                None => (old_rest_schema, old_rest_at.clone()),
            };
            let (n, n_at) = match new_tuple.get(i) {
                Some((key, v)) => (*v, format!("{}/{key}/{i}", at.new)),
                None => (new_rest_schema, new_rest_at.clone()),
            };
            let here = At {
                old: o_at,
                new: n_at,
                via: at.via.clone(),
            };
            self.node(o, n, &here);
        }
        let here = At {
            old: old_rest_at,
            new: new_rest_at,
            via: at.via.clone(),
        };
        self.node(old_rest_schema, new_rest_schema, &here);
        let items = (Rule::ItemBoundTightened, Rule::ItemBoundRelaxed);
        for (keyword, min) in [
            ("minItems", true),
            ("maxItems", false),
            ("minContains", true),
            ("maxContains", false),
        ] {
            self.bound(keyword, old, new, at, min, items);
        }
        let unique =
            |node: &Map<String, Value>| node.get("uniqueItems") == Some(&Value::Bool(true));
        match (unique(old), unique(new)) {
            (false, true) => self.push(
                Rule::UniqueItemsAdded,
                format!("{}/uniqueItems", at.new),
                &at.via,
                "`uniqueItems` added: arrays with repeated items are rejected".into(),
                Breaks::NEW,
            ),
            (true, false) => self.push(
                Rule::UniqueItemsRemoved,
                format!("{}/uniqueItems", at.old),
                &at.via,
                "`uniqueItems` removed: items may repeat".into(),
                Breaks::OLD,
            ),
            _ => {}
        }
        match (old.get("contains"), new.get("contains")) {
            (None, Some(_)) => self.push(
                Rule::ContainsAdded,
                format!("{}/contains", at.new),
                &at.via,
                "`contains` added: arrays without a matching item are rejected".into(),
                Breaks::NEW,
            ),
            (Some(_), None) => self.push(
                Rule::ContainsRemoved,
                format!("{}/contains", at.old),
                &at.via,
                "`contains` removed".into(),
                Breaks::OLD,
            ),
            (Some(o), Some(n)) => self.node(o, n, &at.key("contains")),
            (None, None) => {}
        }
    }

    // ---- numbers and bounds -----------------------------------------------------------

    /// A `min*` (absent: 0, or 1 for `minContains`) or `max*` (absent: no bound) keyword.
    fn bound(
        &mut self,
        keyword: &str,
        old: &Map<String, Value>,
        new: &Map<String, Value>,
        at: &At,
        is_min: bool,
        (tightened, relaxed): (Rule, Rule),
    ) {
        let (o, n) = (
            old.get(keyword).and_then(Value::as_f64),
            new.get(keyword).and_then(Value::as_f64),
        );
        let absent = if keyword == "minContains" { 1.0 } else { 0.0 };
        let effective = |v: Option<f64>| v.unwrap_or(if is_min { absent } else { f64::INFINITY });
        let (oe, ne) = (effective(o), effective(n));
        if oe == ne {
            return;
        }
        let tight = if is_min { ne > oe } else { ne < oe };
        let message = match (o, n) {
            (Some(o), Some(n)) => format!("{keyword} {} became {}", number_text(o), number_text(n)),
            (None, Some(n)) => format!("{keyword} {} added", number_text(n)),
            (Some(o), None) => format!("{keyword} {} removed", number_text(o)),
            (None, None) => return,
        };
        let pointer = if n.is_some() {
            format!("{}/{keyword}", at.new)
        } else {
            format!("{}/{keyword}", at.old)
        };
        let (rule, breaks) = if tight {
            (tightened, Breaks::NEW)
        } else {
            (relaxed, Breaks::OLD)
        };
        self.push(rule, pointer, &at.via, message, breaks);
    }

    fn multiple_of(&mut self, old: &Map<String, Value>, new: &Map<String, Value>, at: &At) {
        let (o, n) = (
            old.get("multipleOf").and_then(Value::as_f64),
            new.get("multipleOf").and_then(Value::as_f64),
        );
        let pointer = if n.is_some() {
            format!("{}/multipleOf", at.new)
        } else {
            format!("{}/multipleOf", at.old)
        };
        let (tightened, relaxed) = match (o, n) {
            (None, None) => return,
            (Some(o), Some(n)) if o == n => return,
            (None, Some(_)) => (true, false),
            (Some(_), None) => (false, true),
            // Every multiple of `o` is a multiple of `n` when `o` is a multiple of `n`.
            (Some(o), Some(n)) => (!is_multiple(o, n), !is_multiple(n, o)),
        };
        let text = |v: Option<f64>| v.map_or_else(|| "(none)".to_owned(), number_text);
        let message = format!("multipleOf {} became {}", text(o), text(n));
        if tightened {
            self.push(
                Rule::MultipleOfTightened,
                pointer.clone(),
                &at.via,
                message.clone(),
                Breaks::NEW,
            );
        }
        if relaxed {
            self.push(
                Rule::MultipleOfRelaxed,
                pointer,
                &at.via,
                message,
                Breaks::OLD,
            );
        }
    }

    // ---- combinators ------------------------------------------------------------------

    fn all_of(&mut self, old: &Map<String, Value>, new: &Map<String, Value>, at: &At) {
        let (o, n) = (list(old, "allOf"), list(new, "allOf"));
        if o.is_empty() && n.is_empty() {
            return;
        }
        let o_at: Vec<String> = (0..o.len())
            .map(|i| format!("{}/allOf/{i}", at.old))
            .collect();
        let n_at: Vec<String> = (0..n.len())
            .map(|j| format!("{}/allOf/{j}", at.new))
            .collect();
        for pair in self.pair(&o, &n, &o_at, &n_at, at) {
            match pair {
                (Some(i), Some(j)) => {
                    let here = At {
                        old: o_at[i].clone(),
                        new: n_at[j].clone(),
                        via: at.via.clone(),
                    };
                    self.node(&o[i], &n[j], &here);
                }
                (Some(i), None) if !is_trivially_true(&o[i]) => self.push(
                    Rule::AllOfBranchRemoved,
                    o_at[i].clone(),
                    &at.via,
                    format!(
                        "`allOf` branch {} removed: values no longer have to match it",
                        short(&o[i])
                    ),
                    Breaks::OLD,
                ),
                (None, Some(j)) if !is_trivially_true(&n[j]) => self.push(
                    Rule::AllOfBranchAdded,
                    n_at[j].clone(),
                    &at.via,
                    format!(
                        "`allOf` branch {} added: every value must also match it",
                        short(&n[j])
                    ),
                    Breaks::NEW,
                ),
                _ => {}
            }
        }
    }

    /// `anyOf`/`oneOf` on at least one side: branch lists compared as disjunctions.
    fn disjunction(&mut self, old: &Map<String, Value>, new: &Map<String, Value>, at: &At) {
        let (old_kind, o) = branches(old);
        let (new_kind, n) = branches(new);
        let o_at: Vec<String> = at_of(old_kind, o.len(), &at.old);
        let n_at: Vec<String> = at_of(new_kind, n.len(), &at.new);
        match (old_kind, new_kind) {
            (Some("anyOf"), Some("oneOf")) => self.push(
                Rule::CombinatorChanged,
                format!("{}/oneOf", at.new),
                &at.via,
                "`anyOf` became `oneOf`: a value matching several branches is now rejected".into(),
                Breaks::NEW,
            ),
            (Some("oneOf"), Some("anyOf")) => self.push(
                Rule::CombinatorChanged,
                format!("{}/anyOf", at.new),
                &at.via,
                "`oneOf` became `anyOf`: a value may now match several branches".into(),
                Breaks::OLD,
            ),
            _ => {}
        }
        let (one_of_old, one_of_new) = (old_kind == Some("oneOf"), new_kind == Some("oneOf"));
        for pair in self.pair(&o, &n, &o_at, &n_at, at) {
            match pair {
                (Some(i), Some(j)) => {
                    let here = At {
                        old: o_at[i].clone(),
                        new: n_at[j].clone(),
                        via: at.via.clone(),
                    };
                    self.node(&o[i], &n[j], &here);
                }
                (Some(i), None) => {
                    let covered = (0..n.len()).any(|j| {
                        let here = At {
                            old: o_at[i].clone(),
                            new: n_at[j].clone(),
                            via: at.via.clone(),
                        };
                        !union(&self.sub(&o[i], &n[j], &here)).new_consumers
                    });
                    // Values that matched this branch and another failed `oneOf`; without
                    // it they pass.
                    let overlapped = one_of_old
                        && (0..o.len()).any(|k| k != i && !self.disjoint(&o[i], &o[k], true));
                    let mut breaks = Breaks::NONE;
                    let mut words = Vec::new();
                    if !covered {
                        breaks.new_consumers = true;
                        words.push("values it accepted match no branch now");
                    }
                    if overlapped {
                        breaks.old_consumers = true;
                        words.push("it may overlap another branch, and values matching both, rejected by `oneOf` before, now pass");
                    }
                    let rule = if one_of_old {
                        Rule::OneOfBranchRemoved
                    } else {
                        Rule::AnyOfBranchRemoved
                    };
                    self.push(
                        rule,
                        o_at[i].clone(),
                        &at.via,
                        format!("branch {} removed: {}", short(&o[i]), words.join("; ")),
                        breaks,
                    );
                }
                (None, Some(j)) => {
                    let covered = (0..o.len()).any(|i| {
                        let here = At {
                            old: o_at[i].clone(),
                            new: n_at[j].clone(),
                            via: at.via.clone(),
                        };
                        !union(&self.sub(&o[i], &n[j], &here)).old_consumers
                    });
                    let overlaps = one_of_new
                        && (0..n.len()).any(|k| k != j && !self.disjoint(&n[j], &n[k], false));
                    let mut breaks = Breaks::NONE;
                    let mut words = Vec::new();
                    if !covered {
                        breaks.old_consumers = true;
                        words.push("old consumers reject the values it adds");
                    }
                    if overlaps {
                        breaks.new_consumers = true;
                        words.push(
                            "it may overlap another branch, and a value matching two fails `oneOf`",
                        );
                    }
                    let rule = if one_of_new {
                        Rule::OneOfBranchAdded
                    } else {
                        Rule::AnyOfBranchAdded
                    };
                    self.push(
                        rule,
                        n_at[j].clone(),
                        &at.via,
                        format!("branch {} added: {}", short(&n[j]), words.join("; ")),
                        breaks,
                    );
                }
                (None, None) => {}
            }
        }
    }

    /// Pairs the branches of two lists: equal ones first, then each remaining old branch with
    /// the remaining new one it differs least from (in order, ties to the first). Unpaired
    /// branches come with `None` on the other side.
    fn pair(
        &self,
        old: &[Value],
        new: &[Value],
        old_at: &[String],
        new_at: &[String],
        at: &At,
    ) -> Vec<(Option<usize>, Option<usize>)> {
        let mut pairs = Vec::new();
        let mut free_new: Vec<usize> = (0..new.len()).collect();
        let mut free_old = Vec::new();
        for (i, o) in old.iter().enumerate() {
            match free_new.iter().position(|&j| &new[j] == o) {
                Some(k) => pairs.push((Some(i), Some(free_new.remove(k)))),
                None => free_old.push(i),
            }
        }
        for i in free_old {
            let best = free_new
                .iter()
                .enumerate()
                .map(|(k, &j)| {
                    let here = At {
                        old: old_at[i].clone(),
                        new: new_at[j].clone(),
                        via: at.via.clone(),
                    };
                    (self.sub(&old[i], &new[j], &here).len(), k)
                })
                .min();
            // A branch that differs in its type from every remaining one is removed, not
            // changed: pairing it would report its replacement as a rewrite of it.
            match best {
                Some((_, k)) if self.alike(&old[i], &new[free_new[k]]) => {
                    pairs.push((Some(i), Some(free_new.remove(k))))
                }
                _ => pairs.push((Some(i), None)),
            }
        }
        pairs.extend(free_new.into_iter().map(|j| (None, Some(j))));
        pairs
    }

    /// Whether two branches can be the same branch changed: their types overlap.
    fn alike(&self, old: &Value, new: &Value) -> bool {
        let (o, n) = (self.flat(old, true), self.flat(new, false));
        match (types(&o), types(&n)) {
            (Some(a), Some(b)) => overlap(&a, &b),
            _ => true,
        }
    }

    /// Whether no value can match both branches (of the released schema with `old`), told
    /// apart by type, by `const`/`enum` values, or by a property both require with disjoint
    /// values.
    fn disjoint(&self, a: &Value, b: &Value, old: bool) -> bool {
        let (a, b) = (self.flat(a, old), self.flat(b, old));
        if let (Some(ta), Some(tb)) = (types(&a), types(&b)) {
            if !overlap(&ta, &tb) {
                return true;
            }
        }
        if let (Some(va), Some(vb)) = (values(&a), values(&b)) {
            if !va.iter().any(|v| vb.contains(v)) {
                return true;
            }
        }
        let required = |s: &Value| -> BTreeSet<String> {
            s.get("required")
                .and_then(Value::as_array)
                .map(|l| {
                    l.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let (ra, rb) = (required(&a), required(&b));
        for name in ra.intersection(&rb) {
            let prop = |s: &Value| -> Option<Value> {
                s.get("properties")
                    .and_then(|p| p.get(name.as_str()))
                    .map(|p| self.flat(p, old).into_owned())
            };
            if let (Some(pa), Some(pb)) = (prop(&a), prop(&b)) {
                if let (Some(va), Some(vb)) = (values(&pa), values(&pb)) {
                    if !va.iter().any(|v| vb.contains(v)) {
                        return true;
                    }
                }
            }
        }
        false
    }

    /// A branch with its `$ref` followed once (for the quick judgements above).
    fn flat<'v>(&self, schema: &'v Value, old: bool) -> Cow<'v, Value> {
        match ref_of(schema) {
            Some(reference) => {
                let root = if old { self.old_root } else { self.new_root };
                match resolve(root, reference) {
                    Some((_, target)) => Cow::Owned(merge(target, &siblings(schema))),
                    None => Cow::Borrowed(schema),
                }
            }
            None => Cow::Borrowed(schema),
        }
    }

    fn not(&mut self, old: &Map<String, Value>, new: &Map<String, Value>, at: &At) {
        match (old.get("not"), new.get("not")) {
            (None, Some(n)) => self.push(
                Rule::NotAdded,
                format!("{}/not", at.new),
                &at.via,
                format!("`not` {} added: values matching it are rejected", short(n)),
                Breaks::NEW,
            ),
            (Some(o), None) => self.push(
                Rule::NotRemoved,
                format!("{}/not", at.old),
                &at.via,
                format!("`not` {} removed", short(o)),
                Breaks::OLD,
            ),
            (Some(o), Some(n)) => {
                let sub = self.sub(o, n, &at.key("not"));
                let breaks = union(&sub);
                // What the schema under `not` stops accepting, the node starts accepting.
                let breaks = Breaks {
                    old_consumers: breaks.new_consumers,
                    new_consumers: breaks.old_consumers,
                };
                self.push(
                    Rule::NotChanged,
                    format!("{}/not", at.new),
                    &at.via,
                    format!(
                        "the schema under `not` changed ({}), which changes the values accepted the other way round",
                        summary(&sub)
                    ),
                    breaks,
                );
            }
            (None, None) => {}
        }
    }

    /// Annotations (notes) and keywords the check does not know (breaking).
    fn others(&mut self, old: &Map<String, Value>, new: &Map<String, Value>, at: &At) {
        let keys: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
        for key in keys {
            let k = key.as_str();
            if leaf::KEYWORDS.contains(&k)
                || OBJECT_KEYWORDS.contains(&k)
                || ARRAY_KEYWORDS.contains(&k)
                || OTHER_KEYWORDS.contains(&k)
            {
                continue;
            }
            let (o, n) = (old.get(k), new.get(k));
            if o == n {
                continue;
            }
            let pointer = if n.is_some() {
                format!("{}/{}", at.new, escape_token(k))
            } else {
                format!("{}/{}", at.old, escape_token(k))
            };
            let what = match (o, n) {
                (None, Some(n)) => format!("`{k}` {} added", short(n)),
                (Some(o), None) => format!("`{k}` {} removed", short(o)),
                (Some(o), Some(n)) => format!("`{k}` {} became {}", short(o), short(n)),
                (None, None) => continue,
            };
            if ANNOTATIONS.contains(&k) {
                self.push(
                    Rule::AnnotationChanged,
                    pointer,
                    &at.via,
                    what,
                    Breaks::NONE,
                );
            } else {
                self.push(
                    Rule::UnknownKeyword,
                    pointer,
                    &at.via,
                    format!("{what}; the check does not understand `{k}`, so the change is treated as breaking"),
                    Breaks::BOTH,
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

/// A schema with the keyword it is under.
type Keyed<'v> = (&'static str, &'v Value);

/// The tuple positions and the rest schema of an array schema: `prefixItems`/`items` in
/// draft 2020-12, array `items`/`additionalItems` in draft-07.
fn tuple_view(node: &Map<String, Value>, draft: Draft) -> (Vec<Keyed<'_>>, Option<Keyed<'_>>) {
    match (draft, node.get("items")) {
        (Draft::Draft7, Some(Value::Array(items))) => (
            items.iter().map(|v| ("items", v)).collect(),
            node.get("additionalItems").map(|v| ("additionalItems", v)),
        ),
        (Draft::Draft7, items) => (Vec::new(), items.map(|v| ("items", v))),
        (Draft::Draft202012, items) => (
            node.get("prefixItems")
                .and_then(Value::as_array)
                .map(|list| list.iter().map(|v| ("prefixItems", v)).collect())
                .unwrap_or_default(),
            items.map(|v| ("items", v)),
        ),
    }
}

fn is_disjunction(node: &Map<String, Value>) -> bool {
    node.contains_key("anyOf") || node.contains_key("oneOf")
}

/// The branches of a node: its `anyOf` (or else `oneOf`) with the keywords beside it merged
/// into each, or the node itself when it has neither.
fn branches(node: &Map<String, Value>) -> (Option<&'static str>, Vec<Value>) {
    let kind = if node.contains_key("anyOf") {
        "anyOf"
    } else if node.contains_key("oneOf") {
        "oneOf"
    } else {
        return (None, vec![Value::Object(node.clone())]);
    };
    let mut rest = node.clone();
    rest.remove(kind);
    let merged = list(node, kind)
        .iter()
        .map(|branch| merge(branch, &rest))
        .collect();
    (Some(kind), merged)
}

fn at_of(kind: Option<&str>, len: usize, base: &str) -> Vec<String> {
    match kind {
        Some(kind) => (0..len).map(|i| format!("{base}/{kind}/{i}")).collect(),
        None => vec![base.to_owned(); len],
    }
}

/// `branch` with the keywords of `rest` added; when both set a keyword differently, both are
/// kept under `allOf`.
fn merge(branch: &Value, rest: &Map<String, Value>) -> Value {
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

fn list(node: &Map<String, Value>, keyword: &str) -> Vec<Value> {
    node.get(keyword)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn ref_of(schema: &Value) -> Option<&str> {
    schema.get("$ref").and_then(Value::as_str)
}

/// The keywords of a `$ref` node other than `$ref`.
fn siblings(schema: &Value) -> Map<String, Value> {
    let mut rest = schema.as_object().cloned().unwrap_or_default();
    rest.remove("$ref");
    rest
}

/// The pointer and value a local `$ref` names.
fn resolve<'v>(root: &'v Value, reference: &str) -> Option<(String, &'v Value)> {
    let fragment = reference.strip_prefix('#')?;
    let pointer = percent_decode(fragment);
    root.pointer(&pointer).map(|value| (pointer, value))
}

/// Whether a `$ref` key appears anywhere in `value` (equal subtrees with references may still
/// differ where the references lead).
fn has_ref(value: &Value) -> bool {
    match value {
        Value::Object(map) => map.contains_key("$ref") || map.values().any(has_ref),
        Value::Array(items) => items.iter().any(has_ref),
        _ => false,
    }
}

fn any_key(old: &Map<String, Value>, new: &Map<String, Value>, keys: &[&str]) -> bool {
    keys.iter()
        .any(|k| old.contains_key(*k) || new.contains_key(*k))
}

/// `true`, `{}`, or a schema of annotations only: any value matches.
fn is_trivially_true(schema: &Value) -> bool {
    match schema {
        Value::Bool(b) => *b,
        Value::Object(map) => map.keys().all(|k| ANNOTATIONS.contains(&k.as_str())),
        _ => false,
    }
}

/// `false`, or `{ "not": {} }`: no value matches.
fn accepts_nothing(schema: &Value) -> bool {
    match schema {
        Value::Bool(b) => !*b,
        Value::Object(map) => map.get("not").is_some_and(is_trivially_true),
        _ => false,
    }
}

/// `a` is an integer multiple of `b`.
fn is_multiple(a: f64, b: f64) -> bool {
    if b == 0.0 {
        return false;
    }
    let ratio = a / b;
    (ratio - ratio.round()).abs() < 1e-9
}

/// The types a schema's values can have (`None`: any), as its `type`, `const` or `enum` say.
fn types(schema: &Value) -> Option<BTreeSet<String>> {
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
        values(schema).map(|values| {
            values
                .iter()
                .map(|v| {
                    match v {
                        Value::Null => "null",
                        Value::Bool(_) => "boolean",
                        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
                        Value::Number(_) => "number",
                        Value::String(_) => "string",
                        Value::Array(_) => "array",
                        Value::Object(_) => "object",
                    }
                    .to_owned()
                })
                .collect()
        })
    })
}

/// Whether two type sets share a value (`integer` is a `number`).
fn overlap(a: &BTreeSet<String>, b: &BTreeSet<String>) -> bool {
    let number = |s: &BTreeSet<String>| s.contains("number") || s.contains("integer");
    a.intersection(b).next().is_some()
        || (number(a) && (b.contains("number")) || number(b) && a.contains("number"))
}

/// The values a schema allows when it lists them (`const` or `enum`).
fn values(schema: &Value) -> Option<Vec<Value>> {
    if let Some(c) = schema.get("const") {
        return Some(vec![c.clone()]);
    }
    schema.get("enum").and_then(Value::as_array).cloned()
}

/// Whom any of `changes` breaks.
fn union(changes: &[Change]) -> Breaks {
    changes
        .iter()
        .fold(Breaks::NONE, |acc, change| acc.or(change.breaks))
}

/// The breaking ones of `changes` in a few words, for a change that sums them up.
fn summary(changes: &[Change]) -> String {
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
