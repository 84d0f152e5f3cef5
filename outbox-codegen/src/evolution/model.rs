//! The gate's data model: a compatibility [`Mode`], whom a change [`Breaks`], one [`Change`],
//! and the [`Report`] of a folder, one [`TypeReport`] per event type with its [`Status`].

use std::fmt;
use std::path::PathBuf;

use super::rules::{Level, Rule};

/// A compatibility mode: which consumers a change must not break.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// New consumers must read old events: nothing may get narrower.
    Backward,
    /// Old consumers must read new events: nothing may get wider.
    Forward,
    /// Both: the default, since producers and consumers deploy independently.
    #[default]
    Full,
}

impl Mode {
    /// `backward`, `forward` or `full`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Backward => "backward",
            Mode::Forward => "forward",
            Mode::Full => "full",
        }
    }

    /// Whether a change that breaks `breaks` is forbidden in this mode.
    pub fn forbids(self, breaks: Breaks) -> bool {
        match self {
            Mode::Backward => breaks.new_consumers,
            Mode::Forward => breaks.old_consumers,
            Mode::Full => breaks.any(),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "backward" => Ok(Mode::Backward),
            "forward" => Ok(Mode::Forward),
            "full" => Ok(Mode::Full),
            _ => Err(format!(
                "unknown compatibility mode `{s}`; use `backward`, `forward` or `full`"
            )),
        }
    }
}

/// Whom a wire change breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Breaks {
    /// Consumers still on the released schema, reading events published with the new one
    /// (the change widens what the schema accepts): forbidden by `forward` and `full`.
    pub old_consumers: bool,
    /// Consumers on the new schema, reading events published with the released one (the
    /// change narrows what the schema accepts): forbidden by `backward` and `full`.
    pub new_consumers: bool,
}

impl Breaks {
    /// Nobody.
    pub const NONE: Breaks = Breaks {
        old_consumers: false,
        new_consumers: false,
    };
    /// Old consumers only.
    pub const OLD: Breaks = Breaks {
        old_consumers: true,
        new_consumers: false,
    };
    /// New consumers only.
    pub const NEW: Breaks = Breaks {
        old_consumers: false,
        new_consumers: true,
    };
    /// Both.
    pub const BOTH: Breaks = Breaks {
        old_consumers: true,
        new_consumers: true,
    };

    /// Whether anybody.
    pub fn any(self) -> bool {
        self.old_consumers || self.new_consumers
    }

    /// Everybody either breaks.
    pub fn or(self, other: Breaks) -> Breaks {
        Breaks {
            old_consumers: self.old_consumers || other.old_consumers,
            new_consumers: self.new_consumers || other.new_consumers,
        }
    }
}

/// One change between a released schema and the current one.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// What kind of change.
    pub rule: Rule,
    /// The JSON pointer of the changed keyword: in the current schema, or in the released one
    /// for what is gone. Inside a definition reached by `$ref`, the definition's pointer.
    pub pointer: String,
    /// For a change inside a definition: where the first `$ref` to it was followed from.
    pub via: Option<String>,
    /// What changed, in words.
    pub message: String,
    /// Whom it breaks on the wire (rust-level changes break Rust code whatever the mode).
    pub breaks: Breaks,
}

impl Change {
    /// Whether this change fails the gate under `mode` at `level`.
    pub fn is_breaking(&self, mode: Mode, level: Level) -> bool {
        match self.rule.level() {
            Level::Rust => level == Level::Rust,
            Level::Wire => mode.forbids(self.breaks),
        }
    }
}

/// Where an event type's mode comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeSource {
    /// `Config::compatibility_for` or `Config::compatibility` (`--compatibility...` flags).
    Config,
    /// The lock file's entry for the type.
    Lock,
    /// Neither: [`Mode::Full`].
    Default,
}

/// How an event type stands against the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// Not in the lock (or no lock): nothing to compare, it passes.
    New,
    /// The same schema as released.
    Unchanged,
    /// Another schema than released; [`TypeReport::changes`] says how.
    Changed,
    /// In the lock but no longer in the folder.
    Removed,
}

/// One event type compared with its released schema.
#[derive(Debug, Clone)]
pub struct TypeReport {
    /// The event type.
    pub event_type: String,
    /// Its title (the released one, for a removed type).
    pub title: String,
    /// Its schema file (for a removed type, the path the schema had).
    pub file: PathBuf,
    /// New, unchanged, changed or removed.
    pub status: Status,
    /// The mode it is checked under.
    pub mode: Mode,
    /// Where the mode comes from.
    pub mode_source: ModeSource,
    /// Every change found, breaking or not (annotations included).
    pub changes: Vec<Change>,
}

impl TypeReport {
    /// The changes that fail the gate at `level`.
    pub fn breaking(&self, level: Level) -> Vec<&Change> {
        self.changes
            .iter()
            .filter(|c| c.is_breaking(self.mode, level))
            .collect()
    }
}

/// Every event type of a folder compared with the lock.
#[derive(Debug, Clone)]
pub struct Report {
    /// The lock file read.
    pub lock_file: PathBuf,
    /// Whether it exists (without it every type is new).
    pub lock_found: bool,
    /// The level checked.
    pub level: Level,
    /// One entry per event type of the folder, sorted, then the removed ones.
    pub types: Vec<TypeReport>,
}

impl Report {
    /// Whether no type has a breaking change.
    pub fn passes(&self) -> bool {
        self.types.iter().all(|t| t.breaking(self.level).is_empty())
    }
}
