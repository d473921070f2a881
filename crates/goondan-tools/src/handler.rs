//! What a tool handler is: native Rust code behind one `resource__export`.
//!
//! Built-ins and embedders implement [`ToolHandler`]; script modules, MCP
//! servers and extensions will provide their own implementations, and the
//! executor treats them all alike.

use std::sync::Arc;

use goondan_core::codes::E_TOOL;
use goondan_core::{JsonObject, JsonValue, ToolError};

use crate::context::ToolContext;
use crate::pipeline::BoxFuture;

/// The value a handler produces when it does not fail.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolOutput {
    /// Finished: becomes `{status: "ok", output}`.
    Value(JsonValue),
    /// Submitted: becomes `{status: "pending", handle, output?}` (spec 004 §6.3).
    Pending {
        /// Names the submitted work.
        handle: String,
        /// Anything to say about it now.
        output: Option<JsonValue>,
    },
}

impl From<JsonValue> for ToolOutput {
    fn from(value: JsonValue) -> Self {
        Self::Value(value)
    }
}

impl ToolOutput {
    /// Reads the script-module convention for pending work: an object with
    /// `__async: true` and a string `handle` (spec 004 §6.3) becomes
    /// [`ToolOutput::Pending`] whose output is the rest of the object.
    pub fn from_json(value: JsonValue) -> Self {
        match value {
            JsonValue::Object(mut map)
                if map.get("__async") == Some(&JsonValue::Bool(true))
                    && map.get("handle").is_some_and(JsonValue::is_string) =>
            {
                let handle = match map.shift_remove("handle") {
                    Some(JsonValue::String(handle)) => handle,
                    _ => String::new(),
                };
                map.shift_remove("__async");
                let output = if map.is_empty() { None } else { Some(JsonValue::Object(map)) };
                Self::Pending { handle, output }
            }
            other => Self::Value(other),
        }
    }
}

/// How a handler fails: the parts of a [`ToolError`] it controls.
///
/// The executor fills in the defaults (`name: "Error"`, `code: "E_TOOL"`) and
/// truncates the message to the tool's `errorMessageLimit`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolFailure {
    /// The error's name; `Error` when empty.
    pub name: String,
    /// What went wrong.
    pub message: String,
    /// A specific code; `E_TOOL` when `None`.
    pub code: Option<String>,
    /// How to recover.
    pub suggestion: Option<String>,
    /// Where to read more.
    pub help_url: Option<String>,
}

impl ToolFailure {
    /// A failure with a message and the default name and code.
    pub fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), ..Self::default() }
    }

    /// A failure with its own code.
    pub fn with_code(message: impl Into<String>, code: impl Into<String>) -> Self {
        Self { message: message.into(), code: Some(code.into()), ..Self::default() }
    }

    /// Sets the error name (e.g. `TypeError`).
    #[must_use]
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Adds a suggestion.
    #[must_use]
    pub fn suggest(mut self, suggestion: impl Into<String>) -> Self {
        self.suggestion = Some(suggestion.into());
        self
    }

    /// Adds a documentation link.
    #[must_use]
    pub fn help_url(mut self, url: impl Into<String>) -> Self {
        self.help_url = Some(url.into());
        self
    }

    /// The structured error, with defaults applied (not yet truncated).
    pub fn into_tool_error(self) -> ToolError {
        let message =
            if self.message.trim().is_empty() { "Unknown tool execution error".to_owned() } else { self.message };
        ToolError {
            message,
            name: Some(if self.name.is_empty() { "Error".to_owned() } else { self.name }),
            code: Some(self.code.unwrap_or_else(|| E_TOOL.to_owned())),
            suggestion: self.suggestion,
            help_url: self.help_url,
        }
    }
}

/// What a handler returns.
pub type HandlerResult = Result<ToolOutput, ToolFailure>;

/// Executes one export of a tool.
pub trait ToolHandler: Send + Sync {
    /// Runs the call. `input` has already passed the catalog item's schema;
    /// a handler that needs to keep parts of it clones them.
    fn call<'a>(&'a self, ctx: &'a ToolContext, input: &'a JsonObject) -> BoxFuture<'a, HandlerResult>;
}

/// A handler from a synchronous function, for pure tools that never wait.
pub fn sync_handler<F>(f: F) -> Arc<dyn ToolHandler>
where
    F: Fn(&ToolContext, &JsonObject) -> HandlerResult + Send + Sync + 'static,
{
    Arc::new(SyncHandler(f))
}

struct SyncHandler<F>(F);

impl<F> ToolHandler for SyncHandler<F>
where
    F: Fn(&ToolContext, &JsonObject) -> HandlerResult + Send + Sync,
{
    fn call<'a>(&'a self, ctx: &'a ToolContext, input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        let result = (self.0)(ctx, input);
        Box::pin(std::future::ready(result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn async_convention_becomes_pending() {
        let output = ToolOutput::from_json(json!({"__async": true, "handle": "build-1", "message": "started"}));
        assert_eq!(
            output,
            ToolOutput::Pending { handle: "build-1".into(), output: Some(json!({"message": "started"})) }
        );
        let bare = ToolOutput::from_json(json!({"__async": true, "handle": "h"}));
        assert_eq!(bare, ToolOutput::Pending { handle: "h".into(), output: None });
        // Without a string handle it is an ordinary value.
        let plain = ToolOutput::from_json(json!({"__async": true, "handle": 3}));
        assert_eq!(plain, ToolOutput::Value(json!({"__async": true, "handle": 3})));
    }

    #[test]
    fn failure_defaults() {
        let error = ToolFailure::new("").into_tool_error();
        assert_eq!(error.message, "Unknown tool execution error");
        assert_eq!(error.name.as_deref(), Some("Error"));
        assert_eq!(error.code.as_deref(), Some("E_TOOL"));
        let error = ToolFailure::with_code("nope", "E_PATH")
            .named("PathError")
            .suggest("use a relative path")
            .into_tool_error();
        assert_eq!(error.code.as_deref(), Some("E_PATH"));
        assert_eq!(error.name.as_deref(), Some("PathError"));
        assert_eq!(error.suggestion.as_deref(), Some("use a relative path"));
    }
}
