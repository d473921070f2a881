//! What `gdn` plugs into the runtime: the native `@goondan/base` tools, the
//! base package's MCP client (`Extension/mcp`), the bundle's script tools
//! and its JavaScript extensions, which share one JavaScript host per agent.

use std::sync::{Arc, Mutex, PoisonError};

use goondan_base::BaseSettings;
use goondan_base::tool_processes::ToolProcesses;
use goondan_config::PackageScope;
use goondan_runtime::agent::{AgentOptions, EnvLookup};
use goondan_runtime::extension::{AgentExtension, ExtensionSetup};
use goondan_script::ScriptHost;
use goondan_tools::ToolRegistry;
use goondan_tools::assembly::AgentTools;

/// Sets `options` to install, for each agent it assembles: the native
/// handler of every `@goondan/base` export the agent declares (operator
/// settings read from its environment), a script handler for every Tool
/// with a `spec.entry`, and its extensions. One JavaScript host per
/// assembled agent, created only when it has script tools or JavaScript
/// extensions; tools alone start it at their first call, extensions at
/// assembly (their `register` decides the pipelines).
pub fn install(options: &mut AgentOptions, tool_processes: &Arc<ToolProcesses>) {
    // The host the tool installer made for the agent being assembled, for
    // its extensions (the two installers run one after the other).
    let assembling: Arc<Mutex<Option<Arc<ScriptHost>>>> = Arc::new(Mutex::new(None));
    let for_tools = Arc::clone(&assembling);
    let tool_processes = Arc::clone(tool_processes);
    options.install_tools = Arc::new(move |registry: &ToolRegistry, tools: &AgentTools, env: &EnvLookup| {
        let mut settings = BaseSettings::from_lookup(|name| env(name));
        settings.tool_processes = Arc::clone(&tool_processes);
        let settings = Arc::new(settings);
        goondan_base::register_native_tools(registry, tools, &settings)?;
        let host = if tools.iter().any(|tool| tool.entry.is_some()) {
            let host = ScriptHost::new(Arc::clone(env));
            goondan_script::install_script_tools(registry, tools, &host)?;
            Some(host)
        } else {
            None
        };
        *for_tools.lock().unwrap_or_else(PoisonError::into_inner) = host;
        Ok(())
    });
    options.install_extensions = Arc::new(move |mut setup: ExtensionSetup<'_>| {
        let host = assembling.lock().unwrap_or_else(PoisonError::into_inner).take();
        Box::pin(async move {
            let (scripts, packaged): (Vec<AgentExtension>, Vec<AgentExtension>) =
                setup.extensions.iter().cloned().partition(|extension| extension.scope == PackageScope::Local);
            for extension in &packaged {
                // The base package's MCP client is native.
                if extension.name == goondan_mcp::EXTENSION_NAME {
                    goondan_mcp::install(&mut setup, extension).await?;
                    continue;
                }
                if goondan_extensions::install(&mut setup, extension).await? {
                    continue;
                }
                tracing::warn!(
                    "agent '{}': extension '{}' of @goondan/base is not implemented by this build yet; the agent runs without it",
                    setup.tooling.agent_name,
                    extension.name
                );
            }
            if scripts.is_empty() {
                return Ok(());
            }
            let host = host.unwrap_or_else(|| ScriptHost::new(Arc::clone(setup.env)));
            goondan_script::install_script_extensions(setup, &scripts, &host).await
        })
    });
}
