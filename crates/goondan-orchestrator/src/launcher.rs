//! Starting one agent process.
//!
//! The process is the program the launcher names (the `gdn` binary, with
//! its hidden agent subcommand). It finds the orchestrator through its
//! environment: the socket to connect to (in a private 0700 directory of
//! the orchestrator), a one-time token it presents in its `hello`, and the
//! orchestrator's pid. It starts in a process group of its own, so that
//! Ctrl-C at the terminal reaches only the orchestrator, which decides what
//! to cancel. Its standard output is not used; its standard error is the
//! orchestrator's (its log lines).
//!
//! It never outlives the orchestrator: when the orchestrator's end of the
//! socket closes (it exited, or was killed with SIGKILL: the kernel closes
//! it) the agent process stops, and it also asks the kernel for SIGTERM
//! when its parent dies (`PR_SET_PDEATHSIG`, see [`crate::agent_process`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use goondan_ipc::AgentInstance;
use tokio::process::{Child, Command};

/// The socket to connect to.
pub const SOCKET_ENV: &str = goondan_core::process_env::AGENT_SOCKET_ENV;
/// The token of this start.
pub const TOKEN_ENV: &str = goondan_core::process_env::AGENT_TOKEN_ENV;
/// The orchestrator's pid (the agent process exits if its parent is another).
pub const ORCHESTRATOR_PID_ENV: &str = "GOONDAN_ORCHESTRATOR_PID";

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

    /// Starts the process for `instance`; it will connect to `socket` and
    /// present `token`.
    pub fn spawn(&self, instance: &AgentInstance, socket: &Path, token: &str) -> std::io::Result<Child> {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            // Only so that `ps` shows which instance a process runs.
            .arg(instance.to_string())
            .env(SOCKET_ENV, socket)
            .env(TOKEN_ENV, token)
            .env(ORCHESTRATOR_PID_ENV, std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .kill_on_drop(true);
        command.spawn()
    }
}
