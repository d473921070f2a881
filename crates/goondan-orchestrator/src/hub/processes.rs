//! The hub's processes: work handed to a running process or kept until
//! one runs, starts (bounded: queued past `max_processes`, idle processes
//! stopped to make room), idle stops, ends and their consequences.

use std::sync::Arc;
use std::time::Instant;

use goondan_ipc::{
    AgentInstance, CLI, DelegateResultPayload, ErrorInfo, InitPayload, IpcMessage, ORCHESTRATOR, Routed,
    ShutdownPayload,
};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use crate::backoff;
use crate::codes::{AGENT_CAPACITY_EXCEEDED, AGENT_CRASHED, AGENT_NO_HOST, AGENT_UNAVAILABLE, IPC_DELIVERY_FAILED};
use crate::launcher::{ProcessEnd, Started};
use crate::start::{self, describe_end, report};

use super::routing::cancel_message;
use super::{Hub, HubCommand, Process, Retiring, Running, Slot, Waiter, Work};

impl Hub {
    // ---- handing work to processes ----

    /// Queues `work` for `instance` and gets it to a process.
    pub(super) fn enqueue(&mut self, instance: &AgentInstance, work: Work) {
        let Some(slot) = self.slots.get_mut(instance) else { return };
        slot.waiting.push(work);
        self.serve(instance, false);
    }

    /// Hands `instance`'s waiting work to its process, or starts one (with
    /// `restart`, even with no work waiting).
    pub(super) fn serve(&mut self, instance: &AgentInstance, restart: bool) {
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
                // A restart holds it down until its step is through.
                _ if self.is_held(instance) => Next::Later,
                // The bundle on disk is broken: a new process would not build.
                Process::Down if self.starts_paused => Next::Later,
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
    pub(super) fn hand_over(&mut self, instance: &AgentInstance, work: Work) {
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
    pub(super) fn fail_waiting(&mut self, instance: &AgentInstance, error: &ErrorInfo) {
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
    pub(super) fn send_to(&self, instance: &AgentInstance, message: IpcMessage) {
        if let Some(running) = self.slots.get(instance).and_then(Slot::running) {
            let _ = running.outbox.send(message);
        }
    }

    /// Hands an answer to whoever waits for it.
    pub(super) fn deliver(
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
    pub(super) fn live(&self) -> usize {
        self.slots.values().filter(|slot| !matches!(slot.process, Process::Down)).count()
    }

    pub(super) fn begin_start(&mut self, instance: &AgentInstance) {
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
        self.tasks.spawn(async move {
            let result = launcher.start(init, timeout).await;
            // If the hub is gone, the child is dropped, which kills it.
            report(&hub, HubCommand::Started { instance, generation, result: Box::new(result) }).await;
        });
    }

    pub(super) fn started(&mut self, instance: &AgentInstance, generation: u64, result: Result<Started, ErrorInfo>) {
        let Some(slot) = self.slots.get_mut(instance) else { return };
        if !matches!(slot.process, Process::Starting(g) if g == generation) {
            return;
        }
        match result {
            Ok(started) if self.stopping.is_some() => {
                slot.process = Process::Down;
                let mut process = started.process;
                process.start_kill();
                self.tasks.spawn(async move {
                    let _ = process.wait().await;
                });
                self.fail_waiting(instance, &ErrorInfo::new(AGENT_UNAVAILABLE, "the swarm is shutting down"));
                self.check_stopped();
            }
            Ok(started) => {
                let Started { link, receiver, process, pid } = started;
                // Unbounded: the hub never waits on one process (see `HUB_QUEUE`);
                // what it queues here came through its own bounded queue.
                let (outbox, outgoing) = mpsc::unbounded_channel();
                let (kill, killed) = oneshot::channel();
                self.tasks.spawn(start::forward(link, outgoing, instance.clone(), self.me.clone()));
                self.tasks.spawn(start::supervise(
                    instance.clone(),
                    generation,
                    pid,
                    process,
                    receiver,
                    killed,
                    self.me.clone(),
                ));
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
                self.relocated_to(instance, generation);
                if !self.held_start(instance) {
                    self.serve(instance, false);
                }
            }
            Err(error) => {
                slot.process = Process::Down;
                // No host can run it now (across hosts): not a crash of its
                // own, so no backoff; the next start looks for a host again.
                if error.code != AGENT_NO_HOST {
                    slot.crashes += 1;
                    let delay = backoff::delay_after(slot.crashes);
                    slot.not_before = (!delay.is_zero()).then(|| Instant::now() + delay);
                }
                self.fail_waiting(instance, &error);
                self.fail_relocating(instance, &error);
                self.last_progress = Instant::now();
                self.hold_process_ended(instance);
                self.pump();
                self.check_stopped();
            }
        }
    }

    /// Starts queued instances while there is room, and makes room by
    /// stopping idle processes while starts wait.
    pub(super) fn pump(&mut self) {
        let bound = self.plan.max_processes.max(1);
        while self.live() < bound && !self.starts_paused {
            let Some(next) = self.queue.pop_front() else { break };
            let held = self.is_held(&next);
            let Some(slot) = self.slots.get_mut(&next) else { continue };
            slot.queued_since = None;
            if matches!(slot.process, Process::Down) && self.stopping.is_none() && !held {
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
    pub(super) fn has_open_requests(&self, instance: &AgentInstance) -> bool {
        self.pending.values().any(|p| matches!(&p.waiter, Waiter::Agent(a) if a == instance))
    }

    /// Asks a running process to stop.
    pub(super) fn retire(&mut self, instance: &AgentInstance, why: Retiring, reason: &str) {
        let grace = self.plan.shutdown_grace;
        let Some(running) = self.slots.get_mut(instance).and_then(Slot::running_mut) else { return };
        running.retiring = Some(why);
        let payload = ShutdownPayload {
            grace_period_ms: u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
            reason: reason.to_owned(),
        };
        let _ = running.outbox.send(IpcMessage::Shutdown(Routed::new(ORCHESTRATOR, instance.to_string(), payload)));
    }

    pub(super) fn on_tick(&mut self) {
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

    pub(super) fn process_ended(&mut self, instance: &AgentInstance, generation: u64, pid: u32, end: ProcessEnd) {
        if end.host_lost.is_some() && self.stopping.is_none() {
            self.host_lost(instance, generation, pid, &end);
            return;
        }
        let stopping = self.stopping.is_some();
        let clean = end.status.is_some_and(|s| s.success());
        let described = describe_end(&end);
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
        // What it was asked.
        let served: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, p)| p.target == *instance && p.delivered_to == Some(generation))
            .map(|(id, _)| id.clone())
            .collect();
        let mut answers = Vec::new();
        for id in served {
            self.waits.remove(&id);
            if let Some(pending) = self.pending.remove(&id) {
                answers.push((id, pending.waiter));
            }
        }
        self.drop_requests_of(instance, &format!("{instance} ended"));
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
        self.hold_process_ended(instance);
        self.serve(instance, restart);
        self.pump();
        self.check_stopped();
    }

    /// The host of `instance`'s process was lost (its transport says so):
    /// what the process was serving is not failed but handed by the
    /// transport to the instance's next process, which is started at once
    /// on another host and continues from the instance's last commit. What
    /// it asked others synchronously is cancelled, as for any end (its turn
    /// runs again and asks again). No crash is counted: the process did not
    /// fail, its machine did.
    fn host_lost(&mut self, instance: &AgentInstance, generation: u64, pid: u32, end: &ProcessEnd) {
        let Some(slot) = self.slots.get_mut(instance) else { return };
        if slot.running().is_none_or(|r| r.generation != generation) {
            return;
        }
        slot.process = Process::Down;
        self.last_progress = Instant::now();
        let mut relocating = 0usize;
        for pending in self.pending.values_mut() {
            if pending.target == *instance && pending.delivered_to == Some(generation) {
                pending.delivered_to = None;
                pending.relocating = true;
                relocating += 1;
            }
        }
        self.drop_requests_of(instance, &format!("{instance} moved to another host"));
        let why = end.host_lost.as_deref().unwrap_or("its host was lost");
        tracing::warn!("{instance} (pid {pid}): {why}; {relocating} request(s) continue on another host");
        self.observer.exited(instance, pid, why, false);
        self.hold_process_ended(instance);
        self.serve(instance, relocating > 0);
        self.pump();
        self.check_stopped();
    }

    /// The synchronous requests `instance`'s ended process made are dropped:
    /// cancelled at their targets if handed over, else taken out of the
    /// targets' waiting work. Its asynchronous ones are kept (their answers
    /// go into its conversation whatever became of the process).
    fn drop_requests_of(&mut self, instance: &AgentInstance, reason: &str) {
        let asked: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, p)| p.echo.is_none() && matches!(&p.waiter, Waiter::Agent(a) if a == instance))
            .map(|(id, _)| id.clone())
            .collect();
        for id in asked {
            self.waits.remove(&id);
            let Some(pending) = self.pending.remove(&id) else { continue };
            if pending.delivered_to.is_some() {
                self.send_to(&pending.target, cancel_message(ORCHESTRATOR, &pending.target, reason, &id));
            } else if let Some(slot) = self.slots.get_mut(&pending.target) {
                slot.waiting.retain(|work| !matches!(work, Work::Request(r) if r.correlation_id == id));
            }
        }
    }

    /// The requests a lost host was serving now run in `generation`.
    fn relocated_to(&mut self, instance: &AgentInstance, generation: u64) {
        let mut cancelled = Vec::new();
        for (id, pending) in &mut self.pending {
            if pending.relocating && pending.target == *instance {
                pending.relocating = false;
                pending.delivered_to = Some(generation);
                if pending.cancelled {
                    cancelled.push(id.clone());
                }
            }
        }
        for id in cancelled {
            self.send_to(instance, cancel_message(CLI, instance, "interrupted", &id));
        }
    }

    /// The requests a lost host was serving, when no other process could
    /// be started for them: answered with why.
    fn fail_relocating(&mut self, instance: &AgentInstance, error: &ErrorInfo) {
        let ids: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, p)| p.relocating && p.target == *instance)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            self.waits.remove(&id);
            if let Some(pending) = self.pending.remove(&id) {
                self.deliver(pending.waiter, &id, instance, DelegateResultPayload::failed(error.clone()));
            }
        }
    }
}
