//! Tool calls and their results (spec 002 §6.2, §8).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{JsonObject, JsonValue};

/// One call a model asked for: `{id, name, args}` (spec 002 §6.2).
///
/// The id and name are shared strings: the conversation, the handler's
/// context and the call's events all hold them without copying.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call id the model generated.
    pub id: Arc<str>,
    /// The full tool name, e.g. `bash__exec`.
    pub name: Arc<str>,
    /// The arguments as a JSON object.
    #[serde(default)]
    pub args: JsonObject,
}

impl ToolCall {
    /// A call of `name` with `args`, identified by `id`.
    pub fn new(id: impl Into<Arc<str>>, name: impl Into<Arc<str>>, args: JsonObject) -> Self {
        Self { id: id.into(), name: name.into(), args }
    }
}

/// The outcome class of a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolStatus {
    /// Finished with an output.
    Ok,
    /// Failed; `error` says why.
    Error,
    /// Accepted and still running; `handle` names the work (spec 004 §6.3).
    Pending,
}

impl ToolStatus {
    /// The wire spelling: `ok`, `error` or `pending`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Error => "error",
            Self::Pending => "pending",
        }
    }
}

/// The structured error of a failed call (spec 002 §8.1).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolError {
    /// What went wrong, already truncated to the tool's `errorMessageLimit`.
    pub message: String,
    /// The error's name or type, e.g. `ToolNotInCatalogError`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A stable code, e.g. `E_TOOL_INVALID_ARGS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// How the caller can recover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suggestion: Option<String>,
    /// Where to read more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub help_url: Option<String>,
}

impl ToolError {
    /// An error with a code, a name and a message.
    pub fn new(code: impl Into<String>, name: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            name: Some(name.into()),
            code: Some(code.into()),
            suggestion: None,
            help_url: None,
        }
    }

    /// Adds a suggestion.
    #[must_use]
    pub fn with_suggestion(mut self, suggestion: impl Into<String>) -> Self {
        self.suggestion = Some(suggestion.into());
        self
    }

    /// Adds a documentation link.
    #[must_use]
    pub fn with_help_url(mut self, help_url: impl Into<String>) -> Self {
        self.help_url = Some(help_url.into());
        self
    }

    /// Sets `helpUrl` to the help catalog's entry of the error's code
    /// ([`crate::help::help_url`]), unless it has one already or the
    /// catalog does not know the code.
    pub fn link_help(&mut self) {
        if self.help_url.is_none() {
            self.help_url = self.code.as_deref().and_then(crate::help::help_url);
        }
    }

    /// [`link_help`](Self::link_help), by value.
    #[must_use]
    pub fn linked(mut self) -> Self {
        self.link_help();
        self
    }
}

/// The result of one tool call: `{status, output?, handle?, error?}` (spec 002 §8.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// `ok`, `error` or `pending`.
    pub status: ToolStatus,
    /// The output of a finished call (or the accompanying payload of a pending one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<JsonValue>,
    /// The handle of submitted asynchronous work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handle: Option<String>,
    /// Why the call failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ToolError>,
}

impl ToolResult {
    /// A finished call with its output.
    pub fn ok(output: JsonValue) -> Self {
        Self { status: ToolStatus::Ok, output: Some(output), handle: None, error: None }
    }

    /// A failed call.
    pub fn error(error: ToolError) -> Self {
        Self { status: ToolStatus::Error, output: None, handle: None, error: Some(error) }
    }

    /// Submitted work that completes later under `handle`.
    pub fn pending(handle: impl Into<String>, output: Option<JsonValue>) -> Self {
        Self { status: ToolStatus::Pending, output, handle: Some(handle.into()), error: None }
    }

    /// True for `status: "error"`.
    pub fn is_error(&self) -> bool {
        self.status == ToolStatus::Error
    }

    /// The error code, if this is an error with one.
    pub fn error_code(&self) -> Option<&str> {
        self.error.as_ref().and_then(|e| e.code.as_deref())
    }

    /// Truncates the error message (if any) to `limit` characters with the
    /// rule of [`truncate_error_message`].
    pub fn truncate_error(&mut self, limit: usize) {
        if let Some(error) = self.error.as_mut() {
            truncate_error_message(&mut error.message, limit);
        }
    }

    /// Links the error (if any) to its help entry: [`ToolError::link_help`].
    pub fn link_help(&mut self) {
        if let Some(error) = self.error.as_mut() {
            error.link_help();
        }
    }
}

const TRUNCATION_SUFFIX: &str = "... (truncated)";
const TRUNCATION_SUFFIX_CHARS: usize = 15;

/// Truncates `message` in place to at most `limit` characters.
///
/// Unchanged within the limit; otherwise the first `limit - 15` characters
/// followed by `... (truncated)`, so the result is exactly `limit` characters;
/// when `limit <= 15`, just the first `limit` characters (spec 002 §8.4, and
/// the original's rule for tiny limits). Characters are Unicode scalar values,
/// so a cut never splits one.
pub fn truncate_error_message(message: &mut String, limit: usize) {
    // Byte length bounds the character count from above: a cheap early exit for
    // the common short message.
    if message.len() <= limit {
        return;
    }
    let char_count = message.chars().count();
    if char_count <= limit {
        return;
    }
    if limit <= TRUNCATION_SUFFIX_CHARS {
        let cut = byte_index_of_char(message, limit);
        message.truncate(cut);
        return;
    }
    let cut = byte_index_of_char(message, limit - TRUNCATION_SUFFIX_CHARS);
    message.truncate(cut);
    message.push_str(TRUNCATION_SUFFIX);
}

fn byte_index_of_char(text: &str, char_index: usize) -> usize {
    text.char_indices().nth(char_index).map_or(text.len(), |(index, _)| index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn result_json_has_exactly_the_spec_fields() {
        let ok = ToolResult::ok(json!({"a": 1}));
        assert_eq!(serde_json::to_value(&ok).ok(), Some(json!({"status": "ok", "output": {"a": 1}})));

        let err = ToolResult::error(
            ToolError::new("E_TOOL", "Error", "boom")
                .with_suggestion("retry")
                .with_help_url("https://docs.goondan.ai/errors/E_TOOL"),
        );
        assert_eq!(
            serde_json::to_value(&err).ok(),
            Some(json!({"status": "error", "error": {
                "message": "boom", "name": "Error", "code": "E_TOOL",
                "suggestion": "retry", "helpUrl": "https://docs.goondan.ai/errors/E_TOOL"}}))
        );

        let pending = ToolResult::pending("build-1", Some(json!({"message": "started"})));
        assert_eq!(
            serde_json::to_value(&pending).ok(),
            Some(json!({"status": "pending", "output": {"message": "started"}, "handle": "build-1"}))
        );
    }

    #[test]
    fn link_help_adds_the_catalog_entry_and_keeps_a_tool_own_link() {
        let mut known = ToolResult::error(ToolError::new("E_TOOL_TIMEOUT", "ToolTimeoutError", "slow"));
        known.link_help();
        assert_eq!(
            known.error.and_then(|e| e.help_url).as_deref(),
            Some("https://github.com/goondan/goondan-rs/blob/main/docs/ERRORS.md#e_tool_timeout")
        );
        let own = ToolError::new("E_TOOL", "Error", "x").with_help_url("https://example.com/mine").linked();
        assert_eq!(own.help_url.as_deref(), Some("https://example.com/mine"));
        // A code of the tool's own, or none: no link that would explain nothing.
        assert_eq!(ToolError::new("E_MY_TOOL_BROKE", "Error", "x").linked().help_url, None);
        assert_eq!(ToolError { message: "x".into(), ..ToolError::default() }.linked().help_url, None);
        let mut ok = ToolResult::ok(json!(1));
        ok.link_help();
        assert_eq!(ok, ToolResult::ok(json!(1)));
    }

    #[test]
    fn truncation_keeps_short_messages() {
        let mut message = "x".repeat(1000);
        truncate_error_message(&mut message, 1000);
        assert_eq!(message.len(), 1000);
    }

    #[test]
    fn truncation_makes_exactly_limit_chars_with_suffix() {
        let mut message = "a".repeat(1001);
        truncate_error_message(&mut message, 1000);
        assert_eq!(message.chars().count(), 1000);
        assert!(message.ends_with("... (truncated)"));
        assert_eq!(&message[..985], "a".repeat(985));
    }

    #[test]
    fn truncation_with_tiny_limit_has_no_suffix() {
        let mut message = "abcdefghijklmnopqrstuvwxyz".to_owned();
        truncate_error_message(&mut message, 15);
        assert_eq!(message, "abcdefghijklmno");
        let mut message = "abcdefghijklmnopqrstuvwxyz".to_owned();
        truncate_error_message(&mut message, 16);
        assert_eq!(message, "a... (truncated)");
        let mut message = "abc".to_owned();
        truncate_error_message(&mut message, 0);
        assert_eq!(message, "");
    }

    #[test]
    fn truncation_counts_characters_not_bytes() {
        // 20 Hangul syllables: 60 bytes, 20 characters.
        let mut message = "가".repeat(20);
        truncate_error_message(&mut message, 20);
        assert_eq!(message, "가".repeat(20));
        truncate_error_message(&mut message, 18);
        assert_eq!(message, format!("{}... (truncated)", "가".repeat(3)));
    }
}
