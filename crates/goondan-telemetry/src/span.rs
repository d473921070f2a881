//! A finished span, as the exporter sends it.

/// What a span stands for, in OTLP's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// Work inside the process (`invoke_agent`, steps, tools).
    Internal,
    /// A request to another service (`chat`: the model provider).
    Client,
    /// Handling a request from outside (a connector's event).
    Server,
    /// Handling a message that wants no answer.
    Consumer,
}

impl SpanKind {
    /// The OTLP enum value.
    pub fn code(self) -> u64 {
        match self {
            Self::Internal => 1,
            Self::Server => 2,
            Self::Client => 3,
            Self::Consumer => 5,
        }
    }
}

/// How a span ended.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SpanStatus {
    /// Not said (the usual for success, per the specification).
    #[default]
    Unset,
    /// Failed, with a description.
    Error(String),
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
    /// A float.
    Double(f64),
    /// A boolean.
    Bool(bool),
    /// A list of strings.
    StrList(Vec<String>),
}

impl From<&str> for AttrValue {
    fn from(value: &str) -> Self {
        Self::Str(value.to_owned())
    }
}

impl From<String> for AttrValue {
    fn from(value: String) -> Self {
        Self::Str(value)
    }
}

impl From<i64> for AttrValue {
    fn from(value: i64) -> Self {
        Self::Int(value)
    }
}

/// A link to another span (a pending task's completion to its call).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanLink {
    /// The linked span's trace.
    pub trace_id: [u8; 16],
    /// The linked span.
    pub span_id: u64,
}

/// One ended span.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanRecord {
    /// Its trace.
    pub trace_id: [u8; 16],
    /// Its id (never zero).
    pub span_id: u64,
    /// Its parent; 0 for a root.
    pub parent_span_id: u64,
    /// Its name (`invoke_agent coordinator`, `chat gpt-5`, `execute_tool bash__exec`).
    pub name: String,
    /// Its kind.
    pub kind: SpanKind,
    /// Start, nanoseconds since the Unix epoch.
    pub start_ns: u64,
    /// End, nanoseconds since the Unix epoch.
    pub end_ns: u64,
    /// Attributes, in order.
    pub attributes: Vec<(&'static str, AttrValue)>,
    /// How it ended.
    pub status: SpanStatus,
    /// Links to other spans.
    pub links: Vec<SpanLink>,
}

impl SpanRecord {
    /// The value of attribute `key`, if set.
    pub fn attribute(&self, key: &str) -> Option<&AttrValue> {
        self.attributes.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

/// 32 hex digits into 16 bytes; `None` unless exactly that and not all zero.
pub fn parse_trace_id(hex: &str) -> Option<[u8; 16]> {
    let value = parse_hex_u128(hex, 32)?;
    (value != 0).then(|| value.to_be_bytes())
}

/// 16 hex digits into a span id; `None` unless exactly that and not zero.
pub fn parse_span_id(hex: &str) -> Option<u64> {
    let value = u64::try_from(parse_hex_u128(hex, 16)?).ok()?;
    (value != 0).then_some(value)
}

fn parse_hex_u128(hex: &str, digits: usize) -> Option<u128> {
    if hex.len() != digits || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u128::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_only_at_their_width() {
        assert_eq!(parse_span_id("00f067aa0ba902b7"), Some(0x00f0_67aa_0ba9_02b7));
        assert_eq!(parse_span_id("0000000000000000"), None);
        assert_eq!(parse_span_id("f067aa0ba902b7"), None);
        let Some(trace) = parse_trace_id("4bf92f3577b34da6a3ce929d0e0e4736") else { panic!() };
        assert_eq!(trace[0], 0x4b);
        assert_eq!(trace[15], 0x36);
        assert_eq!(parse_trace_id("zz"), None);
    }
}
