//! The crash matrix and the full disk: a webhook service is killed (gdn and
//! its agent process, SIGKILL) right after each write on an event's path —
//! the inbox's accept, start and done records, each commit of the
//! conversation, the task records, instance.json, the status file — and
//! started again; and its storage fails with ENOSPC while events arrive.
//! Every acknowledged event is answered exactly once, and nothing is left
//! half-done.
//!
//! The faults come from goondan-core's `fault-injection` feature
//! (`GOONDAN_FAULT`), which only this test target enables:
//! `cargo test -p gdn --features fault-injection --test crash_matrix`.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::Read as _;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use goondan_test_support::{Agent, Bundle, http, reply_text, reply_tools};
use serde_json::{Value, json};

fn free_port() -> u16 {
    goondan_test_support::free_port().unwrap_or_else(|e| panic!("a free port: {e}"))
}

/// A webhook service whose turn for an event runs a command as a task
/// (`background: true`: a task record opens and ends), then answers
/// "done"; the task's end, delivered later, is answered "noted".
fn bundle(dir: &Path, port: u16) {
    let task = json!({"command": "sleep 0.05", "background": true});
    let options = json!({
        "replies": [reply_text("noted")],
        "when": [{"inputContains": "event k", "replies": [reply_tools([("bash__exec", task)]), reply_text("done")]}],
    });
    Bundle::new()
        .scripted_model_as("m", "s", options)
        .one_agent("crashy", Agent::new("bot", "m").base_tool("bash"))
        .webhook("hook", port, json!([]))
        .write(dir)
        .unwrap_or_else(|e| panic!("write bundle: {e}"));
}

struct Project {
    dir: tempfile::TempDir,
    state: PathBuf,
    port: u16,
}

impl Project {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let state = dir.path().join("state");
        let port = free_port();
        bundle(dir.path(), port);
        Self { dir, state, port }
    }

    fn workspace(&self) -> PathBuf {
        self.state.join("workspaces").join("crashy")
    }

    /// `gdn run` serving the project, with `faults` (`GOONDAN_FAULT…`).
    fn start(&self, faults: &[(&str, &str)]) -> Child {
        self.start_with(faults, Stdio::piped())
    }

    /// `gdn run` listening, with the fault `fault` (a full disk) striking
    /// while the project's file `disk-full` exists (created first when
    /// `full`): the flag file and the process.
    fn start_full_when_flagged(&self, fault: &str, full: bool) -> (PathBuf, Child) {
        let flag = self.dir.path().join("disk-full");
        if full {
            std::fs::write(&flag, "").unwrap_or_else(|e| panic!("flag: {e}"));
        }
        let mut gdn = self.start(&[("GOONDAN_FAULT", fault), ("GOONDAN_FAULT_FULL", &*flag.to_string_lossy())]);
        self.wait_listening(&mut gdn);
        (flag, gdn)
    }

    /// [`Project::start`], its log (info and up) going to `stderr`.
    fn start_with(&self, faults: &[(&str, &str)], stderr: Stdio) -> Child {
        let mut command = Command::new(env!("CARGO_BIN_EXE_gdn"));
        command
            .args(["-c", &self.dir.path().to_string_lossy(), "run", "--drain-secs", "5"])
            .env("GOONDAN_STATE_ROOT", &self.state)
            .env_remove("GOONDAN_FAULT")
            .env_remove("GOONDAN_FAULT_FULL")
            .stdin(Stdio::null())
            .env("GOONDAN_LOG", "info")
            .stdout(Stdio::null())
            .stderr(stderr);
        for (name, value) in faults {
            command.env(name, value);
        }
        command.spawn().unwrap_or_else(|e| panic!("start gdn: {e}"))
    }

    fn gdn(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_gdn"))
            .args(["-c", &self.dir.path().to_string_lossy()])
            .args(args)
            .env("GOONDAN_STATE_ROOT", &self.state)
            .output()
            .unwrap_or_else(|e| panic!("gdn {args:?}: {e}"))
    }

    /// One webhook POST of event `n`; the response's status (0: none).
    fn post(&self, n: usize) -> u16 {
        self.post_padded(n, "")
    }

    /// One webhook POST of event `n`, its text followed by `padding`; the
    /// response's status (0: none).
    fn post_padded(&self, n: usize, padding: &str) -> u16 {
        let body = format!(r#"{{"text":"event k{n}{padding}","instanceKey":"room:{}"}}"#, n % 2);
        let key = format!("k{n}");
        let headers = [("content-type", "application/json"), ("x-delivery-id", key.as_str())];
        let response = http::post_within(self.port, &headers, body.as_bytes(), Duration::from_secs(10));
        response.map_or(0, |response| http::status(&response))
    }

    fn wait_listening(&self, gdn: &mut Child) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Ok(Some(status)) = gdn.try_wait() {
                panic!("gdn ended ({status}) before it listened");
            }
            assert!(Instant::now() < deadline, "gdn never listened on {}", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The inbox's records: accepted keys by seq, how often each seq was
    /// done, and the pending seqs.
    fn inbox(&self) -> (BTreeMap<u64, String>, HashMap<u64, usize>) {
        common::inbox_records(&self.workspace())
    }

    /// Waits until every accepted event's turn is done.
    fn wait_all_done(&self, events: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (accepted, done) = self.inbox();
            if accepted.len() >= events && accepted.keys().all(|seq| done.contains_key(seq)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "turns never finished: {} accepted, {} done",
                accepted.len(),
                done.len()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `gdn stop`, and the service's exit status.
    fn stop(&self, mut gdn: Child) {
        let stop = self.gdn(&["stop"]);
        assert_eq!(stop.status.code(), Some(0), "gdn stop: {}", String::from_utf8_lossy(&stop.stderr));
        let status = wait_exit(&mut gdn, Duration::from_secs(20)).unwrap_or_else(|| {
            let _ = gdn.kill();
            panic!("the service did not exit after gdn stop")
        });
        assert_eq!(status.code(), Some(0), "the service did not stop cleanly: {}", stderr_of(gdn));
    }

    /// Every instance's conversation, folded from its message log.
    fn conversations(&self) -> Vec<Vec<Value>> {
        let mut all = Vec::new();
        let Ok(entries) = std::fs::read_dir(self.workspace().join("instances")) else { return all };
        for entry in entries.flatten() {
            let text = std::fs::read_to_string(entry.path().join("messages.jsonl")).unwrap_or_default();
            let mut messages: Vec<Value> = Vec::new();
            for line in text.lines() {
                let value: Value = serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("{}: an unreadable line ({e}): {line}", entry.path().display()));
                common::apply_commit(&mut messages, &value);
            }
            all.push(messages);
        }
        all
    }

    /// Every acknowledged event (`events` of them) was answered exactly
    /// once, its turn's end recorded once, and nothing is half-done: no
    /// event pending, no tool call without its result, no temp file left.
    fn check_exactly_once(&self, events: usize) {
        let (accepted, done) = self.inbox();
        assert_eq!(accepted.len(), events, "every event is stored once: {accepted:?}");
        for (seq, key) in &accepted {
            assert_eq!(done.get(seq), Some(&1), "{key}: its turn's end recorded {:?} times", done.get(seq));
        }
        let conversations = self.conversations();
        for n in 0..events {
            let text = format!("event k{n}");
            let mut inputs = 0;
            for messages in &conversations {
                for (at, message) in messages.iter().enumerate() {
                    let is_input = message["data"]["role"] == "user"
                        && message["data"]["content"]
                            .as_str()
                            .is_some_and(|c| c == text || c.starts_with(&format!("{text}\n")));
                    if !is_input {
                        continue;
                    }
                    inputs += 1;
                    // Its turn ran to its answer: an assistant's text comes
                    // before the next event's input (a task's completion
                    // message, also a user message, may come in between).
                    let turn: Vec<&Value> = messages[at + 1..]
                        .iter()
                        .take_while(|m| m["data"]["role"] != "user" || is_task_message(m))
                        .collect();
                    // (A task's end that arrives during the turn changes
                    // the scripted model's script: "noted" answers it too.)
                    assert!(
                        turn.iter().any(|m| m["data"]["role"] == "assistant"
                            && m["data"]["content"].as_str().is_some_and(|c| !c.is_empty())
                            && m["data"]["toolCalls"].as_array().is_none_or(Vec::is_empty)),
                        "{text} has no answer in its conversation: {}",
                        outline(messages)
                    );
                }
            }
            assert_eq!(inputs, 1, "{text} is in the conversations {inputs} times");
        }
        for messages in &conversations {
            let answered: Vec<&Value> =
                messages.iter().filter(|m| m["data"]["role"] == "tool").map(|m| &m["data"]["toolCallId"]).collect();
            for message in messages {
                for call in message["data"]["toolCalls"].as_array().into_iter().flatten() {
                    assert!(answered.contains(&&call["id"]), "a tool call without its result: {call}");
                }
            }
        }
        let listed = self.gdn(&["instance", "list", "--json"]);
        let listed: Value = serde_json::from_slice(&listed.stdout).unwrap_or_default();
        for instance in listed.as_array().into_iter().flatten() {
            assert_eq!(instance["pendingEvents"], 0, "an event is left pending: {instance}");
        }
        let mut temps = Vec::new();
        find_temps(&self.workspace(), &mut temps);
        assert!(temps.is_empty(), "temp files left behind: {temps:?}");
    }
}

/// Whether a user message delivers a task's end (taken in during a turn,
/// or the input of a turn of its own), not an event.
fn is_task_message(message: &Value) -> bool {
    !message["metadata"]["toolTask"].is_null() || message["metadata"]["__goondanInbound"]["sourceKind"] == "task"
}

/// A conversation in short: each message's role and the start of its text.
fn outline(messages: &[Value]) -> String {
    let lines: Vec<String> = messages
        .iter()
        .map(|m| {
            let data = &m["data"];
            let text = data["content"].as_str().map_or_else(
                || data["toolCalls"].to_string() + &data["result"]["status"].to_string(),
                |c| c.chars().take(60).collect(),
            );
            format!("{}: {text}", data["role"].as_str().unwrap_or("?"))
        })
        .collect();
    lines.join("\n  ")
}

fn find_temps(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            find_temps(&path, found);
        } else if path.to_string_lossy().ends_with(".tmp") {
            found.push(path);
        }
    }
}

fn wait_exit(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stderr_of(mut child: Child) -> String {
    let mut text = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut text);
    }
    text
}

const EVENTS: usize = 3;

/// Kills at `fault` (`<point>:crash:<nth>`), starts again without it, and
/// checks that every acknowledged event ran exactly once.
fn crash_at(fault: &str) {
    let project = Project::new();
    let mut gdn = project.start(&[("GOONDAN_FAULT", fault)]);
    let mut acked = [false; EVENTS];
    // The status file is written once the connectors listen: a kill right
    // after it may come before a request is answered, or during one.
    let listening = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if TcpStream::connect(("127.0.0.1", project.port)).is_ok() {
                break true;
            }
            if matches!(gdn.try_wait(), Ok(Some(_))) || Instant::now() > deadline {
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    if listening {
        for (n, acked) in acked.iter_mut().enumerate() {
            *acked = project.post(n) == 200;
        }
    }
    // The fault point is on the events' path: the service dies there.
    let Some(status) = wait_exit(&mut gdn, Duration::from_secs(30)) else {
        let _ = gdn.kill();
        panic!("{fault}: the fault point was never reached: {}", stderr_of(gdn));
    };
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{fault}: gdn ended without the kill ({status}): {}",
        stderr_of(gdn)
    );
    // No agent process of the killed service is left holding an instance.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let listed = project.gdn(&["instance", "list", "--json"]);
        let listed: Value = serde_json::from_slice(&listed.stdout).unwrap_or_default();
        if listed.as_array().into_iter().flatten().all(|i| i["running"] != true) {
            break;
        }
        assert!(Instant::now() < deadline, "{fault}: an agent process outlived its service: {listed}");
        std::thread::sleep(Duration::from_millis(50));
    }

    let mut gdn = project.start(&[]);
    project.wait_listening(&mut gdn);
    // The sender delivers again what was not acknowledged, and once more
    // one that was (a redelivery runs nothing new).
    for (n, acked) in acked.iter().enumerate() {
        if !acked || n == 0 {
            assert_eq!(project.post(n), 200, "{fault}: k{n} not acknowledged on redelivery");
        }
    }
    // Then each instance takes a new event (and cleans up what the kill
    // left in its directory).
    for n in EVENTS..EVENTS + 2 {
        assert_eq!(project.post(n), 200, "{fault}: k{n} after the restart");
    }
    project.wait_all_done(EVENTS + 2);
    project.stop(gdn);
    project.check_exactly_once(EVENTS + 2);
}

#[test]
fn a_kill_right_after_the_inbox_stores_an_event() {
    crash_at("inbox.accept:crash:1");
}

#[test]
fn a_kill_right_after_a_turn_start_is_recorded() {
    crash_at("inbox.start:crash:1");
}

#[test]
fn a_kill_right_after_the_user_message_is_committed() {
    crash_at("conversation.commit:crash:1");
}

#[test]
fn a_kill_right_after_the_tool_step_is_committed() {
    crash_at("conversation.commit:crash:2");
}

#[test]
fn a_kill_right_after_the_answer_is_committed() {
    crash_at("conversation.commit:crash:3");
}

#[test]
fn a_kill_right_after_a_task_opens() {
    crash_at("task.update:crash:1");
}

#[test]
fn a_kill_right_after_a_task_ends() {
    crash_at("task.update:crash:2");
}

#[test]
fn a_kill_right_after_instance_json_is_written() {
    crash_at("instance.info:crash:1");
}

#[test]
fn a_kill_right_after_a_turn_end_is_recorded() {
    crash_at("inbox.done:crash:1");
}

#[test]
fn a_kill_right_after_the_status_file_is_written() {
    crash_at("service.status:crash:1");
}

/// The instance's conversation log, instance.json, event log and the
/// service's own log fail with ENOSPC while `flag` exists.
const FULL_DISK: &str = "conversation.commit:full,instance.info:full,events.log:full,task.update:full,service.log:full";

/// Polls `gdn instance list --json` until `room`'s `pending` events wait
/// to be saved again; returns its entry.
fn wait_retrying(project: &Project, room: &str, pending: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed = project.gdn(&["instance", "list", "--json"]);
        let listed: Value = serde_json::from_slice(&listed.stdout).unwrap_or_default();
        let room = listed.as_array().into_iter().flatten().find(|i| i["instanceKey"] == room).cloned();
        if let Some(room) = room
            && room["pendingEvents"] == pending
            && room["retrying"]["failures"].as_u64().is_some_and(|failures| failures >= 1)
        {
            return room;
        }
        assert!(Instant::now() < deadline, "the unsaved turns never showed as retrying: {listed}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_full_disk_keeps_acknowledged_events_pending_and_runs_them_once_it_has_room() {
    let project = Project::new();
    let (flag, gdn) = project.start_full_when_flagged(FULL_DISK, false);
    // room:0 and room:1 exist; then the disk fills.
    assert_eq!(project.post(0), 200);
    assert_eq!(project.post(1), 200);
    project.wait_all_done(2);
    std::fs::write(&flag, "").unwrap_or_else(|e| panic!("flag: {e}"));
    // Acknowledged (the inbox has room), but their turns cannot be saved:
    // the instances' first turns wait, and the next events behind them.
    for n in 2..6 {
        assert_eq!(project.post(n), 200, "k{n}: the service stopped taking events");
    }
    wait_retrying(&project, "room:0", 2);
    let room = wait_retrying(&project, "room:1", 2);
    assert!(
        room["retrying"]["reason"].as_str().is_some_and(|reason| reason.contains("No space left on device")),
        "{room}"
    );
    let table = project.gdn(&["instance", "list"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("2 (retrying: not saved"), "{table}");
    let logs = project.gdn(&["logs"]);
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert!(logs.contains("could not be saved") && logs.contains("runs again"), "{logs}");
    let (_, done) = project.inbox();
    assert_eq!(done.len(), 2, "an event whose turn was not saved was recorded done: {done:?}");
    // Space is freed: the waiting turns run, each once.
    std::fs::remove_file(&flag).unwrap_or_else(|e| panic!("flag: {e}"));
    project.wait_all_done(6);
    project.stop(gdn);
    project.check_exactly_once(6);
}

/// The inbox's writer ending (a bug: a panic at its write) is fatal: the
/// service exits 1 at once and frees its port (no half-alive service
/// answering 503), nothing unstored was acknowledged, and the next start
/// runs what was stored, once.
#[test]
fn a_panicking_inbox_writer_ends_the_service_and_frees_its_port() {
    let project = Project::new();
    let mut gdn = project.start(&[("GOONDAN_FAULT", "inbox.accept:panic:2")]);
    project.wait_listening(&mut gdn);
    assert_eq!(project.post(0), 200);
    assert_ne!(project.post(1), 200, "an event the inbox could not store was acknowledged");
    let Some(status) = wait_exit(&mut gdn, Duration::from_secs(30)) else {
        let _ = gdn.kill();
        panic!("the service lived on without its inbox's writer: {}", stderr_of(gdn));
    };
    assert_eq!(status.code(), Some(1), "{status}: {}", stderr_of(gdn));
    assert!(TcpStream::connect(("127.0.0.1", project.port)).is_err(), "the port is still held");
    let mut gdn = project.start(&[]);
    project.wait_listening(&mut gdn);
    assert_eq!(project.post(1), 200, "k1 on redelivery");
    project.wait_all_done(2);
    project.stop(gdn);
    project.check_exactly_once(2);
}

#[test]
fn sigterm_on_a_full_disk_drains_and_exits_and_the_next_start_runs_what_waits() {
    let project = Project::new();
    let (flag, gdn) = project.start_full_when_flagged(FULL_DISK, false);
    assert_eq!(project.post(1), 200);
    project.wait_all_done(1);
    std::fs::write(&flag, "").unwrap_or_else(|e| panic!("flag: {e}"));
    assert_eq!(project.post(3), 200);
    wait_retrying(&project, "room:1", 1);
    // SIGTERM (its log lines fail to write) drains and exits, in bounded time.
    project.stop(gdn);
    // Not lost across the restart: still pending, and run once there is room.
    std::fs::remove_file(&flag).unwrap_or_else(|e| panic!("flag: {e}"));
    let mut gdn = project.start(&[]);
    project.wait_listening(&mut gdn);
    project.wait_all_done(2);
    project.stop(gdn);
    // Events k1 and k3 (room:1).
    let (accepted, _) = project.inbox();
    assert_eq!(accepted.values().collect::<Vec<_>>(), ["hook/k1", "hook/k3"]);
}

#[test]
fn the_inbox_failing_to_record_a_turn_end_leaves_the_event_pending_until_it_can() {
    let project = Project::new();
    let (flag, gdn) = project.start_full_when_flagged("inbox.done:full", true);
    for n in 0..EVENTS {
        assert_eq!(project.post(n), 200);
    }
    // Answered, but the end cannot be recorded: pending, not lost.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answers: usize = project
            .conversations()
            .iter()
            .flatten()
            .filter(|m| m["data"]["role"] == "assistant" && m["data"]["content"] == "done")
            .count();
        if answers >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no turn ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, done) = project.inbox();
    assert!(done.is_empty(), "a turn end was recorded on a full inbox: {done:?}");
    std::fs::remove_file(&flag).unwrap_or_else(|e| panic!("flag: {e}"));
    project.wait_all_done(EVENTS);
    project.stop(gdn);
    project.check_exactly_once(EVENTS);
}

/// A real full disk: the state root on a 2 MiB tmpfs (root only, as the
/// tests run in CI), the service's log on it too (as `gdn run --detach`
/// keeps it), filled by 60 KB events until the inbox refuses them (500,
/// never 503: the service goes on), stopped by SIGTERM while full, the
/// disk grown, started again: every acknowledged event is answered once.
#[test]
fn a_real_full_tmpfs_loses_no_acknowledged_event() {
    if !nix::unistd::Uid::effective().is_root() {
        // Shown by cargo's runner (scripts/cargo-runner) with the run's other skips.
        common::record_skip("mounting a tmpfs needs root");
        return;
    }
    let project = Project::new();
    std::fs::create_dir_all(&project.state).unwrap_or_else(|e| panic!("state: {e}"));
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&project.state)
        .status()
        .is_ok_and(|status| status.success());
    if !mounted {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("skipping: no tmpfs could be mounted here");
        }
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(project.state.clone());
    let log = std::fs::File::create(project.state.join("service.log")).unwrap_or_else(|e| panic!("log: {e}"));
    let mut gdn = project.start_with(&[], Stdio::from(log));
    project.wait_listening(&mut gdn);
    // A space, then the padding: the text of each event as before, padded.
    let padding = format!(" {}", "x".repeat(60_000));
    let post_big = |n: usize| project.post_padded(n, &padding);
    let mut acked = Vec::new();
    let mut refused = 0;
    for n in 0..40 {
        match post_big(n) {
            200 => acked.push(n),
            500 => refused += 1,
            other => panic!("k{n}: {other}"),
        }
    }
    assert!(refused > 0, "the disk never filled");
    // Alive on the full disk: a redelivery is acknowledged (no write needed).
    assert_eq!(post_big(acked[0]), 200, "the service stopped taking events on a full disk");
    // SIGTERM on the full disk (its log lines fail): it drains and exits.
    project.stop(gdn);
    // Space is freed: the tmpfs grows.
    let grown = Command::new("mount")
        .args(["-o", "remount,size=64m"])
        .arg(&project.state)
        .status()
        .is_ok_and(|status| status.success());
    assert!(grown, "remount");
    let mut gdn = project.start(&[]);
    project.wait_listening(&mut gdn);
    // What was refused is delivered again; what waited runs now.
    for n in 0..40 {
        if !acked.contains(&n) {
            assert_eq!(post_big(n), 200, "k{n} refused after space was freed");
        }
    }
    project.wait_all_done(40);
    project.stop(gdn);
    let conversations = project.conversations();
    for n in 0..40 {
        let text = format!("event k{n} ");
        let inputs = conversations
            .iter()
            .flatten()
            .filter(|m| {
                m["data"]["role"] == "user" && m["data"]["content"].as_str().is_some_and(|c| c.starts_with(&text))
            })
            .count();
        assert_eq!(inputs, 1, "k{n} is in the conversations {inputs} times");
    }
    let (accepted, done) = project.inbox();
    assert_eq!(accepted.len(), 40);
    assert!(accepted.keys().all(|seq| done.get(seq) == Some(&1)), "{done:?}");
}
