//! One turn of an agent: take an input, loop over steps — build the step's
//! Tool Catalog, run step middleware, call the model, run the tool calls it
//! asked for — and end with an answer (spec 002 §6, spec 000 §12.1–§12.4).
//!
//! The loop owns no terminal and no global state: the caller passes the
//! conversation and a [`TurnObserver`] that sees streamed text, tool calls,
//! and each completed step's messages (which it persists).
//!
//! Guarantees:
//! - the tool calls of one reply run concurrently (bounded), and their
//!   results go back to the model in the order of the calls, exactly one per
//!   call — also when a call fails, times out or the turn is cancelled;
//! - a reply whose tool-call arguments are not valid JSON gets an
//!   `E_TOOL_INVALID_ARGS` result back to the model instead of a crash; after
//!   [`AgentLoop::max_malformed_replies`] such replies in a row the turn ends
//!   with a clear message;
//! - the model receives the `ToolResult` itself (status, output, error code,
//!   message, suggestion, help URL) so it can recover;
//! - `maxStepsPerTurn` ends the turn with the last text and a note.

use std::sync::Arc;
use std::time::Instant;

use goondan_core::ids::{SpanIdGenerator, new_ordered_id, new_trace_id};
use goondan_core::message::now_millis;
use goondan_core::{JsonObject, JsonValue, Message, MessageData, MessageSource, ToolCall, ToolError, ToolResult};
use goondan_llm::{ModelError, ModelParams, ModelProvider, ModelRequest, StreamEvent, TokenUsage, ToolDefinition};
use goondan_tools::assembly::AgentTools;
use goondan_tools::events::{EventKind, EventSink, RuntimeEvent};
use goondan_tools::step::StepContext;
use goondan_tools::{BoxFuture, CallScope, Core, MiddlewareChain, ToolCatalog, ToolExecutor};
use tokio::sync::watch;

/// Everything one agent needs to run turns.
pub struct AgentLoop {
    /// The agent's name.
    pub agent_name: Arc<str>,
    /// The instance's key.
    pub instance_key: Arc<str>,
    /// The instance's working directory.
    pub workdir: Arc<std::path::Path>,
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
    /// The model.
    pub provider: Arc<dyn ModelProvider>,
    /// The agent's declared tools.
    pub tools: AgentTools,
    /// The executor (registry, toolCall middleware, policy, events).
    pub executor: Arc<ToolExecutor>,
    /// Step middleware; its core calls the model and runs the tool calls.
    pub step_middleware: MiddlewareChain<StepContext, StepOutcome>,
    /// Turn middleware; its core runs the steps.
    pub turn_middleware: MiddlewareChain<TurnContext, TurnOutcome>,
    /// Where turn and step events go (tool events go through the executor).
    pub events: Arc<dyn EventSink>,
}

impl std::fmt::Debug for AgentLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentLoop")
            .field("agent_name", &self.agent_name)
            .field("instance_key", &self.instance_key)
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
    /// A tool call finished.
    fn tool_call_finished(&self, _call: &ToolCall, _result: &ToolResult) {}
    /// Messages to persist: the user's input, then each step's assistant
    /// message with its tool results. An error ends the turn.
    fn commit(&self, _messages: &[Message]) -> Result<(), String> {
        Ok(())
    }
}

/// What turn middleware sees.
#[derive(Debug, Clone)]
pub struct TurnContext {
    /// The agent.
    pub agent_name: Arc<str>,
    /// The instance.
    pub instance_key: Arc<str>,
    /// The turn.
    pub turn_id: Arc<str>,
    /// The input; layers may rewrite it before the steps run.
    pub input: String,
    /// Free-form metadata shared between layers.
    pub metadata: JsonObject,
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutcome {
    /// The answer (the last reply's text), possibly with a note appended.
    pub text: String,
    /// Steps taken.
    pub steps: u32,
    /// Tokens used across the steps.
    pub usage: TokenUsage,
    /// How it ended.
    pub end: TurnEnd,
    /// A tool asked the agent to restart (self-restart) during the turn.
    pub restart_requested: bool,
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnEnd {
    /// The model answered without asking for tools.
    Answered,
    /// `maxStepsPerTurn` was reached.
    StepLimit,
    /// Too many replies in a row had unreadable tool-call arguments.
    MalformedReplies,
    /// The turn was cancelled (Ctrl-C).
    Cancelled,
    /// The model could not be called.
    ModelFailed(String),
    /// The conversation could not be saved.
    CommitFailed(String),
}

/// What one step produced.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutcome {
    /// The assistant message (text and tool calls), if the model answered.
    pub assistant: Option<Message>,
    /// One result message per tool call, in call order.
    pub tool_results: Vec<Message>,
    /// The reply text.
    pub text: Option<String>,
    /// Tokens used.
    pub usage: TokenUsage,
    /// Every tool call of the reply had unreadable arguments.
    pub all_calls_malformed: bool,
    /// A tool's ok output asked for a restart.
    pub restart_requested: bool,
    /// Why the step failed, if it did.
    pub failure: Option<StepFailure>,
}

/// Why a step could not complete.
#[derive(Debug, Clone, PartialEq)]
pub enum StepFailure {
    /// The model call failed.
    Model(String),
    /// The turn was cancelled.
    Cancelled,
}

/// Runs turns; `cancel` turning `true` cancels the running turn.
impl AgentLoop {
    /// Runs one turn on `history` (the conversation so far, which grows by
    /// the turn's messages).
    pub async fn run_turn(
        &self,
        history: &mut Vec<Message>,
        input: String,
        observer: &dyn TurnObserver,
        cancel: watch::Receiver<bool>,
    ) -> TurnOutcome {
        let mut ctx = TurnContext {
            agent_name: Arc::clone(&self.agent_name),
            instance_key: Arc::clone(&self.instance_key),
            turn_id: Arc::from(new_ordered_id()),
            input,
            metadata: JsonObject::new(),
        };
        let core = TurnCore { agent: self, history: tokio::sync::Mutex::new(history), observer, cancel };
        self.turn_middleware.run(&mut ctx, &core).await
    }

    fn emit(
        &self,
        kind: EventKind,
        trace: &TraceIds,
        span_id: u64,
        parent: Option<&str>,
        step: Option<&str>,
        extra: Option<&JsonValue>,
    ) {
        self.events.emit(&RuntimeEvent {
            kind,
            trace_id: &trace.trace_id,
            span_id,
            parent_span_id: parent,
            timestamp_ms: now_millis(),
            agent_name: &self.agent_name,
            instance_key: &self.instance_key,
            turn_id: &trace.turn_id,
            step_id: step,
            tool: None,
            extra,
            call_scope: None,
        });
    }
}

struct TraceIds {
    trace_id: Arc<str>,
    turn_id: Arc<str>,
}

/// The turn core: the steps.
struct TurnCore<'a> {
    agent: &'a AgentLoop,
    // The core runs once per turn; the mutex only satisfies `Core`'s `&self`.
    history: tokio::sync::Mutex<&'a mut Vec<Message>>,
    observer: &'a dyn TurnObserver,
    cancel: watch::Receiver<bool>,
}

impl Core<TurnContext, TurnOutcome> for TurnCore<'_> {
    fn run<'a>(&'a self, ctx: &'a mut TurnContext) -> BoxFuture<'a, TurnOutcome> {
        Box::pin(async move {
            let mut history = self.history.lock().await;
            self.run_steps(ctx, &mut history).await
        })
    }
}

impl TurnCore<'_> {
    async fn run_steps(&self, ctx: &mut TurnContext, history: &mut Vec<Message>) -> TurnOutcome {
        let agent = self.agent;
        let started = Instant::now();
        let span_ids = SpanIdGenerator::new();
        let trace = TraceIds { trace_id: Arc::from(new_trace_id()), turn_id: Arc::clone(&ctx.turn_id) };
        let turn_span = span_ids.next_raw();
        let turn_span_hex = goondan_core::ids::format_span_id(turn_span);
        agent.emit(EventKind::TurnStarted, &trace, turn_span, None, None, None);

        let user = Message::new(MessageData::User { content: ctx.input.clone() }, MessageSource::User);
        let mut outcome = TurnOutcome {
            text: String::new(),
            steps: 0,
            usage: TokenUsage::default(),
            end: TurnEnd::Answered,
            restart_requested: false,
        };
        // A crash in the middle of saving a step can leave the last
        // assistant message with calls that have no results; answer them so
        // the conversation is valid for the model.
        let mut opening = unanswered_call_results(history);
        opening.push(user);
        if let Err(error) = self.observer.commit(&opening) {
            outcome.end = TurnEnd::CommitFailed(error);
            return self.finish(outcome, &trace, turn_span, started);
        }
        history.extend(opening);

        let mut malformed_in_a_row = 0;
        loop {
            if outcome.steps >= agent.max_steps_per_turn {
                outcome.end = TurnEnd::StepLimit;
                let note = format!(
                    "[stopped: the turn reached maxStepsPerTurn ({}) before the model finished]",
                    agent.max_steps_per_turn
                );
                outcome.text = if outcome.text.is_empty() { note } else { format!("{}\n\n{note}", outcome.text) };
                break;
            }
            let step_index = outcome.steps;
            outcome.steps += 1;
            let step_id: Arc<str> = Arc::from(new_ordered_id());
            let step_span = span_ids.next_raw();
            let step_span_hex: Arc<str> = Arc::from(goondan_core::ids::format_span_id(step_span));
            agent.emit(EventKind::StepStarted, &trace, step_span, Some(&turn_span_hex), Some(&step_id), None);

            let mut step_ctx = StepContext {
                agent_name: Arc::clone(&agent.agent_name),
                instance_key: Arc::clone(&agent.instance_key),
                turn_id: Arc::clone(&ctx.turn_id),
                step_index,
                tool_catalog: agent.tools.step_catalog(agent.executor.registry()),
                metadata: JsonObject::new(),
            };
            let core = StepCore {
                agent,
                history,
                observer: self.observer,
                cancel: self.cancel.clone(),
                step_id: Arc::clone(&step_id),
                trace_id: Arc::clone(&trace.trace_id),
                step_span: Arc::clone(&step_span_hex),
            };
            let step = agent.step_middleware.run(&mut step_ctx, &core).await;
            outcome.usage.add(step.usage);
            outcome.restart_requested |= step.restart_requested;

            let mut committed: Vec<Message> = Vec::with_capacity(1 + step.tool_results.len());
            committed.extend(step.assistant.iter().cloned());
            committed.extend(step.tool_results.iter().cloned());
            if !committed.is_empty() {
                if let Err(error) = self.observer.commit(&committed) {
                    outcome.end = TurnEnd::CommitFailed(error);
                    break;
                }
                history.extend(committed);
            }
            let extra = serde_json::json!({"stepIndex": step_index, "toolCalls": step.tool_results.len()});
            agent.emit(EventKind::StepCompleted, &trace, step_span, Some(&turn_span_hex), Some(&step_id), Some(&extra));
            // The step's messages were synced by `commit`; make its events
            // durable too before the next step begins.
            agent.events.flush();

            if let Some(text) = &step.text {
                outcome.text = text.clone();
            }
            match step.failure {
                Some(StepFailure::Cancelled) => {
                    outcome.end = TurnEnd::Cancelled;
                    break;
                }
                Some(StepFailure::Model(message)) => {
                    outcome.end = TurnEnd::ModelFailed(message);
                    break;
                }
                None => {}
            }
            if step.tool_results.is_empty() {
                break;
            }
            if step.all_calls_malformed {
                malformed_in_a_row += 1;
                if malformed_in_a_row >= agent.max_malformed_replies {
                    outcome.end = TurnEnd::MalformedReplies;
                    let note = format!(
                        "[stopped: the model's tool calls had unreadable arguments {malformed_in_a_row} times in a row]"
                    );
                    outcome.text = if outcome.text.is_empty() { note } else { format!("{}\n\n{note}", outcome.text) };
                    break;
                }
            } else {
                malformed_in_a_row = 0;
            }
        }
        self.finish(outcome, &trace, turn_span, started)
    }

    fn finish(&self, outcome: TurnOutcome, trace: &TraceIds, turn_span: u64, started: Instant) -> TurnOutcome {
        let kind = match outcome.end {
            TurnEnd::ModelFailed(_) | TurnEnd::CommitFailed(_) => EventKind::TurnFailed,
            _ => EventKind::TurnCompleted,
        };
        let extra = serde_json::json!({
            "stepCount": outcome.steps,
            "duration": started.elapsed().as_secs_f64() * 1000.0,
            "tokenUsage": {
                "inputTokens": outcome.usage.input_tokens,
                "outputTokens": outcome.usage.output_tokens,
                "totalTokens": outcome.usage.total(),
            },
            "end": end_name(&outcome.end),
        });
        self.agent.emit(kind, trace, turn_span, None, None, Some(&extra));
        self.agent.events.flush();
        outcome
    }
}

fn end_name(end: &TurnEnd) -> &'static str {
    match end {
        TurnEnd::Answered => "answered",
        TurnEnd::StepLimit => "stepLimit",
        TurnEnd::MalformedReplies => "malformedReplies",
        TurnEnd::Cancelled => "cancelled",
        TurnEnd::ModelFailed(_) => "modelFailed",
        TurnEnd::CommitFailed(_) => "commitFailed",
    }
}

/// The step core: one model call and its tool calls.
struct StepCore<'a> {
    agent: &'a AgentLoop,
    history: &'a [Message],
    observer: &'a dyn TurnObserver,
    cancel: watch::Receiver<bool>,
    step_id: Arc<str>,
    trace_id: Arc<str>,
    step_span: Arc<str>,
}

impl Core<StepContext, StepOutcome> for StepCore<'_> {
    fn run<'a>(&'a self, ctx: &'a mut StepContext) -> BoxFuture<'a, StepOutcome> {
        Box::pin(self.run_step(ctx))
    }
}

impl StepCore<'_> {
    async fn run_step(&self, ctx: &mut StepContext) -> StepOutcome {
        let agent = self.agent;
        let mut outcome = StepOutcome {
            assistant: None,
            tool_results: Vec::new(),
            text: None,
            usage: TokenUsage::default(),
            all_calls_malformed: false,
            restart_requested: false,
            failure: None,
        };
        let request = ModelRequest {
            system: agent.system_prompt.clone(),
            messages: self.history.iter().map(|m| m.data.clone()).collect(),
            tools: ctx.tool_catalog.iter().map(definition).collect(),
            params: agent.params.clone(),
        };
        let observer = self.observer;
        let on_event = move |event: StreamEvent| match event {
            StreamEvent::TextDelta(text) => observer.text_delta(&text),
            StreamEvent::ToolCallStarted { name, .. } => observer.tool_call_started(&name),
        };
        let mut cancel = self.cancel.clone();
        let reply = tokio::select! {
            reply = agent.provider.complete(&request, &on_event) => reply,
            () = cancelled(&mut cancel) => Err(ModelError::Cancelled),
        };
        let reply = match reply {
            Ok(reply) => reply,
            Err(ModelError::Cancelled) => {
                outcome.failure = Some(StepFailure::Cancelled);
                return outcome;
            }
            Err(error) => {
                outcome.failure = Some(StepFailure::Model(error.to_string()));
                return outcome;
            }
        };
        outcome.usage = reply.usage;
        outcome.text = reply.text.clone().filter(|t| !t.is_empty());

        // Parse each call's arguments; unreadable ones are answered with an
        // error result instead of being run.
        let mut calls = Vec::with_capacity(reply.tool_calls.len());
        let mut parse_errors = Vec::with_capacity(reply.tool_calls.len());
        for raw in &reply.tool_calls {
            let (args, error) = parse_arguments(&raw.name, &raw.arguments);
            calls.push(ToolCall::new(raw.id.as_str(), raw.name.as_str(), args));
            parse_errors.push(error);
        }
        let assistant = Message::new(
            MessageData::Assistant { content: outcome.text.clone(), tool_calls: calls.clone() },
            MessageSource::Assistant { step_id: self.step_id.to_string() },
        );
        outcome.all_calls_malformed = !calls.is_empty() && parse_errors.iter().all(Option::is_some);

        let scope = Arc::new(CallScope {
            agent_name: Arc::clone(&agent.agent_name),
            instance_key: Arc::clone(&agent.instance_key),
            turn_id: Arc::clone(&ctx.turn_id),
            step_id: Arc::clone(&self.step_id),
            message: Arc::new(assistant.clone()),
            workdir: Arc::clone(&agent.workdir),
            trace_id: Arc::clone(&self.trace_id),
            step_span_id: Arc::clone(&self.step_span),
            runtime: None,
        });
        let catalog = Arc::new(std::mem::take(&mut ctx.tool_catalog));
        let results = self.run_calls(&calls, parse_errors, &scope, &catalog).await;
        ctx.tool_catalog = Arc::try_unwrap(catalog).unwrap_or_else(|shared| (*shared).clone());

        for (call, result) in calls.iter().zip(&results) {
            outcome.restart_requested |= !result.is_error()
                && result.output.as_ref().and_then(|o| o.get("restartRequested")) == Some(&JsonValue::Bool(true));
            self.observer.tool_call_finished(call, result);
        }
        if results.iter().any(|r| r.error_code() == Some(E_TOOL_CANCELLED)) {
            outcome.failure = Some(StepFailure::Cancelled);
        }
        outcome.tool_results = calls
            .iter()
            .zip(results)
            .map(|(call, result)| {
                Message::new(
                    MessageData::Tool {
                        tool_call_id: call.id.to_string(),
                        tool_name: call.name.to_string(),
                        result: Box::new(result),
                    },
                    MessageSource::Tool { tool_call_id: call.id.to_string(), tool_name: call.name.to_string() },
                )
            })
            .collect();
        outcome.assistant = Some(assistant);
        outcome
    }

    /// Runs the calls (at most `max_parallel_tool_calls` at once) and returns
    /// one result per call, in call order.
    async fn run_calls(
        &self,
        calls: &[ToolCall],
        parse_errors: Vec<Option<ToolError>>,
        scope: &Arc<CallScope>,
        catalog: &Arc<ToolCatalog>,
    ) -> Vec<ToolResult> {
        let agent = self.agent;
        let mut results: Vec<Option<ToolResult>> = parse_errors.into_iter().map(|e| e.map(ToolResult::error)).collect();
        let limit = agent.max_parallel_tool_calls.max(1);
        let semaphore = Arc::new(tokio::sync::Semaphore::new(limit));
        let mut tasks = tokio::task::JoinSet::new();
        for (index, call) in calls.iter().enumerate() {
            if results[index].is_some() {
                continue;
            }
            let executor = Arc::clone(&agent.executor);
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
        loop {
            tokio::select! {
                joined = tasks.join_next() => match joined {
                    Some(Ok((index, result))) => results[index] = Some(result),
                    Some(Err(error)) => tracing::error!("a tool call task failed: {error}"),
                    None => break,
                },
                () = cancelled(&mut cancel) => {
                    tasks.abort_all();
                    while tasks.join_next().await.is_some() {}
                    break;
                }
            }
        }
        calls
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
                        .with_suggestion("The user interrupted the turn; run the tool again if it is still needed."),
                    )
                })
            })
            .collect()
    }
}

/// The code of a call the turn's cancellation cut short.
pub const E_TOOL_CANCELLED: &str = "E_TOOL_CANCELLED";
/// The code of a call whose result was lost when the process stopped.
pub const E_TOOL_INTERRUPTED: &str = "E_TOOL_INTERRUPTED";

/// Error results for the calls of the last assistant message that have none.
pub fn unanswered_call_results(history: &[Message]) -> Vec<Message> {
    let Some(last_assistant) = history.iter().rposition(|m| matches!(m.data, MessageData::Assistant { .. })) else {
        return Vec::new();
    };
    let MessageData::Assistant { tool_calls, .. } = &history[last_assistant].data else {
        return Vec::new();
    };
    let answered: Vec<&str> = history[last_assistant + 1..]
        .iter()
        .filter_map(|m| match &m.data {
            MessageData::Tool { tool_call_id, .. } => Some(tool_call_id.as_str()),
            _ => None,
        })
        .collect();
    tool_calls
        .iter()
        .filter(|call| !answered.contains(&call.id.as_ref()))
        .map(|call| {
            let result = ToolResult::error(
                ToolError::new(
                    E_TOOL_INTERRUPTED,
                    "ToolInterruptedError",
                    format!(
                        "The result of tool '{}' was lost: the agent stopped while the call was running.",
                        call.name
                    ),
                )
                .with_suggestion("Call the tool again if its result is still needed."),
            );
            Message::new(
                MessageData::Tool {
                    tool_call_id: call.id.to_string(),
                    tool_name: call.name.to_string(),
                    result: Box::new(result),
                },
                MessageSource::Tool { tool_call_id: call.id.to_string(), tool_name: call.name.to_string() },
            )
        })
        .collect()
}

/// Resolves when `cancel` becomes true (never, if its sender is gone).
async fn cancelled(cancel: &mut watch::Receiver<bool>) {
    if cancel.wait_for(|cancelled| *cancelled).await.is_err() {
        std::future::pending::<()>().await;
    }
}

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
        "E_TOOL_INVALID_ARGS",
        "ToolInputValidationError",
        format!("Invalid arguments for tool '{name}': {problem}"),
    )
    .with_suggestion("Call the tool again with its arguments as one JSON object matching its parameters schema.")
}
