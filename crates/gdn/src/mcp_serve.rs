//! `gdn mcp serve`: the agent's Tool Catalog as an MCP server, over stdio
//! or streamable HTTP (`goondan_mcp::server`).
//!
//! The agent is assembled by the same `commands::setup` as `gdn tool list`
//! and `gdn tool call`, so the tools, middleware and extensions are those a
//! turn gets. On stdio, standard output carries MCP frames only: logs go to
//! standard error and nothing here writes to standard output. The server
//! stops at the end of its input (stdio), at SIGTERM/SIGHUP (through
//! `goondan_service::shutdown`, as a turn is cancelled) or at Ctrl-C; `main` then kills
//! every process its tool calls left.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::Result;
use goondan_mcp::server::{self, ToolServer};
use goondan_runtime::agent::AgentOptions;

use crate::cli::{GlobalOptions, McpServeArgs};
use crate::exit;
use crate::output::Output;

/// `gdn mcp serve`.
pub async fn serve(
    global: &GlobalOptions,
    args: &McpServeArgs,
    session: &crate::Session,
    out: &mut Output,
) -> Result<u8> {
    if let Some(message) = crate::commands::workdir_error(args.workdir.as_deref(), &global.config) {
        return out.fail(exit::USAGE, message);
    }
    // The token is read once, here, and lives only in the server's check.
    let token = match crate::commands::auth_token(args.auth_token_env.as_deref(), session) {
        Ok(token) => token.map(server::BearerToken::new),
        Err(message) => return out.fail(exit::USAGE, message),
    };
    if args.allow_remote && token.is_none() {
        return out.fail(
            exit::USAGE,
            "--allow-remote needs --auth-token-env NAME: a server other machines can reach must ask for a token",
        );
    }
    // The address first: a refused bind needs no agent.
    let listener = match &args.http {
        Some(address) => match server::bind_http(address, args.allow_remote).await {
            Ok(listener) => Some(listener),
            Err(error) => return out.fail(exit::USAGE, error),
        },
        None => None,
    };
    let configure = |options: &mut AgentOptions| {
        options.agent.clone_from(&args.agent);
        options.workdir.clone_from(&args.workdir);
        let timeout_ms = args.tool_timeout_ms.unwrap_or(crate::run::DEFAULT_TOOL_TIMEOUT_MS);
        options.call_timeout = Some(timeout_ms).filter(|ms| *ms > 0).map(std::time::Duration::from_millis);
    };
    let tooling = match crate::commands::setup(global, session, configure, out).await? {
        Ok(tooling) => tooling,
        Err(code) => return Ok(code),
    };
    let agent = Arc::clone(&tooling.agent_name);
    let server = ToolServer::new(Arc::new(tooling), "gdn", env!("CARGO_PKG_VERSION"));

    // SIGTERM/SIGHUP cancel the server the way they cancel a running turn.
    let (stop, interrupted) = crate::commands::stop_on_signals(session);
    let served = match listener {
        None => {
            tracing::info!("serving the tools of agent '{agent}' over MCP on standard input/output");
            server::serve_stdio(server, stop).await
        }
        Some(listener) => {
            let url = match listener.local_addr() {
                Ok(address) => format!("http://{address}{}", server::HTTP_PATH),
                Err(error) => {
                    session.shutdown.turn_ended();
                    return Err(anyhow::Error::new(error).context("reading the listener's address"));
                }
            };
            // Over HTTP standard output is free: say where the server is
            // (with port 0 only this line tells).
            if global.json {
                writeln!(out.stdout, "{}", serde_json::json!({"url": url, "agent": &*agent}))?;
            } else {
                writeln!(out.stdout, "MCP server for agent '{agent}': {url}")?;
            }
            out.stdout.flush()?;
            server::serve_http(listener, server, args.allow_remote, token, stop).await
        }
    };
    session.shutdown.turn_ended();
    if let Err(error) = served {
        return out.fail(exit::FAILED, error);
    }
    Ok(if interrupted.load(Ordering::SeqCst) { exit::INTERRUPTED } else { exit::OK })
}
