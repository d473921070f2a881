//! `gdn __agent`: one agent instance of a swarm, in its own process, started
//! by the orchestrator (`gdn run`) and talking to it over a Unix socket.
//!
//! It joins the orchestrator (the socket and a one-time token come through
//! its environment), receives `init` (the instance, the bundle, and the
//! secrets, which never enter its environment), loads the bundle, takes
//! its instance's lock and conversation, builds the agent as `gdn run`
//! would (the same wiring) with the swarm's runtime for the `agents` tool,
//! says `ready`, and runs a turn per message until `shutdown`, the end of
//! the connection (the orchestrator exited or was killed), SIGTERM, or a
//! turn that asks for a restart.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use goondan_config::{load_bundle, resolve_bundle_file};
use goondan_ipc::ErrorInfo;
use goondan_orchestrator::agent_process::{AgentChannel, ServeEnd, SwarmRuntime, serve};
use goondan_runtime::agent::{AgentOptions, EnvLookup, build_agent};
use goondan_runtime::conversation::{Conversation, InstanceLog};
use goondan_runtime::store::{InstanceStore, StoreError, Workspace};
use goondan_tools::{EventSink, FanoutEventSink, JsonLinesEventSink, TracingEventSink};
use tokio::sync::watch;

use crate::cli::GlobalOptions;
use crate::exit;

/// The `ready` error codes the orchestrator's caller maps to exit statuses.
pub mod ready_codes {
    /// The agent could not be built from the bundle (usage error).
    pub const BUILD_FAILED: &str = "AGENT_BUILD_FAILED";
    /// An extension failed while it was installed.
    pub const EXTENSION_FAILED: &str = "AGENT_EXTENSION_FAILED";
    /// Another process runs the instance.
    pub const INSTANCE_BUSY: &str = "INSTANCE_BUSY";
    /// The instance's store could not be opened or read.
    pub const STORE_FAILED: &str = "AGENT_STORE_FAILED";
}

/// Runs the agent process; its exit status: 0 after `shutdown`, the end of
/// the connection or a restart request, 1 when it could not start.
pub async fn run(_global: &GlobalOptions, session: &crate::Session) -> Result<u8> {
    let channel = match AgentChannel::connect().await {
        Ok(channel) => channel,
        Err(error) => {
            tracing::error!("{error}");
            return Ok(exit::FAILED);
        }
    };
    let instance = channel.init.instance.clone();
    let runtime = SwarmRuntime::new(&channel);
    let (agent, conversation, _lock) = match prepare(&channel, &runtime, session).await {
        Ok(prepared) => prepared,
        Err(error) => {
            tracing::debug!("{instance} could not start: {}", error.message);
            channel.ready(Some(error)).await;
            return Ok(exit::FAILED);
        }
    };
    channel.ready(None).await;
    // SIGTERM / SIGHUP (also the parent-death signal) stop it like `shutdown`.
    let (terminate_tx, terminate) = watch::channel(false);
    session.shutdown.turn_started(terminate_tx);
    let end = serve(agent, conversation, channel, runtime, terminate).await;
    session.shutdown.turn_ended();
    tracing::debug!("{instance} stops: {end:?}");
    // Background jobs of its tool calls end with it (main kills them).
    Ok(match end {
        ServeEnd::Shutdown | ServeEnd::Disconnected | ServeEnd::Restart => exit::OK,
    })
}

type Prepared = (goondan_runtime::turn::Agent, Conversation, goondan_runtime::store::InstanceLock);

async fn prepare(
    channel: &AgentChannel,
    runtime: &Arc<SwarmRuntime>,
    session: &crate::Session,
) -> Result<Prepared, ErrorInfo> {
    let init = &channel.init;
    let instance = &init.instance;
    let build_failed = |message: String| ErrorInfo::new(ready_codes::BUILD_FAILED, message);
    let config = PathBuf::from(&init.config);
    let report = load_bundle(&config);
    let Some(bundle) = report.valid_bundle() else {
        let first = report.diagnostics.iter().find(|d| d.is_error()).map(|d| format!("{}: {}", d.code, d.message));
        return Err(build_failed(format!(
            "the bundle {} has errors{}",
            config.display(),
            first.map(|f| format!(" ({f})")).unwrap_or_default()
        )));
    };
    let secrets: BTreeMap<String, String> = init.env.clone();
    // The environment files' values (among the secrets) win over the process environment.
    let env: EnvLookup = Arc::new(move |name: &str| secrets.get(name).cloned().or_else(|| std::env::var(name).ok()));
    // The orchestrator hands over the workspace it opened (and checked) as `stateRoot`.
    let root = Workspace::at(PathBuf::from(&init.state_root));
    let bundle_file =
        std::fs::canonicalize(resolve_bundle_file(&config)).unwrap_or_else(|_| resolve_bundle_file(&config));
    let store_failed = |error: StoreError| match error {
        StoreError::Busy { .. } => ErrorInfo::new(ready_codes::INSTANCE_BUSY, error.to_string()),
        other => ErrorInfo::new(ready_codes::STORE_FAILED, format!("{instance}: {other}")),
    };
    let store =
        InstanceStore::open(&root, &instance.instance_key, &instance.agent, &bundle_file).map_err(store_failed)?;
    let lock = store.lock().map_err(store_failed)?;
    let loaded = store.load().map_err(store_failed)?;
    if loaded.skipped_torn_tail || loaded.skipped_corrupt_lines > 0 {
        tracing::warn!(
            "{instance}: skipped {} unreadable line(s) of its conversation log",
            loaded.skipped_corrupt_lines + usize::from(loaded.skipped_torn_tail)
        );
    }
    let event_log = JsonLinesEventSink::new(store.event_writer().map_err(store_failed)?)
        .map_err(|e| ErrorInfo::new(ready_codes::STORE_FAILED, format!("starting the event writer: {e}")))?;
    let events: Arc<dyn EventSink> =
        Arc::new(FanoutEventSink::new(vec![Arc::new(event_log) as Arc<dyn EventSink>, Arc::new(TracingEventSink)]));
    let mut options = AgentOptions::new(Arc::clone(&events));
    options.agent = Some(instance.agent.clone());
    options.instance_key = Some(instance.instance_key.clone());
    options.workdir = init.workdir.as_ref().map(PathBuf::from);
    options.env = env;
    options.call_timeout = init.tool_timeout_ms.filter(|ms| *ms > 0).map(std::time::Duration::from_millis);
    options.extension_state = Some(store.dir().join(goondan_runtime::ExtensionStateStore::DIR_NAME));
    options.agent_runtime = Some(Arc::clone(runtime) as Arc<dyn goondan_tools::AgentToolRuntime>);
    crate::wiring::install(&mut options, &session.tool_processes);
    let mut agent = match build_agent(bundle, &options).await {
        Ok(agent) => agent,
        Err(error @ goondan_runtime::AgentBuildError::Extension { .. }) => {
            return Err(ErrorInfo::new(ready_codes::EXTENSION_FAILED, error.to_string()));
        }
        Err(error) => return Err(build_failed(error.to_string())),
    };
    agent.inbox = Some(Arc::clone(runtime.inbox()));
    let conversation = Conversation::new(loaded.state, Arc::new(InstanceLog::new(store, loaded.events_on_disk)));
    Ok((agent, conversation, lock))
}
