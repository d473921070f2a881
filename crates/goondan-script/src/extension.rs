//! JavaScript extensions: `register(api)` in the script host, and the Rust
//! layers through which their middleware joins the agent's own chains.
//!
//! [`install_script_extensions`] loads each extension module in the
//! agent's [`ScriptHost`]; what `register` registered comes back as
//! declarations, and each middleware becomes a [`JsLayer`] on the turn,
//! step or toolCall chain at its priority — the same chains native layers
//! use, so JS and native layers form one onion. Tools from
//! `api.tools.register` enter the registry with source
//! `{type: extension, name}` and run through the executor like any tool.
//!
//! A JS layer runs as a conversation with the host: the context goes over
//! as JSON, each `ctx.next()` comes back with what the layer changed (message
//! events, metadata, the Tool Catalog, toolCall arguments), the inner layers
//! run in Rust, and their result and the context as they left it go back to
//! JavaScript. What a layer returns becomes the Rust result. A layer that
//! throws, or whose host dies, fails closed: the turn ends with a layer
//! failure (turn, step) or the call gets an error result (toolCall) — a
//! layer that guards something is never skipped.

use std::sync::{Arc, Weak};

use goondan_core::codes::E_TOOL;
use goondan_core::ids::new_ordered_id;
use goondan_core::message::now_millis;
use goondan_core::{JsonObject, JsonValue, MessageEvent, ToolError, ToolResult, message_event_from_js};
use goondan_runtime::context::{LayerFailure, Pipeline};
use goondan_runtime::extension::{AgentExtension, ExtensionError, ExtensionSetup};
use goondan_runtime::extension_state::ExtensionStateStore;
use goondan_runtime::{StepContext, StepFailure, StepOutcome, TurnContext, TurnEnd, TurnOutcome};
use goondan_tools::agents::MessageFields;
use goondan_tools::executor::ToolCallContext;
use goondan_tools::{
    BoxFuture, HandlerResult, Middleware, Next, ToolCatalog, ToolCatalogItem, ToolContext, ToolFailure, ToolHandler,
    ToolRegistry, ToolSource,
};
use serde_json::json;

use crate::host::{ExtensionLoad, HostServices, ScriptHost, SessionEvent};

/// Loads `extensions` (JavaScript modules) in `host` and installs what they
/// register into `setup.tooling`: layers on its chains, tools in its
/// registry. Starts the host now: the pipelines must be known before the
/// first turn.
pub async fn install_script_extensions(
    setup: &mut ExtensionSetup<'_>,
    extensions: &[AgentExtension],
    host: &Arc<ScriptHost>,
) -> Result<(), ExtensionError> {
    let tooling = &mut *setup.tooling;
    let registry = Arc::clone(tooling.registry());
    let services = Arc::new(Services {
        host: Arc::downgrade(host),
        registry: Arc::downgrade(&registry),
        state: Arc::clone(&setup.state),
        agents: tooling.agent_runtime.clone().map(|runtime| AgentsOrigin {
            runtime,
            agent_name: Arc::clone(&tooling.agent_name),
            instance_key: Arc::clone(&tooling.instance_key),
            workdir: Arc::clone(&tooling.workdir),
        }),
    });
    let loads = extensions
        .iter()
        .map(|extension| ExtensionLoad {
            name: extension.name.clone(),
            module: Arc::clone(&extension.entry),
            config: extension.config.clone(),
        })
        .collect();
    let loaded = host.load_extensions(loads, services).await.map_err(|failure| {
        let extension = extensions
            .iter()
            .find(|extension| failure.message.contains(&format!("'{}'", extension.name)))
            .or(extensions.first())
            .map(|extension| extension.name.clone())
            .unwrap_or_default();
        ExtensionError::new(extension, failure.code.clone().unwrap_or_else(|| E_TOOL.to_owned()), failure.message)
    })?;

    for extension in loaded {
        let name: Arc<str> = Arc::from(extension.name.as_str());
        let mut tools: Vec<(ToolCatalogItem, Arc<dyn ToolHandler>)> = Vec::with_capacity(extension.tools.len());
        for item in &extension.tools {
            let item = catalog_item(item, &ToolSource::extension(&*name))
                .map_err(|message| ExtensionError::new(&*name, "E_EXT_INIT", message))?;
            let handler = ExtensionToolHandler {
                host: Arc::clone(host),
                extension: Arc::clone(&name),
                tool: Arc::clone(item.shared_name()),
            };
            tools.push((item, Arc::new(handler)));
        }
        registry
            .register_all(tools)
            .map_err(|error| ExtensionError::new(&*name, "E_EXT_INIT", format!("api.tools.register: {error}")))?;

        let mut counts = [0_u32; 3];
        for decl in &extension.middleware {
            let slot = match decl.pipeline.as_str() {
                "turn" => 0,
                "step" => 1,
                "toolCall" => 2,
                other => {
                    return Err(ExtensionError::new(&*name, "E_EXT_INIT", format!("unknown pipeline '{other}'")));
                }
            };
            counts[slot] += 1;
            let layer_name: Arc<str> =
                if counts[slot] == 1 { Arc::clone(&name) } else { Arc::from(format!("{name}#{}", counts[slot])) };
            let id = LayerId { extension: Arc::clone(&name), index: decl.index, name: Arc::clone(&layer_name) };
            match slot {
                0 => tooling.turn_middleware.register(
                    Arc::clone(&layer_name),
                    decl.priority,
                    Arc::new(JsLayer { host: Arc::clone(host), id, bridge: TurnBridge }),
                ),
                1 => tooling.step_middleware.register(
                    Arc::clone(&layer_name),
                    decl.priority,
                    Arc::new(JsLayer {
                        host: Arc::clone(host),
                        id,
                        bridge: StepBridge { registry: Arc::clone(&registry) },
                    }),
                ),
                _ => {
                    let layer = Arc::new(JsLayer { host: Arc::clone(host), id, bridge: ToolCallBridge });
                    if !tooling.register_tool_call_middleware(Arc::clone(&layer_name), decl.priority, layer) {
                        return Err(ExtensionError::new(
                            &*name,
                            "E_EXT_INIT",
                            "the agent's executor is already in use; toolCall middleware can only be added while it is assembled",
                        ));
                    }
                }
            }
        }
        tracing::debug!(target: "goondan::script", extension = %name, "extension loaded");
    }
    Ok(())
}

/// What the host asks on behalf of extensions: their state, and tools
/// registered after `register()` returned. Weak references: the host and
/// the registry own handlers that own the host.
struct Services {
    host: Weak<ScriptHost>,
    registry: Weak<ToolRegistry>,
    state: Arc<ExtensionStateStore>,
    /// `ctx.agents`, when the agent runs under an orchestrator.
    agents: Option<AgentsOrigin>,
}

/// The swarm's runtime and who calls it, for `ctx.agents`.
struct AgentsOrigin {
    runtime: Arc<dyn goondan_tools::AgentToolRuntime>,
    agent_name: Arc<str>,
    instance_key: Arc<str>,
    workdir: Arc<std::path::Path>,
}

impl AgentsOrigin {
    /// The context a request of a layer in `turn_id` is made from.
    fn context(&self, turn_id: &str, trace_id: &str) -> ToolContext {
        let scope = goondan_tools::CallScope {
            runtime: Some(Arc::clone(&self.runtime)),
            ..goondan_tools::CallScope::outside_step(
                Arc::clone(&self.agent_name),
                Arc::clone(&self.instance_key),
                Arc::from(turn_id),
                Arc::from(trace_id),
                Arc::clone(&self.workdir),
            )
        };
        ToolContext::new(Arc::new(scope), Arc::from("ctx.agents"), format!("ctx-agents-{}", new_ordered_id()))
    }
}

impl HostServices for Services {
    fn agents(
        &self,
        method: String,
        params: JsonValue,
        turn_id: String,
        trace_id: String,
    ) -> BoxFuture<'static, Result<JsonValue, String>> {
        let Some(origin) = &self.agents else {
            return Box::pin(async move {
                Err(format!(
                    "ctx.agents.{method}: {}: the agent runs without an orchestrator (gdn run starts one for the swarm)",
                    goondan_core::codes::E_AGENTS_UNAVAILABLE
                ))
            });
        };
        let ctx = origin.context(&turn_id, &trace_id);
        let runtime = Arc::clone(&origin.runtime);
        Box::pin(async move {
            let refused = |failure: ToolFailure| crate::tool::refusal("ctx.agents", &method, failure);
            let fields = MessageFields::flat_value(&params).map_err(|error| refused(error.into()))?;
            match method.as_str() {
                "request" => {
                    let request = fields.request().map_err(|error| refused(error.into()))?;
                    runtime.request(&ctx, request).await.map(|answer| answer.middleware_output()).map_err(refused)
                }
                "send" => {
                    let request = fields.send().map_err(|error| refused(error.into()))?;
                    runtime.send(&ctx, request).await.map(|receipt| receipt.middleware_output()).map_err(refused)
                }
                other => Err(format!("ctx.agents has no method '{other}'")),
            }
        })
    }

    fn state_get(&self, extension: String) -> BoxFuture<'static, Result<JsonValue, String>> {
        let state = Arc::clone(&self.state);
        Box::pin(async move {
            match state.get(&extension).await {
                Ok(Some(object)) => Ok(JsonValue::Object(object)),
                Ok(None) => Ok(JsonValue::Null),
                Err(error) => Err(error.to_string()),
            }
        })
    }

    fn state_set(&self, extension: String, value: JsonValue) -> BoxFuture<'static, Result<(), String>> {
        let state = Arc::clone(&self.state);
        Box::pin(async move { state.set(&extension, value).await.map_err(|error| error.to_string()) })
    }

    fn register_tool(&self, extension: &str, item: JsonValue) {
        let (Some(host), Some(registry)) = (self.host.upgrade(), self.registry.upgrade()) else { return };
        let item = match catalog_item(&item, &ToolSource::extension(extension)) {
            Ok(item) => item,
            Err(message) => {
                tracing::error!(target: "goondan::script", extension, "api.tools.register: {message}");
                return;
            }
        };
        let name = item.name().to_owned();
        // A restarted host registers its tools again: same extension, same
        // name is the same tool.
        if registry.snapshot().get(&name).is_some_and(|tool| tool.item.source() == item.source()) {
            return;
        }
        let handler =
            ExtensionToolHandler { host, extension: Arc::from(extension), tool: Arc::clone(item.shared_name()) };
        match registry.register(item, Arc::new(handler)) {
            Ok(()) => tracing::debug!(target: "goondan::script", extension, tool = %name, "tool registered"),
            Err(error) => tracing::error!(target: "goondan::script", extension, "api.tools.register: {error}"),
        }
    }
}

/// Runs a tool an extension registered, in the host.
#[derive(Debug, Clone)]
pub struct ExtensionToolHandler {
    host: Arc<ScriptHost>,
    extension: Arc<str>,
    tool: Arc<str>,
}

impl ToolHandler for ExtensionToolHandler {
    fn call<'a>(&'a self, ctx: &'a ToolContext, input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            let js_ctx = crate::tool::context_json(ctx);
            self.host.call_extension_tool(&self.extension, &self.tool, input, &js_ctx, ctx).await
        })
    }
}

/// A catalog item from its JSON (`{name, description?, parameters?, source?}`).
fn catalog_item(value: &JsonValue, default_source: &ToolSource) -> Result<ToolCatalogItem, String> {
    let Some(object) = value.as_object() else {
        return Err(format!("a tool catalog item must be an object, got {}", goondan_core::json_type_name(value)));
    };
    let name = match object.get("name") {
        Some(JsonValue::String(name)) if !name.is_empty() => name.as_str(),
        _ => return Err("a tool catalog item needs a non-empty string `name`".to_owned()),
    };
    let source = match object.get("source") {
        Some(source) => serde_json::from_value::<ToolSource>(source.clone())
            .map_err(|e| format!("tool '{name}': its `source` is not a tool source: {e}"))?,
        None => default_source.clone(),
    };
    let mut item = ToolCatalogItem::new(name, source);
    match object.get("description") {
        None | Some(JsonValue::Null) => {}
        Some(JsonValue::String(description)) => item = item.with_description(description.as_str()),
        Some(other) => {
            return Err(format!(
                "tool '{name}': `description` must be a string, got {}",
                goondan_core::json_type_name(other)
            ));
        }
    }
    match object.get("parameters") {
        None | Some(JsonValue::Null) => {}
        Some(parameters @ JsonValue::Object(_)) => item = item.with_parameters(parameters.clone()),
        Some(other) => {
            return Err(format!(
                "tool '{name}': `parameters` must be a JSON Schema object, got {}",
                goondan_core::json_type_name(other)
            ));
        }
    }
    Ok(item)
}

/// Which layer: the extension, its index among the extension's layers of
/// the pipeline, and the name failures carry.
#[derive(Debug, Clone)]
struct LayerId {
    extension: Arc<str>,
    index: u32,
    name: Arc<str>,
}

/// How one pipeline's context and result cross to JavaScript and back.
trait Bridge: Send + Sync + 'static {
    type Ctx: Send + 'static;
    type Out: Send + 'static;
    const PIPELINE: &'static str;

    /// The context the layer starts with.
    fn context(&self, ctx: &Self::Ctx) -> JsonValue;
    /// Applies what the layer changed.
    fn apply(&self, ctx: &mut Self::Ctx, changes: &JsonValue, layer: &LayerId);
    /// The context as the inner layers left it (after `next`).
    fn after(&self, ctx: &Self::Ctx) -> JsonValue;
    /// The inner result, as JavaScript sees it.
    fn view(&self, ctx: &Self::Ctx, out: &Self::Out) -> JsonValue;
    /// The layer's return value as the Rust result; `inner` is the result
    /// of its last `next()`, if it called it.
    fn output(&self, returned: Option<JsonValue>, inner: Option<Self::Out>, layer: &LayerId) -> Self::Out;
    /// The layer threw, or its host failed.
    fn failed(&self, failure: ToolFailure, layer: &LayerId) -> Self::Out;
}

/// A JavaScript middleware layer, on a Rust chain.
struct JsLayer<B> {
    host: Arc<ScriptHost>,
    id: LayerId,
    bridge: B,
}

impl<B: Bridge> Middleware<B::Ctx, B::Out> for JsLayer<B> {
    fn handle<'a>(&'a self, ctx: &'a mut B::Ctx, next: Next<'a, B::Ctx, B::Out>) -> BoxFuture<'a, B::Out> {
        Box::pin(async move {
            let bridge = &self.bridge;
            let initial = bridge.context(ctx);
            let mut session = match self.host.middleware(B::PIPELINE, &self.id.extension, self.id.index, initial).await
            {
                Ok(session) => session,
                Err(failure) => return bridge.failed(failure, &self.id),
            };
            let mut inner = None;
            loop {
                match session.recv().await {
                    SessionEvent::Next(changes) => {
                        bridge.apply(ctx, &changes, &self.id);
                        let out = next.run(ctx).await;
                        session.reply_next(bridge.view(ctx, &out), bridge.after(ctx));
                        inner = Some(out);
                    }
                    SessionEvent::Done(Ok(returned)) => {
                        bridge.apply(ctx, &returned.ctx, &self.id);
                        let value = if returned.unchanged { None } else { Some(returned.result.unwrap_or_default()) };
                        return match (value, inner) {
                            (None, Some(out)) => out,
                            (value, inner) => bridge.output(value, inner, &self.id),
                        };
                    }
                    SessionEvent::Done(Err(failure)) => return bridge.failed(failure, &self.id),
                }
            }
        })
    }
}

/// Applies the message events a layer emitted; refused ones are logged, as
/// the original warns about events whose target is missing.
fn apply_events(conversation: &mut goondan_core::ConversationState, changes: &JsonValue, layer: &LayerId) {
    let Some(events) = changes.get("events").and_then(JsonValue::as_array) else { return };
    for event in events {
        let applied = message_event_from_js(event, &layer.extension)
            .map_err(|e| e.to_string())
            .and_then(|event: MessageEvent| conversation.emit(event).map_err(|e| e.to_string()));
        if let Err(error) = applied {
            tracing::warn!(target: "goondan::script", layer = %layer.name, "emitMessageEvent refused: {error}");
        }
    }
}

fn apply_metadata(metadata: &mut JsonObject, changes: &JsonValue) {
    if let Some(JsonValue::Object(object)) = changes.get("metadata") {
        metadata.clone_from(object);
    }
}

fn conversation_json(conversation: &goondan_core::ConversationState) -> JsonValue {
    json!({"base": conversation.base_messages(), "events": conversation.events()})
}

fn input_event(turn_id: &str, trace_id: &str, instance_key: &str, input: &str) -> JsonValue {
    json!({
        "id": turn_id,
        "type": "input",
        "createdAt": now_millis(),
        "traceId": trace_id,
        "input": input,
        "instanceKey": instance_key,
        "source": {"kind": "connector", "name": "cli"},
    })
}

/// The turn pipeline.
struct TurnBridge;

impl Bridge for TurnBridge {
    type Ctx = TurnContext;
    type Out = TurnOutcome;
    const PIPELINE: &'static str = "turn";

    fn context(&self, ctx: &TurnContext) -> JsonValue {
        json!({
            "agentName": &*ctx.agent_name,
            "instanceKey": &*ctx.instance_key,
            "turnId": &*ctx.turn_id,
            "traceId": &*ctx.trace_id,
            "inputEvent": input_event(&ctx.turn_id, &ctx.trace_id, &ctx.instance_key, &ctx.input),
            "conversation": conversation_json(&ctx.conversation),
            "metadata": &ctx.metadata,
        })
    }

    fn apply(&self, ctx: &mut TurnContext, changes: &JsonValue, layer: &LayerId) {
        apply_events(&mut ctx.conversation, changes, layer);
        apply_metadata(&mut ctx.metadata, changes);
    }

    fn after(&self, ctx: &TurnContext) -> JsonValue {
        json!({"events": ctx.conversation.events(), "metadata": &ctx.metadata})
    }

    fn view(&self, ctx: &TurnContext, out: &TurnOutcome) -> JsonValue {
        let finish_reason = match &out.end {
            TurnEnd::Answered => "text_response",
            TurnEnd::StepLimit { .. } => "max_steps",
            _ => "error",
        };
        let mut view = json!({"turnId": &*ctx.turn_id, "finishReason": finish_reason});
        if !out.text.is_empty() {
            view["responseMessage"] = json!({
                "id": new_ordered_id(),
                "data": {"role": "assistant", "content": &out.text},
                "metadata": {},
                "createdAt": now_millis(),
                "source": {"type": "assistant", "stepId": ""},
            });
        }
        if finish_reason == "error" {
            view["error"] = json!({"message": out.end.note().unwrap_or_default(), "code": out.end.as_str()});
        }
        view
    }

    fn output(&self, returned: Option<JsonValue>, inner: Option<TurnOutcome>, layer: &LayerId) -> TurnOutcome {
        let Some(JsonValue::Object(result)) = returned else {
            return inner.unwrap_or_else(|| {
                TurnOutcome::layer_failed(&*layer.name, "the turn middleware returned no TurnResult")
            });
        };
        let mut outcome = inner.unwrap_or_else(|| TurnOutcome::ended(TurnEnd::Answered));
        if let Some(text) = result.get("responseMessage").and_then(|m| m.get("data")).and_then(message_text) {
            outcome.text = text;
        }
        match result.get("finishReason").and_then(JsonValue::as_str) {
            Some("text_response") if outcome.end.is_failure() || outcome.end == TurnEnd::Cancelled => {
                outcome.end = TurnEnd::Answered;
            }
            Some("max_steps") if !matches!(outcome.end, TurnEnd::StepLimit { .. }) => {
                outcome.end = TurnEnd::StepLimit { max_steps: outcome.steps };
            }
            Some("error") if !outcome.end.is_failure() => {
                let message = result
                    .get("error")
                    .and_then(|e| e.get("message"))
                    .and_then(JsonValue::as_str)
                    .unwrap_or("the turn middleware returned finishReason 'error'");
                outcome.end = TurnEnd::LayerFailed(LayerFailure {
                    pipeline: Pipeline::Turn,
                    layer: Some(layer.name.to_string()),
                    message: message.to_owned(),
                });
            }
            _ => {}
        }
        outcome
    }

    fn failed(&self, failure: ToolFailure, layer: &LayerId) -> TurnOutcome {
        TurnOutcome::layer_failed(&*layer.name, failure.message)
    }
}

/// The text of a message's `data` (a string, or text parts).
fn message_text(data: &JsonValue) -> Option<String> {
    match data.get("content")? {
        JsonValue::String(text) => Some(text.clone()),
        JsonValue::Array(parts) => Some(
            parts
                .iter()
                .filter(|part| part.get("type").and_then(JsonValue::as_str) == Some("text"))
                .filter_map(|part| part.get("text").and_then(JsonValue::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        _ => None,
    }
}

/// The step pipeline.
struct StepBridge {
    registry: Arc<ToolRegistry>,
}

impl Bridge for StepBridge {
    type Ctx = StepContext;
    type Out = StepOutcome;
    const PIPELINE: &'static str = "step";

    fn context(&self, ctx: &StepContext) -> JsonValue {
        json!({
            "agentName": &*ctx.agent_name,
            "instanceKey": &*ctx.instance_key,
            "turnId": &*ctx.turn_id,
            "traceId": &*ctx.trace_id,
            "stepIndex": ctx.step_index,
            "inputEvent": input_event(&ctx.turn_id, &ctx.trace_id, &ctx.instance_key, &ctx.turn_input),
            "conversation": conversation_json(&ctx.conversation),
            "toolCatalog": &ctx.tool_catalog,
            "metadata": &ctx.metadata,
        })
    }

    fn apply(&self, ctx: &mut StepContext, changes: &JsonValue, layer: &LayerId) {
        apply_events(&mut ctx.conversation, changes, layer);
        apply_metadata(&mut ctx.metadata, changes);
        if let Some(JsonValue::Array(items)) = changes.get("toolCatalog") {
            ctx.tool_catalog = self.catalog(&ctx.tool_catalog, items, layer);
        }
    }

    fn after(&self, ctx: &StepContext) -> JsonValue {
        json!({"events": ctx.conversation.events(), "metadata": &ctx.metadata, "toolCatalog": &ctx.tool_catalog})
    }

    fn view(&self, _ctx: &StepContext, out: &StepOutcome) -> JsonValue {
        let results: Vec<JsonValue> = out
            .tool_calls
            .iter()
            .zip(&out.tool_results)
            .map(|(call, result)| tool_call_result(&call.id, &call.name, result))
            .collect();
        json!({
            "status": if out.failure.is_some() { "failed" } else { "completed" },
            "shouldContinue": out.should_continue,
            "toolCalls": &out.tool_calls,
            "toolResults": results,
            "metadata": &out.metadata,
        })
    }

    fn output(&self, returned: Option<JsonValue>, inner: Option<StepOutcome>, layer: &LayerId) -> StepOutcome {
        let Some(JsonValue::Object(result)) = returned else {
            return inner
                .unwrap_or_else(|| StepOutcome::failed(&*layer.name, "the step middleware returned no StepResult"));
        };
        let mut outcome = inner.unwrap_or_default();
        if let Some(JsonValue::Bool(go_on)) = result.get("shouldContinue") {
            outcome.should_continue = *go_on;
        }
        if let Some(JsonValue::Object(metadata)) = result.get("metadata") {
            outcome.metadata.clone_from(metadata);
        }
        if result.get("status").and_then(JsonValue::as_str) == Some("failed") && outcome.failure.is_none() {
            outcome.failure = Some(StepFailure::Layer(LayerFailure {
                pipeline: Pipeline::Step,
                layer: Some(layer.name.to_string()),
                message: "the step middleware returned status 'failed'".to_owned(),
            }));
        }
        outcome
    }

    fn failed(&self, failure: ToolFailure, layer: &LayerId) -> StepOutcome {
        StepOutcome::failed(&*layer.name, failure.message)
    }
}

impl StepBridge {
    /// The catalog a layer left, reusing the items it did not change (they
    /// keep their compiled schemas).
    fn catalog(&self, before: &ToolCatalog, items: &[JsonValue], layer: &LayerId) -> ToolCatalog {
        let registry = self.registry.snapshot();
        let mut catalog = ToolCatalog::with_capacity(items.len());
        for value in items {
            let name = value.get("name").and_then(JsonValue::as_str).unwrap_or_default();
            let known = before.get(name).or_else(|| registry.get(name).map(|tool| &tool.item));
            if let Some(known) = known.filter(|known| same_item(known, value)) {
                catalog.insert(known.clone());
                continue;
            }
            let source = known.map_or_else(|| ToolSource::extension(&*layer.extension), |k| k.source().clone());
            match catalog_item(value, &source) {
                Ok(item) => {
                    catalog.insert(item);
                }
                Err(message) => tracing::warn!(
                    target: "goondan::script",
                    layer = %layer.name,
                    "a tool catalog item the step middleware left was dropped: {message}"
                ),
            }
        }
        catalog
    }
}

/// Whether the JSON `value` describes `item` unchanged.
fn same_item(item: &ToolCatalogItem, value: &JsonValue) -> bool {
    let description = value.get("description").filter(|d| !d.is_null());
    let parameters = value.get("parameters").filter(|p| !p.is_null());
    description.and_then(JsonValue::as_str) == item.description()
        && description.is_none_or(JsonValue::is_string)
        && parameters == item.parameters().map(|p| p.raw())
}

/// A ToolResult as the original's `ToolCallResult`.
fn tool_call_result(tool_call_id: &str, tool_name: &str, result: &ToolResult) -> JsonValue {
    let mut view = serde_json::to_value(result).unwrap_or_default();
    if let Some(object) = view.as_object_mut() {
        object.insert("toolCallId".to_owned(), JsonValue::String(tool_call_id.to_owned()));
        object.insert("toolName".to_owned(), JsonValue::String(tool_name.to_owned()));
    }
    view
}

/// The toolCall pipeline.
struct ToolCallBridge;

impl Bridge for ToolCallBridge {
    type Ctx = ToolCallContext;
    type Out = ToolResult;
    const PIPELINE: &'static str = "toolCall";

    fn context(&self, ctx: &ToolCallContext) -> JsonValue {
        let scope = ctx.scope();
        json!({
            "agentName": &*scope.agent_name,
            "instanceKey": &*scope.instance_key,
            "turnId": &*scope.turn_id,
            "traceId": &*scope.trace_id,
            "stepIndex": scope.step_index,
            "toolName": ctx.tool_name(),
            "toolCallId": ctx.tool_call_id(),
            "args": &ctx.args,
            "metadata": &ctx.metadata,
        })
    }

    fn apply(&self, ctx: &mut ToolCallContext, changes: &JsonValue, _layer: &LayerId) {
        apply_metadata(&mut ctx.metadata, changes);
        if let Some(JsonValue::Object(args)) = changes.get("args") {
            ctx.args.clone_from(args);
        }
    }

    fn after(&self, ctx: &ToolCallContext) -> JsonValue {
        json!({"args": &ctx.args, "metadata": &ctx.metadata})
    }

    fn view(&self, ctx: &ToolCallContext, out: &ToolResult) -> JsonValue {
        tool_call_result(ctx.tool_call_id(), ctx.tool_name(), out)
    }

    fn output(&self, returned: Option<JsonValue>, inner: Option<ToolResult>, layer: &LayerId) -> ToolResult {
        let Some(value) = returned.filter(JsonValue::is_object) else {
            return inner.unwrap_or_else(|| {
                self.failed(ToolFailure::new("the toolCall middleware returned no ToolCallResult"), layer)
            });
        };
        match serde_json::from_value::<ToolResult>(value) {
            Ok(result) => result,
            Err(error) => self.failed(
                ToolFailure::new(format!(
                    "the toolCall middleware returned something that is not a ToolCallResult ({error})"
                )),
                layer,
            ),
        }
    }

    fn failed(&self, failure: ToolFailure, layer: &LayerId) -> ToolResult {
        let error: ToolError = failure.into_tool_error();
        ToolResult::error(ToolError {
            message: format!("toolCall middleware '{}' failed: {}", layer.name, error.message),
            ..error
        })
    }
}
