//! Extensions and the plugin seam: what an agent's `spec.extensions[]` asks
//! for, and the one way a build installs tools and extensions into an agent
//! being assembled.
//!
//! The runtime runs no extension code and implements no tool itself.
//! [`agent_extensions`] resolves an agent's references to
//! [`AgentExtension`]s (module, scope, merged config). A build hands
//! [`AgentPlugin`]s to the assembly (`AgentOptions::plugins`); for each agent
//! being assembled every plugin begins a [`PluginInstall`], which registers
//! handlers for the agent's declared tools, claims the extensions it
//! implements and installs each claimed one into an [`ExtensionSetup`] — the
//! agent's tooling, with its turn, step and toolCall chains and its registry
//! still open for layers and tools, and the instance's extension state. What
//! one agent's install needs to keep between those steps (the JavaScript
//! host its tools and extensions share) is the install's own state, dropped
//! once the agent is assembled. `gdn` plugs in the native tools, the MCP
//! client, the native base extensions and the JavaScript host this way.
//! Everything a plugin registers goes through the same chains, catalog,
//! validation and executor as everything else.
use std::path::Path;
use std::sync::Arc;

use goondan_config::{AgentSpec, AnyResource, Bundle, PackageScope, Resolved, Resource};
use goondan_core::JsonObject;
use goondan_tools::assembly::AgentTools;
use goondan_tools::{BoxFuture, RegistryError, ToolRegistry};

use crate::agent::{AgentTooling, EnvLookup};
use crate::extension_state::ExtensionStateStore;

/// One extension an agent loads, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentExtension {
    /// The Extension resource's name (`metadata.name`).
    pub name: String,
    /// The bundle itself, or the `@goondan/base` package.
    pub scope: PackageScope,
    /// The module: absolute for the bundle's own extensions; for a package's,
    /// `spec.entry` as the package declares it.
    pub entry: Arc<Path>,
    /// The Extension's `spec.config` with the agent's per-reference `config`
    /// shallow-merged over it: what `register(api, config)` receives.
    pub config: JsonObject,
}

/// The base package's extension that `Agent.spec.requiredTools` implies.
pub const REQUIRED_TOOLS_GUARD: &str = "required-tools-guard";

/// The extensions `agent` references, in order; references that do not
/// resolve are left out (the loader reports them).
///
/// As in the original, an agent's `spec.requiredTools` is enforced by the
/// `required-tools-guard` extension: its names are added (without
/// duplicates) to the `requiredTools` of the agent's `required-tools-guard`
/// reference, or, when it has none, `@goondan/base`'s
/// `Extension/required-tools-guard` is appended with them.
pub fn agent_extensions(bundle: &Bundle, agent: &Resource<AgentSpec>) -> Vec<AgentExtension> {
    agent_extensions_in(bundle, PackageScope::Local, agent)
}

/// [`agent_extensions`] of an agent of the package `within` (in `bundle`'s
/// terms): its references resolve in its own package
/// ([`Bundle::resolve_from`]), their scopes in `bundle`'s terms.
pub fn agent_extensions_in(bundle: &Bundle, within: PackageScope, agent: &Resource<AgentSpec>) -> Vec<AgentExtension> {
    let mut found = referenced_extensions(bundle, within, agent);
    if !agent.spec.required_tools.is_empty() {
        add_required_tools(bundle, &agent.spec.required_tools, &mut found);
    }
    found
}

fn referenced_extensions(bundle: &Bundle, within: PackageScope, agent: &Resource<AgentSpec>) -> Vec<AgentExtension> {
    let mut found = Vec::with_capacity(agent.spec.extensions.len());
    for reference in &agent.spec.extensions {
        let Ok(Resolved { scope, resource: AnyResource::Extension(extension) }) =
            bundle.resolve_from(within, &reference.reference)
        else {
            continue;
        };
        let entry = match scope {
            PackageScope::Local => goondan_tools::assembly::entry_path(bundle.root(), &extension.spec.entry),
            PackageScope::Dependency(_) => goondan_tools::assembly::package_entry(bundle, scope, &extension.spec.entry)
                .unwrap_or_else(|| Arc::from(Path::new(&extension.spec.entry))),
            PackageScope::Base => Arc::from(Path::new(&extension.spec.entry)),
        };
        let mut config = extension.spec.config.clone();
        if let Some(overrides) = &reference.config {
            for (key, value) in overrides {
                config.insert(key.clone(), value.clone());
            }
        }
        found.push(AgentExtension { name: extension.name().to_owned(), scope, entry, config });
    }
    found
}

fn add_required_tools(bundle: &Bundle, required: &[String], found: &mut Vec<AgentExtension>) {
    // The original matches the guard by name, whichever package holds it.
    let index = match found.iter().position(|extension| extension.name == REQUIRED_TOOLS_GUARD) {
        Some(index) => index,
        None => {
            let reference = goondan_core::ObjectRef {
                kind: "Extension".to_owned(),
                name: REQUIRED_TOOLS_GUARD.to_owned(),
                package: Some(goondan_config::BASE_PACKAGE.to_owned()),
                api_version: None,
            };
            let Ok(Resolved { scope, resource: AnyResource::Extension(extension) }) = bundle.resolve(&reference) else {
                tracing::warn!(
                    "Extension/{REQUIRED_TOOLS_GUARD} is missing from the base package; spec.requiredTools is not enforced"
                );
                return;
            };
            found.push(AgentExtension {
                name: REQUIRED_TOOLS_GUARD.to_owned(),
                scope,
                entry: Arc::from(Path::new(&extension.spec.entry)),
                config: extension.spec.config.clone(),
            });
            found.len() - 1
        }
    };
    let config = &mut found[index].config;
    // The configured names first (trimmed, empty ones dropped, as the
    // original merges them; anything else is left for the extension to
    // refuse), then the agent's.
    let mut names: Vec<serde_json::Value> = Vec::new();
    if let Some(serde_json::Value::Array(configured)) = config.get("requiredTools") {
        for value in configured {
            match value {
                serde_json::Value::String(name) if name.trim().is_empty() => {}
                serde_json::Value::String(name) => names.push(serde_json::Value::from(name.trim())),
                other => names.push(other.clone()),
            }
        }
    }
    names.extend(required.iter().map(|name| serde_json::Value::from(name.trim())));
    let mut seen = std::collections::HashSet::new();
    names.retain(|name| name.as_str().is_none_or(|name| seen.insert(name.to_owned())));
    config.insert("requiredTools".to_owned(), serde_json::Value::Array(names));
}

/// What a [`PluginInstall`] installs extensions into.
pub struct ExtensionSetup<'a> {
    /// The agent's tooling: register turn and step layers on its chains,
    /// toolCall layers with [`AgentTooling::register_tool_call_middleware`],
    /// tools in its registry.
    pub tooling: &'a mut AgentTooling,
    /// The extensions to install, in the agent's order (never empty).
    pub extensions: &'a [AgentExtension],
    /// Each extension's durable state for this instance (`api.state`).
    pub state: Arc<ExtensionStateStore>,
    /// The agent's environment.
    pub env: &'a EnvLookup,
}

impl std::fmt::Debug for ExtensionSetup<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtensionSetup")
            .field("agent", &self.tooling.agent_name)
            .field("extensions", &self.extensions)
            .finish_non_exhaustive()
    }
}

/// Why an agent's extensions could not be installed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("extension '{extension}': {message}")]
pub struct ExtensionError {
    /// The extension.
    pub extension: String,
    /// A stable code: `E_EXT_LOAD` (the module could not be loaded or has no
    /// `register`), `E_EXT_INIT` (`register` failed), `E_EXT_UNSUPPORTED`
    /// (this build cannot run it), or the script host's code.
    pub code: String,
    /// What went wrong.
    pub message: String,
}

impl ExtensionError {
    /// An error with `code`.
    pub fn new(extension: impl Into<String>, code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { extension: extension.into(), code: code.into(), message: message.into() }
    }
}

/// A part of a build that installs itself into every agent being assembled:
/// tool handlers, extensions, or both.
pub trait AgentPlugin: Send + Sync {
    /// Begins installing into one agent being assembled; the install lives
    /// until that agent is assembled.
    fn begin(&self) -> Box<dyn PluginInstall>;
}

/// A plugin whose install into one agent needs nothing but a copy of the
/// plugin (native tools and extensions that keep no per-agent state) is
/// its own [`PluginInstall`]: each agent's install begins as a clone.
impl<T: PluginInstall + Clone + Sync + 'static> AgentPlugin for T {
    fn begin(&self) -> Box<dyn PluginInstall> {
        Box::new(self.clone())
    }
}

/// One plugin's install into one agent being assembled. The assembly calls
/// [`install_tools`](Self::install_tools) first (every plugin, in order),
/// then for each of the agent's extensions, in the agent's order, the first
/// plugin that [`claims`](Self::claims) it installs it, and last every
/// plugin [`finish`](Self::finish)es (only when the agent has extensions).
pub trait PluginInstall: Send {
    /// Registers handlers for the tools it implements among the agent's
    /// registry tools ([`AgentTools::registry_tools`]: the declared ones,
    /// then the bundle's others, which the catalog does not offer). The
    /// undeclared ones must cost nothing until called: register a handler,
    /// start nothing.
    fn install_tools(
        &mut self,
        _registry: &ToolRegistry,
        _tools: &AgentTools,
        _env: &EnvLookup,
    ) -> Result<(), RegistryError> {
        Ok(())
    }

    /// Whether this plugin implements `extension`.
    fn claims(&self, _extension: &AgentExtension) -> bool {
        false
    }

    /// Installs `extension`, which it claimed.
    fn install_extension<'a>(
        &'a mut self,
        _setup: &'a mut ExtensionSetup<'_>,
        _extension: &'a AgentExtension,
    ) -> BoxFuture<'a, Result<(), ExtensionError>> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Completes what it installs together (after every extension was
    /// offered): a JavaScript host loads its modules in one go.
    fn finish<'a>(&'a mut self, _setup: &'a mut ExtensionSetup<'_>) -> BoxFuture<'a, Result<(), ExtensionError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// Installs `setup.extensions` through the plugins' `installs`: each by the
/// first that claims it. A base-package extension nobody claims is left out
/// with a warning (the agent runs without it, as with a build that has not
/// implemented it yet); one of the bundle's own nobody claims fails the
/// agent (`E_EXT_UNSUPPORTED`), rather than run it without the middleware
/// it was written for.
pub(crate) async fn install_extensions(
    setup: &mut ExtensionSetup<'_>,
    installs: &mut [Box<dyn PluginInstall>],
) -> Result<(), ExtensionError> {
    let extensions = setup.extensions;
    for extension in extensions {
        match installs.iter_mut().find(|install| install.claims(extension)) {
            Some(install) => install.install_extension(setup, extension).await?,
            None if extension.scope == PackageScope::Base => tracing::warn!(
                "agent '{}': extension '{}' of @goondan/base is not implemented by this build yet; the agent runs without it",
                setup.tooling.agent_name,
                extension.name
            ),
            None => {
                return Err(ExtensionError::new(
                    &extension.name,
                    "E_EXT_UNSUPPORTED",
                    "this build of the runtime runs no extensions of this kind",
                ));
            }
        }
    }
    for install in installs {
        install.finish(setup).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use goondan_core::sync::LockUnpoisoned;

    use super::*;

    fn extensions_of(yaml: &str) -> Vec<AgentExtension> {
        let text = format!(
            "apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {{name: m}}\nspec: {{provider: openai, model: x}}\n---\n\
             apiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  modelConfig: {{modelRef: Model/m}}\n{yaml}"
        );
        let report = goondan_config::load_from_str(&text, "goondan.yaml", None, PathBuf::from("goondan.yaml"));
        let bundle = report.bundle.unwrap_or_else(|| panic!("{:?}", report.diagnostics));
        let agent = bundle.agents().next().cloned().unwrap_or_else(|| panic!("no agent"));
        agent_extensions(&bundle, &agent)
    }

    /// As the original's agent plan does: `spec.requiredTools` adds the
    /// base package's guard, or merges into the agent's own reference.
    #[test]
    fn required_tools_imply_the_guard_or_merge_into_its_config() {
        let found = extensions_of("  requiredTools: [x__send]\n");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].name, REQUIRED_TOOLS_GUARD);
        assert_eq!(found[0].scope, PackageScope::Base);
        assert_eq!(found[0].config["requiredTools"], serde_json::json!(["x__send"]));
        assert_eq!(found[0].config["errorMessage"], "");

        let found = extensions_of(
            "  requiredTools: [x__send, ' y__post ']\n  extensions:\n    - ref: {kind: Extension, name: required-tools-guard, package: \"@goondan/base\"}\n      config: {requiredTools: [' y__post', '', z__mail], errorMessage: hi}\n    - ref: {kind: Extension, name: logging, package: \"@goondan/base\"}\n",
        );
        assert_eq!(found.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), [REQUIRED_TOOLS_GUARD, "logging"]);
        assert_eq!(found[0].config["requiredTools"], serde_json::json!(["y__post", "z__mail", "x__send"]));
        assert_eq!(found[0].config["errorMessage"], "hi");

        assert!(extensions_of("  tools: []\n").is_empty());
    }

    /// Records what the assembly asks of it; claims the extensions named.
    struct Claiming {
        name: &'static str,
        claims: &'static [&'static str],
        log: Arc<std::sync::Mutex<Vec<String>>>,
    }

    impl Claiming {
        fn note(&self, what: String) {
            self.log.lock_unpoisoned().push(format!("{}:{what}", self.name));
        }
    }

    impl AgentPlugin for Claiming {
        fn begin(&self) -> Box<dyn PluginInstall> {
            self.note("begin".into());
            Box::new(Claiming { name: self.name, claims: self.claims, log: Arc::clone(&self.log) })
        }
    }

    impl PluginInstall for Claiming {
        fn install_tools(&mut self, _: &ToolRegistry, _: &AgentTools, _: &EnvLookup) -> Result<(), RegistryError> {
            self.note("tools".into());
            Ok(())
        }

        fn claims(&self, extension: &AgentExtension) -> bool {
            self.claims.contains(&extension.name.as_str())
        }

        fn install_extension<'a>(
            &'a mut self,
            _: &'a mut ExtensionSetup<'_>,
            extension: &'a AgentExtension,
        ) -> BoxFuture<'a, Result<(), ExtensionError>> {
            self.note(extension.name.clone());
            Box::pin(std::future::ready(Ok(())))
        }

        fn finish<'a>(&'a mut self, _: &'a mut ExtensionSetup<'_>) -> BoxFuture<'a, Result<(), ExtensionError>> {
            self.note("finish".into());
            Box::pin(std::future::ready(Ok(())))
        }
    }

    /// Every plugin installs tools, in order; each extension goes, in the
    /// agent's order, to the first plugin that claims it; a base extension
    /// nobody claims is skipped (with a warning), one of the bundle's own
    /// fails the agent; every plugin finishes last.
    #[tokio::test]
    async fn plugins_install_tools_then_claimed_extensions_in_the_agents_order() {
        let items: String = ["logging", "mcp", "message-window"]
            .iter()
            .map(|name| format!("    - {{kind: Extension, name: {name}, package: '@goondan/base'}}\n"))
            .collect();
        let text = format!(
            "apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {{name: m}}\nspec: {{provider: openai, model: x}}\n---\n\
             apiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  modelConfig: {{modelRef: Model/m}}\n  \
             extensions:\n{items}"
        );
        let report = goondan_config::load_from_str(&text, "goondan.yaml", None, PathBuf::from("goondan.yaml"));
        let bundle = report.bundle.unwrap_or_else(|| panic!("{:?}", report.diagnostics));
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut options = crate::agent::AgentOptions::new(Arc::new(goondan_tools::NoopEventSink));
        options.plugins = vec![
            Arc::new(Claiming { name: "A", claims: &["mcp", "logging"], log: Arc::clone(&log) }),
            Arc::new(Claiming { name: "B", claims: &["logging"], log: Arc::clone(&log) }),
        ];
        let mut tooling =
            crate::agent::assemble_tooling(&bundle, &options).await.unwrap_or_else(|e| panic!("assemble: {e}"));
        let seen = std::mem::take(&mut *log.lock_unpoisoned());
        assert_eq!(seen, ["A:begin", "B:begin", "A:tools", "B:tools", "A:logging", "A:mcp", "A:finish", "B:finish"]);

        let local = AgentExtension {
            name: "mine".into(),
            scope: PackageScope::Local,
            entry: Arc::from(Path::new("/bundle/mine.ts")),
            config: JsonObject::new(),
        };
        let extensions = [local];
        let env: EnvLookup = Arc::new(|_: &str| None);
        let mut setup = ExtensionSetup {
            tooling: &mut tooling,
            extensions: &extensions,
            state: Arc::new(ExtensionStateStore::in_memory()),
            env: &env,
        };
        let mut installs: Vec<Box<dyn PluginInstall>> = options.plugins.iter().map(|plugin| plugin.begin()).collect();
        let refused = install_extensions(&mut setup, &mut installs).await.err().map(|e| (e.extension, e.code));
        assert_eq!(refused, Some(("mine".to_owned(), "E_EXT_UNSUPPORTED".to_owned())));
    }
}
