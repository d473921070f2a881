//! The base package's MCP client through the `gdn` binary, against real
//! servers: `@modelcontextprotocol/server-everything` over stdio and over
//! streamable HTTP, run by Node; PyPI `mcp-server-time`, run by Python
//! (`GOONDAN_TEST_MCP_TIME`, which `.ci/run` sets after installing it into
//! `.cache/py`); and the client's own fake server.
//!
//! The server's entry script comes from `GOONDAN_TEST_MCP_EVERYTHING`
//! (`.ci/run` installs the package into `.cache/mcp` and sets it), or from
//! that cache folder when it is there. Without it the tests skip, saying
//! why; with `GOONDAN_REQUIRE_MCP=1` (CI) they fail instead. The fixture's
//! scripted model calls `everything__echo` once, for `gdn run`.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::json;

mod common;
use common::temp;
use common::{
    mcp_everything_server as everything_server, mcp_python as python, mcp_time_server as time_server, repo_path as repo,
};
use goondan_test_support::json_stdout as json_out;
use goondan_test_support::text;

fn gdn(state: &Path, server: &Path, args: &[&str]) -> Output {
    gdn_with(state, server, &[], args)
}

fn gdn_with(state: &Path, server: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let gdn = common::gdn_bin()
        .state_arg(state)
        .project(repo("tests/fixtures/mcp-everything"))
        .env("GOONDAN_TEST_MCP_EVERYTHING", server)
        .env("GOONDAN_TEST_MCP_FAKE", repo("crates/goondan-mcp/tests/fake-server.mjs"));
    env.iter().fold(gdn, |gdn, (key, value)| gdn.env(key, value)).run(args)
}

#[test]
fn tool_list_shows_the_servers_tools_with_their_schemas() {
    let Some(server) = everything_server() else { return };
    let state = temp();
    let output = gdn(state.path(), &server, &["--json", "tool", "list"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let catalog = json_out(&output);
    let items = catalog.as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = items.iter().filter_map(|item| item["name"].as_str()).collect();
    assert!(names.len() > 3, "{names:?}");
    assert!(names.iter().all(|name| name.starts_with("everything__")), "{names:?}");
    let echo = items
        .iter()
        .find(|item| item["name"] == "everything__echo")
        .unwrap_or_else(|| panic!("no everything__echo in {names:?}"));
    assert_eq!(
        echo["source"],
        json!({"type": "mcp", "name": "everything", "mcp": {"extensionName": "mcp", "serverName": "everything"}})
    );
    assert_eq!(echo["description"], "Echoes back the input string");
    // The server's inputSchema, as the server sent it.
    assert_eq!(echo["parameters"]["type"], "object");
    assert_eq!(echo["parameters"]["properties"]["message"]["type"], "string");
    assert_eq!(echo["parameters"]["required"], json!(["message"]));
    assert!(!state.path().join("instances").exists(), "listing changes no state");
}

#[test]
fn tool_call_returns_the_servers_answer() {
    let Some(server) = everything_server() else { return };
    let state = temp();
    let output =
        gdn(state.path(), &server, &["--json", "tool", "call", "everything__echo", "--args", r#"{"message":"hi"}"#]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(json_out(&output), json!({"status": "ok", "output": "Echo: hi"}));

    // structuredContent is the output when the server gives it.
    let args = r#"{"location":"New York"}"#;
    let output =
        gdn(state.path(), &server, &["--json", "tool", "call", "everything__get-structured-content", "--args", args]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let result = json_out(&output);
    assert_eq!(result["status"], "ok");
    assert!(result["output"].is_object() && result["output"].get("temperature").is_some(), "{result}");

    // An image is described, not inlined.
    let output = gdn(state.path(), &server, &["--json", "tool", "call", "everything__get-tiny-image", "--args", "{}"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let result = json_out(&output);
    let described = result["output"].as_str().unwrap_or_default();
    assert!(described.contains("[image: image/png, ") && described.contains(" bytes]"), "{result}");
    assert!(described.len() < 400, "the image was inlined: {described}");
}

#[test]
fn bad_arguments_are_refused_by_the_schema() {
    let Some(server) = everything_server() else { return };
    let state = temp();
    let output =
        gdn(state.path(), &server, &["--json", "tool", "call", "everything__echo", "--args", r#"{"msg":"hi"}"#]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    let result = json_out(&output);
    assert_eq!(result["status"], "error");
    // The catalog's validation answers, from the server's inputSchema.
    assert_eq!(result["error"]["code"], "E_TOOL_INVALID_ARGS", "{result}");
    assert_eq!(result["error"]["name"], "ToolInputValidationError", "{result}");
}

#[test]
fn a_server_that_cannot_start_is_reported_and_the_rest_works() {
    let Some(server) = everything_server() else { return };
    let state = temp();
    let output = gdn(state.path(), &server, &["--json", "tool", "list", "--agent", "mixed"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("MCP server 'broken' is not available") && stderr.contains("goondan-no-such-mcp-server"),
        "{stderr}"
    );
    assert!(stderr.contains("MCP server 'remote' is not available"), "{stderr}");
    let catalog = json_out(&output);
    let names: Vec<&str> = catalog.as_array().into_iter().flatten().filter_map(|i| i["name"].as_str()).collect();
    assert!(names.contains(&"json-query__query") && names.contains(&"everything__echo"), "{names:?}");
    assert!(!names.iter().any(|name| name.starts_with("broken__") || name.starts_with("remote__")), "{names:?}");

    let args = r#"{"message":"still here"}"#;
    let output =
        gdn(state.path(), &server, &["--json", "tool", "call", "--agent", "mixed", "everything__echo", "--args", args]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(json_out(&output), json!({"status": "ok", "output": "Echo: still here"}));
}

/// Every file under `dir`, read as text, concatenated.
fn read_tree(dir: &Path) -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            all.push_str(&read_tree(&path));
        } else if let Ok(content) = std::fs::read_to_string(&path) {
            all.push_str(&content);
        }
    }
    all
}

#[test]
fn a_turn_calls_the_mcp_tool_from_the_agent_process() {
    let Some(server) = everything_server() else { return };
    let state = temp();
    // The scripted model calls everything__echo, then answers.
    let output = gdn(state.path(), &server, &["run", "--input", "go"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("Done."), "{}", text(&output.stdout));
    let saved = read_tree(state.path());
    assert!(saved.contains("Echo: from a turn"), "the tool result is not in the conversation");
}

/// "everything" over streamable HTTP on a free loopback port, killed when
/// dropped.
struct HttpEverything {
    child: std::process::Child,
    url: String,
}

impl Drop for HttpEverything {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_everything(server: &Path) -> HttpEverything {
    let port = free_port();
    let child = Command::new("node")
        .arg(server)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn node: {e}"));
    let running = HttpEverything { child, url: format!("http://127.0.0.1:{port}/mcp") };
    wait_for_port(port);
    running
}

#[test]
fn a_streamable_http_server_s_tools_are_listed_and_called() {
    let Some(server) = everything_server() else { return };
    let http = http_everything(&server);
    let state = temp();
    let env = [("GOONDAN_TEST_MCP_EVERYTHING_URL", http.url.as_str()), ("GOONDAN_TEST_MCP_KEY", "k-123")];
    let output = gdn_with(state.path(), &server, &env, &["--json", "tool", "list", "--agent", "http"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let catalog = json_out(&output);
    let names: Vec<&str> = catalog.as_array().into_iter().flatten().filter_map(|i| i["name"].as_str()).collect();
    assert!(names.contains(&"everything__echo"), "{names:?}");

    let args = r#"{"message":"over http"}"#;
    let output = gdn_with(
        state.path(),
        &server,
        &env,
        &["--json", "tool", "call", "--agent", "http", "everything__echo", "--args", args],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(json_out(&output), json!({"status": "ok", "output": "Echo: over http"}));

    // A header whose variable is missing is reported with the server and field.
    let output = gdn_with(
        state.path(),
        &server,
        &[("GOONDAN_TEST_MCP_EVERYTHING_URL", http.url.as_str())],
        &["--json", "tool", "list", "--agent", "http"],
    );
    let stderr = text(&output.stderr);
    assert!(stderr.contains("server 'everything': headers.X-Api-Key"), "{stderr}");
}

#[test]
fn a_changed_tool_list_reaches_the_next_step_and_progress_is_logged() {
    let Some(server) = everything_server() else { return };
    let state = temp();
    let output = gdn(state.path(), &server, &["run", "--agent", "changing", "--input", "go"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("Changed."), "{}", text(&output.stdout));
    let saved = read_tree(state.path());
    // 'extra' did not exist when the turn began; the step after add_tool
    // offered it and its call ran.
    assert!(saved.contains("the new tool from "), "the new tool's answer is not in the conversation");
    assert!(!saved.contains("E_TOOL_NOT_IN_CATALOG"), "the new tool was not in the catalog");
    // The progress the server reported is in the event log.
    let progress = saved.lines().filter(|line| line.contains("\"type\":\"tool.progress\"")).count();
    assert_eq!(progress, 3, "tool.progress events in the log");
}

#[test]
fn the_python_time_server_s_tools_answer_with_structured_content() {
    let Some(everything) = everything_server() else { return };
    let Some(time) = time_server() else { return };
    let time = time.display().to_string();
    let env = [("GOONDAN_TEST_MCP_TIME", time.as_str())];
    let state = temp();
    let output = gdn_with(state.path(), &everything, &env, &["--json", "tool", "list", "--agent", "time"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let catalog = json_out(&output);
    let names: Vec<&str> = catalog.as_array().into_iter().flatten().filter_map(|i| i["name"].as_str()).collect();
    assert_eq!(names, ["time__get_current_time", "time__convert_time"]);

    let args = r#"{"source_timezone":"UTC","time":"12:00","target_timezone":"Asia/Seoul"}"#;
    let call = ["--json", "tool", "call", "--agent", "time", "time__convert_time", "--args", args];
    let output = gdn_with(state.path(), &everything, &env, &call);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let result = json_out(&output);
    assert_eq!(result["status"], "ok", "{result}");
    assert_eq!(result["output"]["time_difference"], "+9.0h", "{result}");
    assert!(
        result["output"]["target"]["datetime"].as_str().is_some_and(|t| t.ends_with("T21:00:00+09:00")),
        "{result}"
    );

    // The schema says what is required; the server is not asked.
    let call = ["--json", "tool", "call", "--agent", "time", "time__convert_time", "--args", "{}"];
    let result = json_out(&gdn_with(state.path(), &everything, &env, &call));
    assert_eq!(result["error"]["code"], "E_TOOL_INVALID_ARGS", "{result}");

    // The server's own error is the tool's error.
    let call = [
        "--json",
        "tool",
        "call",
        "--agent",
        "time",
        "time__get_current_time",
        "--args",
        r#"{"timezone":"Mars/Olympus"}"#,
    ];
    let result = json_out(&gdn_with(state.path(), &everything, &env, &call));
    assert_eq!(result["error"]["code"], "E_MCP_TOOL_ERROR", "{result}");
    assert!(result["error"]["message"].as_str().is_some_and(|m| m.contains("Mars/Olympus")), "{result}");
}

#[test]
fn a_server_that_cannot_start_is_an_event_in_the_instance_log() {
    let Some(server) = everything_server() else { return };
    let state = temp();
    let output = gdn(state.path(), &server, &["run", "--agent", "mixed", "--input", "go"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let saved = read_tree(state.path());
    let unavailable: Vec<&str> =
        saved.lines().filter(|line| line.contains("\"type\":\"mcp.server.unavailable\"")).collect();
    assert!(unavailable.iter().any(|line| line.contains("\"server\":\"broken\"")), "{unavailable:?}");
    assert!(unavailable.iter().any(|line| line.contains("\"server\":\"remote\"")), "{unavailable:?}");
    assert!(!unavailable.iter().any(|line| line.contains("\"server\":\"everything\"")), "{unavailable:?}");
}

/// A child process killed when dropped.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .unwrap_or_else(|e| panic!("{e}"))
}

fn wait_for_port(port: u16) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn the_configs_headers_reach_a_streamable_http_server() {
    let Some(everything) = everything_server() else { return };
    let Some(python) = python() else { return };
    let port = free_port();
    let _server = Running(
        Command::new(python)
            .arg(repo("tests/fixtures/mcp-everything/servers/header_echo.py"))
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn the header server: {e}")),
    );
    wait_for_port(port);
    let url = format!("http://127.0.0.1:{port}/mcp");
    let env = [("GOONDAN_TEST_MCP_HEADER_URL", url.as_str()), ("GOONDAN_TEST_MCP_KEY", "k-from-the-environment")];
    let state = temp();
    for (header, expected) in [("X-Api-Key", "k-from-the-environment"), ("X-Plain", "plain-value")] {
        let args = format!("{{\"name\":\"{header}\"}}");
        let call = ["--json", "tool", "call", "--agent", "headers", "echo__header", "--args", args.as_str()];
        let output = gdn_with(state.path(), &everything, &env, &call);
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        assert_eq!(json_out(&output), json!({"status": "ok", "output": {"result": expected}}));
    }
}
