//! Conversation messages (spec 002 appendix A).
//!
//! A [`Message`] wraps one provider-neutral message (`data`) with an id,
//! metadata, a creation time and where it came from. Tool handlers receive the
//! assistant message that holds their call as `ToolContext.message`.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::{JsonObject, ToolCall, ToolResult, ids};

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    /// A unique id.
    pub id: String,
    /// The message itself.
    pub data: MessageData,
    /// Free-form metadata that middleware may attach.
    #[serde(default)]
    pub metadata: JsonObject,
    /// Creation time in milliseconds since the Unix epoch.
    pub created_at: u64,
    /// Who produced the message.
    pub source: MessageSource,
}

/// The provider-neutral content of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum MessageData {
    /// Instructions for the model.
    System {
        /// The text.
        content: String,
    },
    /// Input from a user or another agent.
    User {
        /// The text.
        content: String,
    },
    /// A model reply: text, tool calls, or both.
    Assistant {
        /// Reply text, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        /// The tool calls the model asked for.
        #[serde(default, rename = "toolCalls", skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// The result of one tool call.
    Tool {
        /// The id of the call this answers.
        #[serde(rename = "toolCallId")]
        tool_call_id: String,
        /// The called tool's full name.
        #[serde(rename = "toolName")]
        tool_name: String,
        /// The structured result (boxed: it is the largest variant).
        result: Box<ToolResult>,
    },
}

/// Where a message came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum MessageSource {
    /// A user (or a connector speaking for one).
    User,
    /// The model, during a step.
    Assistant {
        /// The step that produced it.
        #[serde(rename = "stepId")]
        step_id: String,
    },
    /// A tool call's result.
    Tool {
        /// The call it answers.
        #[serde(rename = "toolCallId")]
        tool_call_id: String,
        /// The tool's full name.
        #[serde(rename = "toolName")]
        tool_name: String,
    },
    /// The runtime itself.
    System,
    /// An extension.
    Extension {
        /// The extension's name.
        #[serde(rename = "extensionName")]
        extension_name: String,
    },
}

impl Message {
    /// A new message with a fresh id and the current time.
    pub fn new(data: MessageData, source: MessageSource) -> Self {
        Self { id: ids::new_ordered_id(), data, metadata: JsonObject::new(), created_at: now_millis(), source }
    }

    /// An assistant message holding `tool_calls`, produced by `step_id`.
    pub fn assistant_tool_calls(step_id: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        Self::new(
            MessageData::Assistant { content: None, tool_calls },
            MessageSource::Assistant { step_id: step_id.into() },
        )
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_millis() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn assistant_message_serializes_with_role_and_tool_calls() {
        let call = ToolCall {
            id: "call-1".into(),
            name: "bash__exec".into(),
            args: json!({"command": "ls"}).as_object().cloned().unwrap_or_default(),
        };
        let message = Message::assistant_tool_calls("step-1", vec![call]);
        let value = serde_json::to_value(&message).unwrap_or_default();
        assert_eq!(value["data"]["role"], "assistant");
        assert_eq!(value["data"]["toolCalls"][0]["name"], "bash__exec");
        assert_eq!(value["source"], json!({"type": "assistant", "stepId": "step-1"}));
        let back: Message = serde_json::from_value(value)
            .unwrap_or_else(|_| Message::new(MessageData::User { content: String::new() }, MessageSource::User));
        assert_eq!(back, message);
    }
}
