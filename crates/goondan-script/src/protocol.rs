//! The frames between goondan-rs and the JavaScript host: one JSON object a
//! line, tagged by `type`, over the host's channel to gdn (an inherited socket).
//!
//! Rust → JS: `call`, `cancel`, `inspect`, `loadExtension`, `middleware`,
//! `nextResult`, `stateResult`, `taskResult`, `taskCancel`. JS → Rust:
//! `ready`, `result`, `exports`, `cancelled`, `log`, `extension`, `next`,
//! `done`, `state`, `agents`, `toolRuntime`, `task`, `registerTool`.
//! Requests are matched to answers by `id`, so any number may be in flight
//! and answers may come back in any order.
//!
//! A middleware layer is a conversation on one id: `middleware` starts the
//! JavaScript function; each `ctx.next()` sends `next` (with what the layer
//! changed) and waits for `nextResult` (the inner layers' result and the
//! context as they left it); `done` ends it. The host's own requests
//! (`state`, answered by `stateResult`) carry a separate `rid`.
//!
//! A tool's `ctx.tasks` (crate `tasks` module) sends `task` frames, answered
//! by `taskResult`; they outlive the call: a task is finished by its handle,
//! whenever the script gets to it. `taskCancel` tells the host that the
//! task's keeper asked its work to stop.

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
    /// List the handler names a Tool module offers, or whether an
    /// Extension module has `register` (`gdn validate`).
    Inspect {
        /// Matches the `exports` answer.
        id: u64,
        /// The module's absolute path.
        module: &'a str,
        /// `tool` or `extension`.
        kind: &'a str,
    },
    /// The caller gave up on call `id`; its result is no longer wanted.
    Cancel {
        /// The call.
        id: u64,
    },
    /// Run an export of a tool an extension registered (`api.tools.register`).
    ExtensionCall {
        /// Matches the result.
        id: u64,
        /// The tool's full name.
        tool: &'a str,
        /// The validated arguments.
        input: &'a JsonObject,
        /// The JSON part of the ToolContext.
        ctx: &'a JsonValue,
    },
    /// Import an extension module and run its `register(api, config)`.
    LoadExtension {
        /// Matches the `extension` answer.
        id: u64,
        /// The Extension resource's name.
        name: &'a str,
        /// The module's absolute path.
        module: &'a str,
        /// What `register` receives as its second argument.
        config: &'a JsonObject,
    },
    /// Run one JavaScript middleware layer.
    Middleware {
        /// The conversation's id.
        id: u64,
        /// `turn`, `step` or `toolCall`.
        pipeline: &'a str,
        /// The extension that registered it.
        extension: &'a str,
        /// Its position among the extension's layers of this pipeline.
        index: u32,
        /// The context the layer sees.
        ctx: JsonValue,
    },
    /// The answer to `next`: the inner result and the context after it.
    NextResult {
        /// The middleware conversation.
        id: u64,
        /// The inner layers' result, as JavaScript sees it.
        result: JsonValue,
        /// The context as the inner layers left it.
        ctx: JsonValue,
    },
    /// The answer to a host's `state` request.
    StateResult {
        /// The request.
        rid: u64,
        /// Whether it worked.
        ok: bool,
        /// The state (`get`).
        #[serde(skip_serializing_if = "Option::is_none")]
        value: Option<JsonValue>,
        /// Why not.
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// The answer to a host's `task` request.
    TaskResult {
        /// The request.
        rid: u64,
        /// Whether it worked.
        ok: bool,
        /// The answer (`{handle}` for a start, `{handle, state}` for a finish).
        #[serde(skip_serializing_if = "Option::is_none")]
        value: Option<JsonValue>,
        /// Why not.
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// The refusal's code (`E_TASK_FINISHED`, …): the JavaScript error's `code`.
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<String>,
    },
    /// The task's keeper asked its work to stop: abort its `signal`.
    TaskCancel {
        /// The task.
        handle: &'a str,
    },
}

impl ToHost<'_> {
    /// The `stateResult` answer to request `rid`: its value (none for a
    /// `set`), or why it failed.
    pub fn state_result(rid: u64, result: Result<Option<JsonValue>, String>) -> Self {
        match result {
            Ok(value) => ToHost::StateResult { rid, ok: true, value, error: None },
            Err(error) => ToHost::StateResult { rid, ok: false, value: None, error: Some(error) },
        }
    }
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
    /// The answer to `loadExtension`.
    Extension {
        /// The load.
        id: u64,
        /// Whether `register` returned.
        ok: bool,
        /// The layers it registered.
        #[serde(default)]
        middleware: Vec<MiddlewareDecl>,
        /// The tools it registered (catalog items as JSON).
        #[serde(default)]
        tools: Vec<JsonValue>,
        /// Why it failed.
        #[serde(default)]
        error: Option<ErrorBody>,
    },
    /// A middleware layer called `ctx.next()`.
    Next {
        /// The middleware conversation.
        id: u64,
        /// What the layer changed.
        #[serde(default)]
        ctx: JsonValue,
    },
    /// A middleware layer returned or threw.
    Done {
        /// The middleware conversation.
        id: u64,
        /// Whether it returned (`result`) or threw (`error`).
        ok: bool,
        /// What it returned.
        #[serde(default)]
        result: Option<JsonValue>,
        /// It returned what its last `next()` resolved to, unchanged.
        #[serde(default)]
        unchanged: bool,
        /// What the layer changed since its last `next()`.
        #[serde(default)]
        ctx: JsonValue,
        /// What it threw.
        #[serde(default)]
        error: Option<ErrorBody>,
    },
    /// `api.state.get()` / `api.state.set(value)`.
    State {
        /// Matches the `stateResult`.
        rid: u64,
        /// `get` or `set`.
        op: String,
        /// The extension.
        extension: String,
        /// The new state (`set`).
        #[serde(default)]
        value: Option<JsonValue>,
    },
    /// `ctx.agents.request(params)` / `ctx.agents.send(params)` of a turn or step layer.
    #[serde(rename_all = "camelCase")]
    Agents {
        /// Matches the `stateResult` that answers it.
        rid: u64,
        /// `request` or `send`.
        method: String,
        /// `{target, input, instanceKey?, timeoutMs?, async?, metadata?}`.
        #[serde(default)]
        params: JsonValue,
        /// The turn of the layer that asks.
        #[serde(default)]
        turn_id: String,
        /// Its trace.
        #[serde(default)]
        trace_id: String,
    },
    /// `ctx.runtime.request/send/spawn/list/catalog` of a JavaScript tool
    /// while its call `call` runs.
    ToolRuntime {
        /// Matches the `stateResult` that answers it.
        rid: u64,
        /// The id of the tool call that asks.
        call: u64,
        /// `request`, `send`, `spawn`, `list` or `catalog`.
        method: String,
        /// `{target?, event?, options?}` as the method's arguments.
        #[serde(default)]
        params: JsonValue,
    },
    /// `ctx.tasks` of a JavaScript tool: `start` (while the call `call`
    /// runs), or `finish` of `handle` (any time).
    Task {
        /// Matches the `taskResult`.
        rid: u64,
        /// `start` or `finish`.
        op: String,
        /// The tool call that asks (`start`).
        #[serde(default)]
        call: Option<u64>,
        /// The task (`finish`).
        #[serde(default)]
        handle: Option<String>,
        /// Completed (`output`) or failed (`error`).
        #[serde(default)]
        ok: bool,
        /// The result's output.
        #[serde(default)]
        output: Option<JsonValue>,
        /// Why it failed.
        #[serde(default)]
        error: Option<String>,
    },
    /// `api.tools.register` after `register()` returned.
    RegisterTool {
        /// The extension.
        extension: String,
        /// The catalog item.
        item: JsonValue,
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

/// A middleware layer an extension registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MiddlewareDecl {
    /// `turn`, `step` or `toolCall`.
    pub pipeline: String,
    /// Its priority (lower runs further out).
    #[serde(default)]
    pub priority: i32,
    /// Its position among the extension's layers of this pipeline.
    pub index: u32,
}

/// A thrown value, as the host reports it.
#[derive(Debug, Clone, Default, Deserialize)]
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
        let inspect = ToHost::Inspect { id: 2, module: "/m.ts", kind: "tool" };
        assert_eq!(
            serde_json::to_value(&inspect).unwrap_or_default(),
            json!({"type": "inspect", "id": 2, "module": "/m.ts", "kind": "tool"})
        );
        let frame: FromHost = serde_json::from_str(r#"{"type":"exports","id":2,"ok":true,"names":["a","b"]}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        match frame {
            FromHost::Exports { id: 2, ok: true, names, error: None } => assert_eq!(names, ["a", "b"]),
            other => panic!("{other:?}"),
        }
    }
}
