//! The status file of a running service, and `gdn stop`.
//!
//! A service writes `<workspace>/service.json` (pid, start time, bundle,
//! Connections, listening addresses, log file) once its connectors run,
//! and removes it when it stops. The file alone can be stale (a `kill -9`
//! leaves it); the inbox's lock tells: a service that runs holds it. So a
//! reader trusts the file only while the lock is held.

use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use goondan_runtime::store::{create_private_dir_all, private_file};
use serde::{Deserialize, Serialize};

use crate::cli::GlobalOptions;
use crate::exit;
use crate::output::{self, Output};

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
    /// Its control socket (see `service_control`).
    #[serde(default)]
    pub control: Option<String>,
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

/// `gdn run --detach`: starts this same command without `--detach` in the
/// background (its own process group, standard input closed, output
/// appended to `<workspace>/logs/service.log`) and returns once it serves
/// (its status file names it) — or, if it ends first, with its exit code and
/// the end of its log, where its start-up error is.
pub fn detach(
    workspace_dir: &Path,
    secrets: &std::collections::BTreeMap<String, String>,
    started: &std::sync::atomic::AtomicBool,
    out: &mut Output,
) -> Result<u8> {
    if let Some(running) = ServiceStatus::running(workspace_dir) {
        output::error_line(
            &mut out.stderr,
            format_args!("a service of this project already runs (pid {}); gdn stop stops it", running.pid),
        )?;
        return Ok(exit::USAGE);
    }
    let logs = workspace_dir.join("logs");
    create_private_dir_all(&logs)?;
    let log_path = logs.join("service.log");
    let log = private_file().create(true).append(true).open(&log_path)?;
    let start = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0);
    let program = std::env::current_exe()?;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).filter(|arg| arg != "--detach").collect();
    let mut child = std::process::Command::new(program)
        .args(args)
        // The secrets `main` took out of this environment go back into the
        // child's, which takes them out again the same way.
        .envs(secrets)
        .env(LOG_ENV, &log_path)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Out of the terminal's foreground group: closing the terminal or a
        // Ctrl-C there does not reach it.
        .process_group(0)
        .spawn()?;
    started.store(true, std::sync::atomic::Ordering::SeqCst);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = ServiceStatus::running(workspace_dir).filter(|s| s.pid == child.id()) {
            writeln!(
                out.stderr,
                "service started (pid {}): Connections {}{}; logs: {}; `gdn stop` stops it",
                status.pid,
                status.connections.join(", "),
                if status.listening.is_empty() { String::new() } else { format!(" ({})", status.listening.join(", ")) },
                log_path.display()
            )?;
            return Ok(exit::OK);
        }
        if let Some(ended) = child.try_wait()? {
            let text = std::fs::read(&log_path).unwrap_or_default();
            let tail = String::from_utf8_lossy(text.get(usize::try_from(start).unwrap_or(0)..).unwrap_or_default());
            write!(out.stderr, "{tail}")?;
            output::error_line(
                &mut out.stderr,
                format_args!("the service did not start ({ended}); log: {}", log_path.display()),
            )?;
            return Ok(u8::try_from(ended.code().unwrap_or(1)).unwrap_or(1).max(1));
        }
        if std::time::Instant::now() > deadline {
            output::error_line(
                &mut out.stderr,
                format_args!(
                    "the service (pid {}) is not serving after 120 s; log: {}",
                    child.id(),
                    log_path.display()
                ),
            )?;
            return Ok(exit::FAILED);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `gdn stop`: SIGTERM to the project's service, then wait until it let go
/// of its inbox (it drains first: running turns get their grace period).
pub fn stop(global: &GlobalOptions, wait_secs: u64, out: &mut Output) -> Result<u8> {
    let root = crate::workspace::state_root(global)?;
    let workspace = match crate::workspace::project_workspace(global, &root) {
        Ok(Some(workspace)) => workspace,
        Ok(None) => {
            output::error_line(&mut out.stderr, "no such workspace")?;
            return Ok(exit::USAGE);
        }
        Err(message) => {
            output::error_line(&mut out.stderr, message)?;
            return Ok(exit::USAGE);
        }
    };
    let dir: PathBuf = workspace.dir().to_path_buf();
    // A service whose status file could not be written (a full disk) is
    // found by its inbox's lock, which names its pid.
    let running = ServiceStatus::running(&dir)
        .map(|status| status.pid)
        .or_else(|| goondan_ingress::inbox::holder_pid(&dir.join(goondan_ingress::inbox::INBOX_FILE)));
    let Some(service_pid) = running else {
        writeln!(out.stderr, "no service of this project is running ({})", dir.display())?;
        return Ok(exit::OK);
    };
    let pid = nix::unistd::Pid::from_raw(i32::try_from(service_pid).unwrap_or(i32::MAX));
    if let Err(error) = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM) {
        output::error_line(&mut out.stderr, format_args!("cannot signal the service (pid {service_pid}): {error}"))?;
        return Ok(exit::FAILED);
    }
    writeln!(out.stderr, "stopping the service (pid {service_pid}): running turns finish first …")?;
    let deadline = std::time::Instant::now() + Duration::from_secs(wait_secs);
    while inbox_locked(&dir) {
        if std::time::Instant::now() > deadline {
            output::error_line(
                &mut out.stderr,
                format_args!("the service (pid {service_pid}) is still stopping after {wait_secs} s"),
            )?;
            return Ok(exit::FAILED);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    writeln!(out.stderr, "stopped")?;
    Ok(exit::OK)
}
