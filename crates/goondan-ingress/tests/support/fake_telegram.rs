//! A fake Telegram Bot API on 127.0.0.1, for tests of the `telegram-polling`
//! connector and of the `telegram__*` tools.
//!
//! Self-contained (axum, tokio, serde_json, std) so that other crates'
//! tests can include it with `#[path = ".../fake_telegram.rs"] mod
//! fake_telegram;`.
//!
//! - `/bot<token>/<method>`, parameters from the query string, a JSON body or
//!   a form body, as Telegram takes them. A wrong token gets Telegram's 401,
//!   an unknown method its 404.
//! - `getUpdates` has Telegram's offset semantics: asking with `offset`
//!   confirms (drops) every update below it; with `timeout` it waits up to
//!   that many seconds for a new update.
//! - `sendMessage`, `sendChatAction`, `setMessageReaction`,
//!   `editMessageText`, `deleteMessage`, `getMe`, `getFile` (and the file
//!   download `/file/bot<token>/<path>`), `deleteWebhook`, `getWebhookInfo`
//!   answer as Telegram does. Every authorized call is recorded.
//! - [`FakeTelegram::fail_next_get_updates`] makes the next `getUpdates`
//!   answer 429 (with `retry_after`), 409 or 500.
#![allow(dead_code)]

use goondan_core::sync::LockUnpoisoned;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use serde_json::{Map, Value, json};
use tokio::sync::Notify;

/// The fake bot's user id (`getMe`, the `from` of what it sends).
pub const BOT_ID: i64 = 7_000_000_001;
/// The fake bot's username.
pub const BOT_USERNAME: &str = "goondan_fake_bot";

/// A failure the next `getUpdates` answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// 429 Too Many Requests with `parameters.retry_after` and a
    /// `Retry-After` header.
    RateLimited {
        /// Seconds.
        retry_after: u64,
    },
    /// 409 Conflict, as when another poller runs or a webhook is set.
    Conflict,
    /// 500, whose description quotes the request path (token included), so
    /// a test sees whether a connector logs it unredacted.
    ServerError,
}

/// One recorded Bot API call.
#[derive(Debug, Clone)]
pub struct Call {
    /// The method, e.g. `sendMessage`.
    pub method: String,
    /// Its parameters (query, JSON or form; form and query values are strings).
    pub params: Map<String, Value>,
    /// When it arrived.
    pub at: Instant,
}

impl Call {
    /// A parameter as a string (numbers and booleans too).
    pub fn param(&self, key: &str) -> Option<String> {
        match self.params.get(key)? {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        }
    }

    /// A parameter as an integer.
    pub fn int(&self, key: &str) -> Option<i64> {
        self.param(key)?.parse().ok()
    }
}

#[derive(Debug)]
struct Inner {
    token: String,
    next_update_id: i64,
    /// Unconfirmed updates, in order.
    pending: Vec<Value>,
    calls: Vec<Call>,
    failures: VecDeque<Failure>,
    next_message_id: i64,
    polls_waiting: usize,
    unauthorized: usize,
}

#[derive(Debug)]
struct Shared {
    inner: Mutex<Inner>,
    changed: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock_unpoisoned()
    }
}

/// A running fake Bot API; stops when dropped.
#[derive(Debug)]
pub struct FakeTelegram {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeTelegram {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeTelegram {
    /// Starts on 127.0.0.1 (a free port) for the bot `token`.
    pub async fn start(token: &str) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                token: token.to_owned(),
                next_update_id: 100_000,
                pending: Vec::new(),
                calls: Vec::new(),
                failures: VecDeque::new(),
                next_message_id: 1,
                polls_waiting: 0,
                unauthorized: 0,
            }),
            changed: Notify::new(),
        });
        let app = Router::new()
            .route("/file/{bot}/{*path}", get(download))
            .route("/{bot}/{method}", any(method))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            // Ends only when the test drops the fake (the task is aborted).
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, shared, server })
    }

    /// `http://127.0.0.1:<port>`: the `TELEGRAM_API_BASE_URL` / `apiBaseUrl`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queues an update (its `update_id` is given if missing); returns the id.
    pub fn push_update(&self, mut update: Value) -> i64 {
        let id = {
            let mut inner = self.shared.lock();
            let id = match update.get("update_id").and_then(Value::as_i64) {
                Some(id) => id,
                None => inner.next_update_id,
            };
            inner.next_update_id = inner.next_update_id.max(id + 1);
            if let Some(object) = update.as_object_mut() {
                object.insert("update_id".to_owned(), json!(id));
            }
            inner.pending.push(update);
            id
        };
        self.shared.changed.notify_waiters();
        id
    }

    /// Queues a `message` update (with `message_id` and `date` if missing).
    pub fn push_message(&self, mut message: Value) -> i64 {
        if let Some(object) = message.as_object_mut() {
            let message_id = {
                let mut inner = self.shared.lock();
                let id = inner.next_message_id;
                inner.next_message_id += 1;
                id
            };
            object.entry("message_id").or_insert(json!(message_id));
            object.entry("date").or_insert(json!(unix_now()));
        }
        self.push_update(json!({"message": message}))
    }

    /// Queues a text message from user `chat_id` in its private chat.
    pub fn push_text(&self, chat_id: i64, text: &str) -> i64 {
        self.push_message(json!({
            "chat": {"id": chat_id, "type": "private", "first_name": "User"},
            "from": {"id": chat_id, "is_bot": false, "first_name": "User", "username": format!("user{chat_id}")},
            "text": text,
        }))
    }

    /// The ids of the updates not yet confirmed.
    pub fn pending_update_ids(&self) -> Vec<i64> {
        self.shared.lock().pending.iter().filter_map(|u| u.get("update_id").and_then(Value::as_i64)).collect()
    }

    /// Makes the next `getUpdates` answer `failure` (queued in order).
    pub fn fail_next_get_updates(&self, failure: Failure) {
        self.shared.lock().failures.push_back(failure);
    }

    /// Every authorized call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.shared.lock().calls.clone()
    }

    /// The calls of `method` so far.
    pub fn calls_to(&self, method: &str) -> Vec<Call> {
        self.shared.lock().calls.iter().filter(|c| c.method == method).cloned().collect()
    }

    /// Requests that used a wrong token (answered 401).
    pub fn unauthorized_requests(&self) -> usize {
        self.shared.lock().unauthorized
    }

    /// How many `getUpdates` are waiting for updates right now.
    pub fn polls_waiting(&self) -> usize {
        self.shared.lock().polls_waiting
    }

    /// Waits until `check` (on the fake's calls and pending updates) holds;
    /// `false` after `timeout`.
    async fn wait(&self, timeout: Duration, check: impl Fn(&Inner) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if check(&self.shared.lock()) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return check(&self.shared.lock());
            }
        }
    }

    /// The first call of `method` for which `matches` holds, waiting up to
    /// `timeout` for it.
    pub async fn wait_for_call(
        &self,
        method: &str,
        timeout: Duration,
        matches: impl Fn(&Call) -> bool,
    ) -> Option<Call> {
        let found = |inner: &Inner| inner.calls.iter().find(|c| c.method == method && matches(c)).cloned();
        if self.wait(timeout, |inner| found(inner).is_some()).await { found(&self.shared.lock()) } else { None }
    }

    /// Waits until `count` calls of `method` arrived; returns them.
    pub async fn wait_for_calls(&self, method: &str, count: usize, timeout: Duration) -> Option<Vec<Call>> {
        let enough = |inner: &Inner| inner.calls.iter().filter(|c| c.method == method).count() >= count;
        if self.wait(timeout, enough).await { Some(self.calls_to(method)) } else { None }
    }

    /// Waits until update `update_id` is confirmed (a `getUpdates` asked
    /// past it).
    pub async fn wait_until_confirmed(&self, update_id: i64, timeout: Duration) -> bool {
        self.wait(timeout, |inner| {
            !inner.pending.iter().any(|u| u.get("update_id").and_then(Value::as_i64) == Some(update_id))
        })
        .await
    }

    /// Waits until a `getUpdates` is waiting for updates (a long poll).
    pub async fn wait_for_long_poll(&self, timeout: Duration) -> bool {
        self.wait(timeout, |inner| inner.polls_waiting > 0).await
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn reply(status: StatusCode, body: Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

fn ok(result: Value) -> Response {
    reply(StatusCode::OK, json!({"ok": true, "result": result}))
}

fn error(status: StatusCode, description: &str) -> Response {
    reply(status, json!({"ok": false, "error_code": status.as_u16(), "description": description}))
}

/// `%XX` and `+` decoded.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let hex = |b: u8| char::from(b).to_digit(16).and_then(|d| u8::try_from(d).ok());
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(high), Some(low)) => {
                    out.push(high * 16 + low);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            byte => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn form_pairs(text: &str, into: &mut Map<String, Value>) {
    for pair in text.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        into.insert(percent_decode(key), Value::String(percent_decode(value)));
    }
}

/// The parameters of a call: the query string, then the body (JSON or form).
fn params(query: Option<&str>, headers: &HeaderMap, body: &[u8]) -> Result<Map<String, Value>, &'static str> {
    let mut params = Map::new();
    if let Some(query) = query {
        form_pairs(query, &mut params);
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(params);
    }
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if content_type.starts_with("application/x-www-form-urlencoded") {
        form_pairs(&String::from_utf8_lossy(body), &mut params);
        return Ok(params);
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => {
            params.extend(map);
            Ok(params)
        }
        _ => Err("Bad Request: can't parse JSON object"),
    }
}

/// A chat id as Telegram echoes it: a number when it is one.
fn chat_value(id: &str) -> Value {
    id.parse::<i64>().map_or_else(|_| json!(id), |n| json!(n))
}

fn bot_user() -> Value {
    json!({"id": BOT_ID, "is_bot": true, "first_name": "Goondan Fake", "username": BOT_USERNAME})
}

async fn download(State(shared): State<Arc<Shared>>, Path((bot, path)): Path<(String, String)>) -> Response {
    let token = shared.lock().token.clone();
    if bot.strip_prefix("bot") != Some(token.as_str()) {
        return error(StatusCode::UNAUTHORIZED, "Unauthorized");
    }
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/octet-stream")], format!("fake file {path}")).into_response()
}

async fn method(
    State(shared): State<Arc<Shared>>,
    Path((bot, method)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    {
        let mut inner = shared.lock();
        if bot.strip_prefix("bot") != Some(inner.token.as_str()) {
            inner.unauthorized += 1;
            return error(StatusCode::UNAUTHORIZED, "Unauthorized");
        }
    }
    let params = match params(query.as_deref(), &headers, &body) {
        Ok(params) => params,
        Err(description) => return error(StatusCode::BAD_REQUEST, description),
    };
    let call = Call { method: method.clone(), params, at: Instant::now() };
    shared.lock().calls.push(call.clone());
    shared.changed.notify_waiters();
    match method.as_str() {
        "getUpdates" => get_updates(&shared, &call, &bot).await,
        "sendMessage" => {
            let (Some(chat_id), Some(text)) = (call.param("chat_id"), call.param("text")) else {
                return error(StatusCode::BAD_REQUEST, "Bad Request: chat_id and text are required");
            };
            if text.trim().is_empty() {
                return error(StatusCode::BAD_REQUEST, "Bad Request: message text is empty");
            }
            let message_id = next_message_id(&shared);
            ok(json!({
                "message_id": message_id, "from": bot_user(), "date": unix_now(),
                "chat": {"id": chat_value(&chat_id), "type": "private"}, "text": text,
            }))
        }
        "editMessageText" => {
            let (Some(chat_id), Some(message_id), Some(text)) =
                (call.param("chat_id"), call.int("message_id"), call.param("text"))
            else {
                return error(StatusCode::BAD_REQUEST, "Bad Request: chat_id, message_id and text are required");
            };
            ok(json!({
                "message_id": message_id, "from": bot_user(), "date": unix_now(), "edit_date": unix_now(),
                "chat": {"id": chat_value(&chat_id), "type": "private"}, "text": text,
            }))
        }
        "sendChatAction" => match (call.param("chat_id"), call.param("action")) {
            (Some(_), Some(_)) => ok(json!(true)),
            _ => error(StatusCode::BAD_REQUEST, "Bad Request: chat_id and action are required"),
        },
        "setMessageReaction" | "deleteMessage" => match (call.param("chat_id"), call.int("message_id")) {
            (Some(_), Some(_)) => ok(json!(true)),
            _ => error(StatusCode::BAD_REQUEST, "Bad Request: chat_id and message_id are required"),
        },
        "getMe" => ok(bot_user()),
        "getFile" => match call.param("file_id") {
            Some(file_id) => ok(json!({
                "file_id": file_id, "file_unique_id": format!("u-{file_id}"), "file_size": 12,
                "file_path": format!("photos/{file_id}.jpg"),
            })),
            None => error(StatusCode::BAD_REQUEST, "Bad Request: file_id is required"),
        },
        "deleteWebhook" => ok(json!(true)),
        "getWebhookInfo" => ok(json!({"url": "", "has_custom_certificate": false, "pending_update_count": 0})),
        _ => error(StatusCode::NOT_FOUND, "Not Found"),
    }
}

fn next_message_id(shared: &Shared) -> i64 {
    let mut inner = shared.lock();
    let id = inner.next_message_id;
    inner.next_message_id += 1;
    id
}

async fn get_updates(shared: &Shared, call: &Call, bot: &str) -> Response {
    let failure = shared.lock().failures.pop_front();
    match failure {
        Some(Failure::RateLimited { retry_after }) => {
            let body = json!({
                "ok": false, "error_code": 429,
                "description": format!("Too Many Requests: retry after {retry_after}"),
                "parameters": {"retry_after": retry_after},
            });
            let mut response = reply(StatusCode::TOO_MANY_REQUESTS, body);
            if let Ok(value) = retry_after.to_string().parse() {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            return response;
        }
        Some(Failure::Conflict) => {
            return error(
                StatusCode::CONFLICT,
                "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
            );
        }
        Some(Failure::ServerError) => {
            return error(StatusCode::INTERNAL_SERVER_ERROR, &format!("Internal Server Error at /{bot}/getUpdates"));
        }
        None => {}
    }
    let offset = call.int("offset").unwrap_or(0);
    let limit = call.int("limit").filter(|l| (1..=100).contains(l)).unwrap_or(100) as usize;
    let timeout = call.int("timeout").unwrap_or(0).clamp(0, 50) as u64;
    {
        let mut inner = shared.lock();
        if offset > 0 {
            inner.pending.retain(|u| u.get("update_id").and_then(Value::as_i64).is_some_and(|id| id >= offset));
        } else if offset < 0 {
            // Telegram: the last -offset updates; everything before is forgotten.
            let keep = usize::try_from(offset.unsigned_abs()).unwrap_or(usize::MAX);
            let drop = inner.pending.len().saturating_sub(keep);
            inner.pending.drain(..drop);
        }
    }
    shared.changed.notify_waiters();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    // Counts this long poll as waiting until it answers or its client goes
    // away (axum then drops this future, and the guard with it).
    let mut waiting: Option<WaitingGuard<'_>> = None;
    let updates = loop {
        let notified = shared.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let updates: Vec<Value> = shared.lock().pending.iter().take(limit).cloned().collect();
        if !updates.is_empty() || tokio::time::Instant::now() >= deadline {
            break updates;
        }
        if waiting.is_none() {
            waiting = Some(WaitingGuard::new(shared));
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            break shared.lock().pending.iter().take(limit).cloned().collect();
        }
    };
    drop(waiting);
    ok(Value::Array(updates))
}

/// Counts a `getUpdates` waiting for updates while it lives.
struct WaitingGuard<'a> {
    shared: &'a Shared,
}

impl<'a> WaitingGuard<'a> {
    fn new(shared: &'a Shared) -> Self {
        shared.lock().polls_waiting += 1;
        shared.changed.notify_waiters();
        Self { shared }
    }
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.shared.lock().polls_waiting -= 1;
        self.shared.changed.notify_waiters();
    }
}
