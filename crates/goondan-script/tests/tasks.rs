//! Pending results a JavaScript tool completes later (`ctx.tasks`), kept in
//! a real task book, with a real JavaScript runtime: the fixture bundle
//! `tests/fixtures/script-tasks`. Each test skips with a printed reason when
//! no runtime is found, unless `GOONDAN_REQUIRE_JS=1`.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Kit, error, output, runtime_or_skip};
use goondan_core::{JsonValue, ToolResult, ToolStatus};
use goondan_runtime::tasks::TaskBook;
use goondan_script::ScriptHost;
use goondan_tools::tasks::{TaskState, TaskView};
use serde_json::json;

type TestResult = Result<(), Box<dyn std::error::Error>>;

struct Setup {
    kit: Kit,
    book: Arc<TaskBook>,
    _dir: tempfile::TempDir,
}

fn setup(test: &str) -> Result<Option<Setup>, Box<dyn std::error::Error>> {
    let Some(runtime) = runtime_or_skip(test) else { return Ok(None) };
    let dir = tempfile::tempdir()?;
    let book = Arc::new(TaskBook::open(dir.path())?);
    let mut kit = Kit::for_bundle(&fixture_dir(), ScriptHost::with_runtime(runtime), None);
    kit.tasks = Some(Arc::clone(&book) as Arc<dyn goondan_tools::tasks::ToolTasks>);
    Ok(Some(Setup { kit, book, _dir: dir }))
}

fn fixture_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/script-tasks")
}

/// The pending result's handle.
fn pending(result: &ToolResult) -> String {
    match (&result.status, &result.handle) {
        (ToolStatus::Pending, Some(handle)) => handle.clone(),
        _ => panic!("expected a pending result, got {result:?}"),
    }
}

/// The task as the book has it, without marking it received.
fn task(book: &TaskBook, handle: &str) -> TaskView {
    let Some(view) = book.tasks().into_iter().find(|t| t.handle == handle) else {
        panic!("the book has no task {handle}: {:?}", book.tasks())
    };
    view
}

/// Waits (up to 10 s) until the `events` tool lists an entry for `handle`
/// with the field `field`.
async fn event(kit: &Kit, handle: &str, field: &str) -> JsonValue {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let result = kit.call("ev", "jobs__events", json!({})).await;
        let found = output(&result)
            .as_array()
            .and_then(|events| events.iter().find(|e| e["handle"] == handle && !e[field].is_null()).cloned());
        if let Some(found) = found {
            return found;
        }
        assert!(Instant::now() < deadline, "no '{field}' event for {handle}: {}", output(&result));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_started_task_is_pending_then_completes_later_and_only_once() -> TestResult {
    let Some(Setup { kit, book, _dir }) = setup("ctx.tasks complete")? else { return Ok(()) };
    let started = Instant::now();
    let result = kit.call("c1", "jobs__later", json!({"text": "built", "ms": 200})).await;
    let handle = pending(&result);
    assert_eq!(result.output, Some(json!({"message": "started"})));
    assert_eq!(task(&book, &handle).state, TaskState::Working);
    assert_eq!((task(&book, &handle).tool.as_str(), task(&book, &handle).call_id.as_str()), ("jobs__later", "c1"));

    let ended = book.wait_for(&handle, Duration::from_secs(10)).await.map_err(|f| f.message)?;
    let took = started.elapsed();
    assert_eq!(ended.state, TaskState::Completed, "{ended:?}");
    let Some(done) = &ended.result else { panic!("no result: {ended:?}") };
    assert_eq!(done.output, Some(json!({"text": "built", "at": "later"})));
    assert!(took >= Duration::from_millis(200), "{took:?}");

    // The second complete() is refused, with the code on the JS error.
    let second = event(&kit, &handle, "second").await;
    assert_eq!(second["second"], "E_TASK_FINISHED", "{second}");
    assert!(second["message"].as_str().is_some_and(|m| m.contains("already ended")), "{second}");
    // The first end stands.
    assert_eq!(task(&book, &handle).result.and_then(|r| r.output), Some(json!({"text": "built", "at": "later"})));
    Ok(())
}

#[tokio::test]
async fn a_failed_task_ends_failed_with_the_message() -> TestResult {
    let Some(Setup { kit, book, _dir }) = setup("ctx.tasks fail")? else { return Ok(()) };
    let result = kit.call("c1", "jobs__failing", json!({"message": "the build broke", "ms": 100})).await;
    let handle = pending(&result);
    assert_eq!(result.output, None, "pending(task) without output has none");
    let ended = book.wait_for(&handle, Duration::from_secs(10)).await.map_err(|f| f.message)?;
    assert_eq!((ended.state, ended.reason.as_deref()), (TaskState::Failed, Some("the build broke")), "{ended:?}");
    Ok(())
}

#[tokio::test]
async fn a_cancel_aborts_the_signal_and_the_work_ends_it_cancelled() -> TestResult {
    let Some(Setup { kit, book, _dir }) = setup("ctx.tasks cancel")? else { return Ok(()) };
    let result = kit.call("c1", "jobs__abortable", json!({})).await;
    let handle = pending(&result);
    let started = Instant::now();
    let ended = book.cancel_task(&handle).await.map_err(|f| f.message)?;
    assert_eq!(ended.state, TaskState::Cancelled, "{ended:?}");
    assert_eq!(ended.reason.as_deref(), Some("cancelled: stopped on abort"), "the work's own end: {ended:?}");
    assert!(started.elapsed() < Duration::from_secs(4), "the work answered, no 5 s fallback: {:?}", started.elapsed());
    let aborted = event(&kit, &handle, "aborted").await;
    assert_eq!(aborted["aborted"], true);
    assert_eq!(aborted["reason"], format!("task {handle} was cancelled"));
    Ok(())
}

#[tokio::test]
async fn a_cancel_the_work_ignores_still_ends_the_task() -> TestResult {
    let Some(Setup { kit, book, _dir }) = setup("ctx.tasks ignored cancel")? else { return Ok(()) };
    let handle = pending(&kit.call("c1", "jobs__abortable", json!({"ignore": true})).await);
    let ended = book.cancel_task(&handle).await.map_err(|f| f.message)?;
    assert_eq!((ended.state, ended.reason.as_deref()), (TaskState::Cancelled, Some("cancelled")), "{ended:?}");
    assert_eq!(event(&kit, &handle, "aborted").await["aborted"], true);
    Ok(())
}

#[tokio::test]
async fn a_bare_async_handle_is_completed_later_by_handle() -> TestResult {
    let Some(Setup { kit, book, _dir }) = setup("__async complete")? else { return Ok(()) };
    // At once (racing the executor's adoption) and later.
    for (call, handle, ms) in [("c1", "build-now", 0), ("c2", "build-later", 200)] {
        let result = kit.call(call, "jobs__legacy", json!({"handle": handle, "text": handle, "ms": ms})).await;
        assert_eq!(pending(&result), handle);
        assert_eq!(result.output, Some(json!({"message": "queued"})));
        let ended = book.wait_for(handle, Duration::from_secs(10)).await.map_err(|f| f.message)?;
        assert_eq!(ended.state, TaskState::Completed, "{ended:?}");
        assert_eq!(ended.result.and_then(|r| r.output), Some(json!({"text": handle})));
        assert_eq!((ended.tool.as_str(), ended.call_id.as_str()), ("jobs__legacy", call));
        assert_eq!(event(&kit, handle, "completed").await["completed"], true);
    }
    // Straight to the handler, with no executor to adopt the handle: the
    // host records it when the result passes, so completing it still works.
    let module: Arc<Path> = Arc::from(fixture_dir().join("tools/jobs.ts"));
    let handler = goondan_script::ScriptToolHandler::new(Arc::clone(&kit.host), module, "legacy");
    let ctx = goondan_tools::ToolContext::new(kit.scope(Vec::new()), "jobs__legacy".into(), "d1");
    let input = serde_json::Map::from_iter([("handle".into(), json!("direct-1")), ("text".into(), json!("d"))]);
    let returned = goondan_tools::ToolHandler::call(&handler, &ctx, &input).await.map_err(|f| f.message)?;
    assert!(
        matches!(&returned, goondan_tools::ToolOutput::Pending { handle, .. } if handle == "direct-1"),
        "{returned:?}"
    );
    // Nothing adopted it at return: the book learns of it at its end.
    assert!(book.tasks().iter().all(|t| t.handle != "direct-1"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while book.tasks().iter().all(|t| t.handle != "direct-1") {
        assert!(Instant::now() < deadline, "direct-1 never reached the book");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ended = book.wait_for("direct-1", Duration::from_secs(10)).await.map_err(|f| f.message)?;
    assert_eq!((ended.state, ended.call_id.as_str()), (TaskState::Completed, "d1"), "{ended:?}");
    Ok(())
}

#[tokio::test]
async fn a_handle_the_host_never_saw_is_not_found() -> TestResult {
    let Some(Setup { kit, book, _dir }) = setup("ctx.tasks unknown handle")? else { return Ok(()) };
    // Even one the book knows: a script ends only its own tasks.
    let other = book.open_task("bash__exec", "x1", "turn-1").await.map_err(|f| f.message)?;
    for handle in ["no-such-task", other.handle.as_str()] {
        let result = kit.call("c1", "jobs__stray", json!({"handle": handle})).await;
        assert_eq!(output(&result)["code"], "E_TASK_NOT_FOUND", "{result:?}");
    }
    // Nor by returning another task's handle as its own `__async`.
    let result = kit.call("c2", "jobs__legacy", json!({"handle": other.handle, "text": "x", "ms": 0})).await;
    assert_eq!(pending(&result), other.handle);
    assert_eq!(event(&kit, &other.handle, "completed").await["completed"], "E_TASK_NOT_FOUND");
    assert_eq!(task(&book, &other.handle).state, TaskState::Working);
    Ok(())
}

#[tokio::test]
async fn without_a_task_keeper_start_is_refused() -> TestResult {
    let Some(Setup { mut kit, _dir, .. }) = setup("ctx.tasks unavailable")? else { return Ok(()) };
    kit.tasks = None;
    let result = kit.call("c1", "jobs__later", json!({"text": "x"})).await;
    let (code, message) = error(&result);
    assert_eq!(code, "E_TASK_UNAVAILABLE", "{message}");
    assert!(message.starts_with("ctx.tasks.start: E_TASK_UNAVAILABLE:"), "{message}");
    Ok(())
}

#[tokio::test]
async fn when_the_host_dies_its_working_tasks_fail() -> TestResult {
    let Some(Setup { kit, book, _dir }) = setup("ctx.tasks host death")? else { return Ok(()) };
    let started = pending(&kit.call("c1", "jobs__abortable", json!({"ignore": true})).await);
    let adopted =
        pending(&kit.call("c2", "jobs__legacy", json!({"handle": "slow-1", "text": "x", "ms": 600_000})).await);
    let done = pending(&kit.call("c3", "jobs__later", json!({"text": "quick", "ms": 0})).await);
    book.wait_for(&done, Duration::from_secs(10)).await.map_err(|f| f.message)?;

    let Some(pid) = kit.host.running_pid().await else { panic!("no host runs") };
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(pid)?), nix::sys::signal::Signal::SIGKILL)?;
    for handle in [&started, &adopted] {
        let ended = book.wait_for(handle, Duration::from_secs(10)).await.map_err(|f| f.message)?;
        assert_eq!(ended.state, TaskState::Failed, "{ended:?}");
        let reason = ended.reason.unwrap_or_default();
        assert!(reason.starts_with("E_SCRIPT_HOST_EXITED: the script host"), "{reason}");
        assert!(reason.contains("SIGKILL") && reason.contains("work was lost"), "{reason}");
    }
    assert_eq!(task(&book, &done).state, TaskState::Completed, "an ended task keeps its end");
    // The next call starts a new host, whose tasks work as before.
    let again = pending(&kit.call("c4", "jobs__later", json!({"text": "after", "ms": 10})).await);
    let ended = book.wait_for(&again, Duration::from_secs(10)).await.map_err(|f| f.message)?;
    assert_eq!(ended.state, TaskState::Completed, "{ended:?}");
    Ok(())
}
