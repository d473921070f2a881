//! `message-window`: the conversation keeps its last `maxMessages` messages.
//!
//! A turn layer, as the original's: before the turn core appends the input,
//! the oldest messages beyond `maxMessages` are removed with `remove`
//! events, so the turn's requests carry at most `maxMessages` earlier
//! messages (plus what the turn adds). A cut that would fall between an
//! assistant message's tool calls and their results takes the results too
//! ([`goondan_core::conversation::keep_calls_with_results`]), so no call is
//! left without its result and no result without its call.

use goondan_core::conversation::keep_calls_with_results;
use goondan_core::{JsonObject, Message, MessageEvent};
use goondan_runtime::extension::{AgentExtension, ExtensionError, ExtensionSetup};
use goondan_runtime::{TurnContext, TurnOutcome};
use goondan_tools::{AsyncMiddleware, Next};

use crate::emit_all;
use crate::fields::Fields;

/// The extension's name in `@goondan/base`.
pub const NAME: &str = "message-window";

/// `config`, with the original's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// `maxMessages` (40 when the config has none; the package's manifest says 80).
    pub max_messages: usize,
}

impl Config {
    /// Reads `config`; `maxMessages` must be a whole number of at least 1.
    pub fn parse(extension: &str, config: &JsonObject) -> Result<Self, ExtensionError> {
        Ok(Self { max_messages: Fields::new(extension, config).integer("maxMessages", 1, 40)? })
    }
}

/// Installs the turn layer (priority 0, in the agent's extension order).
pub fn install(setup: &mut ExtensionSetup<'_>, extension: &AgentExtension) -> Result<(), ExtensionError> {
    crate::install_turn_layer(setup, extension, Config::parse)
}

/// The turn layer: the config is all it keeps.
impl AsyncMiddleware<TurnContext, TurnOutcome> for Config {
    async fn handle<'a>(&'a self, ctx: &'a mut TurnContext, next: Next<'a, TurnContext, TurnOutcome>) -> TurnOutcome {
        let removals = window_removals(ctx.conversation.messages(), self.max_messages);
        if !removals.is_empty() {
            tracing::debug!("{NAME}: removing {} message(s) beyond the last {}", removals.len(), self.max_messages);
        }
        emit_all(NAME, &mut ctx.conversation, removals);
        next.run(ctx).await
    }
}

/// The `remove` events that leave at most the last `max` messages, never
/// separating tool calls from their results.
pub fn window_removals(messages: &[Message], max: usize) -> Vec<MessageEvent> {
    if messages.len() <= max {
        return Vec::new();
    }
    let over = messages.len() - max;
    let mut remove: Vec<bool> = (0..messages.len()).map(|index| index < over).collect();
    keep_calls_with_results(messages, &mut remove);
    messages
        .iter()
        .zip(remove)
        .filter(|(_, gone)| *gone)
        .map(|(message, _)| MessageEvent::Remove { target_id: message.id.clone() })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_messages::{calls_then_reply, ids_after};
    use serde_json::json;

    #[test]
    fn keeps_the_last_messages_and_never_splits_calls_from_results() {
        let messages = calls_then_reply();
        assert!(window_removals(&messages, 6).is_empty());
        assert_eq!(ids_after(&messages, &window_removals(&messages, 5)), ["a1", "r1", "r2", "u2", "a2"]);
        // The cut at 3 would keep r2 without its call: the pair goes.
        assert_eq!(ids_after(&messages, &window_removals(&messages, 3)), ["u2", "a2"]);
        assert_eq!(ids_after(&messages, &window_removals(&messages, 4)), ["u2", "a2"]);
        assert_eq!(ids_after(&messages, &window_removals(&messages, 1)), ["a2"]);
    }

    #[test]
    fn config_is_the_originals_and_refuses_what_is_not_a_count() {
        let parse = |value: serde_json::Value| Config::parse(NAME, value.as_object().unwrap_or(&JsonObject::new()));
        assert_eq!(parse(json!({})), Ok(Config { max_messages: 40 }));
        assert_eq!(parse(json!({"maxMessages": 80})), Ok(Config { max_messages: 80 }));
        for bad in [json!(0), json!(-3), json!("20"), json!(2.5)] {
            let refused = parse(json!({"maxMessages": bad})).err().unwrap_or_else(|| panic!("{bad} accepted"));
            assert_eq!(refused.code, "E_EXT_INIT");
            assert!(
                refused.message.starts_with("config.maxMessages must be a whole number of at least 1"),
                "{refused}"
            );
        }
    }
}
