//! Inside an agent process: the channel to the orchestrator, the `agents`
//! tool's runtime over it ([`SwarmRuntime`]), and the loop that runs one
//! turn per message ([`serve`]).
//!
//! ```text
//! connect(): the socket and token from the environment → hello → init (the instance, secrets)
//! the caller builds its Agent (agent_runtime = SwarmRuntime, inbox) → ready
//! serve():
//!   reader   delegate / event → the queue of turns
//!            delegate_result  → the tool call waiting for it, or (async) the inbox
//!            call_result      → the call waiting for it
//!            cancel           → the running turn (if it serves that request), or drop it from the queue
//!            shutdown, end of the connection → cancel the running turn, stop
//!   worker   one turn at a time: observe(turn_started) → run_turn (caller's trace, inbound
//!            metadata) → observe(turn_ended) → delegate_result for a delegate;
//!            idle: replies in the inbox are appended to the conversation and saved at once
//! ```
//!
//! The agent process never outlives the orchestrator: [`guard_parent`] asks
//! the kernel for SIGTERM when the parent dies (and checks that it has not
//! already), and the end of the connection stops [`serve`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use goondan_core::ids::{SpanIdGenerator, new_id};
use goondan_core::message::now_millis;
use goondan_core::{JsonObject, JsonValue, Message, MessageData, MessageSource, ToolCall, ToolResult, ToolStatus};
use goondan_ipc::{
    AgentInstance, CallPayload, CallResultPayload, CancelPayload, DelegatePayload, DelegateResultPayload, ErrorInfo,
    HelloPayload, InitPayload, IpcMessage, LinkError, LinkReceiver, LinkSender, MessageSourceInfo, ORCHESTRATOR,
    ObservePayload, ReadyPayload, ResultStatus, Routed, ShutdownAckPayload, TurnSummary, unix_link,
};
use goondan_runtime::conversation::Conversation;
use goondan_runtime::inbox::Inbox;
use goondan_runtime::turn::{Agent, TurnInput, TurnObserver};
use goondan_runtime::{TurnEnd, TurnOutcome};
use goondan_tools::context::{AgentMessageRequest, AgentSpawnRequest};
use goondan_tools::events::{EventKind, EventSink, RuntimeEvent};
use goondan_tools::{AgentToolRuntime, BoxFuture, ToolContext, ToolFailure};
use serde_json::json;
use tokio::sync::{mpsc, oneshot, watch};

use crate::codes::{
    AGENT_NOT_FOUND, AGENT_REQUEST_CANCELLED, AGENT_REQUEST_TIMEOUT, AGENT_TURN_FAILED, IPC_DELIVERY_FAILED,
    IPC_MESSAGE_TOO_LARGE,
};
use crate::launcher::ORCHESTRATOR_PID_ENV;

/// The metadata key of an inbound message's origin (the original's).
pub const INBOUND_METADATA_KEY: &str = "__goondanInbound";
/// The metadata key of an asynchronous reply (the original's).
pub const INTER_AGENT_RESPONSE_METADATA_KEY: &str = "__goondanInterAgentResponse";
/// How long `send`, `spawn` and `list` wait for the orchestrator.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

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

/// What a tool call of this instance waits for.
enum Waiting {
    /// A synchronous request's answer.
    Answer(oneshot::Sender<DelegateResultPayload>),
    /// An asynchronous request's answer, which goes to the inbox.
    Async(AsyncRequest),
    /// The orchestrator's answer to a call or an event.
    Call(oneshot::Sender<CallResultPayload>),
}

struct AsyncRequest {
    target: String,
    event_id: String,
    event_type: String,
    metadata: JsonObject,
    trace_id: String,
}

/// The `agents` tool's runtime in an agent process: requests go to the
/// orchestrator over the channel and their answers come back by
/// correlation id.
pub struct SwarmRuntime {
    me: AgentInstance,
    swarm: goondan_ipc::SwarmInfo,
    link: LinkSender,
    waiting: Mutex<HashMap<String, Waiting>>,
    /// The hops of the request the running turn serves.
    hops: AtomicU32,
    inbox: Arc<Inbox>,
    events: Mutex<Option<Arc<dyn EventSink>>>,
    this: std::sync::Weak<SwarmRuntime>,
}

impl std::fmt::Debug for SwarmRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwarmRuntime").field("me", &self.me).finish_non_exhaustive()
    }
}

impl SwarmRuntime {
    /// The runtime of the instance `channel` runs.
    pub fn new(channel: &AgentChannel) -> Arc<Self> {
        Arc::new_cyclic(|this| Self {
            this: this.clone(),
            me: channel.init.instance.clone(),
            swarm: channel.init.swarm.clone(),
            link: Arc::clone(&channel.link),
            waiting: Mutex::new(HashMap::new()),
            hops: AtomicU32::new(0),
            inbox: Arc::new(Inbox::default()),
            events: Mutex::new(None),
        })
    }

    /// The inbox asynchronous replies go to (the agent's).
    pub fn inbox(&self) -> &Arc<Inbox> {
        &self.inbox
    }

    /// Where this runtime's events (requests sent, answers received) go.
    pub fn set_events(&self, events: Arc<dyn EventSink>) {
        *self.events.lock().unwrap_or_else(PoisonError::into_inner) = Some(events);
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<String, Waiting>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn emit(&self, name: &str, trace_id: &str, turn_id: &str, extra: JsonValue) {
        let events = self.events.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(events) = events.filter(|e| e.enabled()) {
            emit_event(&*events, &self.me, name, trace_id, turn_id, &extra);
        }
    }

    fn check_target(&self, target: &str) -> Result<(), ToolFailure> {
        if self.swarm.agents.iter().any(|a| a == target) {
            return Ok(());
        }
        Err(ToolFailure::with_code(
            format!(
                "no agent '{target}' in swarm '{}' (its agents: {})",
                self.swarm.name,
                self.swarm.agents.join(", ")
            ),
            AGENT_NOT_FOUND,
        )
        .named("AgentNotFoundError")
        .suggest("Call agents__catalog for the agents you can reach."))
    }

    fn delegate_payload(
        &self,
        ctx: &ToolContext,
        request: &AgentMessageRequest,
        asynchronous: bool,
    ) -> DelegatePayload {
        DelegatePayload {
            event_id: new_id(),
            event_type: request.event_type.clone().unwrap_or_else(|| "agent.request".to_owned()),
            instance_key: request.instance_key.clone().unwrap_or_else(|| ctx.instance_key().to_owned()),
            input: request.input.clone(),
            metadata: request.metadata.clone(),
            trace_id: Some(ctx.scope().trace_id.to_string()),
            asynchronous,
            hops: self.hops.load(Ordering::Relaxed).saturating_add(1),
            source: MessageSourceInfo {
                kind: "agent".to_owned(),
                name: self.me.agent.clone(),
                instance_key: Some(self.me.instance_key.clone()),
            },
            tool_call_id: Some(ctx.tool_call_id().to_owned()),
        }
    }

    async fn send_message(&self, message: IpcMessage, correlation_id: &str) -> Result<(), ToolFailure> {
        self.link.send(message).await.map_err(|error| {
            self.waiting().remove(correlation_id);
            match error {
                LinkError::Closed => {
                    ToolFailure::with_code(format!("the orchestrator cannot be reached: {error}"), IPC_DELIVERY_FAILED)
                }
                error => ToolFailure::with_code(format!("the request cannot be sent: {error}"), IPC_MESSAGE_TOO_LARGE)
                    .suggest("Send a shorter input; put large content in a file and pass its path."),
            }
        })
    }

    async fn call(&self, payload: CallPayload) -> Result<JsonValue, ToolFailure> {
        let correlation_id = format!("call-{}", new_id());
        let (tx, rx) = oneshot::channel();
        self.waiting().insert(correlation_id.clone(), Waiting::Call(tx));
        let message = IpcMessage::Call(
            Routed::new(self.me.to_string(), ORCHESTRATOR, payload).correlated(correlation_id.clone()),
        );
        self.send_message(message, &correlation_id).await?;
        let _forget = Forget { runtime: self, correlation_id: &correlation_id, cancel: false };
        match tokio::time::timeout(CALL_TIMEOUT, rx).await {
            Ok(Ok(CallResultPayload { error: Some(error), .. })) => Err(failure(error)),
            Ok(Ok(CallResultPayload { output, .. })) => Ok(output),
            Ok(Err(_)) => Err(ToolFailure::with_code("the orchestrator went away", IPC_DELIVERY_FAILED)),
            Err(_) => Err(ToolFailure::with_code(
                format!("the orchestrator did not answer within {CALL_TIMEOUT:?}"),
                IPC_DELIVERY_FAILED,
            )),
        }
    }

    /// An answer arrived.
    fn resolve(&self, correlation_id: &str, answer: DelegateResultPayload) {
        let waiting = self.waiting().remove(correlation_id);
        match waiting {
            Some(Waiting::Answer(tx)) => {
                let _ = tx.send(answer);
            }
            Some(Waiting::Async(request)) => self.deliver_async(correlation_id, &request, &answer),
            Some(Waiting::Call(tx)) => {
                let _ = tx.send(CallResultPayload { output: JsonValue::Null, error: answer.error });
            }
            // An asynchronous request made by an earlier process of this
            // instance: its answer still belongs in the conversation.
            None => match answer.request.clone() {
                Some(echo) => {
                    let request = AsyncRequest {
                        target: echo.target,
                        event_id: echo.event_id,
                        event_type: echo.event_type,
                        metadata: echo.metadata,
                        trace_id: echo.trace_id,
                    };
                    self.deliver_async(correlation_id, &request, &answer);
                }
                None => tracing::debug!("an answer for {correlation_id} arrived after its caller gave up; dropped"),
            },
        }
    }

    fn resolve_call(&self, correlation_id: &str, answer: CallResultPayload) {
        let waiting = self.waiting().remove(correlation_id);
        match waiting {
            Some(Waiting::Call(tx)) => {
                let _ = tx.send(answer);
            }
            Some(Waiting::Answer(tx)) => {
                let _ = tx.send(DelegateResultPayload::failed(
                    answer
                        .error
                        .unwrap_or_else(|| ErrorInfo::new(IPC_DELIVERY_FAILED, "the message was not delivered")),
                ));
            }
            Some(Waiting::Async(request)) => {
                let answer = DelegateResultPayload::failed(
                    answer
                        .error
                        .unwrap_or_else(|| ErrorInfo::new(IPC_DELIVERY_FAILED, "the message was not delivered")),
                );
                self.deliver_async(correlation_id, &request, &answer);
            }
            None => {}
        }
    }

    /// An asynchronous request's answer (or failure) as a message of the
    /// conversation, shaped as the original's `inter_agent_response`.
    fn deliver_async(&self, correlation_id: &str, request: &AsyncRequest, answer: &DelegateResultPayload) {
        let status = match answer.status {
            ResultStatus::Ok => "ok",
            ResultStatus::Error => "error",
            ResultStatus::Timeout => "timeout",
        };
        let mut content = json!({
            "type": "inter_agent_response",
            "requestId": correlation_id,
            "fromAgentId": request.target,
            "toAgentId": self.me.agent,
            "status": status,
        });
        let mut metadata = json!({
            "kind": "inter_agent_response",
            "version": 1,
            "requestId": correlation_id,
            "requestEventId": request.event_id,
            "requestEventType": request.event_type,
            "fromAgentId": request.target,
            "toAgentId": self.me.agent,
            "async": true,
            "status": status,
            "receivedAt": goondan_core::js_message::format_rfc3339_millis(now_millis()),
            "traceId": request.trace_id,
        });
        if !request.metadata.is_empty() {
            metadata["requestMetadata"] = JsonValue::Object(request.metadata.clone());
        }
        match (&answer.status, &answer.error) {
            (ResultStatus::Ok, _) => content["response"] = json!(answer.response.clone().unwrap_or_default()),
            (_, error) => {
                let (code, message) = error
                    .as_ref()
                    .map(|e| (e.code.clone(), e.message.clone()))
                    .unwrap_or_else(|| ("AGENT_REQUEST_ERROR".to_owned(), "agent request failed".to_owned()));
                content["error"] = json!({"code": code, "message": message});
                metadata["errorCode"] = json!(code);
                metadata["errorMessage"] = json!(message);
            }
        }
        let mut message = Message::new(MessageData::User { content: content.to_string() }, MessageSource::User);
        message.metadata.insert(INTER_AGENT_RESPONSE_METADATA_KEY.to_owned(), metadata);
        message.metadata.insert("traceId".to_owned(), json!(request.trace_id));
        self.emit(
            "agent.response.received",
            &request.trace_id,
            "",
            json!({"correlationId": correlation_id, "from": request.target, "status": status, "async": true}),
        );
        self.inbox.push(message);
    }
}

/// Forgets a waiting entry when its tool call ends (also when the call is
/// dropped: the turn was cancelled), and then tells the orchestrator that
/// nobody waits for the answer.
struct Forget<'a> {
    runtime: &'a SwarmRuntime,
    correlation_id: &'a str,
    cancel: bool,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        let was_waiting = self.runtime.waiting().remove(self.correlation_id).is_some();
        if was_waiting && self.cancel {
            let cancel = IpcMessage::Cancel(
                Routed::new(
                    self.runtime.me.to_string(),
                    ORCHESTRATOR,
                    CancelPayload { reason: "caller gave up".into() },
                )
                .correlated(self.correlation_id),
            );
            let link = Arc::clone(&self.runtime.link);
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let _ = link.send(cancel).await;
                });
            }
        }
    }
}

fn failure(error: ErrorInfo) -> ToolFailure {
    let mut failure = ToolFailure::with_code(error.message, error.code);
    failure.suggestion = error.suggestion;
    failure
}

impl AgentToolRuntime for SwarmRuntime {
    fn request<'a>(
        &'a self,
        ctx: &'a ToolContext,
        request: AgentMessageRequest,
    ) -> BoxFuture<'a, Result<JsonValue, ToolFailure>> {
        Box::pin(async move {
            self.check_target(&request.target)?;
            let payload = self.delegate_payload(ctx, &request, request.asynchronous);
            let correlation_id = format!("corr-{}", new_id());
            let event_id = payload.event_id.clone();
            let trace_id = ctx.scope().trace_id.to_string();
            let target_key = payload.instance_key.clone();
            let timeout = Duration::from_millis(request.timeout_ms.unwrap_or(60_000));
            self.emit(
                "agent.request.sent",
                &trace_id,
                ctx.turn_id(),
                json!({"correlationId": correlation_id, "target": request.target, "targetInstanceKey": target_key,
                       "eventType": payload.event_type, "async": request.asynchronous, "toolCallId": ctx.tool_call_id()}),
            );
            let message = IpcMessage::Delegate(
                Routed::new(self.me.to_string(), request.target.clone(), payload).correlated(correlation_id.clone()),
            );
            if request.asynchronous {
                let pending = AsyncRequest {
                    target: request.target.clone(),
                    event_id: event_id.clone(),
                    event_type: request.event_type.clone().unwrap_or_else(|| "agent.request".to_owned()),
                    metadata: request.metadata.clone(),
                    trace_id: trace_id.clone(),
                };
                self.waiting().insert(correlation_id.clone(), Waiting::Async(pending));
                self.send_message(message, &correlation_id).await?;
                self.expire_async(correlation_id.clone(), timeout);
                return Ok(json!({
                    "target": request.target, "eventId": event_id, "correlationId": correlation_id,
                    "accepted": true, "async": true, "response": null,
                }));
            }
            let (tx, rx) = oneshot::channel();
            self.waiting().insert(correlation_id.clone(), Waiting::Answer(tx));
            self.send_message(message, &correlation_id).await?;
            let _forget = Forget { runtime: self, correlation_id: &correlation_id, cancel: true };
            let answer = match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(_)) => return Err(ToolFailure::with_code("the orchestrator went away", IPC_DELIVERY_FAILED)),
                Err(_) => {
                    self.emit(
                        "agent.response.received",
                        &trace_id,
                        ctx.turn_id(),
                        json!({"correlationId": correlation_id, "from": request.target, "status": "timeout"}),
                    );
                    return Err(ToolFailure::with_code(
                        format!("{}@{target_key} did not answer within {} ms", request.target, timeout.as_millis()),
                        AGENT_REQUEST_TIMEOUT,
                    )
                    .named("AgentRequestTimeoutError")
                    .suggest("Give a larger timeoutMs, or use async: true and carry on."));
                }
            };
            let status = match answer.status {
                ResultStatus::Ok => "ok",
                ResultStatus::Error => "error",
                ResultStatus::Timeout => "timeout",
            };
            self.emit(
                "agent.response.received",
                &trace_id,
                ctx.turn_id(),
                json!({"correlationId": correlation_id, "from": request.target, "status": status,
                       "errorCode": answer.error.as_ref().map(|e| e.code.clone())}),
            );
            match (answer.status, answer.error) {
                (ResultStatus::Ok, _) => Ok(json!({
                    "target": request.target, "eventId": event_id, "correlationId": correlation_id,
                    "accepted": true, "async": false, "response": answer.response,
                })),
                (_, Some(error)) => Err(failure(error)),
                (_, None) => Err(ToolFailure::with_code("the request failed", AGENT_TURN_FAILED)),
            }
        })
    }

    fn send<'a>(
        &'a self,
        ctx: &'a ToolContext,
        request: AgentMessageRequest,
    ) -> BoxFuture<'a, Result<JsonValue, ToolFailure>> {
        Box::pin(async move {
            self.check_target(&request.target)?;
            let payload = self.delegate_payload(ctx, &request, false);
            let event_id = payload.event_id.clone();
            let correlation_id = format!("event-{}", new_id());
            let (tx, rx) = oneshot::channel();
            self.waiting().insert(correlation_id.clone(), Waiting::Call(tx));
            let message = IpcMessage::Event(
                Routed::new(self.me.to_string(), request.target.clone(), payload).correlated(correlation_id.clone()),
            );
            self.send_message(message, &correlation_id).await?;
            let _forget = Forget { runtime: self, correlation_id: &correlation_id, cancel: false };
            match tokio::time::timeout(CALL_TIMEOUT, rx).await {
                Ok(Ok(CallResultPayload { error: Some(error), .. })) => Err(failure(error)),
                Ok(Ok(_)) => Ok(json!({"target": request.target, "eventId": event_id, "accepted": true})),
                Ok(Err(_)) => Err(ToolFailure::with_code("the orchestrator went away", IPC_DELIVERY_FAILED)),
                Err(_) => {
                    Err(ToolFailure::with_code("the orchestrator did not confirm the delivery", IPC_DELIVERY_FAILED))
                }
            }
        })
    }

    fn spawn<'a>(
        &'a self,
        ctx: &'a ToolContext,
        request: AgentSpawnRequest,
    ) -> BoxFuture<'a, Result<JsonValue, ToolFailure>> {
        Box::pin(async move {
            self.check_target(&request.target)?;
            self.call(CallPayload::Spawn {
                target: request.target,
                instance_key: request.instance_key,
                cwd: request.cwd,
                caller_workdir: ctx.workdir().display().to_string(),
            })
            .await
        })
    }

    fn list<'a>(&'a self, _: &'a ToolContext, include_all: bool) -> BoxFuture<'a, Result<JsonValue, ToolFailure>> {
        Box::pin(self.call(CallPayload::List { include_all }))
    }

    fn catalog<'a>(&'a self, _: &'a ToolContext) -> BoxFuture<'a, Result<JsonValue, ToolFailure>> {
        Box::pin(async move { Ok(self.swarm.catalog(&self.me.agent)) })
    }
}

impl SwarmRuntime {
    /// An asynchronous request not answered within its timeout gets a
    /// timeout reply in the inbox, and the orchestrator is told.
    fn expire_async(&self, correlation_id: String, timeout: Duration) {
        let Some(runtime) = self.strong() else { return };
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            let expired = match runtime.waiting().remove(&correlation_id) {
                Some(Waiting::Async(request)) => request,
                Some(other) => {
                    runtime.waiting().insert(correlation_id, other);
                    return;
                }
                None => return,
            };
            let answer = DelegateResultPayload {
                status: ResultStatus::Timeout,
                ..DelegateResultPayload::error(
                    AGENT_REQUEST_TIMEOUT,
                    format!("{} did not answer within {} ms", expired.target, timeout.as_millis()),
                )
            };
            runtime.deliver_async(&correlation_id, &expired, &answer);
            let cancel = IpcMessage::Cancel(
                Routed::new(runtime.me.to_string(), ORCHESTRATOR, CancelPayload { reason: "timeout".into() })
                    .correlated(correlation_id),
            );
            let _ = runtime.link.send(cancel).await;
        });
    }

    fn strong(&self) -> Option<Arc<Self>> {
        self.this.upgrade()
    }
}

/// Emits one of the swarm's events (`agent.request.sent`, …) to `events`.
fn emit_event(
    events: &dyn EventSink,
    me: &AgentInstance,
    name: &str,
    trace_id: &str,
    turn_id: &str,
    extra: &JsonValue,
) {
    let span_id = SpanIdGenerator::new().next_raw();
    events.emit(&RuntimeEvent {
        kind: EventKind::Custom(name),
        trace_id,
        span_id,
        parent_span_id: None,
        timestamp_ms: now_millis(),
        agent_name: &me.agent,
        instance_key: &me.instance_key,
        turn_id,
        step_id: None,
        tool: None,
        extra: Some(extra),
        call_scope: None,
    });
}

/// Why [`serve`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServeEnd {
    /// The orchestrator asked it to stop.
    Shutdown,
    /// The orchestrator went away.
    Disconnected,
    /// A turn asked for a restart: exit cleanly, the orchestrator starts a new process.
    Restart,
}

/// A message waiting for its turn.
struct Job {
    correlation_id: String,
    from: String,
    payload: DelegatePayload,
    wants_answer: bool,
}

impl Job {
    fn of(message: Routed<DelegatePayload>, wants_answer: bool) -> Self {
        Self {
            correlation_id: message.correlation_id.unwrap_or_default(),
            from: message.from,
            payload: message.payload,
            wants_answer,
        }
    }
}

/// What the reader and the worker share.
#[derive(Default)]
struct Control {
    /// The correlation id of the running turn's message, and its cancel switch.
    running: Mutex<Option<(String, watch::Sender<bool>)>>,
    /// Queued messages their callers gave up on.
    cancelled: Mutex<HashSet<String>>,
}

/// Runs the instance: one turn per `delegate` or `event`, until `shutdown`,
/// the end of the connection, or a turn that asks for a restart.
/// `terminate` turning true (SIGTERM) stops it like `shutdown`.
pub async fn serve(
    agent: Agent,
    mut conversation: Conversation,
    channel: AgentChannel,
    runtime: Arc<SwarmRuntime>,
    mut terminate: watch::Receiver<bool>,
) -> ServeEnd {
    let AgentChannel { link, mut receiver, init } = channel;
    let me = init.instance.clone();
    runtime.set_events(Arc::clone(&agent.tooling.events));
    let control = Arc::new(Control::default());
    let (jobs_tx, mut jobs) = mpsc::unbounded_channel::<Job>();
    let (stop_tx, mut stop) = watch::channel(None::<ServeEnd>);
    // Frames of the worker (observations, answers) go out in order through one task.
    let (outbox, mut outgoing) = mpsc::unbounded_channel::<IpcMessage>();
    let writer_link = Arc::clone(&link);
    let writer = tokio::spawn(async move {
        while let Some(message) = outgoing.recv().await {
            if !send_or_stand_in(&writer_link, message).await {
                break;
            }
        }
    });

    let reader = {
        let control = Arc::clone(&control);
        let runtime = Arc::clone(&runtime);
        let stop_tx = stop_tx.clone();
        let link = Arc::clone(&link);
        let me = me.clone();
        tokio::spawn(async move {
            let end = loop {
                let message = match receiver.recv().await {
                    Ok(Some(message)) => message,
                    Ok(None) => break ServeEnd::Disconnected,
                    Err(error) => {
                        tracing::warn!("the connection to the orchestrator failed: {error}");
                        break ServeEnd::Disconnected;
                    }
                };
                match message {
                    IpcMessage::Delegate(m) | IpcMessage::Event(m) if m.correlation_id.is_none() => {
                        tracing::warn!("a message from {} without a correlation id; dropped", m.from);
                    }
                    IpcMessage::Delegate(m) => {
                        let _ = jobs_tx.send(Job::of(m, true));
                    }
                    IpcMessage::Event(m) => {
                        let _ = jobs_tx.send(Job::of(m, false));
                    }
                    IpcMessage::DelegateResult(m) => {
                        if let Some(id) = m.correlation_id {
                            runtime.resolve(&id, m.payload);
                        }
                    }
                    IpcMessage::CallResult(m) => {
                        if let Some(id) = m.correlation_id {
                            runtime.resolve_call(&id, m.payload);
                        }
                    }
                    IpcMessage::Cancel(m) => {
                        let Some(id) = m.correlation_id else { continue };
                        let running = control.running.lock().unwrap_or_else(PoisonError::into_inner);
                        match running.as_ref() {
                            Some((current, cancel)) if *current == id => {
                                tracing::info!("{me}: cancelling the turn for {id} ({})", m.payload.reason);
                                let _ = cancel.send(true);
                            }
                            _ => {
                                control.cancelled.lock().unwrap_or_else(PoisonError::into_inner).insert(id);
                            }
                        }
                    }
                    IpcMessage::Shutdown(m) => {
                        tracing::debug!("{me}: shutdown ({})", m.payload.reason);
                        let _ = link
                            .send(IpcMessage::ShutdownAck(Routed::new(
                                me.to_string(),
                                ORCHESTRATOR,
                                ShutdownAckPayload::default(),
                            )))
                            .await;
                        // The turns it accepted still run (within the grace
                        // period), so answers to their requests are still read.
                        let _ = stop_tx.send(Some(ServeEnd::Shutdown));
                    }
                    other => tracing::debug!("{me}: unexpected {} message; ignored", other.kind()),
                }
            };
            // Without the orchestrator the running turn is cancelled at once
            // (it commits what it has): nobody would get its answer.
            if let Some((_, cancel)) = control.running.lock().unwrap_or_else(PoisonError::into_inner).as_ref() {
                let _ = cancel.send(true);
            }
            let _ = stop_tx.send(Some(end));
        })
    };

    // Jobs taken from the queue (run or skipped as cancelled).
    let mut taken: u64 = 0;
    let end = loop {
        if *terminate.borrow() {
            break ServeEnd::Shutdown;
        }
        let stopping = *stop.borrow();
        deliver_inbox(&mut conversation, runtime.inbox()).await;
        let job = match stopping {
            // Messages it accepted before `shutdown` are still served (the
            // orchestrator's grace period bounds it); without the
            // orchestrator nobody would get the answers.
            Some(ServeEnd::Shutdown) => match jobs.try_recv() {
                Ok(job) => job,
                Err(_) => break ServeEnd::Shutdown,
            },
            Some(end) => break end,
            None => {
                let job = tokio::select! {
                    job = jobs.recv() => job,
                    () = runtime.inbox().arrived() => continue,
                    _ = stop.changed() => continue,
                    _ = terminate.changed() => continue,
                };
                let Some(job) = job else { break ServeEnd::Disconnected };
                job
            }
        };
        taken += 1;
        let skipped = control.cancelled.lock().unwrap_or_else(PoisonError::into_inner).remove(&job.correlation_id);
        if !skipped {
            let restart = run_job(&agent, &mut conversation, &runtime, &control, &outbox, &me, job, &terminate).await;
            if restart {
                break ServeEnd::Restart;
            }
        }
        if jobs.is_empty() {
            // The orchestrator stops processes that idle (and counts the
            // jobs, so that one it sent meanwhile keeps this one busy).
            let idle = ObservePayload::Idle { jobs: taken };
            let _ = outbox.send(IpcMessage::Observe(Routed::new(me.to_string(), ORCHESTRATOR, idle)));
        }
    };
    // What arrived meanwhile is kept.
    deliver_inbox(&mut conversation, runtime.inbox()).await;
    drop(outbox);
    let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
    // The last answers are written before the process exits (a restart exits right after one).
    let _ = tokio::time::timeout(Duration::from_secs(2), link.flush()).await;
    reader.abort();
    agent.tooling.events.flushed().await;
    end
}

/// Sends `message`; false once the link is closed. A message over the frame
/// limit fails alone and the channel stays up: an answer is replaced by an
/// error answer to the same request (its caller learns why at once), any
/// other message is dropped with a log line.
async fn send_or_stand_in(link: &LinkSender, message: IpcMessage) -> bool {
    let stand_in = match &message {
        IpcMessage::DelegateResult(m) => Some((
            m.from.clone(),
            m.to.clone(),
            m.correlation_id.clone(),
            m.payload.turn.clone(),
            m.payload.responder.clone(),
        )),
        _ => None,
    };
    let kind = message.kind();
    match link.send(message).await {
        Ok(()) => true,
        Err(LinkError::Closed) => false,
        Err(error) => {
            let Some((from, to, correlation_id, turn, responder)) = stand_in else {
                tracing::warn!("a {kind} message could not be sent: {error}");
                return true;
            };
            tracing::warn!("the answer to {to} could not be sent: {error}");
            let mut answer = DelegateResultPayload::error(
                IPC_MESSAGE_TOO_LARGE,
                format!("the answer of {from} cannot be sent: {error}"),
            );
            answer.turn = turn;
            answer.responder = responder;
            let mut routed = Routed::new(from, to, answer);
            routed.correlation_id = correlation_id;
            link.send(IpcMessage::DelegateResult(routed)).await.is_ok()
        }
    }
}

/// Appends replies that arrived while no turn ran, and saves them.
async fn deliver_inbox(conversation: &mut Conversation, inbox: &Inbox) {
    let arrived = inbox.take();
    if arrived.is_empty() {
        return;
    }
    if let Err(error) = conversation.append_and_commit(arrived).await {
        tracing::warn!("saving a reply that arrived between turns: {error}");
    }
}

/// Sends turn progress to the orchestrator.
struct Observer<'a> {
    outbox: &'a mpsc::UnboundedSender<IpcMessage>,
    me: &'a AgentInstance,
    /// Text is streamed only for the terminal's own turns.
    stream_text: bool,
}

impl Observer<'_> {
    fn send(&self, payload: ObservePayload) {
        let _ = self.outbox.send(IpcMessage::Observe(Routed::new(self.me.to_string(), ORCHESTRATOR, payload)));
    }
}

impl TurnObserver for Observer<'_> {
    fn text_delta(&self, text: &str) {
        if self.stream_text {
            self.send(ObservePayload::TextDelta { text: text.to_owned() });
        }
    }

    fn tool_call_finished(&self, call: &ToolCall, result: &ToolResult) {
        let status = match result.status {
            ToolStatus::Ok => "ok",
            ToolStatus::Error => "error",
            ToolStatus::Pending => "pending",
        };
        self.send(ObservePayload::ToolFinished {
            name: call.name.to_string(),
            status: status.to_owned(),
            error_code: result.error_code().map(str::to_owned),
        });
    }
}

/// Runs the turn for one message; true if it asked for a restart.
#[allow(clippy::too_many_arguments)]
async fn run_job(
    agent: &Agent,
    conversation: &mut Conversation,
    runtime: &SwarmRuntime,
    control: &Control,
    outbox: &mpsc::UnboundedSender<IpcMessage>,
    me: &AgentInstance,
    job: Job,
    terminate: &watch::Receiver<bool>,
) -> bool {
    let Job { correlation_id, from, payload, wants_answer } = job;
    let (cancel_tx, cancel) = watch::channel(false);
    *control.running.lock().unwrap_or_else(PoisonError::into_inner) = Some((correlation_id.clone(), cancel_tx.clone()));
    // SIGTERM cancels the turn too.
    let mut terminate = terminate.clone();
    let on_terminate = tokio::spawn(async move {
        if terminate.wait_for(|t| *t).await.is_ok() {
            let _ = cancel_tx.send(true);
        }
    });
    let observer = Observer { outbox, me, stream_text: payload.source.kind == goondan_ipc::CLI };
    observer.send(ObservePayload::TurnStarted { source: payload.source.clone() });
    runtime.hops.store(payload.hops, Ordering::Relaxed);
    let trace_id = payload.trace_id.clone().unwrap_or_default();
    if payload.source.kind != goondan_ipc::CLI {
        runtime.emit(
            "agent.request.received",
            &trace_id,
            "",
            json!({"correlationId": correlation_id, "from": from, "eventType": payload.event_type,
                   "eventId": payload.event_id, "async": payload.asynchronous, "wantsAnswer": wants_answer}),
        );
    }
    let mut metadata = JsonObject::new();
    if payload.source.kind != goondan_ipc::CLI {
        let mut inbound = json!({
            "sourceKind": payload.source.kind,
            "sourceName": payload.source.name,
            "eventName": payload.event_type,
            "eventId": payload.event_id,
            "correlationId": correlation_id,
        });
        if let Some(key) = &payload.source.instance_key {
            inbound["instanceKey"] = json!(key);
        }
        if !payload.metadata.is_empty() {
            inbound["eventMetadata"] = JsonValue::Object(payload.metadata.clone());
        }
        metadata.insert(INBOUND_METADATA_KEY.to_owned(), inbound);
    }
    let input = TurnInput { text: payload.input, trace_id: payload.trace_id.clone(), metadata };
    let outcome = agent.run_turn(conversation, input, &observer, cancel).await;
    on_terminate.abort();
    *control.running.lock().unwrap_or_else(PoisonError::into_inner) = None;
    runtime.hops.store(0, Ordering::Relaxed);
    let summary = summary(&outcome);
    observer.send(ObservePayload::TurnEnded { summary: summary.clone() });
    if wants_answer {
        let answer = answer_of(&outcome, summary, me);
        if payload.source.kind != goondan_ipc::CLI {
            runtime.emit(
                "agent.response.sent",
                &trace_id,
                "",
                json!({"correlationId": correlation_id, "to": from, "status": match answer.status {
                    ResultStatus::Ok => "ok", ResultStatus::Error => "error", ResultStatus::Timeout => "timeout" }}),
            );
        }
        let _ = outbox
            .send(IpcMessage::DelegateResult(Routed::new(me.to_string(), from, answer).correlated(correlation_id)));
    }
    outcome.restart_requested
}

fn summary(outcome: &TurnOutcome) -> TurnSummary {
    TurnSummary {
        turn_id: String::new(),
        end: outcome.end.as_str().to_owned(),
        note: outcome.end.note(),
        steps: outcome.steps,
        usage: serde_json::to_value(outcome.usage).unwrap_or(JsonValue::Null),
        restart_requested: outcome.restart_requested,
    }
}

fn answer_of(outcome: &TurnOutcome, summary: TurnSummary, me: &AgentInstance) -> DelegateResultPayload {
    let response = (!outcome.text.is_empty()).then(|| outcome.text.clone());
    let (status, error) = match &outcome.end {
        TurnEnd::Answered | TurnEnd::StepLimit { .. } => (ResultStatus::Ok, None),
        TurnEnd::Cancelled => (
            ResultStatus::Error,
            Some(ErrorInfo::new(AGENT_REQUEST_CANCELLED, format!("{me} cancelled the turn that served the request"))),
        ),
        other => (
            ResultStatus::Error,
            Some(ErrorInfo::new(
                AGENT_TURN_FAILED,
                format!("{me} could not answer: {}", other.note().unwrap_or_else(|| other.as_str().to_owned())),
            )),
        ),
    };
    DelegateResultPayload { status, response, error, turn: Some(summary), responder: Some(me.clone()), request: None }
}
