//! The native `@goondan/base` extensions context-message, message-window,
//! message-compaction and message-integrity, through `gdn run` on
//! `tests/fixtures/base-extensions`: each test runs turns against a local
//! OpenAI-compatible server that records every request, and checks what the
//! model received.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

mod common;
use common::js_runtime_usable;

const PROMPT: &str = "You are the base-extensions test agent.";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/base-extensions")
}

/// The model: the fake model server, streaming a reply chosen by the
/// fixture's rule ([`reply_to`]) and recording each request.
struct Model(goondan_test_support::FakeModel);

impl Model {
    fn start() -> Self {
        let model = goondan_test_support::FakeModel::start(|request| {
            let delta = reply_to(&request.body);
            let finish = if delta.get("tool_calls").is_some() { "tool_calls" } else { "stop" };
            goondan_test_support::Reply::deltas(vec![delta], finish)
        });
        Self(model.unwrap_or_else(|e| panic!("model server: {e}")))
    }

    /// The requests so far, taken out.
    fn take(&self) -> Vec<Value> {
        self.0.take_requests().into_iter().map(|request| request.body).collect()
    }
}

/// The fixture's rule: after a tool result "done"; a user message with CALL
/// gets a text-transform call, one with ASK an agents__request to `callee`;
/// anything else "ok".
fn reply_to(request: &Value) -> Value {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let last = messages.last().cloned().unwrap_or(Value::Null);
    if last["role"] == "tool" {
        return json!({"role": "assistant", "content": "done"});
    }
    if last["role"] == "user" && last["content"].as_str().is_some_and(|text| text.contains("CALL")) {
        let arguments = json!({"text": "abc", "to": "upper"}).to_string();
        return json!({"role": "assistant", "tool_calls": [{"index": 0, "id": format!("call_{}", messages.len()),
            "type": "function", "function": {"name": "text-transform__case", "arguments": arguments}}]});
    }
    if last["role"] == "user" && last["content"].as_str().is_some_and(|text| text.contains("ASK")) {
        let arguments = json!({"target": "callee", "input": "hi from caller"}).to_string();
        return json!({"role": "assistant", "tool_calls": [{"index": 0, "id": format!("call_{}", messages.len()),
            "type": "function", "function": {"name": "agents__request", "arguments": arguments}}]});
    }
    json!({"role": "assistant", "content": "ok"})
}

/// One `gdn run` turn of `agent` in `state`.
fn run(model: &Model, state: &Path, agent: &str, input: &str) -> Value {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gdn"));
    command
        .arg("--state-root")
        .arg(state)
        .arg("-c")
        .arg(fixture())
        .args(["--json", "run", "--agent", agent, "--input", input])
        .env("NO_COLOR", "1")
        .env("OPENAI_API_KEY", "sk-test")
        .env("OPENAI_BASE_URL", model.0.url())
        .env_remove("GOONDAN_STATE_ROOT")
        .stdin(Stdio::null());
    let output: Output = command.output().unwrap_or_else(|e| panic!("spawn gdn: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "gdn run {agent}: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn temp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"))
}

/// `(role, content or "")` of each message a request carried.
fn roles_and_texts(request: &Value) -> Vec<(String, String)> {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (m["role"].as_str().unwrap_or_default().to_owned(), m["content"].as_str().unwrap_or_default().to_owned())
        })
        .collect()
}

fn roles(request: &Value) -> Vec<String> {
    roles_and_texts(request).into_iter().map(|(role, _)| role).collect()
}

/// The runtime's own rule, checked on the wire: every tool call of an
/// assistant message is answered right after it, once, and every tool
/// message answers such a call.
fn assert_pairs_whole(request: &Value) {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let mut open: Vec<String> = Vec::new();
    for message in &messages {
        match message["role"].as_str() {
            Some("tool") => {
                let id = message["tool_call_id"].as_str().unwrap_or_default().to_owned();
                let at = open.iter().position(|call| *call == id);
                assert!(at.is_some(), "a result without its call: {request}");
                open.retain(|call| *call != id);
            }
            role => {
                assert!(open.is_empty(), "calls without results before a {role:?} message: {request}");
                open = message["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|call| call["id"].as_str().unwrap_or_default().to_owned())
                    .collect();
            }
        }
    }
    assert!(open.is_empty(), "calls without results at the end: {request}");
}

#[test]
fn without_context_message_the_prompt_goes_once_as_the_requests_system_text() {
    let model = Model::start();
    let state = temp();
    run(&model, state.path(), "plain", "hello");
    let requests = model.take();
    assert_eq!(requests.len(), 1);
    assert_eq!(roles_and_texts(&requests[0]), [("system".into(), PROMPT.into()), ("user".into(), "hello".into())]);
}

#[test]
fn context_message_sends_the_prompt_once_with_the_swarm_catalog_and_not_again_next_turn() {
    let model = Model::start();
    let state = temp();
    let first = run(&model, state.path(), "prompted", "hello");
    assert_eq!(first["text"], "ok");
    run(&model, state.path(), "prompted", "again");
    let requests = model.take();
    assert_eq!(requests.len(), 2);
    let context = format!(
        "{PROMPT}\n\n[runtime_catalog]\nswarm=default\nentryAgent=prompted\nselfAgent=prompted\n\
         availableAgents=callee, caller, compacted, guarded, plain, prompted, truncated, unguarded, windowed\n\
         callableAgents=callee, caller, compacted, guarded, plain, truncated, unguarded, windowed\n[/runtime_catalog]\n\
         Delegate only to callableAgents."
    );
    assert_eq!(roles_and_texts(&requests[0]), [("system".into(), context.clone()), ("user".into(), "hello".into())]);
    // The next turn finds its context message in the conversation: not appended twice.
    assert_eq!(
        roles_and_texts(&requests[1]),
        [
            ("system".into(), context),
            ("user".into(), "hello".into()),
            ("assistant".into(), "ok".into()),
            ("user".into(), "again".into())
        ]
    );
    for request in &requests {
        assert_eq!(request.to_string().matches(PROMPT).count(), 1, "the prompt once: {request}");
    }
}

#[test]
fn context_message_tells_a_called_agent_where_its_input_came_from() {
    let model = Model::start();
    let state = temp();
    let answer = run(&model, state.path(), "caller", "ASK the callee");
    assert_eq!(answer["text"], "done", "{answer}");
    let requests = model.take();
    // caller (the request), callee (its turn), caller (after the result).
    assert_eq!(requests.len(), 3, "{requests:#?}");
    let callee = &requests[1];
    let messages = roles_and_texts(callee);
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[1], ("user".into(), "hi from caller".into()));
    let (role, context) = &messages[0];
    assert_eq!(role, "system");
    let lines: Vec<&str> = context.lines().collect();
    for expected in [
        "[runtime_inbound]",
        "sourceKind=agent",
        "sourceName=caller",
        "instanceKey=default",
        "[runtime_call]",
        "callerAgent=caller",
        "callerInstanceKey=default",
        "replyTo.target=caller",
        "[runtime_route]",
        "precedence=call>inbound",
        "senderKind=agent",
        "senderName=caller",
        "senderInstanceKey=default",
    ] {
        assert!(lines.contains(&expected), "{expected} missing from:\n{context}");
    }
    assert!(lines.iter().any(|line| line.starts_with("replyTo.correlationId=") && line.len() > 22), "{context}");
    // includeAgentPrompt: false — with context-message in charge of the
    // system context, the agent's prompt is not sent at all (as the original).
    assert!(!callee.to_string().contains("this prompt is left out"), "{callee}");
}

#[test]
fn message_window_keeps_the_last_messages_without_splitting_a_call_from_its_result() {
    let model = Model::start();
    let state = temp();
    let first = run(&model, state.path(), "windowed", "CALL one");
    assert_eq!(first["text"], "done");
    run(&model, state.path(), "windowed", "two");
    let requests = model.take();
    assert_eq!(requests.len(), 3, "{requests:#?}");
    assert_eq!(roles(&requests[1]), ["user", "assistant", "tool"]);
    // Four messages, window of two: the cut after the user message would
    // keep the result without its call; the pair goes whole.
    assert_eq!(roles_and_texts(&requests[2]), [("assistant".into(), "done".into()), ("user".into(), "two".into())]);
    for request in &requests {
        assert_pairs_whole(request);
    }
}

#[test]
fn message_compaction_removes_the_oldest_and_says_so_in_a_summary() {
    let model = Model::start();
    let state = temp();
    run(&model, state.path(), "compacted", "CALL one");
    run(&model, state.path(), "compacted", "two");
    let requests = model.take();
    assert_eq!(requests.len(), 3, "{requests:#?}");
    // Four messages over maxMessages 3: the oldest (the first user message)
    // goes; the call and its result stay together.
    let second = roles_and_texts(&requests[2]);
    let shape: Vec<&str> = second.iter().map(|(role, _)| role.as_str()).collect();
    assert_eq!(shape, ["assistant", "tool", "assistant", "system", "user"], "{second:?}");
    assert_eq!(second[3].1, format!("[compacted] mode=remove removed=1 chars={}", "CALL one".len()));
    assert_eq!(second[4].1, "two");
    for request in &requests {
        assert_pairs_whole(request);
    }

    // mode: truncate empties the conversation before the input.
    let state = temp();
    run(&model, state.path(), "truncated", "CALL one");
    run(&model, state.path(), "truncated", "two");
    let requests = model.take();
    let last = roles_and_texts(&requests[2]);
    assert_eq!(last.len(), 2, "{last:?}");
    assert_eq!(last[0].0, "system");
    assert!(last[0].1.starts_with("[message-compaction] mode=truncate removed=4 chars="), "{last:?}");
    assert_eq!(last[1], ("user".into(), "two".into()));
}

fn events(state: &Path, agent: &str) -> Vec<Value> {
    let path = common::instance_path(state, &format!("{agent}@default")).join("events.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
}

#[test]
fn message_integrity_repairs_what_a_layer_broke_before_the_request_leaves() {
    if !js_runtime_usable() {
        return;
    }
    let model = Model::start();
    let state = temp();
    // drop-last-result (a JavaScript step layer) removes the tool result
    // before the second request; message-integrity, innermost, answers the
    // call again before the request leaves.
    run(&model, state.path(), "guarded", "CALL one");
    let requests = model.take();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    assert_eq!(roles(&requests[1]), ["user", "assistant", "tool"]);
    assert_pairs_whole(&requests[1]);
    let result: Value =
        serde_json::from_str(requests[1]["messages"][2]["content"].as_str().unwrap_or_default()).unwrap_or_default();
    assert_eq!(result["error"]["code"], "E_TOOL_INTERRUPTED", "{result}");
    let repaired: Vec<Value> =
        events(state.path(), "guarded").into_iter().filter(|e| e["type"] == "message-integrity.repaired").collect();
    assert_eq!(repaired.len(), 1, "{repaired:#?}");
    assert_eq!(repaired[0]["callsInterrupted"], 1, "{repaired:#?}");
    assert_eq!(repaired[0]["stepIndex"], 1, "{repaired:#?}");

    // Without the extension the runtime's commit applies the same rule —
    // the model gets the same valid conversation — but nothing names it.
    let state = temp();
    run(&model, state.path(), "unguarded", "CALL one");
    let requests = model.take();
    assert_eq!(roles(&requests[1]), ["user", "assistant", "tool"]);
    assert_pairs_whole(&requests[1]);
    assert!(events(state.path(), "unguarded").iter().all(|e| e["type"] != "message-integrity.repaired"));
}

#[test]
fn bad_config_is_refused_naming_the_field() {
    let dir = temp();
    let yaml = std::fs::read_to_string(fixture().join("goondan.yaml")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.path().join("goondan.yaml"), yaml.replace("{maxMessages: 2}", "{maxMessages: \"two\"}"))
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::create_dir_all(dir.path().join("extensions")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::copy(fixture().join("extensions/drop-last-result.ts"), dir.path().join("extensions/drop-last-result.ts"))
        .unwrap_or_else(|e| panic!("{e}"));
    let output = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .arg("--state-root")
        .arg(dir.path().join("state"))
        .arg("-c")
        .arg(dir.path())
        .args(["tool", "list", "--agent", "windowed"])
        .env("NO_COLOR", "1")
        .env_remove("GOONDAN_STATE_ROOT")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn gdn: {e}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Exit 3, as for any extension that fails to install (a configuration error).
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains(
            "extension 'message-window': config.maxMessages must be a whole number of at least 1, got \"two\""
        ),
        "{stderr}"
    );
}
