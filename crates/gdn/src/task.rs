//! `gdn task list|show|cancel`: the tasks (pending tool results that
//! complete later) of the project's agent instances, read from their books
//! (`<instance>/tasks.jsonl`, never written here); a cancel goes through
//! the running service — or, without one, a running `gdn run` (see
//! `goondan_service::control`) — to the process that runs the task's work.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Result;
use goondan_core::message::now_millis;
use goondan_ipc::AgentInstance;
use goondan_runtime::store::Workspace;
use goondan_tools::tasks::{TaskState, TaskView};

use crate::cli::{GlobalOptions, TaskCommand};
use crate::exit;
use crate::output::{self, Output};
use goondan_service::control::ControlRequest;
use goondan_service::status::ServiceStatus;

/// A task and the instance it belongs to.
struct Found {
    instance: AgentInstance,
    dir: PathBuf,
    task: TaskView,
}

/// Every task of the workspace's instances.
fn all_tasks(workspace: &Workspace) -> Vec<Found> {
    let mut found = Vec::new();
    for (agent, key, dir) in workspace.instance_dirs() {
        let Ok(tasks) = goondan_runtime::tasks::read_tasks(&dir) else { continue };
        for task in tasks {
            found.push(Found { instance: AgentInstance::new(&agent, &key), dir: dir.clone(), task });
        }
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.task.created_at));
    found
}

fn find(workspace: &Workspace, handle: &str) -> Option<Found> {
    all_tasks(workspace).into_iter().find(|found| found.task.handle == handle)
}

fn unknown(workspace: &Workspace, handle: &str, out: &mut Output) -> Result<u8> {
    out.fail(
        exit::USAGE,
        format_args!("no task '{handle}' in workspace '{}' (gdn task list shows the handles)", workspace.id()),
    )
}

fn json_of(found: &Found) -> serde_json::Value {
    let mut value = serde_json::to_value(&found.task).unwrap_or_default();
    value["agentName"] = serde_json::json!(found.instance.agent);
    value["instanceKey"] = serde_json::json!(found.instance.instance_key);
    value
}

/// `gdn task …`.
pub fn task(global: &GlobalOptions, command: &TaskCommand, session: &crate::Session, out: &mut Output) -> Result<u8> {
    let workspace = match crate::workspace::workspace_or_exit(global, out)? {
        Ok(workspace) => workspace,
        Err(code) => return Ok(code),
    };
    let (TaskCommand::List { nats: Some(url) }
    | TaskCommand::Show { nats: Some(url), .. }
    | TaskCommand::Cancel { nats: Some(url), .. }) = command
    else {
        return match command {
            TaskCommand::List { .. } => list(global, &workspace, out),
            TaskCommand::Show { handle, .. } => show(global, &workspace, handle, out, true),
            TaskCommand::Cancel { handle, wait_secs, .. } => {
                cancel(global, &workspace, &workspace, handle, *wait_secs, &mut || Ok(()), out)
            }
        };
    };
    // A swarm spread over agent hosts: its instances' books, copied from the broker.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut copy = match crate::nats::take_copy_or_exit(&runtime, url, session, &workspace, out)? {
        Ok(copy) => copy,
        Err(code) => return Ok(code),
    };
    let copied = Workspace::at(&copy.workspace);
    match command {
        TaskCommand::Show { handle, .. } => show(global, &copied, handle, out, false),
        TaskCommand::Cancel { handle, wait_secs, .. } => {
            // The task's end is seen in the copy, taken again (at most
            // every 250 ms) while waiting.
            let mut refresh = || copy.refresh_every(&runtime, Duration::from_millis(250)).map_err(|e| e.to_string());
            cancel(global, &copied, &workspace, handle, *wait_secs, &mut refresh, out)
        }
        TaskCommand::List { .. } => list(global, &copied, out),
    }
}

fn list(global: &GlobalOptions, workspace: &Workspace, out: &mut Output) -> Result<u8> {
    let found = all_tasks(workspace);
    if global.json {
        let listed: Vec<serde_json::Value> = found.iter().map(json_of).collect();
        writeln!(out.stdout, "{}", serde_json::to_string_pretty(&listed)?)?;
        return Ok(exit::OK);
    }
    if found.is_empty() {
        writeln!(out.stdout, "no tasks in workspace '{}'", workspace.id())?;
        return Ok(exit::OK);
    }
    let now = now_millis();
    let rows: Vec<[String; 6]> = found
        .iter()
        .map(|f| {
            [
                f.task.handle.clone(),
                f.instance.to_string(),
                f.task.tool.clone(),
                f.task.state.to_string(),
                if f.task.received { "yes".to_owned() } else { "no".to_owned() },
                crate::instance::updated(f.task.updated_at, now),
            ]
        })
        .collect();
    let headers = ["HANDLE", "INSTANCE", "TOOL", "STATE", "DELIVERED", "UPDATED"];
    let mut widths = headers.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 6]| {
        cells.iter().zip(widths).map(|(cell, width)| format!("{cell:<width$}")).collect::<Vec<_>>().join("  ")
    };
    writeln!(out.stdout, "{}{}{}", output::BOLD, line(headers).trim_end(), output::BOLD.render_reset())?;
    for row in &rows {
        writeln!(out.stdout, "{}", line(row.each_ref().map(String::as_str)).trim_end())?;
    }
    Ok(exit::OK)
}

/// `local`: the workspace is this machine's, where a process that runs the
/// instance holds its lock (not so in a copy from the broker).
fn show(global: &GlobalOptions, workspace: &Workspace, handle: &str, out: &mut Output, local: bool) -> Result<u8> {
    let Some(found) = find(workspace, handle) else { return unknown(workspace, handle, out) };
    if global.json {
        writeln!(out.stdout, "{}", serde_json::to_string_pretty(&json_of(&found))?)?;
        return Ok(exit::OK);
    }
    let task = &found.task;
    writeln!(out.stdout, "{}{}{}", output::BOLD, task.handle, output::BOLD.render_reset())?;
    writeln!(out.stdout, "  instance   {}", found.instance)?;
    writeln!(out.stdout, "  tool       {} (call {}, turn {})", task.tool, task.call_id, task.turn_id)?;
    writeln!(out.stdout, "  state      {}", task.state)?;
    writeln!(out.stdout, "  delivered  {}", if task.received { "yes" } else { "no" })?;
    writeln!(out.stdout, "  created    {}", goondan_core::js_message::format_rfc3339_millis(task.created_at))?;
    writeln!(out.stdout, "  updated    {}", goondan_core::js_message::format_rfc3339_millis(task.updated_at))?;
    if let Some(reason) = &task.reason {
        writeln!(out.stdout, "  reason     {reason}")?;
    }
    if let Some(result) = &task.result {
        writeln!(
            out.stdout,
            "  result     {}",
            serde_json::to_string_pretty(result)?.replace('\n', "\n             ")
        )?;
    }
    if local && !task.state.is_final() && !goondan_runtime::store::lock_status(&found.dir).is_ok_and(|s| s.running) {
        writeln!(
            out.stdout,
            "  (no process runs {}: its work has ended, and it is failed when the instance next starts)",
            found.instance
        )?;
    }
    Ok(exit::OK)
}

/// Cancels the task `handle` found in `workspace` through the service
/// running on `served` (the same workspace, but for a swarm spread over
/// agent hosts: then `workspace` is the copy from the broker, and
/// `refresh` takes it again while the cancel is awaited).
fn cancel(
    global: &GlobalOptions,
    workspace: &Workspace,
    served: &Workspace,
    handle: &str,
    wait_secs: u64,
    refresh: &mut dyn FnMut() -> std::result::Result<(), String>,
    out: &mut Output,
) -> Result<u8> {
    let Some(found) = find(workspace, handle) else { return unknown(workspace, handle, out) };
    if found.task.state.is_final() {
        return out.fail(
            exit::FAILED,
            format_args!("task '{handle}' has already ended ({}); nothing was changed", found.task.state),
        );
    }
    let request = ControlRequest::CancelTask {
        agent: found.instance.agent.clone(),
        key: found.instance.instance_key.clone(),
        handle: handle.to_owned(),
    };
    let instance = &found.instance;
    if let Some(service) = ServiceStatus::running(served.dir()) {
        let reply = match crate::restart::ask(&service, &request, Duration::from_secs(30), out)? {
            Ok(reply) => reply,
            Err(code) => return Ok(code),
        };
        if !reply.cancel_sent {
            return out.fail(
                exit::FAILED,
                format_args!(
                    "the service (pid {}) runs no process of {instance}, so the cancel of task '{handle}' has no \
                     process to go to; gdn task show {handle} shows what its instance's book says",
                    service.pid
                ),
            );
        }
    } else if let Some(code) = cancel_through_runs(served, &request, instance, handle, out)? {
        return Ok(code);
    }
    let deadline = Instant::now() + Duration::from_secs(wait_secs);
    loop {
        if let Err(message) = refresh() {
            tracing::warn!("reading the swarm's state: {message}");
        }
        let now = goondan_runtime::tasks::read_tasks(&found.dir)
            .ok()
            .and_then(|tasks| tasks.into_iter().find(|task| task.handle == handle));
        if let Some(task) = now.filter(|task| task.state.is_final()) {
            let code = if task.state == TaskState::Cancelled { exit::OK } else { exit::FAILED };
            if global.json {
                let done = Found { task, ..found };
                writeln!(out.stdout, "{}", serde_json::to_string_pretty(&json_of(&done))?)?;
            } else {
                let why = task.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
                writeln!(out.stdout, "task {handle} {}{why}", task.state)?;
            }
            return Ok(code);
        }
        if Instant::now() > deadline {
            return out
                .fail(exit::FAILED, format_args!("task '{handle}' is still working {wait_secs} s after its cancel"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// No service: a gdn run without one (a one-shot run waiting for its
/// tasks, the interactive prompt) may run the instance. Sends the cancel
/// to each run of `served` until one takes it; the exit code of the error
/// printed if none does.
fn cancel_through_runs(
    served: &Workspace,
    request: &ControlRequest,
    instance: &AgentInstance,
    handle: &str,
    out: &mut Output,
) -> Result<Option<u8>> {
    let runs = goondan_service::control::running_runs(served.dir());
    let mut reached = Vec::new();
    for run in &runs {
        match goondan_service::control::request(Path::new(&run.control), request, Duration::from_secs(30)) {
            Ok(reply) if reply.cancel_sent => return Ok(None),
            Ok(reply) => match reply.error {
                Some(error) => tracing::warn!("gdn run (pid {}): {error}", run.pid),
                None => reached.push(run.pid.to_string()),
            },
            Err(error) => tracing::warn!("gdn run (pid {}): {error}", run.pid),
        }
    }
    let what = if reached.is_empty() {
        "no service and no gdn run of this project runs on this machine".to_owned()
    } else {
        format!(
            "no service of this project runs, and its gdn run (pid {}) runs no process of {instance}",
            reached.join(", ")
        )
    };
    output::error_line(
        &mut out.stderr,
        format_args!(
            "{what}, so the cancel of task '{handle}' has no process to go to; gdn task show {handle} shows \
             what its instance's book says"
        ),
    )?;
    Ok(Some(exit::FAILED))
}
