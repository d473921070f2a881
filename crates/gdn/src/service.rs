//! The service's command line: `gdn run --detach` (a service in the
//! background), `gdn stop`, and how a serving service's lines and event
//! turns' answers are printed (`goondan-service` serves; it prints nothing).

use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use goondan_orchestrator::Orchestrator;
use goondan_runtime::store::{create_private_dir_all, private_file};
use goondan_service::control::FullRestart;
use goondan_service::plan::ConnectionPlan;
use goondan_service::serve::{Answers, EventAnswer, Report, ServeError, ServeOptions, Serving, Stopped};
use goondan_service::shutdown::Shutdown;
use goondan_service::status::{LOG_ENV, ServiceStatus, inbox_locked};

use crate::cli::GlobalOptions;
use crate::exit;
use crate::output::{self, Output};

/// Serves the Connections `plans` as `gdn run` does (`--json`: status
/// lines as JSON on standard output); the exit code, and the full restart
/// asked for, if any.
pub async fn serve(
    plans: Vec<ConnectionPlan>,
    orchestrator: &Orchestrator,
    options: ServeOptions,
    shutdown: &Shutdown,
    json: bool,
    out: &mut Output,
) -> Result<(u8, Option<FullRestart>)> {
    let swarm = options.swarm.clone();
    let mut lines = Lines { json, out, swarm: &swarm };
    let served = goondan_service::serve::serve(plans, orchestrator, options, shutdown, &mut lines).await;
    match served {
        Ok(served) => Ok((if served.failed { exit::FAILED } else { exit::OK }, served.restart)),
        Err(error) => {
            output::error_line(&mut out.stderr, &error)?;
            let code = match error {
                ServeError::InboxBusy(_) => exit::USAGE,
                ServeError::Connector(_) => exit::CONFIG,
                ServeError::Inbox(_) => exit::FAILED,
            };
            Ok((code, None))
        }
    }
}

/// Each event turn's answer on standard output: where the `cli`
/// connector's user reads it (other channels answer through tools).
pub struct AnswerLines {
    /// `--json`: a JSON line per turn instead of the answer's text.
    pub json: bool,
}

impl Answers for AnswerLines {
    fn answered(&self, answered: &EventAnswer<'_>) {
        let EventAnswer { turn, instance, answer } = answered;
        let text = answer.response.clone().unwrap_or_default();
        let mut stdout = anstream::stdout();
        let line = if self.json {
            serde_json::json!({
                "status": "turn",
                "connection": turn.entry.connection,
                "event": turn.entry.event.name,
                "deliveryKey": turn.key,
                "agent": instance.agent,
                "instanceKey": instance.instance_key,
                "end": answer.turn.as_ref().map(|t| t.end.clone()),
                "text": text,
            })
            .to_string()
        } else if text.is_empty() {
            return;
        } else {
            format!("{instance} › {text}")
        };
        let _ = writeln!(stdout, "{line}");
        let _ = stdout.flush();
    }
}

/// A serving service's lines: on standard error (dim), or with `--json`
/// as JSON on standard output. Status lines are never fatal: standard
/// error may be a log on a full disk (`--detach`), and the service serves
/// on regardless.
struct Lines<'a> {
    json: bool,
    out: &'a mut Output,
    swarm: &'a str,
}

impl Report for Lines<'_> {
    fn serving(&mut self, serving: &Serving<'_>) {
        let Serving { connections, listening, resumed } = *serving;
        // The original's runner prints this once it serves; tools that drive
        // `gdn run` wait for it (its eval harness). On standard error, in
        // both modes, so that `--json`'s standard output stays JSON.
        let _ =
            writeln!(self.out.stderr, "[goondan-orchestrator] started pid={} swarm={}", std::process::id(), self.swarm);
        if self.json {
            let line = serde_json::json!({
                "status": "serving",
                "connections": connections,
                "listening": listening,
                "resumed": resumed,
            });
            let _ = writeln!(self.out.stdout, "{line}");
            let _ = self.out.stdout.flush();
        } else {
            let _ = writeln!(
                self.out.stderr,
                "{}serving {} Connection(s): {}{}{} — Ctrl-C to stop{}",
                output::DIM,
                connections.len(),
                connections.join(", "),
                if listening.is_empty() { String::new() } else { format!(" ({})", listening.join(", ")) },
                if resumed > 0 { format!("; {resumed} event(s) from the last run resumed") } else { String::new() },
                output::DIM.render_reset()
            );
        }
    }

    /// A status line of the service (dim on a terminal), also logged.
    fn note(&mut self, line: std::fmt::Arguments<'_>) {
        tracing::debug!("{line}");
        let _ = writeln!(self.out.stderr, "{}{line}{}", output::DIM, output::DIM.render_reset());
    }

    fn error(&mut self, line: std::fmt::Arguments<'_>) {
        let _ = output::error_line(&mut self.out.stderr, line);
    }

    fn kept_running(&mut self, what: &str, errors: &[String]) {
        tracing::debug!("watch: {what}; what runs is kept: {}", errors.join("; "));
        let _ = output::error_line(&mut self.out.stderr, format_args!("{what}; the running one is kept:"));
        for error in errors {
            let _ = writeln!(self.out.stderr, "  {error}");
        }
    }

    fn stopped(&mut self, stopped: &Stopped<'_>) {
        let Stopped { reason, pending, not_started, restarting } = *stopped;
        if self.json {
            let line = serde_json::json!({"status": "stopped", "reason": reason, "pending": pending, "notStarted": not_started});
            let _ = writeln!(self.out.stdout, "{line}");
        } else if restarting {
            let kept = if pending > 0 {
                format!("; {pending} event(s) stay stored and run once it serves")
            } else {
                String::new()
            };
            self.note(format_args!("↻ restarting ({reason}){kept}"));
        } else if pending > 0 {
            let _ = writeln!(
                self.out.stderr,
                "{}stopped ({reason}); {pending} event(s) stay stored and run at the next start{}",
                output::DIM,
                output::DIM.render_reset()
            );
        }
    }
}

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
        return out.fail(
            exit::USAGE,
            format_args!("a service of this project already runs (pid {}); gdn stop stops it", running.pid),
        );
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
            return out.fail(
                exit::FAILED,
                format_args!(
                    "the service (pid {}) is not serving after 120 s; log: {}",
                    child.id(),
                    log_path.display()
                ),
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How long `gdn stop` waits by default: as long as the service says its
/// stop may take (a Swarm's long grace period), and at least 60 s.
fn default_stop_wait(status: Option<&ServiceStatus>) -> u64 {
    status.and_then(|status| status.stop_within_secs).map_or(60, |secs| secs.saturating_add(5).max(60))
}

/// Whether process `pid` runs: it exists and is not a zombie.
fn process_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's closing parenthesis.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// `gdn stop`: SIGTERM to the project's service, then wait until it let go
/// of its inbox (it drains first: running turns get their grace period)
/// and its process has ended.
pub fn stop(global: &GlobalOptions, wait_secs: Option<u64>, out: &mut Output) -> Result<u8> {
    let workspace = match crate::workspace::workspace_or_exit_saying(global, out, "no such workspace")? {
        Ok(workspace) => workspace,
        Err(code) => return Ok(code),
    };
    let dir: PathBuf = workspace.dir().to_path_buf();
    // A service whose status file could not be written (a full disk) is
    // found by its inbox's lock, which names its pid.
    let status = ServiceStatus::running(&dir);
    let wait_secs = wait_secs.unwrap_or_else(|| default_stop_wait(status.as_ref()));
    let running = status
        .map(|status| status.pid)
        .or_else(|| goondan_ingress::inbox::holder_pid(&dir.join(goondan_ingress::inbox::INBOX_FILE)));
    let Some(service_pid) = running else {
        writeln!(out.stderr, "no service of this project is running ({})", dir.display())?;
        return Ok(exit::OK);
    };
    let pid = nix::unistd::Pid::from_raw(i32::try_from(service_pid).unwrap_or(i32::MAX));
    if let Err(error) = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM) {
        return out.fail(exit::FAILED, format_args!("cannot signal the service (pid {service_pid}): {error}"));
    }
    writeln!(out.stderr, "stopping the service (pid {service_pid}): running turns finish first …")?;
    let deadline = std::time::Instant::now() + Duration::from_secs(wait_secs);
    // Its inbox is released before its agent processes have ended and
    // released their instances: stopped means the service's process is
    // gone (or a zombie its parent has not reaped), so that nothing of it
    // still writes to the state root once this returns.
    while inbox_locked(&dir) || process_running(service_pid) {
        if std::time::Instant::now() > deadline {
            return out.fail(
                exit::FAILED,
                format_args!("the service (pid {service_pid}) is still stopping after {wait_secs} s"),
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    writeln!(out.stderr, "stopped")?;
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdn_stop_waits_as_long_as_the_services_stop_may_take_and_at_least_a_minute() {
        let status = |stop_within_secs| ServiceStatus {
            pid: 1,
            started_at: 0,
            bundle: String::new(),
            swarm: String::new(),
            connections: Vec::new(),
            listening: Vec::new(),
            log: None,
            control: None,
            stop_within_secs,
        };
        assert_eq!(default_stop_wait(None), 60);
        assert_eq!(default_stop_wait(Some(&status(None))), 60, "a service of an earlier version");
        assert_eq!(default_stop_wait(Some(&status(Some(45)))), 60);
        // gracePeriodSeconds: 300 drains for 300 s, then gives its processes 300 s.
        assert_eq!(default_stop_wait(Some(&status(Some(615)))), 620);
    }
}
