//! The build itself: the settings checked, the folder loaded, the gate run and the Rust
//! rendered, each problem collected.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use outbox_schema::pointer::escape_token;

use super::Config;
use crate::error::{Error, Result};
use crate::evolution::rust::RustTypes;
use crate::evolution::{self, Lock, Report};
use crate::pattern::check_pattern;
use crate::schema::{self, EventSchema};
use crate::{decorate, output, typify_driver};

/// The outcome of [`Config::build`]: the code or the problems, and what was read either way.
pub(super) struct Generated {
    pub(super) code: Result<String>,
    /// Every file read, each once, for `rerun-if-changed`.
    pub(super) files: Vec<PathBuf>,
    pub(super) event_types: Vec<String>,
    /// The loaded schemas, when the folder loads.
    pub(super) events: Vec<EventSchema>,
    /// The gate's report, when the folder loads.
    pub(super) report: Option<Report>,
    /// The gate's notes (with `gate` only).
    pub(super) notes: Vec<String>,
}

/// What [`Config::load`] hands on: a folder whose settings, schemas and lock are fine.
struct Loaded {
    source: String,
    events: Vec<EventSchema>,
    lock_file: PathBuf,
    lock: Option<Lock>,
}

/// The folder's code with its types (for the gate's rust level), as [`Config::render`] gives it.
type Rendered = Result<(String, Option<RustTypes>)>;

impl Config {
    /// Loads the folder and, when the settings and every schema are fine, runs the schema
    /// evolution gate and renders the Rust. The files read are reported either way, so a fix
    /// reruns the build script. With `gate`, breaking changes are errors and the notes are
    /// filled in; without, only the report is.
    pub(super) fn build(&self, dir: &Path, gate: bool) -> Generated {
        let mut generated = Generated {
            code: Err(Error::Many(Vec::new())),
            files: Vec::new(),
            event_types: Vec::new(),
            events: Vec::new(),
            report: None,
            notes: Vec::new(),
        };
        let Some(Loaded {
            source,
            events,
            lock_file,
            lock,
        }) = self.load(dir, &mut generated)
        else {
            return generated;
        };
        let mut report =
            evolution::compare_wire(&events, lock.as_ref(), &lock_file, &self.evolution);
        let rust_checked = evolution::needs_rust(&report, &events, lock.as_ref());
        let released: Vec<(&EventSchema, EventSchema)> =
            lock.as_ref().map_or_else(Vec::new, |lock| {
                rust_checked
                    .iter()
                    .filter_map(|e| evolution::released(e, lock).map(|r| (*e, r)))
                    .collect()
            });
        let (rendered, old_types) = self.render_beside_released(&events, &source, &released);
        let mut errors = Vec::new();
        let code = self.rust_level(rendered, old_types, &mut report, &released, &mut errors);
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

    /// Checks the settings, loads the folder (noting in `generated` the files read and the
    /// event types) and reads the lock; on any problem, `None` with every problem in
    /// `generated.code`.
    fn load(&self, dir: &Path, generated: &mut Generated) -> Option<Loaded> {
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
                return None;
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
            return None;
        }
        Some(Loaded {
            source: source.expect("no errors"),
            events,
            lock_file,
            lock,
        })
    }

    /// Renders the folder's code while a second thread generates the types of the released
    /// schemas (`None` when there are none): neither needs the other.
    fn render_beside_released(
        &self,
        events: &[EventSchema],
        source: &str,
        released: &[(&EventSchema, EventSchema)],
    ) -> (Rendered, Option<std::result::Result<RustTypes, String>>) {
        std::thread::scope(|scope| {
            let old_types = (!released.is_empty()).then(|| {
                scope.spawn(|| {
                    let olds: Vec<EventSchema> = released.iter().map(|(_, r)| r.clone()).collect();
                    typify_driver::rust_types(&olds)
                })
            });
            let rendered = self.render(events, source, !released.is_empty());
            let old_types = old_types.map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|_| Err("the type generator panicked".to_owned()))
            });
            (rendered, old_types)
        })
    }

    /// The code, if it rendered, with the report's rust level filled in from the types of both
    /// sides; the problems go to `errors`.
    fn rust_level(
        &self,
        rendered: Rendered,
        old_types: Option<std::result::Result<RustTypes, String>>,
        report: &mut Report,
        released: &[(&EventSchema, EventSchema)],
        errors: &mut Vec<Error>,
    ) -> Option<String> {
        match rendered {
            Ok((code, new_types)) => {
                if let (Some(new_types), Some(old_types)) = (new_types, old_types) {
                    match old_types {
                        Ok(old_types) => {
                            for (event, old) in released {
                                evolution::add_rust(report, event, old, &old_types, &new_types);
                            }
                        }
                        Err(why) => errors.push(self.unreleasable(report, released, &why)),
                    }
                }
                Some(code)
            }
            Err(e) => {
                errors.push(e);
                None
            }
        }
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
    fn render(&self, events: &[EventSchema], source: &str, types: bool) -> Rendered {
        let (mut file, rust_types) = typify_driver::generate(events, types)?;
        decorate::decorate(&mut file, events, source, &self.consumes)?;
        Ok((output::print(&file, events), rust_types))
    }
}
