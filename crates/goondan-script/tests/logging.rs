//! Where a script tool's output goes: `ctx.logger` lines become `log`
//! frames and then `tracing` events (target `goondan::script`) tagged with
//! the tool call id; what it prints to stdout/stderr becomes log lines too.
//! A binary of its own, because it installs a global subscriber.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use common::{Kit, output, runtime_or_skip};
use goondan_script::ScriptHost;
use serde_json::json;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn logger_lines_and_printed_output_reach_tracing() {
    let Some(runtime) = runtime_or_skip("logging") else { return };
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_env_filter("goondan::script=debug")
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap_or_else(|e| panic!("{e}"));

    let kit = Kit::new(ScriptHost::with_runtime(runtime), None);
    let result = kit.call("call-log", "kit__log", json!({})).await;
    assert_eq!(output(&result), &json!("logged"));
    let result = kit.call("call-noisy", "kit__noisy", json!({})).await;
    assert_eq!(output(&result), &json!("quiet result"));

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
}
