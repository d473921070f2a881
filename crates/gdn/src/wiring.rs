//! What `gdn` plugs into the runtime: the native `@goondan/base` tools.

use std::sync::Arc;

use goondan_base::BaseSettings;
use goondan_runtime::agent::{EnvLookup, ToolInstaller};
use goondan_tools::ToolRegistry;
use goondan_tools::assembly::AgentTools;

/// Installs the native handler of every `@goondan/base` export an agent
/// declares, with operator settings read from the agent's environment.
pub fn native_tools() -> ToolInstaller {
    Arc::new(|registry: &ToolRegistry, tools: &AgentTools, env: &EnvLookup| {
        let settings = Arc::new(BaseSettings::from_lookup(|name| env(name)));
        goondan_base::register_native_tools(registry, tools, &settings).map(|_| ())
    })
}
