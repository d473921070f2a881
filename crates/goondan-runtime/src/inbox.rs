//! Messages that arrive for an agent while it runs — the replies to its
//! asynchronous `agents__request`s — and enter its conversation before the
//! next model request.
//!
//! The turn's step core drains the inbox right before it builds a model
//! request, so a reply that arrives mid-turn is seen at the next step. One
//! that arrives while no turn runs is appended by whoever owns the
//! conversation (the agent process does it at once and commits it, so it is
//! durable and the next turn sees it).

use goondan_core::sync::LockUnpoisoned;
use std::sync::Mutex;

use goondan_core::Message;
use tokio::sync::Notify;

/// A queue of messages for one agent instance, shared between the turn and
/// whoever receives the messages.
#[derive(Debug, Default)]
pub struct Inbox {
    messages: Mutex<Vec<Message>>,
    arrived: Notify,
}

impl Inbox {
    /// Queues a message and wakes a waiter of [`Inbox::arrived`].
    pub fn push(&self, message: Message) {
        self.messages.lock_unpoisoned().push(message);
        self.arrived.notify_one();
    }

    /// Takes every queued message, oldest first.
    pub fn take(&self) -> Vec<Message> {
        std::mem::take(&mut *self.messages.lock_unpoisoned())
    }

    /// Keeps only the queued messages `keep` says yes to.
    pub fn retain(&self, keep: impl FnMut(&Message) -> bool) {
        self.messages.lock_unpoisoned().retain(keep);
    }

    /// What `look` finds in the queued messages, oldest first (nothing is taken).
    pub fn find_in_queued<T>(&self, look: impl FnMut(&Message) -> Option<T>) -> Vec<T> {
        self.messages.lock_unpoisoned().iter().filter_map(look).collect()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.messages.lock_unpoisoned().is_empty()
    }

    /// Resolves when a message was pushed since the last time it resolved
    /// (one permit: a push before the wait is not missed).
    pub async fn arrived(&self) {
        self.arrived.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use goondan_core::{MessageData, MessageSource};

    use super::*;

    #[tokio::test]
    async fn a_push_before_waiting_is_not_missed() {
        let inbox = Inbox::default();
        inbox.push(Message::new(MessageData::User { content: "reply".into() }, MessageSource::User));
        inbox.arrived().await;
        let taken = inbox.take();
        assert_eq!(taken.len(), 1);
        assert!(inbox.is_empty());
    }
}
