//! `bash` with `background: true`: the command runs on as a task of the
//! agent instance, and the call answers `pending` with the task's handle at
//! once.
//!
//! ```text
//! open a task (durable) ─► spawn the command (own process group, the call's marker)
//!   ─► pending {handle, command, cwd, pid, outputPath}
//! the task's work (a tokio task of the agent process):
//!   stdout and stderr ─► one file, <instance>/tasks/<handle>.log (at most
//!                        BACKGROUND_MAX_OUTPUT_BYTES; the rest is counted, not kept)
//!                      ─► the last TAIL_BYTES of each, in memory
//!   exit      ─► completed {exitCode, signal, timedOut, durationMs, stdoutTail, stderrTail, outputPath, …}
//!              (killed by a signal: exitCode -1 and the signal, as a foreground call reports it)
//!   timeoutMs ─► SIGTERM to the group, then SIGKILL: completed with timedOut and the signal
//!   cancel    ─► SIGTERM, then SIGKILL: cancelled, the reason naming the signal that ended it
//! ```
//!
//! The command lives as long as the agent process that started it: that
//! process kills the calls' marked processes when it ends, and `gdn` kills
//! those a dead agent process left (its tool processes carry its pid). A
//! task left `working` that way is failed at the instance's next start
//! (`goondan_runtime::tasks`).

use std::path::PathBuf;
use std::sync::Arc;

use goondan_core::ToolResult;
use goondan_core::codes::E_SPAWN_FAILED;
use goondan_core::codes::E_TASK_UNAVAILABLE;
use goondan_tools::tasks::TaskEnd;
use goondan_tools::{HandlerResult, ToolContext, ToolFailure, ToolOutput};
use nix::sys::signal::Signal;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

use crate::bash::{GroupGuard, Run, TERM_GRACE, signal_name};

/// The most of a background command's output kept in its file.
pub const BACKGROUND_MAX_OUTPUT_BYTES: u64 = 16 << 20;
/// How much of the end of each stream the result carries.
pub const TAIL_BYTES: usize = 4 << 10;

/// Starts `run` in the background; the pending result.
pub(crate) async fn start(run: Run, ctx: &ToolContext) -> HandlerResult {
    let tasks = ctx.tasks().cloned().ok_or_else(|| {
        ToolFailure::with_code(
            "a background command needs an agent instance to keep its task (run it in an agent's turn: gdn run)",
            E_TASK_UNAVAILABLE,
        )
        .suggest("Run it without 'background' here.")
    })?;
    let ticket = tasks.open(ctx).await?;
    let output_path = tasks.output_path(&ticket.handle);
    let log = match &output_path {
        Some(path) => {
            // Under the private state root: the user's only (0700/0600),
            // whatever the umask, as everything gdn keeps there.
            let created = async {
                if let Some(dir) = path.parent() {
                    tokio::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).await?;
                }
                tokio::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path).await
            };
            match created.await {
                Ok(file) => Some(file),
                Err(error) => {
                    let reason = format!("its output file {} could not be created: {error}", path.display());
                    let _ = tasks.finish(&ticket.handle, TaskEnd::Failed(reason.clone())).await;
                    return Err(ToolFailure::new(reason));
                }
            }
        }
        None => None,
    };
    let marker = run.processes.marker();
    let mut command = run.command(&marker);
    if let Err(failure) = run.confine(&mut command) {
        let _ = tasks.finish(&ticket.handle, TaskEnd::Failed(failure.message.clone())).await;
        return Err(failure);
    }
    let (_command, mut child) = match run.spawn(command).await {
        Ok(spawned) => spawned,
        Err(error) => {
            let message = format!("cannot start shell '{}': {error}", run.program);
            let _ = tasks.finish(&ticket.handle, TaskEnd::Failed(message.clone())).await;
            return Err(ToolFailure::with_code(message, E_SPAWN_FAILED));
        }
    };
    let pid = child.id();
    ctx.logger.debug(format_args!("bash: {} runs in the background as {}", run.shown, ticket.handle));
    let pending = json!({
        "background": true,
        "command": run.shown,
        "cwd": run.cwd.to_string_lossy(),
        "pid": pid,
        "outputPath": output_path.as_ref().map(|p| p.to_string_lossy().into_owned()),
        "message": "The command runs in the background; its result arrives as a message when it ends \
                    (or ask with tasks__status / tasks__wait).",
    });
    let guard = GroupGuard::new(pid, marker, Arc::clone(&run.processes));
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let handle = ticket.handle.clone();
    let mut cancelled = ticket.cancelled.clone();
    // Detached by design: the command's reaper outlives the call that started it (the task book ends it).
    tokio::spawn(async move {
        let started = Instant::now();
        let mut guard = guard;
        let log = log.map(|file| Arc::new(tokio::sync::Mutex::new(Capped { file, written: 0, dropped: 0 })));
        let mut out_tail = Vec::new();
        let mut err_tail = Vec::new();
        let mut timed_out = false;
        let mut cancel_signal = None;
        let status = {
            let mut all = std::pin::pin!(async {
                let output = async {
                    tokio::join!(copy(stdout, log.clone(), &mut out_tail), copy(stderr, log.clone(), &mut err_tail))
                };
                let (status, _) = tokio::join!(child.wait(), output);
                status
            });
            let deadline = async {
                match run.timeout {
                    Some(limit) => tokio::time::sleep(limit).await,
                    None => std::future::pending().await,
                }
            };
            let early = tokio::select! {
                status = &mut all => Some(status),
                () = deadline => {
                    timed_out = true;
                    None
                }
                _ = cancelled.wait_for(|c| *c) => {
                    cancel_signal = Some(());
                    None
                }
            };
            match early {
                Some(status) => status,
                None => {
                    // SIGTERM to the group, a grace, then SIGKILL to it and to
                    // everything carrying the call's marker.
                    guard.signal(Signal::SIGTERM);
                    let after_term = tokio::time::timeout(TERM_GRACE, &mut all).await.ok();
                    guard.signal(Signal::SIGKILL);
                    guard.kill_marked().await;
                    match after_term {
                        Some(status) => status,
                        None => all.await,
                    }
                }
            }
        };
        guard.disarm();
        let (written, dropped) = match &log {
            Some(log) => {
                let mut log = log.lock().await;
                let _ = log.file.flush().await;
                let _ = log.file.sync_data().await;
                (log.written, log.dropped)
            }
            None => (0, 0),
        };
        let end = match status {
            Ok(status) => {
                let signal = signal_name(status);
                let output = json!({
                    "command": run.shown,
                    "cwd": run.cwd.to_string_lossy(),
                    "durationMs": u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                    "exitCode": status.code().unwrap_or(-1),
                    "signal": signal,
                    "timedOut": timed_out,
                    "stdoutTail": String::from_utf8_lossy(&out_tail),
                    "stderrTail": String::from_utf8_lossy(&err_tail),
                    "outputPath": output_path.as_ref().map(|p: &PathBuf| p.to_string_lossy().into_owned()),
                    "outputBytes": written,
                    "outputDroppedBytes": dropped,
                });
                if cancel_signal.is_some() {
                    TaskEnd::Cancelled(format!(
                        "cancelled: the command was ended with {}",
                        signal.unwrap_or_else(|| format!("exit code {}", status.code().unwrap_or(-1)))
                    ))
                } else {
                    TaskEnd::Completed(ToolResult::ok(output))
                }
            }
            Err(error) => TaskEnd::Failed(format!("waiting for the command failed: {error}")),
        };
        if let Err(error) = tasks.finish(&handle, end).await {
            tracing::warn!(target: "goondan::tool", "bash: task {handle} could not be ended: {}", error.message);
        }
    });
    Ok(ToolOutput::Pending { handle: ticket.handle, output: Some(pending) })
}

/// The output file, bounded.
struct Capped {
    file: tokio::fs::File,
    written: u64,
    dropped: u64,
}

/// Copies `pipe` into the shared file (up to the bound) and keeps its last
/// [`TAIL_BYTES`] in `tail`.
async fn copy<R: AsyncRead + Unpin>(pipe: Option<R>, log: Option<Arc<tokio::sync::Mutex<Capped>>>, tail: &mut Vec<u8>) {
    let Some(mut pipe) = pipe else { return };
    let mut chunk = vec![0_u8; 64 * 1024];
    loop {
        let read = match pipe.read(&mut chunk).await {
            Ok(0) => return,
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        let data = chunk.get(..read).unwrap_or_default();
        tail.extend_from_slice(data);
        if tail.len() > TAIL_BYTES {
            let cut = tail.len() - TAIL_BYTES;
            tail.drain(..cut);
        }
        if let Some(log) = &log {
            let mut log = log.lock().await;
            let room = usize::try_from(BACKGROUND_MAX_OUTPUT_BYTES.saturating_sub(log.written)).unwrap_or(usize::MAX);
            let keep = room.min(data.len());
            if keep > 0 && log.file.write_all(data.get(..keep).unwrap_or_default()).await.is_ok() {
                log.written += keep as u64;
            }
            log.dropped += (data.len() - keep) as u64;
        }
    }
}
