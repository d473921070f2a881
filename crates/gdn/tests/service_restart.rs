//! Changing a running service, through the CLI as a user drives it:
//! `gdn restart --agent` while another agent's turn runs (that turn
//! completes, and so does the restarted agent's own), a whole restart
//! refused for a bundle that no longer validates and then done in the same
//! process, `--fresh`, `gdn instance restart` and `gdn instance delete
//! --force` with the service running.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use goondan_test_support::{Agent, Bundle, reply_text, reply_tools};
use serde_json::{Value, json};

mod common;
use common::service::{Stopped, TestResult, detach, free_port, gdn, instance, turns, until};
use goondan_test_support::text;

/// Two agents fed by one webhook: `slow` runs `command` in bash and
/// answers, `quick` answers `reply` at once; the Swarm's `policy` unless
/// null.
fn pair(port: u16, command: &str, reply: &str, policy: Value) -> Bundle {
    let mut swarm = json!({"entryAgent": "Agent/quick", "agents": ["Agent/quick", "Agent/slow"]});
    if !policy.is_null() {
        swarm["policy"] = policy;
    }
    let rules = json!([
        {"match": {"event": "slow"}, "route": {"agentRef": "Agent/slow"}},
        {"route": {"agentRef": "Agent/quick"}},
    ]);
    Bundle::new()
        .scripted_model(
            "shell",
            [reply_tools([("bash__exec", json!({"command": command}))]), reply_text("slow answer")],
        )
        .scripted_model("fast", [reply_text(reply)])
        .agent(Agent::new("slow", "shell").base_tool("bash"))
        .agent(Agent::new("quick", "fast"))
        .resource("Swarm", "pair", swarm)
        .webhook("hook", port, rules)
}

/// [`pair`] without a policy, written into `dir`.
fn bundle(dir: &Path, port: u16, command: &str, reply: &str) -> Result<(), std::io::Error> {
    pair(port, command, reply, Value::Null).write(dir)
}

/// `gdn run --detach` of [`bundle`] (`slow` running `true`, `quick`
/// answering "pong") in a new project: the project, its state root, the
/// webhook's port and the guard that stops the service.
fn started() -> Result<(tempfile::TempDir, PathBuf, u16, Stopped), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let port = free_port()?;
    bundle(dir.path(), port, "true", "pong")?;
    let running = detach(dir.path(), &state)?;
    Ok((dir, state, port, running))
}

fn post(port: u16, event: &str, key: &str, input: &str) -> Result<String, std::io::Error> {
    let body = serde_json::json!({"event": event, "instanceKey": key, "text": input});
    common::service::post(port, &body)
}

fn service_status(state: &Path) -> Result<Value, Box<dyn std::error::Error>> {
    let workspace = state.join("workspaces").join("pair");
    Ok(serde_json::from_str(&std::fs::read_to_string(workspace.join("service.json"))?)?)
}

fn lines(path: &PathBuf) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_owned).collect()
}

#[test]
fn restarting_one_agent_cuts_no_turn_of_it_or_of_another() -> TestResult {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    // Where its commands may write: the project's working directory.
    let marks = state.join("workspaces/pair/workdir/marks");
    let port = free_port()?;
    let command = format!("echo start >> '{m}'; sleep 3; echo end >> '{m}'", m = marks.display());
    bundle(dir.path(), port, &command, "pong")?;
    let _running = detach(dir.path(), &state)?;

    // quick answers once; its process is up.
    assert!(post(port, "chat", "q1", "hi")?.starts_with("HTTP/1.1 200"));
    until("quick's first turn", || Ok(turns(dir.path(), &state, "quick", "q1")? == 1))?;
    let quick = instance(dir.path(), &state, "quick", "q1")?.unwrap_or_default();
    let first_pid = quick["pid"].as_u64().ok_or("quick has no running process")?;

    // slow's turn runs while quick is restarted: it is not waited for, and not cut.
    assert!(post(port, "slow", "s1", "go")?.starts_with("HTTP/1.1 200"));
    until("slow's command to start", || Ok(lines(&marks) == ["start"]))?;
    let restart = gdn(dir.path(), &state, &["restart", "--agent", "quick"])?;
    let said = text(&restart.stdout);
    assert_eq!(restart.status.code(), Some(0), "{said}{}", text(&restart.stderr));
    assert!(said.contains(&format!("stopped quick@q1 (pid {first_pid})")), "{said}");
    assert_eq!(lines(&marks), ["start"], "restarting quick waited for slow's turn");
    until("slow's turn to end", || Ok(turns(dir.path(), &state, "slow", "s1")? == 1))?;
    assert_eq!(lines(&marks), ["start", "end"]);

    // quick's next message starts a new process.
    assert!(post(port, "chat", "q1", "again")?.starts_with("HTTP/1.1 200"));
    until("quick's second turn", || Ok(turns(dir.path(), &state, "quick", "q1")? == 2))?;
    let quick = instance(dir.path(), &state, "quick", "q1")?.unwrap_or_default();
    assert_ne!(quick["pid"].as_u64(), Some(first_pid), "{quick}");

    // Restarting slow while its own turn runs: the restart waits for the turn's end.
    assert!(post(port, "slow", "s1", "again")?.starts_with("HTTP/1.1 200"));
    until("slow's second command to start", || Ok(lines(&marks).len() == 3))?;
    let restart = gdn(dir.path(), &state, &["restart", "--agent", "slow"])?;
    assert_eq!(restart.status.code(), Some(0), "{}", text(&restart.stderr));
    assert_eq!(lines(&marks), ["start", "end", "start", "end"], "the running turn was cut");
    until("slow's second turn to be counted", || Ok(turns(dir.path(), &state, "slow", "s1")? == 2))?;

    // An agent the swarm does not have.
    let unknown = gdn(dir.path(), &state, &["restart", "--agent", "quik"])?;
    assert_eq!(unknown.status.code(), Some(1));
    assert!(text(&unknown.stderr).contains("did you mean 'quick'?"), "{}", text(&unknown.stderr));
    Ok(())
}

#[test]
fn a_whole_restart_keeps_the_running_service_for_a_broken_bundle_and_reloads_a_fixed_one() -> TestResult {
    let (dir, state, port, _running) = started()?;
    let before = service_status(&state)?;
    assert!(post(port, "chat", "q1", "hi")?.starts_with("HTTP/1.1 200"));
    until("the first turn", || Ok(turns(dir.path(), &state, "quick", "q1")? == 1))?;

    // Broken: refused with the diagnostics, and the service goes on serving.
    let file = dir.path().join("goondan.yaml");
    let good = std::fs::read_to_string(&file)?;
    std::fs::write(&file, good.replacen("provider: scripted", "provder: scripted", 1))?;
    let refused = gdn(dir.path(), &state, &["restart"])?;
    let said = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(3), "{said}");
    assert!(said.contains("does not validate") && said.contains("provider"), "{said}");
    // An agent's restart would start it from the broken file too: refused alike.
    let refused = gdn(dir.path(), &state, &["restart", "--agent", "quick"])?;
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("does not validate"), "{}", text(&refused.stderr));
    assert!(post(port, "chat", "q1", "still there")?.starts_with("HTTP/1.1 200"));
    until("a turn after the refusal", || Ok(turns(dir.path(), &state, "quick", "q1")? == 2))?;

    // Fixed, with a new answer: the same process serves again, with the new bundle.
    bundle(dir.path(), port, "true", "pong two")?;
    let restarted = gdn(dir.path(), &state, &["restart"])?;
    assert_eq!(restarted.status.code(), Some(0), "{}", text(&restarted.stderr));
    assert!(text(&restarted.stdout).contains("service restarted (pid "), "{}", text(&restarted.stdout));
    let after = service_status(&state)?;
    assert_eq!(after["pid"], before["pid"], "a restart stays in the service's process");
    assert!(after["startedAt"].as_u64() > before["startedAt"].as_u64());
    assert!(post(port, "chat", "q1", "new")?.starts_with("HTTP/1.1 200"));
    let log = PathBuf::from(after["log"].as_str().unwrap_or_default());
    until("the new bundle's answer", || Ok(std::fs::read_to_string(&log)?.contains("quick@q1 › pong two")))?;
    assert_eq!(turns(dir.path(), &state, "quick", "q1")?, 3);

    // --fresh: every conversation starts over.
    let fresh = gdn(dir.path(), &state, &["restart", "--fresh"])?;
    assert_eq!(fresh.status.code(), Some(0), "{}", text(&fresh.stderr));
    let row = instance(dir.path(), &state, "quick", "q1")?.ok_or("the instance is gone")?;
    assert_eq!((row["turns"].as_u64(), row["messages"].as_u64()), (Some(0), Some(0)), "{row}");
    Ok(())
}

#[test]
fn instances_are_restarted_fresh_and_deleted_through_the_running_service() -> TestResult {
    let (dir, state, port, _running) = started()?;
    for key in ["a", "b"] {
        assert!(post(port, "chat", key, "hi")?.starts_with("HTTP/1.1 200"));
        until("the turn", || Ok(turns(dir.path(), &state, "quick", key)? == 1))?;
    }

    let restarted = gdn(dir.path(), &state, &["instance", "restart", "a", "--fresh"])?;
    let said = text(&restarted.stdout);
    assert_eq!(restarted.status.code(), Some(0), "{said}{}", text(&restarted.stderr));
    assert!(said.contains("stopped quick@a (pid ") && said.contains("cleared the conversation of quick@a"), "{said}");
    assert_eq!(turns(dir.path(), &state, "quick", "a")?, 0);
    assert_eq!(turns(dir.path(), &state, "quick", "b")?, 1, "another key is left alone");
    let unknown = gdn(dir.path(), &state, &["instance", "restart", "nope"])?;
    assert_eq!(unknown.status.code(), Some(2));
    assert!(text(&unknown.stderr).contains("no instance 'nope'"), "{}", text(&unknown.stderr));

    // b's process runs: without --force nothing happens; with it, the service stops it and deletes it.
    assert!(instance(dir.path(), &state, "quick", "b")?.is_some_and(|row| row["running"] == true));
    let asked = gdn(dir.path(), &state, &["instance", "delete", "b"])?;
    assert_eq!(asked.status.code(), Some(2));
    let deleted = gdn(dir.path(), &state, &["instance", "delete", "b", "--force"])?;
    let said = text(&deleted.stdout);
    assert_eq!(deleted.status.code(), Some(0), "{said}{}", text(&deleted.stderr));
    assert!(said.contains("deleted instance quick@b"), "{said}");
    assert!(instance(dir.path(), &state, "quick", "b")?.is_none());
    // The service goes on: b's next event starts a new conversation.
    assert!(post(port, "chat", "b", "back")?.starts_with("HTTP/1.1 200"));
    until("b's new first turn", || Ok(turns(dir.path(), &state, "quick", "b")? == 1))?;
    Ok(())
}

/// The service's log file (a detached service's standard streams).
fn log_text(state: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let status = service_status(state)?;
    Ok(std::fs::read_to_string(status["log"].as_str().unwrap_or_default())?)
}

#[test]
fn a_watched_service_restarts_only_what_an_edit_changes_and_keeps_running_through_a_broken_edit() -> TestResult {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let port = free_port()?;
    bundle(dir.path(), port, "true", "pong")?;
    let file = dir.path().join("goondan.yaml");
    let original = std::fs::read_to_string(&file)?;
    let started = gdn(dir.path(), &state, &["run", "--detach", "--watch"])?;
    assert_eq!(started.status.code(), Some(0), "{}", text(&started.stderr));
    let _running = Stopped { dir: dir.path().to_path_buf(), state: state.clone() };
    let first = service_status(&state)?;
    assert!(post(port, "chat", "q1", "hi")?.starts_with("HTTP/1.1 200"));
    assert!(post(port, "slow", "s1", "hi")?.starts_with("HTTP/1.1 200"));
    until("both turns", || {
        Ok(turns(dir.path(), &state, "quick", "q1")? == 1 && turns(dir.path(), &state, "slow", "s1")? == 1)
    })?;
    let slow_pid = instance(dir.path(), &state, "slow", "s1")?
        .and_then(|row| row["pid"].as_u64())
        .ok_or("slow runs no process")?;

    // quick's Model changes: quick restarts, slow does not.
    bundle(dir.path(), port, "true", "pong two")?;
    until("quick's process to stop", || {
        Ok(instance(dir.path(), &state, "quick", "q1")?.is_some_and(|row| row["running"] == false))
    })?;
    assert!(post(port, "chat", "q1", "again")?.starts_with("HTTP/1.1 200"));
    until("the edited answer", || Ok(log_text(&state).is_ok_and(|log| log.contains("quick@q1 › pong two"))))?;
    let slow = instance(dir.path(), &state, "slow", "s1")?.unwrap_or_default();
    assert_eq!(slow["pid"].as_u64(), Some(slow_pid), "slow was restarted by an edit that is not its: {slow}");
    assert!(log_text(&state)?.contains("Model/fast changed"), "{}", log_text(&state)?);

    // Broken: said in the log, and the service still answers with what runs.
    std::fs::write(&file, original.replace("provider: scripted", "provder: scripted"))?;
    until("the broken edit to be reported", || {
        Ok(log_text(&state).is_ok_and(|log| log.contains("the bundle no longer validates; the running one is kept")))
    })?;
    assert!(log_text(&state)?.contains("provider"), "{}", log_text(&state)?);
    assert!(post(port, "chat", "q1", "still")?.starts_with("HTTP/1.1 200"));
    until("a turn with the broken file on disk", || Ok(turns(dir.path(), &state, "quick", "q1")? == 3))?;
    // A new instance would need a process built from the broken file: its event waits, stored.
    assert!(post(port, "chat", "q2", "waits")?.starts_with("HTTP/1.1 200"));
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(turns(dir.path(), &state, "quick", "q2")?, 0);
    assert!(!log_text(&state)?.contains("AGENT_BUILD_FAILED"), "{}", log_text(&state)?);

    // Back to valid, with the Connection moved to another port: the connector restarts there.
    let new_port = free_port()?;
    bundle(dir.path(), new_port, "true", "pong three")?;
    until("the connector on its new port", || Ok(TcpStream::connect(("127.0.0.1", new_port)).is_ok()))?;
    assert!(post(new_port, "chat", "q1", "moved")?.starts_with("HTTP/1.1 200"));
    until("the third answer", || Ok(log_text(&state).is_ok_and(|log| log.contains("quick@q1 › pong three"))))?;
    until("the waiting event's turn, once fixed", || Ok(turns(dir.path(), &state, "quick", "q2")? == 1))?;
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "the old port still listens");
    let status = service_status(&state)?;
    assert_eq!(
        status["startedAt"], first["startedAt"],
        "an edit of agents and a Connection restarted the whole service"
    );
    assert!(status["listening"].to_string().contains(&new_port.to_string()), "{status}");

    // The Swarm changes: the whole service restarts, in its process, still watching.
    pair(new_port, "true", "pong three", json!({"maxStepsPerTurn": 7})).write(dir.path())?;
    until("the whole service to start again", || {
        Ok(service_status(&state).is_ok_and(|now| now["startedAt"].as_u64() > status["startedAt"].as_u64()))
    })?;
    assert_eq!(service_status(&state)?["pid"], first["pid"]);
    assert!(post(new_port, "chat", "q1", "after")?.starts_with("HTTP/1.1 200"));
    until("a turn after the whole restart", || Ok(turns(dir.path(), &state, "quick", "q1")? == 5))?;
    Ok(())
}

/// The webhook Connection's signing secret, read from the environment.
const SIGNING_SECRET: &str = "restart-signing-secret-4d7e1f";

/// One agent behind a webhook Connection that accepts only requests signed
/// with [`SIGNING_SECRET`] (`WEBHOOK_SECRET` from `HOOK_SIGNING_SECRET`, a
/// variable gdn takes out of its environment): a restarted service that
/// lost its secrets would refuse to start, or refuse every request.
fn signed_bundle(dir: &Path, port: u16) {
    let port = port.to_string();
    let secrets = json!({"secrets": {"WEBHOOK_SECRET": {"valueFrom": {"env": "HOOK_SIGNING_SECRET"}}}});
    Bundle::new()
        .scripted_model("fast", [reply_text("pong")])
        .one_agent("pair", Agent::new("quick", "fast"))
        .connection("hook", "webhook", &[("WEBHOOK_PORT", &port)], secrets)
        .write(dir)
        .unwrap_or_else(|e| panic!("write the bundle: {e}"));
}

/// POSTs `input` for instance `key`, signed with `secret` (`X-Signature-256`);
/// the status line's code.
fn post_signed(port: u16, key: &str, input: &str, secret: &str) -> Result<u16, Box<dyn std::error::Error>> {
    use hmac::{KeyInit as _, Mac as _};
    let body = serde_json::json!({"instanceKey": key, "text": input});
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes())?;
    mac.update(body.to_string().as_bytes());
    let signature = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    let response = goondan_test_support::http::post_json(port, &[("x-signature-256", &signature)], &body)?;
    Ok(goondan_test_support::http::status(&response))
}

/// `gdn` with the signing secret (and a model key) in its environment.
fn gdn_with_secrets(dir: &Path, state: &Path) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_gdn"));
    command
        .arg("-c")
        .arg(dir)
        .env("GOONDAN_STATE_ROOT", state)
        .env("NO_COLOR", "1")
        .env("HOOK_SIGNING_SECRET", SIGNING_SECRET)
        .env("OPENAI_API_KEY", "sk-restart-model-key-8a2c")
        .stdin(std::process::Stdio::null());
    command
}

/// Restarts the service of `dir` three times in a row: each time the same
/// process serves again on the same port, with the signing secret (a
/// signed request is answered, an unsigned one refused), the conversation
/// goes on, and no secret is in its command line or environment. Then
/// `--fresh` clears the conversation. `pid` is the service's process.
fn restart_three_times_then_fresh(dir: &Path, state: &Path, port: u16, pid: u32) -> TestResult {
    assert_eq!(post_signed(port, "k", "hi", SIGNING_SECRET)?, 200);
    until("the first turn", || Ok(turns(dir, state, "quick", "k")? == 1))?;
    for round in 1..=3u64 {
        let before = service_status(state)?;
        let restarted = gdn(dir, state, &["restart", "--wait-secs", "60"])?;
        assert_eq!(restarted.status.code(), Some(0), "restart {round}: {}", text(&restarted.stderr));
        assert!(
            text(&restarted.stdout).contains(&format!("service restarted (pid {pid})")),
            "restart {round}: {}",
            text(&restarted.stdout)
        );
        let after = service_status(state)?;
        assert_eq!(after["pid"].as_u64(), Some(u64::from(pid)), "restart {round}: {after}");
        assert!(after["startedAt"].as_u64() > before["startedAt"].as_u64(), "restart {round}: {after}");
        assert_eq!(after["listening"], before["listening"], "restart {round}");
        for what in ["environ", "cmdline"] {
            let seen = std::fs::read(format!("/proc/{pid}/{what}"))?;
            assert!(
                !String::from_utf8_lossy(&seen).contains(SIGNING_SECRET),
                "restart {round}: the secret is in /proc/{pid}/{what}"
            );
        }
        assert_eq!(post_signed(port, "k", "wrong", "not-the-secret")?, 401, "restart {round}");
        // A signed body is its delivery's identity (a replay of one is dropped): each round's is new.
        assert_eq!(post_signed(port, "k", &format!("again {round}"), SIGNING_SECRET)?, 200, "restart {round}");
        until("the turn after the restart", || Ok(turns(dir, state, "quick", "k")? == round + 1))?;
    }
    let row = instance(dir, state, "quick", "k")?.ok_or("the instance is gone")?;
    assert_eq!(row["messages"].as_u64(), Some(8), "the conversation was kept: {row}");

    let fresh = gdn(dir, state, &["restart", "--fresh", "--wait-secs", "60"])?;
    assert_eq!(fresh.status.code(), Some(0), "{}", text(&fresh.stderr));
    assert_eq!(service_status(state)?["pid"].as_u64(), Some(u64::from(pid)));
    let row = instance(dir, state, "quick", "k")?.ok_or("the instance is gone")?;
    assert_eq!((row["turns"].as_u64(), row["messages"].as_u64()), (Some(0), Some(0)), "{row}");
    assert_eq!(post_signed(port, "k", "after fresh", SIGNING_SECRET)?, 200);
    until("a turn after --fresh", || Ok(turns(dir, state, "quick", "k")? == 1))?;
    Ok(())
}

#[test]
fn a_detached_service_with_secrets_restarts_again_and_again_in_its_process() -> TestResult {
    let (dir, state, port) = common::project_on_a_free_port(signed_bundle);
    let started = gdn_with_secrets(dir.path(), &state).args(["run", "--detach"]).output()?;
    assert_eq!(started.status.code(), Some(0), "{}", text(&started.stderr));
    let _running = Stopped { dir: dir.path().to_path_buf(), state: state.clone() };
    let pid = service_status(&state)?["pid"].as_u64().and_then(|pid| u32::try_from(pid).ok()).ok_or("no pid")?;
    restart_three_times_then_fresh(dir.path(), &state, port, pid)
}

#[test]
fn an_attached_service_with_secrets_restarts_again_and_again_in_its_process() -> TestResult {
    let (dir, state, port) = common::project_on_a_free_port(signed_bundle);
    let log = std::fs::File::create(dir.path().join("attached.log"))?;
    let mut service = gdn_with_secrets(dir.path(), &state).arg("run").stdout(log.try_clone()?).stderr(log).spawn()?;
    let _running = Stopped { dir: dir.path().to_path_buf(), state: state.clone() };
    until("the service to serve", || {
        Ok(service.try_wait()?.is_none() && service_status(&state).is_ok_and(|status| status["pid"] == service.id()))
    })?;
    let outcome = restart_three_times_then_fresh(dir.path(), &state, port, service.id());
    let stopped = gdn(dir.path(), &state, &["stop"])?;
    assert_eq!(stopped.status.code(), Some(0), "{}", text(&stopped.stderr));
    let ended = service.wait()?;
    let said = std::fs::read_to_string(dir.path().join("attached.log"))?;
    outcome.map_err(|error| format!("{error}\nthe service said:\n{said}"))?;
    assert_eq!(ended.code(), Some(0), "{said}");
    Ok(())
}

/// A webhook Connection `name` on `port` feeding `quick`, as a document of
/// its own.
fn connection_yaml(name: &str, port: u16) -> String {
    format!(
        "apiVersion: goondan.ai/v1\nkind: Connection\nmetadata:\n  name: {name}\nspec:\n  connectorRef: {{kind: Connector, name: webhook, package: \"@goondan/base\"}}\n  swarmRef: Swarm/pair\n  config:\n    WEBHOOK_PORT: {{value: \"{port}\"}}\n  ingress:\n    rules:\n      - route: {{agentRef: Agent/quick}}\n"
    )
}

#[test]
fn a_watched_split_bundle_follows_every_file_new_and_removed_ones_the_lock_file_and_its_dependencies() -> TestResult {
    let dir = tempfile::tempdir()?;
    let state = tempfile::tempdir()?;
    let state = state.path();
    let port = free_port()?;
    bundle(dir.path(), port, "true", "pong")?;
    let files = common::split_by_kind(dir.path())?;
    assert_eq!(files, ["agents.yaml", "connections.yaml", "models.yaml", "swarm.yaml"]);
    // A Package that depends on an installed package, pinned by the lock file.
    let fixtures = common::repo_path("crates/goondan-config/tests/fixtures/packages");
    let installed = state.join("packages/acme/greeter/1.0.0");
    goondan_test_support::bundle::copy_dir(&fixtures.join("greeter-1.0.0"), &installed)?;
    std::fs::copy(fixtures.join("with-dependency/goondan.lock.yaml"), dir.path().join("goondan.lock.yaml"))?;
    std::fs::write(
        dir.path().join("goondan.yaml"),
        "apiVersion: goondan.ai/v1\nkind: Package\nmetadata: {name: \"@test/split-watch\"}\nspec:\n  version: 0.1.0\n  dependencies: [{name: \"@acme/greeter\", version: \"^1.0.0\"}]\n",
    )?;
    let started = gdn(dir.path(), state, &["run", "--detach", "--watch"])?;
    assert_eq!(started.status.code(), Some(0), "{}", text(&started.stderr));
    let _running = Stopped { dir: dir.path().to_path_buf(), state: state.to_path_buf() };
    assert!(post(port, "chat", "q1", "hi")?.starts_with("HTTP/1.1 200"));
    until("the first turn", || Ok(turns(dir.path(), state, "quick", "q1")? == 1))?;

    // An edit of one split file: quick's Model.
    let models = dir.path().join("models.yaml");
    std::fs::write(&models, std::fs::read_to_string(&models)?.replacen("pong", "pong two", 1))?;
    until("quick's process to stop", || {
        Ok(instance(dir.path(), state, "quick", "q1")?.is_some_and(|row| row["running"] == false))
    })?;
    assert!(post(port, "chat", "q1", "again")?.starts_with("HTTP/1.1 200"));
    until("the edited answer", || Ok(log_text(state).is_ok_and(|log| log.contains("quick@q1 › pong two"))))?;

    // A split file in a new directory: its Connection starts.
    let new_port = free_port()?;
    std::fs::create_dir(dir.path().join("more"))?;
    std::fs::write(dir.path().join("more/connections.yaml"), connection_yaml("hook-two", new_port))?;
    until("the new Connection's connector", || Ok(TcpStream::connect(("127.0.0.1", new_port)).is_ok()))?;
    assert!(post(new_port, "chat", "q2", "through the new file")?.starts_with("HTTP/1.1 200"));
    until("a turn through the new Connection", || Ok(turns(dir.path(), state, "quick", "q2")? == 1))?;

    // The file removed: its Connection stops, the first one still serves.
    std::fs::remove_file(dir.path().join("more/connections.yaml"))?;
    until("the removed Connection's connector to stop", || Ok(TcpStream::connect(("127.0.0.1", new_port)).is_err()))?;
    assert!(post(port, "chat", "q1", "still")?.starts_with("HTTP/1.1 200"));
    until("a turn after the removal", || Ok(turns(dir.path(), state, "quick", "q1")? == 3))?;

    // The installed dependency changes: everything restarts, in the service's process.
    let before = service_status(state)?;
    let tool = installed.join("src/greet.ts");
    std::fs::write(&tool, std::fs::read_to_string(&tool)?.replace("Hello", "Hi"))?;
    until("the whole service to start again after the dependency changed", || {
        Ok(service_status(state).is_ok_and(|now| now["startedAt"].as_u64() > before["startedAt"].as_u64()))
    })?;
    assert!(log_text(state)?.contains("package @acme/greeter changed"), "{}", log_text(state)?);
    assert_eq!(service_status(state)?["pid"], before["pid"]);

    // The lock file changes: everything restarts again.
    let before = service_status(state)?;
    let lock = dir.path().join("goondan.lock.yaml");
    std::fs::write(&lock, format!("# relocked\n{}", std::fs::read_to_string(&lock)?))?;
    until("the whole service to start again after the lock file changed", || {
        Ok(service_status(state).is_ok_and(|now| now["startedAt"].as_u64() > before["startedAt"].as_u64()))
    })?;
    assert!(post(port, "chat", "q1", "after")?.starts_with("HTTP/1.1 200"));
    until("a turn after the whole restarts", || Ok(turns(dir.path(), state, "quick", "q1")? == 4))?;
    Ok(())
}
