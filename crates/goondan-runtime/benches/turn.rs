//! The runtime's own overhead per step, excluding the model and the tools
//! (see `docs/BENCHMARKS.md`).
//!
//! A turn of two steps — a reply with one tool call, then a text answer — is
//! run against a model that hands back prebuilt replies at once and a tool
//! whose handler does nothing. What is measured is the loop itself: the
//! step's catalog, step middleware, building the model request from the
//! conversation, parsing the calls, the executor pipeline, the result
//! messages, events and the per-step commits (to a store that keeps nothing).

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;

use divan::Bencher;
use goondan_core::{ConversationState, MessageData};
use goondan_llm::provider::{BoxFuture, StreamSink};
use goondan_llm::{ModelError, ModelProvider, ModelRequest, ModelResponse, RawToolCall, StopReason};
use goondan_runtime::AgentTooling;
use goondan_runtime::conversation::Conversation;
use goondan_runtime::turn::{Agent, TurnObserver};
use goondan_tools::assembly::AgentTools;
use goondan_tools::events::{EventSink, RuntimeEvent};
use goondan_tools::{ToolCatalogItem, ToolExecutor, ToolOutput, ToolRegistry, ToolSource, sync_handler};
use serde_json::{Value, json};
use tokio::sync::watch;

fn main() {
    // `TURN_IR=PRIOR:TURNS` runs TURNS turns on a conversation of PRIOR
    // earlier turns and exits, for counting instructions with callgrind
    // (`--toggle-collect='tokio::runtime::runtime::Runtime::block_on*'`;
    // the difference between two TURNS counts is the cost of the extra turns).
    // With TURN_OTEL=1 the counted turns export their spans (to a local
    // receiver started here), as an agent process does with the OTEL_*
    // variables set.
    if let Ok(spec) = std::env::var("TURN_IR") {
        let mut parts = spec.split(':').map(|n| n.parse::<usize>().unwrap_or(0));
        let traced = std::env::var("TURN_OTEL").is_ok_and(|v| v == "1");
        counted_turns(parts.next().unwrap_or(0), parts.next().unwrap_or(1), traced);
        return;
    }
    // `TURN_SPACED=N` times N turns 2 ms apart with tracing off, then on
    // (the exporter keeps up between turns, as with a real model's
    // latency), and prints each's median and 90th percentile.
    // `TURN_STORE=TURNS` runs TURNS turns of one conversation saved to an
    // instance store in a temporary directory, with the agent process's
    // event log, for counting what a turn's files cost (callgrind without
    // `--toggle-collect`: the writer thread and the blocking pool count
    // too; the difference between two TURNS counts is the extra turns').
    if let Ok(count) = std::env::var("TURN_STORE") {
        stored_turns(count.parse().unwrap_or(1));
        return;
    }
    if let Ok(count) = std::env::var("TURN_SPACED") {
        spaced_turns(count.parse().unwrap_or(500));
        return;
    }
    divan::Divan::default().sample_count(500).config_with_args().main();
}

#[allow(clippy::print_stdout)]
fn spaced_turns(count: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| panic!("{e}"));
    let (_cancel, cancelled) = watch::channel(false);
    for traced in [false, true] {
        let exporter = traced.then(exporter);
        let agent = agent_with(exporter.as_ref());
        let state = after_turns(&runtime, &agent, 0, &cancelled);
        let mut times = Vec::with_capacity(count);
        for _ in 0..count {
            std::thread::sleep(std::time::Duration::from_millis(2));
            let mut conversation = Conversation::unsaved(state.clone());
            let started = std::time::Instant::now();
            let outcome = runtime.block_on(agent.run_turn(&mut conversation, "go", &Quiet, cancelled.clone()));
            times.push(started.elapsed());
            assert_eq!(outcome.steps, 2);
        }
        times.sort();
        let dropped = exporter.as_ref().map_or(0, |e| e.stats().dropped.load(std::sync::atomic::Ordering::Relaxed));
        println!(
            "tracing {}: median {:?}, p90 {:?} ({count} turns, {dropped} spans dropped)",
            if traced { "on " } else { "off" },
            times[count / 2],
            times[count * 9 / 10]
        );
    }
}

/// The conversation after `prior` turns, as a long-running agent holds it
/// between turns (its rule already checked); a conversation freshly loaded
/// from disk pays one full check at its first turn.
fn after_turns(
    runtime: &tokio::runtime::Runtime,
    agent: &Agent,
    prior: usize,
    cancelled: &watch::Receiver<bool>,
) -> ConversationState {
    let mut conversation = Conversation::in_memory(Vec::new());
    for _ in 0..prior {
        runtime.block_on(agent.run_turn(&mut conversation, "warm up", &Quiet, cancelled.clone()));
    }
    conversation.state().clone()
}

fn counted_turns(prior: usize, turns: usize, traced: bool) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| panic!("{e}"));
    let exporter = traced.then(exporter);
    let agent = agent_with(exporter.as_ref());
    let (_cancel, cancelled) = watch::channel(false);
    let state = after_turns(&runtime, &agent, prior, &cancelled);
    for _ in 0..turns {
        let mut conversation = Conversation::unsaved(state.clone());
        let outcome = runtime.block_on(agent.run_turn(&mut conversation, "go", &Quiet, cancelled.clone()));
        assert_eq!(outcome.steps, 2);
        black_box(conversation);
    }
    if let Some(exporter) = exporter {
        assert!(exporter.flush(std::time::Duration::from_secs(10)), "the spans were sent");
        let stats = exporter.stats();
        assert!(stats.exported.load(std::sync::atomic::Ordering::Relaxed) > 0);
    }
}

/// `turns` turns of one conversation in an instance store, events in its
/// event log and the original's runtime-event records beside it, as an
/// agent process writes them.
fn stored_turns(turns: usize) {
    use goondan_runtime::InstanceLog;
    use goondan_runtime::store::{InstanceStore, Workspace};
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let root = Workspace::at(dir.path());
    let store = InstanceStore::open(&root, "bench", "bench", Path::new("/bench/goondan.yaml"))
        .unwrap_or_else(|e| panic!("{e}"));
    let loaded = store.load().unwrap_or_else(|e| panic!("{e}"));
    let log = store.event_writer().unwrap_or_else(|e| panic!("{e}"));
    let export = store.runtime_events_export().unwrap_or_else(|e| panic!("{e}"));
    let events: Arc<dyn EventSink> =
        Arc::new(goondan_tools::JsonLinesEventSink::with_export(log, export).unwrap_or_else(|e| panic!("{e}")));
    let agent = agent_with_events(events);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| panic!("{e}"));
    let (_cancel, cancelled) = watch::channel(false);
    let mut conversation = Conversation::new(loaded.state, Arc::new(InstanceLog::new(store, loaded.events_on_disk)));
    for _ in 0..turns {
        let outcome = runtime.block_on(agent.run_turn(&mut conversation, "go", &Quiet, cancelled.clone()));
        assert_eq!(outcome.steps, 2);
    }
}

/// An exporter to a receiver on 127.0.0.1 that answers every request 200
/// (read and dropped: what is measured is the agent's side).
fn exporter() -> goondan_telemetry::Exporter {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let address = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                    break;
                }
                if let Some((key, value)) = line.trim_end().split_once(':')
                    && key.eq_ignore_ascii_case("content-length")
                {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            let _ = (&stream).write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    let base = format!("http://{address}");
    let lookup = |name: &str| match name {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some(base.clone()),
        "OTEL_BSP_SCHEDULE_DELAY" => Some("200".to_owned()),
        _ => None,
    };
    let config =
        goondan_telemetry::TelemetryConfig::from_env(&lookup).ok().flatten().unwrap_or_else(|| panic!("config"));
    goondan_telemetry::Exporter::start(config).unwrap_or_else(|e| panic!("{e}"))
}

/// Replies instantly: a tool call while the turn has no tool result yet, then text.
#[derive(Debug)]
struct Instant {
    call: ModelResponse,
    answer: ModelResponse,
}

impl ModelProvider for Instant {
    fn complete<'a>(
        &'a self,
        request: &'a ModelRequest,
        _on_event: StreamSink<'a>,
    ) -> BoxFuture<'a, Result<ModelResponse, ModelError>> {
        let answered = matches!(request.messages.last(), Some(MessageData::Tool { .. }));
        let reply = if answered { self.answer.clone() } else { self.call.clone() };
        Box::pin(std::future::ready(Ok(reply)))
    }

    fn name(&self) -> &str {
        "instant"
    }
}

struct Subscriber;

impl EventSink for Subscriber {
    fn emit(&self, event: &RuntimeEvent<'_>) {
        black_box(event);
    }
}

struct Quiet;

impl TurnObserver for Quiet {}

/// The bench's agent; its events also feed `exporter`'s spans when given.
fn agent_with(exporter: Option<&goondan_telemetry::Exporter>) -> Agent {
    let events: Arc<dyn EventSink> = match exporter {
        Some(exporter) => Arc::new(goondan_tools::FanoutEventSink::new(vec![
            Arc::new(Subscriber),
            Arc::new(goondan_telemetry::TelemetrySink::new(exporter.clone())),
        ])),
        None => Arc::new(Subscriber),
    };
    agent_with_events(events)
}

/// The bench's agent, its events going to `events`.
fn agent_with_events(events: Arc<dyn EventSink>) -> Agent {
    let registry = ToolRegistry::new();
    let item = ToolCatalogItem::new("noop__run", ToolSource::extension("bench")).with_parameters(json!({
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"], "additionalProperties": false
    }));
    registry.register(item, sync_handler(|_, _| Ok(ToolOutput::Value(Value::Null)))).unwrap_or_else(|e| panic!("{e}"));
    let provider = Instant {
        call: ModelResponse {
            text: None,
            tool_calls: vec![RawToolCall {
                id: "call_1".into(),
                name: "noop__run".into(),
                arguments: r#"{"command":"ls"}"#.into(),
            }],
            stop_reason: Some(StopReason::ToolUse),
            usage: Default::default(),
        },
        answer: ModelResponse {
            text: Some("done".into()),
            stop_reason: Some(StopReason::EndTurn),
            ..Default::default()
        },
    };
    let executor = ToolExecutor::new(Arc::new(registry)).with_events(Arc::clone(&events));
    let tooling = AgentTooling::new("bench", "bench", Path::new("/tmp"), AgentTools::default(), executor, events);
    let mut agent = Agent::new(tooling, Arc::new(provider));
    agent.system_prompt = Some("You are fast.".into());
    agent
}

/// One two-step turn on a conversation that already holds `prior` turns.
#[divan::bench(args = [0, 50])]
fn two_step_turn(bencher: Bencher<'_, '_>, prior: usize) {
    turns(bencher, prior, None);
}

/// The same turn with its spans exported over OTLP to a local receiver
/// (the exporter's queue, thread and HTTP requests running beside it).
#[divan::bench(args = [0, 50])]
fn two_step_turn_traced(bencher: Bencher<'_, '_>, prior: usize) {
    let exporter = exporter();
    turns(bencher, prior, Some(&exporter));
}

fn turns(bencher: Bencher<'_, '_>, prior: usize, exporter: Option<&goondan_telemetry::Exporter>) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| panic!("{e}"));
    let agent = agent_with(exporter);
    let (_cancel, cancelled) = watch::channel(false);
    let state = after_turns(&runtime, &agent, prior, &cancelled);
    bencher.with_inputs(|| Conversation::unsaved(state.clone())).bench_local_values(|mut conversation| {
        let outcome = runtime.block_on(agent.run_turn(&mut conversation, "go", &Quiet, cancelled.clone()));
        assert_eq!(outcome.steps, 2);
        conversation
    });
}
