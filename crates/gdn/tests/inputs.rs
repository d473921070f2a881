//! Inputs that must not hang, grow without bound or leak: `-c` on what is
//! not a regular file or directory, file references leaving the bundle, and
//! a conversation that failing model requests must not pile up.

mod common;
use common::temp;
use goondan_test_support::text;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative)
}

fn gdn(state: &Path, args: &[&str]) -> Output {
    common::gdn_bin().state_arg(state).env_remove("GOONDAN_TEST_OPENAI_KEY").run(args)
}

/// `-c /dev/zero` used to read forever (growing to gigabytes) and `-c` on a
/// FIFO blocked in `open` until a writer came: both are refused at once,
/// before anything is opened, by `validate` and by `run`.
#[cfg(unix)]
#[test]
fn a_config_that_is_a_fifo_or_a_device_is_refused_without_reading_it() {
    let state = temp();
    let dir = temp();
    let fifo = dir.path().join("goondan.yaml");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap_or_else(|e| panic!("mkfifo: {e}"));
    assert!(made.success());
    let fifo = fifo.to_string_lossy().into_owned();
    let in_dir = dir.path().to_string_lossy().into_owned();
    for config in ["/dev/zero", fifo.as_str(), in_dir.as_str()] {
        let output = gdn(state.path(), &["-c", config, "--json", "validate"]);
        assert_eq!(output.status.code(), Some(4), "{config}: {}", text(&output.stderr));
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
        assert_eq!(report["diagnostics"][0]["code"], "E_CONFIG_NOT_A_FILE", "{config}: {report}");
        let output = gdn(state.path(), &["-c", config, "run", "--input", "hi"]);
        assert_eq!(output.status.code(), Some(3), "{config}");
        assert!(text(&output.stderr).contains("E_CONFIG_NOT_A_FILE"), "{config}: {}", text(&output.stderr));
    }
}

/// `systemRef: ../secret` used to validate and be sent to the model as the
/// system prompt.
#[test]
fn a_system_prompt_outside_the_bundle_is_refused_by_validate_and_run() {
    let state = temp();
    let dir = temp();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(&bundle).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.path().join("secret.txt"), "TOP SECRET").unwrap_or_else(|e| panic!("{e}"));
    let yaml = std::fs::read_to_string(repo("tests/fixtures/needs-key/goondan.yaml")).unwrap_or_else(|e| panic!("{e}"))
        + "  prompt: {systemRef: ../secret.txt}\n";
    std::fs::write(bundle.join("goondan.yaml"), yaml).unwrap_or_else(|e| panic!("{e}"));
    let config = bundle.to_string_lossy().into_owned();
    let output = gdn(state.path(), &["-c", &config, "--json", "validate"]);
    assert_eq!(output.status.code(), Some(4));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    assert_eq!(report["diagnostics"][0]["code"], "E_CONFIG_PATH_OUTSIDE_BUNDLE", "{report}");
    assert_eq!(report["diagnostics"][0]["path"], "goondan.yaml#1.spec.prompt.systemRef", "{report}");
    let output = gdn(state.path(), &["-c", &config, "run", "--input", "hi"]);
    assert_eq!(output.status.code(), Some(3));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("E_CONFIG_PATH_OUTSIDE_BUNDLE"), "{stderr}");
    assert!(!stderr.contains("TOP SECRET"), "{stderr}");
}

/// Every failed run used to leave its user message behind, each sent again
/// with the next request: retries of a failing model pile up nothing.
#[test]
fn failed_runs_leave_no_unanswered_user_messages() {
    let state = temp();
    let env_dir = temp();
    let env_file = env_dir.path().join(".env");
    // Nothing listens on the discard port: every request fails.
    std::fs::write(&env_file, "GOONDAN_TEST_OPENAI_KEY=sk-test\nOPENAI_BASE_URL=http://127.0.0.1:9/v1\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let env_arg = env_file.to_string_lossy().into_owned();
    let bundle = repo("tests/fixtures/needs-key");
    let config = bundle.to_string_lossy().into_owned();
    for attempt in ["first try", "second try"] {
        let output = gdn(state.path(), &["-c", &config, "run", "--input", attempt, "--env-file", &env_arg]);
        assert_eq!(output.status.code(), Some(5), "{}", text(&output.stderr));
    }
    let log = common::instance_path(state.path(), "a@default").join("messages.jsonl");
    assert!(std::fs::metadata(&log).is_ok_and(|m| m.len() > 0), "each run saved its input, then took it back");
    let loaded = goondan_runtime::store::read_message_log(&log).unwrap_or_else(|e| panic!("{e}"));
    assert!(loaded.state.messages().is_empty(), "{:?}", loaded.state.messages());
}
