//! What travels over the broker besides the IPC messages themselves.
//!
//! An IPC message is its JSON (the same envelope as over a socket pair),
//! with headers saying which instance and which start of it it belongs to
//! (the hub trusts the connection a message came on, here the start it was
//! registered for) and a message id (`Nats-Msg-Id`), so that a publish
//! repeated after a lost acknowledgement is stored once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use goondan_ipc::{AgentInstance, ErrorInfo, InitPayload, IpcMessage};
use serde::{Deserialize, Serialize};

/// `agent@key` of the instance a message is to or from.
pub const H_INSTANCE: &str = "Gdn-Instance";
/// The hub's id of the start (process) a message belongs to.
pub const H_START: &str = "Gdn-Start";
/// The host that sent it.
pub const H_HOST: &str = "Gdn-Host";
/// `exited` for an exit notice; absent for an IPC message.
pub const H_KIND: &str = "Gdn-Kind";

/// A host's heartbeat (core NATS, every [`crate::HEARTBEAT`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    pub host: String,
    pub labels: BTreeMap<String, String>,
    /// The host inside the hub's own process: used only when no other is.
    pub hub: bool,
    /// Agent processes it runs.
    pub instances: usize,
    pub pid: u32,
}

/// The hub asks a host to start an instance.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartRequest {
    pub start: String,
    /// Earlier starts of the instance whose host was lost: their
    /// unfinished work is the new process's (any other start's work that
    /// is still in the stream was failed by the hub and is dropped).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accept: Vec<String>,
    /// The hub's working directory: a place under it (an `agents__spawn`
    /// `cwd`) is the same place under the host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hub_workdir: Option<String>,
    /// The hub's init: the instance, the swarm, the tool timeout. Its
    /// paths are the hub's; the host uses its own bundle, state root and
    /// secrets (the hub sends none: `env` is empty).
    pub init: InitPayload,
}

/// The host's answer, once the process said `ready` (or could not).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartReply {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
}

/// The hub asks a host to kill the process of one start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KillRequest {
    pub instance: AgentInstance,
    pub start: String,
}

/// A process ended on its host (sent after everything it said).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExitNotice {
    /// Its raw wait status, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_status: Option<i32>,
    /// Its host is stopping: what it was given is left unacknowledged for
    /// the instance's next process, on another host.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_leaving: bool,
}

/// The headers of a message about `instance`'s start `start`.
pub fn headers(instance: &AgentInstance, start: &str, host: Option<&str>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(H_INSTANCE, instance.to_string().as_str());
    headers.insert(H_START, start);
    if let Some(host) = host {
        headers.insert(H_HOST, host);
    }
    headers
}

/// A header's value.
pub fn header<'a>(headers: Option<&'a HeaderMap>, name: &str) -> Option<&'a str> {
    headers?.get(name).map(|value| value.as_str())
}

/// Parses `agent@key`.
pub fn parse_instance(text: &str) -> Option<AgentInstance> {
    AgentInstance::parse(text)
}

/// An IPC message as a payload.
pub fn encode(message: &IpcMessage) -> Result<bytes::Bytes, serde_json::Error> {
    serde_json::to_vec(message).map(bytes::Bytes::from)
}

/// A payload as an IPC message.
pub fn decode(payload: &[u8]) -> Result<IpcMessage, serde_json::Error> {
    serde_json::from_slice(payload)
}

/// Publishes until the server has stored it (the same id on every try, so
/// it is stored once), for up to a minute.
pub async fn publish_stored(
    js: &async_nats::jetstream::Context,
    subject: &str,
    headers: &async_nats::HeaderMap,
    id: &str,
    payload: bytes::Bytes,
) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut delay = Duration::from_millis(50);
    loop {
        let publish = async_nats::jetstream::message::PublishMessage::build()
            .payload(payload.clone())
            .headers(headers.clone())
            .message_id(id);
        let stored = match js.send_publish(subject.to_owned(), publish).await {
            Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(error) => Err(error.to_string()),
        };
        match stored {
            Ok(()) => return true,
            Err(error) if Instant::now() >= deadline => {
                tracing::error!(target: "goondan::nats", "a message to {subject} was not stored: {error}");
                return false;
            }
            Err(error) => {
                tracing::debug!(target: "goondan::nats", "storing a message to {subject} failed ({error}); again");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Publishes to the message stream without waiting for the server to
/// store it (a failure is only logged).
pub async fn publish_unwaited(
    js: &async_nats::jetstream::Context,
    subject: String,
    headers: async_nats::HeaderMap,
    id: String,
    payload: bytes::Bytes,
) {
    let publish =
        async_nats::jetstream::message::PublishMessage::build().payload(payload).headers(headers).message_id(id);
    match js.send_publish(subject, publish).await {
        Ok(ack) => {
            // Fire and forget by design ("unwaited"): the ack only says whether to log.
            tokio::spawn(async move {
                if let Err(error) = ack.await {
                    tracing::debug!(target: "goondan::nats", "progress not stored: {error}");
                }
            });
        }
        Err(error) => tracing::debug!(target: "goondan::nats", "progress not sent: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_and_headers_round_trip() {
        let instance = AgentInstance::new("worker", "user:1@x");
        let headers = headers(&instance, "s-1", Some("h1"));
        assert_eq!(header(Some(&headers), H_START), Some("s-1"));
        assert_eq!(header(Some(&headers), H_HOST), Some("h1"));
        let parsed = header(Some(&headers), H_INSTANCE).and_then(parse_instance);
        assert_eq!(parsed, Some(instance));
        assert_eq!(header(None, H_START), None);
    }
}
