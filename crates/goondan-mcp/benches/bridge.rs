//! The overhead of the MCP bridge (see `docs/BENCHMARKS.md`, "MCP bridge").
//!
//! Run with `cargo bench -p goondan-mcp --bench bridge` (needs `node`).
//!
//! Both benches call `echo` of the client's fake server (Node, over stdio)
//! on one connection, alternately, so the server and the machine's noise
//! are the same for both:
//!
//! - `raw_rmcp`: the official SDK's `call_tool` on the connection's peer,
//!   result dropped: the floor.
//! - `bridge`: the same call as an agent's tool call: `ToolExecutor`
//!   (catalog check, argument validation against the server's schema,
//!   middleware chain, events into an enabled sink, so progress is asked
//!   for) → `McpToolHandler` → SDK → result mapped to a `ToolResult`.
//! - `bridge_without_events`: the same with events off.
//!
//! One current-thread tokio runtime, built outside the timed closures.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use divan::Bencher;
use goondan_core::ids::SpanIdGenerator;
use goondan_core::{JsonObject, ToolCall};
use goondan_mcp::client::Server;
use goondan_mcp::config::{ServerConfig, StdioServer};
use goondan_mcp::handler::McpToolHandler;
use goondan_test_support::call_scope;
use goondan_tools::events::RuntimeEvent;
use goondan_tools::{CallScope, EventSink, ToolCatalog, ToolCatalogItem, ToolExecutor, ToolRegistry, ToolSource};
use rmcp::model::CallToolRequestParams;
use serde_json::json;
use tokio::runtime::Runtime;

fn main() {
    // `--rounds`: the raw and bridge calls alternated in rounds of 200 on
    // one connection, so both see the same server and the same noise; the
    // median of each kind's per-round medians is printed.
    if std::env::args().any(|arg| arg == "--rounds") {
        rounds();
        return;
    }
    divan::Divan::default().sample_count(1_000).config_with_args().main();
}

#[allow(clippy::print_stdout)]
fn rounds() {
    let f = fixture();
    let quiet = fixture_with(Arc::new(goondan_tools::NoopEventSink));
    let connection = f.rt.block_on(f.server.connection()).unwrap_or_else(|e| panic!("{e}"));
    let peer = connection.peer().clone();
    let raw = || {
        let params = CallToolRequestParams::new("echo").with_arguments(f.args.clone());
        let result = f.rt.block_on(peer.call_tool(params)).unwrap_or_else(|e| panic!("{e}"));
        divan::black_box(result);
    };
    let bridged = || {
        let call = ToolCall { id: Arc::from("call-1"), name: Arc::from("fake__echo"), args: f.args.clone() };
        let result = f.rt.block_on(f.executor.execute(call, &f.scope, &f.catalog));
        assert!(!result.is_error(), "{result:?}");
        divan::black_box(result);
    };
    let bridged_quiet = || {
        let call = ToolCall { id: Arc::from("call-1"), name: Arc::from("fake__echo"), args: quiet.args.clone() };
        let result = quiet.rt.block_on(quiet.executor.execute(call, &quiet.scope, &quiet.catalog));
        divan::black_box(result);
    };
    let median = |mut samples: Vec<f64>| {
        samples.sort_by(f64::total_cmp);
        samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let time = |call: &dyn Fn()| {
        let times: Vec<f64> = (0..200)
            .map(|_| {
                let started = std::time::Instant::now();
                call();
                started.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        median(times)
    };
    // The quiet bridge has a server of its own; its floor is the raw call
    // on that server.
    let quiet_connection = quiet.rt.block_on(quiet.server.connection()).unwrap_or_else(|e| panic!("{e}"));
    let quiet_peer = quiet_connection.peer().clone();
    let raw_quiet = || {
        let params = CallToolRequestParams::new("echo").with_arguments(quiet.args.clone());
        let result = quiet.rt.block_on(quiet_peer.call_tool(params)).unwrap_or_else(|e| panic!("{e}"));
        divan::black_box(result);
    };
    let kinds: [&dyn Fn(); 4] = [&raw, &bridged, &raw_quiet, &bridged_quiet];
    // `--only K [N]`: N calls (2,000) of one kind (0 raw, 1 bridge, 2 raw
    // quiet, 3 bridge quiet) and nothing else, for `valgrind
    // --tool=callgrind`: the difference of two N is the cost of the calls.
    let args: Vec<String> = std::env::args().collect();
    if let Some(only) = args.iter().position(|arg| arg == "--only").and_then(|at| args.get(at + 1)) {
        let kind =
            only.parse::<usize>().ok().and_then(|index| kinds.get(index)).unwrap_or_else(|| panic!("--only 0..3"));
        let count = args
            .iter()
            .position(|arg| arg == "--only")
            .and_then(|at| args.get(at + 2))
            .and_then(|n| n.parse().ok())
            .unwrap_or(2_000);
        for _ in 0..count {
            kind();
        }
        return;
    }
    // Warm the servers' JIT and every path first.
    for call in kinds {
        time(call);
    }
    let mut samples: [Vec<f64>; 4] = Default::default();
    for _ in 0..30 {
        for (call, kind) in kinds.iter().zip(samples.iter_mut()) {
            kind.push(time(*call));
        }
    }
    let [raw, bridge, raw_quiet, bridge_quiet] = samples.map(median);
    println!(
        "events on:  raw rmcp call {raw:.1} µs, through the bridge {bridge:.1} µs, overhead {:+.1} %",
        (bridge / raw - 1.0) * 100.0
    );
    println!(
        "events off: raw rmcp call {raw_quiet:.1} µs, through the bridge {bridge_quiet:.1} µs, overhead {:+.1} %",
        (bridge_quiet / raw_quiet - 1.0) * 100.0
    );
}

/// An enabled sink that only counts: what an agent's event log costs on the
/// call path is measured elsewhere (goondan-tools' executor benches).
#[derive(Default)]
struct CountingSink(AtomicU64);

impl EventSink for CountingSink {
    fn emit(&self, _event: &RuntimeEvent<'_>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

struct Fixture {
    rt: Runtime,
    server: Arc<Server>,
    executor: ToolExecutor,
    catalog: Arc<ToolCatalog>,
    scope: Arc<CallScope>,
    args: JsonObject,
}

fn fixture() -> Fixture {
    fixture_with(Arc::new(CountingSink::default()))
}

fn fixture_with(sink: Arc<dyn EventSink>) -> Fixture {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| panic!("{e}"));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake-server.mjs");
    let spec =
        StdioServer { command: "node".into(), args: vec![script.into()], env: Vec::new(), cwd: None, sandbox: None };
    let (server, tools) =
        rt.block_on(Server::start("fake", ServerConfig::Stdio(spec))).unwrap_or_else(|e| panic!("start: {e}"));
    let echo = tools.iter().find(|tool| tool.name == "echo").unwrap_or_else(|| panic!("no echo tool"));
    let item = ToolCatalogItem::new("fake__echo", ToolSource::mcp("mcp", "fake"))
        .with_parameters(serde_json::Value::Object((*echo.input_schema).clone()));
    let handler = McpToolHandler::new(Arc::clone(&server), "echo")
        .with_progress_events(Arc::clone(&sink), Arc::new(SpanIdGenerator::new()));
    let registry = Arc::new(ToolRegistry::new());
    registry.register(item.clone(), Arc::new(handler)).unwrap_or_else(|e| panic!("{e}"));
    let executor = ToolExecutor::new(registry).with_events(sink);
    let catalog = Arc::new(std::iter::once(item).collect::<ToolCatalog>());
    let scope = Arc::new(call_scope("agent", "key", Path::new("/tmp")));
    let args = match json!({"text": "hello"}) {
        serde_json::Value::Object(map) => map,
        _ => JsonObject::new(),
    };
    Fixture { rt, server, executor, catalog, scope, args }
}

#[divan::bench(sample_size = 8)]
fn raw_rmcp(bencher: Bencher) {
    let f = fixture();
    let connection = f.rt.block_on(f.server.connection()).unwrap_or_else(|e| panic!("{e}"));
    let peer = connection.peer().clone();
    bencher.bench_local(|| {
        let params = CallToolRequestParams::new("echo").with_arguments(f.args.clone());
        let result = f.rt.block_on(peer.call_tool(params)).unwrap_or_else(|e| panic!("{e}"));
        divan::black_box(result);
    });
}

#[divan::bench(sample_size = 8)]
fn bridge(bencher: Bencher) {
    let f = fixture();
    bencher.bench_local(|| {
        let call = ToolCall { id: Arc::from("call-1"), name: Arc::from("fake__echo"), args: f.args.clone() };
        let result = f.rt.block_on(f.executor.execute(call, &f.scope, &f.catalog));
        assert!(!result.is_error(), "{result:?}");
        divan::black_box(result);
    });
}

/// `bridge` with events off (no progress token asked for, no events).
#[divan::bench(sample_size = 8)]
fn bridge_without_events(bencher: Bencher) {
    let f = fixture_with(Arc::new(goondan_tools::NoopEventSink));
    bencher.bench_local(|| {
        let call = ToolCall { id: Arc::from("call-1"), name: Arc::from("fake__echo"), args: f.args.clone() };
        let result = f.rt.block_on(f.executor.execute(call, &f.scope, &f.catalog));
        assert!(!result.is_error(), "{result:?}");
        divan::black_box(result);
    });
}
