//! One fake model server: a real HTTP/1.1 server on 127.0.0.1 that answers
//! every request as the OpenAI Chat Completions API streams (one chunk per
//! delta, a chunk with the finish reason, with a reply's `usage` the last
//! chunk with no choices as `stream_options.include_usage` asks, then
//! `[DONE]`), and records each
//! request's headers and JSON body for the test to read back.
//!
//! What is deliberately absent: routing by path, keep-alive, and any model
//! logic beyond the test's own answer function; each connection carries one
//! request and is closed after its answer.

use goondan_core::sync::LockUnpoisoned;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde_json::{Value, json};

/// One request the server read.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// Its headers, (name, value), in order.
    pub headers: Vec<(String, String)>,
    /// Its body as JSON (`null` when it was none or not JSON).
    pub body: Value,
    /// The length of its body in bytes.
    pub length: usize,
}

impl Request {
    /// The first value of the header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }
}

/// What the server streams for one request.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The `delta` of each chunk.
    pub deltas: Vec<Value>,
    /// The last chunk's `finish_reason`.
    pub finish: String,
    /// The `usage` of a final chunk with no choices (none when `None`).
    pub usage: Option<Value>,
}

impl Reply {
    /// An assistant answer `text`, finished with `stop`.
    pub fn text(text: &str) -> Self {
        Self { deltas: vec![json!({"role": "assistant", "content": text})], finish: "stop".into(), usage: None }
    }

    /// Any deltas and finish reason.
    pub fn deltas(deltas: Vec<Value>, finish: &str) -> Self {
        Self { deltas, finish: finish.to_owned(), usage: None }
    }

    /// The same reply ending with a usage chunk: `prompt` and `completion`
    /// tokens, `cached` of the prompt and `reasoning` of the completion, in
    /// OpenAI's shape (`prompt_tokens_details`, `completion_tokens_details`).
    #[must_use]
    pub fn with_usage(mut self, prompt: u64, completion: u64, cached: u64, reasoning: u64) -> Self {
        self.usage = Some(json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": reasoning, "audio_tokens": 0,
                "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
        }));
        self
    }
}

type Answer = dyn Fn(&Request) -> Reply + Send + Sync;

/// The server; it stops serving when dropped.
pub struct FakeModel {
    address: SocketAddr,
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeModel {
    /// A server answering every request with `answer(request)`.
    pub fn start(answer: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let answer: Arc<Answer> = Arc::new(answer);
        let thread = {
            let requests = Arc::clone(&requests);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let request = read_request(&stream);
                    let reply = answer(&request);
                    requests.lock_unpoisoned().push(request);
                    write_stream(&stream, &reply);
                }
            })
        };
        Ok(Self { address, requests, stop, thread: Some(thread) })
    }

    /// A server answering `text` to every request.
    pub fn text(text: &str) -> std::io::Result<Self> {
        let reply = Reply::text(text);
        Self::start(move |_| reply.clone())
    }

    /// The base URL a Model's `endpoint` names: `http://127.0.0.1:PORT/v1`.
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.address)
    }

    /// Every request read so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock_unpoisoned().clone()
    }

    /// Every request read so far, taken out (the next call sees only later ones).
    pub fn take_requests(&self) -> Vec<Request> {
        std::mem::take(&mut *self.requests.lock_unpoisoned())
    }

    /// The values of header `name` over every request so far.
    pub fn headers(&self, name: &str) -> Vec<String> {
        self.requests().iter().filter_map(|request| request.header(name).map(str::to_owned)).collect()
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so that it sees the flag and ends.
        let _ = TcpStream::connect(self.address);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One HTTP/1.1 request read from `stream`: its headers and body.
pub fn read_http_request(stream: &TcpStream) -> (Vec<(String, String)>, Vec<u8>) {
    let (_, headers, body) = read_http_request_line(stream);
    (headers, body)
}

/// One HTTP/1.1 request read from `stream`: its request line (`POST /x
/// HTTP/1.1`, with its line end), headers and body.
pub fn read_http_request_line(stream: &TcpStream) -> (String, Vec<(String, String)>, Vec<u8>) {
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    let _ = reader.read_line(&mut request_line);
    let mut headers = Vec::new();
    let mut length = 0;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((key, value)) = header.trim_end().split_once(':') {
            if key.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
            headers.push((key.to_owned(), value.trim().to_owned()));
        }
    }
    let mut body = vec![0; length];
    let _ = reader.read_exact(&mut body);
    (request_line, headers, body)
}

fn read_request(stream: &TcpStream) -> Request {
    let (headers, body) = read_http_request(stream);
    Request { headers, body: serde_json::from_slice(&body).unwrap_or_default(), length: body.len() }
}

/// Answers on `stream` as the OpenAI Chat Completions API streams.
pub fn write_stream(stream: &TcpStream, reply: &Reply) {
    let chunk = |delta: &Value, finish: Option<&str>| {
        let mut choice = json!({"index": 0, "delta": delta});
        if let Some(finish) = finish {
            choice["finish_reason"] = Value::from(finish);
        }
        json!({"id": "c1", "object": "chat.completion.chunk", "choices": [choice]})
    };
    let mut payload = String::new();
    for delta in &reply.deltas {
        payload.push_str(&format!("data: {}\n\n", chunk(delta, None)));
    }
    payload.push_str(&format!("data: {}\n\n", chunk(&json!({}), Some(&reply.finish))));
    if let Some(usage) = &reply.usage {
        let last = json!({"id": "c1", "object": "chat.completion.chunk", "choices": [], "usage": usage});
        payload.push_str(&format!("data: {last}\n\n"));
    }
    payload.push_str("data: [DONE]\n\n");
    let mut stream = stream;
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{payload}",
        payload.len()
    );
}
