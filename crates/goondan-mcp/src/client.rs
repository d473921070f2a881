//! One MCP server connection: a stdio child process with an `rmcp` client on
//! its standard input and output.
//!
//! The child is spawned here rather than through the SDK's child-process
//! transport so that it runs in a process group of its own (servers started
//! through `npx` or a shell are several processes, and a stop must reach all
//! of them) and is killed when the connection is dropped. Its standard error
//! is logged line by line under the server's name.
//!
//! A [`Server`] keeps the connection for the handlers of its tools and
//! restarts it, with backoff, for the first call after it died.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, Tool};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::{Peer, ServiceExt};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::config::StdioServer;

/// How long a server has to start, answer `initialize` and list its tools.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The first wait before restarting a server that died; it doubles with
/// every failed start up to [`MAX_RESTART_BACKOFF`].
pub const RESTART_BACKOFF: Duration = Duration::from_millis(250);

/// The longest wait between restarts.
pub const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(30);

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

/// A running server.
pub struct Connection {
    service: RunningService<RoleClient, ()>,
    peer: Peer<RoleClient>,
    child: GroupChild,
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
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("pid", &self.child.0.id()).finish_non_exhaustive()
    }
}

impl Connection {
    /// Whether the connection is closed (the server exited).
    pub fn is_closed(&self) -> bool {
        self.service.is_closed()
    }
}

/// Spawns `spec`, runs the MCP handshake and lists the server's tools.
///
/// The child inherits this process's environment, plus the config's `env`.
pub async fn connect(server: &str, spec: &StdioServer) -> Result<(Connection, Vec<Tool>), ClientError> {
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
    let mut child = GroupChild(
        command.spawn().map_err(|e| ClientError::Spawn { command: spec.command.clone(), message: e.to_string() })?,
    );
    let tail = Arc::new(StdMutex::new(VecDeque::with_capacity(STDERR_TAIL_LINES)));
    let stderr_done =
        child.0.stderr.take().map(|stderr| tokio::spawn(log_stderr(server.to_owned(), stderr, Arc::clone(&tail))));
    let (Some(stdout), Some(stdin)) = (child.0.stdout.take(), child.0.stdin.take()) else {
        return Err(ClientError::Protocol("the child's standard streams are not available".to_owned()));
    };
    let started = tokio::time::timeout(STARTUP_TIMEOUT, async {
        let service = ().serve((stdout, stdin)).await.map_err(|e| ClientError::Protocol(e.to_string()))?;
        let tools = service.peer().list_all_tools().await.map_err(|e| ClientError::Protocol(e.to_string()))?;
        Ok::<_, ClientError>((service, tools))
    })
    .await;
    let (service, tools) = match started {
        Ok(Ok(started)) => started,
        Ok(Err(error)) => {
            // A process that exited says more through its status and the
            // last lines it wrote to stderr (read to the end first).
            let exited = match child.0.try_wait() {
                Ok(Some(status)) => Some(status),
                _ => None,
            };
            if let (Some(_), Some(done)) = (exited, stderr_done) {
                let _ = tokio::time::timeout(Duration::from_secs(1), done).await;
            }
            let said: Vec<String> = tail.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect();
            let mut message = match exited {
                Some(status) => format!("exited during startup ({status}): {error}"),
                None => error.to_string(),
            };
            if !said.is_empty() {
                message.push_str("; its stderr ends with: ");
                message.push_str(&said.join(" | "));
            }
            return Err(ClientError::Protocol(message));
        }
        Err(_) => return Err(ClientError::Timeout),
    };
    let peer = service.peer().clone();
    Ok((Connection { service, peer, child }, tools))
}

/// Logs the server's stderr and keeps its last lines for a failed start.
async fn log_stderr(server: String, stderr: ChildStderr, tail: Arc<StdMutex<VecDeque<String>>>) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::debug!(target: "goondan_mcp::server", server = %server, "{line}");
        let mut tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
        if tail.len() == STDERR_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }
}

/// Calls a tool on `connection`.
pub async fn call_tool(connection: &Connection, params: CallToolRequestParams) -> Result<CallToolResult, ClientError> {
    match connection.peer.call_tool(params).await {
        Ok(result) => Ok(result),
        Err(error) if connection.is_closed() || is_closed_error(&error) => Err(ClientError::Exited),
        Err(error) => Err(ClientError::Request(error.to_string())),
    }
}

fn is_closed_error(error: &ServiceError) -> bool {
    matches!(error, ServiceError::TransportClosed | ServiceError::TransportSend(_) | ServiceError::Cancelled { .. })
}

struct Slot {
    connection: Option<Arc<Connection>>,
    failures: u32,
    next_start: Instant,
}

/// A configured server and its current connection, shared by its tools'
/// handlers.
pub struct Server {
    name: String,
    spec: StdioServer,
    slot: Mutex<Slot>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Server {
    /// Starts the server; returns it with its tools.
    pub async fn start(name: &str, spec: StdioServer) -> Result<(Arc<Self>, Vec<Tool>), ClientError> {
        let (connection, tools) = connect(name, &spec).await?;
        let slot = Slot { connection: Some(Arc::new(connection)), failures: 0, next_start: Instant::now() };
        Ok((Arc::new(Self { name: name.to_owned(), spec, slot: Mutex::new(slot) }), tools))
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.name
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
        match connect(&self.name, &self.spec).await {
            Ok((connection, _tools)) => {
                // The catalog keeps the tools listed at assembly; a server
                // whose tools changed across a restart answers unknown ones
                // with an error of its own.
                let connection = Arc::new(connection);
                slot.connection = Some(Arc::clone(&connection));
                slot.failures = 0;
                Ok(connection)
            }
            Err(error) => {
                slot.failures = slot.failures.saturating_add(1);
                let backoff = RESTART_BACKOFF
                    .saturating_mul(2_u32.saturating_pow(slot.failures.saturating_sub(1)))
                    .min(MAX_RESTART_BACKOFF);
                slot.next_start = Instant::now() + backoff;
                tracing::warn!("MCP server '{}' failed to restart: {error}", self.name);
                Err(error)
            }
        }
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
