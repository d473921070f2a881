//! JavaScript extensions through the `gdn` binary: `tool list` shows the
//! catalog after their step middleware, `tool call` runs their toolCall
//! middleware, their state lives in the state root across processes, and
//! `validate` checks their modules.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

mod common;
use common::js_runtime_usable;
use common::temp;
use goondan_test_support::json_stdout as json;
use goondan_test_support::text;

fn repo(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative)
}

fn gdn(state: &Path, bundle: &str, args: &[&str]) -> Output {
    common::gdn_bin().state_arg(state).project(repo(bundle)).run(args)
}

#[test]
fn tool_list_shows_the_catalog_after_js_step_middleware() {
    if !js_runtime_usable() {
        return;
    }
    let state = temp();
    let output = gdn(state.path(), "tests/fixtures/script-extensions", &["--json", "tool", "list"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let catalog = json(&output);
    let names: Vec<&str> = catalog.as_array().into_iter().flatten().filter_map(|i| i["name"].as_str()).collect();
    // hidden__peek is declared but the step layer removes it; notes__count
    // comes from api.tools.register.
    assert_eq!(names, ["echo__say", "notes__count"]);
    assert_eq!(catalog[1]["source"], serde_json::json!({"type": "extension", "name": "notes"}));
    assert_eq!(catalog[1]["description"], "How many turns this instance has finished.");
    // Listing changes no state.
    assert!(!state.path().join("instances").exists());
}

#[test]
fn tool_call_runs_the_agents_js_tool_call_middleware() {
    if !js_runtime_usable() {
        return;
    }
    let state = temp();
    let output = gdn(
        state.path(),
        "tests/fixtures/script-extensions",
        &["--json", "tool", "call", "echo__say", "--args", r#"{"text": "psst"}"#],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let result = json(&output);
    assert_eq!(result["output"]["said"], "PSST", "{result}");
    assert_eq!(result["output"]["shouted"], true);

    // A tool the step middleware hides is not callable either: one pipeline.
    let output = gdn(state.path(), "tests/fixtures/script-extensions", &["--json", "tool", "call", "hidden__peek"]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert_eq!(json(&output)["error"]["code"], "E_TOOL_NOT_IN_CATALOG");
}

#[test]
fn extension_state_lives_in_the_state_root_across_processes() {
    if !js_runtime_usable() {
        return;
    }
    let state = temp();
    for (turn, input) in [(1, "first"), (2, "second")] {
        let output = gdn(state.path(), "tests/fixtures/script-extensions", &["-v", "run", "--input", input]);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{stderr}");
        assert_eq!(text(&output.stdout).trim(), "Done.");
        // api.events carried notes' event to shout, whose api.logger line is in the log.
        assert!(stderr.contains(&format!("[shout] notes saw turn {turn}")), "{stderr}");
        assert!(stderr.contains("[catalog-editor] step 0 done with 2 tool calls"), "{stderr}");
    }
    let saved: Value = serde_json::from_str(
        &std::fs::read_to_string(
            common::instance_path(state.path(), "assistant@default").join("extensions/notes.json"),
        )
        .unwrap_or_else(|e| panic!("state file: {e}")),
    )
    .unwrap_or_default();
    assert_eq!(saved, serde_json::json!({"turns": 2, "lastInput": "second"}));

    // `tool call` reads the same state root: the extension's tool sees both turns.
    let output = gdn(state.path(), "tests/fixtures/script-extensions", &["--json", "tool", "call", "notes__count"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(json(&output)["output"], serde_json::json!({"turns": 2}));

    // Another state root is another world.
    let other = temp();
    let output = gdn(other.path(), "tests/fixtures/script-extensions", &["--json", "tool", "call", "notes__count"]);
    assert_eq!(json(&output)["output"], serde_json::json!({"turns": 0}));
}

#[test]
fn an_extension_that_does_not_load_stops_the_agent_with_its_name_and_code() {
    if !js_runtime_usable() {
        return;
    }
    let state = temp();
    let output =
        gdn(state.path(), "tests/fixtures/script-extension-faults", &["run", "--agent", "no-register", "--input", "x"]);
    let stderr = text(&output.stderr);
    // The bundle's problem: a configuration error, exit 3 as for `tool list`.
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("extension 'without-register'"), "{stderr}");
    assert!(stderr.contains("does not export a register function"), "{stderr}");
}

#[test]
fn validate_checks_extension_modules() {
    if !js_runtime_usable() {
        return;
    }
    let state = temp();
    let output = gdn(state.path(), "tests/fixtures/script-extension-faults", &["--json", "validate"]);
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
    let report = json(&output);
    let found: Vec<(String, String)> = report["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            (d["code"].as_str().unwrap_or_default().to_owned(), d["message"].as_str().unwrap_or_default().to_owned())
        })
        .collect();
    assert_eq!(found.len(), 2, "{found:#?}");
    assert_eq!(found[0].0, "E_CONFIG_EXTENSION_REGISTER_MISSING", "{found:#?}");
    assert!(found[0].1.contains("'without-register'"), "{found:#?}");
    assert_eq!(found[1].0, "E_CONFIG_SCRIPT_MODULE", "{found:#?}");
    assert!(found[1].1.contains("'syntax-error'"), "{found:#?}");

    let output = gdn(state.path(), "tests/fixtures/script-extensions", &["validate"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stdout));
}

#[test]
fn the_brain_persona_sample_validates() {
    if !js_runtime_usable() {
        return;
    }
    let state = temp();
    let output = gdn(state.path(), "tests/fixtures/brain-persona", &["--json", "validate"]);
    let report = json(&output);
    // Its @goondan/base extensions (message-window, message-compaction,
    // context-message) resolve, and its own TypeScript extensions load and
    // register: no problem at all.
    assert_eq!(report["diagnostics"], serde_json::json!([]), "{report}");
    assert_eq!(report["valid"], true, "{report}");
    assert_eq!(output.status.code(), Some(0));
}
