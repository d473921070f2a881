//! Folding a journal: every record in order, and what the torn-tail rule
//! skipped.

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead as _, BufReader};
use std::path::Path;

use serde::de::DeserializeOwned;

use crate::{JournalError, is_blank};

/// Why the last line of a journal is torn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TornReason {
    /// It has no newline: a write was cut off.
    NoNewline,
    /// It does not parse as a record (why, as the parser says it).
    Unparsable(String),
}

/// The torn last line of a journal (see the crate docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// Its line number, from 1, when the whole journal was read (a writer
    /// that only looks at the end does not count lines).
    pub line: Option<usize>,
    /// Where it starts: the journal is cut back to here.
    pub offset: u64,
    /// Its length in bytes, to the end of the file.
    pub bytes: u64,
    /// Why it is torn.
    pub reason: TornReason,
}

impl fmt::Display for TornTail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(line) = self.line {
            write!(f, "line {line}, ")?;
        }
        match &self.reason {
            TornReason::NoNewline => write!(f, "{} bytes without a newline", self.bytes),
            TornReason::Unparsable(why) => write!(f, "{} bytes that cannot be read: {why}", self.bytes),
        }
    }
}

/// A line in the middle of a journal that does not parse: not a crash's
/// doing (a hand edit, a bug, a disk fault).
#[derive(Debug, thiserror::Error)]
#[error("line {line} cannot be read: {source}")]
pub struct CorruptLine {
    /// Its line number, from 1.
    pub line: usize,
    /// Why it does not parse.
    #[source]
    pub source: serde_json::Error,
}

/// What [`replay`] read.
#[derive(Debug, Default)]
pub struct Replayed {
    /// Records read and applied.
    pub records: usize,
    /// Lines in the middle that did not parse, skipped, in order.
    pub corrupt: Vec<CorruptLine>,
    /// The torn last line, skipped.
    pub torn: Option<TornTail>,
    /// The length of the journal without its torn tail.
    pub end: u64,
}

impl Replayed {
    /// This replay, or [`JournalError::Corrupt`] for its first corrupt
    /// line: for callers that refuse a journal with a bad line in the middle.
    pub fn strict(mut self, path: &Path) -> Result<Self, JournalError> {
        if self.corrupt.is_empty() {
            return Ok(self);
        }
        let first = self.corrupt.remove(0);
        Err(JournalError::Corrupt { path: path.to_path_buf(), line: first.line, source: first.source })
    }
}

/// Reads the journal at `path` and applies every record, in order, to
/// `apply`; writes nothing. A missing file is an empty journal. The torn
/// tail and corrupt lines are skipped and reported in the answer; only I/O
/// failures are errors.
pub fn replay<R: DeserializeOwned>(path: &Path, mut apply: impl FnMut(R)) -> Result<Replayed, JournalError> {
    let mut replayed = Replayed::default();
    let file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(replayed),
        Err(error) => return Err(JournalError::io("opening", path)(error)),
    };
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let mut line = Vec::new();
    let mut number = 0_usize;
    let mut offset = 0_u64;
    // A complete line that does not parse: corrupt if any line follows, the
    // torn tail if none does. (line number, where it starts, why)
    let mut unparsable: Option<(usize, u64, serde_json::Error)> = None;
    loop {
        line.clear();
        let read = reader.read_until(b'\n', &mut line).map_err(JournalError::io("reading", path))?;
        if read == 0 {
            break;
        }
        number += 1;
        let start = offset;
        offset += read as u64;
        if let Some((bad, _, source)) = unparsable.take() {
            replayed.corrupt.push(CorruptLine { line: bad, source });
        }
        let Some(body) = line.strip_suffix(b"\n") else {
            replayed.torn =
                Some(TornTail { line: Some(number), offset: start, bytes: read as u64, reason: TornReason::NoNewline });
            break;
        };
        if is_blank(body) {
            continue;
        }
        match serde_json::from_slice::<R>(body) {
            Ok(record) => {
                replayed.records += 1;
                apply(record);
            }
            Err(error) => unparsable = Some((number, start, error)),
        }
    }
    if let Some((bad, start, error)) = unparsable {
        replayed.torn = Some(TornTail {
            line: Some(bad),
            offset: start,
            bytes: offset - start,
            reason: TornReason::Unparsable(error.to_string()),
        });
    }
    replayed.end = replayed.torn.as_ref().map_or(offset, |torn| torn.offset);
    Ok(replayed)
}
