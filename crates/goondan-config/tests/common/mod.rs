//! What the loading tests share: a bundle loaded from text, and its
//! diagnostics in short.

use std::path::PathBuf;

use goondan_config::{Bundle, Diagnostic, LoadReport, Severity, load_from_str};

/// `text` loaded as `goondan.yaml`.
pub fn load(text: &str) -> LoadReport {
    load_from_str(text, "goondan.yaml", None, PathBuf::from("goondan.yaml"))
}

/// `text` loaded, with no diagnostic at all; a test failure otherwise.
pub fn valid(text: &str) -> Bundle {
    let report = load(text);
    assert!(report.diagnostics.is_empty(), "{:#?}", report.diagnostics);
    let Some(bundle) = report.bundle else { panic!("no bundle") };
    bundle
}

/// (code, path, severity) of each diagnostic.
pub fn summary(diagnostics: &[Diagnostic]) -> Vec<(&'static str, String, Severity)> {
    diagnostics.iter().map(|d| (d.code.as_str(), d.path.clone(), d.severity)).collect()
}
