//! The `slack` tool: the Web API calls of the original `@goondan/base` tool,
//! with its request bodies, headers and output fields — `send`
//! (chat.postMessage), `read` (conversations.history, or
//! conversations.replies for a thread), `edit` (chat.update), `delete`
//! (chat.delete), `react` (reactions.add once per emoji) and `downloadFile`
//! (a GET of a Slack file URL with the bot token).
//!
//! The token comes from the call's `token` or the operator's environment
//! (`SLACK_BOT_TOKEN`, `SLACK_TOKEN`, then the original's fallback
//! `BRAIN_SLACK_BOT_TOKEN`); the API base URL from
//! `SLACK_API_BASE_URL` (default `https://slack.com/api`). As with
//! `telegram` (both build on the crate-private `bot_api` module), the
//! operator's token never goes to an `apiBaseUrl` the model chose, and no
//! token appears in an error or a result. `downloadFile` sends the token only
//! to Slack's file host (`https://files.slack.com`) or to the origin of the
//! operator's `SLACK_API_BASE_URL`: the URL is the model's choice, and any
//! other host would receive the token (or, with a token of the model's own,
//! turn the tool into a way around `http-fetch`'s address checks).

use std::sync::Arc;

use goondan_core::codes::{E_SLACK_API, E_SLACK_REQUEST, E_TOKEN_DESTINATION_REFUSED};
use goondan_core::{JsonObject, JsonValue};
use goondan_tools::{ToolContext, ToolFailure, ToolHandler};
use reqwest::Url;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use serde_json::json;

use crate::BaseSettings;
use crate::args;
use crate::bot_api::{
    self, Api, DownloadOptions, ExportFn, Service, bool_value, http_description, invalid, optional_trimmed,
    positive_whole, put, required_text, required_trimmed, trimmed_str,
};

/// How the Web API is reached and how its failures are reported.
const SERVICE: Service = Service {
    name: "Slack",
    tag: "slack",
    token_vars: &["SLACK_BOT_TOKEN", "SLACK_TOKEN", "BRAIN_SLACK_BOT_TOKEN"],
    missing_token_vars: "SLACK_BOT_TOKEN/SLACK_TOKEN/BRAIN_SLACK_BOT_TOKEN",
    base_url_var: "SLACK_API_BASE_URL",
    default_base_url: "https://slack.com/api",
    token_in_url: false,
    api_error_code: E_SLACK_API,
    request_error_code: E_SLACK_REQUEST,
    api_suggestion: "Check the channel id, the message timestamp and the bot's scopes and channel membership; the \
                     method's documentation explains Slack's error code.",
    docs_url: slack_docs_url,
};

fn slack_docs_url(method: &str) -> String {
    format!("https://api.slack.com/methods/{method}")
}

/// Slack's file host, the only one besides the operator's that receives the token.
const FILE_HOST: &str = "files.slack.com";

/// The handler of `export`, or `None` if the tool has no such export.
pub fn handler(export: &str, settings: &Arc<BaseSettings>) -> Option<Arc<dyn ToolHandler>> {
    let export: ExportFn = match export {
        "send" => |_, settings, input| Box::pin(send(settings, input)),
        "read" => |_, settings, input| Box::pin(read(settings, input)),
        "edit" => |_, settings, input| Box::pin(edit(settings, input)),
        "delete" => |_, settings, input| Box::pin(delete(settings, input)),
        "react" => |_, settings, input| Box::pin(react(settings, input)),
        "downloadFile" => |ctx, settings, input| Box::pin(download_file(ctx, settings, input)),
        _ => return None,
    };
    Some(bot_api::handler(&SERVICE, settings, export))
}

fn channel_id(input: &JsonObject) -> Result<String, ToolFailure> {
    required_trimmed(input, "channelId", "Pass the channel's id, e.g. C0123456789.")
}

fn message_ts(input: &JsonObject) -> Result<String, ToolFailure> {
    required_trimmed(input, "messageTs", "Pass the message's ts, e.g. \"1735200000.001000\".")
}

async fn send(settings: &BaseSettings, input: &JsonObject) -> Result<JsonValue, ToolFailure> {
    let channel = channel_id(input)?;
    let text = required_text(input, "text")?;
    let mut payload = JsonObject::new();
    put(&mut payload, "channel", Some(json!(channel)));
    put(&mut payload, "text", Some(json!(text)));
    put(&mut payload, "thread_ts", optional_trimmed(input, "threadTs")?.map(JsonValue::from));
    put(&mut payload, "mrkdwn", bool_value(input, "mrkdwn")?);
    put(&mut payload, "unfurl_links", bool_value(input, "unfurlLinks")?);
    put(&mut payload, "unfurl_media", bool_value(input, "unfurlMedia")?);
    put(&mut payload, "reply_broadcast", bool_value(input, "replyBroadcast")?);
    let api = Api::new(&SERVICE, settings, input)?;
    let reply = call_method(&api, "chat.postMessage", &payload).await?;
    let posted_text = reply.get("message").and_then(|message| message.get("text")).and_then(trimmed_str);
    Ok(json!({
        "ok": true,
        "channelId": reply.get("channel").and_then(trimmed_str).unwrap_or(channel),
        "messageTs": reply.get("ts").and_then(trimmed_str),
        "text": posted_text.unwrap_or_else(|| text.to_owned()),
    }))
}

async fn read(settings: &BaseSettings, input: &JsonObject) -> Result<JsonValue, ToolFailure> {
    let channel = channel_id(input)?;
    let message_ts = optional_trimmed(input, "messageTs")?;
    let thread_ts = optional_trimmed(input, "threadTs")?;
    let latest = optional_trimmed(input, "latest")?;
    let oldest = optional_trimmed(input, "oldest")?;
    let cursor = optional_trimmed(input, "cursor")?;
    let inclusive = args::optional_bool(input, "inclusive")?;
    // Looking for one message: the page that ends with it, inclusively.
    let limit = limit(input, if message_ts.is_some() { 1 } else { 20 })?;
    let inclusive = inclusive.or(message_ts.as_ref().map(|_| true));
    let method = if thread_ts.is_some() { "conversations.replies" } else { "conversations.history" };
    let mut payload = JsonObject::new();
    put(&mut payload, "channel", Some(json!(channel)));
    put(&mut payload, "ts", thread_ts.clone().map(JsonValue::from));
    put(&mut payload, "latest", latest.or_else(|| message_ts.clone()).map(JsonValue::from));
    put(&mut payload, "oldest", oldest.map(JsonValue::from));
    put(&mut payload, "inclusive", inclusive.map(JsonValue::from));
    put(&mut payload, "limit", Some(json!(limit)));
    put(&mut payload, "cursor", cursor.map(JsonValue::from));
    let api = Api::new(&SERVICE, settings, input)?;
    let mut reply = call_method(&api, method, &payload).await?;
    let messages: Vec<JsonValue> = match reply.shift_remove("messages") {
        Some(JsonValue::Array(items)) => items.into_iter().filter(JsonValue::is_object).collect(),
        _ => Vec::new(),
    };
    let found = message_ts.as_deref().and_then(|wanted| {
        messages.iter().find(|message| message.get("ts").and_then(trimmed_str).as_deref() == Some(wanted)).cloned()
    });
    let next_cursor = reply.get("response_metadata").and_then(|meta| meta.get("next_cursor")).and_then(trimmed_str);
    Ok(json!({
        "ok": true,
        "channelId": channel,
        "method": method,
        "messageTs": message_ts,
        "threadTs": thread_ts,
        "count": messages.len(),
        "found": found,
        "messages": messages,
        "hasMore": reply.get("has_more").and_then(JsonValue::as_bool).unwrap_or(false),
        "nextCursor": next_cursor,
    }))
}

/// `limit`: a whole number of messages in 1..=1000 (fractions are cut).
fn limit(input: &JsonObject, default: u64) -> Result<u64, ToolFailure> {
    positive_whole(input, "limit", default, 1000, "Ask for 1 to 1000 messages and page on with 'cursor'.")
}

async fn edit(settings: &BaseSettings, input: &JsonObject) -> Result<JsonValue, ToolFailure> {
    let channel = channel_id(input)?;
    let ts = message_ts(input)?;
    let text = required_text(input, "text")?;
    let mut payload = JsonObject::new();
    put(&mut payload, "channel", Some(json!(channel)));
    put(&mut payload, "ts", Some(json!(ts)));
    put(&mut payload, "text", Some(json!(text)));
    put(&mut payload, "mrkdwn", bool_value(input, "mrkdwn")?);
    let api = Api::new(&SERVICE, settings, input)?;
    let reply = call_method(&api, "chat.update", &payload).await?;
    Ok(json!({
        "ok": true,
        "channelId": reply.get("channel").and_then(trimmed_str).unwrap_or(channel),
        "messageTs": reply.get("ts").and_then(trimmed_str).unwrap_or(ts),
        "edited": true,
    }))
}

async fn delete(settings: &BaseSettings, input: &JsonObject) -> Result<JsonValue, ToolFailure> {
    let channel = channel_id(input)?;
    let ts = message_ts(input)?;
    let mut payload = JsonObject::new();
    put(&mut payload, "channel", Some(json!(channel)));
    put(&mut payload, "ts", Some(json!(ts)));
    let api = Api::new(&SERVICE, settings, input)?;
    call_method(&api, "chat.delete", &payload).await?;
    Ok(json!({"ok": true, "channelId": channel, "messageTs": ts, "deleted": true}))
}

async fn react(settings: &BaseSettings, input: &JsonObject) -> Result<JsonValue, ToolFailure> {
    let channel = channel_id(input)?;
    let ts = message_ts(input)?;
    let names = reaction_names(input)?;
    let api = Api::new(&SERVICE, settings, input)?;
    for name in &names {
        let mut payload = JsonObject::new();
        put(&mut payload, "channel", Some(json!(channel)));
        put(&mut payload, "timestamp", Some(json!(ts)));
        put(&mut payload, "name", Some(json!(name)));
        call_method(&api, "reactions.add", &payload).await?;
    }
    Ok(json!({"ok": true, "channelId": channel, "messageTs": ts, "reactionCount": names.len(), "emojis": names}))
}

/// `emoji` then `emojis`, without surrounding colons, blanks or repeats.
fn reaction_names(input: &JsonObject) -> Result<Vec<String>, ToolFailure> {
    let single = args::optional_string(input, "emoji")?;
    let many = match input.get("emojis") {
        None | Some(JsonValue::Null) => Vec::new(),
        Some(_) => args::require_string_array(input, "emojis")?,
    };
    let mut names: Vec<String> = Vec::new();
    for raw in single.into_iter().chain(many) {
        let trimmed = raw.trim();
        let name = match trimmed.strip_prefix(':').and_then(|rest| rest.strip_suffix(':')) {
            Some(inner) if !inner.is_empty() => inner.trim(),
            _ => trimmed,
        };
        if !name.is_empty() && !names.iter().any(|known| known == name) {
            names.push(name.to_owned());
        }
    }
    if names.is_empty() {
        return Err(invalid(
            "Provide 'emoji' or 'emojis' to add Slack reaction.",
            "Pass an emoji name such as \"thumbsup\".",
        ));
    }
    if let Some(name) = names.iter().find(|name| name.chars().any(char::is_whitespace)) {
        return Err(invalid(
            format!("Invalid emoji name '{name}'. Emoji names must not contain whitespace."),
            "Use Slack's emoji name, e.g. \"white_check_mark\".",
        ));
    }
    Ok(names)
}

async fn download_file(
    ctx: &ToolContext,
    settings: &BaseSettings,
    input: &JsonObject,
) -> Result<JsonValue, ToolFailure> {
    // The original's wording, which names its other spellings too.
    let raw_url = optional_trimmed(input, "url")?.ok_or_else(|| {
        invalid(
            "Provide 'url' (or 'fileUrl'/'downloadUrl') to download Slack file.",
            "Pass the file's url_private_download (or url_private).",
        )
    })?;
    let options = DownloadOptions::from_input(ctx, settings, input)?;
    let api = Api::new(&SERVICE, settings, input)?;
    let url = file_url(&raw_url, api.configured_base_url())?;
    let request = api.client().get(url).header(AUTHORIZATION, api.bearer()?);
    let mut download = api.download(request, &options).await?;
    let content_type = download.header(CONTENT_TYPE.as_str());
    let content_length = download.header("content-length").and_then(|value| value.parse::<u64>().ok());
    let size_bytes = download.bytes.len();
    let file_output = options.finish(&api, std::mem::take(&mut download.bytes), content_type.as_deref()).await?;
    Ok(json!({
        "ok": true,
        "url": api.redact(&raw_url),
        "contentType": content_type,
        "contentLength": content_length,
        "sizeBytes": size_bytes,
        "etag": download.header("etag"),
        "contentDisposition": download.header("content-disposition"),
        "savedPath": file_output.saved_path,
        "base64": file_output.base64,
        "dataUrl": file_output.data_url,
    }))
}

/// `raw` if the bot token may be sent there: `https://files.slack.com`, or
/// the origin of the operator's (or default) API base URL.
fn file_url(raw: &str, configured_base_url: &str) -> Result<Url, ToolFailure> {
    let url = Url::parse(raw).map_err(|_| {
        invalid(format!("'url' ({raw}) is not a valid URL"), "Pass the file's url_private_download from Slack.")
    })?;
    let slack_file_host = url.scheme() == "https" && url.host_str() == Some(FILE_HOST);
    let operator_origin = Url::parse(configured_base_url).is_ok_and(|base| base.origin() == url.origin());
    if slack_file_host || operator_origin {
        return Ok(url);
    }
    let shown = url.origin().ascii_serialization();
    Err(ToolFailure::with_code(
        format!(
            "refusing to send the Slack bot token to {shown}: downloadFile only fetches files from \
             https://{FILE_HOST} (or the operator's SLACK_API_BASE_URL host)"
        ),
        E_TOKEN_DESTINATION_REFUSED,
    )
    .named("TokenDestinationRefusedError")
    .suggest("Pass the url_private_download of a Slack file object; fetch other URLs with the http-fetch tool."))
}

/// Calls `method` with `payload` (JSON, bearer token) and returns Slack's
/// reply; a non-2xx status or `{ok: false}` becomes an error naming the
/// method and Slack's error code.
async fn call_method(api: &Api, method: &str, payload: &JsonObject) -> Result<JsonObject, ToolFailure> {
    let url = format!("{}/{method}", api.base_url());
    let request = api
        .client()
        .post(url)
        .header(AUTHORIZATION, api.bearer()?)
        .header(CONTENT_TYPE, "application/json; charset=utf-8");
    let (status, reply) = api.post_json(method, request, payload).await?;
    match reply {
        Some(reply) if status.is_success() && reply.get("ok") == Some(&JsonValue::Bool(true)) => Ok(reply),
        reply => {
            let reason = reply.as_ref().and_then(|r| r.get("error")).and_then(trimmed_str);
            Err(api.api_failure(method, "", &reason.unwrap_or_else(|| http_description(status))))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use goondan_core::codes::{
        E_FILE_TOO_LARGE, E_PATH_OUTSIDE_WORKDIR, E_TOKEN_DESTINATION_REFUSED, E_TOKEN_INVALID, E_TOKEN_MISSING,
        E_TOOL_INVALID_ARGS,
    };
    use goondan_core::{JsonValue, ToolStatus};
    use serde_json::json;

    use crate::BaseSettings;
    use crate::test_http::{
        Answer, TestServer, closed_base, endless_server, json_answer, settings_with, status_json_answer,
    };
    use crate::test_support::{assert_no_token, err, execute, ok, run, run_in};

    const ENV_TOKEN: &str = "xoxb-env-secret-token";

    /// A server answering every call with `reply` and settings pointing at
    /// it with the operator's token.
    async fn slack(reply: JsonValue) -> (TestServer, Arc<BaseSettings>) {
        let server = TestServer::start(move |_| json_answer(reply.clone())).await;
        let settings = settings_with(&[("SLACK_API_BASE_URL", server.base.as_str()), ("SLACK_BOT_TOKEN", ENV_TOKEN)]);
        (server, settings)
    }

    #[tokio::test]
    async fn send_posts_chat_post_message() {
        let (server, settings) = slack(
            json!({"ok": true, "channel": "C123", "ts": "1735200000.001000", "message": {"text": "hello slack"}}),
        )
        .await;
        let output = ok(run(
            "slack",
            "send",
            &settings,
            json!({"token": "xoxb-send-1", "channelId": "C123", "text": "hello slack", "threadTs": "1735200000.000999", "mrkdwn": true}),
        )
        .await);
        assert_eq!(
            output,
            json!({"ok": true, "channelId": "C123", "messageTs": "1735200000.001000", "text": "hello slack"})
        );
        let request = server.single();
        assert_eq!(request.method, "POST");
        assert_eq!(request.target, "/chat.postMessage");
        assert_eq!(request.header("authorization"), Some("Bearer xoxb-send-1"));
        assert_eq!(request.header("content-type"), Some("application/json; charset=utf-8"));
        assert_eq!(
            request.json(),
            json!({"channel": "C123", "text": "hello slack", "thread_ts": "1735200000.000999", "mrkdwn": true})
        );
    }

    #[tokio::test]
    async fn send_maps_every_option_and_falls_back_to_the_input() {
        let (server, settings) = slack(json!({"ok": true})).await;
        let output = ok(run(
            "slack",
            "send",
            &settings,
            json!({"channelId": " C9 ", "text": "hi", "unfurlLinks": false, "unfurlMedia": true, "replyBroadcast": true, "mrkdwn": false}),
        )
        .await);
        assert_eq!(output, json!({"ok": true, "channelId": "C9", "messageTs": null, "text": "hi"}));
        let request = server.single();
        assert_eq!(request.header("authorization"), Some(format!("Bearer {ENV_TOKEN}").as_str()));
        assert_eq!(
            request.json(),
            json!({"channel": "C9", "text": "hi", "mrkdwn": false, "unfurl_links": false, "unfurl_media": true, "reply_broadcast": true})
        );
    }

    #[tokio::test]
    async fn edit_posts_chat_update() {
        let (server, settings) = slack(json!({"ok": true, "channel": "C123", "ts": "1735200000.002000"})).await;
        let output = ok(run(
            "slack",
            "edit",
            &settings,
            json!({"token": "xoxb-edit-1", "channelId": "C123", "messageTs": "1735200000.001000", "text": "edited"}),
        )
        .await);
        assert_eq!(output, json!({"ok": true, "channelId": "C123", "messageTs": "1735200000.002000", "edited": true}));
        let request = server.single();
        assert_eq!(request.target, "/chat.update");
        assert_eq!(request.header("authorization"), Some("Bearer xoxb-edit-1"));
        assert_eq!(request.json(), json!({"channel": "C123", "ts": "1735200000.001000", "text": "edited"}));

        let (server, settings) = slack(json!({"ok": true})).await;
        let output = ok(run(
            "slack",
            "edit",
            &settings,
            json!({"channelId": "C1", "messageTs": "1.2", "text": "x", "mrkdwn": true}),
        )
        .await);
        assert_eq!(output, json!({"ok": true, "channelId": "C1", "messageTs": "1.2", "edited": true}));
        assert_eq!(server.single().json(), json!({"channel": "C1", "ts": "1.2", "text": "x", "mrkdwn": true}));
    }

    #[tokio::test]
    async fn delete_posts_chat_delete() {
        let (server, settings) = slack(json!({"ok": true})).await;
        let output = ok(run(
            "slack",
            "delete",
            &settings,
            json!({"token": "xoxb-delete-1", "channelId": "C123", "messageTs": "1735200000.003000"}),
        )
        .await);
        assert_eq!(output, json!({"ok": true, "channelId": "C123", "messageTs": "1735200000.003000", "deleted": true}));
        let request = server.single();
        assert_eq!(request.target, "/chat.delete");
        assert_eq!(request.json(), json!({"channel": "C123", "ts": "1735200000.003000"}));
    }

    #[tokio::test]
    async fn read_finds_a_message_in_the_history() {
        let (server, settings) = slack(json!({
            "ok": true,
            "messages": [{"type": "message", "ts": "1735200000.010000", "text": "lookup target"}, "junk"],
            "has_more": false,
        }))
        .await;
        let output = ok(run(
            "slack",
            "read",
            &settings,
            json!({"token": "xoxb-read-1", "channelId": "C123", "messageTs": "1735200000.010000"}),
        )
        .await);
        let message = json!({"type": "message", "ts": "1735200000.010000", "text": "lookup target"});
        assert_eq!(
            output,
            json!({
                "ok": true,
                "channelId": "C123",
                "method": "conversations.history",
                "messageTs": "1735200000.010000",
                "threadTs": null,
                "count": 1,
                "found": message,
                "messages": [message],
                "hasMore": false,
                "nextCursor": null,
            })
        );
        let request = server.single();
        assert_eq!(request.target, "/conversations.history");
        assert_eq!(request.header("authorization"), Some("Bearer xoxb-read-1"));
        assert_eq!(
            request.json(),
            json!({"channel": "C123", "latest": "1735200000.010000", "inclusive": true, "limit": 1})
        );
    }

    #[tokio::test]
    async fn read_uses_conversations_replies_for_a_thread() {
        let (server, settings) = slack(json!({
            "ok": true,
            "messages": [{"type": "message", "ts": "1735200000.020001", "thread_ts": "1735200000.020000", "text": "thread reply"}],
            "has_more": true,
            "response_metadata": {"next_cursor": "cursor-2"},
        }))
        .await;
        let output = ok(run(
            "slack",
            "read",
            &settings,
            json!({"channelId": "C123", "threadTs": "1735200000.020000", "limit": 5, "cursor": "cursor-1"}),
        )
        .await);
        assert_eq!(output["method"], json!("conversations.replies"));
        assert_eq!(output["count"], json!(1));
        assert_eq!(output["hasMore"], json!(true));
        assert_eq!(output["nextCursor"], json!("cursor-2"));
        assert_eq!(output["found"], json!(null));
        let request = server.single();
        assert_eq!(request.target, "/conversations.replies");
        assert_eq!(
            request.json(),
            json!({"channel": "C123", "ts": "1735200000.020000", "limit": 5, "cursor": "cursor-1"})
        );

        // Defaults and explicit bounds.
        let (server, settings) = slack(json!({"ok": true})).await;
        let output = ok(run(
            "slack",
            "read",
            &settings,
            json!({"channelId": "C1", "oldest": "1.0", "latest": "2.0", "inclusive": false, "limit": 7.9}),
        )
        .await);
        assert_eq!(output["count"], json!(0));
        assert_eq!(
            server.single().json(),
            json!({"channel": "C1", "latest": "2.0", "oldest": "1.0", "inclusive": false, "limit": 7})
        );
        let (server, settings) = slack(json!({"ok": true})).await;
        ok(run("slack", "read", &settings, json!({"channelId": "C1"})).await);
        assert_eq!(server.single().json(), json!({"channel": "C1", "limit": 20}));
    }

    #[tokio::test]
    async fn read_limits_are_checked() {
        let (server, settings) = slack(json!({"ok": true})).await;
        for (limit, message) in [
            (json!(0), "'limit' must be a positive number"),
            (json!(-2), "'limit' must be a positive number"),
            (json!(0.5), "'limit' must be between 1 and 1000"),
            (json!(1001), "'limit' must be between 1 and 1000"),
        ] {
            let failure = err(run("slack", "read", &settings, json!({"channelId": "C1", "limit": limit})).await);
            assert_eq!(failure.message, message);
            assert_eq!(failure.code.as_deref(), Some(E_TOOL_INVALID_ARGS));
        }
        ok(run("slack", "read", &settings, json!({"channelId": "C1", "limit": 1000})).await);
        assert_eq!(server.single().json()["limit"], json!(1000));
    }

    #[tokio::test]
    async fn blank_ids_are_refused_before_any_request() {
        let (server, settings) = slack(json!({"ok": true})).await;
        let cases = [
            ("send", json!({"channelId": " ", "text": "x"}), "'channelId' must be a non-empty string"),
            ("read", json!({"channelId": ""}), "'channelId' must be a non-empty string"),
            (
                "edit",
                json!({"channelId": "C1", "messageTs": " ", "text": "x"}),
                "'messageTs' must be a non-empty string",
            ),
            ("delete", json!({"channelId": "C1", "messageTs": ""}), "'messageTs' must be a non-empty string"),
            (
                "react",
                json!({"channelId": "C1", "messageTs": "", "emoji": "x"}),
                "'messageTs' must be a non-empty string",
            ),
            ("send", json!({"channelId": "C1", "text": "x", "timeoutMs": 0}), "'timeoutMs' must be a positive number"),
            (
                "downloadFile",
                json!({"url": "  "}),
                "Provide 'url' (or 'fileUrl'/'downloadUrl') to download Slack file.",
            ),
            // Slack would post (or edit to) an empty message; the original refuses it.
            ("send", json!({"channelId": "C1", "text": ""}), "'text' must be a non-empty string"),
            ("send", json!({"channelId": "C1"}), "'text' must be a non-empty string"),
            ("edit", json!({"channelId": "C1", "messageTs": "1.2", "text": ""}), "'text' must be a non-empty string"),
            ("downloadFile", json!({"url": "files.slack.com/x"}), "'url' (files.slack.com/x) is not a valid URL"),
        ];
        for (export, input, message) in cases {
            let failure = err(run("slack", export, &settings, input.clone()).await);
            assert_eq!(failure.message, message, "{export} {input}");
            assert_eq!(failure.code.as_deref(), Some(E_TOOL_INVALID_ARGS), "{export} {input}");
            assert!(failure.suggestion.is_some());
        }
        assert!(server.requests().is_empty());
    }

    #[tokio::test]
    async fn react_adds_each_unique_emoji() {
        let (server, settings) = slack(json!({"ok": true})).await;
        let output = ok(run(
            "slack",
            "react",
            &settings,
            json!({"token": "xoxb-react-1", "channelId": "C123", "messageTs": "1735200000.004000", "emoji": ":rocket:", "emojis": ["thumbsup", ":rocket:", " "]}),
        )
        .await);
        assert_eq!(
            output,
            json!({"ok": true, "channelId": "C123", "messageTs": "1735200000.004000", "reactionCount": 2, "emojis": ["rocket", "thumbsup"]})
        );
        let requests = server.requests();
        assert_eq!(requests.len(), 2);
        for (request, name) in requests.iter().zip(["rocket", "thumbsup"]) {
            assert_eq!(request.target, "/reactions.add");
            assert_eq!(request.header("authorization"), Some("Bearer xoxb-react-1"));
            assert_eq!(request.json(), json!({"channel": "C123", "timestamp": "1735200000.004000", "name": name}));
        }

        let (server, settings) = slack(json!({"ok": true})).await;
        for (input, message) in [
            (json!({"channelId": "C1", "messageTs": "1.2"}), "Provide 'emoji' or 'emojis' to add Slack reaction."),
            (
                json!({"channelId": "C1", "messageTs": "1.2", "emoji": ": :", "emojis": [" "]}),
                "Provide 'emoji' or 'emojis' to add Slack reaction.",
            ),
            (
                json!({"channelId": "C1", "messageTs": "1.2", "emojis": ["ok", "thumbs up"]}),
                "Invalid emoji name 'thumbs up'. Emoji names must not contain whitespace.",
            ),
        ] {
            let failure = err(run("slack", "react", &settings, input.clone()).await);
            assert_eq!(failure.message, message, "{input}");
            assert_eq!(failure.code.as_deref(), Some(E_TOOL_INVALID_ARGS), "{input}");
        }
        assert!(server.requests().is_empty());
    }

    #[tokio::test]
    async fn api_failures_name_the_method_and_slack_error() {
        let (_server, settings) = slack(json!({"ok": false, "error": "channel_not_found"})).await;
        let failure =
            err(run("slack", "send", &settings, json!({"token": "xoxb-send-2", "channelId": "C404", "text": "hello"}))
                .await);
        assert_eq!(failure.message, "[slack] chat.postMessage failed: channel_not_found");
        assert_eq!(failure.code.as_deref(), Some("E_SLACK_API"));
        assert_eq!(failure.help_url.as_deref(), Some("https://api.slack.com/methods/chat.postMessage"));
        assert!(failure.suggestion.is_some());

        // A failing reaction stops the loop.
        let server = TestServer::start(|request| {
            if request.json()["name"] == json!("second") {
                json_answer(json!({"ok": false, "error": "already_reacted"}))
            } else {
                json_answer(json!({"ok": true}))
            }
        })
        .await;
        let settings = settings_with(&[("SLACK_API_BASE_URL", &server.base), ("SLACK_BOT_TOKEN", ENV_TOKEN)]);
        let failure = err(run(
            "slack",
            "react",
            &settings,
            json!({"channelId": "C1", "messageTs": "1.2", "emojis": ["first", "second", "third"]}),
        )
        .await);
        assert_eq!(failure.message, "[slack] reactions.add failed: already_reacted");
        assert_eq!(server.requests().len(), 2);

        // HTTP errors without a Slack reply.
        let server = TestServer::start(|_| Answer { status: 429, headers: vec![], body: b"slow down".to_vec() }).await;
        let settings = settings_with(&[("SLACK_API_BASE_URL", &server.base), ("SLACK_BOT_TOKEN", ENV_TOKEN)]);
        let failure = err(run("slack", "delete", &settings, json!({"channelId": "C1", "messageTs": "1.2"})).await);
        assert_eq!(failure.message, "[slack] chat.delete failed: HTTP 429 Too Many Requests");
        let server = TestServer::start(|_| status_json_answer(500, json!({"ok": true}))).await;
        let settings = settings_with(&[("SLACK_API_BASE_URL", &server.base), ("SLACK_BOT_TOKEN", ENV_TOKEN)]);
        let failure = err(run("slack", "read", &settings, json!({"channelId": "C1"})).await);
        assert_eq!(failure.message, "[slack] conversations.history failed: HTTP 500 Internal Server Error");
    }

    #[tokio::test]
    async fn missing_token_names_the_variables() {
        let (server, _) = slack(json!({"ok": true})).await;
        let settings = settings_with(&[("SLACK_API_BASE_URL", &server.base)]);
        let failure = err(run("slack", "send", &settings, json!({"channelId": "C1", "text": "x"})).await);
        assert_eq!(
            failure.message,
            "Slack bot token not found. Provide 'token' or set SLACK_BOT_TOKEN/SLACK_TOKEN/BRAIN_SLACK_BOT_TOKEN."
        );
        assert_eq!(failure.code.as_deref(), Some(E_TOKEN_MISSING));
        assert!(server.requests().is_empty());
        let settings = settings_with(&[("SLACK_API_BASE_URL", &server.base), ("SLACK_TOKEN", "xoxb-second")]);
        ok(run("slack", "delete", &settings, json!({"channelId": "C1", "messageTs": "1.2"})).await);
        assert_eq!(server.single().header("authorization"), Some("Bearer xoxb-second"));
    }

    #[tokio::test]
    async fn the_originals_last_fallback_token_is_read_last() {
        let (server, _) = slack(json!({"ok": true})).await;
        let base = ("SLACK_API_BASE_URL", server.base.as_str());
        let settings = settings_with(&[base, ("BRAIN_SLACK_BOT_TOKEN", "xoxb-brain")]);
        ok(run("slack", "delete", &settings, json!({"channelId": "C1", "messageTs": "1.2"})).await);
        assert_eq!(server.single().header("authorization"), Some("Bearer xoxb-brain"));
        let settings = settings_with(&[base, ("BRAIN_SLACK_BOT_TOKEN", "xoxb-brain"), ("SLACK_TOKEN", "xoxb-second")]);
        ok(run("slack", "delete", &settings, json!({"channelId": "C1", "messageTs": "1.2"})).await);
        let last = server.requests().last().and_then(|r| r.header("authorization").map(str::to_owned));
        assert_eq!(last.as_deref(), Some("Bearer xoxb-second"));
    }

    #[tokio::test]
    async fn a_token_that_cannot_be_a_header_is_refused() {
        let (server, settings) = slack(json!({"ok": true})).await;
        let failure = err(run(
            "slack",
            "delete",
            &settings,
            json!({"channelId": "C1", "messageTs": "1.2", "token": "xoxb\nbad"}),
        )
        .await);
        assert_eq!(failure.code.as_deref(), Some(E_TOKEN_INVALID));
        assert_no_token(&failure, "xoxb\nbad");
        assert!(server.requests().is_empty());
    }

    #[tokio::test]
    async fn the_operator_token_never_goes_to_a_base_url_from_the_input() {
        let (operator, settings) = slack(json!({"ok": true})).await;
        let elsewhere = TestServer::start(|_| json_answer(json!({"ok": true}))).await;
        for (export, input) in [
            ("send", json!({"channelId": "C1", "text": "x", "apiBaseUrl": elsewhere.base})),
            ("read", json!({"channelId": "C1", "apiBaseUrl": format!("{}/api", elsewhere.base)})),
            ("react", json!({"channelId": "C1", "messageTs": "1.2", "emoji": "x", "apiBaseUrl": elsewhere.base})),
        ] {
            let failure = err(run("slack", export, &settings, input).await);
            assert_eq!(failure.code.as_deref(), Some(E_TOKEN_DESTINATION_REFUSED), "{export}");
            assert!(failure.message.contains("SLACK_BOT_TOKEN"), "{}", failure.message);
            assert_no_token(&failure, ENV_TOKEN);
        }
        assert!(elsewhere.requests().is_empty());
        assert!(operator.requests().is_empty());
        // The operator's base URL itself may be named.
        ok(run(
            "slack",
            "delete",
            &settings,
            json!({"channelId": "C1", "messageTs": "1.2", "apiBaseUrl": format!("{}/", operator.base)}),
        )
        .await);
        assert_eq!(operator.single().target, "/chat.delete");
    }

    #[tokio::test]
    async fn the_operator_token_never_goes_to_the_default_base_url_when_another_is_configured() {
        let (operator, settings) = slack(json!({"ok": true})).await;
        let failure = err(run(
            "slack",
            "send",
            &settings,
            json!({"channelId": "C1", "text": "x", "apiBaseUrl": "https://slack.com/api"}),
        )
        .await);
        assert_eq!(failure.code.as_deref(), Some(E_TOKEN_DESTINATION_REFUSED), "{failure:?}");
        assert_no_token(&failure, ENV_TOKEN);
        assert!(operator.requests().is_empty());
    }

    #[tokio::test]
    async fn results_never_carry_the_token() {
        let message = json!({"type": "message", "ts": "1.1", "text": format!("oops: {ENV_TOKEN}")});
        let (_server, settings) = slack(json!({"ok": true, "messages": [message]})).await;
        let output = ok(run("slack", "read", &settings, json!({"channelId": "C1", "messageTs": "1.1"})).await);
        assert_eq!(output["messages"][0]["text"], json!("oops: <redacted>"));
        assert_eq!(output["found"]["text"], json!("oops: <redacted>"));
        assert_no_token(&output, ENV_TOKEN);
    }

    #[tokio::test]
    async fn a_token_from_the_input_may_go_to_a_base_url_from_the_input() {
        let (operator, settings) = slack(json!({"ok": true})).await;
        let settings = crate::test_http::allowing_loopback(&settings);
        let elsewhere = TestServer::start(|_| json_answer(json!({"ok": true, "ts": "9.9"}))).await;
        let output = ok(run(
            "slack",
            "send",
            &settings,
            json!({"channelId": "C1", "text": "x", "token": "xoxb-own", "apiBaseUrl": format!("{}/api/", elsewhere.base)}),
        )
        .await);
        assert_eq!(output["messageTs"], json!("9.9"));
        let request = elsewhere.single();
        assert_eq!(request.target, "/api/chat.postMessage");
        assert_eq!(request.header("authorization"), Some("Bearer xoxb-own"));
        assert!(operator.requests().is_empty());
    }

    #[tokio::test]
    async fn connection_errors_name_the_method_without_the_token() {
        let closed = closed_base().await;
        let settings = settings_with(&[("SLACK_API_BASE_URL", &closed), ("SLACK_BOT_TOKEN", ENV_TOKEN)]);
        let failure = err(run("slack", "send", &settings, json!({"channelId": "C1", "text": "x"})).await);
        assert!(
            failure.message.starts_with(&format!("[slack] chat.postMessage request to {closed} failed: ")),
            "{}",
            failure.message
        );
        assert_eq!(failure.code.as_deref(), Some("E_SLACK_REQUEST"));
        assert_no_token(&failure, ENV_TOKEN);
        let failure =
            err(run("slack", "downloadFile", &settings, json!({"url": format!("{closed}/files/x.png")})).await);
        assert!(failure.message.starts_with("[slack] file download request failed: "), "{}", failure.message);
        assert_no_token(&failure, ENV_TOKEN);
        let result = execute("slack", &settings, "read", json!({"channelId": "C1"})).await;
        assert_eq!(result.status, ToolStatus::Error);
        assert_no_token(&result, ENV_TOKEN);
    }

    #[tokio::test]
    async fn download_file_sends_the_bearer_token_to_the_operators_host() {
        let server = TestServer::start(|_| Answer {
            status: 200,
            headers: vec![
                ("content-type", "image/png".to_owned()),
                ("etag", "\"abc\"".to_owned()),
                ("content-disposition", "attachment; filename=\"a.png\"".to_owned()),
            ],
            body: vec![1, 2, 3],
        })
        .await;
        let settings =
            settings_with(&[("SLACK_API_BASE_URL", &format!("{}/api", server.base)), ("SLACK_BOT_TOKEN", ENV_TOKEN)]);
        let dir = crate::test_support::workdir();
        let workdir = dir.path.clone();
        let url = format!("{}/files-pri/T1-F1/a.png?t=1", server.base);
        let output =
            ok(run_in("slack", "downloadFile", &settings, &workdir, json!({"url": url, "savePath": "in/a.png"})).await);
        let saved = workdir.join("in/a.png");
        assert_eq!(
            output,
            json!({
                "ok": true,
                "url": url,
                "contentType": "image/png",
                "contentLength": 3,
                "sizeBytes": 3,
                "etag": "\"abc\"",
                "contentDisposition": "attachment; filename=\"a.png\"",
                "savedPath": saved.to_string_lossy(),
                "base64": "AQID",
                "dataUrl": "data:image/png;base64,AQID",
            })
        );
        assert_eq!(std::fs::read(&saved).ok(), Some(vec![1, 2, 3]));
        let request = server.single();
        assert_eq!(request.method, "GET");
        assert_eq!(request.target, "/files-pri/T1-F1/a.png?t=1");
        assert_eq!(request.header("authorization"), Some(format!("Bearer {ENV_TOKEN}").as_str()));

        let failure =
            err(run_in("slack", "downloadFile", &settings, &workdir, json!({"url": url, "savePath": "../out.png"}))
                .await);
        assert_eq!(failure.code.as_deref(), Some(E_PATH_OUTSIDE_WORKDIR));
        assert_eq!(server.requests().len(), 1);
    }

    #[tokio::test]
    async fn download_file_refuses_other_hosts() {
        let (operator, settings) = slack(json!({"ok": true})).await;
        let elsewhere = TestServer::start(|_| Answer { status: 200, headers: vec![], body: vec![1] }).await;
        for url in [
            format!("{}/files-pri/x.png", elsewhere.base),
            "http://files.slack.com/files-pri/x.png".to_owned(),
            "https://files.slack.com.evil.example/x.png".to_owned(),
            "https://evil.example/?files.slack.com".to_owned(),
            "http://169.254.169.254/latest/meta-data/".to_owned(),
        ] {
            // Whatever the token's source.
            for input in [json!({"url": url}), json!({"url": url, "token": "xoxb-own"})] {
                let failure = err(run("slack", "downloadFile", &settings, input).await);
                assert_eq!(failure.code.as_deref(), Some(E_TOKEN_DESTINATION_REFUSED), "{url}");
                assert!(failure.message.starts_with("refusing to send the Slack bot token to "), "{}", failure.message);
                assert!(failure.suggestion.is_some());
            }
        }
        assert!(elsewhere.requests().is_empty());
        assert!(operator.requests().is_empty());
    }

    #[tokio::test]
    async fn download_file_enforces_max_bytes() {
        let server = TestServer::start(|_| Answer { status: 200, headers: vec![], body: vec![7; 2048] }).await;
        let settings = settings_with(&[("SLACK_API_BASE_URL", &server.base), ("SLACK_BOT_TOKEN", ENV_TOKEN)]);
        let url = format!("{}/f", server.base);
        let failure = err(run("slack", "downloadFile", &settings, json!({"url": url, "maxBytes": 2047})).await);
        assert_eq!(failure.message, "[slack] file exceeds maxBytes limit (2048 > 2047)");
        assert_eq!(failure.code.as_deref(), Some(E_FILE_TOO_LARGE));
        let output =
            ok(run("slack", "downloadFile", &settings, json!({"url": url, "maxBytes": 2048, "includeBase64": false}))
                .await);
        assert_eq!(
            (output["sizeBytes"].clone(), output["base64"].clone(), output["dataUrl"].clone()),
            (json!(2048), json!(null), json!(null))
        );
        // No content type: no data URL.
        let output = ok(run("slack", "downloadFile", &settings, json!({"url": url})).await);
        assert_eq!((output["contentType"].clone(), output["dataUrl"].clone()), (json!(null), json!(null)));
        assert!(output["base64"].is_string());

        let (endless, task) = endless_server(None).await;
        let settings = settings_with(&[("SLACK_API_BASE_URL", &endless), ("SLACK_BOT_TOKEN", ENV_TOKEN)]);
        let failure =
            err(run("slack", "downloadFile", &settings, json!({"url": format!("{endless}/big"), "maxBytes": 300_000}))
                .await);
        assert_eq!(failure.message, "[slack] file exceeds maxBytes limit (more than 300000 bytes)");
        task.abort();

        let failure =
            err(run("slack", "downloadFile", &settings, json!({"url": format!("{endless}/big"), "maxBytes": 0})).await);
        assert_eq!(failure.message, "'maxBytes' must be a positive number");

        let server = TestServer::start(|_| Answer { status: 403, headers: vec![], body: vec![b'x'; 4096] }).await;
        let settings = settings_with(&[("SLACK_API_BASE_URL", &server.base), ("SLACK_BOT_TOKEN", ENV_TOKEN)]);
        let failure =
            err(run("slack", "downloadFile", &settings, json!({"url": format!("{}/f", server.base), "maxBytes": 10}))
                .await);
        assert_eq!(failure.message, "[slack] file download failed: HTTP 403 Forbidden");
        assert_eq!(failure.code.as_deref(), Some("E_SLACK_API"));
    }

    #[tokio::test]
    async fn the_executor_rejects_missing_and_wrong_typed_arguments() {
        let (server, settings) = slack(json!({"ok": true, "ts": "1.1"})).await;
        for (export, args) in [
            ("send", json!({"text": "x"})),
            ("send", json!({"channelId": 5, "text": "x"})),
            ("send", json!({"channelId": "C1"})),
            ("send", json!({"channelId": "C1", "text": "x", "mrkdwn": "yes"})),
            ("read", json!({"channelId": "C1", "limit": "5"})),
            ("read", json!({"channel": "C1"})),
            ("edit", json!({"channelId": "C1", "messageTs": "1.2"})),
            ("delete", json!({"channelId": "C1", "messageTs": 1.2})),
            ("react", json!({"channelId": "C1", "messageTs": "1.2", "emojis": [1]})),
            ("downloadFile", json!({"maxBytes": 5})),
            ("downloadFile", json!({"url": "https://files.slack.com/x", "includeBase64": "no"})),
        ] {
            let result = execute("slack", &settings, export, args.clone()).await;
            assert_eq!(result.status, ToolStatus::Error, "{export} {args}");
            assert_eq!(result.error_code(), Some("E_TOOL_INVALID_ARGS"), "{export} {args}");
        }
        assert!(server.requests().is_empty());
        let result = execute("slack", &settings, "send", json!({"channelId": "C1", "text": "x"})).await;
        assert_eq!(result.status, ToolStatus::Ok);
        assert_eq!(result.output.as_ref().map(|o| o["messageTs"].clone()), Some(json!("1.1")));
    }

    #[test]
    fn unknown_export() {
        assert!(super::handler("postMessage", &crate::test_support::settings()).is_none());
    }
}
