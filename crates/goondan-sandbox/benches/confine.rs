//! What confinement costs a command (see `docs/BENCHMARKS.md`, "Sandbox"):
//! spawning `/bin/true` and waiting for it, unconfined, confined with no
//! network, and confined with a `network.allow` list (the command joins the
//! network holder's user and network namespaces first); and the first
//! command of a sandbox, which sets it up (the probe, and under an
//! allow-list the holder's start); and one HTTP request from a running
//! Python process to a server on 127.0.0.1, directly (unconfined) and
//! through the proxy (confined, each request a new connection).
//!
//! This binary is also the network holder it benchmarks: the sandbox starts
//! it again with `GOONDAN_SANDBOX_NETWORK_HOLDER` set.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use divan::Bencher;
use goondan_sandbox::{NETWORK_HOLDER_ENV, Policy, Sandbox, SandboxSpec, run_network_holder};

fn main() {
    if std::env::var_os(NETWORK_HOLDER_ENV).is_some() {
        run_network_holder()
    }
    divan::Divan::default().sample_count(200).config_with_args().main();
}

fn sandbox(workdir: &Path, network: bool) -> Sandbox {
    let holder = std::env::current_exe().unwrap_or_else(|error| panic!("current_exe: {error}"));
    Sandbox::new(SandboxSpec {
        policy: Policy::WorkspaceWrite,
        workdir: workdir.to_path_buf(),
        network_allow: if network { vec!["127.0.0.1:9".to_owned()] } else { Vec::new() },
        ..SandboxSpec::default()
    })
    .with_network_holder(holder, std::iter::empty::<&str>())
}

fn run_true(sandbox: Option<&Sandbox>) {
    let mut command = Command::new("/bin/true");
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    if let Some(sandbox) = sandbox
        && let Err(error) = sandbox.confine(&mut command)
    {
        panic!("confining failed: {error}");
    }
    match command.status() {
        Ok(status) if status.success() => {}
        other => panic!("true: {other:?}"),
    }
}

fn workdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|error| panic!("tempdir: {error}"))
}

/// One command, the sandbox already set up.
#[divan::bench(args = ["unconfined", "no network", "allow-list"])]
fn spawn_true(bencher: Bencher, mode: &str) {
    let dir = workdir();
    let sandbox = match mode {
        "unconfined" => None,
        other => Some(sandbox(dir.path(), other == "allow-list")),
    };
    // Set up before timing.
    run_true(sandbox.as_ref());
    bencher.bench_local(|| run_true(sandbox.as_ref()));
}

/// A new sandbox's first command: its setup, the probe, and the command.
#[divan::bench(args = ["no network", "allow-list"], sample_count = 30)]
fn first_command(bencher: Bencher, mode: &str) {
    let dir = workdir();
    bencher.bench_local(|| {
        let sandbox = sandbox(dir.path(), mode == "allow-list");
        run_true(Some(&sandbox));
        drop(sandbox);
    });
}

/// An HTTP server on 127.0.0.1 answering every request with `ok`.
fn server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|error| panic!("bind: {error}"));
    let port = listener.local_addr().map(|address| address.port()).unwrap_or_default();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(&stream);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|read| read > 2) {
                line.clear();
            }
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        }
    });
    port
}

/// Makes one request to its URL per line of input, answering a line.
const CLIENT: &str = r#"
import os, sys, urllib.request as u
opener = u.build_opener(u.ProxyHandler() if os.environ.get("HTTP_PROXY") else u.ProxyHandler({}))
for _ in sys.stdin:
    opener.open(sys.argv[1], timeout=10).read()
    sys.stdout.write(".\n")
    sys.stdout.flush()
"#;

struct Client {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Client {
    fn request(&mut self) {
        let mut line = String::new();
        if self.input.write_all(b"\n").and_then(|()| self.input.flush()).is_err()
            || self.output.read_line(&mut line).map_or(true, |read| read == 0)
        {
            let mut error = String::new();
            let _ = self.child.stderr.as_mut().map(|stderr| stderr.read_to_string(&mut error));
            panic!("the client failed: {error}");
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request to a loopback server from a running Python process.
#[divan::bench(args = ["direct", "through the proxy"])]
fn http_request(bencher: Bencher, mode: &str) {
    if !Path::new("/usr/bin/python3").exists() {
        return;
    }
    let port = server();
    let dir = workdir();
    let mut command = Command::new("/usr/bin/python3");
    command.arg("-c").arg(CLIENT).arg(format!("http://127.0.0.1:{port}/"));
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).env_remove("HTTP_PROXY");
    let sandbox = (mode != "direct").then(|| {
        let holder = std::env::current_exe().unwrap_or_else(|error| panic!("current_exe: {error}"));
        Sandbox::new(SandboxSpec {
            policy: Policy::WorkspaceWrite,
            workdir: dir.path().to_path_buf(),
            network_allow: vec![format!("127.0.0.1:{port}")],
            ..SandboxSpec::default()
        })
        .with_network_holder(holder, std::iter::empty::<&str>())
    });
    if let Some(sandbox) = &sandbox
        && let Err(error) = sandbox.confine(&mut command)
    {
        panic!("confining failed: {error}");
    }
    let mut child = command.spawn().unwrap_or_else(|error| panic!("python3: {error}"));
    let (Some(input), Some(output)) = (child.stdin.take(), child.stdout.take()) else { panic!("no pipes") };
    let mut client = Client { child, input, output: BufReader::new(output) };
    client.request();
    bencher.bench_local(|| client.request());
}
