//! A Swarm's `policy.lifecycle` and `policy.shutdown` in its service,
//! through `gdn run --detach` as a user runs it: an idle instance expires
//! (its process stopped, `gdn instance list` says so) and is collected
//! once its `gcGraceSeconds` passed; a turn longer than `ttlSeconds` is
//! not cut; an event for an expired instance takes it back with its
//! conversation; an expiry survives a `kill -9` of the service (the next
//! start collects); `gracePeriodSeconds` is the drain unless `--drain-secs`
//! says.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use goondan_test_support::{Agent, Bundle, reply_text, reply_tools, text};
use serde_json::{Value, json};

mod common;
use common::service::{Stopped, TestResult, detach, free_port, gdn, instance, turns, until};

/// Two agents behind one webhook, in the Swarm `life` with `policy`:
/// `quick` answers at once, `slow` runs `command` in bash, then answers
/// (events named `slow` go to it).
fn bundle(dir: &Path, port: u16, command: &str, policy: Value) -> Result<(), std::io::Error> {
    let rules = json!([
        {"match": {"event": "slow"}, "route": {"agentRef": "Agent/slow"}},
        {"route": {"agentRef": "Agent/quick"}},
    ]);
    let swarm = json!({"entryAgent": "Agent/quick", "agents": ["Agent/quick", "Agent/slow"], "policy": policy});
    Bundle::new()
        .scripted_model("shell", [reply_tools([("bash__exec", json!({"command": command}))]), reply_text("done")])
        .scripted_model("fast", [reply_text("pong")])
        .agent(Agent::new("slow", "shell").base_tool("bash"))
        .agent(Agent::new("quick", "fast"))
        .resource("Swarm", "life", swarm)
        .webhook("hook", port, rules)
        .write(dir)
}

fn post(port: u16, event: &str, key: &str, input: &str) -> Result<String, std::io::Error> {
    common::service::post(port, &json!({"event": event, "instanceKey": key, "text": input}))
}

fn workspace(state: &Path) -> PathBuf {
    state.join("workspaces").join("life")
}

fn instance_dir(state: &Path, name: &str) -> PathBuf {
    workspace(state).join("instances").join(name)
}

fn log(state: &Path) -> String {
    std::fs::read_to_string(workspace(state).join("logs/service.log")).unwrap_or_default()
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_owned).collect()
}

/// Whether process `pid` runs (a zombie does not).
fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
}

/// The row of `agent@key` once it says it expired.
fn expired_row(dir: &Path, state: &Path, agent: &str, key: &str) -> Result<Value, Box<dyn std::error::Error>> {
    let mut row = Value::Null;
    until("the instance to expire", || {
        row = instance(dir, state, agent, key)?.unwrap_or_default();
        Ok(row["expiredAt"].is_u64())
    })?;
    Ok(row)
}

fn event_types(dir: &Path) -> Vec<String> {
    lines(&dir.join("events.jsonl"))
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|event| event["type"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn an_idle_instance_expires_its_process_stops_and_it_is_collected_after_its_grace() -> TestResult {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let port = free_port()?;
    bundle(dir.path(), port, "true", json!({"lifecycle": {"ttlSeconds": 1, "gcGraceSeconds": 3}}))?;
    let _running = detach(dir.path(), &state)?;

    assert!(post(port, "chat", "k1", "hi")?.starts_with("HTTP/1.1 200"));
    until("the turn", || Ok(turns(dir.path(), &state, "quick", "k1")? == 1))?;
    let row = instance(dir.path(), &state, "quick", "k1")?.unwrap_or_default();
    let pid = row["pid"].as_u64().ok_or(format!("no process runs it: {row}"))?;

    let row = expired_row(dir.path(), &state, "quick", "k1")?;
    assert_eq!(row["running"], false, "{row}");
    let (expired_at, collect_at) = (row["expiredAt"].as_u64().unwrap_or(0), row["collectAt"].as_u64().unwrap_or(0));
    assert_eq!(collect_at.saturating_sub(expired_at), 3000, "{row}");
    assert!(!alive(pid), "its agent process (pid {pid}) still runs");
    let listed = text(&gdn(dir.path(), &state, &["instance", "list"])?.stdout);
    assert!(listed.contains("expired (collected in "), "{listed}");
    let path = instance_dir(&state, "quick@k1");
    assert!(event_types(&path).contains(&"instance.expired".to_owned()), "{:?}", event_types(&path));

    until("the instance to be collected", || Ok(!path.exists()))?;
    let now = u64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis())?;
    assert!(now >= collect_at, "collected before its collectAt");
    assert!(instance(dir.path(), &state, "quick", "k1")?.is_none());
    until("the collection's line in the service's log", || Ok(log(&state).contains("quick@k1 collected")))?;
    assert!(log(&state).contains("quick@k1 expired"), "{}", log(&state));

    // The service goes on: the key's next event starts a new conversation.
    assert!(post(port, "chat", "k1", "again")?.starts_with("HTTP/1.1 200"));
    until("a new first turn", || Ok(turns(dir.path(), &state, "quick", "k1")? == 1))?;
    Ok(())
}

#[test]
fn a_turn_longer_than_the_ttl_is_not_cut_and_an_event_takes_an_expired_instance_back() -> TestResult {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let marks = state.join("workspaces/life/workdir/marks");
    let port = free_port()?;
    let command = format!("echo start >> '{m}'; sleep 4; echo end >> '{m}'", m = marks.display());
    bundle(dir.path(), port, &command, json!({"lifecycle": {"ttlSeconds": 1, "gcGraceSeconds": 600}}))?;
    let _running = detach(dir.path(), &state)?;

    // A turn of 4 s under a ttl of 1 s, whose last write is more than 1 s old while its command runs.
    assert!(post(port, "slow", "s1", "go")?.starts_with("HTTP/1.1 200"));
    until("the command to start", || Ok(lines(&marks) == ["start"]))?;
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let row = instance(dir.path(), &state, "slow", "s1")?.unwrap_or_default();
        assert!(row["expiredAt"].is_null(), "expired during its turn: {row}");
        std::thread::sleep(Duration::from_millis(200));
    }
    until("the turn to end", || Ok(turns(dir.path(), &state, "slow", "s1")? == 1))?;
    assert_eq!(lines(&marks), ["start", "end"], "the turn was cut");

    // Idle now: it expires; an event for it takes it back, conversation and all.
    assert!(post(port, "chat", "q1", "first")?.starts_with("HTTP/1.1 200"));
    until("quick's turn", || Ok(turns(dir.path(), &state, "quick", "q1")? == 1))?;
    expired_row(dir.path(), &state, "quick", "q1")?;
    assert!(post(port, "chat", "q1", "second")?.starts_with("HTTP/1.1 200"));
    until("the turn of the expired instance", || Ok(turns(dir.path(), &state, "quick", "q1")? == 2))?;
    let path = instance_dir(&state, "quick@q1");
    let conversation = common::service::conversation(&path);
    assert_eq!(conversation.len(), 4, "{conversation:?}");
    assert!(conversation[0].contains("first") && conversation[2].contains("second"), "{conversation:?}");
    let events = event_types(&path);
    let expired = events.iter().position(|t| t == "instance.expired");
    let revived = events.iter().position(|t| t == "instance.revived");
    assert!(expired.is_some() && expired < revived, "{events:?}");
    Ok(())
}

#[test]
fn an_expiry_outlives_a_killed_service_and_the_next_start_collects_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let port = free_port()?;
    bundle(dir.path(), port, "true", json!({"lifecycle": {"ttlSeconds": 1, "gcGraceSeconds": 2}}))?;
    let running = detach(dir.path(), &state)?;
    let status: Value = serde_json::from_str(&std::fs::read_to_string(workspace(&state).join("service.json"))?)?;
    let service = i32::try_from(status["pid"].as_u64().unwrap_or(0))?;

    assert!(post(port, "chat", "k1", "hi")?.starts_with("HTTP/1.1 200"));
    until("the turn", || Ok(turns(dir.path(), &state, "quick", "k1")? == 1))?;
    let row = expired_row(dir.path(), &state, "quick", "k1")?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(service), nix::sys::signal::Signal::SIGKILL)?;
    until("the service to be gone", || Ok(!alive(u64::try_from(service)?)))?;
    drop(running);

    // Past its collection time with no service: it stays, marked.
    let collect_at = row["collectAt"].as_u64().unwrap_or(0);
    until("its collection time", || {
        Ok(u64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis())?
            > collect_at + 500)
    })?;
    let path = instance_dir(&state, "quick@k1");
    assert!(path.exists(), "collected with no service running");
    let listed = text(&gdn(dir.path(), &state, &["instance", "list"])?.stdout);
    assert!(listed.contains("expired (collected at the service's next sweep)"), "{listed}");

    let _running = detach(dir.path(), &state)?;
    until("the next start to collect it", || Ok(!path.exists()))?;
    Ok(())
}

/// Stops the service of `dir` and says how long it took.
fn stop(dir: &Path, state: &Path) -> Result<Duration, Box<dyn std::error::Error>> {
    let started = Instant::now();
    let stopped = gdn(dir, state, &["stop"])?;
    assert_eq!(stopped.status.code(), Some(0), "{}", text(&stopped.stderr));
    Ok(started.elapsed())
}

#[test]
fn the_swarms_grace_period_is_the_drain_and_drain_secs_wins_over_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let marks = state.join("workspaces/life/workdir/marks");
    let port = free_port()?;
    let command = format!("echo start >> '{m}'; sleep 8; echo end >> '{m}'", m = marks.display());
    bundle(dir.path(), port, &command, json!({"shutdown": {"gracePeriodSeconds": 2}}))?;

    // No --drain-secs: the 8 s turn is cut at the Swarm's 2 s (not at the default 30 s).
    let running = detach(dir.path(), &state)?;
    // What `gdn stop` waits for by default follows: drain and process grace of 2 s, not 30 s and 5 s.
    let status: Value = serde_json::from_str(&std::fs::read_to_string(workspace(&state).join("service.json"))?)?;
    let stop_within = status["stopWithinSecs"].as_u64().ok_or(format!("{status}"))?;
    assert!((4..30).contains(&stop_within), "{status}");
    assert!(post(port, "slow", "s1", "go")?.starts_with("HTTP/1.1 200"));
    until("the command to start", || Ok(lines(&marks) == ["start"]))?;
    let took = stop(dir.path(), &state)?;
    drop(running);
    assert!(took >= Duration::from_millis(1500) && took < Duration::from_secs(7), "the stop took {took:?}");
    assert_eq!(lines(&marks), ["start"], "the turn was not cut at the grace period");

    // --drain-secs 30 wins: the event's turn runs again at this start and is waited for.
    let started = gdn(dir.path(), &state, &["run", "--detach", "--drain-secs", "30"])?;
    assert_eq!(started.status.code(), Some(0), "{}", text(&started.stderr));
    let _running = Stopped { dir: dir.path().to_path_buf(), state: state.clone() };
    until("the turn to run again", || Ok(lines(&marks).len() == 2))?;
    let took = stop(dir.path(), &state)?;
    assert_eq!(lines(&marks), ["start", "start", "end"], "the turn was cut (the stop took {took:?})");
    assert!(took >= Duration::from_secs(3), "the stop took {took:?}");
    Ok(())
}
