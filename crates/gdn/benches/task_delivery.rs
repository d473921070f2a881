//! Whole-process harness: how long a task's end takes to reach the
//! conversation, against an `agents__request` round trip in the same runs
//! (see `docs/BENCHMARKS.md`, "Tasks").
//!
//! Each run is one `gdn run --input go` of a scripted swarm whose entry
//! agent asks a worker (a synchronous `agents__request`, answered at once)
//! and starts a background command that ends at once (`true`); the run
//! waits for the task, whose end comes back as a turn of its own. From the
//! instance's logs: the request's round trip is its `tool.completed`
//! `duration`; the delivery is the time from the task's end (its `end`
//! record in `tasks.jsonl`) to its `tool_task_result` message in the
//! conversation (`createdAt` in `messages.jsonl`: the running turn's next
//! step, or a turn of its own when none runs), both in milliseconds since
//! the epoch.
//!
//! `cargo bench -p gdn --bench task_delivery` (add `-- 40` for 40 runs).

use std::path::Path;
use std::process::{Command, Stdio};

use goondan_test_support::{Agent, Bundle, reply_text, reply_tools, when_input};
use serde_json::json;

/// A lead that asks the worker (`agents__request`) and starts a background
/// `true`, then answers the task's end; the worker answers at once.
fn bundle() -> Bundle {
    let go = [
        reply_tools([("agents__request", json!({"target": "worker", "input": "ping"}))]),
        reply_tools([("bash__exec", json!({"command": "true", "background": true}))]),
        reply_text("started"),
    ];
    let options = json!({
        "replies": [reply_text("done")],
        "when": [when_input("tool_task_result", [reply_text("delivered")]), when_input("go", go)],
    });
    Bundle::new()
        .scripted_model_as("m", "s", options)
        .agent(Agent::new("lead", "m").base_tool("bash").base_tool("agents"))
        .agent(Agent::new("worker", "m"))
        .swarm("bench", "lead", &["lead", "worker"])
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// The messages of an instance's `messages.jsonl`: a line is a message or
/// `{"events": [...]}` whose `append`s carry one.
fn conversation(instance: &Path) -> Vec<serde_json::Value> {
    let mut messages = Vec::new();
    for line in lines(&instance.join("messages.jsonl")) {
        match line["events"].as_array() {
            Some(events) => messages.extend(events.iter().filter_map(|e| e.get("message").cloned())),
            None => messages.push(line),
        }
    }
    messages
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let index = ((values.len() as f64 - 1.0) * p).round() as usize;
    values.get(index).copied().unwrap_or(f64::NAN)
}

fn main() {
    let runs: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(20);
    let gdn = env!("CARGO_BIN_EXE_gdn");
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    bundle().write(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let mut delivery = Vec::new();
    let mut round_trip = Vec::new();
    for run in 0..runs {
        let state = dir.path().join(format!("state-{run}"));
        let output = Command::new(gdn)
            .arg("-c")
            .arg(dir.path())
            .args(["run", "--input", "go"])
            .env("GOONDAN_STATE_ROOT", &state)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let instance = state.join("workspaces").join("bench").join("instances").join("lead@default");
        let ended = lines(&instance.join("tasks.jsonl"))
            .into_iter()
            .find(|r| r["op"] == "end")
            .and_then(|r| r["at"].as_f64())
            .unwrap_or_else(|| panic!("run {run}: the task did not end"));
        let events = lines(&instance.join("events.jsonl"));
        // The end reaches the conversation as a `tool_task_result` user
        // message: at the running turn's next step when the task ends
        // during it (as here, usually), else as the input of a turn of its own.
        let delivered = conversation(&instance)
            .into_iter()
            .find(|m| m["data"]["content"].as_str().is_some_and(|c| c.contains("\"tool_task_result\"")))
            .and_then(|m| m["createdAt"].as_f64())
            .unwrap_or_else(|| panic!("run {run}: the task's end never reached the conversation"));
        delivery.push(delivered - ended);
        let rtt = events
            .iter()
            .find(|e| e["type"] == "tool.completed" && e["toolName"] == "agents__request")
            .and_then(|e| e["duration"].as_f64())
            .unwrap_or_else(|| panic!("run {run}: no request"));
        round_trip.push(rtt);
    }
    let report = |name: &str, values: &mut Vec<f64>| {
        let line = format!(
            "{name:<42} median {:>6.2} ms   p90 {:>6.2} ms   max {:>6.2} ms   ({} runs)\n",
            percentile(values, 0.5),
            percentile(values, 0.9),
            percentile(values, 1.0),
            values.len()
        );
        let _ = std::io::Write::write_all(&mut std::io::stdout(), line.as_bytes());
    };
    report("task end -> in the conversation (ms resolution)", &mut delivery);
    report("agents__request round trip (tool duration)", &mut round_trip);
}
