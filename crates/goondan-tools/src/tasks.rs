//! Tasks: a tool call answered `pending` with a `handle` (spec 002 §8.2,
//! 004 §6.3) is work that goes on after the call and completes later.
//!
//! This module is the contract: the states of a task, what is known of one
//! ([`TaskView`]), how it ends ([`TaskEnd`]), and [`ToolTasks`], what a
//! handler (a background command) and the `tasks` tool reach through their
//! [`ToolContext`]. The runtime implements it durably, per agent instance,
//! beside the conversation (`goondan_runtime::tasks`).

use std::fmt;
use std::time::Duration;

use goondan_core::ToolResult;
use goondan_core::codes::{E_TASK_FINISHED, E_TASK_NOT_FOUND};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::context::ToolContext;
use crate::handler::ToolFailure;
use crate::pipeline::BoxFuture;

/// Where a task stands (the MCP tasks extension's states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Running.
    Working,
    /// Waiting for an answer it asked for.
    InputRequired,
    /// Ended with a result.
    Completed,
    /// Ended without one; the reason says why.
    Failed,
    /// Ended because it was cancelled.
    Cancelled,
}

impl TaskState {
    /// Whether the task has ended.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// The wire name (`working`, `input_required`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Working => "working",
            Self::InputRequired => "input_required",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What is known of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskView {
    /// Its handle (the `pending` result's).
    pub handle: String,
    /// The tool whose call it is (`bash__exec`).
    pub tool: String,
    /// The tool call's id.
    pub call_id: String,
    /// The turn that made the call.
    pub turn_id: String,
    /// Where it stands.
    pub state: TaskState,
    /// Its result, once it completed (a tool's result: ok or error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<ToolResult>,
    /// Why it failed or was cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When it was created (ms since the epoch).
    pub created_at: u64,
    /// When it last changed.
    pub updated_at: u64,
    /// After this it may be forgotten (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// The model has its end: through the conversation, or `tasks__wait`
    /// / `tasks__status` (then no completion message follows).
    #[serde(default)]
    pub received: bool,
    /// Its work runs outside the agent's process (another agent answering
    /// an asynchronous request): a restart of the process does not end it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub remote: bool,
    /// What the producer needs to follow the work again after a restart of
    /// the process (an MCP server's task id); with it the task is remote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<serde_json::Value>,
    /// The W3C `traceparent` of the call that started it: the turn that
    /// delivers its end links back to that span.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// How a task ends.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskEnd {
    /// With a result (an ok or an error result of the tool).
    Completed(ToolResult),
    /// Without one.
    Failed(String),
    /// Cancelled.
    Cancelled(String),
}

impl TaskEnd {
    /// The state it leaves the task in.
    pub fn state(&self) -> TaskState {
        match self {
            Self::Completed(_) => TaskState::Completed,
            Self::Failed(_) => TaskState::Failed,
            Self::Cancelled(_) => TaskState::Cancelled,
        }
    }
}

/// A task just opened: its handle, and a flag that turns true when it is
/// cancelled (the work should then stop and end it with
/// [`TaskEnd::Cancelled`]).
#[derive(Debug, Clone)]
pub struct TaskTicket {
    /// The handle the `pending` result carries.
    pub handle: String,
    /// Turns true on a cancel.
    pub cancelled: watch::Receiver<bool>,
}

/// The tasks of one agent instance.
pub trait ToolTasks: Send + Sync + fmt::Debug {
    /// Opens a working task for the call of `ctx`; returns once it is
    /// recorded durably.
    fn open<'a>(&'a self, ctx: &'a ToolContext) -> BoxFuture<'a, Result<TaskTicket, ToolFailure>>;
    /// Ends a working task ([`E_TASK_FINISHED`] if it has ended).
    fn finish<'a>(&'a self, handle: &'a str, end: TaskEnd) -> BoxFuture<'a, Result<TaskView, ToolFailure>>;
    /// The task; a final one counts as received by the model.
    fn status<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<TaskView, ToolFailure>>;
    /// Waits up to `timeout` for the task to end; as `status` then.
    fn wait<'a>(&'a self, handle: &'a str, timeout: Duration) -> BoxFuture<'a, Result<TaskView, ToolFailure>>;
    /// Asks the task's work to stop; it ends `cancelled` (at once if its
    /// work does not answer).
    fn cancel<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<TaskView, ToolFailure>>;
    /// Every task, oldest first.
    fn list(&self) -> Vec<TaskView>;
    /// As [`open`](Self::open), for work that goes on outside this process
    /// (a task of an MCP server reached over HTTP): a restart of the process
    /// leaves the task working, and `resume` is what its producer needs to
    /// follow it again ([`reattach`](Self::reattach)).
    fn open_resumable<'a>(
        &'a self,
        ctx: &'a ToolContext,
        _resume: serde_json::Value,
    ) -> BoxFuture<'a, Result<TaskTicket, ToolFailure>> {
        self.open(ctx)
    }
    /// A working task's ticket again, for its producer following its work
    /// after a restart of the process; `None` if it is not working.
    fn reattach(&self, _handle: &str) -> Option<TaskTicket> {
        None
    }
    /// Records a working task for a pending result whose handler named
    /// its own `handle` (a script's `__async`, an asynchronous agent
    /// request) without opening one; nothing for a handle already known.
    fn adopt<'a>(
        &'a self,
        _tool: &'a str,
        _call_id: &'a str,
        _turn_id: &'a str,
        _handle: &'a str,
    ) -> BoxFuture<'a, Result<(), ToolFailure>> {
        Box::pin(async { Ok(()) })
    }
    /// Where a task's work may keep a file of its own (a background
    /// command's whole output), beside the instance's state; `None` if
    /// this keeper has no such place.
    fn output_path(&self, _handle: &str) -> Option<std::path::PathBuf> {
        None
    }
}

/// The error for a handle nobody knows.
pub fn unknown_handle(handle: &str) -> ToolFailure {
    ToolFailure::with_code(format!("no task has the handle '{handle}'"), E_TASK_NOT_FOUND)
        .suggest("Call tasks__list for the handles this agent knows.")
}

/// The error for a task that has ended.
pub fn already_finished(view: &TaskView) -> ToolFailure {
    ToolFailure::with_code(format!("task '{}' has already ended ({})", view.handle, view.state), E_TASK_FINISHED)
        .suggest("Read its result with tasks__status; nothing was changed.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_have_the_wire_names_and_know_when_they_are_final() -> Result<(), serde_json::Error> {
        for (state, name, last) in [
            (TaskState::Working, "working", false),
            (TaskState::InputRequired, "input_required", false),
            (TaskState::Completed, "completed", true),
            (TaskState::Failed, "failed", true),
            (TaskState::Cancelled, "cancelled", true),
        ] {
            assert_eq!(serde_json::to_value(state)?, serde_json::json!(name));
            assert_eq!((state.as_str(), state.is_final()), (name, last));
        }
        Ok(())
    }
}
