//! What turn and step middleware see, and how turns and steps end.
//!
//! The shapes follow the original Goondan's `TurnMiddlewareContext` and
//! `StepMiddlewareContext`: who and where (agent, instance, turn, trace), the
//! conversation as it stands with a way to change it
//! ([`ConversationState::emit`] of a `MessageEvent`), free-form metadata, and
//! for steps the index and the Tool Catalog. A layer changes the context
//! before calling `next`, and the core reads it: the step core builds the
//! model request from `ctx.conversation` and `ctx.tool_catalog`, so a layer
//! decides what the model receives.
//!
//! A layer fails by returning an outcome with a failure
//! ([`TurnOutcome::layer_failed`], [`StepOutcome::failed`]) or by panicking;
//! either way the turn ends with [`TurnEnd::LayerFailed`] and a
//! `turn.failed` event, never with a panic or a hang of the process.

use std::fmt;
use std::sync::Arc;

use goondan_core::ids::SpanIdGenerator;
use goondan_core::message::now_millis;
use goondan_core::{ConversationState, JsonObject, JsonValue, ToolCall, ToolResult};
use goondan_llm::TokenUsage;
use goondan_tools::ToolCatalog;
use goondan_tools::events::{EventKind, EventSink, RuntimeEvent};

/// Emits a layer's own events (`api.events.emit` of the original) to the
/// agent's event sinks — the subscribers and the event log that receive the
/// runtime's own events — inside the current turn's trace.
#[derive(Clone)]
pub struct EventEmitter {
    turn: Arc<EmitterTurn>,
    /// The span of the turn or step the events belong to.
    parent_span_id: Arc<str>,
    step_id: Option<Arc<str>>,
}

/// What every emitter of one turn shares.
pub(crate) struct EmitterTurn {
    pub(crate) sink: Arc<dyn EventSink>,
    pub(crate) agent_name: Arc<str>,
    pub(crate) instance_key: Arc<str>,
    pub(crate) turn_id: Arc<str>,
    pub(crate) trace_id: Arc<str>,
    pub(crate) span_ids: Arc<SpanIdGenerator>,
}

impl fmt::Debug for EventEmitter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventEmitter").field("turn_id", &self.turn.turn_id).finish_non_exhaustive()
    }
}

/// Why an event name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventNameError {
    /// Empty, too long, or with characters outside `[A-Za-z0-9._:/-]`.
    #[error(
        "event name {0:?} is not valid: use 1 to {max} of the characters A-Z a-z 0-9 . _ : / -",
        max = EventEmitter::MAX_NAME_LEN
    )]
    Invalid(String),
    /// The name of one of the runtime's own events.
    #[error("event name '{0}' belongs to the runtime; an extension's events need names of their own")]
    Reserved(String),
}

impl EventEmitter {
    /// The longest event name accepted.
    pub const MAX_NAME_LEN: usize = 128;

    /// An emitter for events inside a turn (`step_id: None`) or a step.
    pub(crate) fn new(turn: &Arc<EmitterTurn>, parent_span_id: &Arc<str>, step_id: Option<&Arc<str>>) -> Self {
        Self { turn: Arc::clone(turn), parent_span_id: Arc::clone(parent_span_id), step_id: step_id.map(Arc::clone) }
    }

    /// Emits the event `name` with `payload` (an object's fields are merged
    /// into the event; any other value is written as `payload`). Names of
    /// the runtime's own events (`turn.started`, `tool.called`, …) are
    /// refused so that an extension cannot fake them.
    pub fn emit(&self, name: &str, payload: &JsonValue) -> Result<(), EventNameError> {
        let valid = !name.is_empty()
            && name.len() <= Self::MAX_NAME_LEN
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'-'));
        if !valid {
            return Err(EventNameError::Invalid(name.chars().take(Self::MAX_NAME_LEN + 1).collect()));
        }
        if EventKind::ALL.iter().any(|kind| kind.as_str() == name) {
            return Err(EventNameError::Reserved(name.to_owned()));
        }
        let turn = &self.turn;
        turn.sink.emit(&RuntimeEvent {
            kind: EventKind::Custom(name),
            trace_id: &turn.trace_id,
            span_id: turn.span_ids.next_raw(),
            parent_span_id: Some(&self.parent_span_id),
            timestamp_ms: now_millis(),
            agent_name: &turn.agent_name,
            instance_key: &turn.instance_key,
            turn_id: &turn.turn_id,
            step_id: self.step_id.as_deref(),
            tool: None,
            extra: Some(payload),
            call_scope: None,
        });
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
    /// The trace every event of the turn belongs to (32 hex digits).
    pub trace_id: Arc<str>,
    /// The input; layers may rewrite it before the turn core appends it as
    /// the user message.
    pub input: String,
    /// The metadata the user message will carry: where the input came from
    /// (`__goondanInbound` for another agent's request, as the original's
    /// inbound and call context). Layers may change it before the turn core
    /// appends the message.
    pub input_metadata: JsonObject,
    /// Emits the layer's own events into the turn's trace.
    pub events: EventEmitter,
    /// The conversation as it stands; layers read it and change it with
    /// message events.
    pub conversation: ConversationState,
    /// Free-form metadata shared between layers.
    pub metadata: JsonObject,
}

/// What step middleware sees.
#[derive(Debug, Clone)]
pub struct StepContext {
    /// The agent.
    pub agent_name: Arc<str>,
    /// The instance.
    pub instance_key: Arc<str>,
    /// The turn.
    pub turn_id: Arc<str>,
    /// The trace (32 hex digits).
    pub trace_id: Arc<str>,
    /// The step's index within the turn, from 0.
    pub step_index: u32,
    /// The turn's input, as the turn core received it.
    pub turn_input: Arc<str>,
    /// Emits the layer's own events into the step's trace.
    pub events: EventEmitter,
    /// The conversation as it stands; what the model receives is built from
    /// it when the core runs.
    pub conversation: ConversationState,
    /// The tools the model will be offered; layers may change it. It is
    /// also the allow-list of the step's calls.
    pub tool_catalog: ToolCatalog,
    /// Free-form metadata shared between layers.
    pub metadata: JsonObject,
}

/// Which pipeline a layer belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pipeline {
    /// Turn middleware.
    Turn,
    /// Step middleware.
    Step,
}

impl Pipeline {
    /// `turn` or `step`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Turn => "turn",
            Self::Step => "step",
        }
    }
}

/// A turn or step layer that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerFailure {
    /// The pipeline.
    pub pipeline: Pipeline,
    /// The layer's registered name, when known.
    pub layer: Option<String>,
    /// What went wrong.
    pub message: String,
}

impl fmt::Display for LayerFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.layer {
            Some(layer) => write!(f, "{} middleware '{layer}' failed: {}", self.pipeline.as_str(), self.message),
            None => write!(f, "{} middleware failed: {}", self.pipeline.as_str(), self.message),
        }
    }
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnEnd {
    /// The model answered without asking for tools (or a step layer said
    /// the turn should not continue).
    Answered,
    /// `maxStepsPerTurn` was reached before the model finished.
    StepLimit {
        /// The limit.
        max_steps: u32,
    },
    /// Too many replies in a row had unreadable tool-call arguments.
    MalformedReplies {
        /// How many in a row.
        in_a_row: u32,
    },
    /// The turn was cancelled.
    Cancelled,
    /// The model could not be called.
    ModelFailed {
        /// The kind of failure (`network`, `unauthorized`, `missing_key`,
        /// … : `ModelError::kind`), which decides `gdn run`'s exit code.
        kind: &'static str,
        /// The provider's error.
        message: String,
    },
    /// The conversation could not be saved.
    CommitFailed {
        /// The store's error.
        message: String,
    },
    /// A turn or step middleware layer failed.
    LayerFailed(LayerFailure),
}

impl TurnEnd {
    /// The wire name used in events and `--json` output: `answered`,
    /// `stepLimit`, `malformedReplies`, `cancelled`, `modelFailed`,
    /// `commitFailed`, `layerFailed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Answered => "answered",
            Self::StepLimit { .. } => "stepLimit",
            Self::MalformedReplies { .. } => "malformedReplies",
            Self::Cancelled => "cancelled",
            Self::ModelFailed { .. } => "modelFailed",
            Self::CommitFailed { .. } => "commitFailed",
            Self::LayerFailed(_) => "layerFailed",
        }
    }

    /// The kind of a model failure (`ModelError::kind`), for no other end.
    pub fn model_error_kind(&self) -> Option<&'static str> {
        match self {
            Self::ModelFailed { kind, .. } => Some(kind),
            _ => None,
        }
    }

    /// True for the ends that are failures (`turn.failed`).
    pub fn is_failure(&self) -> bool {
        matches!(self, Self::ModelFailed { .. } | Self::CommitFailed { .. } | Self::LayerFailed(_))
    }

    /// What to tell the user besides the answer, if anything.
    pub fn note(&self) -> Option<String> {
        match self {
            Self::Answered => None,
            Self::StepLimit { max_steps } => {
                Some(format!("stopped: the turn reached maxStepsPerTurn ({max_steps}) before the model finished"))
            }
            Self::MalformedReplies { in_a_row } => {
                Some(format!("stopped: the model's tool calls had unreadable arguments {in_a_row} times in a row"))
            }
            Self::Cancelled => Some("cancelled".to_owned()),
            Self::ModelFailed { message, .. } | Self::CommitFailed { message } => Some(message.clone()),
            Self::LayerFailed(failure) => Some(failure.to_string()),
        }
    }
}

/// How a turn ended, and what it produced.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutcome {
    /// The answer: the text of the last reply that had text.
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

impl TurnOutcome {
    /// A turn that ended with `end` before any step produced anything.
    pub fn ended(end: TurnEnd) -> Self {
        Self { text: String::new(), steps: 0, usage: TokenUsage::default(), end, restart_requested: false }
    }

    /// An outcome that ends the turn with a failed layer (for turn layers
    /// that refuse to go on).
    pub fn layer_failed(layer: impl Into<String>, message: impl Into<String>) -> Self {
        Self::ended(TurnEnd::LayerFailed(LayerFailure {
            pipeline: Pipeline::Turn,
            layer: Some(layer.into()),
            message: message.into(),
        }))
    }
}

/// What one step produced (the original's `StepResult`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepOutcome {
    /// The reply text, if any.
    pub text: Option<String>,
    /// The tool calls the model asked for, in order.
    pub tool_calls: Vec<ToolCall>,
    /// One result per call, in call order.
    pub tool_results: Vec<ToolResult>,
    /// Tokens used.
    pub usage: TokenUsage,
    /// Whether the turn goes on with another step. The core sets it when the
    /// model asked for tools; a layer may override it.
    pub should_continue: bool,
    /// Every tool call of the reply had unreadable arguments.
    pub all_calls_malformed: bool,
    /// A tool's ok output asked for a restart.
    pub restart_requested: bool,
    /// Why the step failed, if it did.
    pub failure: Option<StepFailure>,
    /// Free-form metadata.
    pub metadata: JsonObject,
}

impl StepOutcome {
    /// An outcome that ends the turn with a failed step layer.
    pub fn failed(layer: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            failure: Some(StepFailure::Layer(LayerFailure {
                pipeline: Pipeline::Step,
                layer: Some(layer.into()),
                message: message.into(),
            })),
            ..Self::default()
        }
    }
}

/// Why a step could not complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepFailure {
    /// The model call failed: its kind (`ModelError::kind`) and message.
    Model {
        /// `network`, `unauthorized`, `missing_key`, …
        kind: &'static str,
        /// The provider's error.
        message: String,
    },
    /// The turn was cancelled.
    Cancelled,
    /// The conversation could not be saved.
    Commit(String),
    /// A step layer failed.
    Layer(LayerFailure),
}

/// The failure as the turn's note says it (`step.completed`'s `error`).
impl fmt::Display for StepFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Model { message, .. } | Self::Commit(message) => f.write_str(message),
            Self::Cancelled => f.write_str("cancelled"),
            Self::Layer(failure) => failure.fmt(f),
        }
    }
}
