//! The hub's routing: the terminal's requests, and what agent processes
//! send — requests admitted (target, hops, cycles) and handed to their
//! targets, answers delivered to whoever waits, cancels, calls, progress.

use std::path::{Component, Path, PathBuf};
use std::time::Instant;

use goondan_core::JsonValue;
use goondan_ipc::{
    AgentInstance, CLI, CallPayload, CallResultPayload, CancelPayload, DelegatePayload, DelegateResultPayload,
    ErrorInfo, IpcMessage, ORCHESTRATOR, ObservePayload, Routed,
};
use serde_json::json;
use tokio::sync::oneshot;

use crate::codes::{AGENT_HOP_LIMIT, AGENT_INVALID_REQUEST, AGENT_NOT_FOUND, CIRCULAR_CALL_DETECTED};
use crate::waits::describe;

use super::{Hub, Pending, Process, Request, Retiring, Slot, Waiter, Work};

impl Hub {
    // ---- the terminal ----

    pub(super) fn ask(
        &mut self,
        instance: AgentInstance,
        correlation_id: String,
        inbound: crate::orchestrator::Inbound,
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
                relocating: false,
            },
        );
        let payload = DelegatePayload {
            event_id: goondan_core::ids::new_id(),
            event_type: inbound.event_type,
            instance_key: instance.instance_key.clone(),
            input: inbound.input,
            metadata: inbound.metadata,
            trace_id: inbound.trace_id,
            traceparent: inbound.traceparent,
            asynchronous: false,
            hops: 0,
            source: inbound.source,
            tool_call_id: None,
        };
        let message =
            IpcMessage::Delegate(Routed::new(CLI, instance.agent.clone(), payload).correlated(correlation_id.clone()));
        self.enqueue(&instance, Work::Request(Request { correlation_id, caller: None, message, wants_answer: true }));
    }

    pub(super) fn cancel_ask(&mut self, correlation_id: &str) {
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

    pub(super) fn on_agent_message(&mut self, from: AgentInstance, generation: u64, message: IpcMessage) {
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
    pub(super) fn route_request(
        &mut self,
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
    pub(super) fn admit(
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
                    relocating: false,
                },
            );
        }
        Ok(())
    }

    pub(super) fn check_agent(&self, agent: &str) -> Result<(), ErrorInfo> {
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

    pub(super) fn check_hops(&self, hops: u32) -> Result<(), ErrorInfo> {
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

    pub(super) fn check_cycle(&self, caller: &AgentInstance, target: &AgentInstance) -> Result<(), ErrorInfo> {
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
    pub(super) fn refuse(&mut self, caller: Option<&AgentInstance>, id: &str, wants_answer: bool, error: ErrorInfo) {
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

    pub(super) fn route_result(&mut self, from: &AgentInstance, message: Routed<DelegateResultPayload>) {
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

    pub(super) fn route_cancel(&mut self, from: &AgentInstance, message: Routed<CancelPayload>) {
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

    /// Cancels the asynchronous request `correlation_id` that `caller`
    /// made, if it is out: dropped if not handed over yet, else its
    /// target's turn is cancelled.
    pub(super) fn cancel_async_request(&mut self, caller: &AgentInstance, correlation_id: &str) {
        let asked = self.pending.get(correlation_id).is_some_and(|pending| {
            pending.echo.is_some() && matches!(&pending.waiter, Waiter::Agent(waiter) if waiter == caller)
        });
        if !asked {
            return;
        }
        let message =
            Routed::new(ORCHESTRATOR, ORCHESTRATOR, CancelPayload { reason: "the task was cancelled".into() })
                .correlated(correlation_id);
        self.route_cancel(caller, message);
    }

    pub(super) fn observe(&mut self, from: &AgentInstance, generation: u64, payload: ObservePayload) {
        let running = self.slots.get_mut(from).and_then(Slot::running_mut).filter(|r| r.generation == generation);
        match payload {
            ObservePayload::Idle { jobs, .. } => {
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

    pub(super) fn answer_call(&mut self, caller: &AgentInstance, message: Routed<CallPayload>) {
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

    pub(super) fn call_result(&self, caller: &AgentInstance, id: &str, result: Result<JsonValue, ErrorInfo>) {
        let payload = match result {
            Ok(output) => CallResultPayload { output, error: None },
            Err(error) => CallResultPayload { output: JsonValue::Null, error: Some(error) },
        };
        self.send_to(
            caller,
            IpcMessage::CallResult(Routed::new(ORCHESTRATOR, caller.to_string(), payload).correlated(id)),
        );
    }

    pub(super) fn list(&self, caller: &AgentInstance, include_all: bool) -> JsonValue {
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
    pub(super) fn prepare_spawn(
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
}

pub(super) fn cancel_message(from: &str, to: &AgentInstance, reason: &str, correlation_id: &str) -> IpcMessage {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn cwd_stays_inside_the_callers_workdir() {
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
