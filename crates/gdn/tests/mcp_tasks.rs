//! An MCP server's task as an agent meets it (issue 23, MCP): through a
//! running service, a call that the server (`goondan-mcp`'s
//! `tests/tasks-server.py`: fastmcp with the tasks extension) runs as a
//! task answers `pending` with a handle, and the task's result enters the
//! conversation when it ends; `tasks__cancel` of it sends `tasks/cancel`,
//! which stops the work on the server.
//!
//! Needs a Python with fastmcp and fastmcp-tasks (`GOONDAN_TEST_MCP_PYTHON`
//! or `.cache/py`, as scripts/test installs); skips without one, or fails
//! with `GOONDAN_REQUIRE_MCP=1`.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};

use goondan_test_support::{Agent, Bundle, reply_text, reply_tools, when_input};
use serde_json::{Value, json};

mod common;
use common::service::jobs::{count, instance_dir, post, texts};
use common::service::{TestResult, detach, free_port, gdn, until};
use common::{mcp_tasks_python, repo_path};

/// The MCP server `tasky` run over standard input/output by `python`.
fn stdio_server(python: &Path, cancelled: &Path) -> Value {
    let script = repo_path("crates/goondan-mcp/tests/tasks-server.py");
    json!({
        "command": python.display().to_string(),
        "args": [script.display().to_string()],
        "env": {"TASKS_SERVER_CANCELLED": cancelled.display().to_string()},
    })
}

/// A worker whose "start work" has `tasky` (`server`) work `seconds` long.
fn bundle(dir: &Path, port: u16, server: Value, seconds: Value) -> Result<(), std::io::Error> {
    let handle = "{{lastHandle}}";
    let options = json!({
        "replies": [reply_text("noted")],
        "when": [
            when_input("tool_task_result", [reply_text("the server's task ended")]),
            when_input("start work", [
                reply_tools([("tasky__slow", json!({"seconds": seconds, "text": "built"}))]),
                reply_text("started"),
            ]),
            when_input("cancel it", [
                reply_tools([("tasky__slow", json!({"seconds": 60}))]),
                reply_tools([("tasks__wait", json!({"handle": handle, "timeoutMs": 500}))]),
                reply_tools([("tasks__cancel", json!({"handle": handle}))]),
                reply_text("cancelled"),
            ]),
        ],
    });
    let servers = json!({ "tasky": server });
    let mcp = json!({"kind": "Extension", "name": "mcp", "package": "@goondan/base", "config": {"servers": servers}});
    Bundle::new()
        .scripted_model_as("m", "s", options)
        .one_agent("jobs", Agent::new("worker", "m").base_tool("tasks").extension(mcp))
        .webhook("hook", port, json!([]))
        .write(dir)
}

#[test]
fn an_mcp_servers_task_is_pending_its_result_arrives_and_a_cancel_reaches_the_server() -> TestResult {
    let Some(python) = mcp_tasks_python() else { return Ok(()) };
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let cancelled = dir.path().join("cancelled");
    let port = free_port()?;
    bundle(dir.path(), port, stdio_server(&python, &cancelled), json!(1.5))?;
    let _running = detach(dir.path(), &state)?;

    assert!(post(port, "a", "start work")?.starts_with("HTTP/1.1 200"));
    until("the completion turn's answer", || Ok(count(&state, "a", "the server's task ended") == 1))?;
    let all = texts(&state, "a");
    let pending = all.iter().find(|m| m.contains("\"status\":\"pending\"")).ok_or("no pending result")?;
    assert!(pending.contains("mcpTaskId") && pending.contains("tasky"), "{pending}");
    let order: Vec<usize> = ["started", "tool_task_result", "the server's task ended"]
        .iter()
        .map(|needle| all.iter().position(|m| m.contains(needle)).unwrap_or(usize::MAX))
        .collect();
    assert!(order[0] < order[1] && order[1] < order[2], "{order:?}\n{all:#?}");
    let completion = &all[order[1]];
    assert!(completion.contains("tasky__slow") && completion.contains("built after 1.5s"), "{completion}");

    assert!(post(port, "c", "cancel it")?.starts_with("HTTP/1.1 200"));
    until("the cancelled turn's answer", || Ok(count(&state, "c", "\"cancelled\"") >= 1))?;
    let all = texts(&state, "c");
    let cancel = all.iter().find(|m| m.contains("tasks__cancel") && m.contains("\"state\":\"cancelled\""));
    assert!(cancel.is_some_and(|m| m.contains("tasks/cancel")), "{all:#?}");
    until("the server to stop the task's work", || Ok(cancelled.exists()))?;
    Ok(())
}

/// The fixture server over HTTP, ended with the test.
struct HttpServer(std::process::Child);

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_task_of_a_server_reached_over_http_is_followed_again_after_the_service_restarts() -> TestResult {
    let Some(python) = mcp_tasks_python() else { return Ok(()) };
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let (port, mcp_port) = (free_port()?, free_port()?);
    let script = repo_path("crates/goondan-mcp/tests/tasks-server.py");
    let _server = HttpServer(
        Command::new(&python)
            .arg(&script)
            .env("TASKS_SERVER_HTTP_PORT", mcp_port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    until("the MCP server to listen", || Ok(TcpStream::connect(("127.0.0.1", mcp_port)).is_ok()))?;
    // The same server, reached over HTTP; its task outlasts the restart.
    bundle(dir.path(), port, json!({"url": format!("http://127.0.0.1:{mcp_port}/mcp")}), json!(4))?;
    let _running = detach(dir.path(), &state)?;

    assert!(post(port, "r", "start work")?.starts_with("HTTP/1.1 200"));
    until("the pending result", || Ok(count(&state, "r", "\"status\":\"pending\"") == 1))?;
    // The agent process that follows the task goes; the server's task goes on.
    let restarted = gdn(dir.path(), &state, &["restart"])?;
    assert_eq!(restarted.status.code(), Some(0), "{}", String::from_utf8_lossy(&restarted.stderr));
    until("the completion turn's answer", || Ok(count(&state, "r", "the server's task ended") == 1))?;
    let (book, records) = common::task_book(&instance_dir(&state, "r"));
    let ends = common::task_ops(&records, "end");
    assert_eq!(ends.len(), 1, "{book}");
    assert_eq!(ends[0]["state"], "completed", "{book}");
    assert!(ends[0]["result"].to_string().contains("built after 4"), "{book}");
    Ok(())
}
