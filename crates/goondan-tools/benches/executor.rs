//! Executor overhead and catalog cost (see `docs/BENCHMARKS.md`).
//!
//! Run with `cargo bench -p goondan-tools --bench executor`.
//!
//! Every async call is driven by one current-thread tokio runtime built
//! outside the timed closure; each iteration is one `rt.block_on(execute(..))`.
//! The `ToolCall` handed to `execute` is cloned by divan's `with_inputs`
//! outside the timing, and the result is dropped outside it too.

use std::hint::black_box;
use std::path::Path;
use std::sync::{Arc, Mutex};

use divan::Bencher;
use goondan_core::{JsonObject, Message, ToolCall};
use goondan_tools::events::RuntimeEvent;
use goondan_tools::{
    CallScope, EventSink, NoopEventSink, ParameterSchema, ToolCallContext, ToolCatalog, ToolCatalogItem, ToolExecutor,
    ToolOutput, ToolRegistry, ToolSource, from_fn, sync_handler,
};
use serde_json::{Value, json};
use tokio::runtime::Runtime;

fn main() {
    divan::main();
}

/// Catalog size of the "large catalog" benches.
const LARGE: usize = 1_000;

/// A realistic event sink: every event becomes one JSON line in a reusable
/// buffer, which is cleared when it grows past 64 KiB (as a writer flushing
/// to a file or socket would).
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

/// Which sink an executor reports to.
#[derive(Debug, Clone, Copy)]
enum Events {
    /// [`JsonLinesSink`].
    Json,
    /// [`NoopEventSink`].
    Noop,
}

impl Events {
    fn sink(self) -> Arc<dyn EventSink> {
        match self {
            Self::Json => Arc::new(JsonLinesSink::default()),
            Self::Noop => Arc::new(NoopEventSink),
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
        message: Arc::new(message),
        workdir: Arc::from(Path::new("/tmp/goondan-bench")),
        trace_id: Arc::from("4bf92f3577b34da6a3ce929d0e0e4736"),
        step_span_id: Arc::from("00f067aa0ba902b7"),
        runtime: None,
    })
}

fn call(name: String) -> ToolCall {
    let mut args = JsonObject::new();
    args.insert("command".to_owned(), Value::from("ls -la"));
    args.insert("timeoutMs".to_owned(), Value::from(5_000));
    ToolCall { id: "call_8f2c1a9d4e6b".to_owned(), name, args }
}

/// An executor over `tools` tools (all in the step's catalog) with `layers`
/// no-op middleware layers, plus the call of the last tool.
struct Fixture {
    rt: Runtime,
    executor: ToolExecutor,
    scope: Arc<CallScope>,
    catalog: Arc<ToolCatalog>,
    call: ToolCall,
}

impl Fixture {
    fn new(tools: usize, layers: usize, events: Events) -> Self {
        let items = items(tools);
        let mut registry = ToolRegistry::new();
        for item in &items {
            let handler = sync_handler(|_, _| Ok(ToolOutput::Value(Value::Null)));
            registry.register(item.clone(), handler).unwrap_or_else(|e| panic!("{e}"));
        }
        let mut executor = ToolExecutor::new(Arc::new(registry)).with_events(events.sink());
        for layer in 0..layers {
            let priority = i32::try_from(layer).unwrap_or(i32::MAX);
            executor.register_middleware(
                format!("noop-{layer}"),
                priority,
                from_fn(|ctx: &mut ToolCallContext, next| next.run(ctx)),
            );
        }
        let catalog: Arc<ToolCatalog> = Arc::new(items.into_iter().collect());
        let fixture = Self { rt: runtime(), executor, scope: scope(), catalog, call: call(tool_name(tools - 1)) };
        // Compiles the schema and checks the path is the success path.
        let result = fixture.execute(fixture.call.clone());
        assert!(!result.is_error(), "warm-up call failed: {result:?}");
        fixture
    }

    fn execute(&self, call: ToolCall) -> goondan_core::ToolResult {
        self.rt.block_on(self.executor.execute(call, &self.scope, &self.catalog))
    }

    fn bench(&self, bencher: Bencher<'_, '_>) {
        bencher.with_inputs(|| self.call.clone()).bench_local_values(|call| self.execute(call));
    }
}

/// One tool, no-op handler, small schema, valid arguments: the executor's
/// own cost per call, through 0 and 5 no-op middleware layers.
mod execute {
    use super::{Bencher, Events, Fixture};

    /// Events serialized to JSON lines.
    #[divan::bench(args = [0, 5])]
    fn json_events(bencher: Bencher<'_, '_>, layers: usize) {
        Fixture::new(1, layers, Events::Json).bench(bencher);
    }

    /// Events dropped by `NoopEventSink`.
    #[divan::bench(args = [0, 5])]
    fn noop_events(bencher: Bencher<'_, '_>, layers: usize) {
        Fixture::new(1, layers, Events::Noop).bench(bencher);
    }

    /// The last item of a 1-item and of a 1,000-item catalog (and registry),
    /// 5 layers, JSON events.
    #[divan::bench(args = [1, super::LARGE])]
    fn last_of_catalog(bencher: Bencher<'_, '_>, tools: usize) {
        Fixture::new(tools, 5, Events::Json).bench(bencher);
    }
}

/// What the `execute` figures include besides the executor itself.
mod baseline {
    use super::{Bencher, black_box, call, runtime, tool_name};

    /// `rt.block_on` of a future that is ready at once.
    #[divan::bench]
    fn block_on_ready(bencher: Bencher<'_, '_>) {
        let rt = runtime();
        bencher.bench_local(|| rt.block_on(async { black_box(1_u32) }));
    }

    /// Cloning the `ToolCall` (done outside the timing in `execute`).
    #[divan::bench]
    fn call_clone(bencher: Bencher<'_, '_>) {
        let call = call(tool_name(0));
        bencher.bench_local(|| black_box(&call).clone());
    }

    /// Serializing one `tool.completed` event through the JSON sink.
    #[divan::bench]
    fn json_event(bencher: Bencher<'_, '_>) {
        use goondan_core::ToolStatus;
        use goondan_tools::EventKind;
        use goondan_tools::events::{RuntimeEvent, ToolEventData};

        use super::{EventSink, JsonLinesSink};

        let sink = JsonLinesSink::default();
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
                tool_call_id: "call_8f2c1a9d4e6b",
                tool_name: "tool0000__run",
                status: Some(ToolStatus::Ok),
                error_code: None,
                duration: Some(std::time::Duration::from_nanos(412)),
            }),
            extra: None,
        };
        bencher.bench_local(|| sink.emit(black_box(&event)));
    }
}

/// Building and querying a 1,000-item catalog.
mod catalog {
    use super::{Bencher, LARGE, ToolCatalog, black_box, items, tool_name};

    /// A step catalog from 1,000 prebuilt items, cloned into a presized
    /// catalog (what `AgentTools::step_catalog` does).
    #[divan::bench]
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
    #[divan::bench]
    fn build_1000_collect(bencher: Bencher<'_, '_>) {
        let items = items(LARGE);
        bencher.bench_local(|| items.iter().cloned().collect::<ToolCatalog>());
    }

    /// `catalog.get(name)` of the first, middle and last of 1,000 items.
    #[divan::bench(args = [0, LARGE / 2, LARGE - 1])]
    fn get_of_1000(bencher: Bencher<'_, '_>, index: usize) {
        let catalog: ToolCatalog = items(LARGE).into_iter().collect();
        let name = tool_name(index);
        bencher.bench_local(|| catalog.get(black_box(name.as_str())).is_some());
    }

    /// `catalog.get(name)` in a 1-item catalog.
    #[divan::bench]
    fn get_of_1(bencher: Bencher<'_, '_>) {
        let catalog: ToolCatalog = items(1).into_iter().collect();
        let name = tool_name(0);
        bencher.bench_local(|| catalog.get(black_box(name.as_str())).is_some());
    }
}
