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
//! Streamable-HTTP servers are parsed but not yet connected to.
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

use goondan_runtime::extension::{AgentExtension, ExtensionError, ExtensionSetup};
use goondan_tools::{ToolCatalogItem, ToolRegistry, ToolSource};
use tokio::task::JoinSet;

use crate::client::Server;
use crate::config::ServerConfig;
use crate::handler::McpToolHandler;

/// The name of the base package's MCP extension.
pub const EXTENSION_NAME: &str = "mcp";

/// What [`install`] did, for callers and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstallReport {
    /// The catalog names registered, in order.
    pub tools: Vec<String>,
    /// Each server that is not available, with why.
    pub failed: Vec<(String, String)>,
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
        match server {
            ServerConfig::Stdio(spec) => {
                let (name, spec) = (name.clone(), spec.clone());
                starting.spawn(async move { (index, Server::start(&name, spec).await) });
            }
            ServerConfig::Http(_) => report
                .failed
                .push((name.clone(), "streamable HTTP servers are not supported by this build yet".to_owned())),
        }
    }
    let mut started = Vec::with_capacity(parsed.servers.len());
    while let Some(joined) = starting.join_next().await {
        match joined {
            Ok(result) => started.push(result),
            Err(error) => tracing::error!("agent '{agent}': an MCP server start task failed: {error}"),
        }
    }
    started.sort_by_key(|(index, _)| *index);

    let registry: &ToolRegistry = setup.tooling.registry();
    let mut taken: HashSet<String> = registry.snapshot().iter().map(|tool| tool.item.name().to_owned()).collect();
    for (index, result) in started {
        let Some((name, _)) = parsed.servers.get_index(index) else { continue };
        let (server, tools) = match result {
            Ok(started) => started,
            Err(error) => {
                report.failed.push((name.clone(), error.to_string()));
                continue;
            }
        };
        let originals: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
        let (catalog_names, notices) = names::assign_names(name, &originals, &mut taken);
        for notice in notices {
            tracing::warn!("agent '{agent}': MCP server '{name}': {notice}");
        }
        for (tool, catalog_name) in tools.iter().zip(catalog_names) {
            let mut item = ToolCatalogItem::new(catalog_name.as_str(), ToolSource::mcp(&extension.name, name))
                .with_parameters(serde_json::Value::Object((*tool.input_schema).clone()));
            if let Some(description) = &tool.description {
                item = item.with_description(description.as_ref());
            }
            let handler = McpToolHandler::new(Arc::clone(&server), tool.name.as_ref());
            match registry.register(item, Arc::new(handler)) {
                Ok(()) => report.tools.push(catalog_name),
                Err(error) => tracing::warn!("agent '{agent}': MCP server '{name}': {error}"),
            }
        }
        tracing::debug!("agent '{agent}': MCP server '{name}' offers {} tools", tools.len());
    }
    for (name, why) in &report.failed {
        tracing::warn!(
            "agent '{agent}': MCP server '{name}' is not available: {why}; the agent runs without its tools"
        );
    }
    Ok(report)
}
