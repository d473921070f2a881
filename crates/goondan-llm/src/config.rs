//! From a `kind: Model` resource to a provider: which API, which endpoint,
//! which key.
//!
//! The key comes from `apiKey` (`{value}`, `{valueFrom: {env}}` or `{valueFrom: {secretRef}}`) or the
//! provider's usual environment variable; the endpoint from `spec.endpoint`
//! (the base URL as the official SDKs take it, e.g.
//! `https://api.openai.com/v1`), else `OPENAI_BASE_URL` /
//! `ANTHROPIC_BASE_URL` as the original honours them, else the default.
//!
//! `spec.options` holds what is particular to a provider (see each provider
//! module), and one option every API provider (openai, anthropic, google)
//! reads the same way:
//!
//! - `idleTimeoutSeconds` (a positive number, fractions allowed; default
//!   120): the longest wait for the response headers, for each chunk of the
//!   streamed reply, and for the body of an error response. A wait that runs
//!   out before the headers is a (retried) [`ModelError::Network`]; one
//!   while streaming is a [`ModelError::Protocol`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use goondan_config::{ModelSpec, ValueSourceError};
use goondan_core::{JsonObject, JsonValue};

use crate::error::ModelError;
use crate::provider::ModelProvider;

/// The option naming the idle timeout (see the module documentation).
pub const IDLE_TIMEOUT_OPTION: &str = "idleTimeoutSeconds";

/// The idle timeout when `idleTimeoutSeconds` is not set.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// The APIs this build speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    /// OpenAI and OpenAI-compatible servers (vLLM, llama.cpp, Ollama, …).
    OpenAi,
    /// Anthropic's Messages API.
    Anthropic,
    /// Google's Gemini API.
    Google,
    /// Replies listed in the Model resource (offline examples and tests).
    Scripted,
}

impl ProviderKind {
    /// Parses `spec.provider`.
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "openai" | "openai-compatible" => Some(Self::OpenAi),
            "anthropic" => Some(Self::Anthropic),
            "google" | "gemini" => Some(Self::Google),
            "scripted" => Some(Self::Scripted),
            _ => None,
        }
    }

    /// The provider's name in the OpenTelemetry GenAI conventions
    /// (`gen_ai.provider.name`).
    pub fn semconv_name(self) -> &'static str {
        match self {
            Self::Google => "gcp.gemini",
            other => other.name(),
        }
    }

    /// The provider's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
            Self::Google => "google",
            Self::Scripted => "scripted",
        }
    }

    /// Environment variables holding the key when `apiKey` is not set, in order.
    pub fn key_variables(self) -> &'static [&'static str] {
        match self {
            Self::OpenAi => &["OPENAI_API_KEY"],
            Self::Anthropic => &["ANTHROPIC_API_KEY"],
            Self::Google => &["GOOGLE_GENERATIVE_AI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"],
            Self::Scripted => &[],
        }
    }

    /// The environment variable that overrides the default endpoint.
    pub fn base_url_variable(self) -> Option<&'static str> {
        match self {
            Self::OpenAi => Some("OPENAI_BASE_URL"),
            Self::Anthropic => Some("ANTHROPIC_BASE_URL"),
            Self::Google => Some("GOOGLE_GENERATIVE_AI_BASE_URL"),
            Self::Scripted => None,
        }
    }

    /// The endpoint when nothing else is configured.
    pub fn default_endpoint(self) -> &'static str {
        match self {
            Self::OpenAi => "https://api.openai.com/v1",
            Self::Anthropic => "https://api.anthropic.com",
            Self::Google => "https://generativelanguage.googleapis.com/v1beta",
            Self::Scripted => "",
        }
    }
}

/// A secret that never prints.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for building a request.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Everything a provider needs, resolved from a Model resource.
#[derive(Debug, Clone)]
pub struct ModelSettings {
    /// The API.
    pub kind: ProviderKind,
    /// The model id.
    pub model: String,
    /// The base URL, without a trailing slash.
    pub endpoint: String,
    /// The API key (absent only for the scripted provider).
    pub api_key: Option<Secret>,
    /// `spec.options`.
    pub options: JsonObject,
    /// The bundle directory (for files named in options).
    pub bundle_root: PathBuf,
}

impl ModelSettings {
    /// Resolves a Model's spec; `lookup` reads the environment (and any
    /// `--env-file`).
    pub fn from_spec(
        spec: &ModelSpec,
        lookup: &dyn Fn(&str) -> Option<String>,
        bundle_root: &Path,
    ) -> Result<Self, ModelError> {
        let kind = ProviderKind::parse(&spec.provider).ok_or_else(|| {
            ModelError::Config(format!(
                "provider '{}' is not supported; use openai (or any OpenAI-compatible server), anthropic, google or scripted",
                spec.provider
            ))
        })?;
        let set = |name: &str| lookup(name).filter(|value| !value.trim().is_empty());
        let api_key = match (&spec.api_key, kind) {
            (_, ProviderKind::Scripted) => None,
            (Some(source), _) => Some(Secret::new(source.resolve("apiKey", &set).map_err(|error| match error {
                ValueSourceError::Unset { variable } => {
                    ModelError::MissingKey { provider: kind.name().to_owned(), variable }
                }
                other => ModelError::Config(format!("{}: spec.apiKey: {other}", kind.name())),
            })?)),
            (None, _) => {
                let found = kind.key_variables().iter().find_map(|name| set(name));
                Some(Secret::new(found.ok_or_else(|| ModelError::MissingKey {
                    provider: kind.name().to_owned(),
                    variable: kind.key_variables().first().copied().unwrap_or("API_KEY").to_owned(),
                })?))
            }
        };
        let endpoint = spec
            .endpoint
            .clone()
            .or_else(|| kind.base_url_variable().and_then(set))
            .unwrap_or_else(|| kind.default_endpoint().to_owned());
        Ok(Self {
            kind,
            model: spec.model.clone(),
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            api_key,
            options: spec.options.clone(),
            bundle_root: bundle_root.to_path_buf(),
        })
    }

    /// `options.idleTimeoutSeconds`, or [`DEFAULT_IDLE_TIMEOUT`]; an error
    /// for anything but a positive number of seconds a `Duration` can hold.
    pub fn idle_timeout(&self) -> Result<Duration, ModelError> {
        let provider = self.kind.name();
        // An earlier spelling, which would otherwise be ignored without a word.
        if self.options.contains_key("idleTimeoutSecs") {
            return Err(ModelError::Config(format!(
                "{provider}: options.idleTimeoutSecs is not an option; use {IDLE_TIMEOUT_OPTION}"
            )));
        }
        let Some(value) = self.options.get(IDLE_TIMEOUT_OPTION) else { return Ok(DEFAULT_IDLE_TIMEOUT) };
        value
            .as_f64()
            .filter(|seconds| *seconds > 0.0)
            .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok())
            .ok_or_else(|| {
                ModelError::Config(format!(
                    "{provider}: options.{IDLE_TIMEOUT_OPTION} must be a positive number of seconds"
                ))
            })
    }

    /// A string option (`null` counts as unset), or an error if it is set to
    /// something else.
    pub(crate) fn option_str(&self, name: &str) -> Result<Option<&str>, ModelError> {
        match self.options.get(name) {
            None | Some(JsonValue::Null) => Ok(None),
            Some(JsonValue::String(value)) => Ok(Some(value)),
            Some(_) => Err(ModelError::Config(format!("{}: options.{name} must be a string", self.kind.name()))),
        }
    }

    /// The key, or the error naming the variable to set.
    pub fn key(&self) -> Result<&str, ModelError> {
        self.api_key.as_ref().map(Secret::expose).ok_or_else(|| ModelError::MissingKey {
            provider: self.kind.name().to_owned(),
            variable: self.kind.key_variables().first().copied().unwrap_or("API_KEY").to_owned(),
        })
    }
}

/// The provider for `settings`.
pub fn build_provider(settings: &ModelSettings) -> Result<Arc<dyn ModelProvider>, ModelError> {
    Ok(match settings.kind {
        ProviderKind::OpenAi => Arc::new(crate::openai::OpenAiProvider::new(settings)?),
        ProviderKind::Anthropic => Arc::new(crate::anthropic::AnthropicProvider::new(settings)?),
        ProviderKind::Google => Arc::new(crate::google::GoogleProvider::new(settings)?),
        ProviderKind::Scripted => Arc::new(crate::scripted::ScriptedProvider::new(settings)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use goondan_config::{ValueSource, resources::ValueFrom};

    fn spec(provider: &str, api_key: Option<ValueSource>, endpoint: Option<&str>) -> ModelSpec {
        ModelSpec {
            provider: provider.into(),
            model: "m".into(),
            api_key,
            endpoint: endpoint.map(str::to_owned),
            options: JsonObject::new(),
            capabilities: JsonObject::new(),
            pricing: None,
        }
    }

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn keys_come_from_the_value_source_or_the_usual_variable() {
        let from_env = ValueSource { value: None, value_from: Some(ValueFrom::Env("MY_KEY".into())) };
        let settings = ModelSettings::from_spec(
            &spec("openai", Some(from_env.clone()), None),
            &env(&[("MY_KEY", "k1")]),
            Path::new("."),
        );
        assert_eq!(settings.map(|s| s.api_key), Ok(Some(Secret::new("k1"))));
        let missing = ModelSettings::from_spec(&spec("openai", Some(from_env), None), &env(&[]), Path::new("."));
        assert_eq!(
            missing.err(),
            Some(ModelError::MissingKey { provider: "openai".into(), variable: "MY_KEY".into() })
        );
        let default = ModelSettings::from_spec(&spec("anthropic", None, None), &env(&[]), Path::new("."));
        assert!(default.err().is_some_and(|e| e.to_string().contains("set ANTHROPIC_API_KEY")));
        let inline = ValueSource { value: Some("inline".into()), value_from: None };
        let settings = ModelSettings::from_spec(&spec("google", Some(inline), None), &env(&[]), Path::new("."));
        assert_eq!(settings.map(|s| format!("{:?}", s.api_key)), Ok("Some(Secret(<redacted>))".to_owned()));
        // A blank variable is no key, as an unset one.
        let blank = ValueSource::env("MY_KEY");
        let settings =
            ModelSettings::from_spec(&spec("openai", Some(blank), None), &env(&[("MY_KEY", " ")]), Path::new("."));
        assert!(matches!(settings, Err(ModelError::MissingKey { .. })), "{settings:?}");
        let neither = ValueSource { value: None, value_from: None };
        let settings = ModelSettings::from_spec(&spec("openai", Some(neither), None), &env(&[]), Path::new("."));
        assert_eq!(
            settings.err().map(|e| e.to_string()),
            Some(
                ModelError::Config(
                    "openai: spec.apiKey: must be {value: \"...\"}, {valueFrom: {env: NAME}} or {valueFrom: \
                     {secretRef: {ref: Secret/NAME, key: KEY}}}"
                        .into()
                )
                .to_string()
            )
        );
    }

    #[test]
    fn a_key_from_a_secret_ref_is_read_as_the_original_reads_it() {
        let secret = ValueSource::from_json(&serde_json::json!({"valueFrom": {"secretRef": {"ref": "Secret/openai"}}}));
        let secret = secret.unwrap_or_else(|| panic!("a secretRef"));
        let found = ModelSettings::from_spec(
            &spec("openai", Some(secret.clone()), None),
            &env(&[("GOONDAN_SECRET_OPENAI_APIKEY", "k2")]),
            Path::new("."),
        );
        assert_eq!(found.map(|s| s.api_key), Ok(Some(Secret::new("k2"))));
        let missing = ModelSettings::from_spec(&spec("openai", Some(secret), None), &env(&[]), Path::new("."));
        let message = missing.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("Secret/openai") && message.contains("GOONDAN_SECRET_OPENAI_APIKEY"), "{message}");
    }

    #[test]
    fn endpoints_follow_spec_then_environment_then_default() {
        let vars = env(&[("OPENAI_API_KEY", "k"), ("OPENAI_BASE_URL", "http://127.0.0.1:9/v1/")]);
        let explicit =
            ModelSettings::from_spec(&spec("openai", None, Some("http://127.0.0.1:8080/v1")), &vars, Path::new("."));
        assert_eq!(explicit.map(|s| s.endpoint), Ok("http://127.0.0.1:8080/v1".to_owned()));
        let from_env = ModelSettings::from_spec(&spec("openai", None, None), &vars, Path::new("."));
        assert_eq!(from_env.map(|s| s.endpoint), Ok("http://127.0.0.1:9/v1".to_owned()));
        let default = ModelSettings::from_spec(
            &spec("anthropic", None, None),
            &env(&[("ANTHROPIC_API_KEY", "k")]),
            Path::new("."),
        );
        assert_eq!(default.map(|s| s.endpoint), Ok("https://api.anthropic.com".to_owned()));
    }

    fn with_options(options: serde_json::Value) -> ModelSettings {
        ModelSettings {
            kind: ProviderKind::Google,
            model: "m".into(),
            endpoint: String::new(),
            api_key: None,
            options: options.as_object().cloned().unwrap_or_default(),
            bundle_root: PathBuf::new(),
        }
    }

    #[test]
    fn the_idle_timeout_is_a_positive_number_of_seconds() {
        use serde_json::json;
        assert_eq!(with_options(json!({})).idle_timeout(), Ok(DEFAULT_IDLE_TIMEOUT));
        assert_eq!(with_options(json!({"idleTimeoutSeconds": 2.5})).idle_timeout(), Ok(Duration::from_millis(2500)));
        assert_eq!(with_options(json!({"idleTimeoutSeconds": 300})).idle_timeout(), Ok(Duration::from_secs(300)));
        // Too large for a Duration: an error, not a panic.
        for bad in [json!(0), json!(-1), json!("soon"), json!(null), json!(1e300)] {
            let error = with_options(json!({ "idleTimeoutSeconds": bad })).idle_timeout();
            assert!(
                matches!(&error, Err(ModelError::Config(m)) if m.starts_with("google: options.idleTimeoutSeconds")),
                "{bad}: {error:?}"
            );
        }
        let old = with_options(json!({"idleTimeoutSecs": 30})).idle_timeout();
        assert!(matches!(&old, Err(ModelError::Config(m)) if m.contains("use idleTimeoutSeconds")), "{old:?}");
    }

    #[test]
    fn unknown_providers_are_config_errors() {
        let error = ModelSettings::from_spec(&spec("llama", None, None), &env(&[]), Path::new(".")).err();
        assert!(matches!(error, Some(ModelError::Config(message)) if message.contains("'llama'")));
        assert!(ModelSettings::from_spec(&spec("scripted", None, None), &env(&[]), Path::new(".")).is_ok());
    }
}
