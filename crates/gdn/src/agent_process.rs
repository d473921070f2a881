//! `gdn __agent`: one agent instance of a swarm, in its own process, started
//! by the orchestrator (`gdn run`) and talking to it over the channel it
//! inherited (goondan-agent does the work).
//!
//! It joins the orchestrator, receives `init` (the instance, the bundle, and
//! the secrets, which never enter its environment), starts the instance with
//! gdn's wiring, says `ready`, and runs a turn per message until `shutdown`,
//! the end of the connection (the orchestrator exited or was killed),
//! SIGTERM, or a turn that asks for a restart.

use anyhow::Result;
use goondan_agent::instance::prepare;
use goondan_agent::{AgentChannel, LeftRunning, ServeEnd, serve};
use tokio::sync::watch;

use crate::cli::GlobalOptions;
use crate::exit;

pub use goondan_agent::instance::ready_codes;

/// Runs the agent process; its exit status: 0 after `shutdown`, the end of
/// the connection or a restart request, 1 when it could not start.
pub async fn run(_global: &GlobalOptions, session: &crate::Session) -> Result<u8> {
    let channel = match AgentChannel::connect().await {
        Ok(channel) => channel,
        Err(error) => {
            tracing::error!("{error}");
            return Ok(exit::FAILED);
        }
    };
    let instance = channel.init.instance.clone();
    let mut exporter = None;
    let wire = |options: &mut goondan_runtime::agent::AgentOptions| {
        crate::wiring::install(options, &session.tool_processes);
        // The variables as the agent sees them: its secrets (the headers
        // among them) from `init`, then its environment.
        exporter = crate::telemetry::start(&options.env);
        if let Some(exporter) = &exporter {
            crate::telemetry::attach(options, exporter);
        }
    };
    let prepared = match prepare(&channel, wire).await {
        Ok(prepared) => prepared,
        Err(error) => {
            tracing::debug!("{instance} could not start: {}", error.message);
            channel.ready(Some(error)).await;
            return Ok(exit::FAILED);
        }
    };
    channel.ready(None).await;
    // SIGTERM / SIGHUP (also the parent-death signal) stop it like `shutdown`.
    let (terminate_tx, terminate) = watch::channel(false);
    session.shutdown.turn_started(terminate_tx);
    let _lock = prepared.lock;
    let processes = std::sync::Arc::clone(&session.tool_processes);
    let left_running: LeftRunning = std::sync::Arc::new(move || processes.any_left_running());
    let end = serve(
        prepared.agent,
        prepared.conversation,
        channel,
        prepared.runtime,
        prepared.tasks,
        left_running,
        terminate,
    )
    .await;
    session.shutdown.turn_ended();
    tracing::debug!("{instance} stops: {end:?}");
    crate::telemetry::flush_at_exit(exporter).await;
    // Background jobs of its tool calls end with it (main kills them).
    Ok(match end {
        ServeEnd::Shutdown | ServeEnd::Disconnected | ServeEnd::Restart => exit::OK,
    })
}
