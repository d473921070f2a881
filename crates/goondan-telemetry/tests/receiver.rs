//! The exporter against a real OTLP/HTTP receiver on 127.0.0.1 that decodes
//! every request with the official definitions (`opentelemetry-proto`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::routing::post;
use goondan_core::{Message, MessageData, MessageSource, ToolCall, ToolStatus};
use goondan_telemetry::{Exporter, TelemetryConfig, TelemetrySink};
use goondan_tools::CallScope;
use goondan_tools::events::{EventKind, EventSink, RuntimeEvent, ToolEventData};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

type Received = Arc<Mutex<Vec<(Vec<(String, String)>, ExportTraceServiceRequest)>>>;

/// A receiver on 127.0.0.1; its URL and what it got.
async fn receiver() -> (String, Received) {
    let received: Received = Arc::default();
    let app = axum::Router::new().route(
        "/v1/traces",
        post({
            let received = Arc::clone(&received);
            move |headers: axum::http::HeaderMap, body: Bytes| {
                let received = Arc::clone(&received);
                async move {
                    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                        return axum::http::StatusCode::BAD_REQUEST;
                    };
                    let headers = headers
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_owned()))
                        .collect();
                    if let Ok(mut all) = received.lock() {
                        all.push((headers, request));
                    }
                    axum::http::StatusCode::OK
                }
            }
        }),
    );
    let Ok(listener) = tokio::net::TcpListener::bind("127.0.0.1:0").await else { panic!("bind") };
    let Ok(address) = listener.local_addr() else { panic!("address") };
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{address}"), received)
}

fn config(base: &str, extra: &[(&str, &str)]) -> TelemetryConfig {
    let mut vars = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), base.to_owned()),
        ("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "50".to_owned()),
        ("OTEL_EXPORTER_OTLP_TIMEOUT".to_owned(), "2000".to_owned()),
    ];
    vars.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    let lookup = move |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    match TelemetryConfig::from_env(&lookup) {
        Ok(Some(config)) => config,
        other => panic!("{other:?}"),
    }
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

fn scope() -> Arc<CallScope> {
    let args = serde_json::json!({"command": "echo secret-arg"}).as_object().cloned().unwrap_or_default();
    let call = ToolCall::new("call-1", "bash__exec", args);
    let message = Message::new(
        MessageData::Assistant { content: Some("thinking".to_owned()), tool_calls: vec![call] },
        MessageSource::Assistant { step_id: "step".to_owned() },
    );
    Arc::new(CallScope {
        agent_name: Arc::from("coordinator"),
        instance_key: Arc::from("default"),
        turn_id: Arc::from("turn"),
        step_id: Arc::from("step"),
        step_index: 0,
        message: Arc::new(message),
        workdir: Arc::from(std::path::Path::new("/tmp")),
        trace_id: Arc::from(TRACE),
        step_span_id: Arc::from("0000000000000002"),
        runtime: None,
        tasks: None,
    })
}

/// A turn: started, one step with a model call and a failed tool call, completed.
fn emit_turn(sink: &dyn EventSink) {
    let event = |kind, span_id, parent_span_id, timestamp_ms, extra| RuntimeEvent {
        kind,
        trace_id: TRACE,
        span_id,
        parent_span_id,
        timestamp_ms,
        agent_name: "coordinator",
        instance_key: "default",
        turn_id: "turn",
        step_id: None,
        tool: None,
        extra,
        call_scope: None,
    };
    let link =
        serde_json::json!({"link": {"traceId": "fedcba9876543210fedcba9876543210", "spanId": "1111111111111111"}});
    sink.emit(&event(EventKind::TurnStarted, 1, Some("00000000000000aa"), 1000, Some(&link)));
    sink.emit(&event(EventKind::StepStarted, 2, Some("0000000000000001"), 1001, None));
    let scope = scope();
    let (id, name) = (Arc::from("call-1"), Arc::from("bash__exec"));
    let data = |status, code, duration| ToolEventData {
        tool_call_id: &id,
        tool_name: &name,
        status,
        error_code: code,
        duration,
        sandbox_refused: None,
    };
    sink.emit(&RuntimeEvent::tool(EventKind::ToolCalled, &scope, 3, 1010, data(None, None, None)));
    sink.emit(&RuntimeEvent::tool(
        EventKind::ToolFailed,
        &scope,
        3,
        1030,
        data(Some(ToolStatus::Error), Some("E_TOOL_TIMEOUT"), Some(Duration::from_millis(20))),
    ));
    let step = serde_json::json!({"stepIndex": 0, "toolCalls": 1, "model": {
        "provider": "openai", "name": "gpt-test", "started": 1002, "duration": 7.5,
        "inputTokens": 11, "outputTokens": 4, "finishReason": "tool_calls", "text": "model-output-text"}});
    sink.emit(&event(EventKind::StepCompleted, 2, Some("0000000000000001"), 1040, Some(&step)));
    let turn =
        serde_json::json!({"stepCount": 1, "tokenUsage": {"inputTokens": 11, "outputTokens": 4}, "end": "answered"});
    sink.emit(&event(EventKind::TurnCompleted, 1, Some("00000000000000aa"), 1050, Some(&turn)));
}

async fn spans_within(received: &Received, count: usize) -> Vec<Span> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let spans: Vec<Span> = received
            .lock()
            .map(|all| {
                all.iter()
                    .flat_map(|(_, r)| r.resource_spans.iter())
                    .flat_map(|rs| rs.scope_spans.iter())
                    .flat_map(|ss| ss.spans.iter().cloned())
                    .collect()
            })
            .unwrap_or_default();
        if spans.len() >= count || Instant::now() > deadline {
            return spans;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn attr(span: &Span, key: &str) -> Option<Value> {
    span.attributes.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()).and_then(|v| v.value.clone())
}

fn find<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no span {name}: {:?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_events_become_the_genai_span_tree() {
    let (base, received) = receiver().await;
    let Ok(exporter) = Exporter::start(config(&base, &[("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=t%201")])) else {
        panic!("start")
    };
    let sink = TelemetrySink::new(exporter.clone());
    emit_turn(&sink);
    let spans = spans_within(&received, 4).await;
    assert_eq!(spans.len(), 4, "{:?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>());

    let turn = find(&spans, "invoke_agent coordinator");
    let step = find(&spans, "step 0");
    let chat = find(&spans, "chat gpt-test");
    let tool = find(&spans, "execute_tool bash__exec");
    let id = |hex: u64| hex.to_be_bytes().to_vec();
    assert_eq!(turn.span_id, id(1));
    assert_eq!(turn.parent_span_id, id(0xaa), "a turn continues its caller's span");
    assert_eq!(turn.links.len(), 1, "a task's completion turn links to the call that started it");
    assert_eq!(turn.links[0].span_id, id(0x1111_1111_1111_1111));
    assert_eq!(step.parent_span_id, id(1));
    assert_eq!(chat.parent_span_id, id(2));
    assert_eq!(tool.parent_span_id, id(2));
    assert!(spans.iter().all(|s| s.trace_id == turn.trace_id));
    assert_eq!(attr(turn, "gen_ai.operation.name"), Some(Value::StringValue("invoke_agent".into())));
    assert_eq!(attr(turn, "gen_ai.agent.name"), Some(Value::StringValue("coordinator".into())));
    assert_eq!(attr(turn, "gen_ai.usage.input_tokens"), Some(Value::IntValue(11)));
    assert_eq!(attr(chat, "gen_ai.operation.name"), Some(Value::StringValue("chat".into())));
    assert_eq!(attr(chat, "gen_ai.provider.name"), Some(Value::StringValue("openai".into())));
    assert_eq!(attr(chat, "gen_ai.request.model"), Some(Value::StringValue("gpt-test".into())));
    assert_eq!(attr(chat, "gen_ai.usage.output_tokens"), Some(Value::IntValue(4)));
    let Some(Value::ArrayValue(reasons)) = attr(chat, "gen_ai.response.finish_reasons") else { panic!("reasons") };
    assert_eq!(reasons.values.len(), 1);
    assert_eq!(chat.kind, 3, "client");
    assert_eq!(chat.end_time_unix_nano - chat.start_time_unix_nano, 7_500_000);
    assert_eq!(attr(tool, "gen_ai.tool.name"), Some(Value::StringValue("bash__exec".into())));
    assert_eq!(attr(tool, "gen_ai.tool.call.id"), Some(Value::StringValue("call-1".into())));
    assert_eq!(attr(tool, "error.type"), Some(Value::StringValue("E_TOOL_TIMEOUT".into())));
    assert_eq!(tool.status.as_ref().map(|s| s.code), Some(2));
    assert_eq!(tool.end_time_unix_nano - tool.start_time_unix_nano, 20_000_000);

    // No content by default.
    let dump = format!("{spans:?}");
    assert!(!dump.contains("secret-arg") && !dump.contains("model-output-text"), "{dump}");
    // Resource and headers.
    let Ok(all) = received.lock() else { panic!() };
    let (headers, request) = &all[0];
    assert!(headers.iter().any(|(k, v)| k == "x-tenant" && v == "t 1"), "{headers:?}");
    assert!(headers.iter().any(|(k, v)| k == "content-type" && v == "application/x-protobuf"));
    let resource = request.resource_spans[0].resource.as_ref().map(|r| r.attributes.clone()).unwrap_or_default();
    assert!(resource.iter().any(|kv| kv.key == "service.name"));
    drop(all);
    assert!(exporter.shutdown(Duration::from_secs(5)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_is_exported_only_when_asked() {
    let (base, received) = receiver().await;
    let config = config(&base, &[("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")]);
    let Ok(exporter) = Exporter::start(config) else { panic!("start") };
    emit_turn(&TelemetrySink::new(exporter.clone()));
    assert!(exporter.flush(Duration::from_secs(5)));
    let spans = spans_within(&received, 4).await;
    let tool = find(&spans, "execute_tool bash__exec");
    let Some(Value::StringValue(arguments)) = attr(tool, "gen_ai.tool.call.arguments") else { panic!("arguments") };
    assert!(arguments.contains("secret-arg"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_loses_spans_and_never_holds_the_producer() {
    // A port nothing listens on.
    let Ok(listener) = std::net::TcpListener::bind("127.0.0.1:0") else { panic!() };
    let Ok(address) = listener.local_addr() else { panic!() };
    drop(listener);
    let Ok(exporter) = Exporter::start(config(&format!("http://{address}"), &[("OTEL_BSP_MAX_QUEUE_SIZE", "16")]))
    else {
        panic!("start")
    };
    let sink = TelemetrySink::new(exporter.clone());
    let started = Instant::now();
    for _ in 0..2_000 {
        emit_turn(&sink);
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "emitting 12,000 events took {took:?}");
    let stats = exporter.stats();
    assert!(stats.dropped.load(std::sync::atomic::Ordering::Relaxed) > 0, "a full queue drops");
    // Flushing is bounded by its limit even with nobody answering.
    let started = Instant::now();
    let _ = exporter.flush(Duration::from_secs(3));
    assert!(started.elapsed() < Duration::from_secs(4));
    assert_eq!(stats.exported.load(std::sync::atomic::Ordering::Relaxed), 0);
}
