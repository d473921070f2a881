//! The swarm client: the `agents` tool's runtime in an agent process
//! ([`SwarmRuntime`]). Requests go to the hub over the channel; their
//! answers come back by correlation id, synchronous ones to the waiting
//! tool call, asynchronous ones into the inbox (and so the conversation).

use goondan_core::sync::LockUnpoisoned;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use goondan_core::ids::{SpanIdGenerator, new_id};
use goondan_core::message::now_millis;
use goondan_core::{JsonObject, JsonValue, Message, MessageData, MessageSource};
use goondan_ipc::{
    AgentInstance, CallPayload, CallResultPayload, CancelPayload, DelegatePayload, DelegateResultPayload, ErrorInfo,
    IpcMessage, LinkError, LinkSender, MessageSourceInfo, ORCHESTRATOR, ResultStatus, Routed,
};
use goondan_runtime::inbox::Inbox;
use goondan_tools::agents::{AgentAnswer, AgentSendReceipt, DEFAULT_REQUEST_TIMEOUT_MS};
use goondan_tools::context::{AgentMessageRequest, AgentSpawnRequest};
use goondan_tools::events::{EventKind, EventSink, RuntimeEvent};
use goondan_tools::{AgentToolRuntime, BoxFuture, ToolContext, ToolFailure};
use serde_json::json;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use goondan_ipc::codes::{
    AGENT_NOT_FOUND, AGENT_REQUEST_TIMEOUT, AGENT_TURN_FAILED, IPC_DELIVERY_FAILED, IPC_MESSAGE_TOO_LARGE,
};

use crate::channel::AgentChannel;

/// The metadata key of an inbound message's origin (the original's).
pub const INBOUND_METADATA_KEY: &str = "__goondanInbound";
/// The metadata key of an asynchronous reply (the original's).
pub const INTER_AGENT_RESPONSE_METADATA_KEY: &str = "__goondanInterAgentResponse";
/// How long `send`, `spawn` and `list` wait for the orchestrator.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

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
    pub(crate) me: AgentInstance,
    pub(crate) swarm: goondan_ipc::SwarmInfo,
    pub(crate) link: LinkSender,
    waiting: Mutex<HashMap<String, Waiting>>,
    /// The hops of the request the running turn serves.
    pub(crate) hops: AtomicU32,
    inbox: Arc<Inbox>,
    /// Where this runtime's events (requests sent, answers received) go.
    events: Arc<dyn EventSink>,
    /// The instance's tasks: an asynchronous request is one until its answer.
    tasks: Option<Arc<goondan_runtime::tasks::TaskBook>>,
    /// The asynchronous requests whose answers the conversation has (or
    /// will have: queued in the inbox). A transport that delivers at least
    /// once (NATS: a redelivery, or a host lost before its acknowledgement)
    /// may bring an answer again; it enters the conversation once.
    answered: Mutex<HashSet<String>>,
    /// The writes that end asynchronous requests' tasks, still running:
    /// a turn's summary waits for them, so that a request whose answer the
    /// turn took in is never reported as still working.
    finishing: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The timers of asynchronous requests' timeouts: they hold the
    /// runtime weakly, and are cancelled when it is dropped.
    timers: TaskTracker,
    /// Cancelled when the runtime is dropped.
    dropped: CancellationToken,
    this: std::sync::Weak<SwarmRuntime>,
}

impl Drop for SwarmRuntime {
    fn drop(&mut self) {
        self.dropped.cancel();
        self.timers.close();
    }
}

impl std::fmt::Debug for SwarmRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwarmRuntime").field("me", &self.me).finish_non_exhaustive()
    }
}

/// What a [`SwarmRuntime`] is built with besides its channel.
pub struct SwarmParts {
    /// The inbox asynchronous replies go to (the agent's).
    pub inbox: Arc<Inbox>,
    /// Where the runtime's events (requests sent, answers received) go:
    /// the agent's events.
    pub events: Arc<dyn EventSink>,
    /// The instance's tasks (every agent process has a book; `None` keeps
    /// no task for an asynchronous request).
    pub tasks: Option<Arc<goondan_runtime::tasks::TaskBook>>,
}

impl SwarmRuntime {
    /// The runtime of the instance `channel` runs.
    pub fn new(channel: &AgentChannel, parts: SwarmParts) -> Arc<Self> {
        let SwarmParts { inbox, events, tasks } = parts;
        Arc::new_cyclic(|this| Self {
            this: this.clone(),
            me: channel.init.instance.clone(),
            swarm: channel.init.swarm.clone(),
            link: Arc::clone(&channel.link),
            waiting: Mutex::new(HashMap::new()),
            hops: AtomicU32::new(0),
            inbox,
            events,
            tasks,
            answered: Mutex::new(HashSet::new()),
            finishing: Mutex::new(Vec::new()),
            timers: TaskTracker::new(),
            dropped: CancellationToken::new(),
        })
    }

    /// Waits until the tasks of the answers that arrived so far are
    /// recorded as ended.
    pub(crate) async fn tasks_settled(&self) {
        loop {
            let pending = std::mem::take(&mut *self.finishing.lock_unpoisoned());
            if pending.is_empty() {
                return;
            }
            for finish in pending {
                let _ = finish.await;
            }
        }
    }

    /// Takes note of the asynchronous answers `messages` (a loaded
    /// conversation) already hold, so that none of them enters it twice.
    pub fn note_answers_in(&self, messages: &[Message]) {
        let mut answered = self.answered.lock_unpoisoned();
        answered.extend(messages.iter().filter_map(answered_request_of));
    }

    /// The inbox asynchronous replies go to (the agent's).
    pub fn inbox(&self) -> &Arc<Inbox> {
        &self.inbox
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<String, Waiting>> {
        self.waiting.lock_unpoisoned()
    }

    pub(crate) fn emit(&self, name: &str, trace_id: &str, turn_id: &str, extra: JsonValue) {
        if self.events.enabled() {
            emit_event(&*self.events, &self.me, name, trace_id, turn_id, &extra);
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

    /// The payload of `request`, to an agent of the swarm (else the error).
    fn delegate_payload(
        &self,
        ctx: &ToolContext,
        request: &AgentMessageRequest,
        asynchronous: bool,
    ) -> Result<DelegatePayload, ToolFailure> {
        self.check_target(&request.target)?;
        Ok(DelegatePayload {
            event_id: new_id(),
            event_type: request.event_type.clone().unwrap_or_else(|| "agent.request".to_owned()),
            instance_key: request.instance_key.clone().unwrap_or_else(|| ctx.instance_key().to_owned()),
            input: request.input.clone(),
            metadata: request.metadata.clone(),
            trace_id: Some(ctx.scope().trace_id.to_string()),
            traceparent: Some(ctx.traceparent()),
            asynchronous,
            hops: self.hops.load(Ordering::Relaxed).saturating_add(1),
            source: MessageSourceInfo {
                kind: "agent".to_owned(),
                name: self.me.agent.clone(),
                instance_key: Some(self.me.instance_key.clone()),
            },
            tool_call_id: Some(ctx.tool_call_id().to_owned()),
        })
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

    /// Sends `message` (correlated by `correlation_id`, whose waiting
    /// entry hands its answer to `answer`) and waits up to `timeout` for
    /// the answer: `None` when none came in time. The entry is forgotten
    /// when this ends or is dropped, the orchestrator told if `cancel`.
    async fn exchange<T>(
        &self,
        message: IpcMessage,
        correlation_id: &str,
        answer: oneshot::Receiver<T>,
        cancel: bool,
        timeout: Duration,
    ) -> Result<Option<T>, ToolFailure> {
        self.send_message(message, correlation_id).await?;
        let _forget = Forget { runtime: self, correlation_id, cancel };
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(answer)) => Ok(Some(answer)),
            Ok(Err(_)) => Err(ToolFailure::with_code("the orchestrator went away", IPC_DELIVERY_FAILED)),
            Err(_) => Ok(None),
        }
    }

    /// Sends `message`, whose answer is the orchestrator's
    /// [`CallResultPayload`], and waits up to [`CALL_TIMEOUT`] for it.
    async fn exchange_call(
        &self,
        message: IpcMessage,
        correlation_id: &str,
    ) -> Result<Option<CallResultPayload>, ToolFailure> {
        let (tx, rx) = oneshot::channel();
        self.waiting().insert(correlation_id.to_owned(), Waiting::Call(tx));
        self.exchange(message, correlation_id, rx, false, CALL_TIMEOUT).await
    }

    async fn call(&self, payload: CallPayload) -> Result<JsonValue, ToolFailure> {
        let correlation_id = format!("call-{}", new_id());
        let message = IpcMessage::Call(
            Routed::new(self.me.to_string(), ORCHESTRATOR, payload).correlated(correlation_id.clone()),
        );
        match self.exchange_call(message, &correlation_id).await? {
            Some(CallResultPayload { error: Some(error), .. }) => Err(failure(error)),
            Some(CallResultPayload { output, .. }) => Ok(output),
            None => Err(ToolFailure::with_code(
                format!("the orchestrator did not answer within {CALL_TIMEOUT:?}"),
                IPC_DELIVERY_FAILED,
            )),
        }
    }

    /// An answer arrived.
    pub(crate) fn resolve(&self, correlation_id: &str, answer: DelegateResultPayload) {
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

    pub(crate) fn resolve_call(&self, correlation_id: &str, answer: CallResultPayload) {
        let waiting = self.waiting().remove(correlation_id);
        match waiting {
            Some(Waiting::Call(tx)) => {
                let _ = tx.send(answer);
            }
            // A call's answer to a request: the request was not delivered.
            Some(Waiting::Answer(tx)) => {
                let _ = tx.send(undelivered(answer));
            }
            Some(Waiting::Async(request)) => self.deliver_async(correlation_id, &request, &undelivered(answer)),
            None => {}
        }
    }

    /// An asynchronous request's answer (or failure) as a message of the
    /// conversation, shaped as the original's `inter_agent_response`.
    fn deliver_async(&self, correlation_id: &str, request: &AsyncRequest, answer: &DelegateResultPayload) {
        if !self.answered.lock_unpoisoned().insert(correlation_id.to_owned()) {
            tracing::debug!("the answer to {correlation_id} arrived again; the conversation has it already");
            return;
        }
        // The request's task ends with its answer; the answer's message
        // below is how the conversation gets it (no completion message).
        if let Some(tasks) = &self.tasks {
            let end =
                match (&answer.status, &answer.error) {
                    (ResultStatus::Ok, _) => goondan_tools::tasks::TaskEnd::Completed(goondan_core::ToolResult::ok(
                        json!({"target": request.target, "response": answer.response.clone().unwrap_or_default()}),
                    )),
                    (_, error) => goondan_tools::tasks::TaskEnd::Failed(error.as_ref().map_or_else(
                        || "the agent request failed".to_owned(),
                        |e| format!("{}: {}", e.code, e.message),
                    )),
                };
            let (tasks, handle) = (Arc::clone(tasks), correlation_id.to_owned());
            let finish = tokio::spawn(async move {
                if let Err(error) = tasks.finish_received(&handle, end).await {
                    tracing::debug!("the task of request {handle}: {}", error.message);
                }
            });
            let mut finishing = self.finishing.lock_unpoisoned();
            finishing.retain(|finish| !finish.is_finished());
            finishing.push(finish);
        }
        let status = status_name(&answer.status);
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

/// The request an asynchronous answer in the conversation answers.
pub(crate) fn answered_request_of(message: &Message) -> Option<String> {
    let metadata = message.metadata.get(INTER_AGENT_RESPONSE_METADATA_KEY)?;
    metadata.get("requestId")?.as_str().map(str::to_owned)
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
            // Fire and forget: a drop cannot wait, and the cancel is one send on the link.
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let _ = link.send(cancel).await;
                });
            }
        }
    }
}

/// The failed answer of a request the orchestrator answered with a call's
/// result (it could not deliver the request).
fn undelivered(answer: CallResultPayload) -> DelegateResultPayload {
    DelegateResultPayload::failed(
        answer.error.unwrap_or_else(|| ErrorInfo::new(IPC_DELIVERY_FAILED, "the message was not delivered")),
    )
}

/// The name of an answer's status in the swarm's events and messages.
fn status_name(status: &ResultStatus) -> &'static str {
    match status {
        ResultStatus::Ok => "ok",
        ResultStatus::Error => "error",
        ResultStatus::Timeout => "timeout",
    }
}

fn failure(error: ErrorInfo) -> ToolFailure {
    let mut failure = ToolFailure::with_code(error.message, error.code);
    failure.suggestion = error.suggestion;
    failure.help_url = error.help_url;
    failure
}

impl AgentToolRuntime for SwarmRuntime {
    fn request<'a>(
        &'a self,
        ctx: &'a ToolContext,
        request: AgentMessageRequest,
    ) -> BoxFuture<'a, Result<AgentAnswer, ToolFailure>> {
        Box::pin(async move {
            let payload = self.delegate_payload(ctx, &request, request.asynchronous)?;
            let correlation_id = format!("corr-{}", new_id());
            let event_id = payload.event_id.clone();
            let trace_id = ctx.scope().trace_id.to_string();
            let target_key = payload.instance_key.clone();
            let timeout = Duration::from_millis(request.timeout_ms.unwrap_or(DEFAULT_REQUEST_TIMEOUT_MS));
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
                // Its task first (the answer may come at once); its work is
                // the other agent's, so a restart of this process leaves it working.
                if let Some(tasks) = &self.tasks {
                    let traceparent = ctx.traceparent();
                    tasks
                        .open_remote(
                            &correlation_id,
                            ctx.tool_name(),
                            ctx.tool_call_id(),
                            ctx.turn_id(),
                            Some(&traceparent),
                        )
                        .await?;
                }
                self.waiting().insert(correlation_id.clone(), Waiting::Async(pending));
                self.send_message(message, &correlation_id).await?;
                self.expire_async(correlation_id.clone(), timeout);
                return Ok(AgentAnswer {
                    target: request.target,
                    event_id,
                    correlation_id,
                    accepted: true,
                    asynchronous: true,
                    response: None,
                });
            }
            let (tx, rx) = oneshot::channel();
            self.waiting().insert(correlation_id.clone(), Waiting::Answer(tx));
            let answer = match self.exchange(message, &correlation_id, rx, true, timeout).await? {
                Some(answer) => answer,
                None => {
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
            let status = status_name(&answer.status);
            self.emit(
                "agent.response.received",
                &trace_id,
                ctx.turn_id(),
                json!({"correlationId": correlation_id, "from": request.target, "status": status,
                       "errorCode": answer.error.as_ref().map(|e| e.code.clone())}),
            );
            match (answer.status, answer.error) {
                (ResultStatus::Ok, _) => Ok(AgentAnswer {
                    target: request.target,
                    event_id,
                    correlation_id: correlation_id.clone(),
                    accepted: true,
                    asynchronous: false,
                    response: answer.response,
                }),
                (_, Some(error)) => Err(failure(error)),
                (_, None) => Err(ToolFailure::with_code("the request failed", AGENT_TURN_FAILED)),
            }
        })
    }

    fn send<'a>(
        &'a self,
        ctx: &'a ToolContext,
        request: AgentMessageRequest,
    ) -> BoxFuture<'a, Result<AgentSendReceipt, ToolFailure>> {
        Box::pin(async move {
            let payload = self.delegate_payload(ctx, &request, false)?;
            let event_id = payload.event_id.clone();
            let correlation_id = format!("event-{}", new_id());
            let message = IpcMessage::Event(
                Routed::new(self.me.to_string(), request.target.clone(), payload).correlated(correlation_id.clone()),
            );
            match self.exchange_call(message, &correlation_id).await? {
                Some(CallResultPayload { error: Some(error), .. }) => Err(failure(error)),
                Some(_) => Ok(AgentSendReceipt { target: request.target, event_id, accepted: true }),
                None => {
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
        let this = self.this.clone();
        self.timers.spawn(self.dropped.clone().run_until_cancelled_owned(async move {
            tokio::time::sleep(timeout).await;
            // Gone meanwhile: nobody is left to tell.
            let Some(runtime) = this.upgrade() else { return };
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
        }));
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

#[cfg(test)]
mod tests {
    use goondan_ipc::{AsyncRequestEcho, InitPayload, SwarmInfo};

    use super::*;

    fn runtime() -> Arc<SwarmRuntime> {
        let (ours, _theirs) = std::os::unix::net::UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        let _ = ours.set_nonblocking(true);
        let stream = tokio::net::UnixStream::from_std(ours).unwrap_or_else(|e| panic!("{e}"));
        let (read, write) = stream.into_split();
        let (link, receiver) = goondan_ipc::unix_link(read, write);
        let init = InitPayload {
            config: "/bundle".into(),
            instance: AgentInstance::new("coordinator", "default"),
            workdir: None,
            state_root: "/state".into(),
            env: Default::default(),
            tool_timeout_ms: None,
            swarm: SwarmInfo { name: "s".into(), entry_agent: "coordinator".into(), agents: vec!["worker".into()] },
        };
        let parts = SwarmParts {
            inbox: Arc::new(Inbox::default()),
            events: Arc::new(goondan_tools::events::NoopEventSink),
            tasks: None,
        };
        SwarmRuntime::new(&AgentChannel { link, receiver, init }, parts)
    }

    /// The answer of an asynchronous request made by an earlier process
    /// (it carries the request, as the hub sends it).
    fn answer() -> DelegateResultPayload {
        DelegateResultPayload {
            status: ResultStatus::Ok,
            response: Some("done".into()),
            error: None,
            turn: None,
            responder: None,
            request: Some(AsyncRequestEcho {
                target: "worker".into(),
                event_id: "e1".into(),
                event_type: "agent.request".into(),
                metadata: JsonObject::new(),
                trace_id: "t1".into(),
            }),
        }
    }

    #[tokio::test]
    async fn an_answer_delivered_again_enters_the_conversation_once() {
        let first = runtime();
        first.resolve("req-1", answer());
        first.resolve("req-1", answer());
        let taken = first.inbox().take();
        assert_eq!(taken.len(), 1, "{taken:?}");
        assert_eq!(answered_request_of(&taken[0]).as_deref(), Some("req-1"));
        // A later process of the instance, whose conversation has it: the
        // broker delivering it once more (its earlier holder died before
        // the acknowledgement) adds nothing.
        let next = runtime();
        next.note_answers_in(&taken);
        next.resolve("req-1", answer());
        assert!(next.inbox().is_empty());
        next.resolve("req-2", answer());
        assert_eq!(next.inbox().take().len(), 1, "another request's answer still enters");
    }
}
