//! `message-integrity`: before a request leaves for the model, every tool
//! call has exactly one result and every result answers a call.
//!
//! The rule is the one the conversation store repairs by
//! ([`goondan_core::ConversationState::repair`], over
//! [`goondan_core::conversation::integrity_repairs`]): orphan and duplicate
//! results are removed, calls left unanswered at the end get an
//! `E_TOOL_INTERRUPTED` result, calls unanswered elsewhere and calls
//! repeating an earlier call's id are dropped from their assistant message.
//! The extension applies it in a step layer that runs innermost (priority
//! `i32::MAX`), after every other step layer edited the conversation and
//! right before the step core builds the request, and reports what it
//! repaired: a warning and an event
//! `message-integrity.repaired` (`resultsRemoved`, `callsInterrupted`,
//! `callsDropped`, `messagesRemoved`, `stepIndex`) in the agent's event log.
//!
//! The runtime applies the same rule at every commit whether or not the
//! extension is loaded, so what the model receives is valid either way; the
//! extension names the repair where it happens, for bundles that list it
//! (the original had it as the helper its window and compaction share).

use goondan_runtime::extension::{AgentExtension, ExtensionError, ExtensionSetup};
use goondan_runtime::{StepContext, StepOutcome};
use goondan_tools::{AsyncMiddleware, Next, async_layer};
use serde_json::json;

/// The extension's name in `@goondan/base`.
pub const NAME: &str = "message-integrity";
/// The event reporting a repair.
pub const REPAIRED_EVENT: &str = "message-integrity.repaired";
/// Innermost: the last layer before the step core sends the request.
pub const PRIORITY: i32 = i32::MAX;

/// Installs the step layer. The extension has no config.
pub fn install(setup: &mut ExtensionSetup<'_>, extension: &AgentExtension) -> Result<(), ExtensionError> {
    if !extension.config.is_empty() {
        let keys: Vec<&str> = extension.config.keys().map(String::as_str).collect();
        tracing::warn!("{NAME}: takes no config; ignoring {}", keys.join(", "));
    }
    setup.tooling.step_middleware.register(extension.name.as_str(), PRIORITY, async_layer(MessageIntegrity));
    Ok(())
}

struct MessageIntegrity;

impl AsyncMiddleware<StepContext, StepOutcome> for MessageIntegrity {
    async fn handle<'a>(&'a self, ctx: &'a mut StepContext, next: Next<'a, StepContext, StepOutcome>) -> StepOutcome {
        let report = ctx.conversation.repair();
        if !report.is_empty() {
            tracing::warn!("{NAME}: repaired the conversation before step {}: {report}", ctx.step_index);
            let payload = json!({
                "resultsRemoved": report.results_removed,
                "callsInterrupted": report.calls_interrupted,
                "callsDropped": report.calls_dropped,
                "messagesRemoved": report.messages_removed,
                "stepIndex": ctx.step_index,
            });
            if let Err(error) = ctx.events.emit(REPAIRED_EVENT, &payload) {
                tracing::warn!("{NAME}: {error}");
            }
        }
        next.run(ctx).await
    }
}
