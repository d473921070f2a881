//! A server's answer over the client's limit for one message fails that
//! call at once, naming the limit, and the connection stays up.

use std::time::{Duration, Instant};

use goondan_mcp::client::{ClientError, MAX_MESSAGE_BYTES, Server, call_tool};
use goondan_mcp::config::{ServerConfig, StdioServer};
use rmcp::model::CallToolRequestParams;

/// `node` with the fake server, or `None` (after saying why) to skip; with
/// `GOONDAN_REQUIRE_MCP=1` (CI) a missing Node fails.
fn fake_server() -> Option<StdioServer> {
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
    Some(StdioServer { command: "node".into(), args: vec![script.into()], env: Vec::new(), cwd: None, sandbox: None })
}

fn params(tool: &'static str, arguments: serde_json::Value) -> CallToolRequestParams {
    CallToolRequestParams::new(tool).with_arguments(arguments.as_object().cloned().unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_over_the_limit_fails_its_call_at_once_and_the_connection_stays() {
    let Some(spec) = fake_server() else { return };
    let (server, _) = Server::start("fake", ServerConfig::Stdio(spec)).await.unwrap_or_else(|e| panic!("{e}"));
    let connection = server.connection().await.unwrap_or_else(|e| panic!("{e}"));
    let started = Instant::now();
    let call = call_tool(&connection, server.notifications(), params("huge", serde_json::json!({"mib": 24})), None);
    let Ok((result, _)) = tokio::time::timeout(Duration::from_secs(20), call).await else {
        panic!("no answer: the oversized line was dropped without one")
    };
    let elapsed = started.elapsed();
    let Err(ClientError::Request(message)) = result else { panic!("{result:?}") };
    assert!(message.contains(&format!("limit of {MAX_MESSAGE_BYTES} bytes (16 MiB)")), "{message}");
    // At once: not after a call timeout.
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    // The same connection answers the next call.
    assert!(!connection.is_closed());
    let (echoed, _) =
        call_tool(&connection, server.notifications(), params("echo", serde_json::json!({"text": "after"})), None)
            .await;
    let echoed = echoed.unwrap_or_else(|e| panic!("{e}"));
    let text = serde_json::to_value(&echoed.content).unwrap_or_default().to_string();
    assert!(text.contains("after from"), "{text}");
}

/// A stdio server is reaped when its connection is dropped, even after
/// the runtime that ran it is gone (as when an agent process ends): no
/// zombie is left for this process's parent.
#[test]
fn a_dropped_server_is_reaped_even_without_a_runtime() {
    let Some(spec) = fake_server() else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap_or_else(|e| panic!("{e}"));
    let (server, pid) = runtime.block_on(async {
        let (server, _) = Server::start("fake", ServerConfig::Stdio(spec)).await.unwrap_or_else(|e| panic!("{e}"));
        let connection = server.connection().await.unwrap_or_else(|e| panic!("{e}"));
        let (echoed, _) =
            call_tool(&connection, server.notifications(), params("echo", serde_json::json!({"text": "a"})), None)
                .await;
        let text =
            serde_json::to_value(echoed.unwrap_or_else(|e| panic!("{e}")).content).unwrap_or_default().to_string();
        let pid: u32 = text
            .split("a from ")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .and_then(|pid| pid.parse().ok())
            .unwrap_or_else(|| panic!("{text}"));
        (server, pid)
    });
    drop(runtime);
    drop(server);
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
    assert!(state.is_none(), "the server {pid} is not reaped: {state:?}");
}

/// A server slow to start the first time (the SDK's `server/discover`
/// wait of 10 s runs out and its late answer meets `initialize`) is
/// started again and connects, instead of failing with "conflict
/// initialized response id" — what a Python server on a loaded machine
/// did.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_answers_discover_late_is_started_again_and_connects() {
    let Some(mut spec) = fake_server() else { return };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let flag = dir.path().join("starts");
    spec.args = vec![
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/slow-start-server.mjs").into(),
        flag.to_string_lossy().into_owned(),
    ];
    let (_server, tools) = Server::start("slow", ServerConfig::Stdio(spec)).await.unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<String> = tools.iter().map(|tool| tool.name.to_string()).collect();
    assert_eq!(names, ["ping"]);
    let starts = std::fs::read_to_string(&flag).unwrap_or_default();
    // Slow, then `server/discover` refused by the older revision, then `initialize`.
    assert_eq!(starts.lines().collect::<Vec<_>>(), ["slow", "fast", "fast"]);
}
