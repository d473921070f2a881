//! [`GroupCommit`]: one journal, many appending threads, one fsync per
//! batch.
//!
//! An appender adds its line to the open batch. If no write is under way
//! it becomes the leader: it takes the batch (and every line added to it
//! so far), writes it with one write, syncs it once, and tells every
//! appender of the batch how it went. Appenders that come while the
//! leader writes fill the next batch, and one of them leads it. So a
//! burst of N appends costs about two fsyncs, not N, and no appender
//! returns before its own line is durable.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};

use goondan_core::sync::LockUnpoisoned;

use goondan_core::fault::Point;

use crate::{Journal, JournalError};

/// How one batch went.
#[derive(Debug, Default)]
struct Batch {
    outcome: OnceLock<Result<(), JournalError>>,
}

#[derive(Debug)]
pub(crate) struct State {
    /// `None` while a leader writes (it holds the journal), or after a
    /// leader panicked.
    pub(crate) journal: Option<Journal>,
    /// The lines of the open batch.
    pub(crate) lines: Vec<u8>,
    /// Their fault points.
    points: Vec<Point>,
    /// The open batch.
    batch: Arc<Batch>,
    /// A leader panicked: the journal is gone.
    poisoned: bool,
    /// Batches written so far.
    batches: u64,
}

/// A [`Journal`] shared by threads, with group commit (see the module docs).
#[derive(Debug)]
pub struct GroupCommit {
    path: std::path::PathBuf,
    state: Mutex<State>,
    /// Signalled when a batch's outcome is known.
    pub(crate) settled: Condvar,
}

impl GroupCommit {
    /// Shares `journal`.
    pub fn new(journal: Journal) -> Self {
        Self {
            path: journal.path().to_path_buf(),
            state: Mutex::new(State {
                journal: Some(journal),
                lines: Vec::new(),
                points: Vec::new(),
                batch: Arc::new(Batch::default()),
                poisoned: false,
                batches: 0,
            }),
            settled: Condvar::new(),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock_unpoisoned()
    }

    /// Appends `line` (whole lines, ending with a newline) in the next
    /// batch; returns once that batch is durable, or with its error (every
    /// appender of a failed batch gets it; nothing of it was kept).
    /// `point` is the record's fault point (tests only). Blocking: async
    /// callers run it on a blocking thread.
    pub fn append(&self, line: &[u8], point: Option<Point>) -> Result<(), JournalError> {
        let mut state = self.lock();
        if state.poisoned {
            return Err(JournalError::Poisoned { path: self.path.clone() });
        }
        state.lines.extend_from_slice(line);
        if let Some(point) = point
            && !state.points.contains(&point)
        {
            state.points.push(point);
        }
        let mine = Arc::clone(&state.batch);
        loop {
            if let Some(outcome) = mine.outcome.get() {
                return outcome.as_ref().copied().map_err(JournalError::duplicate);
            }
            if state.poisoned {
                return Err(JournalError::Poisoned { path: self.path.clone() });
            }
            // No write under way, and the batch not done: it is the open
            // one (a batch leaves only with the journal, and comes back
            // settled). Lead it.
            if let Some(journal) = state.journal.take() {
                let lines = std::mem::take(&mut state.lines);
                let points = std::mem::take(&mut state.points);
                let batch = std::mem::replace(&mut state.batch, Arc::new(Batch::default()));
                drop(state);
                let mut leader = Leader { group: self, journal: Some(journal) };
                let outcome = leader.write(&lines, &points);
                state = self.lock();
                state.journal = leader.journal.take();
                state.batches += 1;
                let _ = batch.outcome.set(outcome);
                self.settled.notify_all();
                continue;
            }
            state = self.settled.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// How many batches were written (each one write and one fsync).
    pub fn batches(&self) -> u64 {
        self.lock().batches
    }

    /// The shared journal back, once no append is under way.
    pub fn into_inner(self) -> Option<Journal> {
        self.state.into_inner().unwrap_or_else(PoisonError::into_inner).journal
    }
}

/// The journal while a leader writes: if the leader panics, the group is
/// marked poisoned and every waiter woken, instead of waiting forever.
struct Leader<'a> {
    group: &'a GroupCommit,
    journal: Option<Journal>,
}

impl Leader<'_> {
    fn write(&mut self, lines: &[u8], points: &[Point]) -> Result<(), JournalError> {
        match self.journal.as_mut() {
            Some(journal) => journal.append(lines, points),
            None => Err(JournalError::Poisoned { path: self.group.path.clone() }),
        }
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut state = self.group.lock();
            state.poisoned = true;
            self.group.settled.notify_all();
        }
    }
}
