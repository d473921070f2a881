//! The extensions of the `@goondan/base` package, implemented natively.
//!
//! Bundles written for the original reference them as `Extension/NAME`
//! (package `@goondan/base`) with the original's config fields. Each module
//! here installs one of them through the runtime's
//! [`ExtensionSetup`](goondan_runtime::extension::ExtensionSetup): its turn,
//! step and toolCall layers go on the same chains, and its tools into the
//! same registry, as JavaScript extensions' do. [`BaseExtensions`] is the
//! build's plugin for them: it claims the base package's extensions this
//! crate implements, and [`install`] picks the module by the Extension's
//! name.

use goondan_config::PackageScope;
use goondan_core::{ConversationState, JsonObject, MessageEvent};
use goondan_runtime::extension::{AgentExtension, ExtensionError, ExtensionSetup, PluginInstall};
use goondan_runtime::{TurnContext, TurnOutcome};
use goondan_tools::BoxFuture;
use goondan_tools::{AsyncMiddleware, async_layer};

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

/// The names of the base package's extensions this crate implements.
const IMPLEMENTED: [&str; 8] = [
    context_message::NAME,
    message_window::NAME,
    message_compaction::NAME,
    message_integrity::NAME,
    tool_search::NAME,
    required_tools_guard::NAME,
    logging::NAME,
    inter_agent_response_format::NAME,
];

/// Whether `extension` is one of the base package's extensions this crate
/// implements.
pub fn implements(extension: &AgentExtension) -> bool {
    extension.scope == PackageScope::Base && IMPLEMENTED.contains(&extension.name.as_str())
}

/// The plugin of the native base extensions: it claims those this crate
/// [`implements`] and installs them.
#[derive(Debug, Clone, Copy, Default)]
pub struct BaseExtensions;

impl PluginInstall for BaseExtensions {
    fn claims(&self, extension: &AgentExtension) -> bool {
        implements(extension)
    }

    fn install_extension<'a>(
        &'a mut self,
        setup: &'a mut ExtensionSetup<'_>,
        extension: &'a AgentExtension,
    ) -> BoxFuture<'a, Result<(), ExtensionError>> {
        Box::pin(async move { install(setup, extension).await.map(|_| ()) })
    }
}

/// Installs the turn layer of an extension whose layer is its config, read
/// by `parse`, at priority 0 (in the agent's extension order).
pub(crate) fn install_turn_layer<L>(
    setup: &mut ExtensionSetup<'_>,
    extension: &AgentExtension,
    parse: fn(&str, &JsonObject) -> Result<L, ExtensionError>,
) -> Result<(), ExtensionError>
where
    L: AsyncMiddleware<TurnContext, TurnOutcome> + 'static,
{
    let layer = parse(&extension.name, &extension.config)?;
    setup.tooling.turn_middleware.register(extension.name.as_str(), 0, async_layer(layer));
    Ok(())
}

/// Applies `events` to `conversation` in order; one it refuses is logged as
/// `{extension}: {error}` and skipped, so the rest still apply.
pub(crate) fn emit_all(
    extension: &str,
    conversation: &mut ConversationState,
    events: impl IntoIterator<Item = MessageEvent>,
) {
    for event in events {
        if let Err(error) = conversation.emit(event) {
            tracing::warn!("{extension}: {error}");
        }
    }
}

/// Installs `extension` when it is one of the base package's extensions this
/// crate implements; returns `Ok(false)` (and changes nothing) otherwise.
pub async fn install(setup: &mut ExtensionSetup<'_>, extension: &AgentExtension) -> Result<bool, ExtensionError> {
    if !implements(extension) {
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
