//! The `gdn` program end to end, over the fixture bundles in `tests/fixtures`
//! and the offline example in `examples/quickstart`.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

mod common;
use common::js_runtime_usable;
use goondan_test_support::{Agent, Bundle, json_stdout, reply_text, reply_tools, stderr, stdout};

fn repo_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative)
}

fn fixture(name: &str) -> PathBuf {
    repo_path(&format!("tests/fixtures/{name}"))
}

fn quickstart() -> PathBuf {
    repo_path("examples/quickstart")
}

/// Runs `gdn -c <bundle> <args…>` with colors and logs off.
fn gdn(bundle: &PathBuf, args: &[&str]) -> Output {
    gdn_with_stdin(bundle, args, None)
}

fn gdn_with_stdin(bundle: &PathBuf, args: &[&str], stdin: Option<&str>) -> Output {
    // A state root of the command's own: never the user's ~/.goondan.
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    common::gdn_bin().state(state.path()).project(bundle).run_with_stdin(args, stdin)
}

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

fn diagnostic_summary(report: &Value) -> Vec<(String, String)> {
    report["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| (d["code"].as_str().unwrap_or("").to_owned(), d["path"].as_str().unwrap_or("").to_owned()))
        .collect()
}

// ---- validate ----------------------------------------------------------

#[test]
fn validate_accepts_the_offline_example() {
    let output = gdn(&quickstart(), &["validate"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert!(stdout(&output).contains("is valid"), "{}", stdout(&output));
    assert!(!stdout(&output).contains('\u{1b}'), "colors must be off without a terminal");

    let output = gdn(&quickstart(), &["validate", "--json"]);
    assert_eq!(code(&output), 0);
    let report = json_stdout(&output);
    assert_eq!(report["valid"], true);
    // Its script tool needs a JavaScript runtime: without one, a warning (and only that).
    let codes: Vec<&str> =
        report["diagnostics"].as_array().into_iter().flatten().filter_map(|d| d["code"].as_str()).collect();
    let expected: &[&str] = if js_runtime_usable() { &[] } else { &["W_SCRIPT_RUNTIME_MISSING"] };
    assert_eq!(codes, expected, "{report}");
}

#[test]
fn validate_accepts_a_yaml_file_path() {
    let output = gdn(&quickstart().join("goondan.yaml"), &["validate", "--json"]);
    assert_eq!(code(&output), 0);
    assert_eq!(json_stdout(&output)["valid"], true);
}

#[test]
fn validate_reports_broken_references_with_codes_paths_and_positions() {
    let output = gdn(&fixture("broken-refs"), &["validate", "--json"]);
    assert_eq!(code(&output), 4);
    let report = json_stdout(&output);
    assert_eq!(report["valid"], false);
    assert_eq!(
        diagnostic_summary(&report),
        [
            ("E_CONFIG_INVALID_REF", "goondan.yaml#1.spec.tools[1]"),
            ("E_CONFIG_REF_NOT_FOUND", "goondan.yaml#1.spec.modelConfig.modelRef"),
            ("E_CONFIG_REF_NOT_FOUND", "goondan.yaml#1.spec.tools[0]"),
            ("E_CONFIG_REF_NOT_FOUND", "goondan.yaml#1.spec.tools[2]"),
            ("E_CONFIG_REF_NOT_FOUND", "goondan.yaml#2.spec.agents[0]"),
            ("E_CONFIG_INVALID_REF", "goondan.yaml#2.spec.entryAgent"),
        ]
        .map(|(c, p)| (c.to_owned(), p.to_owned()))
    );
    let first = &report["diagnostics"][0];
    assert_eq!(first["severity"], "error");
    assert_eq!((first["line"].as_u64(), first["column"].as_u64()), (Some(18), Some(7)));
    let bash = &report["diagnostics"][2];
    assert!(bash["suggestion"].as_str().unwrap_or("").contains("package: \"@goondan/base\""), "{bash}");
}

#[test]
fn validate_reports_every_tool_rule_in_one_pass() {
    let output = gdn(&fixture("broken-tools"), &["validate", "--json"]);
    assert_eq!(code(&output), 4);
    let report = json_stdout(&output);
    let summary = diagnostic_summary(&report);
    let expected = [
        ("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#0.metadata.name"),
        ("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#0.spec.errorMessageLimit"),
        ("E_CONFIG_ENTRY_NOT_FOUND", "goondan.yaml#0.spec.entry"),
        ("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#0.spec.exports[0].name"),
        ("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#0.spec.exports[2].name"),
        ("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#0.spec.exports[3].name"),
        ("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#0.spec.exports[3]"),
        ("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#0.spec.exports[3].parameters"),
        ("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#1.spec.entry"),
        ("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#1.spec.exports"),
        ("E_CONFIG_UNSUPPORTED_API_VERSION", "goondan.yaml#2.apiVersion"),
        ("E_CONFIG_ENTRY_NOT_FOUND", "goondan.yaml#2.spec.entry"),
        ("E_CONFIG_UNKNOWN_KIND", "goondan.yaml#3.kind"),
    ]
    .map(|(c, p)| (c.to_owned(), p.to_owned()));
    assert_eq!(summary, expected);
    // Mixed case and a missing description are warnings, not errors.
    let severities: Vec<&str> =
        report["diagnostics"].as_array().into_iter().flatten().filter_map(|d| d["severity"].as_str()).collect();
    assert_eq!(severities.iter().filter(|s| **s == "warning").count(), 2);
}

#[test]
fn validate_reports_malformed_yaml_with_its_position() {
    let output = gdn(&fixture("malformed"), &["validate", "--json"]);
    assert_eq!(code(&output), 4);
    let report = json_stdout(&output);
    assert_eq!(diagnostic_summary(&report), [("E_CONFIG_PARSE_ERROR".to_owned(), "goondan.yaml".to_owned())]);
    assert_eq!(report["diagnostics"][0]["line"], 7);

    let human = gdn(&fixture("malformed"), &["validate"]);
    assert_eq!(code(&human), 4);
    let text = stdout(&human);
    assert!(text.contains("error[E_CONFIG_PARSE_ERROR] goondan.yaml (line 7, column 9)"), "{text}");
    assert!(text.contains("1 error"), "{text}");
}

#[test]
fn validate_rejects_a_document_that_is_not_a_mapping() {
    let output = gdn(&fixture("not-a-mapping"), &["validate", "--json"]);
    assert_eq!(code(&output), 4);
    assert_eq!(diagnostic_summary(&json_stdout(&output))[0].0, "E_CONFIG_SCHEMA_INVALID");
}

#[test]
fn validate_reports_a_missing_bundle() {
    let output = gdn(&repo_path("tests/fixtures/does-not-exist"), &["validate", "--json"]);
    assert_eq!(code(&output), 4);
    assert_eq!(diagnostic_summary(&json_stdout(&output))[0].0, "E_CONFIG_FILE_NOT_FOUND");
}

// ---- tool list ---------------------------------------------------------

#[test]
fn tool_list_prints_the_catalog_exactly_as_a_model_gets_it() {
    let output = gdn(&fixture("multi-agent"), &["tool", "list", "--json"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert_eq!(
        json_stdout(&output),
        json!([{
            "name": "wait__seconds",
            "description": "Pause execution for the specified number of seconds",
            "parameters": {
                "type": "object",
                "properties": {"seconds": {"type": "number", "description": "Seconds to wait (range: 0 to 300)."}},
                "additionalProperties": false,
                "required": ["seconds"]
            },
            "source": {"type": "config", "name": "wait"}
        }])
    );
}

#[test]
fn tool_list_for_a_named_agent_includes_local_tools() {
    let output = gdn(&fixture("multi-agent"), &["tool", "list", "--json", "--agent", "researcher"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let names: Vec<String> = json_stdout(&output)
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        names,
        [
            "text-transform__replace",
            "text-transform__slice",
            "text-transform__split",
            "text-transform__join",
            "text-transform__trim",
            "text-transform__case",
            "short-errors__run"
        ]
    );
    let human = gdn(&fixture("multi-agent"), &["tool", "list", "--agent", "researcher"]);
    let text = stdout(&human);
    // The script tool has a handler now (run by the JavaScript host).
    assert!(text.contains("short-errors__run") && !text.contains("(no handler in this build)"), "{text}");
    assert!(text.contains("7 tools for agent 'researcher'"), "{text}");
}

#[test]
fn tool_list_with_an_unknown_agent_is_a_config_error() {
    let output = gdn(&fixture("multi-agent"), &["tool", "list", "--agent", "nobody"]);
    assert_eq!(code(&output), 3);
    assert!(stderr(&output).contains("no Agent named 'nobody'"), "{}", stderr(&output));
}

#[test]
fn tool_list_on_a_broken_bundle_exits_3_with_diagnostics_on_stderr() {
    let output = gdn(&fixture("broken-refs"), &["tool", "list"]);
    assert_eq!(code(&output), 3);
    assert!(stdout(&output).is_empty());
    assert!(stderr(&output).contains("E_CONFIG_REF_NOT_FOUND"), "{}", stderr(&output));
}

// ---- tool call ---------------------------------------------------------

#[test]
fn tool_call_runs_a_builtin_through_the_pipeline() {
    let args = json!({"data": "{\"a\": {\"b\": [1, 2]}}", "path": "a.b[1]"}).to_string();
    let output = gdn(&quickstart(), &["tool", "call", "json-query__query", "--args", &args]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert_eq!(json_stdout(&output), json!({"status": "ok", "output": {"path": "a.b[1]", "found": true, "value": 2}}));

    let output = gdn(
        &quickstart(),
        &["--json", "tool", "call", "text-transform__case", "--args", r#"{"text":"Hi","to":"upper"}"#],
    );
    assert_eq!(code(&output), 0);
    assert_eq!(stdout(&output).lines().count(), 1, "--json prints one line");
    assert_eq!(json_stdout(&output)["output"]["result"], "HI");
}

#[test]
fn tool_call_reports_invalid_arguments_in_the_original_format() {
    let output = gdn(&quickstart(), &["tool", "call", "json-query__query", "--args", r#"{"path": 3, "extra": true}"#]);
    assert_eq!(code(&output), 1);
    let result = json_stdout(&output);
    assert_eq!(result["status"], "error");
    assert_eq!(result["error"]["code"], "E_TOOL_INVALID_ARGS");
    assert_eq!(result["error"]["name"], "ToolInputValidationError");
    let message = result["error"]["message"].as_str().unwrap_or("");
    assert!(message.starts_with("Invalid arguments for tool 'json-query__query': "), "{message}");
    for part in [
        "args.path: expected string but got integer",
        "args.data: required property is missing",
        "args.extra: unexpected property",
    ] {
        assert!(message.contains(part), "{message}");
    }
    assert!(result["error"]["suggestion"].as_str().unwrap_or("").contains("required=[data], allowed=[data, path]"));
}

#[test]
fn tool_call_outside_the_catalog_is_refused() {
    let output = gdn(&quickstart(), &["tool", "call", "http-fetch__get", "--args", r#"{"url":"https://example.com"}"#]);
    assert_eq!(code(&output), 1);
    let result = json_stdout(&output);
    assert_eq!(result["error"]["code"], "E_TOOL_NOT_IN_CATALOG");
    assert_eq!(result["error"]["message"], "Tool 'http-fetch__get' is not available in the current Tool Catalog.");
}

#[test]
fn tool_call_of_a_script_tool_runs_it_on_the_js_runtime() {
    let output = gdn(&quickstart(), &["tool", "call", "word-count__count", "--args", r#"{"text":"a b"}"#]);
    let result = json_stdout(&output);
    if js_runtime_usable() {
        assert_eq!(code(&output), 0, "{}", stderr(&output));
        assert_eq!(result["status"], "ok");
        assert_eq!(result["output"]["words"], 2);
    } else {
        assert_eq!(code(&output), 1);
        assert_eq!(result["error"]["code"], "E_SCRIPT_RUNTIME_MISSING");
        let message = result["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("word-count.ts"), "{message}");
        let validate = gdn(&quickstart(), &["validate"]);
        assert!(stdout(&validate).contains("W_SCRIPT_RUNTIME_MISSING"), "{}", stdout(&validate));
    }
}

/// `gdn --json validate` with every JavaScript runtime made unusable
/// (`GOONDAN_JS_RUNTIME` naming a missing binary, nothing on `PATH`).
fn validate_without_js(bundle: &PathBuf) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gdn"))
        .arg("-c")
        .arg(bundle)
        .args(["--json", "validate"])
        .env("NO_COLOR", "1")
        .env("GOONDAN_JS_RUNTIME", "/nonexistent/js-runtime")
        .env("PATH", "/nonexistent")
        .output()
        .unwrap_or_else(|e| panic!("spawn gdn: {e}"))
}

#[test]
fn validate_warns_when_script_tools_have_no_runtime() {
    let output = validate_without_js(&quickstart());
    assert_eq!(code(&output), 0, "a warning does not make the bundle invalid: {}", stderr(&output));
    let report = json_stdout(&output);
    let warning = report["diagnostics"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["code"] == "W_SCRIPT_RUNTIME_MISSING"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(warning["severity"], "warning", "{report}");
    assert!(warning["suggestion"].as_str().is_some_and(|s| s.contains("GOONDAN_JS_RUNTIME")), "{report}");
}

#[test]
fn validate_reports_script_exports_the_module_lacks_and_modules_that_do_not_load() {
    let output = gdn(&fixture("script-missing-export"), &["validate", "--json"]);
    let report = json_stdout(&output);
    if !js_runtime_usable() {
        assert_eq!(code(&output), 0, "{}", stderr(&output));
        let codes: Vec<_> = diagnostic_summary(&report).into_iter().map(|(code, _)| code).collect();
        assert_eq!(codes, ["W_SCRIPT_RUNTIME_MISSING"], "{report}");
        return;
    }
    assert_eq!(code(&output), 4, "{}", stderr(&output));
    assert_eq!(report["valid"], false);
    assert_eq!(
        diagnostic_summary(&report),
        [
            ("E_CONFIG_SCRIPT_EXPORT_MISSING".to_owned(), "goondan.yaml#0.spec.exports[1].name".to_owned()),
            ("E_CONFIG_SCRIPT_MODULE".to_owned(), "goondan.yaml#1.spec.entry".to_owned()),
        ],
        "{report}"
    );
    let missing = &report["diagnostics"][0];
    assert_eq!(missing["severity"], "error");
    let message = missing["message"].as_str().unwrap_or_default();
    assert!(message.contains("partial.ts") && message.contains("'absent'"), "{message}");
    assert_eq!(missing["suggestion"], "add `absent` to the module's `handlers`");
    let broken = &report["diagnostics"][1];
    assert_eq!(broken["severity"], "error");
    assert!(broken["message"].as_str().is_some_and(|m| m.contains("broken.ts")), "{report}");
}

#[test]
fn validate_without_a_runtime_only_warns_about_script_modules() {
    let output = validate_without_js(&fixture("script-missing-export"));
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let report = json_stdout(&output);
    let codes: Vec<_> = diagnostic_summary(&report).into_iter().map(|(code, _)| code).collect();
    assert_eq!(codes, ["W_SCRIPT_RUNTIME_MISSING"], "{report}");
}

#[test]
fn tool_call_truncates_errors_with_the_tools_own_limit() {
    // wait has errorMessageLimit 600; five long unexpected properties make a longer message.
    let mut args = serde_json::Map::new();
    args.insert("seconds".into(), json!(1));
    for i in 0..5 {
        args.insert(format!("{}{i}", "x".repeat(200)), json!(true));
    }
    let output = gdn(&quickstart(), &["tool", "call", "wait__seconds", "--args", &Value::Object(args).to_string()]);
    assert_eq!(code(&output), 1);
    let message = json_stdout(&output)["error"]["message"].as_str().unwrap_or("").to_owned();
    assert_eq!(message.chars().count(), 600, "{message}");
    assert!(message.ends_with("... (truncated)"));
}

/// `gdn --json -c tests/fixtures/tool-registry tool call NAME --agent AGENT --args ARGS`.
fn registry_call(agent: &str, name: &str, args: &Value) -> (Output, Value) {
    let args = args.to_string();
    let output = gdn(&fixture("tool-registry"), &["--json", "tool", "call", name, "--agent", agent, "--args", &args]);
    let result = json_stdout(&output);
    (output, result)
}

/// Spec 002 §1.1 and §7.1: an agent's registry holds every Tool of the
/// bundle (its own package's, and the base Tools other agents declare),
/// its catalog only its own; a call past the catalog needs the agent's
/// `spec.policy.toolCallScope: registry`.
#[test]
fn tool_call_reaches_the_registry_only_under_the_agents_policy() {
    let case = json!({"text": "a", "to": "upper"});
    // text-transform is in strict's registry (open declares it), not its catalog.
    let (output, result) = registry_call("strict", "text-transform__case", &case);
    assert_eq!(code(&output), 1);
    assert_eq!(result["error"]["code"], "E_TOOL_NOT_IN_CATALOG", "{result}");

    // open may: json-query is declared by strict only.
    let query = json!({"data": "{\"a\": [1, 2]}", "path": "a[1]"});
    let (output, result) = registry_call("open", "json-query__query", &query);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert_eq!(result["output"]["value"], 2, "{result}");
    // Its schema still holds.
    let (_, result) = registry_call("open", "json-query__query", &json!({"path": "a"}));
    assert_eq!(result["error"]["code"], "E_TOOL_INVALID_ARGS", "{result}");
    // A base Tool no agent of the bundle declares is in no registry.
    let (_, result) = registry_call("open", "http-fetch__get", &json!({"url": "https://example.com"}));
    assert_eq!(result["error"]["code"], "E_TOOL_NOT_IN_CATALOG", "{result}");
    // The bundle's own script Tool, declared by strict only: reached (run,
    // or refused for want of a runtime — not for want of a catalog entry).
    let (_, result) = registry_call("open", "terse__fail", &json!({"size": 3}));
    let expected = if js_runtime_usable() { "eee" } else { "" };
    match result["error"]["code"].as_str() {
        Some("E_SCRIPT_RUNTIME_MISSING") => assert!(expected.is_empty(), "{result}"),
        _ => assert_eq!(result["error"]["message"], expected, "{result}"),
    }

    // The catalog stays the agent's: tool list shows only its own tools.
    let output = gdn(&fixture("tool-registry"), &["--json", "tool", "list", "--agent", "open"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let listed = stdout(&output);
    assert!(listed.contains("text-transform__case") && !listed.contains("json-query__query"), "{listed}");
    assert!(!listed.contains("terse__fail"), "{listed}");

    // The policy's key is known to validation; a value it does not know is an error.
    let output = gdn(&fixture("tool-registry"), &["--json", "validate"]);
    let report = json_stdout(&output);
    let codes: Vec<String> = diagnostic_summary(&report).into_iter().map(|(code, _)| code).collect();
    assert!(!codes.iter().any(|code| code == "W_CONFIG_UNKNOWN_KEY" || code.starts_with('E')), "{report}");
}

/// Spec 002 §2.3 and §8.3: a Tool whose YAML leaves `errorMessageLimit`
/// out cuts error messages at 1000 characters; one that sets it, at its own.
#[test]
fn error_messages_are_cut_at_1000_when_the_tool_sets_no_limit() {
    // Refused arguments (no runtime needed): five long unexpected properties.
    let mut args = serde_json::Map::new();
    args.insert("size".into(), json!(1));
    for i in 0..5 {
        args.insert(format!("{}{i}", "x".repeat(300)), json!(true));
    }
    for (tool, limit) in [("terse__fail", 1000), ("roomy__fail", 1200)] {
        let (output, result) = registry_call("strict", tool, &Value::Object(args.clone()));
        assert_eq!(code(&output), 1);
        assert_eq!(result["error"]["code"], "E_TOOL_INVALID_ARGS", "{result}");
        let message = result["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(message.chars().count(), limit, "{tool}: {message}");
        assert!(message.ends_with("... (truncated)"), "{message}");
    }
    if !js_runtime_usable() {
        return;
    }
    // The handler's own error.
    for (tool, limit) in [("terse__fail", 1000), ("roomy__fail", 1200)] {
        let (output, result) = registry_call("strict", tool, &json!({"size": 3000}));
        assert_eq!(code(&output), 1, "{}", stderr(&output));
        let message = result["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(message.chars().count(), limit, "{tool}: {result}");
        let kept = limit - "... (truncated)".len();
        assert_eq!(message, format!("{}... (truncated)", "e".repeat(kept)), "{tool}");
    }
    // A message within the limit is whole.
    let (_, result) = registry_call("strict", "terse__fail", &json!({"size": 1000}));
    assert_eq!(result["error"]["message"], "e".repeat(1000));
}

#[test]
fn tool_call_deadline_becomes_a_timeout_result() {
    let output =
        gdn(&quickstart(), &["tool", "call", "wait__seconds", "--args", r#"{"seconds": 30}"#, "--timeout-ms", "100"]);
    assert_eq!(code(&output), 1);
    let result = json_stdout(&output);
    assert_eq!(result["error"]["code"], "E_TOOL_TIMEOUT");
    assert_eq!(result["error"]["name"], "ToolTimeoutError");
}

#[test]
fn tool_call_reads_arguments_from_a_file_and_from_stdin() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let file = dir.path().join("args.json");
    std::fs::write(&file, r#"{"reason": "  config changed  "}"#).unwrap_or_else(|e| panic!("{e}"));
    let file_arg = file.to_string_lossy().into_owned();
    let output = gdn(&quickstart(), &["tool", "call", "self-restart__request", "--args-file", &file_arg]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert_eq!(
        json_stdout(&output),
        json!({"status": "ok", "output": {"ok": true, "restartRequested": true, "restartReason": "config changed"}})
    );

    let output = gdn_with_stdin(
        &quickstart(),
        &["tool", "call", "text-transform__trim", "--args-file", "-"],
        Some(r#"{"text": "  x  ", "mode": "start"}"#),
    );
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert_eq!(json_stdout(&output)["output"]["result"], "x  ");
}

#[test]
fn tool_call_usage_errors_exit_2() {
    for (args, needle) in [
        (vec!["tool", "call", "wait__seconds", "--args", "{not json"], "not valid JSON"),
        (vec!["tool", "call", "wait__seconds", "--args", "[1, 2]"], "must be a JSON object, got array"),
        (vec!["tool", "call", "wait__seconds", "--args-file", "/no/such/file.json"], "cannot read --args-file"),
        (vec!["tool", "call", "wait__seconds", "--workdir", "/no/such/dir"], "is not a directory"),
    ] {
        let output = gdn(&quickstart(), &args);
        assert_eq!(code(&output), 2, "{args:?}: {}", stderr(&output));
        assert!(stderr(&output).contains(needle), "{args:?}: {}", stderr(&output));
        assert!(stdout(&output).is_empty(), "{args:?}");
    }
    // clap's own usage errors also exit 2.
    let output = gdn(&quickstart(), &["tool", "call", "x__y", "--args", "{}", "--args-file", "f"]);
    assert_eq!(code(&output), 2);
    // An Agent the bundle lacks is the original's configuration class.
    let output = gdn(&quickstart(), &["tool", "call", "wait__seconds", "--agent", "ghost"]);
    assert_eq!(code(&output), 3, "{}", stderr(&output));
    assert!(stderr(&output).contains("no Agent named 'ghost'"), "{}", stderr(&output));
}

#[test]
fn tool_call_on_a_broken_bundle_exits_3() {
    let output = gdn(&fixture("broken-tools"), &["tool", "call", "x__y"]);
    assert_eq!(code(&output), 3);
    assert!(stderr(&output).contains("E_CONFIG_UNKNOWN_KIND"), "{}", stderr(&output));
}

#[test]
fn tool_call_uses_the_agent_named_with_agent() {
    let output = gdn(
        &fixture("multi-agent"),
        &["tool", "call", "text-transform__case", "--args", r#"{"text":"a","to":"upper"}"#],
    );
    assert_eq!(code(&output), 1, "coordinator does not have text-transform");
    assert_eq!(json_stdout(&output)["error"]["code"], "E_TOOL_NOT_IN_CATALOG");
    let output = gdn(
        &fixture("multi-agent"),
        &["tool", "call", "text-transform__case", "--agent", "researcher", "--args", r#"{"text":"a","to":"upper"}"#],
    );
    assert_eq!(code(&output), 0, "{}", stderr(&output));
}

/// Runs gdn with its standard output a pipe whose reader is already gone,
/// as in `gdn … | head -c 0`.
fn gdn_into_closed_pipe(bundle: &PathBuf, args: &[&str]) -> Output {
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut child = common::gdn_bin().state(state.path()).project(bundle).child(args);
    // Close the only reader before gdn writes anything: its writes fail with EPIPE.
    drop(child.stdout.take());
    child.wait_with_output().unwrap_or_else(|e| panic!("wait gdn: {e}"))
}

#[test]
fn a_closed_pipe_ends_output_quietly_with_status_0() {
    for args in [
        &["tool", "list"][..],
        &["tool", "call", "text-transform__case", "--args", r#"{"text": "hello", "to": "upper"}"#][..],
        &["validate"][..],
        &["--json", "tool", "list"][..],
    ] {
        let output = gdn_into_closed_pipe(&quickstart(), args);
        assert_eq!(code(&output), 0, "{args:?}: {}", stderr(&output));
        assert_eq!(stderr(&output), "", "{args:?} printed to stderr");
    }
}

/// `gdn validate --format github` prints one workflow command per problem
/// (file, line, column, code as the title); `--strict` fails on warnings.
#[test]
fn validate_speaks_github_annotations_and_strict_fails_on_warnings() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let bundle = dir.path().join("goondan.yaml");
    std::fs::write(
        &bundle,
        "apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {name: m}\nspec:\n  provider: openai\n  model: x\n  modle: y\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let output = gdn(&bundle, &["validate", "--format", "github"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "a warning alone passes: {stdout}");
    let line = stdout.lines().next().unwrap_or_default();
    assert!(line.starts_with("::warning file="), "{stdout}");
    assert!(line.contains(",line=7,col=10,title=W_CONFIG_UNKNOWN_KEY::goondan.yaml#0.spec.modle: "), "{stdout}");
    assert!(line.contains("%0ADid you mean `model`?"), "{stdout}");
    let strict = gdn(&bundle, &["validate", "--strict"]);
    assert_eq!(strict.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&strict.stderr).contains("--strict"), "{strict:?}");
    let json = gdn(&bundle, &["validate", "--strict", "--format", "json"]);
    let body: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap_or_default();
    assert_eq!((body["valid"].as_bool(), body["strict"].as_bool()), (Some(false), Some(true)), "{body}");
}

/// Runs `gdn run --input go` with the agent `a` (bash) on a scripted
/// Model answering `replies`, under `script` (util-linux), which gives it
/// a pseudo-terminal: the bundle's directory and what the terminal got.
fn run_on_a_terminal(replies: impl IntoIterator<Item = Value>) -> (tempfile::TempDir, Output) {
    let replies: Vec<Value> = replies.into_iter().collect();
    let dir = Bundle::new()
        .scripted_model_as("m", "s", json!({"replies": replies}))
        .agent(Agent::new("a", "m").base_tool("bash"))
        .write_temp()
        .unwrap_or_else(|e| panic!("{e}"));
    let command = format!("{} -c {} --no-color run --input go", env!("CARGO_BIN_EXE_gdn"), dir.path().display());
    let output = Command::new("script")
        .args(["-q", "-e", "-c", &command, "/dev/null"])
        .env("GOONDAN_STATE_ROOT", dir.path().join("state"))
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("script (util-linux) is needed for this test: {e}"));
    (dir, output)
}

/// On a terminal, a tool call that takes a while shows what runs and for
/// how long (after a second), and the line is cleared when it ends. Runs
/// gdn under `script` (util-linux), which gives it a pseudo-terminal.
#[test]
fn a_running_tool_shows_its_elapsed_time_on_a_terminal() {
    let sleep = reply_tools([("bash__exec", json!({"command": "sleep 2.3"}))]);
    let (dir, output) = run_on_a_terminal([sleep, reply_text("slept")]);
    let seen = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{seen}");
    assert!(seen.contains("⚙ bash__exec … 1s") && seen.contains("⚙ bash__exec … 2s"), "{seen:?}");
    // Cleared before the final line of the call.
    assert!(seen.contains("\r\x1b[2K  ⚙ bash__exec → ok"), "{seen:?}");
    assert!(seen.contains("slept"), "{seen:?}");
    // Not on a pipe.
    let piped = gdn(&dir.path().join("goondan.yaml"), &["run", "--input", "go"]);
    assert!(!String::from_utf8_lossy(&piped.stderr).contains('…'), "{piped:?}");
}

/// What a terminal shows for `bytes`: `\r` returns to the start of the
/// line, `ESC [ 2 K` clears it, other escape sequences draw nothing, and
/// text overwrites what is under the cursor.
fn rendered(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    let mut lines = Vec::new();
    let mut line: Vec<char> = Vec::new();
    let mut cursor = 0;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' => {
                lines.push(line.iter().collect::<String>().trim_end().to_owned());
                line.clear();
                cursor = 0;
            }
            '\r' => cursor = 0,
            '\x1b' => {
                let mut sequence = String::new();
                for next in chars.by_ref() {
                    sequence.push(next);
                    if next.is_ascii_alphabetic() {
                        break;
                    }
                }
                if sequence == "[2K" {
                    line.clear();
                }
            }
            c => {
                if cursor < line.len() {
                    line[cursor] = c;
                } else {
                    line.resize(cursor, ' ');
                    line.push(c);
                }
                cursor += 1;
            }
        }
    }
    if !line.is_empty() {
        lines.push(line.iter().collect());
    }
    lines
}

/// On a terminal, each step's text stays on a line of its own: the line
/// of a running tool neither erases it nor joins the next step's.
#[test]
fn each_steps_text_keeps_its_own_line_on_a_terminal() {
    let step = |text: &str, command: &str| json!({"text": text, "toolCalls": [{"name": "bash__exec", "args": {"command": command}}]});
    let (_dir, output) =
        run_on_a_terminal([step("Let me check.", "sleep 1.4"), step("Still checking.", "true"), reply_text("Done.")]);
    assert_eq!(output.status.code(), Some(0), "{:?}", String::from_utf8_lossy(&output.stdout));
    let shown = rendered(&output.stdout);
    let lines: Vec<&str> = shown.iter().map(String::as_str).filter(|line| !line.is_empty()).collect();
    assert_eq!(
        lines,
        ["Let me check.", "  ⚙ bash__exec → ok", "Still checking.", "  ⚙ bash__exec → ok", "Done."],
        "{:?}",
        String::from_utf8_lossy(&output.stdout)
    );
}

/// `gdn doctor` names what would keep the bundle from running, each with a
/// fix: a Model's unset key, an MCP server's missing program, a busy
/// connector port; exit 1 on any error, 0 when everything is ready.
#[test]
fn doctor_finds_a_missing_key_a_missing_program_and_a_busy_port() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let port = busy.local_addr().map(|a| a.port()).unwrap_or_else(|e| panic!("{e}"));
    let bundle = dir.path().join("goondan.yaml");
    std::fs::write(
        &bundle,
        format!(
            "apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {{name: real}}\nspec:\n  provider: openai\n  model: gpt-x\n  apiKey: {{valueFrom: {{env: GOONDAN_DOCTOR_TEST_UNSET_KEY}}}}\n---\n\
             apiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  modelConfig: {{modelRef: Model/real}}\n  extensions:\n    - kind: Extension\n      name: mcp\n      package: \"@goondan/base\"\n      config:\n        servers:\n          gone: {{command: goondan-no-such-program-anywhere}}\n---\n\
             apiVersion: goondan.ai/v1\nkind: Swarm\nmetadata: {{name: s}}\nspec: {{entryAgent: Agent/a, agents: [Agent/a]}}\n---\n\
             apiVersion: goondan.ai/v1\nkind: Connection\nmetadata: {{name: hooks}}\nspec:\n  connectorRef: {{kind: Connector, name: webhook, package: \"@goondan/base\"}}\n  config:\n    WEBHOOK_PORT: {{value: \"{port}\"}}\n"
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let output = gdn(&bundle, &["--json", "doctor"]);
    assert_eq!(output.status.code(), Some(1), "{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    let errors: Vec<String> = report["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["level"] == "error")
        .map(|c| {
            format!(
                "{} | {} | {}",
                c["name"].as_str().unwrap_or(""),
                c["detail"].as_str().unwrap_or(""),
                c["fix"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(errors.len(), 3, "{report:#}");
    assert!(
        errors[0].starts_with("Model real | ") && errors[0].contains("GOONDAN_DOCTOR_TEST_UNSET_KEY"),
        "{errors:?}"
    );
    assert!(
        errors[1].starts_with("a › gone | 'goondan-no-such-program-anywhere' is not a program on PATH"),
        "{errors:?}"
    );
    assert!(errors[2].starts_with("hooks (webhook) | ") && errors[2].contains("is in use"), "{errors:?}");
    assert!(errors.iter().all(|e| !e.ends_with("| ")), "every error has a fix: {errors:?}");
    drop(busy);
    // A ready bundle: exit 0.
    let ready = gdn(&quickstart(), &["doctor"]);
    let text = String::from_utf8_lossy(&ready.stdout);
    assert!(text.contains("state root") && text.contains("passed"), "{text}");
    // It tried the sandbox the quickstart's agent runs in (this machine has
    // Landlock and user namespaces).
    assert!(text.contains("✓ Sandbox: Landlock") && text.contains("run confined"), "{text}");
}

/// An extension whose module does not load is the bundle's problem, a
/// configuration error: every command that builds the agent exits 3 with
/// the extension named (`gdn run` used to exit 1 where `tool list` exited 2; both 3 now, the original's class).
#[test]
fn an_extension_that_does_not_load_is_exit_3_for_every_command() {
    if !js_runtime_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let bundle = dir.path().join("goondan.yaml");
    std::fs::write(
        &bundle,
        "apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {name: m}\nspec:\n  provider: scripted\n  model: s\n  options:\n    replies: [{text: pong}]\n---\n\
         apiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {name: a}\nspec:\n  modelConfig: {modelRef: Model/m}\n  extensions: [Extension/broken]\n---\n\
         apiVersion: goondan.ai/v1\nkind: Extension\nmetadata: {name: broken}\nspec:\n  entry: ./broken.mjs\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.path().join("broken.mjs"), "throw new Error('this extension does not load');\n")
        .unwrap_or_else(|e| panic!("{e}"));
    for args in [
        &["run", "--input", "hi"][..],
        &["--json", "run", "--input", "hi"],
        &["tool", "list"],
        &["tool", "call", "anything", "--args", "{}"],
        &["mcp", "serve"],
    ] {
        let output = gdn(&bundle, args);
        // With --json the reason is in the printed object.
        let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert_eq!(output.status.code(), Some(3), "{args:?}: {said}");
        assert!(said.contains("extension 'broken'") && said.contains("does not load"), "{args:?}: {said}");
    }
}
