//! The inbox: every accepted event, durably, until its turn has run.
//!
//! ```text
//! <workspace>/ingress/inbox.jsonl     one record per line, append-only
//!   {"op":"accept","seq":7,"key":"slack-main/Ev123","at":…,"connection":…,"agent":…,"instance":…,"event":{…}}
//!   {"op":"start","seq":7,"at":…}     a turn of it started (attempts survive a crash)
//!   {"op":"done","seq":7,"at":…,"outcome":"answered"}
//!   {"op":"seen","key":"…","at":…}    compaction: a key remembered without its event
//! ```
//!
//! One writer thread owns the file and the set of keys. A store is a
//! request to it; it takes every request waiting, checks each key against
//! the set (a key seen before, even one stored by the same batch, is a
//! duplicate), appends the new records with one write, syncs the file once
//! (group commit), and only then answers every request of the batch —
//! duplicates included, so a redelivery racing its original is never
//! acknowledged before the original is on disk. A failed write or sync
//! answers the batch with an error and forgets its keys: nothing
//! acknowledged, nothing half-remembered.
//!
//! Keys are namespaced by Connection and remembered for the dedupe window
//! (7 days by default, at most a bounded number of keys) after acceptance,
//! and always while their event is pending. The file is rewritten from the
//! writer's state (pending events and remembered keys; temp file, fsync,
//! rename) when dead records are a third of it, at open and while
//! running, so it never grows without bound. A torn last line (a crash in
//! the middle of a write) is cut off at open.
//!
//! The inbox holds what users sent, so its files are the user's alone:
//! created 0600 (directories 0700), whatever the umask.

use goondan_core::sync::LockUnpoisoned;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use goondan_core::JsonObject;
use goondan_journal::{Journal, JournalError, Replayed};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use crate::event::{ConnectorEvent, Delivery};
use crate::routing::Route;
use crate::sink::SinkError;

/// How often (20 ms apart) a locked inbox is tried again before it is
/// reported busy.
const LOCK_TRIES: u32 = 50;

/// The mode of the inbox's files: the user's only.
const FILE_MODE: u32 = 0o600;
/// The mode of a directory the inbox makes.
const DIR_MODE: u32 = 0o700;

/// Options whose new file is [`FILE_MODE`].
fn private_file() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.mode(FILE_MODE);
    options
}

/// The lock file of the inbox at `path`: held by the process that writes it.
fn lock_path(path: &Path) -> PathBuf {
    path.with_extension("lock")
}

/// Whether a process holds the inbox at `path` (a service runs on it).
pub fn is_held(path: &Path) -> bool {
    let Ok(file) = OpenOptions::new().read(true).write(true).open(lock_path(path)) else { return false };
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            false
        }
        Err(std::fs::TryLockError::WouldBlock) => true,
        Err(std::fs::TryLockError::Error(_)) => false,
    }
}

/// The pid of the process that holds the inbox at `path`, while it holds
/// it (its lock file names it).
pub fn holder_pid(path: &Path) -> Option<u32> {
    if !is_held(path) {
        return None;
    }
    let text = fs::read_to_string(lock_path(path)).ok()?;
    text.trim().strip_prefix("pid ")?.trim().parse().ok()
}

/// The inbox file, under a workspace directory.
pub const INBOX_FILE: &str = "ingress/inbox.jsonl";

/// Where an accepted event goes, and from where it came.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The Connection it came through.
    pub connection: String,
    /// Its Connector.
    pub connector: String,
    /// The agent whose turn it is.
    pub agent: String,
    /// The agent instance.
    pub instance: String,
    /// The event.
    pub event: ConnectorEvent,
}

impl Entry {
    /// An entry for `event`, routed to `route`.
    pub fn new(connection: &str, connector: &str, route: Route, event: ConnectorEvent) -> Self {
        Self {
            connection: connection.to_owned(),
            connector: connector.to_owned(),
            agent: route.agent,
            instance: route.instance_key,
            event,
        }
    }
}

/// An event stored in the inbox, waiting for (or in) its turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// Its place in the inbox: turns of one instance run in this order.
    pub seq: u64,
    /// Its delivery key (`<connection>/<key>`).
    pub key: String,
    /// When it was accepted (ms since the epoch).
    pub accepted_at: u64,
    /// Turns of it started before (a crash or stop cut them off).
    pub attempts: u32,
    /// Why its turn waits to run again, when the last one could not be
    /// saved (storage failed): retried with backoff until writes work.
    pub retrying: Option<Retrying>,
    /// What and where.
    pub entry: Entry,
}

/// An event whose turn could not be saved and runs again once writes work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retrying {
    /// When the failed turn ended (ms since the epoch).
    pub at: u64,
    /// Turns of it that could not be saved, or could not start (no agent
    /// host), so far.
    pub failures: u32,
    /// Why the last one could not.
    pub reason: String,
}

impl Stored {
    /// The turn's input text: the message (the original's rules) and, when
    /// the event has properties, a line with them, so that the model can
    /// answer on the right channel (`telegram__send(chatId=…)`).
    pub fn turn_input(&self) -> String {
        let mut input = self.entry.event.message.input_text();
        if !self.entry.event.properties.is_empty() {
            let properties = serde_json::to_string(&self.entry.event.properties).unwrap_or_default();
            input.push_str(&format!(
                "\n\n[{} via {}] properties: {properties}",
                self.entry.event.name, self.entry.connection
            ));
        }
        input
    }

    /// The inbound metadata the turn (and its extensions, as
    /// `ctx.inputEvent.metadata`) sees.
    pub fn turn_metadata(&self) -> JsonObject {
        let event = &self.entry.event;
        let metadata = json!({
            "__goondanInbound": {
                "sourceKind": "connector",
                "sourceName": self.entry.connector,
                "eventName": event.name,
                "instanceKey": self.entry.instance,
            },
            "connection": self.entry.connection,
            "connector": self.entry.connector,
            "event": event.name,
            "properties": event.properties,
            "message": event.message,
            "deliveryKey": self.key,
            // The dispatcher counts a turn's start before it runs it: the
            // first turn sees 1 here, its rerun after a crash 2.
            "attempt": self.attempts.max(1),
        });
        match metadata {
            serde_json::Value::Object(map) => map,
            _ => JsonObject::new(),
        }
    }
}

/// How a stored event's turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The turn ran and answered.
    Answered,
    /// The turn failed (the agent's error); not retried.
    Failed,
    /// Its turns were cut off too often: given up.
    GaveUp,
}

/// What became of one delivery offered to [`Inbox::store`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreResult {
    /// Stored: its turn will run.
    Stored(Box<Stored>),
    /// Its key was seen before.
    Duplicate,
}

/// Why the inbox cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    /// The file cannot be read or written.
    #[error("inbox {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The writer is gone.
    #[error("the inbox is closed")]
    Closed,
    /// Another process has the inbox open (another `gdn run` serves the
    /// same project).
    #[error("another process serves this project's inbox {path} ({holder}); stop it first")]
    Busy {
        /// The inbox.
        path: PathBuf,
        /// What its lock file says of the holder.
        holder: String,
    },
}

/// How the inbox keeps keys.
#[derive(Debug, Clone, Copy)]
pub struct InboxOptions {
    /// How long a key is remembered after its event was accepted.
    pub dedupe_window: Duration,
    /// The most keys remembered (the oldest go first).
    pub max_keys: usize,
    /// The fewest records before a rewrite is considered.
    pub compact_min_records: usize,
}

impl Default for InboxOptions {
    fn default() -> Self {
        Self { dedupe_window: Duration::from_secs(7 * 24 * 3600), max_keys: 1_000_000, compact_min_records: 10_000 }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Record {
    Accept {
        seq: u64,
        key: String,
        at: u64,
        #[serde(flatten)]
        entry: Box<Entry>,
    },
    Start {
        seq: u64,
        at: u64,
    },
    /// The turn started last could not run (its agent cannot be built): it
    /// does not count as a start.
    Held {
        seq: u64,
        at: u64,
    },
    Done {
        seq: u64,
        at: u64,
        outcome: Outcome,
    },
    /// The turn of `seq` could not be saved (storage failed): it stays
    /// pending and runs again with backoff (a note for `gdn instance list`
    /// and `gdn logs`).
    Retry {
        seq: u64,
        at: u64,
        failures: u32,
        reason: String,
    },
    Seen {
        key: String,
        at: u64,
    },
    /// The next seq to give (a rewrite's first record, so that seqs never
    /// start over when no event is pending).
    Next {
        seq: u64,
    },
    /// An event no ingress rule matched (a note for `gdn logs`; not kept
    /// by a rewrite).
    Dropped {
        at: u64,
        connection: String,
        event: String,
        #[serde(rename = "instanceKey")]
        instance_key: String,
    },
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0)
}

/// What the file says, folded.
#[derive(Debug, Default)]
struct Folded {
    pending: BTreeMap<u64, Stored>,
    /// Pending events by `agent@instance`, kept as events come and go so
    /// that the status after each commit does not walk the backlog.
    by_instance: BTreeMap<String, usize>,
    /// Start records of pending events (each is a live record).
    pending_starts: usize,
    /// key → accepted at (ms), oldest first in `order`.
    keys: HashMap<String, u64>,
    order: VecDeque<(u64, String)>,
    next_seq: u64,
    records: usize,
}

impl Folded {
    fn remember(&mut self, key: String, at: u64) {
        if self.keys.insert(key.clone(), at).is_none() {
            self.order.push_back((at, key));
        }
    }

    fn apply(&mut self, record: Record) {
        self.records += 1;
        match record {
            Record::Accept { seq, key, at, entry } => {
                self.next_seq = self.next_seq.max(seq + 1);
                self.remember(key.clone(), at);
                let stored = Stored { seq, key, accepted_at: at, attempts: 0, retrying: None, entry: *entry };
                *self.by_instance.entry(instance_label(&stored)).or_insert(0) += 1;
                if let Some(replaced) = self.pending.insert(seq, stored) {
                    self.forget_pending(&replaced);
                }
            }
            Record::Start { seq, .. } => {
                if let Some(stored) = self.pending.get_mut(&seq) {
                    stored.attempts += 1;
                    self.pending_starts += 1;
                }
            }
            Record::Held { seq, .. } => {
                if let Some(stored) = self.pending.get_mut(&seq)
                    && stored.attempts > 0
                {
                    stored.attempts -= 1;
                    self.pending_starts = self.pending_starts.saturating_sub(1);
                }
            }
            Record::Done { seq, .. } => {
                if let Some(done) = self.pending.remove(&seq) {
                    self.forget_pending(&done);
                }
            }
            Record::Retry { seq, at, failures, reason } => {
                // A turn that could not be saved is not a start that counts
                // (as a held one): storage failed, not the turn.
                if let Some(stored) = self.pending.get_mut(&seq) {
                    stored.retrying = Some(Retrying { at, failures, reason });
                    if stored.attempts > 0 {
                        stored.attempts -= 1;
                        self.pending_starts = self.pending_starts.saturating_sub(1);
                    }
                }
            }
            Record::Seen { key, at } => self.remember(key, at),
            Record::Next { seq } => self.next_seq = self.next_seq.max(seq),
            Record::Dropped { .. } => {}
        }
    }

    fn forget_pending(&mut self, stored: &Stored) {
        self.pending_starts = self.pending_starts.saturating_sub(stored.attempts as usize);
        let label = instance_label(stored);
        if let Some(count) = self.by_instance.get_mut(&label) {
            *count -= 1;
            if *count == 0 {
                self.by_instance.remove(&label);
            }
        }
    }

    /// Forgets keys out of the window or over the bound (never a pending one).
    fn expire(&mut self, options: &InboxOptions, now: u64) {
        let window = u64::try_from(options.dedupe_window.as_millis()).unwrap_or(u64::MAX);
        // Keys are remembered oldest first: when the oldest is in the window
        // and the bound is kept, there is nothing to forget, and the walk
        // over every key (and every pending event) is not made.
        let oldest_expired = self.order.front().is_some_and(|(at, _)| now.saturating_sub(*at) > window);
        if !oldest_expired && self.order.len() <= options.max_keys {
            return;
        }
        let pending: std::collections::HashSet<&str> = self.pending.values().map(|s| s.key.as_str()).collect();
        let mut kept = VecDeque::with_capacity(self.order.len());
        let over = self.order.len().saturating_sub(options.max_keys);
        for (index, (at, key)) in std::mem::take(&mut self.order).into_iter().enumerate() {
            let old = now.saturating_sub(at) > window || index < over;
            if old && !pending.contains(key.as_str()) {
                self.keys.remove(&key);
            } else {
                kept.push_back((at, key));
            }
        }
        self.order = kept;
    }

    fn live_records(&self) -> usize {
        // Every pending event is one accept (and its starts), every other key one `seen`.
        self.keys.len() + self.pending_starts
    }
}

fn instance_label(stored: &Stored) -> String {
    format!("{}@{}", stored.entry.agent, stored.entry.instance)
}

/// Folds the inbox at `path` (the journal's torn-tail rule: a torn last
/// record is skipped, a bad one in the middle skipped with a warning).
fn read_file(path: &Path) -> Result<(Folded, Replayed), InboxError> {
    let mut folded = Folded { next_seq: 1, ..Folded::default() };
    let replayed = goondan_journal::replay::<Record>(path, |record| folded.apply(record)).map_err(journal_error)?;
    for corrupt in &replayed.corrupt {
        tracing::warn!(path = %path.display(), error = %corrupt, "inbox: an unreadable record is skipped");
    }
    Ok((folded, replayed))
}

/// An inbox error of a journal's (its cause, as the inbox always said it).
fn journal_error(error: JournalError) -> InboxError {
    match error {
        JournalError::Io(failure) => InboxError::Io { path: failure.path, source: failure.source },
        JournalError::Corrupt { ref path, .. } | JournalError::Poisoned { ref path } => {
            InboxError::Io { path: path.clone(), source: std::io::Error::other(error.to_string()) }
        }
    }
}

/// Writes the folded state as a new file in place of the old one (the
/// journal's rewrite: temp file, fsync, rename; later records go to the
/// new file).
fn rewrite(journal: &mut Journal, folded: &mut Folded) -> Result<(), JournalError> {
    let temp = journal.path().with_extension("jsonl.tmp");
    let mut records = 0;
    journal.rewrite(&temp, None, |out| {
        serde_json::to_writer(&mut *out, &Record::Next { seq: folded.next_seq })?;
        out.write_all(b"\n")?;
        let pending_keys: std::collections::HashSet<&str> = folded.pending.values().map(|s| s.key.as_str()).collect();
        for (at, key) in &folded.order {
            if !pending_keys.contains(key.as_str()) {
                serde_json::to_writer(&mut *out, &Record::Seen { key: key.clone(), at: *at })?;
                out.write_all(b"\n")?;
            }
        }
        records = folded.keys.len().saturating_sub(folded.pending.len());
        for stored in folded.pending.values() {
            let accept = Record::Accept {
                seq: stored.seq,
                key: stored.key.clone(),
                at: stored.accepted_at,
                entry: Box::new(stored.entry.clone()),
            };
            serde_json::to_writer(&mut *out, &accept)?;
            out.write_all(b"\n")?;
            records += 1;
            for _ in 0..stored.attempts {
                serde_json::to_writer(&mut *out, &Record::Start { seq: stored.seq, at: stored.accepted_at })?;
                out.write_all(b"\n")?;
                records += 1;
            }
        }
        Ok(())
    })?;
    folded.records = records;
    Ok(())
}

enum Op {
    Store {
        connection: String,
        items: Vec<(Option<String>, Entry)>,
        reply: oneshot::Sender<Result<Vec<StoreResult>, SinkError>>,
    },
    Start {
        seq: u64,
    },
    Done {
        seq: u64,
        outcome: Outcome,
        reply: Option<oneshot::Sender<Result<(), SinkError>>>,
    },
    /// A note that an event was dropped (synced with the next write).
    Dropped {
        connection: String,
        event: String,
        instance_key: String,
    },
    /// Answered once everything sent before it is on disk.
    Sync {
        reply: oneshot::Sender<Result<(), SinkError>>,
    },
    Held {
        seq: u64,
    },
    Retry {
        seq: u64,
        failures: u32,
        reason: String,
    },
    Close,
}

/// A snapshot of what waits in the inbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InboxStatus {
    /// Pending events (accepted, turn not done), by `agent@instance`.
    pub pending: BTreeMap<String, usize>,
    /// Keys remembered.
    pub keys: usize,
}

/// The inbox of a running service: cheap to clone.
#[derive(Clone)]
pub struct Inbox {
    ops: std_mpsc::Sender<Op>,
    status: Arc<Mutex<InboxStatus>>,
    /// Turns true when the writer thread ended (its last handle dropped,
    /// or a panic).
    writer_ended: tokio::sync::watch::Receiver<bool>,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox").finish_non_exhaustive()
    }
}

/// The events a service finds pending when it opens its inbox.
pub type Recovered = Vec<Stored>;

impl Inbox {
    /// Opens (or creates) the inbox at `path`, starts its writer, and
    /// returns the events still pending; events stored from now on are also
    /// sent to `stored` once durable, in order.
    pub fn open(
        path: &Path,
        options: InboxOptions,
        stored: mpsc::UnboundedSender<Stored>,
    ) -> Result<(Self, Recovered), InboxError> {
        let io = |source| InboxError::Io { path: path.to_owned(), source };
        if let Some(dir) = path.parent() {
            fs::DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir).map_err(io)?;
        }
        // One writer per inbox, across processes: a second service on the
        // same project would interleave records and run events twice.
        let lock_path = lock_path(path);
        let mut lock =
            private_file().create(true).truncate(false).read(true).write(true).open(&lock_path).map_err(io)?;
        // A writer of this process that is just ending (its last handle
        // dropped) lets go within moments: wait a little before refusing.
        let mut tries = 0;
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if tries < LOCK_TRIES => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    let holder = fs::read_to_string(&lock_path).unwrap_or_default();
                    let holder =
                        if holder.trim().is_empty() { "a process".to_owned() } else { holder.trim().to_owned() };
                    return Err(InboxError::Busy { path: path.to_owned(), holder });
                }
                Err(std::fs::TryLockError::Error(error)) => return Err(io(error)),
            }
        }
        lock.set_len(0).map_err(io)?;
        lock.write_all(format!("pid {}", std::process::id()).as_bytes()).map_err(io)?;
        let (mut folded, replayed) = read_file(path)?;
        // Created if missing (its directory synced); a torn last record (a
        // crash in the middle of a write) is cut off.
        let mut journal = Journal::open::<Record>(path).map_err(journal_error)?;
        journal.cut_torn_tail(&replayed).map_err(journal_error)?;
        folded.expire(&options, now_ms());
        if folded.records > options.compact_min_records.min(1000) && folded.records > folded.live_records() * 3 / 2 {
            rewrite(&mut journal, &mut folded).map_err(journal_error)?;
        }
        let recovered: Recovered = folded.pending.values().cloned().collect();
        let status = Arc::new(Mutex::new(InboxStatus::default()));
        let (ops, receiver) = std_mpsc::channel();
        let writer = Writer {
            path: path.to_owned(),
            journal,
            folded,
            options,
            stored,
            status: Arc::clone(&status),
            _lock: lock,
        };
        writer.publish();
        let (ended_tx, writer_ended) = tokio::sync::watch::channel(false);
        std::thread::Builder::new()
            .name("goondan-inbox".to_owned())
            .spawn(move || {
                // Set however the thread ends, a panic's unwinding included.
                let _ended = SetOnDrop(ended_tx);
                writer.run(receiver);
            })
            .map_err(io)?;
        Ok((Self { ops, status, writer_ended }, recovered))
    }

    /// Stores `deliveries` of `connection` (routed, as entries), all or
    /// none; answers once they are durable.
    pub async fn store(
        &self,
        connection: &str,
        items: Vec<(Option<String>, Entry)>,
    ) -> Result<Vec<StoreResult>, SinkError> {
        let (reply, answer) = oneshot::channel();
        self.ops.send(Op::Store { connection: connection.to_owned(), items, reply }).map_err(|_| SinkError::Closed)?;
        answer.await.map_err(|_| SinkError::Closed)?
    }

    /// Records that a turn of `seq` starts (not waited for: it is synced
    /// with the next write).
    pub fn started(&self, seq: u64) {
        let _ = self.ops.send(Op::Start { seq });
    }

    /// Records that the turn of `seq` just started could not run and waits
    /// for the next start: it does not count as an attempt (not waited for).
    pub fn held(&self, seq: u64) {
        let _ = self.ops.send(Op::Held { seq });
    }

    /// Notes that the turn of `seq` could not be saved (`failures` times so
    /// far, the last because of `reason`) and runs again once writes work
    /// (not waited for: with a full disk it may not be written either).
    pub fn retrying(&self, seq: u64, failures: u32, reason: &str) {
        let _ = self.ops.send(Op::Retry { seq, failures, reason: reason.to_owned() });
    }

    /// Records how the turn of `seq` ended; returns once that is durable.
    pub async fn done(&self, seq: u64, outcome: Outcome) -> Result<(), SinkError> {
        let (reply, answer) = oneshot::channel();
        self.ops.send(Op::Done { seq, outcome, reply: Some(reply) }).map_err(|_| SinkError::Closed)?;
        answer.await.map_err(|_| SinkError::Closed)?
    }

    /// Notes that an event of `connection` matched no ingress rule and was
    /// dropped (for `gdn logs`; not waited for).
    pub fn dropped(&self, connection: &str, event: &str, instance_key: &str) {
        let _ = self.ops.send(Op::Dropped {
            connection: connection.to_owned(),
            event: event.to_owned(),
            instance_key: instance_key.to_owned(),
        });
    }

    /// Returns once everything recorded before (turn starts included) is
    /// on disk.
    pub async fn sync(&self) -> Result<(), SinkError> {
        let (reply, answer) = oneshot::channel();
        self.ops.send(Op::Sync { reply }).map_err(|_| SinkError::Closed)?;
        answer.await.map_err(|_| SinkError::Closed)?
    }

    /// Refuses every later store ([`SinkError::Closed`]); turns still
    /// record their ends.
    pub fn close(&self) {
        let _ = self.ops.send(Op::Close);
    }

    /// Returns when the writer thread has ended: every later store fails.
    /// Only a panic ends it while a handle of the inbox lives, so a
    /// service takes this as fatal.
    pub async fn writer_ended(&self) {
        let mut ended = self.writer_ended.clone();
        let _ = ended.wait_for(|ended| *ended).await;
    }

    /// What waits now.
    pub fn status(&self) -> InboxStatus {
        self.status.lock_unpoisoned().clone()
    }

    /// The pending events of the inbox at `path`, read without opening it
    /// for writing (`gdn instance list`).
    pub fn read_pending(path: &Path) -> Result<Recovered, InboxError> {
        Ok(read_file_readonly(path)?.pending.into_values().collect())
    }
}

/// Sends `true` when dropped.
struct SetOnDrop(tokio::sync::watch::Sender<bool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

/// Folds the inbox at `path` without writing it (a service may own it).
fn read_file_readonly(path: &Path) -> Result<Folded, InboxError> {
    read_file(path).map(|(folded, _)| folded)
}

struct Writer {
    /// Held (locked) while the writer lives.
    _lock: File,
    path: PathBuf,
    /// The file: a failed write is cut back, a torn one cut before the next.
    journal: Journal,
    folded: Folded,
    options: InboxOptions,
    stored: mpsc::UnboundedSender<Stored>,
    status: Arc<Mutex<InboxStatus>>,
}

/// The most requests one group commit takes.
const MAX_BATCH: usize = 4096;

impl Writer {
    fn run(mut self, receiver: std_mpsc::Receiver<Op>) {
        let mut closed = false;
        while let Ok(first) = receiver.recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match receiver.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            self.commit(batch, &mut closed);
            self.maybe_compact();
        }
    }

    fn publish(&self) {
        let pending = self.folded.by_instance.clone();
        let mut status = self.status.lock_unpoisoned();
        *status = InboxStatus { pending, keys: self.folded.keys.len() };
    }

    fn commit(&mut self, batch: Vec<Op>, closed: &mut bool) {
        let at = now_ms();
        let mut lines = Vec::new();
        let mut new_keys: Vec<String> = Vec::new();
        let mut new_stored: Vec<Stored> = Vec::new();
        let mut store_replies = Vec::new();
        let mut done_replies = Vec::new();
        let mut applied: Vec<Record> = Vec::new();
        for op in batch {
            match op {
                Op::Close => *closed = true,
                Op::Store { reply, .. } if *closed => {
                    let _ = reply.send(Err(SinkError::Closed));
                }
                Op::Store { connection, items, reply } => {
                    let mut results = Vec::with_capacity(items.len());
                    for (key, entry) in items {
                        let key = match key {
                            Some(key) => format!("{connection}/{key}"),
                            None => format!("{connection}/~{}", goondan_core::ids::new_id()),
                        };
                        if self.folded.keys.contains_key(&key) {
                            results.push(StoreResult::Duplicate);
                            continue;
                        }
                        let seq = self.folded.next_seq;
                        self.folded.next_seq += 1;
                        self.folded.keys.insert(key.clone(), at);
                        new_keys.push(key.clone());
                        let stored = Stored {
                            seq,
                            key: key.clone(),
                            accepted_at: at,
                            attempts: 0,
                            retrying: None,
                            entry: entry.clone(),
                        };
                        let record = Record::Accept { seq, key, at, entry: Box::new(entry) };
                        push_line(&mut lines, &record);
                        applied.push(record);
                        new_stored.push(stored.clone());
                        results.push(StoreResult::Stored(Box::new(stored)));
                    }
                    store_replies.push((reply, results));
                }
                Op::Start { seq } => {
                    let record = Record::Start { seq, at };
                    push_line(&mut lines, &record);
                    applied.push(record);
                }
                Op::Held { seq } => {
                    let record = Record::Held { seq, at };
                    push_line(&mut lines, &record);
                    applied.push(record);
                }
                Op::Retry { seq, failures, reason } => {
                    let record = Record::Retry { seq, at, failures, reason };
                    push_line(&mut lines, &record);
                    applied.push(record);
                }
                Op::Sync { reply } => done_replies.push(reply),
                Op::Dropped { connection, event, instance_key } => {
                    let record = Record::Dropped { at, connection, event, instance_key };
                    push_line(&mut lines, &record);
                    applied.push(record);
                }
                Op::Done { seq, outcome, reply } => {
                    let record = Record::Done { seq, at, outcome };
                    push_line(&mut lines, &record);
                    applied.push(record);
                    if let Some(reply) = reply {
                        done_replies.push(reply);
                    }
                }
            }
        }
        let points = fault_points(&applied);
        // One write and one sync for the batch; the fault points are passed
        // before it and, once it is durable, after it.
        let written = if lines.is_empty() { Ok(()) } else { self.journal.append(&lines, &points) };
        match written {
            Ok(()) => {
                for key in new_keys {
                    self.folded.keys.remove(&key);
                }
                for record in applied {
                    self.folded.apply(record);
                }
                // Before anyone hears of it, so a status read after an
                // answer includes it.
                self.publish();
                for stored in new_stored {
                    let _ = self.stored.send(stored);
                }
                for (reply, results) in store_replies {
                    let _ = reply.send(Ok(results));
                }
                for reply in done_replies {
                    let _ = reply.send(Ok(()));
                }
            }
            Err(error) => {
                // The cause alone, as the senders are told it.
                let error = error.io_source().map_or_else(|| error.to_string(), ToString::to_string);
                tracing::error!(path = %self.path.display(), %error, "inbox: a write failed; nothing of it was acknowledged");
                for key in new_keys {
                    self.folded.keys.remove(&key);
                }
                for (reply, _) in store_replies {
                    let _ = reply.send(Err(SinkError::Storage(error.clone())));
                }
                for reply in done_replies {
                    let _ = reply.send(Err(SinkError::Storage(error.clone())));
                }
            }
        }
    }

    fn maybe_compact(&mut self) {
        if self.folded.records < self.options.compact_min_records {
            return;
        }
        self.folded.expire(&self.options, now_ms());
        if self.folded.records <= self.folded.live_records() * 3 / 2 {
            return;
        }
        match rewrite(&mut self.journal, &mut self.folded) {
            Ok(()) => {}
            Err(error) => {
                tracing::warn!(path = %self.path.display(), %error, "inbox: rewriting failed; the log keeps growing")
            }
        }
    }
}

/// The fault points (tests only) of a batch's records.
fn fault_points(records: &[Record]) -> Vec<goondan_core::fault::Point> {
    use goondan_core::fault::Point;
    let mut points = Vec::new();
    for record in records {
        let point = match record {
            Record::Accept { .. } => Point::InboxAccept,
            Record::Start { .. } => Point::InboxStart,
            Record::Done { .. } => Point::InboxDone,
            _ => continue,
        };
        if !points.contains(&point) {
            points.push(point);
        }
    }
    points
}

fn push_line(lines: &mut Vec<u8>, record: &Record) {
    if serde_json::to_writer(&mut *lines, record).is_ok() {
        lines.push(b'\n');
    }
}

/// Turns a connector's deliveries into inbox items (unkeyed stay unkeyed).
pub fn items_of(deliveries: Vec<(Delivery, Route)>, connection: &str, connector: &str) -> Vec<(Option<String>, Entry)> {
    deliveries
        .into_iter()
        .map(|(delivery, route)| (delivery.key, Entry::new(connection, connector, route, delivery.event)))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;
    use crate::event::EventMessage;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).map(|meta| meta.permissions().mode() & 0o7777).unwrap_or(0)
    }

    fn entry(text: &str) -> Entry {
        let event = ConnectorEvent {
            name: "message".into(),
            message: EventMessage::text(text),
            properties: BTreeMap::new(),
            instance_key: "k".into(),
        };
        Entry::new("conn", "cli", Route { agent: "a".into(), instance_key: "k".into() }, event)
    }

    #[tokio::test]
    async fn the_inbox_files_are_the_users_only_whatever_the_umask() -> Result<(), Box<dyn std::error::Error>> {
        let temp = tempfile::tempdir()?;
        let dir = temp.path().join("ingress");
        let path = dir.join(INBOX_FILE);
        let (tx, _rx) = mpsc::unbounded_channel();
        let (inbox, _) = Inbox::open(&path, InboxOptions::default(), tx)?;
        let stored = inbox.store("conn", vec![(None, entry("one")), (None, entry("two"))]).await?;
        for result in &stored {
            if let StoreResult::Stored(stored) = result {
                inbox.done(stored.seq, Outcome::Answered).await?;
            }
        }
        drop(inbox);
        assert_eq!(mode(&dir), DIR_MODE);
        assert_eq!(mode(&path), FILE_MODE);
        assert_eq!(mode(&lock_path(&path)), FILE_MODE);
        // Reopened with compaction due: the rewritten file is private too.
        let (tx, _rx) = mpsc::unbounded_channel();
        let options = InboxOptions { compact_min_records: 0, ..InboxOptions::default() };
        let (inbox, _) = Inbox::open(&path, options, tx)?;
        inbox.sync().await?;
        drop(inbox);
        assert_eq!(mode(&path), FILE_MODE);
        Ok(())
    }
}
