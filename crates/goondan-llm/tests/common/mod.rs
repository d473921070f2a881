//! Local stand-ins for the model APIs, shared by every provider's tests: a
//! server answering canned replies in order and recording the requests, a
//! server that stalls in the middle of a stream, an address nobody listens
//! on, and the helpers to call a provider and collect what it streams.
//!
//! The integration tests include this as `mod common;`, the unit tests
//! (`src/*.rs`) as `crate::test_support`; not every one uses every piece.
#![allow(dead_code)]

use goondan_core::sync::LockUnpoisoned;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use goondan_core::{JsonObject, JsonValue};
use goondan_llm::http::RetryPolicy;
use goondan_llm::{ModelError, ModelProvider, ModelRequest, ModelResponse, StreamEvent};

/// One canned answer of a [`MockServer`].
#[derive(Debug, Clone)]
pub struct Canned {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
    /// How long to wait before answering (to test the wait for headers).
    pub delay: Duration,
    /// Headers sent besides `content-type`.
    pub headers: Vec<(&'static str, String)>,
}

impl Canned {
    /// `200 OK` with an event stream.
    pub fn sse(body: impl Into<String>) -> Self {
        Self {
            status: 200,
            content_type: "text/event-stream",
            body: body.into(),
            delay: Duration::ZERO,
            headers: Vec::new(),
        }
    }

    /// `status` with a JSON body (text or a value).
    pub fn json(status: u16, body: impl ToString) -> Self {
        Self {
            status,
            content_type: "application/json",
            body: body.to_string(),
            delay: Duration::ZERO,
            headers: Vec::new(),
        }
    }

    /// The same answer, sent after `delay`.
    pub fn after(self, delay: Duration) -> Self {
        Self { delay, ..self }
    }

    /// The same answer with the header `name: value` as well.
    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
}

/// A request a [`MockServer`] received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: String,
}

impl Recorded {
    /// The path of the request's URL.
    pub fn path(&self) -> &str {
        self.uri.path()
    }

    /// A header's value, or `""`.
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|value| value.to_str().ok()).unwrap_or("")
    }

    /// The body as JSON (a test failure if it is not).
    pub fn json(&self) -> JsonValue {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("the request body is not JSON ({e}): {}", self.body))
    }
}

#[derive(Debug)]
struct Mock {
    /// Answers in order; the last repeats.
    replies: Vec<Canned>,
    requests: Mutex<Vec<Recorded>>,
}

/// A local server answering every request with the next canned reply (the
/// last one again once they run out) and recording the requests.
#[derive(Debug, Clone)]
pub struct MockServer {
    base: String,
    mock: Arc<Mock>,
}

impl MockServer {
    /// Starts a server on 127.0.0.1.
    pub async fn start(replies: Vec<Canned>) -> Self {
        let mock = Arc::new(Mock { replies, requests: Mutex::new(Vec::new()) });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("bind: {e}"));
        let address = listener.local_addr().unwrap_or_else(|e| panic!("address: {e}"));
        let app = axum::Router::new().fallback(answer).with_state(Arc::clone(&mock));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { base: format!("http://{address}"), mock }
    }

    /// The server's URL with `path` (`""`, `"/v1"`) appended.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The requests so far, oldest first.
    pub fn requests(&self) -> Vec<Recorded> {
        self.mock.requests.lock_unpoisoned().clone()
    }
}

async fn answer(State(mock): State<Arc<Mock>>, method: Method, uri: Uri, headers: HeaderMap, body: String) -> Response {
    let index = {
        let mut requests = mock.requests.lock_unpoisoned();
        requests.push(Recorded { method, uri, headers, body });
        requests.len() - 1
    };
    let Some(reply) = mock.replies.get(index).or(mock.replies.last()).cloned() else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "no reply scripted").into_response();
    };
    tokio::time::sleep(reply.delay).await;
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, [(header::CONTENT_TYPE, reply.content_type)], reply.body).into_response();
    for (name, value) in reply.headers {
        if let Ok(value) = header::HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// A server that answers one request with the headers of an event stream
/// and `first` as the first chunk of its body, then stays silent; returns
/// its base URL.
pub async fn stalled_server(first: &'static str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("bind: {e}"));
    let address = listener.local_addr().unwrap_or_else(|e| panic!("address: {e}"));
    tokio::spawn(async move {
        let Ok((socket, _)) = listener.accept().await else { return };
        // Read the whole request first: answering early confuses the client.
        let mut request = Vec::new();
        let mut buffer = [0_u8; 65536];
        while !whole_request(&request) {
            if socket.readable().await.is_err() {
                return;
            }
            match socket.try_read(&mut buffer) {
                Ok(0) => return,
                Ok(n) => request.extend_from_slice(&buffer[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{first}\r\n",
            first.len()
        );
        let mut sent = 0;
        while sent < reply.len() {
            if socket.writable().await.is_err() {
                return;
            }
            match socket.try_write(&reply.as_bytes()[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(socket);
    });
    format!("http://{address}")
}

/// A server that answers one request with `status`, `content-type` and a
/// chunked body that starts with `head` and then never ends: `fill` bytes,
/// 64 KiB a chunk, until the client goes away. Returns its base URL.
pub async fn endless_server(status: u16, content_type: &'static str, head: &'static str, fill: u8) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("bind: {e}"));
    let address = listener.local_addr().unwrap_or_else(|e| panic!("address: {e}"));
    tokio::spawn(async move {
        let Ok((mut socket, _)) = listener.accept().await else { return };
        let mut request = Vec::new();
        let mut buffer = [0_u8; 65536];
        while !whole_request(&request) {
            match socket.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => request.extend_from_slice(&buffer[..n]),
            }
        }
        let start = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{head}\r\n",
            head.len()
        );
        if socket.write_all(start.as_bytes()).await.is_err() {
            return;
        }
        let mut chunk = format!("{:x}\r\n", 65536).into_bytes();
        chunk.extend(std::iter::repeat_n(fill, 65536));
        chunk.extend_from_slice(b"\r\n");
        // Ends when the client closes the connection.
        while socket.write_all(&chunk).await.is_ok() {}
    });
    format!("http://{address}")
}

/// True once `request` holds the headers and the `content-length` bytes after them.
fn whole_request(request: &[u8]) -> bool {
    let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") else { return false };
    let head = String::from_utf8_lossy(&request[..end]).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse::<usize>().ok())
        .unwrap_or(0);
    request.len() >= end + 4 + length
}

/// The base URL of a local port nobody listens on.
pub async fn closed_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("bind: {e}"));
    let address = listener.local_addr().unwrap_or_else(|e| panic!("address: {e}"));
    drop(listener);
    format!("http://{address}")
}

/// Retries that wait milliseconds, not seconds (still four attempts).
pub fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 4,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        ..RetryPolicy::default()
    }
}

/// Calls `provider`; returns the result and the events it streamed.
pub async fn complete(
    provider: &dyn ModelProvider,
    request: &ModelRequest,
) -> (Result<ModelResponse, ModelError>, Vec<StreamEvent>) {
    let events = Mutex::new(Vec::new());
    let sink = |event: StreamEvent| events.lock_unpoisoned().push(event);
    let result = provider.complete(request, &sink).await;
    (result, events.into_inner().unwrap_or_else(PoisonError::into_inner))
}

/// A JSON object literal as a map (empty for anything else).
pub fn object(value: JsonValue) -> JsonObject {
    value.as_object().cloned().unwrap_or_default()
}
