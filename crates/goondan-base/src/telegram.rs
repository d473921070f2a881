//! The `telegram` tool: the Bot API calls of the original `@goondan/base`
//! tool, with its request bodies and output fields — `send` (sendMessage),
//! `edit` (editMessageText), `delete` (deleteMessage), `react`
//! (setMessageReaction), `setChatAction` (sendChatAction) and `downloadFile`
//! (getFile, then `<base>/file/bot<token>/<file_path>`).
//!
//! The token comes from the call's `token` or the operator's environment
//! (`TELEGRAM_BOT_TOKEN`, `BOT_TOKEN`, `TELEGRAM_TOKEN`, then the original's
//! fallback `BRAIN_TELEGRAM_BOT_TOKEN`); the API base URL from
//! `TELEGRAM_API_BASE_URL` (default `https://api.telegram.org`). Unlike the
//! original, the operator's token is never sent to an `apiBaseUrl` the model
//! chose, and no token appears in an error or a result: the Bot API carries
//! the token in the URL path, which HTTP client errors quote, so every message
//! is scrubbed, `downloadUrl` shows `<redacted>` in its place, and any
//! string of a result that quotes it is redacted too.
//!
//! What this tool shares with `slack` (token and base URL selection, JSON
//! calls, bounded downloads, atomic `savePath` writes) lives in the
//! crate-private `bot_api` module.

use std::sync::Arc;

use goondan_core::codes::{E_TELEGRAM_API, E_TELEGRAM_REQUEST};
use goondan_core::{JsonObject, JsonValue};
use goondan_tools::{ToolContext, ToolFailure, ToolHandler};
use reqwest::header::CONTENT_TYPE;
use serde_json::json;

use crate::BaseSettings;
use crate::args;
use crate::bot_api::{self, Api, DownloadOptions, ExportFn, Service, bool_value, invalid, put, required_text};

/// How the Bot API is reached and how its failures are reported.
const SERVICE: Service = Service {
    name: "Telegram",
    tag: "telegram",
    token_vars: &["TELEGRAM_BOT_TOKEN", "BOT_TOKEN", "TELEGRAM_TOKEN", "BRAIN_TELEGRAM_BOT_TOKEN"],
    missing_token_vars: "TELEGRAM_BOT_TOKEN/BOT_TOKEN/TELEGRAM_TOKEN",
    base_url_var: "TELEGRAM_API_BASE_URL",
    default_base_url: "https://api.telegram.org",
    token_in_url: true,
    api_error_code: E_TELEGRAM_API,
    request_error_code: E_TELEGRAM_REQUEST,
    api_suggestion: "Check the chat id, the message id and the bot's rights in the chat; Telegram's description says \
                     what it rejected.",
    docs_url: telegram_docs_url,
};

fn telegram_docs_url(method: &str) -> String {
    format!("https://core.telegram.org/bots/api#{}", method.to_ascii_lowercase())
}

/// `parseMode` spellings (normalized) and the Bot API's `parse_mode` values.
const PARSE_MODES: &[(&str, &str)] =
    &[("markdown", "Markdown"), ("markdownv2", "MarkdownV2"), ("markdown-v2", "MarkdownV2"), ("html", "HTML")];

/// `action` spellings (normalized) and the Bot API's chat actions.
const CHAT_ACTIONS: &[(&str, &str)] = &[
    ("typing", "typing"),
    ("upload-photo", "upload_photo"),
    ("record-video", "record_video"),
    ("upload-video", "upload_video"),
    ("record-voice", "record_voice"),
    ("upload-voice", "upload_voice"),
    ("upload-document", "upload_document"),
    ("choose-sticker", "choose_sticker"),
    ("find-location", "find_location"),
    ("record-video-note", "record_video_note"),
    ("upload-video-note", "upload_video_note"),
];

/// The handler of `export`, or `None` if the tool has no such export.
pub fn handler(export: &str, settings: &Arc<BaseSettings>) -> Option<Arc<dyn ToolHandler>> {
    let export: ExportFn = match export {
        "send" => |_, settings, input| Box::pin(send(settings, input)),
        "edit" => |_, settings, input| Box::pin(edit(settings, input)),
        "delete" => |_, settings, input| Box::pin(delete(settings, input)),
        "react" => |_, settings, input| Box::pin(react(settings, input)),
        "setChatAction" => |_, settings, input| Box::pin(set_chat_action(settings, input)),
        "downloadFile" => |ctx, settings, input| Box::pin(download_file(ctx, settings, input)),
        _ => return None,
    };
    Some(bot_api::handler(&SERVICE, settings, export))
}

async fn send(settings: &BaseSettings, input: &JsonObject) -> Result<JsonValue, ToolFailure> {
    let chat_id = chat_id(input)?;
    let text = required_text(input, "text")?;
    let mut payload = JsonObject::new();
    put(&mut payload, "chat_id", Some(json!(chat_id)));
    put(&mut payload, "text", Some(json!(text)));
    put(&mut payload, "parse_mode", parse_mode(input)?.map(JsonValue::from));
    put(&mut payload, "disable_notification", bool_value(input, "disableNotification")?);
    put(&mut payload, "disable_web_page_preview", bool_value(input, "disableWebPagePreview")?);
    put(&mut payload, "reply_to_message_id", optional_message_id(input, "replyToMessageId")?.map(JsonValue::from));
    put(&mut payload, "allow_sending_without_reply", bool_value(input, "allowSendingWithoutReply")?);
    let api = Api::new(&SERVICE, settings, input)?;
    let result = call_method(&api, "sendMessage", &payload).await?;
    Ok(json!({
        "ok": true,
        "chatId": chat_id,
        "messageId": result.get("message_id").and_then(positive_integer),
        "date": result.get("date").and_then(JsonValue::as_i64),
        "text": result.get("text").and_then(bot_api::trimmed_str),
    }))
}

async fn edit(settings: &BaseSettings, input: &JsonObject) -> Result<JsonValue, ToolFailure> {
    let chat_id = chat_id(input)?;
    let message_id = message_id(input, "messageId")?;
    let text = required_text(input, "text")?;
    let mut payload = JsonObject::new();
    put(&mut payload, "chat_id", Some(json!(chat_id)));
    put(&mut payload, "message_id", Some(json!(message_id)));
    put(&mut payload, "text", Some(json!(text)));
    put(&mut payload, "parse_mode", parse_mode(input)?.map(JsonValue::from));
    put(&mut payload, "disable_web_page_preview", bool_value(input, "disableWebPagePreview")?);
    let api = Api::new(&SERVICE, settings, input)?;
    let result = call_method(&api, "editMessageText", &payload).await?;
    // Edits of inline messages return `true` instead of the message.
    let edited_id = result.get("message_id").and_then(positive_integer).unwrap_or(message_id);
    Ok(json!({"ok": true, "chatId": chat_id, "messageId": edited_id, "edited": true}))
}

async fn delete(settings: &BaseSettings, input: &JsonObject) -> Result<JsonValue, ToolFailure> {
    let chat_id = chat_id(input)?;
    let message_id = message_id(input, "messageId")?;
    let mut payload = JsonObject::new();
    put(&mut payload, "chat_id", Some(json!(chat_id)));
    put(&mut payload, "message_id", Some(json!(message_id)));
    let api = Api::new(&SERVICE, settings, input)?;
    call_method(&api, "deleteMessage", &payload).await?;
    Ok(json!({"ok": true, "chatId": chat_id, "messageId": message_id, "deleted": true}))
}

async fn react(settings: &BaseSettings, input: &JsonObject) -> Result<JsonValue, ToolFailure> {
    let chat_id = chat_id(input)?;
    let message_id = message_id(input, "messageId")?;
    let is_big = args::optional_bool(input, "isBig")?;
    let cleared = args::optional_bool(input, "clear")?.unwrap_or(false);
    // With `clear`, an empty reaction list removes the bot's reactions.
    let emojis = if cleared { Vec::new() } else { reaction_emojis(input)? };
    let reactions: Vec<JsonValue> = emojis.iter().map(|emoji| json!({"type": "emoji", "emoji": emoji})).collect();
    let mut payload = JsonObject::new();
    put(&mut payload, "chat_id", Some(json!(chat_id)));
    put(&mut payload, "message_id", Some(json!(message_id)));
    put(&mut payload, "reaction", Some(JsonValue::from(reactions)));
    put(&mut payload, "is_big", is_big.map(JsonValue::from));
    let api = Api::new(&SERVICE, settings, input)?;
    call_method(&api, "setMessageReaction", &payload).await?;
    Ok(json!({
        "ok": true,
        "chatId": chat_id,
        "messageId": message_id,
        "cleared": cleared,
        "reactionCount": emojis.len(),
        "emojis": emojis,
    }))
}

async fn set_chat_action(settings: &BaseSettings, input: &JsonObject) -> Result<JsonValue, ToolFailure> {
    let chat_id = chat_id(input)?;
    let action = chat_action(input)?;
    let mut payload = JsonObject::new();
    put(&mut payload, "chat_id", Some(json!(chat_id)));
    put(&mut payload, "action", Some(json!(action)));
    let api = Api::new(&SERVICE, settings, input)?;
    call_method(&api, "sendChatAction", &payload).await?;
    Ok(json!({"ok": true, "chatId": chat_id, "status": action, "action": action}))
}

async fn download_file(
    ctx: &ToolContext,
    settings: &BaseSettings,
    input: &JsonObject,
) -> Result<JsonValue, ToolFailure> {
    // The original's wording, which names its `file_id` spelling too.
    let file_id = bot_api::optional_trimmed(input, "fileId")?.ok_or_else(|| {
        invalid(
            "Provide 'fileId' (or 'file_id') for Telegram file download.",
            "Pass the file_id of the message's photo, document, voice or video.",
        )
    })?;
    let options = DownloadOptions::from_input(ctx, settings, input)?;
    let api = Api::new(&SERVICE, settings, input)?;
    let mut payload = JsonObject::new();
    put(&mut payload, "file_id", Some(json!(file_id)));
    let result = call_method(&api, "getFile", &payload).await?;
    let Some(file) = result.as_object() else {
        return Err(api.api_failure("getFile", "", "returned an invalid result payload"));
    };
    let (Some(file_id), Some(file_path)) =
        (file.get("file_id").and_then(bot_api::trimmed_str), file.get("file_path").and_then(bot_api::trimmed_str))
    else {
        return Err(api.api_failure("getFile", "", "result is missing file_id/file_path"));
    };
    let file_size = file.get("file_size").and_then(JsonValue::as_f64).filter(|n| n.is_finite()).map(f64::trunc);
    let url = format!("{}/file/bot{}/{file_path}", api.base_url(), api.token());
    let mut download = api.download(api.client().get(url), &options).await?;
    let content_type = download.header(CONTENT_TYPE.as_str());
    let size_bytes = download.bytes.len();
    let file_output = options.finish(&api, std::mem::take(&mut download.bytes), content_type.as_deref()).await?;
    Ok(json!({
        "ok": true,
        "fileId": file_id,
        "fileUniqueId": file.get("file_unique_id").and_then(bot_api::trimmed_str),
        "filePath": file_path,
        "fileSize": file_size.map(args::number_value),
        "downloadUrl": format!("{}/file/bot{}/{file_path}", api.base_url(), bot_api::REDACTED),
        "contentType": content_type,
        "sizeBytes": size_bytes,
        "savedPath": file_output.saved_path,
        "base64": file_output.base64,
        "dataUrl": file_output.data_url,
    }))
}

/// Calls `method` with `payload` and returns the reply's `result`; a non-2xx
/// status or `{ok: false}` becomes an error naming the method, Telegram's
/// `error_code` and `description`.
async fn call_method(api: &Api, method: &str, payload: &JsonObject) -> Result<JsonValue, ToolFailure> {
    let url = format!("{}/bot{}/{method}", api.base_url(), api.token());
    let request = api.client().post(url).header(CONTENT_TYPE, "application/json");
    let (status, body) = api.post_json(method, request, payload).await?;
    let mut body = body.unwrap_or_default();
    if status.is_success() && body.get("ok") == Some(&JsonValue::Bool(true)) {
        return Ok(body.shift_remove("result").unwrap_or(JsonValue::Null));
    }
    let description =
        body.get("description").and_then(bot_api::trimmed_str).unwrap_or_else(|| bot_api::http_description(status));
    let code =
        body.get("error_code").and_then(JsonValue::as_i64).map(|code| format!(" (code {code})")).unwrap_or_default();
    Err(api.api_failure(method, &code, &description))
}

/// `chatId`: a non-empty string (as given, trimmed) or an integer.
fn chat_id(input: &JsonObject) -> Result<String, ToolFailure> {
    let value = input.get("chatId");
    if let Some(text) = value.and_then(bot_api::trimmed_str) {
        return Ok(text);
    }
    value.and_then(integer).map(|id| id.to_string()).ok_or_else(|| {
        invalid(
            "'chatId' must be a non-empty string or integer",
            "Pass the chat's id, e.g. 123456789, \"-1001234567890\" or \"@channelname\".",
        )
    })
}

/// A positive integer message id (a number, or a string of digits).
fn message_id(input: &JsonObject, key: &str) -> Result<i64, ToolFailure> {
    input.get(key).and_then(positive_integer).ok_or_else(|| {
        invalid(format!("'{key}' must be a positive integer"), "Pass the message_id Telegram reported for the message.")
    })
}

fn optional_message_id(input: &JsonObject, key: &str) -> Result<Option<i64>, ToolFailure> {
    match input.get(key) {
        None | Some(JsonValue::Null) => Ok(None),
        Some(_) => message_id(input, key).map(Some),
    }
}

/// An integer from a whole JSON number or a string like `-42`.
fn integer(value: &JsonValue) -> Option<i64> {
    match value {
        JsonValue::Number(number) => number.as_i64().or_else(|| {
            let float = number.as_f64()?;
            // Whole floats (e.g. 23.0) count, as in JavaScript; 2^63 is out of range.
            const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;
            (float.fract() == 0.0 && float.abs() < TWO_POW_63).then_some(float as i64)
        }),
        JsonValue::String(text) => {
            let text = text.trim();
            let digits = text.strip_prefix('-').unwrap_or(text);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            text.parse().ok()
        }
        _ => None,
    }
}

fn positive_integer(value: &JsonValue) -> Option<i64> {
    integer(value).filter(|id| *id > 0)
}

/// Lower case, with runs of spaces and underscores turned into `-`.
fn normalize_alias(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for c in raw.trim().chars() {
        if c.is_whitespace() || c == '_' {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.extend(c.to_lowercase());
        }
    }
    out
}

fn aliases(table: &[(&str, &str)]) -> String {
    table.iter().map(|(alias, _)| *alias).collect::<Vec<_>>().join(", ")
}

fn parse_mode(input: &JsonObject) -> Result<Option<&'static str>, ToolFailure> {
    let Some(raw) = args::optional_string(input, "parseMode")?.filter(|raw| !raw.trim().is_empty()) else {
        return Ok(None);
    };
    let normalized = normalize_alias(raw);
    match PARSE_MODES.iter().find(|(alias, _)| *alias == normalized) {
        Some((_, mode)) => Ok(Some(mode)),
        None => Err(invalid(
            format!("Unsupported parseMode '{raw}'. Use one of: {}.", aliases(PARSE_MODES)),
            "Omit 'parseMode' for plain text.",
        )),
    }
}

fn chat_action(input: &JsonObject) -> Result<&'static str, ToolFailure> {
    let raw = args::optional_string(input, "action")?.unwrap_or("typing");
    let normalized = normalize_alias(raw);
    match CHAT_ACTIONS.iter().find(|(alias, _)| *alias == normalized) {
        Some((_, action)) => Ok(action),
        None => Err(invalid(
            format!("Unsupported chat action '{raw}'. Use one of: {}.", aliases(CHAT_ACTIONS)),
            "Use 'typing' while preparing a text reply.",
        )),
    }
}

/// `emoji` then `emojis`, trimmed, without blanks or repeats.
fn reaction_emojis(input: &JsonObject) -> Result<Vec<String>, ToolFailure> {
    let mut emojis: Vec<String> = Vec::new();
    let single = args::optional_string(input, "emoji")?;
    let many = match input.get("emojis") {
        None | Some(JsonValue::Null) => Vec::new(),
        Some(_) => args::require_string_array(input, "emojis")?,
    };
    for emoji in single.into_iter().chain(many).map(str::trim) {
        if !emoji.is_empty() && !emojis.iter().any(|known| known == emoji) {
            emojis.push(emoji.to_owned());
        }
    }
    if emojis.is_empty() {
        return Err(invalid(
            "Provide 'emoji' or 'emojis' to set message reaction, or set 'clear=true' to remove reactions.",
            "Pass an emoji such as \"👍\", or clear: true.",
        ));
    }
    Ok(emojis)
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
        Answer, TestServer, allowing_loopback, closed_base, endless_server, json_answer, settings_with,
        status_json_answer,
    };
    use crate::test_support::{assert_no_token, err, execute, ok, run, run_in};

    const ENV_TOKEN: &str = "123456:ENV-secret_token";

    /// A server answering `{ok: true, result}` and settings pointing at it
    /// with the operator's token.
    async fn telegram(result: JsonValue) -> (TestServer, Arc<BaseSettings>) {
        let server = TestServer::start(move |_| json_answer(json!({"ok": true, "result": result.clone()}))).await;
        let settings =
            settings_with(&[("TELEGRAM_API_BASE_URL", server.base.as_str()), ("TELEGRAM_BOT_TOKEN", ENV_TOKEN)]);
        (server, settings)
    }

    #[tokio::test]
    async fn send_posts_send_message_and_returns_metadata() {
        let (server, settings) =
            telegram(json!({"message_id": 17, "date": 1_735_200_000, "text": " hello telegram "})).await;
        let output = ok(run(
            "telegram",
            "send",
            &settings,
            json!({"token": "token-1", "chatId": "42", "text": "hello telegram"}),
        )
        .await);
        assert_eq!(
            output,
            json!({"ok": true, "chatId": "42", "messageId": 17, "date": 1_735_200_000, "text": "hello telegram"})
        );
        let request = server.single();
        assert_eq!(request.method, "POST");
        assert_eq!(request.target, "/bottoken-1/sendMessage");
        assert_eq!(request.header("content-type"), Some("application/json"));
        assert_eq!(request.json(), json!({"chat_id": "42", "text": "hello telegram"}));
    }

    #[tokio::test]
    async fn send_maps_every_option() {
        let (server, settings) = telegram(json!({"message_id": 18, "text": "Hello"})).await;
        let output = ok(run(
            "telegram",
            "send",
            &settings,
            json!({
                "chatId": 42,
                "text": "Hello",
                "parseMode": "markdownv2",
                "disableNotification": true,
                "disableWebPagePreview": false,
                "replyToMessageId": "7",
                "allowSendingWithoutReply": true,
            }),
        )
        .await);
        assert_eq!(output, json!({"ok": true, "chatId": "42", "messageId": 18, "date": null, "text": "Hello"}));
        let request = server.single();
        // The operator's token, in the path.
        assert_eq!(request.target, format!("/bot{ENV_TOKEN}/sendMessage"));
        assert_eq!(
            request.json(),
            json!({
                "chat_id": "42",
                "text": "Hello",
                "parse_mode": "MarkdownV2",
                "disable_notification": true,
                "disable_web_page_preview": false,
                "reply_to_message_id": 7,
                "allow_sending_without_reply": true,
            })
        );
    }

    #[tokio::test]
    async fn parse_mode_aliases() {
        for (alias, mode) in [
            ("Markdown", "Markdown"),
            ("markdown", "Markdown"),
            ("MarkdownV2", "MarkdownV2"),
            ("markdown-v2", "MarkdownV2"),
            ("markdown_v2", "MarkdownV2"),
            ("HTML", "HTML"),
            ("html", "HTML"),
        ] {
            let (server, settings) = telegram(json!({"message_id": 1})).await;
            ok(run("telegram", "send", &settings, json!({"chatId": 1, "text": "x", "parseMode": alias})).await);
            assert_eq!(server.single().json()["parse_mode"], json!(mode), "{alias}");
        }
    }

    #[tokio::test]
    async fn bad_send_input_is_refused_before_any_request() {
        let (server, settings) = telegram(json!(true)).await;
        let cases = [
            (
                json!({"chatId": "42", "text": "x", "parseMode": "md"}),
                "Unsupported parseMode 'md'. Use one of: markdown, markdownv2, markdown-v2, html.",
            ),
            (json!({"chatId": "  ", "text": "x"}), "'chatId' must be a non-empty string or integer"),
            (json!({"chatId": 4.5, "text": "x"}), "'chatId' must be a non-empty string or integer"),
            (json!({"chatId": 1, "text": "x", "replyToMessageId": 0}), "'replyToMessageId' must be a positive integer"),
            (
                json!({"chatId": 1, "text": "x", "replyToMessageId": "abc"}),
                "'replyToMessageId' must be a positive integer",
            ),
            (json!({"chatId": 1, "text": "x", "timeoutMs": 0}), "'timeoutMs' must be a positive number"),
            (json!({"chatId": 1, "text": "x", "timeoutMs": -5}), "'timeoutMs' must be a positive number"),
            (
                json!({"chatId": 1, "text": "x", "apiBaseUrl": "ftp://example.com"}),
                "'apiBaseUrl' (ftp://example.com) cannot be used: only http and https URLs are supported",
            ),
            (
                json!({"chatId": 1, "text": "x", "apiBaseUrl": "not a url"}),
                "'apiBaseUrl' (not a url) cannot be used: it is not a valid URL",
            ),
            (json!({"chatId": 1}), "'text' must be a non-empty string"),
            (json!({"chatId": 1, "text": ""}), "'text' must be a non-empty string"),
        ];
        for (input, message) in cases {
            let failure = err(run("telegram", "send", &settings, input.clone()).await);
            assert_eq!(failure.message, message, "{input}");
            assert!(failure.suggestion.is_some(), "{input}");
            assert_eq!(failure.code.as_deref(), Some(E_TOOL_INVALID_ARGS), "{input}");
        }
        let failure = err(run("telegram", "edit", &settings, json!({"chatId": 1, "messageId": 2, "text": ""})).await);
        assert_eq!(failure.message, "'text' must be a non-empty string");
        assert!(server.requests().is_empty());
    }

    #[tokio::test]
    async fn edit_posts_edit_message_text() {
        let (server, settings) = telegram(json!({"message_id": 23, "text": "edited"})).await;
        let output = ok(run(
            "telegram",
            "edit",
            &settings,
            json!({"token": "token-2", "chatId": "42", "messageId": 23, "text": "edited", "parseMode": "HTML", "disableWebPagePreview": true}),
        )
        .await);
        assert_eq!(output, json!({"ok": true, "chatId": "42", "messageId": 23, "edited": true}));
        let request = server.single();
        assert_eq!(request.target, "/bottoken-2/editMessageText");
        assert_eq!(
            request.json(),
            json!({"chat_id": "42", "message_id": 23, "text": "edited", "parse_mode": "HTML", "disable_web_page_preview": true})
        );
        // An inline message's edit returns `true`: the input's id is reported.
        let (_server, settings) = telegram(json!(true)).await;
        let output = ok(run("telegram", "edit", &settings, json!({"chatId": 5, "messageId": "31", "text": "x"})).await);
        assert_eq!(output["messageId"], json!(31));
    }

    #[tokio::test]
    async fn message_ids_must_be_positive_integers() {
        let (server, settings) = telegram(json!(true)).await;
        for bad in [json!(0), json!(-3), json!(1.5), json!("12a"), json!(""), json!("-4")] {
            for export in ["edit", "delete", "react"] {
                let input = json!({"chatId": 1, "messageId": bad, "text": "x", "emoji": "👍"});
                let mut input = crate::test_support::object(input);
                if export != "edit" {
                    input.shift_remove("text");
                }
                if export != "react" {
                    input.shift_remove("emoji");
                }
                let failure = err(run("telegram", export, &settings, JsonValue::Object(input)).await);
                assert_eq!(failure.message, "'messageId' must be a positive integer", "{export} {bad}");
                assert_eq!(failure.code.as_deref(), Some(E_TOOL_INVALID_ARGS));
            }
        }
        assert!(server.requests().is_empty());
        // 55.0 is a whole number, as in JavaScript.
        let (server, settings) = telegram(json!(true)).await;
        ok(run("telegram", "delete", &settings, json!({"chatId": 1, "messageId": 55.0})).await);
        assert_eq!(server.single().json()["message_id"], json!(55));
    }

    #[tokio::test]
    async fn delete_posts_delete_message() {
        let (server, settings) = telegram(json!(true)).await;
        let output =
            ok(run("telegram", "delete", &settings, json!({"token": "token-3", "chatId": "-100123", "messageId": 55}))
                .await);
        assert_eq!(output, json!({"ok": true, "chatId": "-100123", "messageId": 55, "deleted": true}));
        let request = server.single();
        assert_eq!(request.target, "/bottoken-3/deleteMessage");
        assert_eq!(request.json(), json!({"chat_id": "-100123", "message_id": 55}));
    }

    #[tokio::test]
    async fn react_sets_clears_and_requires_emoji() {
        let (server, settings) = telegram(json!(true)).await;
        let output = ok(run(
            "telegram",
            "react",
            &settings,
            json!({"token": "token-2b", "chatId": "42", "messageId": 24, "emoji": "🔥", "isBig": true}),
        )
        .await);
        assert_eq!(
            output,
            json!({"ok": true, "chatId": "42", "messageId": 24, "cleared": false, "reactionCount": 1, "emojis": ["🔥"]})
        );
        let request = server.single();
        assert_eq!(request.target, "/bottoken-2b/setMessageReaction");
        assert_eq!(
            request.json(),
            json!({"chat_id": "42", "message_id": 24, "reaction": [{"type": "emoji", "emoji": "🔥"}], "is_big": true})
        );

        let (server, settings) = telegram(json!(true)).await;
        let output = ok(run(
            "telegram",
            "react",
            &settings,
            json!({"chatId": "42", "messageId": 24, "emoji": " 👍 ", "emojis": ["🔥", "👍", " "]}),
        )
        .await);
        assert_eq!(output["emojis"], json!(["👍", "🔥"]));
        assert_eq!(output["reactionCount"], json!(2));
        assert_eq!(
            server.single().json()["reaction"],
            json!([{"type": "emoji", "emoji": "👍"}, {"type": "emoji", "emoji": "🔥"}])
        );

        let (server, settings) = telegram(json!(true)).await;
        let output = ok(run(
            "telegram",
            "react",
            &settings,
            json!({"chatId": "42", "messageId": 25, "clear": true, "emoji": "🔥"}),
        )
        .await);
        assert_eq!(
            output,
            json!({"ok": true, "chatId": "42", "messageId": 25, "cleared": true, "reactionCount": 0, "emojis": []})
        );
        assert_eq!(server.single().json(), json!({"chat_id": "42", "message_id": 25, "reaction": []}));

        let (server, settings) = telegram(json!(true)).await;
        for input in
            [json!({"chatId": "42", "messageId": 26}), json!({"chatId": 1, "messageId": 2, "emoji": " ", "emojis": []})]
        {
            let failure = err(run("telegram", "react", &settings, input).await);
            assert!(failure.message.starts_with("Provide 'emoji' or 'emojis'"), "{}", failure.message);
            assert_eq!(failure.code.as_deref(), Some(E_TOOL_INVALID_ARGS));
        }
        assert!(server.requests().is_empty());
    }

    #[tokio::test]
    async fn set_chat_action_maps_dashes_to_underscores() {
        let (server, settings) = telegram(json!(true)).await;
        let output = ok(run("telegram", "setChatAction", &settings, json!({"token": "token-4", "chatId": "42"})).await);
        assert_eq!(output, json!({"ok": true, "chatId": "42", "status": "typing", "action": "typing"}));
        let request = server.single();
        assert_eq!(request.target, "/bottoken-4/sendChatAction");
        assert_eq!(request.json(), json!({"chat_id": "42", "action": "typing"}));

        for (alias, action) in [
            ("upload-photo", "upload_photo"),
            ("record-video-note", "record_video_note"),
            ("Find_Location", "find_location"),
        ] {
            let (server, settings) = telegram(json!(true)).await;
            let output = ok(run("telegram", "setChatAction", &settings, json!({"chatId": 7, "action": alias})).await);
            assert_eq!(output["action"], json!(action));
            assert_eq!(server.single().json(), json!({"chat_id": "7", "action": action}));
        }

        let (server, settings) = telegram(json!(true)).await;
        let failure =
            err(run("telegram", "setChatAction", &settings, json!({"chatId": "42", "action": "non-typing"})).await);
        assert!(failure.message.starts_with("Unsupported chat action 'non-typing'. Use one of: typing, upload-photo"));
        assert_eq!(failure.code.as_deref(), Some(E_TOOL_INVALID_ARGS));
        assert!(server.requests().is_empty());
    }

    #[tokio::test]
    async fn api_failures_name_the_method_and_telegram_description() {
        let server = TestServer::start(|_| {
            status_json_answer(
                400,
                json!({"ok": false, "error_code": 400, "description": "Bad Request: chat not found"}),
            )
        })
        .await;
        let settings = settings_with(&[("TELEGRAM_API_BASE_URL", &server.base), ("TELEGRAM_BOT_TOKEN", ENV_TOKEN)]);
        let failure = err(run("telegram", "send", &settings, json!({"chatId": "404", "text": "x"})).await);
        assert_eq!(failure.message, "[telegram] sendMessage failed (code 400): Bad Request: chat not found");
        assert_eq!(failure.code.as_deref(), Some("E_TELEGRAM_API"));
        assert_eq!(failure.help_url.as_deref(), Some("https://core.telegram.org/bots/api#sendmessage"));
        assert!(failure.suggestion.is_some());

        // `ok: false` with a 200 status, and a non-JSON error page.
        let server = TestServer::start(|request| {
            if request.target.ends_with("/deleteMessage") {
                json_answer(json!({"ok": false, "description": "message can't be deleted"}))
            } else {
                Answer { status: 502, headers: vec![], body: b"<html>bad gateway</html>".to_vec() }
            }
        })
        .await;
        let settings = settings_with(&[("TELEGRAM_API_BASE_URL", &server.base), ("TELEGRAM_BOT_TOKEN", ENV_TOKEN)]);
        let failure = err(run("telegram", "delete", &settings, json!({"chatId": 1, "messageId": 2})).await);
        assert_eq!(failure.message, "[telegram] deleteMessage failed: message can't be deleted");
        let failure = err(run("telegram", "setChatAction", &settings, json!({"chatId": 1})).await);
        assert_eq!(failure.message, "[telegram] sendChatAction failed: HTTP 502 Bad Gateway");
        assert_eq!(failure.code.as_deref(), Some("E_TELEGRAM_API"));
    }

    #[tokio::test]
    async fn the_token_never_appears_in_errors() {
        // A server echoing the token in its description.
        let server = TestServer::start(|request| {
            json_answer(json!({"ok": false, "description": format!("unauthorized {}", request.target)}))
        })
        .await;
        let settings = settings_with(&[("TELEGRAM_API_BASE_URL", &server.base), ("TELEGRAM_BOT_TOKEN", ENV_TOKEN)]);
        let failure = err(run("telegram", "send", &settings, json!({"chatId": 1, "text": "x"})).await);
        assert_eq!(failure.message, "[telegram] sendMessage failed: unauthorized /bot<redacted>/sendMessage");
        assert_no_token(&failure, ENV_TOKEN);

        // A connection error: reqwest's message quotes the URL with the token.
        let closed = closed_base().await;
        let settings = settings_with(&[("TELEGRAM_API_BASE_URL", &closed), ("TELEGRAM_BOT_TOKEN", ENV_TOKEN)]);
        for (export, input) in [("send", json!({"chatId": 1, "text": "x"})), ("downloadFile", json!({"fileId": "f"}))] {
            let failure = err(run("telegram", export, &settings, input).await);
            assert!(
                failure.message.starts_with(&format!(
                    "[telegram] {} request to {closed} failed: ",
                    if export == "send" { "sendMessage" } else { "getFile" }
                )),
                "{}",
                failure.message
            );
            assert_eq!(failure.code.as_deref(), Some("E_TELEGRAM_REQUEST"));
            assert_no_token(&failure, ENV_TOKEN);
        }
        // The same through the executor (its error output).
        let result = execute("telegram", &settings, "send", json!({"chatId": 1, "text": "x"})).await;
        assert_eq!(result.status, ToolStatus::Error);
        assert_no_token(&result, ENV_TOKEN);
    }

    #[tokio::test]
    async fn timeouts_are_enforced() {
        // A server that accepts and never answers.
        let Ok(listener) = tokio::net::TcpListener::bind("127.0.0.1:0").await else { panic!("bind") };
        let Ok(address) = listener.local_addr() else { panic!("addr") };
        let _task = tokio::spawn(async move {
            let mut sockets = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                sockets.push(socket);
            }
        });
        let settings = settings_with(&[
            ("TELEGRAM_API_BASE_URL", &format!("http://{address}")),
            ("TELEGRAM_BOT_TOKEN", ENV_TOKEN),
        ]);
        let started = std::time::Instant::now();
        let failure =
            err(run("telegram", "send", &settings, json!({"chatId": 1, "text": "x", "timeoutMs": 200})).await);
        assert!(failure.message.ends_with("failed: timed out after 200 ms"), "{}", failure.message);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[tokio::test]
    async fn missing_token_names_the_variables() {
        let (server, _) = telegram(json!(true)).await;
        let settings = settings_with(&[("TELEGRAM_API_BASE_URL", &server.base)]);
        for input in [json!({"chatId": 1, "text": "x"}), json!({"chatId": 1, "text": "x", "token": ""})] {
            let failure = err(run("telegram", "send", &settings, input).await);
            assert_eq!(
                failure.message,
                "Telegram bot token not found. Provide 'token' or set TELEGRAM_BOT_TOKEN/BOT_TOKEN/TELEGRAM_TOKEN."
            );
            assert_eq!(failure.code.as_deref(), Some(E_TOKEN_MISSING));
            assert!(failure.suggestion.as_deref().is_some_and(|s| s.contains("TELEGRAM_BOT_TOKEN")));
        }
        assert!(server.requests().is_empty());
        // The other variables work too, in order.
        let settings =
            settings_with(&[("TELEGRAM_API_BASE_URL", &server.base), ("TELEGRAM_TOKEN", "3:c"), ("BOT_TOKEN", "2:b")]);
        ok(run("telegram", "setChatAction", &settings, json!({"chatId": 1})).await);
        assert_eq!(server.single().target, "/bot2:b/sendChatAction");
    }

    #[tokio::test]
    async fn the_originals_last_fallback_token_is_read_last() {
        let (server, _) = telegram(json!(true)).await;
        let base = ("TELEGRAM_API_BASE_URL", server.base.as_str());
        let settings = settings_with(&[base, ("BRAIN_TELEGRAM_BOT_TOKEN", "4:d")]);
        ok(run("telegram", "setChatAction", &settings, json!({"chatId": 1})).await);
        assert_eq!(server.single().target, "/bot4:d/sendChatAction");
        let settings = settings_with(&[base, ("BRAIN_TELEGRAM_BOT_TOKEN", "4:d"), ("TELEGRAM_TOKEN", "3:c")]);
        ok(run("telegram", "setChatAction", &settings, json!({"chatId": 1})).await);
        assert_eq!(server.requests().last().map(|r| r.target.clone()).as_deref(), Some("/bot3:c/sendChatAction"));
    }

    #[tokio::test]
    async fn tokens_that_would_change_the_url_are_refused() {
        let (server, settings) = telegram(json!(true)).await;
        for token in ["a/../../x", "a?b", "a#b", "a b"] {
            let failure = err(run("telegram", "setChatAction", &settings, json!({"chatId": 1, "token": token})).await);
            assert_eq!(failure.code.as_deref(), Some(E_TOKEN_INVALID), "{token}");
            assert_no_token(&failure, token);
        }
        assert!(server.requests().is_empty());
    }

    #[tokio::test]
    async fn the_operator_token_never_goes_to_a_base_url_from_the_input() {
        let (operator, settings) = telegram(json!(true)).await;
        let elsewhere = TestServer::start(|_| json_answer(json!({"ok": true, "result": true}))).await;
        let failure =
            err(run("telegram", "setChatAction", &settings, json!({"chatId": 1, "apiBaseUrl": elsewhere.base})).await);
        assert_eq!(failure.code.as_deref(), Some(E_TOKEN_DESTINATION_REFUSED));
        assert!(failure.message.contains("TELEGRAM_BOT_TOKEN"), "{}", failure.message);
        assert!(failure.message.contains(&elsewhere.base), "{}", failure.message);
        assert!(failure.suggestion.as_deref().is_some_and(|s| s.contains("Omit 'apiBaseUrl'")));
        assert_no_token(&failure, ENV_TOKEN);
        // The same for downloads: nothing reaches either server.
        let failure =
            err(run("telegram", "downloadFile", &settings, json!({"fileId": "f", "apiBaseUrl": elsewhere.base})).await);
        assert_eq!(failure.code.as_deref(), Some(E_TOKEN_DESTINATION_REFUSED));
        assert!(elsewhere.requests().is_empty());
        assert!(operator.requests().is_empty());

        // The operator's own base URL (any spelling) is fine.
        let spelled = format!("{}/", operator.base.replace("http://", "HTTP://"));
        ok(run("telegram", "setChatAction", &settings, json!({"chatId": 1, "apiBaseUrl": spelled})).await);
        assert_eq!(operator.single().target, format!("/bot{ENV_TOKEN}/sendChatAction"));
    }

    #[tokio::test]
    async fn the_operator_token_never_goes_to_the_default_base_url_when_another_is_configured() {
        // The operator runs its own Bot API server: the token must not go to
        // the public one either, just because the model names it.
        let (operator, settings) = telegram(json!(true)).await;
        for base in ["https://api.telegram.org", "https://api.telegram.org/"] {
            let failure =
                err(run("telegram", "setChatAction", &settings, json!({"chatId": 1, "apiBaseUrl": base})).await);
            assert_eq!(failure.code.as_deref(), Some(E_TOKEN_DESTINATION_REFUSED), "{base}: {failure:?}");
            assert!(failure.message.contains(&operator.base), "{}", failure.message);
            assert_no_token(&failure, ENV_TOKEN);
        }
        assert!(operator.requests().is_empty());
    }

    #[tokio::test]
    async fn results_never_carry_the_token() {
        // A reply that quotes the token (an echoing proxy, a message that
        // contains it): the model gets it redacted.
        let (server, settings) = telegram(json!({"message_id": 5, "text": format!("token is {ENV_TOKEN}")})).await;
        let output = ok(run("telegram", "send", &settings, json!({"chatId": 1, "text": "x"})).await);
        assert_eq!(output["text"], json!("token is <redacted>"));
        assert_no_token(&output, ENV_TOKEN);
        assert_eq!(server.single().target, format!("/bot{ENV_TOKEN}/sendMessage"));
    }

    #[tokio::test]
    async fn a_token_from_the_input_may_go_to_a_base_url_from_the_input() {
        let (operator, settings) = telegram(json!(true)).await;
        let settings = allowing_loopback(&settings);
        let elsewhere = TestServer::start(|_| json_answer(json!({"ok": true, "result": {"message_id": 3}}))).await;
        let output = ok(run(
            "telegram",
            "send",
            &settings,
            json!({"chatId": 1, "text": "hi", "token": "own-token", "apiBaseUrl": format!("{}/", elsewhere.base)}),
        )
        .await);
        assert_eq!(output["messageId"], json!(3));
        assert_eq!(elsewhere.single().target, "/botown-token/sendMessage");
        assert!(operator.requests().is_empty());
    }

    #[tokio::test]
    async fn a_model_chosen_base_url_goes_through_the_ssrf_guard() {
        let (operator, settings) = telegram(json!(true)).await;
        let elsewhere = TestServer::start(|_| json_answer(json!({"ok": true, "result": {"message_id": 3}}))).await;
        for base in [format!("{}/", elsewhere.base), "http://10.0.0.1".to_owned(), "http://169.254.169.254".to_owned()]
        {
            let failure = err(run(
                "telegram",
                "send",
                &settings,
                json!({"chatId": 1, "text": "hi", "token": "own-token", "apiBaseUrl": base}),
            )
            .await);
            assert_eq!(failure.code.as_deref(), Some("E_SSRF_BLOCKED"), "{base}: {failure:?}");
            assert!(!failure.message.contains("own-token"), "{failure:?}");
        }
        assert!(elsewhere.requests().is_empty());
        assert!(operator.requests().is_empty());
    }

    #[tokio::test]
    async fn an_unusable_operator_base_url_is_reported() {
        let settings =
            settings_with(&[("TELEGRAM_API_BASE_URL", "api.telegram.org"), ("TELEGRAM_BOT_TOKEN", ENV_TOKEN)]);
        let failure = err(run("telegram", "setChatAction", &settings, json!({"chatId": 1})).await);
        assert_eq!(failure.code.as_deref(), Some("E_TOOL_CONFIG"));
        assert!(
            failure.message.starts_with("TELEGRAM_API_BASE_URL (api.telegram.org) cannot be used"),
            "{}",
            failure.message
        );
    }

    #[tokio::test]
    async fn an_unusable_operator_base_url_is_reported_without_its_secrets() {
        for base in [
            "https://bot:s3cret@proxy.example/tg",
            "https://proxy.example/tg?key=s3cret",
            "https://proxy.example/tg#s3cret",
        ] {
            let settings = settings_with(&[("TELEGRAM_API_BASE_URL", base), ("TELEGRAM_BOT_TOKEN", ENV_TOKEN)]);
            let failure = err(run("telegram", "setChatAction", &settings, json!({"chatId": 1})).await);
            assert_eq!(failure.code.as_deref(), Some("E_TOOL_CONFIG"), "{base}");
            assert!(
                failure.message.starts_with(
                    "TELEGRAM_API_BASE_URL (https://proxy.example/tg, credentials, query and fragment hidden) cannot be used"
                ),
                "{}",
                failure.message
            );
            assert_no_token(&failure, "s3cret");
        }
    }

    /// A Bot API server with one file `photos/file_1.jpg` of `size` bytes.
    async fn file_server(size: usize) -> TestServer {
        TestServer::start(move |request| {
            if request.target.ends_with("/getFile") {
                json_answer(json!({"ok": true, "result": {
                    "file_id": "AgAD", "file_unique_id": "uniq", "file_size": size, "file_path": "photos/file_1.jpg"
                }}))
            } else if request.target.ends_with("/photos/file_1.jpg") {
                Answer { status: 200, headers: vec![("content-type", "image/jpeg".to_owned())], body: vec![0xFF; size] }
            } else {
                status_json_answer(404, json!({"ok": false, "error_code": 404, "description": "Not Found"}))
            }
        })
        .await
    }

    #[tokio::test]
    async fn download_file_resolves_then_downloads() {
        let server = file_server(4).await;
        let settings = settings_with(&[("TELEGRAM_API_BASE_URL", &server.base), ("TELEGRAM_BOT_TOKEN", ENV_TOKEN)]);
        let dir = crate::test_support::workdir();
        let workdir = dir.path.clone();
        let output = ok(run_in(
            "telegram",
            "downloadFile",
            &settings,
            &workdir,
            json!({"fileId": " AgAD ", "savePath": "downloads/photo.jpg"}),
        )
        .await);
        let saved = workdir.join("downloads/photo.jpg");
        assert_eq!(
            output,
            json!({
                "ok": true,
                "fileId": "AgAD",
                "fileUniqueId": "uniq",
                "filePath": "photos/file_1.jpg",
                "fileSize": 4,
                "downloadUrl": format!("{}/file/bot<redacted>/photos/file_1.jpg", server.base),
                "contentType": "image/jpeg",
                "sizeBytes": 4,
                "savedPath": saved.to_string_lossy(),
                "base64": "/////w==",
                "dataUrl": "data:image/jpeg;base64,/////w==",
            })
        );
        assert_eq!(std::fs::read(&saved).ok(), Some(vec![0xFF; 4]));
        assert_no_token(&output, ENV_TOKEN);
        let requests = server.requests();
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0].method, "POST");
        assert_eq!(requests[0].target, format!("/bot{ENV_TOKEN}/getFile"));
        assert_eq!(requests[0].header("content-type"), Some("application/json"));
        assert_eq!(requests[0].json(), json!({"file_id": "AgAD"}));
        assert_eq!(requests[1].method, "GET");
        assert_eq!(requests[1].target, format!("/file/bot{ENV_TOKEN}/photos/file_1.jpg"));

        // Without base64, no data URL either.
        let output =
            ok(run("telegram", "downloadFile", &settings, json!({"fileId": "AgAD", "includeBase64": false})).await);
        assert_eq!(
            (output["base64"].clone(), output["dataUrl"].clone(), output["savedPath"].clone()),
            (json!(null), json!(null), json!(null))
        );
        let output =
            ok(run("telegram", "downloadFile", &settings, json!({"fileId": "AgAD", "includeDataUrl": false})).await);
        assert_eq!((output["base64"].clone(), output["dataUrl"].clone()), (json!("/////w=="), json!(null)));
    }

    #[tokio::test]
    async fn download_file_enforces_max_bytes() {
        let server = file_server(5000).await;
        let settings = settings_with(&[("TELEGRAM_API_BASE_URL", &server.base), ("TELEGRAM_BOT_TOKEN", ENV_TOKEN)]);
        let failure =
            err(run("telegram", "downloadFile", &settings, json!({"fileId": "AgAD", "maxBytes": 1000})).await);
        assert_eq!(failure.message, "[telegram] file exceeds maxBytes limit (5000 > 1000)");
        assert_eq!(failure.code.as_deref(), Some(E_FILE_TOO_LARGE));
        ok(run("telegram", "downloadFile", &settings, json!({"fileId": "AgAD", "maxBytes": 5000})).await);

        for (bad, message) in [
            (json!(0), "'maxBytes' must be a positive number"),
            (json!(-1), "'maxBytes' must be a positive number"),
            (json!(0.5), "'maxBytes' must be between 1 and 20000000"),
            (json!(20_000_001), "'maxBytes' must be between 1 and 20000000"),
        ] {
            let failure =
                err(run("telegram", "downloadFile", &settings, json!({"fileId": "AgAD", "maxBytes": bad})).await);
            assert_eq!(failure.message, message);
            assert_eq!(failure.code.as_deref(), Some(E_TOOL_INVALID_ARGS));
        }
    }

    #[tokio::test]
    async fn endless_bodies_are_cut_at_the_limits() {
        // A download: stopped at maxBytes although no content-length announced it.
        let get_file = json!({"ok": true, "result": {"file_id": "f", "file_path": "videos/big.mp4"}});
        let (base, task) = endless_server(Some(get_file)).await;
        let settings = settings_with(&[("TELEGRAM_API_BASE_URL", &base), ("TELEGRAM_BOT_TOKEN", ENV_TOKEN)]);
        let failure =
            err(run("telegram", "downloadFile", &settings, json!({"fileId": "f", "maxBytes": 100_000})).await);
        assert_eq!(failure.message, "[telegram] file exceeds maxBytes limit (more than 100000 bytes)");
        assert_eq!(failure.code.as_deref(), Some(E_FILE_TOO_LARGE));
        task.abort();

        // An API reply: bounded too.
        let (base, task) = endless_server(None).await;
        let settings = settings_with(&[("TELEGRAM_API_BASE_URL", &base), ("TELEGRAM_BOT_TOKEN", ENV_TOKEN)]);
        let failure = err(run("telegram", "send", &settings, json!({"chatId": 1, "text": "x"})).await);
        assert_eq!(failure.message, "[telegram] sendMessage failed: the reply is larger than 16777216 bytes");
        assert_eq!(failure.code.as_deref(), Some("E_TELEGRAM_API"));
        task.abort();
    }

    #[tokio::test]
    async fn saving_never_writes_through_a_planted_link() {
        // Links planted under the names a save's temporary file once had
        // (`.goondan-download-<pid>-<n>.part`, opened without O_EXCL) would
        // have sent the download outside the workdir.
        let server = file_server(4).await;
        let settings = settings_with(&[("TELEGRAM_API_BASE_URL", &server.base), ("TELEGRAM_BOT_TOKEN", ENV_TOKEN)]);
        let (dir, outside) = (crate::test_support::workdir(), crate::test_support::workdir());
        let victim = outside.path.join("victim.txt");
        std::fs::write(&victim, "untouched").unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir(dir.path.join("in")).unwrap_or_else(|e| panic!("{e}"));
        for serial in 0..256 {
            let name = format!(".goondan-download-{}-{serial}.part", std::process::id());
            std::os::unix::fs::symlink(&victim, dir.path.join("in").join(name)).unwrap_or_else(|e| panic!("{e}"));
        }
        let input = json!({"fileId": "AgAD", "savePath": "in/photo.jpg", "includeBase64": false});
        let output = ok(run_in("telegram", "downloadFile", &settings, &dir.path, input).await);
        let saved = dir.path.join("in/photo.jpg");
        assert_eq!(output["savedPath"], json!(saved.to_string_lossy()));
        assert_eq!(std::fs::read_to_string(&victim).ok().as_deref(), Some("untouched"));
        assert!(std::fs::symlink_metadata(&saved).is_ok_and(|meta| meta.file_type().is_file()));
        assert_eq!(std::fs::read(&saved).ok(), Some(vec![0xFF; 4]));
    }

    /// `downloadFile` of `AgAD` to `save_path`, in `workdir`, expected to fail.
    async fn download_failure(
        settings: &Arc<BaseSettings>,
        workdir: &std::path::Path,
        save_path: &str,
    ) -> goondan_tools::ToolFailure {
        let input = json!({"fileId": "AgAD", "savePath": save_path});
        err(run_in("telegram", "downloadFile", settings, workdir, input).await)
    }

    #[tokio::test]
    async fn download_file_checks_its_inputs_and_get_file_reply() {
        let server = file_server(4).await;
        let settings = settings_with(&[("TELEGRAM_API_BASE_URL", &server.base), ("TELEGRAM_BOT_TOKEN", ENV_TOKEN)]);
        let dir = crate::test_support::workdir();
        for path in ["../escape.jpg", "/etc/passwd"] {
            let failure = download_failure(&settings, &dir.path, path).await;
            assert_eq!(failure.code.as_deref(), Some(E_PATH_OUTSIDE_WORKDIR), "{path}");
        }
        let failure = err(run("telegram", "downloadFile", &settings, json!({"fileId": "  "})).await);
        assert_eq!(failure.message, "Provide 'fileId' (or 'file_id') for Telegram file download.");
        assert!(server.requests().is_empty());

        for path in [".", "sub/.."] {
            let failure = download_failure(&settings, &dir.path, path).await;
            assert_eq!(failure.code.as_deref(), Some(E_TOOL_INVALID_ARGS), "{path}");
            assert!(failure.message.ends_with("is a directory"), "{}", failure.message);
        }
        assert!(server.requests().is_empty());
        // A place that cannot be written although allowed: /proc (as an
        // operator-allowed root) refuses new files, even to root.
        if std::path::Path::new("/proc/self").exists() {
            let mut proc_settings = (*settings).clone();
            proc_settings.extra_fs_roots = vec!["/proc".into()];
            let failure =
                download_failure(&Arc::new(proc_settings), &dir.path, "/proc/goondan-download-test.jpg").await;
            assert_eq!(failure.code.as_deref(), Some("E_FILE_WRITE"));
            assert!(failure.message.starts_with("could not save the downloaded file to /proc/"), "{}", failure.message);
        }

        let bad = TestServer::start(|_| json_answer(json!({"ok": true, "result": {"file_id": "f"}}))).await;
        let settings = settings_with(&[("TELEGRAM_API_BASE_URL", &bad.base), ("TELEGRAM_BOT_TOKEN", ENV_TOKEN)]);
        let failure = err(run("telegram", "downloadFile", &settings, json!({"fileId": "f"})).await);
        assert_eq!(failure.message, "[telegram] getFile failed: result is missing file_id/file_path");

        let missing = TestServer::start(|request| {
            if request.target.ends_with("/getFile") {
                json_answer(json!({"ok": true, "result": {"file_id": "f", "file_path": "gone.jpg"}}))
            } else {
                Answer { status: 404, headers: vec![], body: vec![b'x'; 100] }
            }
        })
        .await;
        let settings = settings_with(&[("TELEGRAM_API_BASE_URL", &missing.base), ("TELEGRAM_BOT_TOKEN", ENV_TOKEN)]);
        let failure = err(run("telegram", "downloadFile", &settings, json!({"fileId": "f", "maxBytes": 10})).await);
        assert_eq!(failure.message, "[telegram] file download failed: HTTP 404 Not Found");
    }

    #[tokio::test]
    async fn the_executor_rejects_missing_and_wrong_typed_arguments() {
        let (server, settings) = telegram(json!({"message_id": 9})).await;
        for (export, args) in [
            ("send", json!({"text": "x"})),
            ("send", json!({"chatId": true, "text": "x"})),
            ("send", json!({"chatId": 1, "text": 5})),
            ("send", json!({"chatId": 1, "text": "x", "parseMode": "md"})),
            ("send", json!({"chatId": 1, "text": "x", "extra": 1})),
            ("edit", json!({"chatId": 1, "text": "x"})),
            ("delete", json!({"chatId": 1, "messageId": [1]})),
            ("react", json!({"chatId": 1, "messageId": 1, "emojis": "👍"})),
            ("setChatAction", json!({"chatId": 1, "action": "dancing"})),
            ("downloadFile", json!({})),
            ("downloadFile", json!({"fileId": "f", "maxBytes": "10"})),
        ] {
            let result = execute("telegram", &settings, export, args.clone()).await;
            assert_eq!(result.status, ToolStatus::Error, "{export} {args}");
            assert_eq!(result.error_code(), Some("E_TOOL_INVALID_ARGS"), "{export} {args}");
        }
        assert!(server.requests().is_empty());
        let result = execute("telegram", &settings, "send", json!({"chatId": 1, "text": "x"})).await;
        assert_eq!(result.status, ToolStatus::Ok);
        assert_eq!(result.output.as_ref().map(|o| o["messageId"].clone()), Some(json!(9)));
    }

    #[test]
    fn unknown_export() {
        assert!(super::handler("sendPhoto", &crate::test_support::settings()).is_none());
    }
}
