//! `gdn studio`: a read-only web page over a state root's durable logs —
//! the instances of each project, the agent graph, the flow of messages,
//! handoffs and tool calls, and one trace's spans — served by axum on
//! 127.0.0.1 (by default) with its assets built into the binary.
//!
//! One thread (`gdn-studio-watch`) follows the state root: inotify (through
//! `notify`) wakes it when a file changes, and a sweep every second catches
//! what a notification could miss; it reads what the logs gained into the
//! [`model::Store`] and sends the new entries to every open page as
//! server-sent events (`/api/stream`). The HTTP handlers answer from the
//! store. Nothing under the state root is written.
//!
//! Every request passes [`guard`] first: its `Host` must name the studio
//! (DNS rebinding), its `Origin`, if any, must be the studio's own, and with
//! a token (`--auth-token-env`, required beyond loopback) it must carry it.

mod api;
mod guard;
mod model;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use anyhow::Result;
use axum::Router;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use goondan_core::JsonValue;
use serde_json::json;
use tokio::sync::broadcast;

use crate::cli::{GlobalOptions, StudioArgs};
use crate::exit;
use crate::output::{self, Output};

const INDEX_HTML: &str = include_str!("assets/index.html");
const STUDIO_JS: &str = include_str!("assets/studio.js");
const STUDIO_CSS: &str = include_str!("assets/studio.css");

/// How often the state root is swept even without a notification.
const SWEEP: Duration = Duration::from_secs(1);

struct Shared {
    store: RwLock<model::Store>,
    events: broadcast::Sender<Arc<str>>,
}

type AppState = Arc<Shared>;

/// `gdn studio`.
pub fn studio(global: &GlobalOptions, args: &StudioArgs, session: &crate::Session, out: &mut Output) -> Result<u8> {
    use std::io::Write as _;
    if args.open && args.no_open {
        output::error_line(&mut out.stderr, "--open and --no-open cannot be used together")?;
        return Ok(exit::USAGE);
    }
    // The token is read once, here, and lives only in the guard.
    let token = match crate::commands::auth_token(args.auth_token_env.as_deref(), session) {
        Ok(token) => token,
        Err(message) => {
            output::error_line(&mut out.stderr, message)?;
            return Ok(exit::USAGE);
        }
    };
    let root = crate::workspace::state_root(global)?;
    // The port first: one in use is reported before the logs are read.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let cannot_listen = |out: &mut Output, error: std::io::Error| {
        output::error_line(&mut out.stderr, format_args!("cannot listen on {}:{}: {error}", args.host, args.port))
    };
    let addresses: Vec<std::net::SocketAddr> =
        match runtime.block_on(tokio::net::lookup_host((args.host.as_str(), args.port))) {
            Ok(addresses) => addresses.collect(),
            Err(error) => {
                cannot_listen(out, error)?;
                return Ok(exit::FAILED);
            }
        };
    if token.is_none() && addresses.iter().any(|address| !address.ip().is_loopback()) {
        output::error_line(
            &mut out.stderr,
            format_args!(
                "--host {} is not a loopback address: add --auth-token-env NAME (NAME an environment variable \
                 holding a token every request must carry), since whoever reaches the studio reads every \
                 conversation of the state root",
                args.host
            ),
        )?;
        return Ok(exit::USAGE);
    }
    let listener = match runtime.block_on(tokio::net::TcpListener::bind(addresses.as_slice())) {
        Ok(listener) => listener,
        Err(error) => {
            cannot_listen(out, error)?;
            return Ok(exit::FAILED);
        }
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
            match crate::nats::BrokerCopy::take_or_exit(&runtime, url, session, &workspace, out)? {
                Ok(copy) => (copy.root.path().to_path_buf(), Some(copy)),
                Err(code) => return Ok(code),
            }
        }
    };
    let store = model::Store::open(&shown, global.workspace.clone());
    let (events, _) = broadcast::channel(1024);
    let shared = Arc::new(Shared { store: RwLock::new(store), events });
    follow(&shown, &shared)?;
    if let Some(mut copy) = copy {
        let refreshing = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        std::thread::Builder::new().name("gdn-studio-nats".to_owned()).spawn(move || {
            loop {
                std::thread::sleep(Duration::from_secs(1));
                if let Err(message) = refreshing.block_on(copy.refresh()) {
                    tracing::warn!("reading the swarm's state: {message}");
                }
            }
        })?;
    }
    let address = listener.local_addr()?;
    let host = match args.host.as_str() {
        "0.0.0.0" | "::" => "127.0.0.1".to_owned(),
        host if host.contains(':') => format!("[{host}]"),
        host => host.to_owned(),
    };
    // With a token, the URL to open carries it (the page's own requests
    // then carry the cookie it sets).
    let guard = guard::Guard::new(address.port(), &args.host, token);
    let url = match guard.token_query() {
        Some(query) => format!("http://{host}:{}/?{query}", address.port()),
        None => format!("http://{host}:{}", address.port()),
    };
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
    } else if open_browser(&url) {
        writeln!(out.stdout, "Opened a browser (Ctrl-C stops the studio).")?;
    } else {
        writeln!(out.stdout, "Could not open a browser: open {url} (Ctrl-C stops the studio).")?;
    }
    out.stdout.flush()?;
    let app = router(shared, guard);
    runtime.block_on(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
    })?;
    writeln!(out.stdout, "Studio stopped.")?;
    Ok(130)
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

fn router(shared: AppState, guard: guard::Guard) -> Router {
    Router::new()
        .route("/", get(|| async { Html(INDEX_HTML) }))
        .route("/assets/studio.js", get(|| async { asset("text/javascript; charset=utf-8", STUDIO_JS) }))
        .route("/assets/studio.css", get(|| async { asset("text/css; charset=utf-8", STUDIO_CSS) }))
        .route("/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
        .route("/api/projects", get(projects))
        .route("/api/instances", get(instances))
        .route("/api/instances/{key}/visualization", get(instance_visualization))
        .route("/api/projects/{id}/visualization", get(project_visualization))
        .route("/api/traces/{id}", get(trace))
        .route("/api/stream", get(stream))
        .fallback(|| async {
            json_response(StatusCode::NOT_FOUND, json!({"error": "not_found", "message": "no such resource"}))
        })
        .layer(axum::middleware::from_fn_with_state(Arc::new(guard), guard::check))
        .with_state(shared)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

fn json_response(status: StatusCode, body: JsonValue) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json; charset=utf-8"), (header::CACHE_CONTROL, "no-store")],
        body.to_string(),
    )
        .into_response()
}

fn ok(body: JsonValue) -> Response {
    json_response(StatusCode::OK, body)
}

fn not_found(what: String) -> Response {
    json_response(StatusCode::NOT_FOUND, json!({"error": "not_found", "message": what}))
}

type Params = Query<HashMap<String, String>>;

fn window(params: &HashMap<String, String>) -> api::Window {
    let number = |name: &str| params.get(name).and_then(|v| v.trim().parse::<usize>().ok()).filter(|n| *n > 0);
    api::Window {
        // The original's range: 1..=200, 20 by default.
        recent: number("recent").unwrap_or(20).min(200),
        limit: number("limit").unwrap_or(api::DEFAULT_LIMIT).min(api::MAX_LIMIT),
        before: params.get("before").and_then(|v| v.parse::<u32>().ok()),
    }
}

fn read(shared: &Shared) -> std::sync::RwLockReadGuard<'_, model::Store> {
    shared.store.read().unwrap_or_else(PoisonError::into_inner)
}

async fn projects(State(shared): State<AppState>) -> Response {
    ok(api::projects(&read(&shared)))
}

async fn instances(State(shared): State<AppState>, Query(params): Params) -> Response {
    ok(api::instances(&read(&shared), params.get("workspace").map(String::as_str)))
}

async fn instance_visualization(
    State(shared): State<AppState>,
    UrlPath(key): UrlPath<String>,
    Query(params): Params,
) -> Response {
    let store = read(&shared);
    let wanted = params.get("workspace");
    // Without a workspace: the first project that has the key.
    let project = store
        .projects
        .values()
        .filter(|p| wanted.is_none_or(|w| *w == p.id))
        .find(|p| p.by_key.contains_key(key.as_str()) || p.instances.keys().any(|(_, k)| **k == *key));
    match project {
        Some(project) => ok(api::visualization(project, Some(&key), window(&params))),
        None => not_found(format!("no instance '{key}'")),
    }
}

async fn project_visualization(
    State(shared): State<AppState>,
    UrlPath(id): UrlPath<String>,
    Query(params): Params,
) -> Response {
    let store = read(&shared);
    match store.projects.get(&id) {
        Some(project) => ok(api::visualization(project, None, window(&params))),
        None => not_found(format!("no project '{id}'")),
    }
}

async fn trace(State(shared): State<AppState>, UrlPath(id): UrlPath<String>, Query(params): Params) -> Response {
    let store = read(&shared);
    let wanted = params.get("workspace");
    let found = store.projects.values().filter(|p| wanted.is_none_or(|w| *w == p.id)).find_map(|p| api::trace(p, &id));
    match found {
        Some(trace) => ok(trace),
        None => not_found(format!("no trace '{id}'")),
    }
}

async fn stream(State(shared): State<AppState>) -> impl IntoResponse {
    let receiver = shared.events.subscribe();
    let hello: Arc<str> = Arc::from(json!({"type": "hello", "revision": read(&shared).revision}).to_string());
    let state = (Some(hello), receiver);
    let events = futures_util::stream::unfold(state, |(first, mut receiver)| async move {
        if let Some(first) = first {
            return Some((Ok::<Event, std::convert::Infallible>(Event::default().data(&*first)), (None, receiver)));
        }
        let data = match receiver.recv().await {
            Ok(data) => data,
            // Too slow a reader: it reads everything again.
            Err(broadcast::error::RecvError::Lagged(_)) => Arc::from(json!({"type": "reset"}).to_string()),
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        Some((Ok(Event::default().data(&*data)), (None, receiver)))
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}

/// Starts the thread that follows the state root.
fn follow(root: &Path, shared: &AppState) -> Result<()> {
    use notify::Watcher as _;
    // The paths a notification names (none: read everything).
    let (wake, woken) = std::sync::mpsc::channel::<Vec<std::path::PathBuf>>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let paths = match event {
            // Our own reads show as accesses: only changes wake the reader.
            Ok(event) if matches!(event.kind, notify::EventKind::Access(_)) => return,
            Ok(event) if !event.need_rescan() => event.paths,
            _ => Vec::new(),
        };
        let _ = wake.send(paths);
    })?;
    let workspaces = root.join("workspaces");
    let shared = Arc::clone(shared);
    std::thread::Builder::new().name("gdn-studio-watch".to_owned()).spawn(move || {
        let mut watching = false;
        loop {
            if !watching {
                watching = watcher.watch(&workspaces, notify::RecursiveMode::Recursive).is_ok();
            }
            match woken.recv_timeout(SWEEP) {
                // A burst of writes is read at once: the files named, or
                // everything when a notification named none.
                Ok(first) => {
                    std::thread::sleep(Duration::from_millis(15));
                    let mut paths = Some(first).filter(|p| !p.is_empty());
                    while let Ok(more) = woken.try_recv() {
                        match (&mut paths, more.is_empty()) {
                            (Some(paths), false) => paths.extend(more),
                            _ => paths = None,
                        }
                    }
                    if let Some(paths) = &mut paths {
                        paths.sort();
                        paths.dedup();
                    }
                    publish(&shared, paths.as_deref());
                }
                // The sweep: every file, for what a notification missed.
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => publish(&shared, None),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    })?;
    Ok(())
}

/// Reads what changed (in the files `paths`, or anywhere) and tells the pages.
fn publish(shared: &Shared, paths: Option<&[std::path::PathBuf]>) {
    let mut messages = Vec::new();
    {
        let mut store = shared.store.write().unwrap_or_else(PoisonError::into_inner);
        let changes = match paths {
            Some(paths) => store.refresh_paths(paths),
            None => store.refresh(),
        };
        let revision = store.revision;
        for id in changes.reset {
            messages.push(json!({"type": "reset", "workspace": id, "revision": revision}).to_string());
        }
        for (id, fresh) in changes.fresh {
            let Some(project) = store.projects.get(&id) else { continue };
            let entries: Vec<JsonValue> =
                fresh.iter().filter_map(|seq| project.entries.get(*seq as usize)).map(model::Entry::to_json).collect();
            messages.push(
                json!({"type": "entries", "workspace": id, "revision": revision, "entries": entries}).to_string(),
            );
        }
    }
    for message in messages {
        let _ = shared.events.send(Arc::from(message));
    }
}
