//! The files the original Goondan's tools read, written beside our own as
//! exports: `messages/runtime-events.jsonl` (its runtime-event records:
//! `gdn logs --agent/--trace`, the eval harness of `packages/eval`) and
//! `messages/base.jsonl` (the conversation in its message shape, where the
//! eval harness finds the answer).
//!
//! They are derived and observational: messages.jsonl stays the one
//! journal and events.jsonl the event log, nothing here is ever read back
//! as state, and neither export is synced. runtime-events.jsonl is appended
//! by the event log's writer thread ([`InstanceStore::runtime_events_export`],
//! `goondan_tools::events::original` maps each event). base.jsonl is
//! written at the end of each turn as the original folds its base: the
//! turn's new messages appended when the conversation only grew since the
//! last export, else the whole conversation rewritten atomically (a temp
//! file renamed over it, so a reader never sees half of it)
//! ([`InstanceStore::write_base_export`]).
//!
//! The message shape (`{id, data: {role, content}, metadata, createdAt,
//! source}`, [`base_export_lines`]) is the one the original's runtime
//! writes: user and system text as a string; an assistant reply as the AI
//! SDK's parts (`text`, then `tool-call` with `input`); a tool result as a
//! `tool` message with one `tool-result` part whose `output` is `{type:
//! "text" | "json", value}` — an error as the text the original gives the
//! model (`ERROR: …`, `CODE: …`, `SUGGESTION: …`, `HELP: …`); `createdAt`
//! as `Date.toJSON` writes it.

use std::fs::{self, File};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::PathBuf;

use goondan_core::js_message::Rfc3339Millis;
use goondan_core::{JsonValue, Message, MessageData, ToolCall, ToolResult, ToolStatus};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

use super::error::StoreError;
use super::files::{create_private_dir_all, private_file};
use super::instance::InstanceStore;

impl InstanceStore {
    /// The directory of the exports in an instance directory (the original's
    /// `messages/`).
    pub const EXPORT_DIR: &'static str = "messages";

    /// The conversation export in [`InstanceStore::EXPORT_DIR`].
    pub const BASE_EXPORT_FILE: &'static str = "base.jsonl";

    /// The runtime-event export in [`InstanceStore::EXPORT_DIR`].
    pub const RUNTIME_EVENTS_FILE: &'static str = "runtime-events.jsonl";

    /// `messages/` of this instance, made if missing.
    fn export_dir(&self) -> Result<PathBuf, StoreError> {
        let dir = self.dir.join(Self::EXPORT_DIR);
        create_private_dir_all(&dir).map_err(StoreError::io("creating the export directory", &dir))?;
        Ok(dir)
    }

    /// `messages/runtime-events.jsonl` opened for appending, for
    /// `goondan_tools::JsonLinesEventSink::with_export`. A last line left
    /// without its newline (a crash mid-write) is ended first, so the next
    /// record starts a line of its own.
    pub fn runtime_events_export(&self) -> Result<File, StoreError> {
        let path = self.export_dir()?.join(Self::RUNTIME_EVENTS_FILE);
        let opened = (|| {
            let mut file = private_file().read(true).append(true).create(true).open(&path)?;
            if file.seek(SeekFrom::End(0))? > 0 {
                file.seek(SeekFrom::End(-1))?;
                let mut last = [0_u8; 1];
                file.read_exact(&mut last)?;
                if last[0] != b'\n' {
                    file.write_all(b"\n")?;
                }
            }
            Ok(file)
        })();
        opened.map_err(StoreError::io("opening the runtime-events export", &path))
    }

    /// Writes `lines` (from [`base_export_lines`]) to `messages/base.jsonl`:
    /// appended when `append`, else replacing the file atomically (a temp
    /// file beside it, renamed over it; not synced: it is an export).
    pub fn write_base_export(&self, lines: &[u8], append: bool) -> Result<(), StoreError> {
        let dir = self.export_dir()?;
        let path = dir.join(Self::BASE_EXPORT_FILE);
        if append {
            let mut file = private_file()
                .append(true)
                .create(true)
                .open(&path)
                .map_err(StoreError::io("opening the conversation export", &path))?;
            return file.write_all(lines).map_err(StoreError::io("appending to the conversation export", &path));
        }
        let temp = dir.join(format!(".{}.{}.tmp", Self::BASE_EXPORT_FILE, std::process::id()));
        let written = private_file()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&temp)
            .and_then(|mut file| file.write_all(lines))
            .and_then(|()| fs::rename(&temp, &path));
        if let Err(error) = written {
            let _ = fs::remove_file(&temp);
            return Err(StoreError::io("writing the conversation export", &path)(error));
        }
        Ok(())
    }
}

/// Appends `messages` to `out` as lines of the original's base.jsonl (see
/// the module docs for the shape).
pub fn base_export_lines(messages: &[Message], out: &mut Vec<u8>) {
    for message in messages {
        // Serializing into memory fails only for a map with non-string
        // keys, which a `JsonValue` cannot hold.
        if serde_json::to_writer(&mut *out, &OriginalMessage(message)).is_ok() {
            out.push(b'\n');
        }
    }
}

/// A message in the original's shape.
struct OriginalMessage<'a>(&'a Message);

impl Serialize for OriginalMessage<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let message = self.0;
        let mut map = serializer.serialize_map(Some(5))?;
        map.serialize_entry("id", &message.id)?;
        map.serialize_entry("data", &Data(&message.data))?;
        map.serialize_entry("metadata", &message.metadata)?;
        map.serialize_entry("createdAt", &Rfc3339Millis(message.created_at))?;
        map.serialize_entry("source", &message.source)?;
        map.end()
    }
}

/// `{role, content}`.
struct Data<'a>(&'a MessageData);

impl Serialize for Data<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        match self.0 {
            MessageData::System { content } => {
                map.serialize_entry("role", "system")?;
                map.serialize_entry("content", content)?;
            }
            MessageData::User { content } => {
                map.serialize_entry("role", "user")?;
                map.serialize_entry("content", content)?;
            }
            MessageData::Assistant { content, tool_calls } => {
                map.serialize_entry("role", "assistant")?;
                map.serialize_entry("content", &AssistantParts { text: content.as_deref(), calls: tool_calls })?;
            }
            MessageData::Tool { tool_call_id, tool_name, result } => {
                map.serialize_entry("role", "tool")?;
                map.serialize_entry("content", &[ToolResultPart { tool_call_id, tool_name, result }])?;
            }
        }
        map.end()
    }
}

/// An assistant reply's parts: its text (when it has any), then its calls.
struct AssistantParts<'a> {
    text: Option<&'a str>,
    calls: &'a [ToolCall],
}

impl Serialize for AssistantParts<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let text = self.text.filter(|text| !text.is_empty());
        let mut seq = serializer.serialize_seq(Some(self.calls.len() + usize::from(text.is_some())))?;
        if let Some(text) = text {
            seq.serialize_element(&TextPart(text))?;
        }
        for call in self.calls {
            seq.serialize_element(&ToolCallPart(call))?;
        }
        seq.end()
    }
}

struct TextPart<'a>(&'a str);

impl Serialize for TextPart<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("type", "text")?;
        map.serialize_entry("text", self.0)?;
        map.end()
    }
}

struct ToolCallPart<'a>(&'a ToolCall);

impl Serialize for ToolCallPart<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(4))?;
        map.serialize_entry("type", "tool-call")?;
        map.serialize_entry("toolCallId", &*self.0.id)?;
        map.serialize_entry("toolName", &*self.0.name)?;
        map.serialize_entry("input", &self.0.args)?;
        map.end()
    }
}

struct ToolResultPart<'a> {
    tool_call_id: &'a str,
    tool_name: &'a str,
    result: &'a ToolResult,
}

impl Serialize for ToolResultPart<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(4))?;
        map.serialize_entry("type", "tool-result")?;
        map.serialize_entry("toolCallId", self.tool_call_id)?;
        map.serialize_entry("toolName", self.tool_name)?;
        map.serialize_entry("output", &Output(self.result))?;
        map.end()
    }
}

/// The original's `toToolResultOutput` of a result: `{type, value}`.
struct Output<'a>(&'a ToolResult);

impl Serialize for Output<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let result = self.0;
        let mut map = serializer.serialize_map(Some(2))?;
        match result.status {
            ToolStatus::Error => {
                map.serialize_entry("type", "text")?;
                map.serialize_entry("value", &error_text(result))?;
            }
            ToolStatus::Ok => match &result.output {
                Some(JsonValue::String(text)) => {
                    map.serialize_entry("type", "text")?;
                    map.serialize_entry("value", text)?;
                }
                // Already an output of the AI SDK's (a JavaScript tool's).
                Some(JsonValue::Object(output))
                    if matches!(output.get("type").and_then(JsonValue::as_str), Some("text" | "json"))
                        && output.contains_key("value") =>
                {
                    map.serialize_entry("type", &output["type"])?;
                    map.serialize_entry("value", &output["value"])?;
                }
                other => {
                    map.serialize_entry("type", "json")?;
                    map.serialize_entry("value", other.as_ref().unwrap_or(&JsonValue::Null))?;
                }
            },
            // Work under way: what the model was told, as JSON.
            ToolStatus::Pending => {
                map.serialize_entry("type", "json")?;
                map.serialize_entry("value", result)?;
            }
        }
        map.end()
    }
}

/// An error result as the original's runtime words it for the model.
fn error_text(result: &ToolResult) -> String {
    let error = result.error.as_ref();
    let message = error.map(|e| e.message.trim()).filter(|m| !m.is_empty()).unwrap_or("unknown tool error");
    let mut text = format!("ERROR: {message}");
    let mut line = |label: &str, value: Option<&String>| {
        if let Some(value) = value.filter(|v| !v.trim().is_empty()) {
            text.push_str(&format!("\n{label}: {value}"));
        }
    };
    line("CODE", error.and_then(|e| e.code.as_ref()));
    line("SUGGESTION", error.and_then(|e| e.suggestion.as_ref()));
    line("HELP", error.and_then(|e| e.help_url.as_ref()));
    text
}

#[cfg(test)]
mod tests {
    use goondan_core::{JsonObject, MessageSource, ToolError};
    use serde_json::json;

    use super::*;

    fn line(message: &Message) -> JsonValue {
        let mut out = Vec::new();
        base_export_lines(std::slice::from_ref(message), &mut out);
        assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1, "one line");
        serde_json::from_slice(&out).unwrap_or_else(|e| panic!("json: {e}"))
    }

    fn at(message: Message) -> Message {
        Message { id: "m1".to_owned(), created_at: 1_795_496_645_123, ..message }
    }

    #[test]
    fn user_and_system_text_is_a_string() {
        let mut user = at(Message::new(MessageData::User { content: "hi".to_owned() }, MessageSource::User));
        user.metadata.insert("deliveryKey".to_owned(), json!("k1"));
        assert_eq!(
            line(&user),
            json!({
                "id": "m1", "data": {"role": "user", "content": "hi"}, "metadata": {"deliveryKey": "k1"},
                "createdAt": "2026-11-24T05:04:05.123Z", "source": {"type": "user"},
            })
        );
        let system = at(Message::new(MessageData::System { content: "be brief".to_owned() }, MessageSource::System));
        assert_eq!(line(&system)["data"], json!({"role": "system", "content": "be brief"}));
        assert_eq!(line(&system)["source"], json!({"type": "system"}));
    }

    #[test]
    fn an_assistant_reply_is_text_and_tool_call_parts() {
        let mut args = JsonObject::new();
        args.insert("command".to_owned(), json!("ls"));
        let reply = at(Message::new(
            MessageData::Assistant {
                content: Some("Looking.".to_owned()),
                tool_calls: vec![ToolCall::new("call_1", "bash__exec", args)],
            },
            MessageSource::Assistant { step_id: "s1".to_owned() },
        ));
        assert_eq!(
            line(&reply)["data"],
            json!({"role": "assistant", "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool-call", "toolCallId": "call_1", "toolName": "bash__exec", "input": {"command": "ls"}},
            ]})
        );
        assert_eq!(line(&reply)["source"], json!({"type": "assistant", "stepId": "s1"}));

        let answer = at(Message::new(
            MessageData::Assistant { content: Some("4".to_owned()), tool_calls: Vec::new() },
            MessageSource::Assistant { step_id: "s2".to_owned() },
        ));
        assert_eq!(line(&answer)["data"]["content"], json!([{"type": "text", "text": "4"}]));
        let calls_only = at(Message::new(
            MessageData::Assistant { content: Some(String::new()), tool_calls: Vec::new() },
            MessageSource::Assistant { step_id: "s3".to_owned() },
        ));
        assert_eq!(line(&calls_only)["data"]["content"], json!([]));
    }

    fn tool(result: ToolResult) -> JsonValue {
        let message = at(Message::new(
            MessageData::Tool {
                tool_call_id: "call_1".to_owned(),
                tool_name: "bash__exec".to_owned(),
                result: Box::new(result),
            },
            MessageSource::Tool { tool_call_id: "call_1".to_owned(), tool_name: "bash__exec".to_owned() },
        ));
        let line = line(&message);
        assert_eq!(line["source"], json!({"type": "tool", "toolCallId": "call_1", "toolName": "bash__exec"}));
        assert_eq!(line["data"]["role"], "tool");
        let parts = line["data"]["content"].as_array().cloned().unwrap_or_default();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0]["type"], "tool-result");
        assert_eq!(parts[0]["toolCallId"], "call_1");
        assert_eq!(parts[0]["toolName"], "bash__exec");
        parts[0]["output"].clone()
    }

    #[test]
    fn tool_results_are_the_originals_outputs() {
        assert_eq!(tool(ToolResult::ok(json!("plain"))), json!({"type": "text", "value": "plain"}));
        assert_eq!(
            tool(ToolResult::ok(json!({"stdout": "a\n", "exitCode": 0}))),
            json!({"type": "json", "value": {"stdout": "a\n", "exitCode": 0}})
        );
        assert_eq!(
            tool(ToolResult::ok(json!({"type": "text", "value": "as given"}))),
            json!({"type": "text", "value": "as given"})
        );
        assert_eq!(tool(ToolResult::ok(json!([1, 2]))), json!({"type": "json", "value": [1, 2]}));

        let mut error = ToolError::new("E_TOOL_TIMEOUT", "TimeoutError", "took too long");
        error.suggestion = Some("raise timeoutMs".to_owned());
        assert_eq!(
            tool(ToolResult::error(error)),
            json!({"type": "text", "value": "ERROR: took too long\nCODE: E_TOOL_TIMEOUT\nSUGGESTION: raise timeoutMs"})
        );
        let pending = tool(ToolResult::pending("task-1", Some(json!({"started": true}))));
        assert_eq!(pending["type"], "json");
        assert_eq!(pending["value"]["status"], "pending");
        assert_eq!(pending["value"]["handle"], "task-1");
    }
}
