//! The build step's settings and entry points: a folder of event schemas in, one Rust file out.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use outbox_schema::pointer::escape_token;

use crate::error::{Error, Result};
use crate::evolution::{self, Level, Lock, LockEntry, Mode, Report, Status};
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

    /// The schema evolution gate's [`Report`] for `dir`: every event type against the lock,
    /// with every change found (breaking or not).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use outbox_codegen::evolution::{Mode, Rule, Status};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let schemas = dir.path().join("events");
    /// std::fs::create_dir(&schemas)?;
    /// let file = schemas.join("billing.invoice.paid.schema.json");
    /// let schema = |extra: &str| format!(
    ///     r#"{{ "title": "InvoicePaid", "type": "object", "required": ["id"{extra}],
    ///          "properties": {{ "id": {{ "type": "string" }}, "note": {{ "type": "string" }} }} }}"#
    /// );
    /// std::fs::write(&file, schema(""))?;
    /// let mut config = outbox_codegen::Config::new();
    /// config.source("billing");
    /// config.write_lock(&schemas, &[])?;             // what `outbox lock` does
    ///
    /// std::fs::write(&file, schema(r#", "note""#))?;  // `note` becomes required
    /// let report = config.evolution(&schemas)?;
    /// let t = &report.types[0];
    /// assert_eq!((t.status, t.mode), (Status::Changed, Mode::Full));
    /// assert_eq!(t.changes[0].rule, Rule::RequiredAdded);
    /// assert!(!report.passes());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The folder's problems, as [`Config::generate`] has them, without the gate's.
    pub fn evolution(&self, dir: impl AsRef<Path>) -> Result<Report> {
        let generated = self.build(dir.as_ref(), false);
        generated.code?;
        Ok(generated
            .report
            .expect("a folder that generates has a report"))
    }

    /// Writes the lock file of `dir` (what `outbox lock` does): every event type's normalized
    /// schema with its mode (set here, else the mode it has in the lock, else `full`). The
    /// file is rewritten only when its content changes, and locking an unchanged folder gives
    /// the same bytes.
    ///
    /// A type with a breaking change (removed types included) is refused unless listed in
    /// `allow_breaking`: accepting a break is a decision, made by name.
    ///
    /// # Errors
    ///
    /// The folder's problems (only a folder that generates is locked), breaking changes not
    /// allowed, an `allow_breaking` name that is not a type of the folder or the lock, or a
    /// failure to write the file.
    pub fn write_lock(&self, dir: impl AsRef<Path>, allow_breaking: &[String]) -> Result<Locked> {
        let dir = dir.as_ref();
        let generated = self.build(dir, false);
        generated.code?;
        let report = generated
            .report
            .expect("a folder that generates has a report");
        let known: BTreeSet<&str> = report.types.iter().map(|t| t.event_type.as_str()).collect();
        let mut errors: Vec<Error> = allow_breaking
            .iter()
            .filter(|t| !known.contains(t.as_str()))
            .map(|t| {
                Error::Config(format!(
                    "`--allow-breaking {t}`: {t} is neither an event type of {} nor in {}",
                    dir.display(),
                    report.lock_file.display()
                ))
            })
            .collect();
        let allowed = |t: &str| allow_breaking.iter().any(|a| a == t);
        errors.extend(evolution::errors(&report, dir).into_iter().filter(
            |e| !matches!(e, Error::Incompatible { event_type, .. } if allowed(event_type)),
        ));
        if let Some(e) = Error::from_list(errors) {
            return Err(e);
        }
        let old = Lock::read(&report.lock_file)?;
        let mut lock = Lock::default();
        let mut types = Vec::new();
        for t in &report.types {
            let broke = !t.breaking(report.level).is_empty();
            let status = match (t.status, broke) {
                (Status::Removed, _) => LockedStatus::Dropped,
                (Status::New, _) => LockedStatus::New,
                (Status::Unchanged, _) => LockedStatus::Unchanged,
                (Status::Changed, false) => LockedStatus::Compatible,
                (Status::Changed, true) => LockedStatus::BreakingAllowed,
            };
            types.push((t.event_type.clone(), status));
            if t.status == Status::Removed {
                continue;
            }
            let (mode, _) = self.evolution.mode_of(&t.event_type, old.as_ref());
            let event = generated
                .events
                .iter()
                .find(|e| e.event_type == t.event_type)
                .expect("every type of the report is an event of the folder");
            lock.events.insert(
                t.event_type.clone(),
                LockEntry {
                    mode,
                    schema: evolution::normalize(&event.resolved),
                },
            );
        }
        let text = lock.to_text();
        let written = !std::fs::read(&report.lock_file).is_ok_and(|old| old == text.as_bytes());
        output::write_if_changed(&report.lock_file, &text)?;
        Ok(Locked {
            lock_file: report.lock_file,
            written,
            types,
        })
    }

    /// Loads the folder and, when the settings and every schema are fine, runs the schema
    /// evolution gate and renders the Rust. The files read are reported either way, so a fix
    /// reruns the build script. With `gate`, breaking changes are errors and the notes are
    /// filled in; without, only the report is.
    fn build(&self, dir: &Path, gate: bool) -> Generated {
        let mut generated = Generated {
            code: Err(Error::Many(Vec::new())),
            files: Vec::new(),
            event_types: Vec::new(),
            events: Vec::new(),
            report: None,
            notes: Vec::new(),
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
        let lock_file = self.evolution.lock_file(dir);
        let lock = Lock::read(&lock_file).unwrap_or_else(|e| {
            errors.push(e);
            None
        });
        if let Some(e) = Error::from_list(errors) {
            generated.code = Err(e);
            return generated;
        }
        let mut report =
            evolution::compare_wire(&events, lock.as_ref(), &lock_file, &self.evolution);
        let rust_checked = evolution::needs_rust(&report, &events, lock.as_ref());
        // The released schemas' types are generated on a second thread while this one
        // generates the folder's code: neither needs the other.
        let released: Vec<(&EventSchema, EventSchema)> =
            lock.as_ref().map_or_else(Vec::new, |lock| {
                rust_checked
                    .iter()
                    .filter_map(|e| evolution::released(e, lock).map(|r| (*e, r)))
                    .collect()
            });
        let (rendered, old_types) = std::thread::scope(|scope| {
            let old_types = (!released.is_empty()).then(|| {
                scope.spawn(|| {
                    let olds: Vec<EventSchema> = released.iter().map(|(_, r)| r.clone()).collect();
                    typify_driver::rust_types(&olds)
                })
            });
            let rendered = self.render(&events, &source.expect("no errors"), !released.is_empty());
            let old_types = old_types.map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|_| Err("the type generator panicked".to_owned()))
            });
            (rendered, old_types)
        });
        let mut errors = Vec::new();
        let code = match rendered {
            Ok((code, new_types)) => {
                if let (Some(new_types), Some(old_types)) = (new_types, old_types) {
                    match old_types {
                        Ok(old_types) => {
                            for (event, old) in &released {
                                evolution::add_rust(
                                    &mut report,
                                    event,
                                    old,
                                    &old_types,
                                    &new_types,
                                );
                            }
                        }
                        Err(why) => errors.push(self.unreleasable(&report, &released, &why)),
                    }
                }
                Some(code)
            }
            Err(e) => {
                errors.push(e);
                None
            }
        };
        if gate {
            errors.extend(evolution::errors(&report, dir));
            generated.notes = evolution::notes(&report, dir);
        }
        generated.report = Some(report);
        generated.events = events;
        generated.code = match (Error::from_list(errors), code) {
            (Some(e), _) => Err(e),
            (None, Some(code)) => Ok(code),
            (None, None) => unreachable!("no code comes with an error"),
        };
        generated
    }

    /// The error when the released schemas of `released` no longer go through the type
    /// generator: the rust level cannot be checked.
    fn unreleasable(
        &self,
        report: &Report,
        released: &[(&EventSchema, EventSchema)],
        why: &str,
    ) -> Error {
        let types: Vec<&str> = released
            .iter()
            .map(|(e, _)| e.event_type.as_str())
            .collect();
        Error::schema(
            &report.lock_file,
            format!("/events/{}/schema", escape_token(types[0])),
            format!(
                "the released schema of {} cannot be generated any more ({why}), so the rust level cannot be checked; lock the folder again with `outbox lock`, or check only the wire level (`.compatibility_level(Level::Wire)`)",
                types.join(", ")
            ),
        )
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

    /// typify's types for `events`, decorated and pretty-printed; with `types`, also the
    /// generated types for the gate's rust level.
    fn render(
        &self,
        events: &[EventSchema],
        source: &str,
        types: bool,
    ) -> Result<(String, Option<evolution::rust::RustTypes>)> {
        let (mut file, rust_types) = typify_driver::generate(events, types)?;
        decorate::decorate(&mut file, events, source, &self.consumes)?;
        Ok((output::print(&file, events), rust_types))
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

/// What [`Config::write_lock`] did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Locked {
    /// The lock file.
    pub lock_file: PathBuf,
    /// Whether its content changed (it is written only then).
    pub written: bool,
    /// Every event type, sorted, then those dropped from the lock.
    pub types: Vec<(String, LockedStatus)>,
}

/// How an event type went into the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockedStatus {
    /// It was not in the lock.
    New,
    /// As it was.
    Unchanged,
    /// Its schema changed compatibly.
    Compatible,
    /// Its schema changed incompatibly, allowed by `--allow-breaking`.
    BreakingAllowed,
    /// It has no schema any more and left the lock (allowed by `--allow-breaking`).
    Dropped,
}

/// The outcome of [`Config::build`]: the code or the problems, and what was read either way.
struct Generated {
    code: Result<String>,
    /// Every file read, each once, for `rerun-if-changed`.
    files: Vec<PathBuf>,
    event_types: Vec<String>,
    /// The loaded schemas, when the folder loads.
    events: Vec<EventSchema>,
    /// The gate's report, when the folder loads.
    report: Option<Report>,
    /// The gate's notes (with `gate` only).
    notes: Vec<String>,
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
