//! `context-message`: the agent's system context as one system message of
//! the conversation — the agent's prompt and, by its flags, the swarm's
//! catalog, where the input came from, who called, and a route summary.
//!
//! A turn layer, as the original's: before the turn core appends the input,
//! it composes the segments (in the original's order and format), and
//! appends a system message (source `extension`, `context-message`, marked
//! `__goondanContextMessage: {promptHash, segmentIds}`) unless the
//! conversation already holds one with the same content (its SHA-256, or the
//! same text from this extension). Each turn records what it decided in
//! `ctx.metadata["extension.events"]` (`context.segment.resolved`,
//! `context.message.appended` / `.duplicate` / `.empty`), as the original.
//!
//! Where it differs from what the runtime does without it: the agent's
//! prompt travels as this message of the conversation, so the installer
//! marks the tooling (`prompt_in_conversation`) and the model request no
//! longer carries its own copy — the model gets the prompt once.

use std::sync::Arc;

use goondan_core::ids::new_ordered_id;
use goondan_core::js_message::format_rfc3339_millis;
use goondan_core::message::now_millis;
use goondan_core::{JsonObject, JsonValue, Message, MessageData, MessageEvent, MessageSource};
use goondan_runtime::extension::{AgentExtension, ExtensionError, ExtensionSetup};
use goondan_runtime::{TurnContext, TurnOutcome};
use goondan_tools::{AgentToolRuntime, AsyncMiddleware, CallScope, Next, ToolContext, async_layer};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::fields::Fields;

/// The extension's name in `@goondan/base`.
pub const NAME: &str = "context-message";
/// The metadata key marking the message this extension appends.
pub const MARKER_KEY: &str = "__goondanContextMessage";
/// Where the original's base extensions record what they decided.
pub const EVENTS_METADATA_KEY: &str = "extension.events";
/// The metadata key of an inbound message's origin (set by the agent process).
const INBOUND_KEY: &str = "__goondanInbound";

/// The original's default instruction after the swarm catalog.
pub const DEFAULT_SWARM_CATALOG_INSTRUCTION: &str =
    "위 callableAgents를 참고해 위임 대상이 모호하면 agents__catalog로 최신 목록을 다시 확인한다.";

/// The segments in the order they are joined.
const SEGMENT_ORDER: [&str; 5] =
    ["agent.prompt.system", "runtime.swarm.catalog", "runtime.inbound", "runtime.call", "runtime.route.summary"];

/// `config`, with the original's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `includeAgentPrompt` (true).
    pub include_agent_prompt: bool,
    /// `includeSwarmCatalog` (false).
    pub include_swarm_catalog: bool,
    /// `includeInboundContext` (false).
    pub include_inbound_context: bool,
    /// `includeCallContext` (false).
    pub include_call_context: bool,
    /// `includeRouteSummary` (false; needs the inbound or the call context).
    pub include_route_summary: bool,
    /// `swarmCatalogInstruction`, trimmed; blank means the default.
    pub swarm_catalog_instruction: String,
}

impl Config {
    /// Reads `config`; a field of the wrong type is an `E_EXT_INIT` error.
    pub fn parse(extension: &str, config: &JsonObject) -> Result<Self, ExtensionError> {
        let fields = Fields::new(extension, config);
        let instruction = fields.string("swarmCatalogInstruction")?.map(str::trim).filter(|text| !text.is_empty());
        Ok(Self {
            include_agent_prompt: fields.boolean("includeAgentPrompt", true)?,
            include_swarm_catalog: fields.boolean("includeSwarmCatalog", false)?,
            include_inbound_context: fields.boolean("includeInboundContext", false)?,
            include_call_context: fields.boolean("includeCallContext", false)?,
            include_route_summary: fields.boolean("includeRouteSummary", false)?,
            swarm_catalog_instruction: instruction.unwrap_or(DEFAULT_SWARM_CATALOG_INSTRUCTION).to_owned(),
        })
    }
}

/// Installs the turn layer (priority 0, in the agent's extension order) and
/// takes the system prompt over from the model request.
pub fn install(setup: &mut ExtensionSetup<'_>, extension: &AgentExtension) -> Result<(), ExtensionError> {
    let config = Config::parse(&extension.name, &extension.config)?;
    let tooling = &mut *setup.tooling;
    let layer = ContextMessage {
        config,
        prompt: tooling.system_prompt.clone(),
        runtime: tooling.agent_runtime.clone(),
        workdir: Arc::clone(&tooling.workdir),
    };
    // The prompt is this extension's to send from now on, also when
    // includeAgentPrompt is false: as in the original, where only
    // context-message puts the agent's prompt before the model.
    tooling.prompt_in_conversation = Some(Arc::from(extension.name.as_str()));
    tooling.turn_middleware.register(extension.name.as_str(), 0, async_layer(layer));
    Ok(())
}

/// The turn layer.
struct ContextMessage {
    config: Config,
    prompt: Option<Arc<str>>,
    runtime: Option<Arc<dyn AgentToolRuntime>>,
    workdir: Arc<std::path::Path>,
}

impl AsyncMiddleware<TurnContext, TurnOutcome> for ContextMessage {
    async fn handle<'a>(&'a self, ctx: &'a mut TurnContext, next: Next<'a, TurnContext, TurnOutcome>) -> TurnOutcome {
        let catalog = match (&self.runtime, self.config.include_swarm_catalog) {
            (Some(runtime), true) => self.swarm_catalog(runtime.as_ref(), ctx).await,
            _ => None,
        };
        let sources = Sources { prompt: self.prompt.as_deref(), catalog: catalog.as_ref(), inbound: inbound_of(ctx) };
        emit_context_message(ctx, &self.config, &sources);
        next.run(ctx).await
    }
}

impl ContextMessage {
    /// The swarm's catalog as `agents__catalog` gives it, from the swarm's
    /// runtime; `None` (and a log line) when it cannot be had.
    async fn swarm_catalog(&self, runtime: &dyn AgentToolRuntime, ctx: &TurnContext) -> Option<JsonValue> {
        let message = Message::new(
            MessageData::Assistant { content: None, tool_calls: Vec::new() },
            MessageSource::Assistant { step_id: String::new() },
        );
        let scope = CallScope {
            agent_name: Arc::clone(&ctx.agent_name),
            instance_key: Arc::clone(&ctx.instance_key),
            turn_id: Arc::clone(&ctx.turn_id),
            step_id: Arc::from(""),
            step_index: 0,
            message: Arc::new(message),
            workdir: Arc::clone(&self.workdir),
            trace_id: Arc::clone(&ctx.trace_id),
            step_span_id: Arc::from(""),
            runtime: None,
            tasks: None,
        };
        let tool_ctx =
            ToolContext::new(Arc::new(scope), Arc::from(NAME), format!("context-message-{}", new_ordered_id()));
        match runtime.catalog(&tool_ctx).await {
            Ok(catalog) => Some(catalog),
            Err(failure) => {
                tracing::warn!("{NAME}: the swarm catalog is not available: {}", failure.message);
                None
            }
        }
    }
}

/// What the segments are made of.
struct Sources<'a> {
    prompt: Option<&'a str>,
    /// The `agents__catalog` output (`swarmName`, `entryAgent`, …).
    catalog: Option<&'a JsonValue>,
    inbound: Inbound,
}

/// Where the turn's input came from (the original's `ctx.runtime.inbound`).
#[derive(Debug, Clone, PartialEq)]
struct Inbound {
    event_id: String,
    event_type: String,
    source_kind: String,
    source_name: String,
    created_at: String,
    instance_key: String,
    event_metadata: Option<JsonObject>,
    /// The request's correlation id, when another agent asked.
    correlation_id: Option<String>,
    /// The sender's instance key, when another agent asked.
    source_instance_key: Option<String>,
}

fn text_of(object: &JsonObject, key: &str) -> Option<String> {
    object.get(key).and_then(JsonValue::as_str).map(str::trim).filter(|text| !text.is_empty()).map(str::to_owned)
}

/// The input's origin: the `__goondanInbound` metadata the agent process
/// gives a message from another agent; otherwise the terminal (`gdn run`),
/// as the JavaScript extensions' `inputEvent` describes it.
fn inbound_of(ctx: &TurnContext) -> Inbound {
    let empty = JsonObject::new();
    let inbound = ctx.input_metadata.get(INBOUND_KEY).and_then(JsonValue::as_object).unwrap_or(&empty);
    Inbound {
        event_id: text_of(inbound, "eventId").unwrap_or_else(|| ctx.turn_id.to_string()),
        event_type: text_of(inbound, "eventName").unwrap_or_else(|| "input".to_owned()),
        source_kind: text_of(inbound, "sourceKind").unwrap_or_else(|| "connector".to_owned()),
        source_name: text_of(inbound, "sourceName").unwrap_or_else(|| "cli".to_owned()),
        created_at: format_rfc3339_millis(now_millis()),
        instance_key: ctx.instance_key.to_string(),
        event_metadata: inbound.get("eventMetadata").and_then(JsonValue::as_object).cloned(),
        correlation_id: text_of(inbound, "correlationId"),
        source_instance_key: text_of(inbound, "instanceKey"),
    }
}

/// One part of the message.
struct Segment {
    id: &'static str,
    content: String,
}

fn swarm_catalog_segment(catalog: &JsonValue, instruction: &str) -> Segment {
    let text = |key: &str| catalog.get(key).and_then(JsonValue::as_str).unwrap_or_default().to_owned();
    let list = |key: &str| {
        let names: Vec<&str> = catalog
            .get(key)
            .and_then(JsonValue::as_array)
            .into_iter()
            .flatten()
            .filter_map(JsonValue::as_str)
            .collect();
        names.join(", ")
    };
    let mut lines = vec![
        "[runtime_catalog]".to_owned(),
        format!("swarm={}", text("swarmName")),
        format!("entryAgent={}", text("entryAgent")),
        format!("selfAgent={}", text("selfAgent")),
        format!("availableAgents={}", list("availableAgents")),
        format!("callableAgents={}", list("callableAgents")),
        "[/runtime_catalog]".to_owned(),
    ];
    if !instruction.is_empty() {
        lines.push(instruction.to_owned());
    }
    Segment { id: "runtime.swarm.catalog", content: lines.join("\n") }
}

fn inbound_segment(inbound: &Inbound) -> Segment {
    let mut lines = vec![
        "[runtime_inbound]".to_owned(),
        format!("eventId={}", inbound.event_id),
        format!("eventType={}", inbound.event_type),
        format!("sourceKind={}", inbound.source_kind),
        format!("sourceName={}", inbound.source_name),
        format!("createdAt={}", inbound.created_at),
    ];
    if !inbound.instance_key.is_empty() {
        lines.push(format!("instanceKey={}", inbound.instance_key));
    }
    if let Some(metadata) = inbound.event_metadata.as_ref().filter(|m| !m.is_empty()) {
        lines.push(format!("eventMetadata={}", JsonValue::Object(metadata.clone())));
    }
    lines.push("[/runtime_inbound]".to_owned());
    Segment { id: "runtime.inbound", content: lines.join("\n") }
}

/// Who called (the original's `ctx.runtime.call`): the event metadata's
/// `callerAgent`, `callerInstanceKey`, `callerTurnId`, `callSource`,
/// `__goondanAgentCallStack`; for a request from another agent the sender
/// and its correlation id fill what the metadata leaves out.
#[derive(Debug, Default, PartialEq)]
struct Call {
    caller_agent: Option<String>,
    caller_instance_key: Option<String>,
    caller_turn_id: Option<String>,
    call_source: Option<String>,
    call_stack: Vec<String>,
    reply_to: Option<(String, String)>,
}

fn call_of(inbound: &Inbound) -> Call {
    let empty = JsonObject::new();
    let metadata = inbound.event_metadata.as_ref().unwrap_or(&empty);
    let from_agent = inbound.source_kind == "agent";
    Call {
        caller_agent: text_of(metadata, "callerAgent").or_else(|| from_agent.then(|| inbound.source_name.clone())),
        caller_instance_key: text_of(metadata, "callerInstanceKey")
            .or_else(|| inbound.source_instance_key.clone().filter(|_| from_agent)),
        caller_turn_id: text_of(metadata, "callerTurnId"),
        call_source: text_of(metadata, "callSource"),
        call_stack: metadata
            .get("__goondanAgentCallStack")
            .and_then(JsonValue::as_array)
            .into_iter()
            .flatten()
            .filter_map(JsonValue::as_str)
            .filter(|name| !name.is_empty())
            .map(str::to_owned)
            .collect(),
        reply_to: inbound
            .correlation_id
            .clone()
            .filter(|_| from_agent)
            .map(|correlation_id| (inbound.source_name.clone(), correlation_id)),
    }
}

fn call_segment(call: &Call) -> Option<Segment> {
    let mut lines = vec!["[runtime_call]".to_owned()];
    let fields = [
        ("callerAgent", &call.caller_agent),
        ("callerInstanceKey", &call.caller_instance_key),
        ("callerTurnId", &call.caller_turn_id),
        ("callSource", &call.call_source),
    ];
    for (key, value) in fields {
        if let Some(value) = value {
            lines.push(format!("{key}={value}"));
        }
    }
    if !call.call_stack.is_empty() {
        lines.push(format!("callStack={}", call.call_stack.join(" -> ")));
    }
    if let Some((target, correlation_id)) = &call.reply_to {
        lines.push(format!("replyTo.target={target}"));
        lines.push(format!("replyTo.correlationId={correlation_id}"));
    }
    if lines.len() == 1 {
        return None;
    }
    lines.push("[/runtime_call]".to_owned());
    Some(Segment { id: "runtime.call", content: lines.join("\n") })
}

fn route_segment(inbound: &Inbound, call: &Call) -> Segment {
    let sender_kind = if call.caller_agent.is_some() { "agent" } else { inbound.source_kind.as_str() };
    let sender_name = call.caller_agent.as_deref().unwrap_or(&inbound.source_name);
    let sender_key =
        call.caller_instance_key.as_deref().or(Some(inbound.instance_key.as_str()).filter(|k| !k.is_empty()));
    let mut lines = vec![
        "[runtime_route]".to_owned(),
        "precedence=call>inbound".to_owned(),
        format!("senderKind={sender_kind}"),
        format!("senderName={sender_name}"),
        format!("eventType={}", inbound.event_type),
        format!("eventId={}", inbound.event_id),
    ];
    if let Some(key) = sender_key {
        lines.push(format!("senderInstanceKey={key}"));
    }
    if let Some(turn) = &call.caller_turn_id {
        lines.push(format!("senderTurnId={turn}"));
    }
    if let Some(source) = &call.call_source {
        lines.push(format!("senderSource={source}"));
    }
    lines.push("[/runtime_route]".to_owned());
    Segment { id: "runtime.route.summary", content: lines.join("\n") }
}

/// The segments the config asks for, in the original's order, and for each
/// asked-for segment whether it was included.
fn segments(config: &Config, sources: &Sources<'_>) -> (Vec<Segment>, Vec<(&'static str, bool)>) {
    let mut segments = Vec::new();
    let mut resolutions = Vec::new();
    if config.include_agent_prompt {
        let prompt = sources.prompt.filter(|prompt| !prompt.trim().is_empty());
        resolutions.push(("agent.prompt.system", prompt.is_some()));
        if let Some(prompt) = prompt {
            segments.push(Segment { id: "agent.prompt.system", content: prompt.to_owned() });
        }
    }
    if config.include_swarm_catalog {
        // Without a swarm runtime (an agent run outside `gdn run`'s
        // orchestrator) there is no catalog to show.
        resolutions.push(("runtime.swarm.catalog", sources.catalog.is_some()));
        if let Some(catalog) = sources.catalog {
            segments.push(swarm_catalog_segment(catalog, &config.swarm_catalog_instruction));
        }
    }
    if config.include_inbound_context {
        segments.push(inbound_segment(&sources.inbound));
        resolutions.push(("runtime.inbound", true));
    }
    let call = call_of(&sources.inbound);
    if config.include_call_context {
        let segment = call_segment(&call);
        resolutions.push(("runtime.call", segment.is_some()));
        segments.extend(segment);
    }
    if config.include_route_summary && (config.include_inbound_context || config.include_call_context) {
        segments.push(route_segment(&sources.inbound, &call));
        resolutions.push(("runtime.route.summary", true));
    }
    segments.sort_by_key(|segment| SEGMENT_ORDER.iter().position(|id| *id == segment.id).unwrap_or(usize::MAX));
    (segments, resolutions)
}

/// The SHA-256 of `content`, in lowercase hex (the marker's `promptHash`).
fn prompt_hash(content: &str) -> String {
    Sha256::digest(content.as_bytes()).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Whether `messages` already hold this context message: one marked with
/// the same hash, or this extension's system message with the same text.
fn already_there(messages: &[Message], hash: &str, content: &str) -> bool {
    messages.iter().any(|message| {
        let marked = message
            .metadata
            .get(MARKER_KEY)
            .and_then(|marker| marker.get("promptHash"))
            .and_then(JsonValue::as_str)
            .is_some_and(|found| found == hash);
        let same_text = matches!(&message.source, MessageSource::Extension { extension_name } if extension_name == NAME)
            && matches!(&message.data, MessageData::System { content: text } if text == content);
        marked || same_text
    })
}

/// Records `name` (with `data`) in `ctx.metadata["extension.events"]`.
fn record(ctx: &mut TurnContext, name: &str, data: Option<JsonValue>) {
    let mut entry = json!({"name": name, "actor": NAME, "at": format_rfc3339_millis(now_millis())});
    if let Some(data) = data {
        entry["data"] = data;
    }
    match ctx.metadata.get_mut(EVENTS_METADATA_KEY) {
        Some(JsonValue::Array(entries)) => entries.push(entry),
        _ => {
            ctx.metadata.insert(EVENTS_METADATA_KEY.to_owned(), JsonValue::Array(vec![entry]));
        }
    }
}

fn emit_context_message(ctx: &mut TurnContext, config: &Config, sources: &Sources<'_>) {
    let (segments, resolutions) = segments(config, sources);
    for (id, included) in resolutions {
        record(ctx, "context.segment.resolved", Some(json!({"id": id, "included": included})));
    }
    if segments.is_empty() {
        record(ctx, "context.message.empty", None);
        return;
    }
    let content = segments.iter().map(|segment| segment.content.as_str()).collect::<Vec<_>>().join("\n\n");
    let hash = prompt_hash(&content);
    if already_there(ctx.conversation.messages(), &hash, &content) {
        record(ctx, "context.message.duplicate", Some(json!({"promptHash": hash})));
        return;
    }
    let segment_ids: Vec<&str> = segments.iter().map(|segment| segment.id).collect();
    let mut message =
        Message::new(MessageData::System { content }, MessageSource::Extension { extension_name: NAME.to_owned() });
    message.metadata.insert(MARKER_KEY.to_owned(), json!({"promptHash": hash, "segmentIds": segment_ids}));
    if let Err(error) = ctx.conversation.emit(MessageEvent::Append { message }) {
        // A fresh id cannot collide; say so loudly if it ever does.
        tracing::warn!("{NAME}: the context message was refused: {error}");
        return;
    }
    record(ctx, "context.message.appended", Some(json!({"promptHash": hash, "segmentIds": segment_ids})));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inbound() -> Inbound {
        Inbound {
            event_id: "ev-1".into(),
            event_type: "agent.request".into(),
            source_kind: "agent".into(),
            source_name: "coordinator".into(),
            created_at: "2026-01-01T00:00:00.000Z".into(),
            instance_key: "default".into(),
            event_metadata: Some(serde_json::Map::from_iter([("callSource".to_owned(), json!("tool"))])),
            correlation_id: Some("corr-1".into()),
            source_instance_key: Some("user-7".into()),
        }
    }

    fn config(value: JsonValue) -> Result<Config, ExtensionError> {
        Config::parse(NAME, value.as_object().unwrap_or(&JsonObject::new()))
    }

    #[test]
    fn config_has_the_originals_defaults_and_refuses_wrong_types() {
        let defaults = config(json!({})).unwrap_or_else(|e| panic!("{e}"));
        assert!(defaults.include_agent_prompt);
        assert!(!defaults.include_swarm_catalog && !defaults.include_inbound_context);
        assert!(!defaults.include_call_context && !defaults.include_route_summary);
        assert_eq!(defaults.swarm_catalog_instruction, DEFAULT_SWARM_CATALOG_INSTRUCTION);
        let blank = config(json!({"swarmCatalogInstruction": "   "})).map(|c| c.swarm_catalog_instruction);
        assert_eq!(blank.as_deref(), Ok(DEFAULT_SWARM_CATALOG_INSTRUCTION));
        let refused = config(json!({"includeSwarmCatalog": "yes"})).err().unwrap_or_else(|| panic!("accepted"));
        assert_eq!(refused.code, "E_EXT_INIT");
        assert!(refused.message.starts_with("config.includeSwarmCatalog must be true or false"), "{refused}");
    }

    #[test]
    fn segments_follow_the_originals_order_and_format() {
        let catalog = json!({"swarmName": "brain", "entryAgent": "coordinator", "selfAgent": "worker",
                             "availableAgents": ["coordinator", "worker"], "callableAgents": ["coordinator"]});
        let all = config(json!({"includeSwarmCatalog": true, "includeInboundContext": true,
                                "includeCallContext": true, "includeRouteSummary": true,
                                "swarmCatalogInstruction": " Ask the catalog. "}))
        .unwrap_or_else(|e| panic!("{e}"));
        let sources = Sources { prompt: Some("You are the worker."), catalog: Some(&catalog), inbound: inbound() };
        let (segments, resolutions) = segments(&all, &sources);
        let ids: Vec<&str> = segments.iter().map(|s| s.id).collect();
        assert_eq!(ids, SEGMENT_ORDER);
        assert!(resolutions.iter().all(|(_, included)| *included), "{resolutions:?}");
        assert_eq!(segments[0].content, "You are the worker.");
        assert_eq!(
            segments[1].content,
            "[runtime_catalog]\nswarm=brain\nentryAgent=coordinator\nselfAgent=worker\n\
             availableAgents=coordinator, worker\ncallableAgents=coordinator\n[/runtime_catalog]\nAsk the catalog."
        );
        assert_eq!(
            segments[2].content,
            "[runtime_inbound]\neventId=ev-1\neventType=agent.request\nsourceKind=agent\nsourceName=coordinator\n\
             createdAt=2026-01-01T00:00:00.000Z\ninstanceKey=default\neventMetadata={\"callSource\":\"tool\"}\n\
             [/runtime_inbound]"
        );
        assert_eq!(
            segments[3].content,
            "[runtime_call]\ncallerAgent=coordinator\ncallerInstanceKey=user-7\ncallSource=tool\n\
             replyTo.target=coordinator\nreplyTo.correlationId=corr-1\n[/runtime_call]"
        );
        assert_eq!(
            segments[4].content,
            "[runtime_route]\nprecedence=call>inbound\nsenderKind=agent\nsenderName=coordinator\n\
             eventType=agent.request\neventId=ev-1\nsenderInstanceKey=user-7\nsenderSource=tool\n[/runtime_route]"
        );

        // From the terminal there is no call; the route summary needs one of its inputs.
        let terminal = Inbound {
            source_kind: "connector".into(),
            source_name: "cli".into(),
            event_metadata: None,
            correlation_id: None,
            source_instance_key: None,
            ..inbound()
        };
        let some =
            config(json!({"includeCallContext": true, "includeRouteSummary": true})).unwrap_or_else(|e| panic!("{e}"));
        let sources = Sources { prompt: None, catalog: None, inbound: terminal };
        let (found, resolutions) = super::segments(&some, &sources);
        assert_eq!(
            resolutions,
            [("agent.prompt.system", false), ("runtime.call", false), ("runtime.route.summary", true)]
        );
        assert_eq!(found.len(), 1);
        assert!(found[0].content.contains("senderKind=connector\nsenderName=cli"), "{}", found[0].content);
        let route_alone = config(json!({"includeRouteSummary": true})).unwrap_or_else(|e| panic!("{e}"));
        assert!(super::segments(&route_alone, &sources).0.is_empty());
    }

    #[test]
    fn the_hash_is_the_sha256_of_the_content() {
        assert_eq!(prompt_hash("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[test]
    fn a_context_message_already_there_is_found_by_hash_or_by_text() {
        let mut marked = Message::new(MessageData::System { content: "old text".into() }, MessageSource::System);
        marked.metadata.insert(MARKER_KEY.into(), json!({"promptHash": "h1", "segmentIds": []}));
        assert!(already_there(std::slice::from_ref(&marked), "h1", "new text"));
        assert!(
            !already_there(std::slice::from_ref(&marked), "h2", "old text"),
            "text counts only for its own messages"
        );
        let own = Message::new(
            MessageData::System { content: "same".into() },
            MessageSource::Extension { extension_name: NAME.into() },
        );
        assert!(already_there(std::slice::from_ref(&own), "other", "same"));
    }
}
