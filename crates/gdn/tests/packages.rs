//! `gdn` on bundles of several files and on bundles with an installed
//! dependency (the fixtures of `crates/goondan-config/tests/fixtures`):
//! `validate`, `tool list`, `tool call` through the state root's
//! `packages/` directory.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

mod common;
use common::js_runtime_usable;
use goondan_test_support::text;

fn fixture(name: &str) -> PathBuf {
    common::repo_path("crates/goondan-config/tests/fixtures").join(name)
}

fn gdn(bundle: &Path, state: &Path, args: &[&str]) -> Output {
    common::gdn_bin().state(state).project(bundle).run(args)
}

fn json_out(output: &Output) -> Value {
    assert_eq!(output.status.code(), Some(0), "{}\n{}", text(&output.stderr), text(&output.stdout));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&output.stdout)))
}

fn names(listed: &Value) -> Vec<String> {
    listed.as_array().into_iter().flatten().filter_map(|i| i["name"].as_str().map(str::to_owned)).collect()
}

fn copy_dir(from: &Path, to: &Path) {
    goondan_test_support::bundle::copy_dir(from, to)
        .unwrap_or_else(|e| panic!("{} → {}: {e}", from.display(), to.display()));
}

#[test]
fn a_split_bundle_validates_and_lists_its_agent_s_tools() {
    let state = common::temp();
    let bundle = fixture("packages/split-quickstart");
    let validated = json_out(&gdn(&bundle, state.path(), &["--json", "validate"]));
    assert_eq!(validated["valid"], true, "{validated}");
    // Before split bundles were read this said "the bundle defines no Agent".
    let listed = json_out(&gdn(&bundle, state.path(), &["--json", "tool", "list"]));
    let names = names(&listed);
    assert!(names.iter().any(|n| n == "word-count__count"), "{names:?}");
    assert!(names.iter().any(|n| n == "json-query__query"), "{names:?}");
}

#[test]
fn a_split_bundle_s_errors_name_their_file() {
    let state = common::temp();
    let bundle = fixture("packages/duplicate-across-files");
    let output = gdn(&bundle, state.path(), &["--json", "validate"]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    let body: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(body["diagnostics"][0]["code"], "E_CONFIG_DUPLICATE_NAME");
    assert_eq!(body["diagnostics"][0]["path"], "more/models.yaml#0.metadata.name");
}

#[test]
fn an_installed_dependency_s_tool_is_listed_and_called() {
    let state = common::temp();
    copy_dir(&fixture("packages/greeter-1.0.0"), &state.path().join("packages/acme/greeter/1.0.0"));
    let bundle = fixture("packages/with-dependency");
    let validated = json_out(&gdn(&bundle, state.path(), &["--json", "validate"]));
    assert_eq!(validated["valid"], true, "{validated}");
    let listed = json_out(&gdn(&bundle, state.path(), &["--json", "tool", "list"]));
    assert_eq!(names(&listed)[0], "greet__hello", "{listed}");
    assert_eq!(listed[0]["source"]["name"], "greet");
    if js_runtime_usable() {
        let called =
            gdn(&bundle, state.path(), &["--json", "tool", "call", "greet__hello", "--args", r#"{"name":"Ada"}"#]);
        let result = json_out(&called);
        assert_eq!(result["status"], "ok", "{result}");
        assert_eq!(result["output"]["greeting"], "Hello, Ada!");
    }
}

#[test]
fn a_dependency_that_is_not_installed_says_how_to_install_it() {
    let state = common::temp();
    let output = gdn(&fixture("packages/with-dependency"), state.path(), &["--json", "validate"]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    let body: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(body["diagnostics"][0]["code"], "E_CONFIG_PACKAGE_NOT_INSTALLED", "{body}");
    let suggestion = body["diagnostics"][0]["suggestion"].as_str().unwrap_or_default();
    assert!(suggestion.contains("gdn package install"), "{suggestion}");
}

#[test]
fn gdn_run_calls_an_installed_dependency_s_tool_from_the_agent_process() {
    if !js_runtime_usable() {
        return;
    }
    let state = common::temp();
    copy_dir(&fixture("packages/greeter-1.0.0"), &state.path().join("packages/acme/greeter/1.0.0"));
    let bundle = fixture("packages/with-dependency");
    let output = gdn(&bundle, state.path(), &["run", "--input", "greet Ada"]);
    assert_eq!(output.status.code(), Some(0), "{}\n{}", text(&output.stderr), text(&output.stdout));
    assert!(text(&output.stdout).contains("done"), "{}", text(&output.stdout));
    // The tool's result is in the conversation the agent process kept.
    let logged = common::files_under(state.path())
        .into_iter()
        .filter(|f| f.ends_with("messages.jsonl"))
        .any(|f| fs::read_to_string(f).unwrap_or_default().contains("Hello, Ada!"));
    assert!(logged, "no messages.jsonl under {} holds the greeting", state.path().display());
}

#[test]
fn github_annotations_of_a_split_bundle_name_the_file_of_each_diagnostic() {
    let state = common::temp();
    let bundle = fixture("packages/duplicate-across-files");
    let output = gdn(&bundle, state.path(), &["validate", "--format", "github"]);
    let printed = text(&output.stdout);
    let expected = format!("file={}", bundle.join("more/models.yaml").display());
    assert!(printed.contains(&expected), "{printed}");
    assert!(printed.contains("line=4"), "{printed}");
}

/// Every messages.jsonl under `state`, concatenated.
fn conversations(state: &Path) -> String {
    common::files_under(state)
        .into_iter()
        .filter(|f| f.ends_with("messages.jsonl"))
        .map(|f| fs::read_to_string(f).unwrap_or_default())
        .collect()
}

#[test]
fn gdn_run_runs_a_dependency_s_agent_with_its_package_s_tool_model_and_prompt() {
    if !js_runtime_usable() {
        return;
    }
    let state = common::temp();
    copy_dir(&fixture("packages/crew-1.0.0"), &state.path().join("packages/acme/crew/1.0.0"));
    let bundle = fixture("packages/with-crew");
    let validated = json_out(&gdn(&bundle, state.path(), &["--json", "validate"]));
    assert_eq!(validated["valid"], true, "{validated}");
    // The package's agent is one of the bundle's runs, with its sandbox.
    let agents: Vec<&String> = validated["agents"].as_object().map(|a| a.keys().collect()).unwrap_or_default();
    assert_eq!(agents, ["lead", "helper"], "{validated}");
    // The bundle's lead asks the package's helper, whose scripted model
    // (the package's) calls the package's TypeScript tool.
    let output = gdn(&bundle, state.path(), &["run", "--input", "go"]);
    assert_eq!(output.status.code(), Some(0), "{}\n{}", text(&output.stderr), text(&output.stdout));
    assert!(text(&output.stdout).contains("lead done"), "{}", text(&output.stdout));
    let kept = conversations(state.path());
    assert!(kept.contains("HELLO FROM THE CREW!"), "the package tool's result: {kept}");
    assert!(kept.contains("helper done"), "the helper's answer reached the lead: {kept}");
}

#[test]
fn gdn_run_swarm_selects_a_dependency_s_swarm() {
    if !js_runtime_usable() {
        return;
    }
    let state = common::temp();
    copy_dir(&fixture("packages/crew-1.0.0"), &state.path().join("packages/acme/crew/1.0.0"));
    let bundle = fixture("packages/with-crew");
    let output = gdn(&bundle, state.path(), &["run", "--swarm", "crew", "--input", "go"]);
    assert_eq!(output.status.code(), Some(0), "{}\n{}", text(&output.stderr), text(&output.stdout));
    assert!(text(&output.stdout).contains("helper done"), "{}", text(&output.stdout));
    assert!(conversations(state.path()).contains("HELLO FROM THE CREW!"));
    let unknown = gdn(&bundle, state.path(), &["run", "--swarm", "nope", "--input", "go"]);
    assert_ne!(unknown.status.code(), Some(0));
    assert!(text(&unknown.stderr).contains("crew"), "the known swarms are listed: {}", text(&unknown.stderr));
}

#[test]
fn gdn_validate_names_a_dependency_s_missing_entry_file_and_its_package() {
    let state = common::temp();
    let installed = state.path().join("packages/acme/crew/1.0.0");
    copy_dir(&fixture("packages/crew-1.0.0"), &installed);
    fs::remove_file(installed.join("src/shout.ts")).unwrap_or_else(|e| panic!("{e}"));
    let output = gdn(&fixture("packages/with-crew"), state.path(), &["--json", "validate"]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    let body: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"));
    let first = &body["diagnostics"][0];
    assert_eq!(first["code"], "E_CONFIG_ENTRY_NOT_FOUND", "{body}");
    assert_eq!(first["path"], "@acme/crew/goondan.yaml#1.spec.entry", "{body}");
    let message = first["message"].as_str().unwrap_or_default();
    assert!(message.contains("./src/shout.ts") && message.contains("@acme/crew@1.0.0"), "{body}");
    assert!(first["suggestion"].as_str().unwrap_or_default().contains("gdn package install"), "{body}");
}

#[test]
fn gdn_run_of_a_bundle_that_only_depends_on_a_package_runs_the_package_s_swarm() {
    if !js_runtime_usable() {
        return;
    }
    let state = common::temp();
    copy_dir(&fixture("packages/crew-1.0.0"), &state.path().join("packages/acme/crew/1.0.0"));
    let bundle = common::temp();
    copy_dir(&fixture("packages/with-crew"), bundle.path());
    let manifest = bundle.path().join("goondan.yaml");
    let yaml = fs::read_to_string(&manifest).unwrap_or_else(|e| panic!("{e}"));
    // Only the Package document: no Swarm and no Agent of its own.
    common::write(&manifest, yaml.split("\n---\n").next().unwrap_or_default());
    let output = gdn(bundle.path(), state.path(), &["run", "--input", "go"]);
    assert_eq!(output.status.code(), Some(0), "{}\n{}", text(&output.stderr), text(&output.stdout));
    assert!(text(&output.stdout).contains("helper done"), "{}", text(&output.stdout));
    assert!(conversations(state.path()).contains("HELLO FROM THE CREW!"));
}

#[test]
fn gdn_validate_loads_a_dependency_s_script_module_and_names_its_package() {
    if !js_runtime_usable() {
        return;
    }
    let state = common::temp();
    let installed = state.path().join("packages/acme/crew/1.0.0");
    copy_dir(&fixture("packages/crew-1.0.0"), &installed);
    let module = installed.join("src/shout.ts");
    let source = fs::read_to_string(&module).unwrap_or_else(|e| panic!("{e}"));
    common::write(&module, &source.replace("  it: async", "  other: async"));
    let output = gdn(&fixture("packages/with-crew"), state.path(), &["--json", "validate"]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    let body: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"));
    let first = &body["diagnostics"][0];
    assert_eq!(first["code"], "E_CONFIG_SCRIPT_EXPORT_MISSING", "{body}");
    assert_eq!(first["path"], "@acme/crew/goondan.yaml#1.spec.exports[0].name", "{body}");
    let message = first["message"].as_str().unwrap_or_default();
    assert!(message.contains("of the installed package @acme/crew") && message.contains("other"), "{body}");
}
