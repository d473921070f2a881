//! `ExportTraceServiceRequest` in protobuf's wire format, written directly.
//!
//! OTLP/HTTP's body is one `opentelemetry.proto.collector.trace.v1.
//! ExportTraceServiceRequest`. The handful of messages a span needs
//! (resource, scope, span, key-value, any-value, status, link) are written
//! here field by field — varints, fixed64s and length-delimited fields —
//! instead of through the SDK or generated prost types: it adds no crate to
//! the build, and the tests decode every request with the official
//! definitions (`opentelemetry-proto`), so a wrong tag or wire type fails
//! there. Field numbers are those of opentelemetry-proto v1 (trace.proto,
//! common.proto, resource.proto, trace_service.proto).

use crate::span::{AttrValue, SpanRecord, SpanStatus};

/// The instrumentation scope's name.
pub const SCOPE_NAME: &str = "goondan";

/// Encodes one request carrying `spans` under one resource.
pub fn encode_request(resource: &[(String, String)], spans: &[SpanRecord]) -> Vec<u8> {
    let mut resource_spans = Vec::with_capacity(256 + spans.len() * 256);
    // ResourceSpans.resource = 1: Resource { attributes = 1 }
    let mut resource_msg = Vec::new();
    for (key, value) in resource {
        message(&mut resource_msg, 1, |out| key_value(out, key, &AttrValue::Str(value.clone())));
    }
    bytes_field(&mut resource_spans, 1, &resource_msg);
    // ResourceSpans.scope_spans = 2: ScopeSpans { scope = 1, spans = 2 }
    message(&mut resource_spans, 2, |scope_spans| {
        message(scope_spans, 1, |scope| {
            string_field(scope, 1, SCOPE_NAME);
            string_field(scope, 2, env!("CARGO_PKG_VERSION"));
        });
        for span in spans {
            message(scope_spans, 2, |out| encode_span(out, span));
        }
    });
    let mut request = Vec::with_capacity(resource_spans.len() + 8);
    // ExportTraceServiceRequest.resource_spans = 1
    bytes_field(&mut request, 1, &resource_spans);
    request
}

fn encode_span(out: &mut Vec<u8>, span: &SpanRecord) {
    bytes_field(out, 1, &span.trace_id);
    bytes_field(out, 2, &span.span_id.to_be_bytes());
    if span.parent_span_id != 0 {
        bytes_field(out, 4, &span.parent_span_id.to_be_bytes());
    }
    string_field(out, 5, &span.name);
    varint_field(out, 6, span.kind.code());
    fixed64_field(out, 7, span.start_ns);
    fixed64_field(out, 8, span.end_ns.max(span.start_ns));
    for (key, value) in &span.attributes {
        message(out, 9, |kv| key_value(kv, key, value));
    }
    for link in &span.links {
        // Span.links = 13: Link { trace_id = 1, span_id = 2 }
        message(out, 13, |l| {
            bytes_field(l, 1, &link.trace_id);
            bytes_field(l, 2, &link.span_id.to_be_bytes());
        });
    }
    if let SpanStatus::Error(description) = &span.status {
        // Span.status = 15: Status { message = 2, code = 3 (ERROR = 2) }
        message(out, 15, |status| {
            string_field(status, 2, description);
            varint_field(status, 3, 2);
        });
    }
}

/// KeyValue { key = 1, value = 2: AnyValue }.
fn key_value(out: &mut Vec<u8>, key: &str, value: &AttrValue) {
    string_field(out, 1, key);
    message(out, 2, |any| any_value(any, value));
}

/// AnyValue { string_value = 1, bool_value = 2, int_value = 3,
/// double_value = 4, array_value = 5: ArrayValue { values = 1 } }.
fn any_value(out: &mut Vec<u8>, value: &AttrValue) {
    match value {
        AttrValue::Str(text) => {
            // Always written, even empty: the field is a oneof member.
            key(out, 1, LEN);
            varint(out, text.len() as u64);
            out.extend_from_slice(text.as_bytes());
        }
        AttrValue::Bool(flag) => {
            key(out, 2, VARINT);
            varint(out, u64::from(*flag));
        }
        AttrValue::Int(number) => {
            key(out, 3, VARINT);
            // int64: two's complement as a 64-bit varint.
            varint(out, *number as u64);
        }
        AttrValue::Double(number) => {
            key(out, 4, I64);
            out.extend_from_slice(&number.to_le_bytes());
        }
        AttrValue::StrList(items) => message(out, 5, |array| {
            for item in items {
                message(array, 1, |any| any_value(any, &AttrValue::Str(item.clone())));
            }
        }),
    }
}

const VARINT: u64 = 0;
const I64: u64 = 1;
const LEN: u64 = 2;

fn key(out: &mut Vec<u8>, field: u64, wire_type: u64) {
    varint(out, (field << 3) | wire_type);
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn varint_field(out: &mut Vec<u8>, field: u64, value: u64) {
    if value != 0 {
        key(out, field, VARINT);
        varint(out, value);
    }
}

fn fixed64_field(out: &mut Vec<u8>, field: u64, value: u64) {
    if value != 0 {
        key(out, field, I64);
        out.extend_from_slice(&value.to_le_bytes());
    }
}

fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    if !bytes.is_empty() {
        key(out, field, LEN);
        varint(out, bytes.len() as u64);
        out.extend_from_slice(bytes);
    }
}

fn string_field(out: &mut Vec<u8>, field: u64, text: &str) {
    bytes_field(out, field, text.as_bytes());
}

/// A nested message: written into a scratch buffer, then length-prefixed.
fn message(out: &mut Vec<u8>, field: u64, write: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    write(&mut inner);
    key(out, field, LEN);
    varint(out, inner.len() as u64);
    out.extend_from_slice(&inner);
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use prost::Message as _;

    use super::*;
    use crate::span::{SpanKind, SpanLink};

    fn span() -> SpanRecord {
        SpanRecord {
            trace_id: [0x4b; 16],
            span_id: 0x00f0_67aa_0ba9_02b7,
            parent_span_id: 7,
            name: "execute_tool bash__exec".to_owned(),
            kind: SpanKind::Internal,
            start_ns: 1_700_000_000_000_000_000,
            end_ns: 1_700_000_000_500_000_000,
            attributes: vec![
                ("gen_ai.operation.name", AttrValue::from("execute_tool")),
                ("gen_ai.usage.input_tokens", AttrValue::Int(-3)),
                ("goondan.duration", AttrValue::Double(1.5)),
                ("goondan.flag", AttrValue::Bool(true)),
                ("gen_ai.response.finish_reasons", AttrValue::StrList(vec!["stop".into(), "".into()])),
                ("empty", AttrValue::from("")),
            ],
            status: SpanStatus::Error("E_TOOL_TIMEOUT".to_owned()),
            links: vec![SpanLink { trace_id: [1; 16], span_id: 9 }],
        }
    }

    #[test]
    fn the_official_definitions_decode_what_is_encoded() {
        let bytes = encode_request(&[("service.name".to_owned(), "gdn".to_owned())], &[span(), span()]);
        let request = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(request.resource_spans.len(), 1);
        let rs = &request.resource_spans[0];
        let Some(resource) = &rs.resource else { panic!("resource") };
        assert_eq!(resource.attributes[0].key, "service.name");
        let scope = &rs.scope_spans[0];
        assert_eq!(scope.scope.as_ref().map(|s| s.name.as_str()), Some("goondan"));
        assert_eq!(scope.spans.len(), 2);
        let s = &scope.spans[0];
        assert_eq!(s.trace_id, vec![0x4b; 16]);
        assert_eq!(s.span_id, 0x00f0_67aa_0ba9_02b7_u64.to_be_bytes().to_vec());
        assert_eq!(s.parent_span_id, 7_u64.to_be_bytes().to_vec());
        assert_eq!(s.name, "execute_tool bash__exec");
        assert_eq!(s.kind, 1);
        assert_eq!(s.start_time_unix_nano, 1_700_000_000_000_000_000);
        assert_eq!(s.end_time_unix_nano, 1_700_000_000_500_000_000);
        let value = |i: usize| s.attributes[i].value.as_ref().and_then(|v| v.value.clone());
        assert_eq!(value(0), Some(Value::StringValue("execute_tool".into())));
        assert_eq!(value(1), Some(Value::IntValue(-3)));
        assert_eq!(value(2), Some(Value::DoubleValue(1.5)));
        assert_eq!(value(3), Some(Value::BoolValue(true)));
        let Some(Value::ArrayValue(list)) = value(4) else { panic!("array") };
        assert_eq!(list.values.len(), 2);
        assert_eq!(value(5), Some(Value::StringValue(String::new())));
        let Some(status) = &s.status else { panic!("status") };
        assert_eq!((status.code, status.message.as_str()), (2, "E_TOOL_TIMEOUT"));
        assert_eq!(s.links[0].span_id, 9_u64.to_be_bytes().to_vec());
    }

    #[test]
    fn a_root_span_has_no_parent() {
        let mut root = span();
        root.parent_span_id = 0;
        root.status = SpanStatus::Unset;
        let bytes = encode_request(&[], &[root]);
        let request = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap_or_else(|e| panic!("{e}"));
        let s = &request.resource_spans[0].scope_spans[0].spans[0];
        assert!(s.parent_span_id.is_empty());
        assert!(s.status.is_none());
    }
}
