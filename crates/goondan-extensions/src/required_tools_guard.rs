//! `required-tools-guard`: a turn does not end before one of the required
//! tools was called successfully.
//!
//! As in the original, the requirement is met by **any one** of
//! `requiredTools` returning an `ok` result during the turn (the original's
//! default reminder says "call one of the following tools"). When a step
//! would end the turn without it, the layer appends a user message (source
//! `extension` `required-tools-guard`) with `errorMessage` and lets the
//! turn go on. The original reminds until `maxStepsPerTurn`; here at most
//! `maxReminders` (default 3) times per turn, after which the turn ends as
//! it would have, with a warning and the event
//! `required-tools-guard.unsatisfied`.
//!
//! Config: `requiredTools` (names; `Agent.spec.requiredTools` is added to
//! them by the runtime, see `goondan_runtime::extension::agent_extensions`),
//! `errorMessage` (empty: the original's default text), `maxReminders`.
//! With no required tool the extension does nothing.
//!
//! The layer reads the step's own results (`StepOutcome::tool_calls`,
//! `tool_results`), so nothing is added to the tool-call path.

use goondan_core::sync::LockUnpoisoned;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use goondan_core::{Message, MessageData, MessageEvent, MessageSource, ToolStatus};
use goondan_runtime::context::{StepContext, StepOutcome};
use goondan_runtime::extension::{AgentExtension, ExtensionError, ExtensionSetup};
use goondan_tools::{AsyncMiddleware, Next, async_layer};

use crate::fields::Fields;

/// The Extension's name.
pub(crate) const NAME: &str = goondan_runtime::extension::REQUIRED_TOOLS_GUARD;

/// The event emitted when a turn ends without a required tool.
const UNSATISFIED_EVENT: &str = "required-tools-guard.unsatisfied";

#[derive(Debug, Clone, PartialEq)]
struct Settings {
    required_tools: Vec<String>,
    error_message: String,
    max_reminders: u32,
}

impl Settings {
    fn from_config(extension: &AgentExtension) -> Result<Self, ExtensionError> {
        let fields = Fields::new(&extension.name, &extension.config);
        let required_tools = fields.string_list("requiredTools")?;
        let error_message = match fields.string("errorMessage")? {
            Some(text) if !text.trim().is_empty() => text.to_owned(),
            // The original's default, word for word.
            _ => format!("다음 도구 중 하나를 반드시 호출하세요: {}", required_tools.join(", ")),
        };
        let max_reminders = fields.integer("maxReminders", 1, 3)?;
        Ok(Self { required_tools, error_message, max_reminders: u32::try_from(max_reminders).unwrap_or(u32::MAX) })
    }
}

/// Installs the step layer, when there is a required tool.
pub(crate) fn install(setup: &mut ExtensionSetup<'_>, extension: &AgentExtension) -> Result<(), ExtensionError> {
    let settings = Settings::from_config(extension)?;
    if settings.required_tools.is_empty() {
        tracing::debug!("agent '{}': {NAME} has no required tools and does nothing", setup.tooling.agent_name);
        return Ok(());
    }
    let layer = Guard { extension: extension.name.clone(), settings, turn: Mutex::new(TurnProgress::default()) };
    setup.tooling.step_middleware.register(extension.name.as_str(), 0, async_layer(layer));
    Ok(())
}

/// What the current turn has done so far.
#[derive(Debug, Default)]
struct TurnProgress {
    turn_id: Option<Arc<str>>,
    /// Required tools that returned `ok`.
    called: HashSet<String>,
    reminders: u32,
}

struct Guard {
    extension: String,
    settings: Settings,
    /// One turn at a time runs per agent; a new turn id starts over.
    turn: Mutex<TurnProgress>,
}

/// What the layer decided after a step.
enum Verdict {
    Done,
    Remind,
    GiveUp(u32),
}

impl Guard {
    fn judge(&self, turn_id: &Arc<str>, outcome: &StepOutcome) -> Verdict {
        let mut progress = self.turn.lock_unpoisoned();
        if progress.turn_id.as_ref() != Some(turn_id) {
            *progress = TurnProgress { turn_id: Some(Arc::clone(turn_id)), ..TurnProgress::default() };
        }
        for (call, result) in outcome.tool_calls.iter().zip(&outcome.tool_results) {
            if result.status == ToolStatus::Ok && self.settings.required_tools.iter().any(|name| *name == *call.name) {
                progress.called.insert(call.name.to_string());
            }
        }
        if outcome.should_continue || outcome.failure.is_some() || !progress.called.is_empty() {
            return Verdict::Done;
        }
        if progress.reminders >= self.settings.max_reminders {
            return Verdict::GiveUp(progress.reminders);
        }
        progress.reminders += 1;
        Verdict::Remind
    }
}

impl AsyncMiddleware<StepContext, StepOutcome> for Guard {
    async fn handle<'a>(&'a self, ctx: &'a mut StepContext, next: Next<'a, StepContext, StepOutcome>) -> StepOutcome {
        let mut outcome = next.run(ctx).await;
        match self.judge(&ctx.turn_id, &outcome) {
            Verdict::Done => {}
            Verdict::Remind => {
                let message = Message::new(
                    MessageData::User { content: self.settings.error_message.clone() },
                    MessageSource::Extension { extension_name: self.extension.clone() },
                );
                match ctx.conversation.emit(MessageEvent::Append { message }) {
                    Ok(()) => outcome.should_continue = true,
                    Err(error) => tracing::warn!("{NAME}: the reminder could not be added: {error}"),
                }
            }
            Verdict::GiveUp(reminders) => {
                tracing::warn!(
                    "agent '{}': turn {} ends without a successful call of {} after {reminders} reminder(s)",
                    ctx.agent_name,
                    ctx.turn_id,
                    self.settings.required_tools.join(", ")
                );
                let payload = serde_json::json!({
                    "requiredTools": self.settings.required_tools,
                    "reminders": reminders,
                });
                if let Err(error) = ctx.events.emit(UNSATISFIED_EVENT, &payload) {
                    tracing::warn!("{NAME}: {error}");
                }
            }
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use goondan_core::{ToolCall, ToolError, ToolResult};
    use serde_json::json;

    use super::*;
    use crate::fields::tests::extension;

    fn guard(config: serde_json::Value) -> Guard {
        let settings = Settings::from_config(&extension(NAME, config)).unwrap_or_else(|e| panic!("{e}"));
        Guard { extension: NAME.to_owned(), settings, turn: Mutex::new(TurnProgress::default()) }
    }

    fn step(calls: &[(&str, bool)], should_continue: bool) -> StepOutcome {
        StepOutcome {
            tool_calls: calls.iter().map(|(name, _)| ToolCall::new("c", *name, Default::default())).collect(),
            tool_results: calls
                .iter()
                .map(
                    |(_, ok)| {
                        if *ok {
                            ToolResult::ok(json!(1))
                        } else {
                            ToolResult::error(ToolError::new("E", "Error", "no"))
                        }
                    },
                )
                .collect(),
            should_continue,
            ..StepOutcome::default()
        }
    }

    #[test]
    fn one_successful_required_call_in_the_turn_lets_it_end() {
        let guard = guard(json!({"requiredTools": ["a__send", "b__send"], "maxReminders": 2}));
        let turn: Arc<str> = Arc::from("t1");
        // A failed call of a required tool does not count.
        assert!(matches!(guard.judge(&turn, &step(&[("a__send", false)], true)), Verdict::Done));
        assert!(matches!(guard.judge(&turn, &step(&[], false)), Verdict::Remind));
        // An ok call in an earlier step of the turn counts at its end.
        assert!(matches!(guard.judge(&turn, &step(&[("b__send", true)], true)), Verdict::Done));
        assert!(matches!(guard.judge(&turn, &step(&[], false)), Verdict::Done));
        // A new turn starts over, and the reminders are bounded.
        let next: Arc<str> = Arc::from("t2");
        assert!(matches!(guard.judge(&next, &step(&[("other__x", true)], false)), Verdict::Remind));
        assert!(matches!(guard.judge(&next, &step(&[], false)), Verdict::Remind));
        assert!(matches!(guard.judge(&next, &step(&[], false)), Verdict::GiveUp(2)));
    }

    #[test]
    fn config_defaults_and_refusals() {
        let guard = guard(json!({"requiredTools": ["a__send"], "errorMessage": ""}));
        assert_eq!(guard.settings.error_message, "다음 도구 중 하나를 반드시 호출하세요: a__send");
        assert_eq!(guard.settings.max_reminders, 3);
        for (config, field) in [
            (json!({"requiredTools": "a__send"}), "config.requiredTools must be"),
            (json!({"requiredTools": ["a__send", 3]}), "config.requiredTools[1] must be"),
            (json!({"requiredTools": ["a__send"], "errorMessage": 1}), "config.errorMessage must be"),
            (json!({"requiredTools": ["a__send"], "maxReminders": 0}), "config.maxReminders must be"),
        ] {
            let error = Settings::from_config(&extension(NAME, config)).err().unwrap_or_else(|| panic!("{field}"));
            assert!(error.message.starts_with(field), "{}", error.message);
        }
    }
}
