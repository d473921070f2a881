//! What the script-tool tests share: finding a runtime (or skipping), and
//! the fixture bundle's tools behind a real executor.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use goondan_core::{JsonObject, JsonValue, Message, ToolCall, ToolResult};
use goondan_script::{JsRuntime, ScriptHost, install_script_tools};
use goondan_tools::assembly::AgentTools;
use goondan_tools::{CallScope, ExecutorPolicy, ToolCatalog, ToolExecutor, ToolRegistry};

pub const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";

/// The fixture bundle directory.
pub fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/script-tools")
}

/// A usable runtime, or `None` after printing why the test skips. With
/// `GOONDAN_REQUIRE_JS=1` (CI) a missing runtime fails the test instead.
pub fn runtime_or_skip(test: &str) -> Option<JsRuntime> {
    JsRuntime::discover(&|name: &str| std::env::var(name).ok()).map_or_else(
        |error| {
            goondan_test_support::skip_unless_required(
                "GOONDAN_REQUIRE_JS",
                Some(test),
                &format!("{error} (install Bun or set GOONDAN_JS_RUNTIME to run it)"),
                "no JavaScript runtime (Bun, or Node >= 22.6)",
            )
        },
        Some,
    )
}

/// The fixture agent's tools behind an executor, script tools installed.
pub struct Kit {
    pub executor: ToolExecutor,
    pub catalog: Arc<ToolCatalog>,
    pub host: Arc<ScriptHost>,
    pub installed: usize,
    pub workdir: PathBuf,
    /// The instance's tasks the calls see (`None`: no agent instance keeps them).
    pub tasks: Option<Arc<dyn goondan_tools::tasks::ToolTasks>>,
}

impl Kit {
    pub fn new(host: Arc<ScriptHost>, call_timeout: Option<Duration>) -> Self {
        Self::for_bundle(&fixture(), host, call_timeout)
    }

    /// As [`Kit::new`] for the agent `scripter` of the bundle in `dir`.
    pub fn for_bundle(dir: &Path, host: Arc<ScriptHost>, call_timeout: Option<Duration>) -> Self {
        let report = goondan_config::load_bundle(dir);
        let bundle = report.valid_bundle().unwrap_or_else(|| panic!("fixture invalid: {:?}", report.diagnostics));
        let agent = bundle.agent("scripter").unwrap_or_else(|| panic!("no agent scripter"));
        let tools = AgentTools::for_agent(bundle, agent);
        let registry = Arc::new(ToolRegistry::new());
        let installed = install_script_tools(&registry, &tools, &host).unwrap_or_else(|e| panic!("install: {e}"));
        let catalog = Arc::new(tools.step_catalog(&registry));
        let executor =
            ToolExecutor::new(registry).with_policy(ExecutorPolicy { call_timeout, ..ExecutorPolicy::default() });
        Self { executor, catalog, host, installed, workdir: std::env::temp_dir(), tasks: None }
    }

    pub fn scope(&self, calls: Vec<ToolCall>) -> Arc<CallScope> {
        Arc::new(CallScope {
            agent_name: "scripter".into(),
            instance_key: "inst-1".into(),
            turn_id: "turn-1".into(),
            step_id: "step-1".into(),
            step_index: 0,
            message: Arc::new(Message::assistant_tool_calls("step-1", calls)),
            workdir: Arc::from(self.workdir.as_path()),
            trace_id: TRACE_ID.into(),
            step_span_id: "b7ad6b7169203331".into(),
            runtime: None,
            tasks: self.tasks.clone(),
        })
    }

    /// Calls `name` with `args` through the executor.
    pub async fn call(&self, id: &str, name: &str, args: JsonValue) -> ToolResult {
        let args: JsonObject = match args {
            JsonValue::Object(map) => map,
            other => panic!("args must be an object: {other}"),
        };
        let call = ToolCall::new(id, name, args);
        let scope = self.scope(vec![call.clone()]);
        self.executor.execute(call, &scope, &self.catalog).await
    }
}

/// The output of an ok result, or a panic showing the result.
pub fn output(result: &ToolResult) -> &JsonValue {
    match (&result.error, &result.output) {
        (None, Some(output)) => output,
        _ => panic!("expected an ok result, got {result:?}"),
    }
}

/// The error code and message of an error result.
pub fn error(result: &ToolResult) -> (String, String) {
    match &result.error {
        Some(error) => (error.code.clone().unwrap_or_default(), error.message.clone()),
        None => panic!("expected an error result, got {result:?}"),
    }
}
