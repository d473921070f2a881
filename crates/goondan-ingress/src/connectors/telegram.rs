//! The `telegram-polling` connector: Bot API `getUpdates` long polling.
//!
//! Persist before acknowledging: Telegram counts an update as confirmed once
//! a `getUpdates` asks for an `offset` past it, so the offset advances only
//! after the sink has stored the whole answer. A sink error retries the same
//! batch; a stop before that leaves the updates unconfirmed and Telegram sends
//! them again on the next start, where the inbox reports them as duplicates
//! (the delivery key is the `update_id`).
//!
//! The token is part of every Bot API URL, and HTTP client errors quote
//! URLs: errors are logged without their URL and every message is scrubbed of
//! the token before it is logged.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBackoff, ExponentialBuilder};
use goondan_core::JsonValue;
use goondan_core::tls::SystemProxy;
use tokio_util::sync::CancellationToken;

use crate::connector::{ConnectorContext, ConnectorError, RunningConnector, StartFuture};
use crate::event::{ConnectorEvent, Delivery, EventMessage};
use crate::sink::{Accepted, EventSink, SinkError};

/// The Connector's name.
pub const NAME: &str = "telegram-polling";
/// The event it emits.
pub const EVENT: &str = "telegram_message";
/// The secrets the token is read from, in this order (the original's).
pub const TOKEN_SECRETS: [&str; 3] = ["TELEGRAM_BOT_TOKEN", "BOT_TOKEN", "TELEGRAM_TOKEN"];

const DEFAULT_API_BASE_URL: &str = "https://api.telegram.org";
const DEFAULT_POLL_TIMEOUT_SECONDS: u64 = 30;
const DEFAULT_RETRY_DELAY_MS: u64 = 1_000;
/// A zero delay would turn a failing server into a busy loop.
const MIN_RETRY_DELAY_MS: u64 = 10;
/// Backoff grows to this (plus jitter) unless the configured delay is longer.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// A refused token is retried this rarely (unless the retry delay is longer).
const BAD_TOKEN_RETRY: Duration = Duration::from_secs(60);
/// The largest `getUpdates` answer read (100 updates are far smaller).
const MAX_REPLY_BYTES: usize = 16 * 1024 * 1024;
const REDACTED: &str = "<redacted>";

/// Starts polling for the Connection of `ctx`.
pub fn start(ctx: ConnectorContext) -> StartFuture {
    Box::pin(async move {
        let settings = Settings::from_context(&ctx)?;
        let client = http_client().map_err(|error| ctx.failed(format!("cannot set up HTTPS: {error}")))?;
        tracing::info!(
            connection = %ctx.connection,
            api = %settings.api_base_url,
            timeout_seconds = settings.poll_timeout_seconds,
            "telegram-polling: polling getUpdates"
        );
        if settings.request_timeout <= Duration::from_secs(settings.poll_timeout_seconds) {
            tracing::warn!(
                connection = %ctx.connection,
                "telegram-polling: TELEGRAM_REQUEST_TIMEOUT_MS is not longer than TELEGRAM_POLL_TIMEOUT_SECONDS: \
                 long polls will time out before Telegram answers them"
            );
        }
        let poller = Poller { settings, client, sink: ctx.sink.clone(), connection: ctx.connection.clone() };
        let stop = ctx.stop.clone();
        let task = tokio::spawn(async move {
            poller.run(stop).await;
            Ok(())
        });
        Ok(RunningConnector { listening: Vec::new(), task })
    })
}

/// The Bot API's client ([`goondan_core::tls`], through the environment's proxy).
fn http_client() -> Result<reqwest::Client, String> {
    goondan_core::tls::client_builder(SystemProxy::Honoured)
        .map_err(|error| error.to_string())?
        .build()
        .map_err(|error| error.without_url().to_string())
}

/// The connector's settings, from the Connection's config (then secrets, as
/// the original reads them).
#[derive(Clone, PartialEq, Eq)]
struct Settings {
    token: String,
    api_base_url: String,
    poll_timeout_seconds: u64,
    request_timeout: Duration,
    retry_delay: Duration,
    initial_offset: i64,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("token", &REDACTED)
            .field("api_base_url", &self.api_base_url)
            .field("poll_timeout_seconds", &self.poll_timeout_seconds)
            .field("request_timeout", &self.request_timeout)
            .field("retry_delay", &self.retry_delay)
            .field("initial_offset", &self.initial_offset)
            .finish()
    }
}

impl Settings {
    fn from_context(ctx: &ConnectorContext) -> Result<Self, ConnectorError> {
        let Some(token) = TOKEN_SECRETS.iter().find_map(|name| ctx.secrets.get(name)) else {
            let in_config = TOKEN_SECRETS.iter().find(|name| ctx.config_value(name).is_some());
            let message = match in_config {
                // Config is not secret (it is shown, logged, printed by
                // `Debug`); the original does not read the token from it either.
                Some(name) => format!(
                    "the bot token belongs in the Connection's secrets, not its config: move '{name}' to spec.secrets"
                ),
                None => "missing bot token in secrets (TELEGRAM_BOT_TOKEN/BOT_TOKEN/TELEGRAM_TOKEN)".to_owned(),
            };
            return Err(ctx.config_error(TOKEN_SECRETS[0], message));
        };
        let token = token.trim().to_owned();
        if token.chars().any(|c| c.is_whitespace() || c == '/' || c == '?' || c == '#') {
            return Err(ctx.config_error(TOKEN_SECRETS[0], "the bot token has characters a Bot API token never has"));
        }
        // The original reads every other key from config, then secrets.
        let value = |key: &str| ctx.config_value(key).or_else(|| ctx.secrets.get(key)).map(str::trim);
        let integer = |key: &str| -> Result<Option<i64>, ConnectorError> {
            value(key)
                .map(|raw| raw.parse::<i64>().map_err(|_| ctx.config_error(key, format!("'{raw}' is not an integer"))))
                .transpose()
        };
        let non_negative = |key: &str| -> Result<Option<u64>, ConnectorError> {
            integer(key)?
                .map(|n| u64::try_from(n).map_err(|_| ctx.config_error(key, "must not be negative")))
                .transpose()
        };

        let api_base_url = match value("TELEGRAM_API_BASE_URL") {
            Some(raw) => {
                let trimmed = raw.trim_end_matches('/');
                if !(trimmed.starts_with("https://") || trimmed.starts_with("http://")) || trimmed.contains('?') {
                    return Err(ctx.config_error("TELEGRAM_API_BASE_URL", "must be an http:// or https:// URL"));
                }
                trimmed.to_owned()
            }
            None => DEFAULT_API_BASE_URL.to_owned(),
        };
        let poll_timeout_seconds =
            non_negative("TELEGRAM_POLL_TIMEOUT_SECONDS")?.unwrap_or(DEFAULT_POLL_TIMEOUT_SECONDS);
        let request_timeout = match non_negative("TELEGRAM_REQUEST_TIMEOUT_MS")? {
            Some(ms) => Duration::from_millis(ms.max(1)),
            None => Duration::from_secs(poll_timeout_seconds.saturating_add(5)),
        };
        let retry_delay = Duration::from_millis(
            non_negative("TELEGRAM_RETRY_DELAY_MS")?.unwrap_or(DEFAULT_RETRY_DELAY_MS).max(MIN_RETRY_DELAY_MS),
        );
        let initial_offset = integer("TELEGRAM_INITIAL_OFFSET")?.unwrap_or(0);
        Ok(Self { token, api_base_url, poll_timeout_seconds, request_timeout, retry_delay, initial_offset })
    }

    fn redact(&self, text: &str) -> String {
        if self.token.is_empty() { text.to_owned() } else { text.replace(&self.token, REDACTED) }
    }

    fn backoff(&self) -> ExponentialBackoff {
        ExponentialBuilder::new()
            .with_min_delay(self.retry_delay)
            .with_max_delay(self.retry_delay.max(MAX_BACKOFF))
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build()
    }
}

/// One `getUpdates` answer, read.
#[derive(Debug)]
enum Reply {
    /// `{ok: true, result: [...]}`.
    Updates(Vec<JsonValue>),
    /// Anything else, with what Telegram said.
    Failed(Failure),
}

#[derive(Debug)]
struct Failure {
    status: u16,
    error_code: Option<i64>,
    description: Option<String>,
    /// `parameters.retry_after`, else the `Retry-After` header.
    retry_after: Option<Duration>,
}

impl Failure {
    fn code(&self) -> i64 {
        match self.error_code {
            Some(code) => code,
            None => i64::from(self.status),
        }
    }

    fn describe(&self) -> String {
        match &self.description {
            Some(description) => format!("HTTP {}: {description}", self.status),
            None => format!("HTTP {}", self.status),
        }
    }
}

struct Poller {
    settings: Settings,
    client: reqwest::Client,
    sink: Arc<dyn EventSink>,
    connection: String,
}

impl Poller {
    async fn run(&self, stop: CancellationToken) {
        let mut offset = self.settings.initial_offset;
        let mut backoff = self.settings.backoff();
        loop {
            if stop.is_cancelled() {
                return;
            }
            let reply = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                reply = self.get_updates(offset) => reply,
            };
            let delay = match reply {
                Ok(Reply::Updates(updates)) => {
                    backoff = self.settings.backoff();
                    match self.store(&updates, offset, &stop).await {
                        Some(next) => {
                            offset = next;
                            continue;
                        }
                        None => return,
                    }
                }
                Ok(Reply::Failed(failure)) => self.failure_delay(&failure, &mut backoff),
                Err(message) => {
                    let delay = next_delay(&mut backoff, self.settings.retry_delay);
                    tracing::warn!(
                        connection = %self.connection,
                        retry_in_ms = delay.as_millis(),
                        "telegram-polling: getUpdates request failed: {message}"
                    );
                    delay
                }
            };
            if !pause(delay, &stop).await {
                return;
            }
        }
    }

    /// How long to wait after a failed `getUpdates`, logging why.
    fn failure_delay(&self, failure: &Failure, backoff: &mut ExponentialBackoff) -> Duration {
        let what = self.settings.redact(&failure.describe());
        let connection = &self.connection;
        match failure.code() {
            429 => {
                let delay = failure
                    .retry_after
                    .map(|after| after.max(Duration::from_millis(MIN_RETRY_DELAY_MS)))
                    .unwrap_or_else(|| next_delay(backoff, self.settings.retry_delay));
                tracing::warn!(
                    connection = %connection,
                    retry_in_ms = delay.as_millis(),
                    "telegram-polling: rate limited by Telegram ({what}); retrying when it allows"
                );
                delay
            }
            409 => {
                let delay = next_delay(backoff, self.settings.retry_delay);
                tracing::warn!(
                    connection = %connection,
                    retry_in_ms = delay.as_millis(),
                    "telegram-polling: getUpdates conflict ({what}): another process is polling this bot, or a webhook \
                     is set for it (deleteWebhook removes it); only one poller per bot receives updates"
                );
                delay
            }
            401 | 404 => {
                // A refused token stays refused until the operator changes
                // it; retrying slowly keeps the other Connections serving and
                // picks up a Telegram outage that answered wrongly.
                let delay = BAD_TOKEN_RETRY.max(self.settings.retry_delay);
                tracing::error!(
                    connection = %connection,
                    retry_in_ms = delay.as_millis(),
                    "telegram-polling: Telegram refused the bot token ({what}); check the Connection's \
                     TELEGRAM_BOT_TOKEN secret and TELEGRAM_API_BASE_URL"
                );
                delay
            }
            _ => {
                let delay = next_delay(backoff, self.settings.retry_delay);
                tracing::warn!(
                    connection = %connection,
                    retry_in_ms = delay.as_millis(),
                    "telegram-polling: getUpdates failed: {what}"
                );
                delay
            }
        }
    }

    /// One `getUpdates`; `Err` (scrubbed of the token) when no answer came.
    async fn get_updates(&self, offset: i64) -> Result<Reply, String> {
        let settings = &self.settings;
        let mut url = format!(
            "{}/bot{}/getUpdates?timeout={}",
            settings.api_base_url, settings.token, settings.poll_timeout_seconds
        );
        if offset > 0 {
            url.push_str(&format!("&offset={offset}"));
        }
        let request_failed = |error: reqwest::Error| self.settings.redact(&error_chain(error));
        let mut response =
            self.client.get(url).timeout(settings.request_timeout).send().await.map_err(request_failed)?;
        let status = response.status().as_u16();
        let header_retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(request_failed)? {
            if body.len() + chunk.len() > MAX_REPLY_BYTES {
                return Err(format!("the reply is larger than {MAX_REPLY_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(read_reply(status, header_retry_after, &body))
    }

    /// Stores the events of one answer; returns the offset that confirms
    /// it, or `None` when the service stops first (nothing is confirmed).
    async fn store(&self, updates: &[JsonValue], offset: i64, stop: &CancellationToken) -> Option<i64> {
        let mut next = offset;
        let mut deliveries = Vec::new();
        for raw in updates {
            let Some(update_id) = raw.get("update_id").and_then(integer) else {
                continue;
            };
            next = next.max(update_id.saturating_add(1));
            match to_event(raw) {
                Some(event) => deliveries.push(Delivery::keyed(update_id.to_string(), event)),
                None => tracing::debug!(connection = %self.connection, update_id, "telegram-polling: update ignored"),
            }
        }
        if deliveries.is_empty() {
            return Some(next);
        }
        let mut backoff = self.settings.backoff();
        loop {
            match self.sink.accept(deliveries.clone()).await {
                Ok(accepted) => {
                    for (delivery, accepted) in deliveries.iter().zip(accepted) {
                        if accepted == Accepted::Duplicate {
                            tracing::info!(
                                connection = %self.connection,
                                update_id = delivery.key.as_deref().unwrap_or_default(),
                                "telegram-polling: update already stored (a redelivery); confirming it"
                            );
                        }
                    }
                    return Some(next);
                }
                Err(SinkError::Closed) => {
                    tracing::info!(
                        connection = %self.connection,
                        "telegram-polling: the inbox is closed; {} update(s) stay unconfirmed for the next start",
                        deliveries.len()
                    );
                    return None;
                }
                Err(error) => {
                    let delay = next_delay(&mut backoff, self.settings.retry_delay);
                    tracing::warn!(
                        connection = %self.connection,
                        retry_in_ms = delay.as_millis(),
                        "telegram-polling: could not store {} update(s), not confirming them: {error}",
                        deliveries.len()
                    );
                    if !pause(delay, stop).await {
                        return None;
                    }
                }
            }
        }
    }
}

fn next_delay(backoff: &mut ExponentialBackoff, fallback: Duration) -> Duration {
    backoff.next().unwrap_or(fallback)
}

/// Waits `delay`; `false` when the stop signal came first.
async fn pause(delay: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        biased;
        () = stop.cancelled() => false,
        () = tokio::time::sleep(delay) => true,
    }
}

/// An error and its causes, without the URL (which holds the token).
fn error_chain(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut message = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

fn read_reply(status: u16, header_retry_after: Option<Duration>, body: &[u8]) -> Reply {
    let parsed: Option<JsonValue> = serde_json::from_slice(body).ok();
    let object = parsed.as_ref().and_then(JsonValue::as_object);
    let ok = object.and_then(|o| o.get("ok")).and_then(JsonValue::as_bool) == Some(true);
    if (200..300).contains(&status) && ok {
        return match object.and_then(|o| o.get("result")) {
            Some(JsonValue::Array(updates)) => Reply::Updates(updates.clone()),
            _ => Reply::Failed(Failure {
                status,
                error_code: None,
                description: Some("getUpdates returned a non-array result".to_owned()),
                retry_after: None,
            }),
        };
    }
    let description = match object {
        Some(o) => o.get("description").and_then(non_empty).map(str::to_owned),
        None => Some("Invalid Telegram API response payload".to_owned()),
    };
    let retry_after = object
        .and_then(|o| o.get("parameters"))
        .and_then(|p| p.get("retry_after"))
        .and_then(integer)
        .and_then(|s| u64::try_from(s).ok())
        .map(Duration::from_secs)
        .or(header_retry_after);
    Reply::Failed(Failure {
        status,
        error_code: object.and_then(|o| o.get("error_code")).and_then(integer),
        description,
        retry_after,
    })
}

/// A whole number (JavaScript's `Number.isInteger`: `5.0` is one).
fn integer(value: &JsonValue) -> Option<i64> {
    value
        .as_i64()
        .or_else(|| value.as_f64().filter(|f| f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e15).map(|f| f as i64))
}

fn non_empty(value: &JsonValue) -> Option<&str> {
    value.as_str().filter(|s| !s.is_empty())
}

/// A chat or user id: a non-empty string, or a number (truncated).
fn identifier(value: &JsonValue) -> Option<String> {
    match value {
        JsonValue::String(s) if !s.is_empty() => Some(s.clone()),
        JsonValue::Number(n) => match n.as_i64() {
            Some(i) => Some(i.to_string()),
            None => n.as_f64().filter(|f| f.is_finite()).map(|f| format!("{}", f.trunc())),
        },
        _ => None,
    }
}

struct Photo<'a> {
    file_id: &'a str,
    file_unique_id: Option<&'a str>,
    width: Option<i64>,
    height: Option<i64>,
    file_size: Option<i64>,
}

impl Photo<'_> {
    /// The original picks the largest size by `file_size`, else by area.
    fn size(&self) -> i64 {
        self.file_size.unwrap_or_else(|| self.width.unwrap_or(0).saturating_mul(self.height.unwrap_or(0)))
    }
}

/// The largest of `message.photo` (ties: the later one, as the original).
fn largest_photo(value: Option<&JsonValue>) -> Option<Photo<'_>> {
    let mut selected: Option<Photo<'_>> = None;
    for item in value?.as_array()? {
        let Some(file_id) = item.get("file_id").and_then(non_empty) else {
            continue;
        };
        let photo = Photo {
            file_id,
            file_unique_id: item.get("file_unique_id").and_then(non_empty),
            width: item.get("width").and_then(integer),
            height: item.get("height").and_then(integer),
            file_size: item.get("file_size").and_then(integer),
        };
        if selected.as_ref().is_none_or(|current| photo.size() >= current.size()) {
            selected = Some(photo);
        }
    }
    selected
}

/// The `telegram_message` of an update, by the original's rules; `None` for
/// updates it ignores (no `message`, a bot's message, nothing to say).
fn to_event(update: &JsonValue) -> Option<ConnectorEvent> {
    let update_id = update.get("update_id").and_then(integer)?;
    let message = update.get("message").filter(|m| m.is_object())?;
    let chat = message.get("chat").filter(|c| c.is_object())?;
    let chat_id = chat.get("id").and_then(identifier)?;
    let from = message.get("from").filter(|f| f.is_object());
    if from.and_then(|f| f.get("is_bot")).and_then(JsonValue::as_bool) == Some(true) {
        return None;
    }

    let mut properties = std::collections::BTreeMap::new();
    let mut put = |key: &str, value: Option<String>| {
        if let Some(value) = value {
            properties.insert(key.to_owned(), value);
        }
    };
    let text_of = |v: Option<&JsonValue>| v.and_then(non_empty).map(str::to_owned);
    let number_of = |v: Option<&JsonValue>| v.and_then(integer).map(|n| n.to_string());
    put("update_id", Some(update_id.to_string()));
    put("chat_id", Some(chat_id.clone()));
    put("chat_type", text_of(chat.get("type")));
    put("chat_title", text_of(chat.get("title")));
    put("chat_username", text_of(chat.get("username")));
    put("message_id", number_of(message.get("message_id")));
    put("date", number_of(message.get("date")));
    put("from_id", from.and_then(|f| f.get("id")).and_then(identifier));
    put("from_username", text_of(from.and_then(|f| f.get("username"))));
    put("from_first_name", text_of(from.and_then(|f| f.get("first_name"))));
    put("from_last_name", text_of(from.and_then(|f| f.get("last_name"))));

    let photo = largest_photo(message.get("photo"));
    if let Some(photo) = &photo {
        put("photo_file_id", Some(photo.file_id.to_owned()));
        put("has_photo", Some("true".to_owned()));
        put("photo_file_unique_id", photo.file_unique_id.map(str::to_owned));
        put("photo_width", photo.width.map(|n| n.to_string()));
        put("photo_height", photo.height.map(|n| n.to_string()));
        put("photo_file_size", photo.file_size.map(|n| n.to_string()));
    }
    // A document counts only when it is an image.
    let document = message.get("document").filter(|d| {
        d.get("file_id").and_then(non_empty).is_some()
            && d.get("mime_type").and_then(non_empty).is_some_and(|m| m.to_lowercase().starts_with("image/"))
    });
    let document_file_id = document.and_then(|d| d.get("file_id")).and_then(non_empty);
    if let Some(document) = document {
        put("image_document_file_id", text_of(document.get("file_id")));
        put("has_image_document", Some("true".to_owned()));
        put("image_document_file_unique_id", text_of(document.get("file_unique_id")));
        put("image_document_file_name", text_of(document.get("file_name")));
        put("image_document_mime_type", text_of(document.get("mime_type")));
        put("image_document_file_size", number_of(document.get("file_size")));
    }

    let mut parts: Vec<String> = Vec::new();
    if let Some(text) = text_of(message.get("text")).or_else(|| text_of(message.get("caption"))) {
        parts.push(text);
    }
    if let Some(photo) = &photo {
        parts.push(format!("[telegram_photo] file_id={}", photo.file_id));
    }
    if let Some(file_id) = document_file_id {
        parts.push(format!("[telegram_image_document] file_id={file_id}"));
    }
    let text = parts.join("\n").trim().to_owned();
    if text.is_empty() {
        return None;
    }
    Some(ConnectorEvent {
        name: EVENT.to_owned(),
        message: EventMessage::text(text),
        properties,
        instance_key: format!("telegram:{chat_id}"),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::connector::SecretMap;
    use crate::sink::MemorySink;

    fn event_of(update: JsonValue) -> ConnectorEvent {
        match to_event(&update) {
            Some(event) => event,
            None => panic!("no event for {update}"),
        }
    }

    #[test]
    fn a_text_message_becomes_telegram_message_with_the_originals_properties() {
        let event = event_of(json!({
            "update_id": 100,
            "message": {
                "message_id": 9, "date": 1_700_000_000, "text": "hello from telegram",
                "chat": {"id": 12345, "type": "private", "username": "dev-room"},
                "from": {"id": 77, "username": "alice", "first_name": "Alice", "is_bot": false}
            }
        }));
        assert_eq!(event.name, "telegram_message");
        assert_eq!(event.instance_key, "telegram:12345");
        assert_eq!(event.message, EventMessage::text("hello from telegram"));
        let expected: BTreeMap<String, String> = [
            ("update_id", "100"),
            ("chat_id", "12345"),
            ("chat_type", "private"),
            ("chat_username", "dev-room"),
            ("message_id", "9"),
            ("date", "1700000000"),
            ("from_id", "77"),
            ("from_username", "alice"),
            ("from_first_name", "Alice"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(event.properties, expected);
    }

    #[test]
    fn the_largest_photo_and_the_caption_make_the_text() {
        let event = event_of(json!({
            "update_id": 210,
            "message": {
                "message_id": 99, "caption": "look at this", "chat": {"id": -100777, "type": "group", "title": "Room"},
                "photo": [
                    {"file_id": "small-photo", "file_unique_id": "unique-small", "width": 90, "height": 90, "file_size": 1200},
                    {"file_id": "large-photo", "file_unique_id": "unique-large", "width": 1280, "height": 720, "file_size": 45200},
                    {"file_id": "no-size", "width": 10, "height": 10}
                ]
            }
        }));
        assert_eq!(event.message, EventMessage::text("look at this\n[telegram_photo] file_id=large-photo"));
        assert_eq!(event.instance_key, "telegram:-100777");
        let p = &event.properties;
        assert_eq!(p["photo_file_id"], "large-photo");
        assert_eq!(p["photo_file_unique_id"], "unique-large");
        assert_eq!((p["photo_width"].as_str(), p["photo_height"].as_str()), ("1280", "720"));
        assert_eq!(p["photo_file_size"], "45200");
        assert_eq!(p["has_photo"], "true");
        assert_eq!(p["chat_title"], "Room");
    }

    #[test]
    fn photos_without_sizes_compare_by_area_and_ties_go_to_the_later() {
        let event = event_of(json!({"update_id": 1, "message": {"chat": {"id": 1}, "photo": [
            {"file_id": "a", "width": 10, "height": 10},
            {"file_id": "b", "width": 20, "height": 5},
            {"file_id": "c", "width": 2, "height": 2}
        ]}}));
        assert_eq!(event.message, EventMessage::text("[telegram_photo] file_id=b"));
        assert_eq!(event.properties.get("photo_file_size"), None);
    }

    #[test]
    fn an_image_document_counts_and_other_documents_do_not() {
        let event = event_of(json!({"update_id": 5, "message": {"chat": {"id": "@chan"}, "text": "see", "document": {
            "file_id": "doc-1", "file_unique_id": "u-doc", "file_name": "a.PNG", "mime_type": "IMAGE/png", "file_size": 77
        }}}));
        assert_eq!(event.message, EventMessage::text("see\n[telegram_image_document] file_id=doc-1"));
        assert_eq!(event.instance_key, "telegram:@chan");
        let p = &event.properties;
        assert_eq!(p["image_document_file_id"], "doc-1");
        assert_eq!(p["has_image_document"], "true");
        assert_eq!(p["image_document_file_unique_id"], "u-doc");
        assert_eq!(p["image_document_file_name"], "a.PNG");
        assert_eq!(p["image_document_mime_type"], "IMAGE/png");
        assert_eq!(p["image_document_file_size"], "77");

        let pdf = json!({"update_id": 6, "message": {"chat": {"id": 1}, "document": {"file_id": "d", "mime_type": "application/pdf"}}});
        assert_eq!(to_event(&pdf), None, "a PDF alone says nothing");
        let pdf_with_caption = json!({"update_id": 7, "message": {"chat": {"id": 1}, "caption": "c", "document": {"file_id": "d", "mime_type": "application/pdf"}}});
        let event = event_of(pdf_with_caption);
        assert_eq!(event.message, EventMessage::text("c"));
        assert!(!event.properties.contains_key("has_image_document"));
    }

    #[test]
    fn text_wins_over_caption_and_is_trimmed() {
        let event =
            event_of(json!({"update_id": 1, "message": {"chat": {"id": 3}, "text": "  hi  ", "caption": "cap"}}));
        assert_eq!(event.message, EventMessage::text("hi"));
    }

    #[test]
    fn ignored_updates() {
        let ignored = [
            json!({"update_id": 1}),
            json!({"update_id": 1, "edited_message": {"chat": {"id": 1}, "text": "x"}}),
            json!({"update_id": 1, "message": {"chat": {"id": 1}, "text": "x", "from": {"id": 2, "is_bot": true}}}),
            json!({"update_id": 1, "message": {"chat": {"id": 1}, "text": "   "}}),
            json!({"update_id": 1, "message": {"chat": {"id": 1}, "sticker": {"file_id": "s"}}}),
            json!({"update_id": 1, "message": {"chat": {}, "text": "x"}}),
            json!({"update_id": 1, "message": {"text": "x"}}),
            json!({"update_id": "1", "message": {"chat": {"id": 1}, "text": "x"}}),
            json!({"update_id": 1.5, "message": {"chat": {"id": 1}, "text": "x"}}),
        ];
        for update in ignored {
            assert_eq!(to_event(&update), None, "{update}");
        }
    }

    #[test]
    fn whole_floats_are_integers_as_in_javascript() {
        let event =
            event_of(json!({"update_id": 8.0, "message": {"chat": {"id": 12.7}, "message_id": 3.0, "text": "x"}}));
        assert_eq!(event.properties["update_id"], "8");
        assert_eq!(event.properties["chat_id"], "12");
        assert_eq!(event.properties["message_id"], "3");
    }

    #[test]
    fn replies_are_read_with_their_retry_after() {
        let Reply::Updates(updates) = read_reply(200, None, br#"{"ok":true,"result":[{"update_id":1}]}"#) else {
            panic!("updates expected");
        };
        assert_eq!(updates.len(), 1);
        let failure = |reply| match reply {
            Reply::Failed(failure) => failure,
            Reply::Updates(_) => panic!("a failure expected"),
        };
        let limited = failure(read_reply(
            429,
            Some(Duration::from_secs(9)),
            br#"{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 3","parameters":{"retry_after":3}}"#,
        ));
        assert_eq!((limited.code(), limited.retry_after), (429, Some(Duration::from_secs(3))));
        let header_only = failure(read_reply(429, Some(Duration::from_secs(9)), b"not json"));
        assert_eq!(header_only.retry_after, Some(Duration::from_secs(9)));
        assert_eq!(header_only.describe(), "HTTP 429: Invalid Telegram API response payload");
        let in_body = failure(read_reply(200, None, br#"{"ok":false,"error_code":409,"description":"Conflict"}"#));
        assert_eq!(in_body.code(), 409);
        let not_array = failure(read_reply(200, None, br#"{"ok":true,"result":{}}"#));
        assert_eq!(not_array.describe(), "HTTP 200: getUpdates returned a non-array result");
    }

    fn context(config: &[(&str, &str)], secrets: &[(&str, &str)]) -> ConnectorContext {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
        };
        ConnectorContext {
            connection: "tg".to_owned(),
            connector: NAME.to_owned(),
            config: map(config),
            secrets: SecretMap::new(map(secrets)),
            sink: Arc::new(MemorySink::new()),
            stop: CancellationToken::new(),
            input: None,
        }
    }

    #[test]
    fn settings_defaults_and_the_originals_keys() -> Result<(), ConnectorError> {
        let settings = Settings::from_context(&context(&[], &[("BOT_TOKEN", "123:abc")]))?;
        assert_eq!(settings.token, "123:abc");
        assert_eq!(settings.api_base_url, "https://api.telegram.org");
        assert_eq!(settings.poll_timeout_seconds, 30);
        assert_eq!(settings.request_timeout, Duration::from_secs(35));
        assert_eq!(settings.retry_delay, Duration::from_millis(1000));
        assert_eq!(settings.initial_offset, 0);

        let settings = Settings::from_context(&context(
            &[
                ("TELEGRAM_API_BASE_URL", "http://127.0.0.1:9/"),
                ("TELEGRAM_POLL_TIMEOUT_SECONDS", "5"),
                ("TELEGRAM_RETRY_DELAY_MS", "0"),
                ("TELEGRAM_INITIAL_OFFSET", "41"),
            ],
            &[("TELEGRAM_TOKEN", "t"), ("TELEGRAM_REQUEST_TIMEOUT_MS", "2500"), ("TELEGRAM_BOT_TOKEN", "first")],
        ))?;
        assert_eq!(settings.token, "first", "TELEGRAM_BOT_TOKEN comes first");
        assert_eq!(settings.api_base_url, "http://127.0.0.1:9");
        assert_eq!(settings.poll_timeout_seconds, 5);
        assert_eq!(settings.request_timeout, Duration::from_millis(2500), "read from secrets too, as the original");
        assert_eq!(settings.retry_delay, Duration::from_millis(MIN_RETRY_DELAY_MS));
        assert_eq!(settings.initial_offset, 41);
        Ok(())
    }

    #[test]
    fn settings_errors_name_the_key_and_never_the_token() {
        type Pairs<'a> = &'a [(&'a str, &'a str)];
        let cases: [(Pairs<'_>, Pairs<'_>, &str, &str); 5] = [
            (&[], &[], "TELEGRAM_BOT_TOKEN", "missing bot token in secrets"),
            (
                &[("TELEGRAM_BOT_TOKEN", "TOKVAL-config")],
                &[],
                "TELEGRAM_BOT_TOKEN",
                "belongs in the Connection's secrets",
            ),
            (
                &[("TELEGRAM_POLL_TIMEOUT_SECONDS", "30s")],
                &[("BOT_TOKEN", "TOKVAL-1")],
                "TELEGRAM_POLL_TIMEOUT_SECONDS",
                "not an integer",
            ),
            (&[("TELEGRAM_RETRY_DELAY_MS", "-1")], &[("BOT_TOKEN", "TOKVAL-1")], "TELEGRAM_RETRY_DELAY_MS", "negative"),
            (&[("TELEGRAM_API_BASE_URL", "ftp://x")], &[("BOT_TOKEN", "TOKVAL-1")], "TELEGRAM_API_BASE_URL", "http"),
        ];
        for (config, secrets, key, words) in cases {
            let ctx = context(config, secrets);
            match Settings::from_context(&ctx) {
                Err(ConnectorError::Config { connection, key: got, message }) => {
                    assert_eq!((connection.as_str(), got.as_str()), ("tg", key));
                    assert!(message.contains(words), "{message}");
                    assert!(!message.contains("TOKVAL"), "{message}");
                }
                other => panic!("a config error expected for {key}, got {other:?}"),
            }
        }
    }

    #[test]
    fn an_https_client_builds_without_a_process_wide_provider() {
        assert!(http_client().is_ok());
    }

    #[test]
    fn settings_never_print_the_token() -> Result<(), ConnectorError> {
        let settings = Settings::from_context(&context(&[], &[("TELEGRAM_BOT_TOKEN", "123:very-secret")]))?;
        let shown = format!("{settings:?}");
        assert!(!shown.contains("very-secret") && shown.contains(REDACTED), "{shown}");
        assert_eq!(settings.redact("GET /bot123:very-secret/getUpdates"), "GET /bot<redacted>/getUpdates");
        Ok(())
    }
}
