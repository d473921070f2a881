//! The `tasks` tool: `status{handle}`, `wait{handle, timeoutMs}`,
//! `cancel{handle}`, `list{}` — the model's way to follow a pending
//! result (its `handle`). The agent instance keeps the tasks
//! (`goondan_tools::tasks::ToolTasks`, reached through the call's
//! context); where none does (`gdn tool call`), each export says so.

use std::sync::Arc;
use std::time::Duration;

use goondan_core::codes::{E_TASK_UNAVAILABLE, E_TOOL_INVALID_ARGS};
use goondan_core::{JsonObject, JsonValue};
use goondan_tools::tasks::{TaskView, ToolTasks};
use goondan_tools::{BoxFuture, HandlerResult, ToolContext, ToolFailure, ToolHandler};
use serde_json::json;

/// `wait`'s default, in milliseconds.
pub const DEFAULT_WAIT_MS: u64 = 30_000;
/// `wait`'s longest, in milliseconds.
pub const MAX_WAIT_MS: u64 = 600_000;

/// The handler of `export`, or `None` if the tool has no such export.
pub fn handler(export: &str) -> Option<Arc<dyn ToolHandler>> {
    let export = match export {
        "status" => Export::Status,
        "wait" => Export::Wait,
        "cancel" => Export::Cancel,
        "list" => Export::List,
        _ => return None,
    };
    Some(Arc::new(Tasks(export)))
}

#[derive(Debug, Clone, Copy)]
enum Export {
    Status,
    Wait,
    Cancel,
    List,
}

struct Tasks(Export);

fn tasks_of(ctx: &ToolContext) -> Result<&Arc<dyn ToolTasks>, ToolFailure> {
    ctx.tasks().ok_or_else(|| {
        ToolFailure::with_code(
            "this call has no agent instance that keeps tasks (tasks live beside an instance's conversation)",
            E_TASK_UNAVAILABLE,
        )
        .suggest("Use the tasks tool in an agent's turn (gdn run).")
    })
}

fn handle_of(input: &JsonObject) -> Result<&str, ToolFailure> {
    input.get("handle").and_then(JsonValue::as_str).filter(|h| !h.is_empty()).ok_or_else(|| {
        ToolFailure::with_code("'handle' must be a non-empty string", E_TOOL_INVALID_ARGS)
            .suggest("Pass the handle of the pending result.")
    })
}

fn timeout_of(input: &JsonObject) -> Result<Duration, ToolFailure> {
    let Some(value) = input.get("timeoutMs") else { return Ok(Duration::from_millis(DEFAULT_WAIT_MS)) };
    let ms = value.as_f64().filter(|ms| ms.is_finite() && *ms >= 0.0).ok_or_else(|| {
        ToolFailure::with_code("'timeoutMs' must be a number of milliseconds, 0 or more", E_TOOL_INVALID_ARGS)
    })?;
    if ms > MAX_WAIT_MS as f64 {
        return Err(ToolFailure::with_code(
            format!("'timeoutMs' must be less than or equal to {MAX_WAIT_MS}"),
            E_TOOL_INVALID_ARGS,
        )
        .suggest("Wait at most ten minutes per call; call again to wait longer."));
    }
    // In 0..=600_000: exact.
    Ok(Duration::from_millis(ms.round() as u64))
}

/// What the model gets of a task.
fn shown(task: &TaskView) -> JsonValue {
    let mut shown = json!({
        "handle": task.handle,
        "tool": task.tool,
        "state": task.state,
        "createdAt": goondan_core::js_message::format_rfc3339_millis(task.created_at),
        "updatedAt": goondan_core::js_message::format_rfc3339_millis(task.updated_at),
    });
    if let Some(result) = &task.result {
        shown["result"] = serde_json::to_value(result).unwrap_or(JsonValue::Null);
    }
    if let Some(reason) = &task.reason {
        shown["reason"] = json!(reason);
    }
    shown
}

impl ToolHandler for Tasks {
    fn call<'a>(&'a self, ctx: &'a ToolContext, input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            let tasks = tasks_of(ctx)?;
            let task = match self.0 {
                Export::Status => tasks.status(handle_of(input)?).await?,
                Export::Wait => {
                    let handle = handle_of(input)?;
                    let timeout = timeout_of(input)?;
                    tasks.wait(handle, timeout).await?
                }
                Export::Cancel => tasks.cancel(handle_of(input)?).await?,
                Export::List => {
                    let listed: Vec<JsonValue> = tasks.list().iter().map(shown).collect();
                    return Ok(json!({"tasks": listed}).into());
                }
            };
            Ok(shown(&task).into())
        })
    }
}
