//! The words of the gate: the error of a type with breaking changes (one change a line, then
//! the fixes), and the notes a build prints for compatible changes.

use std::fmt::Write as _;
use std::path::Path;

use outbox_schema::naming::{next_major, schema_file_name};

use super::{Change, Level, ModeSource, Report, Status, TypeReport};
use crate::error::Error;

/// One [`Error::Incompatible`] per event type with breaking changes. `dir` is the schema
/// folder as the build names it (for the commands in the fix).
pub(crate) fn errors(report: &Report, dir: &Path) -> Vec<Error> {
    report
        .types
        .iter()
        .filter_map(|t| {
            let breaking = t.breaking(report.level);
            (!breaking.is_empty()).then(|| incompatible(report, t, &breaking, dir))
        })
        .collect()
}

/// One line pair of the report for `change` of type `t` (`removed`: its schema is gone).
fn list_change(text: &mut String, t: &TypeReport, change: &Change, removed: bool) {
    if removed {
        let _ = writeln!(text, "  - {} is gone", t.file.display());
    } else {
        let at = if change.pointer.is_empty() {
            "the root".to_owned()
        } else {
            change.pointer.clone()
        };
        let via = change
            .via
            .as_ref()
            .map(|v| {
                format!(
                    " (reached from {})",
                    if v.is_empty() { "the root" } else { v }
                )
            })
            .unwrap_or_default();
        let _ = writeln!(text, "  - at {at}{via}: {}", change.message);
    }
    let _ = writeln!(
        text,
        "    {} ({}): breaks {}",
        change.rule,
        change.rule.level(),
        whom(change)
    );
}

/// The error of type `t`, whose `breaking` changes its mode does not allow.
fn incompatible(report: &Report, t: &TypeReport, breaking: &[&Change], dir: &Path) -> Error {
    let lock = report.lock_file.display();
    let mode = match t.mode_source {
        ModeSource::Config => format!("mode `{}`, configured", t.mode),
        ModeSource::Lock => format!("mode `{}`, from {lock}", t.mode),
        ModeSource::Default => format!("mode `{}`, the default", t.mode),
    };
    let mut text = String::new();
    let removed = t.status == Status::Removed;
    if removed {
        let _ = writeln!(
            text,
            "the released event type `{}` has no schema in {} any more ({mode}, level `{}`):",
            t.event_type,
            dir.display(),
            report.level
        );
    } else {
        let n = breaking.len();
        let _ = writeln!(
            text,
            "{n} breaking change{} to the released event type `{}` ({mode}, level `{}`):",
            if n == 1 { "" } else { "s" },
            t.event_type,
            report.level
        );
    }
    for change in breaking {
        list_change(&mut text, t, change, removed);
    }
    let allow = lock_command(report, dir, &format!("--allow-breaking {}", t.event_type));
    if removed {
        let _ = write!(
            text,
            "  to fix it, restore {}; or, once no consumer needs the type, drop it from the lock knowingly: {allow}",
            t.file.display()
        );
    } else {
        let major = next_major(&t.event_type);
        let file_name = schema_file_name(&major);
        let title = major_title(&t.title, &major);
        let _ = writeln!(text, "  to fix it, either");
        let _ = writeln!(
            text,
            "  - keep `{}` as released (restore this file; {lock} holds the released schema) and publish the new shape as the new major type `{major}`: the file {file_name} beside it, with its own title (like `{title}`), emitted alongside the old type until every consumer has moved; or",
            t.event_type
        );
        let _ = write!(
            text,
            "  - if every consumer can take the change, accept it knowingly: {allow}"
        );
    }
    Error::Incompatible {
        file: if removed {
            report.lock_file.clone()
        } else {
            t.file.clone()
        },
        event_type: t.event_type.clone(),
        report: text,
    }
}

/// A title for the next major type: `SubscriptionCreatedV2` for `SubscriptionCreated` and
/// `….v2`, `SubscriptionCreatedV3` for `SubscriptionCreatedV2` and `….v3`.
fn major_title(title: &str, major: &str) -> String {
    let version = major.rsplit_once(".v").map_or("2", |(_, n)| n);
    let base = match title.rfind('V') {
        Some(i)
            if i > 0
                && title[i + 1..].chars().all(|c| c.is_ascii_digit())
                && i + 1 < title.len() =>
        {
            &title[..i]
        }
        _ => title,
    };
    format!("{base}V{version}")
}

fn whom(change: &Change) -> &'static str {
    if change.rule.level() == Level::Rust {
        return "Rust code generated from the released schema";
    }
    match (change.breaks.old_consumers, change.breaks.new_consumers) {
        (true, true) => "old and new consumers",
        (true, false) => "old consumers: they reject events published after this change",
        (false, true) => "new consumers: they reject events published before this change",
        (false, false) => "nobody",
    }
}

/// `outbox lock <dir> [--lock <file>] <args>`, as the user would type it.
fn lock_command(report: &Report, dir: &Path, args: &str) -> String {
    let mut command = format!("outbox lock {}", dir.display());
    if report.lock_file != super::default_lock_file(dir) {
        let _ = write!(command, " --lock {}", report.lock_file.display());
    }
    if !args.is_empty() {
        let _ = write!(command, " {args}");
    }
    command
}

/// The build's notes: compatible changes (refresh the lock), new types of a locked folder.
pub(crate) fn notes(report: &Report, dir: &Path) -> Vec<String> {
    let mut notes = Vec::new();
    if !report.lock_found {
        return notes;
    }
    let refresh = lock_command(report, dir, "");
    for t in &report.types {
        match t.status {
            Status::Changed if t.breaking(report.level).is_empty() => {
                let list: Vec<String> = t
                    .changes
                    .iter()
                    .filter(|c| c.rule.level() == Level::Wire || report.level == Level::Rust)
                    .map(|c| {
                        let at = if c.pointer.is_empty() {
                            "the root"
                        } else {
                            &c.pointer
                        };
                        format!("{} at {at}", c.rule)
                    })
                    .collect();
                let shown = if list.len() > 3 {
                    format!("{}, and {} more", list[..3].join(", "), list.len() - 3)
                } else {
                    list.join(", ")
                };
                notes.push(format!(
                    "`{}` changed compatibly (mode `{}`) since {}: {shown}; run `{refresh}` to record it",
                    t.event_type,
                    t.mode,
                    report.lock_file.display()
                ));
            }
            Status::New => notes.push(format!(
                "`{}` is not in {} yet: it is not protected until released with `{refresh}`",
                t.event_type,
                report.lock_file.display()
            )),
            _ => {}
        }
    }
    notes
}
