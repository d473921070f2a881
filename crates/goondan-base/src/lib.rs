//! Native handlers for the built-in tools of the `@goondan/base` package.
//!
//! The manifests (names, exports, parameter schemas) live in
//! `goondan-config`'s built-in package, identical to the original's so that
//! existing bundles work; this crate supplies the code behind them.
//! [`native_handler`] maps `(tool, export)` to a handler.

use std::sync::Arc;

use goondan_tools::ToolHandler;
use goondan_tools::assembly::AgentTools;

pub mod agents;
pub mod args;
pub mod bash;
mod bash_background;
mod bot_api;
pub mod file_system;
mod files;
pub mod http_fetch;
mod http_io;
pub mod json_query;
pub mod net_guard;
pub mod paths;
pub mod protect;
pub mod self_restart;
pub mod settings;
pub mod slack;
pub mod tasks;
pub mod telegram;
pub mod text_transform;
pub mod tool_processes;
mod utf8;
pub mod wait;

#[cfg(test)]
mod test_http;
#[cfg(test)]
mod test_support;

pub use settings::BaseSettings;

/// The package name under which these tools are referenced.
pub const BASE_PACKAGE: &str = "@goondan/base";

/// The native handler of `tool`'s `export`, if this build has one.
pub fn native_handler(tool: &str, export: &str, settings: &Arc<BaseSettings>) -> Option<Arc<dyn ToolHandler>> {
    match tool {
        "agents" => agents::handler(export),
        "bash" => bash::handler(export, settings),
        "file-system" => file_system::handler(export, settings),
        "http-fetch" => http_fetch::handler(export, settings),
        "telegram" => telegram::handler(export, settings),
        "slack" => slack::handler(export, settings),
        "json-query" => json_query::handler(export),
        "text-transform" => text_transform::handler(export),
        "wait" => wait::handler(export),
        "tasks" => tasks::handler(export),
        "self-restart" => self_restart::handler(export),
        _ => None,
    }
}

/// Registers the native handler of every `@goondan/base` export among
/// `tools` (an agent's registry tools: the declared ones, then the
/// bundle's others, see [`AgentTools::registry_tools`]) that this build
/// implements.
///
/// Exports already registered under the same name are left alone, so a
/// caller may register several agents' tools into one registry. The rest are
/// registered in two changes, the declared ones all or none, then the
/// undeclared ones ([`goondan_tools::ToolRegistry::register_undeclared`]),
/// so a registry shared with a running agent never holds half an agent's
/// tools.
pub fn register_native_tools(
    registry: &goondan_tools::ToolRegistry,
    tools: &AgentTools,
    settings: &Arc<BaseSettings>,
) -> Result<usize, goondan_tools::RegistryError> {
    let present = registry.snapshot();
    let with_sandbox;
    let settings = match tools.sandbox() {
        Some(sandbox) => {
            with_sandbox =
                Arc::new(BaseSettings { sandbox: Some(Arc::clone(sandbox)), ..BaseSettings::clone(settings) });
            &with_sandbox
        }
        None => settings,
    };
    // `file-system` gets the agent's guard: the bundle's files and its own config.
    let file_system_settings = |config: Option<&goondan_core::JsonObject>| {
        let fs_guard = protect::FsGuard::new(tools.loaded_files(), config).with_bundle_tree(tools.bundle_root());
        Arc::new(BaseSettings { fs_guard, ..BaseSettings::clone(settings) })
    };
    // An agent may declare the same export twice; register it once.
    let mut chosen = std::collections::HashSet::new();
    let mut batch = Vec::new();
    let mut undeclared = Vec::new();
    let declared = tools.iter().len();
    for (index, tool) in tools.registry_tools().enumerate() {
        let name = tool.item.name();
        if tool.scope != goondan_config::PackageScope::Base || present.contains(name) || chosen.contains(name) {
            continue;
        }
        let tool_settings = if &*tool.tool == "file-system" {
            file_system_settings(tool.config.as_deref())
        } else {
            Arc::clone(settings)
        };
        if let Some(handler) = native_handler(&tool.tool, &tool.export, &tool_settings) {
            chosen.insert(name);
            let batch = if index < declared { &mut batch } else { &mut undeclared };
            batch.push((tool.item.clone(), handler));
        }
    }
    let registered = batch.len() + undeclared.len();
    registry.register_all(batch)?;
    registry.register_undeclared(undeclared)?;
    Ok(registered)
}
