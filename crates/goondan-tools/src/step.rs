//! Step middleware over the Tool Catalog (spec 002 §1.2 rule 3).
//!
//! Each step starts from a freshly built catalog; step middleware layers may
//! read and change `ctx.tool_catalog` before the core of the step — the model
//! call — sees it. The result type of the step pipeline is left to the
//! caller; [`CatalogCore`] is the core that simply reports the catalog the
//! model would get, which `gdn tool list` and `gdn tool call` use.

use std::sync::Arc;

use goondan_core::JsonObject;

use crate::catalog::ToolCatalog;
use crate::pipeline::{BoxFuture, Core, MiddlewareChain};

/// What step middleware sees.
#[derive(Debug, Clone)]
pub struct StepContext {
    /// The agent.
    pub agent_name: Arc<str>,
    /// The instance.
    pub instance_key: Arc<str>,
    /// The turn.
    pub turn_id: Arc<str>,
    /// The step's index within the turn, from 0.
    pub step_index: u32,
    /// The tools the model will be offered; layers may change it.
    pub tool_catalog: ToolCatalog,
    /// Free-form metadata shared between layers.
    pub metadata: JsonObject,
}

/// A step core that returns the catalog as it reached the core.
#[derive(Debug, Clone, Copy, Default)]
pub struct CatalogCore;

impl Core<StepContext, ToolCatalog> for CatalogCore {
    fn run<'a>(&'a self, ctx: &'a mut StepContext) -> BoxFuture<'a, ToolCatalog> {
        Box::pin(std::future::ready(ctx.tool_catalog.clone()))
    }
}

/// Runs step middleware over `ctx` and returns the catalog the model gets.
pub async fn prepare_step_catalog(
    chain: &MiddlewareChain<StepContext, ToolCatalog>,
    mut ctx: StepContext,
) -> ToolCatalog {
    chain.run(&mut ctx, &CatalogCore).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{ToolCatalogItem, ToolSource};
    use crate::pipeline::from_fn;

    #[test]
    fn middleware_edits_the_catalog_the_core_sees() {
        let mut chain: MiddlewareChain<StepContext, ToolCatalog> = MiddlewareChain::new();
        chain.register(
            "hide-bash",
            0,
            from_fn(|ctx: &mut StepContext, next| {
                ctx.tool_catalog.remove("bash__exec");
                ctx.tool_catalog.insert(ToolCatalogItem::new("search__find", ToolSource::extension("tool-search")));
                next.run(ctx)
            }),
        );
        let catalog: ToolCatalog = [
            ToolCatalogItem::new("bash__exec", ToolSource::config("bash")),
            ToolCatalogItem::new("wait__seconds", ToolSource::config("wait")),
        ]
        .into_iter()
        .collect();
        let ctx = StepContext {
            agent_name: Arc::from("a"),
            instance_key: Arc::from("default"),
            turn_id: Arc::from("t"),
            step_index: 0,
            tool_catalog: catalog,
            metadata: JsonObject::new(),
        };
        let runtime = tokio::runtime::Builder::new_current_thread().build();
        let Ok(runtime) = runtime else { panic!("runtime") };
        let seen = runtime.block_on(prepare_step_catalog(&chain, ctx));
        assert_eq!(seen.names().collect::<Vec<_>>(), ["wait__seconds", "search__find"]);
    }
}
