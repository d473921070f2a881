//! Script tools for goondan-rs: a bundle's own TypeScript/JavaScript Tool
//! modules (`spec.entry`), run unchanged in a real JavaScript runtime.
//!
//! - [`runtime`]: finding Bun (or Node ≥ 22.6, or `GOONDAN_JS_RUNTIME`).
//! - [`host`]: [`ScriptHost`], one lazily started, supervised host process
//!   speaking newline-delimited JSON frames over an inherited socket pair.
//! - [`protocol`]: the frames.
//! - [`tool`]: [`ScriptToolHandler`] and [`install_script_tools`].
//! - `tasks`: a tool's `ctx.tasks` — pending results its script completes
//!   later, kept per host process in the agent instance's task book.
//! - [`extension`]: Extensions — `register(api)` in the host, their
//!   middleware as layers on the agent's chains, their tools in its registry.
//! - [`connector`]: Connectors users write — a Connection's `entry` module
//!   run in a supervised host process of its own ([`connector::start`]).
//! - [`plugin`]: [`ScriptPlugin`], both installed into each agent being
//!   assembled, sharing one host per agent.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # fn wire(bundle: &goondan_config::Bundle, agent: &goondan_config::Resource<goondan_config::AgentSpec>,
//! #         registry: &goondan_tools::ToolRegistry) -> Result<(), goondan_tools::RegistryError> {
//! let tools = goondan_tools::assembly::AgentTools::for_agent(bundle, agent);
//! let host = goondan_script::ScriptHost::from_process_env(); // starts nothing yet
//! goondan_script::install_script_tools(registry, &tools, &host)?;
//! # Ok(()) }
//! ```

pub mod connector;
pub mod extension;
pub mod host;
pub mod plugin;
pub mod protocol;
pub mod runtime;
mod tasks;
pub mod tool;

pub use connector::ScriptConnector;
pub use extension::{ExtensionToolHandler, install_script_extensions};
pub use host::{
    CANCEL_GRACE, EnvLookup, ExtensionLoad, FD_ENV, HostServices, LoadedExtension, MiddlewareSession, ScriptHost,
    ScriptHostBuilder, SessionEvent,
};
pub use plugin::ScriptPlugin;
pub use runtime::{DiscoverError, JsRuntime, RUNTIME_ENV, RuntimeKind};
pub use tool::{ScriptToolHandler, install_script_tools};
