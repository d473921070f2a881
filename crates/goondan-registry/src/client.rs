//! The package client of `gdn package` (the original's
//! `packages/cli/src/services/package.ts`): which registry and token a
//! package goes to, the registry's HTTP answers read strictly, and the
//! errors every step reports (each with a stable `code`).
//!
//! - [`manifest`]: the bundle's `Package` document (`spec.dependencies`),
//!   read and edited line by line as the original does, so the rest of
//!   `goondan.yaml` keeps its text;
//! - [`lockfile`]: `goondan.lock.yaml`, written sorted and byte-stable,
//!   read back with the line of any error;
//! - [`install`]: resolution (the highest version a range allows,
//!   transitively, one version per package), bounded parallel downloads,
//!   integrity checked before anything is unpacked, installs under
//!   `<state root>/packages/`;
//! - [`publish`]: pack a bundle and send the original's publish payload.
//!
//! Nothing here reads the process environment: the caller hands a lookup.

pub mod install;
pub mod lockfile;
pub mod manifest;
pub mod publish;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::tarball::TarballError;
use crate::version::ResolveError;

/// The original CLI's default registry.
pub const DEFAULT_REGISTRY_URL: &str = "https://goondan-registry.yechanny.workers.dev";
/// The variable naming the registry (below `--registry`).
pub const REGISTRY_ENV: &str = "GOONDAN_REGISTRY";
/// The variable holding the registry token.
pub const TOKEN_ENV: &str = "GOONDAN_REGISTRY_TOKEN";

/// An environment lookup (the caller's, so secrets held back from the
/// process environment are still seen).
pub type Env<'a> = &'a (dyn Fn(&str) -> Option<String> + Send + Sync);

/// One of the two requirements that could not both hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// `goondan.yaml`, or the `name@version` that depends on the package.
    pub requester: String,
    /// The range asked for.
    pub range: String,
}

impl std::fmt::Display for Requirement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} wants {:?}", self.requester, self.range)
    }
}

/// Why a package command failed; nothing was changed in the bundle.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error("invalid package name {name:?}: expected @scope/name (lower case, digits, '-', '.', '_')")]
    InvalidName { name: String },
    #[error("invalid version {version:?} for {name}: {reason}")]
    InvalidVersion { name: String, version: String, reason: String },
    #[error("package {name} is not in the registry {registry}")]
    NotFound { name: String, registry: String },
    #[error("{name}: {source}")]
    NoVersion { name: String, source: ResolveError },
    #[error("cannot reach the registry at {url}: {detail} (check --registry or {REGISTRY_ENV})")]
    Unreachable { url: String, detail: String },
    #[error("the registry at {url} answered something that is not a registry's answer: {detail}")]
    BadAnswer { url: String, detail: String },
    #[error(
        "the registry refused {url} ({status}): set {TOKEN_ENV}, or registries[\"{registry}\"].token in {config}, to a token it accepts"
    )]
    Unauthorized { url: String, status: u16, registry: String, config: String },
    #[error("the registry answered {status} to {url}: {message}")]
    Refused { url: String, status: u16, message: String },
    #[error("{name}@{version}: {source}")]
    Tarball { name: String, version: String, source: TarballError },
    #[error("{name}@{version}: the tarball has no goondan.yaml (nor dist/goondan.yaml)")]
    NoManifestInTarball { name: String, version: String },
    #[error("dependency cycle: {}", .path.join(" -> "))]
    Cycle { path: Vec<String> },
    #[error("version conflict on {name}: {first} (picked {picked}), but {second}")]
    Conflict { name: String, first: Box<Requirement>, picked: String, second: Box<Requirement> },
    #[error("{}:{line}: {message}", path.display())]
    Lockfile { path: PathBuf, line: usize, message: String },
    #[error("--frozen-lockfile: {} does not match goondan.yaml: {detail}", path.display())]
    FrozenMismatch { path: PathBuf, detail: String },
    #[error("{}: {message}", path.display())]
    Manifest { path: PathBuf, message: String },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "{}: {source}: the disk is full; goondan.yaml and goondan.lock.yaml were left as they were (free some space and run the command again)",
        path.display()
    )]
    DiskFull { path: PathBuf, source: std::io::Error },
    #[error("HTTP client setup failed: {0}")]
    Client(String),
}

impl PackageError {
    /// The error's stable code (the `--json` output's `code`).
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidName { .. } => "PKG_INVALID_NAME",
            Self::InvalidVersion { .. } => "PKG_INVALID_VERSION",
            Self::NotFound { .. } => "PKG_NOT_FOUND",
            Self::NoVersion { .. } => "PKG_VERSION_NOT_FOUND",
            Self::Unreachable { .. } => "PKG_REGISTRY_UNREACHABLE",
            Self::BadAnswer { .. } => "PKG_REGISTRY_BAD_ANSWER",
            Self::Unauthorized { .. } => "PKG_UNAUTHORIZED",
            Self::Refused { .. } => "PKG_REGISTRY_REFUSED",
            Self::Tarball { source: TarballError::IntegrityMismatch { .. }, .. } => "PKG_INTEGRITY_MISMATCH",
            Self::Tarball { .. } => "PKG_TARBALL_INVALID",
            Self::NoManifestInTarball { .. } => "PKG_NO_MANIFEST",
            Self::Cycle { .. } => "PKG_DEPENDENCY_CYCLE",
            Self::Conflict { .. } => "PKG_VERSION_CONFLICT",
            Self::Lockfile { .. } => "PKG_LOCKFILE_INVALID",
            Self::FrozenMismatch { .. } => "PKG_LOCKFILE_MISMATCH",
            Self::Manifest { .. } => "PKG_MANIFEST_INVALID",
            Self::Io { .. } => "PKG_IO",
            Self::DiskFull { .. } => "PKG_DISK_FULL",
            Self::Client(_) => "PKG_CLIENT",
        }
    }

    /// Whether the user's input was at fault (a usage error) rather than
    /// the registry or the machine.
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::InvalidName { .. } | Self::InvalidVersion { .. })
    }
}

pub(crate) fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> PackageError + '_ {
    move |source| PackageError::Io { path: path.to_path_buf(), source }
}

/// Checks a package name as npm (and the registry) takes it:
/// `@scope/name`, or a bare `name`.
pub fn check_name(name: &str) -> Result<(), PackageError> {
    let part_ok = |part: &str| {
        !part.is_empty()
            && part.len() <= 214
            && !part.starts_with(['.', '_'])
            && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.' | b'_'))
    };
    let ok = match name.strip_prefix('@') {
        Some(rest) => rest.split_once('/').is_some_and(|(scope, bare)| part_ok(scope) && part_ok(bare)),
        None => part_ok(name),
    };
    if ok { Ok(()) } else { Err(PackageError::InvalidName { name: name.to_owned() }) }
}

/// `name[@version]` (`@scope/name@^1.0.0`) split in two, the name checked.
pub fn parse_ref(reference: &str) -> Result<(String, Option<String>), PackageError> {
    let (name, version) = match reference.rfind('@') {
        Some(at) if at > 0 => (&reference[..at], Some(reference[at + 1..].to_owned())),
        _ => (reference, None),
    };
    check_name(name)?;
    if let Some(version) = &version
        && (version.trim().is_empty()
            || (!crate::version::is_range(version) && !version.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')))
    {
        return Err(PackageError::InvalidVersion {
            name: name.to_owned(),
            version: version.clone(),
            reason: "neither a version range nor a dist-tag".to_owned(),
        });
    }
    Ok((name.to_owned(), version))
}

/// `~/.goondan/config.json` as the original reads it: anything unreadable
/// counts as empty.
#[derive(Debug, Clone, Default)]
pub struct CliConfig {
    pub registry: Option<String>,
    pub tokens: BTreeMap<String, String>,
    pub scoped_registries: BTreeMap<String, String>,
    /// Where it was read from (named in the 401 error).
    pub path: PathBuf,
}

impl CliConfig {
    /// Reads `<state root>/config.json`.
    pub fn read(state_root: &Path) -> Self {
        let path = state_root.join("config.json");
        let mut config = Self { path: path.clone(), ..Self::default() };
        let Some(Value::Object(raw)) = std::fs::read_to_string(&path).ok().and_then(|t| serde_json::from_str(&t).ok())
        else {
            return config;
        };
        config.registry = raw.get("registry").and_then(Value::as_str).map(str::to_owned);
        if let Some(Value::Object(entries)) = raw.get("registries") {
            for (url, entry) in entries {
                if let Some(token) = entry.get("token").and_then(Value::as_str) {
                    config.tokens.insert(url.clone(), token.to_owned());
                }
            }
        }
        if let Some(Value::Object(scoped)) = raw.get("scopedRegistries") {
            for (scope, url) in scoped {
                if let Some(url) = url.as_str() {
                    config.scoped_registries.insert(scope.clone(), url.to_owned());
                }
            }
        }
        config
    }
}

/// Where packages come from and with which token: the original's
/// precedence, `--registry` > `GOONDAN_REGISTRY` > the scope's registry >
/// config.json's `registry` > the default.
pub struct Settings<'a> {
    pub registry_flag: Option<String>,
    pub env: Env<'a>,
    pub config: CliConfig,
    pub state_root: PathBuf,
    /// Told each install's progress (a terminal's display), if given.
    pub progress: Option<install::ProgressSink>,
}

impl Settings<'_> {
    /// The registry URL for `package` (without a trailing `/`).
    pub fn registry_url(&self, package: &str) -> String {
        let nonempty = |value: Option<String>| value.filter(|v| !v.is_empty());
        let scoped = || {
            let scope = package.split_once('/').map(|(scope, _)| scope).filter(|s| s.starts_with('@'))?;
            nonempty(self.config.scoped_registries.get(scope).cloned())
        };
        let url = nonempty(self.registry_flag.clone())
            .or_else(|| nonempty((self.env)(REGISTRY_ENV)))
            .or_else(scoped)
            .or_else(|| nonempty(self.config.registry.clone()))
            .unwrap_or_else(|| DEFAULT_REGISTRY_URL.to_owned());
        url.trim_end_matches('/').to_owned()
    }

    /// The token for `registry`: `GOONDAN_REGISTRY_TOKEN`, else the config
    /// file's `registries[url].token` (`${VAR}` read from the environment).
    pub fn token(&self, registry: &str) -> Option<String> {
        if let Some(token) = (self.env)(TOKEN_ENV).filter(|t| !t.is_empty()) {
            return Some(token);
        }
        let raw = self.config.tokens.get(registry).or_else(|| self.config.tokens.get(&format!("{registry}/")))?;
        let trimmed = raw.trim().trim_matches(|c| c == '"' || c == '\'');
        let token = match trimmed.strip_prefix("${").and_then(|rest| rest.strip_suffix('}')) {
            Some(var) => (self.env)(var)?,
            None => trimmed.to_owned(),
        };
        Some(token).filter(|t| !t.is_empty())
    }
}

/// One published version, as a packument lists it.
#[derive(Debug, Clone)]
pub struct VersionInfo {
    pub dependencies: BTreeMap<String, String>,
    pub tarball: String,
    pub integrity: String,
}

/// A package's published versions and dist-tags.
#[derive(Debug, Clone)]
pub struct Packument {
    pub versions: BTreeMap<String, VersionInfo>,
    pub dist_tags: BTreeMap<String, String>,
}

/// An HTTP client for registries.
#[derive(Clone)]
pub struct Http {
    client: reqwest::Client,
    config_path: String,
}

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http").finish_non_exhaustive()
    }
}

fn string_map(value: Option<&Value>) -> Option<BTreeMap<String, String>> {
    match value {
        None | Some(Value::Null) => Some(BTreeMap::new()),
        Some(Value::Object(map)) => {
            map.iter().map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned()))).collect::<Option<_>>()
        }
        Some(_) => None,
    }
}

impl Http {
    pub fn new(settings: &Settings<'_>) -> Result<Self, PackageError> {
        let client = goondan_core::tls::client_builder(goondan_core::tls::SystemProxy::Honoured)
            .map_err(|e| PackageError::Client(e.to_string()))?
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| PackageError::Client(e.to_string()))?;
        Ok(Self { client, config_path: settings.config.path.display().to_string() })
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        url: &str,
        registry: &str,
        token: Option<&str>,
    ) -> Result<reqwest::Response, PackageError> {
        let request = match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let response = request
            .send()
            .await
            .map_err(|e| PackageError::Unreachable { url: url.to_owned(), detail: error_chain(&e) })?;
        let status = response.status().as_u16();
        if status == 401 || status == 403 {
            return Err(PackageError::Unauthorized {
                url: url.to_owned(),
                status,
                registry: registry.to_owned(),
                config: self.config_path.clone(),
            });
        }
        Ok(response)
    }

    /// The packument of `name` at `registry`.
    pub async fn packument(&self, registry: &str, name: &str, token: Option<&str>) -> Result<Packument, PackageError> {
        let url = format!("{registry}/{}", url_name(name));
        let response = self.send(self.client.get(&url), &url, registry, token).await?;
        let status = response.status().as_u16();
        if status == 404 {
            return Err(PackageError::NotFound { name: name.to_owned(), registry: registry.to_owned() });
        }
        let bad = |detail: String| PackageError::BadAnswer { url: url.clone(), detail };
        let body = response.bytes().await.map_err(|e| bad(error_chain(&e)))?;
        if status != 200 {
            return Err(refused(&url, status, &body));
        }
        let value: Value = serde_json::from_slice(&body).map_err(|e| bad(format!("not JSON ({e})")))?;
        let versions_raw =
            value.get("versions").and_then(Value::as_object).ok_or_else(|| bad("no `versions`".into()))?;
        let mut versions = BTreeMap::new();
        for (version, meta) in versions_raw {
            let dist = meta.get("dist");
            let field = |key: &str| dist.and_then(|d| d.get(key)).and_then(Value::as_str).map(str::to_owned);
            let (Some(tarball), Some(integrity), Some(dependencies)) =
                (field("tarball"), field("integrity"), string_map(meta.get("dependencies")))
            else {
                return Err(bad(format!("version {version} lacks dist.tarball, dist.integrity or dependencies")));
            };
            versions.insert(version.clone(), VersionInfo { dependencies, tarball, integrity });
        }
        let dist_tags = string_map(value.get("dist-tags")).ok_or_else(|| bad("`dist-tags` is not a map".into()))?;
        Ok(Packument { versions, dist_tags })
    }

    /// The bytes at `url` (a tarball).
    pub async fn download(&self, registry: &str, url: &str, token: Option<&str>) -> Result<Vec<u8>, PackageError> {
        self.download_with(registry, url, token, &mut |_, _| {}).await
    }

    /// The bytes at `url`, telling `on_chunk` how many are in (and of how
    /// many, when the answer says) as they come.
    pub async fn download_with(
        &self,
        registry: &str,
        url: &str,
        token: Option<&str>,
        on_chunk: &mut (dyn FnMut(u64, Option<u64>) + Send),
    ) -> Result<Vec<u8>, PackageError> {
        let mut response = self.send(self.client.get(url), url, registry, token).await?;
        let status = response.status().as_u16();
        let total = response.content_length();
        let unreachable =
            |e: reqwest::Error| PackageError::Unreachable { url: url.to_owned(), detail: error_chain(&e) };
        let mut body = Vec::with_capacity(total.unwrap_or(0).min(64 << 20) as usize);
        while let Some(chunk) = response.chunk().await.map_err(unreachable)? {
            body.extend_from_slice(&chunk);
            if status == 200 {
                on_chunk(body.len() as u64, total);
            }
        }
        if status != 200 {
            return Err(refused(url, status, &body));
        }
        Ok(body)
    }

    /// `PUT <registry>/<name>` with a publish payload.
    pub async fn publish(
        &self,
        registry: &str,
        name: &str,
        payload: &Value,
        token: Option<&str>,
    ) -> Result<(), PackageError> {
        let url = format!("{registry}/{}", url_name(name));
        let body = serde_json::to_vec(payload).map_err(|e| PackageError::Client(e.to_string()))?;
        let request = self.client.put(&url).header(reqwest::header::CONTENT_TYPE, "application/json").body(body);
        let response = self.send(request, &url, registry, token).await?;
        let status = response.status().as_u16();
        let body = response.bytes().await.unwrap_or_default();
        if (200..300).contains(&status) { Ok(()) } else { Err(refused(&url, status, &body)) }
    }
}

/// A checked name in a URL as the original writes it (`encodeURIComponent`
/// of scope and name: `%40scope/name`); only the `@` needs it.
fn url_name(name: &str) -> String {
    match name.strip_prefix('@') {
        Some(rest) => format!("%40{rest}"),
        None => name.to_owned(),
    }
}

/// A non-2xx answer: the registry's `message` when it sent one.
fn refused(url: &str, status: u16, body: &[u8]) -> PackageError {
    let message = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| {
            let code = v.get("error").and_then(Value::as_str).unwrap_or_default().to_owned();
            v.get("message")
                .and_then(Value::as_str)
                .map(|m| if code.is_empty() { m.to_owned() } else { format!("{code}: {m}") })
        })
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned());
    PackageError::Refused { url: url.to_owned(), status, message }
}

/// An error with its causes (reqwest's top level says little).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs_split_at_the_last_at() {
        assert_eq!(parse_ref("@a/b@^1.0.0").ok(), Some(("@a/b".to_owned(), Some("^1.0.0".to_owned()))));
        assert_eq!(parse_ref("@a/b").ok(), Some(("@a/b".to_owned(), None)));
        assert_eq!(parse_ref("@a/b@latest").ok(), Some(("@a/b".to_owned(), Some("latest".to_owned()))));
        assert!(matches!(parse_ref("@A/b"), Err(PackageError::InvalidName { .. })));
        assert!(matches!(parse_ref("@a/b@not a range!"), Err(PackageError::InvalidVersion { .. })));
        assert!(matches!(parse_ref("@a/b@"), Err(PackageError::InvalidVersion { .. })));
    }

    #[test]
    fn registry_precedence_is_the_originals() {
        let env_with = |registry: Option<&'static str>| {
            move |key: &str| if key == REGISTRY_ENV { registry.map(str::to_owned) } else { None }
        };
        let mut config = CliConfig { registry: Some("http://config".into()), ..CliConfig::default() };
        config.scoped_registries.insert("@s".into(), "http://scoped/".into());
        let env = env_with(Some("http://env"));
        let mut settings = Settings {
            registry_flag: Some("http://flag".into()),
            env: &env,
            config,
            state_root: PathBuf::new(),
            progress: None,
        };
        assert_eq!(settings.registry_url("@s/x"), "http://flag");
        settings.registry_flag = None;
        assert_eq!(settings.registry_url("@s/x"), "http://env");
        let env = env_with(None);
        settings.env = &env;
        assert_eq!(settings.registry_url("@s/x"), "http://scoped");
        assert_eq!(settings.registry_url("@t/x"), "http://config");
        settings.config.registry = None;
        assert_eq!(settings.registry_url("@t/x"), DEFAULT_REGISTRY_URL);
    }

    #[test]
    fn tokens_come_from_the_env_then_the_config() {
        let env = |key: &str| match key {
            "MY_TOKEN" => Some("from-var".to_owned()),
            _ => None,
        };
        let mut config = CliConfig::default();
        config.tokens.insert("http://r".into(), "${MY_TOKEN}".into());
        config.tokens.insert("http://plain".into(), "\"abc\"".into());
        let settings = Settings { registry_flag: None, env: &env, config, state_root: PathBuf::new(), progress: None };
        assert_eq!(settings.token("http://r").as_deref(), Some("from-var"));
        assert_eq!(settings.token("http://plain").as_deref(), Some("abc"));
        assert_eq!(settings.token("http://other"), None);
        let env = |key: &str| (key == TOKEN_ENV).then(|| "env-token".to_owned());
        let settings = Settings { env: &env, ..settings };
        assert_eq!(settings.token("http://r").as_deref(), Some("env-token"));
    }
}
