//! A swarm across hosts over NATS JetStream (issue 26).
//!
//! Run with `cargo bench -p gdn --bench nats`; `-- --runs N` (the handoffs
//! and failovers), `-- --instances N[,N…]` (the memory section; e.g.
//! `200,500,1000` for a trend), `-- --only raw|handoff|failover|memory`
//! (comma-separated for several). Every figure is a median / p10 / p90 over
//! the runs, all measured in one run of this program so that they share the
//! machine's noise. It starts its own `nats-server` (JetStream, 127.0.0.1,
//! a free port; `GOONDAN_TEST_NATS_SERVER`, else `nats-server` on `PATH`,
//! else `.cache/py/bin/nats-server`), agent hosts (`gdn host --nats`, each
//! with its own state root and working directory) and the hub in this
//! process (an `Orchestrator` on a `goondan_nats::NatsLauncher`, on a
//! current-thread runtime as `gdn run --nats` has). Each section has its
//! own workspace (`--workspace`), so its own subjects and streams.
//!
//! 1. raw: the floors — a request/reply through the server with the
//!    async-nats client (one responder connection on its own thread, one
//!    requester), the same as JetStream messages (each side publishes to a
//!    stream, waits for the stored ack, and the other side's pull consumer
//!    delivers it: the path every message of a swarm takes), and a line
//!    through `cat` over pipes and back;
//! 2. handoff: the coordinator on one host asks the worker on the other
//!    (`agents__request`); the request's duration (the coordinator's
//!    `tool.completed`) minus the worker's turn (its `turn.completed`),
//!    with the worker running (warm) and started by the request (cold);
//! 3. failover: the worker's host is SIGKILLed while the worker runs a
//!    1 s job; the time from the kill to the job starting again on the
//!    other host (its `worker-runs.txt`), and to the answer; a fresh pair
//!    of hosts each run;
//! 4. memory: N idle `worker@iN` instances started over two hosts; Pss,
//!    RSS and Private_Dirty (`/proc/PID/smaps_rollup`) of the hosts and
//!    every process under them, of the hub (this process) and of the
//!    server; how they spread; the CPU they all use while idle.
//!
//! State roots, working directories and the JetStream store are made under
//! `/dev/shm` when it exists (tmpfs), so that the disk does not weigh in.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use goondan_ipc::AgentInstance;
use goondan_nats::{NatsLauncher, Placement, Scope};
use goondan_orchestrator::orchestrator::NoSwarmObserver;
use goondan_orchestrator::{Launch, Orchestrator};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

mod common;
use common::{
    Report, coordinator_plan, median, ms, pipe_round_trip_floor, repo, scratch_base, tool_durations, turn_durations,
};

const GDN: &str = env!("CARGO_BIN_EXE_gdn");

fn fixture() -> PathBuf {
    repo().join("tests/fixtures/nats-swarm")
}

/// Progress on stderr (the report goes to stdout at the end).
fn progress(line: &str) {
    let _ = writeln!(std::io::stderr(), "nats bench: {line}");
}

/// What to run, from the command line (`cargo bench` adds `--bench`:
/// anything not known is passed over).
struct Options {
    runs: usize,
    instances: Vec<usize>,
    only: Vec<String>,
}

impl Options {
    fn parse() -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let value = |name: &str| args.iter().position(|a| a == name).and_then(|at| args.get(at + 1)).cloned();
        let runs = value("--runs").and_then(|n| n.parse().ok()).unwrap_or(20usize).max(2);
        let instances = value("--instances")
            .map(|list| list.split(',').filter_map(|n| n.trim().parse().ok()).filter(|n| *n > 0).collect())
            .unwrap_or_else(|| vec![200]);
        let only = value("--only").map(|list| list.split(',').map(str::to_owned).collect()).unwrap_or_default();
        Self { runs, instances, only }
    }

    fn wants(&self, section: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|s| s == section)
    }
}

fn main() {
    let options = Options::parse();
    let base = scratch_base();
    let scratch =
        tempfile::Builder::new().prefix("gdn-nats-bench-").tempdir_in(&base).unwrap_or_else(|e| panic!("{e}"));
    let mut report = Report { text: String::new() };
    let Some(program) = nats_server_program() else {
        report.line("nats bench: no nats-server (set GOONDAN_TEST_NATS_SERVER, or see scripts/test); nothing measured");
        report.print();
        return;
    };
    let server = NatsServer::start(&program, scratch.path()).unwrap_or_else(|e| panic!("nats-server: {e}"));
    report.line(&format!(
        "nats bench: {} runs; {}; state roots, workdirs and the JetStream store under {} ({}); {} cores",
        options.runs,
        server.version,
        base.display(),
        if base == Path::new("/dev/shm") { "tmpfs" } else { "not tmpfs" },
        std::thread::available_parallelism().map_or(0, usize::from),
    ));
    report.line(&format!("  {:<60} {:>9} {:>9} {:>9}", "", "median", "p10", "p90"));

    let pipe_before = pipe_round_trip_floor(1000);
    let mut floors = Floors { pipe: pipe_before, nats: f64::NAN, jetstream: f64::NAN };
    if options.wants("raw") || options.wants("handoff") {
        progress("raw NATS round trips");
        raw(&server, &mut report, &mut floors);
    }
    if options.wants("handoff") {
        progress("handoffs across hosts");
        handoff(&server, scratch.path(), options.runs, &mut report, &floors);
    }
    if options.wants("failover") {
        failover(&server, scratch.path(), options.runs.min(10), &mut report);
    }
    if options.wants("memory") {
        for &count in &options.instances {
            memory(&server, scratch.path(), count, &mut report);
        }
    }
    let pipe_after = pipe_round_trip_floor(1000);
    report.line(&format!(
        "  floor: a line through `cat` over pipes and back (median of 1000): {:.1} µs before, {:.1} µs after",
        pipe_before * 1000.0,
        pipe_after * 1000.0
    ));
    report.print();
}

/// The medians (ms) the handoff is compared with.
struct Floors {
    pipe: f64,
    nats: f64,
    jetstream: f64,
}

fn runtime() -> tokio::runtime::Runtime {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let Ok(runtime) = runtime else { panic!("runtime") };
    runtime
}

async fn client(url: &str, name: &str) -> async_nats::Client {
    goondan_nats::connect(url, name, Duration::from_secs(10), &|_: &str| None)
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A message the size of an IPC envelope with a short request in it.
fn payload() -> Vec<u8> {
    let body = serde_json::json!({
        "type": "delegate", "from": "coordinator", "to": "worker", "correlationId": "corr-0123456789abcdef",
        "payload": {"instanceKey": "warm", "input": "JOB:quick", "metadata": {"deliveryKey": "nats:corr-0123456789"}},
        "traceId": "0123456789abcdef0123456789abcdef", "spanId": "0123456789abcdef"
    });
    serde_json::to_vec(&body).unwrap_or_default()
}

/// Section 1: core NATS and JetStream round trips, the responder on a
/// thread (and runtime, and connection) of its own.
fn raw(server: &NatsServer, report: &mut Report, floors: &mut Floors) {
    let rounds = 1000;
    let warmups = 100;
    let url = server.url();
    // The responder: echoes core requests, and answers each JetStream
    // message on `bench.js.req` with one on `bench.js.rep`.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let responder_url = url.clone();
    let responder = std::thread::spawn(move || {
        runtime().block_on(async move {
            let client = client(&responder_url, "bench responder").await;
            let mut requests = client.subscribe("bench.echo").await.unwrap_or_else(|e| panic!("{e}"));
            let js = async_nats::jetstream::new(client.clone());
            let stream = js
                .get_or_create_stream(async_nats::jetstream::stream::Config {
                    name: "BENCH".to_owned(),
                    subjects: vec!["bench.js.*".to_owned()],
                    retention: async_nats::jetstream::stream::RetentionPolicy::WorkQueue,
                    storage: async_nats::jetstream::stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let consumer: async_nats::jetstream::consumer::PullConsumer =
                stream.create_consumer(pull_config("req")).await.unwrap_or_else(|e| panic!("{e}"));
            let mut js_requests = consumer.messages().await.unwrap_or_else(|e| panic!("{e}"));
            let _ = client.flush().await;
            let _ = ready_tx.send(());
            let mut stop = stop_rx;
            loop {
                tokio::select! {
                    Some(message) = requests.next() => {
                        if let Some(reply) = message.reply {
                            let _ = client.publish(reply, message.payload).await;
                        }
                    }
                    Some(Ok(message)) = js_requests.next() => {
                        let ack = js.publish("bench.js.rep", message.payload.clone()).await;
                        let _ = ack.unwrap_or_else(|e| panic!("{e}")).await;
                        let _ = message.ack().await;
                    }
                    _ = &mut stop => break,
                }
            }
        });
    });
    let _ = ready_rx.recv();
    let (core, stored) = runtime().block_on(async {
        let client = client(&url, "bench requester").await;
        let body = payload();
        let mut core = Vec::with_capacity(rounds);
        for round in 0..rounds + warmups {
            let started = Instant::now();
            let answer = client.request("bench.echo", body.clone().into()).await;
            let elapsed = started.elapsed();
            assert_eq!(answer.map(|m| m.payload.len()).unwrap_or(0), body.len());
            if round >= warmups {
                core.push(ms(elapsed));
            }
        }
        let js = async_nats::jetstream::new(client.clone());
        let stream = js.get_stream("BENCH").await.unwrap_or_else(|e| panic!("{e}"));
        let consumer: async_nats::jetstream::consumer::PullConsumer =
            stream.create_consumer(pull_config("rep")).await.unwrap_or_else(|e| panic!("{e}"));
        let mut replies = consumer.messages().await.unwrap_or_else(|e| panic!("{e}"));
        let mut stored = Vec::with_capacity(rounds);
        for round in 0..rounds + warmups {
            let started = Instant::now();
            let ack = js.publish("bench.js.req", body.clone().into()).await.unwrap_or_else(|e| panic!("{e}"));
            ack.await.unwrap_or_else(|e| panic!("{e}"));
            let Some(Ok(reply)) = replies.next().await else { panic!("no JetStream reply") };
            let elapsed = started.elapsed();
            let _ = reply.ack().await;
            if round >= warmups {
                stored.push(ms(elapsed));
            }
        }
        (core, stored)
    });
    let _ = stop_tx.send(());
    let _ = responder.join();
    floors.nats = median(&core);
    floors.jetstream = median(&stored);
    report.line(&format!("1. floors on this server ({rounds} rounds each, after {warmups}; two connections)"));
    report.row_against("core NATS request/reply (async-nats), round trip", &core, "ms", &[("pipe", floors.pipe)]);
    report.row_against(
        "JetStream: stored publish → pull consumer → stored reply",
        &stored,
        "ms",
        &[("pipe", floors.pipe)],
    );
}

fn pull_config(name: &str) -> async_nats::jetstream::consumer::pull::Config {
    async_nats::jetstream::consumer::pull::Config {
        durable_name: Some(name.to_owned()),
        filter_subject: format!("bench.js.{name}"),
        ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
        ..Default::default()
    }
}

/// The hub in this process and its agent hosts, for one section.
struct Cluster {
    workspace: String,
    hosts: Vec<AgentHost>,
    hub_state: PathBuf,
    hub_work: PathBuf,
}

/// One `gdn host` process with its state root and working directory;
/// killed when dropped (its agent processes end with it).
struct AgentHost {
    id: String,
    state: PathBuf,
    work: PathBuf,
    child: Option<Child>,
}

impl AgentHost {
    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn workspace_dir(&self, workspace: &str) -> PathBuf {
        self.state.join("workspaces").join(workspace)
    }

    fn instance_dir(&self, workspace: &str, agent: &str, key: &str) -> PathBuf {
        let name = goondan_runtime::store::instance_dir_name(agent, key).unwrap_or_else(|| panic!("{agent}@{key}"));
        self.workspace_dir(workspace).join("instances").join(name)
    }

    /// The pids the worker's long job wrote here (one line per run).
    fn worker_runs(&self) -> usize {
        std::fs::read_to_string(self.work.join("worker-runs.txt")).unwrap_or_default().lines().count()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.state.join("host.log")).unwrap_or_default()
    }

    /// SIGKILL, as a crash.
    fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for AgentHost {
    fn drop(&mut self) {
        self.crash();
    }
}

impl Cluster {
    /// `hosts` agent hosts on `workspace` (its own subjects), with `env`.
    fn start(server: &NatsServer, scratch: &Path, workspace: &str, hosts: usize, env: &[(&str, &str)]) -> Self {
        let root = scratch.join(workspace);
        let hub_state = root.join("hub-state");
        let hub_work = root.join("hub-work");
        for dir in [&hub_state, &hub_work] {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
        }
        let mut cluster = Self { workspace: workspace.to_owned(), hosts: Vec::new(), hub_state, hub_work };
        for n in 1..=hosts {
            cluster.spawn_host(server, &root, &format!("{workspace}-h{n}"), env);
        }
        cluster
    }

    fn spawn_host(&mut self, server: &NatsServer, root: &Path, id: &str, env: &[(&str, &str)]) {
        let state = root.join(format!("{id}-state"));
        let work = root.join(format!("{id}-work"));
        for dir in [&state, &work] {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
        }
        let log = std::fs::File::create(state.join("host.log")).unwrap_or_else(|e| panic!("{e}"));
        let mut command = Command::new(GDN);
        command
            .arg("-c")
            .arg(fixture())
            .arg("--state-root")
            .arg(&state)
            .args(["--workspace", &self.workspace])
            .args(["host", "--nats", &server.url(), "--host-id", id, "--workdir"])
            .arg(&work)
            .env("NO_COLOR", "1")
            .env("TMPDIR", &state)
            .env_remove("GOONDAN_STATE_ROOT")
            .env_remove("NATS_USER")
            .env_remove("NATS_PASSWORD")
            .env_remove("NATS_TOKEN")
            .env_remove("NATS_CREDS")
            .env_remove("NATS_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        for (name, value) in env {
            command.env(name, value);
        }
        let child = command.spawn().unwrap_or_else(|e| panic!("gdn host: {e}"));
        self.hosts.push(AgentHost { id: id.to_owned(), state, work, child: Some(child) });
    }

    /// The hub: a launcher on this section's subjects and an orchestrator on
    /// it (no idle stop, room for `max_processes`); waits for the hosts.
    async fn hub(&self, server: &NatsServer, max_processes: usize) -> (Arc<NatsLauncher>, Orchestrator) {
        let client = client(&server.url(), "bench hub").await;
        let scope = Scope::new(&self.workspace);
        let launcher = NatsLauncher::start(client, scope, Placement::default(), &self.hub_work)
            .await
            .unwrap_or_else(|e| panic!("NatsLauncher: {e}"));
        let wanted = self.hosts.iter().filter(|h| h.child.is_some()).count();
        if !launcher.wait_for_hosts(wanted, Duration::from_secs(60)).await {
            panic!("only {:?} of {wanted} hosts joined:{}", launcher.hosts(), self.logs());
        }
        let mut plan = coordinator_plan(&fixture(), self.hub_state.clone(), self.hub_work.clone());
        plan.idle_timeout = None;
        plan.max_processes = max_processes;
        let orchestrator =
            Orchestrator::start_with(plan, Arc::clone(&launcher) as Arc<dyn Launch>, Arc::new(NoSwarmObserver));
        (launcher, orchestrator)
    }

    /// The host whose state root holds `agent@key`.
    fn holder(&self, agent: &str, key: &str) -> Option<usize> {
        self.hosts.iter().position(|h| h.instance_dir(&self.workspace, agent, key).join("events.jsonl").exists())
    }

    fn events_of(&self, agent: &str, key: &str) -> PathBuf {
        let Some(at) = self.holder(agent, key) else { panic!("no host holds {agent}@{key}:{}", self.logs()) };
        self.hosts[at].instance_dir(&self.workspace, agent, key).join("events.jsonl")
    }

    fn logs(&self) -> String {
        self.hosts.iter().map(|h| format!("\n--- host {}:\n{}", h.id, h.log())).collect()
    }
}

/// Section 2: handoffs across hosts, warm and cold.
fn handoff(server: &NatsServer, scratch: &Path, runs: usize, report: &mut Report, floors: &Floors) {
    let cluster = Cluster::start(server, scratch, "handoff", 2, &[]);
    let warmups = 3;
    runtime().block_on(async {
        let (_launcher, orchestrator) = cluster.hub(server, 64).await;
        let (_cancel, cancel_rx) = tokio::sync::watch::channel(false);
        // Warm: both run; the least loaded host takes each start, so the
        // coordinator goes to one and the worker to the other.
        let coordinator = AgentInstance::new("coordinator", "warm");
        let worker = AgentInstance::new("worker", "warm");
        orchestrator.start_instance(&coordinator).await.unwrap_or_else(|e| panic!("{e:?}"));
        orchestrator.start_instance(&worker).await.unwrap_or_else(|e| panic!("{e:?}"));
        let mut turns = Vec::new();
        for _ in 0..runs + warmups {
            let started = Instant::now();
            let answer = orchestrator.ask(&coordinator, "CASE:handoff".to_owned(), cancel_rx.clone()).await;
            turns.push(ms(started.elapsed()));
            assert_eq!(answer.response.as_deref(), Some("handoff done"), "{answer:?}{}", cluster.logs());
        }
        let (c_host, w_host) = (cluster.holder("coordinator", "warm"), cluster.holder("worker", "warm"));
        assert!(c_host.is_some() && c_host != w_host, "not across hosts: {c_host:?} {w_host:?}");
        let requests = tool_durations(&cluster.events_of("coordinator", "warm"), "agents__request");
        let worker_turns = turn_durations(&cluster.events_of("worker", "warm"));
        assert_eq!(requests.len(), runs + warmups, "one request per turn");
        assert_eq!(worker_turns.len(), runs + warmups, "one worker turn per request");
        let requests = &requests[warmups..];
        let worker_turns = &worker_turns[warmups..];
        let rest: Vec<f64> = requests.iter().zip(worker_turns).map(|(r, t)| r - t).collect();
        let all = [("core NATS", floors.nats), ("JetStream", floors.jetstream), ("pipe", floors.pipe)];
        report.line("2. handoff across hosts: coordinator (host 1) agents__request → worker (host 2), scripted models");
        report.line("   warm: both instances running; turns asked through the hub in this process");
        report.row_against("agents__request duration (coordinator's tool.completed)", requests, "ms", &[]);
        report.row_against("  of it: the worker's turn (its turn.completed)", worker_turns, "ms", &[]);
        report.row_against("  of it: the rest (the handoff overhead)", &rest, "ms", &all);
        report.row_against("the coordinator's whole turn, seen by ask()", &turns[warmups..], "ms", &[]);
        // The same handoff on one machine (no broker), in this run: what
        // any design pays besides the trip between hosts.
        let local = one_machine_rest(scratch, runs, warmups).await;
        report.line("   the same warm handoff on one machine (gdn run's hub and agent processes, no broker), same run");
        report.row_against("  the rest on one machine", &local, "ms", &all);
        let bound = common::median(&local) + floors.jetstream;
        report.line(&format!(
            "   lower bound of a handoff across hosts with stored messages, hub or not: one machine's rest \
             + one stored JetStream round trip = {bound:.3} ms = {:.1}× core NATS (target ≤ 2×); \
             this design: {:.1}× that bound",
            bound / floors.nats,
            common::median(&rest) / bound,
        ));

        // Cold: the request starts the worker (on the other host).
        let (mut requests, mut worker_turns, mut crossed) = (Vec::new(), Vec::new(), 0);
        for run in 0..runs {
            let key = format!("c{run}");
            let coordinator = AgentInstance::new("coordinator", key.clone());
            orchestrator.start_instance(&coordinator).await.unwrap_or_else(|e| panic!("{e:?}"));
            let answer = orchestrator.ask(&coordinator, "CASE:handoff".to_owned(), cancel_rx.clone()).await;
            assert_eq!(answer.response.as_deref(), Some("handoff done"), "{answer:?}");
            let (c_host, w_host) = (cluster.holder("coordinator", &key), cluster.holder("worker", &key));
            if c_host == w_host {
                continue;
            }
            crossed += 1;
            requests.extend(tool_durations(&cluster.events_of("coordinator", &key), "agents__request"));
            worker_turns.extend(turn_durations(&cluster.events_of("worker", &key)));
        }
        let rest: Vec<f64> = requests.iter().zip(&worker_turns).map(|(r, t)| r - t).collect();
        report.line(&format!(
            "   cold: the request starts worker@cN on the other host ({crossed} of {runs} placed across hosts)"
        ));
        report.row_against("agents__request duration (coordinator's tool.completed)", &requests, "ms", &[]);
        report.row_against("  of it: the worker's turn (its turn.completed)", &worker_turns, "ms", &[]);
        report.row_against("  of it: the rest (claim, consumer, spawn to ready, messages)", &rest, "ms", &all);
        timeline(server, &orchestrator, &coordinator, &cancel_rx, report).await;
        orchestrator.shutdown("bench done").await;
    });
}

/// "The rest" of a warm `coordinator@warm` → `worker@warm` handoff with
/// both on this machine: an orchestrator on the local launcher, as `gdn
/// run` has, on the same fixture.
async fn one_machine_rest(scratch: &Path, runs: usize, warmups: usize) -> Vec<f64> {
    let state = scratch.join("local-state");
    let work = scratch.join("local-work");
    let _ = std::fs::create_dir_all(&work);
    let mut plan = coordinator_plan(&fixture(), state.clone(), work);
    plan.idle_timeout = None;
    let orchestrator = Orchestrator::start(
        plan,
        goondan_orchestrator::AgentLauncher::new(GDN, ["__agent"]),
        Arc::new(NoSwarmObserver),
    );
    let (_cancel, cancel_rx) = tokio::sync::watch::channel(false);
    let coordinator = AgentInstance::new("coordinator", "warm");
    let worker = AgentInstance::new("worker", "warm");
    orchestrator.start_instance(&coordinator).await.unwrap_or_else(|e| panic!("{e:?}"));
    orchestrator.start_instance(&worker).await.unwrap_or_else(|e| panic!("{e:?}"));
    for _ in 0..runs + warmups {
        let answer = orchestrator.ask(&coordinator, "CASE:handoff".to_owned(), cancel_rx.clone()).await;
        assert_eq!(answer.response.as_deref(), Some("handoff done"), "{answer:?}");
    }
    orchestrator.shutdown("bench done").await;
    let dir = |agent: &str| {
        let name = goondan_runtime::store::instance_dir_name(agent, "warm").unwrap_or_else(|| panic!("{agent}@warm"));
        state.join("instances").join(name)
    };
    let requests = tool_durations(&dir("coordinator").join("events.jsonl"), "agents__request");
    let worker_turns = turn_durations(&dir("worker").join("events.jsonl"));
    requests[warmups..].iter().zip(&worker_turns[warmups..]).map(|(r, t)| r - t).collect()
}

/// Where a warm handoff's time goes: every message on the swarm's subjects
/// (`gdn.handoff.>`, seen by a core subscription on a thread of its own)
/// during a few more asks, timed from the ask.
async fn timeline(
    server: &NatsServer,
    orchestrator: &Orchestrator,
    coordinator: &AgentInstance,
    cancel: &tokio::sync::watch::Receiver<bool>,
    report: &mut Report,
) {
    let traced = 5;
    let url = server.url();
    let (seen_tx, seen_rx) = std::sync::mpsc::channel::<(Instant, String)>();
    // (the server's time it stored a delivered message, ns since the epoch; its consumer; what)
    let (stored_tx, stored_rx) = std::sync::mpsc::channel::<(u128, String, String)>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let watcher = std::thread::spawn(move || {
        runtime().block_on(async move {
            let client = client(&url, "bench watcher").await;
            let mut all = client.subscribe("gdn.handoff.>").await.unwrap_or_else(|e| panic!("{e}"));
            // The deliveries of stored messages to the consumers' pulls.
            let mut delivered = client.subscribe("_INBOX.>").await.unwrap_or_else(|e| panic!("{e}"));
            let _ = client.flush().await;
            let _ = ready_tx.send(());
            let mut stop = stop_rx;
            loop {
                tokio::select! {
                    Some(message) = all.next() => {
                        let _ = seen_tx.send((Instant::now(), describe(&message.subject, &message.payload)));
                    }
                    Some(message) = delivered.next() => {
                        // Only deliveries of stored messages: their ack subject names the
                        // consumer and the time the server stored the message.
                        let Some(reply) = message.reply.as_ref().filter(|r| r.starts_with("$JS.ACK.")) else { continue };
                        let Some((consumer, stored_ns)) = ack_subject(reply) else { continue };
                        let what = describe("gdn.x.delivered", &message.payload);
                        let what = &what[what.find(':').unwrap_or(0)..];
                        let _ = stored_tx.send((stored_ns, consumer.clone(), what.to_owned()));
                        let _ = seen_tx.send((Instant::now(), format!("  delivered to {consumer}{what}")));
                    }
                    _ = &mut stop => break,
                }
            }
        });
    });
    let _ = ready_rx.recv();
    let mut asks = Vec::new();
    let mut asks_wall = Vec::new();
    let now_ns = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    for _ in 0..traced {
        let started = Instant::now();
        let started_ns = now_ns();
        let answer = orchestrator.ask(coordinator, "CASE:handoff".to_owned(), cancel.clone()).await;
        asks.push((started, Instant::now()));
        asks_wall.push((started_ns, now_ns()));
        assert_eq!(answer.response.as_deref(), Some("handoff done"), "{answer:?}");
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    let _ = stop_tx.send(());
    let _ = watcher.join();
    let seen: Vec<(Instant, String)> = seen_rx.try_iter().collect();
    let stored: Vec<(u128, String, String)> = stored_rx.try_iter().collect();
    // Each leg from the server's own store times (exact, whatever the
    // watcher's scheduling): A's request stored → the hub's relay of it
    // stored → B's answer stored → the hub's relay of that stored.
    let (mut hop_in, mut at_b, mut hop_out) = (Vec::new(), Vec::new(), Vec::new());
    for (from, to) in &asks_wall {
        let during: Vec<&(u128, String, String)> = stored.iter().filter(|(at, ..)| at >= from && at <= to).collect();
        let first = |after: u128, hub: bool, kind: &str| {
            during
                .iter()
                .find(|(at, consumer, what)| {
                    *at >= after && (consumer == "hub") == hub && what.contains(&format!(": {kind} "))
                })
                .map(|(at, ..)| *at)
        };
        let legs = first(0, true, "delegate").and_then(|t1| {
            let t2 = first(t1, false, "delegate")?;
            let t3 = first(t2, true, "delegate_result")?;
            let t4 = first(t3, false, "delegate_result")?;
            Some((t1, t2, t3, t4))
        });
        if let Some((t1, t2, t3, t4)) = legs {
            let ms_of = |ns: u128| ns as f64 / 1e6;
            hop_in.push(ms_of(t2 - t1));
            at_b.push(ms_of(t3 - t2));
            hop_out.push(ms_of(t4 - t3));
        }
    }
    report.line(&format!(
        "   the legs by the server's store times ({} of {traced} asks): A's request stored → the hub's relay to B stored",
        hop_in.len()
    ));
    report.row_against("  through the hub, inward (delivery to the hub, relay, store)", &hop_in, "ms", &[]);
    report.row_against("  at B's host (delivery, the worker's turn, state sync, answer stored)", &at_b, "ms", &[]);
    report.row_against("  through the hub, outward", &hop_out, "ms", &[]);
    report
        .line(&format!("   where a warm handoff's time goes: the messages on gdn.handoff.> during {traced} more asks"));
    for (n, (started, ended)) in asks.iter().enumerate() {
        let during: Vec<&(Instant, String)> =
            seen.iter().filter(|(at, what)| at >= started && at <= ended && !what.starts_with("heartbeat")).collect();
        report.line(&format!(
            "   ask {}: {:.3} ms, {} messages through the server",
            n + 1,
            ms(*ended - *started),
            during.len()
        ));
        if n + 1 == traced {
            for (at, what) in during {
                report.line(&format!("     {:>8.3} ms  {what}", ms(*at - *started)));
            }
        }
    }
}

/// The consumer and the store time (ns since the epoch) in a JetStream
/// ack subject: `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<time>.<pending>`,
/// or with a domain and account hash after `ACK` (12 tokens).
fn ack_subject(reply: &str) -> Option<(String, u128)> {
    let tokens: Vec<&str> = reply.split('.').collect();
    let (consumer, time) = match tokens.len() {
        9 => (tokens[3], tokens[7]),
        n if n >= 12 => (tokens[5], tokens[9]),
        _ => return None,
    };
    Some((consumer.to_owned(), time.parse().ok()?))
}

/// A message on the swarm's subjects, in a few words: its subject's kind
/// and the IPC type in it.
fn describe(subject: &str, payload: &[u8]) -> String {
    let kind = subject.split('.').nth(2).unwrap_or_default();
    let body: Value = serde_json::from_slice(payload).unwrap_or_default();
    let detail = ["type", "kind"]
        .iter()
        .filter_map(|field| body[*field].as_str())
        .chain(["type", "kind", "event"].iter().filter_map(|field| body["payload"][*field].as_str()))
        .collect::<Vec<_>>()
        .join(" ");
    let to = match kind {
        "to" => "hub → instance",
        "hub" => "instance → hub",
        "state" => "state record",
        "hosts" => "heartbeat",
        _ => kind,
    };
    format!("{to}: {detail} ({} bytes)", payload.len())
}

/// Section 3: the worker's host SIGKILLed mid-job; a fresh cluster each run.
fn failover(server: &NatsServer, scratch: &Path, runs: usize, report: &mut Report) {
    let (mut to_rerun, mut to_answer, mut skipped) = (Vec::new(), Vec::new(), 0);
    for run in 0..runs {
        progress(&format!("failover {}/{runs}", run + 1));
        let mut cluster = Cluster::start(server, scratch, &format!("failover{run}"), 2, &[("GDN_TEST_SLEEP", "1")]);
        let measured = runtime().block_on(async {
            let (_launcher, orchestrator) = cluster.hub(server, 64).await;
            let coordinator = AgentInstance::new("coordinator", "default");
            orchestrator.start_instance(&coordinator).await.unwrap_or_else(|e| panic!("{e:?}"));
            let (_cancel, cancel_rx) = tokio::sync::watch::channel(false);
            let asking = orchestrator.clone();
            let ask = tokio::spawn(async move { asking.ask(&coordinator, "CASE:long".to_owned(), cancel_rx).await });
            // The job starts on the worker's host.
            let deadline = Instant::now() + Duration::from_secs(30);
            let victim = loop {
                if let Some(at) = cluster.hosts.iter().position(|h| h.worker_runs() > 0) {
                    break at;
                }
                assert!(Instant::now() < deadline, "the worker's job did not start:{}", cluster.logs());
                tokio::time::sleep(Duration::from_millis(2)).await;
            };
            let survivor = 1 - victim;
            if cluster.holder("coordinator", "default") == Some(victim) {
                // Both on one host: nothing would survive.
                let _ = ask.await;
                orchestrator.shutdown("bench done").await;
                return None;
            }
            cluster.hosts[victim].crash();
            let killed = Instant::now();
            let deadline = killed + Duration::from_secs(30);
            while cluster.hosts[survivor].worker_runs() == 0 {
                assert!(Instant::now() < deadline, "the worker did not run again:{}", cluster.logs());
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let rerun = killed.elapsed();
            let answer = ask.await.unwrap_or_else(|e| panic!("{e}"));
            let answered = killed.elapsed();
            assert_eq!(answer.response.as_deref(), Some("long done"), "{answer:?}{}", cluster.logs());
            assert_eq!(cluster.hosts[survivor].worker_runs(), 1, "the job ran once on the survivor");
            orchestrator.shutdown("bench done").await;
            Some((rerun, answered))
        });
        match measured {
            Some((rerun, answered)) => {
                to_rerun.push(ms(rerun));
                to_answer.push(ms(answered));
            }
            None => skipped += 1,
        }
        drop(cluster);
        let _ = std::fs::remove_dir_all(scratch.join(format!("failover{run}")));
    }
    report.line(&format!(
        "3. failover: the worker's host SIGKILLed during its 1 s job (lease {:?}, heartbeat {:?}; {skipped} runs \
         skipped with both on one host)",
        goondan_nats::LEASE,
        goondan_nats::HEARTBEAT
    ));
    report.row_against("kill → the job starts again on the other host", &to_rerun, "ms", &[]);
    report.row_against("kill → the coordinator's answer (the 1 s job included)", &to_answer, "ms", &[]);
}

/// Section 4: `count` idle instances over two hosts.
fn memory(server: &NatsServer, scratch: &Path, count: usize, report: &mut Report) {
    progress(&format!("memory: starting {count} instances"));
    let workspace = format!("memory{count}");
    let cluster = Cluster::start(server, scratch, &workspace, 2, &[]);
    let concurrency = 4;
    runtime().block_on(async {
        let (launcher, orchestrator) = cluster.hub(server, count + 16).await;
        let started = Instant::now();
        let outcomes: Vec<Result<f64, String>> = futures_util::stream::iter(0..count)
            .map(|n| {
                let orchestrator = orchestrator.clone();
                async move {
                    let instance = AgentInstance::new("worker", format!("i{n}"));
                    let started = Instant::now();
                    let outcome = orchestrator.start_instance(&instance).await;
                    if n % 100 == 99 {
                        progress(&format!("  {} asked", n + 1));
                    }
                    outcome.map(|_| ms(started.elapsed())).map_err(|error| format!("{instance}: {}", error.message))
                }
            })
            .buffer_unordered(concurrency)
            .collect()
            .await;
        let all_started = started.elapsed();
        let latencies: Vec<f64> = outcomes.iter().filter_map(|o| o.as_ref().ok().copied()).collect();
        let failures: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
        // Let the first syncs and consumers settle, then look.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let table = process_table();
        let mut per_host = Vec::new();
        let mut agent_private = Vec::new();
        let mut agent_pss = Vec::new();
        let (mut total_pss, mut total_rss, mut total_private) = (0u64, 0u64, 0u64);
        for host in &cluster.hosts {
            let Some(pid) = host.pid() else { continue };
            let own = smaps(pid);
            let below = descendants(&table, pid);
            let agents: Vec<u32> =
                below.iter().copied().filter(|p| table.get(p).is_some_and(|(_, c)| c.contains("__agent"))).collect();
            let mut sum = own;
            for &child in &below {
                let m = smaps(child);
                sum.add(&m);
                if agents.contains(&child) {
                    agent_private.push(m.private_dirty as f64 / 1024.0);
                    agent_pss.push(m.pss as f64 / 1024.0);
                }
            }
            total_pss += sum.pss;
            total_rss += sum.rss;
            total_private += sum.private_dirty;
            per_host.push((host.id.clone(), agents.len(), below.len(), own, sum));
        }
        let hub = smaps(std::process::id());
        let nats = server.pid().map(smaps).unwrap_or_default();
        total_pss += hub.pss;
        total_rss += hub.rss;
        total_private += hub.private_dirty;
        // The CPU they all use while idle, over 5 s.
        let mut watched: Vec<u32> = cluster.hosts.iter().filter_map(AgentHost::pid).collect();
        for host in &cluster.hosts {
            if let Some(pid) = host.pid() {
                watched.extend(descendants(&table, pid));
            }
        }
        let cpu_before: u64 = watched.iter().map(|p| cpu_ticks(*p)).sum();
        let nats_before = server.pid().map_or(0, cpu_ticks);
        let hub_before = cpu_ticks(std::process::id());
        let window = Duration::from_secs(5);
        tokio::time::sleep(window).await;
        let ticks = ticks_per_second();
        let share = |before: u64, after: u64| (after.saturating_sub(before)) as f64 / ticks / window.as_secs_f64();
        let hosts_cpu = share(cpu_before, watched.iter().map(|p| cpu_ticks(*p)).sum());
        let nats_cpu = share(nats_before, server.pid().map_or(0, cpu_ticks));
        let hub_cpu = share(hub_before, cpu_ticks(std::process::id()));

        let mib = |kib: u64| kib as f64 / 1024.0;
        report.line(&format!(
            "4. memory: {} of {count} idle worker@iN started over two hosts ({concurrency} starts at a time, in {:.1} s)",
            latencies.len(),
            all_started.as_secs_f64()
        ));
        report.row_against("start_instance → ready, each", &latencies, "ms", &[]);
        if let Some(first) = failures.first() {
            report.line(&format!("  {} of {count} starts FAILED; the first: {first}", failures.len()));
        }
        for (id, agents, below, own, sum) in &per_host {
            report.line(&format!(
                "  host {id}: {agents} agent processes ({below} processes below it); the host itself Pss {:.1} MiB, \
                 RSS {:.1} MiB, Private_Dirty {:.1} MiB; with them Pss {:.1} MiB, RSS {:.1} MiB, Private_Dirty {:.1} MiB",
                mib(own.pss),
                mib(own.rss),
                mib(own.private_dirty),
                mib(sum.pss),
                mib(sum.rss),
                mib(sum.private_dirty)
            ));
        }
        let placed: BTreeMap<String, usize> = launcher.hosts().into_iter().map(|(id, _, placed)| (id, placed)).collect();
        report.line(&format!("  placed, as the hub counts them: {placed:?}"));
        report.line(&format!(
            "  the hub (this process): Pss {:.1} MiB, RSS {:.1} MiB, Private_Dirty {:.1} MiB; nats-server (not in the \
             total): Pss {:.1} MiB, RSS {:.1} MiB",
            mib(hub.pss),
            mib(hub.rss),
            mib(hub.private_dirty),
            mib(nats.pss),
            mib(nats.rss)
        ));
        report.line(&format!(
            "  total (hosts, everything below them, the hub): Pss {:.2} GiB, RSS {:.2} GiB, Private_Dirty {:.2} GiB; \
             Pss per instance {:.2} MiB",
            mib(total_pss) / 1024.0,
            mib(total_rss) / 1024.0,
            mib(total_private) / 1024.0,
            mib(total_pss) / latencies.len().max(1) as f64
        ));
        report.row_against("each agent process: Private_Dirty", &agent_private, "MiB", &[]);
        report.row_against("each agent process: Pss", &agent_pss, "MiB", &[]);
        report.line(&format!(
            "  CPU while idle (cores busy, over {} s): hosts and their processes {hosts_cpu:.2}, nats-server \
             {nats_cpu:.2}, the hub {hub_cpu:.2}",
            window.as_secs()
        ));
        // The hosts end with their agent processes when dropped; the
        // orchestrator's thousand shutdowns are not waited for.
        drop(orchestrator);
    });
    drop(cluster);
    let _ = std::fs::remove_dir_all(scratch.join(&workspace));
}

#[derive(Debug, Default, Clone, Copy)]
struct Memory {
    rss: u64,
    pss: u64,
    private_dirty: u64,
}

impl Memory {
    fn add(&mut self, other: &Self) {
        self.rss += other.rss;
        self.pss += other.pss;
        self.private_dirty += other.private_dirty;
    }
}

/// Rss, Pss and Private_Dirty of `/proc/PID/smaps_rollup` (KiB).
fn smaps(pid: u32) -> Memory {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |name: &str| {
        rollup
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Memory { rss: field("Rss:"), pss: field("Pss:"), private_dirty: field("Private_Dirty:") }
}

/// pid → (parent pid, command line) of every process.
fn process_table() -> BTreeMap<u32, (u32, String)> {
    let mut table = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return table };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let Some(parent) = stat.rsplit_once(") ").and_then(|(_, rest)| rest.split_whitespace().nth(1)) else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        table.insert(pid, (parent.parse().unwrap_or(0), cmdline));
    }
    table
}

/// Every process below `pid`.
fn descendants(table: &BTreeMap<u32, (u32, String)>, pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for (child, (ppid, _)) in table {
            if *ppid == parent {
                found.push(*child);
                frontier.push(*child);
            }
        }
    }
    found
}

/// utime + stime of a process (clock ticks).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some((_, rest)) = stat.rsplit_once(") ") else { return 0 };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3, utime 14, stime 15 (1-based).
    let get = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    get(14) + get(15)
}

fn ticks_per_second() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().map_or(100.0, |t| t as f64)
}

/// The `nats-server` binary: `GOONDAN_TEST_NATS_SERVER`, else on `PATH`,
/// else the one scripts/test installs into `.cache/py`.
fn nats_server_program() -> Option<PathBuf> {
    if let Some(program) = std::env::var_os("GOONDAN_TEST_NATS_SERVER") {
        let program = PathBuf::from(program);
        return program.is_file().then_some(program);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("nats-server"))
        .find(|candidate| candidate.is_file());
    on_path.or_else(|| Some(repo().join(".cache/py/bin/nats-server")).filter(|p| p.is_file()))
}

/// A `nats-server -js` on 127.0.0.1 and a free port, its store under the
/// scratch directory; killed when dropped.
struct NatsServer {
    port: u16,
    version: String,
    child: Option<Child>,
}

impl NatsServer {
    fn start(program: &Path, scratch: &Path) -> Result<Self, String> {
        let dir = scratch.join("nats");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let version = Command::new(program)
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default();
        let mut last = String::new();
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| e.to_string())?
                .port();
            let quoted = |value: &Path| Value::from(value.display().to_string()).to_string();
            let config = format!(
                "listen: \"127.0.0.1:{port}\"\njetstream {{\n  store_dir: {}\n}}\n",
                quoted(&dir.join("store"))
            );
            let config_path = dir.join("nats-server.conf");
            std::fs::write(&config_path, config).map_err(|e| e.to_string())?;
            let log_path = dir.join(format!("nats-server-{port}.log"));
            let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
            let child = Command::new(program)
                .arg("-c")
                .arg(&config_path)
                .stdin(Stdio::null())
                .stdout(log.try_clone().map_err(|e| e.to_string())?)
                .stderr(log)
                .spawn()
                .map_err(|e| e.to_string())?;
            let mut server = Self { port, version: version.clone(), child: Some(child) };
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                if log.contains("Server is ready") {
                    return Ok(server);
                }
                let ended = server.child.as_mut().is_none_or(|c| matches!(c.try_wait(), Ok(Some(_))));
                if ended || Instant::now() > deadline {
                    last = log;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Err(format!("nats-server did not start:\n{last}"))
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(0));
            let _ = kill(pid, Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
