//! Identifiers: turn, step, tool-call and message ids, and trace/span ids.

use std::sync::atomic::{AtomicU64, Ordering};

/// A new random UUID (v4) as a string, for ids that must be unique across processes.
pub fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A new time-ordered UUID (v7), for ids that are nicer to sort (turns, messages).
pub fn new_ordered_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// A new 32-hex-digit trace id (W3C trace-context width).
pub fn new_trace_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Generates 16-hex-digit span ids cheaply.
///
/// Span ids are made on the hot path of every tool call, so this avoids the
/// operating system's random source: it seeds once from a UUID and then walks a
/// SplitMix64 sequence, which gives well-spread, non-repeating 64-bit values.
#[derive(Debug)]
pub struct SpanIdGenerator {
    state: AtomicU64,
}

impl Default for SpanIdGenerator {
    fn default() -> Self {
        Self::new()
    }
}

impl SpanIdGenerator {
    /// A generator seeded from a fresh random UUID.
    pub fn new() -> Self {
        let seed = uuid::Uuid::new_v4().as_u64_pair().0;
        Self { state: AtomicU64::new(seed) }
    }

    /// The next span id as a raw number (never zero, which W3C reserves).
    pub fn next_raw(&self) -> u64 {
        loop {
            let mut z =
                self.state.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed).wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            if z != 0 {
                return z;
            }
        }
    }

    /// The next span id as 16 lowercase hex digits.
    pub fn next_hex(&self) -> String {
        format_span_id(self.next_raw())
    }
}

/// Formats a raw span id as 16 lowercase hex digits.
pub fn format_span_id(raw: u64) -> String {
    format!("{raw:016x}")
}

// W3C Trace Context: the `traceparent` that carries a trace across
// processes (agent to agent over IPC, into the JavaScript host, out to MCP
// servers in `params._meta.traceparent`).

/// A parsed `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent<'a> {
    /// The trace (32 lowercase hex digits).
    pub trace_id: &'a str,
    /// The parent span (16 lowercase hex digits).
    pub span_id: &'a str,
    /// The trace flags (`01`: sampled).
    pub sampled: bool,
}

/// `00-<trace>-<span>-01`. Every trace of the runtime is recorded (its
/// event log has every span), so the sampled flag is always set.
pub fn format_traceparent(trace_id: &str, span_id: u64) -> String {
    format!("00-{trace_id}-{span_id:016x}-01")
}

/// Reads a version-00 `traceparent` (and, as the specification asks, the
/// first four fields of a later version); `None` for anything malformed or
/// an all-zero id.
pub fn parse_traceparent(text: &str) -> Option<TraceParent<'_>> {
    let text = text.trim();
    let mut parts = text.split('-');
    let (version, trace_id, span_id, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let rest = parts.next();
    let lower_hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !lower_hex(version, 2) || version == "ff" || (version == "00" && rest.is_some()) {
        return None;
    }
    if !lower_hex(trace_id, 32) || !lower_hex(span_id, 16) || !lower_hex(flags, 2) {
        return None;
    }
    if trace_id.bytes().all(|b| b == b'0') || span_id.bytes().all(|b| b == b'0') {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some(TraceParent { trace_id, span_id, sampled: flags & 1 == 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_ids_are_16_hex_digits_and_distinct() {
        let generator = SpanIdGenerator::new();
        let a = generator.next_hex();
        let b = generator.next_hex();
        assert_eq!(a.len(), 16);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }

    #[test]
    fn trace_ids_are_32_hex_digits() {
        let id = new_trace_id();
        assert_eq!(id.len(), 32);
        assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn a_traceparent_round_trips() {
        let text = format_traceparent("4bf92f3577b34da6a3ce929d0e0e4736", 0x00f0_67aa_0ba9_02b7);
        assert_eq!(text, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let Some(parsed) = parse_traceparent(&text) else { panic!() };
        assert_eq!(parsed.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parsed.span_id, "00f067aa0ba902b7");
        assert!(parsed.sampled);
    }

    #[test]
    fn malformed_ones_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
        assert!(parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-x").is_some());
    }
}
