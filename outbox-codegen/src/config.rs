//! The build step's settings and entry points: a folder of event schemas in, one Rust file out.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::output::{self, Cargo};
use crate::pattern::{check_pattern, pattern_matches};
use crate::schema::{self, EventSchema};
use crate::{decorate, typify_driver};

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
    /// [`DEFAULT_OUT_FILE`](crate::DEFAULT_OUT_FILE).
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
        let mut cargo = Cargo(cargo);
        cargo.rerun_if_changed(dir)?;
        let generated = self.build(dir);
        for file in &generated.files {
            cargo.rerun_if_changed(file)?;
        }
        let code = generated.code?;
        for pattern in &self.consumes {
            if !generated
                .event_types
                .iter()
                .any(|t| pattern_matches(pattern, t))
            {
                cargo.warning(&format!(
                    "`.consumes` pattern `{pattern}` matches no event type in {}",
                    dir.display()
                ))?;
            }
        }
        let out = output::out_path(self.out_dir.as_deref(), self.out_file.as_deref())?;
        output::write_if_changed(&out, &code)
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

    /// Loads the folder and, when the settings and every schema are fine, renders the Rust.
    /// The files read are reported either way, so a fix reruns the build script.
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
        errors.extend(self.pattern_errors());
        let events = match schema::load_dir(dir) {
            Ok(events) => events,
            Err(e) => {
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

    /// One error for every `.consumes` pattern that is not a valid pattern.
    fn pattern_errors(&self) -> Vec<Error> {
        self.consumes
            .iter()
            .filter_map(|pattern| {
                check_pattern(pattern).err().map(|why| {
                    Error::Config(format!("invalid `.consumes` pattern `{pattern}`: {why}"))
                })
            })
            .collect()
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

    /// typify's types for `events`, decorated and pretty-printed.
    fn render(&self, events: &[EventSchema], source: &str) -> Result<String> {
        let mut file = typify_driver::generate(events)?;
        decorate::decorate(&mut file, events, source, &self.consumes)?;
        Ok(output::print(&file, events))
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

/// The outcome of [`Config::build`]: the code or the problems, and what was read either way.
struct Generated {
    code: Result<String>,
    /// Every file read, each once, for `rerun-if-changed`.
    files: Vec<PathBuf>,
    event_types: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DEFAULT_OUT_FILE;
    use std::fs;

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
}
