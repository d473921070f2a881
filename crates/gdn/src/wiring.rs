//! What `gdn` plugs into the runtime: the native `@goondan/base` tools, the
//! base package's MCP client (`Extension/mcp`), the native base extensions,
//! and the JavaScript host for the bundle's own script tools and
//! extensions — each an [`AgentPlugin`](goondan_runtime::extension::AgentPlugin) that installs itself into every
//! agent being assembled.

use std::sync::Arc;

use goondan_base::BaseSettings;
use goondan_base::tool_processes::ToolProcesses;
use goondan_runtime::agent::{AgentOptions, EnvLookup};
use goondan_runtime::extension::PluginInstall;
use goondan_tools::assembly::AgentTools;
use goondan_tools::{RegistryError, ToolRegistry};

/// Sets `options` to install, for each agent it assembles, in this order:
/// the native handler of every `@goondan/base` export in the agent's
/// registry (those it declares, and those other agents of the bundle
/// declare; operator settings read from its environment), `Extension/mcp`,
/// the native base extensions, and the bundle's own script tools (every
/// Tool of the bundle: the registry holds them all, the catalog offers the
/// agent's) and JavaScript extensions (one host per assembled agent, made
/// only when it has either, started at the first script call, or at
/// assembly for extensions).
/// A base extension none of them implements is left out with a warning.
pub fn install(options: &mut AgentOptions, tool_processes: &Arc<ToolProcesses>) {
    options.plugins = vec![
        Arc::new(NativeTools { tool_processes: Arc::clone(tool_processes) }),
        Arc::new(goondan_mcp::McpPlugin),
        Arc::new(goondan_extensions::BaseExtensions),
        Arc::new(goondan_script::ScriptPlugin::new()),
    ];
}

/// The native handlers of the `@goondan/base` tools.
#[derive(Debug, Clone)]
struct NativeTools {
    tool_processes: Arc<ToolProcesses>,
}

impl PluginInstall for NativeTools {
    fn install_tools(
        &mut self,
        registry: &ToolRegistry,
        tools: &AgentTools,
        env: &EnvLookup,
    ) -> Result<(), RegistryError> {
        let mut settings = BaseSettings::from_lookup(|name| env(name));
        settings.tool_processes = Arc::clone(&self.tool_processes);
        goondan_base::register_native_tools(registry, tools, &Arc::new(settings)).map(|_| ())
    }
}
