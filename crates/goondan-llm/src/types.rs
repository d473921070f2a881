//! Provider-neutral requests and replies.

use goondan_core::{JsonObject, JsonValue, MessageData};
use serde::{Deserialize, Serialize};

/// A tool the model may call: the catalog item as a function definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// The full tool name (`resource__export`).
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema of its arguments (`{"type": "object"}` when the tool has none).
    pub parameters: JsonValue,
}

/// Sampling parameters (`Agent.spec.modelConfig.params`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelParams {
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// The most tokens to generate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Anything else, passed through to providers that know it.
    #[serde(flatten)]
    pub extra: JsonObject,
}

/// One model call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelRequest {
    /// The system prompt (sent the way each API takes it).
    pub system: Option<String>,
    /// The conversation so far, oldest first. `System` entries, if any, are
    /// sent as system instructions after `system`.
    pub messages: Vec<MessageData>,
    /// The tools of this step's catalog.
    pub tools: Vec<ToolDefinition>,
    /// Sampling parameters.
    pub params: ModelParams,
}

/// A tool call as the model produced it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawToolCall {
    /// The call id (generated when the API gives none).
    pub id: String,
    /// The tool name.
    pub name: String,
    /// The arguments as the JSON text the model produced, possibly invalid.
    pub arguments: String,
}

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// It finished its answer.
    EndTurn,
    /// It asked for tool calls.
    ToolUse,
    /// It hit the token limit.
    MaxTokens,
    /// Something else (a content filter, an unknown reason).
    Other,
}

/// Token counts of one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenUsage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
}

impl TokenUsage {
    /// Both counts added.
    pub fn total(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }

    /// Adds another call's counts.
    pub fn add(&mut self, other: TokenUsage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
    }
}

/// A model's reply.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelResponse {
    /// The reply text, if any.
    pub text: Option<String>,
    /// The tool calls, in the order the model gave them.
    pub tool_calls: Vec<RawToolCall>,
    /// Why it stopped.
    pub stop_reason: Option<StopReason>,
    /// Token counts.
    pub usage: TokenUsage,
}

/// What a streaming provider reports while the reply arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// More reply text.
    TextDelta(String),
    /// The model began a tool call.
    ToolCallStarted {
        /// The call id.
        id: String,
        /// The tool name.
        name: String,
    },
}
