//! [`SimError`]: everything that can go wrong between the command line and the plot file, each
//! naming the value (and, for a pattern file, the line) at fault.

use std::path::PathBuf;

/// Why a simulation could not be set up, run or written out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// A value given by the user (an option or a part of one) is not valid.
    #[error("invalid {what} {value:?}: {reason}")]
    Invalid {
        /// Which option or part of one, e.g. `--quota`.
        what: &'static str,
        /// The value as given.
        value: String,
        /// What is wrong with it, and what would be right.
        reason: String,
    },
    /// A rate, quota or duration given by the user is not valid: the option, then the core
    /// parser's error (which names the value and the syntax expected).
    #[error("{what}: {source}")]
    Parse {
        /// Which option or part of one, e.g. `--traffic`.
        what: &'static str,
        /// What is wrong with the value.
        #[source]
        source: tollgate::ParseError,
    },
    /// A traffic pattern file could not be read.
    #[error("cannot read pattern file {}: {source}", path.display())]
    ReplayRead {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A line of a traffic pattern file is not a timestamp.
    #[error("pattern file {}, line {line}: {reason}", path.display())]
    ReplayLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with the line.
        reason: String,
    },
    /// A traffic pattern file holds no timestamp at all.
    #[error("pattern file {} holds no timestamps (one per line: seconds, or RFC 3339)", path.display())]
    ReplayEmpty {
        /// The file.
        path: PathBuf,
    },
    /// The traffic would offer more requests than the simulator keeps in memory.
    #[error("{traffic} over {duration} offers more than {max} requests; shorten --duration or lower the rate")]
    TooManyRequests {
        /// The traffic, described.
        traffic: String,
        /// The simulated duration, formatted.
        duration: String,
        /// The most requests one simulation handles.
        max: usize,
    },
    /// The plot could not be drawn or encoded.
    #[error("cannot draw plot {}: {source}", path.display())]
    Plot {
        /// The plot file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: crate::plot::RenderError,
    },
    /// The plot file could not be written.
    #[error("cannot write plot file {}: {source}", path.display())]
    PlotWrite {
        /// The plot file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl SimError {
    /// True when the user's input was at fault (the command line, or the pattern file it names),
    /// as opposed to the output (a plot that cannot be drawn or written). The binary exits with 2
    /// for these, 1 for the others.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            SimError::Invalid { .. }
                | SimError::Parse { .. }
                | SimError::ReplayRead { .. }
                | SimError::ReplayLine { .. }
                | SimError::ReplayEmpty { .. }
                | SimError::TooManyRequests { .. }
        )
    }

    pub(crate) fn invalid(what: &'static str, value: &str, reason: impl Into<String>) -> SimError {
        SimError::Invalid { what, value: value.to_owned(), reason: reason.into() }
    }
}
