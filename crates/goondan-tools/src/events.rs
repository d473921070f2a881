//! Runtime events: `turn.started … tool.called, tool.completed | tool.failed
//! … turn.completed`, each with a trace id and span ids (GOONDAN_FACTS
//! "Events"). Events are handed to an [`EventSink`] by reference, so emitting
//! one copies nothing unless the sink decides to keep it.

use goondan_core::sync::LockUnpoisoned;
use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use goondan_core::{JsonValue, ToolStatus};
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use tokio::sync::oneshot;

use crate::context::CallScope;
use crate::pipeline::BoxFuture;

pub mod original;

/// The name of an event: one of the runtime's kinds, or an extension's own.
///
/// The built-in kinds carry no data, so emitting one stays a copy of a small
/// value; an extension's kind borrows its name from the emitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind<'a> {
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
    /// An extension's event (`api.events.emit('my.thing', payload)`), named
    /// as emitted; its payload travels in [`RuntimeEvent::extra`]. Sinks do
    /// not check the name: the emitter validates it.
    Custom(&'a str),
}

impl EventKind<'static> {
    /// Every built-in kind (all but [`EventKind::Custom`]).
    pub const ALL: [EventKind<'static>; 8] = [
        Self::TurnStarted,
        Self::TurnCompleted,
        Self::TurnFailed,
        Self::StepStarted,
        Self::StepCompleted,
        Self::ToolCalled,
        Self::ToolCompleted,
        Self::ToolFailed,
    ];
}

impl<'a> EventKind<'a> {
    /// The wire name, e.g. `tool.called`, or an extension's event name.
    pub fn as_str(self) -> &'a str {
        match self {
            Self::TurnStarted => "turn.started",
            Self::TurnCompleted => "turn.completed",
            Self::TurnFailed => "turn.failed",
            Self::StepStarted => "step.started",
            Self::StepCompleted => "step.completed",
            Self::ToolCalled => "tool.called",
            Self::ToolCompleted => "tool.completed",
            Self::ToolFailed => "tool.failed",
            Self::Custom(name) => name,
        }
    }

    /// True for an extension's event.
    pub fn is_custom(self) -> bool {
        matches!(self, Self::Custom(_))
    }

    /// The kind without its borrow, so a sink can keep it; `None` for a
    /// custom kind, whose name is borrowed.
    fn builtin(self) -> Option<EventKind<'static>> {
        match self {
            Self::TurnStarted => Some(EventKind::TurnStarted),
            Self::TurnCompleted => Some(EventKind::TurnCompleted),
            Self::TurnFailed => Some(EventKind::TurnFailed),
            Self::StepStarted => Some(EventKind::StepStarted),
            Self::StepCompleted => Some(EventKind::StepCompleted),
            Self::ToolCalled => Some(EventKind::ToolCalled),
            Self::ToolCompleted => Some(EventKind::ToolCompleted),
            Self::ToolFailed => Some(EventKind::ToolFailed),
            Self::Custom(_) => None,
        }
    }
}

/// Per-tool-call details of an event.
#[derive(Debug, Clone, Copy)]
pub struct ToolEventData<'a> {
    /// The call's id (shared, so a sink can keep it without copying).
    pub tool_call_id: &'a Arc<str>,
    /// The tool's full name.
    pub tool_name: &'a Arc<str>,
    /// The outcome (completion events only).
    pub status: Option<ToolStatus>,
    /// The error code (failure events only).
    pub error_code: Option<&'a str>,
    /// How long the call took (completion events only).
    pub duration: Option<Duration>,
    /// The sandbox policy that refused part of the call, when its result
    /// says so (a top-level `sandbox` object naming the `policy`, as `bash`
    /// gives: completion events only).
    pub sandbox_refused: Option<&'static str>,
}

/// One event, borrowed from the code that emits it.
#[derive(Debug, Clone, Copy)]
pub struct RuntimeEvent<'a> {
    /// What happened.
    pub kind: EventKind<'a>,
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
    /// Any other payload (step counts, token usage, an extension's payload):
    /// an object's fields are written beside the event's own fields (which
    /// win over a field of the same name); any other value is written as
    /// `payload`.
    pub extra: Option<&'a JsonValue>,
    /// The scope of the step, when the event belongs to a tool call: lets a
    /// sink keep the event's context with one reference count instead of
    /// copying every string.
    pub call_scope: Option<&'a Arc<CallScope>>,
}

impl<'a> RuntimeEvent<'a> {
    /// A `tool.*` event of a call made in `scope`: the trace, agent, instance,
    /// turn and step come from the scope, and the parent span is the step's.
    pub fn tool(
        kind: EventKind<'a>,
        scope: &'a Arc<CallScope>,
        span_id: u64,
        timestamp_ms: u64,
        data: ToolEventData<'a>,
    ) -> Self {
        Self { tool: Some(data), ..Self::in_step(kind, scope, span_id, timestamp_ms) }
    }

    /// An extension's event `name` with `payload`, emitted while the calls of
    /// `scope` run (from toolCall middleware or a handler): the trace, agent,
    /// instance, turn and step come from the scope, and the parent span is
    /// the step's. Events outside a step are built field by field, as the
    /// turn loop does.
    pub fn custom(
        name: &'a str,
        payload: &'a JsonValue,
        scope: &'a Arc<CallScope>,
        span_id: u64,
        timestamp_ms: u64,
    ) -> Self {
        Self { extra: Some(payload), ..Self::in_step(EventKind::Custom(name), scope, span_id, timestamp_ms) }
    }

    /// An event of `kind` in the step of `scope`, with neither tool data
    /// nor a payload.
    fn in_step(kind: EventKind<'a>, scope: &'a Arc<CallScope>, span_id: u64, timestamp_ms: u64) -> Self {
        Self {
            kind,
            trace_id: &scope.trace_id,
            span_id,
            parent_span_id: Some(&scope.step_span_id),
            timestamp_ms,
            agent_name: &scope.agent_name,
            instance_key: &scope.instance_key,
            turn_id: &scope.turn_id,
            step_id: Some(&scope.step_id),
            tool: None,
            extra: None,
            call_scope: Some(scope),
        }
    }
}

impl Serialize for RuntimeEvent<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("type", self.kind.as_str())?;
        map.serialize_entry("traceId", self.trace_id)?;
        map.serialize_entry("spanId", &SpanHex(self.span_id))?;
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
            map.serialize_entry("toolCallId", tool.tool_call_id.as_ref())?;
            map.serialize_entry("toolName", tool.tool_name.as_ref())?;
            if let Some(status) = tool.status {
                map.serialize_entry("status", status.as_str())?;
            }
            if let Some(code) = tool.error_code {
                map.serialize_entry("errorCode", code)?;
            }
            if let Some(duration) = tool.duration {
                map.serialize_entry("duration", &duration_ms(duration))?;
            }
            if let Some(policy) = tool.sandbox_refused {
                map.serialize_entry("sandboxRefused", policy)?;
            }
        }
        match self.extra {
            Some(JsonValue::Object(extra)) => {
                for (key, value) in extra {
                    // An extension's payload must not forge the event's own
                    // fields: a reader keeping the last of duplicate keys
                    // would see its `type` or `traceId` instead.
                    if !self.writes_field(key) {
                        map.serialize_entry(key, value)?;
                    }
                }
            }
            Some(other) => map.serialize_entry("payload", other)?,
            None => {}
        }
        map.end()
    }
}

impl RuntimeEvent<'_> {
    /// Whether the event writes `key` itself (so its `extra` must not).
    fn writes_field(&self, key: &str) -> bool {
        const OWN: [&str; 9] =
            ["type", "traceId", "spanId", "parentSpanId", "timestamp", "agentName", "instanceKey", "turnId", "stepId"];
        const TOOL: [&str; 5] = ["toolCallId", "toolName", "status", "errorCode", "duration"];
        OWN.contains(&key) || (self.tool.is_some() && TOOL.contains(&key))
    }
}

/// A span id written as 16 lowercase hex digits without allocating.
struct SpanHex(u64);

impl Serialize for SpanHex {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut buffer = [0_u8; 16];
        for (index, byte) in buffer.iter_mut().enumerate() {
            let shift = (15 - index) * 4;
            *byte = DIGITS[((self.0 >> shift) & 0xf) as usize];
        }
        serializer.serialize_str(std::str::from_utf8(&buffer).unwrap_or("0000000000000000"))
    }
}

fn duration_ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Receives events.
pub trait EventSink: Send + Sync {
    /// Handles one event. Must not block for long: it runs on the call path.
    fn emit(&self, event: &RuntimeEvent<'_>);

    /// False when the sink drops everything, so callers can skip building events.
    fn enabled(&self) -> bool {
        true
    }

    /// Makes every event emitted so far durable before returning. It blocks
    /// the calling thread: async code awaits [`EventSink::flushed`] instead.
    /// Sinks that keep nothing do nothing.
    fn flush(&self) {}

    /// A future that resolves once every event emitted before this call is
    /// durable (written and flushed; synced, for the instance's event log),
    /// without blocking the thread that awaits it: the turn loop awaits it at
    /// step boundaries on a runtime thread shared with other tasks. It also
    /// resolves if the sink can no longer write, so it never hangs. The
    /// default, for sinks that keep nothing, is ready at once; a sink that
    /// implements [`EventSink::flush`] implements this too.
    fn flushed(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::ready(()))
    }
}

/// Drops every event.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopEventSink;

impl EventSink for NoopEventSink {
    fn emit(&self, _event: &RuntimeEvent<'_>) {}

    fn enabled(&self) -> bool {
        false
    }
}

/// Hands every event to several sinks (e.g. the event log and `tracing`).
pub struct FanoutEventSink {
    sinks: Vec<Arc<dyn EventSink>>,
}

impl std::fmt::Debug for FanoutEventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanoutEventSink").field("sinks", &self.sinks.len()).finish()
    }
}

impl FanoutEventSink {
    /// A sink feeding each of `sinks`, skipping those that are not enabled.
    pub fn new(sinks: Vec<Arc<dyn EventSink>>) -> Self {
        Self { sinks: sinks.into_iter().filter(|sink| sink.enabled()).collect() }
    }
}

impl EventSink for FanoutEventSink {
    fn emit(&self, event: &RuntimeEvent<'_>) {
        for sink in &self.sinks {
            sink.emit(event);
        }
    }

    fn enabled(&self) -> bool {
        !self.sinks.is_empty()
    }

    fn flush(&self) {
        for sink in &self.sinks {
            sink.flush();
        }
    }

    fn flushed(&self) -> BoxFuture<'static, ()> {
        // Every sink's goal is taken now, so the events emitted before this
        // call are covered whatever happens while the futures are awaited.
        let pending: Vec<_> = self.sinks.iter().map(|sink| sink.flushed()).collect();
        Box::pin(async move {
            for flushed in pending {
                flushed.await;
            }
        })
    }
}

/// Writes each event to `tracing` at debug level under `goondan::events`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingEventSink;

impl EventSink for TracingEventSink {
    fn enabled(&self) -> bool {
        tracing::enabled!(target: "goondan::events", tracing::Level::DEBUG)
    }

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

/// Writes every event as one JSON line to a writer (a file, a socket),
/// serializing on a background thread.
///
/// The call path only moves an owned copy of a tool event into a queue under
/// a short lock: the call's scope, id and tool name by reference count, the
/// rest by value. Nothing is serialized there, and nothing is allocated but
/// an error code (the queue keeps its capacity from batch to batch). A
/// hand-made binary encoding of the events was measured against this and
/// saved nothing (docs/BENCHMARKS.md, "Event log encoder"). Other events —
/// turn and step boundaries, extensions' events — are rare and are
/// serialized by `emit`, outside the lock. The writer sleeps while the queue
/// is empty; woken by a batch's first event, it drains the queue
/// [`JsonLinesEventSink::FLUSH_INTERVAL`] later, as soon as a batch has gathered,
/// on a flush ([`EventSink::flush`] waits for it, [`EventSink::flushed`]
/// returns a future of it), and when the sink is dropped. When the queue is
/// full, `emit` waits for the writer rather than drop an event.
pub struct JsonLinesEventSink {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    capacity_bytes: usize,
    /// The writer also writes each event as the original's record
    /// ([`original`]) to a second output.
    exporting: bool,
}

impl std::fmt::Debug for JsonLinesEventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonLinesEventSink").finish_non_exhaustive()
    }
}

struct Shared {
    state: Mutex<Queue>,
    /// Wakes the writer: a batch is ready, a flush is wanted, or the sink closed.
    wake_writer: Condvar,
    /// Wakes producers waiting for room, and callers of `flush`.
    progress: Condvar,
}

/// Events waiting for the writer.
#[derive(Default)]
struct Queue {
    events: Vec<Queued>,
    /// What `events` holds, in bytes (see [`Queued::size`]): the queue's
    /// bound and batch size are in bytes, whatever the events are.
    bytes: usize,
    /// The sink was dropped, or the writer is gone: nothing more is written.
    closed: bool,
    /// Flushes asked for so far; a flush's goal is the count after its request.
    flush_requested: u64,
    /// Goal of the last flush the writer completed.
    flushed: u64,
    /// Futures of [`EventSink::flushed`] waiting for their goal, in goal order.
    flush_waiters: Vec<(u64, oneshot::Sender<()>)>,
}

/// One event waiting for the writer.
enum Queued {
    /// A `tool.*` event of a call, serialized by the writer.
    Tool(ToolRecord),
    /// Any other event, already serialized; with its record for the
    /// export, when the sink exports and the original has one.
    Line(String, Option<String>),
}

/// An owned `tool.*` event: what [`RuntimeEvent::tool`] needs to rebuild it.
struct ToolRecord {
    kind: EventKind<'static>,
    scope: Arc<CallScope>,
    span_id: u64,
    timestamp_ms: u64,
    tool_call_id: Arc<str>,
    tool_name: Arc<str>,
    status: Option<ToolStatus>,
    error_code: Option<String>,
    duration: Option<Duration>,
    sandbox_refused: Option<&'static str>,
}

impl Queued {
    /// What the event holds on its own (shared strings are not counted).
    fn size(&self) -> usize {
        std::mem::size_of::<Self>()
            + match self {
                Self::Tool(record) => record.error_code.as_ref().map_or(0, String::len),
                Self::Line(line, export) => line.len() + export.as_ref().map_or(0, String::len),
            }
    }

    /// Writes the event as one JSON line to `out`, and its record to
    /// `export` (when there is one; its errors are returned apart, since
    /// the export must never stop the event log).
    fn write(&self, out: &mut impl Write, export: Option<&mut impl Write>) -> (io::Result<()>, io::Result<()>) {
        match self {
            Self::Tool(record) => {
                let data = ToolEventData {
                    tool_call_id: &record.tool_call_id,
                    tool_name: &record.tool_name,
                    status: record.status,
                    error_code: record.error_code.as_deref(),
                    duration: record.duration,
                    sandbox_refused: record.sandbox_refused,
                };
                let event = RuntimeEvent::tool(record.kind, &record.scope, record.span_id, record.timestamp_ms, data);
                let written = serde_json::to_writer(&mut *out, &event)
                    .map_err(io::Error::from)
                    .and_then(|()| out.write_all(b"\n"));
                let exported = export.map_or(Ok(()), |export| original::write_record(&event, export).map(drop));
                (written, exported)
            }
            Self::Line(line, record) => {
                let written = out.write_all(line.as_bytes()).and_then(|()| out.write_all(b"\n"));
                let exported = match (export, record) {
                    (Some(export), Some(record)) => {
                        export.write_all(record.as_bytes()).and_then(|()| export.write_all(b"\n"))
                    }
                    _ => Ok(()),
                };
                (written, exported)
            }
        }
    }
}

impl JsonLinesEventSink {
    /// The longest an event waits in the queue when nothing else wakes the writer.
    pub const FLUSH_INTERVAL: Duration = Duration::from_millis(25);
    /// Queued bytes that wake the writer early.
    const BATCH_BYTES: usize = 64 * 1024;
    /// Queued bytes at which `emit` waits for the writer.
    const CAPACITY_BYTES: usize = 16 * 1024 * 1024;

    /// A sink writing to `out` from a new background thread.
    pub fn new(out: impl Write + Send + 'static) -> io::Result<Self> {
        Self::with_capacity(out, Self::CAPACITY_BYTES)
    }

    /// Like [`JsonLinesEventSink::new`], with `capacity_bytes` of queue
    /// before `emit` waits for the writer.
    pub fn with_capacity(out: impl Write + Send + 'static, capacity_bytes: usize) -> io::Result<Self> {
        Self::start(out, None, capacity_bytes)
    }

    /// Like [`JsonLinesEventSink::new`], and each event the original Goondan
    /// has a record for is also written to `export` as that record
    /// ([`original`]: its `messages/runtime-events.jsonl`), by the same
    /// thread, in the same order. The export is flushed with the events
    /// (its own `flush`: nothing is synced to disk for it); an error
    /// writing it is logged once, ends the export, and never stops the
    /// event log.
    pub fn with_export(out: impl Write + Send + 'static, export: impl Write + Send + 'static) -> io::Result<Self> {
        Self::start(out, Some(Box::new(export)), Self::CAPACITY_BYTES)
    }

    fn start(
        out: impl Write + Send + 'static,
        export: Option<Box<dyn Write + Send>>,
        capacity_bytes: usize,
    ) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(Queue::default()),
            wake_writer: Condvar::new(),
            progress: Condvar::new(),
        });
        let writer_shared = Arc::clone(&shared);
        let exporting = export.is_some();
        let writer = std::thread::Builder::new().name("goondan-events".to_owned()).spawn(move || {
            run_writer(&writer_shared, io::BufWriter::new(out), export.map(io::BufWriter::new));
        })?;
        Ok(Self { shared, writer: Some(writer), capacity_bytes, exporting })
    }

    /// Waits until every event emitted so far is written and flushed (and,
    /// with a syncing writer such as the instance's event log, synced).
    /// Blocks the thread: async code awaits [`EventSink::flushed`].
    pub fn flush_and_wait(&self) {
        let Ok(mut state) = self.shared.state.lock() else { return };
        state.flush_requested += 1;
        let wanted = state.flush_requested;
        self.shared.wake_writer.notify_one();
        while state.flushed < wanted && !state.closed {
            state = match self.shared.progress.wait(state) {
                Ok(state) => state,
                Err(_) => return,
            };
        }
    }

    /// Locks the queue once there is room in it; `None` once nothing will
    /// be written any more (the writer is gone), so events are not queued
    /// without bound.
    fn queue_with_room(&self) -> Option<std::sync::MutexGuard<'_, Queue>> {
        let mut state = self.shared.state.lock().ok()?;
        while state.bytes >= self.capacity_bytes && !state.closed {
            self.shared.wake_writer.notify_one();
            state = self.shared.progress.wait(state).ok()?;
        }
        (!state.closed).then_some(state)
    }
}

impl EventSink for JsonLinesEventSink {
    fn flush(&self) {
        self.flush_and_wait();
    }

    fn flushed(&self) -> BoxFuture<'static, ()> {
        let (done, finished) = oneshot::channel();
        if let Ok(mut state) = self.shared.state.lock()
            && !state.closed
        {
            state.flush_requested += 1;
            let goal = state.flush_requested;
            state.flush_waiters.push((goal, done));
            self.shared.wake_writer.notify_one();
        }
        // Otherwise `done` is dropped here and the future is ready at once. A
        // sender dropped by a writer that is gone resolves it too.
        Box::pin(async move {
            let _ = finished.await;
        })
    }

    fn emit(&self, event: &RuntimeEvent<'_>) {
        // Only the tool events of a call (two per call, built-in kinds, no
        // payload) are kept as records; the rest are serialized here,
        // outside the lock.
        let queued = match (event.kind.builtin(), event.call_scope, &event.tool, event.extra) {
            (Some(kind), Some(scope), Some(tool), None) => Queued::Tool(ToolRecord {
                kind,
                scope: Arc::clone(scope),
                span_id: event.span_id,
                timestamp_ms: event.timestamp_ms,
                tool_call_id: Arc::clone(tool.tool_call_id),
                tool_name: Arc::clone(tool.tool_name),
                status: tool.status,
                error_code: tool.error_code.map(str::to_owned),
                duration: tool.duration,
                sandbox_refused: tool.sandbox_refused,
            }),
            _ => match serde_json::to_string(event) {
                Ok(line) => Queued::Line(line, if self.exporting { original::record_line(event) } else { None }),
                Err(error) => {
                    tracing::warn!(target: "goondan::events", "cannot serialize an event: {error}");
                    return;
                }
            },
        };
        let size = queued.size();
        let Some(mut queue) = self.queue_with_room() else { return };
        let before = queue.bytes;
        let first = queue.events.is_empty();
        queue.bytes += size;
        queue.events.push(queued);
        // Two wake-ups per batch at most, not one per event: its first
        // event (the writer sleeps while the queue is empty) and a full batch.
        let batch = Self::BATCH_BYTES.min(self.capacity_bytes / 2);
        if first || (before < batch && queue.bytes >= batch) {
            self.shared.wake_writer.notify_one();
        }
    }
}

impl Drop for JsonLinesEventSink {
    fn drop(&mut self) {
        if let Ok(mut state) = self.shared.state.lock() {
            state.closed = true;
        }
        self.shared.wake_writer.notify_one();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// Marks the queue closed when the writer thread ends, however it ends (a
/// panic in the output's `Write`, a poisoned lock), and releases everyone
/// waiting on it: a flush must never wait for a writer that is gone.
struct WriterExit<'a>(&'a Shared);

impl Drop for WriterExit<'_> {
    fn drop(&mut self) {
        let waiters = {
            // A poisoned lock still guards a usable queue for this.
            let mut state = self.0.state.lock_unpoisoned();
            state.closed = true;
            std::mem::take(&mut state.flush_waiters)
        };
        // Dropping a sender resolves its future.
        drop(waiters);
        self.0.progress.notify_all();
    }
}

fn run_writer(shared: &Shared, mut out: io::BufWriter<impl Write>, mut export: Option<io::BufWriter<impl Write>>) {
    let _exit = WriterExit(shared);
    let mut failed = false;
    let mut events = Vec::new();
    let mut done = Vec::new();
    loop {
        let (flush_goal, closed) = {
            let Ok(mut state) = shared.state.lock() else { return };
            // Nothing to do: sleep until an event, a flush or the end. An
            // idle agent's writer does not wake at all (a thousand idle
            // instances on a host must not keep a core busy).
            while state.events.is_empty() && !state.closed && state.flush_requested == state.flushed {
                state = match shared.wake_writer.wait(state) {
                    Ok(state) => state,
                    Err(_) => return,
                };
            }
            // The first event of a batch woke it: gather for up to the
            // interval (a full batch, a flush or the end cuts it short).
            if !state.closed && state.flush_requested == state.flushed {
                state = match shared.wake_writer.wait_timeout(state, JsonLinesEventSink::FLUSH_INTERVAL) {
                    Ok((state, _)) => state,
                    Err(_) => return,
                };
            }
            // Swap buffers: the producers keep the capacity of the last batch.
            std::mem::swap(&mut events, &mut state.events);
            state.bytes = 0;
            (state.flush_requested, state.closed)
        };
        // Room was made: let waiting producers go on.
        shared.progress.notify_all();
        let mut result = Ok(());
        let mut exported = Ok(());
        for event in &events {
            let (written, export_written) = event.write(&mut out, export.as_mut().filter(|_| exported.is_ok()));
            result = result.and(written);
            exported = exported.and(export_written);
        }
        // The export is derived, not the journal: flushed to the file
        // (readers see each batch), never synced.
        if let Some(file) = export.as_mut() {
            exported = exported.and_then(|()| file.flush());
        }
        if let Err(error) = exported {
            tracing::warn!(target: "goondan::events", "writing the runtime-events export failed; it ends here: {error}");
            // Dropped without a flush of what is buffered: a half-written
            // record may already be in the file, and nothing follows it.
            if let Some(file) = export.take() {
                let _ = file.into_parts();
            }
        }
        result = result.and_then(|()| out.flush());
        if let Err(error) = result
            && !failed
        {
            failed = true;
            tracing::error!(target: "goondan::events", "writing events failed: {error}");
        }
        // The last references of the events' scopes and strings go here, on
        // this thread, not on the call path.
        events.clear();
        if let Ok(mut state) = shared.state.lock() {
            state.flushed = state.flushed.max(flush_goal);
            let flushed = state.flushed;
            let reached = state.flush_waiters.partition_point(|(goal, _)| *goal <= flushed);
            done.extend(state.flush_waiters.drain(..reached));
        }
        shared.progress.notify_all();
        // Woken outside the lock: a waker may run the awaiting task at once.
        for (_, waiter) in done.drain(..) {
            let _ = waiter.send(());
        }
        if closed {
            // `closed` was read with the batch, and nothing is emitted after it.
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[derive(Clone, Default)]
    struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

    impl Write for SharedBuffer {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            if let Ok(mut buffer) = self.0.lock() {
                buffer.extend_from_slice(bytes);
            }
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl SharedBuffer {
        fn lines(&self) -> Vec<serde_json::Value> {
            let text = self.0.lock().map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
            text.lines().map(|line| serde_json::from_str(line).unwrap_or(serde_json::Value::Null)).collect()
        }
    }

    fn scope() -> Arc<CallScope> {
        let trace_id = Arc::from("4bf92f3577b34da6a3ce929d0e0e4736");
        let workdir = Arc::from(Path::new("/tmp"));
        Arc::new(CallScope {
            step_id: Arc::from("step"),
            step_span_id: Arc::from("00f067aa0ba902b7"),
            ..CallScope::outside_step(Arc::from("agent"), Arc::from("key"), Arc::from("turn"), trace_id, workdir)
        })
    }

    fn emit_tool_events(sink: &JsonLinesEventSink, count: usize) {
        let scope = scope();
        let name: Arc<str> = Arc::from("wait__seconds");
        for i in 0..count {
            let id: Arc<str> = Arc::from(format!("call-{i}"));
            let data = ToolEventData {
                tool_call_id: &id,
                tool_name: &name,
                status: Some(ToolStatus::Ok),
                error_code: None,
                duration: Some(Duration::from_micros(5)),
                sandbox_refused: None,
            };
            let span_id = u64::try_from(i).unwrap_or(0) + 1;
            sink.emit(&RuntimeEvent::tool(EventKind::ToolCompleted, &scope, span_id, 1, data));
        }
    }

    #[test]
    fn flush_writes_every_event_as_a_json_line_in_order() {
        let buffer = SharedBuffer::default();
        let Ok(sink) = JsonLinesEventSink::new(buffer.clone()) else { panic!("writer thread") };
        emit_tool_events(&sink, 3);
        sink.flush_and_wait();
        let lines = buffer.lines();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0]["type"], "tool.completed");
        assert_eq!(lines[0]["toolCallId"], "call-0");
        assert_eq!(lines[2]["toolCallId"], "call-2");
        assert_eq!(lines[0]["spanId"], "0000000000000001");
        assert_eq!(lines[0]["parentSpanId"], "00f067aa0ba902b7");
        assert_eq!(lines[0]["agentName"], "agent");
        assert_eq!(lines[0]["duration"], 0.005);
    }

    #[test]
    fn dropping_the_sink_writes_everything_even_past_the_queue_capacity() {
        let buffer = SharedBuffer::default();
        // Queued events count 128 bytes: 5,000 of them fill a 4 KiB queue
        // many times over.
        let count = 5_000;
        {
            let Ok(sink) = JsonLinesEventSink::with_capacity(buffer.clone(), 4096) else { panic!("writer thread") };
            emit_tool_events(&sink, count);
        }
        let lines = buffer.lines();
        assert_eq!(lines.len(), count);
        assert_eq!(lines[count - 1]["toolCallId"], format!("call-{}", count - 1));
    }

    /// An output whose writes wait until the test opens it.
    #[derive(Clone, Default)]
    struct Gated {
        open: Arc<(Mutex<bool>, Condvar)>,
        buffer: SharedBuffer,
    }

    impl Gated {
        fn open(&self) {
            if let Ok(mut open) = self.open.0.lock() {
                *open = true;
            }
            self.open.1.notify_all();
        }
    }

    impl Write for Gated {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            let Ok(mut open) = self.open.0.lock() else { return Err(io::Error::other("poisoned")) };
            while !*open {
                open = self.open.1.wait(open).map_err(|_| io::Error::other("poisoned"))?;
            }
            self.buffer.write(bytes)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_full_queue_makes_emit_wait_for_the_writer_and_drops_nothing() {
        let out = Gated::default();
        // Room for 8 queued tool events while the writer is stuck on its output.
        let Ok(sink) = JsonLinesEventSink::with_capacity(out.clone(), 1024) else { panic!("writer thread") };
        let sink = Arc::new(sink);
        let emitted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let producer = std::thread::spawn({
            let (sink, emitted) = (Arc::clone(&sink), Arc::clone(&emitted));
            move || {
                for _ in 0..100 {
                    emit_tool_events(&sink, 1);
                    emitted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        let while_stuck = emitted.load(std::sync::atomic::Ordering::SeqCst);
        assert!(while_stuck < 100, "emit waited for room ({while_stuck} of 100 emitted while the output was stuck)");
        out.open();
        if producer.join().is_err() {
            panic!("the producer panicked");
        }
        sink.flush_and_wait();
        assert_eq!(out.buffer.lines().len(), 100, "nothing was dropped");
    }

    #[test]
    fn events_without_a_call_scope_are_written_too() {
        let buffer = SharedBuffer::default();
        let Ok(sink) = JsonLinesEventSink::new(buffer.clone()) else { panic!("writer thread") };
        let extra = serde_json::json!({"stepCount": 2});
        sink.emit(&RuntimeEvent {
            kind: EventKind::TurnCompleted,
            trace_id: "t",
            span_id: 9,
            parent_span_id: None,
            timestamp_ms: 5,
            agent_name: "a",
            instance_key: "k",
            turn_id: "turn",
            step_id: None,
            tool: None,
            extra: Some(&extra),
            call_scope: None,
        });
        sink.flush_and_wait();
        let lines = buffer.lines();
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0]["type"], "turn.completed");
        assert_eq!(lines[0]["stepCount"], 2);
    }

    /// `api.events.emit('my.thing', {"count": 3, "who": "ext"})` during a call.
    fn emit_custom(sink: &dyn EventSink, scope: &Arc<CallScope>) {
        let payload = serde_json::json!({"count": 3, "who": "ext"});
        let name = String::from("my.thing");
        sink.emit(&RuntimeEvent::custom(&name, &payload, scope, 7, 11));
    }

    fn assert_custom(event: &JsonValue) {
        assert_eq!(event["type"], "my.thing");
        assert_eq!(event["count"], 3);
        assert_eq!(event["who"], "ext");
        assert_eq!(event["spanId"], "0000000000000007");
        assert_eq!(event["parentSpanId"], "00f067aa0ba902b7");
        assert_eq!(event["timestamp"], 11);
        assert_eq!(event["agentName"], "agent");
        assert_eq!(event["stepId"], "step");
    }

    #[test]
    fn a_custom_kind_names_itself() {
        let name = String::from("my.thing");
        let kind = EventKind::Custom(&name);
        assert_eq!(kind.as_str(), "my.thing");
        assert!(kind.is_custom());
        assert!(!EventKind::ToolCalled.is_custom());
        for kind in EventKind::ALL {
            assert_eq!(kind.builtin(), Some(kind));
        }
        assert_eq!(kind.builtin(), None);
    }

    #[test]
    fn a_custom_event_reaches_the_memory_sink() {
        let sink = MemoryEventSink::new();
        emit_custom(&sink, &scope());
        let events = sink.events();
        assert_eq!(events.len(), 1);
        assert_custom(&events[0]);
    }

    #[test]
    fn a_custom_event_reaches_the_json_lines_sink() {
        let buffer = SharedBuffer::default();
        let Ok(sink) = JsonLinesEventSink::new(buffer.clone()) else { panic!("writer thread") };
        let scope = scope();
        emit_tool_events(&sink, 1);
        emit_custom(&sink, &scope);
        emit_tool_events(&sink, 1);
        sink.flush_and_wait();
        let lines = buffer.lines();
        assert_eq!(lines.len(), 3, "in emission order, between the tool events");
        assert_eq!(lines[0]["type"], "tool.completed");
        assert_custom(&lines[1]);
        assert_eq!(lines[2]["type"], "tool.completed");
    }

    #[test]
    fn a_custom_event_reaches_every_sink_of_a_fanout() {
        let memory = Arc::new(MemoryEventSink::new());
        let buffer = SharedBuffer::default();
        let Ok(log) = JsonLinesEventSink::new(buffer.clone()) else { panic!("writer thread") };
        let log = Arc::new(log);
        let fanout = FanoutEventSink::new(vec![
            Arc::clone(&memory) as Arc<dyn EventSink>,
            Arc::new(NoopEventSink),
            Arc::clone(&log) as Arc<dyn EventSink>,
        ]);
        emit_custom(&fanout, &scope());
        fanout.flush();
        assert_custom(&memory.events()[0]);
        assert_custom(&buffer.lines()[0]);
    }

    #[test]
    fn a_payload_cannot_overwrite_the_events_own_fields() {
        let scope = scope();
        let payload = serde_json::json!({"type": "tool.completed", "traceId": "forged", "toolName": "x", "n": 1});
        let event = RuntimeEvent::custom("my.thing", &payload, &scope, 1, 2);
        let Ok(line) = serde_json::to_string(&event) else { panic!("serializable") };
        assert_eq!(line.matches("\"type\"").count(), 1, "{line}");
        let Ok(value) = serde_json::from_str::<JsonValue>(&line) else { panic!("{line}") };
        assert_eq!(value["type"], "my.thing");
        assert_eq!(value["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
        // Not a tool event: a payload may name a tool.
        assert_eq!(value["toolName"], "x");
        assert_eq!(value["n"], 1);
    }

    #[test]
    fn a_payload_that_is_not_an_object_is_written_as_payload() {
        let scope = scope();
        let payload = serde_json::json!(["a", 1]);
        let value = serde_json::to_value(RuntimeEvent::custom("my.list", &payload, &scope, 1, 2))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(value["type"], "my.list");
        assert_eq!(value["payload"], payload);
    }

    /// A writer whose `flush` takes `delay` (a slow disk's sync), counting flushes.
    #[derive(Clone, Default)]
    struct SlowSync {
        buffer: SharedBuffer,
        delay: Duration,
        flushes: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl SlowSync {
        fn new(delay: Duration) -> Self {
            Self { delay, ..Self::default() }
        }

        fn flushes(&self) -> usize {
            self.flushes.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    impl Write for SlowSync {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.buffer.write(bytes)
        }

        fn flush(&mut self) -> io::Result<()> {
            std::thread::sleep(self.delay);
            self.flushes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
    }

    /// A writer that fails hard on its first write.
    struct Panics;

    impl Write for Panics {
        fn write(&mut self, _bytes: &[u8]) -> io::Result<usize> {
            panic!("the writer's output broke");
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn an_idle_writer_does_not_wake() {
        let out = SlowSync::new(Duration::ZERO);
        let sink = match JsonLinesEventSink::new(out.clone()) {
            Ok(sink) => sink,
            Err(error) => panic!("{error}"),
        };
        sink.flush_and_wait();
        let before = out.flushes();
        // Eight flush intervals with nothing to write: no flush.
        std::thread::sleep(JsonLinesEventSink::FLUSH_INTERVAL * 8);
        assert_eq!(out.flushes(), before, "the writer woke and flushed while idle");
        // An event is still written within an interval or so, unasked.
        emit_tool_events(&sink, 1);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while out.buffer.lines().is_empty() {
            assert!(std::time::Instant::now() < deadline, "the event was not written");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(out.buffer.lines()[0]["toolCallId"], "call-0");
    }

    /// Awaits `future`, failing the test after 5 s instead of hanging.
    async fn within_5s(future: BoxFuture<'static, ()>, what: &str) {
        within(Duration::from_secs(5), future, what).await;
    }

    /// Awaits `future`, failing the test after `limit` instead of hanging.
    async fn within(limit: Duration, future: BoxFuture<'static, ()>, what: &str) {
        if tokio::time::timeout(limit, future).await.is_err() {
            panic!("{what}: still pending after {limit:?}");
        }
    }

    #[tokio::test]
    async fn flushed_resolves_once_the_events_are_written_and_flushed() {
        let out = SlowSync::new(Duration::from_millis(50));
        let Ok(sink) = JsonLinesEventSink::new(out.clone()) else { panic!("writer thread") };
        emit_tool_events(&sink, 3);
        emit_custom(&sink, &scope());
        within_5s(sink.flushed(), "flushed").await;
        assert_eq!(out.buffer.lines().len(), 4, "every event emitted before the call is written");
        assert!(out.flushes() >= 1, "and the output was flushed (synced) after them");
    }

    #[tokio::test]
    async fn flushed_resolves_when_nothing_was_emitted() {
        let Ok(sink) = JsonLinesEventSink::new(SharedBuffer::default()) else { panic!("writer thread") };
        within_5s(sink.flushed(), "flushed").await;
        within_5s(FanoutEventSink::new(Vec::new()).flushed(), "empty fanout").await;
        within_5s(MemoryEventSink::new().flushed(), "default").await;
    }

    #[tokio::test]
    async fn flushed_does_not_block_the_runtime_thread() {
        // `tokio::test` runs a current-thread runtime: a flush that blocked
        // this thread would stop the ticker for the writer's whole sync.
        let out = SlowSync::new(Duration::from_millis(200));
        let Ok(sink) = JsonLinesEventSink::new(out.clone()) else { panic!("writer thread") };
        let ticks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let ticker = tokio::spawn({
            let ticks = Arc::clone(&ticks);
            async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    ticks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        });
        emit_tool_events(&sink, 1);
        let started = std::time::Instant::now();
        within_5s(sink.flushed(), "flushed").await;
        let waited = started.elapsed();
        ticker.abort();
        assert_eq!(out.buffer.lines().len(), 1);
        assert!(waited >= Duration::from_millis(150), "the flush waited for the slow sync ({waited:?})");
        let ticks = ticks.load(std::sync::atomic::Ordering::SeqCst);
        assert!(ticks >= 5, "the other task ran {ticks} times while the flush was pending ({waited:?})");
    }

    #[tokio::test]
    async fn flushed_resolves_when_the_sink_is_dropped() {
        let out = SlowSync::new(Duration::from_millis(20));
        let Ok(sink) = JsonLinesEventSink::new(out.clone()) else { panic!("writer thread") };
        emit_tool_events(&sink, 2);
        let pending = sink.flushed();
        drop(sink);
        within_5s(pending, "flushed after drop").await;
        assert_eq!(out.buffer.lines().len(), 2);
    }

    #[tokio::test]
    async fn flushed_resolves_when_the_writer_is_gone() {
        let Ok(sink) = JsonLinesEventSink::new(Panics) else { panic!("writer thread") };
        emit_tool_events(&sink, 1);
        // The writer's panic runs the panic hook before it unwinds, and with
        // RUST_BACKTRACE set the hook symbolizes a backtrace of this large
        // test binary: seconds on a loaded machine. What is tested is that
        // the wait ends, not how soon.
        within(Duration::from_secs(60), sink.flushed(), "flushed while the writer dies").await;
        within_5s(sink.flushed(), "flushed after the writer died").await;
        // The blocking flush returns too, and later events are dropped.
        sink.flush_and_wait();
        emit_tool_events(&sink, 1);
    }

    #[tokio::test]
    async fn a_fanout_is_flushed_when_every_sink_is() {
        let slow = SlowSync::new(Duration::from_millis(100));
        let fast = SlowSync::new(Duration::ZERO);
        let Ok(slow_log) = JsonLinesEventSink::new(slow.clone()) else { panic!("writer thread") };
        let Ok(fast_log) = JsonLinesEventSink::new(fast.clone()) else { panic!("writer thread") };
        let fanout = FanoutEventSink::new(vec![Arc::new(fast_log), Arc::new(slow_log)]);
        emit_custom(&fanout, &scope());
        within_5s(fanout.flushed(), "fanout flushed").await;
        assert_custom(&fast.buffer.lines()[0]);
        assert_custom(&slow.buffer.lines()[0]);
        assert!(slow.flushes() >= 1 && fast.flushes() >= 1);
    }

    #[test]
    fn a_quiet_sink_still_writes_within_the_flush_interval() {
        let buffer = SharedBuffer::default();
        let Ok(sink) = JsonLinesEventSink::new(buffer.clone()) else { panic!("writer thread") };
        emit_tool_events(&sink, 1);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while buffer.lines().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(buffer.lines().len(), 1);
        drop(sink);
    }

    /// An output whose writes fail.
    struct Fails;

    impl Write for Fails {
        fn write(&mut self, _bytes: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("disk full"))
        }

        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::other("disk full"))
        }
    }

    #[test]
    fn the_export_gets_the_originals_record_of_each_event_in_order() {
        let log = SharedBuffer::default();
        let export = SharedBuffer::default();
        let Ok(sink) = JsonLinesEventSink::with_export(log.clone(), export.clone()) else { panic!("writer thread") };
        let scope = scope();
        let started = serde_json::json!({"stepIndex": 0});
        let mut step = RuntimeEvent {
            kind: EventKind::StepStarted,
            trace_id: &scope.trace_id,
            span_id: 0x00f0_67aa_0ba9_02b7,
            parent_span_id: None,
            timestamp_ms: 0,
            agent_name: "agent",
            instance_key: "key",
            turn_id: "turn",
            step_id: Some("step"),
            tool: None,
            extra: Some(&started),
            call_scope: None,
        };
        sink.emit(&step);
        emit_tool_events(&sink, 2);
        emit_custom(&sink, &scope);
        let ended = serde_json::json!({"stepIndex": 0, "toolCalls": 2, "duration": 1.5});
        step.kind = EventKind::StepCompleted;
        step.extra = Some(&ended);
        sink.emit(&step);
        sink.flush_and_wait();

        let ours: Vec<JsonValue> = log.lines().iter().map(|line| line["type"].clone()).collect();
        assert_eq!(ours, ["step.started", "tool.completed", "tool.completed", "my.thing", "step.completed"]);
        let records = export.lines();
        let kinds: Vec<&str> = records.iter().filter_map(|record| record["type"].as_str()).collect();
        assert_eq!(
            kinds,
            ["step.started", "tool.completed", "tool.completed", "step.completed"],
            "no record of an extension's event"
        );
        assert_eq!(records[0]["timestamp"], "1970-01-01T00:00:00.000Z");
        assert_eq!(records[1]["toolCallId"], "call-0");
        assert_eq!(records[1]["status"], "ok");
        assert_eq!(records[2]["spanId"], "0000000000000002");
        assert_eq!(records[3]["toolCallCount"], 2);
        assert!(records.iter().all(|record| record["traceId"] == log.lines()[0]["traceId"]));
    }

    #[test]
    fn a_failing_export_never_stops_the_event_log() {
        let log = SharedBuffer::default();
        let Ok(sink) = JsonLinesEventSink::with_export(log.clone(), Fails) else { panic!("writer thread") };
        emit_tool_events(&sink, 2);
        sink.flush_and_wait();
        emit_tool_events(&sink, 3);
        sink.flush_and_wait();
        assert_eq!(log.lines().len(), 5);
    }
}
