//! Real turns of agents assembled with the base extensions (`build_agent`,
//! as `gdn` builds them), with a model that records every request: what the
//! model receives with and without each extension.

use std::path::PathBuf;
use std::sync::Arc;

use goondan_core::{MessageData, MessageEvent};
use goondan_llm::scripted::ScriptedReply;
use goondan_runtime::agent::{AgentOptions, build_agent};
use goondan_runtime::{Agent, Conversation, NoObserver, StepContext, TurnEnd};
use goondan_tools::{MemoryEventSink, ToolCatalogItem, ToolOutput, ToolSource, from_fn, sync_handler};
use serde_json::{Value, json};

type Recording = goondan_test_support::RecordingModel;

const PROMPT: &str = "Be brief.";

mod common;
use common::plugins;

/// Agent `a` with `extensions` (YAML list items), every one installed by
/// this crate, an `echo__say` tool, and a recording model playing `replies`.
async fn build(extensions: &str, replies: Value) -> (Agent, Arc<Recording>, Arc<MemoryEventSink>) {
    let text = format!(
        "apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {{name: m}}\n\
         spec: {{provider: scripted, model: x, options: {{replies: [{{text: unused}}]}}}}\n---\n\
         apiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  modelConfig: {{modelRef: Model/m}}\n  \
         prompt: {{system: '{PROMPT}'}}\n  extensions: {extensions}\n"
    );
    let report = goondan_config::load_from_str(&text, "goondan.yaml", None, PathBuf::from("goondan.yaml"));
    let bundle = report.bundle.unwrap_or_else(|| panic!("{:?}", report.diagnostics));
    let events = Arc::new(MemoryEventSink::new());
    let mut options = AgentOptions::new(Arc::clone(&events) as _);
    options.plugins = plugins();
    let mut agent = build_agent(&bundle, &options).await.unwrap_or_else(|e| panic!("{e}"));
    let echo = ToolCatalogItem::new("echo__say", ToolSource::extension("test"));
    agent
        .tooling
        .registry()
        .register(echo, sync_handler(|_, _| Ok(ToolOutput::Value(json!("said")))))
        .unwrap_or_else(|e| panic!("{e}"));
    let replies: Vec<ScriptedReply> = serde_json::from_value(replies).unwrap_or_else(|e| panic!("{e}"));
    let provider = Arc::new(Recording::new(replies));
    agent.provider = Arc::clone(&provider) as _;
    (agent, provider, events)
}

async fn turn(agent: &Agent, conversation: &mut Conversation, input: &str) {
    let (_cancel, cancelled) = tokio::sync::watch::channel(false);
    let outcome = agent.run_turn(conversation, input, &NoObserver, cancelled).await;
    assert_eq!(outcome.end, TurnEnd::Answered, "{outcome:?}");
}

/// A step layer that breaks the rule on purpose: it removes the last tool
/// result before the request, leaving its call unanswered.
fn drop_last_result(agent: &mut Agent) {
    agent.tooling.step_middleware.register(
        "drop-last-result",
        0,
        from_fn(|ctx: &mut StepContext, next| {
            let last = ctx.conversation.messages().last().cloned();
            if let Some(last) = last.filter(|m| matches!(m.data, MessageData::Tool { .. })) {
                let _ = ctx.conversation.emit(MessageEvent::Remove { target_id: last.id });
            }
            next.run(ctx)
        }),
    );
}

fn repaired(events: &MemoryEventSink) -> Vec<Value> {
    events.events().into_iter().filter(|event| event["type"] == "message-integrity.repaired").collect()
}

#[tokio::test]
async fn message_integrity_answers_a_call_a_layer_left_unanswered_before_the_request_leaves() {
    let script = json!([{"toolCalls": [{"name": "echo__say", "args": {}}]}, {"text": "done"}]);
    let integrity = "[{ref: {kind: Extension, name: message-integrity, package: '@goondan/base'}}]";
    let (mut agent, model, events) = build(integrity, script.clone()).await;
    drop_last_result(&mut agent);
    let mut conversation = Conversation::in_memory(Vec::new());
    turn(&agent, &mut conversation, "go").await;
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let second = &requests[1].messages;
    assert_eq!(second.len(), 3, "{second:?}");
    let MessageData::Tool { result, .. } = &second[2] else { panic!("{second:?}") };
    assert_eq!(result.error_code(), Some("E_TOOL_INTERRUPTED"));
    let found = repaired(&events);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0]["callsInterrupted"].clone(), found[0]["stepIndex"].clone()), (json!(1), json!(1)));

    // Without it the runtime's commit applies the same rule — the same
    // request — but nothing names the repair.
    let (mut agent, model, events) = build("[]", script).await;
    drop_last_result(&mut agent);
    let mut conversation = Conversation::in_memory(Vec::new());
    turn(&agent, &mut conversation, "go").await;
    let plain = model.requests();
    assert_eq!(plain[1].messages.len(), 3);
    assert!(
        matches!(&plain[1].messages[2], MessageData::Tool { result, .. } if result.error_code() == Some("E_TOOL_INTERRUPTED"))
    );
    assert!(repaired(&events).is_empty());
}

#[tokio::test]
async fn with_context_message_the_prompt_is_in_the_conversation_once_not_in_the_request_besides() {
    let (agent, model, _) = build("[]", json!([{"text": "ok"}])).await;
    let mut conversation = Conversation::in_memory(Vec::new());
    turn(&agent, &mut conversation, "hi").await;
    let requests = model.requests();
    assert_eq!(requests[0].system.as_deref(), Some(PROMPT));
    assert_eq!(requests[0].messages, [MessageData::User { content: "hi".into() }]);

    let context = "[{ref: {kind: Extension, name: context-message, package: '@goondan/base'}}]";
    let (agent, model, _) = build(context, json!([{"text": "ok"}])).await;
    let mut conversation = Conversation::in_memory(Vec::new());
    turn(&agent, &mut conversation, "hi").await;
    turn(&agent, &mut conversation, "again").await;
    let requests = model.requests();
    assert_eq!(requests[0].system, None);
    assert_eq!(requests[0].messages[0], MessageData::System { content: PROMPT.into() });
    assert_eq!(requests[1].system, None);
    let systems = requests[1].messages.iter().filter(|m| matches!(m, MessageData::System { .. })).count();
    assert_eq!(systems, 1, "{:?}", requests[1].messages);
    let marker = &conversation.messages()[0].metadata["__goondanContextMessage"];
    assert_eq!(marker["segmentIds"], json!(["agent.prompt.system"]), "{marker}");
}
