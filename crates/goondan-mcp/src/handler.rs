//! The [`ToolHandler`] of one MCP tool: `tools/call` on its server, and the
//! result mapped to a tool output.
//!
//! Text content is joined (read from the SDK's types: a result is mapped
//! on every call); `structuredContent`, when present, is the output
//! instead (it is what the tool's `outputSchema` describes). Images, audio
//! and embedded blobs are described by type and size rather than inlined:
//! a base64 payload in the conversation costs the model tokens it cannot
//! read. `isError` becomes an error result carrying the server's text.
//!
//! A server that answers with a task (the MCP tasks extension): with the
//! agent instance's tasks (`ctx.tasks()`) the call is `pending` at once
//! and the task is followed in the background until it ends the instance's
//! task (a cancel of that task sends `tasks/cancel`); without them the call
//! follows the task itself, within the executor's deadline.
//!
//! When the agent's events are on, each call carries a progress token and
//! the server's progress notifications become `tool.progress` events of the
//! call (its id and tool, `progress`, `total`, `message`).

use std::sync::Arc;

use goondan_core::ids::SpanIdGenerator;
use goondan_core::{JsonObject, JsonValue, ToolResult};
use goondan_tools::tasks::{TaskEnd, ToolTasks};
use goondan_tools::{
    BoxFuture, EventSink, HandlerResult, RuntimeEvent, ToolContext, ToolFailure, ToolHandler, ToolOutput,
};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ContentBlock, ProgressNotificationParam, ResourceContents, Task,
};

use crate::client::{self, Answer, ClientError, Connection, ProgressListener, Server, TaskOutcome};

/// The event a server's progress notification becomes.
pub const TOOL_PROGRESS_EVENT: &str = "tool.progress";

/// The tool reported an error (`isError: true`).
pub const E_MCP_TOOL_ERROR: &str = "E_MCP_TOOL_ERROR";
/// The server exited during the call, or is down and not yet restarted.
pub const E_MCP_SERVER_EXITED: &str = "E_MCP_SERVER_EXITED";
/// The server answered the request with a protocol error.
pub const E_MCP_REQUEST: &str = "E_MCP_REQUEST";
/// Every error code of MCP tool calls.
pub const CODES: &[&str] = &[E_MCP_TOOL_ERROR, E_MCP_SERVER_EXITED, E_MCP_REQUEST];

/// Calls one tool of one server.
#[derive(Debug)]
pub struct McpToolHandler {
    server: Arc<Server>,
    tool: String,
    progress: Option<ProgressEvents>,
}

/// Where a handler's progress events go.
#[derive(Clone)]
struct ProgressEvents {
    sink: Arc<dyn EventSink>,
    span_ids: Arc<SpanIdGenerator>,
}

impl std::fmt::Debug for ProgressEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgressEvents").finish_non_exhaustive()
    }
}

impl McpToolHandler {
    /// The handler of `tool` (the server's own name for it) on `server`.
    pub fn new(server: Arc<Server>, tool: impl Into<String>) -> Self {
        Self { server, tool: tool.into(), progress: None }
    }

    /// Asks the server for progress and emits it to `sink` as
    /// [`TOOL_PROGRESS_EVENT`]s of the call.
    #[must_use]
    pub fn with_progress_events(mut self, sink: Arc<dyn EventSink>, span_ids: Arc<SpanIdGenerator>) -> Self {
        self.progress = Some(ProgressEvents { sink, span_ids });
        self
    }

    /// Calls the tool outside a tool pipeline (no progress events).
    #[cfg(test)]
    async fn run(&self, input: &JsonObject) -> HandlerResult {
        self.call_with(None, input).await
    }

    async fn call_with(&self, ctx: Option<&ToolContext>, input: &JsonObject) -> HandlerResult {
        let connection = self.server.connection().await.map_err(|error| self.failure(&error))?;
        let params = CallToolRequestParams::new(self.tool.clone()).with_arguments(input.clone());
        let listener = match (&self.progress, ctx) {
            (Some(events), Some(ctx)) if events.sink.enabled() => Some(progress_listener(events.clone(), ctx)),
            _ => None,
        };
        let traceparent = ctx.map(ToolContext::traceparent);
        let (answered, route) = client::call_tool_answer(
            &connection,
            self.server.notifications(),
            params,
            listener,
            traceparent.as_deref(),
        )
        .await;
        // Progress sent before the answer is still delivered for a moment.
        drop(route);
        match answered {
            Ok(Answer::Complete(result)) => map_result(result),
            Ok(Answer::Task(task)) => match ctx.and_then(|ctx| ctx.tasks().map(|tasks| (ctx, tasks))) {
                Some((ctx, tasks)) => self.pend(ctx, Arc::clone(tasks), connection, task).await,
                None => {
                    let outcome = client::follow_task(&connection, task, std::future::pending()).await;
                    self.inline_end(&connection, outcome).await
                }
            },
            Err(error) => {
                if error == ClientError::Exited {
                    self.server.forget(&connection).await;
                }
                Err(self.failure(&error))
            }
        }
    }

    /// A task of the server as a task of the agent instance: opened in
    /// `tasks`, answered `pending` at once, and followed in the background
    /// until it ends (then finished with its end). A cancel of ours sends
    /// `tasks/cancel`.
    async fn pend(
        &self,
        ctx: &ToolContext,
        tasks: Arc<dyn ToolTasks>,
        connection: Arc<Connection>,
        task: Task,
    ) -> HandlerResult {
        let mcp_task_id = task.task_id.clone();
        let status_message = task.status_message.clone();
        // A server reached over HTTP keeps running its task when this
        // process ends: the task can be followed again after a restart.
        let opened = if self.server.is_remote() {
            let resume = serde_json::json!({"kind": RESUME_KIND, "server": self.server.name(),
                "tool": self.tool, "mcpTaskId": mcp_task_id});
            tasks.open_resumable(ctx, resume).await
        } else {
            tasks.open(ctx).await
        };
        let ticket = match opened {
            Ok(ticket) => ticket,
            Err(failure) => {
                // Nobody will follow it: the server may stop it.
                let peer = connection.peer().clone();
                // Fire and forget: the call fails now; the cancel is a courtesy to the server.
                tokio::spawn(async move {
                    let _ = peer.cancel_task(rmcp::model::CancelTaskParams::new(task.task_id)).await;
                });
                return Err(failure);
            }
        };
        follow_in_background(Arc::clone(&self.server), self.tool.clone(), tasks, ticket.clone(), connection, task);
        let mut output = JsonObject::new();
        output.insert("server".into(), JsonValue::from(self.server.name()));
        output.insert("tool".into(), JsonValue::from(self.tool.as_str()));
        output.insert("mcpTaskId".into(), JsonValue::from(mcp_task_id));
        if let Some(message) = status_message {
            output.insert("statusMessage".into(), JsonValue::from(message));
        }
        Ok(ToolOutput::Pending { handle: ticket.handle, output: Some(JsonValue::Object(output)) })
    }

    /// A server's task followed within the call (no agent instance keeps
    /// tasks): its end as the call's result.
    async fn inline_end(&self, connection: &Arc<Connection>, outcome: TaskOutcome) -> HandlerResult {
        match outcome {
            TaskOutcome::Completed(result) => map_result(result),
            TaskOutcome::Exited => {
                self.server.forget(connection).await;
                Err(self.failure(&ClientError::Exited))
            }
            other => Err(ToolFailure::with_code(
                format!("MCP server '{}': the task of '{}' failed: {}", self.server.name(), self.tool, other.reason()),
                E_MCP_REQUEST,
            )),
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
    fn call<'a>(&'a self, ctx: &'a ToolContext, input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        Box::pin(self.call_with(Some(ctx), input))
    }
}

/// Emits a call's progress notifications as its `tool.progress` events.
fn progress_listener(events: ProgressEvents, ctx: &ToolContext) -> ProgressListener {
    // The context is reference-counted: keeping it costs no copy.
    let ctx = ctx.clone();
    Arc::new(move |progress: &ProgressNotificationParam| {
        let mut payload = JsonObject::new();
        payload.insert("toolCallId".into(), JsonValue::from(ctx.tool_call_id()));
        payload.insert("toolName".into(), JsonValue::from(ctx.tool_name()));
        payload.insert("progress".into(), JsonValue::from(progress.progress));
        if let Some(total) = progress.total {
            payload.insert("total".into(), JsonValue::from(total));
        }
        if let Some(message) = &progress.message {
            payload.insert("message".into(), JsonValue::from(message.as_str()));
        }
        let payload = JsonValue::Object(payload);
        let now = goondan_core::message::now_millis();
        let span = events.span_ids.next_raw();
        events.sink.emit(&RuntimeEvent::custom(TOOL_PROGRESS_EVENT, &payload, ctx.scope(), span, now));
    })
}

/// Maps a `tools/call` result to a handler result.
pub fn map_result(result: CallToolResult) -> HandlerResult {
    let CallToolResult { content, structured_content, is_error, .. } = result;
    // One text block, the common answer, moves into the output uncopied.
    let text = match <[ContentBlock; 1]>::try_from(content) {
        Ok([ContentBlock::Text(block)]) => block.text,
        Ok([other]) => describe_block(other),
        Err(content) => content.into_iter().map(describe_block).collect::<Vec<_>>().join("\n"),
    };
    if is_error == Some(true) {
        let message = if text.trim().is_empty() { "the MCP tool reported an error".to_owned() } else { text };
        return Err(ToolFailure::with_code(message, E_MCP_TOOL_ERROR));
    }
    match structured_content {
        Some(structured) => Ok(ToolOutput::Value(structured)),
        None => Ok(ToolOutput::Value(JsonValue::String(text))),
    }
}

/// A handler result as the tool result the executor makes of it (without
/// its error-message limit): how a task's completion reads like the call's
/// own answer would have.
pub fn tool_result_of(result: HandlerResult) -> ToolResult {
    match result {
        Ok(ToolOutput::Value(value)) => ToolResult::ok(value),
        Ok(ToolOutput::Pending { handle, output }) => ToolResult::pending(handle, output),
        Err(failure) => ToolResult::error(failure.into_tool_error()),
    }
}

/// The bytes a base64 string decodes to.
fn decoded_len(base64: &str) -> usize {
    let trimmed = base64.trim_end_matches('=');
    trimmed.len() * 3 / 4
}

fn describe_block(block: ContentBlock) -> String {
    match block {
        ContentBlock::Text(text) => text.text,
        ContentBlock::Image(image) => format!("[image: {}, {} bytes]", image.mime_type, decoded_len(&image.data)),
        ContentBlock::Audio(audio) => format!("[audio: {}, {} bytes]", audio.mime_type, decoded_len(&audio.data)),
        ContentBlock::Resource(embedded) => match embedded.resource {
            // Embedded text is content the model can read.
            ResourceContents::TextResourceContents { text, .. } => text,
            ResourceContents::BlobResourceContents { uri, mime_type, blob, .. } => {
                let mime = mime_type.as_deref().unwrap_or("unknown type");
                format!("[resource {uri}: {mime}, {} bytes]", decoded_len(&blob))
            }
            _ => "[resource]".to_owned(),
        },
        ContentBlock::ResourceLink(link) if link.name.is_empty() => format!("[resource link: {}]", link.uri),
        ContentBlock::ResourceLink(link) => format!("[resource link {}: {}]", link.name, link.uri),
        // A kind newer than this build: named by its wire type.
        other => {
            let kind = serde_json::to_value(&other)
                .ok()
                .and_then(|v| v.get("type").and_then(|t| t.as_str().map(str::to_owned)));
            format!("[{} content]", kind.as_deref().unwrap_or("unknown"))
        }
    }
}

/// What a resumable task's `resume` says: an MCP server's task.
pub const RESUME_KIND: &str = "mcp";

/// Follows the server's `task` in the background until it ends, then
/// finishes the agent's task `ticket` with its end; a cancel of ours sends
/// `tasks/cancel`.
pub(crate) fn follow_in_background(
    server: Arc<Server>,
    tool: String,
    tasks: Arc<dyn ToolTasks>,
    ticket: goondan_tools::tasks::TaskTicket,
    connection: Arc<Connection>,
    task: Task,
) {
    let handle = ticket.handle.clone();
    let mut cancelled = ticket.cancelled;
    // Detached by design: its owner is the agent's task book, whose cancel ends it.
    tokio::spawn(async move {
        let cancel = async move {
            // A dropped sender is no cancel: the task is not cancelled then.
            if cancelled.wait_for(|cancelled| *cancelled).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let outcome = client::follow_task(&connection, task, cancel).await;
        let end = match outcome {
            TaskOutcome::Completed(result) => TaskEnd::Completed(tool_result_of(map_result(result))),
            TaskOutcome::Cancelled => TaskEnd::Cancelled("the MCP server cancelled the task".to_owned()),
            TaskOutcome::CancelledHere => {
                TaskEnd::Cancelled("cancelled (tasks/cancel sent to the MCP server)".to_owned())
            }
            TaskOutcome::Exited => {
                server.forget(&connection).await;
                TaskEnd::Failed(format!(
                    "{E_MCP_SERVER_EXITED}: MCP server '{}' exited while its task ran; the task is lost",
                    server.name()
                ))
            }
            other => TaskEnd::Failed(format!(
                "MCP server '{}': the task of '{tool}' failed: {}",
                server.name(),
                other.reason()
            )),
        };
        if let Err(failure) = tasks.finish(&handle, end).await {
            tracing::debug!(
                "MCP server '{}': task '{handle}' could not be finished: {}",
                server.name(),
                failure.message
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServerConfig;
    use goondan_core::{Message, ToolCall};
    use goondan_tools::{
        CallScope, ExecutorPolicy, MemoryEventSink, ToolCatalog, ToolCatalogItem, ToolExecutor, ToolRegistry,
        ToolSource,
    };
    use serde_json::json;
    use std::time::Duration;

    fn scope() -> Arc<CallScope> {
        Arc::new(CallScope {
            agent_name: Arc::from("agent"),
            instance_key: Arc::from("key"),
            turn_id: Arc::from("turn"),
            step_id: Arc::from("step"),
            step_index: 0,
            message: Arc::new(Message::assistant_tool_calls("step", Vec::new())),
            workdir: Arc::from(std::path::Path::new("/tmp")),
            trace_id: Arc::from("4bf92f3577b34da6a3ce929d0e0e4736"),
            step_span_id: Arc::from("00f067aa0ba902b7"),
            runtime: None,
            tasks: None,
        })
    }

    /// An executor whose only tool is `fake__TOOL`, with `policy` and events
    /// into the returned sink.
    fn executor_for(
        server: &Arc<Server>,
        tool: &str,
        policy: ExecutorPolicy,
    ) -> (ToolExecutor, Arc<ToolCatalog>, Arc<MemoryEventSink>) {
        let events = Arc::new(MemoryEventSink::new());
        let registry = Arc::new(ToolRegistry::new());
        let item = ToolCatalogItem::new(format!("fake__{tool}"), ToolSource::mcp("mcp", "fake"));
        let handler = McpToolHandler::new(Arc::clone(server), tool)
            .with_progress_events(Arc::clone(&events) as Arc<dyn EventSink>, Arc::new(SpanIdGenerator::new()));
        registry.register(item.clone(), Arc::new(handler)).unwrap_or_else(|e| panic!("{e}"));
        let catalog = Arc::new(std::iter::once(item).collect::<ToolCatalog>());
        let executor =
            ToolExecutor::new(registry).with_policy(policy).with_events(Arc::clone(&events) as Arc<dyn EventSink>);
        (executor, catalog, events)
    }

    fn call(tool: &str) -> ToolCall {
        ToolCall { id: Arc::from("call-1"), name: Arc::from(format!("fake__{tool}")), args: JsonObject::new() }
    }

    fn result(value: JsonValue) -> CallToolResult {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn text_is_joined_and_blobs_described() {
        let mapped = map_result(result(json!({"content": [
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
        let mapped = map_result(result(
            json!({"content": [{"type": "text", "text": "{\"a\":1}"}], "structuredContent": {"a": 1}}),
        ));
        assert_eq!(mapped, Ok(ToolOutput::Value(json!({"a": 1}))));
    }

    /// `node` to run `tests/fake-server.mjs`, or `None` (after saying why)
    /// to skip; with `GOONDAN_REQUIRE_MCP=1` (CI) a missing Node fails.
    fn fake_server() -> Option<crate::config::StdioServer> {
        let node = std::process::Command::new("node")
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !node {
            return goondan_test_support::skip_unless_required(
                "GOONDAN_REQUIRE_MCP",
                None,
                "no 'node' on PATH to run the fake MCP server",
                "no 'node' on PATH for the fake MCP server",
            );
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake-server.mjs");
        Some(crate::config::StdioServer {
            command: "node".into(),
            args: vec![script.into()],
            env: Vec::new(),
            cwd: None,
            sandbox: None,
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
        let (server, tools) = Server::start("fake", ServerConfig::Stdio(spec)).await.unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
        assert_eq!(names, ["echo", "die", "fail", "hang", "progress", "add_tool"]);
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
        let (server, _) = Server::start("fake", ServerConfig::Stdio(spec)).await.unwrap_or_else(|e| panic!("{e}"));
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
        // The first wait is the backoff plus up to as much again (jitter).
        tokio::time::sleep(crate::client::RESTART_BACKOFF * 2 + std::time::Duration::from_millis(50)).await;
        pid_of(&echo.run(&args).await);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_server_that_cannot_start_says_why() {
        let spec = crate::config::StdioServer {
            command: "goondan-no-such-mcp-server".into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
            sandbox: None,
        };
        let error =
            Server::start("missing", ServerConfig::Stdio(spec)).await.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.starts_with("cannot start 'goondan-no-such-mcp-server': "), "{error}");
    }

    #[test]
    fn is_error_is_an_error_with_the_servers_text() {
        let mapped =
            map_result(result(json!({"content": [{"type": "text", "text": "no such file"}], "isError": true})));
        assert_eq!(mapped, Err(ToolFailure::with_code("no such file", E_MCP_TOOL_ERROR)));
        let empty = map_result(result(json!({"content": [], "isError": true})));
        assert_eq!(empty, Err(ToolFailure::with_code("the MCP tool reported an error", E_MCP_TOOL_ERROR)));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_call_timeout_cancels_the_request_on_the_server() {
        let Some(mut spec) = fake_server() else { return };
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cancelled = dir.path().join("cancelled");
        spec.env.push(("FAKE_MCP_CANCELLED".into(), cancelled.display().to_string()));
        let (server, _) = Server::start("fake", ServerConfig::Stdio(spec)).await.unwrap_or_else(|e| panic!("{e}"));
        let policy = ExecutorPolicy { call_timeout: Some(Duration::from_millis(300)), ..ExecutorPolicy::default() };
        let (executor, catalog, _) = executor_for(&server, "hang", policy);
        let result = executor.execute(call("hang"), &scope(), &catalog).await;
        assert_eq!(result.error_code(), Some(goondan_core::codes::E_TOOL_TIMEOUT), "{result:?}");
        // The server hears of it.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !cancelled.exists() {
            assert!(std::time::Instant::now() < deadline, "no notifications/cancelled reached the server");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The server is still there for the next call.
        let (echo, catalog, _) = executor_for(&server, "echo", ExecutorPolicy::default());
        let result = echo.execute(call("echo"), &scope(), &catalog).await;
        assert!(!result.is_error(), "{result:?}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn progress_notifications_become_tool_progress_events_of_the_call() {
        let Some(spec) = fake_server() else { return };
        let (server, _) = Server::start("fake", ServerConfig::Stdio(spec)).await.unwrap_or_else(|e| panic!("{e}"));
        let (executor, catalog, events) = executor_for(&server, "progress", ExecutorPolicy::default());
        let result = executor.execute(call("progress"), &scope(), &catalog).await;
        assert!(!result.is_error(), "{result:?}");
        let progress = || -> Vec<JsonValue> {
            events.events().into_iter().filter(|event| event["type"] == TOOL_PROGRESS_EVENT).collect()
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while progress().len() < 3 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut progress = progress();
        assert_eq!(progress.len(), 3, "{:?}", events.events());
        // Each notification is handled by a task of its own.
        progress.sort_by(|a, b| {
            a["progress"].as_f64().partial_cmp(&b["progress"].as_f64()).unwrap_or(std::cmp::Ordering::Equal)
        });
        for (index, event) in progress.iter().enumerate() {
            assert_eq!(event["toolCallId"], "call-1", "{event}");
            assert_eq!(event["toolName"], "fake__progress", "{event}");
            assert_eq!(event["progress"], json!(f64::from(u8::try_from(index + 1).unwrap_or(0))), "{event}");
            assert_eq!(event["total"], json!(3.0), "{event}");
            assert_eq!(event["message"], format!("step {}", index + 1), "{event}");
            assert_eq!(event["turnId"], "turn", "{event}");
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_tool_list_change_is_noted_and_the_new_list_read_once() {
        let Some(spec) = fake_server() else { return };
        let (server, _) = Server::start("fake", ServerConfig::Stdio(spec)).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(!server.may_have_changed());
        assert_eq!(server.changed_tools().await.map(|tools| tools.is_some()), Ok(false));
        let added = McpToolHandler::new(Arc::clone(&server), "add_tool").run(&JsonObject::new()).await;
        assert_eq!(added, Ok(ToolOutput::Value(json!("added"))));
        // The notification was written before the answer, so it is handled.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !server.may_have_changed() {
            assert!(std::time::Instant::now() < deadline, "no tools/list_changed noted");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let tools = server.changed_tools().await.unwrap_or_else(|e| panic!("{e}")).unwrap_or_default();
        assert!(tools.iter().any(|tool| tool.name == "extra"), "{tools:?}");
        assert_eq!(server.changed_tools().await.map(|tools| tools.is_some()), Ok(false));

        // A restart hands the restarted server's list over too.
        let _ = McpToolHandler::new(Arc::clone(&server), "die").run(&JsonObject::new()).await;
        let _ = McpToolHandler::new(Arc::clone(&server), "echo").run(&JsonObject::new()).await;
        let relisted = server.changed_tools().await.unwrap_or_else(|e| panic!("{e}")).unwrap_or_default();
        assert_eq!(relisted.len(), 6, "{relisted:?}");
    }
}
