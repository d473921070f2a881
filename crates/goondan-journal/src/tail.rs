//! [`Tail`]: what a journal gained since the last read, for a reader that
//! follows a journal another process writes (`gdn logs --follow`, the
//! studio).

use std::fs::File;
use std::io::{BufRead as _, BufReader, Seek as _, SeekFrom};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// How much [`Tail::read_new`] reads at a time.
const READ_BUFFER: usize = 256 * 1024;

/// A journal read so far: a byte offset, and the file it is an offset in.
#[derive(Debug, Clone)]
pub struct Tail {
    path: PathBuf,
    /// The end of the last complete line read.
    offset: u64,
    /// The inode read from (0 before the first read).
    inode: u64,
}

/// What [`Tail::read_new`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailRead {
    /// Complete lines read (maybe none).
    Lines(usize),
    /// The journal was rewritten (compacted: another file now, or shorter
    /// than what was read) since the last read; nothing was read. What was
    /// read may be gone: [`Tail::restart`] reads the new file from its start.
    Rewritten,
    /// There is no file (yet).
    Missing,
}

impl Tail {
    /// The journal at `path`, not read yet.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into(), offset: 0, inode: 0 }
    }

    /// The journal's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The end of the last complete line read.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Forgets what was read: the next read starts at the beginning.
    pub fn restart(&mut self) {
        self.offset = 0;
        self.inode = 0;
    }

    /// Calls `line` with each complete line (its newline taken off) added
    /// since the last read, in order. A line still being written (no
    /// newline yet) is left for the next read; a read that fails midway
    /// keeps what it read. Lines are handed out as they are: parsing (and
    /// skipping what does not parse) is the caller's.
    pub fn read_new(&mut self, mut line: impl FnMut(&[u8])) -> TailRead {
        let Ok(mut file) = File::open(&self.path) else { return TailRead::Missing };
        let Ok(meta) = file.metadata() else { return TailRead::Missing };
        if self.offset > 0 && (meta.ino() != self.inode || meta.len() < self.offset) {
            return TailRead::Rewritten;
        }
        self.inode = meta.ino();
        if meta.len() == self.offset || file.seek(SeekFrom::Start(self.offset)).is_err() {
            return TailRead::Lines(0);
        }
        let mut reader = BufReader::with_capacity(READ_BUFFER, file);
        let mut buffer = Vec::new();
        let mut count = 0;
        loop {
            buffer.clear();
            match reader.read_until(b'\n', &mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(read) => {
                    // A line still being written: read it next time.
                    let Some(complete) = buffer.strip_suffix(b"\n") else { break };
                    self.offset += read as u64;
                    count += 1;
                    line(complete);
                }
            }
        }
        TailRead::Lines(count)
    }
}
