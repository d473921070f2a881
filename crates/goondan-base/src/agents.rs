//! The `agents` tool: `request`, `send`, `spawn`, `list` and `catalog` hand
//! work to the swarm's other agents through the orchestrator.
//!
//! The handler only reads and checks the arguments (as the original's
//! `agents.ts`: `instanceKey` defaults to the caller's, `timeoutMs` to
//! 60 000, `eventType` to `agent.request` / `agent.send`) and calls the
//! agent-to-agent runtime of its [`ToolContext`]; the orchestrator does the
//! routing, spawning and waiting, and shapes the outputs. Without one (an
//! agent run outside a swarm's orchestrator) every call is an
//! `E_AGENTS_UNAVAILABLE` error result that says so.

use std::sync::Arc;

use goondan_core::codes::E_AGENTS_UNAVAILABLE;
use goondan_core::{JsonObject, JsonValue};
use goondan_tools::context::{AgentMessageRequest, AgentSpawnRequest};
use goondan_tools::{AgentToolRuntime, BoxFuture, HandlerResult, ToolContext, ToolFailure, ToolHandler};

use crate::args;

/// The default `timeoutMs` of `request`.
pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;

/// The handler of `export`, or `None` if the tool has no such export.
pub fn handler(export: &str) -> Option<Arc<dyn ToolHandler>> {
    let export = match export {
        "request" => Export::Request,
        "send" => Export::Send,
        "spawn" => Export::Spawn,
        "list" => Export::List,
        "catalog" => Export::Catalog,
        _ => return None,
    };
    Some(Arc::new(Agents { export }))
}

#[derive(Debug, Clone, Copy)]
enum Export {
    Request,
    Send,
    Spawn,
    List,
    Catalog,
}

#[derive(Debug)]
struct Agents {
    export: Export,
}

impl ToolHandler for Agents {
    fn call<'a>(&'a self, ctx: &'a ToolContext, input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            // Arguments first: a bad call is reported as such, runtime or not.
            let call = Call::read(self.export, input)?;
            let runtime = ctx.runtime().ok_or_else(unavailable)?;
            call.run(ctx, runtime.as_ref()).await.map(Into::into)
        })
    }
}

/// One call's checked arguments.
enum Call {
    Request(AgentMessageRequest),
    Send(AgentMessageRequest),
    Spawn(AgentSpawnRequest),
    List(bool),
    Catalog,
}

impl Call {
    fn read(export: Export, input: &JsonObject) -> Result<Self, ToolFailure> {
        Ok(match export {
            Export::Request => Self::Request(message(input, "agent.request", true)?),
            Export::Send => Self::Send(message(input, "agent.send", false)?),
            Export::Spawn => Self::Spawn(AgentSpawnRequest {
                target: target(input)?,
                instance_key: non_empty(input, "instanceKey")?,
                cwd: non_empty(input, "cwd")?,
            }),
            Export::List => Self::List(args::optional_bool(input, "includeAll")?.unwrap_or(false)),
            Export::Catalog => Self::Catalog,
        })
    }

    async fn run(self, ctx: &ToolContext, runtime: &dyn AgentToolRuntime) -> Result<JsonValue, ToolFailure> {
        match self {
            Self::Request(request) => runtime.request(ctx, request).await,
            Self::Send(request) => runtime.send(ctx, request).await,
            Self::Spawn(request) => runtime.spawn(ctx, request).await,
            Self::List(include_all) => runtime.list(ctx, include_all).await,
            Self::Catalog => runtime.catalog(ctx).await,
        }
    }
}

fn target(input: &JsonObject) -> Result<String, ToolFailure> {
    let target = args::require_string(input, "target")?.trim();
    if target.is_empty() {
        return Err(ToolFailure::new("'target' must be a non-empty string")
            .suggest("Name an agent of the swarm; agents__catalog lists them."));
    }
    Ok(target.to_owned())
}

/// An optional string; empty counts as absent.
fn non_empty(input: &JsonObject, key: &str) -> Result<Option<String>, ToolFailure> {
    Ok(args::optional_string(input, key)?.map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned))
}

fn message(input: &JsonObject, default_event: &str, is_request: bool) -> Result<AgentMessageRequest, ToolFailure> {
    let target = target(input)?;
    let text = args::require_string(input, "input")?.to_owned();
    let metadata = match input.get("metadata") {
        None | Some(JsonValue::Null) => JsonObject::new(),
        Some(JsonValue::Object(map)) => map.clone(),
        Some(other) => {
            return Err(ToolFailure::new(format!(
                "'metadata' must be an object, got {}",
                goondan_core::json_type_name(other)
            )));
        }
    };
    let (timeout_ms, asynchronous) = if is_request {
        let timeout = args::optional_number(input, "timeoutMs")?.unwrap_or(DEFAULT_TIMEOUT_MS as f64);
        if !(timeout.is_finite() && timeout > 0.0) {
            return Err(ToolFailure::new(format!("'timeoutMs' must be a positive number, got {timeout}"))
                .suggest("Give the time to wait for the reply in milliseconds (default 60000)."));
        }
        // Whole milliseconds; a huge value waits as long as a u64 can say.
        (Some(timeout.ceil().min(u64::MAX as f64) as u64), args::optional_bool(input, "async")?.unwrap_or(false))
    } else {
        (None, false)
    };
    Ok(AgentMessageRequest {
        target,
        input: text,
        instance_key: non_empty(input, "instanceKey")?,
        event_type: Some(non_empty(input, "eventType")?.unwrap_or_else(|| default_event.to_owned())),
        metadata,
        timeout_ms,
        asynchronous,
    })
}

fn unavailable() -> ToolFailure {
    ToolFailure::with_code(
        "the agents tool needs the swarm's orchestrator, and this agent runs without one",
        E_AGENTS_UNAVAILABLE,
    )
    .named("AgentsUnavailableError")
    .suggest("Run the agent as part of a Swarm under `gdn run`; a single agent has no other agents to reach.")
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::json;

    use super::*;

    /// A runtime that records what it was asked and answers with it.
    #[derive(Debug, Default)]
    struct Recording(Mutex<Vec<String>>);

    impl AgentToolRuntime for Recording {
        fn request<'a>(
            &'a self,
            _: &'a ToolContext,
            request: AgentMessageRequest,
        ) -> BoxFuture<'a, Result<JsonValue, ToolFailure>> {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(format!("{request:?}"));
            Box::pin(async move { Ok(json!({"target": request.target, "response": "pong"})) })
        }
        fn send<'a>(
            &'a self,
            _: &'a ToolContext,
            request: AgentMessageRequest,
        ) -> BoxFuture<'a, Result<JsonValue, ToolFailure>> {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(format!("{request:?}"));
            Box::pin(async move { Ok(json!({"target": request.target, "accepted": true})) })
        }
        fn spawn<'a>(
            &'a self,
            _: &'a ToolContext,
            request: AgentSpawnRequest,
        ) -> BoxFuture<'a, Result<JsonValue, ToolFailure>> {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(format!("{request:?}"));
            Box::pin(async move { Ok(json!({"target": request.target, "spawned": true})) })
        }
        fn list<'a>(&'a self, _: &'a ToolContext, include_all: bool) -> BoxFuture<'a, Result<JsonValue, ToolFailure>> {
            Box::pin(async move { Ok(json!({"count": 0, "agents": [], "includeAll": include_all})) })
        }
        fn catalog<'a>(&'a self, _: &'a ToolContext) -> BoxFuture<'a, Result<JsonValue, ToolFailure>> {
            Box::pin(async { Ok(json!({"swarmName": "s"})) })
        }
    }

    fn object(value: JsonValue) -> JsonObject {
        value.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn arguments_are_read_with_the_originals_defaults() {
        let Ok(Call::Request(request)) = Call::read(Export::Request, &object(json!({"target": " b ", "input": "hi"})))
        else {
            panic!("not a request")
        };
        assert_eq!(request.target, "b");
        assert_eq!(request.instance_key, None, "the runtime uses the caller's key");
        assert_eq!(request.event_type.as_deref(), Some("agent.request"));
        assert_eq!(request.timeout_ms, Some(DEFAULT_TIMEOUT_MS));
        assert!(!request.asynchronous);
        let Ok(Call::Send(send)) =
            Call::read(Export::Send, &object(json!({"target": "b", "input": "x", "eventType": "ping"})))
        else {
            panic!("not a send")
        };
        assert_eq!(send.event_type.as_deref(), Some("ping"));
        assert_eq!(send.timeout_ms, None);
    }

    #[test]
    fn bad_arguments_are_refused_with_what_was_wrong() {
        let refused = |export, input| Call::read(export, &object(input)).err().map(|f| f.message).unwrap_or_default();
        assert_eq!(
            refused(Export::Request, json!({"target": "", "input": "x"})),
            "'target' must be a non-empty string"
        );
        assert_eq!(refused(Export::Request, json!({"target": "b"})), "'input' must be a non-empty string");
        assert_eq!(
            refused(Export::Request, json!({"target": "b", "input": "x", "timeoutMs": 0})),
            "'timeoutMs' must be a positive number, got 0"
        );
        assert_eq!(
            refused(Export::Send, json!({"target": "b", "input": "x", "metadata": [1]})),
            "'metadata' must be an object, got array"
        );
    }

    #[tokio::test]
    async fn without_an_orchestrator_every_export_says_so() {
        let settings = crate::test_support::settings();
        for export in ["request", "send", "spawn", "list", "catalog"] {
            let result =
                crate::test_support::run("agents", export, &settings, json!({"target": "b", "input": "x"})).await;
            let failure = crate::test_support::err(result);
            assert_eq!(failure.code.as_deref(), Some(E_AGENTS_UNAVAILABLE), "{export}");
        }
    }

    #[tokio::test]
    async fn calls_reach_the_runtime() {
        let runtime = Arc::new(Recording::default());
        let plain = crate::test_support::context("agents__request");
        let scope = goondan_tools::CallScope {
            runtime: Some(Arc::clone(&runtime) as Arc<dyn AgentToolRuntime>),
            ..(**plain.scope()).clone()
        };
        let ctx = ToolContext::new(Arc::new(scope), Arc::from("agents__request"), "call-1");
        let Some(handler) = handler("request") else { panic!("no request handler") };
        let input = object(json!({"target": "b", "input": "ping", "async": true, "timeoutMs": 1500.5}));
        let output = crate::test_support::ok(handler.call(&ctx, &input).await);
        assert_eq!(output, json!({"target": "b", "response": "pong"}));
        let seen = runtime.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert!(seen[0].contains("asynchronous: true") && seen[0].contains("timeout_ms: Some(1501)"), "{seen:?}");
    }
}
