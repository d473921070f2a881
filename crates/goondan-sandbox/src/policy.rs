//! What a sandbox is asked to allow.

use std::fmt;
use std::path::PathBuf;

/// How much a confined command may do (`spec.sandbox.policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Read the system and the workdir; write only the private temporary
    /// directory.
    ReadOnly,
    /// Also write the workdir (but its protected files) — the default.
    #[default]
    WorkspaceWrite,
    /// No confinement: the user's full rights, chosen explicitly.
    Full,
}

impl Policy {
    /// The name `goondan.yaml` uses, and refusals quote.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "read-only",
            Self::WorkspaceWrite => "workspace-write",
            Self::Full => "full",
        }
    }

    /// Whether commands under it are confined at all.
    pub fn confines(self) -> bool {
        self != Self::Full
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything a [`Sandbox`](crate::Sandbox) is built from; paths absolute.
#[derive(Debug, Clone, Default)]
pub struct SandboxSpec {
    /// The policy in force.
    pub policy: Policy,
    /// The instance's workdir: readable, and writable under `WorkspaceWrite`.
    pub workdir: PathBuf,
    /// Extra trees the commands may read (and execute).
    pub readable: Vec<PathBuf>,
    /// Extra trees the commands may write.
    pub writable: Vec<PathBuf>,
    /// Files and directories inside the workdir that stay read-only (the
    /// bundle's own files, `.git`, `.env*`).
    pub protected: Vec<PathBuf>,
    /// The bundle's directory, whose configuration and code the runtime
    /// and its JavaScript hosts read: read-only with all it holds (its
    /// `.env*` hidden) wherever it lies, but for a workdir inside it (the
    /// only part a command then sees); and when it lies inside the
    /// workdir, no entry can be made
    /// in the directories on the way to it (a `node_modules` or
    /// `package.json` there is read when its modules load). A loader that
    /// scans the bundle's tree for configuration (split-file bundles) must
    /// therefore skip the state root and any workdir inside the tree.
    pub bundle: Option<PathBuf>,
    /// `host:port` pairs the commands may connect to; empty: no network
    /// (unless `open_network`).
    pub network_allow: Vec<String>,
    /// The network is the machine's, unconfined (TCP and UDP anywhere, no
    /// proxy): for a Connector's host, whose work is talking to its
    /// service. Files, Unix sockets, processes and modes stay confined.
    /// Ignored with a `network_allow` list.
    pub open_network: bool,
    /// The resource bounds of each command (`spec.sandbox.limits`; default:
    /// [`Limits::default`](crate::Limits)); not applied under `full`.
    pub limits: crate::Limits,
}
