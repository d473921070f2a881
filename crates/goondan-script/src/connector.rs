//! Connectors users write: a Connection whose `kind: Connector` has
//! `entry: ./x.ts` runs that entry's `export default async function
//! run(ctx)` in a JavaScript host process of its own (Bun, or Node ≥ 22.6),
//! one per Connection, supervised by [`start`].
//!
//! The host gets the Connection's config and secrets in its `start` frame
//! over its channel to gdn (a connected socket pair, its end inherited as a
//! file descriptor: see [`crate::host`]), never in argv or its environment
//! (which is gdn's own, already free of secrets). Its
//! `ctx.emit(event, {deliveryKey}?)` goes to Rust, is read strictly
//! ([`ConnectorEvent::from_json`]) and handed to the Connection's
//! [`EventSink`]; the JavaScript promise settles only when the sink has
//! answered, so a connector that awaits `emit` acknowledges the outside only
//! after the event is stored. `ctx.logger` and the process's stdout/stderr
//! go to `tracing` (target `goondan::connector`, field `connection`) with
//! every secret value replaced by `[redacted]`.
//!
//! Life cycle: a bad entry (no file, an import error, no default export
//! function, a `run()` that fails before the next macrotask — the original's
//! start-up probe) is an error of [`start`]. Afterwards, `run()` resolving
//! and the process then exiting cleanly ends the connector for good;
//! `run()` rejecting, an uncaught error or the process dying is logged and
//! the host is started again after a jittered exponential backoff (capped).
//! Cancelling [`ConnectorContext::stop`] sends `shutdown` (the host aborts
//! `ctx.signal` and raises SIGTERM on itself when the connector listens for
//! it, as the original's connectors expect), waits the grace period, then
//! kills the host; the task returns `Ok`. The host runs in a process group
//! of its own (a Ctrl-C at the terminal reaches gdn, which then drains, not
//! the connector), killed whole when the host ends, so what the connector
//! spawned goes with it. The host exits when its channel closes — also when
//! gdn is SIGKILLed, since the kernel closes gdn's end (its own children
//! then stay: nothing is left to kill their group).
//!
//! Confinement: unless the Connection's Swarm runs its agents unconfined
//! (`spec.sandbox.policy: full`, see [`ScriptConnector::confined`]), the
//! host runs in a sandbox of its own (`goondan_sandbox`, `workspace-write`
//! with an open network): it reads the system, the bundle's directory and
//! the runtime's, writes only its private directory (its current directory
//! and workdir, where its script stays read-only) and a private `TMPDIR`,
//! and connects anywhere over TCP/UDP — a connector's work is talking to its
//! service — but reaches no Unix socket outside, no other process and no
//! set-id mode. The sandbox (and its `TMPDIR`) lasts as long as the
//! connector: a restarted host runs in the same one. Where it cannot be
//! enforced (no Landlock), the connector does not start, and the error says
//! how to opt out.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use goondan_core::JsonValue;
use goondan_ingress::{
    Accepted, ConnectorContext, ConnectorError, ConnectorEvent, Delivery, EventSink, RunningConnector, SinkError,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWriteExt as _, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::ChildStdin;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::host::{
    Channel, EnvLookup, HostProcess, TRANSPORT_NAME, describe_status, host_command, private_dir, write_host_script,
};
use crate::runtime::JsRuntime;

/// The connector host script, compiled into the binary.
const HOST_SCRIPT: &str = include_str!("host/connector.mjs");
/// Its file name in the host's private directory.
const SCRIPT_NAME: &str = "connector.mjs";
/// The environment variable that gives the connector host the number of its
/// file descriptor of the channel to gdn.
pub const CONNECTOR_FD_ENV: &str = "GOONDAN_CONNECTOR_FD";
/// `ctx.emit` rejected: the value is not a valid `ConnectorEvent` or its
/// delivery key is not usable.
pub const E_CONNECTOR_EVENT: &str = "E_CONNECTOR_EVENT";
/// `ctx.emit` rejected: the service is stopping and accepts nothing more.
pub const E_CONNECTOR_CLOSED: &str = "E_CONNECTOR_CLOSED";
/// `ctx.emit` rejected: the inbox could not store the event.
pub const E_CONNECTOR_STORAGE: &str = "E_CONNECTOR_STORAGE";
/// Every code `ctx.emit` rejects with.
pub const CODES: &[&str] = &[E_CONNECTOR_EVENT, E_CONNECTOR_CLOSED, E_CONNECTOR_STORAGE];

/// How long a starting host has to say `ready`, and then to load its entry.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a host whose channel closed has to exit by itself.
const EXIT_GRACE: Duration = Duration::from_secs(1);
/// How long the frames a dead host sent last may take to be read.
const LAST_FRAMES: Duration = Duration::from_millis(500);
/// A run at least this long was healthy: the next failure starts the
/// backoff from its first delay again.
const STABLE_RUN: Duration = Duration::from_secs(60);
/// The frames queued for a host, at most: its emits' answers wait for
/// room (the host reads its channel as it goes).
const FRAMES_QUEUED: usize = 256;
/// The emits of a host being stored at once, at most: past it the host's
/// channel is not read until one is answered (its `ctx.emit` waits).
const EMITS_IN_FLIGHT: usize = 64;
/// What the host said of its `run()` and not yet taken in, at most.
const LIFECYCLE_QUEUED: usize = 16;
/// What replaces a secret value in logs and errors.
const REDACTED: &str = "[redacted]";

/// How to run a Connector's entry: the module and the host's settings.
#[derive(Clone)]
pub struct ScriptConnector {
    entry: PathBuf,
    /// The bundle's directory (absolute): readable by a confined host.
    bundle_dir: PathBuf,
    /// Whether the host runs in a sandbox of its own.
    confined: bool,
    /// Directories a confined host may write besides its own.
    writable: Vec<PathBuf>,
    /// Confined without namespaces even where they work.
    landlock_only: bool,
    env: EnvLookup,
    /// Shared: the spec is cloned per start and sits in an enum with small
    /// variants.
    runtime: Option<Arc<JsRuntime>>,
    stop_grace: Duration,
    restart_min: Duration,
    restart_max: Duration,
}

impl std::fmt::Debug for ScriptConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptConnector")
            .field("entry", &self.entry)
            .field("confined", &self.confined)
            .field("runtime", &self.runtime)
            .field("stop_grace", &self.stop_grace)
            .finish_non_exhaustive()
    }
}

impl ScriptConnector {
    /// The Connector whose `spec.entry` is `entry`, relative to the bundle
    /// directory `bundle_dir` (or absolute). The runtime is found as for
    /// script tools (`GOONDAN_JS_RUNTIME`, else Bun, else Node ≥ 22.6) from
    /// the process environment. The host runs confined (see
    /// [`ScriptConnector::confined`]).
    pub fn new(bundle_dir: &Path, entry: &str) -> Self {
        Self {
            // Absolute: the host runs its script from another directory.
            entry: goondan_tools::assembly::entry_path(bundle_dir, entry).to_path_buf(),
            bundle_dir: std::path::absolute(bundle_dir).unwrap_or_else(|_| bundle_dir.to_path_buf()),
            confined: true,
            writable: Vec::new(),
            landlock_only: false,
            env: Arc::new(|name: &str| std::env::var(name).ok()),
            runtime: None,
            stop_grace: Duration::from_secs(5),
            restart_min: Duration::from_millis(500),
            restart_max: Duration::from_secs(30),
        }
    }

    /// Whether the host runs in a sandbox of its own (the default: `true`):
    /// it then reads the system, the bundle's directory (and the entry's,
    /// when elsewhere) and the runtime's; writes its private directory, a
    /// private `TMPDIR` and the [`with_writable`](Self::with_writable)
    /// directories; and has the machine's network. gdn runs it unconfined
    /// only when the Swarm's entry agent has `spec.sandbox.policy: full`.
    pub fn confined(mut self, confined: bool) -> Self {
        self.confined = confined;
        self
    }

    /// Directories a confined host may also write (none by default).
    pub fn with_writable(mut self, writable: Vec<PathBuf>) -> Self {
        self.writable = writable;
        self
    }

    /// Confines the host without namespaces — the stricter Landlock-only
    /// layout the sandbox falls back to where user namespaces do not work —
    /// even where they do (for tests of that layout).
    pub fn landlock_only(mut self) -> Self {
        self.landlock_only = true;
        self
    }

    /// Whether the host runs confined.
    pub fn is_confined(&self) -> bool {
        self.confined
    }

    /// Finds the runtime with `env` instead of the process environment.
    pub fn with_env(mut self, env: EnvLookup) -> Self {
        self.env = env;
        self
    }

    /// Uses `runtime` instead of finding one.
    pub fn with_runtime(mut self, runtime: JsRuntime) -> Self {
        self.runtime = Some(Arc::new(runtime));
        self
    }

    /// How long a stopping connector has between `shutdown` and SIGKILL
    /// (default 5 s).
    pub fn with_stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// The first and the longest wait before a failed connector is started
    /// again (default 500 ms and 30 s); each failure in a row doubles the
    /// wait, with jitter of up to as much again.
    pub fn with_restart_delays(mut self, first: Duration, longest: Duration) -> Self {
        self.restart_min = first;
        self.restart_max = longest.max(first);
        self
    }

    /// The entry module, resolved.
    pub fn entry(&self) -> &Path {
        &self.entry
    }

    /// [`start`], boxed as the native connectors' start futures are.
    pub fn start(self, ctx: ConnectorContext) -> goondan_ingress::connector::StartFuture {
        Box::pin(start(self, ctx))
    }
}

/// Starts the Connector `spec` for the Connection of `ctx`: resolves the
/// runtime, starts the host, loads the entry and runs it past the start-up
/// probe. An `Err` means it did not start (nothing keeps running); after an
/// `Ok`, the returned task supervises it until it returns or
/// `ctx.stop` is cancelled. `ctx.input` is not used: the host's standard
/// input is gdn's pipe to it.
pub async fn start(spec: ScriptConnector, ctx: ConnectorContext) -> Result<RunningConnector, ConnectorError> {
    let ConnectorContext { connection, connector, config, secrets, sink, stop, input: _ } = ctx;
    let failed = |message: String| ConnectorError::Failed { connection: connection.clone(), message };
    let redactor = Arc::new(Redactor::new(secrets.expose().values()));
    let Some(entry) = existing_entry(&spec.entry) else {
        return Err(failed(format!("Connector '{connector}': its entry {} does not exist", spec.entry.display())));
    };
    let runtime = match spec.runtime.as_deref() {
        Some(runtime) => runtime.clone(),
        None => {
            let env = Arc::clone(&spec.env);
            tokio::task::spawn_blocking(move || JsRuntime::discover(&*env))
                .await
                .map_err(|e| failed(format!("finding a JavaScript runtime failed: {e}")))?
                .map_err(|e| {
                    failed(format!(
                        "Connector '{connector}' ({}) needs a JavaScript runtime: {e}; install Bun (https://bun.sh) or set GOONDAN_JS_RUNTIME",
                        entry.display()
                    ))
                })?
        }
    };
    let dir = private_dir().map_err(|e| failed(format!("cannot create a private directory for its host: {e}")))?;
    write_host_script(dir.path(), SCRIPT_NAME, HOST_SCRIPT)
        .map_err(|e| failed(format!("cannot write the connector host script: {e}")))?;
    let sandbox = spec.confined.then(|| host_sandbox(&spec, &runtime, &entry, dir.path()));
    let start_frame = serde_json::to_vec(&ToHost::Start {
        entry: &entry.to_string_lossy(),
        connection: &connection,
        connector: &connector,
        config: &config,
        secrets: secrets.expose(),
    })
    .map_err(|e| failed(format!("cannot encode the start frame: {e}")))?;
    let mut launcher = Launcher {
        runtime,
        dir,
        sandbox,
        connection: Arc::from(connection.as_str()),
        start_frame,
        sink,
        redactor,
        tasks: HostTasks::default(),
    };
    let host = launcher.launch().await.map_err(|why| failed(format!("Connector '{connector}': {why}")))?;
    tracing::info!(target: "goondan::connector", connection = %connection, pid = host.process.pid, "connector '{connector}' started ({})", entry.display());
    let task = tokio::spawn(supervise(launcher, host, spec, stop));
    Ok(RunningConnector { listening: Vec::new(), task })
}

/// The sandbox of a connector's hosts: `workspace-write` in `dir` (its
/// private directory, where the host's scripts stay read-only), reading the
/// bundle's directory, the entry's (when elsewhere) and the runtime's
/// (its binary's real directory, as for the script tools' host), writing
/// the extra `writable` ones, with the machine's network.
fn host_sandbox(spec: &ScriptConnector, runtime: &JsRuntime, entry: &Path, dir: &Path) -> goondan_sandbox::Sandbox {
    let real = |path: &Path| std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let bundle = real(&spec.bundle_dir);
    let mut readable = vec![bundle.clone()];
    if let Some(parent) = real(entry).parent().filter(|parent| !parent.starts_with(&bundle)) {
        readable.push(parent.to_path_buf());
    }
    readable.extend(real(&runtime.path).parent().map(Path::to_path_buf));
    let sandbox = goondan_sandbox::Sandbox::new(goondan_sandbox::SandboxSpec {
        policy: goondan_sandbox::Policy::WorkspaceWrite,
        workdir: dir.to_path_buf(),
        readable,
        writable: spec.writable.clone(),
        protected: vec![dir.join(SCRIPT_NAME), dir.join(TRANSPORT_NAME)],
        open_network: true,
        ..goondan_sandbox::SandboxSpec::default()
    });
    if spec.landlock_only { sandbox.landlock_only() } else { sandbox }
}

/// Why a host could not be confined, and how to opt out.
fn confine_failed(error: &goondan_sandbox::SandboxError) -> String {
    match error {
        goondan_sandbox::SandboxError::Unavailable { reason, .. } => format!(
            "its host cannot be confined on this machine ({reason}), and a Connector's host is not run unconfined \
             behind the user's back; to run it with your full rights, set `spec.sandbox.policy: full` on the \
             Swarm (or on its entry agent) in goondan.yaml"
        ),
        other => format!("confining its host failed: {other}"),
    }
}

/// The entry, or its `.js`/`.ts` twin when only that exists (as the
/// original's loader finds it).
fn existing_entry(entry: &Path) -> Option<PathBuf> {
    if entry.is_file() {
        return Some(entry.to_path_buf());
    }
    let twin = match entry.extension().and_then(|e| e.to_str()) {
        Some("ts") => entry.with_extension("js"),
        Some("js") => entry.with_extension("ts"),
        _ => return None,
    };
    twin.is_file().then_some(twin)
}

/// Replaces secret values in text bound for logs and errors.
#[derive(Default)]
struct Redactor {
    /// Longest first, so a secret containing another is replaced whole.
    values: Vec<String>,
}

impl Redactor {
    fn new<'a>(values: impl Iterator<Item = &'a String>) -> Self {
        let mut values: Vec<String> = values.filter(|v| !v.is_empty()).cloned().collect();
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        values.dedup();
        Self { values }
    }

    fn redact<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let mut text = Cow::Borrowed(text);
        for value in &self.values {
            if text.contains(value.as_str()) {
                text = Cow::Owned(text.replace(value.as_str(), REDACTED));
            }
        }
        text
    }
}

/// Frames to the connector host.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "camelCase")]
enum ToHost<'a> {
    Start {
        entry: &'a str,
        connection: &'a str,
        connector: &'a str,
        config: &'a std::collections::BTreeMap<String, String>,
        secrets: &'a std::collections::BTreeMap<String, String>,
    },
    EmitResult {
        rid: u64,
        ok: bool,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        duplicate: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<EmitError>,
    },
    Shutdown,
}

#[derive(Serialize)]
struct EmitError {
    code: &'static str,
    message: String,
}

/// Frames from the connector host.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
enum FromHost {
    Ready {},
    Started,
    StartError {
        message: String,
    },
    Returned,
    Failed {
        message: String,
        #[serde(default)]
        stack: Option<String>,
    },
    Emit {
        rid: u64,
        event: JsonValue,
        #[serde(default, rename = "deliveryKey")]
        delivery_key: Option<String>,
    },
    Log {
        level: String,
        message: String,
    },
}

/// What the reader passes on to the supervisor.
enum Lifecycle {
    Started,
    StartError(String),
    Returned,
    Failed(String),
}

/// Starts host processes for one Connection.
struct Launcher {
    runtime: JsRuntime,
    /// The private directory (0700) with the host script, the host's
    /// current directory (and workdir when confined); removed when the
    /// connector ends.
    dir: tempfile::TempDir,
    /// The hosts' sandbox (`None`: unconfined), the same for every host of
    /// the connector; its private directory goes with it.
    sandbox: Option<goondan_sandbox::Sandbox>,
    connection: Arc<str>,
    start_frame: Vec<u8>,
    sink: Arc<dyn EventSink>,
    redactor: Arc<Redactor>,
    /// What reads and writes the hosts' pipes and channels, and answers
    /// their emits: done before the connector's task ends.
    tasks: HostTasks,
}

/// The tasks of a connector's hosts (see [`supervise`]).
#[derive(Clone, Default)]
struct HostTasks {
    tracker: TaskTracker,
    /// Cancelled when they outlive their host by [`EXIT_GRACE`].
    abandon: CancellationToken,
}

impl HostTasks {
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.tracker.spawn(self.abandon.clone().run_until_cancelled_owned(task));
    }

    /// Waits until every task is done: they end by themselves once their
    /// host is gone (its pipes and channel close, its emits are answered);
    /// those still running after [`EXIT_GRACE`] (a pipe a stray process
    /// holds open, a store that hangs) are dropped.
    async fn finish(&self) {
        self.tracker.close();
        if tokio::time::timeout(EXIT_GRACE, self.tracker.wait()).await.is_err() {
            self.abandon.cancel();
            self.tracker.wait().await;
        }
    }
}

/// One running host process.
struct Host {
    process: HostProcess,
    /// Held: on Node the host also exits when its stdin closes.
    _stdin: ChildStdin,
    frames: mpsc::Sender<Vec<u8>>,
    lifecycle: mpsc::Receiver<Lifecycle>,
    label: String,
}

impl Host {
    /// Queues `frame` without waiting: a host whose queue is full is not
    /// reading, and the caller (a stop) kills it after its grace anyway.
    fn send(&self, frame: &ToHost<'_>) {
        let Ok(mut line) = serde_json::to_vec(frame) else { return };
        line.push(b'\n');
        if self.frames.try_send(line).is_err() {
            tracing::debug!(target: "goondan::connector", pid = self.process.pid, "a frame to the connector host was dropped: it reads nothing");
        }
    }
}

impl Launcher {
    /// Starts a host and runs the entry in it, up to `started`. The error
    /// says why it did not start (secrets redacted).
    async fn launch(&mut self) -> Result<Host, String> {
        let mut command = host_command(&self.runtime, self.dir.path(), SCRIPT_NAME);
        // Before the sandbox's hooks: the descriptor must be passed on
        // whatever they do.
        let channel =
            Channel::attach(&mut command, CONNECTOR_FD_ENV).map_err(|e| format!("cannot make its channel: {e}"))?;
        if let Some(sandbox) = &self.sandbox {
            sandbox.confine(&mut command).map_err(|error| confine_failed(&error))?;
        }
        // Its own group: the terminal's Ctrl-C goes to gdn, which stops the
        // connector through its channel, in order; and when the host exits
        // (however), what the connector spawned is killed with it.
        let (mut process, pipes) = HostProcess::spawn_group_leader(command)
            .map_err(|e| format!("cannot run {}: {e}", self.runtime.path.display()))?;
        let stream = channel.spawned();
        let pid = process.pid;
        let label = format!("{} {}, pid {pid}", self.runtime.kind, self.runtime.version);
        for (stream, name) in [
            (Box::new(pipes.stdout) as Box<dyn AsyncRead + Send + Unpin>, "stdout"),
            (Box::new(pipes.stderr), "stderr"),
        ] {
            self.tasks.spawn(forward_output(
                stream,
                name,
                Arc::clone(&self.connection),
                Arc::clone(&self.redactor),
                pid,
            ));
        }
        let (read_half, write_half) = stream.into_split();
        let mut reader = BufReader::new(read_half);
        let mut first = String::new();
        let exited = |status: std::io::Result<std::process::ExitStatus>| match status {
            Ok(status) => format!("its host ({label}) {} before saying ready", describe_status(status)),
            Err(e) => format!("waiting for its host failed: {e}"),
        };
        let said = tokio::select! {
            read = tokio::time::timeout(START_TIMEOUT, reader.read_line(&mut first)) => read,
            status = process.wait() => return Err(exited(status)),
        };
        match said {
            Ok(Ok(n)) if n > 0 => {}
            Ok(Ok(_)) => {
                // Its end closed: it is exiting; say how.
                return Err(match tokio::time::timeout(EXIT_GRACE, process.wait()).await {
                    Ok(status) => exited(status),
                    Err(_) => format!("its host ({label}) closed its channel before saying ready"),
                });
            }
            Ok(Err(e)) => return Err(format!("reading the host's first frame failed: {e}")),
            Err(_) => return Err(format!("its host ({label}) did not say ready within {START_TIMEOUT:?}")),
        }
        if !matches!(serde_json::from_str::<FromHost>(first.trim_end()), Ok(FromHost::Ready {})) {
            return Err(format!("the host's first frame was not `ready` ({label})"));
        }
        let (frames, frames_rx) = mpsc::channel(FRAMES_QUEUED);
        let (lifecycle_tx, lifecycle) = mpsc::channel(LIFECYCLE_QUEUED);
        self.tasks.spawn(write_frames(write_half, frames_rx));
        self.tasks.spawn(read_frames(
            reader,
            Reader {
                frames: frames.clone(),
                lifecycle: lifecycle_tx,
                sink: Arc::clone(&self.sink),
                connection: Arc::clone(&self.connection),
                redactor: Arc::clone(&self.redactor),
                tasks: self.tasks.clone(),
                emits: Arc::new(tokio::sync::Semaphore::new(EMITS_IN_FLIGHT)),
            },
        ));
        let mut host = Host { process, _stdin: pipes.stdin, frames, lifecycle, label };
        let mut line = self.start_frame.clone();
        line.push(b'\n');
        let _ = host.frames.try_send(line);
        let outcome = tokio::time::timeout(START_TIMEOUT, async {
            loop {
                tokio::select! {
                    event = host.lifecycle.recv() => match event {
                        Some(Lifecycle::Started) => return Ok(()),
                        Some(Lifecycle::StartError(message)) => return Err(message),
                        Some(Lifecycle::Failed(message)) => return Err(format!("run() failed: {message}")),
                        Some(Lifecycle::Returned) => {}
                        None => return Err(format!("its host ({}) closed its channel while starting", host.label)),
                    },
                    status = host.process.wait() => {
                        // Its last frame (a startError) may still be unread.
                        let last = tokio::time::timeout(LAST_FRAMES, host.lifecycle.recv()).await;
                        return Err(match last {
                            Ok(Some(Lifecycle::StartError(message) | Lifecycle::Failed(message))) => message,
                            _ => match status {
                                Ok(status) => format!("its host ({}) {} while starting", host.label, describe_status(status)),
                                Err(e) => format!("waiting for its host failed: {e}"),
                            },
                        });
                    }
                }
            }
        })
        .await;
        let why = match outcome {
            Ok(Ok(())) => return Ok(host),
            Ok(Err(message)) => self.redactor.redact(&message).into_owned(),
            Err(_) => format!("its entry did not start within {START_TIMEOUT:?} ({})", host.label),
        };
        Err(why)
    }
}

/// What the reader of one host needs.
struct Reader {
    frames: mpsc::Sender<Vec<u8>>,
    lifecycle: mpsc::Sender<Lifecycle>,
    sink: Arc<dyn EventSink>,
    connection: Arc<str>,
    redactor: Arc<Redactor>,
    /// Where the emits' answers run.
    tasks: HostTasks,
    /// Room for the emits being stored (see [`EMITS_IN_FLIGHT`]).
    emits: Arc<tokio::sync::Semaphore>,
}

async fn write_frames(mut channel: OwnedWriteHalf, mut frames: mpsc::Receiver<Vec<u8>>) {
    while let Some(line) = frames.recv().await {
        if channel.write_all(&line).await.is_err() {
            break;
        }
    }
}

async fn read_frames(reader: BufReader<OwnedReadHalf>, ctx: Reader) {
    let mut lines = reader.lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let frame = match serde_json::from_str::<FromHost>(&line) {
            Ok(frame) => frame,
            Err(e) => {
                let e = ctx.redactor.redact(&e.to_string()).into_owned();
                tracing::warn!(target: "goondan::connector", connection = %ctx.connection, "unreadable frame from the connector host: {e}");
                continue;
            }
        };
        let to_supervisor = match frame {
            FromHost::Emit { rid, event, delivery_key } => {
                let sink = Arc::clone(&ctx.sink);
                let frames = ctx.frames.clone();
                // Back-pressure: with too many emits being stored, the
                // host's channel waits (a closed semaphore never happens).
                let Ok(room) = Arc::clone(&ctx.emits).acquire_owned().await else { break };
                // Each emit is answered on its own: a slow store holds up
                // only the emits that wait for it.
                ctx.tasks.spawn(async move {
                    let _room = room;
                    let answer = match accept(sink.as_ref(), &event, delivery_key).await {
                        Ok(accepted) => ToHost::EmitResult {
                            rid,
                            ok: true,
                            duplicate: accepted == Accepted::Duplicate,
                            error: None,
                        },
                        Err(error) => ToHost::EmitResult { rid, ok: false, duplicate: false, error: Some(error) },
                    };
                    if let Ok(mut line) = serde_json::to_vec(&answer) {
                        line.push(b'\n');
                        let _ = frames.send(line).await;
                    }
                });
                continue;
            }
            FromHost::Log { level, message } => {
                log(&ctx.connection, &level, &ctx.redactor.redact(&message));
                continue;
            }
            FromHost::Ready {} => continue,
            FromHost::Started => Lifecycle::Started,
            FromHost::StartError { message } => Lifecycle::StartError(message),
            FromHost::Returned => Lifecycle::Returned,
            FromHost::Failed { message, stack } => {
                if let Some(stack) = stack {
                    tracing::debug!(target: "goondan::connector", connection = %ctx.connection, "run() failed: {}", ctx.redactor.redact(&stack));
                }
                Lifecycle::Failed(message)
            }
        };
        let _ = ctx.lifecycle.send(to_supervisor).await;
    }
}

/// Reads, checks and stores one emitted event.
async fn accept(sink: &dyn EventSink, event: &JsonValue, key: Option<String>) -> Result<Accepted, EmitError> {
    let invalid = |message: String| EmitError { code: E_CONNECTOR_EVENT, message };
    let event = ConnectorEvent::from_json(event).map_err(|e| invalid(e.to_string()))?;
    let delivery = match key {
        Some(key) => Delivery::keyed(key, event),
        None => Delivery::unkeyed(event),
    };
    delivery.check().map_err(|e| invalid(e.to_string()))?;
    sink.accept_one(delivery).await.map_err(|error| match error {
        SinkError::Closed => EmitError { code: E_CONNECTOR_CLOSED, message: error.to_string() },
        SinkError::Storage(_) => EmitError { code: E_CONNECTOR_STORAGE, message: error.to_string() },
        SinkError::Invalid(_) => invalid(error.to_string()),
    })
}

fn log(connection: &str, level: &str, message: &str) {
    match level {
        "debug" => tracing::debug!(target: "goondan::connector", connection, "{message}"),
        "warn" => tracing::warn!(target: "goondan::connector", connection, "{message}"),
        "error" => tracing::error!(target: "goondan::connector", connection, "{message}"),
        _ => tracing::info!(target: "goondan::connector", connection, "{message}"),
    }
}

async fn forward_output<R: AsyncRead + Unpin>(
    stream: R,
    name: &'static str,
    connection: Arc<str>,
    redactor: Arc<Redactor>,
    pid: u32,
) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line = redactor.redact(&line);
        if name == "stderr" {
            tracing::warn!(target: "goondan::connector", connection = &*connection, pid, stream = name, "{line}");
        } else {
            tracing::info!(target: "goondan::connector", connection = &*connection, pid, stream = name, "{line}");
        }
    }
}

/// How one run of a host ended.
enum Ended {
    /// `ctx.stop` was cancelled and the host is gone.
    Stopped,
    /// `run()` resolved and the process exited cleanly.
    Returned,
    /// Anything else; the message says what.
    Died(String),
}

/// Runs the connector's hosts one after another (see [`run_hosts`]); its
/// task ends once the last host's tasks are done too.
async fn supervise(
    mut launcher: Launcher,
    host: Host,
    spec: ScriptConnector,
    stop: CancellationToken,
) -> Result<(), ConnectorError> {
    let ended = run_hosts(&mut launcher, host, &spec, &stop).await;
    launcher.tasks.finish().await;
    ended
}

/// Follows `host`, and starts it again when it fails, until it returns or
/// the connector is stopped.
async fn run_hosts(
    launcher: &mut Launcher,
    mut host: Host,
    spec: &ScriptConnector,
    stop: &CancellationToken,
) -> Result<(), ConnectorError> {
    let connection = Arc::clone(&launcher.connection);
    let new_backoff = || {
        use backon::BackoffBuilder as _;
        backon::ExponentialBuilder::new()
            .with_jitter()
            .with_factor(2.0)
            .with_min_delay(spec.restart_min)
            .with_max_delay(spec.restart_max)
            .without_max_times()
            .build()
    };
    let mut backoff = new_backoff();
    loop {
        let began = Instant::now();
        let why = match watch(&mut host, stop, spec.stop_grace).await {
            Ended::Stopped => {
                tracing::info!(target: "goondan::connector", connection = %connection, "connector stopped");
                return Ok(());
            }
            Ended::Returned => {
                tracing::info!(target: "goondan::connector", connection = %connection, "connector's run() returned; it is done and not restarted");
                return Ok(());
            }
            Ended::Died(why) => why,
        };
        if began.elapsed() >= STABLE_RUN {
            backoff = new_backoff();
        }
        let mut why = launcher.redactor.redact(&why).into_owned();
        loop {
            let delay = backoff.next().unwrap_or(spec.restart_max).min(spec.restart_max);
            tracing::error!(target: "goondan::connector", connection = %connection, "connector failed: {why}; restarting in {delay:?}");
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                () = tokio::time::sleep(delay) => {}
            }
            let launched = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                launched = launcher.launch() => launched,
            };
            match launched {
                Ok(next) => {
                    tracing::info!(target: "goondan::connector", connection = %connection, pid = next.process.pid, "connector restarted");
                    host = next;
                    break;
                }
                Err(error) => why = format!("the restart failed: {error}"),
            }
        }
    }
}

/// Follows one host until it ends or the connector is stopped.
async fn watch(host: &mut Host, stop: &CancellationToken, grace: Duration) -> Ended {
    let mut returned = false;
    let mut failed: Option<String> = None;
    let status = loop {
        tokio::select! {
            status = host.process.wait() => break status,
            event = host.lifecycle.recv() => match event {
                Some(Lifecycle::Returned) => returned = true,
                Some(Lifecycle::Failed(message) | Lifecycle::StartError(message)) => failed = Some(message),
                Some(Lifecycle::Started) => {}
                None => {
                    return match tokio::time::timeout(EXIT_GRACE, host.process.wait()).await {
                        Ok(status) => judge(status, returned, failed, &host.label),
                        Err(_) => {
                            host.process.kill();
                            let _ = host.process.wait().await;
                            Ended::Died(format!("its host ({}) closed its channel but did not exit", host.label))
                        }
                    };
                }
            },
            () = stop.cancelled() => {
                host.send(&ToHost::Shutdown);
                if tokio::time::timeout(grace, host.process.wait()).await.is_err() {
                    tracing::warn!(target: "goondan::connector", pid = host.process.pid, "the connector host did not stop within {grace:?}; killing it");
                    host.process.kill();
                    let _ = host.process.wait().await;
                }
                return Ended::Stopped;
            }
        }
    };
    // Its last frames (a `failed`, a `returned`) may still be unread.
    let _ = tokio::time::timeout(LAST_FRAMES, async {
        while let Some(event) = host.lifecycle.recv().await {
            match event {
                Lifecycle::Returned => returned = true,
                Lifecycle::Failed(message) | Lifecycle::StartError(message) => failed = Some(message),
                Lifecycle::Started => {}
            }
        }
    })
    .await;
    judge(status, returned, failed, &host.label)
}

fn judge(
    status: std::io::Result<std::process::ExitStatus>,
    returned: bool,
    failed: Option<String>,
    label: &str,
) -> Ended {
    if let Some(message) = failed {
        return Ended::Died(format!("run() failed: {message}"));
    }
    match status {
        Ok(status) if returned && status.success() => Ended::Returned,
        Ok(status) if returned => {
            Ended::Died(format!("its host ({label}) {} after run() returned", describe_status(status)))
        }
        Ok(status) => Ended::Died(format!("its host ({label}) {} while run() was running", describe_status(status))),
        Err(e) => Ended::Died(format!("its host ({label}) could not be waited for: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_longest_first() {
        let secrets = ["tok".to_owned(), "tok-123".to_owned(), String::new()];
        let redactor = Redactor::new(secrets.iter());
        assert_eq!(redactor.redact("a tok-123 b tok c"), "a [redacted] b [redacted] c");
        assert!(matches!(redactor.redact("nothing here"), Cow::Borrowed(_)));
    }

    #[test]
    fn an_entry_is_resolved_against_the_bundle_and_its_twin_found() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("x.js"), "export default async () => {}")?;
        let spec = ScriptConnector::new(dir.path(), "./x.ts");
        assert_eq!(spec.entry(), dir.path().join("x.ts"));
        let relative = ScriptConnector::new(Path::new("bundle"), "./connectors/../x.ts");
        assert!(relative.entry().is_absolute() && relative.entry().ends_with("bundle/x.ts"), "{relative:?}");
        assert_eq!(existing_entry(spec.entry()), Some(dir.path().join("x.js")));
        assert_eq!(existing_entry(&dir.path().join("y.ts")), None);
        Ok(())
    }

    #[test]
    fn a_confined_host_reads_the_bundle_the_entry_and_its_runtime_and_writes_its_own_directory() -> std::io::Result<()>
    {
        let (bundle, elsewhere, private) = (tempfile::tempdir()?, tempfile::tempdir()?, tempfile::tempdir()?);
        let real = |path: &Path| std::fs::canonicalize(path);
        let runtime = JsRuntime {
            kind: crate::runtime::RuntimeKind::Bun,
            path: PathBuf::from("/bin/sh"),
            version: "1.4.5".into(),
            args: Vec::new(),
        };
        let spec = ScriptConnector::new(bundle.path(), "./c.ts").with_writable(vec![PathBuf::from("/srv/spool")]);
        assert!(spec.is_confined());
        let sandbox = host_sandbox(&spec, &runtime, &elsewhere.path().join("c.ts"), private.path());
        let made = sandbox.spec();
        assert_eq!(made.policy, goondan_sandbox::Policy::WorkspaceWrite);
        assert!(made.open_network && made.network_allow.is_empty());
        assert_eq!(made.workdir, real(private.path())?);
        let runtime_dir = real(Path::new("/bin/sh"))?.parent().map(Path::to_path_buf).unwrap_or_default();
        assert_eq!(made.readable, [real(bundle.path())?, real(elsewhere.path())?, runtime_dir]);
        assert_eq!(made.writable, [PathBuf::from("/srv/spool")]);
        for script in [SCRIPT_NAME, TRANSPORT_NAME] {
            assert!(made.protected.contains(&real(private.path())?.join(script)), "{:?}", made.protected);
        }
        // An entry inside the bundle adds nothing.
        let inside = host_sandbox(&spec, &runtime, &bundle.path().join("c.ts"), private.path());
        assert_eq!(inside.spec().readable.len(), 2);
        Ok(())
    }

    #[test]
    fn an_unconfinable_host_says_how_to_opt_out() {
        let error = goondan_sandbox::SandboxError::Unavailable {
            policy: goondan_sandbox::Policy::WorkspaceWrite,
            reason: "Landlock is not available".into(),
        };
        let message = confine_failed(&error);
        assert!(message.contains("cannot be confined on this machine (Landlock is not available)"), "{message}");
        assert!(message.contains("`spec.sandbox.policy: full` on the Swarm"), "{message}");
    }

    #[test]
    fn a_clean_return_is_done_and_anything_else_a_failure() {
        use std::os::unix::process::ExitStatusExt as _;
        let exit = |code: i32| Ok(std::process::ExitStatus::from_raw(code << 8));
        assert!(matches!(judge(exit(0), true, None, "bun"), Ended::Returned));
        assert!(matches!(judge(exit(0), false, None, "bun"), Ended::Died(_)));
        assert!(matches!(judge(exit(1), true, None, "bun"), Ended::Died(_)));
        let Ended::Died(why) = judge(exit(1), false, Some("boom".into()), "bun") else { panic!("not a failure") };
        assert_eq!(why, "run() failed: boom");
    }
}
