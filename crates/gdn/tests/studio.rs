//! `gdn studio` in a real browser: a service runs a ticket through the
//! two-agent swarm of tests/fixtures/studio (a webhook Connection, the desk
//! hands the ticket to the researcher, a failed call, a background command
//! that completes later), then `gdn studio` serves its state root and
//! `studio/browser_test.py` clicks through the page in headless Chromium
//! (Debian's `chromium` and `chromium-driver`, PyPI `selenium`), including a
//! second ticket that must appear live. Screenshots are kept under
//! `target/studio-screenshots/`.
//!
//! Also: the data API's shapes and its answers for a scope with no data,
//! read-only use of the state root, and the command's options.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

use common::service::{Stopped, TestResult, free_port, until};

/// A Python with Selenium (`GOONDAN_TEST_BROWSER_PYTHON`, which scripts/test
/// sets, or the cache's virtual environment) and Debian's Chromium with its
/// driver, or `None` (skipped; with `GOONDAN_REQUIRE_BROWSER=1`, a failure).
fn browser() -> Option<PathBuf> {
    let python = std::env::var_os("GOONDAN_TEST_BROWSER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::repo_path(".cache/py/bin/python"));
    let selenium = Command::new(&python)
        .args(["-c", "import selenium"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let chromium = Path::new("/usr/bin/chromium").is_file() && Path::new("/usr/bin/chromedriver").is_file();
    let problem = match (selenium, chromium) {
        (true, true) => return Some(python),
        (false, _) => format!("no Selenium for {} (scripts/test installs it)", python.display()),
        (true, false) => {
            "no /usr/bin/chromium and /usr/bin/chromedriver (apt-get install chromium chromium-driver)".to_owned()
        }
    };
    goondan_test_support::skip_unless_required(
        "GOONDAN_REQUIRE_BROWSER",
        None,
        &problem,
        "no headless Chromium with Selenium (see scripts/test)",
    )
}

/// The project: the fixture copied into a temporary directory.
fn project() -> Result<tempfile::TempDir, std::io::Error> {
    let dir = tempfile::tempdir()?;
    std::fs::copy(common::repo_path("tests/fixtures/studio/goondan.yaml"), dir.path().join("goondan.yaml"))?;
    Ok(dir)
}

fn gdn(dir: &Path, state: &Path, port: u16, args: &[&str]) -> Result<std::process::Output, std::io::Error> {
    Command::new(env!("CARGO_BIN_EXE_gdn"))
        .arg("-c")
        .arg(dir)
        .args(args)
        .env("GOONDAN_STATE_ROOT", state)
        .env("STUDIO_WEBHOOK_PORT", port.to_string())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
}

/// A running `gdn studio`, stopped when dropped.
struct Studio {
    child: Child,
    url: String,
}

impl Studio {
    fn start(state: &Path, extra: &[&str]) -> Result<Self, Box<dyn std::error::Error>> {
        Self::start_with(state, extra, &[])
    }

    /// With environment variables `env` (a token's, say).
    fn start_with(state: &Path, extra: &[&str], env: &[(&str, &str)]) -> Result<Self, Box<dyn std::error::Error>> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gdn"))
            .args(["studio", "--port", "0", "--no-open"])
            .args(extra)
            .envs(env.iter().copied())
            .env("GOONDAN_STATE_ROOT", state)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next().ok_or("gdn studio printed nothing")??;
        let url = first.strip_prefix("Studio started: ").ok_or_else(|| format!("unexpected first line: {first}"))?;
        // Keep reading (and dropping) its output so that it never blocks.
        std::thread::spawn(move || for _ in lines {});
        Ok(Self { child, url: url.trim().to_owned() })
    }

    fn get(&self, path: &str) -> Result<(u16, Value), Box<dyn std::error::Error>> {
        let (status, body) = http_get(&self.url, path)?;
        Ok((status, serde_json::from_str(&body)?))
    }
}

impl Drop for Studio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A GET over a plain socket; the status and body.
fn http_get(base: &str, path: &str) -> Result<(u16, String), Box<dyn std::error::Error>> {
    use std::io::{Read as _, Write as _};
    let authority = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(authority)?;
    write!(stream, "GET {path} HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").ok_or("no header end")?;
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or("no status")?;
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.to_owned() };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else { break };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

fn instance_dir(state: &Path, name: &str) -> PathBuf {
    state.join("workspaces/helpdesk/instances").join(name)
}

fn file(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Every file under `dir` with its length and modification time.
fn snapshot(dir: &Path) -> Vec<(PathBuf, u64, std::time::SystemTime)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(path);
            } else {
                out.push((path, meta.len(), meta.modified().unwrap_or(std::time::UNIX_EPOCH)));
            }
        }
    }
    out.sort();
    out
}

/// Starts the service and runs the first ticket to its end (the researcher's
/// background command included).
fn first_ticket(dir: &Path, state: &Path, port: u16) -> TestResult {
    let started = gdn(dir, state, port, &["run", "--detach"])?;
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));
    let reply = common::service::post(
        port,
        &serde_json::json!({"instanceKey": "t-1", "text": "printer on fire", "event": "ticket"}),
    )?;
    assert!(reply.contains("200"), "{reply}");
    until("the first ticket's turns and the task's end turn", || {
        let tasks = file(&instance_dir(state, "researcher@t-1").join("tasks.jsonl"));
        let desk = file(&instance_dir(state, "desk@t-1").join("events.jsonl"));
        Ok(tasks.contains("\"op\":\"received\"")
            && desk.contains("turn.completed")
            && desk.contains("agent.response.sent"))
    })?;
    // The end's own turn is written just after the task is marked received.
    until("the researcher's third turn", || {
        Ok(file(&instance_dir(state, "researcher@t-1").join("events.jsonl")).matches("turn.completed").count() == 2)
    })
}

#[test]
fn the_page_shows_a_swarm_run_and_follows_it_live_in_headless_chromium() -> TestResult {
    let Some(python) = browser() else { return Ok(()) };
    let dir = project()?;
    let state = dir.path().join("state");
    let port = free_port()?;
    let _stopped = Stopped { dir: dir.path().to_path_buf(), state: state.clone() };
    first_ticket(dir.path(), &state, port)?;

    let studio = Studio::start(&state, &[])?;
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("../studio-screenshots");
    std::fs::create_dir_all(&shots)?;
    let shots = shots.canonicalize()?;
    let script = common::repo_path("crates/gdn/tests/studio/browser_test.py");
    let output = Command::new(&python)
        .arg(&script)
        .arg(&studio.url)
        .arg(port.to_string())
        .arg(&shots)
        .env("SE_OFFLINE", "true")
        .stdin(Stdio::null())
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    #[allow(clippy::print_stderr)]
    {
        eprintln!("{stdout}");
        eprintln!("screenshots: {}", shots.display());
    }
    assert!(output.status.success(), "the browser test failed: {stderr}\n{stdout}");
    let checks: Vec<Value> = stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let check = |name: &str| checks.iter().find(|c| c["check"] == name).cloned().unwrap_or(Value::Null);
    assert!(check("live")["lagMs"].as_f64().is_some_and(|lag| lag < 1000.0), "{checks:?}");
    assert_eq!(check("task ended")["span"]["status"], "completed");
    for name in ["graph", "flow", "trace", "trace-live"] {
        assert!(shots.join(format!("{name}.png")).is_file(), "no screenshot {name}");
    }
    Ok(())
}

#[test]
fn the_api_answers_in_the_originals_shapes_and_reads_without_writing() -> TestResult {
    let dir = project()?;
    let state = dir.path().join("state");
    let port = free_port()?;
    let _stopped = Stopped { dir: dir.path().to_path_buf(), state: state.clone() };
    first_ticket(dir.path(), &state, port)?;
    let stopped = gdn(dir.path(), &state, port, &["stop"])?;
    assert!(stopped.status.success(), "{}", String::from_utf8_lossy(&stopped.stderr));

    let before = snapshot(&state);
    let studio = Studio::start(&state, &[])?;
    let (status, instances) = studio.get("/api/instances")?;
    assert_eq!(status, 200);
    let items = instances["items"].as_array().ok_or("items")?;
    assert_eq!(items.len(), 1, "{instances}");
    let item = &items[0];
    assert_eq!(item["key"], "t-1");
    assert_eq!(item["status"], "idle");
    assert_eq!(item["agent"], "desk");
    assert_eq!(item["agents"], serde_json::json!(["desk", "researcher"]));
    for field in ["createdAt", "updatedAt"] {
        assert!(item[field].as_str().is_some_and(|t| t.ends_with('Z')), "{field}: {item}");
    }

    let (status, viz) = studio.get("/api/instances/t-1/visualization?recent=5&limit=1000")?;
    assert_eq!(status, 200);
    assert_eq!(viz["instanceKey"], "t-1");
    assert_eq!(viz["recentEvents"].as_array().map(Vec::len), Some(5));
    let timeline = viz["timeline"].as_array().ok_or("timeline")?;
    assert_eq!(timeline.len() as u64, viz["timelineTotal"].as_u64().unwrap_or(0));
    // Time order, and the fields of the original's TimelineEntry.
    let times: Vec<u64> = timeline.iter().filter_map(|e| e["atMs"].as_u64()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    for entry in timeline {
        for field in ["at", "kind", "source", "subtype", "detail"] {
            assert!(entry.get(field).is_some(), "{field} missing in {entry}");
        }
    }
    let failed = timeline.iter().find(|e| e["subtype"] == "tool.failed").ok_or("no failed call")?;
    assert_eq!(failed["errorCode"], "AGENT_NOT_FOUND");
    assert!(failed["duration"].as_f64().is_some(), "{failed}");
    let participants: Vec<&str> =
        viz["participants"].as_array().ok_or("participants")?.iter().filter_map(|p| p["id"].as_str()).collect();
    for id in ["connector:tickets", "agent:desk", "agent:researcher", "tool:bash__exec"] {
        assert!(participants.contains(&id), "{id} not in {participants:?}");
    }
    let edge = viz["interactions"]
        .as_array()
        .and_then(|list| list.iter().find(|e| e["key"] == "agent:desk|agent:researcher"))
        .ok_or("no handoff edge")?;
    assert_eq!(edge["total"], 2);
    assert_eq!(edge["direction"], "undirected");

    // A trace: the ticket's, across both agents.
    let traces = viz["traces"].as_array().ok_or("traces")?;
    let desk = traces.iter().find(|t| t["title"] == "desk turn").ok_or("no desk trace")?;
    assert_eq!(desk["agentNames"], serde_json::json!(["desk", "researcher"]));
    let id = desk["traceId"].as_str().ok_or("trace id")?;
    let (status, trace) = studio.get(&format!("/api/traces/{id}"))?;
    assert_eq!(status, 200);
    let roots = trace["rootSpans"].as_array().ok_or("roots")?;
    assert_eq!(roots.len(), 1, "one root: the connector's event: {trace}");
    assert_eq!(roots[0]["type"], "connector");
    let turn = &roots[0]["children"][0];
    assert_eq!((turn["type"].as_str(), turn["agentName"].as_str()), (Some("turn"), Some("desk")));
    let step = &turn["children"][0];
    assert_eq!(step["type"], "step");
    let kinds: Vec<&str> =
        step["children"].as_array().ok_or("step children")?.iter().filter_map(|c| c["type"].as_str()).collect();
    assert_eq!(kinds, ["model", "tool"], "{step}");
    let researcher = &step["children"][1]["children"][0];
    assert_eq!((researcher["type"].as_str(), researcher["agentName"].as_str()), (Some("turn"), Some("researcher")));

    // Bad requests.
    assert_eq!(studio.get("/api/instances/nope/visualization")?.0, 404);
    assert_eq!(studio.get("/api/traces/0123")?.0, 404);
    let (status, page) = http_get(&studio.url, "/")?;
    assert_eq!(status, 200);
    assert!(page.contains("/assets/studio.js"));
    assert_eq!(http_get(&studio.url, "/assets/studio.js")?.0, 200);

    drop(studio);
    assert_eq!(snapshot(&state), before, "gdn studio changed the state root");
    Ok(())
}

#[test]
fn open_and_no_open_together_are_refused() -> TestResult {
    let state = tempfile::tempdir()?;
    let output = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .args(["studio", "--open", "--no-open", "--port", "0"])
        .env("GOONDAN_STATE_ROOT", state.path())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()?;
    assert_eq!(output.status.code(), Some(2), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--open and --no-open"));
    Ok(())
}

#[test]
fn an_empty_state_root_serves_an_empty_list_and_sees_a_project_that_appears() -> TestResult {
    let state = tempfile::tempdir()?;
    let studio = Studio::start(state.path(), &[])?;
    let (status, list) = studio.get("/api/instances")?;
    assert_eq!(status, 200);
    assert_eq!(list["items"], serde_json::json!([]));
    // A project written after the studio started (a one-shot run).
    let dir = project()?;
    let output = gdn(dir.path(), state.path(), 1, &["run", "--input", "hello"])?;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, list) = studio.get("/api/instances")?;
        if list["items"].as_array().is_some_and(|items| !items.is_empty()) {
            break;
        }
        assert!(Instant::now() < deadline, "the new project never showed: {list}");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// One runtime event line as an agent's event log holds it.
fn event_line(kind: &str, span: &str, at: u64, extra: &str) -> String {
    format!(
        r#"{{"type":"{kind}","traceId":"{trace}","spanId":"{span}","timestamp":{at},"agentName":"solo","instanceKey":"k","turnId":"t1"{extra}}}"#,
        trace = "a".repeat(32)
    ) + "\n"
}

#[test]
fn new_lines_stream_to_pages_and_a_rewritten_log_is_read_again() -> TestResult {
    use std::io::{Read as _, Write as _};
    let state = tempfile::tempdir()?;
    let workspace = state.path().join("workspaces/solo");
    let instance = workspace.join("instances/solo@k");
    std::fs::create_dir_all(&instance)?;
    std::fs::write(
        workspace.join("workspace.json"),
        r#"{"workspaceId":"solo","name":"solo","bundle":"/x","createdAt":1}"#,
    )?;
    let events = instance.join("events.jsonl");
    let first = event_line("turn.started", "0000000000000001", 1_000, "")
        + &event_line("tool.called", "0000000000000002", 1_001, r#","toolCallId":"c1","toolName":"bash__exec""#);
    std::fs::write(&events, &first)?;
    let studio = Studio::start(state.path(), &[])?;
    let (_, viz) = studio.get("/api/projects/solo/visualization")?;
    assert_eq!(viz["timelineTotal"], 2, "{viz}");

    // A page's stream: its hello, then each line an agent appends.
    let authority = studio.url.trim_start_matches("http://").to_owned();
    let mut stream = std::net::TcpStream::connect(&authority)?;
    write!(stream, "GET /api/stream HTTP/1.1\r\nhost: {authority}\r\n\r\n")?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut received = String::new();
    let mut buffer = [0_u8; 4096];
    while !received.contains("\"hello\"") {
        let n = stream.read(&mut buffer)?;
        assert!(n > 0, "the stream closed: {received}");
        received.push_str(&String::from_utf8_lossy(&buffer[..n]));
    }
    // A line written in two parts shows once it is whole.
    let line = event_line(
        "tool.failed",
        "0000000000000002",
        1_050,
        r#","toolCallId":"c1","toolName":"bash__exec","errorCode":"E_TOOL_TIMEOUT","duration":49.0"#,
    );
    let (head, tail) = line.split_at(40);
    let mut log = std::fs::OpenOptions::new().append(true).open(&events)?;
    log.write_all(head.as_bytes())?;
    log.flush()?;
    std::thread::sleep(Duration::from_millis(300));
    let written = Instant::now();
    log.write_all(tail.as_bytes())?;
    log.flush()?;
    while !received.contains("E_TOOL_TIMEOUT") {
        let n = stream.read(&mut buffer)?;
        assert!(n > 0, "the stream closed: {received}");
        received.push_str(&String::from_utf8_lossy(&buffer[..n]));
    }
    assert!(written.elapsed() < Duration::from_secs(1), "the line took {:?} to reach the stream", written.elapsed());
    assert_eq!(received.matches("\"tool.failed\"").count(), 1, "{received}");
    let (_, viz) = studio.get("/api/projects/solo/visualization")?;
    assert_eq!(viz["timelineTotal"], 3, "{viz}");

    // The log rewritten shorter (as a compaction does): read again from the start.
    std::fs::write(&events, event_line("turn.started", "0000000000000009", 2_000, ""))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, viz) = studio.get("/api/projects/solo/visualization")?;
        if viz["timelineTotal"] == 1 && viz["timeline"][0]["spanId"] == "0000000000000009" {
            break;
        }
        assert!(Instant::now() < deadline, "the rewritten log was not read again: {viz}");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

#[test]
fn a_port_in_use_is_reported_with_exit_1() -> TestResult {
    let state = tempfile::tempdir()?;
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = taken.local_addr()?.port().to_string();
    let output = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .args(["studio", "--no-open", "--port", &port])
        .env("GOONDAN_STATE_ROOT", state.path())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()?;
    assert_eq!(output.status.code(), Some(1), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stderr).contains(&format!("cannot listen on 127.0.0.1:{port}")));
    Ok(())
}

/// A response read whole: its status, its header block and its body.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

/// A GET to the studio at `authority` (`127.0.0.1:PORT`) with the header
/// lines `headers` as given (`Host` among them, or not).
fn send(authority: &str, path: &str, headers: &[(&str, &str)]) -> Result<Answer, Box<dyn std::error::Error>> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(authority)?;
    let mut request = format!("GET {path} HTTP/1.1\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("connection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut response = Vec::new();
    let mut buffer = [0_u8; 8192];
    // An event stream never ends: its head and first event are enough.
    loop {
        let n = match stream.read(&mut buffer) {
            Ok(n) => n,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock && !response.is_empty() => break,
            Err(error) => return Err(error.into()),
        };
        if n == 0 {
            break;
        }
        response.extend_from_slice(&buffer[..n]);
        let text = String::from_utf8_lossy(&response);
        if text.contains("text/event-stream") && text.contains("\"hello\"") {
            break;
        }
    }
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n").ok_or_else(|| format!("no header end: {response}"))?;
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or("no status")?;
    let head = head.to_owned();
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.to_owned() };
    Ok(Answer { status, head, body })
}

/// A state root with one conversation holding `SECRET` (a one-shot run of
/// the fixture), and its project's id.
const SECRET: &str = "the launch code is 0451";

fn state_with_a_conversation() -> Result<(tempfile::TempDir, String), Box<dyn std::error::Error>> {
    let dir = project()?;
    let state = dir.path().join("state");
    let output = gdn(dir.path(), &state, 1, &["run", "--input", SECRET])?;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let workspaces = std::fs::read_dir(state.join("workspaces"))?.flatten().collect::<Vec<_>>();
    let id = workspaces.first().ok_or("no workspace")?.file_name().to_string_lossy().into_owned();
    Ok((dir, id))
}

#[test]
fn a_page_of_another_site_cannot_read_conversations_through_dns_rebinding() -> TestResult {
    let (dir, id) = state_with_a_conversation()?;
    let studio = Studio::start(&dir.path().join("state"), &[])?;
    let authority = studio.url.trim_start_matches("http://").to_owned();
    let port = authority.rsplit_once(':').map(|(_, port)| port.to_owned()).ok_or("no port")?;
    let viz = format!("/api/projects/{id}/visualization?limit=1000");

    // The studio's own names: the conversation is there.
    for host in
        [authority.clone(), format!("localhost:{port}"), format!("LocalHost:{port}"), format!("127.0.0.2:{port}")]
    {
        let answer = send(&authority, &viz, &[("Host", &host)])?;
        assert_eq!(answer.status, 200, "Host {host}: {}", answer.body);
        assert!(answer.body.contains(SECRET), "Host {host}: {}", answer.body);
    }
    let answer = send(&authority, "/", &[("Host", &format!("localhost:{port}"))])?;
    assert_eq!(answer.status, 200);

    // A rebound name, or the right name on another port (another server's
    // page), or none: 421, and nothing of the conversation.
    let wrong_port = if port == "1" { "2".to_owned() } else { "1".to_owned() };
    for host in [
        format!("attacker.example:{port}"),
        "attacker.example".to_owned(),
        format!("127.0.0.1.attacker.example:{port}"),
        format!("localhost.attacker.example:{port}"),
        format!("127.0.0.1:{wrong_port}"),
        "localhost".to_owned(),
        format!("user@127.0.0.1:{port}"),
    ] {
        for path in ["/", "/api/projects", "/api/instances", viz.as_str(), "/api/stream", "/assets/studio.js", "/nope"]
        {
            let answer = send(&authority, path, &[("Host", &host)])?;
            assert_eq!(answer.status, 421, "Host {host} {path}: {}", answer.body);
            assert!(!answer.body.contains(SECRET) && !answer.body.contains(&id), "Host {host}: {}", answer.body);
            assert!(answer.body.contains("Host"), "the refusal names the problem: {}", answer.body);
        }
    }
    assert_eq!(send(&authority, &viz, &[])?.status, 421, "no Host at all");

    // A page of another site that names the studio correctly (a fetch from
    // a page the user has open): 403, the stream included.
    for origin in ["http://attacker.example", &format!("http://attacker.example:{port}"), "null"] {
        for path in [viz.as_str(), "/api/stream", "/"] {
            let answer = send(&authority, path, &[("Host", &authority), ("Origin", origin)])?;
            assert_eq!(answer.status, 403, "Origin {origin} {path}: {}", answer.body);
            assert!(!answer.body.contains(SECRET), "{}", answer.body);
            assert!(answer.body.contains("Origin"), "{}", answer.body);
        }
    }
    // The studio's own page (its fetches and its event stream).
    let own = format!("http://{authority}");
    let answer = send(&authority, &viz, &[("Host", &authority), ("Origin", &own)])?;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let answer = send(&authority, "/api/stream", &[("Host", &authority), ("Origin", &own)])?;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.head.to_ascii_lowercase().contains("text/event-stream"), "{}", answer.head);
    Ok(())
}

#[test]
fn listening_beyond_loopback_without_a_token_is_a_usage_error() -> TestResult {
    let state = tempfile::tempdir()?;
    let studio = |args: &[&str], env: &[(&str, &str)]| {
        Command::new(env!("CARGO_BIN_EXE_gdn"))
            .args(["studio", "--no-open", "--port", "0"])
            .args(args)
            .envs(env.iter().copied())
            .env_remove("GDN_STUDIO_TEST_UNSET")
            .env("GOONDAN_STATE_ROOT", state.path())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
    };
    for host in ["0.0.0.0", "::"] {
        let output = studio(&["--host", host], &[])?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(&format!("--host {host}")) && stderr.contains("--auth-token-env NAME"), "{stderr}");
        assert!(!String::from_utf8_lossy(&output.stdout).contains("Studio started"));
    }
    // The option names a variable that is not set (or is empty).
    for env in [&[][..], &[("GDN_STUDIO_TEST_EMPTY", " ")][..]] {
        let name = env.first().map_or("GDN_STUDIO_TEST_UNSET", |(name, _)| *name);
        let output = studio(&["--host", "0.0.0.0", "--auth-token-env", name], env)?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(&format!("--auth-token-env {name}: the variable is not set or empty")), "{stderr}");
    }
    Ok(())
}

/// The token of the tests below: characters a URL and a cookie must encode.
const TOKEN: &str = "s3cret token/+;=\"é";

#[test]
fn with_a_token_every_request_carries_it_as_a_bearer_header_or_the_cookie_of_the_page_url() -> TestResult {
    let (dir, id) = state_with_a_conversation()?;
    let studio = Studio::start_with(
        &dir.path().join("state"),
        &["--host", "0.0.0.0", "--auth-token-env", "GDN_STUDIO_TOKEN"],
        &[("GDN_STUDIO_TOKEN", TOKEN)],
    )?;
    // The URL to open: this machine's, with the token (encoded).
    let (base, query) = studio.url.split_once("/?token=").ok_or_else(|| format!("no token in {}", studio.url))?;
    assert!(!query.contains(' ') && !query.contains(';') && !query.contains('"'), "{query}");
    let authority = base.trim_start_matches("http://").to_owned();
    assert!(authority.starts_with("127.0.0.1:"), "{authority}");
    let viz = format!("/api/projects/{id}/visualization?limit=1000");
    let host = ("Host", authority.as_str());

    // Without the token, or with a wrong one: 401 and nothing of the conversation.
    for headers in [
        vec![host],
        vec![host, ("Authorization", "Bearer s3cret")],
        vec![host, ("Authorization", "Basic czNjcmV0")],
        vec![host, ("Cookie", "gdn-studio=wrong")],
    ] {
        for path in ["/", viz.as_str(), "/api/stream", "/assets/studio.js"] {
            let answer = send(&authority, path, &headers)?;
            assert_eq!(answer.status, 401, "{headers:?} {path}: {}", answer.body);
            assert!(!answer.body.contains(SECRET) && !answer.body.contains(TOKEN), "{}", answer.body);
        }
    }
    assert_eq!(send(&authority, "/?token=s3cret", &[host])?.status, 401);

    // A bearer token: any Host (the token is the authentication).
    let bearer = format!("Bearer {TOKEN}");
    for name in [authority.as_str(), "studio.lan:4317", "10.1.2.3"] {
        let answer = send(&authority, &viz, &[("Host", name), ("Authorization", &bearer)])?;
        assert_eq!(answer.status, 200, "Host {name}: {}", answer.body);
        assert!(answer.body.contains(SECRET));
    }
    // Another site's page is still refused, token or not.
    let answer = send(&authority, &viz, &[host, ("Authorization", &bearer), ("Origin", "http://attacker.example")])?;
    assert_eq!(answer.status, 403, "{}", answer.body);

    // The page's URL: the page, and a cookie that only the server reads.
    let answer = send(&authority, &format!("/?token={query}"), &[host])?;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.body.contains("/assets/studio.js"));
    let cookie_line = answer
        .head
        .lines()
        .find(|line| line.to_ascii_lowercase().starts_with("set-cookie:"))
        .and_then(|line| line.split_once(':'))
        .map(|(_, value)| value.trim().to_owned())
        .ok_or_else(|| format!("no cookie: {}", answer.head))?;
    let attributes: Vec<String> = cookie_line.split(';').map(|a| a.trim().to_ascii_lowercase()).collect();
    for wanted in ["httponly", "samesite=strict", "path=/"] {
        assert!(attributes.iter().any(|a| a == wanted), "{cookie_line}");
    }
    assert!(!cookie_line.contains("s3cret"), "the cookie is not the token: {cookie_line}");
    let pair = cookie_line.split(';').next().ok_or("no cookie pair")?.to_owned();
    for path in [viz.as_str(), "/", "/assets/studio.js"] {
        let answer = send(&authority, path, &[host, ("Cookie", &format!("theme=dark; {pair}"))])?;
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
    }
    let answer = send(&authority, &viz, &[host, ("Cookie", &pair)])?;
    assert!(answer.body.contains(SECRET));
    let answer = send(&authority, "/api/stream", &[host, ("Cookie", &pair)])?;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.head.to_ascii_lowercase().contains("text/event-stream"), "{}", answer.head);
    Ok(())
}

#[test]
fn with_a_token_the_printed_url_opens_the_page_in_headless_chromium() -> TestResult {
    let Some(python) = browser() else { return Ok(()) };
    let (dir, _) = state_with_a_conversation()?;
    let studio = Studio::start_with(
        &dir.path().join("state"),
        &["--host", "0.0.0.0", "--auth-token-env", "GDN_STUDIO_TOKEN"],
        &[("GDN_STUDIO_TOKEN", TOKEN)],
    )?;
    let authority = studio.url.trim_start_matches("http://").split('/').next().ok_or("no authority")?.to_owned();
    let answer =
        send(&authority, "/api/instances", &[("Host", &authority), ("Authorization", &format!("Bearer {TOKEN}"))])?;
    let instances: Value = serde_json::from_str(&answer.body)?;
    let key = instances["items"][0]["key"].as_str().ok_or_else(|| format!("no instance: {instances}"))?;
    let output = Command::new(&python)
        .arg(common::repo_path("crates/gdn/tests/studio/token_browser_test.py"))
        .arg(&studio.url)
        .arg(key)
        .env("SE_OFFLINE", "true")
        .stdin(Stdio::null())
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "the browser test failed: {}\n{stdout}", String::from_utf8_lossy(&output.stderr));
    for check in ["token url", "cookie", "cookie only", "no token"] {
        assert!(stdout.contains(&format!("{{\"check\": \"{check}\"")), "no check {check}: {stdout}");
    }
    Ok(())
}
