//! The serve loop: one turn per `delegate` or `event`, in order.
//!
//! ```text
//! reader   delegate / event → the queue of turns
//!          delegate_result  → the tool call waiting for it, or (async) the inbox
//!          call_result      → the call waiting for it
//!          cancel           → the running turn (if it serves that request), or drop it from the queue
//!          shutdown, end of the connection → cancel the running turn, stop
//! worker   one turn at a time: observe(turn_started) → run_turn (caller's trace, inbound
//!          metadata) → observe(turn_ended) → delegate_result for a delegate;
//!          idle: replies in the inbox are appended to the conversation and saved at once,
//!          the last one as the input of a turn of their own (an async request is a task);
//!          then, queue empty: observe(idle, jobs and answers taken) for the hub's idle
//!          stops and a NATS host's acknowledgements — not while a background job a
//!          finished tool call left still runs (looked at again every few seconds);
//!          a task's completion message gets a turn of its own (crate::tasks)
//! writer   frames in order; one over the size limit fails alone (an answer becomes an
//!          error answer to the same request) and the channel stays up
//! ```

use goondan_core::sync::LockUnpoisoned;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use goondan_core::{JsonObject, JsonValue, ToolCall, ToolResult, ToolStatus};
use goondan_ipc::{
    AgentInstance, DelegatePayload, DelegateResultPayload, ErrorInfo, IpcMessage, LinkError, LinkSender, ORCHESTRATOR,
    ObservePayload, ResultStatus, Routed, ShutdownAckPayload, TurnSummary,
};
use goondan_runtime::conversation::Conversation;
use goondan_runtime::inbox::Inbox;
use goondan_runtime::tasks::TaskBook;
use goondan_runtime::turn::{Agent, TurnInput, TurnObserver};
use goondan_runtime::{TurnEnd, TurnOutcome};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use goondan_ipc::codes::{AGENT_REQUEST_CANCELLED, AGENT_TURN_FAILED, IPC_MESSAGE_TOO_LARGE};

use crate::channel::AgentChannel;
use crate::swarm::{INBOUND_METADATA_KEY, SwarmRuntime};

/// Whether a background job a finished tool call left (`server > log 2>&1 &`)
/// still runs. The process is then not idle: the hub's idle stop would end
/// the job with the process. Called off the async threads (it may scan `/proc`).
pub type LeftRunning = Arc<dyn Fn() -> bool + Send + Sync>;

/// How often a process kept from idling by a background job looks again.
const LEFT_RUNNING_RECHECK: Duration = Duration::from_secs(2);

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
    /// A span the turn links back to (the call that started a task whose
    /// end the turn delivers): `(traceId, spanId)`.
    link: Option<(String, String)>,
    /// Metadata the turn's user message carries as it is (an asynchronous
    /// answer's, so that its input is found as that answer).
    message_metadata: JsonObject,
}

impl Job {
    fn of(message: Routed<DelegatePayload>, wants_answer: bool) -> Self {
        Self {
            correlation_id: message.correlation_id.unwrap_or_default(),
            from: message.from,
            payload: message.payload,
            wants_answer,
            link: None,
            message_metadata: JsonObject::new(),
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
    /// `delegate_result` messages taken in (see `ObservePayload::Idle`).
    answers: AtomicU64,
}

/// Runs the instance: one turn per `delegate` or `event`, until `shutdown`,
/// the end of the connection, or a turn that asks for a restart.
/// `terminate` turning true (SIGTERM) stops it like `shutdown`.
pub async fn serve(
    agent: Agent,
    mut conversation: Conversation,
    channel: AgentChannel,
    runtime: Arc<SwarmRuntime>,
    tasks: Arc<TaskBook>,
    left_running: LeftRunning,
    mut terminate: watch::Receiver<bool>,
) -> ServeEnd {
    let AgentChannel { link, mut receiver, init } = channel;
    let me = init.instance.clone();
    // Tasks that ended before this process (or whose delivery a crash cut):
    // delivered now, unless the conversation has them already.
    crate::tasks::reconcile(&tasks, runtime.inbox(), conversation.messages(), true).await;
    runtime.note_answers_in(conversation.messages());
    let control = Arc::new(Control::default());
    // The reader, the writer and the task cancels they start: all of them
    // end with `serve` (cancelled, then waited for).
    let tracker = TaskTracker::new();
    let cancel = CancellationToken::new();
    // Unbounded: the reader must never wait on the turn (the answers and
    // cancels a running turn waits for come through it); what it queues is
    // bounded by the orchestrator, which hands a process only its own
    // queue's work.
    let (jobs_tx, mut jobs) = mpsc::unbounded_channel::<Job>();
    let (stop_tx, mut stop) = watch::channel(None::<ServeEnd>);
    // Frames of the worker (observations, answers) go out in order through
    // one task. Unbounded: they are this process's own (sent from
    // synchronous code in the turn), not input from outside.
    let (outbox, mut outgoing) = mpsc::unbounded_channel::<IpcMessage>();
    let writer_link = Arc::clone(&link);
    let writer = tracker.spawn(cancel.clone().run_until_cancelled_owned(async move {
        while let Some(message) = outgoing.recv().await {
            if !send_or_stand_in(&writer_link, message).await {
                break;
            }
        }
    }));

    {
        let tasks = Arc::clone(&tasks);
        let control = Arc::clone(&control);
        let runtime = Arc::clone(&runtime);
        let stop_tx = stop_tx.clone();
        let link = Arc::clone(&link);
        let me = me.clone();
        let (tracker, cancel) = (tracker.clone(), cancel.clone());
        tracker.clone().spawn(cancel.clone().run_until_cancelled_owned(async move {
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
                        // Counted once it is with its tool call or in the inbox.
                        control.answers.fetch_add(1, Ordering::SeqCst);
                    }
                    IpcMessage::CallResult(m) => {
                        if let Some(id) = m.correlation_id {
                            runtime.resolve_call(&id, m.payload);
                        }
                    }
                    IpcMessage::Cancel(m) => {
                        let Some(id) = m.correlation_id else { continue };
                        let running = control.running.lock_unpoisoned();
                        match running.as_ref() {
                            Some((current, cancel)) if *current == id => {
                                tracing::info!("{me}: cancelling the turn for {id} ({})", m.payload.reason);
                                let _ = cancel.send(true);
                            }
                            _ => {
                                control.cancelled.lock_unpoisoned().insert(id);
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
                    IpcMessage::TaskCancel(m) => {
                        let tasks = Arc::clone(&tasks);
                        tracker.spawn(cancel.clone().run_until_cancelled_owned(async move {
                            // A person's cancel: the model gets the end as a message.
                            if let Err(error) = tasks.cancel_for_operator(&m.payload.handle).await {
                                tracing::info!("cancelling task {}: {}", m.payload.handle, error.message);
                            }
                        }));
                    }
                    other => tracing::debug!("{me}: unexpected {} message; ignored", other.kind()),
                }
            };
            // Without the orchestrator the running turn is cancelled at once
            // (it commits what it has): nobody would get its answer.
            if let Some((_, cancel)) = control.running.lock_unpoisoned().as_ref() {
                let _ = cancel.send(true);
            }
            let _ = stop_tx.send(Some(end));
        }));
    }

    // Jobs taken from the queue (run or skipped as cancelled).
    let mut taken: u64 = 0;
    // Whether the process says it is idle once nothing is left to do: after
    // each job, and after replies it took in between turns.
    let mut owe_idle = false;
    // When to look again whether the background jobs that kept it from
    // idling have ended.
    let mut recheck: Option<tokio::time::Instant> = None;
    // The worker watches its own receiver of `terminate`: the loop waits
    // for changes on the one it has (a clone sees the same value).
    let worker_terminate = terminate.clone();
    let worker = Worker {
        agent: &agent,
        runtime: &runtime,
        control: &control,
        outbox: &outbox,
        me: &me,
        terminate: &worker_terminate,
        tasks: &tasks,
    };
    let end = loop {
        if *terminate.borrow() {
            break ServeEnd::Shutdown;
        }
        let stopping = *stop.borrow();
        // Read before the inbox is taken: every answer counted is in the
        // conversation (saved) by the time the count goes out with `idle`.
        let answers = control.answers.load(Ordering::SeqCst);
        let (mut replies, completions) = take_inbox(runtime.inbox());
        // Answers of asynchronous requests that came while no turn ran: the
        // last one is the input of a turn of their own (they end tasks, as
        // a background command's end does); the others are saved before it.
        // Not while stopping: then they are only saved.
        let reply_turn = if stopping.is_none() { replies.pop() } else { None };
        owe_idle |= !replies.is_empty();
        append_replies(&mut conversation, replies).await;
        // Tasks that ended while no turn ran: a turn each, in the order they
        // ended (not while stopping: they stay undelivered for the next start).
        if (!completions.is_empty() || reply_turn.is_some()) && stopping.is_none() {
            let mut restart = false;
            for message in &completions {
                restart |= worker.run_job(&mut conversation, completion_job(message, &me)).await;
            }
            if let Some(reply) = reply_turn {
                restart |= worker.run_job(&mut conversation, reply_job(&reply, &me, &tasks)).await;
                keep_reply(&mut conversation, reply).await;
            }
            crate::tasks::reconcile(&tasks, runtime.inbox(), conversation.messages(), false).await;
            if restart {
                break ServeEnd::Restart;
            }
            owe_idle = true;
            continue;
        }
        // The orchestrator stops processes that idle (and counts the jobs,
        // so that one it sent meanwhile keeps this one busy); a transport
        // that holds messages until they are saved (NATS) acknowledges
        // them on it. A process whose tasks still work, or whose tool calls
        // left background jobs running, is not idle: stopping it would end
        // their work.
        if owe_idle && stopping.is_none() && jobs.is_empty() && !tasks.has_working() {
            let probe = Arc::clone(&left_running);
            if tokio::task::spawn_blocking(move || probe()).await.unwrap_or(false) {
                recheck = Some(tokio::time::Instant::now() + LEFT_RUNNING_RECHECK);
            } else {
                owe_idle = false;
                recheck = None;
                let idle = ObservePayload::Idle { jobs: taken, answers };
                let _ = outbox.send(IpcMessage::Observe(Routed::new(me.to_string(), ORCHESTRATOR, idle)));
            }
        }
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
                    () = until(recheck) => continue,
                };
                let Some(job) = job else { break ServeEnd::Disconnected };
                job
            }
        };
        taken += 1;
        let skipped = control.cancelled.lock_unpoisoned().remove(&job.correlation_id);
        if !skipped {
            let restart = worker.run_job(&mut conversation, job).await;
            // Completions the turn's steps took in are delivered now.
            crate::tasks::reconcile(&tasks, runtime.inbox(), conversation.messages(), false).await;
            if restart {
                break ServeEnd::Restart;
            }
        }
        owe_idle = true;
    };
    // What arrived meanwhile is kept (completions stay undelivered: the
    // next start gives them their turns).
    deliver_inbox(&mut conversation, runtime.inbox()).await;
    drop(outbox);
    let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
    // The last answers are written before the process exits (a restart exits right after one).
    let _ = tokio::time::timeout(Duration::from_secs(2), link.flush()).await;
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
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

/// Takes what arrived between turns: asynchronous replies, and the tasks'
/// completion messages.
fn take_inbox(inbox: &Inbox) -> (Vec<goondan_core::Message>, Vec<goondan_core::Message>) {
    let (completions, replies) =
        inbox.take().into_iter().partition(|message| crate::tasks::handle_of(message).is_some());
    (replies, completions)
}

/// Appends replies that arrived between turns and saves them at once.
async fn append_replies(conversation: &mut Conversation, replies: Vec<goondan_core::Message>) {
    if !replies.is_empty()
        && let Err(error) = conversation.append_and_commit(replies).await
    {
        tracing::warn!("saving a reply that arrived between turns: {error}");
    }
}

/// Appends and saves what arrived between turns (asynchronous replies); the
/// tasks' completion messages stay undelivered (the next start delivers them).
async fn deliver_inbox(conversation: &mut Conversation, inbox: &Inbox) {
    let (replies, _completions) = take_inbox(inbox);
    append_replies(conversation, replies).await;
}

/// The turn that delivers an asynchronous request's answer to an idle
/// instance: its input is the answer's message (text and metadata, so it
/// is found as that answer), a turn of the request's task.
fn reply_job(message: &goondan_core::Message, me: &AgentInstance, tasks: &TaskBook) -> Job {
    let input = match &message.data {
        goondan_core::MessageData::User { content } => content.clone(),
        _ => String::new(),
    };
    let request = crate::swarm::answered_request_of(message).unwrap_or_default();
    let task = tasks.tasks().into_iter().find(|task| task.handle == request);
    let tool = task.as_ref().map_or_else(|| "agents__request".to_owned(), |task| task.tool.clone());
    let link = task
        .and_then(|task| task.traceparent)
        .as_deref()
        .and_then(goondan_core::ids::parse_traceparent)
        .map(|call| (call.trace_id.to_owned(), call.span_id.to_owned()));
    Job {
        correlation_id: format!("reply:{request}"),
        from: me.to_string(),
        wants_answer: false,
        payload: task_payload(me, input, JsonObject::new(), tool),
        link,
        message_metadata: message.metadata.clone(),
    }
}

/// After the turn of `reply`: the answer is in the conversation even if
/// the turn ended before it saved its input (a layer failed first).
async fn keep_reply(conversation: &mut Conversation, reply: goondan_core::Message) {
    let request = crate::swarm::answered_request_of(&reply);
    let kept = conversation.messages().iter().any(|message| crate::swarm::answered_request_of(message) == request);
    if !kept {
        tracing::warn!("the turn of an asynchronous answer did not save it; saved now");
        append_replies(conversation, vec![reply]).await;
    }
}

/// The message of a turn that delivers what ended while the instance idled
/// (a task's end, an asynchronous answer): a `task.completed` event from
/// the instance itself, its source the tool that started the work.
fn task_payload(me: &AgentInstance, input: String, metadata: JsonObject, tool: String) -> DelegatePayload {
    DelegatePayload {
        event_id: goondan_core::ids::new_id(),
        event_type: TASK_COMPLETED_EVENT.to_owned(),
        instance_key: me.instance_key.clone(),
        input,
        metadata,
        trace_id: None,
        traceparent: None,
        asynchronous: false,
        hops: 0,
        source: goondan_ipc::MessageSourceInfo { kind: TASK_SOURCE.to_owned(), name: tool, instance_key: None },
        tool_call_id: None,
    }
}

/// Waits until `at`; forever without one.
async fn until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The turn that delivers an ended task's result to an idle instance: its
/// input is the completion message (text and `toolTask` metadata).
fn completion_job(message: &goondan_core::Message, me: &AgentInstance) -> Job {
    let input = match &message.data {
        goondan_core::MessageData::User { content } => content.clone(),
        _ => String::new(),
    };
    let task = message.metadata.get(crate::tasks::TOOL_TASK_METADATA_KEY).cloned().unwrap_or(JsonValue::Null);
    let handle = task.get("handle").and_then(JsonValue::as_str).unwrap_or_default().to_owned();
    let tool = task.get("tool").and_then(JsonValue::as_str).unwrap_or_default().to_owned();
    let link = task
        .get("traceparent")
        .and_then(JsonValue::as_str)
        .and_then(goondan_core::ids::parse_traceparent)
        .map(|call| (call.trace_id.to_owned(), call.span_id.to_owned()));
    let mut metadata = JsonObject::new();
    metadata.insert(crate::tasks::TOOL_TASK_METADATA_KEY.to_owned(), task);
    Job {
        correlation_id: format!("task:{handle}"),
        from: me.to_string(),
        wants_answer: false,
        payload: task_payload(me, input, metadata, tool),
        link,
        message_metadata: JsonObject::new(),
    }
}

/// A turn's input from a delegated message: its trace, and its parent span
/// when the sender's `traceparent` names a span of that trace.
fn turn_input(
    text: String,
    trace_id: Option<String>,
    traceparent: Option<&str>,
    metadata: JsonObject,
    link: Option<(String, String)>,
) -> TurnInput {
    let parent = traceparent
        .and_then(goondan_core::ids::parse_traceparent)
        .filter(|parent| trace_id.as_deref().is_none_or(|trace| trace == parent.trace_id))
        .map(|parent| (parent.trace_id.to_owned(), parent.span_id.to_owned()));
    let trace_id = trace_id.or_else(|| parent.as_ref().map(|(trace, _)| trace.clone()));
    TurnInput { text, trace_id, metadata, parent_span_id: parent.map(|(_, span)| span), link }
}

/// The source kind of a completion turn.
pub const TASK_SOURCE: &str = "task";
/// The event type of a completion turn.
pub const TASK_COMPLETED_EVENT: &str = "tool.task.completed";

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

    fn tool_calls_running(&self, calls: &[ToolCall]) {
        if self.stream_text {
            self.send(ObservePayload::ToolsRunning { names: calls.iter().map(|c| c.name.to_string()).collect() });
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

/// What the worker runs a turn with.
struct Worker<'a> {
    agent: &'a Agent,
    runtime: &'a SwarmRuntime,
    control: &'a Control,
    /// Frames to the hub, written in order by the writer task.
    outbox: &'a mpsc::UnboundedSender<IpcMessage>,
    me: &'a AgentInstance,
    /// SIGTERM: cancels the running turn.
    terminate: &'a watch::Receiver<bool>,
    /// The instance's tasks.
    tasks: &'a TaskBook,
}

impl Worker<'_> {
    /// Answers a message whose turn did not run because the conversation
    /// could not be saved (`commitFailed`, as a turn whose commit failed):
    /// its sender keeps the event and sends it again.
    fn answer_unsaved(&self, correlation_id: String, from: String, wants_answer: bool, note: String) {
        if !wants_answer {
            return;
        }
        let outcome = TurnOutcome::ended(TurnEnd::CommitFailed { message: note });
        let answer = answer_of(&outcome, summary(&outcome, self.tasks), self.me);
        let _ = self.outbox.send(IpcMessage::DelegateResult(
            Routed::new(self.me.to_string(), from, answer).correlated(correlation_id),
        ));
    }

    /// Runs the turn for one message; true if it asked for a restart.
    async fn run_job(&self, conversation: &mut Conversation, job: Job) -> bool {
        let Worker { agent, runtime, control, outbox, me, terminate, tasks } = *self;
        let Job { correlation_id, from, payload, wants_answer, link, message_metadata } = job;
        // A connector's event delivered again (the service restarted before
        // it recorded the turn's end): a turn that ran to its answer is not
        // run twice; what a cut-off turn left is taken out before it runs again.
        if let Some(key) = payload.metadata.get(DELIVERY_KEY).and_then(JsonValue::as_str) {
            // What an earlier turn could not save is not in memory either:
            // the check below must see what the store holds, never an
            // answer that was not saved.
            if !conversation.agrees_with_store().await {
                let note = "the conversation cannot be read back from its store".to_owned();
                self.answer_unsaved(correlation_id, from, wants_answer, note);
                return false;
            }
            match redelivery(conversation.messages(), key) {
                Some(Redelivered::Answered(text)) => {
                    tracing::info!(delivery_key = key, "the event's turn already ran to its answer; not run again");
                    let summary = TurnSummary {
                        tasks_working: Vec::new(),
                        turn_id: String::new(),
                        end: "answered".to_owned(),
                        note: Some("already answered (a redelivered event)".to_owned()),
                        steps: 0,
                        usage: JsonValue::Null,
                        restart_requested: false,
                        model_error_kind: None,
                    };
                    if wants_answer {
                        let answer = DelegateResultPayload {
                            status: ResultStatus::Ok,
                            response: Some(text),
                            error: None,
                            turn: Some(Box::new(summary)),
                            responder: Some(me.clone()),
                            request: None,
                        };
                        let _ = outbox.send(IpcMessage::DelegateResult(
                            Routed::new(me.to_string(), from, answer).correlated(correlation_id),
                        ));
                    }
                    return false;
                }
                Some(Redelivered::CutOff(ids)) => {
                    tracing::warn!(
                        delivery_key = key,
                        "the event's earlier turn was cut off; its {} message(s) are replaced by a new turn",
                        ids.len()
                    );
                    if let Err(error) = conversation.remove_and_commit(&ids).await {
                        // Not run on top of what it left: the event runs
                        // again once the store can be written.
                        tracing::error!(delivery_key = key, %error, "taking out the cut-off turn failed");
                        let note = format!("taking out the cut-off turn failed: {error}");
                        self.answer_unsaved(correlation_id, from, wants_answer, note);
                        return false;
                    }
                }
                None => {}
            }
        }
        let (cancel_tx, cancel) = watch::channel(false);
        *control.running.lock_unpoisoned() = Some((correlation_id.clone(), cancel_tx.clone()));
        // SIGTERM cancels the turn too.
        let mut terminate = terminate.clone();
        let on_terminate = tokio::spawn(async move {
            if terminate.wait_for(|t| *t).await.is_ok() {
                let _ = cancel_tx.send(true);
            }
        });
        // The terminal's turns stream, and so do those that deliver a task's
        // end (whoever watches the instance sees what it makes of it).
        let streamed = payload.source.kind == goondan_ipc::CLI || payload.source.kind == TASK_SOURCE;
        let observer = Observer { outbox, me, stream_text: streamed };
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
        metadata.extend(message_metadata);
        let input = turn_input(payload.input, payload.trace_id.clone(), payload.traceparent.as_deref(), metadata, link);
        let outcome = agent.run_turn(conversation, input, &observer, cancel).await;
        on_terminate.abort();
        *control.running.lock_unpoisoned() = None;
        runtime.hops.store(0, Ordering::Relaxed);
        // The tasks of the answers the turn took in are ended first: the
        // summary's working tasks are the ones still out.
        runtime.tasks_settled().await;
        let mut summary = summary(&outcome, tasks);
        with_queued_ends(&mut summary, runtime.inbox());
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
}

/// The metadata key of a connector event's delivery key (the ingress's).
const DELIVERY_KEY: &str = "deliveryKey";

/// What an earlier delivery of the same event left in the conversation.
#[derive(Debug, PartialEq)]
enum Redelivered {
    /// Its turn ran to this answer.
    Answered(String),
    /// Its turn was cut off: these messages (its input onwards, at the end
    /// of the conversation) are what it left.
    CutOff(Vec<String>),
}

fn delivery_key_of(message: &goondan_core::Message) -> Option<&str> {
    message.metadata.get(INBOUND_METADATA_KEY)?.get("eventMetadata")?.get(DELIVERY_KEY)?.as_str()
}

/// Whether `message` delivers a task's end (a completion message, taken
/// in during a turn or given a turn of its own): not another event's input.
fn is_task_message(message: &goondan_core::Message) -> bool {
    message.metadata.contains_key(crate::tasks::TOOL_TASK_METADATA_KEY)
        || message
            .metadata
            .get(INBOUND_METADATA_KEY)
            .and_then(|inbound| inbound.get("sourceKind"))
            .is_some_and(|kind| kind == TASK_SOURCE)
}

/// Finds the turn of the delivery `key` in `messages`: the latest user
/// message that came with a delivery key, if it is `key`'s, up to the next
/// user message that is not a task's end. A task the turn started may end,
/// and be answered, before the event is delivered again (a crash cut the
/// turn off; the next start delivers the task's end first): an answer to it
/// answers the event too, and a cut-off turn's removal keeps task ends.
fn redelivery(messages: &[goondan_core::Message], key: &str) -> Option<Redelivered> {
    use goondan_core::MessageData;
    // Turns of one instance run in their events' order, so a redelivered
    // event's turn can only be the latest one that came with a key: look no
    // further back than that (a turn costs no walk over the whole history).
    let start =
        messages.iter().rposition(|m| matches!(m.data, MessageData::User { .. }) && delivery_key_of(m).is_some())?;
    if delivery_key_of(&messages[start]) != Some(key) {
        return None;
    }
    let rest = &messages[start + 1..];
    let end = rest
        .iter()
        .position(|m| matches!(m.data, MessageData::User { .. }) && !is_task_message(m))
        .unwrap_or(rest.len());
    let turn = &rest[..end];
    match turn.last().map(|m| &m.data) {
        Some(MessageData::Assistant { content, tool_calls }) if tool_calls.is_empty() => {
            Some(Redelivered::Answered(content.clone().unwrap_or_default()))
        }
        // Cut off, and nothing came after it: its messages go (task ends stay).
        _ if end == rest.len() => Some(Redelivered::CutOff(
            messages[start..].iter().filter(|m| !is_task_message(m)).map(|m| m.id.clone()).collect(),
        )),
        // Cut off, with later turns after it: left as it is, the event runs again.
        _ => None,
    }
}

fn summary(outcome: &TurnOutcome, tasks: &TaskBook) -> TurnSummary {
    TurnSummary {
        tasks_working: tasks.tasks().into_iter().filter(|t| !t.state.is_final()).map(|t| t.handle).collect(),
        turn_id: String::new(),
        end: outcome.end.as_str().to_owned(),
        note: outcome.end.note(),
        steps: outcome.steps,
        usage: serde_json::to_value(outcome.usage).unwrap_or(JsonValue::Null),
        restart_requested: outcome.restart_requested,
        model_error_kind: outcome.end.model_error_kind().map(str::to_owned),
    }
}

/// Adds to the summary's working tasks those whose ends wait in the inbox
/// for a turn of their own: whoever waits for their ends' turns (a one-shot
/// run) must not stop before these run.
fn with_queued_ends(summary: &mut TurnSummary, inbox: &Inbox) {
    let queued = inbox.find_in_queued(|message| {
        crate::tasks::handle_of(message).map(str::to_owned).or_else(|| crate::swarm::answered_request_of(message))
    });
    for handle in queued {
        if !summary.tasks_working.contains(&handle) {
            summary.tasks_working.push(handle);
        }
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
    DelegateResultPayload {
        status,
        response,
        error,
        turn: Some(Box::new(summary)),
        responder: Some(me.clone()),
        request: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use goondan_core::{Message, MessageData, MessageSource};

    fn user(text: &str, key: Option<&str>) -> Message {
        let mut message = Message::new(MessageData::User { content: text.into() }, MessageSource::User);
        if let Some(key) = key {
            message.metadata.insert(
                INBOUND_METADATA_KEY.into(),
                json!({"sourceKind": "connector", "eventMetadata": {"deliveryKey": key}}),
            );
        }
        message
    }

    fn answer(text: &str) -> Message {
        Message::new(
            MessageData::Assistant { content: Some(text.into()), tool_calls: vec![] },
            MessageSource::Assistant { step_id: "s".into() },
        )
    }

    fn calling() -> Message {
        Message::assistant_tool_calls(
            "s",
            vec![ToolCall { id: "c1".into(), name: "bash__exec".into(), args: JsonObject::new() }],
        )
    }

    #[test]
    fn a_completion_turn_links_back_to_the_call_that_started_the_task() {
        let mut message = user("done", None);
        let traceparent = "00-0123456789abcdef0123456789abcdef-00f067aa0ba902b7-01";
        message.metadata.insert(
            crate::tasks::TOOL_TASK_METADATA_KEY.into(),
            json!({"handle": "task-1", "tool": "bash__exec", "traceparent": traceparent}),
        );
        let me = AgentInstance::new("worker", "default");
        let job = completion_job(&message, &me);
        assert_eq!(job.link, Some(("0123456789abcdef0123456789abcdef".to_owned(), "00f067aa0ba902b7".to_owned())));
        let input = turn_input(job.payload.input, job.payload.trace_id, None, JsonObject::new(), job.link);
        assert!(input.trace_id.is_none(), "a trace of its own");
        assert_eq!(input.link.map(|(_, span)| span).as_deref(), Some("00f067aa0ba902b7"));
        // A delegate's traceparent parents the turn in its trace.
        let delegated_in =
            |trace: &str| turn_input("x".into(), Some(trace.into()), Some(traceparent), JsonObject::new(), None);
        let input = delegated_in("0123456789abcdef0123456789abcdef");
        assert_eq!(input.parent_span_id.as_deref(), Some("00f067aa0ba902b7"));
        // One naming another trace does not.
        assert!(delegated_in("ffffffffffffffffffffffffffffffff").parent_span_id.is_none());
    }

    #[test]
    fn a_redelivered_event_is_answered_or_its_cut_off_turn_taken_out() {
        let answered = [user("hi", Some("tg/1")), answer("hello"), user("next", Some("tg/2")), answer("ok")];
        assert_eq!(redelivery(&answered, "tg/2"), Some(Redelivered::Answered("ok".into())));
        // Only the latest keyed turn can be a redelivery (turns run in order).
        assert_eq!(redelivery(&answered, "tg/1"), None);
        assert_eq!(redelivery(&answered, "tg/3"), None);
        let cut = [user("hi", Some("tg/1")), answer("hello"), user("run it", Some("tg/2")), calling()];
        let ids: Vec<String> = cut[2..].iter().map(|m| m.id.clone()).collect();
        assert_eq!(redelivery(&cut, "tg/2"), Some(Redelivered::CutOff(ids)));
        // A cut-off turn with later turns after it is left alone.
        let later = [user("run it", Some("tg/2")), calling(), user("other", None), answer("x")];
        assert_eq!(redelivery(&later, "tg/2"), None);
        // The terminal's input has no key.
        assert_eq!(redelivery(&[user("hi", None), answer("a")], "tg/1"), None);
        // A task the cut-off turn started ended, and was answered, first.
        let mut ended = user("{\"type\":\"tool_task_result\"}", None);
        ended.metadata.insert(crate::tasks::TOOL_TASK_METADATA_KEY.into(), json!({"handle": "task-1"}));
        let answered_task = [user("run it", Some("tg/2")), ended.clone(), answer("noted")];
        assert_eq!(redelivery(&answered_task, "tg/2"), Some(Redelivered::Answered("noted".into())));
        // Its end came, unanswered: the turn goes, the task's end stays.
        let cut_task = [user("run it", Some("tg/2")), calling(), ended];
        let ids = vec![cut_task[0].id.clone(), cut_task[1].id.clone()];
        assert_eq!(redelivery(&cut_task, "tg/2"), Some(Redelivered::CutOff(ids)));
    }
}
