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
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Stdio;

use goondan_ipc::AgentInstance;
use tokio::net::UnixStream;
use tokio::process::{Child, Command};

/// The orchestrator's pid (the agent process exits if its parent is another).
pub use goondan_ipc::ORCHESTRATOR_PID_ENV;

/// How to start an agent process.
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
