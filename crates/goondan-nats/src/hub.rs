//! The hub's side: [`NatsLauncher`], the orchestrator's [`Launch`] over
//! the broker.
//!
//! It listens to the hosts' heartbeats and keeps who is alive and what
//! they run; a start is placed on one (labels first, then the least
//! loaded, a host inside the hub's own process only when no other is),
//! asked over a request to that host, and answered once the process there
//! is ready. What the process says arrives on the hub's durable consumer
//! and is handed to the process's receiver by its start id; its exit
//! notice ends it. A host silent for [`LEASE`](crate::LEASE) while the hub
//! itself is connected is lost: each of its processes ends with
//! `host_lost`, and the orchestrator starts the instance elsewhere, where
//! the unacknowledged work is delivered again.

use goondan_core::sync::LockUnpoisoned;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use futures_util::StreamExt as _;
use goondan_ipc::{
    AgentInstance, BoxFuture, ErrorInfo, InitPayload, IpcMessage, Link, LinkError, LinkReceiver, LinkSender,
};
use goondan_orchestrator::{AgentProcess, Launch, ProcessEnd, Started};
use tokio::sync::{mpsc, oneshot};

use crate::connect::NatsError;
use crate::scope::Scope;
use crate::wire::{self, ExitNotice, Heartbeat, KillRequest, StartReply, StartRequest, publish_stored};

/// How long a killed process's host has to say it ended.
const KILL_UNANSWERED: Duration = Duration::from_secs(5);

/// Error codes of goondan-ipc's.
const AGENT_UNAVAILABLE: &str = goondan_ipc::codes::AGENT_UNAVAILABLE;
const AGENT_NO_HOST: &str = goondan_ipc::codes::AGENT_NO_HOST;

/// Which hosts an agent may run on: the labels they must carry.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    /// Agent name → labels (`spec.placement.hostLabels`).
    pub host_labels: BTreeMap<String, BTreeMap<String, String>>,
}

/// Where a start can go.
enum Chosen {
    /// An agent host (`gdn host`).
    Agent(String),
    /// The host inside the hub's own process: only while no agent host is heard.
    HubOwn(String),
}

impl Chosen {
    fn into_host(self) -> String {
        match self {
            Self::Agent(host) | Self::HubOwn(host) => host,
        }
    }
}

/// A host the hub has heard.
#[derive(Debug, Clone)]
struct KnownHost {
    beat: Heartbeat,
    last_seen: Instant,
    /// Starts placed on it and not ended.
    placed: usize,
}

/// What the hub knows of the hosts and the processes on them.
#[derive(Default)]
struct Registry {
    hosts: BTreeMap<String, KnownHost>,
    /// (instance, start) → the process's inbox and where it runs.
    processes: HashMap<(String, String), RemoteEnds>,
    /// Instance → its starts whose host was lost (their work goes to the next).
    lost: HashMap<String, Vec<String>>,
}

struct RemoteEnds {
    host: String,
    messages: mpsc::UnboundedSender<IpcMessage>,
    end: Option<oneshot::Sender<ProcessEnd>>,
}

impl Registry {
    /// Ends a process (its exit notice, or its host lost).
    fn end(&mut self, key: &(String, String), end: ProcessEnd) {
        if let Some(mut ends) = self.processes.remove(key) {
            if let Some(host) = self.hosts.get_mut(&ends.host) {
                host.placed = host.placed.saturating_sub(1);
            }
            if let Some(tx) = ends.end.take() {
                let _ = tx.send(end);
            }
        }
    }
}

/// The orchestrator's launcher over NATS.
pub struct NatsLauncher {
    client: async_nats::Client,
    js: jetstream::Context,
    scope: Scope,
    placement: Placement,
    hub_workdir: String,
    registry: Arc<Mutex<Registry>>,
    /// A prefix unique to this hub, so its start ids are its own.
    nonce: String,
    starts: AtomicU64,
    /// When it started: the first [`FIRST_HOST_WAIT`](crate::FIRST_HOST_WAIT)
    /// a start waits for an agent host.
    started: Instant,
}

impl fmt::Debug for NatsLauncher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsLauncher").field("scope", &self.scope).finish_non_exhaustive()
    }
}

impl NatsLauncher {
    /// Sets up the swarm's streams, the hub's consumer and the heartbeat
    /// listener on the current runtime.
    pub async fn start(
        client: async_nats::Client,
        scope: Scope,
        placement: Placement,
        hub_workdir: &std::path::Path,
    ) -> Result<Arc<Self>, NatsError> {
        let js = jetstream::new(client.clone());
        scope.ensure_streams(&js).await?;
        let registry = Arc::new(Mutex::new(Registry::default()));
        let heartbeats = client.subscribe(scope.hosts()).await.map_err(NatsError::js)?;
        tokio::spawn(listen_heartbeats(heartbeats, Arc::clone(&registry)));
        tokio::spawn(watch_hosts(client.clone(), Arc::clone(&registry)));
        tokio::spawn(say_alive(client.clone(), scope.hub_alive()));
        let stream = js.get_stream(scope.message_stream()).await.map_err(NatsError::js)?;
        let hub_consumer: consumer::PullConsumer = stream
            .get_or_create_consumer(
                &scope.hub_consumer(),
                consumer::pull::Config {
                    durable_name: Some(scope.hub_consumer()),
                    filter_subject: scope.hub(),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: Duration::from_secs(30),
                    ..Default::default()
                },
            )
            .await
            .map_err(NatsError::js)?;
        tokio::spawn(read_hub_messages(hub_consumer, Arc::clone(&registry)));
        let nonce = goondan_core::ids::new_id();
        let hub_workdir = hub_workdir.display().to_string();
        Ok(Arc::new(Self {
            client,
            js,
            scope,
            placement,
            hub_workdir,
            registry,
            nonce,
            starts: AtomicU64::new(0),
            started: Instant::now(),
        }))
    }

    /// The hosts heard within the lease: (id, labels, processes placed).
    pub fn hosts(&self) -> Vec<(String, BTreeMap<String, String>, usize)> {
        let registry = self.registry.lock_unpoisoned();
        registry.hosts.values().map(|h| (h.beat.host.clone(), h.beat.labels.clone(), h.placed)).collect()
    }

    /// The agent hosts heard (the hub's own aside).
    pub fn agent_hosts(&self) -> usize {
        let registry = self.registry.lock_unpoisoned();
        registry.hosts.values().filter(|h| !h.beat.hub).count()
    }

    /// Waits until at least `count` hosts other than the hub's own are heard.
    pub async fn wait_for_hosts(&self, count: usize, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            let heard = self.agent_hosts();
            if heard >= count {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The host a start of `agent` goes to. In the hub's first
    /// [`FIRST_HOST_WAIT`](crate::FIRST_HOST_WAIT) it waits for an agent
    /// host that carries the agent's labels rather than fall back to the
    /// hub's own host or fail: hosts that were up before the hub are heard
    /// only at their next heartbeat.
    async fn choose_waiting(&self, agent: &str) -> Result<String, ErrorInfo> {
        loop {
            let chosen = self.choose(agent);
            let settled = matches!(chosen, Ok(Chosen::Agent(_))) || self.started.elapsed() >= crate::FIRST_HOST_WAIT;
            if settled {
                return chosen.map(Chosen::into_host);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The host a start of `agent` goes to now.
    fn choose(&self, agent: &str) -> Result<Chosen, ErrorInfo> {
        let wanted = self.placement.host_labels.get(agent);
        let registry = self.registry.lock_unpoisoned();
        let matches = |host: &&KnownHost| {
            wanted.is_none_or(|labels| labels.iter().all(|(k, v)| host.beat.labels.get(k) == Some(v)))
        };
        let remote = registry.hosts.values().filter(|h| !h.beat.hub).filter(matches);
        let pick = |hosts: &mut dyn Iterator<Item = &KnownHost>| {
            hosts.min_by_key(|h| (h.placed, h.beat.instances, h.beat.host.clone())).map(|h| h.beat.host.clone())
        };
        if let Some(host) = pick(&mut remote.into_iter()) {
            return Ok(Chosen::Agent(host));
        }
        let any_remote = registry.hosts.values().any(|h| !h.beat.hub);
        if !any_remote && let Some(host) = pick(&mut registry.hosts.values().filter(|h| h.beat.hub).filter(matches)) {
            return Ok(Chosen::HubOwn(host));
        }
        let heard: Vec<String> =
            registry.hosts.values().map(|h| format!("{} {:?}", h.beat.host, h.beat.labels)).collect();
        Err(match wanted {
            Some(labels) => ErrorInfo::new(
                AGENT_NO_HOST,
                format!("no agent host carries the labels {labels:?} that {agent} asks for (hosts: {heard:?})"),
            )
            .suggest(
                "Start one: gdn host --nats URL --label KEY=VALUE …, or change the Agent's spec.placement.hostLabels.",
            ),
            None => ErrorInfo::new(AGENT_NO_HOST, format!("no agent host is connected to run {agent}"))
                .suggest("Start one: gdn -c BUNDLE host --nats URL"),
        })
    }
}

impl Launch for NatsLauncher {
    fn start(&self, mut init: InitPayload, timeout: Duration) -> BoxFuture<'_, Result<Started, ErrorInfo>> {
        Box::pin(async move {
            let instance = init.instance.clone();
            let host = self.choose_waiting(&instance.agent).await?;
            let start = format!("{}-{}", self.nonce, self.starts.fetch_add(1, Ordering::Relaxed));
            let key = (instance.to_string(), start.clone());
            let (messages, inbox) = mpsc::unbounded_channel();
            let (end_tx, end_rx) = oneshot::channel();
            let accept = {
                let mut registry = self.registry.lock_unpoisoned();
                registry.processes.insert(key.clone(), RemoteEnds { host: host.clone(), messages, end: Some(end_tx) });
                if let Some(known) = registry.hosts.get_mut(&host) {
                    known.placed += 1;
                }
                registry.lost.remove(&key.0).unwrap_or_default()
            };
            // The hub's secrets stay here: the host reads its own.
            init.env.clear();
            let request = StartRequest {
                start: start.clone(),
                accept: accept.clone(),
                hub_workdir: Some(self.hub_workdir.clone()),
                init,
            };
            let unavailable = |why: String| ErrorInfo::new(AGENT_UNAVAILABLE, why);
            let reply = match serde_json::to_vec(&request) {
                Ok(body) => {
                    tokio::time::timeout(timeout, self.client.request(self.scope.host(&host, "start"), body.into()))
                        .await
                }
                Err(error) => {
                    self.forget(&key);
                    return Err(unavailable(format!("encoding the start of {instance}: {error}")));
                }
            };
            let reply: StartReply = match reply {
                Ok(Ok(message)) => match serde_json::from_slice(&message.payload) {
                    Ok(reply) => reply,
                    Err(error) => StartReply {
                        pid: None,
                        error: Some(unavailable(format!("host {host} answered the start of {instance} with {error}"))),
                    },
                },
                Ok(Err(error)) => StartReply {
                    pid: None,
                    error: Some(unavailable(format!("host {host} did not take the start of {instance}: {error}"))),
                },
                Err(_) => StartReply {
                    pid: None,
                    error: Some(unavailable(format!("host {host} did not start {instance} within {timeout:?}"))),
                },
            };
            match (reply.pid, reply.error) {
                (Some(pid), None) => {
                    let link: LinkSender = Arc::new(NatsLink::new(
                        self.js.clone(),
                        self.scope.to_instance(&instance),
                        wire::headers(&instance, &start, None),
                        format!("{start}-h"),
                    ));
                    let process = RemoteProcess {
                        client: self.client.clone(),
                        registry: Arc::clone(&self.registry),
                        kill_subject: self.scope.host(&host, "kill"),
                        instance,
                        start,
                        host,
                        end: end_rx,
                        ended: None,
                    };
                    Ok(Started { link, receiver: Box::new(ChannelReceiver(inbox)), process: Box::new(process), pid })
                }
                (_, error) => {
                    // The hub fails what the lost starts served (the start
                    // failed): their work left in the stream is dropped by
                    // the next start, which does not accept them.
                    self.forget(&key);
                    // A host that started it after all (too late for the
                    // timeout) stops it.
                    let kill = KillRequest { instance: instance.clone(), start };
                    if let Ok(body) = serde_json::to_vec(&kill)
                        && let Err(error) = self.client.publish(self.scope.host(&host, "kill"), body.into()).await
                    {
                        tracing::debug!(target: "goondan::nats", "asking {host} to drop a failed start: {error}");
                    }
                    Err(error.unwrap_or_else(|| unavailable(format!("host {host} could not start {instance}"))))
                }
            }
        })
    }
}

impl NatsLauncher {
    fn forget(&self, key: &(String, String)) {
        let mut registry = self.registry.lock_unpoisoned();
        registry.end(key, ProcessEnd::default());
    }
}

/// Messages to one instance: JetStream publishes to its subject, in order,
/// each stored (acknowledged by the server) before the next is sent.
pub(crate) struct NatsLink {
    queue: mpsc::Sender<Outgoing>,
}

enum Outgoing {
    Message(bytes::Bytes),
    Flush(oneshot::Sender<()>),
}

impl fmt::Debug for NatsLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsLink").finish_non_exhaustive()
    }
}

impl NatsLink {
    /// A link publishing to `subject` with `headers`; message ids are
    /// `<id_prefix>-<n>`.
    pub(crate) fn new(
        js: jetstream::Context,
        subject: String,
        headers: async_nats::HeaderMap,
        id_prefix: String,
    ) -> Self {
        let (queue, mut outgoing) = mpsc::channel::<Outgoing>(1024);
        tokio::spawn(async move {
            let mut sent = 0u64;
            while let Some(next) = outgoing.recv().await {
                match next {
                    Outgoing::Message(payload) => {
                        sent += 1;
                        let id = format!("{id_prefix}-{sent}");
                        publish_stored(&js, &subject, &headers, &id, payload).await;
                    }
                    Outgoing::Flush(done) => {
                        let _ = done.send(());
                    }
                }
            }
        });
        Self { queue }
    }
}

impl Link for NatsLink {
    fn send(&self, message: IpcMessage) -> BoxFuture<'_, Result<(), LinkError>> {
        Box::pin(async move {
            let payload = wire::encode(&message).map_err(|_| LinkError::Closed)?;
            if payload.len() > goondan_ipc::MAX_FRAME_BYTES {
                return Err(LinkError::Frame(goondan_ipc::FrameError::TooLarge { size: payload.len() }));
            }
            self.queue.send(Outgoing::Message(payload)).await.map_err(|_| LinkError::Closed)
        })
    }

    fn flush(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let (done, flushed) = oneshot::channel();
            if self.queue.send(Outgoing::Flush(done)).await.is_ok() {
                let _ = flushed.await;
            }
        })
    }
}

/// A receiver fed by a channel.
#[derive(Debug)]
pub(crate) struct ChannelReceiver(pub(crate) mpsc::UnboundedReceiver<IpcMessage>);

impl LinkReceiver for ChannelReceiver {
    fn recv(&mut self) -> BoxFuture<'_, Result<Option<IpcMessage>, LinkError>> {
        Box::pin(async move { Ok(self.0.recv().await) })
    }
}

/// A process on another host.
struct RemoteProcess {
    client: async_nats::Client,
    registry: Arc<Mutex<Registry>>,
    kill_subject: String,
    instance: AgentInstance,
    start: String,
    host: String,
    end: oneshot::Receiver<ProcessEnd>,
    ended: Option<ProcessEnd>,
}

impl fmt::Debug for RemoteProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteProcess").field("instance", &self.instance).field("host", &self.host).finish()
    }
}

impl AgentProcess for RemoteProcess {
    fn wait(&mut self) -> BoxFuture<'_, ProcessEnd> {
        Box::pin(async move {
            if let Some(end) = &self.ended {
                return end.clone();
            }
            let end = (&mut self.end).await.unwrap_or_default();
            self.ended = Some(end.clone());
            end
        })
    }

    fn start_kill(&mut self) {
        let request = KillRequest { instance: self.instance.clone(), start: self.start.clone() };
        let (client, subject) = (self.client.clone(), self.kill_subject.clone());
        if let Ok(body) = serde_json::to_vec(&request) {
            tokio::spawn(async move {
                if let Err(error) = client.publish(subject, body.into()).await {
                    tracing::warn!(target: "goondan::nats", "asking for a kill failed: {error}");
                }
            });
        }
        // A kill always ends the process, as a local SIGKILL does: without
        // word from its host (gone, or the server unreachable) it is taken
        // as ended after a while, so that a stopping hub never waits for ever.
        let registry = Arc::clone(&self.registry);
        let key = (self.instance.to_string(), self.start.clone());
        let host = self.host.clone();
        tokio::spawn(async move {
            tokio::time::sleep(KILL_UNANSWERED).await;
            let mut registry = registry.lock_unpoisoned();
            if registry.processes.contains_key(&key) {
                let why = format!("no word from its host {host} within {KILL_UNANSWERED:?} of a kill");
                tracing::warn!(target: "goondan::nats", instance = %key.0, "{why}");
                registry.end(&key, ProcessEnd { status: None, host_lost: None });
            }
        });
    }
}

/// The hub's own heartbeat, for as long as the runtime runs it.
async fn say_alive(client: async_nats::Client, subject: String) {
    let mut tick = tokio::time::interval(crate::HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        if let Err(error) = client.publish(subject.clone(), bytes::Bytes::new()).await {
            tracing::debug!(target: "goondan::nats", "the hub's heartbeat: {error}");
        }
    }
}

async fn listen_heartbeats(mut beats: async_nats::Subscriber, registry: Arc<Mutex<Registry>>) {
    while let Some(message) = beats.next().await {
        let Ok(beat) = serde_json::from_slice::<Heartbeat>(&message.payload) else { continue };
        let mut registry = registry.lock_unpoisoned();
        match registry.hosts.get_mut(&beat.host) {
            Some(known) => {
                known.last_seen = Instant::now();
                known.beat = beat;
            }
            None => {
                tracing::info!(target: "goondan::nats", host = %beat.host, labels = ?beat.labels, "an agent host joined");
                registry.hosts.insert(beat.host.clone(), KnownHost { beat, last_seen: Instant::now(), placed: 0 });
            }
        }
    }
}

/// Every 100 ms: hosts silent for the lease are lost — unless the hub
/// itself was cut off from the server lately (then nobody is believed lost
/// until the hosts have had a lease's time to be heard again).
async fn watch_hosts(client: async_nats::Client, registry: Arc<Mutex<Registry>>) {
    let mut connected_since = Instant::now();
    let mut was_connected = true;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tick.tick().await;
        let connected = matches!(client.connection_state(), async_nats::connection::State::Connected);
        if connected && !was_connected {
            connected_since = Instant::now();
        }
        was_connected = connected;
        if !connected || connected_since.elapsed() < crate::LEASE {
            continue;
        }
        let mut registry = registry.lock_unpoisoned();
        let lost: Vec<String> = registry
            .hosts
            .values()
            .filter(|h| h.last_seen.elapsed() > crate::LEASE)
            .map(|h| h.beat.host.clone())
            .collect();
        for host in lost {
            registry.hosts.remove(&host);
            let on_it: Vec<(String, String)> =
                registry.processes.iter().filter(|(_, ends)| ends.host == host).map(|(key, _)| key.clone()).collect();
            tracing::warn!(target: "goondan::nats", %host, processes = on_it.len(), "an agent host stopped answering");
            for key in on_it {
                let why = format!("its host {host} stopped answering (no heartbeat for {:?})", crate::LEASE);
                registry.lost.entry(key.0.clone()).or_default().push(key.1.clone());
                registry.end(&key, ProcessEnd { status: None, host_lost: Some(why) });
            }
        }
    }
}

/// The hub's consumer: each message to the process it names, acked once
/// handed over. A stream error (the server restarting) is waited out.
async fn read_hub_messages(consumer: consumer::PullConsumer, registry: Arc<Mutex<Registry>>) {
    loop {
        let mut messages = match consumer.messages().await {
            Ok(messages) => messages,
            Err(error) => {
                tracing::debug!(target: "goondan::nats", "the hub's consumer: {error}; again");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        while let Some(next) = messages.next().await {
            let message = match next {
                Ok(message) => message,
                Err(error) => {
                    tracing::debug!(target: "goondan::nats", "the hub's consumer: {error}");
                    continue;
                }
            };
            let headers = message.headers.as_ref();
            let instance = wire::header(headers, wire::H_INSTANCE).unwrap_or_default().to_owned();
            let start = wire::header(headers, wire::H_START).unwrap_or_default().to_owned();
            let key = (instance, start);
            if wire::header(headers, wire::H_KIND) == Some("exited") {
                let notice: ExitNotice = serde_json::from_slice(&message.payload)
                    .unwrap_or(ExitNotice { wait_status: None, host_leaving: false });
                use std::os::unix::process::ExitStatusExt as _;
                let status = notice.wait_status.map(std::process::ExitStatus::from_raw);
                let mut registry = registry.lock_unpoisoned();
                let host_lost = if notice.host_leaving {
                    let host = wire::header(headers, wire::H_HOST).unwrap_or("its host").to_owned();
                    // Gone from placement at once, not after the lease.
                    registry.hosts.remove(&host);
                    registry.lost.entry(key.0.clone()).or_default().push(key.1.clone());
                    Some(format!("its host {host} is stopping"))
                } else {
                    None
                };
                registry.end(&key, ProcessEnd { status, host_lost });
            } else {
                match wire::decode(&message.payload) {
                    Ok(ipc) => {
                        let registry = registry.lock_unpoisoned();
                        match registry.processes.get(&key) {
                            Some(ends) => {
                                let _ = ends.messages.send(ipc);
                            }
                            None => tracing::debug!(target: "goondan::nats", instance = %key.0, start = %key.1,
                                "a message from a start that is over; dropped"),
                        }
                    }
                    Err(error) => tracing::warn!(target: "goondan::nats", "an unreadable message to the hub: {error}"),
                }
            }
            if let Err(error) = message.ack().await {
                tracing::debug!(target: "goondan::nats", "acking a hub message: {error}");
            }
        }
    }
}
