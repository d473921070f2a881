//! The bound on live agent processes and the idle stop, through the
//! orchestrator's API with real `gdn __agent` processes (children of this
//! test process) and the scripted models of `tests/fixtures/swarm`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use goondan_ipc::{AgentInstance, ObservePayload, ResultStatus};
use goondan_orchestrator::plan::swarm_of;
use goondan_orchestrator::{AgentLauncher, Orchestrator, SwarmObserver, SwarmPlan};
use tokio::sync::watch;

fn fixture() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/swarm");
    std::fs::canonicalize(&dir).unwrap_or(dir)
}

/// Counts what the hub reports: processes started and ended (the most
/// alive at once), and the instances whose turns ended.
#[derive(Default)]
struct Counter {
    state: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    live: usize,
    most: usize,
    starts: usize,
    answered: BTreeSet<String>,
}

impl Counter {
    fn counts<T>(&self, read: impl FnOnce(&Counts) -> T) -> T {
        read(&self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

impl SwarmObserver for Counter {
    fn observe(&self, instance: &AgentInstance, event: &ObservePayload) {
        if let ObservePayload::TurnEnded { summary } = event
            && summary.end == "answered"
        {
            self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner).answered.insert(instance.to_string());
        }
    }

    fn started(&self, _instance: &AgentInstance, _pid: u32) {
        let mut counts = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        counts.live += 1;
        counts.starts += 1;
        counts.most = counts.most.max(counts.live);
    }

    fn exited(&self, _instance: &AgentInstance, _pid: u32, _status: &str, _crashed: bool) {
        let mut counts = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        counts.live = counts.live.saturating_sub(1);
    }
}

/// The live `gdn __agent` children of this process whose instance key is
/// one `mine` accepts (the tests of this file run side by side).
fn agent_children(mine: impl Fn(&str) -> bool) -> usize {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| {
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let Some((_, rest)) = stat.rsplit_once(')') else { return false };
            let mut fields = rest.split_whitespace();
            let (state, parent) = (fields.next(), fields.next());
            if state == Some("Z") || parent != Some(me.as_str()) {
                return false;
            }
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.contains(&b"__agent".as_slice())
                && args.iter().any(|arg| String::from_utf8_lossy(arg).split('@').nth(1).is_some_and(&mine))
        })
        .count()
}

struct Swarm {
    orchestrator: Orchestrator,
    counter: Arc<Counter>,
    _state: tempfile::TempDir,
    _work: tempfile::TempDir,
}

fn swarm(configure: impl FnOnce(&mut SwarmPlan)) -> Swarm {
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let work = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let report = goondan_config::load_bundle(&fixture());
    let Some(bundle) = report.valid_bundle() else { panic!("{:?}", report.diagnostics) };
    let mut plan = SwarmPlan::new(
        swarm_of(bundle, "coordinator"),
        fixture(),
        state.path().to_path_buf(),
        work.path().to_path_buf(),
    );
    configure(&mut plan);
    let counter = Arc::new(Counter::default());
    let launcher = AgentLauncher::new(env!("CARGO_BIN_EXE_gdn"), ["__agent"]);
    let orchestrator = Orchestrator::start(plan, launcher, Arc::clone(&counter) as Arc<dyn SwarmObserver>);
    Swarm { orchestrator, counter, _state: state, _work: work }
}

/// A cancel switch never turned (a dropped sender would read as a cancel).
fn no_cancel() -> watch::Receiver<bool> {
    let (switch, cancel) = watch::channel(false);
    std::mem::forget(switch);
    cancel
}

/// One model reply with twelve asynchronous requests on twelve instance
/// keys, under a bound of three: never more than three processes, and
/// every request answered (idle workers are stopped to make room).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_stays_within_the_bound_and_every_request_is_answered() {
    let swarm = swarm(|plan| {
        plan.max_processes = 3;
        plan.idle_timeout = None;
    });
    let sampler_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = Arc::clone(&sampler_stop);
        std::thread::spawn(move || {
            let mut most = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(agent_children(|key| key == "cap" || key.starts_with("fan")));
                std::thread::sleep(Duration::from_millis(20));
            }
            most
        })
    };
    let lead = AgentInstance::new("coordinator", "cap");
    let answer = swarm.orchestrator.ask(&lead, "CASE:fanout".to_owned(), no_cancel()).await;
    assert_eq!(answer.status, ResultStatus::Ok, "{answer:?}");
    let workers: BTreeSet<String> = (1..=12).map(|n| format!("worker@fan{n}")).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !swarm.counter.counts(|c| workers.is_subset(&c.answered)) {
        assert!(Instant::now() < deadline, "not all answered: {:?}", swarm.counter.counts(|c| c.answered.clone()));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    swarm.orchestrator.shutdown("done").await;
    sampler_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = sampler.join().unwrap_or(usize::MAX);
    let (most, starts) = swarm.counter.counts(|c| (c.most, c.starts));
    assert!(most <= 3, "{most} processes alive at once");
    assert!(seen <= 3, "{seen} agent processes seen at once");
    assert!(starts >= 13, "the coordinator and twelve workers started: {starts}");
}

/// At the bound with nothing idle, a start is refused with a clear error
/// once no place has become free within the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_bound_with_nothing_idle_a_start_is_refused_with_a_clear_error() {
    let swarm = swarm(|plan| {
        plan.max_processes = 1;
        plan.idle_timeout = None;
        plan.capacity_wait = Duration::from_millis(500);
    });
    let busy = AgentInstance::new("worker", "cap-busy");
    let orchestrator = swarm.orchestrator.clone();
    // A turn that does not end: the only place stays taken.
    let hanging = tokio::spawn(async move { orchestrator.ask(&busy, "CASE:hang".to_owned(), no_cancel()).await });
    let deadline = Instant::now() + Duration::from_secs(30);
    while swarm.counter.counts(|c| c.starts) == 0 {
        assert!(Instant::now() < deadline, "the first process never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    let other = AgentInstance::new("worker", "cap-other");
    let error =
        swarm.orchestrator.start_instance(&other).await.err().unwrap_or_else(|| panic!("started past the bound"));
    assert_eq!(error.code, "AGENT_CAPACITY_EXCEEDED", "{error:?}");
    assert!(error.message.contains("1 agent processes"), "{}", error.message);
    assert!(error.suggestion.as_deref().is_some_and(|s| s.contains("--max-agent-processes")), "{error:?}");
    assert!(started.elapsed() >= Duration::from_millis(400), "refused before the wait: {:?}", started.elapsed());
    swarm.orchestrator.shutdown("done").await;
    let _ = hanging.await;
}

/// A process idle for the idle time is stopped; its next message starts it
/// again (its state is on disk).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_process_is_stopped_and_started_again_on_demand() {
    let swarm = swarm(|plan| plan.idle_timeout = Some(Duration::from_millis(300)));
    let worker = AgentInstance::new("worker", "cap-idle");
    let first = swarm.orchestrator.ask(&worker, "CASE:quick".to_owned(), no_cancel()).await;
    assert_eq!(first.response.as_deref(), Some("worker answer"), "{first:?}");
    let pid = swarm.orchestrator.pid_of(&worker).await.unwrap_or_else(|| panic!("not running"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while swarm.orchestrator.pid_of(&worker).await.is_some() {
        assert!(Instant::now() < deadline, "the idle process was not stopped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}/cmdline")).exists() || agent_children(|key| key == "cap-idle") == 0
    );
    let second = swarm.orchestrator.ask(&worker, "CASE:quick".to_owned(), no_cancel()).await;
    assert_eq!(second.response.as_deref(), Some("worker answer"), "{second:?}");
    assert_eq!(swarm.counter.counts(|c| c.starts), 2, "started again on demand");
    swarm.orchestrator.shutdown("done").await;
}

/// A process whose tool call left a background job running is not idle:
/// the idle stop would end the job with it. Once the job ends, it idles and
/// is stopped as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_job_a_tool_call_left_keeps_its_process_from_the_idle_stop() {
    let swarm = swarm(|plan| plan.idle_timeout = Some(Duration::from_millis(300)));
    let worker = AgentInstance::new("worker", "cap-background");
    let answer = swarm.orchestrator.ask(&worker, "CASE:background".to_owned(), no_cancel()).await;
    assert_eq!(answer.response.as_deref(), Some("background started"), "{answer:?}");
    let pid_file = swarm._work.path().join("background.pid");
    let job: i32 = std::fs::read_to_string(&pid_file)
        .unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("the job's pid: {e}"));
    let runs = |pid: i32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    };
    // Several idle times pass (the hub looks every tick): the process and its job stay.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(swarm.orchestrator.pid_of(&worker).await.is_some(), "the process was stopped while its job ran");
    assert!(runs(job), "the background job was ended");
    // The job ends: the process idles now, and is stopped.
    let _ = std::process::Command::new("kill").args(["-KILL", &job.to_string()]).status();
    let deadline = Instant::now() + Duration::from_secs(15);
    while swarm.orchestrator.pid_of(&worker).await.is_some() {
        assert!(Instant::now() < deadline, "the process was not stopped once its job ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    swarm.orchestrator.shutdown("done").await;
}

/// An input over the 16 MiB frame limit fails that request with a clear
/// code; the process and its channel stay up, and stop when idle as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_over_the_frame_limit_fails_alone() {
    let swarm = swarm(|plan| plan.idle_timeout = Some(Duration::from_millis(300)));
    let worker = AgentInstance::new("worker", "cap-big");
    let big = swarm.orchestrator.ask(&worker, "x".repeat(17 << 20), no_cancel()).await;
    let error = big.error.unwrap_or_else(|| panic!("the oversized input was accepted"));
    assert_eq!(error.code, "IPC_MESSAGE_TOO_LARGE", "{error:?}");
    let next = swarm.orchestrator.ask(&worker, "CASE:quick".to_owned(), no_cancel()).await;
    assert_eq!(next.response.as_deref(), Some("worker answer"), "{next:?}");
    assert_eq!(swarm.counter.counts(|c| c.starts), 1, "the same process answered");
    let deadline = Instant::now() + Duration::from_secs(10);
    while swarm.orchestrator.pid_of(&worker).await.is_some() {
        assert!(Instant::now() < deadline, "the idle process was not stopped (a lost job kept it busy)");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    swarm.orchestrator.shutdown("done").await;
}
