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

mod arrays;
mod combinators;
mod objects;
mod refs;
mod values;

use std::collections::{BTreeSet, HashSet};

use outbox_schema::pointer::escape_token;
use serde_json::{Map, Value};

use self::combinators::is_disjunction;
use self::refs::{has_ref, ref_of};
use self::values::any_key;
use super::leaf::{self, short};
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
