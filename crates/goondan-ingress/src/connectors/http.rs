//! What the HTTP connectors (`slack`, `webhook`, `github`, `discord`) share:
//! where they listen, how a request reaches their [`Endpoint`], and how an
//! accepted event is acknowledged.
//!
//! The order of a request is fixed here, so no connector can get it wrong:
//! path and method, body size, then the connector (signature first, then the
//! JSON), then — for the events it emits — `EventSink::accept`, and only
//! after the sink says they are stored (or were stored before) the 2xx. A
//! closed sink is a 503 with `Retry-After` and a storage failure a 500: the
//! sender keeps the event and retries.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, KeyInit, Mac};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use sha2::{Digest as _, Sha256};
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::connector::{ConnectorContext, ConnectorError, RunningConnector};
use crate::event::Delivery;
use crate::sink::{EventSink, SinkError};

/// The default largest request body (1 MiB).
pub(crate) const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;

/// How far a signed timestamp may be from now (Slack's five minutes).
pub(crate) const TIMESTAMP_TOLERANCE_SECS: i64 = 5 * 60;

/// How long a stop waits for open requests to finish.
const DRAIN: Duration = Duration::from_secs(5);

/// How long a client has to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request's body may take to arrive once its headers are in:
/// a sender that trickles a body holds no connection for longer.
const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// What a 503 tells the sender to wait, in seconds.
const RETRY_AFTER_SECS: &str = "5";

/// A connector's own config keys for where it listens (`PORT`, `HOST` and
/// `MAX_BODY_BYTES` are the shared fallbacks).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keys {
    /// The port, e.g. `SLACK_WEBHOOK_PORT`.
    pub port: &'static str,
    /// The path, e.g. `SLACK_WEBHOOK_PATH`.
    pub path: &'static str,
    /// The host, e.g. `SLACK_HOST`.
    pub host: &'static str,
    /// The body limit, e.g. `SLACK_MAX_BODY_BYTES`.
    pub max_body: &'static str,
}

/// Where and how an HTTP connector listens, read from its Connection's config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listen {
    /// The host to bind (a name or an address).
    pub host: String,
    /// The port (0: any free port).
    pub port: u16,
    /// The one path it answers, normalized (`/`, `/slack/events`).
    pub path: String,
    /// The largest body it reads.
    pub max_body_bytes: usize,
}

impl Listen {
    /// Reads `keys.port` (then `PORT`, then `default_port`), `keys.path`
    /// (default `/`), `keys.host` (then `HOST`, then 127.0.0.1) and
    /// `keys.max_body` (then `MAX_BODY_BYTES`, then 1 MiB).
    pub(crate) fn from_config(ctx: &ConnectorContext, keys: &Keys, default_port: u16) -> Result<Self, ConnectorError> {
        Self::from_values(&ctx.connection, &ctx.config, keys, default_port)
    }

    /// [`from_config`](Self::from_config) over a Connection's resolved config.
    pub(crate) fn from_values(
        connection: &str,
        config: &std::collections::BTreeMap<String, String>,
        keys: &Keys,
        default_port: u16,
    ) -> Result<Self, ConnectorError> {
        let value = |key: &str| config.get(key).map(String::as_str).filter(|v| !v.trim().is_empty());
        let first = |names: &[&'static str]| names.iter().find_map(|key| value(key).map(|v| (*key, v.to_owned())));
        let config_error = |key: &str, message: String| ConnectorError::Config {
            connection: connection.to_owned(),
            key: key.to_owned(),
            message,
        };
        let port = match first(&[keys.port, "PORT"]) {
            None => default_port,
            Some((key, value)) => value
                .trim()
                .parse::<u16>()
                .map_err(|_| config_error(key, format!("'{value}' is not a port (0 to 65535)")))?,
        };
        let path = normalize_path(value(keys.path).unwrap_or("/"));
        let host = first(&[keys.host, "HOST"])
            // `[::1]` as in a URL is the address `::1`.
            .map_or_else(
                || Ipv4Addr::LOCALHOST.to_string(),
                |(_, host)| host.trim().trim_start_matches('[').trim_end_matches(']').to_owned(),
            );
        let max_body_bytes = match first(&[keys.max_body, "MAX_BODY_BYTES"]) {
            None => DEFAULT_MAX_BODY_BYTES,
            Some((key, value)) => value
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|limit| *limit > 0)
                .ok_or_else(|| config_error(key, format!("'{value}' is not a positive number of bytes")))?,
        };
        Ok(Self { host, port, path, max_body_bytes })
    }

    /// `host:port` as a person writes it (`[::1]:8787` for IPv6).
    pub(crate) fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Whether only this machine can reach the host (a loopback address or
    /// `localhost`): an unsigned endpoint is tolerated only there.
    pub(crate) fn is_loopback(&self) -> bool {
        self.host.eq_ignore_ascii_case("localhost") || self.host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }
}

/// The original's webhook path rule: a leading `/`, no trailing `/`.
pub(crate) fn normalize_path(path: &str) -> String {
    let trimmed = path.trim();
    let with_slash = if trimmed.starts_with('/') { trimmed.to_owned() } else { format!("/{trimmed}") };
    let without_trailing = with_slash.trim_end_matches('/');
    if without_trailing.is_empty() { "/".to_owned() } else { without_trailing.to_owned() }
}

/// A request that reached a connector: right path, right method, body read.
#[derive(Debug)]
pub(crate) struct Incoming {
    /// The request's headers.
    pub headers: HeaderMap,
    /// The raw body, exactly as signed.
    pub body: Bytes,
}

impl Incoming {
    /// A header as text, if present, not empty and visible ASCII.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
    }
}

/// What a connector makes of a request.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Answer at once; nothing is emitted (a rejection, a challenge, a ping,
    /// an ignored event).
    Reply(Response),
    /// Store these events (each its own turn), then answer `ack`.
    Emit {
        /// The events, with their delivery keys.
        deliveries: Vec<Delivery>,
        /// The answer once they are stored.
        ack: Response,
    },
}

/// One HTTP connector's request handling.
pub(crate) trait Endpoint: Send + Sync + 'static {
    /// Turns a request into an answer or into events. No I/O: storing is the
    /// caller's, so that nothing is acknowledged before it is stored.
    fn handle(&self, request: &Incoming) -> Outcome;
}

/// An error answer: `{"error": {"code", "message"}}`.
pub(crate) fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = json!({"error": {"code": code, "message": message.into()}});
    (status, axum::Json(body)).into_response()
}

/// 401: the signature is missing or wrong. The reason goes to the log
/// (never the secret, never the signature itself); the sender learns only
/// that the request was not authenticated.
pub(crate) fn unauthorized(connection: &str, reason: &str) -> Outcome {
    tracing::warn!(connection, reason, "request rejected: not authenticated");
    Outcome::Reply(error(StatusCode::UNAUTHORIZED, "unauthorized", "the request signature is missing or invalid"))
}

/// 400: the body is not what the connector reads.
pub(crate) fn bad_request(message: impl Into<String>) -> Outcome {
    Outcome::Reply(error(StatusCode::BAD_REQUEST, "bad_request", message))
}

/// A JSON answer with status 200.
pub(crate) fn ok_json(body: serde_json::Value) -> Response {
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// A plain-text answer with status 200.
pub(crate) fn ok_text(text: impl Into<String>) -> Response {
    let mut response = Response::new(Body::from(text.into()));
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

/// Seconds since the epoch, now.
pub(crate) fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX))
}

/// Whether `timestamp` (decimal seconds) is within the tolerance of `now`.
pub(crate) fn timestamp_fresh(timestamp: &str, now: i64) -> bool {
    if timestamp.is_empty() || !timestamp.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    timestamp.parse::<i64>().is_ok_and(|ts| (now - ts).abs() <= TIMESTAMP_TOLERANCE_SECS)
}

/// Checks a hex HMAC-SHA256 of `parts` (concatenated) under `secret`, in
/// constant time.
pub(crate) fn hmac_sha256_matches(secret: &[u8], parts: &[&[u8]], signature_hex: &str) -> bool {
    let Ok(signature) = hex::decode(signature_hex) else {
        return false;
    };
    hmac_sha256_matches_any(secret, parts, std::iter::once(signature))
}

/// Whether any of `signatures` (raw bytes) is the HMAC-SHA256 of `parts`
/// (concatenated) under `key`. Each is compared in constant time, and every
/// one is compared: how many there are is the sender's, not a timing signal.
pub(crate) fn hmac_sha256_matches_any(
    key: &[u8],
    parts: &[&[u8]],
    signatures: impl IntoIterator<Item = Vec<u8>>,
) -> bool {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return false;
    };
    for part in parts {
        mac.update(part);
    }
    signatures.into_iter().fold(false, |found, signature| mac.clone().verify_slice(&signature).is_ok() | found)
}

/// The delivery key of a request whose signature covers its body and
/// nothing that tells one sending of it from another (`X-Hub-Signature-256`,
/// a body-only `X-Signature-256`): `body-sha256:<hex>`. Whatever delivery id
/// comes with such a request is the sender's word, not signed — anyone who
/// captured the request can change it — so the same signed body is the same
/// delivery, however it is labelled.
pub(crate) fn body_digest_key(body: &[u8]) -> String {
    format!("body-sha256:{}", hex::encode(Sha256::digest(body)))
}

/// Decodes standard base64 (RFC 4648 section 4; `=` padding optional,
/// nothing else: no whitespace, no URL alphabet, no stray bits past the
/// last byte). `None` for anything else.
pub(crate) fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    // Padding only as whole groups end it: strip it there, then decode
    // what must carry none.
    let unpadded = match text.len().is_multiple_of(4) {
        true => text.strip_suffix("==").or_else(|| text.strip_suffix('=')).unwrap_or(text),
        false => text,
    };
    base64::engine::general_purpose::STANDARD_NO_PAD.decode(unpadded).ok()
}

/// The hex HMAC-SHA256 of `parts` under `secret` (for tests and signing
/// examples).
#[cfg(test)]
pub(crate) fn hmac_sha256_hex(secret: &[u8], parts: &[&[u8]]) -> String {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return String::new();
    };
    for part in parts {
        mac.update(part);
    }
    hex::encode(mac.finalize().into_bytes())
}

/// Refuses an endpoint without a signing secret on an address other
/// machines can reach; on loopback it starts, with a warning.
pub(crate) fn allow_unsigned(ctx: &ConnectorContext, listen: &Listen, secret_key: &str) -> Result<(), ConnectorError> {
    if listen.is_loopback() {
        tracing::warn!(
            connection = %ctx.connection,
            address = %listen.address(),
            "no {secret_key} configured: unsigned requests are accepted (allowed on a loopback address only)"
        );
        Ok(())
    } else {
        Err(ctx.config_error(
            secret_key,
            format!("is required when listening on {} (a non-loopback address)", listen.address()),
        ))
    }
}

struct Shared<E> {
    connection: String,
    path: String,
    sink: Arc<dyn EventSink>,
    endpoint: E,
}

/// The listen queue asked for (the kernel caps it at `somaxconn`).
/// `TcpListener::bind`'s 1,024 overflowed under bursts of new connections
/// while the runtime was busy (the ingress load bench at 7,000 ev/s), and a
/// dropped SYN is sent again only 1 s later.
const LISTEN_BACKLOG: u32 = 4096;

/// Binds the first address `host` resolves to that can be bound, with
/// [`LISTEN_BACKLOG`] (and `SO_REUSEADDR`, as `TcpListener::bind`).
async fn bind(host: &str, port: u16) -> std::io::Result<TcpListener> {
    let mut last = None;
    for address in tokio::net::lookup_host((host, port)).await? {
        let socket = if address.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }?;
        socket.set_reuseaddr(true)?;
        match socket.bind(address).and_then(|()| socket.listen(LISTEN_BACKLOG)) {
            Ok(listener) => return Ok(listener),
            Err(error) => last = Some(error),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{host} resolves to no address"))
    }))
}

/// Binds `listen` and serves `endpoint` until `ctx.stop` is cancelled; the
/// port is bound when this returns.
pub(crate) async fn serve<E: Endpoint>(
    ctx: ConnectorContext,
    listen: Listen,
    endpoint: E,
) -> Result<RunningConnector, ConnectorError> {
    let listener = bind(&listen.host, listen.port).await.map_err(|source| ConnectorError::Bind {
        connection: ctx.connection.clone(),
        addr: listen.address(),
        source,
    })?;
    let local = listener.local_addr().map_err(|source| ConnectorError::Bind {
        connection: ctx.connection.clone(),
        addr: listen.address(),
        source,
    })?;
    let listening: Vec<SocketAddr> = vec![local];
    tracing::info!(
        connection = %ctx.connection,
        connector = %ctx.connector,
        address = %local,
        path = %listen.path,
        "listening"
    );
    let shared = Arc::new(Shared {
        connection: ctx.connection.clone(),
        path: listen.path.clone(),
        sink: Arc::clone(&ctx.sink),
        endpoint,
    });
    let router =
        Router::new().fallback(dispatch::<E>).with_state(shared).layer(DefaultBodyLimit::max(listen.max_body_bytes));
    let task = tokio::spawn(accept_loop(listener, router, ctx.stop.clone(), ctx.connection.clone()));
    Ok(RunningConnector { listening, task })
}

/// Accepts connections until `stop`, then lets open requests finish for at
/// most [`DRAIN`] and closes what is left. Nothing cut was acknowledged, so
/// its sender still has it. Each connection must send its request headers
/// within [`HEADER_TIMEOUT`], so slow clients cannot pile up.
async fn accept_loop(
    listener: TcpListener,
    router: Router,
    stop: CancellationToken,
    connection: String,
) -> Result<(), ConnectorError> {
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
            // Reap finished connections as we go, so the set stays small.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(err) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::warn!(connection = %connection, %err, "could not accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let service = TowerToHyperService::new(router.clone());
        let stop = stop.clone();
        connections.spawn(async move {
            let served = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            let mut served = std::pin::pin!(served);
            tokio::select! {
                result = served.as_mut() => return result,
                () = stop.cancelled() => served.as_mut().graceful_shutdown(),
            }
            served.await
        });
    }
    drop(listener);
    let drained = tokio::time::timeout(DRAIN, async {
        while let Some(joined) = connections.join_next().await {
            if let Ok(Err(err)) = joined {
                tracing::debug!(connection = %connection, %err, "a connection ended with an error");
            }
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(connection = %connection, open = connections.len(), "stopped; connections still open after {DRAIN:?} were closed");
        connections.shutdown().await;
    } else {
        tracing::info!(connection = %connection, "stopped");
    }
    Ok(())
}

async fn dispatch<E: Endpoint>(State(shared): State<Arc<Shared<E>>>, request: Request) -> Response {
    if normalize_path(request.uri().path()) != shared.path {
        return error(StatusCode::NOT_FOUND, "not_found", format!("this connector answers {} only", shared.path));
    }
    if request.method() != Method::POST {
        let mut response = error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "use POST");
        response.headers_mut().insert(axum::http::header::ALLOW, HeaderValue::from_static("POST"));
        return response;
    }
    let headers = request.headers().clone();
    let body = match tokio::time::timeout(BODY_TIMEOUT, Bytes::from_request(request, &())).await {
        Ok(Ok(body)) => body,
        Ok(Err(rejection)) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return error(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "the request body is too large");
        }
        Ok(Err(rejection)) => return error(StatusCode::BAD_REQUEST, "bad_request", rejection.body_text()),
        Err(_) => {
            return error(StatusCode::REQUEST_TIMEOUT, "request_timeout", "the request body did not arrive in time");
        }
    };
    let incoming = Incoming { headers, body };
    match shared.endpoint.handle(&incoming) {
        Outcome::Reply(response) => response,
        Outcome::Emit { deliveries, ack } => {
            store_then_ack(&shared.connection, shared.sink.as_ref(), deliveries, ack).await
        }
    }
}

async fn store_then_ack(connection: &str, sink: &dyn EventSink, deliveries: Vec<Delivery>, ack: Response) -> Response {
    if deliveries.is_empty() {
        return ack;
    }
    let count = deliveries.len();
    let accepted = if count == 1 {
        let mut deliveries = deliveries;
        match deliveries.pop() {
            Some(delivery) => sink.accept_one(delivery).await.map(|accepted| vec![accepted]),
            None => Ok(Vec::new()),
        }
    } else {
        sink.accept(deliveries).await
    };
    match accepted {
        Ok(accepted) => {
            tracing::debug!(connection, ?accepted, "stored");
            ack
        }
        Err(SinkError::Closed) => {
            let mut response =
                error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the service is stopping; retry later");
            response.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECS));
            response
        }
        Err(SinkError::Storage(message)) => {
            tracing::error!(connection, %message, "could not store an event; answered 500 so the sender retries");
            error(StatusCode::INTERNAL_SERVER_ERROR, "storage", "the event could not be stored; retry later")
        }
        Err(SinkError::Invalid(err)) => error(StatusCode::BAD_REQUEST, "invalid_event", err.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalized_as_the_original_does() {
        assert_eq!(normalize_path(""), "/");
        assert_eq!(normalize_path("/"), "/");
        assert_eq!(normalize_path("slack/events/"), "/slack/events");
        assert_eq!(normalize_path(" /hooks// "), "/hooks");
    }

    #[test]
    fn timestamps_outside_five_minutes_are_stale() {
        assert!(timestamp_fresh("1000", 1000 + 300));
        assert!(timestamp_fresh("1300", 1000));
        assert!(!timestamp_fresh("1000", 1000 + 301));
        assert!(!timestamp_fresh("-5", 0));
        assert!(!timestamp_fresh("12a", 12));
        assert!(!timestamp_fresh("", 0));
    }

    #[test]
    fn github_published_example_signature_matches() {
        // https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
        let secret = b"It's a Secret to Everybody";
        let expected = "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(hmac_sha256_hex(secret, &[b"Hello, World!"]), expected);
        assert!(hmac_sha256_matches(secret, &[b"Hello, ", b"World!"], expected));
        assert!(!hmac_sha256_matches(secret, &[b"Hello, World?"], expected));
        assert!(!hmac_sha256_matches(secret, &[b"Hello, World!"], "zz"));
        assert!(!hmac_sha256_matches(secret, &[b"Hello, World!"], &expected[..62]));
    }

    #[test]
    fn base64_decodes_rfc_4648_and_nothing_else() {
        // RFC 4648 section 10.
        let vectors: [(&str, &[u8]); 7] = [
            ("", b""),
            ("Zg==", b"f"),
            ("Zm8=", b"fo"),
            ("Zm9v", b"foo"),
            ("Zm9vYg==", b"foob"),
            ("Zm9vYmE=", b"fooba"),
            ("Zm9vYmFy", b"foobar"),
        ];
        for (encoded, plain) in vectors {
            assert_eq!(base64_decode(encoded).as_deref(), Some(plain), "{encoded}");
        }
        assert_eq!(base64_decode("Zg").as_deref(), Some(b"f".as_slice()), "padding is optional");
        assert_eq!(base64_decode("+/+/").as_deref(), Some([0xfb, 0xff, 0xbf].as_slice()));
        for bad in ["Z", "Zg=", "Zh==", "Zm9v\n", "Zm 9v", "-_-_", "Zm9v====", "=", "Zg==Zg=="] {
            assert_eq!(base64_decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn any_one_matching_signature_passes() {
        let key = b"k";
        let right = hex::decode(hmac_sha256_hex(key, &[b"a.b"])).unwrap_or_default();
        let wrong = vec![0u8; 32];
        assert!(hmac_sha256_matches_any(key, &[b"a", b".b"], [wrong.clone(), right.clone()]));
        assert!(hmac_sha256_matches_any(key, &[b"a.b"], [right.clone(), wrong.clone()]));
        assert!(!hmac_sha256_matches_any(key, &[b"a.b"], [wrong.clone(), right[..31].to_vec()]));
        assert!(!hmac_sha256_matches_any(key, &[b"a.b"], Vec::<Vec<u8>>::new()));
    }

    #[test]
    fn body_digest_keys_are_sha256_of_the_raw_body() {
        assert_eq!(
            body_digest_key(b""),
            "body-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_ne!(body_digest_key(b"{\"a\":1}"), body_digest_key(b"{\"a\": 1}"));
    }

    #[test]
    fn only_loopback_hosts_count_as_local() {
        let at = |host: &str| Listen { host: host.into(), port: 1, path: "/".into(), max_body_bytes: 1 };
        assert!(at("127.0.0.1").is_loopback());
        assert!(at("::1").is_loopback());
        assert!(at("localhost").is_loopback());
        assert!(!at("0.0.0.0").is_loopback());
        assert!(!at("10.1.2.3").is_loopback());
        assert_eq!(at("::1").address(), "[::1]:1");
    }
}
