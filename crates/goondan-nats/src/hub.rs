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
//!
//! Ownership: one task owns the registry of hosts and processes
//! ([`run_registry`], an actor like the orchestrator's hub); the heartbeat
//! listener, the hub's consumer, starts and kills send it [`Command`]s on a
//! bounded channel, and read the hosts from the snapshot it publishes. It
//! sends nothing back but replies on oneshots and per-process messages on
//! channels that never block it, so no cycle of senders can wait on itself.
//! Every task is on the launcher's tracker and ends with its token
//! ([`NatsLauncher::shutdown`], or the launcher dropped).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use futures_util::StreamExt as _;
use goondan_ipc::{
    AgentInstance, BoxFuture, ErrorInfo, InitPayload, IpcMessage, Link, LinkError, LinkReceiver, LinkSender,
};
use goondan_orchestrator::{AgentProcess, Launch, ProcessEnd, Started};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::connect::NatsError;
use crate::scope::Scope;
use crate::wire::{self, ExitNotice, Heartbeat, KillRequest, StartReply, StartRequest, publish_stored};

/// How long a killed process's host has to say it ended.
const KILL_UNANSWERED: Duration = Duration::from_secs(5);
/// The registry's queue: heartbeats, the hub's messages, starts and kills
/// wait here (the hub's consumer, and so the stream, is held back) while
/// the registry is behind.
const REGISTRY_QUEUE: usize = 1024;

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

/// A process of the registry: (instance, start).
type Key = (String, String);

/// What the hub knows of the hosts and the processes on them; owned by
/// [`run_registry`].
#[derive(Default)]
struct Registry {
    hosts: BTreeMap<String, KnownHost>,
    /// (instance, start) → the process's inbox and where it runs.
    processes: HashMap<Key, RemoteEnds>,
    /// Instance → its starts whose host was lost (their work goes to the next).
    lost: HashMap<String, Vec<String>>,
}

struct RemoteEnds {
    host: String,
    // Unbounded: the registry must never wait on one process's reader (every
    // other process's messages, and the heartbeats, would wait behind it);
    // what reaches it is what the hub's consumer took from the stream.
    messages: mpsc::UnboundedSender<IpcMessage>,
    end: Option<oneshot::Sender<ProcessEnd>>,
}

/// A host as the launcher's callers see it (the registry's snapshot).
#[derive(Debug, Clone)]
struct HostView {
    host: String,
    labels: BTreeMap<String, String>,
    placed: usize,
    hub: bool,
}

/// What the registry is asked to do.
enum Command {
    /// A host's heartbeat.
    Beat(Heartbeat),
    /// A message from a process to the hub, for its receiver.
    Deliver { key: Key, message: Box<IpcMessage> },
    /// A process's exit notice; `leaving` names its host when that host is stopping.
    Exited { key: Key, status: Option<std::process::ExitStatus>, leaving: Option<String> },
    /// A start of `agent` to place: its host chosen and the process recorded.
    Place(PlaceStart),
    /// A start that failed: ended with nothing said.
    Forget(Key),
    /// A killed process whose host said nothing within [`KILL_UNANSWERED`].
    KillUnanswered { key: Key, host: String },
}

/// A start to place.
struct PlaceStart {
    agent: String,
    /// The labels the agent asks for.
    wanted: Option<BTreeMap<String, String>>,
    /// Whether the hub's first wait for agent hosts is over: then the
    /// hub's own host, or a failure, is an answer too.
    settle: bool,
    key: Key,
    messages: mpsc::UnboundedSender<IpcMessage>,
    end: oneshot::Sender<ProcessEnd>,
    reply: oneshot::Sender<Placing>,
}

/// How a placement went.
enum Placing {
    /// On `host`; `accept` are the instance's earlier starts whose host was lost.
    Placed {
        host: String,
        accept: Vec<String>,
    },
    /// No agent host (that carries the labels) yet, in the first wait: ask again.
    NotYet,
    Failed(ErrorInfo),
}

impl Registry {
    /// Ends a process (its exit notice, or its host lost).
    fn end(&mut self, key: &Key, end: ProcessEnd) {
        if let Some(mut ends) = self.processes.remove(key) {
            if let Some(host) = self.hosts.get_mut(&ends.host) {
                host.placed = host.placed.saturating_sub(1);
            }
            if let Some(tx) = ends.end.take() {
                let _ = tx.send(end);
            }
        }
    }

    fn view(&self) -> Vec<HostView> {
        self.hosts
            .values()
            .map(|h| HostView {
                host: h.beat.host.clone(),
                labels: h.beat.labels.clone(),
                placed: h.placed,
                hub: h.beat.hub,
            })
            .collect()
    }

    /// Does `command`; whether the hosts (their beats or placements) changed.
    fn handle(&mut self, command: Command) -> bool {
        match command {
            Command::Beat(beat) => {
                match self.hosts.get_mut(&beat.host) {
                    Some(known) => {
                        known.last_seen = Instant::now();
                        known.beat = beat;
                    }
                    None => {
                        tracing::info!(target: "goondan::nats", host = %beat.host, labels = ?beat.labels, "an agent host joined");
                        self.hosts.insert(beat.host.clone(), KnownHost { beat, last_seen: Instant::now(), placed: 0 });
                    }
                }
                true
            }
            Command::Deliver { key, message } => {
                match self.processes.get(&key) {
                    Some(ends) => {
                        let _ = ends.messages.send(*message);
                    }
                    None => tracing::debug!(target: "goondan::nats", instance = %key.0, start = %key.1,
                        "a message from a start that is over; dropped"),
                }
                false
            }
            Command::Exited { key, status, leaving } => {
                let host_lost = leaving.map(|host| {
                    // Gone from placement at once, not after the lease.
                    self.hosts.remove(&host);
                    self.lost.entry(key.0.clone()).or_default().push(key.1.clone());
                    format!("its host {host} is stopping")
                });
                self.end(&key, ProcessEnd { status, host_lost });
                true
            }
            Command::Place(placement) => {
                self.place(placement);
                true
            }
            Command::Forget(key) => {
                self.end(&key, ProcessEnd::default());
                true
            }
            Command::KillUnanswered { key, host } => {
                if self.processes.contains_key(&key) {
                    let why = format!("no word from its host {host} within {KILL_UNANSWERED:?} of a kill");
                    tracing::warn!(target: "goondan::nats", instance = %key.0, "{why}");
                    self.end(&key, ProcessEnd { status: None, host_lost: None });
                }
                true
            }
        }
    }

    fn place(&mut self, placement: PlaceStart) {
        let PlaceStart { agent, wanted, settle, key, messages, end, reply } = placement;
        let chosen = self.choose(&agent, wanted.as_ref());
        let settled = matches!(chosen, Ok(Chosen::Agent(_))) || settle;
        let placing = match chosen {
            _ if !settled => Placing::NotYet,
            Err(error) => Placing::Failed(error),
            Ok(chosen) => {
                let host = chosen.into_host();
                self.processes.insert(key.clone(), RemoteEnds { host: host.clone(), messages, end: Some(end) });
                if let Some(known) = self.hosts.get_mut(&host) {
                    known.placed += 1;
                }
                let accept = self.lost.remove(&key.0).unwrap_or_default();
                Placing::Placed { host, accept }
            }
        };
        if let Err(Placing::Placed { .. }) = reply.send(placing) {
            // The start gave up waiting (its future was dropped): nothing runs.
            self.end(&key, ProcessEnd::default());
        }
    }

    /// The host a start of `agent` goes to now: labels first, then the
    /// least loaded; the hub's own host only when no agent host is heard.
    fn choose(&self, agent: &str, wanted: Option<&BTreeMap<String, String>>) -> Result<Chosen, ErrorInfo> {
        let matches = |host: &&KnownHost| {
            wanted.is_none_or(|labels| labels.iter().all(|(k, v)| host.beat.labels.get(k) == Some(v)))
        };
        let remote = self.hosts.values().filter(|h| !h.beat.hub).filter(matches);
        let pick = |hosts: &mut dyn Iterator<Item = &KnownHost>| {
            hosts.min_by_key(|h| (h.placed, h.beat.instances, h.beat.host.clone())).map(|h| h.beat.host.clone())
        };
        if let Some(host) = pick(&mut remote.into_iter()) {
            return Ok(Chosen::Agent(host));
        }
        let any_remote = self.hosts.values().any(|h| !h.beat.hub);
        if !any_remote && let Some(host) = pick(&mut self.hosts.values().filter(|h| h.beat.hub).filter(matches)) {
            return Ok(Chosen::HubOwn(host));
        }
        let heard: Vec<String> = self.hosts.values().map(|h| format!("{} {:?}", h.beat.host, h.beat.labels)).collect();
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

    /// Hosts silent for the lease are lost, and so each process on them.
    fn expire_silent(&mut self) -> bool {
        let lost: Vec<String> =
            self.hosts.values().filter(|h| h.last_seen.elapsed() > crate::LEASE).map(|h| h.beat.host.clone()).collect();
        for host in &lost {
            self.hosts.remove(host);
            let on_it: Vec<Key> =
                self.processes.iter().filter(|(_, ends)| &ends.host == host).map(|(key, _)| key.clone()).collect();
            tracing::warn!(target: "goondan::nats", %host, processes = on_it.len(), "an agent host stopped answering");
            for key in on_it {
                let why = format!("its host {host} stopped answering (no heartbeat for {:?})", crate::LEASE);
                self.lost.entry(key.0.clone()).or_default().push(key.1.clone());
                self.end(&key, ProcessEnd { status: None, host_lost: Some(why) });
            }
        }
        !lost.is_empty()
    }
}

/// The registry's task: does each command in turn and, every 100 ms, loses
/// the hosts silent for the lease — unless the hub itself was cut off from
/// the server lately (then nobody is believed lost until the hosts have had
/// a lease's time to be heard again). Ends with `cancel`, or when every
/// sender is gone; the processes' ends then close unsaid (taken as ended).
async fn run_registry(
    mut commands: mpsc::Receiver<Command>,
    client: async_nats::Client,
    hosts: watch::Sender<Vec<HostView>>,
    cancel: CancellationToken,
) {
    let mut registry = Registry::default();
    let mut connected_since = Instant::now();
    let mut was_connected = true;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        let changed = tokio::select! {
            () = cancel.cancelled() => break,
            command = commands.recv() => match command {
                Some(command) => registry.handle(command),
                None => break,
            },
            _ = tick.tick() => {
                let connected = matches!(client.connection_state(), async_nats::connection::State::Connected);
                if connected && !was_connected {
                    connected_since = Instant::now();
                }
                was_connected = connected;
                connected && connected_since.elapsed() >= crate::LEASE && registry.expire_silent()
            }
        };
        if changed {
            hosts.send_replace(registry.view());
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
    /// The registry's queue.
    registry: mpsc::Sender<Command>,
    /// The hosts, as the registry last published them.
    hosts: watch::Receiver<Vec<HostView>>,
    /// A prefix unique to this hub, so its start ids are its own.
    nonce: String,
    starts: AtomicU64,
    /// When it started: the first [`FIRST_HOST_WAIT`](crate::FIRST_HOST_WAIT)
    /// a start waits for an agent host.
    started: Instant,
    /// The launcher's tasks (the registry, the heartbeat listener and
    /// sender, the hub's consumer, kills and links in flight).
    tasks: TaskTracker,
    /// Ends them all.
    cancel: CancellationToken,
}

impl fmt::Debug for NatsLauncher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsLauncher").field("scope", &self.scope).finish_non_exhaustive()
    }
}

impl Drop for NatsLauncher {
    fn drop(&mut self) {
        self.cancel.cancel();
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
        let heartbeats = client.subscribe(scope.hosts()).await.map_err(NatsError::js)?;
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
        let tasks = TaskTracker::new();
        let cancel = CancellationToken::new();
        let (registry, commands) = mpsc::channel(REGISTRY_QUEUE);
        let (hosts_tx, hosts) = watch::channel(Vec::new());
        tasks.spawn(run_registry(commands, client.clone(), hosts_tx, cancel.clone()));
        tasks.spawn(cancel.clone().run_until_cancelled_owned(listen_heartbeats(heartbeats, registry.clone())));
        tasks.spawn(cancel.clone().run_until_cancelled_owned(say_alive(client.clone(), scope.hub_alive())));
        tasks.spawn(cancel.clone().run_until_cancelled_owned(read_hub_messages(hub_consumer, registry.clone())));
        let nonce = goondan_core::ids::new_id();
        let hub_workdir = hub_workdir.display().to_string();
        Ok(Arc::new(Self {
            client,
            js,
            scope,
            placement,
            hub_workdir,
            registry,
            hosts,
            nonce,
            starts: AtomicU64::new(0),
            started: Instant::now(),
            tasks,
            cancel,
        }))
    }

    /// Stops the launcher's tasks and waits for them: the processes it
    /// placed are then taken as ended (their ends close unsaid).
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// The hosts heard within the lease: (id, labels, processes placed).
    pub fn hosts(&self) -> Vec<(String, BTreeMap<String, String>, usize)> {
        self.hosts.borrow().iter().map(|h| (h.host.clone(), h.labels.clone(), h.placed)).collect()
    }

    /// The agent hosts heard (the hub's own aside).
    pub fn agent_hosts(&self) -> usize {
        self.hosts.borrow().iter().filter(|h| !h.hub).count()
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

    /// Places the start `key` of `agent`: its host, and the instance's
    /// earlier starts whose host was lost. In the hub's first
    /// [`FIRST_HOST_WAIT`](crate::FIRST_HOST_WAIT) it waits for an agent
    /// host that carries the agent's labels rather than fall back to the
    /// hub's own host or fail: hosts that were up before the hub are heard
    /// only at their next heartbeat.
    async fn place(
        &self,
        agent: &str,
        key: &Key,
    ) -> Result<(String, Vec<String>, mpsc::UnboundedReceiver<IpcMessage>, oneshot::Receiver<ProcessEnd>), ErrorInfo>
    {
        let stopped = || ErrorInfo::new(AGENT_UNAVAILABLE, "the hub's launcher has stopped");
        loop {
            let (messages, inbox) = mpsc::unbounded_channel();
            let (end, end_rx) = oneshot::channel();
            let (reply, placing) = oneshot::channel();
            let placement = PlaceStart {
                agent: agent.to_owned(),
                wanted: self.placement.host_labels.get(agent).cloned(),
                settle: self.started.elapsed() >= crate::FIRST_HOST_WAIT,
                key: key.clone(),
                messages,
                end,
                reply,
            };
            self.registry.send(Command::Place(placement)).await.map_err(|_| stopped())?;
            match placing.await.map_err(|_| stopped())? {
                Placing::Placed { host, accept } => return Ok((host, accept, inbox, end_rx)),
                Placing::Failed(error) => return Err(error),
                Placing::NotYet => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

impl Launch for NatsLauncher {
    fn start(&self, mut init: InitPayload, timeout: Duration) -> BoxFuture<'_, Result<Started, ErrorInfo>> {
        Box::pin(async move {
            let instance = init.instance.clone();
            let start = format!("{}-{}", self.nonce, self.starts.fetch_add(1, Ordering::Relaxed));
            let key = (instance.to_string(), start.clone());
            let (host, accept, inbox, end_rx) = self.place(&instance.agent, &key).await?;
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
                    self.forget(key).await;
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
                        &self.tasks,
                        self.js.clone(),
                        self.scope.to_instance(&instance),
                        wire::headers(&instance, &start, None),
                        format!("{start}-h"),
                    ));
                    let process = RemoteProcess {
                        client: self.client.clone(),
                        registry: self.registry.clone(),
                        tasks: self.tasks.clone(),
                        cancel: self.cancel.clone(),
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
                    self.forget(key).await;
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
    async fn forget(&self, key: Key) {
        // A stopped registry has forgotten everything already.
        let _ = self.registry.send(Command::Forget(key)).await;
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
    /// Its publishing task runs on `tasks` until the link is dropped.
    pub(crate) fn new(
        tasks: &TaskTracker,
        js: jetstream::Context,
        subject: String,
        headers: async_nats::HeaderMap,
        id_prefix: String,
    ) -> Self {
        let (queue, mut outgoing) = mpsc::channel::<Outgoing>(1024);
        tasks.spawn(async move {
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
    registry: mpsc::Sender<Command>,
    /// The launcher's tasks and token: a kill's request and its timer run there.
    tasks: TaskTracker,
    cancel: CancellationToken,
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
            self.tasks.spawn(self.cancel.clone().run_until_cancelled_owned(async move {
                if let Err(error) = client.publish(subject, body.into()).await {
                    tracing::warn!(target: "goondan::nats", "asking for a kill failed: {error}");
                }
            }));
        }
        // A kill always ends the process, as a local SIGKILL does: without
        // word from its host (gone, or the server unreachable) it is taken
        // as ended after a while, so that a stopping hub never waits for ever
        // (a stopped launcher's registry has ended it already).
        let registry = self.registry.clone();
        let key = (self.instance.to_string(), self.start.clone());
        let host = self.host.clone();
        self.tasks.spawn(self.cancel.clone().run_until_cancelled_owned(async move {
            tokio::time::sleep(KILL_UNANSWERED).await;
            let _ = registry.send(Command::KillUnanswered { key, host }).await;
        }));
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

async fn listen_heartbeats(mut beats: async_nats::Subscriber, registry: mpsc::Sender<Command>) {
    while let Some(message) = beats.next().await {
        let Ok(beat) = serde_json::from_slice::<Heartbeat>(&message.payload) else { continue };
        if registry.send(Command::Beat(beat)).await.is_err() {
            return;
        }
    }
}

/// The hub's consumer: each message to the process it names, acked once
/// handed over. A stream error (the server restarting) is waited out.
async fn read_hub_messages(consumer: consumer::PullConsumer, registry: mpsc::Sender<Command>) {
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
            let command = if wire::header(headers, wire::H_KIND) == Some("exited") {
                let notice: ExitNotice = serde_json::from_slice(&message.payload)
                    .unwrap_or(ExitNotice { wait_status: None, host_leaving: false });
                use std::os::unix::process::ExitStatusExt as _;
                let status = notice.wait_status.map(std::process::ExitStatus::from_raw);
                let leaving =
                    notice.host_leaving.then(|| wire::header(headers, wire::H_HOST).unwrap_or("its host").to_owned());
                Some(Command::Exited { key, status, leaving })
            } else {
                match wire::decode(&message.payload) {
                    Ok(ipc) => Some(Command::Deliver { key, message: Box::new(ipc) }),
                    Err(error) => {
                        tracing::warn!(target: "goondan::nats", "an unreadable message to the hub: {error}");
                        None
                    }
                }
            };
            // Handed over (in order) before the ack; a stopped registry
            // leaves it unacked, for the next hub.
            if let Some(command) = command
                && registry.send(command).await.is_err()
            {
                return;
            }
            if let Err(error) = message.ack().await {
                tracing::debug!(target: "goondan::nats", "acking a hub message: {error}");
            }
        }
    }
}
