//! Resource bounds of confined commands, with real processes: a fork bomb
//! is held to its process bound, `yes > file` ends by `SIGXFSZ` at the file
//! bound, memory past its bound ends the command, ordinary work (cargo,
//! node, bun, a hundred background jobs) passes under the defaults, and
//! what a command leaves behind is killed and its cgroups removed.
//!
//! The limits are applied here by a `pre_exec` of the test's own, in the
//! order the sandbox applies them: a user namespace of the command's own
//! (root mapped to 1000, as the sandbox does), then
//! [`CommandLimits::apply_in_child`]. As root the process bound is a pids
//! cgroup (the kernel never enforces `RLIMIT_NPROC` for real uid 0); the
//! same scenarios run as an unprivileged user (`nobody`, through
//! `setpriv`), where `RLIMIT_NPROC` bounds the command's own processes.
//!
//! Every fork bomb here runs with a low bound (64), inside a safety pids
//! cgroup when one can be made, under an outer timeout, and is killed with
//! its whole process group and cgroup afterwards: a failing bound cannot
//! take the machine.

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use goondan_sandbox::{CommandLimits, Enforcement, Limiter, Limits, Policy, Sandbox, SandboxSpec};
use nix::sched::CloneFlags;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

const MIB: u64 = 1 << 20;
/// The classic, with the shell kept waiting while it runs.
const FORK_BOMB: &str = ":(){ :|:& };:; sleep 30";
/// Forks (children that sleep 3 s) until a fork fails, at most 1000; prints how many.
const FORKS: &str = r#"/usr/bin/python3 -c '
import os, time
n = 0
while n < 1000:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    n += 1
print(n)
'"#;
/// Set (to the scenario) when this binary runs as the unprivileged helper.
const HELPER_ENV: &str = "GOONDAN_LIMITS_HELPER";

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Where the limits are applied in the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    /// As the sandbox does: after the command's own user namespace.
    After,
    /// Before it (`RLIMIT_NPROC` then counts all the user's processes).
    Before,
    /// No namespace at all.
    None,
}

/// Sets up `command` as the sandbox would: its own user and mount
/// namespace (root mapped to 1000), its own process group, and `limits`.
fn confine(command: &mut Command, limits: Arc<CommandLimits>, order: Order) {
    let (uid, gid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
    let inner = |id: u32| if id == 0 { 1000 } else { id };
    let uid_map = format!("{} {uid} 1\n", inner(uid)).into_bytes();
    let gid_map = format!("{} {gid} 1\n", inner(gid)).into_bytes();
    command.process_group(0);
    // SAFETY: system calls on data prepared before the fork; nothing is
    // allocated in the child (errors carry only their errno).
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            if order == Order::Before {
                limits.apply_in_child()?;
            }
            if order != Order::None {
                nix::sched::unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS)?;
                write_file(c"/proc/self/setgroups", b"deny")?;
                write_file(c"/proc/self/uid_map", &uid_map)?;
                write_file(c"/proc/self/gid_map", &gid_map)?;
            }
            if order == Order::Before { Ok(()) } else { limits.apply_in_child() }
        });
    }
}

fn write_file(path: &std::ffi::CStr, content: &[u8]) -> std::io::Result<()> {
    let fd = nix::fcntl::open(path, nix::fcntl::OFlag::O_WRONLY, nix::sys::stat::Mode::empty())?;
    nix::unistd::write(&fd, content)?;
    Ok(())
}

/// How a command ended: its status (`None`: killed at the timeout), its
/// output, and the most tasks seen at once in its cgroups (or, without
/// cgroups, of the user beyond `baseline`).
#[derive(Debug)]
struct Ended {
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
    peak: usize,
    /// The command's cgroups (removed by now).
    cgroups: Vec<PathBuf>,
}

impl Ended {
    fn success(&self) -> bool {
        self.status.is_some_and(|status| status.success())
    }
}

/// Runs `bash -c script` in `dir` with `limits`, for at most `timeout`;
/// then kills its process group and whatever remains in its cgroups.
fn run(script: &str, dir: &Path, limits: &Limiter, timeout: Duration) -> Ended {
    let command_limits = match limits.for_command() {
        Ok(made) => Arc::new(made),
        Err(error) => panic!("making the command's cgroups: {error}"),
    };
    let mut command = Command::new("/bin/bash");
    command.arg("-c").arg(script).current_dir(dir).stdin(Stdio::null());
    confine(&mut command, Arc::clone(&command_limits), Order::After);
    let ended = run_command(command, &command_limits, timeout);
    drop(command_limits);
    ended
}

fn run_command(mut command: Command, limits: &CommandLimits, timeout: Duration) -> Ended {
    let out = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(error) => panic!("{error}"),
    };
    let (stdout, stderr) = (out.path().join("stdout"), out.path().join("stderr"));
    let file = |path: &Path| match std::fs::File::create(path) {
        Ok(file) => file,
        Err(error) => panic!("{error}"),
    };
    command.stdout(file(&stdout)).stderr(file(&stderr));
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => panic!("spawning: {error}"),
    };
    let started = Instant::now();
    let mut peak = 0;
    // Without cgroups: the tasks in the command's own user namespace.
    let namespace = std::fs::read_link(format!("/proc/{}/ns/user", child.id())).ok();
    let status = loop {
        let tasks = if limits.cgroups().is_empty() {
            namespace.as_deref().map_or(0, namespace_tasks)
        } else {
            limits.cgroups().iter().map(|dir| cgroup_tasks(dir)).max().unwrap_or(0)
        };
        peak = peak.max(tasks);
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() > timeout => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(error) => panic!("waiting: {error}"),
        }
    };
    // The whole group (and with it a fork bomb's processes), then the
    // cgroups (whatever left the group).
    let group = Pid::from_raw(child.id() as i32);
    for _ in 0..50 {
        if killpg(group, Signal::SIGKILL).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    if let Err(error) = limits.end() {
        panic!("ending the command's cgroups: {error}");
    }
    let read = |path: &Path| {
        let mut text = String::new();
        let _ = std::fs::File::open(path).and_then(|mut file| file.read_to_string(&mut text));
        text
    };
    Ended { status, stdout: read(&stdout), stderr: read(&stderr), peak, cgroups: limits.cgroups() }
}

/// The tasks (processes and threads) in the cgroup `dir`.
fn cgroup_tasks(dir: &Path) -> usize {
    if let Ok(current) = std::fs::read_to_string(dir.join("pids.current"))
        && let Ok(current) = current.trim().parse()
    {
        return current;
    }
    std::fs::read_to_string(dir.join("tasks"))
        .or_else(|_| std::fs::read_to_string(dir.join("cgroup.threads")))
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

/// The tasks (processes and threads) in the user namespace `namespace`
/// (`user:[…]`), machine-wide.
fn namespace_tasks(namespace: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    entries
        .flatten()
        .filter(|entry| entry.file_name().to_str().is_some_and(|name| name.bytes().all(|b| b.is_ascii_digit())))
        .filter(|entry| std::fs::read_link(entry.path().join("ns/user")).is_ok_and(|link| link == namespace))
        .map(|entry| std::fs::read_dir(entry.path().join("task")).map(|tasks| tasks.count()).unwrap_or(1))
        .sum()
}

fn temp() -> tempfile::TempDir {
    match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(error) => panic!("{error}"),
    }
}

fn bun() -> Option<PathBuf> {
    let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/js/node_modules/.bin/bun");
    if local.exists() {
        return Some(local);
    }
    std::env::var_os("PATH")?.to_str()?.split(':').map(|dir| Path::new(dir).join("bun")).find(|path| path.exists())
}

fn on_path(program: &str) -> bool {
    Command::new(program).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// How the bound on processes is enforced for root here: a pids cgroup,
/// or nothing (then the fork bombs are not run: nothing would hold them).
fn process_bound_enforced(limiter: &Limiter) -> bool {
    limiter.processes() != Enforcement::None
}

#[test]
fn the_mechanism_found_here_is_the_best_the_machine_offers() {
    let limiter = Limiter::prepare(Limits::default(), true);
    let described = limiter.describe();
    assert_eq!(limiter.file_size(), Enforcement::Rlimit, "{described}");
    let pids_v1 = Path::new("/sys/fs/cgroup/pids/cgroup.procs");
    if is_root() && pids_v1.exists() {
        assert_eq!(limiter.processes(), Enforcement::CgroupV1, "{described}");
    }
    if !is_root() && limiter.cgroup_parents().is_empty() {
        assert_eq!(limiter.processes(), Enforcement::Rlimit, "{described}");
        assert_eq!(limiter.memory(), Enforcement::Rlimit, "{described}");
    }
}

#[test]
fn a_fork_bomb_is_held_to_its_process_bound_and_ends_with_its_cgroup() {
    let limits = Limits { processes: Some(64), file_size: Some(64 * MIB), memory: Some(1 << 30) };
    let limiter = Limiter::prepare(limits, true);
    if !process_bound_enforced(&limiter) {
        // Root without a writable pids cgroup: nothing holds a fork bomb.
        assert!(is_root(), "{}", limiter.describe());
        return;
    }
    let dir = temp();
    let bomb = run(FORK_BOMB, dir.path(), &limiter, Duration::from_secs(4));
    assert!(!bomb.success(), "{bomb:?}");
    assert!(bomb.peak <= 64, "the bomb reached {} tasks: {}", bomb.peak, limiter.describe());
    assert!(bomb.peak >= 32, "the bomb never neared its bound ({} tasks): {bomb:?}", bomb.peak);
    // Its cgroups are gone with it, and the machine still answers.
    assert!(!bomb.cgroups.is_empty());
    for dir in &bomb.cgroups {
        assert!(!dir.exists(), "{} remains", dir.display());
    }
    let after = run("echo fine", dir.path(), &limiter, Duration::from_secs(10));
    assert_eq!((after.success(), after.stdout.as_str()), (true, "fine\n"), "{after:?}");
}

#[test]
fn yes_into_a_file_ends_by_sigxfsz_at_the_file_bound() {
    let limiter = Limiter::prepare(Limits { file_size: Some(10 * MIB), ..Limits::default() }, true);
    let dir = temp();
    // The shell itself ends by the signal when `yes` is what it runs.
    let ended = run("exec yes > out", dir.path(), &limiter, Duration::from_secs(30));
    assert_eq!(ended.status.and_then(|status| status.signal()), Some(libc::SIGXFSZ), "{ended:?}");
    let size = std::fs::metadata(dir.path().join("out")).map(|meta| meta.len()).unwrap_or(u64::MAX);
    assert_eq!(size, 10 * MIB);
    // Otherwise it reports 128 + SIGXFSZ, and says why.
    let ended = run("yes > out2", dir.path(), &limiter, Duration::from_secs(30));
    assert_eq!(ended.status.and_then(|status| status.code()), Some(128 + libc::SIGXFSZ), "{ended:?}");
    assert!(ended.stderr.contains("File size limit exceeded"), "{ended:?}");
    assert_eq!(std::fs::metadata(dir.path().join("out2")).map(|meta| meta.len()).ok(), Some(10 * MIB));
}

#[test]
fn ordinary_work_passes_under_the_defaults() {
    let limiter = Limiter::prepare(Limits::default(), true);
    let dir = temp();
    let mut scripts = vec![
        "for i in $(seq 100); do true & done; wait".to_owned(),
        "for i in $(seq 200); do sleep 0.3 & done; wait".to_owned(),
        "head -c 100M /dev/zero > big && test $(stat -c %s big) = 104857600".to_owned(),
    ];
    if on_path("cargo") {
        scripts.push("cargo --version".to_owned());
    }
    if on_path("node") {
        scripts.push("node -e 1".to_owned());
        scripts.push("node -e 'const b = Buffer.alloc(512 << 20, 1); console.log(b.length)'".to_owned());
    }
    if let Some(bun) = bun() {
        scripts.push(format!("{} -e 1", bun.display()));
        scripts.push(format!("{} -e 'const b = Buffer.alloc(512 << 20, 1); console.log(b.length)'", bun.display()));
    }
    for script in &scripts {
        let ended = run(script, dir.path(), &limiter, Duration::from_secs(60));
        assert!(ended.success(), "{script} failed under {}: {ended:?}", limiter.describe());
    }
}

#[test]
fn memory_past_its_bound_ends_the_command() {
    let limiter = Limiter::prepare(Limits { memory: Some(128 * MIB), ..Limits::default() }, true);
    let dir = temp();
    // `tail -n 1` keeps a line without newlines whole in memory.
    let small = run("head -c 16M /dev/zero | tail -n 1 | wc -c", dir.path(), &limiter, Duration::from_secs(30));
    assert!(small.success(), "{small:?}");
    let large =
        run("set -o pipefail; head -c 1G /dev/zero | tail -n 1 | wc -c", dir.path(), &limiter, Duration::from_secs(60));
    assert!(large.status.is_some() && !large.success(), "{} : {large:?}", limiter.describe());
}

#[test]
fn what_a_command_leaves_running_is_killed_when_it_ends() {
    let limiter = Limiter::prepare(Limits::default(), true);
    if limiter.cgroup_parents().is_empty() {
        return; // Without cgroups the process group is all there is.
    }
    let dir = temp();
    let limits = match limiter.for_command() {
        Ok(made) => Arc::new(made),
        Err(error) => panic!("{error}"),
    };
    let mut command = Command::new("/bin/bash");
    // Its own process group: out of the reach of a kill of the command's.
    command.arg("-c").arg("set -m; sleep 300 >/dev/null 2>&1 & echo $!").current_dir(dir.path()).stdin(Stdio::null());
    command.stdout(Stdio::piped());
    confine(&mut command, Arc::clone(&limits), Order::After);
    let output = match command.output() {
        Ok(output) => output,
        Err(error) => panic!("{error}"),
    };
    drop(command);
    let pid: i32 = String::from_utf8_lossy(&output.stdout).trim().parse().unwrap_or(0);
    assert!(pid > 0, "{output:?}");
    assert!(alive(pid), "the background sleep ended early");
    assert!(limits.running());
    if let Err(error) = limits.end() {
        panic!("{error}");
    }
    assert!(!alive(pid), "the background sleep {pid} survived its command's end");
    for dir in limits.cgroups() {
        assert!(!dir.exists(), "{} remains", dir.display());
    }
}

#[test]
fn dropping_the_limiter_kills_and_removes_every_command_cgroup() {
    let limiter = Limiter::prepare(Limits::default(), true);
    if limiter.cgroup_parents().is_empty() {
        return;
    }
    let dir = temp();
    let mut pids = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..3 {
        let limits = match limiter.for_command() {
            Ok(made) => Arc::new(made),
            Err(error) => panic!("{error}"),
        };
        dirs.extend(limits.cgroups());
        let mut command = Command::new("/bin/bash");
        command
            .arg("-c")
            .arg("set -m; sleep 300 >/dev/null 2>&1 & echo $!")
            .current_dir(dir.path())
            .stdout(Stdio::piped());
        confine(&mut command, limits, Order::After);
        let output = match command.output() {
            Ok(output) => output,
            Err(error) => panic!("{error}"),
        };
        pids.push(String::from_utf8_lossy(&output.stdout).trim().parse::<i32>().unwrap_or(0));
    }
    // Each handle is gone: busy cgroups stay until their last process.
    assert!(dirs.iter().all(|dir| dir.exists()));
    drop(limiter);
    for pid in pids {
        assert!(pid > 0 && !alive(pid), "{pid} survived its agent");
    }
    for dir in dirs {
        assert!(!dir.exists(), "{} remains", dir.display());
    }
}

#[test]
fn an_ended_commands_cgroups_serve_the_next_command_and_go_with_the_agent() {
    let limiter = Limiter::prepare(Limits::default(), true);
    if limiter.cgroup_parents().is_empty() {
        return;
    }
    let dir = temp();
    let limits = match limiter.for_command() {
        Ok(made) => Arc::new(made),
        Err(error) => panic!("{error}"),
    };
    let first = limits.cgroups();
    let mut command = Command::new("/bin/bash");
    command.arg("-c").arg("sleep 0.3").current_dir(dir.path());
    confine(&mut command, limits, Order::After);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => panic!("{error}"),
    };
    drop(command);
    assert!(first.iter().all(|dir| dir.exists()), "removed while its command runs");
    let _ = child.wait();
    // Its handle went while it ran: the next command's preparation sweeps it.
    let next = match limiter.for_command() {
        Ok(made) => made,
        Err(error) => panic!("{error}"),
    };
    assert!(first.iter().all(|dir| !dir.exists()), "{first:?} remain");
    let second = next.cgroups();
    // Dropped empty: kept, settings and all, for the next command.
    drop(next);
    assert!(second.iter().all(|dir| dir.exists()), "{second:?} were removed");
    let third = match limiter.for_command() {
        Ok(made) => made,
        Err(error) => panic!("{error}"),
    };
    assert_eq!(third.cgroups(), second, "an empty set was not reused");
    drop(third);
    drop(limiter);
    assert!(second.iter().all(|dir| !dir.exists()), "{second:?} outlived their agent");
}

/// The sandbox itself (its own root, Landlock, seccomp) with its
/// `limits`: the bounds hold inside it.
#[test]
fn the_bounds_hold_inside_the_sandbox() {
    let dir = temp();
    let workdir = match std::fs::canonicalize(dir.path()) {
        Ok(path) => path,
        Err(error) => panic!("{error}"),
    };
    let sandbox = Sandbox::new(SandboxSpec {
        policy: Policy::WorkspaceWrite,
        workdir: workdir.clone(),
        limits: Limits { file_size: Some(10 * MIB), processes: Some(16), ..Limits::default() },
        ..SandboxSpec::default()
    });
    let run = |script: &str| {
        let mut command = Command::new("/bin/bash");
        command.arg("-c").arg(script).current_dir(&workdir).stdin(Stdio::null());
        sandbox.confine(&mut command).map(|()| command.output())
    };
    match run("exec yes > out") {
        Err(error) => {
            // No Landlock here: the sandbox refuses every command.
            assert!(error.to_string().contains("cannot be enforced"), "{error}");
            return;
        }
        Ok(output) => {
            let output = output.unwrap_or_else(|error| panic!("{error}"));
            assert_eq!(output.status.signal(), Some(libc::SIGXFSZ), "{output:?}");
        }
    }
    assert_eq!(std::fs::metadata(workdir.join("out")).map(|meta| meta.len()).ok(), Some(10 * MIB));
    // Forks stop at the bound; what they started goes with the sandbox.
    let forks = FORKS;
    let output = match run(forks) {
        Ok(output) => output.unwrap_or_else(|error| panic!("{error}")),
        Err(error) => panic!("{error}"),
    };
    let forked: u32 = String::from_utf8_lossy(&output.stdout).trim().parse().unwrap_or(u32::MAX);
    assert!(forked < 16, "{forked} processes forked under a bound of 16: {output:?}");
}

/// As root under cgroup v1, a command confined with `confine_placed` and
/// spawned through `spawn_placed` starts in cgroups of its own, made ahead
/// of it (no move on its path), under its bound — one set per command,
/// even with commands still running — and the sandbox's spawning thread
/// sitting in those cgroups never makes `gdn` itself a member to wait for
/// or kill.
#[test]
fn a_command_spawned_on_the_placed_thread_starts_in_cgroups_of_its_own_under_its_bound() {
    let pids_v1 = Path::new("/sys/fs/cgroup/pids/cgroup.procs");
    let dir = temp();
    let workdir = std::fs::canonicalize(dir.path()).unwrap_or_else(|error| panic!("{error}"));
    let sandbox = Arc::new(Sandbox::new(SandboxSpec {
        policy: Policy::WorkspaceWrite,
        workdir: workdir.clone(),
        limits: Limits { processes: Some(16), ..Limits::default() },
        ..SandboxSpec::default()
    }));
    sandbox.warm_up();
    let deadline = Instant::now() + Duration::from_secs(30);
    while sandbox.temp_dir().is_none() {
        assert!(Instant::now() < deadline, "the sandbox was never set up");
        std::thread::sleep(Duration::from_millis(5));
    }
    let spawn = |script: &str| {
        let mut command = Command::new("/bin/bash");
        command.arg("-c").arg(script).current_dir(&workdir).stdin(Stdio::null()).stdout(Stdio::piped());
        sandbox.confine_placed(&mut command).unwrap_or_else(|error| panic!("{error}"));
        let (sent, spawned) = std::sync::mpsc::channel();
        let job: goondan_sandbox::SpawnJob = Box::new(move || {
            let child = command.spawn();
            let _ = sent.send(child.map(|child| (command, child)));
        });
        let placed = match sandbox.spawn_placed(job) {
            Ok(()) => true,
            Err(job) => {
                job();
                false
            }
        };
        let spawned = spawned.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|error| panic!("{error}"));
        (placed, spawned.unwrap_or_else(|error| panic!("{error}")))
    };
    let pids_cgroup = |text: &str| {
        text.lines().find_map(|line| line.split_once(":pids:").map(|(_, path)| path.to_owned())).unwrap_or_default()
    };
    let own = pids_cgroup(&std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default());
    // Two at once, then one after a pause: three sets.
    let mut seen = Vec::new();
    let mut running = Vec::new();
    for pause in [Duration::ZERO, Duration::ZERO, Duration::from_millis(100)] {
        std::thread::sleep(pause);
        let (placed, (command, mut child)) = spawn("cat /proc/self/cgroup; sleep 0.3");
        if is_root() && pids_v1.exists() {
            assert!(placed, "no spawning thread as root under cgroup v1");
        }
        let mut text = String::new();
        let _ = child.stdout.take().map(|mut out| out.read_to_string(&mut text));
        seen.push((placed, pids_cgroup(&text)));
        running.push((command, child));
    }
    for (_, child) in &mut running {
        let _ = child.wait();
    }
    if is_root() && pids_v1.exists() {
        for (_, cgroup) in &seen {
            assert!(cgroup.contains("/goondan-"), "the command ran in {cgroup:?}, not a cgroup of its own");
        }
        let distinct: std::collections::BTreeSet<&String> = seen.iter().map(|(_, cgroup)| cgroup).collect();
        assert_eq!(distinct.len(), 3, "commands shared cgroups: {seen:?}");
        // The spawning thread sits in the next command's set, never in ours.
        let now = pids_cgroup(&std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default());
        assert_eq!(now, own, "the test's own thread moved");
    }
    drop(running);
    // Its bound holds on the spawning thread's path too.
    let (_, (command, child)) = spawn(FORKS);
    let output = child.wait_with_output().unwrap_or_else(|error| panic!("{error}"));
    let forked: u32 = String::from_utf8_lossy(&output.stdout).trim().parse().unwrap_or(u32::MAX);
    assert!(forked < 16, "{forked} processes forked under a bound of 16: {output:?}");
    // The sandbox goes (its commands hold it), with its cgroups and what
    // ran in them; this process (whose thread sat in them) lives on.
    drop(command);
    drop(sandbox);
    if is_root() && pids_v1.exists() {
        let base = Path::new("/sys/fs/cgroup/pids").join(own.trim_start_matches('/'));
        for (_, cgroup) in &seen {
            let name = cgroup.rsplit('/').next().unwrap_or_default();
            assert!(!base.join(name).exists(), "{cgroup} outlived its sandbox");
        }
    }
}

fn alive(pid: i32) -> bool {
    // A zombie nobody reaps yet counts as ended.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')))
}

/// As `nobody`: no cgroup is writable, so `RLIMIT_NPROC` (set after the
/// command's own user namespace is made) bounds the command's own
/// processes, and `RLIMIT_DATA` its memory. Runs this binary again under
/// `setpriv`, inside a pids cgroup of 512 as a safety net.
#[test]
fn as_an_unprivileged_user_rlimits_bound_the_commands_own_processes() {
    if !is_root() || !Path::new("/usr/bin/setpriv").exists() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else { panic!("current exe") };
    let safety = Limiter::prepare(Limits { processes: Some(512), file_size: None, memory: None }, false);
    let limits = match safety.for_command() {
        Ok(made) => Arc::new(made),
        Err(error) => panic!("{error}"),
    };
    let dir = temp();
    let _ = std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777));
    let mut command = Command::new("/usr/bin/setpriv");
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&exe)
        .args(["unprivileged_helper", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(HELPER_ENV, dir.path())
        .env("HOME", dir.path())
        .current_dir(dir.path());
    confine(&mut command, Arc::clone(&limits), Order::None);
    let ended = run_command(command, &limits, Duration::from_secs(120));
    assert!(ended.success(), "the unprivileged helper failed:\n{}\n{}", ended.stdout, ended.stderr);
    assert!(ended.stdout.contains("helper: all passed"), "{}\n{}", ended.stdout, ended.stderr);
}

/// Not a test: the body of the one above, run as `nobody`.
#[test]
#[ignore = "run by as_an_unprivileged_user_rlimits_bound_the_commands_own_processes as nobody"]
fn unprivileged_helper() {
    let Some(dir) = std::env::var_os(HELPER_ENV).map(PathBuf::from) else { return };
    assert!(!is_root());
    let limits = Limits { processes: Some(64), file_size: Some(10 * MIB), memory: None };
    let limiter = Limiter::prepare(limits, true);
    assert_eq!(limiter.processes(), Enforcement::Rlimit, "{}", limiter.describe());

    // The user's other processes do not count: 100 sleeps outside, then
    // 30 background jobs under a bound of 64 in the command's namespace.
    let mut sleepers: Vec<std::process::Child> =
        (0..100).filter_map(|_| Command::new("sleep").arg("60").spawn().ok()).collect();
    assert_eq!(sleepers.len(), 100);
    let jobs = run("for i in $(seq 30); do sleep 0.2 & done; wait", &dir, &limiter, Duration::from_secs(30));
    assert!(jobs.success(), "own processes only: {jobs:?}");
    // Set before the namespace is made, the bound would count them all
    // (why apply_in_child comes after the user namespace).
    let before = match limiter.for_command() {
        Ok(made) => Arc::new(made),
        Err(error) => panic!("{error}"),
    };
    let mut command = Command::new("/bin/bash");
    command.arg("-c").arg("for i in $(seq 30); do sleep 0.2 & done; wait").current_dir(&dir);
    confine(&mut command, Arc::clone(&before), Order::Before);
    let early = run_command(command, &before, Duration::from_secs(30));
    assert!(!early.success() || early.stderr.contains("fork"), "rlimit before the namespace: {early:?}");
    for sleeper in &mut sleepers {
        let _ = sleeper.kill();
        let _ = sleeper.wait();
    }

    let bomb = run(FORK_BOMB, &dir, &limiter, Duration::from_secs(4));
    assert!(bomb.peak <= 64, "the bomb reached {} tasks", bomb.peak);
    assert!(bomb.peak >= 32, "the bomb never neared its bound: {bomb:?}");

    let yes = run("exec yes > out", &dir, &limiter, Duration::from_secs(30));
    assert_eq!(yes.status.and_then(|status| status.signal()), Some(libc::SIGXFSZ), "{yes:?}");
    assert_eq!(std::fs::metadata(dir.join("out")).map(|meta| meta.len()).ok(), Some(10 * MIB));

    // Memory under RLIMIT_DATA: runtimes that reserve address space start
    // under the default; a process past the bound fails.
    let defaults = Limiter::prepare(Limits::default(), true);
    assert_eq!(defaults.memory(), Enforcement::Rlimit);
    let mut scripts = vec!["for i in $(seq 40); do true & done; wait".to_owned()];
    if on_path("node") {
        scripts.push("node -e 'const b = Buffer.alloc(512 << 20, 1); console.log(b.length)'".to_owned());
    }
    if let Some(bun) = bun() {
        scripts.push(format!("{} -e 'const b = Buffer.alloc(512 << 20, 1); console.log(b.length)'", bun.display()));
    }
    for script in &scripts {
        let ended = run(script, &dir, &defaults, Duration::from_secs(60));
        assert!(ended.success(), "{script} under {}: {ended:?}", defaults.describe());
    }
    let small = Limiter::prepare(Limits { memory: Some(128 * MIB), ..Limits::default() }, true);
    let large = run("set -o pipefail; head -c 1G /dev/zero | tail -n 1 | wc -c", &dir, &small, Duration::from_secs(60));
    assert!(large.status.is_some() && !large.success(), "{large:?}");
    #[allow(clippy::print_stdout)]
    {
        println!("helper: all passed ({})", limiter.describe());
    }
}
