//! A connector the user wrote (`kind: Connector`, `entry: ./conn.ts`) in a
//! service: it runs in a Bun host with its Connection's secret, its events
//! (a redelivered key among them) become turns, and the secret reaches the
//! connector only — not the agent's tool children, not the state root, not
//! the output. When the connector's `run` returns and every turn ran, the
//! service ends, exit 0, leaving no host process behind.

mod common;

use std::path::Path;
use std::process::Command;

const SECRET: &str = "s3cr3t-value-for-the-connector-only";

fn bundle(dir: &Path) {
    let yaml = r#"apiVersion: goondan.ai/v1
kind: Model
metadata: {name: m}
spec:
  provider: scripted
  model: s
  options:
    replies:
      - toolCalls:
          - {name: bash__exec, args: {command: "env >> agent-env.txt"}}
      - text: "done"
---
apiVersion: goondan.ai/v1
kind: Agent
metadata: {name: bot}
spec:
  modelConfig: {modelRef: Model/m}
  tools:
    - {kind: Tool, name: bash, package: "@goondan/base"}
---
apiVersion: goondan.ai/v1
kind: Swarm
metadata: {name: scripted-conn}
spec:
  entryAgent: Agent/bot
  agents: [Agent/bot]
---
apiVersion: goondan.ai/v1
kind: Connector
metadata: {name: mine}
spec:
  entry: ./conn.ts
  events:
    - name: tick
---
apiVersion: goondan.ai/v1
kind: Connection
metadata: {name: ticks}
spec:
  connectorRef: Connector/mine
  config:
    PREFIX: {value: "tick"}
  secrets:
    TOKEN: {valueFrom: {env: MY_CONNECTOR_TOKEN}}
  ingress:
    rules:
      - match: {event: tick}
        route: {instanceKeyProperty: n, instanceKeyPrefix: "n:"}
"#;
    std::fs::write(dir.join("goondan.yaml"), yaml).unwrap_or_else(|e| panic!("write: {e}"));
    let connector = r#"export default async function run(ctx) {
  const secretSeen = ctx.secrets.TOKEN && ctx.secrets.TOKEN.length;
  for (const n of [1, 2, 2]) {
    const answer = await ctx.emit(
      { name: "tick", message: { type: "text", text: `${ctx.config.PREFIX} ${n} secret-length=${secretSeen}` },
        properties: { n: String(n) }, instanceKey: "ignored" },
      { deliveryKey: `t${n}` });
    ctx.logger.info("emitted", n, JSON.stringify(answer), ctx.secrets.TOKEN);
  }
  let refused = "";
  try { await ctx.emit({ name: "tick" }); } catch (error) { refused = String(error.code); }
  if (refused !== "E_CONNECTOR_EVENT") throw new Error(`a bad event was not refused: ${refused}`);
}
"#;
    std::fs::write(dir.join("conn.ts"), connector).unwrap_or_else(|e| panic!("write: {e}"));
}

fn grep_dir(dir: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(grep_dir(&path, needle));
        } else if std::fs::read(&path).is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes())) {
            found.push(path.display().to_string());
        }
    }
    found
}

#[test]
fn a_script_connector_feeds_turns_and_keeps_its_secret() {
    if !common::js_runtime_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    bundle(dir.path());
    let state = dir.path().join("state");
    let output = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .args(["-c", &dir.path().to_string_lossy(), "-v", "run", "--json"])
        .env("GOONDAN_STATE_ROOT", &state)
        .env("MY_CONNECTOR_TOKEN", SECRET)
        .output()
        .unwrap_or_else(|e| panic!("gdn: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains(r#""status":"serving""#) && stdout.contains(r#""status":"stopped""#), "{stdout}");
    assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET), "the secret was printed:\n{stdout}\n{stderr}");

    // Two events (t2 was delivered twice), each its own instance by the rule.
    let list = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .args(["-c", &dir.path().to_string_lossy(), "instance", "list", "--json"])
        .env("GOONDAN_STATE_ROOT", &state)
        .output()
        .unwrap_or_else(|e| panic!("gdn: {e}"));
    let listed: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap_or_default();
    let mut keys: Vec<String> = listed
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| format!("{}@{}:{}", i["agentName"], i["instanceKey"], i["turns"]))
        .collect();
    keys.sort();
    assert_eq!(keys, [r#""bot"@"n:1":1"#, r#""bot"@"n:2":1"#], "{listed}");

    // The connector saw its secret; the agent's tool children never did.
    let mut conversations = grep_dir(&state, "secret-length=35");
    conversations.retain(|path| path.ends_with("messages.jsonl"));
    assert_eq!(conversations.len(), 2, "{conversations:?}");
    let env_seen = std::fs::read_to_string(dir.path().join("agent-env.txt")).unwrap_or_default();
    assert!(env_seen.contains("PATH="), "the tool ran: {env_seen}");
    assert!(!env_seen.contains(SECRET) && !env_seen.contains("MY_CONNECTOR_TOKEN"), "the agent's tool saw the secret");
    assert_eq!(grep_dir(&state, SECRET), Vec::<String>::new(), "the secret reached the state root");
}
