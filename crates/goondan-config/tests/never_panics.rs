//! Loading arbitrary text never panics: it yields a report, possibly with
//! diagnostics, each with a code, a message, a path into the file and
//! 1-based positions. File references are refused exactly when they leave
//! the bundle.

use std::path::PathBuf;

use goondan_config::files::resolve_inside;
use goondan_config::load_from_str;
use proptest::prelude::*;

fn load(text: &str) {
    let report = load_from_str(text, "goondan.yaml", None, PathBuf::from("goondan.yaml"));
    for diagnostic in &report.diagnostics {
        assert!(diagnostic.path.starts_with("goondan.yaml"));
        assert!(!diagnostic.code.as_str().is_empty());
        assert!(!diagnostic.message.is_empty(), "{diagnostic:?}");
        assert!(diagnostic.line.is_none_or(|line| line >= 1), "{diagnostic:?}");
        assert!(diagnostic.column.is_none_or(|column| column >= 1), "{diagnostic:?}");
    }
    // Without a bundle there must be an error that says why.
    assert!(report.bundle.is_some() || report.has_errors());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text(text in "\\PC{0,200}") {
        load(&text);
    }

    /// Text made of YAML's structural characters is the likeliest to hit odd parser paths.
    #[test]
    fn yaml_shaped_text(text in "[-:{}\\[\\],&*!|>'\"#%@` \\na-z0-9]{0,160}") {
        load(&text);
    }

    /// Valid-looking documents with random values in every position.
    #[test]
    fn resources_with_random_values(kind in "(Tool|Agent|Swarm|Model|Package|Extension|Connector|Connection|X)", value in "(\\[\\]|\\{\\}|null|1|-1|1.5|x|'__'|\\[1, a\\]|\\{a: 1\\})") {
        let text = format!(
            "apiVersion: goondan.ai/v1\nkind: {kind}\nmetadata: {{name: {value}}}\nspec:\n  entry: {value}\n  exports: {value}\n  tools: {value}\n  agents: {value}\n  entryAgent: {value}\n  modelConfig: {{modelRef: {value}}}\n  errorMessageLimit: {value}\n"
        );
        load(&text);
    }
}

/// Whether a relative reference made of `components` ever climbs above
/// the directory it starts in, worked out lexically.
fn escapes(components: &[&str]) -> bool {
    let mut depth = 0_i32;
    for component in components {
        match *component {
            ".." => depth -= 1,
            "." => {}
            _ => depth += 1,
        }
        if depth < 0 {
            return true;
        }
    }
    false
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A reference is refused as outside the bundle exactly when it is
    /// absolute or climbs out, even if it comes back in (`../bundle/x`).
    #[test]
    fn references_are_outside_exactly_when_they_climb_out(
        components in proptest::collection::vec(prop_oneof![Just(".."), Just("."), Just("sub"), Just("bundle"), Just("file.md")], 1..8),
        absolute in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let root = dir.path().join("bundle");
        std::fs::create_dir_all(root.join("sub")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(root.join("file.md"), "x").unwrap_or_else(|e| panic!("{e}"));
        let relative = components.join("/");
        let reference = if absolute { format!("{}/{relative}", root.display()) } else { relative };
        let outcome = resolve_inside(&root, &reference);
        let outside = outcome.as_ref().err().is_some_and(|error| error.is_outside());
        prop_assert_eq!(outside, absolute || escapes(&components), "{}: {:?}", reference, outcome);
        if let Ok(full) = outcome {
            let canonical_root = root.canonicalize().unwrap_or_else(|e| panic!("{e}"));
            prop_assert!(full.starts_with(&canonical_root));
        }
    }
}
