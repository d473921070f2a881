//! Script host benchmarks (a plain harness: the host is a child process, so
//! the figures are medians of many sequential round trips).
//!
//! - a no-op script tool call through a warm host, via the executor;
//! - the same-run baseline: one line through `cat` over pipes and back;
//! - host cold start to the first result (start, connect, import, call).
//!
//! Skips with a message when no JavaScript runtime is found.

#![allow(clippy::print_stdout)]

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use goondan_core::{JsonObject, Message, ToolCall};
use goondan_script::{JsRuntime, ScriptHost, install_script_tools};
use goondan_tools::assembly::AgentTools;
use goondan_tools::{CallScope, ToolExecutor, ToolRegistry};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

const WARM_CALLS: usize = 3000;
const COLD_STARTS: usize = 15;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

struct Setup {
    executor: ToolExecutor,
    catalog: Arc<goondan_tools::ToolCatalog>,
    scope: Arc<CallScope>,
}

fn setup(host: &Arc<ScriptHost>) -> Setup {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/script-tools");
    let report = goondan_config::load_bundle(&fixture);
    let bundle = report.valid_bundle().unwrap_or_else(|| panic!("fixture invalid: {:?}", report.diagnostics));
    let agent = bundle.agent("scripter").unwrap_or_else(|| panic!("no agent"));
    let tools = AgentTools::for_agent(bundle, agent);
    let registry = Arc::new(ToolRegistry::new());
    install_script_tools(&registry, &tools, host).unwrap_or_else(|e| panic!("{e}"));
    let catalog = Arc::new(tools.step_catalog(&registry));
    let call = ToolCall::new("bench", "kit__noop", JsonObject::new());
    let scope = Arc::new(CallScope {
        agent_name: "scripter".into(),
        instance_key: "bench".into(),
        turn_id: "turn".into(),
        step_id: "step".into(),
        step_index: 0,
        message: Arc::new(Message::assistant_tool_calls("step", vec![call])),
        workdir: Arc::from(std::env::temp_dir().as_path()),
        trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
        step_span_id: "b7ad6b7169203331".into(),
        runtime: None,
    });
    Setup { executor: ToolExecutor::new(registry), catalog, scope }
}

async fn noop(setup: &Setup) {
    let call = ToolCall::new("bench", "kit__noop", JsonObject::new());
    let result = setup.executor.execute(call, &setup.scope, &setup.catalog).await;
    assert!(!result.is_error(), "{result:?}");
}

/// Median round trip of one frame line through a child that echoes lines
/// (after 100 warm-up round trips).
async fn echo_round_trips(mut command: tokio::process::Command, n: usize) -> Duration {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("echo child: {e}"));
    let (Some(mut input), Some(output)) = (child.stdin.take(), child.stdout.take()) else { panic!("echo pipes") };
    let mut lines = BufReader::new(output).lines();
    let line = b"{\"type\":\"call\",\"id\":1,\"module\":\"/x/kit.ts\",\"export\":\"noop\",\"input\":{},\"ctx\":{}}\n";
    let mut samples = Vec::with_capacity(n);
    for round in 0..n + 100 {
        let started = Instant::now();
        input.write_all(line).await.unwrap_or_else(|e| panic!("{e}"));
        lines.next_line().await.unwrap_or_else(|e| panic!("{e}"));
        if round >= 100 {
            samples.push(started.elapsed());
        }
    }
    median(samples)
}

/// The raw IPC floor: one line through `cat` over pipes and back.
async fn pipe_round_trips(n: usize) -> Duration {
    echo_round_trips(tokio::process::Command::new("cat"), n).await
}

/// The JS runtime's own floor: the same frame line through a script that
/// parses and re-serializes it over stdin/stdout, as the host does per call.
async fn runtime_echo_round_trips(runtime: &JsRuntime, n: usize) -> Duration {
    const ECHO: &str = "let b='';process.stdin.setEncoding('utf8');process.stdin.on('data',d=>{b+=d;let i;\
        while((i=b.indexOf('\\n'))>=0){const l=b.slice(0,i);b=b.slice(i+1);\
        process.stdout.write(JSON.stringify(JSON.parse(l))+'\\n');}});";
    let mut command = tokio::process::Command::new(&runtime.path);
    command.args(["-e", ECHO]);
    echo_round_trips(command, n).await
}

fn main() {
    let Ok(runtime) = JsRuntime::discover(&|name: &str| std::env::var(name).ok()) else {
        println!("host bench skipped: no JavaScript runtime (install Bun or set GOONDAN_JS_RUNTIME)");
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| panic!("{e}"));
    rt.block_on(async {
        println!("runtime: {runtime}");
        let host = ScriptHost::with_runtime(runtime.clone());
        let warm = setup(&host);
        for _ in 0..200 {
            noop(&warm).await;
        }
        let mut samples = Vec::with_capacity(WARM_CALLS);
        for _ in 0..WARM_CALLS {
            let started = Instant::now();
            noop(&warm).await;
            samples.push(started.elapsed());
        }
        let call = median(samples);
        let pipe = pipe_round_trips(WARM_CALLS).await;
        println!("no-op script tool call, warm host (median of {WARM_CALLS}): {call:?}");
        println!("raw pipe round trip through cat (median of {WARM_CALLS}): {pipe:?}");
        println!("ratio to the pipe: {:.1}x", call.as_secs_f64() / pipe.as_secs_f64().max(1e-9));
        let echo = runtime_echo_round_trips(&runtime, WARM_CALLS).await;
        println!("the runtime's own JSON echo over stdin/stdout (median of {WARM_CALLS}): {echo:?}");
        println!("ratio to the runtime's echo: {:.2}x", call.as_secs_f64() / echo.as_secs_f64().max(1e-9));

        let mut cold = Vec::with_capacity(COLD_STARTS);
        for _ in 0..COLD_STARTS {
            let host = ScriptHost::with_runtime(runtime.clone());
            let fresh = setup(&host);
            let started = Instant::now();
            noop(&fresh).await;
            cold.push(started.elapsed());
        }
        println!("host cold start to first result (median of {COLD_STARTS}): {:?}", median(cold));
    });
}
