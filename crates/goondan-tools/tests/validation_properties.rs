//! Argument validation over random arguments: a wrong value is named in the
//! message, cut short; and however large the arguments, the message stays
//! small before the executor cuts it to the tool's limit, and within the
//! limit after.

use goondan_core::{JsonValue, ToolError, truncate_error_message};
use goondan_tools::validation::validate_args;
use goondan_tools::{ToolCatalogItem, ToolSource};
use proptest::prelude::*;
use serde_json::json;

const TOOL: &str = "t__x";
/// Five issues of a few hundred characters each, and the frame around them.
const MAX_MESSAGE_CHARS: usize = 4 * 1024;

fn item(schema: JsonValue) -> ToolCatalogItem {
    ToolCatalogItem::new(TOOL, ToolSource::config("t")).with_parameters(schema)
}

fn refusal(schema: JsonValue, args: &JsonValue) -> ToolError {
    validate_args(&item(schema), args).err().unwrap_or_else(|| panic!("{args} was accepted"))
}

/// The value as the message shows it: compact JSON, at most 60 characters, then `…`.
fn shown(value: &JsonValue) -> String {
    let text = value.to_string();
    match text.char_indices().nth(60) {
        None => text,
        Some((end, _)) => format!("{}…", &text[..end]),
    }
}

/// Long and multi-byte text: where a cut falls matters.
fn text(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(prop_oneof![Just('a'), Just('"'), Just('한'), Just('\n'), Just('é')], 0..max)
        .prop_map(|chars| chars.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn a_wrong_value_is_named_and_cut(value in text(200), keyword in 0usize..4) {
        let given = json!(value);
        let (schema, expected) = match keyword {
            0 => (json!({"type": "integer"}), format!("args.p: expected integer but got string {}", shown(&given))),
            1 => (json!({"enum": [1, 2]}), format!("args.p: {} is not one of [1, 2]", shown(&given))),
            2 => (json!({"const": 7}), format!("args.p: expected 7 but got {}", shown(&given))),
            // A keyword the messages have no own wording for.
            _ => (json!({"type": "string", "minLength": 500}), format!("args.p: {} is shorter than 500 characters", shown(&given))),
        };
        let error = refusal(json!({"type": "object", "properties": {"p": schema}}), &json!({"p": given}));
        prop_assert!(error.message.contains(&expected), "{} does not contain {}", error.message, expected);
    }

    #[test]
    fn messages_stay_bounded_however_large_the_arguments(
        key in text(600),
        value in text(1500),
        count in 1usize..8,
        limit in 0usize..2000,
    ) {
        // Every property is unexpected, too long, and holds an array of wrong items.
        let schema = json!({
            "type": "object",
            "properties": {"p": {"type": "string", "maxLength": 1}},
            "additionalProperties": {"type": "array", "items": {"type": "integer"}, "maxItems": 0}
        });
        let mut args = serde_json::Map::new();
        args.insert("p".to_owned(), json!(value));
        for n in 0..count {
            args.insert(format!("{key}{n}"), json!(vec![value.clone(); 6]));
        }
        let error = validate_args(&item(schema).with_error_message_limit(limit), &JsonValue::Object(args))
            .err()
            .unwrap_or_else(|| panic!("accepted"));
        let chars = error.message.chars().count();
        prop_assert!(chars <= MAX_MESSAGE_CHARS, "a message of {} characters", chars);
        // What the executor hands the model.
        let mut message = error.message;
        truncate_error_message(&mut message, limit);
        prop_assert!(message.chars().count() <= limit);
    }
}
