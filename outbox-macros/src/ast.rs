//! The input struct as the later stages see it: named fields with their JSON names, after
//! serde's `rename`, `rename_all`, `skip`, `default` and `flatten`.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::{Attribute, Data, DeriveInput, Fields, Generics, Ident, Type};

use crate::ctxt::Ctxt;

/// The derive input, reduced to what the checks and the expansion need.
pub(crate) struct Container<'a> {
    pub(crate) ident: &'a Ident,
    pub(crate) generics: &'a Generics,
    pub(crate) attrs: &'a [Attribute],
    pub(crate) fields: Vec<Field<'a>>,
    /// `#[serde(default)]` on the struct: every field may be absent when decoding.
    pub(crate) default: bool,
}

/// One named field.
pub(crate) struct Field<'a> {
    pub(crate) member: &'a Ident,
    /// The JSON property the field is serialized as.
    pub(crate) name: String,
    pub(crate) ty: &'a Type,
    /// `#[serde(skip)]` or `#[serde(skip_serializing)]`: never written to the payload.
    pub(crate) skip_serializing: bool,
    /// `#[serde(skip)]` or `#[serde(skip_deserializing)]`: never read from the payload.
    pub(crate) skip_deserializing: bool,
    /// `#[serde(flatten)]`: its properties come from its type, which the derive cannot see.
    pub(crate) flatten: bool,
    /// `#[serde(default)]` or `#[serde(default = "..")]`: may be absent when decoding.
    pub(crate) default: bool,
    /// `#[serde(skip_serializing_if = "..")]`: may be left out of the payload.
    pub(crate) skip_serializing_if: bool,
    /// `#[serde(with = "..")]` or `#[serde(serialize_with = "..")]`: the JSON shape is chosen
    /// by user code, so the type is not checked against the schema.
    pub(crate) custom_serialize: bool,
}

impl Field<'_> {
    /// Whether the field takes part in the payload at all.
    pub(crate) fn is_serialized(&self) -> bool {
        !self.skip_serializing
    }
}

/// serde's `rename_all` rules, applied to snake_case field names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RenameRule {
    Lower,
    Upper,
    Pascal,
    Camel,
    Snake,
    ScreamingSnake,
    Kebab,
    ScreamingKebab,
}

impl RenameRule {
    pub(crate) fn from_str(s: &str) -> Option<Self> {
        Some(match s {
            "lowercase" => Self::Lower,
            "UPPERCASE" => Self::Upper,
            "PascalCase" => Self::Pascal,
            "camelCase" => Self::Camel,
            "snake_case" => Self::Snake,
            "SCREAMING_SNAKE_CASE" => Self::ScreamingSnake,
            "kebab-case" => Self::Kebab,
            "SCREAMING-KEBAB-CASE" => Self::ScreamingKebab,
            _ => return None,
        })
    }

    /// The JSON name of a field called `field` (a snake_case Rust identifier), as serde
    /// derives it.
    pub(crate) fn apply_to_field(self, field: &str) -> String {
        match self {
            Self::Lower | Self::Snake => field.to_owned(),
            Self::Upper | Self::ScreamingSnake => field.to_ascii_uppercase(),
            Self::Kebab => field.replace('_', "-"),
            Self::ScreamingKebab => field.to_ascii_uppercase().replace('_', "-"),
            Self::Pascal | Self::Camel => {
                let mut out = String::with_capacity(field.len());
                let mut upper = self == Self::Pascal;
                for c in field.chars() {
                    if c == '_' {
                        upper = true;
                    } else if upper {
                        out.push(c.to_ascii_uppercase());
                        upper = false;
                    } else {
                        out.push(c);
                    }
                }
                out
            }
        }
    }
}

/// What the serde attributes on one item say, as far as the schema checks care.
#[derive(Default)]
struct SerdeAttrs {
    rename: Option<String>,
    rename_all: Option<RenameRule>,
    skip_serializing: bool,
    skip_deserializing: bool,
    flatten: bool,
    default: bool,
    skip_serializing_if: bool,
    custom_serialize: bool,
}

/// Reads `#[serde(..)]` attributes leniently: serde's own derive reports malformed ones, so
/// anything unexpected here is skipped rather than reported twice.
fn serde_attrs(attrs: &[Attribute]) -> SerdeAttrs {
    let mut out = SerdeAttrs::default();
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let _ = attr.parse_nested_meta(|meta| {
            let key = meta
                .path
                .get_ident()
                .map(|i| i.unraw().to_string())
                .unwrap_or_default();
            match key.as_str() {
                "rename" | "rename_all" => {
                    // `rename = ".."` or `rename(serialize = "..", deserialize = "..")`: the
                    // payload is what is serialized, so the serialize name wins.
                    let mut value = None;
                    if meta.input.peek(syn::Token![=]) {
                        let lit: syn::LitStr = meta.value()?.parse()?;
                        value = Some(lit.value());
                    } else {
                        meta.parse_nested_meta(|inner| {
                            let lit: syn::LitStr = inner.value()?.parse()?;
                            if inner.path.is_ident("serialize") {
                                value = Some(lit.value());
                            }
                            Ok(())
                        })?;
                    }
                    if key == "rename" {
                        out.rename = value;
                    } else {
                        out.rename_all = value.as_deref().and_then(RenameRule::from_str);
                    }
                    Ok(())
                }
                "skip" => {
                    out.skip_serializing = true;
                    out.skip_deserializing = true;
                    Ok(())
                }
                "skip_serializing" => {
                    out.skip_serializing = true;
                    Ok(())
                }
                "skip_deserializing" => {
                    out.skip_deserializing = true;
                    Ok(())
                }
                "flatten" => {
                    out.flatten = true;
                    Ok(())
                }
                "default" => {
                    out.default = true;
                    skip_value(&meta)
                }
                "skip_serializing_if" => {
                    out.skip_serializing_if = true;
                    skip_value(&meta)
                }
                "with" | "serialize_with" => {
                    out.custom_serialize = true;
                    skip_value(&meta)
                }
                _ => skip_value(&meta),
            }
        });
    }
    out
}

/// Consumes `= <expr>` or `(..)` after a key this stage does not interpret.
fn skip_value(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        meta.value()?.parse::<syn::Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        let content;
        syn::parenthesized!(content in meta.input);
        content.parse::<proc_macro2::TokenStream>()?;
    }
    Ok(())
}

impl<'a> Container<'a> {
    /// Reads the derive input. Anything but a struct with named fields is an error: an event
    /// payload is a JSON object.
    pub(crate) fn from_ast(cx: &Ctxt, input: &'a DeriveInput) -> Option<Self> {
        let named = match &input.data {
            Data::Struct(data) => match &data.fields {
                Fields::Named(named) => named,
                Fields::Unnamed(_) | Fields::Unit => {
                    cx.error_spanned_by(
                        &input.ident,
                        "`#[derive(OutboxEvent)]` needs a struct with named fields: an event \
                         payload is a JSON object; write `struct Name { field: Type, .. }`",
                    );
                    return None;
                }
            },
            Data::Enum(_) | Data::Union(_) => {
                cx.error_spanned_by(
                    &input.ident,
                    "`#[derive(OutboxEvent)]` works on structs only: an event payload is a JSON \
                     object; wrap this type in a struct with named fields",
                );
                return None;
            }
        };
        let container = serde_attrs(&input.attrs);
        let fields = named
            .named
            .iter()
            .filter_map(|field| {
                let member = field.ident.as_ref()?;
                let attrs = serde_attrs(&field.attrs);
                let rust_name = member.unraw().to_string();
                let name = match (attrs.rename, container.rename_all) {
                    (Some(rename), _) => rename,
                    (None, Some(rule)) => rule.apply_to_field(&rust_name),
                    (None, None) => rust_name,
                };
                Some(Field {
                    member,
                    name,
                    ty: &field.ty,
                    skip_serializing: attrs.skip_serializing,
                    skip_deserializing: attrs.skip_deserializing,
                    flatten: attrs.flatten,
                    default: attrs.default,
                    skip_serializing_if: attrs.skip_serializing_if,
                    custom_serialize: attrs.custom_serialize,
                })
            })
            .collect();
        Some(Container {
            ident: &input.ident,
            generics: &input.generics,
            attrs: &input.attrs,
            fields,
            default: container.default,
        })
    }

    /// The span of the struct name, where struct-wide errors go.
    pub(crate) fn ident_span(&self) -> Span {
        self.ident.span()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(input: DeriveInput) -> Vec<(String, bool, bool, bool, bool)> {
        let cx = Ctxt::new();
        let c = Container::from_ast(&cx, &input).expect("a struct");
        assert!(cx.check().is_ok());
        c.fields
            .iter()
            .map(|f| {
                (
                    f.name.clone(),
                    f.skip_serializing,
                    f.flatten,
                    f.default,
                    f.skip_serializing_if,
                )
            })
            .collect()
    }

    #[test]
    fn serde_names() {
        let input: DeriveInput = syn::parse_quote! {
            #[serde(rename_all = "camelCase", deny_unknown_fields)]
            struct S {
                subscription_id: u64,
                #[serde(rename = "Seats")]
                seats: u32,
                #[serde(rename(serialize = "out", deserialize = "in"))]
                both: u8,
                r#type: String,
                #[serde(skip)]
                cache: u8,
                #[serde(flatten)]
                rest: Extra,
                #[serde(default, skip_serializing_if = "Option::is_none", with = "x")]
                note: Option<String>,
            }
        };
        assert_eq!(
            fields(input),
            vec![
                ("subscriptionId".into(), false, false, false, false),
                ("Seats".into(), false, false, false, false),
                ("out".into(), false, false, false, false),
                ("type".into(), false, false, false, false),
                ("cache".into(), true, false, false, false),
                ("rest".into(), false, true, false, false),
                ("note".into(), false, false, true, true),
            ]
        );
    }

    #[test]
    fn rename_rules() {
        let cases = [
            ("lowercase", "plan_id"),
            ("UPPERCASE", "PLAN_ID"),
            ("PascalCase", "PlanId"),
            ("camelCase", "planId"),
            ("snake_case", "plan_id"),
            ("SCREAMING_SNAKE_CASE", "PLAN_ID"),
            ("kebab-case", "plan-id"),
            ("SCREAMING-KEBAB-CASE", "PLAN-ID"),
        ];
        for (rule, want) in cases {
            let rule = RenameRule::from_str(rule).expect(rule);
            assert_eq!(rule.apply_to_field("plan_id"), want);
        }
        assert_eq!(RenameRule::from_str("Title Case"), None);
    }

    #[test]
    fn rejects_non_structs() {
        for input in [
            syn::parse_quote! { enum E { A } },
            syn::parse_quote! { struct T(u8); },
            syn::parse_quote! { struct U; },
        ] {
            let input: DeriveInput = input;
            let cx = Ctxt::new();
            assert!(Container::from_ast(&cx, &input).is_none());
            let errors = cx.messages();
            assert_eq!(errors.len(), 1);
            assert!(errors[0].contains("named fields") || errors[0].contains("structs only"));
        }
    }
}
