//! `message-compaction`: keeps the conversation under `maxMessages`
//! messages and `maxCharacters` characters.
//!
//! A turn layer, as the original's: before the turn core appends the input,
//! if the conversation is over either limit it is compacted by `mode`:
//!
//! - `remove` (default): the oldest messages go, one by one, until both
//!   limits hold — except the last `retainLastMessages` and messages whose
//!   metadata says `pinned: true`. Tool calls and their results go or stay
//!   together ([`goondan_core::conversation::keep_calls_with_results`]). If
//!   the limits cannot be met that way, the conversation is truncated. A
//!   call and its results are retained or pinned as one: if any of them is,
//!   all stay.
//! - `truncate`: every message goes (a `truncate` event).
//!
//! With `appendSummary` (default) a system message follows, reading
//! `<summaryPrefix> mode=<mode> removed=<count> chars=<characters>`, with the
//! original's `compaction.*` metadata.

use goondan_core::conversation::keep_calls_with_results;
use goondan_core::{JsonObject, JsonValue, Message, MessageData, MessageEvent, MessageSource};
use goondan_runtime::extension::{AgentExtension, ExtensionError, ExtensionSetup};
use goondan_runtime::{TurnContext, TurnOutcome};
use goondan_tools::{AsyncMiddleware, Next};
use serde_json::json;

use crate::emit_all;
use crate::fields::Fields;

/// The extension's name in `@goondan/base`.
pub const NAME: &str = "message-compaction";

/// How the conversation is compacted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The oldest messages go until the limits hold.
    Remove,
    /// Every message goes.
    Truncate,
}

impl Mode {
    /// `remove` or `truncate`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Remove => "remove",
            Self::Truncate => "truncate",
        }
    }
}

/// `config`, with the original's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `maxMessages` (40).
    pub max_messages: usize,
    /// `maxCharacters` (12000).
    pub max_characters: usize,
    /// `retainLastMessages` (8): never removed by `remove`.
    pub retain_last_messages: usize,
    /// `mode` (`remove`).
    pub mode: Mode,
    /// `appendSummary` (true).
    pub append_summary: bool,
    /// `summaryPrefix` (`[message-compaction]`).
    pub summary_prefix: String,
}

impl Config {
    /// Reads `config`; a field of the wrong type or range is an `E_EXT_INIT` error.
    pub fn parse(extension: &str, config: &JsonObject) -> Result<Self, ExtensionError> {
        let fields = Fields::new(extension, config);
        let mode = match fields.choice("mode", &["remove", "truncate"], "remove")? {
            "truncate" => Mode::Truncate,
            _ => Mode::Remove,
        };
        Ok(Self {
            max_messages: fields.integer("maxMessages", 1, 40)?,
            max_characters: fields.integer("maxCharacters", 1, 12_000)?,
            retain_last_messages: fields.integer("retainLastMessages", 0, 8)?,
            mode,
            append_summary: fields.boolean("appendSummary", true)?,
            summary_prefix: fields.string("summaryPrefix")?.unwrap_or("[message-compaction]").to_owned(),
        })
    }
}

/// Installs the turn layer (priority 0, in the agent's extension order).
pub fn install(setup: &mut ExtensionSetup<'_>, extension: &AgentExtension) -> Result<(), ExtensionError> {
    crate::install_turn_layer(setup, extension, Config::parse)
}

/// The turn layer: the config is all it keeps.
impl AsyncMiddleware<TurnContext, TurnOutcome> for Config {
    async fn handle<'a>(&'a self, ctx: &'a mut TurnContext, next: Next<'a, TurnContext, TurnOutcome>) -> TurnOutcome {
        if let Some(compaction) = compact(ctx.conversation.messages(), self) {
            tracing::debug!(
                "{NAME}: mode={} removed={} chars={}",
                compaction.mode.as_str(),
                compaction.removed_count,
                compaction.removed_characters
            );
            emit_all(NAME, &mut ctx.conversation, compaction.events);
        }
        next.run(ctx).await
    }
}

/// What one compaction does.
#[derive(Debug, Clone, PartialEq)]
pub struct Compaction {
    /// How (a `remove` that could not meet the limits becomes a `truncate`).
    pub mode: Mode,
    /// Messages removed.
    pub removed_count: usize,
    /// Their characters ([`message_length`]).
    pub removed_characters: usize,
    /// The events, the summary last.
    pub events: Vec<MessageEvent>,
}

/// The length of a message as the limits count it, in UTF-16 code units
/// (JavaScript's `length`, as the original): its text, and — unlike the
/// original, which counts text parts only — its tool calls' names and
/// arguments and its tool result as the model receives them, since those
/// are usually what makes a conversation long.
pub fn message_length(message: &Message) -> usize {
    let units = |text: &str| text.encode_utf16().count();
    match &message.data {
        MessageData::System { content } | MessageData::User { content } => units(content),
        MessageData::Assistant { content, tool_calls } => {
            content.as_deref().map_or(0, units)
                + tool_calls
                    .iter()
                    .map(|call| units(&call.name) + units(&JsonValue::Object(call.args.clone()).to_string()))
                    .sum::<usize>()
        }
        MessageData::Tool { result, .. } => serde_json::to_string(result).map_or(0, |text| units(&text)),
    }
}

/// The messages as units: an assistant message with the results right
/// after it, or any other message alone.
fn call_groups(messages: &[Message]) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let mut index = 0;
    while index < messages.len() {
        let start = index;
        index += 1;
        if matches!(messages[start].data, MessageData::Assistant { .. }) {
            while messages.get(index).is_some_and(|m| matches!(m.data, MessageData::Tool { .. })) {
                index += 1;
            }
        }
        groups.push(start..index);
    }
    groups
}

fn pinned(message: &Message) -> bool {
    message.metadata.get("pinned") == Some(&JsonValue::Bool(true))
}

/// The compaction `messages` need under `config`; `None` when they are within both limits.
pub fn compact(messages: &[Message], config: &Config) -> Option<Compaction> {
    let lengths: Vec<usize> = messages.iter().map(message_length).collect();
    let total: usize = lengths.iter().sum();
    if messages.len() <= config.max_messages && total <= config.max_characters {
        return None;
    }
    let truncate = || Compaction {
        mode: Mode::Truncate,
        removed_count: messages.len(),
        removed_characters: total,
        events: vec![MessageEvent::Truncate],
    };
    let mut compaction = match config.mode {
        Mode::Truncate => truncate(),
        Mode::Remove => {
            let keep_from = messages.len().saturating_sub(config.retain_last_messages);
            let mut remove = vec![false; messages.len()];
            let (mut count, mut characters) = (messages.len(), total);
            // Tool calls and their results are one unit here: it goes only
            // when none of it is retained or pinned.
            for group in call_groups(messages) {
                if count <= config.max_messages && characters <= config.max_characters {
                    break;
                }
                if group.clone().any(|index| index >= keep_from || pinned(&messages[index])) {
                    continue;
                }
                for index in group {
                    remove[index] = true;
                    count -= 1;
                    characters -= lengths[index];
                }
            }
            // The shared rule has the last word on what may go together.
            keep_calls_with_results(messages, &mut remove);
            let removed_count = remove.iter().filter(|gone| **gone).count();
            let removed_characters: usize =
                lengths.iter().zip(&remove).filter(|(_, gone)| **gone).map(|(n, _)| n).sum();
            if messages.len() - removed_count > config.max_messages
                || total - removed_characters > config.max_characters
            {
                truncate()
            } else {
                let events = messages
                    .iter()
                    .zip(&remove)
                    .filter(|(_, gone)| **gone)
                    .map(|(message, _)| MessageEvent::Remove { target_id: message.id.clone() })
                    .collect();
                Compaction { mode: Mode::Remove, removed_count, removed_characters, events }
            }
        }
    };
    if config.append_summary {
        let summary = summary(config, &compaction);
        compaction.events.push(MessageEvent::Append { message: summary });
    }
    Some(compaction)
}

fn summary(config: &Config, compaction: &Compaction) -> Message {
    let mode = compaction.mode.as_str();
    let text = format!(
        "{} mode={mode} removed={} chars={}",
        config.summary_prefix, compaction.removed_count, compaction.removed_characters
    );
    let mut message = Message::new(
        MessageData::System { content: text },
        MessageSource::Extension { extension_name: NAME.to_owned() },
    );
    let metadata = json!({
        "compaction.summary": true,
        "compaction.mode": mode,
        "compaction.removedCount": compaction.removed_count,
        "compaction.removedCharacters": compaction.removed_characters,
    });
    if let JsonValue::Object(metadata) = metadata {
        message.metadata = metadata;
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_messages::{assistant, calls_then_reply, ids_after, user};

    fn config(value: JsonValue) -> Config {
        Config::parse(NAME, value.as_object().unwrap_or(&JsonObject::new())).unwrap_or_else(|e| panic!("{e}"))
    }

    fn conversation() -> Vec<Message> {
        let mut messages = calls_then_reply();
        messages.extend([user("u3"), assistant("a3", &[])]);
        messages
    }

    #[test]
    fn within_the_limits_nothing_happens() {
        assert_eq!(compact(&conversation(), &config(json!({"maxMessages": 8}))), None);
    }

    #[test]
    fn remove_takes_the_oldest_but_the_retained_and_pinned_and_keeps_pairs_whole() {
        let messages = conversation();
        let settings = config(json!({"maxMessages": 6, "retainLastMessages": 2, "appendSummary": false}));
        let compaction = compact(&messages, &settings).unwrap_or_else(|| panic!("over the limit"));
        // u1 and a1 would do; a1's results go with it.
        assert_eq!(ids_after(&messages, &compaction.events), ["u2", "a2", "u3", "a3"]);
        assert_eq!((compaction.mode, compaction.removed_count), (Mode::Remove, 4));

        let mut pinned = conversation();
        pinned[1].metadata.insert("pinned".into(), json!(true));
        let compaction = compact(&pinned, &settings).unwrap_or_else(|| panic!("over the limit"));
        assert_eq!(ids_after(&pinned, &compaction.events), ["a1", "r1", "r2", "a2", "u3", "a3"]);
    }

    #[test]
    fn characters_count_and_a_remove_that_cannot_fit_truncates() {
        let messages = conversation();
        let lengths: usize = messages.iter().map(message_length).sum();
        assert!(message_length(&messages[2]) > 0, "tool results count");
        let settings = config(json!({"maxCharacters": lengths - 1, "retainLastMessages": 0}));
        let compaction = compact(&messages, &settings).unwrap_or_else(|| panic!("over the limit"));
        assert_eq!(ids_after(&messages, &compaction.events[..compaction.events.len() - 1]).len(), 7);
        let Some(MessageEvent::Append { message }) = compaction.events.last() else { panic!("no summary") };
        let expected = format!("[message-compaction] mode=remove removed=1 chars={}", message_length(&messages[0]));
        assert_eq!(message.data, MessageData::System { content: expected });
        assert_eq!(message.metadata["compaction.summary"], json!(true));
        assert_eq!(message.metadata["compaction.removedCount"], json!(1));

        // Everything retained: the limit cannot be met by removal.
        let settings = config(json!({"maxMessages": 2, "retainLastMessages": 8, "summaryPrefix": "[c]"}));
        let compaction = compact(&messages, &settings).unwrap_or_else(|| panic!("over the limit"));
        assert_eq!(compaction.mode, Mode::Truncate);
        assert_eq!(compaction.events[0], MessageEvent::Truncate);
        let Some(MessageEvent::Append { message }) = compaction.events.last() else { panic!("no summary") };
        let MessageData::System { content } = &message.data else { panic!("{message:?}") };
        assert_eq!(content, &format!("[c] mode=truncate removed=8 chars={lengths}"));
    }

    #[test]
    fn truncate_mode_empties_the_conversation() {
        let compaction =
            compact(&conversation(), &config(json!({"maxMessages": 3, "mode": "truncate", "appendSummary": false})));
        assert_eq!(compaction.map(|c| c.events), Some(vec![MessageEvent::Truncate]));
    }

    #[test]
    fn config_refuses_bad_fields_by_name() {
        let parse = |value: JsonValue| Config::parse(NAME, value.as_object().unwrap_or(&JsonObject::new()));
        let defaults = config(json!({}));
        assert_eq!(
            defaults,
            Config {
                max_messages: 40,
                max_characters: 12_000,
                retain_last_messages: 8,
                mode: Mode::Remove,
                append_summary: true,
                summary_prefix: "[message-compaction]".into(),
            }
        );
        let refused = parse(json!({"mode": "squash"})).err().map(|e| (e.code, e.message));
        assert_eq!(
            refused,
            Some(("E_EXT_INIT".into(), "config.mode must be one of 'remove', 'truncate', got \"squash\"".into()))
        );
        assert!(parse(json!({"maxCharacters": 0})).is_err());
        assert!(parse(json!({"retainLastMessages": -1})).is_err());
        assert!(parse(json!({"appendSummary": "no"})).is_err());
        assert!(parse(json!({"summaryPrefix": 3})).is_err());
        assert_eq!(parse(json!({"retainLastMessages": 0})).map(|c| c.retain_last_messages), Ok(0));
    }
}
