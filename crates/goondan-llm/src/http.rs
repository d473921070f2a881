//! HTTP pieces shared by the API providers: the client, retries with
//! backoff, status mapping, a Server-Sent Events parser, the mapping of an
//! error reported inside a stream, and `Transport`, which puts them
//! together for one provider.
//!
//! Errors inside a stream: every provider turns an error event of the API
//! into [`ModelError::Api`] carrying the API's message, with the HTTP status
//! the event gives (a numeric `code` from 400 to 599, as Gemini and vLLM
//! send), else the status the API uses for the error's type or code (see
//! [`ERROR_TYPE_STATUS`]), else 500. So an overloaded or rate-limited stream
//! classifies (retryable or not) like the same error sent as a status.

use std::time::Duration;

use goondan_core::JsonValue;
use goondan_core::tls::SystemProxy;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};

use crate::config::{ModelSettings, Secret};
use crate::error::ModelError;

/// An HTTPS client ([`goondan_core::tls`], through the environment's proxy)
/// with a connect timeout. Model replies can stream for minutes, so there is no overall
/// request timeout here; providers bound the wait for each chunk instead.
pub fn client(provider: &str) -> Result<reqwest::Client, ModelError> {
    goondan_core::tls::client_builder(SystemProxy::Honoured)
        .map_err(|e| ModelError::Config(format!("{provider}: {e}")))?
        .connect_timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| ModelError::Config(format!("{provider}: HTTP client setup failed: {e}")))
}

/// How often and how patiently to retry: exponential backoff with jitter
/// (`backon`), and the wait a rate-limited server asks for in `Retry-After`
/// when it is no longer than [`RetryPolicy::max_retry_after`] (the AI SDK's
/// rule, which the original uses: a longer wait falls back to the backoff).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all (1 = no retry).
    pub max_attempts: u32,
    /// The backoff before the first retry; it doubles each time. Jitter adds
    /// up to as much again, so that clients rate-limited together do not
    /// come back together.
    pub base_delay: Duration,
    /// The longest backoff before jitter.
    pub max_delay: Duration,
    /// The longest `Retry-After` honoured.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
            max_retry_after: MAX_RETRY_AFTER,
        }
    }
}

/// The longest `Retry-After` honoured by default: 60 s, as the original's SDK.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

impl RetryPolicy {
    /// The backoff between attempts, as a `backon` builder.
    pub fn backoff(&self) -> backon::ExponentialBuilder {
        backon::ExponentialBuilder::new()
            .with_jitter()
            .with_factor(2.0)
            .with_min_delay(self.base_delay)
            .with_max_delay(self.max_delay)
            .with_max_times(usize::try_from(self.max_attempts.saturating_sub(1)).unwrap_or(usize::MAX))
    }

    /// The wait before the next attempt: the server's `Retry-After` when
    /// there is one within [`Self::max_retry_after`], else the backoff's.
    fn wait(&self, backoff: Duration, retry_after: Option<Duration>) -> Duration {
        retry_after.filter(|wait| *wait <= self.max_retry_after).unwrap_or(backoff)
    }
}

/// A failed attempt: the error, and the wait the server asked for.
#[derive(Debug)]
pub struct Failure {
    /// What went wrong.
    pub error: ModelError,
    /// The server's `Retry-After` (or `retry-after-ms`), when it sent one.
    pub retry_after: Option<Duration>,
}

impl From<ModelError> for Failure {
    fn from(error: ModelError) -> Self {
        Self { error, retry_after: None }
    }
}

/// The wait a server asks for: `retry-after-ms` (milliseconds, as OpenAI
/// sends it), else `Retry-After` as seconds or as an HTTP date (a date in
/// the past is no wait). `None` when neither header is there or readable.
pub fn retry_after(headers: &HeaderMap, now: std::time::SystemTime) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok()).map(str::trim);
    let seconds = |text: &str, scale: f64| {
        text.parse::<f64>().ok().filter(|n| *n >= 0.0).and_then(|n| Duration::try_from_secs_f64(n / scale).ok())
    };
    if let Some(wait) = header("retry-after-ms").and_then(|text| seconds(text, 1000.0)) {
        return Some(wait);
    }
    let text = header("retry-after")?;
    seconds(text, 1.0).or_else(|| {
        let date = httpdate::parse_http_date(text).ok()?;
        Some(date.duration_since(now).unwrap_or(Duration::ZERO))
    })
}

/// Runs `attempt` (given its 1-based number) until it succeeds, fails with
/// an error that is not worth retrying, or the policy's attempts are spent.
pub async fn with_retries<T, F, Fut>(policy: RetryPolicy, mut attempt: F) -> Result<T, ModelError>
where
    F: FnMut(u32) -> Fut,
    Fut: std::future::Future<Output = Result<T, Failure>>,
{
    use backon::Retryable;
    let mut number = 0_u32;
    let run = || {
        number += 1;
        attempt(number)
    };
    run.retry(policy.backoff())
        .when(|failure: &Failure| failure.error.is_retryable())
        .adjust(|failure, backoff| backoff.map(|backoff| policy.wait(backoff, failure.retry_after)))
        .notify(|failure, wait| {
            tracing::warn!(target: "goondan::model", "attempt failed, retrying in {:.1} s: {}", wait.as_secs_f64(), failure.error);
        })
        .await
        .map_err(|failure| failure.error)
}

/// The error for a non-success status, with the API's message when the body
/// has one (`{"error": {"message": …}}` or `{"error": "…"}`, possibly wrapped
/// in a list as Google does without `alt=sse`).
pub fn status_error(provider: &str, status: u16, body: &str) -> ModelError {
    let message = api_message(body).unwrap_or_else(|| excerpt(body, 500));
    if status == 401 || status == 403 {
        ModelError::Unauthorized { provider: provider.to_owned(), status, message }
    } else {
        ModelError::Api { provider: provider.to_owned(), status, message }
    }
}

fn api_message(body: &str) -> Option<String> {
    let value: JsonValue = serde_json::from_str(body).ok()?;
    let value = match &value {
        JsonValue::Array(items) => items.first()?,
        other => other,
    };
    let error = value.get("error")?;
    error.get("message").and_then(JsonValue::as_str).or_else(|| error.as_str()).map(str::to_owned)
}

/// The HTTP status each API sends with an error of a given type or code:
/// OpenAI's `type`/`code`, Anthropic's `error.type`, and Google's `status`
/// (gRPC codes, mapped as Google's HTTP API maps them).
pub const ERROR_TYPE_STATUS: &[(&str, u16)] = &[
    ("invalid_request_error", 400),
    ("context_length_exceeded", 400),
    ("invalid_prompt", 400),
    ("INVALID_ARGUMENT", 400),
    ("FAILED_PRECONDITION", 400),
    ("authentication_error", 401),
    ("invalid_api_key", 401),
    ("UNAUTHENTICATED", 401),
    ("permission_error", 403),
    ("PERMISSION_DENIED", 403),
    ("not_found_error", 404),
    ("NOT_FOUND", 404),
    ("request_too_large", 413),
    ("rate_limit_error", 429),
    ("rate_limit_exceeded", 429),
    ("insufficient_quota", 429),
    ("RESOURCE_EXHAUSTED", 429),
    ("server_error", 500),
    ("api_error", 500),
    ("INTERNAL", 500),
    ("UNAVAILABLE", 503),
    ("DEADLINE_EXCEEDED", 504),
    ("overloaded_error", 529),
];

/// The error for an error object an API reported inside a stream
/// (`{message, type?, code?, status?}`, or a bare string): see the module
/// documentation for the status it gets.
pub fn stream_error(provider: &str, error: &JsonValue) -> ModelError {
    let message = error
        .get("message")
        .and_then(JsonValue::as_str)
        .or_else(|| error.as_str())
        .filter(|message| !message.is_empty())
        .map_or_else(|| excerpt(&error.to_string(), 500), str::to_owned);
    let numeric = error
        .get("code")
        .and_then(JsonValue::as_u64)
        .and_then(|code| u16::try_from(code).ok())
        .filter(|code| (400..600).contains(code));
    let named = || {
        ["code", "type", "status"]
            .iter()
            .filter_map(|field| error.get(field).and_then(JsonValue::as_str))
            .find_map(|name| ERROR_TYPE_STATUS.iter().find(|(known, _)| *known == name).map(|(_, status)| *status))
    };
    let status = numeric.or_else(named).unwrap_or(500);
    ModelError::Api { provider: provider.to_owned(), status, message }
}

/// The first `max` characters of `text`, with `…` when there was more.
pub(crate) fn excerpt(text: &str, max: usize) -> String {
    let mut chars = text.chars();
    let mut start: String = chars.by_ref().take(max).collect();
    if chars.next().is_some() {
        start.push('…');
    }
    start
}

/// The error for a request that got no answer.
pub fn network_error(provider: &str, endpoint: &str, error: &reqwest::Error) -> ModelError {
    // reqwest's message includes the URL; keys are never in URLs we build
    // (they go in headers), except Google's `key=` parameter, which
    // providers must strip before calling this.
    let mut message = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    ModelError::Network { provider: provider.to_owned(), endpoint: endpoint.to_owned(), message }
}

/// One Server-Sent Event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// The most bytes one SSE line may hold, and the most the `data` lines of
/// one event may hold together: 4 MiB, far above any real chunk (a whole
/// tool call's arguments arrive in one line from some APIs) and small
/// enough that a broken or hostile server cannot grow memory without bound.
pub const MAX_SSE_EVENT_BYTES: usize = 4 * 1024 * 1024;

/// A stream the parser refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// A line, or one event's data, exceeded [`MAX_SSE_EVENT_BYTES`].
    #[error("a server-sent event line or event exceeds the limit of {limit} bytes")]
    TooLong {
        /// The limit, in bytes.
        limit: usize,
    },
}

/// Splits a byte stream into Server-Sent Events (the WHATWG format: fields
/// per line, lines end with `\n`, `\r\n` or a bare `\r`, events end at a
/// blank line, `:` starts a comment).
///
/// Each byte is scanned once: a chunk is searched for line ends from where
/// the previous chunk left off, and only an unfinished line is kept, up to
/// [`MAX_SSE_EVENT_BYTES`] (as are one event's data lines together).
///
/// Why not a maintained crate: the SSE parsers at hand (`sse-stream`, in
/// the lock file through the MCP SDK, and `eventsource-stream`) buffer an
/// unfinished line and an event's data without any bound, so a broken or
/// hostile endpoint could grow memory until the process dies; `sse-stream`
/// also fails a stream on a field it does not know or a repeated `event:`,
/// which the format says to ignore or overwrite.
#[derive(Debug)]
pub struct SseParser {
    /// The unfinished line (no `\n` or `\r` in it).
    partial: Vec<u8>,
    /// The last chunk ended with `\r`: a `\n` that starts the next one
    /// belongs to that line end.
    skip_lf: bool,
    event: Option<String>,
    data: Vec<String>,
    /// Bytes in `data`.
    data_bytes: usize,
    limit: usize,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::with_limit(MAX_SSE_EVENT_BYTES)
    }
}

impl SseParser {
    /// A parser with nothing buffered.
    pub fn new() -> Self {
        Self::default()
    }

    /// A parser whose line and event limit is `limit` bytes (tests use small ones).
    pub fn with_limit(limit: usize) -> Self {
        Self { partial: Vec::new(), skip_lf: false, event: None, data: Vec::new(), data_bytes: 0, limit }
    }

    /// Feeds bytes; returns the events they complete, or [`SseError`] once a
    /// line or an event is too long (the stream is then unusable).
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        let mut events = Vec::new();
        let mut rest = bytes;
        if self.skip_lf && !rest.is_empty() {
            self.skip_lf = false;
            rest = rest.strip_prefix(b"\n").unwrap_or(rest);
        }
        while let Some(end) = memchr::memchr2(b'\n', b'\r', rest) {
            let (line, tail) = rest.split_at(end);
            rest = &tail[1..];
            if tail[0] == b'\r' {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    None => self.skip_lf = true,
                    Some(_) => {}
                }
            }
            if self.partial.is_empty() {
                self.complete_line(line, &mut events)?;
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                self.check_length(whole.len() + line.len())?;
                whole.extend_from_slice(line);
                self.complete_line(&whole, &mut events)?;
            }
        }
        self.check_length(self.partial.len() + rest.len())?;
        self.partial.extend_from_slice(rest);
        Ok(events)
    }

    /// Ends the stream; returns a last event that had no blank line after it.
    pub fn finish(&mut self) -> Result<Option<SseEvent>, SseError> {
        let rest = std::mem::take(&mut self.partial);
        let mut events = Vec::new();
        if !rest.is_empty() {
            self.complete_line(&rest, &mut events)?;
        }
        self.line("", &mut events)?;
        Ok(events.pop())
    }

    fn check_length(&self, length: usize) -> Result<(), SseError> {
        if length > self.limit { Err(SseError::TooLong { limit: self.limit }) } else { Ok(()) }
    }

    /// A line without its line end.
    fn complete_line(&mut self, line: &[u8], events: &mut Vec<SseEvent>) -> Result<(), SseError> {
        self.check_length(line.len())?;
        self.line(&String::from_utf8_lossy(line), events)
    }

    fn line(&mut self, line: &str, events: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if line.is_empty() {
            if !self.data.is_empty() || self.event.is_some() {
                self.data_bytes = 0;
                events.push(SseEvent { event: self.event.take(), data: std::mem::take(&mut self.data).join("\n") });
            }
            return Ok(());
        }
        if line.starts_with(':') {
            return Ok(());
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = Some(value.to_owned()),
            "data" => {
                self.data_bytes += value.len() + 1;
                self.check_length(self.data_bytes)?;
                self.data.push(value.to_owned());
            }
            _ => {}
        }
        Ok(())
    }
}

/// Reads a streaming response body as Server-Sent Events, handing each to
/// `on_event`; waits at most `idle` for each chunk.
pub async fn read_sse(
    provider: &str,
    mut response: reqwest::Response,
    idle: Duration,
    mut on_event: impl FnMut(SseEvent) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    let mut parser = SseParser::new();
    loop {
        let chunk = match tokio::time::timeout(idle, response.chunk()).await {
            Ok(Ok(chunk)) => chunk,
            Ok(Err(error)) => {
                return Err(ModelError::Protocol {
                    provider: provider.to_owned(),
                    message: format!("the stream broke off: {error}"),
                });
            }
            Err(_) => {
                return Err(ModelError::Protocol {
                    provider: provider.to_owned(),
                    message: format!("no data for {} s while streaming", idle.as_secs_f64()),
                });
            }
        };
        let Some(chunk) = chunk else { break };
        let events = parser.feed(&chunk).map_err(|error| ModelError::protocol(provider, error.to_string()))?;
        for event in events {
            on_event(event)?;
        }
    }
    if let Some(event) = parser.finish().map_err(|error| ModelError::protocol(provider, error.to_string()))? {
        on_event(event)?;
    }
    Ok(())
}

/// The most bytes of an error body read: enough for any API's error JSON;
/// the rest is never read, so a huge or endless body costs nothing.
pub const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// Reads at most `cap` bytes of `response`'s body, chunk by chunk, and
/// stops there (or at the end, or at a failure: what arrived is kept).
async fn read_capped(response: &mut reqwest::Response, cap: usize, body: &mut Vec<u8>) {
    while body.len() < cap {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = cap - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
}

/// The HTTP side of one API provider: the client, the headers (the key
/// among them, marked sensitive so `Debug` shows `Sensitive`), the idle
/// timeout and the retry policy. It sends a request, retrying rate limits,
/// server errors and network failures until the response headers arrive,
/// and reads the streamed reply; a stream is never retried, since its text
/// has been reported by then.
#[derive(Debug)]
pub(crate) struct Transport {
    provider: &'static str,
    client: reqwest::Client,
    /// The base URL, without a trailing slash.
    endpoint: String,
    headers: HeaderMap,
    /// Kept only to scrub it from error messages; `Secret` never prints.
    key: Secret,
    /// `options.idleTimeoutSeconds`.
    pub(crate) idle: Duration,
    pub(crate) retry: RetryPolicy,
    status_error: fn(&str, u16, &str) -> ModelError,
}

impl Transport {
    /// A transport for `settings`, sending the key in `key_header` as
    /// `{key_prefix}{key}`, with `content-type: application/json` and
    /// `accept: text/event-stream`; fails without a key, with a key that
    /// cannot be a header value, or with an invalid `idleTimeoutSeconds`.
    pub(crate) fn new(settings: &ModelSettings, key_header: HeaderName, key_prefix: &str) -> Result<Self, ModelError> {
        let provider = settings.kind.name();
        let key = settings.key()?;
        // The error must not echo the key, so it names only the problem.
        let mut value = HeaderValue::from_str(&format!("{key_prefix}{key}")).map_err(|_| {
            ModelError::Config(format!(
                "{provider}: the API key contains characters that cannot be sent in an HTTP header"
            ))
        })?;
        value.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert(key_header, value);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        Ok(Self {
            provider,
            client: client(provider)?,
            endpoint: settings.endpoint.trim_end_matches('/').to_owned(),
            headers,
            key: Secret::new(key),
            idle: settings.idle_timeout()?,
            retry: RetryPolicy::default(),
            status_error,
        })
    }

    /// Sends `name: value` with every request.
    pub(crate) fn insert_header(&mut self, name: HeaderName, value: HeaderValue) {
        self.headers.insert(name, value);
    }

    /// Maps non-success statuses with `map` instead of [`status_error`].
    #[must_use]
    pub(crate) fn with_status_error(mut self, map: fn(&str, u16, &str) -> ModelError) -> Self {
        self.status_error = map;
        self
    }

    /// `{endpoint}/{path}`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.endpoint)
    }

    /// POSTs `body` as JSON and waits for a success status, retrying as the
    /// policy allows; the wait for the headers and for an error body is
    /// bounded by the idle timeout.
    pub(crate) async fn post(&self, url: &str, body: &impl serde::Serialize) -> Result<reqwest::Response, ModelError> {
        let body = serde_json::to_string(body)
            .map_err(|e| ModelError::protocol(self.provider, format!("cannot encode the request: {e}")))?;
        with_retries(self.retry, |attempt| self.attempt(url, &body, attempt)).await
    }

    async fn attempt(&self, url: &str, body: &str, attempt: u32) -> Result<reqwest::Response, Failure> {
        tracing::debug!(target: "goondan::model", provider = self.provider, %url, attempt, "sending a model request");
        let request = self.client.post(url).headers(self.headers.clone()).body(body.to_owned()).send();
        let response = match tokio::time::timeout(self.idle, request).await {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => return Err(network_error(self.provider, &self.endpoint, &error).into()),
            Err(_) => {
                return Err(ModelError::Network {
                    provider: self.provider.to_owned(),
                    endpoint: self.endpoint.clone(),
                    message: format!("no response within {} s", self.idle.as_secs_f64()),
                }
                .into());
            }
        };
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let retry_after = retry_after(response.headers(), std::time::SystemTime::now());
        let text = self.text(response).await;
        Err(Failure { error: (self.status_error)(self.provider, status.as_u16(), &text), retry_after })
    }

    /// The first [`MAX_ERROR_BODY_BYTES`] of an error body as text, or what
    /// arrived of them within the idle timeout (so a server that never
    /// finishes its body cannot hang the call, nor a huge one fill memory).
    pub(crate) async fn text(&self, mut response: reqwest::Response) -> String {
        let mut body = Vec::new();
        let _ = tokio::time::timeout(self.idle, read_capped(&mut response, MAX_ERROR_BODY_BYTES, &mut body)).await;
        String::from_utf8_lossy(&body).into_owned()
    }

    /// Reads the streamed reply as Server-Sent Events (see [`read_sse`]).
    pub(crate) async fn read_sse(
        &self,
        response: reqwest::Response,
        on_event: impl FnMut(SseEvent) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        read_sse(self.provider, response, self.idle, on_event).await
    }

    /// `error` without the key (see [`ModelError::redact`]).
    pub(crate) fn redact(&self, error: ModelError) -> ModelError {
        error.redact(self.key.expose())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sse_events_split_across_chunks() {
        let mut parser = SseParser::new();
        assert_eq!(parser.feed(b"event: message_start\ndata: {\"a\""), Ok(Vec::new()));
        let events = parser.feed(b":1}\n\n: comment\ndata: x\r\ndata: y\r\n\r\ndata: [DONE]").unwrap_or_default();
        assert_eq!(
            events,
            [
                SseEvent { event: Some("message_start".into()), data: "{\"a\":1}".into() },
                SseEvent { event: None, data: "x\ny".into() },
            ]
        );
        assert_eq!(parser.finish(), Ok(Some(SseEvent { event: None, data: "[DONE]".into() })));
    }

    #[test]
    fn an_over_long_line_or_event_is_refused_naming_the_limit() {
        // A line that never ends: refused once it passes the limit, however it is cut.
        let mut parser = SseParser::with_limit(16);
        assert_eq!(parser.feed(b"data: 0123456789"), Ok(Vec::new()));
        assert_eq!(parser.feed(b"x"), Err(SseError::TooLong { limit: 16 }));
        let mut parser = SseParser::with_limit(16);
        assert_eq!(parser.feed(b"data: 0123456789abcdef\n"), Err(SseError::TooLong { limit: 16 }));
        // Many short data lines of one event add up.
        let mut parser = SseParser::with_limit(16);
        assert_eq!(parser.feed(b"data: 12345\ndata: 12345\n"), Ok(Vec::new()));
        assert_eq!(parser.feed(b"data: 12345\n"), Err(SseError::TooLong { limit: 16 }));
        // The limit is per event: a blank line starts the count again.
        let mut parser = SseParser::with_limit(16);
        for _ in 0..10 {
            assert_eq!(parser.feed(b"data: 12345\n\n").map(|events| events.len()), Ok(1));
        }
        assert!(SseError::TooLong { limit: MAX_SSE_EVENT_BYTES }.to_string().contains("4194304 bytes"));
    }

    #[test]
    fn sse_lines_may_end_with_a_bare_cr_even_across_chunks() {
        let stream: &[u8] = b"event: a\rdata: 1\rdata: 2\r\rdata: 3\r\n\r\ndata: 4\n\n: c\rdata: 5\r\r";
        let expected = [
            SseEvent { event: Some("a".into()), data: "1\n2".into() },
            SseEvent { event: None, data: "3".into() },
            SseEvent { event: None, data: "4".into() },
            SseEvent { event: None, data: "5".into() },
        ];
        // Whole, and cut at every byte (a `\r\n` cut between its bytes is one line end).
        for cut in 0..=stream.len() {
            let mut parser = SseParser::new();
            let mut events = parser.feed(&stream[..cut]).unwrap_or_default();
            events.extend(parser.feed(&stream[cut..]).unwrap_or_default());
            assert_eq!(parser.finish(), Ok(None), "cut at {cut}");
            assert_eq!(events, expected, "cut at {cut}");
        }
        // Byte by byte, with empty chunks between.
        let mut parser = SseParser::new();
        let mut events = Vec::new();
        for byte in stream {
            events.extend(parser.feed(&[*byte]).unwrap_or_default());
            events.extend(parser.feed(&[]).unwrap_or_default());
        }
        assert_eq!(events, expected);
    }

    #[test]
    fn retry_backoff_doubles_with_jitter() {
        let policy = RetryPolicy::default();
        for _ in 0..50 {
            let delays: Vec<Duration> = backon::BackoffBuilder::build(policy.backoff()).collect();
            assert_eq!(delays.len(), 3, "four attempts, three waits");
            for (delay, base) in delays.iter().zip([500_u64, 1000, 2000]) {
                let base = Duration::from_millis(base);
                assert!(*delay >= base && *delay < base * 2, "{delay:?} for {base:?}");
            }
        }
        let long = RetryPolicy { max_attempts: 10, ..policy };
        let last = backon::BackoffBuilder::build(long.backoff()).last().unwrap_or_default();
        assert!(last >= policy.max_delay && last < policy.max_delay * 2, "{last:?}");
    }

    #[test]
    fn retry_after_reads_seconds_milliseconds_and_dates() {
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let headers = |pairs: &[(&'static str, String)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, HeaderValue::from_str(value).unwrap_or(HeaderValue::from_static("")));
            }
            map
        };
        let date = |offset: u64| httpdate::fmt_http_date(now + Duration::from_secs(offset));
        let cases = [
            (headers(&[("retry-after", "20".into())]), Some(Duration::from_secs(20))),
            (headers(&[("retry-after", " 1.5 ".into())]), Some(Duration::from_millis(1500))),
            (headers(&[("retry-after", date(30))]), Some(Duration::from_secs(30))),
            (headers(&[("retry-after", httpdate::fmt_http_date(now - Duration::from_secs(5)))]), Some(Duration::ZERO)),
            (
                headers(&[("retry-after-ms", "250".into()), ("retry-after", "9".into())]),
                Some(Duration::from_millis(250)),
            ),
            (headers(&[("retry-after", "-1".into())]), None),
            (headers(&[("retry-after", "soon".into())]), None),
            (headers(&[]), None),
        ];
        for (map, expected) in cases {
            assert_eq!(retry_after(&map, now), expected, "{map:?}");
        }
        // Honoured up to the cap; past it, the backoff's wait.
        let policy = RetryPolicy::default();
        let backoff = Duration::from_millis(700);
        assert_eq!(policy.wait(backoff, Some(Duration::from_secs(20))), Duration::from_secs(20));
        assert_eq!(policy.wait(backoff, Some(MAX_RETRY_AFTER)), MAX_RETRY_AFTER);
        assert_eq!(policy.wait(backoff, Some(Duration::from_secs(61))), backoff);
        assert_eq!(policy.wait(backoff, None), backoff);
    }

    #[test]
    fn statuses_map_to_errors() {
        assert!(matches!(status_error("openai", 401, r#"{"error":{"message":"bad key"}}"#),
            ModelError::Unauthorized { status: 401, ref message, .. } if message == "bad key"));
        let rate = status_error("anthropic", 429, r#"{"error":"slow down"}"#);
        assert!(rate.is_retryable());
        assert!(status_error("x", 503, "oops").is_retryable());
        assert!(!status_error("x", 400, "bad").is_retryable());
    }

    #[test]
    fn list_wrapped_error_bodies_give_their_message() {
        let body = r#"[{"error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}}]"#;
        assert!(matches!(status_error("google", 400, body), ModelError::Api { ref message, .. } if message == "bad"));
        let long = "x".repeat(600);
        assert!(
            matches!(status_error("x", 502, &long), ModelError::Api { ref message, .. } if message.chars().count() == 501)
        );
    }

    #[test]
    fn stream_errors_are_api_errors_with_a_status() {
        let cases = [
            // A numeric HTTP code wins (Gemini, vLLM).
            (json!({"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}), 503, "overloaded"),
            (json!({"code": 7, "message": "odd", "status": "PERMISSION_DENIED"}), 403, "odd"),
            // Else the type or code names it.
            (json!({"type": "overloaded_error", "message": "Overloaded"}), 529, "Overloaded"),
            (
                json!({"type": "invalid_request_error", "code": "context_length_exceeded", "message": "long"}),
                400,
                "long",
            ),
            (json!({"code": "rate_limit_exceeded", "message": "slow"}), 429, "slow"),
            // Else 500.
            (json!({"code": "ERR_SOMETHING", "message": "Something went wrong"}), 500, "Something went wrong"),
            (json!({"type": "server_error", "code": null, "message": "Sorry"}), 500, "Sorry"),
            (json!("a bare message"), 500, "a bare message"),
            (json!({"detail": "no message"}), 500, r#"{"detail":"no message"}"#),
        ];
        for (error, status, message) in cases {
            assert_eq!(
                stream_error("p", &error),
                ModelError::Api { provider: "p".into(), status, message: message.into() },
                "{error}"
            );
        }
    }

    #[test]
    fn excerpts_mark_what_they_cut() {
        assert_eq!(excerpt("héllo", 5), "héllo");
        assert_eq!(excerpt("héllo", 2), "hé…");
    }

    #[tokio::test(start_paused = true)]
    async fn retries_stop_at_success_or_a_final_error() {
        let policy = RetryPolicy::default();
        let mut calls = 0;
        let result = with_retries(policy, |n| {
            calls += 1;
            async move { if n < 3 { Err(status_error("x", 500, "down").into()) } else { Ok(n) } }
        })
        .await;
        assert_eq!(result, Ok(3));
        assert_eq!(calls, 3);
        let mut calls = 0;
        let result: Result<(), _> = with_retries(policy, |_| {
            calls += 1;
            async { Err(status_error("x", 400, "bad").into()) }
        })
        .await;
        assert!(result.is_err());
        assert_eq!(calls, 1);
    }
}
