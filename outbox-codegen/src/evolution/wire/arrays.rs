//! Arrays (tuple positions, rest schemas, item bounds, `uniqueItems`, `contains`) and the
//! bounds and `multipleOf` of numbers.

use serde_json::{Map, Value};

use super::{At, Draft, Walker};
use crate::evolution::leaf::number_text;
use crate::evolution::rules::Rule;
use crate::evolution::Breaks;

impl Walker<'_> {
    pub(super) fn array_model(
        &mut self,
        old: &Map<String, Value>,
        new: &Map<String, Value>,
        at: &At,
    ) {
        self.items(old, new, at);
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

    /// Each tuple position compared with the schema it has on the other side (its tuple entry
    /// or the rest schema), then the rest schemas.
    fn items(&mut self, old: &Map<String, Value>, new: &Map<String, Value>, at: &At) {
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
    }

    /// A `min*` (absent: 0, or 1 for `minContains`) or `max*` (absent: no bound) keyword.
    pub(super) fn bound(
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

    pub(super) fn multiple_of(
        &mut self,
        old: &Map<String, Value>,
        new: &Map<String, Value>,
        at: &At,
    ) {
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

/// `a` is an integer multiple of `b`.
fn is_multiple(a: f64, b: f64) -> bool {
    if b == 0.0 {
        return false;
    }
    let ratio = a / b;
    (ratio - ratio.round()).abs() < 1e-9
}
