//! Script tools through the real executor pipeline (catalog, validation,
//! handler) with a real JavaScript runtime: the fixture bundle
//! `tests/fixtures/script-tools`. Each test skips with a printed reason when
//! no runtime is found, unless `GOONDAN_REQUIRE_JS=1`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Kit, TRACE_ID, error, output, runtime_or_skip};
use goondan_core::ToolStatus;
use goondan_script::{CANCEL_GRACE, RuntimeKind, ScriptHost};
use serde_json::json;

macro_rules! kit {
    ($name:expr, $timeout:expr) => {{
        let Some(runtime) = runtime_or_skip($name) else { return };
        let kind = runtime.kind;
        (Kit::new(ScriptHost::with_runtime(runtime), $timeout), kind)
    }};
}

#[tokio::test]
async fn nothing_starts_until_the_first_call_and_only_local_tools_are_installed() {
    let (kit, _) = kit!("lazy start", None);
    // kit (17 exports) + shaped (1) + spare (1, declared by no agent: in
    // the registry, not the catalog); the base `wait` tool is not a script.
    assert_eq!(kit.installed, 19);
    assert!(!kit.catalog.contains("spare__hello"));
    assert_eq!(kit.host.running_pid().await, None);
    let result = kit.call("c1", "kit__echo", json!({"text": "hi"})).await;
    assert_eq!(output(&result)["text"], "hi");
    assert!(kit.host.running_pid().await.is_some());
}

/// The registry holds the bundle's script Tools that no agent declares
/// (spec 002 §1.1): registered without starting the host or loading a
/// module; refused outside the catalog by default; run, loading its module
/// then, by an executor whose policy lets calls reach the registry.
#[tokio::test]
async fn an_undeclared_script_tool_runs_only_under_the_registry_policy_and_loads_only_then() {
    let (kit, _) = kit!("undeclared tool", None);
    assert!(kit.executor.registry().contains("spare__hello"));
    let refused = kit.call("c1", "spare__hello", json!({"name": "ada"})).await;
    assert_eq!(error(&refused).0, "E_TOOL_NOT_IN_CATALOG");
    assert_eq!(kit.host.running_pid().await, None, "neither registering nor refusing starts the host");

    let open = goondan_tools::ToolExecutor::new(Arc::clone(kit.executor.registry()))
        .with_policy(goondan_tools::ExecutorPolicy { allow_registry_calls: true, call_timeout: None });
    let call =
        goondan_core::ToolCall::new("c2", "spare__hello", serde_json::Map::from_iter([("name".into(), json!("ada"))]));
    let result = open.execute(call.clone(), &kit.scope(vec![call]), &kit.catalog).await;
    assert_eq!(output(&result), &json!({"greeting": "hello ada", "tool": "spare__hello"}));
    // Its own schema still applies.
    let call = goondan_core::ToolCall::new("c3", "spare__hello", serde_json::Map::new());
    let result = open.execute(call.clone(), &kit.scope(vec![call]), &kit.catalog).await;
    assert_eq!(error(&result).0, "E_TOOL_INVALID_ARGS");
}

#[tokio::test]
async fn plain_return_sees_the_tool_context() {
    let (kit, _) = kit!("plain return", None);
    let result = kit.call("call-7", "kit__echo", json!({"text": "hello"})).await;
    let out = output(&result);
    assert_eq!(out["text"], "hello");
    assert_eq!(out["agentName"], "scripter");
    assert_eq!(out["instanceKey"], "inst-1");
    assert_eq!(out["turnId"], "turn-1");
    assert_eq!(out["traceId"], TRACE_ID);
    assert_eq!(out["toolCallId"], "call-7");
    assert_eq!(out["toolName"], "kit__echo");
    assert_eq!(out["workdir"], kit.workdir.to_string_lossy().as_ref());
    assert_eq!(out["undefinedBecomesNull"], json!(null));
    // The assistant message holding the call, as JSON.
    assert_eq!(out["message"]["data"]["role"], "assistant", "{}", out["message"]);
    assert!(out["message"].to_string().contains("call-7"), "{}", out["message"]);
}

#[tokio::test]
async fn results_larger_than_the_socket_buffer_arrive_whole() {
    let (kit, _) = kit!("large results", None);
    // 4 MiB of text (half of it two-byte characters) in one frame, twice in a
    // row: a frame the socket takes in pieces must go out whole and in order.
    for _ in 0..2 {
        let result = kit.call("big", "kit__big", json!({"size": 4 * 1024 * 1024})).await;
        let text = output(&result)["text"].as_str().map(str::to_owned).unwrap_or_default();
        assert_eq!(text.chars().count(), 4 * 1024 * 1024);
        assert!(text.starts_with('é') && text.ends_with('x'));
    }
    let after = kit.call("echo", "kit__echo", json!({"text": "still in step"})).await;
    assert_eq!(output(&after)["text"], "still in step");
}

#[tokio::test]
async fn arguments_are_validated_before_the_host_is_asked() {
    let (kit, _) = kit!("validation", None);
    let result = kit.call("c1", "kit__echo", json!({"text": 5})).await;
    assert_eq!(error(&result).0, "E_TOOL_INVALID_ARGS");
    assert_eq!(kit.host.running_pid().await, None);
}

#[tokio::test]
async fn relative_imports_node_modules_and_default_export_shape() {
    let (kit, _) = kit!("imports", None);
    let result = kit.call("c1", "kit__shout", json!({"text": "hey"})).await;
    assert_eq!(output(&result), &json!("HEY!"));
    let result = kit.call("c2", "kit__join", json!({"parts": ["a", "b", "../c"]})).await;
    assert_eq!(output(&result), &json!("a/c"));
    let result = kit.call("c3", "shaped__ping", json!({})).await;
    assert_eq!(output(&result), &json!("pong"));
}

#[tokio::test]
async fn bun_spawn_runs_a_process() {
    let (kit, kind) = kit!("Bun.spawn", None);
    if kind != RuntimeKind::Bun {
        return; // The `Bun` global exists only in Bun.
    }
    let result = kit.call("c1", "kit__spawn", json!({"text": "from echo"})).await;
    assert_eq!(output(&result), &json!({"out": "from echo", "code": 0}));
}

#[tokio::test]
async fn thrown_errors_keep_their_code_suggestion_and_help_url() {
    let (kit, _) = kit!("thrown error", None);
    let result = kit.call("c1", "kit__fail", json!({})).await;
    assert_eq!(result.status, ToolStatus::Error);
    let error = result.error.clone().unwrap_or_else(|| panic!("{result:?}"));
    assert_eq!(error.message, "the kit is broken");
    assert_eq!(error.name.as_deref(), Some("CodedError"));
    assert_eq!(error.code.as_deref(), Some("E_KIT_BROKEN"));
    assert_eq!(error.suggestion.as_deref(), Some("Fix the kit."));
    assert_eq!(error.help_url.as_deref(), Some("https://example.com/kit"));

    let result = kit.call("c2", "kit__throwString", json!({})).await;
    let error = result.error.clone().unwrap_or_else(|| panic!("{result:?}"));
    assert_eq!(error.message, "plain string");
    assert_eq!(error.name.as_deref(), Some("Error"));
    assert_eq!(error.code.as_deref(), Some("E_TOOL"));
}

#[tokio::test]
async fn a_missing_export_names_the_module_and_the_export() {
    let (kit, _) = kit!("missing export", None);
    let result = kit.call("c1", "kit__missing", json!({})).await;
    let (code, message) = error(&result);
    assert_eq!(code, "E_SCRIPT_EXPORT_MISSING");
    assert!(message.contains("tools/kit.ts") && message.contains("'missing'"), "{message}");
}

#[tokio::test]
async fn without_an_orchestrator_the_agents_api_rejects_clearly_and_pending_work_is_pending() {
    let (kit, _) = kit!("runtime api", None);
    let result = kit.call("c1", "kit__agents", json!({})).await;
    let message = output(&result).as_str().unwrap_or_default().to_owned();
    assert!(message.starts_with("ctx.runtime.request: E_AGENTS_UNAVAILABLE: "), "{message}");
    let result = kit.call("c2", "kit__submit", json!({})).await;
    assert_eq!(result.status, ToolStatus::Pending);
    assert_eq!(result.handle.as_deref(), Some("job-1"));
    let result = kit.call("c3", "kit__noop", json!({})).await;
    assert_eq!(output(&result), &json!(null));
}

#[tokio::test]
async fn an_exiting_host_fails_the_call_and_the_next_call_restarts_it() {
    let (kit, _) = kit!("host exit", None);
    let first = kit.call("c0", "kit__echo", json!({"text": "warm"})).await;
    output(&first);
    let pid = kit.host.running_pid().await;
    let result = kit.call("c1", "kit__exit", json!({})).await;
    let (code, message) = error(&result);
    assert_eq!(code, "E_SCRIPT_HOST_EXITED");
    assert!(message.contains("exited with code 3"), "{message}");
    let result = kit.call("c2", "kit__echo", json!({"text": "again"})).await;
    assert_eq!(output(&result)["text"], "again");
    assert_ne!(kit.host.running_pid().await, pid);
}

#[tokio::test]
async fn a_hung_host_is_cut_by_the_timeout_killed_and_replaced() {
    // The call after the hang waits for the verdict on the blocked host (up
    // to CANCEL_GRACE) and a fresh start, all within its own deadline.
    let (kit, _) = kit!("hang", Some(CANCEL_GRACE * 2));
    let first = kit.call("c0", "kit__echo", json!({"text": "warm"})).await;
    output(&first);
    let pid = kit.host.running_pid().await;
    let result = kit.call("c1", "kit__hang", json!({})).await;
    assert_eq!(error(&result).0, "E_TOOL_TIMEOUT");
    let result = kit.call("c2", "kit__echo", json!({"text": "after"})).await;
    assert_eq!(output(&result)["text"], "after");
    assert_ne!(kit.host.running_pid().await, pid);
}

#[tokio::test]
async fn a_timed_out_async_call_leaves_a_healthy_host_running() {
    let (kit, _) = kit!("async timeout", Some(Duration::from_secs(1)));
    let first = kit.call("c0", "kit__echo", json!({"text": "warm"})).await;
    output(&first);
    let pid = kit.host.running_pid().await;
    let result = kit.call("c1", "kit__slow", json!({"ms": 60_000})).await;
    assert_eq!(error(&result).0, "E_TOOL_TIMEOUT");
    let result = kit.call("c2", "kit__echo", json!({"text": "after"})).await;
    assert_eq!(output(&result)["text"], "after");
    // The host acknowledged the cancel, so it was not killed.
    assert_eq!(kit.host.running_pid().await, pid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_of_a_step_run_concurrently() {
    let (kit, _) = kit!("concurrency", None);
    let kit = Arc::new(kit);
    let (a, b) = tokio::join!(
        kit.call("a", "kit__slow", json!({"label": "a"})),
        kit.call("b", "kit__slow", json!({"label": "b"}))
    );
    let (a, b) = (output(&a), output(&b));
    let span = |v: &serde_json::Value| (v["start"].as_i64().unwrap_or(0), v["end"].as_i64().unwrap_or(0));
    let ((a_start, a_end), (b_start, b_end)) = (span(a), span(b));
    assert!(a_start < b_end && b_start < a_end, "the calls did not overlap: a {a}, b {b}");
}

#[tokio::test]
async fn printing_to_stdout_does_not_break_the_frames() {
    let (kit, _) = kit!("stdout", None);
    let result = kit.call("c1", "kit__noisy", json!({})).await;
    assert_eq!(output(&result), &json!("quiet result"));
    let result = kit.call("c2", "kit__echo", json!({"text": "still fine"})).await;
    assert_eq!(output(&result)["text"], "still fine");
}

#[tokio::test]
async fn no_runtime_is_an_error_result_naming_the_module() {
    let host = ScriptHost::new(Arc::new(|name: &str| (name == "PATH").then(|| "/nonexistent-goondan".to_owned())));
    let kit = Kit::new(host, None);
    let result = kit.call("c1", "kit__echo", json!({"text": "hi"})).await;
    let (code, message) = error(&result);
    assert_eq!(code, "E_SCRIPT_RUNTIME_MISSING");
    assert!(message.contains("tools/kit.ts"), "{message}");
    assert!(message.contains("install Bun (https://bun.sh) or set GOONDAN_JS_RUNTIME"), "{message}");
}
