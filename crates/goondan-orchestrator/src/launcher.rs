//! Starting one agent process.
//!
//! The process is the program the launcher names (the `gdn` binary, with
//! its hidden agent subcommand). Its channel to the hub is one end of a
//! socket pair made for this start and handed to it as its standard input:
//! only the spawned child holds it, so no other process can connect in its
//! place, and nothing about the channel (no socket path, no token) is in its
//! environment, where a same-user process could read it from
//! `/proc/<pid>/environ`. The child moves the descriptor off fd 0 at once
//! (its tools never inherit it). Only the orchestrator's pid is in its
//! environment, so that it can check its parent. It starts in a process
//! group of its own, so that Ctrl-C at the terminal reaches only the
//! orchestrator, which decides what to cancel. Its standard output is not
//! used; its standard error is the orchestrator's (its log lines).
//!
//! It never outlives the orchestrator: when the orchestrator's end of the
//! socket closes (it exited, or was killed with SIGKILL: the kernel closes
//! it) the agent process stops, and it also asks the kernel for SIGTERM
//! when its parent dies (`PR_SET_PDEATHSIG`).

use std::ffi::OsString;
use std::fmt;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use goondan_ipc::{AgentInstance, BoxFuture, ErrorInfo, InitPayload, LinkReceiver, LinkSender};
use tokio::net::UnixStream;
use tokio::process::{Child, Command};

/// The orchestrator's pid (the agent process exits if its parent is another).
pub use goondan_ipc::ORCHESTRATOR_PID_ENV;

/// What starts the agent processes of a swarm: [`AgentLauncher`] on this
/// machine, or a transport that places them on other hosts (goondan-nats).
/// The hub sees only this trait, a [`Started`] process and its
/// [`AgentProcess`] handle.
pub trait Launch: Send + Sync + fmt::Debug {
    /// Starts the process for `init.instance` and walks it to `ready`
    /// (`hello`, `init`, `ready`) within `timeout`.
    fn start(&self, init: InitPayload, timeout: Duration) -> BoxFuture<'_, Result<Started, ErrorInfo>>;
}

/// A process that said `ready`: its channel, and the handle the hub
/// supervises it by.
pub struct Started {
    /// Messages to it.
    pub link: LinkSender,
    /// Messages from it, in the order it sent them.
    pub receiver: Box<dyn LinkReceiver>,
    /// Its end and how to stop it.
    pub process: Box<dyn AgentProcess>,
    /// Its pid (on its own host).
    pub pid: u32,
}

impl fmt::Debug for Started {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Started").field("pid", &self.pid).field("process", &self.process).finish_non_exhaustive()
    }
}

/// How a process ended.
#[derive(Debug, Clone, Default)]
pub struct ProcessEnd {
    /// Its wait status, when it is known.
    pub status: Option<ExitStatus>,
    /// Set when the process did not end by itself but its host was lost
    /// (why, for the log): the transport keeps the work it had not finished
    /// and hands it to the next process of the instance, so its callers are
    /// not failed and no crash is counted.
    pub host_lost: Option<String>,
}

/// The hub's handle on one running agent process.
pub trait AgentProcess: Send + fmt::Debug {
    /// Resolves once it has ended. Cancel-safe: a `select!` may drop the
    /// future and call it again.
    fn wait(&mut self) -> BoxFuture<'_, ProcessEnd>;
    /// Asks for it to be killed now (SIGKILL); `wait` then resolves.
    fn start_kill(&mut self);
}

/// A child process of this one.
#[derive(Debug)]
pub struct LocalProcess(pub Child);

impl AgentProcess for LocalProcess {
    fn wait(&mut self) -> BoxFuture<'_, ProcessEnd> {
        Box::pin(async move { ProcessEnd { status: self.0.wait().await.ok(), host_lost: None } })
    }

    fn start_kill(&mut self) {
        let _ = self.0.start_kill();
    }
}

/// How to start an agent process on this machine.
#[derive(Debug, Clone)]
pub struct AgentLauncher {
    /// The program.
    pub program: PathBuf,
    /// Its arguments before the instance's name.
    pub args: Vec<OsString>,
}

impl AgentLauncher {
    /// `program args… <agent@key>`.
    pub fn new(program: impl Into<PathBuf>, args: impl IntoIterator<Item = impl Into<OsString>>) -> Self {
        Self { program: program.into(), args: args.into_iter().map(Into::into).collect() }
    }

    /// Starts the process for `instance`; the stream is the hub's end of
    /// its channel (the child has the other end as its standard input).
    pub fn spawn(&self, instance: &AgentInstance) -> std::io::Result<(Child, UnixStream)> {
        // Both ends are close-on-exec; the child's end survives the exec only
        // as the fd 0 it is duplicated onto.
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            // Only so that `ps` shows which instance a process runs.
            .arg(instance.to_string())
            .env(ORCHESTRATOR_PID_ENV, std::process::id().to_string())
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .kill_on_drop(true);
        let child = command.spawn()?;
        // The command holds our copy of the child's end: without it, the
        // end of the connection is seen when the child exits.
        drop(command);
        ours.set_nonblocking(true)?;
        Ok((child, UnixStream::from_std(ours)?))
    }
}

impl Launch for AgentLauncher {
    fn start(&self, init: InitPayload, timeout: Duration) -> BoxFuture<'_, Result<Started, ErrorInfo>> {
        Box::pin(crate::start::start(self, init, timeout))
    }
}
