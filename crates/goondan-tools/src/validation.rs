//! Argument validation against a catalog item's JSON Schema, with the
//! original runtime's message format (GOONDAN_FACTS "Tool execution" step 2).
//!
//! `Invalid arguments for tool 'x__y': args.command: required property is
//! missing; args.extra: unexpected property` — at most five issues, then
//! `; +N more issues`. Type, enum, const and pattern failures name the value
//! given (compact JSON, cut to 60 characters with `…`): `args.parseMode: "md"
//! is not one of ["markdown", "html"]`; other keywords keep jsonschema's
//! wording with the value shown the same way. Each listed issue is cut to
//! 400 characters, so the message stays small however large the arguments.
//! The suggestion lists `required=[...]` and `allowed=[...]` from the
//! schema's top level.

use std::fmt::Write as _;

use goondan_core::codes::{E_TOOL_INVALID_ARGS, E_TOOL_SCHEMA_INVALID};
use goondan_core::{JsonValue, ToolError, json_type_name};
use jsonschema::error::ValidationErrorKind;
use jsonschema::paths::LocationSegment;

use crate::catalog::ToolCatalogItem;

const MAX_LISTED_ISSUES: usize = 5;

/// Validates `args` against the item's parameter schema.
///
/// `Ok` when the item has no schema or the arguments satisfy it. A schema
/// that does not compile is reported as an error result too, never a panic.
pub fn validate_args(item: &ToolCatalogItem, args: &JsonValue) -> Result<(), ToolError> {
    let Some(schema) = item.parameters() else {
        return Ok(());
    };
    let validator = match schema.validator() {
        Ok(validator) => validator,
        Err(problem) => {
            return Err(ToolError::new(
                E_TOOL_SCHEMA_INVALID,
                "ToolSchemaError",
                format!("Tool '{}' has an invalid parameters schema: {problem}", item.name()),
            )
            .with_suggestion("Fix the tool's parameters schema; it must be a valid JSON Schema object."));
        }
    };
    // The common case is valid input: answer it without building any error.
    if validator.is_valid(args) {
        return Ok(());
    }
    let raw_schema = schema.raw();
    let mut issues = Vec::new();
    for error in validator.iter_errors(args) {
        describe(&error, raw_schema, &mut issues);
    }
    if issues.is_empty() {
        // A validator that rejects but names nothing: still say so.
        issues.push("args: value does not match the parameters schema".to_owned());
    }
    Err(invalid_args_error(item.name(), &issues, raw_schema))
}

fn describe(error: &jsonschema::ValidationError<'_>, schema: &JsonValue, issues: &mut Vec<String>) {
    let path = render_path(error.instance_path().segments());
    match error.kind() {
        ValidationErrorKind::Required { property } => {
            let property = property.as_str().map_or_else(|| property.to_string(), str::to_owned);
            issues.push(format!("{}: required property is missing", join_property(&path, &property)));
        }
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            for property in unexpected {
                issues.push(format!("{}: unexpected property", join_property(&path, property)));
            }
        }
        ValidationErrorKind::Type { kind } => {
            let expected = schema
                .pointer(error.schema_path().as_str())
                .and_then(expected_types)
                .unwrap_or_else(|| type_kind_names(kind));
            let given = error.instance();
            issues.push(format!("{path}: expected {expected} but got {} {}", json_type_name(given), shown(given)));
        }
        ValidationErrorKind::Enum { options } => {
            let listed = match options.as_array() {
                Some(items) => items.iter().map(compact).collect::<Vec<_>>().join(", "),
                None => compact(options),
            };
            let listed = cut(&listed, MAX_OPTIONS_CHARS);
            issues.push(format!("{path}: {} is not one of [{listed}]", shown(error.instance())));
        }
        ValidationErrorKind::Constant { expected_value } => {
            issues.push(format!("{path}: expected {} but got {}", shown(expected_value), shown(error.instance())));
        }
        ValidationErrorKind::Pattern { pattern } => {
            issues.push(format!(
                "{path}: {} does not match the pattern {}",
                shown(error.instance()),
                cut(pattern, MAX_OPTIONS_CHARS)
            ));
        }
        // jsonschema's own wording, with the value shown as above rather
        // than in full: its plain rendering pastes the whole instance
        // (`maxLength` on a megabyte string, `not` on a large object).
        _ => issues.push(format!("{path}: {}", error.masked_with(shown(error.instance())))),
    }
}

/// The longest rendering of a given value in a message, in characters.
const MAX_SHOWN_CHARS: usize = 60;
/// The longest rendering of a list of allowed values or a pattern.
const MAX_OPTIONS_CHARS: usize = 200;
/// The longest listed issue. Paths repeat property names the model chose
/// (`args.<long key>[3]`) and schema-written parts are unbounded too; five
/// issues of this size keep the message a few KiB before the executor cuts
/// it to the tool's limit.
const MAX_ISSUE_CHARS: usize = 400;

/// The value the model gave, as compact JSON cut to [`MAX_SHOWN_CHARS`]:
/// enough to see the mistake, never a whole document pasted into an error.
fn shown(value: &JsonValue) -> String {
    cut(&compact(value), MAX_SHOWN_CHARS)
}

fn compact(value: &JsonValue) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| json_type_name(value).to_owned())
}

/// `text` cut to `max` characters (never inside one), with `…` when cut.
fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((end, _)) => format!("{}…", &text[..end]),
    }
}

fn expected_types(type_value: &JsonValue) -> Option<String> {
    match type_value {
        JsonValue::String(name) => Some(name.clone()),
        JsonValue::Array(names) => {
            let names: Vec<&str> = names.iter().filter_map(JsonValue::as_str).collect();
            (!names.is_empty()).then(|| names.join("|"))
        }
        _ => None,
    }
}

fn type_kind_names(kind: &jsonschema::error::TypeKind) -> String {
    match kind {
        jsonschema::error::TypeKind::Single(t) => t.to_string(),
        jsonschema::error::TypeKind::Multiple(set) => set.iter().map(|t| t.to_string()).collect::<Vec<_>>().join("|"),
    }
}

/// `args`, `args.a.b`, `args.arr[1]`.
fn render_path<'a>(segments: impl Iterator<Item = LocationSegment<'a>>) -> String {
    let mut path = String::from("args");
    for segment in segments {
        match segment {
            LocationSegment::Property(name) => {
                path.push('.');
                path.push_str(&name);
            }
            LocationSegment::Index(index) => {
                let _ = write!(path, "[{index}]");
            }
        }
    }
    path
}

fn join_property(path: &str, property: &str) -> String {
    format!("{path}.{property}")
}

fn invalid_args_error(tool_name: &str, issues: &[String], schema: &JsonValue) -> ToolError {
    let mut message = format!("Invalid arguments for tool '{tool_name}': ");
    let listed: Vec<String> = issues.iter().take(MAX_LISTED_ISSUES).map(|issue| cut(issue, MAX_ISSUE_CHARS)).collect();
    message.push_str(&listed.join("; "));
    if issues.len() > MAX_LISTED_ISSUES {
        let _ = write!(message, "; +{} more issues", issues.len() - MAX_LISTED_ISSUES);
    }
    let required = string_list(schema.get("required"));
    let allowed: Vec<&str> = schema
        .get("properties")
        .and_then(JsonValue::as_object)
        .map(|props| props.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let suggestion = format!(
        "Call '{tool_name}' again with arguments that match its parameters schema: required=[{}], allowed=[{}].",
        required.join(", "),
        allowed.join(", ")
    );
    ToolError::new(E_TOOL_INVALID_ARGS, "ToolInputValidationError", message).with_suggestion(suggestion)
}

fn string_list(value: Option<&JsonValue>) -> Vec<&str> {
    value
        .and_then(JsonValue::as_array)
        .map(|items| items.iter().filter_map(JsonValue::as_str).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::ToolSource;
    use serde_json::json;

    fn bash_exec() -> ToolCatalogItem {
        ToolCatalogItem::new("bash__exec", ToolSource::config("bash")).with_parameters(json!({
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "cwd": {"type": "string"},
                "timeoutMs": {"type": "number"},
                "env": {"type": "object"},
                "mode": {"type": "string", "enum": ["start", "end", "both"]},
                "chatId": {"type": ["string", "number"]},
                "nested": {"type": "object", "properties": {"inner": {"type": "integer"}}},
                "list": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["command"],
            "additionalProperties": false
        }))
    }

    fn message_of(result: Result<(), ToolError>) -> (String, String, String) {
        let error = result.err().unwrap_or_default();
        (error.code.unwrap_or_default(), error.message, error.suggestion.unwrap_or_default())
    }

    #[test]
    fn valid_arguments_pass() {
        assert_eq!(validate_args(&bash_exec(), &json!({"command": "ls", "timeoutMs": 5})), Ok(()));
        let no_schema = ToolCatalogItem::new("x__y", ToolSource::config("x"));
        assert_eq!(validate_args(&no_schema, &json!({"anything": 1})), Ok(()));
    }

    #[test]
    fn missing_required_property() {
        let (code, message, suggestion) = message_of(validate_args(&bash_exec(), &json!({})));
        assert_eq!(code, "E_TOOL_INVALID_ARGS");
        assert_eq!(message, "Invalid arguments for tool 'bash__exec': args.command: required property is missing");
        assert!(suggestion.contains("required=[command]"), "{suggestion}");
        assert!(
            suggestion.contains("allowed=[command, cwd, timeoutMs, env, mode, chatId, nested, list]"),
            "{suggestion}"
        );
    }

    #[test]
    fn unexpected_property_and_wrong_types() {
        let (_, message, _) = message_of(validate_args(&bash_exec(), &json!({"command": 3, "extra": true})));
        assert!(message.contains("args.extra: unexpected property"), "{message}");
        assert!(message.contains("args.command: expected string but got integer 3"), "{message}");
        let (_, message, _) = message_of(validate_args(&bash_exec(), &json!({"command": 1.5})));
        assert!(message.ends_with("args.command: expected string but got number 1.5"), "{message}");
        let (_, message, _) = message_of(validate_args(&bash_exec(), &json!({"command": "x", "chatId": true})));
        assert!(message.ends_with("args.chatId: expected string|number but got boolean true"), "{message}");
    }

    #[test]
    fn nested_paths_and_enums() {
        let (_, message, _) = message_of(validate_args(
            &bash_exec(),
            &json!({"command": "x", "nested": {"inner": "no"}, "list": ["a", 2], "mode": "middle"}),
        ));
        assert!(message.contains(r#"args.nested.inner: expected integer but got string "no""#), "{message}");
        assert!(message.contains("args.list[1]: expected string but got integer 2"), "{message}");
        assert!(message.contains(r#"args.mode: "middle" is not one of ["start", "end", "both"]"#), "{message}");
    }

    #[test]
    fn the_given_value_is_named_and_cut_when_long() {
        let item = ToolCatalogItem::new("t__x", ToolSource::config("t")).with_parameters(json!({
            "type": "object",
            "properties": {
                "parseMode": {"enum": ["markdown", "html"]},
                "kind": {"const": "text"},
                "code": {"type": "string", "pattern": "^[0-9]+$"},
                "count": {"type": "integer"}
            }
        }));
        let (_, message, _) = message_of(validate_args(&item, &json!({"parseMode": "md"})));
        assert!(message.ends_with(r#"args.parseMode: "md" is not one of ["markdown", "html"]"#), "{message}");
        let (_, message, _) = message_of(validate_args(&item, &json!({"kind": "image"})));
        assert!(message.ends_with(r#"args.kind: expected "text" but got "image""#), "{message}");
        let (_, message, _) = message_of(validate_args(&item, &json!({"code": "12a"})));
        assert!(message.ends_with(r#"args.code: "12a" does not match the pattern ^[0-9]+$"#), "{message}");
        // A long value is cut to 60 characters, never inside a character.
        let long = "한".repeat(100);
        let (_, message, _) = message_of(validate_args(&item, &json!({"parseMode": long})));
        let expected = format!("args.parseMode: \"{}… is not one of", "한".repeat(59));
        assert!(message.contains(&expected), "{message}");
        let (_, message, _) =
            message_of(validate_args(&item, &json!({"count": {"deep": [1, 2, 3], "more": "x".repeat(80)}})));
        assert!(
            message.contains(r#"args.count: expected integer but got object {"deep":[1,2,3],"more":"xxx"#),
            "{message}"
        );
        assert!(message.ends_with('…'), "{message}");
    }

    #[test]
    fn other_keywords_show_the_value_cut_not_whole() {
        // Found by the validation property test: `maxLength` (and every
        // keyword without its own wording) pasted the whole value.
        let item = ToolCatalogItem::new("t__x", ToolSource::config("t")).with_parameters(json!({
            "type": "object",
            "properties": {"text": {"type": "string", "maxLength": 3}, "n": {"minimum": 0}}
        }));
        let (_, message, _) = message_of(validate_args(&item, &json!({"text": "x".repeat(100_000)})));
        let expected = format!("args.text: \"{}… is longer than 3 characters", "x".repeat(59));
        assert!(message.ends_with(&expected), "{message}");
        let (_, message, _) = message_of(validate_args(&item, &json!({"n": -1})));
        assert!(message.ends_with("args.n: -1 is less than the minimum of 0"), "{message}");
    }

    #[test]
    fn long_issues_are_cut_and_the_message_stays_small() {
        // Each of the five listed issues repeats the model's 10 000-character key.
        let item = ToolCatalogItem::new("t__x", ToolSource::config("t"))
            .with_parameters(json!({"additionalProperties": {"items": {"type": "integer"}}}));
        let key = "k".repeat(10_000);
        let (_, message, _) = message_of(validate_args(&item, &json!({ key: ["a", "b", "c", "d", "e", "f"] })));
        assert!(message.chars().count() < 2_200, "{} characters", message.chars().count());
        assert_eq!(message.matches('…').count(), 5, "{message}");
        assert!(message.ends_with("; +1 more issues"), "{message}");
    }

    #[test]
    fn at_most_five_issues_then_a_count() {
        let item = ToolCatalogItem::new("t__x", ToolSource::config("t")).with_parameters(json!({
            "type": "object", "properties": {}, "additionalProperties": false
        }));
        let args = json!({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7});
        let (_, message, _) = message_of(validate_args(&item, &args));
        assert_eq!(message.matches("unexpected property").count(), 5, "{message}");
        assert!(message.ends_with("; +2 more issues"), "{message}");
    }

    #[test]
    fn non_object_arguments() {
        let (_, message, _) = message_of(validate_args(&bash_exec(), &json!("ls")));
        assert!(message.contains("args: expected object but got string"), "{message}");
    }

    #[test]
    fn invalid_schema_is_an_error_result() {
        let item = ToolCatalogItem::new("t__x", ToolSource::extension("ext")).with_parameters(json!({"type": 5}));
        let error = validate_args(&item, &json!({})).err().unwrap_or_default();
        assert_eq!(error.code.as_deref(), Some("E_TOOL_SCHEMA_INVALID"));
    }
}
