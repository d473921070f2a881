//! The SSE parser on the model transport's hot path: a streamed reply of
//! 2000 Chat Completions chunks (about 0.5 MiB), fed as the network hands
//! it over (16 KiB reads), with each line ending kind the format allows.
//!
//! Run with `cargo bench -p goondan-llm --bench sse` (see "Model streams"
//! in `docs/BENCHMARKS.md`).

use std::hint::black_box;

use goondan_llm::http::SseParser;

fn main() {
    divan::main();
}

/// A Chat Completions stream whose lines end with `eol`.
fn stream(eol: &str) -> Vec<u8> {
    let mut text = String::new();
    for i in 0..2000 {
        text.push_str(&format!(
            r#"data: {{"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4.1-mini-2025-04-14","choices":[{{"index":0,"delta":{{"content":"token {i} "}},"logprobs":null,"finish_reason":null}}]}}"#
        ));
        text.push_str(eol);
        text.push_str(eol);
    }
    text.push_str("data: [DONE]");
    text.push_str(eol);
    text.push_str(eol);
    text.into_bytes()
}

fn parse(bytes: &[u8]) -> usize {
    let mut parser = SseParser::new();
    let mut events = 0;
    for chunk in bytes.chunks(16 * 1024) {
        events += parser.feed(chunk).map(|events| events.len()).unwrap_or(0);
    }
    events
}

#[divan::bench(args = ["lf", "crlf", "cr"])]
fn chat_stream_2000_chunks(bencher: divan::Bencher, eol: &str) {
    let bytes = stream(match eol {
        "crlf" => "\r\n",
        "cr" => "\r",
        _ => "\n",
    });
    bencher.counter(divan::counter::BytesCount::new(bytes.len())).bench(|| parse(black_box(&bytes)));
}
