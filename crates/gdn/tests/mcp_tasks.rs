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
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

mod common;
use common::service::{Stopped, TestResult, free_port, gdn, until};
use common::{mcp_tasks_python, repo_path};

fn bundle(dir: &Path, port: u16, python: &Path, cancelled: &Path) -> Result<(), std::io::Error> {
    let script = repo_path("crates/goondan-mcp/tests/tasks-server.py");
    let yaml = format!(
        r#"apiVersion: goondan.ai/v1
kind: Model
metadata: {{name: m}}
spec:
  provider: scripted
  model: s
  options:
    replies: [{{text: "noted"}}]
    when:
      - inputContains: tool_task_result
        replies: [{{text: "the server's task ended"}}]
      - inputContains: "start work"
        replies:
          - toolCalls: [{{name: tasky__slow, args: {{seconds: 1.5, text: "built"}}}}]
          - text: "started"
      - inputContains: "cancel it"
        replies:
          - toolCalls: [{{name: tasky__slow, args: {{seconds: 60}}}}]
          - toolCalls: [{{name: tasks__wait, args: {{handle: "{{{{lastHandle}}}}", timeoutMs: 500}}}}]
          - toolCalls: [{{name: tasks__cancel, args: {{handle: "{{{{lastHandle}}}}"}}}}]
          - text: "cancelled"
---
apiVersion: goondan.ai/v1
kind: Agent
metadata: {{name: worker}}
spec:
  modelConfig: {{modelRef: Model/m}}
  tools:
    - {{kind: Tool, name: tasks, package: "@goondan/base"}}
  extensions:
    - kind: Extension
      name: mcp
      package: "@goondan/base"
      config:
        servers:
          tasky:
            command: "{python}"
            args: ["{script}"]
            env: {{TASKS_SERVER_CANCELLED: "{cancelled}"}}
---
apiVersion: goondan.ai/v1
kind: Swarm
metadata: {{name: jobs}}
spec: {{entryAgent: Agent/worker, agents: [Agent/worker]}}
---
apiVersion: goondan.ai/v1
kind: Connection
metadata: {{name: hook}}
spec:
  connectorRef: {{kind: Connector, name: webhook, package: "@goondan/base"}}
  config:
    WEBHOOK_PORT: {{value: "{port}"}}
"#,
        python = python.display(),
        script = script.display(),
        cancelled = cancelled.display(),
    );
    std::fs::write(dir.join("goondan.yaml"), yaml)
}

fn post(port: u16, key: &str, input: &str) -> Result<String, std::io::Error> {
    let body = serde_json::json!({"instanceKey": key, "text": input});
    common::service::post(port, &body)
}

fn instance_dir(state: &Path, key: &str) -> PathBuf {
    state.join("workspaces").join("jobs").join("instances").join(format!("worker@{key}"))
}

/// The conversation's messages as stored, each as JSON text.
fn texts(state: &Path, key: &str) -> Vec<String> {
    common::service::conversation(&instance_dir(state, key))
}

fn count(state: &Path, key: &str, needle: &str) -> usize {
    texts(state, key).iter().filter(|text| text.contains(needle)).count()
}

#[test]
fn an_mcp_servers_task_is_pending_its_result_arrives_and_a_cancel_reaches_the_server() -> TestResult {
    let Some(python) = mcp_tasks_python() else { return Ok(()) };
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let cancelled = dir.path().join("cancelled");
    let port = free_port()?;
    bundle(dir.path(), port, &python, &cancelled)?;
    let started = gdn(dir.path(), &state, &["run", "--detach"])?;
    assert_eq!(started.status.code(), Some(0), "{}", String::from_utf8_lossy(&started.stderr));
    let _running = Stopped { dir: dir.path().to_path_buf(), state: state.clone() };

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
    bundle(dir.path(), port, &python, &dir.path().join("cancelled"))?;
    let file = dir.path().join("goondan.yaml");
    let yaml = std::fs::read_to_string(&file)?;
    let start = yaml.find("            command:").ok_or("no command")?;
    let end = yaml[start..].find("---").map(|at| start + at).ok_or("no end")?;
    let yaml = format!("{}            url: \"http://127.0.0.1:{mcp_port}/mcp\"\n{}", &yaml[..start], &yaml[end..])
        .replace("seconds: 1.5, text: \"built\"", "seconds: 4, text: \"built\"");
    std::fs::write(&file, yaml)?;
    let started = gdn(dir.path(), &state, &["run", "--detach"])?;
    assert_eq!(started.status.code(), Some(0), "{}", String::from_utf8_lossy(&started.stderr));
    let _running = Stopped { dir: dir.path().to_path_buf(), state: state.clone() };

    assert!(post(port, "r", "start work")?.starts_with("HTTP/1.1 200"));
    until("the pending result", || Ok(count(&state, "r", "\"status\":\"pending\"") == 1))?;
    // The agent process that follows the task goes; the server's task goes on.
    let restarted = gdn(dir.path(), &state, &["restart"])?;
    assert_eq!(restarted.status.code(), Some(0), "{}", String::from_utf8_lossy(&restarted.stderr));
    until("the completion turn's answer", || Ok(count(&state, "r", "the server's task ended") == 1))?;
    let book = std::fs::read_to_string(instance_dir(&state, "r").join("tasks.jsonl"))?;
    let ends: Vec<Value> = book
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["op"] == "end")
        .collect();
    assert_eq!(ends.len(), 1, "{book}");
    assert_eq!(ends[0]["state"], "completed", "{book}");
    assert!(ends[0]["result"].to_string().contains("built after 4"), "{book}");
    Ok(())
}
