//! Script tools: a [`ToolHandler`] per export of a Tool module, and the
//! installer that registers them for an agent.

use std::path::Path;
use std::sync::Arc;

use goondan_core::{JsonObject, JsonValue};
use goondan_tools::assembly::AgentTools;
use goondan_tools::{BoxFuture, HandlerResult, RegistryError, ToolContext, ToolFailure, ToolHandler, ToolRegistry};
use serde_json::json;

use crate::host::ScriptHost;

/// Runs one export of one Tool module in the [`ScriptHost`].
#[derive(Debug, Clone)]
pub struct ScriptToolHandler {
    host: Arc<ScriptHost>,
    module: Arc<Path>,
    export: Arc<str>,
}

impl ScriptToolHandler {
    /// The handler of `export` in `module` (an absolute path).
    pub fn new(host: Arc<ScriptHost>, module: Arc<Path>, export: impl Into<Arc<str>>) -> Self {
        Self { host, module, export: export.into() }
    }

    /// The module.
    pub fn module(&self) -> &Path {
        &self.module
    }

    /// The export.
    pub fn export(&self) -> &str {
        &self.export
    }
}

impl ToolHandler for ScriptToolHandler {
    fn call<'a>(&'a self, ctx: &'a ToolContext, input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            let js_ctx = context_json(ctx);
            self.host.call(&self.module, &self.export, input, &js_ctx, ctx).await
        })
    }
}

/// `ctx.runtime.METHOD(...)` of a JavaScript tool, with the original's
/// signatures: `request(target, event, options?)`, `send(target, event)`,
/// `spawn(target, options?)`, `list(options?)`, `catalog()`, where `event`
/// is `{type?, input?, instanceKey?, metadata?}` — read by the
/// agent-to-agent contract, so with the `agents` tool's rules; the answer is
/// that tool's output. `tool` is the calling tool's context (`None`: the
/// call is over). A refusal reads `ctx.runtime.METHOD: CODE: message`.
pub(crate) async fn tool_runtime(
    tool: Option<ToolContext>,
    method: &str,
    params: &JsonValue,
) -> Result<JsonValue, String> {
    use goondan_core::codes::E_AGENTS_UNAVAILABLE;
    use goondan_tools::agents::{self, MessageFields, SpawnFields};

    let Some(ctx) = tool else {
        return Err(format!("ctx.runtime.{method}: the tool call has ended"));
    };
    let Some(runtime) = ctx.runtime().cloned() else {
        return Err(format!(
            "ctx.runtime.{method}: {E_AGENTS_UNAVAILABLE}: the agent runs without an orchestrator (gdn run starts one for the swarm)"
        ));
    };
    let refused = |failure: ToolFailure| refusal("ctx.runtime", method, failure);
    match method {
        "request" => {
            let request = MessageFields::runtime_call(params).and_then(MessageFields::request);
            let request = request.map_err(|error| refused(error.into()))?;
            runtime.request(&ctx, request).await.map(|answer| answer.tool_output()).map_err(refused)
        }
        "send" => {
            let request = MessageFields::runtime_call(params).and_then(MessageFields::send);
            let request = request.map_err(|error| refused(error.into()))?;
            runtime.send(&ctx, request).await.map(|receipt| receipt.tool_output()).map_err(refused)
        }
        "spawn" => {
            let request = SpawnFields::runtime_call(params).and_then(SpawnFields::spawn);
            runtime.spawn(&ctx, request.map_err(|error| refused(error.into()))?).await.map_err(refused)
        }
        "list" => {
            let include_all = agents::runtime_include_all(params).map_err(|error| refused(error.into()))?;
            runtime.list(&ctx, include_all).await.map_err(refused)
        }
        "catalog" => runtime.catalog(&ctx).await.map_err(refused),
        other => Err(format!("ctx.runtime has no method '{other}'")),
    }
}

/// How a refusal reaches a script: `API.METHOD: CODE: message` (the host's
/// errors are plain `Error`s, so the code travels in the message).
pub(crate) fn refusal(api: &str, method: &str, failure: ToolFailure) -> String {
    match failure.code {
        Some(code) => format!("{api}.{method}: {code}: {}", failure.message),
        None => format!("{api}.{method}: {}", failure.message),
    }
}

/// The JSON part of the JavaScript ToolContext; the host adds `logger` and
/// `runtime`. Never `swarmBundle` or `oauth` (spec 000 §12.5 rule 3).
/// `traceparent` (W3C) names the call's span, so a tool can continue the
/// trace in what it calls (an addition of goondan-rs).
pub(crate) fn context_json(ctx: &ToolContext) -> JsonValue {
    json!({
        "agentName": ctx.agent_name(),
        "instanceKey": ctx.instance_key(),
        "turnId": ctx.turn_id(),
        "traceId": &*ctx.scope().trace_id,
        "traceparent": ctx.traceparent(),
        "toolCallId": ctx.tool_call_id(),
        "toolName": ctx.tool_name(),
        "message": serde_json::to_value(ctx.message()).unwrap_or(JsonValue::Null),
        "workdir": ctx.workdir().to_string_lossy(),
    })
}

/// Registers a [`ScriptToolHandler`] for every registry tool of `tools`
/// ([`AgentTools::registry_tools`]: the declared ones and the bundle's
/// others) that has a module (`entry`) and no handler yet; returns how many
/// it registered: the declared ones all or none, then the undeclared ones
/// ([`ToolRegistry::register_undeclared`]). Nothing starts: the host
/// starts, and loads a module, at the first call.
pub fn install_script_tools(
    registry: &ToolRegistry,
    tools: &AgentTools,
    host: &Arc<ScriptHost>,
) -> Result<usize, RegistryError> {
    let snapshot = registry.snapshot();
    let mut added: Vec<(goondan_tools::ToolCatalogItem, Arc<dyn ToolHandler>)> = Vec::new();
    let mut undeclared: Vec<(goondan_tools::ToolCatalogItem, Arc<dyn ToolHandler>)> = Vec::new();
    let declared = tools.iter().len();
    for (index, tool) in tools.registry_tools().enumerate() {
        let Some(entry) = &tool.entry else { continue };
        let name = tool.item.name();
        if snapshot.contains(name) || added.iter().chain(&undeclared).any(|(item, _)| item.name() == name) {
            continue;
        }
        let handler = ScriptToolHandler::new(Arc::clone(host), Arc::clone(entry), Arc::clone(&tool.export));
        let batch = if index < declared { &mut added } else { &mut undeclared };
        batch.push((tool.item.clone(), Arc::new(handler)));
    }
    let count = added.len() + undeclared.len();
    registry.register_all(added)?;
    registry.register_undeclared(undeclared)?;
    Ok(count)
}
