//! The `agents` tool: `request`, `send`, `spawn`, `list` and `catalog` hand
//! work to the swarm's other agents through the orchestrator.
//!
//! The handler reads its arguments through the agent-to-agent contract
//! ([`goondan_tools::agents`]: the same rules as `ctx.runtime` and
//! `ctx.agents` of JavaScript code) and calls the agent-to-agent runtime of
//! its [`ToolContext`]; the orchestrator does the routing, spawning and
//! waiting. Without one (an agent run outside a swarm's orchestrator) every
//! call is an `E_AGENTS_UNAVAILABLE` error result that says so.

use std::sync::Arc;

use goondan_core::JsonObject;
use goondan_core::codes::E_AGENTS_UNAVAILABLE;
use goondan_tools::agents::{self, AgentMessageRequest, AgentSpawnRequest, MessageFields, SpawnFields};
use goondan_tools::{AgentToolRuntime, BoxFuture, HandlerResult, ToolContext, ToolFailure, ToolHandler, ToolOutput};

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
            call.run(ctx, runtime.as_ref()).await
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
            Export::Request => Self::Request(MessageFields::flat(input).request()?),
            Export::Send => Self::Send(MessageFields::flat(input).send()?),
            Export::Spawn => Self::Spawn(SpawnFields::flat(input).spawn()?),
            Export::List => Self::List(agents::include_all(input.get("includeAll"))?),
            Export::Catalog => Self::Catalog,
        })
    }

    async fn run(self, ctx: &ToolContext, runtime: &dyn AgentToolRuntime) -> HandlerResult {
        let value = match self {
            Self::Request(request) => {
                let answer = runtime.request(ctx, request).await?;
                // An asynchronous request's answer comes later: a pending
                // result, its handle the request's correlation id (the
                // answer enters the conversation as it always did).
                if answer.asynchronous && answer.response.is_none() {
                    return Ok(ToolOutput::Pending {
                        handle: answer.correlation_id.clone(),
                        output: Some(answer.tool_output()),
                    });
                }
                answer.tool_output()
            }
            Self::Send(request) => runtime.send(ctx, request).await.map(|receipt| receipt.tool_output())?,
            Self::Spawn(request) => runtime.spawn(ctx, request).await?,
            Self::List(include_all) => runtime.list(ctx, include_all).await?,
            Self::Catalog => runtime.catalog(ctx).await?,
        };
        Ok(value.into())
    }
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

    use goondan_tools::agents::{AgentAnswer, AgentSendReceipt, DEFAULT_REQUEST_TIMEOUT_MS};
    use serde_json::json;

    use goondan_core::JsonValue;

    use super::*;

    /// A runtime that records what it was asked and answers with it.
    #[derive(Debug, Default)]
    struct Recording(Mutex<Vec<String>>);

    impl AgentToolRuntime for Recording {
        fn request<'a>(
            &'a self,
            _: &'a ToolContext,
            request: AgentMessageRequest,
        ) -> BoxFuture<'a, Result<AgentAnswer, ToolFailure>> {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(format!("{request:?}"));
            Box::pin(async move {
                Ok(AgentAnswer {
                    target: request.target,
                    event_id: "e1".into(),
                    correlation_id: "c1".into(),
                    accepted: true,
                    asynchronous: request.asynchronous,
                    response: Some("pong".into()),
                })
            })
        }
        fn send<'a>(
            &'a self,
            _: &'a ToolContext,
            request: AgentMessageRequest,
        ) -> BoxFuture<'a, Result<AgentSendReceipt, ToolFailure>> {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(format!("{request:?}"));
            Box::pin(
                async move { Ok(AgentSendReceipt { target: request.target, event_id: "e2".into(), accepted: true }) },
            )
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

    /// The contract's rules (tested in `goondan_tools::agents`) with its
    /// code, before the runtime is looked at.
    #[test]
    fn arguments_are_read_by_the_contract() {
        let Ok(Call::Request(request)) = Call::read(Export::Request, &object(json!({"target": " b ", "input": "hi"})))
        else {
            panic!("not a request")
        };
        assert_eq!((request.target.as_str(), request.timeout_ms), ("b", Some(DEFAULT_REQUEST_TIMEOUT_MS)));
        let refused = Call::read(Export::Send, &object(json!({"target": "b", "input": "x", "metadata": [1]}))).err();
        let refused = refused.unwrap_or_else(|| panic!("accepted"));
        assert_eq!(refused.message, "'metadata' must be an object, got array");
        assert_eq!(refused.code.as_deref(), Some(goondan_core::codes::E_AGENTS_INVALID_REQUEST));
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
            tasks: None,
            ..(**plain.scope()).clone()
        };
        let ctx = ToolContext::new(Arc::new(scope), Arc::from("agents__request"), "call-1");
        let Some(handler) = handler("request") else { panic!("no request handler") };
        let input = object(json!({"target": "b", "input": "ping", "async": true, "timeoutMs": 1500.5}));
        let output = crate::test_support::ok(handler.call(&ctx, &input).await);
        assert_eq!(
            output,
            json!({"target": "b", "eventId": "e1", "correlationId": "c1", "accepted": true, "async": true, "response": "pong"})
        );
        let seen = runtime.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert!(seen[0].contains("asynchronous: true") && seen[0].contains("timeout_ms: Some(1501)"), "{seen:?}");
    }
}
