//! The names of one swarm on the broker. Everything lives under
//! `gdn.<swarm>.`: messages to an instance (`to.<instance>`), to the hub
//! (`hub`), instance state (`state.<instance>`), heartbeats (`hosts`) and
//! requests to one host (`host.<id>.start|kill`). An instance's token is a
//! hash of its name, so any agent name or instance key makes a valid
//! subject token and consumer name.

use async_nats::jetstream::{self, stream};
use goondan_ipc::AgentInstance;
use sha2::{Digest as _, Sha256};

use crate::connect::NatsError;

/// The most instances of one swarm that can run at once (a consumer each
/// on the message stream).
pub const MAX_INSTANCES: i32 = 100_000;

/// One swarm's names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    token: String,
}

impl Scope {
    /// The scope of a swarm named `swarm` (its workspace id): kept
    /// `[A-Za-z0-9_-]`, every other character `_`.
    pub fn new(swarm: &str) -> Self {
        let token: String =
            swarm.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
        Self { token: if token.is_empty() { "default".to_owned() } else { token } }
    }

    /// Its token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The token of an instance: 32 hex digits of its name's SHA-256.
    pub fn instance_token(instance: &AgentInstance) -> String {
        let digest = Sha256::digest(instance.to_string().as_bytes());
        digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
    }

    /// Messages for `instance` (hub to host).
    pub fn to_instance(&self, instance: &AgentInstance) -> String {
        format!("gdn.{}.to.{}", self.token, Self::instance_token(instance))
    }

    /// Messages for the hub (hosts to hub).
    pub fn hub(&self) -> String {
        format!("gdn.{}.hub", self.token)
    }

    /// `instance`'s state log.
    pub fn state(&self, instance: &AgentInstance) -> String {
        format!("gdn.{}.state.{}", self.token, Self::instance_token(instance))
    }

    /// The hosts' heartbeats.
    pub fn hosts(&self) -> String {
        format!("gdn.{}.hosts", self.token)
    }

    /// The hub's heartbeat (hosts end the processes of a hub gone silent).
    pub fn hub_alive(&self) -> String {
        format!("gdn.{}.alive", self.token)
    }

    /// Requests to one host (`start`, `kill`).
    pub fn host(&self, host: &str, verb: &str) -> String {
        format!("gdn.{}.host.{}.{verb}", self.token, host_token(host))
    }

    /// All requests to one host.
    pub fn host_all(&self, host: &str) -> String {
        format!("gdn.{}.host.{}.*", self.token, host_token(host))
    }

    /// The stream of messages (work-queue: a message is gone once acked).
    pub fn message_stream(&self) -> String {
        format!("GDN_{}_MSG", self.token)
    }

    /// The stream of instance state.
    pub fn state_stream(&self) -> String {
        format!("GDN_{}_STATE", self.token)
    }

    /// The hub's durable consumer.
    pub fn hub_consumer(&self) -> String {
        "hub".to_owned()
    }

    /// `instance`'s durable consumer.
    pub fn instance_consumer(instance: &AgentInstance) -> String {
        format!("to-{}", Self::instance_token(instance))
    }

    /// Creates both streams, on file storage, or brings an existing one's
    /// settings up to these.
    pub async fn ensure_streams(&self, js: &jetstream::Context) -> Result<(), NatsError> {
        js.create_or_update_stream(stream::Config {
            name: self.message_stream(),
            subjects: vec![format!("gdn.{}.to.*", self.token), self.hub()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            duplicate_window: std::time::Duration::from_secs(120),
            // Work no process ever took (its instance never started again)
            // does not pile up for ever.
            max_age: std::time::Duration::from_secs(7 * 24 * 3600),
            // One consumer per running instance (and the hub's): the
            // server's default cap (1,000 since nats-server 2.15) would be
            // the swarm's.
            max_consumers: MAX_INSTANCES,
            ..Default::default()
        })
        .await
        .map_err(NatsError::js)?;
        js.create_or_update_stream(stream::Config {
            name: self.state_stream(),
            subjects: vec![format!("gdn.{}.state.*", self.token)],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            duplicate_window: std::time::Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .map_err(NatsError::js)?;
        Ok(())
    }
}

/// A host id as one subject token.
fn host_token(host: &str) -> String {
    host.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_tokens_whatever_the_names() {
        let scope = Scope::new("my.swarm with spaces");
        assert_eq!(scope.token(), "my_swarm_with_spaces");
        let instance = AgentInstance::new("wor.ker", "user:42/chat *>");
        let subject = scope.to_instance(&instance);
        assert_eq!(subject.split('.').count(), 4);
        assert!(!subject.contains(['*', '>', ' ']));
        assert_ne!(Scope::instance_token(&instance), Scope::instance_token(&AgentInstance::new("wor", "ker")));
        assert_eq!(Scope::new("").token(), "default");
    }
}
