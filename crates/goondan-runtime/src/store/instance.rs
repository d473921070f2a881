//! [`InstanceStore`]: one instance's directory and its instance.json.

use std::fs;
use std::path::{Path, PathBuf};

use goondan_core::message::now_millis;
use goondan_journal::Journal;
use serde::{Deserialize, Serialize};

use super::LOG_TARGET;
use super::error::StoreError;
use super::files::{create_private_dir_all, read_json, sync_dir, write_json_atomically};
use super::messages::LogLine;
use super::workspace::Workspace;

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
    /// When a service expired the instance (its Swarm's
    /// `policy.lifecycle.ttlSeconds` of idleness passed), milliseconds since
    /// the Unix epoch; `None` while it lives. Cleared when the instance runs
    /// again ([`InstanceStore::revive`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired_at: Option<u64>,
    /// When an expired instance is collected (deleted) by the service:
    /// `expiredAt` plus the `gcGraceSeconds` in force when it expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collect_at: Option<u64>,
}

/// One instance's directory: its message log, event log and metadata.
#[derive(Debug)]
pub struct InstanceStore {
    pub(super) dir: PathBuf,
    pub(super) info_path: PathBuf,
    pub(super) messages_path: PathBuf,
    pub(super) events_path: PathBuf,
    pub(super) info: InstanceInfo,
    /// messages.jsonl: its torn tail is cut before the first append.
    pub(super) messages: Journal,
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

    /// Writes instance.json; a failure is logged, not returned (its
    /// counters catch up at the next write).
    pub(super) fn write_info_or_warn(&self) {
        if let Err(error) = self.write_info() {
            tracing::warn!(target: LOG_TARGET, "instance.json of {} not updated: {error}", self.dir.display());
        }
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

    /// Takes an expired instance back (see [`mark_expired`]): called by the
    /// process that runs it, holding its lock, before its first turn. The
    /// mark is read from disk (a service may have set it after this store
    /// was opened) and, if set, cleared in instance.json with an
    /// `instance.revived` record in the event log; the conversation was
    /// never touched. Returns when it had expired, if it had.
    pub fn revive(&mut self) -> Result<Option<u64>, StoreError> {
        let on_disk = read_info(&self.info_path)?.and_then(|info| info.expired_at);
        let Some(expired_at) = on_disk.or(self.info.expired_at) else { return Ok(None) };
        self.info.expired_at = None;
        self.info.collect_at = None;
        self.write_info()?;
        let record = serde_json::json!({
            "type": "instance.revived",
            "timestamp": now_millis(),
            "agentName": self.info.agent_name,
            "instanceKey": self.info.instance_key,
            "expiredAt": expired_at,
        });
        append_event_record(&self.events_path, &record)?;
        Ok(Some(expired_at))
    }

    pub(super) fn write_info(&self) -> Result<(), StoreError> {
        goondan_core::fault::before_write(goondan_core::fault::Point::InstanceInfo)
            .map_err(StoreError::io("writing", &self.info_path))?;
        write_info_atomically(&self.dir, &self.info_path, &self.info)?;
        goondan_core::fault::after_write(goondan_core::fault::Point::InstanceInfo);
        Ok(())
    }
}

pub(super) fn new_info(instance_key: &str, agent_name: &str, bundle: String) -> InstanceInfo {
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
        expired_at: None,
        collect_at: None,
    }
}

/// Appends one record to the event log at `path` and syncs it (the caller
/// holds the instance's lock: one writer at a time).
pub(super) fn append_event_record(path: &Path, record: &serde_json::Value) -> Result<(), StoreError> {
    let mut line = serde_json::to_vec(record).map_err(StoreError::json("serializing an event for", path))?;
    line.push(b'\n');
    let mut journal = Journal::open::<serde::de::IgnoredAny>(path)
        .map_err(|error| StoreError::from_journal(error, Some("opening the event log")))?;
    journal
        .append(&line, &[goondan_core::fault::Point::EventsLog])
        .map_err(|error| StoreError::from_journal(error, None))
}

/// What [`mark_expired`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Marked expired now; collected at `collect_at`.
    Expired {
        /// When it is collected (ms since the epoch).
        collect_at: u64,
    },
    /// It is active again (a turn since the caller looked), expired
    /// already, or gone: nothing was written.
    Kept,
}

/// Marks the instance in `dir` (of `agent` and `key`) expired, durably,
/// if it still has been idle for `ttl_ms` at `now` (its instance.json's
/// `updatedAt`) and is not expired yet: `expiredAt` and `collectAt`
/// (`now + grace_ms`) in instance.json (replaced atomically) and an
/// `instance.expired` record in its event log. The decision is taken under
/// the instance's lock, so a process that runs it (and would be updating
/// it) makes this [`StoreError::Busy`] instead.
pub fn mark_expired(
    dir: &Path,
    agent: &str,
    key: &str,
    ttl_ms: u64,
    grace_ms: u64,
    now: u64,
) -> Result<Expiry, StoreError> {
    let _held = super::lock::hold_lock(dir, agent, key)?;
    let info_path = dir.join(InstanceStore::INFO_FILE);
    let Some(mut info) = read_info(&info_path)? else { return Ok(Expiry::Kept) };
    if info.agent_name != agent || info.instance_key != key {
        return Err(StoreError::KeyMismatch {
            path: info_path,
            expected_agent: agent.to_owned(),
            expected_key: key.to_owned(),
            found_agent: info.agent_name,
            found_key: info.instance_key,
        });
    }
    if info.expired_at.is_some() || now.saturating_sub(info.updated_at) < ttl_ms {
        return Ok(Expiry::Kept);
    }
    let collect_at = now.saturating_add(grace_ms);
    info.expired_at = Some(now);
    info.collect_at = Some(collect_at);
    write_info_atomically(dir, &info_path, &info)?;
    let record = serde_json::json!({
        "type": "instance.expired",
        "timestamp": now,
        "agentName": agent,
        "instanceKey": key,
        "idleSince": info.updated_at,
        "collectAt": collect_at,
    });
    append_event_record(&dir.join(InstanceStore::EVENTS_FILE), &record)?;
    Ok(Expiry::Expired { collect_at })
}

/// The instance.json of the instance directory `dir`, or `None` if it has
/// none (read without a lock: a process may be replacing it, atomically).
pub fn read_instance_info(dir: &Path) -> Result<Option<InstanceInfo>, StoreError> {
    read_info(&dir.join(InstanceStore::INFO_FILE))
}

/// instance.json, or `None` if it does not exist.
pub(super) fn read_info(path: &Path) -> Result<Option<InstanceInfo>, StoreError> {
    read_json(path, "reading instance metadata from")
}

/// Removes the temp files of atomic replaces (`.<name>.<pid>.tmp`) that a
/// process killed mid-write left in the instance directory `dir`: those of
/// processes no longer alive (the caller holds the instance's lock).
pub(super) fn remove_stale_temps(dir: &Path) {
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
pub(super) fn process_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) S …`: the state follows the last `)`.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Replaces `path` with `info`: write a temp file beside it, sync it, rename it over.
pub(super) fn write_info_atomically(dir: &Path, path: &Path, info: &InstanceInfo) -> Result<(), StoreError> {
    write_json_atomically(dir, path, info)
}
