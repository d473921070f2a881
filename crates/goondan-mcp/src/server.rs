//! The MCP server side: an agent's Tool Catalog offered to MCP clients
//! (`gdn mcp serve`), over stdio or streamable HTTP.
//!
//! [`ToolServer`] is an `rmcp` [`ServerHandler`] over an assembled
//! [`AgentTooling`]: `tools/list` is [`AgentTooling::preview_catalog`] (the
//! catalog a turn's first step offers the model, after the agent's step
//! middleware) and `tools/call` is [`AgentTooling::call_tool`], so a call
//! from an MCP client goes through exactly the pipeline a model's call does
//! — catalog check, argument validation, toolCall middleware, handler — and
//! every failure is an `isError` result carrying the structured
//! `ToolError`, never a protocol error.
//!
//! The tasks extension (`io.modelcontextprotocol/tasks`) is offered: for a
//! client that declares it, a call still running after [`TASK_AFTER`] is
//! answered with a task (rmcp's `TaskManager`, shared by every clone) that
//! the client polls, and `tasks/cancel` stops the call as a cancelled
//! request does. Other clients see no change.
//!
//! Over HTTP, [`bind_http`] refuses a non-loopback address unless the
//! operator allows remote clients, and [`serve_http`] answers `/mcp` only
//! for requests whose `Origin` (when they carry one) is loopback — or, with
//! remote clients allowed, the server's own origin as the request names it —
//! so a web page cannot reach a local server through DNS rebinding.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use goondan_core::{ConversationState, JsonObject, JsonValue, ToolResult, ToolStatus};
use goondan_runtime::agent::AgentTooling;
use goondan_tools::ToolCatalogItem;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock, CreateTaskResult,
    CustomRequest, CustomResult, ErrorCode, GetTaskParams, GetTaskResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskExit, TaskManager, TaskOptions};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use tokio::net::TcpListener;

/// The path the streamable HTTP endpoint is served at.
pub const HTTP_PATH: &str = "/mcp";

/// How long [`serve_http`] waits for open connections after it was asked
/// to stop (an SSE stream a client keeps open would otherwise hold it).
const HTTP_DRAIN: Duration = Duration::from_secs(3);

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// `--http` is not `HOST:PORT`, or the host does not resolve.
    #[error("cannot use '{address}' as HOST:PORT: {reason}")]
    Address { address: String, reason: String },
    /// A non-loopback address without remote clients allowed.
    #[error(
        "refusing to listen on {address} ({resolved}): it is not a loopback address, so other hosts could run this agent's tools; listen on 127.0.0.1 or pass --allow-remote"
    )]
    NotLoopback { address: String, resolved: SocketAddr },
    /// The listener could not bind.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: String,
        #[source]
        source: std::io::Error,
    },
    /// The client did not complete the MCP handshake on stdio.
    #[error("the MCP handshake on standard input/output failed: {0}")]
    Handshake(String),
    /// The HTTP server or the stdio service failed.
    #[error("the MCP server failed: {0}")]
    Io(String),
}

/// How long a call of a client that declares the tasks extension runs
/// before it is answered with a task instead of its result: a quick call
/// answers as before, a long one is followed with `tasks/get`.
pub const TASK_AFTER: Duration = Duration::from_secs(1);
/// The `pollIntervalMs` the server's tasks suggest.
pub const TASK_POLL_INTERVAL_MS: u64 = 500;
/// The `ttlMs` of the server's tasks: a task still working then is failed
/// (and its call stopped); an ended one is kept as long again for its
/// client to read. The serve's call timeout (`--timeout-ms`) holds a call
/// that runs as a task too.
pub const TASK_TTL_MS: u64 = 60 * 60 * 1000;

/// An agent's tools as an MCP server. Cheap to clone: every clone (one per
/// HTTP session) shares the one assembled agent and the one set of tasks.
#[derive(Clone)]
pub struct ToolServer {
    tooling: Arc<AgentTooling>,
    implementation: Implementation,
    /// The calls running as tasks (the tasks extension), for every clone:
    /// over HTTP a client may poll through another session than the one
    /// that called.
    tasks: TaskManager,
}

/// A spawned call, stopped when its holder lets it go: dropping a call's
/// future ends its handler and the processes it started.
struct RunningCall(tokio::task::JoinHandle<CallToolResult>);

impl Drop for RunningCall {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl std::fmt::Debug for ToolServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolServer").field("agent", &self.tooling.agent_name).finish_non_exhaustive()
    }
}

impl ToolServer {
    /// A server over `tooling`, introducing itself as `name` `version`.
    pub fn new(tooling: Arc<AgentTooling>, name: &str, version: &str) -> Self {
        let implementation =
            Implementation::new(name, version).with_title(format!("goondan agent '{}'", tooling.agent_name));
        Self { tooling, implementation, tasks: TaskManager::new() }
    }

    /// The agent's tools as MCP tools, in catalog order: the catalog a
    /// turn's first step would offer, after the agent's step middleware.
    pub async fn tools(&self) -> Vec<Tool> {
        let catalog = self.tooling.preview_catalog(ConversationState::default()).await;
        catalog.iter().map(tool_of).collect()
    }

    /// Runs one call through the agent's whole pipeline.
    pub async fn call(&self, name: &str, arguments: Option<JsonObject>) -> CallToolResult {
        let result = self.tooling.call_tool(name, arguments.unwrap_or_default()).await;
        call_result_of(&result)
    }
}

/// A catalog item as an MCP tool: its name, description and parameter
/// schema. MCP requires an object schema of type `object`; the pipeline
/// only ever passes objects, so saying so changes nothing it accepts.
pub fn tool_of(item: &ToolCatalogItem) -> Tool {
    let mut schema = match item.parameters().map(|schema| schema.raw()) {
        Some(JsonValue::Object(schema)) => schema.clone(),
        // `true`, or no schema: any object.
        _ => JsonObject::new(),
    };
    schema.entry("type").or_insert_with(|| JsonValue::String("object".to_owned()));
    Tool::new_with_raw(item.name().to_owned(), item.description().map(|text| text.to_owned().into()), schema)
}

/// A `ToolResult` as an MCP call result. Success: the output as text (a
/// string as it is, anything else as JSON) and, when it is an object, as
/// `structuredContent` too. A pending result (submitted asynchronous work)
/// is a success whose content is the whole result. An error: `isError`
/// with the `ToolError` as JSON text, so a client sees its code, message
/// and suggestion.
pub fn call_result_of(result: &ToolResult) -> CallToolResult {
    match result.status {
        ToolStatus::Ok => {
            let output = result.output.clone().unwrap_or(JsonValue::Null);
            let text = match &output {
                JsonValue::String(text) => text.clone(),
                other => other.to_string(),
            };
            let mut mapped = CallToolResult::success(vec![ContentBlock::text(text)]);
            if output.is_object() {
                mapped.structured_content = Some(output);
            }
            mapped
        }
        ToolStatus::Pending => {
            let whole = serde_json::to_value(result).unwrap_or(JsonValue::Null);
            let mut mapped = CallToolResult::success(vec![ContentBlock::text(whole.to_string())]);
            mapped.structured_content = Some(whole);
            mapped
        }
        ToolStatus::Error => {
            let error = match &result.error {
                Some(error) => serde_json::to_string(error),
                // The executor always names the error; keep the shape if not.
                None => serde_json::to_string(&serde_json::json!({"message": "the tool call failed"})),
            }
            .unwrap_or_else(|_| r#"{"message":"the tool call failed"}"#.to_owned());
            CallToolResult::error(vec![ContentBlock::text(error)])
        }
    }
}

impl ServerHandler for ToolServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tasks().build())
            .with_server_info(self.implementation.clone())
            .with_instructions(format!(
                "The tools of the goondan agent '{}'. Each call runs through the agent's argument validation and middleware; a failed call is an error result whose text is the structured error (code, message, suggestion).",
                self.tooling.agent_name
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        // One page: a catalog is small, and it must be the same catalog
        // from the first tool to the last.
        Ok(ListToolsResult::with_all_items(self.tools().await))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let declared = context.client_capabilities().is_some_and(|capabilities| capabilities.supports_tasks());
        if !declared {
            return tokio::select! {
                result = self.call(&request.name, request.arguments) => Ok(result.into()),
                // The client cancelled: dropping the call ends its handler (and
                // kills the processes it started), as a turn's cancel does.
                () = context.ct.cancelled() => Err(McpError::internal_error("the call was cancelled", None)),
            };
        }
        // The client follows tasks: a call still running after TASK_AFTER
        // goes on as one.
        let server = self.clone();
        let name = request.name.to_string();
        let arguments = request.arguments;
        let mut running = RunningCall(tokio::spawn(async move { server.call(&name, arguments).await }));
        tokio::select! {
            joined = &mut running.0 => return joined_result(joined).map(CallToolResponse::from),
            () = context.ct.cancelled() => return Err(McpError::internal_error("the call was cancelled", None)),
            () = tokio::time::sleep(TASK_AFTER) => {}
        }
        let options = TaskOptions::new()
            .with_ttl_ms(TASK_TTL_MS)
            .with_poll_interval_ms(TASK_POLL_INTERVAL_MS)
            .with_status_message(format!("'{}' is running", request.name));
        let task = self.tasks.spawn(options, move |task| {
            Box::pin(async move {
                tokio::select! {
                    joined = &mut running.0 => joined_result(joined).map_err(TaskExit::Error),
                    // tasks/cancel: the call is dropped, as a cancelled request's is.
                    () = task.cancelled() => {
                        drop(running);
                        Err(TaskExit::Cancelled)
                    }
                }
            })
        });
        Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        Ok(GetTaskResult::new(self.tasks.get_task(&request.task_id)?))
    }

    /// The agent's tools ask no input, so there is nothing to deliver: the
    /// answer is acknowledged (and ignored) as the extension asks.
    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.tasks.update_task(&request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.tasks.cancel_task(&request.task_id)
    }

    /// The stand-in for a request over [`MAX_MESSAGE_BYTES`] (see
    /// [`serve_stdio`]): an error answer naming the limit. Any other method
    /// is not found, as the SDK answers by default.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        if request.method == TOO_LARGE_METHOD {
            return Err(McpError::invalid_request(
                format!(
                    "the request exceeds the limit of {MAX_MESSAGE_BYTES} bytes ({} MiB) for one message and was not read",
                    MAX_MESSAGE_BYTES / (1024 * 1024)
                ),
                None,
            ));
        }
        Err(McpError::new(ErrorCode::METHOD_NOT_FOUND, request.method, None))
    }
}

/// A spawned call's result; a call that panicked is an internal error.
fn joined_result(joined: Result<CallToolResult, tokio::task::JoinError>) -> Result<CallToolResult, McpError> {
    joined.map_err(|error| McpError::internal_error(format!("the call ended abnormally: {error}"), None))
}

use crate::client::MAX_MESSAGE_BYTES;

/// The method of the request that stands in for one over the limit; the
/// SDK routes it to [`ServerHandler::on_custom_request`].
const TOO_LARGE_METHOD: &str = "goondan/requestTooLarge";

/// The server's replacement for an oversized request from its client: a
/// request of [`TOO_LARGE_METHOD`] with the same id, which the handler
/// answers with an error; a message without an id (a notification) needs
/// no answer and is dropped.
fn server_oversized(id: Option<&str>, _limit: usize) -> Option<Vec<u8>> {
    Some(format!("{{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"{TOO_LARGE_METHOD}\"}}\n", id?).into_bytes())
}

/// Serves `server` on standard input and output until the client closes
/// its end or `stop` completes. Nothing else may write to standard output.
///
/// A request line over [`MAX_MESSAGE_BYTES`] is not read (the SDK would
/// drop it without an answer, and its client would wait forever): it is
/// answered at once with a JSON-RPC error (`-32600`, naming the limit) to
/// its id, the rest of the line is skipped, and serving goes on with the
/// next line.
pub async fn serve_stdio(server: ToolServer, stop: impl Future<Output = ()>) -> Result<(), ServeError> {
    tokio::pin!(stop);
    let (stdin, stdout) = rmcp::transport::io::stdio_pipes();
    let stdin = crate::client::BoundedLines::new(stdin, MAX_MESSAGE_BYTES, server_oversized, false);
    let running = tokio::select! {
        running = server.serve((stdin, stdout)) => match running {
            Ok(running) => running,
            // The client went away before it said anything: nothing to serve.
            Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => {
                tracing::debug!("standard input ended before the MCP handshake");
                return Ok(());
            }
            Err(error) => return Err(ServeError::Handshake(error.to_string())),
        },
        () = &mut stop => return Ok(()),
    };
    let token = running.cancellation_token();
    let waiting = running.waiting();
    tokio::pin!(waiting);
    let ended = tokio::select! {
        ended = &mut waiting => ended,
        () = &mut stop => {
            token.cancel();
            waiting.await
        }
    };
    ended.map(|_| ()).map_err(|error| ServeError::Io(error.to_string()))
}

/// Resolves `address` (`HOST:PORT`) and binds a listener to it. Every
/// address the host resolves to must be loopback unless `allow_remote`.
pub async fn bind_http(address: &str, allow_remote: bool) -> Result<TcpListener, ServeError> {
    let resolved: Vec<SocketAddr> = tokio::net::lookup_host(address)
        .await
        .map_err(|error| ServeError::Address { address: address.to_owned(), reason: error.to_string() })?
        .collect();
    if resolved.is_empty() {
        return Err(ServeError::Address {
            address: address.to_owned(),
            reason: "it resolves to no address".to_owned(),
        });
    }
    if !allow_remote && let Some(remote) = resolved.iter().find(|addr| !addr.ip().is_loopback()) {
        return Err(ServeError::NotLoopback { address: address.to_owned(), resolved: *remote });
    }
    TcpListener::bind(resolved.as_slice())
        .await
        .map_err(|source| ServeError::Bind { address: address.to_owned(), source })
}

/// Serves `server` at [`HTTP_PATH`] on `listener` (streamable HTTP, one
/// session per client) until `stop` completes; then open sessions are
/// closed and connections get [`HTTP_DRAIN`] to finish.
pub async fn serve_http(
    listener: TcpListener,
    server: ToolServer,
    allow_remote: bool,
    token: Option<BearerToken>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let mut config = StreamableHttpServerConfig::default();
    if allow_remote {
        // Clients name the server by whatever address reaches it; the
        // Origin check below still stops browsers of other sites.
        config = config.disable_allowed_hosts();
    }
    // rmcp checks Host (loopback names by default); Origin is checked by
    // `check_request`, which also knows the server's own origin.
    let sessions = config.cancellation_token.clone();
    let factory = move || Ok(server.clone());
    let service = StreamableHttpService::new(factory, Arc::new(LocalSessionManager::default()), config);
    let token = token.map(Arc::new);
    let app = axum::Router::new().route_service(HTTP_PATH, service).layer(axum::middleware::from_fn(
        move |request: Request, next: Next| check_request(request, next, allow_remote, token.clone()),
    ));

    let (stopped_tx, stopped_rx) = tokio::sync::watch::channel(false);
    let shutdown = async move {
        stop.await;
        sessions.cancel();
        let _ = stopped_tx.send(true);
    };
    let serving = axum::serve(listener, app).with_graceful_shutdown(shutdown).into_future();
    tokio::pin!(serving);
    let mut stopped = stopped_rx;
    let result = tokio::select! {
        result = &mut serving => result,
        () = async {
            let _ = stopped.wait_for(|stopped| *stopped).await;
            tokio::time::sleep(HTTP_DRAIN).await;
        } => {
            tracing::warn!("MCP HTTP connections still open {}s after shutdown; closing them", HTTP_DRAIN.as_secs());
            Ok(())
        }
    };
    result.map_err(|error| ServeError::Io(error.to_string()))
}

/// A bearer token every HTTP request must carry. Its `Debug` never shows
/// it, and it is compared in constant time.
pub struct BearerToken(String);

impl BearerToken {
    /// The token clients must send as `Authorization: Bearer <token>`.
    pub fn new(token: String) -> Self {
        Self(token)
    }

    /// Whether `headers` carry the token.
    fn admits(&self, headers: &HeaderMap) -> bool {
        // The scheme is case-insensitive (RFC 9110 §11.1).
        let Some(sent) = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token)
        else {
            return false;
        };
        goondan_core::secret::secrets_match(sent.trim().as_bytes(), self.0.as_bytes())
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(..)")
    }
}

/// Refuses (403) a request whose `Origin` is neither loopback nor, with
/// remote clients allowed, the server's own origin (the authority the
/// request's `Host` names); a request without `Origin` is not from a
/// browser page and passes. With a token, refuses (401) a request that
/// does not carry it.
async fn check_request(request: Request, next: Next, allow_remote: bool, token: Option<Arc<BearerToken>>) -> Response {
    if let Err(why) = origin_allowed(request.headers(), allow_remote) {
        tracing::warn!("refused an MCP HTTP request: {why}");
        return (StatusCode::FORBIDDEN, format!("Forbidden: {why}\n")).into_response();
    }
    if let Some(token) = token
        && !token.admits(request.headers())
    {
        tracing::warn!("refused an MCP HTTP request without the bearer token");
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "Unauthorized: send Authorization: Bearer <token>\n",
        )
            .into_response();
    }
    match name_the_task(request).await {
        Ok(request) => next.run(request).await,
        Err(refused) => refused,
    }
}

/// The requests of the tasks extension that name their task in `Mcp-Name`.
const TASK_METHODS: [&str; 3] = ["tasks/get", "tasks/update", "tasks/cancel"];

/// Gives a `tasks/get|update|cancel` request that comes without `Mcp-Name`
/// the header, from its body's `params.taskId`: the extension asks clients
/// to send it (for routing) and rmcp's HTTP service refuses a request
/// without it, but fastmcp-tasks 4.1.4's client sends none. Only such a
/// request's body is read here; a header that is sent is left for rmcp to
/// check against the body.
async fn name_the_task(request: Request) -> Result<Request, Response> {
    let method = request.headers().get("mcp-method").and_then(|value| value.to_str().ok());
    if !method.is_some_and(|method| TASK_METHODS.contains(&method)) || request.headers().contains_key("mcp-name") {
        return Ok(request);
    }
    let (mut parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_MESSAGE_BYTES).await.map_err(|error| {
        (StatusCode::BAD_REQUEST, format!("Bad Request: the request body cannot be read: {error}\n")).into_response()
    })?;
    let task_id = serde_json::from_slice::<JsonValue>(&bytes)
        .ok()
        .and_then(|message| message.get("params")?.get("taskId")?.as_str().map(str::to_owned));
    if let Some(value) = task_id.and_then(|id| axum::http::HeaderValue::from_str(&id).ok()) {
        parts.headers.insert(axum::http::HeaderName::from_static("mcp-name"), value);
    }
    Ok(Request::from_parts(parts, axum::body::Body::from(bytes)))
}

/// Whether the request's `Origin` may use the server (see [`check_request`]).
fn origin_allowed(headers: &HeaderMap, allow_remote: bool) -> Result<(), String> {
    let Some(origin) = headers.get(header::ORIGIN) else { return Ok(()) };
    let origin = origin.to_str().map_err(|_| "the Origin header is not text".to_owned())?;
    let refused = || format!("Origin '{origin}' is not allowed");
    let uri: Uri = origin.parse().map_err(|_| refused())?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else { return Err(refused()) };
    if !matches!(scheme, "http" | "https") {
        return Err(refused());
    }
    if is_loopback_host(authority.host()) {
        return Ok(());
    }
    if allow_remote {
        let default_port = if scheme == "https" { 443 } else { 80 };
        let own = headers
            .get(header::HOST)
            .and_then(|host| host.to_str().ok())
            .and_then(|host| host.parse::<axum::http::uri::Authority>().ok());
        if let Some(own) = own
            && own.host().eq_ignore_ascii_case(authority.host())
            && own.port_u16().unwrap_or(default_port) == authority.port_u16().unwrap_or(default_port)
        {
            return Ok(());
        }
    }
    Err(refused())
}

/// `localhost` (and its subdomains, which resolve to loopback by RFC
/// 6761), or a loopback IP literal.
fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use goondan_core::ToolError;
    use goondan_tools::ToolSource;
    use serde_json::json;

    fn headers(origin: Option<&str>, host: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_str(host).unwrap_or_else(|e| panic!("{e}")));
        if let Some(origin) = origin {
            headers.insert(header::ORIGIN, HeaderValue::from_str(origin).unwrap_or_else(|e| panic!("{e}")));
        }
        headers
    }

    #[test]
    fn origins_from_loopback_pass_and_others_are_refused() {
        for origin in [None, Some("http://localhost:3000"), Some("http://127.0.0.1"), Some("https://[::1]:8443")] {
            assert_eq!(origin_allowed(&headers(origin, "127.0.0.1:9000"), false), Ok(()), "{origin:?}");
        }
        for origin in ["http://evil.example", "http://evil.example:9000", "null", "file://", "ftp://127.0.0.1"] {
            assert!(origin_allowed(&headers(Some(origin), "127.0.0.1:9000"), false).is_err(), "{origin}");
        }
        // DNS rebinding: the page's origin is the name the server was reached by.
        assert!(origin_allowed(&headers(Some("http://evil.example:9000"), "evil.example:9000"), false).is_err());
    }

    #[test]
    fn a_bearer_token_is_admitted_only_whole() {
        let token = BearerToken::new("tok-123".to_owned());
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap_or_else(|e| panic!("{e}")));
            headers
        };
        assert!(token.admits(&with("Bearer tok-123")));
        assert!(token.admits(&with("bearer tok-123")));
        for wrong in ["Bearer tok-12", "Bearer tok-1234", "Bearer TOK-123", "Basic tok-123", "tok-123", "Bearer "] {
            assert!(!token.admits(&with(wrong)), "{wrong}");
        }
        assert!(!token.admits(&HeaderMap::new()));
        assert_eq!(format!("{token:?}"), "BearerToken(..)");
    }

    #[test]
    fn remote_servers_also_accept_their_own_origin() {
        let own = headers(Some("http://10.0.0.5:9000"), "10.0.0.5:9000");
        assert_eq!(origin_allowed(&own, true), Ok(()));
        assert!(origin_allowed(&own, false).is_err());
        assert!(origin_allowed(&headers(Some("http://10.0.0.5:9001"), "10.0.0.5:9000"), true).is_err());
        assert!(origin_allowed(&headers(Some("http://other.example"), "10.0.0.5:9000"), true).is_err());
        assert_eq!(origin_allowed(&headers(Some("http://host.example"), "HOST.example:80"), true), Ok(()));
    }

    #[tokio::test]
    async fn non_loopback_addresses_need_allow_remote() {
        let error = bind_http("0.0.0.0:0", false).await.err().unwrap_or_else(|| panic!("0.0.0.0 was bound"));
        assert!(matches!(error, ServeError::NotLoopback { .. }), "{error}");
        assert!(error.to_string().contains("--allow-remote"), "{error}");
        assert!(bind_http("127.0.0.1:0", false).await.is_ok());
        assert!(bind_http("0.0.0.0:0", true).await.is_ok());
        let error = bind_http("no-port", false).await.err().unwrap_or_else(|| panic!("bound"));
        assert!(matches!(error, ServeError::Address { .. }), "{error}");
    }

    #[test]
    fn catalog_items_become_tools_with_object_schemas() {
        let item = ToolCatalogItem::new("json-query__query", ToolSource::config("json-query"))
            .with_description("Query JSON")
            .with_parameters(json!({"properties": {"path": {"type": "string"}}}));
        let tool = tool_of(&item);
        assert_eq!(tool.name, "json-query__query");
        assert_eq!(tool.description.as_deref(), Some("Query JSON"));
        assert_eq!(
            JsonValue::Object((*tool.input_schema).clone()),
            json!({"properties": {"path": {"type": "string"}}, "type": "object"})
        );
        let bare = tool_of(&ToolCatalogItem::new("a__b", ToolSource::config("a")));
        assert_eq!(JsonValue::Object((*bare.input_schema).clone()), json!({"type": "object"}));
        assert_eq!(bare.description, None);
    }

    #[test]
    fn results_map_to_text_structured_content_and_errors() {
        let object = call_result_of(&ToolResult::ok(json!({"n": 1})));
        assert_eq!(object.is_error, Some(false));
        assert_eq!(object.structured_content, Some(json!({"n": 1})));
        assert_eq!(
            serde_json::to_value(&object.content).unwrap_or_default(),
            json!([{"type": "text", "text": "{\"n\":1}"}])
        );

        let text = call_result_of(&ToolResult::ok(json!("HELLO")));
        assert_eq!(text.structured_content, None);
        assert_eq!(serde_json::to_value(&text.content).unwrap_or_default(), json!([{"type": "text", "text": "HELLO"}]));

        let failed = call_result_of(&ToolResult::error(ToolError::new("E_TOOL", "ToolError", "boom")));
        assert_eq!(failed.is_error, Some(true));
        let content = serde_json::to_value(&failed.content).unwrap_or_default();
        let inner: JsonValue =
            serde_json::from_str(content[0]["text"].as_str().unwrap_or_default()).unwrap_or_default();
        assert_eq!(inner, json!({"code": "E_TOOL", "name": "ToolError", "message": "boom"}));
    }
}
