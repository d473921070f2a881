//! What the extension tests share: the plugins that install this crate's
//! extensions and refuse any other.

use std::sync::Arc;

use goondan_runtime::extension::{ExtensionError, ExtensionSetup};

/// Claims every extension [`goondan_extensions::BaseExtensions`] left and
/// refuses it, so an extension this crate does not install fails the
/// assembly instead of being skipped with a warning.
pub struct Strict;

impl goondan_runtime::extension::AgentPlugin for Strict {
    fn begin(&self) -> Box<dyn goondan_runtime::extension::PluginInstall> {
        Box::new(Strict)
    }
}

impl goondan_runtime::extension::PluginInstall for Strict {
    fn claims(&self, _: &goondan_runtime::extension::AgentExtension) -> bool {
        true
    }

    fn install_extension<'a>(
        &'a mut self,
        _: &'a mut ExtensionSetup<'_>,
        extension: &'a goondan_runtime::extension::AgentExtension,
    ) -> goondan_tools::BoxFuture<'a, Result<(), ExtensionError>> {
        Box::pin(std::future::ready(Err(ExtensionError::new(&extension.name, "E_TEST", "not installed"))))
    }
}

/// Only this crate's extensions, strictly.
pub fn plugins() -> Vec<Arc<dyn goondan_runtime::extension::AgentPlugin>> {
    vec![Arc::new(goondan_extensions::BaseExtensions), Arc::new(Strict)]
}
