//! `gdn mcp serve` driven by a real MCP client — the official Python SDK
//! (`mcp` from PyPI) — over stdio and over streamable HTTP, with the
//! base-tools fixture (native `@goondan/base` tools): the tool list, a
//! successful call, arguments refused by validation, a handler's error and
//! a name outside the catalog; the catalog and calls through an agent's
//! JavaScript extensions and its own MCP servers; plus the HTTP server's
//! `Origin` check, its refusal of non-loopback addresses, stdout carrying
//! frames only, and the end of the tool processes (and MCP servers) when
//! the server stops.
//!
//! The client is `tests/mcp_serve/client.py`, run by the Python of
//! `GOONDAN_TEST_MCP_PYTHON`, else of the repository's `.cache/py` venv
//! (`.ci/run` creates it: `python3 -m venv .cache/py && .cache/py/bin/pip
//! install mcp`). Without a Python that imports `mcp` the client tests skip,
//! saying why; with `GOONDAN_REQUIRE_MCP=1` (CI) they fail instead.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

mod common;
use common::temp;
use common::{
    js_runtime_usable, mcp_everything_server as everything_server, mcp_python as python, mcp_tasks_python,
    repo_path as repo,
};

fn fixture() -> PathBuf {
    repo("tests/fixtures/base-tools")
}

/// Runs the Python client with `server` (a command to start, or a URL) and
/// `ops`; one JSON value per operation.
fn client(python: &Path, server: Value, ops: Value) -> Vec<Value> {
    run_client(python, "client.py", "the MCP client", server, ops)
}

/// Runs the tasks-extension client (`tests/mcp_serve/tasks_client.py`)
/// with `server` and `ops`; one JSON value per operation.
fn tasks_client(python: &Path, server: Value, ops: Value) -> Vec<Value> {
    run_client(python, "tasks_client.py", "the MCP tasks client", server, ops)
}

/// Runs `script` of `tests/mcp_serve` (`what`, for messages) with
/// `server` and `ops`; one JSON value per operation.
fn run_client(python: &Path, script: &str, what: &str, server: Value, ops: Value) -> Vec<Value> {
    let spec = json!({"server": server, "ops": ops});
    let output = Command::new(python)
        .arg(repo(&format!("crates/gdn/tests/mcp_serve/{script}")))
        .arg(spec.to_string())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {what}: {e}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{what} failed: {stderr}");
    let lines: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}\n{stderr}")))
        .collect();
    assert_eq!(lines.len(), ops.as_array().map_or(0, Vec::len), "{lines:?}\n{stderr}");
    lines
}

/// The stdio server as the client's `server` spec: `gdn mcp serve` of
/// `bundle` started by the client, with debug logs (which must stay off
/// standard output).
fn stdio_server_of(state: &Path, bundle: &Path) -> Value {
    let mut env = json!({"NO_COLOR": "1"});
    // The SDK starts servers with a minimal environment (PATH, HOME, …).
    if let Ok(runtime) = std::env::var("GOONDAN_JS_RUNTIME") {
        env["GOONDAN_JS_RUNTIME"] = json!(runtime);
    }
    json!({
        "command": env!("CARGO_BIN_EXE_gdn"),
        "args": ["-vv", "--state-root", state, "-c", bundle, "mcp", "serve"],
        "env": env,
    })
}

fn stdio_server(state: &Path) -> Value {
    stdio_server_of(state, &fixture())
}

/// `gdn mcp serve --http`, killed when dropped.
struct HttpServer {
    child: Child,
    url: String,
}

impl HttpServer {
    fn start(state: &Path, extra: &[&str]) -> Self {
        Self::start_with(state, &fixture(), extra, &[])
    }

    fn start_with(state: &Path, bundle: &Path, extra: &[&str], env: &[(&str, &Path)]) -> Self {
        let gdn = env.iter().fold(common::gdn_bin().state_arg(state).project(bundle), |gdn, (k, v)| gdn.env(k, v));
        let mut command = gdn.command(["mcp", "serve", "--http", "127.0.0.1:0"].iter().chain(extra));
        let spawned = command.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn();
        let mut child = spawned.unwrap_or_else(|e| panic!("spawn gdn: {e}"));
        let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap_or_else(|e| panic!("read the URL: {e}"));
        let url = line
            .split_whitespace()
            .find(|word| word.starts_with("http://"))
            .unwrap_or_else(|| panic!("no URL in {line:?}"))
            .to_owned();
        Self { child, url }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(0))
    }

    /// `host:port` of the URL.
    fn authority(&self) -> &str {
        self.url.trim_start_matches("http://").trim_end_matches("/mcp")
    }

    /// Sends `signal` and waits for the exit status.
    fn stop(mut self, signal: Signal) -> Option<i32> {
        kill(self.pid(), signal).unwrap_or_else(|e| panic!("signal gdn: {e}"));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap_or_else(|e| panic!("wait: {e}")) {
                return status.code();
            }
            assert!(Instant::now() < deadline, "gdn mcp serve did not stop after {signal}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The catalog `gdn tool list --json` shows for the fixture.
fn catalog(state: &Path) -> Vec<Value> {
    let output = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .arg("--state-root")
        .arg(state)
        .arg("-c")
        .arg(fixture())
        .args(["--json", "tool", "list"])
        .output()
        .unwrap_or_else(|e| panic!("spawn gdn: {e}"));
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let catalog: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"));
    catalog.as_array().cloned().unwrap_or_default()
}

/// The operations both transports run, and what they must answer.
fn ops() -> Value {
    json!([
        {"op": "list"},
        {"op": "call", "name": "text-transform__case", "args": {"text": "hello", "to": "upper"}},
        {"op": "call", "name": "json-query__query", "args": {"path": 3}},
        {"op": "call", "name": "json-query__query", "args": {"data": "{not json", "path": ".a"}},
        {"op": "call", "name": "nope__missing", "args": {}},
        {"op": "call", "name": "text-transform__case", "args": {"text": "Hi", "to": "lower"}},
    ])
}

/// The structured error in an `isError` result's text.
fn error_of(result: &Value) -> Value {
    assert_eq!(result["isError"], true, "{result}");
    assert_eq!(result["content"].as_array().map(Vec::len), Some(1), "{result}");
    assert_eq!(result["content"][0]["type"], "text", "{result}");
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    serde_json::from_str(text).unwrap_or_else(|e| panic!("the error text is not JSON ({e}): {text}"))
}

fn check_answers(answers: &[Value], catalog: &[Value]) {
    // tools/list: the catalog, in order, with descriptions and schemas.
    let tools = answers[0]["tools"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = tools.iter().filter_map(|tool| tool["name"].as_str()).collect();
    let expected: Vec<&str> = catalog.iter().filter_map(|item| item["name"].as_str()).collect();
    assert_eq!(names, expected);
    assert!(names.contains(&"json-query__query") && names.contains(&"bash__exec"), "{names:?}");
    for (tool, item) in tools.iter().zip(catalog) {
        assert_eq!(tool["description"], item["description"], "{tool}");
        assert_eq!(tool["inputSchema"], item["parameters"], "{tool}");
        assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
    }

    // A success: the output as text and, being an object, as structuredContent.
    let ok = &answers[1];
    assert_eq!(ok["isError"], false, "{ok}");
    assert_eq!(ok["structuredContent"], json!({"original": "hello", "result": "HELLO", "to": "upper"}), "{ok}");
    let text = ok["content"][0]["text"].as_str().unwrap_or_default();
    assert_eq!(serde_json::from_str::<Value>(text).ok(), Some(ok["structuredContent"].clone()), "{ok}");

    // Arguments refused by validation, before any handler ran.
    let invalid = error_of(&answers[2]);
    assert_eq!(invalid["code"], "E_TOOL_INVALID_ARGS", "{invalid}");
    let message = invalid["message"].as_str().unwrap_or_default();
    assert!(message.contains("json-query__query") && message.contains("args.path"), "{invalid}");

    // The handler's own error.
    let failed = error_of(&answers[3]);
    assert_eq!(failed["code"], "E_TOOL", "{failed}");
    assert!(failed["message"].as_str().unwrap_or_default().contains("JSON"), "{failed}");
    assert!(failed["suggestion"].is_string(), "{failed}");

    // A name outside the catalog.
    let missing = error_of(&answers[4]);
    assert_eq!(missing["code"], "E_TOOL_NOT_IN_CATALOG", "{missing}");

    // The connection still serves after errors.
    assert_eq!(answers[5]["structuredContent"]["result"], "hi", "{}", answers[5]);
}

#[test]
fn a_client_over_stdio_lists_the_catalog_and_calls_through_the_pipeline() {
    let Some(python) = python() else { return };
    let state = temp();
    let answers = client(&python, stdio_server(state.path()), ops());
    check_answers(&answers, &catalog(state.path()));
}

#[test]
fn the_served_catalog_and_calls_go_through_the_agents_extensions() {
    let Some(python) = python() else { return };
    if !js_runtime_usable() {
        return;
    }
    let state = temp();
    let answers = client(
        &python,
        stdio_server_of(state.path(), &repo("tests/fixtures/script-extensions")),
        json!([
            {"op": "list"},
            {"op": "call", "name": "echo__say", "args": {"text": "psst"}},
            {"op": "call", "name": "hidden__peek", "args": {}},
        ]),
    );
    // The JavaScript step middleware hides hidden__peek; notes__count comes
    // from api.tools.register.
    let names: Vec<&str> =
        answers[0]["tools"].as_array().into_iter().flatten().filter_map(|tool| tool["name"].as_str()).collect();
    assert_eq!(names, ["echo__say", "notes__count"]);
    // The toolCall middleware shouts.
    assert_eq!(answers[1]["structuredContent"]["said"], "PSST", "{}", answers[1]);
    assert_eq!(answers[1]["structuredContent"]["shouted"], true, "{}", answers[1]);
    // A tool the step middleware hides is not callable either.
    assert_eq!(error_of(&answers[2])["code"], "E_TOOL_NOT_IN_CATALOG");
}

#[test]
fn a_client_over_streamable_http_lists_the_catalog_and_calls_through_the_pipeline() {
    let Some(python) = python() else { return };
    let state = temp();
    let server = HttpServer::start(state.path(), &[]);
    assert!(server.url.starts_with("http://127.0.0.1:") && server.url.ends_with("/mcp"), "{}", server.url);
    let answers = client(&python, json!({"url": server.url}), ops());
    check_answers(&answers, &catalog(state.path()));
    // Two clients, one after the other, share the one agent.
    let again = client(&python, json!({"url": server.url}), json!([{"op": "list"}]));
    assert_eq!(again[0]["tools"], answers[0]["tools"]);
    assert_eq!(server.stop(Signal::SIGTERM), Some(143));
}

/// One HTTP/1.1 POST of an `initialize` request; the status code.
fn post_initialize(authority: &str, origin: Option<&str>) -> u16 {
    post_initialize_with(authority, origin, None)
}

/// [`post_initialize`] with an `Authorization` header.
fn post_initialize_with(authority: &str, origin: Option<&str>, authorization: Option<&str>) -> u16 {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
    })
    .to_string();
    let mut origin = origin.map(|origin| format!("Origin: {origin}\r\n")).unwrap_or_default();
    if let Some(authorization) = authorization {
        origin.push_str(&format!("Authorization: {authorization}\r\n"));
    }
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {authority}\r\n{origin}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = TcpStream::connect(authority).unwrap_or_else(|e| panic!("connect {authority}: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap_or_else(|e| panic!("{e}"));
    stream.write_all(request.as_bytes()).unwrap_or_else(|e| panic!("send: {e}"));
    let mut status_line = String::new();
    BufReader::new(&mut stream).read_line(&mut status_line).unwrap_or_else(|e| panic!("read: {e}"));
    status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {status_line:?}"))
}

#[test]
fn http_refuses_requests_from_foreign_origins() {
    let state = temp();
    let server = HttpServer::start(state.path(), &[]);
    let authority = server.authority().to_owned();
    // A browser page of another site (also one that rebinds its name to 127.0.0.1).
    assert_eq!(post_initialize(&authority, Some("http://evil.example")), 403);
    assert_eq!(post_initialize(&authority, Some("https://evil.example:443")), 403);
    assert_eq!(post_initialize(&authority, Some("null")), 403);
    // No Origin (not a browser), or a loopback page: served.
    assert_eq!(post_initialize(&authority, None), 200);
    assert_eq!(post_initialize(&authority, Some(&format!("http://{authority}"))), 200);
    assert_eq!(post_initialize(&authority, Some("http://localhost:5173")), 200);
    // The endpoint is /mcp only.
    let mut stream = TcpStream::connect(&authority).unwrap_or_else(|e| panic!("{e}"));
    write!(stream, "GET / HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
}

#[test]
fn a_non_loopback_address_is_refused_without_allow_remote() {
    let state = temp();
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .arg("--state-root")
        .arg(state.path())
        .arg("-c")
        .arg(fixture())
        .args(["mcp", "serve", "--http", "0.0.0.0:0"])
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn gdn: {e}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("refusing to listen on 0.0.0.0:0") && stderr.contains("--allow-remote"), "{stderr}");
    assert!(output.stdout.is_empty());
    assert!(started.elapsed() < Duration::from_secs(10));

    // --allow-remote only means something with --http.
    let output = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .args(["-c"])
        .arg(fixture())
        .args(["mcp", "serve", "--allow-remote"])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn gdn: {e}"));
    assert_eq!(output.status.code(), Some(2), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn with_allow_remote_the_server_listens_on_every_address() {
    let state = temp();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .arg("--state-root")
        .arg(state.path())
        .arg("-c")
        .arg(fixture())
        .args([
            "--json",
            "mcp",
            "serve",
            "--http",
            "0.0.0.0:0",
            "--allow-remote",
            "--auth-token-env",
            "GDN_TEST_MCP_TOKEN",
        ])
        .env("GDN_TEST_MCP_TOKEN", "tok-remote")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn gdn: {e}"));
    let mut line = String::new();
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    BufReader::new(stdout).read_line(&mut line).unwrap_or_else(|e| panic!("{e}"));
    let _ = child.kill();
    let _ = child.wait();
    let announced: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(announced["agent"], "operator");
    assert!(announced["url"].as_str().unwrap_or_default().starts_with("http://0.0.0.0:"), "{announced}");
}

#[test]
fn http_with_a_token_refuses_requests_that_do_not_carry_it() {
    let state = temp();
    let server = HttpServer::start_with(
        state.path(),
        &fixture(),
        &["--auth-token-env", "GDN_TEST_MCP_TOKEN"],
        &[("GDN_TEST_MCP_TOKEN", Path::new("tok-123"))],
    );
    let authority = server.authority().to_owned();
    assert_eq!(post_initialize_with(&authority, None, None), 401);
    assert_eq!(post_initialize_with(&authority, None, Some("Bearer tok-12")), 401);
    assert_eq!(post_initialize_with(&authority, None, Some("Bearer tok-1234")), 401);
    assert_eq!(post_initialize_with(&authority, None, Some("Basic tok-123")), 401);
    assert_eq!(post_initialize_with(&authority, None, Some("Bearer tok-123")), 200);
    // The token does not excuse a foreign page.
    assert_eq!(post_initialize_with(&authority, Some("http://evil.example"), Some("Bearer tok-123")), 403);
}

#[test]
fn remote_clients_need_a_token_and_the_token_a_value() {
    let serve = |args: &[&str], env: &[(&str, &str)]| {
        let state = temp();
        let output = Command::new(env!("CARGO_BIN_EXE_gdn"))
            .arg("--state-root")
            .arg(state.path())
            .arg("-c")
            .arg(fixture())
            .args(["mcp", "serve"])
            .args(args)
            .envs(env.iter().copied())
            .env_remove("GDN_TEST_MCP_TOKEN")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("spawn gdn: {e}"));
        (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let (code, stderr) = serve(&["--http", "0.0.0.0:0", "--allow-remote"], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--allow-remote needs --auth-token-env"), "{stderr}");
    let (code, stderr) = serve(&["--http", "127.0.0.1:0", "--auth-token-env", "GDN_TEST_MCP_TOKEN"], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--auth-token-env GDN_TEST_MCP_TOKEN: the variable is not set or empty"), "{stderr}");
    let (code, stderr) = serve(&["--auth-token-env", "GDN_TEST_MCP_TOKEN"], &[("GDN_TEST_MCP_TOKEN", "x")]);
    assert_eq!(code, Some(2), "a token means nothing over stdio: {stderr}");
}

use common::procs::is_gone;

fn assert_gone(pid: u32, what: &str) {
    common::procs::wait_gone(pid, what, "gdn mcp serve");
}

/// A call that leaves a background job running, and its pid.
fn background_job() -> Value {
    json!([{"op": "call", "name": "bash__exec", "args": {"command": "sleep 600 >/dev/null 2>&1 </dev/null & echo $!"}}])
}

fn job_pid(answers: &[Value]) -> u32 {
    let stdout = answers[0]["structuredContent"]["stdout"].as_str().unwrap_or_default();
    stdout.trim().parse().unwrap_or_else(|e| panic!("{e}: {}", answers[0]))
}

#[test]
fn stopping_the_server_ends_the_processes_its_calls_left() {
    let Some(python) = python() else { return };
    // stdio: the client closes the server's input, and the server ends.
    let state = temp();
    let answers = client(&python, stdio_server(state.path()), background_job());
    assert_gone(job_pid(&answers), "a background job of a call over stdio");

    // HTTP: SIGTERM.
    let server = HttpServer::start(state.path(), &[]);
    let answers = client(&python, json!({"url": server.url}), background_job());
    let job = job_pid(&answers);
    assert!(!is_gone(job), "the job ended with its call");
    assert_eq!(server.stop(Signal::SIGTERM), Some(143));
    assert_gone(job, "a background job of a call over HTTP");

    // HTTP: Ctrl-C.
    let server = HttpServer::start(state.path(), &[]);
    let answers = client(&python, json!({"url": server.url}), background_job());
    let job = job_pid(&answers);
    assert_eq!(server.stop(Signal::SIGINT), Some(130));
    assert_gone(job, "a background job of a call over HTTP, after Ctrl-C");
}

/// Without an SDK: frames written by hand to `gdn mcp serve`'s standard
/// input. Every line it writes to standard output is a JSON-RPC message
/// (its debug logs go elsewhere), and the end of its input ends it — with
/// status 0, not by a signal — and the processes its calls left.
/// Writes one JSON-RPC frame (a line) to the server.
fn send_frame(stdin: &mut impl Write, message: &Value) {
    writeln!(stdin, "{message}").unwrap_or_else(|e| panic!("write a frame: {e}"));
}

/// Reads one JSON-RPC frame (a line) from the server.
fn receive_frame(stdout: &mut impl BufRead) -> Value {
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap_or_else(|e| panic!("read a frame: {e}"));
    let frame: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a frame ({e}): {line:?}"));
    assert_eq!(frame["jsonrpc"], "2.0", "{frame}");
    frame
}

/// `gdn mcp serve` over stdio on the fixture, its standard error discarded.
fn spawn_stdio_server(state: &Path) -> std::process::Child {
    stdio_child(state, &[], Stdio::null())
}

/// `gdn FLAGS mcp serve` over stdio on the fixture, its standard error to
/// `stderr`.
fn stdio_child(state: &Path, flags: &[&str], stderr: Stdio) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_gdn"))
        .args(flags)
        .arg("--state-root")
        .arg(state)
        .arg("-c")
        .arg(fixture())
        .args(["mcp", "serve"])
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn gdn: {e}"))
}

/// The stdio of a `gdn mcp serve` child after the MCP handshake.
fn initialized(child: &mut std::process::Child) -> (std::process::ChildStdin, BufReader<std::process::ChildStdout>) {
    let mut stdin = child.stdin.take().unwrap_or_else(|| panic!("no stdin"));
    let mut stdout = BufReader::new(child.stdout.take().unwrap_or_else(|| panic!("no stdout")));
    send_frame(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "by-hand", "version": "0"}}}),
    );
    let _ = receive_frame(&mut stdout);
    send_frame(&mut stdin, &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    (stdin, stdout)
}

#[test]
fn over_stdio_only_frames_reach_stdout_and_end_of_input_ends_the_server() {
    let state = temp();
    let mut child = stdio_child(state.path(), &["-vv"], Stdio::piped());
    let mut stdin = child.stdin.take().unwrap_or_else(|| panic!("no stdin"));
    let mut stdout = BufReader::new(child.stdout.take().unwrap_or_else(|| panic!("no stdout")));
    let mut send = |message: Value| send_frame(&mut stdin, &message);
    let mut receive = || receive_frame(&mut stdout);
    send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "by-hand", "version": "0"}}}));
    let initialized = receive();
    assert!(initialized["result"]["capabilities"]["tools"].is_object(), "{initialized}");
    assert_eq!(initialized["result"]["serverInfo"]["name"], "gdn", "{initialized}");
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "bash__exec", "arguments": {"command": "sleep 600 >/dev/null 2>&1 </dev/null & echo $!"}}}));
    let called = receive();
    assert_eq!(called["id"], 2, "{called}");
    let job: u32 = called["result"]["structuredContent"]["stdout"]
        .as_str()
        .and_then(|pid| pid.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in {called}"));
    assert!(!is_gone(job));

    // The client closes its end.
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap_or_else(|e| panic!("wait: {e}")) {
            break status;
        }
        assert!(Instant::now() < deadline, "gdn mcp serve did not end with its input");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut rest = String::new();
    let _ = stdout.read_to_string(&mut rest);
    let mut logs = String::new();
    let _ = child.stderr.take().map(|mut stderr| stderr.read_to_string(&mut logs));
    assert_eq!(status.code(), Some(0), "{logs}");
    assert!(rest.is_empty(), "after the last answer stdout got {rest:?}");
    assert!(logs.contains("DEBUG"), "the debug logs went to standard error: {logs}");
    assert_gone(job, "a background job of a call over stdio, after end of input");
}

/// The pids of `pid`'s children.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|children| children.split_whitespace().filter_map(|pid| pid.parse().ok()).collect::<Vec<u32>>())
        .collect()
}

/// An agent whose `Extension/mcp` connects an MCP server: its tools are
/// served too (a bridge), validated against the server's schema first,
/// and the server's process ends with `gdn mcp serve`.
#[test]
fn an_agents_own_mcp_servers_are_served_through_it_and_end_with_it() {
    let Some(python) = python() else { return };
    let Some(everything) = everything_server() else { return };
    let state = temp();
    let server = HttpServer::start_with(
        state.path(),
        &repo("tests/fixtures/mcp-everything"),
        &[],
        &[("GOONDAN_TEST_MCP_EVERYTHING", &everything)],
    );
    let children = children_of(server.child.id());
    assert!(!children.is_empty(), "the agent's MCP server was not started at assembly");
    let answers = client(
        &python,
        json!({"url": server.url}),
        json!([
            {"op": "list"},
            {"op": "call", "name": "everything__echo", "args": {"message": "hi"}},
            {"op": "call", "name": "everything__echo", "args": {"message": 3}},
        ]),
    );
    let tools = answers[0]["tools"].as_array().cloned().unwrap_or_default();
    let echo = tools
        .iter()
        .find(|tool| tool["name"] == "everything__echo")
        .unwrap_or_else(|| panic!("no everything__echo in {tools:?}"));
    assert_eq!(echo["description"], "Echoes back the input string");
    assert_eq!(echo["inputSchema"]["required"], json!(["message"]));
    assert_eq!(answers[1]["isError"], false, "{}", answers[1]);
    assert_eq!(answers[1]["content"][0]["text"], "Echo: hi", "{}", answers[1]);
    assert_eq!(error_of(&answers[2])["code"], "E_TOOL_INVALID_ARGS");

    assert_eq!(server.stop(Signal::SIGTERM), Some(143));
    for child in children {
        assert_gone(child, "the agent's MCP server");
    }
}

#[test]
fn a_call_the_client_cancels_ends_with_its_processes_and_the_server_goes_on() {
    let state = temp();
    let sleeper = Sleeper::new();
    let mut child = spawn_stdio_server(state.path());
    let (mut stdin, mut stdout) = initialized(&mut child);
    let mut send = |message: Value| send_frame(&mut stdin, &message);
    let mut receive = || receive_frame(&mut stdout);
    // A call that runs until it is stopped, saying its pid first.
    let command = sleeper.command();
    send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "bash__exec", "arguments": {"command": command}}}));
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid: u32 = loop {
        if let Some(pid) = sleeper.pid() {
            break pid;
        }
        assert!(Instant::now() < deadline, "the call did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!is_gone(pid));

    send(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2, "reason": "enough"}}),
    );
    assert_gone(pid, "the process of a call the client cancelled");

    // The server answers the next request (the cancelled one may or may not
    // be answered first, as the protocol allows).
    send(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}));
    let listed = loop {
        let frame = receive();
        if frame["id"] == 3 {
            break frame;
        }
        assert_eq!(frame["id"], 2, "{frame}");
    };
    assert!(listed["result"]["tools"].as_array().is_some_and(|tools| !tools.is_empty()), "{listed}");
    let _ = child.kill();
    let _ = child.wait();
}

/// The state letter and parent of `pid`, or `None` once it is gone.
fn state_and_parent(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_ascii_whitespace();
    Some((fields.next()?.chars().next()?, fields.next()?.parse().ok()?))
}

/// A bash call's background job outlives the call's shell, is adopted by
/// `gdn` (a subreaper) and ends later: `gdn` reaps it at once instead of
/// keeping a zombie until it exits.
#[test]
fn a_background_job_that_ends_after_its_call_is_reaped_not_left_a_zombie() {
    let state = temp();
    let mut child = spawn_stdio_server(state.path());
    let gdn = child.id();
    let (mut stdin, mut stdout) = initialized(&mut child);
    send_frame(
        &mut stdin,
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "bash__exec", "arguments": {"command": "sleep 0.5 >/dev/null 2>&1 & echo $!"}}}),
    );
    let answer = receive_frame(&mut stdout);
    let text = answer["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned();
    let job: u32 = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|output| output["stdout"].as_str().and_then(|out| out.trim().parse().ok()))
        .unwrap_or_else(|| panic!("the job's pid in {answer}"));
    // While it sleeps it is gdn's (its shell has exited).
    let deadline = Instant::now() + Duration::from_secs(10);
    while state_and_parent(job).is_some_and(|(_, parent)| parent != gdn) {
        assert!(Instant::now() < deadline, "the job was not adopted by gdn");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Once it ends, gdn reaps it: no zombie stays behind.
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Some((state, _)) = state_and_parent(job) {
        assert!(Instant::now() < deadline, "the ended job stayed a zombie of gdn (state {state})");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stdin);
    let status = child.wait().unwrap_or_else(|e| panic!("wait gdn: {e}"));
    assert!(status.success(), "{status:?}");
}

/// What a client of the tasks extension runs on both transports: a quick
/// call (answered at once), a slow one it follows transparently, one it
/// drives as a task, and one it cancels, whose process must end.
/// A call that says its pid and sleeps. The sandboxed command may write
/// only its workdir and its private `TMPDIR`, so it leaves its pid in one of
/// them, under a unique name the test finds: `TMPDIR` (`<temp>/goondan-sandbox-*/tmp`,
/// gone when the server ends) or a workdir the test gave the server.
struct Sleeper {
    name: String,
    workdir: Option<PathBuf>,
}

impl Sleeper {
    fn new() -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self { name: format!("goondan-test-{}-{n}.pid", std::process::id()), workdir: None }
    }

    /// One whose server runs with `--workdir workdir`.
    fn in_workdir(workdir: &Path) -> Self {
        Self { workdir: Some(workdir.to_path_buf()), ..Self::new() }
    }

    fn command(&self) -> String {
        match &self.workdir {
            Some(_) => format!("echo $$ > {}; exec sleep 600", self.name),
            None => format!("echo $$ > \"$TMPDIR/{}\"; exec sleep 600", self.name),
        }
    }

    /// The pid the call wrote, once it did.
    fn pid(&self) -> Option<u32> {
        if let Some(workdir) = &self.workdir {
            return std::fs::read_to_string(workdir.join(&self.name)).ok()?.trim().parse().ok();
        }
        std::fs::read_dir(std::env::temp_dir()).ok()?.flatten().find_map(|dir| {
            let name = dir.file_name();
            if !name.to_str()?.starts_with("goondan-sandbox-") {
                return None;
            }
            // The commands' TMPDIR is the sandbox directory's `tmp`.
            std::fs::read_to_string(dir.path().join("tmp").join(&self.name)).ok()?.trim().parse().ok()
        })
    }
}

fn check_tasks(python: &Path, server: Value, sleeper: &Sleeper) {
    let slow = json!({"command": "sleep 2; echo slept"});
    let stoppable = json!({"command": sleeper.command()});
    let answers = tasks_client(
        python,
        server,
        json!([
            {"op": "call", "name": "text-transform__case", "args": {"text": "hello", "to": "upper"}},
            {"op": "call", "name": "bash__exec", "args": slow},
            {"op": "task", "name": "bash__exec", "args": slow},
            {"op": "cancel", "name": "bash__exec", "args": stoppable, "after": 1.0},
        ]),
    );
    // At once, as before: no task for a quick call.
    assert_eq!(answers[0]["structuredContent"]["result"], "HELLO", "{}", answers[0]);
    assert!(answers[0]["seconds"].as_f64().is_some_and(|s| s < 1.0), "{}", answers[0]);
    // Transparent: the client followed the task the server made of it.
    assert_eq!(answers[1]["isError"], false, "{}", answers[1]);
    assert!(
        answers[1]["structuredContent"]["stdout"].as_str().is_some_and(|out| out.contains("slept")),
        "{}",
        answers[1]
    );
    assert!(answers[1]["seconds"].as_f64().is_some_and(|s| s >= 2.0), "{}", answers[1]);
    // As a task: working at first, then its result.
    assert!(answers[2]["taskId"].as_str().is_some_and(|id| !id.is_empty()), "{}", answers[2]);
    assert_eq!(answers[2]["first"], "working", "{}", answers[2]);
    assert!(
        answers[2]["structuredContent"]["stdout"].as_str().is_some_and(|out| out.contains("slept")),
        "{}",
        answers[2]
    );
    // Cancelled: the task says so and the call's process is gone.
    assert_eq!(answers[3]["status"], "cancelled", "{}", answers[3]);
    let pid = sleeper.pid().unwrap_or_else(|| panic!("the cancelled call did not start"));
    assert_gone(pid, "the process of a task the client cancelled");
}

#[test]
fn a_client_of_the_tasks_extension_gets_long_calls_as_tasks_it_can_cancel_over_stdio() {
    let Some(python) = mcp_tasks_python() else { return };
    let state = temp();
    let workdir = temp();
    let mut server = stdio_server(state.path());
    if let Some(args) = server["args"].as_array_mut() {
        args.extend([json!("--workdir"), json!(workdir.path())]);
    }
    check_tasks(&python, server, &Sleeper::in_workdir(workdir.path()));
}

#[test]
fn a_client_of_the_tasks_extension_gets_long_calls_as_tasks_it_can_cancel_over_http() {
    let Some(python) = mcp_tasks_python() else { return };
    let state = temp();
    let workdir = temp();
    let workdir_arg = workdir.path().to_string_lossy().into_owned();
    let server = HttpServer::start(state.path(), &["--workdir", &workdir_arg]);
    check_tasks(&python, json!({"url": server.url}), &Sleeper::in_workdir(workdir.path()));
}
