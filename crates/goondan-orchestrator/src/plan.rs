//! The swarm an orchestrator runs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use goondan_config::{Bundle, Resource, SwarmSpec};
use goondan_ipc::SwarmInfo;

/// The default hop limit: a chain of requests longer than this is refused.
pub const DEFAULT_HOP_LIMIT: u32 = 8;

/// How long an agent process may idle before it is stopped, by default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a start waits for a free place, by default.
pub const DEFAULT_CAPACITY_WAIT: Duration = Duration::from_secs(30);
/// What one agent process is budgeted (a measured process takes about 20 MiB;
/// the rest is room for its tools).
const MEMORY_PER_PROCESS: u64 = 64 << 20;
/// The bound when memory cannot be read, and the floor otherwise.
const MIN_PROCESSES: usize = 4;
/// The ceiling of the default bound.
const MAX_PROCESSES: usize = 128;

/// The default bound on live agent processes: the memory available now
/// (`MemAvailable` of `/proc/meminfo`) divided by 64 MiB, between 4 and 128.
pub fn default_max_processes() -> usize {
    let available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|info| mem_available(&info));
    match available {
        Some(bytes) => {
            usize::try_from(bytes / MEMORY_PER_PROCESS).unwrap_or(MAX_PROCESSES).clamp(MIN_PROCESSES, MAX_PROCESSES)
        }
        None => MIN_PROCESSES,
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|line| line.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Everything the orchestrator needs to start and route agent processes.
#[derive(Clone)]
pub struct SwarmPlan {
    /// The swarm: its name, entry agent and agents.
    pub swarm: SwarmInfo,
    /// The bundle, absolute (each agent process loads it).
    pub config: PathBuf,
    /// The state root, absolute.
    pub state_root: PathBuf,
    /// The working directory of instances started without a `cwd`, absolute.
    pub workdir: PathBuf,
    /// Secrets and `--env-file` entries, handed to agent processes over the channel.
    pub env: BTreeMap<String, String>,
    /// The deadline of one tool call.
    pub tool_timeout_ms: Option<u64>,
    /// The most agent-to-agent hops in one chain.
    pub hop_limit: u32,
    /// How long an agent process may take from its start to `ready`.
    pub start_timeout: Duration,
    /// How long agent processes get to stop after `shutdown` before they are killed.
    pub shutdown_grace: Duration,
    /// The most agent processes alive at once (starting, running or stopping).
    pub max_processes: usize,
    /// An agent process with nothing to do for this long is stopped (its
    /// state is on disk; its next message starts it again). `None`: never.
    pub idle_timeout: Option<Duration>,
    /// How long a start waits for a free place under `max_processes` before
    /// it is refused with `AGENT_CAPACITY_EXCEEDED`.
    pub capacity_wait: Duration,
}

impl std::fmt::Debug for SwarmPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwarmPlan")
            .field("swarm", &self.swarm)
            .field("config", &self.config)
            .field("state_root", &self.state_root)
            .field("workdir", &self.workdir)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl SwarmPlan {
    /// A plan with the defaults (hop limit 8, 60 s to start, 5 s to stop, at
    /// most [`default_max_processes`] processes, stopped after
    /// [`DEFAULT_IDLE_TIMEOUT`] idle, [`DEFAULT_CAPACITY_WAIT`] for a place).
    pub fn new(swarm: SwarmInfo, config: PathBuf, state_root: PathBuf, workdir: PathBuf) -> Self {
        Self {
            swarm,
            config,
            state_root,
            workdir,
            env: BTreeMap::new(),
            tool_timeout_ms: None,
            hop_limit: DEFAULT_HOP_LIMIT,
            start_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(5),
            max_processes: default_max_processes(),
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            capacity_wait: DEFAULT_CAPACITY_WAIT,
        }
    }

    /// Whether `agent` belongs to the swarm.
    pub fn has_agent(&self, agent: &str) -> bool {
        self.swarm.agents.iter().any(|name| name == agent)
    }
}

/// The swarm that `entry_agent` (the agent `gdn run` talks to) runs in: the
/// Swarm whose entry it is, else one that lists it (its name, declared entry
/// and agents, `entry_agent` among them), or a swarm of that agent alone.
/// A dependency's Swarm counts too ([`Bundle::swarm_of_agent`]).
pub fn swarm_of(bundle: &Bundle, entry_agent: &str) -> SwarmInfo {
    match bundle.swarm_of_agent(entry_agent) {
        Some(swarm) => swarm_info(&swarm, entry_agent),
        None => SwarmInfo {
            name: entry_agent.to_owned(),
            entry_agent: entry_agent.to_owned(),
            agents: vec![entry_agent.to_owned()],
        },
    }
}

/// The swarm `swarm` run with `entry_agent` as the agent `gdn run` talks
/// to: its name, declared entry and agents, `entry_agent` among them.
pub fn swarm_info(swarm: &Resource<SwarmSpec>, entry_agent: &str) -> SwarmInfo {
    let mut agents: Vec<String> = swarm
        .spec
        .agents
        .iter()
        .filter(|a| a.kind == "Agent")
        .map(|a| a.name.clone())
        .chain(std::iter::once(entry_agent.to_owned()))
        .collect();
    agents.sort();
    agents.dedup();
    SwarmInfo { name: swarm.name().to_owned(), entry_agent: swarm.spec.entry_agent.name.clone(), agents }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    const BUNDLE: &str = r#"apiVersion: goondan.ai/v1
kind: Model
metadata: {name: m}
spec: {provider: scripted, model: s, options: {replies: [{text: hi}]}}
---
apiVersion: goondan.ai/v1
kind: Agent
metadata: {name: lead}
spec: {modelConfig: {modelRef: Model/m}}
---
apiVersion: goondan.ai/v1
kind: Agent
metadata: {name: helper}
spec: {modelConfig: {modelRef: Model/m}}
---
apiVersion: goondan.ai/v1
kind: Agent
metadata: {name: loner}
spec: {modelConfig: {modelRef: Model/m}}
---
apiVersion: goondan.ai/v1
kind: Swarm
metadata: {name: crew}
spec: {entryAgent: Agent/lead, agents: [Agent/lead, Agent/helper]}
"#;

    #[test]
    fn the_default_bound_follows_available_memory() {
        let info = "MemTotal:       16000000 kB\nMemAvailable:    1048576 kB\n";
        assert_eq!(mem_available(info), Some(1 << 30));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        let bound = default_max_processes();
        assert!((MIN_PROCESSES..=MAX_PROCESSES).contains(&bound), "{bound}");
    }

    #[test]
    fn the_swarm_of_an_agent_is_the_one_that_lists_it() {
        let report = goondan_config::load_from_str(BUNDLE, "goondan.yaml", None, PathBuf::from("goondan.yaml"));
        let Some(bundle) = report.valid_bundle() else { panic!("{:?}", report.diagnostics) };
        let crew = swarm_of(bundle, "helper");
        assert_eq!(crew.name, "crew");
        assert_eq!(crew.entry_agent, "lead", "the declared entry, not the agent run");
        assert_eq!(crew.agents, ["helper", "lead"]);
        let alone = swarm_of(bundle, "loner");
        assert_eq!((alone.name.as_str(), alone.agents.as_slice()), ("loner", ["loner".to_owned()].as_slice()));
    }
}
