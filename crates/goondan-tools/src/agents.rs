//! The agent-to-agent contract: one typed request, one typed answer, and the
//! one place their arguments are read.
//!
//! Three callers reach the swarm's other agents: the `agents` tool (flat
//! arguments `{target, input, instanceKey?, eventType?, metadata?,
//! timeoutMs?, async?}`), `ctx.runtime` of a JavaScript tool (the original's
//! `request(target, event, options)` with `event = {type?, input?,
//! instanceKey?, metadata?}` and `options = {timeoutMs?, async?}`) and
//! `ctx.agents` of a JavaScript layer (flat, as the tool). Each shape is
//! mapped onto the same [`MessageFields`] and read by the same rules, so a
//! value is accepted or refused — with the same [`ContractError`] — whichever
//! way it came. The rules:
//!
//! - `target`: a string with more than white space, trimmed.
//! - `input`: a non-empty string (a turn on an empty input fails at most
//!   model providers).
//! - `instanceKey`, `eventType`, `cwd`: strings; trimmed, empty means absent
//!   (the caller's key, `agent.request` / `agent.send`).
//! - `metadata`: an object.
//! - `timeoutMs` (requests): a positive number of milliseconds, rounded up
//!   to a whole one; [`DEFAULT_REQUEST_TIMEOUT_MS`] when absent.
//! - `async`, `includeAll`: booleans, `false` when absent.
//!
//! `null` counts as absent everywhere. The answers are typed too
//! ([`AgentAnswer`], [`AgentSendReceipt`]): each caller shapes its output
//! from them ([`AgentAnswer::tool_output`] for the tool and `ctx.runtime`,
//! [`AgentAnswer::middleware_output`] for `ctx.agents`) instead of indexing
//! JSON.

use std::fmt;

use goondan_core::codes::E_AGENTS_INVALID_REQUEST;
use goondan_core::{JsonObject, JsonValue, json_type_name};
use serde_json::json;

use crate::context::ToolContext;
use crate::handler::ToolFailure;
use crate::pipeline::BoxFuture;

/// How long a request waits for its answer when the caller does not say.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 60_000;

/// The event type of a request when the caller names none.
pub const REQUEST_EVENT_TYPE: &str = "agent.request";

/// The event type of a fire-and-forget event when the caller names none.
pub const SEND_EVENT_TYPE: &str = "agent.send";

/// A request to another agent (`request`) or a fire-and-forget event to it
/// (`send`), its arguments checked.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentMessageRequest {
    /// The target agent's name.
    pub target: String,
    /// The text sent to it.
    pub input: String,
    /// The target instance; the caller's own key when `None`.
    pub instance_key: Option<String>,
    /// The event type: the caller's, or [`REQUEST_EVENT_TYPE`] /
    /// [`SEND_EVENT_TYPE`].
    pub event_type: Option<String>,
    /// Metadata attached to the event.
    pub metadata: JsonObject,
    /// For requests: how long to wait for the reply, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// For requests: return at once and deliver the reply before a later step.
    pub asynchronous: bool,
}

/// A request to spawn (or prepare) an agent instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSpawnRequest {
    /// The agent resource to spawn.
    pub target: String,
    /// Its instance key.
    pub instance_key: Option<String>,
    /// Its working directory.
    pub cwd: Option<String>,
}

/// What a request got back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentAnswer {
    /// The agent asked.
    pub target: String,
    /// The id of the event that carried the request.
    pub event_id: String,
    /// The id that matches the answer to the request.
    pub correlation_id: String,
    /// Whether the swarm took the request.
    pub accepted: bool,
    /// Whether the answer comes later (before a later step of the caller).
    pub asynchronous: bool,
    /// The target turn's final text; `None` while an asynchronous request is
    /// pending.
    pub response: Option<String>,
}

impl AgentAnswer {
    /// The output of the `agents` tool's `request` and of
    /// `ctx.runtime.request` (the original's `AgentRuntimeRequestResult`).
    pub fn tool_output(&self) -> JsonValue {
        json!({
            "target": self.target,
            "eventId": self.event_id,
            "correlationId": self.correlation_id,
            "accepted": self.accepted,
            "async": self.asynchronous,
            "response": self.response,
        })
    }

    /// The answer of `ctx.agents.request`: the response as text (empty while
    /// pending), as the original's middleware API gives it.
    pub fn middleware_output(&self) -> JsonValue {
        json!({
            "target": self.target,
            "response": self.response.as_deref().unwrap_or_default(),
            "correlationId": self.correlation_id,
            "accepted": self.accepted,
            "async": self.asynchronous,
        })
    }
}

/// What a fire-and-forget event got back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSendReceipt {
    /// The agent the event went to.
    pub target: String,
    /// The event's id.
    pub event_id: String,
    /// Whether the swarm took it.
    pub accepted: bool,
}

impl AgentSendReceipt {
    /// The output of the `agents` tool's `send` and of `ctx.runtime.send`.
    pub fn tool_output(&self) -> JsonValue {
        json!({"target": self.target, "eventId": self.event_id, "accepted": self.accepted})
    }

    /// The answer of `ctx.agents.send`.
    pub fn middleware_output(&self) -> JsonValue {
        json!({"accepted": self.accepted})
    }
}

/// The agent-to-agent runtime a tool can reach through [`ToolContext::runtime`].
///
/// The orchestrator implements it; the built-in `agents` tool, `ctx.runtime`
/// of JavaScript tools and `ctx.agents` of JavaScript layers use it, each
/// with arguments read by [`MessageFields`] and [`SpawnFields`].
pub trait AgentToolRuntime: Send + Sync + fmt::Debug {
    /// Sends a request and (unless asynchronous) waits for the reply.
    /// `ctx` is the calling tool's context (agent, instance, turn, trace).
    fn request<'a>(
        &'a self,
        ctx: &'a ToolContext,
        request: AgentMessageRequest,
    ) -> BoxFuture<'a, Result<AgentAnswer, ToolFailure>>;
    /// Sends a fire-and-forget event.
    fn send<'a>(
        &'a self,
        ctx: &'a ToolContext,
        request: AgentMessageRequest,
    ) -> BoxFuture<'a, Result<AgentSendReceipt, ToolFailure>>;
    /// Spawns or prepares an instance; the output of the `spawn` export.
    fn spawn<'a>(
        &'a self,
        ctx: &'a ToolContext,
        request: AgentSpawnRequest,
    ) -> BoxFuture<'a, Result<JsonValue, ToolFailure>>;
    /// Lists spawned instances; the output of the `list` export.
    fn list<'a>(&'a self, ctx: &'a ToolContext, include_all: bool) -> BoxFuture<'a, Result<JsonValue, ToolFailure>>;
    /// Describes the swarm's agents; the output of the `catalog` export.
    fn catalog<'a>(&'a self, ctx: &'a ToolContext) -> BoxFuture<'a, Result<JsonValue, ToolFailure>>;
}

/// Arguments that break the contract. Its message names the field by its
/// flat name (`'timeoutMs' …`), whichever shape the caller used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ContractError {
    /// What was wrong.
    pub message: String,
    /// What to do instead.
    pub suggestion: Option<String>,
}

impl ContractError {
    fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), suggestion: None }
    }

    fn suggest(mut self, suggestion: impl Into<String>) -> Self {
        self.suggestion = Some(suggestion.into());
        self
    }

    /// The error's code, [`E_AGENTS_INVALID_REQUEST`].
    pub fn code(&self) -> &'static str {
        E_AGENTS_INVALID_REQUEST
    }
}

impl From<ContractError> for ToolFailure {
    fn from(error: ContractError) -> Self {
        let failure = ToolFailure::with_code(error.message, E_AGENTS_INVALID_REQUEST);
        match error.suggestion {
            Some(suggestion) => failure.suggest(suggestion),
            None => failure,
        }
    }
}

/// The fields of a request or an event, as the caller sent them.
#[derive(Debug, Clone, Copy, Default)]
pub struct MessageFields<'a> {
    target: Option<&'a JsonValue>,
    input: Option<&'a JsonValue>,
    instance_key: Option<&'a JsonValue>,
    event_type: Option<&'a JsonValue>,
    metadata: Option<&'a JsonValue>,
    timeout_ms: Option<&'a JsonValue>,
    asynchronous: Option<&'a JsonValue>,
}

impl<'a> MessageFields<'a> {
    /// The flat shape: the `agents` tool's arguments, `ctx.agents`' params.
    pub fn flat(object: &'a JsonObject) -> Self {
        Self {
            target: object.get("target"),
            input: object.get("input"),
            instance_key: object.get("instanceKey"),
            event_type: object.get("eventType"),
            metadata: object.get("metadata"),
            timeout_ms: object.get("timeoutMs"),
            asynchronous: object.get("async"),
        }
    }

    /// The flat shape from any JSON value (what a script passed), refusing
    /// anything but an object.
    pub fn flat_value(value: &'a JsonValue) -> Result<Self, ContractError> {
        object_or_empty(Some(value), "the request").map(|object| object.map_or_else(Self::default, Self::flat))
    }

    /// `ctx.runtime.request(target, event, options)` / `send(target, event)`,
    /// as `{target, event, options}`: `event.type` is the event type,
    /// `options` holds `timeoutMs` and `async`.
    pub fn runtime_call(params: &'a JsonValue) -> Result<Self, ContractError> {
        let event = object_or_empty(params.get("event"), "event")?;
        let options = object_or_empty(params.get("options"), "options")?;
        let of = |object: Option<&'a JsonObject>, key: &str| object.and_then(|object| object.get(key));
        Ok(Self {
            target: params.get("target"),
            input: of(event, "input"),
            instance_key: of(event, "instanceKey"),
            event_type: of(event, "type"),
            metadata: of(event, "metadata"),
            timeout_ms: of(options, "timeoutMs"),
            asynchronous: of(options, "async"),
        })
    }

    /// A request: waits `timeoutMs` for the answer unless `async`.
    pub fn request(self) -> Result<AgentMessageRequest, ContractError> {
        let mut request = self.message(REQUEST_EVENT_TYPE)?;
        request.timeout_ms = Some(timeout_ms(self.timeout_ms)?);
        request.asynchronous = boolean(self.asynchronous, "async")?;
        Ok(request)
    }

    /// A fire-and-forget event; `timeoutMs` and `async` are not read.
    pub fn send(self) -> Result<AgentMessageRequest, ContractError> {
        self.message(SEND_EVENT_TYPE)
    }

    fn message(&self, default_event: &str) -> Result<AgentMessageRequest, ContractError> {
        Ok(AgentMessageRequest {
            target: target(self.target)?,
            input: input(self.input)?,
            instance_key: text(self.instance_key, "instanceKey")?,
            event_type: Some(text(self.event_type, "eventType")?.unwrap_or_else(|| default_event.to_owned())),
            metadata: object_or_empty(self.metadata, "metadata")?.cloned().unwrap_or_default(),
            timeout_ms: None,
            asynchronous: false,
        })
    }
}

/// The fields of a spawn, as the caller sent them.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpawnFields<'a> {
    target: Option<&'a JsonValue>,
    instance_key: Option<&'a JsonValue>,
    cwd: Option<&'a JsonValue>,
}

impl<'a> SpawnFields<'a> {
    /// The `agents` tool's `{target, instanceKey?, cwd?}`.
    pub fn flat(object: &'a JsonObject) -> Self {
        Self { target: object.get("target"), instance_key: object.get("instanceKey"), cwd: object.get("cwd") }
    }

    /// `ctx.runtime.spawn(target, options)`, as `{target, options}`.
    pub fn runtime_call(params: &'a JsonValue) -> Result<Self, ContractError> {
        let options = object_or_empty(params.get("options"), "options")?;
        let of = |key: &str| options.and_then(|options| options.get(key));
        Ok(Self { target: params.get("target"), instance_key: of("instanceKey"), cwd: of("cwd") })
    }

    /// The spawn request.
    pub fn spawn(self) -> Result<AgentSpawnRequest, ContractError> {
        Ok(AgentSpawnRequest {
            target: target(self.target)?,
            instance_key: text(self.instance_key, "instanceKey")?,
            cwd: text(self.cwd, "cwd")?,
        })
    }
}

/// `includeAll` of `list` (the tool's argument, or `ctx.runtime.list`'s
/// `options.includeAll`).
pub fn include_all(value: Option<&JsonValue>) -> Result<bool, ContractError> {
    boolean(value, "includeAll")
}

/// `ctx.runtime.list(options)`'s `includeAll`, as `{options}`.
pub fn runtime_include_all(params: &JsonValue) -> Result<bool, ContractError> {
    include_all(object_or_empty(params.get("options"), "options")?.and_then(|options| options.get("includeAll")))
}

/// The value unless absent or `null`.
fn present(value: Option<&JsonValue>) -> Option<&JsonValue> {
    value.filter(|value| !value.is_null())
}

fn object_or_empty<'a>(value: Option<&'a JsonValue>, name: &str) -> Result<Option<&'a JsonObject>, ContractError> {
    match present(value) {
        None => Ok(None),
        Some(JsonValue::Object(object)) => Ok(Some(object)),
        Some(other) => Err(ContractError::new(format!("'{name}' must be an object, got {}", json_type_name(other)))),
    }
}

fn target(value: Option<&JsonValue>) -> Result<String, ContractError> {
    match present(value) {
        Some(JsonValue::String(target)) if !target.trim().is_empty() => Ok(target.trim().to_owned()),
        _ => Err(ContractError::new("'target' must be a non-empty string")
            .suggest("Name an agent of the swarm; agents__catalog lists them.")),
    }
}

fn input(value: Option<&JsonValue>) -> Result<String, ContractError> {
    match present(value) {
        Some(JsonValue::String(input)) if !input.is_empty() => Ok(input.clone()),
        _ => Err(ContractError::new("'input' must be a non-empty string")
            .suggest("Give the text the other agent receives as its input.")),
    }
}

/// An optional string; trimmed, and empty counts as absent.
fn text(value: Option<&JsonValue>, name: &str) -> Result<Option<String>, ContractError> {
    match present(value) {
        None => Ok(None),
        Some(JsonValue::String(text)) => Ok(Some(text.trim()).filter(|text| !text.is_empty()).map(str::to_owned)),
        Some(other) => Err(ContractError::new(format!("'{name}' must be a string, got {}", json_type_name(other)))),
    }
}

fn boolean(value: Option<&JsonValue>, name: &str) -> Result<bool, ContractError> {
    match present(value) {
        None => Ok(false),
        Some(JsonValue::Bool(flag)) => Ok(*flag),
        Some(other) => Err(ContractError::new(format!("'{name}' must be a boolean, got {}", json_type_name(other)))),
    }
}

fn timeout_ms(value: Option<&JsonValue>) -> Result<u64, ContractError> {
    let refused = |got: String| {
        ContractError::new(format!("'timeoutMs' must be a positive number, got {got}")).suggest(format!(
            "Give the time to wait for the reply in milliseconds (default {DEFAULT_REQUEST_TIMEOUT_MS})."
        ))
    };
    let Some(value) = present(value) else { return Ok(DEFAULT_REQUEST_TIMEOUT_MS) };
    let Some(timeout) = value.as_f64() else { return Err(refused(json_type_name(value).to_owned())) };
    if !(timeout.is_finite() && timeout > 0.0) {
        return Err(refused(value.to_string()));
    }
    // Whole milliseconds; a huge value waits as long as a u64 can say.
    Ok(timeout.ceil().min(u64::MAX as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(value: JsonValue) -> JsonObject {
        value.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn defaults_are_the_originals() {
        let args = flat(json!({"target": " b ", "input": "hi"}));
        let Ok(request) = MessageFields::flat(&args).request() else { panic!("refused") };
        assert_eq!(request.target, "b");
        assert_eq!(request.instance_key, None, "the runtime uses the caller's key");
        assert_eq!(request.event_type.as_deref(), Some(REQUEST_EVENT_TYPE));
        assert_eq!(request.timeout_ms, Some(DEFAULT_REQUEST_TIMEOUT_MS));
        assert!(!request.asynchronous);
        let Ok(send) = MessageFields::flat(&args).send() else { panic!("refused") };
        assert_eq!((send.event_type.as_deref(), send.timeout_ms), (Some(SEND_EVENT_TYPE), None));
    }

    #[test]
    fn the_runtime_call_shape_reads_the_same_fields() {
        let params = json!({"target": "b", "event": {"type": " ping ", "input": "x", "instanceKey": "k",
            "metadata": {"a": 1}}, "options": {"timeoutMs": 1500.5, "async": true}});
        let Ok(request) = MessageFields::runtime_call(&params).and_then(MessageFields::request) else {
            panic!("refused")
        };
        let args = flat(json!({"target": "b", "input": "x", "instanceKey": "k", "eventType": "ping",
            "metadata": {"a": 1}, "timeoutMs": 1500.5, "async": true}));
        assert_eq!(MessageFields::flat(&args).request(), Ok(request.clone()));
        assert_eq!((request.timeout_ms, request.asynchronous), (Some(1501), true));
        let refused = MessageFields::runtime_call(&json!({"target": "b", "event": "x"})).err();
        assert_eq!(refused.map(|e| e.message).as_deref(), Some("'event' must be an object, got string"));
    }

    #[test]
    fn bad_values_are_refused_naming_the_field() {
        let refused = |value: JsonValue| MessageFields::flat(&flat(value)).request().err().map(|e| e.message);
        for (value, message) in [
            (json!({"input": "x"}), "'target' must be a non-empty string"),
            (json!({"target": "  ", "input": "x"}), "'target' must be a non-empty string"),
            (json!({"target": "b"}), "'input' must be a non-empty string"),
            (json!({"target": "b", "input": "x", "timeoutMs": 0}), "'timeoutMs' must be a positive number, got 0"),
            (json!({"target": "b", "input": "x", "timeoutMs": -5}), "'timeoutMs' must be a positive number, got -5"),
            (
                json!({"target": "b", "input": "x", "timeoutMs": "9"}),
                "'timeoutMs' must be a positive number, got string",
            ),
            (json!({"target": "b", "input": "x", "async": "yes"}), "'async' must be a boolean, got string"),
            (json!({"target": "b", "input": "x", "metadata": [1]}), "'metadata' must be an object, got array"),
            (json!({"target": "b", "input": "x", "eventType": 3}), "'eventType' must be a string, got integer"),
        ] {
            assert_eq!(refused(value.clone()).as_deref(), Some(message), "{value}");
        }
        let failure = ToolFailure::from(ContractError::new("x"));
        assert_eq!(failure.code.as_deref(), Some(E_AGENTS_INVALID_REQUEST));
    }

    #[test]
    fn answers_shape_each_callers_output() {
        let answer = AgentAnswer {
            target: "b".into(),
            event_id: "e".into(),
            correlation_id: "c".into(),
            accepted: true,
            asynchronous: true,
            response: None,
        };
        assert_eq!(answer.tool_output()["response"], JsonValue::Null);
        assert_eq!(answer.middleware_output()["response"], "");
        let answered = AgentAnswer { response: Some("pong".into()), asynchronous: false, ..answer };
        assert_eq!(answered.tool_output()["response"], "pong");
        assert_eq!(answered.middleware_output()["async"], false);
    }
}
