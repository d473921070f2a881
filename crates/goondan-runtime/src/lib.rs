//! The agent runtime: the turn/step loop and durable conversations.
//!
//! - [`store`]: the state root, one directory per instance with an
//!   append-only message log and event log.
//! - [`turn`]: a turn — steps of model call and tool calls — ending with an answer.

pub mod agent;
pub mod store;
pub mod turn;
