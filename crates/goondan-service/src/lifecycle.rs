//! A Swarm's `policy.lifecycle` and `policy.shutdown` in its service:
//! idle agent instances expire and are collected, and the stop's grace.
//!
//! ```text
//! policy.lifecycle.ttlSeconds      an instance idle this long (no turn since its last one
//!                                  ended: instance.json's updatedAt) EXPIRES
//! policy.lifecycle.gcGraceSeconds  this long after (default 0) it is COLLECTED: deleted
//! policy.shutdown.gracePeriodSeconds  the drain of a stop (gdn run --drain-secs wins; else 30 s)
//!                                  and the agent processes' grace after their `shutdown`
//!
//! the sweep: at the service's start, then every ttl/4 (between 1 s and 60 s), never per event
//!   for each instance of the swarm's agents in the workspace (instance.json read):
//!   expired and collectAt passed ─► collect: the hub holds it down only if it is idle,
//!       deletes it (the `gdn instance delete --force` deleter) if, under its lock, it is
//!       still expired, with no event stored for it ─► a line in the service's log
//!   live, idle past ttl, no event stored for it, no task whose end it has not had
//!       ─► expire: the hub holds it down only if idle (its process, if any, stops: it has
//!       nothing to do), then under its lock, if still idle past ttl: expiredAt and
//!       collectAt in instance.json (atomically) and `instance.expired` in events.jsonl
//!       ─► a line in the service's log
//! new work for an expired instance (an event, an answer, `gdn run`) starts its process,
//!   which clears the mark before its turn (`instance.revived` in events.jsonl): the
//!   conversation goes on. Grace exists so that a late reply is not lost.
//! ```
//!
//! "Idle" is decided by the hub in the same step that holds the instance
//! ([`Orchestrator::restart_if_idle`]): a running turn is never waited for
//! or cut, and no work reaches the instance between the check and the
//! hold. The marks are durable: a service killed between an expiry and
//! its collection collects at its next start. The collection time is
//! fixed at expiry (`collectAt`): a later edit of `gcGraceSeconds` applies
//! to instances that expire after it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use goondan_config::Bundle;
use goondan_core::message::now_millis;
use goondan_ingress::inbox::Inbox;
use goondan_ipc::AgentInstance;
use goondan_orchestrator::{InstanceSelector, Orchestrator};
use goondan_runtime::store::{Expiry, InstanceInfo, StateRoot, StoreError, Workspace};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::control::{Deleting, Deletion};

/// How long running turns get to finish when a service stops, when
/// neither `gdn run --drain-secs` nor the Swarm's
/// `policy.shutdown.gracePeriodSeconds` says (the original's default, 300
/// s, would outlast a service manager's stop timeout: systemd kills after
/// 90 s).
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(30);

/// The shortest and the longest time between two sweeps.
const MIN_SWEEP: Duration = Duration::from_secs(1);
const MAX_SWEEP: Duration = Duration::from_secs(60);

/// `policy.lifecycle` of the Swarm a service runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifecycle {
    /// `ttlSeconds`: how long an instance may idle before it expires.
    pub ttl: Duration,
    /// `gcGraceSeconds`: how long an expired instance is kept before it is collected.
    pub gc_grace: Duration,
}

impl Lifecycle {
    /// The time between two sweeps: a quarter of the ttl, between 1 s and 60 s.
    pub fn sweep_every(&self) -> Duration {
        (self.ttl / 4).clamp(MIN_SWEEP, MAX_SWEEP)
    }
}

/// What a Swarm's `policy` asks of the run that serves it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    /// `policy.lifecycle`, when it has a `ttlSeconds` (without one nothing expires).
    pub lifecycle: Option<Lifecycle>,
    /// `policy.shutdown.gracePeriodSeconds`.
    pub shutdown_grace: Option<Duration>,
}

impl Policy {
    /// The policy of the Swarm `swarm` of `bundle` (none if it has no such Swarm).
    pub fn of(bundle: &Bundle, swarm: &str) -> Self {
        let Some(swarm) = bundle.swarm(swarm) else { return Self::default() };
        let policy = &swarm.spec.policy;
        let lifecycle = policy.lifecycle.as_ref().and_then(|lifecycle| {
            // The schema refuses 0; a bundle that slipped it past is not
            // taken to mean "expire at once".
            let ttl = lifecycle.ttl_seconds.filter(|ttl| *ttl > 0)?;
            Some(Lifecycle {
                ttl: Duration::from_secs(ttl),
                gc_grace: Duration::from_secs(lifecycle.gc_grace_seconds.unwrap_or(0)),
            })
        });
        let shutdown_grace =
            policy.shutdown.as_ref().and_then(|shutdown| shutdown.grace_period_seconds).map(Duration::from_secs);
        Self { lifecycle, shutdown_grace }
    }

    /// How long a stopping service drains: `--drain-secs` if given, else
    /// `gracePeriodSeconds`, else [`DEFAULT_DRAIN`].
    pub fn drain(&self, drain_secs: Option<u64>) -> Duration {
        drain_secs.map(Duration::from_secs).or(self.shutdown_grace).unwrap_or(DEFAULT_DRAIN)
    }
}

/// What the sweep needs of the service.
pub(crate) struct Sweeper {
    pub(crate) lifecycle: Lifecycle,
    pub(crate) orchestrator: Orchestrator,
    /// What is stored and not done yet, by `agent@key`.
    pub(crate) inbox: Inbox,
    pub(crate) root: StateRoot,
    pub(crate) workspace: Workspace,
    /// The lines for the service's log.
    pub(crate) notes: mpsc::UnboundedSender<String>,
}

impl Sweeper {
    /// Sweeps now, then every [`Lifecycle::sweep_every`], until `stop`.
    pub(crate) fn spawn(self, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let every = self.lifecycle.sweep_every();
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = self.sweep() => {}
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(every) => {}
                }
            }
        })
    }

    /// One pass over the workspace's instances.
    async fn sweep(&self) {
        let dirs = {
            let workspace = self.workspace.clone();
            tokio::task::spawn_blocking(move || workspace.instance_dirs()).await.unwrap_or_default()
        };
        let plan = self.orchestrator.plan();
        for (agent, key, dir) in dirs {
            // The swarm's instances only: another swarm sharing the
            // workspace's name follows its own policy.
            if !plan.has_agent(&agent) {
                continue;
            }
            let info = match goondan_runtime::store::read_instance_info(&dir) {
                Ok(Some(info)) => info,
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!("lifecycle: {error}; the instance is left alone");
                    continue;
                }
            };
            let instance = AgentInstance::new(agent, key);
            let now = now_millis();
            match due(&info, now, self.lifecycle.ttl) {
                Due::Collect => self.collect(instance).await,
                Due::Expire if !has_work(&self.inbox, &instance, &dir) => self.expire(instance, dir).await,
                Due::Expire | Due::Nothing => {}
            }
        }
    }

    /// Expires `instance` (in `dir`) if it is idle; says so in the log.
    async fn expire(&self, instance: AgentInstance, dir: PathBuf) {
        let outcome: Arc<Mutex<Option<Expiry>>> = Arc::new(Mutex::new(None));
        let step = {
            let (instance, inbox, outcome) = (instance.clone(), self.inbox.clone(), Arc::clone(&outcome));
            let ttl_ms = millis(self.lifecycle.ttl);
            let grace_ms = millis(self.lifecycle.gc_grace);
            Box::new(move || {
                // Held down: checked again, as work may have come meanwhile.
                if has_work(&inbox, &instance, &dir) {
                    return Ok(());
                }
                let (agent, key) = (&instance.agent, &instance.instance_key);
                match goondan_runtime::store::mark_expired(&dir, agent, key, ttl_ms, grace_ms, now_millis()) {
                    Ok(expiry) => {
                        if let Ok(mut outcome) = outcome.lock() {
                            *outcome = Some(expiry);
                        }
                        Ok(())
                    }
                    // Run by a process outside this service (`gdn run` on
                    // the same key): it is not idle.
                    Err(StoreError::Busy { .. }) => Ok(()),
                    Err(error) => Err(format!("{instance} could not be marked expired: {error}")),
                }
            }) as goondan_orchestrator::WhileDown
        };
        let report = self.orchestrator.restart_if_idle(InstanceSelector::One(instance.clone()), step).await;
        if report.busy {
            tracing::debug!("lifecycle: {instance} is busy; it does not expire now");
            return;
        }
        if let Some(error) = report.error {
            tracing::warn!("lifecycle: {error}");
            return;
        }
        let expired = outcome.lock().ok().and_then(|mut outcome| outcome.take());
        if let Some(Expiry::Expired { collect_at }) = expired {
            let stopped = match report.stopped.first() {
                Some((_, pid)) => format!(", its process (pid {pid}) stopped"),
                None => String::new(),
            };
            let grace = self.lifecycle.gc_grace.as_secs();
            tracing::info!(%instance, collect_at, "lifecycle: the instance expired");
            let _ = self.notes.send(format!(
                "⌛ {instance} expired: idle for {} s (ttlSeconds){stopped}; collected in {grace} s unless work comes for it",
                self.lifecycle.ttl.as_secs()
            ));
        }
    }

    /// Collects (deletes) the expired `instance` if it still is, through
    /// the deleter `gdn instance delete --force` uses; says so in the log.
    async fn collect(&self, instance: AgentInstance) {
        let inbox = self.inbox.clone();
        let still = instance.clone();
        let wanted = move |info: Option<&InstanceInfo>| {
            // Under its lock: still expired and due (a process that took it
            // back cleared the mark), and no event stored for it since.
            info.is_some_and(|info| info.expired_at.is_some() && due(info, now_millis(), Duration::MAX) == Due::Collect)
                && !pending_for(&inbox, &still)
        };
        let deleting = Deleting {
            root: &self.root,
            workspace: &self.workspace,
            key: instance.instance_key.clone(),
            agent: Some(instance.agent.clone()),
        };
        let (report, deleted) = deleting.run(&self.orchestrator, Deletion::Collect(Box::new(wanted))).await;
        if report.busy {
            tracing::debug!("lifecycle: {instance} is busy (taken back); it is not collected");
        } else if let Some(error) = report.error {
            tracing::warn!("lifecycle: collecting {instance}: {error}");
        } else if !deleted.is_empty() {
            tracing::info!(%instance, "lifecycle: the expired instance was collected");
            let _ = self.notes.send(format!("🗑 {instance} collected: expired, and its gcGraceSeconds passed"));
        }
    }
}

/// What an instance is due for at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    Nothing,
    Expire,
    Collect,
}

fn due(info: &InstanceInfo, now: u64, ttl: Duration) -> Due {
    match info.expired_at {
        Some(expired_at) if now >= info.collect_at.unwrap_or(expired_at) => Due::Collect,
        Some(_) => Due::Nothing,
        None if now.saturating_sub(info.updated_at) >= millis(ttl) => Due::Expire,
        None => Due::Nothing,
    }
}

/// Whether something waits for `instance` (in `dir`) that its expiry would
/// strand: an event stored for it, or a task whose end it has not had.
fn has_work(inbox: &Inbox, instance: &AgentInstance, dir: &std::path::Path) -> bool {
    pending_for(inbox, instance) || goondan_runtime::tasks::has_undelivered(dir)
}

/// Whether an event is stored for `instance` whose turn has not run to its end.
fn pending_for(inbox: &Inbox, instance: &AgentInstance) -> bool {
    inbox.status().pending.get(&instance.to_string()).is_some_and(|count| *count > 0)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(updated_at: u64, expired_at: Option<u64>, collect_at: Option<u64>) -> InstanceInfo {
        InstanceInfo {
            instance_key: "k".into(),
            agent_name: "a".into(),
            swarm_name: None,
            bundle: "/b".into(),
            created_at: 0,
            updated_at,
            turns: 1,
            messages: 2,
            expired_at,
            collect_at,
        }
    }

    #[test]
    fn an_instance_expires_after_its_ttl_and_is_collected_at_its_collect_time() {
        let ttl = Duration::from_secs(10);
        assert_eq!(due(&info(1_000, None, None), 10_999, ttl), Due::Nothing);
        assert_eq!(due(&info(1_000, None, None), 11_000, ttl), Due::Expire);
        assert_eq!(due(&info(1_000, Some(11_000), Some(15_000)), 14_999, ttl), Due::Nothing);
        assert_eq!(due(&info(1_000, Some(11_000), Some(15_000)), 15_000, ttl), Due::Collect);
        // A mark without its collection time (hand-edited): due at once.
        assert_eq!(due(&info(1_000, Some(11_000), None), 11_000, ttl), Due::Collect);
        // A clock set back does not expire anything.
        assert_eq!(due(&info(50_000, None, None), 11_000, ttl), Due::Nothing);
    }

    #[test]
    fn sweeps_come_every_quarter_ttl_between_one_second_and_a_minute() {
        let every = |ttl| Lifecycle { ttl: Duration::from_secs(ttl), gc_grace: Duration::ZERO }.sweep_every();
        assert_eq!(every(1), Duration::from_secs(1));
        assert_eq!(every(40), Duration::from_secs(10));
        assert_eq!(every(86_400), Duration::from_secs(60));
    }

    #[test]
    fn the_drain_is_the_flag_else_the_swarms_grace_else_thirty_seconds() {
        let none = Policy::default();
        assert_eq!(none.drain(None), DEFAULT_DRAIN);
        assert_eq!(none.drain(Some(3)), Duration::from_secs(3));
        let graced = Policy { shutdown_grace: Some(Duration::from_secs(7)), ..Policy::default() };
        assert_eq!(graced.drain(None), Duration::from_secs(7));
        assert_eq!(graced.drain(Some(0)), Duration::ZERO);
    }
}
