//! What a JSON Schema allows, reduced to what the type check needs: the set of JSON types, the
//! string format, numeric bounds, and the item/value schemas of arrays and maps.

use serde_json::Value;

/// A set of JSON types. `number` includes `integer`, as in JSON Schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Types(u8);

impl Types {
    pub(crate) const NONE: Types = Types(0);
    pub(crate) const NULL: Types = Types(1);
    pub(crate) const BOOLEAN: Types = Types(1 << 1);
    pub(crate) const INTEGER: Types = Types(1 << 2);
    /// Numbers that are not integers; `"type": "number"` is `NUMBER | INTEGER`.
    pub(crate) const FRACTION: Types = Types(1 << 3);
    pub(crate) const NUMBER: Types = Types(Self::INTEGER.0 | Self::FRACTION.0);
    pub(crate) const STRING: Types = Types(1 << 4);
    pub(crate) const ARRAY: Types = Types(1 << 5);
    pub(crate) const OBJECT: Types = Types(1 << 6);
    pub(crate) const ANY: Types = Types(0x7f);

    pub(crate) fn union(self, other: Types) -> Types {
        Types(self.0 | other.0)
    }
    pub(crate) fn intersect(self, other: Types) -> Types {
        Types(self.0 & other.0)
    }
    pub(crate) fn without(self, other: Types) -> Types {
        Types(self.0 & !other.0)
    }
    pub(crate) fn contains(self, other: Types) -> bool {
        self.0 & other.0 == other.0
    }
    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }

    fn from_name(name: &str) -> Types {
        match name {
            "null" => Self::NULL,
            "boolean" => Self::BOOLEAN,
            "integer" => Self::INTEGER,
            "number" => Self::NUMBER,
            "string" => Self::STRING,
            "array" => Self::ARRAY,
            "object" => Self::OBJECT,
            _ => Self::NONE,
        }
    }

    fn of_value(v: &Value) -> Types {
        match v {
            Value::Null => Self::NULL,
            Value::Bool(_) => Self::BOOLEAN,
            Value::Number(n) if n.is_i64() || n.is_u64() => Self::INTEGER,
            Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => Self::INTEGER,
            Value::Number(_) => Self::FRACTION,
            Value::String(_) => Self::STRING,
            Value::Array(_) => Self::ARRAY,
            Value::Object(_) => Self::OBJECT,
        }
    }

    /// Words for a message: `string`, `integer or null`, `any JSON value`.
    pub(crate) fn describe(self) -> String {
        if self == Self::ANY {
            return "any JSON value".into();
        }
        let mut names = Vec::new();
        for (t, name) in [
            (Self::STRING, "string"),
            (Self::NUMBER, "number"),
            (Self::INTEGER, "integer"),
            (Self::FRACTION, "number"),
            (Self::BOOLEAN, "boolean"),
            (Self::ARRAY, "array"),
            (Self::OBJECT, "object"),
            (Self::NULL, "null"),
        ] {
            let already =
                (t == Self::INTEGER || t == Self::FRACTION) && self.contains(Self::NUMBER);
            if self.contains(t) && !already {
                names.push(name);
            }
        }
        match names.len() {
            0 => "no value at all".into(),
            1 => names[0].into(),
            _ => {
                let last = names.pop().unwrap_or_default();
                format!("{} or {last}", names.join(", "))
            }
        }
    }
}

/// A schema seen through its `$ref`s, `allOf`/`anyOf`/`oneOf` and `enum`/`const`.
#[derive(Debug, Clone)]
pub(crate) struct View<'a> {
    pub(crate) types: Types,
    /// `format` of a string schema, when every branch agrees on it.
    pub(crate) format: Option<&'a str>,
    pub(crate) minimum: Option<f64>,
    pub(crate) maximum: Option<f64>,
    /// `items` of an array schema.
    pub(crate) items: Option<&'a Value>,
    /// `additionalProperties` of an object schema, when it is a schema.
    pub(crate) additional: Option<&'a Value>,
    /// Whether the string values are limited to an `enum` or `const`.
    pub(crate) enumerated: bool,
}

impl<'a> View<'a> {
    fn any() -> Self {
        View {
            types: Types::ANY,
            format: None,
            minimum: None,
            maximum: None,
            items: None,
            additional: None,
            enumerated: false,
        }
    }

    /// The view of `schema`, resolving local `$ref`s (`#/...`) against `root`.
    pub(crate) fn of(schema: &'a Value, root: &'a Value) -> Self {
        Self::of_depth(schema, root, 0)
    }

    fn of_depth(schema: &'a Value, root: &'a Value, depth: u32) -> Self {
        let mut view = View::any();
        let obj = match schema {
            Value::Object(obj) if depth < 32 => obj,
            Value::Bool(false) => {
                view.types = Types::NONE;
                return view;
            }
            _ => return view,
        };
        if let Some(Value::String(r)) = obj.get("$ref") {
            if let Some(target) = r.strip_prefix('#').and_then(|p| root.pointer(p)) {
                view = View::of_depth(target, root, depth + 1);
            }
        }
        match obj.get("type") {
            Some(Value::String(t)) => view.types = view.types.intersect(Types::from_name(t)),
            Some(Value::Array(ts)) => {
                let set = ts
                    .iter()
                    .filter_map(Value::as_str)
                    .fold(Types::NONE, |acc, t| acc.union(Types::from_name(t)));
                view.types = view.types.intersect(set);
            }
            _ => {}
        }
        if let Some(Value::Array(values)) = obj.get("enum") {
            let set = values
                .iter()
                .fold(Types::NONE, |acc, v| acc.union(Types::of_value(v)));
            view.types = view.types.intersect(set);
            view.enumerated = true;
        }
        if let Some(value) = obj.get("const") {
            view.types = view.types.intersect(Types::of_value(value));
            view.enumerated = true;
        }
        if let Some(Value::String(f)) = obj.get("format") {
            view.format = Some(f);
        }
        if let Some(m) = lower_bound(obj) {
            view.minimum = Some(view.minimum.map_or(m, |v| v.max(m)));
        }
        if let Some(m) = upper_bound(obj) {
            view.maximum = Some(view.maximum.map_or(m, |v| v.min(m)));
        }
        if let Some(items) = obj.get("items") {
            view.items = Some(items);
        }
        if let Some(additional @ Value::Object(_)) = obj.get("additionalProperties") {
            view.additional = Some(additional);
        }
        if let Some(Value::Array(all)) = obj.get("allOf") {
            for branch in all {
                let b = View::of_depth(branch, root, depth + 1);
                view.types = view.types.intersect(b.types);
                view.format = view.format.or(b.format);
                view.minimum = max_opt(view.minimum, b.minimum);
                view.maximum = min_opt(view.maximum, b.maximum);
                view.items = view.items.or(b.items);
                view.additional = view.additional.or(b.additional);
                view.enumerated |= b.enumerated;
            }
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(branches)) = obj.get(key) {
                let views: Vec<View<'a>> = branches
                    .iter()
                    .map(|b| View::of_depth(b, root, depth + 1))
                    .collect();
                let types = views.iter().fold(Types::NONE, |acc, b| acc.union(b.types));
                view.types = view.types.intersect(types);
                // Keep the details only when one branch carries the non-null values, as in
                // the usual `anyOf: [{..}, {type: null}]`.
                let mut non_null = views
                    .iter()
                    .filter(|b| !b.types.without(Types::NULL).is_empty());
                if let (Some(only), None) = (non_null.next(), non_null.next()) {
                    view.format = view.format.or(only.format);
                    view.minimum = max_opt(view.minimum, only.minimum);
                    view.maximum = min_opt(view.maximum, only.maximum);
                    view.items = view.items.or(only.items);
                    view.additional = view.additional.or(only.additional);
                    view.enumerated |= only.enumerated;
                }
            }
        }
        view
    }

    /// Whether `null` is a valid value.
    pub(crate) fn allows_null(&self) -> bool {
        self.types.contains(Types::NULL)
    }
}

fn lower_bound(obj: &serde_json::Map<String, Value>) -> Option<f64> {
    let inclusive = obj.get("minimum").and_then(Value::as_f64);
    let exclusive = obj
        .get("exclusiveMinimum")
        .and_then(Value::as_f64)
        .map(|m| m.floor() + 1.0);
    max_opt(inclusive, exclusive)
}

fn upper_bound(obj: &serde_json::Map<String, Value>) -> Option<f64> {
    let inclusive = obj.get("maximum").and_then(Value::as_f64);
    let exclusive = obj
        .get("exclusiveMaximum")
        .and_then(Value::as_f64)
        .map(|m| m.ceil() - 1.0);
    min_opt(inclusive, exclusive)
}

fn max_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn min_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn types_through_refs_and_combinators() {
        let root = json!({
            "$defs": {
                "Plan": {"type": "string", "enum": ["free", "pro"]},
                "Id": {"type": "string", "format": "uuid"},
                "Seats": {"type": "integer", "minimum": 1, "exclusiveMaximum": 1000}
            }
        });
        let plan = json!({"$ref": "#/$defs/Plan"});
        let v = View::of(&plan, &root);
        assert_eq!(v.types, Types::STRING);
        assert!(v.enumerated);

        let id = json!({"anyOf": [{"$ref": "#/$defs/Id"}, {"type": "null"}]});
        let v = View::of(&id, &root);
        assert_eq!(v.types, Types::STRING.union(Types::NULL));
        assert_eq!(v.format, Some("uuid"));
        assert!(v.allows_null());

        let seats = json!({"allOf": [{"$ref": "#/$defs/Seats"}], "description": "x"});
        let v = View::of(&seats, &root);
        assert_eq!(v.types, Types::INTEGER);
        assert_eq!((v.minimum, v.maximum), (Some(1.0), Some(999.0)));

        let number = json!({"type": ["number", "null"]});
        assert_eq!(
            View::of(&number, &root).types,
            Types::NUMBER.union(Types::NULL)
        );
        assert_eq!(View::of(&json!({}), &root).types, Types::ANY);
        assert_eq!(
            View::of(&json!({"enum": [1, 2.5]}), &root).types,
            Types::NUMBER
        );
        assert_eq!(View::of(&json!({"const": "x"}), &root).types, Types::STRING);
        assert_eq!(View::of(&json!(false), &root).types, Types::NONE);
        let cyclic = json!({"$defs": {"A": {"$ref": "#/$defs/A"}}});
        assert_eq!(
            View::of(&json!({"$ref": "#/$defs/A"}), &cyclic).types,
            Types::ANY
        );
    }

    #[test]
    fn describe() {
        assert_eq!(Types::STRING.describe(), "string");
        assert_eq!(Types::NUMBER.describe(), "number");
        assert_eq!(
            Types::INTEGER.union(Types::NULL).describe(),
            "integer or null"
        );
        assert_eq!(
            Types::STRING
                .union(Types::INTEGER)
                .union(Types::ARRAY)
                .describe(),
            "string, integer or array"
        );
        assert_eq!(Types::ANY.describe(), "any JSON value");
    }
}
