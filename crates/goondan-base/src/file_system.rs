//! The `file-system` tool: `read`, `write`, `list` and `mkdir` inside the
//! instance's working directory.
//!
//! The exports, parameters and output fields are the original's
//! (`packages/base/src/tools/file-system.ts`); what differs is safety:
//!
//! - **Confinement.** Every path goes through
//!   [`crate::paths::resolve_confined`]: relative paths resolve against the
//!   workdir, and absolute paths, `..` escapes and symbolic links (dangling
//!   ones included) that lead outside the workdir are refused with
//!   `E_PATH_OUTSIDE_WORKDIR`. The operator widens the allowed roots with
//!   `GOONDAN_FS_ALLOW_ROOTS` (directories separated like `PATH`). Outputs
//!   report the resolved (real, absolute) path, which is the path used.
//!   Refusals name only the path the model sent, never where it leads nor
//!   whether that exists.
//! - **No check-then-use race.** The I/O goes through a directory
//!   capability of the root the path was checked in ([`crate::files`]), so
//!   a directory swapped for a link to elsewhere during the call makes the
//!   call fail instead of escaping; the last component is opened without
//!   following a link. Writes and appends through a file with more than one
//!   hard link are refused (`E_HARD_LINKED_FILE`): its other name may lie
//!   outside.
//! - **`read`** reads at most `maxBytes` (1..=10 MiB, default 100,000) bytes
//!   — never the whole of a large file — and backs off to a character
//!   boundary rather than split a UTF-8 character; `truncated` says the file
//!   is longer, `size` is its full size. A file with a NUL byte in its first
//!   8 KiB, or whose bytes are not UTF-8 (other than the cut at the end), is
//!   refused with `E_BINARY_FILE` naming its size, rather than returned as
//!   garbage. Only regular files are read (a FIFO could block forever).
//! - **`write`** is atomic: the content goes to a uniquely named temporary
//!   file in the target's directory, is synced, takes over the permissions of
//!   the file it replaces, and is renamed over the target — a crash leaves the
//!   old file or the new one, never half of one. `append: true` appends
//!   (creating the file when missing). Missing parent directories are created.
//! - **`list`** returns entries sorted by path, component by component (a
//!   directory's entries follow it directly, as in a tree walk). Entries have
//!   `type` `"file"` (with `size`), `"dir"`, `"symlink"` or `"other"`, and an
//!   absolute `path` (the listed `path` defaults to `.`, an empty one too;
//!   the other exports refuse an empty `path`). A recursive walk never
//!   follows a symbolic link: a link is listed with `targetType` (`"file"`,
//!   `"dir"` or `"other"`) when it points inside the allowed roots, and
//!   without it when it is dangling or leads outside (its target is then not
//!   even examined); links are filtered by `includeDirs` when they point to a
//!   directory, by `includeFiles` otherwise. The output is bounded: at most [`MAX_LIST_ENTRIES`] entries,
//!   [`MAX_LIST_DEPTH`] levels and [`MAX_LIST_SCANNED`] directory entries
//!   examined. The output always has `truncated`; when the listing was cut, or
//!   a subdirectory could not be read, a `note` says what happened. Since the
//!   walk is in sorted order, a cut listing is a prefix of the full one.
//! - **`mkdir`** returns `{path, created, recursive}`; `created` is `false`
//!   when the directory already existed (the original always said `true`).
//!
//! Errors carry their own codes (from [`goondan_core::codes`]:
//! [`E_FILE_NOT_FOUND`], [`E_IS_DIRECTORY`], …), name the path and say what
//! to do. The blocking file-system work runs on Tokio's blocking pool so that
//! a slow disk never stalls the runtime.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cap_fs_ext::DirExt;
use cap_std::fs::{Dir, MetadataExt, OpenOptions, OpenOptionsExt};

use goondan_core::codes::{
    E_ALREADY_EXISTS, E_BINARY_FILE, E_FILE_NOT_FOUND, E_FS_ERROR, E_HARD_LINKED_FILE, E_IS_DIRECTORY, E_NOT_DIRECTORY,
    E_NOT_REGULAR_FILE, E_PATH_PROTECTED, E_PATH_UNRESOLVABLE, E_PERMISSION_DENIED,
};
use goondan_core::{JsonObject, JsonValue};
use goondan_tools::{BoxFuture, HandlerResult, ToolContext, ToolFailure, ToolHandler, ToolOutput};
use serde_json::json;

use crate::protect::{self, FsGuard};
use crate::{BaseSettings, args, files, paths};

/// `read`'s default `maxBytes`.
pub const DEFAULT_READ_BYTES: u64 = 100_000;
/// The largest `maxBytes` `read` accepts: 10 MiB.
pub const MAX_READ_BYTES: u64 = 10 * 1024 * 1024;
/// How much of a file's start is searched for a NUL byte.
pub const BINARY_SNIFF_BYTES: usize = 8 * 1024;
/// The most entries `list` returns.
pub const MAX_LIST_ENTRIES: usize = 10_000;
/// How deep a recursive `list` descends (the listed directory's own entries
/// are level 1).
pub const MAX_LIST_DEPTH: usize = 32;
/// The most directory entries one `list` examines, listed or filtered out, so
/// that a huge tree costs bounded time even when little of it is returned.
pub const MAX_LIST_SCANNED: usize = 100_000;

/// The handler of `export`, or `None` if the tool has no such export.
pub fn handler(export: &str, settings: &Arc<BaseSettings>) -> Option<Arc<dyn ToolHandler>> {
    let export = match export {
        "read" => Export::Read,
        "write" => Export::Write,
        "list" => Export::List,
        "mkdir" => Export::Mkdir,
        _ => return None,
    };
    Some(Arc::new(FileSystem { export, settings: Arc::clone(settings) }))
}

#[derive(Debug, Clone, Copy)]
enum Export {
    Read,
    Write,
    List,
    Mkdir,
}

/// One export of the tool, with the operator's settings.
struct FileSystem {
    export: Export,
    settings: Arc<BaseSettings>,
}

impl ToolHandler for FileSystem {
    fn call<'a>(&'a self, ctx: &'a ToolContext, input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            let request = Request::parse(self.export, input)?;
            let place = Place::new(ctx.workdir().to_path_buf(), Arc::clone(&self.settings));
            let output = run_blocking(move || request.run(&place)).await?;
            Ok(ToolOutput::Value(output))
        })
    }
}

/// Runs `work` on Tokio's blocking pool, or inline outside a runtime.
async fn run_blocking<F>(work: F) -> Result<JsonValue, ToolFailure>
where
    F: FnOnce() -> Result<JsonValue, ToolFailure> + Send + 'static,
{
    files::run_blocking(work).await.unwrap_or_else(|error| {
        Err(ToolFailure::with_code(format!("the file-system task did not finish: {error}"), E_FS_ERROR))
    })
}

/// Where paths resolve: the workdir and the operator's extra roots, and the
/// roots opened so far as directory capabilities (once per root and call).
struct Place {
    workdir: PathBuf,
    settings: Arc<BaseSettings>,
    opened: RefCell<Vec<(PathBuf, Arc<Dir>)>>,
}

/// A checked path and the capability of its root, through which it is used.
struct Target {
    /// The real path, for output and messages.
    real: PathBuf,
    /// The path below `root`.
    relative: PathBuf,
    root: Arc<Dir>,
}

impl Target {
    /// The path for cap-std calls on `root` (`.` for the root itself).
    fn beneath(&self) -> &Path {
        files::dot_if_empty(&self.relative)
    }
}

impl Place {
    fn new(workdir: PathBuf, settings: Arc<BaseSettings>) -> Self {
        Self { workdir, settings, opened: RefCell::new(Vec::new()) }
    }

    /// What the agent's use of the tool refuses inside the roots.
    fn guard(&self) -> &FsGuard {
        &self.settings.fs_guard
    }

    /// Refuses a `.env*` path (read or written) unless allowed.
    fn check_dot_env(&self, input: &str, target: &Target) -> Result<(), ToolFailure> {
        if self.guard().refuses_dot_env(&target.relative, input) {
            return Err(protected_failure(
                input,
                "files whose name starts with .env hold the operator's secrets",
                protect::ALLOW_DOT_ENV,
            ));
        }
        Ok(())
    }

    /// Refuses writing one of the bundle's own files (`id`: the existing
    /// file's device and inode) unless allowed.
    fn check_config_write(&self, input: &str, real: &Path, id: Option<(u64, u64)>) -> Result<(), ToolFailure> {
        let workdir = std::fs::canonicalize(&self.workdir).unwrap_or_else(|_| self.workdir.clone());
        if self.guard().refuses_write(real, id, &workdir) {
            return Err(protected_failure(
                input,
                "the runtime loads it as configuration or code (the bundle's directory, its lock file, a prompt or a \
                 module)",
                protect::ALLOW_CONFIG_WRITES,
            ));
        }
        Ok(())
    }

    /// Checks `path` ([`paths::resolve_beneath`]) and opens its root.
    fn resolve(&self, path: &str) -> Result<Target, ToolFailure> {
        let confined = paths::resolve_beneath(&self.workdir, &self.settings.extra_fs_roots, path)?;
        let root = self.root(&confined.root).map_err(|error| io_failure("open", path, &confined.real, &error))?;
        Ok(Target { real: confined.real, relative: confined.relative, root })
    }

    /// The capability of the allowed root `root`.
    fn root(&self, root: &Path) -> io::Result<Arc<Dir>> {
        if let Some((_, dir)) = self.opened.borrow().iter().find(|(path, _)| path == root) {
            return Ok(Arc::clone(dir));
        }
        let dir = Arc::new(files::open_root(root)?);
        self.opened.borrow_mut().push((root.to_path_buf(), Arc::clone(&dir)));
        Ok(dir)
    }
}

/// A validated call.
enum Request {
    Read { path: String, max_bytes: u64 },
    Write { path: String, content: String, append: bool },
    List { path: String, recursive: bool, include_dirs: bool, include_files: bool },
    Mkdir { path: String, recursive: bool },
}

impl Request {
    fn parse(export: Export, input: &JsonObject) -> Result<Self, ToolFailure> {
        Ok(match export {
            Export::Read => Self::Read { path: required_path(input)?, max_bytes: max_bytes(input)? },
            Export::Write => Self::Write {
                path: required_path(input)?,
                content: args::require_string(input, "content")?.to_owned(),
                append: args::optional_bool(input, "append")?.unwrap_or(false),
            },
            Export::List => Self::List {
                path: args::optional_string(input, "path")?.filter(|p| !p.is_empty()).unwrap_or(".").to_owned(),
                recursive: args::optional_bool(input, "recursive")?.unwrap_or(false),
                include_dirs: args::optional_bool(input, "includeDirs")?.unwrap_or(true),
                include_files: args::optional_bool(input, "includeFiles")?.unwrap_or(true),
            },
            Export::Mkdir => Self::Mkdir {
                path: required_path(input)?,
                recursive: args::optional_bool(input, "recursive")?.unwrap_or(true),
            },
        })
    }

    fn run(self, place: &Place) -> Result<JsonValue, ToolFailure> {
        match self {
            Self::Read { path, max_bytes } => read(place, &path, max_bytes),
            Self::Write { path, content, append } => write(place, &path, &content, append),
            Self::List { path, recursive, include_dirs, include_files } => {
                list(place, &path, Walk::new(recursive, include_dirs, include_files))
            }
            Self::Mkdir { path, recursive } => mkdir(place, &path, recursive),
        }
    }
}

/// The `path` property, which must name something.
fn required_path(input: &JsonObject) -> Result<String, ToolFailure> {
    let suggestion = "Pass a path relative to the working directory, e.g. \"notes/todo.md\".";
    Ok(args::require_non_blank(input, "path", suggestion)?.to_owned())
}

/// `read`'s `maxBytes`: a whole number in `1..=MAX_READ_BYTES`.
fn max_bytes(input: &JsonObject) -> Result<u64, ToolFailure> {
    let suggestion = || {
        format!(
            "Omit maxBytes to read up to {DEFAULT_READ_BYTES} bytes, or pass at most {MAX_READ_BYTES}; read the \
             rest of a larger file with other tools (e.g. bash with head, tail or sed)."
        )
    };
    // Below 1 gets the original's message; the upper cap is ours.
    if args::optional_number(input, "maxBytes")?.is_some_and(|n| n < 1.0) {
        return Err(ToolFailure::new("'maxBytes' must be greater than 0").suggest(suggestion()));
    }
    let max_bytes =
        args::optional_whole(input, "maxBytes", 1, MAX_READ_BYTES).map_err(|failure| failure.suggest(suggestion()))?;
    Ok(max_bytes.unwrap_or(DEFAULT_READ_BYTES))
}

/// A path for output and messages.
fn shown(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// `'input' (real path)`, or just `'input'` when they are the same text.
fn describe(input: &str, real: &Path) -> String {
    let real = shown(real);
    if real == input { format!("'{input}'") } else { format!("'{input}' ({real})") }
}

/// A failed operating-system call on `input` (resolved to `real`), with a
/// code and suggestion chosen by the kind of error.
fn io_failure(action: &str, input: &str, real: &Path, error: &io::Error) -> ToolFailure {
    if files::is_escape(error) {
        // A link swapped in after the check led outside: refused like any
        // other path that leads there, naming only what the model sent.
        return paths::outside_failure(input);
    }
    let what = describe(input, real);
    if files::is_link_in_the_way(error) {
        return ToolFailure::with_code(
            format!("cannot {action} {what}: a symbolic link replaced part of the path while it was used"),
            E_PATH_UNRESOLVABLE,
        )
        .suggest("Something changed the path meanwhile; check it with file-system__list and try again.");
    }
    match error.kind() {
        io::ErrorKind::NotFound => {
            ToolFailure::with_code(format!("cannot {action} {what}: no such file or directory"), E_FILE_NOT_FOUND)
                .suggest(
                    "Check the path with file-system__list; relative paths resolve against the instance's working \
             directory.",
                )
        }
        io::ErrorKind::PermissionDenied => {
            ToolFailure::with_code(format!("cannot {action} {what}: permission denied"), E_PERMISSION_DENIED)
                .suggest("The file's permissions do not allow this; choose another path or fix them with bash.")
        }
        io::ErrorKind::IsADirectory => {
            ToolFailure::with_code(format!("cannot {action} {what}: it is a directory"), E_IS_DIRECTORY)
                .suggest("Use file-system__list to see a directory's entries, or choose a file path inside it.")
        }
        io::ErrorKind::NotADirectory => ToolFailure::with_code(
            format!("cannot {action} {what}: a part of the path is a file, not a directory"),
            E_NOT_DIRECTORY,
        )
        .suggest("Check the path with file-system__list; a file cannot contain other files."),
        _ => ToolFailure::with_code(format!("cannot {action} {what}: {error}"), E_FS_ERROR)
            .suggest("Check the file system (free space, permissions, read-only mounts) and try again."),
    }
}

/// A path the tool may not touch by default, naming only what was sent.
fn protected_failure(input: &str, why: &str, allow_key: &str) -> ToolFailure {
    ToolFailure::with_code(format!("path '{input}' is protected: {why}"), E_PATH_PROTECTED)
        .named("PathProtectedError")
        .suggest(format!(
            "Choose another path. The bundle's author can allow this with config: {{{allow_key}: true}} on the \
             agent's file-system item in spec.tools."
        ))
}

/// A file's identity, for comparing with protected files.
fn identity(meta: &cap_std::fs::Metadata) -> (u64, u64) {
    (meta.dev(), meta.ino())
}

fn is_directory_failure(action: &str, input: &str, real: &Path) -> ToolFailure {
    io_failure(action, input, real, &io::Error::from(io::ErrorKind::IsADirectory))
}

fn not_regular_failure(action: &str, input: &str, real: &Path) -> ToolFailure {
    ToolFailure::with_code(
        format!("cannot {action} {}: it is not a regular file (a FIFO, socket or device)", describe(input, real)),
        E_NOT_REGULAR_FILE,
    )
    .suggest("file-system works on regular files and directories only; choose another path.")
}

// ---------------------------------------------------------------------------
// read
// ---------------------------------------------------------------------------

fn read(place: &Place, input: &str, max_bytes: u64) -> Result<JsonValue, ToolFailure> {
    let target = place.resolve(input)?;
    place.check_dot_env(input, &target)?;
    let real = &target.real;
    let failure = |error: io::Error| io_failure("read", input, real, &error);
    // Checked before opening: opening a FIFO would block until a writer came.
    let meta = target.root.metadata(target.beneath()).map_err(failure)?;
    if meta.is_dir() {
        return Err(is_directory_failure("read", input, real));
    }
    if !meta.is_file() {
        return Err(not_regular_failure("read", input, real));
    }
    // Non-blocking, in case a FIFO took the file's place since; what was
    // opened is checked again below.
    let mut options = OpenOptions::new();
    options.read(true).custom_flags(nix::libc::O_NONBLOCK);
    let file = files::open_no_follow(&target.root, target.beneath(), &mut options).map_err(failure)?.into_std();
    let meta = file.metadata().map_err(failure)?;
    if !meta.is_file() {
        return Err(not_regular_failure("read", input, real));
    }
    // One byte more than returned tells whether the file goes on; at least
    // the sniffed prefix is read so that a small maxBytes still detects
    // binary content.
    let want = max_bytes.saturating_add(1).max(BINARY_SNIFF_BYTES as u64);
    let mut bytes = Vec::with_capacity(usize::try_from(want.min(meta.len().saturating_add(1))).unwrap_or(0));
    let mut reader = file.take(want);
    reader.read_to_end(&mut bytes).map_err(failure)?;
    let seen = bytes.len() as u64;
    // The file may have changed since `metadata`; what was read is a lower bound.
    let size = reader.into_inner().metadata().map_or(meta.len(), |now| now.len()).max(seen);

    let sniffed = &bytes[..bytes.len().min(BINARY_SNIFF_BYTES)];
    if let Some(offset) = sniffed.iter().position(|byte| *byte == 0) {
        return Err(binary_failure(input, real, size, &format!("it has a NUL byte at offset {offset}")));
    }
    let truncated = seen > max_bytes;
    bytes.truncate(usize::try_from(max_bytes).unwrap_or(usize::MAX));
    let content = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(error) => {
            let utf8 = error.utf8_error();
            let valid = utf8.valid_up_to();
            // A character cut by maxBytes is not an error: back off to before it.
            let cut_by_limit = utf8.error_len().is_none() && truncated;
            if !cut_by_limit {
                return Err(binary_failure(input, real, size, &format!("it is not valid UTF-8 at byte {valid}")));
            }
            let mut bytes = error.into_bytes();
            bytes.truncate(valid);
            String::from_utf8(bytes).map_err(|error| {
                binary_failure(input, real, size, &format!("it is not valid UTF-8 at byte {}", error.utf8_error()))
            })?
        }
    };
    Ok(json!({"path": shown(real), "size": size, "truncated": truncated, "content": content}))
}

fn binary_failure(input: &str, real: &Path, size: u64, why: &str) -> ToolFailure {
    ToolFailure::with_code(
        format!("cannot read {} as text: it looks like a binary file of {size} bytes ({why})", describe(input, real)),
        E_BINARY_FILE,
    )
    .named("BinaryFileError")
    .suggest(
        "file-system__read returns UTF-8 text only. Inspect binary files with other tools if available (e.g. bash \
         with `file`, `xxd | head` or `base64`).",
    )
}

// ---------------------------------------------------------------------------
// write
// ---------------------------------------------------------------------------

fn write(place: &Place, input: &str, content: &str, append: bool) -> Result<JsonValue, ToolFailure> {
    let target = place.resolve(input)?;
    place.check_dot_env(input, &target)?;
    let real = &target.real;
    let failure = |error: io::Error| io_failure("write", input, real, &error);
    // Not following a link: the checked path has none at its end, and one
    // that appeared since is refused when the file is opened or replaced.
    let existing = match target.root.symlink_metadata(target.beneath()) {
        Ok(meta) => Some(meta),
        Err(error) if error.kind() == io::ErrorKind::NotFound => None,
        Err(error) => return Err(failure(error)),
    };
    place.check_config_write(input, real, existing.as_ref().map(identity))?;
    if let Some(meta) = &existing {
        if meta.is_dir() {
            return Err(is_directory_failure("write", input, real));
        }
        if !meta.is_file() {
            return Err(not_regular_failure("write", input, real));
        }
        if meta.nlink() > 1 {
            return Err(hard_linked_failure(input, real, meta.nlink()));
        }
    }
    let parent = files::open_parent(&target.root, &target.relative, existing.is_none()).map_err(|error| {
        if error.kind() == io::ErrorKind::NotFound || files::is_escape(&error) {
            failure(error)
        } else {
            io_failure("create the parent directory of", input, real, &error)
        }
    })?;
    let Some((parent, name)) = parent else {
        return Err(is_directory_failure("write", input, real));
    };
    let size = if append {
        let mut options = OpenOptions::new();
        options.append(true).create(true);
        let mut file = files::open_no_follow(&parent, Path::new(&name), &mut options).map_err(failure)?;
        // What was opened, not what was checked: a hard link made meanwhile
        // is refused before a byte is written.
        let meta = file.metadata().map_err(failure)?;
        place.check_config_write(input, real, Some(identity(&meta)))?;
        if !meta.is_file() {
            return Err(not_regular_failure("write", input, real));
        }
        if meta.nlink() > 1 {
            return Err(hard_linked_failure(input, real, meta.nlink()));
        }
        file.write_all(content.as_bytes()).map_err(failure)?;
        file.sync_data().map_err(failure)?;
        file.metadata().map_err(failure)?.len()
    } else {
        let permissions = existing.map(|meta| meta.permissions());
        files::replace_atomically(&parent, &name, content.as_bytes(), permissions).map_err(failure)?;
        parent.symlink_metadata(&name).map_err(failure)?.len()
    };
    Ok(json!({"path": shown(real), "size": size, "written": true, "append": append}))
}

/// A write through a file with another name: the other name (perhaps
/// outside the workdir) would change too, or stop sharing the content.
fn hard_linked_failure(input: &str, real: &Path, links: u64) -> ToolFailure {
    ToolFailure::with_code(
        format!(
            "cannot write {}: the file has {links} hard links, so other names would change too",
            describe(input, real)
        ),
        E_HARD_LINKED_FILE,
    )
    .named("HardLinkedFileError")
    .suggest("Write to a new file instead, or ask the operator to replace the hard link with a copy.")
}

// ---------------------------------------------------------------------------
// list
// ---------------------------------------------------------------------------

/// The state of one listing.
struct Walk {
    recursive: bool,
    include_dirs: bool,
    include_files: bool,
    entries: Vec<JsonValue>,
    scanned: usize,
    truncated: bool,
    /// Why the listing is incomplete, once each.
    notes: Vec<String>,
    unreadable: Vec<String>,
}

/// Whether the walk goes on.
#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

impl Walk {
    fn new(recursive: bool, include_dirs: bool, include_files: bool) -> Self {
        Self {
            recursive,
            include_dirs,
            include_files,
            entries: Vec::new(),
            scanned: 0,
            truncated: false,
            notes: Vec::new(),
            unreadable: Vec::new(),
        }
    }

    fn note(&mut self, note: String) {
        self.truncated = true;
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    /// Lists `dir` (opened beneath its root; its real path is `path`), whose
    /// entries are at `depth`, descending into subdirectories when recursive.
    fn walk(&mut self, place: &Place, dir: &Dir, path: &Path, depth: usize) -> io::Result<Flow> {
        let mut children = Vec::new();
        for entry in dir.entries()? {
            if self.scanned >= MAX_LIST_SCANNED {
                self.note(format!("stopped after examining {MAX_LIST_SCANNED} entries"));
                break;
            }
            self.scanned += 1;
            let entry = entry?;
            // `file_type` does not follow symbolic links.
            let kind = entry.file_type()?;
            // Not following links either: the size of this very file.
            let size = if kind.is_file() { entry.metadata().map_or(0, |meta| meta.len()) } else { 0 };
            children.push((entry.file_name(), kind, size));
        }
        children.sort_by(|a, b| a.0.cmp(&b.0));
        for (file_name, kind, size) in children {
            let child = path.join(&file_name);
            let name = file_name.to_string_lossy().into_owned();
            if kind.is_dir() {
                if self.include_dirs
                    && self.push(json!({"name": name, "path": shown(&child), "type": "dir"})) == Flow::Stop
                {
                    return Ok(Flow::Stop);
                }
                if self.recursive && self.descend(place, dir, &file_name, &child, depth) == Flow::Stop {
                    return Ok(Flow::Stop);
                }
            } else if kind.is_file() {
                if self.include_files {
                    let entry = json!({"name": name, "path": shown(&child), "type": "file", "size": size});
                    if self.push(entry) == Flow::Stop {
                        return Ok(Flow::Stop);
                    }
                }
            } else if kind.is_symlink() {
                let target = link_target_type(place, &child);
                let wanted = if target == Some("dir") { self.include_dirs } else { self.include_files };
                if wanted {
                    let mut entry = json!({"name": name, "path": shown(&child), "type": "symlink"});
                    if let (Some(target), JsonValue::Object(map)) = (target, &mut entry) {
                        map.insert("targetType".to_owned(), JsonValue::from(target));
                    }
                    if self.push(entry) == Flow::Stop {
                        return Ok(Flow::Stop);
                    }
                }
            } else if self.include_files
                && self.push(json!({"name": name, "path": shown(&child), "type": "other"})) == Flow::Stop
            {
                return Ok(Flow::Stop);
            }
        }
        Ok(Flow::Continue)
    }

    /// Walks the subdirectory `name` of `parent` (real path `path`), a
    /// directory whose entries are at `depth`.
    fn descend(&mut self, place: &Place, parent: &Dir, name: &OsStr, path: &Path, depth: usize) -> Flow {
        if depth >= MAX_LIST_DEPTH {
            self.note(format!("directories more than {MAX_LIST_DEPTH} levels deep were not descended into"));
            return Flow::Continue;
        }
        // The entry was a directory when read; if it has been replaced by a
        // link since, it is not entered (the open refuses to follow it).
        let dir = match parent.open_dir_nofollow(name) {
            Ok(dir) => dir,
            Err(error) if files::is_link_in_the_way(&error) || error.raw_os_error() == Some(nix::libc::ENOTDIR) => {
                return Flow::Continue;
            }
            Err(error) => return self.unreadable(path, &error),
        };
        match self.walk(place, &dir, path, depth + 1) {
            Ok(flow) => flow,
            Err(error) => self.unreadable(path, &error),
        }
    }

    /// Notes a subdirectory that could not be read, and goes on.
    fn unreadable(&mut self, path: &Path, error: &io::Error) -> Flow {
        self.truncated = true;
        self.unreadable.push(format!("{} ({error})", shown(path)));
        Flow::Continue
    }

    /// Adds an entry, unless the listing is full.
    fn push(&mut self, entry: JsonValue) -> Flow {
        if self.entries.len() >= MAX_LIST_ENTRIES {
            self.note(format!("only the first {MAX_LIST_ENTRIES} entries are listed"));
            return Flow::Stop;
        }
        self.entries.push(entry);
        Flow::Continue
    }

    /// Why the listing is incomplete, if it is.
    fn summary(&self) -> Option<String> {
        let mut parts = self.notes.clone();
        if !self.unreadable.is_empty() {
            const SHOWN: usize = 5;
            let mut part = format!(
                "{} subdirector{} could not be read: {}",
                self.unreadable.len(),
                if self.unreadable.len() == 1 { "y" } else { "ies" },
                self.unreadable.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ")
            );
            if self.unreadable.len() > SHOWN {
                part.push_str(", …");
            }
            parts.push(part);
        }
        if parts.is_empty() {
            return None;
        }
        Some(format!(
            "The listing is incomplete: {}. List a subdirectory, or narrow it with includeDirs/includeFiles, to see \
             more.",
            parts.join("; ")
        ))
    }
}

/// What the link at the real path `link` points to, when that lies inside
/// the allowed roots; `None` for dangling links and links that lead outside,
/// whose targets are not examined.
fn link_target_type(place: &Place, link: &Path) -> Option<&'static str> {
    let target = place.resolve(&link.to_string_lossy()).ok()?;
    let meta = target.root.metadata(target.beneath()).ok()?;
    Some(if meta.is_dir() {
        "dir"
    } else if meta.is_file() {
        "file"
    } else {
        "other"
    })
}

fn list(place: &Place, input: &str, mut walk: Walk) -> Result<JsonValue, ToolFailure> {
    let target = place.resolve(input)?;
    let real = &target.real;
    let failure = |error: io::Error| io_failure("list", input, real, &error);
    let not_directory = || {
        ToolFailure::with_code(format!("cannot list {}: it is not a directory", describe(input, real)), E_NOT_DIRECTORY)
            .suggest("Use file-system__read to read a file, or list its parent directory.")
    };
    let meta = target.root.metadata(target.beneath()).map_err(failure)?;
    if !meta.is_dir() {
        return Err(not_directory());
    }
    let dir = target.root.open_dir_nofollow(target.beneath()).map_err(|error| {
        if error.raw_os_error() == Some(nix::libc::ENOTDIR) { not_directory() } else { failure(error) }
    })?;
    walk.walk(place, &dir, real, 1).map_err(failure)?;
    let mut output = json!({
        "path": shown(real),

        "recursive": walk.recursive,
        "count": walk.entries.len(),
        "entries": JsonValue::Array(Vec::new()),
        "truncated": walk.truncated,
    });
    if let JsonValue::Object(map) = &mut output {
        if let Some(note) = walk.summary() {
            map.insert("note".to_owned(), JsonValue::from(note));
        }
        map.insert("entries".to_owned(), JsonValue::Array(std::mem::take(&mut walk.entries)));
    }
    Ok(output)
}

// ---------------------------------------------------------------------------
// mkdir
// ---------------------------------------------------------------------------

fn mkdir(place: &Place, input: &str, recursive: bool) -> Result<JsonValue, ToolFailure> {
    let target = place.resolve(input)?;
    let real = &target.real;
    place.check_config_write(input, real, None)?;
    let exists_as_file = || {
        ToolFailure::with_code(
            format!("cannot create directory {}: a file of that name exists", describe(input, real)),
            E_ALREADY_EXISTS,
        )
        .suggest("Choose another name, or remove or rename the file first.")
    };
    let done = |created: bool| json!({"path": shown(real), "created": created, "recursive": recursive});
    match target.root.metadata(target.beneath()) {
        Ok(meta) if meta.is_dir() => return Ok(done(false)),
        Ok(_) => return Err(exists_as_file()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(io_failure("create directory", input, real, &error)),
    }
    let created =
        if recursive { target.root.create_dir_all(target.beneath()) } else { target.root.create_dir(target.beneath()) };
    match created {
        Ok(()) => Ok(done(true)),
        // Created by someone else meanwhile.
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => match target.root.metadata(target.beneath()) {
            Ok(meta) if meta.is_dir() => Ok(done(false)),
            _ => Err(exists_as_file()),
        },
        Err(error) if error.kind() == io::ErrorKind::NotFound && !recursive => Err(ToolFailure::with_code(
            format!("cannot create directory {}: its parent directory does not exist", describe(input, real)),
            E_FILE_NOT_FOUND,
        )
        .suggest("Pass recursive: true (the default) to create missing parent directories too.")),
        Err(error) => Err(io_failure("create directory", input, real, &error)),
    }
}

#[cfg(test)]
mod tests {
    use std::fs::{self, File};
    use std::os::unix::fs::{PermissionsExt, symlink};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Context, Poll, Waker};

    use goondan_core::{ToolResult, codes};

    use super::*;
    use crate::test_support::{Executor, Workdir, context_in, err, names, object, ok, run_in, settings, workdir};

    /// A workdir and a directory outside it, both real paths.
    struct Fixture {
        _dirs: (Workdir, Workdir),
        root: PathBuf,
        outside: PathBuf,
    }

    fn fixture() -> Fixture {
        let (dir, outside) = (workdir(), workdir());
        Fixture { root: dir.path.clone(), outside: outside.path.clone(), _dirs: (dir, outside) }
    }

    fn put(path: &Path, bytes: impl AsRef<[u8]>) {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).unwrap_or_else(|e| panic!("mkdir {}: {e}", parent.display()));
        }
        fs::write(path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    fn text(path: &Path) -> String {
        fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
    }

    fn link(target: &Path, at: &Path) {
        symlink(target, at).unwrap_or_else(|e| panic!("symlink {}: {e}", at.display()));
    }

    async fn call_with(settings: &Arc<BaseSettings>, workdir: &Path, export: &str, input: JsonValue) -> HandlerResult {
        run_in("file-system", export, settings, workdir, input).await
    }

    async fn call(workdir: &Path, export: &str, input: JsonValue) -> HandlerResult {
        call_with(&settings(), workdir, export, input).await
    }

    fn code(failure: &ToolFailure) -> &str {
        failure.code.as_deref().unwrap_or("E_TOOL")
    }

    /// Asserts that the call failed with `expected` and returns the failure.
    async fn fails(workdir: &Path, export: &str, input: JsonValue, expected: &str) -> ToolFailure {
        let shown_input = input.to_string();
        let failure = err(call(workdir, export, input).await);
        assert_eq!(code(&failure), expected, "{export} {shown_input}: {failure:?}");
        assert!(failure.suggestion.is_some(), "{export} {shown_input}: no suggestion in {failure:?}");
        failure
    }

    fn at(root: &Path, relative: &str) -> String {
        shown(&root.join(relative))
    }

    // --- read --------------------------------------------------------------

    #[tokio::test]
    async fn read_returns_the_content_and_size() {
        let f = fixture();
        put(&f.root.join("notes/a.txt"), "hello, 세계\n");
        let output = ok(call(&f.root, "read", json!({"path": "notes/a.txt"})).await);
        assert_eq!(
            output,
            json!({"path": at(&f.root, "notes/a.txt"), "size": 14, "truncated": false, "content": "hello, 세계\n"})
        );
        // Absolute paths inside the workdir, `.` and `..` that stay inside, and empty files.
        let absolute = at(&f.root, "notes/a.txt");
        assert_eq!(ok(call(&f.root, "read", json!({"path": absolute})).await)["size"], json!(14));
        assert_eq!(ok(call(&f.root, "read", json!({"path": "./notes/../notes/a.txt"})).await)["size"], json!(14));
        put(&f.root.join("empty"), "");
        assert_eq!(
            ok(call(&f.root, "read", json!({"path": "empty"})).await),
            json!({"path": at(&f.root, "empty"), "size": 0, "truncated": false, "content": ""})
        );
        // A link inside the workdir is followed.
        link(&f.root.join("notes/a.txt"), &f.root.join("alias"));
        let output = ok(call(&f.root, "read", json!({"path": "alias"})).await);
        assert_eq!(output["content"], json!("hello, 세계\n"));
        assert_eq!(output["path"], json!(at(&f.root, "notes/a.txt")));
    }

    #[tokio::test]
    async fn read_honours_max_bytes_without_splitting_a_character() {
        let f = fixture();
        put(&f.root.join("k.txt"), "가나다"); // three bytes each
        let read = |max: u64| call(&f.root, "read", json!({"path": "k.txt", "maxBytes": max}));
        for (max, content, truncated) in
            [(1, "", true), (3, "가", true), (4, "가", true), (5, "가", true), (6, "가나", true), (8, "가나", true)]
        {
            let output = ok(read(max).await);
            assert_eq!(output["content"], json!(content), "maxBytes {max}");
            assert_eq!(output["truncated"], json!(truncated), "maxBytes {max}");
            assert_eq!(output["size"], json!(9), "maxBytes {max}");
        }
        for max in [9, 10, 100_000] {
            let output = ok(read(max).await);
            assert_eq!(output["content"], json!("가나다"));
            assert_eq!(output["truncated"], json!(false));
        }
        // A float that is whole counts.
        let output = ok(call(&f.root, "read", json!({"path": "k.txt", "maxBytes": 3.0})).await);
        assert_eq!(output["content"], json!("가"));
        // A large file: only the head is returned; the size is the whole file's.
        put(&f.root.join("big.txt"), "x".repeat(3 * 1024 * 1024));
        let output = ok(call(&f.root, "read", json!({"path": "big.txt", "maxBytes": 10})).await);
        assert_eq!(
            output,
            json!({"path": at(&f.root, "big.txt"), "size": 3 * 1024 * 1024, "truncated": true, "content": "xxxxxxxxxx"})
        );
        let output = ok(call(&f.root, "read", json!({"path": "big.txt"})).await);
        assert_eq!(output["content"].as_str().map(str::len), Some(100_000));
        assert_eq!(output["truncated"], json!(true));
        let output = ok(call(&f.root, "read", json!({"path": "big.txt", "maxBytes": MAX_READ_BYTES})).await);
        assert_eq!(output["content"].as_str().map(str::len), Some(3 * 1024 * 1024));
        assert_eq!(output["truncated"], json!(false));
    }

    #[tokio::test]
    async fn read_rejects_max_bytes_out_of_range() {
        let f = fixture();
        put(&f.root.join("a.txt"), "abc");
        for max in [json!(0), json!(-1), json!(0.5)] {
            let failure = err(call(&f.root, "read", json!({"path": "a.txt", "maxBytes": max})).await);
            assert_eq!(failure.message, "'maxBytes' must be greater than 0");
            assert!(failure.suggestion.is_some());
        }
        for (max, shown) in [(json!(1.5), "1.5"), (json!(MAX_READ_BYTES + 1), "10485761")] {
            let failure = err(call(&f.root, "read", json!({"path": "a.txt", "maxBytes": max})).await);
            assert_eq!(
                failure.message,
                format!("'maxBytes' must be a whole number between 1 and 10485760, got {shown}")
            );
            assert!(failure.suggestion.is_some());
        }
        // The handler's own type checks (the executor normally rejects these first).
        let failure = err(call(&f.root, "read", json!({"path": "a.txt", "maxBytes": "10"})).await);
        assert_eq!(failure.message, "'maxBytes' must be a valid number, got string");
        for path in [json!(null), json!(3), json!(""), json!("  ")] {
            let failure = err(call(&f.root, "read", json!({"path": path})).await);
            assert_eq!(failure.message, "'path' must be a non-empty string", "{path}");
        }
    }

    #[tokio::test]
    async fn read_refuses_binary_files() {
        let f = fixture();
        put(&f.root.join("nul.bin"), b"text\0more");
        let failure = fails(&f.root, "read", json!({"path": "nul.bin"}), E_BINARY_FILE).await;
        assert!(failure.message.contains("9 bytes"), "{}", failure.message);
        assert!(failure.message.contains("NUL byte at offset 4"), "{}", failure.message);
        assert!(failure.message.contains("nul.bin"), "{}", failure.message);
        // A NUL past maxBytes but within the first 8 KiB still counts.
        let failure = fails(&f.root, "read", json!({"path": "nul.bin", "maxBytes": 2}), E_BINARY_FILE).await;
        assert!(failure.message.contains("NUL byte at offset 4"), "{}", failure.message);
        // Invalid UTF-8 that is not a cut character.
        let mut png = vec![0x89, b'P', b'N', b'G'];
        png.extend(std::iter::repeat_n(b'a', 20));
        put(&f.root.join("image.png"), &png);
        let failure = fails(&f.root, "read", json!({"path": "image.png"}), E_BINARY_FILE).await;
        assert!(failure.message.contains("24 bytes"), "{}", failure.message);
        assert!(failure.message.contains("not valid UTF-8 at byte 0"), "{}", failure.message);
        // Latin-1 text is not UTF-8 either.
        put(&f.root.join("latin1.txt"), b"caf\xe9 au lait");
        let failure = fails(&f.root, "read", json!({"path": "latin1.txt"}), E_BINARY_FILE).await;
        assert!(failure.message.contains("at byte 3"), "{}", failure.message);
        // A file that ends in the middle of a character (not cut by maxBytes).
        put(&f.root.join("broken.txt"), b"ab\xea\xb0");
        fails(&f.root, "read", json!({"path": "broken.txt"}), E_BINARY_FILE).await;
        // ...but the same bytes cut by maxBytes are fine.
        put(&f.root.join("ok.txt"), "ab가");
        assert_eq!(ok(call(&f.root, "read", json!({"path": "ok.txt", "maxBytes": 4})).await)["content"], json!("ab"));
    }

    #[tokio::test]
    async fn read_reports_missing_files_directories_and_special_files() {
        let f = fixture();
        let failure = fails(&f.root, "read", json!({"path": "missing.txt"}), E_FILE_NOT_FOUND).await;
        assert!(failure.message.contains("missing.txt"), "{}", failure.message);
        assert!(failure.message.contains(&at(&f.root, "missing.txt")), "{}", failure.message);
        fails(&f.root, "read", json!({"path": "no/such/dir/file.txt"}), E_FILE_NOT_FOUND).await;
        fs::create_dir(f.root.join("sub")).unwrap_or_else(|e| panic!("{e}"));
        let failure = fails(&f.root, "read", json!({"path": "sub"}), E_IS_DIRECTORY).await;
        assert!(failure.suggestion.as_deref().is_some_and(|s| s.contains("file-system__list")), "{failure:?}");
        fails(&f.root, "read", json!({"path": "."}), E_IS_DIRECTORY).await;
        put(&f.root.join("file.txt"), "x");
        fails(&f.root, "read", json!({"path": "file.txt/inner"}), codes::E_PATH_UNRESOLVABLE).await;
        // A FIFO would block a reader forever: refused before it is opened.
        let fifo = f.root.join("pipe");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|status| status.success()) {
            fails(&f.root, "read", json!({"path": "pipe"}), E_NOT_REGULAR_FILE).await;
            fails(&f.root, "write", json!({"path": "pipe", "content": "x"}), E_NOT_REGULAR_FILE).await;
            let output = ok(call(&f.root, "list", json!({})).await);
            assert!(output["entries"].as_array().is_some_and(|e| e.iter().any(|e| e["type"] == json!("other"))));
        }
    }

    // --- write -------------------------------------------------------------

    #[tokio::test]
    async fn write_creates_parents_and_replaces_atomically() {
        let f = fixture();
        let output = ok(call(&f.root, "write", json!({"path": "deep/er/new.txt", "content": "첫 줄\n"})).await);
        assert_eq!(
            output,
            json!({"path": at(&f.root, "deep/er/new.txt"), "size": 8, "written": true, "append": false})
        );
        assert_eq!(text(&f.root.join("deep/er/new.txt")), "첫 줄\n");
        // Overwriting with shorter content shrinks the file; no temporary file remains.
        let output = ok(call(&f.root, "write", json!({"path": "deep/er/new.txt", "content": "x"})).await);
        assert_eq!(output["size"], json!(1));
        assert_eq!(text(&f.root.join("deep/er/new.txt")), "x");
        assert_eq!(names(&f.root.join("deep/er")), ["new.txt"]);
        // `append: false` explicitly.
        let output = ok(call(&f.root, "write", json!({"path": "e.txt", "content": "e", "append": false})).await);
        assert_eq!(output["size"], json!(1));
        assert_eq!(names(&f.root), ["deep", "e.txt"]);
        // Writing through a link inside the workdir writes its target and keeps the link.
        link(Path::new("e.txt"), &f.root.join("alias"));
        let output = ok(call(&f.root, "write", json!({"path": "alias", "content": "via link"})).await);
        assert_eq!(output["path"], json!(at(&f.root, "e.txt")));
        assert_eq!(text(&f.root.join("e.txt")), "via link");
        assert!(fs::symlink_metadata(f.root.join("alias")).is_ok_and(|m| m.file_type().is_symlink()));
    }

    #[tokio::test]
    async fn write_keeps_the_permissions_of_the_replaced_file() {
        let f = fixture();
        let script = f.root.join("run.sh");
        put(&script, "#!/bin/sh\n");
        for mode in [0o755, 0o600, 0o640] {
            fs::set_permissions(&script, fs::Permissions::from_mode(mode)).unwrap_or_else(|e| panic!("{e}"));
            ok(call(&f.root, "write", json!({"path": "run.sh", "content": "#!/bin/sh\necho hi\n"})).await);
            let Ok(meta) = fs::metadata(&script) else { panic!("metadata") };
            assert_eq!(meta.permissions().mode() & 0o7777, mode);
        }
    }

    #[tokio::test]
    async fn append_appends_and_creates() {
        let f = fixture();
        let output = ok(call(&f.root, "write", json!({"path": "log/a.log", "content": "one\n", "append": true})).await);
        assert_eq!(output, json!({"path": at(&f.root, "log/a.log"), "size": 4, "written": true, "append": true}));
        let output = ok(call(&f.root, "write", json!({"path": "log/a.log", "content": "two\n", "append": true})).await);
        assert_eq!(output["size"], json!(8));
        assert_eq!(text(&f.root.join("log/a.log")), "one\ntwo\n");
    }

    #[tokio::test]
    async fn empty_content_is_refused_as_in_the_original() {
        let f = fixture();
        put(&f.root.join("kept.txt"), "kept");
        for append in [false, true] {
            let input = json!({"path": "kept.txt", "content": "", "append": append});
            let failure = err(call(&f.root, "write", input).await);
            assert_eq!(failure.message, "'content' must be a non-empty string");
            let input = json!({"path": "new.txt", "content": "", "append": append});
            assert!(call(&f.root, "write", input).await.is_err());
        }
        assert_eq!(text(&f.root.join("kept.txt")), "kept");
        assert!(!f.root.join("new.txt").exists());
    }

    #[tokio::test]
    async fn writes_through_hard_links_are_refused() {
        let f = fixture();
        let victim = f.outside.join("victim.txt");
        put(&victim, "untouched");
        fs::hard_link(&victim, f.root.join("linked.txt")).unwrap_or_else(|e| panic!("{e}"));
        for input in [
            json!({"path": "linked.txt", "content": "pwned"}),
            json!({"path": "linked.txt", "content": "pwned", "append": true}),
        ] {
            let failure = fails(&f.root, "write", input, codes::E_HARD_LINKED_FILE).await;
            assert!(
                failure.message.contains("'linked.txt'") && failure.message.contains("2 hard links"),
                "{failure:?}"
            );
        }
        assert_eq!(text(&victim), "untouched");
        assert_eq!(text(&f.root.join("linked.txt")), "untouched");
        // Reading is fine, and so is a file with one link.
        assert_eq!(ok(call(&f.root, "read", json!({"path": "linked.txt"})).await)["content"], json!("untouched"));
        put(&f.root.join("single.txt"), "one");
        ok(call(&f.root, "write", json!({"path": "single.txt", "content": "two", "append": true})).await);
    }

    #[tokio::test]
    async fn write_rejects_directories_and_bad_input() {
        let f = fixture();
        fs::create_dir(f.root.join("sub")).unwrap_or_else(|e| panic!("{e}"));
        fails(&f.root, "write", json!({"path": "sub", "content": "x"}), E_IS_DIRECTORY).await;
        fails(&f.root, "write", json!({"path": "sub", "content": "x", "append": true}), E_IS_DIRECTORY).await;
        fails(&f.root, "write", json!({"path": ".", "content": "x"}), E_IS_DIRECTORY).await;
        put(&f.root.join("file"), "x");
        fails(&f.root, "write", json!({"path": "file/inner.txt", "content": "x"}), codes::E_PATH_UNRESOLVABLE).await;
        let failure = err(call(&f.root, "write", json!({"path": "a.txt"})).await);
        assert_eq!(failure.message, "'content' must be a non-empty string");
        let failure = err(call(&f.root, "write", json!({"path": "a.txt", "content": "x", "append": "yes"})).await);
        assert_eq!(failure.message, "'append' must be a boolean, got string");
        let failure = err(call(&f.root, "write", json!({"path": "", "content": "x"})).await);
        assert_eq!(failure.message, "'path' must be a non-empty string");
        assert_eq!(names(&f.root), ["file", "sub"]);
    }

    #[test]
    fn a_reader_never_sees_a_partial_write() {
        let f = fixture();
        let target = f.root.join("data.txt");
        let first = "a".repeat(512 * 1024);
        let second = "b".repeat(300 * 1024);
        put(&target, &first);
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (stop, target, first, second) = (Arc::clone(&stop), target.clone(), first.clone(), second.clone());
            std::thread::spawn(move || {
                let mut reads = 0_u32;
                while !stop.load(Ordering::Relaxed) || reads == 0 {
                    let Ok(seen) = fs::read_to_string(&target) else { panic!("the target vanished") };
                    assert!(seen == first || seen == second, "a partial file of {} bytes", seen.len());
                    reads += 1;
                }
                reads
            })
        };
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread().build() else { panic!("runtime") };
        runtime.block_on(async {
            for round in 0..40 {
                let content = if round % 2 == 0 { &second } else { &first };
                ok(call(&f.root, "write", json!({"path": "data.txt", "content": content})).await);
            }
        });
        stop.store(true, Ordering::Relaxed);
        let Ok(reads) = reader.join() else { panic!("the reader failed") };
        assert!(reads > 0);
        assert_eq!(names(&f.root), ["data.txt"]);
        assert_eq!(text(&target), first);
    }

    // --- list --------------------------------------------------------------

    fn tree(root: &Path) {
        put(&root.join("b.txt"), "bb");
        put(&root.join("a/z.txt"), "zzz");
        put(&root.join("a/b/c.txt"), "c");
        put(&root.join("a.txt"), "a");
        fs::create_dir(root.join("empty")).unwrap_or_else(|e| panic!("{e}"));
    }

    fn paths_of(output: &JsonValue) -> Vec<String> {
        let Some(entries) = output["entries"].as_array() else { panic!("no entries in {output}") };
        entries.iter().filter_map(|e| e["path"].as_str().map(str::to_owned)).collect()
    }

    #[tokio::test]
    async fn list_one_level() {
        let f = fixture();
        tree(&f.root);
        let output = ok(call(&f.root, "list", json!({})).await);
        assert_eq!(
            output,
            json!({
                "path": shown(&f.root),
                "recursive": false,
                "count": 4,
                "entries": [
                    {"name": "a", "path": at(&f.root, "a"), "type": "dir"},
                    {"name": "a.txt", "path": at(&f.root, "a.txt"), "type": "file", "size": 1},
                    {"name": "b.txt", "path": at(&f.root, "b.txt"), "type": "file", "size": 2},
                    {"name": "empty", "path": at(&f.root, "empty"), "type": "dir"},
                ],
                "truncated": false,
            })
        );
        // `path` relative, `.` explicitly, and the empty string all mean the same.
        assert_eq!(ok(call(&f.root, "list", json!({"path": "."})).await), output);
        assert_eq!(ok(call(&f.root, "list", json!({"path": ""})).await), output);
        let output = ok(call(&f.root, "list", json!({"path": "a"})).await);
        assert_eq!(paths_of(&output), [at(&f.root, "a/b"), at(&f.root, "a/z.txt")]);
        assert_eq!(output["path"], json!(at(&f.root, "a")));
        let output = ok(call(&f.root, "list", json!({"path": "empty"})).await);
        assert_eq!(output["count"], json!(0));
        assert_eq!(output["entries"], json!([]));
    }

    #[tokio::test]
    async fn list_recursive_with_filters() {
        let f = fixture();
        tree(&f.root);
        let output = ok(call(&f.root, "list", json!({"recursive": true})).await);
        assert_eq!(output["recursive"], json!(true));
        assert_eq!(output["count"], json!(7));
        // Sorted by path component by component: a directory's entries follow it.
        let expected: Vec<String> =
            ["a", "a/b", "a/b/c.txt", "a/z.txt", "a.txt", "b.txt", "empty"].iter().map(|p| at(&f.root, p)).collect();
        assert_eq!(paths_of(&output), expected);
        let output = ok(call(&f.root, "list", json!({"recursive": true, "includeDirs": false})).await);
        assert_eq!(
            output["entries"],
            json!([
                {"name": "c.txt", "path": at(&f.root, "a/b/c.txt"), "type": "file", "size": 1},
                {"name": "z.txt", "path": at(&f.root, "a/z.txt"), "type": "file", "size": 3},
                {"name": "a.txt", "path": at(&f.root, "a.txt"), "type": "file", "size": 1},
                {"name": "b.txt", "path": at(&f.root, "b.txt"), "type": "file", "size": 2},
            ])
        );
        let output = ok(call(&f.root, "list", json!({"recursive": true, "includeFiles": false})).await);
        assert_eq!(paths_of(&output), [at(&f.root, "a"), at(&f.root, "a/b"), at(&f.root, "empty")]);
        let output =
            ok(call(&f.root, "list", json!({"recursive": true, "includeFiles": false, "includeDirs": false})).await);
        assert_eq!(output["count"], json!(0));
        assert_eq!(output["truncated"], json!(false));
    }

    #[tokio::test]
    async fn list_reports_missing_paths_and_files() {
        let f = fixture();
        put(&f.root.join("file.txt"), "x");
        let failure = fails(&f.root, "list", json!({"path": "nope"}), E_FILE_NOT_FOUND).await;
        assert!(failure.message.contains("nope"), "{}", failure.message);
        let failure = fails(&f.root, "list", json!({"path": "file.txt"}), E_NOT_DIRECTORY).await;
        assert!(failure.suggestion.as_deref().is_some_and(|s| s.contains("file-system__read")), "{failure:?}");
        let failure = err(call(&f.root, "list", json!({"recursive": "yes"})).await);
        assert_eq!(failure.message, "'recursive' must be a boolean, got string");
        let failure = err(call(&f.root, "list", json!({"includeDirs": 1})).await);
        assert_eq!(failure.message, "'includeDirs' must be a boolean, got integer");
        let failure = err(call(&f.root, "list", json!({"includeFiles": null, "path": 5})).await);
        assert_eq!(failure.message, "'path' must be a string, got integer");
    }

    #[tokio::test]
    async fn list_never_follows_symbolic_links() {
        let f = fixture();
        put(&f.outside.join("secret/key.txt"), "top secret");
        put(&f.root.join("real/inner.txt"), "in");
        put(&f.root.join("plain.txt"), "p");
        link(&f.outside.join("secret"), &f.root.join("out-dir"));
        link(&f.outside.join("secret/key.txt"), &f.root.join("out-file"));
        link(&f.root.join("real"), &f.root.join("in-dir"));
        link(Path::new("plain.txt"), &f.root.join("in-file"));
        link(Path::new("nowhere"), &f.root.join("broken"));
        // A loop back to the root would never end if followed.
        link(&f.root, &f.root.join("real/up"));
        let output = ok(call(&f.root, "list", json!({"recursive": true})).await);
        assert_eq!(
            output["entries"],
            json!([
                {"name": "broken", "path": at(&f.root, "broken"), "type": "symlink"},
                {"name": "in-dir", "path": at(&f.root, "in-dir"), "type": "symlink", "targetType": "dir"},
                {"name": "in-file", "path": at(&f.root, "in-file"), "type": "symlink", "targetType": "file"},
                {"name": "out-dir", "path": at(&f.root, "out-dir"), "type": "symlink"},
                {"name": "out-file", "path": at(&f.root, "out-file"), "type": "symlink"},
                {"name": "plain.txt", "path": at(&f.root, "plain.txt"), "type": "file", "size": 1},
                {"name": "real", "path": at(&f.root, "real"), "type": "dir"},
                {"name": "inner.txt", "path": at(&f.root, "real/inner.txt"), "type": "file", "size": 2},
                {"name": "up", "path": at(&f.root, "real/up"), "type": "symlink", "targetType": "dir"},
            ])
        );
        assert_eq!(output["truncated"], json!(false));
        assert!(!output.to_string().contains("key.txt"), "the outside directory was read: {output}");
        // Links are filtered by what they point to; unknown targets count as files.
        let output = ok(call(&f.root, "list", json!({"includeFiles": false})).await);
        assert_eq!(paths_of(&output), [at(&f.root, "in-dir"), at(&f.root, "real")]);
        let output = ok(call(&f.root, "list", json!({"includeDirs": false})).await);
        assert_eq!(
            paths_of(&output),
            ["broken", "in-file", "out-dir", "out-file", "plain.txt"].map(|p| at(&f.root, p))
        );
        // Listing through a link that stays inside works and shows the real path.
        let output = ok(call(&f.root, "list", json!({"path": "in-dir"})).await);
        assert_eq!(output["path"], json!(at(&f.root, "real")));
        assert_eq!(output["count"], json!(2));
    }

    #[tokio::test]
    async fn list_is_bounded_in_entries() {
        let f = fixture();
        let many = f.root.join("many");
        fs::create_dir(&many).unwrap_or_else(|e| panic!("{e}"));
        for index in 0..MAX_LIST_ENTRIES + 5 {
            File::create(many.join(format!("f{index:05}"))).unwrap_or_else(|e| panic!("{e}"));
        }
        let output = ok(call(&f.root, "list", json!({"recursive": true})).await);
        assert_eq!(output["count"], json!(MAX_LIST_ENTRIES));
        assert_eq!(output["truncated"], json!(true));
        let note = output["note"].as_str().unwrap_or_default();
        assert!(note.contains("only the first 10000 entries"), "{note}");
        // The cut listing is the head of the sorted listing.
        let listed = paths_of(&output);
        assert_eq!(listed.first(), Some(&at(&f.root, "many")));
        assert_eq!(listed.get(1), Some(&at(&f.root, "many/f00000")));
        assert_eq!(listed.last(), Some(&at(&f.root, "many/f09998")));
        // Narrowed, it fits.
        let output = ok(call(&f.root, "list", json!({"recursive": true, "includeFiles": false})).await);
        assert_eq!(output["count"], json!(1));
        assert_eq!(output["truncated"], json!(false));
        assert!(output.get("note").is_none());
    }

    #[tokio::test]
    async fn list_is_bounded_in_depth() {
        let f = fixture();
        let levels: Vec<String> = (0..MAX_LIST_DEPTH + 3).map(|level| format!("d{level}")).collect();
        let deepest = f.root.join(levels.join("/"));
        put(&deepest.join("bottom.txt"), "deep");
        let output = ok(call(&f.root, "list", json!({"recursive": true})).await);
        assert_eq!(output["count"], json!(MAX_LIST_DEPTH));
        assert_eq!(output["truncated"], json!(true));
        let note = output["note"].as_str().unwrap_or_default();
        assert!(note.contains("more than 32 levels deep"), "{note}");
        let listed = paths_of(&output);
        assert_eq!(listed.last(), Some(&at(&f.root, &levels[..MAX_LIST_DEPTH].join("/"))));
    }

    #[tokio::test]
    async fn list_goes_on_past_unreadable_subdirectories() {
        let f = fixture();
        put(&f.root.join("locked/hidden.txt"), "x");
        put(&f.root.join("open/seen.txt"), "y");
        fs::set_permissions(f.root.join("locked"), fs::Permissions::from_mode(0o000)).unwrap_or_else(|e| panic!("{e}"));
        // Root can read anything; the rule is only observable for other users.
        let readable = fs::read_dir(f.root.join("locked")).is_ok();
        let output = ok(call(&f.root, "list", json!({"recursive": true})).await);
        fs::set_permissions(f.root.join("locked"), fs::Permissions::from_mode(0o755)).unwrap_or_else(|e| panic!("{e}"));
        assert!(paths_of(&output).contains(&at(&f.root, "open/seen.txt")));
        if !readable {
            assert_eq!(output["truncated"], json!(true));
            let note = output["note"].as_str().unwrap_or_default();
            assert!(note.contains("1 subdirectory could not be read") && note.contains("locked"), "{note}");
        }
    }

    // --- mkdir -------------------------------------------------------------

    #[tokio::test]
    async fn mkdir_creates_and_reports_existing_directories() {
        let f = fixture();
        let output = ok(call(&f.root, "mkdir", json!({"path": "a/b/c"})).await);
        assert_eq!(output, json!({"path": at(&f.root, "a/b/c"), "created": true, "recursive": true}));
        assert!(f.root.join("a/b/c").is_dir());
        let output = ok(call(&f.root, "mkdir", json!({"path": "a/b/c"})).await);
        assert_eq!(output, json!({"path": at(&f.root, "a/b/c"), "created": false, "recursive": true}));
        let output = ok(call(&f.root, "mkdir", json!({"path": "a/d", "recursive": false})).await);
        assert_eq!(output, json!({"path": at(&f.root, "a/d"), "created": true, "recursive": false}));
        let output = ok(call(&f.root, "mkdir", json!({"path": "a/d", "recursive": false})).await);
        assert_eq!(output["created"], json!(false));
        let output = ok(call(&f.root, "mkdir", json!({"path": "."})).await);
        assert_eq!(output, json!({"path": shown(&f.root), "created": false, "recursive": true}));
    }

    #[tokio::test]
    async fn mkdir_failures() {
        let f = fixture();
        let failure = fails(&f.root, "mkdir", json!({"path": "x/y", "recursive": false}), E_FILE_NOT_FOUND).await;
        assert!(failure.message.contains("parent directory does not exist"), "{}", failure.message);
        assert!(failure.suggestion.as_deref().is_some_and(|s| s.contains("recursive: true")), "{failure:?}");
        assert!(!f.root.join("x").exists());
        put(&f.root.join("file"), "x");
        let failure = fails(&f.root, "mkdir", json!({"path": "file"}), E_ALREADY_EXISTS).await;
        assert!(failure.message.contains("file"), "{}", failure.message);
        fails(&f.root, "mkdir", json!({"path": "file/sub"}), codes::E_PATH_UNRESOLVABLE).await;
        let failure = err(call(&f.root, "mkdir", json!({"path": "z", "recursive": "no"})).await);
        assert_eq!(failure.message, "'recursive' must be a boolean, got string");
        let failure = err(call(&f.root, "mkdir", json!({})).await);
        assert_eq!(failure.message, "'path' must be a non-empty string");
    }

    // --- confinement ---------------------------------------------------------

    /// Every export refuses `path` with E_PATH_OUTSIDE_WORKDIR and leaves the
    /// outside directory as it was.
    async fn all_exports_refuse(f: &Fixture, path: &str) {
        let before = names(&f.outside);
        let attempts = [
            ("read", json!({"path": path})),
            ("write", json!({"path": path, "content": "pwned"})),
            ("write", json!({"path": path, "content": "pwned", "append": true})),
            ("list", json!({"path": path, "recursive": true})),
            ("mkdir", json!({"path": path})),
            ("mkdir", json!({"path": path, "recursive": false})),
        ];
        for (export, input) in attempts {
            let failure = fails(&f.root, export, input, codes::E_PATH_OUTSIDE_WORKDIR).await;
            // Only the path as sent: not where it leads, nor whether that exists.
            let expected = format!("path '{path}' is outside the instance's working directory");
            assert_eq!(failure.message, expected, "{export}");
            assert!(failure.suggestion.as_deref().is_some_and(|s| s.contains("GOONDAN_FS_ALLOW_ROOTS")));
        }
        assert_eq!(names(&f.outside), before, "{path} changed the outside directory");
        if let Ok(secret) = fs::read_to_string(f.outside.join("secret.txt")) {
            assert_eq!(secret, "secret");
        }
    }

    #[tokio::test]
    async fn escapes_are_refused_by_every_export() {
        let f = fixture();
        put(&f.outside.join("secret.txt"), "secret");
        put(&f.outside.join("dir/inner.txt"), "inner");
        put(&f.root.join("sub/ok.txt"), "ok");
        let outside_name = f.outside.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let dotdot = format!("../{outside_name}/secret.txt");
        let deep_dotdot = format!("sub/../../{outside_name}/dir");
        let absolute = shown(&f.outside.join("secret.txt"));
        let absolute_new = shown(&f.outside.join("new/dir"));
        link(&f.outside.join("secret.txt"), &f.root.join("file-link"));
        link(&f.outside, &f.root.join("dir-link"));
        link(&f.outside.join("created-through-link.txt"), &f.root.join("dangling"));
        link(&f.outside.join("missing-dir"), &f.root.join("dangling-dir"));
        link(Path::new("../.."), &f.root.join("sub/relative-up"));
        for path in [
            "..",
            "../",
            dotdot.as_str(),
            deep_dotdot.as_str(),
            absolute.as_str(),
            absolute_new.as_str(),
            "/etc/passwd",
            "/",
            "file-link",
            "dir-link",
            "dir-link/secret.txt",
            "dir-link/dir/new",
            "dangling",
            "dangling-dir/x.txt",
            "sub/relative-up",
            "sub/relative-up/etc",
        ] {
            all_exports_refuse(&f, path).await;
        }
        assert!(!f.outside.join("created-through-link.txt").exists());
        assert!(!f.outside.join("missing-dir").exists());
    }

    /// Settings guarding a bundle in `root`, with `config` on its file-system item.
    fn guarded(root: &Path, config: JsonValue) -> Arc<BaseSettings> {
        let files: Vec<PathBuf> =
            ["goondan.yaml", "goondan.lock.yaml", "prompts/system.md", "tools/x.ts"].map(|f| root.join(f)).to_vec();
        let fs_guard = FsGuard::new(&files, config.as_object());
        Arc::new(BaseSettings { fs_guard, ..BaseSettings::default() })
    }

    #[tokio::test]
    async fn the_bundles_own_files_and_dot_env_are_protected() {
        let f = fixture();
        for file in ["goondan.yaml", "prompts/system.md", "tools/x.ts", ".env", "sub/.env.local", ".envs/prod/db"] {
            put(&f.root.join(file), "original");
        }
        fs::create_dir(f.root.join("x")).unwrap_or_else(|e| panic!("{e}"));
        link(Path::new("goondan.yaml"), &f.root.join("alias.yaml"));
        link(Path::new(".env"), &f.root.join("notes"));
        let settings = guarded(&f.root, json!(null));
        let refused = |export: &'static str, input: JsonValue| {
            let settings = Arc::clone(&settings);
            let root = f.root.clone();
            async move {
                let sent = input["path"].as_str().unwrap_or_default().to_owned();
                let failure = err(call_with(&settings, &root, export, input).await);
                assert_eq!(code(&failure), codes::E_PATH_PROTECTED, "{export} {sent}: {failure:?}");
                assert!(failure.message.starts_with(&format!("path '{sent}' is protected")), "{failure:?}");
                assert!(!failure.message.contains(&shown(&root)), "{failure:?}");
                assert!(failure.suggestion.as_deref().is_some_and(|s| s.contains(": true}")), "{failure:?}");
            }
        };
        for path in ["goondan.yaml", "./x/../goondan.yaml", "alias.yaml", "prompts/system.md", "tools/x.ts"] {
            refused("write", json!({"path": path, "content": "pwned"})).await;
            refused("write", json!({"path": path, "content": "pwned", "append": true})).await;
        }
        // The lock file is protected before it exists, from writes and mkdir.
        refused("write", json!({"path": "goondan.lock.yaml", "content": "x"})).await;
        refused("mkdir", json!({"path": "goondan.lock.yaml"})).await;
        assert!(!f.root.join("goondan.lock.yaml").exists());
        for path in [".env", "sub/.env.local", ".envs/prod/db", "notes", ".env.new"] {
            refused("read", json!({"path": path})).await;
            refused("write", json!({"path": path, "content": "pwned"})).await;
        }
        for file in ["goondan.yaml", "prompts/system.md", "tools/x.ts", ".env", "sub/.env.local"] {
            assert_eq!(text(&f.root.join(file)), "original", "{file}");
        }
        // Reading the bundle is fine, and so is everything else.
        let output = ok(call_with(&settings, &f.root, "read", json!({"path": "goondan.yaml"})).await);
        assert_eq!(output["content"], json!("original"));
        ok(call_with(&settings, &f.root, "write", json!({"path": "notes.md", "content": "n"})).await);
        // Without a bundle (default settings), .env files are still refused.
        fails(&f.root, "read", json!({"path": ".env"}), codes::E_PATH_PROTECTED).await;
        // The Tool config lifts each rule.
        let lifted = guarded(&f.root, json!({"allowConfigWrites": true, "allowDotEnv": true}));
        ok(call_with(&lifted, &f.root, "write", json!({"path": "goondan.yaml", "content": "new"})).await);
        assert_eq!(text(&f.root.join("goondan.yaml")), "new");
        let output = ok(call_with(&lifted, &f.root, "read", json!({"path": ".env"})).await);
        assert_eq!(output["content"], json!("original"));
        let only_config = guarded(&f.root, json!({"allowConfigWrites": true}));
        let failure = err(call_with(&only_config, &f.root, "read", json!({"path": ".env"})).await);
        assert_eq!(code(&failure), codes::E_PATH_PROTECTED);
    }

    #[tokio::test]
    async fn extra_roots_allow_an_outside_directory() {
        let f = fixture();
        put(&f.outside.join("shared.txt"), "shared");
        let widened = Arc::new(BaseSettings { extra_fs_roots: vec![f.outside.clone()], ..BaseSettings::default() });
        let shared = shown(&f.outside.join("shared.txt"));
        let output = ok(call_with(&widened, &f.root, "read", json!({"path": shared})).await);
        assert_eq!(output["content"], json!("shared"));
        link(&f.outside, &f.root.join("data"));
        let output = ok(call_with(&widened, &f.root, "write", json!({"path": "data/new.txt", "content": "n"})).await);
        assert_eq!(output["path"], json!(shown(&f.outside.join("new.txt"))));
        assert_eq!(text(&f.outside.join("new.txt")), "n");
        let output = ok(call_with(&widened, &f.root, "mkdir", json!({"path": shown(&f.outside.join("m/n"))})).await);
        assert_eq!(output["created"], json!(true));
        let output = ok(call_with(&widened, &f.root, "list", json!({"path": "data", "recursive": true})).await);
        assert_eq!(paths_of(&output), ["m", "m/n", "new.txt", "shared.txt"].map(|p| shown(&f.outside.join(p))));
        // The link into the extra root now has a known target.
        let output = ok(call_with(&widened, &f.root, "list", json!({})).await);
        assert_eq!(output["entries"][0]["targetType"], json!("dir"));
        // Without the setting, the same calls are refused.
        fails(&f.root, "read", json!({"path": shared}), codes::E_PATH_OUTSIDE_WORKDIR).await;
        // Only the listed roots: their parent is still outside.
        let parent = f.outside.parent().map(shown).unwrap_or_default();
        let failure = err(call_with(&widened, &f.root, "list", json!({"path": parent})).await);
        assert_eq!(code(&failure), codes::E_PATH_OUTSIDE_WORKDIR);
    }

    // --- dispatch and the executor -------------------------------------------

    #[test]
    fn unknown_exports_have_no_handler() {
        for export in ["read", "write", "list", "mkdir"] {
            assert!(handler(export, &settings()).is_some(), "{export}");
        }
        for export in ["exists", "delete", "", "READ"] {
            assert!(handler(export, &settings()).is_none(), "{export}");
        }
        assert!(crate::native_handler("file-system", "list", &settings()).is_some());
    }

    #[test]
    fn works_outside_a_runtime() {
        let f = fixture();
        put(&f.root.join("a.txt"), "abc");
        let Some(handler) = handler("read", &settings()) else { panic!("no read handler") };
        let ctx = context_in("file-system__read", &f.root);
        let input = object(json!({"path": "a.txt"}));
        let mut future = handler.call(&ctx, &input);
        let Poll::Ready(result) = future.as_mut().poll(&mut Context::from_waker(Waker::noop())) else {
            panic!("read did not finish outside a runtime")
        };
        assert_eq!(ok(result)["content"], json!("abc"));
    }

    async fn execute(workdir: &Path, export: &str, args: JsonValue) -> ToolResult {
        let executor = Executor::new("file-system", &settings());
        assert_eq!(executor.catalog.iter().count(), 4);
        executor.run_in(workdir, export, args).await
    }

    fn error_code(result: &ToolResult) -> String {
        assert!(result.is_error(), "expected an error, got {result:?}");
        result.error.as_ref().and_then(|e| e.code.clone()).unwrap_or_default()
    }

    #[tokio::test]
    async fn the_executor_checks_the_schema_first() {
        let f = fixture();
        put(&f.root.join("a.txt"), "abc");
        let rejected = [
            ("read", json!({})),
            ("read", json!({"path": 1})),
            ("read", json!({"path": "a.txt", "maxBytes": "10"})),
            ("read", json!({"path": "a.txt", "encoding": "utf-8"})),
            ("write", json!({"path": "b.txt"})),
            ("write", json!({"content": "x"})),
            ("write", json!({"path": "b.txt", "content": 5})),
            ("write", json!({"path": "b.txt", "content": "x", "append": "yes"})),
            ("write", json!({"path": "b.txt", "content": "x", "mode": "append"})),
            ("list", json!({"path": ["a"]})),
            ("list", json!({"recursive": 1})),
            ("list", json!({"includeDirs": "true"})),
            ("list", json!({"includeFiles": null})),
            ("mkdir", json!({})),
            ("mkdir", json!({"path": "d", "recursive": "false"})),
        ];
        for (export, args) in rejected {
            let shown_args = args.to_string();
            let result = execute(&f.root, export, args).await;
            assert_eq!(error_code(&result), "E_TOOL_INVALID_ARGS", "{export} {shown_args}: {result:?}");
        }
        assert_eq!(names(&f.root), ["a.txt"], "a rejected call touched the workdir");
        // Valid calls reach the handler.
        let result = execute(&f.root, "read", json!({"path": "a.txt", "maxBytes": 2})).await;
        assert!(!result.is_error(), "{result:?}");
        assert_eq!(
            result.output,
            Some(json!({"path": at(&f.root, "a.txt"), "size": 3, "truncated": true, "content": "ab"}))
        );
        let result = execute(&f.root, "list", json!({})).await;
        assert_eq!(result.output.as_ref().map(|o| o["count"].clone()), Some(json!(1)));
        // Range errors come from the handler.
        let result = execute(&f.root, "read", json!({"path": "a.txt", "maxBytes": 0})).await;
        assert_eq!(error_code(&result), "E_TOOL");
    }

    #[tokio::test]
    async fn the_executor_keeps_codes_and_truncates_messages_to_2000_characters() {
        let f = fixture();
        let result = execute(&f.root, "read", json!({"path": "../escape.txt"})).await;
        assert_eq!(error_code(&result), codes::E_PATH_OUTSIDE_WORKDIR);
        let error = result.error.as_ref();
        assert_eq!(error.and_then(|e| e.name.as_deref()), Some("PathOutsideWorkdirError"));
        assert!(error.and_then(|e| e.suggestion.as_deref()).is_some());
        let long = format!("{}/missing.txt", "d".repeat(200));
        let long = [long.as_str(); 9].join("/");
        let result = execute(&f.root, "read", json!({"path": long})).await;
        assert_eq!(error_code(&result), E_FILE_NOT_FOUND);
        let message = result.error.map(|e| e.message).unwrap_or_default();
        assert_eq!(message.chars().count(), 2000, "{message}");
        assert!(message.ends_with("... (truncated)"), "{message}");
    }
}
