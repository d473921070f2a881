//! Whole-process benchmark: wall time and peak memory of one `gdn run
//! --input` whose turn makes one `bash__exec` call against a local
//! OpenAI-compatible model server (two model requests, streamed).
//!
//! Run with `cargo bench -p gdn --bench run_turn` (add `-- 50` for 50 runs).
//! The server answers at once, so the figures are the runtime's own cost:
//! process start, bundle loading, the conversation store, two streamed model
//! calls over HTTP, one shell command, and the event log.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::post;

fn sse(events: &[serde_json::Value]) -> String {
    let mut body = String::new();
    for event in events {
        body.push_str(&format!("data: {event}\n\n"));
    }
    body.push_str("data: [DONE]\n\n");
    body
}

async fn completions(requests: Arc<AtomicUsize>, body: Bytes) -> impl IntoResponse {
    requests.fetch_add(1, Ordering::SeqCst);
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let answered = request["messages"].as_array().and_then(|m| m.last()).is_some_and(|m| m["role"] == "tool");
    let chunk = |delta: serde_json::Value, finish: Option<&str>| {
        serde_json::json!({"id": "c", "object": "chat.completion.chunk", "model": "bench",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let events = if answered {
        vec![
            chunk(serde_json::json!({"role": "assistant", "content": "The command printed "}), None),
            chunk(serde_json::json!({"content": "hello."}), None),
            chunk(serde_json::json!({}), Some("stop")),
            serde_json::json!({"id": "c", "choices": [], "usage": {"prompt_tokens": 60, "completion_tokens": 5}}),
        ]
    } else {
        vec![
            chunk(
                serde_json::json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                "function": {"name": "bash__exec", "arguments": ""}}]}),
                None,
            ),
            chunk(
                serde_json::json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"command\": \"echo hello\"}"}}]}),
                None,
            ),
            chunk(serde_json::json!({}), Some("tool_calls")),
            serde_json::json!({"id": "c", "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 9}}),
        ]
    };
    ([(header::CONTENT_TYPE, "text/event-stream")], sse(&events))
}

fn main() {
    let runs: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(20);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build();
    let Ok(runtime) = runtime else { panic!("runtime") };
    let requests = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&requests);
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap_or_else(|e| panic!("{e}"));
    let address = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let app =
        Router::new().route("/v1/chat/completions", post(move |body: Bytes| completions(Arc::clone(&counter), body)));
    runtime.spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let bundle = format!(
        "apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {{name: local}}\nspec:\n  provider: openai\n  model: bench\n  endpoint: http://{address}/v1\n  apiKey: {{value: bench-key}}\n---\n\
apiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: runner}}\nspec:\n  modelConfig: {{modelRef: Model/local}}\n  prompt: {{system: Run commands.}}\n  tools:\n    - {{kind: Tool, name: bash, package: \"@goondan/base\"}}\n"
    );
    std::fs::write(dir.path().join("goondan.yaml"), bundle).unwrap_or_else(|e| panic!("{e}"));
    let state = dir.path().join("state");

    let mut times = Vec::with_capacity(runs);
    for run in 0..runs {
        let started = Instant::now();
        let status = Command::new(env!("CARGO_BIN_EXE_gdn"))
            .arg("--state-root")
            .arg(&state)
            .arg("-c")
            .arg(dir.path())
            .args(["run", "--instance-key", &format!("bench-{run}"), "--input", "Say hello with the shell"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("spawn gdn: {e}"));
        times.push(started.elapsed());
        assert!(status.success(), "gdn run failed");
    }
    assert_eq!(requests.load(Ordering::SeqCst), runs * 2, "two model requests per turn");
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN);
    let peak_kib = usage.map(|u| u.max_rss()).unwrap_or(0);
    times.sort();
    let median = times[times.len() / 2];
    let p90 = times[(times.len() * 9 / 10).min(times.len() - 1)];
    let fastest = times[0];
    report(runs, fastest, median, p90, peak_kib, &state);
}

fn report(runs: usize, fastest: Duration, median: Duration, p90: Duration, peak_kib: i64, state: &Path) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let lines =
        std::fs::read_to_string(state.join("instances/bench-0/messages.jsonl")).unwrap_or_default().lines().count();
    let report = format!(
        "gdn run --input, one bash__exec call, two streamed model requests ({runs} runs)\n  fastest {:.1} ms  median {:.1} ms  p90 {:.1} ms\n  peak RSS of a gdn process: {:.1} MiB\n  messages saved per turn: {lines}\n",
        ms(fastest),
        ms(median),
        ms(p90),
        peak_kib as f64 / 1024.0
    );
    let mut stdout = std::io::stdout();
    let _ = std::io::Write::write_all(&mut stdout, report.as_bytes());
}
