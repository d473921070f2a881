//! `gdn validate` and an Agent's `spec.placement.hostLabels`: a valid
//! bundle shows the labels a host needs for each agent (unquoted `true` and
//! `8` as their text), and labels no host could carry fail the check at
//! their line, over the fixture bundles `tests/fixtures/placement` and
//! `tests/fixtures/placement-invalid`.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

mod common;
use common::repo_path;

/// `gdn -c <bundle> <args…>` with colors and logs off and a state root of
/// its own.
fn gdn(bundle: &Path, args: &[&str]) -> Result<Output, Box<dyn std::error::Error>> {
    let state = tempfile::tempdir()?;
    Ok(common::gdn_bin().state(state.path()).project(bundle).output(args)?)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn validate_shows_the_host_labels_each_agent_needs() -> Result<(), Box<dyn std::error::Error>> {
    let bundle = repo_path("tests/fixtures/placement");
    let output = gdn(&bundle, &["validate"])?;
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(
        text.contains("agent coder: sandbox workspace-write (default); hosts with cores=8, gpu=true, zone=eu-west-1\n"),
        "{text}"
    );
    assert!(text.contains("agent lead: sandbox workspace-write (default)\n"), "the lead runs anywhere: {text}");
    assert!(text.contains("is valid"), "{text}");

    let output = gdn(&bundle, &["validate", "--format", "json"])?;
    assert_eq!(output.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&output.stdout)?;
    assert_eq!(report["valid"], true, "{report}");
    assert_eq!(
        report["agents"]["coder"]["hostLabels"],
        serde_json::json!({"gpu": "true", "zone": "eu-west-1", "cores": "8"}),
        "{report}"
    );
    assert!(report["agents"]["lead"].get("hostLabels").is_none(), "{report}");
    Ok(())
}

#[test]
fn labels_no_host_could_carry_fail_validation_at_their_line() -> Result<(), Box<dyn std::error::Error>> {
    let bundle = repo_path("tests/fixtures/placement-invalid");
    let output = gdn(&bundle, &["validate"])?;
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(4), "{text}");
    for expected in [
        "warning[W_CONFIG_UNKNOWN_KEY] goondan.yaml#1.spec.placement.hostLabel (line 20, column 16)",
        "help: Did you mean `hostLabels`?",
        "error[E_CONFIG_PLACEMENT_INVALID] goondan.yaml#1.spec.placement.hostLabels.gpu model (line 22, column 18)",
        "host label name 'gpu model' has ' '; only letters, digits, '.', '_' and '-' may be used",
        "error[E_CONFIG_PLACEMENT_INVALID] goondan.yaml#1.spec.placement.hostLabels.zone (line 23, column 13)",
        "host label value 'eu/west' has '/'",
        "error[E_CONFIG_PLACEMENT_INVALID] goondan.yaml#1.spec.placement.hostLabels.version (line 24, column 16)",
        "got the fractional number 1.1",
        "3 errors, 1 warning",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    assert!(!text.contains("agent coder:"), "no agent lines for a bundle with errors: {text}");

    let output = gdn(&bundle, &["validate", "--format", "json"])?;
    assert_eq!(output.status.code(), Some(4));
    let report: Value = serde_json::from_slice(&output.stdout)?;
    assert_eq!(report["valid"], false, "{report}");
    let Some(diagnostics) = report["diagnostics"].as_array() else { panic!("no diagnostics: {report}") };
    let codes: Vec<(&str, &str)> = diagnostics
        .iter()
        .map(|d| (d["code"].as_str().unwrap_or_default(), d["severity"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(
        codes,
        [
            ("W_CONFIG_UNKNOWN_KEY", "warning"),
            ("E_CONFIG_PLACEMENT_INVALID", "error"),
            ("E_CONFIG_PLACEMENT_INVALID", "error"),
            ("E_CONFIG_PLACEMENT_INVALID", "error"),
        ],
        "{report}"
    );

    // The help catalog explains the new code.
    let output = gdn(&bundle, &["help", "E_CONFIG_PLACEMENT_INVALID"])?;
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("spec.placement") && text.contains("gpu: true"), "{text}");
    Ok(())
}
