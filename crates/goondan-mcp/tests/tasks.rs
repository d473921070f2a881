//! The MCP tasks extension (`io.modelcontextprotocol/tasks`, 2026-07-28)
//! from the client's side, against a real server: `tests/tasks-server.py`
//! (fastmcp 4.1.4 with fastmcp-tasks 4.1.4), whose tools run as tasks.
//!
//! With an agent instance's tasks (a `TaskBook` here) a call the server runs
//! as a task answers `pending` at once, past the call timeout, and the
//! bridge follows the task to its end in the book: completed, failed,
//! cancelled (ours: `tasks/cancel` reaches the server), input asked, the
//! server gone. Without them (`gdn tool call`) the call follows the task
//! itself, within the executor's deadline.
//!
//! The server runs on the Python of `GOONDAN_TEST_MCP_PYTHON`, else of the
//! repository's `.cache/py` (scripts/test installs the packages); without
//! `fastmcp_tasks` there the tests skip, or with `GOONDAN_REQUIRE_MCP=1` fail.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use goondan_core::codes::E_TOOL_TIMEOUT;
use goondan_core::{JsonObject, ToolCall, ToolResult, ToolStatus};
use goondan_mcp::client::Server;
use goondan_mcp::config::{ServerConfig, StdioServer};
use goondan_mcp::handler::{E_MCP_REQUEST, E_MCP_TOOL_ERROR, McpToolHandler};
use goondan_runtime::tasks::TaskBook;
use goondan_test_support::call_scope;
use goondan_tools::tasks::{TaskState, TaskView, ToolTasks};
use goondan_tools::{CallScope, ExecutorPolicy, ToolCatalog, ToolCatalogItem, ToolExecutor, ToolRegistry, ToolSource};
use serde_json::{Value, json};

/// The Python with fastmcp and fastmcp-tasks, or `None` (after saying why)
/// to skip.
fn python() -> Option<PathBuf> {
    let python = std::env::var_os("GOONDAN_TEST_MCP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/py/bin/python"));
    let imports = std::process::Command::new(&python)
        .args(["-c", "import fastmcp, fastmcp_tasks"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if imports {
        return Some(python);
    }
    let why = format!("no Python with fastmcp and fastmcp-tasks at {} (see scripts/test)", python.display());
    goondan_test_support::skip_unless_required("GOONDAN_REQUIRE_MCP", None, &why, &why)
}

/// The fixture server, started; `cancelled` is the file it writes when a
/// task of `slow` is cancelled.
async fn start(python: &Path, cancelled: &Path) -> Arc<Server> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tasks-server.py");
    let spec = StdioServer {
        command: python.display().to_string(),
        args: vec![script.into()],
        env: vec![("TASKS_SERVER_CANCELLED".into(), cancelled.display().to_string())],
        cwd: None,
        sandbox: None,
    };
    let (server, tools) =
        Server::start("tasky", ServerConfig::Stdio(spec)).await.unwrap_or_else(|e| panic!("start: {e}"));
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    assert_eq!(names, ["slow", "broken", "failing", "ask", "die", "quick"]);
    server
}

fn scope(tasks: Option<Arc<dyn ToolTasks>>) -> Arc<CallScope> {
    Arc::new(CallScope { tasks, ..call_scope("agent", "key", Path::new("/tmp")) })
}

/// Calls `tool` of `server` with `args` through an executor of `timeout`.
async fn call(
    server: &Arc<Server>,
    tool: &str,
    args: Value,
    timeout: Option<Duration>,
    tasks: Option<Arc<dyn ToolTasks>>,
) -> ToolResult {
    let registry = Arc::new(ToolRegistry::new());
    let item = ToolCatalogItem::new(format!("tasky__{tool}"), ToolSource::mcp("mcp", "tasky"));
    registry
        .register(item.clone(), Arc::new(McpToolHandler::new(Arc::clone(server), tool)))
        .unwrap_or_else(|e| panic!("{e}"));
    let catalog = Arc::new(std::iter::once(item).collect::<ToolCatalog>());
    let executor =
        ToolExecutor::new(registry).with_policy(ExecutorPolicy { call_timeout: timeout, ..ExecutorPolicy::default() });
    let args: JsonObject = args.as_object().cloned().unwrap_or_default();
    let call = ToolCall { id: Arc::from("call-1"), name: Arc::from(format!("tasky__{tool}")), args };
    executor.execute(call, &scope(tasks), &catalog).await
}

fn book(dir: &Path) -> Arc<TaskBook> {
    Arc::new(TaskBook::open(dir).unwrap_or_else(|e| panic!("{e}")))
}

/// The pending result's handle, after checking what it says of the task.
fn pending_handle(result: &ToolResult, tool: &str) -> String {
    assert_eq!(result.status, ToolStatus::Pending, "{result:?}");
    let output = result.output.clone().unwrap_or_default();
    assert_eq!(output["server"], "tasky", "{output}");
    assert_eq!(output["tool"], tool, "{output}");
    assert!(output["mcpTaskId"].as_str().is_some_and(|id| !id.is_empty()), "{output}");
    result.handle.clone().unwrap_or_else(|| panic!("no handle: {result:?}"))
}

async fn ended(book: &TaskBook, handle: &str) -> TaskView {
    let view = book.wait_for(handle, Duration::from_secs(30)).await.unwrap_or_else(|e| panic!("{e:?}"));
    assert!(view.state.is_final(), "{view:?}");
    view
}

async fn wait_for_file(path: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !path.exists() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_the_server_runs_as_a_task_is_pending_past_the_call_timeout_and_completes() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let server = start(&python, &dir.path().join("cancelled")).await;
    let book = book(dir.path());
    let started = Instant::now();
    // The call timeout is shorter than the work: the task outlives it.
    let timeout = Some(Duration::from_millis(1500));
    let result = call(&server, "slow", json!({"seconds": 2.5, "text": "hi"}), timeout, Some(book.clone())).await;
    let handle = pending_handle(&result, "slow");
    assert!(started.elapsed() < Duration::from_millis(1500), "{:?}", started.elapsed());
    let view = ended(&book, &handle).await;
    assert_eq!(view.state, TaskState::Completed, "{view:?}");
    assert_eq!(view.tool, "tasky__slow");
    assert_eq!(view.call_id, "call-1");
    // As the call's own answer would have read: the structured content.
    assert_eq!(view.result, Some(ToolResult::ok(json!({"result": "hi after 2.5s"}))), "{view:?}");
    assert!(started.elapsed() >= Duration::from_millis(2500));

    // A tool the server runs outside tasks answers as before.
    let quick = call(&server, "quick", json!({"x": 21}), timeout, Some(book.clone())).await;
    assert_eq!(quick, ToolResult::ok(json!({"result": 42})));
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_the_task_cancels_it_on_the_server() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cancelled = dir.path().join("cancelled");
    let server = start(&python, &cancelled).await;
    let book = book(dir.path());
    let result = call(&server, "slow", json!({"seconds": 60}), None, Some(book.clone())).await;
    let handle = pending_handle(&result, "slow");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let view = book.cancel_task(&handle).await.unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(view.state, TaskState::Cancelled, "{view:?}");
    assert!(view.reason.as_deref().is_some_and(|r| r.contains("tasks/cancel")), "{view:?}");
    wait_for_file(&cancelled, "the server's task was not cancelled").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_task_an_input_request_and_a_dead_server_end_the_task_failed() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let server = start(&python, &dir.path().join("cancelled")).await;
    let book = book(dir.path());

    // An error result is the task's result, as it would be the call's.
    let broken = call(&server, "broken", json!({"message": "the disk is full"}), None, Some(book.clone())).await;
    let view = ended(&book, &pending_handle(&broken, "broken")).await;
    assert_eq!(view.state, TaskState::Completed, "{view:?}");
    let result = view.result.unwrap_or_else(|| panic!("no result"));
    assert_eq!(result.error_code(), Some(E_MCP_TOOL_ERROR), "{result:?}");
    assert!(result.error.as_ref().is_some_and(|e| e.message.contains("the disk is full")), "{result:?}");

    // A JSON-RPC error fails the task.
    let failing = call(&server, "failing", json!({"message": "no quota"}), None, Some(book.clone())).await;
    let view = ended(&book, &pending_handle(&failing, "failing")).await;
    assert_eq!(view.state, TaskState::Failed, "{view:?}");
    let reason = view.reason.unwrap_or_default();
    assert!(reason.contains("MCP server 'tasky'") && reason.contains("no quota (JSON-RPC error -32050)"), "{reason}");

    let ask = call(&server, "ask", json!({}), None, Some(book.clone())).await;
    let view = ended(&book, &pending_handle(&ask, "ask")).await;
    assert_eq!(view.state, TaskState::Failed, "{view:?}");
    assert!(view.reason.as_deref().is_some_and(|r| r.contains("asked for input")), "{view:?}");

    let die = call(&server, "die", json!({}), None, Some(book.clone())).await;
    let view = ended(&book, &pending_handle(&die, "die")).await;
    assert_eq!(view.state, TaskState::Failed, "{view:?}");
    assert!(view.reason.as_deref().is_some_and(|r| r.contains("E_MCP_SERVER_EXITED")), "{view:?}");

    // The server is started again for the next call.
    let quick = call(&server, "quick", json!({"x": 2}), None, Some(book.clone())).await;
    assert_eq!(quick, ToolResult::ok(json!({"result": 4})));
}

#[tokio::test(flavor = "multi_thread")]
async fn without_an_instances_tasks_the_call_follows_the_task_within_its_deadline() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cancelled = dir.path().join("cancelled");
    let server = start(&python, &cancelled).await;

    let done = call(&server, "slow", json!({"seconds": 1, "text": "inline"}), None, None).await;
    assert_eq!(done, ToolResult::ok(json!({"result": "inline after 1.0s"})));

    let broken = call(&server, "broken", json!({"message": "nope"}), None, None).await;
    assert_eq!(broken.error_code(), Some(E_MCP_TOOL_ERROR), "{broken:?}");
    assert!(broken.error.as_ref().is_some_and(|e| e.message.contains("nope")), "{broken:?}");
    let failing = call(&server, "failing", json!({"message": "no quota"}), None, None).await;
    assert_eq!(failing.error_code(), Some(E_MCP_REQUEST), "{failing:?}");
    assert!(failing.error.as_ref().is_some_and(|e| e.message.contains("no quota")), "{failing:?}");

    // The executor's deadline holds the whole call; the task is cancelled.
    let cut = call(&server, "slow", json!({"seconds": 60}), Some(Duration::from_millis(800)), None).await;
    assert_eq!(cut.error_code(), Some(E_TOOL_TIMEOUT), "{cut:?}");
    wait_for_file(&cancelled, "the timed-out call's task was not cancelled").await;
}
