//! A swarm's service: the swarm's Connections run, and the outside
//! world's events become turns. [`serve`] runs it until a stop; what it
//! says as it goes goes to a [`Report`], each event turn's answer to
//! [`Answers`] (it prints nothing itself).
//!
//! ```text
//! start   plan every Connection of the swarm (config and secrets resolved: a
//!         secret's unset variable stops start-up naming the Connection and
//!         the variable), open the inbox, resume what it holds pending, start
//!         the connectors (a port in use stops start-up, naming both)
//! serve   connector ─► ConnectionSink (route, store: fsync) ─► ack ─► dispatcher ─► hub turn
//!         a native connector that fails is started again with backoff
//! stop    SIGTERM / SIGHUP / Ctrl-C, or every connector ended on its own (cli at the
//!         end of its input) and nothing is left to run: connectors stop acceptuse std::collections::BTreeMap;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use goondan_config::{Bundle, BundleChanges};
use goondan_ingress::dispatch::{DispatchOptions, Dispatcher, TurnEnd, TurnRunner};
use goondan_ingress::inbox::{INBOX_FILE, Inbox, InboxOptions, Stored};
use goondan_ingress::service::ConnectionSink;
use goondan_ingress::{ConnectorContext, ConnectorError, EventSink};
use goondan_ipc::{AgentInstance, DelegateResultPayload, MessageSourceInfo};
use goondan_orchestrator::{Inbound, Orchestrator};
use tokio::sync::mpsc::Receiver;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::plan::{ConnectionPlan, ConnectorKind, plan_connections};

/// Runs stored events' turns through the hub.
struct HubTurns {
    orchestrator: Orchestrator,
    /// Where each event turn's answer goes.
    answers: Arc<dyn Answers>,
    /// OpenTelemetry: each event's turn is the child of a span of its own.
    telemetry: Option<goondan_telemetry::Exporter>,
}

#[async_trait]
impl TurnRunner for HubTurns {
    async fn run(&self, turn: &Stored, cancel: watch::Receiver<bool>) -> TurnEnd {
        let instance = AgentInstance::new(turn.entry.agent.clone(), turn.entry.instance.clone());
        let inbound = Inbound {
            input: turn.turn_input(),
            event_type: turn.entry.event.name.clone(),
            metadata: turn.turn_metadata(),
            source: MessageSourceInfo {
                kind: "connector".to_owned(),
                name: turn.entry.connection.clone(),
                instance_key: None,
            },
            trace_id: None,
            traceparent: None,
        };
        let span = self.telemetry.as_ref().map(|_| EventSpan::begin(turn, &instance));
        let inbound = match &span {
            Some(span) => Inbound {
                trace_id: Some(span.trace_id.clone()),
                traceparent: Some(goondan_core::ids::format_traceparent(&span.trace_id, span.span_id)),
                ..inbound
            },
            None => inbound,
        };
        let answer = self.orchestrator.deliver(&instance, inbound, cancel.clone()).await;
        let end = classify(&answer, *cancel.borrow());
        if let (Some(span), Some(exporter)) = (span, &self.telemetry) {
            exporter.export_span(span.end(&end));
        }
        if matches!(end, TurnEnd::Answered | TurnEnd::Failed(_)) {
            self.answers.answered(&EventAnswer { turn, instance: &instance, answer: &answer });
        }
        match &end {
            TurnEnd::Answered => tracing::info!(
                connection = %turn.entry.connection, event = %turn.entry.event.name, instance = %instance,
                steps = answer.turn.as_ref().map_or(0, |t| t.steps), "event turn answered"
            ),
            TurnEnd::Failed(message)
            | TurnEnd::Retry(message)
            | TurnEnd::Unsaved(message)
            | TurnEnd::Waiting(message) => tracing::warn!(
                connection = %turn.entry.connection, event = %turn.entry.event.name, instance = %instance,
                "event turn: {message}"
            ),
            TurnEnd::Hold(message) => tracing::error!(
                connection = %turn.entry.connection, event = %turn.entry.event.name, instance = %instance,
                "event turn held until the next start: {message}"
            ),
            TurnEnd::Interrupted => {}
        }
        end
    }
}

/// The span of one connector event's turn, in the hub: the root of the
/// trace the agents' spans continue.
struct EventSpan {
    trace_id: String,
    span_id: u64,
    start_ns: u64,
    name: String,
    attributes: Vec<(&'static str, goondan_telemetry::AttrValue)>,
}

impl EventSpan {
    fn begin(turn: &Stored, instance: &AgentInstance) -> Self {
        use goondan_telemetry::AttrValue;
        let trace_id = goondan_core::ids::new_trace_id();
        let span_id = goondan_core::ids::SpanIdGenerator::new().next_raw();
        Self {
            trace_id,
            span_id,
            start_ns: now_ns(),
            name: format!("process {}", turn.entry.connection),
            attributes: vec![
                ("goondan.connection", AttrValue::from(turn.entry.connection.as_str())),
                ("goondan.event.name", AttrValue::from(turn.entry.event.name.as_str())),
                ("goondan.delivery_key", AttrValue::from(turn.key.as_str())),
                ("gen_ai.agent.name", AttrValue::from(instance.agent.as_str())),
                ("goondan.instance_key", AttrValue::from(instance.instance_key.as_str())),
            ],
        }
    }

    fn end(self, end: &TurnEnd) -> goondan_telemetry::SpanRecord {
        let trace_id = u128::from_str_radix(&self.trace_id, 16).map(u128::to_be_bytes).unwrap_or([0; 16]);
        let status = match end {
            TurnEnd::Answered | TurnEnd::Interrupted => goondan_telemetry::SpanStatus::Unset,
            TurnEnd::Failed(message)
            | TurnEnd::Retry(message)
            | TurnEnd::Hold(message)
            | TurnEnd::Unsaved(message)
            | TurnEnd::Waiting(message) => goondan_telemetry::SpanStatus::Error(message.clone()),
        };
        goondan_telemetry::SpanRecord {
            trace_id,
            span_id: self.span_id,
            parent_span_id: 0,
            name: self.name,
            kind: goondan_telemetry::SpanKind::Consumer,
            start_ns: self.start_ns,
            end_ns: now_ns(),
            attributes: self.attributes,
            status,
            links: Vec::new(),
        }
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn classify(answer: &DelegateResultPayload, cancelled: bool) -> TurnEnd {
    match &answer.turn {
        Some(turn) => match turn.end.as_str() {
            "answered" | "stepLimit" => TurnEnd::Answered,
            "cancelled" if cancelled => TurnEnd::Interrupted,
            // The agent's store failed (a full disk): not the turn's fault,
            // and not done — it runs again once writes work.
            "commitFailed" => TurnEnd::Unsaved(format!(
                "the conversation could not be saved: {}",
                turn.note.clone().unwrap_or_default()
            )),
            other => TurnEnd::Failed(format!("the turn ended {other}: {}", turn.note.clone().unwrap_or_default())),
        },
        None if cancelled => TurnEnd::Interrupted,
        None => {
            let (code, message) =
                answer.error.as_ref().map_or(("", "no answer"), |error| (error.code.as_str(), error.message.as_str()));
            // An agent the bundle cannot build (a model's key not set, …)
            // fails the same way at every start: no retry, but the event
            // is kept for the start after the operator fixed it.
            if code == goondan_agent::instance::ready_codes::BUILD_FAILED {
                TurnEnd::Hold(format!("{code}: {message}"))
            } else if code == goondan_agent::instance::ready_codes::STORE_FAILED {
                // The instance's files cannot be opened or written (a full
                // disk): again with backoff until they can, never given up.
                TurnEnd::Unsaved(format!("{code}: {message}"))
            } else if code == goondan_ipc::codes::AGENT_NO_HOST {
                // Across hosts, none can run the agent now: kept until one
                // joins, never given up.
                TurnEnd::Waiting(format!("{code}: {message}"))
            } else {
                TurnEnd::Retry(format!("{code}: {message}"))
            }
        }
    }
}

/// What `serve` needs besides the plans.
pub struct ServeOptions {
    /// The swarm's workspace directory (the inbox lives in it).
    pub workspace_dir: PathBuf,
    /// How many instances run turns at once.
    pub max_concurrent: usize,
    /// How long running turns may take to finish when the service stops.
    pub grace: Duration,
    /// The bundle file (for the status file).
    pub bundle: String,
    /// The Swarm's name.
    pub swarm: String,
    /// The control socket's parts (`None`: no control socket).
    pub control: Option<ControlParts>,
    /// `--watch`: the bundle's watcher and what re-planning Connections needs.
    pub watch: Option<WatchParts>,
    /// The hub's OpenTelemetry exporter, when the `OTEL_*` variables ask for one.
    pub telemetry: Option<goondan_telemetry::Exporter>,
    /// Where each event turn's answer goes (the `cli` connector's user reads it).
    pub answers: Arc<dyn Answers>,
    /// The Swarm's `policy.lifecycle`: idle instances expire and are
    /// collected (`None`: never).
    pub lifecycle: Option<crate::lifecycle::Lifecycle>,
}

/// What `--watch` needs in a service.
pub struct WatchParts {
    /// The bundle's files, watched.
    pub watcher: crate::watch::BundleWatcher,
    /// The Swarm's entry agent (the default route).
    pub entry_agent: String,
    /// Reads secrets and settings (as at the start).
    pub env: goondan_runtime::agent::EnvLookup,
    /// Checks the bundle before a whole restart.
    pub check_bundle: crate::control::BundleCheck,
}

/// What the control socket needs besides the orchestrator.
pub struct ControlParts {
    /// The state root.
    pub root: goondan_runtime::store::StateRoot,
    /// The workspace the service runs on.
    pub workspace: goondan_runtime::store::Workspace,
    /// Checks the bundle on disk before a full restart.
    pub check_bundle: crate::control::BundleCheck,
}

/// One event turn that ended answered or failed: what its answer line says.
pub struct EventAnswer<'a> {
    /// The stored event.
    pub turn: &'a Stored,
    /// The instance that ran it.
    pub instance: &'a AgentInstance,
    /// Its answer.
    pub answer: &'a DelegateResultPayload,
}

/// Receives each event turn's answer, from the turns' tasks.
pub trait Answers: Send + Sync {
    /// An event turn ended answered or failed.
    fn answered(&self, answer: &EventAnswer<'_>);
}

/// The connectors run: what the service serves.
pub struct Serving<'a> {
    /// The Connections' names.
    pub connections: &'a [String],
    /// What the HTTP connectors listen on (`name on http://address`).
    pub listening: &'a [String],
    /// The events of the last run that were resumed.
    pub resumed: usize,
}

/// How the service stopped.
pub struct Stopped<'a> {
    /// Why (`interrupted`, `terminated`, `every connector ended`, …).
    pub reason: &'a str,
    /// Events stored whose turns did not run to their end: they run at the next start.
    pub pending: usize,
    /// Turns that had not started when the grace period ended.
    pub not_started: usize,
    /// It stops to start again (a full restart).
    pub restarting: bool,
}

/// What a serving service says as it goes, in order; `gdn` prints it.
/// None of it is fatal: the service serves on whether or not a line can
/// be written (standard error may be a log on a full disk).
pub trait Report {
    /// The connectors run.
    fn serving(&mut self, serving: &Serving<'_>);
    /// A status line (an edit taken, a connector replaced).
    fn note(&mut self, line: std::fmt::Arguments<'_>);
    /// An error line (a replacement connector that did not start).
    fn error(&mut self, line: std::fmt::Arguments<'_>);
    /// An edit that cannot be taken, with its reasons: what runs goes on.
    fn kept_running(&mut self, what: &str, errors: &[String]);
    /// The service stopped.
    fn stopped(&mut self, stopped: &Stopped<'_>);
}

/// Why the service did not start serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Another process holds the workspace's inbox (a service of the project runs).
    #[error(transparent)]
    InboxBusy(goondan_ingress::inbox::InboxError),
    /// The inbox cannot be opened.
    #[error(transparent)]
    Inbox(goondan_ingress::inbox::InboxError),
    /// A connector did not start (a port in use, …).
    #[error(transparent)]
    Connector(ConnectorError),
}

/// How `serve` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// A part the service cannot go on without ended (it exits failed).
    pub failed: bool,
    /// A full restart was asked for: the caller stops the agents and
    /// starts the service again.
    pub restart: Option<crate::control::FullRestart>,
}

/// A started connector, supervised.
struct Supervised {
    name: String,
    /// Stops this connector alone (a watched edit replaces it).
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    /// Turns true when the connector ended for good.
    ended: watch::Receiver<bool>,
}

/// Starts a connector; `input` is standard input for the first `cli`.
async fn start_connector(
    plan: &ConnectionPlan,
    sink: Arc<dyn EventSink>,
    stop: CancellationToken,
    input: Option<goondan_ingress::connector::InputStream>,
) -> Result<goondan_ingress::RunningConnector, ConnectorError> {
    let context = ConnectorContext {
        connection: plan.name.clone(),
        connector: plan.connector.clone(),
        config: plan.config.clone(),
        secrets: plan.secrets.clone(),
        sink,
        stop,
        input,
    };
    match &plan.kind {
        ConnectorKind::Native(start) => start(context).await,
        ConnectorKind::Script(script) => script.clone().start(context).await,
    }
}

/// Keeps a started connector running: a failure is logged and the
/// connector started again after a pause (1 s, doubling to a minute).
fn supervise(
    plan: ConnectionPlan,
    sink: Arc<dyn EventSink>,
    stop: CancellationToken,
    first: goondan_ingress::RunningConnector,
) -> Supervised {
    let name = plan.name.clone();
    let own_stop = stop.clone();
    let (ended_tx, ended) = watch::channel(false);
    let task = tokio::spawn(async move {
        // Set on every way out of this task.
        let _ended = EndedOnDrop(ended_tx);
        let mut running = first;
        let mut pause = Duration::from_secs(1);
        loop {
            let ended = (&mut running.task).await;
            match ended {
                Ok(Ok(())) => {
                    tracing::info!(connection = %plan.name, "the connector ended");
                    return;
                }
                Ok(Err(error)) => tracing::error!(connection = %plan.name, "the connector failed: {error}"),
                Err(error) => tracing::error!(connection = %plan.name, "the connector panicked: {error}"),
            }
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(Duration::from_secs(60));
                // Standard input was handed to the first start only.
                match start_connector(&plan, Arc::clone(&sink), stop.clone(), None).await {
                    Ok(started) => {
                        tracing::info!(connection = %plan.name, "the connector started again");
                        running = started;
                        break;
                    }
                    Err(error) => {
                        tracing::error!(connection = %plan.name, "starting the connector again failed: {error}")
                    }
                }
            }
        }
    });
    Supervised { name, stop: own_stop, task, ended }
}

struct EndedOnDrop(watch::Sender<bool>);

impl Drop for EndedOnDrop {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

/// Standard input for the `cli` connector, read by a thread of its own.
///
/// A read of standard input cannot be cancelled. `tokio::io::stdin` reads on
/// the runtime's blocking pool, and dropping the runtime waits for that read:
/// a service stopped by SIGTERM while its terminal or pipe stays open would
/// never exit. A plain thread blocked in `read` is left behind instead, and
/// ends with the process.
struct ThreadStdin {
    chunks: tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    current: Vec<u8>,
    at: usize,
}

impl ThreadStdin {
    fn start() -> goondan_ingress::connector::InputStream {
        use std::io::Read as _;
        // A few chunks ahead at most: what was read but not yet stored is
        // lost at a stop, as with any buffered reader of a pipe.
        let (chunks, receiver) = tokio::sync::mpsc::channel(2);
        let spawned = std::thread::Builder::new().name("gdn-stdin".to_owned()).spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buffer = vec![0; 64 * 1024];
            loop {
                let chunk = match stdin.read(&mut buffer) {
                    Ok(0) => return,
                    Ok(read) => Ok(buffer[..read].to_vec()),
                    Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(error) => Err(error),
                };
                let failed = chunk.is_err();
                if chunks.blocking_send(chunk).is_err() || failed {
                    return;
                }
            }
        });
        match spawned {
            Ok(_) => Box::new(Self { chunks: receiver, current: Vec::new(), at: 0 }),
            Err(error) => {
                tracing::warn!("no thread to read standard input ({error}); reading it on the runtime");
                Box::new(tokio::io::stdin())
            }
        }
    }
}

impl tokio::io::AsyncRead for ThreadStdin {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        loop {
            if self.at < self.current.len() {
                let take = buf.remaining().min(self.current.len() - self.at);
                let start = self.at;
                buf.put_slice(&self.current[start..start + take]);
                self.at += take;
                return Poll::Ready(Ok(()));
            }
            match self.chunks.poll_recv(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    self.current = chunk;
                    self.at = 0;
                }
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Err(error)),
                // The end of input.
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Serves the Connections `plans` until a stop.
pub async fn serve(
    plans: Vec<ConnectionPlan>,
    orchestrator: &Orchestrator,
    options: ServeOptions,
    shutdown: &crate::shutdown::Shutdown,
    report: &mut dyn Report,
) -> Result<Served, ServeError> {
    let inbox_path = options.workspace_dir.join(INBOX_FILE);
    // Unbounded: what goes through it is stored already (the inbox's writer
    // thread sends it, and the connectors waited for the store), and the
    // dispatcher takes each at once into its per-instance queues.
    let (stored_tx, stored_rx) = tokio::sync::mpsc::unbounded_channel();
    let (inbox, recovered) = match Inbox::open(&inbox_path, InboxOptions::default(), stored_tx) {
        Ok(opened) => opened,
        Err(error @ goondan_ingress::inbox::InboxError::Busy { .. }) => return Err(ServeError::InboxBusy(error)),
        Err(error) => return Err(ServeError::Inbox(error)),
    };
    let resumed = recovered.len();
    let runner = Arc::new(HubTurns {
        orchestrator: orchestrator.clone(),
        answers: Arc::clone(&options.answers),
        telemetry: options.telemetry.clone(),
    });
    let dispatch = DispatchOptions { max_concurrent: options.max_concurrent.max(1), ..DispatchOptions::default() };
    let dispatcher = Dispatcher::start(inbox.clone(), runner, recovered, stored_rx, dispatch);

    // Instances with task ends their conversations do not have yet (a task
    // that ended, or whose work died, while no process ran them) start now
    // and deliver them.
    start_instances_with_tasks(orchestrator, &options.workspace_dir).await;

    // SIGTERM and SIGHUP stop the service as Ctrl-C does.
    let (stop_tx, stop_rx) = watch::channel(false);
    shutdown.turn_started(stop_tx.clone());
    let mut service = Service {
        orchestrator,
        inbox,
        dispatcher,
        stop: CancellationToken::new(),
        plans: Vec::new(),
        supervised: Vec::new(),
        listening: BTreeMap::new(),
        workspace_dir: options.workspace_dir.clone(),
        swarm: options.swarm.clone(),
        sweeper: None,
    };
    if let Err(error) = service.start_connectors(plans).await {
        service.abandon().await;
        shutdown.turn_ended();
        return Err(ServeError::Connector(error));
    }
    let (notes_tx, mut notes) = tokio::sync::mpsc::unbounded_channel();
    if let Some(lifecycle) = options.lifecycle {
        let (root, workspace) = match &options.control {
            Some(parts) => (parts.root.clone(), parts.workspace.clone()),
            // `<root>/workspaces/<id>`.
            None => (
                goondan_runtime::store::StateRoot::new(
                    options.workspace_dir.parent().and_then(std::path::Path::parent).unwrap_or(&options.workspace_dir),
                ),
                goondan_runtime::store::Workspace::at(&options.workspace_dir),
            ),
        };
        let sweeper = crate::lifecycle::Sweeper {
            lifecycle,
            orchestrator: orchestrator.clone(),
            inbox: service.inbox.clone(),
            root,
            workspace,
            notes: notes_tx,
        };
        service.sweeper = Some(sweeper.spawn(service.stop.child_token()));
    }
    let (control_socket, restart_asked) = service.open_control(options.control);
    // The drain, cancelled turns' time to end, the agent processes' grace,
    // and the few seconds the hub waits for killed ones.
    let stop_within =
        options.grace + goondan_ingress::dispatch::AFTER_CANCEL + orchestrator.plan().shutdown_grace + KILL_MARGIN;
    let control = control_socket.as_ref().map(|(path, _)| path);
    let mut status = service.write_status(&options.bundle, control, stop_within);
    report.serving(&Serving { connections: &status.connections, listening: &status.listening, resumed });

    let waits = Waits { stop_rx, restart_asked, notes: &mut notes };
    let ended = service.run_until_stop(options.watch, waits, &mut status, report).await;
    tracing::info!("stopping the service: {}", ended.reason);
    if ended.reason == "terminated" {
        // Draining is how a service answers SIGTERM (or SIGHUP): it exits
        // 0, not 128 + the signal's number.
        shutdown.handled();
    }
    let stopped = service.stop(control_socket, options.grace).await;
    shutdown.turn_ended();
    report.stopped(&Stopped {
        reason: ended.reason,
        pending: stopped.pending,
        not_started: stopped.not_started,
        restarting: ended.restart.is_some(),
    });
    Ok(Served { failed: ended.failed, restart: ended.restart })
}

/// What a stop takes besides the drain and the grace periods: killed
/// agent processes' end, the inbox's last sync.
const KILL_MARGIN: Duration = Duration::from_secs(5);

/// Why the wait for a stop woke up.
enum Wake {
    Stop(&'static str),
    /// A part the service cannot go on without ended: it stops and
    /// exits failed (nothing half-alive keeps the port).
    Fatal(&'static str),
    Restart(crate::control::FullRestart),
    Edited(Option<crate::watch::Reload>),
    /// A line for the service's log (an instance expired or collected).
    Note(String),
}

/// What the serving loop waits on besides its parts.
struct Waits<'a> {
    stop_rx: watch::Receiver<bool>,
    restart_asked: Receiver<crate::control::FullRestart>,
    /// The lifecycle sweep's lines.
    notes: &'a mut tokio::sync::mpsc::UnboundedReceiver<String>,
}

/// How the serving loop ended.
struct Ended {
    reason: &'static str,
    failed: bool,
    restart: Option<crate::control::FullRestart>,
}

/// What the service stopped with.
struct Drained {
    pending: usize,
    not_started: usize,
}

/// A serving service's parts: the inbox and the dispatcher of its turns,
/// and the connectors that feed them.
struct Service<'a> {
    orchestrator: &'a Orchestrator,
    inbox: Inbox,
    dispatcher: Dispatcher,
    /// Stops every connector (each has a child token of its own) and the control socket.
    stop: CancellationToken,
    /// The Connections that run.
    plans: Vec<ConnectionPlan>,
    supervised: Vec<Supervised>,
    /// What each Connection's connector listens on.
    listening: BTreeMap<String, Vec<String>>,
    workspace_dir: PathBuf,
    swarm: String,
    /// The lifecycle sweep (`policy.lifecycle`), if the Swarm has one.
    sweeper: Option<tokio::task::JoinHandle<()>>,
}

impl Service<'_> {
    /// Starts each plan's connector, standard input going to the first
    /// `cli`; the first that does not start stops start-up.
    async fn start_connectors(&mut self, plans: Vec<ConnectionPlan>) -> Result<(), ConnectorError> {
        let mut stdin_given = false;
        for plan in plans {
            let input = if plan.connector == "cli" && !stdin_given {
                stdin_given = true;
                Some(ThreadStdin::start())
            } else {
                None
            };
            self.start_one(&plan, input).await?;
            self.plans.push(plan);
        }
        Ok(())
    }

    /// Starts `plan`'s connector under supervision.
    async fn start_one(
        &mut self,
        plan: &ConnectionPlan,
        input: Option<goondan_ingress::connector::InputStream>,
    ) -> Result<(), ConnectorError> {
        let sink: Arc<dyn EventSink> =
            Arc::new(ConnectionSink::new(&plan.connector, plan.router.clone(), self.inbox.clone()));
        // One token per connector: it stops the connector and its supervision alike.
        let own_stop = self.stop.child_token();
        let started = start_connector(plan, Arc::clone(&sink), own_stop.clone(), input).await?;
        self.listening.insert(plan.name.clone(), addresses(plan, &started));
        self.supervised.push(supervise(plan.clone(), sink, own_stop, started));
        Ok(())
    }

    /// Start-up failed: what started stops, and nothing runs.
    async fn abandon(self) {
        self.stop.cancel();
        if let Some(sweeper) = self.sweeper {
            let _ = sweeper.await;
        }
        for connector in self.supervised {
            let _ = connector.task.await;
        }
        self.inbox.close();
        self.dispatcher.drain(Duration::ZERO).await;
    }

    /// The control socket (`gdn restart`, `gdn instance restart|delete`),
    /// if asked for: its path and task, and where full restarts are asked.
    fn open_control(
        &self,
        parts: Option<ControlParts>,
    ) -> (Option<(PathBuf, tokio::task::JoinHandle<()>)>, Receiver<crate::control::FullRestart>) {
        // Asked for through the control socket; the first ends the serve loop.
        let (full_restart, restart_asked) = tokio::sync::mpsc::channel(1);
        let Some(parts) = parts else { return (None, restart_asked) };
        let path = crate::control::socket_path(&self.workspace_dir);
        let context = Arc::new(crate::control::ControlContext {
            orchestrator: self.orchestrator.clone(),
            dispatcher: self.dispatcher.clone(),
            root: parts.root,
            workspace: parts.workspace,
            check_bundle: parts.check_bundle,
            full_restart,
        });
        match crate::control::listen(&path, context, self.stop.child_token()) {
            Ok(task) => (Some((path, task)), restart_asked),
            Err(error) => {
                tracing::warn!(
                    "no control socket at {} ({error}): gdn restart and gdn instance restart cannot reach this service",
                    path.display()
                );
                (None, restart_asked)
            }
        }
    }

    /// Writes the status file as the service starts to serve.
    fn write_status(
        &self,
        bundle: &str,
        control: Option<&PathBuf>,
        stop_within: Duration,
    ) -> crate::status::ServiceStatus {
        let status = crate::status::ServiceStatus {
            pid: std::process::id(),
            started_at: goondan_core::message::now_millis(),
            bundle: bundle.to_owned(),
            swarm: self.swarm.clone(),
            connections: self.plans.iter().map(|p| p.name.clone()).collect(),
            listening: self.listening.values().flatten().cloned().collect(),
            log: std::env::var(crate::status::LOG_ENV).ok(),
            control: control.map(|path| path.display().to_string()),
            stop_within_secs: Some(stop_within.as_secs()),
        };
        if let Err(error) = status.write(&self.workspace_dir) {
            tracing::warn!("the service's status file could not be written: {error}");
        }
        status
    }

    /// Serves until a signal, every connector's end, a fatal end of a part,
    /// or a restart; takes the bundle's edits meanwhile.
    async fn run_until_stop(
        &mut self,
        mut watch: Option<WatchParts>,
        mut waits: Waits<'_>,
        status: &mut crate::status::ServiceStatus,
        report: &mut dyn Report,
    ) -> Ended {
        loop {
            match self.wait(&mut watch, &mut waits).await {
                Wake::Note(line) => report.note(format_args!("{line}")),
                Wake::Stop(reason) => return Ended { reason, failed: false, restart: None },
                Wake::Fatal(reason) => {
                    tracing::error!("the service cannot go on: {reason}; it stops");
                    return Ended { reason, failed: true, restart: None };
                }
                Wake::Restart(asked) => {
                    return Ended { reason: "a restart was asked for", failed: false, restart: Some(asked) };
                }
                Wake::Edited(None) => {
                    tracing::warn!("watch: the watcher stopped; edits are no longer followed");
                    watch = None;
                }
                Wake::Edited(Some(crate::watch::Reload::Invalid(errors))) => {
                    // Running processes go on; a new one would not build: events wait for the fix.
                    self.orchestrator.pause_starts(true);
                    report.kept_running("the bundle no longer validates", &errors);
                }
                Wake::Edited(Some(crate::watch::Reload::Changed { bundle, changes })) => {
                    let Some(parts) = watch.as_ref() else { continue };
                    if let Some(ended) = self.take_edit(parts, &bundle, &changes, status, report).await {
                        return ended;
                    }
                }
            }
        }
    }

    /// Waits for the next reason to act.
    async fn wait(&self, watch: &mut Option<WatchParts>, waits: &mut Waits<'_>) -> Wake {
        let Waits { stop_rx, restart_asked, notes } = waits;
        // Until a signal, or every connector ended and nothing is left to run.
        let all_ended = async {
            for connector in &self.supervised {
                let _ = connector.ended.clone().wait_for(|ended| *ended).await;
            }
            self.dispatcher.idle().await;
        };
        let edited = async {
            match watch.as_mut() {
                Some(parts) => parts.watcher.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => Wake::Stop("interrupted"),
            _ = stop_rx.wait_for(|stop| *stop) => Wake::Stop("terminated"),
            () = all_ended => Wake::Stop("every connector ended"),
            Some(asked) = restart_asked.recv() => Wake::Restart(asked),
            () = self.inbox.writer_ended() => Wake::Fatal("the inbox's writer ended"),
            () = self.dispatcher.ended() => Wake::Fatal("the dispatcher of turns ended"),
            reload = edited => Wake::Edited(reload),
            Some(line) = notes.recv() => Wake::Note(line),
        }
    }

    /// A valid edit of the bundle: the changed agents restart, the changed
    /// Connections' connectors are replaced; an edit of everything is a
    /// full restart (`Some`: the service stops for it).
    async fn take_edit(
        &mut self,
        parts: &WatchParts,
        bundle: &Bundle,
        changes: &BundleChanges,
        status: &mut crate::status::ServiceStatus,
        report: &mut dyn Report,
    ) -> Option<Ended> {
        self.orchestrator.pause_starts(false);
        // Turns that could not start on a broken bundle run now.
        self.dispatcher.release_held();
        for line in &changes.described {
            report.note(format_args!("↻ {line}"));
        }
        if changes.everything {
            match (parts.check_bundle)() {
                Ok(()) => {
                    let restart = Some(crate::control::FullRestart { fresh: false });
                    return Some(Ended { reason: "the bundle changed", failed: false, restart });
                }
                Err(errors) => {
                    report.kept_running("the edited bundle cannot be served", &errors);
                    return None;
                }
            }
        }
        crate::watch::restart_agents(self.orchestrator, changes);
        if changes.connections.is_empty() {
            return None;
        }
        let env = |name: &str| (parts.env)(name);
        let new_plans = match plan_connections(bundle, &self.swarm, &parts.entry_agent, &env) {
            Ok(new_plans) => new_plans,
            Err(errors) => {
                report.kept_running("the edited Connections cannot start", &errors);
                return None;
            }
        };
        for name in &changes.connections {
            self.replace_connection(name, new_plans.iter().find(|plan| plan.name == *name), report).await;
        }
        status.connections = self.plans.iter().map(|plan| plan.name.clone()).collect();
        status.listening = self.listening.values().flatten().cloned().collect();
        if let Err(error) = status.write(&self.workspace_dir) {
            tracing::warn!("the service's status file could not be written: {error}");
        }
        None
    }

    /// Stops the connector of the Connection `name` and starts the edited
    /// one (`new_plan`; `None`: it was removed) — or, if that does not
    /// start, the previous one again.
    async fn replace_connection(&mut self, name: &str, new_plan: Option<&ConnectionPlan>, report: &mut dyn Report) {
        let old_plan = self.plans.iter().position(|plan| plan.name == *name).map(|at| self.plans.remove(at));
        if let Some(at) = self.supervised.iter().position(|connector| connector.name == *name) {
            let old = self.supervised.remove(at);
            old.stop.cancel();
            if tokio::time::timeout(Duration::from_secs(10), old.task).await.is_err() {
                tracing::warn!(connection = %name, "the connector did not stop in 10 s");
            }
        }
        self.listening.remove(name);
        // A removed Connection stays stopped: the previous connector is only
        // the fallback of an edited one that does not start.
        let Some(new_plan) = new_plan else {
            report.note(format_args!("↻ Connection '{name}' removed"));
            return;
        };
        for (plan, which) in [(Some(new_plan), "the edited"), (old_plan.as_ref(), "the previous")] {
            let Some(plan) = plan else { continue };
            match self.start_one(plan, None).await {
                Ok(()) => {
                    report.note(format_args!("↻ Connection '{name}': {which} connector runs"));
                    self.plans.push(plan.clone());
                    return;
                }
                Err(error) => {
                    report.error(format_args!("Connection '{name}': {which} connector did not start: {error}"))
                }
            }
        }
    }

    /// Stops the connectors and the control socket, closes the inbox and
    /// gives running turns `grace` to end; what did not run stays stored.
    async fn stop(self, control_socket: Option<(PathBuf, tokio::task::JoinHandle<()>)>, grace: Duration) -> Drained {
        self.stop.cancel();
        // Nothing expires while the service stops (a sweep under way ends
        // at its next step; a hold it asked for completes in the hub).
        if let Some(sweeper) = self.sweeper {
            let _ = sweeper.await;
        }
        for connector in self.supervised {
            // A connector that already ended needs no waiting.
            if connector.task.is_finished() {
                continue;
            }
            if tokio::time::timeout(Duration::from_secs(10), connector.task).await.is_err() {
                tracing::warn!(connection = %connector.name, "the connector did not stop in 10 s");
            }
        }
        if let Some((_, task)) = control_socket {
            let _ = task.await;
        }
        self.inbox.close();
        let not_started = self.dispatcher.drain(grace).await;
        crate::status::ServiceStatus::remove(&self.workspace_dir);
        if let Err(error) = self.inbox.sync().await {
            tracing::warn!("the inbox's last records may not be on disk: {error}");
        }
        let pending = self.inbox.status().pending.values().sum();
        Drained { pending, not_started }
    }
}

/// Starts the agent processes of the workspace's instances whose tasks
/// have ends to deliver (see `goondan_agent::tasks`).
async fn start_instances_with_tasks(orchestrator: &Orchestrator, workspace_dir: &std::path::Path) {
    for (agent, key, dir) in goondan_runtime::store::Workspace::at(workspace_dir).instance_dirs() {
        if !orchestrator.plan().has_agent(&agent) || !goondan_runtime::tasks::has_undelivered(&dir) {
            continue;
        }
        let instance = AgentInstance::new(agent, key);
        match orchestrator.start_instance(&instance).await {
            Ok(pid) => tracing::info!("{instance} (pid {pid}) started to deliver the ends of its tasks"),
            Err(error) => tracing::warn!("{instance}: its tasks' ends wait for its next start: {}", error.message),
        }
    }
}

/// `name on http://address` for each address a started connector listens on.
fn addresses(plan: &ConnectionPlan, started: &goondan_ingress::RunningConnector) -> Vec<String> {
    started.listening.iter().map(|address| format!("{} on http://{address}", plan.name)).collect()
}

/// What waits for an instance in a workspace's inbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Waiting {
    /// Events whose turns have not run to their end.
    pub count: usize,
    /// The latest note of a pending event whose turn could not be saved
    /// (it runs again with backoff).
    pub retrying: Option<goondan_ingress::inbox::Retrying>,
}

/// The pending events of a workspace's inbox, by `agent@instance`
/// (`gdn instance list`).
pub fn pending_by_instance(workspace_dir: &std::path::Path) -> BTreeMap<String, Waiting> {
    let mut pending: BTreeMap<String, Waiting> = BTreeMap::new();
    if let Ok(events) = Inbox::read_pending(&workspace_dir.join(INBOX_FILE)) {
        for event in events {
            let waiting = pending.entry(format!("{}@{}", event.entry.agent, event.entry.instance)).or_default();
            waiting.count += 1;
            if let Some(retrying) = event.retrying
                && waiting.retrying.as_ref().is_none_or(|seen| seen.at < retrying.at)
            {
                waiting.retrying = Some(retrying);
            }
        }
    }
    pending
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_that_cannot_be_built_holds_the_turn_and_a_lost_process_retries_it() {
        use goondan_ipc::ErrorInfo;
        let failed = |code: &str| DelegateResultPayload::failed(ErrorInfo::new(code, "why"));
        assert_eq!(classify(&failed("AGENT_BUILD_FAILED"), false), TurnEnd::Hold("AGENT_BUILD_FAILED: why".into()));
        assert_eq!(classify(&failed("AGENT_CRASHED"), false), TurnEnd::Retry("AGENT_CRASHED: why".into()));
        assert_eq!(classify(&failed("AGENT_BUILD_FAILED"), true), TurnEnd::Interrupted);
        assert_eq!(classify(&failed("AGENT_STORE_FAILED"), false), TurnEnd::Unsaved("AGENT_STORE_FAILED: why".into()));
        assert_eq!(classify(&failed("AGENT_NO_HOST"), false), TurnEnd::Waiting("AGENT_NO_HOST: why".into()));
    }
}
