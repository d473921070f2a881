//! Typed reads of a tool's input object, shared by every tool of this crate.
//!
//! The executor validates inputs against the tool's schema before a handler
//! runs, so these checks are a second line of defence: a value of the wrong
//! type becomes a [`ToolFailure`] naming the property, never a panic. For the
//! optional readers an explicit `null` counts as absent.
//!
//! The messages start with the original's (`'path' must be a non-empty
//! string`, `'start' must be a valid number`, `'keys' must be an array of
//! strings`), which its users and tests match on; where it helps, the type
//! that was sent follows (`, got integer`) or is named in the suggestion.

use goondan_core::{JsonObject, JsonValue, json_type_name};
use goondan_tools::ToolFailure;

/// The value of `key`, treating `null` as absent.
fn present<'a>(input: &'a JsonObject, key: &str) -> Option<&'a JsonValue> {
    input.get(key).filter(|value| !value.is_null())
}

fn wrong_type(key: &str, expected: &str, actual: &JsonValue) -> ToolFailure {
    ToolFailure::new(format!("'{key}' must be {expected}, got {}", json_type_name(actual)))
}

/// A required property that is absent; `expected` as in [`wrong_type`], so
/// the message is the original's (`'keys' must be an array of strings`).
fn missing(key: &str, expected: &str) -> ToolFailure {
    ToolFailure::new(format!("'{key}' must be {expected}")).suggest(format!("Provide the '{key}' property."))
}

/// A string property that may be absent.
pub fn optional_string<'a>(input: &'a JsonObject, key: &str) -> Result<Option<&'a str>, ToolFailure> {
    match present(input, key) {
        None => Ok(None),
        Some(JsonValue::String(text)) => Ok(Some(text)),
        Some(other) => Err(wrong_type(key, "a string", other)),
    }
}

/// The original's message for a required string that is missing, empty or
/// not a string: its users and tests match on this wording.
fn not_a_non_empty_string(key: &str) -> String {
    format!("'{key}' must be a non-empty string")
}

/// A string property that must be present and not empty, as the original's
/// `requireString`: a missing, empty or non-string value gets the original's
/// message, `'key' must be a non-empty string`; the suggestion says what was
/// sent instead.
pub fn require_string<'a>(input: &'a JsonObject, key: &str) -> Result<&'a str, ToolFailure> {
    let got = match present(input, key) {
        Some(JsonValue::String(text)) if !text.is_empty() => return Ok(text),
        Some(JsonValue::String(_)) => "an empty string".to_owned(),
        Some(other) => json_type_name(other).to_owned(),
        None => "nothing".to_owned(),
    };
    Err(ToolFailure::new(not_a_non_empty_string(key))
        .suggest(format!("Provide '{key}' as a non-empty string (got {got}).")))
}

/// A string property that must be present and hold more than white space
/// (returned as given); `suggestion` says what to pass instead of a blank.
pub fn require_non_blank<'a>(input: &'a JsonObject, key: &str, suggestion: &str) -> Result<&'a str, ToolFailure> {
    match present(input, key) {
        Some(JsonValue::String(text)) => non_blank(key, text, suggestion),
        _ => require_string(input, key),
    }
}

/// `value` of `key` unless it is empty or only white space. The original
/// refuses only the empty string; a blank one is always a mistake here (a
/// command that does nothing, a file name nobody can see), so it gets the
/// same refusal and the same wording.
pub fn non_blank<'a>(key: &str, value: &'a str, suggestion: &str) -> Result<&'a str, ToolFailure> {
    if value.trim().is_empty() {
        return Err(ToolFailure::new(not_a_non_empty_string(key)).suggest(suggestion));
    }
    Ok(value)
}

/// A number property that may be absent.
pub fn optional_number(input: &JsonObject, key: &str) -> Result<Option<f64>, ToolFailure> {
    match present(input, key) {
        None => Ok(None),
        Some(value @ JsonValue::Number(number)) => {
            number.as_f64().map(Some).ok_or_else(|| wrong_type(key, "a valid number", value))
        }
        Some(other) => Err(wrong_type(key, "a valid number", other)),
    }
}

/// A number property that must be present.
pub fn require_number(input: &JsonObject, key: &str) -> Result<f64, ToolFailure> {
    optional_number(input, key)?.ok_or_else(|| missing(key, "a valid number"))
}

/// A whole number in `0..=max` that may be absent; `2.0` counts as `2`.
pub fn optional_count(input: &JsonObject, key: &str, max: u64) -> Result<Option<u64>, ToolFailure> {
    optional_whole(input, key, 0, max)
}

/// A whole number in `min..=max` that may be absent; `2.0` counts as `2`.
pub fn optional_whole(input: &JsonObject, key: &str, min: u64, max: u64) -> Result<Option<u64>, ToolFailure> {
    let Some(number) = optional_number(input, key)? else {
        return Ok(None);
    };
    let in_range = number.fract() == 0.0 && (min as f64..=max as f64).contains(&number);
    if !in_range {
        return Err(ToolFailure::new(format!(
            "'{key}' must be a whole number between {min} and {max}, got {}",
            number_value(number)
        )));
    }
    // Whole and within `min..=max`, so the conversion is exact.
    Ok(Some(number as u64))
}

/// A boolean property that may be absent.
pub fn optional_bool(input: &JsonObject, key: &str) -> Result<Option<bool>, ToolFailure> {
    match present(input, key) {
        None => Ok(None),
        Some(JsonValue::Bool(flag)) => Ok(Some(*flag)),
        Some(other) => Err(wrong_type(key, "a boolean", other)),
    }
}

/// An array property that must be present.
pub fn require_array<'a>(input: &'a JsonObject, key: &str) -> Result<&'a [JsonValue], ToolFailure> {
    match present(input, key) {
        None => Err(missing(key, "an array")),
        Some(JsonValue::Array(items)) => Ok(items),
        Some(other) => Err(wrong_type(key, "an array", other)),
    }
}

/// An array-of-strings property that must be present.
pub fn require_string_array<'a>(input: &'a JsonObject, key: &str) -> Result<Vec<&'a str>, ToolFailure> {
    const EXPECTED: &str = "an array of strings";
    let items = match present(input, key) {
        None => return Err(missing(key, EXPECTED)),
        Some(JsonValue::Array(items)) => items,
        Some(other) => return Err(wrong_type(key, EXPECTED, other)),
    };
    items
        .iter()
        .map(|item| item.as_str().ok_or_else(|| ToolFailure::new(format!("'{key}' must contain only strings"))))
        .collect()
}

/// A string, number or boolean as text, the way JavaScript's `String(value)`
/// writes it (`1.0` → `"1"`, `1e21` → `"1e+21"`); `None` for other values.
pub fn scalar_text(value: &JsonValue) -> Option<String> {
    match value {
        JsonValue::String(text) => Some(text.clone()),
        JsonValue::Bool(flag) => Some(flag.to_string()),
        JsonValue::Number(number) => Some(js_number(number)),
        JsonValue::Null | JsonValue::Array(_) | JsonValue::Object(_) => None,
    }
}

/// A number as JavaScript's `String(n)` prints it; integers exactly as written.
fn js_number(number: &serde_json::Number) -> String {
    let Some(value) = number.as_f64().filter(|_| number.is_f64()) else {
        return number.to_string();
    };
    if value == 0.0 {
        return "0".to_owned(); // also -0
    }
    if (1e-6..1e21).contains(&value.abs()) {
        return value.to_string();
    }
    let exponential = format!("{value:e}");
    match exponential.split_once('e') {
        Some((mantissa, exponent)) if !exponent.starts_with('-') => format!("{mantissa}e+{exponent}"),
        _ => exponential,
    }
}

/// A number as JSON the way JavaScript would print it: integral values
/// without a fraction (`2`, not `2.0`).
pub fn number_value(number: f64) -> JsonValue {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if number.fract() == 0.0 && number.abs() < EXACT {
        return JsonValue::from(number as i64);
    }
    serde_json::Number::from_f64(number).map_or(JsonValue::Null, JsonValue::Number)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::test_support::object;

    #[test]
    fn strings() {
        let input = object(json!({"a": "x", "n": 1, "z": null}));
        assert_eq!(require_string(&input, "a"), Ok("x"));
        assert_eq!(optional_string(&input, "b"), Ok(None));
        assert_eq!(optional_string(&input, "z"), Ok(None));
        let Err(failure) = optional_string(&input, "n") else { panic!("number accepted") };
        assert_eq!(failure.message, "'n' must be a string, got integer");
    }

    #[test]
    fn required_strings_use_the_originals_wording() {
        let input = object(json!({"e": "", "n": 1, "z": null, "s": " "}));
        // A blank string is not empty: the original accepts it.
        assert_eq!(require_string(&input, "s"), Ok(" "));
        for (key, got) in [("e", "an empty string"), ("n", "integer"), ("z", "nothing"), ("x", "nothing")] {
            let Err(failure) = require_string(&input, key) else { panic!("{key} accepted") };
            assert_eq!(failure.message, format!("'{key}' must be a non-empty string"));
            let suggestion = failure.suggestion.unwrap_or_default();
            assert!(suggestion.contains(&format!("(got {got})")), "{suggestion}");
        }
    }

    #[test]
    fn non_blank_strings() {
        let input = object(json!({"a": " x ", "b": " \n", "n": 1}));
        assert_eq!(require_non_blank(&input, "a", "say"), Ok(" x "));
        let Err(failure) = require_non_blank(&input, "b", "Pass something.") else { panic!("blank accepted") };
        assert_eq!(failure.message, "'b' must be a non-empty string");
        assert_eq!(failure.suggestion.as_deref(), Some("Pass something."));
        let missing = require_non_blank(&input, "x", "").map_err(|f| f.message);
        assert_eq!(missing, Err("'x' must be a non-empty string".to_owned()));
        assert!(require_non_blank(&input, "n", "").is_err());
    }

    #[test]
    fn numbers_and_bools() {
        let input = object(json!({"n": 1.5, "i": 3, "s": "3", "b": true}));
        assert_eq!(require_number(&input, "n"), Ok(1.5));
        assert_eq!(optional_number(&input, "i"), Ok(Some(3.0)));
        assert_eq!(optional_number(&input, "x"), Ok(None));
        assert!(require_number(&input, "x").is_err());
        let Err(failure) = optional_number(&input, "s") else { panic!("string accepted") };
        assert_eq!(failure.message, "'s' must be a valid number, got string");
        let Err(failure) = require_number(&input, "x") else { panic!("missing accepted") };
        assert_eq!(failure.message, "'x' must be a valid number");
        assert_eq!(optional_bool(&input, "b"), Ok(Some(true)));
        assert_eq!(optional_bool(&input, "x"), Ok(None));
        assert!(optional_bool(&input, "n").is_err());
    }

    #[test]
    fn counts() {
        let input = object(json!({"a": 2, "b": 2.0, "c": -1, "d": 1.5, "e": 11}));
        assert_eq!(optional_count(&input, "a", 10), Ok(Some(2)));
        assert_eq!(optional_count(&input, "b", 10), Ok(Some(2)));
        assert_eq!(optional_count(&input, "x", 10), Ok(None));
        for key in ["c", "d", "e"] {
            let Err(failure) = optional_count(&input, key, 10) else { panic!("{key} accepted") };
            assert!(failure.message.contains("whole number between 0 and 10"), "{}", failure.message);
        }
    }

    #[test]
    fn arrays() {
        let input = object(json!({"a": ["x", "y"], "m": ["x", 1], "s": "x"}));
        assert_eq!(require_string_array(&input, "a"), Ok(vec!["x", "y"]));
        assert_eq!(require_array(&input, "a").map(<[JsonValue]>::len), Ok(2));
        assert!(require_array(&input, "x").is_err());
        let Err(failure) = require_array(&input, "s") else { panic!("string accepted") };
        assert_eq!(failure.message, "'s' must be an array, got string");
        let Err(failure) = require_array(&input, "x") else { panic!("missing accepted") };
        assert_eq!(failure.message, "'x' must be an array");
        // The original's wording for arrays of strings.
        let Err(failure) = require_string_array(&input, "s") else { panic!("string accepted") };
        assert_eq!(failure.message, "'s' must be an array of strings, got string");
        let Err(failure) = require_string_array(&input, "x") else { panic!("missing accepted") };
        assert_eq!(failure.message, "'x' must be an array of strings");
        let Err(failure) = require_string_array(&input, "m") else { panic!("mixed accepted") };
        assert_eq!(failure.message, "'m' must contain only strings");
    }

    #[test]
    fn whole_numbers_in_a_range() {
        let input = object(json!({"a": 1, "b": 10.0, "c": 0, "d": 2.5, "e": 11}));
        assert_eq!(optional_whole(&input, "a", 1, 10), Ok(Some(1)));
        assert_eq!(optional_whole(&input, "b", 1, 10), Ok(Some(10)));
        assert_eq!(optional_whole(&input, "x", 1, 10), Ok(None));
        for (key, shown) in [("c", "0"), ("d", "2.5"), ("e", "11")] {
            let Err(failure) = optional_whole(&input, key, 1, 10) else { panic!("{key} accepted") };
            assert_eq!(failure.message, format!("'{key}' must be a whole number between 1 and 10, got {shown}"));
        }
    }

    #[test]
    fn scalars_as_text_like_javascript() {
        let text = |value: JsonValue| scalar_text(&value);
        assert_eq!(text(json!("a b")).as_deref(), Some("a b"));
        assert_eq!(text(json!(true)).as_deref(), Some("true"));
        assert_eq!(text(json!(42)).as_deref(), Some("42"));
        assert_eq!(text(json!(12_345_678_901_234_567_890_u64)).as_deref(), Some("12345678901234567890"));
        assert_eq!(text(json!(-7)).as_deref(), Some("-7"));
        assert_eq!(text(json!(2.0)).as_deref(), Some("2"));
        assert_eq!(text(json!(-0.0)).as_deref(), Some("0"));
        assert_eq!(text(json!(1.5)).as_deref(), Some("1.5"));
        assert_eq!(text(json!(1e21)).as_deref(), Some("1e+21"));
        assert_eq!(text(json!(1.5e-7)).as_deref(), Some("1.5e-7"));
        assert_eq!(text(json!(0.000001)).as_deref(), Some("0.000001"));
        for other in [json!(null), json!([1]), json!({"a": 1})] {
            assert_eq!(text(other), None);
        }
    }

    #[test]
    fn numbers_print_like_javascript() {
        assert_eq!(number_value(2.0), json!(2));
        assert_eq!(number_value(-3.0), json!(-3));
        assert_eq!(number_value(1.5), json!(1.5));
        assert_eq!(number_value(1e300), json!(1e300));
    }
}
