//! Pending results that complete (issue 23), through a running service as
//! a user's agent meets them: `bash__exec` with `background: true` answers
//! `pending` with a handle, and the command's end enters the conversation
//! as a message naming the handle and the tool — as a turn of its own when
//! the instance is idle — exactly once; `tasks__wait` takes the result
//! instead (and no message follows); `tasks__cancel` ends the command and
//! says with which signal; a task whose command died with a `kill -9`ed
//! service is failed, and that failure delivered, at the next start.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use goondan_test_support::{Agent, Bundle, reply_text, reply_tools, when_input};
use serde_json::{Value, json};

mod common;
use common::service::jobs::{count, instance_dir, post, texts};
use common::service::{TestResult, detach, free_port, gdn, until};

/// The project's working directory under `state` (the swarm `jobs`):
/// where its commands may write.
fn workdir_of(state: &Path) -> PathBuf {
    state.join("workspaces/jobs/workdir")
}

fn bundle(dir: &Path, port: u16, marks: &Path) -> Result<(), std::io::Error> {
    let m = marks.display();
    let handle = "{{lastHandle}}";
    let options = json!({
        "replies": [reply_text("noted")],
        "when": [
            when_input("tool_task_result", [reply_text("the command finished")]),
            when_input("start work", [
                reply_tools([("bash__exec", json!({"command": "sleep 1; echo built; echo warned >&2", "background": true}))]),
                reply_text("started"),
            ]),
            when_input("wait for it", [
                reply_tools([("bash__exec", json!({"command": "sleep 0.5; echo waited", "background": true}))]),
                reply_tools([("tasks__wait", json!({"handle": handle, "timeoutMs": 20000}))]),
                reply_text("waited"),
            ]),
            when_input("cancel it", [
                reply_tools([("bash__exec", json!({"command": format!("echo $$ > '{m}/cancelled.pid'; exec sleep 60"), "background": true}))]),
                reply_tools([("tasks__wait", json!({"handle": handle, "timeoutMs": 300}))]),
                reply_tools([("tasks__cancel", json!({"handle": handle}))]),
                reply_text("cancelled"),
            ]),
            when_input("long one", [
                reply_tools([("bash__exec", json!({"command": format!("echo $$ > '{m}/long.pid'; exec sleep 60"), "background": true}))]),
                reply_text("running"),
            ]),
        ],
    });
    Bundle::new()
        .scripted_model_as("m", "s", options)
        .one_agent("jobs", Agent::new("worker", "m").base_tool("bash").base_tool("tasks"))
        .webhook("hook", port, json!([]))
        .write(dir)
}

/// A project in a new directory, its state root and the directory its
/// commands write marks to (created): the bundle fed by the webhook on
/// `port`, or with none (`gdn run --input` runs one turn).
fn project(port: Option<u16>) -> Result<(tempfile::TempDir, PathBuf, PathBuf), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let marks = workdir_of(&state).join("marks");
    std::fs::create_dir_all(&marks)?;
    match port {
        Some(port) => bundle(dir.path(), port, &marks)?,
        None => one_shot_bundle(dir.path(), &marks)?,
    }
    Ok((dir, state, marks))
}

/// The instance's task records, folded by handle.
fn tasks(state: &Path, key: &str) -> Vec<Value> {
    common::tasks_by_handle(&instance_dir(state, key))
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().next()) != Some("Z"))
}

#[test]
fn a_background_command_answers_pending_and_its_end_arrives_once_as_a_turn_of_its_own() -> TestResult {
    let port = free_port()?;
    let (dir, state, _) = project(Some(port))?;
    let _running = detach(dir.path(), &state)?;

    assert!(post(port, "a", "start work")?.starts_with("HTTP/1.1 200"));
    until("the completion turn's answer", || Ok(count(&state, "a", "the command finished") == 1))?;
    let all = texts(&state, "a");
    // The call's own result was pending, with the handle.
    let pending = all.iter().find(|m| m.contains("\"status\":\"pending\"")).ok_or("no pending result")?;
    let task = tasks(&state, "a").into_iter().next().ok_or("no task recorded")?;
    let handle = task["handle"].as_str().ok_or("no handle")?.to_owned();
    assert!(pending.contains(&handle), "{pending}");
    // Then, after the turn answered "started", the completion as a turn's input.
    let order: Vec<usize> = ["started", "tool_task_result", "the command finished"]
        .iter()
        .map(|needle| all.iter().position(|m| m.contains(needle)).unwrap_or(usize::MAX))
        .collect();
    assert!(order[0] < order[1] && order[1] < order[2], "{order:?}\n{all:#?}");
    let completion = &all[order[1]];
    assert!(completion.contains(&handle) && completion.contains("bash__exec"), "{completion}");
    assert!(completion.contains("built") && completion.contains("\\\"exitCode\\\":0"), "{completion}");
    // The task: completed, its end received through the conversation, its output on disk.
    assert_eq!(task["state"], "completed", "{task}");
    let output_path = task["result"]["output"]["outputPath"].as_str().ok_or("no output path")?.to_owned();
    let output = std::fs::read_to_string(&output_path)?;
    assert!(output.contains("built") && output.contains("warned"), "{output}");
    until("the delivery to be recorded", || Ok(tasks(&state, "a")[0]["received"] == true))?;
    // Exactly once, even after a while and a restart of the service.
    std::thread::sleep(Duration::from_millis(500));
    let restarted = gdn(dir.path(), &state, &["restart"])?;
    assert_eq!(restarted.status.code(), Some(0), "{}", String::from_utf8_lossy(&restarted.stderr));
    assert!(post(port, "a", "anything else")?.starts_with("HTTP/1.1 200"));
    until("the next turn", || Ok(count(&state, "a", "noted") >= 1))?;
    assert_eq!(count(&state, "a", "tool_task_result"), 1, "{:#?}", texts(&state, "a"));
    Ok(())
}

#[test]
fn a_wait_takes_the_result_and_a_cancel_ends_the_command_with_its_signal() -> TestResult {
    let port = free_port()?;
    let (dir, state, marks) = project(Some(port))?;
    let _running = detach(dir.path(), &state)?;

    assert!(post(port, "w", "wait for it")?.starts_with("HTTP/1.1 200"));
    until("the waited turn's answer", || Ok(count(&state, "w", "\"waited\"") >= 1))?;
    let waited =
        texts(&state, "w").into_iter().find(|m| m.contains("tasks__wait") && m.contains("\"state\":\"completed\""));
    assert!(waited.is_some_and(|m| m.contains("waited\\n")), "{:#?}", texts(&state, "w"));
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(count(&state, "w", "tool_task_result"), 0, "delivered again after the wait: {:#?}", texts(&state, "w"));
    assert_eq!(tasks(&state, "w")[0]["received"], true);

    assert!(post(port, "c", "cancel it")?.starts_with("HTTP/1.1 200"));
    until("the cancelled turn's answer", || Ok(count(&state, "c", "\"cancelled\"") >= 1))?;
    let all = texts(&state, "c");
    assert!(all.iter().any(|m| m.contains("E_TASK_WAIT_TIMEOUT")), "the short wait timed out: {all:#?}");
    let cancel = all.iter().find(|m| m.contains("tasks__cancel") && m.contains("\"state\":\"cancelled\""));
    assert!(cancel.is_some_and(|m| m.contains("SIGTERM")), "{all:#?}");
    let pid: i32 = std::fs::read_to_string(marks.join("cancelled.pid"))?.trim().parse()?;
    until("the cancelled command to be gone", || Ok(!alive(pid)))?;
    // A second cancel of the ended task: a structured error, nothing changed.
    let task = tasks(&state, "c").into_iter().next().ok_or("no task")?;
    assert_eq!(task["state"], "cancelled");
    assert!(task["reason"].as_str().is_some_and(|r| r.contains("SIGTERM")), "{task}");
    Ok(())
}

#[test]
fn a_command_killed_with_its_service_is_failed_and_delivered_at_the_next_start() -> TestResult {
    let port = free_port()?;
    let (dir, state, marks) = project(Some(port))?;
    let _running = detach(dir.path(), &state)?;
    assert!(post(port, "k", "long one")?.starts_with("HTTP/1.1 200"));
    until("the long command to start", || Ok(marks.join("long.pid").exists()))?;
    until("the turn to answer", || Ok(count(&state, "k", "\"running\"") >= 1))?;
    let command: i32 = std::fs::read_to_string(marks.join("long.pid"))?.trim().parse()?;
    let status: Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("workspaces").join("jobs").join("service.json"))?)?;
    let service = status["pid"].as_i64().ok_or("no pid")?;
    // kill -9: nothing it started outlives it.
    Command::new("kill").args(["-9", &service.to_string()]).status()?;
    until("the background command to end with its owner", || Ok(!alive(command)))?;
    assert_eq!(tasks(&state, "k")[0]["state"], "working", "nobody was left to record its end");

    // The next start fails the task, and delivers that failure as a turn.
    let _restarted = detach(dir.path(), &state)?;
    until("the failure's turn", || Ok(count(&state, "k", "the command finished") == 1))?;
    let task = tasks(&state, "k").into_iter().next().ok_or("no task")?;
    assert_eq!(task["state"], "failed", "{task}");
    assert!(task["reason"].as_str().is_some_and(|r| r.contains("ended with the process")), "{task}");
    let completion = texts(&state, "k").into_iter().find(|m| m.contains("tool_task_result")).ok_or("no completion")?;
    assert!(completion.contains("\\\"state\\\":\\\"failed\\\""), "{completion}");
    Ok(())
}

#[test]
fn people_list_show_and_cancel_tasks_through_the_cli() -> TestResult {
    let port = free_port()?;
    let (dir, state, marks) = project(Some(port))?;
    let _running = detach(dir.path(), &state)?;
    assert!(post(port, "p", "long one")?.starts_with("HTTP/1.1 200"));
    until("the long command to start", || Ok(marks.join("long.pid").exists()))?;
    let handle = tasks(&state, "p").first().and_then(|t| t["handle"].as_str().map(str::to_owned)).ok_or("no task")?;

    let listed = gdn(dir.path(), &state, &["task", "list"])?;
    let text = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert_eq!(listed.status.code(), Some(0), "{text}");
    assert!(text.starts_with("HANDLE") && text.contains(&handle) && text.contains("worker@p"), "{text}");
    assert!(text.lines().any(|l| l.contains(&handle) && l.contains("bash__exec") && l.contains("working")), "{text}");
    let shown = gdn(dir.path(), &state, &["--json", "task", "show", &handle])?;
    let shown: Value = serde_json::from_slice(&shown.stdout)?;
    assert_eq!((shown["state"].as_str(), shown["instanceKey"].as_str()), (Some("working"), Some("p")), "{shown}");

    let cancelled = gdn(dir.path(), &state, &["task", "cancel", &handle])?;
    let said = String::from_utf8_lossy(&cancelled.stdout).into_owned();
    assert_eq!(cancelled.status.code(), Some(0), "{said}{}", String::from_utf8_lossy(&cancelled.stderr));
    assert!(said.contains(&format!("task {handle} cancelled")) && said.contains("SIGTERM"), "{said}");
    let pid: i32 = std::fs::read_to_string(marks.join("long.pid"))?.trim().parse()?;
    until("the command to be gone", || Ok(!alive(pid)))?;
    // The agent hears of it, once.
    until("the cancel's turn", || Ok(count(&state, "p", "the command finished") == 1))?;

    let again = gdn(dir.path(), &state, &["task", "cancel", &handle])?;
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("has already ended (cancelled)"));
    let unknown = gdn(dir.path(), &state, &["task", "show", "task-nope"])?;
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no task 'task-nope'"));
    Ok(())
}

/// The bundle without its Connection: `gdn run --input` runs one turn.
fn one_shot_bundle(dir: &Path, marks: &Path) -> Result<(), Box<dyn std::error::Error>> {
    bundle(dir, 1, marks)?;
    let file = dir.join("goondan.yaml");
    let text = std::fs::read_to_string(&file)?;
    let cut = text.find("---\napiVersion: goondan.ai/v1\nkind: Connection").ok_or("no Connection")?;
    std::fs::write(&file, &text[..cut])?;
    Ok(())
}

#[test]
fn a_one_shot_run_waits_for_its_tasks_and_runs_their_turns_before_it_exits() -> TestResult {
    let (dir, state, _) = project(None)?;
    let output = gdn(dir.path(), &state, &["run", "--input", "start work"])?;
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stderr.contains("waiting for 1 task(s) to end (task-"), "{stderr}");
    assert!(stdout.contains("started") && stdout.contains("the command finished"), "{stdout}");
    assert!(stdout.find("started") < stdout.find("the command finished"), "{stdout}");
    assert_eq!(tasks(&state, "default")[0]["state"], "completed");
    Ok(())
}

#[test]
fn ctrl_c_while_a_one_shot_run_waits_cancels_its_tasks_and_says_so() -> TestResult {
    let (dir, state, marks) = project(None)?;
    let child = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .arg("-c")
        .arg(dir.path())
        .args(["run", "--input", "long one"])
        .env("GOONDAN_STATE_ROOT", &state)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    until("the long command to start", || Ok(marks.join("long.pid").exists()))?;
    let command: i32 = std::fs::read_to_string(marks.join("long.pid"))?.trim().parse()?;
    // Waiting now (the turn answered "running"): Ctrl-C.
    until("the wait", || Ok(count(&state, "default", "\"running\"") >= 1))?;
    std::thread::sleep(Duration::from_millis(300));
    Command::new("kill").args(["-INT", &child.id().to_string()]).status()?;
    let output = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cancelled 1 task(s)"), "{stderr}");
    until("the command to be gone", || Ok(!alive(command)))?;
    assert_eq!(tasks(&state, "default")[0]["state"], "cancelled", "{stderr}");
    Ok(())
}
