//! The append-only JSON Lines journal: one record per line, appended and
//! synced, folded again on open.
//!
//! ```text
//! {"op":"accept","seq":7,…}\n     a record: one JSON value on one line
//! {"op":"done","seq":7,…}\n       appended with one write, then fdatasync
//! {"op":"sta                       a torn tail: a crash in the middle of a write
//! ```
//!
//! Every durable log of goondan-rs is one of these (the inbox, each
//! conversation's message log, each instance's event log, the task book),
//! and every reader of them (`gdn logs`, the studio) reads them through
//! [`Tail`]. One file, one writer: the owner of a journal holds its lock
//! (the inbox's, the instance's); the journal itself takes none.
//!
//! - [`Journal`]: the writer. [`Journal::append`] writes bytes of whole
//!   lines with one `write` and syncs them; a write or sync that fails is
//!   cut off again, so the next record never follows half of one and
//!   nothing unsynced is acknowledged. [`Journal::rewrite`] replaces the
//!   file with a compacted one (temp file, fsync, rename, directory sync).
//! - [`GroupCommit`]: a journal shared by threads: many appends, one
//!   fsync; each appender returns once its own record is durable.
//! - [`replay`]: folds a journal without writing it.
//! - [`Tail`]: reads what was appended since the last read, for readers
//!   that follow a journal another process writes.
//!
//! The torn-tail rule, the same everywhere: the last line of a journal is
//! torn when it has no newline, or when it is not blank and does not parse
//! as a record. A torn tail is what a crash in the middle of a write
//! leaves: [`replay`] skips and reports it ([`Replayed::torn`]), and the
//! writer cuts it off before its first append ([`Journal::repair_tail`],
//! [`Journal::cut_torn_tail`]) with a warning — never an error. A line
//! that does not parse with more lines after it cannot be a crash's doing:
//! it is a [`CorruptLine`] with its line number; the caller chooses to skip
//! it or to refuse the journal ([`Replayed::strict`]). Blank lines are
//! skipped.
//!
//! Deliberately absent: no locking between processes (the owner's job), no
//! record schema (callers parse their own type; the journal only asks
//! whether a line parses as it), no async (callers that are async run it on
//! a blocking thread), no background thread.
//!
//! The test-only fault points of `goondan_core::fault` sit on the writes:
//! the caller names them per append, so the crash matrix keeps its names.

mod group;
mod replay;
mod tail;
mod writer;

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use goondan_core::PathIoError;

pub use group::GroupCommit;
pub use replay::{CorruptLine, Replayed, TornReason, TornTail, replay};
pub use tail::{Tail, TailRead};
pub use writer::Journal;

/// The `tracing` target of the journal's warnings.
const LOG_TARGET: &str = "goondan::journal";

/// The mode of a journal file the journal creates: the user's only (what
/// it holds is the user's conversations and events).
pub const FILE_MODE: u32 = 0o600;

/// Options whose new file is [`FILE_MODE`].
fn private_file() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.mode(FILE_MODE);
    options
}

/// A failure of the journal; each says what was being done and where.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// A file operation failed.
    #[error(transparent)]
    Io(#[from] PathIoError),
    /// A line in the middle of the journal does not parse (see
    /// [`Replayed::strict`]).
    #[error("{path}: line {line} cannot be read: {source}")]
    Corrupt {
        /// The journal.
        path: PathBuf,
        /// The line's number, from 1.
        line: usize,
        /// Why it does not parse.
        #[source]
        source: serde_json::Error,
    },
    /// A writer of a [`GroupCommit`] panicked while appending: the journal
    /// is gone with it.
    #[error("the journal {path} is unavailable: a writer panicked while appending")]
    Poisoned {
        /// The journal.
        path: PathBuf,
    },
}

impl JournalError {
    fn io(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Self {
        PathIoError::at(op, path)
    }

    /// The I/O error under it, if it is one (callers that report the cause alone).
    pub fn io_source(&self) -> Option<&io::Error> {
        match self {
            Self::Io(failure) => Some(&failure.source),
            _ => None,
        }
    }

    /// The same error again, for every appender of a batch that failed
    /// (an `io::Error` is not `Clone`: kind and message are kept).
    fn duplicate(&self) -> Self {
        match self {
            Self::Io(PathIoError { op, path, source }) => {
                Self::Io(PathIoError::new(op, path.clone(), io::Error::new(source.kind(), source.to_string())))
            }
            Self::Corrupt { path, line, source } => Self::Io(PathIoError::new(
                "reading",
                path.clone(),
                io::Error::new(io::ErrorKind::InvalidData, format!("line {line}: {source}")),
            )),
            Self::Poisoned { path } => Self::Poisoned { path: path.clone() },
        }
    }
}

/// Syncs the directory `dir`, so that a file created or renamed in it
/// survives a crash.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir).and_then(|dir| dir.sync_all())
}

/// Whether `line` (without its newline) parses as an `R`.
fn parses_as<R: serde::de::DeserializeOwned>(line: &[u8]) -> bool {
    serde_json::from_slice::<R>(line).is_ok()
}

/// Whether `line` holds nothing but whitespace (a blank line is skipped).
fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

#[cfg(test)]
mod tests;
