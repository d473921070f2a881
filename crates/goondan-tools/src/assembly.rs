//! From a loaded bundle to what the Tool system runs on: catalog items for an
//! agent's `spec.tools`, the bundle's other Tools its registry also holds
//! (spec 002 §1.1), and the per-step catalog that adds dynamic tools.
//!
//! Items are built once per agent and cloned per step; clones share their
//! compiled parameter schemas, so a step never recompiles a schema. Tools
//! registered while the agent runs join the next step's catalog, because
//! each step reads the registry's current snapshot.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use goondan_config::{AgentSpec, AnyResource, Bundle, PackageScope, Resource, ToolExport, ToolSpec};
use goondan_core::JsonObject;
use goondan_core::naming::build_tool_name;

use crate::catalog::{ToolCatalog, ToolCatalogItem, ToolSource};
use crate::registry::ToolRegistry;

/// One export of one Tool resource, ready to be offered.
#[derive(Debug, Clone)]
pub struct ConfigTool {
    /// The package the Tool lives in.
    pub scope: PackageScope,
    /// The Tool resource's name.
    pub tool: Arc<str>,
    /// The export's name.
    pub export: Arc<str>,
    /// The catalog item (`tool__export`).
    pub item: ToolCatalogItem,
    /// The Tool's module (`spec.entry`) as an absolute path, for tools of
    /// the bundle's own package; `None` for the built-in `@goondan/base`
    /// tools, whose handlers are native. A script host runs the rest.
    pub entry: Option<Arc<Path>>,
    /// The `config` of the agent's `spec.tools` item that names the Tool
    /// (e.g. `allowConfigWrites` for `file-system`), if any.
    pub config: Option<Arc<JsonObject>>,
}

/// The catalog item of one export of a Tool resource.
pub fn export_item(tool: &Resource<ToolSpec>, export: &ToolExport) -> ToolCatalogItem {
    let mut item = ToolCatalogItem::new(build_tool_name(tool.name(), &export.name), ToolSource::config(tool.name()))
        .with_error_message_limit(tool.spec.error_message_limit);
    if let Some(description) = &export.description {
        item = item.with_description(description.clone());
    }
    if let Some(parameters) = &export.parameters {
        item = item.with_parameters(parameters.clone());
    }
    item
}

/// `entry` resolved against the bundle root, made absolute so that a host
/// running in another directory imports the same file.
pub fn entry_path(root: &Path, entry: &str) -> Arc<Path> {
    let joined = root.join(entry);
    // `absolute` only fails for an empty path or an unreadable current
    // directory; the joined path is then the best there is.
    let absolute = std::path::absolute(&joined).unwrap_or(joined);
    Arc::from(normalize(&absolute))
}

/// The module of an `entry` of a package's Tool, Extension or Connector:
/// [`Bundle::entry_file`] made absolute and normalised as [`entry_path`]
/// makes a bundle's own; `None` for the built-in package.
pub fn package_entry(bundle: &Bundle, scope: PackageScope, entry: &str) -> Option<Arc<Path>> {
    let file = bundle.entry_file(scope, entry)?;
    let absolute = std::path::absolute(&file).unwrap_or(file);
    Some(Arc::from(normalize(&absolute)))
}

/// Drops `.` components and folds `..` lexically (the loader already checked
/// that the file exists; symbolic links are left to the runtime).
fn normalize(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push(component);
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// One entry per export of `tool`.
fn config_tools<'a>(
    bundle: &'a Bundle,
    scope: PackageScope,
    tool: &'a Resource<ToolSpec>,
    config: Option<Arc<JsonObject>>,
) -> impl Iterator<Item = ConfigTool> + 'a {
    let tool_name: Arc<str> = Arc::from(tool.name());
    // A dependency's entry is relative to its package's root (with the
    // compiled-code fallback); the built-in package has none.
    let entry = match scope {
        PackageScope::Local => Some(entry_path(bundle.root(), &tool.spec.entry)),
        PackageScope::Dependency(_) => package_entry(bundle, scope, &tool.spec.entry),
        PackageScope::Base => None,
    };
    tool.spec.exports.iter().map(move |export| ConfigTool {
        scope,
        tool: Arc::clone(&tool_name),
        export: Arc::from(export.name.as_str()),
        item: export_item(tool, export),
        entry: entry.clone(),
        config: config.clone(),
    })
}

/// The registry-only entries of an agent (see [`AgentTools::undeclared`]).
fn undeclared_tools(
    bundle: &Bundle,
    within: PackageScope,
    declared: &[(PackageScope, &Resource<ToolSpec>)],
    tools: &[ConfigTool],
) -> Vec<ConfigTool> {
    let is_declared = |scope: PackageScope, tool: &Resource<ToolSpec>| {
        declared.iter().any(|(s, t)| *s == scope && std::ptr::eq(*t, tool))
    };
    // The agent's own package's Tools: a dependency's agent gets its
    // package's, not the bundle's.
    let home = bundle.package(within).unwrap_or(bundle);
    let mut others: Vec<(PackageScope, &Resource<ToolSpec>)> = Vec::new();
    for tool in home.tools() {
        if !is_declared(within, tool) {
            others.push((within, tool));
        }
    }
    let agents = bundle.agents().map(|agent| (PackageScope::Local, agent));
    let home_agents = home.agents().map(|agent| (within, agent)).filter(|_| within != PackageScope::Local);
    for (agent_scope, agent) in agents.chain(home_agents) {
        for (scope, tool) in bundle.agent_tools_in(agent_scope, agent) {
            let seen = |(s, t): &(PackageScope, &Resource<ToolSpec>)| *s == scope && std::ptr::eq(*t, tool);
            if scope == PackageScope::Base && !is_declared(scope, tool) && !others.iter().any(seen) {
                others.push((scope, tool));
            }
        }
    }
    // A tool's name starts with its Tool's: a Tool named like one already
    // in (the bundle's own `bash` and the base one) is left out whole.
    let mut taken: std::collections::HashSet<&str> = tools.iter().map(|tool| &*tool.tool).collect();
    let mut undeclared = Vec::new();
    for (scope, tool) in others {
        if taken.insert(tool.name()) {
            undeclared.extend(config_tools(bundle, scope, tool, None));
        }
    }
    undeclared
}

/// The config-sourced tools of one agent: those its `spec.tools` declares,
/// in that order, which its catalog offers; and the bundle's other Tools,
/// which only its registry holds (spec 002 §1.1: the Tool Registry holds
/// every Tool resource of the Bundle, the Catalog is the agent's).
#[derive(Debug, Clone, Default)]
pub struct AgentTools {
    tools: Vec<ConfigTool>,
    /// The bundle's Tools the agent does not declare: every Tool of the
    /// bundle's own package, then every `@goondan/base` Tool another Agent
    /// of the bundle declares. Without their `spec.tools` config (that
    /// belongs to the agent that declares them), and without a Tool whose
    /// name a declared Tool (or an earlier one of these) has.
    undeclared: Vec<ConfigTool>,
    loaded_files: Arc<[PathBuf]>,
    /// Where the commands its tools start run (the runtime attaches the
    /// agent's; `None`, unconfined, only for callers that build tools
    /// without a runtime).
    sandbox: Option<Arc<goondan_sandbox::Sandbox>>,
    /// The bundle's directory (where relative paths of its config resolve).
    bundle_root: Arc<PathBuf>,
}

impl AgentTools {
    /// Resolves `agent.spec.tools` in `bundle` into one entry per export,
    /// and the bundle's other Tools (see [`AgentTools::undeclared`]).
    pub fn for_agent(bundle: &Bundle, agent: &Resource<AgentSpec>) -> Self {
        Self::for_agent_in(bundle, PackageScope::Local, agent)
    }

    /// [`AgentTools::for_agent`] for an agent of the package `within` (in
    /// `bundle`'s terms, as [`Bundle::find_agent`] gives it): its
    /// `spec.tools` resolve in its own package ([`Bundle::resolve_from`]),
    /// the scopes of the entries are `bundle`'s, and its registry's
    /// undeclared Tools are its own package's.
    pub fn for_agent_in(bundle: &Bundle, within: PackageScope, agent: &Resource<AgentSpec>) -> Self {
        let declared = bundle.agent_tools_in(within, agent);
        let mut tools = Vec::new();
        for &(scope, tool) in &declared {
            // The first `spec.tools` item that names this Tool carries its config.
            let config = agent
                .spec
                .tools
                .iter()
                .zip(&agent.spec.tool_configs)
                .find(|(reference, _)| {
                    bundle.resolve_from(within, reference).is_ok_and(
                        |resolved| matches!(resolved.resource, AnyResource::Tool(found) if std::ptr::eq(found, tool)),
                    )
                })
                .and_then(|(_, config)| config.clone().map(Arc::new));
            tools.extend(config_tools(bundle, scope, tool, config));
        }
        let undeclared = undeclared_tools(bundle, within, &declared, &tools);
        Self {
            tools,
            undeclared,
            loaded_files: Arc::from(bundle.loaded_files()),
            sandbox: None,
            bundle_root: Arc::new(bundle.root().to_path_buf()),
        }
    }

    /// The files the runtime loads from the agent's bundle as configuration
    /// or code ([`Bundle::loaded_files`]): what a tool that writes files must
    /// leave alone by default.
    pub fn loaded_files(&self) -> &[PathBuf] {
        &self.loaded_files
    }

    /// Attaches the agent's sandbox: every command its tools start runs in it.
    pub fn set_sandbox(&mut self, sandbox: Arc<goondan_sandbox::Sandbox>) {
        self.sandbox = Some(sandbox);
    }

    /// The bundle's directory.
    pub fn bundle_root(&self) -> &Path {
        &self.bundle_root
    }

    /// The agent's sandbox, when the runtime attached one.
    pub fn sandbox(&self) -> Option<&Arc<goondan_sandbox::Sandbox>> {
        self.sandbox.as_ref()
    }

    /// The declared entries: what the agent's catalog offers.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &ConfigTool> {
        self.tools.iter()
    }

    /// The bundle's Tools the agent does not declare, one entry per export:
    /// in its registry (so callable under `toolCallScope: registry`), never
    /// in its catalog. Every Tool of the bundle's own package, then every
    /// `@goondan/base` Tool another Agent of the bundle declares; each
    /// without `config`, and none whose Tool name is taken already.
    pub fn undeclared(&self) -> impl ExactSizeIterator<Item = &ConfigTool> {
        self.undeclared.iter()
    }

    /// Every entry the agent's registry holds: the declared ones, then the
    /// undeclared ones. What plugins install handlers for.
    pub fn registry_tools(&self) -> impl Iterator<Item = &ConfigTool> {
        self.tools.iter().chain(&self.undeclared)
    }

    /// The catalog a step starts from (spec 002 §1.2 rules 1, 2, 4): the
    /// agent's declared tools, then every tool registered at run time that
    /// is in the registry now — one snapshot of it, so the step sees a
    /// consistent set even while tools are being registered.
    pub fn step_catalog(&self, registry: &ToolRegistry) -> ToolCatalog {
        let mut catalog = ToolCatalog::with_capacity(self.tools.len());
        for tool in &self.tools {
            catalog.insert(tool.item.clone());
        }
        let snapshot = registry.load();
        for item in snapshot.dynamic_items() {
            catalog.insert(item.clone());
        }
        catalog
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUNDLE: &str = "\
apiVersion: goondan.ai/v1
kind: Model
metadata: {name: m}
spec: {provider: openai, model: x}
---
apiVersion: goondan.ai/v1
kind: Agent
metadata: {name: a}
spec:
  modelConfig: {modelRef: Model/m}
  tools:
    - {kind: Tool, name: mine, config: {k: 1}}
    - {kind: Tool, name: json-query, package: \"@goondan/base\"}
---
apiVersion: goondan.ai/v1
kind: Agent
metadata: {name: b}
spec:
  modelConfig: {modelRef: Model/m}
  tools:
    - {kind: Tool, name: json-query, package: \"@goondan/base\"}
    - {kind: Tool, name: file-system, package: \"@goondan/base\", config: {allowDotEnv: true}}
    - {kind: Tool, name: bash, package: \"@goondan/base\"}
---
apiVersion: goondan.ai/v1
kind: Tool
metadata: {name: mine}
spec: {entry: ./mine.ts, exports: [{name: run}]}
---
apiVersion: goondan.ai/v1
kind: Tool
metadata: {name: other}
spec: {entry: ./other.ts, exports: [{name: go}, {name: stop}]}
---
apiVersion: goondan.ai/v1
kind: Tool
metadata: {name: bash}
spec: {entry: ./bash.ts, exports: [{name: exec}]}
";

    fn names<'a>(tools: impl Iterator<Item = &'a ConfigTool>) -> Vec<String> {
        tools.map(|tool| format!("{:?}:{}", tool.scope, tool.item.name())).collect()
    }

    /// Spec 002 §1.1: the registry holds every Tool of the bundle; the
    /// catalog only the agent's. Its own package's Tools all, the base Tools
    /// other agents declare, no Tool name twice (the bundle's own `bash` wins
    /// over the base one another agent declares), no other agent's config.
    #[test]
    fn the_registry_holds_the_bundles_tools_and_the_catalog_the_agents() {
        let report = goondan_config::load_from_str(BUNDLE, "goondan.yaml", None, PathBuf::from("goondan.yaml"));
        let Some(bundle) = report.bundle.as_ref() else { panic!("{:?}", report.diagnostics) };
        let Some(agent) = bundle.agent("a") else { panic!("no agent a") };
        let tools = AgentTools::for_agent(bundle, agent);
        assert_eq!(
            names(tools.iter()),
            [
                "Local:mine__run",
                "Base:json-query__query",
                "Base:json-query__pick",
                "Base:json-query__count",
                "Base:json-query__flatten"
            ]
        );
        assert_eq!(
            names(tools.undeclared()),
            [
                "Local:other__go",
                "Local:other__stop",
                "Local:bash__exec",
                "Base:file-system__read",
                "Base:file-system__write",
                "Base:file-system__list",
                "Base:file-system__mkdir"
            ]
        );
        assert_eq!(tools.registry_tools().count(), tools.iter().len() + tools.undeclared().len());
        assert!(tools.iter().any(|tool| tool.config.is_some()), "the agent's own config is kept");
        assert!(tools.undeclared().all(|tool| tool.config.is_none()), "another agent's config is not the agent's");
        assert!(tools.undeclared().filter(|t| t.scope == PackageScope::Local).all(|t| t.entry.is_some()));

        let registry = ToolRegistry::new();
        let catalog = tools.step_catalog(&registry);
        assert_eq!(catalog.len(), tools.iter().len(), "only the declared tools are offered");
        assert!(!catalog.contains("other__go"));
    }
}
