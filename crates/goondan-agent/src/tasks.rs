//! How a task's end reaches the agent: a message in its conversation that
//! names the handle and the tool, exactly once.
//!
//! ```text
//! a task ends (TaskBook::finish_task, synced) ─► on_end: its completion message into the inbox
//!   a turn runs:  the step core takes it before the next model request (never between a
//!                 call and its result: it enters with the step's commit)
//!   idle:         the serve loop runs a turn whose input is that message (one per ended task,
//!                 in the order they ended)
//! the model read the end through tasks__status / tasks__wait first ─► on_received: the
//!   message is taken back out of the inbox (if it is still there)
//! start:          each ended, unreceived task: its message already in the conversation
//!                 (delivered before a crash) ─► marked received; else queued again
//! after each turn: the tasks whose messages are now in the conversation are marked received
//! ```
//!
//! The conversation is the truth of what was delivered: a message carries
//! the handle in its metadata (`toolTask.handle`), and a handle found there
//! is never delivered again.

use std::sync::Arc;

use goondan_core::{JsonValue, Message, MessageData, MessageSource};
use goondan_runtime::inbox::Inbox;
use goondan_runtime::tasks::{OnEnd, TaskBook, TaskHooks};
use goondan_tools::tasks::TaskView;
use serde_json::json;

/// The metadata key of a completion message.
pub const TOOL_TASK_METADATA_KEY: &str = "toolTask";

/// The completion message of an ended task: its content says what ended
/// and how (the result as the tool's result would have been), for the model.
pub fn completion_message(task: &TaskView) -> Message {
    let mut message = Message::new(MessageData::User { content: completion_text(task) }, MessageSource::User);
    message.metadata.insert(TOOL_TASK_METADATA_KEY.to_owned(), completion_metadata(task));
    message
}

/// The text of a completion message.
pub fn completion_text(task: &TaskView) -> String {
    let mut content = json!({
        "type": "tool_task_result",
        "handle": task.handle,
        "tool": task.tool,
        "toolCallId": task.call_id,
        "state": task.state,
    });
    if let Some(result) = &task.result {
        content["result"] = serde_json::to_value(result).unwrap_or(JsonValue::Null);
    }
    if let Some(reason) = &task.reason {
        content["reason"] = json!(reason);
    }
    content.to_string()
}

/// The metadata a completion message carries.
pub fn completion_metadata(task: &TaskView) -> JsonValue {
    let mut metadata = json!({
        "handle": task.handle,
        "tool": task.tool,
        "toolCallId": task.call_id,
        "state": task.state,
        "endedAt": task.updated_at,
    });
    if let Some(traceparent) = &task.traceparent {
        metadata["traceparent"] = json!(traceparent);
    }
    metadata
}

/// The handle a message delivers, if it is a completion message (queued
/// as it is, or as the input of a completion turn).
pub fn handle_of(message: &Message) -> Option<&str> {
    let direct = message.metadata.get(TOOL_TASK_METADATA_KEY);
    let inbound = message
        .metadata
        .get(crate::swarm::INBOUND_METADATA_KEY)
        .and_then(|inbound| inbound.get("eventMetadata"))
        .and_then(|event| event.get(TOOL_TASK_METADATA_KEY));
    direct.or(inbound)?.get("handle")?.as_str()
}

/// The hooks that connect a book to `inbox` (given to
/// [`TaskBook::with_hooks`]): each end queues its completion message, each
/// end the model read otherwise takes it back out.
pub fn hooks(inbox: &Arc<Inbox>) -> TaskHooks {
    let queue = Arc::clone(inbox);
    let on_end: OnEnd = Box::new(move |task| {
        if !task.received {
            queue.push(completion_message(task));
        }
    });
    let queue = Arc::clone(inbox);
    let on_received: OnEnd = Box::new(move |task| {
        queue.retain(|message| handle_of(message) != Some(task.handle.as_str()));
    });
    TaskHooks { on_end: Some(on_end), on_received: Some(on_received) }
}

/// Marks received the ended tasks whose completion messages are in
/// `messages`; with `queue_rest`, queues the messages of the others.
pub async fn reconcile(book: &TaskBook, inbox: &Inbox, messages: &[Message], queue_rest: bool) {
    let undelivered = book.undelivered();
    if undelivered.is_empty() {
        return;
    }
    let delivered: std::collections::HashSet<&str> = messages.iter().filter_map(handle_of).collect();
    for task in undelivered {
        if delivered.contains(task.handle.as_str()) {
            if let Err(error) = book.mark_received(&task.handle).await {
                tracing::warn!("task {}: its delivery could not be recorded: {}", task.handle, error.message);
            }
        } else if queue_rest {
            inbox.push(completion_message(&task));
        }
    }
}

#[cfg(test)]
mod tests {
    use goondan_core::ToolResult;
    use goondan_tools::tasks::TaskState;

    use super::*;

    fn view(handle: &str) -> TaskView {
        TaskView {
            handle: handle.into(),
            tool: "bash__exec".into(),
            call_id: "call-1".into(),
            turn_id: "turn-1".into(),
            state: TaskState::Completed,
            result: Some(ToolResult::ok(json!({"exitCode": 0}))),
            reason: None,
            created_at: 1,
            updated_at: 2,
            expires_at: None,
            received: false,
            remote: false,
            resume: None,
            traceparent: Some("00-0123456789abcdef0123456789abcdef-00f067aa0ba902b7-01".into()),
        }
    }

    #[test]
    fn a_completion_message_names_the_handle_and_the_tool_and_is_found_again() -> Result<(), serde_json::Error> {
        let message = completion_message(&view("task-1"));
        assert_eq!(handle_of(&message), Some("task-1"));
        let MessageData::User { content } = &message.data else { panic!("not a user message") };
        let content: JsonValue = serde_json::from_str(content)?;
        assert_eq!(content["type"], "tool_task_result");
        assert_eq!((content["handle"].as_str(), content["tool"].as_str()), (Some("task-1"), Some("bash__exec")));
        assert_eq!(content["result"]["output"]["exitCode"], 0);
        // As the input of a completion turn: under the inbound metadata.
        let mut turn_input = Message::new(MessageData::User { content: "x".into() }, MessageSource::User);
        turn_input.metadata.insert(
            crate::swarm::INBOUND_METADATA_KEY.to_owned(),
            json!({"eventMetadata": {TOOL_TASK_METADATA_KEY: completion_metadata(&view("task-2"))}}),
        );
        assert_eq!(handle_of(&turn_input), Some("task-2"));
        // The call's trace context goes with it, for the turn's link.
        assert_eq!(
            completion_metadata(&view("task-3"))["traceparent"],
            "00-0123456789abcdef0123456789abcdef-00f067aa0ba902b7-01"
        );
        Ok(())
    }
}
