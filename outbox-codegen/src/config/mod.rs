//! The build step's settings and entry points: a folder of event schemas in, one Rust file out.

mod build;
mod gate;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::evolution::{self, Level, Mode};
use crate::output::{self, Cargo};
use crate::pattern::pattern_matches;

pub use gate::{Locked, LockedStatus};

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
    evolution: evolution::Settings,
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

    /// The compatibility mode of every event type, over the mode each has in the lock file
    /// (see [`evolution`](crate::evolution)). Without it, a type is checked under the mode the
    /// lock records for it, and a type the lock does not have is new (nothing to check).
    ///
    /// ```no_run
    /// use outbox_codegen::evolution::Mode;
    ///
    /// // in build.rs, inside `fn main()`:
    /// outbox_codegen::Config::new()
    ///     .compatibility(Mode::Full)
    ///     .compatibility_for("billing.invoice.paid", Mode::Backward)
    ///     .compile("schemas/events")
    ///     .unwrap();
    /// ```
    pub fn compatibility(&mut self, mode: Mode) -> &mut Self {
        self.evolution.mode = Some(mode);
        self
    }

    /// The compatibility mode of one event type, over [`Config::compatibility`] and the lock.
    pub fn compatibility_for(&mut self, event_type: impl Into<String>, mode: Mode) -> &mut Self {
        self.evolution.modes.insert(event_type.into(), mode);
        self
    }

    /// Which rules the gate applies: [`Level::Rust`] (the default: wire rules and the rules
    /// that protect Rust code generated from the schema) or [`Level::Wire`] only.
    pub fn compatibility_level(&mut self, level: Level) -> &mut Self {
        self.evolution.level = level;
        self
    }

    /// The lock file with the released schemas. Default: beside the schema folder, named after
    /// it (`schemas/events` has `schemas/events.lock`). Without a lock file every type is new
    /// and the gate passes; a file set here that does not exist is reported by a cargo warning.
    pub fn lock_file(&mut self, path: impl Into<PathBuf>) -> &mut Self {
        self.evolution.lock_file = Some(path.into());
        self
    }

    /// Generates the Rust for every event schema in `dir` and writes it to
    /// `$OUT_DIR/outbox_events.rs` (only when its content changed), after the schema evolution
    /// gate has compared every schema with the lock file. Prints `cargo:rerun-if-changed` for
    /// the folder, every file read and the lock file, and a `cargo:warning` for each type that
    /// changed compatibly (refresh the lock with `outbox lock`).
    ///
    /// # Errors
    ///
    /// Every problem of every schema ([`Error::Many`] when there are several), every released
    /// type changed incompatibly ([`Error::Incompatible`]), an invalid setting, or a failure to
    /// write the output.
    pub fn compile(&self, dir: impl AsRef<Path>) -> Result<()> {
        self.compile_to(dir.as_ref(), &mut std::io::stdout().lock())
    }

    /// [`Config::compile`], with the instructions to cargo written to `cargo`.
    fn compile_to(&self, dir: &Path, cargo: &mut dyn std::io::Write) -> Result<()> {
        let mut cargo = Cargo(cargo);
        cargo.rerun_if_changed(dir)?;
        let generated = self.build(dir, true);
        for file in &generated.files {
            cargo.rerun_if_changed(file)?;
        }
        // A missing file would rerun the script at every build; when the lock appears, a
        // change of a schema reruns it anyway, and until then there is nothing to compare.
        let lock_file = self.evolution.lock_file(dir);
        if lock_file.is_file() {
            cargo.rerun_if_changed(&lock_file)?;
        } else if self.evolution.lock_file.is_some() {
            cargo.warning(&format!(
                "the lock file {} does not exist: every event type is new and nothing is checked; write it with `outbox lock {} --lock {}`",
                lock_file.display(),
                dir.display(),
                lock_file.display()
            ))?;
        }
        for note in &generated.notes {
            cargo.warning(note)?;
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
        self.build(dir.as_ref(), true).code
    }

    /// Every problem of the folder (as [`Config::generate`] finds them, the gate's included)
    /// and the gate's notes (compatible changes, types not yet in the lock), without the code.
    /// `outbox check` prints this.
    pub fn check(&self, dir: impl AsRef<Path>) -> Checked {
        let generated = self.build(dir.as_ref(), true);
        Checked {
            problems: match generated.code {
                Ok(_) => Vec::new(),
                Err(e) => e.into_list(),
            },
            notes: generated.notes,
        }
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
    Config::new().source("check").check(dir).problems
}

/// What [`Config::check`] found.
#[derive(Debug)]
#[non_exhaustive]
pub struct Checked {
    /// Every problem, one error each (a breaking change is one [`Error::Incompatible`] per
    /// event type).
    pub problems: Vec<Error>,
    /// The gate's notes: types that changed compatibly since the lock, types not in it yet.
    pub notes: Vec<String>,
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
