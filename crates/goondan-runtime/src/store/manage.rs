//! Listing, deleting and resetting instances (`gdn instance list|delete`, `--fresh`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use goondan_core::message::now_millis;
use serde::Serialize;

use super::LOG_TARGET;
use super::error::{StoreError, describe_instance};
use super::files::{is_real_dir, read_json, sub_dirs, sync_dir};
use super::instance::{InstanceInfo, InstanceStore, read_info, write_info_atomically};
use super::lock::{LockStatus, hold_lock, lock_status};
use super::names::{encode_key, key_refusal, legacy_key_from_dir_name, parse_instance_dir_name};
use super::root::StateRoot;
use super::workspace::{Workspace, WorkspaceInfo, legacy_instance_info};

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

pub(super) fn serialize_path<S: serde::Serializer>(path: &Path, serializer: S) -> Result<S::Ok, S::Error> {
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

pub(super) fn status_of(dir: &Path) -> LockStatus {
    lock_status(dir).unwrap_or_else(|error| {
        tracing::warn!(target: LOG_TARGET, "{error}; reporting the instance as idle");
        LockStatus::default()
    })
}

/// The instances in the directory `instances` with their directories; with
/// `legacy`, also directories of the oldest layout (`<encoded key>`).
pub(super) fn instances_in(instances: &Path, legacy: bool) -> Result<Vec<(InstanceInfo, PathBuf)>, StoreError> {
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
    delete_instances_if(root, workspace, key, agent, |_| true)
}

/// [`delete_instances`], deleting only the instances whose instance.json
/// (`None`: missing or unreadable) `wanted` accepts, asked once their locks
/// are held: a condition checked there cannot be undone by a process
/// taking the instance in between (the service collects an expired
/// instance only if it is still expired).
pub fn delete_instances_if(
    root: &StateRoot,
    workspace: &Workspace,
    key: &str,
    agent: Option<&str>,
    wanted: impl Fn(Option<&InstanceInfo>) -> bool,
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
    found.retain(|instance| wanted(read_info(&instance.dir.join(InstanceStore::INFO_FILE)).ok().flatten().as_ref()));
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
/// `key` and `agent` (each `None`: any): their message logs, event logs
/// and the exports of both for the original's tools (`messages/base.jsonl`,
/// `messages/runtime-events.jsonl`) go, their instance.json counts from
/// zero again, and what else the directory holds (extension state) stays,
/// as the original's `--fresh` clears its `base.jsonl`, `events.jsonl` and
/// `runtime-events.jsonl` only. The next turn starts an
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
        let exports = instance.dir.join(InstanceStore::EXPORT_DIR);
        for path in [
            instance.dir.join(InstanceStore::MESSAGES_FILE),
            instance.dir.join(InstanceStore::EVENTS_FILE),
            exports.join(InstanceStore::BASE_EXPORT_FILE),
            exports.join(InstanceStore::RUNTIME_EVENTS_FILE),
        ] {
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
            // A conversation started over is a live one.
            info.expired_at = None;
            info.collect_at = None;
            write_info_atomically(&instance.dir, &info_path, &info)?;
        }
        sync_dir(&instance.dir);
    }
    drop(held);
    Ok(found)
}
