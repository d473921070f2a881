//! What every agent process does to start its instance, once `init` has
//! come: load the bundle, take the instance's lock, load its conversation,
//! open its event log and build the agent, with the swarm client as the
//! `agents` tool's runtime. The caller adds its own wiring (script host,
//! MCP, extensions) through a hook. A failure is an [`ErrorInfo`] for
//! `ready`, coded so that the front end can map it to an exit status.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use goondan_config::{load_bundle_with, resolve_bundle_file};
use goondan_ipc::ErrorInfo;
use goondan_runtime::agent::{AgentOptions, EnvLookup, build_agent};
use goondan_runtime::conversation::{Conversation, InstanceLog};
use goondan_runtime::inbox::Inbox;
use goondan_runtime::store::{InstanceLock, InstanceStore, StateRoot, StoreError, Workspace};
use goondan_runtime::turn::Agent;
use goondan_tools::{EventSink, FanoutEventSink, JsonLinesEventSink, TracingEventSink};

use crate::channel::AgentChannel;
use crate::swarm::{SwarmParts, SwarmRuntime};

/// The `ready` error codes a front end maps to exit statuses.
pub mod ready_codes {
    /// The agent could not be built from the bundle (usage error).
    pub const BUILD_FAILED: &str = "AGENT_BUILD_FAILED";
    /// An extension failed while it was installed.
    pub const EXTENSION_FAILED: &str = "AGENT_EXTENSION_FAILED";
    /// Another process runs the instance.
    pub const INSTANCE_BUSY: &str = "INSTANCE_BUSY";
    /// The instance's store could not be opened or read.
    pub const STORE_FAILED: &str = "AGENT_STORE_FAILED";
    /// Every code above.
    pub const ALL: &[&str] = &[BUILD_FAILED, EXTENSION_FAILED, INSTANCE_BUSY, STORE_FAILED];
}

/// A started instance: its agent, its conversation, and the lock that
/// keeps every other process off it (held until the process ends).
pub struct Prepared {
    /// The agent, built from the bundle.
    pub agent: Agent,
    /// Its conversation, loaded.
    pub conversation: Conversation,
    /// The instance's lock.
    pub lock: InstanceLock,
    /// Its tasks (pending results that complete later).
    pub tasks: Arc<goondan_runtime::tasks::TaskBook>,
    /// The swarm client, the `agents` tool's runtime (built here, with the
    /// agent's inbox, events and tasks).
    pub runtime: Arc<SwarmRuntime>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared").finish_non_exhaustive()
    }
}

/// The state root's `packages/` directory (the bundle's installed
/// dependencies), from the workspace directory the hub hands over,
/// `<state root>/workspaces/<id>`; `None` for a workspace elsewhere.
fn packages_dir(workspace: &Path) -> Option<PathBuf> {
    let workspaces = workspace.parent().filter(|p| p.file_name() == Some(StateRoot::WORKSPACES_DIR_NAME.as_ref()))?;
    workspaces.parent().map(|root| root.join("packages"))
}

/// Starts the instance `channel.init` names. `wire` adds the caller's
/// plugins to the agent's options before it is built.
pub async fn prepare(channel: &AgentChannel, wire: impl FnOnce(&mut AgentOptions)) -> Result<Prepared, ErrorInfo> {
    let init = &channel.init;
    let instance = &init.instance;
    let build_failed = |message: String| ErrorInfo::new(ready_codes::BUILD_FAILED, message);
    let config = PathBuf::from(&init.config);
    let report = load_bundle_with(&config, packages_dir(Path::new(&init.state_root)).as_deref());
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
    // The hub hands over the workspace it opened (and checked) as `stateRoot`.
    let root = Workspace::at(PathBuf::from(&init.state_root));
    let bundle_file =
        std::fs::canonicalize(resolve_bundle_file(&config)).unwrap_or_else(|_| resolve_bundle_file(&config));
    let store_failed = |error: StoreError| match error {
        StoreError::Busy { .. } => ErrorInfo::new(ready_codes::INSTANCE_BUSY, error.to_string()),
        other => ErrorInfo::new(ready_codes::STORE_FAILED, format!("{instance}: {other}")),
    };
    let mut store =
        InstanceStore::open(&root, &instance.instance_key, &instance.agent, &bundle_file).map_err(store_failed)?;
    let lock = store.lock().map_err(store_failed)?;
    // An instance its service expired (Swarm `policy.lifecycle`) and has
    // not collected yet lives again: its mark goes before any turn, or the
    // service would collect a live conversation. Not cleared, not run.
    if let Some(expired_at) = store.revive().map_err(store_failed)? {
        tracing::info!("{instance}: expired at {expired_at} (ms), taken back by new work");
    }
    // Under the lock: what an earlier process left working is failed here.
    // The inbox of the agent: asynchronous replies and tasks' ends enter here.
    let inbox = Arc::new(Inbox::default());
    let tasks = goondan_runtime::tasks::TaskBook::open(store.dir())
        .map(|book| Arc::new(book.with_hooks(crate::tasks::hooks(&inbox))))
        .map_err(|e| ErrorInfo::new(ready_codes::STORE_FAILED, format!("{instance}: its tasks: {e}")))?;
    let loaded = store.load().map_err(store_failed)?;
    if loaded.skipped_torn_tail || loaded.skipped_corrupt_lines > 0 {
        tracing::warn!(
            "{instance}: skipped {} unreadable line(s) of its conversation log",
            loaded.skipped_corrupt_lines + usize::from(loaded.skipped_torn_tail)
        );
    }
    // The event log, and beside it (written by the same thread, never
    // synced) the original's runtime-event records for its tools.
    let event_log = JsonLinesEventSink::with_export(
        store.event_writer().map_err(store_failed)?,
        store.runtime_events_export().map_err(store_failed)?,
    )
    .map_err(|e| ErrorInfo::new(ready_codes::STORE_FAILED, format!("starting the event writer: {e}")))?;
    let events: Arc<dyn EventSink> =
        Arc::new(FanoutEventSink::new(vec![Arc::new(event_log) as Arc<dyn EventSink>, Arc::new(TracingEventSink)]));
    let mut options = AgentOptions::new(Arc::clone(&events));
    options.agent = Some(instance.agent.clone());
    options.instance_key = Some(instance.instance_key.clone());
    options.swarm = Some(init.swarm.name.clone());
    options.workdir = init.workdir.as_ref().map(PathBuf::from);
    options.env = env;
    options.call_timeout = init.tool_timeout_ms.filter(|ms| *ms > 0).map(std::time::Duration::from_millis);
    options.extension_state = Some(store.dir().join(goondan_runtime::ExtensionStateStore::DIR_NAME));
    options.tasks = Some(Arc::clone(&tasks) as Arc<dyn goondan_tools::tasks::ToolTasks>);
    wire(&mut options);
    // Built once the caller's wiring has its say on the events (telemetry
    // adds its sink): the runtime's events are the agent's.
    let parts = SwarmParts { inbox, events: Arc::clone(&options.events), tasks: Some(Arc::clone(&tasks)) };
    let runtime = SwarmRuntime::new(channel, parts);
    options.agent_runtime = Some(Arc::clone(&runtime) as Arc<dyn goondan_tools::AgentToolRuntime>);
    let mut agent = match build_agent(bundle, &options).await {
        Ok(agent) => agent,
        Err(error @ goondan_runtime::AgentBuildError::Extension { .. }) => {
            return Err(ErrorInfo::new(ready_codes::EXTENSION_FAILED, error.to_string()));
        }
        Err(error) => return Err(build_failed(error.to_string())),
    };
    agent.inbox = Some(Arc::clone(runtime.inbox()));
    let conversation = Conversation::new(loaded.state, Arc::new(InstanceLog::new(store, loaded.events_on_disk)));
    Ok(Prepared { agent, conversation, lock, tasks, runtime })
}
