//! `gdn run` as a service: the swarm's Connections run, and the outside
//! world's events become turns.
//!
//! ```text
//! start   plan every Connection of the swarm (config and secrets resolved: a
//!         secret's unset variable stops start-up naming the Connection and
//!         the variable), open the inbox, resume what it holds pending, start
//!         the connectors (a port in use stops start-up, naming both)
//! serve   connector ─► ConnectionSink (route, store: fsync) ─► ack ─► dispatcher ─► hub turn
//!         a native connector that fails is started again with backoff
//! stop    SIGTERM / SIGHUP / Ctrl-C, or every connector ended on its own (cli at the
//!         end of its input) and nothing is left to run: connectors stop accepting, the
//!         inbox closes, running turns get the grace period, what did not run stays
//!         stored for the next start; exit 0
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use async_trait::async_trait;
use goondan_config::{AnyResource, Bundle, ValueSource};
use goondan_core::{JsonObject, JsonValue, ObjectRef};
use goondan_ingress::dispatch::{DispatchOptions, Dispatcher, TurnEnd, TurnRunner};
use goondan_ingress::inbox::{INBOX_FILE, Inbox, InboxOptions, Stored};
use goondan_ingress::routing::Router;
use goondan_ingress::service::ConnectionSink;
use goondan_ingress::{ConnectorContext, ConnectorError, EventSink, SecretMap, StartConnector};
use goondan_ipc::{AgentInstance, DelegateResultPayload, MessageSourceInfo};
use goondan_orchestrator::{Inbound, Orchestrator};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::output::{self, Output};

/// How a Connection's connector runs.
#[derive(Clone)]
pub enum ConnectorKind {
    /// A `@goondan/base` connector, native.
    Native(StartConnector),
    /// A connector module of the bundle, in a Bun host of its own.
    Script(goondan_script::connector::ScriptConnector),
}

/// One Connection, ready to start.
#[derive(Clone)]
pub struct ConnectionPlan {
    /// The Connection's name.
    pub name: String,
    /// Its Connector's name.
    pub connector: String,
    /// How the connector runs.
    pub kind: ConnectorKind,
    /// `config`, resolved.
    pub config: BTreeMap<String, String>,
    /// `secrets`, resolved.
    pub secrets: SecretMap,
    /// Its routing.
    pub router: Router,
}

/// The environment variables Connections read for their `secrets`: they
/// reach the connectors only.
pub fn connection_secret_variables(bundle: &Bundle) -> BTreeSet<String> {
    bundle
        .resources()
        .iter()
        .filter_map(|r| match &r.resource {
            AnyResource::Connection(connection) => Some(connection),
            _ => None,
        })
        .flat_map(|connection| connection.spec.secrets.values())
        .filter_map(|value| value.pointer("/valueFrom/env").and_then(JsonValue::as_str).map(str::to_owned))
        .collect()
}

/// The variables withheld from agent processes: those Connections read
/// for their `secrets`, unless a built-in tool or another resource of the
/// bundle reads them too (`TELEGRAM_BOT_TOKEN` feeds the connector and
/// `telegram__send` alike; a Model's key, an MCP server's `env` or
/// `headers` with `valueFrom.env` are the agent's to read).
pub fn agent_withheld_variables(bundle: &Bundle) -> BTreeSet<String> {
    let mut used_by_agents: BTreeSet<String> =
        goondan_base::settings::ENV_VARS.iter().map(|name| (*name).to_owned()).collect();
    used_by_agents.extend(crate::secrets::names_read_outside_connections(bundle.file()));
    connection_secret_variables(bundle).into_iter().filter(|name| !used_by_agents.contains(name)).collect()
}

/// The Swarm a Connection feeds: its `swarmRef`, else the bundle's first.
fn swarm_of_connection(bundle: &Bundle, swarm_ref: Option<&ObjectRef>) -> Option<String> {
    match swarm_ref {
        Some(reference) => Some(reference.name.clone()),
        None => bundle.swarms().next().map(|s| s.name().to_owned()),
    }
}

fn resolve_values(
    connection: &str,
    field: &str,
    values: &JsonObject,
    env: &dyn Fn(&str) -> Option<String>,
    required: bool,
    errors: &mut Vec<String>,
) -> BTreeMap<String, String> {
    let mut resolved = BTreeMap::new();
    for (key, value) in values {
        let source: Option<ValueSource> = serde_json::from_value(value.clone()).ok();
        match source {
            Some(ValueSource { value: Some(value), value_from: None }) => {
                resolved.insert(key.clone(), value);
            }
            Some(ValueSource { value: None, value_from: Some(from) }) => match env(&from.env) {
                Some(value) => {
                    resolved.insert(key.clone(), value);
                }
                None if required => errors.push(format!(
                    "Connection '{connection}': spec.{field}.{key} reads the environment variable {}, which is not set",
                    from.env
                )),
                None => tracing::info!(
                    connection,
                    "spec.{field}.{key}: the environment variable {} is not set; the key is left out",
                    from.env
                ),
            },
            // A plain string is taken as the value (the loader's schema has
            // already reported anything else).
            _ => match value.as_str() {
                Some(text) => {
                    resolved.insert(key.clone(), text.to_owned());
                }
                None => errors.push(format!(
                    "Connection '{connection}': spec.{field}.{key} must be {{value: ...}} or {{valueFrom: {{env: NAME}}}}"
                )),
            },
        }
    }
    resolved
}

/// Plans the Connections that feed `swarm`; every problem is reported,
/// each naming its Connection.
pub fn plan_connections(
    bundle: &Bundle,
    swarm: &str,
    entry_agent: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<ConnectionPlan>, Vec<String>> {
    let mut plans = Vec::new();
    let mut errors = Vec::new();
    for resource in bundle.resources() {
        let AnyResource::Connection(connection) = &resource.resource else { continue };
        let name = connection.name();
        if swarm_of_connection(bundle, connection.spec.swarm_ref.as_ref()).as_deref() != Some(swarm) {
            continue;
        }
        let reference = &connection.spec.connector_ref;
        let connector = match bundle.resolve(reference) {
            Ok(resolved) => match resolved.resource {
                AnyResource::Connector(connector) => Some((resolved.scope, connector)),
                _ => None,
            },
            Err(_) => None,
        };
        let Some((scope, connector)) = connector else {
            errors.push(format!("Connection '{name}': its connectorRef {reference} is not a Connector of the bundle"));
            continue;
        };
        let kind = if matches!(scope, goondan_config::PackageScope::Base) {
            match goondan_ingress::connectors::native(connector.name()) {
                Some(start) => ConnectorKind::Native(start),
                None => {
                    errors.push(format!(
                        "Connection '{name}': the @goondan/base Connector '{}' has no native implementation (native: {})",
                        connector.name(),
                        goondan_ingress::connectors::names().collect::<Vec<_>>().join(", ")
                    ));
                    continue;
                }
            }
        } else {
            // Confined unless the Swarm's agents run unconfined: a bundle that
            // chose `policy: full` for them chose it for its connectors too.
            let unconfined =
                bundle.sandbox_for(entry_agent, Some(swarm)).config.policy == goondan_config::SandboxPolicy::Full;
            ConnectorKind::Script(
                goondan_script::connector::ScriptConnector::new(bundle.root(), &connector.spec.entry)
                    .confined(!unconfined),
            )
        };
        let config = resolve_values(name, "config", &connection.spec.config, env, false, &mut errors);
        let secrets = resolve_values(name, "secrets", &connection.spec.secrets, env, true, &mut errors);
        let router = match Router::new(name, &connection.spec.ingress, entry_agent) {
            Ok(router) => router,
            Err(error) => {
                errors.push(error.to_string());
                continue;
            }
        };
        plans.push(ConnectionPlan {
            name: name.to_owned(),
            connector: connector.name().to_owned(),
            kind,
            config,
            secrets: SecretMap::new(secrets),
            router,
        });
    }
    if errors.is_empty() { Ok(plans) } else { Err(errors) }
}

/// Runs stored events' turns through the hub.
struct HubTurns {
    orchestrator: Orchestrator,
    /// `--json`: a JSON line per turn instead of the answer's text.
    json: bool,
    /// OpenTelemetry: each event's turn is the child of a span of its own.
    telemetry: Option<goondan_telemetry::Exporter>,
}

impl HubTurns {
    /// Each event turn's answer on standard output: where the `cli`
    /// connector's user reads it (other channels answer through tools).
    fn print(&self, turn: &Stored, instance: &AgentInstance, answer: &DelegateResultPayload) {
        let text = answer.response.clone().unwrap_or_default();
        let mut stdout = anstream::stdout();
        let line = if self.json {
            serde_json::json!({
                "status": "turn",
                "connection": turn.entry.connection,
                "event": turn.entry.event.name,
                "deliveryKey": turn.key,
                "agent": instance.agent,
                "instanceKey": instance.instance_key,
                "end": answer.turn.as_ref().map(|t| t.end.clone()),
                "text": text,
            })
            .to_string()
        } else if text.is_empty() {
            return;
        } else {
            format!("{instance} › {text}")
        };
        let _ = writeln!(stdout, "{line}");
        let _ = stdout.flush();
    }
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
            self.print(turn, &instance, &answer);
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
    /// `--json`: status lines as JSON.
    pub json: bool,
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
    pub check_bundle: crate::service_control::BundleCheck,
}

/// What the control socket needs besides the orchestrator.
pub struct ControlParts {
    /// The state root.
    pub root: goondan_runtime::store::StateRoot,
    /// The workspace the service runs on.
    pub workspace: goondan_runtime::store::Workspace,
    /// Checks the bundle on disk before a full restart.
    pub check_bundle: crate::service_control::BundleCheck,
}

/// How `serve` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// The exit code.
    pub code: u8,
    /// A full restart was asked for: the caller stops the agents and
    /// starts the service again.
    pub restart: Option<crate::service_control::FullRestart>,
}

impl Served {
    fn exit(code: u8) -> Self {
        Self { code, restart: None }
    }
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

/// Serves the Connections `plans` until a stop; returns the exit code.
pub async fn serve(
    plans: Vec<ConnectionPlan>,
    orchestrator: &Orchestrator,
    options: ServeOptions,
    shutdown: &crate::shutdown::Shutdown,
    out: &mut Output,
) -> Result<Served> {
    let inbox_path = options.workspace_dir.join(INBOX_FILE);
    let (stored_tx, stored_rx) = tokio::sync::mpsc::unbounded_channel();
    let (inbox, recovered) = match Inbox::open(&inbox_path, InboxOptions::default(), stored_tx) {
        Ok(opened) => opened,
        Err(error @ goondan_ingress::inbox::InboxError::Busy { .. }) => {
            output::error_line(&mut out.stderr, error)?;
            return Ok(Served::exit(crate::exit::USAGE));
        }
        Err(error) => {
            output::error_line(&mut out.stderr, error)?;
            return Ok(Served::exit(crate::exit::FAILED));
        }
    };
    let resumed = recovered.len();
    let runner = Arc::new(HubTurns {
        orchestrator: orchestrator.clone(),
        json: options.json,
        telemetry: options.telemetry.clone(),
    });
    let dispatch = DispatchOptions { max_concurrent: options.max_concurrent.max(1), ..DispatchOptions::default() };
    let dispatcher = Dispatcher::start(inbox.clone(), runner, recovered, stored_rx, dispatch);

    // Instances with task ends their conversations do not have yet (a task
    // that ended, or whose work died, while no process ran them) start now
    // and deliver them.
    start_instances_with_tasks(orchestrator, &options.workspace_dir).await;

    // SIGTERM and SIGHUP stop the service as Ctrl-C does.
    let (stop_tx, mut stop_rx) = watch::channel(false);
    shutdown.turn_started(stop_tx.clone());
    let stop = CancellationToken::new();
    let mut stdin_given = false;
    let mut supervised = Vec::new();
    let mut listening: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for plan in &plans {
        let sink: Arc<dyn EventSink> =
            Arc::new(ConnectionSink::new(&plan.connector, plan.router.clone(), inbox.clone()));
        let input = if plan.connector == "cli" && !stdin_given {
            stdin_given = true;
            Some(ThreadStdin::start())
        } else {
            None
        };
        // One token per connector: it stops the connector and its supervision alike.
        let own_stop = stop.child_token();
        match start_connector(plan, Arc::clone(&sink), own_stop.clone(), input).await {
            Ok(started) => {
                listening.insert(plan.name.clone(), addresses(plan, &started));
                supervised.push(supervise(plan.clone(), sink, own_stop, started));
            }
            Err(error) => {
                output::error_line(&mut out.stderr, error)?;
                stop.cancel();
                for connector in supervised {
                    let _ = connector.task.await;
                }
                inbox.close();
                dispatcher.drain(Duration::ZERO).await;
                shutdown.turn_ended();
                return Ok(Served::exit(crate::exit::USAGE));
            }
        }
    }
    // The control socket: `gdn restart`, `gdn instance restart|delete`.
    let (full_restart, mut restart_asked) = tokio::sync::mpsc::unbounded_channel();
    let mut control_socket = None;
    if let Some(parts) = options.control {
        let path = crate::service_control::socket_path(&options.workspace_dir);
        let context = Arc::new(crate::service_control::ControlContext {
            orchestrator: orchestrator.clone(),
            dispatcher: dispatcher.clone(),
            root: parts.root,
            workspace: parts.workspace,
            check_bundle: parts.check_bundle,
            full_restart,
        });
        match crate::service_control::listen(&path, context, stop.child_token()) {
            Ok(task) => control_socket = Some((path, task)),
            Err(error) => tracing::warn!(
                "no control socket at {} ({error}): gdn restart and gdn instance restart cannot reach this service",
                path.display()
            ),
        }
    }
    let mut plans = plans;
    let names: Vec<String> = plans.iter().map(|p| p.name.clone()).collect();
    let mut status = crate::service_status::ServiceStatus {
        pid: std::process::id(),
        started_at: goondan_core::message::now_millis(),
        bundle: options.bundle.clone(),
        swarm: options.swarm.clone(),
        connections: names.clone(),
        listening: listening.values().flatten().cloned().collect(),
        log: std::env::var(crate::service_status::LOG_ENV).ok(),
        control: control_socket.as_ref().map(|(path, _)| path.display().to_string()),
    };
    if let Err(error) = status.write(&options.workspace_dir) {
        tracing::warn!("the service's status file could not be written: {error}");
    }
    if options.json {
        let line = serde_json::json!({
            "status": "serving",
            "connections": names,
            "listening": status.listening,
            "resumed": resumed,
        });
        let _ = writeln!(out.stdout, "{line}");
        let _ = out.stdout.flush();
    } else {
        // Status lines are never fatal: standard error may be a log on a
        // full disk (`--detach`), and the service serves on regardless.
        let _ = writeln!(
            out.stderr,
            "{}serving {} Connection(s): {}{}{} — Ctrl-C to stop{}",
            output::DIM,
            plans.len(),
            names.join(", "),
            if status.listening.is_empty() { String::new() } else { format!(" ({})", status.listening.join(", ")) },
            if resumed > 0 { format!("; {resumed} event(s) from the last run resumed") } else { String::new() },
            output::DIM.render_reset()
        );
    }

    /// Why the wait below woke up.
    enum Wake {
        Stop(&'static str),
        /// A part the service cannot go on without ended: it stops and
        /// exits failed (nothing half-alive keeps the port).
        Fatal(&'static str),
        Restart(crate::service_control::FullRestart),
        Edited(Option<crate::watch::Reload>),
    }
    let mut watch = options.watch;
    let mut restart = None;
    let mut failed = false;
    let reason = loop {
        let wake = {
            // Until a signal, or every connector ended and nothing is left to run.
            let all_ended = async {
                for connector in &supervised {
                    let _ = connector.ended.clone().wait_for(|ended| *ended).await;
                }
                dispatcher.idle().await;
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
                () = inbox.writer_ended() => Wake::Fatal("the inbox's writer ended"),
                () = dispatcher.ended() => Wake::Fatal("the dispatcher of turns ended"),
                reload = edited => Wake::Edited(reload),
            }
        };
        match wake {
            Wake::Stop(reason) => break reason,
            Wake::Fatal(reason) => {
                tracing::error!("the service cannot go on: {reason}; it stops");
                failed = true;
                break reason;
            }
            Wake::Restart(asked) => {
                restart = Some(asked);
                break "a restart was asked for";
            }
            Wake::Edited(None) => {
                tracing::warn!("watch: the watcher stopped; edits are no longer followed");
                watch = None;
            }
            Wake::Edited(Some(crate::watch::Reload::Invalid(errors))) => {
                // Running processes go on; a new one would not build: events wait for the fix.
                orchestrator.pause_starts(true);
                kept_running(out, "the bundle no longer validates", &errors);
            }
            Wake::Edited(Some(crate::watch::Reload::Changed { bundle, changes })) => {
                let Some(parts) = watch.as_ref() else { continue };
                orchestrator.pause_starts(false);
                // Turns that could not start on a broken bundle run now.
                dispatcher.release_held();
                for line in &changes.described {
                    note(out, format_args!("↻ {line}"));
                }
                if changes.everything {
                    match (parts.check_bundle)() {
                        Ok(()) => {
                            restart = Some(crate::service_control::FullRestart { fresh: false });
                            break "the bundle changed";
                        }
                        Err(errors) => {
                            kept_running(out, "the edited bundle cannot be served", &errors);
                            continue;
                        }
                    }
                }
                crate::watch::restart_agents(orchestrator, &changes);
                if changes.connections.is_empty() {
                    continue;
                }
                let env = |name: &str| (parts.env)(name);
                let new_plans = match plan_connections(&bundle, &options.swarm, &parts.entry_agent, &env) {
                    Ok(new_plans) => new_plans,
                    Err(errors) => {
                        kept_running(out, "the edited Connections cannot start", &errors);
                        continue;
                    }
                };
                for name in &changes.connections {
                    let new_plan = new_plans.iter().find(|plan| plan.name == *name);
                    let old_plan = plans.iter().position(|plan| plan.name == *name).map(|at| plans.remove(at));
                    if let Some(at) = supervised.iter().position(|connector| connector.name == *name) {
                        let old = supervised.remove(at);
                        old.stop.cancel();
                        if tokio::time::timeout(Duration::from_secs(10), old.task).await.is_err() {
                            tracing::warn!(connection = %name, "the connector did not stop in 10 s");
                        }
                    }
                    listening.remove(name);
                    let mut started = None;
                    for (plan, which) in [(new_plan, "the edited"), (old_plan.as_ref(), "the previous")] {
                        let Some(plan) = plan else { continue };
                        let sink: Arc<dyn EventSink> =
                            Arc::new(ConnectionSink::new(&plan.connector, plan.router.clone(), inbox.clone()));
                        let own_stop = stop.child_token();
                        match start_connector(plan, Arc::clone(&sink), own_stop.clone(), None).await {
                            Ok(running) => {
                                listening.insert(plan.name.clone(), addresses(plan, &running));
                                supervised.push(supervise(plan.clone(), sink, own_stop, running));
                                note(out, format_args!("↻ Connection '{name}': {which} connector runs"));
                                started = Some(plan.clone());
                                break;
                            }
                            Err(error) => {
                                let _ = output::error_line(
                                    &mut out.stderr,
                                    format_args!("Connection '{name}': {which} connector did not start: {error}"),
                                );
                            }
                        }
                    }
                    match started {
                        Some(plan) => plans.push(plan),
                        None if new_plan.is_none() => note(out, format_args!("↻ Connection '{name}' removed")),
                        None => {}
                    }
                }
                status.connections = plans.iter().map(|plan| plan.name.clone()).collect();
                status.listening = listening.values().flatten().cloned().collect();
                if let Err(error) = status.write(&options.workspace_dir) {
                    tracing::warn!("the service's status file could not be written: {error}");
                }
            }
        }
    };
    tracing::info!("stopping the service: {reason}");
    if reason == "terminated" {
        // Draining is how a service answers SIGTERM (or SIGHUP): it exits
        // 0, not 128 + the signal's number.
        shutdown.handled();
    }
    stop.cancel();
    for connector in supervised {
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
    inbox.close();
    let left = dispatcher.drain(options.grace).await;
    crate::service_status::ServiceStatus::remove(&options.workspace_dir);
    if let Err(error) = inbox.sync().await {
        tracing::warn!("the inbox's last records may not be on disk: {error}");
    }
    shutdown.turn_ended();
    let status = inbox.status();
    let pending: usize = status.pending.values().sum();
    if options.json {
        let line = serde_json::json!({"status": "stopped", "reason": reason, "pending": pending, "notStarted": left});
        let _ = writeln!(out.stdout, "{line}");
    } else if restart.is_some() {
        let kept = if pending > 0 {
            format!("; {pending} event(s) stay stored and run once it serves")
        } else {
            String::new()
        };
        note(out, format_args!("↻ restarting ({reason}){kept}"));
    } else if pending > 0 {
        let _ = writeln!(
            out.stderr,
            "{}stopped ({reason}); {pending} event(s) stay stored and run at the next start{}",
            output::DIM,
            output::DIM.render_reset()
        );
    }
    Ok(Served { code: if failed { crate::exit::FAILED } else { crate::exit::OK }, restart })
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

/// A status line of the service (dim on a terminal), also logged. A line
/// that cannot be written (a log on a full disk) is not fatal.
fn note(out: &mut Output, line: std::fmt::Arguments<'_>) {
    tracing::debug!("{line}");
    let _ = writeln!(out.stderr, "{}{line}{}", output::DIM, output::DIM.render_reset());
}

/// An edit that cannot be taken: said with its reasons; what runs goes on
/// (whether or not the lines can be written).
fn kept_running(out: &mut Output, what: &str, errors: &[String]) {
    tracing::debug!("watch: {what}; what runs is kept: {}", errors.join("; "));
    let _ = output::error_line(&mut out.stderr, format_args!("{what}; the running one is kept:"));
    for error in errors {
        let _ = writeln!(out.stderr, "  {error}");
    }
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

    fn bundle(yaml: &str) -> Result<(tempfile::TempDir, Bundle), String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        std::fs::write(dir.path().join("goondan.yaml"), yaml).map_err(|e| e.to_string())?;
        let report = goondan_config::load_bundle(dir.path());
        match report.valid_bundle() {
            Some(bundle) => Ok((dir, bundle.clone())),
            None => Err(format!("{:?}", report.diagnostics)),
        }
    }

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

    #[test]
    fn only_variables_that_connections_alone_read_are_withheld_from_agents() -> Result<(), String> {
        let (_dir, bundle) = bundle(
            r#"apiVersion: goondan.ai/v1
kind: Model
metadata: {name: m}
spec:
  provider: openai
  model: x
  apiKey: {valueFrom: {env: MODEL_KEY}}
---
apiVersion: goondan.ai/v1
kind: Agent
metadata: {name: a}
spec:
  modelConfig: {modelRef: Model/m}
  extensions:
    - ref: {kind: Extension, name: mcp, package: "@goondan/base"}
      config:
        servers:
          tracker:
            url: "http://127.0.0.1:9/mcp"
            headers: {Authorization: {valueFrom: {env: SHARED_KEY}}}
---
apiVersion: goondan.ai/v1
kind: Swarm
metadata: {name: s}
spec: {entryAgent: Agent/a, agents: [Agent/a]}
---
apiVersion: goondan.ai/v1
kind: Connection
metadata: {name: c}
spec:
  connectorRef: {kind: Connector, name: cli, package: "@goondan/base"}
  swarmRef: Swarm/s
  secrets:
    ONLY: {valueFrom: {env: CONNECTION_ONLY}}
    SHARED: {valueFrom: {env: SHARED_KEY}}
    MODEL: {valueFrom: {env: MODEL_KEY}}
    BOT: {valueFrom: {env: TELEGRAM_BOT_TOKEN}}
"#,
        )?;
        let all: Vec<String> = connection_secret_variables(&bundle).into_iter().collect();
        assert_eq!(all, ["CONNECTION_ONLY", "MODEL_KEY", "SHARED_KEY", "TELEGRAM_BOT_TOKEN"]);
        let withheld: Vec<String> = agent_withheld_variables(&bundle).into_iter().collect();
        assert_eq!(withheld, ["CONNECTION_ONLY"]);
        Ok(())
    }
}
