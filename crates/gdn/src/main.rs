//! `gdn`: the goondan-rs command-line program.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

mod agent_process;
mod cli;
mod commands;
mod doctor;
mod dotenv;
mod fix;
mod help;
mod init;
mod input;
mod instance;
mod instance_tui;
mod logs;
mod mcp_serve;
mod nats;
mod output;
mod package;
mod registry;
mod restart;
mod run;
mod service;
mod studio;
mod task;
mod telemetry;
mod usage;
mod wiring;
mod workspace;

use cli::{Cli, Command, McpCommand, RegistryCommand, ToolCommand};
use goondan_service::{secrets, shutdown};

/// What every command gets from `main`.
pub struct Session {
    /// The environment, with the secrets `main` took out of it.
    pub env: goondan_runtime::agent::EnvLookup,
    /// The processes tool calls start (killed when `gdn` ends).
    pub tool_processes: Arc<goondan_base::tool_processes::ToolProcesses>,
    /// SIGTERM / SIGHUP handling.
    pub shutdown: Arc<shutdown::Shutdown>,
    /// The secrets taken out of the environment (handed to agent processes over their channel).
    pub secrets: Arc<secrets::Secrets>,
    /// `gdn run --detach` started a service: it is not ended with us.
    pub started_service: std::sync::atomic::AtomicBool,
    /// The secrets that were in the process environment (not the `.env`
    /// files'): a service started again gets them back in its environment.
    pub environment_secrets: std::collections::BTreeMap<String, String>,
    /// A service asked to restart: once everything has ended, this process
    /// executes itself again (same pid, same arguments).
    pub reexec: std::sync::atomic::AtomicBool,
}

/// Exit codes, the original's classes (its `packages/cli/src/errors.ts`)
/// plus the signal codes: the README's table lists them.
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// A failure at run time (the original's "internal"): a turn that could
    /// not be saved, an error ToolResult, a service that did not stop.
    pub const FAILED: u8 = 1;
    /// Bad command-line usage: a flag or argument that cannot be used.
    pub const USAGE: u8 = 2;
    /// The bundle or the environment it needs: a bundle that does not
    /// load, an unset key or secret, a refused `.env` line, an agent or
    /// extension that cannot be built, a Connection's port in use.
    pub const CONFIG: u8 = 3;
    /// A check failed: `gdn validate`'s errors, a package's integrity, a
    /// lockfile that no longer meets the manifest.
    pub const VALIDATION: u8 = 4;
    /// A server could not be reached: the model's API, the registry, NATS.
    pub const NETWORK: u8 = 5;
    /// A server refused the credentials: the model's API key, a registry token.
    pub const AUTH: u8 = 6;
    /// Cancelled by Ctrl-C (a turn, or a server stopped by it).
    pub const INTERRUPTED: u8 = 130;
}

fn main() -> ExitCode {
    // First of all: no core dumps, and no other process of the same user
    // may read our memory or environment (`/proc/<pid>/mem`, `environ`),
    // where the model keys are. Best effort: nothing to do if it fails.
    let _ = nix::sys::prctl::set_dumpable(false);
    // The network holder of a sandbox with `network.allow`: this binary run
    // again by goondan-sandbox, in a user namespace of its own, with an
    // empty environment. It is not a command: it serves until its parent
    // closes its input, and never returns.
    if std::env::args_os().nth(1).is_some_and(|arg| arg == goondan_sandbox::NETWORK_HOLDER_ARG) {
        goondan_sandbox::run_network_holder();
    }
    let mut cli = Cli::parse();
    cli.take_positional_bundle();
    let agent_process = matches!(cli.command, Command::Agent(_));
    // An agent process ends with its orchestrator (asked before any thread exists).
    if agent_process && !goondan_agent::guard_parent() {
        return ExitCode::from(exit::FAILED);
    }
    // Before any thread exists: the secrets leave the process environment
    // (this may re-execute the binary) and live only in `env` from here on.
    let (secrets, kept_away, environment_secrets) = match take_secrets(&cli, agent_process) {
        Ok(taken) => taken,
        Err(code) => return code,
    };
    let secrets = Arc::new(secrets);
    let env_secrets = Arc::clone(&secrets);
    // The files win over the process environment, as in the original.
    let env: goondan_runtime::agent::EnvLookup =
        Arc::new(move |name: &str| env_secrets.get(name).map(str::to_owned).or_else(|| std::env::var(name).ok()));
    // Still before any thread: orphans of tool processes come to us, and
    // TERM/HUP are received by a thread of their own.
    goondan_base::tool_processes::become_subreaper();
    let tool_processes = Arc::new(goondan_base::tool_processes::ToolProcesses::default());
    let shutdown = shutdown::Shutdown::install(Arc::clone(&tool_processes));
    let session = Session {
        env,
        tool_processes: Arc::clone(&tool_processes),
        shutdown: Arc::clone(&shutdown),
        secrets,
        started_service: std::sync::atomic::AtomicBool::new(false),
        environment_secrets,
        reexec: std::sync::atomic::AtomicBool::new(false),
    };
    init_logging(&cli.global);
    if kept_away > 0 {
        tracing::debug!("{kept_away} secret variable(s) kept out of the environment of tool processes");
    }
    let mut out = output::Output::new(cli.global.no_color);
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!("cannot start the async runtime: {error}");
            return ExitCode::from(exit::FAILED);
        }
    };
    // As a subreaper we adopt the orphans of tool calls (a shell's job that
    // outlives it): reap each as it ends, while a command runs.
    let _reaper = runtime.spawn(async {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut child_changes) = signal(SignalKind::child()) else { return };
        while child_changes.recv().await.is_some() {
            goondan_base::tool_processes::reap_adopted_orphans();
        }
    });
    let result = dispatch(&cli, &runtime, &session, &mut out);
    // Background jobs of tool calls end with us.
    if matches!(cli.command, Command::Mcp(_) | Command::Run(_) | Command::Host(_)) {
        // A read of standard input that never returns (stdin not a pipe, and
        // the server or the service's cli connector stopped by a signal)
        // must not hold the exit forever.
        runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    } else {
        drop(runtime);
    }
    tool_processes.kill_all();
    // What the scan by marker missed (a process caught mid-exec) — but not
    // a service `gdn run --detach` started, which is meant to outlive us.
    if !session.started_service.load(std::sync::atomic::Ordering::SeqCst) {
        goondan_base::tool_processes::kill_descendants();
    }
    if let Some(code) = shutdown.exit_status() {
        return ExitCode::from(code);
    }
    if session.reexec.load(std::sync::atomic::Ordering::SeqCst) {
        let error = reexec(&session.environment_secrets);
        let _ = output::error_line(&mut out.stderr, format_args!("the service could not start again: {error}"));
        return ExitCode::from(exit::FAILED);
    }
    match result {
        Ok(code) => ExitCode::from(code),
        // The reader of our output went away (`gdn … | head`): it has what it wanted.
        Err(error) if output::is_broken_pipe(&error) => ExitCode::from(exit::OK),
        Err(error) => {
            let _ = output::error_line(&mut out.stderr, format_args!("{error:#}"));
            ExitCode::from(exit::FAILED)
        }
    }
}

/// The secrets, taken out of the process environment before any thread
/// exists (this may re-execute the binary), joined by the bundle's `.env`
/// files (and `--env-file`) for the commands that read them: the secrets,
/// how many the environment held, and those (to give a service started
/// again). An agent process's environment has none: the orchestrator took
/// them out, and hands them over the channel.
fn take_secrets(
    cli: &Cli,
    agent_process: bool,
) -> Result<(secrets::Secrets, usize, std::collections::BTreeMap<String, String>), ExitCode> {
    let isolated = if agent_process {
        Ok(secrets::Secrets::default())
    } else {
        secrets::isolate(&cli.global.config, workspace::packages_dir(&cli.global).as_deref())
    };
    let mut secrets = match isolated {
        Ok(secrets) => secrets,
        Err(message) => {
            let _ = output::error_line(&mut output::Output::new(cli.global.no_color).stderr, message);
            return Err(ExitCode::from(exit::FAILED));
        }
    };
    let kept_away = secrets.len();
    let environment_secrets = secrets.to_map();
    // The bundle's `.env` files (and `--env-file`) join the secrets: read
    // through the lookup below, never put into the process environment.
    if let Some(env_file) = loads_env_files(&cli.command) {
        let bundle_file = goondan_config::resolve_bundle_file(&cli.global.config);
        let bundle_dir = bundle_file.parent().filter(|dir| !dir.as_os_str().is_empty()).unwrap_or(Path::new("."));
        match dotenv::load(bundle_dir, env_file) {
            Ok(values) => secrets.extend(values),
            Err(message) => {
                let _ = output::error_line(&mut output::Output::new(cli.global.no_color).stderr, message);
                return Err(ExitCode::from(exit::CONFIG));
            }
        }
    }
    Ok((secrets, kept_away, environment_secrets))
}

/// Runs the command.
fn dispatch(
    cli: &Cli,
    runtime: &tokio::runtime::Runtime,
    session: &Session,
    out: &mut output::Output,
) -> anyhow::Result<u8> {
    match &cli.command {
        Command::Run(args) => runtime.block_on(run::run(&cli.global, args, session, out)),
        Command::Instance(cli::InstanceArgs { command: Some(command) }) => {
            instance::instance(&cli.global, command, session, out)
        }
        Command::Instance(cli::InstanceArgs { command: None }) => instance_tui::bare(&cli.global, session, out),
        Command::Stop(args) => service::stop(&cli.global, args.wait_secs, out),
        Command::Restart(args) => restart::restart(&cli.global, args, out),
        Command::Task(command) => task::task(&cli.global, command, session, out),
        Command::Doctor(args) => doctor::doctor(&cli.global, args.fix, session, out),
        Command::Logs(args) => logs::logs(&cli.global, args, session, out),
        Command::Usage(args) => usage::usage(&cli.global, args, out),
        Command::Studio(args) => studio::studio(&cli.global, args, session, out),
        Command::Init(args) => init::init(&cli.global, args, out),
        Command::Help(args) => help::help(&cli.global, args, out),
        Command::Schema(args) => init::schema(args, out),
        Command::Validate(args) => runtime.block_on(commands::validate(&cli.global, args, out)),
        Command::Tool(ToolCommand::List { agent }) => {
            runtime.block_on(commands::tool_list(&cli.global, agent.as_deref(), session, out))
        }
        Command::Tool(ToolCommand::Call(args)) => {
            runtime.block_on(commands::tool_call(&cli.global, args, session, out))
        }
        Command::Mcp(McpCommand::Serve(args)) => runtime.block_on(mcp_serve::serve(&cli.global, args, session, out)),
        Command::Agent(_) => runtime.block_on(agent_process::run(&cli.global, session)),
        Command::Host(args) => runtime.block_on(nats::host(&cli.global, args, session, out)),
        Command::Registry(RegistryCommand::Serve(args)) => {
            runtime.block_on(registry::serve(&cli.global, args, session, out))
        }
        Command::Package(command) => runtime.block_on(package::package(&cli.global, command, session, out)),
    }
}

/// Replaces this process with a new run of the same command (a service's
/// restart: the same pid, standard streams and process group, the newest
/// binary on disk); returns only if that fails, why. The secrets `main`
/// took out of the environment are carried across as at the start, never
/// through the new image's environment or arguments.
fn reexec(secrets: &std::collections::BTreeMap<String, String>) -> String {
    let program = match std::env::current_exe() {
        // A binary replaced on disk (a new build) is the one to run.
        Ok(program) => match program.to_str().and_then(|path| path.strip_suffix(" (deleted)")) {
            Some(path) => std::path::PathBuf::from(path),
            None => program,
        },
        Err(error) => return format!("cannot find the gdn binary: {error}"),
    };
    tracing::info!("the service starts again");
    let mut command = std::process::Command::new(program);
    command.args(std::env::args_os().skip(1));
    secrets::exec_carrying(command, secrets)
}

/// Whether the command runs agents, which read the bundle's `.env` files,
/// or checks the bundle (`validate` reports a file `gdn run` would refuse):
/// `Some(--env-file)` if so.
fn loads_env_files(command: &Command) -> Option<Option<&Path>> {
    match command {
        Command::Run(args) => Some(args.env_file.as_deref()),
        Command::Host(args) => Some(args.env_file.as_deref()),
        Command::Tool(_) | Command::Mcp(_) | Command::Doctor(_) | Command::Validate(_) => Some(None),
        Command::Stop(_)
        | Command::Restart(_)
        | Command::Task(_)
        | Command::Logs(_)
        | Command::Usage(_)
        | Command::Studio(_)
        | Command::Registry(_)
        | Command::Package(_)
        | Command::Instance(_)
        | Command::Init(_)
        | Command::Help(_)
        | Command::Schema(_)
        | Command::Agent(_) => None,
    }
}

/// Standard error as the log's writer (with the `service.log` fault point
/// of the crash tests).
struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        goondan_core::fault::before_write(goondan_core::fault::Point::ServiceLog)?;
        std::io::stderr().write(bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

fn init_logging(global: &cli::GlobalOptions) {
    use tracing_subscriber::EnvFilter;
    let default = if global.quiet {
        "error"
    } else {
        match global.verbose {
            0 => "warn",
            1 => "info",
            2 => "debug",
            _ => "trace",
        }
    };
    let filter = std::env::var("GOONDAN_LOG")
        .ok()
        .and_then(|spec| EnvFilter::try_new(spec).ok())
        .unwrap_or_else(|| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| LogWriter)
        // A log line that cannot be written (standard error is a log file on
        // a full disk) is lost, and nothing else: by default the subscriber
        // reports it with `eprintln!`, which panics when standard error
        // fails — killing the thread that logged (the inbox's writer, the
        // signal handler) and leaving a half-alive service.
        .log_internal_errors(false)
        // Colour only for a terminal: a pipe or a log file gets plain text.
        .with_ansi(
            !global.no_color
                && std::env::var_os("NO_COLOR").is_none()
                && std::io::IsTerminal::is_terminal(&std::io::stderr()),
        )
        .with_target(global.verbose >= 2)
        .try_init();
}
