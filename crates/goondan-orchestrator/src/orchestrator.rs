//! The orchestrator's handle: what the front end (`gdn run`, a test, a
//! benchmark) holds. Each call is a command to the hub ([`crate::hub`]), the
//! one task that owns the swarm's state; the handle only waits for replies.

use std::sync::Arc;

use goondan_core::JsonObject;
use goondan_ipc::{AgentInstance, CLI, DelegateResultPayload, ErrorInfo, MessageSourceInfo, ObservePayload};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::task::TaskTracker;

use crate::codes::{AGENT_REQUEST_CANCELLED, AGENT_UNAVAILABLE, IPC_DELIVERY_FAILED};
use crate::hub::{Hub, HubCommand};
use crate::launcher::Launch;
use crate::plan::SwarmPlan;

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

/// Input for a turn from outside the swarm.
#[derive(Debug, Clone, PartialEq)]
pub struct Inbound {
    /// The turn's input text.
    pub input: String,
    /// The event type the turn sees (`user.input` for the terminal, the
    /// event's name for a connector's).
    pub event_type: String,
    /// The inbound metadata the turn's extensions see.
    pub metadata: JsonObject,
    /// Where it came from (`cli`, or `connector` and the Connection).
    pub source: MessageSourceInfo,
    /// The trace the turn continues (a connector's event span's), if any.
    pub trace_id: Option<String>,
    /// The W3C `traceparent` of the span the turn is a child of.
    pub traceparent: Option<String>,
}

impl Inbound {
    /// The terminal's input.
    pub fn terminal(input: String) -> Self {
        Self {
            input,
            event_type: "user.input".to_owned(),
            metadata: JsonObject::new(),
            source: MessageSourceInfo { kind: CLI.to_owned(), name: CLI.to_owned(), instance_key: None },
            trace_id: None,
            traceparent: None,
        }
    }
}

/// An observer that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSwarmObserver;

impl SwarmObserver for NoSwarmObserver {}

/// The hub's queue: what front ends and process readers say waits here
/// (they wait for room) while the hub is behind. The hub itself never
/// waits on anyone, so the queue always drains.
const HUB_QUEUE: usize = 1024;

/// The orchestrator of one swarm. Cheap to clone; the hub stops (and its
/// processes are killed) when the last clone is dropped: the closing of its
/// queue is the hub's cancellation, and every task it started ends with it
/// ([`closed`](Self::closed) waits for that).
#[derive(Clone)]
pub struct Orchestrator {
    commands: mpsc::Sender<HubCommand>,
    plan: Arc<SwarmPlan>,
    /// The hub and every task it started.
    tasks: TaskTracker,
    /// Whether starts are paused: a value rather than a command, so that
    /// [`pause_starts`](Self::pause_starts) never waits for room in the queue.
    paused: Arc<watch::Sender<bool>>,
}

impl std::fmt::Debug for Orchestrator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orchestrator").field("swarm", &self.plan.swarm.name).finish_non_exhaustive()
    }
}

impl Orchestrator {
    /// Starts the hub on the current tokio runtime. No agent process starts
    /// until a message needs it.
    pub fn start(plan: SwarmPlan, launcher: impl Launch + 'static, observer: Arc<dyn SwarmObserver>) -> Self {
        Self::start_with(plan, Arc::new(launcher), observer)
    }

    /// [`start`](Self::start) with a shared launcher.
    pub fn start_with(plan: SwarmPlan, launcher: Arc<dyn Launch>, observer: Arc<dyn SwarmObserver>) -> Self {
        let plan = Arc::new(plan);
        let (commands, receiver) = mpsc::channel(HUB_QUEUE);
        let tasks = TaskTracker::new();
        let hub = Hub::new(Arc::clone(&plan), launcher, observer, commands.downgrade(), tasks.clone());
        let (paused, paused_rx) = watch::channel(false);
        tasks.spawn(hub.run(receiver, paused_rx));
        Self { commands, plan, tasks, paused: Arc::new(paused) }
    }

    /// Drops this handle and, once every other clone is gone too, waits
    /// until the hub and every task it started have ended (its processes
    /// killed and reaped).
    pub async fn closed(self) {
        let tasks = self.tasks.clone();
        drop(self);
        tasks.close();
        tasks.wait().await;
    }

    /// The plan it runs.
    pub fn plan(&self) -> &SwarmPlan {
        &self.plan
    }

    fn gone() -> ErrorInfo {
        ErrorInfo::new(AGENT_UNAVAILABLE, "the orchestrator has stopped")
    }

    /// Runs a turn of `instance` with `input` from the terminal and waits for
    /// its answer. `cancel` turning true cancels the turn (the answer then
    /// says so).
    pub async fn ask(
        &self,
        instance: &AgentInstance,
        input: String,
        cancel: watch::Receiver<bool>,
    ) -> DelegateResultPayload {
        self.deliver(instance, Inbound::terminal(input), cancel).await
    }

    /// Runs a turn of `instance` with `inbound` (a connector's event, or the
    /// terminal's input) and waits for its answer; `cancel` as for
    /// [`ask`](Self::ask).
    pub async fn deliver(
        &self,
        instance: &AgentInstance,
        inbound: Inbound,
        mut cancel: watch::Receiver<bool>,
    ) -> DelegateResultPayload {
        let correlation_id = format!("corr-{}", goondan_core::ids::new_id());
        let (reply, mut answer) = oneshot::channel();
        let ask = HubCommand::Ask {
            instance: instance.clone(),
            correlation_id: correlation_id.clone(),
            inbound: Box::new(inbound),
            reply,
        };
        if self.commands.send(ask).await.is_err() {
            return DelegateResultPayload::failed(Self::gone());
        }
        let mut cancelled = false;
        // After a cancel the turn's answer says so at once; a process that
        // cannot be reached (its host cut off) is not waited for past this.
        let confirm_within = self.plan.shutdown_grace * 2;
        let mut give_up: Option<tokio::time::Instant> = None;
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
                        give_up = Some(tokio::time::Instant::now() + confirm_within);
                        let cancel = HubCommand::CancelAsk { correlation_id: correlation_id.clone() };
                        let _ = self.commands.send(cancel).await;
                    }
                }
                () = async {
                    match give_up {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {
                    return DelegateResultPayload::error(
                        AGENT_REQUEST_CANCELLED,
                        format!("{instance} was cancelled and did not confirm it within {confirm_within:?}"),
                    );
                }
            }
        }
    }

    /// Starts `instance`'s process now if none runs (it otherwise starts
    /// with its first message); its pid.
    pub async fn start_instance(&self, instance: &AgentInstance) -> Result<u32, ErrorInfo> {
        let (reply, pid) = oneshot::channel();
        self.commands
            .send(HubCommand::StartInstance { instance: instance.clone(), reply })
            .await
            .map_err(|_| Self::gone())?;
        pid.await.map_err(|_| Self::gone())?
    }

    /// The pid of the process running `instance`, if one runs.
    pub async fn pid_of(&self, instance: &AgentInstance) -> Option<u32> {
        let (reply, pid) = oneshot::channel();
        self.commands.send(HubCommand::PidOf { instance: instance.clone(), reply }).await.ok()?;
        pid.await.ok().flatten()
    }

    /// Restarts the instances `selector` takes: each running process stops
    /// after the turns it accepted (none is cut), then `while_down` runs
    /// while none of them runs, then their next message starts them again
    /// with the bundle as it is then. Returns when that is through.
    pub async fn restart(
        &self,
        selector: crate::InstanceSelector,
        while_down: Option<crate::WhileDown>,
    ) -> crate::RestartReport {
        self.restart_with(selector, while_down, false).await
    }

    /// [`restart`](Self::restart), only if every instance `selector` takes
    /// is idle now: no turn or request runs in it or waits for it, and it
    /// waits for no answer (a process that reported itself idle, or none).
    /// If one is busy nothing is done and the report says `busy`: nothing
    /// running is ever waited for, let alone cut. The check and the hold
    /// are one step of the hub, so no work reaches them in between; work
    /// that arrives while they are held waits, and starts them again once
    /// `while_down` is through. (The service expires idle instances so.)
    pub async fn restart_if_idle(
        &self,
        selector: crate::InstanceSelector,
        while_down: crate::WhileDown,
    ) -> crate::RestartReport {
        self.restart_with(selector, Some(while_down), true).await
    }

    async fn restart_with(
        &self,
        selector: crate::InstanceSelector,
        while_down: Option<crate::WhileDown>,
        if_idle: bool,
    ) -> crate::RestartReport {
        let (reply, report) = oneshot::channel();
        let command = HubCommand::Restart { selector, while_down, if_idle, reply };
        if self.commands.send(command).await.is_err() {
            return crate::RestartReport { error: Some(Self::gone().message), ..Default::default() };
        }
        report
            .await
            .unwrap_or_else(|_| crate::RestartReport { error: Some(Self::gone().message), ..Default::default() })
    }

    /// Hands the cancel of task `handle` to `instance`'s process; false if
    /// no process runs it (then no work of its tasks runs either).
    pub async fn cancel_task(&self, instance: &AgentInstance, handle: &str) -> bool {
        let (reply, sent) = oneshot::channel();
        let command = HubCommand::CancelTask { instance: instance.clone(), handle: handle.to_owned(), reply };
        if self.commands.send(command).await.is_err() {
            return false;
        }
        sent.await.unwrap_or(false)
    }

    /// While `paused`, no agent process starts: messages for an instance
    /// without one wait (the bundle on disk does not validate, and a new
    /// process would not build); running processes go on.
    pub fn pause_starts(&self, paused: bool) {
        self.paused.send_replace(paused);
    }

    /// Stops every agent process: `shutdown`, then after the grace period
    /// SIGKILL for those still running; returns when all have exited.
    pub async fn shutdown(&self, reason: &str) {
        let (done, stopped) = oneshot::channel();
        if self.commands.send(HubCommand::Shutdown { reason: reason.to_owned(), done }).await.is_ok() {
            let _ = stopped.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff;
    use crate::launcher::AgentLauncher;

    /// `printf` octal escapes of `bytes`.
    fn escaped(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("\\{b:03o}")).collect()
    }

    /// A launcher whose "agent" says hello on its channel (fd 0), sends
    /// `ready` with `error`, and exits 1 at once: the race of item 8, where
    /// the exit and the error arrive together.
    fn failing_agent(error: &ErrorInfo) -> AgentLauncher {
        let ready = goondan_ipc::IpcMessage::Ready(goondan_ipc::Routed::new(
            "a@k",
            goondan_ipc::ORCHESTRATOR,
            goondan_ipc::ReadyPayload { pid: 0, error: Some(error.clone()) },
        ));
        let ready = goondan_ipc::frame::encode(&ready).unwrap_or_else(|e| panic!("{e}"));
        let script = format!(
            r#"body='{{"type":"hello","from":"","to":"orchestrator","payload":{{"pid":'$$'}}}}'
printf "\\000\\000\\000\\$(printf %03o ${{#body}})%s" "$body" >&0
printf '{}' >&0
exit 1"#,
            escaped(&ready)
        );
        AgentLauncher::new("/bin/sh", ["-c".to_owned(), script, "agent".to_owned()])
    }

    fn plan() -> SwarmPlan {
        SwarmPlan::new(
            goondan_ipc::SwarmInfo { name: "s".into(), entry_agent: "a".into(), agents: vec!["a".into()] },
            "/b".into(),
            "/s".into(),
            "/w".into(),
        )
    }

    #[tokio::test]
    async fn the_error_an_agent_sends_before_it_exits_always_wins_over_its_exit() {
        let sent = ErrorInfo::new("AGENT_BUILD_FAILED", "the model needs SOME_API_KEY, which is not set");
        let orchestrator = Orchestrator::start(plan(), failing_agent(&sent), Arc::new(NoSwarmObserver));
        // The old start-up select! lost about half of these with this agent.
        for n in 0..100 {
            // A new instance each time: no crash backoff in the way.
            let instance = AgentInstance::new("a", format!("k{n}"));
            let error = orchestrator.start_instance(&instance).await.err().unwrap_or_else(|| panic!("started"));
            assert_eq!(
                (error.code.as_str(), error.message.as_str()),
                (sent.code.as_str(), sent.message.as_str()),
                "run {n}"
            );
        }
        orchestrator.shutdown("done").await;
    }

    #[tokio::test]
    async fn a_process_that_keeps_dying_is_backed_off_after_five_crashes() {
        let plan = plan();
        // A real process that exits at once, before it ever says hello.
        let orchestrator = Orchestrator::start(
            plan,
            AgentLauncher::new("/bin/false", Vec::<String>::new()),
            Arc::new(NoSwarmObserver),
        );
        let instance = AgentInstance::new("a", "k");
        for attempt in 1..=backoff::FREE_RESTARTS + 1 {
            let error = orchestrator.start_instance(&instance).await.err().unwrap_or_else(|| panic!("started"));
            assert_eq!(error.code, AGENT_UNAVAILABLE);
            assert!(error.message.contains("ended at start: exit code 1"), "attempt {attempt}: {}", error.message);
        }
        let error = orchestrator.start_instance(&instance).await.err().unwrap_or_else(|| panic!("started"));
        assert!(error.message.contains("crashed 6 times in a row"), "{}", error.message);
        assert!(orchestrator.pid_of(&instance).await.is_none());
    }

    /// A shutdown starts the grace timer; once the swarm has stopped and
    /// every handle is gone, `closed()` must not sleep out that grace (a
    /// `gdn run` waited for it, 3 s, after every answer).
    #[tokio::test]
    async fn closed_after_a_shutdown_does_not_wait_out_the_grace() {
        use std::time::Duration;
        let mut plan = plan();
        plan.shutdown_grace = Duration::from_secs(120);
        let orchestrator = Orchestrator::start(
            plan,
            AgentLauncher::new("/bin/false", Vec::<String>::new()),
            Arc::new(NoSwarmObserver),
        );
        assert!(orchestrator.start_instance(&AgentInstance::new("a", "k")).await.is_err());
        orchestrator.shutdown("the test ended").await;
        let closed = tokio::time::timeout(Duration::from_secs(60), orchestrator.closed()).await;
        assert!(closed.is_ok(), "closed() waited for the shutdown's grace timer");
    }

    #[tokio::test]
    async fn closed_ends_once_every_handle_is_gone_and_every_task_of_the_hub_has_ended() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::time::Duration;
        let orchestrator = Orchestrator::start(
            plan(),
            AgentLauncher::new("/bin/false", Vec::<String>::new()),
            Arc::new(NoSwarmObserver),
        );
        // A start leaves the hub's tasks for its process behind.
        assert!(orchestrator.start_instance(&AgentInstance::new("a", "k")).await.is_err());
        // A task of the hub's tracker that outlives every handle for a while.
        let ended = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ended);
        orchestrator.tasks.spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            flag.store(true, Ordering::SeqCst);
        });
        // Another handle, let go of later: the hub runs until then.
        let other = orchestrator.clone();
        let released = Arc::new(AtomicBool::new(false));
        let release = Arc::clone(&released);
        let holder = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            release.store(true, Ordering::SeqCst);
            drop(other);
        });
        let closed = tokio::time::timeout(Duration::from_secs(10), orchestrator.closed()).await;
        assert!(closed.is_ok(), "closed() did not end");
        assert!(released.load(Ordering::SeqCst), "closed() ended while another handle was alive");
        assert!(ended.load(Ordering::SeqCst), "closed() ended before a task of its tracker did");
        assert!(holder.await.is_ok());
    }
}
