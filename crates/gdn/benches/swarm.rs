//! Swarm benchmark (issue 9): agent processes and the orchestrator.
//!
//! Run with `cargo bench -p gdn --bench swarm` (add `-- 50` for 50 runs).
//! Every figure is a median / p10 / p90 over the runs, all measured in one
//! run of this program so that they share the machine's noise:
//!
//! 1. spawn to ready: `Orchestrator::start_instance` of a fresh `worker@bN`
//!    instance (a `gdn __agent` process: connect, hello, init, load the
//!    bundle, open its store, build the agent, ready), beside the floors of
//!    spawning `/bin/true` and `gdn --version` (start to exit);
//! 2. idle memory of each started agent process (VmRSS, RssAnon and Pss
//!    from `/proc`), 20 ms after it said ready;
//! 3. the request round trip A→B→A without model time: the `duration` of
//!    the coordinator's `agents__request` call in its `tool.completed`
//!    event, with the worker already running (turns asked through the
//!    orchestrator built here) and cold (in `gdn run --input go`, where the
//!    request starts the worker's process), split into the worker's turn
//!    (its `turn.completed` `duration`) and the rest; beside the floor of a
//!    line sent through `cat` over pipes and back;
//! 4. whole `gdn run`s: `--input go` and `--input CASE:manage` on
//!    `tests/fixtures/swarm` (three agents, scripted models) and `--input x`
//!    on `examples/quickstart` (one agent), interleaved run by run.
//!
//! State roots and working directories are made under `/dev/shm` when it
//! exists (tmpfs), so that the disk does not weigh in.
//!
//! `-- --callgrind DIR [VALGRIND OPTIONS…]` instead runs one agent process
//! under `valgrind --tool=callgrind` (the orchestrator started here, as
//! usual) and leaves its profile in `DIR`: the first dump (`callgrind.out.1`)
//! counts the instructions from the process's start to its `ready`, the
//! last (`callgrind.out`) those from `ready` to its exit after `shutdown`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use goondan_ipc::AgentInstance;
use goondan_orchestrator::orchestrator::NoSwarmObserver;
use goondan_orchestrator::{AgentLauncher, Orchestrator};

mod common;
use common::{Report, coordinator_plan, ms, pipe_round_trip_floor, repo, scratch_base, tool_durations, turn_durations};

const GDN: &str = env!("CARGO_BIN_EXE_gdn");

fn fixture() -> PathBuf {
    repo().join("tests/fixtures/swarm")
}

fn quickstart() -> PathBuf {
    repo().join("examples/quickstart")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--load-bundle") {
        load_bundle_child();
        return;
    }
    if let Some(at) = args.iter().position(|a| a == "--callgrind") {
        let out = args.get(at + 1).map_or_else(|| PathBuf::from("callgrind"), PathBuf::from);
        callgrind(&out, args.get(at + 2..).unwrap_or_default());
        return;
    }
    let runs: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(30).max(1);
    let base = scratch_base();
    let scratch =
        tempfile::Builder::new().prefix("gdn-swarm-bench-").tempdir_in(&base).unwrap_or_else(|e| panic!("{e}"));
    let mut report = Report { text: String::new() };
    report.line(&format!(
        "swarm bench: {runs} runs; state roots and workdirs under {} ({})",
        base.display(),
        if base == Path::new("/dev/shm") { "tmpfs" } else { "not tmpfs" }
    ));
    report.line(&format!("  {:<60} {:>9} {:>9} {:>9}", "", "median", "p10", "p90"));

    let pipe_before = pipe_round_trip_floor(1000);
    in_process(runs, scratch.path(), &mut report, pipe_before);
    whole_runs(runs, scratch.path(), &mut report, pipe_before);
    let pipe_after = pipe_round_trip_floor(1000);
    report.line(&format!(
        "  floor: a line through `cat` over pipes and back (median of 1000): {:.1} µs before, {:.1} µs after",
        pipe_before * 1000.0,
        pipe_after * 1000.0
    ));
    report.print();
}

/// Sections 1–3 (warm): an orchestrator in this process.
fn in_process(runs: usize, scratch: &Path, report: &mut Report, pipe_floor: f64) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let Ok(runtime) = runtime else { panic!("runtime") };
    runtime.block_on(async {
        let state = scratch.join("orchestrated-state");
        let work = scratch.join("orchestrated-work");
        std::fs::create_dir_all(&state).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(&work).unwrap_or_else(|e| panic!("{e}"));
        let orchestrator = orchestrator(AgentLauncher::new(GDN, ["__agent"]), &state, &work);

        // 1 and 2: spawn to ready, floors interleaved; idle memory.
        let warmups = 2;
        let (mut ready, mut version, mut truth) = (Vec::new(), Vec::new(), Vec::new());
        let (mut rss, mut anon, mut pss) = (Vec::new(), Vec::new(), Vec::new());
        for run in 0..runs + warmups {
            let started = Instant::now();
            let status = Command::new("/bin/true").status().unwrap_or_else(|e| panic!("/bin/true: {e}"));
            let true_time = started.elapsed();
            assert!(status.success());
            let started = Instant::now();
            let status = Command::new(GDN)
                .arg("--version")
                .stdout(Stdio::null())
                .status()
                .unwrap_or_else(|e| panic!("gdn --version: {e}"));
            let version_time = started.elapsed();
            assert!(status.success());
            let instance = AgentInstance::new("worker", format!("b{run}"));
            let started = Instant::now();
            let pid = orchestrator.start_instance(&instance).await.unwrap_or_else(|e| panic!("{instance}: {e:?}"));
            let ready_time = started.elapsed();
            tokio::time::sleep(Duration::from_millis(20)).await;
            let memory = memory_kib(pid);
            if run >= warmups {
                truth.push(ms(true_time));
                version.push(ms(version_time));
                ready.push(ms(ready_time));
                rss.push(memory.rss as f64 / 1024.0);
                anon.push(memory.anon as f64 / 1024.0);
                pss.push(memory.pss as f64 / 1024.0);
            }
        }
        report.line("1. agent process spawn to ready (start_instance of a fresh worker@bN)");
        report.row("start_instance → ready", &ready, "ms", None);
        report.row("floor: spawn gdn --version, start to exit", &version, "ms", None);
        report.row("floor: spawn /bin/true, start to exit", &truth, "ms", None);
        let (schemas, base, first, again) = load_bundle_in_fresh_processes(runs);
        report.row("  in a fresh process: compile the spec schemas (once)", &schemas, "ms", None);
        report.row("  in a fresh process: load the built-in @goondan/base (once)", &base, "ms", None);
        report.row("  in a fresh process: then load_bundle(swarm fixture)", &first, "ms", None);
        report.row("  the same load_bundle again in that process", &again, "ms", None);
        report.line(&format!("2. idle agent process memory, 20 ms after ready ({} processes alive)", runs + warmups));
        report.row("VmRSS", &rss, "MiB", None);
        report.row("RssAnon (private)", &anon, "MiB", None);
        report.row("Pss (shared pages split between sharers)", &pss, "MiB", None);

        // 3 (warm): the worker is running when the coordinator asks it.
        let coordinator = AgentInstance::new("coordinator", "warm");
        let worker = AgentInstance::new("worker", "warm");
        orchestrator.start_instance(&coordinator).await.unwrap_or_else(|e| panic!("{e:?}"));
        orchestrator.start_instance(&worker).await.unwrap_or_else(|e| panic!("{e:?}"));
        let (_cancel, cancel_rx) = tokio::sync::watch::channel(false);
        let mut turns = Vec::new();
        for _ in 0..runs + warmups {
            let started = Instant::now();
            let answer = orchestrator.ask(&coordinator, "go".to_owned(), cancel_rx.clone()).await;
            turns.push(ms(started.elapsed()));
            assert_eq!(answer.response.as_deref(), Some("coordinator done"), "{answer:?}");
        }
        let requests = tool_durations(&state.join("instances/coordinator@warm/events.jsonl"), "agents__request");
        let worker_turns = turn_durations(&state.join("instances/worker@warm/events.jsonl"));
        assert_eq!(requests.len(), runs + warmups, "one request per turn");
        assert_eq!(worker_turns.len(), runs + warmups, "one worker turn per request");
        let requests = &requests[warmups..];
        let worker_turns = &worker_turns[warmups..];
        let rest: Vec<f64> = requests.iter().zip(worker_turns).map(|(r, t)| r - t).collect();
        report.line("3. request round trip A→B→A, model time excluded (scripted models)");
        report.line("   warm: worker@warm already running; turns asked through an orchestrator in the bench");
        report.row("agents__request duration (coordinator's tool.completed)", requests, "ms", Some(pipe_floor));
        report.row("  of it: the worker's turn (its turn.completed)", worker_turns, "ms", Some(pipe_floor));
        report.row("  of it: the rest (IPC, orchestrator, both agents)", &rest, "ms", Some(pipe_floor));
        report.row("the coordinator's whole turn, seen by ask()", &turns[warmups..], "ms", None);
        orchestrator.shutdown("bench done").await;
    });
}

fn orchestrator(launcher: AgentLauncher, state: &Path, work: &Path) -> Orchestrator {
    let plan = coordinator_plan(&fixture(), state.to_path_buf(), work.to_path_buf());
    Orchestrator::start(plan, launcher, Arc::new(NoSwarmObserver))
}

/// Section 3 (cold) and 4: whole `gdn run`s, interleaved.
fn whole_runs(runs: usize, scratch: &Path, report: &mut Report, pipe_floor: f64) {
    let warmups = 1;
    let (mut go, mut manage, mut single) = (Vec::new(), Vec::new(), Vec::new());
    let (mut requests, mut worker_turns) = (Vec::new(), Vec::new());
    for run in 0..runs + warmups {
        let state = scratch.join(format!("go-{run}"));
        let go_time = gdn_run(&fixture(), &state, &scratch.join(format!("go-work-{run}")), "go");
        // `gdn run` keeps them in the Swarm's workspace (`team`).
        let instances = state.join("workspaces/team/instances");
        let request = tool_durations(&instances.join("coordinator@default/events.jsonl"), "agents__request");
        let worker_turn = turn_durations(&instances.join("worker@default/events.jsonl"));
        let manage_time = gdn_run(
            &fixture(),
            &scratch.join(format!("manage-{run}")),
            &scratch.join(format!("m-work-{run}")),
            "CASE:manage",
        );
        let single_time =
            gdn_run(&quickstart(), &scratch.join(format!("qs-{run}")), &scratch.join(format!("qs-work-{run}")), "x");
        if run >= warmups {
            go.push(ms(go_time));
            manage.push(ms(manage_time));
            single.push(ms(single_time));
            requests.extend(request);
            worker_turns.extend(worker_turn);
        }
        for dir in ["go", "go-work", "manage", "m-work", "qs", "qs-work"] {
            let _ = std::fs::remove_dir_all(scratch.join(format!("{dir}-{run}")));
        }
    }
    let rest: Vec<f64> = requests.iter().zip(&worker_turns).map(|(r, t)| r - t).collect();
    report.line("   cold: in gdn run --input go, the request starts the worker's process");
    report.row("agents__request duration (coordinator's tool.completed)", &requests, "ms", Some(pipe_floor));
    report.row("  of it: the worker's turn (its turn.completed)", &worker_turns, "ms", Some(pipe_floor));
    report.row("  of it: the rest (worker spawn to ready, IPC)", &rest, "ms", Some(pipe_floor));
    report.line("4. whole gdn run, wall time (process start to exit)");
    report.row("swarm fixture --input go (coordinator, worker)", &go, "ms", None);
    report.row("swarm fixture --input CASE:manage (+ reviewer)", &manage, "ms", None);
    report.row("examples/quickstart --input x (one agent)", &single, "ms", None);
}

/// `gdn -c BUNDLE --state-root STATE run --workdir WORK --input INPUT`; its wall time.
fn gdn_run(bundle: &Path, state: &Path, work: &Path, input: &str) -> Duration {
    std::fs::create_dir_all(work).unwrap_or_else(|e| panic!("{e}"));
    let started = Instant::now();
    let output = Command::new(GDN)
        .arg("-c")
        .arg(bundle)
        .arg("--state-root")
        .arg(state)
        .arg("run")
        .arg("--workdir")
        .arg(work)
        .args(["--input", input])
        .env("NO_COLOR", "1")
        .env_remove("GOONDAN_STATE_ROOT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap_or_else(|e| panic!("gdn run: {e}"));
    let elapsed = started.elapsed();
    assert!(
        output.status.success(),
        "gdn -c {} run --input {input}: {}",
        bundle.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    elapsed
}

struct Memory {
    rss: u64,
    anon: u64,
    pss: u64,
}

/// VmRSS and RssAnon of `/proc/PID/status`, Pss of `/proc/PID/smaps_rollup` (KiB).
fn memory_kib(pid: u32) -> Memory {
    let field = |text: &str, name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    Memory { rss: field(&status, "VmRSS:"), anon: field(&status, "RssAnon:"), pss: field(&rollup, "Pss:") }
}

/// What loading the bundle costs a fresh process, in `runs` processes (this
/// program with `--load-bundle`): (spec schemas, @goondan/base, the fixture,
/// the fixture again) in ms.
fn load_bundle_in_fresh_processes(runs: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let me = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let (mut schemas, mut base, mut first, mut again) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let output = Command::new(&me).arg("--load-bundle").output().unwrap_or_else(|e| panic!("{e}"));
        let text = String::from_utf8_lossy(&output.stdout);
        let numbers: Vec<f64> = text.split_whitespace().filter_map(|n| n.parse().ok()).collect();
        let [a, b, c, d] = numbers[..] else { panic!("--load-bundle printed {text:?}") };
        schemas.push(a);
        base.push(b);
        first.push(c);
        again.push(d);
    }
    (schemas, base, first, again)
}

/// `--load-bundle`: times, in this fresh process, what an agent process's
/// `load_bundle` does once (compile the spec schemas, load the built-in
/// package), then loading the fixture, then loading it again.
fn load_bundle_child() {
    let started = Instant::now();
    let _ = goondan_config::schema::check_spec(goondan_config::Kind::Model, &serde_json::json!({}));
    let schemas = started.elapsed();
    let started = Instant::now();
    let _ = goondan_config::base_package();
    let base = started.elapsed();
    let started = Instant::now();
    let first_report = goondan_config::load_bundle(&fixture());
    let first = started.elapsed();
    assert!(first_report.valid_bundle().is_some());
    let started = Instant::now();
    let again_report = goondan_config::load_bundle(&fixture());
    let again = started.elapsed();
    assert!(again_report.valid_bundle().is_some());
    let line = format!("{} {} {} {}\n", ms(schemas), ms(base), ms(first), ms(again));
    let _ = std::io::stdout().write_all(line.as_bytes());
}

/// `--callgrind DIR`: one agent process under callgrind, dumped when it says ready.
fn callgrind(out: &Path, extra: &[String]) {
    std::fs::create_dir_all(out).unwrap_or_else(|e| panic!("{e}"));
    let out = std::fs::canonicalize(out).unwrap_or_else(|e| panic!("{e}"));
    let scratch = tempfile::Builder::new()
        .prefix("gdn-swarm-callgrind-")
        .tempdir_in(scratch_base())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut valgrind = vec![
        "--tool=callgrind".to_owned(),
        format!("--callgrind-out-file={}/callgrind.out", out.display()),
        "--dump-before=*AgentChannel::ready*".to_owned(),
    ];
    valgrind.extend(extra.iter().cloned());
    valgrind.extend([GDN.to_owned(), "__agent".to_owned()]);
    let launcher = AgentLauncher::new("valgrind", valgrind);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let Ok(runtime) = runtime else { panic!("runtime") };
    runtime.block_on(async {
        let orchestrator = orchestrator(launcher, scratch.path(), scratch.path());
        let instance = AgentInstance::new("worker", "callgrind");
        let started = Instant::now();
        let pid = orchestrator.start_instance(&instance).await.unwrap_or_else(|e| panic!("{e:?}"));
        let line = format!("agent process {pid} ready under callgrind after {:.0} ms\n", ms(started.elapsed()));
        let _ = std::io::stdout().write_all(line.as_bytes());
        orchestrator.shutdown("callgrind done").await;
    });
    let line = format!("profiles in {}\n", out.display());
    let _ = std::io::stdout().write_all(line.as_bytes());
}
