//! One swarm across machines over NATS JetStream: a real `nats-server`
//! (JetStream on, 127.0.0.1), the hub (`gdn run --nats`) and two agent
//! hosts (`gdn host --nats`) as separate processes with separate state
//! roots and working directories. A host is killed mid-turn, the server
//! restarted, a host partitioned (stopped with SIGSTOP), and each time the
//! turn completes once, from the instance's last commit, on a host that
//! holds its lease.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

mod common;
use common::nats::{NatsOptions, NatsServer};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/nats-swarm")
}

/// One agent host: its process, state root and working directory.
struct AgentHost {
    id: String,
    state: tempfile::TempDir,
    work: tempfile::TempDir,
    child: Option<Child>,
}

impl AgentHost {
    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().map_or(0, |c| i32::try_from(c.id()).unwrap_or(0)))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.state.path().join("host.log")).unwrap_or_default()
    }

    /// The messages of `agent@key`'s conversation in this host's state root.
    fn messages(&self, agent: &str, key: &str) -> Vec<Value> {
        let path = common::instance_path(self.state.path(), &format!("{agent}@{key}")).join("messages.jsonl");
        match goondan_runtime::store::read_message_log(&path) {
            Ok(loaded) => loaded.state.messages().iter().map(|m| serde_json::to_value(m).unwrap_or_default()).collect(),
            Err(_) => Vec::new(),
        }
    }

    fn has_instance(&self, agent: &str, key: &str) -> bool {
        common::instance_path(self.state.path(), &format!("{agent}@{key}")).join("messages.jsonl").exists()
    }

    /// Lines of `file` in this host's working directory.
    fn worker_runs_in(&self, file: &str) -> usize {
        std::fs::read_to_string(self.work.path().join(file)).unwrap_or_default().lines().count()
    }

    /// The pids the worker's long job wrote here (one line per run).
    fn worker_runs(&self) -> Vec<u32> {
        std::fs::read_to_string(self.work.path().join("worker-runs.txt"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.trim().parse().ok())
            .collect()
    }
}

impl Drop for AgentHost {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(i32::try_from(child.id()).unwrap_or(0)), Signal::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

struct Cluster {
    bundle: PathBuf,
    nats: NatsServer,
    hub_state: tempfile::TempDir,
    hub_work: tempfile::TempDir,
    hosts: Vec<AgentHost>,
    /// The credentials the hub and hosts connect with.
    credentials: Vec<(&'static str, String)>,
}

impl Cluster {
    /// A server and hosts with these labels (`h1`, `h2`, …), for the
    /// `nats-swarm` fixture.
    fn start(
        options: NatsOptions,
        labels: &[&[&str]],
        env: &[(&str, &str)],
    ) -> Result<Option<Self>, Box<dyn std::error::Error>> {
        Self::start_with(fixture(), options, labels, env)
    }

    fn start_with(
        bundle: PathBuf,
        options: NatsOptions,
        labels: &[&[&str]],
        env: &[(&str, &str)],
    ) -> Result<Option<Self>, Box<dyn std::error::Error>> {
        Self::start_hosts_with(bundle, options, labels, env, &[])
    }

    /// As `start_with`, each host also given `host_args`.
    fn start_hosts_with(
        bundle: PathBuf,
        options: NatsOptions,
        labels: &[&[&str]],
        env: &[(&str, &str)],
        host_args: &[&str],
    ) -> Result<Option<Self>, Box<dyn std::error::Error>> {
        let Some(nats) = NatsServer::start(options)? else { return Ok(None) };
        let credentials = nats.client_env();
        let mut cluster = Self {
            bundle,
            nats,
            hub_state: tempfile::tempdir()?,
            hub_work: tempfile::tempdir()?,
            hosts: Vec::new(),
            credentials,
        };
        for (index, labels) in labels.iter().enumerate() {
            let host = cluster.spawn_host(&format!("h{}", index + 1), labels, env, host_args)?;
            cluster.hosts.push(host);
        }
        Ok(Some(cluster))
    }

    fn spawn_host(
        &self,
        id: &str,
        labels: &[&str],
        env: &[(&str, &str)],
        host_args: &[&str],
    ) -> Result<AgentHost, Box<dyn std::error::Error>> {
        let state = tempfile::tempdir()?;
        let work = tempfile::tempdir()?;
        let log = std::fs::File::create(state.path().join("host.log"))?;
        let mut command = self.gdn(state.path());
        command.args(["host", "--nats", &self.nats.url(), "--host-id", id, "--workdir"]).arg(work.path());
        for label in labels {
            command.args(["--label", label]);
        }
        command.args(host_args);
        for (name, value) in env {
            command.env(name, value);
        }
        for (name, value) in &self.credentials {
            command.env(name, value);
        }
        let child = command.stdout(Stdio::null()).stderr(Stdio::from(log)).spawn()?;
        Ok(AgentHost { id: id.to_owned(), state, work, child: Some(child) })
    }

    fn gdn(&self, state: &Path) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_gdn"));
        command
            .arg("-c")
            .arg(&self.bundle)
            .arg("--state-root")
            .arg(state)
            .env("NO_COLOR", "1")
            .env("TMPDIR", state)
            .env_remove("GOONDAN_STATE_ROOT")
            .env_remove("NATS_USER")
            .env_remove("NATS_PASSWORD")
            .env_remove("NATS_TOKEN")
            .env_remove("NATS_CREDS")
            .env_remove("NATS_URL")
            .stdin(Stdio::null());
        command
    }

    /// The hub with one turn (its answer in JSON); it waits for `hosts` hosts first.
    fn hub(&self, input: &str, hosts: usize) -> Command {
        self.hub_with(input, hosts, true)
    }

    fn hub_with(&self, input: &str, hosts: usize, json: bool) -> Command {
        let mut command = self.gdn(self.hub_state.path());
        if json {
            command.arg("--json");
        }
        command
            .args(["run", "--nats", &self.nats.url(), "--wait-hosts", &hosts.to_string(), "--workdir"])
            .arg(self.hub_work.path())
            .args(["--input", input])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, value) in &self.credentials {
            command.env(name, value);
        }
        command
    }

    /// An interactive hub (its agents stay up between turns) that waits
    /// for `hosts` hosts: its stdin, and its stdout's lines as they come.
    fn interactive_hub(&self, hosts: usize) -> Result<InteractiveHub, Box<dyn std::error::Error>> {
        use std::io::BufRead as _;
        let mut hub = self.gdn(self.hub_state.path());
        hub.args(["run", "--nats", &self.nats.url(), "--wait-hosts", &hosts.to_string(), "--workdir"])
            .arg(self.hub_work.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (name, value) in &self.credentials {
            hub.env(name, value);
        }
        let mut child = hub.spawn()?;
        let input = child.stdin.take().ok_or("stdin")?;
        let (lines_tx, lines) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().ok_or("stdout")?;
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines_tx.send(line);
            }
        });
        Ok(InteractiveHub { child, input: Some(input), lines })
    }

    /// A `gdn` command on the hub's machine (its state root, the
    /// credentials), with `env` besides; its output.
    fn on_hub(&self, args: &[&str], env: &[(&str, String)]) -> Result<Output, Box<dyn std::error::Error>> {
        let mut command = self.gdn(self.hub_state.path());
        command.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        for (name, value) in &self.credentials {
            command.env(name, value);
        }
        for (name, value) in env {
            command.env(name, value);
        }
        Ok(wait_within(command.spawn()?, Duration::from_secs(60)))
    }

    fn turn(&self, input: &str, hosts: usize) -> Result<Output, Box<dyn std::error::Error>> {
        Ok(wait_within(self.hub(input, hosts).spawn()?, Duration::from_secs(90)))
    }

    fn host(&self, id: &str) -> &AgentHost {
        self.hosts.iter().find(|h| h.id == id).unwrap_or_else(|| panic!("no host {id}"))
    }

    fn diagnostics(&self) -> String {
        let mut text = String::new();
        for host in &self.hosts {
            text.push_str(&format!("\n--- host {} log:\n{}", host.id, host.log()));
        }
        text.push_str(&format!("\n--- nats log (tail):\n{}", tail(&self.nats.log(), 30)));
        text
    }
}

/// Posts an event with `text` for instance key `k` to the `nats-service`
/// fixture's webhook on `port`; the HTTP response.
fn post_event(port: u16, text: &str) -> Result<String, Box<dyn std::error::Error>> {
    let body = serde_json::json!({"instanceKey": "k", "text": text});
    Ok(goondan_test_support::http::post_json(port, &[], &body)?)
}

struct InteractiveHub {
    child: Child,
    input: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
}

impl InteractiveHub {
    fn say(&mut self, line: &str) -> Result<(), Box<dyn std::error::Error>> {
        use std::io::Write as _;
        writeln!(self.input.as_mut().ok_or("stdin closed")?, "{line}")?;
        Ok(())
    }

    /// Waits (30 s at most) for an answer line containing `text`.
    fn answered(&self, text: &str) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Ok(line) = self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            if line.contains(text) {
                return Ok(());
            }
        }
        Err(format!("no answer with {text:?}"))
    }

    /// Closes its input and waits for it to end.
    fn finish(mut self) -> Output {
        drop(self.input.take());
        wait_within(self.child, Duration::from_secs(30))
    }
}

/// A child killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The body of a GET (HTTP/1.0: no chunks).
fn http_get(base: &str, path: &str) -> Result<String, Box<dyn std::error::Error>> {
    use std::io::{Read as _, Write as _};
    let authority = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(authority)?;
    write!(stream, "GET {path} HTTP/1.0\r\nhost: {authority}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").ok_or("no header end")?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(format!("GET {path}: {head}").into());
    }
    Ok(body.to_owned())
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn wait_within(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                break;
            }
        }
    }
    child.wait_with_output().unwrap_or_else(|e| panic!("{e}"))
}

fn answer(output: &Output, diagnostics: &str) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "no JSON answer (status {:?}); stdout: {stdout}\nstderr: {}{diagnostics}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Result<Duration, String> {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > limit {
            return Err(format!("{what}: not within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(started.elapsed())
}

/// The tool results of a conversation, in order.
fn results(messages: &[Value]) -> Vec<Value> {
    messages.iter().filter(|m| m["data"]["role"] == "tool").map(|m| m["data"]["result"].clone()).collect()
}

/// The user inputs of a conversation, in order.
fn inputs(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .filter(|m| m["data"]["role"] == "user")
        .filter_map(|m| m["data"]["content"].as_str().map(str::to_owned))
        .collect()
}

fn is_gone(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.is_empty() || stat.split(") ").nth(1).is_some_and(|rest| rest.starts_with('Z'))
}

#[test]
fn a_handoff_crosses_hosts_and_each_instance_lives_in_its_hosts_state_root() -> TestResult {
    let Some(cluster) = Cluster::start(NatsOptions::default(), &[&[], &[]], &[])? else { return Ok(()) };
    let output = cluster.turn("CASE:handoff", 2)?;
    let body = answer(&output, &cluster.diagnostics());
    assert_eq!(body["text"], "handoff done", "{body}");
    // Placed on the least loaded: one instance on each host.
    let (h1, h2) = (cluster.host("h1"), cluster.host("h2"));
    assert!(h1.has_instance("coordinator", "default"), "{}", cluster.diagnostics());
    assert!(h2.has_instance("worker", "default"), "{}", cluster.diagnostics());
    assert!(!h1.has_instance("worker", "default") && !h2.has_instance("coordinator", "default"));
    let coordinator = h1.messages("coordinator", "default");
    let result = &results(&coordinator)[0];
    assert_eq!(result["status"], "ok", "{coordinator:?}");
    assert_eq!(result["output"]["response"], "worker answer");
    assert_eq!(inputs(&h2.messages("worker", "default")), ["JOB:quick"]);
    // The hub ran no agent itself.
    assert!(!common::instance_path(cluster.hub_state.path(), "coordinator@default").join("messages.jsonl").exists());
    // On the hub's machine, the broker's state stream shows them all, each
    // with the host it is on; its own state root alone has none of them.
    let hub_side = |args: &[&str]| cluster.on_hub(&[&["--json"], args].concat(), &[]);
    let listed = hub_side(&["instance", "list", "--nats", &cluster.nats.url()])?;
    let listed: Value = serde_json::from_slice(&listed.stdout)
        .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&listed.stderr)))?;
    let host_of = |agent: &str| {
        listed.as_array().into_iter().flatten().find(|i| i["agentName"] == agent).map(|i| i["host"].clone())
    };
    assert_eq!(host_of("coordinator"), Some(Value::from("h1")), "{listed:#}");
    assert_eq!(host_of("worker"), Some(Value::from("h2")), "{listed:#}");
    let turns =
        listed.as_array().into_iter().flatten().find(|i| i["agentName"] == "worker").map(|i| i["turns"].clone());
    assert_eq!(turns, Some(Value::from(1)), "{listed:#}");
    let local = hub_side(&["instance", "list"])?;
    assert_eq!(serde_json::from_slice::<Value>(&local.stdout)?, serde_json::json!([]), "the hub's own root");
    let logs = hub_side(&["logs", "--nats", &cluster.nats.url()])?;
    let records: Vec<Value> =
        String::from_utf8_lossy(&logs.stdout).lines().filter_map(|line| serde_json::from_str(line).ok()).collect();
    let seen = |source: &str, kind: &str| records.iter().any(|r| r["source"] == source && r["type"] == kind);
    assert!(seen("coordinator@default", "tool.completed"), "{records:#?}");
    assert!(seen("worker@default", "turn.completed"), "{records:#?}");
    // The studio on the hub's machine shows them too, and what happens next.
    let mut studio = cluster.gdn(cluster.hub_state.path());
    studio.args(["studio", "--port", "0", "--no-open", "--nats", &cluster.nats.url()]).stdout(Stdio::piped());
    for (name, value) in &cluster.credentials {
        studio.env(name, value);
    }
    let mut studio = Killed(studio.spawn()?);
    let url = {
        use std::io::BufRead as _;
        let mut lines = std::io::BufReader::new(studio.0.stdout.take().ok_or("stdout")?).lines();
        let first = lines.next().ok_or("gdn studio printed nothing")??;
        std::thread::spawn(move || for _ in lines {});
        first.strip_prefix("Studio started: ").ok_or(first.clone())?.trim().to_owned()
    };
    let instances = || -> Result<Value, Box<dyn std::error::Error>> {
        Ok(serde_json::from_str(&http_get(&url, "/api/instances")?)?)
    };
    let shown = instances()?;
    let item = &shown["items"][0];
    assert_eq!(item["key"], "default", "{shown:#}");
    assert_eq!(item["agents"], serde_json::json!(["coordinator", "worker"]), "{shown:#}");
    let before = item["updatedAt"].clone();
    std::thread::sleep(Duration::from_millis(20));
    let again = answer(&cluster.turn("CASE:handoff again", 2)?, &cluster.diagnostics());
    assert_eq!(again["text"], "handoff done", "{again}");
    until("the studio shows the next turn", Duration::from_secs(15), || {
        instances().is_ok_and(|shown| shown["items"][0]["updatedAt"] != before)
    })?;
    drop(studio);
    // A server without the swarm's state: nothing to list, said plainly.
    let Some(other) = NatsServer::start(NatsOptions::default())? else { return Ok(()) };
    let mut command = cluster.gdn(cluster.hub_state.path());
    command.args(["instance", "list", "--nats", &other.url()]).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (name, value) in other.client_env() {
        command.env(name, value);
    }
    let empty = wait_within(command.spawn()?, Duration::from_secs(30));
    assert_eq!(empty.status.code(), Some(0), "{}", String::from_utf8_lossy(&empty.stderr));
    assert!(String::from_utf8_lossy(&empty.stdout).contains("no instances"), "{empty:?}");
    Ok(())
}

#[test]
fn an_instance_continues_its_conversation_on_another_host_after_its_host_is_gone() -> TestResult {
    let Some(mut cluster) = Cluster::start(NatsOptions::default(), &[&[], &[]], &[])? else { return Ok(()) };
    let first = answer(&cluster.turn("CASE:handoff one", 2)?, &cluster.diagnostics());
    assert_eq!(first["text"], "handoff done", "{first}");
    // The coordinator's host goes away between turns (SIGKILL: nothing is handed over).
    let h1 = cluster.hosts.iter_mut().find(|h| h.id == "h1").unwrap_or_else(|| panic!("h1"));
    assert!(kill(h1.pid(), Signal::SIGKILL).is_ok());
    if let Some(mut child) = h1.child.take() {
        let _ = child.wait();
    }
    let second = answer(&cluster.turn("CASE:handoff two", 1)?, &cluster.diagnostics());
    assert_eq!(second["text"], "handoff done", "{second}");
    // h2 loaded the coordinator's state from the broker: both turns are in it.
    let h2 = cluster.host("h2");
    let coordinator = h2.messages("coordinator", "default");
    assert_eq!(inputs(&coordinator), ["CASE:handoff one", "CASE:handoff two"], "{}", cluster.diagnostics());
    assert_eq!(inputs(&h2.messages("worker", "default")), ["JOB:quick", "JOB:quick"]);
    Ok(())
}

#[test]
fn a_host_killed_mid_turn_its_instance_finishes_the_turn_on_another_host_once() -> TestResult {
    let Some(mut cluster) = Cluster::start(NatsOptions::default(), &[&[], &[]], &[("GDN_TEST_SLEEP", "3")])? else {
        return Ok(());
    };
    let hub = cluster.hub("CASE:long", 2).spawn()?;
    // The worker runs its long job on h2.
    until("the worker's job starts on h2", Duration::from_secs(30), || !cluster.host("h2").worker_runs().is_empty())?;
    let worker_pid = cluster.host("h2").worker_runs()[0];
    let h2 = cluster.hosts.iter_mut().find(|h| h.id == "h2").unwrap_or_else(|| panic!("h2"));
    assert!(kill(h2.pid(), Signal::SIGKILL).is_ok());
    let killed_at = Instant::now();
    if let Some(mut child) = h2.child.take() {
        let _ = child.wait();
    }
    // Its agent process does not outlive it.
    until("the dead host's agent process ends", Duration::from_secs(10), || is_gone(worker_pid))?;
    // The instance runs again on h1 from its last commit, well within 5 s of the death.
    until("the worker runs again on h1", Duration::from_secs(10), || !cluster.host("h1").worker_runs().is_empty())?;
    let failover = killed_at.elapsed();
    assert!(failover < Duration::from_secs(5), "failover took {failover:?}");
    let output = wait_within(hub, Duration::from_secs(60));
    let body = answer(&output, &cluster.diagnostics());
    assert_eq!(body["text"], "long done", "{body}");
    let h1 = cluster.host("h1");
    let coordinator = h1.messages("coordinator", "default");
    let result = &results(&coordinator)[0];
    assert_eq!(result["status"], "ok", "the request was answered, not failed: {coordinator:?}");
    assert_eq!(result["output"]["response"], "long answer");
    // The turn ran to its end once on h1, and the conversation holds the request once.
    assert_eq!(h1.worker_runs().len(), 1);
    assert_eq!(inputs(&h1.messages("worker", "default")), ["JOB:long"], "{}", cluster.diagnostics());
    Ok(())
}

#[test]
fn a_nats_server_restart_mid_turn_loses_nothing_and_runs_nothing_twice() -> TestResult {
    let Some(mut cluster) = Cluster::start(NatsOptions::default(), &[&[], &[]], &[("GDN_TEST_SLEEP", "3")])? else {
        return Ok(());
    };
    let hub = cluster.hub("CASE:long", 2).spawn()?;
    until("the worker's job starts on h2", Duration::from_secs(30), || !cluster.host("h2").worker_runs().is_empty())?;
    cluster.nats.stop()?;
    std::thread::sleep(Duration::from_millis(500));
    cluster.nats.restart()?;
    let output = wait_within(hub, Duration::from_secs(60));
    let body = answer(&output, &cluster.diagnostics());
    assert_eq!(body["text"], "long done", "{body}");
    let (h1, h2) = (cluster.host("h1"), cluster.host("h2"));
    let result = &results(&h1.messages("coordinator", "default"))[0];
    assert_eq!(result["output"]["response"], "long answer", "{}", cluster.diagnostics());
    // Nobody was taken for dead: the job ran once, where it started.
    assert_eq!(h2.worker_runs().len(), 1, "{}", cluster.diagnostics());
    assert!(h1.worker_runs().is_empty());
    assert_eq!(inputs(&h2.messages("worker", "default")), ["JOB:long"]);
    // The hosts reconnected by themselves: another turn works.
    let again = answer(&cluster.turn("CASE:handoff", 2)?, &cluster.diagnostics());
    assert_eq!(again["text"], "handoff done", "{again}");
    Ok(())
}

#[test]
fn a_partitioned_host_loses_its_lease_and_cannot_commit_when_it_returns() -> TestResult {
    let Some(mut cluster) = Cluster::start(NatsOptions::default(), &[&[], &[]], &[("GDN_TEST_SLEEP", "3")])? else {
        return Ok(());
    };
    let hub = cluster.hub("CASE:long", 2).spawn()?;
    until("the worker's job starts on h2", Duration::from_secs(30), || !cluster.host("h2").worker_runs().is_empty())?;
    // h2 stops answering (its agent process runs on, cut off behind it).
    let h2_pid = cluster.host("h2").pid();
    assert!(kill(h2_pid, Signal::SIGSTOP).is_ok());
    let output = wait_within(hub, Duration::from_secs(60));
    let body = answer(&output, &cluster.diagnostics());
    assert_eq!(body["text"], "long done", "{body}");
    let h1 = cluster.host("h1");
    assert_eq!(h1.worker_runs().len(), 1, "the worker ran again on h1: {}", cluster.diagnostics());
    // h2 comes back: its process finished the job meanwhile, but its commit is refused.
    assert!(kill(h2_pid, Signal::SIGCONT).is_ok());
    until("h2 finds it lost the worker", Duration::from_secs(15), || {
        cluster.host("h2").log().contains("another host has taken this instance over")
    })?;
    // …and its process there ends.
    until("h2's worker process ends", Duration::from_secs(15), || children_of(h2_pid).is_empty())?;
    // The state on the broker is h1's: a later turn of the worker sees one JOB:long, and continues it.
    cluster.hosts.retain(|h| h.id != "h2");
    let again = answer(&cluster.turn("CASE:handoff", 1)?, &cluster.diagnostics());
    assert_eq!(again["text"], "handoff done", "{again}");
    assert_eq!(inputs(&cluster.host("h1").messages("worker", "default")), ["JOB:long", "JOB:quick"]);
    Ok(())
}

#[test]
fn an_agent_runs_only_on_a_host_with_the_labels_it_asks_for() -> TestResult {
    let Some(cluster) = Cluster::start(NatsOptions::default(), &[&["zone=eu"], &["gpu=true"]], &[])? else {
        return Ok(());
    };
    let body = answer(&cluster.turn("CASE:gpu", 2)?, &cluster.diagnostics());
    assert_eq!(body["text"], "gpu done", "{body}");
    let h2 = cluster.host("h2");
    let worker = h2.messages("gpu-worker", "default");
    let pwd = results(&worker)[0]["output"]["stdout"].as_str().unwrap_or_default().trim().to_owned();
    assert_eq!(Path::new(&pwd).canonicalize()?, h2.work.path().canonicalize()?, "it ran in h2's working directory");
    assert!(!cluster.host("h1").has_instance("gpu-worker", "default"));
    Ok(())
}

#[test]
fn with_no_host_carrying_the_labels_the_request_fails_naming_them() -> TestResult {
    let Some(cluster) = Cluster::start(NatsOptions::default(), &[&["zone=eu"]], &[])? else { return Ok(()) };
    let body = answer(&cluster.turn("CASE:gpu", 1)?, &cluster.diagnostics());
    assert_eq!(body["text"], "gpu done", "{body}");
    let coordinator = cluster.host("h1").messages("coordinator", "default");
    let result = &results(&coordinator)[0];
    assert_eq!(result["error"]["code"], "AGENT_NO_HOST", "{result}");
    let message = result["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("gpu") && message.contains("true"), "{message}");
    Ok(())
}

/// A host that joined a moment before the hub takes its work without
/// `--wait-hosts`: the hub's first starts wait a few seconds for a host
/// rather than run on the hub's own host, or fail for want of labels.
#[test]
fn a_host_that_joined_just_before_the_hub_is_used_without_wait_hosts() -> TestResult {
    let Some(cluster) = Cluster::start(NatsOptions::default(), &[&["gpu=true"]], &[])? else { return Ok(()) };
    let h1 = cluster.host("h1");
    until("h1 joins", Duration::from_secs(30), || h1.log().contains("serves swarm"))?;
    let mut hub = cluster.gdn(cluster.hub_state.path());
    hub.args(["--json", "run", "--nats", &cluster.nats.url(), "--workdir"])
        .arg(cluster.hub_work.path())
        .args(["--input", "CASE:gpu"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in &cluster.credentials {
        hub.env(name, value);
    }
    let body = answer(&wait_within(hub.spawn()?, Duration::from_secs(90)), &cluster.diagnostics());
    assert_eq!(body["text"], "gpu done", "{body}");
    assert!(
        h1.has_instance("coordinator", "default"),
        "the entry agent ran on the hub, not on h1{}",
        cluster.diagnostics()
    );
    let coordinator = h1.messages("coordinator", "default");
    let result = &results(&coordinator)[0];
    assert!(result.get("error").is_none_or(Value::is_null), "the labelled worker was refused: {result}");
    assert!(h1.has_instance("gpu-worker", "default"), "{}", cluster.diagnostics());
    Ok(())
}

#[test]
fn hosts_authenticate_with_credentials_from_the_environment_and_agents_never_see_them() -> TestResult {
    let Some(mut cluster) = Cluster::start(NatsOptions::user_password("swarm", "s3cret-pw"), &[], &[])? else {
        return Ok(());
    };
    // Without credentials a host is refused and says so.
    let saved = std::mem::take(&mut cluster.credentials);
    let mut refused = cluster.spawn_host("nocreds", &[], &[], &[])?;
    let status = refused.child.take().map(|c| wait_within(c, Duration::from_secs(30)).status);
    assert!(status.is_some_and(|s| !s.success()), "{status:?}");
    assert!(refused.log().to_lowercase().contains("authorization"), "{}", refused.log());
    cluster.credentials = saved;
    let host = cluster.spawn_host("h1", &[], &[], &[])?;
    cluster.hosts.push(host);
    let body = answer(&cluster.turn("CASE:env", 1)?, &cluster.diagnostics());
    assert_eq!(body["text"], "env done", "{body}");
    let worker = cluster.host("h1").messages("worker", "default");
    let names = results(&worker)[0]["output"]["stdout"].as_str().unwrap_or_default().to_owned();
    assert!(!names.is_empty(), "{worker:?}");
    let seen: Vec<&str> = names.split_whitespace().filter(|name| name.starts_with("NATS_")).collect();
    assert!(seen.is_empty(), "a command the model chose saw the NATS credentials {seen:?}: {names}");
    Ok(())
}

/// The live children of `parent`.
fn children_of(parent: Pid) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
        if ppid == Some(parent.as_raw()) && !is_gone(pid) {
            found.push(pid);
        }
    }
    found
}

#[test]
fn the_agent_processes_of_a_hub_that_died_end_on_their_hosts() -> TestResult {
    let Some(cluster) = Cluster::start(NatsOptions::default(), &[&[], &[]], &[("GDN_TEST_SLEEP", "60")])? else {
        return Ok(());
    };
    let mut hub = cluster.hub("CASE:long", 2).spawn()?;
    until("the worker's job starts on h2", Duration::from_secs(30), || !cluster.host("h2").worker_runs().is_empty())?;
    let (h1, h2) = (cluster.host("h1").pid(), cluster.host("h2").pid());
    assert!(!children_of(h1).is_empty() && !children_of(h2).is_empty(), "an agent process runs on each host");
    assert!(kill(Pid::from_raw(i32::try_from(hub.id()).unwrap_or(0)), Signal::SIGKILL).is_ok());
    let _ = hub.wait();
    // Within the lease and a beat, nothing of the dead hub runs on either host.
    until("the dead hub's agent processes end", Duration::from_secs(8), || {
        children_of(h1).is_empty() && children_of(h2).is_empty()
    })?;
    assert!(cluster.host("h2").log().contains("the hub stopped answering"), "{}", cluster.diagnostics());
    // The next hub's turn runs as usual.
    let body = answer(&cluster.turn("CASE:handoff", 2)?, &cluster.diagnostics());
    assert_eq!(body["text"], "handoff done", "{body}");
    Ok(())
}

#[test]
fn a_pending_task_on_a_host_completes_and_its_turn_runs_before_the_hub_exits() -> TestResult {
    let Some(cluster) = Cluster::start(NatsOptions::default(), &[&[]], &[])? else { return Ok(()) };
    // Text output, as a person sees it: the answer, then the task's turn.
    let mut command = cluster.hub_with("CASE:task", 1, false);
    let output = wait_within(command.spawn()?, Duration::from_secs(60));
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}{}", cluster.diagnostics());
    assert!(stderr.contains("waiting for 1 task(s) to end (task-"), "{stderr}");
    assert!(stdout.find("started") < stdout.find("the command finished"), "{stdout}");
    let coordinator = cluster.host("h1").messages("coordinator", "default");
    let delivered = coordinator.iter().filter(|m| m.to_string().contains("tool_task_result")).count();
    assert_eq!(delivered, 1, "the task's end arrived once: {coordinator:?}");
    // On the hub's machine, the task as the broker has it.
    let url = cluster.nats.url();
    let task = |args: &[&str]| -> Result<Value, Box<dyn std::error::Error>> {
        let output = cluster.on_hub(&[&["--json", "task"], args, &["--nats", &url]].concat(), &[])?;
        Ok(serde_json::from_slice(&output.stdout)
            .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&output.stderr)))?)
    };
    let listed = task(&["list"])?;
    let handle = listed[0]["handle"].as_str().unwrap_or_default().to_owned();
    assert!(handle.starts_with("task-"), "{listed:#}");
    assert_eq!(listed[0]["tool"], "bash__exec", "{listed:#}");
    assert_eq!(listed[0]["agentName"], "coordinator", "{listed:#}");
    let shown = task(&["show", &handle])?;
    assert_eq!(shown["state"], "completed", "{shown:#}");
    assert!(shown.to_string().contains("built"), "the command's output: {shown:#}");
    Ok(())
}

#[test]
fn two_swarms_on_one_server_never_meet() -> TestResult {
    let Some(cluster) = Cluster::start(NatsOptions::default(), &[&[]], &[])? else { return Ok(()) };
    // Another swarm (workspace) on the same server sees none of this one's hosts.
    let mut other = cluster.gdn(cluster.hub_state.path());
    other
        .args(["--workspace", "another-swarm", "run", "--nats", &cluster.nats.url(), "--wait-hosts", "1"])
        .args(["--wait-hosts-secs", "3", "--input", "CASE:handoff"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let output = wait_within(other.spawn()?, Duration::from_secs(90));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--wait-hosts 1: only 0 agent host(s) joined within 3 s"), "{stderr}");
    // This one's hub finds its host.
    let body = answer(&cluster.turn("CASE:handoff", 1)?, &cluster.diagnostics());
    assert_eq!(body["text"], "handoff done", "{body}");
    Ok(())
}

#[test]
fn an_idle_instance_on_a_partitioned_host_ends_there_once_another_host_took_it() -> TestResult {
    let Some(cluster) = Cluster::start(NatsOptions::default(), &[&[], &[]], &[])? else { return Ok(()) };
    let mut hub = cluster.interactive_hub(2)?;
    hub.say("CASE:handoff one")?;
    hub.answered("handoff done")?;
    let h2 = cluster.host("h2").pid();
    assert!(!children_of(h2).is_empty(), "the worker idles on h2");
    // h2 is cut off while its worker idles; the next request moves the worker to h1.
    assert!(kill(h2, Signal::SIGSTOP).is_ok());
    std::thread::sleep(crate_lease() + Duration::from_millis(700));
    hub.say("CASE:handoff two")?;
    hub.answered("handoff done")?;
    assert!(cluster.host("h1").has_instance("worker", "default"), "{}", cluster.diagnostics());
    // h2 comes back: its idle worker finds its messages taken and ends.
    assert!(kill(h2, Signal::SIGCONT).is_ok());
    until("h2's idle worker ends", Duration::from_secs(15), || children_of(h2).is_empty())
        .map_err(|e| format!("{e}{}", cluster.diagnostics()))?;
    let _ = hub.finish();
    assert_eq!(inputs(&cluster.host("h1").messages("worker", "default")), ["JOB:quick", "JOB:quick"]);
    Ok(())
}

#[test]
fn work_held_longer_than_the_brokers_ack_wait_is_neither_run_nor_answered_twice() -> TestResult {
    // The broker delivers again what is not acknowledged within 600 ms;
    // the worker's job takes 2 s, and its answer reaches the coordinator
    // between turns (an asynchronous request), where it stays a while.
    let Some(cluster) = Cluster::start_hosts_with(
        fixture(),
        NatsOptions::default(),
        &[&[], &[]],
        &[("GDN_TEST_SLEEP", "2")],
        &["--ack-wait-ms", "600"],
    )?
    else {
        return Ok(());
    };
    let mut hub = cluster.interactive_hub(2)?;
    hub.say("CASE:later")?;
    hub.answered("asked")?;
    let coordinator = || {
        cluster
            .hosts
            .iter()
            .map(|host| host.messages("coordinator", "default"))
            .max_by_key(Vec::len)
            .unwrap_or_default()
    };
    let replies = |messages: &[Value]| {
        messages.iter().filter(|m| m["metadata"]["__goondanInterAgentResponse"].is_object()).count()
    };
    until("the reply reaches the idle coordinator", Duration::from_secs(30), || replies(&coordinator()) > 0)
        .map_err(|e| format!("{e}{}", cluster.diagnostics()))?;
    // Several of the broker's waits go by.
    std::thread::sleep(Duration::from_secs(3));
    let messages = coordinator();
    assert_eq!(replies(&messages), 1, "{messages:#?}{}", cluster.diagnostics());
    let runs: usize = cluster.hosts.iter().map(|host| host.worker_runs().len()).sum();
    assert_eq!(runs, 1, "the 2 s job ran once{}", cluster.diagnostics());
    let worker = cluster.hosts.iter().map(|host| host.messages("worker", "default")).max_by_key(Vec::len);
    assert_eq!(inputs(&worker.unwrap_or_default()), ["JOB:long"]);
    // The coordinator's host dies; its next turn runs on the other host,
    // which gets whatever of the coordinator's was not acknowledged.
    let (held, other) = match cluster.host("h1").has_instance("coordinator", "default") {
        true => ("h1", "h2"),
        false => ("h2", "h1"),
    };
    assert!(kill(cluster.host(held).pid(), Signal::SIGKILL).is_ok());
    std::thread::sleep(crate_lease() + Duration::from_millis(700));
    hub.say("CASE:handoff after")?;
    hub.answered("handoff done").map_err(|e| format!("{e}{}", cluster.diagnostics()))?;
    let messages = cluster.host(other).messages("coordinator", "default");
    assert_eq!(inputs(&messages).first().map(String::as_str), Some("CASE:later"), "{messages:#?}");
    assert_eq!(replies(&messages), 1, "{messages:#?}{}", cluster.diagnostics());
    let _ = hub.finish();
    Ok(())
}

/// The hosts' lease (`goondan_nats::LEASE`).
fn crate_lease() -> Duration {
    goondan_nats::LEASE
}

#[test]
fn a_connector_event_runs_its_turn_once_on_a_host_across_a_hub_killed_mid_turn() -> TestResult {
    let bundle = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/nats-service");
    let Some(cluster) = Cluster::start_with(bundle, NatsOptions::default(), &[&[]], &[("GDN_TEST_SLEEP", "6")])? else {
        return Ok(());
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let service = || -> Result<Child, Box<dyn std::error::Error>> {
        let mut command = cluster.gdn(cluster.hub_state.path());
        command
            .args(["run", "--nats", &cluster.nats.url(), "--wait-hosts", "1", "--workdir"])
            .arg(cluster.hub_work.path())
            .env("NATS_TEST_WEBHOOK_PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        Ok(command.spawn()?)
    };
    let post = |text: &str| post_event(port, text);
    let mut hub = service()?;
    until("the webhook listens", Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    })?;
    // Stored by the hub before it is acknowledged.
    assert!(post("slow job")?.starts_with("HTTP/1.1 200"));
    let h1 = cluster.host("h1");
    until("the event's turn runs on h1", Duration::from_secs(30), || h1.worker_runs_in("runs.txt") == 1)?;
    // kill -9 of the hub mid-turn: its host ends the cut-off turn's process.
    assert!(kill(Pid::from_raw(i32::try_from(hub.id()).unwrap_or(0)), Signal::SIGKILL).is_ok());
    let _ = hub.wait();
    until("the orphaned process ends", Duration::from_secs(10), || children_of(h1.pid()).is_empty())?;
    // The next hub delivers the stored event again; its turn runs to its end once.
    let hub = service()?;
    until("the event's turn is answered", Duration::from_secs(30), || {
        inputs(&h1.messages("worker", "k")) == ["slow job"]
            && h1.messages("worker", "k").last().is_some_and(|m| m["data"]["content"] == "done slow")
    })
    .map_err(|e| format!("{e}: {:?}{}", h1.messages("worker", "k"), cluster.diagnostics()))?;
    assert_eq!(h1.worker_runs_in("runs.txt"), 2, "cut off once, then run to its end");
    // A second event: answered once, after the first.
    assert!(post("another")?.starts_with("HTTP/1.1 200"));
    until("the second event's turn", Duration::from_secs(30), || inputs(&h1.messages("worker", "k")).len() == 2)?;
    assert_eq!(inputs(&h1.messages("worker", "k")), ["slow job", "another"]);
    let _ = kill(Pid::from_raw(i32::try_from(hub.id()).unwrap_or(0)), Signal::SIGTERM);
    let _ = wait_within(hub, Duration::from_secs(30));
    Ok(())
}

#[test]
fn a_detached_hub_serves_its_connection_through_a_host_and_gdn_stop_ends_it() -> TestResult {
    let bundle = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/nats-service");
    let Some(cluster) = Cluster::start_with(bundle, NatsOptions::default(), &[&[]], &[])? else { return Ok(()) };
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let gdn = |args: &[&str]| cluster.on_hub(args, &[("NATS_TEST_WEBHOOK_PORT", port.to_string())]);
    let workdir = cluster.hub_work.path().display().to_string();
    let started = gdn(&["run", "--nats", &cluster.nats.url(), "--wait-hosts", "1", "--workdir", &workdir, "--detach"])?;
    let said = String::from_utf8_lossy(&started.stderr).into_owned();
    assert_eq!(started.status.code(), Some(0), "{said}{}", cluster.diagnostics());
    assert!(said.contains("service started (pid "), "{said}");
    // The command returned; the service in the background serves, and the
    // event's turn runs on the host (the credentials reached the service).
    let response = post_event(port, "hello")?;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let h1 = cluster.host("h1");
    until("the event's turn is answered on h1", Duration::from_secs(30), || {
        h1.messages("worker", "k").last().is_some_and(|m| m["data"]["content"] == "noted")
    })
    .map_err(|e| format!("{e}{}", cluster.diagnostics()))?;
    assert_eq!(inputs(&h1.messages("worker", "k")), ["hello"]);
    assert!(!children_of(h1.pid()).is_empty(), "the worker's process runs on h1");
    // `gdn stop` drains the service; its agent process on the host ends with it.
    let stopped = gdn(&["stop"])?;
    assert_eq!(stopped.status.code(), Some(0), "{}", String::from_utf8_lossy(&stopped.stderr));
    until("the host's agent process ends", Duration::from_secs(20), || children_of(h1.pid()).is_empty())
        .map_err(|e| format!("{e}{}", cluster.diagnostics()))?;
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "the webhook still listens");
    Ok(())
}

/// An event for an agent whose labels no connected host carries is kept
/// stored, its turn tried again (shown as retrying) rather than given up,
/// and it runs once, when a host with the labels joins.
#[test]
fn a_services_event_waits_for_a_host_with_its_agents_labels() -> TestResult {
    let bundle = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/nats-service-labelled");
    let Some(cluster) = Cluster::start_with(bundle, NatsOptions::default(), &[&["zone=eu"]], &[])? else {
        return Ok(());
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let gdn = |args: &[&str]| cluster.on_hub(args, &[("NATS_TEST_WEBHOOK_PORT", port.to_string())]);
    let workdir = cluster.hub_work.path().display().to_string();
    let started = gdn(&["run", "--nats", &cluster.nats.url(), "--workdir", &workdir, "--detach"])?;
    assert_eq!(started.status.code(), Some(0), "{}{}", String::from_utf8_lossy(&started.stderr), cluster.diagnostics());
    let response = post_event(port, "hello")?;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    // Tried more often than a turn that fails is (three starts), and still pending.
    let retrying = || {
        let listed = gdn(&["--json", "instance", "list"]).ok()?;
        let rows: Value = serde_json::from_slice(&listed.stdout).ok()?;
        rows.as_array()?.iter().find_map(|row| {
            let failures = row["retrying"]["failures"].as_u64()?;
            (row["pendingEvents"].as_u64() == Some(1)).then_some(failures)
        })
    };
    until("the event is retried four times and still pending", Duration::from_secs(60), || {
        retrying().is_some_and(|failures| failures >= 4)
    })
    .map_err(|e| format!("{e}{}", cluster.diagnostics()))?;
    // A host with the label joins: the event's turn runs there, once.
    let gpu = cluster.spawn_host("gpu", &["gpu=true"], &[], &[])?;
    until("the event's turn is answered on the gpu host", Duration::from_secs(90), || {
        gpu.messages("gpu-worker", "k").last().is_some_and(|m| m["data"]["content"] == "noted")
    })
    .map_err(|e| format!("{e}{}\n--- gpu host log:\n{}", cluster.diagnostics(), gpu.log()))?;
    assert_eq!(inputs(&gpu.messages("gpu-worker", "k")), ["hello"]);
    assert!(!cluster.host("h1").has_instance("gpu-worker", "k"), "it ran on a host without the label");
    let stopped = gdn(&["stop"])?;
    assert_eq!(stopped.status.code(), Some(0), "{}", String::from_utf8_lossy(&stopped.stderr));
    Ok(())
}

#[test]
fn a_background_task_on_a_host_is_cancelled_through_the_hub() -> TestResult {
    let bundle = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/nats-service");
    let Some(cluster) = Cluster::start_with(bundle, NatsOptions::default(), &[&[]], &[])? else { return Ok(()) };
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let gdn = |args: &[&str]| cluster.on_hub(args, &[("NATS_TEST_WEBHOOK_PORT", port.to_string())]);
    let url = cluster.nats.url();
    let workdir = cluster.hub_work.path().display().to_string();
    let started = gdn(&["run", "--nats", &url, "--wait-hosts", "1", "--workdir", &workdir, "--detach"])?;
    assert_eq!(started.status.code(), Some(0), "{}", String::from_utf8_lossy(&started.stderr));
    let response = post_event(port, "background job")?;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    // The task works on the host; the hub's machine finds it through the broker.
    let mut handle = String::new();
    until("the task is listed", Duration::from_secs(30), || {
        let Ok(listed) = gdn(&["--json", "task", "list", "--nats", &url]) else { return false };
        let listed: Value = serde_json::from_slice(&listed.stdout).unwrap_or_default();
        handle = listed[0]["handle"].as_str().unwrap_or_default().to_owned();
        listed[0]["state"] == "working"
    })
    .map_err(|e| format!("{e}{}", cluster.diagnostics()))?;
    let sleeping = |pid: Pid| children_of(pid).iter().any(|child| descendants_run(*child, "sleep 60"));
    assert!(sleeping(cluster.host("h1").pid()), "the background command runs on h1");
    let cancelled = gdn(&["task", "cancel", &handle, "--nats", &url])?;
    let said = String::from_utf8_lossy(&cancelled.stdout);
    assert_eq!(cancelled.status.code(), Some(0), "{said}{}", String::from_utf8_lossy(&cancelled.stderr));
    assert!(said.contains(&format!("task {handle} cancelled")), "{said}");
    until("the background command ends", Duration::from_secs(15), || !sleeping(cluster.host("h1").pid()))?;
    let stopped = gdn(&["stop"])?;
    assert_eq!(stopped.status.code(), Some(0), "{}", String::from_utf8_lossy(&stopped.stderr));
    Ok(())
}

/// Whether `pid` or a process under it runs a command line containing `text`.
fn descendants_run(pid: u32, text: &str) -> bool {
    let command = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let command = String::from_utf8_lossy(&command).replace('\0', " ");
    command.contains(text)
        || children_of(Pid::from_raw(i32::try_from(pid).unwrap_or(0)))
            .into_iter()
            .any(|child| descendants_run(child, text))
}

#[test]
fn a_host_stopped_mid_turn_hands_its_instance_to_another_host_at_once() -> TestResult {
    let Some(mut cluster) = Cluster::start(NatsOptions::default(), &[&[], &[]], &[("GDN_TEST_SLEEP", "3")])? else {
        return Ok(());
    };
    let hub = cluster.hub("CASE:long", 2).spawn()?;
    until("the worker's job starts on h2", Duration::from_secs(30), || !cluster.host("h2").worker_runs().is_empty())?;
    let h2 = cluster.hosts.iter_mut().find(|h| h.id == "h2").unwrap_or_else(|| panic!("h2"));
    assert!(kill(h2.pid(), Signal::SIGTERM).is_ok());
    let stopped_at = Instant::now();
    let status = h2.child.take().map(|c| wait_within(c, Duration::from_secs(30)).status);
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    // Moved on its host's word, not after the lease.
    until("the worker runs again on h1", Duration::from_secs(10), || !cluster.host("h1").worker_runs().is_empty())?;
    assert!(stopped_at.elapsed() < goondan_nats::LEASE + Duration::from_secs(1), "{:?}", stopped_at.elapsed());
    let body = answer(&wait_within(hub, Duration::from_secs(60)), &cluster.diagnostics());
    assert_eq!(body["text"], "long done", "{body}");
    let h1 = cluster.host("h1");
    let result = &results(&h1.messages("coordinator", "default"))[0];
    assert_eq!(result["output"]["response"], "long answer", "{result}");
    assert_eq!(inputs(&h1.messages("worker", "default")), ["JOB:long"]);
    Ok(())
}

#[test]
fn a_start_the_hub_gave_up_on_is_stopped_on_its_host() -> TestResult {
    use goondan_ipc::{AgentInstance, InitPayload, SwarmInfo};
    use goondan_orchestrator::Launch as _;
    let Some(cluster) = Cluster::start(NatsOptions::default(), &[&[]], &[])? else { return Ok(()) };
    let h1 = cluster.host("h1").pid();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let outcome = runtime
        .block_on(async {
            let client =
                goondan_nats::connect(&cluster.nats.url(), "test hub", Duration::from_secs(10), &|_: &str| None)
                    .await
                    .map_err(|e| e.to_string())?;
            // The fixture's swarm is "spread": the hosts' scope.
            let launcher = goondan_nats::NatsLauncher::start(
                client,
                goondan_nats::Scope::new("spread"),
                goondan_nats::Placement::default(),
                cluster.hub_work.path(),
            )
            .await
            .map_err(|e| e.to_string())?;
            if !launcher.wait_for_hosts(1, Duration::from_secs(10)).await {
                return Err("the host was not heard".to_owned());
            }
            let init = InitPayload {
                config: fixture().display().to_string(),
                instance: AgentInstance::new("worker", "abandoned"),
                workdir: None,
                state_root: cluster.hub_state.path().display().to_string(),
                env: Default::default(),
                tool_timeout_ms: None,
                swarm: SwarmInfo {
                    name: "spread".to_owned(),
                    entry_agent: "coordinator".to_owned(),
                    agents: vec!["coordinator".to_owned(), "gpu-worker".to_owned(), "worker".to_owned()],
                },
            };
            // Far too short for a process to get ready: the hub gives up.
            let started = launcher.start(init, Duration::from_millis(1)).await;
            let error = started.err().ok_or("the start did not time out")?;
            // The process the host started anyway is gone again while the hub
            // lives on (not because the hub fell silent): it became ready, then
            // was killed.
            let mut seen = false;
            let deadline = tokio::time::Instant::now() + goondan_nats::LEASE;
            loop {
                let children = children_of(h1);
                seen |= !children.is_empty();
                if seen && children.is_empty() {
                    break;
                }
                if tokio::time::Instant::now() > deadline {
                    return Err(format!("the abandoned start's process (seen: {seen}) still runs"));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok::<_, String>(error)
        })
        .map_err(|e| format!("{e}{}", cluster.diagnostics()))?;
    assert_eq!(outcome.code, "AGENT_UNAVAILABLE", "{outcome:?}");
    assert!(outcome.message.contains("did not start worker@abandoned"), "{outcome:?}");
    Ok(())
}

#[test]
fn a_hub_cut_off_from_everything_still_stops_when_asked() -> TestResult {
    let Some(mut cluster) = Cluster::start(NatsOptions::default(), &[&[]], &[("GDN_TEST_SLEEP", "60")])? else {
        return Ok(());
    };
    let hub = cluster.hub("CASE:long", 1).spawn()?;
    until("the worker's job starts", Duration::from_secs(30), || !cluster.host("h1").worker_runs().is_empty())?;
    // The server and the host are gone: nobody will ever answer the hub.
    cluster.nats.kill();
    let host = cluster.hosts.iter_mut().find(|h| h.id == "h1").unwrap_or_else(|| panic!("h1"));
    assert!(kill(host.pid(), Signal::SIGKILL).is_ok());
    if let Some(mut child) = host.child.take() {
        let _ = child.wait();
    }
    let stopping = Instant::now();
    assert!(kill(Pid::from_raw(i32::try_from(hub.id()).unwrap_or(0)), Signal::SIGTERM).is_ok());
    let output = wait_within(hub, Duration::from_secs(40));
    assert!(output.status.code().is_some(), "the hub did not exit by itself: {:?}", output.status);
    assert!(stopping.elapsed() < Duration::from_secs(30), "{:?}", stopping.elapsed());
    Ok(())
}
