//! The turn/step loop with a scripted model and real tool handlers.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use goondan_core::{JsonObject, Message, MessageData, ToolCall, ToolResult, ToolStatus};
use goondan_llm::provider::{BoxFuture as ModelFuture, StreamSink};
use goondan_llm::scripted::{ScriptedProvider, ScriptedReply};
use goondan_llm::{ModelError, ModelParams, ModelProvider, ModelRequest, ModelResponse};
use goondan_runtime::turn::{AgentLoop, TurnEnd, TurnObserver};
use goondan_tools::assembly::AgentTools;
use goondan_tools::{
    BoxFuture, HandlerResult, MemoryEventSink, MiddlewareChain, ToolCatalogItem, ToolContext, ToolExecutor,
    ToolHandler, ToolOutput, ToolRegistry, ToolSource, sync_handler,
};
use serde_json::{Value, json};
use tokio::sync::watch;

/// Wraps a provider and records every request it gets.
#[derive(Debug)]
struct Recording {
    inner: ScriptedProvider,
    requests: Mutex<Vec<ModelRequest>>,
}

impl ModelProvider for Recording {
    fn complete<'a>(
        &'a self,
        request: &'a ModelRequest,
        on_event: StreamSink<'a>,
    ) -> ModelFuture<'a, Result<ModelResponse, ModelError>> {
        if let Ok(mut requests) = self.requests.lock() {
            requests.push(request.clone());
        }
        self.inner.complete(request, on_event)
    }

    fn name(&self) -> &str {
        "recording"
    }
}

fn script(replies: Value) -> Arc<Recording> {
    let replies: Vec<ScriptedReply> = serde_json::from_value(replies).unwrap_or_else(|e| panic!("script: {e}"));
    Arc::new(Recording { inner: ScriptedProvider::from_replies(replies), requests: Mutex::new(Vec::new()) })
}

/// A handler that counts how many calls run at once and sleeps `ms`.
struct Sleepy {
    in_flight: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl ToolHandler for Sleepy {
    fn call<'a>(&'a self, _ctx: &'a ToolContext, input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(now, Ordering::SeqCst);
            let ms = input.get("ms").and_then(Value::as_u64).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(ToolOutput::Value(json!({"slept": ms})))
        })
    }
}

struct Fixture {
    agent: AgentLoop,
    provider: Arc<Recording>,
    events: Arc<MemoryEventSink>,
    peak: Arc<AtomicUsize>,
}

fn fixture(replies: Value, max_steps: u32) -> Fixture {
    let provider = script(replies);
    let events = Arc::new(MemoryEventSink::new());
    let peak = Arc::new(AtomicUsize::new(0));
    let registry = ToolRegistry::new();
    let sleepy = ToolCatalogItem::new("clock__sleep", ToolSource::extension("test"))
        .with_description("Sleep a while")
        .with_parameters(
            json!({"type": "object", "properties": {"ms": {"type": "integer"}}, "additionalProperties": false}),
        );
    let echo = ToolCatalogItem::new("echo__say", ToolSource::extension("test"))
        .with_parameters(json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}));
    let restart = ToolCatalogItem::new("self-restart__request", ToolSource::extension("test"));
    let handlers: Vec<(ToolCatalogItem, Arc<dyn ToolHandler>)> = vec![
        (sleepy, Arc::new(Sleepy { in_flight: Arc::new(AtomicUsize::new(0)), peak: Arc::clone(&peak) })),
        (echo, sync_handler(|_, input| Ok(ToolOutput::Value(json!({"said": input.get("text")}))))),
        (
            restart,
            sync_handler(|_, _| {
                Ok(ToolOutput::Value(json!({"ok": true, "restartRequested": true, "restartReason": "x"})))
            }),
        ),
    ];
    for (item, handler) in handlers {
        registry.register(item, handler).unwrap_or_else(|e| panic!("{e}"));
    }
    // The agent declares every registered tool (dynamic items are the way to offer them here).
    let registry = Arc::new(registry);
    let tools = AgentTools::default();
    let executor = ToolExecutor::new(Arc::clone(&registry)).with_events(Arc::clone(&events) as _);
    let agent = AgentLoop {
        agent_name: Arc::from("tester"),
        instance_key: Arc::from("t-1"),
        workdir: Arc::from(Path::new("/tmp")),
        system_prompt: Some("You are a test agent.".to_owned()),
        params: ModelParams::default(),
        max_steps_per_turn: max_steps,
        max_parallel_tool_calls: 2,
        max_malformed_replies: 2,
        provider: Arc::clone(&provider) as Arc<dyn ModelProvider>,
        tools,
        executor: Arc::new(executor),
        step_middleware: MiddlewareChain::new(),
        turn_middleware: MiddlewareChain::new(),
        events: Arc::clone(&events) as _,
    };
    Fixture { agent, provider, events, peak }
}

#[derive(Default)]
struct Collect {
    committed: Mutex<Vec<Message>>,
    text: Mutex<String>,
    finished: Mutex<Vec<(String, ToolStatus)>>,
}

impl TurnObserver for Collect {
    fn text_delta(&self, text: &str) {
        if let Ok(mut all) = self.text.lock() {
            all.push_str(text);
        }
    }

    fn tool_call_finished(&self, call: &ToolCall, result: &ToolResult) {
        if let Ok(mut finished) = self.finished.lock() {
            finished.push((call.name.to_string(), result.status));
        }
    }

    fn commit(&self, messages: &[Message]) -> Result<(), String> {
        if let Ok(mut committed) = self.committed.lock() {
            committed.extend_from_slice(messages);
        }
        Ok(())
    }
}

fn tool_results(history: &[Message]) -> Vec<(String, ToolResult)> {
    history
        .iter()
        .filter_map(|m| match &m.data {
            MessageData::Tool { tool_name, result, .. } => Some((tool_name.clone(), (**result).clone())),
            _ => None,
        })
        .collect()
}

fn never_cancelled() -> watch::Receiver<bool> {
    let (sender, receiver) = watch::channel(false);
    std::mem::forget(sender);
    receiver
}

#[tokio::test]
async fn a_turn_runs_tool_calls_concurrently_and_answers_in_call_order() {
    let f = fixture(
        json!([
            {"toolCalls": [
                {"name": "clock__sleep", "args": {"ms": 150}},
                {"name": "clock__sleep", "args": {"ms": 10}},
                {"name": "echo__say", "args": {"text": "hi"}},
                {"name": "bash__exec", "args": {"command": "id"}},
                {"name": "echo__say", "args": {"wrong": 1}}
            ]},
            {"text": "All done."}
        ]),
        8,
    );
    let observer = Collect::default();
    let mut history = Vec::new();
    let outcome = f.agent.run_turn(&mut history, "go".to_owned(), &observer, never_cancelled()).await;
    assert_eq!(outcome.end, TurnEnd::Answered);
    assert_eq!(outcome.steps, 2);
    assert_eq!(outcome.text, "All done.");
    assert_eq!(observer.text.lock().map(|t| t.clone()).unwrap_or_default(), "All done.");

    let results = tool_results(&history);
    let names: Vec<&str> = results.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["clock__sleep", "clock__sleep", "echo__say", "bash__exec", "echo__say"]);
    assert_eq!(results[0].1.output, Some(json!({"slept": 150})), "results keep call order");
    assert_eq!(results[1].1.output, Some(json!({"slept": 10})));
    assert_eq!(results[3].1.error_code(), Some("E_TOOL_NOT_IN_CATALOG"));
    assert_eq!(results[4].1.error_code(), Some("E_TOOL_INVALID_ARGS"));
    assert_eq!(f.peak.load(Ordering::SeqCst), 2, "two sleeps overlapped (the limit is 2)");

    // Everything was committed, in order: user, assistant, 5 results, assistant.
    let committed = observer.committed.lock().map(|c| c.clone()).unwrap_or_default();
    assert_eq!(committed.len(), 8);
    assert_eq!(committed, history);

    // The model saw the system prompt and, in step 2, the ToolResults themselves.
    let requests = f.provider.requests.lock().map(|r| r.clone()).unwrap_or_default();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].system.as_deref(), Some("You are a test agent."));
    assert_eq!(
        requests[0].tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["clock__sleep", "echo__say", "self-restart__request"]
    );
    let fed_back = tool_results(
        &requests[1]
            .messages
            .iter()
            .cloned()
            .map(|data| Message::new(data, goondan_core::MessageSource::User))
            .collect::<Vec<_>>(),
    );
    let error = fed_back[3].1.error.clone().unwrap_or_default();
    assert_eq!(error.code.as_deref(), Some("E_TOOL_NOT_IN_CATALOG"));
    assert!(error.suggestion.is_some());
}

#[tokio::test]
async fn malformed_arguments_get_error_results_and_repeated_ones_end_the_turn() {
    let f = fixture(
        json!([
            {"toolCalls": [{"name": "echo__say", "arguments": "{oops"}]},
            {"toolCalls": [{"name": "echo__say", "arguments": "[1]"}]},
            {"text": "never reached"}
        ]),
        8,
    );
    let observer = Collect::default();
    let mut history = Vec::new();
    let outcome = f.agent.run_turn(&mut history, "go".to_owned(), &observer, never_cancelled()).await;
    assert_eq!(outcome.end, TurnEnd::MalformedReplies);
    assert_eq!(outcome.steps, 2);
    assert!(outcome.text.contains("unreadable arguments 2 times"), "{}", outcome.text);
    let results = tool_results(&history);
    assert_eq!(results.len(), 2);
    for (_, result) in &results {
        assert_eq!(result.error_code(), Some("E_TOOL_INVALID_ARGS"));
    }
    assert!(results[0].1.error.as_ref().is_some_and(|e| e.message.contains("not valid JSON")));
    assert!(results[1].1.error.as_ref().is_some_and(|e| e.message.contains("must be a JSON object, got array")));
}

#[tokio::test]
async fn the_step_limit_ends_the_turn_with_the_last_text_and_a_note() {
    let call = json!({"text": "working", "toolCalls": [{"name": "echo__say", "args": {"text": "x"}}]});
    let f = fixture(json!([call.clone(), call.clone(), call.clone(), call]), 3);
    let mut history = Vec::new();
    let outcome = f.agent.run_turn(&mut history, "go".to_owned(), &Collect::default(), never_cancelled()).await;
    assert_eq!(outcome.end, TurnEnd::StepLimit);
    assert_eq!(outcome.steps, 3);
    assert!(outcome.text.starts_with("working"), "{}", outcome.text);
    assert!(outcome.text.contains("maxStepsPerTurn (3)"), "{}", outcome.text);
}

#[tokio::test]
async fn cancelling_gives_each_unfinished_call_a_result_and_keeps_the_conversation_valid() {
    let f = fixture(
        json!([{"toolCalls": [{"name": "echo__say", "args": {"text": "quick"}}, {"name": "clock__sleep", "args": {"ms": 60000}}]}]),
        8,
    );
    let (cancel, receiver) = watch::channel(false);
    let observer = Collect::default();
    let mut history = Vec::new();
    let turn = f.agent.run_turn(&mut history, "go".to_owned(), &observer, receiver);
    let trigger = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = cancel.send(true);
    };
    let (outcome, ()) = tokio::join!(turn, trigger);
    assert_eq!(outcome.end, TurnEnd::Cancelled);
    let results = tool_results(&history);
    assert_eq!(results.len(), 2, "exactly one result per call");
    assert_eq!(results[0].1.status, ToolStatus::Ok);
    assert_eq!(results[1].1.error_code(), Some("E_TOOL_CANCELLED"));
    // user, assistant, two results: a valid conversation for the next turn.
    assert_eq!(history.len(), 4);
    assert!(matches!(history[1].data, MessageData::Assistant { ref tool_calls, .. } if tool_calls.len() == 2));
}

#[tokio::test]
async fn a_restart_request_is_reported_and_events_trace_the_turn() {
    let f = fixture(json!([{"toolCalls": [{"name": "self-restart__request"}]}, {"text": "ok"}]), 8);
    let mut history = Vec::new();
    let outcome = f.agent.run_turn(&mut history, "go".to_owned(), &Collect::default(), never_cancelled()).await;
    assert!(outcome.restart_requested);
    let events = f.events.events();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "turn.started",
            "step.started",
            "tool.called",
            "tool.completed",
            "step.completed",
            "step.started",
            "step.completed",
            "turn.completed"
        ]
    );
    let turn_span = events[0]["spanId"].as_str().unwrap_or_default().to_owned();
    let step_span = events[1]["spanId"].as_str().unwrap_or_default().to_owned();
    assert_eq!(events[1]["parentSpanId"], json!(turn_span), "step → turn");
    assert_eq!(events[2]["parentSpanId"], json!(step_span), "tool → step");
    let trace = &events[0]["traceId"];
    assert!(events.iter().all(|e| &e["traceId"] == trace));
    let done = &events[7];
    assert_eq!(done["stepCount"], 2);
    assert!(done["duration"].is_number());
    assert!(done["tokenUsage"]["totalTokens"].as_u64().is_some_and(|n| n > 0));
}

#[tokio::test]
async fn calls_left_unanswered_by_a_crash_get_interrupted_results_first() {
    let f = fixture(json!([{"text": "fine"}]), 8);
    let assistant = Message::new(
        MessageData::Assistant {
            content: None,
            tool_calls: vec![
                ToolCall::new("c1", "echo__say", JsonObject::new()),
                ToolCall::new("c2", "echo__say", JsonObject::new()),
            ],
        },
        goondan_core::MessageSource::Assistant { step_id: "s".into() },
    );
    let answered = Message::new(
        MessageData::Tool {
            tool_call_id: "c1".into(),
            tool_name: "echo__say".into(),
            result: Box::new(ToolResult::ok(json!(1))),
        },
        goondan_core::MessageSource::Tool { tool_call_id: "c1".into(), tool_name: "echo__say".into() },
    );
    let mut history = vec![
        Message::new(MessageData::User { content: "before".into() }, goondan_core::MessageSource::User),
        assistant,
        answered,
    ];
    let observer = Collect::default();
    let outcome = f.agent.run_turn(&mut history, "after".to_owned(), &observer, never_cancelled()).await;
    assert_eq!(outcome.end, TurnEnd::Answered);
    let results = tool_results(&history);
    assert_eq!(results.len(), 2);
    assert_eq!(results[1].1.error_code(), Some("E_TOOL_INTERRUPTED"));
    // The repair was saved before the new input.
    let committed = observer.committed.lock().map(|c| c.clone()).unwrap_or_default();
    assert!(matches!(committed[0].data, MessageData::Tool { ref tool_call_id, .. } if tool_call_id == "c2"));
    assert!(matches!(committed[1].data, MessageData::User { ref content } if content == "after"));
}

#[tokio::test]
async fn the_event_log_is_flushed_at_every_step_boundary() {
    #[derive(Default)]
    struct Flushes(AtomicUsize);
    impl goondan_tools::EventSink for Flushes {
        fn emit(&self, _event: &goondan_tools::RuntimeEvent<'_>) {}
        fn flush(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let mut f = fixture(json!([{"toolCalls": [{"name": "echo__say", "args": {"text": "a"}}]}, {"text": "done"}]), 8);
    let flushes = Arc::new(Flushes::default());
    f.agent.events = Arc::clone(&flushes) as _;
    let mut history = Vec::new();
    let outcome = f.agent.run_turn(&mut history, "go".to_owned(), &Collect::default(), never_cancelled()).await;
    assert_eq!(outcome.steps, 2);
    assert_eq!(flushes.0.load(Ordering::SeqCst), 3, "after each of the two steps and at the end of the turn");
}
