//! `gdn restart [--agent NAME] [--fresh]` and `gdn instance restart KEY
//! [--fresh]`: the project's running service is asked through its control
//! socket (`goondan_service::control`); what restarts finishes its running turn
//! first.

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::Result;
use goondan_runtime::store::{StoreError, Workspace};

use crate::cli::{GlobalOptions, RestartArgs};
use crate::exit;
use crate::output::{self, Output};
use goondan_service::control::{ControlReply, ControlRequest};
use goondan_service::status::ServiceStatus;

/// Sends `request` to the running `service`; the reply, or the exit code
/// of the error printed.
pub(crate) fn ask(
    service: &ServiceStatus,
    request: &ControlRequest,
    wait: Duration,
    out: &mut Output,
) -> Result<Result<ControlReply, u8>> {
    let Some(socket) = &service.control else {
        output::error_line(
            &mut out.stderr,
            format_args!(
                "the running service (pid {}) has no control socket (an earlier gdn started it): gdn stop, then gdn run",
                service.pid
            ),
        )?;
        return Ok(Err(exit::FAILED));
    };
    match goondan_service::control::request(std::path::Path::new(socket), request, wait) {
        Ok(reply) => Ok(Ok(reply)),
        Err(message) => {
            output::error_line(&mut out.stderr, message)?;
            Ok(Err(exit::FAILED))
        }
    }
}

/// Prints what a restart (or delete) did; the exit code: a refusal for a
/// bundle on disk that does not load is a configuration error (3, as the
/// original's restart of an invalid bundle), other refusals 1.
pub(crate) fn report(global: &GlobalOptions, reply: &ControlReply, out: &mut Output) -> Result<u8> {
    let refused = if reply.diagnostics.is_empty() { exit::FAILED } else { exit::CONFIG };
    if global.json {
        writeln!(out.stdout, "{}", serde_json::to_string_pretty(reply)?)?;
        return Ok(if reply.ok { exit::OK } else { refused });
    }
    if let Some(error) = &reply.error {
        output::error_line(&mut out.stderr, error)?;
        for diagnostic in &reply.diagnostics {
            writeln!(out.stderr, "  {diagnostic}")?;
        }
        return Ok(refused);
    }
    for stopped in &reply.stopped {
        writeln!(out.stdout, "stopped {} (pid {}) after its running turn", stopped.instance, stopped.pid)?;
    }
    for reset in &reply.reset {
        writeln!(out.stdout, "cleared the conversation of {reset}")?;
    }
    for deleted in &reply.deleted {
        writeln!(out.stdout, "{}✓{} deleted instance {deleted}", output::OK, output::OK.render_reset())?;
    }
    Ok(exit::OK)
}

/// `gdn restart`.
pub fn restart(global: &GlobalOptions, args: &RestartArgs, out: &mut Output) -> Result<u8> {
    let workspace = match crate::workspace::workspace_or_exit(global, out)? {
        Ok(workspace) => workspace,
        Err(code) => return Ok(code),
    };
    // No service to restart: the original's class for it is configuration.
    let Some(service) = ServiceStatus::running(workspace.dir()) else {
        return out.fail(
            exit::CONFIG,
            format_args!("no service of this project is running ({}); gdn run starts one", workspace.dir().display()),
        );
    };
    let wait = Duration::from_secs(args.wait_secs);
    let request = ControlRequest::Restart { agent: args.agent.clone(), fresh: args.fresh };
    if let Some(agent) = &args.agent {
        if !global.json {
            writeln!(
                out.stderr,
                "{}restarting agent '{agent}' in the service (pid {}): its running turns finish first …{}",
                output::DIM,
                service.pid,
                output::DIM.render_reset()
            )?;
        }
        let reply = match ask(&service, &request, wait, out)? {
            Ok(reply) => reply,
            Err(code) => return Ok(code),
        };
        if reply.ok && reply.stopped.is_empty() && !global.json {
            writeln!(out.stdout, "agent '{agent}' had no running process")?;
        }
        let code = report(global, &reply, out)?;
        if reply.ok && !global.json {
            writeln!(out.stdout, "agent '{agent}' restarted: its next message starts it with the bundle as it is now")?;
        }
        return Ok(code);
    }
    let reply = match ask(&service, &request, wait, out)? {
        Ok(reply) => reply,
        Err(code) => return Ok(code),
    };
    if !reply.ok {
        return report(global, &reply, out);
    }
    if !global.json {
        writeln!(
            out.stderr,
            "{}restarting the service (pid {}): running turns finish first …{}",
            output::DIM,
            service.pid,
            output::DIM.render_reset()
        )?;
    }
    // Served again once a status file newer than the old one is there
    // (the service starts again in the same process).
    let deadline = Instant::now() + wait;
    loop {
        if let Some(now) = ServiceStatus::running(workspace.dir())
            && now.started_at > service.started_at
        {
            if global.json {
                writeln!(out.stdout, "{}", serde_json::json!({"ok": true, "service": now}))?;
            } else {
                writeln!(
                    out.stdout,
                    "service restarted (pid {}){}: Connections {}",
                    now.pid,
                    if args.fresh { ", conversations cleared" } else { "" },
                    now.connections.join(", ")
                )?;
            }
            return Ok(exit::OK);
        }
        let alive = process_alive(service.pid);
        if !alive || Instant::now() > deadline {
            let why =
                if alive { format!("is not serving again after {} s", wait.as_secs()) } else { "ended".to_owned() };
            let log = service.log.as_deref().map(|log| format!("; log: {log}")).unwrap_or_default();
            return out
                .fail(exit::FAILED, format_args!("the service (pid {}) {why} while restarting{log}", service.pid));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether process `pid` still runs: it exists and is not a zombie (a
/// service that ended while its parent, a shell or a supervisor, has not
/// reaped it yet is gone all the same).
fn process_alive(pid: u32) -> bool {
    let exists =
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX)), None).is_ok();
    // `/proc/<pid>/stat`: "pid (comm) STATE …"; comm may hold spaces and parentheses.
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])))
        .unwrap_or(false);
    exists && !zombie
}

/// `gdn instance restart KEY [--fresh]`.
pub fn instance_restart(global: &GlobalOptions, key: &str, fresh: bool, out: &mut Output) -> Result<u8> {
    let workspace = match crate::workspace::workspace_or_exit(global, out)? {
        Ok(workspace) => workspace,
        Err(code) => return Ok(code),
    };
    let known = instance_exists(&workspace, key);
    if let Some(service) = ServiceStatus::running(workspace.dir()) {
        let request = ControlRequest::RestartInstance { key: key.to_owned(), fresh };
        let reply = match ask(&service, &request, Duration::from_secs(600), out)? {
            Ok(reply) => reply,
            Err(code) => return Ok(code),
        };
        if reply.ok && reply.stopped.is_empty() && reply.reset.is_empty() && !known {
            return unknown_key(&workspace, key, out);
        }
        let code = report(global, &reply, out)?;
        if reply.ok && !global.json {
            writeln!(
                out.stdout,
                "instance '{key}' restarted: its next message starts it with the bundle as it is now"
            )?;
        }
        return Ok(code);
    }
    if !known {
        return unknown_key(&workspace, key, out);
    }
    if !fresh {
        writeln!(
            out.stdout,
            "no service of this project runs, so no process of instance '{key}' does: its next turn loads the bundle as it is"
        )?;
        return Ok(exit::OK);
    }
    match goondan_runtime::store::reset_conversations(&workspace, Some(key), None) {
        Ok(reset) => {
            let reply = ControlReply {
                ok: true,
                reset: reset
                    .iter()
                    .map(|r| goondan_ipc::AgentInstance::new(&r.agent_name, &r.instance_key).to_string())
                    .collect(),
                ..ControlReply::default()
            };
            report(global, &reply, out)
        }
        Err(StoreError::Busy { agent, pid, .. }) => {
            let pid = pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default();
            out.fail(
                exit::FAILED,
                format_args!(
                    "instance '{key}' of agent '{agent}' runs in a gdn run that is not a service{pid}; end that run first (nothing was cleared)"
                ),
            )
        }
        Err(error) => Err(anyhow::anyhow!("{error}")),
    }
}

/// Whether the workspace holds an instance of `key`.
fn instance_exists(workspace: &Workspace, key: &str) -> bool {
    workspace.instance_dirs().iter().any(|(_, found, _)| found == key)
}

fn unknown_key(workspace: &Workspace, key: &str, out: &mut Output) -> Result<u8> {
    out.fail(
        exit::USAGE,
        format_args!("no instance '{key}' in workspace '{}' (gdn instance list shows the keys)", workspace.id()),
    )
}
