//! `gdn registry serve`: its arguments, the tokens (`GOONDAN_REGISTRY_TOKENS`,
//! read once, here), the listener, and the one line saying where it
//! listens (with port 0 only that line tells). SIGTERM/SIGHUP and Ctrl-C
//! stop it gracefully: the requests in flight finish. The server itself is
//! `goondan-registry`'s.

use std::io::Write as _;
use std::sync::atomic::Ordering;

use anyhow::Result;
use goondan_registry::server::{self, RegistryConfig};

use crate::cli::{GlobalOptions, RegistryServeArgs};
use crate::exit;
use crate::output::{self, Output};

/// The variable holding the tokens that may publish (comma-separated).
const TOKENS_ENV: &str = "GOONDAN_REGISTRY_TOKENS";

/// `gdn registry serve`.
pub async fn serve(
    global: &GlobalOptions,
    args: &RegistryServeArgs,
    session: &crate::Session,
    out: &mut Output,
) -> Result<u8> {
    let tokens: Vec<String> = (session.env)(TOKENS_ENV)
        .map(|value| value.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_owned).collect())
        .unwrap_or_default();
    if tokens.is_empty() {
        output::note_line(
            &mut out.stderr,
            format_args!("{TOKENS_ENV} is not set: the registry is read-only (publishing answers 401)"),
        )?;
    }
    // The storage first: a directory that cannot be made, or that another
    // registry serves, is reported before the address is announced.
    if let Err(error) = std::fs::create_dir_all(&args.storage) {
        output::error_line(&mut out.stderr, format_args!("--storage {}: {error}", args.storage.display()))?;
        return Ok(exit::FAILED);
    }
    let mut config = RegistryConfig::new(&args.storage, tokens.clone());
    config.base_url.clone_from(&args.base_url);
    let app = match server::router(config) {
        Ok(app) => app,
        Err(error) => {
            output::error_line(&mut out.stderr, error)?;
            return Ok(exit::FAILED);
        }
    };
    let listener = match tokio::net::TcpListener::bind((args.host.as_str(), args.port)).await {
        Ok(listener) => listener,
        Err(error) => {
            output::error_line(&mut out.stderr, format_args!("cannot listen on {}:{}: {error}", args.host, args.port))?;
            return Ok(exit::FAILED);
        }
    };
    let address = listener.local_addr()?;
    if !address.ip().is_loopback() && !tokens.is_empty() {
        output::note_line(
            &mut out.stderr,
            format_args!(
                "the registry listens on {address} over plain HTTP: put TLS in front of it, tokens travel in clear"
            ),
        )?;
    }
    let url = format!("http://{address}");
    if global.json {
        writeln!(out.stdout, "{}", serde_json::json!({"url": url, "storage": args.storage}))?;
    } else {
        writeln!(out.stdout, "Registry listening on {url}")?;
    }
    out.stdout.flush()?;

    let (stop, interrupted) = crate::commands::stop_on_signals(session);
    let served = server::serve_router(listener, app, stop).await;
    session.shutdown.turn_ended();
    if let Err(error) = served {
        output::error_line(&mut out.stderr, error)?;
        return Ok(exit::FAILED);
    }
    // A server stopped by SIGTERM has done what was asked: exit 0.
    if session.shutdown.requested().is_some() {
        session.shutdown.handled();
    }
    Ok(if interrupted.load(Ordering::SeqCst) { exit::INTERRUPTED } else { exit::OK })
}
