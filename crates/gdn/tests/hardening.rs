//! The edges of `gdn` held against a hostile process of the same user or
//! peer: its memory and environment (where the model keys are) cannot be
//! read, and `gdn mcp serve` answers a request over its size limit.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

mod common;
use common::repo_path as repo;

/// The user tests run processes as when they run as root, so that the
/// process under test and its prober are one ordinary user.
const NOBODY: u32 = 65534;

fn as_user(command: &mut Command, root: bool) -> &mut Command {
    if root { command.uid(NOBODY).gid(NOBODY) } else { command }
}

/// Starts `gdn mcp serve` (stdio) on the base-tools fixture and waits for
/// its answer to `initialize`, so that it is running `gdn`, set up.
fn running_gdn(state: &std::path::Path, root: bool) -> Child {
    let (child, stdin, stdout) = serving_gdn(state, root);
    // Keep stdin open: the server runs until it closes.
    std::mem::forget(stdin);
    drop(stdout);
    child
}

/// `gdn mcp serve` (stdio) after the handshake, with its standard input and output.
fn serving_gdn(
    state: &std::path::Path,
    root: bool,
) -> (Child, std::process::ChildStdin, BufReader<std::process::ChildStdout>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gdn"));
    command
        .arg("--state-root")
        .arg(state)
        .arg("-c")
        .arg(repo("tests/fixtures/base-tools"))
        .args(["mcp", "serve"])
        .env("HOME", state)
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = as_user(&mut command, root).spawn().unwrap_or_else(|e| panic!("spawn gdn: {e}"));
    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"probe","version":"1"}}}"#;
    let mut stdin = child.stdin.take().unwrap_or_else(|| panic!("stdin"));
    writeln!(stdin, "{initialize}").unwrap_or_else(|e| panic!("write: {e}"));
    let mut line = String::new();
    let mut stdout = BufReader::new(child.stdout.take().unwrap_or_else(|| panic!("stdout")));
    stdout.read_line(&mut line).unwrap_or_else(|e| panic!("read: {e}"));
    assert!(line.contains("\"id\":1"), "{line}");
    writeln!(stdin, r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#).unwrap_or_else(|e| panic!("{e}"));
    (child, stdin, stdout)
}

/// Whether a process of the test's user (or of NOBODY, under root) can read `path`.
fn readable_by_same_user(path: &str, root: bool) -> bool {
    if root {
        let mut command = Command::new("cat");
        command.arg(path).stdout(Stdio::null()).stderr(Stdio::null());
        as_user(&mut command, root).status().is_ok_and(|status| status.success())
    } else {
        std::fs::read(path).is_ok()
    }
}

#[test]
fn another_process_of_the_same_user_cannot_read_gdns_environment_or_memory() {
    // The owner of /proc/self is our effective user.
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o777)).unwrap_or_else(|e| panic!("{e}"));

    // The probe works: an ordinary process of that user is readable.
    let mut sleeper = Command::new("sleep");
    sleeper.arg("30");
    let mut sleeper = as_user(&mut sleeper, root).spawn().unwrap_or_else(|e| panic!("spawn sleep: {e}"));
    let readable = readable_by_same_user(&format!("/proc/{}/environ", sleeper.id()), root);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(readable, "the probe cannot read an ordinary process: it proves nothing");

    let mut gdn = running_gdn(state.path(), root);
    let pid = gdn.id();
    let environ = format!("/proc/{pid}/environ");
    let owner = std::fs::metadata(&environ).map(|m| m.uid());
    let environ_readable = readable_by_same_user(&environ, root);
    let mem_readable = readable_by_same_user(&format!("/proc/{pid}/mem"), root);
    let _ = gdn.kill();
    let _ = gdn.wait();
    assert_eq!(owner.ok(), Some(0), "a non-dumpable process's /proc files belong to root");
    assert!(!environ_readable, "/proc/{pid}/environ was readable");
    assert!(!mem_readable, "/proc/{pid}/mem was readable");
}

/// A 64 MiB request to `gdn mcp serve` over stdio is answered at once with
/// a JSON-RPC error naming the limit, and the server goes on serving.
#[test]
fn a_request_over_the_limit_is_answered_with_an_error_and_serving_goes_on() {
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (mut gdn, mut stdin, mut stdout) = serving_gdn(state.path(), false);
    let pad = "a".repeat(64 * 1024 * 1024);
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"json-query__query","arguments":{{"pad":"{pad}"}}}}}}"#
    );
    let started = std::time::Instant::now();
    let writer = std::thread::spawn(move || {
        let written = stdin.write_all(huge.as_bytes()).and_then(|()| stdin.write_all(b"\n"));
        let listed = writeln!(stdin, r#"{{"jsonrpc":"2.0","id":3,"method":"tools/list"}}"#);
        (stdin, written.and(listed))
    });
    let read = |stdout: &mut BufReader<std::process::ChildStdout>| {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap_or_else(|e| panic!("read: {e}"));
        serde_json::from_str::<serde_json::Value>(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    };
    let answer = read(&mut stdout);
    assert_eq!(answer["id"], 2, "{answer}");
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("limit of 16777216 bytes (16 MiB)"), "{message}");
    let listed = read(&mut stdout);
    assert_eq!(listed["id"], 3, "{listed}");
    assert!(listed["result"]["tools"].as_array().is_some_and(|tools| !tools.is_empty()), "{listed}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30), "{:?}", started.elapsed());
    let (stdin, written) = writer.join().unwrap_or_else(|_| panic!("writer"));
    assert!(written.is_ok(), "{written:?}");
    drop(stdin);
    let status = gdn.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "{status}");
}

/// Whether `pid` still runs (a zombie has ended: it only waits to be reaped).
fn runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()))
        .is_some_and(|state| state != 'Z')
}

/// A script tool's detached child that ignores SIGHUP and SIGTERM ends
/// with the `gdn tool call` that started it, every time.
#[test]
fn a_script_tools_detached_child_never_outlives_gdn_tool_call() {
    if !common::js_runtime_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut survivors = Vec::new();
    for run in 0..10 {
        let pid_file = dir.path().join(format!("child-{run}.pid"));
        let args = serde_json::json!({"pidFile": pid_file}).to_string();
        let output = Command::new(env!("CARGO_BIN_EXE_gdn"))
            .arg("--state-root")
            .arg(dir.path())
            .arg("-c")
            .arg(repo("tests/fixtures/script-detached"))
            .args(["--json", "tool", "call", "detach__run", "--args", &args, "--workdir"])
            .arg(dir.path())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("spawn gdn: {e}"));
        let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!("{e}: {} / {}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
        });
        let pid = result["output"]["pid"].as_u64().and_then(|pid| u32::try_from(pid).ok());
        let pid = pid.unwrap_or_else(|| panic!("no pid in {result}"));
        // gdn has exited: its tool's processes must be gone already.
        if runs(pid) {
            survivors.push((run, pid));
        }
    }
    for (_, pid) in &survivors {
        if let Ok(pid) = i32::try_from(*pid) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
    assert!(survivors.is_empty(), "detached children outlived gdn (run, pid): {survivors:?}");
}
