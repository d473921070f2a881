//! The swarm cases (`swarm_cases/`) on one machine: the orchestrator and
//! its agent processes over socket pairs; and what only one machine has —
//! agent processes that are the orchestrator's own children.

use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

mod common;

/// The cases run on one machine.
const OVER_NATS: bool = false;

#[path = "swarm_cases/mod.rs"]
mod cases;
use cases::{Run, is_gone, processes_of, read_pid, text, wait_until_none_left, wait_within};

fn orchestrator_signalled_leaves_nothing(signal: Signal) {
    let run = Run::new();
    let workdir = run.work.path().display().to_string();
    let mut child = run
        .command(&["run", "--workdir", &workdir, "--input", "CASE:hang"])
        .env("SWARM_TEST_API_KEY", "sekrit-value-42")
        .spawn()
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    let orchestrator = child.id();
    let worker = read_pid(&run.work.path().join("worker.pid"));
    let shell = read_pid(&run.work.path().join("worker-shell.pid"));
    let started = processes_of(orchestrator);
    // The secret reached no agent process's environment, nor their tools'.
    for pid in processes_of(orchestrator).into_iter().chain([orchestrator]) {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&environ).contains("sekrit-value-42"), "process {pid} sees the secret");
    }
    // A tool's shell does not learn where the orchestrator listens.
    let environ =
        String::from_utf8_lossy(&std::fs::read(format!("/proc/{shell}/environ")).unwrap_or_default()).into_owned();
    assert!(!environ.contains("GOONDAN_AGENT_SOCKET") && !environ.contains("GOONDAN_AGENT_TOKEN"), "{environ}");
    assert!(processes_of(orchestrator).len() >= 3, "coordinator, worker and the worker's shell run");
    assert!(kill(Pid::from_raw(i32::try_from(orchestrator).unwrap_or(0)), signal).is_ok());
    let _ = child.wait();
    wait_until_none_left(orchestrator);
    assert!(is_gone(worker) && is_gone(shell));
    // Also those no longer recognisable once their parent is gone.
    let left: Vec<u32> = started.into_iter().filter(|pid| !is_gone(*pid)).collect();
    assert!(left.is_empty(), "processes outlived the orchestrator: {left:?}");
}

#[test]
fn sigterm_of_the_orchestrator_leaves_no_process_behind() {
    orchestrator_signalled_leaves_nothing(Signal::SIGTERM);
}

#[test]
fn sigkill_of_the_orchestrator_leaves_no_process_behind() {
    orchestrator_signalled_leaves_nothing(Signal::SIGKILL);
}

#[test]
fn sighup_of_the_orchestrator_leaves_no_process_behind() {
    orchestrator_signalled_leaves_nothing(Signal::SIGHUP);
}

/// Item 12 (hub edges): out of descriptors, the hub does not spin (it has
/// no accept loop: each agent's channel is a socket pair made at its start);
/// a start that cannot get one fails at once with the reason.
#[test]
fn out_of_descriptors_a_start_fails_at_once_and_nothing_spins() {
    let run = Run::new();
    let workdir = run.work.path().display().to_string();
    let gdn = run.command(&["run", "--workdir", &workdir, "--input", "CASE:quick"]);
    let args: Vec<String> = gdn
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
        .collect();
    let script = format!("ulimit -n 12 && exec '{}' {}", env!("CARGO_BIN_EXE_gdn"), args.join(" "));
    let child = Command::new("/bin/sh")
        .args(["-c", &script])
        .env("NO_COLOR", "1")
        .env_remove("GOONDAN_STATE_ROOT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    let output = wait_within(child, Duration::from_secs(20));
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("Too many open files"), "{stderr}");
}
