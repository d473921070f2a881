//! The status file of a running service.
//!
//! A service writes `<workspace>/service.json` (pid, start time, bundle,
//! Connections, listening addresses, log file) once its connectors run,
//! and removes it when it stops. The file alone can be stale (a `kill -9`
//! leaves it); the inbox's lock tells: a service that runs holds it. So a
//! reader trusts the file only while the lock is held.

use std::io::Write as _;
use std::path::Path;

use goondan_runtime::store::private_file;
use serde::{Deserialize, Serialize};

/// The file's name in a workspace.
pub const STATUS_FILE: &str = "service.json";

/// What a running service says of itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatus {
    /// Its process.
    pub pid: u32,
    /// When it started (ms since the epoch).
    pub started_at: u64,
    /// The bundle file it serves.
    pub bundle: String,
    /// The Swarm.
    pub swarm: String,
    /// Its Connections.
    pub connections: Vec<String>,
    /// What its HTTP connectors listen on.
    pub listening: Vec<String>,
    /// Where its logs go (standard error when `None`).
    #[serde(default)]
    pub log: Option<String>,
    /// Its control socket (see [`crate::control`]).
    #[serde(default)]
    pub control: Option<String>,
    /// How long a stop of it may take, in seconds: its drain, the time
    /// cancelled turns get to end, and its agent processes' grace (a
    /// Swarm's `policy.shutdown.gracePeriodSeconds` may make it minutes):
    /// `gdn stop` waits that long by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_within_secs: Option<u64>,
}

impl ServiceStatus {
    /// Writes it into `workspace_dir` (temp file, then rename).
    pub fn write(&self, workspace_dir: &Path) -> std::io::Result<()> {
        use goondan_core::fault::{Point, after_write, before_write};
        let path = workspace_dir.join(STATUS_FILE);
        let temp = workspace_dir.join(format!(".{STATUS_FILE}.{}", std::process::id()));
        let written = before_write(Point::ServiceStatus)
            .and_then(|()| private_file().write(true).create(true).truncate(true).open(&temp))
            .and_then(|mut file| {
                file.write_all(serde_json::to_string_pretty(self).map_err(std::io::Error::other)?.as_bytes())?;
                file.sync_all()
            })
            .and_then(|()| std::fs::rename(&temp, path));
        match written {
            Ok(()) => after_write(Point::ServiceStatus),
            // No half-written temp file is left behind (a full disk).
            Err(_) => {
                let _ = std::fs::remove_file(&temp);
            }
        }
        written
    }

    /// Removes the file of `workspace_dir`.
    pub fn remove(workspace_dir: &Path) {
        let _ = std::fs::remove_file(workspace_dir.join(STATUS_FILE));
    }

    /// The status of the service running on `workspace_dir`, if one runs
    /// (its inbox is locked); a stale file is ignored.
    pub fn running(workspace_dir: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(workspace_dir.join(STATUS_FILE)).ok()?;
        let status: Self = serde_json::from_str(&text).ok()?;
        inbox_locked(workspace_dir).then_some(status)
    }
}

/// Whether a process holds the workspace's inbox (a service runs on it).
pub fn inbox_locked(workspace_dir: &Path) -> bool {
    goondan_ingress::inbox::is_held(&workspace_dir.join(goondan_ingress::inbox::INBOX_FILE))
}

/// The variable that tells a detached service where its logs go.
pub const LOG_ENV: &str = "GOONDAN_SERVICE_LOG";
