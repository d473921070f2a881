//! `gdn validate` and `spec.sandbox`: a misspelt policy fails the check
//! naming the policies, and a valid bundle shows the sandbox each agent
//! gets, over the fixture bundles `tests/fixtures/sandbox` and
//! `tests/fixtures/sandbox-misspelt`.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

mod common;
use common::repo_path;

/// Runs `gdn -c <bundle> <args…>` with colors and logs off, a state root of
/// its own, and `HOME` as given.
fn gdn_with_home(bundle: &Path, home: &Path, args: &[&str]) -> Output {
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    common::gdn_bin().state(state.path()).env("HOME", home).project(bundle).run(args)
}

fn gdn(bundle: &Path, args: &[&str]) -> Output {
    gdn_with_home(bundle, Path::new("/home/nobody-in-particular"), args)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(output)))
}

#[test]
fn a_misspelt_policy_fails_validation_naming_the_policies() {
    let bundle = repo_path("tests/fixtures/sandbox-misspelt");
    let output = gdn(&bundle, &["validate"]);
    assert_eq!(output.status.code(), Some(4), "{}", stdout(&output));
    let text = stdout(&output);
    assert!(
        text.contains("error[E_CONFIG_SANDBOX_POLICY] goondan.yaml#2.spec.sandbox.policy (line 26, column 13)"),
        "{text}"
    );
    assert!(text.contains("sandbox policy 'workspace_write' is not one of read-only, workspace-write, full"), "{text}");
    assert!(text.contains("help: Did you mean `workspace-write`?"), "{text}");
    assert!(text.contains("1 error, 0 warnings"), "{text}");
    assert!(!text.contains("agent coder:"), "no sandbox lines for a bundle with errors: {text}");

    let output = gdn(&bundle, &["validate", "--format", "json"]);
    assert_eq!(output.status.code(), Some(4));
    let report = json(&output);
    assert_eq!(report["valid"], false, "{report}");
    let diagnostic = &report["diagnostics"][0];
    assert_eq!(diagnostic["code"], "E_CONFIG_SANDBOX_POLICY", "{report}");
    assert_eq!(diagnostic["path"], "goondan.yaml#2.spec.sandbox.policy", "{report}");
    assert_eq!(diagnostic["severity"], "error", "{report}");
    assert!(report.get("agents").is_none(), "{report}");

    let output = gdn(&bundle, &["validate", "--format", "github"]);
    assert_eq!(output.status.code(), Some(4));
    let line = stdout(&output);
    assert!(line.starts_with("::error file="), "{line}");
    assert!(line.contains(",line=26,col=13,title=E_CONFIG_SANDBOX_POLICY::"), "{line}");
    assert!(line.contains("read-only, workspace-write, full"), "{line}");
}

#[test]
fn validate_shows_the_sandbox_each_agent_gets() {
    let bundle = repo_path("tests/fixtures/sandbox");
    let output = gdn(&bundle, &["validate"]);
    assert_eq!(output.status.code(), Some(0), "{}", stdout(&output));
    let text = stdout(&output);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "agent coder: sandbox workspace-write (from Swarm default); run in Swarm batch: full",
            "agent reviewer: sandbox read-only (from its own spec.sandbox)",
            "agent batcher: sandbox full (from Swarm batch)",
            "agent loner: sandbox workspace-write (default)",
            &format!("✓ {} is valid", bundle.join("goondan.yaml").display()),
        ]
    );

    let output = gdn(&bundle, &["--json", "validate"]);
    assert_eq!(output.status.code(), Some(0));
    let report = json(&output);
    assert_eq!(report["valid"], true, "{report}");
    let agents = &report["agents"];
    let names: Vec<&str> = agents.as_object().into_iter().flatten().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["coder", "reviewer", "batcher", "loner"], "{report}");
    let coder = &agents["coder"]["sandbox"];
    assert_eq!(
        (&coder["policy"], &coder["source"], &coder["swarm"]),
        (&Value::from("workspace-write"), &Value::from("swarm"), &Value::from("default")),
        "{report}"
    );
    assert_eq!(coder["readable"], serde_json::json!(["/opt/data", "~/datasets", "./vendor"]), "{report}");
    assert_eq!(coder["writable"], serde_json::json!(["/srv/out"]), "{report}");
    assert_eq!(
        coder["network"]["allow"],
        serde_json::json!(["api.example.com:443", "127.0.0.1:8080", "[::1]:9000"]),
        "{report}"
    );
    assert_eq!(agents["coder"]["sandboxInSwarms"]["batch"]["policy"], "full", "{report}");
    let reviewer = &agents["reviewer"]["sandbox"];
    assert_eq!((&reviewer["policy"], &reviewer["source"]), (&Value::from("read-only"), &Value::from("agent")));
    assert_eq!(reviewer["writable"], serde_json::json!([]), "its own replaces the Swarm's whole: {report}");
    assert!(agents["reviewer"].get("sandboxInSwarms").is_none(), "its own applies in every Swarm: {report}");
    let loner = &agents["loner"]["sandbox"];
    assert_eq!((&loner["policy"], &loner["source"]), (&Value::from("workspace-write"), &Value::from("default")));
    assert!(loner.get("swarm").is_none(), "{report}");

    // The annotations format has nothing to annotate.
    let output = gdn(&bundle, &["validate", "--format", "github"]);
    assert_eq!((output.status.code(), stdout(&output)), (Some(0), String::new()));
}

#[test]
fn a_bundle_without_sandboxes_shows_the_default_and_nothing_else_changes() {
    let bundle = repo_path("tests/fixtures/swarm");
    let output = gdn(&bundle, &["validate"]);
    assert_eq!(output.status.code(), Some(0), "{}", stdout(&output));
    let text = stdout(&output);
    let agent_lines: Vec<&str> = text.lines().filter(|line| line.starts_with("agent ")).collect();
    assert!(!agent_lines.is_empty(), "{text}");
    for line in &agent_lines {
        assert!(line.ends_with(": sandbox workspace-write (default)"), "{text}");
    }
    let rest: Vec<&str> = text.lines().filter(|line| !line.starts_with("agent ")).collect();
    assert_eq!(rest, [format!("✓ {} is valid", bundle.join("goondan.yaml").display())], "{text}");
}

/// `writable` that is `HOME` itself is a warning (judged against the
/// `HOME` gdn runs with); `--strict` makes it fail.
#[test]
fn a_writable_home_directory_is_a_warning() -> std::io::Result<()> {
    let dir = tempfile::tempdir()?;
    let home = dir.path().join("home").join("ada");
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(&bundle)?;
    let fixture = std::fs::read_to_string(repo_path("tests/fixtures/sandbox-misspelt/goondan.yaml"))?;
    let yaml = fixture.replace("policy: workspace_write", &format!("writable: [\"{}\", ../out]", home.display()));
    std::fs::write(bundle.join("goondan.yaml"), yaml)?;

    let output = gdn_with_home(&bundle, &home, &["--json", "validate"]);
    assert_eq!(output.status.code(), Some(0), "a warning alone passes: {}", stdout(&output));
    let report = json(&output);
    let found: Vec<(&str, &str)> = report["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| (d["code"].as_str().unwrap_or(""), d["path"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(found, [("W_CONFIG_SANDBOX_WIDE", "goondan.yaml#2.spec.sandbox.writable[0]")], "{report}");
    assert_eq!(report["agents"]["coder"]["sandbox"]["policy"], "workspace-write", "{report}");

    // Another HOME: the same path is just a directory.
    let output = gdn_with_home(&bundle, &dir.path().join("elsewhere"), &["--json", "validate"]);
    assert_eq!(json(&output)["diagnostics"], serde_json::json!([]));

    let strict = gdn_with_home(&bundle, &home, &["validate", "--strict"]);
    assert_eq!(strict.status.code(), Some(4), "{}", stdout(&strict));
    assert!(stdout(&strict).contains("warning[W_CONFIG_SANDBOX_WIDE]"), "{}", stdout(&strict));
    assert!(
        stdout(&strict).contains("agent coder: sandbox workspace-write (from Swarm default)"),
        "{}",
        stdout(&strict)
    );
    Ok(())
}
