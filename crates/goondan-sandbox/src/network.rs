//! The parent's side of `network.allow`: starting an agent's network holder
//! ([`crate::holder`]) once, keeping it tied to the agent process, and the
//! namespaces its commands join.
//!
//! The holder runs in a user namespace of its own, made between `fork` and
//! `exec` where the process is still single-threaded, in which the user is
//! root (`0 <uid> 1`): so its capabilities over that namespace (and the
//! network namespace it makes) survive `exec`; outside it has none. Its
//! command is started from a thread kept for it alone, because
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked ends (a tokio
//! blocking thread retired after a while would take the network down with
//! it); the thread lives exactly as long as the holder.
//!
//! Commands then `setns` into the holder's user namespace, then its network
//! namespace (opened once here, from `/proc/<pid>/ns/user` and
//! `/proc/<pid>/task/<tid>/ns/net`), and make their own user and mount
//! namespace below it as without a network (see `confine`).

use goondan_core::sync::LockUnpoisoned;
use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sched::CloneFlags;
use nix::sys::signal::Signal;

use crate::allow::AllowList;
use crate::confine::write_proc;
use crate::holder::{MAGIC, NETWORK_HOLDER_ARG, NETWORK_HOLDER_ENV};

/// How long the holder may take to report that it listens.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How many of the proxy's latest refusals are kept.
const KEPT_REFUSALS: usize = 32;

/// A request the proxy refused, as it reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkRefusal {
    /// When the proxy refused it.
    pub at: SystemTime,
    /// What was asked for, `host:port`.
    pub target: String,
    /// The one line the client was answered with.
    pub reason: String,
}

/// The program run as the network holder; it must call
/// [`run_network_holder`](crate::run_network_holder) when started so.
#[derive(Debug, Clone)]
pub(crate) struct HolderProgram {
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<OsString>,
}

impl HolderProgram {
    /// The running executable with [`NETWORK_HOLDER_ARG`].
    pub(crate) fn current_exe() -> io::Result<Self> {
        Ok(Self { program: std::env::current_exe()?, args: vec![NETWORK_HOLDER_ARG.into()] })
    }
}

/// The namespaces a command joins, opened once (close-on-exec).
#[derive(Debug)]
pub(crate) struct Namespaces {
    pub(crate) user: OwnedFd,
    pub(crate) net: OwnedFd,
}

impl Namespaces {
    /// Another pair of descriptors for the same namespaces.
    pub(crate) fn try_clone(&self) -> io::Result<Self> {
        Ok(Self { user: self.user.try_clone()?, net: self.net.try_clone()? })
    }

    /// In the child: the holder's user namespace (all capabilities there),
    /// then its network namespace.
    pub(crate) fn join(&self) -> io::Result<()> {
        nix::sched::setns(self.user.as_fd(), CloneFlags::CLONE_NEWUSER)?;
        nix::sched::setns(self.net.as_fd(), CloneFlags::CLONE_NEWNET)?;
        Ok(())
    }
}

/// A running holder; killed when dropped.
#[derive(Debug)]
pub(crate) struct NetworkHolder {
    child: Mutex<Child>,
    pid: u32,
    /// Its standard input: the holder ends when this closes.
    lifeline: Option<ChildStdin>,
    /// Dropping it ends the thread that started the holder.
    keep: Option<mpsc::Sender<()>>,
    keeper: Option<JoinHandle<()>>,
    /// The holder's reports of refused requests.
    reports: Mutex<Reports>,
    /// The port it listens on, on `127.0.0.1` inside its namespace.
    pub(crate) port: u16,
    /// Its user namespace and its namespace thread's network namespace.
    namespaces: Option<Namespaces>,
}

impl NetworkHolder {
    /// Starts `program` as the holder for `allow` and waits until it
    /// listens.
    pub(crate) fn start(program: &HolderProgram, allow: &AllowList) -> Result<Self, String> {
        let mut command = Command::new(&program.program);
        command
            .args(&program.args)
            .env_clear()
            .env(NETWORK_HOLDER_ENV, "1")
            .current_dir("/")
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let parent = nix::unistd::getpid();
        let (uid, gid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        let uid_map = format!("0 {uid} 1\n").into_bytes();
        let gid_map = format!("0 {gid} 1\n").into_bytes();
        // SAFETY: the hook runs in the child between fork and exec, where only
        // async-signal-safe work is sound: it makes system calls on buffers
        // prepared here (the id maps) and allocates nothing on success.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || {
                nix::sched::unshare(CloneFlags::CLONE_NEWUSER)?;
                write_proc(c"/proc/self/setgroups", b"deny")?;
                write_proc(c"/proc/self/uid_map", &uid_map)?;
                write_proc(c"/proc/self/gid_map", &gid_map)?;
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                // The parent may have ended before the line above.
                if nix::unistd::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }

        let (started, receive_started) = mpsc::channel();
        let (keep, kept) = mpsc::channel::<()>();
        let keeper = std::thread::Builder::new()
            .name("sandbox-net".into())
            .spawn(move || {
                let spawned = command.spawn();
                let alive = spawned.is_ok();
                let _ = started.send(spawned);
                if alive {
                    // Until the holder is dropped: PR_SET_PDEATHSIG is tied
                    // to this thread.
                    let _ = kept.recv();
                }
            })
            .map_err(|error| format!("starting a thread failed: {error}"))?;
        let mut child = match receive_started.recv() {
            Ok(Ok(child)) => child,
            Ok(Err(error)) => {
                let _ = keeper.join();
                return Err(format!("starting the network holder {} failed: {error}", program.program.display()));
            }
            Err(_) => return Err("the thread starting the network holder ended".to_owned()),
        };
        let pid = child.id();
        let lifeline = child.stdin.take();
        let stdout = child.stdout.take();
        let mut holder = Self {
            child: Mutex::new(child),
            pid,
            lifeline,
            keep: Some(keep),
            keeper: Some(keeper),
            reports: Mutex::new(Reports::default()),
            port: 0,
            namespaces: None,
        };
        let Some(mut stdout) = stdout else { return Err("the network holder has no output pipe".to_owned()) };
        let (port, tid) = holder.handshake(allow, &mut stdout)?;
        holder.port = port;
        holder.namespaces = Some(holder.open_namespaces(tid)?);
        nix::fcntl::fcntl(&stdout, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))
            .map_err(|error| format!("the network holder's output: {error}"))?;
        holder.reports.get_mut().unwrap_or_else(PoisonError::into_inner).stdout = Some(stdout);
        Ok(holder)
    }

    /// Descriptors of the namespaces a command joins.
    pub(crate) fn namespaces(&self) -> io::Result<Namespaces> {
        match &self.namespaces {
            Some(namespaces) => namespaces.try_clone(),
            None => Err(io::Error::new(io::ErrorKind::NotFound, "the network holder's namespaces are not open")),
        }
    }

    /// Reads what the holder reported since the last time, without waiting.
    /// The holder reports a refusal before it answers the client, so a
    /// command's refusals are there once it has ended.
    pub(crate) fn read_reports(&self) {
        self.reports.lock_unpoisoned().read();
    }

    /// The refusals the proxy reported at or after `since`, oldest first
    /// (the latest [`KEPT_REFUSALS`] are kept).
    pub(crate) fn refusals_since(&self, since: SystemTime) -> Vec<NetworkRefusal> {
        let mut reports = self.reports.lock_unpoisoned();
        reports.read();
        // The holder writes whole milliseconds.
        let since_ms = since.duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis());
        let since = UNIX_EPOCH + Duration::from_millis(u64::try_from(since_ms).unwrap_or(u64::MAX));
        reports.kept.iter().filter(|refusal| refusal.at >= since).cloned().collect()
    }

    /// Sends the allow-list, then waits for `ready <port> <tid>`.
    fn handshake(&mut self, allow: &AllowList, stdout: &mut ChildStdout) -> Result<(u16, i32), String> {
        let mut message = format!("{MAGIC} 1\n");
        for target in allow.targets() {
            message.push_str(&target.to_string());
            message.push('\n');
        }
        message.push('\n');
        let Some(lifeline) = self.lifeline.as_mut() else {
            return Err("the network holder has no input pipe".to_owned());
        };
        if let Err(error) = lifeline.write_all(message.as_bytes()).and_then(|()| lifeline.flush()) {
            return Err(format!("the network holder did not start: {error}{}", self.exit_status()));
        }
        let line = read_line_until(stdout, Instant::now() + START_TIMEOUT)
            .map_err(|error| format!("the network holder did not start: {error}{}", self.exit_status()))?;
        let words: Vec<&str> = line.split(' ').collect();
        match words.as_slice() {
            [_, "ready", port, tid] => match (port.parse(), tid.parse()) {
                (Ok(port), Ok(tid)) => Ok((port, tid)),
                _ => Err(format!("the network holder said `{line}`")),
            },
            [_, "failed", ..] => {
                Err(format!("the network holder failed: {}", line.splitn(3, ' ').nth(2).unwrap_or("")))
            }
            _ => Err(format!("the network holder said `{line}`")),
        }
    }

    /// Opens the holder's user namespace and its namespace thread's network
    /// namespace, and checks the latter is not this process's.
    fn open_namespaces(&self, tid: i32) -> Result<Namespaces, String> {
        let open = |path: String| {
            File::open(&path).map(OwnedFd::from).map_err(|error| format!("opening {path} failed: {error}"))
        };
        let user = open(format!("/proc/{}/ns/user", self.pid))?;
        let net = open(format!("/proc/{}/task/{tid}/ns/net", self.pid))?;
        let inode = |fd: &OwnedFd| File::from(fd.try_clone().ok()?).metadata().ok().map(|meta| meta.ino());
        let ours = std::fs::metadata("/proc/self/ns/net").map(|meta| meta.ino()).ok();
        if inode(&net).is_none() || inode(&net) == ours {
            return Err("the network holder's namespace thread is not in a network namespace of its own".to_owned());
        }
        Ok(Namespaces { user, net })
    }

    /// `; it ended with …` when the holder has ended.
    fn exit_status(&self) -> String {
        let mut child = self.child.lock_unpoisoned();
        match child.try_wait() {
            Ok(Some(status)) => format!("; it ended with {status}"),
            _ => String::new(),
        }
    }

    /// Whether the holder still runs.
    pub(crate) fn is_running(&self) -> bool {
        let mut child = self.child.lock_unpoisoned();
        matches!(child.try_wait(), Ok(None))
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }
}

impl Drop for NetworkHolder {
    fn drop(&mut self) {
        {
            let mut child = self.child.lock_unpoisoned();
            let _ = child.kill();
            let _ = child.wait();
        }
        self.lifeline.take();
        self.keep.take();
        if let Some(keeper) = self.keeper.take() {
            let _ = keeper.join();
        }
    }
}

/// The holder's output after its handshake: `refused <ms> <target>
/// <reason>` lines, read without waiting (the holder drops a report rather
/// than wait when the pipe is full; reading at each command keeps it
/// empty).
#[derive(Debug, Default)]
struct Reports {
    stdout: Option<ChildStdout>,
    partial: Vec<u8>,
    kept: VecDeque<NetworkRefusal>,
}

impl Reports {
    fn read(&mut self) {
        let Some(stdout) = self.stdout.as_mut() else { return };
        let mut chunk = [0_u8; 4096];
        loop {
            match stdout.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(read) => self.partial.extend_from_slice(&chunk[..read]),
            }
        }
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            if let Some(refusal) = parse_report(String::from_utf8_lossy(&line).trim_end()) {
                if self.kept.len() == KEPT_REFUSALS {
                    self.kept.pop_front();
                }
                self.kept.push_back(refusal);
            }
        }
    }
}

/// `goondan-sandbox-net refused <unix ms> <target> <reason>`.
fn parse_report(line: &str) -> Option<NetworkRefusal> {
    let report = line.strip_prefix(MAGIC)?.strip_prefix(" refused ")?;
    let (millis, report) = report.split_once(' ')?;
    let (target, reason) = report.split_once(' ')?;
    let at = UNIX_EPOCH + Duration::from_millis(millis.parse().ok()?);
    Some(NetworkRefusal { at, target: target.to_owned(), reason: reason.to_owned() })
}

/// The first line of `stdout` that starts with [`MAGIC`] (a test binary
/// standing in for the holder may print other lines first), read by
/// `deadline`.
fn read_line_until(stdout: &mut ChildStdout, deadline: Instant) -> io::Result<String> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut buffer = Vec::new();
    let mut chunk = [0_u8; 1024];
    loop {
        while let Some(end) = buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line).trim_end().to_owned();
            if line.starts_with(MAGIC) {
                return Ok(line);
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "timed out"));
        }
        let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::POLLIN)];
        if poll(&mut fds, timeout)? == 0 {
            continue;
        }
        let read = stdout.read(&mut chunk)?;
        if read == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "it closed its output"));
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
}
