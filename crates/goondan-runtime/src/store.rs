//! Durable conversations: the state root and one directory per instance.
//!
//! ```text
//! <state root>/                     --state-root, else GOONDAN_STATE_ROOT, else ~/.goondan
//!   instances/
//!     <instance dir>/               the instance key, percent-encoded (see below)
//!       instance.json               metadata; replaced atomically (temp file + fsync + rename)
//!       messages.jsonl              the conversation as a log of message events, one commit per line
//!       events.jsonl                the event log: one runtime event per line, append-only
//!       extensions/<name>.json      each extension's state (see crate::extension_state)
//! ```
//!
//! The message log is the conversation's [`MessageEvent`]s, folded on load
//! ([`InstanceStore::load`]). Each line is one commit: a plain
//! `goondan_core::Message` when the commit appended exactly one message
//! (and in logs written before message events existed, where every line is
//! one), otherwise `{"events": [MessageEvent, ...]}`. Why a log of events
//! and not a file rewritten per change: a step costs one append of its own
//! lines and one fsync, whatever the conversation's length; edits by
//! extensions (`replace`, `remove`, `truncate`) are recorded the same way;
//! and when dead records pile up the runtime rewrites the file from the
//! folded state ([`InstanceStore::rewrite`]: temp file, fsync, rename), so
//! the log never grows without bound.
//!
//! Durability:
//! - [`InstanceStore::append_events`] writes one commit as one line with a
//!   single `write_all`, then syncs the file before returning. The runtime
//!   commits at step boundaries, so a step whose commit returned survives a
//!   crash, and a commit is all or nothing: a crash leaves the log at a
//!   state the process had.
//! - A crash in the middle of a write can leave a torn last line. Loading
//!   skips it with a warning and reports it in [`LoadedConversation`]; it
//!   is never fatal. Before the first append of a store, and when an event
//!   writer is opened, the torn tail is cut off (the file is truncated to
//!   the end of its last complete line) so new lines never glue onto
//!   garbage.
//! - A skipped line, a log of an earlier version or a hand edit can leave a
//!   tool call without its result, or a result without its call, anywhere
//!   in the history. Loading keeps every readable line, then repairs the
//!   folded conversation by the rule of `goondan_core::conversation`
//!   (orphan results removed, calls unanswered at the end answered with
//!   `E_TOOL_INTERRUPTED`, calls unanswered elsewhere dropped) with a
//!   warning saying what was repaired ([`LoadedConversation::repairs`]). The
//!   repairs are uncommitted events of the loaded state; the runtime saves
//!   them before its next turn.
//!
//! Instance keys are user-chosen strings (`user:42/chat`). The directory name
//! keeps `[A-Za-z0-9._-]` and percent-encodes every other byte of the key's
//! UTF-8 (`user%3A42%2Fchat`), so it never contains a path separator; the keys
//! `""`, `"."` and `".."` and keys whose encoding exceeds 255 bytes are
//! refused. The encoding is reversible ([`instance_key_from_dir_name`]), and
//! instance.json holds the real key, checked on open and delete so that two
//! keys can never share a directory (say, on a case-insensitive file system).
//!
//! One process at a time may write an instance; the store takes no lock.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use goondan_core::message::now_millis;
use goondan_core::{ConversationState, Message, MessageEvent, RepairReport};
use serde::{Deserialize, Serialize};

/// The `tracing` target of the store's warnings.
const LOG_TARGET: &str = "goondan::store";

/// The longest directory name most file systems accept, in bytes.
const MAX_DIR_NAME_BYTES: usize = 255;

/// A failure of the store; every variant says what was being done and where.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Neither `--state-root`, `GOONDAN_STATE_ROOT` nor a home directory is known.
    #[error(
        "resolving the state root: no --state-root option, no GOONDAN_STATE_ROOT and no home directory; \
         pass --state-root PATH"
    )]
    NoStateRoot,
    /// The instance key cannot name a directory.
    #[error("storing instance {key:?} under {path}: {reason}")]
    InvalidKey {
        /// The refused key.
        key: String,
        /// The directory that holds the instances.
        path: PathBuf,
        /// Why the key is refused.
        reason: &'static str,
    },
    /// A file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done, e.g. `appending to`.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Another process is running the instance.
    #[error(
        "instance {key:?} is in use by another process (lock {path}); wait for it to finish or use another --instance-key"
    )]
    Busy {
        /// The instance key.
        key: String,
        /// The lock file.
        path: PathBuf,
    },
    /// A file's JSON could not be read or written.
    #[error("{op} {path}: {source}")]
    Json {
        /// What was being done, e.g. `reading instance metadata from`.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The store's lock was poisoned by a panic while saving.
    #[error("the conversation store is unavailable: an earlier save panicked")]
    Poisoned,
    /// The background task that saves could not run.
    #[error("saving the conversation: the background writer failed: {0}")]
    Background(String),
    /// The instance directory holds another instance (its instance.json names another key).
    #[error("opening instance {expected:?}: {path} belongs to instance {found:?}")]
    KeyMismatch {
        /// The instance.json that was read.
        path: PathBuf,
        /// The key asked for.
        expected: String,
        /// The key instance.json holds.
        found: String,
    },
}

impl StoreError {
    fn io(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Self {
        move |source| Self::Io { op, path: path.to_path_buf(), source }
    }

    fn json(op: &'static str, path: &Path) -> impl FnOnce(serde_json::Error) -> Self {
        move |source| Self::Json { op, path: path.to_path_buf(), source }
    }
}

/// The directory that holds all instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRoot {
    path: PathBuf,
}

impl StateRoot {
    /// The environment variable that names the state root.
    pub const ENV_VAR: &'static str = "GOONDAN_STATE_ROOT";
    /// The state root's directory under the home directory.
    pub const HOME_DIR_NAME: &'static str = ".goondan";
    /// The directory under the state root that holds one directory per instance.
    pub const INSTANCES_DIR_NAME: &'static str = "instances";

    /// A state root at `path` (nothing is created until an instance is opened).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The state root: the `--state-root` option (`cli`), else the value of
    /// `GOONDAN_STATE_ROOT` (`env_state_root`), else `~/.goondan` under
    /// `home`. Empty values count as absent. A pure function: the caller reads
    /// the environment.
    pub fn resolve(
        cli: Option<PathBuf>,
        env_state_root: Option<String>,
        home: Option<PathBuf>,
    ) -> Result<Self, StoreError> {
        if let Some(path) = cli.filter(|path| !path.as_os_str().is_empty()) {
            return Ok(Self::new(path));
        }
        if let Some(path) = env_state_root.filter(|path| !path.is_empty()) {
            return Ok(Self::new(path));
        }
        match home.filter(|home| !home.as_os_str().is_empty()) {
            Some(home) => Ok(Self::new(home.join(Self::HOME_DIR_NAME))),
            None => Err(StoreError::NoStateRoot),
        }
    }

    /// The state root directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `<root>/instances`.
    pub fn instances_dir(&self) -> PathBuf {
        self.path.join(Self::INSTANCES_DIR_NAME)
    }

    /// The directory of the instance `key` (which need not exist), or
    /// [`StoreError::InvalidKey`] for a key that cannot name one.
    pub fn instance_dir(&self, key: &str) -> Result<PathBuf, StoreError> {
        let instances = self.instances_dir();
        match encode_key(key) {
            Ok(name) => Ok(instances.join(name)),
            Err(reason) => Err(StoreError::InvalidKey { key: key.to_owned(), path: instances, reason }),
        }
    }
}

/// The directory name of the instance `key`, or `None` if the key is refused
/// (empty, `.`, `..`, or longer than 255 bytes once encoded).
pub fn instance_dir_name(key: &str) -> Option<String> {
    encode_key(key).ok()
}

/// The instance key a directory name encodes, or `None` if `name` is not the
/// encoding of any key (the inverse of [`instance_dir_name`]).
pub fn instance_key_from_dir_name(name: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(name.len());
    let mut rest = name.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == b'%' {
            let (&high, tail) = tail.split_first()?;
            let (&low, tail) = tail.split_first()?;
            bytes.push(hex_value(high)? << 4 | hex_value(low)?);
            rest = tail;
        } else {
            bytes.push(byte);
            rest = tail;
        }
    }
    let key = String::from_utf8(bytes).ok()?;
    // Only the canonical encoding (upper-case hex, safe bytes kept) maps back.
    (encode_key(&key).ok()? == name).then_some(key)
}

fn is_kept(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-')
}

fn encode_key(key: &str) -> Result<String, &'static str> {
    encode_name(key, MAX_DIR_NAME_BYTES).map_err(|refusal| match refusal {
        NameRefusal::Empty => "an instance key must not be empty",
        NameRefusal::Dots => "the instance keys `.` and `..` would name directories outside the instance",
        NameRefusal::TooLong => "the instance key is too long (its directory name would exceed 255 bytes)",
    })
}

/// Why [`encode_name`] refused a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameRefusal {
    /// The name is empty.
    Empty,
    /// The name is `.` or `..`, which name existing directories.
    Dots,
    /// The encoded name is longer than allowed.
    TooLong,
}

/// Encodes a user-chosen name as one path component: `[A-Za-z0-9._-]` kept,
/// every other byte of its UTF-8 percent-encoded (upper-case hex), so the
/// result never holds a path separator and is injective. Shared by instance
/// directories and extension state files so both confine names the same way.
pub(crate) fn encode_name(name: &str, max_bytes: usize) -> Result<String, NameRefusal> {
    if name.is_empty() {
        return Err(NameRefusal::Empty);
    }
    if name == "." || name == ".." {
        return Err(NameRefusal::Dots);
    }
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut encoded = String::with_capacity(name.len());
    for &byte in name.as_bytes() {
        if is_kept(byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push('%');
            encoded.push(char::from(HEX[usize::from(byte >> 4)]));
            encoded.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
    if encoded.len() > max_bytes {
        return Err(NameRefusal::TooLong);
    }
    Ok(encoded)
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// Holds an instance for this process; dropping it releases the lock.
#[derive(Debug)]
pub struct InstanceLock {
    _file: File,
}

/// The metadata of an instance (its instance.json).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceInfo {
    /// The instance key as the user gave it.
    pub instance_key: String,
    /// The agent that last opened the instance.
    pub agent_name: String,
    /// The swarm, if the caller set one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swarm_name: Option<String>,
    /// The bundle path that last opened the instance (lossy for non-UTF-8 paths).
    pub bundle: String,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at: u64,
    /// Time of the last append or turn, milliseconds since the Unix epoch.
    pub updated_at: u64,
    /// Turns recorded with [`InstanceStore::record_turn`].
    pub turns: u64,
    /// Messages appended. Informational: after a crash it may differ from the
    /// log by the step that was being written.
    pub messages: u64,
}

/// The messages read from an instance's log, and what was skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadedMessages {
    /// Every message of a complete, parsable line, in order.
    pub messages: Vec<Message>,
    /// The last line was torn (no trailing newline, or not a message) and was skipped.
    pub skipped_torn_tail: bool,
    /// Complete lines before the last that were not messages, skipped.
    pub skipped_corrupt_lines: usize,
}

/// A conversation folded from an instance's message log, and what was skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadedConversation {
    /// The conversation: every readable commit applied in order.
    pub state: ConversationState,
    /// Events read from the log (appends included); the runtime compares it
    /// with the live messages to decide when to rewrite the log.
    pub events_on_disk: usize,
    /// The last line was torn (no trailing newline, or unreadable) and was skipped.
    pub skipped_torn_tail: bool,
    /// Complete lines before the last that could not be read, skipped.
    pub skipped_corrupt_lines: usize,
    /// Events skipped on replay: `replace`/`remove` whose target was not in
    /// the conversation, or one that would have put a second message with an
    /// id into it (see [`ConversationState::replay`]).
    pub skipped_events: usize,
    /// What folding left breaking the conversation rule (a skipped line can
    /// take a call's result or an edit with it) and was repaired. The repairs
    /// are the state's uncommitted events: the runtime's first commit saves
    /// them, so a reload then reaches the same state.
    pub repairs: RepairReport,
}

/// One line of the message log.
#[derive(Deserialize)]
#[serde(untagged)]
enum LogLine {
    Commit { events: Vec<MessageEvent> },
    Message(Message),
}

/// One line of the message log, borrowed for writing.
#[derive(Serialize)]
struct CommitLine<'a> {
    events: &'a [MessageEvent],
}

/// One instance's directory: its message log, event log and metadata.
#[derive(Debug)]
pub struct InstanceStore {
    dir: PathBuf,
    info_path: PathBuf,
    messages_path: PathBuf,
    events_path: PathBuf,
    info: InstanceInfo,
    /// messages.jsonl, opened for reading and appending.
    messages_file: File,
    /// Whether a torn tail of messages.jsonl may still have to be cut before appending.
    tail_unchecked: bool,
}

impl InstanceStore {
    /// The metadata file of an instance directory.
    pub const INFO_FILE: &'static str = "instance.json";
    /// The message log of an instance directory.
    pub const MESSAGES_FILE: &'static str = "messages.jsonl";
    /// The event log of an instance directory.
    pub const EVENTS_FILE: &'static str = "events.jsonl";
    /// The lock file of an instance directory (see [`InstanceStore::lock`]).
    pub const LOCK_FILE: &'static str = "lock";

    /// Opens the instance `instance_key` under `root`, creating its directory,
    /// instance.json and message log if missing.
    ///
    /// An existing instance keeps its times and counters; its agent name and
    /// bundle are updated to these. An instance.json that is not valid JSON is
    /// replaced with a warning (its counters restart); one that names another
    /// key is [`StoreError::KeyMismatch`]. The message log is not modified
    /// here, so [`InstanceStore::messages`] still reports a torn tail; the
    /// first [`InstanceStore::append`] cuts it.
    pub fn open(
        root: &StateRoot,
        instance_key: &str,
        agent_name: &str,
        bundle_path: &Path,
    ) -> Result<Self, StoreError> {
        let dir = root.instance_dir(instance_key)?;
        let created = !dir.is_dir();
        fs::create_dir_all(&dir).map_err(StoreError::io("creating the instance directory", &dir))?;
        if created && let Some(parent) = dir.parent() {
            sync_dir(parent);
        }
        let info_path = dir.join(Self::INFO_FILE);
        let bundle = bundle_path.display().to_string();
        let (info, changed) = match read_info(&info_path) {
            Ok(Some(mut info)) => {
                if info.instance_key != instance_key {
                    return Err(StoreError::KeyMismatch {
                        path: info_path,
                        expected: instance_key.to_owned(),
                        found: info.instance_key,
                    });
                }
                let changed = info.agent_name != agent_name || info.bundle != bundle;
                info.agent_name = agent_name.to_owned();
                info.bundle = bundle;
                (info, changed)
            }
            Ok(None) => (new_info(instance_key, agent_name, bundle), true),
            Err(error @ StoreError::Json { .. }) => {
                tracing::warn!(target: LOG_TARGET, "{error}; writing a new instance.json");
                (new_info(instance_key, agent_name, bundle), true)
            }
            Err(error) => return Err(error),
        };
        let messages_path = dir.join(Self::MESSAGES_FILE);
        let messages_file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&messages_path)
            .map_err(StoreError::io("opening the message log", &messages_path))?;
        let store = Self {
            events_path: dir.join(Self::EVENTS_FILE),
            dir,
            info_path,
            messages_path,
            info,
            messages_file,
            tail_unchecked: true,
        };
        if changed {
            store.write_info()?;
        }
        if created {
            sync_dir(&store.dir);
        }
        Ok(store)
    }

    /// The instance's metadata as last written.
    pub fn info(&self) -> &InstanceInfo {
        &self.info
    }

    /// The instance's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The message log (messages.jsonl).
    pub fn messages_path(&self) -> &Path {
        &self.messages_path
    }

    /// The event log (events.jsonl).
    pub fn events_path(&self) -> &Path {
        &self.events_path
    }

    /// Reads the conversation: every commit of the log applied in order.
    ///
    /// A torn last line — no trailing newline, or unreadable — is skipped
    /// with a warning and reported in
    /// [`LoadedConversation::skipped_torn_tail`]. A line in the middle that
    /// cannot be read is skipped with a warning and counted in
    /// [`LoadedConversation::skipped_corrupt_lines`]: we keep going rather
    /// than lose the rest of the conversation. Blank lines are ignored. Only
    /// I/O failures are errors.
    pub fn load(&self) -> Result<LoadedConversation, StoreError> {
        read_message_log(&self.messages_path)
    }

    /// The messages the log holds, folded but not repaired (what was
    /// written, for inspection); [`InstanceStore::load`] gives the
    /// conversation the runtime uses.
    pub fn messages(&self) -> Result<LoadedMessages, StoreError> {
        let loaded = fold_message_log(&self.messages_path)?;
        Ok(LoadedMessages {
            messages: loaded.state.messages().to_vec(),
            skipped_torn_tail: loaded.skipped_torn_tail,
            skipped_corrupt_lines: loaded.skipped_corrupt_lines,
        })
    }

    /// Appends `messages` as one commit (see [`InstanceStore::append_events`]).
    pub fn append(&mut self, messages: &[Message]) -> Result<(), StoreError> {
        let events: Vec<MessageEvent> =
            messages.iter().map(|message| MessageEvent::Append { message: message.clone() }).collect();
        self.append_events(&events)
    }

    /// Appends one commit — `events` as one line, with one write — then
    /// syncs the log; on return the commit is durable. Then updates
    /// `updatedAt` and `messages` in instance.json.
    ///
    /// The first append cuts a torn tail left by a crash. If the write or the
    /// sync fails, the log is truncated back to where it was (best effort)
    /// and the error returned.
    pub fn append_events(&mut self, events: &[MessageEvent]) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let mut line = Vec::with_capacity(512 * events.len());
        let serialized = match events {
            [MessageEvent::Append { message }] => serde_json::to_writer(&mut line, message),
            _ => serde_json::to_writer(&mut line, &CommitLine { events }),
        };
        serialized.map_err(StoreError::json("serializing a commit for", &self.messages_path))?;
        line.push(b'\n');
        if self.tail_unchecked {
            cut_torn_tail(&mut self.messages_file, &self.messages_path)?;
            self.tail_unchecked = false;
        }
        let path = &self.messages_path;
        let file = &mut self.messages_file;
        let length = file.metadata().map_err(StoreError::io("inspecting", path))?.len();
        let written = file
            .write_all(&line)
            .and_then(|()| file.flush())
            .map_err(StoreError::io("appending to", path))
            .and_then(|()| file.sync_data().map_err(StoreError::io("syncing", path)));
        if let Err(error) = written {
            if let Err(undo) = file.set_len(length).and_then(|()| file.sync_data()) {
                tracing::warn!(target: LOG_TARGET, "truncating {} after a failed append: {undo}", path.display());
                // The next append cuts whatever was left.
                self.tail_unchecked = true;
            }
            return Err(error);
        }
        let appended = events.iter().filter(|event| matches!(event, MessageEvent::Append { .. })).count();
        self.info.messages += u64::try_from(appended).unwrap_or(u64::MAX);
        self.info.updated_at = now_millis();
        self.write_info()
    }

    /// Replaces the log with `messages`, one per line: a temp file beside
    /// it, synced, renamed over it, the directory synced. A crash leaves
    /// either the old log or the new one, which fold to the same conversation.
    pub fn rewrite(&mut self, messages: &[Message]) -> Result<(), StoreError> {
        let path = self.messages_path.clone();
        let mut lines = Vec::with_capacity(512 * messages.len());
        for message in messages {
            serde_json::to_writer(&mut lines, message).map_err(StoreError::json("serializing a message for", &path))?;
            lines.push(b'\n');
        }
        let temp = self.dir.join(format!(".{}.{}.tmp", Self::MESSAGES_FILE, std::process::id()));
        let written = File::create(&temp)
            .and_then(|mut file| {
                file.write_all(&lines)?;
                file.sync_all()
            })
            .map_err(StoreError::io("writing", &temp))
            .and_then(|()| fs::rename(&temp, &path).map_err(StoreError::io("replacing", &path)));
        if let Err(error) = written {
            // Best effort: the temp file is garbage now; the old log stands.
            let _ = fs::remove_file(&temp);
            return Err(error);
        }
        sync_dir(&self.dir);
        // The old handle points at the replaced file.
        self.messages_file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&path)
            .map_err(StoreError::io("opening the message log", &path))?;
        self.tail_unchecked = false;
        self.info.updated_at = now_millis();
        self.write_info()
    }

    /// Counts a completed turn in instance.json (`turns`, `updatedAt`).
    pub fn record_turn(&mut self) -> Result<(), StoreError> {
        self.info.turns += 1;
        self.info.updated_at = now_millis();
        self.write_info()
    }

    /// Sets the swarm name in instance.json (written only if it changed).
    pub fn set_swarm_name(&mut self, swarm_name: Option<&str>) -> Result<(), StoreError> {
        if self.info.swarm_name.as_deref() == swarm_name {
            return Ok(());
        }
        self.info.swarm_name = swarm_name.map(str::to_owned);
        self.write_info()
    }

    /// Takes the instance for this process: an exclusive advisory lock on
    /// `<instance>/lock`, held until the returned guard is dropped (or the
    /// process ends). A second process asking for the same instance gets
    /// [`StoreError::Busy`] instead of interleaving its writes.
    pub fn lock(&self) -> Result<InstanceLock, StoreError> {
        let path = self.dir.join(Self::LOCK_FILE);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(StoreError::io("opening the lock file", &path))?;
        match file.try_lock() {
            Ok(()) => Ok(InstanceLock { _file: file }),
            Err(fs::TryLockError::WouldBlock) => Err(StoreError::Busy { key: self.info.instance_key.clone(), path }),
            Err(fs::TryLockError::Error(error)) => Err(StoreError::io("locking", &path)(error)),
        }
    }

    /// The event log opened for appending, for a
    /// `goondan_tools::JsonLinesEventSink`: its `flush()` also syncs the file
    /// (only when something was written since the last sync). A torn tail
    /// left by a crash is cut first. One writer at a time.
    pub fn event_writer(&self) -> Result<EventLogWriter, StoreError> {
        let path = &self.events_path;
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(StoreError::io("opening the event log", path))?;
        cut_torn_tail(&mut file, path)?;
        Ok(EventLogWriter { file, path: path.clone(), unsynced: false })
    }

    fn write_info(&self) -> Result<(), StoreError> {
        write_info_atomically(&self.dir, &self.info_path, &self.info)
    }
}

/// An append-only event log whose `flush()` syncs the file to disk.
#[derive(Debug)]
pub struct EventLogWriter {
    file: File,
    path: PathBuf,
    unsynced: bool,
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
        let written = self.file.write(bytes).map_err(|error| self.annotate("appending to", error))?;
        if written > 0 {
            self.unsynced = true;
        }
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.unsynced {
            self.file.sync_data().map_err(|error| self.annotate("syncing", error))?;
            self.unsynced = false;
        }
        Ok(())
    }
}

impl Drop for EventLogWriter {
    fn drop(&mut self) {
        if self.unsynced
            && let Err(error) = self.file.sync_data()
        {
            tracing::warn!(target: LOG_TARGET, "syncing {}: {error}", self.path.display());
        }
    }
}

/// The instances under `root`, most recently updated first, read from their
/// instance.json files. Directories without a readable instance.json, or
/// whose name is not the encoding of the key it holds, are skipped with a
/// warning. No instances directory means no instances.
pub fn list_instances(root: &StateRoot) -> Result<Vec<InstanceInfo>, StoreError> {
    let instances = root.instances_dir();
    let entries = match fs::read_dir(&instances) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(StoreError::io("listing", &instances)(error)),
    };
    let mut infos = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => {
                tracing::warn!(target: LOG_TARGET, "listing {}: {error}", instances.display());
                continue;
            }
        };
        if !entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            continue;
        }
        let info_path = entry.path().join(InstanceStore::INFO_FILE);
        match read_info(&info_path) {
            Ok(Some(info)) => {
                if entry.file_name().to_str() == instance_dir_name(&info.instance_key).as_deref() {
                    infos.push(info);
                } else {
                    tracing::warn!(
                        target: LOG_TARGET,
                        "skipping {}: it names instance {:?}, which belongs in another directory",
                        info_path.display(),
                        info.instance_key
                    );
                }
            }
            Ok(None) => {
                tracing::warn!(target: LOG_TARGET, "skipping {}: no {}", entry.path().display(), InstanceStore::INFO_FILE);
            }
            Err(error) => tracing::warn!(target: LOG_TARGET, "skipping an instance: {error}"),
        }
    }
    infos.sort_by(|a, b| b.updated_at.cmp(&a.updated_at).then_with(|| a.instance_key.cmp(&b.instance_key)));
    Ok(infos)
}

/// Deletes the instance `key` (its whole directory). `Ok(false)` if it did
/// not exist. Keys that cannot name an instance directory (`..`) are
/// [`StoreError::InvalidKey`]; a directory whose instance.json names another
/// key is [`StoreError::KeyMismatch`] and is left alone.
pub fn delete_instance(root: &StateRoot, key: &str) -> Result<bool, StoreError> {
    let dir = root.instance_dir(key)?;
    let metadata = match fs::symlink_metadata(&dir) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(StoreError::io("inspecting", &dir)(error)),
    };
    if metadata.is_dir() {
        let info_path = dir.join(InstanceStore::INFO_FILE);
        if let Ok(Some(info)) = read_info(&info_path)
            && info.instance_key != key
        {
            return Err(StoreError::KeyMismatch {
                path: info_path,
                expected: key.to_owned(),
                found: info.instance_key,
            });
        }
        // Never delete an instance a running process holds.
        let lock_path = dir.join(InstanceStore::LOCK_FILE);
        let _held = match File::options().write(true).open(&lock_path) {
            Ok(file) => match file.try_lock() {
                Ok(()) => Some(file),
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(StoreError::Busy { key: key.to_owned(), path: lock_path });
                }
                Err(fs::TryLockError::Error(error)) => return Err(StoreError::io("locking", &lock_path)(error)),
            },
            Err(_) => None,
        };
        fs::remove_dir_all(&dir).map_err(StoreError::io("deleting the instance directory", &dir))?;
    } else {
        fs::remove_file(&dir).map_err(StoreError::io("deleting", &dir))?;
    }
    sync_dir(&root.instances_dir());
    Ok(true)
}

fn new_info(instance_key: &str, agent_name: &str, bundle: String) -> InstanceInfo {
    let now = now_millis();
    InstanceInfo {
        instance_key: instance_key.to_owned(),
        agent_name: agent_name.to_owned(),
        swarm_name: None,
        bundle,
        created_at: now,
        updated_at: now,
        turns: 0,
        messages: 0,
    }
}

/// instance.json, or `None` if it does not exist.
fn read_info(path: &Path) -> Result<Option<InstanceInfo>, StoreError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(StoreError::io("reading instance metadata from", path)(error)),
    };
    serde_json::from_slice(&bytes).map(Some).map_err(StoreError::json("reading instance metadata from", path))
}

/// Replaces `path` with `info`: write a temp file beside it, sync it, rename it over.
fn write_info_atomically(dir: &Path, path: &Path, info: &InstanceInfo) -> Result<(), StoreError> {
    let mut bytes =
        serde_json::to_vec_pretty(info).map_err(StoreError::json("serializing instance metadata for", path))?;
    bytes.push(b'\n');
    let temp = dir.join(format!(".{}.{}.tmp", InstanceStore::INFO_FILE, std::process::id()));
    let written = File::create(&temp)
        .and_then(|mut file| {
            file.write_all(&bytes)?;
            file.sync_all()
        })
        .map_err(StoreError::io("writing", &temp))
        .and_then(|()| fs::rename(&temp, path).map_err(StoreError::io("replacing", path)));
    if written.is_err() {
        // Best effort: the temp file is garbage now.
        let _ = fs::remove_file(&temp);
    }
    written
}

/// Folds the message log at `path` and repairs the result (see
/// [`InstanceStore::load`]) without opening the instance, for readers such
/// as tests and inspection tools.
pub fn read_message_log(path: &Path) -> Result<LoadedConversation, StoreError> {
    let mut loaded = fold_message_log(path)?;
    // Whatever the lines held, the conversation handed out keeps the rule:
    // a provider refuses a call without its result (or a result without its
    // call) on every later request, so one bad line would break the
    // instance for good.
    loaded.repairs = loaded.state.repair();
    if !loaded.repairs.is_empty() {
        tracing::warn!(
            target: LOG_TARGET,
            "{}: the conversation broke the tool call rule and was repaired: {}",
            path.display(),
            loaded.repairs
        );
    }
    Ok(loaded)
}

/// Folds the message log at `path`, skipping unreadable lines, without
/// repairing what the fold gives.
fn fold_message_log(path: &Path) -> Result<LoadedConversation, StoreError> {
    let mut loaded = LoadedConversation::default();
    let file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(loaded),
        Err(error) => return Err(StoreError::io("opening the message log", path)(error)),
    };
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let mut line = Vec::new();
    let mut number = 0_usize;
    let mut events = Vec::new();
    // A complete line that cannot be read: corrupt if more lines follow, the torn tail if not.
    let mut unparsable: Option<(usize, serde_json::Error)> = None;
    loop {
        line.clear();
        let read = reader.read_until(b'\n', &mut line).map_err(StoreError::io("reading", path))?;
        if read == 0 {
            break;
        }
        number += 1;
        if let Some((bad, error)) = unparsable.take() {
            loaded.skipped_corrupt_lines += 1;
            tracing::warn!(target: LOG_TARGET, "{}: skipping line {bad}, which cannot be read: {error}", path.display());
        }
        if line.last() != Some(&b'\n') {
            loaded.skipped_torn_tail = true;
            tracing::warn!(
                target: LOG_TARGET,
                "{}: skipping the torn last line {number} ({read} bytes without a newline), left by an interrupted write",
                path.display()
            );
            break;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<LogLine>(&line) {
            Ok(LogLine::Message(message)) => events.push(MessageEvent::Append { message }),
            Ok(LogLine::Commit { events: commit }) => events.extend(commit),
            Err(error) => unparsable = Some((number, error)),
        }
    }
    if let Some((bad, error)) = unparsable {
        loaded.skipped_torn_tail = true;
        tracing::warn!(
            target: LOG_TARGET,
            "{}: skipping the last line {bad}, which cannot be read (torn by an interrupted write?): {error}",
            path.display()
        );
    }
    loaded.events_on_disk = events.len();
    loaded.skipped_events = loaded.state.replay(events);
    if loaded.skipped_events > 0 {
        tracing::warn!(
            target: LOG_TARGET,
            "{}: skipped {} edit(s) whose target message is not in the conversation",
            path.display(),
            loaded.skipped_events
        );
    }
    Ok(loaded)
}

/// Truncates `file` to the end of its last complete line (or to nothing),
/// syncing it if anything was cut. Returns the number of bytes cut.
fn cut_torn_tail(file: &mut File, path: &Path) -> Result<u64, StoreError> {
    const CHUNK: u64 = 8 * 1024;
    let length = file.metadata().map_err(StoreError::io("inspecting", path))?.len();
    let mut buffer = [0_u8; CHUNK as usize];
    let mut end = length;
    let keep = loop {
        if end == 0 {
            break 0;
        }
        let start = end.saturating_sub(CHUNK);
        let chunk = &mut buffer[..usize::try_from(end - start).unwrap_or(0)];
        file.seek(SeekFrom::Start(start))
            .and_then(|_| file.read_exact(chunk))
            .map_err(StoreError::io("reading the end of", path))?;
        if let Some(newline) = chunk.iter().rposition(|&byte| byte == b'\n') {
            break start + u64::try_from(newline).unwrap_or(0) + 1;
        }
        end = start;
    };
    if keep == length {
        return Ok(0);
    }
    file.set_len(keep).map_err(StoreError::io("cutting the torn last line of", path))?;
    file.sync_data().map_err(StoreError::io("syncing", path))?;
    tracing::warn!(
        target: LOG_TARGET,
        "{}: cut a torn last line ({} bytes) left by an interrupted write",
        path.display(),
        length - keep
    );
    Ok(length - keep)
}

/// Syncs a directory so that entries created, renamed or removed in it
/// survive a crash. Best effort: not every platform can open a directory.
pub(crate) fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Err(error) = File::open(dir).and_then(|dir| dir.sync_all()) {
        tracing::debug!(target: LOG_TARGET, "syncing the directory {}: {error}", dir.display());
    }
    #[cfg(not(unix))]
    let _ = dir;
}
