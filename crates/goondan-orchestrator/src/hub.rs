//! The hub: one task that owns the swarm's state and takes its inputs, one
//! at a time, from a channel ([`HubCommand`]). Nothing else touches the
//! state, so there are no locks; nothing in a handler waits, so one slow
//! process never holds up the others: starting a process, reading it,
//! writing to it and timers run as tasks that report back with a command.
//!
//! ```text
//! ask(instance, input)  (the terminal: gdn run)
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
//! shutdown: `shutdown` to every process, the grace period, then SIGKILL
//! ```
//!
//! The hub trusts nothing a message says about who sent it: the sender is
//! the instance whose connection the message came on.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Component, Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use goondan_core::JsonValue;
use goondan_ipc::{
    AgentInstance, CLI, CallPayload, CallResultPayload, CancelPayload, DelegatePayload, DelegateResultPayload,
    ErrorInfo, InitPayload, IpcMessage, ORCHESTRATOR, ObservePayload, Routed, ShutdownPayload,
};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use crate::backoff;
use crate::codes::{
    AGENT_CAPACITY_EXCEEDED, AGENT_CRASHED, AGENT_HOP_LIMIT, AGENT_INVALID_REQUEST, AGENT_NOT_FOUND, AGENT_UNAVAILABLE,
    CIRCULAR_CALL_DETECTED, IPC_DELIVERY_FAILED,
};
use crate::launcher::AgentLauncher;
use crate::orchestrator::SwarmObserver;
use crate::plan::SwarmPlan;
use crate::start::{self, Started, describe_status, report};
use crate::waits::{WaitGraph, describe};

/// Everything the hub acts on. Round 3 adds the events that come in from
/// connectors and the completions of pending tool results here.
pub(crate) enum HubCommand {
    // From the front end (`gdn run`: the terminal).
    /// A turn of `instance` with the terminal's input; its answer goes to `reply`.
    Ask {
        instance: AgentInstance,
        correlation_id: String,
        input: String,
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

    // From agent processes.
    /// A message of the process `generation` of `from`.
    FromAgent { from: AgentInstance, generation: u64, message: Box<IpcMessage> },
    /// The process ended (after its last message was read).
    Exited { instance: AgentInstance, generation: u64, pid: u32, status: Option<ExitStatus> },

    // From the hub's own tasks.
    /// A start finished: the process is ready, or why not.
    Started { instance: AgentInstance, generation: u64, result: Box<Result<Started, ErrorInfo>> },
    /// A request could not be written to its target (over the frame limit).
    Undelivered { correlation_id: String, error: ErrorInfo },
    /// The shutdown grace period is over: kill what still runs.
    GraceOver,
    /// Killed processes did not end either: stop waiting for them.
    GiveUp,
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
}

/// A running agent process.
struct Running {
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
}

/// The swarm's state, owned by the hub's task.
pub(crate) struct Hub {
    plan: Arc<SwarmPlan>,
    launcher: Arc<AgentLauncher>,
    observer: Arc<dyn SwarmObserver>,
    /// For the tasks it starts (weak: the hub ends when the front end is gone).
    me: mpsc::WeakUnboundedSender<HubCommand>,
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
}

impl Hub {
    pub(crate) fn new(
        plan: Arc<SwarmPlan>,
        launcher: AgentLauncher,
        observer: Arc<dyn SwarmObserver>,
        me: mpsc::WeakUnboundedSender<HubCommand>,
    ) -> Self {
        Self {
            plan,
            launcher: Arc::new(launcher),
            observer,
            me,
            slots: BTreeMap::new(),
            pending: HashMap::new(),
            waits: WaitGraph::default(),
            next_generation: 0,
            queue: VecDeque::new(),
            last_progress: Instant::now(),
            stopping: None,
        }
    }

    /// Takes commands until the front end is gone; dropping the state then
    /// kills every process (their kill switches drop with it).
    pub(crate) async fn run(mut self, mut commands: mpsc::UnboundedReceiver<HubCommand>) {
        let mut tick = tokio::time::interval(self.tick_period());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                command = commands.recv() => match command {
                    Some(command) => self.handle(command),
                    None => break,
                },
                _ = tick.tick() => self.on_tick(),
            }
        }
    }

    fn tick_period(&self) -> Duration {
        let finest = self.plan.idle_timeout.unwrap_or(Duration::MAX).min(self.plan.capacity_wait);
        (finest / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
    }

    fn handle(&mut self, command: HubCommand) {
        match command {
            HubCommand::Ask { instance, correlation_id, input, reply } => {
                self.ask(instance, correlation_id, input, reply);
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
            HubCommand::FromAgent { from, generation, message } => self.on_agent_message(from, generation, *message),
            HubCommand::Exited { instance, generation, pid, status } => {
                self.process_ended(&instance, generation, pid, status);
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

    // ---- the terminal ----

    fn ask(
        &mut self,
        instance: AgentInstance,
        correlation_id: String,
        input: String,
        reply: oneshot::Sender<DelegateResultPayload>,
    ) {
        self.slots.entry(instance.clone()).or_insert_with(|| Slot::new(None));
        self.pending.insert(
            correlation_id.clone(),
            Pending {
                waiter: Waiter::Cli(reply),
                target: instance.clone(),
                delivered_to: None,
                echo: None,
                cancelled: false,
            },
        );
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
        self.enqueue(&instance, Work::Request(Request { correlation_id, caller: None, message, wants_answer: true }));
    }

    fn cancel_ask(&mut self, correlation_id: &str) {
        let Some(pending) = self.pending.get_mut(correlation_id) else { return };
        match pending.delivered_to {
            Some(_) => {
                let target = pending.target.clone();
                let cancel = cancel_message(CLI, &target, "interrupted", correlation_id);
                self.send_to(&target, cancel);
            }
            // Cancelled as soon as it is handed over (the answer then says so).
            None => pending.cancelled = true,
        }
    }

    // ---- messages from agent processes ----

    fn on_agent_message(&mut self, from: AgentInstance, generation: u64, message: IpcMessage) {
        match message {
            IpcMessage::Delegate(message) => self.route_request(from, message, true),
            IpcMessage::Event(message) => self.route_request(from, message, false),
            IpcMessage::DelegateResult(message) => self.route_result(&from, message),
            IpcMessage::Call(message) => self.answer_call(&from, message),
            IpcMessage::Cancel(message) => self.route_cancel(&from, message),
            IpcMessage::Observe(message) => self.observe(&from, generation, message.payload),
            IpcMessage::ShutdownAck(_) => tracing::debug!("{from} acknowledged the shutdown"),
            other => tracing::debug!("{from} sent an unexpected {} message; ignored", other.kind()),
        }
    }

    /// A `delegate` (`wants_answer`) or `event` from `caller`: admitted,
    /// then handed to its target's process (started if needed).
    fn route_request(&mut self, caller: AgentInstance, message: Routed<DelegatePayload>, wants_answer: bool) {
        let Some(id) = message.correlation_id.clone() else {
            tracing::warn!(
                "{caller} sent a {} without a correlation id; dropped",
                if wants_answer { "delegate" } else { "event" }
            );
            return;
        };
        let target = AgentInstance::new(message.to.clone(), message.payload.instance_key.clone());
        if let Err(error) = self.admit(&caller, &target, &id, &message.payload, wants_answer) {
            self.refuse(Some(&caller), &id, wants_answer, error);
            return;
        }
        self.slots.entry(target.clone()).or_insert_with(|| Slot::new(Some(caller.clone())));
        let from = caller.to_string();
        let message = if wants_answer {
            IpcMessage::Delegate(Routed { from, ..message })
        } else {
            IpcMessage::Event(Routed { from, ..message })
        };
        self.enqueue(
            &target,
            Work::Request(Request { correlation_id: id, caller: Some(caller), message, wants_answer }),
        );
    }

    /// Checks a request and, for one that wants an answer, records who waits.
    fn admit(
        &mut self,
        caller: &AgentInstance,
        target: &AgentInstance,
        id: &str,
        payload: &DelegatePayload,
        wants_answer: bool,
    ) -> Result<(), ErrorInfo> {
        self.check_agent(&target.agent)?;
        self.check_hops(payload.hops)?;
        if wants_answer {
            if !payload.asynchronous {
                self.check_cycle(caller, target)?;
                self.waits.add(id, caller.clone(), target.clone());
            }
            let echo = payload.asynchronous.then(|| goondan_ipc::AsyncRequestEcho {
                target: target.agent.clone(),
                event_id: payload.event_id.clone(),
                event_type: payload.event_type.clone(),
                metadata: payload.metadata.clone(),
                trace_id: payload.trace_id.clone().unwrap_or_default(),
            });
            self.pending.insert(
                id.to_owned(),
                Pending {
                    waiter: Waiter::Agent(caller.clone()),
                    target: target.clone(),
                    delivered_to: None,
                    echo,
                    cancelled: false,
                },
            );
        }
        Ok(())
    }

    fn check_agent(&self, agent: &str) -> Result<(), ErrorInfo> {
        if self.plan.has_agent(agent) {
            return Ok(());
        }
        Err(ErrorInfo::new(
            AGENT_NOT_FOUND,
            format!(
                "no agent '{agent}' in swarm '{}' (its agents: {})",
                self.plan.swarm.name,
                self.plan.swarm.agents.join(", ")
            ),
        )
        .suggest("Call agents__catalog for the agents you can reach."))
    }

    fn check_hops(&self, hops: u32) -> Result<(), ErrorInfo> {
        if hops <= self.plan.hop_limit {
            return Ok(());
        }
        Err(ErrorInfo::new(
            AGENT_HOP_LIMIT,
            format!(
                "this request would be hop {hops} of a chain of agent requests; the limit is {}",
                self.plan.hop_limit
            ),
        )
        .suggest("Answer with what you have instead of delegating further."))
    }

    fn check_cycle(&self, caller: &AgentInstance, target: &AgentInstance) -> Result<(), ErrorInfo> {
        let Some(cycle) = self.waits.cycle(caller, target) else { return Ok(()) };
        Err(ErrorInfo::new(
            CIRCULAR_CALL_DETECTED,
            format!(
                "{target} is waiting for {caller} already ({}); a synchronous request would never be answered",
                describe(&cycle)
            ),
        )
        .suggest("Answer the request you are working on instead, or use async: true or agents__send."))
    }

    /// Tells the caller its request `id` failed. The terminal's request
    /// is answered through its pending entry.
    fn refuse(&mut self, caller: Option<&AgentInstance>, id: &str, wants_answer: bool, error: ErrorInfo) {
        self.waits.remove(id);
        if let Some(pending) = self.pending.remove(id)
            && let Waiter::Cli(reply) = pending.waiter
        {
            let _ = reply.send(DelegateResultPayload::failed(error));
            return;
        }
        let Some(caller) = caller else { return };
        let reply = if wants_answer {
            IpcMessage::DelegateResult(
                Routed::new(ORCHESTRATOR, caller.to_string(), DelegateResultPayload::failed(error)).correlated(id),
            )
        } else {
            IpcMessage::CallResult(
                Routed::new(
                    ORCHESTRATOR,
                    caller.to_string(),
                    CallResultPayload { output: JsonValue::Null, error: Some(error) },
                )
                .correlated(id),
            )
        };
        self.send_to(caller, reply);
    }

    fn route_result(&mut self, from: &AgentInstance, message: Routed<DelegateResultPayload>) {
        let Some(id) = message.correlation_id else { return };
        self.waits.remove(&id);
        if matches!(message.payload.status, goondan_ipc::ResultStatus::Ok)
            && let Some(slot) = self.slots.get_mut(from)
        {
            // A turn answered: the process is healthy.
            slot.crashes = 0;
            slot.not_before = None;
        }
        let Some(pending) = self.pending.remove(&id) else {
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
        self.deliver(pending.waiter, &id, from, answer);
    }

    fn route_cancel(&mut self, from: &AgentInstance, message: Routed<CancelPayload>) {
        let Some(id) = message.correlation_id else { return };
        self.waits.remove(&id);
        let Some(pending) = self.pending.remove(&id) else { return };
        let target = pending.target;
        if pending.delivered_to.is_none() {
            // Not handed over yet: it never will be.
            if let Some(slot) = self.slots.get_mut(&target) {
                slot.waiting.retain(|work| !matches!(work, Work::Request(r) if r.correlation_id == id));
            }
            return;
        }
        let cancel =
            IpcMessage::Cancel(Routed::new(from.to_string(), target.to_string(), message.payload).correlated(id));
        self.send_to(&target, cancel);
    }

    fn observe(&mut self, from: &AgentInstance, generation: u64, payload: ObservePayload) {
        let running = self.slots.get_mut(from).and_then(Slot::running_mut).filter(|r| r.generation == generation);
        match payload {
            ObservePayload::Idle { jobs } => {
                if let Some(running) = running
                    && running.jobs_sent == jobs
                {
                    running.idle_since = Some(Instant::now());
                    // It may make room for a start that waits.
                    self.pump();
                }
            }
            payload => {
                if let ObservePayload::TurnEnded { summary } = &payload
                    && summary.restart_requested
                    && let Some(running) = running
                    && running.retiring.is_none()
                {
                    running.retiring = Some(Retiring::Restart);
                }
                self.observer.observe(from, &payload);
            }
        }
    }

    fn answer_call(&mut self, caller: &AgentInstance, message: Routed<CallPayload>) {
        let Some(id) = message.correlation_id else { return };
        let result = match message.payload {
            CallPayload::List { include_all } => Ok(self.list(caller, include_all)),
            CallPayload::Spawn { target, instance_key, cwd, caller_workdir } => {
                match self.prepare_spawn(caller, &target, instance_key, cwd, &caller_workdir) {
                    Ok((instance, spawned)) => {
                        self.enqueue(
                            &instance,
                            Work::SpawnAnswer { caller: caller.clone(), correlation_id: id, spawned },
                        );
                        return;
                    }
                    Err(error) => Err(error),
                }
            }
        };
        self.call_result(caller, &id, result);
    }

    fn call_result(&self, caller: &AgentInstance, id: &str, result: Result<JsonValue, ErrorInfo>) {
        let payload = match result {
            Ok(output) => CallResultPayload { output, error: None },
            Err(error) => CallResultPayload { output: JsonValue::Null, error: Some(error) },
        };
        self.send_to(
            caller,
            IpcMessage::CallResult(Routed::new(ORCHESTRATOR, caller.to_string(), payload).correlated(id)),
        );
    }

    fn list(&self, caller: &AgentInstance, include_all: bool) -> JsonValue {
        let agents: Vec<JsonValue> = self
            .slots
            .iter()
            .filter(|(instance, slot)| *instance != caller && (include_all || slot.owner.as_ref() == Some(caller)))
            .map(|(instance, slot)| {
                let status = match (&slot.process, slot.not_before) {
                    (Process::Up(_) | Process::Starting(_), _) => "running",
                    (Process::Down, Some(at)) if Instant::now() < at => "backoff",
                    (Process::Down, _) => "idle",
                };
                json!({
                    "target": instance.agent,
                    "instanceKey": instance.instance_key,
                    "ownerAgent": slot.owner.as_ref().map(|o| o.agent.clone()),
                    "ownerInstanceKey": slot.owner.as_ref().map(|o| o.instance_key.clone()),
                    "createdAt": slot.created_at,
                    "cwd": slot.cwd.as_ref().map(|c| c.display().to_string()),
                    "status": status,
                    "pid": slot.running().map(|r| r.pid),
                })
            })
            .collect();
        json!({"count": agents.len(), "agents": agents})
    }

    /// Checks a `spawn` call and makes the instance's slot; the instance and
    /// whether the slot is new.
    fn prepare_spawn(
        &mut self,
        caller: &AgentInstance,
        target: &str,
        instance_key: Option<String>,
        cwd: Option<String>,
        caller_workdir: &str,
    ) -> Result<(AgentInstance, bool), ErrorInfo> {
        if !self.plan.has_agent(target) {
            return Err(ErrorInfo::new(
                AGENT_NOT_FOUND,
                format!(
                    "no agent '{target}' in swarm '{}' (its agents: {})",
                    self.plan.swarm.name,
                    self.plan.swarm.agents.join(", ")
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
        let instance = AgentInstance::new(target, instance_key);
        let spawned = !self.slots.contains_key(&instance);
        let slot = self.slots.entry(instance.clone()).or_insert_with(|| Slot::new(Some(caller.clone())));
        if cwd.is_some() {
            slot.cwd = cwd;
        }
        Ok((instance, spawned))
    }

    // ---- handing work to processes ----

    /// Queues `work` for `instance` and gets it to a process.
    fn enqueue(&mut self, instance: &AgentInstance, work: Work) {
        let Some(slot) = self.slots.get_mut(instance) else { return };
        slot.waiting.push(work);
        self.serve(instance, false);
    }

    /// Hands `instance`'s waiting work to its process, or starts one (with
    /// `restart`, even with no work waiting).
    fn serve(&mut self, instance: &AgentInstance, restart: bool) {
        enum Next {
            HandOver,
            Later,
            Fail(ErrorInfo),
            Start,
        }
        let next = {
            let Some(slot) = self.slots.get(instance) else { return };
            if slot.waiting.is_empty() && !restart {
                return;
            }
            match &slot.process {
                _ if self.stopping.is_some() => {
                    Next::Fail(ErrorInfo::new(AGENT_UNAVAILABLE, "the swarm is shutting down"))
                }
                Process::Up(running) if running.retiring.is_none() => Next::HandOver,
                // After it has started, or once the leaving one has ended.
                Process::Up(_) | Process::Starting(_) => Next::Later,
                Process::Down => match slot.not_before.filter(|at| Instant::now() < *at) {
                    Some(not_before) => Next::Fail(
                        ErrorInfo::new(
                            AGENT_UNAVAILABLE,
                            format!(
                                "{instance} crashed {} times in a row; it is started again in {:.1} s",
                                slot.crashes,
                                (not_before - Instant::now()).as_secs_f64()
                            ),
                        )
                        .suggest("Retry later, or look at the agent's log lines for why it crashes."),
                    ),
                    None => Next::Start,
                },
            }
        };
        match next {
            Next::HandOver => {
                let work = self.slots.get_mut(instance).map(|s| std::mem::take(&mut s.waiting)).unwrap_or_default();
                for work in work {
                    self.hand_over(instance, work);
                }
            }
            Next::Later => {}
            Next::Fail(error) => self.fail_waiting(instance, &error),
            Next::Start => {
                if self.live() < self.plan.max_processes.max(1) && self.queue.is_empty() {
                    self.begin_start(instance);
                    return;
                }
                if let Some(slot) = self.slots.get_mut(instance)
                    && slot.queued_since.is_none()
                {
                    slot.queued_since = Some(Instant::now());
                    self.queue.push_back(instance.clone());
                }
                self.pump();
            }
        }
    }

    /// Gives one piece of work to the running process of `instance`.
    fn hand_over(&mut self, instance: &AgentInstance, work: Work) {
        let Some(running) = self.slots.get_mut(instance).and_then(Slot::running_mut) else { return };
        let (pid, generation) = (running.pid, running.generation);
        match work {
            Work::Request(request) => {
                running.jobs_sent += 1;
                running.idle_since = None;
                if running.outbox.send(request.message).is_err() {
                    let error = ErrorInfo::new(IPC_DELIVERY_FAILED, format!("{instance} stopped reading its messages"));
                    self.refuse(request.caller.as_ref(), &request.correlation_id, request.wants_answer, error);
                    return;
                }
                let id = request.correlation_id;
                let cancelled = self.pending.get_mut(&id).is_some_and(|pending| {
                    pending.delivered_to = Some(generation);
                    pending.cancelled
                });
                if cancelled {
                    self.send_to(instance, cancel_message(CLI, instance, "interrupted", &id));
                }
                if !request.wants_answer
                    && let Some(caller) = request.caller
                {
                    // An event is acknowledged once its target has it.
                    let accepted = json!({"accepted": true, "instanceKey": instance.instance_key});
                    self.call_result(&caller, &id, Ok(accepted));
                }
            }
            Work::Started(reply) => {
                let _ = reply.send(Ok(pid));
            }
            Work::SpawnAnswer { caller, correlation_id, spawned } => {
                let cwd = self.slots.get(instance).and_then(|s| s.cwd.as_ref()).map(|c| c.display().to_string());
                let output = json!({
                    "target": instance.agent,
                    "instanceKey": instance.instance_key,
                    "spawned": spawned,
                    "cwd": cwd,
                    "pid": pid,
                });
                self.call_result(&caller, &correlation_id, Ok(output));
            }
            Work::Answer { correlation_id, responder, answer } => {
                let message = IpcMessage::DelegateResult(
                    Routed::new(responder.to_string(), instance.to_string(), answer).correlated(correlation_id),
                );
                self.send_to(instance, message);
            }
        }
    }

    /// Fails everything waiting for `instance`'s process with `error`.
    fn fail_waiting(&mut self, instance: &AgentInstance, error: &ErrorInfo) {
        let Some(slot) = self.slots.get_mut(instance) else { return };
        if slot.queued_since.take().is_some() {
            self.queue.retain(|queued| queued != instance);
        }
        for work in std::mem::take(&mut slot.waiting) {
            match work {
                Work::Request(request) => {
                    self.refuse(request.caller.as_ref(), &request.correlation_id, request.wants_answer, error.clone());
                }
                Work::Started(reply) => {
                    let _ = reply.send(Err(error.clone()));
                }
                Work::SpawnAnswer { caller, correlation_id, .. } => {
                    self.call_result(&caller, &correlation_id, Err(error.clone()));
                }
                Work::Answer { correlation_id, .. } => {
                    tracing::warn!(
                        "the answer of {correlation_id} could not be delivered to {instance}: {}",
                        error.message
                    );
                }
            }
        }
    }

    /// Sends `message` to `instance`'s process, if one runs.
    fn send_to(&self, instance: &AgentInstance, message: IpcMessage) {
        if let Some(running) = self.slots.get(instance).and_then(Slot::running) {
            let _ = running.outbox.send(message);
        }
    }

    /// Hands an answer to whoever waits for it.
    fn deliver(
        &mut self,
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
                let running = self.slots.get(&caller).and_then(Slot::running);
                let asynchronous = answer.request.is_some();
                match running {
                    // An asynchronous answer goes into the caller's conversation
                    // whatever became of the process that asked: a leaving
                    // process might not keep it, the next one will.
                    Some(running) if !asynchronous || running.retiring.is_none() => {
                        let message = IpcMessage::DelegateResult(
                            Routed::new(responder.to_string(), caller.to_string(), answer).correlated(correlation_id),
                        );
                        let _ = running.outbox.send(message);
                    }
                    _ if asynchronous => {
                        let work = Work::Answer {
                            correlation_id: correlation_id.to_owned(),
                            responder: responder.clone(),
                            answer,
                        };
                        self.slots.entry(caller.clone()).or_insert_with(|| Slot::new(None));
                        self.enqueue(&caller, work);
                    }
                    _ => tracing::debug!("{caller} ended before the answer of {correlation_id} arrived; dropped"),
                }
            }
        }
    }

    // ---- processes: start, bound, end ----

    /// Processes that exist (starting, running or leaving).
    fn live(&self) -> usize {
        self.slots.values().filter(|slot| !matches!(slot.process, Process::Down)).count()
    }

    fn begin_start(&mut self, instance: &AgentInstance) {
        let Some(slot) = self.slots.get_mut(instance) else { return };
        self.next_generation += 1;
        let generation = self.next_generation;
        slot.process = Process::Starting(generation);
        if slot.queued_since.take().is_some() {
            self.queue.retain(|queued| queued != instance);
        }
        self.last_progress = Instant::now();
        let plan = &self.plan;
        let init = InitPayload {
            config: plan.config.display().to_string(),
            instance: instance.clone(),
            workdir: Some(slot.cwd.clone().unwrap_or_else(|| plan.workdir.clone()).display().to_string()),
            state_root: plan.state_root.display().to_string(),
            env: plan.env.clone(),
            tool_timeout_ms: plan.tool_timeout_ms,
            swarm: plan.swarm.clone(),
        };
        let launcher = Arc::clone(&self.launcher);
        let timeout = plan.start_timeout;
        let hub = self.me.clone();
        let instance = instance.clone();
        tokio::spawn(async move {
            let result = start::start(&launcher, init, timeout).await;
            // If the hub is gone, the child is dropped, which kills it.
            report(&hub, HubCommand::Started { instance, generation, result: Box::new(result) });
        });
    }

    fn started(&mut self, instance: &AgentInstance, generation: u64, result: Result<Started, ErrorInfo>) {
        let Some(slot) = self.slots.get_mut(instance) else { return };
        if !matches!(slot.process, Process::Starting(g) if g == generation) {
            return;
        }
        match result {
            Ok(started) if self.stopping.is_some() => {
                slot.process = Process::Down;
                let mut child = started.child;
                tokio::spawn(async move {
                    let _ = child.kill().await;
                });
                self.fail_waiting(instance, &ErrorInfo::new(AGENT_UNAVAILABLE, "the swarm is shutting down"));
                self.check_stopped();
            }
            Ok(started) => {
                let Started { link, receiver, child, pid } = started;
                let (outbox, outgoing) = mpsc::unbounded_channel();
                let (kill, killed) = oneshot::channel();
                tokio::spawn(start::forward(link, outgoing, instance.clone(), self.me.clone()));
                tokio::spawn(start::supervise(instance.clone(), generation, child, receiver, killed, self.me.clone()));
                slot.process = Process::Up(Running {
                    outbox,
                    pid,
                    generation,
                    kill: Some(kill),
                    retiring: None,
                    jobs_sent: 0,
                    idle_since: Some(Instant::now()),
                });
                self.observer.started(instance, pid);
                self.serve(instance, false);
            }
            Err(error) => {
                slot.process = Process::Down;
                slot.crashes += 1;
                let delay = backoff::delay_after(slot.crashes);
                slot.not_before = (!delay.is_zero()).then(|| Instant::now() + delay);
                self.fail_waiting(instance, &error);
                self.last_progress = Instant::now();
                self.pump();
                self.check_stopped();
            }
        }
    }

    /// Starts queued instances while there is room, and makes room by
    /// stopping idle processes while starts wait.
    fn pump(&mut self) {
        let bound = self.plan.max_processes.max(1);
        while self.live() < bound {
            let Some(next) = self.queue.pop_front() else { break };
            let Some(slot) = self.slots.get_mut(&next) else { continue };
            slot.queued_since = None;
            if matches!(slot.process, Process::Down) && self.stopping.is_none() {
                self.begin_start(&next);
            }
        }
        let leaving = self.slots.values().filter(|s| s.running().is_some_and(|r| r.retiring.is_some())).count();
        let wanted = self.queue.len().saturating_sub(leaving);
        if wanted == 0 {
            return;
        }
        let mut idle: Vec<(Instant, AgentInstance)> = self
            .slots
            .iter()
            .filter_map(|(instance, slot)| {
                let running = slot.running()?;
                let since = running.idle_since?;
                (running.retiring.is_none() && !self.has_open_requests(instance)).then(|| (since, instance.clone()))
            })
            .collect();
        idle.sort();
        for (_, instance) in idle.into_iter().take(wanted) {
            tracing::debug!("stopping the idle {instance} to make room for a waiting start");
            self.retire(&instance, Retiring::Idle, "making room for another agent");
        }
    }

    /// Whether `instance` waits for answers (which a stop would only delay).
    fn has_open_requests(&self, instance: &AgentInstance) -> bool {
        self.pending.values().any(|p| matches!(&p.waiter, Waiter::Agent(a) if a == instance))
    }

    /// Asks a running process to stop.
    fn retire(&mut self, instance: &AgentInstance, why: Retiring, reason: &str) {
        let grace = self.plan.shutdown_grace;
        let Some(running) = self.slots.get_mut(instance).and_then(Slot::running_mut) else { return };
        running.retiring = Some(why);
        let payload = ShutdownPayload {
            grace_period_ms: u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
            reason: reason.to_owned(),
        };
        let _ = running.outbox.send(IpcMessage::Shutdown(Routed::new(ORCHESTRATOR, instance.to_string(), payload)));
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
        if let Some(limit) = self.plan.idle_timeout
            && self.stopping.is_none()
        {
            let idle: Vec<AgentInstance> = self
                .slots
                .iter()
                .filter(|(instance, slot)| {
                    slot.running().is_some_and(|r| {
                        r.retiring.is_none() && r.idle_since.is_some_and(|since| now.duration_since(since) >= limit)
                    }) && !self.has_open_requests(instance)
                })
                .map(|(instance, _)| instance.clone())
                .collect();
            for instance in idle {
                tracing::debug!("{instance} has been idle for {limit:?}; stopping it");
                self.retire(&instance, Retiring::Idle, "idle");
            }
        }
        let wait = self.plan.capacity_wait;
        if !self.queue.is_empty() && now.duration_since(self.last_progress) >= wait {
            let refused: Vec<AgentInstance> = self
                .queue
                .iter()
                .filter(|instance| {
                    self.slots
                        .get(*instance)
                        .and_then(|s| s.queued_since)
                        .is_some_and(|since| now.duration_since(since) >= wait)
                })
                .cloned()
                .collect();
            let bound = self.plan.max_processes.max(1);
            for instance in refused {
                let error = ErrorInfo::new(
                    AGENT_CAPACITY_EXCEEDED,
                    format!(
                        "{instance} cannot start: {bound} agent processes (the bound) are busy, and none became free within {:.0} s",
                        wait.as_secs_f64()
                    ),
                )
                .suggest("Retry later, or raise the bound: gdn run --max-agent-processes N (or GOONDAN_MAX_AGENT_PROCESSES).");
                self.fail_waiting(&instance, &error);
            }
        }
        self.pump();
    }

    fn process_ended(&mut self, instance: &AgentInstance, generation: u64, pid: u32, status: Option<ExitStatus>) {
        let stopping = self.stopping.is_some();
        let clean = status.is_some_and(|s| s.success());
        let described = describe_status(status);
        let Some(slot) = self.slots.get_mut(instance) else { return };
        let Some(running) = slot.running().filter(|r| r.generation == generation) else { return };
        let restart = running.retiring == Some(Retiring::Restart) && clean && !stopping;
        slot.process = Process::Down;
        self.last_progress = Instant::now();
        let crashed = !clean && !stopping;
        if crashed {
            slot.crashes += 1;
            let delay = backoff::delay_after(slot.crashes);
            slot.not_before = (!delay.is_zero()).then(|| Instant::now() + delay);
        }
        // What it was asked, and what it asked.
        let dead: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, p)| {
                (p.target == *instance && p.delivered_to == Some(generation))
                    || (p.echo.is_none() && matches!(&p.waiter, Waiter::Agent(a) if a == instance))
            })
            .map(|(id, _)| id.clone())
            .collect();
        let mut answers = Vec::new();
        for id in dead {
            self.waits.remove(&id);
            let Some(pending) = self.pending.remove(&id) else { continue };
            if pending.target == *instance && pending.delivered_to == Some(generation) {
                answers.push((id, pending.waiter));
            } else if pending.delivered_to.is_some() {
                let cancel = cancel_message(ORCHESTRATOR, &pending.target, &format!("{instance} ended"), &id);
                self.send_to(&pending.target, cancel);
            } else if let Some(slot) = self.slots.get_mut(&pending.target) {
                slot.waiting.retain(|work| !matches!(work, Work::Request(r) if r.correlation_id == id));
            }
        }
        self.observer.exited(instance, pid, &described, crashed);
        let reason = if clean { "stopped" } else { "crashed" };
        for (id, waiter) in answers {
            let answer = DelegateResultPayload::error(
                AGENT_CRASHED,
                format!(
                    "{instance} (pid {pid}) {reason} before it answered ({described}); its next message starts it again"
                ),
            );
            self.deliver(waiter, &id, instance, answer);
        }
        // A restart it asked for: up again at once, with the bundle as it is
        // now. Otherwise what arrived while it was leaving starts the next one.
        self.serve(instance, restart);
        self.pump();
        self.check_stopped();
    }

    // ---- shutdown ----

    fn shutdown(&mut self, reason: &str, done: oneshot::Sender<()>) {
        if let Some(waiting) = self.stopping.as_mut() {
            waiting.push(done);
            self.check_stopped();
            return;
        }
        self.stopping = Some(vec![done]);
        let unavailable = ErrorInfo::new(AGENT_UNAVAILABLE, "the swarm is shutting down");
        let instances: Vec<AgentInstance> = self.slots.keys().cloned().collect();
        for instance in &instances {
            self.fail_waiting(instance, &unavailable);
            self.retire(instance, Retiring::Shutdown, reason);
        }
        let grace = self.plan.shutdown_grace;
        let hub = self.me.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if report(&hub, HubCommand::GraceOver) {
                tokio::time::sleep(KILL_WAIT).await;
                report(&hub, HubCommand::GiveUp);
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

fn cancel_message(from: &str, to: &AgentInstance, reason: &str, correlation_id: &str) -> IpcMessage {
    IpcMessage::Cancel(
        Routed::new(from, to.to_string(), CancelPayload { reason: reason.to_owned() }).correlated(correlation_id),
    )
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
}
