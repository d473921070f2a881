//! `gdn instance list|delete` over a state root of several agents'
//! instances, some of them running, and an old-layout directory that
//! `gdn run` migrates.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use goondan_core::{Message, MessageData, MessageSource};
use goondan_runtime::store::{InstanceStore, StateRoot};
use serde_json::Value;

fn must<T, E: std::fmt::Display>(result: Result<T, E>) -> T {
    result.unwrap_or_else(|error| panic!("{error}"))
}

fn gdn(state: &Path, args: &[&str]) -> Output {
    must(
        Command::new(env!("CARGO_BIN_EXE_gdn"))
            .arg("--state-root")
            .arg(state)
            .args(args)
            .env("NO_COLOR", "1")
            .env_remove("GOONDAN_LOG")
            .stdin(Stdio::null())
            .output(),
    )
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn user(text: &str) -> Message {
    Message::new(MessageData::User { content: text.to_owned() }, MessageSource::User)
}

/// Opens (creating) the instance of `agent` for `key` with `messages` in it.
fn instance(root: &StateRoot, agent: &str, key: &str, messages: usize) -> InstanceStore {
    let mut store = must(InstanceStore::open(root, key, agent, Path::new("/bundles/team")));
    for n in 0..messages {
        must(store.append(&[user(&format!("message {n}"))]));
    }
    store
}

/// Moves an instance's directory to the old layout's name (the key alone),
/// as a version from before agent instances left it.
fn to_old_layout(store: InstanceStore) -> PathBuf {
    let dir = store.dir().to_path_buf();
    drop(store);
    let name = dir.file_name().and_then(|name| name.to_str()).unwrap_or_default();
    let Some((_, key)) = name.split_once('@') else { panic!("{dir:?}") };
    let old = dir.with_file_name(key);
    must(std::fs::rename(&dir, &old));
    old
}

fn listed(state: &Path) -> Vec<Value> {
    let output = gdn(state, &["--json", "instance", "list"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let value: Value = must(serde_json::from_slice(&output.stdout));
    value.as_array().cloned().unwrap_or_default()
}

fn summary(listed: &[Value]) -> Vec<(String, String, bool)> {
    let mut rows: Vec<(String, String, bool)> = listed
        .iter()
        .map(|item| {
            (
                item["agentName"].as_str().unwrap_or_default().to_owned(),
                item["instanceKey"].as_str().unwrap_or_default().to_owned(),
                item["running"].as_bool().unwrap_or_default(),
            )
        })
        .collect();
    rows.sort();
    rows
}

fn row(agent: &str, key: &str, running: bool) -> (String, String, bool) {
    (agent.to_owned(), key.to_owned(), running)
}

#[test]
fn list_shows_each_agents_instance_and_which_ones_run() {
    let state = must(tempfile::tempdir());
    let root = StateRoot::new(state.path());
    let output = gdn(state.path(), &["instance", "list"]);
    assert_eq!(output.status.code(), Some(0));
    assert!(text(&output.stdout).starts_with("no instances in "), "{}", text(&output.stdout));

    let assistant = instance(&root, "assistant", "default", 3);
    let planner = instance(&root, "planner", "default", 1);
    let old = to_old_layout(instance(&root, "coder", "user:7", 2));
    // This process runs the planner's instance; `gdn` is another process.
    let held = must(planner.lock());
    let pid = std::process::id();

    let items = listed(state.path());
    assert_eq!(
        summary(&items),
        [row("assistant", "default", false), row("coder", "user:7", false), row("planner", "default", true)]
    );
    for item in &items {
        let running = item["running"].as_bool().unwrap_or_default();
        assert_eq!(item["pid"], if running { Value::from(pid) } else { Value::Null }, "{item}");
        let old_layout = item["agentName"] == "coder";
        assert_eq!(item["legacyLayout"], old_layout, "{item}");
        assert_eq!(
            item["dir"].as_str().map(PathBuf::from),
            Some(if old_layout {
                old.clone()
            } else {
                root.instances_dir().join(format!("{}@default", item["agentName"].as_str().unwrap_or_default()))
            })
        );
    }
    let assistant_item = items.iter().find(|item| item["agentName"] == "assistant").cloned().unwrap_or_default();
    assert_eq!((assistant_item["messages"].as_u64(), assistant_item["turns"].as_u64()), (Some(3), Some(0)));

    let output = gdn(state.path(), &["instance", "list"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let table = text(&output.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header, ["AGENT", "INSTANCE", "STATUS", "TURNS", "MESSAGES", "UPDATED", "BUNDLE"]);
    let planner_line = lines.iter().find(|line| line.starts_with("planner")).copied().unwrap_or_default();
    assert!(planner_line.contains(&format!("running (pid {pid})")), "{table}");
    assert!(planner_line.contains("just now") && planner_line.ends_with("/bundles/team"), "{table}");
    let assistant_line = lines.iter().find(|line| line.starts_with("assistant")).copied().unwrap_or_default();
    let cells: Vec<&str> = assistant_line.split_whitespace().collect();
    assert_eq!(cells[..5], ["assistant", "default", "idle", "0", "3"], "{table}");
    // Columns line up: every row's STATUS starts where the header's does.
    let status_at = lines[0].find("STATUS").unwrap_or_default();
    let aligned =
        |line: &&str| line.get(status_at..).is_some_and(|rest| rest.starts_with("idle") || rest.starts_with("running"));
    assert!(lines[1..].iter().all(aligned), "{table}");

    drop(held);
    drop(assistant);
    let items = listed(state.path());
    assert!(items.iter().all(|item| item["running"] == false && item["pid"].is_null()), "{items:?}");
}

#[test]
fn delete_removes_every_agents_instance_of_a_key_unless_one_runs() {
    let state = must(tempfile::tempdir());
    let root = StateRoot::new(state.path());
    let assistant = instance(&root, "assistant", "default", 1);
    let planner = instance(&root, "planner", "default", 1);
    let coder = to_old_layout(instance(&root, "coder", "default", 1));
    let other = instance(&root, "assistant", "other", 1);
    let dirs = [assistant.dir().to_path_buf(), planner.dir().to_path_buf(), coder.clone()];

    // The planner runs: nothing is deleted, with or without --agent.
    let held = must(planner.lock());
    let pid = std::process::id();
    for args in [&["instance", "delete", "default"][..], &["instance", "delete", "default", "--agent", "planner"]] {
        let output = gdn(state.path(), args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("'planner'") && stderr.contains(&format!("pid {pid}")), "{stderr}");
        assert!(stderr.contains("nothing was deleted"), "{stderr}");
        assert!(dirs.iter().all(|dir| dir.is_dir()), "{args:?}");
    }
    // --agent deletes that agent's instance alone, even while another runs.
    let output = gdn(state.path(), &["instance", "delete", "default", "--agent", "coder"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout).trim(), "✓ deleted instance 'default' of agent 'coder'");
    assert!(!coder.exists());
    drop(held);

    let output = gdn(state.path(), &["instance", "delete", "default"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    assert!(
        stdout.contains("'default' of agent 'assistant'") && stdout.contains("'default' of agent 'planner'"),
        "{stdout}"
    );
    assert!(dirs.iter().all(|dir| !dir.exists()));
    assert!(other.dir().is_dir(), "another key's instance stays");
    assert_eq!(summary(&listed(state.path())), [row("assistant", "other", false)]);

    // Unknown instances.
    let output = gdn(state.path(), &["instance", "delete", "default"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("no instance 'default' in "), "{}", text(&output.stderr));
    let output = gdn(state.path(), &["instance", "delete", "other", "--agent", "planner"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("no instance 'other' of agent 'planner'"), "{}", text(&output.stderr));
    let output = gdn(state.path(), &["instance", "delete", ".."]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));

    let output = gdn(state.path(), &["--json", "instance", "delete", "other"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let body: Value = must(serde_json::from_slice(&output.stdout));
    assert_eq!(body[0]["agentName"], "assistant");
    assert_eq!(body[0]["instanceKey"], "other");
    assert!(!other.dir().exists());
}

#[test]
fn gdn_run_moves_an_old_layout_instance_and_continues_its_conversation() {
    let state = must(tempfile::tempdir());
    let work = must(tempfile::tempdir());
    let root = StateRoot::new(state.path());
    let old = to_old_layout(instance(&root, "assistant", "default", 2));
    assert_eq!(old, state.path().join("instances/default"));

    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/quickstart");
    let workdir = work.path().to_string_lossy().into_owned();
    let output = gdn(
        state.path(),
        &["-c", example.to_str().unwrap_or_default(), "run", "--input", "Take notes", "--workdir", &workdir],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(!old.exists());
    let log = state.path().join("instances/assistant@default/messages.jsonl");
    let loaded = must(goondan_runtime::store::read_message_log(&log));
    let messages = loaded.state.messages();
    // The two old messages, then the turn's nine.
    assert_eq!(messages.len(), 11);
    assert_eq!(messages.first().map(|m| &m.data), Some(&user("message 0").data));
    let items = listed(state.path());
    assert_eq!(summary(&items), [row("assistant", "default", false)]);
    assert_eq!(items[0]["legacyLayout"], false);
    assert_eq!(items[0]["turns"], 1);
}
