//! The orchestrator: one process per agent instance, and every message
//! between them routed here.
//!
//! ```text
//! ask(instance, input)  (the terminal: gdn run)
//!   ensure(instance) ─► start it if no process runs: launcher → hello (token) → init → ready
//!   delegate ─► the agent process runs a turn ─► delegate_result ─► ask returns
//! an agent's delegate (agents__request) to target T:
//!   unknown agent → AGENT_NOT_FOUND; hops over the limit → AGENT_HOP_LIMIT_EXCEEDED;
//!   synchronous and T waits (transitively) for the caller → CIRCULAR_CALL_DETECTED
//!   pending[correlationId] = caller; ensure(T) (auto-spawn); forward
//!   T's delegate_result ─► the caller (dropped if the caller gave up: cancel)
//! an agent's event (agents__send): ensure(T), forward, acknowledge with call_result
//! an agent's call: spawn | list, answered with call_result (catalog is answered in the agent process)
//! a process ends (any signal):
//!   its callers' requests get AGENT_CRASHED; requests it made are cancelled;
//!   a crash (not exit 0) counts; after 5 in a row the next start waits 1 s, 2 s, … 5 min;
//!   a turn answered resets the count; the next message starts it again
//! shutdown: `shutdown` to every process, the grace period, then SIGKILL
//! ```
//!
//! The orchestrator trusts nothing a message says about who sent it: the
//! sender is the instance whose connection the message came on.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant, SystemTime};

use goondan_core::JsonValue;
use goondan_ipc::{
    AgentInstance, CLI, CallPayload, CallResultPayload, CancelPayload, DelegatePayload, DelegateResultPayload,
    ErrorInfo, IpcMessage, LinkReceiver, LinkSender, ORCHESTRATOR, ObservePayload, Routed, ShutdownPayload, unix_link,
};
use serde_json::json;
use tokio::net::UnixListener;
use tokio::sync::{oneshot, watch};

use crate::backoff;
use crate::codes::{
    AGENT_CRASHED, AGENT_HOP_LIMIT, AGENT_INVALID_REQUEST, AGENT_NOT_FOUND, AGENT_UNAVAILABLE, CIRCULAR_CALL_DETECTED,
    IPC_DELIVERY_FAILED,
};
use crate::launcher::AgentLauncher;
use crate::plan::SwarmPlan;
use crate::waits::{WaitGraph, describe};

/// What the terminal (or a test) sees of the swarm.
pub trait SwarmObserver: Send + Sync {
    /// Progress of a turn of `instance`.
    fn observe(&self, _instance: &AgentInstance, _event: &ObservePayload) {}
    /// A process of `instance` started (`pid`).
    fn started(&self, _instance: &AgentInstance, _pid: u32) {}
    /// The process `pid` of `instance` ended; `status` says how. The
    /// processes its tools left (marked with its pid) should be ended.
    fn exited(&self, _instance: &AgentInstance, _pid: u32, _status: &str, _crashed: bool) {}
}

/// An observer that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSwarmObserver;

impl SwarmObserver for NoSwarmObserver {}

/// Why the orchestrator could not start.
#[derive(Debug, thiserror::Error)]
pub enum OrchestratorError {
    /// Its socket could not be made.
    #[error("starting the orchestrator: {0}")]
    Io(#[from] std::io::Error),
}

/// A running agent process.
struct Running {
    link: LinkSender,
    pid: u32,
    generation: u64,
    kill: Option<oneshot::Sender<()>>,
    /// Resolves when the process has exited and been handled.
    exited: watch::Receiver<bool>,
}

/// One agent instance the orchestrator knows.
struct Slot {
    running: Option<Running>,
    /// Held while a process is being started, so that one start serves every waiter.
    start_lock: Arc<tokio::sync::Mutex<()>>,
    crashes: u32,
    not_before: Option<Instant>,
    /// The last process asked to restart: its exit is not a crash.
    restart_requested: bool,
    owner: Option<AgentInstance>,
    created_at: String,
    cwd: Option<PathBuf>,
    last_pid: Option<u32>,
}

impl Slot {
    fn new(owner: Option<AgentInstance>) -> Self {
        Self {
            running: None,
            start_lock: Arc::new(tokio::sync::Mutex::new(())),
            crashes: 0,
            not_before: None,
            restart_requested: false,
            owner,
            created_at: iso_now(),
            cwd: None,
            last_pid: None,
        }
    }
}

/// Who waits for a `delegate_result`.
enum Waiter {
    Cli(oneshot::Sender<DelegateResultPayload>),
    Agent(AgentInstance),
}

struct Pending {
    waiter: Waiter,
    target: AgentInstance,
    /// The process (generation) it was handed to; `None` while it waits for
    /// one to start (a restarting target's old process must not fail it).
    delivered_to: Option<u64>,
    /// An asynchronous request: its answer is delivered to the caller even
    /// if the caller's process ends meanwhile (a new one is started for it).
    echo: Option<goondan_ipc::AsyncRequestEcho>,
}

#[derive(Default)]
struct State {
    slots: BTreeMap<AgentInstance, Slot>,
    pending: HashMap<String, Pending>,
    waits: WaitGraph,
    stopping: bool,
    next_generation: u64,
}

/// What a started process hands back through its `hello`.
type Hello = (LinkSender, Box<dyn LinkReceiver>, u32);

struct Inner {
    plan: SwarmPlan,
    launcher: AgentLauncher,
    observer: Arc<dyn SwarmObserver>,
    socket: PathBuf,
    state: Mutex<State>,
    hellos: Mutex<HashMap<String, oneshot::Sender<Hello>>>,
    /// The private directory of the socket; removed with the orchestrator.
    _dir: tempfile::TempDir,
}

/// The orchestrator of one swarm. Cheap to clone.
#[derive(Clone)]
pub struct Orchestrator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Orchestrator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orchestrator").field("swarm", &self.inner.plan.swarm.name).finish_non_exhaustive()
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Orchestrator {
    /// Starts the orchestrator: its socket, and the task that accepts agent
    /// processes. No agent process starts until a message needs it.
    pub fn start(
        plan: SwarmPlan,
        launcher: AgentLauncher,
        observer: Arc<dyn SwarmObserver>,
    ) -> Result<Self, OrchestratorError> {
        // A socket path must fit in sun_path (108 bytes): a long TMPDIR
        // falls back to /tmp.
        let base = std::env::temp_dir();
        let base = if base.as_os_str().len() <= 80 { base } else { PathBuf::from("/tmp") };
        let dir = tempfile::Builder::new().prefix("gdn-swarm-").tempdir_in(base)?;
        let socket = dir.path().join("s");
        let listener = UnixListener::bind(&socket)?;
        let inner = Arc::new(Inner {
            plan,
            launcher,
            observer,
            socket,
            state: Mutex::new(State::default()),
            hellos: Mutex::new(HashMap::new()),
            _dir: dir,
        });
        tokio::spawn(accept(listener, Arc::downgrade(&inner)));
        Ok(Self { inner })
    }

    /// The plan it runs.
    pub fn plan(&self) -> &SwarmPlan {
        &self.inner.plan
    }

    /// Runs a turn of `instance` with `input` from the terminal and waits for
    /// its answer. `cancel` turning true cancels the turn (the answer then
    /// says so).
    pub async fn ask(
        &self,
        instance: &AgentInstance,
        input: String,
        mut cancel: watch::Receiver<bool>,
    ) -> DelegateResultPayload {
        let inner = &self.inner;
        let correlation_id = new_correlation_id();
        let (reply, answer) = oneshot::channel();
        {
            let mut state = lock(&inner.state);
            state.slots.entry(instance.clone()).or_insert_with(|| Slot::new(None));
            state.pending.insert(
                correlation_id.clone(),
                Pending { waiter: Waiter::Cli(reply), target: instance.clone(), delivered_to: None, echo: None },
            );
        }
        let link = match ensure(inner, instance).await {
            Ok((link, generation)) => {
                if let Err(error) = mark_delivered(inner, &correlation_id, instance, generation) {
                    return DelegateResultPayload::failed(error);
                }
                link
            }
            Err(error) => {
                lock(&inner.state).pending.remove(&correlation_id);
                return DelegateResultPayload::failed(error);
            }
        };
        let payload = DelegatePayload {
            event_id: goondan_core::ids::new_id(),
            event_type: "user.input".to_owned(),
            instance_key: instance.instance_key.clone(),
            input,
            metadata: goondan_core::JsonObject::new(),
            trace_id: None,
            asynchronous: false,
            hops: 0,
            source: goondan_ipc::MessageSourceInfo { kind: CLI.to_owned(), name: CLI.to_owned(), instance_key: None },
            tool_call_id: None,
        };
        let message =
            IpcMessage::Delegate(Routed::new(CLI, instance.agent.clone(), payload).correlated(correlation_id.clone()));
        if let Err(error) = link.send(message).await {
            lock(&inner.state).pending.remove(&correlation_id);
            return DelegateResultPayload::error(
                IPC_DELIVERY_FAILED,
                format!("sending the input to {instance}: {error}"),
            );
        }
        let mut answer = answer;
        let mut cancelled = false;
        loop {
            tokio::select! {
                result = &mut answer => {
                    return result.unwrap_or_else(|_| {
                        DelegateResultPayload::error(IPC_DELIVERY_FAILED, format!("{instance} never answered"))
                    });
                }
                changed = cancel.changed(), if !cancelled => {
                    if changed.is_err() || *cancel.borrow() {
                        cancelled = true;
                        let cancel = IpcMessage::Cancel(
                            Routed::new(CLI, instance.to_string(), CancelPayload { reason: "interrupted".into() })
                                .correlated(correlation_id.clone()),
                        );
                        let _ = link.send(cancel).await;
                    }
                }
            }
        }
    }

    /// Starts `instance`'s process now if none runs (it otherwise starts
    /// with its first message); its pid.
    pub async fn start_instance(&self, instance: &AgentInstance) -> Result<u32, ErrorInfo> {
        lock(&self.inner.state).slots.entry(instance.clone()).or_insert_with(|| Slot::new(None));
        ensure(&self.inner, instance).await?;
        self.pid_of(instance).ok_or_else(|| ErrorInfo::new(AGENT_UNAVAILABLE, format!("{instance} ended at once")))
    }

    /// The pid of the process running `instance`, if one runs.
    pub fn pid_of(&self, instance: &AgentInstance) -> Option<u32> {
        lock(&self.inner.state).slots.get(instance).and_then(|slot| slot.running.as_ref().map(|r| r.pid))
    }

    /// Stops every agent process: `shutdown`, then after the grace period
    /// SIGKILL for those still running; returns when all have exited.
    pub async fn shutdown(&self, reason: &str) {
        let inner = &self.inner;
        let grace = inner.plan.shutdown_grace;
        let running: Vec<(LinkSender, watch::Receiver<bool>, AgentInstance)> = {
            let mut state = lock(&inner.state);
            state.stopping = true;
            state
                .slots
                .iter()
                .filter_map(|(instance, slot)| {
                    slot.running.as_ref().map(|r| (Arc::clone(&r.link), r.exited.clone(), instance.clone()))
                })
                .collect()
        };
        for (link, _, instance) in &running {
            let payload = ShutdownPayload {
                grace_period_ms: u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
                reason: reason.to_owned(),
            };
            let _ = link.send(IpcMessage::Shutdown(Routed::new(ORCHESTRATOR, instance.to_string(), payload))).await;
        }
        let deadline = tokio::time::Instant::now() + grace;
        for (_, exited, instance) in &running {
            let mut exited = exited.clone();
            if tokio::time::timeout_at(deadline, exited.wait_for(|done| *done)).await.is_err() {
                tracing::warn!("{instance} did not stop within {grace:?} of shutdown; killing it");
                let kill = lock(&inner.state)
                    .slots
                    .get_mut(instance)
                    .and_then(|slot| slot.running.as_mut().and_then(|r| r.kill.take()));
                if let Some(kill) = kill {
                    let _ = kill.send(());
                }
                let _ = tokio::time::timeout(Duration::from_secs(5), exited.wait_for(|done| *done)).await;
            }
        }
    }
}

/// Accepts agent processes' connections and hands each to the start that
/// waits for its token.
async fn accept(listener: UnixListener, inner: Weak<Inner>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let Some(strong) = inner.upgrade() else { return };
        drop(strong);
        let inner = inner.clone();
        tokio::spawn(async move {
            let (read, write) = stream.into_split();
            let (link, mut receiver) = unix_link(read, write);
            let hello = tokio::time::timeout(Duration::from_secs(10), receiver.recv()).await;
            let Ok(Ok(Some(IpcMessage::Hello(hello)))) = hello else {
                tracing::debug!("a connection to the orchestrator did not start with hello; closed");
                return;
            };
            let Some(inner) = inner.upgrade() else { return };
            let waiting = inner.hellos.lock().unwrap_or_else(PoisonError::into_inner).remove(&hello.payload.token);
            match waiting {
                Some(waiting) => {
                    let _ = waiting.send((link, receiver, hello.payload.pid));
                }
                None => tracing::warn!("a process presented an unknown token to the orchestrator; closed"),
            }
        });
    }
}

/// The link to `instance`'s process, starting one if none runs. Boxed: a
/// started process's reader can start others, and the future's type would
/// otherwise contain itself.
/// A boxed [`ensure`].
type Starting<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(LinkSender, u64), ErrorInfo>> + Send + 'a>>;

/// Returns the link and the generation of the process it reaches.
fn ensure<'a>(inner: &'a Arc<Inner>, instance: &'a AgentInstance) -> Starting<'a> {
    Box::pin(ensure_running(inner, instance))
}

async fn ensure_running(inner: &Arc<Inner>, instance: &AgentInstance) -> Result<(LinkSender, u64), ErrorInfo> {
    let (start_lock, restarting) = {
        let mut state = lock(&inner.state);
        if state.stopping {
            return Err(ErrorInfo::new(AGENT_UNAVAILABLE, "the swarm is shutting down"));
        }
        let slot = state.slots.entry(instance.clone()).or_insert_with(|| Slot::new(None));
        match &slot.running {
            // It answered its last turn and is exiting to restart: the
            // message goes to the new process.
            Some(running) if slot.restart_requested => (Arc::clone(&slot.start_lock), Some(running.exited.clone())),
            Some(running) => return Ok((Arc::clone(&running.link), running.generation)),
            None => (Arc::clone(&slot.start_lock), None),
        }
    };
    if let Some(mut exited) = restarting {
        let _ = tokio::time::timeout(Duration::from_secs(10), exited.wait_for(|done| *done)).await;
    }
    let _starting = start_lock.lock().await;
    let (generation, cwd) = {
        let mut state = lock(&inner.state);
        state.next_generation += 1;
        let generation = state.next_generation;
        let Some(slot) = state.slots.get_mut(instance) else {
            return Err(ErrorInfo::new(AGENT_UNAVAILABLE, format!("{instance} is unknown")));
        };
        // Started by the waiter before us.
        if let Some(running) = &slot.running {
            return Ok((Arc::clone(&running.link), running.generation));
        }
        if let Some(not_before) = slot.not_before
            && Instant::now() < not_before
        {
            let wait = not_before - Instant::now();
            return Err(ErrorInfo::new(
                AGENT_UNAVAILABLE,
                format!(
                    "{instance} crashed {} times in a row; it is started again in {:.1} s",
                    slot.crashes,
                    wait.as_secs_f64()
                ),
            )
            .suggest("Retry later, or look at the agent's log lines for why it crashes."));
        }
        (generation, slot.cwd.clone())
    };
    match start_process(inner, instance, generation, cwd).await {
        Ok(link) => Ok((link, generation)),
        Err(error) => {
            let mut state = lock(&inner.state);
            if let Some(slot) = state.slots.get_mut(instance) {
                slot.crashes += 1;
                let delay = backoff::delay_after(slot.crashes);
                slot.not_before = (!delay.is_zero()).then(|| Instant::now() + delay);
            }
            Err(error)
        }
    }
}

async fn start_process(
    inner: &Arc<Inner>,
    instance: &AgentInstance,
    generation: u64,
    cwd: Option<PathBuf>,
) -> Result<LinkSender, ErrorInfo> {
    let unavailable = |message: String| ErrorInfo::new(AGENT_UNAVAILABLE, message);
    let token = goondan_core::ids::new_id();
    let (hello_tx, hello_rx) = oneshot::channel();
    inner.hellos.lock().unwrap_or_else(PoisonError::into_inner).insert(token.clone(), hello_tx);
    let forget_token = || {
        inner.hellos.lock().unwrap_or_else(PoisonError::into_inner).remove(&token);
    };
    let mut child = match inner.launcher.spawn(instance, &inner.socket, &token) {
        Ok(child) => child,
        Err(error) => {
            forget_token();
            return Err(unavailable(format!("cannot start a process for {instance}: {error}")));
        }
    };
    let pid = child.id().unwrap_or_default();
    let deadline = tokio::time::Instant::now() + inner.plan.start_timeout;
    // hello, or the process ending first.
    let (link, mut receiver) = tokio::select! {
        hello = tokio::time::timeout_at(deadline, hello_rx) => match hello {
            Ok(Ok((link, receiver, _))) => (link, receiver),
            _ => {
                forget_token();
                let _ = child.start_kill();
                return Err(unavailable(format!("the process for {instance} (pid {pid}) did not connect")));
            }
        },
        status = child.wait() => {
            forget_token();
            return Err(unavailable(format!("the process for {instance} (pid {pid}) ended at start: {}", describe_status(status.ok()))));
        }
    };
    let init = goondan_ipc::InitPayload {
        config: inner.plan.config.display().to_string(),
        instance: instance.clone(),
        workdir: Some(cwd.unwrap_or_else(|| inner.plan.workdir.clone()).display().to_string()),
        state_root: inner.plan.state_root.display().to_string(),
        env: inner.plan.env.clone(),
        tool_timeout_ms: inner.plan.tool_timeout_ms,
        swarm: inner.plan.swarm.clone(),
    };
    if link.send(IpcMessage::Init(Routed::new(ORCHESTRATOR, instance.to_string(), init))).await.is_err() {
        let _ = child.start_kill();
        return Err(unavailable(format!("the process for {instance} closed its connection at start")));
    }
    let ready = tokio::select! {
        ready = tokio::time::timeout_at(deadline, receiver.recv()) => ready,
        status = child.wait() => {
            return Err(unavailable(format!("the process for {instance} (pid {pid}) ended at start: {}", describe_status(status.ok()))));
        }
    };
    match ready {
        Ok(Ok(Some(IpcMessage::Ready(ready)))) => {
            if let Some(error) = ready.payload.error {
                // It exits by itself; make sure.
                let _ = child.start_kill();
                let _ = child.wait().await;
                return Err(error);
            }
        }
        Ok(other) => {
            let _ = child.start_kill();
            return Err(unavailable(format!("the process for {instance} did not become ready: {other:?}")));
        }
        Err(_) => {
            let _ = child.start_kill();
            return Err(unavailable(format!(
                "the process for {instance} did not become ready within {:?}",
                inner.plan.start_timeout
            )));
        }
    }
    let (kill_tx, kill_rx) = oneshot::channel();
    let (exited_tx, exited_rx) = watch::channel(false);
    {
        let mut state = lock(&inner.state);
        if let Some(slot) = state.slots.get_mut(instance) {
            slot.running =
                Some(Running { link: Arc::clone(&link), pid, generation, kill: Some(kill_tx), exited: exited_rx });
            slot.last_pid = Some(pid);
            slot.restart_requested = false;
        }
    }
    inner.observer.started(instance, pid);
    tokio::spawn(read_agent(Arc::downgrade(inner), instance.clone(), receiver));
    tokio::spawn(watch_exit(Arc::downgrade(inner), instance.clone(), generation, pid, child, kill_rx, exited_tx));
    Ok(link)
}

/// Records that the request `id` goes to `target`'s process `generation`.
/// If that process has ended meanwhile, the request is answered as crashed
/// (taken out of the pending requests; the error is returned).
fn mark_delivered(inner: &Inner, id: &str, target: &AgentInstance, generation: u64) -> Result<(), ErrorInfo> {
    let mut state = lock(&inner.state);
    let alive = state.slots.get(target).and_then(|s| s.running.as_ref()).is_some_and(|r| r.generation == generation);
    if alive {
        if let Some(pending) = state.pending.get_mut(id) {
            pending.delivered_to = Some(generation);
        }
        return Ok(());
    }
    state.waits.remove(id);
    state.pending.remove(id);
    Err(ErrorInfo::new(AGENT_CRASHED, format!("{target} ended before the request reached it")))
}

fn describe_status(status: Option<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match status {
        Some(status) => match (status.code(), status.signal()) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(signal)) => {
                let name = nix::sys::signal::Signal::try_from(signal).map(|s| s.as_str()).unwrap_or("?");
                format!("killed by signal {signal} ({name})")
            }
            _ => "ended".to_owned(),
        },
        None => "unknown status".to_owned(),
    }
}

/// Waits for the process to end (or kills it when asked), then settles
/// what depended on it.
async fn watch_exit(
    inner: Weak<Inner>,
    instance: AgentInstance,
    generation: u64,
    pid: u32,
    mut child: tokio::process::Child,
    kill: oneshot::Receiver<()>,
    exited: watch::Sender<bool>,
) {
    let status = tokio::select! {
        status = child.wait() => status.ok(),
        _ = kill => {
            let _ = child.start_kill();
            child.wait().await.ok()
        }
    };
    let clean = status.is_some_and(|s| s.success());
    let described = describe_status(status);
    if let Some(inner) = inner.upgrade() {
        process_ended(&inner, &instance, generation, pid, clean, &described).await;
    }
    let _ = exited.send(true);
}

async fn process_ended(
    inner: &Arc<Inner>,
    instance: &AgentInstance,
    generation: u64,
    pid: u32,
    clean: bool,
    status: &str,
) {
    let mut answers = Vec::new();
    let mut cancels = Vec::new();
    let (crashed, restart) = {
        let mut state = lock(&inner.state);
        let stopping = state.stopping;
        let Some(slot) = state.slots.get_mut(instance) else { return };
        if slot.running.as_ref().is_none_or(|r| r.generation != generation) {
            return;
        }
        slot.running = None;
        let restart = slot.restart_requested && clean && !stopping;
        let crashed = !clean && !stopping;
        if crashed {
            slot.crashes += 1;
            let delay = backoff::delay_after(slot.crashes);
            slot.not_before = (!delay.is_zero()).then(|| Instant::now() + delay);
        }
        // What it was asked, and what it asked.
        let dead: Vec<String> = state
            .pending
            .iter()
            .filter(|(_, p)| {
                (p.target == *instance && p.delivered_to == Some(generation))
                    || (p.echo.is_none() && matches!(&p.waiter, Waiter::Agent(a) if a == instance))
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in dead {
            state.waits.remove(&id);
            let Some(pending) = state.pending.remove(&id) else { continue };
            if pending.target == *instance && pending.delivered_to == Some(generation) {
                answers.push((id, pending.waiter));
            } else if let Some(link) = state.slots.get(&pending.target).and_then(|s| s.running.as_ref()) {
                cancels.push((id, Arc::clone(&link.link), pending.target.clone()));
            }
        }
        (crashed, restart)
    };
    inner.observer.exited(instance, pid, status, crashed);
    let reason = if clean { "stopped" } else { "crashed" };
    for (id, waiter) in answers {
        let answer = DelegateResultPayload::error(
            AGENT_CRASHED,
            format!("{instance} (pid {pid}) {reason} before it answered ({status}); its next message starts it again"),
        );
        deliver(inner, waiter, &id, instance, answer).await;
    }
    for (id, link, target) in cancels {
        let cancel = IpcMessage::Cancel(
            Routed::new(ORCHESTRATOR, target.to_string(), CancelPayload { reason: format!("{instance} ended") })
                .correlated(id),
        );
        let _ = link.send(cancel).await;
    }
    if restart {
        // A restart it asked for: up again at once, with the bundle as it is now.
        let inner = Arc::clone(inner);
        let instance = instance.clone();
        tokio::spawn(async move {
            if let Err(error) = ensure(&inner, &instance).await {
                tracing::warn!("restarting {instance}: {}", error.message);
            }
        });
    }
}

/// The link to `instance`'s process, if one runs.
fn link_of(inner: &Inner, instance: &AgentInstance) -> Option<LinkSender> {
    lock(&inner.state).slots.get(instance).and_then(|slot| slot.running.as_ref().map(|r| Arc::clone(&r.link)))
}

/// Hands an answer to whoever waits for it.
async fn deliver(
    inner: &Arc<Inner>,
    waiter: Waiter,
    correlation_id: &str,
    responder: &AgentInstance,
    answer: DelegateResultPayload,
) {
    match waiter {
        Waiter::Cli(reply) => {
            let _ = reply.send(answer);
        }
        Waiter::Agent(caller) => {
            let link = link_of(inner, &caller);
            let link = match link {
                Some(link) => link,
                // An asynchronous answer goes into the caller's conversation
                // whatever became of the process that asked.
                None if answer.request.is_some() => match ensure(inner, &caller).await {
                    Ok((link, _)) => link,
                    Err(error) => {
                        tracing::warn!(
                            "the answer of {correlation_id} could not be delivered to {caller}: {}",
                            error.message
                        );
                        return;
                    }
                },
                None => {
                    tracing::debug!("{caller} ended before the answer of {correlation_id} arrived; dropped");
                    return;
                }
            };
            let message = IpcMessage::DelegateResult(
                Routed::new(responder.to_string(), caller.to_string(), answer).correlated(correlation_id),
            );
            if let Err(error) = link.send(message).await {
                tracing::debug!("delivering the answer of {correlation_id} to {caller}: {error}");
            }
        }
    }
}

/// Reads one agent process's messages until its connection ends.
async fn read_agent(inner: Weak<Inner>, from: AgentInstance, mut receiver: Box<dyn LinkReceiver>) {
    loop {
        let message = match receiver.recv().await {
            Ok(Some(message)) => message,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!("the connection of {from} failed: {error}");
                return;
            }
        };
        let Some(inner) = inner.upgrade() else { return };
        match message {
            IpcMessage::Delegate(message) => {
                tokio::spawn(route_delegate(inner, from.clone(), message, true));
            }
            IpcMessage::Event(message) => {
                tokio::spawn(route_delegate(inner, from.clone(), message, false));
            }
            IpcMessage::DelegateResult(message) => route_result(&inner, &from, message).await,
            IpcMessage::Call(message) => {
                tokio::spawn(answer_call(inner, from.clone(), message));
            }
            IpcMessage::Cancel(message) => {
                let Some(id) = message.correlation_id else { continue };
                let target = {
                    let mut state = lock(&inner.state);
                    state.waits.remove(&id);
                    state.pending.remove(&id).map(|p| p.target)
                };
                let link = target.as_ref().and_then(|target| link_of(&inner, target));
                if let (Some(target), Some(link)) = (target, link) {
                    let cancel = IpcMessage::Cancel(
                        Routed::new(from.to_string(), target.to_string(), message.payload).correlated(id),
                    );
                    let _ = link.send(cancel).await;
                }
            }
            IpcMessage::Observe(message) => {
                if let ObservePayload::TurnEnded { summary } = &message.payload
                    && summary.restart_requested
                    && let Some(slot) = lock(&inner.state).slots.get_mut(&from)
                {
                    slot.restart_requested = true;
                }
                inner.observer.observe(&from, &message.payload);
            }
            IpcMessage::ShutdownAck(_) => tracing::debug!("{from} acknowledged the shutdown"),
            other => tracing::debug!("{from} sent an unexpected {} message; ignored", other.kind()),
        }
    }
}

async fn route_result(inner: &Arc<Inner>, from: &AgentInstance, message: Routed<DelegateResultPayload>) {
    let Some(id) = message.correlation_id else { return };
    let pending = {
        let mut state = lock(&inner.state);
        state.waits.remove(&id);
        let pending = state.pending.remove(&id);
        if matches!(message.payload.status, goondan_ipc::ResultStatus::Ok)
            && let Some(slot) = state.slots.get_mut(from)
        {
            // A turn answered: the process is healthy.
            slot.crashes = 0;
            slot.not_before = None;
        }
        pending
    };
    let Some(pending) = pending else {
        tracing::debug!("the answer of {id} from {from} has nobody waiting (the caller gave up); dropped");
        return;
    };
    if pending.target != *from {
        tracing::warn!("{from} answered {id}, which was sent to {}; dropped", pending.target);
        return;
    }
    let mut answer = message.payload;
    answer.responder = Some(from.clone());
    answer.request = pending.echo;
    deliver(inner, pending.waiter, &id, from, answer).await;
}

/// A `delegate` (`wants_answer`) or `event` from `caller`.
async fn route_delegate(
    inner: Arc<Inner>,
    caller: AgentInstance,
    message: Routed<DelegatePayload>,
    wants_answer: bool,
) {
    let Some(id) = message.correlation_id.clone() else {
        tracing::warn!(
            "{caller} sent a {} without a correlation id; dropped",
            if wants_answer { "delegate" } else { "event" }
        );
        return;
    };
    let plan = &inner.plan;
    let target = AgentInstance::new(message.to.clone(), message.payload.instance_key.clone());
    let refuse = |error: ErrorInfo| async {
        let link = link_of(&inner, &caller);
        if let Some(link) = link {
            let reply = if wants_answer {
                IpcMessage::DelegateResult(
                    Routed::new(ORCHESTRATOR, caller.to_string(), DelegateResultPayload::failed(error))
                        .correlated(id.clone()),
                )
            } else {
                IpcMessage::CallResult(
                    Routed::new(
                        ORCHESTRATOR,
                        caller.to_string(),
                        CallResultPayload { output: JsonValue::Null, error: Some(error) },
                    )
                    .correlated(id.clone()),
                )
            };
            let _ = link.send(reply).await;
        }
    };
    if !plan.has_agent(&target.agent) {
        let error = ErrorInfo::new(
            AGENT_NOT_FOUND,
            format!(
                "no agent '{}' in swarm '{}' (its agents: {})",
                target.agent,
                plan.swarm.name,
                plan.swarm.agents.join(", ")
            ),
        )
        .suggest("Call agents__catalog for the agents you can reach.");
        refuse(error).await;
        return;
    }
    if message.payload.hops > plan.hop_limit {
        let error = ErrorInfo::new(
            AGENT_HOP_LIMIT,
            format!(
                "this request would be hop {} of a chain of agent requests; the limit is {}",
                message.payload.hops, plan.hop_limit
            ),
        )
        .suggest("Answer with what you have instead of delegating further.");
        refuse(error).await;
        return;
    }
    if wants_answer {
        let refused = {
            let mut state = lock(&inner.state);
            let cycle = if message.payload.asynchronous { None } else { state.waits.cycle(&caller, &target) };
            match cycle {
                Some(cycle) => Some(
                    ErrorInfo::new(
                        CIRCULAR_CALL_DETECTED,
                        format!(
                            "{target} is waiting for {caller} already ({}); a synchronous request would never be answered",
                            describe(&cycle)
                        ),
                    )
                    .suggest("Answer the request you are working on instead, or use async: true or agents__send."),
                ),
                None => {
                    if !message.payload.asynchronous {
                        state.waits.add(&id, caller.clone(), target.clone());
                    }
                    let echo = message.payload.asynchronous.then(|| goondan_ipc::AsyncRequestEcho {
                        target: target.agent.clone(),
                        event_id: message.payload.event_id.clone(),
                        event_type: message.payload.event_type.clone(),
                        metadata: message.payload.metadata.clone(),
                        trace_id: message.payload.trace_id.clone().unwrap_or_default(),
                    });
                    state.pending.insert(
                        id.clone(),
                        Pending { waiter: Waiter::Agent(caller.clone()), target: target.clone(), delivered_to: None, echo },
                    );
                    None
                }
            }
        };
        if let Some(error) = refused {
            refuse(error).await;
            return;
        }
    }
    {
        let mut state = lock(&inner.state);
        state.slots.entry(target.clone()).or_insert_with(|| Slot::new(Some(caller.clone())));
    }
    let link = match ensure(&inner, &target).await {
        Ok((link, generation)) => {
            if wants_answer && let Err(error) = mark_delivered(&inner, &id, &target, generation) {
                refuse(error).await;
                return;
            }
            link
        }
        Err(error) => {
            {
                let mut state = lock(&inner.state);
                state.waits.remove(&id);
                state.pending.remove(&id);
            }
            refuse(error).await;
            return;
        }
    };
    let from = caller.to_string();
    let forwarded = if wants_answer {
        IpcMessage::Delegate(Routed { from, ..message })
    } else {
        IpcMessage::Event(Routed { from, ..message })
    };
    if let Err(error) = link.send(forwarded).await {
        {
            let mut state = lock(&inner.state);
            state.waits.remove(&id);
            state.pending.remove(&id);
        }
        refuse(ErrorInfo::new(IPC_DELIVERY_FAILED, format!("delivering to {target}: {error}"))).await;
        return;
    }
    if !wants_answer {
        // An event is acknowledged once its target has it.
        let link = link_of(&inner, &caller);
        if let Some(link) = link {
            let ack = IpcMessage::CallResult(
                Routed::new(
                    ORCHESTRATOR,
                    caller.to_string(),
                    CallResultPayload {
                        output: json!({"accepted": true, "instanceKey": target.instance_key}),
                        error: None,
                    },
                )
                .correlated(id),
            );
            let _ = link.send(ack).await;
        }
    }
}

async fn answer_call(inner: Arc<Inner>, caller: AgentInstance, message: Routed<CallPayload>) {
    let Some(id) = message.correlation_id.clone() else { return };
    let result = match message.payload {
        CallPayload::List { include_all } => Ok(list(&inner, &caller, include_all)),
        CallPayload::Spawn { target, instance_key, cwd, caller_workdir } => {
            spawn(&inner, &caller, target, instance_key, cwd, &caller_workdir).await
        }
    };
    let payload = match result {
        Ok(output) => CallResultPayload { output, error: None },
        Err(error) => CallResultPayload { output: JsonValue::Null, error: Some(error) },
    };
    let link = link_of(&inner, &caller);
    if let Some(link) = link {
        let _ = link
            .send(IpcMessage::CallResult(Routed::new(ORCHESTRATOR, caller.to_string(), payload).correlated(id)))
            .await;
    }
}

fn list(inner: &Inner, caller: &AgentInstance, include_all: bool) -> JsonValue {
    let state = lock(&inner.state);
    let agents: Vec<JsonValue> = state
        .slots
        .iter()
        .filter(|(instance, slot)| *instance != caller && (include_all || slot.owner.as_ref() == Some(caller)))
        .map(|(instance, slot)| {
            let status = match (&slot.running, slot.not_before) {
                (Some(_), _) => "running",
                (None, Some(at)) if Instant::now() < at => "backoff",
                (None, _) => "idle",
            };
            json!({
                "target": instance.agent,
                "instanceKey": instance.instance_key,
                "ownerAgent": slot.owner.as_ref().map(|o| o.agent.clone()),
                "ownerInstanceKey": slot.owner.as_ref().map(|o| o.instance_key.clone()),
                "createdAt": slot.created_at,
                "cwd": slot.cwd.as_ref().map(|c| c.display().to_string()),
                "status": status,
                "pid": slot.running.as_ref().map(|r| r.pid),
            })
        })
        .collect();
    json!({"count": agents.len(), "agents": agents})
}

async fn spawn(
    inner: &Arc<Inner>,
    caller: &AgentInstance,
    target: String,
    instance_key: Option<String>,
    cwd: Option<String>,
    caller_workdir: &str,
) -> Result<JsonValue, ErrorInfo> {
    let plan = &inner.plan;
    if !plan.has_agent(&target) {
        return Err(ErrorInfo::new(
            AGENT_NOT_FOUND,
            format!(
                "no agent '{target}' in swarm '{}' (its agents: {})",
                plan.swarm.name,
                plan.swarm.agents.join(", ")
            ),
        ));
    }
    let instance_key = instance_key.unwrap_or_else(|| {
        let id = goondan_core::ids::new_id().replace('-', "");
        format!("{target}-{}", &id[..12.min(id.len())])
    });
    let cwd = match cwd {
        Some(cwd) => Some(confine(Path::new(caller_workdir), &cwd)?),
        None => None,
    };
    let instance = AgentInstance::new(target.clone(), instance_key.clone());
    let spawned = {
        let mut state = lock(&inner.state);
        let spawned = !state.slots.contains_key(&instance);
        let slot = state.slots.entry(instance.clone()).or_insert_with(|| Slot::new(Some(caller.clone())));
        if cwd.is_some() {
            slot.cwd.clone_from(&cwd);
        }
        spawned
    };
    let pid = match ensure(inner, &instance).await {
        Ok(_) => lock(&inner.state).slots.get(&instance).and_then(|s| s.running.as_ref().map(|r| r.pid)),
        Err(error) => return Err(error),
    };
    let cwd = lock(&inner.state).slots.get(&instance).and_then(|s| s.cwd.clone());
    Ok(json!({
        "target": target,
        "instanceKey": instance_key,
        "spawned": spawned,
        "cwd": cwd.map(|c| c.display().to_string()),
        "pid": pid,
    }))
}

/// `cwd` resolved against `base`, refused unless it stays inside it (also
/// once links are followed); created if missing.
fn confine(base: &Path, cwd: &str) -> Result<PathBuf, ErrorInfo> {
    let refuse = |why: String| {
        ErrorInfo::new(AGENT_INVALID_REQUEST, format!("cwd '{cwd}' {why}"))
            .suggest("Give a directory inside your working directory, relative to it.")
    };
    let base = std::fs::canonicalize(base).map_err(|e| refuse(format!("cannot be checked: {e}")))?;
    let mut joined = base.clone();
    for component in Path::new(cwd).components() {
        match component {
            Component::Normal(part) => joined.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if !joined.pop() || !joined.starts_with(&base) {
                    return Err(refuse(format!("leaves {}", base.display())));
                }
            }
            Component::RootDir | Component::Prefix(_) => joined = PathBuf::from("/"),
        }
    }
    if !joined.starts_with(&base) {
        return Err(refuse(format!("is outside {}", base.display())));
    }
    std::fs::create_dir_all(&joined).map_err(|e| refuse(format!("cannot be created: {e}")))?;
    let real = std::fs::canonicalize(&joined).map_err(|e| refuse(format!("cannot be resolved: {e}")))?;
    if !real.starts_with(&base) {
        return Err(refuse(format!("leads outside {} through a link", base.display())));
    }
    Ok(real)
}

fn new_correlation_id() -> String {
    format!("corr-{}", goondan_core::ids::new_id())
}

fn iso_now() -> String {
    let millis = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    goondan_core::js_message::format_rfc3339_millis(u64::try_from(millis).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cwd_stays_inside_the_callers_workdir() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let inside = confine(dir.path(), "sub/task").unwrap_or_else(|e| panic!("{e:?}"));
        assert!(inside.ends_with("sub/task") && inside.is_dir());
        assert!(confine(dir.path(), "../elsewhere").is_err());
        assert!(confine(dir.path(), "/etc").is_err());
        assert!(confine(dir.path(), "a/../../b").is_err());
        let outside = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        if std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).is_ok() {
            assert!(confine(dir.path(), "link/x").is_err());
        }
    }

    #[tokio::test]
    async fn a_process_that_keeps_dying_is_backed_off_after_five_crashes() {
        let plan = SwarmPlan::new(
            goondan_ipc::SwarmInfo { name: "s".into(), entry_agent: "a".into(), agents: vec!["a".into()] },
            "/b".into(),
            "/s".into(),
            "/w".into(),
        );
        // A real process that exits at once, before it ever says hello.
        let orchestrator = Orchestrator::start(
            plan,
            AgentLauncher::new("/bin/false", Vec::<String>::new()),
            Arc::new(NoSwarmObserver),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let instance = AgentInstance::new("a", "k");
        for attempt in 1..=backoff::FREE_RESTARTS + 1 {
            let error = orchestrator.start_instance(&instance).await.err().unwrap_or_else(|| panic!("started"));
            assert_eq!(error.code, AGENT_UNAVAILABLE);
            assert!(error.message.contains("ended at start: exit code 1"), "attempt {attempt}: {}", error.message);
        }
        let error = orchestrator.start_instance(&instance).await.err().unwrap_or_else(|| panic!("started"));
        assert!(error.message.contains("crashed 6 times in a row"), "{}", error.message);
        assert!(orchestrator.pid_of(&instance).is_none());
    }
}
