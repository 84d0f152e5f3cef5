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

use quote::ToTokens;
use serde_json::Value;
use syn::ext::IdentExt;
use syn::{LitStr, Type};

use crate::ast::{Container, Field};
use crate::attr::Attrs;
use crate::ctxt::Ctxt;
use crate::json::{Types, View};
use crate::ty::{classify, option_inner, RustTy};

/// What the expansion needs from a successful check.
pub(crate) struct Checked {
    /// The subject's JSON property and the field that carries it.
    pub(crate) subject: Option<(String, syn::Ident)>,
}

/// Checks `cont` against the resolved schema `root` (shown in messages as `file`).
pub(crate) fn check(
    cx: &Ctxt,
    cont: &Container<'_>,
    attrs: &Attrs,
    event_type: &LitStr,
    root: &Value,
    file: &str,
    schema_subject: Option<&str>,
) -> Checked {
    let empty = serde_json::Map::new();
    let properties = root
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let required: BTreeSet<&str> = root
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let closed = root.get("additionalProperties") == Some(&Value::Bool(false))
        || root.get("unevaluatedProperties") == Some(&Value::Bool(false));
    let additional = root.get("additionalProperties").filter(|v| v.is_object());
    let has_flatten = cont.fields.iter().any(|f| f.flatten && f.is_serialized());

    for field in cont.fields.iter().filter(|f| f.is_serialized()) {
        if field.flatten {
            if closed && matches!(classify(field.ty), RustTy::Map(_) | RustTy::Json) {
                cx.error_spanned_by(
                    field.member,
                    format!(
                        "`{file}` is closed (additionalProperties: false), but this flattened \
                         map collects any property; remove `#[serde(flatten)]` from `{}` or \
                         allow additional properties in the schema",
                        field.member
                    ),
                );
            }
            continue;
        }
        match properties.get(&field.name) {
            None if closed => {
                let rust_name = field.member.unraw().to_string();
                let renamed = if rust_name == field.name {
                    String::new()
                } else {
                    format!(" (the JSON name serde gives the field `{rust_name}`)")
                };
                cx.error_spanned_by(
                    field.member,
                    format!(
                        "`{file}` does not allow `{}`{renamed} (additionalProperties: false); \
                         remove the field or add the property to the schema",
                        field.name
                    ),
                )
            }
            None => {
                if let Some(schema) = additional {
                    check_field(cx, cont, field, schema, root, file, false);
                }
            }
            Some(schema) => check_field(
                cx,
                cont,
                field,
                schema,
                root,
                file,
                required.contains(field.name.as_str()),
            ),
        }
    }

    if !has_flatten {
        for name in &required {
            if !cont
                .fields
                .iter()
                .any(|f| f.is_serialized() && !f.flatten && f.name == *name)
            {
                let suggested = properties
                    .get(*name)
                    .map(|s| suggest_type(&View::of(s, root), root, 0))
                    .unwrap_or_else(|| "serde_json::Value".into());
                cx.error_at(
                    cont.ident_span(),
                    format!(
                        "struct `{}` has no field for required property `{name}` of `{file}`; \
                         add {}",
                        cont.ident,
                        field_decl(name, &suggested)
                    ),
                );
            }
        }
    }

    Checked {
        subject: check_subject(
            cx,
            cont,
            attrs,
            event_type,
            root,
            file,
            schema_subject,
            &required,
        ),
    }
}

/// `pub name: Type`, with a `#[serde(rename)]` when the JSON name is not a Rust identifier.
fn field_decl(name: &str, ty: &str) -> String {
    let ident_like = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ident_like && syn::parse_str::<syn::Ident>(name).is_ok() {
        format!("`pub {name}: {ty}`")
    } else {
        let ident: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        format!("`#[serde(rename = \"{name}\")] pub {ident}: {ty}`")
    }
}

fn check_field(
    cx: &Ctxt,
    cont: &Container<'_>,
    field: &Field<'_>,
    schema: &Value,
    root: &Value,
    file: &str,
    required: bool,
) {
    let view = View::of(schema, root);
    let what = format!("property `{}`", field.name);
    let inner = option_inner(field.ty);
    if required {
        if field.skip_serializing_if {
            cx.error_spanned_by(
                field.member,
                format!(
                    "{what} is required in `{file}`, but `skip_serializing_if` can leave it out \
                     of the payload; remove `skip_serializing_if` from `{}`",
                    field.member
                ),
            );
        }
        if let (Some(inner), false) = (inner, view.allows_null()) {
            cx.error_spanned_by(
                field.ty,
                format!(
                    "{what} is required and not nullable in `{file}`; use `{}` instead of `Option<..>`",
                    type_text(inner)
                ),
            );
            if !field.custom_serialize {
                if let Err((at, msg)) = compatible(inner, &view, root, &what, file) {
                    cx.error_spanned_by(at, msg);
                }
            }
            return;
        }
    } else if let Some(inner) = inner {
        if !view.allows_null() && !field.skip_serializing_if {
            cx.error_spanned_by(
                field.ty,
                format!(
                    "{what} is optional and not nullable in `{file}`, so `None` must be left out, \
                     not written as `null`; add `#[serde(skip_serializing_if = \"Option::is_none\")]` \
                     to `{}`",
                    field.member
                ),
            );
        }
        if !field.custom_serialize {
            let non_null = View {
                types: view.types.without(Types::NULL),
                ..view.clone()
            };
            if let Err((at, msg)) = compatible(inner, &non_null, root, &what, file) {
                cx.error_spanned_by(at, msg);
            }
        }
        return;
    } else if !field.default && !cont.default && !field.skip_deserializing {
        cx.error_spanned_by(
            field.ty,
            format!(
                "{what} is optional in `{file}`, so payloads without it must decode; make it \
                 `Option<{}>` (or add `#[serde(default)]`)",
                type_text(field.ty)
            ),
        );
        return;
    }
    if field.custom_serialize {
        return;
    }
    if let Err((at, msg)) = compatible(field.ty, &view, root, &what, file) {
        cx.error_spanned_by(at, msg);
    }
}

/// A type as a person writes it: `Option<chrono::DateTime<chrono::Utc>>`, not the spaced-out
/// token text.
pub(crate) fn type_text(ty: &Type) -> String {
    let mut out = String::new();
    let text = ty.to_token_stream().to_string();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ' ' {
            let prev = out.chars().last();
            let next = chars.peek().copied();
            let glue_prev = matches!(prev, Some(':' | '<' | '&' | '(' | '['));
            let glue_next = matches!(next, Some(':' | '<' | '>' | ',' | ')' | ';' | ']'));
            if glue_prev || glue_next {
                continue;
            }
        }
        out.push(c);
    }
    out
}

/// Whether values of `ty` and values of the schema seen as `view` are the same JSON values
/// (as far as the derive can see). The error is the offending (innermost) type and the whole
/// message.
pub(crate) fn compatible<'t>(
    ty: &'t Type,
    view: &View<'_>,
    root: &Value,
    what: &str,
    file: &str,
) -> Result<(), (&'t Type, String)> {
    inner_compatible(ty, view, root, what, file)
        .map_err(|msg| (ty, msg))
        .and_then(|nested| match nested {
            Some(err) => Err(err),
            None => Ok(()),
        })
}

/// `Ok(Some(..))` is a mismatch inside an item or value type, already located.
#[allow(clippy::type_complexity)]
fn inner_compatible<'t>(
    ty: &'t Type,
    view: &View<'_>,
    root: &Value,
    what: &str,
    file: &str,
) -> Result<Option<(&'t Type, String)>, String> {
    let allowed = view.types;
    let mismatch = || {
        Err(format!(
            "{what} is {} in `{file}`; use {}",
            describe(view),
            suggest(view, root)
        ))
    };
    let rust = classify(ty);
    match rust {
        RustTy::Json | RustTy::Opaque => Ok(None),
        RustTy::Option(inner) => {
            if !view.allows_null() {
                return Err(format!(
                    "{what} is not nullable in `{file}`; use `{}` instead of `Option<..>`",
                    type_text(inner)
                ));
            }
            let non_null = View {
                types: allowed.without(Types::NULL),
                ..view.clone()
            };
            Ok(compatible(inner, &non_null, root, what, file).err())
        }
        RustTy::Unit if allowed == Types::NULL => Ok(None),
        RustTy::Bool if allowed == Types::BOOLEAN => Ok(None),
        RustTy::Float if allowed == Types::NUMBER => Ok(None),
        RustTy::Str { name, formats } if allowed == Types::STRING => match view.format {
            Some(format) if !formats.is_empty() && !formats.contains(&format) => Err(format!(
                "{what} is a string with format `{format}` in `{file}`, which `{name}` does not \
                 hold; use {}",
                suggest(view, root)
            )),
            _ => Ok(None),
        },
        RustTy::Int { name, min, max } if allowed == Types::INTEGER => {
            let unsigned = min >= 0.0;
            match view.minimum {
                None if unsigned => {
                    return Err(format!(
                        "{what} is an integer without a `minimum` in `{file}`, so it may be \
                         negative, which `{name}` cannot hold; use `i64`, or add `\"minimum\": {}` \
                         to the schema",
                        min
                    ))
                }
                Some(m) if m < min => {
                    return Err(format!(
                        "{what} may be as low as {m} in `{file}`, which `{name}` cannot hold; \
                         use {}",
                        suggest(view, root)
                    ))
                }
                _ => {}
            }
            match view.maximum {
                Some(m) if m > max => Err(format!(
                    "{what} may be as high as {m} in `{file}`, which `{name}` cannot hold; use {}",
                    suggest(view, root)
                )),
                _ => Ok(None),
            }
        }
        RustTy::Seq(item) if allowed == Types::ARRAY => match (item, view.items) {
            (Some(item), Some(items)) => {
                let what = format!("each item of {what}");
                Ok(compatible(item, &View::of(items, root), root, &what, file).err())
            }
            _ => Ok(None),
        },
        RustTy::Map(value) if allowed == Types::OBJECT => match (value, view.additional) {
            (Some(value), Some(schema)) => {
                let what = format!("each value of {what}");
                Ok(compatible(value, &View::of(schema, root), root, &what, file).err())
            }
            _ => Ok(None),
        },
        _ => mismatch(),
    }
}

/// The schema's JSON types with an article: `a string (format `uuid`)`, `an integer or null`.
fn describe(view: &View<'_>) -> String {
    let base = view.types.describe();
    let base = if base.starts_with("any ") || base.starts_with("no ") {
        base
    } else if base.starts_with(['a', 'e', 'i', 'o', 'u']) {
        format!("an {base}")
    } else {
        format!("a {base}")
    };
    match (
        view.format,
        view.types.without(Types::NULL) == Types::STRING,
    ) {
        (Some(format), true) => format!("{base} (format `{format}`)"),
        _ => base,
    }
}

/// The Rust type to suggest for a schema, in backticks (or a phrase with backticked types).
pub(crate) fn suggest(view: &View<'_>, root: &Value) -> String {
    format!("`{}`", suggest_type(view, root, 0))
}

fn suggest_type(view: &View<'_>, root: &Value, depth: u32) -> String {
    let base = view.types.without(Types::NULL);
    let ty = if base == Types::STRING {
        match view.format {
            Some("date-time") => "chrono::DateTime<chrono::Utc>".to_owned(),
            Some("uuid") => "uuid::Uuid".to_owned(),
            Some("date") => "chrono::NaiveDate".to_owned(),
            _ => "String".to_owned(),
        }
    } else if base == Types::INTEGER {
        match (view.minimum, view.maximum) {
            (Some(min), Some(max)) if min >= 0.0 && max <= u32::MAX as f64 => "u32".into(),
            (Some(min), _) if min >= 1.0 => "std::num::NonZeroU64".into(),
            (Some(min), _) if min >= 0.0 => "u64".into(),
            _ => "i64".into(),
        }
    } else if base == Types::NUMBER || base == Types::FRACTION {
        "f64".into()
    } else if base == Types::BOOLEAN {
        "bool".into()
    } else if base == Types::ARRAY {
        match view.items {
            Some(items) if depth < 8 => {
                format!(
                    "Vec<{}>",
                    suggest_type(&View::of(items, root), root, depth + 1)
                )
            }
            _ => "Vec<serde_json::Value>".into(),
        }
    } else if base == Types::OBJECT {
        "serde_json::Map<String, serde_json::Value>".into()
    } else {
        "serde_json::Value".into()
    };
    if view.allows_null() && base != Types::NONE && ty != "serde_json::Value" {
        format!("Option<{ty}>")
    } else {
        ty
    }
}

#[allow(clippy::too_many_arguments)]
fn check_subject(
    cx: &Ctxt,
    cont: &Container<'_>,
    attrs: &Attrs,
    event_type: &LitStr,
    root: &Value,
    file: &str,
    schema_subject: Option<&str>,
    required: &BTreeSet<&str>,
) -> Option<(String, syn::Ident)> {
    // Errors about a subject named by the schema go on the event type, which chose the schema.
    let (name, lit) = match (&attrs.subject, schema_subject) {
        (Some(lit), Some(from_schema)) if lit.value() != from_schema => {
            cx.error_spanned_by(
                lit,
                format!(
                    "`subject = \"{}\"` disagrees with `\"x-outbox-subject\": \"{from_schema}\"` \
                     in `{file}`; remove `subject` or make the two equal",
                    lit.value()
                ),
            );
            return None;
        }
        (Some(lit), _) => (lit.value(), lit),
        (None, Some(from_schema)) => (from_schema.to_owned(), event_type),
        (None, None) => return None,
    };
    let fix = "the subject must be a required string, uuid or integer property";
    let Some(schema) = root.get("properties").and_then(|p| p.get(&name)) else {
        cx.error_spanned_by(
            lit,
            format!("subject `{name}` is not a property of `{file}`; {fix}"),
        );
        return None;
    };
    if !required.contains(name.as_str()) {
        cx.error_spanned_by(
            lit,
            format!("subject `{name}` is an optional property of `{file}`; {fix}"),
        );
        return None;
    }
    let view = View::of(schema, root);
    if view.types != Types::STRING && view.types != Types::INTEGER {
        cx.error_spanned_by(
            lit,
            format!("subject `{name}` is {} in `{file}`; {fix}", describe(&view)),
        );
        return None;
    }
    let field = cont
        .fields
        .iter()
        .find(|f| f.is_serialized() && !f.flatten && f.name == name);
    match field {
        // A missing required property is reported on the struct already.
        None if cont.fields.iter().any(|f| f.flatten) => {
            cx.error_spanned_by(
                lit,
                format!(
                    "subject `{name}` must be a named field of `{}`, not part of a flattened one; \
                     add `pub {name}: ..`",
                    cont.ident
                ),
            );
            None
        }
        None => None,
        Some(field) if option_inner(field.ty).is_some() => {
            cx.error_spanned_by(
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
        check(
            &cx,
            &cont,
            &attrs,
            &et,
            &schema,
            "e.schema.json",
            subject.as_deref(),
        );
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
    fn type_text_reads_like_source() {
        let cases: [(Type, &str); 4] = [
            (
                syn::parse_quote!(Option<chrono::DateTime<chrono::Utc>>),
                "Option<chrono::DateTime<chrono::Utc>>",
            ),
            (
                syn::parse_quote!(::std::collections::HashMap<String, Vec<u8>>),
                "::std::collections::HashMap<String, Vec<u8>>",
            ),
            (syn::parse_quote!(&'a str), "&'a str"),
            (syn::parse_quote!([u8; 4]), "[u8; 4]"),
        ];
        for (ty, want) in cases {
            assert_eq!(type_text(&ty), want);
        }
    }

    #[test]
    fn integer_ranges_and_numbers() {
        let root = json!({});
        let check = |ty: Type, schema: Value| {
            compatible(&ty, &View::of(&schema, &root), &root, "property `x`", "f")
                .err()
                .map(|(_, msg)| msg)
        };
        assert_eq!(
            check(syn::parse_quote!(i64), json!({"type": "integer"})),
            None
        );
        assert_eq!(
            check(syn::parse_quote!(i32), json!({"type": "integer"})),
            None
        );
        assert!(check(syn::parse_quote!(u64), json!({"type": "integer"}))
            .unwrap()
            .contains("may be negative"));
        assert_eq!(
            check(
                syn::parse_quote!(u32),
                json!({"type": "integer", "minimum": 0})
            ),
            None
        );
        assert!(check(
            syn::parse_quote!(NonZeroU32),
            json!({"type": "integer", "minimum": 0})
        )
        .unwrap()
        .contains("as low as 0"));
        assert_eq!(
            check(
                syn::parse_quote!(NonZeroU32),
                json!({"type": "integer", "exclusiveMinimum": 0})
            ),
            None
        );
        assert!(check(syn::parse_quote!(i64), json!({"type": "number"}))
            .unwrap()
            .contains("is a number"));
        assert!(check(syn::parse_quote!(f64), json!({"type": "integer"}))
            .unwrap()
            .contains("use `i64`"));
        assert_eq!(
            check(syn::parse_quote!(f32), json!({"type": "number"})),
            None
        );
        assert!(check(
            syn::parse_quote!(String),
            json!({"type": ["string", "null"]})
        )
        .unwrap()
        .contains("use `Option<String>`"));
        assert!(check(syn::parse_quote!(String), json!({}))
            .unwrap()
            .contains("any JSON value"));
        assert_eq!(check(syn::parse_quote!(serde_json::Value), json!({})), None);
        assert_eq!(
            check(
                syn::parse_quote!(Option<String>),
                json!({"type": ["string", "null"]})
            ),
            None
        );
        assert!(check(
            syn::parse_quote!(Vec<Option<u8>>),
            json!({"type": "array", "items": {"type": "integer", "minimum": 0}})
        )
        .unwrap()
        .contains("not nullable"));
        assert!(check(syn::parse_quote!(bool), json!({"type": "string"}))
            .unwrap()
            .contains("use `String`"));
        assert!(check(syn::parse_quote!(String), json!({"type": "object"}))
            .unwrap()
            .contains("serde_json::Map"));
    }

    #[test]
    fn nested_mismatch_points_at_the_inner_type() {
        let root = json!({});
        let ty: Type = syn::parse_quote!(Vec<HashMap<String, i64>>);
        let schema = json!({"type": "array", "items": {"type": "object", "additionalProperties": {"type": "string"}}});
        let (at, msg) = compatible(&ty, &View::of(&schema, &root), &root, "property `x`", "f")
            .expect_err("i64 is not a string");
        assert_eq!(type_text(at), "i64");
        assert_eq!(
            msg,
            "each value of each item of property `x` is a string in `f`; use `String`"
        );
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
}
