//! A one-shot `gdn run --input …` whose entry agent ends its turn with
//! asynchronous `agents__request`s still out (issue 34, items 3 and 4):
//! their answers come as turns of their own and the run then exits —
//! also for 60 requests under `--max-agent-processes 8` — and while it
//! waits, `gdn task list|show|cancel` reach it as they reach a service.
//! Every wait has a deadline, so a hang fails the test instead of
//! hanging the suite.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use goondan_test_support::{Agent, Bundle, reply_text, reply_tools, when_input};
use serde_json::{Value, json};

mod common;
use common::service::{TestResult, gdn, until};

/// How long a run may take before the test calls it a hang.
const RUN_LIMIT: Duration = Duration::from_secs(90);

/// A coordinator that sends `agents__request {async: true}`s and ends its
/// turn; a worker that answers (after a second for `CASE:slow`, never
/// for `CASE:hang`). The coordinator's scripts: `CASE:three` (three
/// requests), `CASE:sixty` (sixty, on sixty instance keys), `CASE:hang`
/// (one the worker never answers); an answer's turn says "got an answer",
/// a task's end "the task ended".
fn bundle(dir: &Path, marks: &Path) -> std::io::Result<()> {
    let requests = |keys: &mut dyn Iterator<Item = String>, input: &str| {
        let calls: Vec<(&str, Value)> = keys
            .map(|key| {
                ("agents__request", json!({"target": "worker", "instanceKey": key, "input": input, "async": true}))
            })
            .collect();
        reply_tools(calls)
    };
    let coordinator = json!({
        "replies": [reply_text("nothing to do")],
        "when": [
            when_input("tool_task_result", [reply_text("the task ended")]),
            when_input("inter_agent_response", [reply_text("got an answer")]),
            when_input("CASE:three", [requests(&mut (1..=3).map(|n| format!("w{n}")), "CASE:slow"), reply_text("fanned out")]),
            when_input("CASE:sixty", [requests(&mut (1..=60).map(|n| format!("k{n}")), "CASE:quick"), reply_text("fanned out")]),
            when_input("CASE:hang", [requests(&mut std::iter::once("h1".to_owned()), "CASE:hang"), reply_text("asked the worker")]),
        ],
    });
    let shell = format!("echo $$ > '{}/worker-shell.pid'; exec sleep 300", marks.display());
    let worker = json!({
        "replies": [reply_text("worker: nothing to do")],
        "when": [
            when_input("CASE:quick", [reply_text("quick answer")]),
            when_input("CASE:slow", [reply_tools([("wait__seconds", json!({"seconds": 1}))]), reply_text("slow answer")]),
            when_input("CASE:hang", [reply_tools([("bash__exec", json!({"command": shell, "timeoutMs": 0}))]), reply_text("woke up")]),
        ],
    });
    let agent_ref = |name: &str| json!({"kind": "Agent", "name": name});
    Bundle::new()
        .scripted_model_as("coordinator-model", "coordinator", coordinator)
        .scripted_model_as("worker-model", "worker", worker)
        .agent(
            Agent::new("coordinator", "coordinator-model")
                .with("prompt", json!({"system": "Coordinate."}))
                .base_tool("agents"),
        )
        .agent(
            Agent::new("worker", "worker-model")
                .with("prompt", json!({"system": "Work."}))
                .base_tool("bash")
                .base_tool("wait"),
        )
        .resource(
            "Swarm",
            "asyncrun",
            json!({"entryAgent": agent_ref("coordinator"), "agents": [agent_ref("coordinator"), agent_ref("worker")]}),
        )
        .write(dir)
}

/// A project: its bundle, state root, and where the worker leaves marks.
struct Project {
    dir: tempfile::TempDir,
    state: PathBuf,
    marks: PathBuf,
}

impl Project {
    fn new() -> Result<Self, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let state = dir.path().join("state");
        // The project's working directory (where its commands may write).
        let marks = state.join("workspaces/asyncrun/workdir/marks");
        std::fs::create_dir_all(&marks)?;
        bundle(dir.path(), &marks)?;
        Ok(Self { dir, state, marks })
    }

    /// `gdn run ARGS` started in the background.
    fn start(&self, args: &[&str]) -> std::io::Result<Child> {
        Command::new(env!("CARGO_BIN_EXE_gdn"))
            .arg("-c")
            .arg(self.dir.path())
            .arg("run")
            .args(args)
            .env("GOONDAN_STATE_ROOT", &self.state)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
    }

    fn gdn(&self, args: &[&str]) -> std::io::Result<Output> {
        gdn(self.dir.path(), &self.state, args)
    }

    fn instance_dir(&self, name: &str) -> PathBuf {
        common::instance_path(&self.state, name)
    }

    /// The conversation of `coordinator@default`, each message as JSON.
    fn conversation(&self) -> Vec<Value> {
        common::service::conversation(&self.instance_dir("coordinator@default"))
            .iter()
            .filter_map(|text| serde_json::from_str(text).ok())
            .collect()
    }

    /// The coordinator's task records, folded by handle: (handle, state).
    fn tasks(&self) -> Vec<(String, String)> {
        let text =
            std::fs::read_to_string(self.instance_dir("coordinator@default").join("tasks.jsonl")).unwrap_or_default();
        let mut tasks: Vec<(String, String)> = Vec::new();
        for line in text.lines() {
            let Ok(record) = serde_json::from_str::<Value>(line) else { continue };
            let handle = record["task"]["handle"].as_str().or(record["handle"].as_str()).unwrap_or_default();
            match record["op"].as_str() {
                Some("open") => tasks.push((handle.to_owned(), "working".to_owned())),
                Some("end") => {
                    if let Some(task) = tasks.iter_mut().find(|(h, _)| h == handle) {
                        task.1 = record["state"].as_str().unwrap_or_default().to_owned();
                    }
                }
                _ => {}
            }
        }
        tasks
    }
}

/// Waits for `child` up to [`RUN_LIMIT`]; kills it and fails (with what
/// it printed) if it runs longer.
fn finished(mut child: Child) -> Result<Output, Box<dyn std::error::Error>> {
    let deadline = Instant::now() + RUN_LIMIT;
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output()?;
            return Err(format!(
                "gdn run still runs after {RUN_LIMIT:?}:\n{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(child.wait_with_output()?)
}

/// The answers (`inter_agent_response` messages) in a conversation.
fn answers(conversation: &[Value]) -> Vec<&Value> {
    conversation.iter().filter(|m| m["metadata"]["__goondanInterAgentResponse"].is_object()).collect()
}

#[test]
fn a_one_shot_run_delivers_async_answers_that_come_after_its_turn_and_exits() -> TestResult {
    let project = Project::new()?;
    let output = finished(project.start(&["--input", "CASE:three"])?)?;
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    // The turn ended with the requests out, and their answers' turns followed.
    assert!(stdout.contains("fanned out") && stdout.contains("got an answer"), "{stdout}{stderr}");
    assert!(stdout.find("fanned out") < stdout.find("got an answer"), "{stdout}");
    let conversation = project.conversation();
    let answered = answers(&conversation);
    assert_eq!(answered.len(), 3, "{conversation:#?}");
    for answer in &answered {
        let content: Value = serde_json::from_str(answer["data"]["content"].as_str().unwrap_or_default())?;
        assert_eq!((content["status"].as_str(), content["response"].as_str()), (Some("ok"), Some("slow answer")));
    }
    // The conversation ends with the last answer's turn.
    let last = conversation.last().ok_or("an empty conversation")?;
    assert_eq!(last["data"]["content"], "got an answer", "{conversation:#?}");
    let tasks = project.tasks();
    assert_eq!(tasks.len(), 3, "{tasks:?}");
    assert!(tasks.iter().all(|(_, state)| state == "completed"), "{tasks:?}");
    Ok(())
}

#[test]
fn sixty_async_requests_under_eight_agent_processes_are_all_answered_and_the_run_exits() -> TestResult {
    let project = Project::new()?;
    let output = finished(project.start(&["--max-agent-processes", "8", "--input", "CASE:sixty"])?)?;
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("got an answer"), "{stdout}{stderr}");
    let conversation = project.conversation();
    let keys: std::collections::BTreeSet<String> = answers(&conversation)
        .iter()
        .filter_map(|m| serde_json::from_str::<Value>(m["data"]["content"].as_str()?).ok())
        .filter(|content| content["status"] == "ok")
        .filter_map(|content| content["requestId"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(keys.len(), 60, "{} answers: {stderr}", keys.len());
    // Every answer had its turn before the run exited: none came after the last.
    let last = conversation.last().ok_or("an empty conversation")?;
    assert_eq!(last["data"]["content"], "got an answer", "{last}");
    assert!(stdout.ends_with("got an answer\n"), "{:?}", &stdout[stdout.len().saturating_sub(60)..]);
    let tasks = project.tasks();
    assert_eq!(tasks.len(), 60);
    assert!(tasks.iter().all(|(_, state)| state == "completed"), "{tasks:?}");
    Ok(())
}

#[test]
fn a_waiting_one_shot_run_shows_its_task_running_and_takes_its_cancel() -> TestResult {
    let project = Project::new()?;
    let child = project.start(&["--input", "CASE:hang"])?;
    // Kills the run if the test fails before it ends.
    struct Reaped(Option<Child>);
    impl Drop for Reaped {
        fn drop(&mut self) {
            if let Some(mut child) = self.0.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
    let mut run = Reaped(Some(child));
    until("the worker's command", || Ok(project.marks.join("worker-shell.pid").exists()))?;
    until("the coordinator's turn to end", || {
        Ok(project.conversation().iter().any(|m| m["data"]["content"] == "asked the worker"))
    })?;
    let handle = match project.tasks().as_slice() {
        [(handle, state)] if state == "working" => handle.clone(),
        other => return Err(format!("not one working task: {other:?}").into()),
    };

    let listed = project.gdn(&["task", "list"])?;
    let list = String::from_utf8_lossy(&listed.stdout);
    let row = list.lines().find(|line| line.starts_with(&handle)).ok_or_else(|| format!("not listed: {list}"))?;
    assert!(row.contains("coordinator@default") && row.contains("working"), "{list}");
    let shown = project.gdn(&["task", "show", &handle])?;
    let show = String::from_utf8_lossy(&shown.stdout);
    assert!(show.contains("working") && !show.contains("no process runs"), "{show}");

    let cancelled = project.gdn(&["task", "cancel", &handle, "--wait-secs", "30"])?;
    let (said, why) = (String::from_utf8_lossy(&cancelled.stdout), String::from_utf8_lossy(&cancelled.stderr));
    assert_eq!(cancelled.status.code(), Some(0), "{said}{why}");
    assert!(said.contains(&format!("task {handle} cancelled")), "{said}{why}");

    // The cancel's end is the run's last task: its turn runs, and the run exits.
    let output = finished(run.0.take().ok_or("no run")?)?;
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("asked the worker") && stdout.contains("the task ended"), "{stdout}{stderr}");
    assert_eq!(project.tasks(), [(handle.clone(), "cancelled".to_owned())]);

    // With nothing running any more, a cancel says what it checked.
    let again = project.gdn(&["task", "cancel", &handle])?;
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("has already ended (cancelled)"));
    Ok(())
}

#[test]
fn a_cancel_with_nothing_running_claims_nothing_it_did_not_check() -> TestResult {
    let project = Project::new()?;
    let mut child = project.start(&["--input", "CASE:hang"])?;
    let waited = until("the coordinator's turn to end", || {
        Ok(project.conversation().iter().any(|m| m["data"]["content"] == "asked the worker"))
    });
    // The run dies with its task working (a kill -9: nothing cleans up).
    let _ = child.kill();
    let _ = child.wait();
    waited?;
    let handle = project.tasks().first().map(|(handle, _)| handle.clone()).ok_or("no task")?;
    let cancelled = project.gdn(&["task", "cancel", &handle])?;
    let said = String::from_utf8_lossy(&cancelled.stderr);
    assert_eq!(cancelled.status.code(), Some(1), "{said}");
    assert!(said.contains("no service and no gdn run of this project"), "{said}");
    assert!(!said.contains("has ended") && !said.contains("is failed"), "{said}");
    Ok(())
}
