//! Agent processes: the orchestrator that starts, routes between,
//! supervises and stops them, and the agent-process side of the channel.
//!
//! - [`plan`]: the swarm an orchestrator runs (`SwarmPlan`).
//! - [`launcher`]: starting one agent process (the `gdn` binary's hidden
//!   subcommand), its channel one end of a socket pair it inherits.
//! - [`orchestrator`]: the front end's handle on the hub.
//! - `hub`: the one task that owns the swarm's state and takes typed
//!   commands: routing `delegate` / `delegate_result` / `event`, auto-spawn,
//!   the bound on live processes and idle stops, crash handling and
//!   backoff, shutdown.
//! - `start`: the tasks around one process (start to `ready`, its messages
//!   then its exit, writing to it), so that the hub never waits.
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
mod hub;
pub mod launcher;
pub mod orchestrator;
pub mod plan;
mod start;
pub mod waits;

pub use launcher::AgentLauncher;
pub use orchestrator::{NoSwarmObserver, Orchestrator, SwarmObserver};
pub use plan::SwarmPlan;
