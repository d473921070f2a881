//! [`ScriptHost`]: one supervised JavaScript process that runs Tool modules.
//!
//! Nothing starts until the first call. A start writes the host script (it
//! ships in the binary) into a private temporary directory, runs
//! `bun --no-env-file --no-install <script>` / `node [flags] <script>`
//! there (its current directory, so that no `bunfig.toml`, `.env` or
//! `package.json` of a directory the model can write is read at start) and
//! waits for the host to say `ready`. Frames go over a connected socket
//! pair, the host's end inherited as a file descriptor ([`FD_ENV`] names
//! its number): no socket file exists, nothing else can connect, and the
//! host needs no right to make a socket (the sandbox's Landlock-only layout
//! refuses that). Never stdout: user code may print anything, and its
//! stdout and stderr go to `tracing` (target `goondan::script`).
//!
//! The private directory is `goondan-js-<pid>-<random>` in the temporary
//! directory, mode 0700 whatever the umask, and removed when the
//! [`ScriptHost`] is dropped; one left behind by a process that was
//! SIGKILLed (its pid no longer runs) is swept by the next start of any
//! host of the same user.
//!
//! Every host process is waited for: a thread of its own waits for its
//! exit and reaps it at once, whatever the async runtime is doing (even
//! shutting down), and dropping the host kills the process and waits for
//! that reap — so no exited host stays a zombie, and none is left for the
//! parent of an exiting agent process to collect. Killing goes through the
//! same lock as the reap, so a kill never reaches a pid reused after it.
//!
//! Three tasks serve one host process: a writer (so that a dropped call can
//! never leave half a frame on the channel), a reader (routes results by id
//! to the waiting calls) and a supervisor (owns the child; when it exits,
//! is killed or closes its channel, every call still waiting gets an error
//! result that says what happened). The next call starts a new host, after
//! a backoff when hosts keep dying.
//!
//! A call whose future is dropped (the executor's deadline) sends `cancel`.
//! A host that does not acknowledge within [`CANCEL_GRACE`] has a blocked
//! event loop (`while (true) {}`) and is killed, so later calls do not queue
//! behind it; calls made meanwhile wait for that verdict first.

use goondan_core::sync::LockUnpoisoned;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use goondan_core::codes::{E_SCRIPT_HOST_EXITED, E_SCRIPT_HOST_START, E_SCRIPT_RUNTIME_MISSING};
use goondan_core::{JsonObject, JsonValue};
use goondan_tools::{BoxFuture, HandlerResult, ToolContext, ToolFailure, ToolOutput};
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWriteExt as _, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::process::ChildStdin;
use tokio::sync::{OnceCell, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::protocol::{ErrorBody, FromHost, MiddlewareDecl, ToHost};
use crate::runtime::{DiscoverError, JsRuntime};
use crate::tasks::{HostTasks, TaskRequest};

/// The host script, compiled into the binary.
const HOST_SCRIPT: &str = include_str!("host/host.mjs");
/// The channel both hosts import (`./transport.mjs`), compiled into the binary.
const TRANSPORT_SCRIPT: &str = include_str!("host/transport.mjs");
/// The transport's file name next to a host's script.
pub(crate) const TRANSPORT_NAME: &str = "transport.mjs";
/// The environment variable that gives the host the number of its file
/// descriptor of the channel to gdn.
pub const FD_ENV: &str = "GOONDAN_SCRIPT_FD";
/// How long a starting host has to say `ready`.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a host has to acknowledge a `cancel` before it is killed.
pub const CANCEL_GRACE: Duration = Duration::from_secs(1);
/// How long a host that closed its channel has to exit by itself.
const EXIT_GRACE: Duration = Duration::from_secs(1);
/// Deaths closer together than this count as one crash loop.
const FAILURE_WINDOW: Duration = Duration::from_secs(10);
/// Deaths in a row (within the window) before starts are delayed.
const FAILURES_BEFORE_BACKOFF: u32 = 3;
const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Reads an environment variable; [`ScriptHost::new`] takes one so that
/// tests and embedders control discovery.
pub type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The JavaScript host of one agent process, shared by its script tools
/// and extensions.
pub struct ScriptHost {
    env: EnvLookup,
    runtime: OnceCell<Result<Arc<JsRuntime>, DiscoverError>>,
    state: tokio::sync::Mutex<State>,
    failures: Arc<Mutex<Failures>>,
    next_id: AtomicU64,
    /// The extensions every host process loads first, once loaded
    /// ([`load_extensions`](Self::load_extensions), once per host). Not a
    /// constructor argument: the host exists before the agent's plugin
    /// knows its extensions (its script tools hold it), and the plan's
    /// services point back at the host.
    extensions: std::sync::OnceLock<Arc<ExtensionPlan>>,
    /// The agent's sandbox, which the host process runs in (so a script
    /// tool, and what it spawns, is confined like `bash`), and the paths it
    /// may read besides: the bundle's directories.
    sandbox: Option<(Arc<goondan_sandbox::Sandbox>, Vec<PathBuf>)>,
    /// That sandbox widened to the runtime and the host's own directory,
    /// made at the first start.
    host_sandbox: std::sync::OnceLock<Arc<goondan_sandbox::Sandbox>>,
    /// Every task of its host processes (their readers, writers, output
    /// forwarders, supervisors, and the answers to their requests).
    tasks: TaskTracker,
    /// Cancelled by [`shutdown`](ScriptHost::shutdown): the writers stop
    /// (a host exits when its channel closes) and requests in flight end.
    cancel: CancellationToken,
}

/// An extension module a host loads at start.
#[derive(Debug, Clone)]
pub struct ExtensionLoad {
    /// The Extension resource's name.
    pub name: String,
    /// The module (absolute).
    pub module: Arc<Path>,
    /// What `register(api, config)` receives.
    pub config: JsonObject,
}

/// What an extension's `register` registered.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedExtension {
    /// The extension.
    pub name: String,
    /// Its middleware layers, in registration order.
    pub middleware: Vec<MiddlewareDecl>,
    /// Its tools' catalog items (JSON), in registration order.
    pub tools: Vec<JsonValue>,
}

/// What the host asks of the Rust side on behalf of extensions.
pub trait HostServices: Send + Sync {
    /// `api.state.get()`: the extension's state, or `null`.
    fn state_get(&self, extension: String) -> BoxFuture<'static, Result<JsonValue, String>>;
    /// `api.state.set(value)`, durable when the future resolves.
    fn state_set(&self, extension: String, value: JsonValue) -> BoxFuture<'static, Result<(), String>>;
    /// `api.tools.register` after `register()` returned.
    fn register_tool(&self, extension: &str, item: JsonValue);
    /// `ctx.agents.request` / `ctx.agents.send` of a layer in the turn
    /// `turn_id` (trace `trace_id`): the output, or why there is none.
    fn agents(
        &self,
        method: String,
        params: JsonValue,
        turn_id: String,
        trace_id: String,
    ) -> BoxFuture<'static, Result<JsonValue, String>>;
}

struct ExtensionPlan {
    loads: Vec<ExtensionLoad>,
    services: Arc<dyn HostServices>,
    /// What the first host registered; later hosts are compared with it.
    first: Mutex<Option<Vec<LoadedExtension>>>,
}

impl std::fmt::Debug for ScriptHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptHost").field("runtime", &self.runtime.get()).finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    /// The private directory (0700) holding the script; the hosts' current
    /// directory.
    dir: Option<tempfile::TempDir>,
    current: Option<Arc<Connection>>,
}

/// Recent deaths, for the backoff.
#[derive(Debug, Default)]
struct Failures {
    in_a_row: u32,
    last: Option<Instant>,
}

impl Failures {
    fn record(&mut self) {
        let now = Instant::now();
        let recent = self.last.is_some_and(|last| now.duration_since(last) < FAILURE_WINDOW);
        self.in_a_row = if recent { self.in_a_row.saturating_add(1) } else { 1 };
        self.last = Some(now);
    }

    /// When the next start may happen.
    fn next_start(&self) -> Option<Instant> {
        if self.in_a_row < FAILURES_BEFORE_BACKOFF {
            return None;
        }
        self.last.map(|last| last + backoff(self.in_a_row - FAILURES_BEFORE_BACKOFF))
    }
}

/// The wait after `doublings` more deaths than [`FAILURES_BEFORE_BACKOFF`]:
/// `backon`'s exponential backoff from [`BACKOFF_START`] with jitter of up to
/// as much again, at most [`BACKOFF_MAX`].
fn backoff(doublings: u32) -> Duration {
    use backon::BackoffBuilder as _;
    // Past 2⁹ doublings of 100 ms the wait is at the cap anyway.
    let doublings = usize::try_from(doublings.min(9)).unwrap_or(9);
    backon::ExponentialBuilder::new()
        .with_jitter()
        .with_factor(2.0)
        .with_min_delay(BACKOFF_START)
        .with_max_delay(BACKOFF_MAX)
        .without_max_times()
        .build()
        .nth(doublings)
        .unwrap_or(BACKOFF_MAX)
        .min(BACKOFF_MAX)
}

/// How a [`ScriptHost`] is made: where its runtime comes from, and the
/// sandbox its processes run in. Creating the host costs nothing; it
/// starts at the first call.
#[must_use]
pub struct ScriptHostBuilder {
    env: EnvLookup,
    runtime: Option<JsRuntime>,
    sandbox: Option<(Arc<goondan_sandbox::Sandbox>, Vec<PathBuf>)>,
}

impl ScriptHostBuilder {
    /// A host that discovers its runtime with `env` at the first call.
    pub fn new(env: EnvLookup) -> Self {
        Self { env, runtime: None, sandbox: None }
    }

    /// Uses `runtime` instead of discovering one.
    pub fn runtime(self, runtime: JsRuntime) -> Self {
        Self { runtime: Some(runtime), ..self }
    }

    /// Runs the host processes in `sandbox`, also allowed to read
    /// `readable` (the directories of the bundle's modules).
    pub fn sandbox(self, sandbox: Arc<goondan_sandbox::Sandbox>, readable: Vec<PathBuf>) -> Self {
        Self { sandbox: Some((sandbox, readable)), ..self }
    }

    /// The host.
    pub fn build(self) -> Arc<ScriptHost> {
        let Self { env, runtime, sandbox } = self;
        let discovered = OnceCell::new();
        if let Some(runtime) = runtime {
            // A fresh cell is empty, so this cannot fail.
            let _already = discovered.set(Ok(Arc::new(runtime)));
        }
        Arc::new(ScriptHost {
            env,
            runtime: discovered,
            state: tokio::sync::Mutex::new(State::default()),
            failures: Arc::new(Mutex::new(Failures::default())),
            next_id: AtomicU64::new(1),
            extensions: std::sync::OnceLock::new(),
            sandbox,
            host_sandbox: std::sync::OnceLock::new(),
            tasks: TaskTracker::new(),
            cancel: CancellationToken::new(),
        })
    }
}

impl ScriptHost {
    /// A host that discovers its runtime (with `env`) at the first call and
    /// starts then. Creating one costs nothing.
    pub fn new(env: EnvLookup) -> Arc<Self> {
        ScriptHostBuilder::new(env).build()
    }

    /// Makes every host process load `loads` (in order) before anything
    /// else, and starts one now; returns what each `register` registered.
    /// A module that does not load or has no `register` is an `E_EXT_LOAD`
    /// failure, a `register` that throws `E_EXT_INIT`; the message names
    /// the extension. A host started later (after a crash) loads them
    /// again; if it then registers something else, that is logged. A host
    /// loads one set of extensions: a second call is refused.
    pub async fn load_extensions(
        &self,
        loads: Vec<ExtensionLoad>,
        services: Arc<dyn HostServices>,
    ) -> Result<Vec<LoadedExtension>, ToolFailure> {
        let Some(module) = loads.first().map(|load| Arc::clone(&load.module)) else {
            return Ok(Vec::new());
        };
        let plan = Arc::new(ExtensionPlan { loads, services, first: Mutex::new(None) });
        if self.extensions.set(Arc::clone(&plan)).is_err() {
            return Err(ToolFailure::new("this script host loads its extensions already (a host loads one set)"));
        }
        // A host already running has not loaded them: replace it.
        if let Some(current) = self.state.lock().await.current.take() {
            let _ = current.kill.send("replaced by a host that loads the extensions");
        }
        self.connection(&module).await?;
        let loaded = plan.first.lock_unpoisoned().clone();
        loaded.ok_or_else(|| ToolFailure::new("the script host started without loading the extensions"))
    }

    /// Starts the JavaScript layer `index` of `extension` in `pipeline` on
    /// `ctx`; the session carries its `next()` calls and its end.
    pub async fn middleware(
        &self,
        pipeline: &str,
        extension: &str,
        index: u32,
        ctx: JsonValue,
    ) -> Result<MiddlewareSession, ToolFailure> {
        let module = self.extension_module(extension);
        let mut ctx = Some(ctx);
        for _attempt in 0..2 {
            let connection = self.connection(&module).await?;
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            // Unbounded: the reader sends under the calls' lock and must not
            // wait on one session; the protocol has one `next` in flight each.
            let (tx, rx) = mpsc::unbounded_channel();
            if !connection.shared.insert(id, Reply::Session(tx), "", None) {
                continue;
            }
            let frame = ToHost::Middleware { id, pipeline, extension, index, ctx: ctx.take().unwrap_or_default() };
            match serde_json::to_vec(&frame) {
                Ok(line) => connection.send(line),
                Err(e) => {
                    connection.shared.take(id);
                    return Err(ToolFailure::new(format!("cannot encode the middleware context: {e}")));
                }
            }
            let guard = CancelOnDrop { connection: Some(Arc::clone(&connection)), id };
            return Ok(MiddlewareSession { connection, id, events: rx, guard });
        }
        Err(host_exited("the script host exited twice while the middleware was being started".to_owned()))
    }

    /// Runs the tool `tool` that an extension registered.
    pub async fn call_extension_tool(
        &self,
        extension: &str,
        tool: &str,
        input: &JsonObject,
        ctx: &JsonValue,
        tool_ctx: &ToolContext,
    ) -> HandlerResult {
        let module = self.extension_module(extension);
        let frame = |id| ToHost::ExtensionCall { id, tool, input, ctx };
        self.request(&module, tool_ctx.tool_call_id(), Some(tool_ctx), frame).await.map(ToolOutput::from_json)
    }

    /// The module of `extension`, for messages.
    fn extension_module(&self, extension: &str) -> Arc<Path> {
        self.extensions
            .get()
            .and_then(|plan| plan.loads.iter().find(|load| load.name == extension).map(|load| Arc::clone(&load.module)))
            .unwrap_or_else(|| Arc::from(Path::new(extension)))
    }

    /// The host's sandbox: the agent's, widened to the runtime's directory,
    /// the bundle's and `dir` (the host script; its current directory).
    fn host_sandbox(&self, runtime: &JsRuntime, dir: &Path) -> Option<Arc<goondan_sandbox::Sandbox>> {
        let (agent, readable) = self.sandbox.as_ref()?;
        if !agent.policy().confines() {
            return None;
        }
        Some(Arc::clone(self.host_sandbox.get_or_init(|| {
            let binary = std::fs::canonicalize(&runtime.path).unwrap_or_else(|_| runtime.path.clone());
            let mut paths = readable.clone();
            paths.extend(binary.parent().map(Path::to_path_buf));
            paths.push(dir.to_path_buf());
            Arc::new(agent.widened(paths))
        })))
    }

    /// Stops the running host process (its channel closed, then killed
    /// if it lingers) and waits until every task of every host process it
    /// ran has ended. Dropping the last handle instead lets them wind down
    /// unwaited.
    pub async fn shutdown(&self) {
        if let Some(current) = self.state.lock().await.current.take() {
            let _ = current.kill.send(SHUTTING_DOWN);
        }
        self.cancel.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// A host that reads the process environment.
    pub fn from_process_env() -> Arc<Self> {
        Self::new(Arc::new(|name: &str| std::env::var(name).ok()))
    }

    /// A host that uses `runtime` instead of discovering one.
    pub fn with_runtime(runtime: JsRuntime) -> Arc<Self> {
        ScriptHostBuilder::new(Arc::new(|_: &str| None)).runtime(runtime).build()
    }

    /// The runtime, discovered once (off the async threads: it runs
    /// `--version`). `gdn validate` can call this to warn early.
    pub async fn runtime(&self) -> Result<Arc<JsRuntime>, DiscoverError> {
        self.runtime
            .get_or_init(|| async {
                let env = Arc::clone(&self.env);
                tokio::task::spawn_blocking(move || JsRuntime::discover(&*env))
                    .await
                    .unwrap_or_else(|e| Err(DiscoverError { tried: vec![format!("discovery failed: {e}")] }))
                    .map(Arc::new)
            })
            .await
            .clone()
    }

    /// The pid of the running host, if one runs.
    pub async fn running_pid(&self) -> Option<u32> {
        let state = self.state.lock().await;
        state.current.as_ref().filter(|c| c.shared.is_open()).map(|c| c.shared.pid)
    }

    /// The private directory of the hosts (their script and current
    /// directory), once a host has started.
    pub async fn directory(&self) -> Option<std::path::PathBuf> {
        self.state.lock().await.dir.as_ref().map(|dir| dir.path().to_path_buf())
    }

    /// Runs `handlers[export](ctx, input)` of `module` in the host.
    /// `ctx` is the JSON part of the JavaScript ToolContext; `tool_ctx` is
    /// the call's own (its id tags the call's log lines, its runtime answers
    /// `ctx.runtime`).
    pub async fn call(
        &self,
        module: &Path,
        export: &str,
        input: &JsonObject,
        ctx: &JsonValue,
        tool_ctx: &ToolContext,
    ) -> HandlerResult {
        let module_str = module.to_string_lossy();
        let frame = |id| ToHost::Call { id, module: &module_str, export, input, ctx };
        self.request(module, tool_ctx.tool_call_id(), Some(tool_ctx), frame)
            .await
            .map(ToolOutput::from_json)
            .map_err(|failure| self.name_refusal(failure))
    }

    /// A tool's error that its sandbox caused (`EACCES: permission denied,
    /// open '/x'`) says so, with the policy's name, so that the model does
    /// not retry it or blame the tool.
    fn name_refusal(&self, failure: ToolFailure) -> ToolFailure {
        let Some(sandbox) = self.host_sandbox.get() else { return failure };
        let Some(refusal) = sandbox.refusal_in(&failure.message) else { return failure };
        let what = match (refusal.paths.first(), refusal.network) {
            (Some(path), _) => format!("access to {path}"),
            (None, true) => "the network".to_owned(),
            (None, false) => "the operation".to_owned(),
        };
        let hint = format!(
            "The script tool runs in the '{}' sandbox, which refused {what}: retrying will not help. Only the user \
             can widen the sandbox, in goondan.yaml (spec.sandbox).",
            sandbox.policy()
        );
        match &failure.suggestion {
            Some(own) => {
                let suggestion = format!("{hint} {own}");
                failure.suggest(suggestion)
            }
            None => failure.suggest(hint),
        }
    }

    /// The names of the handlers `module` offers, found as for a call
    /// (`handlers`, or a default export's `handlers`). A module that does
    /// not load (a syntax error, a missing file) is an `E_SCRIPT_MODULE`
    /// failure naming it; no runtime is `E_SCRIPT_RUNTIME_MISSING`.
    pub async fn inspect(&self, module: &Path) -> Result<Vec<String>, ToolFailure> {
        self.inspect_as(module, "tool").await
    }

    /// Whether the Extension module `module` loads and exports `register`
    /// (as a named export or on its default export); a module that does not
    /// load is an `E_SCRIPT_MODULE` failure naming it. Runs nothing of it
    /// but its top level.
    pub async fn inspect_extension(&self, module: &Path) -> Result<bool, ToolFailure> {
        Ok(self.inspect_as(module, "extension").await?.iter().any(|name| name == "register"))
    }

    async fn inspect_as(&self, module: &Path, kind: &str) -> Result<Vec<String>, ToolFailure> {
        let module_str = module.to_string_lossy();
        let frame = |id| ToHost::Inspect { id, module: &module_str, kind };
        let names = self.request(module, "", None, frame).await?;
        serde_json::from_value(names)
            .map_err(|e| ToolFailure::new(format!("the script host listed the exports of {module_str} oddly: {e}")))
    }

    /// Sends the frame `frame(id)` and waits for the answer with that id.
    async fn request<'f>(
        &self,
        module: &Path,
        tool_call_id: &str,
        tool: Option<&ToolContext>,
        frame: impl Fn(u64) -> ToHost<'f>,
    ) -> Result<JsonValue, ToolFailure> {
        // A host may die between handing out its connection and taking the
        // request; one retry on a fresh host covers that race.
        for _attempt in 0..2 {
            let connection = self.connection(module).await?;
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            if !connection.shared.insert(id, Reply::Once(tx), tool_call_id, tool.cloned()) {
                continue;
            }
            let mut guard = CancelOnDrop { connection: Some(Arc::clone(&connection)), id };
            match serde_json::to_vec(&frame(id)) {
                Ok(line) => connection.send(line),
                Err(e) => {
                    guard.disarm();
                    connection.shared.take(id);
                    return Err(ToolFailure::new(format!("cannot encode the request for the script host: {e}")));
                }
            }
            let outcome = rx.await;
            guard.disarm();
            return match outcome {
                Ok(result) => result,
                Err(_closed) => Err(host_exited("the script host dropped the call".to_owned())),
            };
        }
        Err(host_exited("the script host exited twice while the call was being sent".to_owned()))
    }

    /// The live connection, starting a host when there is none.
    async fn connection(&self, module: &Path) -> Result<Arc<Connection>, ToolFailure> {
        let runtime = self.runtime().await.map_err(|error| runtime_missing(module, &error))?;
        let mut state = self.state.lock().await;
        if let Some(current) = state.current.clone() {
            // A cancel that is not yet acknowledged may mean a blocked host,
            // about to be killed: wait for the verdict rather than queue
            // behind it.
            current.shared.settle_cancels().await;
            if current.shared.is_open() {
                return Ok(current);
            }
            state.current = None;
        }
        let next_start = self.failures.lock_unpoisoned().next_start();
        if let Some(at) = next_start {
            tracing::warn!(target: "goondan::script", "script host keeps dying; waiting {:?} before restarting it", at.saturating_duration_since(Instant::now()));
            tokio::time::sleep_until(at.into()).await;
        }
        match self.start(&runtime, &mut state).await {
            Ok(connection) => {
                state.current = Some(Arc::clone(&connection));
                Ok(connection)
            }
            Err(failure) => {
                self.failures.lock_unpoisoned().record();
                Err(failure)
            }
        }
    }

    async fn start(&self, runtime: &JsRuntime, state: &mut State) -> Result<Arc<Connection>, ToolFailure> {
        let start_failed = |what: String| {
            ToolFailure::with_code(
                format!("cannot start the script host ({} {}): {what}", runtime.kind, runtime.version),
                E_SCRIPT_HOST_START,
            )
            .named("ScriptHostError")
        };
        if state.dir.is_none() {
            let dir = private_dir().map_err(|e| start_failed(format!("cannot create a private directory: {e}")))?;
            write_host_script(dir.path(), "host.mjs", HOST_SCRIPT)
                .map_err(|e| start_failed(format!("cannot write the host script: {e}")))?;
            state.dir = Some(dir);
        }
        let Some(dir) = state.dir.as_ref().map(|d| d.path().to_path_buf()) else {
            return Err(start_failed("no private directory".to_owned()));
        };
        let mut command = host_command(runtime, &dir, "host.mjs");
        // Before the sandbox's hooks: the descriptor must be passed on
        // whatever they do.
        let channel =
            Channel::attach(&mut command, FD_ENV).map_err(|e| start_failed(format!("cannot make its channel: {e}")))?;
        if let Some(sandbox) = self.host_sandbox(runtime, &dir) {
            sandbox.confine(&mut command).map_err(|error| {
                ToolFailure::with_code(error.to_string(), goondan_core::codes::E_SANDBOX_UNAVAILABLE)
                    .named("SandboxError")
                    .suggest("Tell the user the script tools cannot run here; do not retry.")
            })?;
        }
        let (mut child, pipes) = HostProcess::spawn(command)
            .map_err(|e| start_failed(format!("cannot run {}: {e}", runtime.path.display())))?;
        let stream = channel.spawned();
        let pid = child.pid;
        let label = format!("{} {}, pid {pid}", runtime.kind, runtime.version);
        self.tasks.spawn(forward_lines(pipes.stdout, pid, false));
        self.tasks.spawn(forward_lines(pipes.stderr, pid, true));
        let stdin = Some(pipes.stdin);

        let (read_half, write_half) = stream.into_split();
        let mut reader = BufReader::new(read_half);
        let mut first = String::new();
        let exited = |status: std::io::Result<ExitStatus>| match status {
            Ok(status) => {
                format!("it {} before saying ready (pid {pid}; see its stderr with -v)", describe_status(status))
            }
            Err(e) => format!("waiting for it failed: {e}"),
        };
        let said = tokio::select! {
            read = tokio::time::timeout(START_TIMEOUT, reader.read_line(&mut first)) => read,
            status = child.wait() => return Err(start_failed(exited(status))),
        };
        match said {
            Ok(Ok(n)) if n > 0 => {}
            Ok(Ok(_)) => {
                // Its end closed: it is exiting; say how.
                let why = match tokio::time::timeout(EXIT_GRACE, child.wait()).await {
                    Ok(status) => exited(status),
                    Err(_) => format!("it closed its channel before saying ready (pid {pid})"),
                };
                return Err(start_failed(why));
            }
            Ok(Err(e)) => return Err(start_failed(format!("reading its first frame failed: {e}"))),
            Err(_) => return Err(start_failed(format!("it did not say ready within {START_TIMEOUT:?} (pid {pid})"))),
        }
        match serde_json::from_str::<FromHost>(first.trim_end()) {
            Ok(FromHost::Ready { runtime: name, version }) => {
                tracing::debug!(target: "goondan::script", pid, "script host ready ({name} {version})");
            }
            _ => return Err(start_failed(format!("its first frame was not `ready`: {}", first.trim_end()))),
        }

        let (cancels, _) = watch::channel(0_usize);
        let shared = Arc::new(Shared {
            calls: Mutex::new(Calls { open: true, ..Calls::default() }),
            cancels,
            failures: Arc::clone(&self.failures),
            pid,
            label,
            tasks: Arc::default(),
        });
        // Unbounded: frames are sent from synchronous code (a call, a
        // cancel, a drop); each is a request whose caller waits for its
        // answer, or the answer to one of the host's own requests.
        let (frames, frames_rx) = mpsc::unbounded_channel();
        let (kill, kill_rx) = mpsc::unbounded_channel();
        let (reader_done, reader_done_rx) = oneshot::channel();
        self.tasks.spawn(self.cancel.clone().run_until_cancelled_owned(write_frames(write_half, frames_rx)));
        let plan = self.extensions.get().cloned();
        // Weak: the channel closes when the last caller's handle is gone,
        // whatever the reader holds.
        let answers = Answers {
            frames: frames.downgrade(),
            services: plan.as_ref().map(|p| Arc::clone(&p.services)),
            tasks: self.tasks.clone(),
            cancel: self.cancel.clone(),
        };
        self.tasks.spawn(read_frames(reader, Arc::clone(&shared), reader_done, answers));
        self.tasks.spawn(supervise(child, stdin, Arc::clone(&shared), kill_rx, reader_done_rx));
        let connection = Arc::new(Connection { shared, frames, kill });
        if let Some(plan) = plan
            && let Err(failure) = self.load_all(&connection, &plan).await
        {
            let _ = connection.kill.send("its extensions did not load");
            return Err(failure);
        }
        Ok(connection)
    }

    /// Loads the plan's extensions on a new host, in order.
    async fn load_all(&self, connection: &Arc<Connection>, plan: &ExtensionPlan) -> Result<(), ToolFailure> {
        let mut loaded = Vec::with_capacity(plan.loads.len());
        for load in &plan.loads {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            if !connection.shared.insert(id, Reply::Once(tx), "", None) {
                return Err(host_exited("the script host exited while loading the extensions".to_owned()));
            }
            let module = load.module.to_string_lossy();
            let frame = ToHost::LoadExtension { id, name: &load.name, module: &module, config: &load.config };
            match serde_json::to_vec(&frame) {
                Ok(line) => connection.send(line),
                Err(e) => return Err(ToolFailure::new(format!("cannot encode the extension's config: {e}"))),
            }
            let answer = match tokio::time::timeout(START_TIMEOUT, rx).await {
                Ok(Ok(answer)) => answer?,
                Ok(Err(_)) => return Err(host_exited("the script host dropped the extension load".to_owned())),
                Err(_) => {
                    return Err(ToolFailure::with_code(
                        format!("extension '{}': register() did not finish within {START_TIMEOUT:?}", load.name),
                        "E_EXT_INIT",
                    ));
                }
            };
            let (middleware, tools) =
                serde_json::from_value::<(Vec<MiddlewareDecl>, Vec<JsonValue>)>(answer).map_err(|e| {
                    ToolFailure::new(format!("the script host reported extension '{}' oddly: {e}", load.name))
                })?;
            loaded.push(LoadedExtension { name: load.name.clone(), middleware, tools });
        }
        let mut first = plan.first.lock_unpoisoned();
        match first.as_ref() {
            None => *first = Some(loaded),
            Some(before) if *before != loaded => tracing::warn!(
                target: "goondan::script",
                "the restarted script host's extensions registered other middleware or tools than at first; the first registration stays in effect"
            ),
            Some(_) => {}
        }
        Ok(())
    }
}

/// One JavaScript middleware layer running in the host.
pub struct MiddlewareSession {
    connection: Arc<Connection>,
    id: u64,
    events: mpsc::UnboundedReceiver<SessionEvent>,
    guard: CancelOnDrop,
}

impl std::fmt::Debug for MiddlewareSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MiddlewareSession").field("id", &self.id).finish_non_exhaustive()
    }
}

/// What a running layer does next.
#[derive(Debug)]
pub enum SessionEvent {
    /// It called `ctx.next()`, having changed the context thus.
    Next(JsonValue),
    /// It returned (or threw, or the host died).
    Done(Result<LayerReturn, ToolFailure>),
}

/// What a layer returned.
#[derive(Debug)]
pub struct LayerReturn {
    /// The value.
    pub result: Option<JsonValue>,
    /// It is what its last `next()` resolved to, unchanged.
    pub unchanged: bool,
    /// What it changed in the context since its last `next()`.
    pub ctx: JsonValue,
}

impl MiddlewareSession {
    /// The layer's next move.
    pub async fn recv(&mut self) -> SessionEvent {
        match self.events.recv().await {
            Some(event) => {
                if matches!(event, SessionEvent::Done(_)) {
                    self.guard.disarm();
                }
                event
            }
            None => {
                self.guard.disarm();
                SessionEvent::Done(Err(host_exited("the script host dropped the middleware".to_owned())))
            }
        }
    }

    /// Answers the layer's `next()`.
    pub fn reply_next(&self, result: JsonValue, ctx: JsonValue) {
        match serde_json::to_vec(&ToHost::NextResult { id: self.id, result, ctx }) {
            Ok(line) => self.connection.send(line),
            Err(e) => tracing::error!(target: "goondan::script", "cannot encode a middleware result: {e}"),
        }
    }
}

/// One running host process, as the callers see it. Dropping the last
/// handle closes the channel and kills the process.
struct Connection {
    shared: Arc<Shared>,
    frames: mpsc::UnboundedSender<Vec<u8>>,
    kill: mpsc::UnboundedSender<&'static str>,
}

impl Connection {
    fn send(&self, mut line: Vec<u8>) {
        line.push(b'\n');
        // A closed channel means the host is gone; the supervisor answers
        // the waiting call.
        let _ = self.frames.send(line);
    }
}

/// What the tasks of one host share.
struct Shared {
    calls: Mutex<Calls>,
    /// Cancels sent and not yet acknowledged.
    cancels: watch::Sender<usize>,
    failures: Arc<Mutex<Failures>>,
    pid: u32,
    label: String,
    /// The tasks its tools started or returned (`ctx.tasks`).
    tasks: Arc<HostTasks>,
}

#[derive(Default)]
struct Calls {
    /// False once the host is gone: no call may wait on it any more.
    open: bool,
    pending: HashMap<u64, Pending>,
    cancel_acks: HashMap<u64, oneshot::Sender<()>>,
}

struct Pending {
    reply: Reply,
    tool_call_id: Arc<str>,
    /// The context of a tool call, for its `ctx.runtime`.
    tool: Option<ToolContext>,
}

/// Where the answer to a request goes.
enum Reply {
    /// One answer.
    Once(oneshot::Sender<Result<JsonValue, ToolFailure>>),
    /// A middleware conversation: any number of `next`, then `done`.
    Session(mpsc::UnboundedSender<SessionEvent>),
}

impl Reply {
    fn finish(self, result: Result<JsonValue, ToolFailure>) {
        match self {
            Self::Once(tx) => {
                let _ = tx.send(result);
            }
            Self::Session(tx) => {
                let done =
                    result.map(|result| LayerReturn { result: Some(result), unchanged: false, ctx: JsonValue::Null });
                let _ = tx.send(SessionEvent::Done(done));
            }
        }
    }
}

impl Shared {
    fn is_open(&self) -> bool {
        self.calls.lock_unpoisoned().open
    }

    fn insert(&self, id: u64, reply: Reply, tool_call_id: &str, tool: Option<ToolContext>) -> bool {
        let mut calls = self.calls.lock_unpoisoned();
        if !calls.open {
            return false;
        }
        calls.pending.insert(id, Pending { reply, tool_call_id: Arc::from(tool_call_id), tool });
        true
    }

    fn take(&self, id: u64) -> Option<Pending> {
        self.calls.lock_unpoisoned().pending.remove(&id)
    }

    /// Waits until no cancel is unacknowledged or the host is gone.
    async fn settle_cancels(&self) {
        let mut outstanding = self.cancels.subscribe();
        // Bounded: the watchdog of each cancel resolves it within the grace.
        let _ = tokio::time::timeout(CANCEL_GRACE * 2, outstanding.wait_for(|n| *n == 0)).await;
    }

    /// The host is gone: every waiting call gets `message`.
    fn close(&self, message: &str) {
        let (pending, acks) = {
            let mut calls = self.calls.lock_unpoisoned();
            calls.open = false;
            (std::mem::take(&mut calls.pending), std::mem::take(&mut calls.cancel_acks))
        };
        drop(acks);
        self.cancels.send_replace(0);
        for (_, call) in pending {
            call.reply.finish(Err(host_exited(message.to_owned())));
        }
    }
}

/// Sends `cancel` when a call's future is dropped before its result came.
struct CancelOnDrop {
    connection: Option<Arc<Connection>>,
    id: u64,
}

impl CancelOnDrop {
    fn disarm(&mut self) {
        self.connection = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(connection) = self.connection.take() else { return };
        if connection.shared.take(self.id).is_none() {
            return; // The result came (or the host died) meanwhile.
        }
        let (ack, acked) = oneshot::channel();
        {
            let mut calls = connection.shared.calls.lock_unpoisoned();
            if !calls.open {
                return;
            }
            calls.cancel_acks.insert(self.id, ack);
        }
        connection.shared.cancels.send_modify(|n| *n += 1);
        if let Ok(line) = serde_json::to_vec(&ToHost::Cancel { id: self.id }) {
            connection.send(line);
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            connection.shared.cancels.send_modify(|n| *n = n.saturating_sub(1));
            return;
        };
        let id = self.id;
        // Fire and forget: a drop cannot wait; it ends within CANCEL_GRACE.
        runtime.spawn(async move {
            let answered = tokio::time::timeout(CANCEL_GRACE, acked).await;
            connection.shared.calls.lock_unpoisoned().cancel_acks.remove(&id);
            if answered.is_err() && connection.shared.is_open() {
                tracing::warn!(target: "goondan::script", pid = connection.shared.pid, "script host did not acknowledge the cancel of call {id} within {CANCEL_GRACE:?}; killing it");
                let _ = connection.kill.send("a cancelled call did not stop: its event loop was blocked");
                // The count stays up until the supervisor closes the
                // connection, so no new call is handed to the dying host.
                return;
            }
            connection.shared.cancels.send_modify(|n| *n = n.saturating_sub(1));
        });
    }
}

/// What the reader needs to answer the host's own requests.
struct Answers {
    frames: mpsc::WeakUnboundedSender<Vec<u8>>,
    services: Option<Arc<dyn HostServices>>,
    /// Where the answers to the host's requests run, and what ends them.
    tasks: TaskTracker,
    cancel: CancellationToken,
}

async fn write_frames(mut channel: OwnedWriteHalf, mut frames: mpsc::UnboundedReceiver<Vec<u8>>) {
    while let Some(line) = frames.recv().await {
        if channel.write_all(&line).await.is_err() {
            break;
        }
    }
    // Dropping the write half shuts the channel down; the host exits on that.
}

/// Queues `frame` for the host, one line, unless the host is gone (then
/// nobody waits for it).
pub(crate) fn send_frame(frames: &mpsc::WeakUnboundedSender<Vec<u8>>, frame: &ToHost<'_>) {
    if let (Ok(mut line), Some(frames)) = (serde_json::to_vec(frame), frames.upgrade()) {
        line.push(b'\n');
        let _ = frames.send(line);
    }
}

/// Runs the answer to one of the host's requests on the host's tracker,
/// ended by its token.
fn spawn_answer(tasks: &TaskTracker, cancel: &CancellationToken, answer: impl Future<Output = ()> + Send + 'static) {
    tasks.spawn(cancel.clone().run_until_cancelled_owned(answer));
}

async fn read_frames<R: AsyncRead + Unpin>(
    reader: BufReader<R>,
    shared: Arc<Shared>,
    done: oneshot::Sender<()>,
    answers: Answers,
) {
    let Answers { frames, services, tasks: tracker, cancel } = answers;
    let mut lines = reader.lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let frame = match serde_json::from_str::<FromHost>(&line) {
            Ok(frame) => frame,
            Err(e) => {
                tracing::warn!(target: "goondan::script", pid = shared.pid, "unreadable frame from the script host: {e}");
                continue;
            }
        };
        match frame {
            FromHost::Result { id, ok, output, error } => {
                let Some(call) = shared.take(id) else { continue };
                // A bare `__async` result: its handle is the script's to finish later.
                if let (true, Some(tool), Some(output)) = (ok, &call.tool, &output) {
                    shared.tasks.returned_async(tool, output);
                }
                let result = if ok {
                    let mut failures = shared.failures.lock_unpoisoned();
                    if failures.in_a_row != 0 {
                        failures.in_a_row = 0;
                    }
                    Ok(output.unwrap_or(JsonValue::Null))
                } else {
                    Err(thrown(error.unwrap_or_default()))
                };
                call.reply.finish(result);
            }
            FromHost::Exports { id, ok, names, error } => {
                let Some(call) = shared.take(id) else { continue };
                let result = if ok {
                    Ok(JsonValue::Array(names.into_iter().map(JsonValue::String).collect()))
                } else {
                    Err(thrown(error.unwrap_or_default()))
                };
                call.reply.finish(result);
            }
            FromHost::Extension { id, ok, middleware, tools, error } => {
                let Some(call) = shared.take(id) else { continue };
                let result = if ok {
                    serde_json::to_value((middleware, tools)).map_err(|e| ToolFailure::new(e.to_string()))
                } else {
                    Err(thrown(error.unwrap_or_default()))
                };
                call.reply.finish(result);
            }
            FromHost::Next { id, ctx } => {
                let calls = shared.calls.lock_unpoisoned();
                if let Some(Pending { reply: Reply::Session(tx), .. }) = calls.pending.get(&id) {
                    let _ = tx.send(SessionEvent::Next(ctx));
                }
            }
            FromHost::Done { id, ok, result, unchanged, ctx, error } => {
                let Some(call) = shared.take(id) else { continue };
                let done = if ok {
                    Ok(LayerReturn { result, unchanged, ctx })
                } else {
                    Err(thrown(error.unwrap_or_default()))
                };
                match call.reply {
                    Reply::Session(tx) => {
                        let _ = tx.send(SessionEvent::Done(done));
                    }
                    Reply::Once(tx) => {
                        let _ = tx.send(done.map(|d| d.result.unwrap_or_default()));
                    }
                }
            }
            FromHost::State { rid, op, extension, value } => {
                let Some(services) = services.clone() else { continue };
                let frames = frames.clone();
                spawn_answer(&tracker, &cancel, async move {
                    let answer = match op.as_str() {
                        "get" => ToHost::state_result(rid, services.state_get(extension).await.map(Some)),
                        "set" => ToHost::state_result(
                            rid,
                            services.state_set(extension, value.unwrap_or_default()).await.map(|()| None),
                        ),
                        other => ToHost::state_result(rid, Err(format!("unknown state operation '{other}'"))),
                    };
                    send_frame(&frames, &answer);
                });
            }
            FromHost::Agents { rid, method, params, turn_id, trace_id } => {
                let Some(services) = services.clone() else { continue };
                let frames = frames.clone();
                spawn_answer(&tracker, &cancel, async move {
                    let answer =
                        ToHost::state_result(rid, services.agents(method, params, turn_id, trace_id).await.map(Some));
                    send_frame(&frames, &answer);
                });
            }
            FromHost::ToolRuntime { rid, call, method, params } => {
                let tool = shared.calls.lock_unpoisoned().pending.get(&call).and_then(|pending| pending.tool.clone());
                let frames = frames.clone();
                spawn_answer(&tracker, &cancel, async move {
                    let answer =
                        ToHost::state_result(rid, crate::tool::tool_runtime(tool, &method, &params).await.map(Some));
                    send_frame(&frames, &answer);
                });
            }
            FromHost::Task { rid, op, call, handle, ok, output, error } => {
                let tool = call
                    .and_then(|call| shared.calls.lock_unpoisoned().pending.get(&call).and_then(|p| p.tool.clone()));
                let tasks = Arc::clone(&shared.tasks);
                let frames = frames.clone();
                spawn_answer(&tracker, &cancel, async move {
                    let request = TaskRequest { op, handle, ok, output, error };
                    let answer = match tasks.request(tool, request, frames.clone()).await {
                        Ok(value) => ToHost::TaskResult { rid, ok: true, value: Some(value), error: None, code: None },
                        Err(refusal) => ToHost::TaskResult {
                            rid,
                            ok: false,
                            value: None,
                            error: Some(refusal.message),
                            code: refusal.code,
                        },
                    };
                    send_frame(&frames, &answer);
                });
            }
            FromHost::RegisterTool { extension, item } => {
                if let Some(services) = &services {
                    services.register_tool(&extension, item);
                }
            }
            FromHost::Cancelled { id } => {
                if let Some(ack) = shared.calls.lock_unpoisoned().cancel_acks.remove(&id) {
                    let _ = ack.send(());
                }
            }
            FromHost::Log { level, message, id } => {
                let call = id.and_then(|id| {
                    shared.calls.lock_unpoisoned().pending.get(&id).map(|p| Arc::clone(&p.tool_call_id))
                });
                // Extensions log outside any call: no empty field then.
                let call = call.filter(|call| !call.is_empty());
                match (level.as_str(), call.as_deref()) {
                    ("debug", Some(call)) => {
                        tracing::debug!(target: "goondan::script", tool_call_id = call, "{message}")
                    }
                    ("debug", None) => tracing::debug!(target: "goondan::script", "{message}"),
                    ("warn", Some(call)) => tracing::warn!(target: "goondan::script", tool_call_id = call, "{message}"),
                    ("warn", None) => tracing::warn!(target: "goondan::script", "{message}"),
                    ("error", Some(call)) => {
                        tracing::error!(target: "goondan::script", tool_call_id = call, "{message}")
                    }
                    ("error", None) => tracing::error!(target: "goondan::script", "{message}"),
                    (_, Some(call)) => tracing::info!(target: "goondan::script", tool_call_id = call, "{message}"),
                    (_, None) => tracing::info!(target: "goondan::script", "{message}"),
                }
            }
            FromHost::Ready { .. } => {}
        }
    }
    let _ = done.send(());
}

/// Why [`ScriptHost::shutdown`] stops the host: an end that was asked for,
/// not logged as a failure.
const SHUTTING_DOWN: &str = "the script host is shutting down";

async fn supervise(
    mut child: HostProcess,
    stdin: Option<ChildStdin>,
    shared: Arc<Shared>,
    mut kill: mpsc::UnboundedReceiver<&'static str>,
    reader_done: oneshot::Receiver<()>,
) {
    // Held until the end: the host also exits when its stdin closes.
    let _stdin = stdin;
    let mut wanted = true;
    let mut reason = None;
    let status = tokio::select! {
        status = child.wait() => status,
        why = kill.recv() => {
            // `None`: every handle is gone (the ScriptHost was dropped); a
            // shutdown is asked for too: neither is a failure to report.
            wanted = why.is_some_and(|why| why != SHUTTING_DOWN);
            reason = why;
            child.kill();
            child.wait().await
        }
        _ = reader_done => match tokio::time::timeout(EXIT_GRACE, child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                reason = Some("it closed its channel but did not exit");
                child.kill();
                child.wait().await
            }
        },
    };
    let what = match status {
        Ok(status) => describe_status(status),
        Err(e) => format!("could not be waited for ({e})"),
    };
    let mut message = format!("the script host ({}) {what}", shared.label);
    if let Some(reason) = reason {
        message.push_str(": ");
        message.push_str(reason);
    }
    if wanted {
        tracing::warn!(target: "goondan::script", pid = shared.pid, "{message}");
        shared.failures.lock_unpoisoned().record();
    }
    shared.close(&format!("{message}; the call was lost (the next call starts a new host)"));
    shared.tasks.host_gone(&message).await;
}

/// The pipes of a host process, ready for the async runtime.
pub(crate) struct HostPipes {
    pub(crate) stdin: ChildStdin,
    pub(crate) stdout: tokio::process::ChildStdout,
    pub(crate) stderr: tokio::process::ChildStderr,
}

/// A host process and the thread that waits for it. Dropping it kills the
/// process and waits until it is reaped.
pub(crate) struct HostProcess {
    pub(crate) pid: u32,
    /// True once the process is reaped: its pid may then belong to another
    /// process, so [`HostProcess::kill`] holds this lock and checks it.
    reaped: Arc<Mutex<bool>>,
    exited: oneshot::Receiver<std::io::Result<ExitStatus>>,
    waiter: Option<std::thread::JoinHandle<()>>,
}

impl HostProcess {
    pub(crate) fn spawn(command: std::process::Command) -> std::io::Result<(Self, HostPipes)> {
        Self::spawn_as(command, false)
    }

    /// Spawns `command` as the leader of a new process group; when it
    /// exits, the group is SIGKILLed before the leader is reaped — while its
    /// zombie still holds the group id, so no other group can have it — and
    /// nothing it started outlives it.
    pub(crate) fn spawn_group_leader(mut command: std::process::Command) -> std::io::Result<(Self, HostPipes)> {
        use std::os::unix::process::CommandExt as _;
        command.process_group(0);
        Self::spawn_as(command, true)
    }

    fn spawn_as(mut command: std::process::Command, group: bool) -> std::io::Result<(Self, HostPipes)> {
        let mut child = command.spawn()?;
        let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let pid = child.id();
        let reaped = Arc::new(Mutex::new(false));
        let (tx, exited) = oneshot::channel();
        let gate = Arc::clone(&reaped);
        let waiter = std::thread::Builder::new().name(format!("goondan-js-wait-{pid}")).spawn(move || {
            let target = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
            // Wait for the exit without reaping: until the reap below the pid
            // stays this zombie's, so a kill meanwhile cannot reach another
            // process.
            let flags = nix::sys::wait::WaitPidFlag::WEXITED | nix::sys::wait::WaitPidFlag::WNOWAIT;
            while nix::sys::wait::waitid(nix::sys::wait::Id::Pid(target), flags) == Err(nix::errno::Errno::EINTR) {}
            if group {
                let _ = nix::sys::signal::killpg(target, nix::sys::signal::Signal::SIGKILL);
            }
            let status = {
                let mut reaped = gate.lock_unpoisoned();
                let status = child.wait();
                *reaped = true;
                status
            };
            let _ = tx.send(status);
        });
        let waiter = match waiter {
            Ok(waiter) => waiter,
            Err(error) => {
                // The child exists but nothing would wait for it: end it here.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX)),
                    nix::sys::signal::Signal::SIGKILL,
                );
                return Err(error);
            }
        };
        let process = Self { pid, reaped, exited, waiter: Some(waiter) };
        let (Some(stdin), Some(stdout), Some(stderr)) = pipes else {
            return Err(std::io::Error::other("the host's pipes were not set up"));
        };
        let pipes = HostPipes {
            stdin: ChildStdin::from_std(stdin)?,
            stdout: tokio::process::ChildStdout::from_std(stdout)?,
            stderr: tokio::process::ChildStderr::from_std(stderr)?,
        };
        Ok((process, pipes))
    }

    /// SIGKILLs the process unless it has been reaped.
    pub(crate) fn kill(&self) {
        let reaped = self.reaped.lock_unpoisoned();
        if !*reaped && let Ok(pid) = i32::try_from(self.pid) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }

    /// Its exit status, once it has exited and been reaped.
    pub(crate) async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        (&mut self.exited).await.unwrap_or_else(|_| Err(std::io::Error::other("its waiting thread ended")))
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        self.kill();
        // Brief: a SIGKILLed process exits at once.
        if let Some(waiter) = self.waiter.take() {
            let _ = waiter.join();
        }
    }
}

/// The command that runs `script` (in the private directory `dir`) with
/// `runtime`, from `dir`: the runtime then finds no `bunfig.toml`,
/// `package.json` or `.env` but in that directory (Bun reads them from its
/// current directory at start; a workdir the model writes must not
/// configure it). Bun is also told to load no `.env` file at all, and not
/// to install missing packages on the fly (its auto-install, on whenever no
/// `node_modules` lies at or above its current directory — always, from a
/// private directory): imports resolve from the bundle's `node_modules`
/// only, never from the registry at run time (an older Bun ignores the
/// flags). The binary is run by its real path: a sandbox
/// shows a confined host the binary's real directory, not the links to it
/// (`node_modules/.bin/bun`). Its stdio are pipes.
pub(crate) fn host_command(runtime: &JsRuntime, dir: &Path, script: &str) -> std::process::Command {
    let binary = std::fs::canonicalize(&runtime.path).unwrap_or_else(|_| runtime.path.clone());
    let mut command = std::process::Command::new(binary);
    command.args(&runtime.args);
    if runtime.kind == crate::runtime::RuntimeKind::Bun {
        command.args(["--no-env-file", "--no-install"]);
    }
    command.arg(dir.join(script)).current_dir(dir).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

/// The channel between gdn and one host process: a connected pair of Unix
/// stream sockets, the host's end inherited by the child under its own
/// number, which an environment variable tells it. Nothing is listening
/// anywhere, so nothing else can reach the host's frames, and the host
/// needs no right to make a socket.
pub(crate) struct Channel {
    /// gdn's end, for the async runtime.
    ours: tokio::net::UnixStream,
    /// The host's end, closed here once the child has it.
    theirs: std::os::unix::net::UnixStream,
}

impl Channel {
    /// A new pair whose host end `command`'s child inherits, its number in
    /// `env`. Call it before anything else adds `pre_exec` hooks to
    /// `command` (the sandbox's), and within the async runtime.
    pub(crate) fn attach(command: &mut std::process::Command, env: &str) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd as _;
        use std::os::unix::process::CommandExt as _;
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        // Never 0, 1 or 2, which the child's stdio take over before the
        // hook runs (a copy is always 3 or above).
        let theirs = if theirs.as_raw_fd() <= 2 { theirs.try_clone()? } else { theirs };
        let fd = theirs.as_raw_fd();
        command.env(env, fd.to_string());
        // SAFETY: the hook runs in the child between fork and exec, where
        // only async-signal-safe calls are sound: it makes one `fcntl` on a
        // number copied in, and allocates nothing.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || {
                // Kept under its own number (no `dup2` onto a fixed one,
                // which could close a descriptor a later hook needs); only
                // its close-on-exec flag goes.
                if nix::libc::fcntl(fd, nix::libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        ours.set_nonblocking(true)?;
        let ours = tokio::net::UnixStream::from_std(ours)?;
        Ok(Self { ours, theirs })
    }

    /// gdn's end, once the child is spawned: the copy of the host's end
    /// here is closed, so the channel ends when the host (and whatever
    /// inherited the descriptor from it) is gone.
    pub(crate) fn spawned(self) -> tokio::net::UnixStream {
        drop(self.theirs);
        self.ours
    }
}

/// Writes a host's script, and the transport it imports, into its private
/// directory `dir`.
pub(crate) fn write_host_script(dir: &Path, name: &str, script: &str) -> std::io::Result<()> {
    std::fs::write(dir.join(TRANSPORT_NAME), TRANSPORT_SCRIPT)?;
    std::fs::write(dir.join(name), script)
}

/// Creates the private directory of this process's hosts (mode 0700, set
/// after creation so the umask cannot widen or narrow it), first sweeping
/// the directories of processes that no longer run.
pub(crate) fn private_dir() -> std::io::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt as _;
    sweep_stale_dirs(&std::env::temp_dir());
    let dir = tempfile::Builder::new()
        .prefix(&format!("{PRIVATE_DIR_PREFIX}{}-", std::process::id()))
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))?;
    Ok(dir)
}

/// The name of a host's private directory starts with this, then the pid
/// of the process that made it and `-`.
const PRIVATE_DIR_PREFIX: &str = "goondan-js-";

/// Removes the private directories in `temp` that belong to this user and
/// were made by a process that no longer runs (a SIGKILLed `gdn` or agent
/// process never removed its own). Returns how many went.
fn sweep_stale_dirs(temp: &Path) -> usize {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(own) = std::fs::metadata("/proc/self").map(|m| m.uid()) else { return 0 };
    let Ok(entries) = std::fs::read_dir(temp) else { return 0 };
    let mut swept = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix(PRIVATE_DIR_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<i32>().ok())
            .filter(|pid| *pid > 0)
        else {
            continue;
        };
        // Only real directories of ours (not a link planted by another user).
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else { continue };
        if !meta.is_dir() || meta.uid() != own {
            continue;
        }
        let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) == Err(nix::errno::Errno::ESRCH);
        if gone && std::fs::remove_dir_all(entry.path()).is_ok() {
            tracing::debug!(target: "goondan::script", "removed {}, left by pid {pid}", entry.path().display());
            swept += 1;
        }
    }
    swept
}

async fn forward_lines<R: AsyncRead + Unpin>(stream: R, pid: u32, stderr: bool) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if stderr {
            tracing::warn!(target: "goondan::script", pid, "{line}");
        } else {
            tracing::info!(target: "goondan::script", pid, "{line}");
        }
    }
}

pub(crate) fn describe_status(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with code {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt as _;
        if let Some(signal) = status.signal() {
            let name = match signal {
                1 => " (SIGHUP)",
                2 => " (SIGINT)",
                4 => " (SIGILL)",
                6 => " (SIGABRT)",
                9 => " (SIGKILL)",
                11 => " (SIGSEGV)",
                15 => " (SIGTERM)",
                _ => "",
            };
            return format!("was killed by signal {signal}{name}");
        }
    }
    format!("ended ({status})")
}

fn host_exited(message: String) -> ToolFailure {
    ToolFailure::with_code(message, E_SCRIPT_HOST_EXITED).named("ScriptHostError")
}

fn runtime_missing(module: &Path, error: &DiscoverError) -> ToolFailure {
    ToolFailure::with_code(
        format!(
            "cannot run the script tool module {}: {error}; install Bun (https://bun.sh) or set GOONDAN_JS_RUNTIME",
            module.display()
        ),
        E_SCRIPT_RUNTIME_MISSING,
    )
    .named("ScriptRuntimeError")
    .suggest("Install Bun (https://bun.sh) or set GOONDAN_JS_RUNTIME to a Bun or Node >= 22.6 binary.")
    .help_url("https://bun.sh")
}

/// A thrown value as a failure; `ToolFailure` fills in `Error` / `E_TOOL`.
fn thrown(error: ErrorBody) -> ToolFailure {
    ToolFailure {
        name: error.name.unwrap_or_default(),
        message: error.message,
        code: error.code.filter(|c| !c.is_empty()),
        suggestion: error.suggestion,
        help_url: error.help_url,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_starts_at_the_third_death_in_a_row_and_doubles_to_a_cap() {
        let mut failures = Failures::default();
        failures.record();
        failures.record();
        assert_eq!(failures.next_start(), None);
        let delay = |f: &Failures| f.next_start().zip(f.last).map(|(at, last)| at - last);
        let within = |delay: Option<Duration>, base: u64| {
            let base = Duration::from_millis(base);
            delay.is_some_and(|delay| delay >= base && delay <= base * 2)
        };
        failures.record();
        assert!(within(delay(&failures), 100), "{:?}", delay(&failures));
        failures.record();
        assert!(within(delay(&failures), 200), "{:?}", delay(&failures));
        failures.in_a_row = 40;
        assert_eq!(delay(&failures), Some(BACKOFF_MAX));
        // A death long after the last one starts a new count.
        failures.last = Instant::now().checked_sub(FAILURE_WINDOW * 2);
        failures.record();
        assert_eq!(failures.in_a_row, 1);
    }

    #[test]
    fn exit_statuses_read_plainly() {
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(describe_status(ExitStatus::from_raw(3 << 8)), "exited with code 3");
        assert_eq!(describe_status(ExitStatus::from_raw(9)), "was killed by signal 9 (SIGKILL)");
    }
}
