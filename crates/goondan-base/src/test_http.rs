//! Local HTTP servers on 127.0.0.1 for the tests of the tools that speak
//! HTTP (`http-fetch`, `telegram`, `slack`): a recording server with scripted
//! answers, an axum router server, raw servers that stream endless bodies,
//! and a port nobody listens on.

use goondan_core::sync::LockUnpoisoned;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use goondan_core::JsonValue;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::BaseSettings;

/// One request as the server received it.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    pub(crate) method: String,
    /// Path and query.
    pub(crate) target: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Recorded {
    /// The value of header `name` (lower case), if sent once or more.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }

    /// The body as JSON (null if it is not).
    pub(crate) fn json(&self) -> JsonValue {
        serde_json::from_slice(&self.body).unwrap_or(JsonValue::Null)
    }
}

/// What the server answers.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(&'static str, String)>,
    pub(crate) body: Vec<u8>,
}

/// A 200 JSON answer.
pub(crate) fn json_answer(value: JsonValue) -> Answer {
    status_json_answer(200, value)
}

/// A JSON answer with `status`.
pub(crate) fn status_json_answer(status: u16, value: JsonValue) -> Answer {
    Answer {
        status,
        headers: vec![("content-type", "application/json".to_owned())],
        body: value.to_string().into_bytes(),
    }
}

type Responder = dyn Fn(&Recorded) -> Answer + Send + Sync;

/// A listener on a free port of 127.0.0.1, and its address.
pub(crate) async fn listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("bind 127.0.0.1:0: {e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("local_addr: {e}"));
    (listener, addr)
}

/// Serves `router` on `listener` until the task is aborted.
fn spawn_router(listener: TcpListener, router: Router) -> JoinHandle<()> {
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    })
}

/// Serves `router` on 127.0.0.1 (for the rest of the test) and returns its address.
pub(crate) async fn serve(router: Router) -> SocketAddr {
    let (listener, addr) = listener().await;
    spawn_router(listener, router);
    addr
}

/// The base URL of a 127.0.0.1 port nobody listens on.
pub(crate) async fn closed_base() -> String {
    let (listener, addr) = listener().await;
    drop(listener);
    format!("http://{addr}")
}

/// A recording server on 127.0.0.1; stops when dropped.
pub(crate) struct TestServer {
    /// `http://127.0.0.1:<port>`.
    pub(crate) base: String,
    requests: Arc<Mutex<Vec<Recorded>>>,
    task: JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    /// Starts a server answering every request with `respond`.
    pub(crate) async fn start(respond: impl Fn(&Recorded) -> Answer + Send + Sync + 'static) -> Self {
        let requests: Arc<Mutex<Vec<Recorded>>> = Arc::default();
        let respond: Arc<Responder> = Arc::new(respond);
        let log = Arc::clone(&requests);
        let app = Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let log = Arc::clone(&log);
            let respond = Arc::clone(&respond);
            async move {
                let recorded = Recorded {
                    method: method.to_string(),
                    target: uri.path_and_query().map_or_else(|| uri.path().to_owned(), ToString::to_string),
                    headers: headers
                        .iter()
                        .map(|(name, value)| {
                            (name.as_str().to_owned(), String::from_utf8_lossy(value.as_bytes()).into_owned())
                        })
                        .collect(),
                    body: body.to_vec(),
                };
                let answer = respond(&recorded);
                log.lock_unpoisoned().push(recorded);
                let mut response: Response = answer.body.into_response();
                *response.status_mut() = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::OK);
                // Only the answer's own headers: no default content type.
                response.headers_mut().remove(axum::http::header::CONTENT_TYPE);
                for (name, value) in answer.headers {
                    if let Ok(value) = value.parse() {
                        response.headers_mut().insert(name, value);
                    }
                }
                response
            }
        });
        let (listener, address) = listener().await;
        let task = spawn_router(listener, app);
        Self { base: format!("http://{address}"), requests, task }
    }

    /// The requests received so far.
    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.requests.lock_unpoisoned().clone()
    }

    /// The only request received.
    pub(crate) fn single(&self) -> Recorded {
        let mut requests = self.requests();
        assert_eq!(requests.len(), 1, "expected exactly one request, got {requests:?}");
        requests.remove(0)
    }
}

/// Reads one request: its head, and as much body as its `content-length`
/// announces. `None` if the client went away first.
async fn read_request(socket: &mut TcpStream) -> Option<Vec<u8>> {
    let mut request = Vec::new();
    let mut buf = [0_u8; 4096];
    let head_end = loop {
        if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&request[..head_end]).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse::<usize>().ok())
        .unwrap_or(0);
    while request.len() < head_end + length {
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    Some(request)
}

/// Writes `head`, then up to `total` bytes of `x` in 64 KiB pieces (as
/// chunked frames when `chunked`). Returns how many body bytes were written
/// before the client went away.
async fn stream_body(socket: &mut TcpStream, head: &str, total: usize, chunked: bool) -> usize {
    if socket.write_all(head.as_bytes()).await.is_err() {
        return 0;
    }
    let chunk = vec![b'x'; 64 * 1024];
    let frame = if chunked {
        let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
        frame.extend_from_slice(&chunk);
        frame.extend_from_slice(b"\r\n");
        frame
    } else {
        chunk.clone()
    };
    let mut sent = 0;
    while sent < total {
        if socket.write_all(&frame).await.is_err() {
            break;
        }
        sent += chunk.len();
    }
    sent
}

/// A server that answers POST requests with `api_reply` (when given) and
/// every other request with an endless chunked body (no content-length,
/// 100 MB at most in case the client never stops), until the client goes away.
pub(crate) async fn endless_server(api_reply: Option<JsonValue>) -> (String, JoinHandle<()>) {
    let (listener, address) = listener().await;
    let task = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let api_reply = api_reply.clone();
            tokio::spawn(async move {
                let Some(request) = read_request(&mut socket).await else { return };
                if let Some(reply) = api_reply.filter(|_| request.starts_with(b"POST")) {
                    let body = reply.to_string();
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(answer.as_bytes()).await;
                    return;
                }
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
                stream_body(&mut socket, head, 100 * 1024 * 1024, true).await;
            });
        }
    });
    (format!("http://{address}"), task)
}

/// Accepts one connection, reads the request, writes `head` and then up to
/// `total` bytes of body, and holds the connection open for `hold`; reports
/// how many body bytes it managed to write before the client went away.
pub(crate) async fn streaming_server(
    head: &'static str,
    total: usize,
    hold: Duration,
) -> (SocketAddr, tokio::sync::oneshot::Receiver<usize>) {
    let (listener, addr) = listener().await;
    let (report, written) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let Ok((mut socket, _)) = listener.accept().await else { return };
        if read_request(&mut socket).await.is_none() {
            return;
        }
        let _ = report.send(stream_body(&mut socket, head, total, false).await);
        tokio::time::sleep(hold).await;
    });
    (addr, written)
}

/// Settings with these environment values.
pub(crate) fn settings_with(env: &[(&str, &str)]) -> Arc<BaseSettings> {
    let env: BTreeMap<String, String> = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    Arc::new(BaseSettings { env, ..BaseSettings::default() })
}

/// `settings` with loopback on the SSRF allow-list (`GOONDAN_HTTP_ALLOW=127.0.0.1`),
/// so a model-chosen URL may point at a test server.
pub(crate) fn allowing_loopback(settings: &Arc<BaseSettings>) -> Arc<BaseSettings> {
    Arc::new(BaseSettings { http_allow: vec!["127.0.0.1".to_owned()], ..(**settings).clone() })
}
