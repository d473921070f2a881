//! Operator secrets never reach a process that runs what the model chose:
//! not through its environment, not through `/proc/<gdn>/environ`, not in
//! the JavaScript host — while the model and the built-ins still get them.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

mod common;
use common::js_runtime_usable;
use goondan_test_support::text;

const MODEL_KEY: &str = "sk-model-key-9f3b2c";
const ODD_SECRET: &str = "odd-name-secret-5e1a";
const TOKEN: &str = "ghp-token-77c1d0";

/// gdn with secrets in its environment: a pattern-named key, a variable
/// whose name looks harmless but the bundle reads with `valueFrom.env`, a
/// token, and a plain variable.
fn gdn(bundle: &Path, state: &Path, extra_env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gdn"));
    command
        .arg("--state-root")
        .arg(state)
        .arg("-c")
        .arg(bundle)
        .args(args)
        .env("NO_COLOR", "1")
        .env("OPENAI_API_KEY", MODEL_KEY)
        .env("ODD_NAME", ODD_SECRET)
        .env("GITHUB_TOKEN", TOKEN)
        .env("PLAIN_SETTING", "plain-value")
        .env_remove("GOONDAN_STATE_ROOT")
        .stdin(Stdio::null());
    for (key, value) in extra_env {
        command.env(key, value);
    }
    command.output().unwrap_or_else(|e| panic!("spawn gdn: {e}"))
}

/// The Agent's sandbox that gives its commands the user's full rights.
fn full() -> Value {
    serde_json::json!({"policy": "full"})
}

fn write_bundle(dir: &Path, endpoint: &str) {
    write_bundle_with(dir, endpoint, Value::Null);
}

/// The bundle with the Agent's `sandbox` (null: none).
fn write_bundle_with(dir: &Path, endpoint: &str, sandbox: Value) {
    let peek = "export const handlers = { env: () => ({ env: JSON.stringify(process.env), parent: require('node:fs').readFileSync(`/proc/${process.ppid}/environ`, 'utf8') }) };\n";
    common::peek_bundle(endpoint, "ODD_NAME", peek, sandbox).write(dir).unwrap_or_else(|e| panic!("{e}"));
}

fn assert_no_secret(what: &str, haystack: &str) {
    for secret in [MODEL_KEY, ODD_SECRET, TOKEN] {
        assert!(!haystack.contains(secret), "{what} holds a secret ({secret}):\n{haystack}");
    }
}

#[test]
fn bash_sees_no_secret_in_its_environment_or_in_gdns() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // With full rights (`policy: full`) the environment still holds none.
    write_bundle_with(dir.path(), "http://127.0.0.1:9/v1", full());
    let command = r#"env; echo ---; tr '\0' '\n' < /proc/$PPID/environ"#;
    let args = serde_json::json!({ "command": command }).to_string();
    let output = gdn(dir.path(), state.path(), &[], &["--json", "tool", "call", "bash__exec", "--args", &args]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let result: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"));
    let stdout = result["output"]["stdout"].as_str().unwrap_or_default();
    let (own, parent) = stdout.split_once("---").unwrap_or_else(|| panic!("{stdout}"));
    assert_no_secret("bash's environment", own);
    assert_no_secret("gdn's /proc environ", parent);
    // What is not a secret is still there.
    assert!(own.contains("PLAIN_SETTING=plain-value"), "{own}");
    assert!(parent.contains("PLAIN_SETTING=plain-value"), "{parent}");

    // The operator may let a named variable through on purpose.
    let output = gdn(
        dir.path(),
        state.path(),
        &[("GOONDAN_ENV_PASSTHROUGH", "GITHUB_TOKEN")],
        &[
            "--json",
            "tool",
            "call",
            "bash__exec",
            "--args",
            r#"{"command": "printf %s \"$GITHUB_TOKEN|$OPENAI_API_KEY\""}"#,
        ],
    );
    let result: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(result["output"]["stdout"], format!("{TOKEN}|"), "{result}");
}

#[test]
fn the_script_host_sees_no_secret_either() {
    if !js_runtime_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // With full rights (`policy: full`) the environment still holds none.
    write_bundle_with(dir.path(), "http://127.0.0.1:9/v1", full());
    let output = gdn(dir.path(), state.path(), &[], &["--json", "tool", "call", "peek__env"]);
    assert_eq!(output.status.code(), Some(0), "{} {}", text(&output.stdout), text(&output.stderr));
    let result: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"));
    let env = result["output"]["env"].as_str().unwrap_or_default();
    assert!(env.contains("plain-value"), "{env}");
    assert_no_secret("the script host's environment", env);
    assert_no_secret("gdn's /proc environ, read by the host", result["output"]["parent"].as_str().unwrap_or_default());
}

#[test]
fn the_model_still_gets_its_key_and_no_secret_is_saved() {
    let model = must_serve();
    let endpoint = model.url();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write_bundle(dir.path(), &endpoint);
    let output = gdn(dir.path(), state.path(), &[], &["-vv", "run", "--input", "hi"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(text(&output.stdout).trim(), "hello");
    // ODD_NAME was taken out of the environment (the bundle reads it with
    // valueFrom.env) and still reached the model.
    let headers = model.headers("authorization");
    assert_eq!(headers, [format!("Bearer {ODD_SECRET}")]);
    assert!(stderr.contains("secret variable(s) kept out of the environment of tool processes"), "{stderr}");
    assert_no_secret("the log", &stderr);
    for entry in walk(state.path()) {
        let content = std::fs::read(&entry).unwrap_or_default();
        assert_no_secret(&entry.display().to_string(), &String::from_utf8_lossy(&content));
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    common::files_under(dir)
}

/// Under the default sandbox a command cannot even open `gdn`'s (nor the
/// script host's parent's) `/proc/<pid>/environ`, and the result says which
/// policy refused it.
#[test]
fn by_default_gdns_environment_cannot_be_read_at_all() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write_bundle(dir.path(), "http://127.0.0.1:9/v1");
    let args = serde_json::json!({ "command": "cat /proc/$PPID/environ" }).to_string();
    let output = gdn(dir.path(), state.path(), &[], &["--json", "tool", "call", "bash__exec", "--args", &args]);
    let result: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"));
    let out = &result["output"];
    assert_ne!(out["exitCode"], 0, "{result}");
    assert_eq!(out["stdout"], "", "{result}");
    assert!(out["stderr"].as_str().is_some_and(|e| e.contains("Permission denied")), "{result}");
    assert_eq!(out["sandbox"]["policy"], "workspace-write", "{result}");
    assert!(
        out["sandbox"]["refused"]
            .as_array()
            .is_some_and(|r| r.iter().any(|p| p.as_str().is_some_and(|p| p.ends_with("/environ")))),
        "{result}"
    );

    if js_runtime_usable() {
        let output = gdn(dir.path(), state.path(), &[], &["--json", "tool", "call", "peek__env"]);
        let result: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(result["status"], "error", "{result}");
        assert!(result.to_string().contains("EACCES"), "{result}");
    }
}

/// The fake model server, answering "hello".
fn must_serve() -> goondan_test_support::FakeModel {
    goondan_test_support::FakeModel::text("hello").unwrap_or_else(|e| panic!("model server: {e}"))
}
