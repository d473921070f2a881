//! The studio: a read-only web page over a state root's durable logs — the
//! instances of each project, the agent graph, the flow of messages,
//! handoffs and tool calls, and one trace's spans — served by axum with its
//! assets built into the binary. `gdn studio` parses its arguments, binds
//! the listener and prints; this crate is what it serves.
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
//!
//! Entry points: [`Studio::open`], then [`Studio::serve`].

mod api;
mod guard;
mod model;
mod server;

use std::future::Future;
use std::path::Path;
use std::sync::{Arc, RwLock};

use tokio::sync::broadcast;

/// Why the studio could not start following the state root.
#[derive(Debug, thiserror::Error)]
pub enum StudioError {
    /// The file watcher could not be made.
    #[error(transparent)]
    Watch(#[from] notify::Error),
    /// The thread that follows the state root could not be started.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A studio over one state root, following it, not yet answering requests.
pub struct Studio {
    shared: server::AppState,
    guard: guard::Guard,
}

impl Studio {
    /// Reads the state root `root` (only the workspace `only`, if given)
    /// and starts the thread that follows it. `port` is the port the
    /// listener is bound to, `host` the host it was asked to listen on
    /// (both name the studio to the guard), `token` the one every request
    /// must carry, if any.
    pub fn open(
        root: &Path,
        only: Option<String>,
        port: u16,
        host: &str,
        token: Option<String>,
    ) -> Result<Self, StudioError> {
        let store = model::Store::open(root, only);
        let (events, _) = broadcast::channel(1024);
        let shared = Arc::new(server::Shared { store: RwLock::new(store), events });
        server::follow(root, &shared)?;
        Ok(Self { shared, guard: guard::Guard::new(port, host, token) })
    }

    /// The query that opens the page with the token (`token=…`), if any.
    pub fn token_query(&self) -> Option<String> {
        self.guard.token_query()
    }

    /// Answers requests on `listener` until `shutdown` completes.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(listener, server::router(self.shared, self.guard)).with_graceful_shutdown(shutdown).await
    }
}
