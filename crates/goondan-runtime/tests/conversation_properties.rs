//! Message events through the durable store, with crashes.
//!
//! Random sequences of message events — valid or not, with the runtime's
//! commits in between — are applied to a conversation saved by
//! `InstanceLog` (compacting eagerly, so rewrites happen too). At random
//! points the process "crashes": the in-memory state and the store are
//! dropped without further calls, sometimes with a torn partial line left at
//! the end of the log. Properties:
//!
//! - after every commit, the conversation satisfies the rule: every tool call
//!   has exactly one result right after its assistant message, every result
//!   answers a call;
//! - reloading after a crash gives exactly the state of the last commit;
//! - a complete line that turns unreadable (not only a torn tail) loses what
//!   it held, but the loaded conversation still keeps the rule;
//! - the conversation goes on from there;
//! - at the end of every turn, the export for the original's tools
//!   (`messages/base.jsonl`) holds the conversation's messages, in order,
//!   whether it was appended to or rewritten;
//! - a log made of any mix of lines — messages and commits in any order,
//!   edits of missing messages, garbage, a torn tail — loads into a
//!   conversation that keeps the rule (loading repairs).

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use goondan_core::{
    ConversationState, JsonObject, Message, MessageData, MessageEvent, MessageSource, ToolCall, ToolResult,
};
use goondan_runtime::conversation::{ConversationStore, InstanceLog};
use goondan_runtime::store::{InstanceStore, Workspace, read_message_log};
use proptest::prelude::*;
use serde_json::json;

#[derive(Debug, Clone)]
enum Op {
    User,
    /// An assistant message with this many calls.
    Assistant(usize),
    /// A result for the n-th call seen so far (modulo), or for an unknown call.
    Result(Option<usize>),
    /// Replace the n-th message (modulo) with a user message, or an unknown id.
    Replace(Option<usize>),
    /// Remove the n-th message (modulo), or an unknown id.
    Remove(Option<usize>),
    Truncate,
    Commit,
    /// Crash, leaving this many bytes of a torn line (0: none).
    Crash(usize),
    /// Crash, and a complete line before the last (the n-th, modulo) turns
    /// unreadable: a disk error, a hand edit.
    CorruptLine(usize),
    /// The turn ends (after its last commit) and the next begins.
    TurnEnd,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::User),
        3 => (0usize..3).prop_map(Op::Assistant),
        4 => proptest::option::weighted(0.9, 0usize..16).prop_map(Op::Result),
        2 => proptest::option::weighted(0.8, 0usize..16).prop_map(Op::Replace),
        2 => proptest::option::weighted(0.8, 0usize..16).prop_map(Op::Remove),
        1 => Just(Op::Truncate),
        4 => Just(Op::Commit),
        1 => (0usize..200).prop_map(Op::Crash),
        1 => (0usize..64).prop_map(Op::CorruptLine),
        2 => Just(Op::TurnEnd),
    ]
}

fn user(n: usize) -> Message {
    Message::new(MessageData::User { content: format!("user {n}") }, MessageSource::User)
}

fn result(call_id: &str) -> Message {
    Message::new(
        MessageData::Tool {
            tool_call_id: call_id.to_owned(),
            tool_name: "echo__say".into(),
            result: Box::new(ToolResult::ok(json!({"echo": call_id}))),
        },
        MessageSource::Tool { tool_call_id: call_id.to_owned(), tool_name: "echo__say".into() },
    )
}

/// The rule, checked independently of the code that enforces it.
fn assert_rule(messages: &[Message]) -> Result<(), TestCaseError> {
    let mut index = 0;
    while index < messages.len() {
        match &messages[index].data {
            MessageData::Assistant { tool_calls, .. } => {
                for (at, call) in tool_calls.iter().enumerate() {
                    prop_assert!(tool_calls[..at].iter().all(|earlier| earlier.id != call.id), "two calls with one id");
                }
                let mut answered: Vec<&str> = Vec::new();
                index += 1;
                while let Some(MessageData::Tool { tool_call_id, .. }) = messages.get(index).map(|m| &m.data) {
                    prop_assert!(tool_calls.iter().any(|c| *c.id == **tool_call_id), "a result for another call");
                    prop_assert!(!answered.contains(&tool_call_id.as_str()), "two results for one call");
                    answered.push(tool_call_id);
                    index += 1;
                }
                prop_assert_eq!(answered.len(), tool_calls.len(), "a call without a result");
            }
            MessageData::Tool { .. } => prop_assert!(false, "a result without its call"),
            _ => index += 1,
        }
    }
    Ok(())
}

fn open(root: &Workspace) -> (InstanceStore, goondan_runtime::store::LoadedConversation) {
    let store = InstanceStore::open(root, "prop", "agent", Path::new("/bundle")).unwrap_or_else(|e| panic!("{e}"));
    let loaded = store.load().unwrap_or_else(|e| panic!("{e}"));
    (store, loaded)
}

/// (id, role) of each line of the instance's `messages/base.jsonl`.
fn exported(messages_path: &Path) -> Vec<(String, String)> {
    let path = messages_path.with_file_name(InstanceStore::EXPORT_DIR).join(InstanceStore::BASE_EXPORT_FILE);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
            let field = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            (field(&value["id"]), field(&value["data"]["role"]))
        })
        .collect()
}

/// (id, role) of `messages`, as the export should list them.
fn listed(messages: &[Message]) -> Vec<(String, String)> {
    messages
        .iter()
        .map(|m| {
            let role = match m.data {
                MessageData::System { .. } => "system",
                MessageData::User { .. } => "user",
                MessageData::Assistant { .. } => "assistant",
                MessageData::Tool { .. } => "tool",
            };
            (m.id.clone(), role.to_owned())
        })
        .collect()
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let root = Workspace::at(dir.path());
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap_or_else(|e| panic!("{e}"));
    let (store, loaded) = open(&root);
    let messages_path = store.messages_path().to_path_buf();
    let mut log = InstanceLog::new(store, loaded.events_on_disk).with_compaction_slack(0);
    let mut state = loaded.state;
    let mut durable = state.clone();
    let mut calls: Vec<String> = Vec::new();
    let mut counter = 0;
    let mut corrupted_log = false;
    for op in ops {
        counter += 1;
        let ids: Vec<String> = state.messages().iter().map(|m| m.id.clone()).collect();
        let pick = |n: Option<usize>| match n {
            Some(n) if !ids.is_empty() => ids[n % ids.len()].clone(),
            _ => "no-such-message".to_owned(),
        };
        match op {
            Op::User => state.append_new([user(counter)]),
            Op::Assistant(n) => {
                let tool_calls: Vec<ToolCall> =
                    (0..n).map(|i| ToolCall::new(format!("c{counter}-{i}"), "echo__say", JsonObject::new())).collect();
                calls.extend(tool_calls.iter().map(|c| c.id.to_string()));
                state.append_new([Message::assistant_tool_calls("s", tool_calls)]);
            }
            Op::Result(n) => {
                let call = match n {
                    Some(n) if !calls.is_empty() => calls[n % calls.len()].clone(),
                    _ => "unknown-call".to_owned(),
                };
                state.append_new([result(&call)]);
            }
            Op::Replace(n) => {
                let before = state.clone();
                let target_id = pick(n);
                let outcome = state.emit(MessageEvent::Replace { target_id, message: user(counter) });
                if outcome.is_err() {
                    prop_assert_eq!(&state, &before, "a refused event changes nothing");
                }
            }
            Op::Remove(n) => {
                let _ = state.emit(MessageEvent::Remove { target_id: pick(n) });
            }
            Op::Truncate => {
                let _ = state.emit(MessageEvent::Truncate);
            }
            Op::Commit => {
                if state.commit() {
                    runtime.block_on(log.commit(state.last_batch(), &state)).unwrap_or_else(|e| panic!("{e}"));
                }
                assert_rule(state.messages())?;
                durable = state.clone();
            }
            Op::Crash(torn) => {
                drop(log);
                if torn > 0 {
                    let line = serde_json::to_string(&json!({"events": [{"type": "append", "message": user(0)}]}))
                        .unwrap_or_default();
                    let cut = torn.min(line.len().saturating_sub(1)).max(1);
                    let mut file =
                        std::fs::OpenOptions::new().append(true).open(&messages_path).unwrap_or_else(|e| panic!("{e}"));
                    file.write_all(&line.as_bytes()[..cut]).unwrap_or_else(|e| panic!("{e}"));
                }
                let (store, loaded) = open(&root);
                prop_assert_eq!(loaded.state.messages(), durable.messages(), "reload gives the last commit");
                if !corrupted_log {
                    prop_assert_eq!(loaded.skipped_corrupt_lines, 0);
                    prop_assert_eq!(loaded.skipped_events, 0);
                }
                log = InstanceLog::new(store, loaded.events_on_disk).with_compaction_slack(0);
                state = loaded.state;
            }
            Op::TurnEnd => {
                if state.commit() {
                    runtime.block_on(log.commit(state.last_batch(), &state)).unwrap_or_else(|e| panic!("{e}"));
                }
                durable = state.clone();
                runtime.block_on(log.turn_ended(&state)).unwrap_or_else(|e| panic!("{e}"));
                prop_assert_eq!(exported(&messages_path), listed(state.messages()), "base.jsonl after the turn");
                state.begin_turn();
            }
            Op::CorruptLine(n) => {
                drop(log);
                let text = std::fs::read_to_string(&messages_path).unwrap_or_else(|e| panic!("{e}"));
                let mut lines: Vec<&str> = text.lines().collect();
                if lines.len() >= 2 {
                    let bad = n % (lines.len() - 1);
                    lines[bad] = "{\"events\": [not json";
                    let mut corrupted = lines.join("\n");
                    corrupted.push('\n');
                    std::fs::write(&messages_path, corrupted).unwrap_or_else(|e| panic!("{e}"));
                    // The bad line stays until a rewrite, and edits after it
                    // may miss their targets: both are skipped, not errors.
                    corrupted_log = true;
                }
                let (store, loaded) = open(&root);
                // Whatever the lost line held, the loaded conversation keeps the rule.
                assert_rule(loaded.state.messages())?;
                log = InstanceLog::new(store, loaded.events_on_disk).with_compaction_slack(0);
                state = loaded.state;
                // The runtime saves load's repairs before its next turn; from
                // there on reloads give the committed state again.
                if state.commit() {
                    runtime.block_on(log.commit(state.last_batch(), &state)).unwrap_or_else(|e| panic!("{e}"));
                }
                durable = state.clone();
            }
        }
    }
    // A final clean shutdown keeps what was committed, and only that.
    if state.commit() {
        runtime.block_on(log.commit(state.last_batch(), &state)).unwrap_or_else(|e| panic!("{e}"));
    }
    drop(log);
    let (_store, loaded) = open(&root);
    prop_assert_eq!(loaded.state.messages(), state.messages());
    assert_rule(loaded.state.messages())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn committed_states_survive_crashes_and_keep_the_rule(ops in proptest::collection::vec(op(), 1..60)) {
        run(ops)?;
    }
}

/// One line of a hand-written or damaged log. Calls `c0`–`c2` and messages
/// `m0`–`m5` are drawn from small pools so that results, edits and calls
/// meet each other often.
fn log_line() -> impl Strategy<Value = String> {
    let id = (0usize..6).prop_map(|n| format!("m{n}"));
    let call = (0usize..3).prop_map(|n| format!("c{n}"));
    let message = prop_oneof![
        id.clone().prop_map(|id| json!({"id": id, "data": {"role": "user", "content": "u"}, "createdAt": 1, "source": {"type": "user"}})),
        // Calls may repeat an id within one message: loading drops the repeats.
        (id.clone(), proptest::collection::vec(0usize..3, 0..=3)).prop_map(|(id, calls)| {
            let calls: Vec<_> = calls.iter().map(|c| json!({"id": format!("c{c}"), "name": "echo__say", "args": {}})).collect();
            json!({"id": id, "data": {"role": "assistant", "toolCalls": calls}, "createdAt": 2, "source": {"type": "assistant", "stepId": "s"}})
        }),
        (id.clone(), call).prop_map(|(id, call)| json!({
            "id": id,
            "data": {"role": "tool", "toolCallId": call, "toolName": "echo__say", "result": {"status": "ok"}},
            "createdAt": 3,
            "source": {"type": "tool", "toolCallId": call, "toolName": "echo__say"}
        })),
    ];
    let event = prop_oneof![
        3 => message.clone().prop_map(|m| json!({"type": "append", "message": m})),
        1 => (id.clone(), message.clone()).prop_map(|(target, m)| json!({"type": "replace", "targetId": target, "message": m})),
        1 => id.prop_map(|target| json!({"type": "remove", "targetId": target})),
        1 => Just(json!({"type": "truncate"})),
    ];
    prop_oneof![
        3 => message.prop_map(|m| m.to_string()),
        3 => proptest::collection::vec(event, 0..4).prop_map(|events| json!({"events": events}).to_string()),
        1 => Just("{\"events\": [not json".to_owned()),
        1 => Just(String::new()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn any_log_loads_into_a_conversation_that_keeps_the_rule(
        lines in proptest::collection::vec(log_line(), 0..12),
        torn in proptest::option::of(0usize..40),
    ) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("messages.jsonl");
        let mut text = lines.join("\n");
        text.push('\n');
        if let Some(torn) = torn {
            // An interrupted write: part of one more line, without its newline.
            let last = r#"{"events": [{"type": "append", "message": {"id": "m9", "data": {"role": "user", "content": "x"}}}]}"#;
            text.push_str(&last[..torn.min(last.len())]);
        }
        std::fs::write(&path, &text).unwrap_or_else(|e| panic!("{e}"));
        let loaded = read_message_log(&path).unwrap_or_else(|e| panic!("{e}"));
        prop_assert!(loaded.state.is_consistent(), "{:?} {}", loaded.state.messages(), loaded.repairs);
        assert_rule(loaded.state.messages())?;
    }
}

#[test]
fn a_conversation_store_is_shared_through_the_trait() {
    // InstanceLog is usable as the runtime's store object.
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (store, loaded) = open(&Workspace::at(dir.path()));
    let log: Arc<dyn ConversationStore> = Arc::new(InstanceLog::new(store, loaded.events_on_disk));
    let mut state = ConversationState::default();
    state.append_new([user(1)]);
    assert!(state.commit());
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap_or_else(|e| panic!("{e}"));
    runtime.block_on(log.commit(state.last_batch(), &state)).unwrap_or_else(|e| panic!("{e}"));
    let reloaded = runtime.block_on(log.reload()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(reloaded.map(|s| s.messages().to_vec()), Some(state.messages().to_vec()));
}
