//! Bundles read as the original reads them: YAML 1.2 core schema scalars.

use std::path::Path;

use goondan_config::load_bundle;

#[test]
fn a_tool_requiring_parameters_named_n_yes_and_off_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/yaml-core-schema");
    let report = load_bundle(&dir);
    let errors: Vec<_> = report.diagnostics.iter().filter(|d| d.is_error()).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    let bundle = report.bundle.unwrap_or_else(|| panic!("bundle"));
    let tool = bundle.tools().next().unwrap_or_else(|| panic!("a tool"));
    let parameters = tool.spec.exports[0].parameters.clone().unwrap_or_default();
    assert_eq!(parameters["required"], serde_json::json!(["n", "yes", "off"]), "{parameters}");
    assert_eq!(parameters["properties"]["off"]["enum"], serde_json::json!(["on", "off"]));
    assert_eq!(parameters["properties"]["n"], serde_json::json!({"type": "number"}));
}
