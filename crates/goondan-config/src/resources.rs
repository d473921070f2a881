//! Typed resources of a bundle: `{apiVersion, kind, metadata, spec}` for the
//! eight kinds. Built from documents that passed validation; unknown fields
//! are ignored so that newer bundles still load.

use std::collections::BTreeSet;

use goondan_core::{DEFAULT_ERROR_MESSAGE_LIMIT, JsonObject, JsonValue, ObjectRef};
use indexmap::IndexMap;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

use crate::placement::AgentPlacement;

/// The resource kinds of `goondan.ai/v1` (ordered as documented).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum Kind {
    Package,
    Model,
    Agent,
    Swarm,
    Tool,
    Extension,
    Connector,
    Connection,
}

impl Kind {
    /// All kinds, in documentation order.
    pub const ALL: [Kind; 8] = [
        Kind::Package,
        Kind::Model,
        Kind::Agent,
        Kind::Swarm,
        Kind::Tool,
        Kind::Extension,
        Kind::Connector,
        Kind::Connection,
    ];

    /// The kind's name as written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Package => "Package",
            Kind::Model => "Model",
            Kind::Agent => "Agent",
            Kind::Swarm => "Swarm",
            Kind::Tool => "Tool",
            Kind::Extension => "Extension",
            Kind::Connector => "Connector",
            Kind::Connection => "Connection",
        }
    }

    /// Parses a kind name (exact spelling).
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

/// `metadata` of every resource.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// The resource name.
    pub name: String,
    /// Labels.
    #[serde(default)]
    pub labels: IndexMap<String, JsonValue>,
    /// Annotations.
    #[serde(default)]
    pub annotations: IndexMap<String, JsonValue>,
}

/// A resource with its spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resource<S> {
    /// Always `goondan.ai/v1`.
    pub api_version: String,
    /// The kind's name.
    pub kind: String,
    /// Name, labels, annotations.
    pub metadata: Metadata,
    /// The kind-specific body.
    pub spec: S,
}

impl<S> Resource<S> {
    /// The resource's `metadata.name`.
    pub fn name(&self) -> &str {
        &self.metadata.name
    }
}

/// Any resource.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum AnyResource {
    Package(Resource<PackageSpec>),
    Model(Resource<ModelSpec>),
    Agent(Resource<AgentSpec>),
    Swarm(Resource<SwarmSpec>),
    Tool(Resource<ToolSpec>),
    Extension(Resource<ExtensionSpec>),
    Connector(Resource<ConnectorSpec>),
    Connection(Resource<ConnectionSpec>),
}

impl AnyResource {
    /// Builds the typed resource of `kind` from a validated document.
    pub fn from_value(kind: Kind, value: JsonValue) -> Result<Self, serde_json::Error> {
        Ok(match kind {
            Kind::Package => Self::Package(serde_json::from_value(value)?),
            Kind::Model => Self::Model(serde_json::from_value(value)?),
            Kind::Agent => Self::Agent(serde_json::from_value(value)?),
            Kind::Swarm => Self::Swarm(serde_json::from_value(value)?),
            Kind::Tool => Self::Tool(serde_json::from_value(value)?),
            Kind::Extension => Self::Extension(serde_json::from_value(value)?),
            Kind::Connector => Self::Connector(serde_json::from_value(value)?),
            Kind::Connection => Self::Connection(serde_json::from_value(value)?),
        })
    }

    /// The kind.
    pub fn kind(&self) -> Kind {
        match self {
            Self::Package(_) => Kind::Package,
            Self::Model(_) => Kind::Model,
            Self::Agent(_) => Kind::Agent,
            Self::Swarm(_) => Kind::Swarm,
            Self::Tool(_) => Kind::Tool,
            Self::Extension(_) => Kind::Extension,
            Self::Connector(_) => Kind::Connector,
            Self::Connection(_) => Kind::Connection,
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.metadata().name
    }

    /// The metadata.
    pub fn metadata(&self) -> &Metadata {
        match self {
            Self::Package(r) => &r.metadata,
            Self::Model(r) => &r.metadata,
            Self::Agent(r) => &r.metadata,
            Self::Swarm(r) => &r.metadata,
            Self::Tool(r) => &r.metadata,
            Self::Extension(r) => &r.metadata,
            Self::Connector(r) => &r.metadata,
            Self::Connection(r) => &r.metadata,
        }
    }
}

/// `kind: Package`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PackageSpec {
    /// The package version.
    pub version: String,
    /// What it is.
    #[serde(default)]
    pub description: Option<String>,
    /// Packages it depends on.
    #[serde(default)]
    pub dependencies: Vec<PackageDependency>,
}

/// One dependency of a package.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PackageDependency {
    /// The package name.
    pub name: String,
    /// The version range.
    pub version: String,
}

/// `kind: Model`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// `openai`, `anthropic`, `google`, …
    pub provider: String,
    /// The model id.
    pub model: String,
    /// Where the API key comes from.
    #[serde(default)]
    pub api_key: Option<ValueSource>,
    /// The API base URL.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Provider options.
    #[serde(default)]
    pub options: JsonObject,
    /// Declared capabilities.
    #[serde(default)]
    pub capabilities: JsonObject,
    /// What its tokens cost (overrides the default table of `gdn usage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<ModelPricing>,
}

/// `Model.spec.pricing`: USD per million tokens of each kind. Cache reads
/// and writes without a price of their own cost the input price; reasoning
/// tokens, billed as output by every major provider, cost the output price
/// unless `reasoning` says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelPricing {
    /// Prompt tokens.
    pub input: f64,
    /// Generated tokens.
    pub output: f64,
    /// Prompt tokens read from the provider's cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<f64>,
    /// Prompt tokens written to the provider's cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
    /// Reasoning tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<f64>,
}

/// A secret or setting given inline or through the environment:
/// `{value: "..."}`, `{valueFrom: {env: NAME}}` or, as the original,
/// `{valueFrom: {secretRef: {ref: "Secret/<name>", key: KEY}}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ValueSource {
    /// An inline value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// A reference to the environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<ValueFrom>,
}

/// Where a [`ValueSource`] that is not inline reads its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ValueFrom {
    /// `{env: NAME}`: the environment variable `NAME`.
    Env(String),
    /// `{secretRef: {ref: "Secret/<name>", key: KEY}}`: a named secret,
    /// read from the environment as the original reads it (see
    /// [`SecretRef::variables`]).
    SecretRef(SecretRef),
}

/// `valueFrom.secretRef`: a key of a named secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretRef {
    /// `Secret/<name>`.
    #[serde(rename = "ref")]
    pub reference: String,
    /// The key within the secret (the original's default: the name of the
    /// field that holds the reference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl SecretRef {
    /// The secret's name: what follows `Secret/` (`None` when `ref` is not
    /// of that form, which validation reports).
    pub fn secret_name(&self) -> Option<&str> {
        let name = self.reference.trim().strip_prefix("Secret/")?.trim();
        (!name.is_empty() && !name.contains('/')).then_some(name)
    }

    /// The environment variables that may hold the secret, in the order
    /// the original tries them: `GOONDAN_SECRET_<NAME>_<KEY>`,
    /// `GOONDAN_SECRET_<NAME>_<FIELD>`, `GOONDAN_SECRET_<NAME>`, then the
    /// same with `SECRET_` (each part upper-cased, every run of other
    /// characters than letters and digits made one `_`). `field` is the
    /// name of the field holding the reference (`apiKey`, a Connection's
    /// secret's key), the key's default.
    pub fn variables(&self, field: &str) -> Vec<String> {
        let Some(name) = self.secret_name() else { return Vec::new() };
        let secret = env_token(name);
        let field = env_token(field);
        let key = self.key.as_deref().map(env_token).unwrap_or_else(|| field.clone());
        let mut names = Vec::with_capacity(6);
        for prefix in ["GOONDAN_SECRET_", "SECRET_"] {
            for suffix in [key.as_str(), field.as_str(), ""] {
                let name =
                    if suffix.is_empty() { format!("{prefix}{secret}") } else { format!("{prefix}{secret}_{suffix}") };
                if !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        names
    }
}

/// A name as one part of an environment variable's name: upper case,
/// every run of characters other than ASCII letters and digits one `_`,
/// none at either end.
fn env_token(text: &str) -> String {
    let mut token = String::with_capacity(text.len());
    for c in text.trim().chars() {
        if c.is_ascii_alphanumeric() {
            token.push(c.to_ascii_uppercase());
        } else if !token.is_empty() && !token.ends_with('_') {
            token.push('_');
        }
    }
    while token.ends_with('_') {
        token.pop();
    }
    token
}

/// Why a [`ValueSource`] gives no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueSourceError {
    /// `valueFrom.env` names a variable that is not set.
    #[error("the environment variable '{variable}' (valueFrom.env) is not set")]
    Unset {
        /// The variable.
        variable: String,
    },
    /// `valueFrom.secretRef` names a secret none of whose variables is set.
    #[error("the secret {reference} (valueFrom.secretRef) is not set: set one of {}", variables.join(", "))]
    SecretUnset {
        /// `Secret/<name>`.
        reference: String,
        /// The variables tried, in order.
        variables: Vec<String>,
    },
    /// `valueFrom.secretRef.ref` is not `Secret/<name>`.
    #[error("valueFrom.secretRef.ref must be Secret/<name>, got '{reference}'")]
    SecretRefShape {
        /// What it is.
        reference: String,
    },
    /// Neither form: not `{value: "..."}` nor `{valueFrom: {env: NAME}}`.
    #[error(
        "must be {{value: \"...\"}}, {{valueFrom: {{env: NAME}}}} or {{valueFrom: {{secretRef: {{ref: Secret/NAME, key: KEY}}}}}}"
    )]
    Shape,
}

impl ValueSource {
    /// An inline value.
    pub fn inline(value: impl Into<String>) -> Self {
        Self { value: Some(value.into()), value_from: None }
    }

    /// A reference to the environment variable `variable`.
    pub fn env(variable: impl Into<String>) -> Self {
        Self { value: None, value_from: Some(ValueFrom::Env(variable.into())) }
    }

    /// Reads a value source from configuration that no schema checked (an
    /// extension's config, a Connection's `secrets`): exactly
    /// `{value: "..."}`, `{valueFrom: {env: NAME}}` or
    /// `{valueFrom: {secretRef: {ref, key?}}}` with string fields, no other
    /// key, else `None`.
    pub fn from_json(value: &JsonValue) -> Option<Self> {
        let JsonValue::Object(map) = value else { return None };
        if map.len() != 1 {
            return None;
        }
        match map.iter().next() {
            Some((key, JsonValue::String(text))) if key == "value" => Some(Self::inline(text.clone())),
            Some((key, JsonValue::Object(from))) if key == "valueFrom" && from.len() == 1 => match from.iter().next() {
                Some((key, JsonValue::String(variable))) if key == "env" => Some(Self::env(variable.clone())),
                Some((key, JsonValue::Object(secret))) if key == "secretRef" => {
                    let only_known = secret.keys().all(|k| k == "ref" || k == "key");
                    let reference = secret.get("ref")?.as_str()?.to_owned();
                    let key = match secret.get("key") {
                        None => None,
                        Some(JsonValue::String(key)) => Some(key.clone()),
                        Some(_) => return None,
                    };
                    only_known.then_some(Self {
                        value: None,
                        value_from: Some(ValueFrom::SecretRef(SecretRef { reference, key })),
                    })
                }
                _ => None,
            },
            _ => None,
        }
    }

    /// The value: the inline one, else the variable's through `env` (the
    /// caller's lookup decides what counts as set). `field` names the field
    /// that holds this source (`apiKey`, a Connection's secret's key): the
    /// default key of a `secretRef`.
    pub fn resolve(&self, field: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, ValueSourceError> {
        match (&self.value, &self.value_from) {
            (Some(value), _) => Ok(value.clone()),
            (None, Some(ValueFrom::Env(variable))) => {
                env(variable).ok_or_else(|| ValueSourceError::Unset { variable: variable.clone() })
            }
            (None, Some(ValueFrom::SecretRef(secret))) => {
                let variables = secret.variables(field);
                if variables.is_empty() {
                    return Err(ValueSourceError::SecretRefShape { reference: secret.reference.clone() });
                }
                variables.iter().find_map(|variable| env(variable)).ok_or_else(|| ValueSourceError::SecretUnset {
                    reference: secret.reference.trim().to_owned(),
                    variables,
                })
            }
            (None, None) => Err(ValueSourceError::Shape),
        }
    }

    /// The variables `value` may read through `valueFrom` (`env`, or each
    /// candidate of a `secretRef`, `field` being the name of the field that
    /// holds it), whatever else it holds: what a scan for the secrets a
    /// bundle reads looks for (reading more than is valid is the safe side
    /// there).
    pub fn env_variables_of(value: &JsonValue, field: &str) -> Vec<String> {
        if let Some(name) = value.pointer("/valueFrom/env").and_then(JsonValue::as_str) {
            return vec![name.to_owned()];
        }
        let Some(secret) = value.pointer("/valueFrom/secretRef") else { return Vec::new() };
        let (Some(reference), key) =
            (secret.get("ref").and_then(JsonValue::as_str), secret.get("key").and_then(JsonValue::as_str))
        else {
            return Vec::new();
        };
        SecretRef { reference: reference.to_owned(), key: key.map(str::to_owned) }.variables(field)
    }

    /// Every variable read through `valueFrom` anywhere within `value`
    /// ([`env_variables_of`](Self::env_variables_of) at every depth, the
    /// field being the key that holds each).
    pub fn env_variables_within(value: &JsonValue) -> BTreeSet<String> {
        fn collect(field: &str, value: &JsonValue, names: &mut BTreeSet<String>) {
            match value {
                JsonValue::Object(map) => {
                    names.extend(ValueSource::env_variables_of(value, field));
                    map.iter().for_each(|(key, nested)| collect(key, nested, names));
                }
                JsonValue::Array(items) => items.iter().for_each(|nested| collect(field, nested, names)),
                _ => {}
            }
        }
        let mut names = BTreeSet::new();
        collect("", value, &mut names);
        names
    }
}

/// `kind: Agent`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", try_from = "RawAgentSpec")]
pub struct AgentSpec {
    /// Which model and with what parameters.
    pub model_config: ModelConfig,
    /// The system prompt, inline or from a file.
    #[serde(default)]
    pub prompt: Option<AgentPrompt>,
    /// The Tool resources the agent may use.
    pub tools: Vec<ObjectRef>,
    /// The `config` object of each `spec.tools` item (same index as
    /// `tools`), for the agent's use of that Tool: e.g. `{kind: Tool, name: file-system,
    /// package: "@goondan/base", config: {allowConfigWrites: true}}`.
    pub tool_configs: Vec<Option<JsonObject>>,
    /// The extensions the agent loads.
    pub extensions: Vec<ExtensionUse>,
    /// Tool names the agent must call before it may finish.
    pub required_tools: Vec<String>,
    /// The agent's security policy (`spec.policy`, an addition of this
    /// runtime: see docs/COMPATIBILITY.md).
    pub policy: AgentPolicy,
    /// The sandbox of the commands the agent's model chooses
    /// (`spec.sandbox`, an addition of this runtime); `None`: the Swarm's,
    /// else the default (see [`crate::Bundle::sandbox_for`]).
    pub sandbox: Option<SandboxConfig>,
    /// Where the agent's instances may run in a swarm spread over several
    /// hosts (`spec.placement`, an addition of this runtime); `None`: on
    /// any host (see [`crate::Bundle::placement_for`]).
    pub placement: Option<AgentPlacement>,
}

/// `Agent.spec.policy`: the agent's security policy.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentPolicy {
    /// Which tools a call of the agent may reach (spec 002 §7.1):
    /// `catalog`, the default, or `registry`.
    #[serde(default)]
    pub tool_call_scope: ToolCallScope,
}

/// `Agent.spec.policy.toolCallScope`: the tools a tool call may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ToolCallScope {
    /// Only the tools of the step's Tool Catalog; any other name is refused
    /// with `E_TOOL_NOT_IN_CATALOG` (spec 002 §7.1, the default).
    #[default]
    Catalog,
    /// Also every tool of the agent's Tool Registry that is not in the
    /// step's catalog: the bundle's other Tools and tools registered at run
    /// time. The explicit security policy spec 002 §7.1 asks for before a
    /// call may go past the catalog.
    Registry,
}

impl ToolCallScope {
    /// The YAML spelling: `catalog` or `registry`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Catalog => "catalog",
            Self::Registry => "registry",
        }
    }
}

/// `Agent.spec` as written, before the `spec.tools` items are split into
/// references and their configs.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawAgentSpec {
    model_config: ModelConfig,
    #[serde(default)]
    prompt: Option<AgentPrompt>,
    #[serde(default)]
    tools: Vec<JsonValue>,
    #[serde(default)]
    extensions: Vec<ExtensionUse>,
    #[serde(default)]
    required_tools: Vec<String>,
    #[serde(default)]
    policy: AgentPolicy,
    #[serde(default)]
    sandbox: Option<SandboxConfig>,
    #[serde(default)]
    placement: Option<AgentPlacement>,
}

impl TryFrom<RawAgentSpec> for AgentSpec {
    type Error = String;

    fn try_from(raw: RawAgentSpec) -> Result<Self, Self::Error> {
        let tools = raw
            .tools
            .iter()
            .map(|value| ObjectRef::parse(value).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        let tool_configs =
            raw.tools.iter().map(|value| value.get("config").and_then(JsonValue::as_object).cloned()).collect();
        Ok(Self {
            model_config: raw.model_config,
            prompt: raw.prompt,
            tools,
            tool_configs,
            extensions: raw.extensions,
            required_tools: raw.required_tools,
            policy: raw.policy,
            sandbox: raw.sandbox,
            placement: raw.placement,
        })
    }
}

/// `Agent.spec.modelConfig`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelConfig {
    /// The Model resource.
    #[serde(deserialize_with = "de_ref")]
    pub model_ref: ObjectRef,
    /// Sampling parameters (`temperature`, `maxTokens`, `topP`, …).
    #[serde(default)]
    pub params: JsonObject,
}

/// `Agent.spec.prompt`: `system` or `systemRef`, not both.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentPrompt {
    /// The prompt text.
    #[serde(default)]
    pub system: Option<String>,
    /// A file (relative to the bundle) holding the prompt.
    #[serde(default)]
    pub system_ref: Option<String>,
}

/// One `Agent.spec.extensions[]` item: a reference plus optional config
/// shallow-merged over the Extension's own `spec.config`.
#[derive(Debug, Clone, PartialEq)]
pub struct ExtensionUse {
    /// The Extension resource.
    pub reference: ObjectRef,
    /// Per-agent configuration.
    pub config: Option<JsonObject>,
}

impl<'de> Deserialize<'de> for ExtensionUse {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = JsonValue::deserialize(deserializer)?;
        let reference = ObjectRef::parse(&value).map_err(de::Error::custom)?;
        let config = value.get("config").and_then(JsonValue::as_object).cloned();
        Ok(Self { reference, config })
    }
}

/// `kind: Swarm`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SwarmSpec {
    /// The agent that receives input first.
    #[serde(deserialize_with = "de_ref")]
    pub entry_agent: ObjectRef,
    /// The swarm's agents.
    #[serde(deserialize_with = "de_refs")]
    pub agents: Vec<ObjectRef>,
    /// A fixed instance key.
    #[serde(default)]
    pub instance_key: Option<String>,
    /// Limits and lifecycle.
    #[serde(default)]
    pub policy: SwarmPolicy,
    /// The sandbox of its agents' commands, for each agent without a
    /// `spec.sandbox` of its own (an addition of this runtime).
    #[serde(default)]
    pub sandbox: Option<SandboxConfig>,
}

/// `spec.sandbox` of an Agent or a Swarm: where the commands the model
/// chooses (`bash`, script tool hosts, stdio MCP servers) may read, write
/// and connect. An Agent's own replaces its Swarm's whole; neither: the
/// default, `workspace-write` with no extra paths and no `network.allow`.
///
/// ```yaml
/// sandbox:
///   policy: workspace-write     # read-only | workspace-write | full
///   readable: [/opt/data, ~/datasets, ./vendor]
///   writable: [/srv/out]
///   network:
///     allow: ["api.example.com:443", "127.0.0.1:8080", "[::1]:9000"]
///   limits: {processes: 512, fileSize: 1GiB, memory: 8GiB}
/// ```
///
/// Paths are absolute, `~/…` (the home directory) or relative to the
/// bundle's directory: [`SandboxConfig::readable_paths`] and
/// [`SandboxConfig::writable_paths`] make them absolute.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxConfig {
    /// How much the commands may do.
    #[serde(default)]
    pub policy: SandboxPolicy,
    /// Extra paths the commands may read, beyond what the policy lets them
    /// (as written).
    #[serde(default)]
    pub readable: Vec<String>,
    /// Extra paths the commands may write (as written).
    #[serde(default)]
    pub writable: Vec<String>,
    /// Where the commands may connect.
    #[serde(default)]
    pub network: SandboxNetwork,
    /// The resource bounds of each command (see
    /// [`crate::sandbox::SandboxLimits`]); left out: the defaults.
    #[serde(default, skip_serializing_if = "crate::sandbox::SandboxLimits::is_default")]
    pub limits: crate::sandbox::SandboxLimits,
}

/// `spec.sandbox.network`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxNetwork {
    /// `host:port` entries the commands may connect to (hostname, IPv4, or
    /// bracketed IPv6): see [`goondan_core::host_port`].
    /// `policy: full` has no network limit and ignores them.
    #[serde(default)]
    pub allow: Vec<String>,
}

/// `spec.sandbox.policy`.
#[derive(Default, Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxPolicy {
    /// The commands write nowhere but the extra `writable` paths.
    ReadOnly,
    /// The commands write in the working directory and the extra
    /// `writable` paths (the default).
    #[default]
    WorkspaceWrite,
    /// No sandbox: the commands run with the user's full rights, as in the
    /// original Goondan.
    Full,
}

impl SandboxPolicy {
    /// Every policy, from the most confined.
    pub const ALL: [SandboxPolicy; 3] = [Self::ReadOnly, Self::WorkspaceWrite, Self::Full];

    /// The YAML spelling: `read-only`, `workspace-write` or `full`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "read-only",
            Self::WorkspaceWrite => "workspace-write",
            Self::Full => "full",
        }
    }

    /// Parses the YAML spelling (exactly).
    pub fn parse(text: &str) -> Option<SandboxPolicy> {
        Self::ALL.into_iter().find(|policy| policy.as_str() == text)
    }
}

impl std::fmt::Display for SandboxPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `Swarm.spec.policy`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SwarmPolicy {
    /// The most steps one turn may take (spec default 32).
    #[serde(default)]
    pub max_steps_per_turn: Option<u32>,
    /// Instance lifetime.
    #[serde(default)]
    pub lifecycle: Option<SwarmLifecycle>,
    /// Shutdown behaviour.
    #[serde(default)]
    pub shutdown: Option<SwarmShutdown>,
}

/// `Swarm.spec.policy.lifecycle`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SwarmLifecycle {
    /// How long an agent instance may idle (no turn since its last one
    /// ended) before the service expires it; at least 1 (schema).
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
    /// How long an expired instance is kept (and taken back by a late
    /// event) before the service collects it: deletes it (default 0).
    #[serde(default)]
    pub gc_grace_seconds: Option<u64>,
}

/// `Swarm.spec.policy.shutdown`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SwarmShutdown {
    /// How long running turns get to end when the service stops (its
    /// drain, unless `gdn run --drain-secs` says), and agent processes to
    /// exit after their `shutdown` before they are killed.
    #[serde(default)]
    pub grace_period_seconds: Option<u64>,
}

/// `kind: Tool`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolSpec {
    /// The handler module (relative to the package root).
    pub entry: String,
    /// The longest error message returned to the model, in characters.
    #[serde(default = "default_error_message_limit", deserialize_with = "de_positive_usize")]
    pub error_message_limit: usize,
    /// The functions the tool offers.
    pub exports: Vec<ToolExport>,
}

/// One `Tool.spec.exports[]` item.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ToolExport {
    /// The export name; the model sees `{tool}__{name}`.
    pub name: String,
    /// What it does, for the model.
    #[serde(default)]
    pub description: Option<String>,
    /// The JSON Schema of its arguments.
    #[serde(default)]
    pub parameters: Option<JsonValue>,
}

/// `kind: Extension`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ExtensionSpec {
    /// The extension module.
    pub entry: String,
    /// Default configuration.
    #[serde(default)]
    pub config: JsonObject,
}

/// `kind: Connector`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ConnectorSpec {
    /// The connector module.
    pub entry: String,
    /// The events it emits.
    #[serde(default)]
    pub events: Vec<ConnectorEvent>,
}

/// One event a connector emits.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ConnectorEvent {
    /// The event name.
    pub name: String,
    /// Its properties.
    #[serde(default)]
    pub properties: JsonObject,
}

/// `kind: Connection`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionSpec {
    /// The Connector.
    #[serde(deserialize_with = "de_ref")]
    pub connector_ref: ObjectRef,
    /// The Swarm it feeds.
    #[serde(default, deserialize_with = "de_opt_ref")]
    pub swarm_ref: Option<ObjectRef>,
    /// Connector configuration.
    #[serde(default)]
    pub config: JsonObject,
    /// Connector secrets.
    #[serde(default)]
    pub secrets: JsonObject,
    /// Routing rules.
    #[serde(default)]
    pub ingress: JsonValue,
}

fn default_error_message_limit() -> usize {
    DEFAULT_ERROR_MESSAGE_LIMIT
}

fn de_positive_usize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    let value = JsonValue::deserialize(deserializer)?;
    value
        .as_u64()
        .or_else(|| value.as_f64().filter(|f| f.fract() == 0.0 && *f >= 1.0).map(|f| f as u64))
        .filter(|n| *n >= 1)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| de::Error::custom("errorMessageLimit must be a positive integer"))
}

fn de_ref<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ObjectRef, D::Error> {
    let value = JsonValue::deserialize(deserializer)?;
    ObjectRef::parse(&value).map_err(de::Error::custom)
}

fn de_opt_ref<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<ObjectRef>, D::Error> {
    let value = JsonValue::deserialize(deserializer)?;
    if value.is_null() {
        return Ok(None);
    }
    ObjectRef::parse(&value).map(Some).map_err(de::Error::custom)
}

fn de_refs<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<ObjectRef>, D::Error> {
    let values = Vec::<JsonValue>::deserialize(deserializer)?;
    values.iter().map(|value| ObjectRef::parse(value).map_err(de::Error::custom)).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn lookup(name: &str) -> Option<String> {
        (name == "SET").then(|| "from-env".to_owned())
    }

    #[test]
    fn a_value_source_resolves_inline_or_from_the_environment() {
        assert_eq!(ValueSource::inline("x").resolve("f", &lookup), Ok("x".to_owned()));
        assert_eq!(ValueSource::env("SET").resolve("f", &lookup), Ok("from-env".to_owned()));
        let unset = ValueSource::env("UNSET").resolve("f", &lookup);
        assert_eq!(unset, Err(ValueSourceError::Unset { variable: "UNSET".to_owned() }));
        assert_eq!(
            unset.map_err(|error| error.to_string()),
            Err("the environment variable 'UNSET' (valueFrom.env) is not set".to_owned())
        );
        let neither = ValueSource { value: None, value_from: None }.resolve("f", &lookup);
        assert_eq!(
            neither.map_err(|error| error.to_string()),
            Err("must be {value: \"...\"}, {valueFrom: {env: NAME}} or {valueFrom: {secretRef: {ref: Secret/NAME, \
                 key: KEY}}}"
                .to_owned())
        );
    }

    fn secret(reference: &str, key: Option<&str>) -> ValueSource {
        let secret = SecretRef { reference: reference.to_owned(), key: key.map(str::to_owned) };
        ValueSource { value: None, value_from: Some(ValueFrom::SecretRef(secret)) }
    }

    #[test]
    fn a_secret_ref_reads_the_variables_the_original_tries_in_its_order() {
        let source = secret("Secret/slack-oauth", Some("client_secret"));
        let Some(ValueFrom::SecretRef(reference)) = &source.value_from else { panic!("a secretRef") };
        assert_eq!(
            reference.variables("clientSecret"),
            [
                "GOONDAN_SECRET_SLACK_OAUTH_CLIENT_SECRET",
                "GOONDAN_SECRET_SLACK_OAUTH_CLIENTSECRET",
                "GOONDAN_SECRET_SLACK_OAUTH",
                "SECRET_SLACK_OAUTH_CLIENT_SECRET",
                "SECRET_SLACK_OAUTH_CLIENTSECRET",
                "SECRET_SLACK_OAUTH",
            ]
        );
        // Without a key, the field is the key; the duplicate is tried once.
        let Some(ValueFrom::SecretRef(keyless)) = secret(" Secret/db ", None).value_from else { panic!() };
        assert_eq!(
            keyless.variables("--pass word--"),
            ["GOONDAN_SECRET_DB_PASS_WORD", "GOONDAN_SECRET_DB", "SECRET_DB_PASS_WORD", "SECRET_DB"]
        );
        // The first set one wins, a later candidate included.
        let env = |name: &str| match name {
            "SECRET_SLACK_OAUTH" => Some("general".to_owned()),
            "GOONDAN_SECRET_SLACK_OAUTH" => Some("goondan".to_owned()),
            _ => None,
        };
        assert_eq!(source.resolve("clientSecret", &env), Ok("goondan".to_owned()));
        let unset = secret("Secret/other", Some("k")).resolve("f", &env);
        assert_eq!(
            unset.map_err(|e| e.to_string()),
            Err("the secret Secret/other (valueFrom.secretRef) is not set: set one of GOONDAN_SECRET_OTHER_K, \
                 GOONDAN_SECRET_OTHER_F, GOONDAN_SECRET_OTHER, SECRET_OTHER_K, SECRET_OTHER_F, SECRET_OTHER"
                .to_owned())
        );
        for bad in ["slack", "Secret/", "Secret/a/b", "Vault/x"] {
            assert_eq!(
                secret(bad, None).resolve("f", &env),
                Err(ValueSourceError::SecretRefShape { reference: bad.to_owned() }),
                "{bad}"
            );
        }
    }

    #[test]
    fn only_the_two_forms_read_from_json() {
        assert_eq!(ValueSource::from_json(&json!({"value": "x"})), Some(ValueSource::inline("x")));
        assert_eq!(ValueSource::from_json(&json!({"valueFrom": {"env": "K"}})), Some(ValueSource::env("K")));
        assert_eq!(
            ValueSource::from_json(&json!({"valueFrom": {"secretRef": {"ref": "Secret/s", "key": "k"}}})),
            Some(secret("Secret/s", Some("k")))
        );
        assert_eq!(
            ValueSource::from_json(&json!({"valueFrom": {"secretRef": {"ref": "Secret/s"}}})),
            Some(secret("Secret/s", None))
        );
        for other in [
            json!({"valueFrom": {"secretRef": {"ref": "Secret/s", "key": 1}}}),
            json!({"valueFrom": {"secretRef": {"key": "k"}}}),
            json!({"valueFrom": {"secretRef": {"ref": "Secret/s", "name": "n"}}}),
            json!({"valueFrom": {"env": "K", "secretRef": {"ref": "Secret/s"}}}),
            json!("plain"),
            json!({}),
            json!({"value": 1}),
            json!({"value": "x", "note": "y"}),
            json!({"value": "x", "valueFrom": {"env": "K"}}),
            json!({"valueFrom": {"env": "K", "default": "d"}}),
            json!({"valueFrom": {"env": 3}}),
            json!({"valueFrom": "K"}),
        ] {
            assert_eq!(ValueSource::from_json(&other), None, "{other}");
        }
    }

    #[test]
    fn a_scan_finds_every_variable_read_at_any_depth() {
        assert_eq!(ValueSource::env_variables_of(&json!({"valueFrom": {"env": "K", "extra": 1}}), "f"), ["K"]);
        assert!(ValueSource::env_variables_of(&json!({"value": "K"}), "f").is_empty());
        let tree = json!({
            "spec": {"apiKey": {"valueFrom": {"env": "ONE"}}, "list": [{"valueFrom": {"env": "TWO"}}, "x"]},
            "secrets": {"token": {"valueFrom": {"secretRef": {"ref": "Secret/bot"}}}},
            "nested": {"valueFrom": {"env": "THREE"}, "inner": {"valueFrom": {"env": "FOUR"}}},
            "number": {"valueFrom": {"env": 5}},
        });
        let found: Vec<String> = ValueSource::env_variables_within(&tree).into_iter().collect();
        assert_eq!(
            found,
            [
                "FOUR",
                "GOONDAN_SECRET_BOT",
                "GOONDAN_SECRET_BOT_TOKEN",
                "ONE",
                "SECRET_BOT",
                "SECRET_BOT_TOKEN",
                "THREE",
                "TWO"
            ]
        );
    }
}
