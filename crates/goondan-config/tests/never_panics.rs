//! Loading arbitrary text never panics: it yields a report, possibly with
//! diagnostics.

use std::path::PathBuf;

use goondan_config::load_from_str;
use proptest::prelude::*;

fn load(text: &str) {
    let report = load_from_str(text, "goondan.yaml", None, PathBuf::from("goondan.yaml"));
    for diagnostic in &report.diagnostics {
        assert!(diagnostic.path.starts_with("goondan.yaml"));
    }
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
