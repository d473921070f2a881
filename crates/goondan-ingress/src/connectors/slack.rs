//! `slack`: the Slack Events API over HTTP, as the original's
//! `packages/base/src/connectors/slack.ts` reads it (`app_mention` and
//! `message_im` events, `SLACK_MESSAGE_MODE`, attachments as text lines),
//! with `v0` request signatures checked first and each event keyed by its
//! `event_id`, so a Slack retry (`X-Slack-Retry-Num`) runs no second turn.

use std::collections::{BTreeMap, HashSet};

use goondan_core::JsonValue;
use serde_json::{Map, json};

use super::http::{self, Endpoint, Incoming, Keys, Listen, Outcome};
use crate::connector::{ConnectorContext, StartFuture};
use crate::event::{ConnectorEvent, Delivery, EventMessage, digest_key};

/// The original's default port.
pub(crate) const KEYS: Keys = Keys {
    port: "SLACK_WEBHOOK_PORT",
    path: "SLACK_WEBHOOK_PATH",
    host: "SLACK_HOST",
    max_body: "SLACK_MAX_BODY_BYTES",
};

pub(crate) const DEFAULT_PORT: u16 = 8787;

/// Which Slack events become turns (`SLACK_MESSAGE_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MessageMode {
    /// `app_mention` only.
    Mention,
    /// Every event with a channel, a `ts` and text (the original's default).
    All,
    /// `app_mention` and `message`.
    ChannelAndThreads,
}

impl MessageMode {
    fn from_config(value: Option<&str>) -> Self {
        match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            Some("mention") => Self::Mention,
            Some("channel_and_threads") => Self::ChannelAndThreads,
            // The original falls back to `all` for anything else.
            _ => Self::All,
        }
    }
}

struct Slack {
    connection: String,
    secret: Option<String>,
    mode: MessageMode,
}

/// Starts the `slack` connector: binds `SLACK_WEBHOOK_PORT`/`PORT` (default
/// 8787) on `SLACK_HOST`/`HOST` (default 127.0.0.1), path
/// `SLACK_WEBHOOK_PATH` (default `/`).
pub fn start(ctx: ConnectorContext) -> StartFuture {
    Box::pin(async move {
        let listen = Listen::from_config(&ctx, &KEYS, DEFAULT_PORT)?;
        let secret = ctx
            .secrets
            .get("SLACK_SIGNING_SECRET")
            .or_else(|| ctx.secrets.get("signingSecret"))
            .or_else(|| ctx.config_value("SLACK_SIGNING_SECRET"))
            .map(str::to_owned);
        if secret.is_none() {
            http::allow_unsigned(&ctx, &listen, "SLACK_SIGNING_SECRET")?;
        }
        let endpoint = Slack {
            connection: ctx.connection.clone(),
            secret,
            mode: MessageMode::from_config(ctx.config_value("SLACK_MESSAGE_MODE")),
        };
        http::serve(ctx, listen, endpoint).await
    })
}

impl Endpoint for Slack {
    fn handle(&self, request: &Incoming) -> Outcome {
        if let Some(secret) = &self.secret
            && let Err(reason) = verify(secret, request, http::now_secs())
        {
            return http::unauthorized(&self.connection, reason);
        }
        let Ok(JsonValue::Object(body)) = serde_json::from_slice::<JsonValue>(&request.body) else {
            return http::bad_request("the body must be a JSON object");
        };
        if str_field(&body, "type") == Some("url_verification") {
            return Outcome::Reply(http::ok_text(str_field(&body, "challenge").unwrap_or_default()));
        }
        let Some(event) = parse_event(&body, self.mode) else {
            return Outcome::Reply(http::ok_json(json!({"ok": true, "ignored": true})));
        };
        let key = str_field(&body, "event_id").map_or_else(|| digest_key(&request.body), str::to_owned);
        if let Some(retry) = request.header("x-slack-retry-num") {
            tracing::info!(connection = %self.connection, event_id = %key, retry, "a Slack retry");
        }
        Outcome::Emit { deliveries: vec![Delivery::keyed(key, event)], ack: http::ok_json(json!({"ok": true})) }
    }
}

/// Slack's `v0` scheme: `X-Slack-Signature: v0=hex(HMAC-SHA256(secret,
/// "v0:{X-Slack-Request-Timestamp}:{body}"))`, the timestamp within five
/// minutes of `now`. The error is a reason for the log.
fn verify(secret: &str, request: &Incoming, now: i64) -> Result<(), &'static str> {
    let signature = request.header("x-slack-signature").ok_or("no X-Slack-Signature header")?;
    let timestamp = request.header("x-slack-request-timestamp").ok_or("no X-Slack-Request-Timestamp header")?;
    if !http::timestamp_fresh(timestamp, now) {
        return Err("X-Slack-Request-Timestamp is not within five minutes of now");
    }
    let hex = signature.strip_prefix("v0=").ok_or("X-Slack-Signature is not a v0 signature")?;
    let parts: [&[u8]; 4] = [b"v0:", timestamp.as_bytes(), b":", &request.body];
    if http::hmac_sha256_matches(secret.as_bytes(), &parts, hex) {
        Ok(())
    } else {
        Err("X-Slack-Signature does not match the body")
    }
}

fn str_field<'a>(object: &'a Map<String, JsonValue>, key: &str) -> Option<&'a str> {
    object.get(key).and_then(JsonValue::as_str).filter(|s| !s.is_empty())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Image,
    File,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Self::Image => "image",
            Self::File => "file",
        }
    }
}

struct Attachment {
    kind: Kind,
    url: String,
    name: String,
}

const IMAGE_FILE_TYPES: &[&str] =
    &["png", "jpg", "jpeg", "gif", "webp", "bmp", "svg", "tif", "tiff", "heic", "heif", "avif"];

fn attachment_url(record: &Map<String, JsonValue>) -> Option<&str> {
    [
        "url_private_download",
        "url_private",
        "permalink_public",
        "permalink",
        "image_url",
        "thumb_url",
        "from_url",
        "original_url",
    ]
    .iter()
    .find_map(|key| str_field(record, key))
}

fn attachment_name(record: &Map<String, JsonValue>, fallback: &str) -> String {
    ["title", "name", "alt_text", "id"].iter().find_map(|key| str_field(record, key)).unwrap_or(fallback).to_owned()
}

fn records(value: Option<&JsonValue>) -> impl Iterator<Item = &Map<String, JsonValue>> {
    value.and_then(JsonValue::as_array).into_iter().flatten().filter_map(JsonValue::as_object)
}

/// The original's attachment references, in its order: `files`, then
/// `attachments`, then image `blocks`; the same kind and URL once.
fn attachments(event: &Map<String, JsonValue>) -> Vec<Attachment> {
    let mut found = Vec::new();
    for file in records(event.get("files")) {
        let Some(url) = attachment_url(file) else { continue };
        let image = str_field(file, "mimetype").is_some_and(|m| m.to_ascii_lowercase().starts_with("image/"))
            || str_field(file, "filetype").is_some_and(|t| IMAGE_FILE_TYPES.contains(&t.to_ascii_lowercase().as_str()));
        let kind = if image { Kind::Image } else { Kind::File };
        found.push(Attachment { kind, url: url.to_owned(), name: attachment_name(file, kind.label()) });
    }
    for attachment in records(event.get("attachments")) {
        let Some(url) = attachment_url(attachment) else { continue };
        let image = str_field(attachment, "image_url").is_some() || str_field(attachment, "thumb_url").is_some();
        let (kind, fallback) = if image { (Kind::Image, "image") } else { (Kind::File, "attachment") };
        found.push(Attachment { kind, url: url.to_owned(), name: attachment_name(attachment, fallback) });
    }
    for block in records(event.get("blocks")) {
        if str_field(block, "type") != Some("image") {
            continue;
        }
        if let Some(url) = str_field(block, "image_url") {
            found.push(Attachment { kind: Kind::Image, url: url.to_owned(), name: attachment_name(block, "image") });
        } else if let Some(file) = block.get("slack_file").and_then(JsonValue::as_object)
            && let Some(url) = attachment_url(file)
        {
            found.push(Attachment { kind: Kind::Image, url: url.to_owned(), name: attachment_name(file, "image") });
        }
    }
    let mut seen = HashSet::new();
    found.retain(|a| seen.insert((a.kind, a.url.clone())));
    found
}

/// The original's `parseSlackEvent`: `None` for what it ignores (another
/// event type in the chosen mode, bot messages, no channel/ts/text).
fn parse_event(body: &Map<String, JsonValue>, mode: MessageMode) -> Option<ConnectorEvent> {
    let event = body.get("event")?.as_object()?;
    let event_type = str_field(event, "type");
    let wanted = match mode {
        MessageMode::Mention => event_type == Some("app_mention"),
        MessageMode::ChannelAndThreads => matches!(event_type, Some("app_mention" | "message")),
        MessageMode::All => true,
    };
    if !wanted {
        return None;
    }
    let subtype = str_field(event, "subtype");
    if subtype == Some("bot_message") || str_field(event, "bot_id").is_some() {
        return None;
    }
    let channel = str_field(event, "channel")?;
    let ts = str_field(event, "ts")?;
    let thread_ts = str_field(event, "thread_ts");
    let found = attachments(event);
    let mut text = str_field(event, "text").unwrap_or_default().to_owned();
    for attachment in &found {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&format!("[{}:{}] {}", attachment.kind.label(), attachment.name, attachment.url));
    }
    if text.is_empty() {
        return None;
    }
    let mut properties =
        BTreeMap::from([("channel_id".to_owned(), channel.to_owned()), ("ts".to_owned(), ts.to_owned())]);
    let mut put = |key: &str, value: Option<&str>| {
        if let Some(value) = value {
            properties.insert(key.to_owned(), value.to_owned());
        }
    };
    put("thread_ts", thread_ts);
    put("user_id", str_field(event, "user"));
    put("subtype", subtype);
    if !found.is_empty() {
        put("attachment_count", Some(&found.len().to_string()));
        put("image_url", found.iter().find(|a| a.kind == Kind::Image).map(|a| a.url.as_str()));
        if let Some(file) = found.iter().find(|a| a.kind == Kind::File) {
            put("file_url", Some(&file.url));
            put("file_name", Some(&file.name));
        }
    }
    let name = if event_type == Some("app_mention") { "app_mention" } else { "message_im" };
    Some(ConnectorEvent {
        name: name.to_owned(),
        message: EventMessage::text(text),
        properties,
        instance_key: format!("slack:{channel}:{}", thread_ts.unwrap_or(ts)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::test_support::{object, request};

    fn signed(secret: &str, timestamp: &str, body: &str) -> Incoming {
        let signature = format!(
            "v0={}",
            http::hmac_sha256_hex(secret.as_bytes(), &[b"v0:", timestamp.as_bytes(), b":", body.as_bytes()])
        );
        request(&[("x-slack-signature", signature), ("x-slack-request-timestamp", timestamp.to_owned())], body)
    }

    #[test]
    fn slacks_published_signing_example_verifies() {
        // https://api.slack.com/authentication/verifying-requests-from-slack
        let body = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
        let secret = "8f742231b10e8888abcd99yyyzzz85a5";
        let request = signed(secret, "1531420618", body);
        assert_eq!(
            request.header("x-slack-signature"),
            Some("v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503")
        );
        assert_eq!(verify(secret, &request, 1_531_420_618 + 60), Ok(()));
        assert!(verify(secret, &request, 1_531_420_618 + 301).is_err(), "stale");
        assert!(verify("another secret", &request, 1_531_420_618).is_err());
    }

    #[test]
    fn message_modes_filter_as_the_original() {
        let body = |kind: &str| {
            object(json!({"event": {"type": kind, "channel": "C1", "ts": "1.2", "text": "hi", "user": "U1"}}))
        };
        assert!(parse_event(&body("app_mention"), MessageMode::Mention).is_some());
        assert!(parse_event(&body("message"), MessageMode::Mention).is_none());
        assert!(parse_event(&body("message"), MessageMode::ChannelAndThreads).is_some());
        assert!(parse_event(&body("reaction_added"), MessageMode::ChannelAndThreads).is_none());
        assert!(parse_event(&body("reaction_added"), MessageMode::All).is_some());
        assert_eq!(MessageMode::from_config(Some("MENTION")), MessageMode::Mention);
        assert_eq!(MessageMode::from_config(Some("bogus")), MessageMode::All);
        assert_eq!(MessageMode::from_config(None), MessageMode::All);
    }

    #[test]
    fn bot_messages_and_empty_ones_are_ignored() {
        let bot = object(json!({"event": {"type": "message", "channel": "C", "ts": "1", "text": "x", "bot_id": "B"}}));
        let sub = object(
            json!({"event": {"type": "message", "channel": "C", "ts": "1", "text": "x", "subtype": "bot_message"}}),
        );
        let empty = object(json!({"event": {"type": "message", "channel": "C", "ts": "1"}}));
        for body in [bot, sub, empty] {
            assert!(parse_event(&body, MessageMode::All).is_none());
        }
    }

    #[test]
    fn a_thread_reply_with_files_reads_as_the_original() -> Result<(), String> {
        let body = object(json!({"event": {
            "type": "message", "channel": "C9", "ts": "2.0", "thread_ts": "1.0", "user": "U7", "text": "look",
            "files": [
                {"mimetype": "image/png", "url_private": "https://f/1.png", "name": "shot.png"},
                {"filetype": "pdf", "url_private_download": "https://f/a.pdf", "title": "A"},
                {"mimetype": "image/png", "url_private": "https://f/1.png"}
            ],
            "blocks": [{"type": "image", "image_url": "https://i/x.jpg", "alt_text": "x"}]
        }}));
        let event = parse_event(&body, MessageMode::All).ok_or("ignored")?;
        assert_eq!(event.name, "message_im");
        assert_eq!(event.instance_key, "slack:C9:1.0");
        assert_eq!(
            event.message.input_text(),
            "look\n[image:shot.png] https://f/1.png\n[file:A] https://f/a.pdf\n[image:x] https://i/x.jpg"
        );
        assert_eq!(event.properties.get("attachment_count").map(String::as_str), Some("3"));
        assert_eq!(event.properties.get("image_url").map(String::as_str), Some("https://f/1.png"));
        assert_eq!(event.properties.get("file_name").map(String::as_str), Some("A"));
        assert_eq!(event.properties.get("thread_ts").map(String::as_str), Some("1.0"));
        assert_eq!(event.properties.get("user_id").map(String::as_str), Some("U7"));
        Ok(())
    }
}
