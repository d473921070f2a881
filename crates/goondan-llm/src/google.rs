//! Google's Gemini API (`models.streamGenerateContent`).
//!
//! Reference: <https://ai.google.dev/api/generate-content> (request and
//! response bodies), <https://ai.google.dev/gemini-api/docs/function-calling>
//! (tools), <https://ai.google.dev/api/caching#Schema> (the schema subset
//! function parameters accept) and
//! <https://ai.google.dev/gemini-api/docs/thought-signatures>.
//!
//! Every call is `POST {endpoint}/models/{model}:streamGenerateContent?alt=sse`
//! with the key in the `x-goog-api-key` header — never the `key=` query
//! parameter, so no URL (and hence no error or log line quoting one) carries
//! it. The conversation maps to the wire format like this:
//!
//! - `request.system`, then every `MessageData::System` entry, become the
//!   parts of `systemInstruction`.
//! - User text is a `user` content; assistant text and tool calls a `model`
//!   content (`{text}` then `{functionCall: {name, args}}` parts); each tool
//!   result a `{functionResponse: {name, response}}` part of a `user` content
//!   whose `response` is the ToolResult object itself (`{status, output?,
//!   error?: {code, message, suggestion, helpUrl}}`), so the model sees codes
//!   and suggestions. Consecutive contents of the same role are merged, as
//!   the API wants turns to alternate, with the function responses first.
//! - Tools are one `{functionDeclarations: […]}` entry whose `parameters` are
//!   rewritten into the OpenAPI subset Gemini accepts (see `gemini_schema`
//!   below for exactly what changes).
//! - `temperature`, `maxTokens` and `topP` go into `generationConfig`, and so
//!   do these `params` extras, which have a field of that name there:
//!   `topK`, `seed`, `stopSequences` (also `stop`, a string or a list),
//!   `presencePenalty`, `frequencyPenalty`, `thinkingConfig`,
//!   `responseMimeType` (snake_case spellings are accepted too);
//!   `safetySettings` goes to the request's top level. Other extras are
//!   ignored (logged at debug level), since the API rejects unknown fields.
//!
//! Streaming: each SSE `data:` is a whole `GenerateContentResponse`. Text
//! parts are deltas; a `functionCall` arrives whole (its `args` object is
//! serialized to the arguments text), so there are no argument fragments to
//! join. Gemini gives calls no ids (or none this client relies on), so each
//! gets a fresh `call_<16 hex digits>` id, unique across conversations.
//! `finishReason` is `STOP` also when the model called tools; a stop with
//! calls becomes [`StopReason::ToolUse`]. Thought parts (`thought: true`) are
//! not reply text and are skipped. Usage is the last `usageMetadata` seen
//! (the API repeats running totals); thinking tokens count as output, as
//! they are billed.
//!
//! Thought signatures: Gemini 3 models reject a history whose function calls
//! lack the `thoughtSignature` the model attached to them. The neutral
//! [`goondan_core::ToolCall`] has no room for it, so the provider remembers
//! the signatures of the calls it produced (by call id, bounded) and sends
//! them back; a call it does not know (an earlier process, another model)
//! gets the sentinel the documentation provides for that case on the first
//! call of its step.
//!
//! Errors: a wrong key, which Gemini answers with 400 `API_KEY_INVALID`, is
//! [`ModelError::Unauthorized`] like a 401; an `error` object inside the
//! stream is [`ModelError::Api`] with its message and its `code` as the
//! status (see [`crate::http`]). The key is scrubbed from every error
//! ([`ModelError::redact`]).
//!
//! `options.idleTimeoutSeconds` is the longest wait for the response
//! headers, then for each chunk of the stream (default 120; see
//! [`crate::config`]).

use goondan_core::sync::LockUnpoisoned;
use std::collections::VecDeque;
use std::fmt;
use std::sync::Mutex;

use goondan_core::ids::SpanIdGenerator;
use goondan_core::{JsonObject, JsonValue, MessageData};
use reqwest::header::HeaderName;
use serde::Deserialize;
use serde_json::json;

use crate::config::ModelSettings;
use crate::error::ModelError;
use crate::http::{self, RetryPolicy, SseEvent, Transport};
use crate::provider::{Completion, ModelProvider, StreamSink};
use crate::types::{ModelParams, ModelRequest, ModelResponse, RawToolCall, StopReason, StreamEvent, TokenUsage};
use crate::wire;

const PROVIDER: &str = "google";
/// The documented stand-in signature for function calls whose real one is
/// unknown (history from another model or an earlier process).
const SKIP_SIGNATURE: &str = "skip_thought_signature_validator";
/// How many thought signatures to remember: enough for the calls of many
/// recent steps, small enough not to matter (signatures are a few KB).
const SIGNATURE_CAPACITY: usize = 512;

/// `generationConfig` fields `params.extra` may set (snake_case keys accepted).
const GENERATION_EXTRAS: &[&str] = &[
    "topK",
    "seed",
    "stopSequences",
    "presencePenalty",
    "frequencyPenalty",
    "thinkingConfig",
    "responseMimeType",
    // Not in `generationConfig`: a field of the request itself.
    "safetySettings",
];

/// `params.extra` keys accepted for a differently named field.
const EXTRA_ALIASES: &[(&str, &str)] = &[("stop", "stopSequences")];

/// The Gemini provider.
pub struct GoogleProvider {
    http: Transport,
    model: String,
    ids: SpanIdGenerator,
    signatures: Mutex<VecDeque<(String, String)>>,
}

impl fmt::Debug for GoogleProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The transport prints its key header as `Sensitive`; the
        // signatures are left out as noise.
        f.debug_struct("GoogleProvider").field("http", &self.http).field("model", &self.model).finish_non_exhaustive()
    }
}

impl GoogleProvider {
    /// A provider for `settings` (needs an API key).
    pub fn new(settings: &ModelSettings) -> Result<Self, ModelError> {
        let http =
            Transport::new(settings, HeaderName::from_static("x-goog-api-key"), "")?.with_status_error(status_error);
        // The API takes `models/gemini-…` as well as the bare id; the URL wants the bare id.
        let model = settings.model.strip_prefix("models/").unwrap_or(&settings.model).to_owned();
        if model.is_empty() {
            return Err(ModelError::Config("the google model needs a model id (e.g. gemini-2.5-flash)".into()));
        }
        Ok(Self { http, model, ids: SpanIdGenerator::new(), signatures: Mutex::new(VecDeque::new()) })
    }

    /// Replaces the retry policy (the default: 4 attempts from 0.5 s backoff).
    #[must_use]
    pub fn with_retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.http.retry = policy;
        self
    }

    fn url(&self) -> String {
        self.http.url(&format!("models/{}:streamGenerateContent?alt=sse", self.model))
    }

    fn next_call_id(&self) -> String {
        format!("call_{}", self.ids.next_hex())
    }

    fn remember_signature(&self, call_id: &str, signature: String) {
        let mut signatures = self.signatures.lock_unpoisoned();
        if signatures.len() >= SIGNATURE_CAPACITY {
            signatures.pop_front();
        }
        signatures.push_back((call_id.to_owned(), signature));
    }

    fn signature_of(&self, call_id: &str) -> Option<String> {
        let signatures = self.signatures.lock_unpoisoned();
        signatures.iter().rev().find(|(id, _)| id == call_id).map(|(_, signature)| signature.clone())
    }

    /// The `generateContent` request body for `request`.
    fn body(&self, request: &ModelRequest) -> JsonValue {
        let mut body = JsonObject::new();

        let system_parts: Vec<JsonValue> =
            wire::system_texts(request).into_iter().map(|text| json!({"text": text})).collect();
        if !system_parts.is_empty() {
            body.insert("systemInstruction".into(), json!({"parts": system_parts}));
        }

        body.insert("contents".into(), JsonValue::Array(self.contents(&request.messages)));

        if !request.tools.is_empty() {
            let declarations: Vec<JsonValue> = request
                .tools
                .iter()
                .map(|tool| {
                    let mut declaration = JsonObject::new();
                    declaration.insert("name".into(), JsonValue::String(tool.name.clone()));
                    if let Some(description) = &tool.description {
                        declaration.insert("description".into(), JsonValue::String(description.clone()));
                    }
                    if let Some(parameters) = gemini_parameters(&tool.parameters) {
                        declaration.insert("parameters".into(), parameters);
                    }
                    JsonValue::Object(declaration)
                })
                .collect();
            body.insert("tools".into(), json!([{"functionDeclarations": declarations}]));
        }

        let (config, top_level) = generation_config(&request.params);
        if !config.is_empty() {
            body.insert("generationConfig".into(), JsonValue::Object(config));
        }
        body.extend(top_level);
        JsonValue::Object(body)
    }

    fn contents(&self, messages: &[MessageData]) -> Vec<JsonValue> {
        let mut contents: Vec<(&'static str, Vec<JsonValue>)> = Vec::new();
        let mut push = |role: &'static str, parts: Vec<JsonValue>| {
            wire::push_alternating(&mut contents, role, parts, |part| part.get("functionResponse").is_some());
        };
        for message in messages {
            match message {
                // Sent as system instructions.
                MessageData::System { .. } => {}
                MessageData::User { content } => push("user", text_part(content).into_iter().collect()),
                MessageData::Assistant { content, tool_calls } => {
                    let mut parts: Vec<JsonValue> = content.as_deref().and_then(text_part).into_iter().collect();
                    for (index, call) in tool_calls.iter().enumerate() {
                        let mut part = JsonObject::new();
                        part.insert("functionCall".into(), json!({"name": &*call.name, "args": call.args}));
                        // Only the first call of a step carries a signature
                        // (parallel calls share it), so only that one gets
                        // the stand-in when the real one is unknown.
                        let signature =
                            self.signature_of(&call.id).or_else(|| (index == 0).then(|| SKIP_SIGNATURE.to_owned()));
                        if let Some(signature) = signature {
                            part.insert("thoughtSignature".into(), JsonValue::String(signature));
                        }
                        parts.push(JsonValue::Object(part));
                    }
                    push("model", parts);
                }
                MessageData::Tool { tool_name, result, .. } => {
                    let response = serde_json::to_value(&**result).unwrap_or_else(|error| {
                        json!({"status": "error", "error": {"message": format!("the tool result could not be encoded: {error}")}})
                    });
                    push("user", vec![json!({"functionResponse": {"name": tool_name, "response": response}})]);
                }
            }
        }
        contents.into_iter().map(|(role, parts)| json!({"role": role, "parts": parts})).collect()
    }

    async fn call(&self, request: &ModelRequest, on_event: StreamSink<'_>) -> Result<ModelResponse, ModelError> {
        // Retries cover only getting the response headers: once the stream
        // has begun, events have been reported and a retry would repeat them.
        let response = self.http.post(&self.url(), &self.body(request)).await?;
        let mut reply = Reply::default();
        self.http.read_sse(response, |event| reply.accept(self, &event, on_event)).await?;
        reply.finish()
    }
}

/// The error for a non-success status; Gemini reports a wrong key as 400
/// `API_KEY_INVALID`, which is a credentials problem too.
fn status_error(provider: &str, status: u16, body: &str) -> ModelError {
    match http::status_error(provider, status, body) {
        ModelError::Api { provider, status: 400, message } if body.contains("API_KEY_INVALID") => {
            ModelError::Unauthorized { provider, status: 400, message }
        }
        other => other,
    }
}

impl ModelProvider for GoogleProvider {
    fn complete<'a>(&'a self, request: &'a ModelRequest, on_event: StreamSink<'a>) -> Completion<'a> {
        Box::pin(async move { self.call(request, on_event).await.map_err(|error| self.http.redact(error)) })
    }

    fn name(&self) -> &str {
        PROVIDER
    }
}

/// A `{text}` part, or none for empty text (the API rejects empty parts).
fn text_part(text: &str) -> Option<JsonValue> {
    (!text.is_empty()).then(|| json!({"text": text}))
}

/// `generationConfig` from the params, and any top-level request fields
/// among the extras.
fn generation_config(params: &ModelParams) -> (JsonObject, JsonObject) {
    let mut config = JsonObject::new();
    let mut top_level = JsonObject::new();
    if let Some(temperature) = params.temperature {
        config.insert("temperature".into(), json!(temperature));
    }
    if let Some(max_tokens) = params.max_tokens {
        config.insert("maxOutputTokens".into(), json!(max_tokens));
    }
    if let Some(top_p) = params.top_p {
        config.insert("topP".into(), json!(top_p));
    }
    for (field, value) in wire::allowed_extras(PROVIDER, &params.extra, GENERATION_EXTRAS, EXTRA_ALIASES) {
        match (field, value) {
            ("safetySettings", _) => {
                top_level.insert(field.to_owned(), value.clone());
            }
            ("stopSequences", JsonValue::String(stop)) => {
                config.insert(field.to_owned(), json!([stop]));
            }
            _ => {
                config.insert(field.to_owned(), value.clone());
            }
        }
    }
    (config, top_level)
}

/// The `parameters` of a function declaration, or none when the tool takes
/// no arguments (the API rejects an object schema without properties).
fn gemini_parameters(schema: &JsonValue) -> Option<JsonValue> {
    let mut parameters = gemini_schema(schema, schema, 0);
    let object = parameters.as_object_mut()?;
    // The root must be an object schema.
    object.remove("anyOf");
    object.remove("nullable");
    object.insert("type".into(), JsonValue::String("object".into()));
    let has_properties = object.get("properties").and_then(JsonValue::as_object).is_some_and(|p| !p.is_empty());
    has_properties.then_some(parameters)
}

/// How deep `$ref`s are followed before a recursive schema is cut off.
const MAX_REF_DEPTH: usize = 8;

/// Rewrites a JSON Schema into the OpenAPI 3.0 subset Gemini's `Schema`
/// accepts (<https://ai.google.dev/api/caching#Schema>); unknown fields are
/// a 400 error there:
///
/// - kept: `type`, `format` (only those Gemini knows for the type),
///   `title`, `description`, `nullable`, `enum` (strings only), `properties`,
///   `required` (only names among the properties), `items`, `anyOf`,
///   `minItems`/`maxItems`, `minimum`/`maximum`, `minLength`/`maxLength`,
///   `pattern`, `minProperties`/`maxProperties`, `propertyOrdering`, `example`;
/// - dropped: everything else, notably `additionalProperties`, `$schema`,
///   `$id`, `$defs`, `default` (documentation only in JSON Schema),
///   `examples`, `exclusiveMinimum`/`exclusiveMaximum`, `multipleOf`,
///   `not`, `if`/`then`/`else`;
/// - `type: [..]` lists: `"null"` becomes `nullable: true`; one other type
///   stays `type`, several become `anyOf: [{type}, …]`;
/// - `oneOf` becomes `anyOf`; `{type: "null"}` members become `nullable`,
///   and a single remaining member is merged into the schema;
/// - `allOf` members are merged into the schema (properties and `required`
///   united);
/// - `const` becomes a one-value `enum`; a non-string `enum` (which Gemini
///   cannot express) is dropped and its values are listed in the
///   description instead;
/// - local `$ref`s (`#/$defs/…`, `#/definitions/…`, any `#/` pointer) are
///   inlined, recursion cut off at depth 8 as `{type: object}`;
/// - tuple `items` (a list) become `items: {anyOf: […]}`.
fn gemini_schema(schema: &JsonValue, root: &JsonValue, depth: usize) -> JsonValue {
    let JsonValue::Object(source) = schema else {
        // `true` (anything) or a malformed schema: no constraint.
        return json!({});
    };
    if let Some(reference) = source.get("$ref").and_then(JsonValue::as_str) {
        let target = reference.strip_prefix('#').and_then(|pointer| root.pointer(pointer));
        let mut resolved = match target {
            Some(target) if depth < MAX_REF_DEPTH => gemini_schema(target, root, depth + 1),
            _ => json!({"type": "object"}),
        };
        // Siblings of `$ref` (usually a description) refine the target.
        let mut siblings = source.clone();
        siblings.remove("$ref");
        if let (Some(resolved), JsonValue::Object(extra)) =
            (resolved.as_object_mut(), gemini_schema(&JsonValue::Object(siblings), root, depth))
        {
            for (key, value) in extra {
                resolved.insert(key, value);
            }
        }
        return resolved;
    }

    let mut out = JsonObject::new();
    for key in [
        "title",
        "description",
        "nullable",
        "minItems",
        "maxItems",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
        "minProperties",
        "maxProperties",
        "propertyOrdering",
        "example",
    ] {
        if let Some(value) = source.get(key) {
            out.insert(key.into(), value.clone());
        }
    }

    match source.get("type") {
        Some(JsonValue::String(kind)) if kind == "null" => {
            out.insert("nullable".into(), JsonValue::Bool(true));
        }
        Some(JsonValue::String(kind)) => {
            out.insert("type".into(), JsonValue::String(kind.clone()));
        }
        Some(JsonValue::Array(kinds)) => {
            let named: Vec<&str> = kinds.iter().filter_map(JsonValue::as_str).collect();
            if named.contains(&"null") {
                out.insert("nullable".into(), JsonValue::Bool(true));
            }
            let others: Vec<&str> = named.into_iter().filter(|kind| *kind != "null").collect();
            match others.as_slice() {
                [] => {}
                [single] => {
                    out.insert("type".into(), JsonValue::String((*single).to_owned()));
                }
                several => {
                    out.insert("anyOf".into(), several.iter().map(|kind| json!({"type": kind})).collect());
                }
            }
        }
        _ => {}
    }

    if let Some(JsonValue::String(format)) = source.get("format") {
        let allowed = match out.get("type").and_then(JsonValue::as_str) {
            Some("string") => matches!(format.as_str(), "enum" | "date-time"),
            Some("integer") => matches!(format.as_str(), "int32" | "int64"),
            Some("number") => matches!(format.as_str(), "float" | "double"),
            _ => false,
        };
        if allowed {
            out.insert("format".into(), JsonValue::String(format.clone()));
        }
    }

    let values = match (source.get("enum"), source.get("const")) {
        (Some(JsonValue::Array(values)), _) => Some(values.clone()),
        (None, Some(value)) => Some(vec![value.clone()]),
        _ => None,
    };
    if let Some(values) = values {
        if values.iter().any(JsonValue::is_null) {
            out.insert("nullable".into(), JsonValue::Bool(true));
        }
        let values: Vec<JsonValue> = values.into_iter().filter(|v| !v.is_null()).collect();
        if values.iter().all(JsonValue::is_string) {
            if !values.is_empty() {
                out.insert("enum".into(), JsonValue::Array(values));
                // Gemini knows enums only as strings.
                out.insert("type".into(), JsonValue::String("string".into()));
            }
        } else {
            let listed: Vec<String> = values.iter().map(JsonValue::to_string).collect();
            let note = format!("Allowed values: {}.", listed.join(", "));
            let description = match out.get("description").and_then(JsonValue::as_str) {
                Some(description) if !description.is_empty() => format!("{description} {note}"),
                _ => note,
            };
            out.insert("description".into(), JsonValue::String(description));
        }
    }

    if let Some(JsonValue::Object(properties)) = source.get("properties") {
        let converted: JsonObject =
            properties.iter().map(|(name, value)| (name.clone(), gemini_schema(value, root, depth))).collect();
        out.insert("properties".into(), JsonValue::Object(converted));
    }

    match source.get("items") {
        Some(JsonValue::Array(items)) => {
            let members: Vec<JsonValue> = items.iter().map(|item| gemini_schema(item, root, depth)).collect();
            let items = match <[JsonValue; 1]>::try_from(members) {
                Ok([single]) => single,
                Err(members) => json!({"anyOf": members}),
            };
            out.insert("items".into(), items);
        }
        Some(items) => {
            out.insert("items".into(), gemini_schema(items, root, depth));
        }
        None => {}
    }

    for keyword in ["anyOf", "oneOf"] {
        let Some(JsonValue::Array(members)) = source.get(keyword) else { continue };
        let mut kept = Vec::new();
        for member in members {
            if member.get("type").and_then(JsonValue::as_str) == Some("null") {
                out.insert("nullable".into(), JsonValue::Bool(true));
            } else {
                kept.push(gemini_schema(member, root, depth));
            }
        }
        match <[JsonValue; 1]>::try_from(kept) {
            Ok([single]) => merge_into(&mut out, single),
            Err(kept) if kept.is_empty() => {}
            Err(kept) => {
                let mut any_of = match out.remove("anyOf") {
                    Some(JsonValue::Array(existing)) => existing,
                    _ => Vec::new(),
                };
                any_of.extend(kept);
                out.insert("anyOf".into(), JsonValue::Array(any_of));
            }
        }
    }

    if let Some(JsonValue::Array(members)) = source.get("allOf") {
        for member in members {
            merge_into(&mut out, gemini_schema(member, root, depth));
        }
    }

    if let Some(JsonValue::Array(required)) = source.get("required") {
        let known = out.get("properties").and_then(JsonValue::as_object);
        let required: Vec<JsonValue> = required
            .iter()
            .filter(|name| name.as_str().is_some_and(|name| known.is_some_and(|known| known.contains_key(name))))
            .cloned()
            .collect();
        let mut merged = match out.remove("required") {
            Some(JsonValue::Array(existing)) => existing,
            _ => Vec::new(),
        };
        for name in required {
            if !merged.contains(&name) {
                merged.push(name);
            }
        }
        if !merged.is_empty() {
            out.insert("required".into(), JsonValue::Array(merged));
        }
    }

    JsonValue::Object(out)
}

/// Merges a converted schema into `out`: properties and `required` united,
/// other keys kept where `out` has none.
fn merge_into(out: &mut JsonObject, member: JsonValue) {
    let JsonValue::Object(member) = member else { return };
    for (key, value) in member {
        match (key.as_str(), out.get_mut(&key), value) {
            ("properties", Some(JsonValue::Object(existing)), JsonValue::Object(more)) => {
                for (name, schema) in more {
                    existing.entry(name).or_insert(schema);
                }
            }
            ("required", Some(JsonValue::Array(existing)), JsonValue::Array(more)) => {
                for name in more {
                    if !existing.contains(&name) {
                        existing.push(name);
                    }
                }
            }
            (_, Some(_), _) => {}
            (_, None, value) => {
                out.insert(key, value);
            }
        }
    }
}

/// One streamed `GenerateContentResponse`, as far as this client reads it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Chunk {
    #[serde(default)]
    candidates: Vec<Candidate>,
    #[serde(default)]
    usage_metadata: Option<UsageMetadata>,
    #[serde(default)]
    prompt_feedback: Option<PromptFeedback>,
    /// An error reported inside the stream: `{code, message, status}`.
    #[serde(default)]
    error: Option<JsonValue>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    finish_message: Option<String>,
    #[serde(default)]
    index: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct Content {
    #[serde(default)]
    parts: Vec<Part>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Part {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    thought: bool,
    #[serde(default)]
    function_call: Option<FunctionCall>,
    #[serde(default)]
    thought_signature: Option<String>,
}

#[derive(Debug, Deserialize)]
struct FunctionCall {
    name: String,
    #[serde(default)]
    args: Option<JsonValue>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsageMetadata {
    #[serde(default)]
    prompt_token_count: u64,
    #[serde(default)]
    candidates_token_count: u64,
    #[serde(default)]
    thoughts_token_count: u64,
    #[serde(default)]
    cached_content_token_count: u64,
}

impl UsageMetadata {
    /// The counts as [`TokenUsage`] has them: the cached content is a part
    /// of `promptTokenCount`; thoughts are generated (and billed as output)
    /// but counted apart from `candidatesTokenCount`.
    fn normalised(&self) -> TokenUsage {
        TokenUsage {
            input_tokens: self.prompt_token_count,
            output_tokens: self.candidates_token_count.saturating_add(self.thoughts_token_count),
            cache_read_tokens: self.cached_content_token_count,
            // Explicit caches are made by a separate API call, not by a generation.
            cache_write_tokens: 0,
            reasoning_tokens: self.thoughts_token_count,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptFeedback {
    #[serde(default)]
    block_reason: Option<String>,
}

/// The reply as it accumulates from the stream.
#[derive(Debug, Default)]
struct Reply {
    text: String,
    calls: Vec<RawToolCall>,
    finish: Option<String>,
    usage: TokenUsage,
    blocked: Option<String>,
    chunks: usize,
}

impl Reply {
    fn accept(
        &mut self,
        provider: &GoogleProvider,
        event: &SseEvent,
        on_event: StreamSink<'_>,
    ) -> Result<(), ModelError> {
        let data = event.data.trim();
        if data.is_empty() || data == "[DONE]" {
            return Ok(());
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|error| {
            let start = http::excerpt(data, 200);
            ModelError::protocol(
                PROVIDER,
                format!("a stream chunk is not a valid GenerateContentResponse ({error}): {start}"),
            )
        })?;
        if let Some(error) = chunk.error {
            return Err(http::stream_error(PROVIDER, &error));
        }
        self.chunks += 1;
        if let Some(usage) = chunk.usage_metadata {
            self.usage = usage.normalised();
        }
        if let Some(reason) = chunk.prompt_feedback.and_then(|feedback| feedback.block_reason) {
            self.blocked = Some(reason);
        }
        // One candidate is asked for; should there be more, the first is the reply.
        let Some(candidate) = chunk.candidates.into_iter().find(|c| c.index.unwrap_or(0) == 0) else {
            return Ok(());
        };
        for part in candidate.content.map(|content| content.parts).unwrap_or_default() {
            if let Some(call) = part.function_call {
                let id = provider.next_call_id();
                let arguments = match call.args {
                    None | Some(JsonValue::Null) => "{}".to_owned(),
                    Some(args) => args.to_string(),
                };
                if let Some(signature) = part.thought_signature {
                    provider.remember_signature(&id, signature);
                }
                on_event(StreamEvent::ToolCallStarted { id: id.clone(), name: call.name.clone() });
                self.calls.push(RawToolCall { id, name: call.name, arguments });
            } else if let Some(text) = part.text
                && !part.thought
                && !text.is_empty()
            {
                on_event(StreamEvent::TextDelta(text.clone()));
                self.text.push_str(&text);
            }
        }
        if let Some(reason) = candidate.finish_reason {
            if !matches!(reason.as_str(), "STOP" | "MAX_TOKENS") {
                let detail = candidate.finish_message.unwrap_or_default();
                tracing::warn!(target: "goondan::model", "google: the model stopped with {reason} {detail}");
            }
            self.finish = Some(reason);
        }
        Ok(())
    }

    fn finish(self) -> Result<ModelResponse, ModelError> {
        if self.chunks == 0 {
            return Err(ModelError::protocol(PROVIDER, "the stream ended before any reply arrived"));
        }
        let stop_reason = match (self.finish.as_deref(), self.calls.is_empty()) {
            (Some("STOP") | None, false) => Some(StopReason::ToolUse),
            (Some("STOP"), true) => Some(StopReason::EndTurn),
            (Some("MAX_TOKENS"), _) => Some(StopReason::MaxTokens),
            (Some(_), _) => Some(StopReason::Other),
            (None, true) => match &self.blocked {
                Some(reason) => {
                    tracing::warn!(target: "goondan::model", "google: the prompt was blocked ({reason})");
                    Some(StopReason::Other)
                }
                None => {
                    tracing::warn!(target: "goondan::model", "google: the stream ended without a finish reason");
                    None
                }
            },
        };
        Ok(ModelResponse {
            text: (!self.text.is_empty()).then_some(self.text),
            tool_calls: self.calls,
            stop_reason,
            usage: self.usage,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use axum::http::Method;
    use goondan_core::{ToolCall, ToolError, ToolResult};

    use crate::config::{ProviderKind, Secret};
    use crate::test_support::{Canned, MockServer, complete, fast_retries, object, stalled_server};
    use crate::types::ToolDefinition;

    const KEY: &str = "AIzaSy-test-key-0123456789";
    const MODEL: &str = "gemini-2.5-flash";

    /// A mock Gemini API answering `replies` (status, body: an event stream
    /// for a success, else JSON) in order, the last one again once they run
    /// out; returns the server and the endpoint (base URL) to give the provider.
    async fn serve(replies: Vec<(u16, String)>) -> (MockServer, String) {
        let replies = replies
            .into_iter()
            .map(|(status, body)| if status == 200 { Canned::sse(body) } else { Canned::json(status, body) })
            .collect();
        let server = MockServer::start(replies).await;
        let endpoint = server.url("/v1beta");
        (server, endpoint)
    }

    fn settings(endpoint: &str) -> ModelSettings {
        ModelSettings {
            kind: ProviderKind::Google,
            model: MODEL.into(),
            endpoint: endpoint.into(),
            api_key: Some(Secret::new(KEY)),
            options: JsonObject::new(),
            bundle_root: ".".into(),
        }
    }

    fn provider(endpoint: &str) -> GoogleProvider {
        let provider = GoogleProvider::new(&settings(endpoint)).unwrap_or_else(|e| panic!("{e}"));
        // Fast retries for the tests; production uses RetryPolicy::default().
        provider.with_retry_policy(fast_retries())
    }

    /// An SSE body as Gemini frames it (`data: …` and a blank line, CRLF).
    fn sse(chunks: &[&str]) -> String {
        chunks.iter().map(|chunk| format!("data: {chunk}\r\n\r\n")).collect()
    }

    fn user(text: &str) -> ModelRequest {
        ModelRequest { messages: vec![MessageData::User { content: text.into() }], ..ModelRequest::default() }
    }

    // Payloads shaped as in https://ai.google.dev/api/generate-content#v1beta.GenerateContentResponse
    // and the REST streaming samples (`alt=sse`).
    const TEXT_1: &str = r#"{"candidates": [{"content": {"parts": [{"text": "I found "}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 120,"totalTokenCount": 120,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 120}]},"modelVersion": "gemini-2.5-flash","responseId": "mP5laK3vLvWEvdIPxMTj8QQ"}"#;
    const TEXT_2: &str = r#"{"candidates": [{"content": {"parts": [{"text": "two files"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 120,"totalTokenCount": 120,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 120}]},"modelVersion": "gemini-2.5-flash","responseId": "mP5laK3vLvWEvdIPxMTj8QQ"}"#;
    const TEXT_3: &str = r#"{"candidates": [{"content": {"parts": [{"text": "; reading both."}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 120,"totalTokenCount": 120,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 120}]},"modelVersion": "gemini-2.5-flash","responseId": "mP5laK3vLvWEvdIPxMTj8QQ"}"#;
    const PARALLEL_CALLS: &str = r#"{"candidates": [{"content": {"parts": [{"functionCall": {"name": "fs__read","args": {"path": "README.md"}},"thoughtSignature": "CiQBVKhc7hQ2wX0rF3tG8hS1ZmNvZGVzaWduYXR1cmU="},{"functionCall": {"name": "fs__read","args": {"path": "docs/guide.md","lines": {"from": 1,"to": 40}}}}],"role": "model"},"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 120,"candidatesTokenCount": 30,"totalTokenCount": 190,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 120}],"thoughtsTokenCount": 40},"modelVersion": "gemini-2.5-flash","responseId": "mP5laK3vLvWEvdIPxMTj8QQ"}"#;

    /// Gemini frames events with CRLF; the same stream with bare `\r` line
    /// ends (which the SSE format allows) reads the same.
    /// A cached, thinking Gemini 2.5 reply's `usageMetadata` (the shape
    /// the API returns with an explicit cache).
    #[test]
    fn usage_metadata_maps_cached_content_and_thoughts() {
        let metadata = r#"{"promptTokenCount": 2152, "candidatesTokenCount": 12, "totalTokenCount": 2606,
            "cachedContentTokenCount": 2048, "thoughtsTokenCount": 442,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 2152}],
            "cacheTokensDetails": [{"modality": "TEXT", "tokenCount": 2048}]}"#;
        let metadata: UsageMetadata = serde_json::from_str(metadata).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            metadata.normalised(),
            TokenUsage {
                input_tokens: 2152,
                output_tokens: 454,
                cache_read_tokens: 2048,
                cache_write_tokens: 0,
                reasoning_tokens: 442
            }
        );
        assert_eq!(metadata.normalised().total(), 2606, "the API's own total");
    }

    #[tokio::test]
    async fn a_stream_whose_lines_end_with_a_bare_cr_reads_as_with_crlf() {
        let stream = sse(&[TEXT_1, TEXT_2, TEXT_3, PARALLEL_CALLS]);
        let bare_cr = stream.replace("\r\n", "\r");
        let (_mock, endpoint) = serve(vec![(200, stream), (200, bare_cr)]).await;
        let provider = provider(&endpoint);
        // Gemini sends no call ids; ours are random, so they are left out of the comparison.
        let without_ids = |(result, events): (Result<ModelResponse, ModelError>, Vec<StreamEvent>)| {
            let result = result.map(|mut response| {
                response.tool_calls.iter_mut().for_each(|call| call.id.clear());
                response
            });
            let events: Vec<StreamEvent> = events
                .into_iter()
                .map(|event| match event {
                    StreamEvent::ToolCallStarted { name, .. } => {
                        StreamEvent::ToolCallStarted { id: String::new(), name }
                    }
                    other => other,
                })
                .collect();
            (result, events)
        };
        let expected = without_ids(complete(&provider, &user("Read my notes.")).await);
        assert!(expected.0.as_ref().is_ok_and(|r| r.tool_calls.len() == 2), "{:?}", expected.0);
        assert_eq!(without_ids(complete(&provider, &user("Read my notes.")).await), expected);
    }

    #[tokio::test]
    async fn streams_text_and_parallel_tool_calls_and_sends_the_whole_conversation() {
        let (mock, endpoint) = serve(vec![(200, sse(&[TEXT_1, TEXT_2, TEXT_3, PARALLEL_CALLS]))]).await;
        let provider = provider(&endpoint);
        let failed = ToolResult::error(
            ToolError::new("E_NOT_FOUND", "NotFoundError", "no such file: NOTES.md")
                .with_suggestion("list the directory first")
                .with_help_url("https://docs.goondan.ai/errors/E_NOT_FOUND"),
        );
        let request = ModelRequest {
            system: Some("You are a careful assistant.".into()),
            messages: vec![
                MessageData::System { content: "Answer in English.".into() },
                MessageData::User { content: "Read my notes.".into() },
                MessageData::Assistant {
                    content: Some("Let me look.".into()),
                    tool_calls: vec![
                        ToolCall::new("call_a", "bash__exec", object(json!({"command": "ls"}))),
                        ToolCall::new("call_b", "fs__read", object(json!({"path": "NOTES.md"}))),
                    ],
                },
                MessageData::Tool {
                    tool_call_id: "call_a".into(),
                    tool_name: "bash__exec".into(),
                    result: Box::new(ToolResult::ok(json!({"stdout": "README.md\ndocs\n", "exitCode": 0}))),
                },
                MessageData::Tool {
                    tool_call_id: "call_b".into(),
                    tool_name: "fs__read".into(),
                    result: Box::new(failed),
                },
                MessageData::User { content: "Then read what exists.".into() },
            ],
            tools: vec![
                ToolDefinition {
                    name: "fs__read".into(),
                    description: Some("Reads a file.".into()),
                    parameters: json!({
                        "$schema": "http://json-schema.org/draft-07/schema#",
                        "type": "object",
                        "additionalProperties": false,
                        "properties": {
                            "path": {"type": "string", "description": "Relative path.", "format": "uri-reference"},
                            "encoding": {"type": ["string", "null"], "default": "utf-8", "enum": ["utf-8", "latin1", null]},
                            "lines": {"$ref": "#/$defs/Range", "description": "Which lines."}
                        },
                        "required": ["path", "ghost"],
                        "$defs": {"Range": {"type": "object", "additionalProperties": false,
                            "properties": {"from": {"type": "integer", "minimum": 1}, "to": {"type": "integer", "exclusiveMinimum": 0}}}}
                    }),
                },
                ToolDefinition { name: "clock__now".into(), description: None, parameters: json!({"type": "object"}) },
            ],
            params: ModelParams {
                temperature: Some(0.25),
                max_tokens: Some(1024),
                top_p: Some(0.5),
                extra: object(json!({"topK": 40, "stop": "END", "logitBias": {"1": 2}})),
            },
        };

        let (result, events) = complete(&provider, &request).await;
        let response = result.unwrap_or_else(|e| panic!("{e}"));

        // The reply.
        assert_eq!(response.text.as_deref(), Some("I found two files; reading both."));
        assert_eq!(response.stop_reason, Some(StopReason::ToolUse));
        assert_eq!(
            response.usage,
            TokenUsage {
                input_tokens: 120,
                output_tokens: 70,
                // thoughtsTokenCount: a part of the output.
                reasoning_tokens: 40,
                ..TokenUsage::default()
            }
        );
        let calls = &response.tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!((calls[0].name.as_str(), calls[0].arguments.as_str()), ("fs__read", r#"{"path":"README.md"}"#));
        // Key order depends on serde_json's `preserve_order`; compare the values.
        let second: JsonValue = serde_json::from_str(&calls[1].arguments).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (calls[1].name.as_str(), second),
            ("fs__read", json!({"path": "docs/guide.md", "lines": {"from": 1, "to": 40}}))
        );
        assert!(!calls[1].arguments.contains(' '), "compact JSON text expected");
        assert!(calls.iter().all(|call| call.id.starts_with("call_") && call.id.len() == 21));
        assert_ne!(calls[0].id, calls[1].id);

        // The events, in order.
        let mut expected: Vec<StreamEvent> =
            ["I found ", "two files", "; reading both."].map(|t| StreamEvent::TextDelta(t.into())).into();
        expected.extend(calls.iter().map(|c| StreamEvent::ToolCallStarted { id: c.id.clone(), name: c.name.clone() }));
        assert_eq!(events, expected);

        // The request.
        let requests = mock.requests();
        assert_eq!(requests.len(), 1);
        let sent = &requests[0];
        assert_eq!(sent.method, Method::POST);
        assert_eq!(sent.path(), "/v1beta/models/gemini-2.5-flash:streamGenerateContent");
        assert_eq!(sent.uri.query(), Some("alt=sse"));
        assert!(!sent.uri.to_string().contains(KEY));
        assert_eq!(sent.header("x-goog-api-key"), KEY);
        assert_eq!(sent.header("content-type"), "application/json");
        assert!(sent.headers.get("authorization").is_none());
        let body = sent.json();
        assert_eq!(
            body["systemInstruction"],
            json!({"parts": [{"text": "You are a careful assistant."}, {"text": "Answer in English."}]})
        );
        assert_eq!(
            body["contents"],
            json!([
                {"role": "user", "parts": [{"text": "Read my notes."}]},
                {"role": "model", "parts": [
                    {"text": "Let me look."},
                    {"functionCall": {"name": "bash__exec", "args": {"command": "ls"}}, "thoughtSignature": SKIP_SIGNATURE},
                    {"functionCall": {"name": "fs__read", "args": {"path": "NOTES.md"}}}
                ]},
                {"role": "user", "parts": [
                    {"functionResponse": {"name": "bash__exec",
                        "response": {"status": "ok", "output": {"stdout": "README.md\ndocs\n", "exitCode": 0}}}},
                    {"functionResponse": {"name": "fs__read", "response": {"status": "error", "error": {
                        "message": "no such file: NOTES.md", "name": "NotFoundError", "code": "E_NOT_FOUND",
                        "suggestion": "list the directory first",
                        "helpUrl": "https://docs.goondan.ai/errors/E_NOT_FOUND"}}}},
                    {"text": "Then read what exists."}
                ]}
            ])
        );
        assert_eq!(
            body["tools"],
            json!([{"functionDeclarations": [
                {"name": "fs__read", "description": "Reads a file.", "parameters": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "Relative path."},
                        "encoding": {"type": "string", "nullable": true, "enum": ["utf-8", "latin1"]},
                        "lines": {"type": "object", "description": "Which lines.", "properties": {
                            "from": {"type": "integer", "minimum": 1}, "to": {"type": "integer"}}}
                    },
                    "required": ["path"]
                }},
                {"name": "clock__now"}
            ]}])
        );
        assert_eq!(
            body["generationConfig"],
            json!({"temperature": 0.25, "maxOutputTokens": 1024, "topP": 0.5, "topK": 40, "stopSequences": ["END"]})
        );
        let keys: Vec<&String> = body.as_object().map(|o| o.keys().collect()).unwrap_or_default();
        assert_eq!(keys.len(), 4, "unexpected top-level fields: {keys:?}");
    }

    #[tokio::test]
    async fn calls_in_separate_chunks_and_thought_signatures_round_trip() {
        let first_call = r#"{"candidates": [{"content": {"parts": [{"functionCall": {"name": "bash__exec","args": {"command": "date"}},"thoughtSignature": "c2lnbmF0dXJlLW9uZQ=="}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 30,"totalTokenCount": 30},"modelVersion": "gemini-3-pro-preview"}"#;
        let second_call = r#"{"candidates": [{"content": {"parts": [{"functionCall": {"name": "clock__now"}}],"role": "model"},"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 30,"candidatesTokenCount": 12,"totalTokenCount": 42},"modelVersion": "gemini-3-pro-preview"}"#;
        let answer = r#"{"candidates": [{"content": {"parts": [{"text": "It is noon."}],"role": "model"},"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 60,"candidatesTokenCount": 4,"totalTokenCount": 64},"modelVersion": "gemini-3-pro-preview"}"#;
        let (mock, endpoint) = serve(vec![(200, sse(&[first_call, second_call])), (200, sse(&[answer]))]).await;
        let provider = provider(&endpoint);

        let mut request = user("What time is it?");
        let (first, events) = complete(&provider, &request).await;
        let first = first.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(first.text, None);
        assert_eq!(first.stop_reason, Some(StopReason::ToolUse));
        assert_eq!(first.usage, TokenUsage { input_tokens: 30, output_tokens: 12, ..TokenUsage::default() });
        let arguments: Vec<&str> = first.tool_calls.iter().map(|c| c.arguments.as_str()).collect();
        assert_eq!(arguments, [r#"{"command":"date"}"#, "{}"]);
        assert_eq!(events.len(), 2);

        // The turn loop sends the calls back with their results.
        let tool_calls: Vec<ToolCall> = first
            .tool_calls
            .iter()
            .map(|c| {
                let parsed: JsonObject = serde_json::from_str(&c.arguments).unwrap_or_default();
                ToolCall::new(c.id.as_str(), c.name.as_str(), parsed)
            })
            .collect();
        request.messages.push(MessageData::Assistant { content: None, tool_calls });
        for call in &first.tool_calls {
            request.messages.push(MessageData::Tool {
                tool_call_id: call.id.clone(),
                tool_name: call.name.clone(),
                result: Box::new(ToolResult::ok(json!("12:00"))),
            });
        }
        let (second, _) = complete(&provider, &request).await;
        let second = second.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(second.text.as_deref(), Some("It is noon."));
        assert_eq!(second.stop_reason, Some(StopReason::EndTurn));
        assert!(second.tool_calls.is_empty());

        let requests = mock.requests();
        assert_eq!(requests.len(), 2);
        assert!(requests[0].json().get("systemInstruction").is_none());
        assert!(requests[0].json().get("tools").is_none());
        assert_eq!(
            requests[1].json()["contents"][1],
            json!({"role": "model", "parts": [
                {"functionCall": {"name": "bash__exec", "args": {"command": "date"}}, "thoughtSignature": "c2lnbmF0dXJlLW9uZQ=="},
                {"functionCall": {"name": "clock__now", "args": {}}}
            ]})
        );
    }

    #[tokio::test]
    async fn refused_keys_are_unauthorized_with_the_apis_message_and_no_key() {
        let unauthenticated = r#"{"error": {"code": 401, "message": "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.", "status": "UNAUTHENTICATED"}}"#;
        let (mock, endpoint) = serve(vec![(401, unauthenticated.into())]).await;
        let (result, events) = complete(&provider(&endpoint), &user("hi")).await;
        let Err(error) = result else { panic!("expected an error") };
        assert!(
            matches!(&error, ModelError::Unauthorized { status: 401, message, .. } if message.starts_with("Request had invalid authentication credentials.")),
            "{error:?}"
        );
        assert!(!error.to_string().contains(KEY) && !format!("{error:?}").contains(KEY));
        assert!(events.is_empty());
        assert_eq!(mock.requests().len(), 1, "401 is not retried");

        // Gemini answers a wrong key with 400 API_KEY_INVALID.
        let invalid = r#"{"error": {"code": 400, "message": "API key not valid. Please pass a valid API key.", "status": "INVALID_ARGUMENT", "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID", "domain": "googleapis.com", "metadata": {"service": "generativelanguage.googleapis.com"}}]}}"#;
        let (mock, endpoint) = serve(vec![(400, invalid.into())]).await;
        let (result, _) = complete(&provider(&endpoint), &user("hi")).await;
        assert!(
            matches!(&result, Err(ModelError::Unauthorized { status: 400, message, .. }) if message == "API key not valid. Please pass a valid API key."),
            "{result:?}"
        );
        assert_eq!(mock.requests().len(), 1);

        // An ordinary 400 stays an API error.
        let bad = r#"{"error": {"code": 400, "message": "* GenerateContentRequest.contents: contents is not specified\n", "status": "INVALID_ARGUMENT"}}"#;
        let (_, endpoint) = serve(vec![(400, bad.into())]).await;
        let (result, _) = complete(&provider(&endpoint), &user("hi")).await;
        assert!(
            matches!(&result, Err(ModelError::Api { status: 400, message, .. }) if message.contains("contents is not specified"))
        );
    }

    #[tokio::test]
    async fn rate_limits_and_server_errors_are_retried_before_the_stream() {
        let exhausted = r#"{"error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).", "status": "RESOURCE_EXHAUSTED"}}"#;
        let ok = sse(&[
            r#"{"candidates": [{"content": {"parts": [{"text": "Hello!"}],"role": "model"},"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 2,"candidatesTokenCount": 2,"totalTokenCount": 4}}"#,
        ]);
        let (mock, endpoint) = serve(vec![(429, exhausted.into()), (200, ok.clone())]).await;
        let (result, _) = complete(&provider(&endpoint), &user("hi")).await;
        assert_eq!(result.map(|r| r.text), Ok(Some("Hello!".into())));
        assert_eq!(mock.requests().len(), 2);

        let internal = r#"{"error": {"code": 500, "message": "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting", "status": "INTERNAL"}}"#;
        let replies =
            vec![(500, internal.to_owned()), (500, internal.to_owned()), (500, internal.to_owned()), (200, ok)];
        let (mock, endpoint) = serve(replies).await;
        let (result, events) = complete(&provider(&endpoint), &user("hi")).await;
        assert_eq!(result.map(|r| r.stop_reason), Ok(Some(StopReason::EndTurn)));
        assert_eq!(events, [StreamEvent::TextDelta("Hello!".into())]);
        assert_eq!(mock.requests().len(), 4);

        // Attempts are bounded.
        let overloaded = r#"{"error": {"code": 503, "message": "The model is overloaded. Please try again later.", "status": "UNAVAILABLE"}}"#;
        let (mock, endpoint) = serve(vec![(503, overloaded.into())]).await;
        let (result, _) = complete(&provider(&endpoint), &user("hi")).await;
        assert!(matches!(&result, Err(ModelError::Api { status: 503, message, .. }) if message.contains("overloaded")));
        assert_eq!(mock.requests().len(), 4);
    }

    #[tokio::test]
    async fn an_error_inside_the_stream_fails_the_call_without_a_retry() {
        let body = sse(&[
            TEXT_1,
            r#"{"error": {"code": 503, "message": "The model is overloaded. Please try again later.", "status": "UNAVAILABLE"}}"#,
        ]);
        let (mock, endpoint) = serve(vec![(200, body)]).await;
        let (result, events) = complete(&provider(&endpoint), &user("hi")).await;
        assert!(
            matches!(&result, Err(ModelError::Api { status: 503, message, .. }) if message == "The model is overloaded. Please try again later."),
            "{result:?}"
        );
        assert_eq!(events, [StreamEvent::TextDelta("I found ".into())]);
        assert_eq!(mock.requests().len(), 1);
    }

    /// The wait for the headers and for an error body was unbounded here: a
    /// server that accepted the request and never answered hung the call.
    #[tokio::test]
    async fn a_server_that_never_answers_times_out_and_is_retried() {
        let never = Canned::json(503, "{}").after(Duration::from_secs(5));
        let server = MockServer::start(vec![never]).await;
        let mut settings = settings(&server.url("/v1beta"));
        settings.options.insert("idleTimeoutSeconds".into(), json!(0.1));
        let provider =
            GoogleProvider::new(&settings).unwrap_or_else(|e| panic!("{e}")).with_retry_policy(fast_retries());
        let (result, _) = complete(&provider, &user("hi")).await;
        assert!(
            matches!(&result, Err(ModelError::Network { message, .. }) if message.contains("no response within 0.1 s")),
            "{result:?}"
        );
        assert_eq!(server.requests().len(), 4);
    }

    /// Input that arrived while a call ran comes before its result in the
    /// history; the result still opens the merged user content, as it does
    /// for Anthropic.
    #[tokio::test]
    async fn function_responses_lead_a_merged_user_content() {
        let (mock, endpoint) = serve(vec![(200, sse(&[TEXT_1]))]).await;
        let request = ModelRequest {
            messages: vec![
                MessageData::User { content: "What time is it?".into() },
                MessageData::Assistant {
                    content: None,
                    tool_calls: vec![ToolCall::new("call_x", "clock__now", JsonObject::new())],
                },
                MessageData::User { content: "And the date?".into() },
                MessageData::Tool {
                    tool_call_id: "call_x".into(),
                    tool_name: "clock__now".into(),
                    result: Box::new(ToolResult::ok(json!("12:00"))),
                },
            ],
            ..ModelRequest::default()
        };
        let (result, _) = complete(&provider(&endpoint), &request).await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(
            mock.requests()[0].json()["contents"][2],
            json!({"role": "user", "parts": [
                {"functionResponse": {"name": "clock__now", "response": {"status": "ok", "output": "12:00"}}},
                {"text": "And the date?"}
            ]})
        );
    }

    #[tokio::test]
    async fn malformed_chunks_are_protocol_errors() {
        let truncated = r#"{"candidates": [{"content": {"parts": [{"text": "Hi"#;
        let (_, endpoint) = serve(vec![(200, sse(&[TEXT_1, truncated]))]).await;
        let (result, _) = complete(&provider(&endpoint), &user("hi")).await;
        assert!(
            matches!(&result, Err(ModelError::Protocol { message, .. }) if message.contains("not a valid GenerateContentResponse")),
            "{result:?}"
        );

        let wrong_shape = r#"{"candidates": [{"content": {"parts": [{"text": 42}]}}]}"#;
        let (_, endpoint) = serve(vec![(200, sse(&[wrong_shape]))]).await;
        let (result, _) = complete(&provider(&endpoint), &user("hi")).await;
        assert!(matches!(result, Err(ModelError::Protocol { .. })), "{result:?}");

        let (_, endpoint) = serve(vec![(200, String::new())]).await;
        let (result, _) = complete(&provider(&endpoint), &user("hi")).await;
        assert!(matches!(&result, Err(ModelError::Protocol { message, .. }) if message.contains("before any reply")));
    }

    #[tokio::test]
    async fn finish_reasons_map_to_stop_reasons() {
        let cases = [
            (
                r#"{"candidates": [{"content": {"parts": [{"text": "Once upon a"}],"role": "model"},"finishReason": "MAX_TOKENS","index": 0}],"usageMetadata": {"promptTokenCount": 5,"candidatesTokenCount": 3,"totalTokenCount": 8}}"#,
                Some(StopReason::MaxTokens),
                Some("Once upon a"),
            ),
            (
                r#"{"candidates": [{"content": {"parts": [{"text": "I can't", "thought": false},{"text": "(thinking)", "thought": true}],"role": "model"},"finishReason": "SAFETY","index": 0,"safetyRatings": [{"category": "HARM_CATEGORY_DANGEROUS_CONTENT","probability": "HIGH","blocked": true}]}]}"#,
                Some(StopReason::Other),
                Some("I can't"),
            ),
            (
                r#"{"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},"usageMetadata": {"promptTokenCount": 9,"totalTokenCount": 9}}"#,
                Some(StopReason::Other),
                None,
            ),
            (
                r#"{"candidates": [{"finishReason": "MALFORMED_FUNCTION_CALL","finishMessage": "Malformed function call: print(x","index": 0}]}"#,
                Some(StopReason::Other),
                None,
            ),
        ];
        for (chunk, stop, text) in cases {
            let (_, endpoint) = serve(vec![(200, sse(&[chunk]))]).await;
            let (result, _) = complete(&provider(&endpoint), &user("hi")).await;
            let response = result.unwrap_or_else(|e| panic!("{e}"));
            assert_eq!((response.stop_reason, response.text.as_deref()), (stop, text), "{chunk}");
        }
    }

    #[tokio::test]
    async fn a_stalled_stream_times_out() {
        // Headers and half an event, then silence.
        let endpoint = stalled_server("data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hel").await;
        let mut settings = settings(&format!("{endpoint}/v1beta"));
        settings.options.insert("idleTimeoutSeconds".into(), json!(0.2));
        let provider = GoogleProvider::new(&settings).unwrap_or_else(|e| panic!("{e}"));
        let (result, events) = complete(&provider, &user("hi")).await;
        assert!(
            matches!(&result, Err(ModelError::Protocol { message, .. }) if message.contains("while streaming")),
            "{result:?}"
        );
        assert!(events.is_empty());
    }

    #[test]
    fn the_key_stays_out_of_debug_output_and_a_missing_key_is_named() {
        let provider = GoogleProvider::new(&settings("http://127.0.0.1:9/v1beta")).unwrap_or_else(|e| panic!("{e}"));
        let debug = format!("{provider:?}");
        assert!(!debug.contains(KEY) && debug.contains(MODEL), "{debug}");
        assert_eq!(provider.name(), "google");
        assert_eq!(provider.url(), "http://127.0.0.1:9/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse");

        let mut prefixed = settings("http://127.0.0.1:9/v1beta");
        prefixed.model = "models/gemini-2.5-pro".into();
        let url = GoogleProvider::new(&prefixed).map(|p| p.url());
        assert_eq!(
            url.ok().as_deref(),
            Some("http://127.0.0.1:9/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse")
        );

        let mut keyless = settings("http://127.0.0.1:9/v1beta");
        keyless.api_key = None;
        let error = GoogleProvider::new(&keyless).err();
        assert!(error.is_some_and(|e| e.to_string().contains("GOOGLE_GENERATIVE_AI_API_KEY")));

        let mut bad = settings("http://127.0.0.1:9/v1beta");
        bad.options.insert("idleTimeoutSeconds".into(), json!("soon"));
        assert!(matches!(GoogleProvider::new(&bad), Err(ModelError::Config(_))));
        // The old spelling is refused rather than silently ignored.
        let mut old = settings("http://127.0.0.1:9/v1beta");
        old.options.insert("idleTimeoutSecs".into(), json!(30));
        assert!(matches!(GoogleProvider::new(&old), Err(ModelError::Config(m)) if m.contains("idleTimeoutSeconds")));

        let redacted = provider.http.redact(ModelError::Api {
            provider: PROVIDER.into(),
            status: 400,
            message: format!("bad key {KEY}"),
        });
        assert!(!redacted.to_string().contains(KEY));
    }

    #[test]
    fn schemas_are_rewritten_into_geminis_subset() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "mode": {"oneOf": [{"type": "string", "enum": ["fast", "slow"]}, {"type": "null"}], "default": "fast"},
                "value": {"type": ["string", "number"], "description": "A value."},
                "level": {"type": "integer", "enum": [1, 2, 3], "description": "How loud."},
                "kind": {"const": "file"},
                "when": {"type": "string", "format": "date-time"},
                "tags": {"type": "array", "items": {"type": "string", "minLength": 1}, "uniqueItems": true, "maxItems": 5},
                "pair": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]},
                "node": {"$ref": "#/definitions/Node"},
                "both": {"allOf": [
                    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                    {"properties": {"b": {"type": "boolean"}}, "required": ["b"], "additionalProperties": false}
                ]},
                "anything": true,
                "meta": {"type": "object", "additionalProperties": {"type": "string"}}
            },
            "definitions": {"Node": {"type": "object", "properties": {"child": {"$ref": "#/definitions/Node"}}}}
        });
        let Some(converted) = gemini_parameters(&schema) else { panic!("parameters expected") };
        let properties = &converted["properties"];
        assert_eq!(properties["mode"], json!({"type": "string", "enum": ["fast", "slow"], "nullable": true}));
        assert_eq!(
            properties["value"],
            json!({"description": "A value.", "anyOf": [{"type": "string"}, {"type": "number"}]})
        );
        assert_eq!(
            properties["level"],
            json!({"type": "integer", "description": "How loud. Allowed values: 1, 2, 3."})
        );
        assert_eq!(properties["kind"], json!({"type": "string", "enum": ["file"]}));
        assert_eq!(properties["when"], json!({"type": "string", "format": "date-time"}));
        assert_eq!(
            properties["tags"],
            json!({"type": "array", "maxItems": 5, "items": {"type": "string", "minLength": 1}})
        );
        assert_eq!(
            properties["pair"],
            json!({"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}})
        );
        assert_eq!(
            properties["both"],
            json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "boolean"}}, "required": ["a", "b"]})
        );
        assert_eq!(properties["anything"], json!({}));
        assert_eq!(properties["meta"], json!({"type": "object"}));
        // Recursion is cut off, not followed forever.
        let mut node = &properties["node"];
        let mut depth = 0;
        while let Some(child) = node.get("properties").and_then(|p| p.get("child")) {
            node = child;
            depth += 1;
        }
        assert_eq!((depth, node), (MAX_REF_DEPTH, &json!({"type": "object"})));
        let text = converted.to_string();
        for dropped in [
            "$schema",
            "additionalProperties",
            "default",
            "uniqueItems",
            "definitions",
            "$ref",
            "oneOf",
            "allOf",
            "const",
        ] {
            assert!(!text.contains(dropped), "{dropped} left in {text}");
        }

        // Tools without arguments send no parameters; a typeless root becomes an object.
        assert_eq!(gemini_parameters(&json!({"type": "object", "properties": {}})), None);
        assert_eq!(gemini_parameters(&json!({})), None);
        assert_eq!(
            gemini_parameters(&json!({"properties": {"q": {"type": "string"}}})),
            Some(json!({"type": "object", "properties": {"q": {"type": "string"}}}))
        );
    }
}
