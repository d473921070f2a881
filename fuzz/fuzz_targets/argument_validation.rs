//! An arbitrary JSON Schema and arbitrary JSON arguments through the
//! executor's argument validation: never a panic, and the error message
//! stays bounded however large or deep the arguments are.
//!
//! The input is two JSON texts separated by the first NUL byte: the tool's
//! `parameters` schema, then the arguments. Inputs that are not JSON are
//! skipped; the seeds (see README.md) start the fuzzer from real schemas.

#![no_main]

use goondan_core::{DEFAULT_ERROR_MESSAGE_LIMIT, JsonValue, truncate_error_message};
use goondan_tools::validation::validate_args;
use goondan_tools::{ToolCatalogItem, ToolSource};
use libfuzzer_sys::fuzz_target;

const TOOL: &str = "fuzz__validate";

/// The most characters a validation message may have before the executor
/// cuts it to the tool's limit: five issues, each naming a path and a value
/// cut short, must fit in a few KiB whatever the model sent. (The executor's
/// truncation makes the final message short anyway; this bound is about not
/// building megabytes of text from a model's arguments first.)
const MAX_VALIDATION_MESSAGE_CHARS: usize = 4 * 1024;

fuzz_target!(|data: &[u8]| {
    let Some(split) = data.iter().position(|&byte| byte == 0) else { return };
    let Ok(schema) = serde_json::from_slice::<JsonValue>(&data[..split]) else { return };
    let Ok(args) = serde_json::from_slice::<JsonValue>(&data[split + 1..]) else { return };
    let item = ToolCatalogItem::new(TOOL, ToolSource::config("fuzz")).with_parameters(schema);
    let Err(error) = validate_args(&item, &args) else { return };

    let code = error.code.as_deref().unwrap_or_default();
    assert!(code == "E_TOOL_INVALID_ARGS" || code == "E_TOOL_SCHEMA_INVALID", "code {code:?}");
    let count = error.message.chars().count();
    if code == "E_TOOL_INVALID_ARGS" {
        assert!(error.message.starts_with("Invalid arguments for tool 'fuzz__validate': "), "{}", error.message);
        assert!(count <= MAX_VALIDATION_MESSAGE_CHARS, "a validation message of {count} characters");
    }
    // What the model finally sees: cut to the tool's limit, as the executor does.
    let mut message = error.message;
    truncate_error_message(&mut message, DEFAULT_ERROR_MESSAGE_LIMIT);
    assert!(message.chars().count() <= DEFAULT_ERROR_MESSAGE_LIMIT);
});
