//! The `self-restart` tool: `request{reason?}` asks the runtime to restart
//! the agent. The handler only answers with `restartRequested: true`; the
//! runtime acts on that output.

use std::sync::Arc;

use goondan_core::JsonObject;
use goondan_tools::{HandlerResult, ToolContext, ToolHandler, sync_handler};
use serde_json::json;

use crate::args;

/// The reason given when the caller gives none.
pub const DEFAULT_REASON: &str = "tool:self-restart";

/// The handler of `export`, or `None` if the tool has no such export.
pub fn handler(export: &str) -> Option<Arc<dyn ToolHandler>> {
    match export {
        "request" => Some(sync_handler(request)),
        _ => None,
    }
}

fn request(_ctx: &ToolContext, input: &JsonObject) -> HandlerResult {
    let reason = args::optional_string(input, "reason")?
        .map(str::trim)
        .filter(|reason| !reason.is_empty())
        .unwrap_or(DEFAULT_REASON);
    Ok(json!({"ok": true, "restartRequested": true, "restartReason": reason}).into())
}

#[cfg(test)]
mod tests {
    use goondan_core::JsonValue;
    use serde_json::json;

    use super::*;
    use crate::test_support::{call, err, ok};

    fn run(input: JsonValue) -> HandlerResult {
        call("self-restart", "request", input)
    }

    #[test]
    fn reason_is_trimmed() {
        let output = ok(run(json!({"reason": "  config changed \n"})));
        assert_eq!(output, json!({"ok": true, "restartRequested": true, "restartReason": "config changed"}));
    }

    #[test]
    fn missing_or_blank_reason_uses_default() {
        for input in [json!({}), json!({"reason": "   "}), json!({"reason": null})] {
            assert_eq!(ok(run(input))["restartReason"], json!(DEFAULT_REASON));
        }
    }

    #[test]
    fn wrong_type_fails() {
        assert_eq!(err(run(json!({"reason": 5}))).message, "'reason' must be a string, got integer");
    }

    #[test]
    fn unknown_export() {
        assert!(handler("now").is_none());
    }
}
