//! The original Goondan's runtime-event records, for the file its tools
//! read (`messages/runtime-events.jsonl`: `gdn logs --agent/--trace`, the
//! eval harness of `packages/eval`, its studio).
//!
//! Our events (the event log, `events.jsonl`) carry more than the
//! original's (`end`, the step's `model`, `sandboxRefused`, extensions'
//! events) and spell a few things differently (a timestamp in
//! milliseconds, `inputTokens`). This module writes one of our events as
//! the original's record (`@goondan/types`, `RuntimeEvent`): the same
//! trace, span and parent span ids (those of the OpenTelemetry spans), and
//! the original's field names and types:
//!
//! | ours | the original's record |
//! |---|---|
//! | `turn.started` | `turn.started`: `turnId` |
//! | `turn.completed` | `turn.completed`: `turnId`, `stepCount`, `duration`, `tokenUsage` |
//! | `turn.failed` | `turn.failed`: `turnId`, `duration`, `errorMessage` |
//! | `step.started` | `step.started`: `stepId`, `stepIndex`, `turnId` |
//! | `step.completed` | `step.completed`: `stepId`, `stepIndex`, `turnId`, `toolCallCount`, `duration`, `tokenUsage` (of the step's model call) |
//! | `step.completed` with an `error` | `step.failed`: `stepId`, `stepIndex`, `turnId`, `duration`, `errorMessage` |
//! | `tool.called` | `tool.called`: `toolCallId`, `toolName`, `stepId`, `turnId` |
//! | `tool.completed` (`ok` or `pending`) | `tool.completed`, `status: "ok"`, `duration` |
//! | `tool.failed` (an error result) | `tool.completed`, `status: "error"`, `duration` |
//! | an extension's event | nothing |
//!
//! Every record has `type`, `timestamp` (ISO 8601, `Date.toJSON`'s form),
//! `agentName`, `instanceKey`, `traceId`, `spanId` and, when there is one,
//! `parentSpanId`. A tool call that ended with an error result is the
//! original's `tool.completed` with `status: "error"`, as its executor
//! reports it; the original's `tool.failed` is a pipeline that threw, which
//! ours turns into an error result too.

use std::io::{self, Write};

use goondan_core::js_message::Rfc3339Millis;
use goondan_core::{JsonValue, ToolStatus};
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use super::{EventKind, RuntimeEvent, SpanHex, duration_ms};

/// Writes `event` as one line of the original's `runtime-events.jsonl`;
/// `false` (nothing written) for an event the original has no record for
/// (an extension's own).
pub fn write_record(event: &RuntimeEvent<'_>, out: &mut impl Write) -> io::Result<bool> {
    let Some(record) = Record::of(event) else { return Ok(false) };
    serde_json::to_writer(&mut *out, &record).map_err(io::Error::from)?;
    out.write_all(b"\n")?;
    Ok(true)
}

/// `event` as the original's record, serialized; `None` as for [`write_record`].
pub fn record_line(event: &RuntimeEvent<'_>) -> Option<String> {
    Record::of(event).and_then(|record| serde_json::to_string(&record).ok())
}

/// The original's record type of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Type {
    TurnStarted,
    TurnCompleted,
    TurnFailed,
    StepStarted,
    StepCompleted,
    StepFailed,
    ToolCalled,
    ToolCompleted,
}

impl Type {
    fn as_str(self) -> &'static str {
        match self {
            Self::TurnStarted => "turn.started",
            Self::TurnCompleted => "turn.completed",
            Self::TurnFailed => "turn.failed",
            Self::StepStarted => "step.started",
            Self::StepCompleted => "step.completed",
            Self::StepFailed => "step.failed",
            Self::ToolCalled => "tool.called",
            Self::ToolCompleted => "tool.completed",
        }
    }
}

/// One event seen as the original's record.
struct Record<'e, 'a> {
    kind: Type,
    event: &'e RuntimeEvent<'a>,
}

impl<'e, 'a> Record<'e, 'a> {
    fn of(event: &'e RuntimeEvent<'a>) -> Option<Self> {
        let kind = match event.kind {
            EventKind::TurnStarted => Type::TurnStarted,
            EventKind::TurnCompleted => Type::TurnCompleted,
            EventKind::TurnFailed => Type::TurnFailed,
            EventKind::StepStarted => Type::StepStarted,
            // A step whose layers, model call or commit failed says so in
            // its `error`: the original's step threw.
            EventKind::StepCompleted if field(event, "error").is_some() => Type::StepFailed,
            EventKind::StepCompleted => Type::StepCompleted,
            EventKind::ToolCalled => Type::ToolCalled,
            EventKind::ToolCompleted | EventKind::ToolFailed => Type::ToolCompleted,
            EventKind::Custom(_) => return None,
        };
        Some(Self { kind, event })
    }
}

/// A field of the event's payload.
fn field<'e>(event: &'e RuntimeEvent<'_>, key: &str) -> Option<&'e JsonValue> {
    event.extra.and_then(|extra| extra.get(key))
}

/// A count of the payload (`stepCount`, `stepIndex`), 0 when absent.
fn count(event: &RuntimeEvent<'_>, key: &str) -> u64 {
    field(event, key).and_then(JsonValue::as_u64).unwrap_or(0)
}

/// A duration of the payload in milliseconds, 0 when absent.
fn millis(event: &RuntimeEvent<'_>, key: &str) -> f64 {
    field(event, key).and_then(JsonValue::as_f64).unwrap_or(0.0)
}

/// The original's `TokenUsage` from our `inputTokens`/`outputTokens` (and
/// `totalTokens`, else their sum).
struct TokenUsage {
    prompt: u64,
    completion: u64,
    total: u64,
}

impl TokenUsage {
    fn from(usage: &JsonValue) -> Option<Self> {
        let prompt = usage.get("inputTokens").and_then(JsonValue::as_u64)?;
        let completion = usage.get("outputTokens").and_then(JsonValue::as_u64)?;
        let total = usage.get("totalTokens").and_then(JsonValue::as_u64).unwrap_or(prompt + completion);
        Some(Self { prompt, completion, total })
    }
}

impl Serialize for TokenUsage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("promptTokens", &self.prompt)?;
        map.serialize_entry("completionTokens", &self.completion)?;
        map.serialize_entry("totalTokens", &self.total)?;
        map.end()
    }
}

/// The failure's text: our `error` note, else the turn's `end`.
fn error_message<'e>(event: &'e RuntimeEvent<'_>) -> &'e str {
    field(event, "error").or_else(|| field(event, "end")).and_then(JsonValue::as_str).unwrap_or("failed")
}

impl Serialize for Record<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let event = self.event;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("type", self.kind.as_str())?;
        map.serialize_entry("timestamp", &Rfc3339Millis(event.timestamp_ms))?;
        map.serialize_entry("agentName", event.agent_name)?;
        map.serialize_entry("instanceKey", event.instance_key)?;
        map.serialize_entry("traceId", event.trace_id)?;
        map.serialize_entry("spanId", &SpanHex(event.span_id))?;
        if let Some(parent) = event.parent_span_id {
            map.serialize_entry("parentSpanId", parent)?;
        }
        let step_id = event.step_id.unwrap_or_default();
        match self.kind {
            Type::TurnStarted => map.serialize_entry("turnId", event.turn_id)?,
            Type::TurnCompleted => {
                map.serialize_entry("turnId", event.turn_id)?;
                map.serialize_entry("stepCount", &count(event, "stepCount"))?;
                map.serialize_entry("duration", &millis(event, "duration"))?;
                if let Some(usage) = field(event, "tokenUsage").and_then(TokenUsage::from) {
                    map.serialize_entry("tokenUsage", &usage)?;
                }
            }
            Type::TurnFailed => {
                map.serialize_entry("turnId", event.turn_id)?;
                map.serialize_entry("duration", &millis(event, "duration"))?;
                map.serialize_entry("errorMessage", error_message(event))?;
            }
            Type::StepStarted => {
                map.serialize_entry("stepId", step_id)?;
                map.serialize_entry("stepIndex", &count(event, "stepIndex"))?;
                map.serialize_entry("turnId", event.turn_id)?;
            }
            Type::StepCompleted => {
                map.serialize_entry("stepId", step_id)?;
                map.serialize_entry("stepIndex", &count(event, "stepIndex"))?;
                map.serialize_entry("turnId", event.turn_id)?;
                map.serialize_entry("toolCallCount", &count(event, "toolCalls"))?;
                map.serialize_entry("duration", &millis(event, "duration"))?;
                if let Some(usage) = field(event, "model").and_then(TokenUsage::from) {
                    map.serialize_entry("tokenUsage", &usage)?;
                }
            }
            Type::StepFailed => {
                map.serialize_entry("stepId", step_id)?;
                map.serialize_entry("stepIndex", &count(event, "stepIndex"))?;
                map.serialize_entry("turnId", event.turn_id)?;
                map.serialize_entry("duration", &millis(event, "duration"))?;
                map.serialize_entry("errorMessage", error_message(event))?;
            }
            Type::ToolCalled | Type::ToolCompleted => {
                let (call_id, name) = event.tool.map_or(("", ""), |tool| (&**tool.tool_call_id, &**tool.tool_name));
                map.serialize_entry("toolCallId", call_id)?;
                map.serialize_entry("toolName", name)?;
                if self.kind == Type::ToolCompleted {
                    let failed = event.kind == EventKind::ToolFailed
                        || event.tool.and_then(|tool| tool.status) == Some(ToolStatus::Error);
                    map.serialize_entry("status", if failed { "error" } else { "ok" })?;
                    let duration = event.tool.and_then(|tool| tool.duration).map_or(0.0, duration_ms);
                    map.serialize_entry("duration", &duration)?;
                }
                map.serialize_entry("stepId", step_id)?;
                map.serialize_entry("turnId", event.turn_id)?;
            }
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::context::CallScope;
    use crate::events::ToolEventData;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

    fn event<'a>(kind: EventKind<'a>, step: Option<&'a str>, extra: Option<&'a JsonValue>) -> RuntimeEvent<'a> {
        RuntimeEvent {
            kind,
            trace_id: TRACE,
            span_id: 0x00f0_67aa_0ba9_02b7,
            parent_span_id: step.map(|_| "a3ce929d0e0e4736"),
            // 2026-11-24T05:04:05.123Z
            timestamp_ms: 1_795_496_645_123,
            agent_name: "assistant",
            instance_key: "eval-test",
            turn_id: "turn-1",
            step_id: step,
            tool: None,
            extra,
            call_scope: None,
        }
    }

    fn record(event: &RuntimeEvent<'_>) -> JsonValue {
        let mut line = Vec::new();
        let written = write_record(event, &mut line).unwrap_or_else(|e| panic!("write: {e}"));
        assert!(written, "{:?} has a record", event.kind);
        assert_eq!(line.last(), Some(&b'\n'), "one line");
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1, "one line");
        assert_eq!(record_line(event).map(|l| l + "\n").as_deref().map(str::as_bytes), Some(&line[..]));
        serde_json::from_slice(&line).unwrap_or_else(|e| panic!("json: {e}"))
    }

    /// The base fields every record has, from the event.
    fn base(kind: &str) -> serde_json::Map<String, JsonValue> {
        let JsonValue::Object(map) = json!({
            "type": kind,
            "timestamp": "2026-11-24T05:04:05.123Z",
            "agentName": "assistant",
            "instanceKey": "eval-test",
            "traceId": TRACE,
            "spanId": "00f067aa0ba902b7",
        }) else {
            unreachable!()
        };
        map
    }

    fn with(mut map: serde_json::Map<String, JsonValue>, more: JsonValue) -> JsonValue {
        if let JsonValue::Object(more) = more {
            map.extend(more);
        }
        JsonValue::Object(map)
    }

    #[test]
    fn turn_records_have_the_originals_fields() {
        let started = record(&event(EventKind::TurnStarted, None, None));
        assert_eq!(started, with(base("turn.started"), json!({"turnId": "turn-1"})));

        let extra = json!({
            "stepCount": 2, "duration": 41.5, "end": "answered",
            "tokenUsage": {"inputTokens": 10, "outputTokens": 4, "totalTokens": 14},
        });
        let completed = record(&event(EventKind::TurnCompleted, None, Some(&extra)));
        assert_eq!(
            completed,
            with(
                base("turn.completed"),
                json!({
                    "turnId": "turn-1", "stepCount": 2, "duration": 41.5,
                    "tokenUsage": {"promptTokens": 10, "completionTokens": 4, "totalTokens": 14},
                })
            )
        );

        let extra = json!({"stepCount": 1, "duration": 3.0, "end": "modelFailed", "error": "HTTP 500 from the model"});
        let failed = record(&event(EventKind::TurnFailed, None, Some(&extra)));
        assert_eq!(
            failed,
            with(
                base("turn.failed"),
                json!({"turnId": "turn-1", "duration": 3.0, "errorMessage": "HTTP 500 from the model"})
            )
        );
        // Without a note, the end names the failure.
        let extra = json!({"stepCount": 0, "duration": 1.0, "end": "cancelled"});
        assert_eq!(record(&event(EventKind::TurnFailed, None, Some(&extra)))["errorMessage"], "cancelled");
    }

    #[test]
    fn a_continued_trace_keeps_its_parent_span() {
        let mut started = event(EventKind::TurnStarted, None, None);
        started.parent_span_id = Some("1111222233334444");
        assert_eq!(record(&started)["parentSpanId"], "1111222233334444");
        assert!(record(&event(EventKind::TurnStarted, None, None)).get("parentSpanId").is_none());
    }

    #[test]
    fn step_records_have_index_tool_calls_duration_and_the_model_calls_usage() {
        let extra = json!({"stepIndex": 1});
        let started = record(&event(EventKind::StepStarted, Some("step-2"), Some(&extra)));
        assert_eq!(
            started,
            with(
                base("step.started"),
                json!({"parentSpanId": "a3ce929d0e0e4736", "stepId": "step-2", "stepIndex": 1, "turnId": "turn-1"})
            )
        );

        let extra = json!({
            "stepIndex": 1, "toolCalls": 3, "duration": 12.25,
            "model": {"provider": "openai", "name": "m", "inputTokens": 7, "outputTokens": 2, "duration": 9.0},
        });
        let completed = record(&event(EventKind::StepCompleted, Some("step-2"), Some(&extra)));
        assert_eq!(
            completed,
            with(
                base("step.completed"),
                json!({
                    "parentSpanId": "a3ce929d0e0e4736", "stepId": "step-2", "stepIndex": 1, "turnId": "turn-1",
                    "toolCallCount": 3, "duration": 12.25,
                    "tokenUsage": {"promptTokens": 7, "completionTokens": 2, "totalTokens": 9},
                })
            )
        );

        let extra = json!({"stepIndex": 0, "toolCalls": 0, "duration": 2.0, "error": "the model failed: timeout"});
        let failed = record(&event(EventKind::StepCompleted, Some("step-1"), Some(&extra)));
        assert_eq!(
            failed,
            with(
                base("step.failed"),
                json!({
                    "parentSpanId": "a3ce929d0e0e4736", "stepId": "step-1", "stepIndex": 0, "turnId": "turn-1",
                    "duration": 2.0, "errorMessage": "the model failed: timeout",
                })
            )
        );
    }

    #[test]
    fn tool_records_say_ok_or_error_as_the_originals_executor_does() {
        let scope = Arc::new(CallScope {
            step_id: Arc::from("step-1"),
            step_span_id: Arc::from("a3ce929d0e0e4736"),
            ..CallScope::outside_step(
                Arc::from("assistant"),
                Arc::from("eval-test"),
                Arc::from("turn-1"),
                Arc::from(TRACE),
                Arc::from(Path::new("/tmp")),
            )
        });
        let id: Arc<str> = Arc::from("call_1");
        let name: Arc<str> = Arc::from("bash__exec");
        let data = |status, code, duration| ToolEventData {
            tool_call_id: &id,
            tool_name: &name,
            status,
            error_code: code,
            duration,
            sandbox_refused: None,
        };
        let at = 1_795_496_645_123;
        let tool_base = |kind: &str| {
            with(
                base(kind),
                json!({"parentSpanId": "a3ce929d0e0e4736", "toolCallId": "call_1", "toolName": "bash__exec",
                       "stepId": "step-1", "turnId": "turn-1"}),
            )
        };
        let called = record(&RuntimeEvent::tool(
            EventKind::ToolCalled,
            &scope,
            0x00f0_67aa_0ba9_02b7,
            at,
            data(None, None, None),
        ));
        assert_eq!(called, tool_base("tool.called"));

        let ok = Some(Duration::from_millis(250));
        for (kind, status, code, said) in [
            (EventKind::ToolCompleted, ToolStatus::Ok, None, "ok"),
            (EventKind::ToolCompleted, ToolStatus::Pending, None, "ok"),
            (EventKind::ToolFailed, ToolStatus::Error, Some("E_TOOL_TIMEOUT"), "error"),
        ] {
            let ended =
                record(&RuntimeEvent::tool(kind, &scope, 0x00f0_67aa_0ba9_02b7, at, data(Some(status), code, ok)));
            let mut expected = tool_base("tool.completed");
            if let Some(map) = expected.as_object_mut() {
                map.insert("status".to_owned(), json!(said));
                map.insert("duration".to_owned(), json!(250.0));
            }
            assert_eq!(ended, expected, "{status:?}");
        }
    }

    #[test]
    fn extensions_events_have_no_record() {
        let payload = json!({"a": 1});
        let custom = event(EventKind::Custom("memo.saved"), Some("step-1"), Some(&payload));
        let mut out = Vec::new();
        assert!(!write_record(&custom, &mut out).unwrap_or(true));
        assert!(out.is_empty());
        assert_eq!(record_line(&custom), None);
    }
}
