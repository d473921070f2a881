//! `gdn usage`: the tokens of every kind and the cost of a project's model
//! calls, summed from each step's durable record, through the real binary
//! and a real (fake) OpenAI-format model server that reports usage as
//! OpenAI streams it (`stream_options.include_usage`).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use goondan_test_support::{Agent, Bundle, FakeModel, Reply, json_stdout, stderr, stdout};
use serde_json::{Value, json};

use common::temp;

/// A tool call to a tool the agent does not have: answered with an error
/// result, so the turn takes another step.
fn call_missing_tool() -> Reply {
    Reply::deltas(
        vec![json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "nothing__here", "arguments": "{}"}}]})],
        "tool_calls",
    )
}

/// The model's replies in order; the fifth waits (a step cut short by kill -9).
fn script(request: usize) -> Reply {
    match request {
        0 => Reply::text("one").with_usage(1_000, 200, 400, 50),
        1 => call_missing_tool().with_usage(2_000, 100, 0, 0),
        2 => Reply::text("two").with_usage(3_000, 300, 1_000, 100),
        3 => call_missing_tool().with_usage(500, 50, 0, 0),
        4 => {
            std::thread::sleep(Duration::from_secs(4));
            Reply::text("never recorded").with_usage(9_999, 9_999, 0, 0)
        }
        _ => Reply::text("after").with_usage(10, 1, 0, 0),
    }
}

fn write_bundle(dir: &Path, endpoint: &str, pricing: Option<Value>) {
    let mut model = json!({
        "provider": "openai",
        "model": "local-model",
        "endpoint": endpoint,
        "apiKey": {"valueFrom": {"env": "MODEL_KEY"}},
    });
    if let Some(pricing) = pricing {
        model["pricing"] = pricing;
    }
    Bundle::new()
        .resource("Model", "local", model)
        .agent(Agent::new("a", "local"))
        .write(dir)
        .unwrap_or_else(|e| panic!("{e}"));
}

fn gdn(bundle: &Path, state: &Path) -> goondan_test_support::Gdn {
    common::gdn_bin().state_arg(state).project(bundle).env("MODEL_KEY", "k")
}

fn usage(bundle: &Path, state: &Path, args: &[&str]) -> Value {
    let output = gdn(bundle, state).run([&["usage", "--json"][..], args].concat());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    json_stdout(&output)
}

fn events_logs(state: &Path) -> Vec<PathBuf> {
    common::files_under(state).into_iter().filter(|p| p.ends_with("events.jsonl")).collect()
}

fn recorded_steps(state: &Path) -> usize {
    events_logs(state)
        .iter()
        .map(|path| std::fs::read_to_string(path).unwrap_or_default().matches("\"type\":\"step.completed\"").count())
        .sum()
}

/// The `gdn __agent` child of `parent`.
fn agent_process(parent: u32) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        // `pid (comm) state ppid …`: the fields after the last `)`.
        let ppid: u32 = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        (ppid == parent && String::from_utf8_lossy(&cmdline).contains("__agent")).then_some(pid)
    })
}

fn close(value: &Value, expected: f64) -> bool {
    value.as_f64().is_some_and(|v| (v - expected).abs() < 1e-9)
}

#[test]
fn usage_sums_steps_prices_them_and_counts_a_killed_turns_steps_once() {
    let served = Arc::new(AtomicUsize::new(0));
    let model = {
        let served = Arc::clone(&served);
        FakeModel::start(move |_| script(served.fetch_add(1, Ordering::SeqCst))).unwrap_or_else(|e| panic!("{e}"))
    };
    let bundle = temp();
    let state = temp();
    let pricing = json!({"input": 2, "output": 8, "cacheRead": 0.5});
    write_bundle(bundle.path(), &model.url(), Some(pricing));

    for input in ["first", "second"] {
        let output = gdn(bundle.path(), state.path()).run(["run", "--input", input]);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    // The server was asked for usage, and answered it.
    assert!(model.requests().iter().all(|r| r.body["stream_options"]["include_usage"] == json!(true)));

    let report = usage(bundle.path(), state.path(), &[]);
    let total = &report["total"];
    assert_eq!(total["steps"], 3, "{report}");
    assert_eq!(total["turns"], 2, "{report}");
    assert_eq!(total["promptTokens"], 6_000, "{report}");
    assert_eq!(total["completionTokens"], 600, "{report}");
    assert_eq!(total["totalTokens"], 6_600, "{report}");
    assert_eq!(total["cacheReadTokens"], 1_400, "{report}");
    assert_eq!(total["reasoningTokens"], 150, "{report}");
    // (600×2 + 400×0.5 + 200×8) + (2000×2 + 100×8) + (2000×2 + 1000×0.5 + 300×8), per million.
    assert!(close(&total["costUsd"], 0.0147), "{report}");

    let by_model = usage(bundle.path(), state.path(), &["--by", "model"]);
    assert_eq!(by_model["rows"].as_array().map(Vec::len), Some(1), "{by_model}");
    assert_eq!(by_model["rows"][0]["key"], "openai/local-model");
    assert_eq!(by_model["rows"][0]["promptTokens"], 6_000);
    let by_instance = usage(bundle.path(), state.path(), &["--by", "instance"]);
    assert_eq!(by_instance["rows"][0]["steps"], 3, "{by_instance}");

    // A turn killed in its second step: its first step is recorded, once.
    let mut running =
        gdn(bundle.path(), state.path()).spawn(["run", "--input", "third"], false).unwrap_or_else(|e| panic!("{e}"));
    goondan_test_support::until("the third turn's first step", Duration::from_secs(30), || {
        recorded_steps(state.path()) == 4
    })
    .unwrap_or_else(|e| panic!("{e}: {}", running.stderr()));
    goondan_test_support::until("the model was asked again", Duration::from_secs(30), || {
        served.load(Ordering::SeqCst) >= 5
    })
    .unwrap_or_else(|e| panic!("{e}"));
    // The agent's own process, which runs the turn (gdn run is its parent).
    let agent = agent_process(running.child.id()).unwrap_or_else(|| panic!("no agent process: {}", running.stderr()));
    let killed = nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent), nix::sys::signal::Signal::SIGKILL);
    killed.unwrap_or_else(|e| panic!("{e}"));
    let _ = running.wait_exit(Duration::from_secs(20));
    let output = gdn(bundle.path(), state.path()).run(["run", "--input", "fourth"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let report = usage(bundle.path(), state.path(), &[]);
    assert_eq!(report["total"]["steps"], 5, "{report}");
    assert_eq!(report["total"]["promptTokens"], 6_510, "{report}");
    assert_eq!(report["total"]["completionTokens"], 651, "{report}");

    // --since: the steps of the last second are none of these.
    std::thread::sleep(Duration::from_millis(1_100));
    let recent = usage(bundle.path(), state.path(), &["--since", "1s"]);
    assert_eq!(recent["total"]["steps"], 0, "{recent}");
    assert_eq!(usage(bundle.path(), state.path(), &["--since", "1h"])["total"]["steps"], 5);
    for bad in ["7", "1w", "soon", "1.5h"] {
        let output = gdn(bundle.path(), state.path()).run(["usage", "--since", bad]);
        assert_eq!(output.status.code(), Some(2), "{bad}");
        assert!(stderr(&output).contains("--since"), "{bad}: {}", stderr(&output));
    }

    // Without a price (and not in the default table) the cost is unknown, never 0.
    write_bundle(bundle.path(), &model.url(), None);
    let unpriced = usage(bundle.path(), state.path(), &["--by", "day"]);
    assert_eq!(unpriced["total"]["costUsd"], Value::Null, "{unpriced}");
    assert_eq!(unpriced["total"]["unpricedSteps"], 5, "{unpriced}");
    let output = gdn(bundle.path(), state.path()).run(["usage"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let table = stdout(&output);
    assert!(table.lines().any(|l| l.starts_with("total") && l.ends_with("unknown")), "{table}");
}

#[test]
fn validate_refuses_a_price_that_is_not_a_non_negative_number() {
    let bundle = temp();
    let state = temp();
    write_bundle(bundle.path(), "http://127.0.0.1:9/v1", Some(json!({"input": "cheap", "output": -1})));
    let output = gdn(bundle.path(), state.path()).run(["validate"]);
    let said = format!("{}{}", stdout(&output), stderr(&output));
    assert_ne!(output.status.code(), Some(0), "{said}");
    assert!(said.contains("spec.pricing.input"), "{said}");
    assert!(said.contains("spec.pricing.output"), "{said}");
    assert!(said.contains("E_CONFIG_SCHEMA_INVALID"), "{said}");
}
