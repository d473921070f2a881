//! The control socket of a running service, and its clients: `gdn
//! restart`, `gdn instance restart` and `gdn instance delete --force`
//! reach the service through it.
//!
//! A `gdn run` that serves no Connections (`--input`, or the interactive
//! prompt) listens on a control socket of its own, the same way, and takes
//! only `task cancel` there: its swarm's tasks (a one-shot run waits for
//! them before it exits) are cancelled as a service's are. It names itself
//! in `<workspace>/runs/<pid>.json` (pid, start time, socket) while it
//! runs; `gdn task cancel` asks the service, or else each run listed there.
//!
//! ```text
//! <workspace>/service.sock   (a Unix socket, 0600; its path is in service.json)
//! client ─► one JSON request line ─► the service acts ─► one JSON reply line ─► closed
//!   restart --agent A [--fresh]   the hub restarts A's instances: each finishes its running turn,
//!                                 [their conversations are cleared while none runs], the next
//!                                 message starts them with the bundle as it is on disk
//!   restart [--fresh]             the bundle is loaded and checked first (refused with its
//!                                 diagnostics if it does not validate: the service keeps running);
//!                                 then the whole service drains and re-executes itself (same pid)
//!   instance restart KEY [--fresh] as --agent, for every agent's instance of KEY
//!   instance delete KEY --force   the instances stop after their turns, then are deleted
//!   task cancel HANDLE            the cancel goes to the process that runs the task's instance
//! ```
//!
//! Only the user who runs the service can connect (the socket is the
//! user's, mode 0600, in the user's state root); the requests name no
//! secrets and the replies carry none.
//!
//! And only an unconfined process of that user is served: on accept the
//! service reads the peer's credentials (`SO_PEERCRED`) and its
//! `/proc/<pid>`, and refuses — one reply `{"ok":false,"error":…}`, then
//! the connection closed, and a warning in the service's log naming the
//! pid and uid — a peer that
//! - runs as another user (root included: same uid only), or
//! - is confined as the sandbox confines commands: in another user
//!   namespace than the service's (`ns/user`; when the peer is not
//!   dumpable and that link cannot be read, its `uid_map` as seen from
//!   here), with `NoNewPrivs` set where the service's is not (Landlock
//!   sets it), or with more seccomp filters than the service
//!   (`Seccomp_filters`), or
//! - cannot be inspected (its pid unknown, its `/proc` entry unreadable).
//!
//! The gdn client itself has none of these. This is defence in depth: a
//! sandboxed command is not meant to reach the socket at all.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use goondan_ipc::AgentInstance;
use goondan_orchestrator::{InstanceSelector, Orchestrator, RestartReport};
use goondan_runtime::store::{StateRoot, Workspace};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// What serves the control socket's requests: a service's
/// [`ControlContext`] (every request), or a run's [`RunControl`].
pub trait ControlHandler: Send + Sync + 'static {
    /// The reply to `request`.
    fn handle(&self, request: ControlRequest) -> futures_util::future::BoxFuture<'_, ControlReply>;
}

impl ControlHandler for ControlContext {
    fn handle(&self, request: ControlRequest) -> futures_util::future::BoxFuture<'_, ControlReply> {
        Box::pin(handle(request, self))
    }
}

/// The socket's file name in a workspace.
pub const SOCKET_FILE: &str = "service.sock";
/// The longest request line read.
const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// How long a refused client's request is waited for before its refusal is sent.
const REFUSED_READ: Duration = Duration::from_secs(2);
/// A Unix socket's path must fit `sun_path` (108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 100;

/// What a client asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum ControlRequest {
    /// `gdn restart [--agent NAME] [--fresh]`.
    Restart { agent: Option<String>, fresh: bool },
    /// `gdn instance restart KEY [--fresh]`.
    RestartInstance { key: String, fresh: bool },
    /// `gdn instance delete KEY [--agent NAME] --force`.
    DeleteInstance { key: String, agent: Option<String> },
    /// `gdn task cancel HANDLE`: the task's instance is `agent@key`.
    CancelTask { agent: String, key: String, handle: String },
}

/// A process a restart stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoppedProcess {
    /// `agent@key`.
    pub instance: String,
    /// Its pid.
    pub pid: u32,
}

/// The service's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlReply {
    /// Whether it was done.
    pub ok: bool,
    /// Why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A full restart refused: the bundle's problems.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub diagnostics: Vec<String>,
    /// The processes that were stopped (each after its running turn).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stopped: Vec<StoppedProcess>,
    /// The instances (`agent@key`) whose conversations were cleared.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reset: Vec<String>,
    /// The instances (`agent@key`) that were deleted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted: Vec<String>,
    /// A full restart is under way: the service drains and starts again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restarting: bool,
    /// A task's cancel reached the process that runs its work.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancel_sent: bool,
}

impl ControlReply {
    fn failed(error: impl Into<String>) -> Self {
        Self { ok: false, error: Some(error.into()), ..Self::default() }
    }
}

/// A whole-service restart the control socket asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FullRestart {
    /// Clear every conversation of the workspace while nothing runs.
    pub fresh: bool,
}

/// Whether the bundle on disk can be served: its problems if not (asked
/// before a whole restart, and by the watcher before it restarts).
pub type BundleCheck = Arc<dyn Fn() -> Result<(), Vec<String>> + Send + Sync>;

/// What the control server acts on.
pub struct ControlContext {
    /// The swarm's hub.
    pub orchestrator: Orchestrator,
    /// The service's dispatcher (turns held on a broken bundle run again after a restart).
    pub dispatcher: goondan_ingress::dispatch::Dispatcher,
    /// The state root (deletes reach old-layout instances through it).
    pub root: StateRoot,
    /// The workspace the service runs on.
    pub workspace: Workspace,
    /// Checks that the bundle on disk can be served, before a full restart:
    /// its diagnostics if not.
    pub check_bundle: BundleCheck,
    /// Where a full restart is asked for (the serve loop): one at a time,
    /// since the first ends the loop.
    pub full_restart: mpsc::Sender<FullRestart>,
}

/// Where a workspace's control socket goes: in the workspace, or (when
/// that path is too long for a Unix socket) in the runtime directory
/// under a name made from the workspace's path.
pub fn socket_path(workspace_dir: &Path) -> PathBuf {
    fitting_socket_path(workspace_dir.join(SOCKET_FILE), workspace_dir)
}

/// `wanted`, or (when it is too long for a Unix socket) a path in the
/// runtime directory under a name made from `key`.
fn fitting_socket_path(wanted: PathBuf, key: &Path) -> PathBuf {
    if wanted.as_os_str().len() <= MAX_SOCKET_PATH {
        return wanted;
    }
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    let dir = std::env::var_os("XDG_RUNTIME_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    dir.join(format!("gdn-{}-{:016x}.sock", nix::unistd::getuid(), hasher.finish()))
}

/// Listens on `path` until `stop`; each connection is one request.
///
/// A file left at `path` by a service that was killed is replaced: the
/// caller holds the workspace's inbox, so no other service can be using it.
pub fn listen<H: ControlHandler>(
    path: &Path,
    context: Arc<H>,
    stop: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    let listener = tokio::net::UnixListener::bind(path)?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    let own = Arc::new(Peers::own());
    if let Err(error) = &own.confinement {
        tracing::warn!("the control socket refuses every client: this process's /proc entry cannot be read: {error}");
    }
    let path = path.to_path_buf();
    Ok(tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = stop.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((stream, _)) => {
                    let context = Arc::clone(&context);
                    let own = Arc::clone(&own);
                    // Not cut by `stop`: a request runs to its answer, a stop's own included.
                    tokio::spawn(async move {
                        let refused = own.refusal(&stream);
                        if let Some(refused) = &refused {
                            tracing::warn!(
                                pid = refused.pid,
                                uid = refused.uid,
                                "the control socket refused a client (pid {}, uid {}): {}",
                                refused.pid.map_or_else(|| "unknown".to_owned(), |pid| pid.to_string()),
                                refused.uid.map_or_else(|| "unknown".to_owned(), |uid| uid.to_string()),
                                refused.reason
                            );
                        }
                        if let Err(error) = serve_one(stream, &*context, refused).await {
                            tracing::warn!("a control request failed: {error}");
                        }
                    });
                }
                Err(error) => {
                    tracing::warn!("the control socket: {error}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        let _ = std::fs::remove_file(&path);
    }))
}

/// Who the control socket serves: this process's user, unconfined (see
/// the module docs), as this process is.
#[derive(Debug)]
struct Peers {
    /// The service's effective uid.
    uid: u32,
    /// The service's own confinement (what a client may have as much of).
    confinement: Result<Confinement, String>,
}

/// A client refused, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Refused {
    pid: Option<i32>,
    uid: Option<u32>,
    reason: String,
}

impl Refused {
    /// The reply's error.
    fn message(&self) -> String {
        format!("refused: {} (the control socket serves only the service's own user, unconfined)", self.reason)
    }
}

impl Peers {
    fn own() -> Self {
        Self {
            uid: nix::unistd::geteuid().as_raw(),
            confinement: Confinement::of(Path::new("/proc/self")).map_err(|error| error.to_string()),
        }
    }

    /// Why the peer of `stream` is refused, if it is.
    fn refusal(&self, stream: &tokio::net::UnixStream) -> Option<Refused> {
        let credentials = match stream.peer_cred() {
            Ok(credentials) => credentials,
            Err(error) => {
                return Some(Refused {
                    pid: None,
                    uid: None,
                    reason: format!("its credentials cannot be read: {error}"),
                });
            }
        };
        let (uid, pid) = (credentials.uid(), credentials.pid());
        let reason = self.refuses(uid, pid, |pid| Confinement::of(&PathBuf::from(format!("/proc/{pid}"))))?;
        Some(Refused { pid, uid: Some(uid), reason })
    }

    /// Why a peer of `uid` and `pid` (whose confinement `inspect` reads)
    /// is refused, if it is.
    fn refuses(
        &self,
        uid: u32,
        pid: Option<i32>,
        inspect: impl FnOnce(i32) -> std::io::Result<Confinement>,
    ) -> Option<String> {
        if uid != self.uid {
            return Some(format!("it runs as uid {uid}, the service as uid {}", self.uid));
        }
        let own = match &self.confinement {
            Ok(own) => own,
            Err(error) => return Some(format!("the service cannot read its own /proc entry: {error}")),
        };
        // 0: a process of a pid namespace this one cannot see.
        let Some(pid) = pid.filter(|pid| *pid > 0) else {
            return Some("its process cannot be identified".to_owned());
        };
        match inspect(pid) {
            Ok(peer) => peer.confined_beyond(own),
            Err(error) => Some(format!("its process cannot be inspected: {error}")),
        }
    }
}

/// What of a process's confinement `/proc/<pid>` tells.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Confinement {
    /// Its user namespace (`ns/user`, e.g. `user:[4026531837]`); `None`
    /// when the link cannot be read (a process that is not dumpable, as
    /// gdn makes itself, hides it from processes without CAP_SYS_PTRACE).
    user_ns: Option<String>,
    /// Its `uid_map` as this process reads it: the same for a process of
    /// the same user namespace, another for a process in a namespace
    /// below it.
    uid_map: String,
    /// `NoNewPrivs` (set by Landlock confinement).
    no_new_privs: bool,
    /// How many seccomp filters it runs under (`Seccomp_filters`; on
    /// kernels without that line, 1 in filter mode).
    seccomp_filters: u32,
}

impl Confinement {
    /// Reads it from `proc_dir` (`/proc/<pid>`, `/proc/self`).
    fn of(proc_dir: &Path) -> std::io::Result<Self> {
        let status = std::fs::read_to_string(proc_dir.join("status"))?;
        let uid_map = std::fs::read_to_string(proc_dir.join("uid_map"))?;
        let user_ns = std::fs::read_link(proc_dir.join("ns/user")).ok().map(|link| link.display().to_string());
        let (no_new_privs, seccomp_filters) = parse_status(&status);
        Ok(Self { user_ns, uid_map, no_new_privs, seccomp_filters })
    }

    /// Why this process (a peer) counts as confined beyond `own`, if it does.
    fn confined_beyond(&self, own: &Self) -> Option<String> {
        let other_namespace = match (&self.user_ns, &own.user_ns) {
            (Some(peer), Some(own)) => peer != own,
            _ => normalized(&self.uid_map) != normalized(&own.uid_map),
        };
        if other_namespace {
            return Some("it runs in another user namespace (a sandbox)".to_owned());
        }
        if self.no_new_privs && !own.no_new_privs {
            return Some("it runs with no_new_privs (as sandboxed commands do)".to_owned());
        }
        if self.seccomp_filters > own.seccomp_filters {
            return Some(format!(
                "it runs under {} seccomp filter(s), the service under {} (as sandboxed commands do)",
                self.seccomp_filters, own.seccomp_filters
            ));
        }
        None
    }
}

/// A uid_map's lines with their columns' padding removed.
fn normalized(map: &str) -> Vec<Vec<&str>> {
    map.lines().map(|line| line.split_whitespace().collect()).filter(|line: &Vec<&str>| !line.is_empty()).collect()
}

/// `NoNewPrivs` and the number of seccomp filters of a `/proc/<pid>/status`.
fn parse_status(status: &str) -> (bool, u32) {
    let field = |name: &str| {
        status.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(':').map(str::trim).map(str::to_owned))
    };
    let no_new_privs = field("NoNewPrivs").is_some_and(|value| value == "1");
    let filters = match field("Seccomp_filters").and_then(|value| value.parse().ok()) {
        Some(filters) => filters,
        // Mode 2 is filter mode.
        None => u32::from(field("Seccomp").is_some_and(|mode| mode == "2")),
    };
    (no_new_privs, filters)
}

/// Reads one request and answers it; a client `refused` gets its refusal
/// as the reply (its request read first, so that its write does not fail
/// before it can read why; waited for a little only), nothing done.
async fn serve_one<H: ControlHandler>(
    stream: tokio::net::UnixStream,
    context: &H,
    refused: Option<Refused>,
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = Vec::new();
    let mut reader = tokio::io::BufReader::new(read).take(MAX_REQUEST_BYTES as u64 + 1);
    let reply = if let Some(refused) = refused {
        let _ = tokio::time::timeout(REFUSED_READ, reader.read_until(b'\n', &mut line)).await;
        ControlReply::failed(refused.message())
    } else if reader.read_until(b'\n', &mut line).await? > MAX_REQUEST_BYTES {
        ControlReply::failed(format!("the request is over {MAX_REQUEST_BYTES} bytes"))
    } else {
        match serde_json::from_slice::<ControlRequest>(&line) {
            Ok(request) => {
                tracing::info!("control: {request:?}");
                context.handle(request).await
            }
            Err(error) => ControlReply::failed(format!("not a control request: {error}")),
        }
    };
    let mut text = serde_json::to_vec(&reply).map_err(std::io::Error::other)?;
    text.push(b'\n');
    write.write_all(&text).await?;
    write.shutdown().await
}

/// Clears the conversations `key`/`agent` select, while none runs.
fn reset_step(
    workspace: &Workspace,
    key: Option<String>,
    agent: Option<String>,
    reset: Arc<Mutex<Vec<String>>>,
) -> goondan_orchestrator::WhileDown {
    let workspace = workspace.clone();
    Box::new(move || {
        let cleared = goondan_runtime::store::reset_conversations(&workspace, key.as_deref(), agent.as_deref())
            .map_err(|error| error.to_string())?;
        if let Ok(mut reset) = reset.lock() {
            reset.extend(cleared.iter().map(|r| AgentInstance::new(&r.agent_name, &r.instance_key).to_string()));
        }
        Ok(())
    })
}

fn stopped(report: &RestartReport) -> Vec<StoppedProcess> {
    report.stopped.iter().map(|(instance, pid)| StoppedProcess { instance: instance.to_string(), pid: *pid }).collect()
}

fn taken(list: &Mutex<Vec<String>>) -> Vec<String> {
    list.lock().map(|mut list| std::mem::take(&mut *list)).unwrap_or_default()
}

/// A restart refused: the bundle on disk would not build the new processes.
fn broken_bundle(diagnostics: Vec<String>) -> ControlReply {
    ControlReply {
        diagnostics,
        ..ControlReply::failed("the bundle on disk does not validate; the service keeps running the one it has")
    }
}

async fn handle(request: ControlRequest, context: &ControlContext) -> ControlReply {
    let orchestrator = &context.orchestrator;
    // What restarts loads the bundle on disk: it must be one that builds.
    if matches!(request, ControlRequest::Restart { .. } | ControlRequest::RestartInstance { .. })
        && let Err(diagnostics) = (context.check_bundle)()
    {
        return broken_bundle(diagnostics);
    }
    let reply = act(request, context, orchestrator).await;
    if reply.ok {
        // The bundle builds: turns held because it did not may run now.
        context.dispatcher.release_held();
    }
    reply
}

async fn act(request: ControlRequest, context: &ControlContext, orchestrator: &Orchestrator) -> ControlReply {
    match request {
        ControlRequest::Restart { agent: Some(agent), fresh } => {
            if !orchestrator.plan().has_agent(&agent) {
                let agents = &orchestrator.plan().swarm.agents;
                let hint = goondan_core::naming::closest(&agent, agents.iter().map(String::as_str))
                    .map(|near| format!("did you mean '{near}'? "))
                    .unwrap_or_default();
                return ControlReply::failed(format!(
                    "the swarm has no agent '{agent}' ({hint}its agents: {})",
                    agents.join(", ")
                ));
            }
            let selector = InstanceSelector::Agent(agent.clone());
            restart_resetting(context, orchestrator, selector, None, Some(agent), fresh).await
        }
        ControlRequest::Restart { agent: None, fresh } => {
            // Full: a restart is asked for already, and this one is the same.
            if let Err(mpsc::error::TrySendError::Closed(_)) = context.full_restart.try_send(FullRestart { fresh }) {
                return ControlReply::failed("the service is stopping");
            }
            ControlReply { ok: true, restarting: true, ..ControlReply::default() }
        }
        ControlRequest::RestartInstance { key, fresh } => {
            let selector = InstanceSelector::Key(key.clone());
            restart_resetting(context, orchestrator, selector, Some(key), None, fresh).await
        }
        ControlRequest::CancelTask { agent, key, handle } => {
            let sent = orchestrator.cancel_task(&AgentInstance::new(agent, key), &handle).await;
            ControlReply { ok: true, cancel_sent: sent, ..ControlReply::default() }
        }
        ControlRequest::DeleteInstance { key, agent } => {
            let deleting = Deleting { root: &context.root, workspace: &context.workspace, key, agent };
            let (report, deleted) = deleting.run(orchestrator, Deletion::Operator).await;
            ControlReply { deleted, ..restarted(&report) }
        }
    }
}

/// Instances to delete through the hub: `gdn instance delete --force`,
/// and the service's collection of expired instances (`crate::lifecycle`)
/// — one deleter for both.
pub(crate) struct Deleting<'a> {
    pub(crate) root: &'a StateRoot,
    pub(crate) workspace: &'a Workspace,
    /// The instance key.
    pub(crate) key: String,
    /// Only this agent's instance of the key (`None`: every agent's).
    pub(crate) agent: Option<String>,
}

/// Who deletes, and so on what terms.
pub(crate) enum Deletion {
    /// The operator: the instances stop after their running turns, then go.
    Operator,
    /// The service's collection: only if the instances are idle (nothing is
    /// waited for), and only those `wanted` accepts once their locks are
    /// held (their instance.json, if readable).
    Collect(Wanted),
}

/// Which of the instances found a collection deletes (their instance.json, if readable).
pub(crate) type Wanted = Box<dyn Fn(Option<&goondan_runtime::store::InstanceInfo>) -> bool + Send>;

impl Deleting<'_> {
    /// Holds the instances down (their processes stopped), deletes them,
    /// releases them; the hub's report, and what was deleted (`agent@key`).
    pub(crate) async fn run(self, orchestrator: &Orchestrator, deletion: Deletion) -> (RestartReport, Vec<String>) {
        let Self { root, workspace, key, agent } = self;
        let selector = match &agent {
            Some(agent) => InstanceSelector::One(AgentInstance::new(agent, &key)),
            None => InstanceSelector::Key(key.clone()),
        };
        let deleted = Arc::new(Mutex::new(Vec::new()));
        let (root, workspace, gone) = (root.clone(), workspace.clone(), Arc::clone(&deleted));
        let delete = move |wanted: &dyn Fn(Option<&goondan_runtime::store::InstanceInfo>) -> bool| {
            let found = goondan_runtime::store::delete_instances_if(&root, &workspace, &key, agent.as_deref(), wanted)
                .map_err(|error| format!("{error} (nothing was deleted)"))?;
            if let Ok(mut gone) = gone.lock() {
                gone.extend(found.iter().map(|g| AgentInstance::new(&g.agent_name, &key).to_string()));
            }
            Ok(())
        };
        let report = match deletion {
            Deletion::Operator => orchestrator.restart(selector, Some(Box::new(move || delete(&|_| true)))).await,
            Deletion::Collect(wanted) => {
                orchestrator.restart_if_idle(selector, Box::new(move || delete(&*wanted))).await
            }
        };
        (report, taken(&deleted))
    }
}

/// Restarts the instances of `selector`; when `fresh`, their conversations
/// (of the instance `key` or of the agent `agent`) are reset while they are
/// down.
async fn restart_resetting(
    context: &ControlContext,
    orchestrator: &Orchestrator,
    selector: InstanceSelector,
    key: Option<String>,
    agent: Option<String>,
    fresh: bool,
) -> ControlReply {
    let reset = Arc::new(Mutex::new(Vec::new()));
    let step = fresh.then(|| reset_step(&context.workspace, key, agent, Arc::clone(&reset)));
    let report = orchestrator.restart(selector, step).await;
    ControlReply { reset: taken(&reset), ..restarted(&report) }
}

/// The reply to a restart that ended with `report`.
fn restarted(report: &RestartReport) -> ControlReply {
    ControlReply {
        ok: report.error.is_none(),
        error: report.error.clone(),
        stopped: stopped(report),
        ..ControlReply::default()
    }
}

/// The directory of a workspace where runs without a service name themselves.
pub const RUNS_DIR: &str = "runs";

/// The control of a `gdn run` that serves no Connections: a task's cancel
/// reaches the process that runs its work, as through a service; what only
/// a service does (restarts, deletes) is refused, saying so.
pub struct RunControl {
    /// The run's hub.
    pub orchestrator: Orchestrator,
}

impl ControlHandler for RunControl {
    fn handle(&self, request: ControlRequest) -> futures_util::future::BoxFuture<'_, ControlReply> {
        Box::pin(async move {
            match request {
                ControlRequest::CancelTask { agent, key, handle } => {
                    let sent = self.orchestrator.cancel_task(&AgentInstance::new(agent, key), &handle).await;
                    ControlReply { ok: true, cancel_sent: sent, ..ControlReply::default() }
                }
                other => ControlReply::failed(format!(
                    "gdn run (pid {}) serves no Connections, so it is no service: it takes a task's cancel only, \
                     not {}",
                    std::process::id(),
                    other.describe()
                )),
            }
        })
    }
}

impl ControlRequest {
    /// The command that sends it, for messages.
    fn describe(&self) -> &'static str {
        match self {
            Self::Restart { .. } => "gdn restart",
            Self::RestartInstance { .. } => "gdn instance restart",
            Self::DeleteInstance { .. } => "gdn instance delete --force",
            Self::CancelTask { .. } => "gdn task cancel",
        }
    }
}

/// What a running `gdn run` without a service says of itself in
/// `<workspace>/runs/<pid>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    /// Its process.
    pub pid: u32,
    /// When it started (ms since the epoch).
    pub started_at: u64,
    /// Its control socket.
    pub control: String,
}

/// A run's control socket and its record, both removed when it is dropped.
pub struct RunListener {
    record: PathBuf,
    socket: PathBuf,
    stop: CancellationToken,
}

impl Drop for RunListener {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_file(&self.record);
        // Also here: the listening task may not run again before the
        // process exits.
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Makes this run reachable by `gdn task cancel`: a control socket served
/// by [`RunControl`], named in `<workspace>/runs/<pid>.json`. `None`
/// (with a warning) when it cannot be set up: the run goes on without it.
pub fn listen_for_run(workspace_dir: &Path, orchestrator: &Orchestrator) -> Option<RunListener> {
    let pid = std::process::id();
    let runs = workspace_dir.join(RUNS_DIR);
    let set_up = || -> std::io::Result<RunListener> {
        goondan_runtime::store::create_private_dir_all(&runs)?;
        let socket = fitting_socket_path(runs.join(format!("{pid}.sock")), &runs.join(pid.to_string()));
        let stop = CancellationToken::new();
        let context = Arc::new(RunControl { orchestrator: orchestrator.clone() });
        listen(&socket, context, stop.child_token())?;
        let record = runs.join(format!("{pid}.json"));
        let listener = RunListener { record: record.clone(), socket: socket.clone(), stop };
        let text = serde_json::to_vec_pretty(&RunRecord {
            pid,
            started_at: goondan_core::message::now_millis(),
            control: socket.display().to_string(),
        })
        .map_err(std::io::Error::other)?;
        // Written whole, then renamed: a reader never sees half a record.
        let temp = runs.join(format!(".{pid}.json"));
        let mut file = goondan_runtime::store::private_file().write(true).create(true).truncate(true).open(&temp)?;
        file.write_all(&text)?;
        std::fs::rename(&temp, &record)?;
        Ok(listener)
    };
    match set_up() {
        Ok(listener) => Some(listener),
        Err(error) => {
            tracing::warn!("no control socket for this run ({error}): gdn task cancel cannot reach its tasks");
            None
        }
    }
}

/// The runs without a service on `workspace_dir` that still run: records
/// whose process is gone (a `kill -9` leaves them) are removed.
pub fn running_runs(workspace_dir: &Path) -> Vec<RunRecord> {
    let runs = workspace_dir.join(RUNS_DIR);
    let Ok(entries) = std::fs::read_dir(&runs) else { return Vec::new() };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|ext| ext != "json") {
            continue;
        }
        let Some(record) = std::fs::read(&path).ok().and_then(|text| serde_json::from_slice::<RunRecord>(&text).ok())
        else {
            continue;
        };
        // A record whose process is gone is a run that ended without
        // cleaning up (one whose pid was reused is found out when its
        // socket does not answer).
        let pid = nix::unistd::Pid::from_raw(i32::try_from(record.pid).unwrap_or(i32::MAX));
        match nix::sys::signal::kill(pid, None) {
            Err(nix::errno::Errno::ESRCH) => {
                let _ = std::fs::remove_file(&path);
                let _ = std::fs::remove_file(&record.control);
            }
            _ => found.push(record),
        }
    }
    found.sort_by_key(|record| record.pid);
    found
}

/// Sends `request` to the service listening on `socket` and waits for
/// its reply (a restart waits for running turns: up to `wait`).
pub fn request(socket: &Path, request: &ControlRequest, wait: Duration) -> Result<ControlReply, String> {
    let mut stream = std::os::unix::net::UnixStream::connect(socket)
        .map_err(|error| format!("cannot reach the service at {}: {error}", socket.display()))?;
    stream.set_read_timeout(Some(wait)).map_err(|e| e.to_string())?;
    let mut line = serde_json::to_vec(request).map_err(|e| e.to_string())?;
    line.push(b'\n');
    stream.write_all(&line).map_err(|error| format!("writing to the service: {error}"))?;
    let mut reply = String::new();
    match BufReader::new(stream).read_line(&mut reply) {
        Ok(0) => Err("the service closed the connection without a reply".to_owned()),
        Ok(_) => serde_json::from_str(&reply).map_err(|error| format!("an unreadable reply from the service: {error}")),
        Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            Err(format!("no reply from the service within {} s (running turns may still be finishing)", wait.as_secs()))
        }
        Err(error) => Err(format!("reading the service's reply: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_tagged_camel_case_json() -> Result<(), serde_json::Error> {
        let request = ControlRequest::RestartInstance { key: "user:1".into(), fresh: true };
        let text = serde_json::to_string(&request)?;
        assert_eq!(text, r#"{"op":"restartInstance","key":"user:1","fresh":true}"#);
        assert_eq!(serde_json::from_str::<ControlRequest>(&text)?, request);
        let reply = ControlReply { ok: true, restarting: true, ..ControlReply::default() };
        assert_eq!(serde_json::to_string(&reply)?, r#"{"ok":true,"restarting":true}"#);
        Ok(())
    }

    fn unconfined() -> Confinement {
        Confinement {
            user_ns: Some("user:[4026531837]".into()),
            uid_map: "         0          0 4294967295\n".into(),
            no_new_privs: false,
            seccomp_filters: 0,
        }
    }

    fn peers(confinement: Confinement) -> Peers {
        Peers { uid: 1000, confinement: Ok(confinement) }
    }

    #[test]
    fn proc_status_gives_no_new_privs_and_the_seccomp_filters() {
        let status = "Name:\tbash\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t3\n";
        assert_eq!(parse_status(status), (true, 3));
        assert_eq!(parse_status("NoNewPrivs:\t0\nSeccomp:\t0\nSeccomp_filters:\t0\n"), (false, 0));
        // Older kernels: no Seccomp_filters line; filter mode counts as one.
        assert_eq!(parse_status("NoNewPrivs:\t0\nSeccomp:\t2\n"), (false, 1));
        assert_eq!(parse_status("Name:\tx\n"), (false, 0));
    }

    #[test]
    fn only_an_unconfined_process_of_the_same_user_is_served() {
        let service = peers(unconfined());
        let same = |peer: Confinement| service.refuses(1000, Some(42), |_| Ok(peer));
        assert_eq!(same(unconfined()), None);
        // The gdn client is not dumpable: its ns link is unreadable, its uid_map the same.
        assert_eq!(same(Confinement { user_ns: None, uid_map: "0 0 4294967295".into(), ..unconfined() }), None);

        let refused = |reason: Option<String>, says: &str| {
            let reason = reason.unwrap_or_else(|| panic!("not refused (expected: {says})"));
            assert!(reason.contains(says), "{reason}");
        };
        refused(service.refuses(0, Some(42), |_| Ok(unconfined())), "uid 0");
        refused(service.refuses(1001, Some(42), |_| Ok(unconfined())), "uid 1001");
        refused(same(Confinement { no_new_privs: true, ..unconfined() }), "no_new_privs");
        refused(same(Confinement { seccomp_filters: 1, ..unconfined() }), "seccomp");
        refused(same(Confinement { user_ns: Some("user:[4026532000]".into()), ..unconfined() }), "namespace");
        refused(same(Confinement { user_ns: None, uid_map: "1000 1000 1\n".into(), ..unconfined() }), "namespace");
        refused(service.refuses(1000, None, |_| Ok(unconfined())), "identified");
        refused(service.refuses(1000, Some(0), |_| Ok(unconfined())), "identified");
        refused(service.refuses(1000, Some(42), |_| Err(std::io::ErrorKind::NotFound.into())), "inspected");
        let blind = Peers { uid: 1000, confinement: Err("no /proc".into()) };
        refused(blind.refuses(1000, Some(42), |_| Ok(unconfined())), "own /proc");

        // A service that runs confined itself (a container's filter, no_new_privs
        // from its supervisor) still serves a client confined as much.
        let contained = Confinement { no_new_privs: true, seccomp_filters: 1, ..unconfined() };
        assert_eq!(peers(contained.clone()).refuses(1000, Some(42), |_| Ok(contained.clone())), None);
        refused(
            peers(contained.clone()).refuses(1000, Some(42), |_| Ok(Confinement { seccomp_filters: 2, ..contained })),
            "2 seccomp",
        );
    }

    #[tokio::test]
    async fn a_peer_is_read_from_its_credentials_and_proc() -> std::io::Result<()> {
        let own = Peers::own();
        let (ours, _theirs) = tokio::net::UnixStream::pair()?;
        // The peer is this process: served.
        assert_eq!(own.refusal(&ours), None);

        // A process with no_new_privs set: its /proc says so.
        if own.confinement.as_ref().is_ok_and(|own| !own.no_new_privs) && Path::new("/usr/bin/setpriv").exists() {
            let mut child = std::process::Command::new("/usr/bin/setpriv")
                .args(["--no-new-privs", "sleep", "30"])
                .stdin(std::process::Stdio::null())
                .spawn()?;
            let proc_dir = PathBuf::from(format!("/proc/{}", child.id()));
            let mut seen = None;
            for _ in 0..100 {
                // setpriv sets it, then becomes sleep.
                match Confinement::of(&proc_dir) {
                    Ok(peer) if peer.no_new_privs => {
                        seen = Some(peer);
                        break;
                    }
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
            let _ = child.kill();
            let _ = child.wait();
            let peer =
                seen.ok_or_else(|| std::io::Error::other("setpriv --no-new-privs never showed NoNewPrivs: 1"))?;
            let own = own.confinement.map_err(std::io::Error::other)?;
            assert!(peer.confined_beyond(&own).is_some_and(|reason| reason.contains("no_new_privs")));
        }
        Ok(())
    }

    #[test]
    fn a_socket_path_too_long_for_a_unix_socket_moves_to_the_runtime_directory() {
        let short = socket_path(Path::new("/home/u/.goondan/workspaces/demo"));
        assert_eq!(short, Path::new("/home/u/.goondan/workspaces/demo/service.sock"));
        let deep = PathBuf::from(format!("/home/u/{}/workspaces/demo", "d".repeat(120)));
        let moved = socket_path(&deep);
        assert!(moved.as_os_str().len() <= MAX_SOCKET_PATH + 40, "{}", moved.display());
        assert_eq!(moved, socket_path(&deep), "the same workspace gets the same path");
        assert_ne!(moved, socket_path(Path::new(&format!("{}x", deep.display()))));
    }
}
