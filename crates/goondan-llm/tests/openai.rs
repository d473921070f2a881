//! The OpenAI provider against a local server that speaks the real wire
//! format: Chat Completions and Responses streams shaped like the ones in
//! OpenAI's API reference, and requests recorded and checked.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use axum::http::Method;
use common::{Canned, MockServer, closed_url, complete, endless_server, fast_retries, object, stalled_server};
use goondan_core::{JsonValue, MessageData, ToolCall, ToolError, ToolResult};
use goondan_llm::openai::OpenAiProvider;
use goondan_llm::{
    ModelError, ModelParams, ModelProvider, ModelRequest, ModelSettings, ProviderKind, RawToolCall, Secret, StopReason,
    StreamEvent, TokenUsage, ToolDefinition,
};
use serde_json::json;

const KEY: &str = "sk-test-0123456789SECRETabcd";

/// A mock OpenAI server answering `replies` in order; returns its `/v1` base URL.
async fn serve(replies: Vec<Canned>) -> (String, MockServer) {
    let server = MockServer::start(replies).await;
    (server.url("/v1"), server)
}

// ---------------------------------------------------------------------------
// The provider side.

fn settings(endpoint: &str, options: JsonValue) -> ModelSettings {
    ModelSettings {
        kind: ProviderKind::OpenAi,
        model: "gpt-4.1-mini".into(),
        endpoint: endpoint.into(),
        api_key: Some(Secret::new(KEY)),
        options: options.as_object().cloned().unwrap_or_default(),
        bundle_root: PathBuf::from("."),
    }
}

fn provider(endpoint: &str, options: JsonValue) -> OpenAiProvider {
    match OpenAiProvider::new(&settings(endpoint, options)) {
        Ok(provider) => provider.with_retry_policy(fast_retries()),
        Err(error) => panic!("provider: {error}"),
    }
}

/// A conversation with everything: a system entry, a user message, an
/// assistant message with text and two tool calls, an ok and an error result.
fn conversation() -> ModelRequest {
    let error = ToolError::new("E_FILE_NOT_FOUND", "FileNotFoundError", "no such file: b.txt")
        .with_suggestion("list the directory first")
        .with_help_url("https://docs.goondan.ai/errors/E_FILE_NOT_FOUND");
    ModelRequest {
        system: Some("You are a careful assistant.".into()),
        messages: vec![
            MessageData::System { content: "The workspace is /tmp/w.".into() },
            MessageData::User { content: "Read a.txt and b.txt".into() },
            MessageData::Assistant {
                content: Some("Reading both.".into()),
                tool_calls: vec![
                    ToolCall::new("call_1", "file__read", object(json!({"path": "a.txt"}))),
                    ToolCall::new("call_2", "file__read", object(json!({"path": "b.txt"}))),
                ],
            },
            MessageData::Tool {
                tool_call_id: "call_1".into(),
                tool_name: "file__read".into(),
                result: Box::new(ToolResult::ok(json!({"content": "hello"}))),
            },
            MessageData::Tool {
                tool_call_id: "call_2".into(),
                tool_name: "file__read".into(),
                result: Box::new(ToolResult::error(error)),
            },
            MessageData::User { content: "Now list the files.".into() },
        ],
        tools: vec![
            ToolDefinition {
                name: "bash__exec".into(),
                description: Some("Run a shell command".into()),
                parameters: json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}),
            },
            ToolDefinition { name: "file__read".into(), description: None, parameters: json!({"type": "object"}) },
        ],
        params: ModelParams {
            temperature: Some(0.2),
            max_tokens: Some(512),
            top_p: Some(0.9),
            extra: object(json!({"frequencyPenalty": 0.5, "seed": 7, "top_k": 40})),
        },
    }
}

const ERROR_RESULT: &str = r#"{"status":"error","error":{"message":"no such file: b.txt","name":"FileNotFoundError","code":"E_FILE_NOT_FOUND","suggestion":"list the directory first","helpUrl":"https://docs.goondan.ai/errors/E_FILE_NOT_FOUND"}}"#;

// ---------------------------------------------------------------------------
// Chat Completions.

/// Text in several chunks, then two parallel tool calls whose arguments
/// arrive in fragments, the finish reason, the usage chunk and `[DONE]`
/// (the shapes of https://platform.openai.com/docs/api-reference/chat-streaming).
const CHAT_STREAM: &str = r#"data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4.1-mini-2025-04-14","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4.1-mini-2025-04-14","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{"content":"Let me"},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4.1-mini-2025-04-14","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{"content":" look"},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4.1-mini-2025-04-14","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{"content":" at both."},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4.1-mini-2025-04-14","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_DdmO9pD3xa9XTPNJ32zg2hcA","type":"function","function":{"name":"bash__exec","arguments":""}}]},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4.1-mini-2025-04-14","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"com"}}]},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4.1-mini-2025-04-14","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"mand\": \"l"}}]},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4.1-mini-2025-04-14","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"s -la\"}"}}]},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4.1-mini-2025-04-14","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_ABFUIRqbfrCD3KVnR6PFWmOr","type":"function","function":{"name":"file__read","arguments":""}}]},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4.1-mini-2025-04-14","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"path\""}}]},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4.1-mini-2025-04-14","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":": \"c.txt\"}"}}]},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4.1-mini-2025-04-14","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}],"usage":null}

data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4.1-mini-2025-04-14","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[],"usage":{"prompt_tokens":182,"completion_tokens":47,"total_tokens":229,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}

data: [DONE]

"#;

const CHAT_HELLO: &str = r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4.1-mini","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4.1-mini","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4.1-mini","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}

data: [DONE]

"#;

fn hello_request() -> ModelRequest {
    ModelRequest {
        system: Some("Be brief.".into()),
        messages: vec![MessageData::User { content: "hi".into() }],
        ..ModelRequest::default()
    }
}

#[tokio::test]
async fn chat_streams_text_and_parallel_tool_calls_and_sends_the_whole_conversation() {
    let (endpoint, mock) = serve(vec![Canned::sse(CHAT_STREAM)]).await;
    let provider = provider(&endpoint, json!({"organization": "org-test", "project": "proj_test"}));
    assert_eq!(provider.name(), "openai");
    let (result, events) = complete(&provider, &conversation()).await;
    let Ok(response) = result else { panic!("{result:?}") };

    assert_eq!(response.text.as_deref(), Some("Let me look at both."));
    assert_eq!(
        response.tool_calls,
        [
            RawToolCall {
                id: "call_DdmO9pD3xa9XTPNJ32zg2hcA".into(),
                name: "bash__exec".into(),
                arguments: r#"{"command": "ls -la"}"#.into()
            },
            RawToolCall {
                id: "call_ABFUIRqbfrCD3KVnR6PFWmOr".into(),
                name: "file__read".into(),
                arguments: r#"{"path": "c.txt"}"#.into()
            },
        ]
    );
    assert_eq!(response.stop_reason, Some(StopReason::ToolUse));
    assert_eq!(response.usage, TokenUsage { input_tokens: 182, output_tokens: 47, ..TokenUsage::default() });
    assert_eq!(
        events,
        [
            StreamEvent::TextDelta("Let me".into()),
            StreamEvent::TextDelta(" look".into()),
            StreamEvent::TextDelta(" at both.".into()),
            StreamEvent::ToolCallStarted { id: "call_DdmO9pD3xa9XTPNJ32zg2hcA".into(), name: "bash__exec".into() },
            StreamEvent::ToolCallStarted { id: "call_ABFUIRqbfrCD3KVnR6PFWmOr".into(), name: "file__read".into() },
        ]
    );

    let requests = mock.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.method, Method::POST);
    assert_eq!(request.path(), "/v1/chat/completions");
    assert_eq!(request.header("authorization"), format!("Bearer {KEY}"));
    assert_eq!(request.header("content-type"), "application/json");
    assert_eq!(request.header("openai-organization"), "org-test");
    assert_eq!(request.header("openai-project"), "proj_test");
    assert_eq!(
        request.json(),
        json!({
            "model": "gpt-4.1-mini",
            "messages": [
                {"role": "system", "content": "You are a careful assistant."},
                {"role": "system", "content": "The workspace is /tmp/w."},
                {"role": "user", "content": "Read a.txt and b.txt"},
                {"role": "assistant", "content": "Reading both.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "file__read", "arguments": "{\"path\":\"a.txt\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "file__read", "arguments": "{\"path\":\"b.txt\"}"}},
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"status\":\"ok\",\"output\":{\"content\":\"hello\"}}"},
                {"role": "tool", "tool_call_id": "call_2", "content": ERROR_RESULT},
                {"role": "user", "content": "Now list the files."},
            ],
            "stream": true,
            "stream_options": {"include_usage": true},
            "tools": [
                {"type": "function", "function": {"name": "bash__exec", "description": "Run a shell command",
                    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
                {"type": "function", "function": {"name": "file__read", "parameters": {"type": "object"}}},
            ],
            "temperature": 0.2,
            "top_p": 0.9,
            "max_tokens": 512,
            // `top_k` is not a Chat Completions field: dropped.
            "frequency_penalty": 0.5,
            "seed": 7,
        })
    );
}

#[tokio::test]
async fn chat_options_choose_the_token_field_and_extra_body() {
    let (endpoint, mock) = serve(vec![Canned::sse(CHAT_HELLO)]).await;
    let options =
        json!({"maxTokensField": "max_completion_tokens", "extraBody": {"top_k": 20, "repetition_penalty": 1.1}});
    let provider = provider(&endpoint, options);
    let mut request = hello_request();
    request.params.max_tokens = Some(64);
    let (result, events) = complete(&provider, &request).await;
    let Ok(response) = result else { panic!("{result:?}") };
    assert_eq!(response.text.as_deref(), Some("Hello"));
    assert_eq!(response.stop_reason, Some(StopReason::EndTurn));
    assert_eq!(response.usage, TokenUsage { input_tokens: 5, output_tokens: 1, ..TokenUsage::default() });
    assert_eq!(events, [StreamEvent::TextDelta("Hello".into())]);
    let requests = mock.requests();
    assert_eq!(
        requests[0].json(),
        json!({
            "model": "gpt-4.1-mini",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_completion_tokens": 64,
            "top_k": 20,
            "repetition_penalty": 1.1,
        })
    );
}

/// What llama.cpp, Ollama and friends send: whole calls in one chunk, no
/// `index`, arguments as an object, a call without an id, `stop` instead of
/// `tool_calls`, and usage inside the last choice chunk.
#[tokio::test]
async fn chat_accepts_the_variations_of_compatible_servers() {
    let stream = r#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"id":"call_x","type":"function","function":{"name":"bash__exec","arguments":{"command":"ls"}}}]},"finish_reason":null}]}

data: {"choices":[{"index":0,"delta":{"tool_calls":[{"type":"function","function":{"name":"file__read","arguments":"{\"path\":"}}]},"finish_reason":null}]}

data: {"choices":[{"index":0,"delta":{"tool_calls":[{"function":{"arguments":"\"a\"}"}}]},"finish_reason":null}]}

data: {"choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_z","function":{"name":"noargs__tool","arguments":""}}]},"finish_reason":null}]}

data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":3}}

"#;
    let (endpoint, _mock) = serve(vec![Canned::sse(stream)]).await;
    let provider = provider(&endpoint, json!({}));
    let (result, events) = complete(&provider, &hello_request()).await;
    let Ok(response) = result else { panic!("{result:?}") };
    assert_eq!(response.text, None);
    assert_eq!(response.stop_reason, Some(StopReason::ToolUse));
    assert_eq!(response.usage, TokenUsage { input_tokens: 10, output_tokens: 3, ..TokenUsage::default() });
    let calls: Vec<(&str, &str)> =
        response.tool_calls.iter().map(|call| (call.name.as_str(), call.arguments.as_str())).collect();
    assert_eq!(
        calls,
        [("bash__exec", r#"{"command":"ls"}"#), ("file__read", r#"{"path":"a"}"#), ("noargs__tool", "{}")]
    );
    assert_eq!(response.tool_calls[0].id, "call_x");
    assert!(response.tool_calls[1].id.starts_with("call_") && response.tool_calls[1].id.len() > 10);
    assert_eq!(response.tool_calls[2].id, "call_z");
    // Every call was announced once, with the id it ends up with.
    let started: Vec<StreamEvent> = response
        .tool_calls
        .iter()
        .map(|call| StreamEvent::ToolCallStarted { id: call.id.clone(), name: call.name.clone() })
        .collect();
    assert_eq!(events, started);
}

#[tokio::test]
async fn chat_maps_length_to_max_tokens() {
    let stream = r#"data: {"choices":[{"index":0,"delta":{"content":"This is cut"},"finish_reason":null}]}

data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}

data: [DONE]

"#;
    let (endpoint, _mock) = serve(vec![Canned::sse(stream)]).await;
    let (result, _) = complete(&provider(&endpoint, json!({})), &hello_request()).await;
    assert_eq!(result.map(|r| (r.text, r.stop_reason)), Ok((Some("This is cut".into()), Some(StopReason::MaxTokens))));
}

#[tokio::test]
async fn unauthorized_gives_the_api_message_without_the_key() {
    let body = json!({"error": {
        "message": "Incorrect API key provided: sk-test-************abcd. You can find your API key at https://platform.openai.com/account/api-keys.",
        "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}});
    let (endpoint, mock) = serve(vec![Canned::json(401, body)]).await;
    let provider = provider(&endpoint, json!({}));
    let (result, _) = complete(&provider, &hello_request()).await;
    let Err(error) = result else { panic!("expected an error") };
    let ModelError::Unauthorized { status: 401, ref message, .. } = error else { panic!("{error:?}") };
    assert!(message.starts_with("Incorrect API key provided: <redacted>. You can find your API key"), "{message}");
    let shown = format!("{error} {error:?} {provider:?}");
    assert!(!shown.contains(KEY) && !shown.contains("abcd") && !shown.contains("SECRET"), "{shown}");
    assert_eq!(mock.requests().len(), 1, "a refused key is not retried");
}

#[tokio::test]
async fn the_key_is_scrubbed_even_when_a_server_echoes_it() {
    let body = json!({"error": {"message": format!("bad header: Bearer {KEY}")}});
    let (endpoint, _mock) = serve(vec![Canned::json(403, body)]).await;
    let (result, _) = complete(&provider(&endpoint, json!({})), &hello_request()).await;
    let Err(error) = result else { panic!("expected an error") };
    assert!(matches!(error, ModelError::Unauthorized { status: 403, .. }), "{error:?}");
    assert_eq!(error.to_string(), "the openai API refused the credentials (HTTP 403): bad header: Bearer <redacted>");
}

#[tokio::test]
async fn rate_limits_are_retried() {
    let limited = Canned::json(
        429,
        json!({"error": {"message": "Rate limit reached for gpt-4.1-mini", "type": "requests", "code": "rate_limit_exceeded"}}),
    );
    let (endpoint, mock) = serve(vec![limited, Canned::sse(CHAT_HELLO)]).await;
    let (result, _) = complete(&provider(&endpoint, json!({})), &hello_request()).await;
    assert_eq!(result.map(|r| r.text), Ok(Some("Hello".into())));
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].body, requests[1].body, "the retry sends the same request");
}

#[tokio::test]
async fn server_errors_are_retried_until_the_attempts_run_out() {
    let down = || Canned::json(500, json!({"error": {"message": "The server had an error", "type": "server_error"}}));
    let (endpoint, mock) = serve(vec![down(), down(), down(), Canned::sse(CHAT_HELLO)]).await;
    let (result, _) = complete(&provider(&endpoint, json!({})), &hello_request()).await;
    assert_eq!(result.map(|r| r.text), Ok(Some("Hello".into())));
    assert_eq!(mock.requests().len(), 4);

    let (endpoint, mock) = serve(vec![down(), down(), down(), down(), Canned::sse(CHAT_HELLO)]).await;
    let (result, _) = complete(&provider(&endpoint, json!({})), &hello_request()).await;
    let Err(error) = result else { panic!("expected an error") };
    assert_eq!(
        error,
        ModelError::Api { provider: "openai".into(), status: 500, message: "The server had an error".into() }
    );
    assert_eq!(mock.requests().len(), 4);
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let bad = Canned::json(
        400,
        json!({"error": {"message": "Unsupported parameter: 'max_tokens'", "type": "invalid_request_error", "param": "max_tokens"}}),
    );
    let (endpoint, mock) = serve(vec![bad]).await;
    let (result, _) = complete(&provider(&endpoint, json!({})), &hello_request()).await;
    assert!(matches!(result, Err(ModelError::Api { status: 400, ref message, .. }) if message.contains("max_tokens")));
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn an_unreachable_server_is_a_network_error() {
    let endpoint = format!("{}/v1", closed_url().await);
    let (result, _) = complete(&provider(&endpoint, json!({})), &hello_request()).await;
    assert!(matches!(result, Err(ModelError::Network { ref endpoint, .. }) if endpoint.ends_with("/v1")), "{result:?}");
}

#[tokio::test]
async fn an_error_inside_the_chat_stream_fails_the_call() {
    let stream = r#"data: {"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}

data: {"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}

"#;
    let (endpoint, _mock) = serve(vec![Canned::sse(stream)]).await;
    let (result, events) = complete(&provider(&endpoint, json!({})), &hello_request()).await;
    // `server_error` is what a 500 carries.
    assert_eq!(
        result,
        Err(ModelError::Api {
            provider: "openai".into(),
            status: 500,
            message: "The server had an error while processing your request. Sorry about that!".into()
        })
    );
    assert_eq!(events, [StreamEvent::TextDelta("Hel".into())]);

    // vLLM puts an HTTP status in `code`.
    let stream = "data: {\"error\":{\"object\":\"error\",\"message\":\"out of memory\",\"type\":\"InternalServerError\",\"code\":503}}\n\n";
    let (endpoint, _mock) = serve(vec![Canned::sse(stream)]).await;
    let (result, _) = complete(&provider(&endpoint, json!({})), &hello_request()).await;
    assert_eq!(
        result,
        Err(ModelError::Api { provider: "openai".into(), status: 503, message: "out of memory".into() })
    );
}

#[tokio::test]
async fn malformed_or_cut_streams_are_protocol_errors() {
    let stream = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\n\n";
    let (endpoint, _mock) = serve(vec![Canned::sse(stream)]).await;
    let (result, _) = complete(&provider(&endpoint, json!({})), &hello_request()).await;
    assert!(
        matches!(result, Err(ModelError::Protocol { ref message, .. }) if message.contains("cannot read a stream event")),
        "{result:?}"
    );

    // Wrong types are malformed too.
    let stream = "data: {\"choices\":\"oops\"}\n\n";
    let (endpoint, _mock) = serve(vec![Canned::sse(stream)]).await;
    let (result, _) = complete(&provider(&endpoint, json!({})), &hello_request()).await;
    assert!(matches!(result, Err(ModelError::Protocol { .. })), "{result:?}");

    // No finish_reason and no [DONE]: the reply is incomplete.
    let stream = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n";
    let (endpoint, _mock) = serve(vec![Canned::sse(stream)]).await;
    let (result, _) = complete(&provider(&endpoint, json!({})), &hello_request()).await;
    assert!(
        matches!(result, Err(ModelError::Protocol { ref message, .. }) if message.contains("ended before")),
        "{result:?}"
    );
}

/// A server that sends the headers and one event, then goes silent.
#[tokio::test]
async fn a_silent_stream_times_out() {
    let endpoint = stalled_server("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n").await;
    let provider = provider(&format!("{endpoint}/v1"), json!({"idleTimeoutSeconds": 0.2}));
    let (result, events) = complete(&provider, &hello_request()).await;
    assert!(
        matches!(result, Err(ModelError::Protocol { ref message, .. }) if message.contains("no data")),
        "{result:?}"
    );
    assert_eq!(events, [StreamEvent::TextDelta("Hi".into())]);
}

// ---------------------------------------------------------------------------
// Responses API.

/// A message streamed in pieces, then two function calls whose arguments
/// arrive in fragments, and `response.completed` with usage (the shapes of
/// https://platform.openai.com/docs/api-reference/responses-streaming).
const RESPONSES_STREAM: &str = r#"event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_67ccd2bed1ec8190b14f964abc054267","object":"response","created_at":1741476542,"status":"in_progress","error":null,"incomplete_details":null,"instructions":"You are a careful assistant.","max_output_tokens":512,"model":"gpt-4.1-mini-2025-04-14","output":[],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":true,"temperature":0.2,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"top_p":0.9,"truncation":"disabled","usage":null,"user":null,"metadata":{}}}

event: response.in_progress
data: {"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_67ccd2bed1ec8190b14f964abc054267","object":"response","created_at":1741476542,"status":"in_progress","output":[],"usage":null}}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_67ccd2bf17f0819081ff3bb2cf6508e6","type":"message","status":"in_progress","role":"assistant","content":[]}}

event: response.content_part.added
data: {"type":"response.content_part.added","sequence_number":3,"item_id":"msg_67ccd2bf17f0819081ff3bb2cf6508e6","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_67ccd2bf17f0819081ff3bb2cf6508e6","output_index":0,"content_index":0,"delta":"Let me"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":5,"item_id":"msg_67ccd2bf17f0819081ff3bb2cf6508e6","output_index":0,"content_index":0,"delta":" look."}

event: response.output_text.done
data: {"type":"response.output_text.done","sequence_number":6,"item_id":"msg_67ccd2bf17f0819081ff3bb2cf6508e6","output_index":0,"content_index":0,"text":"Let me look."}

event: response.content_part.done
data: {"type":"response.content_part.done","sequence_number":7,"item_id":"msg_67ccd2bf17f0819081ff3bb2cf6508e6","output_index":0,"content_index":0,"part":{"type":"output_text","text":"Let me look.","annotations":[]}}

event: response.output_item.done
data: {"type":"response.output_item.done","sequence_number":8,"output_index":0,"item":{"id":"msg_67ccd2bf17f0819081ff3bb2cf6508e6","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Let me look.","annotations":[]}]}}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":9,"output_index":1,"item":{"id":"fc_67ca09c6bedc8190a7abfec07b1a1332","type":"function_call","status":"in_progress","arguments":"","call_id":"call_unLAR8MvFNptuiZK6K6HCy5k","name":"bash__exec"}}

event: response.function_call_arguments.delta
data: {"type":"response.function_call_arguments.delta","sequence_number":10,"item_id":"fc_67ca09c6bedc8190a7abfec07b1a1332","output_index":1,"delta":"{\"command\""}

event: response.function_call_arguments.delta
data: {"type":"response.function_call_arguments.delta","sequence_number":11,"item_id":"fc_67ca09c6bedc8190a7abfec07b1a1332","output_index":1,"delta":":\"ls\"}"}

event: response.function_call_arguments.done
data: {"type":"response.function_call_arguments.done","sequence_number":12,"item_id":"fc_67ca09c6bedc8190a7abfec07b1a1332","output_index":1,"arguments":"{\"command\":\"ls\"}"}

event: response.output_item.done
data: {"type":"response.output_item.done","sequence_number":13,"output_index":1,"item":{"id":"fc_67ca09c6bedc8190a7abfec07b1a1332","type":"function_call","status":"completed","arguments":"{\"command\":\"ls\"}","call_id":"call_unLAR8MvFNptuiZK6K6HCy5k","name":"bash__exec"}}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":14,"output_index":2,"item":{"id":"fc_67ca09c6bedc8190a7abfec07b1a1444","type":"function_call","status":"in_progress","arguments":"","call_id":"call_9cPbM2AqFf8KqsY3Z1QeW7Bn","name":"file__read"}}

event: response.function_call_arguments.delta
data: {"type":"response.function_call_arguments.delta","sequence_number":15,"item_id":"fc_67ca09c6bedc8190a7abfec07b1a1444","output_index":2,"delta":"{\"path\":"}

event: response.function_call_arguments.delta
data: {"type":"response.function_call_arguments.delta","sequence_number":16,"item_id":"fc_67ca09c6bedc8190a7abfec07b1a1444","output_index":2,"delta":"\"c.txt\"}"}

event: response.function_call_arguments.done
data: {"type":"response.function_call_arguments.done","sequence_number":17,"item_id":"fc_67ca09c6bedc8190a7abfec07b1a1444","output_index":2,"arguments":"{\"path\":\"c.txt\"}"}

event: response.output_item.done
data: {"type":"response.output_item.done","sequence_number":18,"output_index":2,"item":{"id":"fc_67ca09c6bedc8190a7abfec07b1a1444","type":"function_call","status":"completed","arguments":"{\"path\":\"c.txt\"}","call_id":"call_9cPbM2AqFf8KqsY3Z1QeW7Bn","name":"file__read"}}

event: response.completed
data: {"type":"response.completed","sequence_number":19,"response":{"id":"resp_67ccd2bed1ec8190b14f964abc054267","object":"response","created_at":1741476542,"status":"completed","error":null,"incomplete_details":null,"model":"gpt-4.1-mini-2025-04-14","output":[{"id":"msg_67ccd2bf17f0819081ff3bb2cf6508e6","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Let me look.","annotations":[]}]},{"id":"fc_67ca09c6bedc8190a7abfec07b1a1332","type":"function_call","status":"completed","arguments":"{\"command\":\"ls\"}","call_id":"call_unLAR8MvFNptuiZK6K6HCy5k","name":"bash__exec"},{"id":"fc_67ca09c6bedc8190a7abfec07b1a1444","type":"function_call","status":"completed","arguments":"{\"path\":\"c.txt\"}","call_id":"call_9cPbM2AqFf8KqsY3Z1QeW7Bn","name":"file__read"}],"usage":{"input_tokens":182,"input_tokens_details":{"cached_tokens":0},"output_tokens":47,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":229}}}

"#;

#[tokio::test]
async fn responses_streams_text_and_function_calls_and_sends_the_whole_conversation() {
    let (endpoint, mock) = serve(vec![Canned::sse(RESPONSES_STREAM)]).await;
    let provider = provider(&endpoint, json!({"api": "responses"}));
    let (result, events) = complete(&provider, &conversation()).await;
    let Ok(response) = result else { panic!("{result:?}") };

    assert_eq!(response.text.as_deref(), Some("Let me look."));
    assert_eq!(
        response.tool_calls,
        [
            RawToolCall {
                id: "call_unLAR8MvFNptuiZK6K6HCy5k".into(),
                name: "bash__exec".into(),
                arguments: r#"{"command":"ls"}"#.into()
            },
            RawToolCall {
                id: "call_9cPbM2AqFf8KqsY3Z1QeW7Bn".into(),
                name: "file__read".into(),
                arguments: r#"{"path":"c.txt"}"#.into()
            },
        ]
    );
    assert_eq!(response.stop_reason, Some(StopReason::ToolUse));
    assert_eq!(response.usage, TokenUsage { input_tokens: 182, output_tokens: 47, ..TokenUsage::default() });
    assert_eq!(
        events,
        [
            StreamEvent::TextDelta("Let me".into()),
            StreamEvent::TextDelta(" look.".into()),
            StreamEvent::ToolCallStarted { id: "call_unLAR8MvFNptuiZK6K6HCy5k".into(), name: "bash__exec".into() },
            StreamEvent::ToolCallStarted { id: "call_9cPbM2AqFf8KqsY3Z1QeW7Bn".into(), name: "file__read".into() },
        ]
    );

    let requests = mock.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.path(), "/v1/responses");
    assert_eq!(request.header("authorization"), format!("Bearer {KEY}"));
    assert_eq!(request.header("content-type"), "application/json");
    assert_eq!(
        request.json(),
        json!({
            "model": "gpt-4.1-mini",
            "instructions": "You are a careful assistant.",
            "input": [
                {"role": "system", "content": "The workspace is /tmp/w."},
                {"role": "user", "content": "Read a.txt and b.txt"},
                {"role": "assistant", "content": "Reading both."},
                {"type": "function_call", "call_id": "call_1", "name": "file__read", "arguments": "{\"path\":\"a.txt\"}"},
                {"type": "function_call", "call_id": "call_2", "name": "file__read", "arguments": "{\"path\":\"b.txt\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "{\"status\":\"ok\",\"output\":{\"content\":\"hello\"}}"},
                {"type": "function_call_output", "call_id": "call_2", "output": ERROR_RESULT},
                {"role": "user", "content": "Now list the files."},
            ],
            "stream": true,
            "tools": [
                {"type": "function", "name": "bash__exec", "description": "Run a shell command",
                    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
                    "strict": false},
                {"type": "function", "name": "file__read", "parameters": {"type": "object"}, "strict": false},
            ],
            "temperature": 0.2,
            "top_p": 0.9,
            "max_output_tokens": 512,
            // Neither `frequencyPenalty` nor `seed` nor `top_k` is a Responses field.
        })
    );
}

#[tokio::test]
async fn responses_incomplete_and_text_only_replies() {
    let stream = r#"event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Once upon"}

event: response.incomplete
data: {"type":"response.incomplete","sequence_number":5,"response":{"id":"resp_1","object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[],"usage":{"input_tokens":9,"output_tokens":16,"total_tokens":25}}}

"#;
    let (endpoint, _mock) = serve(vec![Canned::sse(stream)]).await;
    let provider = provider(&endpoint, json!({"api": "responses"}));
    let (result, _) = complete(&provider, &hello_request()).await;
    let Ok(response) = result else { panic!("{result:?}") };
    assert_eq!(response.text.as_deref(), Some("Once upon"));
    assert_eq!(response.stop_reason, Some(StopReason::MaxTokens));
    assert_eq!(response.usage, TokenUsage { input_tokens: 9, output_tokens: 16, ..TokenUsage::default() });

    // A server that sends only the final event still yields its reply.
    let stream = r#"data: {"type":"response.completed","response":{"status":"completed","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hi there"}]},{"type":"function_call","id":"fc_1","call_id":"call_1","name":"bash__exec","arguments":"{\"command\":\"pwd\"}"}],"usage":{"input_tokens":3,"output_tokens":4}}}

"#;
    let (endpoint, _mock) = serve(vec![Canned::sse(stream)]).await;
    let provider = provider_for_responses(&endpoint);
    let (result, events) = complete(&provider, &hello_request()).await;
    let Ok(response) = result else { panic!("{result:?}") };
    assert_eq!(response.text.as_deref(), Some("Hi there"));
    assert_eq!(
        response.tool_calls,
        [RawToolCall { id: "call_1".into(), name: "bash__exec".into(), arguments: r#"{"command":"pwd"}"#.into() }]
    );
    assert_eq!(response.stop_reason, Some(StopReason::ToolUse));
    assert_eq!(
        events,
        [
            StreamEvent::TextDelta("Hi there".into()),
            StreamEvent::ToolCallStarted { id: "call_1".into(), name: "bash__exec".into() },
        ]
    );
}

fn provider_for_responses(endpoint: &str) -> OpenAiProvider {
    provider(endpoint, json!({"api": "responses"}))
}

#[tokio::test]
async fn responses_failures_and_error_events_fail_the_call() {
    let failed = r#"event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}

event: response.failed
data: {"type":"response.failed","sequence_number":1,"response":{"id":"resp_1","object":"response","status":"failed","error":{"code":"server_error","message":"The model failed to generate a response."},"incomplete_details":null,"output":[]}}

"#;
    let (endpoint, _mock) = serve(vec![Canned::sse(failed)]).await;
    let (result, _) = complete(&provider_for_responses(&endpoint), &hello_request()).await;
    let Err(ModelError::Api { status: 500, message, .. }) = result else { panic!("{result:?}") };
    assert_eq!(message, "The model failed to generate a response.");

    let error = r#"event: error
data: {"type":"error","code":"ERR_SOMETHING","message":"Something went wrong","param":null,"sequence_number":1}

"#;
    let (endpoint, _mock) = serve(vec![Canned::sse(error)]).await;
    let (result, _) = complete(&provider_for_responses(&endpoint), &hello_request()).await;
    // An unknown code: 500.
    let Err(ModelError::Api { status: 500, message, .. }) = result else { panic!("{result:?}") };
    assert_eq!(message, "Something went wrong");

    let nested = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"code\":\"context_length_exceeded\",\"message\":\"Your input exceeds the context window of this model.\"}}\n\n";
    let (endpoint, _mock) = serve(vec![Canned::sse(nested)]).await;
    let (result, _) = complete(&provider_for_responses(&endpoint), &hello_request()).await;
    // An invalid request is a 400, which is not worth retrying.
    assert!(
        matches!(result, Err(ModelError::Api { status: 400, ref message, .. }) if message == "Your input exceeds the context window of this model."),
        "{result:?}"
    );
}

#[tokio::test]
async fn responses_malformed_or_cut_streams_are_protocol_errors() {
    let stream =
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"\n\n";
    let (endpoint, _mock) = serve(vec![Canned::sse(stream)]).await;
    let (result, _) = complete(&provider_for_responses(&endpoint), &hello_request()).await;
    assert!(
        matches!(result, Err(ModelError::Protocol { ref message, .. }) if message.contains("cannot read")),
        "{result:?}"
    );

    let stream = "data: {\"type\":\"response.output_text.delta\",\"delta\":42}\n\n";
    let (endpoint, _mock) = serve(vec![Canned::sse(stream)]).await;
    let (result, _) = complete(&provider_for_responses(&endpoint), &hello_request()).await;
    assert!(matches!(result, Err(ModelError::Protocol { .. })), "{result:?}");

    let stream = "data: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n";
    let (endpoint, _mock) = serve(vec![Canned::sse(stream)]).await;
    let (result, _) = complete(&provider_for_responses(&endpoint), &hello_request()).await;
    assert!(
        matches!(result, Err(ModelError::Protocol { ref message, .. }) if message.contains("response.completed")),
        "{result:?}"
    );
}

#[tokio::test]
async fn responses_requests_are_retried_too() {
    let limited = Canned::json(429, json!({"error": {"message": "slow down"}}));
    let (endpoint, mock) = serve(vec![limited, Canned::sse(RESPONSES_STREAM)]).await;
    let (result, _) = complete(&provider_for_responses(&endpoint), &hello_request()).await;
    assert_eq!(result.map(|r| r.tool_calls.len()), Ok(2));
    assert_eq!(mock.requests().len(), 2);
}

// ---------------------------------------------------------------------------
// Configuration.

#[test]
fn settings_are_checked() {
    let mut no_key = settings("http://127.0.0.1:9/v1", json!({}));
    no_key.api_key = None;
    assert_eq!(
        OpenAiProvider::new(&no_key).err(),
        Some(ModelError::MissingKey { provider: "openai".into(), variable: "OPENAI_API_KEY".into() })
    );
    for (options, complaint) in [
        (json!({"api": "completions"}), "options.api"),
        (json!({"api": 3}), "options.api"),
        (json!({"maxTokensField": "max_output_tokens"}), "maxTokensField"),
        (json!({"idleTimeoutSeconds": 0}), "idleTimeoutSeconds"),
        (json!({"idleTimeoutSeconds": "soon"}), "idleTimeoutSeconds"),
        // Too large for a Duration: refused, where it used to panic.
        (json!({"idleTimeoutSeconds": 1e300}), "idleTimeoutSeconds"),
        (json!({"extraBody": []}), "extraBody"),
        (json!({"extraBody": {"stream": false}}), "'stream'"),
        (json!({"organization": "bad\nvalue"}), "organization"),
    ] {
        let error = OpenAiProvider::new(&settings("http://127.0.0.1:9/v1", options.clone())).err();
        assert!(
            matches!(&error, Some(ModelError::Config(message)) if message.contains(complaint)),
            "{options}: {error:?}"
        );
    }
    let mut bad_key = settings("http://127.0.0.1:9/v1", json!({}));
    bad_key.api_key = Some(Secret::new("sk-line\nbreak-SECRET"));
    let error = OpenAiProvider::new(&bad_key).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(error.contains("API key") && !error.contains("SECRET"), "{error}");
}

/// A server that never sends its headers must not hang the call: the idle
/// timeout bounds that wait too, and it is retried like a network failure.
#[tokio::test]
async fn silent_headers_time_out_as_a_network_error() {
    let slow = Canned::sse(CHAT_HELLO).after(Duration::from_secs(5));
    let (endpoint, mock) = serve(vec![slow]).await;
    let provider = provider(&endpoint, json!({"idleTimeoutSeconds": 0.1}));
    let (result, _) = complete(&provider, &hello_request()).await;
    assert!(
        matches!(result, Err(ModelError::Network { ref message, .. }) if message.contains("no response within 0.1 s")),
        "{result:?}"
    );
    assert_eq!(mock.requests().len(), 4, "retried");
}

/// A tool whose definition has no schema gets an empty object schema, as
/// the Anthropic provider sends it, instead of `"parameters": null`.
#[tokio::test]
async fn tools_without_a_schema_get_an_object_schema() {
    let stream = "data: {\"type\":\"response.completed\",\"response\":{\"output\":[]}}\n\n";
    let (endpoint, mock) = serve(vec![Canned::sse(CHAT_HELLO), Canned::sse(stream)]).await;
    let mut request = hello_request();
    request.tools = vec![ToolDefinition { name: "clock__now".into(), description: None, parameters: JsonValue::Null }];
    let (chat, _) = complete(&provider(&endpoint, json!({})), &request).await;
    assert!(chat.is_ok(), "{chat:?}");
    let (responses, _) = complete(&provider_for_responses(&endpoint), &request).await;
    assert!(responses.is_ok(), "{responses:?}");
    let requests = mock.requests();
    assert_eq!(requests[0].json()["tools"][0]["function"]["parameters"], json!({"type": "object"}));
    assert_eq!(requests[1].json()["tools"][0]["parameters"], json!({"type": "object"}));
}

/// A stream whose line never ends is refused once the line passes the
/// parser's limit, naming it, instead of buffering without bound.
#[tokio::test]
async fn an_endless_sse_line_is_a_protocol_error_naming_the_limit() {
    let endpoint = endless_server(200, "text/event-stream", "data: {\"choices\":", b'x').await;
    let provider = provider(&format!("{endpoint}/v1"), json!({}));
    let error = complete(&provider, &conversation()).await.0.err();
    let Some(ModelError::Protocol { message, .. }) = &error else { panic!("{error:?}") };
    let limit = goondan_llm::http::MAX_SSE_EVENT_BYTES.to_string();
    assert!(message.contains(&limit) && message.contains("exceeds the limit"), "{message}");
}

/// An error body that never ends is read up to its cap, and the error
/// carries what was read (the old reader waited for the end of the body,
/// then gave up with nothing).
#[tokio::test]
async fn a_huge_error_body_is_cut_and_still_reported() {
    let endpoint = endless_server(400, "application/json", "{\"error\": {\"message\": \"bad request", b'!').await;
    let provider = provider(&format!("{endpoint}/v1"), json!({"idleTimeoutSeconds": 600}));
    let error = complete(&provider, &conversation()).await.0.err();
    let Some(ModelError::Api { status: 400, message, .. }) = &error else { panic!("{error:?}") };
    assert!(message.starts_with("{\"error\": {\"message\": \"bad request!!!"), "{message}");
    assert!(message.chars().count() <= 501, "an excerpt, not the body: {}", message.len());
}

/// A stream whose lines end with a bare `\r` (which the SSE format allows)
/// gives the same reply and events as the same stream with `\n`, for both
/// of OpenAI's streaming APIs.
#[tokio::test]
async fn streams_whose_lines_end_with_a_bare_cr_read_as_with_lf() {
    for (api, stream) in [("chat", CHAT_STREAM), ("responses", RESPONSES_STREAM)] {
        let bare_cr = stream.replace("\r\n", "\n").replace('\n', "\r");
        assert!(!bare_cr.contains('\n'));
        let (endpoint, _mock) = serve(vec![Canned::sse(stream), Canned::sse(bare_cr)]).await;
        let provider = provider(&endpoint, json!({"api": api}));
        let expected = complete(&provider, &conversation()).await;
        assert!(expected.0.is_ok(), "{api}: {:?}", expected.0);
        let got = complete(&provider, &conversation()).await;
        assert_eq!(got, expected, "{api}");
    }
}

/// A 429 asking to come back in 2 s is retried after 2 s, not after the
/// (millisecond) backoff, and the call then succeeds; the same with the
/// wait given as an HTTP date.
#[tokio::test]
async fn a_rate_limit_with_retry_after_is_retried_after_that_wait() {
    let limited = r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
    for as_date in [false, true] {
        // A date has a resolution of one second: 3 s from now is 2 to 3 s away.
        let retry_after = if as_date {
            httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(3))
        } else {
            "2".to_owned()
        };
        let (endpoint, mock) = serve(vec![
            Canned::json(429, limited).with_header("retry-after", retry_after.clone()),
            Canned::sse(CHAT_STREAM),
        ])
        .await;
        let provider = provider(&endpoint, json!({}));
        let started = std::time::Instant::now();
        let (result, _) = complete(&provider, &conversation()).await;
        let waited = started.elapsed();
        assert!(result.is_ok(), "{retry_after}: {result:?}");
        assert_eq!(mock.requests().len(), 2);
        assert!(waited >= Duration::from_millis(1900) && waited < Duration::from_secs(10), "{retry_after}: {waited:?}");
    }
}

/// A `Retry-After` longer than the policy's cap falls back to the backoff.
#[tokio::test]
async fn a_retry_after_past_the_cap_falls_back_to_the_backoff() {
    let limited = r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
    let (endpoint, mock) =
        serve(vec![Canned::json(429, limited).with_header("retry-after", "120"), Canned::sse(CHAT_STREAM)]).await;
    let provider = provider(&endpoint, json!({}));
    let started = std::time::Instant::now();
    let (result, _) = complete(&provider, &conversation()).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(mock.requests().len(), 2);
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}
