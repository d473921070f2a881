//! The crate rules of `docs/ARCHITECTURE.md`, checked over `cargo metadata`:
//! each workspace crate depends only on the crates its rule allows, so
//! dependencies point down the list and never up. A new crate fails this
//! test until its rule is written here and in the architecture document.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

/// Each crate and the workspace crates it may depend on (normal and build
/// dependencies; tests and benches may use more).
const RULES: &[(&str, &[&str])] = &[
    ("goondan-core", &[]),
    // Packages: tarballs, version ranges, the registry's server and the
    // package client; core's HTTPS setup only, no runtime, no command line.
    ("goondan-registry", &["goondan-core"]),
    // The append-only JSON Lines journal: files only, core's fault points.
    ("goondan-journal", &["goondan-core"]),
    // A dev-dependency only: the recording model (llm), a tool call's
    // context for handler tests (tools, core).
    ("goondan-test-support", &["goondan-llm", "goondan-tools", "goondan-core"]),
    ("goondan-config", &["goondan-core"]),
    // Confinement of commands: no runtime, no config; core's address rule only.
    ("goondan-sandbox", &["goondan-core"]),
    ("goondan-tools", &["goondan-core", "goondan-config", "goondan-sandbox"]),
    ("goondan-base", &["goondan-core", "goondan-config", "goondan-tools", "goondan-sandbox"]),
    ("goondan-llm", &["goondan-core", "goondan-config"]),
    (
        "goondan-runtime",
        &["goondan-core", "goondan-journal", "goondan-config", "goondan-tools", "goondan-llm", "goondan-sandbox"],
    ),
    // Connectors, the inbox and routing: no turn, no process but a connector's own.
    ("goondan-ingress", &["goondan-core", "goondan-journal"]),
    (
        "goondan-script",
        &["goondan-core", "goondan-config", "goondan-tools", "goondan-runtime", "goondan-ingress", "goondan-sandbox"],
    ),
    ("goondan-mcp", &["goondan-core", "goondan-config", "goondan-tools", "goondan-runtime", "goondan-sandbox"]),
    ("goondan-extensions", &["goondan-core", "goondan-config", "goondan-tools", "goondan-runtime"]),
    ("goondan-ipc", &["goondan-core"]),
    // Spans from the events' vocabulary; it runs no turn and knows no process.
    ("goondan-telemetry", &["goondan-core", "goondan-tools"]),
    // The hub knows messages and processes, not turns: it runs no agent.
    ("goondan-orchestrator", &["goondan-core", "goondan-config", "goondan-ipc"]),
    // Across machines: a launcher and a link of the hub's, and hosts that start agent processes.
    ("goondan-nats", &["goondan-core", "goondan-ipc", "goondan-orchestrator"]),
    // The agent process: it runs turns, and talks only to its hub.
    ("goondan-agent", &["goondan-core", "goondan-config", "goondan-tools", "goondan-runtime", "goondan-ipc"]),
    // The read-only web page over a state root: it reads the logs, writes nothing,
    // runs no agent and knows no command line (gdn studio binds and prints).
    ("goondan-studio", &["goondan-core", "goondan-journal", "goondan-runtime", "goondan-ingress"]),
    // A swarm's service, supervised (connectors, inbox, turns, control socket, status,
    // watcher, signals, secrets): it knows no command line, prints nothing and picks no exit code.
    (
        "goondan-service",
        &[
            "goondan-core",
            "goondan-config",
            "goondan-base",
            "goondan-runtime",
            "goondan-ingress",
            "goondan-script",
            "goondan-ipc",
            "goondan-orchestrator",
            "goondan-agent",
            "goondan-telemetry",
            "goondan-nats",
        ],
    ),
    (
        "gdn",
        &[
            "goondan-core",
            "goondan-journal",
            "goondan-config",
            "goondan-tools",
            "goondan-base",
            "goondan-llm",
            "goondan-runtime",
            "goondan-ingress",
            "goondan-script",
            "goondan-mcp",
            "goondan-extensions",
            "goondan-ipc",
            "goondan-orchestrator",
            "goondan-agent",
            "goondan-sandbox",
            "goondan-telemetry",
            "goondan-nats",
            "goondan-studio",
            "goondan-service",
            "goondan-registry",
        ],
    ),
];

#[test]
fn workspace_crates_depend_only_on_what_their_rule_allows() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| panic!("running cargo metadata: {e}"));
    assert!(output.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&output.stderr));
    let metadata: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("cargo metadata JSON: {e}"));
    let packages = metadata["packages"].as_array().cloned().unwrap_or_default();
    let members: BTreeSet<String> = packages.iter().filter_map(|p| p["name"].as_str().map(str::to_owned)).collect();
    let rules: BTreeMap<&str, &[&str]> = RULES.iter().copied().collect();

    let mut problems = Vec::new();
    for package in &packages {
        let name = package["name"].as_str().unwrap_or_default();
        let Some(allowed) = rules.get(name) else {
            problems.push(format!("{name}: no crate rule; add it to RULES and to docs/ARCHITECTURE.md"));
            continue;
        };
        for dependency in package["dependencies"].as_array().into_iter().flatten() {
            let dep = dependency["name"].as_str().unwrap_or_default();
            let runtime_dependency = dependency["kind"].is_null() || dependency["kind"] == "build";
            if runtime_dependency && members.contains(dep) && !allowed.contains(&dep) {
                problems.push(format!("{name} depends on {dep}, which its rule does not allow"));
            }
        }
    }
    assert!(problems.is_empty(), "crate rules broken:\n  {}", problems.join("\n  "));
    assert!(members.contains("goondan-runtime") && members.len() >= RULES.len(), "{members:?}");
}
