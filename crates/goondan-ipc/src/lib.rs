//! The messages between the orchestrator and its agent processes, and how
//! they travel.
//!
//! - [`message`]: the envelope of spec 002 §9.2 — `{type, from, to,
//!   payload, correlationId}` — as one tagged enum, [`IpcMessage`], with a
//!   typed payload per type (`delegate`, `delegate_result`, `event`,
//!   `shutdown`, and the process-management types the spec leaves open:
//!   `hello`, `init`, `ready`, `cancel`, `call`, `call_result`, `observe`,
//!   `shutdown_ack`).
//! - [`codes`]: the error codes of inter-agent calls, which both sides use.
//! - [`frame`]: a message on a byte stream — a 4-byte big-endian length and
//!   the JSON — with a size cap checked on both ends.
//! - [`transport`]: the [`transport::Link`] trait an orchestrator and an
//!   agent talk through, and its Unix-socket implementation. A broker
//!   (NATS) implements the same trait to carry the same messages between
//!   hosts.
//!
//! Architecture invariant: this crate depends only on goondan-core and knows
//! nothing of agents, turns or processes; it only moves typed messages.

pub mod codes;
pub mod frame;
pub mod message;
pub mod transport;

pub use frame::{FrameError, MAX_FRAME_BYTES};
pub use message::*;
pub use transport::{BoxFuture, Link, LinkError, LinkReceiver, LinkSender, unix_link};

/// The environment variable naming the orchestrator's pid in an agent
/// process (not a secret: the process checks that its parent is that one).
pub const ORCHESTRATOR_PID_ENV: &str = "GOONDAN_ORCHESTRATOR_PID";
