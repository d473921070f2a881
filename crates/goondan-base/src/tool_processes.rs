//! Every process a tool call started, found again — including those that
//! left its process group (`setsid`, a double fork).
//!
//! A process group does not hold a process that starts its own session, so
//! `killpg` alone lets `setsid sleep 1000 &` outlive the call and the agent.
//! Instead each call's shell gets a marker in its environment,
//! `GOONDAN_TOOL_CALL=<pid of gdn>-<random>-<n>`: every descendant inherits it (a new
//! session does not change the environment, and `/proc/<pid>/environ`
//! shows it), so the call's processes are found by scanning `/proc`, wherever
//! they were reparented. `gdn` also makes itself a child subreaper
//! ([`become_subreaper`]) so that orphans of a call are reparented to it and
//! reaped rather than handed to init.
//!
//! A call that times out or is cancelled kills its marked processes at once;
//! one that finishes normally keeps its background jobs (as the original),
//! and they are killed when `gdn` ends ([`ToolProcesses::kill_all`]).

use goondan_core::sync::LockUnpoisoned;
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The environment variable that marks a call's processes.
pub const MARKER_ENV: &str = "GOONDAN_TOOL_CALL";

/// How many times a kill rescans for processes forked meanwhile.
const KILL_PASSES: usize = 5;

/// The markers of this process's tool calls whose processes may still run.
#[derive(Debug)]
pub struct ToolProcesses {
    prefix: String,
    next: AtomicU64,
    live: Mutex<BTreeSet<String>>,
}

impl Default for ToolProcesses {
    fn default() -> Self {
        // Random per tracker: two trackers of one process never share a marker.
        let unique = goondan_core::ids::new_id().replace('-', "");
        Self {
            prefix: format!("{}-{unique}-", std::process::id()),
            next: AtomicU64::new(1),
            live: Mutex::new(BTreeSet::new()),
        }
    }
}

impl ToolProcesses {
    /// A fresh marker for one call, remembered until its processes are killed.
    pub fn marker(&self) -> String {
        let marker = format!("{}{}", self.prefix, self.next.fetch_add(1, Ordering::Relaxed));
        self.live.lock_unpoisoned().insert(marker.clone());
        marker
    }

    /// Kills (SIGKILL) every process carrying `marker`, however it left the
    /// call's group; returns how many were signalled.
    pub fn kill_marked(&self, marker: &str) -> usize {
        let killed = kill_carrying(&[marker]);
        self.live.lock_unpoisoned().remove(marker);
        killed
    }

    /// Whether a process carrying one of this process's markers still runs:
    /// a background job a finished call left (`server > log 2>&1 &`). An
    /// agent process holding one is not idle — stopping it would end the
    /// job. Markers none of whose processes are left are forgotten, so the
    /// scan of `/proc` stops once the jobs ended (a process caught between
    /// `setsid` and `exec` shows no environment for an instant; the exit's
    /// [`kill_descendants`] still ends it). Reads `/proc`: call it off the
    /// async threads.
    pub fn any_left_running(&self) -> bool {
        let markers: Vec<String> = self.live.lock_unpoisoned().iter().cloned().collect();
        if markers.is_empty() {
            return false;
        }
        let needles: Vec<Vec<u8>> = markers.iter().map(|m| format!("{MARKER_ENV}={m}").into_bytes()).collect();
        let found = carrying(&needles);
        let mut live = self.live.lock_unpoisoned();
        for (marker, needle) in markers.iter().zip(&needles) {
            if !found.contains(needle) {
                live.remove(marker);
            }
        }
        !found.is_empty()
    }

    /// Kills what every call of this process left running (background jobs
    /// of calls that finished): `gdn` calls it when it ends.
    pub fn kill_all(&self) -> usize {
        let markers: Vec<String> = std::mem::take(&mut *self.live.lock_unpoisoned()).into_iter().collect();
        if markers.is_empty() {
            return 0;
        }
        let markers: Vec<&str> = markers.iter().map(String::as_str).collect();
        kill_carrying(&markers)
    }
}

/// Kills (SIGKILL) every process a tool call of the process `owner` started
/// (their markers begin with its pid): what an agent process that died left
/// behind. Returns how many were signalled.
pub fn kill_left_by(owner: u32) -> usize {
    kill_matching(&[], &[format!("{MARKER_ENV}={owner}-").into_bytes()])
}

/// Kills (SIGKILL) every descendant of this process, for `gdn` to call as it
/// exits: what a tool started and the marker scan could not see — a
/// process caught between two images (`setsid` exec'ing its command shows
/// an empty environment for an instant). As a child subreaper, `gdn` is an
/// ancestor of every process its tools started, however they detached.
/// Only at exit: it spares nothing.
pub fn kill_descendants() -> usize {
    let own = std::process::id();
    kill_in_passes(|kill_one| {
        let mut parents = vec![own];
        while let Some(parent) = parents.pop() {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else { continue };
            for task in tasks.flatten() {
                let Ok(children) = std::fs::read_to_string(task.path().join("children")) else { continue };
                for child in children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
                    // A zombie runs nothing (and stays listed until reaped).
                    if is_zombie(child) {
                        continue;
                    }
                    parents.push(child);
                    kill_one(child);
                }
            }
        }
    })
}

/// SIGKILLs each process `scan` passes to its callback, and scans again
/// until a scan finds none (a process may fork between a scan and its
/// kill), at most [`KILL_PASSES`] times. Returns how many were signalled,
/// each counted once though it is seen again until the kill lands.
fn kill_in_passes(mut scan: impl FnMut(&mut dyn FnMut(u32))) -> usize {
    let mut signalled = BTreeSet::new();
    for _pass in 0..KILL_PASSES {
        let mut found = 0;
        scan(&mut |pid| {
            if let Ok(raw) = i32::try_from(pid) {
                let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
            }
            signalled.insert(pid);
            found += 1;
        });
        if found == 0 {
            break;
        }
        // Let the kernel deliver the kills before looking again.
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    signalled.len()
}

/// Whether `pid` is a zombie (or gone).
fn is_zombie(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return true };
    // The state follows the command name, which is in parentheses and may hold anything.
    stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()).is_none_or(|state| state == 'Z')
}

/// Reaps the zombies among this process's children that it adopted as a
/// subreaper — a tool call's background job that outlived its shell and then
/// ended — and returns how many. Call it when a child changes state
/// (SIGCHLD); it costs a read of the children list when there is nothing to do.
///
/// Children this process started itself are waited for by whoever started
/// them (tokio, a host's supervisor thread), and reaping one of those here
/// would take its exit status from them. They are told apart without a
/// registry: every child `gdn` starts either leads its own process group in
/// our session (tool shells, MCP servers, agent processes) or stays in our
/// process group (the JavaScript host, short probes). A zombie child in a
/// group led by another process (a shell's job), or in another session
/// (`setsid`), can only have come to us as an orphan.
pub fn reap_adopted_orphans() -> usize {
    use nix::sys::wait::{WaitPidFlag, waitpid};
    let own_group = nix::unistd::getpgrp().as_raw();
    let Ok(own_session) = nix::unistd::getsid(None).map(Pid::as_raw) else { return 0 };
    let mut reaped = 0;
    for pid in own_children() {
        let Some(child) = ChildStat::read(pid) else { continue };
        let adopted = child.session != own_session || (child.group != pid && child.group != own_group);
        if child.state == 'Z' && adopted && waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)).is_ok() {
            reaped += 1;
        }
    }
    reaped
}

/// The pids of this process's children, over all its threads (a reparented
/// orphan joins the children of one of the reaper's threads).
fn own_children() -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    let mut children = Vec::new();
    for task in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            children.extend(list.split_ascii_whitespace().filter_map(|pid| pid.parse::<i32>().ok()));
        }
    }
    children
}

/// What `/proc/<pid>/stat` says of a process's state, group and session.
struct ChildStat {
    state: char,
    group: i32,
    session: i32,
}

impl ChildStat {
    fn read(pid: i32) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command name (in parentheses, which may hold anything):
        // state, ppid, pgrp, session, …
        let (_, rest) = stat.rsplit_once(')')?;
        let mut fields = rest.split_ascii_whitespace();
        let state = fields.next()?.chars().next()?;
        let _ppid = fields.next()?;
        let group = fields.next()?.parse().ok()?;
        let session = fields.next()?.parse().ok()?;
        Some(Self { state, group, session })
    }
}

/// Makes this process the reaper of its orphaned descendants (Linux
/// `PR_SET_CHILD_SUBREAPER`), so that a tool's double-forked processes stay
/// below it. Best effort: false where the kernel refuses.
pub fn become_subreaper() -> bool {
    nix::sys::prctl::set_child_subreaper(true).is_ok()
}

/// Which of `needles` (whole environment entries) some live process other
/// than this one carries.
fn carrying(needles: &[Vec<u8>]) -> BTreeSet<Vec<u8>> {
    let own = std::process::id();
    let mut found = BTreeSet::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return found };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        if pid == own {
            continue;
        }
        // A zombie's environment reads empty: it runs nothing.
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
        for var in environ.split(|byte| *byte == 0) {
            if let Some(needle) = needles.iter().find(|needle| var == needle.as_slice()) {
                found.insert(needle.clone());
            }
        }
        if found.len() == needles.len() {
            break;
        }
    }
    found
}

/// SIGKILLs every process whose environment holds one of `markers`, rescanning
/// until none is left (a process may fork between a scan and its kill).
fn kill_carrying(markers: &[&str]) -> usize {
    let needles: Vec<Vec<u8>> = markers.iter().map(|m| format!("{MARKER_ENV}={m}").into_bytes()).collect();
    kill_matching(&needles, &[])
}

/// SIGKILLs every process with an environment variable equal to one of
/// `exact` or starting with one of `prefixes`, rescanning until none is left.
fn kill_matching(exact: &[Vec<u8>], prefixes: &[Vec<u8>]) -> usize {
    let own = std::process::id();
    kill_in_passes(|kill_one| {
        let Ok(entries) = std::fs::read_dir("/proc") else { return };
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
            if pid == own {
                continue;
            }
            // Unreadable (another user's, or gone): not ours to kill.
            let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
            let matches = |var: &[u8]| {
                exact.iter().any(|needle| var == needle.as_slice())
                    || prefixes.iter().any(|prefix| var.starts_with(prefix))
            };
            if environ.split(|byte| *byte == 0).any(matches) {
                kill_one(pid);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    fn gone(pid: u32) -> bool {
        // A zombie (killed, not yet reaped by us) counts as gone.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.is_empty() || stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z'))
    }

    #[test]
    fn a_process_that_left_the_group_is_found_by_its_marker_and_killed() {
        let processes = ToolProcesses::default();
        let marker = processes.marker();
        let other = processes.marker();
        // A new session, as `setsid sleep 1000 &` makes; and one of another call.
        let mut escaped = Command::new("setsid")
            .args(["sleep", "1000"])
            .env(MARKER_ENV, &marker)
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("setsid: {e}"));
        let mut bystander =
            Command::new("sleep").arg("1000").env(MARKER_ENV, &other).spawn().unwrap_or_else(|e| panic!("sleep: {e}"));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(processes.kill_marked(&marker), 1);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !gone(escaped.id()) {
            assert!(Instant::now() < deadline, "the marked process survived");
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = escaped.wait();
        assert!(!gone(bystander.id()), "another call's process was killed");
        // At the end, everything still marked goes.
        assert_eq!(processes.kill_all(), 1);
        let _ = bystander.wait();
        assert_eq!(processes.kill_all(), 0);
    }

    #[test]
    fn a_background_job_is_seen_until_it_ends_and_then_forgotten() {
        let processes = ToolProcesses::default();
        assert!(!processes.any_left_running(), "nothing was started");
        let marker = processes.marker();
        let _finished = processes.marker();
        let mut job =
            Command::new("sleep").arg("1000").env(MARKER_ENV, &marker).spawn().unwrap_or_else(|e| panic!("sleep: {e}"));
        assert!(processes.any_left_running(), "the job runs");
        // The marker of the call that left nothing is forgotten, the job's kept.
        assert_eq!(processes.live.lock().map(|live| live.len()).unwrap_or_default(), 1);
        let _ = job.kill();
        let _ = job.wait();
        assert!(!processes.any_left_running(), "the job ended");
        assert_eq!(processes.kill_all(), 0, "its marker was forgotten");
    }
}
