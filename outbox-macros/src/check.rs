//! The struct against its schema: required and optional properties, closed schemas, JSON
//! types against Rust types, and the subject.
//!
//! Rules, for each JSON property and the field serialized as it:
//!
//! - a required property needs a field; a required property is an `Option` only when the
//!   schema allows `null`;
//! - an optional property is an `Option` (with `skip_serializing_if` unless the schema allows
//!   `null`, since `None` is written as `null`), or a field with `#[serde(default)]`;
//! - a field whose property a closed schema (`additionalProperties: false`) lacks is an error;
//! - JSON types must match both ways: every value the type can produce is allowed, and every
//!   value the schema allows decodes. `number` takes `f32`/`f64` only (an integer type cannot
//!   decode `1.5`); `integer` takes integer types only. An unsigned type needs a schema
//!   `minimum` >= 0 (>= 1 for `NonZero*`), and an explicit schema bound must fit the type; a
//!   side the schema leaves unbounded is not checked. Formatted string types (`Uuid`,
//!   `DateTime`, ...) must agree with the schema's `format` when it has one.
//! - types the derive cannot see into (user structs, enums, newtypes) are accepted for any
//!   property; runtime validation still checks every payload before the insert.
//! - `#[serde(flatten)]` fields bring properties the derive cannot see: with one present,
//!   required properties without a named field are assumed to come from it, and a flattened
//!   map on a closed schema is an error (it would collect properties the schema forbids).

use std::collections::BTreeSet;

use serde_json::{Map, Value};
use syn::ext::IdentExt;
use syn::{LitStr, Type};

use crate::ast::{Container, Field};
use crate::attr::Attrs;
use crate::compat::compatible;
use crate::ctxt::Ctxt;
use crate::json::{Types, View};
use crate::suggest::{describe, field_decl, suggest_type, type_text};
use crate::ty::{classify, option_inner, RustTy};

/// What the expansion needs from a successful check.
pub(crate) struct Checked {
    /// The subject's JSON property and the field that carries it.
    pub(crate) subject: Option<(String, syn::Ident)>,
}

/// The schema side of the check: the resolved root schema, the file as messages name it, and
/// what every rule reads from the root.
pub(crate) struct Schema<'s> {
    root: &'s Value,
    file: &'s str,
    /// `x-outbox-subject`, as the schema loader read it.
    subject: Option<&'s str>,
    properties: Option<&'s Map<String, Value>>,
    required: BTreeSet<&'s str>,
    /// `additionalProperties: false` (or `unevaluatedProperties: false`).
    closed: bool,
    /// `additionalProperties` when it is a schema: every other property must fit it.
    additional: Option<&'s Value>,
}

impl<'s> Schema<'s> {
    pub(crate) fn new(root: &'s Value, file: &'s str, subject: Option<&'s str>) -> Self {
        Schema {
            root,
            file,
            subject,
            properties: root.get("properties").and_then(Value::as_object),
            required: root
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default(),
            closed: root.get("additionalProperties") == Some(&Value::Bool(false))
                || root.get("unevaluatedProperties") == Some(&Value::Bool(false)),
            additional: root.get("additionalProperties").filter(|v| v.is_object()),
        }
    }

    fn property(&self, name: &str) -> Option<&'s Value> {
        self.properties.and_then(|p| p.get(name))
    }
}

/// Checks a struct against its schema, one rule per method; every error goes to the context.
pub(crate) struct Checker<'c, 'a> {
    cx: &'c Ctxt,
    cont: &'c Container<'a>,
    attrs: &'c Attrs,
    /// The `event_type` literal: errors about what the schema says go here, since it chose
    /// the schema.
    event_type: &'c LitStr,
    schema: Schema<'c>,
}

impl<'c, 'a> Checker<'c, 'a> {
    pub(crate) fn new(
        cx: &'c Ctxt,
        cont: &'c Container<'a>,
        attrs: &'c Attrs,
        event_type: &'c LitStr,
        schema: Schema<'c>,
    ) -> Self {
        Checker {
            cx,
            cont,
            attrs,
            event_type,
            schema,
        }
    }

    /// Every rule, in the order the errors are reported: the fields, then the required
    /// properties without a field, then the subject.
    pub(crate) fn check(&self) -> Checked {
        for field in self.cont.fields.iter().filter(|f| f.is_serialized()) {
            self.check_field(field);
        }
        if !self
            .cont
            .fields
            .iter()
            .any(|f| f.flatten && f.is_serialized())
        {
            self.check_required_have_fields();
        }
        Checked {
            subject: self.check_subject(),
        }
    }

    fn check_field(&self, field: &Field<'a>) {
        if field.flatten {
            self.check_flattened(field);
            return;
        }
        match self.schema.property(&field.name) {
            None if self.schema.closed => self.not_in_closed_schema(field),
            None => {
                if let Some(schema) = self.schema.additional {
                    self.check_property(field, schema, false);
                }
            }
            Some(schema) => {
                let required = self.schema.required.contains(field.name.as_str());
                self.check_property(field, schema, required);
            }
        }
    }

    /// A flattened map would collect properties a closed schema forbids.
    fn check_flattened(&self, field: &Field<'a>) {
        if self.schema.closed && matches!(classify(field.ty), RustTy::Map(_) | RustTy::Json) {
            self.cx.error_spanned_by(
                field.member,
                format!(
                    "`{}` is closed (additionalProperties: false), but this flattened \
                     map collects any property; remove `#[serde(flatten)]` from `{}` or \
                     allow additional properties in the schema",
                    self.schema.file, field.member
                ),
            );
        }
    }

    /// A closed schema has no property for this field.
    fn not_in_closed_schema(&self, field: &Field<'a>) {
        let rust_name = field.member.unraw().to_string();
        let renamed = if rust_name == field.name {
            String::new()
        } else {
            format!(" (the JSON name serde gives the field `{rust_name}`)")
        };
        self.cx.error_spanned_by(
            field.member,
            format!(
                "`{}` does not allow `{}`{renamed} (additionalProperties: false); \
                 remove the field or add the property to the schema",
                self.schema.file, field.name
            ),
        );
    }

    /// The field against the schema of its property.
    fn check_property(&self, field: &Field<'a>, schema: &'c Value, required: bool) {
        let view = View::of(schema, self.schema.root);
        let what = format!("property `{}`", field.name);
        let (ty, view) = if required {
            (self.required_field(field, &view, &what), view)
        } else {
            match self.optional_field(field, &view, &what) {
                Some(checked) => checked,
                None => return,
            }
        };
        if !field.custom_serialize {
            if let Err((at, msg)) = compatible(ty, &view, self.schema.root, &what, self.schema.file)
            {
                self.cx.error_spanned_by(at, msg);
            }
        }
    }

    /// A required property is always written, and is `None` only when the schema allows
    /// `null`. Returns the type whose values must fit the property.
    fn required_field(&self, field: &Field<'a>, view: &View<'_>, what: &str) -> &'a Type {
        let file = self.schema.file;
        if field.skip_serializing_if {
            self.cx.error_spanned_by(
                field.member,
                format!(
                    "{what} is required in `{file}`, but `skip_serializing_if` can leave it out \
                     of the payload; remove `skip_serializing_if` from `{}`",
                    field.member
                ),
            );
        }
        match option_inner(field.ty) {
            Some(inner) if !view.allows_null() => {
                self.cx.error_spanned_by(
                    field.ty,
                    format!(
                        "{what} is required and not nullable in `{file}`; use `{}` instead of `Option<..>`",
                        type_text(inner)
                    ),
                );
                inner
            }
            _ => field.ty,
        }
    }

    /// An optional property may be absent: an `Option` leaves `None` out (unless the schema
    /// allows `null`), another type needs `#[serde(default)]`. Returns the type and schema
    /// whose values must agree, or `None` when there is nothing more to check.
    fn optional_field<'v>(
        &self,
        field: &Field<'a>,
        view: &View<'v>,
        what: &str,
    ) -> Option<(&'a Type, View<'v>)> {
        let file = self.schema.file;
        if let Some(inner) = option_inner(field.ty) {
            if !view.allows_null() && !field.skip_serializing_if {
                self.cx.error_spanned_by(
                    field.ty,
                    format!(
                        "{what} is optional and not nullable in `{file}`, so `None` must be left out, \
                         not written as `null`; add `#[serde(skip_serializing_if = \"Option::is_none\")]` \
                         to `{}`",
                        field.member
                    ),
                );
            }
            let non_null = View {
                types: view.types.without(Types::NULL),
                ..view.clone()
            };
            return Some((inner, non_null));
        }
        if !field.default && !self.cont.default && !field.skip_deserializing {
            self.cx.error_spanned_by(
                field.ty,
                format!(
                    "{what} is optional in `{file}`, so payloads without it must decode; make it \
                     `Option<{}>` (or add `#[serde(default)]`)",
                    type_text(field.ty)
                ),
            );
            return None;
        }
        Some((field.ty, view.clone()))
    }

    /// Every required property has a field (unless a flattened field may carry it).
    fn check_required_have_fields(&self) {
        for name in &self.schema.required {
            if self
                .cont
                .fields
                .iter()
                .any(|f| f.is_serialized() && !f.flatten && f.name == *name)
            {
                continue;
            }
            let root = self.schema.root;
            let suggested = self
                .schema
                .property(name)
                .map(|s| suggest_type(&View::of(s, root), root, 0))
                .unwrap_or_else(|| "serde_json::Value".into());
            self.cx.error_at(
                self.cont.ident_span(),
                format!(
                    "struct `{}` has no field for required property `{name}` of `{}`; \
                     add {}",
                    self.cont.ident,
                    self.schema.file,
                    field_decl(name, &suggested)
                ),
            );
        }
    }

    /// The subject: its property (from `subject = ".."` or `x-outbox-subject`) and the field
    /// that carries it; `None` without a subject or with an error.
    fn check_subject(&self) -> Option<(String, syn::Ident)> {
        let (name, lit) = self.subject_name()?;
        if !self.subject_property_fits(&name, lit) {
            return None;
        }
        self.subject_field(name, lit)
    }

    /// The subject's property and the literal its errors go on. `subject = ".."` and the
    /// schema's `x-outbox-subject` must agree when both are given.
    fn subject_name(&self) -> Option<(String, &'c LitStr)> {
        match (&self.attrs.subject, self.schema.subject) {
            (Some(lit), Some(from_schema)) if lit.value() != from_schema => {
                self.cx.error_spanned_by(
                    lit,
                    format!(
                        "`subject = \"{}\"` disagrees with `\"x-outbox-subject\": \"{from_schema}\"` \
                         in `{}`; remove `subject` or make the two equal",
                        lit.value(),
                        self.schema.file
                    ),
                );
                None
            }
            (Some(lit), _) => Some((lit.value(), lit)),
            (None, Some(from_schema)) => Some((from_schema.to_owned(), self.event_type)),
            (None, None) => None,
        }
    }

    /// The subject is a required string or integer property.
    fn subject_property_fits(&self, name: &str, lit: &LitStr) -> bool {
        let file = self.schema.file;
        let fix = "the subject must be a required string, uuid or integer property";
        let Some(schema) = self.schema.property(name) else {
            self.cx.error_spanned_by(
                lit,
                format!("subject `{name}` is not a property of `{file}`; {fix}"),
            );
            return false;
        };
        if !self.schema.required.contains(name) {
            self.cx.error_spanned_by(
                lit,
                format!("subject `{name}` is an optional property of `{file}`; {fix}"),
            );
            return false;
        }
        let view = View::of(schema, self.schema.root);
        if view.types != Types::STRING && view.types != Types::INTEGER {
            self.cx.error_spanned_by(
                lit,
                format!("subject `{name}` is {} in `{file}`; {fix}", describe(&view)),
            );
            return false;
        }
        true
    }

    /// The named, non-`Option` field that carries the subject.
    fn subject_field(&self, name: String, lit: &LitStr) -> Option<(String, syn::Ident)> {
        let field = self
            .cont
            .fields
            .iter()
            .find(|f| f.is_serialized() && !f.flatten && f.name == name);
        match field {
            // A missing required property is reported on the struct already.
            None if self.cont.fields.iter().any(|f| f.flatten) => {
                self.cx.error_spanned_by(
                    lit,
                    format!(
                        "subject `{name}` must be a named field of `{}`, not part of a flattened one; \
                         add `pub {name}: ..`",
                        self.cont.ident
                    ),
                );
                None
            }
            None => None,
            Some(field) if option_inner(field.ty).is_some() => {
                self.cx.error_spanned_by(
                    lit,
                    format!(
                        "subject `{name}` is the field `{}`, an `Option`; every event has a subject: \
                         make the field non-optional",
                        field.member
                    ),
                );
                None
            }
            Some(field) => Some((name, field.member.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn errors(input: syn::DeriveInput, schema: Value) -> Vec<String> {
        let cx = Ctxt::new();
        let cont = Container::from_ast(&cx, &input).expect("a struct");
        let attrs = Attrs::from_attrs(&cx, cont.attrs, cont.ident_span());
        let et = attrs.event_type.clone().expect("event type");
        let subject = schema
            .get("x-outbox-subject")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let contract = Schema::new(&schema, "e.schema.json", subject.as_deref());
        Checker::new(&cx, &cont, &attrs, &et, contract).check();
        cx.messages()
    }

    fn schema() -> Value {
        json!({
            "title": "Created",
            "type": "object",
            "additionalProperties": false,
            "x-outbox-subject": "id",
            "required": ["id", "seats", "plan", "at", "tags"],
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "seats": {"$ref": "#/$defs/Seats"},
                "plan": {"type": "string", "enum": ["free", "pro"]},
                "at": {"type": "string", "format": "date-time"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "note": {"type": "string"},
                "price": {"type": "number"},
                "parent": {"type": ["string", "null"]},
                "meta": {"type": "object", "additionalProperties": {"type": "integer"}}
            },
            "$defs": {"Seats": {"type": "integer", "minimum": 1, "maximum": 500}}
        })
    }

    #[test]
    fn typify_shapes_pass() {
        let input = syn::parse_quote! {
            #[outbox(event_type = "a.b.c")]
            pub struct Created {
                pub id: ::uuid::Uuid,
                pub seats: ::std::num::NonZeroU64,
                pub plan: Plan,
                pub at: ::chrono::DateTime<::chrono::offset::Utc>,
                pub tags: ::std::vec::Vec<::std::string::String>,
                #[serde(default, skip_serializing_if = "::std::option::Option::is_none")]
                pub note: ::std::option::Option<NoteText>,
                #[serde(default, skip_serializing_if = "::std::option::Option::is_none")]
                pub price: ::std::option::Option<f64>,
                #[serde(default)]
                pub parent: ::std::option::Option<::std::string::String>,
                #[serde(default, skip_serializing_if = "::std::collections::HashMap::is_empty")]
                pub meta: ::std::collections::HashMap<::std::string::String, i64>,
            }
        };
        assert_eq!(errors(input, schema()), Vec::<String>::new());
    }

    #[test]
    fn hand_written_mistakes() {
        let input = syn::parse_quote! {
            #[outbox(event_type = "a.b.c", subject = "note")]
            #[serde(rename_all = "camelCase")]
            pub struct Created {
                #[serde(rename = "id")]
                pub the_id: String,
                pub seats: u8,
                pub at: ::uuid::Uuid,
                pub tags: Vec<i32>,
                pub note: Option<String>,
                pub price: Option<i64>,
                pub parent: String,
                pub meta: HashMap<String, f64>,
                pub extra_field: bool,
            }
        };
        let got = errors(input, schema());
        let want = [
            "property `seats` may be as high as 500 in `e.schema.json`, which `u8` cannot hold; use `u32`",
            "property `at` is a string with format `date-time` in `e.schema.json`, which `uuid::Uuid` does not hold; use `chrono::DateTime<chrono::Utc>`",
            "each item of property `tags` is a string in `e.schema.json`; use `String`",
            "property `note` is optional and not nullable in `e.schema.json`, so `None` must be left out",
            "property `price` is optional and not nullable",
            "property `price` is a number in `e.schema.json`; use `f64`",
            "property `parent` is optional in `e.schema.json`, so payloads without it must decode; make it `Option<String>`",
            "property `meta` is optional in `e.schema.json`",
            "`e.schema.json` does not allow `extraField` (the JSON name serde gives the field `extra_field`) (additionalProperties: false); remove the field or add the property to the schema",
            "struct `Created` has no field for required property `plan` of `e.schema.json`; add `pub plan: String`",
            "`subject = \"note\"` disagrees with `\"x-outbox-subject\": \"id\"`",
        ];
        assert_eq!(got.len(), want.len(), "{got:#?}");
        for (got, want) in got.iter().zip(want) {
            assert!(got.starts_with(want), "\n got: {got}\nwant: {want}");
        }
    }

    #[test]
    fn subject_rules() {
        let mut s = schema();
        s.as_object_mut().unwrap().remove("x-outbox-subject");
        let base = |subject: &str| -> syn::DeriveInput {
            let lit = syn::LitStr::new(subject, proc_macro2::Span::call_site());
            syn::parse_quote! {
                #[outbox(event_type = "a.b.c", subject = #lit)]
                pub struct Created {
                    pub id: Option<uuid::Uuid>, pub seats: u32, pub plan: String,
                    pub at: chrono::DateTime<chrono::Utc>, pub tags: Vec<String>,
                }
            }
        };
        let cases = [
            (
                "missing",
                "subject `missing` is not a property of `e.schema.json`",
            ),
            ("note", "subject `note` is an optional property"),
            ("tags", "subject `tags` is an array in `e.schema.json`"),
            ("id", "subject `id` is the field `id`, an `Option`"),
        ];
        for (subject, want) in cases {
            let got = errors(base(subject), s.clone());
            assert!(
                got.iter().any(|e| e.starts_with(want)),
                "{subject}: {got:#?}"
            );
        }
    }
    #[test]
    fn flatten_skip_and_nullability_rules() {
        let input = syn::parse_quote! {
            #[outbox(event_type = "a.b.c")]
            pub struct Created {
                #[serde(skip_serializing_if = "Option::is_none")]
                pub id: Option<uuid::Uuid>,
                pub seats: u32,
                pub plan: String,
                pub at: chrono::DateTime<chrono::Utc>,
                pub tags: Vec<String>,
                #[serde(flatten)]
                pub rest: serde_json::Map<String, serde_json::Value>,
                #[serde(skip)]
                pub cache: u8,
            }
        };
        assert_eq!(
            errors(input, schema()),
            [
                "property `id` is required in `e.schema.json`, but `skip_serializing_if` can leave it out of the payload; remove `skip_serializing_if` from `id`",
                "property `id` is required and not nullable in `e.schema.json`; use `uuid::Uuid` instead of `Option<..>`",
                "`e.schema.json` is closed (additionalProperties: false), but this flattened map collects any property; remove `#[serde(flatten)]` from `rest` or allow additional properties in the schema",
                "subject `id` is the field `id`, an `Option`; every event has a subject: make the field non-optional",
            ]
        );
    }

    #[test]
    fn subject_behind_a_flattened_field() {
        let mut open = schema();
        open.as_object_mut().unwrap().remove("additionalProperties");
        let input = syn::parse_quote! {
            #[outbox(event_type = "a.b.c")]
            pub struct Created {
                pub seats: u32,
                #[serde(flatten)]
                pub rest: Rest,
            }
        };
        assert_eq!(
            errors(input, open),
            ["subject `id` must be a named field of `Created`, not part of a flattened one; add `pub id: ..`"]
        );
    }

    #[test]
    fn missing_required_properties_get_a_suggestion() {
        let input = syn::parse_quote! {
            #[outbox(event_type = "a.b.c")]
            pub struct Created {
                pub id: uuid::Uuid,
                pub plan: String,
                pub tags: Vec<String>,
            }
        };
        assert_eq!(
            errors(input, schema()),
            [
                "struct `Created` has no field for required property `at` of `e.schema.json`; add `pub at: chrono::DateTime<chrono::Utc>`",
                "struct `Created` has no field for required property `seats` of `e.schema.json`; add `pub seats: u32`",
            ]
        );
    }

    #[test]
    fn additional_properties_schema_applies_to_other_fields() {
        let mut open = schema();
        open["additionalProperties"] = json!({"type": "integer", "minimum": 0});
        let input = syn::parse_quote! {
            #[outbox(event_type = "a.b.c")]
            pub struct Created {
                pub id: uuid::Uuid, pub seats: u32, pub plan: String,
                pub at: chrono::DateTime<chrono::Utc>, pub tags: Vec<String>,
                #[serde(default)]
                pub count: u64,
                #[serde(default)]
                pub label: String,
            }
        };
        assert_eq!(
            errors(input, open),
            ["property `label` is an integer in `e.schema.json`; use `u64`"]
        );
    }
}
