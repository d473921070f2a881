//! [`StoreError`]: every failure of the store, saying what was being done and where.

use std::io;
use std::path::{Path, PathBuf};

use goondan_core::PathIoError;

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
    #[error(transparent)]
    Io(#[from] PathIoError),
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
pub(super) fn describe_instance(agent: &str, key: &str) -> String {
    if agent.is_empty() { format!("{key:?}") } else { format!("{key:?} of agent {agent:?}") }
}

/// ` (pid N)`, or nothing if the pid is unknown.
pub(super) fn pid_note(pid: Option<u32>) -> String {
    pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default()
}

impl StoreError {
    /// A journal's failure as the store says it (`op`, when given, says
    /// what the store was doing instead of the journal's word for it).
    pub(super) fn from_journal(error: goondan_journal::JournalError, op: Option<&'static str>) -> Self {
        use goondan_journal::JournalError;
        match error {
            JournalError::Io(failure) => Self::Io(PathIoError { op: op.unwrap_or(failure.op), ..failure }),
            JournalError::Corrupt { path, source, .. } => Self::Json { op: op.unwrap_or("reading"), path, source },
            JournalError::Poisoned { .. } => Self::Poisoned,
        }
    }

    pub(super) fn io(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Self {
        PathIoError::at(op, path)
    }

    pub(super) fn json(op: &'static str, path: &Path) -> impl FnOnce(serde_json::Error) -> Self {
        move |source| Self::Json { op, path: path.to_path_buf(), source }
    }
}
