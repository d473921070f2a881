//! Messages for the unit tests, with readable ids.

use goondan_core::{JsonObject, Message, MessageData, MessageEvent, MessageSource, ToolCall, ToolResult};

pub(crate) fn user(id: &str) -> Message {
    let mut message = Message::new(MessageData::User { content: id.to_owned() }, MessageSource::User);
    message.id = id.to_owned();
    message
}

pub(crate) fn assistant(id: &str, calls: &[&str]) -> Message {
    let calls = calls.iter().map(|call| ToolCall::new(*call, "echo__say", JsonObject::new())).collect();
    let mut message = Message::assistant_tool_calls("s", calls);
    message.id = id.to_owned();
    message
}

pub(crate) fn result(id: &str, call: &str) -> Message {
    let mut message = Message::new(
        MessageData::Tool {
            tool_call_id: call.to_owned(),
            tool_name: "echo__say".into(),
            result: Box::new(ToolResult::ok(serde_json::json!("ok"))),
        },
        MessageSource::Tool { tool_call_id: call.to_owned(), tool_name: "echo__say".into() },
    );
    message.id = id.to_owned();
    message
}

/// A user message, an assistant message with two calls and their results,
/// then a user message and a reply without calls.
pub(crate) fn calls_then_reply() -> Vec<Message> {
    vec![
        user("u1"),
        assistant("a1", &["c1", "c2"]),
        result("r1", "c1"),
        result("r2", "c2"),
        user("u2"),
        assistant("a2", &[]),
    ]
}

/// The ids left after applying `events` to `messages`.
pub(crate) fn ids_after(messages: &[Message], events: &[MessageEvent]) -> Vec<String> {
    let mut state = goondan_core::ConversationState::new(messages.to_vec());
    for event in events {
        if let Err(error) = state.emit(event.clone()) {
            panic!("{error}");
        }
    }
    state.messages().iter().map(|message| message.id.clone()).collect()
}
