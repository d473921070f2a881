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
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
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
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
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
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
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
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
    let body: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"));
    let first = &body["diagnostics"][0];
    assert_eq!(first["code"], "E_CONFIG_SCRIPT_EXPORT_MISSING", "{body}");
    assert_eq!(first["path"], "@acme/crew/goondan.yaml#1.spec.exports[0].name", "{body}");
    let message = first["message"].as_str().unwrap_or_default();
    assert!(message.contains("of the installed package @acme/crew") && message.contains("other"), "{body}");
}

/// `gdn ARGS` in `cwd` without `-c`: the default `./goondan.yaml`.
fn gdn_in(cwd: &Path, state: &Path, args: &[&str]) -> Output {
    let mut command = common::gdn_bin().state(state).command(args);
    command.current_dir(cwd).output().unwrap_or_else(|e| panic!("running gdn: {e}"))
}

#[test]
fn the_default_config_and_a_named_goondan_yaml_are_the_whole_split_bundle() {
    let state = common::temp();
    let bundle = fixture("packages/split-quickstart");
    // Without -c (`./goondan.yaml`), as the README runs it, and with -c naming the file:
    // its directory is the bundle, as the original loads its manifest's directory.
    let file = bundle.join("goondan.yaml");
    let named = file.to_str().unwrap_or_default();
    for output in [
        gdn_in(&bundle, state.path(), &["--json", "tool", "list"]),
        gdn(Path::new(named), state.path(), &["--json", "tool", "list"]),
    ] {
        let names = names(&json_out(&output));
        assert!(names.iter().any(|n| n == "word-count__count"), "{names:?}");
    }
    // Another file is still loaded alone.
    let alone = common::temp();
    fs::copy(bundle.join("agents.yaml"), alone.path().join("only.yaml")).unwrap_or_else(|e| panic!("{e}"));
    let output = gdn(&alone.path().join("only.yaml"), state.path(), &["--json", "validate"]);
    let body: Value =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&output.stdout)));
    assert_eq!(body["diagnostics"][0]["code"], "E_CONFIG_REF_NOT_FOUND", "{body}");
}

const ODD_SECRET: &str = "odd-name-secret-split-31c9";
const DEPENDENCY_SECRET: &str = "dependency-read-secret-77ab";

/// `env` through `bash__exec`, with variables that only the bundle's
/// `valueFrom.env` makes secrets: the output.
fn bash_env(bundle: &Path, state: &Path) -> String {
    let args = serde_json::json!({"command": "env"}).to_string();
    let output = common::gdn_bin()
        .state(state)
        .project(bundle)
        .env("ODD_NAME", ODD_SECRET)
        .env("DEP_READ_NAME", DEPENDENCY_SECRET)
        .env("PLAIN_SETTING", "plain-value")
        .run(["--json", "tool", "call", "bash__exec", "--args", &args]);
    let result = json_out(&output);
    result["output"]["stdout"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn variables_read_in_any_split_file_or_a_dependency_are_kept_from_tool_processes() {
    use goondan_test_support::{Agent, Bundle};
    let state = common::temp();
    let dir = common::temp();
    let full = serde_json::json!({"policy": "full"});
    Bundle::new()
        .openai_model("local", "m", "http://127.0.0.1:9/v1", "ODD_NAME")
        .agent(Agent::new("a", "local").base_tool("bash").with("sandbox", full))
        .write(dir.path())
        .unwrap_or_else(|e| panic!("{e}"));
    let files = common::split_by_kind(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(files, ["agents.yaml", "models.yaml"]);
    // The Model (which reads ODD_NAME) is in models.yaml: still a secret.
    let env = bash_env(dir.path(), state.path());
    assert!(env.contains("PLAIN_SETTING=plain-value"), "{env}");
    assert!(!env.contains(ODD_SECRET), "a variable models.yaml reads reached bash:\n{env}");
    assert!(env.contains(DEPENDENCY_SECRET), "nothing reads DEP_READ_NAME yet:\n{env}");

    // An installed dependency whose Model reads DEP_READ_NAME.
    let package = state.path().join("packages/acme/keyed/1.0.0");
    fs::create_dir_all(&package).unwrap_or_else(|e| panic!("{e}"));
    fs::write(
        package.join("goondan.yaml"),
        "apiVersion: goondan.ai/v1\nkind: Package\nmetadata: {name: \"@acme/keyed\"}\nspec: {version: 1.0.0}\n---\n\
         apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {name: keyed}\n\
         spec: {provider: openai, model: m, apiKey: {valueFrom: {env: DEP_READ_NAME}}}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    fs::write(
        dir.path().join("goondan.yaml"),
        "apiVersion: goondan.ai/v1\nkind: Package\nmetadata: {name: \"@test/keyed-user\"}\n\
         spec: {version: 0.1.0, dependencies: [{name: \"@acme/keyed\", version: \"^1.0.0\"}]}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    fs::write(
        dir.path().join("goondan.lock.yaml"),
        "lockfileVersion: 1\npackages:\n  \"@acme/keyed@1.0.0\":\n    version: \"1.0.0\"\n    dependencies: {}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let env = bash_env(dir.path(), state.path());
    assert!(env.contains("PLAIN_SETTING=plain-value"), "{env}");
    assert!(!env.contains(ODD_SECRET), "{env}");
    assert!(!env.contains(DEPENDENCY_SECRET), "a variable a dependency reads reached bash:\n{env}");
}

/// What `validate`, `tool list` and `run` (the README's first command, in
/// a work directory of its own) say for the bundle at `bundle` (copied
/// into a fresh directory, with a fresh state root).
fn quickstart_outputs(bundle: &Path) -> (Value, Value, String, Vec<String>, usize) {
    let project = common::temp();
    copy_dir(bundle, project.path());
    let state = common::temp();
    let work = common::temp();
    let validated = json_out(&gdn(project.path(), state.path(), &["--json", "validate"]));
    let listed = json_out(&gdn(project.path(), state.path(), &["--json", "tool", "list"]));
    let workdir = work.path().to_str().unwrap_or_default();
    let ran = gdn(project.path(), state.path(), &["run", "--input", "Take some notes", "--workdir", workdir]);
    assert_eq!(ran.status.code(), Some(0), "{}", text(&ran.stderr));
    let tools: Vec<String> =
        text(&ran.stderr).lines().filter(|l| l.contains('⚙')).map(|l| l.trim().to_owned()).collect();
    let instance = common::instance_path(state.path(), "assistant@default");
    let messages = fs::read_to_string(instance.join("messages.jsonl")).unwrap_or_default().lines().count();
    assert!(work.path().join("workspace/notes.md").is_file(), "the tools worked in --workdir");
    (validated, listed, text(&ran.stdout), tools, messages)
}

#[test]
fn the_quickstart_split_into_files_validates_lists_and_runs_as_the_quickstart() {
    if !js_runtime_usable() {
        return;
    }
    let single = quickstart_outputs(&common::repo_path("examples/quickstart"));
    let split = quickstart_outputs(&fixture("packages/split-quickstart"));
    assert_eq!(single.0["valid"], true, "{}", single.0);
    assert_eq!(split.0, single.0, "gdn validate --json");
    assert_eq!(split.1, single.1, "gdn tool list --json");
    assert!(single.2.contains("the second team member is grace. DONE."), "{}", single.2);
    assert_eq!(split.2, single.2, "gdn run's answer");
    assert_eq!(split.3, single.3, "the tool calls gdn run shows");
    assert_eq!(split.4, single.4, "the messages kept");
}

/// A bundle split over `agents.yaml` and `models.yaml`, without a goondan.yaml.
fn split_without_goondan_yaml() -> tempfile::TempDir {
    use goondan_test_support::{Agent, Bundle, reply_text};
    let dir = common::temp();
    Bundle::new()
        .scripted_model("m", [reply_text("hi")])
        .agent(Agent::new("a", "m"))
        .write(dir.path())
        .unwrap_or_else(|e| panic!("{e}"));
    let files = common::split_by_kind(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(files, ["agents.yaml", "models.yaml"]);
    dir
}

#[test]
fn doctor_and_validate_take_a_split_bundle_without_goondan_yaml_as_a_bundle() {
    let state = common::temp();
    let dir = split_without_goondan_yaml();
    let output = gdn(dir.path(), state.path(), &["--json", "doctor"]);
    let body: Value =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&output.stdout)));
    let checks = body["checks"].as_array().cloned().unwrap_or_default();
    let check = |name: &str| checks.iter().find(|c| c["name"] == name).cloned();
    assert!(check("bundle").is_none(), "the bundle was said to be missing: {body}");
    let validation = check("validation").unwrap_or_else(|| panic!("no validation check: {body}"));
    assert_eq!(validation["level"], "ok", "{validation}");
    // The report names the directory, not a goondan.yaml that is not there.
    let validated = gdn(dir.path(), state.path(), &["validate"]);
    assert_eq!(validated.status.code(), Some(0), "{}", text(&validated.stderr));
    let said = text(&validated.stdout);
    assert!(said.contains(&format!("{} is valid", dir.path().display())), "{said}");
    assert!(!said.contains("goondan.yaml"), "{said}");
}

#[test]
fn init_refuses_a_directory_that_holds_a_split_bundle() {
    let dir = split_without_goondan_yaml();
    let path = dir.path().to_str().unwrap_or_default();
    let output = common::gdn_bin().run(["init", path]);
    assert_eq!(output.status.code(), Some(3), "{}", text(&output.stdout));
    let said = text(&output.stderr);
    assert!(said.contains("agents.yaml") && said.contains("models.yaml") && said.contains("--force"), "{said}");
    assert!(!dir.path().join("goondan.yaml").exists(), "init wrote into the bundle");
}

#[test]
fn a_split_bundle_without_goondan_yaml_keeps_one_workspace_however_it_is_named() {
    let state = common::temp();
    let dir = split_without_goondan_yaml();
    // By its absolute path, then from inside it as `.`, then as `./`.
    let first = gdn(dir.path(), state.path(), &["run", "--input", "one"]);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    for config in [".", "./"] {
        let again = gdn_in(dir.path(), state.path(), &["-c", config, "run", "--input", "again"]);
        assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    }
    let listed = json_out(&gdn(dir.path(), state.path(), &["--json", "instance", "list"]));
    let rows = listed.as_array().cloned().unwrap_or_default();
    assert_eq!(rows.len(), 1, "one bundle, one instance: {listed}");
    assert_eq!(rows[0]["turns"], 3, "{listed}");
}

/// The attack: a state root kept inside the project (`--state-root
/// ./.state`), and the model writes `tools.yaml` into its working
/// directory (which lies in that state root). The next load must not take
/// it as one of the bundle's files — nor an installed package's manifest
/// under the state root's `packages/`.
#[test]
fn what_a_model_writes_under_a_state_root_inside_the_project_is_never_a_bundle_file() {
    let project = common::temp();
    let bundle = project.path().join("bundle");
    copy_dir(&fixture("packages/split-quickstart"), &bundle);
    let state = bundle.join(".state");
    let ran = gdn(&bundle, &state, &["run", "--input", "Take some notes"]);
    assert_eq!(ran.status.code(), Some(0), "{}", text(&ran.stderr));
    let workdirs: Vec<PathBuf> = fs::read_dir(state.join("workspaces"))
        .unwrap_or_else(|e| panic!("{e}"))
        .flatten()
        .map(|entry| entry.path().join("workdir"))
        .filter(|dir| dir.is_dir())
        .collect();
    assert_eq!(workdirs.len(), 1, "{workdirs:?}");
    // What a `bash__exec` of the model can write there.
    let injected = "apiVersion: goondan.ai/v1\nkind: Tool\nmetadata:\n  name: injected\nspec: {}\n";
    fs::write(workdirs[0].join("tools.yaml"), injected).unwrap_or_else(|e| panic!("{e}"));
    fs::create_dir_all(workdirs[0].join("deeper")).unwrap_or_else(|e| panic!("{e}"));
    fs::write(workdirs[0].join("deeper/agents.yaml"), injected).unwrap_or_else(|e| panic!("{e}"));
    // An installed package's manifest is its own, not the bundle's.
    let install = state.join("packages/acme/x/1.0.0");
    fs::create_dir_all(&install).unwrap_or_else(|e| panic!("{e}"));
    fs::write(install.join("goondan.yaml"), injected).unwrap_or_else(|e| panic!("{e}"));
    fs::write(install.join(".goondan-integrity"), "sha512-x").unwrap_or_else(|e| panic!("{e}"));
    let validated = json_out(&gdn(&bundle, &state, &["--json", "validate"]));
    assert_eq!(validated["valid"], true, "{validated}");
    let listed = json_out(&gdn(&bundle, &state, &["--json", "tool", "list"]));
    assert!(!names(&listed).iter().any(|n| n.starts_with("injected")), "{listed}");
}

/// The same attack through an explicit `--workdir` inside the bundle
/// (commands may write their workdir): it is refused before anything runs;
/// the bundle's directory itself stays allowed, read-only to commands.
#[test]
fn a_workdir_inside_the_bundle_is_refused_before_anything_runs() {
    let project = common::temp();
    let bundle = project.path().join("bundle");
    copy_dir(&fixture("packages/split-quickstart"), &bundle);
    let scratch = bundle.join("scratch");
    fs::create_dir_all(&scratch).unwrap_or_else(|e| panic!("{e}"));
    let state = project.path().join("state");
    let scratch_arg = scratch.to_string_lossy().into_owned();
    for args in [
        vec!["run", "--input", "Take some notes", "--workdir", &scratch_arg],
        vec!["tool", "call", "wait__seconds", "--args", "{\"seconds\": 0}", "--workdir", &scratch_arg],
    ] {
        let refused = gdn(&bundle, &state, &args);
        assert_eq!(refused.status.code(), Some(2), "{args:?}: {}", text(&refused.stderr));
        assert!(text(&refused.stderr).contains("is inside the bundle"), "{}", text(&refused.stderr));
    }
    assert!(!state.join("workspaces").exists(), "nothing ran");
    let bundle_arg = bundle.to_string_lossy().into_owned();
    let allowed = gdn(&bundle, &state, &["run", "--input", "Take some notes", "--workdir", &bundle_arg]);
    assert_eq!(allowed.status.code(), Some(0), "{}", text(&allowed.stderr));
}
