//! Durable per-extension state: what an extension's `api.state.get()` and
//! `api.state.set(value)` read and write.
//!
//! ```text
//! <instance dir>/
//!   extensions/                      created on the first write
//!     <extension name>.json          one JSON object, pretty-printed, newline-terminated
//!     <extension name>.json.corrupt-<unix millis>   an unreadable file, moved aside
//! ```
//!
//! As in the original Goondan, the state of an extension is one JSON object
//! per extension per instance, and a `set` whose serialization equals what is
//! stored writes nothing (extensions tend to set their state every turn).
//!
//! Extension names are encoded like instance keys (see [`crate::store`]):
//! `[A-Za-z0-9._-]` kept, every other byte percent-encoded, so a name such as
//! `../x` or `a/b` names a file inside the directory and never outside it;
//! the names `""`, `"."`, `".."` and names whose file name would be too long
//! are refused with [`ExtensionStateError::InvalidName`].
//!
//! Durability: a write goes to a temporary file in the same directory, is
//! synced, renamed over the state file and the directory synced, so a crash
//! leaves either the old state or the new one. A file that is not a JSON
//! object (hand-edited, or written by something else) is never silently
//! dropped: it is renamed aside with a warning and the extension starts over.
//!
//! Each file is read once per store; later reads come from memory. The store
//! therefore assumes that one process at a time writes an instance, which the
//! instance lock already guarantees.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use goondan_core::ids::SpanIdGenerator;
use goondan_core::message::now_millis;
use goondan_core::{JsonObject, JsonValue, PathIoError, json_type_name};
use tokio::sync::Mutex;

use crate::store::{NameRefusal, encode_name, sync_dir};

/// The `tracing` target of the store's warnings.
const LOG_TARGET: &str = "goondan::extension_state";

/// The longest encoded extension name. File names are limited to 255 bytes
/// on most file systems, and the temporary and corrupt-copy names add up to
/// 38 bytes to the encoded name.
const MAX_ENCODED_NAME_BYTES: usize = 200;

/// Why an extension's state could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ExtensionStateError {
    /// The extension name cannot name a state file.
    #[error("extension state of {name:?}: {reason}")]
    InvalidName {
        /// The refused name.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// `set` was given something other than a JSON object.
    #[error("extension state of {extension:?} must be a JSON object, got {got}")]
    NotAnObject {
        /// The extension.
        extension: String,
        /// The JSON type of the value it gave (`array`, `string`, `null`, ...).
        got: &'static str,
    },
    /// The serialized state exceeds [`ExtensionStateStore::MAX_BYTES`].
    #[error("extension state of {extension:?} is larger than the limit of {limit} bytes once serialized")]
    TooLarge {
        /// The extension.
        extension: String,
        /// The limit, in bytes.
        limit: usize,
    },
    /// The state could not be serialized.
    #[error("serializing the state of extension {extension:?}: {source}")]
    Serialize {
        /// The extension.
        extension: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// A file operation failed (`op` says what, e.g. `reading extension
    /// state from`).
    #[error(transparent)]
    Io(#[from] PathIoError),
    /// The background task that does the file work could not finish.
    #[error("extension state of {extension:?}: the background task failed: {message}")]
    Background {
        /// The extension.
        extension: String,
        /// What the task reported (a panic, or the runtime shutting down).
        message: String,
    },
}

impl ExtensionStateError {
    fn io(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Self {
        PathIoError::at(op, path)
    }
}

/// What the store knows of one extension's state.
#[derive(Debug)]
enum Entry {
    /// No state: no file, or a corrupt one that was moved aside.
    Absent,
    /// The state and its serialization (compared by `set` to skip unchanged writes).
    Present { value: JsonObject, serialized: Vec<u8> },
}

/// The cache, behind the store's lock.
#[derive(Debug)]
struct Cache {
    entries: HashMap<String, Entry>,
    /// Random suffixes for temporary file names, so that two stores in one
    /// process (or two processes with the same pid over time) never pick
    /// the same temporary file.
    temp_ids: SpanIdGenerator,
}

/// The state of every extension of one instance.
///
/// Clones share the cache and the lock: clone it (or share it behind an
/// `Arc`) to hand it to each extension. All reads and writes of one store
/// are serialized, so concurrent `set`s never interleave and the last one
/// wins; a write runs to its end even if the future awaiting it is dropped,
/// and the next operation waits for it.
#[derive(Debug, Clone)]
pub struct ExtensionStateStore {
    /// The `extensions` directory, or `None` for a store that keeps nothing.
    dir: Option<Arc<Path>>,
    cache: Arc<Mutex<Cache>>,
}

impl ExtensionStateStore {
    /// The name of the directory under an instance directory that holds the
    /// state files: `ExtensionStateStore::at(instance_dir.join(DIR_NAME))`.
    pub const DIR_NAME: &'static str = "extensions";

    /// The largest serialized state accepted by [`set`](Self::set), in bytes (16 MiB).
    pub const MAX_BYTES: usize = 16 * 1024 * 1024;

    /// A store whose files live in `dir`, the instance's `extensions`
    /// directory. Nothing is touched until the first read; the directory
    /// (with its parents) is created on the first write.
    pub fn at(dir: PathBuf) -> Self {
        Self::with_dir(Some(Arc::from(dir)))
    }

    /// A store that keeps state in memory only, for runs without a state root.
    pub fn in_memory() -> Self {
        Self::with_dir(None)
    }

    fn with_dir(dir: Option<Arc<Path>>) -> Self {
        Self { dir, cache: Arc::new(Mutex::new(Cache { entries: HashMap::new(), temp_ids: SpanIdGenerator::new() })) }
    }

    /// The directory of the state files, or `None` for an in-memory store.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The state file of `extension` (which need not exist), or `None` for an
    /// in-memory store.
    pub fn path_of(&self, extension: &str) -> Result<Option<PathBuf>, ExtensionStateError> {
        let file_name = state_file_name(extension)?;
        Ok(self.dir.as_ref().map(|dir| dir.join(file_name)))
    }

    /// The state of `extension`, or `None` if it has none.
    ///
    /// The file is read on the first call for an extension and cached; later
    /// calls are answered from memory. A file that is not a JSON object is
    /// renamed to `<name>.json.corrupt-<unix millis>` with a warning, and the
    /// extension has no state.
    pub async fn get(&self, extension: &str) -> Result<Option<JsonObject>, ExtensionStateError> {
        let file_name = state_file_name(extension)?;
        let guard = Arc::clone(&self.cache).lock_owned().await;
        if let Some(entry) = guard.entries.get(extension) {
            return Ok(entry_value(entry));
        }
        let Some(dir) = self.dir.clone() else {
            return Ok(None);
        };
        let name = extension.to_owned();
        // The guard moves into the task: the cache is filled even if this
        // future is dropped, and no write can start before the read ends.
        run_blocking(extension, move || {
            let mut guard = guard;
            let entry = read_entry(&dir, &file_name)?;
            let value = entry_value(&entry);
            guard.entries.insert(name, entry);
            Ok(value)
        })
        .await
    }

    /// Replaces the state of `extension` with `value`, which must be a JSON
    /// object whose serialization is at most [`MAX_BYTES`](Self::MAX_BYTES).
    ///
    /// Writes nothing if the serialization equals the stored state's;
    /// otherwise the file is replaced atomically (temporary file, sync,
    /// rename, directory sync) before this returns.
    pub async fn set(&self, extension: &str, value: JsonValue) -> Result<(), ExtensionStateError> {
        let file_name = state_file_name(extension)?;
        let value = match value {
            JsonValue::Object(value) => value,
            other => {
                return Err(ExtensionStateError::NotAnObject {
                    extension: extension.to_owned(),
                    got: json_type_name(&other),
                });
            }
        };
        let guard = Arc::clone(&self.cache).lock_owned().await;
        let dir = self.dir.clone();
        let name = extension.to_owned();
        // Serializing up to 16 MiB and writing it both belong off the async
        // threads. The guard moves into the task so that a write whose caller
        // went away still finishes before the next operation of this store
        // starts: writes never reorder.
        run_blocking(extension, move || {
            let extension = name;
            let mut guard = guard;
            let serialized = serialize_capped(&extension, &value)?;
            let entry = match (&dir, guard.entries.get(&extension)) {
                (_, Some(Entry::Present { serialized: stored, .. })) if *stored == serialized => return Ok(()),
                (Some(dir), None) => match read_entry(dir, &file_name)? {
                    Entry::Present { serialized: stored, .. } if stored == serialized => {
                        guard.entries.insert(extension, Entry::Present { value, serialized });
                        return Ok(());
                    }
                    _ => Entry::Present { value, serialized },
                },
                _ => Entry::Present { value, serialized },
            };
            if let (Some(dir), Entry::Present { serialized, .. }) = (&dir, &entry) {
                let temp_name = format!(".{file_name}.tmp-{}-{}", std::process::id(), guard.temp_ids.next_hex());
                write_atomically(dir, &file_name, &temp_name, serialized)?;
            }
            guard.entries.insert(extension, entry);
            Ok(())
        })
        .await
    }
}

/// Runs `work` on tokio's blocking pool.
async fn run_blocking<T: Send + 'static>(
    extension: &str,
    work: impl FnOnce() -> Result<T, ExtensionStateError> + Send + 'static,
) -> Result<T, ExtensionStateError> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(error) => {
            Err(ExtensionStateError::Background { extension: extension.to_owned(), message: error.to_string() })
        }
    }
}

fn entry_value(entry: &Entry) -> Option<JsonObject> {
    match entry {
        Entry::Absent => None,
        Entry::Present { value, .. } => Some(value.clone()),
    }
}

/// `<encoded name>.json`, or [`ExtensionStateError::InvalidName`].
fn state_file_name(extension: &str) -> Result<String, ExtensionStateError> {
    match encode_name(extension, MAX_ENCODED_NAME_BYTES) {
        Ok(encoded) => Ok(format!("{encoded}.json")),
        Err(refusal) => Err(ExtensionStateError::InvalidName {
            name: extension.to_owned(),
            reason: match refusal {
                NameRefusal::Empty => "an extension name must not be empty",
                NameRefusal::Dots => "the extension names `.` and `..` are refused",
                NameRefusal::TooLong => "the extension name is too long (its file name would exceed 200 bytes)",
            },
        }),
    }
}

/// Reads a state file. A missing file is [`Entry::Absent`]; a file that is
/// not a JSON object is moved aside and is [`Entry::Absent`] too.
fn read_entry(dir: &Path, file_name: &str) -> Result<Entry, ExtensionStateError> {
    let path = dir.join(file_name);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Entry::Absent),
        Err(error) => return Err(ExtensionStateError::io("reading extension state from", &path)(error)),
    };
    let problem = match serde_json::from_slice::<JsonValue>(&bytes) {
        Ok(JsonValue::Object(value)) => match pretty(&value) {
            // The stored form is re-serialized rather than the file's bytes,
            // so that `set` compares like with like.
            Ok(serialized) => return Ok(Entry::Present { value, serialized }),
            Err(error) => error.to_string(),
        },
        Ok(other) => format!("it holds a JSON {}, not an object", json_type_name(&other)),
        Err(error) => format!("it is not valid JSON ({error})"),
    };
    let aside = dir.join(format!("{file_name}.corrupt-{}", now_millis()));
    fs::rename(&path, &aside).map_err(ExtensionStateError::io("moving aside the unreadable extension state", &path))?;
    tracing::warn!(
        target: LOG_TARGET,
        "extension state {} is unreadable: {problem}; moved it to {} and starting with no state",
        path.display(),
        aside.display()
    );
    Ok(Entry::Absent)
}

/// Pretty JSON and a newline, as the original writes state files.
fn pretty(value: &JsonObject) -> Result<Vec<u8>, serde_json::Error> {
    let mut bytes = serde_json::to_vec_pretty(value)?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// [`pretty`], but gives up as soon as the output passes
/// [`ExtensionStateStore::MAX_BYTES`], so an oversized value is never held
/// twice in memory.
fn serialize_capped(extension: &str, value: &JsonObject) -> Result<Vec<u8>, ExtensionStateError> {
    let mut writer = CappedWriter { bytes: Vec::new(), exceeded: false };
    let written = serde_json::to_writer_pretty(&mut writer, value)
        .and_then(|()| writer.write_all(b"\n").map_err(serde_json::Error::io));
    match written {
        Ok(()) => Ok(writer.bytes),
        Err(_) if writer.exceeded => Err(ExtensionStateError::TooLarge {
            extension: extension.to_owned(),
            limit: ExtensionStateStore::MAX_BYTES,
        }),
        Err(source) => Err(ExtensionStateError::Serialize { extension: extension.to_owned(), source }),
    }
}

/// A `Vec` that refuses to grow past [`ExtensionStateStore::MAX_BYTES`].
struct CappedWriter {
    bytes: Vec<u8>,
    exceeded: bool,
}

impl Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.bytes.len().saturating_add(buf.len()) > ExtensionStateStore::MAX_BYTES {
            self.exceeded = true;
            return Err(io::Error::other("the extension state exceeds its size limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Replaces `dir/file_name` with `bytes`: a new temporary file beside it,
/// synced, renamed over it, then the directory synced (best effort).
fn write_atomically(dir: &Path, file_name: &str, temp_name: &str, bytes: &[u8]) -> Result<(), ExtensionStateError> {
    crate::store::create_private_dir_all(dir)
        .map_err(ExtensionStateError::io("creating the extension state directory", dir))?;
    let path = dir.join(file_name);
    let temp = dir.join(temp_name);
    let written = crate::store::private_file()
        // create_new: never write through a file (or link) someone left at this name.
        .write(true)
        .create_new(true)
        .open(&temp)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        })
        .map_err(ExtensionStateError::io("writing extension state to", &temp))
        .and_then(|()| fs::rename(&temp, &path).map_err(ExtensionStateError::io("replacing extension state", &path)));
    if let Err(error) = written {
        // Best effort: the temp file is garbage now; the old state stands.
        let _ = fs::remove_file(&temp);
        return Err(error);
    }
    sync_dir(dir);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: JsonValue) -> JsonObject {
        match value {
            JsonValue::Object(object) => object,
            other => panic!("not an object: {other}"),
        }
    }

    fn temp_dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"))
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = match fs::read_dir(dir) {
            Ok(read) => {
                read.filter_map(|entry| entry.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect()
            }
            Err(_) => Vec::new(),
        };
        names.sort();
        names
    }

    #[test]
    fn the_store_is_send_sync_and_cheap_to_clone() {
        fn assert_send_sync<T: Send + Sync + Clone>() {}
        assert_send_sync::<ExtensionStateStore>();
    }

    #[tokio::test]
    async fn set_then_get_round_trips_and_writes_pretty_json_with_a_newline() {
        let root = temp_dir();
        let dir = root.path().join("instances/assistant@i/extensions");
        let store = ExtensionStateStore::at(dir.clone());
        assert_eq!(store.get("counter").await.ok(), Some(None));
        assert!(!dir.exists(), "a read must not create the directory");

        let state = json!({"count": 2, "nested": {"a": [1, 2]}});
        store.set("counter", state.clone()).await.unwrap_or_else(|e| panic!("set: {e}"));
        assert_eq!(store.get("counter").await.ok(), Some(Some(object(state.clone()))));

        let text = fs::read_to_string(dir.join("counter.json")).unwrap_or_else(|e| panic!("read: {e}"));
        let expected = serde_json::to_string_pretty(&state).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(text, format!("{expected}\n"));
        assert_eq!(entries(&dir), vec!["counter.json"], "no temporary file is left behind");
    }

    #[tokio::test]
    async fn non_objects_are_refused_naming_their_type() {
        let store = ExtensionStateStore::in_memory();
        for (value, got) in
            [(json!([1]), "array"), (json!("x"), "string"), (json!(null), "null"), (json!(1.5), "number")]
        {
            match store.set("ext", value).await {
                Err(error @ ExtensionStateError::NotAnObject { .. }) => {
                    let message = error.to_string();
                    assert!(message.contains("must be a JSON object"), "{message}");
                    assert!(message.contains(got), "{message}");
                }
                other => panic!("expected NotAnObject, got {other:?}"),
            }
        }
        assert_eq!(store.get("ext").await.ok(), Some(None));
    }

    #[tokio::test]
    async fn oversized_state_is_refused_and_nothing_is_written() {
        let root = temp_dir();
        let store = ExtensionStateStore::at(root.path().to_path_buf());
        let big = "x".repeat(ExtensionStateStore::MAX_BYTES);
        match store.set("big", json!({ "blob": big })).await {
            Err(ExtensionStateError::TooLarge { limit, .. }) => assert_eq!(limit, ExtensionStateStore::MAX_BYTES),
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert!(entries(root.path()).is_empty());
        assert_eq!(store.get("big").await.ok(), Some(None));
    }

    #[tokio::test]
    async fn an_unchanged_value_is_not_rewritten() {
        let root = temp_dir();
        let store = ExtensionStateStore::at(root.path().to_path_buf());
        store.set("ext", json!({"a": 1})).await.unwrap_or_else(|e| panic!("set: {e}"));
        let path = root.path().join("ext.json");
        // Replace the file behind the store's back with the same content but
        // another inode: a rewrite would replace it again.
        fs::remove_file(&path).unwrap_or_else(|e| panic!("{e}"));
        fs::write(&path, "{\n  \"a\": 1\n}\n").unwrap_or_else(|e| panic!("{e}"));
        let marker = fs::metadata(&path).unwrap_or_else(|e| panic!("{e}"));
        store.set("ext", json!({"a": 1})).await.unwrap_or_else(|e| panic!("set: {e}"));
        let after = fs::metadata(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(marker.modified().ok(), after.modified().ok());
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            assert_eq!(marker.ino(), after.ino(), "the file was replaced");
        }
        store.set("ext", json!({"a": 2})).await.unwrap_or_else(|e| panic!("set: {e}"));
        assert_eq!(fs::read_to_string(&path).ok().as_deref(), Some("{\n  \"a\": 2\n}\n"));
    }

    #[tokio::test]
    async fn a_first_set_equal_to_the_file_does_not_rewrite_it() {
        let root = temp_dir();
        let path = root.path().join("ext.json");
        fs::write(&path, "{\"a\": 1}").unwrap_or_else(|e| panic!("{e}"));
        let store = ExtensionStateStore::at(root.path().to_path_buf());
        store.set("ext", json!({"a": 1})).await.unwrap_or_else(|e| panic!("set: {e}"));
        // The file keeps its original (compact) formatting: it was not rewritten.
        assert_eq!(fs::read_to_string(&path).ok().as_deref(), Some("{\"a\": 1}"));
        assert_eq!(store.get("ext").await.ok(), Some(Some(object(json!({"a": 1})))));
    }

    #[tokio::test]
    async fn corrupt_files_are_moved_aside() {
        for content in ["{not json", "[1, 2]", ""] {
            let root = temp_dir();
            fs::write(root.path().join("ext.json"), content).unwrap_or_else(|e| panic!("{e}"));
            let store = ExtensionStateStore::at(root.path().to_path_buf());
            assert_eq!(store.get("ext").await.ok(), Some(None), "{content:?}");
            let names = entries(root.path());
            assert_eq!(names.len(), 1, "{names:?}");
            assert!(names[0].starts_with("ext.json.corrupt-"), "{names:?}");
            let kept = fs::read_to_string(root.path().join(&names[0])).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(kept, content, "the corrupt content is kept");
        }
    }

    #[tokio::test]
    async fn names_are_encoded_or_refused() {
        let root = temp_dir();
        let dir = root.path().join("extensions");
        let store = ExtensionStateStore::at(dir.clone());
        for name in ["../evil", "a/b", "..\\x", "é"] {
            store.set(name, json!({"n": name})).await.unwrap_or_else(|e| panic!("set {name:?}: {e}"));
            assert_eq!(store.get(name).await.ok(), Some(Some(object(json!({"n": name})))));
        }
        assert_eq!(entries(&dir), vec!["%C3%A9.json", "..%2Fevil.json", "..%5Cx.json", "a%2Fb.json"]);
        assert_eq!(entries(root.path()), vec!["extensions"], "nothing outside the directory");
        for name in ["", ".", ".."] {
            match store.set(name, json!({})).await {
                Err(ExtensionStateError::InvalidName { name: refused, .. }) => assert_eq!(refused, name),
                other => panic!("expected InvalidName for {name:?}, got {other:?}"),
            }
            assert!(matches!(store.get(name).await, Err(ExtensionStateError::InvalidName { .. })));
        }
        let long = "a".repeat(MAX_ENCODED_NAME_BYTES + 1);
        assert!(matches!(store.set(&long, json!({})).await, Err(ExtensionStateError::InvalidName { .. })));
    }

    #[tokio::test]
    async fn in_memory_stores_keep_state_without_touching_disk() {
        let store = ExtensionStateStore::in_memory();
        assert_eq!(store.dir(), None);
        assert_eq!(store.path_of("ext").ok(), Some(None));
        store.set("ext", json!({"a": 1})).await.unwrap_or_else(|e| panic!("set: {e}"));
        let clone = store.clone();
        assert_eq!(clone.get("ext").await.ok(), Some(Some(object(json!({"a": 1})))));
        assert_eq!(ExtensionStateStore::in_memory().get("ext").await.ok(), Some(None));
    }

    #[tokio::test]
    async fn sets_apply_in_the_order_they_were_made() {
        let root = temp_dir();
        let store = ExtensionStateStore::at(root.path().to_path_buf());
        // join! polls the futures in order, so they queue on the (fair) lock
        // in that order, and each write runs on the blocking pool.
        let (a, b, c) = tokio::join!(
            store.set("ext", json!({"n": 1})),
            store.set("ext", json!({"n": 2})),
            store.set("ext", json!({"n": 3})),
        );
        for result in [a, b, c] {
            result.unwrap_or_else(|e| panic!("set: {e}"));
        }
        let fresh = ExtensionStateStore::at(root.path().to_path_buf());
        assert_eq!(fresh.get("ext").await.ok(), Some(Some(object(json!({"n": 3})))));
    }

    #[tokio::test]
    async fn a_write_whose_caller_went_away_still_finishes_before_the_next() {
        let root = temp_dir();
        let store = ExtensionStateStore::at(root.path().to_path_buf());
        {
            let mut first = std::pin::pin!(store.set("ext", json!({"n": 1})));
            // Poll once so the write is handed to the blocking pool, then drop it.
            let _ = futures_poll_once(first.as_mut()).await;
        }
        store.set("ext", json!({"n": 2})).await.unwrap_or_else(|e| panic!("set: {e}"));
        let fresh = ExtensionStateStore::at(root.path().to_path_buf());
        assert_eq!(fresh.get("ext").await.ok(), Some(Some(object(json!({"n": 2})))));
    }

    /// Polls `future` once and reports whether it finished.
    async fn futures_poll_once<F: std::future::Future + Unpin>(mut future: F) -> bool {
        std::future::poll_fn(|cx| std::task::Poll::Ready(std::pin::Pin::new(&mut future).poll(cx).is_ready())).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_sets_do_not_interleave() {
        let root = temp_dir();
        let store = ExtensionStateStore::at(root.path().to_path_buf());
        let mut tasks = Vec::new();
        for i in 0..32 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move { store.set("ext", json!({"i": i})).await }));
            // Yield so the sets queue on the lock in spawn order.
            tokio::task::yield_now().await;
        }
        for task in tasks {
            task.await.unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|e| panic!("set: {e}"));
        }
        let cached = store.get("ext").await.unwrap_or_else(|e| panic!("get: {e}"));
        let on_disk =
            ExtensionStateStore::at(root.path().to_path_buf()).get("ext").await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cached, on_disk, "the cache and the file agree");
        assert_eq!(entries(root.path()), vec!["ext.json"]);
    }
}
