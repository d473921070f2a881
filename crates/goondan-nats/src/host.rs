//! The agent host (`gdn host`, and the one inside the hub's process for
//! when no other is connected).
//!
//! It says it is alive every [`HEARTBEAT`](crate::HEARTBEAT) and takes
//! the hub's requests on its own subjects: `start` (claim the instance's
//! state, take its consumer, start the agent process here exactly as `gdn
//! run` does, answer once it is ready) and `kill`. For each process it
//! runs a bridge:
//!
//! ```text
//! broker (the instance's durable consumer) ─► bridge ─► agent process (socket pair)
//!   control messages of another start are dropped; a request gets a
//!   delivery key (its correlation id) so that one delivered again after
//!   a host's death is answered from the conversation, not run twice
//! agent process ─► bridge ─► broker (the hub's subject, stored before the next)
//!   at an answer or once idle, the instance's state is synced first
//!   (fenced: refused once another host has claimed it — the process is
//!   then killed and nothing more is sent); then the request it answers is
//!   acknowledged; every 250 ms what changed is synced too
//! the process ends ─► what it said, a last sync, everything it was given
//!   acknowledged (the hub fails what it served, as on one machine), then
//!   the exit notice; a host that is stopping acknowledges nothing and says
//!   so in the notice, and the hub moves the instance to another host
//! ```
//!
//! A host that dies acknowledges nothing: its instances' unfinished work
//! stays in their consumers and goes to the process the hub starts
//! elsewhere.

use goondan_core::sync::LockUnpoisoned;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use futures_util::StreamExt as _;
use goondan_ipc::{AgentInstance, ErrorInfo, InitPayload, IpcMessage, ObservePayload};
use goondan_orchestrator::{AgentLauncher, Launch as _, Started};
use serde_json::Value as JsonValue;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::connect::NatsError;
use crate::replica::{Replica, ReplicaError};
use crate::scope::Scope;
use crate::wire::{
    self, ExitNotice, Heartbeat, KillRequest, StartReply, StartRequest, publish_stored, publish_unwaited,
};

/// Turns the hub's init into this host's: its bundle, state root and
/// secrets, and its working directory (with the place under it the init's
/// `workdir` names relative to the hub's, if any).
pub type Localize = Arc<dyn Fn(InitPayload) -> InitPayload + Send + Sync>;
/// Where an instance's state lives on this host.
pub type InstanceDir = Arc<dyn Fn(&AgentInstance) -> Option<PathBuf> + Send + Sync>;

/// How a host runs.
#[derive(Clone)]
pub struct HostConfig {
    pub scope: Scope,
    /// Its id (unique among the swarm's hosts).
    pub host_id: String,
    pub labels: BTreeMap<String, String>,
    /// The host inside the hub's process.
    pub hub: bool,
    pub launcher: AgentLauncher,
    pub localize: Localize,
    pub instance_dir: InstanceDir,
    pub start_timeout: Duration,
    /// How long the broker waits for a message's acknowledgement before it
    /// delivers it again. Work a process holds longer (a long turn, an
    /// answer not yet saved) is kept from that by progress acknowledgements
    /// at a third of it.
    pub ack_wait: Duration,
}

impl fmt::Debug for HostConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostConfig")
            .field("scope", &self.scope)
            .field("host_id", &self.host_id)
            .field("labels", &self.labels)
            .field("hub", &self.hub)
            .finish_non_exhaustive()
    }
}

/// How a process is to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// SIGKILL now (the hub asked, after its grace period).
    Kill,
    /// Its channel closed: it cancels its turn, ends its tools' processes
    /// and exits, as when its orchestrator dies on one machine; SIGKILL
    /// after [`CLOSE_GRACE`].
    Close,
    /// As `Close`, because this host is leaving: the work it was given is
    /// not acknowledged, and the exit notice asks the hub to move the
    /// instance (its turn continues elsewhere from its last commit).
    Leave,
}

/// How long a process whose channel was closed may take to exit.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// A process this host runs.
struct Here {
    start: String,
    kill: Option<oneshot::Sender<Stop>>,
    done: watch::Receiver<bool>,
}

struct Inner {
    client: async_nats::Client,
    js: jetstream::Context,
    config: HostConfig,
    running: Mutex<HashMap<AgentInstance, Here>>,
    max_payload: usize,
    /// When the hub was last heard (its own host's heartbeat, or a start).
    hub_heard: Mutex<Option<Instant>>,
    /// Starts the hub gave up on before they were ready.
    abandoned: Mutex<std::collections::HashSet<String>>,
    /// Bumped when this host may have missed what happened meanwhile (it
    /// reconnected, or was held up): each bridge checks it still holds its
    /// instance.
    recheck: watch::Sender<u64>,
    /// The starts under way and the bridges of the processes: [`Host::stop`]
    /// waits for them.
    work: TaskTracker,
    /// Cancelled when the host stops: a start that gets this far after it
    /// kills its process instead of running it.
    stopping: CancellationToken,
}

/// A running agent host.
pub struct Host {
    inner: Arc<Inner>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl fmt::Debug for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Host").field("config", &self.inner.config).finish_non_exhaustive()
    }
}

impl Host {
    /// Joins the swarm: streams checked, requests taken, heartbeats sent.
    pub async fn start(client: async_nats::Client, config: HostConfig) -> Result<Self, NatsError> {
        let js = jetstream::new(client.clone());
        config.scope.ensure_streams(&js).await?;
        let requests = client.subscribe(config.scope.host_all(&config.host_id)).await.map_err(NatsError::js)?;
        let max_payload = client.server_info().max_payload;
        let beats = client.subscribe(config.scope.hub_alive()).await.map_err(NatsError::js)?;
        let inner = Arc::new(Inner {
            client,
            js,
            config,
            running: Mutex::new(HashMap::new()),
            max_payload,
            hub_heard: Mutex::new(None),
            recheck: watch::channel(0).0,
            abandoned: Mutex::new(std::collections::HashSet::new()),
            work: TaskTracker::new(),
            stopping: CancellationToken::new(),
        });
        let tasks = vec![
            tokio::spawn(heartbeats(Arc::clone(&inner))),
            tokio::spawn(take_requests(Arc::clone(&inner), requests)),
            tokio::spawn(listen_for_the_hub(Arc::clone(&inner), beats)),
        ];
        tracing::info!(target: "goondan::nats", host = %inner.config.host_id, labels = ?inner.config.labels, "agent host ready");
        Ok(Self { inner, tasks })
    }

    /// Agent processes it runs now.
    pub fn running(&self) -> usize {
        self.inner.running.lock_unpoisoned().len()
    }

    /// Stops taking starts and heartbeating, kills its processes and waits
    /// until their bridges are through (their work then goes elsewhere),
    /// and the starts that were under way with them.
    pub async fn stop(&mut self) {
        // Before the processes are collected: a start not yet among them
        // sees it and does not run its process.
        self.inner.stopping.cancel();
        for task in self.tasks.drain(..) {
            task.abort();
        }
        let waits: Vec<watch::Receiver<bool>> = {
            let mut running = self.inner.running.lock_unpoisoned();
            running
                .values_mut()
                .map(|here| {
                    if let Some(kill) = here.kill.take() {
                        let _ = kill.send(Stop::Leave);
                    }
                    here.done.clone()
                })
                .collect()
        };
        for mut done in waits {
            let _ = tokio::time::timeout(Duration::from_secs(10), done.wait_for(|d| *d)).await;
        }
        self.inner.work.close();
        if tokio::time::timeout(Duration::from_secs(10), self.inner.work.wait()).await.is_err() {
            tracing::warn!(target: "goondan::nats", "starts or bridges of this host did not end within 10 s of its stop");
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Notes the hub's heartbeats.
async fn listen_for_the_hub(inner: Arc<Inner>, mut beats: async_nats::Subscriber) {
    while beats.next().await.is_some() {
        *inner.hub_heard.lock_unpoisoned() = Some(Instant::now());
    }
}

/// The processes of a hub that is gone end, as they would with their
/// orchestrator on one machine: once the hub has been silent for the
/// lease while this host was connected. Their unfinished work stays in
/// the broker for the next hub's processes.
fn stop_orphans(inner: &Inner, connected_since: Instant) {
    if inner.config.hub || connected_since.elapsed() < crate::LEASE {
        return;
    }
    let silent = inner.hub_heard.lock_unpoisoned().is_some_and(|at| at.elapsed() > crate::LEASE);
    if !silent {
        return;
    }
    let mut running = inner.running.lock_unpoisoned();
    let mut stopped = 0;
    for here in running.values_mut() {
        if let Some(kill) = here.kill.take() {
            let _ = kill.send(Stop::Close);
            stopped += 1;
        }
    }
    if stopped > 0 {
        tracing::warn!(target: "goondan::nats", stopped, "the hub stopped answering; its agent processes here end");
    }
}

async fn heartbeats(inner: Arc<Inner>) {
    let mut tick = tokio::time::interval(crate::HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut connected_since = Instant::now();
    let mut was_connected = true;
    let mut last_tick = Instant::now();
    loop {
        tick.tick().await;
        let connected = matches!(inner.client.connection_state(), async_nats::connection::State::Connected);
        // A host that was itself held up (stopped, starved) has not been
        // listening: the hub's silence is not measured over that time.
        let paused = last_tick.elapsed() > crate::HEARTBEAT * 3;
        last_tick = Instant::now();
        if (connected && !was_connected) || paused {
            connected_since = Instant::now();
            inner.recheck.send_modify(|n| *n += 1);
        }
        was_connected = connected;
        if connected {
            stop_orphans(&inner, connected_since);
        }
        let beat = Heartbeat {
            host: inner.config.host_id.clone(),
            labels: inner.config.labels.clone(),
            hub: inner.config.hub,
            instances: inner.running.lock_unpoisoned().len(),
            pid: std::process::id(),
        };
        if let Ok(body) = serde_json::to_vec(&beat)
            && let Err(error) = inner.client.publish(inner.config.scope.hosts(), body.into()).await
        {
            tracing::debug!(target: "goondan::nats", "heartbeat: {error}");
        }
    }
}

async fn take_requests(inner: Arc<Inner>, mut requests: async_nats::Subscriber) {
    while let Some(message) = requests.next().await {
        let verb = message.subject.rsplit('.').next().unwrap_or_default().to_owned();
        match verb.as_str() {
            "start" => {
                let work = Arc::clone(&inner);
                inner.work.spawn(async move {
                    let inner = work;
                    let reply_to = message.reply.clone();
                    let reply = match serde_json::from_slice::<StartRequest>(&message.payload) {
                        Ok(request) => start_here(Arc::clone(&inner), request).await,
                        Err(error) => StartReply {
                            pid: None,
                            error: Some(ErrorInfo::new(
                                goondan_ipc::codes::AGENT_UNAVAILABLE,
                                format!("an unreadable start request: {error}"),
                            )),
                        },
                    };
                    if let Some(reply_to) = reply_to
                        && let Ok(body) = serde_json::to_vec(&reply)
                    {
                        let _ = inner.client.publish(reply_to, body.into()).await;
                    }
                });
            }
            "kill" => {
                let Ok(request) = serde_json::from_slice::<KillRequest>(&message.payload) else { continue };
                let mut running = inner.running.lock_unpoisoned();
                match running.get_mut(&request.instance) {
                    Some(here) if here.start == request.start => {
                        if let Some(kill) = here.kill.take() {
                            let _ = kill.send(Stop::Kill);
                        }
                    }
                    // Not running (yet): a start the hub gave up on; it
                    // ends as soon as it is ready.
                    _ => {
                        let mut abandoned = inner.abandoned.lock_unpoisoned();
                        if abandoned.len() >= 1024 {
                            abandoned.clear();
                        }
                        abandoned.insert(request.start);
                    }
                }
            }
            other => tracing::debug!(target: "goondan::nats", "an unknown request to this host: {other}"),
        }
    }
}

/// Claims, takes the consumer, starts the process; the bridge runs on.
async fn start_here(inner: Arc<Inner>, request: StartRequest) -> StartReply {
    let StartRequest { start, accept, hub_workdir, mut init } = request;
    // A start is the hub speaking.
    *inner.hub_heard.lock_unpoisoned() = Some(Instant::now());
    // A place under the hub's working directory is the same place under
    // this host's; any other path of the hub's means nothing here.
    init.workdir = match (init.workdir.as_deref(), hub_workdir.as_deref()) {
        (Some(place), Some(base)) => std::path::Path::new(place)
            .strip_prefix(base)
            .ok()
            .filter(|relative| relative.components().all(|c| matches!(c, std::path::Component::Normal(_))))
            .map(|relative| relative.display().to_string()),
        _ => None,
    };
    let instance = init.instance.clone();
    let failed =
        |why: String| StartReply { pid: None, error: Some(ErrorInfo::new(goondan_ipc::codes::AGENT_UNAVAILABLE, why)) };
    // An earlier process of the instance here ends first (the hub moved on from it).
    let previous = {
        let mut running = inner.running.lock_unpoisoned();
        running.remove(&instance).map(|mut here| {
            if let Some(kill) = here.kill.take() {
                let _ = kill.send(Stop::Kill);
            }
            here.done
        })
    };
    if let Some(mut done) = previous {
        let _ = tokio::time::timeout(Duration::from_secs(10), done.wait_for(|d| *d)).await;
    }
    let config = &inner.config;
    let Some(dir) = (config.instance_dir)(&instance) else {
        return failed(format!("{instance} has no state directory on host {}", config.host_id));
    };
    let replica = match Replica::claim(
        &inner.js,
        &config.scope.state_stream(),
        &config.scope.state(&instance),
        &dir,
        &config.host_id,
        inner.max_payload,
    )
    .await
    {
        Ok(replica) => replica,
        Err(error) => return failed(format!("host {} could not claim {instance}: {error}", config.host_id)),
    };
    let consumer = match take_consumer(&inner, &instance, &replica).await {
        Ok(consumer) => consumer,
        Err(error) => return failed(format!("host {} could not take {instance}'s messages: {error}", config.host_id)),
    };
    let init = (config.localize)(init);
    let started = match config.launcher.start(init, config.start_timeout).await {
        Ok(started) => started,
        Err(error) => return StartReply { pid: None, error: Some(error) },
    };
    let pid = started.pid;
    if inner.abandoned.lock_unpoisoned().remove(&start) {
        let mut process = started.process;
        process.start_kill();
        let _ = process.wait().await;
        return failed(format!("the hub gave up on this start of {instance} before it was ready"));
    }
    let (kill, killed) = oneshot::channel();
    let (done_tx, done) = watch::channel(false);
    // Checked under the lock `Host::stop` collects the processes with.
    let stopping = {
        let mut running = inner.running.lock_unpoisoned();
        let stopping = inner.stopping.is_cancelled();
        if !stopping {
            running.insert(instance.clone(), Here { start: start.clone(), kill: Some(kill), done });
        }
        stopping
    };
    if stopping {
        let mut process = started.process;
        process.start_kill();
        let _ = process.wait().await;
        return failed(format!("host {} is stopping", config.host_id));
    }
    tracing::info!(target: "goondan::nats", %instance, pid, token = replica.token(), "started here");
    let bridge = Bridge {
        inner: Arc::clone(&inner),
        instance,
        start,
        accept,
        replica,
        sent: 0,
        given_requests: 0,
        given_answers: 0,
    };
    inner.work.spawn(async move {
        bridge.run(started, consumer, killed).await;
        let _ = done_tx.send(true);
    });
    StartReply { pid: Some(pid), error: None }
}

/// The instance's durable consumer, made anew: what an earlier holder left
/// unacknowledged is delivered again from the start.
async fn take_consumer(
    inner: &Inner,
    instance: &AgentInstance,
    replica: &Replica,
) -> Result<consumer::PullConsumer, NatsError> {
    let scope = &inner.config.scope;
    let stream = inner.js.get_stream(scope.message_stream()).await.map_err(NatsError::js)?;
    let prefix = Scope::instance_consumer(instance);
    // Named after this claim, so that pulls of an earlier holder (a host
    // cut off, then back) reach no consumer: they fail, and it learns it
    // was taken over. The earlier holder's consumer goes first (a
    // work-queue stream keeps one per subject).
    if let Some(previous) = replica.previous_claim() {
        let _ = stream.delete_consumer(&format!("{prefix}-{previous}")).await;
    }
    let _ = stream.delete_consumer(&prefix).await;
    let config = consumer::pull::Config {
        durable_name: Some(format!("{prefix}-{}", replica.token())),
        filter_subject: scope.to_instance(instance),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: inner.config.ack_wait,
        max_ack_pending: 1024,
        ..Default::default()
    };
    match stream.create_consumer(config.clone()).await {
        Ok(consumer) => Ok(consumer),
        Err(first) => {
            // Another leftover of this instance (a claim whose start never
            // got this far): found by name and removed.
            let mut names = stream.consumer_names();
            let mut removed = 0;
            while let Some(Ok(name)) = names.next().await {
                if name.starts_with(&prefix) {
                    let _ = stream.delete_consumer(&name).await;
                    removed += 1;
                }
            }
            if removed == 0 {
                return Err(NatsError::js(first));
            }
            stream.create_consumer(config).await.map_err(NatsError::js)
        }
    }
}

/// Work given to the process and not yet acknowledged.
struct Unacked {
    correlation_id: Option<String>,
    /// A request (delegate or event) rather than an answer to one of its own.
    request: bool,
    /// Its place among the requests, or among the answers, given to the
    /// process (1, 2, …: what the process counts in `idle`).
    ordinal: u64,
    /// Its sequence in the stream: a redelivery of work the process holds
    /// is not given to it twice.
    sequence: Option<u64>,
    message: jetstream::Message,
}

struct Bridge {
    inner: Arc<Inner>,
    instance: AgentInstance,
    start: String,
    accept: Vec<String>,
    replica: Replica,
    sent: u64,
    /// Requests and answers given to the process so far.
    given_requests: u64,
    given_answers: u64,
}

/// What a message from the process asks of the bridge.
enum Commit {
    None,
    /// A turn's progress: sent without waiting.
    Progress,
    /// The answer to this request: state synced first, then acknowledged.
    Answered(String),
    /// All work done: state synced first, then the requests and answers
    /// the process has taken in (its counts) acknowledged.
    Idle {
        requests: u64,
        answers: u64,
    },
}

impl Bridge {
    async fn run(mut self, started: Started, consumer: consumer::PullConsumer, mut killed: oneshot::Receiver<Stop>) {
        let Started { link, mut receiver, mut process, .. } = started;
        let mut link = Some(link);
        let mut kill_at: Option<tokio::time::Instant> = None;
        let (inbound_tx, mut inbound) = mpsc::channel::<jetstream::Message>(256);
        let (taken_tx, mut taken) = oneshot::channel();
        let reader = tokio::spawn(read_consumer(consumer, inbound_tx, taken_tx, self.inner.recheck.subscribe()));
        // Whether a turn may be committing: steps commit without a word to
        // the bridge, so their changes are synced on the tick meanwhile.
        let mut active = false;
        let mut unacked: Vec<Unacked> = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut in_progress = tokio::time::interval((self.inner.config.ack_wait / 3).max(Duration::from_millis(100)));
        in_progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut reading = true;
        let mut fenced = false;
        let (mut inbound_open, mut taken_open) = (true, true);
        let mut leaving = false;
        let end = loop {
            tokio::select! {
                biased;
                said = receiver.recv(), if reading => match said {
                    Ok(Some(message)) => {
                        if let IpcMessage::Observe(observed) = &message {
                            match observed.payload {
                                ObservePayload::TurnStarted { .. } => {
                                    if !active {
                                        tick.reset();
                                    }
                                    active = true;
                                }
                                ObservePayload::Idle { .. } => active = false,
                                _ => {}
                            }
                        }
                        // Once leaving, what the process says (a cancelled
                        // turn's answer) is not the instance's: its turn
                        // continues on another host.
                        if !leaving && !self.forward(message, &mut unacked).await {
                            fenced = true;
                            process.start_kill();
                        }
                    }
                    Ok(None) | Err(_) => reading = false,
                },
                end = process.wait() => break end,
                next = inbound.recv(), if !fenced && link.is_some() && inbound_open => {
                    let Some(message) = next else {
                        inbound_open = false;
                        continue;
                    };
                    if let Some(link) = &link {
                        if unacked.is_empty() {
                            // Work held from now: its first in-progress ack a period on.
                            in_progress.reset();
                        }
                        self.deliver(message, link.as_ref(), &mut unacked).await;
                        // The tick ran on while idle: the first sync is one
                        // period into the work, not at once (a sync on the
                        // way into a turn holds up what the process says).
                        if !active {
                            tick.reset();
                        }
                        active = true;
                    }
                }
                was_taken = &mut taken, if !fenced && taken_open => {
                    taken_open = false;
                    if was_taken.is_ok() {
                        // Another host took the instance's messages: it has claimed it.
                        fenced = true;
                        self.lost_lease();
                        process.start_kill();
                    }
                }
                _ = in_progress.tick(), if !fenced && !leaving && !unacked.is_empty() => {
                    // Still at it: the broker is not to deliver it again.
                    for work in &unacked {
                        if let Err(error) = work.message.ack_with(jetstream::AckKind::Progress).await {
                            tracing::debug!(target: "goondan::nats", "in-progress ack: {error}");
                        }
                    }
                }
                _ = tick.tick(), if !fenced && active => {
                    if let Err(ReplicaError::Fenced(_)) = self.replica.sync().await {
                        fenced = true;
                        self.lost_lease();
                        process.start_kill();
                    }
                }
                stop = &mut killed, if kill_at.is_none() => match stop {
                    Ok(how @ (Stop::Close | Stop::Leave)) => {
                        leaving = how == Stop::Leave;
                        link = None;
                        kill_at = Some(tokio::time::Instant::now() + CLOSE_GRACE);
                    }
                    Ok(Stop::Kill) | Err(_) => {
                        process.start_kill();
                        kill_at = Some(tokio::time::Instant::now());
                    }
                },
                () = sleep_until(kill_at) => {
                    process.start_kill();
                    kill_at = Some(tokio::time::Instant::now() + Duration::from_secs(3600));
                }
            }
        };
        reader.abort();
        // What it said before it ended comes before the exit notice.
        if reading && !fenced && !leaving {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
            while let Ok(Ok(Some(message))) = tokio::time::timeout_at(deadline, receiver.recv()).await {
                if !self.forward(message, &mut unacked).await {
                    fenced = true;
                    break;
                }
            }
        }
        if fenced {
            // Another host has it: nothing of this one counts any more.
            return;
        }
        if let Err(error) = self.replica.sync().await {
            tracing::warn!(target: "goondan::nats", instance = %self.instance, "the last sync: {error}");
        }
        if !leaving {
            for work in unacked {
                let _ = work.message.ack().await;
            }
        }
        use std::os::unix::process::ExitStatusExt as _;
        let notice = ExitNotice { wait_status: end.status.map(|s| s.into_raw()), host_leaving: leaving };
        let mut headers = wire::headers(&self.instance, &self.start, Some(&self.inner.config.host_id));
        headers.insert(wire::H_KIND, "exited");
        if let Ok(body) = serde_json::to_vec(&notice) {
            let id = format!("{}-exit", self.start);
            publish_stored(&self.inner.js, &self.inner.config.scope.hub(), &headers, &id, body.into()).await;
        }
        let mut running = self.inner.running.lock_unpoisoned();
        if running.get(&self.instance).is_some_and(|here| here.start == self.start) {
            running.remove(&self.instance);
        }
    }

    fn lost_lease(&self) {
        tracing::warn!(target: "goondan::nats", instance = %self.instance, host = %self.inner.config.host_id,
            "another host has taken this instance over; its process here is stopped and commits nothing more");
    }

    /// One message of the process to the hub; false once fenced.
    async fn forward(&mut self, message: IpcMessage, unacked: &mut Vec<Unacked>) -> bool {
        let commit = match &message {
            IpcMessage::DelegateResult(m) => m.correlation_id.clone().map_or(Commit::None, Commit::Answered),
            IpcMessage::Observe(m) => match &m.payload {
                ObservePayload::Idle { jobs, answers } => Commit::Idle { requests: *jobs, answers: *answers },
                _ => Commit::Progress,
            },
            _ => Commit::None,
        };
        if matches!(commit, Commit::Answered(_) | Commit::Idle { .. }) {
            match self.replica.sync().await {
                Ok(_) => {}
                Err(ReplicaError::Fenced(_)) => {
                    self.lost_lease();
                    return false;
                }
                Err(error) => {
                    tracing::warn!(target: "goondan::nats", instance = %self.instance, "syncing state: {error}")
                }
            }
        }
        let Ok(payload) = wire::encode(&message) else { return true };
        self.sent += 1;
        let id = format!("{}-a-{}", self.start, self.sent);
        let headers = wire::headers(&self.instance, &self.start, Some(&self.inner.config.host_id));
        let subject = self.inner.config.scope.hub();
        if matches!(commit, Commit::Progress) {
            // What a turn is doing (started, text, tools) is for the
            // console: sent in order, not waited for.
            publish_unwaited(&self.inner.js, subject, headers, id, payload).await;
            return true;
        }
        publish_stored(&self.inner.js, &subject, &headers, &id, payload).await;
        let done = |work: &Unacked| match &commit {
            Commit::None | Commit::Progress => false,
            Commit::Answered(id) => work.request && work.correlation_id.as_deref() == Some(id.as_str()),
            // Only what the process had taken in when it said so: a request
            // on its way to it meanwhile is not done.
            Commit::Idle { requests, answers } => work.ordinal <= if work.request { *requests } else { *answers },
        };
        let (acked, kept): (Vec<Unacked>, Vec<Unacked>) = std::mem::take(unacked).into_iter().partition(done);
        *unacked = kept;
        for work in acked {
            if let Err(error) = work.message.ack().await {
                tracing::debug!(target: "goondan::nats", "ack: {error}");
            }
        }
        true
    }

    /// One message of the hub's to the process.
    async fn deliver(&mut self, message: jetstream::Message, link: &dyn goondan_ipc::Link, unacked: &mut Vec<Unacked>) {
        let start = wire::header(message.headers.as_ref(), wire::H_START).unwrap_or_default().to_owned();
        let ours = start == self.start;
        let mut ipc = match wire::decode(&message.payload) {
            Ok(ipc) => ipc,
            Err(error) => {
                tracing::warn!(target: "goondan::nats", instance = %self.instance, "an unreadable message: {error}");
                let _ = message.ack().await;
                return;
            }
        };
        let work = matches!(ipc, IpcMessage::Delegate(_) | IpcMessage::Event(_) | IpcMessage::DelegateResult(_));
        let sequence = message.info().ok().map(|info| info.stream_sequence);
        if work && let Some(held) = unacked.iter_mut().find(|held| sequence.is_some() && held.sequence == sequence) {
            // Delivered again while the process still has it (the broker's
            // wait ran out): acknowledged through the newest delivery.
            held.message = message;
            return;
        }
        // Work of an earlier start is this process's only if its host was
        // lost; anything else of another start the hub has already failed.
        if !(ours || (work && self.accept.contains(&start))) {
            let _ = message.ack().await;
            return;
        }
        let (correlation_id, request) = match &mut ipc {
            IpcMessage::Delegate(m) | IpcMessage::Event(m) => {
                if let Some(id) = &m.correlation_id
                    && !m.payload.metadata.contains_key(DELIVERY_KEY)
                {
                    m.payload.metadata.insert(DELIVERY_KEY.to_owned(), JsonValue::String(format!("nats:{id}")));
                }
                (m.correlation_id.clone(), true)
            }
            IpcMessage::DelegateResult(m) => (m.correlation_id.clone(), false),
            _ => (None, false),
        };
        if link.send(ipc).await.is_err() {
            // The process is going: the message stays for the next one.
            return;
        }
        if work {
            let ordinal = if request {
                self.given_requests += 1;
                self.given_requests
            } else {
                self.given_answers += 1;
                self.given_answers
            };
            unacked.push(Unacked { correlation_id, request, ordinal, sequence, message });
        } else if let Err(error) = message.ack().await {
            tracing::debug!(target: "goondan::nats", "ack: {error}");
        }
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The metadata key a request's delivery key travels under (the agent
/// process answers a known one from its conversation).
const DELIVERY_KEY: &str = "deliveryKey";

/// Pulls the instance's messages into `to` for as long as the bridge runs;
/// a stream error (the server restarting) is waited out. When the consumer
/// is gone or is another (a host that claimed the instance made its own),
/// `taken` fires and the reading ends. That is checked after a stream
/// error, and whenever the host may have missed something (`recheck`: it
/// reconnected, or was itself held up).
async fn read_consumer(
    consumer: consumer::PullConsumer,
    to: mpsc::Sender<jetstream::Message>,
    taken: oneshot::Sender<()>,
    mut recheck: watch::Receiver<u64>,
) {
    let ours = consumer.cached_info().created;
    let is_taken = async |consumer: &consumer::PullConsumer| match consumer.get_info().await {
        Ok(info) => info.created != ours,
        Err(error) => matches!(error.kind(), jetstream::context::ConsumerInfoErrorKind::NotFound),
    };
    loop {
        if let Ok(mut messages) = consumer.messages().await {
            loop {
                tokio::select! {
                    next = messages.next() => match next {
                        Some(Ok(message)) => {
                            if to.send(message).await.is_err() {
                                return;
                            }
                        }
                        Some(Err(error)) => {
                            tracing::debug!(target: "goondan::nats", "an instance's consumer: {error}");
                            break;
                        }
                        None => break,
                    },
                    changed = recheck.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        if is_taken(&consumer).await {
                            let _ = taken.send(());
                            return;
                        }
                    }
                }
            }
        }
        if is_taken(&consumer).await {
            let _ = taken.send(());
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
