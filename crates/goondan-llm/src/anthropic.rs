//! Anthropic's Messages API: `POST {endpoint}/v1/messages`, or
//! `{endpoint}/messages` when the endpoint already ends in `/v1` (the form
//! the original's SDK takes, `https://api.anthropic.com/v1`, in
//! `spec.endpoint` or `ANTHROPIC_BASE_URL`)
//! (<https://docs.anthropic.com/en/api/messages>), always streamed as
//! Server-Sent Events (<https://docs.anthropic.com/en/docs/build-with-claude/streaming>),
//! with tool use (<https://docs.anthropic.com/en/docs/agents-and-tools/tool-use/overview>).
//!
//! The request:
//!
//! - headers `x-api-key` (marked sensitive, so it never shows in a `Debug`
//!   output), `anthropic-version: 2023-06-01`, `content-type: application/json`;
//! - `system`: the agent's system prompt, then the text of every
//!   `MessageData::System` entry, joined by blank lines (the API takes system
//!   instructions only as this top-level field);
//! - `messages`: alternating `user` / `assistant` messages of content blocks.
//!   An assistant message is its text block and one `tool_use` block per call
//!   (`input` is the call's argument object); tool results go back in a
//!   `user` message as `tool_result` blocks whose `content` is the
//!   [`goondan_core::ToolResult`] JSON itself (status, output, error code,
//!   suggestion, help URL), with `is_error` for `status: "error"`. Messages of
//!   the same role in a row are merged into one, because the API requires the
//!   roles to alternate, and within a user message the `tool_result` blocks
//!   come first, because the API requires that too;
//! - `tools`: `{name, description, input_schema}` (`{"type": "object"}` for a
//!   tool without a schema);
//! - `max_tokens` (required by the API: 4096 unless the params set it),
//!   `temperature`, `top_p`, `stream: true`;
//! - from `params.extra`, only the keys with a matching Messages API field:
//!   `topK`/`top_k`, `stopSequences`/`stop_sequences`,
//!   `toolChoice`/`tool_choice`, `metadata`, `serviceTier`/`service_tier`.
//!   Others are ignored (logged at debug level). `thinking` is deliberately
//!   not passed: with it on, the API requires the thinking blocks to be sent
//!   back with tool results, and a conversation here has nowhere to keep them.
//!
//! The stream: `message_start` (input token counts), `content_block_start`
//! (a text block, or a `tool_use` block whose id and name are reported as
//! [`StreamEvent::ToolCallStarted`]), `content_block_delta` (`text_delta`
//! reported as [`StreamEvent::TextDelta`]; `input_json_delta` fragments
//! concatenated into the call's raw argument text, `{}` when there are none),
//! `content_block_stop`, `message_delta` (stop reason and the cumulative
//! output token count), `message_stop`, `ping`, and `error` (an
//! [`ModelError::Api`] with the API's message and the status the API sends
//! with its error type, e.g. 529 for `overloaded_error`; see
//! [`crate::http`]). Unknown events and block
//! types (thinking, server tools) are skipped, as the API's versioning policy
//! asks of clients. A stream that ends before `message_stop` is an error, so
//! a reply cut off by the network is never taken for a whole one.
//!
//! Options (`spec.options` of the Model): `idleTimeoutSeconds`, the longest
//! wait for the response headers and then between two chunks of the stream
//! (default 120; see [`crate::config`]). The key is scrubbed from every
//! error ([`ModelError::redact`]).

use std::borrow::Cow;

use goondan_core::{JsonObject, JsonValue, MessageData};
use reqwest::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};

use crate::config::ModelSettings;
use crate::error::ModelError;
use crate::http::{self, RetryPolicy, SseEvent, Transport};
use crate::provider::{Completion, ModelProvider, StreamSink};
use crate::types::{ModelRequest, ModelResponse, RawToolCall, StopReason, StreamEvent, TokenUsage};
use crate::wire;

const PROVIDER: &str = "anthropic";
/// The API version this client speaks (the only stable one).
const API_VERSION: &str = "2023-06-01";
/// `max_tokens` is required by the API; this is the default when the params have none.
const DEFAULT_MAX_TOKENS: u64 = 4096;

/// The Messages API fields `params.extra` may set (camelCase keys accepted).
const EXTRA_FIELDS: &[&str] = &["top_k", "stop_sequences", "tool_choice", "metadata", "service_tier"];

/// A model behind Anthropic's Messages API.
///
/// `Debug` is safe to print: the key is a sensitive header value, which
/// prints as `Sensitive`.
#[derive(Debug)]
pub struct AnthropicProvider {
    /// The key and version headers, the idle timeout and the retries.
    http: Transport,
    /// `{endpoint}/v1/messages` (or `{endpoint}/messages` for an endpoint in `/v1`).
    url: String,
    model: String,
}

impl AnthropicProvider {
    /// A provider for `settings`: fails without a key, or with an invalid
    /// `idleTimeoutSeconds` option.
    pub fn new(settings: &ModelSettings) -> Result<Self, ModelError> {
        let mut http = Transport::new(settings, HeaderName::from_static("x-api-key"), "")?;
        http.insert_header(HeaderName::from_static("anthropic-version"), HeaderValue::from_static(API_VERSION));
        let path = if http.url("").trim_end_matches('/').ends_with("/v1") { "messages" } else { "v1/messages" };
        Ok(Self { url: http.url(path), http, model: settings.model.clone() })
    }

    /// Replaces the retry policy (the default: 4 attempts from 0.5 s backoff).
    #[must_use]
    pub fn with_retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.http.retry = policy;
        self
    }

    /// The request body for `request`.
    fn body<'a>(&'a self, request: &'a ModelRequest) -> WireRequest<'a> {
        let (system, messages) = wire_messages(request);
        let params = &request.params;
        let extra = wire::allowed_extras(PROVIDER, &params.extra, EXTRA_FIELDS, &[])
            .into_iter()
            .map(|(field, value)| (field.to_owned(), value.clone()))
            .collect();
        WireRequest {
            model: &self.model,
            max_tokens: params.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
            system,
            messages,
            tools: request
                .tools
                .iter()
                .map(|tool| WireTool {
                    name: &tool.name,
                    description: tool.description.as_deref(),
                    input_schema: wire::tool_parameters(tool),
                })
                .collect(),
            temperature: params.temperature,
            top_p: params.top_p,
            stream: true,
            extra,
        }
    }

    async fn call(&self, request: &ModelRequest, on_event: StreamSink<'_>) -> Result<ModelResponse, ModelError> {
        // Only the request up to the headers is retried: once the reply
        // streams, its text has been reported and a retry would repeat it.
        let response = self.http.post(&self.url, &self.body(request)).await?;
        let content_type = response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        if !content_type.starts_with("text/event-stream") {
            let content_type = content_type.to_owned();
            let text = http::excerpt(&self.http.text(response).await, 300);
            return Err(protocol(format!("expected an event stream, got '{content_type}': {text}")));
        }
        let mut reply = Reply::default();
        self.http.read_sse(response, |event| reply.handle(&event, on_event)).await?;
        reply.finish()
    }
}

impl ModelProvider for AnthropicProvider {
    fn complete<'a>(&'a self, request: &'a ModelRequest, on_event: StreamSink<'a>) -> Completion<'a> {
        Box::pin(async move { self.call(request, on_event).await.map_err(|error| self.http.redact(error)) })
    }

    fn name(&self) -> &str {
        PROVIDER
    }
}

fn protocol(message: String) -> ModelError {
    ModelError::protocol(PROVIDER, message)
}

// ---- The request ----

#[derive(Debug, Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    max_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<String>,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    stream: bool,
    /// Only keys from [`EXTRA_FIELDS`], none of which is a field above.
    #[serde(flatten)]
    extra: JsonObject,
}

#[derive(Debug, Serialize)]
struct WireMessage<'a> {
    role: Role,
    content: Vec<WireBlock<'a>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Role {
    User,
    Assistant,
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock<'a> {
    Text { text: &'a str },
    ToolUse { id: &'a str, name: &'a str, input: &'a JsonObject },
    ToolResult { tool_use_id: &'a str, content: String, is_error: bool },
}

#[derive(Debug, Serialize)]
struct WireTool<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    input_schema: Cow<'a, JsonValue>,
}

/// The system text and the alternating messages of `request`.
fn wire_messages(request: &ModelRequest) -> (Option<String>, Vec<WireMessage<'_>>) {
    let system = wire::system_texts(request);
    let mut messages: Vec<(Role, Vec<WireBlock<'_>>)> = Vec::new();
    for message in &request.messages {
        let (role, blocks) = match message {
            // Sent in `system`.
            MessageData::System { .. } => continue,
            MessageData::User { content } => (Role::User, text_block(content).into_iter().collect()),
            MessageData::Assistant { content, tool_calls } => {
                let mut blocks: Vec<WireBlock<'_>> = content.as_deref().and_then(text_block).into_iter().collect();
                blocks.extend(tool_calls.iter().map(|call| WireBlock::ToolUse {
                    id: &call.id,
                    name: &call.name,
                    input: &call.args,
                }));
                (Role::Assistant, blocks)
            }
            MessageData::Tool { tool_call_id, result, .. } => {
                // ToolResult serializes plain data into a string: this cannot fail.
                let content = serde_json::to_string(&**result).unwrap_or_default();
                let block = WireBlock::ToolResult { tool_use_id: tool_call_id, content, is_error: result.is_error() };
                (Role::User, vec![block])
            }
        };
        wire::push_alternating(&mut messages, role, blocks, |block| matches!(block, WireBlock::ToolResult { .. }));
    }
    let system = if system.is_empty() { None } else { Some(system.join("\n\n")) };
    (system, messages.into_iter().map(|(role, content)| WireMessage { role, content }).collect())
}

/// A text block, or none for empty text (which the API rejects).
fn text_block(text: &str) -> Option<WireBlock<'_>> {
    (!text.is_empty()).then_some(WireBlock::Text { text })
}

// ---- The stream ----

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireEvent {
    MessageStart {
        message: WireStartMessage,
    },
    ContentBlockStart {
        index: u64,
        content_block: WireContentBlock,
    },
    ContentBlockDelta {
        index: u64,
        delta: WireDelta,
    },
    ContentBlockStop {},
    MessageDelta {
        #[serde(default)]
        delta: WireMessageDelta,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop {},
    Ping {},
    Error {
        error: JsonValue,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Deserialize)]
struct WireStartMessage {
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Debug, Default, Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireContentBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        #[serde(default)]
        id: String,
        name: String,
        #[serde(default)]
        input: Option<JsonValue>,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireDelta {
    TextDelta {
        text: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Default, Deserialize)]
struct WireMessageDelta {
    #[serde(default)]
    stop_reason: Option<String>,
}

/// The reply as it streams in.
#[derive(Debug, Default)]
struct Reply {
    text: String,
    calls: Vec<CallInProgress>,
    stop_reason: Option<StopReason>,
    input_tokens: u64,
    cache_creation_tokens: u64,
    cache_read_tokens: u64,
    output_tokens: u64,
    stopped: bool,
}

#[derive(Debug)]
struct CallInProgress {
    /// The content block index the deltas name.
    index: u64,
    id: String,
    name: String,
    /// The `input_json_delta` fragments so far.
    arguments: String,
    /// The input given at the block's start (`{}` when it streams).
    input: Option<JsonValue>,
}

impl Reply {
    fn handle(&mut self, event: &SseEvent, on_event: StreamSink<'_>) -> Result<(), ModelError> {
        if event.data.trim().is_empty() {
            return Ok(());
        }
        let name = event.event.as_deref().unwrap_or("unnamed");
        let parsed: WireEvent = serde_json::from_str(&event.data)
            .map_err(|e| protocol(format!("cannot read the '{name}' stream event: {e}")))?;
        match parsed {
            WireEvent::MessageStart { message } => self.usage(message.usage),
            WireEvent::ContentBlockStart { index, content_block } => match content_block {
                WireContentBlock::Text { text } => self.push_text(text, on_event),
                WireContentBlock::ToolUse { id, name, input } => {
                    let id = if id.is_empty() { format!("toolu_{}", self.calls.len() + 1) } else { id };
                    on_event(StreamEvent::ToolCallStarted { id: id.clone(), name: name.clone() });
                    self.calls.push(CallInProgress { index, id, name, arguments: String::new(), input });
                }
                WireContentBlock::Unknown => {}
            },
            WireEvent::ContentBlockDelta { index, delta } => match delta {
                WireDelta::TextDelta { text } => self.push_text(text, on_event),
                WireDelta::InputJsonDelta { partial_json } => {
                    let call = self.calls.iter_mut().rev().find(|call| call.index == index).ok_or_else(|| {
                        protocol(format!("tool input for content block {index}, which is not a tool call"))
                    })?;
                    call.arguments.push_str(&partial_json);
                }
                WireDelta::Unknown => {}
            },
            WireEvent::MessageDelta { delta, usage } => {
                if let Some(reason) = delta.stop_reason {
                    self.stop_reason = Some(stop_reason(&reason));
                }
                self.usage(usage);
            }
            WireEvent::MessageStop {} => self.stopped = true,
            WireEvent::Error { error } => return Err(http::stream_error(PROVIDER, &error)),
            WireEvent::ContentBlockStop {} | WireEvent::Ping {} | WireEvent::Unknown => {}
        }
        Ok(())
    }

    fn push_text(&mut self, text: String, on_event: StreamSink<'_>) {
        if !text.is_empty() {
            self.text.push_str(&text);
            on_event(StreamEvent::TextDelta(text));
        }
    }

    /// Counts are cumulative: each one given replaces the last.
    fn usage(&mut self, usage: Option<WireUsage>) {
        let Some(usage) = usage else { return };
        let fields = [
            (usage.input_tokens, &mut self.input_tokens),
            (usage.cache_creation_input_tokens, &mut self.cache_creation_tokens),
            (usage.cache_read_input_tokens, &mut self.cache_read_tokens),
            (usage.output_tokens, &mut self.output_tokens),
        ];
        for (given, count) in fields {
            if let Some(given) = given {
                *count = given;
            }
        }
    }

    fn finish(self) -> Result<ModelResponse, ModelError> {
        if !self.stopped {
            return Err(protocol("the stream ended before message_stop".to_owned()));
        }
        let tool_calls = self
            .calls
            .into_iter()
            .map(|call| {
                let arguments = if !call.arguments.trim().is_empty() {
                    call.arguments
                } else {
                    match call.input {
                        // Input given whole at the block's start, not streamed.
                        Some(JsonValue::Object(input)) if !input.is_empty() => JsonValue::Object(input).to_string(),
                        _ => "{}".to_owned(),
                    }
                };
                RawToolCall { id: call.id, name: call.name, arguments }
            })
            .collect();
        Ok(ModelResponse {
            text: (!self.text.is_empty()).then_some(self.text),
            tool_calls,
            stop_reason: self.stop_reason,
            usage: TokenUsage {
                // The API counts cached prompt tokens apart from `input_tokens`;
                // together they are the prompt.
                input_tokens: self.input_tokens + self.cache_creation_tokens + self.cache_read_tokens,
                output_tokens: self.output_tokens,
                cache_read_tokens: self.cache_read_tokens,
                cache_write_tokens: self.cache_creation_tokens,
                // Extended thinking is billed as output and not counted apart.
                reasoning_tokens: 0,
            },
        })
    }
}

fn stop_reason(reason: &str) -> StopReason {
    match reason {
        "end_turn" | "stop_sequence" => StopReason::EndTurn,
        "tool_use" => StopReason::ToolUse,
        "max_tokens" | "model_context_window_exceeded" => StopReason::MaxTokens,
        _ => StopReason::Other,
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use axum::http::Method;
    use goondan_core::{ToolCall, ToolError, ToolResult};
    use serde_json::json;

    use super::*;
    use crate::config::{DEFAULT_IDLE_TIMEOUT, IDLE_TIMEOUT_OPTION, ProviderKind, Secret};
    use crate::test_support::{Canned, MockServer, closed_url, complete, fast_retries, object};
    use crate::types::{ModelParams, ToolDefinition};

    const KEY: &str = "sk-ant-test-SECRET-0123456789";

    // The streams are files under `src/testdata/anthropic`: the bytes the
    // API sends, kept as data rather than as string literals in the code.

    /// The streaming example of Anthropic's docs (text, then a tool call whose
    /// input arrives in fragments), with a second, parallel call without
    /// arguments, as the API sends them.
    const TOOL_STREAM: &str = include_str!("testdata/anthropic/tool_stream.sse");

    /// A plain text reply, with prompt caching counts as the API reports them.
    const TEXT_STREAM: &str = include_str!("testdata/anthropic/text_stream.sse");

    /// A reply cut short by an `overloaded_error` event.
    const OVERLOADED_STREAM: &str = include_str!("testdata/anthropic/overloaded_stream.sse");

    /// An event whose JSON is cut in the middle.
    const MALFORMED_STREAM: &str = include_str!("testdata/anthropic/malformed_stream.sse");

    /// An event stream as Anthropic sends it.
    fn sse(body: &str) -> Canned {
        Canned { content_type: "text/event-stream; charset=utf-8", ..Canned::sse(body) }
    }

    /// A mock Messages API answering `replies` in order; returns its base URL.
    async fn serve(replies: Vec<Canned>) -> (String, MockServer) {
        let server = MockServer::start(replies).await;
        (server.url(""), server)
    }

    fn settings(endpoint: &str, key: Option<&str>) -> ModelSettings {
        ModelSettings {
            kind: ProviderKind::Anthropic,
            model: "claude-sonnet-4-5".into(),
            endpoint: endpoint.into(),
            api_key: key.map(Secret::new),
            options: JsonObject::new(),
            bundle_root: PathBuf::from("."),
        }
    }

    /// A provider for `endpoint` whose retries wait milliseconds, not seconds.
    fn provider(endpoint: &str) -> AnthropicProvider {
        let Ok(provider) = AnthropicProvider::new(&settings(endpoint, Some(KEY))) else { panic!("provider") };
        provider.with_retry_policy(fast_retries())
    }

    fn hello() -> ModelRequest {
        ModelRequest { messages: vec![MessageData::User { content: "Hello".into() }], ..ModelRequest::default() }
    }

    fn conversation() -> ModelRequest {
        let error = ToolError::new("E_NOT_FOUND", "NotFoundError", "no clock configured")
            .with_suggestion("configure a clock")
            .with_help_url("https://docs.goondan.ai/errors/E_NOT_FOUND");
        ModelRequest {
            system: Some("You are a weather bot.".into()),
            messages: vec![
                MessageData::System { content: "Answer in English.".into() },
                MessageData::User { content: "Weather in SF, and the time?".into() },
                MessageData::Assistant {
                    content: Some("Let me check.".into()),
                    tool_calls: vec![
                        ToolCall::new("toolu_a", "weather__get", object(json!({"location": "San Francisco, CA"}))),
                        ToolCall::new("toolu_b", "clock__now", JsonObject::new()),
                    ],
                },
                MessageData::Tool {
                    tool_call_id: "toolu_a".into(),
                    tool_name: "weather__get".into(),
                    result: Box::new(ToolResult::ok(json!({"tempF": 58}))),
                },
                MessageData::Tool {
                    tool_call_id: "toolu_b".into(),
                    tool_name: "clock__now".into(),
                    result: Box::new(ToolResult::error(error)),
                },
                MessageData::User { content: "And in Fahrenheit, please.".into() },
            ],
            tools: vec![
                ToolDefinition {
                    name: "weather__get".into(),
                    description: Some("The current weather.".into()),
                    parameters: json!({"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}),
                },
                ToolDefinition { name: "clock__now".into(), description: None, parameters: JsonValue::Null },
            ],
            params: ModelParams {
                temperature: Some(0.2),
                max_tokens: None,
                top_p: Some(0.9),
                extra: object(json!({"topK": 5, "stopSequences": ["END"], "frequencyPenalty": 1})),
            },
        }
    }

    #[tokio::test]
    async fn streams_text_and_parallel_tool_calls_and_sends_the_whole_conversation() {
        let (endpoint, server) = serve(vec![sse(TOOL_STREAM)]).await;
        let provider = provider(&endpoint);
        let (result, events) = complete(&provider, &conversation()).await;
        let response = result.unwrap_or_else(|e| panic!("{e}"));

        assert_eq!(response.text.as_deref(), Some("Okay, let's check the weather for San Francisco, CA:"));
        assert_eq!(
            response.tool_calls,
            [
                RawToolCall {
                    id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
                    name: "weather__get".into(),
                    arguments: r#"{"location": "San Francisco, CA", "unit": "fahrenheit"}"#.into(),
                },
                RawToolCall {
                    id: "toolu_01Lp8Gh3RuZDYNy2bQxmN5sV".into(),
                    name: "clock__now".into(),
                    arguments: "{}".into()
                },
            ]
        );
        assert_eq!(response.stop_reason, Some(StopReason::ToolUse));
        assert_eq!(response.usage, TokenUsage { input_tokens: 472, output_tokens: 89, ..TokenUsage::default() });
        assert_eq!(
            events,
            [
                StreamEvent::TextDelta("Okay".into()),
                StreamEvent::TextDelta(", let's check the weather".into()),
                StreamEvent::TextDelta(" for San Francisco, CA:".into()),
                StreamEvent::ToolCallStarted {
                    id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
                    name: "weather__get".into()
                },
                StreamEvent::ToolCallStarted { id: "toolu_01Lp8Gh3RuZDYNy2bQxmN5sV".into(), name: "clock__now".into() },
            ]
        );

        let seen = server.requests();
        let [request] = seen.as_slice() else { panic!("expected one request, got {}", seen.len()) };
        assert_eq!(request.method, Method::POST);
        assert_eq!(request.path(), "/v1/messages");
        assert_eq!(request.header("x-api-key"), KEY);
        assert_eq!(request.header("anthropic-version"), "2023-06-01");
        assert_eq!(request.header("content-type"), "application/json");
        assert!(request.headers.get("authorization").is_none());

        let body = request.json();
        let ok_result = r#"{"status":"ok","output":{"tempF":58}}"#;
        let error_result = r#"{"status":"error","error":{"message":"no clock configured","name":"NotFoundError","code":"E_NOT_FOUND","suggestion":"configure a clock","helpUrl":"https://docs.goondan.ai/errors/E_NOT_FOUND"}}"#;
        assert_eq!(
            body,
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": 4096,
                "system": "You are a weather bot.\n\nAnswer in English.",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "Weather in SF, and the time?"}]},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Let me check."},
                        {"type": "tool_use", "id": "toolu_a", "name": "weather__get", "input": {"location": "San Francisco, CA"}},
                        {"type": "tool_use", "id": "toolu_b", "name": "clock__now", "input": {}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_a", "content": ok_result, "is_error": false},
                        {"type": "tool_result", "tool_use_id": "toolu_b", "content": error_result, "is_error": true},
                        {"type": "text", "text": "And in Fahrenheit, please."},
                    ]},
                ],
                "tools": [
                    {"name": "weather__get", "description": "The current weather.",
                     "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}},
                    {"name": "clock__now", "input_schema": {"type": "object"}},
                ],
                "temperature": 0.2,
                "top_p": 0.9,
                "stream": true,
                "top_k": 5,
                "stop_sequences": ["END"],
            })
        );
    }

    #[tokio::test]
    async fn merges_same_role_messages_and_reads_a_text_reply() {
        let (endpoint, server) = serve(vec![sse(TEXT_STREAM)]).await;
        let provider = provider(&endpoint);
        let request = ModelRequest {
            messages: vec![
                MessageData::User { content: "one".into() },
                MessageData::User { content: String::new() },
                MessageData::User { content: "two".into() },
                MessageData::Assistant { content: Some("three".into()), tool_calls: Vec::new() },
                MessageData::Assistant { content: None, tool_calls: Vec::new() },
                MessageData::Assistant {
                    content: Some("four".into()),
                    tool_calls: vec![ToolCall::new("toolu_x", "clock__now", JsonObject::new())],
                },
                // Input that arrived while the call ran: the result still leads.
                MessageData::User { content: "five".into() },
                MessageData::Tool {
                    tool_call_id: "toolu_x".into(),
                    tool_name: "clock__now".into(),
                    result: Box::new(ToolResult::ok(json!("12:00"))),
                },
            ],
            params: ModelParams { max_tokens: Some(100), ..ModelParams::default() },
            ..ModelRequest::default()
        };
        let (result, events) = complete(&provider, &request).await;
        let response = result.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(response.text.as_deref(), Some("Hello!"));
        assert!(response.tool_calls.is_empty());
        assert_eq!(response.stop_reason, Some(StopReason::EndTurn));
        assert_eq!(
            response.usage,
            TokenUsage {
                // 25 uncached + 10 written to the cache + 5 read from it.
                input_tokens: 40,
                output_tokens: 15,
                cache_read_tokens: 5,
                cache_write_tokens: 10,
                reasoning_tokens: 0,
            }
        );
        assert_eq!(events, [StreamEvent::TextDelta("Hello".into()), StreamEvent::TextDelta("!".into())]);

        let seen = server.requests();
        let [request] = seen.as_slice() else { panic!("expected one request") };
        let body = request.json();
        assert_eq!(
            body,
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": 100,
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "three"},
                        {"type": "text", "text": "four"},
                        {"type": "tool_use", "id": "toolu_x", "name": "clock__now", "input": {}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_x", "content": r#"{"status":"ok","output":"12:00"}"#, "is_error": false},
                        {"type": "text", "text": "five"},
                    ]},
                ],
                "stream": true,
            })
        );
    }

    #[tokio::test]
    async fn unauthorized_carries_the_api_message_and_never_the_key() {
        let body = r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}"#;
        let (endpoint, server) = serve(vec![Canned::json(401, body)]).await;
        let provider = provider(&endpoint);
        let (result, events) = complete(&provider, &hello()).await;
        let Err(error) = result else { panic!("expected an error") };
        assert!(
            matches!(&error, ModelError::Unauthorized { status: 401, message, .. } if message == "invalid x-api-key"),
            "{error:?}"
        );
        assert!(!error.to_string().contains(KEY) && !format!("{error:?}").contains(KEY));
        assert!(events.is_empty());
        assert_eq!(server.requests().len(), 1, "a refused key is not retried");
        assert!(!format!("{provider:?}").contains(KEY));
    }

    /// The key was not scrubbed from this provider's errors at all.
    #[tokio::test]
    async fn the_key_is_scrubbed_even_when_the_api_echoes_it() {
        let body = json!({"type": "error", "error": {"type": "invalid_request_error", "message": format!("bad header: {KEY}")}});
        let (endpoint, _server) = serve(vec![Canned::json(400, body)]).await;
        let (result, _) = complete(&provider(&endpoint), &hello()).await;
        assert_eq!(
            result.map_err(|e| e.to_string()),
            Err("the anthropic API answered HTTP 400: bad header: <redacted>".to_owned())
        );
        let stream = format!(
            "event: error\ndata: {{\"type\": \"error\", \"error\": {{\"type\": \"api_error\", \"message\": \"{KEY}\"}}}}\n\n"
        );
        let (endpoint, _server) = serve(vec![sse(&stream)]).await;
        let (result, _) = complete(&provider(&endpoint), &hello()).await;
        assert!(
            matches!(&result, Err(ModelError::Api { status: 500, message, .. }) if message == "<redacted>"),
            "{result:?}"
        );
    }

    #[tokio::test]
    async fn rate_limits_are_retried() {
        let limited = r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#;
        let (endpoint, server) = serve(vec![Canned::json(429, limited), sse(TEXT_STREAM)]).await;
        let (result, _) = complete(&provider(&endpoint), &hello()).await;
        assert_eq!(result.map(|r| r.text), Ok(Some("Hello!".to_owned())));
        assert_eq!(server.requests().len(), 2);
    }

    #[tokio::test]
    async fn server_errors_are_retried_up_to_the_policy() {
        let down = r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#;
        let (endpoint, server) =
            serve(vec![Canned::json(500, down), Canned::json(500, down), Canned::json(500, down), sse(TEXT_STREAM)])
                .await;
        let (result, _) = complete(&provider(&endpoint), &hello()).await;
        assert_eq!(result.map(|r| r.text), Ok(Some("Hello!".to_owned())));
        assert_eq!(server.requests().len(), 4);

        let overloaded = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let (endpoint, server) = serve((0..5).map(|_| Canned::json(529, overloaded)).collect()).await;
        let (result, _) = complete(&provider(&endpoint), &hello()).await;
        assert!(matches!(result, Err(ModelError::Api { status: 529, ref message, .. }) if message == "Overloaded"));
        assert_eq!(server.requests().len(), 4, "the default policy makes four attempts");
    }

    #[tokio::test]
    async fn an_error_event_in_the_stream_is_an_api_error_and_not_retried() {
        let (endpoint, server) = serve(vec![sse(OVERLOADED_STREAM), sse(TEXT_STREAM)]).await;
        let (result, events) = complete(&provider(&endpoint), &hello()).await;
        let Err(ModelError::Api { status, message, .. }) = result else { panic!("expected an API error: {result:?}") };
        // `overloaded_error` is what a 529 carries.
        assert_eq!(status, 529);
        assert_eq!(message, "Overloaded");
        assert_eq!(events, [StreamEvent::TextDelta("Hel".into())]);
        assert_eq!(server.requests().len(), 1, "never retried once streaming began");
    }

    #[tokio::test]
    async fn malformed_or_cut_streams_are_protocol_errors() {
        let cut = TEXT_STREAM.split("event: message_delta").next().unwrap_or_default();
        let not_sse = Canned::json(200, r#"{"id":"msg_01","type":"message","content":[]}"#);
        let (endpoint, _server) = serve(vec![sse(MALFORMED_STREAM), sse(cut), not_sse]).await;
        let provider = provider(&endpoint);
        let (malformed, _) = complete(&provider, &hello()).await;
        assert!(
            matches!(&malformed, Err(ModelError::Protocol { message, .. }) if message.contains("content_block_delta")),
            "{malformed:?}"
        );
        let (cut, events) = complete(&provider, &hello()).await;
        assert!(
            matches!(&cut, Err(ModelError::Protocol { message, .. }) if message.contains("message_stop")),
            "{cut:?}"
        );
        assert_eq!(events.len(), 2);
        let (not_sse, _) = complete(&provider, &hello()).await;
        assert!(matches!(&not_sse, Err(ModelError::Protocol { message, .. }) if message.contains("event stream")));
    }

    #[tokio::test]
    async fn unreachable_or_silent_servers_are_network_errors() {
        let (result, _) = complete(&provider(&closed_url().await), &hello()).await;
        let Err(error) = result else { panic!("expected an error") };
        assert!(matches!(error, ModelError::Network { .. }), "{error:?}");
        assert!(!error.to_string().contains(KEY));

        let slow = sse(TEXT_STREAM).after(Duration::from_secs(3));
        let (endpoint, _server) = serve(vec![slow]).await;
        let mut provider = provider(&endpoint);
        provider.http.idle = Duration::from_millis(100);
        provider.http.retry.max_attempts = 1;
        let (result, _) = complete(&provider, &hello()).await;
        assert!(
            matches!(&result, Err(ModelError::Network { message, .. }) if message.contains("no response")),
            "{result:?}"
        );
    }

    #[test]
    fn settings_are_checked() {
        let missing = AnthropicProvider::new(&settings("http://127.0.0.1:9", None));
        assert!(matches!(missing, Err(ModelError::MissingKey { ref variable, .. }) if variable == "ANTHROPIC_API_KEY"));
        let mut with_idle = settings("http://127.0.0.1:9", Some(KEY));
        with_idle.options.insert(IDLE_TIMEOUT_OPTION.into(), json!(2.5));
        assert_eq!(AnthropicProvider::new(&with_idle).map(|p| p.http.idle), Ok(Duration::from_millis(2500)));
        with_idle.options.insert(IDLE_TIMEOUT_OPTION.into(), json!("soon"));
        assert!(matches!(AnthropicProvider::new(&with_idle), Err(ModelError::Config(_))));
        let Ok(provider) = AnthropicProvider::new(&settings("http://127.0.0.1:9", Some(KEY))) else {
            panic!("provider")
        };
        assert_eq!(provider.http.idle, DEFAULT_IDLE_TIMEOUT);
        assert_eq!(provider.url, "http://127.0.0.1:9/v1/messages");
        assert_eq!(provider.name(), "anthropic");
        let debug = format!("{provider:?}");
        assert!(!debug.contains(KEY) && debug.contains("Sensitive"), "{debug}");
    }

    /// An endpoint with or without the `/v1` the original's SDK expects
    /// reaches the same path, as the local server records it.
    #[tokio::test]
    async fn an_endpoint_ending_in_v1_is_not_given_a_second_one() {
        let server = MockServer::start(vec![sse(TEXT_STREAM)]).await;
        for endpoint in [server.url(""), server.url("/"), server.url("/v1"), server.url("/v1/")] {
            let (result, _) = complete(&provider(&endpoint), &hello()).await;
            assert!(result.is_ok(), "{endpoint}: {result:?}");
        }
        let paths: Vec<String> = server.requests().iter().map(|r| r.path().to_owned()).collect();
        assert_eq!(paths, ["/v1/messages"; 4]);
        let under = MockServer::start(vec![sse(TEXT_STREAM)]).await;
        let (result, _) = complete(&provider(&under.url("/proxy/anthropic/v1")), &hello()).await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(under.requests()[0].path(), "/proxy/anthropic/v1/messages");
    }

    /// A stream whose lines end with a bare `\r` reads as the same stream with `\n`.
    #[tokio::test]
    async fn a_stream_whose_lines_end_with_a_bare_cr_reads_as_with_lf() {
        let bare_cr = TEXT_STREAM.replace('\n', "\r");
        let (endpoint, _server) = serve(vec![sse(TEXT_STREAM), sse(&bare_cr)]).await;
        let provider = provider(&endpoint);
        let expected = complete(&provider, &hello()).await;
        assert!(expected.0.is_ok(), "{:?}", expected.0);
        assert_eq!(complete(&provider, &hello()).await, expected);
    }

    #[test]
    fn stop_reasons_map() {
        let reasons = ["end_turn", "stop_sequence", "tool_use", "max_tokens", "pause_turn", "refusal"].map(stop_reason);
        assert_eq!(
            reasons,
            [
                StopReason::EndTurn,
                StopReason::EndTurn,
                StopReason::ToolUse,
                StopReason::MaxTokens,
                StopReason::Other,
                StopReason::Other,
            ]
        );
    }

    #[test]
    fn unknown_events_and_blocks_are_skipped_and_whole_inputs_kept() {
        let mut reply = Reply::default();
        let sink = |_: StreamEvent| {};
        let events = [
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}"#,
            r#"{"type":"some_future_event","x":1}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"a__b","input":{"k":1}}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"input_tokens":7,"output_tokens":3}}"#,
            r#"{"type":"message_stop"}"#,
        ];
        for data in events {
            let event = SseEvent { event: None, data: data.to_owned() };
            reply.handle(&event, &sink).unwrap_or_else(|e| panic!("{e}"));
        }
        let response = reply.finish().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(response.text, None);
        assert_eq!(response.tool_calls[0].arguments, r#"{"k":1}"#);
        assert_eq!(response.usage, TokenUsage { input_tokens: 7, output_tokens: 3, ..TokenUsage::default() });
    }
}
