//! Resource bounds of a confined command (`spec.sandbox.limits`): how many
//! processes it may run at once, how large a file it may write, how much
//! memory it may take — so that one command (a fork bomb, `yes > file`, a
//! runaway build) cannot take the machine.
//!
//! [`Limits`] says what the bounds are. A [`Limiter`] is made once per
//! agent (in the parent, [`Limiter::prepare`]): it finds the best way this
//! machine offers, in this order,
//!
//! - **cgroup v2**, when `gdn`'s own cgroup delegates the `pids` / `memory`
//!   controllers to its children (they are in its `cgroup.subtree_control`
//!   and the directory is writable): one cgroup per command under it, with
//!   `pids.max`, `memory.max` and `memory.oom.group` (an out-of-memory kill
//!   ends the whole command);
//! - **cgroup v1**, when the `pids` / `memory` hierarchies are mounted and
//!   `gdn`'s cgroup in them is writable (typically as root): one cgroup per
//!   command under it in each, with `pids.max` and `memory.limit_in_bytes`;
//! - **rlimits** otherwise: `RLIMIT_NPROC` for the process count (only
//!   when the command has a user namespace of its own and `gdn` is not
//!   root: the kernel never enforces it for real uid 0, and outside an own
//!   user namespace it would count every process of the user), and
//!   `RLIMIT_DATA` for memory (per process; not `RLIMIT_AS`, which breaks
//!   runtimes that reserve large address ranges: WebAssembly memories,
//!   sanitizers).
//!
//! The file size is always `RLIMIT_FSIZE` (no cgroup bounds it): a write past
//! it fails with `EFBIG` after the kernel sends `SIGXFSZ`, whose default
//! action ends the process — `yes > file` ends by `SIGXFSZ` with the file at
//! the bound.
//!
//! Per command, [`Limiter::for_command`] (in the parent) creates the
//! command's cgroups and returns a [`CommandLimits`], whose
//! [`CommandLimits::apply_in_child`] runs in the child between `fork` and
//! `exec`: it only opens and writes prepared paths (`"0"` into each
//! `cgroup.procs` moves the writer itself) and calls `setrlimit`, with no
//! allocation. It must run after the command's user namespace is made
//! (`RLIMIT_NPROC` then counts only the namespace's processes) and before
//! Landlock and seccomp (which would refuse the cgroup writes).
//!
//! A command's cgroups are removed when it is over: [`CommandLimits::end`]
//! kills what remains in them and removes them; without it, dropping the
//! last handle removes them once empty, the next command of the agent
//! retries those still busy, and dropping the [`Limiter`] kills and removes
//! all of the agent's.

use goondan_core::sync::LockUnpoisoned;
use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The default bound on processes (and threads) of one command at once.
/// A normal build (`cargo build -j$(nproc)`, `npm install`, a test suite
/// with a thread per core) stays far below it; a fork bomb stops there.
pub const DEFAULT_PROCESSES: u32 = 4096;

/// The default bound on the size of one file a command writes: 4 GiB.
pub const DEFAULT_FILE_SIZE: u64 = 4 << 30;

/// The default memory bound is this share of the machine's memory
/// (`MemTotal`), in quarters: 3/4.
pub const DEFAULT_MEMORY_QUARTERS: u64 = 3;

/// The memory bound when the machine's memory cannot be read: 4 GiB.
pub const FALLBACK_MEMORY: u64 = 4 << 30;

/// The smallest memory bound a command can start under (a shell and a
/// little more): 16 MiB.
pub const MIN_MEMORY: u64 = 16 << 20;

/// The largest process bound the kernel takes (`PID_MAX_LIMIT`).
pub const MAX_PROCESSES: u32 = 4 << 20;

/// The bounds of one command; `None`: no bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// At most this many processes and threads at once, its own and its
    /// descendants' (default [`DEFAULT_PROCESSES`]).
    pub processes: Option<u32>,
    /// No file written larger than this many bytes (default
    /// [`DEFAULT_FILE_SIZE`]).
    pub file_size: Option<u64>,
    /// At most this many bytes of memory: all its processes together under
    /// a cgroup, each process's data segment under rlimits (default 3/4 of
    /// the machine's memory, see [`default_memory`]).
    pub memory: Option<u64>,
}

impl Default for Limits {
    /// The defaults: [`DEFAULT_PROCESSES`], [`DEFAULT_FILE_SIZE`],
    /// [`default_memory`].
    fn default() -> Self {
        Self { processes: Some(DEFAULT_PROCESSES), file_size: Some(DEFAULT_FILE_SIZE), memory: Some(default_memory()) }
    }
}

impl Limits {
    /// No bound at all.
    pub const NONE: Limits = Limits { processes: None, file_size: None, memory: None };

    /// Whether it bounds nothing.
    pub fn is_none(&self) -> bool {
        *self == Self::NONE
    }
}

impl fmt::Display for Limits {
    /// `processes 4096, file size 4 GiB, memory 17.6 GiB` (`unlimited` for
    /// a missing bound).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let processes = self.processes.map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
        let size = |bound: Option<u64>| bound.map_or_else(|| "unlimited".to_owned(), format_size);
        write!(f, "processes {processes}, file size {}, memory {}", size(self.file_size), size(self.memory))
    }
}

/// The default memory bound: 3/4 of the machine's memory (`MemTotal` of
/// `/proc/meminfo`), so that a command that takes all it may still leaves
/// the rest (and `gdn`) room; [`FALLBACK_MEMORY`] when it cannot be read.
pub fn default_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_total(&text))
        .map_or(FALLBACK_MEMORY, |total| (total / 4).saturating_mul(DEFAULT_MEMORY_QUARTERS).max(MIN_MEMORY))
}

/// `MemTotal` of `/proc/meminfo` text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|line| line.starts_with("MemTotal:"))?;
    let mut words = line.split_whitespace().skip(1);
    let number: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => number.checked_mul(1024),
        None => Some(number),
        Some(_) => None,
    }
}

/// `4 GiB`, `10 MiB`, `1.5 GiB`, `512 bytes`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if bytes >= size {
            if bytes.is_multiple_of(size) {
                return format!("{} {unit}", bytes / size);
            }
            // One decimal, rounded down: never more than the bound.
            let tenths = (u128::from(bytes) * 10 / u128::from(size)) as u64;
            return format!("{}.{} {unit}", tenths / 10, tenths % 10);
        }
    }
    format!("{bytes} bytes")
}

/// How one bound is enforced on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    /// A cgroup v2 controller (`pids.max`, `memory.max`).
    CgroupV2,
    /// A cgroup v1 hierarchy (`pids.max`, `memory.limit_in_bytes`).
    CgroupV1,
    /// A resource limit of each process (`RLIMIT_NPROC`, `RLIMIT_FSIZE`,
    /// `RLIMIT_DATA`).
    Rlimit,
    /// Nothing: no bound asked for, or none this machine can enforce.
    None,
}

impl fmt::Display for Enforcement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::CgroupV2 => "cgroup v2",
            Self::CgroupV1 => "cgroup v1",
            Self::Rlimit => "rlimit",
            Self::None => "not enforced",
        })
    }
}

/// A cgroup controller the limits use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Controller {
    Pids,
    Memory,
}

impl Controller {
    fn name(self) -> &'static str {
        match self {
            Self::Pids => "pids",
            Self::Memory => "memory",
        }
    }
}

/// One directory the command cgroups are made under, and what is written
/// into each.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hierarchy {
    /// `gdn`'s own cgroup in it.
    parent: PathBuf,
    version: Version,
    /// The controllers it bounds.
    controllers: Vec<Controller>,
    /// How `/proc/self/cgroup` names it and `gdn`'s cgroup in it: its
    /// line's controllers field (`pids`; empty for v2) and path (`/`).
    line: (String, String),
}

impl Hierarchy {
    /// The tail of the `/proc/<pid>/cgroup` line of a process in its
    /// cgroup `name`: `:pids:/goondan-…\n`.
    fn member_line(&self, name: &str) -> Vec<u8> {
        let (field, path) = &self.line;
        let path = path.trim_end_matches('/');
        format!(":{field}:{path}/{name}\n").into_bytes()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// What the machine offers, found from `/proc/self/cgroup` and
/// `/proc/self/mountinfo`: the usable hierarchy for each controller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Found {
    hierarchies: Vec<Hierarchy>,
}

impl Found {
    fn enforcing(&self, controller: Controller) -> Option<&Hierarchy> {
        self.hierarchies.iter().find(|hierarchy| hierarchy.controllers.contains(&controller))
    }
}

/// A resource limit set in the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resource {
    Processes,
    FileSize,
    Data,
}

/// One agent's way of bounding its commands, found once
/// ([`Limiter::prepare`]); it makes each command's cgroups
/// ([`Limiter::for_command`]) and removes what remains of them when dropped.
#[derive(Debug)]
pub struct Limiter {
    limits: Limits,
    processes: Enforcement,
    memory: Enforcement,
    /// The rlimits every command gets, clamped to the hard limits in force.
    rlimits: Vec<(Resource, u64)>,
    sets: Arc<CgroupSets>,
    /// Under cgroup v1: the thread that sits in the next command's cgroups
    /// (see [`PlacedThread`]).
    placed: Option<PlacedThread>,
}

impl Limiter {
    /// Finds how this machine can enforce `limits` (a few small files read;
    /// nothing is created until the first command, but for the thread that
    /// places itself in the first command's cgroups under cgroup v1).
    /// `own_user_namespace`: whether each command gets a user namespace of
    /// its own (then `RLIMIT_NPROC`, set after it is made, counts only the
    /// command's processes).
    pub fn prepare(limits: Limits, own_user_namespace: bool) -> Self {
        let found = if limits.processes.is_none() && limits.memory.is_none() {
            Found::default()
        } else {
            find_cgroups(Path::new("/proc/self/cgroup"), Path::new("/proc/self/mountinfo"))
        };
        let root = nix::unistd::getuid().is_root();
        let mut limiter = Self::with(limits, found, own_user_namespace && !root);
        let hierarchies = &limiter.sets.found.hierarchies;
        // Threads can sit in cgroups of their own only under v1.
        if !hierarchies.is_empty() && hierarchies.iter().all(|hierarchy| hierarchy.version == Version::V1) {
            limiter.placed = PlacedThread::start(Arc::clone(&limiter.sets));
        }
        limiter
    }

    fn with(limits: Limits, mut found: Found, nproc_counts: bool) -> Self {
        // Only the controllers with a bound to enforce.
        for hierarchy in &mut found.hierarchies {
            // Each cgroup a command joins costs a migration (under v1 it
            // waits for an RCU grace period: 5 to 10 ms after a pause): a
            // bound a free rlimit enforces as well takes none. RLIMIT_NPROC
            // counts a command's own processes where it has its own user
            // namespace and gdn is not root; a v1 memory cgroup is replaced
            // by RLIMIT_DATA (per process).
            let version = hierarchy.version;
            hierarchy.controllers.retain(|controller| match controller {
                Controller::Pids => limits.processes.is_some() && !nproc_counts,
                Controller::Memory => limits.memory.is_some() && version == Version::V2,
            });
        }
        found.hierarchies.retain(|hierarchy| !hierarchy.controllers.is_empty());
        let by_cgroup = |controller| {
            found.enforcing(controller).map(|hierarchy| match hierarchy.version {
                Version::V1 => Enforcement::CgroupV1,
                Version::V2 => Enforcement::CgroupV2,
            })
        };
        let processes = match (limits.processes, by_cgroup(Controller::Pids)) {
            (None, _) => Enforcement::None,
            (Some(_), Some(cgroup)) => cgroup,
            (Some(_), None) if nproc_counts => Enforcement::Rlimit,
            (Some(_), None) => Enforcement::None,
        };
        let memory = match (limits.memory, by_cgroup(Controller::Memory)) {
            (None, _) => Enforcement::None,
            (Some(_), Some(cgroup)) => cgroup,
            (Some(_), None) => Enforcement::Rlimit,
        };
        let mut rlimits = Vec::new();
        if let (Some(processes), Enforcement::Rlimit) = (limits.processes, processes) {
            rlimits.push((Resource::Processes, u64::from(processes)));
        }
        if let Some(size) = limits.file_size {
            rlimits.push((Resource::FileSize, size));
        }
        if let (Some(memory), Enforcement::Rlimit) = (limits.memory, memory) {
            rlimits.push((Resource::Data, memory));
        }
        for (resource, value) in &mut rlimits {
            if let Some(hard) = hard_limit(*resource) {
                *value = (*value).min(hard);
            }
        }
        if processes == Enforcement::None && limits.processes.is_some() {
            tracing::warn!(
                "sandbox limits: the process bound ({}) cannot be enforced here (no writable pids cgroup, and \
                 RLIMIT_NPROC does not apply: gdn runs as root or commands get no user namespace of their own)",
                limits.processes.unwrap_or_default()
            );
        }
        let shared: Arc<Shared> = Arc::default();
        // Its own among this process's limiters without a global counter:
        // where its state lives, and when it was made.
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let agent = (Arc::as_ptr(&shared) as usize as u64) ^ (nanos as u64);
        let sets = Arc::new(CgroupSets {
            limits,
            found,
            prefix: format!("goondan-{}-{agent:x}-", std::process::id()),
            next: AtomicU64::new(0),
            shared,
        });
        let limiter = Self { limits, processes, memory, rlimits, sets, placed: None };
        tracing::debug!("sandbox limits: {}", limiter.describe());
        limiter
    }

    /// The bounds.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// How the process bound is enforced.
    pub fn processes(&self) -> Enforcement {
        self.processes
    }

    /// How the memory bound is enforced.
    pub fn memory(&self) -> Enforcement {
        self.memory
    }

    /// How the file size bound is enforced (`RLIMIT_FSIZE`, or nothing).
    pub fn file_size(&self) -> Enforcement {
        if self.limits.file_size.is_some() { Enforcement::Rlimit } else { Enforcement::None }
    }

    /// `processes 4096 (cgroup v1), file size 4 GiB (rlimit), memory 17.6 GiB (cgroup v1)`.
    pub fn describe(&self) -> String {
        let part = |name: &str, bound: Option<String>, by: Enforcement| match bound {
            Some(bound) => format!("{name} {bound} ({by})"),
            None => format!("{name} unlimited"),
        };
        [
            part("processes", self.limits.processes.map(|n| n.to_string()), self.processes),
            part("file size", self.limits.file_size.map(format_size), self.file_size()),
            part("memory", self.limits.memory.map(format_size), self.memory),
        ]
        .join(", ")
    }

    /// The directories its commands' cgroups are made under (`gdn`'s own
    /// cgroup in each hierarchy used); empty under rlimits only.
    pub fn cgroup_parents(&self) -> Vec<PathBuf> {
        self.sets.found.hierarchies.iter().map(|hierarchy| hierarchy.parent.clone()).collect()
    }

    /// In the parent, before spawning a command: makes its cgroups (one
    /// `mkdir` and a write or two per hierarchy, or an emptied set of an
    /// earlier command) and returns what the child applies. Also removes
    /// the cgroups of earlier commands that have emptied since.
    pub fn for_command(&self) -> io::Result<CommandLimits> {
        let set = self.sets.take()?;
        Ok(self.command_limits(set))
    }

    /// As [`Limiter::for_command`], for a command that will be spawned on
    /// the [`PlacedThread`] ([`Limiter::run_placed`]): the cgroups the
    /// thread sits in, when there is one and they are not taken yet (the
    /// child then starts in them). Spawned elsewhere, the command still
    /// joins them, but the thread stays in them until its next spawn.
    pub fn for_placed_command(&self) -> io::Result<CommandLimits> {
        let set = match self.placed.as_ref().and_then(PlacedThread::take_set) {
            Some(set) => set,
            None => self.sets.take()?,
        };
        Ok(self.command_limits(set))
    }

    fn command_limits(&self, set: CgroupSet) -> CommandLimits {
        CommandLimits {
            lines: set.lines,
            procs: set.procs,
            dirs: set.dirs,
            rlimits: self.rlimits.clone(),
            shared: Arc::clone(&self.sets.shared),
        }
    }

    /// No bound at all: for the sandbox's one-time probe (`true`), which
    /// needs none and should not pay for joining cgroups.
    pub(crate) fn unbounded(&self) -> CommandLimits {
        CommandLimits {
            lines: Vec::new(),
            procs: Vec::new(),
            dirs: Vec::new(),
            rlimits: Vec::new(),
            shared: Arc::clone(&self.sets.shared),
        }
    }

    /// Runs `job` (a spawn) on the [`PlacedThread`], so that the child it
    /// forks starts in the cgroups the thread sits in instead of joining
    /// them; returns it when there is no such thread (then the caller runs
    /// it: the child joins its cgroups itself).
    pub(crate) fn run_placed(&self, job: SpawnJob) -> Result<(), SpawnJob> {
        match &self.placed {
            Some(placed) => placed.run(job),
            None => Err(job),
        }
    }

    /// Whether a [`PlacedThread`] serves its spawns.
    pub fn has_placed_thread(&self) -> bool {
        self.placed.is_some()
    }
}

/// A spawn to run on a [`PlacedThread`].
pub type SpawnJob = Box<dyn FnOnce() + Send>;

/// One cgroup per hierarchy, for one command at a time.
#[derive(Debug)]
struct CgroupSet {
    /// Per cgroup, the tail of a member's `/proc/<pid>/cgroup` line
    /// ([`Hierarchy::member_line`]): a child forked inside finds it there
    /// and need not join.
    lines: Vec<Vec<u8>>,
    /// `cgroup.procs` of each.
    procs: Vec<CString>,
    dirs: Vec<(PathBuf, Version)>,
}

/// Makes, keeps and reuses an agent's command cgroups; shared with its
/// [`PlacedThread`].
#[derive(Debug)]
struct CgroupSets {
    limits: Limits,
    found: Found,
    /// `goondan-<pid>-<agent>-`: the start of its cgroups' names.
    prefix: String,
    next: AtomicU64,
    shared: Arc<Shared>,
}

impl CgroupSets {
    /// A set for one command: an emptied one of an earlier command,
    /// settings and all (making and removing cgroups costs milliseconds),
    /// else new ones.
    fn take(&self) -> io::Result<CgroupSet> {
        let reused = self.shared.idle.lock_unpoisoned().pop();
        if let Some(idle) = reused {
            if idle.dirs.iter().all(|(dir, _)| members(dir).is_ok_and(|members| members.is_empty())) {
                return Ok(idle);
            }
            // Something joined it since: removed once empty, like any.
            let mut live = self.shared.live.lock_unpoisoned();
            for cgroup in live.iter_mut().filter(|cgroup| idle.dirs.iter().any(|(dir, _)| *dir == cgroup.dir)) {
                cgroup.released = true;
            }
        }
        self.sweep();
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}{number}", self.prefix);
        let mut made = CgroupSet { lines: Vec::new(), procs: Vec::new(), dirs: Vec::new() };
        for hierarchy in &self.found.hierarchies {
            let dir = hierarchy.parent.join(&name);
            std::fs::create_dir(&dir)?;
            let live = LiveCgroup { dir: dir.clone(), version: hierarchy.version, released: false };
            self.shared.live.lock_unpoisoned().push(live);
            made.dirs.push((dir.clone(), hierarchy.version));
            for (file, value) in self.settings(hierarchy) {
                match std::fs::write(dir.join(file), &value) {
                    Ok(()) => {}
                    // memory.oom.group is a refinement older kernels lack.
                    Err(_) if file == "memory.oom.group" => {}
                    Err(error) => {
                        return Err(io::Error::new(
                            error.kind(),
                            format!("writing {value} into {}: {error}", dir.join(file).display()),
                        ));
                    }
                }
            }
            let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a cgroup path with a NUL byte"))?;
            made.procs.push(procs);
            made.lines.push(hierarchy.member_line(&name));
        }
        Ok(made)
    }

    /// The files written into a command's cgroup of `hierarchy`.
    fn settings(&self, hierarchy: &Hierarchy) -> Vec<(&'static str, String)> {
        let mut settings = Vec::new();
        for controller in &hierarchy.controllers {
            match (controller, hierarchy.version) {
                (Controller::Pids, _) => {
                    if let Some(processes) = self.limits.processes {
                        settings.push(("pids.max", processes.to_string()));
                    }
                }
                (Controller::Memory, Version::V2) => {
                    if let Some(memory) = self.limits.memory {
                        settings.push(("memory.max", memory.to_string()));
                        settings.push(("memory.oom.group", "1".to_owned()));
                    }
                }
                (Controller::Memory, Version::V1) => {
                    if let Some(memory) = self.limits.memory {
                        settings.push(("memory.limit_in_bytes", memory.to_string()));
                    }
                }
            }
        }
        settings
    }

    /// Removes the cgroups of earlier commands whose handles are gone and
    /// which are empty now (a command made but not spawned yet is empty
    /// too: its handle keeps it).
    fn sweep(&self) {
        let mut live = self.shared.live.lock_unpoisoned();
        live.retain(|cgroup| !cgroup.released || !removed(&cgroup.dir));
    }
}

/// A thread of `gdn` that sits, under cgroup v1, in the cgroups the next
/// command will get, and forks the commands.
///
/// Moving a process into a cgroup (a write to `cgroup.procs`) takes the
/// kernel's cgroup threadgroup lock for writing, which waits for an RCU
/// grace period unless another migration happened a moment before: 5 to
/// 10 ms on an otherwise idle machine — paid by every command an agent runs
/// after the model's pause, if the command joined its cgroup itself. A
/// child starts in the cgroups of the thread that forks it, at no cost; so
/// this thread moves itself (v1 lets one thread of a process sit apart)
/// into a command's cgroups ahead of the command, off its path, forks it
/// there ([`Limiter::run_placed`]), and moves on into the next set. A
/// command confined but spawned elsewhere joins its cgroups itself, as
/// before: slower, never unbounded.
///
/// While it sits in a set, `cgroup.procs` there lists `gdn`'s own pid:
/// every reader of members skips it ([`members`]).
#[derive(Debug)]
struct PlacedThread {
    jobs: Mutex<std::sync::mpsc::Sender<PlacedJob>>,
    seat: Arc<Seat>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How long a command waits for the [`PlacedThread`] to finish moving into
/// its next set before it takes cgroups of its own (and joins them).
const SEAT_WAIT: Duration = Duration::from_millis(100);

/// Where the [`PlacedThread`] sits.
#[derive(Debug, Default)]
struct Seat {
    state: Mutex<SeatState>,
    changed: std::sync::Condvar,
}

#[derive(Debug, Default)]
struct SeatState {
    /// The set it sits in, not yet handed to a command.
    set: Option<CgroupSet>,
    /// It is moving into a set now.
    moving: bool,
}

impl Seat {
    fn update(&self, change: impl FnOnce(&mut SeatState)) {
        change(&mut self.state.lock_unpoisoned());
        self.changed.notify_all();
    }
}

enum PlacedJob {
    Spawn(SpawnJob),
    Stop,
}

impl PlacedThread {
    fn start(sets: Arc<CgroupSets>) -> Option<Self> {
        let (jobs, queue) = std::sync::mpsc::channel::<PlacedJob>();
        let seat = Arc::new(Seat { state: Mutex::new(SeatState { set: None, moving: true }), ..Seat::default() });
        let its_seat = Arc::clone(&seat);
        let thread = std::thread::Builder::new()
            .name("goondan-sandbox-spawn".to_owned())
            .spawn(move || placed_thread(&sets, &its_seat, &queue));
        match thread {
            Ok(thread) => Some(Self { jobs: Mutex::new(jobs), seat, thread: Some(thread) }),
            Err(error) => {
                tracing::debug!("sandbox limits: no thread to spawn commands from their cgroups: {error}");
                None
            }
        }
    }

    /// The set it sits in, for a command about to be spawned (on it); if
    /// it is moving into one now, once it is there (a move already under
    /// way is the quickest way in: one the command made itself would wait
    /// for it, then for its own), but at most [`SEAT_WAIT`].
    fn take_set(&self) -> Option<CgroupSet> {
        let state = self.seat.state.lock_unpoisoned();
        let (mut state, _) = self
            .seat
            .changed
            .wait_timeout_while(state, SEAT_WAIT, |state| state.set.is_none() && state.moving)
            .unwrap_or_else(PoisonError::into_inner);
        state.set.take()
    }

    fn run(&self, job: SpawnJob) -> Result<(), SpawnJob> {
        let jobs = self.jobs.lock_unpoisoned();
        jobs.send(PlacedJob::Spawn(job)).map_err(|std::sync::mpsc::SendError(job)| match job {
            PlacedJob::Spawn(job) => job,
            PlacedJob::Stop => Box::new(|| {}),
        })
    }
}

impl Drop for PlacedThread {
    /// Stops the thread; it leaves the command cgroups first.
    fn drop(&mut self) {
        let _ = self.jobs.lock_unpoisoned().send(PlacedJob::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The [`PlacedThread`]'s loop: sit in a set, fork what it is given,
/// move on into the next set once its own was handed out.
fn placed_thread(sets: &CgroupSets, seat: &Seat, queue: &std::sync::mpsc::Receiver<PlacedJob>) {
    let tid = nix::unistd::gettid().as_raw().to_string();
    let sit = || {
        seat.update(|state| state.moving = true);
        let mut placed = None;
        match sets.take() {
            Ok(set) => match move_thread(&tid, set.dirs.iter().map(|(dir, _)| dir.as_path())) {
                Ok(()) => placed = Some(set),
                Err(error) => {
                    tracing::debug!("sandbox limits: the spawning thread cannot enter a command's cgroups: {error}");
                    sets.shared.idle.lock_unpoisoned().push(set);
                }
            },
            Err(error) => tracing::debug!("sandbox limits: no cgroups for the next command: {error}"),
        }
        seat.update(|state| {
            state.moving = false;
            state.set = placed;
        });
    };
    sit();
    while let Ok(PlacedJob::Spawn(job)) = queue.recv() {
        // A panicking job must not end the thread others queue on.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        // Only once what it sat in was handed out: a set taken for a
        // command whose spawn is still queued stays where the spawn finds it.
        if seat.state.lock_unpoisoned().set.is_none() {
            sit();
        }
    }
    let home = sets.found.hierarchies.iter().map(|hierarchy| hierarchy.parent.as_path());
    if let Err(error) = move_thread(&tid, home) {
        tracing::warn!("sandbox limits: the spawning thread cannot leave the command cgroups: {error}");
    }
    // Its last set was never handed out: kept for a command (and removed
    // with the limiter).
    let left = seat.state.lock_unpoisoned().set.take();
    if let Some(set) = left {
        sets.shared.idle.lock_unpoisoned().push(set);
    }
}

/// Moves the thread `tid` into the v1 cgroups `dirs` (their `tasks`).
fn move_thread<'a>(tid: &str, dirs: impl Iterator<Item = &'a Path>) -> io::Result<()> {
    for dir in dirs {
        std::fs::write(dir.join("tasks"), tid)
            .map_err(|error| io::Error::new(error.kind(), format!("{}: {error}", dir.join("tasks").display())))?;
    }
    Ok(())
}

/// Whether `dir` is gone now (removed, or never there).
fn removed(dir: &Path) -> bool {
    match std::fs::remove_dir(dir) {
        Ok(()) => true,
        Err(error) => error.kind() == io::ErrorKind::NotFound,
    }
}

/// The command cgroups of one agent not removed yet.
#[derive(Debug, Default)]
struct Shared {
    live: Mutex<Vec<LiveCgroup>>,
    /// Sets of cgroups whose command ended with nothing left in them, kept
    /// for the next command (still in `live`, unreleased).
    idle: Mutex<Vec<CgroupSet>>,
}

#[derive(Debug)]
struct LiveCgroup {
    dir: PathBuf,
    version: Version,
    /// Its [`CommandLimits`] is dropped: removable once empty.
    released: bool,
}

impl Shared {
    fn forget(&self, dir: &Path) {
        self.live.lock_unpoisoned().retain(|cgroup| cgroup.dir != dir);
    }
}

impl Drop for Limiter {
    /// Kills what remains in the agent's command cgroups and removes them
    /// (once its spawning thread has left them).
    fn drop(&mut self) {
        drop(self.placed.take());
        let live = std::mem::take(&mut *self.sets.shared.live.lock_unpoisoned());
        for cgroup in live {
            if let Err(error) = kill_and_remove(&cgroup.dir, cgroup.version) {
                tracing::warn!("sandbox limits: cannot remove the cgroup {}: {error}", cgroup.dir.display());
            }
        }
    }
}

/// What one command's child applies to itself, made by
/// [`Limiter::for_command`].
#[derive(Debug)]
pub struct CommandLimits {
    /// Per cgroup, the tail of a member's `/proc/<pid>/cgroup` line.
    lines: Vec<Vec<u8>>,
    /// `cgroup.procs` of each of its cgroups.
    procs: Vec<CString>,
    dirs: Vec<(PathBuf, Version)>,
    rlimits: Vec<(Resource, u64)>,
    shared: Arc<Shared>,
}

impl CommandLimits {
    /// In the child, between `fork` and `exec`, after its user namespace is
    /// made and before Landlock and seccomp: joins the command's cgroups and
    /// sets its rlimits. Async-signal-safe: system calls on data prepared in
    /// the parent, no allocation (an error carries only its errno).
    pub fn apply_in_child(&self) -> io::Result<()> {
        if !self.procs.is_empty() {
            // Forked by the thread that sits in its cgroups, it is in them
            // already: a move would only wait for the kernel.
            let mut own = [0u8; 4096];
            let own = read_own_cgroups(&mut own);
            for (procs, line) in self.procs.iter().zip(&self.lines) {
                if !own.windows(line.len()).any(|window| window == line.as_slice()) {
                    join_cgroup(procs)?;
                }
            }
        }
        for &(resource, value) in &self.rlimits {
            set_rlimit(resource, value)?;
        }
        Ok(())
    }

    /// The command's cgroup directories (empty under rlimits only).
    pub fn cgroups(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|(dir, _)| dir.clone()).collect()
    }

    /// After the command's child has ended: kills whatever of the command
    /// still runs in its cgroups (what it left in the background) and
    /// removes them. Nothing to do under rlimits only.
    pub fn end(&self) -> io::Result<()> {
        let mut result = Ok(());
        for (dir, version) in &self.dirs {
            match kill_and_remove(dir, *version) {
                Ok(()) => self.shared.forget(dir),
                Err(error) => result = Err(error),
            }
        }
        result
    }

    /// Whether any process of the command still runs in its cgroups.
    pub fn running(&self) -> bool {
        self.dirs.iter().any(|(dir, _)| !members(dir).unwrap_or_default().is_empty())
    }
}

impl Drop for CommandLimits {
    /// Keeps its cgroups for the next command when they are empty (the
    /// command is over, or was never spawned); those still busy are removed
    /// by a later command's sweep once empty, or killed and removed with
    /// the [`Limiter`].
    fn drop(&mut self) {
        let empty = self.dirs.iter().all(|(dir, _)| members(dir).is_ok_and(|members| members.is_empty()));
        if empty && !self.dirs.is_empty() {
            let idle = CgroupSet {
                lines: std::mem::take(&mut self.lines),
                procs: std::mem::take(&mut self.procs),
                dirs: std::mem::take(&mut self.dirs),
            };
            self.shared.idle.lock_unpoisoned().push(idle);
            return;
        }
        let mut live = self.shared.live.lock_unpoisoned();
        live.retain_mut(|cgroup| {
            if !self.dirs.iter().any(|(dir, _)| *dir == cgroup.dir) {
                return true;
            }
            cgroup.released = true;
            !removed(&cgroup.dir)
        });
    }
}

/// In the child: `/proc/self/cgroup` read into `buffer` (what fits; empty
/// when it cannot be read, and then every cgroup is joined).
fn read_own_cgroups(buffer: &mut [u8]) -> &[u8] {
    let Ok(fd) = nix::fcntl::open(
        c"/proc/self/cgroup",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) else {
        return &[];
    };
    let mut filled = 0;
    while filled < buffer.len() {
        match buffer.get_mut(filled..).map(|rest| nix::unistd::read(&fd, rest)) {
            Some(Ok(0)) | None => break,
            Some(Ok(read)) => filled += read,
            Some(Err(nix::errno::Errno::EINTR)) => {}
            Some(Err(_)) => return &[],
        }
    }
    buffer.get(..filled).unwrap_or_default()
}

/// In the child: writes `0` into a `cgroup.procs` (moves the writer).
fn join_cgroup(procs: &CString) -> io::Result<()> {
    let fd = nix::fcntl::open(
        procs.as_c_str(),
        nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let written = nix::unistd::write(&fd, b"0")?;
    if written == 1 { Ok(()) } else { Err(io::Error::from_raw_os_error(libc::EIO)) }
}

/// In the child: soft and hard limit of `resource` to `value`.
fn set_rlimit(resource: Resource, value: u64) -> io::Result<()> {
    let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
    // SAFETY: setrlimit reads the struct it is given, nothing else.
    #[allow(unsafe_code)]
    let result = unsafe {
        match resource {
            Resource::Processes => libc::setrlimit(libc::RLIMIT_NPROC, &limit),
            Resource::FileSize => libc::setrlimit(libc::RLIMIT_FSIZE, &limit),
            Resource::Data => libc::setrlimit(libc::RLIMIT_DATA, &limit),
        }
    };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EPERM)))
    }
}

/// The hard limit of `resource` in force here (children inherit it and
/// cannot raise it); `None`: unlimited or unknown.
fn hard_limit(resource: Resource) -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given, nothing else.
    #[allow(unsafe_code)]
    let result = unsafe {
        match resource {
            Resource::Processes => libc::getrlimit(libc::RLIMIT_NPROC, &mut limit),
            Resource::FileSize => libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit),
            Resource::Data => libc::getrlimit(libc::RLIMIT_DATA, &mut limit),
        }
    };
    (result == 0 && limit.rlim_max != libc::RLIM_INFINITY).then_some(limit.rlim_max)
}

/// The process ids in the cgroup `dir`, `gdn`'s own aside: its spawning
/// thread may sit there (see [`PlacedThread`]), and it is never one of a
/// command's processes to wait for or kill.
fn members(dir: &Path) -> io::Result<Vec<i32>> {
    let own = i32::try_from(std::process::id()).unwrap_or(0);
    Ok(std::fs::read_to_string(dir.join("cgroup.procs"))?
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .filter(|pid| *pid != own)
        .collect())
}

/// Kills every process in the cgroup `dir` and removes it. Under v2 with
/// `cgroup.kill` (Linux 5.14+) in one write; otherwise the cgroup's
/// `pids.max` goes to 0 (no new process) and its members are killed
/// through pidfds, each confirmed a member after its pidfd is open (never
/// a process that took a recycled pid), until none remains.
fn kill_and_remove(dir: &Path, version: Version) -> io::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let killed_at_once = version == Version::V2 && std::fs::write(dir.join("cgroup.kill"), "1").is_ok();
    if !killed_at_once {
        let _ = std::fs::write(dir.join("pids.max"), "0");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pids = members(dir)?;
        if pids.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{} processes still run in {} after 5 s", pids.len(), dir.display()),
            ));
        }
        if !killed_at_once {
            let pidfds: Vec<(i32, OwnedFd)> = pids.iter().filter_map(|&pid| Some((pid, pidfd_open(pid)?))).collect();
            let still = members(dir)?;
            for (pid, pidfd) in &pidfds {
                if still.contains(pid) {
                    pidfd_kill(pidfd);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Removal can lag the last exit by a moment.
    let mut tries = 0;
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(error) if tries >= 100 => return Err(error),
            Err(_) => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// A pidfd for `pid` (Linux 5.3+); `None` when it is gone.
fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor,
    // owned from here on.
    #[allow(unsafe_code)]
    unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
        (fd >= 0).then(|| OwnedFd::from_raw_fd(fd as i32))
    }
}

/// SIGKILL through a pidfd (a process that has ended gets nothing).
fn pidfd_kill(pidfd: &OwnedFd) {
    // SAFETY: pidfd_send_signal on a descriptor we own, no siginfo.
    #[allow(unsafe_code)]
    unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), libc::SIGKILL, std::ptr::null::<u8>(), 0);
    }
}

/// The usable cgroup hierarchies for the pids and memory controllers.
fn find_cgroups(cgroup_file: &Path, mountinfo_file: &Path) -> Found {
    let (Ok(cgroups), Ok(mountinfo)) = (std::fs::read_to_string(cgroup_file), std::fs::read_to_string(mountinfo_file))
    else {
        return Found::default();
    };
    let found = usable_cgroups(&cgroups, &mountinfo, writable);
    sweep_stale(&found);
    found
}

/// Whether this process may make cgroups under `dir` and move processes
/// into them.
fn writable(dir: &Path) -> bool {
    use nix::unistd::{AccessFlags, access};
    access(dir, AccessFlags::W_OK | AccessFlags::X_OK).is_ok()
        && access(&dir.join("cgroup.procs"), AccessFlags::W_OK).is_ok()
}

/// From `/proc/self/cgroup` and `/proc/self/mountinfo` text: for `pids` and
/// `memory`, a cgroup v2 directory whose `cgroup.subtree_control` enables
/// the controller, else a cgroup v1 one; each `writable`.
fn usable_cgroups(cgroups: &str, mountinfo: &str, writable: impl Fn(&Path) -> bool) -> Found {
    let mounts = cgroup_mounts(mountinfo);
    let mut found = Found::default();
    let mut unified = None;
    let mut v1: Vec<(Vec<&str>, &str, &str)> = Vec::new();
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        if controllers.is_empty() {
            unified = Some(path);
        } else {
            v1.push((controllers.split(',').collect(), controllers, path));
        }
    }
    let mut missing = vec![Controller::Pids, Controller::Memory];
    if let Some(path) = unified
        && let Some(dir) = mounts.iter().filter(|m| m.version == Version::V2).find_map(|m| m.dir_of(path))
        && writable(&dir)
    {
        let enabled = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
        let enabled: Vec<&str> = enabled.split_whitespace().collect();
        let controllers: Vec<Controller> = missing.iter().copied().filter(|c| enabled.contains(&c.name())).collect();
        if !controllers.is_empty() {
            missing.retain(|c| !controllers.contains(c));
            let line = (String::new(), path.to_owned());
            found.hierarchies.push(Hierarchy { parent: dir, version: Version::V2, controllers, line });
        }
    }
    for controller in missing {
        let Some((_, field, path)) = v1.iter().find(|(names, _, _)| names.contains(&controller.name())) else {
            continue;
        };
        let Some(dir) = mounts
            .iter()
            .filter(|m| m.version == Version::V1 && m.options.iter().any(|option| option == controller.name()))
            .find_map(|m| m.dir_of(path))
        else {
            continue;
        };
        if !writable(&dir) {
            continue;
        }
        match found.hierarchies.iter_mut().find(|h| h.parent == dir) {
            Some(hierarchy) => hierarchy.controllers.push(controller),
            None => found.hierarchies.push(Hierarchy {
                parent: dir,
                version: Version::V1,
                controllers: vec![controller],
                line: ((*field).to_owned(), (*path).to_owned()),
            }),
        }
    }
    found
}

/// A mounted cgroup file system.
#[derive(Debug)]
struct CgroupMount {
    version: Version,
    /// Where in the hierarchy its root is (`/` but for bind mounts).
    root: PathBuf,
    point: PathBuf,
    /// Its super options (the controllers of a v1 hierarchy).
    options: Vec<String>,
}

impl CgroupMount {
    /// Where the cgroup `path` of this hierarchy is under the mount.
    fn dir_of(&self, path: &str) -> Option<PathBuf> {
        let relative = Path::new(path).strip_prefix(&self.root).ok()?;
        Some(if relative.as_os_str().is_empty() { self.point.clone() } else { self.point.join(relative) })
    }
}

/// The cgroup mounts of mountinfo text.
fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let mut right = right.split(' ');
            let version = match right.next()? {
                "cgroup2" => Version::V2,
                "cgroup" => Version::V1,
                _ => return None,
            };
            let _source = right.next()?;
            let options = right.next().unwrap_or_default().split(',').map(str::to_owned).collect();
            Some(CgroupMount {
                version,
                root: PathBuf::from(unescape(left.get(3)?)),
                point: PathBuf::from(unescape(left.get(4)?)),
                options,
            })
        })
        .collect()
}

/// A mountinfo field with its `\040`-style escapes undone.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let octal = bytes.get(index + 1..index + 4).filter(|digits| digits.iter().all(|d| (b'0'..=b'7').contains(d)));
        match (bytes[index], octal) {
            (b'\\', Some(digits)) => {
                out.push(digits.iter().fold(0u8, |value, digit| value.wrapping_mul(8).wrapping_add(digit - b'0')));
                index += 4;
            }
            (byte, _) => {
                out.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Removes the empty command cgroups a `gdn` that has ended left behind
/// (`goondan-<pid>-…` where no process `<pid>` runs).
fn sweep_stale(found: &Found) {
    for hierarchy in &found.hierarchies {
        let Ok(entries) = std::fs::read_dir(&hierarchy.parent) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|name| name.strip_prefix("goondan-")?.split('-').next()) else {
                continue;
            };
            let Ok(pid) = pid.parse::<u32>() else { continue };
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO_V1: &str = "\
25 30 0:23 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
26 25 0:24 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
29 25 0:27 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
33 25 0:31 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
35 25 0:33 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const CGROUP_V1: &str = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/e3f8\n1:cpu:/\n0::/\n";

    #[test]
    fn mem_total_is_read_in_bytes() {
        assert_eq!(mem_total("MemTotal:       24683656 kB\nMemFree: 1 kB\n"), Some(24683656 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        assert!(default_memory() >= MIN_MEMORY);
    }

    #[test]
    fn sizes_are_shown_in_binary_units_never_rounded_up() {
        assert_eq!(format_size(4 << 30), "4 GiB");
        assert_eq!(format_size(10 << 20), "10 MiB");
        assert_eq!(format_size((3 << 30) / 2), "1.5 GiB");
        assert_eq!(format_size((1 << 30) - 1), "1023.9 MiB");
        assert_eq!(format_size(512), "512 bytes");
        let limits = Limits { processes: Some(64), file_size: Some(10 << 20), memory: None };
        assert_eq!(limits.to_string(), "processes 64, file size 10 MiB, memory unlimited");
    }

    #[test]
    fn mountinfo_escapes_and_bind_mounted_roots_are_understood() {
        let mounts = cgroup_mounts(
            "40 1 0:50 /docker/abc /sys/fs/cgroup\\040x rw - cgroup2 cgroup2 rw,nsdelegate\n41 1 0:5 / /proc rw - proc proc rw\n",
        );
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].point, PathBuf::from("/sys/fs/cgroup x"));
        assert_eq!(mounts[0].dir_of("/docker/abc/sub"), Some(PathBuf::from("/sys/fs/cgroup x/sub")));
        assert_eq!(mounts[0].dir_of("/docker/abc"), Some(PathBuf::from("/sys/fs/cgroup x")));
        assert_eq!(mounts[0].dir_of("/elsewhere"), None);
    }

    /// A fake cgroup tree: v1 pids and memory writable, an unified hierarchy
    /// with no controllers (this machine's layout).
    #[test]
    fn v1_hierarchies_are_used_when_v2_delegates_nothing() -> io::Result<()> {
        let root = tempfile::tempdir()?;
        let base = root.path();
        for dir in ["pids", "memory/process_api/e3f8", "unified"] {
            std::fs::create_dir_all(base.join(dir))?;
        }
        std::fs::write(base.join("unified/cgroup.subtree_control"), "")?;
        let mountinfo = MOUNTINFO_V1.replace("/sys/fs/cgroup", &base.display().to_string());
        let found = usable_cgroups(CGROUP_V1, &mountinfo, |_| true);
        assert_eq!(
            found.hierarchies,
            [
                Hierarchy {
                    parent: base.join("pids"),
                    version: Version::V1,
                    controllers: vec![Controller::Pids],
                    line: ("pids".to_owned(), "/".to_owned()),
                },
                Hierarchy {
                    parent: base.join("memory/process_api/e3f8"),
                    version: Version::V1,
                    controllers: vec![Controller::Memory],
                    line: ("memory".to_owned(), "/process_api/e3f8".to_owned()),
                },
            ]
        );
        let nothing = usable_cgroups(CGROUP_V1, &mountinfo, |_| false);
        assert_eq!(nothing, Found::default(), "not writable: not used");

        // As root (RLIMIT_NPROC does not apply): the v1 pids cgroup; the
        // memory bound by RLIMIT_DATA, which costs no migration.
        let limits = Limits { processes: Some(64), file_size: None, memory: Some(1 << 30) };
        let limiter = Limiter::with(limits, found.clone(), false);
        assert_eq!((limiter.processes(), limiter.memory()), (Enforcement::CgroupV1, Enforcement::Rlimit));
        assert_eq!(limiter.rlimits, [(Resource::Data, 1 << 30)]);
        let command = limiter.for_command()?;
        let dirs = command.cgroups();
        assert_eq!(dirs.len(), 1);
        assert_eq!(std::fs::read_to_string(dirs[0].join("pids.max"))?, "64");
        assert!(dirs[0].starts_with(base.join("pids")));
        // Where RLIMIT_NPROC counts the command's own processes, no cgroup.
        let limiter = Limiter::with(limits, found, true);
        assert_eq!((limiter.processes(), limiter.memory()), (Enforcement::Rlimit, Enforcement::Rlimit));
        assert!(limiter.for_command()?.cgroups().is_empty());
        Ok(())
    }

    #[test]
    fn a_delegated_v2_cgroup_is_preferred_and_gets_both_controllers() -> io::Result<()> {
        let root = tempfile::tempdir()?;
        let base = root.path();
        std::fs::create_dir_all(base.join("unified/user.slice/gdn"))?;
        std::fs::write(base.join("unified/user.slice/gdn/cgroup.subtree_control"), "cpu memory pids\n")?;
        let mountinfo = format!("35 25 0:33 / {}/unified rw,relatime - cgroup2 cgroup2 rw\n", base.display());
        let found = usable_cgroups("0::/user.slice/gdn\n", &mountinfo, |_| true);
        let parent = base.join("unified/user.slice/gdn");
        assert_eq!(
            found.hierarchies,
            [Hierarchy {
                parent: parent.clone(),
                version: Version::V2,
                controllers: vec![Controller::Pids, Controller::Memory],
                line: (String::new(), "/user.slice/gdn".to_owned()),
            }]
        );
        let limiter = Limiter::with(
            Limits { processes: Some(10), file_size: Some(1 << 20), memory: Some(1 << 30) },
            found,
            false,
        );
        assert_eq!((limiter.processes(), limiter.memory()), (Enforcement::CgroupV2, Enforcement::CgroupV2));
        let command = limiter.for_command()?;
        let [dir] = command.cgroups().try_into().unwrap_or_else(|dirs: Vec<PathBuf>| panic!("{dirs:?}"));
        assert_eq!(std::fs::read_to_string(dir.join("pids.max"))?, "10");
        assert_eq!(std::fs::read_to_string(dir.join("memory.max"))?, (1u64 << 30).to_string());
        assert_eq!(std::fs::read_to_string(dir.join("memory.oom.group"))?, "1");
        assert_eq!(command.rlimits, [(Resource::FileSize, 1 << 20)]);

        // Controllers available but not enabled for children (gdn's cgroup
        // holds processes): not delegated.
        std::fs::write(parent.join("cgroup.subtree_control"), "")?;
        let found = usable_cgroups("0::/user.slice/gdn\n", &mountinfo, |_| true);
        assert_eq!(found, Found::default());
        Ok(())
    }

    #[test]
    fn without_cgroups_rlimits_bound_what_they_can() {
        let limits = Limits { processes: Some(100), file_size: Some(1 << 20), memory: Some(1 << 30) };
        let own_namespace = Limiter::with(limits, Found::default(), true);
        assert_eq!(own_namespace.processes(), Enforcement::Rlimit);
        assert_eq!(own_namespace.memory(), Enforcement::Rlimit);
        let kinds: Vec<Resource> = own_namespace.rlimits.iter().map(|(resource, _)| *resource).collect();
        assert_eq!(kinds, [Resource::Processes, Resource::FileSize, Resource::Data]);
        // As root, or without an own user namespace, RLIMIT_NPROC would
        // not bound the command's own processes: not set.
        let root = Limiter::with(limits, Found::default(), false);
        assert_eq!(root.processes(), Enforcement::None);
        let kinds: Vec<Resource> = root.rlimits.iter().map(|(resource, _)| *resource).collect();
        assert_eq!(kinds, [Resource::FileSize, Resource::Data]);
        assert!(root.describe().contains("processes 100 (not enforced)"), "{}", root.describe());
        let none = Limiter::with(Limits::NONE, Found::default(), true);
        assert!(none.rlimits.is_empty());
        assert_eq!(none.describe(), "processes unlimited, file size unlimited, memory unlimited");
    }
}
