//! Request-building pieces shared by the API providers: the system texts of
//! a request, role merging for APIs whose roles must alternate, tool
//! parameter schemas, and the allow-list for `params.extra`.

use std::borrow::Cow;

use goondan_core::{JsonObject, JsonValue, MessageData};

use crate::types::{ModelRequest, ToolDefinition};

/// The system instructions of `request`: `system`, then the content of every
/// `MessageData::System` entry, leaving out empty ones.
pub(crate) fn system_texts(request: &ModelRequest) -> Vec<&str> {
    let entries = request.messages.iter().filter_map(|message| match message {
        MessageData::System { content } => Some(content.as_str()),
        _ => None,
    });
    request.system.as_deref().into_iter().chain(entries).filter(|text| !text.is_empty()).collect()
}

/// Appends a message of `role` made of `parts`, for APIs whose roles must
/// alternate: a message of the same role as the last one joins it, and
/// within it the parts for which `leads` holds (tool results) go before the
/// parts that don't, whatever order they came in (Anthropic requires tool
/// results to open a user message; Gemini's function responses take the
/// same place). A message without parts is dropped, since the APIs reject
/// empty ones, which keeps its neighbours mergeable.
pub(crate) fn push_alternating<R: PartialEq, P>(
    messages: &mut Vec<(R, Vec<P>)>,
    role: R,
    parts: Vec<P>,
    leads: impl Fn(&P) -> bool,
) {
    if parts.is_empty() {
        return;
    }
    let Some((_, existing)) = messages.last_mut().filter(|(last, _)| *last == role) else {
        messages.push((role, parts));
        return;
    };
    for part in parts {
        if leads(&part) {
            let at = existing.iter().take_while(|p| leads(p)).count();
            existing.insert(at, part);
        } else {
            existing.push(part);
        }
    }
}

/// The JSON Schema of a tool's arguments, `{"type": "object"}` when the
/// definition has none (`null`), which the APIs reject.
pub(crate) fn tool_parameters(tool: &ToolDefinition) -> Cow<'_, JsonValue> {
    if tool.parameters.is_null() {
        Cow::Owned(serde_json::json!({"type": "object"}))
    } else {
        Cow::Borrowed(&tool.parameters)
    }
}

/// The `params.extra` entries an API has a field for, each under that
/// field's name: a key matches a field written in camelCase or snake_case
/// (`topK` and `top_k` both match `top_k` and `topK`), or an alias
/// (`(key, field)`). The rest are dropped with a debug line, since the APIs
/// reject unknown fields.
pub(crate) fn allowed_extras<'a>(
    provider: &str,
    extra: &'a JsonObject,
    fields: &[&'static str],
    aliases: &[(&str, &'static str)],
) -> Vec<(&'static str, &'a JsonValue)> {
    let mut allowed = Vec::new();
    for (key, value) in extra {
        let normalized = snake_case(key);
        let field = fields
            .iter()
            .find(|field| snake_case(field) == normalized)
            .or_else(|| aliases.iter().find(|(alias, _)| alias == key).map(|(_, field)| field));
        match field {
            Some(field) => allowed.push((*field, value)),
            None => {
                tracing::debug!(target: "goondan::model", "{provider}: ignoring model parameter '{key}': the API has no such field");
            }
        }
    }
    allowed
}

/// `frequencyPenalty` → `frequency_penalty` (snake_case stays as it is).
fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn system_texts_come_first_then_the_entries() {
        let request = ModelRequest {
            system: Some("one".into()),
            messages: vec![
                MessageData::User { content: "hi".into() },
                MessageData::System { content: String::new() },
                MessageData::System { content: "two".into() },
            ],
            ..ModelRequest::default()
        };
        assert_eq!(system_texts(&request), ["one", "two"]);
        assert!(system_texts(&ModelRequest { system: Some(String::new()), ..ModelRequest::default() }).is_empty());
    }

    #[test]
    fn same_roles_merge_with_leading_parts_first() {
        let mut messages: Vec<(&str, Vec<&str>)> = Vec::new();
        let result = |part: &&str| part.starts_with("result");
        push_alternating(&mut messages, "user", vec!["hello"], result);
        push_alternating(&mut messages, "model", vec![], result);
        push_alternating(&mut messages, "user", vec!["result 1"], result);
        push_alternating(&mut messages, "user", vec!["more", "result 2"], result);
        push_alternating(&mut messages, "model", vec!["answer"], result);
        assert_eq!(messages, [("user", vec!["result 1", "result 2", "hello", "more"]), ("model", vec!["answer"])]);
    }

    #[test]
    fn extras_are_matched_in_either_case_style_or_by_alias() {
        let extra = json!({"topK": 5, "stop_sequences": ["END"], "stop": "X", "frequencyPenalty": 1, "Seed": 2})
            .as_object()
            .cloned()
            .unwrap_or_default();
        let allowed = allowed_extras("p", &extra, &["top_k", "stopSequences"], &[("stop", "stopSequences")]);
        assert_eq!(allowed, [("top_k", &json!(5)), ("stopSequences", &json!(["END"])), ("stopSequences", &json!("X"))]);
    }
}
