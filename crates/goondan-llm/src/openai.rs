//! OpenAI and OpenAI-compatible servers (vLLM, llama.cpp's `llama-server`,
//! Ollama, LM Studio, …).
//!
//! Two APIs, chosen by the Model's `options.api`:
//!
//! - **Chat Completions** (the default, since every OpenAI-compatible server
//!   speaks it): `POST {endpoint}/chat/completions`, see
//!   <https://platform.openai.com/docs/api-reference/chat/create> and
//!   <https://platform.openai.com/docs/api-reference/chat-streaming>.
//! - **Responses** (`api: responses`, what the original Goondan uses):
//!   `POST {endpoint}/responses`, see
//!   <https://platform.openai.com/docs/api-reference/responses/create> and
//!   <https://platform.openai.com/docs/api-reference/responses-streaming>.
//!
//! Both always stream (Server-Sent Events) and send the key as
//! `Authorization: Bearer …`. `endpoint` is the base URL the official SDK
//! takes (`https://api.openai.com/v1`, `http://127.0.0.1:8080/v1`).
//! `idleTimeoutSeconds` is the longest wait for the response headers, then
//! for each chunk of the stream (see [`crate::config`]).
//!
//! ```yaml
//! kind: Model
//! metadata: {name: gpt}
//! spec:
//!   provider: openai
//!   model: gpt-4.1-mini
//!   apiKey: {valueFrom: {env: OPENAI_API_KEY}}
//!   options:
//!     api: responses                      # or chat (the default)
//!     maxTokensField: max_completion_tokens # Chat Completions only, see below
//!     idleTimeoutSeconds: 300             # longest wait for headers / each chunk (120)
//!     organization: org-…                 # OpenAI-Organization header
//!     project: proj_…                     # OpenAI-Project header
//!     extraBody: {top_k: 20}              # merged into every request body
//! ```
//!
//! Mapping of a [`ModelRequest`]:
//!
//! - `system` comes first (a `system` message; the Responses API's
//!   `instructions`), and `MessageData::System` entries stay where they are
//!   in the conversation as `system` messages.
//! - A tool result is sent as the `ToolResult` JSON itself
//!   (`{status, output?, error?: {code, message, suggestion, helpUrl}}`) so
//!   the model sees error codes and suggestions.
//! - `temperature`, `top_p` and the token limit: `max_tokens` by default for
//!   Chat Completions, which every compatible server takes; newer OpenAI
//!   models (o-series, gpt-5) refuse it and want `max_completion_tokens`,
//!   selected with `options.maxTokensField`. The Responses API always uses
//!   `max_output_tokens`.
//! - `params.extra` is passed only for keys the chosen API has a field for
//!   (camelCase or snake_case: `frequencyPenalty`, `seed`, `stop`,
//!   `reasoningEffort`, …; see [`CHAT_EXTRA_FIELDS`] and
//!   [`RESPONSES_EXTRA_FIELDS`]), because api.openai.com rejects unknown
//!   fields; anything else is dropped with a debug log line. Server-specific
//!   fields (vLLM's `top_k`, `repetition_penalty`) go in `options.extraBody`,
//!   like the official SDK's `extra_body`.
//! - Responses API function tools are sent with `strict: false`: the API
//!   defaults to strict schemas, which reject ordinary JSON Schemas (optional
//!   properties, no `additionalProperties: false`). A tool without a schema
//!   (`null`) gets `{"type": "object"}`.
//!
//! Errors: an `error` in a Chat Completions chunk, a Responses `error` event
//! and `response.failed` are [`ModelError::Api`] with the API's message and
//! the status its code or type stands for (see [`crate::http`]). The key,
//! and the masked key OpenAI echoes in 401 messages (`sk-abc***…wxyz`), are
//! scrubbed from every error ([`ModelError::redact`]).
//!
//! The reply keeps each tool call's arguments as the exact text the model
//! streamed (fragments concatenated); a call with no argument text at all
//! gets `{}`, and a server that sends an object instead of text has it
//! serialized. A reply with tool calls always stops with
//! [`StopReason::ToolUse`], since some compatible servers say `stop` there.

use goondan_core::{JsonObject, JsonValue, MessageData};
use reqwest::header::{AUTHORIZATION, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::json;

use crate::config::ModelSettings;
use crate::error::ModelError;
use crate::http::{self, RetryPolicy, SseEvent, Transport};
use crate::provider::{Completion, ModelProvider, StreamSink};
use crate::types::{
    ModelParams, ModelRequest, ModelResponse, RawToolCall, StopReason, StreamEvent, TokenUsage, ToolDefinition,
};
use crate::wire;

const PROVIDER: &str = "openai";

/// `params.extra` keys (in snake_case) that Chat Completions has a field for.
/// `n` is missing on purpose: this client reads one choice.
pub const CHAT_EXTRA_FIELDS: &[&str] = &[
    "frequency_penalty",
    "presence_penalty",
    "seed",
    "stop",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "user",
    "response_format",
    "reasoning_effort",
    "parallel_tool_calls",
    "tool_choice",
    "service_tier",
    "store",
    "metadata",
    "verbosity",
    "prediction",
    "prompt_cache_key",
    "safety_identifier",
];

/// `params.extra` keys (in snake_case) that the Responses API has a field for.
pub const RESPONSES_EXTRA_FIELDS: &[&str] = &[
    "parallel_tool_calls",
    "tool_choice",
    "service_tier",
    "store",
    "metadata",
    "reasoning",
    "text",
    "truncation",
    "user",
    "max_tool_calls",
    "top_logprobs",
    "prompt_cache_key",
    "safety_identifier",
];

/// Body fields this client owns; `options.extraBody` may not replace them,
/// or the conversation or the streaming this client relies on would break.
const RESERVED_FIELDS: &[&str] = &["model", "messages", "input", "instructions", "stream", "stream_options"];

/// Which OpenAI API to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    ChatCompletions,
    Responses,
}

/// The OpenAI (and OpenAI-compatible) provider.
#[derive(Debug)]
pub struct OpenAiProvider {
    /// Authorization (marked sensitive, so `Debug` shows `Sensitive`), and
    /// the optional organization/project headers.
    http: Transport,
    model: String,
    api: Api,
    max_tokens_field: &'static str,
    extra_body: JsonObject,
}

impl OpenAiProvider {
    /// A provider for `settings` (reads `options.api`, `maxTokensField`,
    /// `idleTimeoutSeconds`, `organization`, `project` and `extraBody`).
    pub fn new(settings: &ModelSettings) -> Result<Self, ModelError> {
        let mut http = Transport::new(settings, AUTHORIZATION, "Bearer ")?;
        let api = match settings.option_str("api")? {
            None | Some("chat" | "chat-completions" | "chat_completions" | "chatCompletions") => Api::ChatCompletions,
            Some("responses") => Api::Responses,
            Some(other) => {
                return Err(ModelError::Config(format!(
                    "openai: options.api '{other}' is not supported; use 'chat' (Chat Completions, the default) or 'responses'"
                )));
            }
        };
        let max_tokens_field = match settings.option_str("maxTokensField")? {
            None | Some("max_tokens") => "max_tokens",
            Some("max_completion_tokens") => "max_completion_tokens",
            Some(other) => {
                return Err(ModelError::Config(format!(
                    "openai: options.maxTokensField '{other}' is not supported; use 'max_tokens' or 'max_completion_tokens'"
                )));
            }
        };
        let extra_body = match settings.options.get("extraBody") {
            None => JsonObject::new(),
            Some(JsonValue::Object(body)) => body.clone(),
            Some(_) => return Err(ModelError::Config("openai: options.extraBody must be an object".to_owned())),
        };
        if let Some(field) = extra_body.keys().find(|key| RESERVED_FIELDS.contains(&key.as_str())) {
            return Err(ModelError::Config(format!(
                "openai: options.extraBody may not set '{field}', which this client sends itself"
            )));
        }
        for (option, header) in [("organization", "openai-organization"), ("project", "openai-project")] {
            if let Some(value) = settings.option_str(option)? {
                let value = HeaderValue::from_str(value).map_err(|_| {
                    ModelError::Config(format!("openai: options.{option} cannot be sent in an HTTP header"))
                })?;
                http.insert_header(HeaderName::from_static(header), value);
            }
        }
        Ok(Self { http, model: settings.model.clone(), api, max_tokens_field, extra_body })
    }

    /// Replaces the retry policy (the default: 4 attempts from 0.5 s backoff).
    #[must_use]
    pub fn with_retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.http.retry = policy;
        self
    }

    async fn chat(&self, request: &ModelRequest, on_event: StreamSink<'_>) -> Result<ModelResponse, ModelError> {
        let body = self.chat_body(request)?;
        let response = self.http.post(&self.http.url("chat/completions"), &body).await?;
        let mut stream = ChatStream::default();
        self.http.read_sse(response, |event| stream.event(&event, on_event)).await?;
        stream.finish()
    }

    async fn responses(&self, request: &ModelRequest, on_event: StreamSink<'_>) -> Result<ModelResponse, ModelError> {
        let body = self.responses_body(request)?;
        let response = self.http.post(&self.http.url("responses"), &body).await?;
        let mut stream = ResponsesStream::default();
        self.http.read_sse(response, |event| stream.event(&event, on_event)).await?;
        stream.finish()
    }

    fn chat_body(&self, request: &ModelRequest) -> Result<JsonObject, ModelError> {
        let mut messages = Vec::with_capacity(request.messages.len() + 1);
        if let Some(system) = request.system.as_deref().filter(|s| !s.is_empty()) {
            messages.push(json!({"role": "system", "content": system}));
        }
        for message in &request.messages {
            match message {
                MessageData::System { content } => messages.push(json!({"role": "system", "content": content})),
                MessageData::User { content } => messages.push(json!({"role": "user", "content": content})),
                MessageData::Assistant { content, tool_calls } => {
                    let mut entry = JsonObject::new();
                    entry.insert("role".into(), "assistant".into());
                    // `content` may be null only next to tool calls.
                    let content = match content {
                        Some(text) if !text.is_empty() => JsonValue::from(text.as_str()),
                        _ if !tool_calls.is_empty() => JsonValue::Null,
                        _ => JsonValue::from(""),
                    };
                    entry.insert("content".into(), content);
                    if !tool_calls.is_empty() {
                        let calls = tool_calls
                            .iter()
                            .map(|call| {
                                Ok(json!({
                                    "id": &*call.id,
                                    "type": "function",
                                    "function": {"name": &*call.name, "arguments": json_text(&call.args)?},
                                }))
                            })
                            .collect::<Result<Vec<_>, ModelError>>()?;
                        entry.insert("tool_calls".into(), calls.into());
                    }
                    messages.push(entry.into());
                }
                MessageData::Tool { tool_call_id, result, .. } => messages.push(json!({
                    "role": "tool",
                    "tool_call_id": tool_call_id,
                    "content": json_text(&**result)?,
                })),
            }
        }

        let mut body = JsonObject::new();
        body.insert("model".into(), self.model.clone().into());
        body.insert("messages".into(), messages.into());
        body.insert("stream".into(), true.into());
        // Without this the stream carries no token counts.
        body.insert("stream_options".into(), json!({"include_usage": true}));
        if !request.tools.is_empty() {
            // api.openai.com rejects an empty `tools` array, so it is left out.
            let tools: Vec<JsonValue> =
                request.tools.iter().map(|tool| json!({"type": "function", "function": function(tool)})).collect();
            body.insert("tools".into(), tools.into());
        }
        sampling(&mut body, &request.params, self.max_tokens_field);
        extras(&mut body, &request.params, CHAT_EXTRA_FIELDS);
        body.extend(self.extra_body.clone());
        Ok(body)
    }

    fn responses_body(&self, request: &ModelRequest) -> Result<JsonObject, ModelError> {
        let mut input = Vec::with_capacity(request.messages.len());
        for message in &request.messages {
            match message {
                MessageData::System { content } => input.push(json!({"role": "system", "content": content})),
                MessageData::User { content } => input.push(json!({"role": "user", "content": content})),
                MessageData::Assistant { content, tool_calls } => {
                    if let Some(text) = content.as_deref().filter(|t| !t.is_empty()) {
                        input.push(json!({"role": "assistant", "content": text}));
                    }
                    for call in tool_calls {
                        input.push(json!({
                            "type": "function_call",
                            "call_id": &*call.id,
                            "name": &*call.name,
                            "arguments": json_text(&call.args)?,
                        }));
                    }
                }
                MessageData::Tool { tool_call_id, result, .. } => input.push(json!({
                    "type": "function_call_output",
                    "call_id": tool_call_id,
                    "output": json_text(&**result)?,
                })),
            }
        }

        let mut body = JsonObject::new();
        body.insert("model".into(), self.model.clone().into());
        if let Some(system) = request.system.as_deref().filter(|s| !s.is_empty()) {
            body.insert("instructions".into(), system.into());
        }
        body.insert("input".into(), input.into());
        body.insert("stream".into(), true.into());
        if !request.tools.is_empty() {
            let tools: Vec<JsonValue> = request
                .tools
                .iter()
                .map(|tool| {
                    let mut function = function(tool);
                    function.insert("type".into(), "function".into());
                    // The API's default (strict) refuses ordinary schemas.
                    function.insert("strict".into(), false.into());
                    function.into()
                })
                .collect();
            body.insert("tools".into(), tools.into());
        }
        sampling(&mut body, &request.params, "max_output_tokens");
        extras(&mut body, &request.params, RESPONSES_EXTRA_FIELDS);
        body.extend(self.extra_body.clone());
        Ok(body)
    }
}

impl ModelProvider for OpenAiProvider {
    fn complete<'a>(&'a self, request: &'a ModelRequest, on_event: StreamSink<'a>) -> Completion<'a> {
        Box::pin(async move {
            let result = match self.api {
                Api::ChatCompletions => self.chat(request, on_event).await,
                Api::Responses => self.responses(request, on_event).await,
            };
            result.map_err(|error| self.http.redact(error))
        })
    }

    fn name(&self) -> &str {
        PROVIDER
    }
}

/// A function tool's `{name, description?, parameters}`.
fn function(tool: &ToolDefinition) -> JsonObject {
    let mut function = JsonObject::new();
    function.insert("name".into(), tool.name.clone().into());
    if let Some(description) = &tool.description {
        function.insert("description".into(), description.clone().into());
    }
    function.insert("parameters".into(), wire::tool_parameters(tool).into_owned());
    function
}

fn json_text<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, ModelError> {
    serde_json::to_string(value).map_err(|e| ModelError::Protocol {
        provider: PROVIDER.to_owned(),
        message: format!("cannot encode the conversation: {e}"),
    })
}

fn sampling(body: &mut JsonObject, params: &ModelParams, max_tokens_field: &str) {
    if let Some(temperature) = params.temperature {
        body.insert("temperature".into(), json!(temperature));
    }
    if let Some(top_p) = params.top_p {
        body.insert("top_p".into(), json!(top_p));
    }
    if let Some(max_tokens) = params.max_tokens {
        body.insert(max_tokens_field.into(), max_tokens.into());
    }
}

/// The `params.extra` entries among `allowed` (camelCase keys accepted).
fn extras(body: &mut JsonObject, params: &ModelParams, allowed: &[&'static str]) {
    for (field, value) in wire::allowed_extras(PROVIDER, &params.extra, allowed, &[]) {
        body.insert(field.to_owned(), value.clone());
    }
}

fn protocol(message: impl Into<String>) -> ModelError {
    ModelError::protocol(PROVIDER, message)
}

/// Parses one event's data, naming the problem (and the start of the data)
/// when it is not the JSON the API promises.
fn parse_data<T: serde::de::DeserializeOwned>(data: &str) -> Result<T, ModelError> {
    serde_json::from_str(data)
        .map_err(|e| protocol(format!("cannot read a stream event ({e}): {}", http::excerpt(data, 200))))
}

/// A tool call being assembled from stream fragments.
#[derive(Debug, Default)]
struct PartialCall {
    /// Chat Completions: the `index` of its deltas.
    index: Option<u64>,
    /// Responses: the output item id and position.
    item_id: Option<String>,
    output_index: Option<u64>,
    id: String,
    name: String,
    arguments: String,
    started: bool,
}

impl PartialCall {
    /// Reports the call once its name is known (with a generated id if the
    /// server gives none).
    fn start(&mut self, on_event: StreamSink<'_>) {
        if self.started || self.name.is_empty() {
            return;
        }
        if self.id.is_empty() {
            self.id = format!("call_{}", goondan_core::ids::new_trace_id());
        }
        self.started = true;
        on_event(StreamEvent::ToolCallStarted { id: self.id.clone(), name: self.name.clone() });
    }

    fn into_raw(mut self) -> RawToolCall {
        if self.id.is_empty() {
            self.id = format!("call_{}", goondan_core::ids::new_trace_id());
        }
        let arguments = if self.arguments.trim().is_empty() { "{}".to_owned() } else { self.arguments };
        RawToolCall { id: self.id, name: self.name, arguments }
    }
}

/// Argument text as streamed, or an object serialized (some servers).
fn arguments_text(value: &JsonValue) -> Option<String> {
    match value {
        JsonValue::Null => None,
        JsonValue::String(text) => Some(text.clone()),
        other => Some(other.to_string()),
    }
}

fn finish_response(
    text: String,
    calls: Vec<PartialCall>,
    stop: Option<StopReason>,
    usage: TokenUsage,
) -> ModelResponse {
    let tool_calls: Vec<RawToolCall> = calls.into_iter().map(PartialCall::into_raw).collect();
    let stop_reason = match stop {
        Some(StopReason::EndTurn) | None if !tool_calls.is_empty() => Some(StopReason::ToolUse),
        other => other,
    };
    ModelResponse { text: (!text.is_empty()).then_some(text), tool_calls, stop_reason, usage }
}

// ---------------------------------------------------------------------------
// Chat Completions stream: `data: {chat.completion.chunk}` … `data: [DONE]`.

#[derive(Deserialize)]
struct ChatChunk {
    #[serde(default)]
    choices: Vec<ChatChoice>,
    #[serde(default)]
    usage: Option<ChatUsage>,
    #[serde(default)]
    error: Option<JsonValue>,
}

#[derive(Deserialize)]
struct ChatChoice {
    #[serde(default)]
    index: u64,
    #[serde(default)]
    delta: Option<ChatDelta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct ChatDelta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ChatToolCallDelta>>,
}

#[derive(Deserialize)]
struct ChatToolCallDelta {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<ChatFunctionDelta>,
}

#[derive(Deserialize)]
struct ChatFunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<JsonValue>,
}

#[derive(Deserialize)]
struct ChatUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<CachedDetails>,
    #[serde(default)]
    completion_tokens_details: Option<ReasoningDetails>,
}

/// `prompt_tokens_details` (Chat Completions) and `input_tokens_details`
/// (Responses): the cached part of the prompt. Compatible servers send
/// `null` counts or leave them out.
#[derive(Deserialize)]
struct CachedDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

/// `completion_tokens_details` and `output_tokens_details`: the reasoning
/// part of the output.
#[derive(Deserialize)]
struct ReasoningDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

/// The usage of either API: the cached count is a part of the prompt and
/// the reasoning count a part of the output, as [`TokenUsage`] counts them.
fn usage_of(
    input: Option<u64>,
    output: Option<u64>,
    cached: Option<CachedDetails>,
    reasoning: Option<ReasoningDetails>,
) -> TokenUsage {
    TokenUsage {
        input_tokens: input.unwrap_or(0),
        output_tokens: output.unwrap_or(0),
        cache_read_tokens: cached.and_then(|d| d.cached_tokens).unwrap_or(0),
        // OpenAI caches prompts on its own and charges nothing to write them.
        cache_write_tokens: 0,
        reasoning_tokens: reasoning.and_then(|d| d.reasoning_tokens).unwrap_or(0),
    }
}

#[derive(Debug, Default)]
struct ChatStream {
    text: String,
    calls: Vec<PartialCall>,
    finish_reason: Option<String>,
    usage: TokenUsage,
    done: bool,
}

impl ChatStream {
    fn event(&mut self, event: &SseEvent, on_event: StreamSink<'_>) -> Result<(), ModelError> {
        let data = event.data.trim();
        if self.done || data.is_empty() {
            return Ok(());
        }
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let chunk: ChatChunk = parse_data(data)?;
        if let Some(error) = chunk.error.filter(|e| !e.is_null()) {
            return Err(http::stream_error(PROVIDER, &error));
        }
        if let Some(usage) = chunk.usage {
            self.usage = usage_of(
                usage.prompt_tokens,
                usage.completion_tokens,
                usage.prompt_tokens_details,
                usage.completion_tokens_details,
            );
        }
        // Only one choice is asked for (no `n`).
        for choice in chunk.choices.into_iter().filter(|choice| choice.index == 0) {
            if let Some(delta) = choice.delta {
                // A refusal is the model's answer too; dropping it would leave an empty reply.
                for text in [delta.content, delta.refusal].into_iter().flatten().filter(|t| !t.is_empty()) {
                    self.text.push_str(&text);
                    on_event(StreamEvent::TextDelta(text));
                }
                for call in delta.tool_calls.unwrap_or_default() {
                    self.tool_call(call, on_event);
                }
            }
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                self.finish_reason = Some(reason);
            }
        }
        Ok(())
    }

    fn tool_call(&mut self, delta: ChatToolCallDelta, on_event: StreamSink<'_>) {
        let id = delta.id.filter(|id| !id.is_empty());
        let name = delta.function.as_ref().and_then(|f| f.name.as_deref()).filter(|n| !n.is_empty());
        // OpenAI keys fragments by `index`; some compatible servers omit it
        // and send each call whole, or continue the last one with neither an
        // id nor a name.
        let position = match (delta.index, &id) {
            (Some(index), _) => self.calls.iter().position(|call| call.index == Some(index)),
            (None, Some(id)) => self.calls.iter().position(|call| call.id == *id),
            (None, None) => {
                self.calls.last().filter(|last| name.is_none() || last.name.is_empty()).map(|_| self.calls.len() - 1)
            }
        };
        let position = position.unwrap_or_else(|| {
            self.calls.push(PartialCall { index: delta.index, ..PartialCall::default() });
            self.calls.len() - 1
        });
        let Some(call) = self.calls.get_mut(position) else { return };
        if let Some(id) = id
            && call.id.is_empty()
        {
            call.id = id;
        }
        if let Some(function) = delta.function {
            if let Some(name) = function.name.filter(|n| !n.is_empty())
                && call.name.is_empty()
            {
                call.name = name;
            }
            match function.arguments {
                Some(JsonValue::String(fragment)) => call.arguments.push_str(&fragment),
                Some(value) => call.arguments = arguments_text(&value).unwrap_or_default(),
                None => {}
            }
        }
        call.start(on_event);
    }

    fn finish(self) -> Result<ModelResponse, ModelError> {
        if !self.done && self.finish_reason.is_none() {
            return Err(protocol("the stream ended before the reply was complete (no finish_reason, no [DONE])"));
        }
        let stop = self.finish_reason.as_deref().map(|reason| match reason {
            "stop" => StopReason::EndTurn,
            "tool_calls" | "function_call" => StopReason::ToolUse,
            "length" => StopReason::MaxTokens,
            _ => StopReason::Other,
        });
        Ok(finish_response(self.text, self.calls, stop, self.usage))
    }
}

// ---------------------------------------------------------------------------
// Responses stream: typed events (`response.output_text.delta`, …) ending
// with `response.completed` / `response.incomplete` / `response.failed`.

#[derive(Deserialize)]
struct TextDeltaEvent {
    delta: String,
}

#[derive(Deserialize)]
struct ItemEvent {
    #[serde(default)]
    output_index: Option<u64>,
    item: JsonValue,
}

#[derive(Deserialize)]
struct FunctionCallItem {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<JsonValue>,
}

#[derive(Deserialize)]
struct ArgumentsEvent {
    #[serde(default)]
    item_id: Option<String>,
    #[serde(default)]
    output_index: Option<u64>,
    #[serde(default)]
    delta: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct FinalEvent {
    response: FinalResponse,
}

#[derive(Deserialize)]
struct FinalResponse {
    #[serde(default)]
    usage: Option<ResponsesUsage>,
    #[serde(default)]
    incomplete_details: Option<IncompleteDetails>,
    #[serde(default)]
    error: Option<JsonValue>,
    #[serde(default)]
    output: Vec<JsonValue>,
}

#[derive(Deserialize)]
struct ResponsesUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    input_tokens_details: Option<CachedDetails>,
    #[serde(default)]
    output_tokens_details: Option<ReasoningDetails>,
}

#[derive(Deserialize)]
struct IncompleteDetails {
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Debug, Default)]
struct ResponsesStream {
    text: String,
    calls: Vec<PartialCall>,
    stop: Option<StopReason>,
    usage: TokenUsage,
    finished: bool,
}

impl ResponsesStream {
    fn event(&mut self, event: &SseEvent, on_event: StreamSink<'_>) -> Result<(), ModelError> {
        let data = event.data.trim();
        // Some compatible servers end with `[DONE]` as in Chat Completions.
        if self.finished || data.is_empty() || data == "[DONE]" {
            return Ok(());
        }
        let value: JsonValue = parse_data(data)?;
        let kind =
            value.get("type").and_then(JsonValue::as_str).or(event.event.as_deref()).unwrap_or_default().to_owned();
        match kind.as_str() {
            "response.output_text.delta" | "response.refusal.delta" => {
                let TextDeltaEvent { delta } = from_event(value)?;
                if !delta.is_empty() {
                    self.text.push_str(&delta);
                    on_event(StreamEvent::TextDelta(delta));
                }
            }
            "response.output_item.added" | "response.output_item.done" => {
                let ItemEvent { output_index, item } = from_event(value)?;
                if item.get("type").and_then(JsonValue::as_str) == Some("function_call") {
                    let item: FunctionCallItem = from_event(item)?;
                    self.function_call(item, output_index, on_event);
                }
            }
            "response.function_call_arguments.delta" | "response.function_call_arguments.done" => {
                let ArgumentsEvent { item_id, output_index, delta, arguments } = from_event(value)?;
                let position = self.find(item_id.as_deref(), output_index).unwrap_or_else(|| {
                    self.calls.push(PartialCall { item_id, output_index, ..PartialCall::default() });
                    self.calls.len() - 1
                });
                if let Some(call) = self.calls.get_mut(position) {
                    if let Some(delta) = delta {
                        call.arguments.push_str(&delta);
                    }
                    // `.done` carries the whole text: it wins over the fragments.
                    if let Some(arguments) = arguments {
                        call.arguments = arguments;
                    }
                }
            }
            "response.completed" | "response.incomplete" => {
                let FinalEvent { response } = from_event(value)?;
                self.finished = true;
                if let Some(usage) = response.usage {
                    self.usage = usage_of(
                        usage.input_tokens,
                        usage.output_tokens,
                        usage.input_tokens_details,
                        usage.output_tokens_details,
                    );
                }
                self.stop = Some(if kind == "response.completed" {
                    StopReason::EndTurn
                } else {
                    match response.incomplete_details.and_then(|d| d.reason).as_deref() {
                        Some("max_output_tokens") => StopReason::MaxTokens,
                        _ => StopReason::Other,
                    }
                });
                self.fill_from_output(&response.output, on_event)?;
            }
            "response.failed" => {
                let FinalEvent { response } = from_event(value)?;
                let error = response.error.unwrap_or_else(|| json!({"message": "the response failed"}));
                return Err(http::stream_error(PROVIDER, &error));
            }
            "error" => {
                // `{type: "error", code, message, param}`, or the error nested under `error`.
                let error = value.get("error").filter(|e| e.is_object()).unwrap_or(&value);
                return Err(http::stream_error(PROVIDER, error));
            }
            _ => {}
        }
        Ok(())
    }

    fn find(&self, item_id: Option<&str>, output_index: Option<u64>) -> Option<usize> {
        item_id
            .and_then(|id| self.calls.iter().position(|call| call.item_id.as_deref() == Some(id)))
            .or_else(|| output_index.and_then(|i| self.calls.iter().position(|call| call.output_index == Some(i))))
    }

    fn function_call(&mut self, item: FunctionCallItem, output_index: Option<u64>, on_event: StreamSink<'_>) {
        let position = self.find(item.id.as_deref(), output_index).unwrap_or_else(|| {
            self.calls.push(PartialCall { item_id: item.id.clone(), output_index, ..PartialCall::default() });
            self.calls.len() - 1
        });
        let Some(call) = self.calls.get_mut(position) else { return };
        if let Some(id) = item.call_id.filter(|id| !id.is_empty())
            && call.id.is_empty()
        {
            call.id = id;
        }
        if let Some(name) = item.name.filter(|n| !n.is_empty())
            && call.name.is_empty()
        {
            call.name = name;
        }
        // `added` has "" here and `done` the whole text.
        if let Some(arguments) = item.arguments.as_ref().and_then(arguments_text).filter(|a| !a.is_empty()) {
            call.arguments = arguments;
        }
        call.start(on_event);
    }

    /// Takes from the final response what the stream did not deliver piece
    /// by piece (servers that send only the final event).
    fn fill_from_output(&mut self, output: &[JsonValue], on_event: StreamSink<'_>) -> Result<(), ModelError> {
        let streamed_text = !self.text.is_empty();
        for (index, item) in output.iter().enumerate() {
            match item.get("type").and_then(JsonValue::as_str) {
                Some("function_call") => {
                    let item: FunctionCallItem = from_event(item.clone())?;
                    let known = self.calls.iter().any(|call| {
                        (item.call_id.is_some() && item.call_id.as_deref() == Some(call.id.as_str()))
                            || (item.id.is_some() && call.item_id == item.id)
                    });
                    if !known {
                        self.function_call(item, u64::try_from(index).ok(), on_event);
                    }
                }
                Some("message") if !streamed_text => {
                    let parts =
                        item.get("content").and_then(JsonValue::as_array).map(Vec::as_slice).unwrap_or_default();
                    for part in parts {
                        if let Some(text) = part.get("text").and_then(JsonValue::as_str).filter(|t| !t.is_empty()) {
                            self.text.push_str(text);
                            on_event(StreamEvent::TextDelta(text.to_owned()));
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<ModelResponse, ModelError> {
        if !self.finished {
            return Err(protocol("the stream ended before response.completed"));
        }
        Ok(finish_response(self.text, self.calls, self.stop, self.usage))
    }
}

fn from_event<T: serde::de::DeserializeOwned>(value: JsonValue) -> Result<T, ModelError> {
    let kind = value.get("type").and_then(JsonValue::as_str).unwrap_or("event").to_owned();
    serde_json::from_value(value).map_err(|e| protocol(format!("cannot read a {kind} stream event: {e}")))
}

#[cfg(test)]
mod usage_tests {
    use super::*;

    /// The last chunk of a Chat Completions stream with
    /// `stream_options.include_usage` (an o4-mini reply whose prompt hit
    /// the cache).
    #[test]
    fn chat_usage_maps_cached_and_reasoning_tokens() {
        let chunk = r#"{"id":"chatcmpl-C1","object":"chat.completion.chunk","created":1741570283,"model":"o4-mini-2025-04-16","choices":[],"usage":{"prompt_tokens":1117,"completion_tokens":846,"total_tokens":1963,"prompt_tokens_details":{"cached_tokens":1024,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":768,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}"#;
        let mut stream = ChatStream::default();
        let event = SseEvent { data: chunk.to_owned(), ..SseEvent::default() };
        stream.event(&event, &|_| {}).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            stream.usage,
            TokenUsage {
                input_tokens: 1117,
                output_tokens: 846,
                cache_read_tokens: 1024,
                cache_write_tokens: 0,
                reasoning_tokens: 768
            }
        );
        assert_eq!(stream.usage.total(), 1963);
        // Compatible servers send null details, or none.
        let bare = r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"prompt_tokens_details":null}}"#;
        let mut stream = ChatStream::default();
        let event = SseEvent { data: bare.to_owned(), ..SseEvent::default() };
        stream.event(&event, &|_| {}).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(stream.usage, TokenUsage { input_tokens: 5, output_tokens: 2, ..TokenUsage::default() });
    }

    /// `response.completed`'s usage (Responses API, a reasoning model with a
    /// cached prompt).
    #[test]
    fn responses_usage_maps_cached_and_reasoning_tokens() {
        let usage = r#"{"input_tokens":2006,"input_tokens_details":{"cached_tokens":1920},"output_tokens":1091,"output_tokens_details":{"reasoning_tokens":960},"total_tokens":3097}"#;
        let usage: ResponsesUsage = serde_json::from_str(usage).unwrap_or_else(|e| panic!("{e}"));
        let usage =
            usage_of(usage.input_tokens, usage.output_tokens, usage.input_tokens_details, usage.output_tokens_details);
        assert_eq!(
            usage,
            TokenUsage {
                input_tokens: 2006,
                output_tokens: 1091,
                cache_read_tokens: 1920,
                cache_write_tokens: 0,
                reasoning_tokens: 960
            }
        );
    }
}
