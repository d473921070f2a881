//! A subreaper reaps the orphans it adopts — a tool shell's background job
//! that ends after its shell — and leaves the children it started itself to
//! whoever waits for them. Its own test binary, since the whole process
//! becomes a subreaper.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use goondan_base::tool_processes::{become_subreaper, reap_adopted_orphans};

/// The state letter of `pid` and its parent, or `None` once it is gone.
fn state_and_parent(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    Some((state, parent))
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn adopted_orphans_are_reaped_and_own_children_left_to_their_waiter() {
    assert!(become_subreaper(), "the kernel refused PR_SET_CHILD_SUBREAPER");
    let me = std::process::id() as i32;

    // A child of our own in our process group (as the JavaScript host is),
    // ended but not waited for yet.
    let mut own = Command::new("true").spawn().unwrap_or_else(|e| panic!("true: {e}"));
    // A child of our own leading its own group (as a tool shell does).
    let mut leader = Command::new("true").process_group(0).spawn().unwrap_or_else(|e| panic!("true: {e}"));
    // A tool-like shell that leaves a short job behind and exits at once;
    // the job is reparented to us and ends a little later.
    let shell = Command::new("sh")
        .args(["-c", "sleep 0.3 >/dev/null 2>&1 & echo $!"])
        .process_group(0)
        .stdout(Stdio::piped())
        .output()
        .unwrap_or_else(|e| panic!("sh: {e}"));
    let orphan: i32 =
        String::from_utf8_lossy(&shell.stdout).trim().parse().unwrap_or_else(|e| panic!("the job's pid: {e}"));
    wait_for("the job to become our zombie", || state_and_parent(orphan) == Some(('Z', me)));
    wait_for("our own children to end", || {
        [own.id(), leader.id()].iter().all(|pid| state_and_parent(*pid as i32).is_some_and(|(s, _)| s == 'Z'))
    });

    assert_eq!(reap_adopted_orphans(), 1, "exactly the adopted job is reaped");
    assert_eq!(state_and_parent(orphan), None, "the job's zombie is gone");
    // Our own children's exit statuses are still theirs to collect.
    assert!(own.wait().unwrap_or_else(|e| panic!("own child: {e}")).success());
    assert!(leader.wait().unwrap_or_else(|e| panic!("group leader: {e}")).success());
    assert_eq!(reap_adopted_orphans(), 0, "nothing left to reap");
}
