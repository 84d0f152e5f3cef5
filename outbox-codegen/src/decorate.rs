//! What the generator adds to typify's output: `#[derive(OutboxEvent)]` and `#[outbox(..)]` on
//! every event struct, the `EVENT_SCHEMAS` registry, and the module that holds it all.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use crate::error::{Error, Result};
use crate::pattern::pattern_matches;
use crate::schema::EventSchema;

/// Decorates `file` (typify's output for `events`) in place. `source` is the envelope's
/// source; event types matching a `consumes` pattern are marked `consume_only`.
pub(crate) fn decorate(
    file: &mut syn::File,
    events: &[EventSchema],
    source: &str,
    consumes: &[String],
) -> Result<()> {
    let mut errors = derive_on_events(file, events, source, consumes);
    errors.extend(renamed_titles(file, events));
    if let Some(e) = Error::from_list(errors) {
        return Err(e);
    }
    let mut items = std::mem::take(&mut file.items);
    items.push(registry(events));
    file.items = wrap_in_module(items);
    Ok(())
}

/// Adds the derive and its attribute to the struct of every event; the errors are the events
/// whose struct has no named fields or whose path cannot be written.
fn derive_on_events(
    file: &mut syn::File,
    events: &[EventSchema],
    source: &str,
    consumes: &[String],
) -> Vec<Error> {
    let by_title: HashMap<&str, &EventSchema> =
        events.iter().map(|e| (e.title.as_str(), e)).collect();
    let mut errors = Vec::new();
    for item in &mut file.items {
        let syn::Item::Struct(item) = item else {
            continue;
        };
        let Some(event) = by_title.get(item.ident.to_string().as_str()) else {
            continue;
        };
        if !matches!(item.fields, syn::Fields::Named(_)) {
            errors.push(Error::schema(
                &event.path,
                "",
                "the event becomes a Rust struct without named fields (an object without `properties`); declare the payload's fields under `properties`",
            ));
            continue;
        }
        match outbox_attr(event, source, consumes) {
            Ok(attr) => {
                item.attrs
                    .push(syn::parse_quote!(#[derive(::outbox_runtime::OutboxEvent)]));
                item.attrs.push(attr);
            }
            Err(e) => errors.push(e),
        }
    }
    errors
}

/// `#[outbox(event_type = .., source = .., subject = .., schema = .., consume_only)]`.
fn outbox_attr(event: &EventSchema, source: &str, consumes: &[String]) -> Result<syn::Attribute> {
    let schema_path = schema_attr_path(&event.path)?;
    let event_type = &event.event_type;
    let mut args = vec![
        quote::quote!(event_type = #event_type),
        quote::quote!(source = #source),
    ];
    if let Some(subject) = &event.subject {
        args.push(quote::quote!(subject = #subject));
    }
    args.push(quote::quote!(schema = #schema_path));
    if consumes.iter().any(|p| pattern_matches(p, event_type)) {
        args.push(quote::quote!(consume_only));
    }
    Ok(syn::parse_quote!(#[outbox(#(#args),*)]))
}

/// typify names a type after the title, but changes a title that is not plain UpperCamelCase
/// (`HTTPCalled` becomes `HttpCalled`): then no struct carries the event's name, and the
/// derive would be missing. One error for each such event.
fn renamed_titles(file: &syn::File, events: &[EventSchema]) -> Vec<Error> {
    let idents: Vec<String> = file
        .items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Struct(s) => Some(s.ident.to_string()),
            _ => None,
        })
        .collect();
    events
        .iter()
        .filter(|event| !idents.contains(&event.title))
        .map(|event| {
            let renamed = idents
                .iter()
                .find(|i| i.eq_ignore_ascii_case(&event.title))
                .map_or_else(String::new, |i| format!(" (it became `{i}`)"));
            Error::schema(
                &event.path,
                "/title",
                format!(
                    "the generator renamed the type `{}`{renamed}; use a title that is already UpperCamelCase, with no two uppercase letters in a row",
                    event.title
                ),
            )
        })
        .collect()
}

/// `EVENT_SCHEMAS`: every event type with its self-contained schema, for the runtime's
/// untyped registry.
fn registry(events: &[EventSchema]) -> syn::Item {
    let entries = events.iter().map(|e| {
        let event_type = &e.event_type;
        let text = serde_json::to_string(&e.resolved).expect("a Value serializes");
        quote::quote!((#event_type, #text))
    });
    syn::parse_quote! {
        /// Every event type of the schema folder with its self-contained JSON Schema:
        /// `(event_type, schema JSON)`, sorted by event type.
        pub const EVENT_SCHEMAS: &[(&str, &str)] = &[#(#entries),*];
    }
}

/// `items` inside `mod outbox_generated`, with the lints generated code cannot meet allowed,
/// and its contents re-exported.
fn wrap_in_module(items: Vec<syn::Item>) -> Vec<syn::Item> {
    // The module is built around the parsed items (not re-parsed from tokens: the
    // output of a large folder is megabytes of Rust).
    let mut module: syn::ItemMod = syn::parse_quote! {
        #[allow(
            clippy::all,
            clippy::pedantic,
            clippy::nursery,
            missing_docs,
            missing_debug_implementations,
            unreachable_pub,
            unused_qualifications,
            unused_imports,
            dead_code,
            rust_2018_idioms
        )]
        mod outbox_generated {}
    };
    if let Some((_, content)) = &mut module.content {
        *content = items;
    }
    vec![
        syn::Item::Mod(module),
        syn::parse_quote!(
            pub use self::outbox_generated::*;
        ),
    ]
}

/// How the generated code names a schema file or folder: relative to `CARGO_MANIFEST_DIR` when
/// it is under it (the derive resolves relative paths against the same variable, and the
/// generated code stays the same on every machine), absolute otherwise.
pub(crate) fn schema_attr_path(path: &Path) -> Result<String> {
    let absolute = fs::canonicalize(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })?;
    let manifest_dir =
        std::env::var_os("CARGO_MANIFEST_DIR").and_then(|dir| fs::canonicalize(dir).ok());
    let shown = match manifest_dir
        .as_deref()
        .map(|dir| absolute.strip_prefix(dir))
    {
        Some(Ok(relative)) if !relative.as_os_str().is_empty() => relative.to_owned(),
        _ => absolute.clone(),
    };
    shown.to_str().map(str::to_owned).ok_or_else(|| {
        Error::Config(format!(
            "{}: the path is not UTF-8; move the schema folder to a UTF-8 path",
            absolute.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::ToTokens;
    use serde_json::json;

    fn event(dir: &Path, title: &str, subject: Option<&str>) -> EventSchema {
        let path = dir.join("a.b.created.schema.json");
        fs::write(&path, "{}").unwrap();
        EventSchema {
            path,
            event_type: "a.b.created".into(),
            title: title.into(),
            subject: subject.map(str::to_owned),
            resolved: json!({ "title": title }),
            files: Vec::new(),
        }
    }

    fn text(tokens: impl ToTokens) -> String {
        tokens.to_token_stream().to_string()
    }

    #[test]
    fn events_get_the_derive_and_the_module() {
        let dir = tempfile::tempdir().unwrap();
        let events = [event(dir.path(), "Created", Some("id"))];
        let mut file: syn::File = syn::parse_quote! {
            pub struct Created { pub id: String }
            pub struct Other { pub n: i64 }
        };
        decorate(&mut file, &events, "svc", &["a.b.*".to_owned()]).unwrap();
        assert_eq!(file.items.len(), 2);
        let syn::Item::Mod(module) = &file.items[0] else {
            panic!("a module first");
        };
        assert_eq!(module.ident, "outbox_generated");
        let items = &module.content.as_ref().unwrap().1;
        let syn::Item::Struct(created) = &items[0] else {
            panic!("the event struct");
        };
        let attrs: Vec<String> = created.attrs.iter().map(text).collect();
        assert_eq!(attrs[0], "# [derive (:: outbox_runtime :: OutboxEvent)]");
        assert!(
            attrs[1].starts_with(
                "# [outbox (event_type = \"a.b.created\" , source = \"svc\" , subject = \"id\" , schema = "
            ),
            "{}",
            attrs[1]
        );
        assert!(attrs[1].ends_with(", consume_only)]"), "{}", attrs[1]);
        let syn::Item::Struct(other) = &items[1] else {
            panic!("the other struct");
        };
        assert!(other.attrs.is_empty());
        assert!(
            text(&items[2]).contains("EVENT_SCHEMAS"),
            "the registry last"
        );
        assert_eq!(
            text(&file.items[1]),
            "pub use self :: outbox_generated :: * ;"
        );
    }

    #[test]
    fn events_without_their_struct_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let file: syn::File = syn::parse_quote! { pub struct HttpCalled { pub n: i64 } };
        let errors = renamed_titles(&file, &[event(dir.path(), "HTTPCalled", None)]);
        assert_eq!(errors.len(), 1);
        assert!(errors[0].to_string().contains(
            "at /title: the generator renamed the type `HTTPCalled` (it became `HttpCalled`)"
        ));

        let mut file: syn::File = syn::parse_quote! { pub struct Created; };
        let err =
            decorate(&mut file, &[event(dir.path(), "Created", None)], "svc", &[]).unwrap_err();
        assert!(err.to_string().contains("without named fields"), "{err}");
    }
}
