//! The schema evolution gate: a breaking change to a released event type fails the build.
//!
//! Compile errors catch a changed schema inside the service that emits the event. They cannot
//! protect the services that consume it and deploy on their own schedule, often in other
//! languages. So the released schemas are recorded in a lock file beside the schema folder
//! ([`Lock`], written by `outbox lock`, checked in), and every build compares each schema with
//! its released version under a compatibility [`Mode`]:
//!
//! - [`Mode::Backward`]: consumers with the new schema can read events published with the
//!   released one (nothing they accept got narrower);
//! - [`Mode::Forward`]: consumers with the released schema can read events published with the
//!   new one (nothing got wider);
//! - [`Mode::Full`] (the default, since producers and consumers deploy independently): both.
//!
//! and at a [`Level`]: `wire` rules are about the JSON any consumer reads; `rust` rules (the
//! default; they include the wire rules) also protect Rust code generated from the schema.
//! Every kind of change has a [`Rule`] with a stable id; `docs/schema-evolution.md` has the
//! table, the content-model explanation and a worked example.
//!
//! A type that is not in the lock is new and passes; without a lock file every type is new.
//! A compatible change passes with a cargo warning to refresh the lock. A breaking change is
//! an [`Error::Incompatible`](crate::Error::Incompatible) that lists each change with its JSON
//! pointer, rule, level and whom it breaks, then the fixes: publish a new major type
//! (`<event_type>.v2`) beside the old one, or accept the break knowingly with
//! `outbox lock --allow-breaking <event_type>`.
//!
//! The build step runs the gate ([`Config::compile`](crate::Config::compile), and
//! [`Config::generate`](crate::Config::generate) and [`check`](crate::check) with it);
//! [`Config::evolution`](crate::Config::evolution) returns the [`Report`] itself, and
//! [`Config::write_lock`](crate::Config::write_lock) writes the lock.

mod leaf;
mod lock;
mod model;
mod report;
mod rules;
pub(crate) mod rust;
mod wire;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

pub use lock::{default_lock_file, normalize, Lock, LockEntry, LOCK_VERSION};
pub use model::{Breaks, Change, Mode, ModeSource, Report, Status, TypeReport};
pub use rules::{Level, Rule};

use crate::schema::EventSchema;

/// The gate's settings, from [`Config`](crate::Config).
#[derive(Debug, Clone, Default)]
pub(crate) struct Settings {
    pub(crate) mode: Option<Mode>,
    pub(crate) modes: BTreeMap<String, Mode>,
    pub(crate) level: Level,
    pub(crate) lock_file: Option<PathBuf>,
}

impl Settings {
    /// The lock file of `dir` under these settings.
    pub(crate) fn lock_file(&self, dir: &Path) -> PathBuf {
        self.lock_file
            .clone()
            .unwrap_or_else(|| default_lock_file(dir))
    }

    /// The mode of `event_type` and where it comes from.
    pub(crate) fn mode_of(&self, event_type: &str, lock: Option<&Lock>) -> (Mode, ModeSource) {
        if let Some(mode) = self.modes.get(event_type).or(self.mode.as_ref()) {
            return (*mode, ModeSource::Config);
        }
        match lock.and_then(|l| l.events.get(event_type)) {
            Some(entry) => (entry.mode, ModeSource::Lock),
            None => (Mode::Full, ModeSource::Default),
        }
    }
}

/// The wire-level report of `events` against `lock` (and the subject rule, which needs no
/// generated code). [`needs_rust`] says which types the rust level must still look at.
pub(crate) fn compare_wire(
    events: &[EventSchema],
    lock: Option<&Lock>,
    lock_file: &Path,
    settings: &Settings,
) -> Report {
    let mut types = Vec::new();
    for event in events {
        let (mode, mode_source) = settings.mode_of(&event.event_type, lock);
        let entry = lock.and_then(|l| l.events.get(&event.event_type));
        let (status, changes) = match entry {
            None => (Status::New, Vec::new()),
            Some(entry) if entry.schema == event.resolved => (Status::Unchanged, Vec::new()),
            Some(entry) => {
                let mut changes = wire::compare(&entry.schema, &event.resolved);
                changes.extend(subject_change(&entry.schema, &event.resolved));
                (Status::Changed, changes)
            }
        };
        types.push(TypeReport {
            event_type: event.event_type.clone(),
            title: event.title.clone(),
            file: event.path.clone(),
            status,
            mode,
            mode_source,
            changes,
        });
    }
    if let Some(lock) = lock {
        let dir = events
            .first()
            .and_then(|e| e.path.parent())
            .map(Path::to_owned)
            .unwrap_or_default();
        for event_type in lock.events.keys() {
            if events.iter().any(|e| &e.event_type == event_type) {
                continue;
            }
            let (mode, mode_source) = settings.mode_of(event_type, Some(lock));
            let file = dir.join(outbox_schema::naming::schema_file_name(event_type));
            let title = lock.events[event_type]
                .schema
                .get("title")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            types.push(TypeReport {
                event_type: event_type.clone(),
                title,
                changes: vec![Change {
                    rule: Rule::EventTypeRemoved,
                    pointer: String::new(),
                    via: None,
                    message: format!(
                        "the released event type has no schema any more ({} is gone)",
                        file.display()
                    ),
                    breaks: Breaks::BOTH,
                }],
                file,
                status: Status::Removed,
                mode,
                mode_source,
            });
        }
    }
    Report {
        lock_file: lock_file.to_owned(),
        lock_found: lock.is_some(),
        level: settings.level,
        types,
    }
}

/// `x-outbox-subject` changed: the generated `SUBJECT_PROPERTY` and the envelope's `subject`.
fn subject_change(old: &Value, new: &Value) -> Option<Change> {
    let subject = |s: &Value| {
        s.get(outbox_schema::naming::SUBJECT_KEYWORD)
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let (o, n) = (subject(old), subject(new));
    if o == n {
        return None;
    }
    let text = |s: &Option<String>| match s {
        Some(s) => format!("`{s}`"),
        None => "none (`platform`)".to_owned(),
    };
    Some(Change {
        rule: Rule::RustSubjectChanged,
        pointer: format!("/{}", outbox_schema::naming::SUBJECT_KEYWORD),
        via: None,
        message: format!(
            "the subject property is now {} instead of {}: `SUBJECT_PROPERTY` and the envelope's `subject` change meaning",
            text(&n),
            text(&o)
        ),
        breaks: Breaks::BOTH,
    })
}

/// The changed types whose generated Rust may differ: everything but `description`,
/// `$comment` and `examples` (which only become doc comments) counts.
pub(crate) fn needs_rust<'e>(
    report: &Report,
    events: &'e [EventSchema],
    lock: Option<&Lock>,
) -> Vec<&'e EventSchema> {
    if report.level != Level::Rust {
        return Vec::new();
    }
    let Some(lock) = lock else {
        return Vec::new();
    };
    events
        .iter()
        .filter(|event| {
            lock.events
                .get(&event.event_type)
                .is_some_and(|entry| !same_but_docs(&entry.schema, &event.resolved))
        })
        .collect()
}

/// The released schema of `event` as an [`EventSchema`], for generating its old types.
pub(crate) fn released(event: &EventSchema, lock: &Lock) -> Option<EventSchema> {
    let entry = lock.events.get(&event.event_type)?;
    let title = entry
        .schema
        .get("title")
        .and_then(Value::as_str)?
        .to_owned();
    Some(EventSchema {
        path: event.path.clone(),
        event_type: event.event_type.clone(),
        title,
        subject: entry
            .schema
            .get(outbox_schema::naming::SUBJECT_KEYWORD)
            .and_then(Value::as_str)
            .map(str::to_owned),
        resolved: entry.schema.clone(),
        files: Vec::new(),
    })
}

/// Adds the rust-level changes of `event` (old and new generated types given) to `report`.
pub(crate) fn add_rust(
    report: &mut Report,
    event: &EventSchema,
    released: &EventSchema,
    old_types: &rust::RustTypes,
    new_types: &rust::RustTypes,
) {
    let sides = rust::Sides {
        old_schema: &released.resolved,
        new_schema: &event.resolved,
        old_types,
        new_types,
        old_title: &released.title,
        new_title: &event.title,
    };
    let changes = rust::compare(&sides);
    if let Some(t) = report
        .types
        .iter_mut()
        .find(|t| t.event_type == event.event_type)
    {
        t.changes.extend(changes);
    }
}

/// Whether two schemas are equal but for the keywords that only become documentation
/// (`description`, `$comment`, `examples`), at every schema position; without copying them.
fn same_but_docs(a: &Value, b: &Value) -> bool {
    fn is_doc(key: &str) -> bool {
        matches!(key, "description" | "$comment" | "examples")
    }
    /// Keywords whose value is data: compared as they are.
    fn is_data(key: &str) -> bool {
        matches!(key, "enum" | "const" | "default")
    }
    /// Keywords whose value maps names to schemas (a name may be `description`).
    fn is_schema_map(key: &str) -> bool {
        matches!(
            key,
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas"
        )
    }
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            let count =
                |m: &serde_json::Map<String, Value>| m.keys().filter(|k| !is_doc(k)).count();
            count(a) == count(b)
                && a.iter().filter(|(k, _)| !is_doc(k)).all(|(k, va)| {
                    let Some(vb) = b.get(k) else {
                        return false;
                    };
                    if is_data(k) {
                        va == vb
                    } else if is_schema_map(k) {
                        match (va, vb) {
                            (Value::Object(ma), Value::Object(mb)) => {
                                ma.len() == mb.len()
                                    && ma.iter().all(|(name, sa)| {
                                        mb.get(name).is_some_and(|sb| same_but_docs(sa, sb))
                                    })
                            }
                            _ => va == vb,
                        }
                    } else {
                        same_but_docs(va, vb)
                    }
                })
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_but_docs(x, y))
        }
        _ => a == b,
    }
}

pub(crate) use report::{errors, notes};

#[cfg(test)]
mod tests;
