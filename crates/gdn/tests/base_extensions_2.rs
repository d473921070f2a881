//! The native `@goondan/base` extensions tool-search, required-tools-guard,
//! logging and inter-agent-response-format through the `gdn` binary, with
//! the scripted models of `tests/fixtures/base-extensions-2` — and, where the
//! exact model request matters (what tool-search leaves of a 300-tool
//! catalog), a local server speaking the OpenAI wire format that records
//! each request.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Mutex;

use serde_json::{Value, json};

mod common;
use common::temp;
use goondan_test_support::text;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/base-extensions-2").join(name)
}

fn gdn(bundle: &Path, state: &Path, args: &[&str]) -> Output {
    common::gdn_bin().project(bundle).state_arg(state).env("TMPDIR", state).run(args)
}

fn json_out(output: &Output) -> Value {
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&output.stdout)))
}

/// The messages of `agent@key`'s conversation in `state`.
fn messages(state: &Path, agent: &str, key: &str) -> Vec<Value> {
    let path = common::instance_path(state, &format!("{agent}@{key}")).join("messages.jsonl");
    let loaded = goondan_runtime::store::read_message_log(&path).unwrap_or_else(|e| panic!("{e}"));
    loaded.state.messages().iter().map(|m| serde_json::to_value(m).unwrap_or_default()).collect()
}

fn results(state: &Path, agent: &str, key: &str) -> Vec<Value> {
    messages(state, agent, key)
        .into_iter()
        .filter(|m| m["data"]["role"] == "tool")
        .map(|m| m["data"]["result"].clone())
        .collect()
}

fn names(catalog: &Value) -> Vec<String> {
    catalog.as_array().into_iter().flatten().filter_map(|item| item["name"].as_str().map(str::to_owned)).collect()
}

// ---------------------------------------------------------------- tool-search

#[test]
fn tool_search_offers_the_search_tool_then_what_a_search_selected_across_turns() {
    let state = temp();
    let bundle = fixture("tool-search");
    // Before any search the model is offered the search tool alone.
    let listed = json_out(&gdn(&bundle, state.path(), &["--json", "tool", "list"]));
    assert_eq!(names(&listed), ["tool-search__search"]);
    assert_eq!(listed[0]["source"], json!({"type": "extension", "name": "tool-search"}));

    let run = json_out(&gdn(&bundle, state.path(), &["--json", "run", "--input", "make it loud"]));
    assert_eq!(run["text"], "done", "{run}");
    let results = results(state.path(), "finder", "default");
    let search = &results[0]["output"];
    assert_eq!(search["query"], "case");
    assert_eq!(search["selectedTools"][0], "text-transform__case", "{search}");
    assert!(search["selectedTools"].as_array().is_some_and(|s| !s.is_empty() && s.len() <= 3), "maxResults: {search}");
    assert_eq!(search["results"][0]["description"], "Transform text case (upper/lower)");
    // The next step offered the selection, so the call went through.
    assert_eq!(results[1]["status"], "ok", "{results:?}");
    assert_eq!(results[1]["output"]["result"], "FOUND");

    // The selection is kept in the extension's state (persistSelection) …
    let saved: Value = serde_json::from_str(
        &std::fs::read_to_string(
            common::instance_path(state.path(), "finder@default").join("extensions/tool-search.json"),
        )
        .unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(saved["lastQuery"], "case");
    assert_eq!(saved["selectedTools"], search["selectedTools"]);
    // … so the next process offers it from its first step.
    let listed = json_out(&gdn(&bundle, state.path(), &["--json", "tool", "list"]));
    let mut expected = vec!["tool-search__search".to_owned()];
    expected.extend(names(&search["results"]));
    let mut offered = names(&listed);
    offered.sort();
    expected.sort();
    assert_eq!(offered, expected);
}

#[test]
fn a_tool_no_search_selected_is_not_in_the_catalog() {
    let state = temp();
    let run = json_out(&gdn(
        &fixture("tool-search"),
        state.path(),
        &["--json", "run", "--instance-key", "fresh", "--input", "CASE:nosearch"],
    ));
    assert_eq!(run["text"], "tried without searching", "{run}");
    let results = results(state.path(), "finder", "fresh");
    assert_eq!(results[0]["error"]["code"], "E_TOOL_NOT_IN_CATALOG", "{results:?}");
}

// ------------------------------------------------------- required-tools-guard

#[test]
fn agent_required_tools_keep_the_turn_going_until_one_was_called() {
    let state = temp();
    let run = json_out(&gdn(
        &fixture("required-tools"),
        state.path(),
        &["--json", "run", "--agent", "reporter", "--input", "go"],
    ));
    assert_eq!(run["text"], "reported", "{run}");
    assert_eq!(run["steps"], 3, "answer, reminder → call, answer: {run}");
    let messages = messages(state.path(), "reporter", "default");
    let reminders: Vec<&Value> = messages.iter().filter(|m| m["source"]["type"] == "extension").collect();
    assert_eq!(reminders.len(), 1, "{messages:?}");
    assert_eq!(reminders[0]["data"]["role"], "user");
    assert_eq!(reminders[0]["data"]["content"], "다음 도구 중 하나를 반드시 호출하세요: text-transform__case");
    assert_eq!(reminders[0]["source"]["extensionName"], "required-tools-guard");
    assert_eq!(results(state.path(), "reporter", "default")[0]["output"]["result"], "REPORT");
}

#[test]
fn the_guard_reminds_a_bounded_number_of_times_and_failed_calls_do_not_count() {
    let state = temp();
    let run = json_out(&gdn(
        &fixture("required-tools"),
        state.path(),
        &["--json", "run", "--agent", "stubborn", "--input", "go"],
    ));
    // (failed call, answer) once, then again after each of the 2 reminders.
    assert_eq!(run["text"], "no", "{run}");
    assert_eq!(run["steps"], 6, "{run}");
    assert_eq!(run["end"], "answered", "{run}");
    let messages = messages(state.path(), "stubborn", "default");
    let reminders =
        messages.iter().filter(|m| m["data"]["content"] == "Call text-transform__case before you finish.").count();
    assert_eq!(reminders, 2, "{messages:?}");
    let results = results(state.path(), "stubborn", "default");
    assert!(results.iter().all(|r| r["error"]["code"] == "E_TOOL_INVALID_ARGS"), "{results:?}");
    let events = std::fs::read_to_string(common::instance_path(state.path(), "stubborn@default").join("events.jsonl"))
        .unwrap_or_default();
    assert!(events.contains("required-tools-guard.unsatisfied"), "{events}");
}

// -------------------------------------------------------------------- logging

#[test]
fn logging_logs_turns_steps_and_tool_calls_with_their_arguments_at_debug() {
    let state = temp();
    let output = gdn(&fixture("logging"), state.path(), &["-vv", "run", "--agent", "loud", "--input", "go"]);
    let log = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{log}");
    for expected in [
        "[logging.turn] start",
        "[logging.turn] complete",
        "finishReason=\"answered\"",
        "[logging.step] start",
        "catalogSize=6",
        "[logging.step] complete",
        "shouldContinue=true",
        "[logging.toolCall] start",
        "toolName=\"text-transform__case\"",
        "argument-marker-7f3",
        "[logging.toolCall] complete",
        "status=\"ok\"",
        "goondan::extension::logging",
    ] {
        assert!(log.contains(expected), "missing {expected:?} in:\n{log}");
    }
    let turn_start = log.lines().find(|line| line.contains("[logging.turn] start")).unwrap_or_default();
    assert!(turn_start.contains("turnId=") && turn_start.contains("traceId="), "{turn_start}");
}

#[test]
fn logging_at_info_leaves_tool_calls_out_and_turn_metadata_when_asked() {
    let state = temp();
    let output = gdn(&fixture("logging"), state.path(), &["-vv", "run", "--agent", "quiet", "--input", "go"]);
    let log = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{log}");
    assert!(log.contains("[logging.step] start"), "{log}");
    assert!(!log.contains("[logging.toolCall]"), "{log}");
    assert!(!log.contains("argument-marker-7f3"), "{log}");
    let turn_start = log.lines().find(|line| line.contains("[logging.turn] start")).unwrap_or_default();
    assert!(turn_start.contains("[logging.turn] start turnId="), "{turn_start}");
    assert!(!turn_start.contains("traceId="), "{turn_start}");
}

#[test]
fn bad_extension_config_fails_the_agent_naming_the_field() {
    let dir = temp();
    let bundle = std::fs::read_to_string(fixture("logging").join("goondan.yaml")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.path().join("goondan.yaml"), bundle.replace("level: debug", "level: loudest"))
        .unwrap_or_else(|e| panic!("{e}"));
    let output = gdn(dir.path(), dir.path(), &["tool", "list", "--agent", "loud"]);
    let error = text(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{error}");
    assert!(
        error.contains("extension 'logging': config.level: 'loudest' is not one of debug, info, warn, error"),
        "{error}"
    );
}

// ------------------------------------------------ inter-agent-response-format

#[test]
fn an_asynchronous_answer_reaches_the_caller_formatted() {
    let state = temp();
    let work = temp();
    let workdir = work.path().display().to_string();
    let run =
        json_out(&gdn(&fixture("swarm"), state.path(), &["--json", "run", "--workdir", &workdir, "--input", "go"]));
    // The model got the formatted text (its script reacts to it).
    assert_eq!(run["text"], "formatted reply seen", "{run}");
    let messages = messages(state.path(), "coordinator", "default");
    let reply = messages
        .iter()
        .find(|m| m["metadata"]["__goondanInterAgentResponse"].is_object())
        .unwrap_or_else(|| panic!("no reply: {messages:?}"));
    let request_id = reply["metadata"]["__goondanInterAgentResponse"]["requestId"].as_str().unwrap_or_default();
    assert_eq!(
        reply["data"]["content"],
        format!(
            "[inter-agent response] worker -> coordinator status=ok requestId={request_id}\nworker answer\nrequestMetadata={{\n  \"ticket\": 7\n}}"
        )
    );
    assert_eq!(reply["metadata"]["__goondanInterAgentResponseFormatted"], true);
    assert_eq!(reply["source"], json!({"type": "extension", "extensionName": "inter-agent-response-format"}));
}

// ------------------------------------------- tool-search on a 300-tool catalog

/// The fake model server answering the requests with `replies` in turn
/// (each a list of SSE chunks' `delta`s and a finish reason; "out of
/// script" after them).
fn serve_openai(replies: Vec<(Vec<Value>, &'static str)>) -> goondan_test_support::FakeModel {
    let replies = Mutex::new(replies.into_iter());
    let model = goondan_test_support::FakeModel::start(move |_| {
        let next = replies.lock().unwrap_or_else(|e| e.into_inner()).next();
        let (deltas, finish) = next.unwrap_or_else(|| (vec![json!({"content": "out of script"})], "stop"));
        goondan_test_support::Reply::deltas(deltas, finish)
    });
    model.unwrap_or_else(|e| panic!("model server: {e}"))
}

const VERBS: [&str; 10] =
    ["get", "list", "create", "update", "delete", "search", "export", "import", "sync", "archive"];
const NOUNS: [&str; 30] = [
    "user", "order", "invoice", "product", "ticket", "report", "project", "task", "comment", "file", "team", "payment",
    "shipment", "contract", "lead", "account", "event", "note", "tag", "webhook", "label", "release", "build",
    "deploy", "alert", "metric", "log", "backup", "secret", "policy",
];

/// A bundle whose agent has 300 tools shaped like an MCP server's (a
/// sentence of description, three described parameters), with or without
/// tool-search, talking to the model at `endpoint`.
fn catalog_of_300(dir: &Path, endpoint: &str, with_tool_search: bool) {
    let mut exports = String::new();
    for verb in VERBS {
        for noun in NOUNS {
            exports.push_str(&format!(
                "    - name: {verb}_{noun}\n      description: \"{verb} a {noun} record in the workspace's {noun} service; returns the {noun} as JSON with its id, owner and timestamps.\"\n      parameters:\n        type: object\n        properties:\n          id: {{type: string, description: \"The {noun}'s id.\"}}\n          fields: {{type: array, items: {{type: string}}, description: \"Fields to return; all when omitted.\"}}\n          dryRun: {{type: boolean, description: \"Validate only, change nothing.\"}}\n        required: [id]\n"
            ));
        }
    }
    let extensions = if with_tool_search {
        "  extensions:\n    - ref: {kind: Extension, name: tool-search, package: \"@goondan/base\"}\n"
    } else {
        ""
    };
    let bundle = format!(
        "apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {{name: local}}\nspec:\n  provider: openai\n  model: local-model\n  endpoint: {endpoint}\n  apiKey: {{value: sk-local-test}}\n---\n\
         apiVersion: goondan.ai/v1\nkind: Tool\nmetadata: {{name: svc}}\nspec:\n  entry: ./svc.js\n  exports:\n{exports}---\n\
         apiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: big}}\nspec:\n  modelConfig: {{modelRef: Model/local}}\n  prompt: {{system: Use the service.}}\n  tools:\n    - {{kind: Tool, name: svc}}\n{extensions}"
    );
    std::fs::write(dir.join("goondan.yaml"), bundle).unwrap_or_else(|e| panic!("{e}"));
    // Never called: the JavaScript host never starts.
    std::fs::write(dir.join("svc.js"), "export const handlers = {};\n").unwrap_or_else(|e| panic!("{e}"));
}

/// The bytes of the `tools` array of a recorded request, serialized compactly.
fn tool_bytes(request: &Value) -> usize {
    serde_json::to_string(&request["tools"]).map(|s| s.len()).unwrap_or(0)
}

fn tool_names(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|tool| tool["function"]["name"].as_str().map(str::to_owned))
        .collect()
}

/// The measurement behind docs/BENCHMARKS.md's tool-search figure: the
/// first model request of an agent with 300 tools, with and without
/// tool-search, as the OpenAI wire format sends it. Run with
/// `--nocapture` to see the figures.
#[test]
#[allow(clippy::print_stderr)] // the figures are this test's report
fn tool_search_cuts_the_first_request_of_a_300_tool_agent() {
    let text_reply = || (vec![json!({"role": "assistant", "content": "ok"})], "stop");
    let search_call = json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
        "function": {"name": "tool-search__search", "arguments": "{\"query\":\"invoice\"}"}}]});

    let without = temp();
    let seen_without = serve_openai(vec![text_reply()]);
    catalog_of_300(without.path(), &seen_without.url(), false);
    json_out(&gdn(without.path(), without.path(), &["--json", "run", "--input", "bill the customer"]));

    let with = temp();
    let seen_with = serve_openai(vec![(vec![search_call], "tool_calls"), text_reply()]);
    catalog_of_300(with.path(), &seen_with.url(), true);
    let run = json_out(&gdn(with.path(), with.path(), &["--json", "run", "--input", "bill the customer"]));
    assert_eq!(run["text"], "ok", "{run}");

    let recorded = |seen: &goondan_test_support::FakeModel| -> Vec<(usize, Value)> {
        seen.requests().into_iter().map(|request| (request.length, request.body)).collect()
    };
    let (without, with) = (recorded(&seen_without), recorded(&seen_with));
    let (body_without, body_with) = (without[0].0, with[0].0);
    let without: Vec<Value> = without.into_iter().map(|(_, request)| request).collect();
    let with: Vec<Value> = with.into_iter().map(|(_, request)| request).collect();
    assert_eq!(tool_names(&without[0]).len(), 300);
    assert_eq!(tool_names(&with[0]), ["tool-search__search"]);
    // The second request offers what the search selected (the ten invoice
    // tools, in catalog order) and the search tool.
    let second = tool_names(&with[1]);
    assert_eq!(second.len(), 11, "{second:?}");
    assert_eq!(second.last().map(String::as_str), Some("tool-search__search"), "{second:?}");
    assert!(second.iter().take(10).all(|name| name.ends_with("_invoice")), "{second:?}");

    let (tools_without, tools_with) = (tool_bytes(&without[0]), tool_bytes(&with[0]));
    eprintln!(
        "first request of a 300-tool agent: tools {tools_without} B without tool-search, {tools_with} B with it \
         (whole body {body_without} B vs {body_with} B; ≈{} vs ≈{} tokens at 4 B/token); second request's tools with it: {} B",
        body_without / 4,
        body_with / 4,
        tool_bytes(&with[1])
    );
    assert!(tools_with * 100 < tools_without, "{tools_with} B is not under 1% of {tools_without} B");
}
