//! The crate's one error type. `outbox-codegen` re-exports it as its own: a build reports the
//! problems of the schemas and of the generation in one list.

use std::fmt;
use std::path::PathBuf;

/// `Result` with this crate's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while loading event schemas or generating Rust from them.
///
/// Every message names the file, and where it helps the JSON pointer inside it, and says what
/// to change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file or folder could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// A schema file's name is not `<event_type>.schema.json` with a valid event type.
    #[error("{}: {message}", file.display())]
    FileName {
        /// The schema file.
        file: PathBuf,
        /// What is wrong with the name and how to rename it.
        message: String,
    },

    /// A problem at one place inside a schema file.
    #[error("{}: at {}: {message}", file.display(), DisplayPointer(pointer))]
    Schema {
        /// The file the problem is in (an event schema or a shared definition file).
        file: PathBuf,
        /// The JSON pointer (RFC 6901) of the offending value inside `file`; empty for the
        /// whole document, which is displayed as `the root`.
        pointer: String,
        /// What is wrong and what to change.
        message: String,
    },

    /// A released event type changed in a way its compatibility mode does not allow: the
    /// schema evolution gate of `outbox-codegen` compared the schema with its baseline in the
    /// lock file. `report` lists the breaking changes and the fixes, over several lines.
    #[error("{}: {report}", file.display())]
    Incompatible {
        /// The schema file (for a released type whose schema is gone, the lock file).
        file: PathBuf,
        /// The event type.
        event_type: String,
        /// What broke, for whom, and how to fix it; one change a line.
        report: String,
    },

    /// A setting of the build is wrong (for example a `.consumes(..)` pattern or a missing
    /// `OUT_DIR`).
    #[error("{0}")]
    Config(String),

    /// Several problems, each displayed on its own line.
    #[error("{}", DisplayMany(.0))]
    Many(Vec<Error>),
}

impl Error {
    /// A [`Error::Schema`] at `pointer` in `file`.
    pub fn schema(
        file: impl Into<PathBuf>,
        pointer: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Error::Schema {
            file: file.into(),
            pointer: pointer.into(),
            message: message.into(),
        }
    }

    /// The single problems this error consists of: [`Error::Many`] flattened, any other error
    /// as itself.
    ///
    /// ```
    /// use outbox_schema::Error;
    ///
    /// let many = Error::Many(vec![Error::Config("a".into()), Error::Config("b".into())]);
    /// assert_eq!(many.into_list().len(), 2);
    /// ```
    pub fn into_list(self) -> Vec<Error> {
        match self {
            Error::Many(errors) => errors.into_iter().flat_map(Error::into_list).collect(),
            other => vec![other],
        }
    }

    /// Folds a list of problems into one error: `None` when the list is empty, the error
    /// itself when there is one, [`Error::Many`] otherwise.
    pub fn from_list(errors: Vec<Error>) -> Option<Error> {
        let mut errors: Vec<Error> = errors.into_iter().flat_map(Error::into_list).collect();
        match errors.len() {
            0 => None,
            1 => errors.pop(),
            _ => Some(Error::Many(errors)),
        }
    }
}

struct DisplayPointer<'a>(&'a str);

impl fmt::Display for DisplayPointer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("the root")
        } else {
            f.write_str(self.0)
        }
    }
}

struct DisplayMany<'a>(&'a [Error]);

impl fmt::Display for DisplayMany<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_display_names_file_and_pointer() {
        let e = Error::schema("a/b.schema.json", "/properties/x", "bad; fix it");
        assert_eq!(
            e.to_string(),
            "a/b.schema.json: at /properties/x: bad; fix it"
        );
        let e = Error::schema("a/b.schema.json", "", "not json");
        assert_eq!(e.to_string(), "a/b.schema.json: at the root: not json");
    }

    #[test]
    fn many_is_one_line_each_and_flattens() {
        let e = Error::Many(vec![
            Error::Config("one".into()),
            Error::Many(vec![
                Error::Config("two".into()),
                Error::Config("three".into()),
            ]),
        ]);
        assert_eq!(e.to_string(), "one\ntwo\nthree");
        assert_eq!(e.into_list().len(), 3);
        assert!(Error::from_list(vec![]).is_none());
        assert!(matches!(
            Error::from_list(vec![Error::Config("x".into())]),
            Some(Error::Config(_))
        ));
    }
}
