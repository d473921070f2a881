//! Nothing lost, nothing twice: a swarm served over a webhook Connection is
//! killed with SIGKILL twice while events arrive and turns run, and started
//! again on the same state root. Every event that got a 2xx runs its turn,
//! and its input is in the agent's conversation exactly once.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use goondan_test_support::{Agent, Bundle, reply_text, reply_tools};
use serde_json::{Value, json};

const INSTANCES: usize = 3;

fn bundle(dir: &Path, port: u16) {
    // Each turn: a tool call that takes a moment (so kills land inside
    // turns), then the answer.
    let replies = [reply_tools([("bash__exec", json!({"command": "sleep 0.05"}))]), reply_text("done")];
    Bundle::new()
        .scripted_model_as("m", "s", json!({ "replies": replies }))
        .one_agent("crashy", Agent::new("bot", "m").base_tool("bash"))
        .webhook("hook", port, json!([]))
        .write(dir)
        .unwrap_or_else(|e| panic!("write bundle: {e}"));
}

fn start(dir: &Path, state: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_gdn"))
        .args(["-c", &dir.to_string_lossy(), "run", "--drain-secs", "5"])
        .env("GOONDAN_STATE_ROOT", state)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start gdn: {e}"))
}

/// One webhook POST; whether it was acknowledged (2xx).
fn post(port: u16, key: &str, body: &str) -> bool {
    let headers = [("content-type", "application/json"), ("x-delivery-id", key)];
    let response = goondan_test_support::http::post_within(port, &headers, body.as_bytes(), Duration::from_secs(5));
    response.is_ok_and(|response| response.starts_with("HTTP/1.1 2"))
}

fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "gdn never listened on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn workspace_dir(state: &Path) -> PathBuf {
    state.join("workspaces").join("crashy")
}

/// The inbox's records: accepted keys by seq, and how often each seq was done.
fn inbox(state: &Path) -> (BTreeMap<u64, String>, HashMap<u64, usize>) {
    common::inbox_records(&workspace_dir(state))
}

/// The conversation of every instance, folded from its message log.
fn conversations(state: &Path) -> Vec<Value> {
    let mut all = Vec::new();
    let Ok(entries) = std::fs::read_dir(workspace_dir(state).join("instances")) else { return all };
    for entry in entries.flatten() {
        let text = std::fs::read_to_string(entry.path().join("messages.jsonl")).unwrap_or_default();
        let mut messages: Vec<Value> = Vec::new();
        for line in text.lines() {
            let Ok(value) = serde_json::from_str::<Value>(line) else { continue };
            common::apply_commit(&mut messages, &value);
        }
        all.extend(messages);
    }
    all
}

#[test]
fn acknowledged_events_run_exactly_once_across_two_kill_9s() {
    let (dir, state, port) = common::project_on_a_free_port(bundle);

    let mut gdn = start(dir.path(), &state);
    wait_listening(port);
    // A second service of the same project is refused: one writer per inbox.
    let second = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .args(["-c", &dir.path().to_string_lossy(), "run"])
        .env("GOONDAN_STATE_ROOT", &state)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("second gdn: {e}"));
    let refusal = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(2), "{refusal}");
    assert!(refusal.contains("another process serves this project"), "{refusal}");
    let total = 45;
    let mut acked = vec![false; total];
    let mut kills = 0;
    let started = Instant::now();
    for (n, acked) in acked.iter_mut().enumerate() {
        let body = format!(r#"{{"text":"event k{n}","instanceKey":"room:{}"}}"#, n % INSTANCES);
        *acked = post(port, &format!("k{n}"), &body);
        std::thread::sleep(Duration::from_millis(15));
        // Two kills, while events arrive and turns run.
        if n == 15 || n == 30 {
            let _ = gdn.kill();
            let _ = gdn.wait();
            kills += 1;
            gdn = start(dir.path(), &state);
            wait_listening(port);
        }
    }
    assert_eq!(kills, 2);
    // A sender retries what was not acknowledged; a redelivery of an
    // acknowledged key is acknowledged again and runs nothing new.
    for (n, acked) in acked.iter_mut().enumerate() {
        let body = format!(r#"{{"text":"event k{n}","instanceKey":"room:{}"}}"#, n % INSTANCES);
        if !*acked || n % 10 == 0 {
            assert!(post(port, &format!("k{n}"), &body), "k{n} not acknowledged on retry");
            *acked = true;
        }
    }
    // Wait until every accepted event's turn is done.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (accepted, done) = inbox(&state);
        if accepted.len() >= total && accepted.keys().all(|seq| done.contains_key(seq)) {
            break;
        }
        assert!(Instant::now() < deadline, "turns never finished: {} accepted, {} done", accepted.len(), done.len());
        std::thread::sleep(Duration::from_millis(100));
    }
    // The running service is found (status file, trusted while it holds the
    // inbox) and stopped by `gdn stop`, which waits for its drain.
    let list = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .args(["-c", &dir.path().to_string_lossy(), "instance", "list", "--json"])
        .env("GOONDAN_STATE_ROOT", &state)
        .output()
        .unwrap_or_else(|e| panic!("gdn instance list: {e}"));
    let listed: Value = serde_json::from_slice(&list.stdout).unwrap_or_default();
    let service = &listed[0]["service"];
    assert_eq!(service["pid"].as_u64(), Some(u64::from(gdn.id())), "{listed}");
    assert_eq!(service["connections"], serde_json::json!(["hook"]), "{listed}");
    let stop = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .args(["-c", &dir.path().to_string_lossy(), "stop"])
        .env("GOONDAN_STATE_ROOT", &state)
        .output()
        .unwrap_or_else(|e| panic!("gdn stop: {e}"));
    assert_eq!(stop.status.code(), Some(0), "{}", String::from_utf8_lossy(&stop.stderr));
    let status = gdn.wait().unwrap_or_else(|e| panic!("wait: {e}"));
    assert_eq!(status.code(), Some(0), "the service did not stop cleanly");
    assert!(!workspace_dir(&state).join("service.json").exists(), "the status file stayed");

    let (accepted, done) = inbox(&state);
    let mut keys: Vec<&String> = accepted.values().collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), accepted.len(), "a key was stored twice");
    assert_eq!(accepted.len(), total, "every event is stored once");
    for (seq, key) in &accepted {
        assert_eq!(done.get(seq), Some(&1), "{key}: its turn's end recorded {:?} times", done.get(seq));
    }
    // Each event's input is in its conversation exactly once, answered.
    let messages = conversations(&state);
    for n in 0..total {
        let text = format!("event k{n}");
        let count = messages
            .iter()
            .filter(|m| {
                m["data"]["role"] == "user" && m["data"]["content"].as_str().is_some_and(|c| c.starts_with(&text))
            })
            .filter(|m| {
                m["data"]["content"]
                    .as_str()
                    .is_some_and(|c| c.len() == text.len() || !c[text.len()..].starts_with(char::is_numeric))
            })
            .count();
        assert_eq!(count, 1, "{text} is in the conversations {count} times");
    }
    let answers =
        messages.iter().filter(|m| m["data"]["role"] == "assistant" && m["data"]["content"] == "done").count();
    assert_eq!(answers, total, "one answer per event");
    let text = std::fs::read_to_string(workspace_dir(&state).join("ingress/inbox.jsonl")).unwrap_or_default();
    let starts = text.lines().filter(|l| l.contains(r#""op":"start""#)).count();
    // More starts than events: kills landed inside turns, which ran again.
    #[allow(clippy::print_stderr)]
    {
        eprintln!("{total} events, 2 kills, {starts} turn starts, {:?}", started.elapsed());
    }
}
