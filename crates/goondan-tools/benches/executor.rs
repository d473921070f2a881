//! Executor overhead, catalog and registry cost (see `docs/BENCHMARKS.md`).
//!
//! Run with `cargo bench -p goondan-tools --bench executor`.
//!
//! Every async call is driven by one current-thread tokio runtime built
//! outside the timed closure; each iteration is one `rt.block_on(execute(..))`.
//! The `ToolCall` handed to `execute` is cloned by divan's `with_inputs`
//! outside the timing, and the result is dropped outside it too.

use std::future::Future as _;
use std::hint::black_box;
use std::path::Path;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use divan::Bencher;
use goondan_core::{JsonObject, Message, ToolCall, ToolResult};
use goondan_tools::events::RuntimeEvent;
use goondan_tools::{
    CallScope, EventSink, JsonLinesEventSink, NoopEventSink, ParameterSchema, ToolCallContext, ToolCatalog,
    ToolCatalogItem, ToolExecutor, ToolOutput, ToolRegistry, ToolSource, from_fn, sync_handler,
};
use serde_json::{Value, json};
use tokio::runtime::Runtime;

fn main() {
    // 1,000 samples per bench instead of divan's 100: each bench then runs
    // for ~0.1 s instead of a few ms, so a short hiccup of the (shared,
    // virtualized) machine moves the median less. CLI options still apply.
    divan::Divan::default().sample_count(1_000).config_with_args().main();
}

/// Catalog size of the "large catalog" benches.
const LARGE: usize = 1_000;

// Fixed sample sizes (iterations per timed sample). Left to divan, a cold
// first iteration above 100x the timer precision stops its tuning at one
// iteration per sample, which makes sub-microsecond figures noisy.
/// For benches of 0.3–2 µs: one sample is ~20–130 µs.
const SAMPLE_EXECUTE: u32 = 64;
/// For benches of 0.1–0.5 µs.
const SAMPLE_SUB_US: u32 = 256;
/// For benches of a few nanoseconds.
const SAMPLE_NS: u32 = 4096;

/// An event sink that serializes on the call path: every event becomes one
/// JSON line in a reusable buffer, which is cleared when it grows past 64 KiB
/// (as a writer flushing to a file or socket would). For comparison with the
/// runtime's [`JsonLinesEventSink`], which serializes on a background thread.
#[derive(Default)]
struct JsonLinesSink {
    buffer: Mutex<Vec<u8>>,
}

impl JsonLinesSink {
    const FLUSH_AT: usize = 64 * 1024;
}

impl EventSink for JsonLinesSink {
    fn emit(&self, event: &RuntimeEvent<'_>) {
        let Ok(mut buffer) = self.buffer.lock() else { return };
        if buffer.len() > Self::FLUSH_AT {
            buffer.clear();
        }
        if serde_json::to_writer(&mut *buffer, event).is_ok() {
            buffer.push(b'\n');
        }
    }
}

/// An in-process subscriber: receives every event and reads it, as a
/// listener on an event bus does, without storing or formatting anything.
#[derive(Default)]
struct SubscriberSink {
    seen: std::sync::atomic::AtomicU64,
}

impl EventSink for SubscriberSink {
    fn emit(&self, event: &RuntimeEvent<'_>) {
        black_box(event);
        self.seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Which sink an executor reports to.
#[derive(Debug, Clone, Copy)]
enum Events {
    /// [`SubscriberSink`]: events built and delivered to an in-process subscriber.
    Subscriber,
    /// [`JsonLinesEventSink`]: JSON lines written by a background thread
    /// (here to `io::sink()`), the sink the runtime uses for event logs.
    Json,
    /// [`JsonLinesSink`]: JSON serialized on the call path.
    JsonInline,
    /// [`NoopEventSink`]: no events built at all.
    Noop,
}

impl Events {
    /// The sink, and the background writer when there is one.
    fn sink(self) -> (Arc<dyn EventSink>, Option<Arc<JsonLinesEventSink>>) {
        match self {
            Self::Json => {
                let sink =
                    Arc::new(JsonLinesEventSink::new(std::io::sink()).unwrap_or_else(|e| panic!("event writer: {e}")));
                (Arc::clone(&sink) as Arc<dyn EventSink>, Some(sink))
            }
            Self::JsonInline => (Arc::new(JsonLinesSink::default()), None),
            Self::Subscriber => (Arc::new(SubscriberSink::default()), None),
            Self::Noop => (Arc::new(NoopEventSink), None),
        }
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap_or_else(|e| panic!("runtime: {e}"))
}

fn schema() -> Arc<ParameterSchema> {
    ParameterSchema::new(json!({
        "type": "object",
        "properties": {
            "command": {"type": "string"},
            "timeoutMs": {"type": "number"}
        },
        "required": ["command"],
        "additionalProperties": false
    }))
}

fn tool_name(index: usize) -> String {
    format!("tool{index:04}__run")
}

/// `count` items sharing one parameter schema, as items cloned from an
/// agent's prebuilt `spec.tools` entries do.
fn items(count: usize) -> Vec<ToolCatalogItem> {
    let schema = schema();
    (0..count)
        .map(|i| {
            let name = tool_name(i);
            let resource = format!("tool{i:04}");
            ToolCatalogItem::new(name, ToolSource::config(resource))
                .with_description("Runs a command and returns its output.")
                .with_shared_parameters(Arc::clone(&schema))
        })
        .collect()
}

fn scope() -> Arc<CallScope> {
    let message = Message::assistant_tool_calls("step-1", Vec::new());
    Arc::new(CallScope {
        agent_name: Arc::from("coder"),
        instance_key: Arc::from("user-42"),
        turn_id: Arc::from("0190f3c4-7b2a-7c3d-9e1f-2a3b4c5d6e7f"),
        step_id: Arc::from("0190f3c4-7b2a-7c3d-9e1f-2a3b4c5d6e80"),
        step_index: 0,
        message: Arc::new(message),
        workdir: Arc::from(Path::new("/tmp/goondan-bench")),
        trace_id: Arc::from("4bf92f3577b34da6a3ce929d0e0e4736"),
        step_span_id: Arc::from("00f067aa0ba902b7"),
        runtime: None,
        tasks: None,
    })
}

fn call(name: String) -> ToolCall {
    let mut args = JsonObject::new();
    args.insert("command".to_owned(), Value::from("ls -la"));
    args.insert("timeoutMs".to_owned(), Value::from(5_000));
    ToolCall::new("call_8f2c1a9d4e6b", name, args)
}

/// How each no-op middleware layer is written.
#[derive(Debug, Clone, Copy)]
enum Layer {
    /// `from_fn(|ctx, next| next.run(ctx))`: hands the inner future out as is.
    Direct,
    /// `from_fn(|ctx, next| Box::pin(async move { next.run(ctx).await }))`:
    /// its own future, as any layer that does work after `next` has.
    Async,
}

/// An executor over `tools` tools (all in the step's catalog) with `layers`
/// no-op middleware layers, plus the call of the last tool.
struct Fixture {
    /// The background writer, drained between samples by [`Fixture::bench`].
    writer: Option<Arc<JsonLinesEventSink>>,
    rt: Runtime,
    executor: ToolExecutor,
    scope: Arc<CallScope>,
    catalog: Arc<ToolCatalog>,
    call: ToolCall,
}

impl Fixture {
    fn new(tools: usize, layers: usize, layer: Layer, events: Events) -> Self {
        let items = items(tools);
        let registry = ToolRegistry::new();
        for item in &items {
            let handler = sync_handler(|_, _| Ok(ToolOutput::Value(Value::Null)));
            registry.register(item.clone(), handler).unwrap_or_else(|e| panic!("{e}"));
        }
        let (sink, writer) = events.sink();
        let mut executor = ToolExecutor::new(Arc::new(registry)).with_events(sink);
        for index in 0..layers {
            let priority = i32::try_from(index).unwrap_or(i32::MAX);
            let middleware = match layer {
                Layer::Direct => from_fn(|ctx: &mut ToolCallContext, next| next.run(ctx)),
                Layer::Async => from_fn(|ctx: &mut ToolCallContext, next| Box::pin(async move { next.run(ctx).await })),
            };
            executor.register_middleware(format!("noop-{index}"), priority, middleware);
        }
        let catalog: Arc<ToolCatalog> = Arc::new(items.into_iter().collect());
        let fixture =
            Self { writer, rt: runtime(), executor, scope: scope(), catalog, call: call(tool_name(tools - 1)) };
        // Compiles the schema and checks the path is the success path.
        let result = fixture.execute(fixture.call.clone());
        assert!(!result.is_error(), "warm-up call failed: {result:?}");
        fixture
    }

    fn execute(&self, call: ToolCall) -> ToolResult {
        self.rt.block_on(self.executor.execute(call, &self.scope, &self.catalog))
    }

    /// Polls the call once with a no-op waker, without any runtime: the
    /// handler is synchronous, so the first poll finishes it.
    fn execute_polled(&self, call: ToolCall) -> ToolResult {
        let mut future = pin!(self.executor.execute(call, &self.scope, &self.catalog));
        match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(result) => result,
            Poll::Pending => panic!("a synchronous call returned Pending"),
        }
    }

    /// Times the call path. Inputs are made before each sample, untimed;
    /// making them also waits for the background writer to drain, so a
    /// sample (64 calls, well under one writer batch) measures what a call
    /// costs its caller, not the writer's throughput on the other core.
    fn bench(&self, bencher: Bencher<'_, '_>) {
        bencher.with_inputs(|| self.input()).bench_local_values(|call| self.execute(call));
    }

    /// Times back-to-back calls while the writer serializes on the other
    /// core: bounded by the writer's throughput once its queue is full.
    fn bench_sustained(&self, bencher: Bencher<'_, '_>) {
        bencher.with_inputs(|| self.call.clone()).bench_local_values(|call| self.execute(call));
    }

    fn input(&self) -> ToolCall {
        if let Some(writer) = &self.writer {
            writer.flush_and_wait();
        }
        self.call.clone()
    }
}

/// One tool, no-op handler, small schema, valid arguments: the executor's
/// own cost per call.
mod execute {
    use super::{Bencher, Events, Fixture, LARGE, Layer, SAMPLE_EXECUTE};

    /// 0 and 5 direct no-op layers, events delivered to an in-process subscriber.
    #[divan::bench(args = [0, 5], sample_size = SAMPLE_EXECUTE)]
    fn subscriber_events(bencher: Bencher<'_, '_>, layers: usize) {
        Fixture::new(1, layers, Layer::Direct, Events::Subscriber).bench(bencher);
    }

    /// 0 and 5 direct no-op layers, events written as JSON lines by the
    /// background writer.
    #[divan::bench(args = [0, 5], sample_size = SAMPLE_EXECUTE)]
    fn json_events(bencher: Bencher<'_, '_>, layers: usize) {
        Fixture::new(1, layers, Layer::Direct, Events::Json).bench(bencher);
    }

    /// 5 direct no-op layers, JSON events, calls back to back without a
    /// pause for the writer: the sustained rate the event log can absorb.
    #[divan::bench(sample_size = SAMPLE_EXECUTE)]
    fn json_events_sustained_5(bencher: Bencher<'_, '_>) {
        Fixture::new(1, 5, Layer::Direct, Events::Json).bench_sustained(bencher);
    }

    /// 0 and 5 direct no-op layers, events serialized to JSON on the call path.
    #[divan::bench(args = [0, 5], sample_size = SAMPLE_EXECUTE)]
    fn inline_json_events(bencher: Bencher<'_, '_>, layers: usize) {
        Fixture::new(1, layers, Layer::Direct, Events::JsonInline).bench(bencher);
    }

    /// 0 and 5 direct no-op layers, events dropped by `NoopEventSink`.
    #[divan::bench(args = [0, 5], sample_size = SAMPLE_EXECUTE)]
    fn noop_events(bencher: Bencher<'_, '_>, layers: usize) {
        Fixture::new(1, layers, Layer::Direct, Events::Noop).bench(bencher);
    }

    /// 5 layers that each wrap `next` in their own `async` block.
    #[divan::bench(args = [Events::Json, Events::Noop], sample_size = SAMPLE_EXECUTE)]
    fn async_layers_5(bencher: Bencher<'_, '_>, events: Events) {
        Fixture::new(1, 5, Layer::Async, events).bench(bencher);
    }

    /// 5 direct layers, polled once without a runtime: `json_events`/
    /// `noop_events` minus the cost of `block_on`.
    #[divan::bench(
        args = [Events::Subscriber, Events::Json, Events::JsonInline, Events::Noop],
        sample_size = SAMPLE_EXECUTE
    )]
    fn no_runtime_5(bencher: Bencher<'_, '_>, events: Events) {
        let fixture = Fixture::new(1, 5, Layer::Direct, events);
        bencher.with_inputs(|| fixture.input()).bench_local_values(|call| fixture.execute_polled(call));
    }

    /// The last item of a catalog (and registry) of 1, 10 and 1,000 tools,
    /// 5 direct layers, events delivered to a subscriber.
    #[divan::bench(args = [1, 10, LARGE], sample_size = SAMPLE_EXECUTE)]
    fn last_of_catalog(bencher: Bencher<'_, '_>, tools: usize) {
        Fixture::new(tools, 5, Layer::Direct, Events::Subscriber).bench(bencher);
    }
}

/// What the `execute` figures include besides the executor itself.
mod baseline {
    use super::{Arc, Bencher, SAMPLE_SUB_US, black_box, call, runtime, tool_name};

    /// `rt.block_on` of a future that is ready at once.
    #[divan::bench(sample_size = SAMPLE_SUB_US)]
    fn block_on_ready(bencher: Bencher<'_, '_>) {
        let rt = runtime();
        bencher.bench_local(|| rt.block_on(async { black_box(1_u32) }));
    }

    /// Cloning the `ToolCall` (done outside the timing in `execute`).
    #[divan::bench(sample_size = SAMPLE_SUB_US)]
    fn call_clone(bencher: Bencher<'_, '_>) {
        let call = call(tool_name(0));
        bencher.bench_local(|| black_box(&call).clone());
    }

    /// Serializing one `tool.completed` event through the JSON sink.
    #[divan::bench(sample_size = SAMPLE_SUB_US)]
    fn json_event(bencher: Bencher<'_, '_>) {
        use goondan_core::ToolStatus;
        use goondan_tools::EventKind;
        use goondan_tools::events::{RuntimeEvent, ToolEventData};

        use super::{EventSink, JsonLinesSink};

        let sink = JsonLinesSink::default();
        let call_id: Arc<str> = Arc::from("call_8f2c1a9d4e6b");
        let name: Arc<str> = Arc::from("tool0000__run");
        let event = RuntimeEvent {
            kind: EventKind::ToolCompleted,
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736",
            span_id: 0x1234_5678_9abc_def0,
            parent_span_id: Some("00f067aa0ba902b7"),
            timestamp_ms: 1_760_000_000_000,
            agent_name: "coder",
            instance_key: "user-42",
            turn_id: "0190f3c4-7b2a-7c3d-9e1f-2a3b4c5d6e7f",
            step_id: Some("0190f3c4-7b2a-7c3d-9e1f-2a3b4c5d6e80"),
            tool: Some(ToolEventData {
                tool_call_id: &call_id,
                tool_name: &name,
                status: Some(ToolStatus::Ok),
                error_code: None,
                duration: Some(std::time::Duration::from_nanos(412)),
                sandbox_refused: None,
            }),
            extra: None,
            call_scope: None,
        };
        bencher.bench_local(|| sink.emit(black_box(&event)));
    }
}

/// Building and querying a 1,000-item catalog.
mod catalog {
    use super::{Bencher, LARGE, SAMPLE_NS, ToolCatalog, black_box, items, tool_name};

    /// A step catalog from 1,000 prebuilt items, cloned into a presized
    /// catalog (what `AgentTools::step_catalog` does).
    #[divan::bench(sample_size = 1)]
    fn build_1000_presized(bencher: Bencher<'_, '_>) {
        let items = items(LARGE);
        bencher.bench_local(|| {
            let mut catalog = ToolCatalog::with_capacity(items.len());
            for item in &items {
                catalog.insert(item.clone());
            }
            catalog
        });
    }

    /// The same through `FromIterator` (no capacity hint).
    #[divan::bench(sample_size = 1)]
    fn build_1000_collect(bencher: Bencher<'_, '_>) {
        let items = items(LARGE);
        bencher.bench_local(|| items.iter().cloned().collect::<ToolCatalog>());
    }

    /// `catalog.get(name)` of the first, middle and last of 1,000 items.
    #[divan::bench(args = [0, LARGE / 2, LARGE - 1], sample_size = SAMPLE_NS)]
    fn get_of_1000(bencher: Bencher<'_, '_>, index: usize) {
        let catalog: ToolCatalog = items(LARGE).into_iter().collect();
        let name = tool_name(index);
        bencher.bench_local(|| catalog.get(black_box(name.as_str())).is_some());
    }

    /// `catalog.get(name)` of the last item of 1, 10 and 1,000 items.
    #[divan::bench(args = [1, 10, LARGE], sample_size = SAMPLE_NS)]
    fn get_last(bencher: Bencher<'_, '_>, size: usize) {
        let catalog: ToolCatalog = items(size).into_iter().collect();
        let name = tool_name(size - 1);
        bencher.bench_local(|| catalog.get(black_box(name.as_str())).is_some());
    }
}

/// Looking tools up in, and registering into, a registry of 1,000 tools.
mod registry {
    use super::{
        Arc, Bencher, LARGE, SAMPLE_NS, ToolCatalogItem, ToolOutput, ToolRegistry, ToolSource, Value, black_box, items,
        sync_handler, tool_name,
    };

    fn registry_of(count: usize) -> ToolRegistry {
        let registry = ToolRegistry::new();
        let handler = sync_handler(|_, _| Ok(ToolOutput::Value(Value::Null)));
        registry
            .register_all(items(count).into_iter().map(|item| (item, Arc::clone(&handler))))
            .unwrap_or_else(|e| panic!("{e}"));
        registry
    }

    /// `registry.get(name)` of the first, middle and last of 1,000 tools:
    /// load the current snapshot, one hash probe, clone the tool's `Arc`
    /// (what the executor's handler lookup does per call).
    #[divan::bench(args = [0, LARGE / 2, LARGE - 1], sample_size = SAMPLE_NS)]
    fn get_of_1000(bencher: Bencher<'_, '_>, index: usize) {
        let registry = registry_of(LARGE);
        let name = tool_name(index);
        bencher.bench_local(|| registry.get(black_box(name.as_str())));
    }

    /// `snapshot.get(name)` of the last of 1,000 tools on a snapshot already
    /// held: the hash probe alone.
    #[divan::bench(sample_size = SAMPLE_NS)]
    fn snapshot_get_of_1000(bencher: Bencher<'_, '_>) {
        let registry = registry_of(LARGE);
        let snapshot = registry.snapshot();
        let name = tool_name(LARGE - 1);
        bencher.bench_local(|| snapshot.get(black_box(name.as_str())).is_some());
    }

    /// Registering one more tool into 1,000 and unregistering it again: two
    /// copy-on-write snapshots of ~1,000 entries (the price of a change,
    /// paid by the writer, never by a lookup).
    #[divan::bench(sample_size = 1)]
    fn register_unregister_into_1000(bencher: Bencher<'_, '_>) {
        let registry = registry_of(LARGE);
        let extra = ToolCatalogItem::new(tool_name(LARGE), ToolSource::extension("bench"));
        let handler = sync_handler(|_, _| Ok(ToolOutput::Value(Value::Null)));
        bencher.bench_local(|| {
            registry.register(extra.clone(), Arc::clone(&handler)).unwrap_or_else(|e| panic!("{e}"));
            registry.unregister(extra.name())
        });
    }
}
