//! The script tools' host confined in an agent's sandbox, in both layouts
//! the sandbox has — with namespaces, and Landlock only (where a confined
//! process may not make any Unix socket: the host's channel to gdn is
//! inherited, never connected) — runs tools (a 4 MiB result among them),
//! from its private directory, while a tool's write outside the workdir or
//! connection to a Unix socket listening outside fails.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{Kit, output, runtime_or_skip};
use goondan_sandbox::{Policy, Sandbox, SandboxSpec};
use goondan_script::ScriptHostBuilder;
use serde_json::json;

const BUNDLE: &str = r#"apiVersion: goondan.ai/v1
kind: Model
metadata: {name: scripted}
spec:
  provider: scripted
  model: probe
  options:
    replies:
      - {text: "done"}
---
apiVersion: goondan.ai/v1
kind: Agent
metadata: {name: scripter}
spec:
  modelConfig: {modelRef: Model/scripted}
  tools:
    - {kind: Tool, name: probe}
---
apiVersion: goondan.ai/v1
kind: Tool
metadata: {name: probe}
spec:
  entry: ./probe.ts
  exports:
    - name: attempt
      parameters:
        type: object
        properties: {outside: {type: string}, socket: {type: string}}
        required: [outside, socket]
    - name: big
      parameters: {type: object, properties: {size: {type: integer}}, required: [size]}
"#;

const PROBE: &str = r#"
import { writeFileSync } from 'node:fs';
import net from 'node:net';
export const handlers = {
  attempt: async (_ctx, input) => {
    let outside;
    try {
      writeFileSync(input.outside, 'x');
      outside = 'written';
    } catch (error) {
      outside = error.code ?? String(error);
    }
    const unix = await new Promise((resolve) => {
      const socket = net.createConnection(input.socket);
      socket.on('connect', () => {
        socket.destroy();
        resolve('connected');
      });
      socket.on('error', (error) => resolve(error.code ?? String(error)));
    });
    return { cwd: process.cwd(), outside, unix };
  },
  big: (_ctx, input) => ({ text: 'é'.repeat(input.size / 2) + 'x'.repeat(input.size / 2) }),
};
"#;

fn real(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

async fn run_in(layout: &str, landlock_only: bool) {
    let Some(runtime) = runtime_or_skip(layout) else { return };
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (bundle, workdir, outside) =
        (root.path().join("bundle"), root.path().join("work"), root.path().join("outside"));
    for dir in [&bundle, &workdir, &outside] {
        std::fs::create_dir(dir).unwrap_or_else(|e| panic!("{e}"));
    }
    std::fs::write(bundle.join("goondan.yaml"), BUNDLE).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(bundle.join("probe.ts"), PROBE).unwrap_or_else(|e| panic!("{e}"));
    let listener =
        std::os::unix::net::UnixListener::bind(outside.join("listening.sock")).unwrap_or_else(|e| panic!("{e}"));
    listener.set_nonblocking(true).unwrap_or_else(|e| panic!("{e}"));

    let sandbox =
        Sandbox::new(SandboxSpec { policy: Policy::WorkspaceWrite, workdir: real(&workdir), ..SandboxSpec::default() });
    let sandbox = if landlock_only { sandbox.landlock_only() } else { sandbox };
    let host = ScriptHostBuilder::new(Arc::new(|_: &str| None))
        .runtime(runtime)
        .sandbox(Arc::new(sandbox), vec![real(&bundle)])
        .build();
    let kit = Kit::for_bundle(&bundle, Arc::clone(&host), None);

    let args = json!({
        "outside": outside.join("written").display().to_string(),
        "socket": outside.join("listening.sock").display().to_string(),
    });
    let result = kit.call("c1", "probe__attempt", args).await;
    let report = output(&result).clone();
    let dir = host.directory().await.unwrap_or_else(|| panic!("{layout}: no private directory"));
    assert_eq!(report["cwd"], json!(real(&dir).display().to_string()), "{layout}: {report}");
    assert_ne!(report["outside"], "written", "{layout}: {report}");
    assert!(!outside.join("written").exists(), "{layout}: {report}");
    assert_ne!(report["unix"], "connected", "{layout}: {report}");
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "{layout}: the listener outside got a connection: {report}"
    );

    // A frame larger than the socket's buffers, twice, and a call after.
    for _ in 0..2 {
        let result = kit.call("big", "probe__big", json!({"size": 4 * 1024 * 1024})).await;
        let text = output(&result)["text"].as_str().map(str::to_owned).unwrap_or_default();
        assert_eq!(text.chars().count(), 4 * 1024 * 1024, "{layout}");
        assert!(text.starts_with('é') && text.ends_with('x'), "{layout}");
    }
    let again = kit.call("c2", "probe__attempt", args_again(&outside)).await;
    assert_ne!(output(&again)["outside"], "written", "{layout}");
}

fn args_again(outside: &Path) -> serde_json::Value {
    json!({
        "outside": outside.join("again").display().to_string(),
        "socket": outside.join("listening.sock").display().to_string(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_runs_confined_with_namespaces() {
    run_in("script host in the sandbox", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_runs_confined_without_namespaces() {
    run_in("script host in the Landlock-only sandbox", true).await;
}
