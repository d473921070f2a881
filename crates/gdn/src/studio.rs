//! `gdn studio`: its arguments, the token, the listener (a port in use is
//! reported before the logs are read), a swarm's copy from the broker
//! (`--nats`, taken again every second), and what it prints. The page, its
//! data API and the thread that follows the state root are
//! `goondan-studio`'s.

use std::time::Duration;

use anyhow::Result;

use crate::cli::{GlobalOptions, StudioArgs};
use crate::exit;
use crate::output::{self, Output};

/// `gdn studio`.
pub fn studio(global: &GlobalOptions, args: &StudioArgs, session: &crate::Session, out: &mut Output) -> Result<u8> {
    use std::io::Write as _;
    if args.open && args.no_open {
        return out.fail(exit::USAGE, "--open and --no-open cannot be used together");
    }
    // The token is read once, here, and lives only in the guard.
    let token = match crate::commands::auth_token(args.auth_token_env.as_deref(), session) {
        Ok(token) => token,
        Err(message) => return out.fail(exit::USAGE, message),
    };
    let root = crate::workspace::state_root(global)?;
    // The port first: one in use is reported before the logs are read.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let listener = match bind(args, &runtime, token.is_some(), out)? {
        Ok(listener) => listener,
        Err(code) => return Ok(code),
    };
    // A swarm spread over agent hosts: a copy from the broker, taken again
    // every second by a thread of its own, is the state root shown.
    let (shown, copy) = match &args.nats {
        None => (root.path().to_path_buf(), None),
        Some(url) => {
            let workspace = match crate::workspace::workspace_or_exit(global, out)? {
                Ok(workspace) => workspace,
                Err(code) => return Ok(code),
            };
            match crate::nats::take_copy_or_exit(&runtime, url, session, &workspace, out)? {
                Ok(copy) => (copy.root.path().to_path_buf(), Some(copy)),
                Err(code) => return Ok(code),
            }
        }
    };
    let address = listener.local_addr()?;
    let studio = goondan_studio::Studio::open(&shown, global.workspace.clone(), address.port(), &args.host, token)?;
    if let Some(copy) = copy {
        refresh_every_second(copy)?;
    }
    let host = match args.host.as_str() {
        "0.0.0.0" | "::" => "127.0.0.1".to_owned(),
        host if host.contains(':') => format!("[{host}]"),
        host => host.to_owned(),
    };
    // With a token, the URL to open carries it (the page's own requests
    // then carry the cookie it sets).
    let url = match studio.token_query() {
        Some(query) => format!("http://{host}:{}/?{query}", address.port()),
        None => format!("http://{host}:{}", address.port()),
    };
    announce(args, &url, address, &root, out)?;
    out.stdout.flush()?;
    runtime.block_on(studio.serve(listener, async {
        let _ = tokio::signal::ctrl_c().await;
    }))?;
    writeln!(out.stdout, "Studio stopped.")?;
    Ok(exit::INTERRUPTED)
}

/// Binds the studio's listener (`--host`, `--port`); a host beyond
/// loopback needs a token. The inner error is the exit code of the error
/// printed.
fn bind(
    args: &StudioArgs,
    runtime: &tokio::runtime::Runtime,
    has_token: bool,
    out: &mut Output,
) -> Result<std::result::Result<tokio::net::TcpListener, u8>> {
    let cannot_listen = |out: &mut Output, error: std::io::Error| {
        output::error_line(&mut out.stderr, format_args!("cannot listen on {}:{}: {error}", args.host, args.port))
    };
    let addresses: Vec<std::net::SocketAddr> =
        match runtime.block_on(tokio::net::lookup_host((args.host.as_str(), args.port))) {
            Ok(addresses) => addresses.collect(),
            Err(error) => {
                cannot_listen(out, error)?;
                return Ok(Err(exit::FAILED));
            }
        };
    if !has_token && addresses.iter().any(|address| !address.ip().is_loopback()) {
        output::error_line(
            &mut out.stderr,
            format_args!(
                "--host {} is not a loopback address: add --auth-token-env NAME (NAME an environment variable \
                 holding a token every request must carry), since whoever reaches the studio reads every \
                 conversation of the state root",
                args.host
            ),
        )?;
        return Ok(Err(exit::USAGE));
    }
    match runtime.block_on(tokio::net::TcpListener::bind(addresses.as_slice())) {
        Ok(listener) => Ok(Ok(listener)),
        Err(error) => {
            cannot_listen(out, error)?;
            Ok(Err(exit::FAILED))
        }
    }
}

/// Takes the copy from the broker again every second, on a thread of its own.
fn refresh_every_second(mut copy: goondan_service::nats::BrokerCopy) -> Result<()> {
    let refreshing = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // Detached by design: it refreshes for as long as the studio (the process) runs.
    std::thread::Builder::new().name("gdn-studio-nats".to_owned()).spawn(move || {
        loop {
            std::thread::sleep(Duration::from_secs(1));
            if let Err(message) = refreshing.block_on(copy.refresh()) {
                tracing::warn!("reading the swarm's state: {message}");
            }
        }
    })?;
    Ok(())
}

/// Says where the studio is, and opens a browser unless told not to (or
/// the URL carries the token).
fn announce(
    args: &StudioArgs,
    url: &str,
    address: std::net::SocketAddr,
    root: &goondan_runtime::store::StateRoot,
    out: &mut Output,
) -> Result<()> {
    use std::io::Write as _;
    writeln!(out.stdout, "Studio started: {url}")?;
    match &args.nats {
        Some(url) => {
            writeln!(out.stdout, "state: the swarm's instances on {url} (this machine's workspace files too)")?
        }
        None => writeln!(out.stdout, "state root: {}", root.path().display())?,
    }
    if !address.ip().is_loopback() {
        output::note_line(
            &mut out.stderr,
            format_args!(
                "the studio listens on {address}: whoever reaches it with the token reads every conversation of \
                 this state root"
            ),
        )?;
    }
    if args.auth_token_env.is_some() {
        // A browser's command line is visible to every user of the machine.
        if args.open {
            output::note_line(
                &mut out.stderr,
                "not opening a browser: the URL carries the token, which a command line would show to other users",
            )?;
        }
        writeln!(out.stdout, "Open {url} in a browser (Ctrl-C stops the studio).")?;
    } else if args.no_open {
        writeln!(out.stdout, "Open {url} in a browser (Ctrl-C stops the studio).")?;
    } else if open_browser(url) {
        writeln!(out.stdout, "Opened a browser (Ctrl-C stops the studio).")?;
    } else {
        writeln!(out.stdout, "Could not open a browser: open {url} (Ctrl-C stops the studio).")?;
    }
    Ok(())
}

fn open_browser(url: &str) -> bool {
    std::process::Command::new("xdg-open")
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .is_ok()
}
