//! Workspaces: one project's part of the state root (`workspaces/<id>/`), its
//! bundle's identity in workspace.json, and the move of old-layout instances in.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use goondan_core::message::now_millis;
use serde::{Deserialize, Serialize};

use super::LOG_TARGET;
use super::error::{StoreError, describe_instance};
use super::files::{create_private_dir_all, is_real_dir, read_json, sync_dir, write_json_atomically, write_synced};
use super::instance::{InstanceInfo, InstanceStore, read_info};
use super::lock::hold_lock;
use super::names::{encode_instance, legacy_key_from_dir_name, parse_instance_dir_name};
use super::root::StateRoot;

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

    /// The directory of the instance of `agent` for `key` (which need not
    /// exist), or [`StoreError::InvalidKey`] for a pair that cannot name one.
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
pub(super) fn create_workspace(dir: &Path, id: &str, name: &str, bundle: &str) -> Result<WorkspaceInfo, StoreError> {
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
pub(super) fn legacy_instance_info(dir: &Path) -> Option<InstanceInfo> {
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
