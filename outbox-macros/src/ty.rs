//! What a Rust field type serializes to, as far as a derive can tell from its path.
//!
//! Types are recognised by the last segment of their path (`String`, `std::string::String`
//! and `::std::string::String` are the same here), as serde does for `Option`. A path the
//! derive does not know (a user struct, enum or newtype) is opaque: the derive cannot see
//! inside it, so it is accepted for any schema and left to runtime validation.

use syn::{GenericArgument, PathArguments, Type};

/// The JSON shape of a Rust type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum RustTy<'a> {
    /// `Option<T>`: `null` or `T`.
    Option(&'a Type),
    /// A string. `formats` lists the schema formats the type can decode every value of (empty:
    /// any string); `name` is the type as written in messages.
    Str {
        name: &'static str,
        formats: &'static [&'static str],
    },
    Bool,
    /// An integer type with its range.
    Int {
        name: &'static str,
        min: f64,
        max: f64,
    },
    Float,
    /// A sequence; the item type when the derive can see it.
    Seq(Option<&'a Type>),
    /// A map with string keys; the value type when the derive can see it.
    Map(Option<&'a Type>),
    /// `serde_json::Value`: any JSON value.
    Json,
    /// `()`: `null`.
    Unit,
    /// A type the derive cannot see into.
    Opaque,
}

/// Strips groups, parentheses and references, then `Box`, `Rc`, `Arc` and `Cow`, which
/// serialize as what they hold.
fn peel(mut ty: &Type) -> &Type {
    loop {
        ty = match ty {
            Type::Group(g) => &g.elem,
            Type::Paren(p) => &p.elem,
            Type::Reference(r) => &r.elem,
            Type::Path(p) if p.qself.is_none() => {
                let Some(last) = p.path.segments.last() else {
                    return ty;
                };
                match last.ident.to_string().as_str() {
                    "Box" | "Rc" | "Arc" | "Cow" => match type_args(&last.arguments).last() {
                        Some(inner) => inner,
                        None => return ty,
                    },
                    _ => return ty,
                }
            }
            _ => return ty,
        };
    }
}

fn type_args(args: &PathArguments) -> Vec<&Type> {
    match args {
        PathArguments::AngleBracketed(a) => a
            .args
            .iter()
            .filter_map(|arg| match arg {
                GenericArgument::Type(t) => Some(t),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn int(name: &'static str) -> Option<RustTy<'static>> {
    let (min, max) = match name {
        "i8" => (i8::MIN as f64, i8::MAX as f64),
        "i16" => (i16::MIN as f64, i16::MAX as f64),
        "i32" => (i32::MIN as f64, i32::MAX as f64),
        "i64" | "isize" => (i64::MIN as f64, i64::MAX as f64),
        "i128" => (i128::MIN as f64, i128::MAX as f64),
        "u8" => (0.0, u8::MAX as f64),
        "u16" => (0.0, u16::MAX as f64),
        "u32" => (0.0, u32::MAX as f64),
        "u64" | "usize" => (0.0, u64::MAX as f64),
        "u128" => (0.0, u128::MAX as f64),
        _ => return None,
    };
    Some(RustTy::Int { name, min, max })
}

const INTS: &[&str] = &[
    "i8", "i16", "i32", "i64", "i128", "isize", "u8", "u16", "u32", "u64", "u128", "usize",
];

/// `NonZeroU64` and friends: the range of the primitive without zero (for unsigned ones, the
/// minimum becomes 1).
fn non_zero(prim: &str) -> Option<RustTy<'static>> {
    let name = INTS.iter().find(|n| n.eq_ignore_ascii_case(prim))?;
    match int(name)? {
        RustTy::Int { min: 0.0, max, .. } => Some(RustTy::Int {
            name: non_zero_name(name),
            min: 1.0,
            max,
        }),
        other => Some(other),
    }
}

fn non_zero_name(prim: &str) -> &'static str {
    match prim {
        "u8" => "NonZeroU8",
        "u16" => "NonZeroU16",
        "u32" => "NonZeroU32",
        "u64" => "NonZeroU64",
        "u128" => "NonZeroU128",
        "usize" => "NonZeroUsize",
        _ => "NonZero",
    }
}

/// Classifies a field type.
pub(crate) fn classify(ty: &Type) -> RustTy<'_> {
    let ty = peel(ty);
    match ty {
        Type::Array(a) => RustTy::Seq(Some(&a.elem)),
        Type::Slice(s) => RustTy::Seq(Some(&s.elem)),
        Type::Tuple(t) if t.elems.is_empty() => RustTy::Unit,
        Type::Tuple(_) => RustTy::Seq(None),
        Type::Path(p) if p.qself.is_none() => {
            let Some(last) = p.path.segments.last() else {
                return RustTy::Opaque;
            };
            let name = last.ident.to_string();
            let args = type_args(&last.arguments);
            let in_serde_json = p.path.segments.iter().any(|s| s.ident == "serde_json");
            match name.as_str() {
                "Option" if args.len() == 1 => RustTy::Option(args[0]),
                "String" | "str" | "char" => RustTy::Str {
                    name: "String",
                    formats: &[],
                },
                "bool" => RustTy::Bool,
                "f32" | "f64" => RustTy::Float,
                "Vec" | "VecDeque" | "LinkedList" | "HashSet" | "BTreeSet" | "IndexSet"
                | "BinaryHeap" => RustTy::Seq(args.first().copied()),
                "HashMap" | "BTreeMap" | "IndexMap" => RustTy::Map(args.get(1).copied()),
                "Map" if in_serde_json || args.len() == 2 => RustTy::Map(args.get(1).copied()),
                "Value" if in_serde_json || p.path.segments.len() == 1 => RustTy::Json,
                "DateTime" => RustTy::Str {
                    name: "chrono::DateTime<chrono::Utc>",
                    formats: &["date-time"],
                },
                "NaiveDate" => RustTy::Str {
                    name: "chrono::NaiveDate",
                    formats: &["date"],
                },
                "NaiveTime" => RustTy::Str {
                    name: "chrono::NaiveTime",
                    formats: &["time"],
                },
                // No JSON Schema format matches a date-time without an offset.
                "NaiveDateTime" => RustTy::Str {
                    name: "chrono::NaiveDateTime",
                    formats: &[],
                },
                "Uuid" => RustTy::Str {
                    name: "uuid::Uuid",
                    formats: &["uuid"],
                },
                "Ipv4Addr" => RustTy::Str {
                    name: "std::net::Ipv4Addr",
                    formats: &["ipv4"],
                },
                "Ipv6Addr" => RustTy::Str {
                    name: "std::net::Ipv6Addr",
                    formats: &["ipv6"],
                },
                "IpAddr" => RustTy::Str {
                    name: "std::net::IpAddr",
                    formats: &["ipv4", "ipv6"],
                },
                "Url" => RustTy::Str {
                    name: "url::Url",
                    formats: &["uri"],
                },
                "NonZero" if args.len() == 1 => match classify(args[0]) {
                    RustTy::Int { name, min, max } => RustTy::Int {
                        name: if min == 0.0 {
                            non_zero_name(name)
                        } else {
                            name
                        },
                        min: if min == 0.0 { 1.0 } else { min },
                        max,
                    },
                    _ => RustTy::Opaque,
                },
                other => {
                    if let Some(prim) = other.strip_prefix("NonZero") {
                        if let Some(t) = non_zero(prim) {
                            return t;
                        }
                    }
                    INTS.iter()
                        .find(|n| **n == other)
                        .and_then(|n| int(n))
                        .unwrap_or(RustTy::Opaque)
                }
            }
        }
        _ => RustTy::Opaque,
    }
}

/// `Option<T>` -> `Some(T)`.
pub(crate) fn option_inner(ty: &Type) -> Option<&Type> {
    match classify(ty) {
        RustTy::Option(inner) => Some(inner),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(ty: Type) -> String {
        format!("{:?}", classify(&ty))
    }

    #[test]
    fn classifies_typify_and_hand_written_types() {
        assert!(c(syn::parse_quote!(::std::string::String)).starts_with("Str { name: \"String\""));
        assert!(c(syn::parse_quote!(&'a str)).starts_with("Str { name: \"String\""));
        assert!(c(syn::parse_quote!(Cow<'a, str>)).starts_with("Str { name: \"String\""));
        assert!(
            c(syn::parse_quote!(::chrono::DateTime<::chrono::offset::Utc>)).contains("date-time")
        );
        assert!(c(syn::parse_quote!(::uuid::Uuid)).contains("\"uuid\""));
        assert_eq!(c(syn::parse_quote!(bool)), "Bool");
        assert_eq!(c(syn::parse_quote!(f64)), "Float");
        assert_eq!(c(syn::parse_quote!(::serde_json::Value)), "Json");
        assert_eq!(c(syn::parse_quote!(Value)), "Json");
        assert_eq!(c(syn::parse_quote!(my::Value)), "Opaque");
        assert_eq!(c(syn::parse_quote!(Plan)), "Opaque");
        assert_eq!(c(syn::parse_quote!(())), "Unit");
        assert_eq!(c(syn::parse_quote!(Box<bool>)), "Bool");
        assert_eq!(
            classify(&syn::parse_quote!(u32)),
            RustTy::Int {
                name: "u32",
                min: 0.0,
                max: u32::MAX as f64
            }
        );
        assert_eq!(
            classify(&syn::parse_quote!(::std::num::NonZeroU64)),
            RustTy::Int {
                name: "NonZeroU64",
                min: 1.0,
                max: u64::MAX as f64
            }
        );
        assert_eq!(
            classify(&syn::parse_quote!(std::num::NonZero<u32>)),
            RustTy::Int {
                name: "NonZeroU32",
                min: 1.0,
                max: u32::MAX as f64
            }
        );
        assert_eq!(
            classify(&syn::parse_quote!(i16)),
            RustTy::Int {
                name: "i16",
                min: i16::MIN as f64,
                max: i16::MAX as f64
            }
        );
        assert!(matches!(
            classify(&syn::parse_quote!(::std::option::Option<u8>)),
            RustTy::Option(_)
        ));
        assert!(matches!(
            classify(&syn::parse_quote!(Vec<String>)),
            RustTy::Seq(Some(_))
        ));
        assert!(matches!(
            classify(&syn::parse_quote!([u8; 4])),
            RustTy::Seq(Some(_))
        ));
        assert!(matches!(
            classify(&syn::parse_quote!(HashMap<String, u8>)),
            RustTy::Map(Some(_))
        ));
        assert!(matches!(
            classify(
                &syn::parse_quote!(::serde_json::Map<::std::string::String, ::serde_json::Value>)
            ),
            RustTy::Map(Some(_))
        ));
        assert!(option_inner(&syn::parse_quote!(Option<String>)).is_some());
        assert!(option_inner(&syn::parse_quote!(String)).is_none());
    }
}
