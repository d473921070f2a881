//! OpenTelemetry export through the `gdn` binary, against a real OTLP/HTTP
//! receiver on 127.0.0.1 that decodes each request with the official
//! definitions (`opentelemetry-proto`).
//!
//! The fixture (`tests/fixtures/otel`): the coordinator's scripted model
//! calls `agents__request` to the worker, whose model calls a script tool
//! (`trace__show`, in the JavaScript host) and an MCP tool (`fake__echo`, the
//! client's fake server over stdio) in one step. One trace must hold the two
//! agent processes' spans, parent to child; the script tool must see its
//! call's `traceparent`, and the MCP server must get it in `_meta`.

use std::collections::HashMap;
use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

mod common;
use common::{instance_path, js_runtime_usable, repo_path};
use goondan_test_support::model::read_http_request;

type Spans = Arc<Mutex<Vec<Span>>>;

/// A receiver on 127.0.0.1: its base URL, and the spans it decoded.
fn receiver() -> (String, Spans) {
    let Ok(listener) = TcpListener::bind("127.0.0.1:0") else { panic!("bind") };
    let Ok(address) = listener.local_addr() else { panic!("address") };
    let spans: Spans = Arc::default();
    std::thread::spawn({
        let spans = Arc::clone(&spans);
        move || {
            for stream in listener.incoming().flatten() {
                let (_, body) = read_http_request(&stream);
                let status = match ExportTraceServiceRequest::decode(body.as_slice()) {
                    Ok(request) => {
                        let decoded =
                            request.resource_spans.into_iter().flat_map(|rs| rs.scope_spans).flat_map(|ss| ss.spans);
                        if let Ok(mut all) = spans.lock() {
                            all.extend(decoded);
                        }
                        "200 OK"
                    }
                    Err(_) => "400 Bad Request",
                };
                let mut stream = &stream;
                let _ = write!(stream, "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            }
        }
    });
    (format!("http://{address}"), spans)
}

fn gdn(state: &Path, env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gdn"))
        .arg("-c")
        .arg(repo_path("tests/fixtures/otel"))
        .arg("--state-root")
        .arg(state)
        .args(["--json", "run", "--input", "USER-SECRET-MESSAGE"])
        .env("NO_COLOR", "1")
        .env("TMPDIR", state)
        .env("GOONDAN_TEST_MCP_FAKE", repo_path("crates/goondan-mcp/tests/fake-server.mjs"))
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env_remove("GOONDAN_STATE_ROOT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_SDK_DISABLED")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn gdn: {e}"))
}

/// The spans once `count` have arrived (the agent processes send theirs
/// as they exit), or what came within 15 s.
fn spans_within(spans: &Spans, count: usize) -> Vec<Span> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let got = spans.lock().map(|all| all.clone()).unwrap_or_default();
        if got.len() >= count || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn attr(span: &Span, key: &str) -> Option<Value> {
    span.attributes.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()).and_then(|v| v.value.clone())
}

fn text(value: &str) -> Option<Value> {
    Some(Value::StringValue(value.to_owned()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

struct Tree {
    spans: Vec<Span>,
}

impl Tree {
    fn named(&self, name: &str) -> &Span {
        let found: Vec<&Span> = self.spans.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "one span {name} in {:?}", self.names());
        found[0]
    }

    fn names(&self) -> Vec<&str> {
        self.spans.iter().map(|s| s.name.as_str()).collect()
    }

    /// The children of `parent` by name.
    fn children(&self, parent: &Span) -> HashMap<&str, &Span> {
        self.spans.iter().filter(|s| s.parent_span_id == parent.span_id).map(|s| (s.name.as_str(), s)).collect()
    }
}

#[test]
fn a_two_agent_turn_is_one_trace_through_the_js_host_and_the_mcp_server() {
    if !js_runtime_usable() {
        return;
    }
    let (base, spans) = receiver();
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let meta_file = state.path().join("mcp-meta.jsonl");
    let meta = meta_file.to_string_lossy().into_owned();
    let output = gdn(state.path(), &[("OTEL_EXPORTER_OTLP_ENDPOINT", base.as_str()), ("FAKE_MCP_META", meta.as_str())]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("coordinator done"));

    // coordinator: invoke_agent, 2 steps, 2 chats, 1 tool (6); worker: the same with 2 tools (7).
    let tree = Tree { spans: spans_within(&spans, 13) };
    assert_eq!(tree.spans.len(), 13, "{:?}\n{stderr}", tree.names());
    let trace = &tree.spans[0].trace_id;
    assert!(tree.spans.iter().all(|s| &s.trace_id == trace), "one trace");

    let coordinator = tree.named("invoke_agent coordinator");
    assert!(coordinator.parent_span_id.is_empty(), "the terminal's turn is the root");
    assert_eq!(attr(coordinator, "gen_ai.operation.name"), text("invoke_agent"));
    assert_eq!(attr(coordinator, "gen_ai.agent.name"), text("coordinator"));
    let steps = tree.children(coordinator);
    let step0 = steps.get("step 0").unwrap_or_else(|| panic!("{:?}", tree.names()));
    assert!(steps.contains_key("step 1"));
    let under_step0 = tree.children(step0);
    let chat = under_step0.get("chat coordinator-script").unwrap_or_else(|| panic!("{:?}", tree.names()));
    assert_eq!(attr(chat, "gen_ai.operation.name"), text("chat"));
    assert_eq!(attr(chat, "gen_ai.provider.name"), text("scripted"));
    assert_eq!(attr(chat, "gen_ai.request.model"), text("coordinator-script"));
    assert!(attr(chat, "gen_ai.usage.input_tokens").is_some());
    assert!(attr(chat, "gen_ai.usage.output_tokens").is_some());
    let Some(Value::ArrayValue(reasons)) = attr(chat, "gen_ai.response.finish_reasons") else { panic!("reasons") };
    assert_eq!(reasons.values[0].value, text("tool_calls"));
    let request = under_step0.get("execute_tool agents__request").unwrap_or_else(|| panic!("{:?}", tree.names()));
    assert_eq!(attr(request, "gen_ai.tool.name"), text("agents__request"));
    assert!(matches!(attr(request, "gen_ai.tool.call.id"), Some(Value::StringValue(id)) if !id.is_empty()));

    // The worker's turn, in the other process, is the child of that call.
    let worker = tree.named("invoke_agent worker");
    assert_eq!(worker.parent_span_id, request.span_id, "the delegate carried the call's traceparent");
    assert!(worker.start_time_unix_nano >= request.start_time_unix_nano);
    assert!(worker.end_time_unix_nano <= request.end_time_unix_nano + 5_000_000);
    let worker_step = tree.children(worker).get("step 0").copied().unwrap_or_else(|| panic!("{:?}", tree.names()));
    let calls = tree.children(worker_step);
    let js = calls.get("execute_tool trace__show").unwrap_or_else(|| panic!("{:?}", tree.names()));
    let mcp = calls.get("execute_tool fake__echo").unwrap_or_else(|| panic!("{:?}", tree.names()));
    assert!(calls.contains_key("chat worker-script"));
    assert!(js.status.as_ref().is_none_or(|s| s.code != 2), "{js:?}");
    assert!(mcp.status.as_ref().is_none_or(|s| s.code != 2), "{mcp:?}");

    // The JavaScript tool saw its own span as ctx.traceparent.
    let expected_js = format!("00-{}-{}-01", hex(trace), hex(&js.span_id));
    let worker_log = std::fs::read_to_string(instance_path(state.path(), "worker@default").join("messages.jsonl"))
        .unwrap_or_default();
    assert!(worker_log.contains(&expected_js), "{expected_js} in the JS tool's result: {worker_log}");
    // The MCP server got the MCP call's span in `_meta.traceparent`.
    let expected_mcp = format!("00-{}-{}-01", hex(trace), hex(&mcp.span_id));
    let sent = std::fs::read_to_string(&meta_file).unwrap_or_default();
    let Some(line) = sent.lines().next() else { panic!("no tools/call reached the server") };
    let sent: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(sent["traceparent"], expected_mcp.as_str(), "{sent}");

    // No content by default: not the user's input, not a tool's arguments.
    let dump = format!("{:?}", tree.spans);
    for secret in ["USER-SECRET-MESSAGE", "SECRET-INPUT", "SECRET-ARGUMENT", "SECRET-ECHO"] {
        assert!(!dump.contains(secret), "{secret} was exported");
    }
}

#[test]
fn content_capture_adds_tool_arguments_and_unset_variables_export_nothing() {
    if !js_runtime_usable() {
        return;
    }
    let (base, spans) = receiver();
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", base.as_str()),
        ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true"),
    ];
    let output = gdn(state.path(), &env);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let tree = Tree { spans: spans_within(&spans, 13) };
    let js = tree.named("execute_tool trace__show");
    let Some(Value::StringValue(arguments)) = attr(js, "gen_ai.tool.call.arguments") else { panic!("{js:?}") };
    assert!(arguments.contains("SECRET-ARGUMENT"));

    // The same run with the variable unset (or export disabled) sends nothing.
    let (base, quiet) = receiver();
    for env in [vec![], vec![("OTEL_EXPORTER_OTLP_ENDPOINT", base.as_str()), ("OTEL_SDK_DISABLED", "true")]] {
        let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let output = gdn(state.path(), &env);
        assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(quiet.lock().map(|s| s.is_empty()).unwrap_or(false), "nothing was exported");
}

#[test]
fn a_connectors_event_is_the_root_span_of_its_turns_trace() {
    let (base, spans) = receiver();
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // The example service's `cli` connector reads lines from standard
    // input; the service ends once it is closed and the turn answered.
    let mut command = common::gdn_bin()
        .project(repo_path("examples/service"))
        .state_arg(state.path())
        .env("TMPDIR", state.path())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &base)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .command(["run"]);
    let spawned = command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
    let mut child = spawned.unwrap_or_else(|e| panic!("spawn gdn: {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"hello\n");
    }
    let output = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let deadline = Instant::now() + Duration::from_secs(15);
    let (root, turn) = loop {
        let all = spans.lock().map(|s| s.clone()).unwrap_or_default();
        let root = all.iter().find(|s| s.name == "process terminal").cloned();
        let turn = all.iter().find(|s| s.name.starts_with("invoke_agent ")).cloned();
        if let (Some(root), Some(turn)) = (&root, &turn) {
            break (root.clone(), turn.clone());
        }
        assert!(Instant::now() < deadline, "{:?}", all.iter().map(|s| &s.name).collect::<Vec<_>>());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(root.parent_span_id.is_empty(), "the connector's event is the root");
    assert_eq!(root.kind, 5, "consumer");
    assert_eq!(attr(&root, "goondan.connection"), text("terminal"));
    assert_eq!(turn.trace_id, root.trace_id);
    assert_eq!(turn.parent_span_id, root.span_id, "the agent's turn continues the hub's span");
    assert!(root.end_time_unix_nano >= turn.end_time_unix_nano);
}
