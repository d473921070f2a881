//! What the workspace's integration tests share, so that each test says
//! what it checks and not how to set it up:
//!
//! - [`bundle`]: a `goondan.yaml` (and the files beside it) written into a
//!   directory from typed calls, instead of YAML written inline;
//! - [`http`]: one HTTP POST to a service on 127.0.0.1, its response read back;
//! - [`model`]: one fake model server on 127.0.0.1 speaking the OpenAI
//!   Chat Completions streaming wire format, recording each request;
//! - [`captured`]: what a test's `tracing` subscriber wrote, in memory;
//! - [`context`]: a tool call's scope and context, for tests that call a
//!   tool handler without an agent;
//! - [`recording`]: the in-process fake model (a script that records
//!   every request), for turns run without a process;
//! - [`process`]: `gdn` run with its own state root and environment, its
//!   output collected, waits with a deadline, and the process killed when
//!   the test lets go of it;
//! - [`runtime`]: a runtime to block on, and base64 written out by hand;
//! - [`record_skip`]: the skip log `scripts/cargo-runner` counts, and
//!   [`skip_unless_required`] for a test whose peer is missing.
//!
//! Used only as a dev-dependency: nothing here is part of a shipped binary.
//! Of the workspace it uses `goondan-llm` (for [`recording`]) and
//! `goondan-tools` with `goondan-core` (for [`context`], [`captured`]); it drives `gdn`
//! from outside, as a user does.

pub mod bundle;
pub mod captured;
pub mod context;
pub mod http;
pub mod model;
pub mod process;
pub mod recording;
pub mod runtime;

pub use bundle::{Agent, Bundle, reply_text, reply_tools, when_input};
pub use captured::Captured;
pub use context::{call_scope, tool_context};
pub use model::{FakeModel, Reply, Request};
pub use process::{Gdn, Running, free_port, json_stdout, stderr, stdout, text, until};
pub use recording::RecordingModel;
pub use runtime::{base64, block_on};

/// Skips the calling test for want of what it needs (a peer program, a
/// runtime): says `problem` on standard error and adds `reason` to the skip
/// log ([`record_skip`], under `test` or the thread's name) — unless the
/// variable `require` is `1` (CI sets the `GOONDAN_REQUIRE_*` ones), where
/// the want fails the test instead. `None`, for `let … else` callers.
#[allow(clippy::print_stderr)]
pub fn skip_unless_required<T>(require: &str, test: Option<&str>, problem: &str, reason: &str) -> Option<T> {
    assert!(std::env::var(require).as_deref() != Ok("1"), "{require}=1 but {problem}");
    eprintln!("skipping {}: {problem}", test.unwrap_or("the test"));
    record_skip(test, reason);
    None
}

/// What a test returns.
pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Adds a skipped test to the log that `scripts/cargo-runner` counts
/// (`GOONDAN_TEST_SKIP_LOG`), so the run ends saying how many skipped and
/// why. The test is named by its thread (the test harness names each
/// test's thread after it) unless `test` names it.
pub fn record_skip(test: Option<&str>, reason: &str) {
    use std::io::Write as _;
    let Some(path) = std::env::var_os("GOONDAN_TEST_SKIP_LOG") else { return };
    let thread = std::thread::current();
    let test = test.or(thread.name()).unwrap_or("?");
    if let Ok(mut log) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(log, "{test}\t{reason}");
    }
}
