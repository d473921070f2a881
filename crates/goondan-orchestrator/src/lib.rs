//! Agent processes: the orchestrator that starts, routes between,
//! supervises and stops them, and the agent-process side of the channel.
//!
//! - [`plan`]: the swarm an orchestrator runs (`SwarmPlan`).
//! - [`launcher`]: starting one agent process (the `gdn` binary's hidden
//!   subcommand), connected over a Unix socket in a private directory.
//! - [`orchestrator`]: routing `delegate` / `delegate_result` / `event`,
//!   auto-spawn, crash handling and backoff, shutdown.
//! - [`waits`]: who waits for whom — a synchronous request that would close
//!   a cycle is refused at once.
//! - [`backoff`]: the crash policy.
//! - [`agent_process`]: inside an agent process — the `agents` tool's
//!   runtime over the channel, the queue of turns, asynchronous replies.
//! - [`codes`]: the error codes of inter-agent calls.
//!
//! Architecture invariant: the orchestrator runs no turn and holds no
//! conversation; every agent instance runs in its own process, and every
//! message between instances goes through the orchestrator.

pub mod agent_process;
pub mod backoff;
pub mod codes;
pub mod launcher;
pub mod orchestrator;
pub mod plan;
pub mod waits;

pub use launcher::AgentLauncher;
pub use orchestrator::{Orchestrator, SwarmObserver};
pub use plan::SwarmPlan;
