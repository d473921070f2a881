//! Helpers shared by the `gdn` integration tests.

/// Whether a JavaScript runtime is usable here; with `GOONDAN_REQUIRE_JS=1`
/// (CI) its absence fails the test instead of skipping the script part.
#[allow(dead_code)]
pub fn js_runtime_usable() -> bool {
    match goondan_script::JsRuntime::discover(&|name: &str| std::env::var(name).ok()) {
        Ok(_) => true,
        Err(error) => goondan_test_support::skip_unless_required::<()>(
            "GOONDAN_REQUIRE_JS",
            None,
            &format!("no JavaScript runtime is usable for the script-tool part: {error}"),
            "no JavaScript runtime (Bun, or Node >= 22.6)",
        )
        .is_some(),
    }
}

/// Adds a skipped test to the log that `scripts/cargo-runner` counts
/// (the one `record_skip` of `goondan-test-support`).
#[allow(dead_code)]
pub fn record_skip(reason: &str) {
    goondan_test_support::record_skip(None, reason);
}

/// A NATS server with JetStream for the multi-host tests.
pub mod nats;

/// A path in the repository.
#[allow(dead_code)] // Not every test crate that shares this module uses it.
pub fn repo_path(relative: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative)
}

/// Skips (after saying why) a test whose MCP peer is missing, or, with
/// `GOONDAN_REQUIRE_MCP=1` (CI), fails it.
#[allow(dead_code)]
fn mcp_peer_missing<T>(problem: &str) -> Option<T> {
    goondan_test_support::skip_unless_required(
        "GOONDAN_REQUIRE_MCP",
        None,
        problem,
        "an MCP peer is missing (server-everything, the Python MCP SDK or mcp-server-time)",
    )
}

/// The entry script of the MCP project's reference server "everything"
/// (`GOONDAN_TEST_MCP_EVERYTHING`, which `.ci/run` sets, or the cache
/// folder), or `None` to skip.
#[allow(dead_code)]
pub fn mcp_everything_server() -> Option<std::path::PathBuf> {
    use std::process::{Command, Stdio};
    let entry = std::env::var_os("GOONDAN_TEST_MCP_EVERYTHING")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| repo_path(".cache/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js"));
    let node = Command::new("node").arg("--version").stdout(Stdio::null()).status().is_ok_and(|s| s.success());
    if !entry.is_file() {
        mcp_peer_missing(&format!("the MCP server 'everything' is not installed at {} (see .ci/run)", entry.display()))
    } else if !node {
        mcp_peer_missing("no 'node' on PATH to run the MCP server 'everything'")
    } else {
        Some(entry)
    }
}

/// A Python that imports the official MCP SDK (`GOONDAN_TEST_MCP_PYTHON`,
/// which `.ci/run` sets, or the cache's virtualenv), or `None` to skip.
#[allow(dead_code)]
pub fn mcp_python() -> Option<std::path::PathBuf> {
    python_importing("mcp", "the MCP SDK", ".ci/run")
}

/// A Python with fastmcp and fastmcp-tasks (a client of the MCP tasks
/// extension; the same `GOONDAN_TEST_MCP_PYTHON` or cache virtualenv, where
/// scripts/test installs them), or `None` to skip.
#[allow(dead_code)]
pub fn mcp_tasks_python() -> Option<std::path::PathBuf> {
    python_importing("fastmcp, fastmcp_tasks", "fastmcp and fastmcp-tasks", "scripts/test")
}

/// `GOONDAN_TEST_MCP_PYTHON` (or the cache's virtualenv) if it can
/// `import modules`; `None` to skip (saying what is missing and where
/// `setup` installs it) otherwise.
#[allow(dead_code)]
fn python_importing(modules: &str, what: &str, setup: &str) -> Option<std::path::PathBuf> {
    use std::process::{Command, Stdio};
    let python = std::env::var_os("GOONDAN_TEST_MCP_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| repo_path(".cache/py/bin/python"));
    let imports = Command::new(&python)
        .args(["-c", &format!("import {modules}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if imports {
        return Some(python);
    }
    mcp_peer_missing(&format!(
        "no Python with {what} at {} (set GOONDAN_TEST_MCP_PYTHON, or see {setup})",
        python.display()
    ))
}

/// The MCP project's Python time server (PyPI `mcp-server-time`;
/// `GOONDAN_TEST_MCP_TIME`, which `.ci/run` sets, or the cache's
/// virtualenv), or `None` to skip.
#[allow(dead_code)]
pub fn mcp_time_server() -> Option<std::path::PathBuf> {
    let program = std::env::var_os("GOONDAN_TEST_MCP_TIME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| repo_path(".cache/py/bin/mcp-server-time"));
    if program.is_file() {
        return Some(program);
    }
    mcp_peer_missing(&format!(
        "the MCP server 'mcp-server-time' is not installed at {} (see .ci/run)",
        program.display()
    ))
}

/// The directory of the agent instance `name` (`<agent>@<key>`, encoded)
/// in whichever workspace of the state root `state` holds it (a test's
/// state root holds one bundle's); where it would be in a workspace
/// `default` if none does yet.
#[allow(dead_code)]
pub fn instance_path(state: &std::path::Path, name: &str) -> std::path::PathBuf {
    let workspaces = state.join("workspaces");
    std::fs::read_dir(&workspaces)
        .into_iter()
        .flatten()
        .flatten()
        .map(|workspace| workspace.path().join("instances").join(name))
        .find(|dir| dir.exists())
        .unwrap_or_else(|| workspaces.join("default/instances").join(name))
}

/// Driving a service as a user does: `gdn` in a project with its own
/// state root, JSON posted to a webhook Connection, waits with a deadline,
/// and the service stopped when the test ends.
#[allow(dead_code)]
pub mod service {
    use std::net::TcpListener;
    use std::path::{Path, PathBuf};
    use std::process::{Command, Output, Stdio};
    use std::time::{Duration, Instant};

    /// What a test returns.
    pub type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// How long [`until`] waits.
    pub const WAIT: Duration = Duration::from_secs(60);

    /// A port free on 127.0.0.1 now.
    pub fn free_port() -> Result<u16, std::io::Error> {
        TcpListener::bind("127.0.0.1:0")?.local_addr().map(|a| a.port())
    }

    /// `gdn -c DIR ARGS` with `GOONDAN_STATE_ROOT=STATE`, no colours, no input.
    pub fn gdn(dir: &Path, state: &Path, args: &[&str]) -> Result<Output, std::io::Error> {
        Command::new(env!("CARGO_BIN_EXE_gdn"))
            .arg("-c")
            .arg(dir)
            .args(args)
            .env("GOONDAN_STATE_ROOT", state)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .output()
    }

    /// POSTs `body` to the webhook on `port`; the whole response.
    pub fn post(port: u16, body: &serde_json::Value) -> Result<String, std::io::Error> {
        goondan_test_support::http::post_json(port, &[], body)
    }

    /// Polls `done` every 50 ms until it holds, for at most [`WAIT`].
    pub fn until(what: &str, mut done: impl FnMut() -> Result<bool, Box<dyn std::error::Error>>) -> TestResult {
        let deadline = Instant::now() + WAIT;
        while !done()? {
            if Instant::now() > deadline {
                return Err(format!("timed out waiting for {what}").into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The messages of the conversation in `instance_dir`, each as JSON text
    /// (commits of several message events unfolded).
    pub fn conversation(instance_dir: &Path) -> Vec<String> {
        let text = std::fs::read_to_string(instance_dir.join("messages.jsonl")).unwrap_or_default();
        let mut all = Vec::new();
        for line in text.lines() {
            let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else { continue };
            match value.get("events").and_then(serde_json::Value::as_array) {
                Some(events) => all.extend(events.iter().filter_map(|e| e.get("message").map(ToString::to_string))),
                None => all.push(value.to_string()),
            }
        }
        all
    }

    /// The one-agent service of the task tests: agent `worker` in the
    /// Swarm `jobs`, fed by a webhook.
    pub mod jobs {
        use std::path::{Path, PathBuf};

        /// POSTs `input` for the instance `key`; the whole response.
        pub fn post(port: u16, key: &str, input: &str) -> Result<String, std::io::Error> {
            super::post(port, &serde_json::json!({"instanceKey": key, "text": input}))
        }

        /// The directory of `worker@key`.
        pub fn instance_dir(state: &Path, key: &str) -> PathBuf {
            state.join("workspaces").join("jobs").join("instances").join(format!("worker@{key}"))
        }

        /// The conversation's messages as stored, each as JSON text.
        pub fn texts(state: &Path, key: &str) -> Vec<String> {
            super::conversation(&instance_dir(state, key))
        }

        /// How many of the conversation's messages hold `needle`.
        pub fn count(state: &Path, key: &str, needle: &str) -> usize {
            texts(state, key).iter().filter(|text| text.contains(needle)).count()
        }
    }

    /// `gdn run --detach` in the project `dir` with the state root `state`:
    /// an error (with what `gdn` said) unless it started; the service
    /// stopped when the result is dropped.
    pub fn detach(dir: &Path, state: &Path) -> Result<Stopped, Box<dyn std::error::Error>> {
        let started = gdn(dir, state, &["run", "--detach"])?;
        if started.status.code() != Some(0) {
            let said = String::from_utf8_lossy(&started.stderr);
            return Err(format!("gdn run --detach ended {}: {said}", started.status).into());
        }
        Ok(Stopped { dir: dir.to_path_buf(), state: state.to_path_buf() })
    }

    /// The row of `agent@key` in `gdn instance list --json`, if any.
    pub fn instance(
        dir: &Path,
        state: &Path,
        agent: &str,
        key: &str,
    ) -> Result<Option<serde_json::Value>, std::io::Error> {
        let listed = gdn(dir, state, &["instance", "list", "--json"])?;
        let rows: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap_or_default();
        Ok(rows
            .as_array()
            .into_iter()
            .flatten()
            .find(|row| row["agentName"] == agent && row["instanceKey"] == key)
            .cloned())
    }

    /// How many turns `agent@key` ran (0: none, or no such instance).
    pub fn turns(dir: &Path, state: &Path, agent: &str, key: &str) -> Result<u64, std::io::Error> {
        Ok(instance(dir, state, agent, key)?.and_then(|row| row["turns"].as_u64()).unwrap_or(0))
    }

    /// Stops the project's service when dropped, whatever happened.
    pub struct Stopped {
        /// The project.
        pub dir: PathBuf,
        /// Its state root.
        pub state: PathBuf,
    }

    impl Drop for Stopped {
        fn drop(&mut self) {
            let _ = gdn(&self.dir, &self.state, &["stop"]);
        }
    }
}

/// A bundle whose OpenAI model (`endpoint`) reads its key from the variable
/// `key_env`, and whose agent `a` has `bash` and the JavaScript tool `peek`
/// (`peek.ts`, whose `env` shows what the script host's environment holds);
/// the agent's `sandbox` is `sandbox` unless null.
#[allow(dead_code)]
pub fn peek_bundle(
    endpoint: &str,
    key_env: &str,
    peek_ts: &str,
    sandbox: serde_json::Value,
) -> goondan_test_support::Bundle {
    use goondan_test_support::{Agent, Bundle};
    use serde_json::json;
    let bash = json!({"ref": {"kind": "Tool", "name": "bash", "package": "@goondan/base"}});
    let mut agent = Agent::new("a", "local").tool(bash).tool("Tool/peek");
    if !sandbox.is_null() {
        agent = agent.with("sandbox", sandbox);
    }
    let exports = json!([{"name": "env", "description": "What the script host's environment holds."}]);
    Bundle::new()
        .openai_model("local", "local-model", endpoint, key_env)
        .agent(agent)
        .resource("Tool", "peek", json!({"entry": "./peek.ts", "exports": exports}))
        .file("peek.ts", peek_ts)
}

/// This test binary's `gdn`, through the one process harness.
#[allow(dead_code)]
pub fn gdn_bin() -> goondan_test_support::Gdn {
    goondan_test_support::Gdn::new(env!("CARGO_BIN_EXE_gdn"))
}

/// Applies one line of a `messages.jsonl` (a commit of message events, or a
/// bare message) to `messages`, as the conversation store replays it.
#[allow(dead_code)]
pub fn apply_commit(messages: &mut Vec<serde_json::Value>, line: &serde_json::Value) {
    let events = match line.get("events").and_then(serde_json::Value::as_array) {
        Some(events) => events.clone(),
        None => vec![serde_json::json!({"type": "append", "message": line})],
    };
    for event in events {
        match event["type"].as_str() {
            Some("append") => messages.push(event["message"].clone()),
            Some("remove") => messages.retain(|m| m["id"] != event["targetId"]),
            Some("replace") => {
                for message in messages.iter_mut() {
                    if message["id"] == event["targetId"] {
                        *message = event["message"].clone();
                    }
                }
            }
            Some("truncate") => messages.clear(),
            _ => {}
        }
    }
}

/// The records of the inbox of the workspace `workspace`: accepted keys by
/// seq, and how often each seq was done.
#[allow(dead_code)]
pub fn inbox_records(
    workspace: &std::path::Path,
) -> (std::collections::BTreeMap<u64, String>, std::collections::HashMap<u64, usize>) {
    let text = std::fs::read_to_string(workspace.join("ingress/inbox.jsonl")).unwrap_or_default();
    let mut accepted = std::collections::BTreeMap::new();
    let mut done: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for line in text.lines() {
        let Ok(record) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let seq = record["seq"].as_u64().unwrap_or(0);
        match record["op"].as_str() {
            Some("accept") => {
                accepted.insert(seq, record["key"].as_str().unwrap_or_default().to_owned());
            }
            Some("done") => *done.entry(seq).or_default() += 1,
            _ => {}
        }
    }
    (accepted, done)
}

/// A new temporary directory; a test failure if there is none.
#[allow(dead_code)]
pub fn temp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"))
}

/// Writes `content` to `path`; a test failure if it cannot.
#[allow(dead_code)]
pub fn write(path: &std::path::Path, content: &str) {
    std::fs::write(path, content).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// Processes as the tests watch them: by pid, through `/proc`.
#[allow(dead_code)]
pub mod procs {
    use std::path::Path;
    use std::time::{Duration, Instant};

    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    /// Whether `pid` has ended (gone, or a zombie).
    pub fn is_gone(pid: u32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/status")) {
            Err(_) => true,
            Ok(status) => status.lines().any(|line| line.starts_with("State:") && line.contains('Z')),
        }
    }

    /// Waits up to 10 s for `pid` (`what`) to end; else kills it and fails
    /// the test, saying it outlived `owner`.
    pub fn wait_gone(pid: u32, what: &str, owner: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !is_gone(pid) {
            if Instant::now() > deadline {
                let _ = kill(Pid::from_raw(i32::try_from(pid).unwrap_or(0)), Signal::SIGKILL);
                panic!("{what} ({pid}) outlived {owner}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The pid written into `path`, waiting up to `timeout` for it; a test
    /// failure if it never appears.
    pub fn read_pid(path: &Path, timeout: Duration) -> u32 {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(pid) = std::fs::read_to_string(path).ok().and_then(|text| text.trim().parse().ok()) {
                return pid;
            }
            assert!(Instant::now() < deadline, "{} never appeared", path.display());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The task book of the instance in `instance_dir` (`tasks.jsonl`): its
/// text (empty when missing), for messages, and its records (unreadable
/// lines skipped).
#[allow(dead_code)]
pub fn task_book(instance_dir: &std::path::Path) -> (String, Vec<serde_json::Value>) {
    let text = std::fs::read_to_string(instance_dir.join("tasks.jsonl")).unwrap_or_default();
    let records = text.lines().filter_map(|line| serde_json::from_str(line).ok()).collect();
    (text, records)
}

/// The records of `book` with `op` (`open`, `end`, `received`).
#[allow(dead_code)]
pub fn task_ops<'a>(book: &'a [serde_json::Value], op: &str) -> Vec<&'a serde_json::Value> {
    book.iter().filter(|record| record["op"] == op).collect()
}

/// Every file below `dir`, at any depth (none when it cannot be read).
#[allow(dead_code)]
pub fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// The tasks of the instance in `instance_dir`, each its `open` record's
/// task folded with its `end` (`state`, `result`, `reason`) and its
/// delivery (`received: true`), in the order they opened.
#[allow(dead_code)]
pub fn tasks_by_handle(instance_dir: &std::path::Path) -> Vec<serde_json::Value> {
    let (_, records) = task_book(instance_dir);
    let mut by_handle: Vec<serde_json::Value> = Vec::new();
    for record in records {
        match record["op"].as_str() {
            Some("open") => by_handle.push(record["task"].clone()),
            Some(op) => {
                if let Some(task) = by_handle.iter_mut().find(|t| t["handle"] == record["handle"]) {
                    if op == "end" {
                        task["state"] = record["state"].clone();
                        task["result"] = record["result"].clone();
                        task["reason"] = record["reason"].clone();
                    } else {
                        task["received"] = serde_json::Value::Bool(true);
                    }
                }
            }
            None => {}
        }
    }
    by_handle
}

/// A new project whose bundle `write` writes for a port free now: the
/// project, its state root (`state` inside it) and the port; a test
/// failure if there is no directory or port.
#[allow(dead_code)]
pub fn project_on_a_free_port(
    write: impl FnOnce(&std::path::Path, u16),
) -> (tempfile::TempDir, std::path::PathBuf, u16) {
    let dir = temp();
    let state = dir.path().join("state");
    let port = goondan_test_support::free_port().unwrap_or_else(|e| panic!("a free port: {e}"));
    write(dir.path(), port);
    (dir, state, port)
}

/// Splits `dir`'s goondan.yaml (as `goondan_test_support::Bundle` writes
/// it) into the files the original runtime reads, one per kind:
/// `models.yaml`, `agents.yaml`, `tools.yaml`, `swarm.yaml`,
/// `connections.yaml`, … (the Package stays in goondan.yaml, which is
/// removed when nothing stays). The names of the files written, sorted.
#[allow(dead_code)]
pub fn split_by_kind(dir: &std::path::Path) -> std::io::Result<Vec<String>> {
    use std::collections::BTreeMap;
    let text = std::fs::read_to_string(dir.join("goondan.yaml"))?;
    let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for document in text.split("\n---\n") {
        let kind = document.lines().find_map(|line| line.strip_prefix("kind: ")).unwrap_or("Resource").trim();
        let file = match kind.trim_matches('"') {
            "Package" => "goondan.yaml",
            "Model" => "models.yaml",
            "Agent" => "agents.yaml",
            "Tool" => "tools.yaml",
            "Extension" => "extensions.yaml",
            "Connector" => "connectors.yaml",
            "Connection" => "connections.yaml",
            "Swarm" => "swarm.yaml",
            _ => "resources.yaml",
        };
        files.entry(file.to_owned()).or_default().push(document.trim_end().to_owned());
    }
    std::fs::remove_file(dir.join("goondan.yaml"))?;
    for (file, documents) in &files {
        std::fs::write(dir.join(file), documents.join("\n---\n") + "\n")?;
    }
    Ok(files.into_keys().collect())
}
