//! Which workspace of the state root a command works in: the one of the
//! bundle's Swarm (its `instanceKey`, else its name, as the original names
//! workspaces), or `--workspace NAME`; and the refusal, with the ways on,
//! when that workspace holds another bundle's conversations.

use std::path::Path;

use goondan_config::{Bundle, resolve_bundle_file};
use goondan_runtime::store::{StateRoot, StoreError, Workspace, WorkspaceAccess, old_layout_instances, open_workspace};

use crate::cli::GlobalOptions;

/// The bundle's identity in the state: the canonical path of its file
/// (`-c` given as a directory or as the file, through links, is one bundle).
pub fn bundle_identity(config: &Path) -> String {
    let file = resolve_bundle_file(config);
    std::fs::canonicalize(&file).unwrap_or(file).display().to_string()
}

/// The name the workspace of `agent`'s Swarm is made from: the Swarm whose
/// entry agent it is, else the first that lists it; its `instanceKey`,
/// else its name. An agent in no Swarm runs alone: its own name.
pub fn swarm_key(bundle: &Bundle, agent: &str) -> String {
    let swarm = bundle
        .swarms()
        .find(|swarm| swarm.spec.entry_agent.name == agent)
        .or_else(|| bundle.swarms().find(|swarm| swarm.spec.agents.iter().any(|a| a.name == agent)));
    match swarm {
        Some(swarm) => swarm.spec.instance_key.clone().unwrap_or_else(|| swarm.name().to_owned()),
        None => agent.to_owned(),
    }
}

/// Opens the workspace `agent` of `bundle` runs in (see the module docs);
/// `--adopt-workspace` turns `Use` into `Adopt`. The error is the line to
/// print.
pub fn open(
    global: &GlobalOptions,
    root: &StateRoot,
    bundle: &Bundle,
    agent: &str,
    access: WorkspaceAccess,
) -> Result<Workspace, String> {
    let name = global.workspace.clone().unwrap_or_else(|| swarm_key(bundle, agent));
    let access = if global.adopt_workspace && access == WorkspaceAccess::Use { WorkspaceAccess::Adopt } else { access };
    let identity = bundle_identity(&global.config);
    let workspace = open_workspace(root, &name, &identity, access).map_err(|error| refusal(&error))?;
    // What an earlier version kept for this agent under another bundle
    // (often this project before it moved) is not continued; say so once
    // rather than start afresh in silence.
    for (info, dir) in old_layout_instances(root) {
        if info.agent_name == agent && info.bundle != identity {
            tracing::warn!(
                "{} holds a conversation of agent '{agent}' (instance '{}') from bundle {}, not this one; it is \
                 left there (gdn instance list shows it; move it under {} to continue it here, or delete it)",
                dir.display(),
                info.instance_key,
                info.bundle,
                workspace.instances_dir().display()
            );
        }
    }
    Ok(workspace)
}

/// The directory the project's agents work in when no `--workdir` is
/// given: `<workspace>/workdir`, made (0700) if missing. Not the bundle's
/// directory, which is the runtime's configuration and code and read-only
/// to what the model runs: a file a tool writes is never one gdn, Bun or
/// Node later reads as configuration or runs.
pub fn default_workdir(workspace: &Workspace) -> Result<std::path::PathBuf, String> {
    let dir = workspace.dir().join(WORKDIR);
    goondan_runtime::store::create_private_dir_all(&dir)
        .map_err(|error| format!("cannot make the project's working directory {}: {error}", dir.display()))?;
    Ok(std::fs::canonicalize(&dir).unwrap_or(dir))
}

/// The name of the agents' default working directory in a workspace.
pub const WORKDIR: &str = "workdir";

/// The store's error, and for another bundle's workspace the ways on.
pub fn refusal(error: &StoreError) -> String {
    match error {
        StoreError::ForeignWorkspace { workspace, bundle, owner, .. } => format!(
            "{error}; gdn does not continue another bundle's conversations. To run this bundle, give it a workspace \
             of its own (--workspace NAME) or another state root (--state-root DIR); if {bundle} is {owner} moved, \
             take its state over (--adopt-workspace); or delete that state (gdn instance delete --workspace \
             {workspace} KEY)"
        ),
        other => other.to_string(),
    }
}
