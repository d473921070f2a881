//! Which workspace of the state root a command works in: the one of the
//! bundle's Swarm (its `instanceKey`, else its name, as the original names
//! workspaces), or `--workspace NAME`.
//!
//! A workspace belongs to one bundle (its workspace.json names it): one
//! bundle never continues another's conversations. Two projects whose
//! Swarms share a name (the original's templates all say `default`) would
//! meet in one workspace, so the second gets a workspace of its own,
//! `<name>-<8 hex digits of a hash of its file's path>`, and is told so
//! once, when that workspace is made; from then on it is where that
//! bundle's state is. `--workspace NAME` still chooses explicitly (and is
//! refused, with the ways on, when NAME is another bundle's), and a
//! project that moved takes its old workspace over with
//! `--adopt-workspace`.
//!
//! It also owns where the state root is (`--state-root`,
//! `GOONDAN_STATE_ROOT`, `~/.goondan`) and which workspace a command that
//! only looks at state (logs, status, restart, instance delete) means.

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};

use goondan_config::{Bundle, resolve_bundle_file};
use std::io::Write as _;

use goondan_runtime::store::{
    StateRoot, StoreError, Workspace, WorkspaceAccess, find_workspace, old_layout_instances, open_workspace,
    workspace_id,
};

use crate::cli::GlobalOptions;
use crate::exit;
use crate::output::{self, Output};

/// The state root from `--state-root`, `GOONDAN_STATE_ROOT` or `~/.goondan`.
pub(crate) fn state_root(global: &GlobalOptions) -> Result<StateRoot> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    StateRoot::resolve(global.state_root.clone(), std::env::var("GOONDAN_STATE_ROOT").ok(), home)
        .map_err(|e| anyhow!("{e}"))
}

/// The state root's `packages/` directory, where `gdn package install`
/// puts a bundle's dependencies; `None` when there is no state root
/// (no HOME and no GOONDAN_STATE_ROOT): dependencies are then not loaded.
pub(crate) fn packages_dir(global: &GlobalOptions) -> Option<PathBuf> {
    state_root(global).ok().map(|root| root.path().join("packages"))
}

/// The bundle of `-c`, with its dependencies from [`packages_dir`].
pub(crate) fn load_config(global: &GlobalOptions) -> goondan_config::LoadReport {
    goondan_config::load_bundle_with(&global.config, packages_dir(global).as_deref())
}

/// The project's workspace, or the exit code of the error printed.
pub(crate) fn workspace_or_exit(global: &GlobalOptions, out: &mut Output) -> Result<Result<Workspace, u8>> {
    workspace_or_exit_saying(global, out, "no such workspace (gdn instance list shows the workspaces)")
}

/// The project's workspace, or the exit code of the error printed:
/// `missing` when `--workspace` names none.
pub(crate) fn workspace_or_exit_saying(
    global: &GlobalOptions,
    out: &mut Output,
    missing: &str,
) -> Result<Result<Workspace, u8>> {
    let root = crate::workspace::state_root(global)?;
    match crate::workspace::project_workspace(global, &root) {
        Ok(Some(workspace)) => Ok(Ok(workspace)),
        // No such project: the original's class for it is configuration.
        Ok(None) => {
            output::error_line(&mut out.stderr, missing)?;
            Ok(Err(exit::CONFIG))
        }
        Err(message) => {
            output::error_line(&mut out.stderr, message)?;
            Ok(Err(exit::USAGE))
        }
    }
}

/// The workspace `instance delete` works in: `--workspace`'s as it is
/// (`None` if there is none), else the bundle's (`-c`), whose old-layout
/// instances are moved into it first; another bundle's is refused.
pub(crate) fn project_workspace(
    global: &GlobalOptions,
    root: &StateRoot,
) -> std::result::Result<Option<Workspace>, String> {
    if let Some(name) = &global.workspace {
        return find_workspace(root, name).map_err(|e| e.to_string());
    }
    let report = load_config(global);
    let Some(bundle) = report.valid_bundle() else {
        // A bundle being edited (a running service asked to restart with
        // it) still names its workspace: the one whose workspace.json is
        // this bundle's.
        if let Some(workspace) = workspace_of_bundle(root, &bundle_identity(&global.config)) {
            return Ok(Some(workspace));
        }
        let first = report.diagnostics.iter().find(|d| d.is_error()).map(|d| format!(": {}", d.message));
        return Err(format!(
            "cannot tell the project's workspace: the bundle {} does not load{}; pass -c BUNDLE, or --workspace NAME \
             (gdn instance list shows the workspaces)",
            goondan_config::resolve_bundle_file(&global.config).display(),
            first.unwrap_or_default()
        ));
    };
    let agent = bundle.default_agent().map_err(|e| e.to_string())?;
    // Its callers look at what a workspace holds (logs, a service's status,
    // instances to delete): none creates one, or announces a bundle's own.
    open(global, root, bundle, agent.name(), WorkspaceAccess::Inspect).map(Some)
}

/// The one workspace of the state root whose workspace.json names the
/// bundle `identity`, if exactly one does.
fn workspace_of_bundle(root: &StateRoot, identity: &str) -> Option<Workspace> {
    let mut found = std::fs::read_dir(root.workspaces_dir()).ok()?.flatten().filter_map(|entry| {
        let name = entry.file_name().to_str()?.to_owned();
        let workspace = find_workspace(root, &name).ok()??;
        (workspace.info()?.bundle == identity).then_some(workspace)
    });
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

/// The bundle's identity in the state: the canonical path of its file
/// (`-c` given as a directory or as the file, through links, is one bundle).
/// A bundle split over files without a goondan.yaml is named by the
/// goondan.yaml its canonical directory would hold.
pub fn bundle_identity(config: &Path) -> String {
    let file = resolve_bundle_file(config);
    let canonical = std::fs::canonicalize(&file).or_else(|_| {
        let dir = file.parent().filter(|dir| !dir.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::canonicalize(dir).map(|dir| dir.join(file.file_name().unwrap_or_default()))
    });
    canonical.unwrap_or(file).display().to_string()
}

/// The name the workspace of `agent`'s Swarm is made from: the Swarm whose
/// entry agent it is, else the first that lists it; its `instanceKey`,
/// else its name. An agent in no Swarm runs alone: its own name.
pub fn swarm_key(bundle: &Bundle, agent: &str) -> String {
    match bundle.swarm_of_agent(agent) {
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
    let identity = bundle_identity(&global.config);
    let workspace = if let Some(name) = &global.workspace {
        let access =
            if global.adopt_workspace && access == WorkspaceAccess::Use { WorkspaceAccess::Adopt } else { access };
        open_workspace(root, name, &identity, access).map_err(|error| refusal(&error))?
    } else if global.adopt_workspace && access == WorkspaceAccess::Use {
        open_workspace(root, &swarm_key(bundle, agent), &identity, WorkspaceAccess::Adopt)
            .map_err(|error| refusal(&error))?
    } else {
        open_own(root, &swarm_key(bundle, agent), &identity, access)?
    };
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

/// The workspace named `name` if it is this bundle's (or free), else the
/// bundle's own one ([`own_workspace_name`]): made, and said so, the first
/// time; with `Inspect`, only looked at.
fn open_own(root: &StateRoot, name: &str, identity: &str, access: WorkspaceAccess) -> Result<Workspace, String> {
    let own_name = own_workspace_name(name, identity);
    let belongs = |name: &str| {
        find_workspace(root, name).ok().flatten().and_then(|found| found.info().map(|info| info.bundle == identity))
    };
    // Once made, the bundle's own workspace is where its state is, even if
    // the one of its name is deleted or freed later — unless the bundle has
    // taken that one over (--adopt-workspace) since.
    if belongs(name) != Some(true) && belongs(&own_name) == Some(true) {
        return open_workspace(root, &own_name, identity, access).map_err(|error| refusal(&error));
    }
    let taken = match open_workspace(root, name, identity, access) {
        Err(StoreError::ForeignWorkspace { owner, .. }) => owner,
        opened => return opened.map_err(|error| refusal(&error)),
    };
    let workspace = open_workspace(root, &own_name, identity, access).map_err(|error| refusal(&error))?;
    if access != WorkspaceAccess::Inspect {
        // Made just now (looked for above): the one time it is said.
        let mut stderr = anstream::stderr();
        let _ = writeln!(
            stderr,
            "{}note: workspace '{}' holds the state of another bundle ({owner}); this bundle ({identity}) keeps its \
             own in workspace '{}' ({}). --workspace NAME chooses another; --adopt-workspace takes '{}' over if \
             this is that project moved{}",
            crate::output::DIM,
            workspace_id(name),
            workspace.id(),
            workspace.dir().display(),
            workspace_id(name),
            crate::output::DIM.render_reset(),
            owner = taken,
        );
    }
    Ok(workspace)
}

/// The name of the workspace of its own a bundle gets when the one of its
/// Swarm's name is another bundle's: that name, `-`, and the first 8 hex
/// digits of the SHA-256 of the bundle's identity (its file's canonical
/// path), within the store's 128 characters.
pub fn own_workspace_name(name: &str, identity: &str) -> String {
    use sha2::Digest as _;
    let digest = hex::encode(sha2::Sha256::digest(identity.as_bytes()));
    let base: String = workspace_id(name).chars().take(128 - 9).collect();
    format!("{base}-{}", &digest[..8])
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
    // What a model writes there must never be found as one of the bundle's
    // files when the state root is kept inside the project.
    if let Some(root) = workspace.dir().parent().and_then(std::path::Path::parent) {
        goondan_core::package_dir::mark_state_root(root)
            .map_err(|error| format!("cannot mark the state root {}: {error}", root.display()))?;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundles_own_workspace_name_is_its_swarms_and_a_hash_of_its_path_within_the_limit() {
        let own = own_workspace_name("My Swarm", "/home/a/project/goondan.yaml");
        assert!(own.starts_with("my-swarm-") && own.len() == "my-swarm-".len() + 8, "{own}");
        assert_eq!(own, own_workspace_name("My Swarm", "/home/a/project/goondan.yaml"), "stable");
        assert_ne!(own, own_workspace_name("My Swarm", "/home/b/project/goondan.yaml"));
        // A name at the store's limit keeps its hash; the store keeps the name as it is.
        let long = own_workspace_name(&"x".repeat(300), "/p/goondan.yaml");
        assert_eq!(long.len(), 128);
        assert_eq!(workspace_id(&long), long);
        assert_eq!(long[..119], "x".repeat(119));
    }
}
