//! Connectors users write, run in a real JavaScript host (Bun): their
//! events reach the sink with their keys, `emit` settles only after the
//! sink answered, config and secrets reach `ctx` (and not the process's
//! environment), logs are redacted, failures restart and a clean return
//! does not, stop ends the host, and so does a SIGKILL of its owner.
//! Each fixture is a small connector written into a temporary bundle.

mod common;

use goondan_core::sync::LockUnpoisoned;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::runtime_or_skip;
use goondan_ingress::{
    Accepted, ConnectorContext, ConnectorError, Delivery, EventSink, MemorySink, RunningConnector, SecretMap, SinkError,
};
use goondan_script::{JsRuntime, ScriptConnector, connector};
use goondan_test_support::Captured;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const SECRET: &str = "xoxb-s3cr3t-7f1c2a";

/// A bundle directory and, beside it, the one directory its connectors may
/// write besides their own ([`spec`] makes it writable): they run confined.
struct Fixture {
    root: tempfile::TempDir,
}

impl Fixture {
    /// The bundle directory.
    fn path(&self) -> PathBuf {
        self.root.path().join("bundle")
    }

    /// `name` in the directory the connectors may write.
    fn out(&self, name: &str) -> PathBuf {
        self.root.path().join("out").join(name)
    }
}

/// A bundle directory holding `files`.
fn bundle(files: &[(&str, &str)]) -> std::io::Result<Fixture> {
    let root = tempfile::tempdir()?;
    std::fs::create_dir(root.path().join("out"))?;
    for (name, text) in files {
        let path = root.path().join("bundle").join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, text)?;
    }
    Ok(Fixture { root })
}

fn context(config: &[(&str, String)], sink: Arc<dyn EventSink>) -> (ConnectorContext, CancellationToken) {
    let stop = CancellationToken::new();
    let ctx = ConnectorContext {
        connection: "my-conn".into(),
        connector: "my-connector".into(),
        config: config.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect(),
        secrets: SecretMap::new(BTreeMap::from([("BOT_TOKEN".to_owned(), SECRET.to_owned())])),
        sink,
        stop: stop.clone(),
        input: None,
    };
    (ctx, stop)
}

/// The connector `entry` of the bundle `dir` (of a [`Fixture`]), confined,
/// also writing the fixture's `out` directory.
fn spec(dir: &Path, entry: &str, runtime: &JsRuntime) -> ScriptConnector {
    ScriptConnector::new(dir, entry)
        .with_writable(vec![dir.with_file_name("out")])
        .with_runtime(runtime.clone())
        .with_restart_delays(Duration::from_millis(50), Duration::from_millis(200))
        .with_stop_grace(Duration::from_secs(1))
}

async fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    done()
}

async fn finish(running: RunningConnector, limit: Duration) -> Result<Result<(), ConnectorError>, String> {
    match tokio::time::timeout(limit, running.task).await {
        Ok(Ok(result)) => Ok(result),
        Ok(Err(join)) => Err(format!("the connector task panicked: {join}")),
        Err(_) => Err(format!("the connector task did not end within {limit:?}")),
    }
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map(|text| text.lines().count()).unwrap_or(0)
}

/// Whether `pid` is gone (or a zombie waiting for a reaper that is not us).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

const EMITTER: &str = r#"
import { appendFileSync } from 'node:fs';
export default async function run(ctx) {
  appendFileSync(ctx.config.STARTS_FILE, 'start\n');
  const secret = ctx.secrets.BOT_TOKEN;
  const inEnv = Object.entries(process.env).some(([k, v]) => k.includes(secret) || String(v).includes(secret));
  const inArgv = process.argv.some((arg) => arg.includes(secret));
  const event = (text, properties) => ({
    name: 'user_message',
    message: { type: 'text', text },
    properties,
    instanceKey: `demo:${ctx.config.CHANNEL}`,
  });
  const first = await ctx.emit(event('hello', { channel: ctx.config.CHANNEL, n: 1, bot: false }), { deliveryKey: 'update-1' });
  const again = await ctx.emit(event('hello', { channel: ctx.config.CHANNEL }), { deliveryKey: 'update-1' });
  await ctx.emit(event('facts', {
    secret_seen: String(secret === ctx.secrets.BOT_TOKEN && secret.length > 0),
    secret_length: secret.length,
    secret_in_env: String(inEnv),
    secret_in_argv: String(inArgv),
    first_duplicate: String(first.duplicate),
    again_duplicate: String(again.duplicate),
    connection: ctx.connectionName,
  }));
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_the_sink_with_keys_and_config_and_secrets_reach_ctx_only() -> TestResult {
    let Some(runtime) = runtime_or_skip("connector events") else { return Ok(()) };
    let dir = bundle(&[("connectors/emitter.ts", EMITTER)])?;
    let starts = dir.out("starts");
    let sink = Arc::new(MemorySink::new());
    let (ctx, _stop) = context(
        &[("CHANNEL", "c-42".into()), ("STARTS_FILE", starts.display().to_string())],
        Arc::clone(&sink) as Arc<dyn EventSink>,
    );
    let running = connector::start(spec(&dir.path(), "./connectors/emitter.ts", &runtime), ctx).await?;
    // run() returns after its emits: the connector is done, not restarted.
    finish(running, Duration::from_secs(20)).await??;
    let stored = sink.stored();
    assert_eq!(stored.len(), 2, "{stored:?}");
    assert_eq!(stored[0].key.as_deref(), Some("update-1"));
    assert_eq!(stored[0].event.instance_key, "demo:c-42");
    assert_eq!(stored[0].event.message.input_text(), "hello");
    assert_eq!(stored[0].event.properties["channel"], "c-42");
    assert_eq!(stored[0].event.properties["n"], "1");
    assert_eq!(stored[0].event.properties["bot"], "false");
    assert_eq!(stored[1].key, None);
    let facts = &stored[1].event.properties;
    assert_eq!(facts["secret_seen"], "true");
    assert_eq!(facts["secret_length"], SECRET.len().to_string());
    assert_eq!(facts["secret_in_env"], "false");
    assert_eq!(facts["secret_in_argv"], "false");
    assert_eq!(facts["first_duplicate"], "false");
    assert_eq!(facts["again_duplicate"], "true");
    assert_eq!(facts["connection"], "my-conn");
    // The barrier is `finish` above: the connector's task ended, so nothing
    // can start it again after this count (a restart on return would have
    // kept the task running, and `finish` would have failed).
    assert_eq!(lines(&starts), 1, "a connector whose run() returned was started again");
    Ok(())
}

/// A sink that holds every accept until it is released.
#[derive(Default)]
struct GatedSink {
    inner: MemorySink,
    arrived: Mutex<usize>,
    gate: Notify,
}

#[async_trait]
impl EventSink for GatedSink {
    async fn accept(&self, deliveries: Vec<Delivery>) -> Result<Vec<Accepted>, SinkError> {
        *self.arrived.lock_unpoisoned() += 1;
        self.gate.notified().await;
        self.inner.accept(deliveries).await
    }
}

/// Emits `one`, then `two` once `one` settled. Asked (the file `PROBE`
/// appears) while the test holds the sink, it writes to `ANSWER` whether
/// `one` had settled by then: the question comes after the sink was
/// entered, so an answer sent early is in by then (`setImmediate` runs
/// after the pending I/O of the loop's turn).
const AWAITING: &str = r#"
import { existsSync, writeFileSync } from 'node:fs';
export default async function run(ctx) {
  const event = (text) => ({ name: 'm', message: { type: 'text', text }, instanceKey: 'k' });
  let settled = false;
  const first = ctx.emit(event('one')).then(() => { settled = true; });
  await new Promise((resolve) => {
    const poll = setInterval(() => {
      if (existsSync(ctx.config.PROBE)) { clearInterval(poll); setImmediate(resolve); }
    }, 5);
  });
  writeFileSync(ctx.config.ANSWER, settled ? 'settled' : 'pending');
  await first;
  await ctx.emit(event('two'));
  await new Promise(() => {});
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emit_resolves_only_after_the_sink_stored_the_event() -> TestResult {
    let Some(runtime) = runtime_or_skip("connector emit waits") else { return Ok(()) };
    let dir = bundle(&[("awaiting.js", AWAITING)])?;
    let (probe, answer) = (dir.out("probe"), dir.out("answer"));
    let sink = Arc::new(GatedSink::default());
    let config = [("PROBE", probe.display().to_string()), ("ANSWER", answer.display().to_string())];
    let (ctx, stop) = context(&config, Arc::clone(&sink) as Arc<dyn EventSink>);
    let running = connector::start(spec(&dir.path(), "awaiting.js", &runtime), ctx).await?;
    let arrived = || *sink.arrived.lock_unpoisoned();
    assert!(wait_for(Duration::from_secs(10), || arrived() == 1).await, "the first emit never reached the sink");
    // The second emit waits for the first one's answer: asked now, the
    // connector says the first is still pending (the barrier: its answer).
    std::fs::write(&probe, "")?;
    let answered = || std::fs::read_to_string(&answer).is_ok_and(|said| !said.is_empty());
    assert!(wait_for(Duration::from_secs(10), answered).await, "the connector never answered the probe");
    assert_eq!(std::fs::read_to_string(&answer)?, "pending", "the first emit settled before the sink stored it");
    assert_eq!(arrived(), 1);
    assert!(sink.inner.stored().is_empty());
    sink.gate.notify_one();
    assert!(wait_for(Duration::from_secs(10), || arrived() == 2).await, "the second emit never came");
    assert_eq!(sink.inner.stored().len(), 1);
    sink.gate.notify_one();
    assert!(wait_for(Duration::from_secs(10), || sink.inner.stored().len() == 2).await);
    stop.cancel();
    finish(running, Duration::from_secs(10)).await??;
    Ok(())
}

const ANSWERED: &str = r#"
import { writeFileSync } from 'node:fs';
export default async function run(ctx) {
  const outcome = await ctx.emit({ name: 'm', message: { type: 'text', text: 'late' }, instanceKey: 'k' }).then(
    (answer) => `resolved duplicate=${answer.duplicate}`,
    (error) => `rejected ${error.code}`,
  );
  writeFileSync(ctx.config.MARKER, `${outcome} aborted=${ctx.signal.aborted}`);
  await new Promise(() => {});
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emit_in_flight_when_stopping_still_gets_its_answer() -> TestResult {
    let Some(runtime) = runtime_or_skip("connector stop with an emit in flight") else { return Ok(()) };
    let dir = bundle(&[("answered.ts", ANSWERED)])?;
    let marker = dir.out("marker");
    let sink = Arc::new(GatedSink::default());
    let (ctx, stop) = context(&[("MARKER", marker.display().to_string())], Arc::clone(&sink) as Arc<dyn EventSink>);
    let spec = spec(&dir.path(), "answered.ts", &runtime).with_stop_grace(Duration::from_secs(3));
    let running = connector::start(spec, ctx).await?;
    let arrived = || *sink.arrived.lock_unpoisoned();
    assert!(wait_for(Duration::from_secs(10), || arrived() == 1).await, "the emit never reached the sink");
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(200)).await;
    sink.gate.notify_one();
    assert!(wait_for(Duration::from_secs(5), || marker.exists()).await, "the emit's promise never settled");
    assert_eq!(std::fs::read_to_string(&marker)?, "resolved duplicate=false aborted=true");
    assert_eq!(sink.inner.stored().len(), 1);
    finish(running, Duration::from_secs(10)).await??;
    Ok(())
}

const BAD_EVENTS: &str = r#"
export default async function run(ctx) {
  const errors = [];
  for (const [event, options] of [
    [{ name: 'm', message: { type: 'text', text: 'no key' } }, undefined],
    [{ name: 'm', message: { type: 'audio' }, instanceKey: 'k' }, undefined],
    [{ name: 'm', message: { type: 'text', text: 't' }, instanceKey: 'k' }, { deliveryKey: 'x'.repeat(600) }],
    [{ name: 'm', message: { type: 'text', text: 't' }, instanceKey: 'k' }, { deliveryKey: 7 }],
  ]) {
    try {
      await ctx.emit(event, options);
      errors.push('resolved');
    } catch (error) {
      errors.push(`${error instanceof Error}|${error.code}|${error.message}`);
    }
  }
  await ctx.emit({ name: 'report', message: { type: 'text', text: errors.join('\n') }, instanceKey: 'k' });
  ctx.logger.info('token is', ctx.secrets.BOT_TOKEN, { n: 1 });
  console.log(`printed ${ctx.secrets.BOT_TOKEN}`);
  ctx.logger.warn('careful');
  await new Promise((resolve) => setTimeout(resolve, 100));
}
"#;

// Current-thread: the test's own subscriber sees every task's events.
#[tokio::test]
async fn a_bad_event_rejects_with_a_readable_error_and_logs_hide_secrets() -> TestResult {
    let Some(runtime) = runtime_or_skip("connector bad events") else { return Ok(()) };
    let captured = Captured::default();
    let _guard = tracing::subscriber::set_default(captured.subscriber("goondan::connector=debug"));
    let dir = bundle(&[("bad.ts", BAD_EVENTS)])?;
    let sink = Arc::new(MemorySink::new());
    let (ctx, _stop) = context(&[], Arc::clone(&sink) as Arc<dyn EventSink>);
    let running = connector::start(spec(&dir.path(), "bad.ts", &runtime), ctx).await?;
    finish(running, Duration::from_secs(20)).await??;
    let stored = sink.stored();
    assert_eq!(stored.len(), 1, "{stored:?}");
    let report = stored[0].event.message.input_text();
    let report: Vec<&str> = report.lines().collect();
    assert_eq!(
        report,
        [
            "true|E_CONNECTOR_EVENT|a connector event needs a non-empty string 'instanceKey'",
            "true|E_CONNECTOR_EVENT|a connector event's 'message' must be {type: \"text\", text}, {type: \"image\", url} or {type: \"file\", url, name}",
            "true|E_CONNECTOR_EVENT|a delivery key must be 1 to 512 characters",
            "true|undefined|ctx.emit(event, {deliveryKey}): deliveryKey must be a string",
        ]
    );
    let mut text = String::new();
    let seen = wait_for(Duration::from_secs(5), || {
        text = captured.text();
        text.contains("printed") && text.contains("careful")
    })
    .await;
    assert!(seen, "{text}");
    assert!(!text.contains(SECRET), "a secret reached the log:\n{text}");
    let line = |needle: &str| text.lines().find(|l| l.contains(needle)).unwrap_or_default().to_owned();
    let logged = line("token is");
    assert!(logged.contains("INFO") && logged.contains("token is [redacted] { n: 1 }"), "{text}");
    assert!(logged.contains("connection=\"my-conn\""), "{text}");
    assert!(line("printed [redacted]").contains("INFO"), "{text}");
    assert!(line("careful").contains("WARN"), "{text}");
    Ok(())
}

const FLAKY: &str = r#"
import { appendFileSync, readFileSync } from 'node:fs';
export default async function run(ctx) {
  appendFileSync(ctx.config.STARTS_FILE, 'start\n');
  const starts = readFileSync(ctx.config.STARTS_FILE, 'utf8').trim().split('\n').length;
  await new Promise((resolve) => setTimeout(resolve, 50));
  if (starts === 1) throw new Error(`first life ends with token ${ctx.secrets.BOT_TOKEN}`);
  if (starts === 2) process.exit(3);
  await ctx.emit({ name: 'm', message: { type: 'text', text: `life ${starts}` }, instanceKey: 'k' });
  await new Promise(() => {});
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_run_or_a_dead_host_is_restarted() -> TestResult {
    let Some(runtime) = runtime_or_skip("connector restarts") else { return Ok(()) };
    let dir = bundle(&[("flaky.ts", FLAKY)])?;
    let starts = dir.out("starts");
    let sink = Arc::new(MemorySink::new());
    let (ctx, stop) =
        context(&[("STARTS_FILE", starts.display().to_string())], Arc::clone(&sink) as Arc<dyn EventSink>);
    let running = connector::start(spec(&dir.path(), "flaky.ts", &runtime), ctx).await?;
    assert!(
        wait_for(Duration::from_secs(20), || !sink.stored().is_empty()).await,
        "never came back: {} starts",
        lines(&starts)
    );
    assert_eq!(sink.stored()[0].event.message.input_text(), "life 3");
    assert_eq!(lines(&starts), 3);
    assert!(!running.task.is_finished());
    stop.cancel();
    finish(running, Duration::from_secs(10)).await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_entry_is_an_error_of_start() -> TestResult {
    let Some(runtime) = runtime_or_skip("connector bad entries") else { return Ok(()) };
    let dir = bundle(&[
        ("syntax.ts", "export default async function run(ctx) { this is not code }"),
        ("nodefault.ts", "export async function run(ctx) {}"),
        ("throws.ts", "throw new Error('top-level boom');\nexport default async () => {};"),
        (
            "early.ts",
            "export default async function run(ctx) { throw new Error(`no port for ${ctx.secrets.BOT_TOKEN}`); }",
        ),
    ])?;
    let cases = [
        ("missing.ts", "does not exist"),
        ("syntax.ts", "cannot load the connector entry"),
        ("nodefault.ts", "has no default export function"),
        ("throws.ts", "top-level boom"),
        ("early.ts", "run() failed at start: no port for [redacted]"),
    ];
    for (entry, expected) in cases {
        let (ctx, _stop) = context(&[], Arc::new(MemorySink::new()));
        let error = match connector::start(spec(&dir.path(), entry, &runtime), ctx).await {
            Ok(running) => {
                running.task.abort();
                panic!("{entry} started");
            }
            Err(error) => error.to_string(),
        };
        assert!(error.starts_with("Connection 'my-conn': "), "{entry}: {error}");
        assert!(error.contains(expected), "{entry}: {error}");
        assert!(!error.contains(SECRET), "{entry}: {error}");
    }
    Ok(())
}

const POLITE: &str = r#"
import { writeFileSync } from 'node:fs';
export default async function run(ctx) {
  writeFileSync(ctx.config.PID_FILE, String(process.pid));
  // As the original's how-to stops a connector: on SIGTERM.
  await new Promise((resolve) => process.once('SIGTERM', resolve));
  writeFileSync(ctx.config.PID_FILE + '.stopped', `aborted=${ctx.signal.aborted}`);
}
"#;

const STUBBORN: &str = r#"
import { writeFileSync } from 'node:fs';
import { spawn } from 'node:child_process';
export default async function run(ctx) {
  const child = spawn('sleep', ['30'], { stdio: 'ignore' });
  writeFileSync(ctx.config.PID_FILE + '.child', String(child.pid));
  writeFileSync(ctx.config.PID_FILE, String(process.pid));
  setInterval(() => {}, 1000);
  await new Promise(() => {});
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_ends_the_host_politely_or_after_the_grace() -> TestResult {
    let Some(runtime) = runtime_or_skip("connector stop") else { return Ok(()) };
    let dir = bundle(&[("polite.ts", POLITE), ("stubborn.ts", STUBBORN)])?;
    for (entry, grace, within) in [
        ("polite.ts", Duration::from_secs(10), Duration::from_secs(3)),
        ("stubborn.ts", Duration::from_millis(300), Duration::from_secs(3)),
    ] {
        let pid_file = dir.out(&format!("{entry}.pid"));
        let (ctx, stop) = context(&[("PID_FILE", pid_file.display().to_string())], Arc::new(MemorySink::new()));
        let running = connector::start(spec(&dir.path(), entry, &runtime).with_stop_grace(grace), ctx).await?;
        assert!(wait_for(Duration::from_secs(10), || read_pid(&pid_file).is_some()).await, "{entry} wrote no pid");
        let pid = read_pid(&pid_file).unwrap_or_default();
        let began = Instant::now();
        stop.cancel();
        finish(running, within).await??;
        assert!(began.elapsed() < within, "{entry}");
        assert!(wait_for(Duration::from_secs(2), || gone(pid)).await, "{entry}: host {pid} still runs");
        if entry == "stubborn.ts" {
            let child = read_pid(&dir.out("stubborn.ts.pid.child")).unwrap_or_default();
            assert!(
                child > 0 && wait_for(Duration::from_secs(2), || gone(child)).await,
                "its child {child} still runs"
            );
        }
        if entry == "polite.ts" {
            let stopped = std::fs::read_to_string(dir.out("polite.ts.pid.stopped"))?;
            assert_eq!(stopped, "aborted=true");
        }
    }
    Ok(())
}

const SERVER: &str = r#"
import { writeFileSync } from 'node:fs';
// The original's documented shape: start a server and return at once.
export default async function run(ctx) {
  const server = Bun.serve({
    hostname: '127.0.0.1',
    port: 0,
    async fetch(req) {
      const body = await req.json();
      await ctx.emit({ name: 'm', message: { type: 'text', text: body.text }, instanceKey: 'k' }, { deliveryKey: body.id });
      return new Response('stored');
    },
  });
  writeFileSync(ctx.config.PORT_FILE, String(server.port));
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_returns_leaves_its_server_running() -> TestResult {
    let Some(runtime) = runtime_or_skip("connector server") else { return Ok(()) };
    if runtime.kind != goondan_script::RuntimeKind::Bun {
        return Ok(());
    }
    let dir = bundle(&[("server.ts", SERVER)])?;
    let port_file = dir.out("port");
    let sink = Arc::new(MemorySink::new());
    let (ctx, stop) =
        context(&[("PORT_FILE", port_file.display().to_string())], Arc::clone(&sink) as Arc<dyn EventSink>);
    let running = connector::start(spec(&dir.path(), "server.ts", &runtime), ctx).await?;
    assert!(wait_for(Duration::from_secs(10), || read_pid(&port_file).is_some()).await, "no port");
    let port = read_pid(&port_file).unwrap_or_default();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..2 {
        let body = r#"{"id":"evt-1","text":"over http"}"#;
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", u16::try_from(port)?)).await?;
        let request = format!(
            "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        assert!(response.starts_with("HTTP/1.1 200") && response.ends_with("stored"), "{response}");
    }
    let stored = sink.stored();
    assert_eq!(stored.len(), 1, "a redelivered key was stored twice: {stored:?}");
    assert_eq!(stored[0].key.as_deref(), Some("evt-1"));
    assert!(!running.task.is_finished());
    stop.cancel();
    finish(running, Duration::from_secs(10)).await??;
    Ok(())
}

const OWNED: &str = r#"
import { writeFileSync } from 'node:fs';
export default async function run(ctx) {
  writeFileSync(ctx.config.PID_FILE, String(process.pid));
  await new Promise(() => {});
}
"#;

/// The owner process of the SIGKILL test (run by it, with the env var set).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run as a child process by the_host_does_not_outlive_a_sigkilled_owner"]
async fn owner_process() -> TestResult {
    let Some(dir) = std::env::var_os("GOONDAN_CONNECTOR_OWNER_DIR").map(PathBuf::from) else { return Ok(()) };
    let runtime = JsRuntime::discover(&|name: &str| std::env::var(name).ok())?;
    let pid_file = dir.with_file_name("out").join("pid");
    let (ctx, _stop) = context(&[("PID_FILE", pid_file.display().to_string())], Arc::new(MemorySink::new()));
    let _running = connector::start(spec(&dir, "owned.ts", &runtime), ctx).await?;
    let mut ready = std::fs::File::create(dir.join("owner-ready"))?;
    ready.write_all(b"ok")?;
    tokio::time::sleep(Duration::from_secs(120)).await;
    Ok(())
}

#[test]
fn the_host_does_not_outlive_a_sigkilled_owner() -> TestResult {
    if runtime_or_skip("connector owner SIGKILL").is_none() {
        return Ok(());
    }
    let dir = bundle(&[("owned.ts", OWNED)])?;
    let mut owner = std::process::Command::new(std::env::current_exe()?)
        .args(["owner_process", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("GOONDAN_CONNECTOR_OWNER_DIR", dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let pid_file = dir.out("pid");
    let start = Instant::now();
    while !(dir.path().join("owner-ready").exists() && read_pid(&pid_file).is_some()) {
        if start.elapsed() > Duration::from_secs(30) || owner.try_wait()?.is_some() {
            let _ = owner.kill();
            let _ = owner.wait();
            panic!("the owner process did not start its connector");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let host = read_pid(&pid_file).unwrap_or_default();
    assert!(!gone(host));
    owner.kill()?; // SIGKILL
    owner.wait()?;
    let start = Instant::now();
    while !gone(host) && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    if !gone(host) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(host).unwrap_or(i32::MAX)),
            nix::sys::signal::Signal::SIGKILL,
        );
        panic!("the connector host {host} outlived its SIGKILLed owner");
    }
    Ok(())
}
