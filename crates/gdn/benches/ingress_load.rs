//! Ingress load benchmark (issue 21, item 6): the `slack` connector of a
//! released `gdn run`, driven over real HTTP by an open-loop generator.
//!
//! Run with `cargo bench -p gdn --bench ingress_load` (options after `--`:
//! `--rates 200,1000,2000,5000`, `--secs 5`, `--channels 16`,
//! `--max 5000,7000,10000` for the max-rate search, `--kill-rate 1000`,
//! `--no-kill`, `--gdn PATH` for another binary, `--dir DIR` for the
//! state roots). Every phase is a fresh `gdn` on a fresh state root:
//!
//! - the bundle: one Agent with a `scripted` model (one text reply, no
//!   model time), one Connection of `@goondan/base` `slack` with a signing
//!   secret (`valueFrom.env`), routed by `channel_id` so that the events of
//!   one Slack channel are one agent instance (`--channels` of them, events
//!   round-robin over them);
//! - the generator: requests signed exactly as Slack signs them (`v0:`
//!   HMAC-SHA256 of `v0:{timestamp}:{body}`, hex, with
//!   `X-Slack-Request-Timestamp`), sent on a fixed schedule (request `i`
//!   at `t0 + i / rate`) whatever the responses, each on an idle
//!   keep-alive connection or a new one (up to 4,096 connections); its
//!   latency counts from the scheduled time, so a slow server cannot hide
//!   queueing (no coordinated omission). The generator is one thread; its
//!   own CPU time (`getrusage(RUSAGE_THREAD)`) is reported beside the load
//!   window so that it is shown not to be the bottleneck;
//! - the journal: the inbox (`<state>/workspaces/<id>/ingress/inbox.jsonl`)
//!   is tailed by a thread while `gdn` runs (the inbox rewrites itself when
//!   dead records pile up; the tail reads an old file to its end before it
//!   follows the new one), for turns started (the first `start` of each
//!   event) and turns done (`done` records);
//! - the check: after the load, the phase waits for every acknowledged
//!   event's turn (or 60 s without progress), stops `gdn` with SIGTERM, and
//!   counts, for every event that got a 2xx, its `done` records and the
//!   lines of the agents' conversations (`instances/*/messages.jsonl`) that
//!   carry its text (each conversation folded as the runtime folds it):
//!   lost = none, doubled = more than one.
//!
//! The kill phase sends at `--kill-rate` and `kill -9`s `gdn` twice in the
//! middle, starting it again on the same state root at once; requests that
//! fail while it is down are not acknowledged (Slack would retry them), and
//! at the end every event the generator sent is sent again as a Slack retry
//! (`X-Slack-Retry-Num: 1`): a retry of an acknowledged event must run no
//! second turn, and a retry of an unacknowledged one runs its turn once.
//!
//! The machine's floors are printed too: a line through `cat` over pipes and
//! back, an HTTP/1.1 request over loopback TCP to a minimal server in this
//! process, and an `fdatasync` of a small append on the state roots' file
//! system (the inbox syncs before every acknowledgement).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead as _, BufReader, Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use goondan_test_support::{Agent, Bundle, reply_text};
use hmac::{Hmac, KeyInit as _, Mac as _};
use http_body_util::BodyExt as _;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use nix::sys::resource::{UsageWho, getrusage};
use sha2::Sha256;

/// Not a real secret: the bench's own signing secret.
const SIGNING_SECRET: &str = "bench-signing-secret-0123456789abcdef";
const MAX_CONNECTIONS: usize = 4096;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECTION: &str = "slack-main";

fn out(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(line.as_bytes());
    let _ = stdout.write_all(b"\n");
    let _ = stdout.flush();
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// The `q` quantile (nearest rank) of sorted `samples`.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[derive(Debug, Clone)]
struct Options {
    gdn: PathBuf,
    dir: PathBuf,
    rates: Vec<u32>,
    max_rates: Vec<u32>,
    secs: f64,
    channels: usize,
    kill_rate: Option<u32>,
    /// The original's `packages/base/src/connectors/slack.ts`, run under Bun.
    original: Option<PathBuf>,
    bun: PathBuf,
}

fn parse_rates(text: &str) -> Vec<u32> {
    text.split(',').filter_map(|r| r.trim().parse().ok()).filter(|r| *r > 0).collect()
}

fn options() -> Options {
    let mut options = Options {
        gdn: std::env::var_os("GDN_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_gdn")), PathBuf::from),
        dir: std::env::temp_dir(),
        rates: vec![200, 1000, 2000, 5000],
        max_rates: vec![5000, 7000, 10000],
        secs: 5.0,
        channels: 16,
        kill_rate: Some(1000),
        original: std::env::var_os("ORIGINAL_SLACK_TS").map(PathBuf::from),
        bun: PathBuf::from("bun"),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut index = 0;
    while index < args.len() {
        let value = args.get(index + 1).cloned().unwrap_or_default();
        match args[index].as_str() {
            "--rates" => options.rates = parse_rates(&value),
            "--max" => options.max_rates = parse_rates(&value),
            "--secs" => options.secs = value.parse().unwrap_or(options.secs),
            "--channels" => options.channels = value.parse().unwrap_or(options.channels).max(1),
            "--kill-rate" => options.kill_rate = value.parse().ok(),
            "--gdn" => options.gdn = PathBuf::from(value),
            "--dir" => options.dir = PathBuf::from(value),
            "--original" => options.original = Some(PathBuf::from(value)),
            "--bun" => options.bun = PathBuf::from(value),
            "--no-kill" => {
                options.kill_rate = None;
                index += 1;
                continue;
            }
            // `cargo bench` passes `--bench`.
            _ => {
                index += 1;
                continue;
            }
        }
        index += 2;
    }
    options
}

fn main() {
    let options = options();
    out(&format!(
        "ingress load bench: gdn {}; state roots under {} ({}); {} channels (instances); {} s per phase",
        options.gdn.display(),
        options.dir.display(),
        fs_type(&options.dir),
        options.channels,
        options.secs
    ));
    let floors = Floors::measure(&options.dir);
    floors.print("before");
    let mut results = Vec::new();
    let mut all_rates = options.rates.clone();
    all_rates.extend(options.max_rates.iter().filter(|r| !options.rates.contains(r)));
    for &rate in &all_rates {
        results.push(run_phase(&options, &format!("r{rate}"), rate, options.secs, &[]));
        if let Some(original) = &options.original {
            results.push(run_original_phase(&options, original, &format!("o{rate}"), rate, options.secs));
        }
    }
    if let Some(rate) = options.kill_rate {
        let secs = options.secs.max(6.0);
        let kills = [Duration::from_secs_f64(secs / 3.0), Duration::from_secs_f64(secs * 2.0 / 3.0)];
        results.push(run_phase(&options, &format!("k{rate}"), rate, secs, &kills));
    }
    out("");
    out(
        "| phase | offered ev/s | sent | 2xx | errors | accepted ev/s | accept p50 ms | p99 ms | max ms | generator CPU % | gdn tree CPU % | turns started/s | drained | lost | doubled |",
    );
    out("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|");
    for result in &results {
        out(&result.row());
    }
    let sustained = results
        .iter()
        .filter(|r| {
            r.kills == 0
                && !r.original
                && r.p99_ms < 1000.0
                && r.errors == 0
                && r.accepted_rate >= 0.95 * f64::from(r.rate)
        })
        .map(|r| r.rate)
        .max();
    out(&format!(
        "max offered rate sustained (every request 2xx, accepted >= 95% of offered, p99 < 1 s): {}",
        sustained.map_or_else(|| "none".to_owned(), |r| format!("{r} ev/s"))
    ));
    Floors::measure(&options.dir).print("after");
}

fn fs_type(dir: &Path) -> String {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let _device = fields.next()?;
            let mount = fields.next()?;
            let kind = fields.next()?;
            dir.starts_with(mount).then(|| (mount.len(), format!("{kind} at {mount}")))
        })
        .max()
        .map_or_else(|| "unknown file system".to_owned(), |(_, text)| text)
}

// ---------------------------------------------------------------- floors

struct Floors {
    pipe_us: f64,
    http_us: f64,
    fsync_us: f64,
}

impl Floors {
    fn measure(dir: &Path) -> Self {
        Self { pipe_us: pipe_round_trip(1000), http_us: loopback_http(1000), fsync_us: fsync_append(dir, 200) }
    }

    fn print(&self, when: &str) {
        out(&format!(
            "floors ({when}), medians: pipe round trip through `cat` {:.1} µs; loopback HTTP/1.1 request {:.1} µs; append + fdatasync {:.1} µs",
            self.pipe_us, self.http_us, self.fsync_us
        ));
    }
}

fn median_us(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    quantile(&samples, 0.5) * 1e6
}

fn pipe_round_trip(n: usize) -> f64 {
    let child = Command::new("cat").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn();
    let Ok(mut child) = child else { return f64::NAN };
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else { return f64::NAN };
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        if stdin.write_all(b"ping\n").is_err() || reader.read_line(&mut line).is_err() {
            break;
        }
        samples.push(start.elapsed().as_secs_f64());
        line.clear();
    }
    drop(stdin);
    let _ = child.wait();
    median_us(samples)
}

/// A request to a hyper server in this process, over a kept-alive loopback
/// connection: the floor of any HTTP accept latency here.
fn loopback_http(n: usize) -> f64 {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return f64::NAN };
    runtime.block_on(async move {
        let Ok(listener) = tokio::net::TcpListener::bind("127.0.0.1:0").await else { return f64::NAN };
        let Ok(address) = listener.local_addr() else { return f64::NAN };
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(|_request| async {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(String::from("{\"ok\":true}")))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        let Ok(mut sender) = connect(address).await else { return f64::NAN };
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let start = Instant::now();
            let request = hyper::Request::post("/").header("host", "127.0.0.1").body(String::from("{}"));
            let Ok(request) = request else { break };
            match send(&mut sender, request).await {
                Ok(_) => samples.push(start.elapsed().as_secs_f64()),
                Err(_) => break,
            }
        }
        median_us(samples)
    })
}

fn fsync_append(dir: &Path, n: usize) -> f64 {
    let Ok(temp) = tempfile::NamedTempFile::new_in(dir) else { return f64::NAN };
    let Ok(mut file) = std::fs::OpenOptions::new().append(true).open(temp.path()) else { return f64::NAN };
    let record = [b'x'; 300];
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        if file.write_all(&record).and_then(|()| file.sync_data()).is_err() {
            break;
        }
        samples.push(start.elapsed().as_secs_f64());
    }
    median_us(samples)
}

// ---------------------------------------------------------------- HTTP

async fn connect(address: std::net::SocketAddr) -> std::io::Result<SendRequest<String>> {
    let stream = tokio::net::TcpStream::connect(address).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(std::io::Error::other)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// Sends `request` and reads the whole answer; the status.
async fn send(sender: &mut SendRequest<String>, request: hyper::Request<String>) -> Result<u16, String> {
    sender.ready().await.map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    response.into_body().collect().await.map_err(|e| e.to_string())?;
    Ok(status)
}

fn slack_signature(timestamp: &str, body: &str) -> String {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(SIGNING_SECRET.as_bytes()) else { return String::new() };
    mac.update(b"v0:");
    mac.update(timestamp.as_bytes());
    mac.update(b":");
    mac.update(body.as_bytes());
    format!("v0={}", hex::encode(mac.finalize().into_bytes()))
}

/// One Slack Events API delivery (an `event_callback` of a `message`).
struct Event {
    id: String,
    body: String,
}

fn event(phase: &str, index: usize, channels: usize) -> Event {
    let id = format!("Ev{phase}x{index:07}");
    let channel = format!("C{:04}", index % channels);
    let ts = format!("{}.{:06}", 1_700_000_000 + index / 1_000_000, index % 1_000_000);
    let body = serde_json::json!({
        "token": "bench",
        "team_id": "T0BENCH",
        "api_app_id": "A0BENCH",
        "type": "event_callback",
        "event_id": id,
        "event_time": 1_700_000_000u64,
        "event": {
            "type": "message",
            "channel": channel,
            "channel_type": "channel",
            "user": "U0BENCH",
            "text": format!("bench {id} hello"),
            "ts": ts,
        },
    })
    .to_string();
    Event { id, body }
}

fn slack_request(port: u16, event: &Event, retry: bool) -> Option<hyper::Request<String>> {
    let timestamp = (now_ms() / 1000).to_string();
    let mut builder = hyper::Request::post("/slack/events")
        .header("host", format!("127.0.0.1:{port}"))
        .header("content-type", "application/json")
        .header("x-slack-request-timestamp", &timestamp)
        .header("x-slack-signature", slack_signature(&timestamp, &event.body));
    if retry {
        builder = builder.header("x-slack-retry-num", "1").header("x-slack-retry-reason", "http_error");
    }
    builder.body(event.body.clone()).ok()
}

/// Idle keep-alive connections, shared by the requests in flight.
struct Pool {
    address: std::net::SocketAddr,
    idle: Mutex<Vec<SendRequest<String>>>,
    open: std::sync::atomic::AtomicUsize,
    peak: std::sync::atomic::AtomicUsize,
    returned: tokio::sync::Notify,
}

impl Pool {
    async fn take(&self) -> std::io::Result<SendRequest<String>> {
        loop {
            if let Some(sender) = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop() {
                return Ok(sender);
            }
            let open = self.open.fetch_add(1, Ordering::SeqCst) + 1;
            if open <= MAX_CONNECTIONS {
                self.peak.fetch_max(open, Ordering::SeqCst);
                return match connect(self.address).await {
                    Ok(sender) => Ok(sender),
                    Err(error) => {
                        self.open.fetch_sub(1, Ordering::SeqCst);
                        Err(error)
                    }
                };
            }
            self.open.fetch_sub(1, Ordering::SeqCst);
            self.returned.notified().await;
        }
    }

    fn give_back(&self, sender: SendRequest<String>) {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).push(sender);
        self.returned.notify_one();
    }

    fn lost(&self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
        self.returned.notify_one();
    }
}

#[derive(Debug, Clone)]
struct Sent {
    /// From the scheduled time to the whole answer.
    latency: Duration,
    /// The status, or `None` for a connection error or a timeout.
    status: Option<u16>,
    /// When the answer came, from the start of the load.
    at: Duration,
}

/// Sends `events` open-loop at `rate`; results in `events`' order.
async fn open_loop(address: std::net::SocketAddr, events: Arc<Vec<Event>>, rate: u32) -> (Vec<Sent>, usize) {
    let pool = Arc::new(Pool {
        address,
        idle: Mutex::new(Vec::new()),
        open: std::sync::atomic::AtomicUsize::new(0),
        peak: std::sync::atomic::AtomicUsize::new(0),
        returned: tokio::sync::Notify::new(),
    });
    let start = tokio::time::Instant::now();
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
    let mut tasks = Vec::with_capacity(events.len());
    for index in 0..events.len() {
        let due = start + interval * u32::try_from(index).unwrap_or(u32::MAX);
        if due > tokio::time::Instant::now() {
            tokio::time::sleep_until(due).await;
        }
        let pool = Arc::clone(&pool);
        let events = Arc::clone(&events);
        tasks.push(tokio::spawn(async move {
            let outcome = tokio::time::timeout(REQUEST_TIMEOUT, async {
                let mut sender = pool.take().await.map_err(|e| e.to_string())?;
                let request = slack_request(address.port(), &events[index], false).ok_or("request")?;
                match send(&mut sender, request).await {
                    Ok(status) => {
                        pool.give_back(sender);
                        Ok(status)
                    }
                    Err(error) => {
                        pool.lost();
                        Err(error)
                    }
                }
            })
            .await;
            let now = tokio::time::Instant::now();
            Sent { latency: now - due, status: outcome.ok().and_then(Result::ok), at: now - start }
        }));
    }
    let mut sent = Vec::with_capacity(tasks.len());
    for task in tasks {
        match task.await {
            Ok(result) => sent.push(result),
            Err(_) => sent.push(Sent { latency: REQUEST_TIMEOUT, status: None, at: REQUEST_TIMEOUT }),
        }
    }
    (sent, pool.peak.load(Ordering::SeqCst))
}

/// Sends every event again as a Slack retry, a few at a time; the statuses.
async fn retry_all(address: std::net::SocketAddr, events: &[Event]) -> Vec<Option<u16>> {
    let mut statuses = Vec::with_capacity(events.len());
    let mut senders = Vec::new();
    for _ in 0..32 {
        if let Ok(sender) = connect(address).await {
            senders.push(sender);
        }
    }
    for chunk in events.chunks(senders.len().max(1)) {
        let mut futures = Vec::new();
        for (event, sender) in chunk.iter().zip(senders.iter_mut()) {
            let request = slack_request(address.port(), event, true);
            futures.push(async move {
                match request {
                    Some(request) => send(sender, request).await.ok(),
                    None => None,
                }
            });
        }
        for status in futures_join(futures).await {
            statuses.push(status);
        }
    }
    statuses
}

async fn futures_join<F: std::future::Future<Output = Option<u16>>>(futures: Vec<F>) -> Vec<Option<u16>> {
    let mut set = Vec::with_capacity(futures.len());
    for future in futures {
        set.push(Box::pin(future));
    }
    let mut results = Vec::with_capacity(set.len());
    for future in set {
        results.push(future.await);
    }
    results
}

// ---------------------------------------------------------------- gdn

fn bundle(dir: &Path, port: u16) -> std::io::Result<()> {
    let port = port.to_string();
    let more = serde_json::json!({
        "secrets": {"SLACK_SIGNING_SECRET": {"valueFrom": {"env": "BENCH_SLACK_SIGNING_SECRET"}}},
        "ingress": {"rules": [{
            "match": {"event": "message_im"},
            "route": {"instanceKeyProperty": "channel_id", "instanceKeyPrefix": "slack:"},
        }]},
    });
    Bundle::new()
        .scripted_model("instant", [reply_text("noted")])
        .one_agent("bench", Agent::new("bot", "instant"))
        .connection(
            CONNECTION,
            "slack",
            &[("SLACK_WEBHOOK_PORT", &port), ("SLACK_WEBHOOK_PATH", "/slack/events")],
            more,
        )
        .write(dir)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_or(0, |a| a.port())
}

/// Starts `gdn run` and waits for its `serving` line.
fn start_gdn(options: &Options, bundle_dir: &Path, state: &Path, log: &Path) -> Child {
    let stderr = File::options().create(true).append(true).open(log).map(Stdio::from).unwrap_or_else(|_| Stdio::null());
    let child = Command::new(&options.gdn)
        .args(["--json", "-c"])
        .arg(bundle_dir)
        .arg("run")
        .env("GOONDAN_STATE_ROOT", state)
        .env("BENCH_SLACK_SIGNING_SECRET", SIGNING_SECRET)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn();
    let Ok(mut child) = child else { panic!("cannot start {}", options.gdn.display()) };
    let Some(stdout) = child.stdout.take() else { panic!("no stdout") };
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => {
                let log = std::fs::read_to_string(log).unwrap_or_default();
                panic!("gdn ended before serving:\n{log}");
            }
            Ok(_) if line.contains("\"serving\"") => break,
            Ok(_) => {}
        }
    }
    // The rest of its stdout (the `stopped` line) is drained in the background.
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = reader.read_to_string(&mut rest);
    });
    child
}

/// CPU seconds of `pid` and its live child processes (`/proc`, 100 ticks/s).
fn tree_cpu(pid: u32) -> f64 {
    let (own, children) = split_cpu(pid);
    own + children
}

/// CPU seconds of `pid` itself and of its live child processes.
fn split_cpu(pid: u32) -> (f64, f64) {
    let ticks = |stat: &str| -> Option<(u32, f64)> {
        let after = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = after.split_whitespace().collect();
        // After the name: state(0) ppid(1) … utime(11) stime(12) cutime(13) cstime(14).
        let ppid = fields.get(1)?.parse().ok()?;
        let sum: f64 = fields.get(11..15)?.iter().filter_map(|f| f.parse::<f64>().ok()).sum();
        Some((ppid, sum / 100.0))
    };
    let own = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|s| ticks(&s)).map_or(0.0, |t| t.1);
    let mut total = 0.0;
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            if let Some((ppid, cpu)) = ticks(&stat)
                && ppid == pid
            {
                total += cpu;
            }
        }
    }
    (own, total)
}

/// The machine's count of SYNs dropped because a listen queue was full
/// (`TcpExt: ListenOverflows`): such a client waits for its SYN to be
/// sent again, 1 s later.
fn listen_overflows() -> u64 {
    let text = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
    let mut lines = text.lines().filter(|line| line.starts_with("TcpExt:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else { return 0 };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(name, _)| *name == "ListenOverflows")
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0)
}

/// The 1-minute load average: other work on the machine shares its cores.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

fn thread_cpu() -> f64 {
    getrusage(UsageWho::RUSAGE_THREAD).map_or(0.0, |usage| {
        let user = usage.user_time();
        let system = usage.system_time();
        user.tv_sec() as f64 + user.tv_usec() as f64 / 1e6 + system.tv_sec() as f64 + system.tv_usec() as f64 / 1e6
    })
}

// ---------------------------------------------------------------- the journal

#[derive(Debug, Default)]
struct Journal {
    /// seq → key, the latest accept of each seq (a seq can be reused after a rewrite).
    keys: HashMap<u64, String>,
    accepted_at: HashMap<String, u64>,
    first_start: HashMap<String, u64>,
    dones: HashMap<String, u32>,
    done_count: usize,
    files: usize,
}

impl Journal {
    fn line(&mut self, line: &[u8]) {
        let Ok(record) = serde_json::from_slice::<serde_json::Value>(line) else { return };
        let seq = record.get("seq").and_then(serde_json::Value::as_u64);
        let at = record.get("at").and_then(serde_json::Value::as_u64).unwrap_or(0);
        match (record.get("op").and_then(serde_json::Value::as_str), seq) {
            (Some("accept"), Some(seq)) => {
                let Some(key) = record.get("key").and_then(serde_json::Value::as_str) else { return };
                self.keys.insert(seq, key.to_owned());
                self.accepted_at.entry(key.to_owned()).or_insert(at);
            }
            (Some("start"), Some(seq)) => {
                if let Some(key) = self.keys.get(&seq) {
                    let first = self.first_start.entry(key.clone()).or_insert(at);
                    *first = (*first).min(at);
                }
            }
            (Some("done"), Some(seq)) => {
                if let Some(key) = self.keys.get(&seq) {
                    *self.dones.entry(key.clone()).or_insert(0) += 1;
                    self.done_count += 1;
                }
            }
            _ => {}
        }
    }
}

/// Follows `<state>/workspaces/*/ingress/inbox.jsonl` through rewrites and
/// restarts until `stop`.
fn tail_journal(state: PathBuf, journal: Arc<Mutex<Journal>>, stop: Arc<AtomicBool>) {
    let mut current: Option<(File, u64, u64)> = None; // file, inode, offset
    let mut partial: Vec<u8> = Vec::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        let path = inbox_path(&state);
        // Read what is there (the old file to its end before a new one).
        if let Some((file, _, offset)) = current.as_mut() {
            if let Ok(length) = file.metadata().map(|m| m.len())
                && length < *offset
            {
                // Cut off at open (a torn record): what was read past it is gone.
                *offset = length;
                partial.clear();
                let _ = file.seek(SeekFrom::Start(length));
            }
            loop {
                match file.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        *offset += n as u64;
                        partial.extend_from_slice(&buffer[..n]);
                    }
                }
            }
            let mut journal = journal.lock().unwrap_or_else(PoisonError::into_inner);
            let mut start = 0;
            while let Some(end) = partial[start..].iter().position(|b| *b == b'\n') {
                journal.line(&partial[start..start + end]);
                start += end + 1;
            }
            partial.drain(..start);
        }
        let inode = path.as_ref().and_then(|p| std::fs::metadata(p).ok()).map(|m| m.ino());
        match (inode, current.as_ref().map(|c| c.1)) {
            (Some(new), old) if Some(new) != old => {
                if let Some(path) = path
                    && let Ok(file) = File::open(&path)
                    && let Ok(meta) = file.metadata()
                {
                    current = Some((file, meta.ino(), 0));
                    partial.clear();
                    journal.lock().unwrap_or_else(PoisonError::into_inner).files += 1;
                    continue;
                }
            }
            _ => {}
        }
        if stopping {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn workspace_dir(state: &Path) -> Option<PathBuf> {
    std::fs::read_dir(state.join("workspaces")).ok()?.flatten().map(|e| e.path()).find(|p| p.is_dir())
}

fn inbox_path(state: &Path) -> Option<PathBuf> {
    workspace_dir(state).map(|w| w.join("ingress/inbox.jsonl")).filter(|p| p.exists())
}

/// The bench event ids a message's JSON carries (each once).
fn ids_in(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("bench Ev") {
        let tail = &rest[at + 6..];
        let end = tail.find(|c: char| !c.is_ascii_alphanumeric()).unwrap_or(tail.len());
        seen.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    seen
}

/// event id → messages of the agents' conversations that carry its text.
/// Each `messages.jsonl` is folded as the runtime folds it: a line is a
/// message (appended) or `{"events": [...]}` (`append`, `replace`, `remove`,
/// `truncate`), so that the messages a turn cut off by a crash left, and
/// that its rerun took out, do not count.
fn conversation_counts(state: &Path) -> HashMap<String, u32> {
    let mut counts = HashMap::new();
    let Some(workspace) = workspace_dir(state) else { return counts };
    let Ok(instances) = std::fs::read_dir(workspace.join("instances")) else { return counts };
    for instance in instances.flatten() {
        let Ok(file) = File::open(instance.path().join("messages.jsonl")) else { continue };
        // id → the ids its message carries, in conversation order.
        let mut messages: Vec<(String, HashSet<String>)> = Vec::new();
        let id_of = |message: &serde_json::Value| {
            message.get("id").and_then(serde_json::Value::as_str).unwrap_or_default().to_owned()
        };
        for line in BufReader::new(file).lines().map_while(Result::ok) {
            let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
            let Some(events) = value.get("events").and_then(serde_json::Value::as_array) else {
                messages.push((id_of(&value), ids_in(&line)));
                continue;
            };
            for event in events {
                let target = event.get("targetId").and_then(serde_json::Value::as_str).unwrap_or_default();
                let message = event.get("message");
                let carried = message.map(|m| (id_of(m), ids_in(&m.to_string())));
                match event.get("type").and_then(serde_json::Value::as_str) {
                    Some("append") => messages.extend(carried),
                    Some("replace") => {
                        if let (Some(at), Some(carried)) = (messages.iter().position(|m| m.0 == target), carried) {
                            messages[at] = carried;
                        }
                    }
                    Some("remove") => messages.retain(|m| m.0 != target),
                    Some("truncate") => messages.clear(),
                    _ => {}
                }
            }
        }
        for (_, ids) in messages {
            for id in ids {
                *counts.entry(id).or_insert(0) += 1;
            }
        }
    }
    counts
}

// ---------------------------------------------------------------- a phase

struct PhaseResult {
    name: String,
    original: bool,
    rate: u32,
    kills: usize,
    sent: usize,
    ok: usize,
    errors: usize,
    accepted_rate: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    generator_cpu: f64,
    gdn_cpu: f64,
    turns_rate: f64,
    drained: String,
    lost: usize,
    doubled: usize,
}

impl PhaseResult {
    fn row(&self) -> String {
        format!(
            "| {} | {} | {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.1} | {:.1} | {:.0} | {:.0} | {} | {} | {} |",
            self.name,
            self.rate,
            self.sent,
            self.ok,
            self.errors,
            self.accepted_rate,
            self.p50_ms,
            self.p99_ms,
            self.max_ms,
            self.generator_cpu,
            self.gdn_cpu,
            self.turns_rate,
            self.drained,
            if self.original { "n/a".to_owned() } else { self.lost.to_string() },
            if self.original { "n/a".to_owned() } else { self.doubled.to_string() },
        )
    }
}

fn run_phase(options: &Options, name: &str, rate: u32, secs: f64, kills: &[Duration]) -> PhaseResult {
    let scratch = tempfile::Builder::new().prefix("gdn-ingress-bench-").tempdir_in(&options.dir);
    let Ok(scratch) = scratch else { panic!("no scratch dir under {}", options.dir.display()) };
    let bundle_dir = scratch.path().join("bundle");
    let state = scratch.path().join("state");
    let log = scratch.path().join("gdn.log");
    let port = free_port();
    if let Err(error) = bundle(&bundle_dir, port) {
        panic!("writing the bundle: {error}");
    }
    let count = (f64::from(rate) * secs).round() as usize;
    let events: Arc<Vec<Event>> = Arc::new((0..count).map(|i| event(name, i, options.channels)).collect());
    let gdn = Arc::new(Mutex::new(start_gdn(options, &bundle_dir, &state, &log)));
    let journal = Arc::new(Mutex::new(Journal::default()));
    let stop_tail = Arc::new(AtomicBool::new(false));
    let tail = {
        let (state, journal, stop) = (state.clone(), Arc::clone(&journal), Arc::clone(&stop_tail));
        std::thread::spawn(move || tail_journal(state, journal, stop))
    };
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { panic!("runtime") };

    // The killer: kill -9 at each offset, then start again on the same state root.
    let killer = {
        let (gdn, kills, options) = (Arc::clone(&gdn), kills.to_vec(), options.clone());
        let (bundle_dir, state, log) = (bundle_dir.clone(), state.clone(), log.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut downtimes = Vec::new();
            for at in kills {
                if let Some(wait) = at.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
                let mut child = gdn.lock().unwrap_or_else(PoisonError::into_inner);
                let killed = Instant::now();
                let _ = child.kill();
                let _ = child.wait();
                *child = start_gdn(&options, &bundle_dir, &state, &log);
                downtimes.push(killed.elapsed());
            }
            downtimes
        })
    };

    let pid = gdn.lock().unwrap_or_else(PoisonError::into_inner).id();
    let cpu_before = split_cpu(pid);
    let overflows_before = listen_overflows();
    let generator_before = thread_cpu();
    let wall = Instant::now();
    let (sent, peak_connections) = runtime.block_on(open_loop(address, Arc::clone(&events), rate));
    let wall = wall.elapsed();
    let generator_cpu = thread_cpu() - generator_before;
    let overflows = listen_overflows().saturating_sub(overflows_before);
    let downtimes = killer.join().unwrap_or_default();
    let pid_now = gdn.lock().unwrap_or_else(PoisonError::into_inner).id();
    let cpu_after = split_cpu(pid);
    let (gdn_own_cpu, agents_cpu) =
        if pid_now == pid { (cpu_after.0 - cpu_before.0, cpu_after.1 - cpu_before.1) } else { (f64::NAN, f64::NAN) };
    let gdn_cpu = gdn_own_cpu + agents_cpu;

    let acked: Vec<&Event> = events
        .iter()
        .zip(&sent)
        .filter(|(_, s)| s.status.is_some_and(|c| (200..300).contains(&c)))
        .map(|(e, _)| e)
        .collect();
    let mut latencies: Vec<f64> = sent.iter().filter(|s| s.status.is_some()).map(|s| ms(s.latency)).collect();
    latencies.sort_by(f64::total_cmp);
    let last_answer = sent.iter().map(|s| s.at).max().unwrap_or(wall);
    let accepted_rate = acked.len() as f64 / last_answer.as_secs_f64().max(1e-9);
    let errors = sent.len() - acked.len();

    // Slack retries every event (the kill phase): unacknowledged ones must
    // now run once, acknowledged ones not again.
    let retried = if kills.is_empty() { Vec::new() } else { runtime.block_on(retry_all(address, &events)) };
    let ok = |status: &Option<u16>| status.is_some_and(|c| (200..300).contains(&c));
    let expected: Vec<&Event> = events
        .iter()
        .enumerate()
        .filter(|(i, _)| ok(&sent[*i].status) || retried.get(*i).is_some_and(ok))
        .map(|(_, e)| e)
        .collect();
    let expected_keys: HashSet<String> = expected.iter().map(|e| format!("{CONNECTION}/{}", e.id)).collect();

    // Wait for the turns, then stop gdn.
    let drain_start = Instant::now();
    let mut last_progress = (0usize, Instant::now());
    let drained = loop {
        let done = {
            let journal = journal.lock().unwrap_or_else(PoisonError::into_inner);
            expected_keys.iter().filter(|k| journal.dones.contains_key(*k)).count()
        };
        if done >= expected_keys.len() {
            break format!("yes, {:.1} s after the load", drain_start.elapsed().as_secs_f64());
        }
        if done > last_progress.0 {
            last_progress = (done, Instant::now());
        } else if last_progress.1.elapsed() > Duration::from_secs(60) {
            break format!("NO: {done}/{} after {:.0} s", expected_keys.len(), drain_start.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    {
        let mut child = gdn.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(0)),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = child.wait();
    }
    stop_tail.store(true, Ordering::SeqCst);
    let _ = tail.join();

    let journal = journal.lock().unwrap_or_else(PoisonError::into_inner);
    let conversations = conversation_counts(&state);
    let mut lost = 0;
    let mut doubled = 0;
    let mut lost_examples = Vec::new();
    let mut doubled_examples = Vec::new();
    for event in &expected {
        let key = format!("{CONNECTION}/{}", event.id);
        let dones = journal.dones.get(&key).copied().unwrap_or(0);
        let lines = conversations.get(&event.id).copied().unwrap_or(0);
        if dones == 0 || lines == 0 {
            lost += 1;
            if lost_examples.len() < 5 {
                lost_examples.push(format!("{} (done {dones}, conversation messages {lines})", event.id));
            }
        } else if dones > 1 || lines > 1 {
            doubled += 1;
            if doubled_examples.len() < 5 {
                doubled_examples.push(format!("{} (done {dones}, conversation messages {lines})", event.id));
            }
        }
    }
    let mut starts: Vec<u64> = expected_keys.iter().filter_map(|k| journal.first_start.get(k).copied()).collect();
    starts.sort_unstable();
    let turns_rate = match (starts.first(), starts.last()) {
        (Some(first), Some(last)) if last > first => (starts.len() - 1) as f64 / ((last - first) as f64 / 1000.0),
        _ => f64::NAN,
    };
    let mut delays: Vec<f64> = expected_keys
        .iter()
        .filter_map(|k| Some(journal.first_start.get(k)?.saturating_sub(*journal.accepted_at.get(k)?) as f64))
        .collect();
    delays.sort_by(f64::total_cmp);

    let result = PhaseResult {
        name: name.to_owned(),
        original: false,
        rate,
        kills: kills.len(),
        sent: sent.len(),
        ok: acked.len(),
        errors,
        accepted_rate,
        p50_ms: quantile(&latencies, 0.5),
        p99_ms: quantile(&latencies, 0.99),
        max_ms: latencies.last().copied().unwrap_or(f64::NAN),
        generator_cpu: 100.0 * generator_cpu / wall.as_secs_f64(),
        gdn_cpu: 100.0 * gdn_cpu / wall.as_secs_f64(),
        turns_rate,
        drained,
        lost,
        doubled,
    };
    out(&format!(
        "phase {name}: {} events at {rate}/s over {:.2} s ({} channels); peak connections {peak_connections}; \
         2xx {} ({:.0}/s), errors {errors}; accept latency p50 {:.2} ms p90 {:.2} ms p99 {:.2} ms max {:.1} ms; \
         generator CPU {:.2} s ({:.1} %); CPU of gdn {:.2} s + its agent processes {:.2} s; turns started {:.0}/s, accept→start p50 {:.0} ms \
         p99 {:.0} ms; drained: {}; inbox files followed {}; lost {lost}, doubled {doubled}; load average {}; \
         SYNs dropped on full listen queues {overflows}",
        sent.len(),
        wall.as_secs_f64(),
        options.channels,
        acked.len(),
        accepted_rate,
        quantile(&latencies, 0.5),
        quantile(&latencies, 0.9),
        quantile(&latencies, 0.99),
        result.max_ms,
        generator_cpu,
        result.generator_cpu,
        gdn_own_cpu,
        agents_cpu,
        turns_rate,
        quantile(&delays, 0.5),
        quantile(&delays, 0.99),
        result.drained,
        journal.files,
        load_average(),
    ));
    if !kills.is_empty() {
        let retry_ok = retried.iter().filter(|s| s.is_some_and(|c| (200..300).contains(&c))).count();
        out(&format!(
            "  kill -9 twice at {:?}; down (kill to serving again) {:?}; acknowledged before the retries {}; \
             every event retried as Slack would (X-Slack-Retry-Num: 1): {retry_ok}/{} 2xx; \
             turns expected (each event once) {}; done records {}",
            kills,
            downtimes,
            acked.len(),
            events.len(),
            expected.len(),
            journal.done_count,
        ));
        let acked_lost = acked
            .iter()
            .filter(|e| journal.dones.get(&format!("{CONNECTION}/{}", e.id)).is_none_or(|d| *d == 0))
            .count();
        out(&format!("  of the events acknowledged before any retry: {acked_lost} without a done record"));
    }
    if !lost_examples.is_empty() {
        out(&format!("  lost, e.g.: {}", lost_examples.join(", ")));
    }
    if !doubled_examples.is_empty() {
        out(&format!("  doubled, e.g.: {}", doubled_examples.join(", ")));
    }
    if lost + doubled > 0 {
        // Kept for a look at the inbox and the conversations.
        let kept = scratch.keep();
        out(&format!("  state kept in {}", kept.display()));
    }
    result
}

// ---------------------------------------------------------------- the original

/// The original's Slack connector alone under Bun: its `run(ctx)` with an
/// `emit` that writes the event as a line to standard output, as the
/// original's connector child hands it to `process.send` (nothing stored,
/// no runtime, no turns): the most its HTTP path can take.
fn run_original_phase(options: &Options, slack_ts: &Path, name: &str, rate: u32, secs: f64) -> PhaseResult {
    let scratch = tempfile::Builder::new().prefix("gdn-ingress-bench-orig-").tempdir_in(&options.dir);
    let Ok(scratch) = scratch else { panic!("no scratch dir under {}", options.dir.display()) };
    let port = free_port();
    let connector = scratch.path().join("slack.ts");
    if let Err(error) = std::fs::copy(slack_ts, &connector) {
        panic!("copying {}: {error}", slack_ts.display());
    }
    let runner = scratch.path().join("run.ts");
    let script = format!(
        r#"import run from "./slack.ts";
const logger = {{ info: (...a: unknown[]) => console.error(...a), warn: (...a: unknown[]) => console.error(...a),
  error: (...a: unknown[]) => console.error(...a), debug: () => {{}}, log: (...a: unknown[]) => console.error(...a) }};
await run({{
  emit: async (event) => {{ process.stdout.write(JSON.stringify({{ type: "connector_event", event }}) + "\n"); }},
  config: {{ SLACK_WEBHOOK_PORT: "{port}", SLACK_WEBHOOK_PATH: "/slack/events" }},
  secrets: {{ SLACK_SIGNING_SECRET: "{SIGNING_SECRET}" }},
  logger: logger as unknown as Console,
}});
"#
    );
    if let Err(error) = std::fs::write(&runner, script) {
        panic!("writing the runner: {error}");
    }
    let child = Command::new(&options.bun)
        .arg("run")
        .arg(&runner)
        .current_dir(scratch.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else { panic!("cannot start {}", options.bun.display()) };
    let Some(stdout) = child.stdout.take() else { panic!("no stdout") };
    let emitted = std::thread::spawn(move || BufReader::new(stdout).lines().map_while(Result::ok).count());
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let ready = Instant::now();
    while std::net::TcpStream::connect(address).is_err() {
        if ready.elapsed() > Duration::from_secs(20) {
            panic!("the original's connector did not listen on {address}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let count = (f64::from(rate) * secs).round() as usize;
    let events: Arc<Vec<Event>> = Arc::new((0..count).map(|i| event(name, i, options.channels)).collect());
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { panic!("runtime") };
    let pid = child.id();
    let cpu_before = tree_cpu(pid);
    let overflows_before = listen_overflows();
    let generator_before = thread_cpu();
    let wall = Instant::now();
    let (sent, peak_connections) = runtime.block_on(open_loop(address, Arc::clone(&events), rate));
    let wall = wall.elapsed();
    let generator_cpu = thread_cpu() - generator_before;
    let bun_cpu = tree_cpu(pid) - cpu_before;
    let overflows = listen_overflows().saturating_sub(overflows_before);
    drop(runtime);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(0)),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
    let emitted = emitted.join().unwrap_or(0);
    let ok = sent.iter().filter(|s| s.status.is_some_and(|c| (200..300).contains(&c))).count();
    let mut latencies: Vec<f64> = sent.iter().filter(|s| s.status.is_some()).map(|s| ms(s.latency)).collect();
    latencies.sort_by(f64::total_cmp);
    let last_answer = sent.iter().map(|s| s.at).max().unwrap_or(wall);
    let result = PhaseResult {
        name: name.to_owned(),
        original: true,
        rate,
        kills: 0,
        sent: sent.len(),
        ok,
        errors: sent.len() - ok,
        accepted_rate: ok as f64 / last_answer.as_secs_f64().max(1e-9),
        p50_ms: quantile(&latencies, 0.5),
        p99_ms: quantile(&latencies, 0.99),
        max_ms: latencies.last().copied().unwrap_or(f64::NAN),
        generator_cpu: 100.0 * generator_cpu / wall.as_secs_f64(),
        gdn_cpu: 100.0 * bun_cpu / wall.as_secs_f64(),
        turns_rate: f64::NAN,
        drained: "(no runtime)".to_owned(),
        lost: 0,
        doubled: 0,
    };
    out(&format!(
        "phase {name} (the original's slack.ts alone under Bun): {} events at {rate}/s; peak connections \
         {peak_connections}; 2xx {ok} ({:.0}/s); accept latency p50 {:.2} ms p99 {:.2} ms max {:.1} ms; \
         generator CPU {:.1} %; bun CPU {:.2} s; events emitted {emitted}; load average {}; SYNs dropped on full \
         listen queues {overflows}",
        sent.len(),
        result.accepted_rate,
        result.p50_ms,
        result.p99_ms,
        result.max_ms,
        result.generator_cpu,
        bun_cpu,
        load_average(),
    ));
    result
}
