//! Whole-process benchmark: wall time and peak memory of one `gdn run
//! --input` whose turn makes one `bash__exec` call against a local
//! OpenAI-compatible model server (two model requests, streamed).
//!
//! Run with `cargo bench -p gdn --bench run_turn` (add `-- 50` for 50 runs).
//! The server answers at once, so the figures are the runtime's own cost:
//! process start, bundle loading, the conversation store, two streamed model
//! calls over HTTP, one shell command, and the event log.
//!
//! `GDN_BASELINE=/path/to/an/older/gdn` times that binary too, interleaved
//! run by run with this build's (A B A B …), so both see the same machine
//! noise; each binary's peak memory is measured in runs of its own.

use std::path::{Path, PathBuf};
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
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--rss") {
        rss_child(&args[1..]);
        return;
    }
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

    let mut binaries = vec![("this build".to_owned(), PathBuf::from(env!("CARGO_BIN_EXE_gdn")))];
    if let Some(baseline) = std::env::var_os("GDN_BASELINE") {
        binaries.push(("baseline".to_owned(), PathBuf::from(baseline)));
    }
    // A state root per binary: a build with workspaces moves the old
    // layout's instances of the bundle into its workspace, which would put
    // the baseline's files (and that work) into this build's runs.
    let state_of = |index: usize| state.join(index.to_string());
    let run_once = |binary: &Path, index: usize, key: &str| {
        let started = Instant::now();
        let status = Command::new(binary)
            .arg("--state-root")
            .arg(state_of(index))
            .arg("-c")
            .arg(dir.path())
            .args(["run", "--instance-key", key, "--input", "Say hello with the shell"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display()));
        assert!(status.success(), "{} run failed", binary.display());
        started.elapsed()
    };
    let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(runs); binaries.len()];
    for run in 0..runs {
        for (index, (_, binary)) in binaries.iter().enumerate() {
            times[index].push(run_once(binary, index, &format!("bench-{index}-{run}")));
        }
    }
    assert_eq!(requests.load(Ordering::SeqCst), runs * 2 * binaries.len(), "two model requests per turn");
    for (index, (label, binary)) in binaries.iter().enumerate() {
        let peak_kib = peak_rss_kib(binary, &state_of(index), dir.path());
        let times = &mut times[index];
        times.sort();
        let median = times[times.len() / 2];
        let p90 = times[(times.len() * 9 / 10).min(times.len() - 1)];
        // This build keeps `workspaces/runner/instances/runner@<key>` (no
        // Swarm: the workspace is the agent's); a baseline from before
        // workspaces kept `instances/runner@<key>`, and before agent
        // instances the key alone.
        let instance = ["workspaces/runner/instances/runner@", "instances/runner@", "instances/"]
            .iter()
            .map(|prefix| state_of(index).join(format!("{prefix}bench-{index}-0")))
            .find(|dir| dir.is_dir())
            .unwrap_or_else(|| state_of(index).join(format!("workspaces/runner/instances/runner@bench-{index}-0")));
        let saved = messages_saved(&instance.join("messages.jsonl"));
        report(label, runs, times[0], median, p90, peak_kib, saved);
    }
}

/// The peak resident set of `binary` over three runs of its own: a helper
/// process (this bench re-run with `--rss`) spawns it and reports the
/// largest resident set of its only child.
fn peak_rss_kib(binary: &Path, state: &Path, bundle: &Path) -> i64 {
    let Ok(me) = std::env::current_exe() else { return 0 };
    (0..3)
        .filter_map(|run| {
            let output = Command::new(&me)
                .arg("--rss")
                .arg(binary)
                .arg(state)
                .arg(bundle)
                .arg(format!("rss-{run}-{}", std::process::id()))
                .output()
                .ok()?;
            String::from_utf8_lossy(&output.stdout).trim().parse::<i64>().ok()
        })
        .max()
        .unwrap_or(0)
}

/// `--rss BINARY STATE BUNDLE KEY`: run one turn and print the child's peak RSS in KiB.
fn rss_child(args: &[String]) {
    let [binary, state, bundle, key] = args else { return };
    let status = Command::new(binary)
        .args(["--state-root", state, "-c", bundle, "run", "--instance-key", key, "--input", "Say hello"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if status.is_ok_and(|s| s.success()) {
        let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN);
        let line = format!("{}\n", usage.map(|u| u.max_rss()).unwrap_or(0));
        let _ = std::io::Write::write_all(&mut std::io::stdout(), line.as_bytes());
    }
}

/// Messages a turn saved: appends in the log, whether one per line or in commits.
fn messages_saved(log: &Path) -> usize {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
            match value.get("events").and_then(serde_json::Value::as_array) {
                Some(events) => events.iter().filter(|e| e["type"] == "append").count(),
                None => 1,
            }
        })
        .sum()
}

fn report(label: &str, runs: usize, fastest: Duration, median: Duration, p90: Duration, peak_kib: i64, saved: usize) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let report = format!(
        "{label}: gdn run --input, one bash__exec call, two streamed model requests ({runs} runs)\n  fastest {:.1} ms  median {:.1} ms  p90 {:.1} ms\n  peak RSS of a gdn process: {:.1} MiB\n  messages saved per turn: {saved}\n",
        ms(fastest),
        ms(median),
        ms(p90),
        peak_kib as f64 / 1024.0
    );
    let mut stdout = std::io::stdout();
    let _ = std::io::Write::write_all(&mut stdout, report.as_bytes());
}
