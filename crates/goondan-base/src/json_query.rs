//! The `json-query` tool: read parts of a JSON document given as text.
//!
//! Every export takes `data`, a JSON-encoded string.
//!
//! - `query{data, path?}`: the value at a path.
//! - `pick{data, keys}`: an object with only some of its keys.
//! - `count{data, path?}`: the size of the value at a path.
//! - `flatten{data, depth?}`: an array with nested arrays spliced in.
//!
//! Paths are dot-separated with an optional leading `.` (`.` or an empty
//! path is the root); bracket segments (`items[0]`, `map[a.b]`,
//! `map["a.b"]`) are not split on dots. On an array a segment is read as
//! JavaScript's `parseInt` reads it (`1`, `+1`, `1abc`), and must be a
//! non-negative index. As in the original, a missing value is "not found",
//! while a `null` that is present is found (`found: true, value: null`);
//! a path going on below a `null` finds nothing.

use std::sync::Arc;

use goondan_core::{JsonObject, JsonValue};
use goondan_tools::{HandlerResult, ToolContext, ToolFailure, ToolHandler, sync_handler};
use serde_json::json;

use crate::args;

/// The deepest `flatten` accepts.
pub const MAX_FLATTEN_DEPTH: u64 = 100;

/// The handler of `export`, or `None` if the tool has no such export.
pub fn handler(export: &str) -> Option<Arc<dyn ToolHandler>> {
    match export {
        "query" => Some(sync_handler(query)),
        "pick" => Some(sync_handler(pick)),
        "count" => Some(sync_handler(count)),
        "flatten" => Some(sync_handler(flatten)),
        _ => None,
    }
}

fn query(_ctx: &ToolContext, input: &JsonObject) -> HandlerResult {
    let path = args::optional_string(input, "path")?.unwrap_or(".");
    let data = parse_data(input)?;
    let found = resolve(&data, &segments(path)?);
    Ok(json!({
        "path": path,
        "found": found.is_some(),
        "value": found.cloned().unwrap_or(JsonValue::Null),
    })
    .into())
}

fn pick(_ctx: &ToolContext, input: &JsonObject) -> HandlerResult {
    let keys = args::require_string_array(input, "keys")?;
    let JsonValue::Object(object) = parse_data(input)? else {
        return Err(ToolFailure::new("Input data must be a JSON object for pick operation")
            .suggest("Pass a JSON object in 'data', e.g. '{\"name\": \"x\"}'."));
    };
    let result: JsonObject =
        keys.iter().filter_map(|&key| object.get(key).map(|value| (key.to_owned(), value.clone()))).collect();
    Ok(json!({"keys": keys, "result": result}).into())
}

fn count(_ctx: &ToolContext, input: &JsonObject) -> HandlerResult {
    let path = args::optional_string(input, "path")?.unwrap_or(".");
    let data = parse_data(input)?;
    let (count, kind) = match resolve(&data, &segments(path)?) {
        None | Some(JsonValue::Null) => (0, "null"),
        Some(JsonValue::Array(items)) => (items.len(), "array"),
        Some(JsonValue::Object(map)) => (map.len(), "object"),
        Some(JsonValue::String(text)) => (text.chars().count(), "string"),
        Some(JsonValue::Number(_)) => (1, "number"),
        Some(JsonValue::Bool(_)) => (1, "boolean"),
    };
    Ok(json!({"path": path, "count": count, "type": kind}).into())
}

fn flatten(_ctx: &ToolContext, input: &JsonObject) -> HandlerResult {
    let depth = args::optional_count(input, "depth", MAX_FLATTEN_DEPTH)?.unwrap_or(1);
    let JsonValue::Array(items) = parse_data(input)? else {
        return Err(ToolFailure::new("Input data must be a JSON array for flatten operation")
            .suggest("Pass a JSON array in 'data', e.g. '[[1, 2], [3]]'."));
    };
    let mut result = Vec::with_capacity(items.len());
    flatten_into(&items, depth, &mut result);
    Ok(json!({"depth": depth, "count": result.len(), "result": result}).into())
}

/// The parsed `data` property.
fn parse_data(input: &JsonObject) -> Result<JsonValue, ToolFailure> {
    let text = args::require_string(input, "data")?;
    serde_json::from_str(text).map_err(|error| {
        ToolFailure::new(format!("Failed to parse input as JSON: {error}"))
            .suggest("Pass 'data' as a JSON-encoded string, e.g. '{\"items\": [1, 2]}'.")
    })
}

/// The segments of a path; an unclosed bracket is an error.
fn segments(path: &str) -> Result<Vec<String>, ToolFailure> {
    let mut segments = Vec::new();
    let mut current = String::new();
    let mut chars = path.chars();
    while let Some(c) = chars.next() {
        match c {
            '.' => {
                if !current.is_empty() {
                    segments.push(std::mem::take(&mut current));
                }
            }
            '[' => {
                if !current.is_empty() {
                    segments.push(std::mem::take(&mut current));
                }
                let mut inner = String::new();
                let closed = chars.by_ref().any(|c| {
                    let end = c == ']';
                    if !end {
                        inner.push(c);
                    }
                    end
                });
                if !closed {
                    return Err(ToolFailure::new(format!("Invalid path '{path}': unclosed '['"))
                        .suggest("Close every bracket, e.g. 'items[0].name' or 'map[\"a.b\"]'."));
                }
                segments.push(unquote(&inner).to_owned());
            }
            other => current.push(other),
        }
    }
    if !current.is_empty() {
        segments.push(current);
    }
    Ok(segments)
}

/// A bracket segment without its surrounding quotes, if it has matching ones.
fn unquote(segment: &str) -> &str {
    ['"', '\''].iter().find_map(|&quote| segment.strip_prefix(quote)?.strip_suffix(quote)).unwrap_or(segment)
}

/// The value at `segments` under `root`, `null` included.
fn resolve<'a>(root: &'a JsonValue, segments: &[String]) -> Option<&'a JsonValue> {
    let mut current = root;
    for segment in segments {
        current = match current {
            JsonValue::Object(map) => map.get(segment)?,
            JsonValue::Array(items) => items.get(array_index(segment)?)?,
            _ => return None,
        };
    }
    Some(current)
}

/// A segment as an array index, read like the original's
/// `Number.parseInt(segment, 10)`: leading white space, an optional sign,
/// then the digits up to the first other character (`"1abc"` is 1). No
/// digits, or a negative number, is no index; `-0` is 0.
fn array_index(segment: &str) -> Option<usize> {
    let text = segment.trim_start_matches(|c: char| c.is_whitespace() || c == '\u{feff}');
    let (negative, text) = match (text.strip_prefix('-'), text.strip_prefix('+')) {
        (Some(rest), _) => (true, rest),
        (None, Some(rest)) => (false, rest),
        (None, None) => (false, text),
    };
    let digits = text.split(|c: char| !c.is_ascii_digit()).next().unwrap_or_default();
    if digits.is_empty() || (negative && digits.bytes().any(|b| b != b'0')) {
        return None;
    }
    // Too many digits for an index is past the end of any array.
    digits.parse().ok()
}

fn flatten_into(items: &[JsonValue], depth: u64, out: &mut Vec<JsonValue>) {
    for item in items {
        match item {
            JsonValue::Array(inner) if depth > 0 => flatten_into(inner, depth - 1, out),
            other => out.push(other.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::test_support::{call, err, ok};

    const DATA: &str = r#"{"user": {"name": "Ada", "tags": ["a", "b"], "nick": null},
        "items": [{"id": 1}, {"id": 2}], "a.b": 5, "n": 3.5, "t": true, "s": "héllo"}"#;

    fn run(export: &str, input: JsonValue) -> HandlerResult {
        call("json-query", export, input)
    }

    fn query_value(path: &str) -> JsonValue {
        ok(run("query", json!({"data": DATA, "path": path})))
    }

    #[test]
    fn query_root_by_default() {
        let output = ok(run("query", json!({"data": "[1, 2]"})));
        assert_eq!(output, json!({"path": ".", "found": true, "value": [1, 2]}));
        assert_eq!(query_value("")["value"]["n"], json!(3.5));
    }

    #[test]
    fn query_paths() {
        assert_eq!(query_value(".user.name")["value"], json!("Ada"));
        assert_eq!(query_value("user.name")["value"], json!("Ada"));
        assert_eq!(query_value("user.tags[1]")["value"], json!("b"));
        assert_eq!(query_value("user.tags.0")["value"], json!("a"));
        assert_eq!(query_value("items[1].id")["value"], json!(2));
        assert_eq!(query_value("[a.b]")["value"], json!(5));
        assert_eq!(query_value("[\"a.b\"]")["value"], json!(5));
        assert_eq!(query_value("['user'].name")["value"], json!("Ada"));
        let output = query_value("user");
        assert_eq!(output["path"], json!("user"));
        assert_eq!(output["found"], json!(true));
    }

    #[test]
    fn query_not_found() {
        for path in [
            "missing",
            "user.nick.x",
            "user.name.x",
            "items[5]",
            "items[-1]",
            "items.x",
            "items[99999999999999999999999]",
            "t.x",
        ] {
            let output = query_value(path);
            assert_eq!(output, json!({"path": path, "found": false, "value": null}), "{path}");
        }
    }

    #[test]
    fn a_present_null_is_found() {
        // As in the original: `null !== undefined`.
        let output = query_value("user.nick");
        assert_eq!(output, json!({"path": "user.nick", "found": true, "value": null}));
        let output = ok(run("query", json!({"data": "null", "path": "."})));
        assert_eq!(output, json!({"path": ".", "found": true, "value": null}));
        let output = ok(run("query", json!({"data": "[null]", "path": "[0]"})));
        assert_eq!(output["found"], json!(true));
    }

    #[test]
    fn array_indexes_are_read_like_parse_int() {
        for (path, id) in [("items[+1]", 2), ("items[1abc]", 2), ("items[1.5]", 2), ("items[ 0]", 1), ("items[-0]", 1)]
        {
            let path = format!("{path}.id");
            assert_eq!(query_value(&path)["value"], json!(id), "{path}");
        }
    }

    #[test]
    fn query_rejects_unclosed_bracket() {
        let failure = err(run("query", json!({"data": DATA, "path": "items[0"})));
        assert_eq!(failure.message, "Invalid path 'items[0': unclosed '['");
        assert!(failure.suggestion.is_some());
    }

    #[test]
    fn invalid_json_is_explained() {
        for export in ["query", "pick", "count", "flatten"] {
            let mut input = json!({"data": "{not json"});
            if export == "pick" {
                input["keys"] = json!(["a"]);
            }
            let failure = err(run(export, input));
            assert!(failure.message.starts_with("Failed to parse input as JSON: "), "{}", failure.message);
            assert!(failure.message.len() > "Failed to parse input as JSON: ".len());
            assert!(failure.suggestion.is_some());
            assert_eq!(failure.code, None);
        }
        for input in [json!({"path": "."}), json!({"data": ""})] {
            let failure = err(run("query", input));
            assert_eq!(failure.message, "'data' must be a non-empty string");
        }
    }

    #[test]
    fn pick_keeps_present_keys_in_order() {
        let output = ok(run("pick", json!({"data": r#"{"a": 1, "b": null, "c": 3}"#, "keys": ["c", "x", "a", "b"]})));
        assert_eq!(output, json!({"keys": ["c", "x", "a", "b"], "result": {"c": 3, "a": 1, "b": null}}));
        let Some(result) = output["result"].as_object() else { panic!("result is not an object") };
        assert_eq!(result.keys().collect::<Vec<_>>(), ["c", "a", "b"]);
    }

    #[test]
    fn pick_requires_an_object() {
        let failure = err(run("pick", json!({"data": "[1]", "keys": ["a"]})));
        assert_eq!(failure.message, "Input data must be a JSON object for pick operation");
        assert!(failure.suggestion.is_some());
        let failure = err(run("pick", json!({"data": "{}", "keys": [1]})));
        assert_eq!(failure.message, "'keys' must contain only strings");
    }

    #[test]
    fn count_kinds() {
        let cases = [
            (".", 6, "object"),
            ("user.tags", 2, "array"),
            ("s", 5, "string"),
            ("n", 1, "number"),
            ("t", 1, "boolean"),
            ("user.nick", 0, "null"),
            ("nothing.here", 0, "null"),
        ];
        for (path, count, kind) in cases {
            let output = ok(run("count", json!({"data": DATA, "path": path})));
            assert_eq!(output, json!({"path": path, "count": count, "type": kind}), "{path}");
        }
        let output = ok(run("count", json!({"data": "[1, 2, 3]"})));
        assert_eq!(output, json!({"path": ".", "count": 3, "type": "array"}));
    }

    #[test]
    fn flatten_depths() {
        let data = "[1, [2, [3, [4]]], {\"a\": [5]}]";
        let output = ok(run("flatten", json!({"data": data})));
        assert_eq!(output, json!({"depth": 1, "count": 4, "result": [1, 2, [3, [4]], {"a": [5]}]}));
        let output = ok(run("flatten", json!({"data": data, "depth": 0})));
        assert_eq!(output["result"], json!([1, [2, [3, [4]]], {"a": [5]}]));
        let output = ok(run("flatten", json!({"data": data, "depth": 100})));
        assert_eq!(output, json!({"depth": 100, "count": 5, "result": [1, 2, 3, 4, {"a": [5]}]}));
        let output = ok(run("flatten", json!({"data": data, "depth": 2.0})));
        assert_eq!(output["result"], json!([1, 2, 3, [4], {"a": [5]}]));
    }

    #[test]
    fn flatten_failures() {
        let failure = err(run("flatten", json!({"data": "{\"a\": 1}"})));
        assert_eq!(failure.message, "Input data must be a JSON array for flatten operation");
        assert!(failure.suggestion.is_some());
        for depth in [json!(-1), json!(1.5), json!(101)] {
            let failure = err(run("flatten", json!({"data": "[]", "depth": depth})));
            assert!(
                failure.message.starts_with("'depth' must be a whole number between 0 and 100"),
                "{}",
                failure.message
            );
        }
    }

    #[test]
    fn unknown_export() {
        assert!(handler("transform").is_none());
        assert!(crate::native_handler("json-query", "nope", &crate::test_support::settings()).is_none());
        assert!(crate::native_handler("no-such-tool", "query", &crate::test_support::settings()).is_none());
    }
}
