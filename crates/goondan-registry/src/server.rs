//! The package registry's HTTP server, speaking the original Goondan
//! registry's protocol (`packages/registry/src/server.ts`):
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /@scope/name` | the packument (`name`, `description`, `access`, `versions`, `dist-tags`) |
//! | `GET /@scope/name/<version>` | one version's metadata |
//! | `GET /@scope/name/-/name-<version>.tgz` | the tarball (`application/gzip`) |
//! | `PUT /@scope/name` | publish (bearer token): 201 `{ok, id, version}`, 409 for a version already there |
//! | `PUT /@scope/name/<version>/deprecate` | `{message}` marks it deprecated (`""` undoes it) |
//! | `DELETE /@scope/name/<version>` | unpublish one version; `DELETE /@scope/name` the whole package |
//!
//! Names are scoped (`@scope/name`), also accepted as one encoded segment
//! (`@scope%2fname`, as npm clients send). Errors are JSON `{error: "PKG_…",
//! message}` with the original's codes; a restricted package needs the
//! token to be read too. Storage is a directory in the original's layout
//! (`packages/%40scope/name/metadata.json`, `…/tarballs/<version>.tgz`),
//! every file written to a temporary file, synced and renamed into place;
//! changes are serialised, so two publishes never lose one another.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use goondan_core::fault::Point;
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::Digest as _;

/// The largest request body taken by default (a publish carries its
/// tarball in base64).
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 << 20;

/// What a registry serves, and who may change it.
#[derive(Clone)]
pub struct RegistryConfig {
    /// The storage directory (made if missing).
    pub storage: PathBuf,
    /// The bearer tokens that may publish, deprecate, unpublish and read
    /// restricted packages; none: a read-only registry.
    pub tokens: Vec<String>,
    /// The base of the tarball URLs written at publish (default: from the
    /// request's `Host`, as the original takes the request's origin).
    pub base_url: Option<String>,
    /// The largest request body taken.
    pub max_body_bytes: usize,
}

impl std::fmt::Debug for RegistryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The tokens are secrets: only how many.
        f.debug_struct("RegistryConfig")
            .field("storage", &self.storage)
            .field("tokens", &self.tokens.len())
            .field("base_url", &self.base_url)
            .field("max_body_bytes", &self.max_body_bytes)
            .finish()
    }
}

impl RegistryConfig {
    /// A registry over `storage` accepting `tokens`, the rest by default.
    pub fn new(storage: impl Into<PathBuf>, tokens: Vec<String>) -> Self {
        Self { storage: storage.into(), tokens, base_url: None, max_body_bytes: DEFAULT_MAX_BODY_BYTES }
    }
}

/// The registry could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("registry storage {}: {source}", path.display())]
    Storage { path: PathBuf, source: std::io::Error },
    #[error(
        "registry storage {} is in use by another registry process (it holds {}): one registry per storage directory",
        path.display(), path.join(STORAGE_LOCK).display()
    )]
    InUse { path: PathBuf },
    #[error("serving the registry: {0}")]
    Serve(std::io::Error),
}

/// The file a registry holds locked while it serves a storage directory.
pub const STORAGE_LOCK: &str = ".registry.lock";

/// Takes the storage directory for this registry alone: its changes are
/// serialised in one process, and the sweep at start must not take a
/// file another registry is writing.
fn lock_storage(storage: &Path) -> Result<std::fs::File, RegistryError> {
    let path = storage.join(STORAGE_LOCK);
    let storage_error = |source| RegistryError::Storage { path: path.clone(), source };
    let file =
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(storage_error)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(RegistryError::InUse { path: storage.to_path_buf() }),
        Err(std::fs::TryLockError::Error(source)) => Err(storage_error(source)),
    }
}

/// The registry as an axum router: its storage directory made, locked
/// for this registry alone ([`RegistryError::InUse`] when another holds
/// it; released when the router is dropped) and swept of what a crash left.
pub fn router(config: RegistryConfig) -> Result<axum::Router, RegistryError> {
    std::fs::create_dir_all(&config.storage)
        .map_err(|source| RegistryError::Storage { path: config.storage.clone(), source })?;
    let lock = lock_storage(&config.storage)?;
    sweep(&config.storage);
    let limit = config.max_body_bytes;
    let tokens = config.tokens.iter().map(|t| t.trim()).filter(|t| !t.is_empty()).map(token_digest).collect();
    let shared = Arc::new(Shared {
        store: Store { root: config.storage },
        tokens,
        base_url: config.base_url,
        writes: tokio::sync::Mutex::new(()),
        _lock: lock,
    });
    Ok(axum::Router::new().fallback(handle).layer(DefaultBodyLimit::max(limit)).with_state(shared))
}

/// Serves the registry on `listener` until `shutdown` completes, then
/// finishes the requests in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: RegistryConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RegistryError> {
    serve_router(listener, router(config)?, shutdown).await
}

/// Serves a [`router`] made beforehand (its storage checked before the
/// caller says where it listens) on `listener` until `shutdown` completes.
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RegistryError> {
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await.map_err(RegistryError::Serve)
}

struct Shared {
    store: Store,
    /// SHA-256 of each token: compared digest to digest, in constant time.
    tokens: Vec<[u8; 32]>,
    base_url: Option<String>,
    /// Held through every change (read, modify, write of a packument).
    writes: tokio::sync::Mutex<()>,
    /// The storage's lock ([`STORAGE_LOCK`]), held while the router lives.
    _lock: std::fs::File,
}

fn token_digest(token: &str) -> [u8; 32] {
    sha2::Sha256::digest(token.as_bytes()).into()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Access {
    Public,
    Restricted,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Dist {
    tarball: String,
    shasum: String,
    integrity: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct VersionMetadata {
    version: String,
    dependencies: IndexMap<String, String>,
    deprecated: String,
    access: Access,
    dist: Dist,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PackageMetadata {
    name: String,
    description: String,
    access: Access,
    versions: IndexMap<String, VersionMetadata>,
    #[serde(rename = "dist-tags")]
    dist_tags: IndexMap<String, String>,
}

/// A scoped package name, checked.
#[derive(Debug, Clone)]
struct PackageName {
    scope: String,
    name: String,
}

impl PackageName {
    fn full(&self) -> String {
        format!("{}/{}", self.scope, self.name)
    }
}

#[derive(Debug)]
enum Route {
    Package,
    Version(String),
    Tarball(String),
    Deprecate(String),
}

/// A route's path: `None` for a path that is no route (404, as the
/// original), `Err` for a scoped name that breaks the naming rules.
fn parse_route(path: &str) -> Option<Result<(PackageName, Route), Response>> {
    let mut segments = Vec::new();
    for part in path.split('/').filter(|part| !part.is_empty()) {
        segments.push(percent_decode(part)?);
    }
    // `@scope%2fname`: the name as one segment.
    if let Some(first) = segments.first()
        && let Some((scope, name)) = first.split_once('/')
    {
        let (scope, name) = (scope.to_owned(), name.to_owned());
        segments.splice(0..1, [scope, name]);
    }
    let (scope, name) = (segments.first()?, segments.get(1)?);
    if !scope.starts_with('@') || scope.len() <= 1 || name.is_empty() || name.contains('/') {
        return None;
    }
    let package = PackageName { scope: scope.clone(), name: name.clone() };
    if let Err(problem) = check_name(&package) {
        return Some(Err(error(StatusCode::BAD_REQUEST, "PKG_INVALID_NAME", problem)));
    }
    let route = match &segments[2..] {
        [] => Route::Package,
        [version] => Route::Version(version.clone()),
        [dash, file] if dash == "-" => {
            let version = file.strip_suffix(".tgz")?.strip_prefix(&format!("{name}-"))?;
            if version.is_empty() {
                return None;
            }
            Route::Tarball(version.to_owned())
        }
        [version, action] if action == "deprecate" => Route::Deprecate(version.clone()),
        _ => return None,
    };
    Some(Ok((package, route)))
}

/// npm's rules for new names: lower case, URL-safe characters, at most
/// 214 characters, no leading `.` or `_` (which also keeps every name a
/// plain file name in the storage).
fn check_name(package: &PackageName) -> Result<(), String> {
    let full = package.full();
    if full.len() > 214 {
        return Err(format!("package name {full:?} is longer than 214 characters"));
    }
    let scope = package.scope.trim_start_matches('@');
    for part in [scope, package.name.as_str()] {
        let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.' | '_' | '~');
        if part.is_empty() || part.starts_with(['.', '_']) || !part.chars().all(allowed) {
            return Err(format!(
                "package name {full:?} is not valid: lower-case letters, digits and - . _ ~, not starting with . or _"
            ));
        }
    }
    Ok(())
}

/// `decodeURIComponent` of one segment; `None` when it is not valid.
fn percent_decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = segment.get(index + 1..index + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `encodeURIComponent`, as the original names storage paths and URLs.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"))], bytes)
        .into_response()
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    json_response(status, &json!({"error": code, "message": message.into()}))
}

/// A request refused before any work: the original's `{error, message}`.
struct Refusal {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        error(self.status, self.code, self.message)
    }
}

fn refusal(status: StatusCode, code: &'static str, message: impl Into<String>) -> Refusal {
    Refusal { status, code, message: message.into() }
}

fn unauthorized() -> Response {
    error(StatusCode::UNAUTHORIZED, "PKG_AUTH_REQUIRED", "Bearer token is required")
}

fn method_not_allowed() -> Response {
    error(StatusCode::METHOD_NOT_ALLOWED, "PKG_METHOD_NOT_ALLOWED", "Method not allowed")
}

fn package_not_found() -> Response {
    error(StatusCode::NOT_FOUND, "PKG_NOT_FOUND", "Package not found")
}

fn version_not_found() -> Response {
    error(StatusCode::NOT_FOUND, "PKG_VERSION_NOT_FOUND", "Version not found")
}

fn storage_failed(problem: &StoreError) -> Response {
    tracing::error!("registry storage: {problem}");
    if problem.is_full() {
        // 507, so a client can tell "try again when there is room" from a
        // broken registry; nothing of the request was kept.
        return error(
            StatusCode::INSUFFICIENT_STORAGE,
            "PKG_STORAGE_FULL",
            "The registry's storage is full: nothing was stored",
        );
    }
    error(StatusCode::INTERNAL_SERVER_ERROR, "PKG_STORAGE_ERROR", "The registry's storage failed")
}

fn authorized(shared: &Shared, headers: &HeaderMap) -> bool {
    let Some(token) = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|token| !token.is_empty())
    else {
        return false;
    };
    let digest = token_digest(token);
    shared
        .tokens
        .iter()
        .fold(false, |found, known| found | (known.iter().zip(&digest).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0))
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let (package, route) = match parse_route(uri.path()) {
        None => return error(StatusCode::NOT_FOUND, "PKG_NOT_FOUND", "Package route not found"),
        Some(Err(response)) => return response,
        Some(Ok(parsed)) => parsed,
    };
    let is_authorized = authorized(&shared, &headers);
    let needs_token = matches!(
        (&route, &method),
        (Route::Package, &Method::PUT | &Method::DELETE)
            | (Route::Version(_), &Method::DELETE)
            | (Route::Deprecate(_), &Method::PUT)
    );
    if needs_token && !is_authorized {
        return unauthorized();
    }
    let body = || match &body {
        Ok(bytes) => parse_json(&headers, bytes),
        Err(rejection) => {
            let code = match rejection.status() {
                StatusCode::PAYLOAD_TOO_LARGE => "PKG_PAYLOAD_TOO_LARGE",
                _ => "PKG_INVALID_REQUEST_BODY",
            };
            Err(refusal(rejection.status(), code, rejection.body_text()))
        }
    };
    match (route, method) {
        (Route::Package, Method::GET) => get_package(&shared, &package, is_authorized).await,
        (Route::Package, Method::PUT) => match body() {
            Ok(payload) => publish(&shared, &package, &payload, &headers).await,
            Err(refused) => refused.into_response(),
        },
        (Route::Package, Method::DELETE) => delete_package(&shared, &package).await,
        (Route::Version(version), Method::GET) => get_version(&shared, &package, &version, is_authorized).await,
        (Route::Version(version), Method::DELETE) => unpublish(&shared, &package, &version).await,
        (Route::Tarball(version), Method::GET) => get_tarball(&shared, &package, &version, is_authorized).await,
        (Route::Deprecate(version), Method::PUT) => match body() {
            Ok(payload) => deprecate(&shared, &package, &version, &payload).await,
            Err(refused) => refused.into_response(),
        },
        _ => method_not_allowed(),
    }
}

/// The request's JSON, with the original's answers for a wrong type, no
/// body and bad JSON.
fn parse_json(headers: &HeaderMap, body: &[u8]) -> Result<Value, Refusal> {
    if let Some(kind) = headers.get(header::CONTENT_TYPE)
        && !kind.to_str().is_ok_and(|kind| kind.contains("application/json"))
    {
        return Err(refusal(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "PKG_UNSUPPORTED_MEDIA_TYPE",
            "Content-Type must be application/json",
        ));
    }
    if body.is_empty() {
        return Err(refusal(StatusCode::BAD_REQUEST, "PKG_EMPTY_REQUEST_BODY", "Request body must not be empty"));
    }
    serde_json::from_slice(body)
        .map_err(|_| refusal(StatusCode::BAD_REQUEST, "PKG_INVALID_JSON", "Request body must be valid JSON"))
}

/// Runs a storage step off the async threads.
async fn blocking<T: Send + 'static>(
    step: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(step).await.unwrap_or_else(|joined| Err(StoreError::Task(joined.to_string())))
}

async fn read_metadata(shared: &Arc<Shared>, package: &PackageName) -> Result<Option<PackageMetadata>, StoreError> {
    let (store, package) = (shared.store.clone(), package.clone());
    blocking(move || store.metadata(&package)).await
}

async fn get_package(shared: &Arc<Shared>, package: &PackageName, is_authorized: bool) -> Response {
    match read_metadata(shared, package).await {
        Err(problem) => storage_failed(&problem),
        Ok(None) => package_not_found(),
        Ok(Some(metadata)) if metadata.access == Access::Restricted && !is_authorized => unauthorized(),
        Ok(Some(metadata)) => json_response(StatusCode::OK, &serde_json::to_value(&metadata).unwrap_or_default()),
    }
}

/// The version's metadata, if it exists and may be read.
async fn readable_version(
    shared: &Arc<Shared>,
    package: &PackageName,
    version: &str,
    is_authorized: bool,
) -> Result<VersionMetadata, Response> {
    let metadata = match read_metadata(shared, package).await {
        Err(problem) => return Err(storage_failed(&problem)),
        Ok(None) => return Err(package_not_found()),
        Ok(Some(metadata)) => metadata,
    };
    let Some(found) = metadata.versions.get(version) else { return Err(version_not_found()) };
    if (metadata.access == Access::Restricted || found.access == Access::Restricted) && !is_authorized {
        return Err(unauthorized());
    }
    Ok(found.clone())
}

async fn get_version(shared: &Arc<Shared>, package: &PackageName, version: &str, is_authorized: bool) -> Response {
    match readable_version(shared, package, version, is_authorized).await {
        Ok(found) => json_response(StatusCode::OK, &serde_json::to_value(&found).unwrap_or_default()),
        Err(response) => response,
    }
}

async fn get_tarball(shared: &Arc<Shared>, package: &PackageName, version: &str, is_authorized: bool) -> Response {
    if let Err(response) = readable_version(shared, package, version, is_authorized).await {
        return response;
    }
    let (store, package, version) = (shared.store.clone(), package.clone(), version.to_owned());
    match blocking(move || store.tarball(&package, &version)).await {
        Err(problem) => storage_failed(&problem),
        Ok(None) => error(StatusCode::NOT_FOUND, "PKG_TARBALL_NOT_FOUND", "Tarball not found"),
        Ok(Some(bytes)) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, HeaderValue::from_static("application/gzip")),
                (header::CACHE_CONTROL, HeaderValue::from_static("private, max-age=0, must-revalidate")),
            ],
            bytes,
        )
            .into_response(),
    }
}

/// A publish request, checked as the original's `parsePublishPayload`.
struct Publish {
    name: Option<String>,
    version: Option<String>,
    description: Option<String>,
    access: Option<Access>,
    dependencies: Option<IndexMap<String, String>>,
    deprecated: Option<String>,
    dist_tags: Option<IndexMap<String, String>>,
    /// The attachments' base64 data, in order.
    attachments: Vec<String>,
}

fn string_field(object: &Map<String, Value>, key: &str) -> Result<Option<String>, ()> {
    match object.get(key) {
        None => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(()),
    }
}

fn string_map_field(object: &Map<String, Value>, key: &str) -> Result<Option<IndexMap<String, String>>, ()> {
    match object.get(key) {
        None => Ok(None),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())).ok_or(()))
            .collect::<Result<_, _>>()
            .map(Some),
        Some(_) => Err(()),
    }
}

fn parse_publish(value: &Value) -> Result<Publish, ()> {
    let object = value.as_object().ok_or(())?;
    let access = match object.get("access") {
        None => None,
        Some(access) => Some(serde_json::from_value::<Access>(access.clone()).map_err(|_| ())?),
    };
    let mut attachments = Vec::new();
    match object.get("_attachments") {
        None => {}
        Some(Value::Object(map)) => {
            for attachment in map.values() {
                let attachment = attachment.as_object().ok_or(())?;
                attachments.push(string_field(attachment, "data")?.ok_or(())?);
                string_field(attachment, "contentType")?;
                if attachment.get("length").is_some_and(|length| !length.is_number()) {
                    return Err(());
                }
            }
        }
        Some(_) => return Err(()),
    }
    let mut publish = Publish {
        name: string_field(object, "name")?,
        version: string_field(object, "version")?,
        description: string_field(object, "description")?,
        access,
        dependencies: string_map_field(object, "dependencies")?,
        deprecated: string_field(object, "deprecated")?,
        dist_tags: string_map_field(object, "dist-tags")?,
        attachments,
    };
    // npm's own shape: no top-level `version`, one entry in `versions`.
    if publish.version.is_none()
        && let Some(Value::Object(versions)) = object.get("versions")
        && versions.len() == 1
        && let Some((version, manifest)) = versions.iter().next()
    {
        publish.version = Some(version.clone());
        if let Some(manifest) = manifest.as_object() {
            if publish.dependencies.is_none() {
                publish.dependencies = string_map_field(manifest, "dependencies")?;
            }
            if publish.description.is_none() {
                publish.description = string_field(manifest, "description")?;
            }
        }
    }
    Ok(publish)
}

async fn publish(shared: &Arc<Shared>, package: &PackageName, payload: &Value, headers: &HeaderMap) -> Response {
    let Ok(payload) = parse_publish(payload) else {
        return error(StatusCode::BAD_REQUEST, "PKG_INVALID_PUBLISH_PAYLOAD", "Invalid publish payload");
    };
    let Some(version) = payload.version.clone().filter(|v| semver::Version::parse(v).is_ok()) else {
        return error(StatusCode::BAD_REQUEST, "PKG_INVALID_VERSION", "Version must be valid semver");
    };
    let full = package.full();
    if payload.name.as_ref().is_some_and(|name| *name != full) {
        return error(StatusCode::BAD_REQUEST, "PKG_NAME_MISMATCH", format!("Payload name must match route ({full})"));
    }
    let tarball = payload
        .attachments
        .first()
        .and_then(|data| base64::engine::general_purpose::STANDARD.decode(data.trim()).ok())
        .filter(|bytes| !bytes.is_empty());
    let Some(tarball) = tarball else {
        return error(
            StatusCode::BAD_REQUEST,
            "PKG_INVALID_ATTACHMENT",
            "Publish payload must include one base64 tarball in _attachments",
        );
    };
    let base_url = shared.base_url.clone().unwrap_or_else(|| {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
        format!("http://{host}")
    });
    let _writing = shared.writes.lock().await;
    let existing = match read_metadata(shared, package).await {
        Ok(existing) => existing,
        Err(problem) => return storage_failed(&problem),
    };
    if existing.as_ref().is_some_and(|m| m.versions.contains_key(&version)) {
        return error(
            StatusCode::CONFLICT,
            "PKG_VERSION_EXISTS",
            format!("Version {version} already exists for {full}"),
        );
    }
    let metadata = updated_metadata(existing, package, &payload, &version, &tarball, &base_url);
    let (store, name, published) = (shared.store.clone(), package.clone(), version.clone());
    let saved = blocking(move || {
        // The tarball first: a packument never names a version whose
        // tarball is not stored. A packument that could not be stored takes
        // the new tarball back with it (a crash in between leaves it for
        // the sweep at start).
        store.save_tarball(&name, &published, &tarball)?;
        store.save_metadata(&name, &metadata).inspect_err(|_| {
            let _ = store.remove_tarball(&name, &published);
        })
    })
    .await;
    match saved {
        Ok(()) => json_response(StatusCode::CREATED, &json!({"ok": true, "id": full, "version": version})),
        Err(problem) => storage_failed(&problem),
    }
}

/// The packument after a publish, as the original's `buildUpdatedMetadata`.
fn updated_metadata(
    existing: Option<PackageMetadata>,
    package: &PackageName,
    payload: &Publish,
    version: &str,
    tarball: &[u8],
    base_url: &str,
) -> PackageMetadata {
    let access = payload.access.or(existing.as_ref().map(|m| m.access)).unwrap_or(Access::Public);
    let description =
        payload.description.clone().or_else(|| existing.as_ref().map(|m| m.description.clone())).unwrap_or_default();
    let (mut versions, mut dist_tags) = existing.map(|m| (m.versions, m.dist_tags)).unwrap_or_default();
    let tarball_url = format!(
        "{}/{}/{}/-/{}-{}.tgz",
        base_url.trim_end_matches('/'),
        percent_encode(&package.scope),
        percent_encode(&package.name),
        percent_encode(&package.name),
        percent_encode(version)
    );
    let shasum: String = sha1::Sha1::digest(tarball).iter().map(|byte| format!("{byte:02x}")).collect();
    versions.insert(
        version.to_owned(),
        VersionMetadata {
            version: version.to_owned(),
            dependencies: payload.dependencies.clone().unwrap_or_default(),
            deprecated: payload.deprecated.clone().unwrap_or_default(),
            access,
            dist: Dist { tarball: tarball_url, shasum, integrity: crate::tarball::integrity(tarball) },
        },
    );
    match payload.dist_tags.as_ref().filter(|tags| !tags.is_empty()) {
        None => {
            let newer = dist_tags.get("latest").is_none_or(|latest| newer_than(version, latest));
            if newer {
                dist_tags.insert("latest".to_owned(), version.to_owned());
            }
        }
        Some(tags) => {
            dist_tags.extend(tags.iter().map(|(k, v)| (k.clone(), v.clone())));
            dist_tags.entry("latest".to_owned()).or_insert_with(|| version.to_owned());
        }
    }
    PackageMetadata { name: package.full(), description, access, versions, dist_tags }
}

fn newer_than(version: &str, other: &str) -> bool {
    compare_versions(version, other).is_gt()
}

async fn unpublish(shared: &Arc<Shared>, package: &PackageName, version: &str) -> Response {
    let _writing = shared.writes.lock().await;
    let mut metadata = match read_metadata(shared, package).await {
        Err(problem) => return storage_failed(&problem),
        Ok(None) => return package_not_found(),
        Ok(Some(metadata)) => metadata,
    };
    if metadata.versions.shift_remove(version).is_none() {
        return version_not_found();
    }
    metadata.dist_tags.retain(|_, tagged| tagged != version);
    if metadata.dist_tags.get("latest").is_none()
        && let Some(highest) = metadata.versions.keys().max_by(|a, b| compare_versions(a, b))
    {
        metadata.dist_tags.insert("latest".to_owned(), highest.clone());
    }
    let (store, name, removed) = (shared.store.clone(), package.clone(), version.to_owned());
    let saved = blocking(move || {
        if metadata.versions.is_empty() {
            return store.remove_package(&name);
        }
        // The packument first: a crash between the two leaves a stray file, never a dangling version.
        store.save_metadata(&name, &metadata)?;
        store.remove_tarball(&name, &removed)
    })
    .await;
    match saved {
        Ok(()) => json_response(StatusCode::OK, &json!({"ok": true, "removed": version})),
        Err(problem) => storage_failed(&problem),
    }
}

/// SemVer precedence, as the original's `compareSemver`: build metadata
/// does not count (`Ord` of `semver::Version` would order `+a` before `+b`).
fn compare_versions(a: &str, b: &str) -> std::cmp::Ordering {
    match (semver::Version::parse(a), semver::Version::parse(b)) {
        (Ok(a), Ok(b)) => a.cmp_precedence(&b),
        _ => a.cmp(b),
    }
}

async fn delete_package(shared: &Arc<Shared>, package: &PackageName) -> Response {
    let _writing = shared.writes.lock().await;
    match read_metadata(shared, package).await {
        Err(problem) => return storage_failed(&problem),
        Ok(None) => return package_not_found(),
        Ok(Some(_)) => {}
    }
    let (store, name) = (shared.store.clone(), package.clone());
    match blocking(move || store.remove_package(&name)).await {
        Ok(()) => json_response(StatusCode::OK, &json!({"ok": true, "id": package.full()})),
        Err(problem) => storage_failed(&problem),
    }
}

async fn deprecate(shared: &Arc<Shared>, package: &PackageName, version: &str, payload: &Value) -> Response {
    let Some(message) = payload.as_object().and_then(|o| o.get("message")).and_then(Value::as_str) else {
        return error(
            StatusCode::BAD_REQUEST,
            "PKG_INVALID_DEPRECATE_PAYLOAD",
            "Deprecation payload must include message",
        );
    };
    let _writing = shared.writes.lock().await;
    let mut metadata = match read_metadata(shared, package).await {
        Err(problem) => return storage_failed(&problem),
        Ok(None) => return package_not_found(),
        Ok(Some(metadata)) => metadata,
    };
    let Some(found) = metadata.versions.get_mut(version) else { return version_not_found() };
    message.clone_into(&mut found.deprecated);
    let (store, name) = (shared.store.clone(), package.clone());
    match blocking(move || store.save_metadata(&name, &metadata)).await {
        Ok(()) => json_response(
            StatusCode::OK,
            &json!({"ok": true, "id": package.full(), "version": version, "deprecated": message}),
        ),
        Err(problem) => storage_failed(&problem),
    }
}

#[derive(Debug, thiserror::Error)]
enum StoreError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: not a packument: {source}", path.display())]
    Corrupt { path: PathBuf, source: serde_json::Error },
    #[error("a storage task failed: {0}")]
    Task(String),
}

impl StoreError {
    /// The storage has no room (or the quota is spent).
    fn is_full(&self) -> bool {
        matches!(self, Self::Io { source, .. } if crate::is_disk_full(source))
    }
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io { path: path.to_path_buf(), source }
}

/// The storage directory, in the original's layout.
#[derive(Debug, Clone)]
struct Store {
    root: PathBuf,
}

impl Store {
    fn package_dir(&self, package: &PackageName) -> PathBuf {
        self.root.join("packages").join(percent_encode(&package.scope)).join(percent_encode(&package.name))
    }

    fn tarball_path(&self, package: &PackageName, version: &str) -> PathBuf {
        self.package_dir(package).join("tarballs").join(format!("{}.tgz", percent_encode(version)))
    }

    fn metadata(&self, package: &PackageName) -> Result<Option<PackageMetadata>, StoreError> {
        let path = self.package_dir(package).join("metadata.json");
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(StoreError::Io { path, source }),
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|source| StoreError::Corrupt { path, source })
    }

    fn save_metadata(&self, package: &PackageName, metadata: &PackageMetadata) -> Result<(), StoreError> {
        let path = self.package_dir(package).join("metadata.json");
        let bytes =
            serde_json::to_vec_pretty(metadata).map_err(|source| StoreError::Corrupt { path: path.clone(), source })?;
        write_atomically(&path, &bytes, Point::RegistryMetadata)
    }

    fn save_tarball(&self, package: &PackageName, version: &str, bytes: &[u8]) -> Result<(), StoreError> {
        write_atomically(&self.tarball_path(package, version), bytes, Point::RegistryTarball)
    }

    fn tarball(&self, package: &PackageName, version: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.tarball_path(package, version);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StoreError::Io { path, source }),
        }
    }

    fn remove_tarball(&self, package: &PackageName, version: &str) -> Result<(), StoreError> {
        let path = self.tarball_path(package, version);
        match std::fs::remove_file(&path) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(StoreError::Io { path, source: error }),
            _ => Ok(()),
        }
    }

    /// Renamed away first (the package is gone at once), then removed.
    fn remove_package(&self, package: &PackageName) -> Result<(), StoreError> {
        let dir = self.package_dir(package);
        let Some(parent) = dir.parent() else { return Ok(()) };
        let doomed = tempfile::Builder::new().prefix(".removing-").tempdir_in(parent).map_err(io_at(parent))?;
        let target = doomed.path().join("package");
        match std::fs::rename(&dir, &target) {
            Ok(()) => {
                crate::tarball::sync_dir(parent);
                // Dropping `doomed` removes the old tree.
                drop(doomed);
                Ok(())
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(StoreError::Io { path: dir, source }),
        }
    }
}

/// Writes `bytes` to a temporary file beside `path`, syncs it, renames it
/// over `path` and syncs the directory: readers see the old file or the
/// new one, never a part.
fn write_atomically(path: &Path, bytes: &[u8], point: Point) -> Result<(), StoreError> {
    use std::io::Write as _;
    let parent = path.parent().unwrap_or(Path::new("."));
    goondan_core::fault::before_write(point).map_err(io_at(path))?;
    std::fs::create_dir_all(parent).map_err(io_at(parent))?;
    // A failed write removes its temporary file (dropped); one a crash
    // left is swept at the next start (`sweep`).
    let mut file = tempfile::Builder::new().prefix(WRITING_PREFIX).tempfile_in(parent).map_err(io_at(parent))?;
    file.write_all(bytes).map_err(io_at(path))?;
    file.as_file().sync_all().map_err(io_at(path))?;
    file.persist(path).map_err(|persist| StoreError::Io { path: path.to_path_buf(), source: persist.error })?;
    crate::tarball::sync_dir(parent);
    goondan_core::fault::after_write(point);
    Ok(())
}

/// The name every temporary file of the storage starts with.
const WRITING_PREFIX: &str = ".writing-";

/// What a registry killed mid-change leaves, removed before it serves:
/// temporary files, packages half removed (`.removing-*`), and tarballs
/// no packument names (a publish killed between its two writes). A
/// packument that cannot be read is left alone (and reported).
fn sweep(root: &Path) {
    let packages = root.join("packages");
    let Ok(scopes) = std::fs::read_dir(&packages) else { return };
    for scope in scopes.flatten() {
        let scope_dir = scope.path();
        let Ok(names) = std::fs::read_dir(&scope_dir) else { continue };
        for name in names.flatten() {
            let dir = name.path();
            let file_name = name.file_name();
            let file_name = file_name.to_string_lossy();
            if file_name.starts_with(".removing-") {
                remove_leftover(&dir);
                continue;
            }
            if file_name.starts_with('.') || !dir.is_dir() {
                continue;
            }
            sweep_package(&dir);
        }
    }
}

fn sweep_package(dir: &Path) {
    remove_temporaries(dir);
    let tarballs = dir.join("tarballs");
    remove_temporaries(&tarballs);
    let listed: Option<std::collections::BTreeSet<String>> = match std::fs::read(dir.join("metadata.json")) {
        Ok(bytes) => match serde_json::from_slice::<PackageMetadata>(&bytes) {
            Ok(metadata) => Some(metadata.versions.keys().map(|v| format!("{}.tgz", percent_encode(v))).collect()),
            Err(problem) => {
                tracing::error!(
                    "registry storage: {}: not a packument: {problem}",
                    dir.join("metadata.json").display()
                );
                return;
            }
        },
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(problem) => {
            tracing::error!("registry storage: {}: {problem}", dir.display());
            return;
        }
    };
    let Ok(files) = std::fs::read_dir(&tarballs) else { return };
    for file in files.flatten() {
        let name = file.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tgz") && !listed.as_ref().is_some_and(|listed| listed.contains(&name)) {
            tracing::warn!("registry storage: removing {}, which no packument names", file.path().display());
            remove_leftover(&file.path());
        }
    }
    if listed.is_none() {
        // Only what a first publish killed early left: nothing is served from it.
        let _ = std::fs::remove_dir(&tarballs);
        let _ = std::fs::remove_dir(dir);
    }
}

fn remove_temporaries(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(WRITING_PREFIX) {
            remove_leftover(&entry.path());
        }
    }
}

fn remove_leftover(path: &Path) {
    let removed = if path.is_dir() { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) };
    if let Err(problem) = removed {
        tracing::warn!("registry storage: cannot remove the leftover {}: {problem}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(path: &str) -> Option<(String, String)> {
        match parse_route(path)? {
            Ok((package, route)) => Some((package.full(), format!("{route:?}"))),
            Err(_) => Some(("invalid".to_owned(), String::new())),
        }
    }

    #[test]
    fn routes_as_the_original_and_encoded_names() {
        let package = |route: &str| Some(("@goondan/base".to_owned(), route.to_owned()));
        assert_eq!(route("/@goondan/base"), package("Package"));
        assert_eq!(route("/%40goondan/base"), package("Package"));
        assert_eq!(route("/@goondan%2fbase"), package("Package"));
        assert_eq!(route("/@goondan%2Fbase/1.0.0"), package("Version(\"1.0.0\")"));
        assert_eq!(route("/@goondan/base/-/base-1.0.0%2Bbuild.tgz"), package("Tarball(\"1.0.0+build\")"));
        assert_eq!(route("/@goondan/base/1.0.0/deprecate"), package("Deprecate(\"1.0.0\")"));
        assert_eq!(route("/unknown"), None);
        assert_eq!(route("/goondan/base"), None);
        assert_eq!(route("/@goondan/base/-/other-1.0.0.tgz"), None);
        assert_eq!(route("/@goondan/base/a/b/c"), None);
        assert_eq!(route("/@goondan/%zz"), None);
        assert_eq!(route("/@goondan/.."), Some(("invalid".to_owned(), String::new())));
        assert_eq!(route("/@goondan/Base"), Some(("invalid".to_owned(), String::new())));
    }

    #[test]
    fn encodes_as_encode_uri_component() {
        assert_eq!(percent_encode("@goondan"), "%40goondan");
        assert_eq!(percent_encode("1.0.0+build.1"), "1.0.0%2Bbuild.1");
        assert_eq!(percent_decode("%40goondan").as_deref(), Some("@goondan"));
        assert_eq!(percent_decode("%4"), None);
    }

    #[test]
    fn publish_payload_is_checked_as_the_original() {
        assert!(parse_publish(&json!({"name": 1})).is_err());
        assert!(parse_publish(&json!({"access": "secret"})).is_err());
        assert!(parse_publish(&json!({"dependencies": {"a": 1}})).is_err());
        assert!(parse_publish(&json!({"_attachments": {"x": {"length": 3}}})).is_err());
        assert!(parse_publish(&json!([1])).is_err());
        let npm = parse_publish(&json!({"versions": {"1.2.3": {"dependencies": {"@a/b": "^1"}}}}));
        let Ok(npm) = npm else { panic!("npm's shape refused") };
        assert_eq!(npm.version.as_deref(), Some("1.2.3"));
        assert_eq!(npm.dependencies.and_then(|d| d.get("@a/b").cloned()).as_deref(), Some("^1"));
    }
}
