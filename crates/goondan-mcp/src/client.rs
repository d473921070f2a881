//! One MCP server connection: a stdio child process with an `rmcp` client on
//! its standard input and output, or the `rmcp` streamable-HTTP client.
//!
//! A stdio child is spawned here rather than through the SDK's
//! child-process transport so that it runs in a process group of its own
//! (servers started through `npx` or a shell are several processes, and a
//! stop must reach all of them) and is killed when the connection is
//! dropped. Its standard error is logged line by line under the server's
//! name.
//!
//! A [`Server`] keeps the connection for the handlers of its tools and
//! restarts it, with backoff, for the first call after it died. Its
//! [`Notifications`] outlive each connection: they route progress
//! notifications to the call that asked for them and note
//! `notifications/tools/list_changed`, which the catalog acts on at the next
//! step. A call whose future is dropped (the call timeout, a cancelled turn)
//! is cancelled on the server: the SDK sends `notifications/cancelled`.
//!
//! A connection starts with `server/discover` (revision 2026-07-28) and
//! falls back to `initialize` for a server that does not know it; the
//! client declares the tasks extension (`io.modelcontextprotocol/tasks`),
//! so a server may answer a long `tools/call` with a task ([`Answer::Task`]),
//! which [`follow_task`] polls to its end.

use goondan_core::sync::LockUnpoisoned;
use std::collections::{HashMap, VecDeque};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use goondan_core::tls::SystemProxy;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelTaskParams, CancelledNotificationParam,
    ClientCapabilities, ClientConfig, ClientRequest, GetTaskParams, Implementation, ProgressNotificationParam,
    ProgressToken, ProtocolVersion, ServerNotification, ServerResult, SubscriptionFilter, Task, TaskPayload, Tool,
};
use rmcp::service::{
    ClientLifecycleMode, ClientServiceExt, NotificationContext, PeerRequestOptions, RoleClient, RunningService,
    ServiceError,
};
use rmcp::transport::streamable_http_client::{StreamableHttpClientTransport, StreamableHttpClientTransportConfig};
use rmcp::{ClientHandler, Peer, ServiceExt};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::config::{HttpServer, ServerConfig, StdioServer};

/// How long a server has to start, answer `initialize` and list its tools.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The first wait before restarting a server that died; it doubles with
/// every failed start up to [`MAX_RESTART_BACKOFF`], with jitter (see
/// [`restart_backoff`]).
pub const RESTART_BACKOFF: Duration = Duration::from_millis(250);

/// The longest wait between restarts.
pub const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(30);

/// The wait after `failures` failed starts in a row (1 or more): `backon`'s
/// exponential backoff from [`RESTART_BACKOFF`], with jitter of up to as much
/// again, at most [`MAX_RESTART_BACKOFF`].
pub fn restart_backoff(failures: u32) -> Duration {
    use backon::BackoffBuilder as _;
    // Past 2⁸ doublings of 250 ms the wait is at the cap anyway.
    let doublings = usize::try_from(failures.saturating_sub(1).min(8)).unwrap_or(8);
    backon::ExponentialBuilder::new()
        .with_jitter()
        .with_factor(2.0)
        .with_min_delay(RESTART_BACKOFF)
        .with_max_delay(MAX_RESTART_BACKOFF)
        .without_max_times()
        .build()
        .nth(doublings)
        .unwrap_or(MAX_RESTART_BACKOFF)
        .min(MAX_RESTART_BACKOFF)
}

/// The most bytes one JSON-RPC message (one line) may hold over stdio, as
/// the SDK's own limit: 16 MiB. A longer line is not read: see [`BoundedLines`].
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// What to put in the place of a line over the limit: given the line's
/// top-level `id` (its JSON text) when one was found, the line to hand on
/// instead (with its `\n`), or `None` for nothing.
pub(crate) type Oversized = fn(id: Option<&str>, limit: usize) -> Option<Vec<u8>>;

/// Stands between a peer's byte stream and the SDK's line reader, which
/// drops a line over its limit without a word (so a call whose answer it
/// was waits out its whole timeout, and a client whose request it was waits
/// forever). Each line is held back until it is whole; one that passes
/// `limit` is dropped here, and once its top-level `id` is known (at once
/// when it comes first, as every SDK writes it; else at the line's end) the
/// side's [`Oversized`] line takes its place: an error answer to that id.
/// The stream stays in step: the rest of the line is skipped up to its
/// `\n`. Without an id, the side's function decides (`None`: nothing is
/// handed on; the client closes the stream instead, so that every pending
/// call fails at once).
pub(crate) struct BoundedLines<R> {
    inner: R,
    limit: usize,
    on_oversized: Oversized,
    /// The line being read (no `\n` yet), at most `limit` bytes.
    line: Vec<u8>,
    /// Bytes ready for the reader, from `ready_at` on.
    ready: Vec<u8>,
    ready_at: usize,
    /// The current line passed the limit: its bytes are skipped.
    skipping: bool,
    /// Its replacement was handed on already.
    answered: bool,
    scan: IdScanner,
    /// Without an id, end the stream rather than read on.
    close_without_id: bool,
    /// The stream must end (an oversized line with no id, on the client).
    failed: Option<String>,
}

impl<R> BoundedLines<R> {
    pub(crate) fn new(inner: R, limit: usize, on_oversized: Oversized, close_without_id: bool) -> Self {
        Self {
            inner,
            limit,
            on_oversized,
            line: Vec::new(),
            ready: Vec::new(),
            ready_at: 0,
            skipping: false,
            answered: false,
            scan: IdScanner::default(),
            close_without_id,
            failed: None,
        }
    }

    /// Takes in bytes read from the peer.
    fn take_in(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let end = bytes.iter().position(|b| *b == b'\n');
            let (part, rest) = match end {
                Some(at) => (&bytes[..at], &bytes[at + 1..]),
                None => (bytes, &bytes[bytes.len()..]),
            };
            if !self.skipping && self.line.len() + part.len() > self.limit {
                tracing::warn!("a JSON-RPC message exceeds the limit of {} bytes; it is not read", self.limit);
                self.skipping = true;
                // Only a line over the limit is scanned for its id: what
                // was held of it first, then the rest as it streams.
                let held = std::mem::take(&mut self.line);
                self.scan.feed(&held);
            }
            if self.skipping {
                self.scan.feed(part);
                if !self.answered
                    && let Some(id) = self.scan.id()
                {
                    self.answer(Some(&id));
                }
            } else {
                self.line.extend_from_slice(part);
            }
            if end.is_some() {
                if self.skipping {
                    if !self.answered {
                        self.answer(None);
                    }
                } else {
                    self.ready.extend_from_slice(&self.line);
                    self.ready.push(b'\n');
                    self.line.clear();
                }
                self.skipping = false;
                self.answered = false;
                self.scan = IdScanner::default();
            }
            bytes = rest;
        }
    }

    fn answer(&mut self, id: Option<&str>) {
        self.answered = true;
        match (self.on_oversized)(id, self.limit) {
            Some(line) => self.ready.extend_from_slice(&line),
            None if self.close_without_id => {
                self.failed = Some(format!(
                    "a message of the peer exceeds the limit of {} bytes and names no request; the stream is closed",
                    self.limit
                ));
            }
            None => tracing::warn!("a JSON-RPC message over the limit of {} bytes was dropped", self.limit),
        }
    }
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for BoundedLines<R> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let this = self.get_mut();
        loop {
            if this.ready_at < this.ready.len() {
                let n = buf.remaining().min(this.ready.len() - this.ready_at);
                buf.put_slice(&this.ready[this.ready_at..this.ready_at + n]);
                this.ready_at += n;
                if this.ready_at == this.ready.len() {
                    this.ready.clear();
                    this.ready_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if let Some(message) = &this.failed {
                return Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::InvalidData, message.clone())));
            }
            let mut chunk = [0_u8; 64 * 1024];
            let mut read = tokio::io::ReadBuf::new(&mut chunk);
            match std::pin::Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Ready(Ok(())) if read.filled().is_empty() => {
                    // The end: an unfinished line goes on as it is (the SDK
                    // ignores it), unless it was over the limit.
                    if !this.skipping && !this.line.is_empty() {
                        let rest = std::mem::take(&mut this.line);
                        this.ready.extend_from_slice(&rest);
                        continue;
                    }
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Ok(())) => {
                    let filled = read.filled().to_vec();
                    this.take_in(&filled);
                }
            }
        }
    }
}

/// The top-level `"id"` of a JSON object read a piece at a time: its JSON
/// text (a number or a string) once it has been read whole.
#[derive(Debug, Default)]
struct IdScanner {
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// At depth 1, the next string is a key.
    expect_key: bool,
    /// The key being read (only its first bytes matter).
    key: Vec<u8>,
    reading_key: bool,
    /// The last key read at depth 1 was `id` and its value comes next.
    id_next: bool,
    /// The value of `id` being read, then read.
    value: Vec<u8>,
    reading_value: bool,
    done: Option<String>,
}

impl IdScanner {
    fn id(&self) -> Option<String> {
        self.done.clone()
    }

    fn feed(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            if self.done.is_some() {
                return;
            }
            if self.reading_value && self.value_byte(byte) {
                continue;
            }
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if byte == b'\\' {
                    self.escaped = true;
                } else if byte == b'"' {
                    self.in_string = false;
                    if self.reading_key {
                        self.reading_key = false;
                        self.id_next = self.key == b"id";
                        self.key.clear();
                    }
                    continue;
                }
                if self.reading_key && self.key.len() < 8 {
                    self.key.push(byte);
                }
                continue;
            }
            match byte {
                b'"' => {
                    self.in_string = true;
                    self.reading_key = self.depth == 1 && self.expect_key;
                    self.expect_key = false;
                }
                b'{' | b'[' => {
                    self.depth += 1;
                    self.expect_key = self.depth == 1 && byte == b'{';
                    self.id_next = false;
                }
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    self.id_next = false;
                }
                b',' => {
                    self.expect_key = self.depth == 1;
                    self.id_next = false;
                }
                b':' if self.depth == 1 && self.id_next => {
                    self.id_next = false;
                    self.reading_value = true;
                    self.value.clear();
                }
                _ => {}
            }
        }
    }

    /// One byte of the `id` value; false when the byte is not part of it
    /// (and is read as structure).
    fn value_byte(&mut self, byte: u8) -> bool {
        match self.value.first() {
            None if byte.is_ascii_whitespace() => true,
            None if byte == b'"' || byte == b'-' || byte.is_ascii_digit() => {
                self.value.push(byte);
                true
            }
            // `null` or something odd: no id to answer.
            None => {
                self.reading_value = false;
                false
            }
            Some(b'"') => {
                self.value.push(byte);
                if self.escaped {
                    self.escaped = false;
                } else if byte == b'\\' {
                    self.escaped = true;
                } else if byte == b'"' {
                    self.finish_value();
                } else if self.value.len() > 256 {
                    // Too long to be worth echoing: skip the rest of the string.
                    self.reading_value = false;
                    self.value.clear();
                    self.in_string = true;
                }
                true
            }
            Some(_) if byte.is_ascii_digit() || matches!(byte, b'-' | b'+' | b'.' | b'e' | b'E') => {
                self.value.push(byte);
                if self.value.len() > 64 {
                    self.reading_value = false;
                    self.value.clear();
                }
                true
            }
            Some(_) => {
                self.finish_value();
                false
            }
        }
    }

    fn finish_value(&mut self) {
        self.reading_value = false;
        let text = String::from_utf8_lossy(&self.value).into_owned();
        self.value.clear();
        if serde_json::from_str::<serde_json::Value>(&text).is_ok_and(|v| v.is_string() || v.is_number()) {
            self.done = Some(text);
        }
    }
}

/// The client's replacement for an oversized message from a server: an
/// error answer to its id (the call fails at once, naming the limit); with
/// no id, nothing (and the stream ends: see [`client_stream`]).
fn client_oversized(id: Option<&str>, limit: usize) -> Option<Vec<u8>> {
    let id = id?;
    let message = format!(
        "the server's answer exceeds the limit of {limit} bytes ({} MiB) for one message and was not read",
        limit / (1024 * 1024)
    );
    let error = serde_json::json!({"code": -32603, "message": message});
    Some(format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"error\":{error}}}\n").into_bytes())
}

/// A server's standard output as the client reads it: lines over
/// [`MAX_MESSAGE_BYTES`] answered at once (see [`BoundedLines`]).
fn client_stream<R>(stdout: R) -> BoundedLines<R> {
    BoundedLines::new(stdout, MAX_MESSAGE_BYTES, client_oversized, true)
}

/// How many of a server's last stderr lines a failed start quotes.
const STDERR_TAIL_LINES: usize = 5;

/// Why a server could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The process could not be spawned.
    #[error("cannot start '{command}': {message}")]
    Spawn {
        /// The program.
        command: String,
        /// The OS error.
        message: String,
    },
    /// The MCP handshake or the tool listing failed.
    #[error("{0}")]
    Protocol(String),
    /// A stdio server answered `server/discover` after the SDK had given up
    /// on it (10 s) and sent `initialize` on the same stream: a server slow
    /// to start (an interpreter's first start on a loaded machine), which a
    /// fresh start usually gets past.
    #[error("{0} (the server answered server/discover after 10 s)")]
    LateDiscoverAnswer(String),
    /// The server did not finish starting in time.
    #[error("did not answer initialize and tools/list within {}s", STARTUP_TIMEOUT.as_secs())]
    Timeout,
    /// The server is not running and may not be restarted yet.
    #[error("the server is not running; the next start is attempted in {}ms", .0.as_millis())]
    BackingOff(Duration),
    /// The connection closed (the process exited) during the request.
    #[error("the server exited or closed its connection")]
    Exited,
    /// The server answered with an error or something unexpected.
    #[error("{0}")]
    Request(String),
}

/// Receives the progress notifications of one call.
pub type ProgressListener = Arc<dyn Fn(&ProgressNotificationParam) + Send + Sync>;

/// What a server tells its client outside answers: shared by every
/// connection to the server, so a restart keeps the routes.
#[derive(Default)]
pub struct Notifications {
    progress: StdMutex<ProgressRoutes>,
    tools_changed: AtomicBool,
}

/// The progress listeners by token, and the answered calls' tokens in the
/// order they were answered, so expired routes go in O(1) each.
#[derive(Default)]
struct ProgressRoutes {
    listeners: HashMap<ProgressToken, ProgressEntry>,
    answered: VecDeque<(std::time::Instant, ProgressToken)>,
    /// Progress that arrived before its call's route was set: the request
    /// is on the wire before its handle (and token) is back, and a quick
    /// server's first notifications can beat it. Kept [`PROGRESS_GRACE`],
    /// at most [`MAX_UNROUTED`] of them.
    unrouted: VecDeque<(std::time::Instant, ProgressNotificationParam)>,
}

/// The most early progress notifications kept for routes not set yet.
const MAX_UNROUTED: usize = 256;

/// A call's progress listener, and since when its call has its answer.
struct ProgressEntry {
    listener: ProgressListener,
    answered: Option<std::time::Instant>,
}

/// How long a call's progress is still delivered after its answer (the SDK
/// hands each notification to a task of its own, so progress the server
/// sent before its answer may still be on its way), and how long progress
/// that arrived before its call's route is kept for it. Routes are kept
/// that long at most; nothing waits for them.
pub const PROGRESS_GRACE: Duration = Duration::from_secs(2);

impl std::fmt::Debug for Notifications {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifications").field("tools_changed", &self.tools_changed).finish_non_exhaustive()
    }
}

impl Notifications {
    /// Routes progress on `token` to `listener` until the returned guard is
    /// dropped.
    pub fn listen(self: &Arc<Self>, token: ProgressToken, listener: ProgressListener) -> ProgressRoute {
        let mut routes = self.progress.lock_unpoisoned();
        // Routes of calls answered longer than the grace ago go here, not
        // on a timer per call.
        let now = std::time::Instant::now();
        while let Some((at, _)) = routes.answered.front()
            && now.duration_since(*at) >= PROGRESS_GRACE
        {
            if let Some((_, expired)) = routes.answered.pop_front() {
                routes.listeners.remove(&expired);
            }
        }
        routes.unrouted.retain(|(at, _)| now.duration_since(*at) < PROGRESS_GRACE);
        // What arrived for this call before its route: delivered now, in order.
        let early: Vec<ProgressNotificationParam> = {
            let mut early = Vec::new();
            routes.unrouted.retain(|(_, params)| {
                let mine = params.progress_token == token;
                if mine {
                    early.push(params.clone());
                }
                !mine
            });
            early
        };
        routes.listeners.insert(token.clone(), ProgressEntry { listener: Arc::clone(&listener), answered: None });
        drop(routes);
        for params in &early {
            listener(params);
        }
        ProgressRoute { notifications: Arc::clone(self), token }
    }

    /// A progress notification: to its call's listener, or kept until
    /// that call's route is set (see `ProgressRoutes::unrouted`).
    pub fn progress_arrived(&self, params: &ProgressNotificationParam) {
        let listener = {
            let mut routes = self.progress.lock_unpoisoned();
            match routes.listeners.get(&params.progress_token) {
                Some(entry) => {
                    entry.answered.is_none_or(|at| at.elapsed() < PROGRESS_GRACE).then(|| Arc::clone(&entry.listener))
                }
                None => {
                    // Its route may not be set yet: keep it for a moment.
                    if routes.unrouted.len() >= MAX_UNROUTED {
                        routes.unrouted.pop_front();
                    }
                    routes.unrouted.push_back((std::time::Instant::now(), params.clone()));
                    None
                }
            }
        };
        if let Some(listener) = listener {
            listener(params);
        }
    }

    /// Whether the server said its tools changed since the last call; clears
    /// the mark.
    pub fn take_tools_changed(&self) -> bool {
        self.tools_changed.swap(false, Ordering::AcqRel)
    }

    /// Marks the tools as changed (a notification, or a restart).
    pub fn mark_tools_changed(&self) {
        self.tools_changed.store(true, Ordering::Release);
    }

    /// Whether a change is marked, without clearing it.
    pub fn tools_changed(&self) -> bool {
        self.tools_changed.load(Ordering::Acquire)
    }
}

/// A progress token in use; dropping it stops the routing.
pub struct ProgressRoute {
    notifications: Arc<Notifications>,
    token: ProgressToken,
}

impl Drop for ProgressRoute {
    /// The route stays open for [`PROGRESS_GRACE`] more.
    fn drop(&mut self) {
        let mut routes = self.notifications.progress.lock_unpoisoned();
        let now = std::time::Instant::now();
        if let Some(entry) = routes.listeners.get_mut(&self.token) {
            entry.answered = Some(now);
            routes.answered.push_back((now, self.token.clone()));
        }
    }
}

/// The client side of one connection: who we are, and where notifications go.
#[derive(Clone)]
struct ClientSide {
    notifications: Arc<Notifications>,
}

impl ClientHandler for ClientSide {
    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        self.notifications.progress_arrived(&params);
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.notifications.mark_tools_changed();
    }

    fn get_info(&self) -> ClientConfig {
        // The tasks extension: a server may answer a long tools/call with a
        // task, which the bridge follows (see [`follow_task`]).
        let capabilities = ClientCapabilities::builder().enable_tasks().build();
        ClientConfig::new(capabilities, Implementation::new("goondan-rs", env!("CARGO_PKG_VERSION")))
    }
}

/// A running server.
pub struct Connection {
    service: RunningService<RoleClient, ClientSide>,
    peer: Peer<RoleClient>,
    /// The stdio server's process; `None` for an HTTP server.
    child: Option<GroupChild>,
    /// The subscription to the server's tool list changes, if one is open:
    /// it lives as long as the connection.
    tool_changes: Option<AbortOnDrop>,
}

/// A task that lives as long as its owner: aborted when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The server process; dropping it kills its whole process group
/// (`kill_on_drop` reaches the leader only, and servers started through
/// `npx` or a shell are several processes).
struct GroupChild(Child);

impl Drop for GroupChild {
    fn drop(&mut self) {
        // While the leader is unreaped its pid, and so the group id, cannot
        // be reused.
        if let Some(pid) = self.0.id().and_then(|pid| i32::try_from(pid).ok()) {
            let pid = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
            // Wait (briefly: it was SIGKILLed) until the leader has exited,
            // without reaping it: the child's own drop then finds it exited
            // and reaps it, rather than leaving it to the runtime's orphan
            // queue, which nothing drains once the runtime is gone (an
            // ending process would leave a zombie for its parent).
            let flags = nix::sys::wait::WaitPidFlag::WEXITED | nix::sys::wait::WaitPidFlag::WNOWAIT;
            while nix::sys::wait::waitid(nix::sys::wait::Id::Pid(pid), flags) == Err(nix::errno::Errno::EINTR) {}
        }
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("pid", &self.child.as_ref().and_then(|c| c.0.id())).finish_non_exhaustive()
    }
}

impl Connection {
    /// Whether the connection is closed (the server exited).
    pub fn is_closed(&self) -> bool {
        self.service.is_closed()
    }

    /// The SDK's peer, for requests of its own (benchmarks, tests).
    pub fn peer(&self) -> &Peer<RoleClient> {
        &self.peer
    }

    /// On the 2026-07-28 revision a server sends
    /// `notifications/tools/list_changed` only on a subscription: when the
    /// server says its list changes, one is opened for the connection's
    /// life, so a changed list is noted as over `initialize`.
    fn listen_for_tool_changes(&mut self, notifications: Arc<Notifications>) {
        let Some(info) = self.peer.peer_info() else { return };
        let modern = info.protocol_version == ProtocolVersion::V_2026_07_28;
        let changes = info.capabilities.tools.as_ref().and_then(|tools| tools.list_changed) == Some(true);
        if !modern || !changes {
            return;
        }
        let peer = self.peer.clone();
        self.tool_changes = Some(AbortOnDrop(tokio::spawn(async move {
            let mut subscription = match peer.listen(SubscriptionFilter::builder().tools_list_changed().build()).await {
                Ok(subscription) => subscription,
                Err(error) => {
                    tracing::debug!("cannot subscribe to the server's tool list changes: {error}");
                    return;
                }
            };
            while let Ok(Some(notification)) = subscription.next().await {
                if matches!(notification, ServerNotification::ToolListChangedNotification(_)) {
                    notifications.mark_tools_changed();
                }
            }
        })));
    }
}

/// Connects to `spec`: runs the MCP handshake and lists the server's tools.
pub async fn connect(
    server: &str,
    spec: &ServerConfig,
    notifications: &Arc<Notifications>,
) -> Result<(Connection, Vec<Tool>), ClientError> {
    connect_in(server, spec, notifications, None).await
}

/// [`connect`], a stdio server confined in `sandbox`.
async fn connect_in(
    server: &str,
    spec: &ServerConfig,
    notifications: &Arc<Notifications>,
    sandbox: Option<&goondan_sandbox::Sandbox>,
) -> Result<(Connection, Vec<Tool>), ClientError> {
    let client = ClientSide { notifications: Arc::clone(notifications) };
    match spec {
        ServerConfig::Stdio(spec) => match connect_stdio(server, spec, client.clone(), sandbox, lifecycle()).await {
            // A server that answered `server/discover` only after the SDK's
            // 10 s: started again, waiting for that answer as long as the
            // start may take; one that then says it does not know
            // `server/discover` (an older revision) once more with
            // `initialize`.
            Err(ClientError::LateDiscoverAnswer(why)) => {
                tracing::warn!(server, "MCP server slow to start ({why}); starting it again");
                let discover =
                    ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
                match connect_stdio(server, spec, client.clone(), sandbox, discover).await {
                    Err(ClientError::Protocol(why)) => {
                        tracing::info!(server, "server/discover refused ({why}); starting it with initialize");
                        connect_stdio(server, spec, client, sandbox, ClientLifecycleMode::Initialize).await
                    }
                    done => done,
                }
            }
            done => done,
        },
        ServerConfig::Http(spec) => connect_http(spec, client).await,
    }
}

/// Spawns a stdio server. The child inherits this process's environment,
/// plus the config's `env`.
async fn connect_stdio(
    server: &str,
    spec: &StdioServer,
    client: ClientSide,
    sandbox: Option<&goondan_sandbox::Sandbox>,
    lifecycle: ClientLifecycleMode,
) -> Result<(Connection, Vec<Tool>), ClientError> {
    let mut command = Command::new(&spec.command);
    command
        .args(&spec.args)
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(cwd) = &spec.cwd {
        command.current_dir(cwd);
    }
    if let Some(sandbox) = sandbox {
        sandbox
            .confine(command.as_std_mut())
            .map_err(|e| ClientError::Spawn { command: spec.command.clone(), message: e.to_string() })?;
    }
    let mut child = GroupChild(
        command.spawn().map_err(|e| ClientError::Spawn { command: spec.command.clone(), message: e.to_string() })?,
    );
    let tail = Arc::new(StdMutex::new(VecDeque::with_capacity(STDERR_TAIL_LINES)));
    // Kept only to read the last lines of a failed start: the reader ends
    // by itself at the end of stderr, when the server's group is killed.
    let stderr_done =
        child.0.stderr.take().map(|stderr| tokio::spawn(log_stderr(server.to_owned(), stderr, Arc::clone(&tail))));
    let notifications = Arc::clone(&client.notifications);
    let (Some(stdout), Some(stdin)) = (child.0.stdout.take(), child.0.stdin.take()) else {
        return Err(ClientError::Protocol("the child's standard streams are not available".to_owned()));
    };
    let serving = async move {
        client.serve_with_lifecycle((client_stream(stdout), stdin), lifecycle).await.map_err(|error| match error {
            // The late answer to `server/discover` (id 0) where the answer
            // to `initialize` was awaited: a result, or an older
            // revision's error.
            rmcp::service::ClientInitializeError::ConflictInitResponseId(..)
            | rmcp::service::ClientInitializeError::UncorrelatedErrorResponse { .. } => {
                ClientError::LateDiscoverAnswer(error.to_string())
            }
            other => other.into(),
        })
    };
    match handshake(serving).await {
        Ok((service, tools)) => {
            let peer = service.peer().clone();
            let mut connection = Connection { service, peer, child: Some(child), tool_changes: None };
            connection.listen_for_tool_changes(Arc::clone(&notifications));
            Ok((connection, tools))
        }
        Err(ClientError::Protocol(error)) => {
            // A process that exited says more through its status and the
            // last lines it wrote to stderr (read to the end first).
            let exited = match child.0.try_wait() {
                Ok(Some(status)) => Some(status),
                _ => None,
            };
            if let (Some(_), Some(done)) = (exited, stderr_done) {
                let _ = tokio::time::timeout(Duration::from_secs(1), done).await;
            }
            let said: Vec<String> = tail.lock_unpoisoned().iter().cloned().collect();
            let mut message = match exited {
                Some(status) => format!("exited during startup ({status}): {error}"),
                None => error,
            };
            if !said.is_empty() {
                message.push_str("; its stderr ends with: ");
                message.push_str(&said.join(" | "));
            }
            Err(ClientError::Protocol(message))
        }
        Err(other) => Err(other),
    }
}

/// Connects to a streamable-HTTP server with the config's headers.
async fn connect_http(spec: &HttpServer, client: ClientSide) -> Result<(Connection, Vec<Tool>), ClientError> {
    let http = http_client().map_err(|e| ClientError::Protocol(format!("cannot set up the HTTP client: {e}")))?;
    let mut headers = HashMap::with_capacity(spec.headers.len());
    for (name, value) in &spec.headers {
        let header = reqwest::header::HeaderName::try_from(name.as_str())
            .map_err(|e| ClientError::Protocol(format!("header '{name}': {e}")))?;
        // The value may be a secret: the error names the header only.
        let mut value = reqwest::header::HeaderValue::try_from(value.as_str())
            .map_err(|_| ClientError::Protocol(format!("header '{name}' has a value that cannot be sent")))?;
        value.set_sensitive(true);
        headers.insert(header, value);
    }
    let config = StreamableHttpClientTransportConfig::with_uri(spec.url.as_str()).custom_headers(headers);
    let notifications = Arc::clone(&client.notifications);
    let transport = StreamableHttpClientTransport::with_client(http.clone(), config.clone());
    let (service, tools) = match handshake(client.clone().serve_with_lifecycle(transport, lifecycle())).await {
        Ok(started) => started,
        // An HTTP server of an older revision may refuse `server/discover`
        // with an HTTP status rather than a JSON-RPC error (which the SDK
        // takes as "legacy"): the handshake of those revisions again, on a
        // new transport.
        Err(ClientError::Protocol(why)) => {
            tracing::debug!("MCP server at {}: server/discover failed ({why}); trying initialize", spec.url);
            let transport = StreamableHttpClientTransport::with_client(http, config);
            handshake(client.serve(transport)).await?
        }
        Err(other) => return Err(other),
    };
    let peer = service.peer().clone();
    let mut connection = Connection { service, peer, child: None, tool_changes: None };
    connection.listen_for_tool_changes(notifications);
    Ok((connection, tools))
}

/// How a connection starts: `server/discover` of the 2026-07-28 revision
/// (whose tasks extension lets a server answer a long call with a task),
/// and the `initialize` handshake for a server that does not know it (a
/// JSON-RPC error to `server/discover`, or no answer within the SDK's 10 s).
fn lifecycle() -> ClientLifecycleMode {
    ClientLifecycleMode::Auto { preferred_versions: vec![ProtocolVersion::V_2026_07_28], legacy_version: None }
}

/// Runs the handshake `serving` does, then lists the tools, within
/// [`STARTUP_TIMEOUT`].
async fn handshake<E: Into<ClientError>>(
    serving: impl Future<Output = Result<RunningService<RoleClient, ClientSide>, E>>,
) -> Result<(RunningService<RoleClient, ClientSide>, Vec<Tool>), ClientError> {
    let started = tokio::time::timeout(STARTUP_TIMEOUT, async {
        let service = serving.await.map_err(Into::into)?;
        let tools = service.peer().list_all_tools().await.map_err(|e| ClientError::Protocol(e.to_string()))?;
        Ok::<_, ClientError>((service, tools))
    })
    .await;
    started.unwrap_or(Err(ClientError::Timeout))
}

/// The SDK's handshake errors, as their text.
impl From<rmcp::service::ClientInitializeError> for ClientError {
    fn from(error: rmcp::service::ClientInitializeError) -> Self {
        Self::Protocol(error.to_string())
    }
}

/// An HTTPS client ([`goondan_core::tls`]); no system proxy.
fn http_client() -> Result<reqwest::Client, String> {
    goondan_core::tls::client_builder(SystemProxy::Ignored)
        .map_err(|e| e.to_string())?
        .build()
        .map_err(|e| e.to_string())
}

/// Logs the server's stderr and keeps its last lines for a failed start.
async fn log_stderr(server: String, stderr: ChildStderr, tail: Arc<StdMutex<VecDeque<String>>>) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::debug!(target: "goondan_mcp::server", server = %server, "{line}");
        let mut tail = tail.lock_unpoisoned();
        if tail.len() == STDERR_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }
}

/// A server's answer to `tools/call`: its result, or (the tasks extension)
/// a task that runs on and is followed with [`follow_task`].
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The call's result.
    Complete(CallToolResult),
    /// The task the server runs the call as.
    Task(Task),
}

/// Calls a tool on `connection` and returns its result, following the
/// task the server may run it as to its end (see [`call_tool_answer`]).
pub async fn call_tool(
    connection: &Connection,
    notifications: &Arc<Notifications>,
    params: CallToolRequestParams,
    progress: Option<ProgressListener>,
) -> (Result<CallToolResult, ClientError>, Option<ProgressRoute>) {
    let (answered, route) = call_tool_answer(connection, notifications, params, progress, None).await;
    let result = match answered {
        Ok(Answer::Complete(result)) => Ok(result),
        Ok(Answer::Task(task)) => match follow_task(connection, task, std::future::pending()).await {
            TaskOutcome::Completed(result) => Ok(result),
            TaskOutcome::Exited => Err(ClientError::Exited),
            other => Err(ClientError::Request(other.reason())),
        },
        Err(error) => Err(error),
    };
    (result, route)
}

/// Calls a tool on `connection`; with `progress`, the server's progress
/// notifications for the call go to that listener while the returned route
/// is kept. Dropping the future before the answer cancels the request on
/// the server (`notifications/cancelled`).
pub async fn call_tool_answer(
    connection: &Connection,
    notifications: &Arc<Notifications>,
    params: CallToolRequestParams,
    progress: Option<ProgressListener>,
    traceparent: Option<&str>,
) -> (Result<Answer, ClientError>, Option<ProgressRoute>) {
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    let mut options = PeerRequestOptions::no_options();
    if let Some(traceparent) = traceparent {
        // W3C trace context in the request's `_meta`, as MCP's
        // OpenTelemetry convention has it: the server's spans continue the
        // calling tool's.
        let mut meta = rmcp::model::RequestMetaObject::new();
        meta.0.insert("traceparent".to_owned(), serde_json::Value::String(traceparent.to_owned()));
        options.meta = Some(meta);
    }
    // The SDK gives every request a progress token of its own; the handle
    // says which. Progress that beats the route is kept until it is set.
    let handle = match connection.peer.send_request_with_option(request, options).await {
        Ok(handle) => handle,
        Err(error) => return (Err(request_error(connection, &error)), None),
    };
    let route = progress.map(|listener| notifications.listen(handle.progress_token.clone(), listener));
    let abandoned = {
        let (peer, id) = (connection.peer.clone(), handle.id.clone());
        let reason = "the caller stopped waiting (the tool call timed out or its turn was cancelled)".to_owned();
        NoticeOnDrop::armed(async move {
            if let Err(error) = peer.notify_cancelled(CancelledNotificationParam::new(Some(id), Some(reason))).await {
                tracing::debug!("cannot send notifications/cancelled: {error}");
            }
        })
    };
    let answered = handle.await_response().await;
    abandoned.disarm();
    let result = match answered {
        Ok(ServerResult::CallToolResult(result)) => Ok(Answer::Complete(result)),
        Ok(ServerResult::CreateTaskResult(created)) => Ok(Answer::Task(created.task)),
        Ok(ServerResult::InputRequiredResult(_)) => Err(ClientError::Request(INPUT_REQUIRED.to_owned())),
        Ok(_) => Err(ClientError::Request("the server answered tools/call with another kind of result".to_owned())),
        Err(error) => Err(request_error(connection, &error)),
    };
    (result, route)
}

/// Why a task that asks for input is ended: nobody here answers it.
pub const INPUT_REQUIRED: &str = "the MCP server asked for input, which goondan-rs does not answer";

/// The shortest wait between two `tasks/get` of a task, whatever the
/// server's `pollIntervalMs`.
pub const MIN_TASK_POLL: Duration = Duration::from_millis(50);
/// The longest wait between two `tasks/get`.
pub const MAX_TASK_POLL: Duration = Duration::from_secs(5);
/// The wait when the server names none.
pub const DEFAULT_TASK_POLL: Duration = Duration::from_millis(500);
/// How long `tasks/cancel` may take before the bridge stops waiting for
/// its acknowledgement.
const TASK_CANCEL_WAIT: Duration = Duration::from_secs(5);

/// How a server's task ended, as [`follow_task`] saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskOutcome {
    /// With the call's result (an `isError` one too).
    Completed(CallToolResult),
    /// Without one: the server's JSON-RPC error, or why the bridge gave up
    /// on it (its ttl passed, `tasks/get` failed).
    Failed(String),
    /// The server cancelled it.
    Cancelled,
    /// The caller cancelled it (`tasks/cancel` was sent).
    CancelledHere,
    /// It asked for input (`input_required`); `tasks/cancel` was sent.
    InputRequired,
    /// The connection closed (the server exited) while it ran.
    Exited,
}

impl TaskOutcome {
    /// Why it did not complete, in words.
    pub fn reason(&self) -> String {
        match self {
            Self::Completed(_) => "completed".to_owned(),
            Self::Failed(reason) => reason.clone(),
            Self::Cancelled => "the MCP server cancelled the task".to_owned(),
            Self::CancelledHere => "cancelled".to_owned(),
            Self::InputRequired => INPUT_REQUIRED.to_owned(),
            Self::Exited => ClientError::Exited.to_string(),
        }
    }
}

/// The wait before the next `tasks/get`: the server's `pollIntervalMs`
/// within [`MIN_TASK_POLL`]..[`MAX_TASK_POLL`].
pub fn task_poll_interval(poll_interval_ms: Option<u64>) -> Duration {
    poll_interval_ms.map_or(DEFAULT_TASK_POLL, Duration::from_millis).clamp(MIN_TASK_POLL, MAX_TASK_POLL)
}

/// Follows the server's `task` to its end: `tasks/get` every
/// `pollIntervalMs` (see [`task_poll_interval`]) until it is final, up to
/// its `ttlMs` (counted from when its creation reached us; none: no limit).
/// When `cancelled` completes first, or the task asks for input, or its ttl
/// passes, `tasks/cancel` is sent. Dropping the future sends it too.
pub async fn follow_task(connection: &Connection, task: Task, cancelled: impl Future<Output = ()>) -> TaskOutcome {
    tokio::pin!(cancelled);
    let task_id = task.task_id.clone();
    let seen = Instant::now();
    // `tasks/cancel` if the follower stops before the task's end (the
    // executor's deadline, a cancelled turn).
    let guard = {
        let (peer, task_id) = (connection.peer.clone(), task_id.clone());
        NoticeOnDrop::armed(async move { cancel_task(&peer, task_id).await })
    };
    let mut ttl = task.ttl_ms;
    let mut wait = if task.status.is_terminal() { Duration::ZERO } else { task_poll_interval(task.poll_interval_ms) };
    let outcome = loop {
        let expires = ttl.map(|ms| seen + Duration::from_millis(ms));
        let wake = expires.map_or(Instant::now() + wait, |at| at.min(Instant::now() + wait));
        tokio::select! {
            () = &mut cancelled => break TaskOutcome::CancelledHere,
            () = tokio::time::sleep_until(wake) => {}
        }
        if let (Some(at), Some(ms)) = (expires, ttl)
            && Instant::now() >= at
        {
            break TaskOutcome::Failed(format!("the task did not end within its ttl of {ms} ms"));
        }
        let got = tokio::select! {
            () = &mut cancelled => break TaskOutcome::CancelledHere,
            got = connection.peer.get_task(GetTaskParams::new(task_id.clone())) => got,
        };
        let detailed = match got {
            Ok(got) => got.task,
            Err(error) if connection.is_closed() || is_closed_error(&error) => break TaskOutcome::Exited,
            Err(error) => break TaskOutcome::Failed(format!("tasks/get failed: {error}")),
        };
        ttl = detailed.task.ttl_ms;
        wait = task_poll_interval(detailed.task.poll_interval_ms);
        match detailed.payload {
            TaskPayload::Completed { result } => {
                break match serde_json::from_value::<CallToolResult>(serde_json::Value::Object(result)) {
                    Ok(result) => TaskOutcome::Completed(result),
                    Err(error) => TaskOutcome::Failed(format!("the task's result is not a tools/call result: {error}")),
                };
            }
            TaskPayload::Failed { error } => break TaskOutcome::Failed(task_error(&error)),
            TaskPayload::Cancelled => break TaskOutcome::Cancelled,
            TaskPayload::InputRequired { .. } => break TaskOutcome::InputRequired,
            // Working, or a state newer than this build: ask again.
            _ => {}
        }
    };
    match outcome {
        // The task has ended, or the connection with it.
        TaskOutcome::Completed(_) | TaskOutcome::Cancelled | TaskOutcome::Exited => guard.disarm(),
        TaskOutcome::Failed(_) | TaskOutcome::InputRequired | TaskOutcome::CancelledHere => {
            guard.disarm();
            cancel_task(&connection.peer, task_id).await;
        }
    }
    outcome
}

/// The reason of a failed task: its JSON-RPC error's message and code.
fn task_error(error: &serde_json::Map<String, serde_json::Value>) -> String {
    let message = error.get("message").and_then(|m| m.as_str()).unwrap_or("the task failed");
    match error.get("code").and_then(serde_json::Value::as_i64) {
        Some(code) => format!("{message} (JSON-RPC error {code})"),
        None => message.to_owned(),
    }
}

/// Sends `tasks/cancel`, waiting at most [`TASK_CANCEL_WAIT`] for the
/// acknowledgement (cancellation is cooperative: the server may still end
/// the task otherwise).
async fn cancel_task(peer: &Peer<RoleClient>, task_id: String) {
    let cancel = peer.cancel_task(CancelTaskParams::new(task_id.clone()));
    match tokio::time::timeout(TASK_CANCEL_WAIT, cancel).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::debug!("tasks/cancel of '{task_id}' failed: {error}"),
        Err(_) => tracing::debug!("tasks/cancel of '{task_id}' was not acknowledged in time"),
    }
}

/// Tells the server what the caller abandoned (a request it stopped
/// waiting for, a task it stopped following) if dropped before
/// [`disarm`](Self::disarm): the notice runs on the current runtime, fire
/// and forget — a drop cannot wait, and the notice is one send on a
/// connection that ends with its server.
struct NoticeOnDrop<F: Future<Output = ()> + Send + 'static> {
    notice: Option<F>,
}

impl<F: Future<Output = ()> + Send + 'static> NoticeOnDrop<F> {
    fn armed(notice: F) -> Self {
        Self { notice: Some(notice) }
    }

    /// The caller saw the end: nothing to tell.
    fn disarm(mut self) {
        self.notice = None;
    }
}

impl<F: Future<Output = ()> + Send + 'static> Drop for NoticeOnDrop<F> {
    fn drop(&mut self) {
        let Some(notice) = self.notice.take() else { return };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(notice);
        }
    }
}

fn request_error(connection: &Connection, error: &ServiceError) -> ClientError {
    if connection.is_closed() || is_closed_error(error) {
        ClientError::Exited
    } else {
        ClientError::Request(error.to_string())
    }
}

fn is_closed_error(error: &ServiceError) -> bool {
    matches!(error, ServiceError::TransportClosed | ServiceError::TransportSend(_) | ServiceError::Cancelled { .. })
}

struct Slot {
    connection: Option<Arc<Connection>>,
    failures: u32,
    next_start: Instant,
    /// The tools a restarted server listed, until the catalog takes them.
    relisted: Option<Vec<Tool>>,
}

/// A configured server and its current connection, shared by its tools'
/// handlers.
pub struct Server {
    name: String,
    spec: ServerConfig,
    notifications: Arc<Notifications>,
    slot: Mutex<Slot>,
    /// The sandbox a stdio server runs in (its config's `sandbox`).
    sandbox: Option<Arc<goondan_sandbox::Sandbox>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Server {
    /// Whether it is reached over HTTP (it is not this process's child: its
    /// tasks outlive this process).
    pub fn is_remote(&self) -> bool {
        matches!(self.spec, ServerConfig::Http(_))
    }

    /// Starts the server; returns it with its tools.
    pub async fn start(name: &str, spec: ServerConfig) -> Result<(Arc<Self>, Vec<Tool>), ClientError> {
        Self::start_in(name, spec, None).await
    }

    /// Starts the server, a stdio one confined in `sandbox` (at every
    /// restart too); returns it with its tools.
    pub async fn start_in(
        name: &str,
        spec: ServerConfig,
        sandbox: Option<Arc<goondan_sandbox::Sandbox>>,
    ) -> Result<(Arc<Self>, Vec<Tool>), ClientError> {
        let notifications = Arc::new(Notifications::default());
        let (connection, tools) = connect_in(name, &spec, &notifications, sandbox.as_deref()).await?;
        let slot =
            Slot { connection: Some(Arc::new(connection)), failures: 0, next_start: Instant::now(), relisted: None };
        Ok((Arc::new(Self { name: name.to_owned(), spec, notifications, slot: Mutex::new(slot), sandbox }), tools))
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the server's notifications go.
    pub fn notifications(&self) -> &Arc<Notifications> {
        &self.notifications
    }

    /// The live connection, restarting the server when it died and its
    /// backoff has passed.
    pub async fn connection(&self) -> Result<Arc<Connection>, ClientError> {
        let mut slot = self.slot.lock().await;
        if let Some(connection) = slot.connection.as_ref().filter(|c| !c.is_closed()) {
            return Ok(Arc::clone(connection));
        }
        if slot.connection.take().is_some() {
            tracing::warn!("MCP server '{}' exited; restarting it", self.name);
        }
        let now = Instant::now();
        if now < slot.next_start {
            return Err(ClientError::BackingOff(slot.next_start - now));
        }
        // Boxed: a (re)start is rare and its future large, and every call's
        // future would otherwise carry (and copy) its size.
        match Box::pin(connect_in(&self.name, &self.spec, &self.notifications, self.sandbox.as_deref())).await {
            Ok((connection, tools)) => {
                // The new process may offer other tools: the catalog takes
                // them at the next step.
                let connection = Arc::new(connection);
                slot.connection = Some(Arc::clone(&connection));
                slot.failures = 0;
                slot.relisted = Some(tools);
                Ok(connection)
            }
            Err(error) => {
                slot.failures = slot.failures.saturating_add(1);
                let backoff = restart_backoff(slot.failures);
                slot.next_start = Instant::now() + backoff;
                tracing::warn!("MCP server '{}' failed to restart: {error}", self.name);
                Err(error)
            }
        }
    }

    /// The server's tools when they may have changed since the catalog last
    /// took them (a `tools/list_changed` notification, or a restart);
    /// `Ok(None)` when nothing changed. A failed listing keeps the change
    /// marked, so the next step tries again.
    pub async fn changed_tools(&self) -> Result<Option<Vec<Tool>>, ClientError> {
        if self.notifications.take_tools_changed() {
            let listed = async {
                let connection = self.connection().await?;
                connection.peer.list_all_tools().await.map_err(|e| ClientError::Request(e.to_string()))
            };
            return match listed.await {
                Ok(tools) => {
                    self.slot.lock().await.relisted = None;
                    Ok(Some(tools))
                }
                Err(error) => {
                    self.notifications.mark_tools_changed();
                    Err(error)
                }
            };
        }
        Ok(self.slot.lock().await.relisted.take())
    }

    /// Whether [`Server::changed_tools`] may have something to say: a cheap
    /// check for every step.
    pub fn may_have_changed(&self) -> bool {
        self.notifications.tools_changed() || self.slot.try_lock().map_or(true, |slot| slot.relisted.is_some())
    }

    /// Forgets a connection that died, so the next call restarts the server
    /// even if the SDK has not noticed the close yet.
    pub async fn forget(&self, dead: &Arc<Connection>) {
        let mut slot = self.slot.lock().await;
        if slot.connection.as_ref().is_some_and(|current| Arc::ptr_eq(current, dead)) {
            slot.connection = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt as _;

    fn progress(token: &str, n: f64) -> Result<ProgressNotificationParam, serde_json::Error> {
        serde_json::from_value(serde_json::json!({"progressToken": token, "progress": n}))
    }

    #[test]
    fn progress_that_beats_its_route_is_delivered_when_the_route_is_set() -> Result<(), serde_json::Error> {
        let notifications = Arc::new(Notifications::default());
        // Two arrive before the call's route, one for a call nobody routes.
        notifications.progress_arrived(&progress("call-1", 1.0)?);
        notifications.progress_arrived(&progress("other", 9.0)?);
        notifications.progress_arrived(&progress("call-1", 2.0)?);
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let listener: ProgressListener =
            Arc::new(move |p: &ProgressNotificationParam| sink.lock_unpoisoned().push(p.progress));
        let token = progress("call-1", 0.0)?.progress_token;
        let route = notifications.listen(token, listener);
        notifications.progress_arrived(&progress("call-1", 3.0)?);
        assert_eq!(*seen.lock_unpoisoned(), [1.0, 2.0, 3.0]);
        drop(route);
        Ok(())
    }

    /// What a reader of `input` through a [`BoundedLines`] of `limit` gets
    /// (or its error), fed in pieces of `piece` bytes.
    async fn through(
        input: &[u8],
        limit: usize,
        oversized: Oversized,
        close: bool,
        piece: usize,
    ) -> Result<String, String> {
        let (mut writer, reader) = tokio::io::duplex(1 << 20);
        let input = input.to_vec();
        let feeding = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt as _;
            for chunk in input.chunks(piece) {
                if writer.write_all(chunk).await.is_err() {
                    return;
                }
            }
        });
        let mut out = Vec::new();
        let read = BoundedLines::new(reader, limit, oversized, close).read_to_end(&mut out).await;
        let _ = feeding.await;
        read.map(|_| String::from_utf8_lossy(&out).into_owned()).map_err(|e| e.to_string())
    }

    #[tokio::test]
    async fn lines_over_the_limit_are_answered_by_id_and_the_stream_stays_in_step() {
        let big = "x".repeat(100);
        let input = format!(
            "{{\"id\":1,\"result\":\"ok\"}}\n{{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":\"{big}\"}}\n{{\"result\":{{\"id\":9,\"text\":\"{big}\"}},\"id\":\"a\\\"b\"}}\n{{\"id\":2}}\n"
        );
        for piece in [1, 7, 64, 4096] {
            let out =
                through(input.as_bytes(), 48, client_oversized, true, piece).await.unwrap_or_else(|e| panic!("{e}"));
            let lines: Vec<serde_json::Value> =
                out.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))).collect();
            assert_eq!(lines.len(), 4, "{out}");
            assert_eq!(lines[0], serde_json::json!({"id": 1, "result": "ok"}));
            // The id came first: answered at once. The nested `id` 9 is not the message's.
            assert_eq!(lines[1]["id"], 7);
            assert_eq!(lines[1]["error"]["code"], -32603);
            assert!(lines[1]["error"]["message"].as_str().is_some_and(|m| m.contains("limit of 48 bytes")), "{out}");
            assert_eq!(lines[2]["id"], "a\"b");
            assert_eq!(lines[3], serde_json::json!({"id": 2}));
        }
    }

    #[tokio::test]
    async fn without_an_id_the_client_closes_the_stream_and_the_server_drops_the_line() {
        let input = format!("{{\"method\":\"note\",\"params\":\"{}\"}}\n{{\"id\":3}}\n", "y".repeat(100));
        let closed = through(input.as_bytes(), 48, client_oversized, true, 16).await;
        assert!(closed.is_err_and(|e| e.contains("exceeds the limit of 48 bytes")));
        let dropped = through(input.as_bytes(), 48, |_, _| None, false, 16).await;
        assert_eq!(dropped.as_deref(), Ok("{\"id\":3}\n"));
    }

    #[test]
    fn a_tasks_poll_interval_is_the_servers_within_bounds() {
        assert_eq!(task_poll_interval(Some(300)), Duration::from_millis(300));
        assert_eq!(task_poll_interval(Some(0)), MIN_TASK_POLL);
        assert_eq!(task_poll_interval(Some(3_600_000)), MAX_TASK_POLL);
        assert_eq!(task_poll_interval(None), DEFAULT_TASK_POLL);
    }

    #[test]
    fn restart_backoff_doubles_with_jitter_up_to_the_cap() {
        for _ in 0..20 {
            for (failures, base) in [(1, RESTART_BACKOFF), (2, RESTART_BACKOFF * 2), (4, RESTART_BACKOFF * 8)] {
                let wait = restart_backoff(failures);
                assert!(wait >= base && wait <= base * 2, "{failures}: {wait:?}");
            }
            assert_eq!(restart_backoff(20), MAX_RESTART_BACKOFF);
            assert_eq!(restart_backoff(u32::MAX), MAX_RESTART_BACKOFF);
        }
    }
}
