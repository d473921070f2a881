//! Where a script tool's output goes: `ctx.logger` lines (a Console: log,
//! info, debug, warn, error, trace, dir, table, assert, count, group, time…)
//! become `log` frames and then `tracing` events (target `goondan::script`)
//! at their level, tagged with the tool call id; what it prints to
//! stdout/stderr becomes log lines too.
//! A binary of its own, because it installs a global subscriber.

mod common;

use std::time::Duration;

use common::{Kit, output, runtime_or_skip};
use goondan_script::ScriptHost;
use goondan_test_support::Captured;
use serde_json::json;

#[tokio::test]
async fn logger_lines_and_printed_output_reach_tracing() {
    let Some(runtime) = runtime_or_skip("logging") else { return };
    let captured = Captured::default();
    let subscriber = captured.subscriber("goondan::script=debug");
    tracing::subscriber::set_global_default(subscriber).unwrap_or_else(|e| panic!("{e}"));

    let kit = Kit::new(ScriptHost::with_runtime(runtime), None);
    let result = kit.call("call-log", "kit__log", json!({})).await;
    assert_eq!(output(&result), &json!("logged"));
    let result = kit.call("call-noisy", "kit__noisy", json!({})).await;
    assert_eq!(output(&result), &json!("quiet result"));
    // ctx.logger is a Console (spec 002 §5.3): every method of console,
    // each at its level, through the same frames. The tool returns the
    // methods it found missing.
    let result = kit.call("call-console", "kit__console", json!({})).await;
    assert_eq!(output(&result), &json!([]));

    // stdout/stderr lines arrive on their own tasks; give them a moment.
    let mut text = String::new();
    for _ in 0..50 {
        text = captured.text();
        if text.contains("to stderr") && text.contains("forged") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let line = |needle: &str| text.lines().find(|l| l.contains(needle)).unwrap_or_default().to_owned();
    let hello = line("hello from the logger { n: 1 }");
    assert!(hello.contains("INFO") && hello.contains("tool_call_id=\"call-log\""), "{text}");
    assert!(line("careful").contains("WARN"), "{text}");
    assert!(line("to stderr").contains("WARN"), "{text}");
    assert!(line("forged").contains("INFO"), "{text}");

    let console = |needle: &str, level: &str| {
        let found = line(needle);
        assert!(found.contains(level) && found.contains("tool_call_id=\"call-console\""), "{needle}: {text}");
    };
    console("plain log line", "INFO");
    console("debugging", "DEBUG");
    console("broken 42", "ERROR");
    console("Assertion failed: math is off", "ERROR");
    assert!(!text.contains("never shown"), "{text}");
    console("hits: 1", "INFO");
    console("hits: 2", "INFO");
    console("outer", "INFO");
    console(":   inside the group", "INFO");
    console(": after the group", "INFO");
    console("No such label 't' for console.timeEnd()", "WARN");
    console("deep", "INFO");
    console("a: 1", "INFO");
    // t: 0.012ms
    let timed = line("script: t: ");
    assert!(timed.contains("INFO") && timed.contains("ms"), "{text}");
    // console.trace: its message, then the stack.
    // console.trace: its message, then the caller's stack (the host's own
    // frames left out); the call's id follows the last line.
    assert!(line("Trace: traced").contains("DEBUG"), "{text}");
    let stack: Vec<&str> = text.lines().skip_while(|l| !l.contains("Trace: traced")).skip(1).take(1).collect();
    assert!(stack.iter().all(|frame| frame.trim_start().starts_with("at ") && frame.contains("kit.ts")), "{text}");
    assert!(stack.len() == 1 && stack[0].contains("tool_call_id=\"call-console\""), "{text}");
}
