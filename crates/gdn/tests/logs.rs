//! `gdn logs`: one time-ordered stream over a project's processes, read
//! from the durable logs — a handoff seen from both ends, filters, JSON
//! lines, and `--follow` showing a turn that runs after it started.

mod common;

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use goondan_test_support::{Agent, Bundle, reply_text, reply_tools};
use serde_json::json;

/// `lead` asks `helper` (with `agents__request`) and answers "lead done".
fn bundle() -> Bundle {
    let ask = json!({"target": "helper", "input": "please"});
    Bundle::new()
        .scripted_model_as(
            "lead-model",
            "lead",
            json!({"replies": [reply_tools([("agents__request", ask)]), reply_text("lead done")]}),
        )
        .scripted_model_as("helper-model", "helper", json!({"replies": [reply_text("helped")]}))
        .agent(Agent::new("lead", "lead-model").base_tool("agents"))
        .agent(Agent::new("helper", "helper-model"))
        .swarm("pair", "lead", &["lead", "helper"])
}

fn gdn(dir: &Path, state: &Path, args: &[&str]) -> Output {
    common::gdn_bin().project(dir).state(state).run(args)
}

#[test]
fn logs_show_a_handoff_from_both_ends_filter_and_follow() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let state = dir.path().join("state");
    bundle().write(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let run = gdn(dir.path(), &state, &["run", "--input", "go"]);
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));

    let all = String::from_utf8_lossy(&gdn(dir.path(), &state, &["logs"]).stdout).into_owned();
    let lead_sent = all.lines().position(|l| l.contains("lead@") && l.contains("agent.request.sent"));
    let helper_got = all.lines().position(|l| l.contains("helper@") && l.contains("agent.request.received"));
    let helper_answered = all.lines().position(|l| l.contains("helper@") && l.contains("agent.response.sent"));
    let lead_got = all.lines().position(|l| l.contains("lead@") && l.contains("agent.response.received"));
    assert!(
        matches!((lead_sent, helper_got, helper_answered, lead_got), (Some(a), Some(b), Some(c), Some(d)) if a <= b && b < c && c <= d),
        "the handoff, in time order, from both ends:\n{all}"
    );
    assert!(all.contains("⚙ agents__request → ok"), "{all}");

    // Filters and JSON.
    let helper = String::from_utf8_lossy(&gdn(dir.path(), &state, &["logs", "--agent", "helper"]).stdout).into_owned();
    assert!(!helper.is_empty() && helper.lines().all(|l| l.contains("helper@")), "{helper}");
    let json = gdn(dir.path(), &state, &["--json", "logs", "--lines", "3"]);
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&json.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert_eq!(lines.len(), 3);
    assert!(lines.iter().all(|l| l["source"].is_string() && l["timestamp"].is_u64()), "{lines:?}");
    let trace = lines[2]["traceId"].as_str().unwrap_or_default().to_owned();
    let traced = String::from_utf8_lossy(&gdn(dir.path(), &state, &["logs", "--trace", &trace]).stdout).into_owned();
    assert!(traced.lines().count() >= 4 && traced.contains("helper@"), "one trace spans both agents:\n{traced}");

    // --follow prints a turn that runs after it started.
    let mut follow = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .arg("-c")
        .arg(dir.path())
        .args(["logs", "--follow", "--lines", "1"])
        .env("GOONDAN_STATE_ROOT", &state)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("gdn logs --follow: {e}"));
    let stdout = follow.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    // The last line of the first run: it has read what was there.
    let first =
        lines_rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|e| panic!("--follow printed nothing: {e}"));
    let again = gdn(dir.path(), &state, &["run", "--input", "again"]);
    assert_eq!(again.status.code(), Some(0));
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = vec![first];
    while !seen.iter().any(|l: &String| l.contains("helper@") && l.contains("turn completed")) {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines_rx.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(_) => panic!("--follow never showed the new turn: {seen:?}"),
        }
    }
    let _ = follow.kill();
    let _ = follow.wait();
}
