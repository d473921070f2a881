//! Script tools: a [`ToolHandler`] per export of a Tool module, and the
//! installer that registers them for an agent.

use std::path::Path;
use std::sync::Arc;

use goondan_core::{JsonObject, JsonValue};
use goondan_tools::assembly::AgentTools;
use goondan_tools::{BoxFuture, HandlerResult, RegistryError, ToolContext, ToolHandler, ToolRegistry};
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
/// is `{type?, input?, instanceKey?, metadata?}`. The same runtime, and so
/// the same checks, as the `agents` tool; the answer is the runtime's
/// output. `tool` is the calling tool's context (`None`: the call is over).
pub(crate) async fn tool_runtime(
    tool: Option<ToolContext>,
    method: &str,
    params: &JsonValue,
) -> Result<JsonValue, String> {
    use goondan_core::codes::E_AGENTS_UNAVAILABLE;
    use goondan_tools::context::{AgentMessageRequest, AgentSpawnRequest};

    let Some(ctx) = tool else {
        return Err(format!("ctx.runtime.{method}: the tool call has ended"));
    };
    let Some(runtime) = ctx.runtime().cloned() else {
        return Err(format!(
            "ctx.runtime.{method}: {E_AGENTS_UNAVAILABLE}: the agent runs without an orchestrator (gdn run starts one for the swarm)"
        ));
    };
    let object = |key: &str| params.get(key).and_then(JsonValue::as_object).cloned().unwrap_or_default();
    let (event, options) = (object("event"), object("options"));
    let text = |map: &JsonObject, key: &str| {
        map.get(key).and_then(JsonValue::as_str).map(str::trim).filter(|t| !t.is_empty()).map(str::to_owned)
    };
    let target = || {
        params
            .get("target")
            .and_then(JsonValue::as_str)
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| format!("ctx.runtime.{method}: 'target' must be a non-empty string"))
    };
    let message = |request: bool| -> Result<AgentMessageRequest, String> {
        Ok(AgentMessageRequest {
            target: target()?,
            input: text(&event, "input").unwrap_or_default(),
            instance_key: text(&event, "instanceKey"),
            event_type: Some(
                text(&event, "type").unwrap_or_else(|| if request { "agent.request" } else { "agent.send" }.to_owned()),
            ),
            metadata: event.get("metadata").and_then(JsonValue::as_object).cloned().unwrap_or_default(),
            // The original's default, and whole positive milliseconds only.
            timeout_ms: request
                .then(|| options.get("timeoutMs").and_then(JsonValue::as_u64).filter(|ms| *ms > 0).unwrap_or(60_000)),
            asynchronous: request && options.get("async").and_then(JsonValue::as_bool).unwrap_or(false),
        })
    };
    let answered = match method {
        "request" => runtime.request(&ctx, message(true)?).await,
        "send" => runtime.send(&ctx, message(false)?).await,
        "spawn" => {
            let request = AgentSpawnRequest {
                target: target()?,
                instance_key: text(&options, "instanceKey"),
                cwd: text(&options, "cwd"),
            };
            runtime.spawn(&ctx, request).await
        }
        "list" => runtime.list(&ctx, options.get("includeAll").and_then(JsonValue::as_bool).unwrap_or(false)).await,
        "catalog" => runtime.catalog(&ctx).await,
        other => return Err(format!("ctx.runtime has no method '{other}'")),
    };
    answered.map_err(|failure| match failure.code {
        Some(code) => format!("ctx.runtime.{method}: {code}: {}", failure.message),
        None => format!("ctx.runtime.{method}: {}", failure.message),
    })
}

/// The JSON part of the JavaScript ToolContext; the host adds `logger` and
/// `runtime`. Never `swarmBundle` or `oauth` (spec 000 §12.5 rule 3).
pub(crate) fn context_json(ctx: &ToolContext) -> JsonValue {
    json!({
        "agentName": ctx.agent_name(),
        "instanceKey": ctx.instance_key(),
        "turnId": ctx.turn_id(),
        "traceId": &*ctx.scope().trace_id,
        "toolCallId": ctx.tool_call_id(),
        "toolName": ctx.tool_name(),
        "message": serde_json::to_value(ctx.message()).unwrap_or(JsonValue::Null),
        "workdir": ctx.workdir().to_string_lossy(),
    })
}

/// Registers a [`ScriptToolHandler`] for every tool of `tools` that has a
/// module (`entry`) and no handler yet; returns how many it registered. All
/// or none are registered.
pub fn install_script_tools(
    registry: &ToolRegistry,
    tools: &AgentTools,
    host: &Arc<ScriptHost>,
) -> Result<usize, RegistryError> {
    let snapshot = registry.snapshot();
    let mut added: Vec<(goondan_tools::ToolCatalogItem, Arc<dyn ToolHandler>)> = Vec::new();
    for tool in tools.iter() {
        let Some(entry) = &tool.entry else { continue };
        if snapshot.contains(tool.item.name()) || added.iter().any(|(item, _)| item.name() == tool.item.name()) {
            continue;
        }
        let handler = ScriptToolHandler::new(Arc::clone(host), Arc::clone(entry), Arc::clone(&tool.export));
        added.push((tool.item.clone(), Arc::new(handler)));
    }
    let count = added.len();
    registry.register_all(added)?;
    Ok(count)
}
