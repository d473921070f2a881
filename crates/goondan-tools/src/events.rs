//! Runtime events: `turn.started … tool.called, tool.completed | tool.failed
//! … turn.completed`, each with a trace id and span ids (GOONDAN_FACTS
//! "Events"). Events are handed to an [`EventSink`] by reference, so emitting
//! one copies nothing unless the sink decides to keep it.

use std::sync::Mutex;
use std::time::Duration;

use goondan_core::ids::format_span_id;
use goondan_core::{JsonValue, ToolStatus};
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

/// The name of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A turn began.
    TurnStarted,
    /// A turn ended normally.
    TurnCompleted,
    /// A turn ended in failure.
    TurnFailed,
    /// A step began.
    StepStarted,
    /// A step ended.
    StepCompleted,
    /// A tool call entered the pipeline.
    ToolCalled,
    /// A tool call ended with `ok` or `pending`.
    ToolCompleted,
    /// A tool call ended with `error`.
    ToolFailed,
}

impl EventKind {
    /// The wire name, e.g. `tool.called`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TurnStarted => "turn.started",
            Self::TurnCompleted => "turn.completed",
            Self::TurnFailed => "turn.failed",
            Self::StepStarted => "step.started",
            Self::StepCompleted => "step.completed",
            Self::ToolCalled => "tool.called",
            Self::ToolCompleted => "tool.completed",
            Self::ToolFailed => "tool.failed",
        }
    }
}

/// Per-tool-call details of an event.
#[derive(Debug, Clone, Copy)]
pub struct ToolEventData<'a> {
    /// The call's id.
    pub tool_call_id: &'a str,
    /// The tool's full name.
    pub tool_name: &'a str,
    /// The outcome (completion events only).
    pub status: Option<ToolStatus>,
    /// The error code (failure events only).
    pub error_code: Option<&'a str>,
    /// How long the call took (completion events only).
    pub duration: Option<Duration>,
}

/// One event, borrowed from the code that emits it.
#[derive(Debug, Clone, Copy)]
pub struct RuntimeEvent<'a> {
    /// What happened.
    pub kind: EventKind,
    /// The trace (32 hex digits).
    pub trace_id: &'a str,
    /// This event's span.
    pub span_id: u64,
    /// The enclosing span (tool → step → turn), as 16 hex digits.
    pub parent_span_id: Option<&'a str>,
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// The agent.
    pub agent_name: &'a str,
    /// The instance.
    pub instance_key: &'a str,
    /// The turn.
    pub turn_id: &'a str,
    /// The step, when inside one.
    pub step_id: Option<&'a str>,
    /// Tool details for `tool.*` events.
    pub tool: Option<ToolEventData<'a>>,
    /// Any other payload (step counts, token usage, …).
    pub extra: Option<&'a JsonValue>,
}

impl Serialize for RuntimeEvent<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("type", self.kind.as_str())?;
        map.serialize_entry("traceId", self.trace_id)?;
        map.serialize_entry("spanId", &format_span_id(self.span_id))?;
        if let Some(parent) = self.parent_span_id {
            map.serialize_entry("parentSpanId", parent)?;
        }
        map.serialize_entry("timestamp", &self.timestamp_ms)?;
        map.serialize_entry("agentName", self.agent_name)?;
        map.serialize_entry("instanceKey", self.instance_key)?;
        map.serialize_entry("turnId", self.turn_id)?;
        if let Some(step_id) = self.step_id {
            map.serialize_entry("stepId", step_id)?;
        }
        if let Some(tool) = &self.tool {
            map.serialize_entry("toolCallId", tool.tool_call_id)?;
            map.serialize_entry("toolName", tool.tool_name)?;
            if let Some(status) = tool.status {
                map.serialize_entry("status", status.as_str())?;
            }
            if let Some(code) = tool.error_code {
                map.serialize_entry("errorCode", code)?;
            }
            if let Some(duration) = tool.duration {
                map.serialize_entry("duration", &duration_ms(duration))?;
            }
        }
        if let Some(JsonValue::Object(extra)) = self.extra {
            for (key, value) in extra {
                map.serialize_entry(key, value)?;
            }
        }
        map.end()
    }
}

fn duration_ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Receives events.
pub trait EventSink: Send + Sync {
    /// Handles one event. Must not block for long: it runs on the call path.
    fn emit(&self, event: &RuntimeEvent<'_>);
}

/// Drops every event.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopEventSink;

impl EventSink for NoopEventSink {
    fn emit(&self, _event: &RuntimeEvent<'_>) {}
}

/// Writes each event to `tracing` at debug level under `goondan::events`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingEventSink;

impl EventSink for TracingEventSink {
    fn emit(&self, event: &RuntimeEvent<'_>) {
        if tracing::enabled!(target: "goondan::events", tracing::Level::DEBUG) {
            let json = serde_json::to_string(event).unwrap_or_default();
            tracing::debug!(target: "goondan::events", event = event.kind.as_str(), "{json}");
        }
    }
}

/// Keeps every event as JSON, for tests and for inspection.
#[derive(Debug, Default)]
pub struct MemoryEventSink {
    events: Mutex<Vec<JsonValue>>,
}

impl MemoryEventSink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// The events so far.
    pub fn events(&self) -> Vec<JsonValue> {
        self.events.lock().map(|events| events.clone()).unwrap_or_default()
    }
}

impl EventSink for MemoryEventSink {
    fn emit(&self, event: &RuntimeEvent<'_>) {
        let value = serde_json::to_value(event).unwrap_or(JsonValue::Null);
        if let Ok(mut events) = self.events.lock() {
            events.push(value);
        }
    }
}
