//! HTTP plumbing shared by the `telegram` and `slack` tools: which token and
//! base URL a call uses, JSON calls, bounded downloads, and error messages
//! (and results) that never contain the token.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use goondan_core::codes::{
    E_FILE_TOO_LARGE, E_FILE_WRITE, E_TOKEN_DESTINATION_REFUSED, E_TOKEN_INVALID, E_TOKEN_MISSING, E_TOOL,
    E_TOOL_CONFIG, E_TOOL_INVALID_ARGS,
};
use goondan_core::{JsonObject, JsonValue};
use goondan_tools::{BoxFuture, HandlerResult, ToolContext, ToolFailure, ToolHandler};
use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Client, RequestBuilder, StatusCode, Url};

use crate::{BaseSettings, args, files, http_io};

/// What replaces a token in messages and results.
pub(crate) const REDACTED: &str = "<redacted>";

const DEFAULT_TIMEOUT_MS: f64 = 15_000.0;
const DEFAULT_MAX_BYTES: u64 = 3_000_000;
const MAX_MAX_BYTES: u64 = 20_000_000;
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
    /// Environment variables holding the operator's token, in the
    /// original's order of reading them.
    pub(crate) token_vars: &'static [&'static str],
    /// The variables the "token not found" message names, as the original
    /// words it (Telegram's leaves out its last fallback).
    pub(crate) missing_token_vars: &'static str,
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

/// One export of a chat tool: reads the input, calls the service, and
/// answers with the output.
pub(crate) type ExportFn =
    for<'a> fn(&'a ToolContext, &'a BaseSettings, &'a JsonObject) -> BoxFuture<'a, Result<JsonValue, ToolFailure>>;

/// The handler of one export of a chat tool: runs `export` with the
/// operator's settings and scrubs the token from its output and its failure
/// ([`scrub`]), whatever built them.
pub(crate) fn handler(
    service: &'static Service,
    settings: &Arc<BaseSettings>,
    export: ExportFn,
) -> Arc<dyn ToolHandler> {
    Arc::new(BotExport { service, settings: Arc::clone(settings), export })
}

struct BotExport {
    service: &'static Service,
    settings: Arc<BaseSettings>,
    export: ExportFn,
}

impl ToolHandler for BotExport {
    fn call<'a>(&'a self, ctx: &'a ToolContext, input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            let token = token(self.service, &self.settings, input).ok().map(|(token, _)| token);
            let token = token.as_deref().filter(|token| !token.is_empty());
            match (self.export)(ctx, &self.settings, input).await {
                Ok(output) => Ok(match token {
                    Some(token) => scrub(output, token),
                    None => output,
                }
                .into()),
                Err(mut failure) => {
                    if let Some(token) = token {
                        failure.message = failure.message.replace(token, REDACTED);
                        failure.suggestion = failure.suggestion.map(|text| text.replace(token, REDACTED));
                    }
                    Err(failure)
                }
            }
        })
    }
}

/// A failure of the input's meaning.
pub(crate) fn invalid(message: impl Into<String>, suggestion: impl Into<String>) -> ToolFailure {
    ToolFailure::with_code(message, E_TOOL_INVALID_ARGS).suggest(suggestion)
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

/// A message's text: a non-empty string (white space is kept), refused with
/// the original's wording, `'text' must be a non-empty string`, before any
/// request is made.
pub(crate) fn required_text<'a>(input: &'a JsonObject, key: &str) -> Result<&'a str, ToolFailure> {
    args::require_string(input, key).map_err(|failure| {
        invalid(failure.message, format!("Pass the message's text in '{key}'; an empty message cannot be sent."))
    })
}

/// An optional string property, trimmed; blank counts as absent.
pub(crate) fn optional_trimmed(input: &JsonObject, key: &str) -> Result<Option<String>, ToolFailure> {
    Ok(args::optional_string(input, key)?.map(str::trim).filter(|text| !text.is_empty()).map(str::to_owned))
}

/// An optional boolean property as a request body value.
pub(crate) fn bool_value(input: &JsonObject, key: &str) -> Result<Option<JsonValue>, ToolFailure> {
    Ok(args::optional_bool(input, key)?.map(JsonValue::from))
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

/// `value` with `token` replaced by [`REDACTED`] in every string: results
/// carry text the service sent back (messages, file paths), and a token must
/// never reach the model.
fn scrub(value: JsonValue, token: &str) -> JsonValue {
    match value {
        JsonValue::String(text) if text.contains(token) => JsonValue::String(text.replace(token, REDACTED)),
        JsonValue::Array(items) => JsonValue::Array(items.into_iter().map(|item| scrub(item, token)).collect()),
        JsonValue::Object(map) => {
            JsonValue::Object(map.into_iter().map(|(key, item)| (key, scrub(item, token))).collect())
        }
        other => other,
    }
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
    /// The operator's token only goes to the operator's base URL (the
    /// service's default when none is set): a base URL from the input
    /// receives only a token from the input.
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
                    TokenSource::Env(var) if requested != configured_base_url => {
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
                format!("the {} bot token {origin} contains characters that cannot appear in an API URL", service.name),
                E_TOKEN_INVALID,
            )
            .suggest("Use the token exactly as the bot's issuer gave it (digits, a colon, letters, '-' and '_')."));
        }
        // A base URL the model chose (not the operator's, or the default
        // when the operator set none) is an address the model picked: it goes through the
        // SSRF guard like any http-fetch URL, so a call that brings its
        // own token still cannot reach internal addresses.
        let model_chosen = base_url != configured_base_url;
        let builder = if model_chosen {
            let guard = crate::net_guard::NetGuard::new(settings);
            let url = Url::parse(&base_url).map_err(|error| {
                invalid(format!("'apiBaseUrl' ({base_url}) is not a valid URL: {error}"), "Fix the URL.".to_owned())
            })?;
            guard.check_url(&url).map_err(|refused| refused.to_failure(&format!("[{}] 'apiBaseUrl'", service.tag)))?;
            guard.client_builder()
        } else {
            goondan_core::tls::client_builder(goondan_core::tls::SystemProxy::Ignored)
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
            self.fail(E_TOOL, &format!("[{}] {method}: {error}", self.service.tag), "Report this bug.")
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
                let size = declared.map_or_else(|| format!("more than {max} bytes"), |size| format!("{size} > {max}"));
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
                let capped = http_io::read_capped(&mut response, cap).await.map_err(transport)?;
                if capped.truncated {
                    return Err(Exchange::TooLarge { declared: None });
                }
                body = capped.bytes;
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
/// token).
fn transport(error: reqwest::Error) -> Exchange {
    Exchange::Transport(http_io::describe_error(error))
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
    save_path: Option<crate::paths::Confined>,
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
        let suggestion = format!("Omit 'maxBytes' for {DEFAULT_MAX_BYTES} bytes.");
        let max_bytes = positive_whole(input, "maxBytes", DEFAULT_MAX_BYTES, MAX_MAX_BYTES, &suggestion)?;
        let save_path = match optional_trimmed(input, "savePath")? {
            Some(path) => {
                let resolved = crate::paths::resolve_beneath(ctx.workdir(), &settings.extra_fs_roots, &path)?;
                // Checked now, before the download; a directory (the
                // workdir itself, say) would also put the temporary file
                // in its parent.
                if resolved.real.is_dir() {
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
            // At most 20_000_000.
            max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
            include_base64: args::optional_bool(input, "includeBase64")?.unwrap_or(true),
            include_data_url: args::optional_bool(input, "includeDataUrl")?.unwrap_or(true),
            save_path,
        })
    }

    /// Encodes `bytes` as asked, and saves them if asked.
    pub(crate) async fn finish(
        &self,
        api: &Api,
        bytes: Vec<u8>,
        content_type: Option<&str>,
    ) -> Result<FileOutput, ToolFailure> {
        let base64 = self.include_base64.then(|| STANDARD.encode(&bytes));
        let data_url = match (&base64, content_type) {
            (Some(encoded), Some(content_type)) if self.include_data_url && !bytes.is_empty() => {
                JsonValue::from(format!("data:{content_type};base64,{encoded}"))
            }
            _ => JsonValue::Null,
        };
        let saved_path = match &self.save_path {
            Some(confined) => {
                let (target, path) = (confined.clone(), &confined.real);
                let saved = files::run_blocking(move || save(&target, &bytes))
                    .await
                    .unwrap_or_else(|error| Err(std::io::Error::other(error.to_string())));
                saved.map_err(|error| {
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
        Ok(FileOutput { saved_path, base64: base64.map_or(JsonValue::Null, JsonValue::from), data_url })
    }
}

/// Writes `bytes` to the checked path `target` atomically
/// ([`files::replace_atomically`]), beneath its root (a link swapped in
/// meanwhile cannot lead outside), creating missing directories on the way;
/// an existing file keeps its permissions.
fn save(target: &crate::paths::Confined, bytes: &[u8]) -> std::io::Result<()> {
    let root = files::open_root(&target.root)?;
    let Some((parent, name)) = files::open_parent(&root, &target.relative, true)? else {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path names no file"));
    };
    let permissions = parent.symlink_metadata(&name).ok().filter(|meta| meta.is_file()).map(|meta| meta.permissions());
    files::replace_atomically(&parent, &name, bytes, permissions)
}

/// A number property that must be positive; `default` when absent.
pub(crate) fn positive_number(
    input: &JsonObject,
    key: &str,
    default: f64,
    suggestion: &str,
) -> Result<f64, ToolFailure> {
    let raw = args::optional_number(input, key)?.unwrap_or(default);
    if !raw.is_finite() || raw <= 0.0 {
        return Err(invalid(format!("'{key}' must be a positive number"), suggestion));
    }
    Ok(raw)
}

/// A positive number property cut to a whole number in `1..=max` (as the
/// original's `Math.trunc`); `default` when absent.
pub(crate) fn positive_whole(
    input: &JsonObject,
    key: &str,
    default: u64,
    max: u64,
    suggestion: &str,
) -> Result<u64, ToolFailure> {
    let whole = positive_number(input, key, default as f64, suggestion)?.trunc();
    if !(1.0..=max as f64).contains(&whole) {
        return Err(invalid(format!("'{key}' must be between 1 and {max}"), suggestion));
    }
    // Whole and in 1..=max, so exact.
    Ok(whole as u64)
}

/// `timeoutMs`: positive, 15000 by default.
fn timeout_ms(input: &JsonObject) -> Result<u64, ToolFailure> {
    let raw = positive_number(input, "timeoutMs", DEFAULT_TIMEOUT_MS, "Omit 'timeoutMs' for 15000 ms.")?;
    // Saturating; below one millisecond still waits one.
    Ok((raw.trunc() as u64).max(1))
}

fn token(service: &Service, settings: &BaseSettings, input: &JsonObject) -> Result<(String, TokenSource), ToolFailure> {
    if let Some(token) = args::optional_string(input, "token")?.filter(|token| !token.is_empty()) {
        return Ok((token.to_owned(), TokenSource::Input));
    }
    if let Some((var, token)) = settings.first_env(service.token_vars) {
        return Ok((token.to_owned(), TokenSource::Env(var.to_owned())));
    }
    Err(ToolFailure::with_code(
        format!("{} bot token not found. Provide 'token' or set {}.", service.name, service.missing_token_vars),
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
        let shown = without_secrets(raw);
        ToolFailure::with_code(
            format!("{} ({shown}) cannot be used as the {} API base URL: {why}", service.base_url_var, service.name),
            E_TOOL_CONFIG,
        )
        .suggest(format!(
            "Ask the operator to set {} to an http(s) URL such as {}, or to unset it.",
            service.base_url_var, service.default_base_url
        ))
    })
}

/// An operator's URL as it may be shown to the model: without the
/// credentials, query and fragment that can hold secrets.
fn without_secrets(raw: &str) -> String {
    let Ok(mut url) = Url::parse(raw.trim()) else {
        return raw.to_owned();
    };
    let hidden =
        !url.username().is_empty() || url.password().is_some() || url.query().is_some() || url.fragment().is_some();
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    url.set_fragment(None);
    if hidden { format!("{url}, credentials, query and fragment hidden") } else { url.to_string() }
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
