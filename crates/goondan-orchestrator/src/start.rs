//! The tasks around one agent process, so that the hub never waits on one:
//! [`start`] (launch, `hello`, `init`, `ready`), [`supervise`] (its messages
//! and its exit, reported to the hub in that order) and [`forward`] (the
//! messages the hub sends it, written in order).
//!
//! A process that exits may have written why just before (`ready` with an
//! error, then exit 1). Its messages are always read before its exit is
//! believed: the kernel keeps what it wrote in the socket after it died, so
//! the agent's own error wins over "ended at start" every time.

use std::time::Duration;

use goondan_ipc::{
    AgentInstance, ErrorInfo, InitPayload, IpcMessage, LinkError, LinkReceiver, LinkSender, ORCHESTRATOR, Routed,
    unix_link,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::codes::{AGENT_UNAVAILABLE, IPC_MESSAGE_TOO_LARGE};
use crate::hub::HubCommand;
use crate::launcher::{AgentLauncher, AgentProcess, LocalProcess, ProcessEnd, Started};

/// How long the messages of a process that exited are read for. They are
/// already in the socket; only a descendant holding its end (which the
/// agent process prevents) could make this wait.
const DRAIN: Duration = Duration::from_secs(2);

/// What became of a starting process while the hub waited for a message.
enum Step {
    Message(Box<IpcMessage>),
    /// It exited: how, and the error it sent before, if any.
    Exited(String, Option<ErrorInfo>),
    TimedOut,
}

/// Starts the process for `init.instance` on this machine and walks it to
/// `ready`.
pub(crate) async fn start(
    launcher: &AgentLauncher,
    init: InitPayload,
    timeout: Duration,
) -> Result<Started, ErrorInfo> {
    let instance = init.instance.clone();
    let unavailable = |message: String| ErrorInfo::new(AGENT_UNAVAILABLE, message);
    let (child, stream) = launcher
        .spawn(&instance)
        .map_err(|error| unavailable(format!("cannot start a process for {instance}: {error}")))?;
    let pid = child.id().unwrap_or_default();
    let mut child = LocalProcess(child);
    let (read, write) = stream.into_split();
    let (link, mut receiver) = unix_link(read, write);
    let deadline = Instant::now() + timeout;
    walk_to_ready(&mut child, pid, &instance, &link, receiver.as_mut(), init, deadline).await?;
    Ok(Started { link, receiver, process: Box::new(child), pid })
}

/// `hello` (from the process with the pid it was started with), `init`,
/// then `ready`: the handshake of a process this machine started.
pub async fn walk_to_ready(
    child: &mut dyn AgentProcess,
    pid: u32,
    instance: &AgentInstance,
    link: &LinkSender,
    receiver: &mut dyn LinkReceiver,
    init: InitPayload,
    deadline: Instant,
) -> Result<(), ErrorInfo> {
    let unavailable = |message: String| ErrorInfo::new(AGENT_UNAVAILABLE, message);
    let timeout = deadline.saturating_duration_since(Instant::now());
    let ended =
        |status: String| unavailable(format!("the process for {instance} (pid {pid}) ended at start: {status}"));
    match next_step(child, receiver, deadline).await {
        Step::Message(message) if matches!(&*message, IpcMessage::Hello(hello) if hello.payload.pid == pid) => {}
        Step::Message(other) => {
            child.start_kill();
            return Err(unavailable(format!(
                "the process for {instance} (pid {pid}) began with {} instead of hello",
                other.kind()
            )));
        }
        Step::Exited(status, error) => return Err(error.unwrap_or_else(|| ended(status))),
        Step::TimedOut => {
            child.start_kill();
            return Err(unavailable(format!("the process for {instance} (pid {pid}) did not connect")));
        }
    }
    if link.send(IpcMessage::Init(Routed::new(ORCHESTRATOR, instance.to_string(), init))).await.is_err() {
        child.start_kill();
        return Err(unavailable(format!("the process for {instance} closed its connection at start")));
    }
    match next_step(child, receiver, deadline).await {
        Step::Message(message) => match *message {
            IpcMessage::Ready(ready) => match ready.payload.error {
                None => Ok(()),
                Some(error) => {
                    // It exits by itself; make sure.
                    child.start_kill();
                    let _ = child.wait().await;
                    Err(error)
                }
            },
            other => {
                child.start_kill();
                Err(unavailable(format!("the process for {instance} did not become ready: {}", other.kind())))
            }
        },
        Step::Exited(status, error) => Err(error.unwrap_or_else(|| ended(status))),
        Step::TimedOut => {
            child.start_kill();
            Err(unavailable(format!("the process for {instance} did not become ready within {timeout:?}")))
        }
    }
}

/// The next message of a starting process, or its end. What it sent is
/// read first: the message is preferred over the exit when both are there,
/// and after an exit what remains in the socket is searched for its error.
async fn next_step(child: &mut dyn AgentProcess, receiver: &mut dyn LinkReceiver, deadline: Instant) -> Step {
    tokio::select! {
        biased;
        message = receiver.recv() => match message {
            Ok(Some(message)) => Step::Message(Box::new(message)),
            // Its end closed: it is exiting (anything it sent came before).
            Ok(None) | Err(_) => match tokio::time::timeout_at(deadline, child.wait()).await {
                Ok(end) => Step::Exited(describe_end(&end), None),
                Err(_) => Step::TimedOut,
            },
        },
        end = child.wait() => {
            let mut error = None;
            drain(receiver, |message| {
                if let IpcMessage::Ready(ready) = message
                    && let Some(reason) = ready.payload.error
                {
                    error = Some(reason);
                }
            })
            .await;
            Step::Exited(describe_end(&end), error)
        }
        () = tokio::time::sleep_until(deadline) => Step::TimedOut,
    }
}

/// Hands every message still readable from a process that ended to `each`.
async fn drain(receiver: &mut dyn LinkReceiver, mut each: impl FnMut(IpcMessage)) {
    let deadline = Instant::now() + DRAIN;
    while let Ok(Ok(Some(message))) = tokio::time::timeout_at(deadline, receiver.recv()).await {
        each(message);
    }
}

/// How a process ended, as the terminal shows it (with its host's loss).
pub(crate) fn describe_end(end: &ProcessEnd) -> String {
    match &end.host_lost {
        Some(why) => why.clone(),
        None => describe_status(end.status),
    }
}

/// How a process ended, as the terminal shows it.
pub(crate) fn describe_status(status: Option<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match status {
        Some(status) => match (status.code(), status.signal()) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(signal)) => {
                let name = nix::sys::signal::Signal::try_from(signal).map(|s| s.as_str()).unwrap_or("?");
                format!("killed by signal {signal} ({name})")
            }
            _ => "ended".to_owned(),
        },
        None => "unknown status".to_owned(),
    }
}

/// Sends `command` to the hub if it still runs, waiting for room in its
/// queue (the hub never waits on its reporters, so the wait ends).
pub(crate) async fn report(hub: &mpsc::WeakSender<HubCommand>, command: HubCommand) -> bool {
    match hub.upgrade() {
        Some(hub) => hub.send(command).await.is_ok(),
        None => false,
    }
}

/// Everything a running process says goes to the hub, then its exit: the
/// hub sees its last answer before it learns that it ended. `kill` firing
/// (or the hub going away) kills it.
pub(crate) async fn supervise(
    instance: AgentInstance,
    generation: u64,
    pid: u32,
    mut child: Box<dyn AgentProcess>,
    mut receiver: Box<dyn LinkReceiver>,
    mut kill: oneshot::Receiver<()>,
    hub: mpsc::WeakSender<HubCommand>,
) {
    let from_agent =
        |message: IpcMessage| HubCommand::FromAgent { from: instance.clone(), generation, message: Box::new(message) };
    let mut reading = true;
    let end = loop {
        tokio::select! {
            message = receiver.recv(), if reading => match message {
                Ok(Some(message)) => {
                    if !report(&hub, from_agent(message)).await {
                        child.start_kill();
                    }
                }
                Ok(None) => reading = false,
                Err(error) => {
                    // The stream cannot be trusted past a bad frame: the
                    // process can no longer be talked to.
                    tracing::warn!("the connection of {instance} (pid {pid}) failed: {error}; stopping it");
                    reading = false;
                    child.start_kill();
                }
            },
            end = child.wait() => {
                if reading {
                    let mut left = Vec::new();
                    drain(receiver.as_mut(), |message| left.push(message)).await;
                    for message in left {
                        report(&hub, from_agent(message)).await;
                    }
                }
                break end;
            }
            _ = &mut kill => {
                child.start_kill();
                break child.wait().await;
            }
        }
    };
    report(&hub, HubCommand::Exited { instance: instance.clone(), generation, pid, end }).await;
}

/// Writes the hub's messages to one process in order. A message that cannot
/// be encoded (over the frame limit) fails alone: the hub is told, the
/// channel stays up.
pub(crate) async fn forward(
    link: LinkSender,
    mut outbox: mpsc::UnboundedReceiver<IpcMessage>,
    to: AgentInstance,
    hub: mpsc::WeakSender<HubCommand>,
) {
    while let Some(message) = outbox.recv().await {
        let correlation_id = correlation_of(&message);
        match link.send(message).await {
            Ok(()) => {}
            Err(LinkError::Closed) => return,
            Err(error) => {
                tracing::warn!("a message to {to} could not be sent: {error}");
                if let Some(correlation_id) = correlation_id {
                    let error = ErrorInfo::new(IPC_MESSAGE_TOO_LARGE, format!("delivering to {to}: {error}"))
                        .suggest("Send a shorter message; put large content in a file and pass its path.");
                    report(&hub, HubCommand::Undelivered { correlation_id, error }).await;
                }
            }
        }
    }
}

/// The correlation id of a request whose sender waits for it.
fn correlation_of(message: &IpcMessage) -> Option<String> {
    match message {
        IpcMessage::Delegate(m) | IpcMessage::Event(m) => m.correlation_id.clone(),
        _ => None,
    }
}
