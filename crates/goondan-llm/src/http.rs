//! HTTP pieces shared by the API providers: the client, retries with
//! backoff, status mapping, and a Server-Sent Events parser.

use std::sync::Arc;
use std::time::Duration;

use crate::error::ModelError;

/// An HTTPS client (rustls with the ring provider and Mozilla roots, set per
/// client so nothing process-wide has to be installed) with a connect
/// timeout. Model replies can stream for minutes, so there is no overall
/// request timeout here; providers bound the wait for each chunk instead.
pub fn client(provider: &str) -> Result<reqwest::Client, ModelError> {
    let config = tls_config().map_err(|e| ModelError::Config(format!("{provider}: TLS setup failed: {e}")))?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .connect_timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| ModelError::Config(format!("{provider}: HTTP client setup failed: {e}")))
}

fn tls_config() -> Result<rustls::ClientConfig, rustls::Error> {
    let roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// How often and how patiently to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all (1 = no retry).
    pub max_attempts: u32,
    /// The wait before the first retry; it doubles each time.
    pub base_delay: Duration,
    /// The longest wait between attempts.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { max_attempts: 4, base_delay: Duration::from_millis(500), max_delay: Duration::from_secs(8) }
    }
}

impl RetryPolicy {
    /// The wait before attempt `attempt` (1-based; attempt 1 has none).
    pub fn delay_before(&self, attempt: u32) -> Duration {
        if attempt <= 1 {
            return Duration::ZERO;
        }
        let factor = 2_u32.saturating_pow(attempt - 2);
        self.base_delay.saturating_mul(factor).min(self.max_delay)
    }
}

/// Runs `attempt` until it succeeds, fails with an error that is not worth
/// retrying, or the policy's attempts are spent.
pub async fn with_retries<T, F, Fut>(policy: RetryPolicy, mut attempt: F) -> Result<T, ModelError>
where
    F: FnMut(u32) -> Fut,
    Fut: std::future::Future<Output = Result<T, ModelError>>,
{
    let mut number = 1;
    loop {
        tokio::time::sleep(policy.delay_before(number)).await;
        match attempt(number).await {
            Err(error) if error.is_retryable() && number < policy.max_attempts => {
                tracing::warn!(target: "goondan::model", "attempt {number} failed, retrying: {error}");
                number += 1;
            }
            other => return other,
        }
    }
}

/// The error for a non-success status, with the API's message when the body
/// has one (`{"error": {"message": …}}` or `{"error": "…"}`).
pub fn status_error(provider: &str, status: u16, body: &str) -> ModelError {
    let message = api_message(body).unwrap_or_else(|| body.chars().take(500).collect());
    if status == 401 || status == 403 {
        ModelError::Unauthorized { provider: provider.to_owned(), status, message }
    } else {
        ModelError::Api { provider: provider.to_owned(), status, message }
    }
}

fn api_message(body: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    let error = value.get("error")?;
    error.get("message").and_then(serde_json::Value::as_str).or_else(|| error.as_str()).map(str::to_owned)
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

/// Splits a byte stream into Server-Sent Events (the WHATWG format: fields
/// per line, events end at a blank line, `:` starts a comment).
#[derive(Debug, Default)]
pub struct SseParser {
    buffer: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
}

impl SseParser {
    /// A parser with nothing buffered.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; returns the events they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
            let mut line: Vec<u8> = self.buffer.drain(..=end).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line).into_owned();
            self.line(&line, &mut events);
        }
        events
    }

    /// Ends the stream; returns a last event that had no blank line after it.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let rest = std::mem::take(&mut self.buffer);
        let mut events = Vec::new();
        if !rest.is_empty() {
            self.line(&String::from_utf8_lossy(&rest), &mut events);
        }
        self.line("", &mut events);
        events.pop()
    }

    fn line(&mut self, line: &str, events: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if !self.data.is_empty() || self.event.is_some() {
                events.push(SseEvent { event: self.event.take(), data: std::mem::take(&mut self.data).join("\n") });
            }
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = Some(value.to_owned()),
            "data" => self.data.push(value.to_owned()),
            _ => {}
        }
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
                    message: format!("no data for {} s while streaming", idle.as_secs()),
                });
            }
        };
        let Some(chunk) = chunk else { break };
        for event in parser.feed(&chunk) {
            on_event(event)?;
        }
    }
    if let Some(event) = parser.finish() {
        on_event(event)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_split_across_chunks() {
        let mut parser = SseParser::new();
        assert!(parser.feed(b"event: message_start\ndata: {\"a\"").is_empty());
        let events = parser.feed(b":1}\n\n: comment\ndata: x\r\ndata: y\r\n\r\ndata: [DONE]");
        assert_eq!(
            events,
            [
                SseEvent { event: Some("message_start".into()), data: "{\"a\":1}".into() },
                SseEvent { event: None, data: "x\ny".into() },
            ]
        );
        assert_eq!(parser.finish(), Some(SseEvent { event: None, data: "[DONE]".into() }));
    }

    #[test]
    fn retry_delays_double_up_to_the_cap() {
        let policy = RetryPolicy::default();
        let delays: Vec<u64> =
            (1..=7).map(|n| u64::try_from(policy.delay_before(n).as_millis()).unwrap_or(0)).collect();
        assert_eq!(delays, [0, 500, 1000, 2000, 4000, 8000, 8000]);
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

    #[tokio::test(start_paused = true)]
    async fn retries_stop_at_success_or_a_final_error() {
        let policy = RetryPolicy::default();
        let mut calls = 0;
        let result = with_retries(policy, |n| {
            calls += 1;
            async move { if n < 3 { Err(status_error("x", 500, "down")) } else { Ok(n) } }
        })
        .await;
        assert_eq!(result, Ok(3));
        assert_eq!(calls, 3);
        let mut calls = 0;
        let result: Result<(), _> = with_retries(policy, |_| {
            calls += 1;
            async { Err(status_error("x", 400, "bad")) }
        })
        .await;
        assert!(result.is_err());
        assert_eq!(calls, 1);
    }
}
