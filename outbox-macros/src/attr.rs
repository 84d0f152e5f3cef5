//! `#[outbox(..)]`: the keys, each checked where it is written.

use proc_macro2::Span;
use syn::{Attribute, LitStr};

use crate::ctxt::Ctxt;

/// The keys `#[outbox(..)]` accepts, in the order the error message lists them.
pub(crate) const KEYS: &[&str] = &["event_type", "source", "subject", "schema", "consume_only"];

/// The parsed `#[outbox(..)]` keys of one struct, each with the literal it came from so errors
/// can point at it.
#[derive(Default)]
pub(crate) struct Attrs {
    /// `event_type = ".."`, already checked against the naming rules when `Some`.
    pub(crate) event_type: Option<LitStr>,
    pub(crate) source: Option<LitStr>,
    pub(crate) subject: Option<LitStr>,
    pub(crate) schema: Option<LitStr>,
    /// `consume_only`: the span of the key.
    pub(crate) consume_only: Option<Span>,
    /// Whether `event_type` was written at all (valid or not).
    pub(crate) event_type_written: bool,
}

impl Attrs {
    /// Parses every `#[outbox(..)]` attribute in `attrs`. Errors go to `cx`; parsing goes on
    /// after each, so all of them are reported.
    pub(crate) fn from_attrs(cx: &Ctxt, attrs: &[Attribute], struct_span: Span) -> Self {
        let mut out = Attrs::default();
        for attr in attrs.iter().filter(|a| a.path().is_ident("outbox")) {
            if let syn::Meta::Path(_) = attr.meta {
                cx.error_spanned_by(
                    attr,
                    "`#[outbox]` needs its keys: write `#[outbox(event_type = \"<domain>.<entity>.<action>\")]`",
                );
                continue;
            }
            let parsed = attr.parse_nested_meta(|meta| {
                let Some(key) = meta.path.get_ident().map(ToString::to_string) else {
                    cx.error_spanned_by(&meta.path, unknown_key_message(&path_text(&meta.path)));
                    return skip_value(&meta);
                };
                let slot = match key.as_str() {
                    "event_type" => &mut out.event_type,
                    "source" => &mut out.source,
                    "subject" => &mut out.subject,
                    "schema" => &mut out.schema,
                    "consume_only" => {
                        if meta.input.peek(syn::Token![=]) || meta.input.peek(syn::token::Paren) {
                            cx.error_spanned_by(
                                &meta.path,
                                "`consume_only` is a flag and takes no value: write `#[outbox(consume_only)]`",
                            );
                            skip_value(&meta)?;
                        }
                        if out.consume_only.is_some() {
                            cx.error_spanned_by(
                                &meta.path,
                                "duplicate `#[outbox(consume_only)]`; remove this one",
                            );
                        } else {
                            out.consume_only = Some(meta.path.get_ident().map_or_else(Span::call_site, |i| i.span()));
                        }
                        return Ok(());
                    }
                    _ => {
                        cx.error_spanned_by(&meta.path, unknown_key_message(&key));
                        return skip_value(&meta);
                    }
                };
                if !meta.input.peek(syn::Token![=]) {
                    cx.error_spanned_by(
                        &meta.path,
                        format!("`{key}` needs a value: write `{key} = \"..\"`"),
                    );
                    return skip_value(&meta);
                }
                let value = meta.value()?;
                let lit = match value.parse::<syn::Lit>() {
                    Ok(syn::Lit::Str(lit)) => lit,
                    Ok(other) => {
                        cx.error_spanned_by(
                            &other,
                            format!("`{key}` takes a string literal: write `{key} = \"..\"`"),
                        );
                        return Ok(());
                    }
                    Err(_) => {
                        let expr: syn::Expr = value.parse()?;
                        cx.error_spanned_by(
                            &expr,
                            format!(
                                "`{key}` takes a string literal (macros and constants are not \
                                 expanded here): write `{key} = \"..\"`"
                            ),
                        );
                        return Ok(());
                    }
                };
                if key == "event_type" {
                    out.event_type_written = true;
                }
                if slot.is_some() {
                    cx.error_spanned_by(
                        &meta.path,
                        format!("duplicate `#[outbox({key} = ..)]`; remove this one"),
                    );
                    return Ok(());
                }
                *slot = Some(lit);
                Ok(())
            });
            if let Err(err) = parsed {
                cx.syn_error(err);
            }
        }
        out.check_values(cx, struct_span);
        out
    }

    /// Checks the values that can be checked without the schema.
    fn check_values(&mut self, cx: &Ctxt, struct_span: Span) {
        match &self.event_type {
            Some(lit) => {
                let value = lit.value();
                if let Err(why) = outbox_schema::naming::check_event_type(&value) {
                    cx.error_spanned_by(lit, format!("invalid event type `{value}`: {why}"));
                    self.event_type = None;
                }
            }
            None if !self.event_type_written => cx.error_at(
                struct_span,
                "missing `#[outbox(event_type = \"..\")]`: name the event type this struct is, like \
                 `#[outbox(event_type = \"billing.subscription.created\")]`",
            ),
            None => {}
        }
        if let Some(lit) = &self.source {
            let value = lit.value();
            if value.is_empty() || value.chars().any(char::is_whitespace) {
                cx.error_spanned_by(
                    lit,
                    format!(
                        "invalid source `{value}`: the source names the emitting service, \
                         non-empty and without whitespace, like `billing`; or leave `source` out \
                         to use the package name"
                    ),
                );
            }
        }
        for (key, lit) in [("subject", &self.subject), ("schema", &self.schema)] {
            if let Some(lit) = lit {
                if lit.value().trim().is_empty() {
                    cx.error_spanned_by(
                        lit,
                        format!("`{key}` is empty; give a value or leave the key out"),
                    );
                }
            }
        }
        if self
            .subject
            .as_ref()
            .is_some_and(|l| l.value().trim().is_empty())
        {
            self.subject = None;
        }
        if self
            .schema
            .as_ref()
            .is_some_and(|l| l.value().trim().is_empty())
        {
            self.schema = None;
        }
    }
}

fn unknown_key_message(key: &str) -> String {
    format!(
        "unknown key `{key}` in `#[outbox(..)]`; the known keys are {}",
        KEYS.iter()
            .map(|k| format!("`{k}`"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn path_text(path: &syn::Path) -> String {
    path.segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::")
}

/// Consumes the value of a key that was already reported, so the keys after it still parse.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(attrs: Vec<Attribute>) -> (Attrs, Vec<String>) {
        let cx = Ctxt::new();
        let a = Attrs::from_attrs(&cx, &attrs, Span::call_site());
        let errors = cx.messages();
        (a, errors)
    }

    #[test]
    fn all_keys() {
        let (a, errors) = parse(vec![syn::parse_quote! {
            #[outbox(event_type = "billing.subscription.created", source = "billing",
                     subject = "subscription_id", schema = "x.json", consume_only)]
        }]);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            a.event_type.unwrap().value(),
            "billing.subscription.created"
        );
        assert_eq!(a.source.unwrap().value(), "billing");
        assert_eq!(a.subject.unwrap().value(), "subscription_id");
        assert_eq!(a.schema.unwrap().value(), "x.json");
        assert!(a.consume_only.is_some());
    }

    #[test]
    fn keys_across_attributes() {
        let (a, errors) = parse(vec![
            syn::parse_quote!(#[outbox(event_type = "a.b.c")]),
            syn::parse_quote!(#[doc = "x"]),
            syn::parse_quote!(#[outbox(subject = "id")]),
        ]);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(a.event_type.unwrap().value(), "a.b.c");
        assert_eq!(a.subject.unwrap().value(), "id");
        assert!(a.consume_only.is_none() && a.source.is_none());
    }

    #[test]
    fn errors_are_all_reported() {
        let (_, errors) = parse(vec![
            syn::parse_quote!(#[outbox(event_type = "a.b.c", evnt_type = "x", subject = 5)]),
            syn::parse_quote!(#[outbox(event_type = "a.b.d", consume_only = true, consume_only)]),
            syn::parse_quote!(#[outbox(source = "my service", schema = concat!("a", "b"), nats::subject = "x")]),
        ]);
        let want = [
            "unknown key `evnt_type` in `#[outbox(..)]`; the known keys are `event_type`, `source`, `subject`, `schema`, `consume_only`",
            "`subject` takes a string literal",
            "duplicate `#[outbox(event_type = ..)]`; remove this one",
            "`consume_only` is a flag and takes no value",
            "duplicate `#[outbox(consume_only)]`; remove this one",
            "`schema` takes a string literal (macros and constants are not expanded here)",
            "unknown key `nats::subject`",
            "invalid source `my service`",
        ];
        assert_eq!(errors.len(), want.len(), "{errors:#?}");
        for (got, want) in errors.iter().zip(want) {
            assert!(got.starts_with(want), "{got:?} should start with {want:?}");
        }
    }

    #[test]
    fn event_type_is_checked_and_required() {
        let (a, errors) = parse(vec![
            syn::parse_quote!(#[outbox(event_type = "Billing.*.x")]),
        ]);
        assert!(a.event_type.is_none());
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with("invalid event type `Billing.*.x`: `*` is a NATS wildcard"),
            "{errors:?}"
        );

        let (_, errors) = parse(vec![syn::parse_quote!(#[outbox(subject = "id")])]);
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with("missing `#[outbox(event_type = \"..\")]`"),
            "{errors:?}"
        );

        let (_, errors) = parse(vec![syn::parse_quote!(#[outbox])]);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains("needs its keys"));
    }
}
