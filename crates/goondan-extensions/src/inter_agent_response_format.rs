//! `inter-agent-response-format`: the answer to an asynchronous
//! `agents__request` reaches the caller as readable text instead of JSON.
//!
//! The swarm puts such an answer into the caller's conversation as a user
//! message whose content is the original's `inter_agent_response` JSON and
//! whose metadata `__goondanInterAgentResponse` describes the request
//! (`goondan_agent::swarm`). Before each step this layer
//! replaces every such message not yet formatted with
//!
//! ```text
//! [inter-agent response] worker -> coordinator status=ok requestId=…
//! <the response: a string as is, anything else as indented JSON>
//! ```
//!
//! or `error(CODE): message` for a failed or timed-out request, plus
//! `requestMetadata=<JSON>` when `includeRequestMetadata` (default false)
//! and the request had metadata. The replacement keeps the message's id,
//! time and metadata, adds `__goondanInterAgentResponseFormatted: true` and
//! has the source `extension` `inter-agent-response-format`, exactly as the
//! original writes it. Messages whose metadata does not have the original's
//! shape (kind, version 1, ids, `async: true`, status, `receivedAt`) are left
//! alone.

use std::sync::Arc;

use goondan_core::{JsonObject, JsonValue, Message, MessageData, MessageEvent, MessageSource};
use goondan_runtime::context::{StepContext, StepOutcome};
use goondan_runtime::extension::{AgentExtension, ExtensionError, ExtensionSetup};
use goondan_tools::{BoxFuture, Middleware, Next};

use crate::emit_all;
use crate::fields::Fields;

/// The Extension's name.
pub(crate) const NAME: &str = "inter-agent-response-format";

/// The metadata key the swarm marks an asynchronous answer with.
const RESPONSE_KEY: &str = "__goondanInterAgentResponse";
/// The metadata key of an answer already formatted.
const FORMATTED_KEY: &str = "__goondanInterAgentResponseFormatted";

/// Installs the step layer.
pub(crate) fn install(setup: &mut ExtensionSetup<'_>, extension: &AgentExtension) -> Result<(), ExtensionError> {
    let include_request_metadata =
        Fields::new(&extension.name, &extension.config).boolean("includeRequestMetadata", false)?;
    let layer = Formatter { extension: extension.name.clone(), include_request_metadata };
    setup.tooling.step_middleware.register(extension.name.as_str(), 0, Arc::new(layer));
    Ok(())
}

struct Formatter {
    extension: String,
    include_request_metadata: bool,
}

impl Middleware<StepContext, StepOutcome> for Formatter {
    fn handle<'a>(
        &'a self,
        ctx: &'a mut StepContext,
        next: Next<'a, StepContext, StepOutcome>,
    ) -> BoxFuture<'a, StepOutcome> {
        let replacements: Vec<MessageEvent> = ctx
            .conversation
            .messages()
            .iter()
            .filter_map(|message| self.format(message))
            .map(|message| MessageEvent::Replace { target_id: message.id.clone(), message })
            .collect();
        emit_all(NAME, &mut ctx.conversation, replacements);
        next.run(ctx)
    }
}

/// The fields of `__goondanInterAgentResponse` the text uses, once checked.
struct ResponseMetadata<'a> {
    request_id: &'a str,
    from: &'a str,
    to: &'a str,
    status: &'a str,
    error_code: Option<&'a str>,
    error_message: Option<&'a str>,
    request_metadata: Option<&'a JsonObject>,
}

impl<'a> ResponseMetadata<'a> {
    /// The metadata of an unformatted answer, if `message` is one.
    fn of(message: &'a Message) -> Option<Self> {
        if !matches!(message.data, MessageData::User { .. })
            || message.metadata.get(FORMATTED_KEY) == Some(&JsonValue::Bool(true))
        {
            return None;
        }
        let metadata = message.metadata.get(RESPONSE_KEY)?.as_object()?;
        let text = |key: &str| metadata.get(key).and_then(JsonValue::as_str).filter(|value| !value.is_empty());
        let status = text("status")?;
        let valid = text("kind") == Some("inter_agent_response")
            && metadata.get("version").and_then(JsonValue::as_f64) == Some(1.0)
            && text("requestEventId").is_some()
            && metadata.get("async") == Some(&JsonValue::Bool(true))
            && matches!(status, "ok" | "error" | "timeout")
            && text("receivedAt").is_some();
        if !valid {
            return None;
        }
        Some(Self {
            request_id: text("requestId")?,
            from: text("fromAgentId")?,
            to: text("toAgentId")?,
            status,
            error_code: text("errorCode"),
            error_message: text("errorMessage"),
            request_metadata: metadata.get("requestMetadata").and_then(JsonValue::as_object),
        })
    }
}

impl Formatter {
    fn format(&self, message: &Message) -> Option<Message> {
        let metadata = ResponseMetadata::of(message)?;
        let MessageData::User { content } = &message.data else { return None };
        // The content is the `inter_agent_response` object, kept as JSON text.
        let content = serde_json::from_str::<JsonValue>(content).ok();
        let content = content.as_ref().and_then(JsonValue::as_object);
        let mut lines = vec![format!(
            "[inter-agent response] {} -> {} status={} requestId={}",
            metadata.from, metadata.to, metadata.status, metadata.request_id
        )];
        if metadata.status == "ok" {
            let payload = content.and_then(|content| content.get("response")).map(stringify).unwrap_or_default();
            if !payload.is_empty() {
                lines.push(payload);
            }
        } else {
            let error = content.and_then(|content| content.get("error")).and_then(JsonValue::as_object);
            let from_content = |key: &str| error.and_then(|error| error.get(key)).and_then(JsonValue::as_str);
            let code = metadata.error_code.or_else(|| from_content("code")).unwrap_or("AGENT_REQUEST_ERROR");
            let text = metadata.error_message.or_else(|| from_content("message")).unwrap_or("agent request failed");
            lines.push(format!("error({code}): {text}"));
        }
        if self.include_request_metadata
            && let Some(request_metadata) = metadata.request_metadata
        {
            lines.push(format!("requestMetadata={}", stringify(&JsonValue::Object(request_metadata.clone()))));
        }
        let mut formatted = message.clone();
        formatted.data = MessageData::User { content: lines.join("\n") };
        formatted.metadata.insert(FORMATTED_KEY.to_owned(), JsonValue::Bool(true));
        formatted.source = MessageSource::Extension { extension_name: self.extension.clone() };
        Some(formatted)
    }
}

/// A string as is, anything else as JSON indented by two spaces (the
/// original's `JSON.stringify(value, null, 2)`).
fn stringify(value: &JsonValue) -> String {
    match value {
        JsonValue::String(text) => text.clone(),
        other => serde_json::to_string_pretty(other).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn answer(content: JsonValue, metadata: JsonValue) -> Message {
        let mut message = Message::new(MessageData::User { content: content.to_string() }, MessageSource::User);
        message.metadata.insert(RESPONSE_KEY.to_owned(), metadata);
        message
    }

    fn metadata(status: &str) -> JsonValue {
        json!({
            "kind": "inter_agent_response", "version": 1, "requestId": "r1", "requestEventId": "e1",
            "fromAgentId": "worker", "toAgentId": "coordinator", "async": true, "status": status,
            "receivedAt": "2026-01-01T00:00:00.000Z", "requestMetadata": {"ticket": 7}
        })
    }

    fn text(message: &Message) -> &str {
        match &message.data {
            MessageData::User { content } => content,
            _ => "",
        }
    }

    #[test]
    fn answers_are_formatted_as_the_original_formats_them() {
        let formatter = Formatter { extension: NAME.to_owned(), include_request_metadata: true };
        let ok = answer(json!({"type": "inter_agent_response", "response": "all done"}), metadata("ok"));
        let formatted = formatter.format(&ok).unwrap_or_else(|| panic!("not formatted"));
        assert_eq!(
            text(&formatted),
            "[inter-agent response] worker -> coordinator status=ok requestId=r1\nall done\nrequestMetadata={\n  \"ticket\": 7\n}"
        );
        assert_eq!(formatted.id, ok.id);
        assert_eq!(formatted.metadata[FORMATTED_KEY], true);
        assert_eq!(formatted.metadata[RESPONSE_KEY], ok.metadata[RESPONSE_KEY]);
        assert_eq!(formatted.source, MessageSource::Extension { extension_name: NAME.to_owned() });
        // Formatted once only.
        assert!(formatter.format(&formatted).is_none());

        let plain = Formatter { extension: NAME.to_owned(), include_request_metadata: false };
        let object = answer(json!({"response": {"n": 1}}), metadata("ok"));
        assert_eq!(
            text(&plain.format(&object).unwrap_or_else(|| panic!("no"))),
            "[inter-agent response] worker -> coordinator status=ok requestId=r1\n{\n  \"n\": 1\n}"
        );
        let failed = answer(json!({"error": {"code": "AGENT_CRASHED", "message": "it died"}}), metadata("error"));
        assert_eq!(
            text(&plain.format(&failed).unwrap_or_else(|| panic!("no"))),
            "[inter-agent response] worker -> coordinator status=error requestId=r1\nerror(AGENT_CRASHED): it died"
        );
        let timeout = answer(json!({}), metadata("timeout"));
        assert!(
            text(&plain.format(&timeout).unwrap_or_else(|| panic!("no")))
                .ends_with("error(AGENT_REQUEST_ERROR): agent request failed")
        );
    }

    #[test]
    fn other_messages_are_left_alone() {
        let formatter = Formatter { extension: NAME.to_owned(), include_request_metadata: false };
        let plain = Message::new(MessageData::User { content: "hi".into() }, MessageSource::User);
        assert!(formatter.format(&plain).is_none());
        let mut wrong = metadata("ok");
        wrong["async"] = json!(false);
        assert!(formatter.format(&answer(json!({"response": "x"}), wrong)).is_none());
        let mut wrong = metadata("ok");
        wrong["version"] = json!(2);
        assert!(formatter.format(&answer(json!({"response": "x"}), wrong)).is_none());
        assert!(formatter.format(&answer(json!({"response": "x"}), metadata("maybe"))).is_none());
    }
}
