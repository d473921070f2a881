//! Two bundles never share a conversation: the quick start, then another
//! bundle whose Swarm and agent have the same names. The second used to
//! continue the first's conversation (its model got 11 messages, with calls
//! to tools it does not have), then was refused; now it gets a workspace of
//! its own (`default-<hash of its path>`), is told so once, and its model
//! gets only its own input. `--workspace` still chooses explicitly, and
//! `--adopt-workspace` takes the name's workspace over.

use std::path::{Path, PathBuf};
use std::process::Output;

use goondan_test_support::{Agent, Bundle};
use serde_json::Value;

mod common;
use goondan_test_support::text;

fn must<T, E: std::fmt::Display>(result: Result<T, E>) -> T {
    result.unwrap_or_else(|error| panic!("{error}"))
}

fn gdn(state: &Path, args: &[&str]) -> Output {
    common::gdn_bin().state_arg(state).env("LOCAL_MODEL_KEY", "sk-local").run(args)
}

/// A bundle whose Swarm (`default`) and agent (`assistant`) have the quick
/// start's names, with a model on the local server.
fn write_other_bundle(dir: &Path, endpoint: &str) {
    let bundle = Bundle::new()
        .openai_model("local", "local-model", endpoint, "LOCAL_MODEL_KEY")
        .one_agent("default", Agent::new("assistant", "local"));
    must(bundle.write(dir));
}

fn quickstart() -> PathBuf {
    must(std::fs::canonicalize(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/quickstart")))
}

/// The workspace of its own a bundle whose Swarm's workspace is another
/// bundle's gets: `default-` and 8 hex digits of the SHA-256 of its file's path.
fn own_workspace(file: &str) -> String {
    use sha2::Digest as _;
    format!("default-{}", &hex::encode(sha2::Sha256::digest(file.as_bytes()))[..8])
}

/// `gdn instance list --json` as (workspace, messages, bundle), sorted.
fn listed(state: &Path) -> Vec<(String, u64, String)> {
    let output = gdn(state, &["--json", "instance", "list"]);
    let listed: Value = must(serde_json::from_slice(&output.stdout));
    let mut rows: Vec<(String, u64, String)> = listed
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| {
            (
                item["workspace"].as_str().unwrap_or_default().to_owned(),
                item["messages"].as_u64().unwrap_or_default(),
                item["workspaceBundle"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    rows.sort();
    rows
}

#[test]
fn a_second_bundle_with_the_same_swarm_name_gets_a_workspace_of_its_own() {
    let state = must(tempfile::tempdir());
    let work = must(tempfile::tempdir());
    let other = must(tempfile::tempdir());
    let model = must(goondan_test_support::FakeModel::text("fresh"));
    let endpoint = model.url();
    write_other_bundle(other.path(), &endpoint);
    let example = quickstart();
    let example_arg = example.to_string_lossy().into_owned();
    let other_arg = other.path().to_string_lossy().into_owned();
    let workdir = work.path().to_string_lossy().into_owned();
    let first = example.join("goondan.yaml").display().to_string();
    let second = must(std::fs::canonicalize(other.path().join("goondan.yaml"))).display().to_string();
    let own = own_workspace(&second);

    let output = gdn(state.path(), &["-c", &example_arg, "run", "--input", "Take notes", "--workdir", &workdir]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));

    // Looking at the other bundle is never refused, and makes nothing.
    for args in [&["tool", "list"][..], &["validate"], &["instance", "list"], &["logs"], &["task", "list"]] {
        let output = gdn(state.path(), &[&["-c", &other_arg][..], args].concat());
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("another bundle"), "{args:?}: {stderr}");
    }
    // doctor reports on the machine (its exit code says what it found), never refusing.
    let output = gdn(state.path(), &["-c", &other_arg, "doctor"]);
    let said = format!("{}{}", text(&output.stdout), text(&output.stderr));
    assert!(!said.contains("another bundle") && !said.contains("--adopt-workspace"), "doctor: {said}");
    assert!(!state.path().join("workspaces").join(&own).exists());

    // Its first run gets a workspace of its own, and says so, naming both
    // bundles and the ways to choose otherwise; its model gets only its own input.
    let output = gdn(state.path(), &["-c", &other_arg, "run", "--input", "hi"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(text(&output.stdout).trim(), "fresh");
    assert!(stderr.contains(&first) && stderr.contains(&second) && stderr.contains(&own), "{stderr}");
    for way in ["--workspace NAME", "--adopt-workspace"] {
        assert!(stderr.contains(way), "{way}: {stderr}");
    }
    let requests: Vec<Value> = model.requests().into_iter().map(|r| r.body["messages"].clone()).collect();
    assert_eq!(requests.len(), 1);
    let messages = requests[0].as_array().cloned().unwrap_or_default();
    let non_system: Vec<&Value> = messages.iter().filter(|m| m["role"] != "system").collect();
    assert_eq!(non_system.len(), 1, "{messages:?}");
    assert_eq!(non_system[0]["role"], "user");
    assert_eq!(non_system[0]["content"], "hi");

    // Said once: the next run continues there in silence, its own conversation only.
    let output = gdn(state.path(), &["-c", &other_arg, "run", "--input", "again"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains(&own) && !stderr.contains("another bundle"), "said twice: {stderr}");
    let requests: Vec<Value> = model.requests().into_iter().map(|r| r.body["messages"].clone()).collect();
    let non_system = requests[1].as_array().into_iter().flatten().filter(|m| m["role"] != "system").count();
    assert_eq!(non_system, 3, "hi, fresh, again: {:?}", requests[1]);
    let output = gdn(state.path(), &["-c", &other_arg, "tool", "list"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));

    // --workspace still chooses explicitly.
    let output = gdn(state.path(), &["-c", &other_arg, "--workspace", "other", "run", "--input", "hi"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));

    // The first bundle, named by its file this time, continues its own.
    let file_arg = example.join("goondan.yaml").to_string_lossy().into_owned();
    let output = gdn(state.path(), &["-c", &file_arg, "run", "--input", "Take notes", "--workdir", &workdir]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(
        listed(state.path()),
        [
            ("default".to_owned(), 18, first.clone()),
            (own.clone(), 4, second.clone()),
            ("other".to_owned(), 2, second.clone())
        ]
    );

    // Taking the name's workspace over is the operator's explicit choice;
    // from then on the quick start is the other bundle, and gets its own.
    let output = gdn(state.path(), &["-c", &other_arg, "--adopt-workspace", "run", "--input", "again"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let output = gdn(state.path(), &["-c", &other_arg, "run", "--input", "and again"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let output = gdn(state.path(), &["-c", &example_arg, "run", "--input", "Take notes", "--workdir", &workdir]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let quickstart_own = own_workspace(&first);
    assert!(stderr.contains(&quickstart_own), "{stderr}");
    let rows = listed(state.path());
    assert!(rows.contains(&("default".to_owned(), 22, second.clone())), "the adopted one goes on: {rows:?}");
    assert!(rows.iter().any(|(workspace, _, bundle)| workspace == &quickstart_own && bundle == &first), "{rows:?}");
}
