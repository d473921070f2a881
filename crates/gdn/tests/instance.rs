//! `gdn instance list|delete` over a state root of several projects'
//! workspaces, some instances running, and instances of the old layouts
//! that `gdn run` moves into their bundle's workspace.

mod common;
use goondan_test_support::text;

use std::path::{Path, PathBuf};
use std::process::Output;

use goondan_core::{Message, MessageData, MessageSource};
use goondan_runtime::store::{InstanceStore, StateRoot, Workspace, WorkspaceAccess, open_workspace};
use serde_json::Value;

fn must<T, E: std::fmt::Display>(result: Result<T, E>) -> T {
    result.unwrap_or_else(|error| panic!("{error}"))
}

fn gdn(state: &Path, args: &[&str]) -> Output {
    common::gdn_bin().state_arg(state).run(args)
}

fn user(text: &str) -> Message {
    Message::new(MessageData::User { content: text.to_owned() }, MessageSource::User)
}

/// The workspace `name` of the bundle `bundle`, created.
fn workspace(state: &Path, name: &str, bundle: &str) -> Workspace {
    must(open_workspace(&StateRoot::new(state), name, bundle, WorkspaceAccess::Use))
}

/// Opens (creating) the instance of `agent` for `key` with `messages` in it.
fn instance(workspace: &Workspace, agent: &str, key: &str, messages: usize, bundle: &str) -> InstanceStore {
    let mut store = must(InstanceStore::open(workspace, key, agent, Path::new(bundle)));
    for n in 0..messages {
        must(store.append(&[user(&format!("message {n}"))]));
    }
    store
}

/// An instance as a version before workspaces left it: written by `bundle`,
/// directly under `<state>/instances/`, as `<agent>@<key>` or (`oldest`,
/// before agent instances) `<key>`.
fn old_layout(state: &Path, agent: &str, key: &str, messages: usize, bundle: &str, oldest: bool) -> PathBuf {
    let scratch = must(tempfile::tempdir());
    let store = instance(&Workspace::at(scratch.path()), agent, key, messages, bundle);
    let dir = store.dir().to_path_buf();
    drop(store);
    let name = dir.file_name().and_then(|name| name.to_str()).unwrap_or_default().to_owned();
    let Some((_, encoded_key)) = name.split_once('@') else { panic!("{dir:?}") };
    let old = state.join("instances").join(if oldest { encoded_key } else { name.as_str() });
    must(std::fs::create_dir_all(state.join("instances")));
    must(std::fs::rename(&dir, &old));
    old
}

fn listed(state: &Path) -> Vec<Value> {
    let output = gdn(state, &["--json", "instance", "list"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let value: Value = must(serde_json::from_slice(&output.stdout));
    value.as_array().cloned().unwrap_or_default()
}

/// (workspace or "-", agent, key, running), sorted.
fn summary(listed: &[Value]) -> Vec<(String, String, String, bool)> {
    let mut rows: Vec<_> = listed
        .iter()
        .map(|item| {
            (
                item["workspace"].as_str().unwrap_or("-").to_owned(),
                item["agentName"].as_str().unwrap_or_default().to_owned(),
                item["instanceKey"].as_str().unwrap_or_default().to_owned(),
                item["running"].as_bool().unwrap_or_default(),
            )
        })
        .collect();
    rows.sort();
    rows
}

fn row(workspace: &str, agent: &str, key: &str, running: bool) -> (String, String, String, bool) {
    (workspace.to_owned(), agent.to_owned(), key.to_owned(), running)
}

const TEAM: &str = "/bundles/team/goondan.yaml";
const SOLO: &str = "/bundles/solo/goondan.yaml";

#[test]
fn list_shows_each_instances_project_and_which_ones_run() {
    let state = must(tempfile::tempdir());
    let output = gdn(state.path(), &["instance", "list"]);
    assert_eq!(output.status.code(), Some(0));
    assert!(text(&output.stdout).starts_with("no instances in "), "{}", text(&output.stdout));

    let crew = workspace(state.path(), "crew", TEAM);
    let solo = workspace(state.path(), "solo", SOLO);
    let assistant = instance(&crew, "assistant", "default", 3, TEAM);
    let planner = instance(&crew, "planner", "default", 1, TEAM);
    let _alone = instance(&solo, "assistant", "default", 2, SOLO);
    let old = old_layout(state.path(), "coder", "user:7", 2, "/bundles/old/goondan.yaml", true);
    // This process runs the planner's instance; `gdn` is another process.
    let held = must(planner.lock());
    let pid = std::process::id();

    let items = listed(state.path());
    assert_eq!(
        summary(&items),
        [
            row("-", "coder", "user:7", false),
            row("crew", "assistant", "default", false),
            row("crew", "planner", "default", true),
            row("solo", "assistant", "default", false),
        ]
    );
    for item in &items {
        let running = item["running"].as_bool().unwrap_or_default();
        assert_eq!(item["pid"], if running { Value::from(pid) } else { Value::Null }, "{item}");
        let old_layout = item["agentName"] == "coder";
        assert_eq!(item["legacyLayout"], old_layout, "{item}");
        let expected = match item["workspace"].as_str() {
            None => old.clone(),
            Some(id) => state
                .path()
                .join("workspaces")
                .join(id)
                .join("instances")
                .join(format!("{}@default", item["agentName"].as_str().unwrap_or_default())),
        };
        assert_eq!(item["dir"].as_str().map(PathBuf::from), Some(expected), "{item}");
        let bundle = match item["workspace"].as_str() {
            Some("crew") => Value::from(TEAM),
            Some(_) => Value::from(SOLO),
            None => Value::Null,
        };
        assert_eq!(item["workspaceBundle"], bundle, "{item}");
    }
    let assistant_item = items.iter().find(|item| item["agentName"] == "assistant" && item["workspace"] == "crew");
    let assistant_item = assistant_item.cloned().unwrap_or_default();
    assert_eq!((assistant_item["messages"].as_u64(), assistant_item["turns"].as_u64()), (Some(3), Some(0)));

    let output = gdn(state.path(), &["instance", "list"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let table = text(&output.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 5, "{table}");
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        ["WORKSPACE", "AGENT", "INSTANCE", "STATUS", "TURNS", "MESSAGES", "PENDING", "UPDATED", "BUNDLE"]
    );
    let planner_line = lines.iter().find(|line| line.contains(" planner ")).copied().unwrap_or_default();
    assert!(planner_line.starts_with("crew "), "{table}");
    assert!(planner_line.contains(&format!("running (pid {pid})")), "{table}");
    assert!(planner_line.contains("just now") && planner_line.ends_with(TEAM), "{table}");
    let solo_line = lines.iter().find(|line| line.starts_with("solo ")).copied().unwrap_or_default();
    let cells: Vec<&str> = solo_line.split_whitespace().collect();
    assert_eq!(cells[..7], ["solo", "assistant", "default", "idle", "0", "2", "0"], "{table}");
    assert!(solo_line.ends_with(SOLO), "{table}");
    let old_line = lines.iter().find(|line| line.contains(" coder ")).copied().unwrap_or_default();
    assert!(old_line.starts_with("(old layout)") && old_line.ends_with("/bundles/old/goondan.yaml"), "{table}");
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
fn delete_works_in_one_project_and_deletes_nothing_while_an_instance_runs() {
    let state = must(tempfile::tempdir());
    let crew = workspace(state.path(), "crew", TEAM);
    let solo = workspace(state.path(), "solo", SOLO);
    let assistant = instance(&crew, "assistant", "default", 1, TEAM);
    let planner = instance(&crew, "planner", "default", 1, TEAM);
    // The team's old-layout instance of the key goes with the team's.
    let coder = old_layout(state.path(), "coder", "default", 1, TEAM, true);
    let other = instance(&crew, "assistant", "other", 1, TEAM);
    let elsewhere = instance(&solo, "assistant", "default", 1, SOLO);
    let dirs = [assistant.dir().to_path_buf(), planner.dir().to_path_buf(), coder.clone()];

    // Without --force and without a terminal to ask on: refused, nothing deleted.
    let output = gdn(state.path(), &["--workspace", "crew", "instance", "delete", "default"]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("pass --force"), "{}", text(&output.stderr));
    assert!(dirs.iter().all(|dir| dir.is_dir()));
    // The planner runs: nothing is deleted, with or without --agent.
    let held = must(planner.lock());
    let pid = std::process::id();
    let crew_delete = ["--workspace", "crew", "instance", "delete", "default", "--force"];
    for args in
        [&crew_delete[..], &["--workspace", "crew", "instance", "delete", "default", "--agent", "planner", "--force"]]
    {
        let output = gdn(state.path(), args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("'planner'") && stderr.contains(&format!("pid {pid}")), "{stderr}");
        assert!(stderr.contains("nothing was deleted"), "{stderr}");
        assert!(dirs.iter().all(|dir| dir.is_dir()), "{args:?}");
    }
    // --agent deletes that agent's instance alone, even while another runs.
    let output =
        gdn(state.path(), &["--workspace", "crew", "instance", "delete", "default", "--agent", "coder", "--force"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout).trim(), "✓ deleted instance 'default' of agent 'coder'");
    assert!(!coder.exists());
    drop(held);

    let output = gdn(state.path(), &crew_delete);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    assert!(
        stdout.contains("'default' of agent 'assistant'") && stdout.contains("'default' of agent 'planner'"),
        "{stdout}"
    );
    assert!(dirs.iter().all(|dir| !dir.exists()));
    assert!(other.dir().is_dir(), "another key's instance stays");
    assert!(elsewhere.dir().is_dir(), "another project's instance of the key stays");
    assert_eq!(
        summary(&listed(state.path())),
        [row("crew", "assistant", "other", false), row("solo", "assistant", "default", false)]
    );

    // Unknown instances and workspaces.
    let output = gdn(state.path(), &crew_delete);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("no instance 'default' in workspace 'crew'"), "{}", text(&output.stderr));
    let output =
        gdn(state.path(), &["--workspace", "crew", "instance", "delete", "other", "--agent", "planner", "--force"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("no instance 'other' of agent 'planner'"), "{}", text(&output.stderr));
    let output = gdn(state.path(), &["--workspace", "crew", "instance", "delete", "..", "--force"]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    let output = gdn(state.path(), &["--workspace", "nowhere", "instance", "delete", "default", "--force"]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("no workspace \"nowhere\""), "{}", text(&output.stderr));
    // Without --workspace, the project is -c's bundle.
    let output = gdn(state.path(), &["-c", "/nonexistent/bundle", "instance", "delete", "default", "--force"]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("cannot tell the project's workspace"), "{}", text(&output.stderr));

    let output = gdn(state.path(), &["--json", "--workspace", "crew", "instance", "delete", "other", "--force"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let body: Value = must(serde_json::from_slice(&output.stdout));
    assert_eq!(body[0]["workspace"], "crew");
    assert_eq!(body[0]["agentName"], "assistant");
    assert_eq!(body[0]["instanceKey"], "other");
    assert!(!other.dir().exists());
}

fn quickstart() -> PathBuf {
    must(std::fs::canonicalize(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/quickstart")))
}

#[test]
fn gdn_run_moves_its_own_old_layout_instances_and_leaves_other_bundles_ones() {
    let state = must(tempfile::tempdir());
    let work = must(tempfile::tempdir());
    let example = quickstart();
    let bundle_file = example.join("goondan.yaml").display().to_string();
    let mine = old_layout(state.path(), "assistant", "default", 2, &bundle_file, true);
    let theirs = old_layout(state.path(), "assistant", "default", 4, "/bundles/other/goondan.yaml", false);
    assert_eq!(mine, state.path().join("instances/default"));

    let workdir = work.path().to_string_lossy().into_owned();
    let output = gdn(
        state.path(),
        &["-c", example.to_str().unwrap_or_default(), "run", "--input", "Take notes", "--workdir", &workdir],
    );
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!mine.exists());
    assert!(theirs.is_dir(), "another bundle's old instance is neither moved nor used");
    // Nor silently passed over: the run says where it is and whose it is.
    assert!(
        stderr.contains(&format!("{} holds a conversation of agent 'assistant'", theirs.display()))
            && stderr.contains("/bundles/other/goondan.yaml, not this one"),
        "{stderr}"
    );
    let log = state.path().join("workspaces/default/instances/assistant@default/messages.jsonl");
    let loaded = must(goondan_runtime::store::read_message_log(&log));
    let messages = loaded.state.messages();
    // The two old messages, then the turn's nine; none of the other bundle's four.
    assert_eq!(messages.len(), 11);
    assert_eq!(messages.first().map(|m| &m.data), Some(&user("message 0").data));
    let items = listed(state.path());
    assert_eq!(
        summary(&items),
        [row("-", "assistant", "default", false), row("default", "assistant", "default", false)]
    );
    let moved = items.iter().find(|item| item["workspace"] == "default").cloned().unwrap_or_default();
    assert_eq!(moved["legacyLayout"], false);
    assert_eq!(moved["turns"], 1);
    assert_eq!(moved["workspaceBundle"], Value::from(bundle_file));
}
