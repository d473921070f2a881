//! An instance's durable state where any host can load it.
//!
//! The state is the instance's directory under the state root (its
//! conversation commits, event log, `instance.json`, extension state,
//! tasks): the local files stay what the agent process reads and writes,
//! and are the cache. Their changes travel as records on the instance's
//! subject of the state stream: a record lists file operations (append
//! these bytes at this offset; replace the whole file; delete it), so an
//! append-only conversation costs its new lines, not its history.
//!
//! **One place at a time.** A host that is given the instance first
//! *claims* it: it reads every record, writes the files, and appends a
//! claim record with JetStream's expected-last-subject-sequence set to the
//! last record it read. That sequence is its fencing token: every later
//! record it appends expects the sequence of its own previous one, so once
//! another host has claimed the instance (appending after it) the old
//! host's next commit is refused ([`ReplicaError::Fenced`]) and it stops
//! the process. This is the check JetStream KV's revisions are made of,
//! applied to a log rather than one value.
//!
//! A record that would exceed the server's payload limit is split into
//! several, each chained to the one before; a host that dies between them
//! leaves a prefix, which reads back as a file cut short — the store's load
//! repairs a torn last line as after a crash. After many records a claim
//! writes a snapshot and purges what came before it.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use async_nats::jetstream::{self, message::PublishMessage};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures_util::StreamExt as _;
use serde::{Deserialize, Serialize};

/// Files of an instance directory that are not state.
fn is_local_only(relative: &str) -> bool {
    relative == "lock" || relative.ends_with(".tmp") || relative.contains("/.") || relative.starts_with('.')
}

/// Records after which a claim compacts the log into a snapshot.
const COMPACT_AFTER: u64 = 64;
/// Bytes of file data in one operation (before base64).
const CHUNK: usize = 192 * 1024;

/// Why state could not be loaded or committed.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// Another host claimed the instance since this one did.
    #[error("another host has taken over this instance (its state moved on past sequence {0})")]
    Fenced(u64),
    /// The broker could not be used.
    #[error("instance state: {0}")]
    Broker(String),
    /// A local file could not be read or written.
    #[error("instance state {path}: {reason}")]
    Io { path: String, reason: String },
    /// A record could not be read.
    #[error("instance state: a record at sequence {seq} is unreadable: {reason}")]
    Corrupt { seq: u64, reason: String },
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> ReplicaError + '_ {
    move |error| ReplicaError::Io { path: path.display().to_string(), reason: error.to_string() }
}

/// One operation on one file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
enum FileOp {
    /// Write `data` at `at` (the file's length before it).
    Append {
        path: String,
        at: u64,
        data: String,
    },
    /// The whole file is `data` (the first chunk of a larger one; appends follow).
    Replace {
        path: String,
        data: String,
    },
    Delete {
        path: String,
    },
}

/// One record of the log.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    /// `claim`, `sync` or `snapshot`.
    kind: String,
    host: String,
    #[serde(default)]
    files: Vec<FileOp>,
}

/// What a file was when last sent: a file replaced (a new inode) or cut
/// shorter is sent whole, one that grew sends its new bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    inode: u64,
    len: u64,
}

/// An instance's state as claimed by this host.
#[derive(Debug)]
pub struct Replica {
    js: jetstream::Context,
    stream: String,
    subject: String,
    dir: PathBuf,
    host: String,
    token: u64,
    last: u64,
    /// The sequence of the claim before this host's, if any.
    previous_claim: Option<u64>,
    marks: BTreeMap<String, Mark>,
    max_record: usize,
}

impl Replica {
    /// Loads the instance's state from `stream`'s `subject` into `dir` and
    /// claims it for `host`. With no record yet, what `dir` holds is kept
    /// and sent whole by the first [`sync`](Self::sync).
    pub async fn claim(
        js: &jetstream::Context,
        stream: &str,
        subject: &str,
        dir: &Path,
        host: &str,
        max_payload: usize,
    ) -> Result<Self, ReplicaError> {
        let Loaded { files, last, records, previous_claim, .. } = load(js, stream, subject).await?;
        if records > 0 {
            write_dir(dir, &files)?;
        }
        let mut replica = Self {
            js: js.clone(),
            stream: stream.to_owned(),
            subject: subject.to_owned(),
            dir: dir.to_owned(),
            host: host.to_owned(),
            token: 0,
            last,
            previous_claim,
            marks: BTreeMap::new(),
            // Room for headers and the JSON around the operations.
            max_record: max_payload.saturating_sub(16 * 1024).max(64 * 1024),
        };
        replica.publish(&Record { kind: "claim".to_owned(), host: host.to_owned(), files: Vec::new() }).await?;
        replica.token = replica.last;
        if records > 0 {
            replica.marks = scan(dir)?.into_iter().map(|(path, (mark, _))| (path, mark)).collect();
        }
        if records > COMPACT_AFTER {
            replica.compact().await?;
        }
        Ok(replica)
    }

    /// The fencing token: the sequence of this host's claim.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The sequence of the claim before this host's (the holder it took
    /// over from), if there was one.
    pub fn previous_claim(&self) -> Option<u64> {
        self.previous_claim
    }

    /// Sends what changed in the directory since the last sync; nothing
    /// when nothing did. [`ReplicaError::Fenced`] once another host claimed
    /// the instance.
    pub async fn sync(&mut self) -> Result<bool, ReplicaError> {
        let now = scan(&self.dir)?;
        let mut ops = Vec::new();
        for (path, (mark, full)) in &now {
            match self.marks.get(path) {
                Some(old) if old == mark => {}
                Some(old) if old.inode == mark.inode && old.len < mark.len => {
                    let data = read_range(full, old.len, mark.len)?;
                    push_chunks(&mut ops, path, Some(old.len), &data);
                }
                _ => {
                    let data = read_range(full, 0, mark.len)?;
                    push_chunks(&mut ops, path, None, &data);
                }
            }
        }
        for path in self.marks.keys() {
            if !now.contains_key(path) {
                ops.push(FileOp::Delete { path: path.clone() });
            }
        }
        if ops.is_empty() {
            return Ok(false);
        }
        self.publish_ops("sync", ops).await?;
        self.marks = now.into_iter().map(|(path, (mark, _))| (path, mark)).collect();
        Ok(true)
    }

    /// Writes the whole directory as one snapshot and purges what came
    /// before it.
    async fn compact(&mut self) -> Result<(), ReplicaError> {
        let now = scan(&self.dir)?;
        let mut ops = Vec::new();
        for (path, (mark, full)) in &now {
            let data = read_range(full, 0, mark.len)?;
            push_chunks(&mut ops, path, None, &data);
        }
        let first = self.publish_ops("snapshot", ops).await?;
        let stream = self.js.get_stream(&self.stream).await.map_err(|e| ReplicaError::Broker(e.to_string()))?;
        stream
            .purge()
            .filter(self.subject.clone())
            .sequence(first)
            .await
            .map_err(|e| ReplicaError::Broker(e.to_string()))?;
        self.marks = now.into_iter().map(|(path, (mark, _))| (path, mark)).collect();
        Ok(())
    }

    /// Publishes `ops` in as many chained records as the payload limit
    /// needs; the sequence of the first.
    async fn publish_ops(&mut self, kind: &str, ops: Vec<FileOp>) -> Result<u64, ReplicaError> {
        let mut first = None;
        let mut batch: Vec<FileOp> = Vec::new();
        let mut size = 0usize;
        for op in ops {
            let op_size = match &op {
                FileOp::Append { data, path, .. } | FileOp::Replace { data, path } => data.len() + path.len() + 64,
                FileOp::Delete { path } => path.len() + 32,
            };
            if !batch.is_empty() && size + op_size > self.max_record {
                let record =
                    Record { kind: kind.to_owned(), host: self.host.clone(), files: std::mem::take(&mut batch) };
                self.publish(&record).await?;
                first.get_or_insert(self.last);
                size = 0;
            }
            size += op_size;
            batch.push(op);
        }
        if !batch.is_empty() {
            self.publish(&Record { kind: kind.to_owned(), host: self.host.clone(), files: batch }).await?;
            first.get_or_insert(self.last);
        }
        Ok(first.unwrap_or(self.last))
    }

    /// Appends one record after `self.last` (the fence).
    async fn publish(&mut self, record: &Record) -> Result<(), ReplicaError> {
        let payload = serde_json::to_vec(record).map_err(|e| ReplicaError::Broker(e.to_string()))?;
        let publish = PublishMessage::build().payload(payload.into()).expected_last_subject_sequence(self.last);
        let ack = self
            .js
            .send_publish(self.subject.clone(), publish)
            .await
            .map_err(|e| ReplicaError::Broker(e.to_string()))?
            .await;
        match ack {
            Ok(ack) => {
                self.last = ack.sequence;
                Ok(())
            }
            Err(error)
                if matches!(error.kind(), async_nats::jetstream::context::PublishErrorKind::WrongLastSequence) =>
            {
                Err(ReplicaError::Fenced(self.last))
            }
            Err(error) => Err(ReplicaError::Broker(error.to_string())),
        }
    }
}

/// An instance's state as its log has it.
#[derive(Debug, Default)]
struct Loaded {
    /// Its files, by path relative to the instance directory.
    files: BTreeMap<String, Vec<u8>>,
    /// The sequence of its last record (0: none).
    last: u64,
    records: u64,
    /// The sequence of its last claim.
    previous_claim: Option<u64>,
    /// The host of its last claim: where it runs, or last ran.
    holder: Option<String>,
    /// The kind of the last record read.
    last_kind: String,
}

/// Reads every record of `subject` in `stream`, in order, without
/// claiming anything.
async fn load(js: &jetstream::Context, stream: &str, subject: &str) -> Result<Loaded, ReplicaError> {
    let state = js.get_stream(stream).await.map_err(|e| ReplicaError::Broker(e.to_string()))?;
    let mut loaded = Loaded::default();
    load_more(&state, subject, &mut loaded).await?;
    Ok(loaded)
}

/// Reads the records of `subject` after `loaded.last` into it; how many.
async fn load_more(state: &jetstream::stream::Stream, subject: &str, loaded: &mut Loaded) -> Result<u64, ReplicaError> {
    let mut read = 0;
    loop {
        let next = state.raw_message_builder().sequence(loaded.last + 1).next_by_subject(subject).send().await;
        let message = match next {
            Ok(message) => message,
            Err(error)
                if matches!(error.kind(), async_nats::jetstream::stream::RawMessageErrorKind::NoMessageFound) =>
            {
                break;
            }
            Err(error) => return Err(ReplicaError::Broker(error.to_string())),
        };
        let record: Record = serde_json::from_slice(&message.payload)
            .map_err(|e| ReplicaError::Corrupt { seq: message.sequence, reason: e.to_string() })?;
        loaded.take(record, message.sequence)?;
        read += 1;
    }
    Ok(read)
}

impl Loaded {
    /// Applies the record at `seq`, the next one of the log.
    fn take(&mut self, record: Record, seq: u64) -> Result<(), ReplicaError> {
        // A snapshot (its first record) is the whole directory: what came
        // before it no longer counts, whether or not it was purged yet.
        if record.kind == "snapshot" && self.last_kind != "snapshot" {
            self.files.clear();
        }
        apply(&mut self.files, &record.files, seq)?;
        if record.kind == "claim" {
            self.previous_claim = Some(seq);
            self.holder = Some(record.host);
        }
        self.last = seq;
        self.last_kind = record.kind;
        self.records += 1;
        Ok(())
    }
}

/// The subjects of `stream` under `filter` that hold records.
async fn subjects(js: &jetstream::Context, stream: &str, filter: &str) -> Result<Vec<String>, ReplicaError> {
    let broker = |e: &dyn std::fmt::Display| ReplicaError::Broker(e.to_string());
    let state = js.get_stream(stream).await.map_err(|e| broker(&e))?;
    let mut found = state.info_with_subjects(filter).await.map_err(|e| broker(&e))?;
    let mut subjects = Vec::new();
    while let Some(next) = found.next().await {
        let (subject, _count) = next.map_err(|e| broker(&e))?;
        subjects.push(subject);
    }
    subjects.sort();
    Ok(subjects)
}

/// Reads a swarm's instances out of the state stream for commands that
/// only look (`gdn instance list --nats`, `gdn logs --nats`). It keeps
/// what it read: a second [`copy`](Self::copy) reads only the records
/// since, and rewrites only the instances they changed.
#[derive(Debug)]
pub struct StateReader {
    js: jetstream::Context,
    scope: crate::Scope,
    read: BTreeMap<String, Loaded>,
}

impl StateReader {
    /// A reader of `scope`'s state on `client`'s server.
    pub fn new(client: async_nats::Client, scope: crate::Scope) -> Self {
        Self { js: jetstream::new(client), scope, read: BTreeMap::new() }
    }

    /// Copies every instance, as its log has it now, into the directory
    /// `dir_of` names for it (nothing is claimed, so the hosts running
    /// them go on undisturbed); the instances it knows. An instance is
    /// known by the `instance.json` its log holds; one without it is
    /// passed over. A swarm that never ran on this server has none.
    pub async fn copy(
        &mut self,
        dir_of: &dyn Fn(&goondan_ipc::AgentInstance) -> Option<PathBuf>,
    ) -> Result<Vec<CopiedInstance>, ReplicaError> {
        let name = self.scope.state_stream();
        let state = match self.js.get_stream(&name).await {
            Ok(state) => state,
            Err(error)
                if matches!(error.kind(), jetstream::context::GetStreamErrorKind::JetStream(e)
                    if e.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
            {
                return Ok(Vec::new());
            }
            Err(error) => return Err(ReplicaError::Broker(error.to_string())),
        };
        let mut copied = Vec::new();
        for subject in subjects(&self.js, &name, &format!("gdn.{}.state.*", self.scope.token())).await? {
            let loaded = self.read.entry(subject.clone()).or_default();
            let changed = load_more(&state, &subject, loaded).await? > 0;
            let named = loaded.files.get("instance.json").and_then(|bytes| {
                let info: serde_json::Value = serde_json::from_slice(bytes).ok()?;
                let agent = info.get("agentName")?.as_str()?;
                let key = info.get("instanceKey")?.as_str()?;
                Some(goondan_ipc::AgentInstance::new(agent, key))
            });
            let Some(instance) = named else {
                tracing::debug!(target: "goondan::nats", "{subject}: no instance.json; passed over");
                continue;
            };
            // The subject is the instance's: a log that names another is not used.
            if self.scope.state(&instance) != subject {
                tracing::warn!(target: "goondan::nats", "{subject} names {instance}, whose log is elsewhere; passed over");
                continue;
            }
            let Some(dir) = dir_of(&instance) else { continue };
            if changed {
                write_dir(&dir, &loaded.files)?;
            }
            copied.push(CopiedInstance { instance, holder: loaded.holder.clone(), dir });
        }
        Ok(copied)
    }
}

/// One instance of a swarm, copied out of its state log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopiedInstance {
    pub instance: goondan_ipc::AgentInstance,
    /// The host of its last claim.
    pub holder: Option<String>,
    pub dir: PathBuf,
}

/// Splits `data` into operations of at most [`CHUNK`] bytes: a replace
/// (`at` None) then appends, or appends from `at`.
fn push_chunks(ops: &mut Vec<FileOp>, path: &str, at: Option<u64>, data: &[u8]) {
    let mut offset = at;
    if data.is_empty() && offset.is_none() {
        ops.push(FileOp::Replace { path: path.to_owned(), data: String::new() });
        return;
    }
    for chunk in data.chunks(CHUNK) {
        let encoded = BASE64.encode(chunk);
        match offset {
            None => ops.push(FileOp::Replace { path: path.to_owned(), data: encoded }),
            Some(at) => ops.push(FileOp::Append { path: path.to_owned(), at, data: encoded }),
        }
        let done = offset.unwrap_or(0) + chunk.len() as u64;
        offset = Some(done);
    }
}

/// Applies one record's operations to the files being rebuilt.
fn apply(files: &mut BTreeMap<String, Vec<u8>>, ops: &[FileOp], seq: u64) -> Result<(), ReplicaError> {
    let decode = |data: &str| BASE64.decode(data).map_err(|e| ReplicaError::Corrupt { seq, reason: e.to_string() });
    for op in ops {
        match op {
            FileOp::Replace { path, data } => {
                files.insert(path.clone(), decode(data)?);
            }
            FileOp::Append { path, at, data } => {
                let bytes = decode(data)?;
                let file = files.entry(path.clone()).or_default();
                let at = usize::try_from(*at).unwrap_or(usize::MAX);
                if at > file.len() {
                    // Bytes before it were never recorded: nothing honest fills the gap.
                    return Err(ReplicaError::Corrupt {
                        seq,
                        reason: format!("{path} is {} bytes, an append starts at {at}", file.len()),
                    });
                }
                if at < file.len() {
                    // A log cut between two records of one sync: the file
                    // continues where the append says.
                    tracing::warn!(target: "goondan::nats", "state record {seq}: {path} is {} bytes, an append says {at}", file.len());
                    file.truncate(at);
                }
                file.extend_from_slice(&bytes);
            }
            FileOp::Delete { path } => {
                files.remove(path);
            }
        }
    }
    Ok(())
}

/// Makes `dir` hold exactly `files` (the lock and temp files aside).
fn write_dir(dir: &Path, files: &BTreeMap<String, Vec<u8>>) -> Result<(), ReplicaError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    for (path, _) in scan(dir)? {
        if !files.contains_key(&path) {
            let full = dir.join(&path);
            std::fs::remove_file(&full).map_err(io(&full))?;
        }
    }
    for (path, bytes) in files {
        if path.split('/').any(|part| part == ".." || part.is_empty()) || Path::new(path).is_absolute() {
            return Err(ReplicaError::Corrupt { seq: 0, reason: format!("a path outside the instance: {path}") });
        }
        let full = dir.join(path);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let temp = full.with_extension("replica.tmp");
        std::fs::write(&temp, bytes).map_err(io(&temp))?;
        std::fs::rename(&temp, &full).map_err(io(&full))?;
    }
    Ok(())
}

/// Every state file under `dir`: its relative path, mark and full path.
fn scan(dir: &Path) -> Result<BTreeMap<String, (Mark, PathBuf)>, ReplicaError> {
    let mut found = BTreeMap::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(current) = pending.pop() {
        let entries = match std::fs::read_dir(&current) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => return Err(io(&current)(error)),
        };
        for entry in entries {
            let entry = entry.map_err(io(&current))?;
            let path = entry.path();
            let Ok(metadata) = std::fs::symlink_metadata(&path) else { continue };
            if metadata.is_dir() {
                pending.push(path);
                continue;
            }
            if !metadata.is_file() {
                continue;
            }
            let Ok(relative) = path.strip_prefix(dir) else { continue };
            let relative = relative.to_string_lossy().into_owned();
            if is_local_only(&relative) {
                continue;
            }
            found.insert(relative, (Mark { inode: metadata.ino(), len: metadata.len() }, path));
        }
    }
    Ok(found)
}

/// Bytes `from..to` of a file (fewer if it was cut meanwhile).
fn read_range(path: &Path, from: u64, to: u64) -> Result<Vec<u8>, ReplicaError> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut file = std::fs::File::open(path).map_err(io(path))?;
    file.seek(SeekFrom::Start(from)).map_err(io(path))?;
    let mut data = Vec::with_capacity(usize::try_from(to.saturating_sub(from)).unwrap_or(0));
    file.take(to.saturating_sub(from)).read_to_end(&mut data).map_err(io(path))?;
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_rebuild_the_file() {
        let data: Vec<u8> = (0..(CHUNK * 2 + 10)).map(|i| (i % 251) as u8).collect();
        let mut ops = Vec::new();
        push_chunks(&mut ops, "messages.jsonl", None, &data);
        assert_eq!(ops.len(), 3);
        let mut more = Vec::new();
        push_chunks(&mut more, "messages.jsonl", Some(data.len() as u64), b"tail\n");
        let mut files = BTreeMap::new();
        let applied = apply(&mut files, &ops, 1).and_then(|()| apply(&mut files, &more, 2));
        assert!(applied.is_ok());
        let mut expected = data.clone();
        expected.extend_from_slice(b"tail\n");
        assert_eq!(files.get("messages.jsonl"), Some(&expected));
        let deleted = apply(&mut files, &[FileOp::Delete { path: "messages.jsonl".into() }], 3);
        assert!(deleted.is_ok());
        assert!(files.is_empty());
    }

    #[test]
    fn an_append_past_the_end_is_refused_and_one_before_it_continues_there() {
        let mut files = BTreeMap::new();
        files.insert("messages.jsonl".to_owned(), b"one\ntw".to_vec());
        let gap = [FileOp::Append { path: "messages.jsonl".into(), at: 99, data: BASE64.encode(b"x") }];
        assert!(matches!(apply(&mut files, &gap, 7), Err(ReplicaError::Corrupt { seq: 7, .. })));
        let resumed = [FileOp::Append { path: "messages.jsonl".into(), at: 4, data: BASE64.encode(b"two\n") }];
        assert!(apply(&mut files, &resumed, 8).is_ok());
        assert_eq!(files.get("messages.jsonl").map(Vec::as_slice), Some(&b"one\ntwo\n"[..]));
    }

    #[test]
    fn a_snapshot_replaces_what_came_before_it_and_claims_name_the_holder() -> Result<(), ReplicaError> {
        let put = |path: &str, data: &[u8]| FileOp::Replace { path: path.into(), data: BASE64.encode(data) };
        let record =
            |kind: &str, host: &str, files: Vec<FileOp>| Record { kind: kind.into(), host: host.into(), files };
        let mut loaded = Loaded::default();
        loaded.take(record("claim", "h1", vec![]), 1)?;
        loaded.take(record("sync", "h1", vec![put("gone.json", b"1"), put("messages.jsonl", b"a\n")]), 2)?;
        loaded.take(record("claim", "h2", vec![]), 3)?;
        // A snapshot in two chained records, written after gone.json was deleted.
        loaded.take(record("snapshot", "h2", vec![put("messages.jsonl", b"a\n")]), 4)?;
        loaded.take(record("snapshot", "h2", vec![put("instance.json", b"{}")]), 5)?;
        let paths: Vec<&str> = loaded.files.keys().map(String::as_str).collect();
        assert_eq!(paths, ["instance.json", "messages.jsonl"]);
        assert_eq!(loaded.holder.as_deref(), Some("h2"));
        assert_eq!((loaded.last, loaded.records, loaded.previous_claim), (5, 5, Some(3)));
        Ok(())
    }

    #[test]
    fn lock_and_temp_files_stay_local() {
        assert!(is_local_only("lock"));
        assert!(is_local_only("instance.json.tmp"));
        assert!(is_local_only("extensions/.x.json"));
        assert!(!is_local_only("messages.jsonl"));
        assert!(!is_local_only("extensions/counter.json"));
    }

    #[test]
    fn a_record_cannot_write_outside_the_instance() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let mut files = BTreeMap::new();
        files.insert("../escape".to_owned(), b"x".to_vec());
        assert!(write_dir(&dir.path().join("i"), &files).is_err());
        assert!(!dir.path().join("escape").exists());
        Ok(())
    }
}
