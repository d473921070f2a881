//! The extensions of the `@goondan/base` package, implemented natively.
//!
//! Bundles written for the original reference them as `Extension/NAME`
//! (package `@goondan/base`) with the original's config fields. Each module
//! here installs one of them through the runtime's
//! [`ExtensionSetup`](goondan_runtime::extension::ExtensionSetup): its turn,
//! step and toolCall layers go on the same chains, and its tools into the
//! same registry, as JavaScript extensions' do. [`install`] picks the module
//! by the Extension's name.

use goondan_config::PackageScope;
use goondan_runtime::extension::{AgentExtension, ExtensionError, ExtensionSetup};

pub mod context_message;
mod fields;
mod inter_agent_response_format;
pub mod logging;
pub mod message_compaction;
pub mod message_integrity;
pub mod message_window;
mod required_tools_guard;
#[cfg(test)]
mod test_messages;
mod tool_search;

/// Installs `extension` when it is one of the base package's extensions this
/// crate implements; returns `Ok(false)` (and changes nothing) otherwise.
pub async fn install(setup: &mut ExtensionSetup<'_>, extension: &AgentExtension) -> Result<bool, ExtensionError> {
    if extension.scope != PackageScope::Base {
        return Ok(false);
    }
    match extension.name.as_str() {
        context_message::NAME => context_message::install(setup, extension)?,
        message_window::NAME => message_window::install(setup, extension)?,
        message_compaction::NAME => message_compaction::install(setup, extension)?,
        message_integrity::NAME => message_integrity::install(setup, extension)?,
        tool_search::NAME => tool_search::install(setup, extension).await?,
        required_tools_guard::NAME => required_tools_guard::install(setup, extension)?,
        logging::NAME => logging::install(setup, extension)?,
        inter_agent_response_format::NAME => inter_agent_response_format::install(setup, extension)?,
        _ => return Ok(false),
    }
    Ok(true)
}
