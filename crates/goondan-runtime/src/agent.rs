//! Assembling an [`AgentLoop`] from a loaded bundle: the agent, its model,
//! system prompt, parameters, step limit, tools and executor.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use goondan_config::{AgentSpec, AnyResource, Bundle, Resolved, Resource};
use goondan_llm::{ModelError, ModelParams, ModelSettings, build_provider};
use goondan_tools::assembly::AgentTools;
use goondan_tools::events::EventSink;
use goondan_tools::{ExecutorPolicy, MiddlewareChain, RegistryError, ToolExecutor, ToolRegistry};

use crate::turn::AgentLoop;

/// The spec's default `maxStepsPerTurn`.
pub const DEFAULT_MAX_STEPS_PER_TURN: u32 = 32;

/// Reads an environment variable (the process environment, plus any `.env` file).
pub type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// How to build an agent beyond what the bundle says.
#[derive(Clone)]
pub struct AgentOptions {
    /// The agent; the bundle's default agent when `None`.
    pub agent: Option<String>,
    /// The instance key; the Swarm's `instanceKey` or `default` when `None`.
    pub instance_key: Option<String>,
    /// The working directory; the bundle's directory when `None`.
    pub workdir: Option<PathBuf>,
    /// Environment lookup for API keys and tool settings.
    pub env: EnvLookup,
    /// Where events go.
    pub events: Arc<dyn EventSink>,
    /// The deadline of one tool call.
    pub call_timeout: Option<Duration>,
}

/// Why an agent could not be built.
#[derive(Debug, thiserror::Error)]
pub enum AgentBuildError {
    /// No such agent, or no default.
    #[error("{0}")]
    Agent(String),
    /// The agent's model.
    #[error("agent '{agent}': {source}")]
    Model {
        /// The agent.
        agent: String,
        /// What was wrong.
        #[source]
        source: ModelError,
    },
    /// The system prompt file.
    #[error("agent '{agent}': cannot read the system prompt {path}: {message}")]
    Prompt {
        /// The agent.
        agent: String,
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A tool could not be registered.
    #[error("agent '{agent}': {source}")]
    Tools {
        /// The agent.
        agent: String,
        /// Why.
        #[source]
        source: RegistryError,
    },
}

/// The agent `options` select and the instance key it runs under: the
/// named agent or the bundle's default; the explicit key, else the Swarm's
/// `instanceKey`, else `default`.
pub fn identity(bundle: &Bundle, options: &AgentOptions) -> Result<(String, String), AgentBuildError> {
    let (agent, key) = resolve(bundle, options)?;
    Ok((agent.name().to_owned(), key))
}

fn resolve<'a>(
    bundle: &'a Bundle,
    options: &AgentOptions,
) -> Result<(&'a Resource<AgentSpec>, String), AgentBuildError> {
    let agent = select_agent(bundle, options)?;
    let key = options
        .instance_key
        .clone()
        .or_else(|| swarm_of(bundle, agent.name()).and_then(|s| s.spec.instance_key.clone()))
        .unwrap_or_else(|| "default".to_owned());
    Ok((agent, key))
}

/// An agent's tools: the ones its `spec.tools` declares, and a registry
/// holding the handlers this build has for them.
#[derive(Debug)]
pub struct AgentToolSet {
    /// The agent.
    pub agent_name: String,
    /// The instance key it runs under (see [`identity`]).
    pub instance_key: String,
    /// The declared tools, one entry per export.
    pub tools: AgentTools,
    /// The executable tools.
    pub registry: ToolRegistry,
}

/// The tools of the agent `options` select, without building its model —
/// for commands that inspect or call tools directly.
pub fn tool_set(bundle: &Bundle, options: &AgentOptions) -> Result<AgentToolSet, AgentBuildError> {
    let (agent, instance_key) = resolve(bundle, options)?;
    tools_of(bundle, agent, instance_key, options)
}

fn tools_of(
    bundle: &Bundle,
    agent: &Resource<AgentSpec>,
    instance_key: String,
    options: &AgentOptions,
) -> Result<AgentToolSet, AgentBuildError> {
    let tools = AgentTools::for_agent(bundle, agent);
    let registry = ToolRegistry::new();
    let base_settings = Arc::new(goondan_base::BaseSettings::from_lookup(|v| (options.env)(v)));
    goondan_base::register_native_tools(&registry, &tools, &base_settings)
        .map_err(|source| AgentBuildError::Tools { agent: agent.name().to_owned(), source })?;
    Ok(AgentToolSet { agent_name: agent.name().to_owned(), instance_key, tools, registry })
}

fn select_agent<'a>(bundle: &'a Bundle, options: &AgentOptions) -> Result<&'a Resource<AgentSpec>, AgentBuildError> {
    match &options.agent {
        Some(name) => bundle.agent(name).ok_or_else(|| {
            let known: Vec<&str> = bundle.agents().map(|a| a.name()).collect();
            AgentBuildError::Agent(format!("no Agent named '{name}' in the bundle (agents: {})", known.join(", ")))
        }),
        None => bundle.default_agent().map_err(AgentBuildError::Agent),
    }
}

fn swarm_of<'a>(bundle: &'a Bundle, agent: &str) -> Option<&'a Resource<goondan_config::SwarmSpec>> {
    bundle.swarms().find(|s| s.spec.agents.iter().any(|a| a.kind == "Agent" && a.name == agent))
}

/// Builds the agent loop for `options.agent` of `bundle`.
pub fn build_agent(bundle: &Bundle, options: &AgentOptions) -> Result<AgentLoop, AgentBuildError> {
    let (agent, instance_key) = resolve(bundle, options)?;
    let name = agent.name().to_owned();
    let model_error = |source| AgentBuildError::Model { agent: name.clone(), source };

    let model = match bundle.resolve(&agent.spec.model_config.model_ref) {
        Ok(Resolved { resource: AnyResource::Model(model), .. }) => model,
        _ => {
            return Err(model_error(ModelError::Config(format!(
                "its model {} is not defined",
                agent.spec.model_config.model_ref
            ))));
        }
    };
    let lookup = |variable: &str| (options.env)(variable);
    let settings = ModelSettings::from_spec(&model.spec, &lookup, bundle.root()).map_err(model_error)?;
    let provider = build_provider(&settings).map_err(model_error)?;
    let params: ModelParams = serde_json::from_value(serde_json::Value::Object(agent.spec.model_config.params.clone()))
        .map_err(|e| model_error(ModelError::Config(format!("modelConfig.params: {e}"))))?;

    let system_prompt = system_prompt(bundle.root(), agent)?;
    let max_steps_per_turn =
        swarm_of(bundle, &name).and_then(|s| s.spec.policy.max_steps_per_turn).unwrap_or(DEFAULT_MAX_STEPS_PER_TURN);
    let workdir = options.workdir.clone().unwrap_or_else(|| bundle.root().to_path_buf());
    let workdir = std::fs::canonicalize(&workdir).unwrap_or(workdir);

    let AgentToolSet { instance_key, tools, registry, .. } = tools_of(bundle, agent, instance_key, options)?;
    let executor = ToolExecutor::new(Arc::new(registry))
        .with_policy(ExecutorPolicy { allow_registry_calls: false, call_timeout: options.call_timeout })
        .with_events(Arc::clone(&options.events));

    Ok(AgentLoop {
        agent_name: Arc::from(name.as_str()),
        instance_key: Arc::from(instance_key),
        workdir: Arc::from(workdir.as_path()),
        system_prompt,
        params,
        max_steps_per_turn,
        max_parallel_tool_calls: 8,
        max_malformed_replies: 3,
        provider,
        tools,
        executor: Arc::new(executor),
        step_middleware: MiddlewareChain::new(),
        turn_middleware: MiddlewareChain::new(),
        events: Arc::clone(&options.events),
    })
}

fn system_prompt(root: &Path, agent: &Resource<AgentSpec>) -> Result<Option<String>, AgentBuildError> {
    let Some(prompt) = &agent.spec.prompt else { return Ok(None) };
    if let Some(system) = &prompt.system {
        return Ok(Some(system.clone()));
    }
    let Some(file) = &prompt.system_ref else { return Ok(None) };
    let path = root.join(file);
    std::fs::read_to_string(&path).map(Some).map_err(|e| AgentBuildError::Prompt {
        agent: agent.name().to_owned(),
        path,
        message: e.to_string(),
    })
}
