//! `gdn run`, `gdn instance` and `gdn init`, end to end, offline.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

mod common;
use common::js_runtime_usable;
use common::temp;
use goondan_test_support::text;

fn repo(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative)
}

/// Runs gdn with a private state root and NO_COLOR.
fn gdn(state: &Path, args: &[&str]) -> Output {
    gdn_stdin(state, args, None)
}

fn gdn_stdin(state: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    common::gdn_bin().state_arg(state).env_remove("GOONDAN_TEST_OPENAI_KEY").run_with_stdin(args, stdin)
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// The conversation a message log folds to, one JSON value per message.
fn folded(path: &Path) -> Vec<Value> {
    let loaded = goondan_runtime::store::read_message_log(path).unwrap_or_else(|e| panic!("{e}"));
    assert!(!loaded.skipped_torn_tail && loaded.skipped_corrupt_lines == 0, "{} has unreadable lines", path.display());
    loaded.state.messages().iter().map(|m| serde_json::to_value(m).unwrap_or_default()).collect()
}

#[test]
fn the_offline_example_runs_a_turn_and_the_conversation_continues() {
    let state = temp();
    let work = temp();
    let example = repo("examples/quickstart");
    let workdir = work.path().to_string_lossy().into_owned();
    let args = ["-c", example.to_str().unwrap_or_default(), "run", "--input", "Take notes", "--workdir", &workdir];
    let output = gdn(state.path(), &args);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    assert!(stdout.contains("the second team member is grace. DONE."), "{stdout}");
    let stderr = text(&output.stderr);
    for tool in ["file-system__write", "json-query__query", "file-system__read", "bash__exec", "text-transform__case"] {
        assert!(stderr.contains(&format!("⚙ {tool} → ok")), "{stderr}");
    }
    assert!(work.path().join("workspace/notes.md").is_file(), "the tools worked in --workdir");

    let instance = common::instance_path(state.path(), "assistant@default");
    let messages = folded(&instance.join("messages.jsonl"));
    // user, assistant(2 calls), 2 results, assistant(3 calls), 3 results, assistant(answer)
    assert_eq!(messages.len(), 9);
    assert_eq!(messages[0]["data"]["role"], "user");
    assert_eq!(messages[8]["data"]["content"].as_str().map(|t| t.ends_with("DONE.")), Some(true));
    let events = lines(&instance.join("events.jsonl"));
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"turn.started"));
    assert_eq!(kinds.last(), Some(&"turn.completed"));
    assert_eq!(kinds.iter().filter(|k| **k == "tool.completed").count(), 5);
    assert_eq!(kinds.iter().filter(|k| **k == "step.completed").count(), 3);

    // The next run continues the same conversation.
    let output = gdn(state.path(), &args);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(folded(&instance.join("messages.jsonl")).len(), 18);

    // instance list and delete
    let list = gdn(state.path(), &["--json", "instance", "list"]);
    let listed: Value = serde_json::from_slice(&list.stdout).unwrap_or_default();
    assert_eq!(listed[0]["instanceKey"], "default");
    assert_eq!(listed[0]["turns"], 2);
    assert_eq!(listed[0]["messages"], 18);
    let config = example.to_str().unwrap_or_default();
    let deleted = gdn(state.path(), &["-c", config, "instance", "delete", "default", "--force"]);
    assert_eq!(deleted.status.code(), Some(0), "{}", text(&deleted.stderr));
    assert!(!instance.exists());
    let again = gdn(state.path(), &["-c", config, "instance", "delete", "default", "--force"]);
    assert_eq!(again.status.code(), Some(2));
}

#[test]
fn a_torn_last_line_is_skipped_with_a_warning_and_the_log_heals() {
    let state = temp();
    let work = temp();
    let example = repo("examples/quickstart");
    let workdir = work.path().to_string_lossy().into_owned();
    let args = [
        "-c",
        example.to_str().unwrap_or_default(),
        "run",
        "--input",
        "x",
        "--workdir",
        &workdir,
        "--instance-key",
        "torn",
    ];
    assert_eq!(gdn(state.path(), &args).status.code(), Some(0));
    let log = common::instance_path(state.path(), "assistant@torn").join("messages.jsonl");
    let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap_or_else(|e| panic!("{e}"));
    file.write_all(br#"{"id":"half","data":{"role":"us"#).unwrap_or_else(|e| panic!("{e}"));
    drop(file);
    let output = gdn(state.path(), &args);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("skipped 1 unreadable line"), "{}", text(&output.stderr));
    assert_eq!(folded(&log).len(), 18, "the torn line is gone and both turns are intact");
}

#[test]
fn json_output_and_input_from_a_file_or_stdin() {
    let state = temp();
    let work = temp();
    let example = repo("examples/quickstart");
    let workdir = work.path().to_string_lossy().into_owned();
    let input_file = work.path().join("input.txt");
    std::fs::write(&input_file, "from a file").unwrap_or_else(|e| panic!("{e}"));
    let file_arg = input_file.to_string_lossy().into_owned();
    let output = gdn(
        state.path(),
        &[
            "-c",
            example.to_str().unwrap_or_default(),
            "--json",
            "run",
            "--input-file",
            &file_arg,
            "--workdir",
            &workdir,
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let body: Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    assert_eq!(body["steps"], 3);
    assert_eq!(body["end"], "answered");
    assert!(body["text"].as_str().is_some_and(|t| t.ends_with("DONE.")));
    let first = folded(&common::instance_path(state.path(), "assistant@default").join("messages.jsonl"));
    assert_eq!(first[0]["data"]["content"], "from a file");

    let output = gdn_stdin(
        state.path(),
        &["-c", example.to_str().unwrap_or_default(), "run", "--input-file", "-", "--workdir", &workdir],
        Some("from stdin"),
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
}

#[test]
fn the_step_limit_ends_the_turn_with_a_note() {
    let state = temp();
    let bundle = repo("tests/fixtures/scripted-loop");
    let output = gdn(state.path(), &["-c", bundle.to_str().unwrap_or_default(), "run", "--input", "go"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("step two"), "{}", text(&output.stdout));
    assert!(text(&output.stderr).contains("maxStepsPerTurn (2)"), "{}", text(&output.stderr));
}

#[test]
fn a_missing_api_key_names_the_variable_to_set() {
    let state = temp();
    let bundle = repo("tests/fixtures/needs-key");
    let output = gdn(state.path(), &["-c", bundle.to_str().unwrap_or_default(), "run", "--input", "hi"]);
    assert_eq!(output.status.code(), Some(3));
    assert!(text(&output.stderr).contains("set GOONDAN_TEST_OPENAI_KEY"), "{}", text(&output.stderr));
    // An --env-file can provide it (the model call then fails: nothing listens there).
    let env_dir = temp();
    let env_file = env_dir.path().join(".env");
    std::fs::write(&env_file, "GOONDAN_TEST_OPENAI_KEY=sk-test\nOPENAI_BASE_URL=http://127.0.0.1:9/v1\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let env_arg = env_file.to_string_lossy().into_owned();
    let output =
        gdn(state.path(), &["-c", bundle.to_str().unwrap_or_default(), "run", "--input", "hi", "--env-file", &env_arg]);
    let stderr = text(&output.stderr);
    assert!(!stderr.contains("set GOONDAN_TEST_OPENAI_KEY"), "{stderr}");
    assert!(!stderr.contains("sk-test"), "the key never appears: {stderr}");
}

#[test]
fn init_writes_valid_starter_projects() {
    for template in ["default", "multi-agent"] {
        let dir = temp();
        let target = dir.path().join("proj");
        let target_arg = target.to_string_lossy().into_owned();
        let state = temp();
        let output = gdn(state.path(), &["init", &target_arg, "--template", template]);
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        let check = gdn(state.path(), &["-c", &target_arg, "validate"]);
        assert_eq!(check.status.code(), Some(0), "{template}: {}", text(&check.stdout));
        let again = gdn(state.path(), &["init", &target_arg]);
        assert_eq!(again.status.code(), Some(3), "refuses to overwrite without --force");
        let forced = gdn(state.path(), &["init", &target_arg, "--force"]);
        assert_eq!(forced.status.code(), Some(0));
    }
}

#[test]
fn without_input_gdn_runs_an_interactive_session_over_standard_input() {
    let state = temp();
    let work = temp();
    let example = repo("examples/quickstart");
    let workdir = work.path().to_string_lossy().into_owned();
    let output = gdn_stdin(
        state.path(),
        &["-c", example.to_str().unwrap_or_default(), "run", "--workdir", &workdir],
        Some("first question\n\nsecond question\n/exit\nnever sent\n"),
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout).matches("DONE.").count(), 2);
    let messages = folded(&common::instance_path(state.path(), "assistant@default").join("messages.jsonl"));
    assert_eq!(messages.len(), 18, "two turns; the blank line is skipped and /exit ends the session");
    assert_eq!(messages[9]["data"]["content"], "second question");
}

#[test]
fn ctrl_c_cancels_the_turn_and_leaves_a_valid_conversation() {
    let state = temp();
    let bundle = repo("tests/fixtures/scripted-wait");
    let child = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .arg("--state-root")
        .arg(state.path())
        .args(["-c", bundle.to_str().unwrap_or_default(), "run", "--input", "wait"])
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    // Found again each time: the workspace appears when the run starts.
    let log = || common::instance_path(state.path(), "waiter@default").join("events.jsonl");
    // Wait until the long tool call has started, then interrupt.
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(log()).unwrap_or_default().contains("\"toolName\":\"wait__seconds\"")
        && started.elapsed() < std::time::Duration::from_secs(20)
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(0));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap_or_else(|e| panic!("kill: {e}"));
    let output = child.wait_with_output().unwrap_or_else(|e| panic!("wait: {e}"));
    assert_eq!(output.status.code(), Some(130), "{}", text(&output.stderr));
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "the wait was cut short");
    let messages = folded(&common::instance_path(state.path(), "waiter@default").join("messages.jsonl"));
    // user, assistant with two calls, two results: one ok, one cancelled.
    assert_eq!(messages.len(), 4);
    assert_eq!(messages[2]["data"]["result"]["status"], "ok");
    assert_eq!(messages[3]["data"]["result"]["error"]["code"], "E_TOOL_CANCELLED");
}

#[test]
fn a_second_run_on_a_busy_instance_is_refused() {
    let state = temp();
    let bundle = repo("tests/fixtures/scripted-wait");
    let bundle_arg = bundle.to_str().unwrap_or_default().to_owned();
    let first = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .arg("--state-root")
        .arg(state.path())
        .args(["-c", &bundle_arg, "run", "--input", "wait"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    // Found again each time: the workspace appears when the run starts.
    let log = || common::instance_path(state.path(), "waiter@default").join("events.jsonl");
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(log()).unwrap_or_default().contains("tool.called")
        && started.elapsed() < std::time::Duration::from_secs(20)
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let second = gdn(state.path(), &["-c", &bundle_arg, "run", "--input", "me too"]);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(first.id()).unwrap_or(0));
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
    let _ = first.wait_with_output();
    assert_eq!(second.status.code(), Some(2), "{}", text(&second.stderr));
    assert!(text(&second.stderr).contains("in use by another process"), "{}", text(&second.stderr));
    let messages = folded(&common::instance_path(state.path(), "waiter@default").join("messages.jsonl"));
    assert!(messages.iter().all(|m| m["data"]["content"] != "me too"), "the refused run wrote nothing");
}

#[test]
fn the_js_host_starts_only_when_a_script_tool_is_called() {
    if !js_runtime_usable() {
        return;
    }
    let state = temp();
    let work = temp();
    let workdir = work.path().to_string_lossy().into_owned();
    // The offline example declares a script tool but its model never calls it: no host.
    let example = repo("examples/quickstart");
    let output = gdn(
        state.path(),
        &["-vv", "-c", example.to_str().unwrap_or_default(), "run", "--input", "x", "--workdir", &workdir],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(!text(&output.stderr).contains("script host ready"), "{}", text(&output.stderr));

    // A turn that calls the script tool starts it and gets its result.
    let bundle = repo("tests/fixtures/script-turn");
    let output = gdn(
        state.path(),
        &["-vv", "-c", bundle.to_str().unwrap_or_default(), "run", "--input", "count", "--instance-key", "counting"],
    );
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("script host ready"), "{stderr}");
    assert!(stderr.contains("⚙ word-count__count → ok"), "{stderr}");
    let messages = folded(&common::instance_path(state.path(), "counter@counting").join("messages.jsonl"));
    let result = messages.iter().find(|m| m["data"]["role"] == "tool").cloned().unwrap_or_default();
    assert_eq!(result["data"]["result"]["output"]["words"], 3, "{result}");
}

/// The pids of `pid`'s children whose command line mentions `needle`.
/// Descendants of `pid` (its agent processes' children included) whose
/// command line contains `needle`.
fn children_running(pid: u32, needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    let mut parents = vec![pid];
    while let Some(parent) = parents.pop() {
        let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).unwrap_or_default();
        for child in children.split_whitespace().filter_map(|child| child.parse::<u32>().ok()) {
            parents.push(child);
            if std::fs::read(format!("/proc/{child}/cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(needle))
            {
                found.push(child);
            }
        }
    }
    found
}

/// A process that is gone (or a zombie nobody reaped: it runs nothing).
fn is_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Err(_) => true,
        Ok(status) => status.lines().any(|line| line.starts_with("State:") && line.contains('Z')),
    }
}

#[test]
fn the_js_host_does_not_outlive_gdn_even_after_sigkill() {
    if !js_runtime_usable() {
        return;
    }
    let state = temp();
    let bundle = repo("tests/fixtures/script-slow");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .arg("--state-root")
        .arg(state.path())
        .args(["-c", bundle.to_str().unwrap_or_default(), "run", "--input", "go"])
        // What the killed gdn cannot clean up stays in the test's directory.
        .env("TMPDIR", state.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn gdn: {e}"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let host = loop {
        if let Some(host) = children_running(child.id(), "host.mjs").first() {
            break *host;
        }
        assert!(std::time::Instant::now() < deadline, "the JS host never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    child.kill().unwrap_or_else(|e| panic!("SIGKILL gdn: {e}"));
    let _ = child.wait();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !is_gone(host) {
        assert!(std::time::Instant::now() < deadline, "the JS host {host} outlived gdn");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
