//! One error type for the planner: every message names the input, the field and the fix.

use std::fmt;

/// Planner result.
pub type Result<T> = std::result::Result<T, Error>;

/// What went wrong, in words a user can act on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A field of an input (a config file, a flag, a platform) has a value that cannot work.
    #[error("{source_name}: `{field}` {why}")]
    Invalid { source_name: String, field: String, why: String },
    /// A required field is absent.
    #[error("{source_name}: missing field `{field}`{hint}")]
    Missing { source_name: String, field: String, hint: Hint },
    /// A name (preset, model_type, schedule) is not known; shown escaped (it may come from a file).
    #[error("{what} `{}` is not known; expected one of: {known}", name.escape_debug())]
    Unknown { what: String, name: String, known: String },
    /// A file could not be read or parsed.
    #[error("{path}: {why}")]
    File { path: String, why: String },
}

/// Optional trailing hint of a [`Error::Missing`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Hint(pub Option<String>);

impl fmt::Display for Hint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(h) => write!(f, " ({h})"),
            None => Ok(()),
        }
    }
}

impl Error {
    pub fn invalid(source_name: impl Into<String>, field: impl Into<String>, why: impl Into<String>) -> Self {
        Error::Invalid { source_name: source_name.into(), field: field.into(), why: why.into() }
    }

    pub fn missing(source_name: impl Into<String>, field: impl Into<String>, hint: Option<String>) -> Self {
        Error::Missing { source_name: source_name.into(), field: field.into(), hint: Hint(hint) }
    }

    pub fn unknown(what: impl Into<String>, name: impl Into<String>, known: &[&str]) -> Self {
        Error::Unknown { what: what.into(), name: name.into(), known: known.join(", ") }
    }

    pub fn file(path: impl Into<String>, why: impl Into<String>) -> Self {
        Error::File { path: path.into(), why: why.into() }
    }
}
