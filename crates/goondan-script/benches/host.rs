//! Script host benchmarks (a plain harness: the host is a child process, so
//! the figures are medians of many sequential round trips).
//!
//! Warm measures, interleaved in rounds so the machine's noise falls on all
//! of them alike (`tests/fixtures/bench-extension`, assembled as `gdn`
//! assembles an agent):
//!
//! - a no-op script tool call through a warm host, via the executor
//!   (agent `plain`: no extension);
//! - a no-op native tool call, without and with one JavaScript toolCall
//!   layer `(ctx) => ctx.next()` in front (agents `plain` and `layered`):
//!   the difference is what one JS layer costs a call;
//! - a no-op script tool call with that layer in front (layer and tool in
//!   the same host);
//! - the same-run floors: one line through `cat` over pipes and back, and
//!   the same line through the JS runtime itself (parse and re-serialize).
//!
//! Cold starts, alternating: a host that loads no extension (first script
//! call's result), and a host that loads one (assembly, which loads the
//! extension, to the first layer-wrapped native call's result).
//!
//! Skips with a message when no JavaScript runtime is found.

#![allow(clippy::print_stdout)]

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use goondan_config::Bundle;
use goondan_core::{JsonObject, Message, ToolCall};
use goondan_runtime::agent::{AgentOptions, AgentTooling, EnvLookup, ScopeIds, assemble_tooling};
use goondan_runtime::extension::PluginInstall;
use goondan_script::{JsRuntime, ScriptPlugin};
use goondan_tools::{
    CallScope, NoopEventSink, ToolCatalog, ToolCatalogItem, ToolOutput, ToolRegistry, ToolSource, sync_handler,
};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// Samples per warm measure.
const WARM_CALLS: usize = 3000;
/// Warm measures run interleaved, `WARM_CALLS / ROUNDS` samples at a time.
const ROUNDS: usize = 30;
/// Calls per measure before any is timed.
const WARM_UP: usize = 200;
/// Cold starts of each kind.
const COLD_STARTS: usize = 15;
/// The native no-op tool every agent of the bench gets.
const NATIVE: &str = "bench__noop";
/// The script no-op tool of the fixture.
const SCRIPT: &str = "kit__noop";

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

/// The median of each measure's samples, in the order of [`Warm::ALL`].
fn medians(samples: Vec<Vec<Duration>>) -> [Duration; 6] {
    let mut out = [Duration::ZERO; 6];
    for (slot, samples) in out.iter_mut().zip(samples) {
        *slot = median(samples);
    }
    out
}

fn load_fixture() -> Bundle {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/bench-extension");
    let report = goondan_config::load_bundle(&fixture);
    match report.bundle {
        Some(bundle) if !report.has_errors() => bundle,
        _ => panic!("fixture invalid: {:?}", report.diagnostics),
    }
}

/// What `gdn` installs for a bundle's own code (script tools and JavaScript
/// extensions in one host, the runtime given), plus a native no-op tool.
fn options(agent: &str, runtime: &JsRuntime) -> AgentOptions {
    let mut options = AgentOptions::new(Arc::new(NoopEventSink));
    options.agent = Some(agent.to_owned());
    options.plugins = vec![Arc::new(NativeNoop), Arc::new(ScriptPlugin::with_runtime(runtime.clone()))];
    options
}

/// The native no-op tool, installed as a plugin like gdn's native tools.
#[derive(Clone)]
struct NativeNoop;

impl PluginInstall for NativeNoop {
    fn install_tools(
        &mut self,
        registry: &ToolRegistry,
        _: &goondan_tools::assembly::AgentTools,
        _: &EnvLookup,
    ) -> Result<(), goondan_tools::RegistryError> {
        registry.register(
            ToolCatalogItem::new(NATIVE, ToolSource::config("bench")),
            sync_handler(|_, _| Ok(ToolOutput::Value(Value::Null))),
        )
    }
}

/// An assembled agent's tooling, with the catalog and scope of one step.
struct Agent {
    tooling: AgentTooling,
    catalog: Arc<ToolCatalog>,
    scope: Arc<CallScope>,
}

impl Agent {
    async fn assemble(bundle: &Bundle, name: &str, runtime: &JsRuntime) -> Self {
        let tooling =
            assemble_tooling(bundle, &options(name, runtime)).await.unwrap_or_else(|e| panic!("assemble {name}: {e}"));
        let mut catalog = tooling.base_catalog();
        catalog.insert(ToolCatalogItem::new(NATIVE, ToolSource::config("bench")));
        let calls =
            vec![ToolCall::new("bench", NATIVE, JsonObject::new()), ToolCall::new("bench", SCRIPT, JsonObject::new())];
        let scope = tooling.call_scope(&ScopeIds::detached(), Arc::new(Message::assistant_tool_calls("step", calls)));
        Self { tooling, catalog: Arc::new(catalog), scope }
    }

    async fn call(&self, tool: &str) {
        let call = ToolCall::new("bench", tool, JsonObject::new());
        let result = self.tooling.executor.execute(call, &self.scope, &self.catalog).await;
        assert!(!result.is_error(), "{tool}: {result:?}");
    }

    async fn timed(&self, tool: &str) -> Duration {
        let started = Instant::now();
        self.call(tool).await;
        started.elapsed()
    }
}

/// A child that echoes lines back, kept running across rounds.
struct Echo {
    _child: Child,
    input: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Echo {
    const LINE: &[u8] =
        b"{\"type\":\"call\",\"id\":1,\"module\":\"/x/kit.ts\",\"export\":\"noop\",\"input\":{},\"ctx\":{}}\n";

    fn spawn(mut command: tokio::process::Command) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("echo child: {e}"));
        let (Some(input), Some(output)) = (child.stdin.take(), child.stdout.take()) else { panic!("echo pipes") };
        Self { _child: child, input, lines: BufReader::new(output).lines() }
    }

    /// The raw IPC floor: one line through `cat` over pipes and back.
    fn cat() -> Self {
        Self::spawn(tokio::process::Command::new("cat"))
    }

    /// The JS runtime's own floor: the same frame line through a script
    /// that parses and re-serializes it over stdin/stdout, as the host does
    /// per frame.
    fn runtime(runtime: &JsRuntime) -> Self {
        const ECHO: &str = "let b='';process.stdin.setEncoding('utf8');process.stdin.on('data',d=>{b+=d;let i;\
            while((i=b.indexOf('\\n'))>=0){const l=b.slice(0,i);b=b.slice(i+1);\
            process.stdout.write(JSON.stringify(JSON.parse(l))+'\\n');}});";
        let mut command = tokio::process::Command::new(&runtime.path);
        command.args(["-e", ECHO]);
        Self::spawn(command)
    }

    async fn timed(&mut self) -> Duration {
        let started = Instant::now();
        self.input.write_all(Self::LINE).await.unwrap_or_else(|e| panic!("{e}"));
        self.lines.next_line().await.unwrap_or_else(|e| panic!("{e}"));
        started.elapsed()
    }
}

/// The warm measures, in the order each round runs them.
#[derive(Clone, Copy)]
enum Warm {
    ScriptPlain,
    NativePlain,
    NativeLayered,
    ScriptLayered,
    Pipe,
    RuntimeEcho,
}

impl Warm {
    const ALL: [Self; 6] =
        [Self::ScriptPlain, Self::NativePlain, Self::NativeLayered, Self::ScriptLayered, Self::Pipe, Self::RuntimeEcho];
}

struct Subjects {
    plain: Agent,
    layered: Agent,
    pipe: Echo,
    echo: Echo,
}

impl Subjects {
    async fn timed(&mut self, measure: Warm) -> Duration {
        match measure {
            Warm::ScriptPlain => self.plain.timed(SCRIPT).await,
            Warm::NativePlain => self.plain.timed(NATIVE).await,
            Warm::NativeLayered => self.layered.timed(NATIVE).await,
            Warm::ScriptLayered => self.layered.timed(SCRIPT).await,
            Warm::Pipe => self.pipe.timed().await,
            Warm::RuntimeEcho => self.echo.timed().await,
        }
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-9)
}

fn main() {
    let Ok(runtime) = JsRuntime::discover(&|name: &str| std::env::var(name).ok()) else {
        println!("host bench skipped: no JavaScript runtime (install Bun or set GOONDAN_JS_RUNTIME)");
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| panic!("{e}"));
    rt.block_on(async {
        println!("runtime: {runtime}");
        let bundle = load_fixture();
        let mut subjects = Subjects {
            plain: Agent::assemble(&bundle, "plain", &runtime).await,
            layered: Agent::assemble(&bundle, "layered", &runtime).await,
            pipe: Echo::cat(),
            echo: Echo::runtime(&runtime),
        };
        for measure in Warm::ALL {
            for _ in 0..WARM_UP {
                subjects.timed(measure).await;
            }
        }
        let mut samples: Vec<Vec<Duration>> = Warm::ALL.iter().map(|_| Vec::with_capacity(WARM_CALLS)).collect();
        for _ in 0..ROUNDS {
            for (at, measure) in Warm::ALL.into_iter().enumerate() {
                for _ in 0..WARM_CALLS / ROUNDS {
                    let took = subjects.timed(measure).await;
                    samples[at].push(took);
                }
            }
        }
        let [script, native, native_layered, script_layered, pipe, echo] = medians(samples);

        println!("medians of {WARM_CALLS} each, interleaved in {ROUNDS} rounds:");
        println!("raw pipe round trip through cat: {pipe:?}");
        println!("the runtime's own JSON echo over stdin/stdout: {echo:?}");
        let line = |what: &str, took: Duration| {
            println!(
                "{what}: {took:?} ({:.1}x the pipe, {:.2}x the runtime's echo)",
                ratio(took, pipe),
                ratio(took, echo)
            );
        };
        line("no-op script tool call, warm host", script);
        line("no-op native tool call, no JS layer", native);
        line("no-op native tool call through one JS toolCall layer", native_layered);
        line("no-op script tool call through one JS toolCall layer", script_layered);
        let layer = native_layered.saturating_sub(native);
        println!(
            "one JS toolCall layer (native with layer - native without): {layer:?} = 2 round trips of {:.1} µs each \
             ({:.1}x the pipe, {:.2}x the runtime's echo per round trip)",
            micros(layer) / 2.0,
            ratio(layer, pipe) / 2.0,
            ratio(layer, echo) / 2.0
        );
        let layer_script = script_layered.saturating_sub(script);
        println!(
            "the layer in front of a script call (script with layer - script without): {layer_script:?} \
             ({:.1}x the pipe, {:.2}x the runtime's echo per round trip)",
            ratio(layer_script, pipe) / 2.0,
            ratio(layer_script, echo) / 2.0
        );

        let mut cold = Vec::with_capacity(COLD_STARTS);
        let mut cold_loaded = Vec::with_capacity(COLD_STARTS);
        let mut cold_layered = Vec::with_capacity(COLD_STARTS);
        for _ in 0..COLD_STARTS {
            let fresh = Agent::assemble(&bundle, "plain", &runtime).await;
            cold.push(fresh.timed(SCRIPT).await);
            drop(fresh);

            let started = Instant::now();
            let fresh = Agent::assemble(&bundle, "layered", &runtime).await;
            cold_loaded.push(started.elapsed());
            fresh.call(NATIVE).await;
            cold_layered.push(started.elapsed());
        }
        println!("host cold start to first result (median of {COLD_STARTS}): {:?}", median(cold));
        println!(
            "host cold start with one extension, assembly to first layered result (median of {COLD_STARTS}): {:?} \
             (extension loaded at {:?})",
            median(cold_layered),
            median(cold_loaded)
        );
    });
}
