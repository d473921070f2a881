//! One agent-to-agent contract: one table of request arguments, good and
//! bad, goes through the three ways code reaches another agent — the
//! `agents` tool's handler, `ctx.runtime.request` of a JavaScript tool and
//! `ctx.agents.request` of a JavaScript turn layer (real Bun or Node through
//! goondan-script's host, fixture `tests/fixtures/agent-contract`) — and each
//! way gives the same result: the same request reaching a recording
//! runtime, or the same refusal (code and message). The same table goes
//! through the three ways again as fire-and-forget events (`send`).

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use goondan_config::Bundle;
use goondan_core::ToolStatus;
use goondan_core::codes::E_AGENTS_INVALID_REQUEST;
use goondan_core::{JsonObject, JsonValue, Message};
use goondan_llm::ModelProvider;
use goondan_llm::scripted::ScriptedProvider;
use goondan_runtime::agent::{AgentOptions, AgentTooling, assemble_tooling};
use goondan_runtime::conversation::Conversation;
use goondan_runtime::{Agent, NoObserver, TurnEnd};
use goondan_test_support::block_on;
use goondan_tools::agents::{AgentAnswer, AgentMessageRequest, AgentSendReceipt, AgentSpawnRequest, AgentToolRuntime};
use goondan_tools::{BoxFuture, CallScope, ToolContext, ToolFailure, ToolOutput};
use serde_json::json;

/// A runtime that records every request and answers it.
#[derive(Debug, Default)]
struct Recording {
    messages: Mutex<Vec<AgentMessageRequest>>,
    spawns: Mutex<Vec<AgentSpawnRequest>>,
}

impl Recording {
    fn taken(&self) -> Vec<AgentMessageRequest> {
        std::mem::take(&mut *self.messages.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn spawns_taken(&self) -> Vec<AgentSpawnRequest> {
        std::mem::take(&mut *self.spawns.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

fn answer(request: &AgentMessageRequest) -> AgentAnswer {
    AgentAnswer {
        target: request.target.clone(),
        event_id: "evt-1".into(),
        correlation_id: "corr-1".into(),
        accepted: true,
        asynchronous: request.asynchronous,
        response: (!request.asynchronous).then(|| format!("answer to {}", request.input)),
    }
}

impl AgentToolRuntime for Recording {
    fn request<'a>(
        &'a self,
        _: &'a ToolContext,
        request: AgentMessageRequest,
    ) -> BoxFuture<'a, Result<AgentAnswer, ToolFailure>> {
        let answered = answer(&request);
        self.messages.lock().unwrap_or_else(PoisonError::into_inner).push(request);
        Box::pin(async move { Ok(answered) })
    }
    fn send<'a>(
        &'a self,
        _: &'a ToolContext,
        request: AgentMessageRequest,
    ) -> BoxFuture<'a, Result<AgentSendReceipt, ToolFailure>> {
        let receipt = AgentSendReceipt { target: request.target.clone(), event_id: "evt-2".into(), accepted: true };
        self.messages.lock().unwrap_or_else(PoisonError::into_inner).push(request);
        Box::pin(async move { Ok(receipt) })
    }
    fn spawn<'a>(
        &'a self,
        _: &'a ToolContext,
        request: AgentSpawnRequest,
    ) -> BoxFuture<'a, Result<JsonValue, ToolFailure>> {
        let output = json!({"target": request.target, "spawned": true});
        self.spawns.lock().unwrap_or_else(PoisonError::into_inner).push(request);
        Box::pin(async move { Ok(output) })
    }
    fn list<'a>(&'a self, _: &'a ToolContext, _: bool) -> BoxFuture<'a, Result<JsonValue, ToolFailure>> {
        Box::pin(async { Err(ToolFailure::new("list is not part of this test")) })
    }
    fn catalog<'a>(&'a self, _: &'a ToolContext) -> BoxFuture<'a, Result<JsonValue, ToolFailure>> {
        Box::pin(async { Err(ToolFailure::new("catalog is not part of this test")) })
    }
}

/// What one row should give.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Sent(AgentMessageRequest),
    Refused { code: String, message: String },
}

/// The request a row with `target: "b", input: "hi"` and nothing else gives.
fn plain() -> AgentMessageRequest {
    AgentMessageRequest {
        target: "b".into(),
        input: "hi".into(),
        instance_key: None,
        event_type: Some("agent.request".into()),
        metadata: JsonObject::new(),
        timeout_ms: Some(60_000),
        asynchronous: false,
    }
}

fn sent(change: impl FnOnce(&mut AgentMessageRequest)) -> Outcome {
    let mut request = plain();
    change(&mut request);
    Outcome::Sent(request)
}

fn refused(message: &str) -> Outcome {
    Outcome::Refused { code: E_AGENTS_INVALID_REQUEST.into(), message: message.into() }
}

/// The table: a row (the flat form, as the tool and `ctx.agents` take it;
/// the JavaScript tool spreads it over `target`, `event` and `options`) and
/// what it must give.
fn table() -> Vec<(JsonValue, Outcome)> {
    let base = |extra: JsonValue| {
        let mut row = json!({"target": "b", "input": "hi"});
        if let (Some(row), Some(extra)) = (row.as_object_mut(), extra.as_object()) {
            row.extend(extra.clone());
        }
        row
    };
    vec![
        (base(json!({})), sent(|_| {})),
        (base(json!({"target": "  b  "})), sent(|_| {})),
        (json!({"input": "hi"}), refused("'target' must be a non-empty string")),
        (base(json!({"target": "   "})), refused("'target' must be a non-empty string")),
        (base(json!({"target": 7})), refused("'target' must be a non-empty string")),
        (json!({"target": "b"}), refused("'input' must be a non-empty string")),
        (base(json!({"input": ""})), refused("'input' must be a non-empty string")),
        (base(json!({"input": ["hi"]})), refused("'input' must be a non-empty string")),
        (base(json!({"timeoutMs": 1500})), sent(|r| r.timeout_ms = Some(1500))),
        (base(json!({"timeoutMs": 1500.5})), sent(|r| r.timeout_ms = Some(1501))),
        (base(json!({"timeoutMs": null})), sent(|_| {})),
        (base(json!({"timeoutMs": 0})), refused("'timeoutMs' must be a positive number, got 0")),
        (base(json!({"timeoutMs": -5})), refused("'timeoutMs' must be a positive number, got -5")),
        (base(json!({"timeoutMs": -0.5})), refused("'timeoutMs' must be a positive number, got -0.5")),
        (base(json!({"timeoutMs": "1500"})), refused("'timeoutMs' must be a positive number, got string")),
        (base(json!({"timeoutMs": true})), refused("'timeoutMs' must be a positive number, got boolean")),
        (base(json!({"eventType": "ping"})), sent(|r| r.event_type = Some("ping".into()))),
        (base(json!({"eventType": " ping "})), sent(|r| r.event_type = Some("ping".into()))),
        (base(json!({"eventType": ""})), sent(|_| {})),
        (base(json!({"eventType": 3})), refused("'eventType' must be a string, got integer")),
        (base(json!({"async": true})), sent(|r| r.asynchronous = true)),
        (base(json!({"async": false})), sent(|_| {})),
        (base(json!({"async": "yes"})), refused("'async' must be a boolean, got string")),
        (base(json!({"async": 1})), refused("'async' must be a boolean, got integer")),
        (
            base(json!({"metadata": {"via": "table", "n": 1}})),
            sent(|r| r.metadata = json!({"via": "table", "n": 1}).as_object().cloned().unwrap_or_default()),
        ),
        (base(json!({"metadata": null})), sent(|_| {})),
        (base(json!({"metadata": [1]})), refused("'metadata' must be an object, got array")),
        (base(json!({"metadata": "x"})), refused("'metadata' must be an object, got string")),
        (base(json!({"instanceKey": " k2 "})), sent(|r| r.instance_key = Some("k2".into()))),
        (base(json!({"instanceKey": ""})), sent(|_| {})),
        (base(json!({"instanceKey": 2})), refused("'instanceKey' must be a string, got integer")),
    ]
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/agent-contract")
}

fn load() -> Bundle {
    let report = goondan_config::load_bundle(&fixture());
    match report.bundle {
        Some(bundle) if !report.has_errors() => bundle,
        _ => panic!("fixture invalid: {:?}", report.diagnostics),
    }
}

/// The outcomes of `rows` in order: a refusal from its `API.METHOD: CODE:
/// message` text, a success as the request the runtime recorded.
fn outcomes(results: &[JsonValue], prefix: &str, recorded: Vec<AgentMessageRequest>) -> Vec<Outcome> {
    let mut recorded = recorded.into_iter();
    results
        .iter()
        .map(|result| match result.get("error").and_then(JsonValue::as_str) {
            Some(error) => {
                let rest = error.strip_prefix(prefix).unwrap_or_else(|| panic!("{error} does not start with {prefix}"));
                let (code, message) = rest.split_once(": ").unwrap_or_else(|| panic!("no code in {error}"));
                Outcome::Refused { code: code.into(), message: message.into() }
            }
            None => Outcome::Sent(recorded.next().unwrap_or_else(|| panic!("{result} reached no runtime"))),
        })
        .collect()
}

/// The context of a call of `agents__EXPORT` whose runtime is `runtime`.
fn tool_context(runtime: &Arc<Recording>, export: &str) -> ToolContext {
    let scope = CallScope {
        agent_name: Arc::from("contract"),
        instance_key: Arc::from("default"),
        turn_id: Arc::from("turn-1"),
        step_id: Arc::from("step-1"),
        step_index: 0,
        message: Arc::new(Message::assistant_tool_calls("step-1".to_owned(), Vec::new())),
        workdir: Arc::from(fixture().as_path()),
        trace_id: Arc::from("0af7651916cd43dd8448eb211c80319c"),
        step_span_id: Arc::from("b7ad6b7169203331"),
        runtime: Some(Arc::clone(runtime) as Arc<dyn AgentToolRuntime>),
        tasks: None,
    };
    ToolContext::new(Arc::new(scope), Arc::from(format!("agents__{export}")), "call-1")
}

async fn through_the_tool_handler(
    method: &str,
    rows: &[JsonValue],
    runtime: &Arc<Recording>,
) -> (Vec<Outcome>, Vec<JsonValue>) {
    let handler = goondan_base::agents::handler(method).unwrap_or_else(|| panic!("no {method} export"));
    let ctx = tool_context(runtime, method);
    let mut results = Vec::new();
    let mut outputs = Vec::new();
    for row in rows {
        let input = row.as_object().cloned().unwrap_or_default();
        match handler.call(&ctx, &input).await {
            Ok(output) => {
                // An asynchronous request is pending (its handle the
                // correlation id), with the same output as the other doors'.
                let (ToolOutput::Value(output) | ToolOutput::Pending { output: Some(output), .. }) = output else {
                    panic!("a pending {method} without its output")
                };
                outputs.push(output.clone());
                results.push(json!({"ok": output}));
            }
            Err(failure) => results.push(json!({"error": format!(
                "agents.{method}: {}: {}",
                failure.code.unwrap_or_default(),
                failure.message
            )})),
        }
    }
    (outcomes(&results, &format!("agents.{method}: "), runtime.taken()), outputs)
}

async fn assemble(bundle: &Bundle, runtime: &Arc<Recording>) -> AgentTooling {
    let mut options = AgentOptions::new(Arc::new(goondan_tools::NoopEventSink));
    options.agent = Some("contract".to_owned());
    options.agent_runtime = Some(Arc::clone(runtime) as Arc<dyn AgentToolRuntime>);
    options.plugins = vec![Arc::new(goondan_script::ScriptPlugin::new())];
    assemble_tooling(bundle, &options).await.unwrap_or_else(|e| panic!("assemble: {e}"))
}

/// What one way gave for every row, and the outputs of those it accepted.
struct Door {
    outcomes: Vec<Outcome>,
    outputs: Vec<JsonValue>,
}

/// The table through the three ways, with `method` (`request` or `send`).
async fn through_every_door(bundle: &Bundle, method: &str, rows: &[JsonValue]) -> [Door; 3] {
    // 1. The agents tool's handler.
    let runtime = Arc::new(Recording::default());
    let (outcomes_of_tool, outputs) = through_the_tool_handler(method, rows, &runtime).await;
    let tool = Door { outcomes: outcomes_of_tool, outputs };

    // 2. ctx.runtime.METHOD of a JavaScript tool.
    let runtime = Arc::new(Recording::default());
    let tooling = assemble(bundle, &runtime).await;
    let args = json!({"method": method, "rows": rows}).as_object().cloned().unwrap_or_default();
    let result = tooling.call_tool("probe__ask", args).await;
    assert_eq!(result.status, ToolStatus::Ok, "{result:?}");
    let results = result.output.as_ref().and_then(JsonValue::as_array).cloned().unwrap_or_default();
    let script_tool = Door {
        outputs: results.iter().filter_map(|r| r.get("ok").cloned()).collect(),
        outcomes: outcomes(&results, &format!("ctx.runtime.{method}: "), runtime.taken()),
    };

    // 3. ctx.agents.METHOD of a JavaScript turn layer.
    let runtime = Arc::new(Recording::default());
    let agent = Agent::new(
        assemble(bundle, &runtime).await,
        Arc::new(ScriptedProvider::from_replies(Vec::new())) as Arc<dyn ModelProvider>,
    );
    let mut conversation = Conversation::in_memory(Vec::new());
    let (_cancel, cancelled) = tokio::sync::watch::channel(false);
    let input = json!({"method": method, "rows": rows}).to_string();
    let turn = agent.run_turn(&mut conversation, input, &NoObserver, cancelled).await;
    assert_eq!(turn.end, TurnEnd::Answered, "{turn:?}");
    let results: Vec<JsonValue> = serde_json::from_str(&turn.text).unwrap_or_else(|e| panic!("{e}: {}", turn.text));
    let layer = Door {
        outputs: results.iter().filter_map(|r| r.get("ok").cloned()).collect(),
        outcomes: outcomes(&results, &format!("ctx.agents.{method}: "), runtime.taken()),
    };
    [tool, script_tool, layer]
}

fn check_rows(method: &str, rows: &[JsonValue], expected: &[Outcome], doors: &[Door; 3]) {
    let names = ["the agents tool", "ctx.runtime", "ctx.agents"];
    for (door, name) in doors.iter().zip(names) {
        assert_eq!(door.outcomes.len(), rows.len(), "{name}.{method}: one outcome per row");
        for (index, row) in rows.iter().enumerate() {
            assert_eq!(door.outcomes[index], expected[index], "{name}.{method}, row {row}");
        }
    }
}

#[test]
fn one_table_of_requests_gives_the_same_result_through_every_door() {
    if !common::js_runtime_usable() {
        return;
    }
    let (rows, expected): (Vec<JsonValue>, Vec<Outcome>) = table().into_iter().unzip();
    let bundle = load();
    block_on(async {
        let doors = through_every_door(&bundle, "request", &rows).await;
        check_rows("request", &rows, &expected, &doors);
        let [tool, script_tool, layer] = doors;

        // The answers: the tool and ctx.runtime get the same output; a layer
        // gets the response as text, empty while an async one is pending.
        assert_eq!(tool.outputs, script_tool.outputs);
        assert_eq!(
            tool.outputs[0],
            json!({"target": "b", "eventId": "evt-1", "correlationId": "corr-1", "accepted": true, "async": false,
                   "response": "answer to hi"})
        );
        assert_eq!(
            layer.outputs[0],
            json!({"target": "b", "response": "answer to hi", "correlationId": "corr-1", "accepted": true, "async": false})
        );
        let pending = rows.iter().position(|row| row["async"] == true).unwrap_or_else(|| panic!("no async row"));
        let pending = expected[..pending].iter().filter(|outcome| matches!(outcome, Outcome::Sent(_))).count();
        assert_eq!(layer.outputs[pending]["response"], "");
        assert_eq!(tool.outputs[pending]["response"], JsonValue::Null);
    });
}

/// What a row gives as a `send`: the same refusals, except that `timeoutMs`
/// and `async` are not read (the rows that only differ there are plain
/// sends), and the default event type is `agent.send`.
fn as_send(outcome: &Outcome) -> Outcome {
    let sent = |mut request: AgentMessageRequest| {
        if request.event_type.as_deref() == Some("agent.request") {
            request.event_type = Some("agent.send".into());
        }
        Outcome::Sent(AgentMessageRequest { timeout_ms: None, asynchronous: false, ..request })
    };
    match outcome {
        Outcome::Sent(request) => sent(request.clone()),
        Outcome::Refused { message, .. } if message.starts_with("'timeoutMs'") || message.starts_with("'async'") => {
            sent(plain())
        }
        refused => refused.clone(),
    }
}

#[test]
fn the_same_table_as_events_gives_the_same_result_through_every_door() {
    if !common::js_runtime_usable() {
        return;
    }
    let (rows, expected): (Vec<JsonValue>, Vec<Outcome>) = table().into_iter().unzip();
    let expected: Vec<Outcome> = expected.iter().map(as_send).collect();
    let bundle = load();
    block_on(async {
        let doors = through_every_door(&bundle, "send", &rows).await;
        check_rows("send", &rows, &expected, &doors);
        let [tool, script_tool, layer] = doors;
        assert_eq!(tool.outputs, script_tool.outputs);
        assert_eq!(tool.outputs[0], json!({"target": "b", "eventId": "evt-2", "accepted": true}));
        assert_eq!(layer.outputs[0], json!({"accepted": true}));
    });
}

/// A spawn that reached the runtime, or the refusal's code and message.
type Spawned = Result<AgentSpawnRequest, (String, String)>;

/// A spawn's arguments go through the same reader from the tool and from
/// `ctx.runtime.spawn(target, options)` (`ctx.agents` has no spawn).
#[test]
fn spawn_arguments_give_the_same_result_from_the_tool_and_ctx_runtime() {
    if !common::js_runtime_usable() {
        return;
    }
    let spawn = |target: &str, instance_key: Option<&str>, cwd: Option<&str>| {
        Ok(AgentSpawnRequest {
            target: target.into(),
            instance_key: instance_key.map(str::to_owned),
            cwd: cwd.map(str::to_owned),
        })
    };
    let refused = |message: &str| Err((E_AGENTS_INVALID_REQUEST.to_owned(), message.to_owned()));
    let table: Vec<(JsonValue, Spawned)> = vec![
        (json!({"target": "b"}), spawn("b", None, None)),
        (json!({"target": " b ", "instanceKey": " k ", "cwd": " sub "}), spawn("b", Some("k"), Some("sub"))),
        (json!({"target": "b", "instanceKey": "", "cwd": null}), spawn("b", None, None)),
        (json!({"target": ""}), refused("'target' must be a non-empty string")),
        (json!({"instanceKey": "k"}), refused("'target' must be a non-empty string")),
        (json!({"target": "b", "cwd": 5}), refused("'cwd' must be a string, got integer")),
        (json!({"target": "b", "instanceKey": ["k"]}), refused("'instanceKey' must be a string, got array")),
    ];
    let (rows, expected): (Vec<JsonValue>, Vec<_>) = table.into_iter().unzip();
    let bundle = load();
    block_on(async {
        let runtime = Arc::new(Recording::default());
        let handler = goondan_base::agents::handler("spawn").unwrap_or_else(|| panic!("no spawn export"));
        let ctx = tool_context(&runtime, "spawn");
        let mut by_tool = Vec::new();
        for row in &rows {
            let input = row.as_object().cloned().unwrap_or_default();
            by_tool.push(match handler.call(&ctx, &input).await {
                Ok(_) => Ok(runtime.spawns_taken().pop().unwrap_or_else(|| panic!("{row} reached no runtime"))),
                Err(failure) => Err((failure.code.unwrap_or_default(), failure.message)),
            });
        }

        let runtime = Arc::new(Recording::default());
        let tooling = assemble(&bundle, &runtime).await;
        let args = json!({"method": "spawn", "rows": rows}).as_object().cloned().unwrap_or_default();
        let result = tooling.call_tool("probe__ask", args).await;
        assert_eq!(result.status, ToolStatus::Ok, "{result:?}");
        let results = result.output.as_ref().and_then(JsonValue::as_array).cloned().unwrap_or_default();
        let mut spawned = runtime.spawns_taken().into_iter();
        let by_script: Vec<Spawned> = results
            .iter()
            .map(|result| match result.get("error").and_then(JsonValue::as_str) {
                Some(error) => {
                    let rest = error.strip_prefix("ctx.runtime.spawn: ").unwrap_or_else(|| panic!("{error}"));
                    let (code, message) = rest.split_once(": ").unwrap_or_else(|| panic!("no code in {error}"));
                    Err((code.to_owned(), message.to_owned()))
                }
                None => Ok(spawned.next().unwrap_or_else(|| panic!("{result} reached no runtime"))),
            })
            .collect();

        assert_eq!(by_tool.len(), rows.len());
        assert_eq!(by_script.len(), rows.len());
        for (index, row) in rows.iter().enumerate() {
            assert_eq!(by_tool[index], expected[index], "the agents tool, row {row}");
            assert_eq!(by_script[index], expected[index], "ctx.runtime.spawn, row {row}");
        }
    });
}
