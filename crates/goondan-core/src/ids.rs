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
}
