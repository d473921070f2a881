//! `spec.placement.hostLabels` of an Agent through the public loading API:
//! parsing (unquoted booleans and integers as their text), what
//! `Bundle::placement_for` gives, and every validation rule.

use goondan_config::{Diagnostic, HostLabels, Severity, labels_match};

mod common;
use common::{load, summary, valid};

const MODEL: &str =
    "apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {name: m}\nspec: {provider: openai, model: gpt-4o}\n";

/// An Agent `name` with `extra` (YAML under `spec`).
fn agent(name: &str, extra: &str) -> String {
    let extra: String = extra.lines().map(|line| format!("  {line}\n")).collect();
    format!(
        "---\napiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: {name}}}\nspec:\n  modelConfig: {{modelRef: Model/m}}\n{extra}"
    )
}

fn labels(pairs: &[(&str, &str)]) -> HostLabels {
    pairs.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect()
}

/// The diagnostics of a bundle whose one Agent has `placement`.
fn diagnostics(placement: &str) -> Vec<Diagnostic> {
    load(&format!("{MODEL}{}", agent("a", placement))).diagnostics
}

/// The one diagnostic of `placement`, which must be an
/// E_CONFIG_PLACEMENT_INVALID error at `path` (under `goondan.yaml#1.`).
fn refused(placement: &str, path: &str) -> Diagnostic {
    let found = diagnostics(placement);
    let [only] = found.as_slice() else { panic!("{placement}: {found:#?}") };
    assert_eq!(
        summary(&found),
        [("E_CONFIG_PLACEMENT_INVALID", format!("goondan.yaml#1.{path}"), Severity::Error)],
        "{placement}: {found:#?}"
    );
    assert!(only.suggestion.is_some(), "{only:#?}");
    let report = load(&format!("{MODEL}{}", agent("a", placement)));
    assert!(report.valid_bundle().is_none(), "an error: no valid bundle");
    assert!(report.bundle.is_none_or(|bundle| bundle.agent("a").is_none()), "the Agent is left out");
    only.clone()
}

#[test]
fn an_agent_without_placement_runs_anywhere() {
    let bundle = valid(&format!("{MODEL}{}", agent("a", "")));
    let Some(a) = bundle.agent("a") else { panic!("agent a") };
    assert_eq!(a.spec.placement, None);
    assert_eq!(bundle.placement_for("a"), None);
    assert_eq!(bundle.placement_for("not-defined"), None);
    // An empty mapping (or no hostLabels) asks for nothing either.
    for empty in ["placement: {}", "placement: {hostLabels: {}}"] {
        let bundle = valid(&format!("{MODEL}{}", agent("a", empty)));
        assert_eq!(bundle.placement_for("a"), None, "{empty}");
    }
}

#[test]
fn host_labels_parse_and_unquoted_booleans_and_integers_become_their_text() {
    let bundle = valid(&format!(
        "{MODEL}{}{}",
        agent(
            "gpu-worker",
            "placement:\n  hostLabels:\n    gpu: true\n    zone: eu-west-1\n    cores: 8\n    k8s.io_tier: \"0.5\""
        ),
        agent("anywhere", "")
    ));
    let expected = labels(&[("cores", "8"), ("gpu", "true"), ("k8s.io_tier", "0.5"), ("zone", "eu-west-1")]);
    assert_eq!(bundle.placement_for("gpu-worker"), Some(&expected));
    let Some(worker) = bundle.agent("gpu-worker") else { panic!("agent") };
    assert_eq!(worker.spec.placement.as_ref().map(|p| &p.host_labels), Some(&expected));
    assert_eq!(bundle.placement_for("anywhere"), None);

    // Quoted and unquoted are the same label; a host matches with every
    // label equal, more labels allowed.
    let quoted = valid(&format!("{MODEL}{}", agent("a", "placement: {hostLabels: {gpu: \"true\", cores: \"8\"}}")));
    let unquoted = valid(&format!("{MODEL}{}", agent("a", "placement: {hostLabels: {gpu: true, cores: 8}}")));
    assert_eq!(quoted.placement_for("a"), unquoted.placement_for("a"));
    let Some(required) = unquoted.placement_for("a") else { panic!("labels") };
    assert!(labels_match(required, &labels(&[("gpu", "true"), ("cores", "8"), ("zone", "eu")])));
    assert!(!labels_match(required, &labels(&[("gpu", "true"), ("cores", "16")])));
    // YAML 1.2: `yes` and `on` are strings, and stay as written.
    let yaml12 = valid(&format!("{MODEL}{}", agent("a", "placement: {hostLabels: {ssd: yes, fast: on}}")));
    assert_eq!(yaml12.placement_for("a"), Some(&labels(&[("fast", "on"), ("ssd", "yes")])));
}

#[test]
fn an_unknown_key_under_placement_is_a_warning_and_is_ignored() {
    let report =
        load(&format!("{MODEL}{}", agent("a", "placement:\n  hostLabel: {gpu: true}\n  hostLabels: {zone: eu}")));
    assert_eq!(
        summary(&report.diagnostics),
        [("W_CONFIG_UNKNOWN_KEY", "goondan.yaml#1.spec.placement.hostLabel".to_owned(), Severity::Warning)]
    );
    let Some(suggestion) = report.diagnostics.first().and_then(|d| d.suggestion.clone()) else { panic!("no hint") };
    assert!(suggestion.contains("hostLabels"), "{suggestion}");
    let Some(bundle) = report.bundle else { panic!("a warning keeps the bundle") };
    assert_eq!(bundle.placement_for("a"), Some(&labels(&[("zone", "eu")])));
}

#[test]
fn placement_and_host_labels_must_be_mappings() {
    let d = refused("placement: gpu", "spec.placement");
    assert!(d.message.contains("must be a mapping, got string"), "{}", d.message);
    refused("placement:", "spec.placement");
    let d = refused("placement: {hostLabels: [gpu]}", "spec.placement.hostLabels");
    assert!(d.message.contains("got array"), "{}", d.message);
    refused("placement: {hostLabels: gpu=true}", "spec.placement.hostLabels");
    refused("placement:\n  hostLabels:", "spec.placement.hostLabels");
}

#[test]
fn a_label_value_must_be_a_string_a_boolean_or_an_integer() {
    let d = refused("placement: {hostLabels: {version: 1.10}}", "spec.placement.hostLabels.version");
    assert!(d.message.contains("fractional number 1.1"), "{}", d.message);
    assert!(d.suggestion.as_deref().is_some_and(|s| s.contains("Quote it")), "{d:#?}");
    let d = refused("placement: {hostLabels: {gpu: }}", "spec.placement.hostLabels.gpu");
    assert!(d.message.contains("got null"), "{}", d.message);
    refused("placement: {hostLabels: {zones: [eu, us]}}", "spec.placement.hostLabels.zones");
    refused("placement: {hostLabels: {gpu: {model: a100}}}", "spec.placement.hostLabels.gpu");
}

#[test]
fn label_names_and_values_are_1_to_63_letters_digits_dots_underscores_dashes() {
    let d = refused("placement: {hostLabels: {\"\": x}}", "spec.placement.hostLabels.");
    assert!(d.message.contains("empty host label name"), "{}", d.message);
    let d = refused("placement: {hostLabels: {\"gpu model\": a100}}", "spec.placement.hostLabels.gpu model");
    assert!(d.message.contains("' '") && d.message.contains("letters, digits"), "{}", d.message);
    let d = refused("placement: {hostLabels: {zone: \"eu/west\"}}", "spec.placement.hostLabels.zone");
    assert!(d.message.contains("'/'"), "{}", d.message);
    let d = refused("placement: {hostLabels: {zone: \"\"}}", "spec.placement.hostLabels.zone");
    assert!(d.message.contains("empty host label value"), "{}", d.message);
    let long = "x".repeat(64);
    let d = refused(&format!("placement: {{hostLabels: {{{long}: y}}}}"), &format!("spec.placement.hostLabels.{long}"));
    assert!(d.message.contains("64 characters long, more than 63"), "{}", d.message);
    refused(&format!("placement: {{hostLabels: {{a: {long}}}}}"), "spec.placement.hostLabels.a");
    refused("placement: {hostLabels: {zone: \"é\"}}", "spec.placement.hostLabels.zone");
    // 63 is fine, and a negative integer is text with a dash.
    let ok = "y".repeat(63);
    let bundle = valid(&format!("{MODEL}{}", agent("a", &format!("placement: {{hostLabels: {{{ok}: {ok}, t: -3}}}}"))));
    assert_eq!(bundle.placement_for("a"), Some(&labels(&[(ok.as_str(), ok.as_str()), ("t", "-3")])));
}

#[test]
fn every_bad_label_is_reported_in_one_pass() {
    let found =
        diagnostics("placement:\n  hostLabels:\n    \"a b\": 1.5\n    ok: fine\n    zone: \"eu west\"\n  extra: 1");
    let mut got = summary(&found);
    got.sort();
    assert_eq!(
        got,
        [
            ("E_CONFIG_PLACEMENT_INVALID", "goondan.yaml#1.spec.placement.hostLabels.a b".to_owned(), Severity::Error),
            ("E_CONFIG_PLACEMENT_INVALID", "goondan.yaml#1.spec.placement.hostLabels.a b".to_owned(), Severity::Error),
            ("E_CONFIG_PLACEMENT_INVALID", "goondan.yaml#1.spec.placement.hostLabels.zone".to_owned(), Severity::Error),
            ("W_CONFIG_UNKNOWN_KEY", "goondan.yaml#1.spec.placement.extra".to_owned(), Severity::Warning),
        ],
        "{found:#?}"
    );
    // Each carries the line of its label.
    assert!(found.iter().all(|d| d.line.is_some()), "{found:#?}");
}
