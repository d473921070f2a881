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

/// Token counts of one call, the same kinds for every provider.
///
/// `input_tokens` is the whole prompt, cached parts included;
/// `cache_read_tokens` and `cache_write_tokens` are the parts of it read
/// from and written to the provider's prompt cache (Anthropic counts them
/// apart from its `input_tokens`: they are added back). `output_tokens` is
/// everything generated, reasoning included; `reasoning_tokens` is the part
/// of it the model spent thinking (OpenAI's `reasoning_tokens`, Gemini's
/// `thoughtsTokenCount`). So the kinds overlap: a price is charged on
/// `input - cache read - cache write` at the input rate, on each cache part at
/// its own rate, and on the output (reasoning included) at the output rate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenUsage {
    /// Prompt tokens, cached ones included.
    pub input_tokens: u64,
    /// Generated tokens, reasoning included.
    pub output_tokens: u64,
    /// Prompt tokens read from the prompt cache (part of `input_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the prompt cache (part of `input_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
    /// Generated tokens spent reasoning (part of `output_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reasoning_tokens: u64,
}

fn is_zero(count: &u64) -> bool {
    *count == 0
}

impl TokenUsage {
    /// Input and output added (the kinds within them are not counted again).
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// Adds another call's counts.
    pub fn add(&mut self, other: TokenUsage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_read_tokens = self.cache_read_tokens.saturating_add(other.cache_read_tokens);
        self.cache_write_tokens = self.cache_write_tokens.saturating_add(other.cache_write_tokens);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(other.reasoning_tokens);
    }

    /// The counts under the original's names (`promptTokens`,
    /// `completionTokens`, `totalTokens`) and ours for the kinds it has no
    /// name for (`cacheReadTokens`, `cacheWriteTokens`, `reasoningTokens`,
    /// written only when not 0: each key costs a hashed insert on every
    /// step): the durable record of a step's usage.
    pub fn to_record(&self) -> goondan_core::JsonValue {
        let mut record = serde_json::json!({
            "promptTokens": self.input_tokens,
            "completionTokens": self.output_tokens,
            "totalTokens": self.total(),
        });
        self.add_kinds_to(&mut record);
        record
    }

    /// Adds the kinds that are not 0 beyond input and output to `record`
    /// (a JSON object).
    pub fn add_kinds_to(&self, record: &mut goondan_core::JsonValue) {
        let Some(map) = record.as_object_mut() else { return };
        for (name, count) in [
            ("cacheReadTokens", self.cache_read_tokens),
            ("cacheWriteTokens", self.cache_write_tokens),
            ("reasoningTokens", self.reasoning_tokens),
        ] {
            if count != 0 {
                map.insert(name.to_owned(), count.into());
            }
        }
    }

    /// Reads a record written by [`TokenUsage::to_record`] (missing counts
    /// are 0; `inputTokens`/`outputTokens` are read too).
    pub fn from_record(record: &goondan_core::JsonValue) -> Self {
        let count = |names: &[&str]| {
            names.iter().find_map(|name| record.get(*name).and_then(goondan_core::JsonValue::as_u64)).unwrap_or(0)
        };
        Self {
            input_tokens: count(&["promptTokens", "inputTokens"]),
            output_tokens: count(&["completionTokens", "outputTokens"]),
            cache_read_tokens: count(&["cacheReadTokens"]),
            cache_write_tokens: count(&["cacheWriteTokens"]),
            reasoning_tokens: count(&["reasoningTokens"]),
        }
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
