//! Ingress: how the outside world reaches a swarm.
//!
//! ```text
//! outside ──► connector (native task, or a Bun host per Connection)
//!               verifies, normalizes ─► Delivery {key, ConnectorEvent}
//!             ──► EventSink::accept ──► the inbox journal (fsync) ──► Accepted
//!               only now does the connector acknowledge (HTTP 2xx, Telegram offset)
//!             ──► routing (Connection ingress.rules) ──► per-instance queue ──► a turn
//!               the turn's end is journaled: a redelivered key never runs twice
//! ```
//!
//! - [`event`]: the original's `ConnectorEvent` and the [`Delivery`] that
//!   carries it with its delivery key.
//! - [`sink`]: where connectors put events ([`EventSink`]); an acceptance
//!   means the event is stored.
//! - [`connector`]: what a connector gets ([`ConnectorContext`]) and what a
//!   started one is ([`RunningConnector`]).
//! - [`connectors`]: the `@goondan/base` connectors, native.

pub mod connector;
pub mod connectors;
pub mod event;
pub mod sink;

pub use connector::{ConnectorContext, ConnectorError, RunningConnector, SecretMap, StartConnector};
pub use event::{ConnectorEvent, Delivery, EventError, EventMessage};
pub use sink::{Accepted, EventSink, MemorySink, SinkError};
