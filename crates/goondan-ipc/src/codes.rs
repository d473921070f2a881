//! The error codes of inter-agent calls (the original's names where it has one).

/// The target is not an agent of the swarm.
pub const AGENT_NOT_FOUND: &str = "AGENT_NOT_FOUND";
/// The reply did not come within `timeoutMs`.
pub const AGENT_REQUEST_TIMEOUT: &str = "AGENT_REQUEST_TIMEOUT";
/// A synchronous request to an instance that is (transitively) waiting for the caller.
pub const CIRCULAR_CALL_DETECTED: &str = "CIRCULAR_CALL_DETECTED";
/// Too many agent-to-agent hops in one chain.
pub const AGENT_HOP_LIMIT: &str = "AGENT_HOP_LIMIT_EXCEEDED";
/// The target's process ended before it answered.
pub const AGENT_CRASHED: &str = "AGENT_CRASHED";
/// The target cannot be started now (its start failed, or it crashed
/// repeatedly and is backing off).
pub const AGENT_UNAVAILABLE: &str = "AGENT_UNAVAILABLE";
/// A message could not be delivered.
pub const IPC_DELIVERY_FAILED: &str = "IPC_DELIVERY_FAILED";
/// The target's turn ended without an answer (the model or a layer failed).
pub const AGENT_TURN_FAILED: &str = "AGENT_TURN_FAILED";
/// The request was cancelled (the caller's turn was, or the swarm is stopping).
pub const AGENT_REQUEST_CANCELLED: &str = "AGENT_REQUEST_CANCELLED";
/// An argument of a call to the orchestrator was refused.
pub const AGENT_INVALID_REQUEST: &str = "AGENT_INVALID_REQUEST";
/// A message is over the frame limit (16 MiB): it fails alone, the channel stays up.
pub const IPC_MESSAGE_TOO_LARGE: &str = "IPC_MESSAGE_TOO_LARGE";
/// No agent process could be started within the bound on live processes.
pub const AGENT_CAPACITY_EXCEEDED: &str = "AGENT_CAPACITY_EXCEEDED";
/// Across hosts (NATS): no agent host connected now can run the agent (none
/// at all, or none with the labels it asks for).
pub const AGENT_NO_HOST: &str = "AGENT_NO_HOST";

/// Every code above, in the order of this module.
pub const ALL: &[&str] = &[
    AGENT_NOT_FOUND,
    AGENT_REQUEST_TIMEOUT,
    CIRCULAR_CALL_DETECTED,
    AGENT_HOP_LIMIT,
    AGENT_CRASHED,
    AGENT_UNAVAILABLE,
    IPC_DELIVERY_FAILED,
    AGENT_TURN_FAILED,
    AGENT_REQUEST_CANCELLED,
    AGENT_INVALID_REQUEST,
    IPC_MESSAGE_TOO_LARGE,
    AGENT_CAPACITY_EXCEEDED,
    AGENT_NO_HOST,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// `ALL` is complete: every `pub const` of this file (other than `ALL`
    /// itself) is listed in it.
    #[test]
    fn all_lists_every_constant() {
        let source = include_str!("codes.rs");
        let declared: Vec<&str> = source
            .lines()
            .filter_map(|line| line.strip_prefix("pub const "))
            .filter_map(|rest| rest.split(':').next())
            .filter(|name| *name != "ALL")
            .collect();
        assert_eq!(declared.len(), ALL.len(), "declared {declared:?}");
        let values: Vec<&str> = source
            .lines()
            .filter(|line| line.starts_with("pub const ") && !line.starts_with("pub const ALL"))
            .filter_map(|line| line.split('"').nth(1))
            .collect();
        for value in values {
            assert!(ALL.contains(&value), "{value} is declared but missing from ALL");
        }
    }
}
