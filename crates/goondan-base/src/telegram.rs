//! The `telegram` tool: the Bot API calls of the original `@goondan/base`
//! tool, with its request bodies and output fields — `send` (sendMessage),
//! `edit` (editMessageText), `delete` (deleteMessage), `react`
//! (setMessageReaction), `setChatAction` (sendChatAction) and `downloadFile`
//! (getFile, then `<base>/file/bot<token>/<file_path>`).
//!
//! The token comes from the call's `token` or the operator's environment
//! (`TELEGRAM_BOT_TOKEN`, `BOT_TOKEN`, `TELEGRAM_TOKEN`); the API base URL from
//! `TELEGRAM_API_BASE_URL` (default `https://api.telegram.org`). Unlike the
//! original, the operator's token is never sent to an `apiBaseUrl` the model
//! chose, and no token appears in an error or a result: the Bot API carries
//! the token in the URL path, which HTTP client errors quote, so every message
//! is scrubbed and `downloadUrl` shows `<redacted>` in its place.
//!
//! The crate-private `bot_api` module holds what the `slack` tool shares with this one: token and
//! base URL selection, JSON calls, bounded downloads.

use std::sync::Arc;

use goondan_core::{JsonObject, JsonValue};
use goondan_tools::{BoxFuture, HandlerResult, ToolContext, ToolFailure, ToolHandler};
use reqwest::header::CONTENT_TYPE;
use serde_json::json;

use crate::BaseSettings;
use crate::args;
use bot_api::{Api, DownloadOptions, Service, invalid, put, required_trimmed};

/// How the Bot API is reached and how its failures are reported.
const SERVICE: Service = Service {
    name: "Telegram",
    tag: "telegram",
    token_vars: &["TELEGRAM_BOT_TOKEN", "BOT_TOKEN", "TELEGRAM_TOKEN"],
    base_url_var: "TELEGRAM_API_BASE_URL",
    default_base_url: "https://api.telegram.org",
    token_in_url: true,
    api_error_code: "E_TELEGRAM_API",
    request_error_code: "E_TELEGRAM_REQUEST",
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
    let export = match export {
        "send" => Export::Send,
        "edit" => Export::Edit,
        "delete" => Export::Delete,
        "react" => Export::React,
        "setChatAction" => Export::SetChatAction,
        "downloadFile" => Export::DownloadFile,
        _ => return None,
    };
    Some(Arc::new(Telegram { export, settings: Arc::clone(settings) }))
}

#[derive(Debug, Clone, Copy)]
enum Export {
    Send,
    Edit,
    Delete,
    React,
    SetChatAction,
    DownloadFile,
}

struct Telegram {
    export: Export,
    settings: Arc<BaseSettings>,
}

impl ToolHandler for Telegram {
    fn call<'a>(&'a self, ctx: &'a ToolContext, input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            let settings = &self.settings;
            let output = match self.export {
                Export::Send => send(settings, input).await?,
                Export::Edit => edit(settings, input).await?,
                Export::Delete => delete(settings, input).await?,
                Export::React => react(settings, input).await?,
                Export::SetChatAction => set_chat_action(settings, input).await?,
                Export::DownloadFile => download_file(ctx, settings, input).await?,
            };
            Ok(output.into())
        })
    }
}

async fn send(settings: &BaseSettings, input: &JsonObject) -> Result<JsonValue, ToolFailure> {
    let chat_id = chat_id(input)?;
    let text = args::require_string(input, "text")?;
    let mut payload = JsonObject::new();
    put(&mut payload, "chat_id", Some(json!(chat_id)));
    put(&mut payload, "text", Some(json!(text)));
    put(&mut payload, "parse_mode", parse_mode(input)?.map(JsonValue::from));
    put(&mut payload, "disable_notification", args::optional_bool(input, "disableNotification")?.map(JsonValue::from));
    put(
        &mut payload,
        "disable_web_page_preview",
        args::optional_bool(input, "disableWebPagePreview")?.map(JsonValue::from),
    );
    put(&mut payload, "reply_to_message_id", optional_message_id(input, "replyToMessageId")?.map(JsonValue::from));
    put(
        &mut payload,
        "allow_sending_without_reply",
        args::optional_bool(input, "allowSendingWithoutReply")?.map(JsonValue::from),
    );
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
    let text = args::require_string(input, "text")?;
    let mut payload = JsonObject::new();
    put(&mut payload, "chat_id", Some(json!(chat_id)));
    put(&mut payload, "message_id", Some(json!(message_id)));
    put(&mut payload, "text", Some(json!(text)));
    put(&mut payload, "parse_mode", parse_mode(input)?.map(JsonValue::from));
    put(
        &mut payload,
        "disable_web_page_preview",
        args::optional_bool(input, "disableWebPagePreview")?.map(JsonValue::from),
    );
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
    let file_id =
        required_trimmed(input, "fileId", "Pass the file_id of the message's photo, document, voice or video.")?;
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
    let download = api.download(api.client().get(url), &options).await?;
    let content_type = download.header(CONTENT_TYPE.as_str());
    let file_output = options.finish(&api, &download.bytes, content_type.as_deref()).await?;
    Ok(json!({
        "ok": true,
        "fileId": file_id,
        "fileUniqueId": file.get("file_unique_id").and_then(bot_api::trimmed_str),
        "filePath": file_path,
        "fileSize": file_size.map(args::number_value),
        "downloadUrl": format!("{}/file/bot{}/{file_path}", api.base_url(), bot_api::REDACTED),
        "contentType": content_type,
        "sizeBytes": download.bytes.len(),
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

/// HTTP plumbing shared by the `telegram` and `slack` tools: which token and
/// base URL a call uses, JSON calls, bounded downloads, and error messages
/// that never contain the token.
pub(crate) mod bot_api {
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use goondan_core::{JsonObject, JsonValue};
    use goondan_tools::{ToolContext, ToolFailure};
    use reqwest::header::{HeaderMap, HeaderValue};
    use reqwest::{Client, RequestBuilder, StatusCode, Url};

    use crate::BaseSettings;
    use crate::args;

    /// Input that passed the schema but makes no sense (the executor's code
    /// for schema failures).
    pub(crate) const E_INVALID_ARGS: &str = "E_TOOL_INVALID_ARGS";
    /// No token in the call or the environment.
    pub(crate) const E_TOKEN_MISSING: &str = "E_TOKEN_MISSING";
    /// A token that cannot be put in a request.
    pub(crate) const E_TOKEN_INVALID: &str = "E_TOKEN_INVALID";
    /// The token would go somewhere the operator did not choose.
    pub(crate) const E_TOKEN_DESTINATION_REFUSED: &str = "E_TOKEN_DESTINATION_REFUSED";
    /// A download larger than `maxBytes`.
    pub(crate) const E_FILE_TOO_LARGE: &str = "E_FILE_TOO_LARGE";
    /// A download that could not be saved.
    pub(crate) const E_FILE_WRITE: &str = "E_FILE_WRITE";
    /// An operator setting that cannot be used.
    pub(crate) const E_CONFIG: &str = "E_TOOL_CONFIG";
    /// What replaces a token in messages and results.
    pub(crate) const REDACTED: &str = "<redacted>";

    const DEFAULT_TIMEOUT_MS: f64 = 15_000.0;
    const DEFAULT_MAX_BYTES: f64 = 3_000_000.0;
    const MAX_MAX_BYTES: f64 = 20_000_000.0;
    /// The most an API reply may hold; a reply is parsed in memory, so this
    /// bounds memory however large a `conversations.history` page is.
    const MAX_API_REPLY_BYTES: usize = 16 * 1024 * 1024;

    /// A chat service's API: where it lives and how it reports failures.
    #[derive(Debug)]
    pub(crate) struct Service {
        /// Display name, e.g. `Telegram`.
        pub(crate) name: &'static str,
        /// Message prefix, e.g. `telegram` for `[telegram] …`.
        pub(crate) tag: &'static str,
        /// Environment variables holding the operator's token, in order.
        pub(crate) token_vars: &'static [&'static str],
        /// The environment variable of the operator's base URL.
        pub(crate) base_url_var: &'static str,
        /// The base URL when the operator sets none.
        pub(crate) default_base_url: &'static str,
        /// The token goes into the URL path (Telegram), so it must be URL-safe.
        pub(crate) token_in_url: bool,
        /// The code of API-level failures (`{ok: false}`, non-2xx).
        pub(crate) api_error_code: &'static str,
        /// The code of failures to get a reply at all.
        pub(crate) request_error_code: &'static str,
        /// What to do about an API-level failure.
        pub(crate) api_suggestion: &'static str,
        /// The documentation page of a method.
        pub(crate) docs_url: fn(&str) -> String,
    }

    /// A failure of the input's meaning.
    pub(crate) fn invalid(message: impl Into<String>, suggestion: impl Into<String>) -> ToolFailure {
        ToolFailure::with_code(message, E_INVALID_ARGS).suggest(suggestion)
    }

    /// Inserts `value` under `key` unless it is `None` (the original's `compactJson`).
    pub(crate) fn put(map: &mut JsonObject, key: &str, value: Option<JsonValue>) {
        if let Some(value) = value {
            map.insert(key.to_owned(), value);
        }
    }

    /// A string value, trimmed, if it is not blank.
    pub(crate) fn trimmed_str(value: &JsonValue) -> Option<String> {
        value.as_str().map(str::trim).filter(|text| !text.is_empty()).map(str::to_owned)
    }

    /// A string property that must hold more than white space (trimmed).
    pub(crate) fn required_trimmed(input: &JsonObject, key: &str, suggestion: &str) -> Result<String, ToolFailure> {
        match args::optional_string(input, key)?.map(str::trim) {
            Some(text) if !text.is_empty() => Ok(text.to_owned()),
            _ => Err(invalid(format!("'{key}' must be a non-empty string"), suggestion)),
        }
    }

    /// An optional string property, trimmed; blank counts as absent.
    pub(crate) fn optional_trimmed(input: &JsonObject, key: &str) -> Result<Option<String>, ToolFailure> {
        Ok(args::optional_string(input, key)?.map(str::trim).filter(|text| !text.is_empty()).map(str::to_owned))
    }

    /// `HTTP 404 Not Found`.
    pub(crate) fn http_description(status: StatusCode) -> String {
        match status.canonical_reason() {
            Some(reason) => format!("HTTP {} {reason}", status.as_u16()),
            None => format!("HTTP {}", status.as_u16()),
        }
    }

    /// `raw` as a base URL: http(s), with a host, no credentials, query or
    /// fragment, without trailing slashes (so that equal URLs compare equal).
    pub(crate) fn normalize_base_url(raw: &str) -> Result<String, &'static str> {
        let url = Url::parse(raw.trim()).map_err(|_| "it is not a valid URL")?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err("only http and https URLs are supported");
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err("it has no host");
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("it must not contain credentials");
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err("it must not have a query or fragment");
        }
        Ok(url.as_str().trim_end_matches('/').to_owned())
    }

    /// Where the token of a call came from.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum TokenSource {
        /// The call's `token`: the model knows it already.
        Input,
        /// The operator's environment variable of this name.
        Env(String),
    }

    /// One call's connection to a service: its token, base URL, timeout and client.
    pub(crate) struct Api {
        service: &'static Service,
        token: String,
        base_url: String,
        configured_base_url: String,
        timeout_ms: u64,
        client: Client,
    }

    impl std::fmt::Debug for Api {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            // Never the token.
            f.debug_struct("Api").field("service", &self.service.name).field("base_url", &self.base_url).finish()
        }
    }

    impl Api {
        /// Picks the token (input, then environment), the base URL (input,
        /// then operator setting, then default) and the timeout of a call.
        ///
        /// The operator's token only goes to the operator's base URL or the
        /// service's default: a base URL from the input receives only a token
        /// from the input.
        pub(crate) fn new(
            service: &'static Service,
            settings: &BaseSettings,
            input: &JsonObject,
        ) -> Result<Self, ToolFailure> {
            let timeout_ms = timeout_ms(input)?;
            let (token, source) = token(service, settings, input)?;
            let configured_base_url = configured_base_url(service, settings)?;
            let base_url = match optional_trimmed(input, "apiBaseUrl")? {
                None => configured_base_url.clone(),
                Some(raw) => {
                    let requested = normalize_base_url(&raw).map_err(|why| {
                        invalid(
                            format!("'apiBaseUrl' ({raw}) cannot be used: {why}"),
                            format!("Omit 'apiBaseUrl' to use the {} API the operator configured.", service.name),
                        )
                    })?;
                    match &source {
                        TokenSource::Env(var)
                            if requested != configured_base_url && requested != service.default_base_url =>
                        {
                            return Err(destination_refused(service, var, &requested, &configured_base_url));
                        }
                        _ => requested,
                    }
                }
            };
            if service.token_in_url && !token.bytes().all(|b| b.is_ascii_alphanumeric() || b":_-.~".contains(&b)) {
                let origin = match &source {
                    TokenSource::Input => "given in 'token'".to_owned(),
                    TokenSource::Env(var) => format!("from {var}"),
                };
                return Err(ToolFailure::with_code(
                    format!(
                        "the {} bot token {origin} contains characters that cannot appear in an API URL",
                        service.name
                    ),
                    E_TOKEN_INVALID,
                )
                .suggest(
                    "Use the token exactly as the bot's issuer gave it (digits, a colon, letters, '-' and '_').",
                ));
            }
            // A base URL the model chose (not the operator's, not the
            // default) is an address the model picked: it goes through the
            // SSRF guard like any http-fetch URL, so a call that brings its
            // own token still cannot reach internal addresses.
            let model_chosen = base_url != configured_base_url && base_url != service.default_base_url;
            let builder = if model_chosen {
                let guard = crate::net_guard::NetGuard::new(settings);
                let url = Url::parse(&base_url).map_err(|error| {
                    invalid(format!("'apiBaseUrl' ({base_url}) is not a valid URL: {error}"), "Fix the URL.".to_owned())
                })?;
                guard
                    .check_url(&url)
                    .map_err(|refused| refused.to_failure(&format!("[{}] 'apiBaseUrl'", service.tag)))?;
                guard.client_builder()
            } else {
                crate::tls::client_builder()
            };
            let client = builder
                .map_err(|error| error.to_string())
                .and_then(|builder| builder.build().map_err(|error| error.to_string()))
                .map_err(|error| {
                    ToolFailure::new(format!("[{}] could not set up the HTTPS client: {error}", service.tag))
                })?;
            Ok(Self { service, token, base_url, configured_base_url, timeout_ms, client })
        }

        /// The token, for building requests only.
        pub(crate) fn token(&self) -> &str {
            &self.token
        }

        /// The base URL, without a trailing slash.
        pub(crate) fn base_url(&self) -> &str {
            &self.base_url
        }

        /// The operator's base URL (or the default), without a trailing slash.
        pub(crate) fn configured_base_url(&self) -> &str {
            &self.configured_base_url
        }

        /// The HTTP client.
        pub(crate) fn client(&self) -> &Client {
            &self.client
        }

        /// `Bearer <token>`, marked sensitive so that it is never printed.
        pub(crate) fn bearer(&self) -> Result<HeaderValue, ToolFailure> {
            let mut value = HeaderValue::from_str(&format!("Bearer {}", self.token)).map_err(|_| {
                ToolFailure::with_code(
                    format!("the {} token contains characters that cannot appear in an HTTP header", self.service.name),
                    E_TOKEN_INVALID,
                )
                .suggest("Use the token exactly as the service issued it.")
            })?;
            value.set_sensitive(true);
            Ok(value)
        }

        /// `text` with every occurrence of the token replaced.
        pub(crate) fn redact(&self, text: &str) -> String {
            if self.token.is_empty() { text.to_owned() } else { text.replace(&self.token, REDACTED) }
        }

        /// A failure whose message and suggestion are scrubbed of the token.
        pub(crate) fn fail(&self, code: &str, message: &str, suggestion: &str) -> ToolFailure {
            ToolFailure::with_code(self.redact(message), code).suggest(self.redact(suggestion))
        }

        /// `[tag] <method> failed<qualifier>: <reason>` with the service's API code.
        pub(crate) fn api_failure(&self, method: &str, qualifier: &str, reason: &str) -> ToolFailure {
            let tag = self.service.tag;
            self.fail(
                self.service.api_error_code,
                &format!("[{tag}] {method} failed{qualifier}: {reason}"),
                self.service.api_suggestion,
            )
            .help_url((self.service.docs_url)(method))
        }

        /// Sends `request` with `payload` as its JSON body; returns the status
        /// and the reply when it is a JSON object.
        pub(crate) async fn post_json(
            &self,
            method: &str,
            request: RequestBuilder,
            payload: &JsonObject,
        ) -> Result<(StatusCode, Option<JsonObject>), ToolFailure> {
            let body = serde_json::to_string(payload).map_err(|error| {
                self.fail("E_TOOL", &format!("[{}] {method}: {error}", self.service.tag), "Report this bug.")
            })?;
            tracing::debug!(target: "goondan::tool", "[{}] {method} via {}", self.service.tag, self.base_url);
            let reply = match self.exchange(request.body(body), MAX_API_REPLY_BYTES, true).await {
                Ok(reply) => reply,
                Err(Exchange::Transport(why)) => {
                    return Err(self.fail(
                        self.service.request_error_code,
                        &format!("[{}] {method} request to {} failed: {why}", self.service.tag, self.base_url),
                        &format!(
                            "Check that the {} API at {} is reachable from this machine, or raise 'timeoutMs' if it is slow.",
                            self.service.name, self.base_url
                        ),
                    ));
                }
                Err(Exchange::TooLarge { .. }) => {
                    return Err(self
                        .api_failure(method, "", &format!("the reply is larger than {MAX_API_REPLY_BYTES} bytes"))
                        .suggest("Ask for less at a time (e.g. a smaller 'limit')."));
                }
            };
            let object = match serde_json::from_slice::<JsonValue>(&reply.body) {
                Ok(JsonValue::Object(map)) => Some(map),
                _ => None,
            };
            Ok((reply.status, object))
        }

        /// Downloads a file with `request`, refusing more than `options.max_bytes`
        /// (checked against `content-length` and again while streaming).
        pub(crate) async fn download(
            &self,
            request: RequestBuilder,
            options: &DownloadOptions,
        ) -> Result<Download, ToolFailure> {
            let tag = self.service.tag;
            let max = options.max_bytes;
            match self.exchange(request, max, false).await {
                Ok(reply) if reply.status.is_success() => Ok(Download { headers: reply.headers, bytes: reply.body }),
                Ok(reply) => Err(self.fail(
                    self.service.api_error_code,
                    &format!("[{tag}] file download failed: {}", http_description(reply.status)),
                    "Check that the file still exists and that the bot may read it.",
                )),
                Err(Exchange::Transport(why)) => Err(self.fail(
                    self.service.request_error_code,
                    &format!("[{tag}] file download request failed: {why}"),
                    "Check that the file's host is reachable from this machine, or raise 'timeoutMs' if it is slow.",
                )),
                Err(Exchange::TooLarge { declared }) => {
                    let size =
                        declared.map_or_else(|| format!("more than {max} bytes"), |size| format!("{size} > {max}"));
                    Err(self.fail(
                        E_FILE_TOO_LARGE,
                        &format!("[{tag}] file exceeds maxBytes limit ({size})"),
                        &format!("Raise 'maxBytes' (at most {MAX_MAX_BYTES}) if the file is really needed."),
                    ))
                }
            }
        }

        /// Sends `request` and reads the reply's body up to `cap` bytes, all
        /// within the call's timeout. With `body_on_error` false a non-2xx
        /// reply's body is not read.
        async fn exchange(&self, request: RequestBuilder, cap: usize, body_on_error: bool) -> Result<Reply, Exchange> {
            let work = async {
                let mut response = request.send().await.map_err(transport)?;
                let status = response.status();
                let headers = response.headers().clone();
                let mut body = Vec::new();
                if status.is_success() || body_on_error {
                    if let Some(declared) = response.content_length()
                        && declared > cap as u64
                    {
                        return Err(Exchange::TooLarge { declared: Some(declared) });
                    }
                    while let Some(chunk) = response.chunk().await.map_err(transport)? {
                        if body.len() + chunk.len() > cap {
                            return Err(Exchange::TooLarge { declared: None });
                        }
                        body.extend_from_slice(&chunk);
                    }
                }
                Ok(Reply { status, headers, body })
            };
            match tokio::time::timeout(Duration::from_millis(self.timeout_ms), work).await {
                Ok(result) => result,
                Err(_) => Err(Exchange::Transport(format!("timed out after {} ms", self.timeout_ms))),
            }
        }
    }

    /// Why an exchange gave no usable reply.
    enum Exchange {
        /// No reply (connection, TLS, timeout…), described without the URL.
        Transport(String),
        /// The body is larger than allowed.
        TooLarge { declared: Option<u64> },
    }

    struct Reply {
        status: StatusCode,
        headers: HeaderMap,
        body: Vec<u8>,
    }

    /// A reqwest error as text, without the URL it quotes (which may hold the
    /// token) and with its causes, which say what actually went wrong.
    fn transport(error: reqwest::Error) -> Exchange {
        let error = error.without_url();
        let mut text = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            let cause_text = cause.to_string();
            if !text.contains(&cause_text) {
                text.push_str(": ");
                text.push_str(&cause_text);
            }
            source = cause.source();
        }
        Exchange::Transport(text)
    }

    /// A downloaded file.
    #[derive(Debug)]
    pub(crate) struct Download {
        headers: HeaderMap,
        /// The file's content.
        pub(crate) bytes: Vec<u8>,
    }

    impl Download {
        /// A reply header as text, if present, readable and not empty.
        pub(crate) fn header(&self, name: &str) -> Option<String> {
            self.headers.get(name).and_then(|value| value.to_str().ok()).filter(|v| !v.is_empty()).map(str::to_owned)
        }
    }

    /// `maxBytes`, `includeBase64`, `includeDataUrl` and `savePath` of a download.
    #[derive(Debug)]
    pub(crate) struct DownloadOptions {
        max_bytes: usize,
        include_base64: bool,
        include_data_url: bool,
        save_path: Option<PathBuf>,
    }

    /// The result fields about a downloaded file's content.
    #[derive(Debug)]
    pub(crate) struct FileOutput {
        /// Where it was saved, or null.
        pub(crate) saved_path: JsonValue,
        /// Its content in base64, or null.
        pub(crate) base64: JsonValue,
        /// A `data:` URL of it, or null.
        pub(crate) data_url: JsonValue,
    }

    impl DownloadOptions {
        /// Reads and checks the options; `savePath` must resolve inside the
        /// workdir (or an operator-allowed root), checked before any download.
        pub(crate) fn from_input(
            ctx: &ToolContext,
            settings: &BaseSettings,
            input: &JsonObject,
        ) -> Result<Self, ToolFailure> {
            let raw = args::optional_number(input, "maxBytes")?.unwrap_or(DEFAULT_MAX_BYTES);
            if !raw.is_finite() || raw <= 0.0 {
                return Err(invalid("'maxBytes' must be a positive number", "Omit 'maxBytes' for 3000000 bytes."));
            }
            let max_bytes = raw.trunc();
            if !(1.0..=MAX_MAX_BYTES).contains(&max_bytes) {
                return Err(invalid(
                    format!("'maxBytes' must be between 1 and {MAX_MAX_BYTES}"),
                    "Omit 'maxBytes' for 3000000 bytes.",
                ));
            }
            let save_path = match optional_trimmed(input, "savePath")? {
                Some(path) => {
                    let resolved = crate::paths::resolve_confined(ctx.workdir(), &settings.extra_fs_roots, &path)?;
                    // Checked now, before the download; a directory (the
                    // workdir itself, say) would also put the temporary file
                    // in its parent.
                    if resolved.is_dir() {
                        return Err(invalid(
                            format!("'savePath' ({path}) is a directory"),
                            "Name the file to create, e.g. \"downloads/photo.jpg\".",
                        ));
                    }
                    Some(resolved)
                }
                None => None,
            };
            Ok(Self {
                // In 1..=20_000_000, so exact.
                max_bytes: max_bytes as usize,
                include_base64: args::optional_bool(input, "includeBase64")?.unwrap_or(true),
                include_data_url: args::optional_bool(input, "includeDataUrl")?.unwrap_or(true),
                save_path,
            })
        }

        /// Saves `bytes` if asked, and encodes them as asked.
        pub(crate) async fn finish(
            &self,
            api: &Api,
            bytes: &[u8],
            content_type: Option<&str>,
        ) -> Result<FileOutput, ToolFailure> {
            let saved_path = match &self.save_path {
                Some(path) => {
                    save(path, bytes).await.map_err(|error| {
                        api.fail(
                            E_FILE_WRITE,
                            &format!("could not save the downloaded file to {}: {error}", path.display()),
                            "Choose a 'savePath' for a file (not a directory) inside the working directory.",
                        )
                    })?;
                    JsonValue::from(path.to_string_lossy().into_owned())
                }
                None => JsonValue::Null,
            };
            let base64 = self.include_base64.then(|| STANDARD.encode(bytes));
            let data_url = match (&base64, content_type) {
                (Some(encoded), Some(content_type)) if self.include_data_url && !bytes.is_empty() => {
                    JsonValue::from(format!("data:{content_type};base64,{encoded}"))
                }
                _ => JsonValue::Null,
            };
            Ok(FileOutput { saved_path, base64: base64.map_or(JsonValue::Null, JsonValue::from), data_url })
        }
    }

    /// Writes `bytes` to `path` through a temporary file in the same
    /// directory, so that a crash never leaves half a file under `path`.
    async fn save(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let (Some(parent), Some(_)) = (path.parent(), path.file_name()) else {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path names no file"));
        };
        tokio::fs::create_dir_all(parent).await?;
        // Unique per process and call, so that concurrent saves never share one.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let serial = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Not derived from the name, which may already be as long as a name can be.
        let temporary = parent.join(format!(".goondan-download-{}-{serial}.part", std::process::id()));
        let written = async {
            tokio::fs::write(&temporary, bytes).await?;
            tokio::fs::rename(&temporary, path).await
        }
        .await;
        if written.is_err() {
            let _ = tokio::fs::remove_file(&temporary).await;
        }
        written
    }

    /// `timeoutMs`: positive, 15000 by default.
    fn timeout_ms(input: &JsonObject) -> Result<u64, ToolFailure> {
        let raw = args::optional_number(input, "timeoutMs")?.unwrap_or(DEFAULT_TIMEOUT_MS);
        if !raw.is_finite() || raw <= 0.0 {
            return Err(invalid("'timeoutMs' must be a positive number", "Omit 'timeoutMs' for 15000 ms."));
        }
        // Saturating; below one millisecond still waits one.
        Ok((raw.trunc() as u64).max(1))
    }

    fn token(
        service: &Service,
        settings: &BaseSettings,
        input: &JsonObject,
    ) -> Result<(String, TokenSource), ToolFailure> {
        if let Some(token) = args::optional_string(input, "token")?.filter(|token| !token.is_empty()) {
            return Ok((token.to_owned(), TokenSource::Input));
        }
        if let Some((var, token)) = settings.first_env(service.token_vars) {
            return Ok((token.to_owned(), TokenSource::Env(var.to_owned())));
        }
        let vars = service.token_vars.join("/");
        Err(ToolFailure::with_code(
            format!("{} bot token not found. Provide 'token' or set {vars}.", service.name),
            E_TOKEN_MISSING,
        )
        .named("TokenMissingError")
        .suggest(format!(
            "Ask the operator to set {} in the environment of the Goondan runtime, or pass 'token'.",
            service.token_vars.first().copied().unwrap_or("the token variable")
        )))
    }

    fn configured_base_url(service: &Service, settings: &BaseSettings) -> Result<String, ToolFailure> {
        let Some(raw) = settings.env.get(service.base_url_var) else {
            return Ok(service.default_base_url.to_owned());
        };
        normalize_base_url(raw).map_err(|why| {
            ToolFailure::with_code(
                format!("{} ({raw}) cannot be used as the {} API base URL: {why}", service.base_url_var, service.name),
                E_CONFIG,
            )
            .suggest(format!(
                "Ask the operator to set {} to an http(s) URL such as {}, or to unset it.",
                service.base_url_var, service.default_base_url
            ))
        })
    }

    fn destination_refused(service: &Service, var: &str, requested: &str, configured: &str) -> ToolFailure {
        ToolFailure::with_code(
            format!(
                "refusing to send the operator's {name} token (from {var}) to {requested}: a base URL given in \
                 'apiBaseUrl' only receives a token given in the same call, and the operator's token only goes to \
                 {configured}",
                name = service.name
            ),
            E_TOKEN_DESTINATION_REFUSED,
        )
        .named("TokenDestinationRefusedError")
        .suggest(format!(
            "Omit 'apiBaseUrl' to use {configured}. Another {name} API endpoint needs its own 'token' in the call, or \
             the operator's {base_var} setting.",
            name = service.name,
            base_var = service.base_url_var
        ))
    }
}

/// A local HTTP server that records every request, for the tests of the
/// `telegram` and `slack` tools.
#[cfg(test)]
pub(crate) mod test_server {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex, PoisonError};

    use axum::body::Bytes;
    use axum::http::{HeaderMap, Method, StatusCode, Uri};
    use axum::response::{IntoResponse, Response};
    use goondan_core::{JsonObject, JsonValue, ToolCall, ToolResult};
    use goondan_tools::{ToolCatalog, ToolContext, ToolExecutor, ToolRegistry};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use crate::BaseSettings;

    /// One request as the server received it.
    #[derive(Debug, Clone)]
    pub(crate) struct Recorded {
        pub(crate) method: String,
        /// Path and query.
        pub(crate) target: String,
        pub(crate) headers: Vec<(String, String)>,
        pub(crate) body: Vec<u8>,
    }

    impl Recorded {
        /// The value of header `name` (lower case), if sent once or more.
        pub(crate) fn header(&self, name: &str) -> Option<&str> {
            self.headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
        }

        /// The body as JSON (null if it is not).
        pub(crate) fn json(&self) -> JsonValue {
            serde_json::from_slice(&self.body).unwrap_or(JsonValue::Null)
        }
    }

    /// What the server answers.
    #[derive(Debug, Clone)]
    pub(crate) struct Answer {
        pub(crate) status: u16,
        pub(crate) headers: Vec<(&'static str, String)>,
        pub(crate) body: Vec<u8>,
    }

    /// A 200 JSON answer.
    pub(crate) fn json_answer(value: JsonValue) -> Answer {
        status_json_answer(200, value)
    }

    /// A JSON answer with `status`.
    pub(crate) fn status_json_answer(status: u16, value: JsonValue) -> Answer {
        Answer {
            status,
            headers: vec![("content-type", "application/json".to_owned())],
            body: value.to_string().into_bytes(),
        }
    }

    type Responder = dyn Fn(&Recorded) -> Answer + Send + Sync;

    /// A recording server on 127.0.0.1; stops when dropped.
    pub(crate) struct TestServer {
        /// `http://127.0.0.1:<port>`.
        pub(crate) base: String,
        requests: Arc<Mutex<Vec<Recorded>>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for TestServer {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    impl TestServer {
        /// Starts a server answering every request with `respond`.
        pub(crate) async fn start(respond: impl Fn(&Recorded) -> Answer + Send + Sync + 'static) -> Self {
            let requests: Arc<Mutex<Vec<Recorded>>> = Arc::default();
            let respond: Arc<Responder> = Arc::new(respond);
            let log = Arc::clone(&requests);
            let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let log = Arc::clone(&log);
                let respond = Arc::clone(&respond);
                async move {
                    let recorded = Recorded {
                        method: method.to_string(),
                        target: uri.path_and_query().map_or_else(|| uri.path().to_owned(), ToString::to_string),
                        headers: headers
                            .iter()
                            .map(|(name, value)| {
                                (name.as_str().to_owned(), String::from_utf8_lossy(value.as_bytes()).into_owned())
                            })
                            .collect(),
                        body: body.to_vec(),
                    };
                    let answer = respond(&recorded);
                    log.lock().unwrap_or_else(PoisonError::into_inner).push(recorded);
                    let mut response: Response = answer.body.into_response();
                    *response.status_mut() = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::OK);
                    // Only the answer's own headers: no default content type.
                    response.headers_mut().remove(axum::http::header::CONTENT_TYPE);
                    for (name, value) in answer.headers {
                        if let Ok(value) = value.parse() {
                            response.headers_mut().insert(name, value);
                        }
                    }
                    response
                }
            });
            let Ok(listener) = tokio::net::TcpListener::bind("127.0.0.1:0").await else { panic!("bind 127.0.0.1:0") };
            let Ok(address) = listener.local_addr() else { panic!("local_addr") };
            let task = tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            });
            Self { base: format!("http://{address}"), requests, task }
        }

        /// The requests received so far.
        pub(crate) fn requests(&self) -> Vec<Recorded> {
            self.requests.lock().unwrap_or_else(PoisonError::into_inner).clone()
        }

        /// The only request received.
        pub(crate) fn single(&self) -> Recorded {
            let mut requests = self.requests();
            assert_eq!(requests.len(), 1, "expected exactly one request, got {requests:?}");
            requests.remove(0)
        }
    }

    /// A server that answers POST requests with `api_reply` (when given) and
    /// every other request with an endless chunked body (no content-length),
    /// until the client goes away.
    pub(crate) async fn endless_server(api_reply: Option<JsonValue>) -> (String, tokio::task::JoinHandle<()>) {
        let Ok(listener) = tokio::net::TcpListener::bind("127.0.0.1:0").await else { panic!("bind") };
        let Ok(address) = listener.local_addr() else { panic!("local_addr") };
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let api_reply = api_reply.clone();
                tokio::spawn(async move {
                    let mut request = [0_u8; 4096];
                    let Ok(read) = socket.read(&mut request).await else { return };
                    if let Some(reply) = api_reply.filter(|_| request[..read].starts_with(b"POST")) {
                        let body = reply.to_string();
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = socket.write_all(answer.as_bytes()).await;
                        return;
                    }
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
                    if socket.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let chunk = vec![b'x'; 64 * 1024];
                    let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
                    frame.extend_from_slice(&chunk);
                    frame.extend_from_slice(b"\r\n");
                    // 100 MB at most, in case the client never stops.
                    for _ in 0..1600 {
                        if socket.write_all(&frame).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (format!("http://{address}"), task)
    }

    /// The base URL of a 127.0.0.1 port nobody listens on.
    pub(crate) async fn closed_base() -> String {
        let Ok(listener) = tokio::net::TcpListener::bind("127.0.0.1:0").await else { panic!("bind") };
        let Ok(address) = listener.local_addr() else { panic!("local_addr") };
        drop(listener);
        format!("http://{address}")
    }

    /// Settings with these environment values.
    pub(crate) fn settings_with(env: &[(&str, &str)]) -> Arc<BaseSettings> {
        let env: BTreeMap<String, String> = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        Arc::new(BaseSettings { env, ..BaseSettings::default() })
    }

    /// `settings` with loopback on the SSRF allow-list (`GOONDAN_HTTP_ALLOW=127.0.0.1`),
    /// so a model-chosen `apiBaseUrl` may point at a test server.
    pub(crate) fn allowing_loopback(settings: &Arc<BaseSettings>) -> Arc<BaseSettings> {
        Arc::new(BaseSettings { http_allow: vec!["127.0.0.1".to_owned()], ..(**settings).clone() })
    }

    /// Runs `tool.export` with `input` in `workdir`.
    pub(crate) async fn run_in(
        tool: &str,
        export: &str,
        settings: &Arc<BaseSettings>,
        workdir: &std::path::Path,
        input: JsonValue,
    ) -> goondan_tools::HandlerResult {
        let Some(handler) = crate::native_handler(tool, export, settings) else { panic!("no handler {tool}.{export}") };
        let ctx: ToolContext = crate::args::test_support::context_in(&format!("{tool}__{export}"), workdir);
        let input: JsonObject = crate::args::test_support::object(input);
        handler.call(&ctx, &input).await
    }

    /// Runs `tool.export` with `input` in the temp directory.
    pub(crate) async fn run(
        tool: &str,
        export: &str,
        settings: &Arc<BaseSettings>,
        input: JsonValue,
    ) -> goondan_tools::HandlerResult {
        run_in(tool, export, settings, std::env::temp_dir().as_path(), input).await
    }

    /// Runs `call` through a real executor whose registry and catalog hold
    /// every export of `tool` from the built-in package's manifest.
    pub(crate) async fn execute(tool: &str, settings: &Arc<BaseSettings>, export: &str, args: JsonValue) -> ToolResult {
        let Some(resource) = goondan_config::base_package().tools().find(|t| t.name() == tool) else {
            panic!("no {tool} in the base package")
        };
        let mut registry = ToolRegistry::new();
        let mut catalog = ToolCatalog::new();
        for item_export in &resource.spec.exports {
            let item = goondan_tools::assembly::export_item(resource, item_export);
            let Some(handler) = crate::native_handler(tool, &item_export.name, settings) else {
                panic!("no handler for {tool}.{}", item_export.name)
            };
            if let Err(error) = registry.register(item.clone(), handler) {
                panic!("{error}");
            }
            catalog.insert(item);
        }
        let executor = ToolExecutor::new(Arc::new(registry));
        let ctx = crate::args::test_support::context(&format!("{tool}__{export}"));
        let call = ToolCall::new("call-1", format!("{tool}__{export}"), crate::args::test_support::object(args));
        executor.execute(call, ctx.scope(), &Arc::new(catalog)).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use goondan_core::{JsonValue, ToolStatus};
    use serde_json::json;

    use super::bot_api::{
        E_FILE_TOO_LARGE, E_INVALID_ARGS, E_TOKEN_DESTINATION_REFUSED, E_TOKEN_INVALID, E_TOKEN_MISSING,
    };
    use super::test_server::{
        Answer, TestServer, allowing_loopback, closed_base, endless_server, execute, json_answer, run, run_in,
        settings_with, status_json_answer,
    };
    use crate::BaseSettings;
    use crate::args::test_support::{err, ok};
    use crate::paths::E_PATH_OUTSIDE_WORKDIR;

    const ENV_TOKEN: &str = "123456:ENV-secret_token";

    /// A server answering `{ok: true, result}` and settings pointing at it
    /// with the operator's token.
    async fn telegram(result: JsonValue) -> (TestServer, Arc<BaseSettings>) {
        let server = TestServer::start(move |_| json_answer(json!({"ok": true, "result": result.clone()}))).await;
        let settings =
            settings_with(&[("TELEGRAM_API_BASE_URL", server.base.as_str()), ("TELEGRAM_BOT_TOKEN", ENV_TOKEN)]);
        (server, settings)
    }

    fn assert_no_token(value: &impl std::fmt::Debug, token: &str) {
        let text = format!("{value:?}");
        assert!(!text.contains(token), "token leaked: {text}");
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
            (json!({"chatId": 1}), "'text' is required"),
        ];
        for (input, message) in cases {
            let failure = err(run("telegram", "send", &settings, input.clone()).await);
            assert_eq!(failure.message, message, "{input}");
            assert!(failure.suggestion.is_some(), "{input}");
            if message != "'text' is required" {
                assert_eq!(failure.code.as_deref(), Some(E_INVALID_ARGS), "{input}");
            }
        }
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
                let mut input = crate::args::test_support::object(input);
                if export != "edit" {
                    input.shift_remove("text");
                }
                if export != "react" {
                    input.shift_remove("emoji");
                }
                let failure = err(run("telegram", export, &settings, JsonValue::Object(input)).await);
                assert_eq!(failure.message, "'messageId' must be a positive integer", "{export} {bad}");
                assert_eq!(failure.code.as_deref(), Some(E_INVALID_ARGS));
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
            assert_eq!(failure.code.as_deref(), Some(E_INVALID_ARGS));
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
        assert_eq!(failure.code.as_deref(), Some(E_INVALID_ARGS));
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
        let Ok(dir) = tempfile::tempdir() else { panic!("tempdir") };
        let Ok(workdir) = std::fs::canonicalize(dir.path()) else { panic!("canonicalize") };
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
            assert_eq!(failure.code.as_deref(), Some(E_INVALID_ARGS));
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
    async fn download_file_checks_its_inputs_and_get_file_reply() {
        let server = file_server(4).await;
        let settings = settings_with(&[("TELEGRAM_API_BASE_URL", &server.base), ("TELEGRAM_BOT_TOKEN", ENV_TOKEN)]);
        let Ok(dir) = tempfile::tempdir() else { panic!("tempdir") };
        for path in ["../escape.jpg", "/etc/passwd"] {
            let failure = err(run_in(
                "telegram",
                "downloadFile",
                &settings,
                dir.path(),
                json!({"fileId": "AgAD", "savePath": path}),
            )
            .await);
            assert_eq!(failure.code.as_deref(), Some(E_PATH_OUTSIDE_WORKDIR), "{path}");
        }
        let failure = err(run("telegram", "downloadFile", &settings, json!({"fileId": "  "})).await);
        assert_eq!(failure.message, "'fileId' must be a non-empty string");
        assert!(server.requests().is_empty());

        for path in [".", "sub/.."] {
            let failure = err(run_in(
                "telegram",
                "downloadFile",
                &settings,
                dir.path(),
                json!({"fileId": "AgAD", "savePath": path}),
            )
            .await);
            assert_eq!(failure.code.as_deref(), Some(E_INVALID_ARGS), "{path}");
            assert!(failure.message.ends_with("is a directory"), "{}", failure.message);
        }
        assert!(server.requests().is_empty());
        // A place that cannot be written although allowed: /proc (as an
        // operator-allowed root) refuses new files, even to root.
        if std::path::Path::new("/proc/self").exists() {
            let mut proc_settings = (*settings).clone();
            proc_settings.extra_fs_roots = vec!["/proc".into()];
            let failure = err(run_in(
                "telegram",
                "downloadFile",
                &Arc::new(proc_settings),
                dir.path(),
                json!({"fileId": "AgAD", "savePath": "/proc/goondan-download-test.jpg"}),
            )
            .await);
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
        assert!(super::handler("sendPhoto", &crate::args::test_support::settings()).is_none());
    }
}
