//! What the sandbox adds to a command: `bash__exec` of `true` through the
//! native handler, unconfined (`full`) and under `workspace-write`, in the
//! same run (issue 24: under 1 ms added at the median). Plus the bare cost
//! the sandbox adds to a spawn (`std::process::Command` of `/bin/true`).
//!
//! `cargo bench -p goondan-base --bench sandbox_exec`

use std::path::Path;
use std::sync::Arc;

use goondan_base::BaseSettings;
use goondan_core::JsonObject;
use goondan_sandbox::{Policy, Sandbox, SandboxSpec};
use goondan_test_support::{call_scope, tool_context};
use goondan_tools::{ToolContext, ToolOutput};

fn main() {
    divan::main();
}

struct Fixture {
    _dir: tempfile::TempDir,
    ctx: ToolContext,
    runtime: tokio::runtime::Runtime,
    input: JsonObject,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let ctx = tool_context(call_scope("bench", "bench", dir.path()), "bash__exec");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| panic!("{e}"));
    let mut input = JsonObject::new();
    input.insert("command".to_owned(), "true".into());
    // The login shell reads the home's profile when it can, which the
    // sandbox forbids: with no home to read, both runs do the same work.
    input.insert("env".to_owned(), serde_json::json!({"HOME": "/nonexistent"}));
    Fixture { _dir: dir, ctx, runtime, input }
}

fn spec(policy: Policy, workdir: &Path) -> SandboxSpec {
    SandboxSpec { policy, workdir: workdir.to_path_buf(), ..SandboxSpec::default() }
}

fn sandbox(policy: Policy, workdir: &Path) -> Arc<Sandbox> {
    Arc::new(Sandbox::new(spec(policy, workdir)))
}

fn exec_true(bencher: divan::Bencher, policy: Policy) {
    let fixture = fixture();
    let settings =
        Arc::new(BaseSettings { sandbox: Some(sandbox(policy, fixture.ctx.workdir())), ..BaseSettings::default() });
    let Some(handler) = goondan_base::native_handler("bash", "exec", &settings) else { panic!("no bash.exec") };
    let call = || {
        let result = fixture.runtime.block_on(handler.call(&fixture.ctx, &fixture.input));
        if !matches!(&result, Ok(ToolOutput::Value(output)) if output["exitCode"] == 0) {
            panic!("true failed: {result:?}");
        }
    };
    call(); // sets the sandbox up (once per agent) outside the timing
    bencher.bench_local(call);
}

/// The first `bash__exec` of `true` of an agent under `workspace-write`:
/// the sandbox set up (paths, ruleset, filters, root, limits), tried once
/// on `true`, then the call, as an agent process's first command pays.
#[divan::bench(sample_count = 100)]
fn bash_exec_workspace_write_first(bencher: divan::Bencher) {
    let fixture = fixture();
    bencher
        .with_inputs(|| {
            let settings = Arc::new(BaseSettings {
                sandbox: Some(sandbox(Policy::WorkspaceWrite, fixture.ctx.workdir())),
                ..BaseSettings::default()
            });
            goondan_base::native_handler("bash", "exec", &settings).unwrap_or_else(|| panic!("no bash.exec"))
        })
        .bench_local_values(|handler| {
            let result = fixture.runtime.block_on(handler.call(&fixture.ctx, &fixture.input));
            if !matches!(&result, Ok(ToolOutput::Value(output)) if output["exitCode"] == 0) {
                panic!("true failed: {result:?}");
            }
            handler
        });
}

/// The same first call of an agent whose sandbox was warmed up at
/// assembly (`Sandbox::warm_up`, as agents that run turns do) and had the
/// time a model request takes to finish it: what the first tool call of a
/// turn pays.
#[divan::bench(sample_count = 100)]
fn bash_exec_workspace_write_first_warmed(bencher: divan::Bencher) {
    let fixture = fixture();
    bencher
        .with_inputs(|| {
            let sandbox = sandbox(Policy::WorkspaceWrite, fixture.ctx.workdir());
            sandbox.warm_up();
            while sandbox.temp_dir().is_none() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let settings = Arc::new(BaseSettings { sandbox: Some(sandbox), ..BaseSettings::default() });
            goondan_base::native_handler("bash", "exec", &settings).unwrap_or_else(|| panic!("no bash.exec"))
        })
        .bench_local_values(|handler| {
            let result = fixture.runtime.block_on(handler.call(&fixture.ctx, &fixture.input));
            if !matches!(&result, Ok(ToolOutput::Value(output)) if output["exitCode"] == 0) {
                panic!("true failed: {result:?}");
            }
            handler
        });
}

/// `bash__exec` of `true` under `workspace-write`, each call after a pause
/// of 50 ms (not timed), as an agent's commands come between model
/// requests: what a pause costs a command that moves into a cgroup (the
/// kernel then waits for an RCU grace period) shows here, and not in the
/// back-to-back benches.
#[divan::bench(sample_count = 100, sample_size = 1)]
fn bash_exec_workspace_write_after_pause(bencher: divan::Bencher) {
    let fixture = fixture();
    let settings = Arc::new(BaseSettings {
        sandbox: Some(sandbox(Policy::WorkspaceWrite, fixture.ctx.workdir())),
        ..BaseSettings::default()
    });
    let handler = goondan_base::native_handler("bash", "exec", &settings).unwrap_or_else(|| panic!("no bash.exec"));
    let call = || {
        let result = fixture.runtime.block_on(handler.call(&fixture.ctx, &fixture.input));
        if !matches!(&result, Ok(ToolOutput::Value(output)) if output["exitCode"] == 0) {
            panic!("true failed: {result:?}");
        }
    };
    call();
    bencher.with_inputs(|| std::thread::sleep(std::time::Duration::from_millis(50))).bench_local_values(|()| call());
}

/// `bash__exec` of `true`, unconfined.
#[divan::bench(sample_count = 200)]
fn bash_exec_full(bencher: divan::Bencher) {
    exec_true(bencher, Policy::Full);
}

/// `bash__exec` of `true` under `workspace-write`.
#[divan::bench(sample_count = 200)]
fn bash_exec_workspace_write(bencher: divan::Bencher) {
    exec_true(bencher, Policy::WorkspaceWrite);
}

fn spawn_true(bencher: divan::Bencher, sandbox: Option<&Sandbox>) {
    let run = || {
        let mut command = std::process::Command::new("/bin/true");
        if let Some(sandbox) = sandbox {
            sandbox.confine(&mut command).unwrap_or_else(|e| panic!("{e}"));
        }
        let status = command.status().unwrap_or_else(|e| panic!("{e}"));
        assert!(status.success());
    };
    run();
    bencher.bench_local(run);
}

/// A bare spawn of `/bin/true`, unconfined.
#[divan::bench(sample_count = 200)]
fn spawn_unconfined(bencher: divan::Bencher) {
    spawn_true(bencher, None);
}

/// A bare spawn of `/bin/true` under `workspace-write` (namespaces,
/// Landlock, seccomp).
#[divan::bench(sample_count = 200)]
fn spawn_workspace_write(bencher: divan::Bencher) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let sandbox = sandbox(Policy::WorkspaceWrite, dir.path());
    spawn_true(bencher, Some(&sandbox));
}

/// The same with no resource bounds (no cgroup to join, no rlimit): what
/// the bounds cost.
#[divan::bench(sample_count = 200)]
fn spawn_workspace_write_unbounded(bencher: divan::Bencher) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let limits = goondan_sandbox::Limits { processes: None, file_size: None, memory: None };
    let sandbox = Sandbox::new(SandboxSpec { limits, ..spec(Policy::WorkspaceWrite, dir.path()) });
    spawn_true(bencher, Some(&sandbox));
}

/// The same without namespaces (Landlock and seccomp only).
#[divan::bench(sample_count = 200)]
fn spawn_landlock_only(bencher: divan::Bencher) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let sandbox = Sandbox::new(spec(Policy::WorkspaceWrite, dir.path())).landlock_only();
    spawn_true(bencher, Some(&sandbox));
}

/// A heap the size of an agent process's (its idle VmRSS is ~13 MiB, more
/// with a long conversation), touched so that its pages are mapped: a
/// confined spawn forks (std takes its posix_spawn path only without a
/// `pre_exec` hook), and a fork copies the page tables of all of it.
fn agent_sized_heap(mib: usize) -> Vec<u8> {
    let mut heap = vec![0u8; mib << 20];
    for page in heap.chunks_mut(4096) {
        page[0] = 1;
    }
    heap
}

/// A bare spawn of `/bin/true` from a process with `mib` MiB of heap,
/// under `workspace-write` when `confined`, else unconfined.
fn spawn_with_heap(bencher: divan::Bencher, mib: usize, confined: bool) {
    let heap = agent_sized_heap(mib);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let sandbox = confined.then(|| sandbox(Policy::WorkspaceWrite, dir.path()));
    spawn_true(bencher, sandbox.as_deref());
    drop(heap);
}

/// A bare spawn of `/bin/true`, unconfined, from a process with 16 MiB of heap.
#[divan::bench(sample_count = 200)]
fn spawn_unconfined_16_mib_heap(bencher: divan::Bencher) {
    spawn_with_heap(bencher, 16, false);
}

/// The same under `workspace-write`.
#[divan::bench(sample_count = 200)]
fn spawn_workspace_write_16_mib_heap(bencher: divan::Bencher) {
    spawn_with_heap(bencher, 16, true);
}

/// Unconfined, from a process with 64 MiB of heap.
#[divan::bench(sample_count = 100)]
fn spawn_unconfined_64_mib_heap(bencher: divan::Bencher) {
    spawn_with_heap(bencher, 64, false);
}

/// Under `workspace-write`, from a process with 64 MiB of heap.
#[divan::bench(sample_count = 100)]
fn spawn_workspace_write_64_mib_heap(bencher: divan::Bencher) {
    spawn_with_heap(bencher, 64, true);
}
