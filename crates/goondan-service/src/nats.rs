//! The glue between a swarm's service and goondan-nats: the hub's side of
//! `gdn run --nats URL` (its launcher, and a host in its own process that
//! runs agents while no other host is there), an agent host's
//! configuration (`gdn host`), and the copy of a multi-host swarm's state
//! that the commands reading state use.
//!
//! It lives here, not in goondan-nats, because it needs what goondan-nats
//! deliberately does not know: the bundle (`goondan-config`, for the
//! placement and the secrets agents may not see) and the state root's
//! layout (`goondan-runtime`'s workspaces and instance directories).
//!
//! Each side reads its own bundle, state root and secrets: the hub sends a
//! host which instance to run and the swarm it belongs to, never a path of
//! its own or a secret. The NATS credentials are read once, from the
//! environment, by the connection, and are kept from the agent processes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use goondan_config::Bundle;
use goondan_ipc::{AgentInstance, InitPayload};
use goondan_nats::{Host, HostConfig, NatsError, NatsLauncher, Placement, Scope};
use goondan_orchestrator::AgentLauncher;
use goondan_runtime::store::Workspace;

/// How long the first connection may take.
pub const FIRST_CONNECT: Duration = Duration::from_secs(10);
/// How long the broker waits for a host to acknowledge a message before it
/// delivers it again (a host keeps what it still works on from that).
pub const ACK_WAIT: Duration = Duration::from_secs(60);

/// Why the hub's side did not start.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The connection, the launcher or the hub's own host failed.
    #[error(transparent)]
    Nats(#[from] NatsError),
    /// Fewer agent hosts than awaited joined in time.
    #[error("only {joined} agent host(s) joined within {} s", within.as_secs())]
    TooFewHosts {
        /// How many joined.
        joined: usize,
        /// How long the hub waited.
        within: Duration,
    },
}

/// Why a copy of a swarm's state could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// The connection failed.
    #[error(transparent)]
    Nats(#[from] NatsError),
    /// The broker's state could not be read.
    #[error(transparent)]
    Replica(#[from] goondan_nats::replica::ReplicaError),
    /// The temporary state root could not be made.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// One of the workspace's own files could not be linked into the copy.
    #[error("{}: {source}", path.display())]
    Link {
        /// The copy's workspace.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The hub's side, ready for the orchestrator: its launcher, and the host
/// in its own process that runs agents only while no other host is there.
pub struct HubParts {
    /// Starts agent processes on the hosts.
    pub launcher: Arc<NatsLauncher>,
    /// The host in the hub's own process.
    pub own_host: Host,
}

impl HubParts {
    /// Stops the hub's side once the orchestrator is done with it: its own
    /// host (its processes killed, their bridges through), then the
    /// launcher's tasks.
    pub async fn shutdown(mut self) {
        self.own_host.stop().await;
        self.launcher.shutdown().await;
    }
}

/// What a host needs to run agent processes as `gdn run` would.
pub struct LocalRuntime {
    /// The bundle, as this machine has it.
    pub config: PathBuf,
    /// The swarm's workspace directory (the agents' `stateRoot`).
    pub workspace: PathBuf,
    /// The agents' working directory.
    pub workdir: PathBuf,
    /// The secrets agent processes get.
    pub env: BTreeMap<String, String>,
    /// Starts an agent process.
    pub launcher: AgentLauncher,
}

/// The placement of the bundle's agents (`spec.placement.hostLabels`).
pub fn placement(bundle: &Bundle) -> Placement {
    let mut placement = Placement::default();
    for agent in bundle.runnable_agents() {
        if let Some(labels) = bundle.placement_for(agent.name()) {
            placement.host_labels.insert(agent.name().to_owned(), labels.clone());
        }
    }
    placement
}

/// Connects, starts the hub's launcher and its own host, and waits for
/// `wait_hosts` other hosts.
pub async fn hub(
    url: &str,
    env: &dyn Fn(&str) -> Option<String>,
    bundle: &Bundle,
    local: LocalRuntime,
    scope: Scope,
    wait_hosts: Option<(usize, Duration)>,
) -> Result<HubParts, HubError> {
    let client = goondan_nats::connect(url, "gdn run (hub)", FIRST_CONNECT, env).await?;
    let launcher = NatsLauncher::start(client.clone(), scope.clone(), placement(bundle), &local.workdir).await?;
    let host_id = format!("{}-hub-{}", hostname(), std::process::id());
    let own_host =
        Host::start(client, host_config(scope.clone(), host_id, BTreeMap::new(), true, local, ACK_WAIT)).await?;
    tracing::info!(target: "goondan::nats", scope = scope.token(), "the hub is on NATS at {url}");
    if let Some((count, within)) = wait_hosts
        && !launcher.wait_for_hosts(count, within).await
    {
        let joined = launcher.agent_hosts();
        return Err(HubError::TooFewHosts { joined, within });
    }
    Ok(HubParts { launcher, own_host })
}

/// The configuration of a host (the hub's own, or `gdn host`) running
/// agents with `local`.
pub fn host_config(
    scope: Scope,
    host_id: String,
    labels: BTreeMap<String, String>,
    hub: bool,
    local: LocalRuntime,
    ack_wait: Duration,
) -> HostConfig {
    let LocalRuntime { config, workspace, workdir, env, launcher } = local;
    let state_root = workspace.clone();
    let localize = Arc::new(move |mut init: InitPayload| {
        init.config = config.display().to_string();
        init.state_root = state_root.display().to_string();
        // The place under the working directory the hub chose (an
        // `agents__spawn` cwd), under this host's; made if missing.
        let place = match init.workdir.as_deref().filter(|relative| !relative.is_empty()) {
            Some(relative) => {
                let place = workdir.join(relative);
                if let Err(error) = std::fs::create_dir_all(&place) {
                    tracing::warn!("the working directory {} cannot be made: {error}", place.display());
                }
                place
            }
            None => workdir.clone(),
        };
        init.workdir = Some(place.display().to_string());
        init.env = env.clone();
        init
    });
    let instances = Workspace::at(workspace);
    let instance_dir =
        Arc::new(move |instance: &AgentInstance| instances.instance_dir(&instance.agent, &instance.instance_key).ok());
    HostConfig {
        scope,
        host_id,
        labels,
        hub,
        launcher,
        localize,
        instance_dir,
        start_timeout: Duration::from_secs(30),
        ack_wait,
    }
}

/// This machine's name, as host ids start with it.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect::<String>())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "host".to_owned())
}

/// The secrets an agent process gets: all but the NATS credentials (only
/// the connection reads those) and what only Connections use.
pub fn agent_env(bundle: &Bundle, secrets: &crate::secrets::Secrets) -> BTreeMap<String, String> {
    let mut env = secrets.to_map();
    for variable in crate::plan::agent_withheld_variables(bundle) {
        env.remove(&variable);
    }
    for variable in goondan_nats::connect::CREDENTIAL_VARIABLES {
        env.remove(variable);
    }
    env
}

/// The name copies from the broker start with, in the temporary directory:
/// `gdn-swarm-state-<pid>-…`.
const COPY_PREFIX: &str = "gdn-swarm-state-";

/// Removes the copies of processes that are gone (one stopped with Ctrl-C
/// or killed had no chance to remove its own).
fn remove_abandoned_copies() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(COPY_PREFIX).and_then(|rest| rest.split('-').next()) else { continue };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A copy of a multi-host swarm's instances taken from the broker, for the
/// commands that read state (`gdn instance list --nats`, `gdn logs
/// --nats`, `gdn studio --nats`): the instances run on agent hosts, each in its host's state
/// root, and the broker's state stream is the one place that has them all.
/// The copy is a temporary state root holding the project's workspace: its
/// own files (workspace.json, the service's inbox and status) linked from
/// the real one, and every instance as its log has it. Nothing is claimed:
/// the hosts running them are not disturbed.
pub struct BrokerCopy {
    /// The temporary state root.
    pub root: goondan_runtime::store::StateRoot,
    /// Its copy of the workspace.
    pub workspace: PathBuf,
    /// The host of each instance's last claim, by `agent@key`.
    pub holders: BTreeMap<String, String>,
    reader: goondan_nats::replica::StateReader,
    /// When it was last taken.
    taken_at: std::time::Instant,
    _dir: tempfile::TempDir,
}

impl BrokerCopy {
    /// Connects to `url` (credentials through `env`) and copies the swarm
    /// of `workspace` (the project's workspace in the real state root).
    pub async fn take(
        url: &str,
        env: &dyn Fn(&str) -> Option<String>,
        workspace: &Workspace,
    ) -> Result<Self, CopyError> {
        let client = goondan_nats::connect(url, "gdn (state copy)", FIRST_CONNECT, env).await?;
        remove_abandoned_copies();
        let dir = tempfile::Builder::new().prefix(&format!("{COPY_PREFIX}{}-", std::process::id())).tempdir()?;
        let root = goondan_runtime::store::StateRoot::new(dir.path());
        let copy = root.workspace_dir(workspace.id());
        std::fs::create_dir_all(copy.join(Workspace::INSTANCES_DIR_NAME))?;
        // The workspace's own files are the hub's: linked, so that they stay live.
        if let Ok(entries) = std::fs::read_dir(workspace.dir()) {
            for entry in entries.flatten() {
                if entry.file_name() != Workspace::INSTANCES_DIR_NAME {
                    std::os::unix::fs::symlink(entry.path(), copy.join(entry.file_name()))
                        .map_err(|source| CopyError::Link { path: copy.clone(), source })?;
                }
            }
        }
        let mut taken = Self {
            root,
            workspace: copy,
            holders: BTreeMap::new(),
            reader: goondan_nats::replica::StateReader::new(client, Scope::new(workspace.id())),
            taken_at: std::time::Instant::now(),
            _dir: dir,
        };
        taken.refresh().await?;
        Ok(taken)
    }

    /// Copies every instance again, unless the copy is younger than
    /// `interval` (commands that poll call this on every round).
    pub fn refresh_every(&mut self, runtime: &tokio::runtime::Runtime, interval: Duration) -> Result<(), CopyError> {
        if self.taken_at.elapsed() < interval {
            return Ok(());
        }
        runtime.block_on(self.refresh())
    }

    /// Copies every instance again as the broker has it now.
    pub async fn refresh(&mut self) -> Result<(), CopyError> {
        self.taken_at = std::time::Instant::now();
        let instances = Workspace::at(&self.workspace);
        let dir_of = |instance: &AgentInstance| instances.instance_dir(&instance.agent, &instance.instance_key).ok();
        let copied = self.reader.copy(&dir_of).await?;
        for copied in copied {
            if let Some(holder) = copied.holder {
                self.holders.insert(copied.instance.to_string(), holder);
            }
        }
        Ok(())
    }
}
