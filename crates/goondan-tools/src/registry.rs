//! The Tool Registry: every executable tool of an agent process with its
//! handler (spec 002 §1.1). Insertion order is kept; a name is registered at
//! most once.

use std::sync::Arc;

use goondan_core::naming::parse_tool_name;
use indexmap::IndexMap;

use crate::catalog::{ToolCatalogItem, ToolSourceKind};
use crate::handler::ToolHandler;

/// A tool the registry can execute.
#[derive(Clone)]
pub struct RegisteredTool {
    /// Its definition (the item offered when it joins a catalog).
    pub item: ToolCatalogItem,
    /// What runs it.
    pub handler: Arc<dyn ToolHandler>,
}

impl std::fmt::Debug for RegisteredTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredTool").field("item", &self.item).finish_non_exhaustive()
    }
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The name is already registered.
    #[error("tool '{0}' is already registered; each tool name can be registered once")]
    Duplicate(String),
    /// The name is not `resource__export`.
    #[error("tool name '{0}' must have the form 'resource__export' with neither part empty or containing '__'")]
    InvalidName(String),
}

/// The executable tools of one agent process.
#[derive(Debug, Clone, Default)]
pub struct ToolRegistry {
    entries: IndexMap<Arc<str>, RegisteredTool>,
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a tool. Fails for a malformed name or a name already taken.
    pub fn register(&mut self, item: ToolCatalogItem, handler: Arc<dyn ToolHandler>) -> Result<(), RegistryError> {
        if parse_tool_name(item.name()).is_none() {
            return Err(RegistryError::InvalidName(item.name().to_owned()));
        }
        if self.entries.contains_key(item.name()) {
            return Err(RegistryError::Duplicate(item.name().to_owned()));
        }
        let name = Arc::clone(item.shared_name());
        self.entries.insert(name, RegisteredTool { item, handler });
        Ok(())
    }

    /// Looks a tool up by its full name.
    pub fn get(&self, name: &str) -> Option<&RegisteredTool> {
        self.entries.get(name)
    }

    /// True when `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// All tools, in registration order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &RegisteredTool> {
        self.entries.values()
    }

    /// Tools registered at run time (by extensions or MCP bridges), which
    /// join every step's catalog (spec 002 §10.3).
    pub fn dynamic_items(&self) -> impl Iterator<Item = &ToolCatalogItem> {
        self.entries.values().map(|tool| &tool.item).filter(|item| item.source().kind != ToolSourceKind::Config)
    }

    /// Number of tools.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::ToolSource;
    use crate::handler::{ToolOutput, sync_handler};
    use serde_json::json;

    fn noop() -> Arc<dyn ToolHandler> {
        sync_handler(|_, _| Ok(ToolOutput::Value(json!(null))))
    }

    #[test]
    fn keeps_order_and_refuses_duplicates() {
        let mut registry = ToolRegistry::new();
        for name in ["b__one", "a__two", "c__three"] {
            assert_eq!(registry.register(ToolCatalogItem::new(name, ToolSource::config("x")), noop()), Ok(()));
        }
        assert_eq!(registry.iter().map(|t| t.item.name()).collect::<Vec<_>>(), ["b__one", "a__two", "c__three"]);
        let again = registry.register(ToolCatalogItem::new("a__two", ToolSource::extension("e")), noop());
        assert_eq!(again, Err(RegistryError::Duplicate("a__two".into())));
        assert_eq!(registry.len(), 3);
    }

    #[test]
    fn refuses_malformed_names() {
        let mut registry = ToolRegistry::new();
        for bad in ["plain", "__x", "x__", "a__b__c"] {
            assert_eq!(
                registry.register(ToolCatalogItem::new(bad, ToolSource::extension("e")), noop()),
                Err(RegistryError::InvalidName(bad.into()))
            );
        }
    }

    #[test]
    fn dynamic_items_are_the_non_config_ones() {
        let mut registry = ToolRegistry::new();
        let _ = registry.register(ToolCatalogItem::new("bash__exec", ToolSource::config("bash")), noop());
        let _ = registry.register(ToolCatalogItem::new("weather__get", ToolSource::extension("weather")), noop());
        assert_eq!(registry.dynamic_items().map(ToolCatalogItem::name).collect::<Vec<_>>(), ["weather__get"]);
    }
}
