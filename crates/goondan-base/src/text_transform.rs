//! The `text-transform` tool: small string operations with JavaScript's
//! semantics, counted in characters (Unicode scalar values).
//!
//! - `replace{text, search, replacement?, all?}`: literal search and replace.
//! - `slice{text, start?, end?}`: `String.prototype.slice`.
//! - `split{text, delimiter?, maxParts?}`: `String.prototype.split`.
//! - `join{parts, delimiter?}`: `Array.prototype.join` of strings, numbers
//!   and booleans.
//! - `trim{text, mode?}`: whitespace off the start, end or both.
//! - `case{text, to}`: upper or lower case.
//!
//! `replace` with `all` and `join` multiply their inputs (every match gets a
//! copy of `replacement`, every gap a copy of `delimiter`), and `split` turns
//! every character into a string of its own with an empty delimiter; a result
//! larger than [`MAX_RESULT_BYTES`] (or of more than [`MAX_SPLIT_PARTS`]
//! parts) is refused before it is built, so that a few kilobytes of input
//! cannot ask for gigabytes of memory.

use std::sync::Arc;

use goondan_core::{JsonObject, JsonValue};
use goondan_tools::{HandlerResult, ToolContext, ToolFailure, ToolHandler, sync_handler};
use serde_json::json;

use crate::args;

/// The largest result `replace` and `join` build: 16 MiB.
pub const MAX_RESULT_BYTES: usize = 16 * 1024 * 1024;

/// The most parts `split` returns: each part costs far more memory as a
/// JSON value than its characters.
pub const MAX_SPLIT_PARTS: usize = 200_000;

/// Refuses a result of `len` bytes (saturated) larger than [`MAX_RESULT_BYTES`].
fn check_result_len(export: &str, len: usize) -> Result<(), ToolFailure> {
    if len > MAX_RESULT_BYTES {
        return Err(ToolFailure::new(format!(
            "the result of {export} would be {len} bytes, more than the limit of {MAX_RESULT_BYTES}"
        ))
        .suggest("Work on smaller pieces of text, or use a shorter replacement or delimiter."));
    }
    Ok(())
}

/// The handler of `export`, or `None` if the tool has no such export.
pub fn handler(export: &str) -> Option<Arc<dyn ToolHandler>> {
    match export {
        "replace" => Some(sync_handler(replace)),
        "slice" => Some(sync_handler(slice)),
        "split" => Some(sync_handler(split)),
        "join" => Some(sync_handler(join)),
        "trim" => Some(sync_handler(trim)),
        "case" => Some(sync_handler(change_case)),
        _ => None,
    }
}

fn replace(_ctx: &ToolContext, input: &JsonObject) -> HandlerResult {
    let text = args::require_string(input, "text")?;
    let search = args::require_string(input, "search")?;
    let replacement = args::optional_string(input, "replacement")?.unwrap_or("");
    let all = args::optional_bool(input, "all")?.unwrap_or(false);
    let (result, replacements) = if all {
        let count = text.matches(search).count();
        let len = (text.len() - count * search.len()).saturating_add(count.saturating_mul(replacement.len()));
        check_result_len("replace", len)?;
        (text.replace(search, replacement), count)
    } else {
        (text.replacen(search, replacement, 1), usize::from(text.contains(search)))
    };
    Ok(json!({"original": text, "result": result, "replacements": replacements}).into())
}

fn slice(_ctx: &ToolContext, input: &JsonObject) -> HandlerResult {
    let text = args::require_string(input, "text")?;
    let start = args::optional_number(input, "start")?.unwrap_or(0.0);
    let end = args::optional_number(input, "end")?;
    let chars: Vec<char> = text.chars().collect();
    let from = relative_index(start, chars.len());
    let to = end.map_or(chars.len(), |end| relative_index(end, chars.len()));
    let result: String = chars.get(from..to).unwrap_or_default().iter().collect();
    Ok(json!({
        "original": text,
        "result": result,
        "start": args::number_value(start),
        "end": end.map_or_else(|| JsonValue::from(chars.len()), args::number_value),
        "length": to.saturating_sub(from),
    })
    .into())
}

/// A `slice` bound resolved like JavaScript: truncated toward zero,
/// negative values counted from the end, clamped to `0..=len`.
fn relative_index(value: f64, len: usize) -> usize {
    let value = value.trunc();
    let len_f = len as f64;
    let index = if value < 0.0 { (len_f + value).max(0.0) } else { value.min(len_f) };
    // In `0..=len`, so the conversion is exact.
    index as usize
}

fn split(_ctx: &ToolContext, input: &JsonObject) -> HandlerResult {
    let text = args::require_string(input, "text")?;
    let delimiter = args::optional_string(input, "delimiter")?.unwrap_or("\n");
    let max_parts = args::optional_count(input, "maxParts", u64::from(u32::MAX))?;
    let limit = max_parts.map_or(usize::MAX, |max| usize::try_from(max).unwrap_or(usize::MAX));
    // Counted before anything is built.
    let count = if delimiter.is_empty() {
        text.chars().take(limit).count()
    } else {
        text.matches(delimiter).take(limit).count().saturating_add(1).min(limit)
    };
    if count > MAX_SPLIT_PARTS {
        return Err(ToolFailure::new(format!(
            "split would return {count} parts, more than the limit of {MAX_SPLIT_PARTS}"
        ))
        .suggest("Split a smaller piece of the text, use a delimiter that occurs less often, or set maxParts."));
    }
    // Each part adds its quotes and a comma to the JSON result.
    check_result_len("split", text.len().saturating_add(count.saturating_mul(3)))?;
    let parts: Vec<String> = if delimiter.is_empty() {
        text.chars().take(limit).map(String::from).collect()
    } else {
        text.split(delimiter).take(limit).map(str::to_owned).collect()
    };
    Ok(json!({"delimiter": delimiter, "count": parts.len(), "parts": parts}).into())
}

fn join(_ctx: &ToolContext, input: &JsonObject) -> HandlerResult {
    let parts = args::require_array(input, "parts")?;
    let delimiter = args::optional_string(input, "delimiter")?.unwrap_or("\n");
    let strings = parts
        .iter()
        .map(|part| {
            args::scalar_text(part).ok_or_else(|| {
                ToolFailure::new("'parts' must contain only string/number/boolean values")
                    .suggest("Convert other values to strings before joining them.")
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let len = strings
        .iter()
        .map(String::len)
        .fold(delimiter.len().saturating_mul(strings.len().saturating_sub(1)), usize::saturating_add);
    check_result_len("join", len)?;
    Ok(json!({"delimiter": delimiter, "count": strings.len(), "result": strings.join(delimiter)}).into())
}

fn trim(_ctx: &ToolContext, input: &JsonObject) -> HandlerResult {
    let text = args::require_string(input, "text")?;
    let mode = args::optional_string(input, "mode")?.unwrap_or("both");
    // JavaScript also trims the byte-order mark.
    let is_space = |c: char| c.is_whitespace() || c == '\u{feff}';
    // Any other mode trims both ends, as in the original (the schema's enum
    // stops other modes before a call through the executor gets here).
    let result = match mode {
        "start" => text.trim_start_matches(is_space),
        "end" => text.trim_end_matches(is_space),
        _ => text.trim_matches(is_space),
    };
    let trimmed = text.chars().count() - result.chars().count();
    Ok(json!({"original": text, "result": result, "mode": mode, "trimmedLength": trimmed}).into())
}

fn change_case(_ctx: &ToolContext, input: &JsonObject) -> HandlerResult {
    let text = args::require_string(input, "text")?;
    let to = args::require_string(input, "to")?;
    let result = match to {
        "upper" => text.to_uppercase(),
        "lower" => text.to_lowercase(),
        other => {
            return Err(ToolFailure::new(format!("Unsupported case transform '{other}'. Use 'upper' or 'lower'.")));
        }
    };
    Ok(json!({"original": text, "result": result, "to": to}).into())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::test_support::{call, err, ok};

    fn run(export: &str, input: JsonValue) -> HandlerResult {
        call("text-transform", export, input)
    }

    /// Spec 003's table of built-in tools names text-transform's export
    /// `transform`; the original (packages/base, every version) has
    /// `replace, slice, split, join, trim, case` and no `transform`, and so
    /// has this build: the manifest and the native handlers agree with the
    /// original, not with the table (docs/COMPATIBILITY.md, Tools).
    #[test]
    fn the_exports_are_the_originals_and_there_is_no_transform() {
        let base = goondan_config::base_package();
        let tool = base.tools().find(|tool| tool.name() == "text-transform");
        let exports: Vec<&str> =
            tool.map(|tool| tool.spec.exports.iter().map(|e| e.name.as_str()).collect()).unwrap_or_default();
        assert_eq!(exports, ["replace", "slice", "split", "join", "trim", "case"]);
        assert!(exports.iter().all(|export| handler(export).is_some()));
        assert!(handler("transform").is_none());
    }

    #[test]
    fn replace_first_or_all() {
        let output = ok(run("replace", json!({"text": "a-b-c", "search": "-", "replacement": "+"})));
        assert_eq!(output, json!({"original": "a-b-c", "result": "a+b-c", "replacements": 1}));
        let output = ok(run("replace", json!({"text": "a-b-c", "search": "-", "replacement": "+", "all": true})));
        assert_eq!(output["result"], json!("a+b+c"));
        assert_eq!(output["replacements"], json!(2));
        let output = ok(run("replace", json!({"text": "a-b-c", "search": "-", "all": true})));
        assert_eq!(output["result"], json!("abc"));
        let output = ok(run("replace", json!({"text": "abc", "search": "x"})));
        assert_eq!(output, json!({"original": "abc", "result": "abc", "replacements": 0}));
        // The replacement is literal: no `$&` patterns.
        let output = ok(run("replace", json!({"text": "ab", "search": "a", "replacement": "$&$$"})));
        assert_eq!(output["result"], json!("$&$$b"));
    }

    #[test]
    fn results_are_bounded_before_they_are_built() {
        let text = "a".repeat(100_000);
        let replacement = "b".repeat(1000);
        // 100 MB from 101 KB of input: refused.
        let input = json!({"text": text, "search": "a", "replacement": replacement, "all": true});
        let failure = err(run("replace", input));
        assert_eq!(
            failure.message,
            format!("the result of replace would be 100000000 bytes, more than the limit of {MAX_RESULT_BYTES}")
        );
        assert!(failure.suggestion.is_some());
        // The first match only, or a replacement that fits, is fine.
        let output = ok(run("replace", json!({"text": text, "search": "a", "replacement": replacement})));
        assert_eq!(output["replacements"], json!(1));
        let output = ok(run("replace", json!({"text": text, "search": "a", "replacement": "bb", "all": true})));
        assert_eq!(output["result"].as_str().map(str::len), Some(200_000));
        let parts: Vec<&str> = vec!["x"; 20_000];
        let failure = err(run("join", json!({"parts": parts, "delimiter": replacement})));
        assert!(failure.message.starts_with("the result of join would be 20019000 bytes"), "{}", failure.message);
        let output = ok(run("join", json!({"parts": parts, "delimiter": ","})));
        assert_eq!(output["result"].as_str().map(str::len), Some(39_999));
    }

    #[test]
    fn split_is_bounded_before_it_is_built() {
        // 1 MB of text into a million one-character parts: refused, not built.
        let text = "x".repeat(1_000_000);
        let failure = err(run("split", json!({"text": text, "delimiter": ""})));
        assert_eq!(
            failure.message,
            format!("split would return 1000000 parts, more than the limit of {MAX_SPLIT_PARTS}")
        );
        assert!(failure.suggestion.is_some());
        // Asking for fewer parts, or a delimiter that occurs less often, is fine.
        let output = ok(run("split", json!({"text": text, "delimiter": "", "maxParts": 10})));
        assert_eq!(output["count"], json!(10));
        let lines = "line\n".repeat(1000);
        let output = ok(run("split", json!({"text": lines})));
        assert_eq!(output["count"], json!(1001));
    }

    #[test]
    fn replace_rejects_empty_search() {
        let failure = err(run("replace", json!({"text": "abc", "search": ""})));
        assert_eq!(failure.message, "'search' must be a non-empty string");
        assert!(failure.suggestion.is_some());
        let failure = err(run("replace", json!({"text": "abc"})));
        assert_eq!(failure.message, "'search' must be a non-empty string");
        // A blank search is a search for white space, as in the original.
        let output = ok(run("replace", json!({"text": "a b c", "search": " ", "replacement": "_", "all": true})));
        assert_eq!(output["result"], json!("a_b_c"));
        let failure = err(run("replace", json!({"text": "abc", "search": "a", "all": "yes"})));
        assert_eq!(failure.message, "'all' must be a boolean, got string");
    }

    fn sliced(start: Option<f64>, end: Option<f64>) -> JsonValue {
        let mut input = json!({"text": "héllo wörld"});
        if let Some(start) = start {
            input["start"] = json!(start);
        }
        if let Some(end) = end {
            input["end"] = json!(end);
        }
        ok(run("slice", input))
    }

    #[test]
    fn slice_like_javascript() {
        let output = sliced(None, None);
        assert_eq!(
            output,
            json!({"original": "héllo wörld", "result": "héllo wörld", "start": 0, "end": 11, "length": 11})
        );
        let cases = [
            (Some(1.0), Some(4.0), "éll"),
            (Some(6.0), None, "wörld"),
            (Some(-5.0), None, "wörld"),
            (Some(-5.0), Some(-3.0), "wö"),
            (Some(-100.0), Some(2.0), "hé"),
            (Some(3.0), Some(100.0), "lo wörld"),
            (Some(5.0), Some(2.0), ""),
            (Some(100.0), None, ""),
            (Some(1.9), Some(3.9), "él"),
            (Some(-1.5), None, "d"),
        ];
        for (start, end, expected) in cases {
            let output = sliced(start, end);
            assert_eq!(output["result"], json!(expected), "{start:?}..{end:?}");
            assert_eq!(output["length"], json!(expected.chars().count()), "{start:?}..{end:?}");
        }
        let output = sliced(Some(-5.0), Some(-3.0));
        assert_eq!(output["start"], json!(-5));
        assert_eq!(output["end"], json!(-3));
        assert_eq!(sliced(Some(1.5), None)["start"], json!(1.5));
    }

    #[test]
    fn slice_rejects_wrong_types() {
        let failure = err(run("slice", json!({"text": "abc", "start": "1"})));
        assert_eq!(failure.message, "'start' must be a valid number, got string");
        let failure = err(run("slice", json!({"start": 1})));
        assert_eq!(failure.message, "'text' must be a non-empty string");
    }

    #[test]
    fn split_like_javascript() {
        let output = ok(run("split", json!({"text": "a\nb\nc"})));
        assert_eq!(output, json!({"delimiter": "\n", "count": 3, "parts": ["a", "b", "c"]}));
        let output = ok(run("split", json!({"text": "a,b,,c", "delimiter": ",", "maxParts": 2})));
        assert_eq!(output, json!({"delimiter": ",", "count": 2, "parts": ["a", "b"]}));
        let output = ok(run("split", json!({"text": "a,b", "delimiter": ",", "maxParts": 0})));
        assert_eq!(output["parts"], json!([]));
        let output = ok(run("split", json!({"text": "hé!", "delimiter": ""})));
        assert_eq!(output["parts"], json!(["h", "é", "!"]));
        let output = ok(run("split", json!({"text": ",", "delimiter": ","})));
        assert_eq!(output["parts"], json!(["", ""]));
    }

    #[test]
    fn split_rejects_bad_max_parts() {
        for max in [json!(-1), json!(1.5)] {
            let failure = err(run("split", json!({"text": "a", "maxParts": max})));
            assert!(failure.message.starts_with("'maxParts' must be a whole number"), "{}", failure.message);
        }
    }

    #[test]
    fn join_stringifies_like_javascript() {
        let output = ok(run("join", json!({"parts": ["a", 1, 1.5, true, false, -0.0, 2.0]})));
        assert_eq!(output, json!({"delimiter": "\n", "count": 7, "result": "a\n1\n1.5\ntrue\nfalse\n0\n2"}));
        let output = ok(run("join", json!({"parts": [1e21, 1.5e-7, 0.000001, 123456789012u64], "delimiter": ", "})));
        assert_eq!(output["result"], json!("1e+21, 1.5e-7, 0.000001, 123456789012"));
        let output = ok(run("join", json!({"parts": [], "delimiter": ","})));
        assert_eq!(output, json!({"delimiter": ",", "count": 0, "result": ""}));
    }

    #[test]
    fn join_rejects_other_values() {
        for bad in [json!(null), json!([1]), json!({"a": 1})] {
            let failure = err(run("join", json!({"parts": ["a", bad]})));
            assert_eq!(failure.message, "'parts' must contain only string/number/boolean values");
        }
        let failure = err(run("join", json!({"parts": "a,b"})));
        assert_eq!(failure.message, "'parts' must be an array, got string");
    }

    #[test]
    fn trim_modes() {
        let text = "\u{feff} \t hi \n";
        let output = ok(run("trim", json!({"text": text})));
        assert_eq!(output, json!({"original": text, "result": "hi", "mode": "both", "trimmedLength": 6}));
        let output = ok(run("trim", json!({"text": "  hé  ", "mode": "start"})));
        assert_eq!(output["result"], json!("hé  "));
        assert_eq!(output["trimmedLength"], json!(2));
        let output = ok(run("trim", json!({"text": "  hé  ", "mode": "end"})));
        assert_eq!(output["result"], json!("  hé"));
        // The original trims both ends for any other mode and reports it as given.
        let output = ok(run("trim", json!({"text": " x ", "mode": "middle"})));
        assert_eq!(output, json!({"original": " x ", "result": "x", "mode": "middle", "trimmedLength": 2}));
    }

    #[test]
    fn case_transforms() {
        let output = ok(run("case", json!({"text": "Straße", "to": "upper"})));
        assert_eq!(output, json!({"original": "Straße", "result": "STRASSE", "to": "upper"}));
        let output = ok(run("case", json!({"text": "ÀBC", "to": "lower"})));
        assert_eq!(output["result"], json!("àbc"));
        let failure = err(run("case", json!({"text": "x", "to": "title"})));
        assert_eq!(failure.message, "Unsupported case transform 'title'. Use 'upper' or 'lower'.");
        let failure = err(run("case", json!({"text": "x"})));
        assert_eq!(failure.message, "'to' must be a non-empty string");
    }

    #[test]
    fn empty_text_is_refused_as_in_the_original() {
        let inputs = [
            ("replace", json!({"text": "", "search": "a"})),
            ("slice", json!({"text": ""})),
            ("split", json!({"text": ""})),
            ("trim", json!({"text": ""})),
            ("case", json!({"text": "", "to": "upper"})),
        ];
        for (export, input) in inputs {
            let failure = err(run(export, input));
            assert_eq!(failure.message, "'text' must be a non-empty string", "{export}");
        }
        let failure = err(run("case", json!({"text": "x", "to": ""})));
        assert_eq!(failure.message, "'to' must be a non-empty string");
    }

    #[test]
    fn unknown_export() {
        assert!(handler("regex").is_none());
        assert!(crate::native_handler("text-transform", "template", &crate::test_support::settings()).is_none());
    }
}
