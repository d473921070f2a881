//! The Tool Catalog: what one step offers the model (spec 002 §1.1, §11).
//!
//! A catalog is rebuilt every step from `Agent.spec.tools` plus dynamically
//! registered tools; step middleware may then change it. It is also the
//! allow-list the executor enforces: a call to a name that is not in the
//! step's catalog is refused (spec 002 §7). Lookups are by name through a
//! hash index, so their cost does not grow with the catalog.

use std::fmt;
use std::sync::{Arc, OnceLock};

use goondan_core::{DEFAULT_ERROR_MESSAGE_LIMIT, JsonValue};
use indexmap::IndexMap;
use serde::ser::{SerializeSeq, SerializeStruct};
use serde::{Deserialize, Serialize, Serializer};

/// Where a catalog item came from (spec 002 §11.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolSource {
    /// `config`, `extension` or `mcp`.
    #[serde(rename = "type")]
    pub kind: ToolSourceKind,
    /// The Tool resource's or extension's name; for `mcp`, the server's.
    pub name: String,
    /// The MCP server behind the tool (`type: mcp` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpSource>,
}

/// The kind of a [`ToolSource`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolSourceKind {
    /// A `kind: Tool` resource of the bundle or a package.
    Config,
    /// Registered by an extension (`api.tools.register`).
    Extension,
    /// Bridged from an MCP server.
    Mcp,
}

impl ToolSourceKind {
    /// The wire spelling: `config`, `extension` or `mcp`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Config => "config",
            Self::Extension => "extension",
            Self::Mcp => "mcp",
        }
    }
}

/// The MCP server details of an MCP-sourced tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct McpSource {
    /// The extension that bridges the server.
    pub extension_name: String,
    /// The server's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
}

impl ToolSource {
    /// A tool from a `kind: Tool` resource.
    pub fn config(resource_name: impl Into<String>) -> Self {
        Self { kind: ToolSourceKind::Config, name: resource_name.into(), mcp: None }
    }

    /// A tool registered by an extension.
    pub fn extension(extension_name: impl Into<String>) -> Self {
        Self { kind: ToolSourceKind::Extension, name: extension_name.into(), mcp: None }
    }

    /// A tool bridged from the MCP server `server_name` by the extension
    /// `extension_name`: `{type: mcp, name: SERVER, mcp: {extensionName,
    /// serverName: SERVER}}`.
    pub fn mcp(extension_name: impl Into<String>, server_name: impl Into<String>) -> Self {
        let server_name = server_name.into();
        Self {
            kind: ToolSourceKind::Mcp,
            name: server_name.clone(),
            mcp: Some(McpSource { extension_name: extension_name.into(), server_name: Some(server_name) }),
        }
    }
}

/// A tool's parameter schema, compiled on first use and shared by every
/// catalog that offers the tool.
pub struct ParameterSchema {
    raw: JsonValue,
    compiled: OnceLock<Result<jsonschema::Validator, String>>,
}

impl fmt::Debug for ParameterSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParameterSchema").field("raw", &self.raw).finish_non_exhaustive()
    }
}

impl ParameterSchema {
    /// Wraps a JSON Schema; it is compiled when first needed.
    pub fn new(raw: JsonValue) -> Arc<Self> {
        Arc::new(Self { raw, compiled: OnceLock::new() })
    }

    /// The schema as written.
    pub fn raw(&self) -> &JsonValue {
        &self.raw
    }

    /// The compiled validator, or why the schema does not compile.
    pub fn validator(&self) -> Result<&jsonschema::Validator, &str> {
        self.compiled
            .get_or_init(|| jsonschema::validator_for(&self.raw).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(String::as_str)
    }
}

/// One entry of a catalog: `{name, description?, parameters?, source}` as the
/// model sees it, plus the tool's error-message limit.
#[derive(Debug, Clone)]
pub struct ToolCatalogItem {
    name: Arc<str>,
    description: Option<String>,
    parameters: Option<Arc<ParameterSchema>>,
    source: ToolSource,
    error_message_limit: usize,
}

impl ToolCatalogItem {
    /// An item with no description or parameters and the default limit.
    pub fn new(name: impl Into<Arc<str>>, source: ToolSource) -> Self {
        Self {
            name: name.into(),
            description: None,
            parameters: None,
            source,
            error_message_limit: DEFAULT_ERROR_MESSAGE_LIMIT,
        }
    }

    /// Sets the description.
    #[must_use]
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// Sets the parameter schema.
    #[must_use]
    pub fn with_parameters(mut self, parameters: JsonValue) -> Self {
        self.parameters = Some(ParameterSchema::new(parameters));
        self
    }

    /// Shares an already wrapped parameter schema.
    #[must_use]
    pub fn with_shared_parameters(mut self, parameters: Arc<ParameterSchema>) -> Self {
        self.parameters = Some(parameters);
        self
    }

    /// Sets the tool's `errorMessageLimit`.
    #[must_use]
    pub fn with_error_message_limit(mut self, limit: usize) -> Self {
        self.error_message_limit = limit;
        self
    }

    /// The full tool name (`resource__export`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name as a shared string.
    pub fn shared_name(&self) -> &Arc<str> {
        &self.name
    }

    /// The description given to the model.
    pub fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }

    /// The parameter schema.
    pub fn parameters(&self) -> Option<&Arc<ParameterSchema>> {
        self.parameters.as_ref()
    }

    /// Where the tool came from.
    pub fn source(&self) -> &ToolSource {
        &self.source
    }

    /// The tool's error-message limit in characters.
    pub fn error_message_limit(&self) -> usize {
        self.error_message_limit
    }
}

impl Serialize for ToolCatalogItem {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let len = 2 + usize::from(self.description.is_some()) + usize::from(self.parameters.is_some());
        let mut item = serializer.serialize_struct("ToolCatalogItem", len)?;
        item.serialize_field("name", self.name.as_ref())?;
        if let Some(description) = &self.description {
            item.serialize_field("description", description)?;
        }
        if let Some(parameters) = &self.parameters {
            item.serialize_field("parameters", parameters.raw())?;
        }
        item.serialize_field("source", &self.source)?;
        item.end()
    }
}

/// The tools offered in one step, in order, indexed by name.
#[derive(Debug, Clone, Default)]
pub struct ToolCatalog {
    items: IndexMap<Arc<str>, ToolCatalogItem>,
}

impl ToolCatalog {
    /// An empty catalog.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty catalog with room for `capacity` items.
    pub fn with_capacity(capacity: usize) -> Self {
        Self { items: IndexMap::with_capacity(capacity) }
    }

    /// Adds an item, or replaces the item of the same name in place.
    /// Returns the replaced item.
    pub fn insert(&mut self, item: ToolCatalogItem) -> Option<ToolCatalogItem> {
        self.items.insert(Arc::clone(&item.name), item)
    }

    /// Removes an item by name, keeping the order of the rest.
    pub fn remove(&mut self, name: &str) -> Option<ToolCatalogItem> {
        self.items.shift_remove(name)
    }

    /// Keeps only the items for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&ToolCatalogItem) -> bool) {
        self.items.retain(|_, item| keep(item));
    }

    /// Looks an item up by its full name.
    pub fn get(&self, name: &str) -> Option<&ToolCatalogItem> {
        self.items.get(name)
    }

    /// True when the catalog offers `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.items.contains_key(name)
    }

    /// The items in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &ToolCatalogItem> {
        self.items.values()
    }

    /// The names in order.
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> {
        self.items.keys().map(AsRef::as_ref)
    }

    /// Number of items.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl FromIterator<ToolCatalogItem> for ToolCatalog {
    fn from_iter<I: IntoIterator<Item = ToolCatalogItem>>(iter: I) -> Self {
        let iter = iter.into_iter();
        let mut catalog = Self::with_capacity(iter.size_hint().0);
        for item in iter {
            catalog.insert(item);
        }
        catalog
    }
}

impl Serialize for ToolCatalog {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.items.len()))?;
        for item in self.items.values() {
            seq.serialize_element(item)?;
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(name: &str) -> ToolCatalogItem {
        ToolCatalogItem::new(name, ToolSource::config(name.split("__").next().unwrap_or(name)))
    }

    #[test]
    fn mcp_source_names_the_server() {
        let source = serde_json::to_value(ToolSource::mcp("mcp", "everything")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            source,
            json!({"type": "mcp", "name": "everything", "mcp": {"extensionName": "mcp", "serverName": "everything"}})
        );
    }

    #[test]
    fn serializes_as_the_model_sees_it() {
        let catalog: ToolCatalog = [
            item("bash__exec")
                .with_description("Run")
                .with_parameters(json!({"type": "object", "properties": {"command": {"type": "string"}}})),
            ToolCatalogItem::new(
                "github__create_issue",
                ToolSource {
                    kind: ToolSourceKind::Mcp,
                    name: "mcp-github".into(),
                    mcp: Some(McpSource { extension_name: "mcp-github".into(), server_name: None }),
                },
            ),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            serde_json::to_value(&catalog).ok(),
            Some(json!([
                {"name": "bash__exec", "description": "Run",
                 "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
                 "source": {"type": "config", "name": "bash"}},
                {"name": "github__create_issue",
                 "source": {"type": "mcp", "name": "mcp-github", "mcp": {"extensionName": "mcp-github"}}}
            ]))
        );
    }

    #[test]
    fn insert_replaces_in_place_and_remove_keeps_order() {
        let mut catalog: ToolCatalog = ["a__x", "b__y", "c__z"].into_iter().map(item).collect();
        let replaced = catalog.insert(item("b__y").with_description("new"));
        assert!(replaced.is_some());
        assert_eq!(catalog.names().collect::<Vec<_>>(), ["a__x", "b__y", "c__z"]);
        assert_eq!(catalog.get("b__y").and_then(ToolCatalogItem::description), Some("new"));
        catalog.remove("a__x");
        assert_eq!(catalog.names().collect::<Vec<_>>(), ["b__y", "c__z"]);
        catalog.retain(|i| i.name() != "c__z");
        assert_eq!(catalog.names().collect::<Vec<_>>(), ["b__y"]);
        assert!(!catalog.contains("c__z"));
    }

    #[test]
    fn schemas_compile_lazily_and_report_errors() {
        let good = ParameterSchema::new(json!({"type": "object"}));
        assert!(good.validator().is_ok());
        let bad = ParameterSchema::new(json!({"type": "no-such-type"}));
        assert!(bad.validator().is_err());
    }
}
