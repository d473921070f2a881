//! One turn of an agent: take an input, loop over steps — build the step's
//! Tool Catalog, run step middleware, call the model, run the tool calls it
//! asked for — and end with an answer (spec 002 §6, spec 000 §12.1–§12.4).
//!
//! ```text
//! Agent::run_turn(conversation, input, observer, cancel)
//!   save events left uncommitted (repairs made on load); begin the turn; repair
//!   turn middleware (onion over TurnContext) ─► turn core
//!     append the user message; commit
//!     per step, until an answer, maxStepsPerTurn, repeated malformed replies,
//!     cancel or a failure:
//!       step middleware (onion over StepContext) ─► step core
//!         commit what the layers emitted (the model sees a valid, durable conversation)
//!         ModelRequest from ctx.conversation and ctx.tool_catalog
//!         run the calls (bounded, concurrent) through the executor
//!         append [assistant, results…]; commit
//!       commit what step layers emitted afterwards; step.completed; events flushed
//!     the model or a step layer failed before any reply: remove the user message; commit
//!   commit what turn layers emitted afterwards; the store records the turn
//! ```
//!
//! The loop owns no terminal and no global state: the conversation and its
//! store come in as a [`Conversation`], and a [`TurnObserver`] sees streamed
//! text and tool calls.
//!
//! Guarantees:
//! - the tool calls of one reply run concurrently (bounded), and their
//!   results go back to the model in the order of the calls, exactly one per
//!   call — also when a call fails, times out or the turn is cancelled;
//! - a reply whose tool-call arguments are not valid JSON gets an
//!   `E_TOOL_INVALID_ARGS` result back to the model instead of a crash; after
//!   [`Agent::max_malformed_replies`] such replies in a row the turn ends;
//! - the model receives the `ToolResult` itself (status, output, error code,
//!   message, suggestion, help URL) so it can recover;
//! - a turn or step layer that fails or panics ends the turn with
//!   [`TurnEnd::LayerFailed`] and a `turn.failed` event; after a cancel, a
//!   turn whose layers do not return within [`Agent::cancel_grace`] is
//!   abandoned and the conversation reloaded from its store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use goondan_core::codes::{E_TOOL_CANCELLED, E_TOOL_INVALID_ARGS};
use goondan_core::ids::{SpanIdGenerator, format_span_id, new_ordered_id, new_trace_id};
use goondan_core::message::now_millis;
use goondan_core::{
    ConversationState, JsonObject, JsonValue, Message, MessageData, MessageSource, ToolCall, ToolError, ToolResult,
};
use goondan_llm::{ModelError, ModelParams, ModelProvider, ModelRequest, StreamEvent, ToolDefinition};
use goondan_tools::events::{EventKind, RuntimeEvent};
use goondan_tools::{BoxFuture, CallScope, Core, ToolCatalog};
use tokio::sync::watch;

use crate::agent::{AgentTooling, ScopeIds};
use crate::context::{
    EmitterTurn, EventEmitter, LayerFailure, Pipeline, StepContext, StepFailure, StepOutcome, TurnContext, TurnEnd,
    TurnOutcome,
};
use crate::conversation::{Conversation, ConversationStore, commit};
use crate::inbox::Inbox;
use crate::result_budget::StepResultBudget;

/// A trace id as the runtime makes them: 32 lowercase hex digits, not all
/// zero. Another agent's id that is not one is replaced, not trusted.
fn is_trace_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) && id.bytes().any(|b| b != b'0')
}

/// A span id as the runtime makes them: 16 lowercase hex digits, not all zero.
fn is_span_id(id: &str) -> bool {
    id.len() == 16 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) && id.bytes().any(|b| b != b'0')
}

/// An agent that runs turns: its tooling (tools, executor, middleware,
/// events) and its model.
pub struct Agent {
    /// Everything but the model: identity, tools, executor, middleware, events.
    pub tooling: AgentTooling,
    /// The model.
    pub provider: Arc<dyn ModelProvider>,
    /// The model's provider and id as telemetry names them
    /// (`gen_ai.provider.name`, `gen_ai.request.model`).
    pub model: ModelIdentity,
    /// The system prompt.
    pub system_prompt: Option<String>,
    /// Sampling parameters.
    pub params: ModelParams,
    /// The most steps one turn may take.
    pub max_steps_per_turn: u32,
    /// How many tool calls of one reply run at once.
    pub max_parallel_tool_calls: usize,
    /// Replies in a row whose tool calls all had unreadable arguments before
    /// the turn gives up.
    pub max_malformed_replies: u32,
    /// How long a cancelled turn's layers may take to return before the
    /// turn is abandoned.
    pub cancel_grace: Duration,
    /// How much tool output one step may put into the conversation.
    pub step_result_budget: StepResultBudget,
    /// Messages that enter the conversation before the next model request
    /// (asynchronous replies from other agents); none outside a swarm.
    pub inbox: Option<Arc<Inbox>>,
}

/// Which model an agent calls, as its `step.completed` events name it.
#[derive(Debug, Clone, Default)]
pub struct ModelIdentity {
    /// The provider (`openai`, `anthropic`, `gcp.gemini`, `scripted`).
    pub provider: Arc<str>,
    /// The model id of the Model resource.
    pub model: Arc<str>,
}

/// What starts a turn: the input, and where it came from.
#[derive(Debug, Clone, Default)]
pub struct TurnInput {
    /// The text of the user message.
    pub text: String,
    /// The trace the turn continues (another agent's request carries its
    /// caller's); a new trace when `None`.
    pub trace_id: Option<String>,
    /// Metadata of the user message (who sent it, for an agent's request).
    pub metadata: JsonObject,
    /// The span that caused the turn in the caller's trace (the calling
    /// agent's tool call, a connector's event), 16 hex digits: the turn's
    /// parent. Ignored unless `trace_id` is kept.
    pub parent_span_id: Option<String>,
    /// A span the turn follows from without being its child (the call
    /// that started a task whose end this turn delivers): `(traceId, spanId)`.
    pub link: Option<(String, String)>,
}

impl From<String> for TurnInput {
    fn from(text: String) -> Self {
        Self { text, ..Self::default() }
    }
}

impl From<&str> for TurnInput {
    fn from(text: &str) -> Self {
        Self::from(text.to_owned())
    }
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("agent_name", &self.tooling.agent_name)
            .field("instance_key", &self.tooling.instance_key)
            .field("max_steps_per_turn", &self.max_steps_per_turn)
            .finish_non_exhaustive()
    }
}

/// Sees a turn as it happens. Every method has a default that does nothing.
pub trait TurnObserver: Send + Sync {
    /// More reply text from the model.
    fn text_delta(&self, _text: &str) {}
    /// The model began a tool call.
    fn tool_call_started(&self, _name: &str) {}
    /// The step's tool calls start running (all of them, concurrently).
    fn tool_calls_running(&self, _calls: &[ToolCall]) {}
    /// A tool call finished.
    fn tool_call_finished(&self, _call: &ToolCall, _result: &ToolResult) {}
}

/// An observer that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl TurnObserver for NoObserver {}

impl Agent {
    /// The spec's default `maxStepsPerTurn`.
    pub const DEFAULT_MAX_STEPS_PER_TURN: u32 = 32;

    /// An agent with default limits, no system prompt and default parameters.
    pub fn new(tooling: AgentTooling, provider: Arc<dyn ModelProvider>) -> Self {
        let model = ModelIdentity { provider: Arc::from(provider.name()), model: Arc::from("") };
        Self {
            tooling,
            provider,
            model,
            system_prompt: None,
            params: ModelParams::default(),
            max_steps_per_turn: Self::DEFAULT_MAX_STEPS_PER_TURN,
            max_parallel_tool_calls: 8,
            max_malformed_replies: 3,
            cancel_grace: Duration::from_secs(5),
            step_result_budget: StepResultBudget::default(),
            inbox: None,
        }
    }

    /// Runs one turn on `conversation`, which grows by the turn's messages
    /// and is saved to its store at every step. `cancel` turning `true`
    /// cancels the turn. Drive the future to its end: cancelling is done
    /// through `cancel`, not by dropping it.
    pub async fn run_turn(
        &self,
        conversation: &mut Conversation,
        input: impl Into<TurnInput>,
        observer: &dyn TurnObserver,
        cancel: watch::Receiver<bool>,
    ) -> TurnOutcome {
        let TurnInput { text: input, trace_id, metadata: input_metadata, parent_span_id, link } = input.into();
        let tooling = &self.tooling;
        let store = conversation.store.clone();
        if conversation.needs_reload {
            reload(conversation).await;
        }
        let started = Instant::now();
        let span_ids = Arc::new(SpanIdGenerator::new());
        let turn_span = span_ids.next_raw();
        let continued = trace_id.filter(|id| is_trace_id(id));
        // A caller's span is the turn's parent only in the caller's trace.
        let parent = parent_span_id.filter(|span| continued.is_some() && is_span_id(span));
        let trace = TraceIds {
            trace_id: Arc::from(continued.unwrap_or_else(new_trace_id)),
            turn_id: Arc::from(new_ordered_id()),
            turn_span_hex: Arc::from(format_span_id(turn_span)),
            parent: parent.map(Arc::from),
        };
        let started_extra = link
            .filter(|(trace, span)| is_trace_id(trace) && is_span_id(span))
            .map(|(trace, span)| serde_json::json!({"link": {"traceId": trace, "spanId": span}}));
        self.emit(EventKind::TurnStarted, &trace, turn_span, trace.parent.as_deref(), None, started_extra.as_ref());

        let emitter_turn = Arc::new(EmitterTurn {
            sink: Arc::clone(&tooling.events),
            agent_name: Arc::clone(&tooling.agent_name),
            instance_key: Arc::clone(&tooling.instance_key),
            turn_id: Arc::clone(&trace.turn_id),
            trace_id: Arc::clone(&trace.trace_id),
            span_ids: Arc::clone(&span_ids),
        });
        // Events not yet saved — the repairs loading made to a log that broke
        // the rule — are saved before the turn begins, which would otherwise
        // drop them from the store while memory keeps them.
        if conversation.state.has_uncommitted()
            && let Err(error) = commit(&mut conversation.state, store.as_deref()).await
        {
            conversation.needs_reload = true;
            let outcome = TurnOutcome::ended(TurnEnd::CommitFailed { message: error.to_string() });
            self.finish(&outcome, &trace, turn_span, started).await;
            return outcome;
        }
        conversation.state.begin_turn();
        // Calls a crash left unanswered are answered before anything else
        // (saved with the user message).
        let repairs = conversation.state.repair();
        if !repairs.is_empty() {
            tracing::warn!("turn {}: the conversation was repaired before the input: {repairs}", trace.turn_id);
        }
        let mut ctx = TurnContext {
            agent_name: Arc::clone(&tooling.agent_name),
            instance_key: Arc::clone(&tooling.instance_key),
            turn_id: Arc::clone(&trace.turn_id),
            trace_id: Arc::clone(&trace.trace_id),
            input,
            input_metadata,
            events: EventEmitter::new(&emitter_turn, &trace.turn_span_hex, None),
            conversation: std::mem::take(&mut conversation.state),
            metadata: JsonObject::new(),
        };
        let core = TurnCore {
            agent: self,
            store: store.as_deref(),
            observer,
            cancel: cancel.clone(),
            span_ids,
            emitter_turn,
            trace: &trace,
        };
        let on_panic = |layer: Option<&str>, message: String| {
            TurnOutcome::ended(TurnEnd::LayerFailed(LayerFailure {
                pipeline: Pipeline::Turn,
                layer: layer.map(str::to_owned),
                message,
            }))
        };
        let finished = {
            let chain = tooling.turn_middleware.run_catching(&mut ctx, &core, &on_panic);
            let mut cancel = cancel;
            tokio::select! {
                biased;
                outcome = chain => Some(outcome),
                () = cancelled_for(&mut cancel, self.cancel_grace) => None,
            }
        };
        let outcome = match finished {
            Some(mut outcome) => {
                // What turn layers emitted after the steps.
                if let Err(error) = commit(&mut ctx.conversation, store.as_deref()).await
                    && !outcome.end.is_failure()
                {
                    outcome.end = TurnEnd::CommitFailed { message: error.to_string() };
                }
                conversation.state = ctx.conversation;
                if matches!(outcome.end, TurnEnd::CommitFailed { .. }) {
                    // Memory holds what the store does not: the next turn
                    // starts again from what was saved.
                    conversation.needs_reload = true;
                }
                outcome
            }
            None => {
                tracing::warn!(
                    "turn {} did not return within {:?} of its cancellation; abandoning it",
                    trace.turn_id,
                    self.cancel_grace
                );
                conversation.needs_reload = true;
                reload(conversation).await;
                TurnOutcome::ended(TurnEnd::Cancelled)
            }
        };
        if let Some(store) = &store
            && let Err(error) = store.turn_ended(&conversation.state).await
        {
            tracing::warn!("cannot record the end of the turn: {error}");
        }
        self.finish(&outcome, &trace, turn_span, started).await;
        outcome
    }

    async fn finish(&self, outcome: &TurnOutcome, trace: &TraceIds, turn_span: u64, started: Instant) {
        let kind = if outcome.end.is_failure() { EventKind::TurnFailed } else { EventKind::TurnCompleted };
        let mut extra = serde_json::json!({
            "stepCount": outcome.steps,
            "duration": started.elapsed().as_secs_f64() * 1000.0,
            "tokenUsage": {
                "inputTokens": outcome.usage.input_tokens,
                "outputTokens": outcome.usage.output_tokens,
                "totalTokens": outcome.usage.total(),
            },
            "end": outcome.end.as_str(),
        });
        if let Some(usage) = extra.get_mut("tokenUsage") {
            outcome.usage.add_kinds_to(usage);
        }
        if outcome.end.is_failure()
            && let (Some(note), Some(map)) = (outcome.end.note(), extra.as_object_mut())
        {
            map.insert("error".to_owned(), JsonValue::String(note));
        }
        self.emit(kind, trace, turn_span, trace.parent.as_deref(), None, Some(&extra));
        self.tooling.events.flushed().await;
    }

    fn emit(
        &self,
        kind: EventKind<'_>,
        trace: &TraceIds,
        span_id: u64,
        parent: Option<&str>,
        step: Option<&str>,
        extra: Option<&JsonValue>,
    ) {
        self.tooling.events.emit(&RuntimeEvent {
            kind,
            trace_id: &trace.trace_id,
            span_id,
            parent_span_id: parent,
            timestamp_ms: now_millis(),
            agent_name: &self.tooling.agent_name,
            instance_key: &self.tooling.instance_key,
            turn_id: &trace.turn_id,
            step_id: step,
            tool: None,
            extra,
            call_scope: None,
        });
    }
}

/// Replaces the in-memory state with the store's, after a turn was abandoned
/// or a commit failed.
pub(crate) async fn reload(conversation: &mut Conversation) {
    let reloaded = match &conversation.store {
        Some(store) => store.reload().await,
        None => Ok(None),
    };
    match reloaded {
        Ok(Some(state)) => {
            conversation.state = state;
            conversation.needs_reload = false;
        }
        Ok(None) => {
            tracing::warn!("the conversation cannot be reloaded (it lives only in memory) and starts over");
            conversation.state = ConversationState::default();
            conversation.needs_reload = false;
        }
        Err(error) => tracing::error!("cannot reload the conversation: {error}"),
    }
}

struct TraceIds {
    trace_id: Arc<str>,
    turn_id: Arc<str>,
    turn_span_hex: Arc<str>,
    /// The caller's span, when the turn continues another's trace.
    parent: Option<Arc<str>>,
}

/// The turn core: the user message, then the steps.
struct TurnCore<'a> {
    agent: &'a Agent,
    store: Option<&'a dyn ConversationStore>,
    observer: &'a dyn TurnObserver,
    cancel: watch::Receiver<bool>,
    span_ids: Arc<SpanIdGenerator>,
    emitter_turn: Arc<EmitterTurn>,
    trace: &'a TraceIds,
}

impl Core<TurnContext, TurnOutcome> for TurnCore<'_> {
    fn run<'a>(&'a self, ctx: &'a mut TurnContext) -> BoxFuture<'a, TurnOutcome> {
        Box::pin(self.run_steps(ctx))
    }
}

impl TurnCore<'_> {
    async fn run_steps(&self, ctx: &mut TurnContext) -> TurnOutcome {
        let agent = self.agent;
        let mut outcome = TurnOutcome::ended(TurnEnd::Answered);
        let mut user = Message::new(MessageData::User { content: ctx.input.clone() }, MessageSource::User);
        user.metadata.clone_from(&ctx.input_metadata);
        let user_id = user.id.clone();
        ctx.conversation.append_new([user]);
        if let Err(error) = commit(&mut ctx.conversation, self.store).await {
            outcome.end = TurnEnd::CommitFailed { message: error.to_string() };
            return outcome;
        }

        let input: Arc<str> = Arc::from(ctx.input.as_str());
        let mut malformed_in_a_row = 0;
        loop {
            if outcome.steps >= agent.max_steps_per_turn {
                outcome.end = TurnEnd::StepLimit { max_steps: agent.max_steps_per_turn };
                break;
            }
            let step_index = outcome.steps;
            outcome.steps += 1;
            let step = self.run_step(ctx, step_index, &input).await;
            outcome.usage.add(step.usage);
            outcome.restart_requested |= step.restart_requested;
            if let Some(text) = &step.text {
                outcome.text.clone_from(text);
            }
            match step.failure {
                Some(StepFailure::Cancelled) => {
                    outcome.end = TurnEnd::Cancelled;
                    break;
                }
                Some(StepFailure::Model { kind, message }) => {
                    outcome.end = TurnEnd::ModelFailed { kind, message };
                    break;
                }
                Some(StepFailure::Commit(message)) => {
                    outcome.end = TurnEnd::CommitFailed { message };
                    break;
                }
                Some(StepFailure::Layer(failure)) => {
                    outcome.end = TurnEnd::LayerFailed(failure);
                    break;
                }
                None => {}
            }
            if !step.should_continue {
                break;
            }
            if step.all_calls_malformed {
                malformed_in_a_row += 1;
                if malformed_in_a_row >= agent.max_malformed_replies {
                    outcome.end = TurnEnd::MalformedReplies { in_a_row: malformed_in_a_row };
                    break;
                }
            } else {
                malformed_in_a_row = 0;
            }
        }
        self.take_back_unanswered_input(ctx, &user_id, &mut outcome).await;
        outcome
    }

    /// A turn that failed before the model answered anything — the request
    /// failed, or a step layer did — removes its user message again, so the
    /// conversation is as it was before the turn. Otherwise every retry of a
    /// failing request (a provider outage, a broken extension) would leave
    /// one more unanswered user message behind, each sent again with the
    /// next request. The caller, which passed the input in, can send it
    /// again. A cancelled turn keeps its input (the user stopped it on purpose).
    async fn take_back_unanswered_input(&self, ctx: &mut TurnContext, user_id: &str, outcome: &mut TurnOutcome) {
        if !matches!(outcome.end, TurnEnd::ModelFailed { .. } | TurnEnd::LayerFailed(_)) {
            return;
        }
        if ctx.conversation.messages().last().is_none_or(|last| last.id != user_id) {
            return;
        }
        if ctx.conversation.emit(goondan_core::MessageEvent::Remove { target_id: user_id.to_owned() }).is_err() {
            return;
        }
        tracing::info!(
            "turn {}: the model did not answer; the input is not kept in the conversation, so a retry sends it once",
            ctx.turn_id
        );
        if let Err(error) = commit(&mut ctx.conversation, self.store).await {
            let failed = outcome.end.note().unwrap_or_default();
            outcome.end = TurnEnd::CommitFailed { message: format!("{error} (after: {failed})") };
        }
    }

    /// One step through the step middleware, with its events and commits.
    async fn run_step(&self, ctx: &mut TurnContext, step_index: u32, input: &Arc<str>) -> StepOutcome {
        let agent = self.agent;
        let tooling = &agent.tooling;
        let step_id: Arc<str> = Arc::from(new_ordered_id());
        let step_span = self.span_ids.next_raw();
        let parent = Some(&*self.trace.turn_span_hex);
        let step_started = Instant::now();
        let started_extra = serde_json::json!({"stepIndex": step_index});
        agent.emit(EventKind::StepStarted, self.trace, step_span, parent, Some(&step_id), Some(&started_extra));

        let step_span_hex: Arc<str> = Arc::from(format_span_id(step_span));
        // Replies that arrived since the last step go in before the step
        // layers run, as in the original, so that they see (and may reshape:
        // inter-agent-response-format) what the model will get. The step
        // core takes what arrives while the layers run.
        take_inbox(agent, &mut ctx.conversation);
        let mut step_ctx = StepContext {
            agent_name: Arc::clone(&ctx.agent_name),
            instance_key: Arc::clone(&ctx.instance_key),
            turn_id: Arc::clone(&ctx.turn_id),
            trace_id: Arc::clone(&ctx.trace_id),
            step_index,
            turn_input: Arc::clone(input),
            events: EventEmitter::new(&self.emitter_turn, &step_span_hex, Some(&step_id)),
            conversation: std::mem::take(&mut ctx.conversation),
            tool_catalog: tooling.base_catalog(),
            metadata: JsonObject::new(),
        };
        let core = StepCore {
            agent,
            store: self.store,
            observer: self.observer,
            cancel: self.cancel.clone(),
            model_call: std::sync::Mutex::new(None),
            ids: ScopeIds {
                turn_id: Arc::clone(&ctx.turn_id),
                step_id: Arc::clone(&step_id),
                step_index,
                trace_id: Arc::clone(&ctx.trace_id),
                step_span_id: step_span_hex,
            },
        };
        let on_panic = |layer: Option<&str>, message: String| StepOutcome {
            failure: Some(StepFailure::Layer(LayerFailure {
                pipeline: Pipeline::Step,
                layer: layer.map(str::to_owned),
                message,
            })),
            ..StepOutcome::default()
        };
        let mut step = tooling.step_middleware.run_catching(&mut step_ctx, &core, &on_panic).await;
        ctx.conversation = step_ctx.conversation;
        // What step layers emitted after the core.
        if let Err(error) = commit(&mut ctx.conversation, self.store).await
            && step.failure.is_none()
        {
            step.failure = Some(StepFailure::Commit(error.to_string()));
        }
        let mut extra = serde_json::json!({
            "stepIndex": step_index,
            "toolCalls": step.tool_calls.len(),
            "duration": step_started.elapsed().as_secs_f64() * 1000.0,
        });
        let model_call = core.model_call.lock().map(|mut call| call.take()).unwrap_or_default();
        if let Some(map) = extra.as_object_mut() {
            if let Some(call) = model_call {
                map.insert("model".to_owned(), call.to_json(&agent.model));
                // The step's usage, durable with the step (this event is synced
                // below, before the next step): `gdn usage` and budgets sum these.
                map.insert("tokenUsage".to_owned(), call.usage.to_record());
            }
            // A step that did not finish says why (the original's `step.failed`).
            if let Some(failure) = &step.failure {
                map.insert("error".to_owned(), JsonValue::String(failure.to_string()));
            }
        }
        agent.emit(EventKind::StepCompleted, self.trace, step_span, parent, Some(&step_id), Some(&extra));
        // The step's messages were synced by the commit; make its events
        // durable too before the next step begins.
        tooling.events.flushed().await;
        step
    }
}

/// The step core: one model call and its tool calls.
struct StepCore<'a> {
    agent: &'a Agent,
    store: Option<&'a dyn ConversationStore>,
    observer: &'a dyn TurnObserver,
    cancel: watch::Receiver<bool>,
    ids: ScopeIds,
    /// The step's model call, for its `step.completed` event.
    model_call: std::sync::Mutex<Option<ModelCall>>,
}

/// One model call, as `step.completed` reports it under `model`
/// (telemetry's `chat` span).
struct ModelCall {
    started_ms: u64,
    duration: Duration,
    usage: goondan_llm::TokenUsage,
    finish_reason: Option<&'static str>,
    error: Option<(&'static str, String)>,
}

impl ModelCall {
    fn to_json(&self, model: &ModelIdentity) -> JsonValue {
        let mut call = serde_json::json!({
            "provider": &*model.provider,
            "name": &*model.model,
            "started": self.started_ms,
            "duration": self.duration.as_secs_f64() * 1000.0,
            "inputTokens": self.usage.input_tokens,
            "outputTokens": self.usage.output_tokens,
        });
        if let Some(map) = call.as_object_mut() {
            if let Some(reason) = self.finish_reason {
                map.insert("finishReason".to_owned(), JsonValue::from(reason));
            }
            if let Some((kind, message)) = &self.error {
                map.insert("errorType".to_owned(), JsonValue::from(*kind));
                map.insert("error".to_owned(), JsonValue::from(message.as_str()));
            }
        }
        call
    }
}

/// The GenAI semantic conventions' name of a stop reason.
fn finish_reason(reason: goondan_llm::StopReason) -> &'static str {
    match reason {
        goondan_llm::StopReason::EndTurn => "stop",
        goondan_llm::StopReason::ToolUse => "tool_calls",
        goondan_llm::StopReason::MaxTokens => "length",
        goondan_llm::StopReason::Other => "other",
    }
}

impl Core<StepContext, StepOutcome> for StepCore<'_> {
    fn run<'a>(&'a self, ctx: &'a mut StepContext) -> BoxFuture<'a, StepOutcome> {
        Box::pin(self.run_step(ctx))
    }
}

impl StepCore<'_> {
    async fn run_step(&self, ctx: &mut StepContext) -> StepOutcome {
        let agent = self.agent;
        let mut outcome = StepOutcome::default();
        // Replies that arrived while the step layers ran go in before the request.
        take_inbox(agent, &mut ctx.conversation);
        // What the layers changed is made valid and durable before the model sees it.
        if let Err(error) = commit(&mut ctx.conversation, self.store).await {
            outcome.failure = Some(StepFailure::Commit(error.to_string()));
            return outcome;
        }
        let request = ModelRequest {
            system: agent.system_prompt.clone(),
            messages: ctx.conversation.messages().iter().map(|m| m.data.clone()).collect(),
            tools: ctx.tool_catalog.iter().map(definition).collect(),
            params: agent.params.clone(),
        };
        let observer = self.observer;
        let on_event = move |event: StreamEvent| match event {
            StreamEvent::TextDelta(text) => observer.text_delta(&text),
            StreamEvent::ToolCallStarted { name, .. } => observer.tool_call_started(&name),
        };
        let mut cancel = self.cancel.clone();
        let (started_ms, started) = (now_millis(), Instant::now());
        let reply = tokio::select! {
            reply = agent.provider.complete(&request, &on_event) => reply,
            () = cancelled(&mut cancel) => Err(ModelError::Cancelled),
        };
        let record = ModelCall {
            started_ms,
            duration: started.elapsed(),
            usage: reply.as_ref().map(|r| r.usage).unwrap_or_default(),
            finish_reason: reply.as_ref().ok().and_then(|r| r.stop_reason).map(finish_reason),
            error: reply.as_ref().err().map(|e| (e.kind(), e.to_string())),
        };
        if let Ok(mut call) = self.model_call.lock() {
            *call = Some(record);
        }
        let reply = match reply {
            Ok(reply) => reply,
            Err(ModelError::Cancelled) => {
                outcome.failure = Some(StepFailure::Cancelled);
                return outcome;
            }
            Err(error) => {
                outcome.failure = Some(StepFailure::Model { kind: error.kind(), message: error.to_string() });
                return outcome;
            }
        };
        outcome.usage = reply.usage;
        outcome.text = reply.text.filter(|t| !t.is_empty());

        // Parse each call's arguments; unreadable ones are answered with an
        // error result instead of being run.
        let mut calls = Vec::with_capacity(reply.tool_calls.len());
        let mut parse_errors = Vec::with_capacity(reply.tool_calls.len());
        for raw in &reply.tool_calls {
            let (args, error) = parse_arguments(&raw.name, &raw.arguments);
            calls.push(ToolCall::new(raw.id.as_str(), raw.name.as_str(), args));
            parse_errors.push(error);
        }
        make_call_ids_unique(&mut calls, &agent.tooling.agent_name);
        let assistant = Message::new(
            MessageData::Assistant { content: outcome.text.clone(), tool_calls: calls.clone() },
            MessageSource::Assistant { step_id: self.ids.step_id.to_string() },
        );
        outcome.all_calls_malformed = !calls.is_empty() && parse_errors.iter().all(Option::is_some);

        let scope = agent.tooling.call_scope(&self.ids, Arc::new(assistant.clone()));
        let catalog = Arc::new(std::mem::take(&mut ctx.tool_catalog));
        if !calls.is_empty() {
            self.observer.tool_calls_running(&calls);
        }
        let (mut results, was_cancelled) = self.run_calls(&calls, parse_errors, &scope, &catalog).await;
        if agent.step_result_budget.exceeded_by(&results) {
            results = self.spill(&calls, results).await;
        }
        ctx.tool_catalog = Arc::try_unwrap(catalog).unwrap_or_else(|shared| (*shared).clone());

        for (call, result) in calls.iter().zip(&results) {
            outcome.restart_requested |= !result.is_error()
                && result.output.as_ref().and_then(|o| o.get("restartRequested")) == Some(&JsonValue::Bool(true));
            self.observer.tool_call_finished(call, result);
        }
        let result_messages = calls.iter().zip(&results).map(|(call, result)| {
            Message::new(
                MessageData::Tool {
                    tool_call_id: call.id.to_string(),
                    tool_name: call.name.to_string(),
                    result: Box::new(result.clone()),
                },
                MessageSource::Tool { tool_call_id: call.id.to_string(), tool_name: call.name.to_string() },
            )
        });
        ctx.conversation.append_new(std::iter::once(assistant).chain(result_messages));
        if let Err(error) = commit(&mut ctx.conversation, self.store).await {
            outcome.failure = Some(StepFailure::Commit(error.to_string()));
        }
        if was_cancelled {
            outcome.failure = Some(StepFailure::Cancelled);
        }
        outcome.should_continue = !calls.is_empty();
        outcome.tool_calls = calls;
        outcome.tool_results = results;
        outcome
    }

    /// Saves the largest outputs to files so that the step's results fit
    /// its budget (the file I/O off the async threads).
    async fn spill(&self, calls: &[ToolCall], mut results: Vec<ToolResult>) -> Vec<ToolResult> {
        let budget = self.agent.step_result_budget;
        let workdir = Arc::clone(&self.agent.tooling.workdir);
        let step_id = Arc::clone(&self.ids.step_id);
        let calls = calls.to_vec();
        let kept = results.clone();
        match tokio::task::spawn_blocking(move || {
            let spilled = budget.apply(&workdir, &step_id, &calls, &mut results);
            tracing::info!("{spilled} tool result(s) of step {step_id} went over its budget and were saved to files");
            results
        })
        .await
        {
            Ok(results) => results,
            Err(error) => {
                tracing::error!("saving oversized tool results failed: {error}");
                kept
            }
        }
    }

    /// Runs the calls (at most `max_parallel_tool_calls` at once) and returns
    /// one result per call, in call order, and whether the turn's
    /// cancellation cut them short.
    async fn run_calls(
        &self,
        calls: &[ToolCall],
        parse_errors: Vec<Option<ToolError>>,
        scope: &Arc<CallScope>,
        catalog: &Arc<ToolCatalog>,
    ) -> (Vec<ToolResult>, bool) {
        let agent = self.agent;
        let mut results: Vec<Option<ToolResult>> = parse_errors.into_iter().map(|e| e.map(ToolResult::error)).collect();
        let limit = agent.max_parallel_tool_calls.max(1);
        let semaphore = Arc::new(tokio::sync::Semaphore::new(limit));
        let mut tasks = tokio::task::JoinSet::new();
        for (index, call) in calls.iter().enumerate() {
            if results[index].is_some() {
                continue;
            }
            let executor = Arc::clone(&agent.tooling.executor);
            let scope = Arc::clone(scope);
            let catalog = Arc::clone(catalog);
            let semaphore = Arc::clone(&semaphore);
            let call = call.clone();
            tasks.spawn(async move {
                let _permit = semaphore.acquire_owned().await;
                (index, executor.execute(call, &scope, &catalog).await)
            });
        }
        let mut cancel = self.cancel.clone();
        let mut was_cancelled = false;
        loop {
            tokio::select! {
                joined = tasks.join_next() => match joined {
                    Some(Ok((index, result))) => results[index] = Some(result),
                    Some(Err(error)) => tracing::error!("a tool call task failed: {error}"),
                    None => break,
                },
                () = cancelled(&mut cancel) => {
                    was_cancelled = true;
                    tasks.abort_all();
                    while tasks.join_next().await.is_some() {}
                    break;
                }
            }
        }
        let results = calls
            .iter()
            .zip(results)
            .map(|(call, result)| {
                result.unwrap_or_else(|| {
                    ToolResult::error(
                        ToolError::new(
                            E_TOOL_CANCELLED,
                            "ToolCancelledError",
                            format!("Tool '{}' was cancelled before it finished.", call.name),
                        )
                        .with_suggestion("The user interrupted the turn; run the tool again if it is still needed.")
                        .linked(),
                    )
                })
            })
            .collect();
        (results, was_cancelled)
    }
}

/// Resolves when `cancel` becomes true (never, if its sender is gone).
async fn cancelled(cancel: &mut watch::Receiver<bool>) {
    if cancel.wait_for(|cancelled| *cancelled).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Resolves `grace` after `cancel` becomes true.
async fn cancelled_for(cancel: &mut watch::Receiver<bool>, grace: Duration) {
    cancelled(cancel).await;
    tokio::time::sleep(grace).await;
}

/// Appends the replies queued in the agent's inbox (none outside a swarm).
fn take_inbox(agent: &Agent, conversation: &mut ConversationState) {
    if let Some(inbox) = &agent.inbox {
        let arrived = inbox.take();
        if !arrived.is_empty() {
            conversation.append_new(arrived);
        }
    }
}

/// Gives every call of one reply an id of its own. A model that repeats an
/// id (or sends none) would otherwise leave two results answering one call
/// and a call with none, which breaks the conversation rule; the repeats
/// get a suffix (`id_2`, …) and an empty id `call_<n>`, and the model sees
/// those ids in the conversation from then on.
fn make_call_ids_unique(calls: &mut [ToolCall], agent: &str) {
    // Almost every reply has distinct ids: check before allocating.
    let clean = calls.iter().enumerate().all(|(index, call)| {
        !call.id.is_empty() && calls.get(..index).is_none_or(|before| before.iter().all(|other| other.id != call.id))
    });
    if clean {
        return;
    }
    // The ids the model gave, so a new one never takes a later call's.
    let given: std::collections::HashSet<Arc<str>> = calls.iter().map(|call| Arc::clone(&call.id)).collect();
    let mut seen: std::collections::HashSet<Arc<str>> = std::collections::HashSet::with_capacity(calls.len());
    for (index, call) in calls.iter_mut().enumerate() {
        if !call.id.is_empty() && !seen.contains(&call.id) {
            seen.insert(Arc::clone(&call.id));
            continue;
        }
        let stem = if call.id.is_empty() { "call".to_owned() } else { call.id.to_string() };
        let mut n = index + 1;
        let mut id = format!("{stem}_{n}");
        while seen.contains(id.as_str()) || given.contains(id.as_str()) {
            n += 1;
            id = format!("{stem}_{n}");
        }
        tracing::warn!(
            target: "goondan::turn",
            agent = %agent,
            "the model gave tool call {} of its reply the id '{}', which is {}; it runs as '{id}'",
            index + 1,
            call.id,
            if call.id.is_empty() { "empty" } else { "taken by an earlier call" }
        );
        call.id = Arc::from(id.as_str());
        seen.insert(Arc::clone(&call.id));
    }
}

/// A catalog item as the model's tool definition.
fn definition(item: &goondan_tools::ToolCatalogItem) -> ToolDefinition {
    ToolDefinition {
        name: item.name().to_owned(),
        description: item.description().map(str::to_owned),
        parameters: item
            .parameters()
            .map_or_else(|| serde_json::json!({"type": "object", "properties": {}}), |p| p.raw().clone()),
    }
}

/// The call's arguments as an object, or the error result for the model.
fn parse_arguments(name: &str, text: &str) -> (JsonObject, Option<ToolError>) {
    let text = if text.trim().is_empty() { "{}" } else { text };
    match serde_json::from_str::<JsonValue>(text) {
        Ok(JsonValue::Object(map)) => (map, None),
        Ok(other) => (
            JsonObject::new(),
            Some(invalid_arguments(
                name,
                format!("the arguments must be a JSON object, got {}", goondan_core::json_type_name(&other)),
            )),
        ),
        Err(error) => {
            (JsonObject::new(), Some(invalid_arguments(name, format!("the arguments are not valid JSON: {error}"))))
        }
    }
}

fn invalid_arguments(name: &str, problem: String) -> ToolError {
    ToolError::new(
        E_TOOL_INVALID_ARGS,
        "ToolInputValidationError",
        format!("Invalid arguments for tool '{name}': {problem}"),
    )
    .with_suggestion("Call the tool again with its arguments as one JSON object matching its parameters schema.")
    .linked()
}
