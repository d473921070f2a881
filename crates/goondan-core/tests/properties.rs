//! Properties of tool naming, error-message truncation and the conversation
//! rule over random input.

use goondan_core::naming::{ExportNameCheck, build_tool_name, check_export_name, check_resource_name, parse_tool_name};
use goondan_core::truncate_error_message;
use proptest::prelude::*;

proptest! {
    // About two in five generated names fail a rule and are rejected, so the
    // default limit of 1024 rejects ends a run of 20000 cases early.
    #![proptest_config(ProptestConfig { max_global_rejects: 1 << 20, ..ProptestConfig::default() })]

    /// Any resource and export name that pass their rules survive build → parse.
    #[test]
    fn build_then_parse_round_trips(resource in "[a-zA-Z0-9][a-zA-Z0-9_-]{0,20}[a-zA-Z0-9]", export in "[a-z0-9][a-z0-9_-]{0,20}") {
        prop_assume!(check_resource_name(&resource, true).is_ok());
        prop_assume!(check_export_name(&export) == ExportNameCheck::Valid);
        let full = build_tool_name(&resource, &export);
        let parts = parse_tool_name(&full);
        prop_assert_eq!(parts.map(|p| (p.resource, p.export)), Some((resource.as_str(), export.as_str())));
    }

    /// Parsing never yields a part that is empty or holds the separator.
    #[test]
    fn parsed_parts_never_hold_the_separator(name in "[a-z_]{0,12}") {
        if let Some(parts) = parse_tool_name(&name) {
            prop_assert!(!parts.resource.is_empty() && !parts.export.is_empty());
            prop_assert!(!parts.resource.contains("__") && !parts.export.contains("__"));
            prop_assert_eq!(build_tool_name(parts.resource, parts.export), name);
        }
    }

    /// Truncation: never longer than the limit, unchanged within it, exactly
    /// the limit otherwise, and always a prefix of the original (plus the suffix).
    #[test]
    fn truncation_bounds(message in "\\PC{0,300}", limit in 0usize..320) {
        let mut truncated = message.clone();
        truncate_error_message(&mut truncated, limit);
        let chars = message.chars().count();
        if chars <= limit {
            prop_assert_eq!(&truncated, &message);
        } else {
            prop_assert_eq!(truncated.chars().count(), limit);
            let kept = truncated.strip_suffix("... (truncated)").filter(|_| limit > 15).unwrap_or(&truncated);
            prop_assert!(message.starts_with(kept));
        }
    }
}

mod conversation_rule {
    use goondan_core::conversation::integrity_repairs;
    use goondan_core::{ConversationState, JsonObject, Message, MessageData, MessageSource, ToolCall, ToolResult};
    use proptest::prelude::*;

    /// A message of a random kind, with an id of its own; calls and results
    /// draw from a few ids so that matches, orphans, duplicate results and
    /// repeated call ids all occur.
    fn message() -> impl Strategy<Value = Message> {
        prop_oneof![
            // Made per case: a `Just(message)` would give every user message one id.
            Just(()).prop_map(|()| Message::new(MessageData::User { content: "u".into() }, MessageSource::User)),
            (proptest::collection::vec(0u8..4, 0..4), proptest::bool::ANY).prop_map(|(ids, text)| {
                let calls = ids.iter().map(|i| ToolCall::new(format!("c{i}"), "t__x", JsonObject::new())).collect();
                let content = text.then(|| "thinking".to_owned());
                Message::new(
                    MessageData::Assistant { content, tool_calls: calls },
                    MessageSource::Assistant { step_id: "s".into() },
                )
            }),
            (0u8..5).prop_map(|i| Message::new(
                MessageData::Tool {
                    tool_call_id: format!("c{i}"),
                    tool_name: "t__x".into(),
                    result: Box::new(ToolResult::ok(serde_json::json!(i))),
                },
                MessageSource::Tool { tool_call_id: format!("c{i}"), tool_name: "t__x".into() },
            )),
        ]
    }

    /// The rule, stated on its own: every result follows, in the run of
    /// results right after it, the assistant message holding its call; the
    /// calls of one message have distinct ids; each call has exactly one result.
    fn obeys_the_rule(messages: &[Message]) -> bool {
        let mut index = 0;
        while let Some(message) = messages.get(index) {
            index += 1;
            match &message.data {
                MessageData::Tool { .. } => return false,
                MessageData::Assistant { tool_calls, .. } => {
                    let mut results = Vec::new();
                    while let Some(MessageData::Tool { tool_call_id, .. }) = messages.get(index).map(|m| &m.data) {
                        results.push(tool_call_id.as_str());
                        index += 1;
                    }
                    let mut calls: Vec<&str> = tool_calls.iter().map(|call| &*call.id).collect();
                    let count = calls.len();
                    calls.sort_unstable();
                    calls.dedup();
                    results.sort_unstable();
                    if calls.len() != count || calls != results {
                        return false;
                    }
                }
                MessageData::System { .. } | MessageData::User { .. } => {}
            }
        }
        true
    }

    #[derive(Debug, Clone)]
    enum Op {
        Append(Message),
        Replace(usize),
        Remove(usize),
        Truncate,
        Commit,
        BeginTurn,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => message().prop_map(Op::Append),
            1 => (0usize..32).prop_map(Op::Replace),
            1 => (0usize..32).prop_map(Op::Remove),
            1 => Just(Op::Truncate),
            2 => Just(Op::Commit),
            1 => Just(Op::BeginTurn),
        ]
    }

    proptest! {
        /// The original's contract: nextMessages = baseMessages with the turn's events applied.
        #[test]
        fn next_messages_are_the_base_with_the_events_applied(
            start in proptest::collection::vec(message(), 0..6).prop_map(|mut start| {
                for (i, message) in start.iter_mut().enumerate() {
                    message.id = format!("s{i}");
                }
                start
            }),
            ops in proptest::collection::vec(op(), 0..40),
        ) {
            let mut state = ConversationState::new(start);
            for (counter, op) in ops.into_iter().enumerate() {
                let ids: Vec<String> = state.messages().iter().map(|m| m.id.clone()).collect();
                let pick = |n: usize| ids.get(n % ids.len().max(1)).cloned().unwrap_or_default();
                match op {
                    Op::Append(mut message) => {
                        // The runtime's messages have fresh ids.
                        message.id = format!("m{counter}");
                        state.append_new([message]);
                    }
                    Op::Replace(n) => {
                        let mut replacement = Message::new(MessageData::User { content: "r".into() }, MessageSource::User);
                        replacement.id = format!("r{counter}");
                        let _ = state.emit(goondan_core::MessageEvent::Replace { target_id: pick(n), message: replacement });
                    }
                    Op::Remove(n) => {
                        let _ = state.emit(goondan_core::MessageEvent::Remove { target_id: pick(n) });
                    }
                    Op::Truncate => {
                        let _ = state.emit(goondan_core::MessageEvent::Truncate);
                    }
                    Op::Commit => {
                        state.commit();
                        prop_assert!(state.is_consistent());
                    }
                    // The runtime begins a turn with everything committed.
                    Op::BeginTurn => {
                        state.commit();
                        state.begin_turn();
                    }
                }
                let mut rebuilt = ConversationState::new(state.base_messages().to_vec());
                prop_assert_eq!(rebuilt.replay(state.events()), 0);
                prop_assert_eq!(rebuilt.messages(), state.messages());
            }
        }

        /// `integrity_repairs` finds nothing to repair exactly when the rule
        /// holds, and what a repair leaves obeys it.
        #[test]
        fn the_check_is_the_rule(messages in proptest::collection::vec(message(), 0..24)) {
            let holds = obeys_the_rule(&messages);
            prop_assert_eq!(integrity_repairs(&messages).is_empty(), holds);
            let mut state = ConversationState::new(messages);
            prop_assert_eq!(state.is_consistent(), holds);
            prop_assert_eq!(state.repair().is_empty(), holds);
            prop_assert!(obeys_the_rule(state.messages()), "{:?}", state.messages());
        }

        #[test]
        fn repairs_restore_the_rule_from_any_conversation(messages in proptest::collection::vec(message(), 0..24)) {
            let mut state = ConversationState::new(messages);
            state.append_new([]);
            // Any change makes the next commit run the repairs.
            state.append_new([Message::new(MessageData::User { content: "next".into() }, MessageSource::User)]);
            state.commit();
            prop_assert!(state.is_consistent());
            prop_assert!(integrity_repairs(state.messages()).is_empty(), "repairs are idempotent");
        }

        /// A history missing any one message (a line lost from the log) is
        /// made valid by one `repair`, whose report counts what it changed
        /// and is empty exactly when nothing had to change.
        #[test]
        fn one_repair_restores_the_rule_after_a_lost_message(
            messages in proptest::collection::vec(message(), 1..24),
            lost in 0usize..24,
        ) {
            let mut messages = messages;
            messages.remove(lost % messages.len());
            let was_consistent = integrity_repairs(&messages).is_empty();
            let mut state = ConversationState::default();
            // Nothing skipped: the history judged is the one repaired.
            prop_assert_eq!(state.replay(messages.into_iter().map(|message| goondan_core::MessageEvent::Append { message })), 0);
            let report = state.repair();
            prop_assert!(state.is_consistent());
            prop_assert_eq!(report.is_empty(), was_consistent);
            let events = state.events();
            let count = |kind: &str| events.iter().filter(|event| event.kind() == kind).count();
            prop_assert_eq!(count("remove"), report.results_removed + report.messages_removed);
            prop_assert_eq!(count("append"), report.calls_interrupted);
            prop_assert!(count("replace") <= report.calls_dropped);
            prop_assert_eq!(events.is_empty(), was_consistent, "the repairs are events to save");
        }
    }
}
