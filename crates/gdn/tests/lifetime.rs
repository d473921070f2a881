//! No process a tool started outlives its call's end or `gdn`: SIGTERM and
//! SIGHUP end a turn like Ctrl-C, processes that left the tool's process
//! group included, and background jobs end with `gdn`.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use goondan_test_support::{Agent, Bundle, reply_text, reply_tools};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

fn wait_gone(pid: u32, what: &str) {
    common::procs::wait_gone(pid, what, "gdn");
}

fn read_pid(path: &Path) -> u32 {
    common::procs::read_pid(path, Duration::from_secs(20))
}

/// A bundle whose model runs one long bash command that starts a child in
/// the command's group and one that leaves it (`setsid`).
fn write_bundle(dir: &Path) {
    let command =
        "setsid sleep 300 > /dev/null 2>&1 < /dev/null & echo $! > escaped.pid; sleep 300 & echo $! > child.pid; wait";
    let replies = [reply_tools([("bash__exec", json!({"command": command, "timeoutMs": 0}))]), reply_text("finished")];
    Bundle::new()
        .scripted_model_as("scripted", "long", json!({ "replies": replies }))
        .agent(Agent::new("runner", "scripted").base_tool("bash"))
        .write(dir)
        .unwrap_or_else(|e| panic!("{e}"));
}

fn start_run(bundle: &Path, state: &Path, work: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_gdn"))
        .arg("--state-root")
        .arg(state)
        .arg("-c")
        .arg(bundle)
        .args(["run", "--input", "go", "--workdir"])
        .arg(work)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn gdn: {e}"))
}

fn terminate_during_a_call(signal: Signal, expected_code: i32) {
    let bundle = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let work = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write_bundle(bundle.path());
    let child = start_run(bundle.path(), state.path(), work.path());
    let escaped = read_pid(&work.path().join("escaped.pid"));
    let grandchild = read_pid(&work.path().join("child.pid"));
    let gdn = Pid::from_raw(i32::try_from(child.id()).unwrap_or(0));
    kill(gdn, signal).unwrap_or_else(|e| panic!("signal gdn: {e}"));
    let output = child.wait_with_output().unwrap_or_else(|e| panic!("wait: {e}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(expected_code), "{stderr}");
    wait_gone(grandchild, "the command's child");
    wait_gone(escaped, "the child that left the process group");
    // The turn ended as a cancelled one: its call has a result, saved.
    let messages =
        std::fs::read_to_string(common::instance_path(state.path(), "runner@default").join("messages.jsonl"))
            .unwrap_or_default();
    assert!(messages.contains("E_TOOL_CANCELLED"), "{messages}");
}

#[test]
fn sigterm_during_a_tool_call_ends_the_turn_and_every_process_it_started() {
    terminate_during_a_call(Signal::SIGTERM, 143);
}

#[test]
fn sighup_during_a_tool_call_ends_the_turn_and_every_process_it_started() {
    terminate_during_a_call(Signal::SIGHUP, 129);
}

#[test]
fn background_jobs_of_a_finished_call_end_with_gdn() {
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let work = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let bundle = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/quickstart");
    let args = r#"{"command": "setsid sleep 300 > /dev/null 2>&1 < /dev/null & echo $! > bg.pid; echo started"}"#;
    let output = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .arg("--state-root")
        .arg(state.path())
        .arg("-c")
        .arg(&bundle)
        .args(["--json", "tool", "call", "bash__exec", "--workdir"])
        .arg(work.path())
        .args(["--args", args])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("gdn: {e}"));
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stdout).contains("started"));
    wait_gone(read_pid(&work.path().join("bg.pid")), "a background job of a finished call");
}
