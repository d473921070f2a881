//! One swarm across many machines, over NATS with JetStream.
//!
//! The single-machine path (`gdn run`: the hub and its agent processes over
//! socket pairs) stays the default and needs no broker. With `--nats`, the
//! hub places each agent instance on an **agent host** (`gdn host`), which
//! runs its agent process locally exactly as `gdn run` would, and carries
//! its messages over the broker:
//!
//! - [`connect`]: the connection, with credentials from the environment
//!   (`NATS_USER`/`NATS_PASSWORD`, `NATS_TOKEN`, `NATS_CREDS`) only.
//! - [`scope`]: every subject, stream and consumer name of one swarm
//!   (`gdn.<swarm>.…`), so two swarms on one server never meet.
//! - [`wire`]: what travels: the IPC envelope with its routing headers, the
//!   hosts' heartbeats, start and kill requests, exit notices.
//! - [`replica`]: an instance's durable state (its directory under the
//!   state root) as a log of file changes in a JetStream stream, claimed by
//!   one host at a time with a fencing token (the subject sequence the
//!   claim was written at: JetStream's expected-last-subject-sequence, the
//!   check under KV revisions). A host whose claim was taken over cannot
//!   commit.
//! - [`hub`]: the hub's [`goondan_orchestrator::Launch`]: the hosts it
//!   hears, placement (labels, least loaded), the remote processes, host
//!   loss (no heartbeat for the lease time).
//! - [`host`]: the agent host: heartbeats, starts, the bridge between a
//!   local agent process and the broker (durable consumers, explicit acks
//!   once the work is committed and replicated).

pub mod connect;
pub mod host;
pub mod hub;
pub mod replica;
pub mod scope;
pub mod wire;

pub use connect::{NatsError, connect};
pub use host::{Host, HostConfig};
pub use hub::{NatsLauncher, Placement};
pub use scope::Scope;

/// How long a host may be silent before the hub takes its instances
/// elsewhere (the lease's lifetime): four heartbeats.
pub const LEASE: std::time::Duration = std::time::Duration::from_millis(2_000);

/// How often a host says it is alive.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_millis(500);

/// How long, after the hub starts, a start waits for an agent host that
/// can take it before it runs on the hub's own host (or fails for want of
/// the labels it asks for): a host that joined a moment before the hub is
/// heard only at its next heartbeat. `--wait-hosts` waits longer, and for a
/// number of hosts.
pub const FIRST_HOST_WAIT: std::time::Duration = std::time::Duration::from_millis(3_000);
