//! `ctx.tasks` of a JavaScript tool: pending results whose work goes on in
//! the host after the call returned (spec 004 §6.3, issue 23).
//!
//! ```text
//! ctx.tasks.start()  ─► task {op: start, call}  ─► ctx.tasks().open(ctx) ─► {handle}
//!   return ctx.tasks.pending(task, output?)      ─► {__async: true, handle, ...output}: pending
//! task.complete(output) / task.fail(error)      ─► task {op: finish, handle, ok, output|error}
//!   (any time later)                               ─► the book that opened it: completed / failed
//! the book's cancel                              ─► taskCancel {handle}: task.signal aborts; a
//!                                                   `fail` after that ends it `cancelled`
//! the host process dies                          ─► every working task it holds ends `failed`
//! ```
//!
//! A tool that returned the bare `{__async: true, handle}` object names its
//! own handle; the executor adopts it, and the host session records it when
//! the result passes, so `ctx.tasks.complete(handle, output)` /
//! `ctx.tasks.fail(handle, error)` (on any call's `ctx`, also after that
//! call ended) reach the same book. Only handles this host process opened or
//! saw returned can be finished from JavaScript: a script cannot end
//! another tool's task (a background command's, say).
//!
//! Tasks belong to one host process: each keeps the
//! [`ToolTasks`](goondan_tools::tasks::ToolTasks) that opened or adopted it,
//! so a finish arriving long after the call ended reaches the right book.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use goondan_core::codes::{E_SCRIPT_HOST_EXITED, E_TASK_NOT_FOUND, E_TASK_UNAVAILABLE};
use goondan_core::{JsonValue, ToolResult};
use goondan_tools::ToolContext;
use goondan_tools::tasks::{TaskEnd, ToolTasks};
use serde_json::json;
use tokio::sync::mpsc;

use crate::protocol::ToHost;
use goondan_core::sync::LockUnpoisoned;

/// The tasks one host process holds, by handle.
#[derive(Default)]
pub(crate) struct HostTasks {
    tasks: std::sync::Mutex<HashMap<String, Arc<HostTask>>>,
}

/// A task of the host: where it is kept, and what its end needs.
struct HostTask {
    book: Arc<dyn ToolTasks>,
    /// For a handle the tool named itself (`__async`): how to adopt it, in
    /// case its finish beats the executor's adoption.
    adoption: Option<Adoption>,
    /// The book asked the work to stop: a `fail` then ends it `cancelled`.
    cancel_requested: AtomicBool,
    /// It ended through the host (kept, so a second end is `E_TASK_FINISHED`).
    ended: AtomicBool,
}

struct Adoption {
    tool: String,
    call_id: String,
    turn_id: String,
}

impl HostTask {
    /// Makes sure the book has the task of a handle the tool named itself,
    /// and that it is this call's: a script that returned another task's
    /// handle (a background command's, say) does not get to end it.
    async fn adopt(&self, handle: &str) -> Result<(), goondan_tools::ToolFailure> {
        let Some(a) = &self.adoption else { return Ok(()) };
        match self.book.list().into_iter().find(|task| task.handle == handle) {
            None => self.book.adopt(&a.tool, &a.call_id, &a.turn_id, handle).await,
            Some(task) if task.tool == a.tool && task.call_id == a.call_id && task.turn_id == a.turn_id => Ok(()),
            Some(_) => Err(not_held(handle)),
        }
    }
}

/// What a `task` frame asks.
pub(crate) struct TaskRequest {
    pub(crate) op: String,
    pub(crate) handle: Option<String>,
    pub(crate) ok: bool,
    pub(crate) output: Option<JsonValue>,
    pub(crate) error: Option<String>,
}

/// Why a task request was refused: the code travels separately so that
/// JavaScript sees it as `error.code`.
pub(crate) struct Refusal {
    pub(crate) message: String,
    pub(crate) code: Option<String>,
}

impl Refusal {
    fn new(method: &str, failure: goondan_tools::ToolFailure) -> Self {
        Self { message: crate::tool::refusal("ctx.tasks", method, failure.clone()), code: failure.code }
    }
}

impl HostTasks {
    /// Answers a `task` frame. `tool` is the context of the call that asks
    /// (`None`: no call, or it has ended); `frames` carries `taskCancel`.
    pub(crate) async fn request(
        self: &Arc<Self>,
        tool: Option<ToolContext>,
        request: TaskRequest,
        frames: mpsc::WeakUnboundedSender<Vec<u8>>,
    ) -> Result<JsonValue, Refusal> {
        match request.op.as_str() {
            "start" => self.start(tool, frames).await,
            "finish" => {
                let handle = request.handle.unwrap_or_default();
                let method = if request.ok { "complete" } else { "fail" };
                self.finish(&handle, request.ok, request.output, request.error)
                    .await
                    .map_err(|f| Refusal::new(method, f))
            }
            other => Err(Refusal { message: format!("ctx.tasks has no operation '{other}'"), code: None }),
        }
    }

    async fn start(
        self: &Arc<Self>,
        tool: Option<ToolContext>,
        frames: mpsc::WeakUnboundedSender<Vec<u8>>,
    ) -> Result<JsonValue, Refusal> {
        let Some(ctx) = tool else {
            return Err(Refusal {
                message: "ctx.tasks.start: the tool call has ended (start a task while the call runs, then return ctx.tasks.pending(task))".to_owned(),
                code: None,
            });
        };
        let Some(book) = ctx.tasks().cloned() else {
            let failure = goondan_tools::ToolFailure::with_code(
                "no agent instance keeps tasks here (a pending result needs an agent's turn: gdn run)",
                E_TASK_UNAVAILABLE,
            );
            return Err(Refusal::new("start", failure));
        };
        let ticket = book.open(&ctx).await.map_err(|failure| Refusal::new("start", failure))?;
        let task = Arc::new(HostTask {
            book,
            adoption: None,
            cancel_requested: AtomicBool::new(false),
            ended: AtomicBool::new(false),
        });
        self.tasks.lock_unpoisoned().insert(ticket.handle.clone(), Arc::clone(&task));
        // The book's cancel reaches the JavaScript AbortSignal. The watcher
        // ends when the book drops the flag's sender (the task ended).
        let mut cancelled = ticket.cancelled;
        let handle = ticket.handle.clone();
        tokio::spawn(async move {
            if cancelled.wait_for(|c| *c).await.is_err() {
                return;
            }
            task.cancel_requested.store(true, Ordering::SeqCst);
            crate::host::send_frame(&frames, &ToHost::TaskCancel { handle: &handle });
        });
        Ok(json!({"handle": ticket.handle}))
    }

    async fn finish(
        &self,
        handle: &str,
        ok: bool,
        output: Option<JsonValue>,
        error: Option<String>,
    ) -> Result<JsonValue, goondan_tools::ToolFailure> {
        let Some(task) = self.tasks.lock_unpoisoned().get(handle).cloned() else { return Err(not_held(handle)) };
        task.adopt(handle).await?;
        let end = if ok {
            TaskEnd::Completed(ToolResult::ok(output.unwrap_or(JsonValue::Null)))
        } else {
            let reason = error.filter(|e| !e.is_empty()).unwrap_or_else(|| "the task failed".to_owned());
            if task.cancel_requested.load(Ordering::SeqCst) {
                TaskEnd::Cancelled(format!("cancelled: {reason}"))
            } else {
                TaskEnd::Failed(reason)
            }
        };
        let view = task.book.finish(handle, end).await?;
        task.ended.store(true, Ordering::SeqCst);
        Ok(json!({"handle": view.handle, "state": view.state.as_str()}))
    }

    /// A call of the host returned the bare `__async` object with `handle`:
    /// remember which book adopts it, so the script can finish it later.
    pub(crate) fn returned_async(&self, ctx: &ToolContext, output: &JsonValue) {
        let Some(handle) = async_handle(output) else { return };
        let Some(book) = ctx.tasks().cloned() else { return };
        let mut tasks = self.tasks.lock_unpoisoned();
        if tasks.contains_key(handle) {
            return; // Started with ctx.tasks.start(): already held.
        }
        let adoption = Adoption {
            tool: ctx.tool_name().to_owned(),
            call_id: ctx.tool_call_id().to_owned(),
            turn_id: ctx.turn_id().to_owned(),
        };
        let task = HostTask {
            book,
            adoption: Some(adoption),
            cancel_requested: AtomicBool::new(false),
            ended: AtomicBool::new(false),
        };
        tasks.insert(handle.to_owned(), Arc::new(task));
    }

    /// The host process is gone: every task it still holds ends `failed`
    /// with `message` (the ones already ended are left as they are).
    pub(crate) async fn host_gone(&self, message: &str) {
        let held: Vec<(String, Arc<HostTask>)> = self.tasks.lock_unpoisoned().drain().collect();
        let reason = format!("{E_SCRIPT_HOST_EXITED}: {message}; the task's JavaScript work was lost");
        for (handle, task) in held {
            if task.ended.load(Ordering::SeqCst) || task.adopt(&handle).await.is_err() {
                continue;
            }
            match task.book.finish(&handle, TaskEnd::Failed(reason.clone())).await {
                Ok(_) => tracing::warn!(target: "goondan::script", handle, "{reason}"),
                // Ended already (completed in time, or cancelled).
                Err(failure) => tracing::debug!(target: "goondan::script", handle, "{}", failure.message),
            }
        }
    }
}

/// The refusal for a handle that is not this host's to end.
fn not_held(handle: &str) -> goondan_tools::ToolFailure {
    goondan_tools::ToolFailure::with_code(
        format!(
            "this script host holds no task with the handle '{handle}' (only tasks its tools started, or returned as __async, can be finished here)"
        ),
        E_TASK_NOT_FOUND,
    )
}

/// The handle of the `__async` convention (spec 004 §6.3), as
/// [`goondan_tools::ToolOutput::from_json`] reads it.
fn async_handle(output: &JsonValue) -> Option<&str> {
    let map = output.as_object()?;
    if map.get("__async") != Some(&JsonValue::Bool(true)) {
        return None;
    }
    map.get("handle")?.as_str()
}
