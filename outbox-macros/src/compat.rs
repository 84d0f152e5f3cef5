//! Whether a Rust type and a schema hold the same JSON values, both ways: every value the type
//! can produce is allowed, and every value the schema allows decodes (as far as the derive can
//! see the type).

use serde_json::Value;
use syn::Type;

use crate::json::{Types, View};
use crate::suggest::{describe, suggest, type_text};
use crate::ty::{classify, RustTy};

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
}
