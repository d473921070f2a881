//! The agent process: one agent instance of a swarm, in a process of its
//! own, started by the hub (`goondan-orchestrator`).
//!
//! - [`channel`]: its channel to the hub (inherited, never in the
//!   environment), `hello` → `init` (the instance, the secrets) → `ready`,
//!   and [`channel::guard_parent`] (non-dumpable, dies with its parent).
//! - [`instance`]: what every agent process does to start: load the
//!   bundle, take the instance's lock, load its conversation, open its
//!   event log, build the agent (the caller adds its wiring).
//! - [`swarm`]: the swarm client ([`SwarmRuntime`]), the `agents` tool's
//!   runtime over the channel.
//! - [`serve`]: the loop that runs one turn per message until `shutdown`,
//!   the end of the connection, SIGTERM or a restart request.
//! - [`tasks`]: how an ended task's result reaches the conversation, once.
//!
//! Architecture invariant: an agent process talks only to its hub, over
//! the one channel it was given; it never learns where another process
//! listens.

pub mod channel;
pub mod instance;
pub mod serve;
pub mod swarm;
pub mod tasks;

pub use channel::{AgentChannel, AgentProcessError, guard_parent};
pub use serve::{LeftRunning, ServeEnd, serve};
pub use swarm::{SwarmParts, SwarmRuntime};
