//! What can be wrong with a limits file, and where.

use std::fmt;

/// A position in a limits file, 1-based; `line == 0` when the position is unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Position {
    /// Line, from 1.
    pub line: u64,
    /// Column, from 1.
    pub column: u64,
}

impl Position {
    /// A position at `line`, `column` (both from 1).
    pub fn new(line: u64, column: u64) -> Position {
        Position { line, column }
    }
}

impl From<serde_saphyr::Location> for Position {
    fn from(l: serde_saphyr::Location) -> Position {
        Position::new(l.line(), l.column())
    }
}

/// A limits file that cannot be used: the file, the position and what is wrong.
///
/// Its `Display` is `file:line:column: message`, the form editors and CI logs link to.
///
/// ```
/// let err = tollgate_policy::Policy::parse("- namespace: a\n  max_value: -1\n  seconds: 1\n", "limits.yaml")
///     .unwrap_err();
/// assert_eq!(err.to_string(), "limits.yaml:2:14: max_value must be from 0 to 18446744073709551615, got -1");
/// assert_eq!((err.position.line, err.position.column), (2, 14));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct PolicyError {
    /// The file (or other source name) the limits came from.
    pub source_name: String,
    /// Where in it.
    pub position: Position,
    /// What is wrong, naming the offending value.
    pub message: String,
}

impl PolicyError {
    /// An error at `position` of `source_name` (`Position::default()` for the file as a whole).
    pub fn new(source_name: &str, position: Position, message: impl Into<String>) -> PolicyError {
        PolicyError { source_name: source_name.to_string(), position, message: message.into() }
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.position.line == 0 {
            write!(f, "{}: {}", self.source_name, self.message)
        } else {
            write!(f, "{}:{}:{}: {}", self.source_name, self.position.line, self.position.column, self.message)
        }
    }
}
