//! [`PathIoError`]: a failed file operation, with what was being done and
//! where — the I/O variant the journal and the runtime's stores share, so it
//! is worded alike (`{op} {path}: {cause}`) wherever a file fails.

use std::io;
use std::path::{Path, PathBuf};

/// A file operation that failed: `{op} {path}: {source}`.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct PathIoError {
    /// What was being done, e.g. `appending to`.
    pub op: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// The cause.
    #[source]
    pub source: io::Error,
}

impl PathIoError {
    /// `op` on `path` failed with `source`.
    pub fn new(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self { op, path: path.into(), source }
    }

    /// A `map_err` adapter: the failure of `op` on `path`, converted into
    /// the caller's error type.
    pub fn at<E: From<Self>>(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> E {
        move |source| Self::new(op, path, source).into()
    }
}
