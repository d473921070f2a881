//! The agent process's channel to the hub: taken from fd 0 (one end of a
//! socket pair only this process holds), `hello`, `init`, `ready`; and the
//! guard that keeps the process from outliving the hub or being inspected
//! by another process of the same user.

use std::time::Duration;

use goondan_ipc::{
    ErrorInfo, HelloPayload, InitPayload, IpcMessage, LinkReceiver, LinkSender, ORCHESTRATOR, ReadyPayload, Routed,
    unix_link,
};

use goondan_ipc::ORCHESTRATOR_PID_ENV;

/// Why an agent process could not join its orchestrator.
#[derive(Debug, thiserror::Error)]
pub enum AgentProcessError {
    /// Not started by an orchestrator.
    #[error("not started by a goondan orchestrator (its standard input is not the orchestrator's socket)")]
    NotAnAgentProcess,
    /// The orchestrator is gone.
    #[error("the orchestrator went away")]
    OrchestratorGone,
    /// The connection failed.
    #[error("connecting to the orchestrator: {0}")]
    Io(#[from] std::io::Error),
    /// The orchestrator said something else than `init`.
    #[error("the orchestrator did not send init: {0}")]
    Protocol(String),
}

/// Makes the kernel send SIGTERM to this process when its parent ends, and
/// checks that the parent is still the orchestrator that started it (it may
/// have died before the request). False when it is already gone. Also
/// makes the process non-dumpable: another process of the same user can
/// then neither attach to it nor read its memory (the secrets `init`
/// brings), nor take its descriptors.
pub fn guard_parent() -> bool {
    if let Err(error) = nix::sys::prctl::set_dumpable(false) {
        tracing::warn!("cannot make the agent process non-dumpable: {error}");
    }
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM);
    match std::env::var(ORCHESTRATOR_PID_ENV).ok().and_then(|pid| pid.parse::<i32>().ok()) {
        Some(expected) => nix::unistd::getppid().as_raw() == expected,
        None => true,
    }
}

/// The channel to the orchestrator, and what to run.
pub struct AgentChannel {
    /// Sends to the orchestrator.
    pub link: LinkSender,
    /// Receives from it.
    pub receiver: Box<dyn LinkReceiver>,
    /// The instance to run and its settings.
    pub init: InitPayload,
}

impl std::fmt::Debug for AgentChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentChannel").field("init", &self.init).finish_non_exhaustive()
    }
}

impl AgentChannel {
    /// Takes the channel the orchestrator gave this process as its standard
    /// input (one end of a socket pair only this process holds), moves it
    /// off fd 0 (close-on-exec: tools never inherit it; fd 0 becomes
    /// `/dev/null`), introduces this process and waits for its `init`.
    pub async fn connect() -> Result<Self, AgentProcessError> {
        let stream = take_inherited_channel()?;
        let (read, write) = stream.into_split();
        let (link, mut receiver) = unix_link(read, write);
        let hello = HelloPayload { pid: std::process::id() };
        link.send(IpcMessage::Hello(Routed::new("", ORCHESTRATOR, hello)))
            .await
            .map_err(|_| AgentProcessError::OrchestratorGone)?;
        match receiver.recv().await {
            Ok(Some(IpcMessage::Init(init))) => Ok(Self { link, receiver, init: init.payload }),
            Ok(Some(other)) => Err(AgentProcessError::Protocol(other.kind().to_owned())),
            Ok(None) => Err(AgentProcessError::OrchestratorGone),
            Err(error) => Err(AgentProcessError::Protocol(error.to_string())),
        }
    }

    /// Tells the orchestrator the instance is ready, or why it is not.
    pub async fn ready(&self, error: Option<ErrorInfo>) {
        let failed = error.is_some();
        let payload = ReadyPayload { pid: std::process::id(), error };
        let _ =
            self.link.send(IpcMessage::Ready(Routed::new(self.init.instance.to_string(), ORCHESTRATOR, payload))).await;
        if failed {
            // The process exits next: the reason must be out first.
            let _ = tokio::time::timeout(Duration::from_secs(2), self.link.flush()).await;
        }
    }
}

/// The socket on fd 0, as a close-on-exec descriptor of its own; fd 0 then
/// reads `/dev/null`.
fn take_inherited_channel() -> Result<tokio::net::UnixStream, AgentProcessError> {
    use std::os::fd::AsFd as _;
    let stdin = std::io::stdin();
    let fd = stdin.as_fd();
    let is_socket = nix::sys::stat::fstat(fd).is_ok_and(|stat| {
        nix::sys::stat::SFlag::from_bits_truncate(stat.st_mode) & nix::sys::stat::SFlag::S_IFMT
            == nix::sys::stat::SFlag::S_IFSOCK
    });
    if !is_socket {
        return Err(AgentProcessError::NotAnAgentProcess);
    }
    let owned = fd.try_clone_to_owned()?;
    let null = std::fs::File::open("/dev/null")?;
    nix::unistd::dup2_stdin(&null).map_err(std::io::Error::from)?;
    let stream = std::os::unix::net::UnixStream::from(owned);
    stream.set_nonblocking(true)?;
    Ok(tokio::net::UnixStream::from_std(stream)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_makes_the_process_non_dumpable() {
        // Not started by an orchestrator: no pid to compare, the parent is fine.
        assert!(std::env::var_os(ORCHESTRATOR_PID_ENV).is_some() || guard_parent());
        assert_eq!(nix::sys::prctl::get_dumpable().ok(), Some(false));
    }

    #[tokio::test]
    async fn a_process_whose_stdin_is_not_a_socket_is_not_an_agent_process() {
        // The test harness's stdin is a terminal, a pipe or /dev/null, never a socket.
        if nix::sys::stat::fstat(std::io::stdin()).is_ok_and(|s| {
            nix::sys::stat::SFlag::from_bits_truncate(s.st_mode) & nix::sys::stat::SFlag::S_IFMT
                == nix::sys::stat::SFlag::S_IFSOCK
        }) {
            return;
        }
        assert!(matches!(AgentChannel::connect().await, Err(AgentProcessError::NotAnAgentProcess)));
    }
}
