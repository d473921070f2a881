//! The hub: one task that owns the swarm's state and takes its inputs, one
//! at a time, from a channel ([`HubCommand`]). Nothing else touches the
//! state, so there are no locks; nothing in a handler waits, so one slow
//! process never holds up the others: starting a process, reading it,
//! writing to it and timers run as tasks that report back with a command.
//!
//! ```text
//! ask(instance, inbound)  (the terminal, or a stored connector event: gdn run)
//!   pending[id] = terminal; the delegate waits in the instance's slot until a process runs it
//!   no process: start one (or queue for a place under the bound) ─► hello ─► init ─► ready
//!   the process runs a turn ─► delegate_result ─► the terminal's reply
//! an agent's delegate (agents__request) to target T:
//!   unknown agent → AGENT_NOT_FOUND; hops over the limit → AGENT_HOP_LIMIT_EXCEEDED;
//!   synchronous and T waits (transitively) for the caller → CIRCULAR_CALL_DETECTED
//!   pending[id] = caller; hand it to T (started if needed) ─► T's delegate_result ─► the caller
//! an agent's event (agents__send): hand it to T, acknowledge with call_result
//! an agent's call: spawn | list, answered with call_result (catalog is answered in the agent process)
//! a process ends (after everything it sent was read):
//!   its callers' requests get AGENT_CRASHED; requests it made are cancelled;
//!   a crash (not exit 0) counts; after 5 in a row the next start waits 1 s, 2 s, … 5 min;
//!   a turn answered resets the count; the next message starts it again
//! the bound: at most max_processes processes live; a start over it waits for an idle one to be
//!   stopped (or one to end), and is refused with AGENT_CAPACITY_EXCEEDED after capacity_wait
//!   without progress; a process idle for idle_timeout is stopped (its state is on disk)
//! restart(selector) (the operator): the selected processes get `shutdown` and finish their turns;
//!   held down until all ended, a step (`--fresh`: clear their conversations), then released (holds.rs)
//! shutdown: `shutdown` to every process, the grace period, then SIGKILL
//! ```
//!
//! The hub trusts nothing a message says about who sent it: the sender is
//! the instance whose connection the message came on.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use goondan_ipc::{AgentInstance, DelegateResultPayload, ErrorInfo, IpcMessage};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::codes::AGENT_UNAVAILABLE;
use crate::launcher::{Launch, ProcessEnd, Started};
use crate::orchestrator::SwarmObserver;
use crate::plan::SwarmPlan;
use crate::start::report;
use crate::waits::WaitGraph;

pub(crate) mod holds;
mod processes;
mod routing;

/// Everything the hub acts on. A connector's event reaches it as an `Ask`
/// (with the event's type, metadata and source) from the ingress
/// dispatcher of `gdn run`, once the event is stored.
pub(crate) enum HubCommand {
    // From the front end (`gdn run`: the terminal).
    /// A turn of `instance` with input from outside the swarm (the terminal,
    /// or a connector's event); its answer goes to `reply`.
    Ask {
        instance: AgentInstance,
        correlation_id: String,
        inbound: Box<crate::orchestrator::Inbound>,
        reply: oneshot::Sender<DelegateResultPayload>,
    },
    /// The terminal interrupted the turn it asked for.
    CancelAsk { correlation_id: String },
    /// Start `instance`'s process now if none runs; its pid.
    StartInstance { instance: AgentInstance, reply: oneshot::Sender<Result<u32, ErrorInfo>> },
    /// The pid of the process running `instance`, if one runs.
    PidOf { instance: AgentInstance, reply: oneshot::Sender<Option<u32>> },
    /// Stop every process; `done` once all have exited.
    Shutdown { reason: String, done: oneshot::Sender<()> },
    /// Restart the selected instances (see [`holds`]).
    Restart {
        selector: holds::InstanceSelector,
        while_down: Option<holds::WhileDown>,
        /// Only if every selected instance is idle (else nothing is done
        /// and the report says `busy`).
        if_idle: bool,
        reply: oneshot::Sender<holds::RestartReport>,
    },

    // From agent processes.
    /// A message of the process `generation` of `from`.
    FromAgent { from: AgentInstance, generation: u64, message: Box<IpcMessage> },
    /// The process ended (after its last message was read).
    Exited { instance: AgentInstance, generation: u64, pid: u32, end: ProcessEnd },

    // From the hub's own tasks.
    /// A start finished: the process is ready, or why not.
    Started { instance: AgentInstance, generation: u64, result: Box<Result<Started, ErrorInfo>> },
    /// A request could not be written to its target (over the frame limit).
    Undelivered { correlation_id: String, error: ErrorInfo },
    /// The shutdown grace period is over: kill what still runs.
    GraceOver,
    /// Killed processes did not end either: stop waiting for them.
    GiveUp,
    /// The step of a restart ran: its instances are released.
    Released { hold: u64, result: Result<(), String> },
    /// No process starts while `paused` (the bundle on disk is broken);
    /// work waits for one.
    PauseStarts { paused: bool },
    /// Hand a task's cancel to `instance`'s process; whether one runs.
    CancelTask { instance: AgentInstance, handle: String, reply: oneshot::Sender<bool> },
}

/// How long killed processes get to end before the shutdown stops waiting.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Why a running process is on its way out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retiring {
    /// Its turn asked for a restart: it exits, and is started again at once.
    Restart,
    /// Stopped for idling (or to make room under the bound).
    Idle,
    /// The swarm is stopping.
    Shutdown,
    /// The operator restarts it: it stays down until the restart is through.
    Reload,
}

/// A running agent process.
struct Running {
    // Unbounded: the hub is a synchronous actor and must never wait on one
    // process. What it holds is bounded by the callers: every request in it
    // has a caller waiting for its answer (or its acceptance), and the rest
    // (cancels, answers, shutdown) follow those requests one for one.
    outbox: mpsc::UnboundedSender<IpcMessage>,
    pid: u32,
    generation: u64,
    kill: Option<oneshot::Sender<()>>,
    retiring: Option<Retiring>,
    /// `delegate` and `event` messages handed to it (its `idle` reports count them).
    jobs_sent: u64,
    /// Since when it has had nothing to do.
    idle_since: Option<Instant>,
}

enum Process {
    Down,
    Starting(u64),
    Up(Running),
}

/// Something for an instance's process to receive, kept until one runs.
enum Work {
    /// A `delegate` or `event` to hand over.
    Request(Request),
    /// The terminal asked for the process to run: its pid.
    Started(oneshot::Sender<Result<u32, ErrorInfo>>),
    /// An agent's `spawn` call, answered once the process runs.
    SpawnAnswer { caller: AgentInstance, correlation_id: String, spawned: bool },
    /// The answer of an asynchronous request its earlier process made.
    Answer { correlation_id: String, responder: AgentInstance, answer: DelegateResultPayload },
}

struct Request {
    correlation_id: String,
    /// `None`: the terminal.
    caller: Option<AgentInstance>,
    message: IpcMessage,
    wants_answer: bool,
}

/// One agent instance the hub knows.
struct Slot {
    process: Process,
    waiting: Vec<Work>,
    /// Since when it has waited for a place under the bound.
    queued_since: Option<Instant>,
    crashes: u32,
    not_before: Option<Instant>,
    owner: Option<AgentInstance>,
    created_at: String,
    cwd: Option<PathBuf>,
}

impl Slot {
    fn new(owner: Option<AgentInstance>) -> Self {
        Self {
            process: Process::Down,
            waiting: Vec::new(),
            queued_since: None,
            crashes: 0,
            not_before: None,
            owner,
            created_at: iso_now(),
            cwd: None,
        }
    }

    fn running(&self) -> Option<&Running> {
        match &self.process {
            Process::Up(running) => Some(running),
            _ => None,
        }
    }

    fn running_mut(&mut self) -> Option<&mut Running> {
        match &mut self.process {
            Process::Up(running) => Some(running),
            _ => None,
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
    /// The terminal interrupted it before it was handed over.
    cancelled: bool,
    /// Its target's host was lost while it ran: the transport hands it to
    /// the target's next process by itself (see `ProcessEnd::host_lost`).
    relocating: bool,
}

/// The swarm's state, owned by the hub's task.
pub(crate) struct Hub {
    plan: Arc<SwarmPlan>,
    launcher: Arc<dyn Launch>,
    observer: Arc<dyn SwarmObserver>,
    /// For the tasks it starts (weak: the hub ends when the front end is gone).
    me: mpsc::WeakSender<HubCommand>,
    /// Every task it starts (and itself): they end with it — a start
    /// within its timeout, a process's reader once its kill switch drops,
    /// a writer once its outbox does, a timer at its report or at `ended`.
    tasks: TaskTracker,
    /// Cancelled when the hub's task ends, so that its timers end with it
    /// instead of sleeping out a grace no one waits for any more.
    ended: CancellationToken,
    slots: BTreeMap<AgentInstance, Slot>,
    pending: HashMap<String, Pending>,
    waits: WaitGraph,
    next_generation: u64,
    /// Instances waiting for a place under the bound, first come first served.
    queue: VecDeque<AgentInstance>,
    /// The last time a place was taken or freed.
    last_progress: Instant,
    /// Set once the swarm is stopping: who waits for the end.
    stopping: Option<Vec<oneshot::Sender<()>>>,
    /// Restarts in progress.
    holds: Vec<holds::Hold>,
    /// The id of the last restart.
    next_hold: u64,
    /// No process starts (see [`HubCommand::PauseStarts`]).
    starts_paused: bool,
}

impl Hub {
    pub(crate) fn new(
        plan: Arc<SwarmPlan>,
        launcher: Arc<dyn Launch>,
        observer: Arc<dyn SwarmObserver>,
        me: mpsc::WeakSender<HubCommand>,
        tasks: TaskTracker,
    ) -> Self {
        Self {
            plan,
            launcher,
            observer,
            me,
            tasks,
            ended: CancellationToken::new(),
            slots: BTreeMap::new(),
            pending: HashMap::new(),
            waits: WaitGraph::default(),
            next_generation: 0,
            queue: VecDeque::new(),
            last_progress: Instant::now(),
            stopping: None,
            holds: Vec::new(),
            next_hold: 0,
            starts_paused: false,
        }
    }

    /// Takes commands until the front end is gone; dropping the state then
    /// kills every process (their kill switches drop with it).
    /// `paused` is [`HubCommand::PauseStarts`] as a value: a change is
    /// taken before the commands sent after it.
    pub(crate) async fn run(mut self, mut commands: mpsc::Receiver<HubCommand>, mut paused: watch::Receiver<bool>) {
        let _ended = self.ended.clone().drop_guard();
        let mut tick = tokio::time::interval(self.tick_period());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pausing = true;
        loop {
            tokio::select! {
                biased;
                changed = paused.changed(), if pausing => match changed {
                    Ok(()) => {
                        let paused = *paused.borrow_and_update();
                        self.handle(HubCommand::PauseStarts { paused });
                    }
                    Err(_) => pausing = false,
                },
                _ = tick.tick() => self.on_tick(),
                command = commands.recv() => match command {
                    Some(command) => self.handle(command),
                    None => break,
                },
            }
        }
    }

    fn tick_period(&self) -> Duration {
        let finest = self.plan.idle_timeout.unwrap_or(Duration::MAX).min(self.plan.capacity_wait);
        (finest / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
    }

    fn handle(&mut self, command: HubCommand) {
        match command {
            HubCommand::Ask { instance, correlation_id, inbound, reply } => {
                self.ask(instance, correlation_id, *inbound, reply);
            }
            HubCommand::CancelAsk { correlation_id } => self.cancel_ask(&correlation_id),
            HubCommand::StartInstance { instance, reply } => {
                self.slots.entry(instance.clone()).or_insert_with(|| Slot::new(None));
                self.enqueue(&instance, Work::Started(reply));
            }
            HubCommand::PidOf { instance, reply } => {
                let _ = reply.send(self.slots.get(&instance).and_then(|s| s.running().map(|r| r.pid)));
            }
            HubCommand::Shutdown { reason, done } => self.shutdown(&reason, done),
            HubCommand::Restart { selector, while_down, if_idle, reply } => {
                self.restart(selector, while_down, if_idle, reply);
            }
            HubCommand::Released { hold, result } => self.released(hold, result),
            HubCommand::CancelTask { instance, handle, reply } => {
                let running = self.slots.get(&instance).and_then(Slot::running).is_some();
                if running {
                    // The task of an asynchronous request is its correlation
                    // id: the turn that works on it is cancelled too (its
                    // answer would have nobody waiting for it).
                    self.cancel_async_request(&instance, &handle);
                    let payload = goondan_ipc::TaskCancelPayload { handle };
                    let message = IpcMessage::TaskCancel(goondan_ipc::Routed::new(
                        goondan_ipc::ORCHESTRATOR,
                        instance.to_string(),
                        payload,
                    ));
                    self.send_to(&instance, message);
                }
                let _ = reply.send(running);
            }
            HubCommand::PauseStarts { paused } => {
                self.starts_paused = paused;
                if !paused {
                    let waiting: Vec<AgentInstance> =
                        self.slots.iter().filter(|(_, s)| !s.waiting.is_empty()).map(|(i, _)| i.clone()).collect();
                    for instance in &waiting {
                        self.serve(instance, false);
                    }
                    self.pump();
                }
            }
            HubCommand::FromAgent { from, generation, message } => self.on_agent_message(from, generation, *message),
            HubCommand::Exited { instance, generation, pid, end } => {
                self.process_ended(&instance, generation, pid, end);
            }
            HubCommand::Started { instance, generation, result } => self.started(&instance, generation, *result),
            HubCommand::Undelivered { correlation_id, error } => {
                self.waits.remove(&correlation_id);
                if let Some(pending) = self.pending.remove(&correlation_id) {
                    let target = pending.target.clone();
                    // It never reached the process: not a job it will report as taken.
                    if let Some(running) = self.slots.get_mut(&target).and_then(Slot::running_mut)
                        && pending.delivered_to == Some(running.generation)
                    {
                        running.jobs_sent = running.jobs_sent.saturating_sub(1);
                    }
                    self.deliver(pending.waiter, &correlation_id, &target, DelegateResultPayload::failed(error));
                }
            }
            HubCommand::GraceOver => self.kill_the_rest(),
            HubCommand::GiveUp => {
                if let Some(done) = self.stopping.as_mut() {
                    tracing::warn!("agent processes did not end after SIGKILL; not waiting for them");
                    for done in done.drain(..) {
                        let _ = done.send(());
                    }
                }
            }
        }
    }

    // ---- shutdown ----

    fn shutdown(&mut self, reason: &str, done: oneshot::Sender<()>) {
        if let Some(waiting) = self.stopping.as_mut() {
            waiting.push(done);
            self.check_stopped();
            return;
        }
        self.stopping = Some(vec![done]);
        self.fail_holds();
        let unavailable = ErrorInfo::new(AGENT_UNAVAILABLE, "the swarm is shutting down");
        let instances: Vec<AgentInstance> = self.slots.keys().cloned().collect();
        for instance in &instances {
            self.fail_waiting(instance, &unavailable);
            self.retire(instance, Retiring::Shutdown, reason);
        }
        let grace = self.plan.shutdown_grace;
        let hub = self.me.clone();
        let ended = self.ended.clone();
        self.tasks.spawn(async move {
            let timer = async {
                tokio::time::sleep(grace).await;
                if report(&hub, HubCommand::GraceOver).await {
                    tokio::time::sleep(KILL_WAIT).await;
                    report(&hub, HubCommand::GiveUp).await;
                }
            };
            tokio::select! {
                () = ended.cancelled() => {}
                () = timer => {}
            }
        });
        self.check_stopped();
    }

    fn kill_the_rest(&mut self) {
        let grace = self.plan.shutdown_grace;
        for (instance, slot) in &mut self.slots {
            if let Some(running) = slot.running_mut()
                && let Some(kill) = running.kill.take()
            {
                tracing::warn!("{instance} did not stop within {grace:?} of shutdown; killing it");
                let _ = kill.send(());
            }
        }
    }

    /// Tells who waits for the end of a shutdown, once no process is left.
    fn check_stopped(&mut self) {
        if self.live() > 0 {
            return;
        }
        if let Some(waiting) = self.stopping.as_mut() {
            for done in waiting.drain(..) {
                let _ = done.send(());
            }
        }
    }
}

fn iso_now() -> String {
    let millis = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    goondan_core::js_message::format_rfc3339_millis(u64::try_from(millis).unwrap_or(u64::MAX))
}
