//! The event log (events.jsonl): runtime events appended on the journal,
//! synced on flush.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use goondan_journal::Journal;

use super::error::StoreError;
use super::instance::InstanceStore;

impl InstanceStore {
    /// The event log opened for appending, for a
    /// `goondan_tools::JsonLinesEventSink`: its `flush()` also syncs the file
    /// (only when something was written since the last sync). A torn tail
    /// left by a crash is cut first. One writer at a time.
    pub fn event_writer(&self) -> Result<EventLogWriter, StoreError> {
        let path = &self.events_path;
        // Events are JSON values of any shape: a last line that is not one is torn.
        let mut journal = Journal::open::<serde::de::IgnoredAny>(path)
            .map_err(|error| StoreError::from_journal(error, Some("opening the event log")))?;
        journal.repair_tail().map_err(|error| StoreError::from_journal(error, None))?;
        Ok(EventLogWriter { journal, path: path.clone() })
    }
}

/// An append-only event log whose `flush()` syncs the file to disk (and
/// whose drop syncs what is left).
#[derive(Debug)]
pub struct EventLogWriter {
    journal: Journal,
    path: PathBuf,
}

impl EventLogWriter {
    /// The event log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn annotate(&self, op: &str, error: io::Error) -> io::Error {
        io::Error::new(error.kind(), format!("{op} {}: {error}", self.path.display()))
    }
}

impl Write for EventLogWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.journal
            .write_unsynced(bytes, goondan_core::fault::Point::EventsLog)
            .map_err(|error| self.annotate("appending to", error))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.journal.sync().map_err(|error| self.annotate("syncing", error))
    }
}
