//! Integration tests of a registry that changes while the agent runs
//! (extensions registering tools, MCP servers connecting and refreshing),
//! through the public API: changes reach the next step's catalog and the
//! executor without rebuilding anything, snapshots stay stable, and lookups
//! keep working while tools are registered from another thread.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use goondan_core::{JsonObject, JsonValue, Message, ToolCall, ToolResult};
use goondan_tools::assembly::AgentTools;
use goondan_tools::{
    CallScope, ExecutorPolicy, RegistryError, ToolCatalog, ToolCatalogItem, ToolContext, ToolExecutor, ToolHandler,
    ToolOutput, ToolRegistry, ToolSource, sync_handler,
};
use serde_json::json;

fn scope() -> Arc<CallScope> {
    Arc::new(CallScope {
        agent_name: "coder".into(),
        instance_key: "inst-1".into(),
        turn_id: "turn-1".into(),
        step_id: "step-1".into(),
        step_index: 0,
        message: Arc::new(Message::assistant_tool_calls("step-1", Vec::new())),
        workdir: Arc::from(Path::new("/tmp/goondan-tests/inst-1")),
        trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
        step_span_id: "b7ad6b7169203331".into(),
        runtime: None,
        tasks: None,
    })
}

fn call(name: &str, args: JsonValue) -> ToolCall {
    let JsonValue::Object(args) = args else { panic!("arguments must be an object") };
    ToolCall { id: "call-1".into(), name: name.into(), args }
}

fn ext(extension: &str, name: &str) -> ToolCatalogItem {
    ToolCatalogItem::new(name, ToolSource::extension(extension))
}

/// Answers `{"tool": label}`, so a result tells which handler ran.
fn answering(label: &'static str) -> Arc<dyn ToolHandler> {
    sync_handler(move |_, _| Ok(ToolOutput::Value(json!({ "tool": label }))))
}

fn registered(registry: &ToolRegistry, item: ToolCatalogItem, handler: Arc<dyn ToolHandler>) {
    let name = item.name().to_owned();
    registry.register(item, handler).unwrap_or_else(|e| panic!("register {name}: {e}"));
}

fn names(catalog: &ToolCatalog) -> Vec<&str> {
    catalog.names().collect()
}

fn step_catalog(tools: &AgentTools, executor: &ToolExecutor) -> Arc<ToolCatalog> {
    Arc::new(tools.step_catalog(executor.registry()))
}

fn output(result: &ToolResult) -> JsonValue {
    assert!(!result.is_error(), "expected success, got {result:?}");
    serde_json::to_value(result).unwrap_or_else(|e| panic!("{e}"))["output"].clone()
}

// ---------------------------------------------------------------------------
// Through the executor and the step catalog
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_tool_registered_after_the_executor_was_built_joins_the_next_step() {
    let registry = Arc::new(ToolRegistry::new());
    registered(&registry, ext("weather-ext", "weather__get"), answering("weather"));
    let executor = ToolExecutor::new(Arc::clone(&registry));
    let tools = AgentTools::default();
    let step = scope();

    let first = step_catalog(&tools, &executor);
    assert_eq!(names(&first), ["weather__get"]);

    // An extension registers a tool while the agent runs.
    registered(executor.registry(), ext("news-ext", "news__top"), answering("news"));

    // The step already under way keeps its catalog: the new tool is not offered there.
    let refused = executor.execute(call("news__top", json!({})), &step, &first).await;
    assert_eq!(refused.error_code(), Some("E_TOOL_NOT_IN_CATALOG"));

    // The next step offers it, and it runs.
    let second = step_catalog(&tools, &executor);
    assert_eq!(names(&second), ["weather__get", "news__top"]);
    let ran = executor.execute(call("news__top", json!({})), &step, &second).await;
    assert_eq!(output(&ran), json!({"tool": "news"}));
}

#[tokio::test]
async fn a_tool_registered_later_is_reachable_through_the_registry_when_the_policy_allows() {
    let registry = Arc::new(ToolRegistry::new());
    let executor = ToolExecutor::new(Arc::clone(&registry))
        .with_policy(ExecutorPolicy { allow_registry_calls: true, call_timeout: None });
    let empty = Arc::new(ToolCatalog::new());
    let step = scope();

    let missing = executor.execute(call("late__tool", json!({})), &step, &empty).await;
    assert_eq!(missing.error_code(), Some("E_TOOL_NOT_IN_CATALOG"));

    registered(&registry, ext("late-ext", "late__tool"), answering("late"));
    let ran = executor.execute(call("late__tool", json!({})), &step, &empty).await;
    assert_eq!(output(&ran), json!({"tool": "late"}));
}

#[tokio::test]
async fn unregistering_removes_a_tool_from_the_next_catalog() {
    let registry = Arc::new(ToolRegistry::new());
    registered(&registry, ext("weather-ext", "weather__get"), answering("weather"));
    registered(&registry, ext("news-ext", "news__top"), answering("news"));
    let executor = ToolExecutor::new(Arc::clone(&registry));
    let tools = AgentTools::default();
    let step = scope();
    let first = step_catalog(&tools, &executor);

    assert!(registry.unregister("weather__get"));
    assert!(!registry.unregister("weather__get"));

    // Still offered by the step under way, but nothing can run it any more.
    let gone = executor.execute(call("weather__get", json!({})), &step, &first).await;
    assert_eq!(gone.error_code(), Some("E_TOOL_NOT_FOUND"));

    // The next step no longer offers it.
    let second = step_catalog(&tools, &executor);
    assert_eq!(names(&second), ["news__top"]);
    let refused = executor.execute(call("weather__get", json!({})), &step, &second).await;
    assert_eq!(refused.error_code(), Some("E_TOOL_NOT_IN_CATALOG"));
    let kept = executor.execute(call("news__top", json!({})), &step, &second).await;
    assert_eq!(output(&kept), json!({"tool": "news"}));
}

#[tokio::test]
async fn a_handler_may_change_the_registry_while_it_runs() {
    // The handler unregisters itself and registers a successor: no lock is
    // held across the handler, so this neither deadlocks nor cuts the
    // running call short.
    let registry = Arc::new(ToolRegistry::new());
    let weak: Weak<ToolRegistry> = Arc::downgrade(&registry);
    let handler = sync_handler(move |_, _| {
        let Some(registry) = weak.upgrade() else { return Ok(ToolOutput::Value(json!("registry gone"))) };
        let removed = registry.unregister("phoenix__burn");
        let added = registry.register(ext("phoenix", "phoenix__rise"), answering("rise")).is_ok();
        Ok(ToolOutput::Value(json!({"removed": removed, "added": added})))
    });
    registered(&registry, ext("phoenix", "phoenix__burn"), handler);
    let executor = ToolExecutor::new(Arc::clone(&registry));
    let tools = AgentTools::default();
    let step = scope();

    let first = step_catalog(&tools, &executor);
    let burned = executor.execute(call("phoenix__burn", json!({})), &step, &first).await;
    assert_eq!(output(&burned), json!({"removed": true, "added": true}));

    let second = step_catalog(&tools, &executor);
    assert_eq!(names(&second), ["phoenix__rise"]);
    let rose = executor.execute(call("phoenix__rise", json!({})), &step, &second).await;
    assert_eq!(output(&rose), json!({"tool": "rise"}));
}

// ---------------------------------------------------------------------------
// replace_source
// ---------------------------------------------------------------------------

fn mcp() -> ToolSource {
    ToolSource::extension("mcp-github")
}

#[tokio::test]
async fn replace_source_swaps_one_sources_tools_at_once() {
    let registry = Arc::new(ToolRegistry::new());
    registered(&registry, ext("weather-ext", "weather__get"), answering("weather"));
    registered(&registry, ToolCatalogItem::new("github__issues", mcp()), answering("issues v1"));
    registered(&registry, ToolCatalogItem::new("github__pulls", mcp()), answering("pulls"));
    registered(&registry, ext("news-ext", "news__top"), answering("news"));
    let before = registry.snapshot();

    // tools/list_changed: `pulls` went away, `issues` changed, `search` is new.
    let refreshed = vec![
        (ToolCatalogItem::new("github__issues", mcp()), answering("issues v2")),
        (ToolCatalogItem::new("github__search", mcp()), answering("search")),
    ];
    registry.replace_source(&mcp(), refreshed).unwrap_or_else(|e| panic!("{e}"));

    let after = registry.snapshot();
    let order = |s: &goondan_tools::RegistrySnapshot| s.iter().map(|t| t.item.name().to_owned()).collect::<Vec<_>>();
    assert_eq!(order(&before), ["weather__get", "github__issues", "github__pulls", "news__top"]);
    // The new tools take the old ones' place; the other sources are untouched.
    assert_eq!(order(&after), ["weather__get", "github__issues", "github__search", "news__top"]);
    assert_eq!(after.version(), before.version() + 1);

    let executor = ToolExecutor::new(Arc::clone(&registry));
    let catalog = step_catalog(&AgentTools::default(), &executor);
    let step = scope();
    let issues = executor.execute(call("github__issues", json!({})), &step, &catalog).await;
    assert_eq!(output(&issues), json!({"tool": "issues v2"}));
    let pulls = executor.execute(call("github__pulls", json!({})), &step, &catalog).await;
    assert_eq!(pulls.error_code(), Some("E_TOOL_NOT_IN_CATALOG"));
}

#[test]
fn replace_source_refuses_a_name_of_another_source_and_changes_nothing() {
    let registry = ToolRegistry::new();
    registered(&registry, ext("weather-ext", "weather__get"), answering("weather"));
    registered(&registry, ToolCatalogItem::new("github__issues", mcp()), answering("issues"));
    let before = registry.snapshot();

    let clash = vec![
        (ToolCatalogItem::new("github__search", mcp()), answering("search")),
        (ToolCatalogItem::new("weather__get", mcp()), answering("impostor")),
    ];
    assert_eq!(registry.replace_source(&mcp(), clash), Err(RegistryError::Duplicate("weather__get".into())));

    let twice = vec![
        (ToolCatalogItem::new("github__search", mcp()), answering("search")),
        (ToolCatalogItem::new("github__search", mcp()), answering("search")),
    ];
    assert_eq!(registry.replace_source(&mcp(), twice), Err(RegistryError::Duplicate("github__search".into())));

    let malformed = vec![(ToolCatalogItem::new("search", mcp()), answering("search"))];
    assert_eq!(registry.replace_source(&mcp(), malformed), Err(RegistryError::InvalidName("search".into())));

    let after = registry.snapshot();
    assert_eq!(after.version(), before.version());
    assert_eq!(after.iter().map(|t| t.item.name()).collect::<Vec<_>>(), ["weather__get", "github__issues"]);
    assert_eq!(
        registry.get("weather__get").map(|t| t.item.source().clone()),
        Some(ToolSource::extension("weather-ext"))
    );
}

// ---------------------------------------------------------------------------
// Snapshots and concurrency
// ---------------------------------------------------------------------------

#[test]
fn a_snapshot_does_not_see_later_changes() {
    let registry = ToolRegistry::new();
    registered(&registry, ext("e", "a__one"), answering("one"));
    let snapshot = registry.snapshot();
    let version = snapshot.version();

    registered(&registry, ext("e", "b__two"), answering("two"));
    assert!(registry.unregister("a__one"));

    assert_eq!(snapshot.version(), version);
    assert_eq!(snapshot.len(), 1);
    assert!(snapshot.contains("a__one"));
    assert!(snapshot.get("b__two").is_none());
    assert_eq!(snapshot.dynamic_items().map(ToolCatalogItem::name).collect::<Vec<_>>(), ["a__one"]);

    assert_eq!(registry.version(), version + 2);
    assert!(!registry.contains("a__one"));
    assert!(registry.contains("b__two"));
}

#[test]
fn lookups_never_miss_a_registered_tool_while_another_thread_registers() {
    const TOOLS: usize = 1_000;
    const READERS: usize = 4;
    let name = |i: usize| format!("t{i:04}__run");
    let registry = ToolRegistry::new();
    // How many tools the writer has finished registering.
    let published = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let handler = answering("t");

    std::thread::scope(|threads| {
        for reader in 0..READERS {
            let (registry, published, done) = (&registry, &published, &done);
            threads.spawn(move || {
                let mut last_version = 0;
                let mut probe = reader;
                loop {
                    // Read `done` first: once set, every tool is published.
                    let finished = done.load(Ordering::Acquire);
                    let known = published.load(Ordering::Acquire);
                    if known > 0 {
                        // The newest and one older tool that must be there.
                        probe = (probe * 31 + 7) % known;
                        for index in [known - 1, probe] {
                            assert!(
                                registry.get(&name(index)).is_some(),
                                "{} missing with {known} published",
                                name(index)
                            );
                        }
                    }
                    let snapshot = registry.snapshot();
                    assert!(snapshot.len() >= known, "snapshot of {} tools after {known} published", snapshot.len());
                    assert!(snapshot.version() >= last_version, "version went back");
                    last_version = snapshot.version();
                    if finished {
                        break;
                    }
                    // Four spinning readers on a two-core machine would starve
                    // the writer; readers still overlap every registration.
                    std::thread::yield_now();
                }
            });
        }
        threads.spawn(|| {
            for index in 0..TOOLS {
                registered(&registry, ext("e", &name(index)), Arc::clone(&handler));
                published.store(index + 1, Ordering::Release);
            }
            done.store(true, Ordering::Release);
        });
    });

    assert_eq!(registry.len(), TOOLS);
    assert_eq!(registry.version(), u64::try_from(TOOLS).unwrap_or(u64::MAX));
    let order: Vec<String> = registry.snapshot().iter().map(|t| t.item.name().to_owned()).collect();
    assert_eq!(order, (0..TOOLS).map(name).collect::<Vec<_>>());
}

#[test]
fn concurrent_writers_lose_no_registration() {
    const WRITERS: usize = 4;
    const EACH: usize = 100;
    let registry = ToolRegistry::new();
    let handler = answering("w");
    std::thread::scope(|threads| {
        for writer in 0..WRITERS {
            let (registry, handler) = (&registry, &handler);
            threads.spawn(move || {
                for index in 0..EACH {
                    registered(registry, ext("e", &format!("w{writer}__t{index:03}")), Arc::clone(handler));
                }
            });
        }
    });
    assert_eq!(registry.len(), WRITERS * EACH);
    assert_eq!(registry.version(), u64::try_from(WRITERS * EACH).unwrap_or(u64::MAX));
    // Each writer's tools keep that writer's order.
    let snapshot = registry.snapshot();
    for writer in 0..WRITERS {
        let prefix = format!("w{writer}__");
        let mine: Vec<&str> = snapshot.iter().map(|t| t.item.name()).filter(|n| n.starts_with(&prefix)).collect();
        let expected: Vec<String> = (0..EACH).map(|index| format!("w{writer}__t{index:03}")).collect();
        assert_eq!(mine, expected);
    }
}

#[tokio::test]
async fn a_tool_taken_from_the_registry_outlives_its_unregistration() {
    let registry = ToolRegistry::new();
    registered(&registry, ext("e", "a__one"), answering("one"));
    let tool = registry.get("a__one").unwrap_or_else(|| panic!("a__one is registered"));
    assert!(registry.unregister("a__one"));
    assert!(registry.get("a__one").is_none());
    // What a call looked up before the unregistration still runs.
    let ctx = ToolContext::new(scope(), Arc::clone(tool.item.shared_name()), "call-1");
    let answer = tool.handler.call(&ctx, &JsonObject::new()).await;
    assert!(matches!(answer, Ok(ToolOutput::Value(value)) if value == json!({"tool": "one"})));
}
