//! A JavaScript tool's pending result (issue 23, `ctx.tasks`) through
//! `gdn run` as a user meets it: the tool starts a task, returns it pending,
//! and completes it after the call; the one-shot run waits, the end enters
//! the conversation as a turn of its own, and the task is recorded
//! completed with the script's output. Ctrl-C cancels a task the script
//! holds: its `signal` aborts, the script fails it, and it ends `cancelled`
//! with the script's reason — not the keeper's 5 s fallback.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use goondan_test_support::{Agent, Bundle, reply_text, reply_tools};
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TOOL: &str = r#"export const handlers = {
  build: async (ctx: any, input: { ms?: number }) => {
    const task = await ctx.tasks.start();
    setTimeout(() => void task.complete({ built: true, by: 'javascript' }), input.ms ?? 300);
    return ctx.tasks.pending(task, { message: 'building in JavaScript' });
  },
  hold: async (ctx: any) => {
    const task = await ctx.tasks.start();
    task.signal.addEventListener('abort', () => void task.fail('stopped by the signal'));
    return ctx.tasks.pending(task);
  },
};
"#;

/// Agent `worker` (Swarm `jobs`) with the JavaScript tool `jobs`
/// ([`TOOL`]), whose `build` and `hold` start tasks.
fn bundle(dir: &Path) -> Result<(), std::io::Error> {
    let calls = |input: &str, tool: &str, args: Value, answer: &str| json!({"inputContains": input, "replies": [reply_tools([(tool, args)]), reply_text(answer)]});
    let options = json!({
        "replies": [reply_text("noted")],
        "when": [
            {"inputContains": "tool_task_result", "replies": [reply_text("the js job ended")]},
            calls("start js work", "jobs__build", json!({"ms": 300}), "started"),
            calls("hold js work", "jobs__hold", json!({}), "holding"),
        ],
    });
    let exports = json!([
        {"name": "build", "description": "Builds in the background.",
         "parameters": {"type": "object", "properties": {"ms": {"type": "integer"}}}},
        {"name": "hold", "description": "Works until cancelled.", "parameters": {"type": "object", "properties": {}}},
    ]);
    Bundle::new()
        .scripted_model_as("m", "s", options)
        .agent(Agent::new("worker", "m").tool(json!({"kind": "Tool", "name": "jobs"})))
        .resource("Tool", "jobs", json!({"entry": "./tools/jobs.ts", "exports": exports}))
        .swarm("jobs", "worker", &["worker"])
        .file("tools/jobs.ts", TOOL)
        .write(dir)
}

fn gdn(dir: &Path, state: &Path) -> Command {
    common::gdn_bin().project(dir).state(state).command(std::iter::empty::<&str>())
}

fn instance_dir(state: &Path) -> PathBuf {
    state.join("workspaces").join("jobs").join("instances").join("worker@default")
}

/// The instance's task records, folded by handle.
fn tasks(state: &Path) -> Vec<Value> {
    common::tasks_by_handle(&instance_dir(state))
}

#[test]
fn a_js_tools_task_completes_after_the_call_and_its_end_runs_a_turn() -> TestResult {
    if !common::js_runtime_usable() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    bundle(dir.path())?;
    let output = gdn(dir.path(), &state).args(["run", "--input", "start js work"]).output()?;
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stderr.contains("waiting for 1 task(s) to end (task-"), "{stderr}");
    assert!(stdout.find("started") < stdout.find("the js job ended"), "{stdout}");
    let tasks = tasks(&state);
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    assert_eq!((tasks[0]["tool"].as_str(), tasks[0]["state"].as_str()), (Some("jobs__build"), Some("completed")));
    assert_eq!(tasks[0]["result"]["output"], serde_json::json!({"built": true, "by": "javascript"}));
    Ok(())
}

#[test]
fn ctrl_c_aborts_a_js_tasks_signal_and_the_script_ends_it_cancelled() -> TestResult {
    if !common::js_runtime_usable() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    bundle(dir.path())?;
    let child = gdn(dir.path(), &state)
        .args(["run", "--input", "hold js work"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !tasks(&state).first().is_some_and(|t| t["state"] == "working") {
        assert!(Instant::now() < deadline, "the task never opened");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Let the turn end and the run start waiting.
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    Command::new("kill").args(["-INT", &child.id().to_string()]).status()?;
    let output = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cancelled 1 task(s)"), "{stderr}");
    let task = &tasks(&state)[0];
    assert_eq!(task["state"], "cancelled", "{task}\n{stderr}");
    assert_eq!(task["reason"], "cancelled: stopped by the signal", "{task}");
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    Ok(())
}
