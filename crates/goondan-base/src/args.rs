//! Typed reads of a tool's input object, shared by every tool of this crate.
//!
//! The executor validates inputs against the tool's schema before a handler
//! runs, so these checks are a second line of defence: a value of the wrong
//! type becomes a [`ToolFailure`] naming the property, never a panic. For the
//! optional readers an explicit `null` counts as absent.

use goondan_core::{JsonObject, JsonValue, json_type_name};
use goondan_tools::ToolFailure;

/// The value of `key`, treating `null` as absent.
fn present<'a>(input: &'a JsonObject, key: &str) -> Option<&'a JsonValue> {
    input.get(key).filter(|value| !value.is_null())
}

fn wrong_type(key: &str, expected: &str, actual: &JsonValue) -> ToolFailure {
    ToolFailure::new(format!("'{key}' must be {expected}, got {}", json_type_name(actual)))
}

fn missing(key: &str) -> ToolFailure {
    ToolFailure::new(format!("'{key}' is required")).suggest(format!("Provide the '{key}' property."))
}

/// A string property that may be absent.
pub fn optional_string<'a>(input: &'a JsonObject, key: &str) -> Result<Option<&'a str>, ToolFailure> {
    match present(input, key) {
        None => Ok(None),
        Some(JsonValue::String(text)) => Ok(Some(text)),
        Some(other) => Err(wrong_type(key, "a string", other)),
    }
}

/// A string property that must be present.
pub fn require_string<'a>(input: &'a JsonObject, key: &str) -> Result<&'a str, ToolFailure> {
    optional_string(input, key)?.ok_or_else(|| missing(key))
}

/// A number property that may be absent.
pub fn optional_number(input: &JsonObject, key: &str) -> Result<Option<f64>, ToolFailure> {
    match present(input, key) {
        None => Ok(None),
        Some(value @ JsonValue::Number(number)) => {
            number.as_f64().map(Some).ok_or_else(|| wrong_type(key, "a number", value))
        }
        Some(other) => Err(wrong_type(key, "a number", other)),
    }
}

/// A number property that must be present.
pub fn require_number(input: &JsonObject, key: &str) -> Result<f64, ToolFailure> {
    optional_number(input, key)?.ok_or_else(|| missing(key))
}

/// A whole number in `0..=max` that may be absent; `2.0` counts as `2`.
pub fn optional_count(input: &JsonObject, key: &str, max: u64) -> Result<Option<u64>, ToolFailure> {
    let Some(number) = optional_number(input, key)? else {
        return Ok(None);
    };
    let in_range = number.fract() == 0.0 && (0.0..=max as f64).contains(&number);
    if !in_range {
        return Err(ToolFailure::new(format!("'{key}' must be a whole number between 0 and {max}, got {number}")));
    }
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
        None => Err(missing(key)),
        Some(JsonValue::Array(items)) => Ok(items),
        Some(other) => Err(wrong_type(key, "an array", other)),
    }
}

/// An array-of-strings property that must be present.
pub fn require_string_array<'a>(input: &'a JsonObject, key: &str) -> Result<Vec<&'a str>, ToolFailure> {
    require_array(input, key)?
        .iter()
        .map(|item| item.as_str().ok_or_else(|| ToolFailure::new(format!("'{key}' must contain only strings"))))
        .collect()
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

/// Helpers shared by the tests of every tool.
#[cfg(test)]
pub(crate) mod test_support {
    use std::path::Path;
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};

    use goondan_core::{JsonObject, JsonValue, Message};
    use goondan_tools::{CallScope, HandlerResult, ToolContext, ToolFailure, ToolOutput};

    /// Default settings, as with an empty environment.
    pub(crate) fn settings() -> Arc<crate::BaseSettings> {
        Arc::new(crate::BaseSettings::default())
    }

    /// A context for a call of `tool` outside any real agent.
    pub(crate) fn context(tool: &str) -> ToolContext {
        context_in(tool, std::env::temp_dir().as_path())
    }

    /// A context for a call of `tool` whose instance works in `workdir`.
    pub(crate) fn context_in(tool: &str, workdir: &Path) -> ToolContext {
        let workdir: Arc<Path> = Arc::from(workdir);
        let scope = CallScope {
            agent_name: Arc::from("tester"),
            instance_key: Arc::from("test-instance"),
            turn_id: Arc::from("turn-1"),
            step_id: Arc::from("step-1"),
            message: Arc::new(Message::assistant_tool_calls("step-1", vec![])),
            workdir,
            trace_id: Arc::from("0".repeat(32)),
            step_span_id: Arc::from("0".repeat(16)),
            runtime: None,
        };
        ToolContext::new(Arc::new(scope), Arc::from(tool), "call-1".to_owned())
    }

    /// `value`'s object, for building inputs with `json!`.
    pub(crate) fn object(value: JsonValue) -> JsonObject {
        match value {
            JsonValue::Object(map) => map,
            other => panic!("test input must be an object, got {other}"),
        }
    }

    /// Calls a synchronous export through the crate's dispatcher.
    pub(crate) fn call(tool: &str, export: &str, input: JsonValue) -> HandlerResult {
        let Some(handler) = crate::native_handler(tool, export, &settings()) else {
            panic!("no handler for {tool}.{export}");
        };
        let ctx = context(&format!("{tool}__{export}"));
        let input = object(input);
        let mut future = handler.call(&ctx, &input);
        match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(result) => result,
            Poll::Pending => panic!("{tool}.{export} did not finish synchronously"),
        }
    }

    /// The output of a successful call.
    pub(crate) fn ok(result: HandlerResult) -> JsonValue {
        match result {
            Ok(ToolOutput::Value(value)) => value,
            other => panic!("expected a value, got {other:?}"),
        }
    }

    /// The failure of a failed call.
    pub(crate) fn err(result: HandlerResult) -> ToolFailure {
        match result {
            Err(failure) => failure,
            Ok(output) => panic!("expected a failure, got {output:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::test_support::object;
    use super::*;

    #[test]
    fn strings() {
        let input = object(json!({"a": "x", "n": 1, "z": null}));
        assert_eq!(require_string(&input, "a"), Ok("x"));
        assert_eq!(optional_string(&input, "b"), Ok(None));
        assert_eq!(optional_string(&input, "z"), Ok(None));
        let Err(failure) = require_string(&input, "b") else { panic!("missing accepted") };
        assert_eq!(failure.message, "'b' is required");
        assert!(failure.suggestion.is_some());
        let Err(failure) = optional_string(&input, "n") else { panic!("number accepted") };
        assert_eq!(failure.message, "'n' must be a string, got integer");
    }

    #[test]
    fn numbers_and_bools() {
        let input = object(json!({"n": 1.5, "i": 3, "s": "3", "b": true}));
        assert_eq!(require_number(&input, "n"), Ok(1.5));
        assert_eq!(optional_number(&input, "i"), Ok(Some(3.0)));
        assert_eq!(optional_number(&input, "x"), Ok(None));
        assert!(require_number(&input, "x").is_err());
        let Err(failure) = optional_number(&input, "s") else { panic!("string accepted") };
        assert_eq!(failure.message, "'s' must be a number, got string");
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
        let Err(failure) = require_string_array(&input, "m") else { panic!("mixed accepted") };
        assert_eq!(failure.message, "'m' must contain only strings");
    }

    #[test]
    fn numbers_print_like_javascript() {
        assert_eq!(number_value(2.0), json!(2));
        assert_eq!(number_value(-3.0), json!(-3));
        assert_eq!(number_value(1.5), json!(1.5));
        assert_eq!(number_value(1e300), json!(1e300));
    }
}
