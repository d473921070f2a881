//! The HTTP connectors (`slack`, `webhook`, `github`, `discord`) through
//! their public start function: real requests over 127.0.0.1, signed as
//! each provider signs them, into a `MemorySink` (or a sink that fails or
//! waits, to see what is acknowledged when).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use ed25519_dalek::{Signer as _, SigningKey};
use goondan_ingress::connectors;
use goondan_ingress::{
    Accepted, ConnectorContext, ConnectorError, Delivery, EventSink, MemorySink, RunningConnector, SecretMap, SinkError,
};
use goondan_test_support::base64;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

type TestResult = Result<(), Box<dyn std::error::Error>>;

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_str(&self.body)
    }

    fn error_code(&self) -> Option<String> {
        self.json().ok()?.pointer("/error/code")?.as_str().map(str::to_owned)
    }
}

/// One HTTP/1.1 request on its own connection, read to the end.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> Result<Reply, Box<dyn std::error::Error>> {
    let mut stream = TcpStream::connect(addr).await?;
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8(raw)?;
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Err(format!("no header end in {text:?}").into());
    };
    let mut lines = head.lines();
    let status = lines.next().and_then(|line| line.split_whitespace().nth(1)).ok_or("no status line")?.parse()?;
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_owned(), value.trim().to_owned()))
        .collect();
    Ok(Reply { status, headers, body: body.to_owned() })
}

async fn post(addr: SocketAddr, headers: &[(&str, String)], body: &[u8]) -> Result<Reply, Box<dyn std::error::Error>> {
    send(addr, "POST", "/", headers, body).await
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn hmac_hex(secret: &str, parts: &[&[u8]]) -> Result<String, Box<dyn std::error::Error>> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes())?;
    for part in parts {
        mac.update(part);
    }
    Ok(hex::encode(mac.finalize().into_bytes()))
}

struct Started {
    addr: SocketAddr,
    running: RunningConnector,
    stop: CancellationToken,
}

impl Started {
    /// Stops it the way the service does and checks that it ends cleanly.
    async fn stop(self) -> TestResult {
        self.stop.cancel();
        let ended = tokio::time::timeout(Duration::from_secs(10), self.running.task).await??;
        ended.map_err(Into::into)
    }
}

async fn start_with(
    connector: &str,
    config: &[(&str, &str)],
    secrets: &[(&str, &str)],
    sink: Arc<dyn EventSink>,
) -> Result<Started, ConnectorError> {
    let mut config: BTreeMap<String, String> = config.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    config.entry("PORT".to_owned()).or_insert_with(|| "0".to_owned());
    let stop = CancellationToken::new();
    let ctx = ConnectorContext {
        connection: format!("{connector}-conn"),
        connector: connector.to_owned(),
        config,
        secrets: SecretMap::new(secrets.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
        sink,
        stop: stop.clone(),
        input: None,
    };
    let Some(start) = connectors::native(connector) else {
        return Err(ConnectorError::Failed { connection: ctx.connection, message: "not native".into() });
    };
    let running = start(ctx).await?;
    let Some(addr) = running.listening.first().copied() else {
        return Err(ConnectorError::Failed { connection: connector.into(), message: "listens nowhere".into() });
    };
    Ok(Started { addr, running, stop })
}

// ───────────────────────────── slack ─────────────────────────────

const SLACK_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";

fn slack_headers(body: &[u8], timestamp: u64) -> Result<Vec<(&'static str, String)>, Box<dyn std::error::Error>> {
    let ts = timestamp.to_string();
    let signature = hmac_hex(SLACK_SECRET, &[b"v0:", ts.as_bytes(), b":", body])?;
    Ok(vec![
        ("Content-Type", "application/json".to_owned()),
        ("X-Slack-Request-Timestamp", ts),
        ("X-Slack-Signature", format!("v0={signature}")),
    ])
}

fn slack_mention(event_id: &str) -> Vec<u8> {
    serde_json::json!({
        "type": "event_callback",
        "event_id": event_id,
        "event": {"type": "app_mention", "channel": "C42", "ts": "1700000000.000100", "user": "U7", "text": "<@B1> hello"}
    })
    .to_string()
    .into_bytes()
}

async fn slack(sink: Arc<dyn EventSink>) -> Result<Started, ConnectorError> {
    start_with("slack", &[], &[("SLACK_SIGNING_SECRET", SLACK_SECRET)], sink).await
}

#[tokio::test]
async fn slack_stores_a_signed_event_before_answering_and_a_retry_only_once() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let started = slack(sink.clone()).await?;
    let body = slack_mention("Ev01");
    let reply = post(started.addr, &slack_headers(&body, now())?, &body).await?;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()?, serde_json::json!({"ok": true}));
    let stored = sink.stored();
    let [delivery] = stored.as_slice() else { panic!("one stored event, got {stored:?}") };
    assert_eq!(delivery.key.as_deref(), Some("Ev01"));
    assert_eq!(delivery.event.name, "app_mention");
    assert_eq!(delivery.event.instance_key, "slack:C42:1700000000.000100");
    assert_eq!(delivery.event.message.input_text(), "<@B1> hello");
    let properties: Vec<(&str, &str)> =
        delivery.event.properties.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(properties, [("channel_id", "C42"), ("ts", "1700000000.000100"), ("user_id", "U7")]);

    // Slack retries with the same event_id (and a newer timestamp).
    let mut retry = slack_headers(&body, now())?;
    retry.push(("X-Slack-Retry-Num", "1".to_owned()));
    retry.push(("X-Slack-Retry-Reason", "http_timeout".to_owned()));
    let reply = post(started.addr, &retry, &body).await?;
    assert_eq!(reply.status, 200);
    assert_eq!(sink.stored().len(), 1, "a retry is a duplicate");
    started.stop().await
}

#[tokio::test]
async fn slack_refuses_missing_bad_and_stale_signatures() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let started = slack(sink.clone()).await?;
    let body = slack_mention("Ev02");

    let unsigned = post(started.addr, &[("Content-Type", "application/json".to_owned())], &body).await?;
    assert_eq!((unsigned.status, unsigned.error_code().as_deref()), (401, Some("unauthorized")));

    let mut tampered = slack_headers(&body, now())?;
    tampered[2].1 = format!("v0={}", hmac_hex("another secret", &[b"v0:", now().to_string().as_bytes(), b":", &body])?);
    assert_eq!(post(started.addr, &tampered, &body).await?.status, 401);

    let other_body = slack_mention("Ev03");
    assert_eq!(
        post(started.addr, &slack_headers(&body, now())?, &other_body).await?.status,
        401,
        "signed another body"
    );

    let stale = slack_headers(&body, now() - 6 * 60)?;
    assert_eq!(post(started.addr, &stale, &body).await?.status, 401);
    let future = slack_headers(&body, now() + 6 * 60)?;
    assert_eq!(post(started.addr, &future, &body).await?.status, 401);

    assert!(sink.stored().is_empty());
    started.stop().await
}

#[tokio::test]
async fn slack_answers_url_verification_only_when_signed() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let started = slack(sink.clone()).await?;
    let body = br#"{"token":"t","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let reply = post(started.addr, &slack_headers(body, now())?, body).await?;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P");
    assert!(reply.header("content-type").is_some_and(|t| t.starts_with("text/plain")));
    assert_eq!(post(started.addr, &[], body).await?.status, 401);
    assert!(sink.stored().is_empty());
    started.stop().await
}

#[tokio::test]
async fn slack_rejects_malformed_oversized_and_misaddressed_requests() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let config = [("SLACK_WEBHOOK_PATH", "slack/events/"), ("SLACK_MAX_BODY_BYTES", "1024")];
    let started = start_with("slack", &config, &[("SLACK_SIGNING_SECRET", SLACK_SECRET)], sink.clone()).await?;
    let addr = started.addr;

    let malformed = b"{\"type\": \"event_callback\", ";
    let reply = send(addr, "POST", "/slack/events", &slack_headers(malformed, now())?, malformed).await?;
    assert_eq!((reply.status, reply.error_code().as_deref()), (400, Some("bad_request")));

    let big = vec![b' '; 2048];
    let reply = send(addr, "POST", "/slack/events", &slack_headers(&big, now())?, &big).await?;
    assert_eq!((reply.status, reply.error_code().as_deref()), (413, Some("payload_too_large")));

    let body = slack_mention("Ev04");
    let reply = send(addr, "POST", "/elsewhere", &slack_headers(&body, now())?, &body).await?;
    assert_eq!((reply.status, reply.error_code().as_deref()), (404, Some("not_found")));
    let reply = send(addr, "GET", "/slack/events", &[], b"").await?;
    assert_eq!(reply.status, 405);
    assert_eq!(reply.header("allow"), Some("POST"));

    // The path matches with a trailing slash too, as in the original.
    let reply = send(addr, "POST", "/slack/events/", &slack_headers(&body, now())?, &body).await?;
    assert_eq!(reply.status, 200);
    assert_eq!(sink.stored().len(), 1);
    started.stop().await
}

#[tokio::test]
async fn slack_ignores_what_the_original_ignores_with_200() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let started = start_with(
        "slack",
        &[("SLACK_MESSAGE_MODE", "mention")],
        &[("SLACK_SIGNING_SECRET", SLACK_SECRET)],
        sink.clone(),
    )
    .await?;
    let message = serde_json::json!({"type": "event_callback", "event_id": "Ev05",
        "event": {"type": "message", "channel": "D1", "ts": "1.0", "text": "hi"}})
    .to_string();
    let reply = post(started.addr, &slack_headers(message.as_bytes(), now())?, message.as_bytes()).await?;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()?, serde_json::json!({"ok": true, "ignored": true}));
    assert!(sink.stored().is_empty());
    started.stop().await
}

// ──────────────────────── acknowledgement ────────────────────────

/// A sink whose store fails, as a full disk would.
struct FailingSink;

#[async_trait]
impl EventSink for FailingSink {
    async fn accept(&self, _: Vec<Delivery>) -> Result<Vec<Accepted>, SinkError> {
        Err(SinkError::Storage("disk full".into()))
    }
}

/// A sink that stores only once it is let go.
struct GatedSink {
    inner: MemorySink,
    entered: Notify,
    release: Notify,
}

#[async_trait]
impl EventSink for GatedSink {
    async fn accept(&self, deliveries: Vec<Delivery>) -> Result<Vec<Accepted>, SinkError> {
        self.entered.notify_one();
        self.release.notified().await;
        self.inner.accept(deliveries).await
    }
}

#[tokio::test]
async fn a_closed_sink_is_503_with_retry_after_and_a_storage_failure_500() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    sink.close();
    let started = slack(sink.clone()).await?;
    let body = slack_mention("Ev06");
    let reply = post(started.addr, &slack_headers(&body, now())?, &body).await?;
    assert_eq!(reply.status, 503);
    assert!(reply.header("retry-after").is_some_and(|s| s.parse::<u64>().is_ok()));
    started.stop().await?;

    let started = slack(Arc::new(FailingSink)).await?;
    let reply = post(started.addr, &slack_headers(&body, now())?, &body).await?;
    assert_eq!((reply.status, reply.error_code().as_deref()), (500, Some("storage")));
    assert!(!reply.body.contains("disk full"), "storage details stay in the log");
    started.stop().await
}

#[tokio::test]
async fn no_answer_before_the_store_and_a_stop_lets_the_request_finish() -> TestResult {
    let sink = Arc::new(GatedSink { inner: MemorySink::new(), entered: Notify::new(), release: Notify::new() });
    let started = slack(sink.clone()).await?;
    let addr = started.addr;
    let body = slack_mention("Ev07");
    let headers = slack_headers(&body, now())?;
    let request = tokio::spawn(async move { post(addr, &headers, &body).await.map_err(|e| e.to_string()) });
    sink.entered.notified().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!request.is_finished(), "answered before the sink stored the event");

    started.stop.cancel();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!started.running.task.is_finished(), "stopped with a request in flight");
    sink.release.notify_one();
    let reply = request.await??;
    assert_eq!(reply.status, 200);
    assert_eq!(sink.inner.stored().len(), 1);
    tokio::time::timeout(Duration::from_secs(10), started.running.task).await???;
    assert!(TcpStream::connect(addr).await.is_err(), "still listening after the stop");
    Ok(())
}

// ─────────────────────────── start-up ───────────────────────────

#[tokio::test]
async fn a_port_in_use_is_a_bind_error_naming_the_connection() -> TestResult {
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = taken.local_addr()?.port().to_string();
    let result = start_with("slack", &[("SLACK_WEBHOOK_PORT", &port)], &[], Arc::new(MemorySink::new())).await;
    let Err(error) = result else { panic!("started on a port in use") };
    assert!(matches!(error, ConnectorError::Bind { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("slack-conn") && message.contains(&format!("127.0.0.1:{port}")), "{message}");
    Ok(())
}

#[tokio::test]
async fn connectors_listen_on_loopback_unless_configured() -> TestResult {
    for name in ["slack", "webhook", "github", "discord"] {
        let started = start_with(name, &[], &[], Arc::new(MemorySink::new())).await?;
        assert_eq!(started.addr.ip().to_string(), "127.0.0.1", "{name}");
        assert_eq!(started.running.listening.len(), 1);
        started.stop().await?;
    }
    Ok(())
}

#[tokio::test]
async fn an_unsigned_endpoint_is_refused_on_a_reachable_address_and_bad_config_names_its_key() -> TestResult {
    let keys = [
        ("slack", "SLACK_SIGNING_SECRET"),
        ("webhook", "WEBHOOK_SECRET"),
        ("github", "GITHUB_WEBHOOK_SECRET"),
        ("discord", "DISCORD_PUBLIC_KEY"),
    ];
    for (name, key) in keys {
        let result = start_with(name, &[("HOST", "0.0.0.0")], &[], Arc::new(MemorySink::new())).await;
        let Err(error) = result else { panic!("{name} started unsigned on 0.0.0.0") };
        assert!(error.to_string().contains(key), "{error}");
    }
    let bad = [
        ("slack", ("SLACK_WEBHOOK_PORT", "eighty")),
        ("webhook", ("WEBHOOK_MAX_BODY_BYTES", "0")),
        ("discord", ("DISCORD_PUBLIC_KEY", "abcd")),
    ];
    for (name, (key, value)) in bad {
        let result = start_with(name, &[(key, value)], &[], Arc::new(MemorySink::new())).await;
        let Err(error) = result else { panic!("{name} started with {key}={value}") };
        assert!(matches!(error, ConnectorError::Config { .. }) && error.to_string().contains(key), "{error}");
    }
    Ok(())
}

#[test]
fn the_native_table_has_the_http_connectors() {
    for name in ["slack", "webhook", "github", "discord"] {
        assert!(connectors::native(name).is_some(), "{name}");
        assert!(connectors::names().any(|known| known == name), "{name}");
    }
}

// ──────────────────────────── webhook ────────────────────────────

const WEBHOOK_SECRET: &str = "whsec-test";

#[tokio::test]
async fn webhook_stores_signed_json_keyed_by_what_is_signed() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let started = start_with("webhook", &[], &[("WEBHOOK_SECRET", WEBHOOK_SECRET)], sink.clone()).await?;
    let body = br#"{"text":"deploy done","instanceKey":"ops:1","properties":{"route":"ops","attempt":2}}"#;
    let signed = vec![
        ("X-Signature-256", format!("sha256={}", hmac_hex(WEBHOOK_SECRET, &[body])?)),
        ("X-Delivery-Id", "d-1".to_owned()),
    ];
    for _ in 0..2 {
        let reply = post(started.addr, &signed, body).await?;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let stored = sink.stored();
    let [delivery] = stored.as_slice() else { panic!("stored once, got {stored:?}") };
    // X-Delivery-Id is not signed: the body's digest is the key.
    assert_eq!(delivery.key, Some(body_key(body)));
    assert_eq!(delivery.event.name, "webhook_message");
    assert_eq!(delivery.event.instance_key, "ops:1");
    assert_eq!(delivery.event.message.input_text(), "deploy done");
    assert_eq!(delivery.event.properties.get("route").map(String::as_str), Some("ops"));
    assert_eq!(delivery.event.properties.get("attempt").map(String::as_str), Some("2"));

    // A timestamped signature: keyed by the body's digest and the timestamp.
    let ts = now().to_string();
    let other = br#"{"event":"alert","text":"cpu"}"#;
    let stamped = vec![
        ("X-Signature-256", format!("sha256={}", hmac_hex(WEBHOOK_SECRET, &[ts.as_bytes(), b".", other])?)),
        ("X-Signature-Timestamp", ts.clone()),
    ];
    assert_eq!(post(started.addr, &stamped, other).await?.status, 200);
    assert_eq!(post(started.addr, &stamped, other).await?.status, 200);
    let stored = sink.stored();
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[1].key, Some(format!("{}@{ts}", body_key(other))));
    assert_eq!(stored[1].event.name, "alert");

    // Bad, missing and stale signatures store nothing.
    let bad = vec![("X-Signature-256", format!("sha256={}", hmac_hex("nope", &[body])?))];
    assert_eq!(post(started.addr, &bad, body).await?.status, 401);
    assert_eq!(post(started.addr, &[], body).await?.status, 401);
    let old = (now() - 600).to_string();
    let stale = vec![
        ("X-Signature-256", format!("sha256={}", hmac_hex(WEBHOOK_SECRET, &[old.as_bytes(), b".", other])?)),
        ("X-Signature-Timestamp", old),
    ];
    assert_eq!(post(started.addr, &stale, other).await?.status, 401);
    let malformed = b"[1, 2]";
    let signed_malformed = vec![("X-Signature-256", format!("sha256={}", hmac_hex(WEBHOOK_SECRET, &[malformed])?))];
    assert_eq!(post(started.addr, &signed_malformed, malformed).await?.status, 400);
    assert_eq!(sink.stored().len(), 2);
    started.stop().await
}

#[tokio::test]
async fn webhook_without_a_secret_on_loopback_accepts_an_array_as_several_events() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let started = start_with("webhook", &[], &[], sink.clone()).await?;
    let body = br#"[{"text":"one"},{"text":"two","instanceKey":"k2"}]"#;
    let reply = post(started.addr, &[("Idempotency-Key", "batch-9".to_owned())], body).await?;
    assert_eq!(reply.status, 200);
    let keys: Vec<Option<String>> = sink.stored().into_iter().map(|d| d.key).collect();
    assert_eq!(keys, [Some("batch-9#0".to_owned()), Some("batch-9#1".to_owned())]);
    assert_eq!(post(started.addr, &[], b"not json").await?.status, 400);
    started.stop().await
}

// ──────────────────────────── github ────────────────────────────

const GITHUB_SECRET: &str = "It's a Secret to Everybody";

fn github_headers(
    event: &str,
    delivery: &str,
    body: &[u8],
) -> Result<Vec<(&'static str, String)>, Box<dyn std::error::Error>> {
    Ok(vec![
        ("Content-Type", "application/json".to_owned()),
        ("X-GitHub-Event", event.to_owned()),
        ("X-GitHub-Delivery", delivery.to_owned()),
        ("X-Hub-Signature-256", format!("sha256={}", hmac_hex(GITHUB_SECRET, &[body])?)),
    ])
}

#[tokio::test]
async fn github_checks_the_published_example_signature() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let started = start_with("github", &[], &[("GITHUB_WEBHOOK_SECRET", GITHUB_SECRET)], sink.clone()).await?;
    // GitHub's documented example: the signature is right, so the request
    // gets past the check, and is then refused as not JSON.
    let published = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17".to_owned();
    let headers = vec![("X-GitHub-Event", "push".to_owned()), ("X-Hub-Signature-256", published)];
    assert_eq!(post(started.addr, &headers, b"Hello, World!").await?.status, 400);
    assert_eq!(post(started.addr, &headers, b"Hello, World?").await?.status, 401);
    assert_eq!(post(started.addr, &headers[..1], b"Hello, World!").await?.status, 401);
    assert!(sink.stored().is_empty());
    started.stop().await
}

#[tokio::test]
async fn github_events_become_the_manifest_events_and_ping_emits_nothing() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let started = start_with("github", &[], &[("GITHUB_WEBHOOK_SECRET", GITHUB_SECRET)], sink.clone()).await?;
    let ping = br#"{"zen":"Keep it logically awesome.","hook_id":1}"#;
    let reply = post(started.addr, &github_headers("ping", "p-1", ping)?, ping).await?;
    assert_eq!(reply.status, 200);
    assert!(sink.stored().is_empty());

    let repo = r#""repository":{"full_name":"octo/hello"},"sender":{"login":"octocat"}"#;
    let cases = [
        (
            "push",
            format!(r#"{{"ref":"refs/heads/main","head_commit":{{"message":"Fix it"}},{repo}}}"#),
            "github_push",
            "Fix it",
        ),
        (
            "pull_request",
            format!(r#"{{"action":"opened","pull_request":{{"number":12,"title":"Add X"}},{repo}}}"#),
            "github_pull_request",
            "Add X",
        ),
        (
            "issues",
            format!(r#"{{"action":"opened","issue":{{"number":3,"title":"Bug"}},{repo}}}"#),
            "github_issue",
            "Bug",
        ),
        (
            "issue_comment",
            format!(r#"{{"action":"created","issue":{{"number":3}},"comment":{{"body":"+1"}},{repo}}}"#),
            "github_issue_comment",
            "+1",
        ),
    ];
    for (index, (kind, body, name, text)) in cases.iter().enumerate() {
        let delivery = format!("72d3162e-cc78-11e3-81ab-4c9367dc095{index}");
        let reply = post(started.addr, &github_headers(kind, &delivery, body.as_bytes())?, body.as_bytes()).await?;
        assert_eq!(reply.status, 200, "{kind}: {}", reply.body);
        let stored = sink.stored();
        let Some(last) = stored.last() else { panic!("{kind} stored nothing") };
        // X-GitHub-Delivery is not signed: the body (which is) is the key.
        assert_eq!(last.key, Some(body_key(body.as_bytes())));
        assert_eq!((last.event.name.as_str(), last.event.message.input_text().as_str()), (*name, *text));
        assert_eq!(last.event.instance_key, "github:octo/hello");
        assert_eq!(last.event.properties.get("repo").map(String::as_str), Some("octo/hello"));
        assert_eq!(last.event.properties.get("sender").map(String::as_str), Some("octocat"));
    }
    let stored = sink.stored();
    assert_eq!(stored.len(), 4);
    assert_eq!(stored[1].event.properties.get("number").map(String::as_str), Some("12"));
    assert_eq!(stored[0].event.properties.get("ref").map(String::as_str), Some("refs/heads/main"));

    // A redelivery (same X-GitHub-Delivery, same body) is acknowledged and not stored again.
    let (kind, body, _, _) = &cases[0];
    let redelivery = github_headers(kind, "72d3162e-cc78-11e3-81ab-4c9367dc0950", body.as_bytes())?;
    assert_eq!(post(started.addr, &redelivery, body.as_bytes()).await?.status, 200);
    assert_eq!(sink.stored().len(), 4);
    started.stop().await
}

// ──────────────────────────── discord ────────────────────────────

/// RFC 8032 section 7.1, TEST 1.
const DISCORD_SECRET_KEY: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
const DISCORD_PUBLIC_KEY: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";

fn discord_headers(body: &[u8], timestamp: u64) -> Result<Vec<(&'static str, String)>, Box<dyn std::error::Error>> {
    let secret: [u8; 32] = hex::decode(DISCORD_SECRET_KEY)?.try_into().map_err(|_| "key length")?;
    let signer = SigningKey::from_bytes(&secret);
    assert_eq!(hex::encode(signer.verifying_key().to_bytes()), DISCORD_PUBLIC_KEY, "RFC 8032 TEST 1");
    let ts = timestamp.to_string();
    let signature = signer.sign(&[ts.as_bytes(), body].concat());
    Ok(vec![
        ("Content-Type", "application/json".to_owned()),
        ("X-Signature-Ed25519", hex::encode(signature.to_bytes())),
        ("X-Signature-Timestamp", ts),
    ])
}

#[tokio::test]
async fn discord_answers_ping_and_stores_commands_and_components_deferred() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let started = start_with("discord", &[("DISCORD_PUBLIC_KEY", DISCORD_PUBLIC_KEY)], &[], sink.clone()).await?;
    let ping = br#"{"id":"1","type":1,"application_id":"A"}"#;
    let reply = post(started.addr, &discord_headers(ping, now())?, ping).await?;
    assert_eq!((reply.status, reply.json()?), (200, serde_json::json!({"type": 1})));
    assert!(sink.stored().is_empty());

    let command = br#"{"id":"1100","type":2,"token":"itok","channel_id":"CH","guild_id":"G","member":{"user":{"id":"U1","username":"ann"}},"data":{"name":"ask"}}"#;
    for _ in 0..2 {
        let reply = post(started.addr, &discord_headers(command, now())?, command).await?;
        assert_eq!((reply.status, reply.json()?), (200, serde_json::json!({"type": 5})));
    }
    let component = br#"{"id":"1200","type":3,"token":"itok2","channel_id":"CH","user":{"id":"U2"},"data":{"custom_id":"approve"}}"#;
    let reply = post(started.addr, &discord_headers(component, now())?, component).await?;
    assert_eq!((reply.status, reply.json()?), (200, serde_json::json!({"type": 6})));

    let stored = sink.stored();
    let [slash, button] = stored.as_slice() else { panic!("two stored events, got {stored:?}") };
    assert_eq!((slash.key.as_deref(), slash.event.name.as_str()), (Some("1100"), "slash_command"));
    assert_eq!(slash.event.message.input_text(), "/ask");
    assert_eq!(slash.event.instance_key, "discord:CH");
    assert_eq!(slash.event.properties.get("command_name").map(String::as_str), Some("ask"));
    assert_eq!(slash.event.properties.get("guild_id").map(String::as_str), Some("G"));
    assert_eq!((button.key.as_deref(), button.event.name.as_str()), (Some("1200"), "component_interaction"));
    assert_eq!(button.event.properties.get("custom_id").map(String::as_str), Some("approve"));
    started.stop().await
}

#[tokio::test]
async fn discord_refuses_bad_missing_and_stale_signatures_even_for_ping() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let started = start_with("discord", &[], &[("DISCORD_PUBLIC_KEY", DISCORD_PUBLIC_KEY)], sink.clone()).await?;
    let ping = br#"{"id":"1","type":1}"#;
    assert_eq!(post(started.addr, &[], ping).await?.status, 401);
    let mut wrong = discord_headers(ping, now())?;
    wrong[1].1 = discord_headers(b"{}", now())?[1].1.clone();
    assert_eq!(post(started.addr, &wrong, ping).await?.status, 401);
    assert_eq!(post(started.addr, &discord_headers(ping, now() - 600)?, ping).await?.status, 401);
    let command = br#"{"id":"1300","type":2,"data":{"name":"x"}}"#;
    let mut replayed_at_other_time = discord_headers(command, now())?;
    replayed_at_other_time[2].1 = (now() + 1).to_string();
    assert_eq!(post(started.addr, &replayed_at_other_time, command).await?.status, 401);
    let malformed = b"{\"type\":";
    assert_eq!(post(started.addr, &discord_headers(malformed, now())?, malformed).await?.status, 400);
    assert!(sink.stored().is_empty());
    started.stop().await
}

#[tokio::test]
async fn a_stop_is_not_held_up_by_a_client_that_never_finishes_its_request() -> TestResult {
    let started = slack(Arc::new(MemorySink::new())).await?;
    let mut slow = TcpStream::connect(started.addr).await?;
    slow.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"type\":").await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let begun = std::time::Instant::now();
    started.stop().await?;
    assert!(begun.elapsed() < Duration::from_secs(8), "the stop took {:?}", begun.elapsed());
    // Its connection is closed, not left behind.
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(2), slow.read_to_end(&mut rest)).await?;
    assert!(read.is_err() || rest.is_empty(), "got {:?}", String::from_utf8_lossy(&rest));
    Ok(())
}

#[tokio::test]
async fn an_ipv6_loopback_host_is_written_as_in_a_url_or_bare() -> TestResult {
    for host in ["[::1]", "::1"] {
        let started = match start_with("webhook", &[("WEBHOOK_HOST", host)], &[], Arc::new(MemorySink::new())).await {
            Ok(started) => started,
            // A machine without IPv6 cannot bind ::1 at all; that is a Bind error, not a config one.
            Err(ConnectorError::Bind { .. }) => return Ok(()),
            Err(other) => return Err(other.into()),
        };
        assert_eq!(started.addr.ip().to_string(), "::1");
        assert_eq!(post(started.addr, &[], br#"{"text":"v6"}"#).await?.status, 200);
        started.stop().await?;
    }
    Ok(())
}

// ─────────────────────────── replays ───────────────────────────
//
// A captured request posted again must run no second turn. What is outside
// a signature (`X-Delivery-Id`, `X-GitHub-Delivery`) can be changed by
// whoever replays it, so only what is signed makes the delivery key.

fn hmac_base64(key: &[u8], parts: &[&[u8]]) -> Result<String, Box<dyn std::error::Error>> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key)?;
    for part in parts {
        mac.update(part);
    }
    Ok(base64(&mac.finalize().into_bytes()))
}

fn body_key(body: &[u8]) -> String {
    use sha2::Digest as _;
    format!("body-sha256:{}", hex::encode(Sha256::digest(body)))
}

#[test]
fn the_tests_base64_is_rfc_4648() {
    // RFC 4648 section 10.
    let vectors = [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foobar", "Zm9vYmFy")];
    for (plain, encoded) in vectors {
        assert_eq!(base64(plain.as_bytes()), encoded);
    }
}

#[tokio::test]
async fn webhook_a_body_only_signature_posted_again_with_a_new_delivery_id_runs_once() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let started = start_with("webhook", &[], &[("WEBHOOK_SECRET", WEBHOOK_SECRET)], sink.clone()).await?;
    let body = br#"{"text":"transfer 100","instanceKey":"bank:1"}"#;
    let signature = format!("sha256={}", hmac_hex(WEBHOOK_SECRET, &[body])?);
    let first = [("X-Signature-256", signature.clone()), ("X-Delivery-Id", "d-1".to_owned())];
    let reply = post(started.addr, &first, body).await?;
    assert_eq!((reply.status, reply.json()?), (200, serde_json::json!({"ok": true})));
    // The attacker's copy: the same signed body, another delivery id (and none at all).
    let replayed = [("X-Signature-256", signature.clone()), ("X-Delivery-Id", "d-2-replayed".to_owned())];
    let reply = post(started.addr, &replayed, body).await?;
    assert_eq!((reply.status, reply.json()?), (200, serde_json::json!({"ok": true})), "answered as a duplicate");
    let keyed_otherwise = [("X-Signature-256", signature), ("Idempotency-Key", "fresh".to_owned())];
    assert_eq!(post(started.addr, &keyed_otherwise, body).await?.status, 200);
    let stored = sink.stored();
    let [delivery] = stored.as_slice() else { panic!("the replays stored events: {stored:?}") };
    assert_eq!(delivery.key, Some(body_key(body)));
    started.stop().await
}

#[tokio::test]
async fn webhook_a_timestamped_signature_posted_again_with_a_new_delivery_id_runs_once() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let started = start_with("webhook", &[], &[("WEBHOOK_SECRET", WEBHOOK_SECRET)], sink.clone()).await?;
    let body = br#"{"event":"alert","text":"cpu"}"#;
    let ts = now().to_string();
    let signature = format!("sha256={}", hmac_hex(WEBHOOK_SECRET, &[ts.as_bytes(), b".", body])?);
    for id in ["a-1", "a-2-replayed"] {
        let headers = [
            ("X-Signature-256", signature.clone()),
            ("X-Signature-Timestamp", ts.clone()),
            ("X-Delivery-Id", id.to_owned()),
        ];
        assert_eq!(post(started.addr, &headers, body).await?.status, 200);
    }
    // The same body signed at another second is another sending.
    let later = (now() + 1).to_string();
    let resent = [
        ("X-Signature-256", format!("sha256={}", hmac_hex(WEBHOOK_SECRET, &[later.as_bytes(), b".", body])?)),
        ("X-Signature-Timestamp", later.clone()),
    ];
    assert_eq!(post(started.addr, &resent, body).await?.status, 200);
    let keys: Vec<Option<String>> = sink.stored().into_iter().map(|d| d.key).collect();
    assert_eq!(keys, [Some(format!("{}@{ts}", body_key(body))), Some(format!("{}@{later}", body_key(body)))]);
    // Stale or future timestamps are refused (6 minutes either way).
    for at in [now() - 6 * 60, now() + 6 * 60] {
        let at = at.to_string();
        let headers = [
            ("X-Signature-256", format!("sha256={}", hmac_hex(WEBHOOK_SECRET, &[at.as_bytes(), b".", body])?)),
            ("X-Signature-Timestamp", at),
        ];
        assert_eq!(post(started.addr, &headers, body).await?.status, 401);
    }
    assert_eq!(sink.stored().len(), 2);
    started.stop().await
}

/// A Standard Webhooks sender's secret: `whsec_` and the base64 of the key.
const STANDARD_KEY: &[u8] = b"\x01\x02standard-webhooks-key\xfe\xff";

fn standard_headers(
    key: &[u8],
    id: &str,
    timestamp: u64,
    body: &[u8],
) -> Result<Vec<(&'static str, String)>, Box<dyn std::error::Error>> {
    let ts = timestamp.to_string();
    let signature = hmac_base64(key, &[id.as_bytes(), b".", ts.as_bytes(), b".", body])?;
    Ok(vec![
        ("Content-Type", "application/json".to_owned()),
        ("webhook-id", id.to_owned()),
        ("webhook-timestamp", ts),
        ("webhook-signature", format!("v1,{signature}")),
    ])
}

fn set(headers: &mut [(&'static str, String)], name: &str, value: String) {
    for (n, v) in headers.iter_mut() {
        if n.eq_ignore_ascii_case(name) {
            *v = value.clone();
        }
    }
}

#[tokio::test]
async fn webhook_standard_webhooks_are_keyed_by_their_signed_id() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let secret = format!("whsec_{}", base64(STANDARD_KEY));
    let started = start_with("webhook", &[], &[("WEBHOOK_SECRET", &secret)], sink.clone()).await?;
    let body = br#"{"event":"invoice_paid","text":"paid","instanceKey":"billing:7"}"#;
    let mut headers = standard_headers(STANDARD_KEY, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", now(), body)?;
    // Several signatures (a key being rotated, another scheme): any one v1 that matches passes.
    let right = headers[3].1.clone();
    set(&mut headers, "webhook-signature", format!("v1a,AAAA v1,{} {right}", base64(&[0; 32])));
    let reply = post(started.addr, &headers, body).await?;
    assert_eq!((reply.status, reply.json()?), (200, serde_json::json!({"ok": true})));
    // A retry keeps its id, with a new timestamp and signature: a duplicate.
    let retry = standard_headers(STANDARD_KEY, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", now() + 2, body)?;
    assert_eq!(post(started.addr, &retry, body).await?.status, 200);
    // The same request once more, with an X-Delivery-Id of the replayer's own: a duplicate.
    let mut replay = retry.clone();
    replay.push(("X-Delivery-Id", "fresh".to_owned()));
    assert_eq!(post(started.addr, &replay, body).await?.status, 200);
    // Another message with the same body is its own event.
    let other = standard_headers(STANDARD_KEY, "msg_other", now(), body)?;
    assert_eq!(post(started.addr, &other, body).await?.status, 200);
    let stored = sink.stored();
    let keys: Vec<Option<&str>> = stored.iter().map(|d| d.key.as_deref()).collect();
    assert_eq!(keys, [Some("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"), Some("msg_other")]);
    assert_eq!(stored[0].event.name, "invoice_paid");
    assert_eq!(stored[0].event.instance_key, "billing:7");
    started.stop().await
}

#[tokio::test]
async fn webhook_standard_webhooks_refuse_bad_stale_future_and_moved_signatures() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let secret = format!("whsec_{}", base64(STANDARD_KEY));
    let started = start_with("webhook", &[], &[("WEBHOOK_SECRET", &secret)], sink.clone()).await?;
    let body = br#"{"text":"x"}"#;
    let id = "msg_refused";
    let refused = |what: &'static str, headers: Vec<(&'static str, String)>, body: &'static [u8]| {
        let addr = started.addr;
        async move {
            let reply = post(addr, &headers, body).await?;
            assert_eq!((reply.status, reply.error_code().as_deref()), (401, Some("unauthorized")), "{what}");
            Ok::<(), Box<dyn std::error::Error>>(())
        }
    };
    refused("signed with another key", standard_headers(b"another key", id, now(), body)?, body).await?;
    refused("6 minutes old", standard_headers(STANDARD_KEY, id, now() - 6 * 60, body)?, body).await?;
    refused("6 minutes ahead", standard_headers(STANDARD_KEY, id, now() + 6 * 60, body)?, body).await?;
    refused("another body", standard_headers(STANDARD_KEY, id, now(), body)?, br#"{"text":"y"}"#).await?;
    // The signature of one id under another: a replay with a fresh id.
    let mut moved = standard_headers(STANDARD_KEY, id, now(), body)?;
    set(&mut moved, "webhook-id", "msg_fresh".to_owned());
    refused("another id", moved, body).await?;
    let mut retimed = standard_headers(STANDARD_KEY, id, now() - 200, body)?;
    set(&mut retimed, "webhook-timestamp", now().to_string());
    refused("another timestamp", retimed, body).await?;
    // The raw secret (with its prefix) is not the key of a whsec_ secret.
    refused("the secret's text as the key", standard_headers(secret.as_bytes(), id, now(), body)?, body).await?;
    let good = standard_headers(STANDARD_KEY, id, now(), body)?;
    for missing in ["webhook-id", "webhook-timestamp"] {
        let without: Vec<_> = good.iter().filter(|(n, _)| *n != missing).cloned().collect();
        refused("a header missing", without, body).await?;
    }
    let mut unversioned = good.clone();
    set(&mut unversioned, "webhook-signature", good[3].1.trim_start_matches("v1,").to_owned());
    refused("no v1, prefix", unversioned, body).await?;
    let mut other_version = good.clone();
    set(&mut other_version, "webhook-signature", good[3].1.replacen("v1,", "v2,", 1));
    refused("another version", other_version, body).await?;
    assert!(sink.stored().is_empty());
    // …and the right one passes.
    assert_eq!(post(started.addr, &good, body).await?.status, 200);
    assert_eq!(sink.stored().len(), 1);
    started.stop().await
}

#[tokio::test]
async fn webhook_standard_webhooks_with_a_plain_secret_use_its_bytes_and_a_bad_whsec_is_a_config_error() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let started = start_with("webhook", &[], &[("WEBHOOK_SECRET", WEBHOOK_SECRET)], sink.clone()).await?;
    let body = br#"{"text":"plain"}"#;
    let headers = standard_headers(WEBHOOK_SECRET.as_bytes(), "msg_plain", now(), body)?;
    assert_eq!(post(started.addr, &headers, body).await?.status, 200);
    // The same secret still signs the GitHub-style form.
    let other = br#"{"text":"github style"}"#;
    let github_style = [("X-Signature-256", format!("sha256={}", hmac_hex(WEBHOOK_SECRET, &[other])?))];
    assert_eq!(post(started.addr, &github_style, other).await?.status, 200);
    let keys: Vec<Option<String>> = sink.stored().into_iter().map(|d| d.key).collect();
    assert_eq!(keys, [Some("msg_plain".to_owned()), Some(body_key(other))]);
    started.stop().await?;

    let result =
        start_with("webhook", &[], &[("WEBHOOK_SECRET", "whsec_not*base64")], Arc::new(MemorySink::new())).await;
    let Err(error) = result else { panic!("started with a whsec_ secret that is not base64") };
    assert!(matches!(error, ConnectorError::Config { .. }) && error.to_string().contains("WEBHOOK_SECRET"), "{error}");
    assert!(!error.to_string().contains("not*base64"), "the secret is not in the message: {error}");
    Ok(())
}

#[tokio::test]
async fn webhook_can_refuse_signatures_without_a_timestamp() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let config = [("WEBHOOK_REQUIRE_TIMESTAMP", "true")];
    let started = start_with("webhook", &config, &[("WEBHOOK_SECRET", WEBHOOK_SECRET)], sink.clone()).await?;
    let body = br#"{"text":"t"}"#;
    let body_only = [("X-Signature-256", format!("sha256={}", hmac_hex(WEBHOOK_SECRET, &[body])?))];
    assert_eq!(post(started.addr, &body_only, body).await?.status, 401);
    let ts = now().to_string();
    let stamped = [
        ("X-Signature-256", format!("sha256={}", hmac_hex(WEBHOOK_SECRET, &[ts.as_bytes(), b".", body])?)),
        ("X-Signature-Timestamp", ts),
    ];
    assert_eq!(post(started.addr, &stamped, body).await?.status, 200);
    let standard = standard_headers(WEBHOOK_SECRET.as_bytes(), "msg_t", now(), body)?;
    assert_eq!(post(started.addr, &standard, body).await?.status, 200);
    assert_eq!(sink.stored().len(), 2);
    started.stop().await?;
    let result = start_with(
        "webhook",
        &[("WEBHOOK_REQUIRE_TIMESTAMP", "sometimes")],
        &[("WEBHOOK_SECRET", WEBHOOK_SECRET)],
        Arc::new(MemorySink::new()),
    )
    .await;
    let Err(error) = result else { panic!("started with WEBHOOK_REQUIRE_TIMESTAMP=sometimes") };
    assert!(error.to_string().contains("WEBHOOK_REQUIRE_TIMESTAMP"), "{error}");
    Ok(())
}

#[tokio::test]
async fn github_a_delivery_posted_again_with_a_new_delivery_id_runs_once() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let started = start_with("github", &[], &[("GITHUB_WEBHOOK_SECRET", GITHUB_SECRET)], sink.clone()).await?;
    let body = br#"{"action":"opened","issue":{"id":1,"number":9,"title":"Bug"},"repository":{"full_name":"o/r"}}"#;
    let first = github_headers("issues", "5b8c5d2e-0000-11f0-8000-000000000001", body)?;
    assert_eq!(post(started.addr, &first, body).await?.status, 200);
    // GitHub's own redelivery: the same id and body.
    assert_eq!(post(started.addr, &first, body).await?.status, 200);
    // A replay with a delivery id of the attacker's own.
    let replayed = github_headers("issues", "00000000-dead-beef-0000-000000000000", body)?;
    let reply = post(started.addr, &replayed, body).await?;
    assert_eq!((reply.status, reply.body.as_str()), (200, "OK"), "answered as a duplicate");
    let stored = sink.stored();
    let [delivery] = stored.as_slice() else { panic!("the replay stored events: {stored:?}") };
    assert_eq!(delivery.key, Some(body_key(body)));
    started.stop().await
}

#[tokio::test]
async fn discord_refuses_timestamps_six_minutes_off_and_a_replayed_interaction_runs_once() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let started = start_with("discord", &[("DISCORD_PUBLIC_KEY", DISCORD_PUBLIC_KEY)], &[], sink.clone()).await?;
    let command = br#"{"id":"1400","type":2,"token":"t","channel_id":"CH","data":{"name":"pay"}}"#;
    for at in [now() - 6 * 60, now() + 6 * 60] {
        let reply = post(started.addr, &discord_headers(command, at)?, command).await?;
        assert_eq!((reply.status, reply.error_code().as_deref()), (401, Some("unauthorized")));
    }
    assert!(sink.stored().is_empty());
    let captured = discord_headers(command, now() - 60)?;
    for _ in 0..2 {
        assert_eq!(post(started.addr, &captured, command).await?.status, 200);
    }
    let stored = sink.stored();
    let [delivery] = stored.as_slice() else { panic!("the replay stored events: {stored:?}") };
    assert_eq!(delivery.key.as_deref(), Some("1400"));
    started.stop().await
}

#[tokio::test]
async fn slack_refuses_timestamps_six_minutes_off_and_a_replayed_event_runs_once() -> TestResult {
    let sink = Arc::new(MemorySink::new());
    let started = slack(sink.clone()).await?;
    let body = slack_mention("Ev0REPLAY");
    for at in [now() - 6 * 60, now() + 6 * 60] {
        let reply = post(started.addr, &slack_headers(&body, at)?, &body).await?;
        assert_eq!((reply.status, reply.error_code().as_deref()), (401, Some("unauthorized")));
    }
    let captured = slack_headers(&body, now() - 60)?;
    for _ in 0..2 {
        assert_eq!(post(started.addr, &captured, &body).await?.status, 200);
    }
    let stored = sink.stored();
    let [delivery] = stored.as_slice() else { panic!("the replay stored events: {stored:?}") };
    assert_eq!(delivery.key.as_deref(), Some("Ev0REPLAY"));
    started.stop().await
}
