//! The hub of a swarm: the orchestrator that starts agent processes,
//! routes every message between them, supervises and stops them.
//!
//! - [`plan`]: the swarm an orchestrator runs (`SwarmPlan`).
//! - [`launcher`]: starting one agent process (the `gdn` binary's hidden
//!   subcommand), its channel one end of a socket pair it inherits.
//! - [`orchestrator`]: the front end's handle on the hub.
//! - `hub`: the one task that owns the swarm's state and takes typed
//!   commands: routing `delegate` / `delegate_result` / `event`, auto-spawn,
//!   the bound on live processes and idle stops, crash handling and
//!   backoff, restarts the operator asks for (held down, then released), shutdown.
//! - `start`: the tasks around one process (start to `ready`, its messages
//!   then its exit, writing to it), so that the hub never waits.
//! - [`waits`]: who waits for whom — a synchronous request that would close
//!   a cycle is refused at once.
//! - [`backoff`]: the crash policy.
//! - [`codes`]: the error codes of inter-agent calls (goondan-ipc's).
//!
//! The agent side of the channel (serve loop, swarm client) is the
//! goondan-agent crate.
//!
//! Architecture invariant: the orchestrator runs no turn and holds no
//! conversation; every agent instance runs in its own process, and every
//! message between instances goes through the orchestrator.

pub mod backoff;
pub use goondan_ipc::codes;
mod hub;
pub mod launcher;
pub mod orchestrator;
pub mod plan;
mod start;
pub mod waits;

pub use hub::holds::{InstanceSelector, RestartReport, WhileDown};
pub use launcher::{AgentLauncher, AgentProcess, Launch, LocalProcess, ProcessEnd, Started};
pub use orchestrator::{Inbound, NoSwarmObserver, Orchestrator, SwarmObserver};
pub use plan::SwarmPlan;
pub use start::walk_to_ready;
