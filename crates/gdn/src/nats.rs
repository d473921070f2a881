//! `gdn host --nats URL` (an agent host), the agent processes' arguments,
//! and the `--nats URL` copy of a swarm's state for the commands that read
//! it; the glue itself (the hub's side, a host's configuration, the copy)
//! is `goondan_service::nats`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use goondan_nats::{Host, Scope};
use goondan_orchestrator::AgentLauncher;
use goondan_runtime::agent::{AgentOptions, identity};
use goondan_runtime::store::{Workspace, WorkspaceAccess};
use goondan_service::nats::{ACK_WAIT, BrokerCopy, FIRST_CONNECT, LocalRuntime, agent_env, host_config, hostname};
use goondan_tools::TracingEventSink;

use crate::cli::{GlobalOptions, HostArgs};
use crate::exit;
use crate::output::{self, Output};

/// The agent processes' arguments (they log as this process does).
pub(crate) fn agent_launch_args(global: &GlobalOptions) -> Vec<String> {
    let mut args: Vec<String> = vec!["-v".to_owned(); usize::from(global.verbose)];
    if global.quiet {
        args.push("-q".to_owned());
    }
    if global.no_color {
        args.push("--no-color".to_owned());
    }
    args.push("__agent".to_owned());
    args
}

/// `gdn host`.
pub async fn host(global: &GlobalOptions, args: &HostArgs, session: &crate::Session, out: &mut Output) -> Result<u8> {
    let bundle = match crate::commands::valid_bundle_or_exit(global, out)? {
        Ok((bundle, _)) => bundle,
        Err(code) => return Ok(code),
    };
    let mut labels = BTreeMap::new();
    for label in &args.labels {
        match goondan_config::parse_host_label(label) {
            Ok((key, value)) => {
                labels.insert(key, value);
            }
            Err(error) => return out.fail(exit::USAGE, format!("--label {label}: {error}")),
        }
    }
    if let Some(message) = crate::commands::workdir_error(args.workdir.as_deref(), &global.config) {
        return out.fail(exit::USAGE, message);
    }
    let root = crate::workspace::state_root(global)?;
    let options = AgentOptions::new(Arc::new(TracingEventSink));
    let (entry, _) = match identity(&bundle, &options) {
        Ok(identity) => identity,
        Err(error) => return out.fail(exit::CONFIG, error.to_string()),
    };
    let workspace = match crate::workspace::open(global, &root, &bundle, &entry, WorkspaceAccess::Use) {
        Ok(workspace) => workspace,
        Err(message) => return out.fail(exit::USAGE, &message),
    };
    let absolute = |path: &Path| std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let workdir = match &args.workdir {
        Some(dir) => absolute(dir),
        None => match crate::workspace::default_workdir(&workspace) {
            Ok(dir) => dir,
            Err(message) => return out.fail(exit::USAGE, &message),
        },
    };
    let program = std::env::current_exe()?;
    let local = LocalRuntime {
        config: absolute(&global.config),
        workspace: absolute(workspace.dir()),
        workdir,
        env: agent_env(&bundle, &session.secrets),
        launcher: AgentLauncher::new(program, agent_launch_args(global)),
    };
    let env = |name: &str| (session.env)(name);
    let client = match goondan_nats::connect(&args.nats, "gdn host", FIRST_CONNECT, &env).await {
        Ok(client) => client,
        Err(error) => return out.fail(nats_exit_code(&error), error.to_string()),
    };
    let host_id = args.host_id.clone().unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id()));
    let scope = Scope::new(workspace.id());
    let ack_wait = args.ack_wait_ms.map_or(ACK_WAIT, |ms| Duration::from_millis(ms.max(300)));
    let mut host =
        match Host::start(client, host_config(scope.clone(), host_id.clone(), labels.clone(), false, local, ack_wait))
            .await
        {
            Ok(host) => host,
            Err(error) => return out.fail(exit::FAILED, error.to_string()),
        };
    writeln!(
        out.stderr,
        "agent host {host_id} serves swarm {} on {} (labels: {labels:?}); Ctrl-C stops it",
        scope.token(),
        args.nats
    )?;
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    session.shutdown.turn_started(stop_tx);
    tokio::select! {
        _ = stop_rx.wait_for(|stop| *stop) => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    session.shutdown.handled();
    writeln!(out.stderr, "agent host {host_id} stopping: {} agent process(es) end", host.running())?;
    host.stop().await;
    Ok(exit::OK)
}

/// The copy of `workspace`'s swarm for a command given `--nats URL`, or
/// the exit code of the error it printed.
pub(crate) fn take_copy_or_exit(
    runtime: &tokio::runtime::Runtime,
    url: &str,
    session: &crate::Session,
    workspace: &Workspace,
    out: &mut Output,
) -> Result<std::result::Result<BrokerCopy, u8>> {
    let env = |name: &str| (session.env)(name);
    match runtime.block_on(BrokerCopy::take(url, &env, workspace)) {
        Ok(copy) => Ok(Ok(copy)),
        Err(error) => {
            output::error_line(&mut out.stderr, format!("--nats {url}: {error}"))?;
            let code = match &error {
                goondan_service::nats::CopyError::Nats(error) => nats_exit_code(error),
                _ => exit::FAILED,
            };
            Ok(Err(code))
        }
    }
}

/// The exit code of a broker that cannot be used: unreachable (or refusing
/// the connection) is a network error, unreadable credentials a
/// configuration error, a JetStream failure a failure.
pub(crate) fn nats_exit_code(error: &goondan_nats::NatsError) -> u8 {
    match error {
        goondan_nats::NatsError::Connect { .. } => exit::NETWORK,
        goondan_nats::NatsError::Credentials { .. } => exit::CONFIG,
        goondan_nats::NatsError::JetStream(_) => exit::FAILED,
    }
}
