//! Restarts the operator asks for (`gdn restart`, `gdn instance restart`,
//! a watched bundle's change): the selected instances' processes are
//! *held down* until each has ended, then an optional step runs while none
//! of them runs (clearing their conversations for `--fresh`), then they are
//! released and their next message starts them with the bundle as it is on
//! disk then.
//!
//! ```text
//! restart(selector, while_down)
//!   every selected running process gets `shutdown`: the turns it accepted
//!   still run to their end (a running turn is never cut), then it exits
//!   while held: work for a selected instance waits in its slot; no process starts
//!   all ended ─► while_down on a blocking thread ─► released: crash counts cleared,
//!   waiting work starts the new processes ─► the reply (who was stopped, and the step's error)
//! ```

use std::collections::BTreeSet;

use goondan_ipc::AgentInstance;
use tokio::sync::oneshot;

use super::{Hub, HubCommand, Process, Retiring, Slot};
use crate::start::report;

/// Which agent instances a restart takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstanceSelector {
    /// Every instance of the swarm.
    All,
    /// Every instance of this agent.
    Agent(String),
    /// Every agent's instance of this key.
    Key(String),
    /// One instance.
    One(AgentInstance),
}

impl InstanceSelector {
    /// Whether `instance` is selected.
    pub fn matches(&self, instance: &AgentInstance) -> bool {
        match self {
            Self::All => true,
            Self::Agent(agent) => instance.agent == *agent,
            Self::Key(key) => instance.instance_key == *key,
            Self::One(one) => one == instance,
        }
    }
}

/// A step run while the selected instances are down (no process of
/// theirs runs, and none starts): clearing their state, say.
pub type WhileDown = Box<dyn FnOnce() -> Result<(), String> + Send>;

/// What a restart did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestartReport {
    /// The processes it stopped (each after its running turns), with their pids.
    pub stopped: Vec<(AgentInstance, u32)>,
    /// Why it did not complete: the step run while down failed, or the
    /// swarm stopped first.
    pub error: Option<String>,
    /// Asked only if idle ([`Orchestrator::restart_if_idle`](crate::Orchestrator::restart_if_idle)),
    /// it was not done: a selected instance was busy (nothing was stopped,
    /// the step did not run).
    pub busy: bool,
}

/// A restart in progress.
pub(super) struct Hold {
    id: u64,
    selector: InstanceSelector,
    /// The selected instances whose processes have not ended yet.
    waiting_for: BTreeSet<AgentInstance>,
    while_down: Option<WhileDown>,
    /// The step runs (on a blocking thread).
    releasing: bool,
    report: RestartReport,
    reply: Option<oneshot::Sender<RestartReport>>,
}

impl Hub {
    /// Whether `instance` is held down by a restart in progress.
    pub(super) fn is_held(&self, instance: &AgentInstance) -> bool {
        self.holds.iter().any(|hold| hold.selector.matches(instance))
    }

    /// Starts a restart of the instances `selector` takes.
    pub(super) fn restart(
        &mut self,
        selector: InstanceSelector,
        while_down: Option<WhileDown>,
        if_idle: bool,
        reply: oneshot::Sender<RestartReport>,
    ) {
        if self.stopping.is_some() {
            let _ = reply
                .send(RestartReport { error: Some("the swarm is shutting down".to_owned()), ..Default::default() });
            return;
        }
        // Decided here, in the hub's one task: no work can reach a selected
        // instance between this check and its hold.
        if if_idle && self.slots.keys().any(|instance| selector.matches(instance) && self.busy(instance)) {
            let _ = reply.send(RestartReport { busy: true, ..Default::default() });
            return;
        }
        self.next_hold += 1;
        let mut hold = Hold {
            id: self.next_hold,
            selector,
            waiting_for: BTreeSet::new(),
            while_down,
            releasing: false,
            report: RestartReport::default(),
            reply: Some(reply),
        };
        let selected: Vec<AgentInstance> =
            self.slots.keys().filter(|instance| hold.selector.matches(instance)).cloned().collect();
        for instance in selected {
            let Some(slot) = self.slots.get(&instance) else { continue };
            match &slot.process {
                Process::Down => {}
                // Asked to stop once it is up (see `started`).
                Process::Starting(_) => {
                    hold.waiting_for.insert(instance);
                }
                Process::Up(running) => {
                    hold.report.stopped.push((instance.clone(), running.pid));
                    let retiring = running.retiring.is_some();
                    hold.waiting_for.insert(instance.clone());
                    if !retiring {
                        self.retire(&instance, Retiring::Reload, "restarted by the operator");
                    } else if let Some(running) = self.slots.get_mut(&instance).and_then(Slot::running_mut) {
                        // Leaving already (idle): it must not come back at once.
                        running.retiring = Some(Retiring::Reload);
                    }
                }
            }
        }
        tracing::info!(
            "restarting {:?}: {} process(es) stop after their running turns",
            hold.selector,
            hold.waiting_for.len()
        );
        self.holds.push(hold);
        self.check_holds();
    }

    /// Whether `instance` has anything under way: a process starting, a
    /// turn or request running in it or waiting for it, answers it waits
    /// for, or a restart holding it. A process that reported itself idle
    /// (or is leaving for idling) is not busy.
    fn busy(&self, instance: &AgentInstance) -> bool {
        let Some(slot) = self.slots.get(instance) else { return false };
        let process_busy = match &slot.process {
            Process::Down => false,
            Process::Starting(_) => true,
            Process::Up(running) => match running.retiring {
                None => running.idle_since.is_none(),
                Some(Retiring::Idle) => false,
                Some(_) => true,
            },
        };
        process_busy
            || !slot.waiting.is_empty()
            || slot.queued_since.is_some()
            || self.is_held(instance)
            || self.has_open_requests(instance)
            || self.pending.values().any(|pending| pending.target == *instance)
    }

    /// A selected process started while its restart was in progress: it
    /// stops again at once (it may have read the bundle before the change).
    pub(super) fn held_start(&mut self, instance: &AgentInstance) -> bool {
        if !self.is_held(instance) {
            return false;
        }
        if let Some(pid) = self.slots.get(instance).and_then(Slot::running).map(|r| r.pid) {
            for hold in &mut self.holds {
                if hold.selector.matches(instance) {
                    hold.report.stopped.push((instance.clone(), pid));
                    hold.waiting_for.insert(instance.clone());
                }
            }
        }
        self.retire(instance, Retiring::Reload, "restarted by the operator");
        true
    }

    /// A process ended: restarts that waited for it may go on.
    pub(super) fn hold_process_ended(&mut self, instance: &AgentInstance) {
        let mut changed = false;
        for hold in &mut self.holds {
            changed |= hold.waiting_for.remove(instance);
        }
        if changed {
            self.check_holds();
        }
    }

    /// Runs the step of every restart whose processes have all ended.
    fn check_holds(&mut self) {
        for hold in &mut self.holds {
            if hold.releasing || !hold.waiting_for.is_empty() {
                continue;
            }
            hold.releasing = true;
            let id = hold.id;
            let step = hold.while_down.take();
            let hub = self.me.clone();
            self.tasks.spawn(async move {
                let result = match step {
                    Some(step) => tokio::task::spawn_blocking(step)
                        .await
                        .unwrap_or_else(|error| Err(format!("the step failed: {error}"))),
                    None => Ok(()),
                };
                report(&hub, HubCommand::Released { hold: id, result }).await;
            });
        }
    }

    /// A restart's step is done: its instances are free to start again.
    pub(super) fn released(&mut self, id: u64, result: Result<(), String>) {
        let Some(at) = self.holds.iter().position(|hold| hold.id == id) else { return };
        let mut hold = self.holds.remove(at);
        hold.report.error = result.err();
        let selected: Vec<AgentInstance> =
            self.slots.keys().filter(|instance| hold.selector.matches(instance)).cloned().collect();
        for instance in &selected {
            if let Some(slot) = self.slots.get_mut(instance) {
                // The operator restarted it: a crash streak starts over.
                slot.crashes = 0;
                slot.not_before = None;
            }
        }
        for instance in &selected {
            self.serve(instance, false);
        }
        self.pump();
        if let Some(reply) = hold.reply.take() {
            let _ = reply.send(hold.report);
        }
    }

    /// The swarm stops: restarts in progress end with an error.
    pub(super) fn fail_holds(&mut self) {
        for mut hold in self.holds.drain(..) {
            hold.report.error = Some("the swarm is shutting down".to_owned());
            if let Some(reply) = hold.reply.take() {
                let _ = reply.send(hold.report);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_take_an_agent_a_key_one_instance_or_all() {
        let a = AgentInstance::new("coder", "k1");
        let b = AgentInstance::new("planner", "k1");
        let c = AgentInstance::new("coder", "k2");
        let pick = |selector: &InstanceSelector| -> Vec<bool> { [&a, &b, &c].map(|i| selector.matches(i)).to_vec() };
        assert_eq!(pick(&InstanceSelector::All), [true, true, true]);
        assert_eq!(pick(&InstanceSelector::Agent("coder".into())), [true, false, true]);
        assert_eq!(pick(&InstanceSelector::Key("k1".into())), [true, true, false]);
        assert_eq!(pick(&InstanceSelector::One(b.clone())), [false, true, false]);
    }
}
