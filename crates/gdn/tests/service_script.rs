//! A connector the user wrote (`kind: Connector`, `entry: ./conn.ts`) in a
//! service: it runs in a Bun host with its Connection's secret, its events
//! (a redelivered key among them) become turns, and the secret reaches the
//! connector only — not the agent's tool children, not the state root, not
//! the output. When the connector's `run` returns and every turn ran, the
//! service ends, exit 0, leaving no host process behind.

mod common;

use std::path::Path;
use std::process::Command;

use goondan_test_support::{Agent, Bundle, reply_text, reply_tools};
use serde_json::{Value, json};

const SECRET: &str = "s3cr3t-value-for-the-connector-only";

fn bundle(dir: &Path) {
    let replies = [reply_tools([("bash__exec", json!({"command": "env >> agent-env.txt"}))]), reply_text("done")];
    Bundle::new()
        .scripted_model_as("m", "s", json!({ "replies": replies }))
        .one_agent("scripted-conn", Agent::new("bot", "m").base_tool("bash"))
        .resource("Connector", "mine", json!({"entry": "./conn.ts", "events": [{"name": "tick"}]}))
        .resource(
            "Connection",
            "ticks",
            json!({
                "connectorRef": "Connector/mine",
                "config": {"PREFIX": {"value": "tick"}},
                "secrets": {"TOKEN": {"valueFrom": {"env": "MY_CONNECTOR_TOKEN"}}},
                "ingress": {"rules": [
                    {"match": {"event": "tick"}, "route": {"instanceKeyProperty": "n", "instanceKeyPrefix": "n:"}}
                ]},
            }),
        )
        .write(dir)
        .unwrap_or_else(|e| panic!("write: {e}"));
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

/// The first file named `name` under `dir`.
fn find_file(dir: &Path, name: &str) -> Option<std::path::PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_file(&path, name) {
                return Some(found);
            }
        } else if entry.file_name() == name {
            return Some(path);
        }
    }
    None
}

#[test]
fn a_script_connector_feeds_turns_and_keeps_its_secret() {
    if !common::js_runtime_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    // The state root (and the agent's workdir in it) beside the bundle: a
    // workdir inside the bundle's directory takes no write.
    let bundle_dir = dir.path().join("bundle");
    std::fs::create_dir(&bundle_dir).unwrap_or_else(|e| panic!("mkdir: {e}"));
    bundle(&bundle_dir);
    let state = dir.path().join("state");
    let output = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .args(["-c", &bundle_dir.to_string_lossy(), "-v", "run", "--json"])
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
        .args(["-c", &bundle_dir.to_string_lossy(), "instance", "list", "--json"])
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
    // Written in the agent's workdir (under the state root unless --workdir).
    let env_seen =
        find_file(&state, "agent-env.txt").and_then(|path| std::fs::read_to_string(path).ok()).unwrap_or_default();
    assert!(env_seen.contains("PATH="), "the tool ran: {env_seen}\n{stdout}\n{stderr}");
    assert!(!env_seen.contains(SECRET) && !env_seen.contains("MY_CONNECTOR_TOKEN"), "the agent's tool saw the secret");
    assert_eq!(grep_dir(&state, SECRET), Vec::<String>::new(), "the secret reached the state root");
}

/// A bundle whose connector reports what it sees and tries to write into
/// the bundle directory; its Swarm's `spec.sandbox` is `sandbox` (none: null).
fn probing_bundle(dir: &Path, sandbox: &Value) {
    let mut swarm = json!({"entryAgent": "Agent/bot", "agents": ["Agent/bot"]});
    if !sandbox.is_null() {
        swarm["sandbox"] = sandbox.clone();
    }
    let target = dir.join("written-by-connector").display().to_string();
    Bundle::new()
        .scripted_model_as("m", "s", json!({"replies": [reply_text("noted")]}))
        .agent(Agent::new("bot", "m"))
        .resource("Swarm", "probing", swarm)
        .resource("Connector", "prober", json!({"entry": "./probe.js", "events": [{"name": "report"}]}))
        .resource(
            "Connection",
            "probes",
            json!({"connectorRef": "Connector/prober", "config": {"TARGET": {"value": target}}}),
        )
        .write(dir)
        .unwrap_or_else(|e| panic!("write: {e}"));
    let connector = r#"import { writeFileSync } from 'node:fs';
export default async function run(ctx) {
  let write = 'written';
  try { writeFileSync(ctx.config.TARGET, 'x'); } catch (error) { write = String(error.code); }
  const text = `probe-report dotenv=${process.env.BAIT_DOTENV} preloaded=${globalThis.__goondanPreloaded} ` +
    `cwd-private=${process.cwd().includes('goondan-js-')} write=${write}`;
  await ctx.emit({ name: 'report', message: { type: 'text', text }, instanceKey: 'probe' });
}
"#;
    std::fs::write(dir.join("probe.js"), connector).unwrap_or_else(|e| panic!("write: {e}"));
}

/// What Bun reads from its current directory at start when nothing stops
/// it: a `.env` and a `bunfig.toml` whose preload writes `marker`.
fn bun_bait(dir: &Path, marker: &Path) {
    std::fs::write(dir.join(".env"), "BAIT_DOTENV=leaked\n").unwrap_or_else(|e| panic!("write: {e}"));
    std::fs::write(dir.join("bunfig.toml"), "preload = [\"./bait-preload.js\"]\n")
        .unwrap_or_else(|e| panic!("write: {e}"));
    let preload = format!(
        "globalThis.__goondanPreloaded = true;\nrequire('node:fs').writeFileSync({:?}, 'preloaded');\n",
        marker.display().to_string()
    );
    std::fs::write(dir.join("bait-preload.js"), preload).unwrap_or_else(|e| panic!("write: {e}"));
}

/// The connector's host starts in its private directory, whatever gdn's
/// current directory holds: a `bunfig.toml` (with a preload) and a `.env`
/// there or in the bundle directory are not read — checked unconfined
/// (`policy: full` on the Swarm, which also runs its connectors
/// unconfined), where the preload's marker could be written; and under the
/// default policy the connector cannot write into the bundle.
#[test]
fn a_script_connector_reads_no_bunfig_or_env_and_is_confined_unless_the_swarm_is_full() {
    if !common::js_runtime_usable() {
        return;
    }
    for (sandbox, confined) in [(json!({"policy": "full"}), false), (Value::Null, true)] {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let (bundle_dir, cwd) = (dir.path().join("bundle"), dir.path().join("cwd"));
        for d in [&bundle_dir, &cwd] {
            std::fs::create_dir(d).unwrap_or_else(|e| panic!("mkdir: {e}"));
        }
        probing_bundle(&bundle_dir, &sandbox);
        let marker = dir.path().join("preload-ran");
        bun_bait(&bundle_dir, &marker);
        bun_bait(&cwd, &marker);
        let state = dir.path().join("state");
        let output = Command::new(env!("CARGO_BIN_EXE_gdn"))
            .args(["-c", &bundle_dir.to_string_lossy(), "-v", "run", "--json"])
            .current_dir(&cwd)
            .env("GOONDAN_STATE_ROOT", &state)
            .output()
            .unwrap_or_else(|e| panic!("gdn: {e}"));
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{sandbox:?}\n{stdout}\n{stderr}");
        assert!(!marker.exists(), "{sandbox:?}: a bunfig.toml preload ran\n{stderr}");
        let mut reports: Vec<String> = grep_dir(&state, "probe-report");
        reports.retain(|path| path.ends_with("messages.jsonl"));
        assert_eq!(reports.len(), 1, "{sandbox:?}: {reports:?}\n{stderr}");
        let text = std::fs::read_to_string(&reports[0]).unwrap_or_default();
        let expected = "probe-report dotenv=undefined preloaded=undefined cwd-private=true write=";
        assert!(text.contains(expected), "{sandbox:?}: {text}");
        // Unconfined it writes into the bundle; confined it cannot.
        assert_eq!(text.contains("write=written"), !confined, "{sandbox:?}: {text}");
        assert_eq!(bundle_dir.join("written-by-connector").exists(), !confined, "{sandbox:?}");
    }
}
