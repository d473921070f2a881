//! The one place an agent is assembled from a loaded bundle.
//!
//! [`assemble_tooling`] builds everything of an agent but its model — which
//! agent and instance, the working directory, the declared tools, the
//! registry with the handlers the caller installs, the executor, the turn,
//! step and toolCall middleware chains and the event sink — and
//! [`build_agent`] adds the model. `gdn run`, `gdn tool list`,
//! `gdn tool call` (and next the agent process and `gdn mcp serve`) all go
//! through them, so every front end sees the same catalog and calls through
//! the same pipeline.
//!
//! The runtime knows no tool or extension implementations: the caller
//! passes [`AgentPlugin`]s (`gdn` plugs in the native `@goondan/base` tools
//! and extensions, MCP and the JavaScript host), each installing itself
//! into the agent being assembled.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use goondan_config::{AgentSpec, AnyResource, Bundle, Resolved, Resource, Scoped, SwarmSpec, ToolCallScope};
use goondan_core::ids::{SpanIdGenerator, new_id, new_ordered_id, new_trace_id};
use goondan_core::{ConversationState, JsonObject, Message, ToolCall, ToolResult};
use goondan_llm::{ModelError, ModelParams, ModelSettings, build_provider};
use goondan_tools::assembly::AgentTools;
use goondan_tools::events::EventSink;
use goondan_tools::{
    AgentToolRuntime, BoxFuture, CallScope, Core, ExecutorPolicy, MiddlewareChain, RegistryError, ToolCatalog,
    ToolExecutor, ToolRegistry,
};

use crate::context::{EmitterTurn, EventEmitter, StepContext, StepOutcome, TurnContext, TurnOutcome};
use crate::extension::{
    AgentPlugin, ExtensionError, ExtensionSetup, PluginInstall, agent_extensions_in, install_extensions,
};
use crate::extension_state::ExtensionStateStore;
use crate::turn::Agent;

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
    /// What installs the agent's tool handlers and extensions, in order
    /// (see [`AgentPlugin`]); none by default: no handlers, and an agent
    /// with extensions of its own is refused.
    pub plugins: Vec<Arc<dyn AgentPlugin>>,
    /// The instance's extension-state directory (`<instance>/extensions`);
    /// `None` keeps extension state in memory only.
    pub extension_state: Option<PathBuf>,
    /// The swarm's agent-to-agent runtime (the `agents` tool's), when the
    /// agent runs under an orchestrator.
    pub agent_runtime: Option<Arc<dyn AgentToolRuntime>>,
    /// The instance's tasks (pending results that complete later), when an
    /// agent instance keeps them.
    pub tasks: Option<Arc<dyn goondan_tools::tasks::ToolTasks>>,
    /// The Swarm the agent runs in, whose `spec.sandbox` is its default
    /// (`None`: the one `gdn run --agent` would run).
    pub swarm: Option<String>,
}

impl AgentOptions {
    /// Options for the bundle's default agent and instance, reading the
    /// process environment, with no events and no tool handlers; set the
    /// fields that matter to the caller.
    pub fn new(events: Arc<dyn EventSink>) -> Self {
        Self {
            agent: None,
            instance_key: None,
            workdir: None,
            env: Arc::new(|name: &str| std::env::var(name).ok()),
            events,
            call_timeout: None,
            plugins: Vec::new(),
            extension_state: None,
            agent_runtime: None,
            tasks: None,
            swarm: None,
        }
    }
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
    /// An extension could not be installed.
    #[error("agent '{agent}': {source}")]
    Extension {
        /// The agent.
        agent: String,
        /// Why.
        #[source]
        source: ExtensionError,
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
    /// Its `spec.sandbox` names a path that cannot be resolved.
    #[error("agent '{agent}': spec.sandbox: {source}")]
    Sandbox {
        /// The agent.
        agent: String,
        /// Why.
        #[source]
        source: crate::sandbox::SandboxConfigError,
    },
}

/// The ids that place tool calls in a trace: shared by every call of a step.
#[derive(Debug, Clone)]
pub struct ScopeIds {
    /// The turn.
    pub turn_id: Arc<str>,
    /// The step.
    pub step_id: Arc<str>,
    /// The step's index within the turn.
    pub step_index: u32,
    /// The trace (32 hex digits).
    pub trace_id: Arc<str>,
    /// The step's span (16 hex digits).
    pub step_span_id: Arc<str>,
}

impl ScopeIds {
    /// Fresh ids for a call made outside any turn (`gdn tool call`, an MCP client).
    pub fn detached() -> Self {
        Self {
            turn_id: Arc::from(new_ordered_id()),
            step_id: Arc::from(new_ordered_id()),
            step_index: 0,
            trace_id: Arc::from(new_trace_id()),
            step_span_id: Arc::from(SpanIdGenerator::new().next_hex()),
        }
    }
}

/// An agent without its model: who it is, its tools, the executor, the
/// middleware chains and where events go.
pub struct AgentTooling {
    /// The agent's name.
    pub agent_name: Arc<str>,
    /// The instance's key.
    pub instance_key: Arc<str>,
    /// The instance's working directory.
    pub workdir: Arc<Path>,
    /// The tools the agent's `spec.tools` declares.
    pub tools: AgentTools,
    /// The executor (registry, toolCall middleware, policy, events).
    pub executor: Arc<ToolExecutor>,
    /// Step middleware; its core calls the model and runs the tool calls.
    pub step_middleware: MiddlewareChain<StepContext, StepOutcome>,
    /// Turn middleware; its core runs the steps.
    pub turn_middleware: MiddlewareChain<TurnContext, TurnOutcome>,
    /// Where turn and step events go (tool events go through the executor).
    pub events: Arc<dyn EventSink>,
    /// The swarm's agent-to-agent runtime, handed to tools in their context.
    pub agent_runtime: Option<Arc<dyn AgentToolRuntime>>,
    /// The instance's tasks, handed to tools in their context.
    pub tasks: Option<Arc<dyn goondan_tools::tasks::ToolTasks>>,
    /// The agent's system prompt (`prompt.system`, or its `systemRef` file
    /// as read at assembly): what the original hands extensions as
    /// `ctx.runtime.agent.prompt.system`.
    pub system_prompt: Option<Arc<str>>,
    /// The extension that puts the system prompt into the conversation
    /// itself (`context-message`). The model request then does not carry
    /// the prompt besides, so the model gets it once.
    pub prompt_in_conversation: Option<Arc<str>>,
}

impl std::fmt::Debug for AgentTooling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentTooling")
            .field("agent_name", &self.agent_name)
            .field("instance_key", &self.instance_key)
            .field("tools", &self.tools.iter().len())
            .finish_non_exhaustive()
    }
}

impl AgentTooling {
    /// Tooling with empty middleware chains; `executor` carries the registry
    /// and the toolCall middleware.
    pub fn new(
        agent_name: &str,
        instance_key: &str,
        workdir: &Path,
        tools: AgentTools,
        executor: ToolExecutor,
        events: Arc<dyn EventSink>,
    ) -> Self {
        Self {
            agent_name: Arc::from(agent_name),
            instance_key: Arc::from(instance_key),
            workdir: Arc::from(workdir),
            tools,
            executor: Arc::new(executor),
            step_middleware: MiddlewareChain::new(),
            turn_middleware: MiddlewareChain::new(),
            events,
            agent_runtime: None,
            tasks: None,
            system_prompt: None,
            prompt_in_conversation: None,
        }
    }

    /// Adds a toolCall layer. Only while the agent is being assembled
    /// (the executor is not shared yet); afterwards it returns false and
    /// changes nothing.
    pub fn register_tool_call_middleware(
        &mut self,
        name: impl Into<Arc<str>>,
        priority: i32,
        layer: Arc<goondan_tools::ToolCallMiddleware>,
    ) -> bool {
        match Arc::get_mut(&mut self.executor) {
            Some(executor) => {
                executor.register_middleware(name, priority, layer);
                true
            }
            None => false,
        }
    }

    /// The registry: every executable tool. It grows while the agent runs;
    /// each step's catalog is built from it as it stands.
    pub fn registry(&self) -> &Arc<ToolRegistry> {
        self.executor.registry()
    }

    /// The catalog a step starts from, before step middleware: the declared
    /// tools, then every dynamically registered one (spec 002 §1.2).
    pub fn base_catalog(&self) -> ToolCatalog {
        self.tools.step_catalog(self.registry())
    }

    /// The scope shared by the calls of one step.
    pub fn call_scope(&self, ids: &ScopeIds, message: Arc<Message>) -> Arc<CallScope> {
        Arc::new(CallScope {
            agent_name: Arc::clone(&self.agent_name),
            instance_key: Arc::clone(&self.instance_key),
            turn_id: Arc::clone(&ids.turn_id),
            step_id: Arc::clone(&ids.step_id),
            step_index: ids.step_index,
            message,
            workdir: Arc::clone(&self.workdir),
            trace_id: Arc::clone(&ids.trace_id),
            step_span_id: Arc::clone(&ids.step_span_id),
            runtime: self.agent_runtime.clone(),
            tasks: self.tasks.clone(),
        })
    }

    /// The catalog the model would get at the first step of a turn on
    /// `conversation`: the base catalog through the agent's step middleware,
    /// exactly as a step builds it, without calling the model. What the
    /// layers emit here is not saved.
    pub async fn preview_catalog(&self, conversation: ConversationState) -> ToolCatalog {
        let ids = ScopeIds::detached();
        let mut ctx = StepContext {
            agent_name: Arc::clone(&self.agent_name),
            instance_key: Arc::clone(&self.instance_key),
            events: EventEmitter::new(
                &Arc::new(EmitterTurn {
                    sink: Arc::clone(&self.events),
                    agent_name: Arc::clone(&self.agent_name),
                    instance_key: Arc::clone(&self.instance_key),
                    turn_id: Arc::clone(&ids.turn_id),
                    trace_id: Arc::clone(&ids.trace_id),
                    span_ids: Arc::new(SpanIdGenerator::new()),
                }),
                &ids.step_span_id,
                Some(&ids.step_id),
            ),
            turn_id: ids.turn_id,
            trace_id: ids.trace_id,
            step_index: 0,
            turn_input: Arc::from(""),
            conversation,
            tool_catalog: self.base_catalog(),
            metadata: JsonObject::new(),
        };
        let core = CatalogCore { seen: Mutex::new(None) };
        let on_panic = |layer: Option<&str>, message: String| {
            tracing::warn!(
                "step middleware {} panicked while previewing the catalog: {message}",
                layer.unwrap_or("core")
            );
            StepOutcome::default()
        };
        let _ = self.step_middleware.run_catching(&mut ctx, &core, &on_panic).await;
        let seen = core.seen.lock().map(|mut seen| seen.take()).unwrap_or_default();
        // A layer that did not call next: the model would have got no request.
        seen.unwrap_or_default()
    }

    /// Runs one call outside any turn — as the only call of a fresh step
    /// whose catalog is [`AgentTooling::preview_catalog`] — through the
    /// executor's whole pipeline.
    pub async fn call_tool(&self, name: &str, args: JsonObject) -> ToolResult {
        let catalog = Arc::new(self.preview_catalog(ConversationState::default()).await);
        let ids = ScopeIds::detached();
        let call = ToolCall::new(format!("call_{}", new_id().replace('-', "")), name, args);
        let message = Message::assistant_tool_calls(ids.step_id.to_string(), vec![call.clone()]);
        let scope = self.call_scope(&ids, Arc::new(message));
        self.executor.execute(call, &scope, &catalog).await
    }
}

/// A step core that records the catalog the model would get.
struct CatalogCore {
    seen: Mutex<Option<ToolCatalog>>,
}

impl Core<StepContext, StepOutcome> for CatalogCore {
    fn run<'a>(&'a self, ctx: &'a mut StepContext) -> BoxFuture<'a, StepOutcome> {
        if let Ok(mut seen) = self.seen.lock() {
            *seen = Some(ctx.tool_catalog.clone());
        }
        Box::pin(std::future::ready(StepOutcome::default()))
    }
}

/// The agent `options` select and the instance key it runs under: the
/// named agent or the bundle's default; the explicit key, else the Swarm's
/// `instanceKey`, else `default`.
pub fn identity(bundle: &Bundle, options: &AgentOptions) -> Result<(String, String), AgentBuildError> {
    let (agent, key) = resolve(bundle, options)?;
    Ok((agent.name().to_owned(), key))
}

fn resolve<'a>(bundle: &'a Bundle, options: &AgentOptions) -> Result<(Scoped<'a, AgentSpec>, String), AgentBuildError> {
    let agent = select_agent(bundle, options)?;
    let key = options
        .instance_key
        .clone()
        .or_else(|| swarm_of(bundle, options, agent.name()).and_then(|s| s.resource.spec.instance_key.clone()))
        .unwrap_or_else(|| "default".to_owned());
    Ok((agent, key))
}

/// The named agent (among its Swarm's agents when the Swarm is known: it
/// may be a dependency's; see [`Bundle::find_agent`]) or the default.
fn select_agent<'a>(bundle: &'a Bundle, options: &AgentOptions) -> Result<Scoped<'a, AgentSpec>, AgentBuildError> {
    match &options.agent {
        Some(name) => bundle.find_agent(name, options.swarm.as_deref()).ok_or_else(|| {
            let known: Vec<&str> = bundle.agents().map(|a| a.name()).collect();
            AgentBuildError::Agent(format!("no Agent named '{name}' in the bundle (agents: {})", known.join(", ")))
        }),
        None => bundle.default_agent().map_err(AgentBuildError::Agent),
    }
}

/// The Swarm the agent runs in: the one its process was given, else the
/// one [`Bundle::swarm_of_agent`] picks.
fn swarm_of<'a>(bundle: &'a Bundle, options: &AgentOptions, agent: &str) -> Option<Scoped<'a, SwarmSpec>> {
    options.swarm.as_deref().and_then(|name| bundle.swarm(name)).or_else(|| bundle.swarm_of_agent(agent))
}

/// Assembles the tooling of the agent `options` select: its declared tools
/// (its catalog), a registry with the handlers `options.plugins` provide
/// for those and for the bundle's other Tools (spec 002 §1.1; see
/// [`AgentTools::registry_tools`]), the executor (calls confined to the
/// step's catalog unless the agent's `spec.policy.toolCallScope` is
/// `registry`; `options.call_timeout`, `options.events`) and the
/// middleware and tools its extensions install through the plugins.
pub async fn assemble_tooling(bundle: &Bundle, options: &AgentOptions) -> Result<AgentTooling, AgentBuildError> {
    let (agent, instance_key) = resolve(bundle, options)?;
    tooling_of(bundle, agent, &instance_key, options, false).await
}

/// `warm_sandbox`: set the agent's sandbox up now, off the first command's
/// path (an agent that runs turns; not a one-off `tool list` or `call`).
async fn tooling_of(
    bundle: &Bundle,
    scoped: Scoped<'_, AgentSpec>,
    instance_key: &str,
    options: &AgentOptions,
    warm_sandbox: bool,
) -> Result<AgentTooling, AgentBuildError> {
    let agent = scoped.resource;
    // A dependency's agent resolves its references in its own package and
    // reads its prompt file from that package's directory.
    let home = bundle.package(scoped.scope).unwrap_or(bundle);
    let mut tools = AgentTools::for_agent_in(bundle, scoped.scope, agent);
    let workdir = options.workdir.clone().unwrap_or_else(|| bundle.root().to_path_buf());
    let workdir = std::fs::canonicalize(&workdir).unwrap_or(workdir);
    let sandbox =
        crate::sandbox::agent_sandbox(bundle, agent, options.swarm.as_deref(), &workdir, tools.loaded_files())
            .map_err(|source| AgentBuildError::Sandbox { agent: agent.name().to_owned(), source })?;
    let sandbox = Arc::new(sandbox);
    if warm_sandbox {
        sandbox.warm_up();
    }
    tools.set_sandbox(sandbox);
    let registry = ToolRegistry::new();
    let mut installs: Vec<Box<dyn PluginInstall>> = options.plugins.iter().map(|plugin| plugin.begin()).collect();
    for install in &mut installs {
        install
            .install_tools(&registry, &tools, &options.env)
            .map_err(|source| AgentBuildError::Tools { agent: agent.name().to_owned(), source })?;
    }
    // Past the step's catalog only under the agent's explicit policy
    // (spec 002 §7.1): `spec.policy.toolCallScope: registry`.
    let allow_registry_calls = agent.spec.policy.tool_call_scope == ToolCallScope::Registry;
    if allow_registry_calls {
        tracing::debug!(
            "agent '{}': toolCallScope registry: calls may reach the {} tools of its registry outside the catalog",
            agent.name(),
            registry.len()
        );
    }
    let executor = ToolExecutor::new(Arc::new(registry))
        .with_policy(ExecutorPolicy { allow_registry_calls, call_timeout: options.call_timeout })
        .with_events(Arc::clone(&options.events));
    let mut tooling =
        AgentTooling::new(agent.name(), instance_key, &workdir, tools, executor, Arc::clone(&options.events));
    tooling.agent_runtime.clone_from(&options.agent_runtime);
    tooling.tasks.clone_from(&options.tasks);
    // Read before the extensions install: context-message builds its
    // system message from it.
    tooling.system_prompt = system_prompt(home.root(), agent)?.map(Arc::from);
    let extensions = agent_extensions_in(bundle, scoped.scope, agent);
    if !extensions.is_empty() {
        let state = Arc::new(match &options.extension_state {
            Some(dir) => ExtensionStateStore::at(dir.clone()),
            None => ExtensionStateStore::in_memory(),
        });
        let mut setup = ExtensionSetup { tooling: &mut tooling, extensions: &extensions, state, env: &options.env };
        install_extensions(&mut setup, &mut installs)
            .await
            .map_err(|source| AgentBuildError::Extension { agent: agent.name().to_owned(), source })?;
    }
    Ok(tooling)
}

/// Builds the agent `options` select: its tooling and its model.
pub async fn build_agent(bundle: &Bundle, options: &AgentOptions) -> Result<Agent, AgentBuildError> {
    let (agent, instance_key) = resolve(bundle, options)?;
    let name = agent.name().to_owned();
    let model_error = |source| AgentBuildError::Model { agent: name.clone(), source };

    let (model_scope, model) = match bundle.resolve_from(agent.scope, &agent.spec.model_config.model_ref) {
        Ok(Resolved { scope, resource: AnyResource::Model(model) }) => (scope, model),
        _ => {
            return Err(model_error(ModelError::Config(format!(
                "its model {} is not defined",
                agent.spec.model_config.model_ref
            ))));
        }
    };
    let lookup = |variable: &str| (options.env)(variable);
    let model_root = bundle.package(model_scope).map_or_else(|| bundle.root(), Bundle::root);
    let settings = ModelSettings::from_spec(&model.spec, &lookup, model_root).map_err(model_error)?;
    let provider = build_provider(&settings).map_err(model_error)?;
    let params: ModelParams = serde_json::from_value(serde_json::Value::Object(agent.spec.model_config.params.clone()))
        .map_err(|e| model_error(ModelError::Config(format!("modelConfig.params: {e}"))))?;
    let max_steps_per_turn = swarm_of(bundle, options, &name)
        .and_then(|s| s.resource.spec.policy.max_steps_per_turn)
        .unwrap_or(Agent::DEFAULT_MAX_STEPS_PER_TURN);

    let tooling = tooling_of(bundle, agent, &instance_key, options, true).await?;
    // An extension that sends the prompt as a message of the conversation
    // replaces the request's own copy; otherwise the model would get it twice.
    let system_prompt = match &tooling.prompt_in_conversation {
        Some(extension) => {
            tracing::debug!("agent '{name}': extension '{extension}' sends the system prompt in the conversation");
            None
        }
        None => tooling.system_prompt.as_deref().map(str::to_owned),
    };
    let mut built = Agent::new(tooling, provider);
    built.model = crate::turn::ModelIdentity {
        provider: Arc::from(settings.kind.semconv_name()),
        model: Arc::from(settings.model.as_str()),
    };
    built.system_prompt = system_prompt;
    built.params = params;
    built.max_steps_per_turn = max_steps_per_turn;
    built.step_result_budget = crate::result_budget::StepResultBudget::from_setting(
        (options.env)(crate::result_budget::StepResultBudget::ENV_VAR).as_deref(),
    );
    Ok(built)
}

fn system_prompt(root: &Path, agent: &Resource<AgentSpec>) -> Result<Option<String>, AgentBuildError> {
    let Some(prompt) = &agent.spec.prompt else { return Ok(None) };
    if let Some(system) = &prompt.system {
        return Ok(Some(system.clone()));
    }
    let Some(file) = &prompt.system_ref else { return Ok(None) };
    let refused =
        |message: String| AgentBuildError::Prompt { agent: agent.name().to_owned(), path: root.join(file), message };
    // The same rules as validation, again here: the file is read now, and a
    // link may have changed since (a prompt is sent to the model provider,
    // so a file outside the bundle must never become one).
    let path = goondan_config::files::resolve_inside(root, file).map_err(|e| refused(e.to_string()))?;
    let bytes =
        goondan_config::files::read_regular_file(&path, MAX_SYSTEM_PROMPT_BYTES).map_err(|e| refused(e.to_string()))?;
    String::from_utf8(bytes).map(Some).map_err(|e| refused(format!("not UTF-8 text: {e}")))
}

/// The largest system prompt file read, in bytes (the bundle file's own limit).
pub const MAX_SYSTEM_PROMPT_BYTES: u64 = goondan_config::bundle::MAX_FILE_BYTES;

#[cfg(test)]
mod tests {
    use super::*;

    fn agent_in(text: &str) -> Resource<AgentSpec> {
        let report = goondan_config::load_from_str(text, "goondan.yaml", None, PathBuf::from("goondan.yaml"));
        let agent = report.bundle.as_ref().and_then(|bundle| bundle.agents().next().cloned());
        agent.unwrap_or_else(|| panic!("no agent: {:?}", report.diagnostics))
    }

    fn with_system_ref(system_ref: &str) -> Resource<AgentSpec> {
        agent_in(&format!(
            "apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {{name: m}}\nspec: {{provider: openai, model: x}}\n---\n\
             apiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  modelConfig: {{modelRef: Model/m}}\n  \
             prompt: {{systemRef: '{system_ref}'}}\n"
        ))
    }

    /// The runtime refuses a prompt file outside the bundle even when
    /// validation did not see it (a link changed since, or a bundle loaded
    /// without file checks), and never reads a device whole.
    #[test]
    fn a_system_prompt_outside_the_bundle_or_not_a_file_is_refused() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let root = dir.path().join("bundle");
        std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join("secret"), "top secret").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(root.join("p.md"), "be brief").unwrap_or_else(|e| panic!("{e}"));
        let read = |reference: &str| system_prompt(&root, &with_system_ref(reference));
        assert_eq!(read("p.md").ok().flatten().as_deref(), Some("be brief"));
        let refused = read("../secret").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("outside the bundle"), "{refused}");
        assert!(read("/dev/zero").is_err());
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(dir.path().join("secret"), root.join("link.md"))
                .unwrap_or_else(|e| panic!("{e}"));
            let refused = read("link.md").err().map(|e| e.to_string()).unwrap_or_default();
            assert!(refused.contains("outside the bundle"), "{refused}");
            std::os::unix::fs::symlink("/dev/zero", root.join("zero.md")).unwrap_or_else(|e| panic!("{e}"));
            assert!(read("zero.md").is_err(), "a link to a device inside the bundle is still no file");
        }
    }
}
