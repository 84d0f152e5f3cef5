//! The build step: a folder of event schemas in, one Rust file out.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{Map, Value};
use typify::{TypeSpace, TypeSpaceSettings};

use crate::error::{Error, Result};
use crate::schema::{self, EventSchema};
use outbox_schema::pointer::escape_token;

/// The default name of the generated file in `OUT_DIR`.
pub const DEFAULT_OUT_FILE: &str = "outbox_events.rs";

/// Settings of the build step; ends in [`Config::compile`].
///
/// ```no_run
/// // in build.rs, inside `fn main()`:
/// outbox_codegen::Config::new()
///     .source("billing")
///     .consumes(["payments.>"])
///     .compile("schemas/events")
///     .unwrap();
/// ```
#[derive(Debug, Clone, Default)]
pub struct Config {
    source: Option<String>,
    consumes: Vec<String>,
    out_file: Option<PathBuf>,
    out_dir: Option<PathBuf>,
}

impl Config {
    /// The default settings: the source is the package name (`CARGO_PKG_NAME`), every type in
    /// the folder is emitted by this service, the output is `$OUT_DIR/outbox_events.rs`.
    pub fn new() -> Self {
        Self::default()
    }

    /// The emitting service: the envelope's `source`. Defaults to `CARGO_PKG_NAME`.
    pub fn source(&mut self, source: impl Into<String>) -> &mut Self {
        self.source = Some(source.into());
        self
    }

    /// Marks the event types this service only reads: they are generated for decoding, and
    /// emitting one is a compile error.
    ///
    /// Patterns match event types token by token, as NATS subjects do: `*` matches exactly one
    /// token and `>` (last only) matches one or more remaining tokens. `payments.*.*` and
    /// `payments.>` both match `payments.invoice.paid`; `payments.*` matches neither (it has
    /// two tokens). May be called several times; the patterns add up.
    pub fn consumes<I, S>(&mut self, patterns: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.consumes.extend(patterns.into_iter().map(Into::into));
        self
    }

    /// The name of the generated file inside the output folder. Default:
    /// [`DEFAULT_OUT_FILE`].
    pub fn out_file(&mut self, name: impl Into<PathBuf>) -> &mut Self {
        self.out_file = Some(name.into());
        self
    }

    /// The output folder. Default: `OUT_DIR`, which cargo sets for build scripts.
    pub fn out_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        self.out_dir = Some(dir.into());
        self
    }

    /// Generates the Rust for every event schema in `dir` and writes it to
    /// `$OUT_DIR/outbox_events.rs` (only when its content changed). Prints
    /// `cargo:rerun-if-changed` for the folder and every file read.
    ///
    /// # Errors
    ///
    /// Every problem of every schema ([`Error::Many`] when there are several), an invalid
    /// setting, or a failure to write the output.
    pub fn compile(&self, dir: impl AsRef<Path>) -> Result<()> {
        self.compile_to(dir.as_ref(), &mut std::io::stdout().lock())
    }

    /// [`Config::compile`], with the instructions to cargo written to `cargo`.
    fn compile_to(&self, dir: &Path, cargo: &mut dyn std::io::Write) -> Result<()> {
        let say = |cargo: &mut dyn std::io::Write, line: String| {
            writeln!(cargo, "{line}").map_err(|source| Error::Io {
                path: PathBuf::from("<stdout>"),
                source,
            })
        };
        say(cargo, format!("cargo:rerun-if-changed={}", dir.display()))?;
        let generated = self.build(dir);
        for file in &generated.files {
            say(cargo, format!("cargo:rerun-if-changed={}", file.display()))?;
        }
        let code = generated.code?;
        for pattern in &self.consumes {
            if !generated
                .event_types
                .iter()
                .any(|t| pattern_matches(pattern, t))
            {
                say(
                    cargo,
                    format!(
                        "cargo:warning=outbox-codegen: `.consumes` pattern `{pattern}` matches no event type in {}",
                        dir.display()
                    ),
                )?;
            }
        }
        let out_dir = match &self.out_dir {
            Some(dir) => dir.clone(),
            None => std::env::var_os("OUT_DIR").map(PathBuf::from).ok_or_else(|| {
                Error::Config(
                    "`OUT_DIR` is not set: run the codegen from a build script, or set `.out_dir(..)`"
                        .into(),
                )
            })?,
        };
        let out = out_dir.join(
            self.out_file
                .clone()
                .unwrap_or_else(|| PathBuf::from(DEFAULT_OUT_FILE)),
        );
        write_if_changed(&out, &code)
    }

    /// Generates the pretty-printed Rust for every event schema in `dir` without writing
    /// anything.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// std::fs::write(
    ///     dir.path().join("billing.invoice.paid.schema.json"),
    ///     r#"{
    ///         "title": "InvoicePaid",
    ///         "type": "object",
    ///         "x-outbox-subject": "invoice_id",
    ///         "required": ["invoice_id"],
    ///         "properties": { "invoice_id": { "type": "string", "format": "uuid" } }
    ///     }"#,
    /// )?;
    /// let code = outbox_codegen::Config::new().source("billing").generate(dir.path())?;
    /// assert!(code.contains("pub struct InvoicePaid"));
    /// assert!(code.contains(r#"event_type = "billing.invoice.paid""#));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Config::compile`], without the write.
    pub fn generate(&self, dir: impl AsRef<Path>) -> Result<String> {
        self.build(dir.as_ref()).code
    }

    fn build(&self, dir: &Path) -> Generated {
        let mut generated = Generated {
            code: Err(Error::Many(Vec::new())),
            files: Vec::new(),
            event_types: Vec::new(),
        };
        let mut errors = Vec::new();
        let source = match self.resolved_source() {
            Ok(source) => Some(source),
            Err(e) => {
                errors.push(e);
                None
            }
        };
        for pattern in &self.consumes {
            if let Err(why) = check_pattern(pattern) {
                errors.push(Error::Config(format!(
                    "invalid `.consumes` pattern `{pattern}`: {why}"
                )));
            }
        }
        let events = match schema::load_dir(dir) {
            Ok(events) => events,
            Err(e) => {
                // Track what was read so a fix reruns the build script.
                if let Ok(paths) = schema::schema_files(dir) {
                    generated.files = paths;
                }
                errors.push(e);
                generated.code = Err(Error::from_list(errors).expect("one error at least"));
                return generated;
            }
        };
        let mut seen = HashSet::new();
        for event in &events {
            for file in &event.files {
                if seen.insert(file.clone()) {
                    generated.files.push(file.clone());
                }
            }
        }
        generated.event_types = events.iter().map(|e| e.event_type.clone()).collect();
        if let Some(e) = Error::from_list(errors) {
            generated.code = Err(e);
            return generated;
        }
        generated.code = self.render(&events, &source.expect("no errors"));
        generated
    }

    fn resolved_source(&self) -> Result<String> {
        let source = match &self.source {
            Some(source) => source.clone(),
            None => std::env::var("CARGO_PKG_NAME").map_err(|_| {
                Error::Config(
                    "no source: set `.source(\"<service name>\")` (it defaults to `CARGO_PKG_NAME`, which is only set under cargo)"
                        .into(),
                )
            })?,
        };
        if source.is_empty() || source.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Error::Config(format!(
                "invalid source `{source}`: the envelope's `source` names the service, like `billing`; use a non-empty name without whitespace"
            )));
        }
        Ok(source)
    }

    fn render(&self, events: &[EventSchema], source: &str) -> Result<String> {
        let inputs = typify_inputs(events)?;
        let tokens = run_typify(&inputs, events)?;
        let mut file: syn::File = syn::parse2(tokens).map_err(|e| {
            Error::Config(format!(
                "the Rust generated from the schemas does not parse ({e}); this is a bug in the code generator"
            ))
        })?;
        check_unique_items(&file)?;
        self.decorate(&mut file, events, source)?;
        let mut code = String::new();
        let folders: Vec<String> = events
            .iter()
            .filter_map(|e| e.path.parent().and_then(|p| schema_attr_path(p).ok()))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let _ = writeln!(
            code,
            "// @generated by outbox-codegen from {}. Do not edit: change the schemas instead.",
            folders.join(", ")
        );
        code.push_str(&prettyplease::unparse(&file));
        Ok(code)
    }

    fn decorate(&self, file: &mut syn::File, events: &[EventSchema], source: &str) -> Result<()> {
        let by_title: HashMap<&str, &EventSchema> =
            events.iter().map(|e| (e.title.as_str(), e)).collect();
        let mut found = HashSet::new();
        let mut errors = Vec::new();
        for item in &mut file.items {
            let syn::Item::Struct(item) = item else {
                continue;
            };
            let name = item.ident.to_string();
            let Some(event) = by_title.get(name.as_str()) else {
                continue;
            };
            found.insert(name);
            if !matches!(item.fields, syn::Fields::Named(_)) {
                errors.push(Error::schema(
                    &event.path,
                    "",
                    "the event becomes a Rust struct without named fields (an object without `properties`); declare the payload's fields under `properties`",
                ));
                continue;
            }
            let schema_path = match schema_attr_path(&event.path) {
                Ok(path) => path,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let event_type = &event.event_type;
            let consume_only = self.consumes.iter().any(|p| pattern_matches(p, event_type));
            let mut args = vec![
                quote::quote!(event_type = #event_type),
                quote::quote!(source = #source),
            ];
            if let Some(subject) = &event.subject {
                args.push(quote::quote!(subject = #subject));
            }
            args.push(quote::quote!(schema = #schema_path));
            if consume_only {
                args.push(quote::quote!(consume_only));
            }
            item.attrs
                .push(syn::parse_quote!(#[derive(::outbox_runtime::OutboxEvent)]));
            item.attrs.push(syn::parse_quote!(#[outbox(#(#args),*)]));
        }
        let idents: Vec<String> = file
            .items
            .iter()
            .filter_map(|item| match item {
                syn::Item::Struct(s) => Some(s.ident.to_string()),
                _ => None,
            })
            .collect();
        for event in events {
            if !found.contains(&event.title) {
                let renamed = idents
                    .iter()
                    .find(|i| i.eq_ignore_ascii_case(&event.title))
                    .map_or_else(String::new, |i| format!(" (it became `{i}`)"));
                errors.push(Error::schema(
                    &event.path,
                    "/title",
                    format!(
                        "the generator renamed the type `{}`{renamed}; use a title that is already UpperCamelCase, with no two uppercase letters in a row",
                        event.title
                    ),
                ));
            }
        }
        if let Some(e) = Error::from_list(errors) {
            return Err(e);
        }

        let entries = events.iter().map(|e| {
            let event_type = &e.event_type;
            let text = serde_json::to_string(&e.resolved).expect("a Value serializes");
            quote::quote!((#event_type, #text))
        });
        let registry: syn::Item = syn::parse_quote! {
            /// Every event type of the schema folder with its self-contained JSON Schema:
            /// `(event_type, schema JSON)`, sorted by event type.
            pub const EVENT_SCHEMAS: &[(&str, &str)] = &[#(#entries),*];
        };
        let mut items = std::mem::take(&mut file.items);
        items.push(registry);
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
        file.items = vec![
            syn::Item::Mod(module),
            syn::parse_quote!(
                pub use self::outbox_generated::*;
            ),
        ];
        Ok(())
    }
}

/// Generates the Rust for every event schema in `dir` into `$OUT_DIR/outbox_events.rs`, with the
/// default [`Config`]: the source is `CARGO_PKG_NAME` and every type is emitted by this service.
///
/// ```no_run
/// // in build.rs, inside `fn main()`:
/// outbox_codegen::compile("schemas/events").unwrap();
/// ```
///
/// # Errors
///
/// As [`Config::compile`].
pub fn compile(dir: impl AsRef<Path>) -> Result<()> {
    Config::new().compile(dir)
}

/// Every problem of the schema folder at once (an empty list when all is well): schema files,
/// references, and what the type generator cannot take.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// std::fs::write(dir.path().join("billing.Invoice.paid.schema.json"), "{")?;
/// let problems = outbox_codegen::check(dir.path());
/// assert_eq!(problems.len(), 2); // the file name and the JSON
/// # Ok(()) }
/// ```
pub fn check(dir: impl AsRef<Path>) -> Vec<Error> {
    match Config::new().source("check").generate(dir) {
        Ok(_) => Vec::new(),
        Err(e) => e.into_list(),
    }
}

struct Generated {
    code: Result<String>,
    files: Vec<PathBuf>,
    event_types: Vec<String>,
}

/// How the generated code names a schema file or folder: relative to `CARGO_MANIFEST_DIR` when
/// it is under it (the derive resolves relative paths against the same variable, and the
/// generated code stays the same on every machine), absolute otherwise.
fn schema_attr_path(path: &Path) -> Result<String> {
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

fn write_if_changed(path: &Path, content: &str) -> Result<()> {
    if fs::read(path).is_ok_and(|old| old == content.as_bytes()) {
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(|source| Error::Io {
            path: parent.to_owned(),
            source,
        })?;
    }
    fs::write(path, content).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })
}

/// Checks a `.consumes` pattern: tokens of `[a-z0-9_]`, `*`, or a final `>`.
fn check_pattern(pattern: &str) -> std::result::Result<(), String> {
    if pattern.is_empty() {
        return Err("it is empty; use a pattern like `payments.*.*` or `payments.>`".into());
    }
    let tokens: Vec<&str> = pattern.split('.').collect();
    for (i, token) in tokens.iter().enumerate() {
        match *token {
            "*" => {}
            ">" if i + 1 == tokens.len() => {}
            ">" => {
                return Err(
                    "`>` matches the rest of the event type, so it must be the last token".into(),
                )
            }
            "" => {
                return Err(
                    "it has an empty token (two dots in a row, or a leading or trailing dot)"
                        .into(),
                )
            }
            t if t.starts_with(|c: char| c.is_ascii_lowercase())
                && t.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') => {}
            t => {
                return Err(format!(
                    "the token `{t}` is neither `*`, `>` nor a lowercase token `[a-z][a-z0-9_]*`"
                ))
            }
        }
    }
    Ok(())
}

/// Whether the NATS-style `pattern` matches `event_type`.
pub(crate) fn pattern_matches(pattern: &str, event_type: &str) -> bool {
    let mut tokens = event_type.split('.');
    for p in pattern.split('.') {
        if p == ">" {
            return tokens.next().is_some();
        }
        match tokens.next() {
            Some(t) if p == "*" || p == t => {}
            _ => return false,
        }
    }
    tokens.next().is_none()
}

/// Two top-level types with one name (from inline `title`s in different schemas) would not
/// compile; say so before the user sees rustc's error.
fn check_unique_items(file: &syn::File) -> Result<()> {
    let mut seen = HashSet::new();
    let mut errors = Vec::new();
    for item in &file.items {
        let ident = match item {
            syn::Item::Struct(i) => &i.ident,
            syn::Item::Enum(i) => &i.ident,
            syn::Item::Type(i) => &i.ident,
            _ => continue,
        };
        if !seen.insert(ident.to_string()) {
            errors.push(Error::Config(format!(
                "two generated types are named `{ident}`; give the inline schemas titled `{ident}` different titles, or move one definition into a shared definition file and `$ref` it"
            )));
        }
    }
    match Error::from_list(errors) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// What typify gets for one event: its root (named by the title) and its definitions.
struct TypifyInput {
    title: String,
    root: Value,
    defs: BTreeMap<String, Value>,
}

/// Splits each resolved schema into a root and definitions, in the form typify can take: one
/// namespace of definitions for the whole folder, references only to `#` or `#/$defs/<Name>`.
fn typify_inputs(events: &[EventSchema]) -> Result<Vec<TypifyInput>> {
    let titles: HashMap<&str, &EventSchema> =
        events.iter().map(|e| (e.title.as_str(), e)).collect();
    let mut errors = Vec::new();
    let mut inputs = Vec::new();
    let mut global: BTreeMap<String, (&EventSchema, Value)> = BTreeMap::new();
    for event in events {
        let mut doc = event.resolved.clone();
        check_refs(event, &mut doc, String::new(), &mut errors);
        let root_map = doc.as_object_mut().expect("an event schema is an object");
        let mut defs: BTreeMap<String, Value> = BTreeMap::new();
        for keyword in ["definitions", "$defs"] {
            let Some(Value::Object(map)) = root_map.remove(keyword) else {
                continue;
            };
            for (name, def) in map {
                let pointer = format!("/{keyword}/{}", escape_token(&name));
                if let Some(other) = titles.get(name.as_str()) {
                    errors.push(Error::schema(
                        &event.path,
                        pointer,
                        format!(
                            "the definition `{name}` has the name of the event type {} (its `title`); rename the definition",
                            other.event_type
                        ),
                    ));
                    continue;
                }
                match defs.get(&name) {
                    Some(existing) if *existing != def => errors.push(Error::schema(
                        &event.path,
                        pointer,
                        format!("`$defs` and `definitions` both define `{name}`, differently; rename one"),
                    )),
                    _ => {
                        defs.insert(name, def);
                    }
                }
            }
        }
        for (name, def) in &defs {
            match global.get(name) {
                Some((first, value)) if value != def => errors.push(Error::schema(
                    &event.path,
                    format!("/$defs/{}", escape_token(name)),
                    format!(
                        "{} defines a different `{name}`; all definitions of the folder become Rust types in one module, so each name must mean one thing: rename one, or move the shared definition into a definition file that both `$ref`",
                        first.path.display()
                    ),
                )),
                Some(_) => {}
                None => {
                    global.insert(name.clone(), (event, def.clone()));
                }
            }
        }
        root_map.remove("$schema");
        root_map.remove("$id");
        inputs.push(TypifyInput {
            title: event.title.clone(),
            root: doc,
            defs,
        });
    }
    match Error::from_list(errors) {
        Some(e) => Err(e),
        None => Ok(inputs),
    }
}

/// Rewrites `"$ref": "#"` to the event's own name and refuses references typify cannot follow.
fn check_refs(event: &EventSchema, value: &mut Value, at: String, errors: &mut Vec<Error>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                let child_at = format!("{at}/{}", escape_token(key));
                if key == "$ref" {
                    if let Value::String(reference) = child {
                        if reference == "#" {
                            *reference = format!("#/$defs/{}", event.title);
                        } else if !is_root_def_ref(reference) {
                            errors.push(Error::schema(
                                &event.path,
                                child_at,
                                format!(
                                    "the reference `{reference}` points inside a schema; the type generator follows only references to root definitions: move the target into the root `$defs` and refer to it as `#/$defs/<Name>`"
                                ),
                            ));
                        }
                    }
                } else if !matches!(key.as_str(), "enum" | "const" | "default" | "examples") {
                    check_refs(event, child, child_at, errors);
                }
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter_mut().enumerate() {
                check_refs(event, child, format!("{at}/{i}"), errors);
            }
        }
        _ => {}
    }
}

fn is_root_def_ref(reference: &str) -> bool {
    ["#/$defs/", "#/definitions/"].iter().any(|prefix| {
        reference
            .strip_prefix(prefix)
            .is_some_and(|name| !name.is_empty() && !name.contains('/'))
    })
}

fn settings() -> TypeSpaceSettings {
    let mut settings = TypeSpaceSettings::default();
    settings
        .with_struct_builder(false)
        .with_derive("PartialEq".to_owned());
    settings
}

/// Serializes panic-hook swaps: the hook is process-global.
static PANIC_HOOK: Mutex<()> = Mutex::new(());

/// Runs `f`, turning a panic into its message, without printing the panic.
fn quietly<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    let _guard = PANIC_HOOK.lock().unwrap_or_else(|e| e.into_inner());
    let previous = panic::take_hook();
    panic::set_hook(Box::new(|_| {}));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    panic::set_hook(previous);
    result.map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_owned())
    })
}

/// The gist of a generator message: its first line, without the dump of the schema that
/// typify appends.
fn brief(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    let cut = [": {", ": Object(", ": Bool(", " Object(", " SchemaObject"]
        .iter()
        .filter_map(|marker| line.find(marker))
        .min()
        .unwrap_or(line.len());
    let gist = line[..cut].trim_end();
    if gist.chars().count() > 200 {
        format!("{}...", gist.chars().take(200).collect::<String>())
    } else {
        gist.to_owned()
    }
}

/// Converts `(name, schema)` pairs in one type space; the error is typify's error or panic.
fn convert(pairs: Vec<(String, Value)>) -> std::result::Result<proc_macro2::TokenStream, String> {
    let mut schemas = Vec::with_capacity(pairs.len());
    for (name, value) in pairs {
        let schema: schemars::schema::Schema = serde_json::from_value(value)
            .map_err(|e| format!("the schema of `{name}` has an unexpected shape ({e})"))?;
        schemas.push((name, schema));
    }
    quietly(move || {
        let mut space = TypeSpace::new(&settings());
        space
            .add_ref_types(schemas)
            .map_err(|e| brief(&e.to_string()))?;
        // Rendering can panic too.
        Ok(space.to_stream())
    })
    .map_err(|panic| brief(&panic))
    .and_then(|r| r)
}

fn pairs_of(input: &TypifyInput) -> Vec<(String, Value)> {
    let mut pairs: Vec<(String, Value)> = input
        .defs
        .iter()
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    pairs.push((input.title.clone(), input.root.clone()));
    pairs
}

fn run_typify(inputs: &[TypifyInput], events: &[EventSchema]) -> Result<proc_macro2::TokenStream> {
    let mut all: Vec<(String, Value)> = Vec::new();
    let mut names = HashSet::new();
    for input in inputs {
        for (name, value) in pairs_of(input) {
            if names.insert(name.clone()) {
                all.push((name, value));
            }
        }
    }
    match convert(all) {
        Ok(tokens) => Ok(tokens),
        Err(batch_error) => {
            // Find the schemas (and the place inside them) the generator cannot take.
            let errors: Vec<Error> = inputs
                .iter()
                .zip(events)
                .filter_map(|(input, event)| locate_failure(input, event))
                .collect();
            Err(Error::from_list(errors).unwrap_or_else(|| {
                Error::Config(format!(
                    "the type generator cannot take the schemas together: {batch_error}; check that no two schemas define types with the same name"
                ))
            }))
        }
    }
}

/// If `input` alone fails in typify, the error naming the smallest part found to fail.
fn locate_failure(input: &TypifyInput, event: &EventSchema) -> Option<Error> {
    let whole = convert(pairs_of(input)).err()?;
    let any = || Value::Object(Map::new());
    let message = |why: &str| {
        format!(
            "the type generator cannot take this schema: {why}; simplify this construct (for example use a plain `type`, an `enum` of strings, or a `$ref` to a definition), or use `{{}}` to accept any JSON value here"
        )
    };
    // A definition alone (the others accept anything).
    for name in input.defs.keys() {
        let mut pairs: Vec<(String, Value)> = input
            .defs
            .keys()
            .map(|n| {
                (
                    n.clone(),
                    if n == name {
                        input.defs[n].clone()
                    } else {
                        any()
                    },
                )
            })
            .collect();
        pairs.push((input.title.clone(), serde_json::json!({ "type": "object" })));
        if let Err(why) = convert(pairs) {
            return Some(Error::schema(
                &event.path,
                format!("/$defs/{}", escape_token(name)),
                message(&why),
            ));
        }
    }
    // A property alone.
    if let Some(Value::Object(properties)) = input.root.get("properties") {
        for (property, schema) in properties {
            let mut root = input.root.clone();
            root["properties"] =
                Value::Object(Map::from_iter([(property.clone(), schema.clone())]));
            if let Some(Value::Array(required)) = root.get_mut("required") {
                required.retain(|r| r.as_str() == Some(property));
            }
            let mut pairs: Vec<(String, Value)> =
                input.defs.keys().map(|n| (n.clone(), any())).collect();
            pairs.push((input.title.clone(), root));
            if let Err(why) = convert(pairs) {
                return Some(Error::schema(
                    &event.path,
                    format!("/properties/{}", escape_token(property)),
                    message(&why),
                ));
            }
        }
    }
    Some(Error::schema(&event.path, "", message(&whole)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compile_tracks_every_file_and_writes_only_changes() {
        let dir = tempfile::tempdir().unwrap();
        let schemas = dir.path().join("schemas");
        fs::create_dir_all(schemas.join("defs")).unwrap();
        fs::write(
            schemas.join("defs/common.json"),
            r#"{ "$defs": { "Code": { "type": "string" } } }"#,
        )
        .unwrap();
        let event = schemas.join("a.b.created.schema.json");
        fs::write(
            &event,
            r#"{ "title": "Created", "type": "object",
                 "properties": { "code": { "$ref": "defs/common.json#/$defs/Code" } } }"#,
        )
        .unwrap();
        let out = dir.path().join("out");
        let mut config = Config::new();
        config.source("svc").consumes(["x.>"]).out_dir(&out);

        let mut cargo = Vec::new();
        config.compile_to(&schemas, &mut cargo).unwrap();
        let cargo = String::from_utf8(cargo).unwrap();
        let lines: Vec<&str> = cargo.lines().collect();
        assert_eq!(
            lines,
            [
                format!("cargo:rerun-if-changed={}", schemas.display()),
                format!("cargo:rerun-if-changed={}", event.display()),
                format!("cargo:rerun-if-changed={}", schemas.join("defs/common.json").display()),
                format!(
                    "cargo:warning=outbox-codegen: `.consumes` pattern `x.>` matches no event type in {}",
                    schemas.display()
                ),
            ]
        );
        let file = out.join(DEFAULT_OUT_FILE);
        let first = fs::read_to_string(&file).unwrap();
        assert!(first.contains("pub struct Created"));

        // Unchanged content: the file is not rewritten (its old modification time stays).
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(old)
            .unwrap();
        config.compile_to(&schemas, &mut Vec::new()).unwrap();
        assert_eq!(fs::metadata(&file).unwrap().modified().unwrap(), old);

        // Changed content: rewritten.
        fs::write(
            &event,
            r#"{ "title": "Created", "type": "object", "properties": { "n": { "type": "integer" } } }"#,
        )
        .unwrap();
        config.compile_to(&schemas, &mut Vec::new()).unwrap();
        assert_ne!(fs::metadata(&file).unwrap().modified().unwrap(), old);
        assert!(fs::read_to_string(&file)
            .unwrap()
            .contains("pub n: ::std::option::Option<i64>"));

        // A broken schema still reports the files to watch, and writes nothing.
        fs::write(&event, "{").unwrap();
        let mut cargo = Vec::new();
        let err = config.compile_to(&schemas, &mut cargo).unwrap_err();
        assert!(err.to_string().contains("not valid JSON"), "{err}");
        assert!(String::from_utf8(cargo)
            .unwrap()
            .contains(&event.display().to_string()));
        assert!(fs::read_to_string(&file)
            .unwrap()
            .contains("pub n: ::std::option::Option<i64>"));
    }

    #[test]
    fn source_defaults_and_checks() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("a.b.c.schema.json"),
            r#"{ "title": "C", "type": "object", "properties": { "n": { "type": "integer" } } }"#,
        )
        .unwrap();
        let err = Config::new()
            .source("two words")
            .generate(dir.path())
            .unwrap_err();
        assert!(
            err.to_string().contains("invalid source `two words`"),
            "{err}"
        );
        let err = Config::new()
            .source("svc")
            .consumes(["a.B"])
            .generate(dir.path())
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("invalid `.consumes` pattern `a.B`"),
            "{err}"
        );
        // Under cargo test, CARGO_PKG_NAME is this crate's name.
        let code = Config::new().generate(dir.path()).unwrap();
        assert!(code.contains(r#"source = "outbox-codegen""#), "{code}");
    }

    #[test]
    fn patterns_match_like_nats() {
        assert!(pattern_matches("payments.*.*", "payments.invoice.paid"));
        assert!(pattern_matches("payments.>", "payments.invoice.paid"));
        assert!(pattern_matches("payments.>", "payments.invoice.paid.v2"));
        assert!(pattern_matches("*.invoice.paid", "payments.invoice.paid"));
        assert!(pattern_matches(
            "payments.invoice.paid",
            "payments.invoice.paid"
        ));
        assert!(!pattern_matches("payments.*", "payments.invoice.paid"));
        assert!(!pattern_matches("payments.*.*", "payments.invoice.paid.v2"));
        assert!(!pattern_matches("billing.>", "payments.invoice.paid"));
        assert!(!pattern_matches(
            "payments.invoice.paid.>",
            "payments.invoice.paid"
        ));
    }

    #[test]
    fn patterns_are_checked() {
        assert_eq!(check_pattern("payments.*.*"), Ok(()));
        assert_eq!(check_pattern("payments.>"), Ok(()));
        for (bad, says) in [
            ("", "empty"),
            ("payments.>.x", "last token"),
            ("payments..x", "empty token"),
            ("Payments.*", "`Payments`"),
            ("payments.inv*", "`inv*`"),
        ] {
            let err = check_pattern(bad).expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn quietly_turns_panics_into_messages() {
        assert_eq!(quietly(|| 3), Ok(3));
        assert_eq!(
            quietly(|| -> () { panic!("boom {}", 1) }),
            Err("boom 1".to_owned())
        );
        assert_eq!(
            quietly(|| -> () { panic!("static") }),
            Err("static".to_owned())
        );
        assert_eq!(
            brief("not yet implemented: unhandled not schema Object(\n  SchemaObject {"),
            "not yet implemented: unhandled not schema"
        );
        assert_eq!(
            brief("if/then/else schemas are not supported: {\n"),
            "if/then/else schemas are not supported"
        );
    }

    #[test]
    fn root_def_refs() {
        assert!(is_root_def_ref("#/$defs/Money"));
        assert!(is_root_def_ref("#/definitions/Money"));
        assert!(!is_root_def_ref("#/properties/a"));
        assert!(!is_root_def_ref("#/$defs/Money/properties/a"));
        assert!(!is_root_def_ref("#/$defs/"));
    }
}
