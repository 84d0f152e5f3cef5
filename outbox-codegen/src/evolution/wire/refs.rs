//! `$ref`: followed on both sides, with the keywords beside it; each pair of targets compared
//! once, so recursive schemas end.

use outbox_schema::pointer::percent_decode;
use serde_json::{Map, Value};

use super::values::merge;
use super::{At, Walker};
use crate::evolution::rules::Rule;
use crate::evolution::Breaks;

impl Walker<'_> {
    /// At least one side is a `$ref` (with or without keywords beside it).
    pub(super) fn references(
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
}

pub(super) fn ref_of(schema: &Value) -> Option<&str> {
    schema.get("$ref").and_then(Value::as_str)
}

/// The keywords of a `$ref` node other than `$ref`.
pub(super) fn siblings(schema: &Value) -> Map<String, Value> {
    let mut rest = schema.as_object().cloned().unwrap_or_default();
    rest.remove("$ref");
    rest
}

/// The pointer and value a local `$ref` names.
pub(super) fn resolve<'v>(root: &'v Value, reference: &str) -> Option<(String, &'v Value)> {
    let fragment = reference.strip_prefix('#')?;
    let pointer = percent_decode(fragment);
    root.pointer(&pointer).map(|value| (pointer, value))
}

/// Whether a `$ref` key appears anywhere in `value` (equal subtrees with references may still
/// differ where the references lead).
pub(super) fn has_ref(value: &Value) -> bool {
    match value {
        Value::Object(map) => map.contains_key("$ref") || map.values().any(has_ref),
        Value::Array(items) => items.iter().any(has_ref),
        _ => false,
    }
}
