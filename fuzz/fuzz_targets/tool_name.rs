//! Arbitrary text through the tool-name rules (spec 002 §3–§4): parsing,
//! building and the name checks never panic, and they agree with each other.
//!
//! The whole input is a full tool name to parse; split at its first newline
//! it is also a resource name and an export name to check and join.

#![no_main]

use goondan_core::naming::{
    ExportNameCheck, MAX_RESOURCE_NAME_LEN, TOOL_NAME_SEPARATOR, build_tool_name, check_export_name,
    check_resource_name, parse_tool_name,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };

    // A name that parses rebuilds to itself, and neither part holds the separator.
    if let Some(parts) = parse_tool_name(text) {
        assert!(!parts.resource.is_empty() && !parts.export.is_empty());
        assert!(!parts.resource.contains(TOOL_NAME_SEPARATOR), "{parts:?}");
        assert!(!parts.export.contains(TOOL_NAME_SEPARATOR), "{parts:?}");
        assert_eq!(build_tool_name(parts.resource, parts.export), text);
    }

    let (resource, export) = text.split_once('\n').unwrap_or((text, ""));
    for is_tool in [true, false] {
        if check_resource_name(resource, is_tool).is_ok() {
            assert!(!resource.is_empty() && resource.len() <= MAX_RESOURCE_NAME_LEN);
            assert!(resource.is_ascii(), "{resource:?}");
        }
    }
    let export_check = check_export_name(export);
    if matches!(export_check, ExportNameCheck::Valid | ExportNameCheck::MixedCase) {
        assert!(export.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'), "{export:?}");
    }
    // A valid Tool resource name and an acceptable export name join into a
    // full name that splits back into exactly them: the runtime relies on
    // this to route a model's call to its tool.
    let acceptable_export = matches!(export_check, ExportNameCheck::Valid | ExportNameCheck::MixedCase);
    if check_resource_name(resource, true).is_ok() && acceptable_export {
        let full = build_tool_name(resource, export);
        let parts = parse_tool_name(&full);
        assert_eq!(parts.map(|p| (p.resource, p.export)), Some((resource, export)), "{full:?}");
    }
});
