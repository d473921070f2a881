//! The sandbox of an agent: its `spec.sandbox` (or its Swarm's, or the
//! default `workspace-write`, see [`Bundle::sandbox_for`]) turned into a
//! [`goondan_sandbox::Sandbox`] over its workdir, with the bundle's
//! directory kept read-only (and out of sight when it is not in the
//! workdir).

use std::path::{Path, PathBuf};

use goondan_config::{AgentSpec, Bundle, LimitBound, Resource, SandboxConfig, SandboxLimits, SandboxPolicy};
use goondan_sandbox::{Limits, Policy, Sandbox, SandboxSpec};

/// Why an agent's `spec.sandbox` cannot be applied (validation reports the
/// same problems first).
#[derive(Debug, thiserror::Error)]
pub enum SandboxConfigError {
    /// A `readable` or `writable` entry.
    #[error("{0}")]
    Path(#[from] goondan_config::SandboxPathError),
    /// A `network.allow` entry.
    #[error("{0}")]
    Network(#[from] goondan_core::host_port::HostPortError),
}

/// The sandbox every command of `agent` runs in, when it runs in `swarm`;
/// nothing is set up until its first command.
pub fn agent_sandbox(
    bundle: &Bundle,
    agent: &Resource<AgentSpec>,
    swarm: Option<&str>,
    workdir: &Path,
    loaded_files: &[PathBuf],
) -> Result<Sandbox, SandboxConfigError> {
    let effective = bundle.sandbox_for(agent.name(), swarm);
    let spec = sandbox_spec(&effective.config, bundle.root(), workdir, loaded_files.to_vec())?;
    if spec.policy.confines() {
        warn_if_workdir_holds_home(agent.name(), workdir, goondan_config::sandbox::home_dir().as_deref());
    }
    Ok(Sandbox::new(spec))
}

/// A `sandbox` config (an agent's, or a stdio MCP server's) as the sandbox
/// takes it: paths resolved against `root` (the bundle's directory) and the
/// home directory, hosts checked, over `workdir` with `protected` kept
/// read-only.
pub fn sandbox_spec(
    config: &SandboxConfig,
    root: &Path,
    workdir: &Path,
    protected: Vec<PathBuf>,
) -> Result<SandboxSpec, SandboxConfigError> {
    let home = goondan_config::sandbox::home_dir();
    let policy = match config.policy {
        SandboxPolicy::ReadOnly => Policy::ReadOnly,
        SandboxPolicy::WorkspaceWrite => Policy::WorkspaceWrite,
        SandboxPolicy::Full => Policy::Full,
    };
    Ok(SandboxSpec {
        policy,
        workdir: workdir.to_path_buf(),
        readable: config.readable_paths(root, home.as_deref())?,
        writable: config.writable_paths(root, home.as_deref())?,
        protected,
        // The bundle's tree is the runtime's configuration and code: never
        // writable by what the model runs (see `SandboxSpec::bundle`).
        bundle: Some(root.to_path_buf()),
        network_allow: config.network.targets()?.iter().map(ToString::to_string).collect(),
        limits: limits(&config.limits),
        open_network: false,
    })
}

/// `spec.sandbox.limits` as the sandbox takes it: a bound left out is the
/// sandbox's default ([`Limits::default`]), `unlimited` none.
pub fn limits(config: &SandboxLimits) -> Limits {
    let bound = |written: Option<LimitBound>, default: fn() -> Option<u64>| match written {
        None => default(),
        Some(LimitBound::Unlimited) => None,
        Some(LimitBound::At(value)) => Some(value),
    };
    Limits {
        processes: match config.processes {
            None => Some(goondan_sandbox::DEFAULT_PROCESSES),
            Some(LimitBound::Unlimited) => None,
            // Validation keeps it within MAX_PROCESSES.
            Some(LimitBound::At(value)) => {
                Some(u32::try_from(value).unwrap_or(u32::MAX).min(goondan_sandbox::MAX_PROCESSES))
            }
        },
        file_size: bound(config.file_size, || Some(goondan_sandbox::DEFAULT_FILE_SIZE)),
        memory: bound(config.memory, || Some(goondan_sandbox::default_memory())),
    }
}

/// A workdir that is the home directory (or holds it) gives commands all of
/// it — `~/.ssh` included — under the sandbox's workdir rules: say so once,
/// at assembly, with the way out.
fn warn_if_workdir_holds_home(agent: &str, workdir: &Path, home: Option<&Path>) -> bool {
    let Some(home) = home else { return false };
    let home = std::fs::canonicalize(home).unwrap_or_else(|_| home.to_path_buf());
    let holds = home.starts_with(workdir);
    if holds {
        tracing::warn!(
            "agent '{agent}': its workdir {} holds your home directory {}: its sandbox lets commands read (and under \
             workspace-write, write) all of it, ~/.ssh included; run gdn from a project directory or give --workdir",
            workdir.display(),
            home.display()
        );
    }
    holds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_left_out_are_the_defaults_and_unlimited_is_none() {
        let written =
            SandboxLimits { processes: Some(LimitBound::At(64)), file_size: Some(LimitBound::Unlimited), memory: None };
        let limits = limits(&written);
        assert_eq!(limits.processes, Some(64));
        assert_eq!(limits.file_size, None);
        assert_eq!(limits.memory, Limits::default().memory);
        assert_eq!(super::limits(&SandboxLimits::default()), Limits::default());
    }

    #[test]
    fn a_workdir_holding_the_home_is_warned_about() {
        assert!(warn_if_workdir_holds_home("a", Path::new("/home/u"), Some(Path::new("/home/u"))));
        assert!(warn_if_workdir_holds_home("a", Path::new("/"), Some(Path::new("/home/u"))));
        assert!(!warn_if_workdir_holds_home("a", Path::new("/home/u/project"), Some(Path::new("/home/u"))));
        assert!(!warn_if_workdir_holds_home("a", Path::new("/home/u"), None));
    }
}
