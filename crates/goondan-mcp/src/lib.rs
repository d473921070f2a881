//! MCP for goondan-rs. The client: the tools of the MCP servers an agent's
//! `Extension/mcp` names join its Tool Catalog as `SERVER__TOOL`, and run
//! through the same validation, middleware and executor as every tool.
//!
//! [`install`] reads the extension's config ([`config`]), starts each stdio
//! server and lists its tools ([`client`]), names them ([`names`]) and
//! registers a [`handler::McpToolHandler`] for each with the server's
//! description and `inputSchema`, so arguments are validated against that
//! schema before anything is sent. A server that fails to start is reported
//! by name and left out; the agent keeps its other servers and tools.
//! Streamable-HTTP servers are reached through the SDK's HTTP client. A
//! step layer takes a server's changed tools into the catalog at the next
//! step.
//!
//! The other direction, [`server`], offers an agent's own catalog to MCP
//! clients (`gdn mcp serve`), each call through the agent's pipeline.

pub mod client;
pub mod config;
pub mod handler;
pub mod names;
pub mod server;

use std::collections::HashSet;
use std::sync::Arc;

use goondan_core::ids::SpanIdGenerator;
use goondan_runtime::context::{StepContext, StepOutcome};
use goondan_runtime::extension::{AgentExtension, ExtensionError, ExtensionSetup, PluginInstall};
use goondan_tools::{
    AsyncMiddleware, BoxFuture, EventSink, Next, ToolCatalogItem, ToolHandler, ToolRegistry, ToolSource, async_layer,
};
use rmcp::model::Tool;
use tokio::task::JoinSet;

use crate::client::Server;
use crate::handler::McpToolHandler;

/// The name of the base package's MCP extension.
pub const EXTENSION_NAME: &str = "mcp";

/// The priority of the step layer that takes servers' changed tools into
/// the catalog: outermost, so every other layer sees the current tools.
pub const REFRESH_LAYER_PRIORITY: i32 = i32::MIN;

/// The build's plugin for `Extension/mcp`: it claims the packaged extension
/// named [`EXTENSION_NAME`] and [`install`]s it.
#[derive(Debug, Clone, Copy, Default)]
pub struct McpPlugin;

impl PluginInstall for McpPlugin {
    fn claims(&self, extension: &AgentExtension) -> bool {
        extension.scope == goondan_config::PackageScope::Base && extension.name == EXTENSION_NAME
    }

    fn install_extension<'a>(
        &'a mut self,
        setup: &'a mut ExtensionSetup<'_>,
        extension: &'a AgentExtension,
    ) -> BoxFuture<'a, Result<(), ExtensionError>> {
        Box::pin(async move { install(setup, extension).await.map(|_| ()) })
    }
}

/// What [`install`] did, for callers and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstallReport {
    /// The catalog names registered, in order.
    pub tools: Vec<String>,
    /// Each server that is not available, with why.
    pub failed: Vec<(String, String)>,
}

/// What the catalog entries of one server's tools are built with.
struct EntryMaker {
    agent: Arc<str>,
    extension: String,
    events: Arc<dyn EventSink>,
    span_ids: Arc<SpanIdGenerator>,
}

impl EntryMaker {
    /// The catalog items and handlers of `tools`, named around the names in
    /// `taken` (which receives theirs).
    fn entries(
        &self,
        server: &Arc<Server>,
        tools: &[Tool],
        taken: &mut HashSet<String>,
    ) -> Vec<(ToolCatalogItem, Arc<dyn ToolHandler>)> {
        let name = server.name();
        let originals: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
        let (catalog_names, notices) = names::assign_names(name, &originals, taken);
        for notice in notices {
            tracing::warn!("agent '{}': MCP server '{name}': {notice}", self.agent);
        }
        let source = ToolSource::mcp(&self.extension, name);
        tools
            .iter()
            .zip(catalog_names)
            .map(|(tool, catalog_name)| {
                let mut item = ToolCatalogItem::new(catalog_name.as_str(), source.clone())
                    .with_parameters(serde_json::Value::Object((*tool.input_schema).clone()));
                if let Some(description) = &tool.description {
                    item = item.with_description(description.as_ref());
                }
                let handler = McpToolHandler::new(Arc::clone(server), tool.name.as_ref())
                    .with_progress_events(Arc::clone(&self.events), Arc::clone(&self.span_ids));
                (item, Arc::new(handler) as Arc<dyn ToolHandler>)
            })
            .collect()
    }
}

/// Installs `extension` (an `Extension/mcp` use) into the agent `setup`
/// assembles. Only an unusable config fails the agent; a server that does
/// not start is logged as a warning and reported in the result.
pub async fn install(
    setup: &mut ExtensionSetup<'_>,
    extension: &AgentExtension,
) -> Result<InstallReport, ExtensionError> {
    let env = Arc::clone(setup.env);
    let parsed = config::parse_config(&extension.config, &|name| env(name))
        .map_err(|e| ExtensionError::new(&extension.name, "E_EXT_INIT", e.to_string()))?;
    let agent = Arc::clone(&setup.tooling.agent_name);
    let mut report = InstallReport::default();

    // Servers start concurrently; their tools are registered in config order.
    let mut starting = JoinSet::new();
    for (index, (name, server)) in parsed.servers.iter().enumerate() {
        let sandbox = server_sandbox(&setup.tooling.tools, name, server)
            .map_err(|e| ExtensionError::new(&extension.name, "E_EXT_INIT", e))?;
        let (name, server) = (name.clone(), server.clone());
        starting.spawn(async move { (index, Server::start_in(&name, server, sandbox).await) });
    }
    let mut started = Vec::with_capacity(parsed.servers.len());
    while let Some(joined) = starting.join_next().await {
        match joined {
            Ok(result) => started.push(result),
            Err(error) => tracing::error!("agent '{agent}': an MCP server start task failed: {error}"),
        }
    }
    started.sort_by_key(|(index, _)| *index);

    let maker = Arc::new(EntryMaker {
        agent: Arc::clone(&agent),
        extension: extension.name.clone(),
        events: Arc::clone(&setup.tooling.events),
        span_ids: Arc::new(SpanIdGenerator::new()),
    });
    let registry: &Arc<ToolRegistry> = setup.tooling.registry();
    // A Tool of the bundle the agent does not declare gives way to a server's tool.
    let mut taken: HashSet<String> =
        registry.snapshot().iter().filter(|tool| !tool.undeclared).map(|tool| tool.item.name().to_owned()).collect();
    let mut running = Vec::with_capacity(started.len());
    for (index, result) in started {
        let Some((name, _)) = parsed.servers.get_index(index) else { continue };
        let (server, tools) = match result {
            Ok(started) => started,
            Err(error) => {
                report.failed.push((name.clone(), error.to_string()));
                continue;
            }
        };
        for (item, handler) in maker.entries(&server, &tools, &mut taken) {
            let catalog_name = item.name().to_owned();
            match registry.register(item, handler) {
                Ok(()) => report.tools.push(catalog_name),
                Err(error) => tracing::warn!("agent '{agent}': MCP server '{name}': {error}"),
            }
        }
        tracing::debug!("agent '{agent}': MCP server '{name}' offers {} tools", tools.len());
        if let Some(tasks) = &setup.tooling.tasks {
            resume_tasks(&server, tasks);
        }
        running.push(server);
    }
    for (name, why) in &report.failed {
        tracing::warn!(
            "agent '{agent}': MCP server '{name}' is not available: {why}; the agent runs without its tools"
        );
        emit_unavailable(setup, &extension.name, name, why);
    }
    if !running.is_empty() {
        let layer = RefreshLayer { servers: running, registry: Arc::clone(registry), maker };
        setup.tooling.step_middleware.register(
            format!("{}:refresh", extension.name),
            REFRESH_LAYER_PRIORITY,
            async_layer(layer),
        );
    }
    Ok(report)
}

/// The sandbox a stdio server's `sandbox` config names: over the agent's
/// workdir with its protected files, paths relative to the bundle, and its
/// own program readable (found on `PATH` like the spawn will).
fn server_sandbox(
    tools: &goondan_tools::assembly::AgentTools,
    name: &str,
    server: &config::ServerConfig,
) -> Result<Option<Arc<goondan_sandbox::Sandbox>>, String> {
    let config::ServerConfig::Stdio(stdio) = server else { return Ok(None) };
    let Some(sandbox) = &stdio.sandbox else { return Ok(None) };
    let root = tools.bundle_root();
    let (workdir, protected) = match tools.sandbox() {
        Some(agent) => (agent.spec().workdir.clone(), agent.spec().protected.clone()),
        None => (root.to_path_buf(), tools.loaded_files().to_vec()),
    };
    let mut spec = goondan_runtime::sandbox::sandbox_spec(sandbox, root, &workdir, protected)
        .map_err(|e| format!("server '{name}': sandbox: {e}"))?;
    spec.readable.extend(program_dir(&stdio.command));
    Ok(Some(Arc::new(goondan_sandbox::Sandbox::new(spec))))
}

/// The directory of `command` as the spawn would find it (itself when it
/// has a slash, else the first match on `PATH`), links resolved.
fn program_dir(command: &str) -> Option<std::path::PathBuf> {
    let found = if command.contains('/') {
        Some(std::path::PathBuf::from(command))
    } else {
        std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(command)).find(|path| path.is_file())
    }?;
    std::fs::canonicalize(found).ok()?.parent().map(std::path::Path::to_path_buf)
}

/// Follows again the server's tasks that an earlier process of this
/// instance followed (a server reached over HTTP runs them on when that
/// process ends): each working task whose `resume` names this server.
fn resume_tasks(server: &Arc<client::Server>, tasks: &Arc<dyn goondan_tools::tasks::ToolTasks>) {
    for task in tasks.list() {
        let Some(resume) = task.resume.as_ref() else { continue };
        if task.state.is_final()
            || resume.get("kind").and_then(serde_json::Value::as_str) != Some(handler::RESUME_KIND)
            || resume.get("server").and_then(serde_json::Value::as_str) != Some(server.name())
        {
            continue;
        }
        let (Some(task_id), Some(ticket)) = (
            resume.get("mcpTaskId").and_then(serde_json::Value::as_str).map(str::to_owned),
            tasks.reattach(&task.handle),
        ) else {
            continue;
        };
        let tool = resume.get("tool").and_then(serde_json::Value::as_str).unwrap_or_default().to_owned();
        let (server, tasks) = (Arc::clone(server), Arc::clone(tasks));
        // Detached by design: it hands over to `follow_in_background`, owned by the task book.
        tokio::spawn(async move {
            let handle = ticket.handle.clone();
            let found = match server.connection().await {
                Ok(connection) => connection
                    .peer()
                    .get_task(rmcp::model::GetTaskParams::new(task_id.clone()))
                    .await
                    .map(|got| (connection, got.task.task))
                    .map_err(|error| error.to_string()),
                Err(error) => Err(error.to_string()),
            };
            match found {
                Ok((connection, mcp_task)) => {
                    tracing::info!("MCP server '{}': following task {task_id} ({handle}) again", server.name());
                    handler::follow_in_background(server, tool, tasks, ticket, connection, mcp_task);
                }
                Err(why) => {
                    let end = goondan_tools::tasks::TaskEnd::Failed(format!(
                        "MCP server '{}': its task {task_id} could not be followed again after a restart: {why}",
                        server.name()
                    ));
                    let _ = tasks.finish(&handle, end).await;
                }
            }
        });
    }
}

/// The event of a server that did not start: in the instance's event log
/// beside the warning on stderr.
pub const SERVER_UNAVAILABLE_EVENT: &str = "mcp.server.unavailable";

fn emit_unavailable(setup: &ExtensionSetup<'_>, extension: &str, server: &str, why: &str) {
    let events = &setup.tooling.events;
    if !events.enabled() {
        return;
    }
    let payload = serde_json::json!({"extension": extension, "server": server, "error": why});
    let trace_id = goondan_core::ids::new_trace_id();
    events.emit(&goondan_tools::RuntimeEvent {
        kind: goondan_tools::EventKind::Custom(SERVER_UNAVAILABLE_EVENT),
        trace_id: &trace_id,
        span_id: SpanIdGenerator::new().next_raw(),
        parent_span_id: None,
        timestamp_ms: goondan_core::message::now_millis(),
        agent_name: &setup.tooling.agent_name,
        instance_key: &setup.tooling.instance_key,
        // Outside any turn: the agent is being assembled.
        turn_id: "",
        step_id: None,
        tool: None,
        extra: Some(&payload),
        call_scope: None,
    });
}

/// Takes servers' changed tools (after `tools/list_changed` or a restart)
/// into the registry and the step's catalog before the step runs.
struct RefreshLayer {
    servers: Vec<Arc<Server>>,
    registry: Arc<ToolRegistry>,
    maker: Arc<EntryMaker>,
}

impl RefreshLayer {
    async fn refresh(&self, server: &Arc<Server>, ctx: &mut StepContext) {
        let name = server.name();
        let agent = &self.maker.agent;
        let tools = match server.changed_tools().await {
            Ok(Some(tools)) => tools,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!("agent '{agent}': MCP server '{name}': its tools changed but cannot be listed: {error}");
                return;
            }
        };
        let source = ToolSource::mcp(&self.maker.extension, name);
        let mut taken: HashSet<String> = self
            .registry
            .snapshot()
            .iter()
            .filter(|tool| tool.item.source() != &source && !tool.undeclared)
            .map(|tool| tool.item.name().to_owned())
            .collect();
        let entries = self.maker.entries(server, &tools, &mut taken);
        let items: Vec<ToolCatalogItem> = entries.iter().map(|(item, _)| item.clone()).collect();
        if let Err(error) = self.registry.replace_source(&source, entries) {
            tracing::warn!("agent '{agent}': MCP server '{name}': its new tools were refused: {error}");
            return;
        }
        ctx.tool_catalog.retain(|item| item.source() != &source);
        let count = items.len();
        for item in items {
            ctx.tool_catalog.insert(item);
        }
        tracing::info!("agent '{agent}': MCP server '{name}' now offers {count} tools");
    }
}

impl AsyncMiddleware<StepContext, StepOutcome> for RefreshLayer {
    async fn handle<'a>(&'a self, ctx: &'a mut StepContext, next: Next<'a, StepContext, StepOutcome>) -> StepOutcome {
        for server in &self.servers {
            if server.may_have_changed() {
                self.refresh(server, ctx).await;
            }
        }
        next.run(ctx).await
    }
}
