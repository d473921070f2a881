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
//! - [`routing`]: a Connection's `ingress.rules`.
//! - [`inbox`]: the durable inbox (group-committed journal, delivery keys).
//! - [`dispatch`]: one turn at a time per agent instance, instances concurrently.
//! - [`service`]: a Connection's sink (route, then store).

pub mod connector;
pub mod connectors;
pub mod dispatch;
pub mod event;
pub mod inbox;
pub mod routing;
pub mod service;
pub mod sink;

pub use connector::{ConnectorContext, ConnectorError, RunningConnector, SecretMap, StartConnector};
pub use event::{ConnectorEvent, Delivery, EventError, EventMessage};
pub use sink::{Accepted, EventSink, MemorySink, SinkError};
