//! The background exporter: a bounded buffer, a thread of its own that
//! turns events into spans, batches them and POSTs them to the collector.
//!
//! The buffer never makes its producer wait: an item is pushed under a
//! short, uncontended lock (no system call) and dropped, and counted, when
//! the buffer is full. The thread is not woken per item — a wake-up per
//! event would cost a turn a context switch per event — but drains the
//! buffer every [`TICK`] (and at once for a flush). It runs its own
//! single-threaded Tokio runtime for the HTTP client, so exporting takes
//! nothing from the agent's runtime; a slow or absent collector delays
//! only this thread.

use goondan_core::sync::LockUnpoisoned;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use goondan_core::tls::SystemProxy;

use crate::config::TelemetryConfig;
use crate::otlp;
use crate::sink::{Assembler, EventRecord};
use crate::span::SpanRecord;

/// How often the thread drains the buffer.
pub const TICK: Duration = Duration::from_millis(100);

/// What the buffer carries.
pub(crate) enum Item {
    /// A runtime event, paired into spans on the thread.
    Event(Box<EventRecord>),
    /// A span made whole by its producer (the hub's connector spans).
    Span(Box<SpanRecord>),
    /// Export everything queued so far, then answer.
    Flush(std::sync::mpsc::Sender<()>),
}

/// Counters of what the exporter did.
#[derive(Debug, Default)]
pub struct ExporterStats {
    /// Spans a collector accepted (2xx).
    pub exported: AtomicU64,
    /// Events and spans lost: the buffer was full, or the collector failed
    /// or refused them.
    pub dropped: AtomicU64,
    /// Requests that failed.
    pub failed_requests: AtomicU64,
}

/// What the handles and the thread share.
struct Shared {
    items: Mutex<Vec<Item>>,
    /// Every handle is gone: send what is left and end.
    closed: AtomicBool,
}

/// The last handle's drop closes the buffer and wakes the thread.
struct Closer {
    shared: Arc<Shared>,
    thread: std::thread::Thread,
}

impl Drop for Closer {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.thread.unpark();
    }
}

/// The handle of the export thread. Cloning shares it; the thread ends
/// (after sending what it holds) when every handle is dropped.
#[derive(Clone)]
pub struct Exporter {
    closer: Arc<Closer>,
    stats: Arc<ExporterStats>,
    config: Arc<TelemetryConfig>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter").field("endpoint", &self.config.endpoint).finish_non_exhaustive()
    }
}

impl Exporter {
    /// Starts the thread. Fails only if a thread or the HTTP client cannot
    /// be made.
    pub fn start(config: TelemetryConfig) -> std::io::Result<Self> {
        let config = Arc::new(config);
        let shared = Arc::new(Shared { items: Mutex::new(Vec::new()), closed: AtomicBool::new(false) });
        let stats = Arc::new(ExporterStats::default());
        let client = http_client(&config).map_err(std::io::Error::other)?;
        let thread = std::thread::Builder::new().name("otlp-export".to_owned()).spawn({
            let (config, stats, shared) = (Arc::clone(&config), Arc::clone(&stats), Arc::clone(&shared));
            move || run(&config, &client, &shared, &stats)
        })?;
        let closer = Arc::new(Closer { shared, thread: thread.thread().clone() });
        Ok(Self { closer, stats, config })
    }

    /// The configuration it exports with.
    pub fn config(&self) -> &TelemetryConfig {
        &self.config
    }

    /// What it did so far.
    pub fn stats(&self) -> &ExporterStats {
        &self.stats
    }

    /// Queues a finished span; dropped (and counted) when the buffer is full.
    pub fn export_span(&self, span: SpanRecord) {
        self.offer(Item::Span(Box::new(span)));
    }

    pub(crate) fn offer(&self, item: Item) {
        let mut items = self.closer.shared.items.lock_unpoisoned();
        if items.len() < self.config.max_queue {
            items.push(item);
        } else {
            drop(items);
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Sends everything queued so far, waiting at most `limit` (a process
    /// about to exit calls this; a collector that is down costs it `limit`
    /// at most). True when it was all handed to the collector in time.
    pub fn flush(&self, limit: Duration) -> bool {
        let (done, wait) = std::sync::mpsc::channel();
        // Past the bound too: a flush is never dropped.
        self.closer.shared.items.lock_unpoisoned().push(Item::Flush(done));
        self.closer.thread.unpark();
        wait.recv_timeout(limit).is_ok()
    }

    /// Flushes; the thread ends by itself once the last handle is gone
    /// (it is not joined: a sink may still hold a handle).
    pub fn shutdown(self, limit: Duration) -> bool {
        self.flush(limit)
    }
}

/// The collector's client: straight to it, no proxy, bounded by the export timeout.
fn http_client(config: &TelemetryConfig) -> Result<reqwest::Client, String> {
    goondan_core::tls::client_builder(SystemProxy::Ignored)
        .map_err(|e| e.to_string())?
        .timeout(config.timeout)
        .build()
        .map_err(|e| e.to_string())
}

fn run(config: &TelemetryConfig, client: &reqwest::Client, shared: &Shared, stats: &ExporterStats) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::warn!("OpenTelemetry export is off: no runtime for its thread: {error}");
            return;
        }
    };
    let mut resource = vec![("service.name".to_owned(), config.service_name.clone())];
    resource.extend(config.resource_attributes.iter().cloned());
    let mut sender = Sender { config, client, runtime: &runtime, resource, stats, warned: false };
    let mut assembler = Assembler::new(config.capture_content);
    let mut batch: Vec<SpanRecord> = Vec::new();
    let mut due: Option<Instant> = None;
    let mut taken: Vec<Item> = Vec::new();
    loop {
        let closed = shared.closed.load(Ordering::SeqCst);
        std::mem::swap(&mut taken, &mut *shared.items.lock_unpoisoned());
        for item in taken.drain(..) {
            match item {
                Item::Event(event) => assembler.push(*event, &mut batch),
                Item::Span(span) => batch.push(*span),
                Item::Flush(done) => {
                    sender.send_all(&mut batch);
                    due = None;
                    let _ = done.send(());
                }
            }
            if batch.len() >= config.max_batch {
                sender.send_all(&mut batch);
                due = None;
            }
        }
        if closed {
            sender.send_all(&mut batch);
            return;
        }
        if !batch.is_empty() {
            let at = *due.get_or_insert_with(|| Instant::now() + config.schedule_delay);
            if Instant::now() >= at {
                sender.send_all(&mut batch);
                due = None;
            }
        }
        std::thread::park_timeout(TICK);
    }
}

struct Sender<'a> {
    config: &'a TelemetryConfig,
    client: &'a reqwest::Client,
    runtime: &'a tokio::runtime::Runtime,
    resource: Vec<(String, String)>,
    stats: &'a ExporterStats,
    warned: bool,
}

impl Sender<'_> {
    fn send_all(&mut self, batch: &mut Vec<SpanRecord>) {
        while !batch.is_empty() {
            let take = batch.len().min(self.config.max_batch);
            let spans: Vec<SpanRecord> = batch.drain(..take).collect();
            self.send(&spans);
        }
    }

    fn send(&mut self, spans: &[SpanRecord]) {
        let body = otlp::encode_request(&self.resource, spans);
        let mut request = self
            .client
            .post(&self.config.endpoint)
            .header(reqwest::header::CONTENT_TYPE, "application/x-protobuf")
            .body(body);
        for (name, value) in &self.config.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let count = spans.len() as u64;
        let outcome = self.runtime.block_on(async { request.send().await });
        let problem = match outcome {
            Ok(response) if response.status().is_success() => {
                self.stats.exported.fetch_add(count, Ordering::Relaxed);
                return;
            }
            Ok(response) => format!("the collector answered {}", response.status()),
            Err(error) => format!("cannot reach the collector: {}", without_url(&error)),
        };
        self.stats.dropped.fetch_add(count, Ordering::Relaxed);
        self.stats.failed_requests.fetch_add(1, Ordering::Relaxed);
        // Said once at warn level; a collector that stays down is not a
        // log line per batch.
        if self.warned {
            tracing::debug!("OpenTelemetry: {count} span(s) lost: {problem}");
        } else {
            self.warned = true;
            tracing::warn!("OpenTelemetry: {count} span(s) lost ({}): {problem}", self.config.endpoint);
        }
    }
}

/// An error's text without the URL reqwest puts in it (the endpoint is
/// said once beside it; a URL may carry credentials in its query).
fn without_url(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    if let Some(url) = error.url() {
        text = text.replace(url.as_str(), "the endpoint");
    }
    let mut source = std::error::Error::source(error);
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}
