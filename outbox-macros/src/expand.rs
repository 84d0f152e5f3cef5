//! The generated `impl`s: the real one after a clean check, a stub one next to the errors.

use proc_macro2::TokenStream;
use quote::quote;

use crate::ast::Container;
use crate::attr::Attrs;
use crate::check::Checked;
use crate::schema::Loaded;

/// `SOURCE`: the `source` key, else the package name of the crate that uses the derive.
fn source(attrs: &Attrs) -> TokenStream {
    match &attrs.source {
        Some(lit) => quote!(#lit),
        None => quote!(::core::env!("CARGO_PKG_NAME")),
    }
}

fn emit_impl(cont: &Container<'_>, attrs: &Attrs) -> TokenStream {
    if attrs.consume_only.is_some() {
        return TokenStream::new();
    }
    let ident = cont.ident;
    let (impl_generics, ty_generics, where_clause) = cont.generics.split_for_impl();
    quote! {
        #[automatically_derived]
        impl #impl_generics ::outbox_runtime::EmitEvent for #ident #ty_generics #where_clause {}
    }
}

/// The impls for a struct that passed every check.
pub(crate) fn expand(
    cont: &Container<'_>,
    attrs: &Attrs,
    event_type: &str,
    loaded: &Loaded,
    checked: &Checked,
) -> TokenStream {
    let ident = cont.ident;
    let (impl_generics, ty_generics, where_clause) = cont.generics.split_for_impl();
    let source = source(attrs);
    let schema_text = loaded.schema.resolved.to_string();
    let tracked = loaded.files.iter().map(|f| {
        let path = f.display().to_string();
        quote!(
            const _: &[u8] = ::core::include_bytes!(#path);
        )
    });
    let (subject_property, subject_body) = match &checked.subject {
        Some((property, member)) => (
            quote!(::core::option::Option::Some(#property)),
            quote! {
                // The subject is the property's JSON text: a string as it is, a number in its
                // decimal form, whatever the field's Rust type (string, uuid, integer, newtype).
                match ::outbox_runtime::__private::serde_json::to_value(&self.#member) {
                    ::core::result::Result::Ok(
                        ::outbox_runtime::__private::serde_json::Value::String(text),
                    ) => text,
                    ::core::result::Result::Ok(other) => ::std::string::ToString::to_string(&other),
                    // Unreachable in practice: the payload holding this field has serialized
                    // before the subject is asked for.
                    ::core::result::Result::Err(_) => {
                        ::std::string::String::from(::outbox_runtime::PLATFORM_SUBJECT)
                    }
                }
            },
        ),
        None => (
            quote!(::core::option::Option::None),
            quote!(::std::string::String::from(
                ::outbox_runtime::PLATFORM_SUBJECT
            )),
        ),
    };
    let emit = emit_impl(cont, attrs);
    quote! {
        // Every schema file is a compile-time input: editing one rebuilds this crate.
        const _: () = { #(#tracked)* };

        #[automatically_derived]
        impl #impl_generics ::outbox_runtime::OutboxEvent for #ident #ty_generics #where_clause {
            const EVENT_TYPE: &'static str = #event_type;
            const SOURCE: &'static str = #source;
            const SUBJECT_PROPERTY: ::core::option::Option<&'static str> = #subject_property;
            const SCHEMA: &'static str = #schema_text;

            fn subject(&self) -> ::std::string::String {
                #subject_body
            }
        }

        #emit
    }
}

/// A stand-in impl emitted with the errors, so code that uses the type does not add errors of
/// its own ("`X` does not implement `OutboxEvent`") on top of the real ones. It never runs:
/// the crate does not compile.
pub(crate) fn stub(cont: &Container<'_>, attrs: &Attrs) -> TokenStream {
    let ident = cont.ident;
    let (impl_generics, ty_generics, where_clause) = cont.generics.split_for_impl();
    let event_type = attrs
        .event_type
        .as_ref()
        .map(|l| l.value())
        .unwrap_or_default();
    let source = source(attrs);
    let emit = emit_impl(cont, attrs);
    quote! {
        #[automatically_derived]
        impl #impl_generics ::outbox_runtime::OutboxEvent for #ident #ty_generics #where_clause {
            const EVENT_TYPE: &'static str = #event_type;
            const SOURCE: &'static str = #source;
            const SUBJECT_PROPERTY: ::core::option::Option<&'static str> = ::core::option::Option::None;
            const SCHEMA: &'static str = "{}";

            fn subject(&self) -> ::std::string::String {
                ::std::string::String::from(::outbox_runtime::PLATFORM_SUBJECT)
            }
        }

        #emit
    }
}
