//! Arbitrary bytes as a `goondan.yaml`: parsing and loading never panic and
//! every problem comes back as a diagnostic that says where it is.
//!
//! The text is loaded twice: without a bundle root (no file checks) and with
//! a small bundle directory, so `entry` and `systemRef` references go
//! through the inside-the-bundle checks too. Those checks only look at file
//! metadata, never read, so a reference to `/dev/zero` cannot hang a run.

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use goondan_config::{LoadReport, load_from_str, yaml::parse_documents};
use libfuzzer_sys::fuzz_target;

const LABEL: &str = "goondan.yaml";

/// A bundle directory with one entry file and one prompt file, shared by
/// every run of this process. A fixed name under the temp directory (not a
/// fresh one per process) so repeated runs leave nothing new behind.
fn bundle_root() -> Option<&'static Path> {
    static ROOT: OnceLock<Option<PathBuf>> = OnceLock::new();
    ROOT.get_or_init(|| {
        let root = std::env::temp_dir().join("goondan-fuzz-yaml-bundle");
        std::fs::create_dir_all(root.join("tools")).ok()?;
        std::fs::create_dir_all(root.join("prompts")).ok()?;
        std::fs::write(root.join("tools/echo.js"), "export const handlers = {};\n").ok()?;
        std::fs::write(root.join("prompts/system.md"), "You are a test.\n").ok()?;
        Some(root)
    })
    .as_deref()
}

fn check(report: &LoadReport) {
    for diagnostic in &report.diagnostics {
        // Every diagnostic points into the file it is about and says something.
        assert!(diagnostic.path.starts_with(LABEL), "diagnostic path {:?}", diagnostic.path);
        assert!(!diagnostic.message.is_empty(), "empty message for {:?}", diagnostic.code);
        assert!(!diagnostic.code.to_string().is_empty());
        // Positions are 1-based when given.
        assert!(diagnostic.line.is_none_or(|line| line >= 1), "line {:?}", diagnostic.line);
        assert!(diagnostic.column.is_none_or(|column| column >= 1), "column {:?}", diagnostic.column);
    }
    // No bundle means there was an error saying why.
    if report.bundle.is_none() {
        assert!(report.has_errors(), "no bundle and no error");
    }
}

fuzz_target!(|data: &[u8]| {
    // `load_bundle` refuses non-UTF-8 files before parsing; the loader
    // proper only ever sees text.
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(documents) = parse_documents(text) {
        for document in &documents {
            // Every recorded position is a 1-based place in the text.
            for position in document.positions.values() {
                assert!(position.line >= 1 && position.column >= 1, "{position:?}");
            }
        }
    }
    let report = load_from_str(text, LABEL, None, PathBuf::from(LABEL));
    check(&report);
    if let Some(root) = bundle_root() {
        let report = load_from_str(text, LABEL, Some(root), root.join(LABEL));
        check(&report);
    }
});
