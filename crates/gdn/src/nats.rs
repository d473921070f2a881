//! `gdn run --nats URL` (the hub: its agents run on agent hosts) and
//! `gdn host --nats URL` (an agent host): the glue between the command
//! line and goondan-nats.
//!
//! Each side reads its own bundle, state root and secrets: the hub sends a
//! host which instance to run and the swarm it belongs to, never a path of
//! its own or a secret. The NATS credentials are read once, from the
//! environment, by the connection, and are kept from the agent processes.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use goondan_config::{Bundle, load_bundle};
use goondan_ipc::{AgentInstance, InitPayload};
use goondan_nats::{Host, HostConfig, NatsLauncher, Placement, Scope};
use goondan_orchestrator::{AgentLauncher, Launch};
use goondan_runtime::agent::{AgentOptions, identity};
use goondan_runtime::store::{Workspace, WorkspaceAccess};
use goondan_tools::TracingEventSink;

use crate::cli::{GlobalOptions, HostArgs};
use crate::exit;
use crate::output::{self, Output};

/// How long the first connection may take.
const FIRST_CONNECT: Duration = Duration::from_secs(10);
/// How long the broker waits for a host to acknowledge a message before it
/// delivers it again (a host keeps what it still works on from that).
const ACK_WAIT: Duration = Duration::from_secs(60);

/// The hub's side, ready for the orchestrator: its launcher, and the host
/// in its own process that runs agents only while no other host is there.
pub(crate) struct HubParts {
    pub launcher: Arc<dyn Launch>,
    pub own_host: Host,
}

/// What a host needs to run agent processes as `gdn run` would.
pub(crate) struct LocalRuntime {
    pub config: PathBuf,
    pub workspace: PathBuf,
    pub workdir: PathBuf,
    pub env: BTreeMap<String, String>,
    pub launcher: AgentLauncher,
}

/// The placement of the bundle's agents (`spec.placement.hostLabels`).
pub(crate) fn placement(bundle: &Bundle) -> Placement {
    let mut placement = Placement::default();
    for agent in bundle.agents() {
        if let Some(labels) = bundle.placement_for(agent.name()) {
            placement.host_labels.insert(agent.name().to_owned(), labels.clone());
        }
    }
    placement
}

/// Connects, starts the hub's launcher and its own host, and waits for
/// `wait_hosts` other hosts.
pub(crate) async fn hub(
    url: &str,
    env: &dyn Fn(&str) -> Option<String>,
    bundle: &Bundle,
    local: LocalRuntime,
    scope: Scope,
    wait_hosts: Option<(usize, Duration)>,
) -> std::result::Result<HubParts, String> {
    let client = goondan_nats::connect(url, "gdn run (hub)", FIRST_CONNECT, env).await.map_err(|e| e.to_string())?;
    let launcher = NatsLauncher::start(client.clone(), scope.clone(), placement(bundle), &local.workdir)
        .await
        .map_err(|e| e.to_string())?;
    let host_id = format!("{}-hub-{}", hostname(), std::process::id());
    let own_host = Host::start(client, host_config(scope.clone(), host_id, BTreeMap::new(), true, local, ACK_WAIT))
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(target: "goondan::nats", scope = scope.token(), "the hub is on NATS at {url}");
    if let Some((count, within)) = wait_hosts
        && !launcher.wait_for_hosts(count, within).await
    {
        let joined = launcher.agent_hosts();
        return Err(format!("--wait-hosts {count}: only {joined} agent host(s) joined within {} s", within.as_secs()));
    }
    Ok(HubParts { launcher, own_host })
}

fn host_config(
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

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect::<String>())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "host".to_owned())
}

/// The agent processes' arguments (they log as this process does).
pub(crate) fn agent_launch_args(global: &GlobalOptions) -> Vec<String> {
    let mut args: Vec<String> = vec!["-v".to_owned(); usize::from(global.verbose)];
    if global.quiet {
        args.push("-q".to_owned());
    }
    if global.no_color {
        args.push("--no-color".to_owned());
    }
    args.push("__agent".to_owned());
    args
}

/// The secrets an agent process gets: all but the NATS credentials (only
/// the connection reads those) and what only Connections use.
pub(crate) fn agent_env(bundle: &Bundle, secrets: &crate::secrets::Secrets) -> BTreeMap<String, String> {
    let mut env = secrets.to_map();
    for variable in crate::service::agent_withheld_variables(bundle) {
        env.remove(&variable);
    }
    for variable in goondan_nats::connect::CREDENTIAL_VARIABLES {
        env.remove(variable);
    }
    env
}

/// `gdn host`.
pub async fn host(global: &GlobalOptions, args: &HostArgs, session: &crate::Session, out: &mut Output) -> Result<u8> {
    let report = load_bundle(&global.config);
    if report.has_errors() {
        crate::commands::report_config_errors(global, &report, out)?;
        return Ok(exit::USAGE);
    }
    let Some(bundle) = report.bundle else { return Ok(exit::USAGE) };
    let mut labels = BTreeMap::new();
    for label in &args.labels {
        match goondan_config::parse_host_label(label) {
            Ok((key, value)) => {
                labels.insert(key, value);
            }
            Err(error) => {
                output::error_line(&mut out.stderr, format!("--label {label}: {error}"))?;
                return Ok(exit::USAGE);
            }
        }
    }
    if let Some(dir) = args.workdir.as_ref().filter(|dir| !dir.is_dir()) {
        output::error_line(&mut out.stderr, format!("--workdir {} is not a directory", dir.display()))?;
        return Ok(exit::USAGE);
    }
    let root = crate::workspace::state_root(global)?;
    let options = AgentOptions::new(Arc::new(TracingEventSink));
    let (entry, _) = match identity(&bundle, &options) {
        Ok(identity) => identity,
        Err(error) => {
            output::error_line(&mut out.stderr, error.to_string())?;
            return Ok(exit::USAGE);
        }
    };
    let workspace = match crate::workspace::open(global, &root, &bundle, &entry, WorkspaceAccess::Use) {
        Ok(workspace) => workspace,
        Err(message) => {
            output::error_line(&mut out.stderr, &message)?;
            return Ok(exit::USAGE);
        }
    };
    let absolute = |path: &Path| std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let workdir = match &args.workdir {
        Some(dir) => absolute(dir),
        None => match crate::workspace::default_workdir(&workspace) {
            Ok(dir) => dir,
            Err(message) => {
                output::error_line(&mut out.stderr, &message)?;
                return Ok(exit::USAGE);
            }
        },
    };
    let program = std::env::current_exe()?;
    let local = LocalRuntime {
        config: absolute(&global.config),
        workspace: absolute(workspace.dir()),
        workdir,
        env: agent_env(&bundle, &session.secrets),
        launcher: AgentLauncher::new(program, agent_launch_args(global)),
    };
    let env = |name: &str| (session.env)(name);
    let client = match goondan_nats::connect(&args.nats, "gdn host", FIRST_CONNECT, &env).await {
        Ok(client) => client,
        Err(error) => {
            output::error_line(&mut out.stderr, error.to_string())?;
            return Ok(exit::FAILED);
        }
    };
    let host_id = args.host_id.clone().unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id()));
    let scope = Scope::new(workspace.id());
    let ack_wait = args.ack_wait_ms.map_or(ACK_WAIT, |ms| Duration::from_millis(ms.max(300)));
    let mut host =
        match Host::start(client, host_config(scope.clone(), host_id.clone(), labels.clone(), false, local, ack_wait))
            .await
        {
            Ok(host) => host,
            Err(error) => {
                output::error_line(&mut out.stderr, error.to_string())?;
                return Ok(exit::FAILED);
            }
        };
    writeln!(
        out.stderr,
        "agent host {host_id} serves swarm {} on {} (labels: {labels:?}); Ctrl-C stops it",
        scope.token(),
        args.nats
    )?;
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    session.shutdown.turn_started(stop_tx);
    tokio::select! {
        _ = stop_rx.wait_for(|stop| *stop) => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    session.shutdown.handled();
    writeln!(out.stderr, "agent host {host_id} stopping: {} agent process(es) end", host.running())?;
    host.stop().await;
    Ok(exit::OK)
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
pub(crate) struct BrokerCopy {
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
    /// The copy of `workspace`'s swarm for a command given `--nats URL`, or
    /// the exit code of the error it printed.
    pub(crate) fn take_or_exit(
        runtime: &tokio::runtime::Runtime,
        url: &str,
        session: &crate::Session,
        workspace: &Workspace,
        out: &mut Output,
    ) -> Result<std::result::Result<Self, u8>> {
        let env = |name: &str| (session.env)(name);
        match runtime.block_on(Self::take(url, &env, workspace)) {
            Ok(copy) => Ok(Ok(copy)),
            Err(message) => {
                output::error_line(&mut out.stderr, format!("--nats {url}: {message}"))?;
                Ok(Err(exit::FAILED))
            }
        }
    }

    /// Connects to `url` (credentials through `env`) and copies the swarm
    /// of `workspace` (the project's workspace in the real state root).
    pub(crate) async fn take(
        url: &str,
        env: &dyn Fn(&str) -> Option<String>,
        workspace: &Workspace,
    ) -> std::result::Result<Self, String> {
        let client =
            goondan_nats::connect(url, "gdn (state copy)", FIRST_CONNECT, env).await.map_err(|e| e.to_string())?;
        remove_abandoned_copies();
        let dir = tempfile::Builder::new()
            .prefix(&format!("{COPY_PREFIX}{}-", std::process::id()))
            .tempdir()
            .map_err(|e| e.to_string())?;
        let root = goondan_runtime::store::StateRoot::new(dir.path());
        let copy = root.workspace_dir(workspace.id());
        std::fs::create_dir_all(copy.join(Workspace::INSTANCES_DIR_NAME)).map_err(|e| e.to_string())?;
        // The workspace's own files are the hub's: linked, so that they stay live.
        if let Ok(entries) = std::fs::read_dir(workspace.dir()) {
            for entry in entries.flatten() {
                if entry.file_name() != Workspace::INSTANCES_DIR_NAME {
                    std::os::unix::fs::symlink(entry.path(), copy.join(entry.file_name()))
                        .map_err(|e| format!("{}: {e}", copy.display()))?;
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
    pub(crate) fn refresh_every(
        &mut self,
        runtime: &tokio::runtime::Runtime,
        interval: Duration,
    ) -> std::result::Result<(), String> {
        if self.taken_at.elapsed() < interval {
            return Ok(());
        }
        runtime.block_on(self.refresh())
    }

    /// Copies every instance again as the broker has it now.
    pub(crate) async fn refresh(&mut self) -> std::result::Result<(), String> {
        self.taken_at = std::time::Instant::now();
        let instances = Workspace::at(&self.workspace);
        let dir_of = |instance: &AgentInstance| instances.instance_dir(&instance.agent, &instance.instance_key).ok();
        let copied = self.reader.copy(&dir_of).await.map_err(|e| e.to_string())?;
        for copied in copied {
            if let Some(holder) = copied.holder {
                self.holders.insert(copied.instance.to_string(), holder);
            }
        }
        Ok(())
    }
}
