//! What a handler sees of the world: [`ToolContext`] (spec 002 §5.3, spec 000 §12.5).
//!
//! The context is deliberately small: who is calling (agent, instance, turn,
//! call id), the assistant message that holds the call, the instance's
//! working directory, a logger, and — when the agent runs under an
//! orchestrator — the agent-to-agent runtime. It never carries `swarmBundle`
//! or `oauth` (spec 000 §12.5 rule 3).

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use goondan_core::Message;

pub use crate::agents::{AgentMessageRequest, AgentSpawnRequest, AgentToolRuntime};

/// Everything about a call that is the same for all calls of one step:
/// shared by reference so that a call costs no copies of it.
#[derive(Debug, Clone)]
pub struct CallScope {
    /// The agent's name.
    pub agent_name: Arc<str>,
    /// The agent instance's key.
    pub instance_key: Arc<str>,
    /// The current turn's id.
    pub turn_id: Arc<str>,
    /// The current step's id.
    pub step_id: Arc<str>,
    /// The step's index within the turn, from 0.
    pub step_index: u32,
    /// The assistant message whose tool calls are being run.
    pub message: Arc<Message>,
    /// The instance's working directory.
    pub workdir: Arc<Path>,
    /// The trace the calls belong to (32 hex digits).
    pub trace_id: Arc<str>,
    /// The span of the step that made the calls (16 hex digits).
    pub step_span_id: Arc<str>,
    /// The agent-to-agent runtime, when the agent runs under an orchestrator.
    pub runtime: Option<Arc<dyn AgentToolRuntime>>,
    /// The instance's tasks, when an agent instance keeps them (see [`crate::tasks`]).
    pub tasks: Option<Arc<dyn crate::tasks::ToolTasks>>,
}

impl CallScope {
    /// The scope of calls made outside a model's step (an extension
    /// layer's `ctx.agents`, a test): an empty assistant message, no step
    /// id or step span, neither the agent-to-agent runtime nor tasks.
    pub fn outside_step(
        agent_name: Arc<str>,
        instance_key: Arc<str>,
        turn_id: Arc<str>,
        trace_id: Arc<str>,
        workdir: Arc<Path>,
    ) -> Self {
        Self {
            agent_name,
            instance_key,
            turn_id,
            step_id: Arc::from(""),
            step_index: 0,
            message: Arc::new(Message::assistant_tool_calls("", Vec::new())),
            workdir,
            trace_id,
            step_span_id: Arc::from(""),
            runtime: None,
            tasks: None,
        }
    }
}

/// The context handed to a tool handler.
#[derive(Clone)]
pub struct ToolContext {
    scope: Arc<CallScope>,
    tool_name: Arc<str>,
    tool_call_id: Arc<str>,
    /// The call's span (its `tool.*` events'), 0 outside the executor.
    span_id: u64,
    /// Log lines from the tool, tagged with the agent, tool and call.
    pub logger: ToolLogger,
}

impl fmt::Debug for ToolContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolContext")
            .field("agent_name", &self.agent_name())
            .field("instance_key", &self.instance_key())
            .field("turn_id", &self.turn_id())
            .field("tool_call_id", &self.tool_call_id)
            .field("workdir", &self.workdir())
            .finish_non_exhaustive()
    }
}

impl ToolContext {
    /// A context for one call.
    pub fn new(scope: Arc<CallScope>, tool_name: Arc<str>, tool_call_id: impl Into<Arc<str>>) -> Self {
        Self { scope, tool_name, tool_call_id: tool_call_id.into(), span_id: 0, logger: ToolLogger }
    }

    /// The same context in the span `span_id` (the executor's call span).
    #[must_use]
    pub fn in_span(mut self, span_id: u64) -> Self {
        self.span_id = span_id;
        self
    }

    /// The call's span id (0 when the call was made outside the executor).
    pub fn span_id(&self) -> u64 {
        self.span_id
    }

    /// The W3C `traceparent` naming this call's span in its trace, for
    /// whatever the call reaches in another process (the JavaScript host,
    /// an MCP server, another agent) to continue the trace under it. The
    /// step's span when the call has none of its own.
    pub fn traceparent(&self) -> String {
        let span = match self.span_id {
            0 => u64::from_str_radix(&self.scope.step_span_id, 16).unwrap_or(1),
            span => span,
        };
        goondan_core::ids::format_traceparent(&self.scope.trace_id, span)
    }

    /// The current agent's name.
    pub fn agent_name(&self) -> &str {
        &self.scope.agent_name
    }

    /// The current instance's key.
    pub fn instance_key(&self) -> &str {
        &self.scope.instance_key
    }

    /// The current turn's id.
    pub fn turn_id(&self) -> &str {
        &self.scope.turn_id
    }

    /// The instance's tasks, if an agent instance keeps them.
    pub fn tasks(&self) -> Option<&Arc<dyn crate::tasks::ToolTasks>> {
        self.scope.tasks.as_ref()
    }

    /// This call's id.
    pub fn tool_call_id(&self) -> &str {
        &self.tool_call_id
    }

    /// The full name of the tool being called (`resource__export`).
    pub fn tool_name(&self) -> &str {
        &self.tool_name
    }

    /// The assistant message that holds this call (spec 002 §5.3 rule 4).
    pub fn message(&self) -> &Message {
        &self.scope.message
    }

    /// The instance's working directory; file and process tools work here.
    pub fn workdir(&self) -> &Path {
        &self.scope.workdir
    }

    /// The agent-to-agent runtime, if the agent runs under an orchestrator.
    pub fn runtime(&self) -> Option<&Arc<dyn AgentToolRuntime>> {
        self.scope.runtime.as_ref()
    }

    /// The scope shared by the calls of this step.
    pub fn scope(&self) -> &Arc<CallScope> {
        &self.scope
    }
}

/// The logger of a tool call.
///
/// Lines go to `tracing` under the target `goondan::tool`; the executor runs
/// every handler inside a span that names the agent, tool and call, so the
/// lines carry those fields without the logger copying them.
#[derive(Debug, Clone, Copy, Default)]
pub struct ToolLogger;

impl ToolLogger {
    /// A debug line.
    pub fn debug(&self, message: impl fmt::Display) {
        tracing::debug!(target: "goondan::tool", "{message}");
    }

    /// An info line.
    pub fn info(&self, message: impl fmt::Display) {
        tracing::info!(target: "goondan::tool", "{message}");
    }

    /// A warning.
    pub fn warn(&self, message: impl fmt::Display) {
        tracing::warn!(target: "goondan::tool", "{message}");
    }

    /// An error line.
    pub fn error(&self, message: impl fmt::Display) {
        tracing::error!(target: "goondan::tool", "{message}");
    }
}
