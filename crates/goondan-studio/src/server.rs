//! The studio's HTTP server: the routes (the page, its assets, the data
//! API, the event stream) behind the [`guard`](crate::guard), answered from
//! the [`Store`](crate::model::Store); and the thread that follows the
//! state root and tells open pages what the logs gained.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use goondan_core::JsonValue;
use serde_json::json;
use tokio::sync::broadcast;

use crate::{api, guard, model};

const INDEX_HTML: &str = include_str!("assets/index.html");
const STUDIO_JS: &str = include_str!("assets/studio.js");
const STUDIO_CSS: &str = include_str!("assets/studio.css");

/// How often the state root is swept even without a notification.
const SWEEP: Duration = Duration::from_secs(1);

/// The store and the pages' event channel, shared by the handlers and the
/// thread that follows the state root.
pub(crate) struct Shared {
    pub(crate) store: RwLock<model::Store>,
    pub(crate) events: broadcast::Sender<Arc<str>>,
}

pub(crate) type AppState = Arc<Shared>;

pub(crate) fn router(shared: AppState, guard: guard::Guard) -> Router {
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

pub(crate) fn json_response(status: StatusCode, body: JsonValue) -> Response {
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
pub(crate) fn follow(root: &Path, shared: &AppState) -> Result<(), crate::StudioError> {
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
