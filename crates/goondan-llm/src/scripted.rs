//! A deterministic model whose replies are listed in its Model resource —
//! for offline examples, demos and tests, never for real work.
//!
//! ```yaml
//! kind: Model
//! metadata: {name: offline}
//! spec:
//!   provider: scripted
//!   model: demo
//!   options:
//!     replies:                      # step 1, step 2, … of every turn
//!       - toolCalls:
//!           - {name: bash__exec, args: {command: "ls"}}
//!       - text: "Here is what I found."
//!     # or: repliesFile: ./script.yaml   (a YAML or JSON list of the same)
//! ```
//!
//! Reply *n* answers step *n* of a turn (counted as the assistant messages
//! since the last user message), so every turn plays the same script and a
//! rerun behaves the same. `options.when` (a list of `{inputContains,
//! replies}`) plays another script when the last user message contains a
//! text — an agent that answers a request differently from its own input,
//! or reacts to a reply that arrived in its conversation. A reply's tool call gives `args` (an object) or
//! `arguments` (raw text, to exercise malformed arguments); the text
//! `{{lastHandle}}` in them stands for the handle of the latest pending tool
//! result in the conversation (`tasks__wait {handle: "{{lastHandle}}"}`). The text is
//! streamed word by word, as an API would stream it.

use goondan_core::{JsonValue, MessageData};
use serde::Deserialize;

use crate::config::ModelSettings;
use crate::error::ModelError;
use crate::provider::{Completion, ModelProvider, StreamSink};
use crate::types::{ModelRequest, ModelResponse, RawToolCall, StopReason, StreamEvent, TokenUsage};

/// In a scripted tool call's arguments: the handle of the latest pending result.
pub const LAST_HANDLE: &str = "{{lastHandle}}";

/// One scripted reply.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScriptedReply {
    /// The reply text.
    #[serde(default)]
    pub text: Option<String>,
    /// The tool calls.
    #[serde(default)]
    pub tool_calls: Vec<ScriptedToolCall>,
}

/// One scripted tool call.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedToolCall {
    /// The tool name.
    pub name: String,
    /// The arguments as an object.
    #[serde(default)]
    pub args: Option<JsonValue>,
    /// The arguments as raw text (wins over `args`).
    #[serde(default)]
    pub arguments: Option<String>,
    /// The call's id, as a provider would send it (default
    /// `call_<messages>_<index>`); lets a script repeat or omit ids the way
    /// a misbehaving model does.
    #[serde(default)]
    pub id: Option<String>,
}

/// The scripted provider.
#[derive(Debug, Clone)]
pub struct ScriptedProvider {
    replies: Vec<ScriptedReply>,
    /// Scripts chosen by the last user message: (text it contains, replies).
    when: Vec<(String, Vec<ScriptedReply>)>,
}

/// One entry of `options.when`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ScriptedCase {
    input_contains: String,
    replies: Vec<ScriptedReply>,
}

impl ScriptedProvider {
    /// Reads the script from `options.replies` or `options.repliesFile`.
    pub fn new(settings: &ModelSettings) -> Result<Self, ModelError> {
        let value = match (settings.options.get("replies"), settings.options.get("repliesFile")) {
            (Some(replies), _) => replies.clone(),
            (None, Some(JsonValue::String(file))) => {
                let path = settings.bundle_root.join(file);
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| ModelError::Config(format!("cannot read repliesFile {}: {e}", path.display())))?;
                let documents = goondan_config::yaml::parse_documents(&text)
                    .map_err(|e| ModelError::Config(format!("repliesFile {}: {}", path.display(), e.message)))?;
                documents.into_iter().next().map(|d| d.value).unwrap_or(JsonValue::Array(Vec::new()))
            }
            _ => {
                return Err(ModelError::Config(
                    "a scripted model needs options.replies (a list of {text?, toolCalls?}) or options.repliesFile"
                        .to_owned(),
                ));
            }
        };
        let replies: Vec<ScriptedReply> = serde_json::from_value(value)
            .map_err(|e| ModelError::Config(format!("scripted replies are not valid: {e}")))?;
        if replies.is_empty() {
            return Err(ModelError::Config("a scripted model needs at least one reply".to_owned()));
        }
        let when = match settings.options.get("when") {
            None => Vec::new(),
            Some(value) => serde_json::from_value::<Vec<ScriptedCase>>(value.clone())
                .map_err(|e| ModelError::Config(format!("scripted options.when is not valid: {e}")))?
                .into_iter()
                .map(|case| (case.input_contains, case.replies))
                .collect(),
        };
        Ok(Self { replies, when })
    }

    /// A provider playing `replies`.
    pub fn from_replies(replies: Vec<ScriptedReply>) -> Self {
        Self { replies, when: Vec::new() }
    }

    fn reply(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let last_user = request.messages.iter().rposition(|m| matches!(m, MessageData::User { .. }));
        let after = last_user.map_or(0, |i| i + 1);
        let step = request.messages[after..].iter().filter(|m| matches!(m, MessageData::Assistant { .. })).count();
        let input = match last_user.map(|i| &request.messages[i]) {
            Some(MessageData::User { content }) => content.as_str(),
            _ => "",
        };
        let replies = self
            .when
            .iter()
            .find(|(needle, _)| input.contains(needle.as_str()))
            .map_or(&self.replies, |(_, replies)| replies);
        let reply = replies.get(step).ok_or_else(|| {
            ModelError::Script(format!(
                "no reply scripted for step {} of this turn (the script has {})",
                step + 1,
                replies.len()
            ))
        })?;
        // A script cannot know a pending result's handle in advance: the
        // text `{{lastHandle}}` in arguments stands for the latest one.
        let last_handle = request.messages.iter().rev().find_map(|message| match message {
            MessageData::Tool { result, .. } => result.handle.clone(),
            _ => None,
        });
        let tool_calls: Vec<RawToolCall> = reply
            .tool_calls
            .iter()
            .enumerate()
            .map(|(index, call)| {
                let arguments = call
                    .arguments
                    .clone()
                    .unwrap_or_else(|| call.args.as_ref().map_or_else(|| "{}".to_owned(), JsonValue::to_string));
                RawToolCall {
                    id: call.id.clone().unwrap_or_else(|| format!("call_{}_{}", request.messages.len(), index + 1)),
                    name: call.name.clone(),
                    arguments: match &last_handle {
                        Some(handle) => arguments.replace(LAST_HANDLE, handle),
                        None => arguments,
                    },
                }
            })
            .collect();
        let stop_reason = Some(if tool_calls.is_empty() { StopReason::EndTurn } else { StopReason::ToolUse });
        let output_tokens = reply.text.as_deref().map_or(0, |t| t.split_whitespace().count()) + tool_calls.len();
        Ok(ModelResponse {
            text: reply.text.clone(),
            tool_calls,
            stop_reason,
            usage: TokenUsage {
                input_tokens: u64::try_from(request.messages.len()).unwrap_or(u64::MAX),
                output_tokens: u64::try_from(output_tokens).unwrap_or(u64::MAX),
                ..TokenUsage::default()
            },
        })
    }
}

impl ModelProvider for ScriptedProvider {
    fn complete<'a>(&'a self, request: &'a ModelRequest, on_event: StreamSink<'a>) -> Completion<'a> {
        Box::pin(async move {
            let response = self.reply(request)?;
            if let Some(text) = &response.text {
                for piece in text.split_inclusive(' ') {
                    on_event(StreamEvent::TextDelta(piece.to_owned()));
                }
            }
            for call in &response.tool_calls {
                on_event(StreamEvent::ToolCallStarted { id: call.id.clone(), name: call.name.clone() });
            }
            Ok(response)
        })
    }

    fn name(&self) -> &str {
        "scripted"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use goondan_core::{ToolCall, ToolResult};
    use serde_json::json;

    fn provider() -> ScriptedProvider {
        let replies = serde_json::from_value(json!([
            {"toolCalls": [{"name": "bash__exec", "args": {"command": "ls"}}, {"name": "x__y", "arguments": "{oops"}]},
            {"text": "All done here."}
        ]));
        ScriptedProvider::from_replies(replies.unwrap_or_default())
    }

    async fn complete(
        provider: &ScriptedProvider,
        messages: Vec<MessageData>,
    ) -> (Result<ModelResponse, ModelError>, Vec<StreamEvent>) {
        let request = ModelRequest { messages, ..ModelRequest::default() };
        crate::test_support::complete(provider, &request).await
    }

    #[tokio::test]
    async fn plays_the_script_step_by_step_within_each_turn() {
        let provider = provider();
        let user = MessageData::User { content: "go".into() };
        let (first, events) = complete(&provider, vec![user.clone()]).await;
        let Ok(first) = first else { panic!("first step") };
        assert_eq!(first.tool_calls.len(), 2);
        assert_eq!(first.tool_calls[0].arguments, r#"{"command":"ls"}"#);
        assert_eq!(first.tool_calls[1].arguments, "{oops");
        assert_eq!(first.stop_reason, Some(StopReason::ToolUse));
        assert_eq!(events.len(), 2);

        let assistant = MessageData::Assistant {
            content: None,
            tool_calls: vec![ToolCall::new("call_1_1", "bash__exec", serde_json::Map::new())],
        };
        let tool = MessageData::Tool {
            tool_call_id: "call_1_1".into(),
            tool_name: "bash__exec".into(),
            result: Box::new(ToolResult::ok(json!({}))),
        };
        let (second, events) = complete(&provider, vec![user.clone(), assistant.clone(), tool.clone()]).await;
        assert_eq!(second.ok().and_then(|r| r.text), Some("All done here.".to_owned()));
        assert_eq!(events, ["All ", "done ", "here."].map(|t| StreamEvent::TextDelta(t.to_owned())));

        // A new turn starts the script again.
        let history = vec![user.clone(), assistant.clone(), tool, MessageData::User { content: "again".into() }];
        let (again, _) = complete(&provider, history).await;
        assert_eq!(again.map(|r| r.tool_calls.len()), Ok(2));

        // Beyond the script: a clear error.
        let (beyond, _) = complete(&provider, vec![user, assistant.clone(), assistant]).await;
        assert!(matches!(beyond, Err(ModelError::Script(message)) if message.contains("step 3")));
    }
}
