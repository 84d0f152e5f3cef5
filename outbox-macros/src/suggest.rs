//! How messages write types and schemas: a Rust type as a person writes it, a schema's JSON
//! types in words, and the Rust type to suggest for a schema.

use quote::ToTokens;
use serde_json::Value;
use syn::Type;

use crate::json::{Types, View};

/// `pub name: Type`, with a `#[serde(rename)]` when the JSON name is not a Rust identifier.
pub(crate) fn field_decl(name: &str, ty: &str) -> String {
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

/// The schema's JSON types with an article: `a string (format `uuid`)`, `an integer or null`.
pub(crate) fn describe(view: &View<'_>) -> String {
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

pub(crate) fn suggest_type(view: &View<'_>, root: &Value, depth: u32) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn field_declarations() {
        assert_eq!(field_decl("plan_id", "String"), "`pub plan_id: String`");
        assert_eq!(
            field_decl("planId", "u32"),
            "`#[serde(rename = \"planId\")] pub planid: u32`"
        );
    }
}
