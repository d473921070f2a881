//! Integration tests of the tool executor through the public API
//! (spec 002 §6–§8, §10; GOONDAN_FACTS "Tool execution").
//!
//! Every test asserts exact codes, names, messages and JSON shapes, so a
//! change of behaviour fails loudly.

use goondan_core::sync::LockUnpoisoned;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use goondan_core::{JsonObject, JsonValue, Message, ToolCall, ToolResult, ToolStatus};
use goondan_tools::assembly::AgentTools;
use goondan_tools::{
    BoxFuture, CallScope, ExecutorPolicy, HandlerResult, MemoryEventSink, Middleware, Next, RegistryError,
    ToolCallContext, ToolCallMiddleware, ToolCatalog, ToolCatalogItem, ToolContext, ToolExecutor, ToolFailure,
    ToolHandler, ToolOutput, ToolRegistry, ToolSource, from_fn, sync_handler,
};
use serde_json::json;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const AGENT: &str = "coder";
/// Where error results link to: the help catalog's entries.
const ERRORS: &str = "https://github.com/goondan/goondan-rs/blob/main/docs/ERRORS.md";
const INSTANCE: &str = "inst-1";
const TURN: &str = "turn-1";
const STEP: &str = "step-1";
const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
const STEP_SPAN_ID: &str = "b7ad6b7169203331";
const WORKDIR: &str = "/tmp/goondan-tests/inst-1";
const CALL_ID: &str = "call-1";
const SUFFIX: &str = "... (truncated)";
const NOT_IN_CATALOG_HINT: &str =
    "Add the tool to the Agent's spec.tools, or add it to the step's catalog in step middleware.";

/// A step scope whose assistant message holds `calls`.
fn scope_holding(calls: Vec<ToolCall>) -> Arc<CallScope> {
    Arc::new(CallScope {
        agent_name: AGENT.into(),
        instance_key: INSTANCE.into(),
        turn_id: TURN.into(),
        step_id: STEP.into(),
        step_index: 0,
        message: Arc::new(Message::assistant_tool_calls(STEP, calls)),
        workdir: Arc::from(Path::new(WORKDIR)),
        trace_id: TRACE_ID.into(),
        step_span_id: STEP_SPAN_ID.into(),
        runtime: None,
        tasks: None,
    })
}

/// A step scope with an empty assistant message.
fn scope() -> Arc<CallScope> {
    scope_holding(Vec::new())
}

/// A config-sourced catalog item named `resource__export`.
fn item(name: &str) -> ToolCatalogItem {
    let resource = name.split("__").next().unwrap_or(name);
    ToolCatalogItem::new(name, ToolSource::config(resource))
}

/// An extension-sourced catalog item.
fn dynamic_item(name: &str) -> ToolCatalogItem {
    ToolCatalogItem::new(name, ToolSource::extension("weather-ext"))
}

/// `bash__exec` with a schema: `command` (required string), `cwd`; nothing else.
fn bash_exec() -> ToolCatalogItem {
    item("bash__exec").with_parameters(json!({
        "type": "object",
        "properties": {"command": {"type": "string"}, "cwd": {"type": "string"}},
        "required": ["command"],
        "additionalProperties": false
    }))
}

fn obj(value: JsonValue) -> JsonObject {
    match value {
        JsonValue::Object(map) => map,
        other => panic!("expected a JSON object, got {other}"),
    }
}

fn call(name: &str, args: JsonValue) -> ToolCall {
    ToolCall { id: CALL_ID.into(), name: name.into(), args: obj(args) }
}

fn to_json(result: &ToolResult) -> JsonValue {
    serde_json::to_value(result).unwrap_or_else(|e| panic!("serialize result: {e}"))
}

fn error_message(result: &ToolResult) -> &str {
    match &result.error {
        Some(error) => &error.message,
        None => panic!("expected an error result, got {result:?}"),
    }
}

/// A handler that counts its calls and answers with `respond`.
fn counting<F>(respond: F) -> (Arc<dyn ToolHandler>, Arc<AtomicUsize>)
where
    F: Fn(&ToolContext, &JsonObject) -> HandlerResult + Send + Sync + 'static,
{
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&calls);
    let handler = sync_handler(move |ctx, args| {
        seen.fetch_add(1, Ordering::SeqCst);
        respond(ctx, args)
    });
    (handler, calls)
}

/// A counting handler that echoes its arguments as `{"args": ...}`.
fn echo() -> (Arc<dyn ToolHandler>, Arc<AtomicUsize>) {
    counting(|_, args| Ok(ToolOutput::Value(json!({ "args": args }))))
}

/// A handler that always fails with `failure`.
fn failing(failure: ToolFailure) -> Arc<dyn ToolHandler> {
    sync_handler(move |_, _| Err(failure.clone()))
}

/// An async handler that sleeps (tokio time) and then answers `"done"`.
struct Sleepy {
    delay: Duration,
    finished: Arc<AtomicUsize>,
}

impl ToolHandler for Sleepy {
    fn call<'a>(&'a self, _ctx: &'a ToolContext, _input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            tokio::time::sleep(self.delay).await;
            self.finished.fetch_add(1, Ordering::SeqCst);
            Ok(ToolOutput::Value(json!("done")))
        })
    }
}

fn sleepy(delay: Duration) -> (Arc<dyn ToolHandler>, Arc<AtomicUsize>) {
    let finished = Arc::new(AtomicUsize::new(0));
    (Arc::new(Sleepy { delay, finished: Arc::clone(&finished) }), finished)
}

fn explode(message: &str) -> HandlerResult {
    panic!("{message}")
}

/// An async handler that panics after its first await.
struct PanicsAfterAwait;

impl ToolHandler for PanicsAfterAwait {
    fn call<'a>(&'a self, _ctx: &'a ToolContext, _input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            tokio::task::yield_now().await;
            explode("async kaboom")
        })
    }
}

type Log = Arc<Mutex<Vec<String>>>;

fn push(log: &Log, entry: impl Into<String>) {
    log.lock_unpoisoned().push(entry.into());
}

fn entries(log: &Log) -> Vec<String> {
    log.lock_unpoisoned().clone()
}

/// A layer recording `label:pre` / `label:post` around the rest.
struct Recorder {
    label: &'static str,
    log: Log,
}

impl Middleware<ToolCallContext, ToolResult> for Recorder {
    fn handle<'a>(
        &'a self,
        ctx: &'a mut ToolCallContext,
        next: Next<'a, ToolCallContext, ToolResult>,
    ) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            push(&self.log, format!("{}:pre", self.label));
            let result: ToolResult = next.run(ctx).await;
            push(&self.log, format!("{}:post", self.label));
            result
        })
    }
}

/// A layer that returns `result` without calling `next`.
fn short_circuit(result: ToolResult) -> Arc<ToolCallMiddleware> {
    from_fn(move |_ctx, _next| {
        let result = result.clone();
        Box::pin(async move { result })
    })
}

/// Registry + catalog under construction.
#[derive(Default)]
struct Fixture {
    registry: ToolRegistry,
    catalog: ToolCatalog,
    policy: ExecutorPolicy,
    events: Option<Arc<MemoryEventSink>>,
}

impl Fixture {
    fn new() -> Self {
        Self::default()
    }

    /// Registers the tool and offers it in the step's catalog.
    fn tool(mut self, item: ToolCatalogItem, handler: Arc<dyn ToolHandler>) -> Self {
        self.catalog.insert(item.clone());
        self.registered(item, handler)
    }

    /// Registers the tool without offering it.
    fn registered(self, item: ToolCatalogItem, handler: Arc<dyn ToolHandler>) -> Self {
        let name = item.name().to_owned();
        if let Err(e) = self.registry.register(item, handler) {
            panic!("register {name}: {e}");
        }
        self
    }

    /// Offers the tool without registering a handler.
    fn offered(mut self, item: ToolCatalogItem) -> Self {
        self.catalog.insert(item);
        self
    }

    fn policy(mut self, policy: ExecutorPolicy) -> Self {
        self.policy = policy;
        self
    }

    fn events(mut self, sink: &Arc<MemoryEventSink>) -> Self {
        self.events = Some(Arc::clone(sink));
        self
    }

    fn build(self) -> Ready {
        let mut executor = ToolExecutor::new(Arc::new(self.registry)).with_policy(self.policy);
        if let Some(sink) = self.events {
            executor = executor.with_events(sink);
        }
        Ready { executor, catalog: Arc::new(self.catalog), scope: scope() }
    }
}

/// An executor ready to run calls against one step's catalog.
struct Ready {
    executor: ToolExecutor,
    catalog: Arc<ToolCatalog>,
    scope: Arc<CallScope>,
}

impl Ready {
    fn layer(mut self, name: &str, priority: i32, layer: Arc<ToolCallMiddleware>) -> Self {
        self.executor.register_middleware(name, priority, layer);
        self
    }

    async fn run(&self, call: ToolCall) -> ToolResult {
        self.executor.execute(call, &self.scope, &self.catalog).await
    }

    async fn call(&self, name: &str, args: JsonValue) -> ToolResult {
        self.run(call(name, args)).await
    }

    async fn json(&self, name: &str, args: JsonValue) -> JsonValue {
        to_json(&self.call(name, args).await)
    }
}

/// `"0123456789"` repeated up to `len` characters: every prefix is distinguishable.
fn digits(len: usize) -> String {
    "0123456789".chars().cycle().take(len).collect()
}

// ---------------------------------------------------------------------------
// 1. Ok results
// ---------------------------------------------------------------------------

#[tokio::test]
async fn ok_result_json_is_exactly_status_and_output() {
    let (handler, calls) = counting(|_, _| Ok(ToolOutput::Value(json!({"n": 1, "list": [1, "two", null]}))));
    let ready = Fixture::new().tool(item("calc__run"), handler).build();
    let result = ready.call("calc__run", json!({})).await;
    assert_eq!(result.status, ToolStatus::Ok);
    assert_eq!(to_json(&result), json!({"status": "ok", "output": {"n": 1, "list": [1, "two", null]}}));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn ok_result_passes_valid_args_to_the_handler_unchanged() {
    let (handler, _) = echo();
    let ready = Fixture::new().tool(bash_exec(), handler).build();
    let out = ready.json("bash__exec", json!({"command": "ls", "cwd": "src"})).await;
    assert_eq!(out, json!({"status": "ok", "output": {"args": {"command": "ls", "cwd": "src"}}}));
}

// ---------------------------------------------------------------------------
// 2. Catalog enforcement
// ---------------------------------------------------------------------------

#[tokio::test]
async fn not_in_catalog_error_json_is_exact() {
    let (a, a_calls) = echo();
    let (b, b_calls) = echo();
    let ready = Fixture::new().tool(item("a__x"), a).tool(item("b__y"), b).build();
    let out = ready.json("x__y", json!({})).await;
    assert_eq!(
        out,
        json!({"status": "error", "error": {
            "message": "Tool 'x__y' is not available in the current Tool Catalog.",
            "name": "ToolNotInCatalogError",
            "code": "E_TOOL_NOT_IN_CATALOG",
            "suggestion": format!("Did you mean 'b__y'? {NOT_IN_CATALOG_HINT} Available tools: a__x, b__y."),
            "helpUrl": format!("{ERRORS}#e_tool_not_in_catalog"),
        }})
    );
    assert_eq!(a_calls.load(Ordering::SeqCst) + b_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn not_in_catalog_with_an_empty_catalog_says_so() {
    let ready = Fixture::new().build();
    let result = ready.call("x__y", json!({})).await;
    assert_eq!(result.error_code(), Some("E_TOOL_NOT_IN_CATALOG"));
    let suggestion = result.error.as_ref().and_then(|e| e.suggestion.clone());
    assert_eq!(suggestion, Some(format!("{NOT_IN_CATALOG_HINT} The current catalog is empty.")));
}

#[tokio::test]
async fn not_in_catalog_suggestion_lists_at_most_twenty_names() {
    let mut fixture = Fixture::new();
    let names: Vec<String> = (0..25).map(|i| format!("t{i:02}__run")).collect();
    for name in &names {
        fixture = fixture.offered(item(name));
    }
    let result = fixture.build().call("x__y", json!({})).await;
    let suggestion = result.error.as_ref().and_then(|e| e.suggestion.clone()).unwrap_or_default();
    assert_eq!(suggestion, format!("{NOT_IN_CATALOG_HINT} Available tools: {} (+5 more).", names[..20].join(", ")));
}

#[tokio::test]
async fn registered_tool_outside_the_catalog_is_refused_by_default() {
    let (handler, calls) = echo();
    let ready = Fixture::new().registered(item("hidden__run"), handler).offered(item("shown__run")).build();
    let result = ready.call("hidden__run", json!({})).await;
    assert_eq!(result.status, ToolStatus::Error);
    assert_eq!(result.error_code(), Some("E_TOOL_NOT_IN_CATALOG"));
    assert_eq!(result.error.as_ref().and_then(|e| e.name.as_deref()), Some("ToolNotInCatalogError"));
    assert_eq!(error_message(&result), "Tool 'hidden__run' is not available in the current Tool Catalog.");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "a refused call must not reach the handler");
    assert!(!ready.executor.policy().allow_registry_calls);
}

#[tokio::test]
async fn a_refused_call_is_not_truncated_with_the_registered_tools_limit() {
    let (handler, _calls) = echo();
    let ready = Fixture::new().registered(item("hidden__run").with_error_message_limit(10), handler).build();
    let result = ready.call("hidden__run", json!({})).await;
    assert_eq!(error_message(&result), "Tool 'hidden__run' is not available in the current Tool Catalog.");
}

#[tokio::test]
async fn registered_tool_outside_the_catalog_runs_when_registry_calls_are_allowed() {
    let (handler, calls) = echo();
    let ready = Fixture::new()
        .registered(item("hidden__run"), handler)
        .policy(ExecutorPolicy { allow_registry_calls: true, call_timeout: None })
        .build();
    let out = ready.json("hidden__run", json!({"k": "v"})).await;
    assert_eq!(out, json!({"status": "ok", "output": {"args": {"k": "v"}}}));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Unknown names are still refused under the bypass policy.
    let result = ready.call("nobody__home", json!({})).await;
    assert_eq!(result.error_code(), Some("E_TOOL_NOT_IN_CATALOG"));
}

#[tokio::test]
async fn registry_calls_still_validate_against_the_registered_schema() {
    let (handler, calls) = echo();
    let ready = Fixture::new()
        .registered(bash_exec(), handler)
        .policy(ExecutorPolicy { allow_registry_calls: true, call_timeout: None })
        .build();
    let result = ready.call("bash__exec", json!({})).await;
    assert_eq!(result.error_code(), Some("E_TOOL_INVALID_ARGS"));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------
// 3. Argument validation
// ---------------------------------------------------------------------------

#[tokio::test]
async fn invalid_args_error_json_is_exact_and_the_handler_is_not_called() {
    let (handler, calls) = echo();
    let ready = Fixture::new().tool(bash_exec(), handler).build();
    let out = ready.json("bash__exec", json!({})).await;
    assert_eq!(
        out,
        json!({"status": "error", "error": {
            "message": "Invalid arguments for tool 'bash__exec': args.command: required property is missing",
            "name": "ToolInputValidationError",
            "code": "E_TOOL_INVALID_ARGS",
            "suggestion": "Call 'bash__exec' again with arguments that match its parameters schema: \
                           required=[command], allowed=[command, cwd].",
            "helpUrl": format!("{ERRORS}#e_tool_invalid_args"),
        }})
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn invalid_args_messages_name_each_problem() {
    let (handler, calls) = echo();
    let ready = Fixture::new().tool(bash_exec(), handler).build();

    let result = ready.call("bash__exec", json!({"command": 3})).await;
    assert_eq!(
        error_message(&result),
        "Invalid arguments for tool 'bash__exec': args.command: expected string but got integer 3"
    );

    let result = ready.call("bash__exec", json!({"command": "ls", "extra": true})).await;
    assert_eq!(error_message(&result), "Invalid arguments for tool 'bash__exec': args.extra: unexpected property");

    let result = ready.call("bash__exec", json!({"extra": true})).await;
    let message = error_message(&result);
    assert!(message.starts_with("Invalid arguments for tool 'bash__exec': "), "{message}");
    assert!(message.contains("args.command: required property is missing"), "{message}");
    assert!(message.contains("args.extra: unexpected property"), "{message}");
    assert_eq!(message.matches("; ").count(), 1, "two issues joined by '; ': {message}");

    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn invalid_args_list_at_most_five_issues() {
    let (handler, calls) = echo();
    let strict =
        item("t__x").with_parameters(json!({"type": "object", "properties": {}, "additionalProperties": false}));
    let ready = Fixture::new().tool(strict, handler).build();
    let result = ready.call("t__x", json!({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7})).await;
    let message = error_message(&result);
    assert_eq!(message.matches("unexpected property").count(), 5, "{message}");
    assert!(message.ends_with("; +2 more issues"), "{message}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_invalid_schema_is_an_error_result_and_the_handler_is_not_called() {
    let (handler, calls) = echo();
    let broken = item("t__x").with_parameters(json!({"type": 5}));
    let ready = Fixture::new().tool(broken, handler).build();
    let result = ready.call("t__x", json!({})).await;
    assert_eq!(result.status, ToolStatus::Error);
    assert_eq!(result.error_code(), Some("E_TOOL_SCHEMA_INVALID"));
    assert_eq!(result.error.as_ref().and_then(|e| e.name.as_deref()), Some("ToolSchemaError"));
    assert!(error_message(&result).starts_with("Tool 't__x' has an invalid parameters schema: "));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------
// 4. Offered but not registered
// ---------------------------------------------------------------------------

#[tokio::test]
async fn offered_but_not_registered_is_tool_not_found() {
    let ready = Fixture::new().offered(item("ghost__run")).build();
    let result = ready.call("ghost__run", json!({})).await;
    let Some(error) = &result.error else { panic!("expected an error, got {result:?}") };
    assert_eq!(result.status, ToolStatus::Error);
    assert_eq!(error.code.as_deref(), Some("E_TOOL_NOT_FOUND"));
    assert_eq!(error.name.as_deref(), Some("ToolNotFoundError"));
    assert_eq!(error.message, "Tool 'ghost__run' is not registered.");
    assert!(error.suggestion.as_deref().is_some_and(|s| !s.is_empty()));
    assert_eq!(error.help_url, Some(format!("{ERRORS}#e_tool_not_found")));
}

#[tokio::test]
async fn validation_comes_before_the_handler_lookup() {
    let ready = Fixture::new().offered(bash_exec()).build();
    let result = ready.call("bash__exec", json!({})).await;
    assert_eq!(result.error_code(), Some("E_TOOL_INVALID_ARGS"));
    let result = ready.call("bash__exec", json!({"command": "ls"})).await;
    assert_eq!(result.error_code(), Some("E_TOOL_NOT_FOUND"));
}

// ---------------------------------------------------------------------------
// 5. Handler failures
// ---------------------------------------------------------------------------

#[tokio::test]
async fn handler_failure_keeps_code_name_suggestion_and_help_url() {
    let failure = ToolFailure::with_code("path escapes the workdir", "E_PATH")
        .named("PathError")
        .suggest("use a relative path")
        .help_url("https://docs.goondan.ai/errors/E_PATH");
    let ready = Fixture::new().tool(item("fs__read"), failing(failure)).build();
    let out = ready.json("fs__read", json!({})).await;
    assert_eq!(
        out,
        json!({"status": "error", "error": {
            "message": "path escapes the workdir",
            "name": "PathError",
            "code": "E_PATH",
            "suggestion": "use a relative path",
            "helpUrl": "https://docs.goondan.ai/errors/E_PATH",
        }})
    );
}

/// The executor links an error to the help entry of its code, whatever
/// made it (here a handler with a code of the runtime's); a code of the
/// tool's own has no entry, so no link.
#[tokio::test]
async fn error_results_link_to_the_help_entry_of_known_codes_only() {
    let ready = Fixture::new()
        .tool(item("fs__read"), failing(ToolFailure::with_code("no such file", "E_FILE_NOT_FOUND")))
        .tool(item("kit__run"), failing(ToolFailure::with_code("kit broke", "E_KIT_BROKEN")))
        .build();
    let found = ready.call("fs__read", json!({})).await;
    assert_eq!(found.error.and_then(|e| e.help_url), Some(format!("{ERRORS}#e_file_not_found")));
    let own = ready.call("kit__run", json!({})).await;
    assert_eq!(own.error_code(), Some("E_KIT_BROKEN"));
    assert_eq!(own.error.and_then(|e| e.help_url), None);
}

#[tokio::test]
async fn handler_failure_defaults_to_e_tool_and_error() {
    let ready = Fixture::new()
        .tool(item("plain__fail"), failing(ToolFailure::new("request failed")))
        .tool(item("empty__fail"), failing(ToolFailure::new("")))
        .tool(item("blank__fail"), failing(ToolFailure::new("  \n ")))
        .build();
    assert_eq!(
        ready.json("plain__fail", json!({})).await,
        json!({"status": "error", "error": {"message": "request failed", "name": "Error", "code": "E_TOOL",
            "helpUrl": format!("{ERRORS}#e_tool")}})
    );
    assert_eq!(
        ready.json("empty__fail", json!({})).await,
        json!({"status": "error", "error": {"message": "Unknown tool execution error", "name": "Error", "code": "E_TOOL",
            "helpUrl": format!("{ERRORS}#e_tool")}})
    );
    let result = ready.call("blank__fail", json!({})).await;
    assert_eq!(error_message(&result), "Unknown tool execution error");
}

// ---------------------------------------------------------------------------
// 6. Panics
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_panicking_handler_becomes_a_panic_error_and_the_executor_keeps_working() {
    let (ok, ok_calls) = echo();
    let ready = Fixture::new()
        .tool(item("boom__now"), sync_handler(|_, args| panic!("kaboom with {} args", args.len())))
        .tool(item("fine__run"), ok)
        .build();

    let result = ready.call("boom__now", json!({"a": 1})).await;
    let Some(error) = &result.error else { panic!("expected an error, got {result:?}") };
    assert_eq!(result.status, ToolStatus::Error);
    assert_eq!(error.name.as_deref(), Some("PanicError"));
    assert_eq!(error.code.as_deref(), Some("E_TOOL"));
    assert_eq!(error.message, "Tool 'boom__now' panicked: kaboom with 1 args");
    assert!(error.message.contains("kaboom"));

    // The same executor still runs calls, including the same tool again.
    assert_eq!(ready.json("fine__run", json!({})).await, json!({"status": "ok", "output": {"args": {}}}));
    assert_eq!(ok_calls.load(Ordering::SeqCst), 1);
    let again = ready.call("boom__now", json!({})).await;
    assert_eq!(error_message(&again), "Tool 'boom__now' panicked: kaboom with 0 args");
}

#[tokio::test]
async fn a_handler_panicking_after_an_await_becomes_a_panic_error() {
    let ready = Fixture::new().tool(item("late__boom"), Arc::new(PanicsAfterAwait)).build();
    let result = ready.call("late__boom", json!({})).await;
    assert_eq!(result.error.as_ref().and_then(|e| e.name.as_deref()), Some("PanicError"));
    assert_eq!(error_message(&result), "Tool 'late__boom' panicked: async kaboom");
}

#[tokio::test]
async fn a_panic_without_a_message_is_still_reported() {
    let ready = Fixture::new().tool(item("odd__boom"), sync_handler(|_, _| std::panic::panic_any(42_u32))).build();
    let result = ready.call("odd__boom", json!({})).await;
    assert_eq!(error_message(&result), "Tool 'odd__boom' panicked: no panic message");
}

/// Middleware wrapping a call whose handler panics: the panic is a result
/// like any other error, so the layer's post phase must see it.
async fn middleware_post_phase_sees_panic_result_of(handler: Arc<dyn ToolHandler>) {
    let log: Log = Arc::default();
    let seen = Arc::clone(&log);
    let observer = from_fn(move |ctx: &mut ToolCallContext, next| {
        let seen = Arc::clone(&seen);
        Box::pin(async move {
            let mut result: ToolResult = next.run(ctx).await;
            let name = result.error.as_ref().and_then(|e| e.name.clone()).unwrap_or_default();
            push(&seen, format!("post saw {name}"));
            if let Some(error) = result.error.as_mut() {
                error.suggestion = Some("observed by middleware".into());
            }
            result
        })
    });
    let ready = Fixture::new().tool(item("boom__now"), handler).build().layer("observer", 0, observer);
    let result = ready.call("boom__now", json!({})).await;
    assert_eq!(result.error.as_ref().and_then(|e| e.name.as_deref()), Some("PanicError"));
    assert_eq!(entries(&log), ["post saw PanicError"]);
    assert_eq!(result.error.as_ref().and_then(|e| e.suggestion.as_deref()), Some("observed by middleware"));
}

#[tokio::test]
async fn middleware_post_phase_sees_the_panic_result_of_an_async_handler() {
    middleware_post_phase_sees_panic_result_of(Arc::new(PanicsAfterAwait)).await;
}

#[tokio::test]
async fn middleware_post_phase_sees_the_panic_result_of_a_sync_handler() {
    middleware_post_phase_sees_panic_result_of(sync_handler(|_, _| panic!("kaboom"))).await;
}

#[tokio::test]
async fn a_panicking_middleware_layer_becomes_a_panic_error() {
    let (handler, calls) = echo();
    let faulty = from_fn(|_ctx: &mut ToolCallContext, _next| Box::pin(async { panic!("layer broke") }));
    let ready = Fixture::new().tool(item("fine__run"), handler).build().layer("faulty", 0, faulty);
    let result = ready.call("fine__run", json!({})).await;
    assert_eq!(result.error.as_ref().and_then(|e| e.name.as_deref()), Some("PanicError"));
    assert_eq!(error_message(&result), "A toolCall middleware layer panicked while handling 'fine__run': layer broke");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // And the executor still answers the next call the same way.
    let again = ready.call("fine__run", json!({})).await;
    assert_eq!(again.status, ToolStatus::Error);
}

// ---------------------------------------------------------------------------
// 7. Deadline
// ---------------------------------------------------------------------------

fn deadline(ms: u64) -> ExecutorPolicy {
    ExecutorPolicy { allow_registry_calls: false, call_timeout: Some(Duration::from_millis(ms)) }
}

#[tokio::test(start_paused = true)]
async fn a_slow_handler_hits_the_deadline() {
    let (handler, finished) = sleepy(Duration::from_secs(3600));
    let ready = Fixture::new().tool(item("slow__run"), handler).policy(deadline(100)).build();
    let started = tokio::time::Instant::now();
    let out = ready.json("slow__run", json!({})).await;
    assert_eq!(started.elapsed(), Duration::from_millis(100), "the deadline fires at exactly 100 ms");
    assert_eq!(
        out,
        json!({"status": "error", "error": {
            "message": "Tool 'slow__run' did not finish within 100 ms and was cancelled.",
            "name": "ToolTimeoutError",
            "code": "E_TOOL_TIMEOUT",
            "suggestion": "Retry with a smaller task, or raise the tool call timeout if the work needs longer.",
            "helpUrl": format!("{ERRORS}#e_tool_timeout"),
        }})
    );
    // The handler was cancelled, not left running.
    tokio::time::sleep(Duration::from_secs(7200)).await;
    assert_eq!(finished.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_fast_handler_under_a_deadline_is_ok() {
    let (handler, finished) = sleepy(Duration::from_millis(10));
    let ready = Fixture::new().tool(item("quick__run"), handler).policy(deadline(100)).build();
    assert_eq!(ready.json("quick__run", json!({})).await, json!({"status": "ok", "output": "done"}));
    assert_eq!(finished.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn without_a_deadline_a_slow_handler_finishes() {
    let (handler, finished) = sleepy(Duration::from_secs(3600));
    let ready = Fixture::new().tool(item("slow__run"), handler).build();
    assert_eq!(ready.executor.policy().call_timeout, None);
    assert_eq!(ready.json("slow__run", json!({})).await, json!({"status": "ok", "output": "done"}));
    assert_eq!(finished.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_tool_call_layer_that_never_returns_is_held_to_the_deadline() {
    let (handler, finished) = sleepy(Duration::from_millis(10));
    let stuck = from_fn(|_ctx: &mut ToolCallContext, _next| {
        Box::pin(async {
            std::future::pending::<()>().await;
            ToolResult::ok(json!("never"))
        })
    });
    let ready = Fixture::new().tool(item("quick__run"), handler).policy(deadline(100)).build().layer("stuck", 0, stuck);
    let started = tokio::time::Instant::now();
    let out = ready.json("quick__run", json!({})).await;
    assert_eq!(started.elapsed(), Duration::from_millis(200), "the deadline and its slack");
    assert_eq!(out["error"]["code"], "E_TOOL_TIMEOUT", "{out}");
    assert_eq!(
        out["error"]["message"],
        "Tool 'quick__run': its toolCall middleware did not finish within the call's 100 ms and the call was cancelled."
    );
    assert_eq!(finished.load(Ordering::SeqCst), 0, "the layer never called the handler");
}

#[tokio::test(start_paused = true)]
async fn a_slow_handler_under_layers_still_reports_its_own_timeout() {
    let (handler, _) = sleepy(Duration::from_secs(3600));
    let passing = from_fn(|ctx: &mut ToolCallContext, next| Box::pin(async move { next.run(ctx).await }));
    let ready = Fixture::new().tool(item("slow__run"), handler).policy(deadline(100)).build().layer("pass", 0, passing);
    let out = ready.json("slow__run", json!({})).await;
    assert_eq!(out["error"]["message"], "Tool 'slow__run' did not finish within 100 ms and was cancelled.", "{out}");
}

// ---------------------------------------------------------------------------
// 8. Error-message truncation
// ---------------------------------------------------------------------------

#[tokio::test]
async fn truncation_uses_each_tools_own_limit() {
    let long = digits(2000);
    let ready = Fixture::new()
        .tool(item("small__fail").with_error_message_limit(50), failing(ToolFailure::new(long.clone())))
        .tool(item("large__fail").with_error_message_limit(1200), failing(ToolFailure::new(long.clone())))
        .tool(item("default__fail"), failing(ToolFailure::new(long.clone())))
        .build();

    for (tool, limit) in [("small__fail", 50), ("large__fail", 1200), ("default__fail", 1000)] {
        let result = ready.call(tool, json!({})).await;
        let message = error_message(&result);
        assert_eq!(message.chars().count(), limit, "{tool}");
        assert!(message.ends_with(SUFFIX), "{tool}: {message}");
        assert_eq!(message, format!("{}{SUFFIX}", &long[..limit - SUFFIX.len()]), "{tool}");
        // Only the message is cut; the other fields stay.
        assert_eq!(result.error_code(), Some("E_TOOL"));
    }
}

#[tokio::test]
async fn a_tiny_limit_keeps_exactly_the_first_characters() {
    let long = digits(2000);
    let ready = Fixture::new()
        .tool(item("tiny__fail").with_error_message_limit(10), failing(ToolFailure::new(long.clone())))
        .tool(item("edge__fail").with_error_message_limit(15), failing(ToolFailure::new(long.clone())))
        .tool(item("sixteen__fail").with_error_message_limit(16), failing(ToolFailure::new(long)))
        .build();
    assert_eq!(error_message(&ready.call("tiny__fail", json!({})).await), "0123456789");
    assert_eq!(error_message(&ready.call("edge__fail", json!({})).await), "012345678901234");
    assert_eq!(error_message(&ready.call("sixteen__fail", json!({})).await), format!("0{SUFFIX}"));
}

#[tokio::test]
async fn a_message_within_the_limit_is_unchanged() {
    let exact = digits(50);
    let ready = Fixture::new()
        .tool(item("exact__fail").with_error_message_limit(50), failing(ToolFailure::new(exact.clone())))
        .build();
    assert_eq!(error_message(&ready.call("exact__fail", json!({})).await), exact);
}

#[tokio::test]
async fn truncation_counts_characters_not_bytes() {
    let hangul = "가".repeat(40);
    let ready = Fixture::new()
        .tool(item("ko__fail").with_error_message_limit(40), failing(ToolFailure::new(hangul.clone())))
        .tool(item("ko__cut").with_error_message_limit(20), failing(ToolFailure::new(hangul)))
        .build();
    assert_eq!(error_message(&ready.call("ko__fail", json!({})).await), "가".repeat(40));
    assert_eq!(error_message(&ready.call("ko__cut", json!({})).await), format!("{}{SUFFIX}", "가".repeat(5)));
}

#[tokio::test]
async fn truncation_leaves_the_suggestion_alone() {
    let suggestion = digits(300);
    let failure = ToolFailure::new(digits(300)).suggest(suggestion.clone());
    let ready = Fixture::new().tool(item("t__fail").with_error_message_limit(20), failing(failure)).build();
    let result = ready.call("t__fail", json!({})).await;
    assert_eq!(error_message(&result).chars().count(), 20);
    assert_eq!(result.error.as_ref().and_then(|e| e.suggestion.clone()), Some(suggestion));
}

#[tokio::test]
async fn truncation_applies_to_an_error_from_a_middleware_layer() {
    let (handler, calls) = echo();
    let long = digits(500);
    let refusal = ToolResult::error(goondan_core::ToolError::new("E_POLICY", "PolicyError", long.clone()));
    let ready = Fixture::new().tool(item("guarded__run").with_error_message_limit(40), handler).build().layer(
        "guard",
        0,
        short_circuit(refusal),
    );
    let result = ready.call("guarded__run", json!({})).await;
    assert_eq!(error_message(&result), format!("{}{SUFFIX}", &long[..25]));
    assert_eq!(error_message(&result).chars().count(), 40);
    assert_eq!(result.error_code(), Some("E_POLICY"));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn truncation_applies_to_validation_errors_too() {
    let (handler, _) = echo();
    let ready = Fixture::new().tool(bash_exec().with_error_message_limit(30), handler).build();
    let result = ready.call("bash__exec", json!({})).await;
    assert_eq!(error_message(&result), format!("Invalid argumen{SUFFIX}"));
}

// ---------------------------------------------------------------------------
// 9. toolCall middleware
// ---------------------------------------------------------------------------

#[tokio::test]
async fn middleware_runs_by_priority_and_ties_keep_registration_order() {
    let log: Log = Arc::default();
    let core_log = Arc::clone(&log);
    let handler = sync_handler(move |_, _| {
        push(&core_log, "core");
        Ok(ToolOutput::Value(json!("done")))
    });
    let mut ready = Fixture::new().tool(item("t__run"), handler).build();
    for (label, priority) in [("A", 10), ("B", 5), ("C", 10)] {
        ready = ready.layer(label, priority, Arc::new(Recorder { label, log: Arc::clone(&log) }));
    }
    let result = ready.call("t__run", json!({})).await;
    assert_eq!(result.status, ToolStatus::Ok);
    assert_eq!(entries(&log), ["B:pre", "A:pre", "C:pre", "core", "C:post", "A:post", "B:post"]);
}

#[tokio::test]
async fn middleware_sees_the_call_and_its_step() {
    let log: Log = Arc::default();
    let seen = Arc::clone(&log);
    let inspector = from_fn(move |ctx: &mut ToolCallContext, next| {
        push(
            &seen,
            format!(
                "{} {} {} {} {:?}",
                ctx.tool_name(),
                ctx.tool_call_id(),
                ctx.scope().agent_name,
                ctx.scope().step_id,
                ctx.catalog().names().collect::<Vec<_>>()
            ),
        );
        next.run(ctx)
    });
    let (handler, _) = echo();
    let ready = Fixture::new().tool(item("t__run"), handler).offered(item("u__run")).build().layer("i", 0, inspector);
    let _ = ready.call("t__run", json!({})).await;
    assert_eq!(entries(&log), [format!("t__run {CALL_ID} {AGENT} {STEP} [\"t__run\", \"u__run\"]")]);
}

#[tokio::test]
async fn changed_args_reach_the_handler() {
    let rewrite = from_fn(|ctx: &mut ToolCallContext, next| {
        ctx.args.insert("command".into(), json!("ls -la"));
        ctx.args.remove("cwd");
        next.run(ctx)
    });
    let (handler, calls) = echo();
    let ready = Fixture::new().tool(bash_exec(), handler).build().layer("rewrite", 0, rewrite);
    let out = ready.json("bash__exec", json!({"command": "rm -rf /", "cwd": "/"})).await;
    assert_eq!(out, json!({"status": "ok", "output": {"args": {"command": "ls -la"}}}));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn validation_uses_the_args_as_changed_by_middleware() {
    let inject = from_fn(|ctx: &mut ToolCallContext, next| {
        ctx.args.entry("command").or_insert_with(|| json!("pwd"));
        next.run(ctx)
    });
    let (handler, calls) = echo();
    let ready = Fixture::new().tool(bash_exec(), handler).build().layer("inject", 0, inject);
    // Missing `command` would be invalid, but the layer supplies it.
    let out = ready.json("bash__exec", json!({})).await;
    assert_eq!(out, json!({"status": "ok", "output": {"args": {"command": "pwd"}}}));
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // And the other way round: a layer can make a valid call invalid.
    let spoil = from_fn(|ctx: &mut ToolCallContext, next| {
        ctx.args.insert("bogus".into(), json!(1));
        next.run(ctx)
    });
    let (handler, calls) = echo();
    let ready = Fixture::new().tool(bash_exec(), handler).build().layer("spoil", 0, spoil);
    let result = ready.call("bash__exec", json!({"command": "ls"})).await;
    assert_eq!(error_message(&result), "Invalid arguments for tool 'bash__exec': args.bogus: unexpected property");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn metadata_set_by_an_outer_layer_is_visible_inside() {
    let log: Log = Arc::default();
    let outer = from_fn(|ctx: &mut ToolCallContext, next| {
        ctx.metadata.insert("requestedBy".into(), json!("outer"));
        next.run(ctx)
    });
    let seen = Arc::clone(&log);
    let inner = from_fn(move |ctx: &mut ToolCallContext, next| {
        push(&seen, ctx.metadata.get("requestedBy").map_or_else(|| "missing".to_owned(), ToString::to_string));
        next.run(ctx)
    });
    let (handler, _) = echo();
    // Registered inner first: priority, not registration order, decides.
    let ready = Fixture::new().tool(item("t__run"), handler).build().layer("inner", 5, inner).layer("outer", 1, outer);
    let result = ready.call("t__run", json!({})).await;
    assert_eq!(result.status, ToolStatus::Ok);
    assert_eq!(entries(&log), ["\"outer\""]);
}

#[tokio::test]
async fn short_circuit_skips_inner_layers_and_the_handler() {
    let log: Log = Arc::default();
    let (handler, calls) = echo();
    let ready = Fixture::new()
        .tool(item("t__run"), handler)
        .build()
        .layer("outer", 0, Arc::new(Recorder { label: "outer", log: Arc::clone(&log) }))
        .layer("cache", 1, short_circuit(ToolResult::ok(json!({"cached": true}))))
        .layer("inner", 2, Arc::new(Recorder { label: "inner", log: Arc::clone(&log) }));
    let out = ready.json("t__run", json!({})).await;
    assert_eq!(out, json!({"status": "ok", "output": {"cached": true}}));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(entries(&log), ["outer:pre", "outer:post"]);
}

#[tokio::test]
async fn a_layer_can_rewrite_the_result_on_the_way_out() {
    let wrap = from_fn(|ctx: &mut ToolCallContext, next| {
        Box::pin(async move {
            let result: ToolResult = next.run(ctx).await;
            match result.output {
                Some(output) if result.status == ToolStatus::Ok => ToolResult::ok(json!({"wrapped": output})),
                _ => result,
            }
        })
    });
    let recover = from_fn(|ctx: &mut ToolCallContext, next| {
        Box::pin(async move {
            let result: ToolResult = next.run(ctx).await;
            if result.error_code() == Some("E_FLAKY") { ToolResult::ok(json!("recovered")) } else { result }
        })
    });
    let (handler, _) = echo();
    let ready = Fixture::new()
        .tool(item("t__run"), handler)
        .tool(item("flaky__run"), failing(ToolFailure::with_code("flaked", "E_FLAKY")))
        .build()
        .layer("wrap", 0, wrap)
        .layer("recover", 1, recover);
    assert_eq!(
        ready.json("t__run", json!({"x": 1})).await,
        json!({"status": "ok", "output": {"wrapped": {"args": {"x": 1}}}})
    );
    assert_eq!(ready.json("flaky__run", json!({})).await, json!({"status": "ok", "output": {"wrapped": "recovered"}}));
}

// ---------------------------------------------------------------------------
// 10. Pending results
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_pending_output_becomes_a_pending_result() {
    let ready = Fixture::new()
        .tool(
            item("build__start"),
            sync_handler(|_, _| {
                Ok(ToolOutput::Pending { handle: "job-7".into(), output: Some(json!({"progress": 0})) })
            }),
        )
        .tool(
            item("build__bare"),
            sync_handler(|_, _| Ok(ToolOutput::Pending { handle: "job-8".into(), output: None })),
        )
        .build();
    let result = ready.call("build__start", json!({})).await;
    assert_eq!(result.status, ToolStatus::Pending);
    assert_eq!(to_json(&result), json!({"status": "pending", "handle": "job-7", "output": {"progress": 0}}));
    assert_eq!(ready.json("build__bare", json!({})).await, json!({"status": "pending", "handle": "job-8"}));
}

#[tokio::test]
async fn the_async_json_convention_becomes_a_pending_result() {
    let ready = Fixture::new()
        .tool(
            item("job__start"),
            sync_handler(|_, _| Ok(ToolOutput::Value(json!({"__async": true, "handle": "h1", "message": "m"})))),
        )
        .tool(item("job__numeric"), sync_handler(|_, _| Ok(ToolOutput::Value(json!({"__async": true, "handle": 3})))))
        .tool(item("job__falsy"), sync_handler(|_, _| Ok(ToolOutput::Value(json!({"__async": false, "handle": "h2"})))))
        .build();
    assert_eq!(
        ready.json("job__start", json!({})).await,
        json!({"status": "pending", "handle": "h1", "output": {"message": "m"}})
    );
    // Without a string handle, or with `__async` not true, it is an ordinary value.
    assert_eq!(
        ready.json("job__numeric", json!({})).await,
        json!({"status": "ok", "output": {"__async": true, "handle": 3}})
    );
    assert_eq!(
        ready.json("job__falsy", json!({})).await,
        json!({"status": "ok", "output": {"__async": false, "handle": "h2"}})
    );
}

// ---------------------------------------------------------------------------
// 11. ToolContext
// ---------------------------------------------------------------------------

#[tokio::test]
async fn the_handler_sees_the_call_scope() {
    let reporter = sync_handler(|ctx, _| {
        Ok(ToolOutput::Value(json!({
            "agent": ctx.agent_name(),
            "instance": ctx.instance_key(),
            "turn": ctx.turn_id(),
            "callId": ctx.tool_call_id(),
            "tool": ctx.tool_name(),
            "workdir": ctx.workdir().to_string_lossy(),
            "messageId": ctx.message().id,
            "message": serde_json::to_value(&ctx.message().data).unwrap_or_default(),
            "hasRuntime": ctx.runtime().is_some(),
            "sameScope": ctx.scope().step_span_id.as_ref() == STEP_SPAN_ID,
        })))
    });
    let ready = Fixture::new().tool(item("who__ami"), reporter).offered(item("other__tool")).build();
    let first = ToolCall { id: "call-A".into(), name: "other__tool".into(), args: obj(json!({"z": 0})) };
    let mine = ToolCall { id: "call-B".into(), name: "who__ami".into(), args: obj(json!({"q": 1})) };
    let step = scope_holding(vec![first, mine.clone()]);
    let result = ready.executor.execute(mine, &step, &ready.catalog).await;
    assert_eq!(
        to_json(&result),
        json!({"status": "ok", "output": {
            "agent": AGENT,
            "instance": INSTANCE,
            "turn": TURN,
            "callId": "call-B",
            "tool": "who__ami",
            "workdir": WORKDIR,
            "messageId": step.message.id,
            "message": {"role": "assistant", "toolCalls": [
                {"id": "call-A", "name": "other__tool", "args": {"z": 0}},
                {"id": "call-B", "name": "who__ami", "args": {"q": 1}},
            ]},
            "hasRuntime": false,
            "sameScope": true,
        }})
    );
}

// ---------------------------------------------------------------------------
// 12. Events
// ---------------------------------------------------------------------------

fn is_span_id(value: &JsonValue) -> bool {
    value.as_str().is_some_and(|s| s.len() == 16 && s.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)))
}

/// Checks the fields every `tool.*` event of one call carries.
fn assert_common(event: &JsonValue, kind: &str, tool: &str, call_id: &str) {
    assert_eq!(event["type"], kind, "{event}");
    assert_eq!(event["traceId"], TRACE_ID, "{event}");
    assert_eq!(event["parentSpanId"], STEP_SPAN_ID, "{event}");
    assert!(is_span_id(&event["spanId"]), "{event}");
    assert_eq!(event["agentName"], AGENT, "{event}");
    assert_eq!(event["instanceKey"], INSTANCE, "{event}");
    assert_eq!(event["turnId"], TURN, "{event}");
    assert_eq!(event["stepId"], STEP, "{event}");
    assert_eq!(event["toolName"], tool, "{event}");
    assert_eq!(event["toolCallId"], call_id, "{event}");
    assert!(event["timestamp"].is_u64(), "{event}");
}

fn two_events(sink: &MemoryEventSink) -> (JsonValue, JsonValue) {
    match <[JsonValue; 2]>::try_from(sink.events()) {
        Ok([called, done]) => (called, done),
        Err(events) => panic!("expected exactly 2 events, got {}: {events:?}", events.len()),
    }
}

#[tokio::test]
async fn a_successful_call_emits_called_then_completed() {
    let sink = Arc::new(MemoryEventSink::new());
    let (handler, _) = echo();
    let ready = Fixture::new().tool(item("t__run"), handler).events(&sink).build();
    let _ = ready.call("t__run", json!({})).await;
    let (called, done) = two_events(&sink);

    assert_common(&called, "tool.called", "t__run", CALL_ID);
    assert!(called.get("status").is_none(), "{called}");
    assert!(called.get("duration").is_none(), "{called}");
    assert!(called.get("errorCode").is_none(), "{called}");

    assert_common(&done, "tool.completed", "t__run", CALL_ID);
    assert_eq!(done["status"], "ok");
    assert!(done["duration"].as_f64().is_some_and(|d| d >= 0.0), "{done}");
    assert!(done.get("errorCode").is_none(), "{done}");
    assert_eq!(called["spanId"], done["spanId"], "one span per call");
}

#[tokio::test]
async fn a_failed_call_emits_called_then_failed_with_the_error_code() {
    let sink = Arc::new(MemoryEventSink::new());
    let ready = Fixture::new().events(&sink).build();
    let _ = ready.call("x__y", json!({})).await;
    let (called, failed) = two_events(&sink);
    assert_common(&called, "tool.called", "x__y", CALL_ID);
    assert_common(&failed, "tool.failed", "x__y", CALL_ID);
    assert_eq!(failed["status"], "error");
    assert_eq!(failed["errorCode"], "E_TOOL_NOT_IN_CATALOG");
    assert!(failed["duration"].is_f64(), "{failed}");
    assert_eq!(called["spanId"], failed["spanId"]);
}

#[tokio::test]
async fn handler_failures_and_panics_emit_tool_failed() {
    let sink = Arc::new(MemoryEventSink::new());
    let ready = Fixture::new()
        .tool(item("fs__read"), failing(ToolFailure::with_code("nope", "E_PATH")))
        .tool(item("boom__now"), sync_handler(|_, _| panic!("kaboom")))
        .events(&sink)
        .build();
    let _ = ready.call("fs__read", json!({})).await;
    let _ = ready.call("boom__now", json!({})).await;
    let events = sink.events();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds, ["tool.called", "tool.failed", "tool.called", "tool.failed"]);
    assert_eq!(events[1]["errorCode"], "E_PATH");
    assert_eq!(events[3]["errorCode"], "E_TOOL");
    assert_eq!(events[3]["toolName"], "boom__now");
    assert_ne!(events[0]["spanId"], events[2]["spanId"], "each call has its own span");
}

#[tokio::test]
async fn a_pending_call_emits_tool_completed_with_status_pending() {
    let sink = Arc::new(MemoryEventSink::new());
    let ready = Fixture::new()
        .tool(item("job__start"), sync_handler(|_, _| Ok(ToolOutput::Pending { handle: "h".into(), output: None })))
        .events(&sink)
        .build();
    let _ = ready.call("job__start", json!({})).await;
    let (_, done) = two_events(&sink);
    assert_eq!(done["type"], "tool.completed");
    assert_eq!(done["status"], "pending");
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_call_emits_tool_failed() {
    let sink = Arc::new(MemoryEventSink::new());
    let (handler, _) = sleepy(Duration::from_secs(60));
    let ready = Fixture::new().tool(item("slow__run"), handler).policy(deadline(5)).events(&sink).build();
    let _ = ready.call("slow__run", json!({})).await;
    let (_, failed) = two_events(&sink);
    assert_eq!(failed["type"], "tool.failed");
    assert_eq!(failed["errorCode"], "E_TOOL_TIMEOUT");
}

#[tokio::test]
async fn a_short_circuited_call_still_emits_both_events() {
    let sink = Arc::new(MemoryEventSink::new());
    let (handler, _) = echo();
    let ready = Fixture::new().tool(item("t__run"), handler).events(&sink).build().layer(
        "cache",
        0,
        short_circuit(ToolResult::ok(json!(1))),
    );
    let _ = ready.call("t__run", json!({})).await;
    let (called, done) = two_events(&sink);
    assert_eq!(called["type"], "tool.called");
    assert_eq!(done["type"], "tool.completed");
    assert_eq!(done["status"], "ok");
}

// ---------------------------------------------------------------------------
// 13. Registry and dynamic tools
// ---------------------------------------------------------------------------

#[test]
fn registering_a_name_twice_is_refused() {
    let registry = ToolRegistry::new();
    let (first, _) = echo();
    let (second, _) = echo();
    assert_eq!(registry.register(item("bash__exec"), first), Ok(()));
    assert_eq!(
        registry.register(dynamic_item("bash__exec"), second),
        Err(RegistryError::Duplicate("bash__exec".into()))
    );
    assert_eq!(registry.len(), 1);
    // The first registration stays in place.
    assert_eq!(registry.get("bash__exec").map(|t| t.item.source().clone()), Some(ToolSource::config("bash")));
}

#[test]
fn registering_a_malformed_name_is_refused() {
    let registry = ToolRegistry::new();
    for bad in ["plain", "__x", "x__", "a__b__c"] {
        let (handler, _) = echo();
        assert_eq!(
            registry.register(ToolCatalogItem::new(bad, ToolSource::extension("e")), handler),
            Err(RegistryError::InvalidName(bad.into()))
        );
    }
    assert!(registry.is_empty());
}

#[tokio::test]
async fn dynamic_tools_join_the_step_catalog_and_config_tools_do_not() {
    let (config_handler, config_calls) = echo();
    let (weather, weather_calls) = echo();
    let (news, _) = echo();
    let registry = ToolRegistry::new();
    for (item, handler) in [
        (item("bash__exec"), config_handler),
        (dynamic_item("weather__get"), weather),
        (dynamic_item("news__top"), news),
    ] {
        if let Err(e) = registry.register(item, handler) {
            panic!("{e}");
        }
    }
    let catalog = AgentTools::default().step_catalog(&registry);
    assert_eq!(catalog.names().collect::<Vec<_>>(), ["weather__get", "news__top"]);
    assert_eq!(
        serde_json::to_value(&catalog).unwrap_or_else(|e| panic!("{e}")),
        json!([
            {"name": "weather__get", "source": {"type": "extension", "name": "weather-ext"}},
            {"name": "news__top", "source": {"type": "extension", "name": "weather-ext"}},
        ])
    );

    // The executor runs the dynamic tool through that catalog and refuses the
    // registered-but-not-offered config tool.
    let executor = ToolExecutor::new(Arc::new(registry));
    let catalog = Arc::new(catalog);
    let step = scope();
    let ok = executor.execute(call("weather__get", json!({"city": "Seoul"})), &step, &catalog).await;
    assert_eq!(to_json(&ok), json!({"status": "ok", "output": {"args": {"city": "Seoul"}}}));
    assert_eq!(weather_calls.load(Ordering::SeqCst), 1);
    let refused = executor.execute(call("bash__exec", json!({"command": "ls"})), &step, &catalog).await;
    assert_eq!(refused.error_code(), Some("E_TOOL_NOT_IN_CATALOG"));
    assert_eq!(
        refused.error.and_then(|e| e.suggestion),
        Some(format!("{NOT_IN_CATALOG_HINT} Available tools: weather__get, news__top."))
    );
    assert_eq!(config_calls.load(Ordering::SeqCst), 0);
}

/// A Tool resource's name without its export part gets the exports it has.
#[tokio::test]
async fn a_tool_name_without_its_export_names_the_exports() {
    let (a, _) = echo();
    let (b, _) = echo();
    let ready = Fixture::new().tool(bash_exec(), a).tool(item("bash__script"), b).build();
    let out = ready.json("bash", json!({})).await;
    assert_eq!(out["error"]["code"], "E_TOOL_NOT_IN_CATALOG");
    assert_eq!(out["error"]["message"], "'bash' is a Tool, not one of its exports: a tool's name is resource__export.");
    assert_eq!(out["error"]["suggestion"], "Call one of: bash__exec, bash__script.");
}

#[tokio::test]
async fn a_handler_gets_the_traceparent_of_its_calls_span() {
    let (handler, _) = counting(|ctx, _| Ok(ToolOutput::Value(json!({"traceparent": ctx.traceparent()}))));
    let sink = Arc::new(MemoryEventSink::new());
    let ready = Fixture::new().tool(item("t__run"), handler).events(&sink).build();
    let result = ready.json("t__run", json!({})).await;
    let events = sink.events();
    let called = &events[0];
    assert_eq!(called["type"], "tool.called");
    let expected = format!(
        "00-{}-{}-01",
        called["traceId"].as_str().unwrap_or_default(),
        called["spanId"].as_str().unwrap_or_default()
    );
    assert_eq!(result["output"]["traceparent"], expected.as_str());
    assert!(goondan_core::ids::parse_traceparent(&expected).is_some());
}
