//! The durable conversation store, on real files in temporary directories.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use goondan_core::{JsonObject, Message, MessageData, MessageEvent, MessageSource, ToolCall, ToolError, ToolResult};
use goondan_runtime::store::{
    InstanceStore, LockStatus, StateRoot, StoreError, Workspace, WorkspaceAccess, delete_instance, delete_instances,
    instance_dir_name, list_instances, lock_status, open_workspace, parse_instance_dir_name, reset_conversations,
    workspace_id,
};
use goondan_tools::{EventKind, EventSink, JsonLinesEventSink, RuntimeEvent};
use proptest::prelude::*;
use serde_json::json;

fn must<T, E: std::fmt::Display>(result: Result<T, E>) -> T {
    result.unwrap_or_else(|error| panic!("{error}"))
}

/// A state root in a temporary directory and the workspace of the bundle
/// `/bundles/demo` in it (named `demo`).
fn temp_root() -> (tempfile::TempDir, Workspace) {
    let dir = must(tempfile::tempdir());
    let state = StateRoot::new(dir.path().join("state"));
    let workspace = must(open_workspace(&state, "demo", "/bundles/demo", WorkspaceAccess::Use));
    (dir, workspace)
}

/// The state root a workspace of [`temp_root`] is in.
fn state(workspace: &Workspace) -> StateRoot {
    StateRoot::new(workspace.dir().parent().and_then(Path::parent).unwrap_or(Path::new("/")))
}

fn open(root: &Workspace, key: &str) -> InstanceStore {
    must(InstanceStore::open(root, key, "assistant", Path::new("/bundles/demo")))
}

fn object(value: serde_json::Value) -> JsonObject {
    value.as_object().cloned().unwrap_or_default()
}

fn user(text: &str) -> Message {
    Message::new(MessageData::User { content: text.to_owned() }, MessageSource::User)
}

/// One step: an assistant message with a tool call and the call's result.
fn step(n: usize) -> Vec<Message> {
    let call_id = format!("call-{n}");
    let call = ToolCall::new(call_id.as_str(), "bash__exec", object(json!({"command": format!("echo {n}")})));
    vec![
        Message::assistant_tool_calls(format!("step-{n}"), vec![call]),
        Message::new(
            MessageData::Tool {
                tool_call_id: call_id.clone(),
                tool_name: "bash__exec".into(),
                result: Box::new(ToolResult::ok(json!({"stdout": format!("{n}\n")}))),
            },
            MessageSource::Tool { tool_call_id: call_id, tool_name: "bash__exec".into() },
        ),
    ]
}

fn every_variant() -> Vec<Message> {
    let mut with_metadata = Message::new(
        MessageData::System { content: "You are helpful.\nLine two \"quoted\" \u{0} \u{1F600}".into() },
        MessageSource::System,
    );
    with_metadata.metadata = object(json!({"pinned": true, "nested": {"list": [1, 2.5, null]}}));
    let call = ToolCall::new("call-1", "file__read", object(json!({"path": "a b/c.txt"})));
    vec![
        with_metadata,
        user("안녕하세요 — hello\r\n"),
        Message::new(
            MessageData::Assistant { content: Some("Let me look.".into()), tool_calls: vec![call] },
            MessageSource::Assistant { step_id: "step-1".into() },
        ),
        Message::new(
            MessageData::Assistant { content: Some("Done.".into()), tool_calls: Vec::new() },
            MessageSource::Assistant { step_id: "step-2".into() },
        ),
        Message::new(
            MessageData::Assistant { content: None, tool_calls: Vec::new() },
            MessageSource::Extension { extension_name: "compaction".into() },
        ),
        Message::new(
            MessageData::Tool {
                tool_call_id: "call-1".into(),
                tool_name: "file__read".into(),
                result: Box::new(ToolResult::ok(json!("contents"))),
            },
            MessageSource::Tool { tool_call_id: "call-1".into(), tool_name: "file__read".into() },
        ),
        Message::new(
            MessageData::Tool {
                tool_call_id: "call-2".into(),
                tool_name: "file__read".into(),
                result: Box::new(ToolResult::error(ToolError {
                    message: "no such file".into(),
                    name: Some("NotFound".into()),
                    code: Some("E_NOT_FOUND".into()),
                    suggestion: Some("check the path".into()),
                    help_url: Some("https://example.com/help".into()),
                })),
            },
            MessageSource::Tool { tool_call_id: "call-2".into(), tool_name: "file__read".into() },
        ),
        Message::new(
            MessageData::Tool {
                tool_call_id: "call-3".into(),
                tool_name: "agents__spawn".into(),
                result: Box::new(ToolResult::pending("job-7", Some(json!({"queued": 1})))),
            },
            MessageSource::Tool { tool_call_id: "call-3".into(), tool_name: "agents__spawn".into() },
        ),
    ]
}

fn line_of(message: &Message) -> String {
    let mut line = must(serde_json::to_string(message));
    line.push('\n');
    line
}

/// Appends raw bytes to a file, as a crashed writer would have left them.
fn append_raw(path: &Path, bytes: &[u8]) {
    let mut file = must(OpenOptions::new().append(true).open(path));
    must(file.write_all(bytes));
}

/// Every line is one commit: a message, or `{"events": [...]}`.
fn assert_every_line_is_a_commit(path: &Path) {
    let text = must(fs::read_to_string(path));
    assert!(text.ends_with('\n'), "the log ends with a newline: {text:?}");
    for line in text.lines() {
        let value: serde_json::Value = must(serde_json::from_str(line));
        match value.get("events") {
            Some(events) => {
                must(serde_json::from_value::<Vec<MessageEvent>>(events.clone()));
            }
            None => {
                must(serde_json::from_value::<Message>(value));
            }
        }
    }
}

#[test]
fn messages_of_every_variant_round_trip() {
    let (_dir, root) = temp_root();
    let messages = every_variant();
    let mut store = open(&root, "round-trip");
    must(store.append(&messages[..3]));
    must(store.append(&messages[3..]));
    must(store.append(&[]));
    drop(store);

    let store = open(&root, "round-trip");
    let loaded = must(store.messages());
    assert_eq!(loaded.messages, messages);
    assert!(!loaded.skipped_torn_tail);
    assert_eq!(loaded.skipped_corrupt_lines, 0);
    assert_eq!(store.info().messages, 8);
    // One line per commit.
    assert_eq!(must(fs::read_to_string(store.messages_path())).lines().count(), 2);
    assert_every_line_is_a_commit(store.messages_path());

    let info: serde_json::Value = must(serde_json::from_slice(&must(fs::read(store.dir().join("instance.json")))));
    assert_eq!(info["instanceKey"], "round-trip");
    assert_eq!(info["agentName"], "assistant");
    assert_eq!(info["bundle"], "/bundles/demo");
    assert_eq!(info["messages"], 8);
    assert_eq!(info["turns"], 0);
    assert!(info.get("swarmName").is_none());
}

#[test]
fn a_new_instance_has_an_empty_log_and_metadata() {
    let (_dir, root) = temp_root();
    let store = open(&root, "fresh");
    assert_eq!(must(store.messages()), Default::default());
    assert!(store.messages_path().is_file());
    assert!(store.dir().join("instance.json").is_file());
    assert_eq!(store.info().created_at, store.info().updated_at);
    // No temp file is left beside instance.json.
    assert_eq!(must(fs::read_dir(store.dir())).count(), 2);
}

#[test]
fn a_torn_last_line_is_skipped_then_cut_before_the_next_append() {
    let (_dir, root) = temp_root();
    let mut store = open(&root, "torn");
    let first = every_variant();
    must(store.append(&first));
    let path = store.messages_path().to_path_buf();
    drop(store);

    let half = line_of(&user("this line was being written when the power went out"));
    append_raw(&path, &half.as_bytes()[..half.len() / 2]);

    let mut store = open(&root, "torn");
    let loaded = must(store.messages());
    assert_eq!(loaded.messages, first);
    assert!(loaded.skipped_torn_tail);
    assert_eq!(loaded.skipped_corrupt_lines, 0);

    let next = user("after the crash");
    must(store.append(std::slice::from_ref(&next)));
    assert_every_line_is_a_commit(&path);
    let loaded = must(store.messages());
    assert!(!loaded.skipped_torn_tail);
    assert_eq!(loaded.skipped_corrupt_lines, 0);
    assert_eq!(loaded.messages.len(), first.len() + 1);
    assert_eq!(loaded.messages.last(), Some(&next));
}

#[test]
fn a_torn_tail_longer_than_the_scan_chunk_is_cut() {
    let (_dir, root) = temp_root();
    let mut store = open(&root, "long-tail");
    let kept = user("kept");
    must(store.append(std::slice::from_ref(&kept)));
    let path = store.messages_path().to_path_buf();
    drop(store);

    let long = line_of(&user(&"x".repeat(40_000)));
    append_raw(&path, &long.as_bytes()[..long.len() - 1]);

    let mut store = open(&root, "long-tail");
    let loaded = must(store.messages());
    assert!(loaded.skipped_torn_tail);
    assert_eq!(loaded.messages, vec![kept.clone()]);
    let next = user("next");
    must(store.append(std::slice::from_ref(&next)));
    assert_every_line_is_a_commit(&path);
    assert_eq!(must(store.messages()).messages, vec![kept, next]);
}

#[test]
fn a_torn_first_line_leaves_an_empty_conversation() {
    let (_dir, root) = temp_root();
    let mut store = open(&root, "only-garbage");
    append_raw(store.messages_path(), b"{\"id\":\"01");
    let loaded = must(store.messages());
    assert!(loaded.messages.is_empty());
    assert!(loaded.skipped_torn_tail);
    let next = user("first");
    must(store.append(std::slice::from_ref(&next)));
    assert_eq!(must(fs::read_to_string(store.messages_path())), line_of(&next));
}

#[test]
fn an_unparsable_last_line_with_a_newline_is_a_torn_tail() {
    let (_dir, root) = temp_root();
    let mut store = open(&root, "bad-last");
    let kept = user("kept");
    must(store.append(std::slice::from_ref(&kept)));
    append_raw(store.messages_path(), b"\0\0\0\0\n");
    let loaded = must(store.messages());
    assert_eq!(loaded.messages, vec![kept]);
    assert!(loaded.skipped_torn_tail);
    assert_eq!(loaded.skipped_corrupt_lines, 0);
}

#[test]
fn corrupt_lines_in_the_middle_are_counted_and_skipped() {
    let (_dir, root) = temp_root();
    let store = open(&root, "corrupt");
    let (a, b, c) = (user("a"), user("b"), user("c"));
    let text = format!("{}not json\n{}\n{{\"id\":\"x\"}}\n{}", line_of(&a), line_of(&b), line_of(&c));
    append_raw(store.messages_path(), text.as_bytes());
    let loaded = must(store.messages());
    assert_eq!(loaded.messages, vec![a, b, c]);
    assert_eq!(loaded.skipped_corrupt_lines, 2);
    assert!(!loaded.skipped_torn_tail);
}

/// A corrupt line in the middle that held a tool result: loading repairs
/// the history (the call is dropped, not sent unanswered forever), says
/// so, and the repair is saved by the next commit, so reloads agree.
#[test]
fn a_corrupt_middle_line_that_held_a_result_is_repaired_on_load() {
    let (_dir, root) = temp_root();
    let mut store = open(&root, "corrupt-result");
    let steps = step(1);
    // An old-format log: one message per line, so the result has its own line.
    let text = format!(
        "{}{}{{\"id\": \"torn in the middle\n{}{}",
        line_of(&user("first")),
        line_of(&steps[0]),
        line_of(&user("second")),
        line_of(&Message::new(
            MessageData::Assistant { content: Some("ok".into()), tool_calls: Vec::new() },
            MessageSource::Assistant { step_id: "s".into() }
        )),
    );
    append_raw(store.messages_path(), text.as_bytes());
    let loaded = must(store.load());
    assert_eq!(loaded.skipped_corrupt_lines, 1);
    assert!(loaded.state.is_consistent(), "{:?}", loaded.state.messages());
    assert_eq!(loaded.repairs.calls_dropped, 1);
    assert_eq!(loaded.repairs.messages_removed, 1, "nothing was left of the assistant message");
    let texts: Vec<&str> = loaded
        .state
        .messages()
        .iter()
        .filter_map(|m| match &m.data {
            MessageData::User { content } => Some(content.as_str()),
            MessageData::Assistant { content, .. } => content.as_deref(),
            _ => None,
        })
        .collect();
    assert_eq!(texts, ["first", "second", "ok"]);
    // The repair events are the state's uncommitted batch: saving it makes
    // every later load the same without repairing again.
    let mut state = loaded.state;
    assert!(state.commit());
    must(store.append_events(&state.last_batch()));
    let again = must(store.load());
    assert!(again.repairs.is_empty());
    assert_eq!(again.state.messages(), state.messages());
}

#[test]
fn a_crash_between_steps_loses_no_completed_step() {
    let (_dir, root) = temp_root();
    let input = user("list the files");
    let step_1 = step(1);
    let step_2 = step(2);

    let mut store = open(&root, "crash");
    must(store.append(std::slice::from_ref(&input)));
    must(store.append(&step_1));
    let path = store.messages_path().to_path_buf();
    // "Crash": the store goes away without any further call.
    drop(store);
    // Step 2's write was interrupted half-way through its second line.
    let mut torn = line_of(&step_2[0]);
    let second = line_of(&step_2[1]);
    torn.push_str(&second[..second.len() / 2]);
    append_raw(&path, torn.as_bytes());

    let mut store = open(&root, "crash");
    let loaded = must(store.messages());
    assert!(loaded.skipped_torn_tail);
    assert_eq!(loaded.skipped_corrupt_lines, 0);
    let completed: Vec<Message> = std::iter::once(input).chain(step_1).collect();
    assert_eq!(loaded.messages[..3], completed[..]);
    // Complete lines of the interrupted step are kept as they are.
    assert_eq!(loaded.messages[3..], step_2[..1]);

    // The runtime goes on; the next step lands on a clean line.
    let step_3 = step(3);
    must(store.append(&step_3));
    assert_every_line_is_a_commit(&path);
    let loaded = must(store.messages());
    assert!(!loaded.skipped_torn_tail);
    assert_eq!(loaded.messages[..3], completed[..]);
    assert_eq!(loaded.messages[4..], step_3[..]);
}

#[test]
fn instance_keys_round_trip_through_directory_names() {
    let (_dir, root) = temp_root();
    let keys = [
        "user:42/chat",
        "with spaces and\ttabs",
        "한국어/채팅 🙂",
        "../escape",
        "a/../../b",
        "...",
        ".hidden",
        "100%",
        "%41",
        "a%2Fb",
        "C:\\Windows",
        "CamelCase",
        "camelcase",
        "plain-key_1.2",
    ];
    for key in keys {
        let mut store = open(&root, key);
        must(store.append(&[user(key)]));
        let dir = store.dir().to_path_buf();
        assert_eq!(dir.parent(), Some(root.instances_dir().as_path()), "{key:?} stays in the instances directory");
        let Some(name) = dir.file_name().and_then(|name| name.to_str()) else { panic!("{dir:?}") };
        assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-%@".contains(&b)), "{name}");
        assert_eq!(name.matches('@').count(), 1, "{name}");
        assert_eq!(instance_dir_name("assistant", key).as_deref(), Some(name));
        assert_eq!(parse_instance_dir_name(name), Some(("assistant".to_owned(), key.to_owned())));
        assert_eq!(store.info().instance_key, key);
    }
    assert_eq!(instance_dir_name("assistant", "user:42/chat").as_deref(), Some("assistant@user%3A42%2Fchat"));
    assert_eq!(instance_dir_name("assistant", "plain-key_1.2").as_deref(), Some("assistant@plain-key_1.2"));
    // `@` in either part is encoded, so the separator stays unambiguous.
    assert_eq!(instance_dir_name("a@b", "c@d").as_deref(), Some("a%40b@c%40d"));
    assert_eq!(parse_instance_dir_name("a%40b@c%40d"), Some(("a@b".to_owned(), "c@d".to_owned())));

    let mut listed: Vec<String> =
        must(list_instances(&state(&root))).into_iter().map(|found| found.info.instance_key).collect();
    listed.sort();
    let mut expected: Vec<String> = keys.iter().map(|key| (*key).to_owned()).collect();
    expected.sort();
    assert_eq!(listed, expected);
    for key in keys {
        let store = open(&root, key);
        assert_eq!(must(store.messages()).messages.len(), 1);
        assert_eq!(must(store.messages()).messages.first().map(|m| &m.data), Some(&user(key).data));
    }
}

#[test]
fn keys_that_cannot_name_a_directory_are_refused() {
    let (_dir, root) = temp_root();
    for key in ["", ".", "..", &"/".repeat(86)] {
        let result = InstanceStore::open(&root, key, "assistant", Path::new("b"));
        assert!(matches!(result, Err(StoreError::InvalidKey { .. })), "{key:?}: {result:?}");
        assert!(
            matches!(delete_instance(&state(&root), &root, "assistant", key), Err(StoreError::InvalidKey { .. })),
            "{key:?}"
        );
        assert!(
            matches!(delete_instances(&state(&root), &root, key, None), Err(StoreError::InvalidKey { .. })),
            "{key:?}"
        );
        assert_eq!(instance_dir_name("assistant", key), None);
    }
    // The same rule for agent names.
    for agent in ["", ".", ".."] {
        let result = InstanceStore::open(&root, "key", agent, Path::new("b"));
        assert!(matches!(result, Err(StoreError::InvalidKey { .. })), "{agent:?}: {result:?}");
        assert_eq!(instance_dir_name(agent, "key"), None);
    }
    // The limit is on the whole name: 127 + 1 + 127 bytes fit, one more does not.
    let half = "k".repeat(127);
    assert_eq!(instance_dir_name(&half, &half).map(|name| name.len()), Some(255));
    assert_eq!(instance_dir_name(&half, &format!("{half}k")), None);
    let Err(error) = InstanceStore::open(&root, &format!("{half}k"), &half, Path::new("b")) else { panic!("refused") };
    assert!(error.to_string().contains("255 bytes"), "{error}");
    let Err(error) = InstanceStore::open(&root, "..", "assistant", Path::new("b")) else { panic!("refused") };
    assert!(error.to_string().contains("instances"), "{error}");
    // Not canonical encodings, or not two parts: nothing maps back.
    assert_eq!(parse_instance_dir_name("plain-key"), None, "an old-layout name");
    for name in ["%2f", "a/b", "%", "%4", "%ZZ", "%41", "..", "", "%FF"] {
        assert_eq!(parse_instance_dir_name(name), None, "{name:?}");
        assert_eq!(parse_instance_dir_name(&format!("a@{name}")), None, "a@{name:?}");
        assert_eq!(parse_instance_dir_name(&format!("{name}@a")), None, "{name:?}@a");
    }
    for name in ["a@b@c", "@", "a@b/c", "A%3a@b"] {
        assert_eq!(parse_instance_dir_name(name), None, "{name:?}");
    }
    assert!(!root.instances_dir().exists());
}

#[test]
fn list_is_sorted_by_update_time_and_skips_unreadable_instances() {
    let (_dir, root) = temp_root();
    assert!(must(list_instances(&state(&root))).is_empty(), "no instances directory yet");
    let mut stores: Vec<InstanceStore> = ["first", "second", "third"].into_iter().map(|key| open(&root, key)).collect();
    // Append to them in the order second, third, first.
    for index in [1, 2, 0] {
        std::thread::sleep(Duration::from_millis(3));
        if let Some(store) = stores.get_mut(index) {
            must(store.append(&[user("hi")]));
        }
    }
    // Then the third instance completes a turn: it becomes the most recent.
    std::thread::sleep(Duration::from_millis(3));
    if let Some(store) = stores.get_mut(2) {
        must(store.record_turn());
        must(store.set_swarm_name(Some("team")));
    }
    let instances = root.instances_dir();
    // Not instances: directories without instance.json, garbage metadata,
    // copies under the names of other instances (either layout), a file,
    // a name that is no encoding.
    for name in ["empty-dir", "assistant@empty", "garbage", "copy-of-first", "planner@first", "bad%2fname"] {
        must(fs::create_dir_all(instances.join(name)));
    }
    must(fs::write(instances.join("garbage").join("instance.json"), b"{not json"));
    for copy in ["copy-of-first", "planner@first", "bad%2fname"] {
        must(fs::copy(
            instances.join("assistant@first").join("instance.json"),
            instances.join(copy).join("instance.json"),
        ));
    }
    must(fs::write(instances.join("stray-file"), b"x"));

    let listed = must(list_instances(&state(&root)));
    let keys: Vec<&str> = listed.iter().map(|found| found.info.instance_key.as_str()).collect();
    assert_eq!(keys, ["third", "first", "second"]);
    let Some(third) = listed.first() else { panic!("three instances") };
    assert_eq!((third.info.turns, third.info.messages, third.info.swarm_name.as_deref()), (1, 1, Some("team")));
    assert_eq!(third.info.agent_name, "assistant");
    assert_eq!(third.dir, instances.join("assistant@third"));
    assert!(!third.legacy_layout);
    assert_eq!(third.status, LockStatus { running: false, pid: None });
    assert!(listed.windows(2).all(|pair| pair[0].info.updated_at >= pair[1].info.updated_at));
}

#[test]
fn delete_removes_the_instance_directory() {
    let (dir, root) = temp_root();
    let mut store = open(&root, "user:1/chat");
    must(store.append(&step(1)));
    let mut events = must(store.event_writer());
    must(events.write_all(b"{}\n"));
    drop(events);
    let instance_dir = store.dir().to_path_buf();
    drop(store);
    let other = open(&root, "other");
    let sibling = dir.path().join("state").join("keep-me");
    must(fs::write(&sibling, b"x"));

    assert!(
        !must(delete_instance(&state(&root), &root, "planner", "user:1/chat")),
        "another agent's instance of the key"
    );
    assert!(instance_dir.exists());
    assert!(must(delete_instance(&state(&root), &root, "assistant", "user:1/chat")));
    assert!(!instance_dir.exists());
    assert!(!must(delete_instance(&state(&root), &root, "assistant", "user:1/chat")));
    assert!(!must(delete_instance(&state(&root), &root, "assistant", "never-existed")));
    assert!(must(delete_instances(&state(&root), &root, "never-existed", None)).is_empty());
    assert!(matches!(delete_instance(&state(&root), &root, "assistant", ".."), Err(StoreError::InvalidKey { .. })));
    assert!(sibling.is_file());
    assert!(other.dir().is_dir());
    let keys: Vec<String> =
        must(list_instances(&state(&root))).into_iter().map(|found| found.info.instance_key).collect();
    assert_eq!(keys, ["other"]);

    // A re-created instance starts empty.
    let store = open(&root, "user:1/chat");
    assert!(must(store.messages()).messages.is_empty());
    assert_eq!(store.info().messages, 0);
}

#[test]
fn a_directory_holding_another_key_is_not_opened_or_deleted() {
    let (_dir, root) = temp_root();
    let store = open(&root, "mine");
    let info_path = store.dir().join("instance.json");
    drop(store);
    let original = must(fs::read_to_string(&info_path));
    must(fs::write(&info_path, original.replace("\"mine\"", "\"theirs\"")));
    let result = InstanceStore::open(&root, "mine", "assistant", Path::new("b"));
    assert!(matches!(result, Err(StoreError::KeyMismatch { .. })), "{result:?}");
    assert!(matches!(delete_instance(&state(&root), &root, "assistant", "mine"), Err(StoreError::KeyMismatch { .. })));
    assert!(matches!(delete_instances(&state(&root), &root, "mine", None), Err(StoreError::KeyMismatch { .. })));
    assert!(info_path.is_file());

    // Another agent's name in it is a mismatch too, and the error names both.
    must(fs::write(&info_path, original.replace("\"assistant\"", "\"planner\"")));
    let Err(error) = InstanceStore::open(&root, "mine", "assistant", Path::new("b")) else { panic!("refused") };
    assert!(matches!(error, StoreError::KeyMismatch { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("\"assistant\"") && message.contains("\"planner\""), "{message}");
    assert!(matches!(delete_instance(&state(&root), &root, "assistant", "mine"), Err(StoreError::KeyMismatch { .. })));
    assert!(info_path.is_file());
}

#[test]
fn unreadable_metadata_is_rewritten_and_the_conversation_kept() {
    let (_dir, root) = temp_root();
    let mut store = open(&root, "meta");
    let messages = step(1);
    must(store.append(&messages));
    let info_path = store.dir().join("instance.json");
    drop(store);
    must(fs::write(&info_path, b"{\"instanceKey\": \"me"));

    let store = must(InstanceStore::open(&root, "meta", "assistant", Path::new("/elsewhere")));
    assert_eq!(must(store.messages()).messages, messages);
    assert_eq!((store.info().agent_name.as_str(), store.info().bundle.as_str()), ("assistant", "/elsewhere"));
    let keys: Vec<String> =
        must(list_instances(&state(&root))).into_iter().map(|found| found.info.instance_key).collect();
    assert_eq!(keys, ["meta"]);
}

#[test]
fn counters_persist_across_opens_and_the_bundle_follows() {
    let (_dir, root) = temp_root();
    let mut store = open(&root, "counters");
    let created_at = store.info().created_at;
    must(store.append(&[user("one")]));
    must(store.append(&step(1)));
    must(store.record_turn());
    drop(store);

    let store = must(InstanceStore::open(&root, "counters", "assistant", Path::new("/bundles/v2")));
    let info = store.info();
    assert_eq!((info.turns, info.messages, info.created_at), (1, 3, created_at));
    assert!(info.updated_at >= created_at);
    assert_eq!((info.agent_name.as_str(), info.bundle.as_str()), ("assistant", "/bundles/v2"));
    let listed = must(list_instances(&state(&root)));
    assert_eq!(listed.first().map(|found| found.info.bundle.as_str()), Some("/bundles/v2"));
}

#[test]
fn state_root_resolution_prefers_cli_then_env_then_home() {
    let cli = Some(PathBuf::from("/from/cli"));
    let env = Some("/from/env".to_owned());
    let home = Some(PathBuf::from("/home/me"));
    let resolve = |cli: &Option<PathBuf>, env: &Option<String>, home: &Option<PathBuf>| {
        must(StateRoot::resolve(cli.clone(), env.clone(), home.clone())).path().to_path_buf()
    };
    assert_eq!(resolve(&cli, &env, &home), Path::new("/from/cli"));
    assert_eq!(resolve(&None, &env, &home), Path::new("/from/env"));
    assert_eq!(resolve(&None, &None, &home), Path::new("/home/me/.goondan"));
    assert_eq!(resolve(&None, &Some(String::new()), &home), Path::new("/home/me/.goondan"));
    assert_eq!(resolve(&Some(PathBuf::new()), &env, &None), Path::new("/from/env"));
    assert!(matches!(StateRoot::resolve(None, None, None), Err(StoreError::NoStateRoot)));
    assert!(matches!(
        StateRoot::resolve(None, Some(String::new()), Some(PathBuf::new())),
        Err(StoreError::NoStateRoot)
    ));
    let root = StateRoot::new("/r");
    assert_eq!(root.workspace_dir("main-prod"), Path::new("/r/workspaces/main-prod"));
    assert_eq!(root.legacy_instances_dir(), Path::new("/r/instances"));
    let workspace = Workspace::at(root.workspace_dir("main-prod"));
    assert_eq!(workspace.id(), "main-prod");
    assert_eq!(
        must(workspace.instance_dir("assistant", "a/b")),
        Path::new("/r/workspaces/main-prod/instances/assistant@a%2Fb")
    );
}

#[test]
fn the_event_writer_appends_and_syncs_on_flush() {
    let (_dir, root) = temp_root();
    let store = open(&root, "events");
    let mut writer = must(store.event_writer());
    must(writer.write_all(b"{\"n\":1}\n"));
    must(writer.flush());
    must(writer.flush());
    assert_eq!(must(fs::read_to_string(store.events_path())), "{\"n\":1}\n");
    drop(writer);

    // A second writer appends after the first; a torn tail is cut first.
    append_raw(store.events_path(), b"{\"n\":");
    let mut writer = must(store.event_writer());
    assert_eq!(must(fs::read_to_string(store.events_path())), "{\"n\":1}\n");
    must(writer.write_all(b"{\"n\":2}\n"));
    must(writer.flush());
    assert_eq!(must(fs::read_to_string(store.events_path())), "{\"n\":1}\n{\"n\":2}\n");
}

#[test]
fn the_event_writer_serves_a_json_lines_sink() {
    let (_dir, root) = temp_root();
    let store = open(&root, "sink");
    let sink = must(JsonLinesEventSink::new(must(store.event_writer())));
    for kind in [EventKind::TurnStarted, EventKind::TurnCompleted] {
        sink.emit(&RuntimeEvent {
            kind,
            trace_id: "0123456789abcdef0123456789abcdef",
            span_id: 1,
            parent_span_id: None,
            timestamp_ms: 1,
            agent_name: "assistant",
            instance_key: "sink",
            turn_id: "turn-1",
            step_id: None,
            tool: None,
            extra: None,
            call_scope: None,
        });
    }
    sink.flush();
    let text = must(fs::read_to_string(store.events_path()));
    let events: Vec<serde_json::Value> = text.lines().map(|line| must(serde_json::from_str(line))).collect();
    assert_eq!(events.len(), 2);
    assert_eq!(events.first().map(|event| &event["type"]), Some(&json!("turn.started")));
    assert_eq!(events.get(1).map(|event| &event["instanceKey"]), Some(&json!("sink")));
}

#[test]
fn an_instance_can_be_held_by_one_lock_at_a_time() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let root = Workspace::at(dir.path());
    let store = goondan_runtime::store::InstanceStore::open(&root, "shared", "a", std::path::Path::new("b.yaml"))
        .unwrap_or_else(|e| panic!("{e}"));
    let held = store.lock().unwrap_or_else(|e| panic!("{e}"));
    let again = goondan_runtime::store::InstanceStore::open(&root, "shared", "a", std::path::Path::new("b.yaml"))
        .unwrap_or_else(|e| panic!("{e}"));
    let busy = again.lock();
    assert!(matches!(busy, Err(goondan_runtime::store::StoreError::Busy { .. })), "{busy:?}");
    assert!(busy.err().is_some_and(|e| e.to_string().contains("in use by another process")));
    // The holder wrote its pid, which the refusal names.
    let pid = std::process::id();
    assert_eq!(must(fs::read_to_string(store.dir().join("lock"))), format!("{pid}\n"));
    let busy = again.lock();
    assert!(matches!(busy, Err(StoreError::Busy { pid: Some(p), .. }) if p == pid), "{busy:?}");
    assert!(busy.err().is_some_and(|e| e.to_string().contains(&format!("(pid {pid})"))));
    // A held instance is not deleted.
    let refused = goondan_runtime::store::delete_instance(&state(&root), &root, "a", "shared");
    assert!(matches!(refused, Err(goondan_runtime::store::StoreError::Busy { .. })), "{refused:?}");
    drop(held);
    assert!(again.lock().is_ok(), "released when the guard is dropped");
}

#[test]
fn edits_are_recorded_and_folded_on_load_and_a_rewrite_keeps_the_conversation() {
    let (_dir, root) = temp_root();
    let mut store = open(&root, "edits");
    let (a, b, c) = (user("a"), user("b"), user("c"));
    must(store.append(&[a.clone(), b.clone(), c.clone()]));
    let b2 = user("b, shorter");
    must(store.append_events(&[
        MessageEvent::Replace { target_id: b.id.clone(), message: b2.clone() },
        MessageEvent::Remove { target_id: a.id.clone() },
    ]));
    let loaded = must(store.load());
    assert_eq!(loaded.state.messages(), [b2.clone(), c.clone()]);
    assert_eq!(loaded.events_on_disk, 5);
    assert_eq!(loaded.skipped_events, 0);
    assert_every_line_is_a_commit(store.messages_path());

    // A rewrite replaces the log with the folded state, and appends go on in the new file.
    must(store.rewrite(loaded.state.messages()));
    assert_eq!(must(fs::read_to_string(store.messages_path())).lines().count(), 2);
    let d = user("d");
    must(store.append(std::slice::from_ref(&d)));
    drop(store);
    let store = open(&root, "edits");
    let loaded = must(store.load());
    assert_eq!(loaded.state.messages(), [b2, c, d]);
    assert_eq!(loaded.events_on_disk, 3);
    // No temp file is left behind.
    assert!(must(fs::read_dir(store.dir())).all(|entry| !must(entry).file_name().to_string_lossy().ends_with(".tmp")));

    // A truncate folds to nothing; an edit whose target is gone is skipped, not fatal.
    let mut store = open(&root, "edits");
    must(store.append_events(&[MessageEvent::Truncate, MessageEvent::Remove { target_id: "gone".into() }]));
    let loaded = must(store.load());
    assert!(loaded.state.messages().is_empty());
    assert_eq!(loaded.skipped_events, 1);
}

/// Makes an instance of `agent` for `key` with `messages`, written by the
/// bundle `bundle`, where an earlier version would have left it: under
/// `<root>/instances/`, as `<agent>@<key>` or (`oldest`) `<key>`.
fn old_layout_instance(
    root: &StateRoot,
    agent: &str,
    key: &str,
    bundle: &str,
    oldest: bool,
    messages: &[Message],
) -> PathBuf {
    let scratch = must(tempfile::tempdir());
    let mut store = must(InstanceStore::open(&Workspace::at(scratch.path()), key, agent, Path::new(bundle)));
    must(store.append(messages));
    must(store.record_turn());
    let dir = store.dir().to_path_buf();
    drop(store);
    let Some(name) = dir.file_name().and_then(|name| name.to_str()) else { panic!("{dir:?}") };
    let Some((_, encoded_key)) = name.split_once('@') else { panic!("{dir:?}") };
    let old = root.legacy_instances_dir().join(if oldest { encoded_key } else { name });
    must(fs::create_dir_all(root.legacy_instances_dir()));
    must(fs::rename(&dir, &old));
    old
}

#[test]
fn two_agents_with_the_same_key_get_separate_directories() {
    let (_dir, root) = temp_root();
    let mut assistant = must(InstanceStore::open(&root, "default", "assistant", Path::new("b")));
    let mut planner = must(InstanceStore::open(&root, "default", "planner", Path::new("b")));
    assert_ne!(assistant.dir(), planner.dir());
    assert_eq!(assistant.dir(), root.instances_dir().join("assistant@default"));
    assert_eq!(planner.dir(), root.instances_dir().join("planner@default"));
    must(assistant.append(&[user("to the assistant")]));
    must(planner.append(&[user("to the planner"), user("twice")]));
    // Each holds its own lock: both run at once.
    let _a = must(assistant.lock());
    let _p = must(planner.lock());
    drop((assistant, planner));

    let assistant = must(InstanceStore::open(&root, "default", "assistant", Path::new("b")));
    assert_eq!(must(assistant.messages()).messages.len(), 1);
    assert_eq!(assistant.info().agent_name, "assistant");
    let mut listed: Vec<(String, String, u64)> = must(list_instances(&state(&root)))
        .into_iter()
        .map(|found| (found.info.agent_name, found.info.instance_key, found.info.messages))
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        [("assistant".to_owned(), "default".to_owned(), 1), ("planner".to_owned(), "default".to_owned(), 2)]
    );
}

/// Names of every kind: any Unicode, and short ones made of the bytes
/// that matter to the encoding (kept, `%`, `@`, separators, dots).
fn name_strategy() -> impl Strategy<Value = String> {
    prop_oneof![any::<String>(), "[a-zA-Z0-9._%@/: -]{0,8}", Just(".".to_owned()), Just("..".to_owned())]
}

proptest! {
    #[test]
    fn directory_names_round_trip(agent in name_strategy(), key in name_strategy()) {
        match instance_dir_name(&agent, &key) {
            Some(name) => {
                prop_assert!(name.len() <= 255);
                prop_assert_eq!(name.matches('@').count(), 1);
                prop_assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-%@".contains(&b)), "{}", name);
                prop_assert_eq!(parse_instance_dir_name(&name), Some((agent, key)));
            }
            None => {
                let refused = |part: &str| part.is_empty() || part == "." || part == "..";
                let encoded_len = |part: &str| -> usize {
                    part.bytes().map(|b| if b.is_ascii_alphanumeric() || b"._-".contains(&b) { 1 } else { 3 }).sum()
                };
                prop_assert!(refused(&agent) || refused(&key) || encoded_len(&agent) + 1 + encoded_len(&key) > 255);
            }
        }
    }

    #[test]
    fn only_canonical_names_parse(name in "[A-Za-z0-9%@._/-]{0,12}") {
        if let Some((agent, key)) = parse_instance_dir_name(&name) {
            prop_assert_eq!(instance_dir_name(&agent, &key), Some(name));
        }
    }
}

#[test]
fn old_layout_instances_of_the_bundle_move_into_its_workspace_and_the_others_stay_listed() {
    let dir = must(tempfile::tempdir());
    let root = StateRoot::new(dir.path());
    let messages = every_variant();
    let mine = old_layout_instance(&root, "assistant", "user:1/chat", "/bundles/demo", false, &messages);
    let oldest = old_layout_instance(&root, "planner", "k", "/bundles/demo", true, &[user("oldest")]);
    let theirs = old_layout_instance(&root, "assistant", "default", "/bundles/other", false, &[user("theirs")]);
    assert_eq!(mine, root.legacy_instances_dir().join("assistant@user%3A1%2Fchat"));
    assert_eq!(oldest, root.legacy_instances_dir().join("k"));

    // Listed before anything moves, with the agent their instance.json names and no workspace.
    let listed = must(list_instances(&root));
    assert_eq!(listed.len(), 3);
    assert!(listed.iter().all(|found| found.legacy_layout && found.workspace.is_none()), "{listed:?}");

    // Looking moves nothing.
    let inspected = must(open_workspace(&root, "demo", "/bundles/demo", WorkspaceAccess::Inspect));
    assert!(inspected.info().is_none());
    assert!(mine.is_dir() && oldest.is_dir() && !inspected.dir().exists());

    // Using the workspace moves this bundle's instances in, conversation and counters kept.
    let workspace = must(open_workspace(&root, "demo", "/bundles/demo", WorkspaceAccess::Use));
    assert!(!mine.exists() && !oldest.exists());
    assert!(theirs.is_dir(), "another bundle's instance stays for that bundle");
    let store = must(InstanceStore::open(&workspace, "user:1/chat", "assistant", Path::new("/bundles/demo")));
    assert_eq!(store.dir(), workspace.instances_dir().join("assistant@user%3A1%2Fchat"));
    assert_eq!(must(store.messages()).messages, messages);
    assert_eq!((store.info().turns, store.info().messages), (1, 8));
    let store = must(InstanceStore::open(&workspace, "k", "planner", Path::new("/bundles/demo")));
    assert_eq!(must(store.messages()).messages.len(), 1);

    let mut listed: Vec<(Option<String>, String, bool)> = must(list_instances(&root))
        .into_iter()
        .map(|found| (found.workspace, found.info.agent_name, found.legacy_layout))
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        [
            (None, "assistant".to_owned(), true),
            (Some("demo".to_owned()), "assistant".to_owned(), false),
            (Some("demo".to_owned()), "planner".to_owned(), false),
        ]
    );
    // The other bundle's moves into its own workspace (same Swarm name, other id here).
    let other = must(open_workspace(&root, "other", "/bundles/other", WorkspaceAccess::Use));
    assert!(!theirs.exists());
    assert!(other.instances_dir().join("assistant@default").is_dir());
    assert!(!root.legacy_instances_dir().exists(), "the emptied old directory goes");
}

#[test]
fn an_old_layout_directory_is_never_moved_over_an_existing_one_nor_while_in_use() {
    let (_dir, workspace) = temp_root();
    let root = state(&workspace);
    let mut store = open(&workspace, "both");
    must(store.append(&[user("new")]));
    drop(store);
    let old = old_layout_instance(&root, "assistant", "both", "/bundles/demo", false, &[user("old")]);
    must(open_workspace(&root, "demo", "/bundles/demo", WorkspaceAccess::Use));
    let store = open(&workspace, "both");
    assert_eq!(must(store.messages()).messages.first().map(|m| &m.data), Some(&user("new").data));
    let kept: Vec<MessageData> = must(read_old_messages(&old)).into_iter().map(|m| m.data).collect();
    assert_eq!(kept, [user("old").data], "untouched");
    assert_eq!(must(list_instances(&root)).len(), 2, "both listed");
    must(fs::remove_dir_all(&old));

    // A process of an earlier version runs it: it holds the lock (and wrote no pid).
    let busy = old_layout_instance(&root, "assistant", "busy", "/bundles/demo", true, &[user("hi")]);
    let lock = must(fs::File::create(busy.join("lock")));
    must(lock.try_lock());
    must(open_workspace(&root, "demo", "/bundles/demo", WorkspaceAccess::Use));
    assert!(busy.is_dir());
    let listed = must(list_instances(&root));
    let held = listed.iter().find(|found| found.legacy_layout).map(|found| found.status);
    assert_eq!(held, Some(LockStatus { running: true, pid: None }));
    drop(lock);
    must(open_workspace(&root, "demo", "/bundles/demo", WorkspaceAccess::Use));
    assert!(!busy.exists());
    assert!(workspace.instances_dir().join("assistant@busy").is_dir());
}

fn read_old_messages(dir: &Path) -> Result<Vec<Message>, StoreError> {
    goondan_runtime::store::read_message_log(&dir.join("messages.jsonl")).map(|loaded| loaded.state.messages().to_vec())
}

#[test]
fn a_workspace_belongs_to_one_bundle_unless_another_takes_it_over() {
    let dir = must(tempfile::tempdir());
    let root = StateRoot::new(dir.path());
    let first = must(open_workspace(&root, "default", "/projects/a/goondan.yaml", WorkspaceAccess::Use));
    assert_eq!(first.id(), "default");
    assert_eq!(first.info().map(|info| info.bundle.as_str()), Some("/projects/a/goondan.yaml"));
    let written: serde_json::Value = must(serde_json::from_slice(&must(fs::read(first.dir().join("workspace.json")))));
    assert_eq!(written["workspaceId"], "default");
    assert_eq!(written["bundle"], "/projects/a/goondan.yaml");
    // Same bundle again: the same workspace.
    assert_eq!(must(open_workspace(&root, "default", "/projects/a/goondan.yaml", WorkspaceAccess::Use)), first);

    // Another bundle whose Swarm has the same name is refused, naming both, even to look.
    for access in [WorkspaceAccess::Inspect, WorkspaceAccess::Use] {
        let refused = open_workspace(&root, "Default", "/projects/b/goondan.yaml", access);
        let Err(error @ StoreError::ForeignWorkspace { .. }) = refused else { panic!("{refused:?}") };
        let message = error.to_string();
        assert!(
            message.contains("/projects/a/goondan.yaml") && message.contains("/projects/b/goondan.yaml"),
            "{message}"
        );
    }
    // Taking it over (a project that moved) rewrites the owner.
    let adopted = must(open_workspace(&root, "default", "/projects/b/goondan.yaml", WorkspaceAccess::Adopt));
    assert_eq!(adopted.info().map(|info| info.bundle.as_str()), Some("/projects/b/goondan.yaml"));
    assert!(open_workspace(&root, "default", "/projects/a/goondan.yaml", WorkspaceAccess::Use).is_err());

    // Racing creators agree on one owner.
    let racers: Vec<_> = (0..8)
        .map(|n| {
            let root = root.clone();
            std::thread::spawn(move || open_workspace(&root, "race", &format!("/b{n}"), WorkspaceAccess::Use).is_ok())
        })
        .collect();
    let won = racers.into_iter().map(|racer| racer.join().unwrap_or(false)).filter(|won| *won).count();
    assert_eq!(won, 1);
}

#[test]
fn workspace_ids_are_the_originals_slugs() {
    for (name, id) in [
        ("main:prod", "main-prod"),
        ("  My Swarm  ", "my-swarm"),
        ("a//b", "a-b"),
        ("--x--", "x"),
        ("", "default"),
        ("::", "default"),
        ("..", "default"),
        ("v1.2_beta", "v1.2_beta"),
        ("한글", "default"),
    ] {
        assert_eq!(workspace_id(name), id, "{name:?}");
    }
    assert_eq!(workspace_id(&"x".repeat(300)).len(), 128);
}

#[test]
fn list_reports_a_held_instance_as_running_with_its_pid() {
    let (_dir, root) = temp_root();
    let store = open(&root, "held");
    let idle = open(&root, "idle");
    // Never locked: no lock file, and asking creates none.
    assert_eq!(must(lock_status(idle.dir())), LockStatus::default());
    assert!(!idle.dir().join("lock").exists());
    assert_eq!(must(lock_status(&root.instances_dir().join("nowhere"))), LockStatus::default());

    let held = must(store.lock());
    let status = |key: &str| {
        must(list_instances(&state(&root)))
            .into_iter()
            .find(|found| found.info.instance_key == key)
            .map(|found| found.status)
    };
    let running = LockStatus { running: true, pid: Some(std::process::id()) };
    assert_eq!(status("held"), Some(running));
    assert_eq!(must(lock_status(store.dir())), running);
    assert_eq!(status("idle"), Some(LockStatus::default()));
    // Asking does not get in the holder's way, nor in the way of the next one.
    assert_eq!(status("held"), Some(running));
    drop(held);
    // Released: idle, and the pid is gone from the file.
    assert_eq!(status("held"), Some(LockStatus::default()));
    assert_eq!(must(fs::read_to_string(store.dir().join("lock"))), "");
    // A pid left by a process that crashed is not reported: nobody holds the lock.
    must(fs::write(store.dir().join("lock"), "4242\n"));
    assert_eq!(status("held"), Some(LockStatus::default()));
    let again = must(store.lock());
    assert_eq!(status("held"), Some(running));
    drop(again);

    let json = must(serde_json::to_value(must(list_instances(&state(&root)))));
    let first = &json[0];
    for field in ["agentName", "instanceKey", "running", "pid", "dir", "legacyLayout", "turns", "messages"] {
        assert!(first.get(field).is_some(), "{field} in {first}");
    }
}

#[test]
fn deleting_a_key_removes_every_agents_instance_of_it_or_nothing() {
    let (_dir, root) = temp_root();
    let state_root = state(&root);
    let old = old_layout_instance(&state_root, "coder", "shared", "/bundles/demo", true, &[user("old")]);
    let foreign = old_layout_instance(&state_root, "reviewer", "shared", "/bundles/other", false, &[user("theirs")]);
    let assistant = must(InstanceStore::open(&root, "shared", "assistant", Path::new("b")));
    let planner = must(InstanceStore::open(&root, "shared", "planner", Path::new("b")));
    let other_key = must(InstanceStore::open(&root, "other", "assistant", Path::new("b")));
    let dirs = [assistant.dir().to_path_buf(), planner.dir().to_path_buf(), old.clone()];

    // One of them runs: nothing is deleted, and the refusal names it.
    let held = must(planner.lock());
    let refused = delete_instances(&state(&root), &root, "shared", None);
    assert!(
        matches!(&refused, Err(StoreError::Busy { agent, pid: Some(pid), .. }) if agent == "planner" && *pid == std::process::id()),
        "{refused:?}"
    );
    assert!(dirs.iter().all(|dir| dir.is_dir()));
    // Another agent's instance of the key can go alone: the old layout's of this bundle.
    let deleted = must(delete_instances(&state(&root), &root, "shared", Some("coder")));
    assert_eq!(deleted.len(), 1);
    assert!(deleted.iter().all(|gone| gone.agent_name == "coder" && gone.legacy_layout && gone.dir == old));
    assert!(!old.exists());
    drop(held);

    let old = old_layout_instance(&state_root, "coder", "shared", "/bundles/demo", false, &[user("old")]);
    let deleted = must(delete_instances(&state(&root), &root, "shared", None));
    let agents: Vec<&str> = deleted.iter().map(|gone| gone.agent_name.as_str()).collect();
    assert_eq!(agents, ["assistant", "planner", "coder"]);
    assert!(dirs.iter().all(|dir| !dir.exists()));
    assert!(!old.exists());
    assert!(other_key.dir().is_dir());
    assert!(foreign.is_dir(), "another bundle's old instance is not this project's to delete");
    assert!(must(delete_instances(&state(&root), &root, "shared", None)).is_empty());
}

#[test]
fn a_fresh_start_clears_the_conversations_it_selects_and_keeps_the_rest() {
    let (_dir, root) = temp_root();
    let mut assistant = must(InstanceStore::open(&root, "shared", "assistant", Path::new("b")));
    let mut planner = must(InstanceStore::open(&root, "shared", "planner", Path::new("b")));
    let mut other = must(InstanceStore::open(&root, "other", "assistant", Path::new("b")));
    for store in [&mut assistant, &mut planner, &mut other] {
        must(store.append(&[user("hello")]));
        must(store.record_turn());
        // The exports for the original's tools, as a turn leaves them.
        must(store.write_base_export(b"{}\n", false));
        must(must(store.runtime_events_export()).write_all(b"{}\n"));
    }
    let exports = |dir: &Path| {
        [InstanceStore::BASE_EXPORT_FILE, InstanceStore::RUNTIME_EVENTS_FILE]
            .map(|file| dir.join(InstanceStore::EXPORT_DIR).join(file).exists())
    };
    assert_eq!(exports(assistant.dir()), [true, true]);
    let state_file = assistant.dir().join("extensions").join("memory.json");
    must(fs::create_dir_all(assistant.dir().join("extensions")));
    must(fs::write(&state_file, "{\"kept\": true}"));
    must(fs::write(assistant.events_path(), "{}\n"));

    // A running instance among them: nothing is cleared.
    let held = must(planner.lock());
    let refused = reset_conversations(&root, Some("shared"), None);
    assert!(matches!(&refused, Err(StoreError::Busy { agent, .. }) if agent == "planner"), "{refused:?}");
    assert_eq!(must(assistant.messages()).messages.len(), 1);
    drop(held);

    let reset = must(reset_conversations(&root, Some("shared"), None));
    let names: Vec<(&str, &str)> = reset.iter().map(|r| (r.agent_name.as_str(), r.instance_key.as_str())).collect();
    assert_eq!(names, [("assistant", "shared"), ("planner", "shared")]);
    for dir in [assistant.dir(), planner.dir()] {
        assert!(!dir.join("messages.jsonl").exists() && !dir.join("events.jsonl").exists());
        assert_eq!(exports(dir), [false, false], "the original's --fresh clears runtime-events.jsonl and base.jsonl");
        let reopened = must(InstanceStore::open(
            &root,
            "shared",
            if dir == assistant.dir() { "assistant" } else { "planner" },
            Path::new("b"),
        ));
        assert!(must(reopened.messages()).messages.is_empty());
        assert_eq!((reopened.info().turns, reopened.info().messages), (0, 0));
    }
    assert!(state_file.is_file(), "extension state is not conversation");
    assert_eq!(must(other.messages()).messages.len(), 1, "another key is not selected");
    assert_eq!(exports(other.dir()), [true, true]);

    // By agent, across keys.
    let reset = must(reset_conversations(&root, None, Some("assistant")));
    assert_eq!(reset.len(), 2);
    assert!(must(other.messages()).messages.is_empty());
    assert_eq!(exports(other.dir()), [false, false]);
}

/// A process killed while it replaced a file atomically leaves its temp file
/// (`.<name>.<pid>.tmp`), in the instance's directory or in its exports'
/// `messages/` (base.jsonl's rewrite); the next process to lock the instance
/// removes both (found by the crash matrix: a kill mid-export left one).
#[test]
fn the_next_lock_removes_temp_files_a_killed_writer_left_in_the_instance_and_its_exports() {
    let (_temp, root) = temp_root();
    let store = open(&root, "stale");
    // A pid that no longer runs: a child that has exited and been reaped.
    let mut child = must(std::process::Command::new("true").spawn());
    let dead = child.id();
    must(child.wait());
    let exports = store.dir().join(InstanceStore::EXPORT_DIR);
    must(fs::create_dir_all(&exports));
    let left = [
        store.dir().join(format!(".{}.{dead}.tmp", InstanceStore::MESSAGES_FILE)),
        exports.join(format!(".{}.{dead}.tmp", InstanceStore::BASE_EXPORT_FILE)),
    ];
    for path in &left {
        must(fs::write(path, "half a file"));
    }
    let _held = must(store.lock());
    for path in &left {
        assert!(!path.exists(), "{} was left behind", path.display());
    }
}
