//! The executor: the one pipeline every tool call goes through.
//!
//! ```text
//! tool.called event
//!   └─ toolCall middleware (onion, may change args/metadata, short-circuit, rewrite)
//!        └─ core: catalog check → argument validation → handler lookup
//!                 → handler (deadline, panic capture) → ToolResult
//!   (with a deadline and at least one layer, the whole chain is held to the
//!   deadline plus a little slack: a layer that never returns ends too)
//! error message truncated to the tool's errorMessageLimit, helpUrl of its code added
//! tool.completed | tool.failed event
//! ```
//!
//! Whatever happens — a handler error, a panic in a handler or a middleware
//! layer, a deadline — the caller gets exactly one [`ToolResult`], never an
//! exception (spec 002 §8.3).
//!
//! The registry may change while calls run (tools registered or removed at
//! run time). The core reads it through one lock-free snapshot per call for
//! the catalog-bypass check and the handler lookup, and lets go of that
//! snapshot before the handler runs; the handler it found stays alive for the
//! call even if it is unregistered meanwhile.

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use goondan_core::codes::{E_TOOL_NOT_FOUND, E_TOOL_NOT_IN_CATALOG, E_TOOL_TIMEOUT};
use goondan_core::ids::SpanIdGenerator;
use goondan_core::message::now_millis;
use goondan_core::{DEFAULT_ERROR_MESSAGE_LIMIT, JsonObject, JsonValue, ToolCall, ToolError, ToolResult, ToolStatus};
use tracing::Instrument as _;

use crate::catalog::ToolCatalog;
use crate::context::{CallScope, ToolContext};
use crate::events::{EventKind, EventSink, NoopEventSink, RuntimeEvent, ToolEventData};
use crate::handler::{ToolFailure, ToolOutput};
use crate::pipeline::{BoxFuture, CatchUnwind, Core, Middleware, MiddlewareChain, panic_message};
use crate::registry::{RegisteredTool, ToolRegistry};
use crate::validation::validate_args;

/// What the toolCall middleware sees and may change (spec 002 §6.3).
#[derive(Debug)]
pub struct ToolCallContext {
    tool_name: Arc<str>,
    tool_call_id: Arc<str>,
    /// The arguments; changes are seen by inner layers and the core.
    pub args: JsonObject,
    /// Free-form metadata shared between layers.
    pub metadata: JsonObject,
    scope: Arc<CallScope>,
    catalog: Arc<ToolCatalog>,
    /// When the call's time is up (the policy's `call_timeout` from the
    /// start of the call): the handler's deadline, and, a moment later,
    /// the whole chain's.
    deadline: Option<tokio::time::Instant>,
    /// The call's span (its `tool.*` events').
    span_id: u64,
}

impl ToolCallContext {
    /// The called tool's full name.
    pub fn tool_name(&self) -> &str {
        &self.tool_name
    }

    /// The call's id.
    pub fn tool_call_id(&self) -> &str {
        &self.tool_call_id
    }

    /// The step-wide scope (agent, instance, turn, message, workdir, trace).
    pub fn scope(&self) -> &Arc<CallScope> {
        &self.scope
    }

    /// The catalog of the step that made the call.
    pub fn catalog(&self) -> &ToolCatalog {
        &self.catalog
    }
}

/// A toolCall middleware layer.
pub type ToolCallMiddleware = dyn Middleware<ToolCallContext, ToolResult>;

/// Security and robustness settings of an executor.
#[derive(Debug, Clone, Default)]
pub struct ExecutorPolicy {
    /// Let calls reach registered tools that are not in the step's catalog.
    /// Off by default; spec 002 §7.1 allows it only by explicit policy.
    pub allow_registry_calls: bool,
    /// The deadline of one handler run; `None` for no deadline.
    pub call_timeout: Option<Duration>,
}

/// Runs tool calls through the pipeline.
pub struct ToolExecutor {
    core: ExecutorCore,
    middleware: MiddlewareChain<ToolCallContext, ToolResult>,
    events: Arc<dyn EventSink>,
    span_ids: SpanIdGenerator,
}

impl std::fmt::Debug for ToolExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolExecutor")
            .field("tools", &self.core.registry.len())
            .field("middleware", &self.middleware)
            .field("policy", &self.core.policy)
            .finish_non_exhaustive()
    }
}

struct ExecutorCore {
    registry: Arc<ToolRegistry>,
    policy: ExecutorPolicy,
}

impl ToolExecutor {
    /// An executor over `registry` with no middleware, no events and the default policy.
    pub fn new(registry: Arc<ToolRegistry>) -> Self {
        Self {
            core: ExecutorCore { registry, policy: ExecutorPolicy::default() },
            middleware: MiddlewareChain::new(),
            events: Arc::new(NoopEventSink),
            span_ids: SpanIdGenerator::new(),
        }
    }

    /// Sets the policy.
    #[must_use]
    pub fn with_policy(mut self, policy: ExecutorPolicy) -> Self {
        self.core.policy = policy;
        self
    }

    /// Sets where events go.
    #[must_use]
    pub fn with_events(mut self, events: Arc<dyn EventSink>) -> Self {
        self.events = events;
        self
    }

    /// Adds a toolCall middleware layer (lower priority = outer).
    pub fn register_middleware(&mut self, name: impl Into<Arc<str>>, priority: i32, layer: Arc<ToolCallMiddleware>) {
        self.middleware.register(name, priority, layer);
    }

    /// The registry.
    pub fn registry(&self) -> &Arc<ToolRegistry> {
        &self.core.registry
    }

    /// The policy.
    pub fn policy(&self) -> &ExecutorPolicy {
        &self.core.policy
    }

    /// Runs one call against the step's `catalog` and returns its result.
    pub async fn execute(&self, call: ToolCall, scope: &Arc<CallScope>, catalog: &Arc<ToolCatalog>) -> ToolResult {
        let started = Instant::now();
        let events_on = self.events.enabled();
        // One wall-clock read per call: the completion event's timestamp is
        // derived from the monotonic clock.
        let started_ms = if events_on { now_millis() } else { 0 };
        let span_id = self.span_ids.next_raw();
        let ToolCall { id: tool_call_id, name: tool_name, args } = call;
        if events_on {
            let data = ToolEventData {
                tool_call_id: &tool_call_id,
                tool_name: &tool_name,
                status: None,
                error_code: None,
                duration: None,
                sandbox_refused: None,
            };
            self.emit(EventKind::ToolCalled, span_id, started_ms, scope, data);
        }

        let deadline = self.core.policy.call_timeout.map(|limit| tokio::time::Instant::now() + limit);
        let mut ctx = ToolCallContext {
            tool_name,
            tool_call_id,
            args,
            metadata: JsonObject::new(),
            scope: Arc::clone(scope),
            catalog: Arc::clone(catalog),
            deadline,
            span_id,
        };
        let chain = CatchUnwind::new(self.middleware.run(&mut ctx, &self.core));
        // A toolCall layer that never finishes (it awaits forever, or never
        // calls `next` and never returns) is held to the call's deadline
        // too; the handler's own deadline fires first when the handler is
        // what is slow. Without layers there is nothing to bound here.
        let outcome = match deadline {
            Some(at) if !self.middleware.is_empty() => {
                tokio::time::timeout_at(at + MIDDLEWARE_DEADLINE_SLACK, chain).await.unwrap_or_else(|_| {
                    Ok(ToolResult::error(middleware_timed_out(&ctx.tool_name, self.core.policy.call_timeout)))
                })
            }
            _ => chain.await,
        };
        let mut result = match outcome {
            Ok(result) => result,
            Err(payload) => ToolResult::error(middleware_panic_error(&ctx.tool_name, payload.as_ref())),
        };
        if result.is_error() {
            let limit = self.error_message_limit(&ctx.tool_name, catalog);
            result.truncate_error(limit);
            // Every source's error (native, script, MCP, a layer's refusal)
            // links to the help entry of its code, unless it set a link.
            result.link_help();
        }
        // A pending result is a task of the instance, whoever made it: one
        // its handler did not open itself is recorded here.
        if result.status == ToolStatus::Pending
            && let (Some(tasks), Some(handle)) = (scope.tasks.as_ref(), result.handle.clone())
            && let Err(failure) = tasks.adopt(&ctx.tool_name, &ctx.tool_call_id, &scope.turn_id, &handle).await
        {
            // No result would ever come: say so now.
            result = ToolResult::error(failure.into_tool_error());
            result.link_help();
        }

        if events_on {
            let kind = if result.is_error() { EventKind::ToolFailed } else { EventKind::ToolCompleted };
            let elapsed = started.elapsed();
            let data = ToolEventData {
                tool_call_id: &ctx.tool_call_id,
                tool_name: &ctx.tool_name,
                status: Some(result.status),
                error_code: result.error_code(),
                duration: Some(elapsed),
                sandbox_refused: sandbox_refusal(&result),
            };
            let finished_ms = started_ms + u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
            self.emit(kind, span_id, finished_ms, scope, data);
        }
        result
    }

    /// The limit of the tool that was called: its catalog item's, or the
    /// registry's when the policy let the call bypass the catalog; the default
    /// for a refused call.
    fn error_message_limit(&self, tool_name: &str, catalog: &ToolCatalog) -> usize {
        match catalog.get(tool_name) {
            Some(item) => item.error_message_limit(),
            None if self.core.policy.allow_registry_calls => self
                .core
                .registry
                .load()
                .get(tool_name)
                .map_or(DEFAULT_ERROR_MESSAGE_LIMIT, |tool| tool.item.error_message_limit()),
            None => DEFAULT_ERROR_MESSAGE_LIMIT,
        }
    }

    fn emit(&self, kind: EventKind, span_id: u64, timestamp_ms: u64, scope: &Arc<CallScope>, data: ToolEventData<'_>) {
        self.events.emit(&RuntimeEvent::tool(kind, scope, span_id, timestamp_ms, data));
    }
}

impl Core<ToolCallContext, ToolResult> for ExecutorCore {
    fn run<'a>(&'a self, ctx: &'a mut ToolCallContext) -> BoxFuture<'a, ToolResult> {
        Box::pin(self.run_core(ctx))
    }
}

impl ExecutorCore {
    /// Steps 1–3: the catalog check, argument validation and handler lookup,
    /// against one snapshot of the registry. The snapshot is borrowed only
    /// here, never across the handler's `await` (the registry may change
    /// meanwhile); the tool is returned as its own `Arc`, which keeps the
    /// handler alive even if it is unregistered while it runs.
    fn admit(&self, ctx: &mut ToolCallContext) -> Result<Arc<RegisteredTool>, ToolError> {
        let registry = self.registry.load();

        // 1. The step's catalog is the allow-list (spec 002 §7).
        let item = match ctx.catalog.get(&ctx.tool_name) {
            Some(item) => item,
            None => match registry.get(&ctx.tool_name) {
                Some(tool) if self.policy.allow_registry_calls => &tool.item,
                _ => return Err(not_in_catalog(&ctx.tool_name, &ctx.catalog)),
            },
        };

        // 2. Arguments against the item's schema. The object moves into a
        // Value and back, so validation copies nothing.
        let args = JsonValue::Object(std::mem::take(&mut ctx.args));
        let verdict = validate_args(item, &args);
        if let JsonValue::Object(map) = args {
            ctx.args = map;
        }
        verdict?;

        // 3. Something must execute it. A tool offered in the step's catalog
        // may have been unregistered since the step began.
        registry.get_shared(&ctx.tool_name).cloned().ok_or_else(|| not_registered(&ctx.tool_name))
    }

    async fn run_core(&self, ctx: &mut ToolCallContext) -> ToolResult {
        let tool = match self.admit(ctx) {
            Ok(tool) => tool,
            Err(refused) => return ToolResult::error(refused),
        };

        // 4. Run it, turning errors, panics and the deadline into results.
        let tool_ctx = ToolContext::new(
            Arc::clone(&ctx.scope),
            Arc::clone(tool.item.shared_name()),
            Arc::clone(&ctx.tool_call_id),
        )
        .in_span(ctx.span_id);
        let span = tracing::debug_span!(
            target: "goondan::tool",
            "tool",
            agent = %ctx.scope.agent_name,
            tool = %ctx.tool_name,
            call = %ctx.tool_call_id,
        );
        // The handler's future is created inside the guard: a synchronous
        // handler runs its body in `call`, and its panic must be caught here,
        // inside the middleware, like any other handler failure.
        let handler = &tool.handler;
        let args = &ctx.args;
        let run = CatchUnwind::new(async { handler.call(&tool_ctx, args).await }).instrument(span);
        let outcome = match (ctx.deadline, self.policy.call_timeout) {
            (Some(at), Some(limit)) => match tokio::time::timeout_at(at, run).await {
                Ok(outcome) => outcome,
                Err(_) => return ToolResult::error(timed_out(&ctx.tool_name, limit)),
            },
            _ => run.await,
        };
        match outcome {
            Ok(Ok(ToolOutput::Value(value))) => match ToolOutput::from_json(value) {
                ToolOutput::Value(value) => ToolResult::ok(value),
                ToolOutput::Pending { handle, output } => ToolResult::pending(handle, output),
            },
            Ok(Ok(ToolOutput::Pending { handle, output })) => ToolResult::pending(handle, output),
            Ok(Err(failure)) => ToolResult::error(failure.into_tool_error()),
            Err(payload) => ToolResult::error(panic_error(&ctx.tool_name, payload.as_ref())),
        }
    }
}

const NOT_IN_CATALOG_LISTED: usize = 20;

fn not_in_catalog(name: &str, catalog: &ToolCatalog) -> ToolError {
    // A Tool resource's name without its export (`bash`): name the exports.
    if !name.contains(goondan_core::naming::TOOL_NAME_SEPARATOR) {
        let prefix = format!("{name}{}", goondan_core::naming::TOOL_NAME_SEPARATOR);
        let exports: Vec<&str> = catalog.names().filter(|n| n.starts_with(&prefix)).collect();
        if !exports.is_empty() {
            return ToolError::new(
                E_TOOL_NOT_IN_CATALOG,
                "ToolNotInCatalogError",
                format!("'{name}' is a Tool, not one of its exports: a tool's name is resource__export."),
            )
            .with_suggestion(format!("Call one of: {}.", exports.join(", ")));
        }
    }
    let mut suggestion = match goondan_core::naming::closest(name, catalog.names()) {
        Some(close) => format!("Did you mean '{close}'? "),
        None => String::new(),
    };
    suggestion.push_str("Add the tool to the Agent's spec.tools, or add it to the step's catalog in step middleware.");
    if catalog.is_empty() {
        suggestion.push_str(" The current catalog is empty.");
    } else {
        let names: Vec<&str> = catalog.names().take(NOT_IN_CATALOG_LISTED).collect();
        suggestion.push_str(" Available tools: ");
        suggestion.push_str(&names.join(", "));
        if catalog.len() > NOT_IN_CATALOG_LISTED {
            suggestion.push_str(&format!(" (+{} more)", catalog.len() - NOT_IN_CATALOG_LISTED));
        }
        suggestion.push('.');
    }
    ToolError::new(
        E_TOOL_NOT_IN_CATALOG,
        "ToolNotInCatalogError",
        format!("Tool '{name}' is not available in the current Tool Catalog."),
    )
    .with_suggestion(suggestion)
}

fn not_registered(name: &str) -> ToolError {
    ToolError::new(E_TOOL_NOT_FOUND, "ToolNotFoundError", format!("Tool '{name}' is not registered.")).with_suggestion(
        "The tool is offered but no handler is registered for it. This build runs the built-in tools of \
         @goondan/base natively and a bundle's script tools (a Tool's spec.entry) on Bun or Node. Use another tool or tell the user.",
    )
}

/// How much longer than the handler's deadline the whole toolCall chain may
/// take: enough for the layers outside the handler to see its timeout
/// result and return it.
const MIDDLEWARE_DEADLINE_SLACK: Duration = Duration::from_millis(100);

fn middleware_timed_out(name: &str, limit: Option<Duration>) -> ToolError {
    let limit = limit.map_or(0, |limit| limit.as_millis());
    ToolError::new(
        E_TOOL_TIMEOUT,
        "ToolTimeoutError",
        format!("Tool '{name}': its toolCall middleware did not finish within the call's {limit} ms and the call was cancelled."),
    )
    .with_suggestion("A toolCall middleware layer is stuck (it never returned); check the agent's extensions.")
}

fn timed_out(name: &str, limit: Duration) -> ToolError {
    ToolError::new(
        E_TOOL_TIMEOUT,
        "ToolTimeoutError",
        format!("Tool '{name}' did not finish within {} ms and was cancelled.", limit.as_millis()),
    )
    .with_suggestion("Retry with a smaller task, or raise the tool call timeout if the work needs longer.")
}

fn panic_error(name: &str, payload: &(dyn Any + Send)) -> ToolError {
    ToolFailure::new(format!("Tool '{name}' panicked: {}", panic_message(payload)))
        .named("PanicError")
        .suggest("This is a bug in the tool's handler; report it with the arguments that caused it.")
        .into_tool_error()
}

fn middleware_panic_error(name: &str, payload: &(dyn Any + Send)) -> ToolError {
    ToolFailure::new(format!(
        "A toolCall middleware layer panicked while handling '{name}': {}",
        panic_message(payload)
    ))
    .named("PanicError")
    .suggest("This is a bug in a toolCall middleware (an extension); the tool itself may not have run.")
    .into_tool_error()
}

/// The policy a result says its sandbox refused part of the call under
/// (`output.sandbox.policy`, as `bash` reports it), for the event log.
fn sandbox_refusal(result: &ToolResult) -> Option<&'static str> {
    let policy = result.output.as_ref()?.get("sandbox")?.get("policy")?.as_str()?;
    ["read-only", "workspace-write", "full"].into_iter().find(|known| *known == policy)
}
