//! `tool-search`: the model sees a search tool instead of the whole catalog.
//!
//! For agents with hundreds of tools (MCP servers), sending every definition
//! with every request costs more tokens than the conversation. With this
//! extension a step's catalog holds only the search tool (`toolName`,
//! default `tool-search__search`) and the tools the last search selected; a
//! search ranks the step's full catalog by the query and selects the best
//! `maxResults` (or the call's `limit`), which the next step offers.
//!
//! Config (the original's fields and defaults): `toolName`
//! (`tool-search__search`), `maxResults` (10), `minQueryLength` (1; a
//! shorter query selects nothing and changes nothing), `persistSelection`
//! (true: the selection is kept in the extension's state, `selectedTools`
//! and `lastQuery` as the original writes them, and holds across turns and
//! restarts; false: it lasts until the end of the turn).
//!
//! The step layer removes the other tools from the step's catalog, which is
//! also the step's allow-list: a tool that is not selected cannot be called
//! (`E_TOOL_NOT_IN_CATALOG`) until a search selects it.

use goondan_core::sync::LockUnpoisoned;
use std::sync::{Arc, Mutex};

use goondan_core::{JsonObject, JsonValue};
use goondan_runtime::context::{StepContext, StepOutcome};
use goondan_runtime::extension::{AgentExtension, ExtensionError, ExtensionSetup};
use goondan_runtime::extension_state::ExtensionStateStore;
use goondan_tools::{
    BoxFuture, HandlerResult, Middleware, Next, ToolCatalog, ToolCatalogItem, ToolContext, ToolFailure, ToolHandler,
    ToolOutput, ToolSource,
};
use serde_json::json;

use crate::fields::{self, Fields};

/// The Extension's name.
pub(crate) const NAME: &str = "tool-search";

/// The extension's settings, from its config.
#[derive(Debug, Clone, PartialEq)]
struct Settings {
    tool_name: Arc<str>,
    max_results: usize,
    min_query_length: usize,
    persist_selection: bool,
}

impl Settings {
    fn from_config(extension: &AgentExtension) -> Result<Self, ExtensionError> {
        let fields = Fields::new(&extension.name, &extension.config);
        let tool_name = fields.string("toolName")?.unwrap_or("tool-search__search");
        if goondan_core::naming::parse_tool_name(tool_name).is_none() {
            return Err(fields::init_error(
                extension,
                "toolName",
                format!("'{tool_name}' is not a tool name of the form 'resource__export'"),
            ));
        }
        Ok(Self {
            tool_name: Arc::from(tool_name),
            max_results: fields.integer("maxResults", 1, 10)?,
            min_query_length: fields.integer("minQueryLength", 0, 1)?,
            persist_selection: fields.boolean("persistSelection", true)?,
        })
    }
}

/// What the step layer and the search tool share.
struct Shared {
    /// The extension's name: the key of its state.
    extension: String,
    settings: Settings,
    state: Arc<ExtensionStateStore>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The tools the last search selected.
    selected: Vec<Arc<str>>,
    /// The catalog of the current step as the layer received it, before it
    /// kept only the selection: what a search ranks.
    catalog: Arc<ToolCatalog>,
}

impl Shared {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock_unpoisoned()
    }
}

/// Installs the search tool and the step layer.
pub(crate) async fn install(setup: &mut ExtensionSetup<'_>, extension: &AgentExtension) -> Result<(), ExtensionError> {
    let settings = Settings::from_config(extension)?;
    let mut inner = Inner::default();
    if settings.persist_selection {
        let stored =
            setup.state.get(&extension.name).await.map_err(|e| {
                ExtensionError::new(&extension.name, fields::E_EXT_INIT, format!("reading its state: {e}"))
            })?;
        if let Some(stored) = stored {
            inner.selected = read_selection(&stored);
        }
    }
    let shared = Arc::new(Shared {
        extension: extension.name.clone(),
        settings,
        state: Arc::clone(&setup.state),
        inner: Mutex::new(inner),
    });
    let item = ToolCatalogItem::new(Arc::clone(&shared.settings.tool_name), ToolSource::extension(&extension.name))
        .with_description("Search available tools and store next-step catalog selection")
        .with_parameters(json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Words describing the tool you need."},
                "limit": {"type": "number", "description": "How many tools to select at most."}
            },
            "required": ["query"]
        }));
    setup
        .tooling
        .registry()
        .register(item, Arc::new(SearchTool(Arc::clone(&shared))))
        .map_err(|e| fields::init_error(extension, "toolName", e))?;
    setup.tooling.step_middleware.register(extension.name.as_str(), 0, Arc::new(SelectionLayer(shared)));
    Ok(())
}

/// The selection in the state as the original keeps it: `selectedTools`
/// (strings; anything else is skipped, as the original does). Its
/// `lastQuery` is only written, for the record, and its `catalogSnapshot`
/// is not needed here (the layer keeps the step's catalog in memory).
fn read_selection(stored: &JsonObject) -> Vec<Arc<str>> {
    match stored.get("selectedTools") {
        Some(JsonValue::Array(names)) => names.iter().filter_map(JsonValue::as_str).map(Arc::from).collect(),
        _ => Vec::new(),
    }
}

/// Keeps the search tool and the selection in the step's catalog.
struct SelectionLayer(Arc<Shared>);

impl Middleware<StepContext, StepOutcome> for SelectionLayer {
    fn handle<'a>(
        &'a self,
        ctx: &'a mut StepContext,
        next: Next<'a, StepContext, StepOutcome>,
    ) -> BoxFuture<'a, StepOutcome> {
        let shared = &self.0;
        {
            let mut inner = shared.inner();
            // Without persistence a selection lasts for the turn it was made in.
            if ctx.step_index == 0 && !shared.settings.persist_selection {
                inner.selected.clear();
            }
            // The full catalog moves into the snapshot; only the few items
            // offered are cloned back.
            let full = std::mem::take(&mut ctx.tool_catalog);
            let search_tool = &shared.settings.tool_name;
            let selected = &inner.selected;
            ctx.tool_catalog = full
                .iter()
                .filter(|item| item.name() == &**search_tool || selected.iter().any(|name| **name == *item.name()))
                .cloned()
                .collect();
            inner.catalog = Arc::new(full);
        }
        next.run(ctx)
    }
}

/// The search tool.
struct SearchTool(Arc<Shared>);

impl ToolHandler for SearchTool {
    fn call<'a>(&'a self, _ctx: &'a ToolContext, input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        Box::pin(self.search(input))
    }
}

impl SearchTool {
    async fn search(&self, input: &JsonObject) -> HandlerResult {
        let shared = &self.0;
        let settings = &shared.settings;
        // The schema made `query` a string; `limit` a number if present.
        let query = input.get("query").and_then(JsonValue::as_str).unwrap_or_default();
        let normalized = query.trim().to_lowercase();
        if normalized.chars().count() < settings.min_query_length {
            return Ok(ToolOutput::Value(json!({"query": query, "results": [], "selectedTools": []})));
        }
        let limit = input
            .get("limit")
            .and_then(JsonValue::as_f64)
            .map_or(settings.max_results, |limit| limit.floor().clamp(1.0, settings.max_results as f64) as usize);
        let (results, selected) = {
            let mut inner = shared.inner();
            let ranked = rank(inner.catalog.iter(), &settings.tool_name, &normalized, limit);
            let results: Vec<JsonValue> = ranked
                .iter()
                .map(|item| match item.description() {
                    Some(description) if !description.is_empty() => {
                        json!({"name": item.name(), "description": description})
                    }
                    _ => json!({"name": item.name()}),
                })
                .collect();
            let selected: Vec<Arc<str>> = ranked.iter().map(|item| Arc::clone(item.shared_name())).collect();
            inner.selected.clone_from(&selected);
            (results, selected)
        };
        let selected: Vec<&str> = selected.iter().map(|name| &**name).collect();
        if settings.persist_selection {
            let state = json!({"selectedTools": selected, "lastQuery": query});
            shared.state.set(&shared.extension, state).await.map_err(|e| {
                ToolFailure::new(format!("the selection could not be saved: {e}"))
                    .suggest("Search again; the selection holds for this turn only until it is saved.")
            })?;
        }
        Ok(ToolOutput::Value(json!({"query": query, "results": results, "selectedTools": selected})))
    }
}

/// The `limit` items of `catalog` (the search tool itself left out) that
/// match `query` (trimmed, lowercase) best, best first; ties keep catalog
/// order. An item matches when its name or description contains the whole
/// query (as in the original) or any of its words of two or more
/// characters; the whole query counts
/// more than a word, the name more than the description.
fn rank<'a>(
    catalog: impl Iterator<Item = &'a ToolCatalogItem>,
    search_tool: &str,
    query: &str,
    limit: usize,
) -> Vec<&'a ToolCatalogItem> {
    // One-letter words ("a") would match nearly every tool.
    let words: Vec<&str> = query.split_whitespace().filter(|word| word.chars().nth(1).is_some()).collect();
    let mut scored: Vec<(u32, &ToolCatalogItem)> = catalog
        .filter(|item| item.name() != search_tool)
        .filter_map(|item| {
            let name = item.name().to_lowercase();
            let description = item.description().map(str::to_lowercase).unwrap_or_default();
            let mut score = 0;
            if name == query {
                score += 1000;
            }
            if name.contains(query) {
                score += 100;
            }
            if description.contains(query) {
                score += 50;
            }
            for word in &words {
                if name.contains(word) {
                    score += 10;
                }
                if description.contains(word) {
                    score += 3;
                }
            }
            (score > 0).then_some((score, item))
        })
        .collect();
    // A stable sort: equal scores keep catalog order.
    scored.sort_by_key(|(score, _)| std::cmp::Reverse(*score));
    scored.into_iter().take(limit).map(|(_, item)| item).collect()
}

#[cfg(test)]
mod tests {
    use goondan_runtime::agent::AgentTooling;

    use super::*;
    use crate::fields::tests::extension;

    fn item(name: &str, description: &str) -> ToolCatalogItem {
        ToolCatalogItem::new(name, ToolSource::config("x")).with_description(description)
    }

    #[test]
    fn ranking_prefers_whole_query_and_names_and_keeps_catalog_order_for_ties() {
        let catalog = [
            item("tool-search__search", "Search available tools"),
            item("files__read", "Read a file from the workspace"),
            item("slack__send", "Send a message to a Slack channel"),
            item("telegram__send", "Send a message to a Telegram chat"),
            item("mail__send_message", "Deliver an email"),
            item("weather__get", "Current weather for a city"),
        ];
        let names = |query: &str, limit| -> Vec<String> {
            rank(catalog.iter(), "tool-search__search", query, limit).iter().map(|i| i.name().to_owned()).collect()
        };
        assert_eq!(names("slack", 10), ["slack__send"]);
        // Both words in the name beat one word in the name and both in the description.
        assert_eq!(names("send message", 10), ["mail__send_message", "slack__send", "telegram__send"]);
        // The whole query in a description beats its words.
        assert_eq!(names("a message", 10), ["slack__send", "telegram__send", "mail__send_message"]);
        assert_eq!(names("send", 2), ["slack__send", "telegram__send"]);
        // Any word matches; the search tool itself never is a result.
        assert_eq!(names("weather file", 10), ["files__read", "weather__get"]);
        assert!(names("tools", 10).is_empty());
        assert!(names("nothing-like-it", 10).is_empty());
    }

    #[test]
    fn bad_config_is_refused_naming_the_field() {
        let settings = Settings::from_config(&extension(NAME, json!({}))).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            settings,
            Settings {
                tool_name: Arc::from("tool-search__search"),
                max_results: 10,
                min_query_length: 1,
                persist_selection: true
            }
        );
        for (config, field) in [
            (json!({"toolName": "search"}), "config.toolName"),
            (json!({"maxResults": 0}), "config.maxResults"),
            (json!({"minQueryLength": -1}), "config.minQueryLength"),
            (json!({"persistSelection": "yes"}), "config.persistSelection"),
        ] {
            let error = Settings::from_config(&extension(NAME, config)).err().unwrap_or_else(|| panic!("{field}"));
            assert_eq!(error.code, "E_EXT_INIT");
            assert!(error.message.starts_with(field), "{}", error.message);
        }
    }

    /// An agent with three dynamic tools and tool-search configured with `config`.
    async fn agent_with(config: serde_json::Value, state: &Arc<ExtensionStateStore>) -> AgentTooling {
        let registry = goondan_tools::ToolRegistry::new();
        for (name, description) in
            [("mail__send", "Send an email"), ("chat__post", "Post to a channel"), ("disk__read", "Read a file")]
        {
            let item = ToolCatalogItem::new(name, ToolSource::extension("other")).with_description(description);
            let handler = goondan_tools::sync_handler(|_, _| Ok(ToolOutput::Value(json!("ok"))));
            registry.register(item, handler).unwrap_or_else(|e| panic!("{e}"));
        }
        let executor = goondan_tools::ToolExecutor::new(Arc::new(registry));
        let events: Arc<dyn goondan_tools::events::EventSink> = Arc::new(goondan_tools::events::NoopEventSink);
        let mut tooling = AgentTooling::new("a", "k", std::path::Path::new("/"), Default::default(), executor, events);
        let env: goondan_runtime::agent::EnvLookup = Arc::new(|_: &str| None);
        let extension = extension(NAME, config);
        let mut setup = ExtensionSetup {
            tooling: &mut tooling,
            extensions: std::slice::from_ref(&extension),
            state: Arc::clone(state),
            env: &env,
        };
        install(&mut setup, &extension).await.unwrap_or_else(|e| panic!("{e}"));
        tooling
    }

    async fn offered(tooling: &AgentTooling) -> Vec<String> {
        tooling.preview_catalog(Default::default()).await.names().map(str::to_owned).collect()
    }

    #[tokio::test]
    async fn a_selection_is_offered_and_kept_across_turns_only_when_persisted() {
        let state = Arc::new(ExtensionStateStore::in_memory());
        let tooling = agent_with(json!({}), &state).await;
        assert_eq!(offered(&tooling).await, ["tool-search__search"]);
        let found =
            tooling.call_tool("tool-search__search", JsonObject::from_iter([("query".into(), json!("send"))])).await;
        assert_eq!(
            found.output,
            Some(
                json!({"query": "send", "results": [{"name": "mail__send", "description": "Send an email"}], "selectedTools": ["mail__send"]})
            )
        );
        // Every preview is the first step of a turn: the selection holds.
        assert_eq!(offered(&tooling).await, ["mail__send", "tool-search__search"]);
        let saved = state.get(NAME).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(saved, json!({"selectedTools": ["mail__send"], "lastQuery": "send"}).as_object().cloned());
        // A new agent on the same state starts with it.
        let again = agent_with(json!({}), &state).await;
        assert_eq!(offered(&again).await, ["mail__send", "tool-search__search"]);
        // The selection only has tools that exist and is replaced by the next search.
        let found = again
            .call_tool(
                "tool-search__search",
                JsonObject::from_iter([("query".into(), json!("post read")), ("limit".into(), json!(1.7))]),
            )
            .await;
        assert_eq!(found.output.as_ref().map(|o| o["selectedTools"].clone()), Some(json!(["chat__post"])));
        // Too short a query selects nothing and changes nothing.
        let short = agent_with(json!({"minQueryLength": 3}), &state).await;
        let found =
            short.call_tool("tool-search__search", JsonObject::from_iter([("query".into(), json!(" ab "))])).await;
        assert_eq!(found.output, Some(json!({"query": " ab ", "results": [], "selectedTools": []})));
        assert_eq!(offered(&short).await, ["chat__post", "tool-search__search"]);

        let fresh = Arc::new(ExtensionStateStore::in_memory());
        let turn_only = agent_with(json!({"persistSelection": false}), &fresh).await;
        let found =
            turn_only.call_tool("tool-search__search", JsonObject::from_iter([("query".into(), json!("send"))])).await;
        assert_eq!(found.output.as_ref().map(|o| o["selectedTools"].clone()), Some(json!(["mail__send"])));
        // The next turn's first step starts without it, and nothing was saved.
        assert_eq!(offered(&turn_only).await, ["tool-search__search"]);
        assert_eq!(fresh.get(NAME).await.unwrap_or_else(|e| panic!("{e}")), None);
    }

    #[test]
    fn the_state_is_read_as_the_original_writes_it() {
        let stored = json!({
            "selectedTools": ["a__b", 3, "c__d"],
            "lastQuery": "q",
            "catalogSnapshot": [{"name": "a__b"}]
        });
        let selected = read_selection(stored.as_object().unwrap_or_else(|| panic!("object")));
        assert_eq!(selected, [Arc::from("a__b"), Arc::from("c__d")]);
    }
}
