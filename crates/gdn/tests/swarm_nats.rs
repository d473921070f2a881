//! The swarm cases (`swarm_cases/`) across hosts: the hub on NATS
//! JetStream (`gdn run --nats`), its agents on two agent hosts (`gdn
//! host`), with a real `nats-server`.

mod common;

/// The cases run over NATS.
const OVER_NATS: bool = true;

#[path = "swarm_cases/mod.rs"]
mod cases;
