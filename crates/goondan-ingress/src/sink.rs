//! Where connectors put their events.
//!
//! [`EventSink::accept`] returns only once the events are stored (in the
//! service, fsynced to the inbox journal); a connector acknowledges the
//! outside — the HTTP 2xx, the Telegram offset — only after that. A key
//! seen before is [`Accepted::Duplicate`]: acknowledge it again, it runs no
//! second turn.

use goondan_core::sync::LockUnpoisoned;
use std::collections::HashSet;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::event::{Delivery, EventError};

/// What became of one accepted delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// Stored; its turn will run.
    Stored,
    /// Its key was seen before: nothing new was stored.
    Duplicate,
}

/// Why deliveries were not accepted (none of the batch was stored).
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The service is stopping and accepts nothing more.
    #[error("the service is stopping and accepts no more events")]
    Closed,
    /// The inbox could not store them.
    #[error("the inbox could not store the event: {0}")]
    Storage(String),
    /// A delivery is not valid.
    #[error(transparent)]
    Invalid(#[from] EventError),
}

/// The inbox, as a connector sees it.
#[async_trait]
pub trait EventSink: Send + Sync + 'static {
    /// Stores `deliveries` (all or none, in order) and says, for each, whether
    /// it is new. Returns once they are durable.
    async fn accept(&self, deliveries: Vec<Delivery>) -> Result<Vec<Accepted>, SinkError>;

    /// [`accept`](Self::accept) for one delivery.
    async fn accept_one(&self, delivery: Delivery) -> Result<Accepted, SinkError> {
        let mut accepted = self.accept(vec![delivery]).await?;
        accepted.pop().ok_or_else(|| SinkError::Storage("the inbox answered nothing".to_owned()))
    }
}

/// An in-memory sink: keeps what it accepts, deduplicating by key. Not
/// durable; for connector tests and for embedding a connector without a
/// service.
#[derive(Debug, Default)]
pub struct MemorySink {
    state: Mutex<MemoryState>,
}

#[derive(Debug, Default)]
struct MemoryState {
    keys: HashSet<String>,
    stored: Vec<Delivery>,
    closed: bool,
}

impl MemorySink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// What it stored, in order.
    pub fn stored(&self) -> Vec<Delivery> {
        self.state.lock_unpoisoned().stored.clone()
    }

    /// From now on it refuses everything with [`SinkError::Closed`].
    pub fn close(&self) {
        self.state.lock_unpoisoned().closed = true;
    }
}

#[async_trait]
impl EventSink for MemorySink {
    async fn accept(&self, deliveries: Vec<Delivery>) -> Result<Vec<Accepted>, SinkError> {
        for delivery in &deliveries {
            delivery.check()?;
        }
        let mut state = self.state.lock_unpoisoned();
        if state.closed {
            return Err(SinkError::Closed);
        }
        let mut accepted = Vec::with_capacity(deliveries.len());
        for delivery in deliveries {
            let new = match &delivery.key {
                Some(key) => state.keys.insert(key.clone()),
                None => true,
            };
            if new {
                state.stored.push(delivery);
                accepted.push(Accepted::Stored);
            } else {
                accepted.push(Accepted::Duplicate);
            }
        }
        Ok(accepted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{ConnectorEvent, EventMessage};

    fn event() -> ConnectorEvent {
        ConnectorEvent {
            name: "n".into(),
            message: EventMessage::text("t"),
            properties: Default::default(),
            instance_key: "k".into(),
        }
    }

    #[tokio::test]
    async fn a_key_is_stored_once_and_unkeyed_events_always() -> Result<(), SinkError> {
        let sink = MemorySink::new();
        assert_eq!(sink.accept_one(Delivery::keyed("a", event())).await?, Accepted::Stored);
        assert_eq!(sink.accept_one(Delivery::keyed("a", event())).await?, Accepted::Duplicate);
        assert_eq!(sink.accept_one(Delivery::unkeyed(event())).await?, Accepted::Stored);
        assert_eq!(sink.accept_one(Delivery::unkeyed(event())).await?, Accepted::Stored);
        assert_eq!(sink.stored().len(), 3);
        sink.close();
        assert!(matches!(sink.accept_one(Delivery::unkeyed(event())).await, Err(SinkError::Closed)));
        Ok(())
    }
}
