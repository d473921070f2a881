//! Environment variables that carry a process's private channel to its
//! parent: an agent process's to its orchestrator. They are set for that
//! process only; the processes it starts for tools (shells, the JavaScript
//! host) get its environment without them, so that a command the model
//! chose never learns where the orchestrator listens or the start token.

/// The orchestrator's socket, for an agent process.
pub const AGENT_SOCKET_ENV: &str = "GOONDAN_AGENT_SOCKET";
/// The one-time token an agent process presents in its `hello`.
pub const AGENT_TOKEN_ENV: &str = "GOONDAN_AGENT_TOKEN";

/// Every variable a process must not pass on to the processes it starts.
pub const PRIVATE_TO_PROCESS: &[&str] = &[AGENT_SOCKET_ENV, AGENT_TOKEN_ENV];
