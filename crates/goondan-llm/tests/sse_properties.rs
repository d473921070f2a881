//! The SSE parser over random input: never panics, and how a stream is cut
//! into chunks never changes the events it yields.

use goondan_llm::http::{SseEvent, SseParser};
use proptest::prelude::*;

fn parse_in_chunks(bytes: &[u8], cuts: &[usize]) -> Vec<SseEvent> {
    let mut parser = SseParser::new();
    let mut events = Vec::new();
    let mut start = 0;
    for cut in cuts {
        let end = (*cut).min(bytes.len()).max(start);
        events.extend(parser.feed(&bytes[start..end]).unwrap_or_else(|e| panic!("{e}")));
        start = end;
    }
    events.extend(parser.feed(&bytes[start..]).unwrap_or_else(|e| panic!("{e}")));
    events.extend(parser.finish().unwrap_or_else(|e| panic!("{e}")));
    events
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_in_chunks(&bytes, &[]);
    }

    #[test]
    fn chunking_does_not_change_the_events(
        lines in proptest::collection::vec("(event: [a-z_]{1,8}|data: [ -~]{0,20}|: comment|id: 1|)", 0..30),
        crlf in any::<bool>(),
        mut cuts in proptest::collection::vec(0usize..600, 0..8),
    ) {
        let newline = if crlf { "\r\n" } else { "\n" };
        let text = lines.join(newline) + newline;
        cuts.sort_unstable();
        let whole = parse_in_chunks(text.as_bytes(), &[]);
        let pieces = parse_in_chunks(text.as_bytes(), &cuts);
        prop_assert_eq!(whole, pieces);
    }
}

/// Parses `bytes` cut at `cuts` with a `limit`, stopping at the first refusal.
fn parse_limited(bytes: &[u8], cuts: &[usize], limit: usize) -> Result<Vec<SseEvent>, goondan_llm::http::SseError> {
    let mut parser = SseParser::with_limit(limit);
    let mut events = Vec::new();
    let mut start = 0;
    for cut in cuts {
        let end = (*cut).min(bytes.len()).max(start);
        events.extend(parser.feed(&bytes[start..end])?);
        start = end;
    }
    events.extend(parser.feed(&bytes[start..])?);
    events.extend(parser.finish()?);
    Ok(events)
}

proptest! {
    /// With a limit, how the stream is cut changes neither the events nor
    /// whether (and that) the stream is refused.
    #[test]
    fn the_limit_does_not_depend_on_chunking(
        lines in proptest::collection::vec("(data: [a-z]{0,30}|event: x|)", 0..20),
        limit in 4usize..48,
        mut cuts in proptest::collection::vec(0usize..600, 0..8),
    ) {
        let text = lines.join("\n") + "\n";
        cuts.sort_unstable();
        prop_assert_eq!(parse_limited(text.as_bytes(), &[], limit), parse_limited(text.as_bytes(), &cuts, limit));
    }
}
