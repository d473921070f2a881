//! `file-system` against a directory that is swapped for a symbolic link to
//! an outside directory while calls run (a check-then-use race): no read,
//! write, append, listing or mkdir may ever reach the outside directory.
//!
//! The swapping thread renames a real directory and a link in and out of
//! the name `flip` as fast as it can; each call resolves `flip/...` while it
//! is one or the other, and may use it a moment later when it is the other.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use goondan_base::BaseSettings;
use goondan_core::{JsonObject, JsonValue};
use goondan_test_support::{call_scope, tool_context};
use goondan_tools::{HandlerResult, ToolContext, ToolOutput};
use nix::fcntl::{RenameFlags, renameat2};
use serde_json::json;

/// How many calls of each kind race the swapping thread.
const ROUNDS: usize = 300;

fn context(workdir: &Path, tool: &str) -> ToolContext {
    tool_context(call_scope("racer", "race", workdir), tool)
}

async fn call(workdir: &Path, export: &str, input: JsonValue) -> HandlerResult {
    let settings = Arc::new(BaseSettings::default());
    let Some(handler) = goondan_base::native_handler("file-system", export, &settings) else {
        panic!("no file-system handler for {export}")
    };
    let JsonValue::Object(input) = input else { panic!("input must be an object") };
    let input: JsonObject = input;
    handler.call(&context(workdir, &format!("file-system__{export}")), &input).await
}

fn real_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let path = fs::canonicalize(dir.path()).unwrap_or_else(|e| panic!("canonicalize: {e}"));
    (dir, path)
}

/// Everything in `dir` (recursively), as paths relative to it.
fn contents(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        let Ok(entries) = fs::read_dir(&current) else { continue };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path.clone());
            }
            found.push(path.strip_prefix(dir).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default());
        }
    }
    found.sort();
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_swapped_for_a_link_never_leads_outside() {
    let (_root_dir, root) = real_dir();
    let (_outside_dir, outside) = real_dir();
    fs::write(outside.join("data.txt"), "SECRET").unwrap_or_else(|e| panic!("{e}"));
    fs::write(outside.join("outside-only.txt"), "x").unwrap_or_else(|e| panic!("{e}"));
    let outside_before = contents(&outside);
    // `flip` is a real directory and `parked` a link to the outside
    // directory; the swapper exchanges the two names atomically, so `flip`
    // always exists and is one or the other.
    fs::create_dir(root.join("flip")).unwrap_or_else(|e| panic!("{e}"));
    fs::write(root.join("flip/data.txt"), "inside").unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink(&outside, root.join("parked")).unwrap_or_else(|e| panic!("{e}"));

    let stop = Arc::new(AtomicBool::new(false));
    let flips = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, flips) = (Arc::clone(&stop), Arc::clone(&flips));
        let root_fd = fs::File::open(&root).unwrap_or_else(|e| panic!("{e}"));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let exchanged = renameat2(&root_fd, "flip", &root_fd, "parked", RenameFlags::RENAME_EXCHANGE);
                exchanged.unwrap_or_else(|e| panic!("renameat2: {e}"));
                flips.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    let (mut reads_inside, mut reads_outside, mut listed_outside, mut writes_ok) = (0, 0, 0, 0);
    for round in 0..ROUNDS {
        if let Ok(ToolOutput::Value(output)) = call(&root, "read", json!({"path": "flip/data.txt"})).await {
            match output["content"].as_str() {
                Some("SECRET") => reads_outside += 1,
                _ => reads_inside += 1,
            }
        }
        let written = call(&root, "write", json!({"path": format!("flip/w{round}.txt"), "content": "x"})).await;
        writes_ok += usize::from(written.is_ok());
        let appended = json!({"path": format!("flip/a{round}.log"), "content": "x", "append": true});
        writes_ok += usize::from(call(&root, "write", appended).await.is_ok());
        let _ = call(&root, "mkdir", json!({"path": format!("flip/m{round}")})).await;
        if let Ok(ToolOutput::Value(output)) = call(&root, "list", json!({"path": "flip", "recursive": true})).await
            && output.to_string().contains("outside-only.txt")
        {
            listed_outside += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap_or_else(|_| panic!("the swapping thread panicked"));

    let outside_after = contents(&outside);
    let created_outside: Vec<&String> = outside_after.iter().filter(|p| !outside_before.contains(p)).collect();
    let secret = fs::read_to_string(outside.join("data.txt")).unwrap_or_default();
    assert!(flips.load(Ordering::Relaxed) > 0, "the swapper never ran");
    assert_eq!(
        (reads_outside, listed_outside, created_outside.len(), secret.as_str()),
        (0, 0, 0, "SECRET"),
        "escapes: {reads_outside} reads and {listed_outside} listings saw the outside directory; created there: \
         {created_outside:?} (inside reads: {reads_inside}, successful writes: {writes_ok})"
    );
}
