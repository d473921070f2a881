//! An instance's task book with many tasks on record (see
//! `docs/BENCHMARKS.md`, "Tasks"): how long opening it takes and how much
//! memory it holds with 10,000 finished and 1,000 working tasks — the
//! working ones failed at open, which rewrites the file — and what the
//! second open (nothing left working) costs; and one task's life (open,
//! finish, read) on the async path.

use std::io::Write as _;
use std::path::Path;

use divan::Bencher;
use goondan_core::ToolResult;
use goondan_runtime::tasks::{TASKS_FILE, TaskBook};
use goondan_tools::tasks::TaskEnd;
use serde_json::json;

#[global_allocator]
static ALLOC: divan::AllocProfiler = divan::AllocProfiler::system();

fn main() {
    divan::Divan::default().sample_count(20).config_with_args().main();
}

const FINISHED: usize = 10_000;
const WORKING: usize = 1_000;

/// A book of `FINISHED` ended (and received) and `WORKING` working tasks,
/// as lines, written the way the book writes them.
fn book_lines() -> Vec<u8> {
    let mut text = Vec::new();
    for n in 0..FINISHED + WORKING {
        let open = json!({"op": "open", "task": {
            "handle": format!("task-{n:08}"), "tool": "bash__exec", "callId": format!("call-{n}"),
            "turnId": "turn-1", "state": "working", "createdAt": 1_790_000_000_000u64 + n as u64,
            "updatedAt": 1_790_000_000_000u64 + n as u64, "expiresAt": 4_000_000_000_000u64, "received": false}});
        text.extend_from_slice(open.to_string().as_bytes());
        text.push(b'\n');
    }
    for n in 0..FINISHED {
        let end = json!({"op": "end", "handle": format!("task-{n:08}"), "state": "completed",
            "result": {"status": "ok", "output": {"exitCode": 0, "stdoutTail": "built\n", "stderrTail": ""}},
            "at": 1_790_000_100_000u64 + n as u64});
        text.extend_from_slice(end.to_string().as_bytes());
        text.push(b'\n');
        let received =
            json!({"op": "received", "handle": format!("task-{n:08}"), "at": 1_790_000_100_000u64 + n as u64});
        text.extend_from_slice(received.to_string().as_bytes());
        text.push(b'\n');
    }
    text
}

fn write_book(dir: &Path, lines: &[u8]) {
    let written = std::fs::File::create(dir.join(TASKS_FILE)).and_then(|mut file| file.write_all(lines));
    if let Err(error) = written {
        panic!("writing the book: {error}");
    }
}

/// The first open: 1,000 working tasks are failed, the file rewritten.
#[divan::bench]
fn open_failing_1000_of_11000(bencher: Bencher<'_, '_>) {
    let lines = book_lines();
    bencher
        .with_inputs(|| {
            let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
            write_book(dir.path(), &lines);
            dir
        })
        .bench_local_values(|dir| {
            let book = TaskBook::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
            divan::black_box(book.tasks().len());
            (book, dir)
        });
}

/// Later opens: nothing left working, nothing rewritten.
#[divan::bench]
fn open_11000_settled(bencher: Bencher<'_, '_>) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write_book(dir.path(), &book_lines());
    drop(TaskBook::open(dir.path()).unwrap_or_else(|e| panic!("{e}")));
    bencher.bench_local(|| {
        let book = TaskBook::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        divan::black_box(book.tasks().len());
        book
    });
}

/// One task's life on a book of 11,000: open (synced), finish (synced), status.
#[divan::bench]
fn one_task_open_finish_status(bencher: Bencher<'_, '_>) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write_book(dir.path(), &book_lines());
    let book = TaskBook::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
    let runtime = runtime.unwrap_or_else(|e| panic!("{e}"));
    bencher.bench_local(|| {
        runtime.block_on(async {
            let ticket = book.open_task("bash__exec", "call", "turn").await.unwrap_or_else(|f| panic!("{}", f.message));
            let end = TaskEnd::Completed(ToolResult::ok(json!({"exitCode": 0})));
            book.finish_task(&ticket.handle, end).await.unwrap_or_else(|f| panic!("{}", f.message));
            book.status_of(&ticket.handle).await.unwrap_or_else(|f| panic!("{}", f.message))
        })
    });
}
