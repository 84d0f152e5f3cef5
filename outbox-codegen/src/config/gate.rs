//! The gate's entry points beside the build: the evolution report of a folder and the lock
//! file written from it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::Config;
use crate::error::{Error, Result};
use crate::evolution::{self, Lock, LockEntry, Report, Status};
use crate::output;

impl Config {
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
