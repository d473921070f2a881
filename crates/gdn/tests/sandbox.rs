//! The default sandbox through the CLI, as a user meets it: a model's
//! command that reaches for a planted private key is refused, its result
//! and the event log name the policy; a script tool (and what it spawns)
//! is confined the same way, and cannot read the state root either; under
//! `policy: full` the same calls succeed.

mod common;
use goondan_test_support::text;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use goondan_test_support::{Agent, Bundle, reply_text, reply_tools};
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const KEY: &str = "-----BEGIN OPENSSH PRIVATE KEY----- planted";

/// A project with a scripted model whose first reply runs `command`
/// through `bash__exec`, a script tool that reads a file directly and
/// through a spawned `cat`, the Agent's `sandbox` (null: none), and, with
/// `mcp`, the MCP server `files` (`reader.mjs`) with that server's config
/// beside its command (its `sandbox`, or nothing).
struct Project {
    dir: tempfile::TempDir,
    home: tempfile::TempDir,
    state: tempfile::TempDir,
}

impl Project {
    fn new(command: &str, sandbox: Value) -> Result<Self, Box<dyn std::error::Error>> {
        Self::with_mcp(command, sandbox, None)
    }

    fn with_mcp(command: &str, sandbox: Value, mcp: Option<Value>) -> Result<Self, Box<dyn std::error::Error>> {
        let (dir, home, state) = (tempfile::tempdir()?, tempfile::tempdir()?, tempfile::tempdir()?);
        std::fs::create_dir_all(home.path().join(".ssh"))?;
        std::fs::write(home.path().join(".ssh/id_rsa"), KEY)?;
        let replies = [reply_tools([("bash__exec", json!({ "command": command }))]), reply_text("done")];
        let mut agent = Agent::new("worker", "scripted").base_tool("bash").tool("Tool/peek");
        if let Some(server) = mcp {
            let mut files = json!({"command": "node", "args": ["./reader.mjs"]});
            if let (Some(files), Value::Object(more)) = (files.as_object_mut(), server) {
                files.extend(more);
            }
            let config = json!({"servers": {"files": files}});
            agent = agent
                .extension(json!({"kind": "Extension", "name": "mcp", "package": "@goondan/base", "config": config}));
        }
        if !sandbox.is_null() {
            agent = agent.with("sandbox", sandbox);
        }
        let path = json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]});
        let exports = json!([
            {"name": "read", "description": "Reads a file, directly and with a spawned cat.", "parameters": path},
            {"name": "readOrThrow", "description": "Reads a file; a failure is the tool's error.", "parameters": path},
        ]);
        Bundle::new()
            .scripted_model_as("scripted", "s", json!({ "replies": replies }))
            .agent(agent)
            .resource("Tool", "peek", json!({"entry": "./peek.ts", "exports": exports}))
            .swarm("default", "worker", &["worker"])
            .write(dir.path())?;
        std::fs::write(
            dir.path().join("peek.ts"),
            r#"import { readFileSync } from "node:fs";
import { spawnSync } from "node:child_process";
export const handlers = {
  readOrThrow: (_ctx: unknown, { path }: { path: string }) => readFileSync(path, "utf8"),
  read: (_ctx: unknown, { path }: { path: string }) => {
    let direct: string;
    try { direct = readFileSync(path, "utf8"); } catch (e) { direct = `error: ${(e as Error).message}`; }
    const cat = spawnSync("cat", [path], { encoding: "utf8" });
    return { direct, spawned: cat.stdout ?? "", spawnedError: cat.stderr ?? "", status: cat.status };
  },
};
"#,
        )?;
        Ok(Self { dir, home, state })
    }

    fn key_path(&self) -> PathBuf {
        self.home.path().join(".ssh/id_rsa")
    }

    fn gdn(&self, args: &[&str]) -> std::io::Result<Output> {
        Command::new(env!("CARGO_BIN_EXE_gdn"))
            .current_dir(self.dir.path())
            .env("HOME", self.home.path())
            .env("NO_COLOR", "1")
            .arg("--state-root")
            .arg(self.state.path())
            .args(args)
            .output()
    }

    fn run_turn(&self) -> std::io::Result<Output> {
        self.gdn(&["run", "--input", "go"])
    }

    /// The instance's event log and conversation, as written.
    fn instance_files(&self) -> (String, String) {
        let dir = common::instance_path(self.state.path(), "worker@default");
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        (read("events.jsonl"), read("messages.jsonl"))
    }

    fn peek(&self, path: &Path) -> Result<Value, Box<dyn std::error::Error>> {
        let args = serde_json::json!({ "path": path }).to_string();
        let output = self.gdn(&["--json", "tool", "call", "peek__read", "--args", &args])?;
        Ok(serde_json::from_slice(&output.stdout)?)
    }
}

#[test]
fn a_refused_command_is_named_in_its_result_and_in_the_event_log() -> TestResult {
    let project = Project::new(r#"cat "$HOME/.ssh/id_rsa""#, Value::Null)?;
    let output = project.run_turn()?;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let (events, messages) = project.instance_files();
    assert!(!messages.contains("planted"), "the key reached the conversation:\n{messages}");
    assert!(messages.contains("workspace-write"), "the result does not name the policy:\n{messages}");
    assert!(messages.contains(&project.key_path().display().to_string()), "the refused path is not named:\n{messages}");
    let refused = events
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|event| event["type"] == "tool.completed" && event["toolName"] == "bash__exec");
    let Some(refused) = refused else { panic!("no tool.completed event for bash__exec:\n{events}") };
    assert_eq!(refused["sandboxRefused"], "workspace-write", "{refused}");
    Ok(())
}

#[test]
fn under_full_the_same_command_reads_the_key() -> TestResult {
    let project = Project::new(r#"cat "$HOME/.ssh/id_rsa""#, json!({"policy": "full"}))?;
    let output = project.run_turn()?;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let (events, messages) = project.instance_files();
    assert!(messages.contains("planted"), "{messages}");
    assert!(!events.contains("sandboxRefused"), "{events}");
    Ok(())
}

#[test]
fn a_script_tool_and_what_it_spawns_are_confined_too() -> TestResult {
    if !common::js_runtime_usable() {
        return Ok(());
    }
    let project = Project::new("true", Value::Null)?;
    let key = project.peek(&project.key_path())?;
    let output = &key["output"];
    // Refused, or not there at all in the host's own root.
    let refused =
        |text: &str| ["EACCES", "ENOENT", "Permission denied", "No such file"].iter().any(|m| text.contains(m));
    assert!(output["direct"].as_str().is_some_and(|d| d.starts_with("error:") && refused(d)), "{key}");
    assert_eq!(output["spawned"], "", "{key}");
    assert!(output["spawnedError"].as_str().is_some_and(refused), "{key}");
    // A tool whose error the sandbox caused says so, with the policy.
    let args = serde_json::json!({ "path": project.key_path() }).to_string();
    let thrown = project.gdn(&["--json", "tool", "call", "peek__readOrThrow", "--args", &args])?;
    let thrown: Value = serde_json::from_slice(&thrown.stdout)?;
    assert_eq!(thrown["status"], "error", "{thrown}");
    assert!(
        thrown["error"]["suggestion"].as_str().is_some_and(
            |s| s.contains("'workspace-write' sandbox") && s.contains(&project.key_path().display().to_string())
        ),
        "{thrown}"
    );

    // Another instance's conversation in the state root: run a turn first
    // so that one exists, then try to read it from the script host.
    assert_eq!(project.run_turn()?.status.code(), Some(0));
    let conversation = common::instance_path(project.state.path(), "worker@default").join("messages.jsonl");
    assert!(conversation.exists());
    let read = project.peek(&conversation)?;
    assert!(read["output"]["direct"].as_str().is_some_and(refused), "{read}");
    assert_eq!(read["output"]["spawned"], "", "{read}");
    Ok(())
}

#[test]
fn under_full_a_script_tool_reads_what_it_likes() -> TestResult {
    if !common::js_runtime_usable() {
        return Ok(());
    }
    let project = Project::new("true", json!({"policy": "full"}))?;
    let key = project.peek(&project.key_path())?;
    assert_eq!(key["output"]["direct"], KEY, "{key}");
    assert_eq!(key["output"]["spawned"], KEY, "{key}");
    Ok(())
}

/// A stdio MCP server (Node, no packages) with one tool, `read`, that
/// answers with a file's text or the error reading it gave.
const READ_SERVER: &str = r#"import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
const send = (m) => process.stdout.write(JSON.stringify({ jsonrpc: '2.0', ...m }) + '\n');
createInterface({ input: process.stdin }).on('line', (line) => {
  const { id, method, params } = JSON.parse(line);
  if (id === undefined) return;
  if (method === 'initialize') {
    send({ id, result: { protocolVersion: params.protocolVersion, capabilities: { tools: {} }, serverInfo: { name: 'reader', version: '1.0.0' } } });
  } else if (method === 'tools/list') {
    send({ id, result: { tools: [{ name: 'read', inputSchema: { type: 'object', properties: { path: { type: 'string' } } } }] } });
  } else if (method === 'tools/call') {
    let text;
    try { text = readFileSync(params.arguments.path, 'utf8'); } catch (e) { text = `error: ${e.code}`; }
    send({ id, result: { content: [{ type: 'text', text }] } });
  } else {
    send({ id, error: { code: -32601, message: 'no such method' } });
  }
});
"#;

/// A project whose agent has the MCP server above, with `server` (more of
/// the server's config, such as its `sandbox`; `{}` for none).
fn mcp_project(server: Value) -> Result<Project, Box<dyn std::error::Error>> {
    let project = Project::with_mcp("true", Value::Null, Some(server))?;
    std::fs::write(project.dir.path().join("reader.mjs"), READ_SERVER)?;
    Ok(project)
}

fn mcp_read(project: &Project, path: &Path) -> Result<Value, Box<dyn std::error::Error>> {
    let args = serde_json::json!({ "path": path }).to_string();
    let output = project.gdn(&["--json", "tool", "call", "files__read", "--args", &args])?;
    serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("{e}: {}{}", text(&output.stdout), text(&output.stderr)).into())
}

#[test]
fn a_stdio_mcp_server_runs_under_the_policy_its_config_names() -> TestResult {
    let confined = mcp_project(json!({"sandbox": {"policy": "workspace-write"}}))?;
    let refused = mcp_read(&confined, &confined.key_path())?;
    // Refused, or not there at all in the server's own root.
    let said = refused.to_string();
    assert!(said.contains("error: EACCES") || said.contains("error: ENOENT"), "{refused}");
    assert!(!refused.to_string().contains("planted"), "{refused}");
    // It still reads what its workdir holds.
    let own = mcp_read(&confined, &confined.dir.path().join("reader.mjs"))?;
    assert!(own.to_string().contains("readFileSync"), "{own}");

    // Without a sandbox in its config, the server runs as the user chose it.
    let open = mcp_project(json!({}))?;
    let read = mcp_read(&open, &open.key_path())?;
    assert!(read.to_string().contains("planted"), "{read}");
    Ok(())
}

#[test]
fn a_misspelt_mcp_server_policy_is_refused_at_start() -> TestResult {
    let project = mcp_project(json!({"sandbox": {"policy": "workspace_write"}}))?;
    let output = project.gdn(&["--json", "tool", "call", "files__read", "--args", "{}"])?;
    assert_ne!(output.status.code(), Some(0));
    let said = format!("{}{}", text(&output.stdout), text(&output.stderr));
    assert!(said.contains("sandbox") && said.contains("workspace_write"), "{said}");
    Ok(())
}
