//! JavaScript extensions through the public surface: fixture bundles with
//! TypeScript extensions, assembled as `gdn` assembles an agent, turns run
//! against a model that records what it receives, and a real Bun or Node
//! host.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use goondan_config::Bundle;
use goondan_core::{JsonObject, JsonValue, MessageData, ToolResult, ToolStatus};
use goondan_llm::{ModelProvider, ModelRequest};
use goondan_runtime::agent::{AgentOptions, AgentTooling, assemble_tooling};
use goondan_runtime::conversation::{Conversation, InstanceLog};
use goondan_runtime::store::{InstanceStore, Workspace};
use goondan_runtime::{Agent, ExtensionStateStore, NoObserver, StepContext, StepOutcome, TurnEnd};
use goondan_script::{ExtensionLoad, HostServices, ScriptHost};
use goondan_test_support::block_on;
use goondan_tools::executor::ToolCallContext;
use goondan_tools::{BoxFuture, from_fn};
use serde_json::json;

use common::runtime_or_skip;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name)
}

fn load(name: &str) -> Bundle {
    let report = goondan_config::load_bundle(&fixture(name));
    match report.bundle {
        Some(bundle) if !report.has_errors() => bundle,
        _ => panic!("fixture {name} invalid: {:?}", report.diagnostics),
    }
}

/// Options that install what `gdn` installs for a bundle's own code: script
/// tools and JavaScript extensions in one host.
fn options(agent: &str, state_dir: Option<PathBuf>) -> AgentOptions {
    let mut options = AgentOptions::new(Arc::new(goondan_tools::NoopEventSink));
    options.agent = Some(agent.to_owned());
    options.extension_state = state_dir;
    options.plugins = vec![Arc::new(goondan_script::ScriptPlugin::new())];
    options
}

type Recording = goondan_test_support::RecordingModel;

fn recording(replies: JsonValue) -> Arc<Recording> {
    Arc::new(Recording::from_json(replies))
}

fn extensions_script() -> JsonValue {
    json!([
        {"toolCalls": [{"name": "echo__say", "args": {"text": "hello"}}, {"name": "notes__count", "args": {}}]},
        {"text": "Done."}
    ])
}

fn texts_of(request: &ModelRequest, role: &str) -> Vec<String> {
    request
        .messages
        .iter()
        .filter_map(|m| match (m, role) {
            (MessageData::System { content }, "system") | (MessageData::User { content }, "user") => {
                Some(content.clone())
            }
            _ => None,
        })
        .collect()
}

async fn assemble(bundle: &Bundle, options: &AgentOptions) -> AgentTooling {
    assemble_tooling(bundle, options).await.unwrap_or_else(|e| panic!("assemble: {e}"))
}

fn open_conversation(root: &Workspace, bundle: &Bundle) -> Conversation {
    let store = InstanceStore::open(root, "default", "assistant", &bundle.root().join("goondan.yaml"))
        .unwrap_or_else(|e| panic!("open instance: {e}"));
    let loaded = store.load().unwrap_or_else(|e| panic!("load: {e}"));
    Conversation::new(loaded.state, Arc::new(InstanceLog::new(store, loaded.events_on_disk)))
}

#[test]
fn js_middleware_edits_what_the_model_receives_and_the_edits_are_durable() {
    if runtime_or_skip("js_middleware_edits_what_the_model_receives").is_none() {
        return;
    }
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let root = Workspace::at(state.path());
    let bundle = load("script-extensions");
    let extensions_dir = root.instance_dir("assistant", "default").unwrap_or_else(|e| panic!("{e}")).join("extensions");
    block_on(async {
        let options = options("assistant", Some(extensions_dir.clone()));
        let model = recording(extensions_script());
        let agent = Agent::new(assemble(&bundle, &options).await, Arc::clone(&model) as Arc<dyn ModelProvider>);
        let mut conversation = open_conversation(&root, &bundle);
        let (_cancel, cancelled) = tokio::sync::watch::channel(false);
        let outcome = agent.run_turn(&mut conversation, "hi there".to_owned(), &NoObserver, cancelled.clone()).await;
        assert_eq!(outcome.end, TurnEnd::Answered, "{outcome:?}");
        assert_eq!(outcome.text, "Done.");

        let requests = model.requests();
        assert_eq!(requests.len(), 2);
        // The step layer hid hidden__peek; notes registered notes__count.
        let offered: Vec<&str> = requests[0].tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(offered, ["echo__say", "notes__count"]);
        // Its message reached the model before the first call.
        assert_eq!(texts_of(&requests[0], "system"), ["[catalog-editor] step tools: echo__say, notes__count"]);

        // The toolCall layer rewrote the arguments and the result; the
        // extension's tool read its state.
        let results: Vec<ToolResult> = requests[1]
            .messages
            .iter()
            .filter_map(|m| match m {
                MessageData::Tool { result, .. } => Some((**result).clone()),
                _ => None,
            })
            .collect();
        assert_eq!(results.len(), 2);
        let echoed = results[0].output.clone().unwrap_or_default();
        assert_eq!(echoed["said"], "HELLO", "{echoed}");
        assert_eq!(echoed["shouted"], true);
        assert_eq!(echoed["step"], 0);
        assert_eq!(results[1].output, Some(json!({"turns": 0})));

        // The turn layer counted the turn in durable state and appended a
        // note after the steps.
        let saved: JsonValue = serde_json::from_str(
            &std::fs::read_to_string(extensions_dir.join("notes.json")).unwrap_or_else(|e| panic!("state: {e}")),
        )
        .unwrap_or_default();
        assert_eq!(saved, json!({"turns": 1, "lastInput": "hi there"}));
        drop(conversation);

        // A new process reads it all back: the next request sees the note.
        let mut conversation = open_conversation(&root, &bundle);
        let last = conversation.state().messages().last().cloned().unwrap_or_else(|| panic!("empty conversation"));
        assert!(matches!(&last.data, MessageData::System { content } if content.starts_with("[notes] turn 1")));
        let model = recording(extensions_script());
        let agent = Agent::new(assemble(&bundle, &options).await, Arc::clone(&model) as Arc<dyn ModelProvider>);
        let outcome = agent.run_turn(&mut conversation, "again".to_owned(), &NoObserver, cancelled).await;
        assert_eq!(outcome.end, TurnEnd::Answered, "{outcome:?}");
        let requests = model.requests();
        let systems = texts_of(&requests[0], "system");
        assert!(systems.iter().any(|s| s.starts_with("[notes] turn 1: 0 messages before")), "{systems:?}");
        assert_eq!(systems.iter().filter(|s| s.starts_with("[catalog-editor]")).count(), 2, "{systems:?}");
        let results: Vec<JsonValue> = requests[1]
            .messages
            .iter()
            .filter_map(|m| match m {
                MessageData::Tool { result, .. } => result.output.clone(),
                _ => None,
            })
            .collect();
        assert_eq!(results.last(), Some(&json!({"turns": 1})));
    });
}

#[test]
fn native_and_js_layers_share_one_onion_in_priority_order() {
    if runtime_or_skip("native_and_js_layers_share_one_onion").is_none() {
        return;
    }
    let bundle = load("script-extensions");
    block_on(async {
        let mut tooling = assemble(&bundle, &options("assistant", None)).await;
        let seen: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
        let note =
            |seen: &Arc<Mutex<Vec<String>>>, line: String| seen.lock().unwrap_or_else(|e| e.into_inner()).push(line);

        // Outside the JS layer (priority 10): marks the metadata it must pass on.
        let outer = Arc::clone(&seen);
        tooling.step_middleware.register(
            "native-outer",
            5,
            from_fn(move |ctx: &mut StepContext, next| {
                let outer = Arc::clone(&outer);
                Box::pin(async move {
                    ctx.metadata.insert("outer".to_owned(), json!(true));
                    let out = next.run(ctx).await;
                    note(&outer, format!("outer after: catalog {:?}", ctx.tool_catalog.names().collect::<Vec<_>>()));
                    out
                })
            }),
        );
        // Inside it: sees what the JS layer did.
        let inner = Arc::clone(&seen);
        tooling.step_middleware.register(
            "native-inner",
            20,
            from_fn(move |ctx: &mut StepContext, next| {
                let inner = Arc::clone(&inner);
                Box::pin(async move {
                    let keys: Vec<&str> = ctx.metadata.keys().map(String::as_str).collect();
                    note(&inner, format!("inner metadata {keys:?}"));
                    note(&inner, format!("inner catalog {:?}", ctx.tool_catalog.names().collect::<Vec<_>>()));
                    let last = ctx.conversation.messages().last().map(|m| m.source.clone());
                    note(&inner, format!("inner last source {last:?}"));
                    let out: StepOutcome = next.run(ctx).await;
                    out
                })
            }),
        );
        // A toolCall layer inside the JS one sees the rewritten arguments.
        let calls = Arc::clone(&seen);
        let registered = tooling.register_tool_call_middleware(
            "native-call",
            1,
            from_fn(move |ctx: &mut ToolCallContext, next| {
                let calls = Arc::clone(&calls);
                Box::pin(async move {
                    note(&calls, format!("call args {}", JsonValue::Object(ctx.args.clone())));
                    next.run(ctx).await
                })
            }),
        );
        assert!(registered);

        let _ = tooling.preview_catalog(goondan_core::ConversationState::default()).await;
        let result =
            tooling.call_tool("echo__say", json!({"text": "quiet"}).as_object().cloned().unwrap_or_default()).await;
        assert_eq!(result.status, ToolStatus::Ok, "{result:?}");
        assert_eq!(result.output.as_ref().map(|o| o["said"].clone()), Some(json!("QUIET")));
        assert_eq!(result.output.as_ref().map(|o| o["shouted"].clone()), Some(json!(true)));

        let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(
            seen[..4],
            [
                r#"inner metadata ["outer", "catalogEditor"]"#.to_owned(),
                r#"inner catalog ["echo__say", "notes__count"]"#.to_owned(),
                r#"inner last source Some(Extension { extension_name: "catalog-editor" })"#.to_owned(),
                r#"outer after: catalog ["echo__say", "notes__count"]"#.to_owned(),
            ],
            "{seen:#?}"
        );
        // preview_catalog and call_tool each ran the step chain once; the
        // call then went through JS (outer, priority 0) and native (1).
        assert!(seen.contains(&r#"call args {"text":"QUIET"}"#.to_owned()), "{seen:#?}");
    });
}

#[test]
fn failing_layers_fail_closed_and_name_themselves() {
    if runtime_or_skip("failing_layers_fail_closed").is_none() {
        return;
    }
    let bundle = load("script-extension-faults");
    block_on(async {
        let tooling = assemble(&bundle, &options("guarded", None)).await;
        // A toolCall layer that throws: an error result with its code.
        let denied = tooling.call_tool("probe__fail", JsonObject::new()).await;
        let error = denied.error.clone().unwrap_or_default();
        assert_eq!(error.code.as_deref(), Some("E_PROBE_DENIED"), "{denied:?}");
        assert!(error.message.contains("toolCall middleware 'faulty' failed"), "{error:?}");
        assert_eq!(error.suggestion.as_deref(), Some("Call probe__pass instead."));
        let passed = tooling.call_tool("probe__pass", JsonObject::new()).await;
        assert_eq!(passed.output, Some(json!({"passed": true})), "{passed:?}");

        let model = recording(json!([{"text": "ok"}]));
        let agent = Agent::new(tooling, Arc::clone(&model) as Arc<dyn ModelProvider>);
        let (_cancel, cancelled) = tokio::sync::watch::channel(false);
        let mut conversation = Conversation::in_memory(Vec::new());

        // A turn layer that throws ends the turn, naming itself.
        let outcome = agent.run_turn(&mut conversation, "throw".to_owned(), &NoObserver, cancelled.clone()).await;
        match &outcome.end {
            TurnEnd::LayerFailed(failure) => {
                assert_eq!(failure.layer.as_deref(), Some("faulty"));
                assert!(failure.message.contains("faulty refuses this turn"), "{failure:?}");
            }
            other => panic!("{other:?}"),
        }
        assert!(model.requests().is_empty());

        // Its host dies before next(): the turn fails with what happened.
        let outcome = agent.run_turn(&mut conversation, "crash".to_owned(), &NoObserver, cancelled.clone()).await;
        let note = outcome.end.note().unwrap_or_default();
        assert!(matches!(outcome.end, TurnEnd::LayerFailed(_)), "{outcome:?}");
        assert!(note.contains("exited with code 3"), "{note}");

        // It dies after next(): the steps ran, but the layer's end is lost,
        // so the turn is reported failed rather than passed off as whole.
        let outcome = agent.run_turn(&mut conversation, "crash-after".to_owned(), &NoObserver, cancelled.clone()).await;
        assert!(outcome.end.note().unwrap_or_default().contains("exited with code 4"), "{outcome:?}");

        // A new host loads the extension again and the next turn runs.
        let outcome = agent.run_turn(&mut conversation, "fine".to_owned(), &NoObserver, cancelled).await;
        assert_eq!(outcome.end, TurnEnd::Answered, "{outcome:?}");
        assert_eq!(outcome.text, "ok");
        assert!(conversation.state().is_consistent());
    });
}

#[test]
fn a_tool_registered_during_a_turn_is_offered_at_once_and_bad_state_is_refused() {
    if runtime_or_skip("a_tool_registered_during_a_turn").is_none() {
        return;
    }
    let bundle = load("script-extension-faults");
    block_on(async {
        let model = recording(json!([{"text": "ok"}]));
        let tooling = assemble(&bundle, &options("guarded", None)).await;
        assert!(!tooling.registry().contains("grown__ping"));
        let agent = Agent::new(tooling, Arc::clone(&model) as Arc<dyn ModelProvider>);
        let (_cancel, cancelled) = tokio::sync::watch::channel(false);
        let mut conversation = Conversation::in_memory(Vec::new());
        let outcome = agent.run_turn(&mut conversation, "grow".to_owned(), &NoObserver, cancelled.clone()).await;
        assert_eq!(outcome.end, TurnEnd::Answered, "{outcome:?}");
        let offered: Vec<String> = model.requests()[0].tools.iter().map(|t| t.name.clone()).collect();
        assert_eq!(offered, ["probe__fail", "probe__pass", "grown__ping"]);
        let pong = agent.tooling.call_tool("grown__ping", JsonObject::new()).await;
        assert_eq!(pong.output, Some(json!({"pong": true})), "{pong:?}");
        assert_eq!(
            agent.tooling.registry().snapshot().get("grown__ping").map(|t| t.item.source().clone()),
            Some(goondan_tools::ToolSource::extension("faulty"))
        );

        let outcome = agent.run_turn(&mut conversation, "bad-state".to_owned(), &NoObserver, cancelled).await;
        assert_eq!(outcome.end, TurnEnd::Answered, "{outcome:?}");
        let refused = conversation
            .state()
            .messages()
            .iter()
            .find_map(|m| match &m.data {
                MessageData::System { content } if content.starts_with("state refused") => Some(content.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no refusal message"));
        assert!(refused.contains("must be a JSON object, got array"), "{refused}");
    });
}

#[test]
fn a_layer_that_blocks_its_host_is_abandoned_on_cancel_and_the_host_replaced() {
    if runtime_or_skip("a_layer_that_blocks_its_host").is_none() {
        return;
    }
    let bundle = load("script-extension-faults");
    block_on(async {
        let model = recording(json!([{"text": "ok"}]));
        let mut agent = Agent::new(assemble(&bundle, &options("guarded", None)).await, model);
        agent.cancel_grace = std::time::Duration::from_millis(200);
        let mut conversation = Conversation::in_memory(Vec::new());
        let (cancel, cancelled) = tokio::sync::watch::channel(false);
        let canceller = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            let _ = cancel.send(true);
            cancel
        });
        let outcome = agent.run_turn(&mut conversation, "hang".to_owned(), &NoObserver, cancelled).await;
        assert_eq!(outcome.end, TurnEnd::Cancelled, "{outcome:?}");
        drop(canceller.await);

        // The blocked host is killed (it cannot acknowledge the cancel) and
        // the next turn gets a new one, extensions loaded.
        let (_cancel, cancelled) = tokio::sync::watch::channel(false);
        let outcome = agent.run_turn(&mut conversation, "fine".to_owned(), &NoObserver, cancelled).await;
        assert_eq!(outcome.end, TurnEnd::Answered, "{outcome:?}");
        assert_eq!(outcome.text, "ok");
    });
}

#[test]
fn a_tool_call_layer_that_never_returns_is_held_to_the_call_deadline() {
    if runtime_or_skip("a_tool_call_layer_that_never_returns").is_none() {
        return;
    }
    let bundle = load("script-extension-faults");
    block_on(async {
        let mut options = options("guarded", None);
        options.call_timeout = Some(std::time::Duration::from_millis(300));
        let tooling = assemble(&bundle, &options).await;
        let mut args = JsonObject::new();
        args.insert("hang".to_owned(), json!(true));
        let stuck = tooling.call_tool("probe__pass", args).await;
        assert_eq!(stuck.error_code(), Some("E_TOOL_TIMEOUT"), "{stuck:?}");
        let message = stuck.error.as_ref().map(|e| e.message.clone()).unwrap_or_default();
        assert!(message.contains("its toolCall middleware did not finish within the call's 300 ms"), "{message}");
        // The host still serves the next call.
        let passed = tooling.call_tool("probe__pass", JsonObject::new()).await;
        assert_eq!(passed.output, Some(json!({"passed": true})), "{passed:?}");
    });
}

#[test]
fn extensions_that_do_not_load_stop_the_agent_with_a_coded_error() {
    if runtime_or_skip("extensions_that_do_not_load").is_none() {
        return;
    }
    let bundle = load("script-extension-faults");
    block_on(async {
        for (agent, code, needle) in [
            ("broken-register", "E_EXT_INIT", "register() of extension 'throws-in-register' threw: cannot start"),
            ("no-register", "E_EXT_LOAD", "does not export a register function"),
            ("unloadable", "E_EXT_LOAD", "cannot load extension module"),
        ] {
            let error = match assemble_tooling(&bundle, &options(agent, None)).await {
                Ok(_) => panic!("{agent}: assembled"),
                Err(goondan_runtime::AgentBuildError::Extension { source, .. }) => source,
                Err(other) => panic!("{agent}: {other}"),
            };
            assert_eq!(error.code, code, "{agent}: {error}");
            assert!(error.message.contains(needle), "{agent}: {error}");
            assert!(!error.extension.is_empty(), "{agent}: {error:?}");
        }
    });
}

/// Keeps state in a real store and records late tool registrations.
struct StoreServices {
    state: ExtensionStateStore,
    tools: Mutex<Vec<JsonValue>>,
}

impl HostServices for StoreServices {
    fn agents(
        &self,
        method: String,
        _: JsonValue,
        _: String,
        _: String,
    ) -> goondan_tools::BoxFuture<'static, Result<JsonValue, String>> {
        Box::pin(async move { Err(format!("ctx.agents.{method}: no orchestrator in this test")) })
    }

    fn state_get(&self, extension: String) -> BoxFuture<'static, Result<JsonValue, String>> {
        let state = self.state.clone();
        Box::pin(async move {
            state.get(&extension).await.map(|v| v.map_or(JsonValue::Null, JsonValue::Object)).map_err(|e| e.to_string())
        })
    }

    fn state_set(&self, extension: String, value: JsonValue) -> BoxFuture<'static, Result<(), String>> {
        let state = self.state.clone();
        Box::pin(async move { state.set(&extension, value).await.map_err(|e| e.to_string()) })
    }

    fn register_tool(&self, _extension: &str, item: JsonValue) {
        self.tools.lock().unwrap_or_else(|e| e.into_inner()).push(item);
    }
}

#[test]
fn the_brain_persona_samples_typescript_extensions_load_unchanged() {
    let Some(runtime) = runtime_or_skip("the_brain_persona_samples_typescript_extensions_load") else { return };
    let dir = fixture("brain-persona/extensions");
    block_on(async {
        let host = ScriptHost::with_runtime(runtime);
        let loads = ["worker-lifecycle", "idle-monitor", "date-helper"]
            .iter()
            .map(|name| ExtensionLoad {
                name: (*name).to_owned(),
                module: Arc::from(dir.join(format!("{name}.ts")).as_path()),
                config: JsonObject::new(),
            })
            .collect();
        let services =
            Arc::new(StoreServices { state: ExtensionStateStore::in_memory(), tools: Mutex::new(Vec::new()) });
        let loaded = host.load_extensions(loads, services).await.unwrap_or_else(|e| panic!("{}", e.message));
        let pipelines: Vec<(String, Vec<String>)> = loaded
            .iter()
            .map(|e| (e.name.clone(), e.middleware.iter().map(|m| m.pipeline.clone()).collect()))
            .collect();
        assert_eq!(
            pipelines,
            [
                ("worker-lifecycle".to_owned(), vec!["turn".to_owned()]),
                ("idle-monitor".to_owned(), vec!["turn".to_owned()]),
                ("date-helper".to_owned(), vec!["step".to_owned()]),
            ]
        );
    });
}
