//! [`Journal`]: the one writer of a journal file.

use std::fs::{self, File};
use std::io::{self, Read as _, Seek as _, SeekFrom, Write};
use std::path::{Path, PathBuf};

use goondan_core::fault::{self, Point};
use serde::de::DeserializeOwned;

use crate::replay::{Replayed, TornReason, TornTail};
use crate::{JournalError, LOG_TARGET, is_blank, parses_as, private_file, sync_dir};

/// What is known of the end of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Not looked at yet: a torn tail may be there ([`Journal::repair_tail`]).
    Unchecked,
    /// It ends with the last durable record, at `length`.
    Clean,
    /// A failed append could not be cut off yet: it is, before the next.
    FailedWrite,
}

/// A journal file opened for appending (see the crate docs). One writer at
/// a time: the owner of the file holds a lock.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: File,
    /// The file's length after its last durable record.
    length: u64,
    end: End,
    /// Whether a line parses as a record (the torn-tail rule's second half).
    parses: fn(&[u8]) -> bool,
    /// Bytes written by [`Journal::write_unsynced`] since the last sync.
    unsynced: bool,
}

impl Journal {
    /// Opens the journal at `path` whose records are `R`s, creating it
    /// (mode 0600, and its directory synced) if missing; its directory
    /// must exist. Nothing is read: a torn tail is cut before the first
    /// append, or by [`Journal::repair_tail`] / [`Journal::cut_torn_tail`].
    pub fn open<R: DeserializeOwned>(path: &Path) -> Result<Self, JournalError> {
        let existed = fs::symlink_metadata(path).is_ok();
        let file = private_file()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(JournalError::io("opening", path))?;
        // A new file's name is durable only once its directory is synced.
        if !existed && let Some(dir) = path.parent() {
            sync_dir(dir).map_err(JournalError::io("syncing the directory of", path))?;
        }
        let length = file.metadata().map_err(JournalError::io("inspecting", path))?.len();
        Ok(Self {
            path: path.to_path_buf(),
            file,
            length,
            end: End::Unchecked,
            parses: parses_as::<R>,
            unsynced: false,
        })
    }

    /// The journal's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The journal's length after its last durable record.
    pub fn len(&self) -> u64 {
        self.length
    }

    /// Whether the journal holds nothing.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// Cuts off the torn tail (see the crate docs), found by reading the
    /// end of the file only, and reports it (with a warning); `None` if
    /// the file ends clean.
    pub fn repair_tail(&mut self) -> Result<Option<TornTail>, JournalError> {
        let length = self.file.metadata().map_err(JournalError::io("inspecting", &self.path))?.len();
        let torn = self.find_torn_tail(length)?;
        if let Some(torn) = &torn {
            self.cut(torn)?;
        } else {
            self.length = length;
        }
        self.end = End::Clean;
        Ok(torn)
    }

    /// Cuts off the torn tail a [`replay`](crate::replay) of this file
    /// found (with a warning): for an owner that folds the whole journal
    /// before writing, so the end is not read twice.
    pub fn cut_torn_tail(&mut self, replayed: &Replayed) -> Result<(), JournalError> {
        match &replayed.torn {
            Some(torn) => self.cut(torn)?,
            None => self.length = replayed.end,
        }
        self.end = End::Clean;
        Ok(())
    }

    fn cut(&mut self, torn: &TornTail) -> Result<(), JournalError> {
        self.file.set_len(torn.offset).map_err(JournalError::io("cutting the torn last line of", &self.path))?;
        self.file.sync_data().map_err(JournalError::io("syncing", &self.path))?;
        self.length = torn.offset;
        tracing::warn!(
            target: LOG_TARGET,
            "{}: cut a torn last line ({torn}) left by an interrupted write",
            self.path.display()
        );
        Ok(())
    }

    /// The torn tail of the file's first `length` bytes, read from its end.
    fn find_torn_tail(&mut self, length: u64) -> Result<Option<TornTail>, JournalError> {
        let Some(last) = self.rfind_newline(length)? else {
            // No newline at all: the whole file is one torn line.
            return Ok((length > 0).then_some(TornTail {
                line: None,
                offset: 0,
                bytes: length,
                reason: TornReason::NoNewline,
            }));
        };
        if last + 1 < length {
            return Ok(Some(TornTail {
                line: None,
                offset: last + 1,
                bytes: length - last - 1,
                reason: TornReason::NoNewline,
            }));
        }
        // It ends with a newline: the last line is torn if it does not parse.
        let start = self.rfind_newline(last)?.map_or(0, |newline| newline + 1);
        let mut line = vec![0_u8; usize::try_from(last - start).unwrap_or(0)];
        self.file
            .seek(SeekFrom::Start(start))
            .and_then(|_| self.file.read_exact(&mut line))
            .map_err(JournalError::io("reading the end of", &self.path))?;
        if is_blank(&line) || (self.parses)(&line) {
            return Ok(None);
        }
        let why = String::from_utf8_lossy(&line[..line.len().min(40)]).into_owned();
        Ok(Some(TornTail {
            line: None,
            offset: start,
            bytes: length - start,
            reason: TornReason::Unparsable(format!("not a record: {why:?}")),
        }))
    }

    /// Where the last newline before `end` is.
    fn rfind_newline(&mut self, end: u64) -> Result<Option<u64>, JournalError> {
        const CHUNK: u64 = 8 * 1024;
        let mut buffer = [0_u8; CHUNK as usize];
        let mut end = end;
        while end > 0 {
            let start = end.saturating_sub(CHUNK);
            let chunk = &mut buffer[..usize::try_from(end - start).unwrap_or(0)];
            self.file
                .seek(SeekFrom::Start(start))
                .and_then(|_| self.file.read_exact(chunk))
                .map_err(JournalError::io("reading the end of", &self.path))?;
            if let Some(newline) = chunk.iter().rposition(|&byte| byte == b'\n') {
                return Ok(Some(start + newline as u64));
            }
            end = start;
        }
        Ok(None)
    }

    /// Before an append: the torn tail of a crash, or of a failed append
    /// that could not be cut then, is cut now.
    fn settle(&mut self) -> Result<(), JournalError> {
        match self.end {
            End::Clean => Ok(()),
            End::Unchecked => self.repair_tail().map(drop),
            End::FailedWrite => {
                self.file
                    .set_len(self.length)
                    .and_then(|()| self.file.sync_data())
                    .map_err(JournalError::io("cutting off a failed write of", &self.path))?;
                self.end = End::Clean;
                Ok(())
            }
        }
    }

    /// Appends `lines` (whole lines, each ending with a newline) with one
    /// write and syncs them; on return they are durable. A write or sync
    /// that fails is cut off again before the error is returned (what
    /// reached the file is not acknowledged; were the cut to fail too, it
    /// is made before the next append, and until then every append fails).
    ///
    /// `points` are the fault points of the records (tests only): each is
    /// passed before the write and, once it is durable, after it.
    pub fn append(&mut self, lines: &[u8], points: &[Point]) -> Result<(), JournalError> {
        self.settle()?;
        for point in points {
            fault::before_write(*point).map_err(JournalError::io("appending to", &self.path))?;
        }
        let written = self
            .file
            .write_all(lines)
            .map_err(JournalError::io("appending to", &self.path))
            .and_then(|()| self.file.sync_data().map_err(JournalError::io("syncing", &self.path)));
        if let Err(error) = written {
            if let Err(cut) = self.file.set_len(self.length).and_then(|()| self.file.sync_data()) {
                tracing::error!(
                    target: LOG_TARGET,
                    path = %self.path.display(),
                    error = %cut,
                    "cutting off a failed append failed; it is tried again before the next append"
                );
                self.end = End::FailedWrite;
            }
            return Err(error);
        }
        self.length += lines.len() as u64;
        for point in points {
            fault::after_write(*point);
        }
        Ok(())
    }

    /// Writes `bytes` without syncing (they need not be whole lines): for a
    /// writer that syncs when it flushes ([`Journal::sync`]). Nothing is cut
    /// back on failure: the next open's torn-tail rule does it.
    pub fn write_unsynced(&mut self, bytes: &[u8], point: Point) -> io::Result<usize> {
        if self.end == End::Unchecked {
            self.repair_tail().map_err(|error| match error {
                JournalError::Io(failure) => failure.source,
                other => io::Error::other(other.to_string()),
            })?;
        }
        fault::before_write(point)?;
        let written = self.file.write(bytes)?;
        if written > 0 {
            self.length += written as u64;
            self.unsynced = true;
        }
        Ok(written)
    }

    /// Syncs what [`Journal::write_unsynced`] wrote (nothing to do if it
    /// wrote nothing since the last sync).
    pub fn sync(&mut self) -> io::Result<()> {
        if self.unsynced {
            self.file.sync_data()?;
            self.unsynced = false;
        }
        Ok(())
    }

    /// Replaces the journal with what `write` writes (compaction): a temp
    /// file at `temp` (beside the journal), synced, renamed over it, the
    /// directory synced. A crash leaves the old journal or the new one. The
    /// new file's handle is opened before the rename, so every later
    /// append goes to it. `point` (tests only) is passed before the temp
    /// file is written and once the new journal is in place.
    pub fn rewrite(
        &mut self,
        temp: &Path,
        point: Option<Point>,
        write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
    ) -> Result<(), JournalError> {
        let written =
            write_temp(temp, point, write).map_err(JournalError::io("writing", temp)).and_then(|(file, length)| {
                fs::rename(temp, &self.path).map_err(JournalError::io("replacing", &self.path))?;
                Ok((file, length))
            });
        let (file, length) = match written {
            Ok(written) => written,
            Err(error) => {
                // Best effort: the temp file is garbage now; the old journal stands.
                let _ = fs::remove_file(temp);
                return Err(error);
            }
        };
        if let Some(dir) = self.path.parent()
            && let Err(error) = sync_dir(dir)
        {
            tracing::warn!(target: LOG_TARGET, path = %self.path.display(), %error, "syncing the directory of a rewritten journal failed");
        }
        self.file = file;
        self.length = length;
        self.end = End::Clean;
        self.unsynced = false;
        if let Some(point) = point {
            fault::after_write(point);
        }
        Ok(())
    }
}

/// Writes the temp file of a rewrite and syncs it; returns it opened for
/// appending, and its length.
fn write_temp(
    temp: &Path,
    point: Option<Point>,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<(File, u64)> {
    let file = private_file().write(true).create(true).truncate(true).open(temp)?;
    if let Some(point) = point {
        fault::before_write(point)?;
    }
    let mut out = io::BufWriter::with_capacity(64 * 1024, file);
    write(&mut out)?;
    let file = out.into_inner().map_err(io::IntoInnerError::into_error)?;
    file.sync_all()?;
    let length = file.metadata()?.len();
    drop(file);
    let file = private_file().read(true).append(true).open(temp)?;
    Ok((file, length))
}

impl Drop for Journal {
    fn drop(&mut self) {
        if self.unsynced
            && let Err(error) = self.file.sync_data()
        {
            tracing::warn!(target: LOG_TARGET, "syncing {}: {error}", self.path.display());
        }
    }
}
