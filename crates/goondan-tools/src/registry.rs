//! The Tool Registry: every executable tool of an agent process with its
//! handler (spec 002 §1.1). Insertion order is kept; a name is registered at
//! most once.
//!
//! The registry grows and shrinks while the agent runs: extensions call
//! `api.tools.register`, MCP servers connect and send `tools/list_changed`.
//! Those changes must reach the next step's catalog without rebuilding the
//! agent, while every tool call keeps looking its handler up with one hash
//! probe and no lock a registration could hold.
//!
//! So the registry is copy-on-write: it holds an immutable
//! [`RegistrySnapshot`] behind an [`ArcSwap`]. Readers `load()` the current
//! snapshot without locking (a few atomic operations) and look up in it;
//! a change builds a new snapshot from the current one (O(n), and changes
//! are rare) and swaps it in. Writers are serialized by a mutex that readers
//! never touch, so two concurrent registrations cannot lose each other's
//! tools. A snapshot never changes once published: whoever holds one sees a
//! consistent set of tools, and [`RegistrySnapshot::version`] tells whether
//! the set has changed since.
//!
//! Entries are stored as `Arc<RegisteredTool>`: rebuilding a snapshot copies
//! pointers, not items, and [`ToolRegistry::get`] hands out a tool that may
//! outlive the snapshot it came from (a handler running across an `await`).

use goondan_core::sync::LockUnpoisoned;
use std::sync::{Arc, Mutex};

use arc_swap::{ArcSwap, Guard};
use goondan_core::naming::parse_tool_name;
use indexmap::IndexMap;

use crate::catalog::{ToolCatalogItem, ToolSource, ToolSourceKind};
use crate::handler::ToolHandler;

/// A tool the registry can execute.
#[derive(Clone)]
pub struct RegisteredTool {
    /// Its definition (the item offered when it joins a catalog).
    pub item: ToolCatalogItem,
    /// What runs it.
    pub handler: Arc<dyn ToolHandler>,
    /// Held for calls past the catalog only: a Tool of the bundle the agent
    /// does not declare (spec 002 §1.1). Never in a catalog of its own
    /// accord, and any other registration of its name replaces it (an
    /// extension's or MCP server's tool of the agent wins over another
    /// agent's Tool).
    pub undeclared: bool,
}

impl std::fmt::Debug for RegisteredTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredTool")
            .field("item", &self.item)
            .field("undeclared", &self.undeclared)
            .finish_non_exhaustive()
    }
}

/// Why a registration was refused. A refused change leaves the registry as
/// it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The name is already registered.
    #[error("tool '{0}' is already registered; each tool name can be registered once")]
    Duplicate(String),
    /// The name is not `resource__export`.
    #[error("tool name '{0}' must have the form 'resource__export' with neither part empty or containing '__'")]
    InvalidName(String),
    /// [`ToolRegistry::replace_source`] was given a tool of another source,
    /// which a later refresh of that source would then never remove.
    #[error("tool '{0}' does not belong to the source being replaced; replace_source only takes that source's tools")]
    WrongSource(String),
}

/// One immutable state of a [`ToolRegistry`]: its tools in registration
/// order, indexed by name, and the version that state has.
#[derive(Debug, Default)]
pub struct RegistrySnapshot {
    entries: IndexMap<Arc<str>, Arc<RegisteredTool>>,
    version: u64,
}

impl RegistrySnapshot {
    /// Looks a tool up by its full name.
    pub fn get(&self, name: &str) -> Option<&RegisteredTool> {
        self.entries.get(name).map(Arc::as_ref)
    }

    /// Looks a tool up by its full name, as the shared pointer the snapshot
    /// holds; clone it to keep the tool after the snapshot is gone.
    pub fn get_shared(&self, name: &str) -> Option<&Arc<RegisteredTool>> {
        self.entries.get(name)
    }

    /// True when `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// All tools, in registration order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &RegisteredTool> {
        self.entries.values().map(Arc::as_ref)
    }

    /// Tools registered at run time (by extensions or MCP bridges), which
    /// join every step's catalog (spec 002 §10.3).
    pub fn dynamic_items(&self) -> impl Iterator<Item = &ToolCatalogItem> {
        self.iter().map(|tool| &tool.item).filter(|item| item.source().kind != ToolSourceKind::Config)
    }

    /// Number of tools.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many changes the registry had gone through when this snapshot was
    /// published: 0 for a new registry, one more for every change. Two
    /// snapshots of one registry with the same version hold the same tools.
    pub fn version(&self) -> u64 {
        self.version
    }
}

/// The executable tools of one agent process, shared (`Arc<ToolRegistry>`)
/// by the executor and whatever registers tools while the agent runs.
///
/// Every method takes `&self`. Reads go through the current
/// [`RegistrySnapshot`]; several related reads should take one
/// [`snapshot`](Self::snapshot) so they see the same set of tools.
///
/// The registry is deliberately not `Clone`: share it through an `Arc`, so a
/// registration is seen by everyone holding it.
pub struct ToolRegistry {
    current: ArcSwap<RegistrySnapshot>,
    /// Serializes writers (each builds the next snapshot from the current
    /// one, so two unserialized writers would drop each other's change).
    /// Readers never take it.
    writer: Mutex<()>,
}

impl Default for ToolRegistry {
    fn default() -> Self {
        Self { current: ArcSwap::from_pointee(RegistrySnapshot::default()), writer: Mutex::new(()) }
    }
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let snapshot = self.current.load();
        f.debug_struct("ToolRegistry")
            .field("tools", &snapshot.len())
            .field("version", &snapshot.version)
            .finish_non_exhaustive()
    }
}

impl ToolRegistry {
    /// An empty registry (version 0).
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a tool. Fails for a malformed name or a name already taken.
    pub fn register(&self, item: ToolCatalogItem, handler: Arc<dyn ToolHandler>) -> Result<(), RegistryError> {
        self.register_all([(item, handler)])
    }

    /// Registers several tools at once: all of them or, when any is refused
    /// (malformed name, name taken, or given twice), none. One new snapshot,
    /// so a reader sees either none of them or all of them. A name an
    /// [undeclared](RegisteredTool::undeclared) tool holds is not taken: the
    /// new tool replaces it, in its place.
    pub fn register_all(
        &self,
        tools: impl IntoIterator<Item = (ToolCatalogItem, Arc<dyn ToolHandler>)>,
    ) -> Result<(), RegistryError> {
        self.insert_all(tools, false)
    }

    /// Registers the bundle's Tools an agent does not declare
    /// ([`RegisteredTool::undeclared`]), as [`register_all`](Self::register_all)
    /// does otherwise: all or none, a name already registered refused.
    pub fn register_undeclared(
        &self,
        tools: impl IntoIterator<Item = (ToolCatalogItem, Arc<dyn ToolHandler>)>,
    ) -> Result<(), RegistryError> {
        self.insert_all(tools, true)
    }

    fn insert_all(
        &self,
        tools: impl IntoIterator<Item = (ToolCatalogItem, Arc<dyn ToolHandler>)>,
        undeclared: bool,
    ) -> Result<(), RegistryError> {
        let added = new_entries(tools, undeclared)?;
        if added.is_empty() {
            return Ok(());
        }
        self.change(|current| {
            let taken = |name: &Arc<str>| current.entries.get(name).is_some_and(|tool| undeclared || !tool.undeclared);
            if let Some(name) = added.keys().find(|name| taken(name)) {
                return Err(RegistryError::Duplicate(name.to_string()));
            }
            // Cloning the map copies its hash index as is (no key is hashed
            // again) and bumps one reference count per tool.
            let mut entries = current.entries.clone();
            entries.extend(added);
            Ok(Some(entries))
        })
        .map(|_changed| ())
    }

    /// Removes a tool; the rest keep their order. False when `name` was not
    /// registered (and nothing changed).
    pub fn unregister(&self, name: &str) -> bool {
        let removed = self.change(|current| {
            if !current.entries.contains_key(name) {
                return Ok(None);
            }
            let mut entries = current.entries.clone();
            entries.shift_remove(name);
            Ok(Some(entries))
        });
        matches!(removed, Ok(true))
    }

    /// Replaces every tool of `source` (those whose `item.source() == source`)
    /// with `tools`, in one change: what refreshing an MCP server's tools
    /// after `tools/list_changed` needs. Readers see the old set or the new
    /// one, never a mix.
    ///
    /// The new tools take the place of the source's first old tool, so a
    /// refresh that returns the same tools leaves the order (and the model's
    /// view of the catalog) unchanged; a source with no tools yet appends
    /// them. Refused, with nothing changed, when a new tool has a malformed
    /// name, a name given twice, a name another source holds, or an item of
    /// another source. `tools` empty removes the source's tools.
    pub fn replace_source(
        &self,
        source: &ToolSource,
        tools: Vec<(ToolCatalogItem, Arc<dyn ToolHandler>)>,
    ) -> Result<(), RegistryError> {
        if let Some((item, _)) = tools.iter().find(|(item, _)| item.source() != source) {
            return Err(RegistryError::WrongSource(item.name().to_owned()));
        }
        let added = new_entries(tools, false)?;
        self.change(move |current| {
            let taken = current
                .entries
                .iter()
                .find(|(name, tool)| tool.item.source() != source && !tool.undeclared && added.contains_key(*name));
            if let Some((name, _)) = taken {
                return Err(RegistryError::Duplicate(name.to_string()));
            }
            if added.is_empty() && !current.iter().any(|tool| tool.item.source() == source) {
                return Ok(None);
            }
            let mut entries = IndexMap::with_capacity(current.entries.len() + added.len());
            let mut pending = Some(added);
            for (name, tool) in &current.entries {
                // An undeclared tool of a name the source now has gives way.
                let replaced = |name: &Arc<str>| {
                    entries.contains_key(name) || pending.as_ref().is_some_and(|added| added.contains_key(name))
                };
                if tool.undeclared && tool.item.source() != source && replaced(name) {
                    continue;
                }
                if tool.item.source() != source {
                    entries.insert(Arc::clone(name), Arc::clone(tool));
                } else if let Some(added) = pending.take() {
                    entries.extend(added);
                }
            }
            if let Some(added) = pending {
                entries.extend(added);
            }
            Ok(Some(entries))
        })
        .map(|_changed| ())
    }

    /// The current snapshot, kept as long as the caller holds it; later
    /// changes do not touch it.
    pub fn snapshot(&self) -> Arc<RegistrySnapshot> {
        self.current.load_full()
    }

    /// A short-lived borrow of the current snapshot: no reference count is
    /// touched in the common case. For the executor's lookups; not to be held
    /// across an `await` (arc-swap has a few such borrows per thread and
    /// falls back to slower ones beyond that).
    pub(crate) fn load(&self) -> Guard<Arc<RegistrySnapshot>> {
        self.current.load()
    }

    /// Looks a tool up by its full name in the current snapshot. The tool is
    /// returned as the `Arc` the snapshot holds (a reference-count increment,
    /// no copy), so it stays usable after the registry changes.
    pub fn get(&self, name: &str) -> Option<Arc<RegisteredTool>> {
        self.current.load().get_shared(name).cloned()
    }

    /// True when `name` is registered now.
    pub fn contains(&self, name: &str) -> bool {
        self.current.load().contains(name)
    }

    /// Number of tools now.
    pub fn len(&self) -> usize {
        self.current.load().len()
    }

    /// True when empty now.
    pub fn is_empty(&self) -> bool {
        self.current.load().is_empty()
    }

    /// The current version (see [`RegistrySnapshot::version`]).
    pub fn version(&self) -> u64 {
        self.current.load().version
    }

    /// Runs one writer: `build` gets the current snapshot and returns the
    /// next entries, `None` for "no change" or an error for "refused"; the
    /// new snapshot (with the next version) is swapped in. Returns whether
    /// something changed.
    fn change(
        &self,
        build: impl FnOnce(&RegistrySnapshot) -> Result<Option<IndexMap<Arc<str>, Arc<RegisteredTool>>>, RegistryError>,
    ) -> Result<bool, RegistryError> {
        // A panic while another writer held the lock cannot have left a half
        // change behind: snapshots are only ever swapped in whole. So a
        // poisoned lock is as good as a free one.
        let _writer = self.writer.lock_unpoisoned();
        let current = self.current.load();
        let Some(entries) = build(&current)? else {
            return Ok(false);
        };
        let version = current.version.wrapping_add(1);
        self.current.store(Arc::new(RegistrySnapshot { entries, version }));
        Ok(true)
    }
}

/// Checks a batch of new tools on its own (names well-formed and distinct)
/// and indexes it, keeping its order.
fn new_entries(
    tools: impl IntoIterator<Item = (ToolCatalogItem, Arc<dyn ToolHandler>)>,
    undeclared: bool,
) -> Result<IndexMap<Arc<str>, Arc<RegisteredTool>>, RegistryError> {
    let tools = tools.into_iter();
    let mut entries = IndexMap::with_capacity(tools.size_hint().0);
    for (item, handler) in tools {
        if parse_tool_name(item.name()).is_none() {
            return Err(RegistryError::InvalidName(item.name().to_owned()));
        }
        let name = Arc::clone(item.shared_name());
        if entries.contains_key(&name) {
            return Err(RegistryError::Duplicate(name.to_string()));
        }
        entries.insert(name, Arc::new(RegisteredTool { item, handler, undeclared }));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::{ToolOutput, sync_handler};
    use serde_json::json;

    fn noop() -> Arc<dyn ToolHandler> {
        sync_handler(|_, _| Ok(ToolOutput::Value(json!(null))))
    }

    fn names(snapshot: &RegistrySnapshot) -> Vec<&str> {
        snapshot.iter().map(|t| t.item.name()).collect()
    }

    #[test]
    fn keeps_order_and_refuses_duplicates() {
        let registry = ToolRegistry::new();
        for name in ["b__one", "a__two", "c__three"] {
            assert_eq!(registry.register(ToolCatalogItem::new(name, ToolSource::config("x")), noop()), Ok(()));
        }
        assert_eq!(names(&registry.snapshot()), ["b__one", "a__two", "c__three"]);
        let again = registry.register(ToolCatalogItem::new("a__two", ToolSource::extension("e")), noop());
        assert_eq!(again, Err(RegistryError::Duplicate("a__two".into())));
        assert_eq!(registry.len(), 3);
        assert_eq!(registry.version(), 3);
    }

    #[test]
    fn refuses_malformed_names() {
        let registry = ToolRegistry::new();
        for bad in ["plain", "__x", "x__", "a__b__c"] {
            assert_eq!(
                registry.register(ToolCatalogItem::new(bad, ToolSource::extension("e")), noop()),
                Err(RegistryError::InvalidName(bad.into()))
            );
        }
        assert_eq!(registry.version(), 0);
    }

    /// A Tool of the bundle the agent does not declare holds its name only
    /// until something else of the agent registers it: an extension's tool
    /// or an MCP server's replaces it in place; another undeclared one, or
    /// anything over a tool that is not undeclared, is refused.
    #[test]
    fn undeclared_tools_give_way() {
        let registry = ToolRegistry::new();
        let config = |name: &str| (ToolCatalogItem::new(name, ToolSource::config("x")), noop());
        assert_eq!(registry.register_all([config("own__a")]), Ok(()));
        assert_eq!(registry.register_undeclared([config("other__a"), config("other__b"), config("spare__c")]), Ok(()));
        let snapshot = registry.snapshot();
        assert!(snapshot.get("other__a").is_some_and(|tool| tool.undeclared));
        assert!(snapshot.get("own__a").is_some_and(|tool| !tool.undeclared));
        assert_eq!(snapshot.dynamic_items().count(), 0, "config tools join no catalog of their own accord");

        assert_eq!(registry.register_undeclared([config("own__a")]), Err(RegistryError::Duplicate("own__a".into())));
        assert_eq!(
            registry.register_undeclared([config("spare__c")]),
            Err(RegistryError::Duplicate("spare__c".into()))
        );
        let refused = registry.register(ToolCatalogItem::new("own__a", ToolSource::extension("e")), noop());
        assert_eq!(refused, Err(RegistryError::Duplicate("own__a".into())));

        let extension = ToolCatalogItem::new("other__a", ToolSource::extension("e"));
        assert_eq!(registry.register(extension, noop()), Ok(()));
        let mcp = ToolSource::mcp("mcp", "other");
        assert_eq!(
            registry.replace_source(&mcp, vec![(ToolCatalogItem::new("other__b", mcp.clone()), noop())]),
            Ok(())
        );
        let snapshot = registry.snapshot();
        assert_eq!(names(&snapshot), ["own__a", "other__a", "spare__c", "other__b"]);
        assert!(
            snapshot
                .get("other__a")
                .is_some_and(|tool| !tool.undeclared && tool.item.source().kind == ToolSourceKind::Extension)
        );
        assert!(snapshot.get("other__b").is_some_and(|tool| tool.item.source() == &mcp));
        assert_eq!(snapshot.dynamic_items().map(ToolCatalogItem::name).collect::<Vec<_>>(), ["other__a", "other__b"]);
    }

    #[test]
    fn dynamic_items_are_the_non_config_ones() {
        let registry = ToolRegistry::new();
        let _ = registry.register(ToolCatalogItem::new("bash__exec", ToolSource::config("bash")), noop());
        let _ = registry.register(ToolCatalogItem::new("weather__get", ToolSource::extension("weather")), noop());
        let snapshot = registry.snapshot();
        assert_eq!(snapshot.dynamic_items().map(ToolCatalogItem::name).collect::<Vec<_>>(), ["weather__get"]);
    }

    #[test]
    fn register_all_is_all_or_nothing() {
        let registry = ToolRegistry::new();
        let _ = registry.register(ToolCatalogItem::new("a__one", ToolSource::extension("e")), noop());
        let batch = |names: &[&str]| {
            names
                .iter()
                .map(|name| (ToolCatalogItem::new(*name, ToolSource::extension("e")), noop()))
                .collect::<Vec<_>>()
        };
        assert_eq!(registry.register_all(batch(&["b__two", "a__one"])), Err(RegistryError::Duplicate("a__one".into())));
        assert_eq!(registry.register_all(batch(&["b__two", "b__two"])), Err(RegistryError::Duplicate("b__two".into())));
        assert_eq!(registry.register_all(batch(&["b__two", "bad"])), Err(RegistryError::InvalidName("bad".into())));
        assert_eq!((registry.len(), registry.version()), (1, 1));

        assert_eq!(registry.register_all(batch(&["b__two", "c__three"])), Ok(()));
        assert_eq!(names(&registry.snapshot()), ["a__one", "b__two", "c__three"]);
        // One change, one version.
        assert_eq!(registry.version(), 2);
        // An empty batch changes nothing.
        assert_eq!(registry.register_all(batch(&[])), Ok(()));
        assert_eq!(registry.version(), 2);
    }

    #[test]
    fn unregister_keeps_the_order_of_the_rest() {
        let registry = ToolRegistry::new();
        for name in ["a__one", "b__two", "c__three"] {
            let _ = registry.register(ToolCatalogItem::new(name, ToolSource::extension("e")), noop());
        }
        assert!(registry.unregister("b__two"));
        assert_eq!(names(&registry.snapshot()), ["a__one", "c__three"]);
        assert_eq!(registry.version(), 4);
        assert!(!registry.unregister("b__two"));
        assert_eq!(registry.version(), 4);
    }

    #[test]
    fn replace_source_keeps_the_place_of_the_source() {
        let mcp = ToolSource::extension("mcp-bridge");
        let registry = ToolRegistry::new();
        let _ = registry.register(ToolCatalogItem::new("a__one", ToolSource::extension("e")), noop());
        let _ = registry.register(ToolCatalogItem::new("m__old", mcp.clone()), noop());
        let _ = registry.register(ToolCatalogItem::new("z__last", ToolSource::extension("e")), noop());
        let fresh = vec![
            (ToolCatalogItem::new("m__new", mcp.clone()), noop()),
            (ToolCatalogItem::new("m__old", mcp.clone()), noop()),
        ];
        assert_eq!(registry.replace_source(&mcp, fresh), Ok(()));
        assert_eq!(names(&registry.snapshot()), ["a__one", "m__new", "m__old", "z__last"]);

        // A source with no tools yet appends them; an empty set removes them.
        let other = ToolSource::extension("other");
        assert_eq!(
            registry.replace_source(&other, vec![(ToolCatalogItem::new("o__x", other.clone()), noop())]),
            Ok(())
        );
        assert_eq!(names(&registry.snapshot()), ["a__one", "m__new", "m__old", "z__last", "o__x"]);
        assert_eq!(registry.replace_source(&mcp, Vec::new()), Ok(()));
        assert_eq!(names(&registry.snapshot()), ["a__one", "z__last", "o__x"]);
    }

    #[test]
    fn replace_source_refuses_tools_of_another_source() {
        let mcp = ToolSource::extension("mcp-bridge");
        let registry = ToolRegistry::new();
        let stray = vec![(ToolCatalogItem::new("m__x", ToolSource::extension("elsewhere")), noop())];
        assert_eq!(registry.replace_source(&mcp, stray), Err(RegistryError::WrongSource("m__x".into())));
        assert_eq!(registry.version(), 0);
    }
}
