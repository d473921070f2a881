//! `network.allow`: a confined command reaches exactly the listed
//! `host:port` pairs through the agent's proxy, and nothing else. Real
//! processes, real servers on 127.0.0.1; this test binary stands in for
//! `gdn` as the network holder (and as the agent process that owns one).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use goondan_sandbox::{NETWORK_HOLDER_ENV, Policy, Sandbox, SandboxError, SandboxSpec, run_network_holder};

/// Not a test: the entry point when a sandbox starts this binary as its
/// network holder.
#[test]
#[ignore = "the network holder's entry point, run when a sandbox starts this binary as one"]
fn network_holder() {
    if std::env::var_os(NETWORK_HOLDER_ENV).is_some() {
        run_network_holder()
    }
}

/// Not a test: an agent process that starts a holder and is then killed
/// (see `the_holder_dies_with_its_owner`).
#[test]
#[ignore = "an owner process for the_holder_dies_with_its_owner"]
fn network_owner() -> std::io::Result<()> {
    let Some(port) = std::env::var_os(OWNER_ENV) else { return Ok(()) };
    let workdir = tempfile::tempdir()?;
    let sandbox = sandbox(workdir.path(), &[&format!("127.0.0.1:{}", port.to_string_lossy())]);
    let mut command = Command::new("true");
    if let Err(error) = sandbox.confine(&mut command) {
        panic!("confining failed: {error}");
    }
    command.status()?;
    let Some(pid) = sandbox.network_holder_pid() else { panic!("no holder") };
    let mut out = std::io::stdout().lock();
    writeln!(out, "holder {pid}")?;
    out.flush()?;
    std::thread::sleep(Duration::from_secs(60));
    Ok(())
}

const OWNER_ENV: &str = "GOONDAN_SANDBOX_TEST_OWNER";

fn holder_args() -> [&'static str; 5] {
    ["network_holder", "--exact", "--ignored", "--nocapture", "--quiet"]
}

fn this_binary() -> PathBuf {
    match std::env::current_exe() {
        Ok(path) => path,
        Err(error) => panic!("current_exe: {error}"),
    }
}

fn sandbox(workdir: &Path, allow: &[&str]) -> Sandbox {
    Sandbox::new(SandboxSpec {
        policy: Policy::WorkspaceWrite,
        workdir: workdir.to_path_buf(),
        network_allow: allow.iter().map(|entry| (*entry).to_owned()).collect(),
        ..SandboxSpec::default()
    })
    .with_network_holder(this_binary(), holder_args())
}

fn run(sandbox: &Sandbox, workdir: &Path, script: &str) -> Output {
    let mut command = Command::new("/bin/bash");
    command.arg("-c").arg(script).current_dir(workdir).stdin(Stdio::null());
    if let Err(error) = sandbox.confine(&mut command) {
        panic!("confining failed: {error}");
    }
    match command.output() {
        Ok(output) => output,
        Err(error) => panic!("running {script}: {error}"),
    }
}

fn text(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).trim(),
        String::from_utf8_lossy(&output.stderr).trim()
    )
}

/// An HTTP server on 127.0.0.1 that answers `hello from <name>` and counts
/// the connections it got.
struct Server {
    port: u16,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Server {
    fn start(name: &'static str) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (counted, stopped) = (Arc::clone(&hits), Arc::clone(&stop));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::Acquire) {
                    break;
                }
                let Ok(mut stream) = stream else { continue };
                counted.fetch_add(1, Ordering::AcqRel);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let mut head = Vec::new();
                let mut byte = [0_u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                    head.push(byte[0]);
                }
                let body = format!("hello from {name}\n");
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Ok(Self { port, hits, stop })
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::Acquire)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// A raw proxy request from inside the sandbox: the first line of the
/// proxy's answer to `CONNECT <target>`.
fn raw_connect(target: &str) -> String {
    format!(
        r#"exec 3<>"/dev/tcp/127.0.0.1/${{HTTP_PROXY##*:}}" && printf 'CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n' >&3 && head -n 1 <&3"#
    )
}

#[test]
fn a_listed_server_is_reached_and_nothing_else() -> std::io::Result<()> {
    let workdir = tempfile::tempdir()?;
    let (a, b) = (Server::start("A")?, Server::start("B")?);
    let sandbox = sandbox(workdir.path(), &[&format!("127.0.0.1:{}", a.port)]);
    let url_a = format!("http://127.0.0.1:{}/", a.port);
    let names = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
        "NODE_USE_ENV_PROXY",
    ];
    let script = format!(r#"for name in {}; do echo "$name=${{!name-unset}}"; done"#, names.join(" "));
    let output = run(&sandbox, workdir.path(), &script);
    let Some(url) = sandbox.proxy_url() else { panic!("no proxy") };
    let expected: String = names
        .into_iter()
        .map(|name| match name {
            "NODE_USE_ENV_PROXY" => format!("{name}=1\n"),
            "NO_PROXY" | "no_proxy" => format!("{name}=\n"),
            _ => format!("{name}={url}\n"),
        })
        .collect();
    assert_eq!(String::from_utf8_lossy(&output.stdout), expected);
    let url_b = format!("http://127.0.0.1:{}/", b.port);

    // Through the proxy: an absolute-form request, a CONNECT tunnel, Python.
    for script in [
        format!("curl -sS --max-time 10 {url_a}"),
        format!("curl -sS --max-time 10 --proxytunnel {url_a}"),
        format!(
            "/usr/bin/python3 -c 'import urllib.request as u; print(u.urlopen(\"{url_a}\", timeout=10).read().decode())'"
        ),
    ] {
        let output = run(&sandbox, workdir.path(), &script);
        assert!(
            output.status.success() && String::from_utf8_lossy(&output.stdout).contains("hello from A"),
            "{script}: {}",
            text(&output)
        );
    }
    assert!(a.hits() >= 3);

    // B is refused by the proxy, with the reason in the answer.
    let output = run(&sandbox, workdir.path(), &format!("curl -sS --max-time 10 {url_b}"));
    let refusal = format!("127.0.0.1:{} is not in the agent's spec.sandbox.network.allow", b.port);
    assert!(String::from_utf8_lossy(&output.stdout).contains(&refusal), "{}", text(&output));
    let before = SystemTime::now();
    let output = run(&sandbox, workdir.path(), &format!("curl -sS --max-time 10 --proxytunnel {url_b}"));
    assert!(!output.status.success(), "{}", text(&output));
    // curl shows only `response 403`; the sandbox names the host.
    let refusals = sandbox.network_refusals_since(before);
    assert!(
        refusals.len() == 1
            && refusals[0].target == format!("127.0.0.1:{}", b.port)
            && refusals[0].reason.contains(&refusal),
        "{refusals:?}"
    );
    let output = run(&sandbox, workdir.path(), &raw_connect(&format!("127.0.0.1:{}", b.port)));
    let line = String::from_utf8_lossy(&output.stdout);
    assert!(line.starts_with("HTTP/1.1 403 ") && line.contains(&refusal), "{}", text(&output));
    let python = format!(
        "/usr/bin/python3 -c 'import urllib.request as u; u.urlopen(\"https://127.0.0.1:{}/\", timeout=10)'",
        b.port
    );
    let output = run(&sandbox, workdir.path(), &python);
    assert!(
        !output.status.success() && String::from_utf8_lossy(&output.stderr).contains(&refusal),
        "{}",
        text(&output)
    );

    // Around the proxy: nothing but the proxy is reachable.
    for script in [
        format!("exec 3<>/dev/tcp/127.0.0.1/{}", b.port),
        format!("exec 3<>/dev/tcp/127.0.0.1/{}", a.port),
        format!("curl -sS --max-time 5 --noproxy '*' {url_a}"),
        format!("env -u HTTP_PROXY -u http_proxy -u ALL_PROXY -u all_proxy curl -sS --max-time 5 {url_b}"),
        format!(
            "/usr/bin/python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {}), timeout=5)'",
            b.port
        ),
    ] {
        let output = run(&sandbox, workdir.path(), &script);
        assert!(!output.status.success(), "{script} succeeded: {}", text(&output));
    }
    assert_eq!(b.hits(), 0, "server B was reached");
    Ok(())
}

#[test]
fn names_and_addresses_are_matched_as_written() -> std::io::Result<()> {
    let workdir = tempfile::tempdir()?;
    let a = Server::start("A")?;
    let sandbox = sandbox(workdir.path(), &[&format!("localhost:{}", a.port)]);
    let output = run(&sandbox, workdir.path(), &format!("curl -sS --max-time 10 -p http://localhost:{}/", a.port));
    assert!(String::from_utf8_lossy(&output.stdout).contains("hello from A"), "{}", text(&output));
    let output = run(&sandbox, workdir.path(), &raw_connect(&format!("127.0.0.1:{}", a.port)));
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("HTTP/1.1 403 "), "{}", text(&output));
    Ok(())
}

/// A host name that the system resolver answers with loopback only (as a
/// rebinding DNS answer would): glibc reads `0x7f000001` as 127.0.0.1, and
/// `/etc/hosts` often names the machine.
fn name_resolving_to_loopback() -> String {
    let mut candidates = vec!["0x7f000001".to_owned()];
    if let Ok(name) = std::fs::read_to_string("/etc/hostname") {
        candidates.push(name.trim().to_owned());
    }
    for name in candidates {
        let Ok(addresses) = (name.as_str(), 80).to_socket_addrs() else { continue };
        let addresses: Vec<IpAddr> = addresses.map(|address| address.ip()).collect();
        if !addresses.is_empty() && addresses.iter().all(IpAddr::is_loopback) {
            return name;
        }
    }
    panic!("no host name here resolves to loopback only")
}

#[test]
fn a_listed_name_that_resolves_to_loopback_is_refused() -> std::io::Result<()> {
    let workdir = tempfile::tempdir()?;
    let a = Server::start("A")?;
    let name = name_resolving_to_loopback();
    let sandbox = sandbox(workdir.path(), &[&format!("{name}:{}", a.port)]);
    let output = run(&sandbox, workdir.path(), &raw_connect(&format!("{name}:{}", a.port)));
    let line = String::from_utf8_lossy(&output.stdout);
    assert!(
        line.starts_with("HTTP/1.1 403 ") && line.contains("resolved only to non-public addresses (127.0.0.1"),
        "{}",
        text(&output)
    );
    let python = format!(
        "/usr/bin/python3 -c 'import urllib.request as u; u.urlopen(\"http://{name}:{}/\", timeout=10)'",
        a.port
    );
    let output = run(&sandbox, workdir.path(), &python);
    assert!(!output.status.success(), "{}", text(&output));
    assert_eq!(a.hits(), 0, "the name reached loopback");
    Ok(())
}

fn is_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A zombie nobody reaps has ended all the same.
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => true,
    }
}

fn wait_gone(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if is_gone(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn the_holder_has_no_environment_is_out_of_reach_and_dies_with_the_sandbox() -> std::io::Result<()> {
    let workdir = tempfile::tempdir()?;
    let a = Server::start("A")?;
    let sandbox = sandbox(workdir.path(), &[&format!("127.0.0.1:{}", a.port)]);
    assert!(run(&sandbox, workdir.path(), "true").status.success());
    let Some(pid) = sandbox.network_holder_pid() else { panic!("no holder") };
    assert_eq!(std::fs::read(format!("/proc/{pid}/environ"))?, format!("{NETWORK_HOLDER_ENV}=1\0").into_bytes());
    for script in [format!("kill -0 {pid}"), format!("cat /proc/{pid}/environ"), format!("cat /proc/{pid}/maps")] {
        let output = run(&sandbox, workdir.path(), &script);
        assert!(!output.status.success(), "{script} succeeded: {}", text(&output));
    }
    // The same uid and gid as without a network; no capability survives.
    let output = run(&sandbox, workdir.path(), "id -u; grep CapEff /proc/self/status");
    let expected_uid = if nix::unistd::geteuid().is_root() { 1000 } else { nix::unistd::geteuid().as_raw() };
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.starts_with(&format!("{expected_uid}\n")), "{}", text(&output));
    assert!(stdout.contains("CapEff:\t0000000000000000"), "{}", text(&output));
    drop(sandbox);
    assert!(is_gone(pid), "the holder outlived its sandbox");
    Ok(())
}

#[test]
fn the_holder_dies_with_its_owner() -> std::io::Result<()> {
    let a = Server::start("A")?;
    let mut owner = Command::new(this_binary())
        .args(["network_owner", "--exact", "--ignored", "--nocapture", "--quiet"])
        .env(OWNER_ENV, a.port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()?;
    let Some(stdout) = owner.stdout.take() else { panic!("no stdout") };
    let mut pid = None;
    for line in BufReader::new(stdout).lines() {
        if let Some(number) = line?.strip_prefix("holder ") {
            pid = number.trim().parse::<u32>().ok();
            break;
        }
    }
    let Some(pid) = pid else { panic!("the owner reported no holder") };
    assert!(!is_gone(pid));
    owner.kill()?;
    owner.wait()?;
    assert!(wait_gone(pid), "the holder outlived its owner (SIGKILL)");
    Ok(())
}

#[test]
fn without_user_namespaces_an_allow_list_is_refused() -> std::io::Result<()> {
    let workdir = tempfile::tempdir()?;
    let without = sandbox(workdir.path(), &["127.0.0.1:9"]).landlock_only();
    let mut command = Command::new("true");
    let Err(SandboxError::Unavailable { reason, .. }) = without.confine(&mut command) else {
        panic!("an allow-list ran without namespaces")
    };
    assert!(reason.contains("network.allow (127.0.0.1:9) needs a network namespace"), "{reason}");
    assert_eq!(without.network_holder_pid(), None);

    let misspelt = sandbox(workdir.path(), &["https://example.com"]);
    let Err(error) = misspelt.confine(&mut command) else { panic!("a bad entry was accepted") };
    let said = error.to_string();
    assert!(said.contains("network.allow entry is not host:port: 'https://example.com' has a scheme"), "{said}");
    Ok(())
}

#[test]
fn a_holder_that_does_not_start_refuses_the_commands() -> std::io::Result<()> {
    let workdir = tempfile::tempdir()?;
    let spec = SandboxSpec {
        policy: Policy::WorkspaceWrite,
        workdir: workdir.path().to_path_buf(),
        network_allow: vec!["127.0.0.1:9".to_owned()],
        ..SandboxSpec::default()
    };
    for (program, said) in [
        ("/nonexistent/gdn", "starting the network holder /nonexistent/gdn failed"),
        // Not a holder: it ends without a word.
        ("/bin/true", "the network holder did not start"),
    ] {
        let sandbox = Sandbox::new(spec.clone()).with_network_holder(program, std::iter::empty::<&str>());
        let mut command = Command::new("true");
        let Err(SandboxError::Unavailable { reason, .. }) = sandbox.confine(&mut command) else {
            panic!("{program} was taken for a network holder")
        };
        assert!(reason.contains(said) && reason.contains("spec.sandbox.network.allow (127.0.0.1:9)"), "{reason}");
        assert_eq!(sandbox.network_holder_pid(), None);
    }
    Ok(())
}

#[test]
fn a_widened_sandbox_shares_the_holder() -> std::io::Result<()> {
    let workdir = tempfile::tempdir()?;
    let a = Server::start("A")?;
    let sandbox = sandbox(workdir.path(), &[&format!("127.0.0.1:{}", a.port)]);
    let widened = sandbox.widened([PathBuf::from("/opt")]);
    // The widened one sets up first and starts the holder; both use it.
    let url = format!("http://127.0.0.1:{}/", a.port);
    for confined in [&widened, &sandbox] {
        let output = run(confined, workdir.path(), &format!("curl -sS --max-time 10 {url}"));
        assert!(String::from_utf8_lossy(&output.stdout).contains("hello from A"), "{}", text(&output));
    }
    let Some(pid) = sandbox.network_holder_pid() else { panic!("no holder") };
    assert_eq!(widened.network_holder_pid(), Some(pid));
    drop(widened);
    assert!(!is_gone(pid), "the holder ended with one of its two sandboxes");
    assert!(run(&sandbox, workdir.path(), &format!("curl -sS --max-time 10 {url}")).status.success());
    drop(sandbox);
    assert!(is_gone(pid), "the holder outlived both sandboxes");
    Ok(())
}
