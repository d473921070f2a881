//! What users of the original Goondan rely on that goondan-rs takes as
//! the original does (issue 37): here `valueFrom.secretRef`, read from the
//! environment variables the original tries.

use std::path::Path;
use std::process::Output;

mod common;
use common::temp;
use goondan_test_support::{Agent, Bundle as BundleBuilder, FakeModel, text};
use serde_json::json;

fn gdn(bundle: &Path, state: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let gdn = common::gdn_bin().state_arg(state).project(bundle);
    env.iter().fold(gdn, |gdn, (key, value)| gdn.env(key, value)).run(args)
}

/// A bundle whose Model's key is `valueFrom.secretRef` of `Secret/openai`.
fn secret_key_bundle(endpoint: &str) -> tempfile::TempDir {
    BundleBuilder::new()
        .resource(
            "Model",
            "m",
            json!({
                "provider": "openai",
                "model": "gpt-test",
                "endpoint": endpoint,
                "apiKey": {"valueFrom": {"secretRef": {"ref": "Secret/openai", "key": "api_key"}}},
            }),
        )
        .one_agent("s", Agent::new("a", "m"))
        .write_temp()
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_model_key_from_a_secret_ref_reaches_the_model_from_the_variable_the_original_reads() {
    let model = FakeModel::text("hello").unwrap_or_else(|e| panic!("model server: {e}"));
    let bundle = secret_key_bundle(&model.url());
    let state = temp();
    // The second candidate of the original's list: the key's own variable is unset.
    let env = [("GOONDAN_SECRET_OPENAI", "sk-from-secret-7")];
    let output = gdn(bundle.path(), state.path(), &env, &["run", "--input", "hi"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("hello"), "{}", text(&output.stdout));
    assert_eq!(model.headers("authorization"), ["Bearer sk-from-secret-7"]);
    // The first candidate wins over the later ones.
    let env = [("GOONDAN_SECRET_OPENAI", "sk-later"), ("GOONDAN_SECRET_OPENAI_API_KEY", "sk-first")];
    let output = gdn(bundle.path(), state.path(), &env, &["run", "--input", "hi"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(model.headers("authorization").last().map(String::as_str), Some("Bearer sk-first"));
}

#[test]
fn an_unset_secret_ref_names_every_variable_that_would_hold_it_and_never_calls_the_model() {
    let model = FakeModel::text("hello").unwrap_or_else(|e| panic!("model server: {e}"));
    let bundle = secret_key_bundle(&model.url());
    let state = temp();
    let validated = gdn(bundle.path(), state.path(), &[], &["validate"]);
    assert_eq!(validated.status.code(), Some(0), "a secretRef is valid: {}", text(&validated.stdout));
    let output = gdn(bundle.path(), state.path(), &[], &["run", "--input", "hi"]);
    assert_ne!(output.status.code(), Some(0));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("Secret/openai"), "{stderr}");
    assert!(stderr.contains("GOONDAN_SECRET_OPENAI_API_KEY") && stderr.contains("SECRET_OPENAI"), "{stderr}");
    assert!(model.requests().is_empty(), "no request without a key");
}

#[test]
fn a_secret_ref_that_is_not_secret_slash_name_is_a_validation_error() {
    let bundle = BundleBuilder::new()
        .resource(
            "Model",
            "m",
            json!({"provider": "openai", "model": "g", "apiKey": {"valueFrom": {"secretRef": {"ref": "vault/x"}}}}),
        )
        .one_agent("s", Agent::new("a", "m"))
        .write_temp()
        .unwrap_or_else(|e| panic!("{e}"));
    let state = temp();
    let output = gdn(bundle.path(), state.path(), &[], &["validate"]);
    assert_ne!(output.status.code(), Some(0));
    let out = text(&output.stdout) + &text(&output.stderr);
    assert!(out.contains("spec.apiKey.valueFrom.secretRef.ref must be Secret/<name>"), "{out}");
}

#[test]
fn gdn_schema_prints_the_editor_schema_and_init_points_goondan_yaml_at_it() {
    let state = temp();
    let here = temp();
    let printed = gdn(here.path(), state.path(), &[], &["schema"]);
    assert_eq!(printed.status.code(), Some(0), "{}", text(&printed.stderr));
    let schema: serde_json::Value = serde_json::from_slice(&printed.stdout).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#");
    assert_eq!(schema["properties"]["kind"]["enum"].as_array().map(Vec::len), Some(8));
    let model = gdn(here.path(), state.path(), &[], &["schema", "--kind", "model"]);
    let model: serde_json::Value = serde_json::from_slice(&model.stdout).unwrap_or_else(|e| panic!("{e}"));
    assert!(model["required"].as_array().is_some_and(|r| r.contains(&json!("provider"))), "{model}");
    let unknown = gdn(here.path(), state.path(), &[], &["schema", "--kind", "robot"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(text(&unknown.stderr).contains("one of Package, Model"), "{}", text(&unknown.stderr));
    // `gdn init` writes the schema beside goondan.yaml and the line that points editors at it.
    let project = here.path().join("proj");
    let project_arg = project.to_string_lossy().into_owned();
    let init = gdn(here.path(), state.path(), &[], &["init", &project_arg]);
    assert_eq!(init.status.code(), Some(0), "{}", text(&init.stderr));
    let yaml = std::fs::read_to_string(project.join("goondan.yaml")).unwrap_or_default();
    assert!(yaml.starts_with("# yaml-language-server: $schema=./goondan.schema.json\n"), "{yaml}");
    let written = std::fs::read(project.join("goondan.schema.json")).unwrap_or_default();
    assert_eq!(written, printed.stdout, "the schema gdn init writes is the one gdn schema prints");
    let validated = gdn(&project, state.path(), &[], &["validate"]);
    assert_eq!(validated.status.code(), Some(0), "{}", text(&validated.stdout));
}
