//! What `gdn` plugs into the runtime: the native `@goondan/base` tools and
//! the bundle's script tools (run by a JavaScript host started at their first call).

use std::sync::Arc;

use goondan_base::BaseSettings;
use goondan_runtime::agent::{EnvLookup, ToolInstaller};
use goondan_script::ScriptHost;
use goondan_tools::ToolRegistry;
use goondan_tools::assembly::AgentTools;

/// Installs the native handler of every `@goondan/base` export an agent
/// declares (operator settings read from the agent's environment), and a
/// script handler for every Tool of the bundle with a `spec.entry`. The
/// JavaScript host is created only when the agent has script tools, and
/// started only when one is called.
pub fn agent_tools() -> ToolInstaller {
    Arc::new(|registry: &ToolRegistry, tools: &AgentTools, env: &EnvLookup| {
        let settings = Arc::new(BaseSettings::from_lookup(|name| env(name)));
        goondan_base::register_native_tools(registry, tools, &settings)?;
        if tools.iter().any(|tool| tool.entry.is_some()) {
            let host = ScriptHost::new(Arc::clone(env));
            goondan_script::install_script_tools(registry, tools, &host)?;
        }
        Ok(())
    })
}
