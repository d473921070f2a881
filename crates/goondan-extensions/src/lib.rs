//! The extensions of the `@goondan/base` package, implemented natively.
//!
//! Bundles written for the original reference them as `Extension/NAME`
//! (package `@goondan/base`) with the original's config fields. Each module
//! here installs one of them through the runtime's
//! [`ExtensionSetup`](goondan_runtime::extension::ExtensionSetup): its turn,
//! step and toolCall layers go on the same chains, and its tools into the
//! same registry, as JavaScript extensions' do. [`install`] picks the module
//! by the Extension's name.

use goondan_runtime::extension::{AgentExtension, ExtensionError, ExtensionSetup};

/// Installs `extension` when it is one of the base package's extensions this
/// crate implements; returns `Ok(false)` (and changes nothing) otherwise.
pub async fn install(setup: &mut ExtensionSetup<'_>, extension: &AgentExtension) -> Result<bool, ExtensionError> {
    let _ = (setup, extension);
    Ok(false)
}
