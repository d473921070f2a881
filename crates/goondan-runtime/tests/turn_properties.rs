//! Invariants of the turn loop over random model replies: whatever the model
//! asks for — known or unknown tools, valid, invalid or unreadable
//! arguments — every call gets exactly one result, right after its
//! assistant message and in call order, and the turn ends.

use std::path::Path;
use std::sync::Arc;

use goondan_core::{Message, MessageData};
use goondan_llm::ModelProvider;
use goondan_llm::scripted::{ScriptedProvider, ScriptedReply};
use goondan_runtime::AgentTooling;
use goondan_runtime::conversation::Conversation;
use goondan_runtime::turn::{Agent, TurnObserver};
use goondan_tools::assembly::AgentTools;
use goondan_tools::{NoopEventSink, ToolCatalogItem, ToolExecutor, ToolOutput, ToolRegistry, ToolSource, sync_handler};
use proptest::prelude::*;
use serde_json::{Value, json};
use tokio::sync::watch;

struct Quiet;
impl TurnObserver for Quiet {}

fn agent(replies: Vec<ScriptedReply>, max_steps: u32) -> Agent {
    let registry = ToolRegistry::new();
    let item = ToolCatalogItem::new("echo__say", ToolSource::extension("test")).with_parameters(json!({
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"], "additionalProperties": false
    }));
    registry
        .register(item, sync_handler(|_, input| Ok(ToolOutput::Value(json!({"said": input.get("text")})))))
        .unwrap_or_else(|e| panic!("{e}"));
    let fails = ToolCatalogItem::new("oops__fail", ToolSource::extension("test"));
    registry
        .register(fails, sync_handler(|_, _| Err(goondan_tools::ToolFailure::new("always fails"))))
        .unwrap_or_else(|e| panic!("{e}"));
    let executor = ToolExecutor::new(Arc::new(registry));
    let tooling =
        AgentTooling::new("prop", "prop", Path::new("/tmp"), AgentTools::default(), executor, Arc::new(NoopEventSink));
    let mut agent = Agent::new(tooling, Arc::new(ScriptedProvider::from_replies(replies)) as Arc<dyn ModelProvider>);
    agent.max_steps_per_turn = max_steps;
    agent.max_parallel_tool_calls = 3;
    agent.max_malformed_replies = 2;
    agent
}

fn call() -> impl Strategy<Value = Value> {
    let name = prop_oneof![Just("echo__say"), Just("oops__fail"), Just("nope__missing"), Just("bad name")];
    let arguments = prop_oneof![
        Just(json!({"args": {"text": "hi"}})),
        Just(json!({"args": {"text": 5}})),
        Just(json!({"args": {}})),
        Just(json!({"arguments": "{not json"})),
        Just(json!({"arguments": "[1, 2]"})),
        Just(json!({"arguments": ""})),
    ];
    (name, arguments).prop_map(|(name, mut args)| {
        if let Some(map) = args.as_object_mut() {
            map.insert("name".into(), json!(name));
        }
        args
    })
}

fn reply() -> impl Strategy<Value = Value> {
    (proptest::option::of("[a-z ]{0,12}"), proptest::collection::vec(call(), 0..4))
        .prop_map(|(text, calls)| json!({"text": text, "toolCalls": calls}))
}

fn check_pairs(history: &[Message]) -> Result<(), TestCaseError> {
    let mut index = 0;
    while index < history.len() {
        if let MessageData::Assistant { tool_calls, .. } = &history[index].data {
            for (offset, call) in tool_calls.iter().enumerate() {
                match history.get(index + 1 + offset).map(|m| &m.data) {
                    Some(MessageData::Tool { tool_call_id, .. }) => {
                        prop_assert_eq!(tool_call_id.as_str(), call.id.as_ref(), "results follow in call order");
                    }
                    other => prop_assert!(false, "call {} has no result right after it: {:?}", call.id, other),
                }
            }
            index += 1 + tool_calls.len();
        } else {
            prop_assert!(!matches!(history[index].data, MessageData::Tool { .. }), "a result without its call");
            index += 1;
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn every_call_gets_exactly_one_result_in_order(replies in proptest::collection::vec(reply(), 1..6), max_steps in 1u32..8) {
        let replies: Vec<ScriptedReply> = serde_json::from_value(Value::Array(replies)).unwrap_or_default();
        let agent = agent(replies, max_steps);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
        let Ok(runtime) = runtime else { panic!("runtime") };
        let (_cancel, cancelled) = watch::channel(false);
        let mut conversation = Conversation::in_memory(Vec::new());
        let outcome = runtime.block_on(agent.run_turn(&mut conversation, "go", &Quiet, cancelled.clone()));
        prop_assert!(outcome.steps <= max_steps);
        check_pairs(conversation.messages())?;
        // And the conversation stays usable for another turn.
        let _ = runtime.block_on(agent.run_turn(&mut conversation, "again", &Quiet, cancelled));
        check_pairs(conversation.messages())?;
    }
}
