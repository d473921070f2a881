//! The original Goondan's eval harness (`packages/eval`) against `gdn`: a
//! script (`tests/eval_harness/run_scenario.mjs`, run by Bun or Node)
//! follows its protocol step by step — `gdn package install`, `gdn run
//! --foreground --state-root S`, the started line, the `cli` connector's
//! JSON line on standard input, `base.jsonl` polled for the answer,
//! SIGTERM, every `runtime-events.jsonl` read — against a bundle whose
//! Model is a local server speaking the OpenAI wire format. The test reads
//! what the harness would have seen: the answer, the runtime-event records
//! (the original's fields, one trace), and exit code 0 after SIGTERM.

mod common;

use std::path::Path;
use std::process::Command;

use goondan_test_support::{Agent, Bundle, FakeModel, Reply, TestResult};
use serde_json::{Value, json};

const ANSWER: &str = "ABC, in capitals.";

/// A tool call of `text-transform__case` for the user's message, then the
/// answer once its result came back; each reply with its token usage.
fn model() -> std::io::Result<FakeModel> {
    FakeModel::start(|request| {
        let messages = request.body["messages"].as_array().cloned().unwrap_or_default();
        if messages.last().is_some_and(|last| last["role"] == "tool") {
            return Reply::text(ANSWER).with_usage(30, 5, 0, 0);
        }
        let arguments = json!({"text": "abc", "to": "upper"}).to_string();
        let call = json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "text-transform__case", "arguments": arguments}}]});
        Reply::deltas(vec![call], "tool_calls").with_usage(20, 7, 0, 0)
    })
}

/// The harness's run, as its script printed it.
fn run_harness(js: &Path, sample: &Path, state: &Path) -> Result<Value, Box<dyn std::error::Error>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/eval_harness/run_scenario.mjs");
    let output = Command::new(js)
        .arg(&script)
        .env("GDN_BIN", env!("CARGO_BIN_EXE_gdn"))
        .env("EVAL_SAMPLE_DIR", sample)
        .env("EVAL_STATE_ROOT", state)
        .env("EVAL_INPUT", "Make abc upper case.")
        // The harness waits 30 s of quiet after the answer; the test, 2 s.
        .env("EVAL_IDLE_MS", "2000")
        .env("EVAL_TIMEOUT_MS", "60000")
        .env("LOCAL_MODEL_KEY", "sk-local")
        .env("NO_COLOR", "1")
        .env_remove("GOONDAN_STATE_ROOT")
        .env_remove("GOONDAN_LOG")
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the harness script failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(serde_json::from_str(stdout.trim())?)
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|event| event["type"] == kind).collect()
}

fn is_hex(value: &Value, digits: usize) -> bool {
    value.as_str().is_some_and(|s| s.len() == digits && s.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[test]
fn the_originals_eval_harness_finds_the_answer_and_the_runtime_events() -> TestResult {
    if !common::js_runtime_usable() {
        return Ok(());
    }
    let js = goondan_script::JsRuntime::discover(&|name: &str| std::env::var(name).ok())?;
    let model = model()?;
    // As the original's samples: a Package first (the harness installs it),
    // depending on `@goondan/base`.
    let package = json!({"version": "0.1.0", "dependencies": [{"name": "@goondan/base", "version": "^0.0.3-alpha17"}]});
    let bundle = Bundle::new()
        .resource("Package", "@samples/eval", package)
        .openai_model("local", "local-model", &model.url(), "LOCAL_MODEL_KEY")
        .one_agent("eval", Agent::new("assistant", "local").base_tool("text-transform"))
        .connection("cli", "cli", &[], json!({"swarmRef": "Swarm/eval"}))
        .write_temp()?;
    let state = tempfile::tempdir()?;
    let root = state.path().join("root");
    let result = run_harness(&js.path, bundle.path(), &root)?;
    let context = format!("gdn's stderr:\n{}\nstdout:\n{}", result["stderr"], result["stdout"]);

    // Started when gdn said so, stopped by SIGTERM after the quiet, exit 0.
    assert_eq!(result["startedLine"], true, "{context}");
    assert_eq!(result["fallback"], false, "{context}");
    assert_eq!(result["stoppedBy"], "idle", "{context}");
    assert_eq!(result["exitCode"], 0, "{context}");
    assert_eq!(result["response"], ANSWER, "{context}");

    let instance = "workspaces/eval/instances/assistant@eval-test/messages";
    assert_eq!(result["baseFiles"], json!([format!("{instance}/base.jsonl")]));
    assert_eq!(result["runtimeEventFiles"], json!([format!("{instance}/runtime-events.jsonl")]));

    let events = result["runtimeEvents"].as_array().cloned().unwrap_or_default();
    let kinds: Vec<&str> = events.iter().filter_map(|event| event["type"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "turn.started",
            "step.started",
            "tool.called",
            "tool.completed",
            "step.completed",
            "step.started",
            "step.completed",
            "turn.completed"
        ],
        "{events:#?}"
    );
    let trace = &events[0]["traceId"];
    assert!(is_hex(trace, 32), "{trace}");
    for event in &events {
        assert_eq!(event["agentName"], "assistant", "{event}");
        assert_eq!(event["instanceKey"], "eval-test", "{event}");
        assert_eq!(&event["traceId"], trace, "one trace: {event}");
        assert!(is_hex(&event["spanId"], 16), "{event}");
        let at = event["timestamp"].as_str().unwrap_or_default();
        assert!(goondan_core::js_message::parse_rfc3339_millis(at).is_some(), "ISO 8601: {event}");
        assert_eq!(event["turnId"], events[0]["turnId"], "{event}");
    }

    let turn = of_type(&events, "turn.started")[0];
    let completed = of_type(&events, "turn.completed")[0];
    assert_eq!(completed["spanId"], turn["spanId"], "a turn is one span");
    assert_eq!(completed["stepCount"], 2);
    assert!(completed["duration"].as_f64().is_some_and(|ms| ms > 0.0), "{completed}");
    assert_eq!(completed["tokenUsage"], json!({"promptTokens": 50, "completionTokens": 12, "totalTokens": 62}));

    let steps = of_type(&events, "step.started");
    let ends = of_type(&events, "step.completed");
    for (index, (step, end)) in steps.iter().zip(&ends).enumerate() {
        assert_eq!(step["parentSpanId"], turn["spanId"], "{step}");
        assert_eq!(step["stepIndex"], index, "{step}");
        assert_eq!(end["stepIndex"], index, "{end}");
        assert_eq!((&end["stepId"], &end["spanId"]), (&step["stepId"], &step["spanId"]), "{end}");
        assert!(end["duration"].as_f64().is_some(), "{end}");
    }
    assert_eq!((&ends[0]["toolCallCount"], &ends[1]["toolCallCount"]), (&json!(1), &json!(0)));
    assert_eq!(ends[0]["tokenUsage"], json!({"promptTokens": 20, "completionTokens": 7, "totalTokens": 27}));

    let called = of_type(&events, "tool.called")[0];
    let done = of_type(&events, "tool.completed")[0];
    for tool in [called, done] {
        assert_eq!(tool["toolName"], "text-transform__case", "{tool}");
        assert_eq!(tool["toolCallId"], "call_1", "{tool}");
        assert_eq!(tool["stepId"], steps[0]["stepId"], "{tool}");
        assert_eq!(tool["parentSpanId"], steps[0]["spanId"], "{tool}");
    }
    assert_eq!(done["spanId"], called["spanId"], "a call is one span");
    assert_eq!(done["status"], "ok");

    // The conversation export in the original's shape; the journal is ours.
    let dir = root.join(instance).parent().map(Path::to_path_buf).unwrap_or_default();
    assert!(dir.join("messages.jsonl").is_file());
    let base = std::fs::read_to_string(root.join(instance).join("base.jsonl"))?;
    let base: Vec<Value> = base.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    let roles: Vec<&str> = base.iter().filter_map(|m| m["data"]["role"].as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    assert_eq!(base[0]["data"]["content"], "Make abc upper case.");
    assert_eq!(base[1]["data"]["content"][0]["type"], "tool-call");
    assert_eq!(base[1]["data"]["content"][0]["input"], json!({"text": "abc", "to": "upper"}));
    assert_eq!(base[2]["data"]["content"][0]["type"], "tool-result");
    assert_eq!(base[3]["data"]["content"], json!([{"type": "text", "text": ANSWER}]));
    assert_eq!(base[3]["source"]["stepId"], steps[1]["stepId"]);
    Ok(())
}
