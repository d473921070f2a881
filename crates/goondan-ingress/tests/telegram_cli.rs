//! The `telegram-polling` connector against a fake Bot API over real HTTP,
//! and the `cli` connector reading real pipes.

#[path = "support/fake_telegram.rs"]
mod fake_telegram;

use goondan_core::sync::LockUnpoisoned;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use fake_telegram::{Failure, FakeTelegram};
use goondan_ingress::connector::InputStream;
use goondan_ingress::{
    Accepted, ConnectorContext, ConnectorError, Delivery, EventMessage, EventSink, MemorySink, RunningConnector,
    SecretMap, SinkError, connectors,
};
use goondan_test_support::Captured;
use serde_json::json;
use tokio::io::AsyncWriteExt as _;
use tokio_util::sync::CancellationToken;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TOKEN: &str = "123456:AAF-real_Token-xyz";
const WAIT: Duration = Duration::from_secs(10);

fn pairs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn context(
    connector: &str,
    config: &[(&str, &str)],
    secrets: &[(&str, &str)],
    sink: Arc<dyn EventSink>,
    stop: &CancellationToken,
    input: Option<InputStream>,
) -> ConnectorContext {
    ConnectorContext {
        connection: format!("{connector}-connection"),
        connector: connector.to_owned(),
        config: pairs(config),
        secrets: SecretMap::new(pairs(secrets)),
        sink,
        stop: stop.clone(),
        input,
    }
}

async fn start(ctx: ConnectorContext) -> Result<RunningConnector, ConnectorError> {
    let Some(start) = connectors::native(&ctx.connector) else {
        panic!("'{}' is not a native connector", ctx.connector);
    };
    start(ctx).await
}

/// A telegram-polling Connection against `fake`.
async fn start_telegram(
    fake: &FakeTelegram,
    sink: Arc<dyn EventSink>,
    stop: &CancellationToken,
    poll_timeout: &str,
) -> Result<RunningConnector, ConnectorError> {
    let base = fake.base_url();
    let config = [
        ("TELEGRAM_API_BASE_URL", base.as_str()),
        ("TELEGRAM_POLL_TIMEOUT_SECONDS", poll_timeout),
        ("TELEGRAM_RETRY_DELAY_MS", "20"),
    ];
    start(context("telegram-polling", &config, &[("TELEGRAM_BOT_TOKEN", TOKEN)], sink, stop, None)).await
}

/// Polls `check` until it holds or `timeout` passes.
async fn until(timeout: Duration, check: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    check()
}

/// Stops a connector and checks that it ends promptly and cleanly.
async fn stop_and_join(stop: &CancellationToken, running: RunningConnector) -> TestResult {
    stop.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(2), running.task).await??;
    ended?;
    Ok(())
}

#[tokio::test]
async fn updates_become_events_and_are_confirmed_only_after_they_are_stored() -> TestResult {
    let fake = FakeTelegram::start(TOKEN).await?;
    let hello = fake.push_text(42, "hello from telegram");
    let edited = fake.push_update(json!({"edited_message": {"chat": {"id": 42}, "text": "edited"}}));
    let from_bot = fake.push_message(
        json!({"chat": {"id": 42, "type": "private"}, "from": {"id": 7, "is_bot": true}, "text": "echo"}),
    );
    let photo = fake.push_message(json!({
        "chat": {"id": -100500, "type": "supergroup", "title": "Team"},
        "from": {"id": 77, "username": "alice", "first_name": "Alice"},
        "caption": "look",
        "photo": [{"file_id": "small", "width": 90, "height": 90}, {"file_id": "large", "width": 800, "height": 600}]
    }));
    let sink = Arc::new(MemorySink::new());
    let stop = CancellationToken::new();
    let running = start_telegram(&fake, sink.clone(), &stop, "5").await?;
    assert!(running.listening.is_empty());

    assert!(until(WAIT, || sink.stored().len() == 2).await, "two events expected, got {:?}", sink.stored());
    let stored = sink.stored();
    let keys: Vec<Option<String>> = stored.iter().map(|d| d.key.clone()).collect();
    assert_eq!(keys, [Some(hello.to_string()), Some(photo.to_string())]);
    let first = &stored[0].event;
    assert_eq!(first.name, "telegram_message");
    assert_eq!(first.instance_key, "telegram:42");
    assert_eq!(first.message, EventMessage::text("hello from telegram"));
    assert_eq!(first.properties["chat_id"], "42");
    assert_eq!(first.properties["update_id"], hello.to_string());
    assert_eq!(first.properties["from_username"], "user42");
    let second = &stored[1].event;
    assert_eq!(second.instance_key, "telegram:-100500");
    assert_eq!(second.message, EventMessage::text("look\n[telegram_photo] file_id=large"));
    assert_eq!(second.properties["chat_title"], "Team");
    assert_eq!(second.properties["has_photo"], "true");

    // The ignored updates are confirmed with the others.
    assert!(fake.wait_until_confirmed(photo, WAIT).await);
    assert!(fake.pending_update_ids().is_empty());
    let polls = fake.calls_to("getUpdates");
    assert_eq!(polls[0].param("offset"), None, "no offset before anything was stored");
    assert_eq!(polls[0].param("timeout").as_deref(), Some("5"));
    let next = photo + 1;
    assert!(polls.iter().any(|c| c.int("offset") == Some(next)), "offset {next} expected: {polls:?}");
    assert!(edited < photo && from_bot < photo);
    stop_and_join(&stop, running).await
}

/// A sink that fails while `failing` is set, and records when it stored.
#[derive(Default)]
struct FlakySink {
    inner: MemorySink,
    failing: AtomicBool,
    attempts: AtomicUsize,
    stored_at: Mutex<Option<Instant>>,
}

#[async_trait]
impl EventSink for FlakySink {
    async fn accept(&self, deliveries: Vec<Delivery>) -> Result<Vec<Accepted>, SinkError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        if self.failing.load(Ordering::SeqCst) {
            return Err(SinkError::Storage("disk full".to_owned()));
        }
        let accepted = self.inner.accept(deliveries).await?;
        *self.stored_at.lock_unpoisoned() = Some(Instant::now());
        Ok(accepted)
    }
}

#[tokio::test]
async fn a_failing_inbox_keeps_the_offset_until_the_batch_is_stored() -> TestResult {
    let fake = FakeTelegram::start(TOKEN).await?;
    let first = fake.push_text(1, "one");
    let second = fake.push_text(2, "two");
    let sink = Arc::new(FlakySink { failing: AtomicBool::new(true), ..FlakySink::default() });
    let stop = CancellationToken::new();
    let running = start_telegram(&fake, sink.clone(), &stop, "5").await?;

    assert!(until(WAIT, || sink.attempts.load(Ordering::SeqCst) >= 3).await, "the batch is retried");
    // Not confirmed, and not asked past: the same batch is retried rather
    // than polled again.
    assert_eq!(fake.pending_update_ids(), [first, second]);
    assert_eq!(fake.calls_to("getUpdates").len(), 1);
    assert!(sink.inner.stored().is_empty());

    sink.failing.store(false, Ordering::SeqCst);
    assert!(fake.wait_until_confirmed(second, WAIT).await);
    let stored: Vec<Option<String>> = sink.inner.stored().into_iter().map(|d| d.key).collect();
    assert_eq!(stored, [Some(first.to_string()), Some(second.to_string())]);
    let Some(stored_at) = *sink.stored_at.lock_unpoisoned() else {
        panic!("stored without a time");
    };
    let confirming =
        fake.calls_to("getUpdates").into_iter().filter(|c| c.int("offset") > Some(first)).collect::<Vec<_>>();
    assert!(!confirming.is_empty());
    assert!(confirming.iter().all(|c| c.at >= stored_at), "an offset past the batch only after it was stored");
    stop_and_join(&stop, running).await
}

/// A sink over a shared [`MemorySink`] that records what it answered and,
/// when armed, stops the connector right after storing (a crash between
/// storing and confirming).
struct RecordingSink {
    inner: Arc<MemorySink>,
    answers: Mutex<Vec<Accepted>>,
    stop_after_accept: Option<CancellationToken>,
}

#[async_trait]
impl EventSink for RecordingSink {
    async fn accept(&self, deliveries: Vec<Delivery>) -> Result<Vec<Accepted>, SinkError> {
        let accepted = self.inner.accept(deliveries).await?;
        self.answers.lock_unpoisoned().extend(accepted.iter().copied());
        if let Some(stop) = &self.stop_after_accept {
            stop.cancel();
        }
        Ok(accepted)
    }
}

#[tokio::test]
async fn an_update_stored_but_not_confirmed_comes_again_as_a_duplicate() -> TestResult {
    let fake = FakeTelegram::start(TOKEN).await?;
    let id = fake.push_text(9, "only once");
    let inbox = Arc::new(MemorySink::new());

    let first_stop = CancellationToken::new();
    let first = Arc::new(RecordingSink {
        inner: inbox.clone(),
        answers: Mutex::default(),
        stop_after_accept: Some(first_stop.clone()),
    });
    let running = start_telegram(&fake, first.clone(), &first_stop, "5").await?;
    tokio::time::timeout(WAIT, running.task).await???;
    assert_eq!(*first.answers.lock_unpoisoned(), [Accepted::Stored]);
    assert_eq!(fake.pending_update_ids(), [id], "stopped before confirming");

    // Restarted without a stored offset: Telegram sends it again.
    let second_stop = CancellationToken::new();
    let second = Arc::new(RecordingSink { inner: inbox.clone(), answers: Mutex::default(), stop_after_accept: None });
    let running = start_telegram(&fake, second.clone(), &second_stop, "5").await?;
    assert!(fake.wait_until_confirmed(id, WAIT).await);
    assert_eq!(*second.answers.lock_unpoisoned(), [Accepted::Duplicate]);
    assert_eq!(inbox.stored().len(), 1, "one turn's worth, not two");
    stop_and_join(&second_stop, running).await
}

#[tokio::test]
async fn rate_limits_wait_as_long_as_telegram_says() -> TestResult {
    let fake = FakeTelegram::start(TOKEN).await?;
    fake.fail_next_get_updates(Failure::RateLimited { retry_after: 1 });
    fake.push_text(5, "after the limit");
    let sink = Arc::new(MemorySink::new());
    let stop = CancellationToken::new();
    let running = start_telegram(&fake, sink.clone(), &stop, "5").await?;
    assert!(until(WAIT, || sink.stored().len() == 1).await);
    let polls = fake.calls_to("getUpdates");
    assert!(polls.len() >= 2);
    let waited = polls[1].at.duration_since(polls[0].at);
    // The configured retry delay is 20 ms: only retry_after explains this.
    assert!(waited >= Duration::from_millis(950), "waited {waited:?}");
    stop_and_join(&stop, running).await
}

#[tokio::test]
async fn conflicts_errors_and_bad_tokens_are_logged_clearly_and_never_with_the_token() -> TestResult {
    let captured = Captured::default();
    let _guard = tracing::subscriber::set_default(captured.subscriber("trace"));

    // 409 then a 500 quoting the request path: both retried.
    let fake = FakeTelegram::start(TOKEN).await?;
    fake.fail_next_get_updates(Failure::Conflict);
    fake.fail_next_get_updates(Failure::ServerError);
    let id = fake.push_text(3, "through");
    let sink = Arc::new(MemorySink::new());
    let stop = CancellationToken::new();
    let running = start_telegram(&fake, sink.clone(), &stop, "5").await?;
    assert!(until(WAIT, || sink.stored().len() == 1).await);
    assert!(fake.wait_until_confirmed(id, WAIT).await);
    assert!(fake.calls_to("getUpdates").len() >= 3);
    stop_and_join(&stop, running).await?;

    // A refused token.
    let wrong_stop = CancellationToken::new();
    let base = fake.base_url();
    let config = [("TELEGRAM_API_BASE_URL", base.as_str()), ("TELEGRAM_POLL_TIMEOUT_SECONDS", "1")];
    let wrong_token = "999:WRONG-token_value";
    let wrong = start(context(
        "telegram-polling",
        &config,
        &[("TELEGRAM_BOT_TOKEN", wrong_token)],
        Arc::new(MemorySink::new()),
        &wrong_stop,
        None,
    ))
    .await?;
    assert!(until(WAIT, || captured.text().contains("refused the bot token")).await, "{}", captured.text());
    assert!(fake.unauthorized_requests() >= 1);
    stop_and_join(&wrong_stop, wrong).await?;

    // Nothing listening.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let closed_url = format!("http://{}", closed.local_addr()?);
    drop(closed);
    let down_stop = CancellationToken::new();
    let config = [("TELEGRAM_API_BASE_URL", closed_url.as_str()), ("TELEGRAM_RETRY_DELAY_MS", "20")];
    let down = start(context(
        "telegram-polling",
        &config,
        &[("TELEGRAM_BOT_TOKEN", TOKEN)],
        Arc::new(MemorySink::new()),
        &down_stop,
        None,
    ))
    .await?;
    assert!(until(WAIT, || captured.text().matches("getUpdates request failed").count() >= 2).await);
    stop_and_join(&down_stop, down).await?;

    let logs = captured.text();
    assert!(logs.contains("conflict") && logs.contains("webhook"), "{logs}");
    assert!(logs.contains("HTTP 500: Internal Server Error at /bot<redacted>/getUpdates"), "{logs}");
    assert!(logs.contains("401"), "{logs}");
    for secret in [TOKEN, wrong_token, "AAF-real", "WRONG-token"] {
        assert!(!logs.contains(secret), "the token '{secret}' was logged:\n{logs}");
    }
    Ok(())
}

#[tokio::test]
async fn stop_abandons_a_long_poll_at_once() -> TestResult {
    let fake = FakeTelegram::start(TOKEN).await?;
    let stop = CancellationToken::new();
    let running = start_telegram(&fake, Arc::new(MemorySink::new()), &stop, "50").await?;
    assert!(fake.wait_for_long_poll(WAIT).await);
    let stopping = Instant::now();
    stop_and_join(&stop, running).await?;
    assert!(stopping.elapsed() < Duration::from_millis(500), "took {:?}", stopping.elapsed());
    Ok(())
}

#[tokio::test]
async fn a_missing_token_stops_start_up_naming_the_connection() {
    let stop = CancellationToken::new();
    let ctx = context("telegram-polling", &[], &[("OTHER", "x")], Arc::new(MemorySink::new()), &stop, None);
    match start(ctx).await {
        Err(ConnectorError::Config { connection, key, message }) => {
            assert_eq!((connection.as_str(), key.as_str()), ("telegram-polling-connection", "TELEGRAM_BOT_TOKEN"));
            assert!(message.contains("missing bot token"), "{message}");
        }
        other => panic!("a config error expected, got {other:?}"),
    }
}

#[tokio::test]
async fn cli_reads_a_childs_output_line_by_line_until_it_ends() -> TestResult {
    // Line indexes count every line, blank ones too (the original's rule).
    let input = concat!(
        "hello\n",
        "\n",
        "{\"event\":\"user_message\",\"text\":\"hi\",\"instanceKey\":\"user-1\",\"properties\":{\"room\":\"dev\",\"n\":2}}\r\n",
        "   \n",
        "[1,2]\n",
        "{\"name\":\"ping\"}\n",
        "no newline at the end",
    );
    let mut child = tokio::process::Command::new("sh")
        .args(["-c", "printf '%s' \"$CLI_INPUT\""])
        .env("CLI_INPUT", input)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let Some(stdout) = child.stdout.take() else {
        panic!("no stdout");
    };
    let sink = Arc::new(MemorySink::new());
    let stop = CancellationToken::new();
    let running = start(context("cli", &[], &[], sink.clone(), &stop, Some(Box::new(stdout)))).await?;
    tokio::time::timeout(WAIT, running.task).await???;
    assert!(child.wait().await?.success());

    let stored = sink.stored();
    let seen: Vec<(&str, String, &str)> = stored
        .iter()
        .map(|d| (d.event.name.as_str(), d.event.message.input_text(), d.event.instance_key.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("stdin_message", "hello".to_owned(), "cli:0"),
            ("user_message", "hi".to_owned(), "user-1"),
            ("stdin_message", "[1,2]".to_owned(), "cli:4"),
            ("ping", "{\"name\":\"ping\"}".to_owned(), "cli:5"),
            ("stdin_message", "no newline at the end".to_owned(), "cli:6"),
        ]
    );
    assert_eq!(stored[1].event.properties, pairs(&[("room", "dev"), ("n", "2")]));
    assert!(stored.iter().all(|d| d.key.is_none()), "each line is new");
    Ok(())
}

#[tokio::test]
async fn cli_without_input_ends_at_once_and_stop_ends_an_open_pipe() -> TestResult {
    let stop = CancellationToken::new();
    let running = start(context("cli", &[], &[], Arc::new(MemorySink::new()), &stop, None)).await?;
    tokio::time::timeout(Duration::from_secs(2), running.task).await???;

    let (mut sender, receiver) = tokio::net::unix::pipe::pipe()?;
    let sink = Arc::new(MemorySink::new());
    let running = start(context("cli", &[], &[], sink.clone(), &stop.child_token(), Some(Box::new(receiver)))).await?;
    sender.write_all(b"typed\n").await?;
    assert!(until(WAIT, || sink.stored().len() == 1).await);
    assert_eq!(sink.stored()[0].event.message, EventMessage::text("typed"));
    // The writer stays open: only the stop signal ends the connector.
    stop_and_join(&stop, running).await?;
    drop(sender);
    Ok(())
}

/// The fake answers the tools' methods as Telegram does (the coordinator's
/// tests send through it), whatever way the parameters come.
#[tokio::test]
async fn the_fake_answers_like_telegram() -> TestResult {
    let fake = FakeTelegram::start(TOKEN).await?;
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let client = reqwest::Client::builder().tls_backend_preconfigured(tls).build()?;
    let url = |method: &str| format!("{}/bot{TOKEN}/{method}", fake.base_url());

    let sent = client
        .post(url("sendMessage"))
        .header("content-type", "application/json")
        .body(json!({"chat_id": 42, "text": "hi there"}).to_string())
        .send()
        .await?;
    assert_eq!(sent.status(), 200);
    let sent: serde_json::Value = serde_json::from_slice(&sent.bytes().await?)?;
    assert_eq!(sent["ok"], true);
    assert_eq!(sent["result"]["chat"]["id"], 42);
    assert_eq!(sent["result"]["text"], "hi there");
    assert_eq!(sent["result"]["from"]["is_bot"], true);

    let form = client
        .post(url("sendChatAction"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("chat_id=%40room&action=typing")
        .send()
        .await?;
    assert_eq!(form.status(), 200);
    let query = client.get(format!("{}?chat_id=42&message_id=1", url("deleteMessage"))).send().await?;
    assert_eq!(query.status(), 200);
    let empty = client
        .post(url("sendMessage"))
        .header("content-type", "application/json")
        .body(json!({"chat_id": 42, "text": " "}).to_string())
        .send()
        .await?;
    assert_eq!(empty.status(), 400);

    let unknown = client.post(url("sendTelepathy")).send().await?;
    assert_eq!(unknown.status(), 404);
    let wrong = client.post(format!("{}/bot1:wrong/sendMessage", fake.base_url())).send().await?;
    assert_eq!(wrong.status(), 401);
    let wrong: serde_json::Value = serde_json::from_slice(&wrong.bytes().await?)?;
    assert_eq!(wrong, json!({"ok": false, "error_code": 401, "description": "Unauthorized"}));
    assert_eq!(fake.unauthorized_requests(), 1);

    let file = client.get(format!("{}?file_id=abc", url("getFile"))).send().await?;
    let file: serde_json::Value = serde_json::from_slice(&file.bytes().await?)?;
    let Some(path) = file["result"]["file_path"].as_str() else {
        panic!("no file_path in {file}");
    };
    let download = client.get(format!("{}/file/bot{TOKEN}/{path}", fake.base_url())).send().await?;
    assert_eq!(download.status(), 200);
    assert_eq!(download.bytes().await?.as_ref(), format!("fake file {path}").as_bytes());

    let Some(action) = fake.wait_for_call("sendChatAction", WAIT, |_| true).await else {
        panic!("sendChatAction not recorded");
    };
    assert_eq!(
        (action.param("chat_id").as_deref(), action.param("action").as_deref()),
        (Some("@room"), Some("typing"))
    );
    let Some(messages) = fake.wait_for_calls("sendMessage", 2, WAIT).await else {
        panic!("two sendMessage calls expected");
    };
    assert_eq!(messages[0].int("chat_id"), Some(42));
    assert_eq!(messages[0].param("text").as_deref(), Some("hi there"));
    assert_eq!(fake.calls_to("deleteMessage")[0].int("message_id"), Some(1));

    // getUpdates: an offset confirms what is below it; a short poll answers
    // at once, a long one when an update arrives.
    let first = fake.push_text(1, "a");
    let second = fake.push_text(1, "b");
    let updates: serde_json::Value = serde_json::from_slice(
        &client.get(format!("{}?offset={second}", url("getUpdates"))).send().await?.bytes().await?,
    )?;
    assert_eq!(updates["result"].as_array().map(Vec::len), Some(1));
    assert_eq!(updates["result"][0]["update_id"], second);
    assert_eq!(fake.pending_update_ids(), [second], "{first} is confirmed");
    let poll = tokio::spawn(client.get(format!("{}?offset={}&timeout=20", url("getUpdates"), second + 1)).send());
    assert!(fake.wait_for_long_poll(WAIT).await);
    let started = Instant::now();
    let third = fake.push_text(1, "c");
    let updates: serde_json::Value = serde_json::from_slice(&poll.await??.bytes().await?)?;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(updates["result"][0]["update_id"], third);
    assert_eq!(updates["result"][0]["message"]["text"], "c");
    Ok(())
}
