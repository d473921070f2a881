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
        events.extend(parser.feed(&bytes[start..end]));
        start = end;
    }
    events.extend(parser.feed(&bytes[start..]));
    events.extend(parser.finish());
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
