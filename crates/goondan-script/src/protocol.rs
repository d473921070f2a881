//! The frames between goondan-rs and the JavaScript host: one JSON object a
//! line, tagged by `type`, over the host's Unix socket.
//!
//! Rust → JS: `call`, `cancel`, `inspect`. JS → Rust: `ready`, `result`,
//! `exports`, `cancelled`, `log`. Calls are matched to results (and
//! inspections to `exports`) by `id`, so any number may be in flight and
//! answers may come back in any order.

use goondan_core::{JsonObject, JsonValue};
use serde::{Deserialize, Serialize};

/// A frame to the host. Borrows what it sends, so a call copies its input
/// only into the serialized line.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum ToHost<'a> {
    /// Run `handlers[export](ctx, input)` of `module`.
    Call {
        /// Matches the result.
        id: u64,
        /// The module's absolute path.
        module: &'a str,
        /// The export (handler) name.
        export: &'a str,
        /// The validated arguments.
        input: &'a JsonObject,
        /// The JSON part of the ToolContext (the host adds `logger` and `runtime`).
        ctx: &'a JsonValue,
    },
    /// List the handler names `module` offers (`gdn validate`).
    Inspect {
        /// Matches the `exports` answer.
        id: u64,
        /// The module's absolute path.
        module: &'a str,
    },
    /// The caller gave up on call `id`; its result is no longer wanted.
    Cancel {
        /// The call.
        id: u64,
    },
}

/// A frame from the host.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum FromHost {
    /// Sent once, first: the host is connected and listening.
    Ready {
        /// `bun` or `node`.
        runtime: String,
        /// Its version.
        version: String,
    },
    /// A call finished.
    Result {
        /// The call.
        id: u64,
        /// Whether it returned (`output`) or threw (`error`).
        ok: bool,
        /// The returned value, as JSON.
        #[serde(default)]
        output: Option<JsonValue>,
        /// What was thrown.
        #[serde(default)]
        error: Option<ErrorBody>,
    },
    /// The answer to `inspect`: the names of the module's handlers, or why
    /// it failed to load.
    Exports {
        /// The inspection.
        id: u64,
        /// Whether the module loaded (`names`) or not (`error`).
        ok: bool,
        /// The handler names (keys of `handlers` whose values are functions).
        #[serde(default)]
        names: Vec<String>,
        /// Why the module did not load.
        #[serde(default)]
        error: Option<ErrorBody>,
    },
    /// The host saw a `cancel` and will drop the call's result.
    Cancelled {
        /// The call.
        id: u64,
    },
    /// A line from `ctx.logger` (with the call's id) or from the host itself.
    Log {
        /// `debug`, `info`, `warn` or `error`.
        level: String,
        /// The formatted line.
        message: String,
        /// The call that logged it.
        #[serde(default)]
        id: Option<u64>,
    },
}

/// A thrown value, as the host reports it.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorBody {
    /// `error.message`, or the thrown value as a string.
    #[serde(default)]
    pub message: String,
    /// `error.name`.
    #[serde(default)]
    pub name: Option<String>,
    /// `error.code`.
    #[serde(default)]
    pub code: Option<String>,
    /// `error.suggestion`.
    #[serde(default)]
    pub suggestion: Option<String>,
    /// `error.helpUrl`.
    #[serde(default)]
    pub help_url: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn frames_have_the_documented_shape() {
        let input = JsonObject::new();
        let ctx = json!({"agentName": "a"});
        let call = ToHost::Call { id: 7, module: "/m.ts", export: "run", input: &input, ctx: &ctx };
        assert_eq!(
            serde_json::to_value(&call).unwrap_or_default(),
            json!({"type": "call", "id": 7, "module": "/m.ts", "export": "run", "input": {}, "ctx": {"agentName": "a"}})
        );
        let frame: FromHost = serde_json::from_str(
            r#"{"type":"result","id":3,"ok":false,"error":{"message":"m","code":"E_X","helpUrl":"u"}}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        match frame {
            FromHost::Result { id: 3, ok: false, error: Some(error), .. } => {
                assert_eq!(error.code.as_deref(), Some("E_X"));
                assert_eq!(error.help_url.as_deref(), Some("u"));
            }
            other => panic!("{other:?}"),
        }
        let inspect = ToHost::Inspect { id: 2, module: "/m.ts" };
        assert_eq!(
            serde_json::to_value(&inspect).unwrap_or_default(),
            json!({"type": "inspect", "id": 2, "module": "/m.ts"})
        );
        let frame: FromHost = serde_json::from_str(r#"{"type":"exports","id":2,"ok":true,"names":["a","b"]}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        match frame {
            FromHost::Exports { id: 2, ok: true, names, error: None } => assert_eq!(names, ["a", "b"]),
            other => panic!("{other:?}"),
        }
    }
}
