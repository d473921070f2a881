//! The Goondan Tool system (spec 002 §1–§8, §10–§11; spec 000 §12.1–§12.5).
//!
//! - [`catalog`]: the per-step Tool Catalog and its items.
//! - [`registry`]: every executable tool with its handler; grows and
//!   shrinks while the agent runs (copy-on-write snapshots).
//! - [`handler`]: the native handler trait and handler results.
//! - [`context`]: what a handler sees ([`ToolContext`]).
//! - [`agents`]: the agent-to-agent contract (typed requests and answers, read in one place).
//! - [`validation`]: argument validation with the original's messages.
//! - [`pipeline`]: the generic middleware onion.
//! - [`executor`]: the enforced path of every call.
//! - [`events`]: `turn.*`, `step.*`, `tool.*` and extensions' own events; sinks, the event log writer.
//! - [`assembly`]: catalogs and registries from a loaded bundle.
//! - [`tasks`]: pending results that complete later — their states and the
//!   contract a handler and the `tasks` tool reach them through.
//!
//! This crate calls no model, runs no turn and starts no process; the
//! onion, the event model (turn and step kinds included), call scopes and
//! the agents contract are here because every layer that runs tools
//! shares them (docs/ARCHITECTURE.md, goondan-tools).

pub mod agents;
pub mod assembly;
pub mod catalog;
pub mod context;
pub mod events;
pub mod executor;
pub mod handler;
pub mod pipeline;
pub mod registry;
pub mod tasks;
pub mod validation;

pub use catalog::{ParameterSchema, ToolCatalog, ToolCatalogItem, ToolSource, ToolSourceKind};
pub use context::{AgentToolRuntime, CallScope, ToolContext, ToolLogger};
pub use events::{
    EventKind, EventSink, FanoutEventSink, JsonLinesEventSink, MemoryEventSink, NoopEventSink, RuntimeEvent,
    TracingEventSink,
};
pub use executor::{ExecutorPolicy, ToolCallContext, ToolCallMiddleware, ToolExecutor};
pub use handler::{HandlerResult, ToolFailure, ToolHandler, ToolOutput, sync_handler};
pub use pipeline::{
    AsyncMiddleware, BoxFuture, CatchUnwind, Core, Middleware, MiddlewareChain, Next, PanicHandler, async_layer,
    from_fn, panic_message,
};
pub use registry::{RegisteredTool, RegistryError, RegistrySnapshot, ToolRegistry};
