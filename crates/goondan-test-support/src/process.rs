//! `gdn` run as a user runs it: its own state root, a project (`-c`), a
//! chosen environment, no colours; its standard output and error collected
//! as they come; waits for a line, a port or a file with a deadline; and,
//! when the test lets go of a running `gdn` (success, failure or panic),
//! SIGTERM, a grace period, then SIGKILL, so nothing outlives the test.
//!
//! What is deliberately absent: sleeping for a fixed time. Every wait here
//! ends as soon as what it waits for holds, and fails at its deadline.

use goondan_core::sync::LockUnpoisoned;
use std::ffi::OsString;
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long a stopped `gdn` is given after SIGTERM before SIGKILL.
const GRACE: Duration = Duration::from_secs(10);

/// A port free on 127.0.0.1 now.
pub fn free_port() -> std::io::Result<u16> {
    TcpListener::bind("127.0.0.1:0")?.local_addr().map(|address| address.port())
}

/// Polls `done` every 20 ms until it holds; an error naming `what` once
/// `timeout` passed.
pub fn until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() > deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// How to run `gdn`: the program, its state root, project and environment.
#[derive(Debug, Clone)]
pub struct Gdn {
    program: PathBuf,
    project: Option<PathBuf>,
    state: Option<PathBuf>,
    state_arg: Option<PathBuf>,
    set: Vec<(OsString, OsString)>,
    removed: Vec<OsString>,
}

impl Gdn {
    /// `program` (a test's `env!("CARGO_BIN_EXE_gdn")`), with `NO_COLOR=1`
    /// and the test's own `GOONDAN_STATE_ROOT` and `GOONDAN_LOG` removed.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            project: None,
            state: None,
            state_arg: None,
            set: vec![("NO_COLOR".into(), "1".into())],
            removed: vec!["GOONDAN_STATE_ROOT".into(), "GOONDAN_LOG".into()],
        }
    }

    /// The project directory (`-c DIR`).
    #[must_use]
    pub fn project(self, dir: impl Into<PathBuf>) -> Self {
        self.with(|gdn| gdn.project = Some(dir.into()))
    }

    /// The state root (`GOONDAN_STATE_ROOT`).
    #[must_use]
    pub fn state(self, state: impl Into<PathBuf>) -> Self {
        self.with(|gdn| gdn.state = Some(state.into()))
    }

    /// The state root given as `--state-root DIR` (before the arguments).
    #[must_use]
    pub fn state_arg(self, state: impl Into<PathBuf>) -> Self {
        self.with(|gdn| gdn.state_arg = Some(state.into()))
    }

    /// Sets a variable.
    #[must_use]
    pub fn env(self, name: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.with(|gdn| gdn.set.push((name.into(), value.into())))
    }

    /// Removes a variable of the test's own environment.
    #[must_use]
    pub fn env_remove(self, name: impl Into<OsString>) -> Self {
        self.with(|gdn| gdn.removed.push(name.into()))
    }

    /// This, changed by `change`.
    fn with(mut self, change: impl FnOnce(&mut Self)) -> Self {
        change(&mut self);
        self
    }

    /// The command `gdn [-c DIR] ARGS`, standard input empty.
    pub fn command<S: AsRef<std::ffi::OsStr>>(&self, args: impl IntoIterator<Item = S>) -> Command {
        let mut command = Command::new(&self.program);
        if let Some(state) = &self.state_arg {
            command.arg("--state-root").arg(state);
        }
        if let Some(project) = &self.project {
            command.arg("-c").arg(project);
        }
        command.args(args).stdin(Stdio::null());
        for name in &self.removed {
            command.env_remove(name);
        }
        if let Some(state) = &self.state {
            command.env("GOONDAN_STATE_ROOT", state);
        }
        for (name, value) in &self.set {
            command.env(name, value);
        }
        command
    }

    /// Runs `gdn ARGS` to its end.
    pub fn output<S: AsRef<std::ffi::OsStr>>(&self, args: impl IntoIterator<Item = S>) -> std::io::Result<Output> {
        self.command(args).output()
    }

    /// Runs `gdn ARGS` to its end; a test failure if it cannot start.
    pub fn run<S: AsRef<std::ffi::OsStr>>(&self, args: impl IntoIterator<Item = S>) -> Output {
        self.output(args).unwrap_or_else(|error| panic!("running gdn: {error}"))
    }

    /// Starts `gdn ARGS` with its standard output and error piped (input
    /// empty) for the test to read or wait on; a test failure if it cannot.
    pub fn child<S: AsRef<std::ffi::OsStr>>(&self, args: impl IntoIterator<Item = S>) -> Child {
        let mut command = self.command(args);
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        command.spawn().unwrap_or_else(|error| panic!("spawning gdn: {error}"))
    }

    /// Runs `gdn ARGS` to its end with `stdin` written to its standard
    /// input (none: empty); a test failure if it cannot run.
    pub fn run_with_stdin<S: AsRef<std::ffi::OsStr>>(
        &self,
        args: impl IntoIterator<Item = S>,
        stdin: Option<&str>,
    ) -> Output {
        let mut command = self.command(args);
        command.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().unwrap_or_else(|error| panic!("spawning gdn: {error}"));
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes()).unwrap_or_else(|error| panic!("gdn's standard input: {error}"));
        }
        child.wait_with_output().unwrap_or_else(|error| panic!("waiting for gdn: {error}"))
    }

    /// Starts `gdn ARGS`, its output collected; standard input piped when
    /// `stdin`, empty otherwise.
    pub fn spawn<S: AsRef<std::ffi::OsStr>>(
        &self,
        args: impl IntoIterator<Item = S>,
        stdin: bool,
    ) -> std::io::Result<Running> {
        let mut command = self.command(args);
        command.stdin(if stdin { Stdio::piped() } else { Stdio::null() });
        Running::spawn(command)
    }
}

/// A running process whose output is collected; stopped when dropped.
pub struct Running {
    /// The process (for `id`, `try_wait`).
    pub child: Child,
    stdin: Option<ChildStdin>,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

/// Which of a process's outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl Running {
    /// Spawns `command` with its output piped and collected.
    pub fn spawn(mut command: Command) -> std::io::Result<Self> {
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        let stdin = child.stdin.take();
        let stdout = collect(child.stdout.take().ok_or_else(|| std::io::Error::other("no stdout"))?);
        let stderr = collect(child.stderr.take().ok_or_else(|| std::io::Error::other("no stderr"))?);
        Ok(Self { child, stdin, stdout, stderr })
    }

    /// The process id, for signals.
    pub fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(0))
    }

    /// Its standard output so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock_unpoisoned().clone()
    }

    /// Its standard error so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock_unpoisoned().clone()
    }

    /// Waits until the text of `stream` so far satisfies `check`; the text.
    pub fn wait_for(
        &mut self,
        stream: Stream,
        what: &str,
        timeout: Duration,
        check: impl Fn(&str) -> bool,
    ) -> Result<String, String> {
        let text = match stream {
            Stream::Stdout => Arc::clone(&self.stdout),
            Stream::Stderr => Arc::clone(&self.stderr),
        };
        let read = || text.lock_unpoisoned().clone();
        let deadline = Instant::now() + timeout;
        loop {
            let now = read();
            if check(&now) {
                return Ok(now);
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // Its last words may have come with its end.
                std::thread::sleep(Duration::from_millis(50));
                let now = read();
                if check(&now) {
                    return Ok(now);
                }
                return Err(format!("gdn ended ({status}) before {what}; stderr:\n{}", self.stderr()));
            }
            if Instant::now() > deadline {
                return Err(format!("timed out after {timeout:?} waiting for {what}; stderr:\n{}", self.stderr()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until a line of `stream` contains `needle`.
    pub fn wait_for_line(&mut self, stream: Stream, needle: &str, timeout: Duration) -> Result<String, String> {
        self.wait_for(stream, &format!("a line with {needle:?}"), timeout, |text| text.contains(needle))
    }

    /// Waits until `port` on 127.0.0.1 accepts a connection.
    pub fn wait_for_port(&mut self, port: u16, timeout: Duration) -> Result<(), String> {
        self.wait_for(Stream::Stderr, &format!("port {port}"), timeout, |_| {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .map(drop)
    }

    /// Waits until `path` exists.
    pub fn wait_for_file(&mut self, path: &Path, timeout: Duration) -> Result<(), String> {
        self.wait_for(Stream::Stderr, &format!("{}", path.display()), timeout, |_| path.exists()).map(drop)
    }

    /// Writes one line to its standard input.
    pub fn write_line(&mut self, line: &str) -> std::io::Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| std::io::Error::other("standard input is not piped"))?;
        writeln!(stdin, "{line}")?;
        stdin.flush()
    }

    /// Closes its standard input (the end of input).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Sends `signal`.
    pub fn signal(&self, signal: Signal) -> Result<(), nix::Error> {
        kill(self.pid(), signal)
    }

    /// Waits for its end, for at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus, String> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() > deadline => {
                    return Err(format!("gdn did not exit within {timeout:?}; stderr:\n{}", self.stderr()));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(error) => return Err(error.to_string()),
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = kill(self.pid(), Signal::SIGTERM);
            let deadline = Instant::now() + GRACE;
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Reads a child's stream into a string shared with the test, line by line.
fn collect(stream: impl std::io::Read + Send + 'static) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&text);
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            sink.lock_unpoisoned().push_str(&String::from_utf8_lossy(&line));
            line.clear();
        }
    });
    text
}

/// Bytes as text (lossy), for messages.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A finished command's standard output as text.
pub fn stdout(output: &Output) -> String {
    text(&output.stdout)
}

/// A finished command's standard error as text.
pub fn stderr(output: &Output) -> String {
    text(&output.stderr)
}

/// A finished command's standard output as JSON; a test failure otherwise.
pub fn json_stdout(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}\nstderr: {}", stdout(output), stderr(output)))
}
