//! The help catalog of error codes (`docs/ERRORS.md`): it and the code lists
//! of the crates stay in step, `gdn help` reads it, and error results link
//! to it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

mod common;
use goondan_test_support::{json_stdout, stderr, stdout};

const ERRORS_URL: &str = "https://github.com/goondan/goondan-rs/blob/main/docs/ERRORS.md";

/// Every code the runtime reports, from the crates' own lists.
fn known_codes() -> BTreeSet<&'static str> {
    let mut codes = BTreeSet::new();
    codes.extend(goondan_core::codes::ALL);
    codes.extend(goondan_ipc::codes::ALL);
    codes.extend(goondan_agent::instance::ready_codes::ALL);
    codes.extend(goondan_mcp::handler::CODES);
    codes.extend(goondan_script::connector::CODES);
    codes.extend(goondan_config::DiagnosticCode::ALL.iter().map(|code| code.as_str()));
    codes
}

/// Codes the sources use that never reach a user as a code: an extension's
/// install failure is reported as `AGENT_EXTENSION_FAILED` with its message
/// (the code stays inside), and `E_CONNECTOR_EMIT` is the connector host's
/// fallback for a refusal without a code, which the service never sends.
const INTERNAL: [&str; 4] = ["E_EXT_INIT", "E_EXT_LOAD", "E_EXT_UNSUPPORTED", "E_CONNECTOR_EMIT"];

#[test]
fn every_code_has_an_entry_and_every_entry_is_a_code() {
    let known = known_codes();
    let documented: BTreeSet<&str> = goondan_core::help::entries().iter().map(|entry| entry.code).collect();
    let missing: Vec<&&str> = known.difference(&documented).collect();
    assert!(missing.is_empty(), "docs/ERRORS.md has no entry for {missing:?}");
    let unknown: Vec<&&str> = documented.difference(&known).collect();
    assert!(unknown.is_empty(), "docs/ERRORS.md has entries for codes no crate lists: {unknown:?}");
}

fn source_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            source_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs" || ext == "mjs") {
            found.push(path);
        }
    }
}

/// The quoted `E_…` / `W_…` words of `code` (`"E_TOOL"`, `'E_SCRIPT_MODULE'`).
fn quoted_codes(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for quote in ['"', '\''] {
        for (index, _) in code.match_indices(quote) {
            let rest = &code[index + 1..];
            let word: String =
                rest.chars().take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_').collect();
            let closed = rest[word.len()..].starts_with(quote);
            if closed && (word.starts_with("E_") || word.starts_with("W_")) && word.len() > 2 && !word.ends_with('_') {
                found.push(word);
            }
        }
    }
    found
}

/// A code written as a literal somewhere in the library and binary sources
/// (or the JavaScript hosts) is on one of the lists, so it has an entry:
/// a new code cannot be added without one.
#[test]
fn every_code_literal_in_the_sources_is_listed() {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(common::repo_path("crates")).unwrap_or_else(|e| panic!("{e}")).flatten() {
        source_files(&entry.path().join("src"), &mut files);
    }
    let known = known_codes();
    let mut unlisted = BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        // Unit tests use codes of their own.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for word in quoted_codes(code) {
            if !known.contains(word.as_str()) && !INTERNAL.contains(&word.as_str()) {
                unlisted.insert(format!("{word} ({})", file.display()));
            }
        }
    }
    assert!(unlisted.is_empty(), "codes in the sources that no list has (add them, and an entry):\n{unlisted:#?}");
}

#[test]
fn the_scan_finds_quoted_codes_only() {
    let found = quoted_codes(r#"x("E_TOOL", 'E_SCRIPT_MODULE'); "E_CONFIG_" "NOT_A_CODE" "E_lower" `E_TICK`"#);
    assert_eq!(found, ["E_TOOL", "E_SCRIPT_MODULE"]);
}

/// Runs `gdn <args…>` with colors and logs off and a state root of its own.
fn gdn(bundle: Option<&Path>, args: &[&str]) -> Output {
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let gdn = common::gdn_bin().state(state.path());
    match bundle {
        Some(bundle) => gdn.project(bundle).run(args),
        None => gdn.run(args),
    }
}

#[test]
fn gdn_help_code_prints_its_entry_in_any_case() {
    for asked in ["E_TOOL_NOT_IN_CATALOG", "e_tool_not_in_catalog"] {
        let output = gdn(None, &["help", asked]);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let text = stdout(&output);
        assert!(text.starts_with("E_TOOL_NOT_IN_CATALOG (Tool calls)\n"), "{text}");
        assert!(text.contains("A call to a tool that is not in the step's Tool Catalog."), "{text}");
        assert!(text.contains("Causes:") && text.contains("What to do:"), "{text}");
        assert!(text.contains(&format!("{ERRORS_URL}#e_tool_not_in_catalog")), "{text}");
    }

    let output = gdn(None, &["--json", "help", "agent_crashed"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let entry = json_stdout(&output);
    assert_eq!(entry["code"], "AGENT_CRASHED");
    assert_eq!(entry["summary"], "The target's process ended before it answered.");
    assert_eq!(entry["helpUrl"], format!("{ERRORS_URL}#agent_crashed"));
    assert!(entry["body"].as_str().is_some_and(|body| body.contains("**What to do:**")), "{entry}");
}

#[test]
fn an_unknown_code_is_a_usage_error_naming_the_nearest() {
    let output = gdn(None, &["help", "E_TOOL_NOT_IN_CATALG"]);
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(stdout(&output), "");
    let text = stderr(&output);
    assert!(text.contains("error: unknown error code 'E_TOOL_NOT_IN_CATALG'"), "{text}");
    assert!(text.contains("did you mean E_TOOL_NOT_IN_CATALOG?"), "{text}");

    let output = gdn(None, &["--json", "help", "timeout"]);
    assert_eq!(output.status.code(), Some(2));
    let body = json_stdout(&output);
    let suggested: Vec<&str> = body["suggestions"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    for code in ["E_TOOL_TIMEOUT", "E_HTTP_TIMEOUT", "AGENT_REQUEST_TIMEOUT"] {
        assert!(suggested.contains(&code), "{body}");
    }
}

#[test]
fn gdn_help_lists_every_code_with_its_meaning() {
    let output = gdn(None, &["help"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stdout(&output);
    for code in known_codes() {
        let Some(line) = text.lines().find(|line| line.split_whitespace().next() == Some(code)) else {
            panic!("`gdn help` does not list {code}:\n{text}")
        };
        let Some(entry) = goondan_core::help::lookup(code) else { panic!("no entry for {code}") };
        assert!(line.ends_with(&entry.summary), "{line}");
    }

    let output = gdn(None, &["--json", "help"]);
    let listed = json_stdout(&output);
    let count = listed["codes"].as_array().map_or(0, Vec::len);
    assert_eq!(count, known_codes().len(), "{listed}");
}

#[test]
fn gdn_help_command_still_shows_the_command_help() {
    let output = gdn(None, &["help", "validate"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stdout(&output).contains("Usage: gdn validate"), "{}", stdout(&output));
}

/// A call outside the catalog: its result links to the code's entry, and
/// the text output points at `gdn help CODE` once.
#[test]
fn an_error_result_of_gdn_tool_call_carries_the_help_url() {
    let quickstart = common::repo_path("examples/quickstart");
    let args = ["tool", "call", "http-fetch__get", "--args", r#"{"url":"https://example.com"}"#];
    let json_args: Vec<&str> = std::iter::once("--json").chain(args).collect();
    let output = gdn(Some(&quickstart), &json_args);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let result = json_stdout(&output);
    assert_eq!(result["error"]["code"], "E_TOOL_NOT_IN_CATALOG");
    assert_eq!(result["error"]["helpUrl"], format!("{ERRORS_URL}#e_tool_not_in_catalog"), "{result}");
    assert!(!stderr(&output).contains("gdn help"), "--json adds no hint: {}", stderr(&output));

    let output = gdn(Some(&quickstart), &args);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(json_stdout(&output)["error"]["helpUrl"], format!("{ERRORS_URL}#e_tool_not_in_catalog"));
    assert_eq!(stderr(&output).matches("`gdn help E_TOOL_NOT_IN_CATALOG`").count(), 1, "{}", stderr(&output));

    // A tool's own failure gets its code's link too (here the argument check).
    let output = gdn(Some(&quickstart), &["--json", "tool", "call", "json-query__query", "--args", r#"{"path": 3}"#]);
    let result = json_stdout(&output);
    assert_eq!(result["error"]["code"], "E_TOOL_INVALID_ARGS");
    assert_eq!(result["error"]["helpUrl"], format!("{ERRORS_URL}#e_tool_invalid_args"), "{result}");
}
