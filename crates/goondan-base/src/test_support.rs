//! Helpers shared by the tests of every tool: contexts, inputs, results,
//! temporary workdirs, and a real executor holding a tool's exports from the
//! built-in package's manifest.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use goondan_core::{JsonObject, JsonValue, Message, ToolCall, ToolResult};
use goondan_tools::{
    CallScope, ExecutorPolicy, HandlerResult, ToolCatalog, ToolContext, ToolExecutor, ToolFailure, ToolOutput,
    ToolRegistry,
};

use crate::BaseSettings;

/// Default settings, as with an empty environment.
pub(crate) fn settings() -> Arc<BaseSettings> {
    Arc::new(BaseSettings::default())
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
        step_index: 0,
        message: Arc::new(Message::assistant_tool_calls("step-1", vec![])),
        workdir,
        trace_id: Arc::from("0".repeat(32)),
        step_span_id: Arc::from("0".repeat(16)),
        runtime: None,
        tasks: None,
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

/// Runs `tool.export` with `input` through the crate's dispatcher, in `workdir`.
pub(crate) async fn run_in(
    tool: &str,
    export: &str,
    settings: &Arc<BaseSettings>,
    workdir: &Path,
    input: JsonValue,
) -> HandlerResult {
    let Some(handler) = crate::native_handler(tool, export, settings) else { panic!("no handler {tool}.{export}") };
    let ctx = context_in(&format!("{tool}__{export}"), workdir);
    let input = object(input);
    handler.call(&ctx, &input).await
}

/// Runs `tool.export` with `input` in the temp directory.
pub(crate) async fn run(tool: &str, export: &str, settings: &Arc<BaseSettings>, input: JsonValue) -> HandlerResult {
    run_in(tool, export, settings, std::env::temp_dir().as_path(), input).await
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

/// Asserts that `token` appears nowhere in `value`'s debug form.
pub(crate) fn assert_no_token(value: &impl std::fmt::Debug, token: &str) {
    let text = format!("{value:?}");
    assert!(!text.contains(token), "token leaked: {text}");
}

/// The names of `dir`'s entries, sorted.
pub(crate) fn names(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { panic!("read_dir {}", dir.display()) };
    let mut names: Vec<String> =
        entries.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

/// A temporary directory, removed when dropped, and its real path.
pub(crate) struct Workdir {
    _dir: tempfile::TempDir,
    /// The directory's real (canonical) path.
    pub(crate) path: PathBuf,
}

/// A new temporary directory.
pub(crate) fn workdir() -> Workdir {
    let Ok(dir) = tempfile::tempdir() else { panic!("cannot create a temporary directory") };
    let path = std::fs::canonicalize(dir.path()).unwrap_or_else(|e| panic!("canonicalize: {e}"));
    Workdir { _dir: dir, path }
}

/// A real executor whose registry and catalog hold every export of one tool
/// of the built-in package's manifest, as a bundle that declares it would.
pub(crate) struct Executor {
    tool: String,
    executor: ToolExecutor,
    /// The catalog: every export of the tool.
    pub(crate) catalog: Arc<ToolCatalog>,
}

impl Executor {
    /// The executor of `tool`'s exports, with the crate's handlers built from `settings`.
    pub(crate) fn new(tool: &str, settings: &Arc<BaseSettings>) -> Self {
        let Some(resource) = goondan_config::base_package().tools().find(|t| t.name() == tool) else {
            panic!("no {tool} in the base package")
        };
        let registry = ToolRegistry::new();
        let mut catalog = ToolCatalog::new();
        for export in &resource.spec.exports {
            let item = goondan_tools::assembly::export_item(resource, export);
            let Some(handler) = crate::native_handler(tool, &export.name, settings) else {
                panic!("no handler for {tool}.{}", export.name)
            };
            registry.register(item.clone(), handler).unwrap_or_else(|e| panic!("{e}"));
            catalog.insert(item);
        }
        Self { tool: tool.to_owned(), executor: ToolExecutor::new(Arc::new(registry)), catalog: Arc::new(catalog) }
    }

    /// The same executor with `policy`.
    pub(crate) fn with_policy(self, policy: ExecutorPolicy) -> Self {
        Self { executor: self.executor.with_policy(policy), ..self }
    }

    /// Calls `export` with `args` for an instance working in `workdir`.
    pub(crate) async fn run_in(&self, workdir: &Path, export: &str, args: JsonValue) -> ToolResult {
        let name = format!("{}__{export}", self.tool);
        let ctx = context_in(&name, workdir);
        self.executor.execute(ToolCall::new("call-1", name.as_str(), object(args)), ctx.scope(), &self.catalog).await
    }

    /// Calls `export` with `args` in the temp directory.
    pub(crate) async fn run(&self, export: &str, args: JsonValue) -> ToolResult {
        self.run_in(std::env::temp_dir().as_path(), export, args).await
    }
}

/// Runs `tool.export` with `args` through a real [`Executor`] (temp directory as workdir).
pub(crate) async fn execute(tool: &str, settings: &Arc<BaseSettings>, export: &str, args: JsonValue) -> ToolResult {
    Executor::new(tool, settings).run(export, args).await
}
