//! `gdn __sandbox-net`: the `gdn` binary is the network holder a sandbox
//! with `network.allow` starts (goondan-sandbox's own tests use their test
//! binary instead). A confined command reaches the listed server through
//! it, and is refused another; through `gdn run`, a model's `bash` call
//! does the same and its result names the policy.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use goondan_sandbox::{NETWORK_HOLDER_ARG, Policy, Sandbox, SandboxSpec};
use goondan_test_support::{Agent, Bundle, reply_text, reply_tools};
use serde_json::json;

/// Answers `hello` to every request; returns how many connections came.
fn serve(listener: TcpListener) -> Arc<AtomicUsize> {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&hits);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            counted.fetch_add(1, Ordering::AcqRel);
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let mut head = Vec::new();
            let mut byte = [0_u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\n");
        }
    });
    hits
}

/// An agent sandbox whose network allows 127.0.0.1:`port` only.
fn allow(port: u16) -> serde_json::Value {
    json!({"network": {"allow": [format!("127.0.0.1:{port}")]}})
}

#[test]
fn gdn_is_the_network_holder() -> std::io::Result<()> {
    let workdir = tempfile::tempdir()?;
    let listed = TcpListener::bind("127.0.0.1:0")?;
    let unlisted = TcpListener::bind("127.0.0.1:0")?;
    let (listed_port, unlisted_port) = (listed.local_addr()?.port(), unlisted.local_addr()?.port());
    serve(listed);
    serve(unlisted);
    let sandbox = Sandbox::new(SandboxSpec {
        policy: Policy::WorkspaceWrite,
        workdir: workdir.path().to_path_buf(),
        network_allow: vec![format!("127.0.0.1:{listed_port}")],
        ..SandboxSpec::default()
    })
    .with_network_holder(env!("CARGO_BIN_EXE_gdn"), [NETWORK_HOLDER_ARG]);
    let run = |url: String| {
        let mut command = Command::new("curl");
        command.args(["-sS", "--max-time", "10", &url]).current_dir(workdir.path()).stdin(Stdio::null());
        if let Err(error) = sandbox.confine(&mut command) {
            panic!("confining failed: {error}");
        }
        match command.output() {
            Ok(output) => String::from_utf8_lossy(&output.stdout).into_owned(),
            Err(error) => panic!("curl: {error}"),
        }
    };
    assert_eq!(run(format!("http://127.0.0.1:{listed_port}/")), "hello\n");
    let refused = run(format!("http://127.0.0.1:{unlisted_port}/"));
    assert!(refused.contains("is not in the agent's spec.sandbox.network.allow"), "{refused}");
    let Some(holder) = sandbox.network_holder_pid() else { panic!("no holder") };
    let exe = std::fs::read_link(format!("/proc/{holder}/exe"))?;
    assert_eq!(exe.file_name(), std::path::Path::new(env!("CARGO_BIN_EXE_gdn")).file_name());
    Ok(())
}

#[test]
fn a_model_command_reaches_only_the_listed_host() -> Result<(), Box<dyn std::error::Error>> {
    let listed = TcpListener::bind("127.0.0.1:0")?;
    let unlisted = TcpListener::bind("127.0.0.1:0")?;
    let (listed_port, unlisted_port) = (listed.local_addr()?.port(), unlisted.local_addr()?.port());
    let listed_hits = serve(listed);
    let unlisted_hits = serve(unlisted);
    let (dir, state) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let command = format!(
        "curl -sS --max-time 10 http://127.0.0.1:{listed_port}/ && curl -sS --max-time 10 -p http://127.0.0.1:{unlisted_port}/"
    );
    let args = serde_json::json!({ "command": command });
    let replies = [reply_tools([("bash__exec", args)]), reply_text("done")];
    Bundle::new()
        .scripted_model_as("scripted", "s", json!({ "replies": replies }))
        .one_agent("default", Agent::new("worker", "scripted").base_tool("bash").with("sandbox", allow(listed_port)))
        .write(dir.path())?;
    let output = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .current_dir(dir.path())
        .env("NO_COLOR", "1")
        .arg("--state-root")
        .arg(state.path())
        .args(["run", "--input", "go"])
        .output()?;
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let messages =
        std::fs::read_to_string(common::instance_path(state.path(), "worker@default").join("messages.jsonl"))?;
    assert!(messages.contains("hello"), "the listed host was not reached:\n{messages}");
    assert!(messages.contains("workspace-write"), "the result does not name the policy:\n{messages}");
    // curl shows only `response 403` for the refused tunnel: the result names
    // the host from the proxy's own record.
    let refused_host = format!("\"refusedHosts\":[\"127.0.0.1:{unlisted_port}\"]");
    assert!(messages.contains(&refused_host), "the refused host is not named:\n{messages}");
    assert!(listed_hits.load(Ordering::Acquire) >= 1);
    assert_eq!(unlisted_hits.load(Ordering::Acquire), 0, "the unlisted host was reached");
    Ok(())
}

#[test]
fn a_script_tool_fetches_through_the_proxy() -> Result<(), Box<dyn std::error::Error>> {
    if !common::js_runtime_usable() {
        return Ok(());
    }
    let listed = TcpListener::bind("127.0.0.1:0")?;
    let unlisted = TcpListener::bind("127.0.0.1:0")?;
    let (listed_port, unlisted_port) = (listed.local_addr()?.port(), unlisted.local_addr()?.port());
    let _listed_hits = serve(listed);
    let unlisted_hits = serve(unlisted);
    let (dir, state) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let url = json!({"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]});
    let exports = json!([{"name": "get", "description": "Fetches a URL.", "parameters": url}]);
    Bundle::new()
        .scripted_model_as("scripted", "s", json!({"replies": [reply_text("done")]}))
        .one_agent("default", Agent::new("worker", "scripted").tool("Tool/web").with("sandbox", allow(listed_port)))
        .resource("Tool", "web", json!({"entry": "./web.ts", "exports": exports}))
        .write(dir.path())?;
    std::fs::write(
        dir.path().join("web.ts"),
        r#"export const handlers = {
  get: async (_ctx: unknown, { url }: { url: string }) => {
    try {
      const response = await fetch(url);
      return { status: response.status, body: await response.text() };
    } catch (e) {
      return { error: String(e) };
    }
  },
};
"#,
    )?;
    let get = |port: u16| -> Result<serde_json::Value, Box<dyn std::error::Error>> {
        let args = serde_json::json!({ "url": format!("http://127.0.0.1:{port}/") }).to_string();
        let output = Command::new(env!("CARGO_BIN_EXE_gdn"))
            .current_dir(dir.path())
            .env("NO_COLOR", "1")
            .arg("--state-root")
            .arg(state.path())
            .args(["--json", "tool", "call", "web__get", "--args", &args])
            .output()?;
        Ok(serde_json::from_slice(&output.stdout)?)
    };
    let reached = get(listed_port)?;
    assert_eq!(reached["output"]["body"], "hello\n", "{reached}");
    let refused = get(unlisted_port)?;
    assert_eq!(refused["output"]["status"], 403, "{refused}");
    assert!(
        refused["output"]["body"].as_str().is_some_and(|body| body.contains("spec.sandbox.network.allow")),
        "{refused}"
    );
    assert_eq!(unlisted_hits.load(Ordering::Acquire), 0, "the unlisted host was reached");
    Ok(())
}
