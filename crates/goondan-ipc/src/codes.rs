//! The error codes of inter-agent calls (the original's names where it has one).

goondan_core::error_codes! {
    /// The target is not an agent of the swarm.
    AGENT_NOT_FOUND;
    /// The reply did not come within `timeoutMs`.
    AGENT_REQUEST_TIMEOUT;
    /// A synchronous request to an instance that is (transitively) waiting for the caller.
    CIRCULAR_CALL_DETECTED;
    /// Too many agent-to-agent hops in one chain.
    AGENT_HOP_LIMIT = "AGENT_HOP_LIMIT_EXCEEDED";
    /// The target's process ended before it answered.
    AGENT_CRASHED;
    /// The target cannot be started now (its start failed, or it crashed
    /// repeatedly and is backing off).
    AGENT_UNAVAILABLE;
    /// A message could not be delivered.
    IPC_DELIVERY_FAILED;
    /// The target's turn ended without an answer (the model or a layer failed).
    AGENT_TURN_FAILED;
    /// The request was cancelled (the caller's turn was, or the swarm is stopping).
    AGENT_REQUEST_CANCELLED;
    /// An argument of a call to the orchestrator was refused.
    AGENT_INVALID_REQUEST;
    /// A message is over the frame limit (16 MiB): it fails alone, the channel stays up.
    IPC_MESSAGE_TOO_LARGE;
    /// No agent process could be started within the bound on live processes.
    AGENT_CAPACITY_EXCEEDED;
    /// Across hosts (NATS): no agent host connected now can run the agent (none
    /// at all, or none with the labels it asks for).
    AGENT_NO_HOST;
}
