//! Named fault points on the durable writes of an event's path, for the
//! crash and full-disk tests only.
//!
//! Without the `fault-injection` feature (every release build) both
//! functions are empty and inlined away. With it, `GOONDAN_FAULT` names
//! what happens at which point, comma-separated:
//!
//! ```text
//! GOONDAN_FAULT=<point>:<action>[:<nth>][,…]
//!   point   inbox.accept | inbox.start | inbox.done | conversation.commit | instance.info
//!           | task.update | service.status | service.log | events.log
//!           | registry.tarball | registry.metadata | package.unpack | package.install
//!           | package.lockfile | * (every point)
//!   action  crash   right after the nth write at the point succeeded: SIGKILL to the
//!                   service (GOONDAN_ORCHESTRATOR_PID, when this is an agent process)
//!                   and to this process — what `kill -9` leaves on disk
//!           enospc  the nth write at the point fails with ENOSPC (nth 0: every write)
//!           full    every write at the point fails with ENOSPC while the file named
//!                   by GOONDAN_FAULT_FULL exists (a disk that fills and is freed)
//!           panic   the nth write at the point panics the thread that writes (a bug
//!                   in a writer: what a service does when its inbox's writer ends)
//!   nth     counted per process from 1 (default 1)
//! ```
//!
//! This is the one place in this crate that looks at the environment and
//! signals processes: it exists only in test builds.

/// Where a write on an event's path happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// The inbox appends accepted events (group commit).
    InboxAccept,
    /// The inbox records that a turn starts.
    InboxStart,
    /// The inbox records how a turn ended.
    InboxDone,
    /// A commit of a conversation's message log.
    ConversationCommit,
    /// An instance's instance.json.
    InstanceInfo,
    /// A task's record.
    TaskUpdate,
    /// The service's status file.
    ServiceStatus,
    /// A line of the service's own log (standard error).
    ServiceLog,
    /// An instance's runtime event log.
    EventsLog,
    /// The registry stores a published tarball.
    RegistryTarball,
    /// The registry stores a packument.
    RegistryMetadata,
    /// An installer has unpacked a package beside its place (not yet in it).
    PackageUnpack,
    /// An installer has renamed a package into its place.
    PackageInstall,
    /// A package command has renamed the lockfile into place (the
    /// manifest not yet).
    PackageLockfile,
}

impl Point {
    /// The point's name in `GOONDAN_FAULT`.
    pub fn name(self) -> &'static str {
        match self {
            Self::InboxAccept => "inbox.accept",
            Self::InboxStart => "inbox.start",
            Self::InboxDone => "inbox.done",
            Self::ConversationCommit => "conversation.commit",
            Self::InstanceInfo => "instance.info",
            Self::TaskUpdate => "task.update",
            Self::ServiceStatus => "service.status",
            Self::ServiceLog => "service.log",
            Self::EventsLog => "events.log",
            Self::RegistryTarball => "registry.tarball",
            Self::RegistryMetadata => "registry.metadata",
            Self::PackageUnpack => "package.unpack",
            Self::PackageInstall => "package.install",
            Self::PackageLockfile => "package.lockfile",
        }
    }
}

/// Before a write at `point`: `Err(ENOSPC)` when the test says this write fails.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn before_write(_point: Point) -> std::io::Result<()> {
    Ok(())
}

/// After a write at `point` succeeded: the process (and its service) is
/// killed here when the test says so.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn after_write(_point: Point) {}

#[cfg(feature = "fault-injection")]
pub use injected::{after_write, before_write};

#[cfg(feature = "fault-injection")]
mod injected {
    use crate::sync::LockUnpoisoned;
    use std::sync::Mutex;
    use std::sync::OnceLock;

    use super::Point;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Action {
        Crash,
        Enospc,
        Full,
        Panic,
    }

    #[derive(Debug)]
    struct Rule {
        point: String,
        action: Action,
        nth: u64,
    }

    struct Faults {
        rules: Vec<Rule>,
        /// Writes seen so far, by point and phase (before, after).
        counts: Mutex<std::collections::HashMap<(&'static str, bool), u64>>,
        full_flag: Option<std::path::PathBuf>,
    }

    fn faults() -> &'static Faults {
        static FAULTS: OnceLock<Faults> = OnceLock::new();
        FAULTS.get_or_init(|| {
            let spec = std::env::var("GOONDAN_FAULT").unwrap_or_default();
            let rules = spec
                .split(',')
                .filter(|rule| !rule.trim().is_empty())
                .filter_map(|rule| {
                    let mut parts = rule.trim().split(':');
                    let point = parts.next()?.to_owned();
                    let action = match parts.next()? {
                        "crash" => Action::Crash,
                        "enospc" => Action::Enospc,
                        "full" => Action::Full,
                        "panic" => Action::Panic,
                        _ => return None,
                    };
                    let nth = parts.next().map_or(Some(1), |n| n.parse().ok())?;
                    Some(Rule { point, action, nth })
                })
                .collect();
            Faults {
                rules,
                counts: Mutex::new(std::collections::HashMap::new()),
                full_flag: std::env::var_os("GOONDAN_FAULT_FULL").map(Into::into),
            }
        })
    }

    /// Counts a write at `point` (`after`: a finished one) and returns its number.
    fn count(faults: &Faults, point: Point, after: bool) -> u64 {
        let mut counts = faults.counts.lock_unpoisoned();
        let count = counts.entry((point.name(), after)).or_insert(0);
        *count += 1;
        *count
    }

    fn matches(rule: &Rule, point: Point) -> bool {
        rule.point == "*" || rule.point == point.name()
    }

    /// See [`super`].
    pub fn before_write(point: Point) -> std::io::Result<()> {
        let faults = faults();
        if !faults.rules.iter().any(|rule| matches(rule, point) && rule.action != Action::Crash) {
            return Ok(());
        }
        let nth = count(faults, point, false);
        for rule in faults.rules.iter().filter(|rule| matches(rule, point)) {
            let fails = match rule.action {
                Action::Crash => false,
                Action::Panic if rule.nth == nth => {
                    #[allow(clippy::panic)]
                    {
                        panic!("fault injected: a panic at write {nth} of {}", point.name());
                    }
                }
                Action::Panic => false,
                Action::Enospc => rule.nth == 0 || rule.nth == nth,
                Action::Full => faults.full_flag.as_ref().is_some_and(|flag| flag.exists()),
            };
            if fails {
                return Err(std::io::Error::from_raw_os_error(28));
            }
        }
        Ok(())
    }

    /// See [`super`].
    pub fn after_write(point: Point) {
        let faults = faults();
        if !faults.rules.iter().any(|rule| matches(rule, point) && rule.action == Action::Crash) {
            return;
        }
        let nth = count(faults, point, true);
        if faults.rules.iter().any(|rule| matches(rule, point) && rule.action == Action::Crash && rule.nth == nth) {
            crash();
        }
    }

    /// SIGKILL to the service this process serves (if it is an agent
    /// process), then to this process: nothing after this point runs.
    fn crash() -> ! {
        let hub = std::env::var("GOONDAN_ORCHESTRATOR_PID").unwrap_or_else(|_| std::process::id().to_string());
        // The service and every process it started (its agent processes,
        // this one among them), at once: none of them cleans up.
        let mut pids = children_of(&hub);
        pids.push(hub);
        pids.push(std::process::id().to_string());
        let _ = std::process::Command::new("kill").arg("-KILL").args(&pids).status();
        // `kill` could not run: end without unwinding or flushing anyway.
        std::process::abort()
    }

    /// The child processes of `pid` (every thread's), from /proc.
    fn children_of(pid: &str) -> Vec<String> {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
        tasks
            .flatten()
            .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
            .flat_map(|children| children.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .collect()
    }
}
