//! The turn/step loop with a scripted model and real tool handlers.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use goondan_core::{
    ConversationState, JsonObject, Message, MessageData, MessageEvent, ToolCall, ToolResult, ToolStatus,
};
use goondan_llm::scripted::ScriptedReply;
use goondan_llm::{ModelProvider, ModelRequest};
use goondan_runtime::conversation::Conversation;
use goondan_runtime::turn::{Agent, TurnObserver};
use goondan_runtime::{
    AgentTooling, LayerFailure, Pipeline, StepContext, StepOutcome, TurnContext, TurnEnd, TurnOutcome,
};
use goondan_tools::assembly::AgentTools;
use goondan_tools::{
    BoxFuture, HandlerResult, MemoryEventSink, ToolCatalogItem, ToolContext, ToolExecutor, ToolHandler, ToolOutput,
    ToolRegistry, ToolSource, from_fn, sync_handler,
};
use serde_json::{Value, json};
use tokio::sync::watch;

type Recording = goondan_test_support::RecordingModel;

fn script(replies: Value) -> Arc<Recording> {
    let replies: Vec<ScriptedReply> = serde_json::from_value(replies).unwrap_or_else(|e| panic!("script: {e}"));
    Arc::new(Recording::new(replies))
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
    agent: Agent,
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
    let executor = ToolExecutor::new(Arc::new(registry)).with_events(Arc::clone(&events) as _);
    let tooling = AgentTooling::new(
        "tester",
        "t-1",
        Path::new("/tmp"),
        AgentTools::default(),
        executor,
        Arc::clone(&events) as _,
    );
    let mut agent = Agent::new(tooling, Arc::clone(&provider) as Arc<dyn ModelProvider>);
    agent.system_prompt = Some("You are a test agent.".to_owned());
    agent.max_steps_per_turn = max_steps;
    agent.max_parallel_tool_calls = 2;
    agent.max_malformed_replies = 2;
    Fixture { agent, provider, events, peak }
}

#[derive(Default)]
struct Collect {
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
}

/// A store that keeps every committed batch, to check what was saved.
#[derive(Default)]
struct Recorder {
    initial: Vec<Message>,
    batches: Mutex<Vec<Vec<MessageEvent>>>,
}

impl goondan_runtime::ConversationStore for Recorder {
    fn commit(
        &self,
        batch: Vec<MessageEvent>,
        _state: &ConversationState,
    ) -> BoxFuture<'static, Result<(), goondan_runtime::store::StoreError>> {
        if let Ok(mut batches) = self.batches.lock() {
            batches.push(batch);
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn reload(&self) -> BoxFuture<'static, Result<Option<ConversationState>, goondan_runtime::store::StoreError>> {
        let state = self.state();
        Box::pin(std::future::ready(Ok(Some(state))))
    }
}

impl Recorder {
    fn batches(&self) -> Vec<Vec<MessageEvent>> {
        self.batches.lock().map(|b| b.clone()).unwrap_or_default()
    }

    /// The conversation a reload would see.
    fn state(&self) -> ConversationState {
        let mut state = ConversationState::new(self.initial.clone());
        state.replay(self.batches().into_iter().flatten());
        state
    }
}

fn recorded(messages: Vec<Message>) -> (Conversation, Arc<Recorder>) {
    let store = Arc::new(Recorder { initial: messages.clone(), batches: Mutex::new(Vec::new()) });
    (Conversation::new(ConversationState::new(messages), Arc::clone(&store) as _), store)
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
    let (mut conversation, store) = recorded(Vec::new());
    let outcome = f.agent.run_turn(&mut conversation, "go".to_owned(), &observer, never_cancelled()).await;
    assert_eq!(outcome.end, TurnEnd::Answered);
    assert_eq!(outcome.steps, 2);
    assert_eq!(outcome.text, "All done.");
    assert_eq!(observer.text.lock().map(|t| t.clone()).unwrap_or_default(), "All done.");

    let results = tool_results(conversation.messages());
    let names: Vec<&str> = results.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["clock__sleep", "clock__sleep", "echo__say", "bash__exec", "echo__say"]);
    assert_eq!(results[0].1.output, Some(json!({"slept": 150})), "results keep call order");
    assert_eq!(results[1].1.output, Some(json!({"slept": 10})));
    assert_eq!(results[3].1.error_code(), Some("E_TOOL_NOT_IN_CATALOG"));
    assert_eq!(results[4].1.error_code(), Some("E_TOOL_INVALID_ARGS"));
    assert_eq!(f.peak.load(Ordering::SeqCst), 2, "two sleeps overlapped (the limit is 2)");

    // Everything was committed, in order: user, assistant, 5 results, assistant; once per step.
    assert_eq!(store.batches().len(), 3, "the user message, then each step");
    let committed = store.state();
    assert_eq!(committed.messages().len(), 8);
    assert_eq!(committed.messages(), conversation.messages());

    // The model saw the system prompt and, in step 2, the ToolResults themselves.
    let requests = f.provider.requests();
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
    let (mut conversation, _store) = recorded(Vec::new());
    let outcome = f.agent.run_turn(&mut conversation, "go".to_owned(), &observer, never_cancelled()).await;
    assert_eq!(outcome.end, TurnEnd::MalformedReplies { in_a_row: 2 });
    assert_eq!(outcome.steps, 2);
    assert!(outcome.end.note().is_some_and(|note| note.contains("unreadable arguments 2 times")));
    let results = tool_results(conversation.messages());
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
    let (mut conversation, _store) = recorded(Vec::new());
    let outcome = f.agent.run_turn(&mut conversation, "go".to_owned(), &Collect::default(), never_cancelled()).await;
    assert_eq!(outcome.end, TurnEnd::StepLimit { max_steps: 3 });
    assert_eq!(outcome.steps, 3);
    assert_eq!(outcome.text, "working");
    assert!(outcome.end.note().is_some_and(|note| note.contains("maxStepsPerTurn (3)")));
}

#[tokio::test]
async fn cancelling_gives_each_unfinished_call_a_result_and_keeps_the_conversation_valid() {
    let f = fixture(
        json!([{"toolCalls": [{"name": "echo__say", "args": {"text": "quick"}}, {"name": "clock__sleep", "args": {"ms": 60000}}]}]),
        8,
    );
    let (cancel, receiver) = watch::channel(false);
    let observer = Collect::default();
    let (mut conversation, _store) = recorded(Vec::new());
    let turn = f.agent.run_turn(&mut conversation, "go".to_owned(), &observer, receiver);
    let trigger = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = cancel.send(true);
    };
    let (outcome, ()) = tokio::join!(turn, trigger);
    assert_eq!(outcome.end, TurnEnd::Cancelled);
    let results = tool_results(conversation.messages());
    assert_eq!(results.len(), 2, "exactly one result per call");
    assert_eq!(results[0].1.status, ToolStatus::Ok);
    assert_eq!(results[1].1.error_code(), Some("E_TOOL_CANCELLED"));
    // user, assistant, two results: a valid conversation for the next turn.
    assert_eq!(conversation.messages().len(), 4);
    assert!(
        matches!(conversation.messages()[1].data, MessageData::Assistant { ref tool_calls, .. } if tool_calls.len() == 2)
    );
}

#[tokio::test]
async fn a_restart_request_is_reported_and_events_trace_the_turn() {
    let f = fixture(json!([{"toolCalls": [{"name": "self-restart__request"}]}, {"text": "ok"}]), 8);
    let (mut conversation, _store) = recorded(Vec::new());
    let outcome = f.agent.run_turn(&mut conversation, "go".to_owned(), &Collect::default(), never_cancelled()).await;
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
    // Each step records its own usage (the original's names); the turn's is their sum.
    let steps: Vec<&serde_json::Value> = events.iter().filter(|e| e["type"] == "step.completed").collect();
    let summed: u64 = steps.iter().map(|s| s["tokenUsage"]["totalTokens"].as_u64().unwrap_or(0)).sum();
    assert!(steps.iter().all(|s| s["tokenUsage"]["promptTokens"].as_u64().is_some_and(|n| n > 0)), "{steps:?}");
    assert_eq!(Some(summed), done["tokenUsage"]["totalTokens"].as_u64());
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
    let (mut conversation, store) = recorded(vec![
        Message::new(MessageData::User { content: "before".into() }, goondan_core::MessageSource::User),
        assistant,
        answered,
    ]);
    let observer = Collect::default();
    let outcome = f.agent.run_turn(&mut conversation, "after".to_owned(), &observer, never_cancelled()).await;
    assert_eq!(outcome.end, TurnEnd::Answered);
    let results = tool_results(conversation.messages());
    assert_eq!(results.len(), 2);
    assert_eq!(results[1].1.error_code(), Some("E_TOOL_INTERRUPTED"));
    // The repair was saved before the new input, in the same commit.
    let first = &store.batches()[0];
    assert!(
        matches!(&first[0], MessageEvent::Append { message } if matches!(message.data, MessageData::Tool { ref tool_call_id, .. } if tool_call_id == "c2"))
    );
    assert!(
        matches!(&first[1], MessageEvent::Append { message } if matches!(message.data, MessageData::User { ref content } if content == "after"))
    );
}

#[tokio::test]
async fn the_event_log_is_flushed_at_every_step_boundary() {
    #[derive(Default)]
    struct Flushes(AtomicUsize);
    impl goondan_tools::EventSink for Flushes {
        fn emit(&self, _event: &goondan_tools::RuntimeEvent<'_>) {}
        fn flushed(&self) -> BoxFuture<'static, ()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(std::future::ready(()))
        }
    }
    let mut f = fixture(json!([{"toolCalls": [{"name": "echo__say", "args": {"text": "a"}}]}, {"text": "done"}]), 8);
    let flushes = Arc::new(Flushes::default());
    f.agent.tooling.events = Arc::clone(&flushes) as _;
    let (mut conversation, _store) = recorded(Vec::new());
    let outcome = f.agent.run_turn(&mut conversation, "go".to_owned(), &Collect::default(), never_cancelled()).await;
    assert_eq!(outcome.steps, 2);
    assert_eq!(flushes.0.load(Ordering::SeqCst), 3, "after each of the two steps and at the end of the turn");
}

fn requests_of(f: &Fixture) -> Vec<ModelRequest> {
    f.provider.requests()
}

fn user_text(data: &MessageData) -> Option<&str> {
    match data {
        MessageData::User { content } | MessageData::System { content } => Some(content),
        _ => None,
    }
}

#[tokio::test]
async fn turn_and_step_layers_change_what_the_model_receives_and_it_is_saved() {
    let mut f = fixture(json!([{"toolCalls": [{"name": "echo__say", "args": {"text": "a"}}]}, {"text": "done"}]), 8);
    // A turn layer rewrites the input and sees the conversation as it stands.
    f.agent.tooling.turn_middleware.register(
        "shout",
        0,
        from_fn(|ctx: &mut TurnContext, next| {
            ctx.input.push('!');
            ctx.metadata.insert("seen".into(), json!(ctx.conversation.messages().len()));
            next.run(ctx)
        }),
    );
    // A step layer drops the oldest message and adds a system note, every step.
    f.agent.tooling.step_middleware.register(
        "window",
        0,
        from_fn(|ctx: &mut StepContext, next| {
            if let Some(first) = ctx.conversation.messages().first().map(|m| m.id.clone())
                && ctx.step_index == 0
            {
                let _ = ctx.conversation.emit(MessageEvent::Remove { target_id: first });
            }
            let note = Message::new(
                MessageData::System { content: format!("step {}", ctx.step_index) },
                goondan_core::MessageSource::Extension { extension_name: "window".into() },
            );
            let _ = ctx.conversation.emit(MessageEvent::Append { message: note });
            next.run(ctx)
        }),
    );
    let old = Message::new(MessageData::User { content: "old".into() }, goondan_core::MessageSource::User);
    let (mut conversation, store) = recorded(vec![old]);
    let outcome = f.agent.run_turn(&mut conversation, "go".to_owned(), &Collect::default(), never_cancelled()).await;
    assert_eq!(outcome.end, TurnEnd::Answered);
    let requests = requests_of(&f);
    let first: Vec<&str> = requests[0].messages.iter().filter_map(user_text).collect();
    assert_eq!(first, ["go!", "step 0"], "the oldest message was removed, the note added");
    let second: Vec<&str> = requests[1].messages.iter().filter_map(user_text).collect();
    assert_eq!(second, ["go!", "step 0", "step 1"]);
    // What the model saw is what was saved.
    assert_eq!(store.state().messages(), conversation.messages());
    assert!(conversation.state().is_consistent());
}

#[tokio::test]
async fn a_failing_or_panicking_layer_ends_the_turn_with_a_typed_reason_and_an_event() {
    // A step layer that refuses.
    let mut f = fixture(json!([{"text": "never"}]), 8);
    f.agent.tooling.step_middleware.register(
        "guard",
        0,
        from_fn(|_ctx: &mut StepContext, _next| Box::pin(async { StepOutcome::failed("guard", "budget exhausted") })),
    );
    let (mut conversation, _store) = recorded(Vec::new());
    let outcome = f.agent.run_turn(&mut conversation, "go".to_owned(), &Collect::default(), never_cancelled()).await;
    let expected =
        LayerFailure { pipeline: Pipeline::Step, layer: Some("guard".into()), message: "budget exhausted".into() };
    assert_eq!(outcome.end, TurnEnd::LayerFailed(expected));
    assert!(requests_of(&f).is_empty(), "the model was never called");
    let events = f.events.events();
    let last = events.last().cloned().unwrap_or_default();
    assert_eq!(last["type"], "turn.failed");
    assert_eq!(last["end"], "layerFailed");
    assert!(last["error"].as_str().is_some_and(|e| e.contains("guard") && e.contains("budget exhausted")));

    // A turn layer that panics, after another layer already ran.
    let mut f = fixture(json!([{"text": "never"}]), 8);
    f.agent.tooling.turn_middleware.register("outer", 0, from_fn(|ctx: &mut TurnContext, next| next.run(ctx)));
    f.agent.tooling.turn_middleware.register(
        "broken",
        1,
        from_fn(|_ctx: &mut TurnContext, _next| -> BoxFuture<'_, TurnOutcome> { panic!("bug in layer") }),
    );
    let (mut conversation, _store) = recorded(Vec::new());
    let outcome = f.agent.run_turn(&mut conversation, "go".to_owned(), &Collect::default(), never_cancelled()).await;
    let TurnEnd::LayerFailed(failure) = &outcome.end else { panic!("{:?}", outcome.end) };
    assert_eq!((failure.pipeline, failure.layer.as_deref()), (Pipeline::Turn, Some("broken")));
    assert!(failure.message.contains("bug in layer"));

    // A step layer that panics after the model answered: the step's messages are saved.
    let mut f = fixture(json!([{"text": "answer"}]), 8);
    f.agent.tooling.step_middleware.register(
        "late",
        0,
        from_fn(|ctx: &mut StepContext, next| {
            Box::pin(async move {
                let _ = next.run(ctx).await;
                panic!("after the core")
            })
        }),
    );
    let (mut conversation, store) = recorded(Vec::new());
    let outcome = f.agent.run_turn(&mut conversation, "go".to_owned(), &Collect::default(), never_cancelled()).await;
    assert!(matches!(&outcome.end, TurnEnd::LayerFailed(f) if f.pipeline == Pipeline::Step));
    assert_eq!(store.state().messages().len(), 2, "user and assistant were saved");
}

#[tokio::test]
async fn a_cancelled_turn_whose_layer_hangs_is_abandoned_and_the_conversation_reloaded() {
    let mut f = fixture(json!([{"text": "never"}]), 8);
    f.agent.cancel_grace = Duration::from_millis(100);
    f.agent.tooling.step_middleware.register(
        "stuck",
        0,
        from_fn(|_ctx: &mut StepContext, _next| Box::pin(std::future::pending())),
    );
    let earlier = Message::new(MessageData::User { content: "earlier".into() }, goondan_core::MessageSource::User);
    let (mut conversation, _store) = recorded(vec![earlier]);
    let (cancel, receiver) = watch::channel(false);
    let observer = Collect::default();
    let turn = f.agent.run_turn(&mut conversation, "go".to_owned(), &observer, receiver);
    let trigger = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = cancel.send(true);
    };
    let (outcome, ()) = tokio::time::timeout(Duration::from_secs(10), async { tokio::join!(turn, trigger) })
        .await
        .unwrap_or_else(|_| panic!("the turn hung"));
    assert_eq!(outcome.end, TurnEnd::Cancelled);
    // The conversation is what was committed: the earlier message and the new input.
    let texts: Vec<&str> = conversation.messages().iter().filter_map(|m| user_text(&m.data)).collect();
    assert_eq!(texts, ["earlier", "go"]);
}

/// A handler that registers another tool while the turn runs.
struct Installer(Arc<ToolRegistry>);

impl ToolHandler for Installer {
    fn call<'a>(&'a self, _ctx: &'a ToolContext, _input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        let item =
            ToolCatalogItem::new("late__hello", ToolSource::extension("test")).with_description("Registered late");
        let registered = self.0.register(item, sync_handler(|_, _| Ok(ToolOutput::Value(json!("hello from late")))));
        Box::pin(std::future::ready(
            registered
                .map(|()| ToolOutput::Value(json!("installed")))
                .map_err(|e| goondan_tools::ToolFailure::new(e.to_string())),
        ))
    }
}

#[tokio::test]
async fn a_tool_registered_during_a_turn_joins_the_next_steps_catalog() {
    let f = fixture(
        json!([
            {"toolCalls": [{"name": "install__now"}, {"name": "late__hello"}]},
            {"toolCalls": [{"name": "late__hello"}]},
            {"text": "done"}
        ]),
        8,
    );
    let registry = Arc::clone(f.agent.tooling.registry());
    registry
        .register(
            ToolCatalogItem::new("install__now", ToolSource::extension("test")),
            Arc::new(Installer(Arc::clone(&registry))),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let (mut conversation, _store) = recorded(Vec::new());
    let outcome = f.agent.run_turn(&mut conversation, "go".to_owned(), &Collect::default(), never_cancelled()).await;
    assert_eq!(outcome.end, TurnEnd::Answered);
    let results = tool_results(conversation.messages());
    // In the step that registered it, the tool was not yet in the catalog: the catalog is the allow-list.
    assert_eq!(results[1].1.error_code(), Some("E_TOOL_NOT_IN_CATALOG"));
    assert_eq!(results[2].1.output, Some(json!("hello from late")));
    let requests = requests_of(&f);
    let offered = |i: usize| requests[i].tools.iter().any(|t| t.name == "late__hello");
    assert!(!offered(0) && offered(1) && offered(2));
}

#[tokio::test]
async fn the_preview_catalog_is_what_the_first_request_offers() {
    let mut f = fixture(json!([{"text": "hi"}]), 8);
    f.agent.tooling.step_middleware.register(
        "hide-sleep",
        0,
        from_fn(|ctx: &mut StepContext, next| {
            ctx.tool_catalog.remove("clock__sleep");
            next.run(ctx)
        }),
    );
    let preview = f.agent.tooling.preview_catalog(ConversationState::default()).await;
    let (mut conversation, _store) = recorded(Vec::new());
    let _ = f.agent.run_turn(&mut conversation, "go".to_owned(), &Collect::default(), never_cancelled()).await;
    let offered: Vec<String> = requests_of(&f)[0].tools.iter().map(|t| t.name.clone()).collect();
    assert_eq!(preview.names().collect::<Vec<_>>(), offered);
    assert_eq!(offered, ["echo__say", "self-restart__request"]);
}

#[tokio::test]
async fn a_layers_own_events_reach_the_agents_sinks_in_the_turns_trace() {
    let mut f = fixture(json!([{"text": "hi"}]), 8);
    f.agent.tooling.step_middleware.register(
        "counter",
        0,
        from_fn(|ctx: &mut StepContext, next| {
            let sent = ctx.events.emit("counter.tick", &json!({"messages": ctx.conversation.messages().len()}));
            assert_eq!(sent, Ok(()));
            let faked = ctx.events.emit("turn.completed", &json!({}));
            assert!(matches!(faked, Err(goondan_runtime::EventNameError::Reserved(_))));
            assert!(ctx.events.emit("", &json!({})).is_err());
            assert!(ctx.events.emit("has space", &json!({})).is_err());
            next.run(ctx)
        }),
    );
    let (mut conversation, _store) = recorded(Vec::new());
    let _ = f.agent.run_turn(&mut conversation, "go".to_owned(), &Collect::default(), never_cancelled()).await;
    let events = f.events.events();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds, ["turn.started", "step.started", "counter.tick", "step.completed", "turn.completed"]);
    assert_eq!(events[2]["messages"], 1);
    assert_eq!(events[2]["parentSpanId"], events[1]["spanId"], "inside the step's span");
    assert_eq!(events[2]["traceId"], events[0]["traceId"]);
}

#[tokio::test]
async fn results_over_the_steps_budget_are_saved_to_files_and_the_model_gets_previews() {
    let mut f = fixture(
        json!([
            {"toolCalls": [{"name": "big__dump", "args": {}}, {"name": "big__dump", "args": {}}, {"name": "echo__say", "args": {"text": "hi"}}]},
            {"text": "done"}
        ]),
        8,
    );
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    f.agent.tooling.workdir = Arc::from(dir.path());
    f.agent
        .tooling
        .registry()
        .register(
            ToolCatalogItem::new("big__dump", ToolSource::extension("test")),
            sync_handler(|_, _| Ok(ToolOutput::Value(json!({"body": "x".repeat(700 * 1024)})))),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let (mut conversation, store) = recorded(Vec::new());
    let outcome = f.agent.run_turn(&mut conversation, "go".to_owned(), &Collect::default(), never_cancelled()).await;
    assert_eq!(outcome.end, TurnEnd::Answered);
    // Two results of 700 KiB exceed the default 1 MiB: the first is spilled, the rest fit.
    let results = tool_results(store.state().messages());
    let spilled = results[0].1.output.clone().unwrap_or_default();
    assert_eq!(spilled["truncated"], json!(true), "{spilled}");
    let saved_to = spilled["savedTo"].as_str().unwrap_or_default().to_owned();
    assert!(saved_to.starts_with(".goondan/tool-results/"), "{saved_to}");
    let saved: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(&saved_to)).unwrap_or_default()).unwrap_or_default();
    assert_eq!(saved["body"].as_str().map(str::len), Some(700 * 1024));
    assert_eq!(results[1].1.output.as_ref().and_then(|o| o["body"].as_str()).map(str::len), Some(700 * 1024));
    assert_eq!(results[2].1.output, Some(json!({"said": "hi"})));
    // The model's next request carries the preview, not the whole output.
    let requests = requests_of(&f);
    let sent = serde_json::to_string(&requests[1].messages).unwrap_or_default();
    assert!(sent.len() < 1024 * 1024, "{}", sent.len());
}

/// Retrying a request that fails (a provider outage) must not pile up
/// unanswered user messages: the failed turn takes its input back.
#[tokio::test]
async fn a_failed_request_leaves_no_unanswered_user_message_behind() {
    let f = fixture(json!([]), 8);
    let before = vec![Message::new(MessageData::User { content: "hello".into() }, goondan_core::MessageSource::User)];
    let (mut conversation, store) = recorded(before.clone());
    for attempt in 0..3 {
        let outcome = f
            .agent
            .run_turn(&mut conversation, format!("retry {attempt}"), &Collect::default(), never_cancelled())
            .await;
        assert!(matches!(outcome.end, TurnEnd::ModelFailed { .. }), "{:?}", outcome.end);
        assert_eq!(conversation.messages(), &before[..], "attempt {attempt}: the conversation is as before");
        assert_eq!(store.state().messages(), &before[..], "attempt {attempt}: and so is what was saved");
    }
    // Each request carried the earlier message and this attempt's input, once.
    for (attempt, request) in requests_of(&f).iter().enumerate() {
        let users: Vec<&str> = request.messages.iter().filter_map(user_text).collect();
        assert_eq!(users, ["hello", format!("retry {attempt}").as_str()]);
    }
}

/// Repairs made when a broken log was loaded are saved before the turn's
/// own events, so what is on disk folds to what the turn saw.
#[tokio::test]
async fn repairs_made_on_load_are_saved_before_the_turn() {
    let f = fixture(json!([{"text": "fine"}]), 8);
    let assistant = Message::new(
        MessageData::Assistant { content: None, tool_calls: vec![ToolCall::new("c1", "echo__say", JsonObject::new())] },
        goondan_core::MessageSource::Assistant { step_id: "s".into() },
    );
    let user = |text: &str| Message::new(MessageData::User { content: text.into() }, goondan_core::MessageSource::User);
    // As loaded: a call whose result line was lost, then more conversation.
    let mut state = ConversationState::new(vec![user("a"), assistant, user("b")]);
    let repairs = state.repair();
    assert_eq!(repairs.messages_removed, 1);
    // The log holds the conversation before the repair.
    let store = Arc::new(Recorder { initial: state.base_messages().to_vec(), batches: Mutex::new(Vec::new()) });
    let mut conversation = Conversation::new(state, Arc::clone(&store) as _);
    let outcome = f.agent.run_turn(&mut conversation, "c".to_owned(), &Collect::default(), never_cancelled()).await;
    assert_eq!(outcome.end, TurnEnd::Answered);
    assert!(matches!(&store.batches()[0][..], [MessageEvent::Remove { .. }]), "{:?}", store.batches());
    assert_eq!(store.state().messages(), conversation.messages());
}

#[tokio::test]
async fn a_turn_continues_the_callers_trace_and_its_input_carries_metadata() {
    let f = fixture(json!([{"text": "done"}]), 4);
    let (mut conversation, _store) = recorded(Vec::new());
    let trace = "0123456789abcdef0123456789abcdef";
    let mut metadata = goondan_core::JsonObject::new();
    metadata.insert("__goondanInbound".to_owned(), json!({"sourceName": "coordinator"}));
    let input = goondan_runtime::TurnInput {
        text: "hi".to_owned(),
        trace_id: Some(trace.to_owned()),
        metadata,
        ..Default::default()
    };
    let outcome = f.agent.run_turn(&mut conversation, input, &Collect::default(), never_cancelled()).await;
    assert_eq!(outcome.end, TurnEnd::Answered);
    let events = f.events.events();
    assert!(events.iter().all(|e| e["traceId"] == trace), "{events:?}");
    assert_eq!(conversation.messages()[0].metadata["__goondanInbound"]["sourceName"], "coordinator");
    // Turn layers see the input's metadata before the user message is made,
    // and what they leave is what it carries.
    let mut h = fixture(json!([{"text": "done"}]), 4);
    h.agent.tooling.turn_middleware.register(
        "tag",
        0,
        from_fn(|ctx: &mut TurnContext, next| {
            let sender = ctx.input_metadata["__goondanInbound"]["sourceName"].clone();
            ctx.input_metadata.insert("seenSender".to_owned(), sender);
            next.run(ctx)
        }),
    );
    let mut metadata = goondan_core::JsonObject::new();
    metadata.insert("__goondanInbound".to_owned(), json!({"sourceName": "planner"}));
    let input = goondan_runtime::TurnInput { text: "tagged".to_owned(), metadata, ..Default::default() };
    let (mut tagged, _store) = recorded(Vec::new());
    let outcome = h.agent.run_turn(&mut tagged, input, &Collect::default(), never_cancelled()).await;
    assert_eq!(outcome.end, TurnEnd::Answered);
    assert_eq!(tagged.messages()[0].metadata["seenSender"], "planner");
    // A trace id that is not one of ours is replaced, not trusted.
    let input =
        goondan_runtime::TurnInput { text: "x".to_owned(), trace_id: Some("../evil".to_owned()), ..Default::default() };
    let g = fixture(json!([{"text": "done"}]), 4);
    let _ = g.agent.run_turn(&mut conversation, input, &Collect::default(), never_cancelled()).await;
    assert!(g.events.events().iter().all(|e| e["traceId"].as_str().is_some_and(|t| t.len() == 32 && t != trace)));
}

#[tokio::test]
async fn a_callers_span_parents_the_turn_a_link_is_recorded_and_each_step_reports_its_model_call() {
    let f = fixture(json!([{"toolCalls": [{"name": "echo__say", "args": {"text": "x"}}]}, {"text": "done"}]), 4);
    let (mut conversation, _store) = recorded(Vec::new());
    let trace = "0123456789abcdef0123456789abcdef";
    let input = goondan_runtime::TurnInput {
        text: "hi".to_owned(),
        trace_id: Some(trace.to_owned()),
        parent_span_id: Some("00f067aa0ba902b7".to_owned()),
        link: Some(("fedcba9876543210fedcba9876543210".to_owned(), "1111111111111111".to_owned())),
        ..Default::default()
    };
    let outcome = f.agent.run_turn(&mut conversation, input, &Collect::default(), never_cancelled()).await;
    assert_eq!(outcome.end, TurnEnd::Answered);
    let events = f.events.events();
    let started = &events[0];
    assert_eq!(started["type"], "turn.started");
    assert_eq!(started["parentSpanId"], "00f067aa0ba902b7");
    assert_eq!(started["link"]["spanId"], "1111111111111111");
    let ended = events.iter().find(|e| e["type"] == "turn.completed").unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(ended["parentSpanId"], "00f067aa0ba902b7");
    let steps: Vec<_> = events.iter().filter(|e| e["type"] == "step.completed").collect();
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0]["model"]["provider"], "recording", "the provider's name when no Model resource named it");
    assert_eq!(steps[0]["model"]["finishReason"], "tool_calls");
    assert_eq!(steps[1]["model"]["finishReason"], "stop");
    assert!(steps[0]["model"]["duration"].as_f64().is_some_and(|d| d >= 0.0));
    assert!(steps[0]["model"]["started"].as_u64().is_some_and(|t| t > 0));
    // A parent span outside the caller's trace is not taken.
    let g = fixture(json!([{"text": "done"}]), 4);
    let input = goondan_runtime::TurnInput {
        text: "x".to_owned(),
        parent_span_id: Some("00f067aa0ba902b7".to_owned()),
        ..Default::default()
    };
    let _ = g.agent.run_turn(&mut conversation, input, &Collect::default(), never_cancelled()).await;
    assert!(g.events.events()[0].get("parentSpanId").is_none());
}

#[tokio::test]
async fn messages_in_the_inbox_enter_before_the_next_model_request() {
    let mut f = fixture(
        json!([
            {"toolCalls": [{"name": "echo__say", "args": {"text": "x"}}]},
            {"text": "saw the reply"}
        ]),
        4,
    );
    let inbox = Arc::new(goondan_runtime::Inbox::default());
    f.agent.inbox = Some(Arc::clone(&inbox));
    inbox.push(Message::new(
        MessageData::User { content: "reply from worker".into() },
        goondan_core::MessageSource::User,
    ));
    let (mut conversation, _store) = recorded(Vec::new());
    let outcome = f.agent.run_turn(&mut conversation, "go".to_owned(), &Collect::default(), never_cancelled()).await;
    assert_eq!(outcome.end, TurnEnd::Answered);
    let contents: Vec<String> = conversation
        .messages()
        .iter()
        .filter_map(|m| match &m.data {
            MessageData::User { content } => Some(content.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(contents, ["go", "reply from worker"], "the reply follows the input, before the first request");
    assert!(inbox.is_empty());
    // Between turns, the owner appends it and it is saved at once.
    inbox.push(Message::new(MessageData::User { content: "late reply".into() }, goondan_core::MessageSource::User));
    let late = inbox.take();
    assert!(conversation.append_and_commit(late).await.is_ok());
    assert!(
        conversation
            .messages()
            .last()
            .is_some_and(|m| matches!(&m.data, MessageData::User { content } if content == "late reply"))
    );
}

#[tokio::test]
async fn repeated_or_missing_call_ids_in_one_reply_get_ids_of_their_own() {
    let f = fixture(
        json!([
            {"toolCalls": [
                {"id": "dup", "name": "echo__say", "args": {"text": "one"}},
                {"id": "dup", "name": "echo__say", "args": {"text": "two"}},
                {"id": "dup_2", "name": "echo__say", "args": {"text": "three"}},
                {"id": "", "name": "echo__say", "args": {"text": "four"}}
            ]},
            {"text": "done"}
        ]),
        8,
    );
    let mut conversation = Conversation::in_memory(Vec::new());
    let outcome = f
        .agent
        .run_turn(&mut conversation, "go".to_owned(), &goondan_runtime::turn::NoObserver, never_cancelled())
        .await;
    assert_eq!(outcome.end, TurnEnd::Answered, "{outcome:?}");
    assert!(conversation.state().is_consistent());
    let ids: Vec<String> = conversation
        .messages()
        .iter()
        .find_map(|m| match &m.data {
            MessageData::Assistant { tool_calls, .. } if !tool_calls.is_empty() => {
                Some(tool_calls.iter().map(|c| c.id.to_string()).collect())
            }
            _ => None,
        })
        .unwrap_or_default();
    assert_eq!(ids, ["dup", "dup_3", "dup_2", "call_4"]);
    let answered: Vec<String> = conversation
        .messages()
        .iter()
        .filter_map(|m| match &m.data {
            MessageData::Tool { tool_call_id, result, .. } if result.status == goondan_core::ToolStatus::Ok => {
                Some(tool_call_id.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(answered, ids, "each call answered once (and run), in order");
}
