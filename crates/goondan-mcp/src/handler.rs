//! The [`ToolHandler`] of one MCP tool: `tools/call` on its server, and the
//! result mapped to a tool output.
//!
//! Text content is joined; `structuredContent`, when present, is the output
//! instead (it is what the tool's `outputSchema` describes). Images, audio
//! and embedded blobs are described by type and size rather than inlined:
//! a base64 payload in the conversation costs the model tokens it cannot
//! read. `isError` becomes an error result carrying the server's text.

use std::sync::Arc;

use goondan_core::{JsonObject, JsonValue};
use goondan_tools::{BoxFuture, HandlerResult, ToolContext, ToolFailure, ToolHandler, ToolOutput};
use rmcp::model::{CallToolRequestParams, CallToolResult};

use crate::client::{self, ClientError, Server};

/// The tool reported an error (`isError: true`).
pub const E_MCP_TOOL_ERROR: &str = "E_MCP_TOOL_ERROR";
/// The server exited during the call, or is down and not yet restarted.
pub const E_MCP_SERVER_EXITED: &str = "E_MCP_SERVER_EXITED";
/// The server answered the request with a protocol error.
pub const E_MCP_REQUEST: &str = "E_MCP_REQUEST";

/// Calls one tool of one server.
#[derive(Debug)]
pub struct McpToolHandler {
    server: Arc<Server>,
    tool: String,
}

impl McpToolHandler {
    /// The handler of `tool` (the server's own name for it) on `server`.
    pub fn new(server: Arc<Server>, tool: impl Into<String>) -> Self {
        Self { server, tool: tool.into() }
    }

    async fn run(&self, input: &JsonObject) -> HandlerResult {
        let connection = self.server.connection().await.map_err(|error| self.failure(&error))?;
        let params = CallToolRequestParams::new(self.tool.clone()).with_arguments(input.clone());
        match client::call_tool(&connection, params).await {
            Ok(result) => map_result(&result),
            Err(error) => {
                if error == ClientError::Exited {
                    self.server.forget(&connection).await;
                }
                Err(self.failure(&error))
            }
        }
    }

    fn failure(&self, error: &ClientError) -> ToolFailure {
        let server = self.server.name();
        match error {
            ClientError::Request(message) => ToolFailure::with_code(
                format!("MCP server '{server}' refused the call to '{}': {message}", self.tool),
                E_MCP_REQUEST,
            ),
            other => ToolFailure::with_code(format!("MCP server '{server}': {other}"), E_MCP_SERVER_EXITED)
                .suggest("The server is restarted for the next call; try again."),
        }
    }
}

impl ToolHandler for McpToolHandler {
    fn call<'a>(&'a self, _ctx: &'a ToolContext, input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        Box::pin(self.run(input))
    }
}

/// Maps a `tools/call` result to a handler result.
pub fn map_result(result: &CallToolResult) -> HandlerResult {
    // Read through JSON: the content blocks' wire shape is the stable part
    // of the protocol, the SDK's enums around it change between releases.
    let wire = serde_json::to_value(result).map_err(|e| ToolFailure::with_code(e.to_string(), E_MCP_REQUEST))?;
    let parts: Vec<String> =
        wire.get("content").and_then(JsonValue::as_array).into_iter().flatten().map(describe_block).collect();
    let text = parts.join("\n");
    if result.is_error == Some(true) {
        let message = if text.trim().is_empty() { "the MCP tool reported an error".to_owned() } else { text };
        return Err(ToolFailure::with_code(message, E_MCP_TOOL_ERROR));
    }
    match &result.structured_content {
        Some(structured) => Ok(ToolOutput::Value(structured.clone())),
        None => Ok(ToolOutput::Value(JsonValue::String(text))),
    }
}

/// The bytes a base64 string decodes to.
fn decoded_len(base64: &str) -> usize {
    let trimmed = base64.trim_end_matches('=');
    trimmed.len() * 3 / 4
}

fn str_field<'a>(value: &'a JsonValue, key: &str) -> Option<&'a str> {
    value.get(key).and_then(JsonValue::as_str)
}

fn describe_block(block: &JsonValue) -> String {
    let kind = str_field(block, "type").unwrap_or("unknown");
    match kind {
        "text" => str_field(block, "text").unwrap_or_default().to_owned(),
        "image" | "audio" => {
            let mime = str_field(block, "mimeType").unwrap_or("unknown type");
            let size = decoded_len(str_field(block, "data").unwrap_or_default());
            format!("[{kind}: {mime}, {size} bytes]")
        }
        "resource" => {
            let resource = block.get("resource").unwrap_or(&JsonValue::Null);
            let uri = str_field(resource, "uri").unwrap_or("");
            match (str_field(resource, "text"), str_field(resource, "blob")) {
                // Embedded text is content the model can read.
                (Some(text), _) => text.to_owned(),
                (None, Some(blob)) => {
                    let mime = str_field(resource, "mimeType").unwrap_or("unknown type");
                    format!("[resource {uri}: {mime}, {} bytes]", decoded_len(blob))
                }
                (None, None) => format!("[resource {uri}]"),
            }
        }
        "resource_link" => {
            let uri = str_field(block, "uri").unwrap_or("");
            match str_field(block, "name") {
                Some(name) => format!("[resource link {name}: {uri}]"),
                None => format!("[resource link: {uri}]"),
            }
        }
        other => format!("[{other} content]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result(value: JsonValue) -> CallToolResult {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn text_is_joined_and_blobs_described() {
        let mapped = map_result(&result(json!({"content": [
            {"type": "text", "text": "one"},
            {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///a", "text": "inside"}},
            {"type": "resource", "resource": {"uri": "file:///b", "blob": "AAAA", "mimeType": "application/zip"}},
            {"type": "text", "text": "two"},
        ]})));
        assert_eq!(
            mapped,
            Ok(ToolOutput::Value(json!(
                "one\n[image: image/png, 5 bytes]\ninside\n[resource file:///b: application/zip, 3 bytes]\ntwo"
            )))
        );
    }

    #[test]
    fn structured_content_is_the_output() {
        let mapped = map_result(&result(
            json!({"content": [{"type": "text", "text": "{\"a\":1}"}], "structuredContent": {"a": 1}}),
        ));
        assert_eq!(mapped, Ok(ToolOutput::Value(json!({"a": 1}))));
    }

    /// `node` to run `tests/fake-server.mjs`, or `None` (after saying why)
    /// to skip; with `GOONDAN_REQUIRE_MCP=1` (CI) a missing Node fails.
    #[allow(clippy::print_stderr)]
    fn fake_server() -> Option<crate::config::StdioServer> {
        let node = std::process::Command::new("node")
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !node {
            assert!(
                std::env::var("GOONDAN_REQUIRE_MCP").as_deref() != Ok("1"),
                "GOONDAN_REQUIRE_MCP=1 but no 'node' on PATH"
            );
            eprintln!("skipping: no 'node' on PATH to run the fake MCP server");
            return None;
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake-server.mjs");
        Some(crate::config::StdioServer {
            command: "node".into(),
            args: vec![script.into()],
            env: Vec::new(),
            cwd: None,
        })
    }

    fn pid_of(result: &HandlerResult) -> String {
        match result {
            Ok(ToolOutput::Value(JsonValue::String(text))) => {
                text.strip_prefix("a from ").unwrap_or_else(|| panic!("{text}")).to_owned()
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_server_that_dies_fails_its_call_and_restarts_for_the_next() {
        let Some(spec) = fake_server() else { return };
        let (server, tools) = Server::start("fake", spec).await.unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
        assert_eq!(names, ["echo", "die", "fail"]);
        let echo = McpToolHandler::new(Arc::clone(&server), "echo");
        let args = match json!({"text": "a"}) {
            JsonValue::Object(map) => map,
            _ => JsonObject::new(),
        };
        let first = pid_of(&echo.run(&args).await);

        let died = McpToolHandler::new(Arc::clone(&server), "die").run(&JsonObject::new()).await;
        let failure = died.err().unwrap_or_else(|| panic!("'die' succeeded"));
        assert_eq!(failure.code.as_deref(), Some(E_MCP_SERVER_EXITED), "{failure:?}");
        assert!(failure.message.contains("MCP server 'fake'"), "{failure:?}");

        // The next call starts the server again.
        let second = pid_of(&echo.run(&args).await);
        assert_ne!(first, second);

        let failed = McpToolHandler::new(Arc::clone(&server), "fail").run(&JsonObject::new()).await;
        assert_eq!(failed, Err(ToolFailure::with_code("it broke", E_MCP_TOOL_ERROR)));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn restarts_back_off_while_the_server_cannot_start() {
        let Some(mut spec) = fake_server() else { return };
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let gate = dir.path().join("gate");
        std::fs::write(&gate, "").unwrap_or_else(|e| panic!("{e}"));
        spec.env.push(("FAKE_MCP_GATE".into(), gate.display().to_string()));
        let (server, _) = Server::start("fake", spec).await.unwrap_or_else(|e| panic!("{e}"));
        let echo = McpToolHandler::new(Arc::clone(&server), "echo");
        let args = match json!({"text": "a"}) {
            JsonValue::Object(map) => map,
            _ => JsonObject::new(),
        };

        std::fs::remove_file(&gate).unwrap_or_else(|e| panic!("{e}"));
        let died = McpToolHandler::new(Arc::clone(&server), "die").run(&JsonObject::new()).await;
        assert_eq!(died.err().and_then(|f| f.code).as_deref(), Some(E_MCP_SERVER_EXITED));
        // The restart fails ...
        let failed = echo.run(&args).await.err().unwrap_or_else(|| panic!("the restart succeeded"));
        assert_eq!(failed.code.as_deref(), Some(E_MCP_SERVER_EXITED), "{failed:?}");
        assert!(failed.message.contains("its stderr ends with: the gate is closed"), "{failed:?}");
        // ... and the next call does not try again before the backoff.
        let waiting = echo.run(&args).await.err().unwrap_or_else(|| panic!("the restart succeeded"));
        assert!(waiting.message.contains("the next start is attempted in"), "{waiting:?}");

        std::fs::write(&gate, "").unwrap_or_else(|e| panic!("{e}"));
        tokio::time::sleep(crate::client::RESTART_BACKOFF + std::time::Duration::from_millis(50)).await;
        pid_of(&echo.run(&args).await);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_server_that_cannot_start_says_why() {
        let spec = crate::config::StdioServer {
            command: "goondan-no-such-mcp-server".into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
        };
        let error = Server::start("missing", spec).await.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.starts_with("cannot start 'goondan-no-such-mcp-server': "), "{error}");
    }

    #[test]
    fn is_error_is_an_error_with_the_servers_text() {
        let mapped =
            map_result(&result(json!({"content": [{"type": "text", "text": "no such file"}], "isError": true})));
        assert_eq!(mapped, Err(ToolFailure::with_code("no such file", E_MCP_TOOL_ERROR)));
        let empty = map_result(&result(json!({"content": [], "isError": true})));
        assert_eq!(empty, Err(ToolFailure::with_code("the MCP tool reported an error", E_MCP_TOOL_ERROR)));
    }
}
