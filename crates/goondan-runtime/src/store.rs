//! Durable conversations: the state root, one workspace per project, and
//! one directory per agent instance.
//!
//! ```text
//! <state root>/                     --state-root, else GOONDAN_STATE_ROOT, else ~/.goondan
//!   workspaces/
//!     <workspace id>/               one project: the slug of its Swarm's instance key (the original's)
//!       workspace.json              whose state it is: the canonical path of the bundle file
//!       instances/
//!         <agent>@<key>/            one agent instance: agent name and instance key, each
//!                                   percent-encoded (see below), e.g. assistant@default
//!           instance.json           metadata; replaced atomically (temp file + fsync + rename)
//!           messages.jsonl          the conversation as a log of message events, one commit per line
//!           events.jsonl            the event log: one runtime event per line, append-only
//!           lock                    locked by the process running the instance; holds its pid
//!           extensions/<name>.json  each extension's state (see crate::extension_state)
//!   instances/                      the old layouts (<agent>@<key>, and before that <key>): moved on use
//! ```
//!
//! A workspace is the original's namespace (`workspaces/<workspaceId>/`,
//! the id a slug of the Swarm's `instanceKey`, else its name). Two bundles
//! whose Swarms share a name would share it, and the second would continue
//! the first one's conversations; so a workspace keeps its bundle's
//! identity in workspace.json, and [`open_workspace`] refuses another
//! bundle ([`StoreError::ForeignWorkspace`]) unless asked to take it over.
//!
//! An agent instance is a pair (agent name, instance key). In a swarm every
//! agent keeps its own conversation and event log for a key, and is run by
//! its own process, so agents that share a key (`assistant` and `planner`
//! on `default`) get a directory each.
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
//! Agent names and instance keys are user-chosen strings (`user:42/chat`).
//! Each is encoded alike: `[A-Za-z0-9._-]` kept, every other byte of its
//! UTF-8 percent-encoded (`user%3A42%2Fchat`), so neither holds a path
//! separator or an `@`; the directory name is the two joined with `@`,
//! which splits back at its only `@` ([`parse_instance_dir_name`]). Empty
//! names, `.` and `..` are refused for both, and so is a pair whose
//! directory name would exceed 255 bytes. instance.json holds the real
//! pair, checked on open and delete so that two instances can never share a
//! directory (say, on a case-insensitive file system).
//!
//! Earlier versions kept every bundle's instances directly under
//! `<root>/instances/` (`<agent>@<key>`, and before that `<encoded key>`
//! whatever the agent). When a bundle opens its workspace, the instances
//! whose instance.json names that bundle are moved in, each by one rename
//! ([`migrate_legacy_instances`]), so nothing is copied or lost; the others
//! stay for their own bundles, and [`list_instances`] shows them. A
//! directory is never deleted or overwritten to migrate: if the new one
//! exists already, the old one is left alone with a warning.
//!
//! One process at a time runs an instance: [`InstanceStore::lock`] takes an
//! advisory lock on its `lock` file and writes the process id into it.
//! [`lock_status`] tells whether a process holds it now (and which), and
//! [`delete_instances`] refuses to delete a held instance.
//!
//! The state root holds every conversation, so it is the user's alone,
//! whatever the umask: every directory the store makes is created 0700
//! ([`create_private_dir_all`], missing parents included, the root itself
//! among them) and every file 0600 ([`private_file`]), and a file replaced
//! through a temp file takes the temp file's 0600. What a caller of this
//! crate writes under the root should go through the same two functions.
//! A root made looser by hand or by an earlier version is not changed here
//! (`gdn doctor` reports it and `gdn doctor --fix` tightens it).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use goondan_core::message::now_millis;
use goondan_core::{ConversationState, Message, MessageEvent, RepairReport};
use goondan_journal::Journal;
use serde::{Deserialize, Serialize};

/// The `tracing` target of the store's warnings.
const LOG_TARGET: &str = "goondan::store";

/// The longest directory name most file systems accept, in bytes.
const MAX_DIR_NAME_BYTES: usize = 255;

/// How often [`InstanceStore::lock`] tries again when the lock is taken,
/// and how long it waits before each try: long enough to outlast an
/// inspector's test of the lock, short enough not to be noticed.
const LOCK_RETRIES: u32 = 3;
const LOCK_RETRY_DELAY: std::time::Duration = std::time::Duration::from_millis(10);

/// The mode of every directory under the state root (and of the root): the user's only.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// The mode of every file under the state root.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// Creates `dir` and whatever parents are missing, each new one with mode
/// [`PRIVATE_DIR_MODE`] (the umask can only narrow it); an existing
/// directory is left as it is. For every directory under the state root.
pub fn create_private_dir_all(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(PRIVATE_DIR_MODE).create(dir)
}

/// Options whose new file gets mode [`PRIVATE_FILE_MODE`] (nothing is
/// set: read, write, create are the caller's). For every file under the
/// state root.
pub fn private_file() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.mode(PRIVATE_FILE_MODE);
    options
}

/// A failure of the store; every variant says what was being done and where.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Neither `--state-root`, `GOONDAN_STATE_ROOT` nor a home directory is known.
    #[error(
        "resolving the state root: no --state-root option, no GOONDAN_STATE_ROOT and no home directory; \
         pass --state-root PATH"
    )]
    NoStateRoot,
    /// The agent name or instance key cannot name a directory.
    #[error("storing instance {} under {path}: {reason}", describe_instance(.agent, .key))]
    InvalidKey {
        /// The agent name (empty when every agent's instances of `key` were meant).
        agent: String,
        /// The instance key.
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
        "instance {} is in use by another process{} (lock {path}); wait for it to finish or use another --instance-key",
        describe_instance(.agent, .key),
        pid_note(*.pid)
    )]
    Busy {
        /// The agent name.
        agent: String,
        /// The instance key.
        key: String,
        /// The lock file.
        path: PathBuf,
        /// The id of the process that holds the lock, as it wrote it in the
        /// lock file (unknown for processes of earlier versions).
        pid: Option<u32>,
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
    /// The workspace holds the state of another bundle (its workspace.json
    /// names it): two projects whose Swarms share an instance key.
    #[error(
        "workspace '{workspace}' ({}) holds the conversations of bundle {owner}, not of bundle {bundle}",
        dir.display()
    )]
    ForeignWorkspace {
        /// The workspace id.
        workspace: String,
        /// The workspace directory.
        dir: PathBuf,
        /// The bundle whose state it holds.
        owner: String,
        /// The bundle that asked.
        bundle: String,
    },
    /// The store's lock was poisoned by a panic while saving.
    #[error("the conversation store is unavailable: an earlier save panicked")]
    Poisoned,
    /// The background task that saves could not run.
    #[error("saving the conversation: the background writer failed: {0}")]
    Background(String),
    /// The instance directory holds another instance (its instance.json
    /// names another agent or key).
    #[error(
        "opening instance {}: {path} belongs to instance {}",
        describe_instance(.expected_agent, .expected_key),
        describe_instance(.found_agent, .found_key)
    )]
    KeyMismatch {
        /// The instance.json that was read.
        path: PathBuf,
        /// The agent name asked for.
        expected_agent: String,
        /// The key asked for.
        expected_key: String,
        /// The agent name instance.json holds.
        found_agent: String,
        /// The key instance.json holds.
        found_key: String,
    },
}

/// `"key" of agent "agent"`, or `"key"` when no agent is meant.
fn describe_instance(agent: &str, key: &str) -> String {
    if agent.is_empty() { format!("{key:?}") } else { format!("{key:?} of agent {agent:?}") }
}

/// ` (pid N)`, or nothing if the pid is unknown.
fn pid_note(pid: Option<u32>) -> String {
    pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default()
}

impl StoreError {
    /// A journal's failure as the store says it (`op`, when given, says
    /// what the store was doing instead of the journal's word for it).
    fn from_journal(error: goondan_journal::JournalError, op: Option<&'static str>) -> Self {
        use goondan_journal::JournalError;
        match error {
            JournalError::Io { op: journal_op, path, source } => {
                Self::Io { op: op.unwrap_or(journal_op), path, source }
            }
            JournalError::Corrupt { path, source, .. } => Self::Json { op: op.unwrap_or("reading"), path, source },
            JournalError::Poisoned { .. } => Self::Poisoned,
        }
    }

    fn io(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Self {
        move |source| Self::Io { op, path: path.to_path_buf(), source }
    }

    fn json(op: &'static str, path: &Path) -> impl FnOnce(serde_json::Error) -> Self {
        move |source| Self::Json { op, path: path.to_path_buf(), source }
    }
}

/// The state root: every project's workspace, and what earlier versions
/// left directly under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRoot {
    path: PathBuf,
}

impl StateRoot {
    /// The environment variable that names the state root.
    pub const ENV_VAR: &'static str = "GOONDAN_STATE_ROOT";
    /// The state root's directory under the home directory.
    pub const HOME_DIR_NAME: &'static str = ".goondan";
    /// The directory under the state root that holds one directory per workspace.
    pub const WORKSPACES_DIR_NAME: &'static str = "workspaces";

    /// A state root at `path` (nothing is created until a workspace is opened).
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

    /// `<root>/workspaces`.
    pub fn workspaces_dir(&self) -> PathBuf {
        self.path.join(Self::WORKSPACES_DIR_NAME)
    }

    /// `<root>/workspaces/<id>` (`id` as [`workspace_id`] makes it).
    pub fn workspace_dir(&self, id: &str) -> PathBuf {
        self.workspaces_dir().join(id)
    }

    /// `<root>/instances`, where earlier versions kept every bundle's
    /// instances (`<agent>@<key>`, and before that `<key>`).
    pub fn legacy_instances_dir(&self) -> PathBuf {
        self.path.join(Workspace::INSTANCES_DIR_NAME)
    }
}

/// The id of the workspace of a Swarm whose instance key
/// (`spec.instanceKey`, else its name) is `name`: the original's slug —
/// trimmed, lower-cased, every character but `[a-z0-9._-]` a `-`, runs of
/// `-` one, no `-` at either end, at most 128 characters, `default` if
/// nothing is left. `.` and `..`, which name directories, become `default`
/// too (the original would use them as they are).
pub fn workspace_id(name: &str) -> String {
    let mut slug = String::with_capacity(name.len());
    for c in name.trim().chars().flat_map(char::to_lowercase) {
        let c = if c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-') { c } else { '-' };
        if !(c == '-' && slug.ends_with('-')) {
            slug.push(c);
        }
    }
    let slug: String = slug.trim_matches('-').chars().take(128).collect();
    if slug.is_empty() || slug == "." || slug == ".." { "default".to_owned() } else { slug }
}

/// workspace.json: whose state a workspace holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceInfo {
    /// The directory name under `workspaces/`.
    pub workspace_id: String,
    /// The Swarm instance key (or name) the id was made from.
    pub name: String,
    /// The canonical path of the bundle file whose state this is: the
    /// project's identity. Another bundle is refused
    /// ([`StoreError::ForeignWorkspace`]).
    pub bundle: String,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at: u64,
}

/// One project's part of the state root, `workspaces/<id>/`: its
/// workspace.json and one directory per agent instance under `instances/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    dir: PathBuf,
    id: String,
    info: Option<WorkspaceInfo>,
}

/// What [`open_workspace`] may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkspaceAccess {
    /// Only look: nothing is created or moved (`gdn tool list`); a
    /// workspace of another bundle is still refused.
    Inspect,
    /// Create the workspace if missing, move this bundle's instances of the
    /// old layouts into it; refuse a workspace of another bundle.
    Use,
    /// As `Use`, and take over a workspace of another bundle (a project
    /// that moved): workspace.json is rewritten to name this bundle.
    Adopt,
}

impl Workspace {
    /// The metadata file of a workspace.
    pub const INFO_FILE: &'static str = "workspace.json";
    /// The directory of a workspace that holds one directory per instance.
    pub const INSTANCES_DIR_NAME: &'static str = "instances";

    /// The workspace at `dir`, taken as it is (nothing read or checked):
    /// for an agent process that was handed the directory its orchestrator
    /// opened, and for tests.
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        let id = dir.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        Self { dir, id, info: None }
    }

    /// The workspace directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its id (the directory name).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its workspace.json, if it was read (not for [`Workspace::at`], nor
    /// for a workspace [`WorkspaceAccess::Inspect`] found missing).
    pub fn info(&self) -> Option<&WorkspaceInfo> {
        self.info.as_ref()
    }

    /// `<workspace>/instances`.
    pub fn instances_dir(&self) -> PathBuf {
        self.dir.join(Self::INSTANCES_DIR_NAME)
    }

    /// The directory of the instance of `agent` for `key` (which need not
    /// exist), or [`StoreError::InvalidKey`] for a pair that cannot name one.
    /// Every instance directory of the workspace with its agent and key
    /// (as its name says them), in no particular order; nothing if there
    /// are none (or the directory cannot be read).
    pub fn instance_dirs(&self) -> Vec<(String, String, PathBuf)> {
        let Ok(entries) = fs::read_dir(self.instances_dir()) else { return Vec::new() };
        entries
            .flatten()
            .filter_map(|entry| {
                let (agent, key) = entry.file_name().to_str().and_then(parse_instance_dir_name)?;
                Some((agent, key, entry.path()))
            })
            .collect()
    }

    pub fn instance_dir(&self, agent: &str, key: &str) -> Result<PathBuf, StoreError> {
        let instances = self.instances_dir();
        match encode_instance(agent, key) {
            Ok(name) => Ok(instances.join(name)),
            Err(reason) => {
                Err(StoreError::InvalidKey { agent: agent.to_owned(), key: key.to_owned(), path: instances, reason })
            }
        }
    }
}

/// Opens the workspace of the Swarm instance key (or name) `name` for the
/// bundle whose canonical path is `bundle`: `workspaces/<workspace_id(name)>`.
///
/// A workspace remembers its bundle in workspace.json. One written by
/// another bundle (two projects whose Swarms share a name) is
/// [`StoreError::ForeignWorkspace`] unless `access` is
/// [`WorkspaceAccess::Adopt`]: one bundle never continues another's
/// conversations. A missing workspace is created (unless `Inspect`), by a
/// create-if-absent link of its workspace.json, so two processes creating it
/// at once agree on one owner. With `Use` and `Adopt`, the instances the old
/// layouts (`<root>/instances/<agent>@<key>`, `<root>/instances/<key>`) hold
/// for this bundle — their instance.json names it — are moved in
/// ([`migrate_legacy_instances`]).
pub fn open_workspace(
    root: &StateRoot,
    name: &str,
    bundle: &str,
    access: WorkspaceAccess,
) -> Result<Workspace, StoreError> {
    let id = workspace_id(name);
    let dir = root.workspace_dir(&id);
    let info_path = dir.join(Workspace::INFO_FILE);
    let found = match read_json::<WorkspaceInfo>(&info_path, "reading workspace metadata from") {
        Ok(found) => found,
        Err(error) if access == WorkspaceAccess::Adopt => {
            tracing::warn!(target: LOG_TARGET, "{error}; writing a new {}", Workspace::INFO_FILE);
            None
        }
        Err(error) => return Err(error),
    };
    // No workspace.json: create it, unless only looking. Another process
    // may create it first; then its owner is checked as any other.
    let found = match found {
        None if access != WorkspaceAccess::Inspect => Some(create_workspace(&dir, &id, name, bundle)?),
        found => found,
    };
    let info = match found {
        Some(info) if info.bundle == bundle => Some(info),
        Some(info) if access == WorkspaceAccess::Adopt => {
            tracing::warn!(
                target: LOG_TARGET,
                "workspace '{id}' ({}) held the state of bundle {}; bundle {bundle} takes it over",
                dir.display(),
                info.bundle
            );
            let adopted = WorkspaceInfo { bundle: bundle.to_owned(), ..info };
            write_json_atomically(&dir, &info_path, &adopted)?;
            Some(adopted)
        }
        Some(info) => {
            return Err(StoreError::ForeignWorkspace {
                workspace: id,
                dir,
                owner: info.bundle,
                bundle: bundle.to_owned(),
            });
        }
        None => None,
    };
    let workspace = Workspace { dir, id, info };
    if access != WorkspaceAccess::Inspect {
        migrate_legacy_instances(root, &workspace, bundle);
    }
    Ok(workspace)
}

/// The workspace of the Swarm instance key (or name) `name` under `root`
/// as it is on disk, workspace.json read if present, whatever bundle it
/// belongs to; `None` if it does not exist. For commands that name a
/// workspace directly (`gdn instance delete --workspace`).
pub fn find_workspace(root: &StateRoot, name: &str) -> Result<Option<Workspace>, StoreError> {
    let id = workspace_id(name);
    let dir = root.workspace_dir(&id);
    if !is_real_dir(&dir) {
        return Ok(None);
    }
    let info = read_json::<WorkspaceInfo>(&dir.join(Workspace::INFO_FILE), "reading workspace metadata from")?;
    Ok(Some(Workspace { dir, id, info }))
}

/// Writes workspace.json for `bundle` unless another process wrote one
/// first; returns what the file holds then (refused later if not ours).
fn create_workspace(dir: &Path, id: &str, name: &str, bundle: &str) -> Result<WorkspaceInfo, StoreError> {
    create_private_dir_all(dir).map_err(StoreError::io("creating the workspace directory", dir))?;
    let path = dir.join(Workspace::INFO_FILE);
    let info = WorkspaceInfo {
        workspace_id: id.to_owned(),
        name: name.to_owned(),
        bundle: bundle.to_owned(),
        created_at: now_millis(),
    };
    // A name of this thread's own: the link below makes the temp file and
    // workspace.json one inode, which another creator must not rewrite.
    let thread: String = format!("{:?}", std::thread::current().id()).chars().filter(char::is_ascii_digit).collect();
    let temp = dir.join(format!(".{}.{}-{thread}.tmp", Workspace::INFO_FILE, std::process::id()));
    write_synced(&temp, &info)?;
    // A link fails if the name exists: the first writer owns the workspace.
    let linked = fs::hard_link(&temp, &path);
    let _ = fs::remove_file(&temp);
    match linked {
        Ok(()) => {
            sync_dir(dir);
            Ok(info)
        }
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
            let written = read_json::<WorkspaceInfo>(&path, "reading workspace metadata from")?;
            written.ok_or_else(|| StoreError::io("creating", &path)(error))
        }
        Err(error) => Err(StoreError::io("creating", &path)(error)),
    }
}

/// Moves the instances the old layouts hold for `bundle` (their
/// instance.json names it) into `workspace`, each by one rename while its
/// lock is held; returns the directories they now have. An instance whose
/// new directory exists already, or that a process holds, stays where it is
/// with a warning; instances of other bundles stay for those bundles and
/// [`list_instances`] shows them. Failures are warnings: the old state is
/// never lost, only left.
pub fn migrate_legacy_instances(root: &StateRoot, workspace: &Workspace, bundle: &str) -> Vec<PathBuf> {
    let legacy = root.legacy_instances_dir();
    let Ok(entries) = fs::read_dir(&legacy) else { return Vec::new() };
    let mut moved = Vec::new();
    let mut others = 0_usize;
    for entry in entries.flatten() {
        let dir = entry.path();
        let Some(info) = legacy_instance_info(&dir) else { continue };
        if info.bundle != bundle {
            others += 1;
            continue;
        }
        let what = describe_instance(&info.agent_name, &info.instance_key);
        let target = match workspace.instance_dir(&info.agent_name, &info.instance_key) {
            Ok(target) => target,
            Err(error) => {
                tracing::warn!(target: LOG_TARGET, "not moving {}: {error}", dir.display());
                continue;
            }
        };
        if fs::symlink_metadata(&target).is_ok() {
            tracing::warn!(
                target: LOG_TARGET,
                "{} (the old layout) also holds instance {what}; using {} and leaving the old directory alone \
                 (move or delete one of them)",
                dir.display(),
                target.display()
            );
            continue;
        }
        let held = match hold_lock(&dir, &info.agent_name, &info.instance_key) {
            Ok(held) => held,
            Err(error) => {
                tracing::warn!(target: LOG_TARGET, "not moving {} now: {error}", dir.display());
                continue;
            }
        };
        let instances = workspace.instances_dir();
        let renamed = create_private_dir_all(&instances).and_then(|()| fs::rename(&dir, &target));
        drop(held);
        match renamed {
            Ok(()) => {
                sync_dir(&instances);
                sync_dir(&legacy);
                tracing::info!(target: LOG_TARGET, "moved instance {what} from {} to {}", dir.display(), target.display());
                moved.push(target);
            }
            Err(error) => {
                tracing::warn!(target: LOG_TARGET, "moving {} to {}: {error}", dir.display(), target.display())
            }
        }
    }
    if others > 0 {
        tracing::info!(
            target: LOG_TARGET,
            "{} holds {others} instance(s) of other bundles in the old layout; each moves into its bundle's \
             workspace when that bundle runs (`gdn instance list` shows them)",
            legacy.display()
        );
    }
    // Empty now: the old layout is gone (best effort; it may not be).
    if !moved.is_empty() {
        let _ = fs::remove_dir(&legacy);
    }
    moved
}

/// The instances the old layouts still hold (directly under
/// `<root>/instances/`), with their directories: what no bundle has moved
/// into its workspace yet.
pub fn old_layout_instances(root: &StateRoot) -> Vec<(InstanceInfo, PathBuf)> {
    let legacy = root.legacy_instances_dir();
    let Ok(entries) = fs::read_dir(&legacy) else { return Vec::new() };
    let mut found: Vec<(InstanceInfo, PathBuf)> = entries
        .flatten()
        .filter_map(|entry| legacy_instance_info(&entry.path()).map(|info| (info, entry.path())))
        .collect();
    found.sort_by(|a, b| a.1.cmp(&b.1));
    found
}

/// The instance.json of an old-layout directory, if it is one whose name
/// matches the instance it holds.
fn legacy_instance_info(dir: &Path) -> Option<InstanceInfo> {
    if !is_real_dir(dir) {
        return None;
    }
    let name = dir.file_name()?.to_str()?;
    let info = read_info(&dir.join(InstanceStore::INFO_FILE)).ok()??;
    let matches = match parse_instance_dir_name(name) {
        Some((agent, key)) => agent == info.agent_name && key == info.instance_key,
        None => legacy_key_from_dir_name(name).is_some_and(|key| key == info.instance_key),
    };
    matches.then_some(info)
}

/// The directory name of the instance of `agent` for `key`
/// (`<encoded agent>@<encoded key>`), or `None` if the pair is refused
/// (either empty, `.` or `..`, or a name longer than 255 bytes).
pub fn instance_dir_name(agent: &str, key: &str) -> Option<String> {
    encode_instance(agent, key).ok()
}

/// The (agent name, instance key) a directory name encodes, or `None` if
/// `name` is not the encoding of any pair (the inverse of
/// [`instance_dir_name`]; old-layout names, which hold no `@`, are `None`).
pub fn parse_instance_dir_name(name: &str) -> Option<(String, String)> {
    // Neither encoded part holds an `@`, so the first one is the separator;
    // a second one makes the key part non-canonical, refused below.
    let (agent, key) = name.split_once('@')?;
    let (agent, key) = (decode_name(agent)?, decode_name(key)?);
    (encode_instance(&agent, &key).ok()? == name).then_some((agent, key))
}

/// The key an old-layout directory name (`<encoded key>`) encodes, or `None`.
fn legacy_key_from_dir_name(name: &str) -> Option<String> {
    let key = decode_name(name)?;
    (encode_key(&key).ok()? == name).then_some(key)
}

/// Undoes [`encode_name`]: the name whose canonical encoding (upper-case
/// hex, safe bytes kept) is `encoded`, or `None`.
fn decode_name(encoded: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(encoded.len());
    let mut rest = encoded.as_bytes();
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
    let name = String::from_utf8(bytes).ok()?;
    (encode_name(&name, usize::MAX).ok()? == encoded).then_some(name)
}

fn is_kept(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-')
}

const TOO_LONG: &str = "the agent name and instance key are too long (their directory name would exceed 255 bytes)";

/// `<encoded agent>@<encoded key>`, or why the pair cannot name a directory.
fn encode_instance(agent: &str, key: &str) -> Result<String, &'static str> {
    let agent = encode_name(agent, MAX_DIR_NAME_BYTES).map_err(|refusal| match refusal {
        NameRefusal::Empty => "an agent name must not be empty",
        NameRefusal::Dots => "the agent names `.` and `..` are refused (they name directories)",
        NameRefusal::TooLong => TOO_LONG,
    })?;
    let key = encode_name(key, MAX_DIR_NAME_BYTES).map_err(key_refusal)?;
    if agent.len() + 1 + key.len() > MAX_DIR_NAME_BYTES {
        return Err(TOO_LONG);
    }
    Ok(format!("{agent}@{key}"))
}

fn key_refusal(refusal: NameRefusal) -> &'static str {
    match refusal {
        NameRefusal::Empty => "an instance key must not be empty",
        NameRefusal::Dots => "the instance keys `.` and `..` are refused (they name directories)",
        NameRefusal::TooLong => TOO_LONG,
    }
}

/// The old layout's directory name of `key`.
fn encode_key(key: &str) -> Result<String, NameRefusal> {
    encode_name(key, MAX_DIR_NAME_BYTES)
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
    file: File,
}

impl Drop for InstanceLock {
    fn drop(&mut self) {
        // Take our pid out while still holding the lock (it is released when
        // the file closes, right after): a later holder that writes none (a
        // process of an earlier version, `flock`) is then not reported
        // under ours. Best effort; a crash leaves it, and it is only shown
        // while someone holds the lock.
        let _ = self.file.set_len(0);
    }
}

/// The metadata of an instance (its instance.json).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceInfo {
    /// The instance key as the user gave it.
    pub instance_key: String,
    /// The agent whose instance this is.
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
    /// messages.jsonl: its torn tail is cut before the first append.
    messages: Journal,
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

    /// Opens the instance of `agent_name` for `instance_key` in
    /// `workspace`, creating its directory, instance.json and message log
    /// if missing. (Instances of the old layouts are moved in when the
    /// workspace is opened: [`open_workspace`].)
    ///
    /// An existing instance keeps its times and counters; its bundle is
    /// updated to this one. An instance.json that is not valid JSON is
    /// replaced with a warning (its counters restart); one that names another
    /// agent or key is [`StoreError::KeyMismatch`]. The message log is not
    /// modified here, so [`InstanceStore::messages`] still reports a torn
    /// tail; the first [`InstanceStore::append`] cuts it.
    pub fn open(
        workspace: &Workspace,
        instance_key: &str,
        agent_name: &str,
        bundle_path: &Path,
    ) -> Result<Self, StoreError> {
        let dir = workspace.instance_dir(agent_name, instance_key)?;
        let created = !dir.is_dir();
        create_private_dir_all(&dir).map_err(StoreError::io("creating the instance directory", &dir))?;
        if created && let Some(parent) = dir.parent() {
            sync_dir(parent);
        }
        let info_path = dir.join(Self::INFO_FILE);
        let bundle = bundle_path.display().to_string();
        let (info, changed) = match read_info(&info_path) {
            Ok(Some(mut info)) => {
                if info.instance_key != instance_key || info.agent_name != agent_name {
                    return Err(StoreError::KeyMismatch {
                        path: info_path,
                        expected_agent: agent_name.to_owned(),
                        expected_key: instance_key.to_owned(),
                        found_agent: info.agent_name,
                        found_key: info.instance_key,
                    });
                }
                let changed = info.bundle != bundle;
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
        let messages = Journal::open::<LogLine>(&messages_path)
            .map_err(|error| StoreError::from_journal(error, Some("opening the message log")))?;
        let store = Self { events_path: dir.join(Self::EVENTS_FILE), dir, info_path, messages_path, info, messages };
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
    /// The first append cuts a torn tail left by a crash (the journal's
    /// rule: a last line without its newline, or that is not a commit). If
    /// the write or the sync fails, the log is cut back to where it was and
    /// the error returned.
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
        self.messages
            .append(&line, &[goondan_core::fault::Point::ConversationCommit])
            .map_err(|error| StoreError::from_journal(error, None))?;
        let appended = events.iter().filter(|event| matches!(event, MessageEvent::Append { .. })).count();
        self.info.messages += u64::try_from(appended).unwrap_or(u64::MAX);
        self.info.updated_at = now_millis();
        // The commit is durable: instance.json's counters are a summary,
        // and one that cannot be written now is written with the next.
        self.write_info_or_warn();
        Ok(())
    }

    /// Writes instance.json; a failure is logged, not returned (its
    /// counters catch up at the next write).
    fn write_info_or_warn(&self) {
        if let Err(error) = self.write_info() {
            tracing::warn!(target: LOG_TARGET, "instance.json of {} not updated: {error}", self.dir.display());
        }
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
        self.messages
            .rewrite(&temp, Some(goondan_core::fault::Point::ConversationCommit), |out| out.write_all(&lines))
            .map_err(|error| StoreError::from_journal(error, None))?;
        self.info.updated_at = now_millis();
        self.write_info_or_warn();
        Ok(())
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
    /// process ends), then writes this process's id into the file for
    /// [`lock_status`]. A second process asking for the same instance gets
    /// [`StoreError::Busy`], naming the holder's pid, instead of
    /// interleaving its writes.
    pub fn lock(&self) -> Result<InstanceLock, StoreError> {
        let path = self.dir.join(Self::LOCK_FILE);
        // Not truncated on open: until we hold the lock, the pid in it is the holder's.
        let file = private_file()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(StoreError::io("opening the lock file", &path))?;
        let mut retries = LOCK_RETRIES;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                // An inspector (`lock_status`) holds the lock for an instant
                // to test it; that is not a process running the instance.
                Err(fs::TryLockError::WouldBlock) if retries > 0 => {
                    retries -= 1;
                    std::thread::sleep(LOCK_RETRY_DELAY);
                }
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(StoreError::Busy {
                        agent: self.info.agent_name.clone(),
                        key: self.info.instance_key.clone(),
                        pid: read_pid(&file),
                        path,
                    });
                }
                Err(fs::TryLockError::Error(error)) => return Err(StoreError::io("locking", &path)(error)),
            }
        }
        // Truncate first: a shorter pid must not leave digits of a longer
        // one. The pid only informs (`gdn instance list`), so failing to
        // write it does not stop the run; nor is it synced, as it means
        // nothing after a crash (the lock is gone with the process).
        let pid = format!("{}\n", std::process::id());
        if let Err(error) =
            file.set_len(0).and_then(|()| (&file).rewind()).and_then(|()| (&file).write_all(pid.as_bytes()))
        {
            tracing::warn!(target: LOG_TARGET, "writing the pid into {}: {error}", path.display());
        }
        remove_stale_temps(&self.dir);
        Ok(InstanceLock { file })
    }

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

    fn write_info(&self) -> Result<(), StoreError> {
        goondan_core::fault::before_write(goondan_core::fault::Point::InstanceInfo)
            .map_err(StoreError::io("writing", &self.info_path))?;
        write_info_atomically(&self.dir, &self.info_path, &self.info)?;
        goondan_core::fault::after_write(goondan_core::fault::Point::InstanceInfo);
        Ok(())
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

/// Whether a process runs an instance right now: it holds the instance's
/// lock ([`InstanceStore::lock`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LockStatus {
    /// A process holds the lock.
    pub running: bool,
    /// That process's id, as it wrote it in the lock file; `None` when idle,
    /// or when the holder has not written it (yet, or ever: earlier versions
    /// did not).
    pub pid: Option<u32>,
}

/// Tells whether a process holds the lock of the instance directory `dir`
/// now, by trying to take it (shared, and released at once); the lock
/// file is not created. A pid left in the file by a process that is gone
/// is ignored: its lock went with it.
///
/// The answer can be stale as soon as it is given; [`delete_instances`]
/// takes the locks itself rather than trusting it. While it tests, the
/// lock is taken for an instant, which [`InstanceStore::lock`] rides out.
pub fn lock_status(dir: &Path) -> Result<LockStatus, StoreError> {
    let path = dir.join(InstanceStore::LOCK_FILE);
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(LockStatus::default()),
        Err(error) => return Err(StoreError::io("opening the lock file", &path)(error)),
    };
    // Shared, so that two inspectors do not see each other as the runner,
    // and so that a read-only descriptor is enough everywhere.
    match file.try_lock_shared() {
        Ok(()) => Ok(LockStatus::default()),
        Err(fs::TryLockError::WouldBlock) => Ok(LockStatus { running: true, pid: read_pid(&file) }),
        Err(fs::TryLockError::Error(error)) => Err(StoreError::io("testing the lock", &path)(error)),
    }
}

/// The pid a lock holder wrote into its lock file, if it is one.
fn read_pid(file: &File) -> Option<u32> {
    let mut text = String::new();
    let mut reader = file;
    reader.rewind().ok()?;
    // A pid is a few digits; a bigger file is not ours to read whole.
    reader.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// Takes the lock of the instance directory `dir` (for `agent` and `key`)
/// exclusively without creating the file: `Ok(None)` if there is no lock
/// file (no process ever ran the instance), [`StoreError::Busy`] if a
/// process holds it.
fn hold_lock(dir: &Path, agent: &str, key: &str) -> Result<Option<File>, StoreError> {
    let path = dir.join(InstanceStore::LOCK_FILE);
    let file = match File::options().read(true).write(true).open(&path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(StoreError::io("opening the lock file", &path)(error)),
    };
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(fs::TryLockError::WouldBlock) => {
            Err(StoreError::Busy { agent: agent.to_owned(), key: key.to_owned(), pid: read_pid(&file), path })
        }
        Err(fs::TryLockError::Error(error)) => Err(StoreError::io("locking", &path)(error)),
    }
}

/// Whether `path` is a directory itself (not a link to one).
fn is_real_dir(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|metadata| metadata.is_dir())
}

/// An instance as [`list_instances`] finds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedInstance {
    /// Its instance.json.
    #[serde(flatten)]
    pub info: InstanceInfo,
    /// The id of the workspace that holds it; `None` for an instance of the
    /// old layouts, directly under `<root>/instances`.
    pub workspace: Option<String>,
    /// The bundle its workspace belongs to (workspace.json), if known.
    pub workspace_bundle: Option<String>,
    /// Its directory (lossy in JSON for non-UTF-8 paths).
    #[serde(serialize_with = "serialize_path")]
    pub dir: PathBuf,
    /// The directory is in an old layout (not in a workspace); it moves
    /// into its bundle's workspace when that bundle runs.
    pub legacy_layout: bool,
    /// Whether a process runs it now.
    #[serde(flatten)]
    pub status: LockStatus,
}

fn serialize_path<S: serde::Serializer>(path: &Path, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&path.to_string_lossy())
}

/// The instances under `root` — of every workspace, and of the old
/// layouts — most recently updated first, read from their instance.json
/// files, each with whether a process runs it now ([`lock_status`]).
/// Directories without a readable instance.json, or whose name is not the
/// encoding of the pair it holds, are skipped with a warning. No
/// directories means no instances.
pub fn list_instances(root: &StateRoot) -> Result<Vec<ListedInstance>, StoreError> {
    let mut listed = Vec::new();
    let workspaces = root.workspaces_dir();
    for dir in sub_dirs(&workspaces)? {
        let id = dir.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        let owner = match read_json::<WorkspaceInfo>(&dir.join(Workspace::INFO_FILE), "reading workspace metadata from")
        {
            Ok(info) => info.map(|info| info.bundle),
            Err(error) => {
                tracing::warn!(target: LOG_TARGET, "{error}");
                None
            }
        };
        for (info, dir) in instances_in(&Workspace::at(&dir).instances_dir(), false)? {
            let status = status_of(&dir);
            listed.push(ListedInstance {
                info,
                workspace: Some(id.clone()),
                workspace_bundle: owner.clone(),
                dir,
                legacy_layout: false,
                status,
            });
        }
    }
    for (info, dir) in instances_in(&root.legacy_instances_dir(), true)? {
        let status = status_of(&dir);
        listed.push(ListedInstance { info, workspace: None, workspace_bundle: None, dir, legacy_layout: true, status });
    }
    listed.sort_by(|a, b| {
        b.info
            .updated_at
            .cmp(&a.info.updated_at)
            .then_with(|| a.workspace.cmp(&b.workspace))
            .then_with(|| a.info.instance_key.cmp(&b.info.instance_key))
            .then_with(|| a.info.agent_name.cmp(&b.info.agent_name))
            .then_with(|| a.dir.cmp(&b.dir))
    });
    Ok(listed)
}

fn status_of(dir: &Path) -> LockStatus {
    lock_status(dir).unwrap_or_else(|error| {
        tracing::warn!(target: LOG_TARGET, "{error}; reporting the instance as idle");
        LockStatus::default()
    })
}

/// The directories in `dir` (none if it does not exist).
fn sub_dirs(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(StoreError::io("listing", dir)(error)),
    };
    let mut dirs = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) if entry.file_type().is_ok_and(|kind| kind.is_dir()) => dirs.push(entry.path()),
            Ok(_) => {}
            Err(error) => tracing::warn!(target: LOG_TARGET, "listing {}: {error}", dir.display()),
        }
    }
    dirs.sort();
    Ok(dirs)
}

/// The instances in the directory `instances` with their directories; with
/// `legacy`, also directories of the oldest layout (`<encoded key>`).
fn instances_in(instances: &Path, legacy: bool) -> Result<Vec<(InstanceInfo, PathBuf)>, StoreError> {
    let mut found = Vec::new();
    for dir in sub_dirs(instances)? {
        let name = dir.file_name().and_then(|name| name.to_str()).unwrap_or_default().to_owned();
        // What the name says the directory holds: a pair, or (oldest layout) a key.
        let named = match parse_instance_dir_name(&name) {
            Some((agent, key)) => (Some(agent), key),
            None => match legacy_key_from_dir_name(&name).filter(|_| legacy) {
                Some(key) => (None, key),
                None => {
                    tracing::warn!(target: LOG_TARGET, "skipping {}: not an instance directory name", dir.display());
                    continue;
                }
            },
        };
        let info_path = dir.join(InstanceStore::INFO_FILE);
        let info = match read_info(&info_path) {
            Ok(Some(info)) => info,
            Ok(None) => {
                tracing::warn!(target: LOG_TARGET, "skipping {}: no {}", dir.display(), InstanceStore::INFO_FILE);
                continue;
            }
            Err(error) => {
                tracing::warn!(target: LOG_TARGET, "skipping an instance: {error}");
                continue;
            }
        };
        let (named_agent, named_key) = named;
        if info.instance_key != named_key || named_agent.is_some_and(|agent| agent != info.agent_name) {
            tracing::warn!(
                target: LOG_TARGET,
                "skipping {}: it names instance {}, which belongs in another directory",
                info_path.display(),
                describe_instance(&info.agent_name, &info.instance_key)
            );
            continue;
        }
        found.push((info, dir));
    }
    Ok(found)
}

/// An instance [`delete_instances`] deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletedInstance {
    /// The agent whose instance it was.
    pub agent_name: String,
    /// The directory that was deleted.
    pub dir: PathBuf,
    /// It was in the old layout.
    pub legacy_layout: bool,
}

/// Deletes the instance of `agent` for `key` in `workspace`; `Ok(false)`
/// if it did not exist. See [`delete_instances`].
pub fn delete_instance(root: &StateRoot, workspace: &Workspace, agent: &str, key: &str) -> Result<bool, StoreError> {
    delete_instances(root, workspace, key, Some(agent)).map(|deleted| !deleted.is_empty())
}

/// Deletes the instances of `key` in `workspace` (their whole
/// directories): every agent's, or only `agent`'s. Instances of the old
/// layouts (under `root`) that belong to the workspace's bundle (their
/// instance.json names the bundle its workspace.json names) go too.
/// Returns what was deleted; nothing if there was nothing.
///
/// All or nothing with regard to running instances: the locks of all of
/// them are taken first, and if any is held, [`StoreError::Busy`] names it
/// and nothing is deleted. A pair that cannot name an instance directory
/// (`..`) is [`StoreError::InvalidKey`]; a directory whose instance.json
/// names another pair is [`StoreError::KeyMismatch`], and nothing is
/// deleted either.
pub fn delete_instances(
    root: &StateRoot,
    workspace: &Workspace,
    key: &str,
    agent: Option<&str>,
) -> Result<Vec<DeletedInstance>, StoreError> {
    let instances = workspace.instances_dir();
    let mut found = Vec::new();
    match agent {
        Some(agent) => {
            let dir = workspace.instance_dir(agent, key)?;
            if is_real_dir(&dir) {
                found.push(DeletedInstance { agent_name: agent.to_owned(), dir, legacy_layout: false });
            }
        }
        None => {
            if let Err(refusal) = encode_key(key) {
                let reason = key_refusal(refusal);
                return Err(StoreError::InvalidKey {
                    agent: String::new(),
                    key: key.to_owned(),
                    path: instances,
                    reason,
                });
            }
            for dir in sub_dirs(&instances)? {
                let Some((agent, entry_key)) =
                    dir.file_name().and_then(|n| n.to_str()).and_then(parse_instance_dir_name)
                else {
                    continue;
                };
                if entry_key == key && is_real_dir(&dir) {
                    found.push(DeletedInstance { agent_name: agent, dir, legacy_layout: false });
                }
            }
            found.sort_by(|a, b| a.agent_name.cmp(&b.agent_name));
        }
    }
    for instance in &found {
        let info_path = instance.dir.join(InstanceStore::INFO_FILE);
        // An unreadable instance.json is no reason to keep a directory the
        // name says is this instance's; one naming another pair is.
        if let Ok(Some(info)) = read_info(&info_path)
            && (info.instance_key != key || info.agent_name != instance.agent_name)
        {
            return Err(StoreError::KeyMismatch {
                path: info_path,
                expected_agent: instance.agent_name.clone(),
                expected_key: key.to_owned(),
                found_agent: info.agent_name,
                found_key: info.instance_key,
            });
        }
    }
    if let Some(bundle) = workspace.info().map(|info| info.bundle.as_str()) {
        for dir in sub_dirs(&root.legacy_instances_dir())? {
            if let Some(info) = legacy_instance_info(&dir)
                && info.bundle == bundle
                && info.instance_key == key
                && agent.is_none_or(|agent| agent == info.agent_name)
            {
                found.push(DeletedInstance { agent_name: info.agent_name, dir, legacy_layout: true });
            }
        }
    }
    // Never delete an instance a running process holds: every lock is
    // taken (and kept) before anything is deleted.
    let mut held = Vec::with_capacity(found.len());
    for instance in &found {
        held.push(hold_lock(&instance.dir, &instance.agent_name, key)?);
    }
    for instance in &found {
        fs::remove_dir_all(&instance.dir).map_err(StoreError::io("deleting the instance directory", &instance.dir))?;
    }
    drop(held);
    for instance in &found {
        if let Some(parent) = instance.dir.parent() {
            sync_dir(parent);
        }
    }
    Ok(found)
}

/// An instance whose conversation [`reset_conversations`] cleared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetInstance {
    /// The agent whose instance it is.
    pub agent_name: String,
    /// Its instance key.
    pub instance_key: String,
    /// Its directory (kept).
    pub dir: PathBuf,
}

/// Clears the conversations of the instances in `workspace` that match
/// `key` and `agent` (each `None`: any): their message logs and event logs
/// go, their instance.json counts from zero again, and what else the
/// directory holds (extension state) stays, as the original's `--fresh`
/// clears the persisted message history only. The next turn starts an
/// empty conversation.
///
/// All or nothing: every lock is taken first; one held (a process runs
/// the instance) is [`StoreError::Busy`] and nothing is cleared.
pub fn reset_conversations(
    workspace: &Workspace,
    key: Option<&str>,
    agent: Option<&str>,
) -> Result<Vec<ResetInstance>, StoreError> {
    let mut found = Vec::new();
    for dir in sub_dirs(&workspace.instances_dir())? {
        let Some((agent_name, instance_key)) =
            dir.file_name().and_then(|n| n.to_str()).and_then(parse_instance_dir_name)
        else {
            continue;
        };
        if key.is_some_and(|key| key != instance_key) || agent.is_some_and(|agent| agent != agent_name) {
            continue;
        }
        if is_real_dir(&dir) {
            found.push(ResetInstance { agent_name, instance_key, dir });
        }
    }
    found.sort_by(|a, b| (&a.agent_name, &a.instance_key).cmp(&(&b.agent_name, &b.instance_key)));
    let mut held = Vec::with_capacity(found.len());
    for instance in &found {
        held.push(hold_lock(&instance.dir, &instance.agent_name, &instance.instance_key)?);
    }
    for instance in &found {
        for file in [InstanceStore::MESSAGES_FILE, InstanceStore::EVENTS_FILE] {
            let path = instance.dir.join(file);
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => return Err(StoreError::io("clearing the conversation", &path)(error)),
            }
        }
        let info_path = instance.dir.join(InstanceStore::INFO_FILE);
        if let Ok(Some(mut info)) = read_info(&info_path) {
            info.turns = 0;
            info.messages = 0;
            info.updated_at = now_millis();
            write_info_atomically(&instance.dir, &info_path, &info)?;
        }
        sync_dir(&instance.dir);
    }
    drop(held);
    Ok(found)
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
    read_json(path, "reading instance metadata from")
}

/// A JSON file, or `None` if it does not exist. Metadata files are small;
/// a bigger one is not ours to read whole.
fn read_json<T: serde::de::DeserializeOwned>(path: &Path, op: &'static str) -> Result<Option<T>, StoreError> {
    const MAX_METADATA_BYTES: u64 = 1 << 20;
    let mut bytes = Vec::new();
    match File::open(path).and_then(|file| file.take(MAX_METADATA_BYTES).read_to_end(&mut bytes)) {
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(StoreError::io(op, path)(error)),
    }
    serde_json::from_slice(&bytes).map(Some).map_err(StoreError::json(op, path))
}

/// Removes the temp files of atomic replaces (`.<name>.<pid>.tmp`) that a
/// process killed mid-write left in the instance directory `dir`: those of
/// processes no longer alive (the caller holds the instance's lock).
fn remove_stale_temps(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(pid) = name
            .strip_prefix('.')
            .and_then(|rest| rest.strip_suffix(".tmp"))
            .and_then(|rest| rest.rsplit_once('.'))
            .and_then(|(_, pid)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = pid == std::process::id() || process_alive(pid);
        if !alive && let Err(error) = fs::remove_file(entry.path()) {
            tracing::warn!(target: LOG_TARGET, "removing the stale temp file {}: {error}", entry.path().display());
        }
    }
}

/// Whether process `pid` runs (a zombie, killed and not yet reaped, does not).
fn process_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) S …`: the state follows the last `)`.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Replaces `path` with `info`: write a temp file beside it, sync it, rename it over.
fn write_info_atomically(dir: &Path, path: &Path, info: &InstanceInfo) -> Result<(), StoreError> {
    write_json_atomically(dir, path, info)
}

/// Replaces `path` (in `dir`) with `value` as pretty JSON: a temp file
/// beside it, synced, renamed over it.
fn write_json_atomically<T: Serialize>(dir: &Path, path: &Path, value: &T) -> Result<(), StoreError> {
    let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written =
        write_synced(&temp, value).and_then(|()| fs::rename(&temp, path).map_err(StoreError::io("replacing", path)));
    if written.is_err() {
        // Best effort: the temp file is garbage now.
        let _ = fs::remove_file(&temp);
    }
    written
}

/// Writes `value` as pretty JSON to a new file at `path` and syncs it.
fn write_synced<T: Serialize>(path: &Path, value: &T) -> Result<(), StoreError> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(StoreError::json("serializing", path))?;
    bytes.push(b'\n');
    private_file()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .and_then(|mut file| {
            file.write_all(&bytes)?;
            file.sync_all()
        })
        .map_err(StoreError::io("writing", path))
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
    let mut events = Vec::new();
    let replayed = goondan_journal::replay::<LogLine>(path, |line| match line {
        LogLine::Message(message) => events.push(MessageEvent::Append { message }),
        LogLine::Commit { events: commit } => events.extend(commit),
    })
    .map_err(|error| StoreError::from_journal(error, Some("reading the message log")))?;
    for corrupt in &replayed.corrupt {
        tracing::warn!(target: LOG_TARGET, "{}: skipping a line that cannot be read ({corrupt})", path.display());
    }
    loaded.skipped_corrupt_lines = replayed.corrupt.len();
    if let Some(torn) = &replayed.torn {
        loaded.skipped_torn_tail = true;
        tracing::warn!(
            target: LOG_TARGET,
            "{}: skipping the torn last line ({torn}), left by an interrupted write",
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn user(text: &str) -> Message {
        Message::new(goondan_core::MessageData::User { content: text.to_owned() }, goondan_core::MessageSource::User)
    }

    /// Every directory and file under `dir` (links not followed) whose mode
    /// is not the private one, with its mode.
    fn loose(dir: &Path, found: &mut Vec<String>) {
        for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
            let path = entry.path();
            let meta = fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let mode = meta.permissions().mode() & 0o7777;
            if meta.is_dir() {
                if mode != PRIVATE_DIR_MODE {
                    found.push(format!("{} {mode:o}", path.display()));
                }
                loose(&path, found);
            } else if meta.is_file() && mode != PRIVATE_FILE_MODE {
                found.push(format!("{} {mode:o}", path.display()));
            }
        }
    }

    #[test]
    fn everything_the_store_writes_is_the_users_only() -> Result<(), Box<dyn std::error::Error>> {
        let temp = tempfile::tempdir()?;
        // The root and its parent do not exist yet: both are made here.
        let root = StateRoot::new(temp.path().join("parent").join("state"));
        let workspace = open_workspace(&root, "demo", "/p/goondan.yaml", WorkspaceAccess::Use)?;
        let mut store = InstanceStore::open(&workspace, "user:1", "assistant", Path::new("/p/goondan.yaml"))?;
        let _lock = store.lock()?;
        store.append(&[user("hi")])?;
        store.rewrite(&[user("hi again")])?;
        store.record_turn()?;
        let mut events = store.event_writer()?;
        events.write_all(b"{}\n")?;
        events.flush()?;
        crate::tasks::TaskBook::open(store.dir())?;
        let runtime = tokio::runtime::Builder::new_current_thread().build()?;
        let extensions = crate::extension_state::ExtensionStateStore::at(
            store.dir().join(crate::extension_state::ExtensionStateStore::DIR_NAME),
        );
        runtime.block_on(extensions.set("memo", serde_json::json!({"a": 1})))?;

        let root_mode = fs::metadata(root.path())?.permissions().mode() & 0o7777;
        assert_eq!(root_mode, PRIVATE_DIR_MODE, "the state root");
        let mut found = Vec::new();
        loose(temp.path(), &mut found);
        assert!(found.is_empty(), "not private: {found:?}");
        // Each kind of file was written.
        for file in [InstanceStore::INFO_FILE, InstanceStore::MESSAGES_FILE, InstanceStore::EVENTS_FILE, "lock"] {
            assert!(store.dir().join(file).is_file(), "{file}");
        }
        assert!(workspace.dir().join(Workspace::INFO_FILE).is_file());
        Ok(())
    }

    #[test]
    fn an_existing_directory_keeps_its_mode() -> Result<(), Box<dyn std::error::Error>> {
        let temp = tempfile::tempdir()?;
        let shared = temp.path().join("shared");
        fs::create_dir(&shared)?;
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o750))?;
        create_private_dir_all(&shared.join("a/b"))?;
        assert_eq!(fs::metadata(&shared)?.permissions().mode() & 0o7777, 0o750);
        assert_eq!(fs::metadata(shared.join("a"))?.permissions().mode() & 0o7777, PRIVATE_DIR_MODE);
        assert_eq!(fs::metadata(shared.join("a/b"))?.permissions().mode() & 0o7777, PRIVATE_DIR_MODE);
        Ok(())
    }
}
