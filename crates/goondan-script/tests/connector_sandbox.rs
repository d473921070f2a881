//! A Connector's host runs confined (goondan-sandbox, `workspace-write`
//! with the machine's network): attacks from inside a real connector — a
//! file written outside its directories or into the bundle, a connection to
//! a Unix socket listening outside — fail, in the namespaces layout and in
//! the Landlock-only one, while an HTTP request to a server on 127.0.0.1
//! still works and its own `TMPDIR` is writable. Its current directory is
//! its private directory: a `bunfig.toml` (with a preload) and a `.env` in
//! the bundle directory are not read. The connector reports what happened
//! through `ctx.emit`.

mod common;

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::runtime_or_skip;
use goondan_ingress::{ConnectorContext, EventSink, MemorySink, SecretMap};
use goondan_script::{JsRuntime, ScriptConnector, connector};
use tokio_util::sync::CancellationToken;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const PROBE: &str = r#"
import { writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
const attempt = (write) => {
  try {
    write();
    return 'written';
  } catch (error) {
    return error.code ?? String(error);
  }
};
export default async function run(ctx) {
  const results = {
    cwd: process.cwd(),
    outside: attempt(() => writeFileSync(ctx.config.OUTSIDE, 'x')),
    bundle: attempt(() => writeFileSync(ctx.config.IN_BUNDLE, 'x')),
    tmp: attempt(() => writeFileSync(`${os.tmpdir()}/goondan-own-${process.pid}`, 'x')),
    dotenv: String(process.env.GOONDAN_TEST_DOTENV),
    preloaded: String(globalThis.__goondanPreloaded),
  };
  results.unix = await new Promise((resolve) => {
    const socket = net.createConnection(ctx.config.SOCKET);
    socket.on('connect', () => {
      socket.destroy();
      resolve('connected');
    });
    socket.on('error', (error) => resolve(error.code ?? String(error)));
  });
  try {
    const response = await fetch(ctx.config.URL);
    results.http = `${response.status} ${await response.text()}`;
  } catch (error) {
    results.http = `failed: ${error}`;
  }
  await ctx.emit({ name: 'report', message: { type: 'text', text: JSON.stringify(results) }, instanceKey: 'k' });
}
"#;

/// Bun would run this before the connector if it read the bundle's
/// `bunfig.toml`.
const PRELOAD: &str = "globalThis.__goondanPreloaded = true;\n";

/// A server on 127.0.0.1 that answers every request `200 pong`.
fn http_server() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\npong");
        }
    });
    Ok(port)
}

async fn probe(runtime: &JsRuntime, landlock_only: bool) -> TestResult {
    let layout = if landlock_only { "Landlock only" } else { "default layout" };
    let root = tempfile::tempdir()?;
    let bundle = root.path().join("bundle");
    std::fs::create_dir(&bundle)?;
    std::fs::write(bundle.join("probe.js"), PROBE)?;
    std::fs::write(bundle.join("preload.js"), PRELOAD)?;
    std::fs::write(bundle.join("bunfig.toml"), "preload = [\"./preload.js\"]\n")?;
    std::fs::write(bundle.join(".env"), "GOONDAN_TEST_DOTENV=leaked\n")?;
    // Outside everything the connector may write: a directory of the test's.
    let outside = root.path().join("outside");
    std::fs::create_dir(&outside)?;
    let listener = std::os::unix::net::UnixListener::bind(outside.join("listening.sock"))?;
    listener.set_nonblocking(true)?;
    let port = http_server()?;

    let sink = Arc::new(MemorySink::new());
    let config = BTreeMap::from([
        ("OUTSIDE".to_owned(), outside.join("written").display().to_string()),
        ("IN_BUNDLE".to_owned(), bundle.join("written").display().to_string()),
        ("SOCKET".to_owned(), outside.join("listening.sock").display().to_string()),
        ("URL".to_owned(), format!("http://127.0.0.1:{port}/")),
    ]);
    let ctx = ConnectorContext {
        connection: "probe-conn".into(),
        connector: "probe".into(),
        config,
        secrets: SecretMap::new(BTreeMap::new()),
        sink: Arc::clone(&sink) as Arc<dyn EventSink>,
        stop: CancellationToken::new(),
        input: None,
    };
    let mut spec = ScriptConnector::new(&bundle, "./probe.js").with_runtime(runtime.clone());
    if landlock_only {
        spec = spec.landlock_only();
    }
    assert!(spec.is_confined(), "a connector runs confined by default");
    let running = connector::start(spec, ctx).await?;
    tokio::time::timeout(Duration::from_secs(20), running.task).await???;

    let stored = sink.stored();
    assert_eq!(stored.len(), 1, "{layout}: {stored:?}");
    let report: serde_json::Value = serde_json::from_str(&stored[0].event.message.input_text())?;
    let field = |name: &str| report[name].as_str().unwrap_or_default().to_owned();
    assert_ne!(field("outside"), "written", "{layout}: wrote outside its directories: {report}");
    assert!(!outside.join("written").exists(), "{layout}: {report}");
    assert_ne!(field("bundle"), "written", "{layout}: wrote into the bundle: {report}");
    assert!(!bundle.join("written").exists(), "{layout}: {report}");
    assert_ne!(field("unix"), "connected", "{layout}: reached a Unix socket outside: {report}");
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "{layout}: the listener outside got a connection: {report}"
    );
    assert_eq!(field("http"), "200 pong", "{layout}: the open network did not work: {report}");
    assert_eq!(field("tmp"), "written", "{layout}: its own TMPDIR is not writable: {report}");
    assert!(field("cwd").contains("goondan-js-"), "{layout}: its cwd is not its private directory: {report}");
    assert_eq!(field("dotenv"), "undefined", "{layout}: a .env was read: {report}");
    assert_eq!(field("preloaded"), "undefined", "{layout}: a bunfig.toml preload ran: {report}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confined_connector_writes_and_connects_only_where_it_may() -> TestResult {
    let Some(runtime) = runtime_or_skip("connector sandbox") else { return Ok(()) };
    probe(&runtime, false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connector_confined_without_namespaces_is_held_the_same() -> TestResult {
    let Some(runtime) = runtime_or_skip("connector sandbox, Landlock only") else { return Ok(()) };
    probe(&runtime, true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_connector_is_opted_out_explicitly() -> TestResult {
    let Some(runtime) = runtime_or_skip("connector unconfined") else { return Ok(()) };
    let root = tempfile::tempdir()?;
    std::fs::write(
        root.path().join("writes.js"),
        "import { writeFileSync } from 'node:fs';\n\
         export default async function run(ctx) { writeFileSync(ctx.config.TARGET, process.cwd()); }\n",
    )?;
    let target = root.path().join("written");
    let ctx = ConnectorContext {
        connection: "free-conn".into(),
        connector: "free".into(),
        config: BTreeMap::from([("TARGET".to_owned(), target.display().to_string())]),
        secrets: SecretMap::new(BTreeMap::new()),
        sink: Arc::new(MemorySink::new()),
        stop: CancellationToken::new(),
        input: None,
    };
    let spec = ScriptConnector::new(root.path(), "writes.js").with_runtime(runtime).confined(false);
    assert!(!spec.is_confined());
    let running = connector::start(spec, ctx).await?;
    tokio::time::timeout(Duration::from_secs(20), running.task).await???;
    // It wrote into the bundle, from its private directory all the same.
    let cwd = std::fs::read_to_string(&target)?;
    assert!(Path::new(&cwd).file_name().is_some_and(|n| n.to_string_lossy().starts_with("goondan-js-")), "{cwd}");
    Ok(())
}
