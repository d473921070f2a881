//! A Connection's [`EventSink`]: route each delivery by the Connection's
//! rules, then store it in the inbox. An event no rule matches is logged
//! and dropped here (and acknowledged: the sender has nothing to retry).

use async_trait::async_trait;

use crate::event::Delivery;
use crate::inbox::{Entry, Inbox, StoreResult};
use crate::routing::Router;
use crate::sink::{Accepted, EventSink, SinkError};

/// The sink of one running Connection.
#[derive(Debug)]
pub struct ConnectionSink {
    connector: String,
    router: Router,
    inbox: Inbox,
}

impl ConnectionSink {
    /// The sink of the Connection `router` routes for, whose Connector is `connector`.
    pub fn new(connector: &str, router: Router, inbox: Inbox) -> Self {
        Self { connector: connector.to_owned(), router, inbox }
    }
}

#[async_trait]
impl EventSink for ConnectionSink {
    async fn accept(&self, deliveries: Vec<Delivery>) -> Result<Vec<Accepted>, SinkError> {
        for delivery in &deliveries {
            delivery.check()?;
        }
        let connection = self.router.connection();
        let mut items = Vec::with_capacity(deliveries.len());
        let mut routed = Vec::with_capacity(deliveries.len());
        for delivery in deliveries {
            match self.router.route(&delivery.event) {
                Some(route) => {
                    routed.push(true);
                    items.push((delivery.key, Entry::new(connection, &self.connector, route, delivery.event)));
                }
                None => {
                    tracing::warn!(
                        connection, event = %delivery.event.name, instance_key = %delivery.event.instance_key,
                        "ingress: no ingress rule of the Connection matches the event; it is dropped"
                    );
                    self.inbox.dropped(connection, &delivery.event.name, &delivery.event.instance_key);
                    routed.push(false);
                }
            }
        }
        let mut stored =
            if items.is_empty() { Vec::new() } else { self.inbox.store(connection, items).await? }.into_iter();
        Ok(routed
            .into_iter()
            .map(|routed| match routed.then(|| stored.next()).flatten() {
                Some(StoreResult::Duplicate) => Accepted::Duplicate,
                _ => Accepted::Stored,
            })
            .collect())
    }
}
