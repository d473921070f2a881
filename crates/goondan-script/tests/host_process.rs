//! The host process's lifecycle against the real runtime: its private
//! directory (0700 whatever the umask, swept when stale, removed when done)
//! and its reaping (no zombie after it is killed, nor after the runtime
//! that ran it shuts down). One test: it sets the process umask.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::time::{Duration, Instant};

use common::{Kit, output, runtime_or_skip};
use goondan_script::ScriptHost;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

/// The state letter of `pid` in `/proc/<pid>/stat`, or `None` once it is gone (reaped).
fn state_of(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next())
}

/// The pids of this process's children (every thread's).
fn children() -> Vec<u32> {
    let mut pids = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let listed = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        pids.extend(listed.split_whitespace().filter_map(|pid| pid.parse::<u32>().ok()));
    }
    pids
}

/// Waits up to `limit` for `pid` to be gone: reaped, not a zombie.
fn reaped_within(pid: u32, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if state_of(pid).is_none() && !children().contains(&pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// A pid that no longer runs: a child that exited and was reaped.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap_or_else(|e| panic!("spawn true: {e}"));
    let pid = child.id();
    let _ = child.wait();
    pid
}

#[test]
fn the_host_directory_is_private_swept_and_removed_and_every_host_is_reaped() {
    let Some(runtime) = runtime_or_skip("host process lifecycle") else { return };
    // A directory left by a SIGKILLed process, and one of a process that runs (ours).
    let stale = std::env::temp_dir().join(format!("goondan-js-{}-stale", dead_pid()));
    std::fs::create_dir_all(&stale).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(stale.join("host.mjs"), "").unwrap_or_else(|e| panic!("{e}"));
    let live = std::env::temp_dir().join(format!("goondan-js-{}-live", std::process::id()));
    std::fs::create_dir_all(&live).unwrap_or_else(|e| panic!("{e}"));

    // The widest umask: the directory must still be 0700.
    let before = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| panic!("{e}"));
    let host = ScriptHost::with_runtime(runtime);
    let kit = Kit::new(std::sync::Arc::clone(&host), None);
    let (first, dir) = tokio.block_on(async {
        let result = kit.call("c1", "kit__echo", json!({"text": "hi"})).await;
        assert_eq!(output(&result)["text"], "hi");
        (host.running_pid().await, host.directory().await)
    });
    nix::sys::stat::umask(before);
    let first = first.unwrap_or_else(|| panic!("no host runs"));
    let dir = dir.unwrap_or_else(|| panic!("no private directory"));
    let mode = std::fs::metadata(&dir).map(|m| m.permissions().mode() & 0o777).unwrap_or_default();
    assert_eq!(mode, 0o700, "{}", dir.display());
    assert!(!stale.exists(), "the stale directory {} was not swept", stale.display());
    assert!(live.exists(), "the directory of a running process was swept");
    let _ = std::fs::remove_dir_all(&live);

    // A host killed from outside is reaped by the process that started it.
    let _ = kill(Pid::from_raw(i32::try_from(first).unwrap_or(i32::MAX)), Signal::SIGKILL);
    assert!(reaped_within(first, Duration::from_secs(5)), "the killed host {first} is {:?}", state_of(first));

    // The next call starts another; the runtime then shuts down under it (as
    // an agent process ends), and that host is reaped too, at once.
    let second = tokio.block_on(async {
        // Let the supervisor see the death first.
        while host.running_pid().await == Some(first) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let result = kit.call("c2", "kit__echo", json!({"text": "again"})).await;
        assert_eq!(output(&result)["text"], "again");
        host.running_pid().await
    });
    let second = second.unwrap_or_else(|| panic!("no second host"));
    assert_ne!(second, first);
    drop(tokio);
    assert!(reaped_within(second, Duration::from_millis(500)), "the host {second} is {:?}", state_of(second));
    // The directory goes with the host.
    drop(kit);
    drop(host);
    assert!(!dir.exists(), "{} is left behind", dir.display());
}
