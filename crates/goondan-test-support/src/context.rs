//! A tool call's context for tests that call a tool handler directly,
//! without an agent: the call scope (agent, instance, working directory)
//! with the ids fixed, and the context of one call in it.
//!
//! What is deliberately absent: a runtime, tasks and a real message; a
//! test that needs one sets the field with struct update syntax
//! (`CallScope { tasks, ..call_scope(…) }`).

use std::path::Path;
use std::sync::Arc;

use goondan_core::Message;
use goondan_tools::{CallScope, ToolContext};

/// The scope of a call by `agent@key` working in `workdir`: turn `turn-1`,
/// step `step-1` (an assistant message without calls), trace and span ids
/// all zeros, no runtime, no tasks.
pub fn call_scope(agent: &str, key: &str, workdir: &Path) -> CallScope {
    CallScope {
        agent_name: Arc::from(agent),
        instance_key: Arc::from(key),
        turn_id: Arc::from("turn-1"),
        step_id: Arc::from("step-1"),
        step_index: 0,
        message: Arc::new(Message::assistant_tool_calls("step-1", Vec::new())),
        workdir: Arc::from(workdir),
        trace_id: Arc::from("0".repeat(32)),
        step_span_id: Arc::from("0".repeat(16)),
        runtime: None,
        tasks: None,
    }
}

/// The context of the call `call-1` of `tool` in `scope`.
pub fn tool_context(scope: CallScope, tool: &str) -> ToolContext {
    ToolContext::new(Arc::new(scope), Arc::from(tool), "call-1".to_owned())
}
