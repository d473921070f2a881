//! [`StateRoot`]: where the state lives (`--state-root`, `GOONDAN_STATE_ROOT`, `~/.goondan`).

use std::path::{Path, PathBuf};

use super::error::StoreError;
use super::workspace::Workspace;

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
