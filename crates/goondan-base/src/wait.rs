//! The `wait` tool: `seconds{seconds}` pauses the agent for up to five
//! minutes without blocking the runtime's threads.

use std::sync::Arc;
use std::time::Duration;

use goondan_core::codes::E_TOOL;
use goondan_core::{JsonObject, JsonValue};
use goondan_tools::{BoxFuture, HandlerResult, ToolContext, ToolFailure, ToolHandler};
use serde_json::json;

use crate::args;

/// The longest wait, in seconds.
pub const MAX_SECONDS: f64 = 300.0;

/// The handler of `export`, or `None` if the tool has no such export.
pub fn handler(export: &str) -> Option<Arc<dyn ToolHandler>> {
    match export {
        "seconds" => Some(Arc::new(WaitSeconds)),
        _ => None,
    }
}

/// `seconds`, checked with the original's messages (its users and tests
/// match on `'seconds' must be less than or equal to 300`).
fn read_seconds(input: &JsonObject) -> Result<f64, ToolFailure> {
    let failure = |message: String| {
        ToolFailure::with_code(message, E_TOOL)
            .suggest(format!("Wait 0 to {MAX_SECONDS} seconds per call; call again to wait longer."))
    };
    let Some(seconds) = input.get("seconds").and_then(JsonValue::as_f64).filter(|s| s.is_finite()) else {
        return Err(failure("'seconds' must be a finite number".to_owned()));
    };
    if seconds < 0.0 {
        return Err(failure("'seconds' must be greater than or equal to 0".to_owned()));
    }
    if seconds > MAX_SECONDS {
        return Err(failure(format!("'seconds' must be less than or equal to {MAX_SECONDS}")));
    }
    Ok(seconds)
}

/// `wait.seconds`: sleeps on the Tokio timer, then reports how long.
struct WaitSeconds;

impl ToolHandler for WaitSeconds {
    fn call<'a>(&'a self, _ctx: &'a ToolContext, input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            let seconds = read_seconds(input)?;
            // In 0..=300_000, so the conversion is exact.
            let waited_ms = (seconds * 1000.0).round() as u64;
            tokio::time::sleep(Duration::from_millis(waited_ms)).await;
            Ok(json!({"waitedSeconds": args::number_value(seconds), "waitedMs": waited_ms}).into())
        })
    }
}

#[cfg(test)]
mod tests {
    use goondan_core::JsonValue;
    use serde_json::json;
    use tokio::time::Instant;

    use super::*;
    use crate::test_support::{context, err, object, ok};

    async fn run(input: JsonValue) -> (HandlerResult, Duration) {
        let Some(handler) = crate::native_handler("wait", "seconds", &crate::test_support::settings()) else {
            panic!("no wait.seconds handler");
        };
        let ctx = context("wait__seconds");
        let input = object(input);
        let started = Instant::now();
        let result = handler.call(&ctx, &input).await;
        (result, started.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn waits_on_the_timer() {
        let (result, elapsed) = run(json!({"seconds": 1.5})).await;
        assert_eq!(ok(result), json!({"waitedSeconds": 1.5, "waitedMs": 1500}));
        assert!(elapsed >= Duration::from_millis(1500), "{elapsed:?}");
        assert!(elapsed < Duration::from_millis(1600), "{elapsed:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn whole_seconds_and_bounds() {
        let (result, elapsed) = run(json!({"seconds": 300})).await;
        assert_eq!(ok(result), json!({"waitedSeconds": 300, "waitedMs": 300_000}));
        assert!(elapsed >= Duration::from_secs(300), "{elapsed:?}");
        let (result, _) = run(json!({"seconds": 0})).await;
        assert_eq!(ok(result), json!({"waitedSeconds": 0, "waitedMs": 0}));
        let (result, _) = run(json!({"seconds": 0.0004})).await;
        assert_eq!(ok(result)["waitedMs"], json!(0));
    }

    #[tokio::test(start_paused = true)]
    async fn rejects_out_of_range_without_waiting() {
        let too_long = "'seconds' must be less than or equal to 300";
        let negative = "'seconds' must be greater than or equal to 0";
        for (seconds, message) in [(json!(301), too_long), (json!(-1), negative), (json!(300.5), too_long)] {
            let (result, elapsed) = run(json!({"seconds": seconds})).await;
            let failure = err(result);
            assert_eq!(failure.message, message);
            assert_eq!(failure.code.as_deref(), Some("E_TOOL"));
            assert!(failure.suggestion.is_some());
            assert_eq!(elapsed, Duration::ZERO);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn rejects_missing_or_wrong_type() {
        for input in [json!({}), json!({"seconds": "5"}), json!({"seconds": null})] {
            let (result, _) = run(input).await;
            assert_eq!(err(result).message, "'seconds' must be a finite number");
        }
    }

    #[test]
    fn unknown_export() {
        assert!(handler("minutes").is_none());
    }
}
