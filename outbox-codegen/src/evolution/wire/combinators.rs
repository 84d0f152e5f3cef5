//! Combinators: `allOf` (branches paired and compared), `anyOf`/`oneOf` (disjunctions: branch
//! lists, with the overlap of `oneOf` branches) and `not` (the change under it reversed).

use std::borrow::Cow;
use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::refs::{ref_of, resolve, siblings};
use super::values::{is_trivially_true, list, merge, overlap, summary, types, union, values};
use super::{At, Walker};
use crate::evolution::leaf::short;
use crate::evolution::rules::Rule;
use crate::evolution::Breaks;

impl Walker<'_> {
    pub(super) fn all_of(&mut self, old: &Map<String, Value>, new: &Map<String, Value>, at: &At) {
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
    pub(super) fn disjunction(
        &mut self,
        old: &Map<String, Value>,
        new: &Map<String, Value>,
        at: &At,
    ) {
        let (old_kind, o) = branches(old);
        let (new_kind, n) = branches(new);
        let o_at: Vec<String> = at_of(old_kind, o.len(), &at.old);
        let n_at: Vec<String> = at_of(new_kind, n.len(), &at.new);
        self.combinator_changed(old_kind, new_kind, at);
        let lists = Lists {
            old: &o,
            new: &n,
            old_at: &o_at,
            new_at: &n_at,
        };
        let (one_of_old, one_of_new) = (old_kind == Some("oneOf"), new_kind == Some("oneOf"));
        for pair in self.pair(&o, &n, &o_at, &n_at, at) {
            match pair {
                (Some(i), Some(j)) => {
                    let here = lists.at(i, j, at);
                    self.node(&o[i], &n[j], &here);
                }
                (Some(i), None) => self.branch_removed(&lists, i, one_of_old, at),
                (None, Some(j)) => self.branch_added(&lists, j, one_of_new, at),
                (None, None) => {}
            }
        }
    }

    /// `anyOf` became `oneOf` or the other way round.
    fn combinator_changed(&mut self, old_kind: Option<&str>, new_kind: Option<&str>, at: &At) {
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
    }

    /// Old branch `i` has no partner: it narrows unless a new branch accepts all it accepted,
    /// and under `oneOf` it widens if it may have overlapped another old branch.
    fn branch_removed(&mut self, lists: &Lists<'_>, i: usize, one_of_old: bool, at: &At) {
        let (o, n) = (lists.old, lists.new);
        let covered = (0..n.len()).any(|j| {
            let here = lists.at(i, j, at);
            !union(&self.sub(&o[i], &n[j], &here)).new_consumers
        });
        // Values that matched this branch and another failed `oneOf`; without
        // it they pass.
        let overlapped =
            one_of_old && (0..o.len()).any(|k| k != i && !self.disjoint(&o[i], &o[k], true));
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
            lists.old_at[i].clone(),
            &at.via,
            format!("branch {} removed: {}", short(&o[i]), words.join("; ")),
            breaks,
        );
    }

    /// New branch `j` has no partner: it widens unless an old branch covers it, and under
    /// `oneOf` it narrows if it may overlap another new branch.
    fn branch_added(&mut self, lists: &Lists<'_>, j: usize, one_of_new: bool, at: &At) {
        let (o, n) = (lists.old, lists.new);
        let covered = (0..o.len()).any(|i| {
            let here = lists.at(i, j, at);
            !union(&self.sub(&o[i], &n[j], &here)).old_consumers
        });
        let overlaps =
            one_of_new && (0..n.len()).any(|k| k != j && !self.disjoint(&n[j], &n[k], false));
        let mut breaks = Breaks::NONE;
        let mut words = Vec::new();
        if !covered {
            breaks.old_consumers = true;
            words.push("old consumers reject the values it adds");
        }
        if overlaps {
            breaks.new_consumers = true;
            words.push("it may overlap another branch, and a value matching two fails `oneOf`");
        }
        let rule = if one_of_new {
            Rule::OneOfBranchAdded
        } else {
            Rule::AnyOfBranchAdded
        };
        self.push(
            rule,
            lists.new_at[j].clone(),
            &at.via,
            format!("branch {} added: {}", short(&n[j]), words.join("; ")),
            breaks,
        );
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

    pub(super) fn not(&mut self, old: &Map<String, Value>, new: &Map<String, Value>, at: &At) {
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
}

pub(super) fn is_disjunction(node: &Map<String, Value>) -> bool {
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

/// The branch lists of both sides of a disjunction, with their pointers.
struct Lists<'a> {
    old: &'a [Value],
    new: &'a [Value],
    old_at: &'a [String],
    new_at: &'a [String],
}

impl Lists<'_> {
    /// Where old branch `i` and new branch `j` are compared.
    fn at(&self, i: usize, j: usize, at: &At) -> At {
        At {
            old: self.old_at[i].clone(),
            new: self.new_at[j].clone(),
            via: at.via.clone(),
        }
    }
}
