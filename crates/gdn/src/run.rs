//! `gdn run`: one turn (`--input`), or an interactive session, of an agent
//! whose conversation lives in the state root.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow};
use goondan_config::load_bundle_with;
use goondan_ipc::{AgentInstance, DelegateResultPayload, ErrorInfo, ObservePayload};
use goondan_orchestrator::plan::swarm_of;
use goondan_orchestrator::{AgentLauncher, Orchestrator, SwarmObserver, SwarmPlan};
use goondan_runtime::agent::{AgentOptions, identity};
use goondan_runtime::store::{StateRoot, Workspace, WorkspaceAccess};
use goondan_tools::TracingEventSink;
use tokio::sync::watch;

use crate::cli::{GlobalOptions, RunArgs};
use crate::exit;
use crate::output::{self, Output};

/// Prints the swarm's turns as they happen (the agent processes save them):
/// the entry agent's streamed text, and a compact line per tool call and per
/// turn of another agent, naming the agent that acts.
struct Console {
    json: bool,
    color: bool,
    entry: AgentInstance,
    /// More than one agent: tool lines name the acting agent.
    swarm: bool,
    /// Text was streamed in this turn.
    streamed: Mutex<bool>,
    /// Tool lines were printed since the last text: the next text starts a new paragraph.
    after_tools: Mutex<bool>,
    /// What each agent did, for `--json`.
    activity: Mutex<Vec<serde_json::Value>>,
    /// The entry instance's tasks still working when its last turn ended.
    tasks_working: tokio::sync::watch::Sender<Vec<String>>,
    /// The line that shows the step's running tools (a terminal only), and
    /// whether it has been drawn.
    running: Mutex<Option<(tokio::task::JoinHandle<()>, Arc<std::sync::atomic::AtomicBool>)>>,
}

impl Console {
    /// The console of a run whose entry agent's instance is `entry`
    /// (`swarm`: it has more than one agent).
    fn new(global: &GlobalOptions, entry: AgentInstance, swarm: bool) -> Self {
        Self {
            json: global.json,
            color: !global.no_color,
            entry,
            swarm,
            streamed: Mutex::new(false),
            after_tools: Mutex::new(false),
            activity: Mutex::new(Vec::new()),
            running: Mutex::new(None),
            tasks_working: tokio::sync::watch::channel(Vec::new()).0,
        }
    }
    fn stderr(&self) -> anstream::AutoStream<std::io::Stderr> {
        if self.color { anstream::stderr() } else { anstream::AutoStream::never(std::io::stderr()) }
    }

    fn begin_turn(&self) {
        if let Ok(mut streamed) = self.streamed.lock() {
            *streamed = false;
        }
        if let Ok(mut after) = self.after_tools.lock() {
            *after = false;
        }
        if let Ok(mut activity) = self.activity.lock() {
            activity.clear();
        }
    }

    fn streamed(&self) -> bool {
        self.streamed.lock().map(|s| *s).unwrap_or(false)
    }

    /// Shows, on a terminal, which tools run and for how long, after a
    /// second (quick calls show nothing); the line goes when they end.
    fn show_running(&self, names: &[String]) {
        self.stop_running();
        if self.json || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            return;
        }
        // The line is drawn over with `\r`: text streamed on it must be
        // ended first, or the first tick would erase it.
        if self.streamed() && !self.after_tools.lock().map(|a| *a).unwrap_or(false) {
            let mut stdout = anstream::stdout();
            let _ = writeln!(stdout);
            let _ = stdout.flush();
            if let Ok(mut after) = self.after_tools.lock() {
                *after = true;
            }
        }
        let names = names.join(", ");
        let color = self.color;
        let shown = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let drawn = Arc::clone(&shown);
        let ticker = tokio::spawn(async move {
            let started = std::time::Instant::now();
            let mut tick = tokio::time::interval_at(
                tokio::time::Instant::now() + std::time::Duration::from_secs(1),
                std::time::Duration::from_secs(1),
            );
            loop {
                tick.tick().await;
                let mut stderr =
                    if color { anstream::stderr() } else { anstream::AutoStream::never(std::io::stderr()) };
                let _ = write!(
                    stderr,
                    "\r\x1b[2K{}  ⚙ {names} … {}s{}",
                    output::DIM,
                    started.elapsed().as_secs(),
                    output::DIM.render_reset()
                );
                let _ = stderr.flush();
                drawn.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        });
        if let Ok(mut running) = self.running.lock() {
            *running = Some((ticker, shown));
        }
    }

    /// Stops the running-tools line and clears it if it was shown.
    fn stop_running(&self) {
        let ticker = self.running.lock().ok().and_then(|mut running| running.take());
        if let Some((ticker, shown)) = ticker {
            ticker.abort();
            // Only a line that was drawn is cleared: clearing another would
            // erase what is on it.
            if shown.load(std::sync::atomic::Ordering::SeqCst) {
                let mut stderr = std::io::stderr();
                let _ = write!(stderr, "\r\x1b[2K");
                let _ = stderr.flush();
            }
        }
    }

    /// A line on stderr between streamed text: the text's line is ended first.
    fn side_line(&self, line: std::fmt::Arguments<'_>) {
        if self.json {
            return;
        }
        self.stop_running();
        let after = self.after_tools.lock().map(|a| *a).unwrap_or(false);
        if self.streamed() && !after {
            let mut stdout = anstream::stdout();
            let _ = writeln!(stdout);
            let _ = stdout.flush();
        }
        let _ = writeln!(self.stderr(), "{line}");
        if let Ok(mut after) = self.after_tools.lock() {
            *after = true;
        }
    }

    fn who(&self, instance: &AgentInstance) -> String {
        if instance.instance_key == self.entry.instance_key { instance.agent.clone() } else { instance.to_string() }
    }
}

impl SwarmObserver for Console {
    fn observe(&self, instance: &AgentInstance, event: &ObservePayload) {
        let entry = *instance == self.entry;
        match event {
            ObservePayload::ToolsRunning { names } if entry => self.show_running(names),
            ObservePayload::ToolsRunning { .. } => {}
            ObservePayload::TextDelta { text } if entry && !self.json => {
                self.stop_running();
                let mut stdout = anstream::stdout();
                let paragraph = self.after_tools.lock().map(|mut after| std::mem::take(&mut *after)).unwrap_or(false);
                if paragraph && self.streamed() {
                    let _ = writeln!(stdout);
                }
                let _ = write!(stdout, "{text}");
                let _ = stdout.flush();
                if let Ok(mut streamed) = self.streamed.lock() {
                    *streamed = true;
                }
            }
            // The hub keeps idle reports to itself.
            ObservePayload::TextDelta { .. } | ObservePayload::Idle { .. } => {}
            ObservePayload::ToolFinished { name, status, error_code } => {
                let style = match status.as_str() {
                    "ok" => output::OK,
                    "pending" => output::WARNING,
                    _ => output::ERROR,
                };
                let status = if status == "error" { error_code.as_deref().unwrap_or("error") } else { status };
                let agent = if self.swarm { format!("{} › ", self.who(instance)) } else { String::new() };
                self.side_line(format_args!(
                    "{}  ⚙ {agent}{name} → {style}{status}{style:#}{}",
                    output::DIM,
                    output::DIM.render_reset()
                ));
            }
            ObservePayload::TurnStarted { source } => {
                // Another turn of the entry agent (an event another agent
                // sent it): its text starts a paragraph of its own.
                if entry
                    && self.streamed()
                    && source.kind != goondan_ipc::CLI
                    && let Ok(mut after) = self.after_tools.lock()
                {
                    *after = true;
                }
                if !entry {
                    let from = match &source.instance_key {
                        Some(key) if *key != self.entry.instance_key => format!("{}@{key}", source.name),
                        _ => source.name.clone(),
                    };
                    self.side_line(format_args!(
                        "{}  ↳ {} ← {from}{}",
                        output::DIM,
                        self.who(instance),
                        output::DIM.render_reset()
                    ));
                }
            }
            ObservePayload::TurnEnded { summary } => {
                if entry {
                    self.stop_running();
                    self.tasks_working.send_replace(summary.tasks_working.clone());
                }
                if let Ok(mut activity) = self.activity.lock() {
                    activity.push(serde_json::json!({
                        "agent": instance.agent,
                        "instanceKey": instance.instance_key,
                        "steps": summary.steps,
                        "end": summary.end,
                    }));
                }
                if !entry {
                    let how = match &summary.note {
                        Some(note) if summary.end != "answered" => format!("{}: {note}", summary.end),
                        _ => format!("answered in {} step{}", summary.steps, if summary.steps == 1 { "" } else { "s" }),
                    };
                    self.side_line(format_args!(
                        "{}  ↲ {} {how}{}",
                        output::DIM,
                        self.who(instance),
                        output::DIM.render_reset()
                    ));
                }
            }
        }
    }

    fn exited(&self, instance: &AgentInstance, pid: u32, status: &str, crashed: bool) {
        // What its tools left running ends with it.
        let killed = goondan_base::tool_processes::kill_left_by(pid);
        if killed > 0 {
            tracing::debug!("ended {killed} process(es) that tools of {instance} (pid {pid}) left running");
        }
        if crashed {
            self.side_line(format_args!(
                "{}  ✗ {} (pid {pid}) crashed: {status}{}",
                output::ERROR,
                self.who(instance),
                output::ERROR.render_reset()
            ));
        }
    }
}

/// How the entry agent's turn went, as the terminal reports it.
struct Reported {
    text: String,
    end: String,
    note: Option<String>,
    steps: u32,
    usage: serde_json::Value,
    restart_requested: bool,
    /// For `modelFailed`: the kind of the model's failure.
    error_kind: Option<String>,
    /// The agent process could not start: (code, message).
    start_error: Option<(String, String)>,
}

/// The exit code of a turn the model failed, by the kind of failure
/// (`ModelError::kind`): the original's classes, network (5) for an API
/// that cannot be reached, auth (6) for refused credentials, config (3)
/// for a key that is not set or a Model that cannot be used, else 1.
fn model_failure_code(kind: Option<&str>) -> u8 {
    match kind {
        Some("network") => exit::NETWORK,
        Some("unauthorized") => exit::AUTH,
        Some("missing_key" | "config") => exit::CONFIG,
        _ => exit::FAILED,
    }
}

impl Reported {
    fn of(answer: DelegateResultPayload) -> Self {
        match answer.turn {
            Some(turn) => Self {
                text: answer.response.unwrap_or_default(),
                end: turn.end,
                note: turn.note,
                steps: turn.steps,
                usage: turn.usage,
                restart_requested: turn.restart_requested,
                error_kind: turn.model_error_kind,
                start_error: None,
            },
            None => {
                let error = answer.error.unwrap_or_else(|| ErrorInfo::new("AGENT_UNAVAILABLE", "no answer"));
                // The agent could not start (the session cannot go on), or
                // its process died during the turn (the next input starts it again).
                let crashed = error.code == goondan_orchestrator::codes::AGENT_CRASHED;
                Self {
                    text: String::new(),
                    end: if crashed { "crashed" } else { "failed" }.to_owned(),
                    note: Some(error.message.clone()),
                    steps: 0,
                    usage: serde_json::Value::Null,
                    restart_requested: false,
                    error_kind: None,
                    start_error: (!crashed).then_some((error.code, error.message)),
                }
            }
        }
    }

    fn code(&self) -> u8 {
        if let Some((code, _)) = &self.start_error {
            // The bundle's problem (an agent it cannot build, an extension
            // that does not load) is a configuration error, as for `gdn tool
            // list`, `tool call` and `mcp serve`; another run holding the
            // instance refuses this invocation (2).
            return match code.as_str() {
                crate::agent_process::ready_codes::BUILD_FAILED
                | crate::agent_process::ready_codes::EXTENSION_FAILED => exit::CONFIG,
                crate::agent_process::ready_codes::INSTANCE_BUSY => exit::USAGE,
                _ => exit::FAILED,
            };
        }
        match self.end.as_str() {
            "answered" | "stepLimit" => exit::OK,
            "cancelled" => exit::INTERRUPTED,
            "modelFailed" => model_failure_code(self.error_kind.as_deref()),
            _ => exit::FAILED,
        }
    }
}

/// `gdn run`: the orchestrator of the bundle's swarm. The entry agent and
/// every other agent instance run in processes of their own.
pub async fn run(global: &GlobalOptions, args: &RunArgs, session: &crate::Session, out: &mut Output) -> Result<u8> {
    let bundle = match crate::commands::valid_bundle_or_exit(global, out)? {
        Ok((bundle, _)) => bundle,
        Err(code) => return Ok(code),
    };
    let single_input = match single_input(args, &global.config) {
        Ok(input) => input,
        Err(message) => return out.fail(exit::USAGE, &message),
    };
    let root = crate::workspace::state_root(global)?;
    let Prepared { mut plan, workspace, entry } = match prepare(global, args, &root, &bundle) {
        Ok(prepared) => prepared,
        Err((code, message)) => return out.fail(code, &message),
    };
    // With Connections (and no single input) the run is a service.
    let connections = if single_input.is_none() {
        let env = |name: &str| (session.env)(name);
        match goondan_service::plan::plan_connections(&bundle, &plan.swarm.name, &plan.swarm.entry_agent, &env) {
            Ok(plans) => plans,
            Err(errors) => {
                for error in errors {
                    output::error_line(&mut out.stderr, &error)?;
                }
                return Ok(exit::CONFIG);
            }
        }
    } else {
        Vec::new()
    };
    // The secrets: the process environment's, and the environment files'
    // over them; the variables only Connections read reach their
    // connectors, never an agent process.
    plan.env = goondan_service::nats::agent_env(&bundle, &session.secrets);
    limit(&mut plan, args);
    // The Swarm's `policy.shutdown` and `policy.lifecycle`.
    let policy = goondan_service::lifecycle::Policy::of(&bundle, &plan.swarm.name);
    if let Some(grace) = policy.shutdown_grace {
        plan.shutdown_grace = grace;
    }
    if args.detach {
        if connections.is_empty() {
            return out.fail(
                exit::USAGE,
                "--detach runs a service: the Swarm has no Connections to serve (or --input was given)",
            );
        }
        return crate::service::detach(workspace.dir(), &session.environment_secrets, &session.started_service, out);
    }
    let plan_swarm = plan.swarm.name.clone();
    let console = Arc::new(Console::new(global, entry.clone(), plan.swarm.agents.len() > 1));
    let (launcher, hub) = match launcher(global, args, session, &plan, &bundle, &workspace).await? {
        Ok(launcher) => launcher,
        Err((code, message)) => return out.fail(code, format!("--nats: {message}")),
    };
    let orchestrator = Orchestrator::start_with(plan, launcher, Arc::clone(&console) as Arc<dyn SwarmObserver>);
    let watcher = if args.watch {
        match goondan_service::watch::BundleWatcher::start(&global.config, &bundle) {
            Ok(watcher) => Some(watcher.with_packages_dir(crate::workspace::packages_dir(global))),
            Err(error) => {
                let code = out.fail(exit::USAGE, format!("--watch: the bundle's files cannot be watched: {error}"));
                end_run(orchestrator, None, None, hub).await;
                return code;
            }
        }
    } else {
        None
    };
    if !connections.is_empty() {
        let check_bundle = servable_check(global, args, session, &plan_swarm);
        let service = Service { root: &root, workspace: &workspace, check_bundle, watcher, policy };
        let code = serve_connections(global, args, session, connections, &orchestrator, service, out).await;
        end_run(orchestrator, None, None, hub).await;
        return code;
    }
    // No service: the run's own control socket takes `gdn task cancel` for
    // its swarm's tasks (a one-shot run waits for them) until it ends.
    let control = goondan_service::control::listen_for_run(workspace.dir(), &orchestrator);
    let watching = watcher.map(|watcher| follow_edits(watcher, orchestrator.clone()));
    let chat =
        Chat { global, console: &console, root: &root, shutdown: &session.shutdown, orchestrator: &orchestrator };
    let code = match single_input {
        Some(input) => {
            let reported = one_turn(&chat, input).await;
            report_outcome(&chat, &reported, out)?;
            if session.shutdown.requested().is_none() && reported.start_error.is_none() {
                wait_for_tasks(&chat, out).await?;
            }
            session.shutdown.requested().unwrap_or_else(|| reported.code())
        }
        None => {
            // Started before the prompt, so that an agent that cannot start says so at once.
            if let Err(error) = orchestrator.start_instance(&entry).await {
                let reported = Reported::of(DelegateResultPayload::failed(error));
                report_outcome(&chat, &reported, out)?;
                orchestrator.shutdown("the entry agent could not start").await;
                end_run(orchestrator, control, watching, hub).await;
                return Ok(reported.code());
            }
            interactive(&chat, out).await?
        }
    };
    orchestrator.shutdown("the run ended").await;
    end_run(orchestrator, control, watching, hub).await;
    Ok(code)
}

/// How long the end of a run waits for the orchestrator's tasks (and its
/// processes) and the `--nats` hub's side to be done after its shutdown,
/// before it goes on regardless (a hub cut off from its broker, a client of
/// the control socket still connected).
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The end of a run, once the orchestrator has shut its processes down:
/// what holds the orchestrator lets go of it (the control socket, the edit
/// follower), then its hub and every task it started are waited for, then
/// the `--nats` hub's side stops.
async fn end_run(
    orchestrator: Orchestrator,
    control: Option<goondan_service::control::RunListener>,
    watching: Option<tokio::task::JoinHandle<()>>,
    hub: Option<goondan_service::nats::HubParts>,
) {
    drop(control);
    if let Some(watching) = watching {
        watching.abort();
        let _ = watching.await;
    }
    let ended = tokio::time::timeout(CLOSE_WAIT, async {
        orchestrator.closed().await;
        if let Some(hub) = hub {
            hub.shutdown().await;
        }
    });
    if ended.await.is_err() {
        tracing::warn!("the swarm's tasks did not end within {CLOSE_WAIT:?} of its shutdown; the run ends regardless");
    }
}

/// `--input` or `--input-file` (the text of one turn), if given; a
/// `--workdir` that is no directory or lies inside the bundle is refused
/// first. The error is the
/// usage line to print.
fn single_input(args: &RunArgs, config: &Path) -> std::result::Result<Option<String>, String> {
    if let Some(message) = crate::commands::workdir_error(args.workdir.as_deref(), config) {
        return Err(message);
    }
    match (&args.input, &args.input_file) {
        (Some(text), _) => Ok(Some(text.clone())),
        (None, Some(path)) => crate::input::read_text(path, "--input-file", crate::input::MAX_INPUT_BYTES).map(Some),
        (None, None) => Ok(None),
    }
}

/// What a run works on: the swarm's plan, its workspace, and the entry
/// agent's instance.
struct Prepared {
    plan: SwarmPlan,
    workspace: Workspace,
    entry: AgentInstance,
}

/// The entry agent (`--agent`, `--swarm`'s entry, or the bundle's default)
/// and its instance, the swarm's workspace (refused if another bundle's;
/// this bundle's instances of the old layouts are moved in) and working
/// directory, and the plan of its swarm. The error is the exit code and
/// the line to print: a Swarm or Agent the bundle lacks is a configuration
/// error (as in the original), a workspace `--workspace` cannot use a usage
/// error.
fn prepare(
    global: &GlobalOptions,
    args: &RunArgs,
    root: &StateRoot,
    bundle: &goondan_config::Bundle,
) -> std::result::Result<Prepared, (u8, String)> {
    let mut options = AgentOptions::new(Arc::new(TracingEventSink));
    options.agent.clone_from(&args.agent);
    if let Some(name) = &args.swarm {
        let Some(swarm) = bundle.swarm(name) else {
            let known: Vec<String> = bundle.all_swarms().iter().map(|s| s.name().to_owned()).collect();
            return Err((
                exit::CONFIG,
                format!("no Swarm named '{name}' in the bundle (swarms: {})", known.join(", ")),
            ));
        };
        if options.agent.is_none() {
            options.agent = Some(swarm.spec.entry_agent.name.clone());
        }
        options.swarm = Some(swarm.name().to_owned());
    }
    if options.agent.is_none()
        && options.swarm.is_none()
        && let Ok(Some(swarm)) = bundle.default_swarm()
    {
        // The default Swarm may be a dependency's: its agents are found in it.
        options.swarm = Some(swarm.name().to_owned());
    }
    options.instance_key.clone_from(&args.instance_key);
    let (agent_name, instance_key) = identity(bundle, &options).map_err(|error| (exit::CONFIG, error.to_string()))?;
    let absolute = |path: &Path| std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let config = absolute(&global.config);
    let workspace = crate::workspace::open(global, root, bundle, &agent_name, WorkspaceAccess::Use)
        .map_err(|message| (exit::USAGE, message))?;
    let workdir = match &args.workdir {
        Some(dir) => absolute(dir),
        None => crate::workspace::default_workdir(&workspace).map_err(|message| (exit::FAILED, message))?,
    };
    // Agent processes get the workspace as their `stateRoot`: they open
    // their instances in it.
    // The Swarm named (or the default) when it runs this agent, else the
    // one the agent belongs to.
    let named = options.swarm.as_deref().and_then(|name| bundle.swarm(name)).filter(|swarm| {
        swarm.spec.entry_agent.name == agent_name || swarm.spec.agents.iter().any(|a| a.name == agent_name)
    });
    let info = match named {
        Some(swarm) => goondan_orchestrator::plan::swarm_info(&swarm, &agent_name),
        None => swarm_of(bundle, &agent_name),
    };
    let plan = SwarmPlan::new(info, config, absolute(workspace.dir()), workdir);
    Ok(Prepared { plan, workspace, entry: AgentInstance::new(agent_name, instance_key) })
}

/// The run's bounds on tool calls and agent processes.
fn limit(plan: &mut SwarmPlan, args: &RunArgs) {
    // A deadline per call by default; 0 turns it off.
    plan.tool_timeout_ms = Some(args.tool_timeout_ms.unwrap_or(DEFAULT_TOOL_TIMEOUT_MS));
    if let Some(bound) = args.max_agent_processes {
        plan.max_processes = usize::try_from(bound).unwrap_or(usize::MAX);
    }
    if let Some(seconds) = args.agent_idle_secs {
        plan.idle_timeout = (seconds > 0).then(|| std::time::Duration::from_secs(seconds));
    }
}

/// How the swarm's agent processes start: here, or with `--nats` on agent
/// hosts (this process runs them only while no host is connected; the
/// hub's side in this process is returned, to be stopped at the end). The inner error is the
/// `--nats` failure to print.
async fn launcher(
    global: &GlobalOptions,
    args: &RunArgs,
    session: &crate::Session,
    plan: &SwarmPlan,
    bundle: &goondan_config::Bundle,
    workspace: &Workspace,
) -> Result<
    std::result::Result<(Arc<dyn goondan_orchestrator::Launch>, Option<goondan_service::nats::HubParts>), (u8, String)>,
> {
    let program = std::env::current_exe().context("finding the gdn binary to start agent processes")?;
    // Agent processes log as this one does.
    let launcher = AgentLauncher::new(program, crate::nats::agent_launch_args(global));
    let Some(url) = &args.nats else { return Ok(Ok((Arc::new(launcher), None))) };
    let local = goondan_service::nats::LocalRuntime {
        config: plan.config.clone(),
        workspace: plan.state_root.clone(),
        workdir: plan.workdir.clone(),
        env: plan.env.clone(),
        launcher,
    };
    let env = |name: &str| (session.env)(name);
    let scope = goondan_nats::Scope::new(workspace.id());
    let wait_hosts = args.wait_hosts.map(|n| (n, std::time::Duration::from_secs(args.wait_hosts_secs)));
    match goondan_service::nats::hub(url, &env, bundle, local, scope, wait_hosts).await {
        Ok(parts) => Ok(Ok((Arc::clone(&parts.launcher) as Arc<dyn goondan_orchestrator::Launch>, Some(parts)))),
        Err(error @ goondan_service::nats::HubError::TooFewHosts { .. }) => {
            Ok(Err((exit::FAILED, format!("--wait-hosts {}: {error}", args.wait_hosts.unwrap_or_default()))))
        }
        Err(goondan_service::nats::HubError::Nats(error)) => {
            Ok(Err((crate::nats::nats_exit_code(&error), error.to_string())))
        }
    }
}

/// What a service needs of the run besides its Connections.
struct Service<'a> {
    root: &'a StateRoot,
    workspace: &'a Workspace,
    check_bundle: goondan_service::control::BundleCheck,
    watcher: Option<goondan_service::watch::BundleWatcher>,
    policy: goondan_service::lifecycle::Policy,
}

/// The run as a service: serves the Connections until a stop, then stops
/// the agents; a restart asked for (with `--fresh`: the conversations
/// cleared) makes `main` start it again.
async fn serve_connections(
    global: &GlobalOptions,
    args: &RunArgs,
    session: &crate::Session,
    connections: Vec<goondan_service::plan::ConnectionPlan>,
    orchestrator: &Orchestrator,
    service: Service<'_>,
    out: &mut Output,
) -> Result<u8> {
    let Service { root, workspace, check_bundle, watcher, policy } = service;
    // Across hosts the instances' state lives with the agent hosts, not in
    // this workspace: nothing here can tell them idle or collect them.
    let lifecycle = policy.lifecycle.filter(|_| args.nats.is_none());
    if policy.lifecycle.is_some() && lifecycle.is_none() {
        tracing::warn!("--nats: the Swarm's policy.lifecycle is not applied across hosts; no instance expires");
    }
    let options = goondan_service::serve::ServeOptions {
        workspace_dir: workspace.dir().to_path_buf(),
        max_concurrent: orchestrator.plan().max_processes,
        grace: policy.drain(args.drain_secs),
        bundle: goondan_config::resolve_bundle_file(&orchestrator.plan().config).display().to_string(),
        swarm: orchestrator.plan().swarm.name.clone(),
        control: Some(goondan_service::serve::ControlParts {
            root: root.clone(),
            workspace: workspace.clone(),
            check_bundle: Arc::clone(&check_bundle),
        }),
        watch: watcher.map(|watcher| goondan_service::serve::WatchParts {
            watcher,
            entry_agent: orchestrator.plan().swarm.entry_agent.clone(),
            env: Arc::clone(&session.env),
            check_bundle: Arc::clone(&check_bundle),
        }),
        telemetry: crate::telemetry::start(&session.env),
        answers: Arc::new(crate::service::AnswerLines { json: global.json }),
        lifecycle,
    };
    let telemetry = options.telemetry.clone();
    let (code, restart) =
        crate::service::serve(connections, orchestrator, options, &session.shutdown, global.json, out).await?;
    crate::telemetry::flush_at_exit(telemetry).await;
    orchestrator.shutdown("the service stopped").await;
    if let Some(restart) = restart {
        if restart.fresh {
            match goondan_runtime::store::reset_conversations(workspace, None, None) {
                Ok(reset) => tracing::info!("--fresh: {} conversation(s) cleared", reset.len()),
                Err(error) => tracing::error!("--fresh: the conversations could not be cleared: {error}"),
            }
        }
        // `main` starts the service again once everything here has ended.
        session.reexec.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    Ok(code)
}

/// An interactive run follows edits too: the changed agents restart
/// between turns (there are no connectors to restart).
fn follow_edits(
    mut watcher: goondan_service::watch::BundleWatcher,
    orchestrator: Orchestrator,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(reload) = watcher.next().await {
            let mut stderr = anstream::stderr();
            match reload {
                goondan_service::watch::Reload::Invalid(errors) => {
                    orchestrator.pause_starts(true);
                    let _ = output::error_line(&mut stderr, "the bundle no longer validates; the running one is kept:");
                    for error in errors {
                        let _ = writeln!(stderr, "  {error}");
                    }
                }
                goondan_service::watch::Reload::Changed { changes, .. } => {
                    orchestrator.pause_starts(false);
                    for line in &changes.described {
                        let _ = writeln!(stderr, "{}↻ {line}{}", output::DIM, output::DIM.render_reset());
                    }
                    goondan_service::watch::restart_agents(&orchestrator, &changes);
                }
            }
        }
    })
}

/// Whether the bundle on disk can be served as this run serves it (a full
/// restart's check): it loads without errors, still has the Swarm, and
/// its Connections can be planned (their secrets set).
fn servable_check(
    global: &GlobalOptions,
    args: &RunArgs,
    session: &crate::Session,
    swarm: &str,
) -> goondan_service::control::BundleCheck {
    let config = global.config.clone();
    let packages_dir = crate::workspace::packages_dir(global);
    let swarm = swarm.to_owned();
    let agent = args.agent.clone();
    let env = Arc::clone(&session.env);
    Arc::new(move || {
        let report = load_bundle_with(&config, packages_dir.as_deref());
        let Some(bundle) = report.valid_bundle() else {
            return Err(report.diagnostics.iter().filter(|d| d.is_error()).map(ToString::to_string).collect());
        };
        let Some(found) = bundle.swarm(&swarm) else {
            return Err(vec![format!("the bundle has no Swarm '{swarm}' any more")]);
        };
        if let Some(agent) = &agent
            && bundle.find_agent(agent, Some(&swarm)).is_none()
        {
            return Err(vec![format!("the bundle has no Agent '{agent}' any more")]);
        }
        let entry = found.spec.entry_agent.name.clone();
        let lookup = |name: &str| env(name);
        goondan_service::plan::plan_connections(bundle, &swarm, &entry, &lookup).map(|_| ())
    })
}

/// A one-shot run does not end while tasks its turns started still work
/// (a background command): it says so, waits for their ends' turns, and
/// exits; Ctrl-C (or SIGTERM) cancels them and says so.
async fn wait_for_tasks(chat: &Chat<'_>, out: &mut Output) -> Result<()> {
    let mut working = chat.console.tasks_working.subscribe();
    let pending = working.borrow().clone();
    if pending.is_empty() {
        return Ok(());
    }
    if !chat.global.json {
        writeln!(
            out.stderr,
            "{}⧗ waiting for {} task(s) to end ({}) — Ctrl-C cancels {}{}",
            output::DIM,
            pending.len(),
            pending.join(", "),
            if pending.len() == 1 { "it" } else { "them" },
            output::DIM.render_reset()
        )?;
    }
    let (stop_tx, mut stop) = watch::channel(false);
    chat.shutdown.turn_started(stop_tx.clone());
    let interrupted = tokio::select! {
        _ = working.wait_for(Vec::is_empty) => false,
        _ = tokio::signal::ctrl_c() => true,
        _ = stop.wait_for(|s| *s) => true,
    };
    if interrupted {
        let handles = working.borrow().clone();
        for handle in &handles {
            chat.orchestrator.cancel_task(&chat.console.entry, handle).await;
        }
        // Their cancelled ends still come as turns; not forever.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(15), working.wait_for(Vec::is_empty)).await;
        if !chat.global.json {
            writeln!(out.stderr)?;
            output::note_line(&mut out.stderr, format_args!("cancelled {} task(s)", handles.len()))?;
        }
    } else if chat.console.streamed() && !chat.global.json {
        // The last end's turn streamed its text without a line end.
        writeln!(out.stdout)?;
    }
    chat.shutdown.turn_ended();
    Ok(())
}

/// The default deadline of one tool call in `gdn run` (`--tool-timeout-ms`).
pub const DEFAULT_TOOL_TIMEOUT_MS: u64 = 600_000;

/// Runs one turn of the entry agent, cancelling it on Ctrl-C (and on
/// SIGTERM or SIGHUP, after which the run ends).
async fn one_turn(chat: &Chat<'_>, input: String) -> Reported {
    let (cancel, cancelled) = watch::channel(false);
    chat.shutdown.turn_started(cancel.clone());
    let interrupt = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = cancel.send(true);
        }
    });
    chat.console.begin_turn();
    let answer = chat.orchestrator.ask(&chat.console.entry, input, cancelled).await;
    interrupt.abort();
    chat.shutdown.turn_ended();
    Reported::of(answer)
}

fn report_outcome(chat: &Chat<'_>, outcome: &Reported, out: &mut Output) -> Result<()> {
    let console = chat.console;
    if chat.global.json {
        let activity = console.activity.lock().map(|a| a.clone()).unwrap_or_default();
        let mut body = serde_json::json!({
            "agent": console.entry.agent,
            "instanceKey": console.entry.instance_key,
            "text": outcome.text,
            "steps": outcome.steps,
            "end": outcome.end,
            "note": outcome.note,
            "usage": outcome.usage,
            "restartRequested": outcome.restart_requested,
            "agents": activity,
        });
        if let Some((code, message)) = &outcome.start_error {
            body["error"] = serde_json::json!({"code": code, "message": message});
            if let Some(url) = goondan_core::help::help_url(code) {
                body["error"]["helpUrl"] = url.into();
            }
        }
        writeln!(out.stdout, "{body}")?;
        return Ok(());
    }
    if let Some((code, message)) = &outcome.start_error {
        output::error_line(&mut out.stderr, message)?;
        if let Some(hint) = crate::help::hint(code) {
            writeln!(out.stderr, "  {hint}")?;
        }
        return Ok(());
    }
    let streamed = console.streamed();
    match outcome.end.as_str() {
        "answered" if streamed => writeln!(out.stdout)?,
        "answered" => writeln!(out.stdout, "{}", outcome.text)?,
        "stepLimit" | "malformedReplies" => {
            if streamed {
                writeln!(out.stdout)?;
            } else if !outcome.text.is_empty() {
                writeln!(out.stdout, "{}", outcome.text)?;
            }
            if let Some(note) = &outcome.note {
                output::note_line(&mut out.stderr, format_args!("[{note}]"))?;
            }
        }
        "cancelled" => {
            writeln!(out.stderr)?;
            output::note_line(&mut out.stderr, "cancelled")?;
        }
        _ => {
            if let Some(note) = &outcome.note {
                output::error_line(&mut out.stderr, note)?;
            }
        }
    }
    if outcome.restart_requested {
        writeln!(out.stderr, "{}↻ restarted: the bundle was reloaded{}", output::DIM, output::DIM.render_reset())?;
    }
    Ok(())
}

/// What a run keeps besides its output.
struct Chat<'a> {
    global: &'a GlobalOptions,
    console: &'a Console,
    root: &'a StateRoot,
    shutdown: &'a goondan_service::shutdown::Shutdown,
    orchestrator: &'a Orchestrator,
}

/// The interactive session: line editing and history, answers streamed.
async fn interactive(chat: &Chat<'_>, out: &mut Output) -> Result<u8> {
    let mut editor = rustyline::DefaultEditor::new().context("starting the line editor")?;
    let history_file = chat.root.path().join("repl_history");
    let _ = editor.load_history(&history_file);
    writeln!(
        out.stderr,
        "{}agent '{}' (instance '{}') — Ctrl-D to quit, Ctrl-C cancels a turn{}",
        output::DIM,
        chat.console.entry.agent,
        chat.console.entry.instance_key,
        output::DIM.render_reset()
    )?;
    loop {
        // Read on a thread of its own: while the user types, the
        // orchestrator keeps routing what the other agents do.
        let (returned, read) = tokio::task::spawn_blocking(move || {
            let read = editor.readline("› ");
            (editor, read)
        })
        .await
        .map_err(|e| anyhow!("reading input: {e}"))?;
        editor = returned;
        let line = match read {
            Ok(line) => line,
            Err(rustyline::error::ReadlineError::Interrupted) => continue,
            Err(rustyline::error::ReadlineError::Eof) => break,
            Err(error) => return Err(anyhow!("reading input: {error}")),
        };
        let input = line.trim();
        if input.is_empty() {
            continue;
        }
        if matches!(input, "/exit" | "/quit") {
            break;
        }
        let _ = editor.add_history_entry(input);
        let reported = one_turn(chat, input.to_owned()).await;
        report_outcome(chat, &reported, out)?;
        if let Some(code) = chat.shutdown.requested() {
            let _ = editor.save_history(&history_file);
            return Ok(code);
        }
        if reported.start_error.is_some() {
            let _ = editor.save_history(&history_file);
            return Ok(reported.code());
        }
    }
    if let Some(parent) = history_file.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let _ = editor.save_history(&history_file);
    Ok(exit::OK)
}
