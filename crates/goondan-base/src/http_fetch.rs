//! The `http-fetch` tool: `get{url, headers, timeoutMs, maxBytes}` and
//! `post{url, body, bodyString, headers, timeoutMs, maxBytes}`, answering
//! `{url, method, status, statusText, headers, body, truncated, durationMs}`.
//!
//! As in the original, only http and https are fetched, header values may be
//! strings, numbers or booleans, and a non-2xx status is a successful call
//! that reports the status. Unlike the original, the target must be a public
//! address or on the operator's allow-list ([`crate::net_guard`]: checked on
//! the URL, after DNS resolution and on every redirect), and `timeoutMs` and
//! `maxBytes` hold while the body streams in: the call never waits longer
//! than `timeoutMs` nor holds more than `maxBytes` of the body in memory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use goondan_core::codes::{E_HTTP_REQUEST, E_HTTP_TIMEOUT, E_INVALID_URL};
use goondan_core::{JsonObject, JsonValue, json_type_name};
use goondan_tools::{BoxFuture, HandlerResult, ToolContext, ToolFailure, ToolHandler};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};
use serde_json::json;

use crate::BaseSettings;
use crate::net_guard::{self, NetGuard};
use crate::{args, http_io};

/// The default `timeoutMs`.
pub const DEFAULT_TIMEOUT_MS: f64 = 30_000.0;
/// The largest `timeoutMs`: ten minutes.
pub const MAX_TIMEOUT_MS: f64 = 600_000.0;
/// The default `maxBytes`.
pub const DEFAULT_MAX_BYTES: u64 = 500_000;
/// The largest `maxBytes`: what a call may hold in memory (50 MB).
pub const MAX_MAX_BYTES: u64 = 50_000_000;

/// The `User-Agent` sent unless the input sets one (some APIs refuse
/// requests without it).
const USER_AGENT: &str = concat!("goondan/", env!("CARGO_PKG_VERSION"));
/// What `post` sends `bodyString` as when the headers name no content type:
/// what the original's `fetch` sent for a string body.
const TEXT_CONTENT_TYPE: &str = "text/plain;charset=UTF-8";

/// The handler of `export`, or `None` if the tool has no such export.
pub fn handler(export: &str, settings: &Arc<BaseSettings>) -> Option<Arc<dyn ToolHandler>> {
    let method = match export {
        "get" => Method::GET,
        "post" => Method::POST,
        _ => return None,
    };
    Some(Arc::new(HttpFetch { method, fetcher: Fetcher::new(settings) }))
}

/// The guard and the guarded client, shared by the calls of one export.
struct Fetcher {
    guard: NetGuard,
    /// The client, or why it could not be built (reported on each call
    /// rather than failing registration).
    client: Result<reqwest::Client, String>,
}

impl Fetcher {
    fn new(settings: &BaseSettings) -> Self {
        let guard = NetGuard::new(settings);
        let client = guard
            .client_builder()
            .map_err(|e| e.to_string())
            .and_then(|builder| builder.user_agent(USER_AGENT).build().map_err(|e| e.to_string()));
        Self { guard, client }
    }
}

/// `http-fetch.get` and `http-fetch.post`.
struct HttpFetch {
    method: Method,
    fetcher: Fetcher,
}

impl ToolHandler for HttpFetch {
    fn call<'a>(&'a self, ctx: &'a ToolContext, input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            let request = Request::parse(&self.method, input, &self.fetcher.guard)?;
            ctx.logger.debug(format_args!("{} {}", request.method, request.url));
            let client = self.fetcher.client.as_ref().map_err(|error| {
                ToolFailure::with_code(
                    format!("{}: the HTTP client could not be set up: {error}", request.failed()),
                    E_HTTP_REQUEST,
                )
            })?;
            Ok(request.send(client).await?.into())
        })
    }
}

/// A checked request.
struct Request {
    method: Method,
    url: Url,
    headers: HeaderMap,
    body: Option<String>,
    timeout: Duration,
    timeout_ms: f64,
    max_bytes: usize,
}

impl Request {
    /// Reads the input; the URL first, refused before anything else when
    /// its scheme or IP-literal host is not allowed.
    fn parse(method: &Method, input: &JsonObject, guard: &NetGuard) -> Result<Self, ToolFailure> {
        // Missing, empty and blank all get `parse_url`'s E_INVALID_URL refusal.
        let url = parse_url(args::optional_string(input, "url")?.unwrap_or_default())?;
        guard.check_url(&url).map_err(|refused| refused.to_failure(&format!("{method} {url} failed")))?;
        let mut headers = parse_headers(input)?;
        let timeout_ms = parse_timeout_ms(input)?;
        let max_bytes = parse_max_bytes(input)?;
        let body = if *method == Method::POST { post_body(input, &mut headers)? } else { None };
        Ok(Self {
            method: method.clone(),
            url,
            headers,
            body,
            // In (0, 600000], so the conversion is exact enough and cannot overflow.
            timeout: Duration::from_secs_f64(timeout_ms / 1000.0),
            timeout_ms,
            max_bytes,
        })
    }

    /// The start of every error message: what failed.
    fn failed(&self) -> String {
        format!("{} {} failed", self.method, self.url)
    }

    async fn send(mut self, client: &reqwest::Client) -> Result<JsonValue, ToolFailure> {
        let started = Instant::now();
        let mut builder =
            client.request(self.method.clone(), self.url.clone()).headers(std::mem::take(&mut self.headers));
        if let Some(body) = self.body.take() {
            builder = builder.body(body);
        }
        // One deadline for everything: connecting, redirects and the body.
        let exchange = async {
            let response = builder.send().await.map_err(|error| self.request_error(error))?;
            if let Some(refused) = unfollowed_redirect(&response) {
                return Err(refused.to_failure(&self.failed()));
            }
            let status = response.status();
            let final_url = response.url().to_string();
            let headers = response_headers(response.headers());
            let (body, truncated) =
                read_body(response, self.max_bytes).await.map_err(|error| self.request_error(error))?;
            Ok(json!({
                "url": final_url,
                "method": self.method.as_str(),
                "status": status.as_u16(),
                "statusText": status.canonical_reason().unwrap_or(""),
                "headers": headers,
                "body": body,
                "truncated": truncated,
                "durationMs": u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            }))
        };
        tokio::time::timeout(self.timeout, exchange).await.unwrap_or_else(|_| {
            Err(ToolFailure::with_code(
                format!("{} {} timed out after {}ms", self.method, self.url, args::number_value(self.timeout_ms)),
                E_HTTP_TIMEOUT,
            )
            .suggest(format!(
                "Retry later or with a larger timeoutMs (at most {MAX_TIMEOUT_MS}), or fetch a smaller resource."
            )))
        })
    }

    /// The failure for a request that did not complete.
    fn request_error(&self, error: reqwest::Error) -> ToolFailure {
        if let Some(refused) = net_guard::guard_error_in(&error) {
            return refused.to_failure(&self.failed());
        }
        let what = if error.is_connect() {
            "could not connect"
        } else if error.is_redirect() {
            "could not follow a redirect"
        } else if error.is_body() || error.is_decode() {
            "could not read the response body"
        } else {
            "the request could not be completed"
        };
        ToolFailure::with_code(format!("{}: {what}: {}", self.failed(), http_io::describe_error(error)), E_HTTP_REQUEST)
            .suggest("Check that the URL is right and the server is reachable, then retry.")
    }
}

/// A redirect `reqwest` did not follow because its target is not an http(s)
/// URL (`Location: file:///etc/passwd`): refused like any other scheme,
/// rather than handed back as an ordinary 3xx result.
fn unfollowed_redirect(response: &reqwest::Response) -> Option<net_guard::GuardError> {
    if !matches!(response.status().as_u16(), 301 | 302 | 303 | 307 | 308) {
        return None;
    }
    let location = response.headers().get(reqwest::header::LOCATION)?.to_str().ok()?;
    let target = response.url().join(location).ok()?;
    match target.scheme() {
        "http" | "https" => None,
        scheme => Some(net_guard::GuardError::Protocol { url: target.to_string(), protocol: format!("{scheme}:") }),
    }
}

fn parse_url(raw: &str) -> Result<Url, ToolFailure> {
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Err(ToolFailure::with_code("'url' must be a non-empty string", E_INVALID_URL)
            .suggest("Provide an absolute http:// or https:// URL."));
    }
    let url = Url::parse(trimmed).map_err(|error| {
        ToolFailure::with_code(format!("Invalid URL: {trimmed} ({error})"), E_INVALID_URL)
            .suggest("Provide an absolute http:// or https:// URL, e.g. https://example.com/page.")
    })?;
    if matches!(url.scheme(), "http" | "https") && url.host_str().is_none_or(str::is_empty) {
        return Err(ToolFailure::with_code(format!("Invalid URL: {trimmed} has no host"), E_INVALID_URL)
            .suggest("Provide an absolute http:// or https:// URL with a host name."));
    }
    Ok(url)
}

/// `headers`: names to strings, numbers or booleans (stringified); `null`
/// values are left out.
fn parse_headers(input: &JsonObject) -> Result<HeaderMap, ToolFailure> {
    let mut headers = HeaderMap::new();
    let map = match input.get("headers") {
        None | Some(JsonValue::Null) => return Ok(headers),
        Some(JsonValue::Object(map)) => map,
        Some(other) => {
            return Err(ToolFailure::new(format!("'headers' must be a JSON object, got {}", json_type_name(other)))
                .suggest("Pass headers as an object, e.g. {\"Accept\": \"application/json\"}."));
        }
    };
    for (name, value) in map {
        if value.is_null() {
            continue;
        }
        let Some(text) = args::scalar_text(value) else {
            return Err(ToolFailure::new(format!(
                "header '{name}' must be a string, number or boolean, got {}",
                json_type_name(value)
            ))
            .suggest("Give each header a single string value."));
        };
        let header_name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            ToolFailure::new(format!("'{name}' is not a valid HTTP header name"))
                .suggest("Header names are tokens such as 'Accept' or 'X-Api-Key', without spaces or colons.")
        })?;
        let header_value = HeaderValue::from_str(&text).map_err(|_| {
            ToolFailure::new(format!("header '{name}' has an invalid value"))
                .suggest("Header values cannot contain line breaks or other control characters.")
        })?;
        headers.append(header_name, header_value);
    }
    Ok(headers)
}

fn parse_timeout_ms(input: &JsonObject) -> Result<f64, ToolFailure> {
    let Some(timeout_ms) = args::optional_number(input, "timeoutMs")? else {
        return Ok(DEFAULT_TIMEOUT_MS);
    };
    if !(timeout_ms > 0.0 && timeout_ms <= MAX_TIMEOUT_MS) {
        return Err(ToolFailure::new(format!(
            "'timeoutMs' must be a positive number of milliseconds up to {MAX_TIMEOUT_MS}, got {timeout_ms}"
        ))
        .suggest(format!("Leave timeoutMs out for the default of {DEFAULT_TIMEOUT_MS} ms.")));
    }
    Ok(timeout_ms)
}

fn parse_max_bytes(input: &JsonObject) -> Result<usize, ToolFailure> {
    let max_bytes = args::optional_whole(input, "maxBytes", 1, MAX_MAX_BYTES)
        .map_err(|failure| {
            failure.suggest(format!("Leave maxBytes out for the default of {DEFAULT_MAX_BYTES} bytes."))
        })?
        .unwrap_or(DEFAULT_MAX_BYTES);
    // At most 50_000_000.
    Ok(usize::try_from(max_bytes).unwrap_or(usize::MAX))
}

/// The body of a `post`: `body` as JSON (content type application/json
/// unless the headers name one), else `bodyString` as given, else none.
fn post_body(input: &JsonObject, headers: &mut HeaderMap) -> Result<Option<String>, ToolFailure> {
    let (body, content_type) = match input.get("body") {
        None | Some(JsonValue::Null) => match args::optional_string(input, "bodyString")? {
            Some(text) => (text.to_owned(), TEXT_CONTENT_TYPE),
            None => return Ok(None),
        },
        Some(value @ JsonValue::Object(_)) => (value.to_string(), "application/json"),
        Some(other) => {
            return Err(ToolFailure::new(format!("'body' must be a JSON object, got {}", json_type_name(other)))
                .suggest("Pass a JSON object as body, or send other content as bodyString."));
        }
    };
    if !headers.contains_key(CONTENT_TYPE) {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    }
    Ok(Some(body))
}

/// Response headers as an object; repeated headers are joined with `, `
/// as `fetch`'s `Headers` does.
fn response_headers(headers: &HeaderMap) -> JsonObject {
    let mut object = JsonObject::new();
    for name in headers.keys() {
        let values: Vec<String> =
            headers.get_all(name).iter().map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned()).collect();
        object.insert(name.as_str().to_owned(), JsonValue::String(values.join(", ")));
    }
    object
}

/// Reads at most `max_bytes` of the body ([`http_io::read_capped`]) and
/// decodes it lossily, without a character split at the cut.
async fn read_body(mut response: reqwest::Response, max_bytes: usize) -> Result<(String, bool), reqwest::Error> {
    let body = http_io::read_capped(&mut response, max_bytes).await?;
    let end = if body.truncated { crate::utf8::complete_prefix_len(&body.bytes) } else { body.bytes.len() };
    Ok((String::from_utf8_lossy(&body.bytes[..end]).into_owned(), body.truncated))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::Router;
    use axum::http::{HeaderMap as AxumHeaders, Method as AxumMethod, StatusCode, header};
    use axum::routing::{any, get};
    use goondan_core::codes::{E_PROTOCOL_NOT_ALLOWED, E_SSRF_BLOCKED, E_TOO_MANY_REDIRECTS};

    use super::*;
    use crate::test_http::{closed_base, listener, serve, streaming_server};
    use crate::test_support::{Executor, err, ok, run};

    fn settings(allow: &[&str]) -> Arc<BaseSettings> {
        Arc::new(BaseSettings { http_allow: allow.iter().map(|s| (*s).to_owned()).collect(), ..Default::default() })
    }

    async fn fetch(export: &str, allow: &[&str], input: JsonValue) -> HandlerResult {
        run("http-fetch", export, &settings(allow), input).await
    }

    /// Answers with the request it got: method, headers, body.
    async fn echo(method: AxumMethod, headers: AxumHeaders, body: String) -> (StatusCode, AxumHeaders, String) {
        let mut seen = serde_json::Map::new();
        for (name, value) in &headers {
            seen.insert(name.as_str().to_owned(), json!(String::from_utf8_lossy(value.as_bytes())));
        }
        let mut reply = AxumHeaders::new();
        reply.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
        reply.append("x-multi", header::HeaderValue::from_static("one"));
        reply.append("x-multi", header::HeaderValue::from_static("two"));
        let report = json!({"method": method.as_str(), "headers": seen, "body": body});
        (StatusCode::CREATED, reply, report.to_string())
    }

    /// A server answering `body` to every request, and the count of the
    /// requests it received.
    async fn counting_server(body: &'static str) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&hits);
        let addr = serve(Router::new().fallback(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async move { body }
        }))
        .await;
        (addr, hits)
    }

    fn echo_server() -> Router {
        Router::new()
            .route("/echo", any(echo))
            .route("/missing", get(|| async { (StatusCode::NOT_FOUND, "no such thing") }))
            .route("/korean", get(|| async { "가나다" }))
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    "late"
                }),
            )
    }

    fn reported(output: &JsonValue) -> JsonValue {
        let body = output["body"].as_str().unwrap_or_else(|| panic!("no body in {output}"));
        serde_json::from_str(body).unwrap_or_else(|e| panic!("echo body {body}: {e}"))
    }

    fn assert_code(result: HandlerResult, code: &str) -> ToolFailure {
        let failure = err(result);
        assert_eq!(failure.code.as_deref(), Some(code), "{failure:?}");
        assert!(failure.suggestion.is_some(), "{failure:?}");
        failure
    }

    #[tokio::test]
    async fn get_reports_status_headers_and_body() {
        let addr = serve(echo_server()).await;
        let url = format!("http://{addr}/echo?q=1");
        let output = ok(fetch(
            "get",
            &["127.0.0.1"],
            json!({"url": url, "headers": {"X-Api-Key": "k1", "X-Count": 3, "X-Ratio": 1.5, "X-Flag": true, "X-None": null}}),
        )
        .await);
        assert_eq!(output["url"], json!(url));
        assert_eq!(output["method"], json!("GET"));
        assert_eq!(output["status"], json!(201));
        assert_eq!(output["statusText"], json!("Created"));
        assert_eq!(output["truncated"], json!(false));
        assert!(output["durationMs"].is_u64(), "{output}");
        assert_eq!(output["headers"]["content-type"], json!("application/json"));
        assert_eq!(output["headers"]["x-multi"], json!("one, two"));
        let keys: Vec<&String> = output.as_object().map(|o| o.keys().collect()).unwrap_or_default();
        assert_eq!(keys, ["url", "method", "status", "statusText", "headers", "body", "truncated", "durationMs"]);

        let seen = reported(&output);
        assert_eq!(seen["method"], json!("GET"));
        assert_eq!(seen["headers"]["x-api-key"], json!("k1"));
        assert_eq!(seen["headers"]["x-count"], json!("3"));
        assert_eq!(seen["headers"]["x-ratio"], json!("1.5"));
        assert_eq!(seen["headers"]["x-flag"], json!("true"));
        assert_eq!(seen["headers"].get("x-none"), None);
        assert_eq!(seen["headers"]["user-agent"], json!(USER_AGENT));
        assert_eq!(seen["body"], json!(""));
    }

    #[tokio::test]
    async fn non_2xx_is_a_result_not_an_error() {
        let addr = serve(echo_server()).await;
        let output = ok(fetch("get", &["127.0.0.1"], json!({"url": format!("http://{addr}/missing")})).await);
        assert_eq!(output["status"], json!(404));
        assert_eq!(output["statusText"], json!("Not Found"));
        assert_eq!(output["body"], json!("no such thing"));
    }

    #[tokio::test]
    async fn post_sends_json_body_with_its_content_type() {
        let addr = serve(echo_server()).await;
        let url = format!("http://{addr}/echo");
        let body = json!({"name": "test", "n": [1, 2], "nested": {"ok": true}});
        let output = ok(fetch(
            "post",
            &["127.0.0.1"],
            json!({"url": url, "body": body, "bodyString": "ignored", "headers": {"User-Agent": "mine/1"}}),
        )
        .await);
        assert_eq!(output["method"], json!("POST"));
        let seen = reported(&output);
        assert_eq!(seen["method"], json!("POST"));
        assert_eq!(seen["headers"]["content-type"], json!("application/json"));
        assert_eq!(seen["headers"]["user-agent"], json!("mine/1"));
        let sent: JsonValue = serde_json::from_str(seen["body"].as_str().unwrap_or_default())
            .unwrap_or_else(|e| panic!("sent body: {e}"));
        assert_eq!(sent, body);

        // A content type in the headers wins, whatever its case.
        let output = ok(fetch(
            "post",
            &["127.0.0.1"],
            json!({"url": url, "body": {"a": 1}, "headers": {"content-TYPE": "application/vnd.api+json"}}),
        )
        .await);
        let seen = reported(&output);
        assert_eq!(seen["headers"]["content-type"], json!("application/vnd.api+json"));
        assert_eq!(seen["body"], json!("{\"a\":1}"));
    }

    #[tokio::test]
    async fn post_sends_body_string_as_given() {
        let addr = serve(echo_server()).await;
        let url = format!("http://{addr}/echo");
        let output = ok(fetch(
            "post",
            &["127.0.0.1"],
            json!({"url": url, "bodyString": "key=value&x=1", "headers": {"Content-Type": "application/x-www-form-urlencoded"}}),
        )
        .await);
        let seen = reported(&output);
        assert_eq!(seen["body"], json!("key=value&x=1"));
        assert_eq!(seen["headers"]["content-type"], json!("application/x-www-form-urlencoded"));

        let output = ok(fetch("post", &["127.0.0.1"], json!({"url": url, "bodyString": "plain"})).await);
        let seen = reported(&output);
        assert_eq!(seen["body"], json!("plain"));
        assert_eq!(seen["headers"]["content-type"], json!(TEXT_CONTENT_TYPE));

        // No body at all: an empty POST without a content type.
        let output = ok(fetch("post", &["127.0.0.1"], json!({"url": url})).await);
        let seen = reported(&output);
        assert_eq!(seen["body"], json!(""));
        assert_eq!(seen["headers"].get("content-type"), None);
    }

    #[tokio::test]
    async fn max_bytes_cuts_without_splitting_a_character() {
        let addr = serve(echo_server()).await;
        let url = format!("http://{addr}/korean");
        for (max_bytes, body, truncated) in
            [(4, "가", true), (5, "가", true), (6, "가나", true), (9, "가나다", false), (100, "가나다", false)]
        {
            let output = ok(fetch("get", &["127.0.0.1"], json!({"url": url, "maxBytes": max_bytes})).await);
            assert_eq!(output["body"], json!(body), "maxBytes {max_bytes}");
            assert_eq!(output["truncated"], json!(truncated), "maxBytes {max_bytes}");
        }
    }

    #[tokio::test]
    async fn a_huge_body_is_cut_while_streaming() {
        const HUNDRED_MB: usize = 100 * 1024 * 1024;
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n";
        let (addr, written) = streaming_server(head, HUNDRED_MB, Duration::ZERO).await;
        let started = Instant::now();
        let output =
            ok(fetch("get", &["127.0.0.1"], json!({"url": format!("http://{addr}/big"), "maxBytes": 100_000})).await);
        assert_eq!(output["truncated"], json!(true));
        assert_eq!(output["body"].as_str().map(str::len), Some(100_000));
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        // The client stopped reading: the server could not push 100 MB.
        let sent = tokio::time::timeout(Duration::from_secs(5), written)
            .await
            .unwrap_or_else(|_| panic!("the server is still writing: the client kept reading"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(sent < HUNDRED_MB, "server wrote {sent} bytes");
    }

    #[tokio::test]
    async fn timeout_covers_a_slow_server() {
        let addr = serve(echo_server()).await;
        let url = format!("http://{addr}/slow");
        let started = Instant::now();
        let failure =
            assert_code(fetch("get", &["127.0.0.1"], json!({"url": url, "timeoutMs": 200})).await, E_HTTP_TIMEOUT);
        assert_eq!(failure.message, format!("GET {url} timed out after 200ms"));
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn timeout_covers_a_stalled_body() {
        // Headers at once, then a body that never ends.
        let head = "HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\npartial";
        let (addr, _written) = streaming_server(head, 0, Duration::from_secs(5)).await;
        let started = Instant::now();
        let result = fetch("post", &["127.0.0.1"], json!({"url": format!("http://{addr}/"), "timeoutMs": 300})).await;
        let failure = assert_code(result, E_HTTP_TIMEOUT);
        assert!(failure.message.starts_with("POST http://127.0.0.1:"), "{}", failure.message);
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn other_schemes_are_refused() {
        for export in ["get", "post"] {
            for url in ["file:///etc/passwd", "ftp://example.com/file", "data:text/html,<script>alert(1)</script>"] {
                let failure = assert_code(fetch(export, &[], json!({"url": url})).await, E_PROTOCOL_NOT_ALLOWED);
                assert!(failure.message.contains("Protocol not allowed"), "{}", failure.message);
                assert!(failure.message.contains("Only http: and https: are allowed"), "{}", failure.message);
            }
        }
        let failure =
            assert_code(fetch("get", &[], json!({"url": "javascript:alert(1)"})).await, E_PROTOCOL_NOT_ALLOWED);
        assert!(failure.message.contains("javascript:"), "{}", failure.message);
    }

    #[tokio::test]
    async fn unusable_urls_are_refused() {
        for url in ["", "   ", "not-a-url", "http://", "http://:80/"] {
            let failure = assert_code(fetch("get", &[], json!({"url": url})).await, E_INVALID_URL);
            assert!(failure.message.contains("URL") || failure.message.contains("'url'"), "{}", failure.message);
        }
        for input in [json!({}), json!({"url": ""})] {
            let failure = assert_code(fetch("get", &[], input).await, E_INVALID_URL);
            assert_eq!(failure.message, "'url' must be a non-empty string");
        }
    }

    #[tokio::test]
    async fn ssrf_targets_are_refused_before_connecting() {
        let (addr, hits) = counting_server("should not be reached").await;
        let port = addr.port();
        for url in [
            format!("http://127.0.0.1:{port}/"),
            format!("http://2130706433:{port}/"),
            format!("http://[::1]:{port}/"),
            format!("http://[::ffff:127.0.0.1]:{port}/"),
            format!("http://localhost:{port}/"),
            // Never connected to: refused by the guard on the literal.
            "http://10.0.0.1/".to_owned(),
            "http://169.254.169.254/latest/meta-data".to_owned(),
        ] {
            for export in ["get", "post"] {
                let failure = assert_code(fetch(export, &[], json!({"url": url})).await, E_SSRF_BLOCKED);
                assert!(failure.message.contains("SSRF guard"), "{}", failure.message);
                assert!(failure.message.contains(&format!("{} ", export.to_uppercase())), "{}", failure.message);
                assert!(failure.suggestion.is_some_and(|s| s.contains("GOONDAN_HTTP_ALLOW")));
            }
        }
        let failure = err(fetch("get", &[], json!({"url": format!("http://localhost:{port}/")})).await);
        assert!(failure.message.contains("resolved only to non-public addresses"), "{}", failure.message);
        let failure = err(fetch("get", &[], json!({"url": "http://169.254.169.254/latest/meta-data"})).await);
        assert!(failure.message.contains("metadata"), "{}", failure.message);
        assert_eq!(hits.load(Ordering::SeqCst), 0);

        // An allow-list for something else does not open the rest.
        let failure = err(fetch("get", &["192.168.0.0/16", "other.example"], json!({"url": "http://10.0.0.1/"})).await);
        assert_eq!(failure.code.as_deref(), Some(E_SSRF_BLOCKED));
    }

    #[tokio::test]
    async fn the_allow_list_admits_names_addresses_and_ranges() {
        let addr = serve(echo_server()).await;
        let port = addr.port();
        for (allow, url) in [
            (vec!["127.0.0.0/8"], format!("http://127.0.0.1:{port}/echo")),
            (vec!["127.0.0.1"], format!("http://127.0.0.1:{port}/echo")),
            (vec!["localhost"], format!("http://localhost:{port}/echo")),
            (vec!["127.0.0.0/8"], format!("http://localhost:{port}/echo")),
        ] {
            let output = ok(fetch("get", &allow, json!({"url": url})).await);
            assert_eq!(output["status"], json!(201), "{allow:?} {url}");
        }
    }

    #[tokio::test]
    async fn redirects_are_checked_on_every_hop() {
        let (internal, hits) = counting_server("internal secret").await;
        let to_internal = format!("http://127.0.0.1:{}/secret", internal.port());
        let (listener, public) = listener().await;
        let same_host = format!("http://localhost:{}/echo", public.port());
        let redirect = |target: String| move || async move { (StatusCode::FOUND, [(header::LOCATION, target)]) };
        let router = echo_server()
            .route("/to-internal", get(redirect(to_internal.clone())))
            .route("/to-file", get(redirect("file:///etc/passwd".to_owned())))
            .route("/to-metadata", get(redirect("http://169.254.169.254/latest/meta-data".to_owned())))
            .route("/to-echo", get(redirect(same_host)))
            .route("/loop", get(redirect("/loop".to_owned())));
        tokio::spawn(async move { axum::serve(listener, router).await });
        let base = format!("http://localhost:{}", public.port());

        // Reached as "localhost" (allowed by name); the redirect to the
        // 127.0.0.1 literal is not allowed.
        let failure = assert_code(
            fetch("get", &["localhost"], json!({"url": format!("{base}/to-internal")})).await,
            E_SSRF_BLOCKED,
        );
        assert!(failure.message.contains(&to_internal), "{}", failure.message);
        assert!(failure.message.contains("redirected from"), "{}", failure.message);
        let failure = assert_code(
            fetch("get", &["localhost"], json!({"url": format!("{base}/to-metadata")})).await,
            E_SSRF_BLOCKED,
        );
        assert!(failure.message.contains("169.254.169.254"), "{}", failure.message);
        assert_eq!(hits.load(Ordering::SeqCst), 0);

        assert_code(
            fetch("get", &["localhost"], json!({"url": format!("{base}/to-file")})).await,
            E_PROTOCOL_NOT_ALLOWED,
        );
        let failure = assert_code(
            fetch("get", &["localhost"], json!({"url": format!("{base}/loop")})).await,
            E_TOO_MANY_REDIRECTS,
        );
        assert!(failure.message.contains("too many redirects"), "{}", failure.message);

        // An allowed hop is followed, and the result names where it ended.
        let output = ok(fetch("get", &["localhost"], json!({"url": format!("{base}/to-echo")})).await);
        assert_eq!(output["status"], json!(201));
        assert_eq!(output["url"], json!(format!("{base}/echo")));
    }

    #[tokio::test]
    async fn out_of_range_and_semantic_errors() {
        let url = "http://127.0.0.1:9/";
        for (key, value) in [
            ("timeoutMs", json!(0)),
            ("timeoutMs", json!(-5)),
            ("timeoutMs", json!(600_001)),
            ("maxBytes", json!(0)),
            ("maxBytes", json!(-1)),
            ("maxBytes", json!(1.5)),
            ("maxBytes", json!(50_000_001)),
        ] {
            let failure = err(fetch("get", &["127.0.0.1"], json!({"url": url, key: value})).await);
            assert_eq!(failure.code, None, "{failure:?}");
            assert!(failure.message.starts_with(&format!("'{key}' must be")), "{}", failure.message);
            assert!(failure.suggestion.is_some());
        }
        for (headers, expected) in [
            (json!({"X-Obj": {"a": 1}}), "header 'X-Obj' must be a string, number or boolean, got object"),
            (json!({"X-Arr": [1]}), "header 'X-Arr' must be a string, number or boolean, got array"),
            (json!({"bad name": "v"}), "'bad name' is not a valid HTTP header name"),
            (json!({"X-Inject": "a\r\nHost: evil"}), "header 'X-Inject' has an invalid value"),
            (json!("not-an-object"), "'headers' must be a JSON object, got string"),
        ] {
            let failure = err(fetch("get", &["127.0.0.1"], json!({"url": url, "headers": headers})).await);
            assert_eq!(failure.message, expected);
        }
        let failure = err(fetch("post", &["127.0.0.1"], json!({"url": url, "body": "{}"})).await);
        assert_eq!(failure.message, "'body' must be a JSON object, got string");
        let failure = err(fetch("get", &[], json!({"url": 12345})).await);
        assert_eq!(failure.message, "'url' must be a string, got integer");
    }

    #[tokio::test]
    async fn connection_failures_name_the_url() {
        let url = format!("{}/", closed_base().await);
        let failure = assert_code(fetch("get", &["127.0.0.1"], json!({"url": url})).await, E_HTTP_REQUEST);
        assert!(failure.message.starts_with(&format!("GET {url} failed: could not connect")), "{}", failure.message);
    }

    #[test]
    fn unknown_export() {
        assert!(handler("put", &settings(&[])).is_none());
    }

    #[tokio::test]
    async fn through_the_executor() {
        let addr = serve(echo_server()).await;
        let executor = Executor::new("http-fetch", &settings(&["127.0.0.1"]));
        let run = |export: &'static str, args: JsonValue| executor.run(export, args);

        let result = run("post", json!({"url": format!("http://{addr}/echo"), "body": {"a": 1}})).await;
        let Some(output) = result.output else { panic!("no output: {:?}", result.error) };
        assert_eq!(output["status"], json!(201));

        // The manifest's schema rejects missing, wrong-typed and unknown
        // arguments before the handler runs.
        for (name, args) in [
            ("get", json!({})),
            ("get", json!({"url": 5})),
            ("get", json!({"url": "http://x/", "headers": "a: b"})),
            ("get", json!({"url": "http://x/", "timeoutMs": "100"})),
            ("get", json!({"url": "http://x/", "maxBytes": true})),
            ("get", json!({"url": "http://x/", "method": "DELETE"})),
            ("post", json!({"url": "http://x/", "body": "text"})),
            ("post", json!({"url": "http://x/", "bodyString": {"a": 1}})),
        ] {
            let result = run(name, args.clone()).await;
            assert_eq!(result.error_code(), Some("E_TOOL_INVALID_ARGS"), "{name} {args}: {result:?}");
        }

        // A guard refusal reaches the model as a structured error.
        let result = run("get", json!({"url": "http://169.254.169.254/latest/meta-data"})).await;
        assert_eq!(result.error_code(), Some(E_SSRF_BLOCKED));
        let error = result.error.unwrap_or_else(|| panic!("no error"));
        assert!(error.message.contains("169.254.169.254"), "{}", error.message);
        assert!(error.suggestion.is_some_and(|s| s.contains("GOONDAN_HTTP_ALLOW")));
    }
}
