//! The default sandbox through the CLI, as a user meets it: a model's
//! command that reaches for a planted private key is refused, its result
//! and the event log name the policy; a script tool (and what it spawns)
//! is confined the same way, and cannot read the state root either; under
//! `policy: full` the same calls succeed.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const KEY: &str = "-----BEGIN OPENSSH PRIVATE KEY----- planted";

/// A project with a scripted model whose first reply runs `command`
/// through `bash__exec`, a script tool that reads a file directly and
/// through a spawned `cat`, and `sandbox` (an Agent spec line, or "").
struct Project {
    dir: tempfile::TempDir,
    home: tempfile::TempDir,
    state: tempfile::TempDir,
}

impl Project {
    fn new(command: &str, sandbox: &str) -> Result<Self, Box<dyn std::error::Error>> {
        let (dir, home, state) = (tempfile::tempdir()?, tempfile::tempdir()?, tempfile::tempdir()?);
        std::fs::create_dir_all(home.path().join(".ssh"))?;
        std::fs::write(home.path().join(".ssh/id_rsa"), KEY)?;
        let args = serde_json::json!({ "command": command });
        let yaml = format!(
            r#"apiVersion: goondan.ai/v1
kind: Model
metadata: {{name: scripted}}
spec:
  provider: scripted
  model: s
  options:
    replies:
      - {{toolCalls: [{{name: bash__exec, args: {args}}}]}}
      - {{text: done}}
---
apiVersion: goondan.ai/v1
kind: Agent
metadata: {{name: worker}}
spec:
  modelConfig: {{modelRef: Model/scripted}}
  tools:
    - {{kind: Tool, name: bash, package: "@goondan/base"}}
    - Tool/peek
{sandbox}
---
apiVersion: goondan.ai/v1
kind: Tool
metadata: {{name: peek}}
spec:
  entry: ./peek.ts
  exports:
    - name: read
      description: Reads a file, directly and with a spawned cat.
      parameters: {{type: object, properties: {{path: {{type: string}}}}, required: [path]}}
---
apiVersion: goondan.ai/v1
kind: Swarm
metadata: {{name: default}}
spec:
  entryAgent: Agent/worker
  agents: [Agent/worker]
"#
        );
        std::fs::write(dir.path().join("goondan.yaml"), yaml)?;
        std::fs::write(
            dir.path().join("peek.ts"),
            r#"import { readFileSync } from "node:fs";
import { spawnSync } from "node:child_process";
export const handlers = {
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

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_refused_command_is_named_in_its_result_and_in_the_event_log() -> TestResult {
    let project = Project::new(r#"cat "$HOME/.ssh/id_rsa""#, "")?;
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
    let project = Project::new(r#"cat "$HOME/.ssh/id_rsa""#, "  sandbox: {policy: full}")?;
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
    let project = Project::new("true", "")?;
    let key = project.peek(&project.key_path())?;
    let output = &key["output"];
    assert!(output["direct"].as_str().is_some_and(|d| d.starts_with("error:") && d.contains("EACCES")), "{key}");
    assert_eq!(output["spawned"], "", "{key}");
    assert!(output["spawnedError"].as_str().is_some_and(|e| e.contains("Permission denied")), "{key}");

    // Another instance's conversation in the state root: run a turn first
    // so that one exists, then try to read it from the script host.
    assert_eq!(project.run_turn()?.status.code(), Some(0));
    let conversation = common::instance_path(project.state.path(), "worker@default").join("messages.jsonl");
    assert!(conversation.exists());
    let read = project.peek(&conversation)?;
    assert!(read["output"]["direct"].as_str().is_some_and(|d| d.contains("EACCES")), "{read}");
    assert_eq!(read["output"]["spawned"], "", "{read}");
    Ok(())
}

#[test]
fn under_full_a_script_tool_reads_what_it_likes() -> TestResult {
    if !common::js_runtime_usable() {
        return Ok(());
    }
    let project = Project::new("true", "  sandbox: {policy: full}")?;
    let key = project.peek(&project.key_path())?;
    assert_eq!(key["output"]["direct"], KEY, "{key}");
    assert_eq!(key["output"]["spawned"], KEY, "{key}");
    Ok(())
}
