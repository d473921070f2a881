//! The JavaScript host as the build's plugin for a bundle's own code.
//!
//! [`ScriptPlugin`] installs, into each agent being assembled, a
//! [`ScriptToolHandler`](crate::ScriptToolHandler) for every Tool with a
//! `spec.entry`, and the bundle's own (local) extensions. Both share one
//! [`ScriptHost`] per agent: the host is the state of that agent's install,
//! made when the first of them needs it. Tools alone start it at their
//! first call; extensions start it at assembly (their `register` decides the
//! pipelines), after every other extension of the agent is installed.

use std::sync::Arc;

use goondan_config::PackageScope;
use goondan_runtime::agent::EnvLookup;
use goondan_runtime::extension::{AgentExtension, AgentPlugin, ExtensionError, ExtensionSetup, PluginInstall};
use goondan_tools::assembly::AgentTools;
use goondan_tools::{BoxFuture, RegistryError, ToolRegistry};

use crate::host::{ScriptHost, ScriptHostBuilder};
use crate::runtime::JsRuntime;

/// The plugin of script tools and JavaScript extensions.
#[derive(Debug, Clone, Default)]
pub struct ScriptPlugin {
    runtime: Option<JsRuntime>,
}

impl ScriptPlugin {
    /// Hosts that find their runtime in the agent's environment.
    pub fn new() -> Self {
        Self::default()
    }

    /// Hosts that run `runtime` (benchmarks and tests that chose one).
    pub fn with_runtime(runtime: JsRuntime) -> Self {
        Self { runtime: Some(runtime) }
    }
}

impl AgentPlugin for ScriptPlugin {
    fn begin(&self) -> Box<dyn PluginInstall> {
        Box::new(ScriptInstall { runtime: self.runtime.clone(), host: None, extensions: Vec::new(), sandbox: None })
    }
}

/// One agent's install: its host, once made, and its extensions, loaded
/// together at the end.
struct ScriptInstall {
    runtime: Option<JsRuntime>,
    host: Option<Arc<ScriptHost>>,
    extensions: Vec<AgentExtension>,
    /// The agent's sandbox and the bundle's directories, for the host.
    sandbox: Option<(Arc<goondan_sandbox::Sandbox>, Vec<std::path::PathBuf>)>,
}

/// The directories of the files the bundle loads (its root among them):
/// where a script tool's modules, and the packages they import, live.
fn bundle_dirs(tools: &AgentTools) -> Vec<std::path::PathBuf> {
    let mut dirs: Vec<std::path::PathBuf> =
        tools.loaded_files().iter().filter_map(|file| file.parent().map(std::path::Path::to_path_buf)).collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

impl ScriptInstall {
    fn host(&mut self, env: &EnvLookup) -> Arc<ScriptHost> {
        let runtime = &self.runtime;
        let sandbox = &self.sandbox;
        let host = self.host.get_or_insert_with(|| {
            let mut builder = match runtime {
                Some(runtime) => ScriptHostBuilder::new(Arc::new(|_: &str| None)).runtime(runtime.clone()),
                None => ScriptHostBuilder::new(Arc::clone(env)),
            };
            if let Some((sandbox, readable)) = sandbox {
                builder = builder.sandbox(Arc::clone(sandbox), readable.clone());
            }
            builder.build()
        });
        Arc::clone(host)
    }
}

impl PluginInstall for ScriptInstall {
    fn install_tools(
        &mut self,
        registry: &ToolRegistry,
        tools: &AgentTools,
        env: &EnvLookup,
    ) -> Result<(), RegistryError> {
        // The bundle's script tools the agent does not declare too: its
        // registry holds them (spec 002 §1.1). The host starts at the
        // first call of any of them, never here.
        if let Some(sandbox) = tools.sandbox() {
            self.sandbox = Some((Arc::clone(sandbox), bundle_dirs(tools)));
        }
        if tools.registry_tools().any(|tool| tool.entry.is_some()) {
            let host = self.host(env);
            crate::install_script_tools(registry, tools, &host)?;
        }
        Ok(())
    }

    fn claims(&self, extension: &AgentExtension) -> bool {
        // A bundle's own extensions and those of installed packages are
        // scripts; the built-in package's are native.
        matches!(extension.scope, PackageScope::Local | PackageScope::Dependency(_))
    }

    fn install_extension<'a>(
        &'a mut self,
        _setup: &'a mut ExtensionSetup<'_>,
        extension: &'a AgentExtension,
    ) -> BoxFuture<'a, Result<(), ExtensionError>> {
        // Loaded in `finish`, all in one go, in the agent's order.
        self.extensions.push(extension.clone());
        Box::pin(std::future::ready(Ok(())))
    }

    fn finish<'a>(&'a mut self, setup: &'a mut ExtensionSetup<'_>) -> BoxFuture<'a, Result<(), ExtensionError>> {
        Box::pin(async move {
            if self.extensions.is_empty() {
                return Ok(());
            }
            let host = self.host(setup.env);
            let extensions = std::mem::take(&mut self.extensions);
            crate::install_script_extensions(setup, &extensions, &host).await
        })
    }
}
