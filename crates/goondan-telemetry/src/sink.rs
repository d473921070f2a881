//! Spans from the runtime's events.
//!
//! [`TelemetrySink`] is one more [`EventSink`]: on the turn's path it only
//! copies the event into an owned record (strings of a tool event by
//! reference count) and offers it to the exporter's queue. The
//! [`Assembler`], on the export thread, pairs each `*.started`/`*.called`
//! event with its end into one span:
//!
//! | events | span (GenAI semantic conventions) |
//! |---|---|
//! | `turn.started` … `turn.completed`/`failed` | `invoke_agent {agent}`: `gen_ai.operation.name`, `gen_ai.agent.name`, `gen_ai.conversation.id`, usage |
//! | `step.started` … `step.completed` | `step {index}` (internal; the model call and the tools under it) |
//! | the `model` of `step.completed` | `chat {model}` (client): provider, request model, usage, finish reasons |
//! | `tool.called` … `tool.completed`/`failed` | `execute_tool {tool}`: `gen_ai.tool.name`, `gen_ai.tool.call.id` |
//!
//! A failure sets the span's status to error and `error.type`. Content
//! (tool-call arguments, model text) is added only with
//! `capture_content`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use goondan_core::ids::SpanIdGenerator;
use goondan_core::{JsonValue, Message, MessageData, ToolStatus};
use goondan_tools::events::{EventKind, EventSink, RuntimeEvent};

use crate::exporter::{Exporter, Item};
use crate::span::{AttrValue, SpanKind, SpanLink, SpanRecord, SpanStatus, parse_span_id, parse_trace_id};

/// An [`EventSink`] that exports the events' spans.
#[derive(Debug, Clone)]
pub struct TelemetrySink {
    exporter: Exporter,
}

impl TelemetrySink {
    /// A sink feeding `exporter`.
    pub fn new(exporter: Exporter) -> Self {
        Self { exporter }
    }

    /// The exporter it feeds.
    pub fn exporter(&self) -> &Exporter {
        &self.exporter
    }
}

impl EventSink for TelemetrySink {
    fn emit(&self, event: &RuntimeEvent<'_>) {
        let kind = match event.kind {
            EventKind::TurnStarted => Kind::TurnStarted,
            EventKind::TurnCompleted => Kind::TurnEnded { failed: false },
            EventKind::TurnFailed => Kind::TurnEnded { failed: true },
            EventKind::StepStarted => Kind::StepStarted,
            EventKind::StepCompleted => Kind::StepEnded,
            EventKind::ToolCalled => Kind::ToolCalled,
            EventKind::ToolCompleted | EventKind::ToolFailed => Kind::ToolEnded,
            EventKind::Custom(_) => return,
        };
        let record = EventRecord {
            kind,
            trace_id: Arc::from(event.trace_id),
            span_id: event.span_id,
            parent_span_id: event.parent_span_id.and_then(parse_span_id).unwrap_or(0),
            timestamp_ms: event.timestamp_ms,
            agent_name: event.call_scope.map_or_else(|| Arc::from(event.agent_name), |s| Arc::clone(&s.agent_name)),
            instance_key: event
                .call_scope
                .map_or_else(|| Arc::from(event.instance_key), |s| Arc::clone(&s.instance_key)),
            tool: event.tool.map(|tool| ToolRecord {
                call_id: Arc::clone(tool.tool_call_id),
                name: Arc::clone(tool.tool_name),
                status: tool.status,
                error_code: tool.error_code.map(str::to_owned),
                duration: tool.duration,
            }),
            // Only the turn and step ends carry what spans need (usage,
            // the model call); a tool event's is not copied.
            extra: match kind {
                Kind::TurnStarted | Kind::TurnEnded { .. } | Kind::StepEnded => event.extra.cloned(),
                _ => None,
            },
            message: event.call_scope.map(|scope| Arc::clone(&scope.message)),
        };
        self.exporter.offer(Item::Event(Box::new(record)));
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    TurnStarted,
    TurnEnded { failed: bool },
    StepStarted,
    StepEnded,
    ToolCalled,
    ToolEnded,
}

#[derive(Debug)]
pub(crate) struct ToolRecord {
    call_id: Arc<str>,
    name: Arc<str>,
    status: Option<ToolStatus>,
    error_code: Option<String>,
    duration: Option<Duration>,
}

/// An event, owned, on its way to the export thread.
#[derive(Debug)]
pub(crate) struct EventRecord {
    kind: Kind,
    trace_id: Arc<str>,
    span_id: u64,
    parent_span_id: u64,
    timestamp_ms: u64,
    agent_name: Arc<str>,
    instance_key: Arc<str>,
    tool: Option<ToolRecord>,
    extra: Option<JsonValue>,
    message: Option<Arc<Message>>,
}

/// A span begun and not yet ended.
struct Open {
    span: SpanRecord,
}

/// Pairs events into spans (on the export thread).
pub(crate) struct Assembler {
    open: HashMap<u64, Open>,
    capture_content: bool,
    span_ids: SpanIdGenerator,
}

/// Spans begun and never ended (a process that died mid-turn) are
/// forgotten past this many, oldest first, so memory stays bounded.
const MAX_OPEN: usize = 4096;

const MS: u64 = 1_000_000;

impl Assembler {
    pub(crate) fn new(capture_content: bool) -> Self {
        Self { open: HashMap::new(), capture_content, span_ids: SpanIdGenerator::new() }
    }

    /// Takes one event; ended spans go to `out`.
    pub(crate) fn push(&mut self, event: EventRecord, out: &mut Vec<SpanRecord>) {
        let Some(trace_id) = parse_trace_id(&event.trace_id) else { return };
        match event.kind {
            Kind::TurnStarted => {
                let mut span = self.begin(&event, trace_id, format!("invoke_agent {}", event.agent_name));
                span.attributes.extend([
                    ("gen_ai.operation.name", AttrValue::from("invoke_agent")),
                    ("gen_ai.agent.name", AttrValue::from(&*event.agent_name)),
                    ("gen_ai.conversation.id", AttrValue::Str(format!("{}@{}", event.agent_name, event.instance_key))),
                    ("goondan.instance_key", AttrValue::from(&*event.instance_key)),
                ]);
                if let Some(link) = event.extra.as_ref().and_then(|e| e.get("link")).and_then(link_of) {
                    span.links.push(link);
                }
                self.open(span);
            }
            Kind::TurnEnded { failed } => {
                let Some(mut span) = self.close(event.span_id, event.timestamp_ms) else { return };
                if let Some(extra) = &event.extra {
                    if let Some(usage) = extra.get("tokenUsage") {
                        usage_attributes(&mut span, usage);
                    }
                    if let Some(steps) = extra.get("stepCount").and_then(JsonValue::as_i64) {
                        span.attributes.push(("goondan.turn.steps", AttrValue::Int(steps)));
                    }
                    let end = extra.get("end").and_then(JsonValue::as_str).unwrap_or("failed");
                    span.attributes.push(("goondan.turn.end", AttrValue::from(end)));
                    if failed {
                        span.attributes.push(("error.type", AttrValue::from(end)));
                        let note = extra.get("error").and_then(JsonValue::as_str).unwrap_or(end);
                        span.status = SpanStatus::Error(note.to_owned());
                    }
                }
                out.push(span);
            }
            Kind::StepStarted => {
                let span = self.begin(&event, trace_id, "step".to_owned());
                self.open(span);
            }
            Kind::StepEnded => {
                let Some(mut span) = self.close(event.span_id, event.timestamp_ms) else { return };
                let extra = event.extra.as_ref();
                if let Some(index) = extra.and_then(|e| e.get("stepIndex")).and_then(JsonValue::as_i64) {
                    span.name = format!("step {index}");
                    span.attributes.push(("goondan.step.index", AttrValue::Int(index)));
                }
                if let Some(model) = extra.and_then(|e| e.get("model")) {
                    out.push(self.chat_span(&span, &event.agent_name, model));
                }
                out.push(span);
            }
            Kind::ToolCalled => {
                let Some(tool) = &event.tool else { return };
                let mut span = self.begin(&event, trace_id, format!("execute_tool {}", tool.name));
                span.attributes.extend([
                    ("gen_ai.operation.name", AttrValue::from("execute_tool")),
                    ("gen_ai.tool.name", AttrValue::from(&*tool.name)),
                    ("gen_ai.tool.call.id", AttrValue::from(&*tool.call_id)),
                    ("gen_ai.tool.type", AttrValue::from("function")),
                    ("gen_ai.agent.name", AttrValue::from(&*event.agent_name)),
                ]);
                if self.capture_content
                    && let Some(arguments) = event.message.as_deref().and_then(|m| arguments_of(m, &tool.call_id))
                {
                    span.attributes.push(("gen_ai.tool.call.arguments", AttrValue::Str(arguments)));
                }
                self.open(span);
            }
            Kind::ToolEnded => {
                let Some(tool) = &event.tool else { return };
                let Some(open) = self.open.remove(&event.span_id) else { return };
                let mut span = open.span;
                span.end_ns = match tool.duration {
                    Some(duration) => span.start_ns + u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX / 2),
                    None => event.timestamp_ms * MS,
                };
                if let Some(status) = tool.status {
                    span.attributes.push(("goondan.tool.status", AttrValue::from(status.as_str())));
                }
                if tool.status == Some(ToolStatus::Error) {
                    let code = tool.error_code.clone().unwrap_or_else(|| "E_TOOL".to_owned());
                    span.attributes.push(("error.type", AttrValue::Str(code.clone())));
                    span.status = SpanStatus::Error(code);
                }
                out.push(span);
            }
        }
    }

    fn begin(&self, event: &EventRecord, trace_id: [u8; 16], name: String) -> SpanRecord {
        SpanRecord {
            trace_id,
            span_id: event.span_id,
            parent_span_id: event.parent_span_id,
            name,
            kind: SpanKind::Internal,
            start_ns: event.timestamp_ms * MS,
            end_ns: event.timestamp_ms * MS,
            attributes: Vec::new(),
            status: SpanStatus::Unset,
            links: Vec::new(),
        }
    }

    fn open(&mut self, span: SpanRecord) {
        if self.open.len() >= MAX_OPEN {
            // The older half goes at once, so a process that keeps losing
            // end events (a full queue) pays one scan per MAX_OPEN / 2
            // spans, not one per span.
            let mut starts: Vec<u64> = self.open.values().map(|open| open.span.start_ns).collect();
            let middle = starts.len() / 2;
            let (_, cut, _) = starts.select_nth_unstable(middle);
            let cut = *cut;
            self.open.retain(|_, open| open.span.start_ns > cut);
        }
        self.open.insert(span.span_id, Open { span });
    }

    fn close(&mut self, span_id: u64, timestamp_ms: u64) -> Option<SpanRecord> {
        let mut span = self.open.remove(&span_id)?.span;
        span.end_ns = (timestamp_ms * MS).max(span.start_ns);
        Some(span)
    }

    /// The model call of a step, from `step.completed`'s `model`:
    /// `{provider, name, started (ms), duration (ms), inputTokens,
    /// outputTokens, finishReason, error, errorType}`.
    fn chat_span(&self, step: &SpanRecord, agent: &str, model: &JsonValue) -> SpanRecord {
        let text = |key: &str| model.get(key).and_then(JsonValue::as_str).unwrap_or_default();
        let name = text("name");
        let started_ms = model.get("started").and_then(JsonValue::as_u64).unwrap_or(step.start_ns / MS);
        let duration_ms = model.get("duration").and_then(JsonValue::as_f64).unwrap_or(0.0).max(0.0);
        let start_ns = started_ms * MS;
        let mut span = SpanRecord {
            trace_id: step.trace_id,
            span_id: self.span_ids.next_raw(),
            parent_span_id: step.span_id,
            name: if name.is_empty() { "chat".to_owned() } else { format!("chat {name}") },
            kind: SpanKind::Client,
            start_ns,
            end_ns: start_ns + (duration_ms * MS as f64) as u64,
            attributes: vec![
                ("gen_ai.operation.name", AttrValue::from("chat")),
                ("gen_ai.provider.name", AttrValue::from(text("provider"))),
                ("gen_ai.request.model", AttrValue::from(name)),
                ("gen_ai.agent.name", AttrValue::from(agent)),
            ],
            status: SpanStatus::Unset,
            links: Vec::new(),
        };
        usage_attributes(&mut span, model);
        let reason = text("finishReason");
        if !reason.is_empty() {
            span.attributes.push(("gen_ai.response.finish_reasons", AttrValue::StrList(vec![reason.to_owned()])));
        }
        let error = text("error");
        if !error.is_empty() {
            span.attributes.push(("error.type", AttrValue::from(text("errorType"))));
            span.status = SpanStatus::Error(error.to_owned());
        }
        span
    }
}

fn usage_attributes(span: &mut SpanRecord, usage: &JsonValue) {
    for (key, attribute) in
        [("inputTokens", "gen_ai.usage.input_tokens"), ("outputTokens", "gen_ai.usage.output_tokens")]
    {
        if let Some(count) = usage.get(key).and_then(JsonValue::as_i64) {
            span.attributes.push((attribute, AttrValue::Int(count)));
        }
    }
}

fn link_of(value: &JsonValue) -> Option<SpanLink> {
    let trace_id = parse_trace_id(value.get("traceId")?.as_str()?)?;
    let span_id = parse_span_id(value.get("spanId")?.as_str()?)?;
    Some(SpanLink { trace_id, span_id })
}

/// The arguments of call `id` in the assistant message, as JSON text.
fn arguments_of(message: &Message, id: &str) -> Option<String> {
    let MessageData::Assistant { tool_calls, .. } = &message.data else { return None };
    let call = tool_calls.iter().find(|call| &*call.id == id)?;
    serde_json::to_string(&call.args).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(span_id: u64, timestamp_ms: u64) -> EventRecord {
        EventRecord {
            kind: Kind::TurnStarted,
            trace_id: Arc::from("4bf92f3577b34da6a3ce929d0e0e4736"),
            span_id,
            parent_span_id: 0,
            timestamp_ms,
            agent_name: Arc::from("a"),
            instance_key: Arc::from("k"),
            tool: None,
            extra: None,
            message: None,
        }
    }

    #[test]
    fn spans_that_never_end_are_forgotten_oldest_first_within_a_bound() {
        let mut assembler = Assembler::new(false);
        let mut out = Vec::new();
        for id in 1..=(MAX_OPEN as u64 * 3) {
            assembler.push(started(id, id), &mut out);
            assert!(assembler.open.len() <= MAX_OPEN);
        }
        assert!(out.is_empty());
        assert!(assembler.open.contains_key(&(MAX_OPEN as u64 * 3)), "the newest is kept");
        assert!(!assembler.open.contains_key(&1), "the oldest is gone");
    }
}
