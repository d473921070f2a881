//! `gdn studio` with 100,000 events in a project: generates a state root
//! (3,000 webhook tickets through a desk and a researcher over 200 instance
//! keys, in the formats `gdn run` writes: the inbox, messages, events and
//! tasks of each agent instance), starts a real `gdn studio` on it, and
//! measures how long it takes to read it, the data API's answers (median
//! and worst of 20), and — when headless Chromium and Selenium are there
//! (scripts/test installs them) — the page's first paint, its view switches
//! and how late live events reach it (`benches/studio_page.py`).
//!
//! `cargo bench -p gdn --bench studio` (`STUDIO_BENCH_TICKETS=N` for another size).

#![allow(clippy::print_stdout, clippy::print_stderr, clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KEYS: usize = 200;

fn main() {
    let tickets: usize = std::env::var("STUDIO_BENCH_TICKETS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let state = dir.path().join("state");
    let started = Instant::now();
    let (events, trace) = generate(&state, tickets);
    println!("generated {events} entries ({tickets} tickets, {KEYS} keys) in {:?}", started.elapsed());
    let bytes = du(&state);
    println!("state root: {:.1} MB", bytes as f64 / 1e6);

    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gdn"))
        .args(["studio", "--port", "0", "--no-open"])
        .env("GOONDAN_STATE_ROOT", &state)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("gdn studio");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a line").expect("a line");
    let read_in = started.elapsed();
    let url = first.trim_start_matches("Studio started: ").trim().to_owned();
    std::thread::spawn(move || for _ in lines {});
    println!("gdn studio read the state root and listened in {read_in:?}");
    let rss = std::fs::read_to_string(format!("/proc/{}/status", child.id()))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS")).map(str::to_owned))
        .unwrap_or_default();
    println!("gdn studio memory: {rss}");

    let paths = [
        ("/api/projects", "/api/projects".to_owned()),
        ("/api/instances", "/api/instances".to_owned()),
        ("project visualization", "/api/projects/bench/visualization?recent=20".to_owned()),
        ("instance visualization", "/api/instances/k-7/visualization?recent=20&workspace=bench".to_owned()),
        ("earlier timeline page", "/api/projects/bench/visualization?recent=20&before=5000".to_owned()),
        ("one trace", format!("/api/traces/{trace}?workspace=bench")),
        ("page (index.html)", "/".to_owned()),
        ("studio.js", "/assets/studio.js".to_owned()),
    ];
    println!("\n| request | median | worst of 20 | body |\n|---|---|---|---|");
    for (name, path) in &paths {
        let mut times = Vec::new();
        let mut size = 0;
        for _ in 0..20 {
            let t0 = Instant::now();
            size = get(&url, path).len();
            times.push(t0.elapsed());
        }
        times.sort();
        println!("| {name} | {:.1} ms | {:.1} ms | {:.0} KB |", ms(times[10]), ms(times[19]), size as f64 / 1024.0);
    }

    // Live: lines appended to an instance's event log, read by the studio.
    let python = std::env::var_os("GOONDAN_TEST_BROWSER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/py/bin/python"));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/studio_page.py");
    let live_log = state.join("workspaces/bench/instances/desk@k-7/events.jsonl");
    let page = Command::new(&python)
        .arg(&script)
        .arg(&url)
        .arg(&live_log)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output();
    match page {
        Ok(output) if output.status.success() => println!("\n{}", String::from_utf8_lossy(&output.stdout)),
        Ok(output) => println!("\nthe page part failed: {}", String::from_utf8_lossy(&output.stdout)),
        Err(error) => println!("\nno page part ({error})"),
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn du(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}

fn get(base: &str, path: &str) -> Vec<u8> {
    let authority = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(authority).expect("connect");
    write!(stream, "GET {path} HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\n\r\n").expect("write");
    let mut body = Vec::new();
    stream.read_to_end(&mut body).expect("read");
    assert!(body.starts_with(b"HTTP/1.1 200"), "{path}: {}", String::from_utf8_lossy(&body[..body.len().min(200)]));
    body
}

/// Writes the project; returns the number of log lines and one desk trace id.
fn generate(state: &Path, tickets: usize) -> (usize, String) {
    let ws = state.join("workspaces/bench");
    std::fs::create_dir_all(ws.join("ingress")).unwrap();
    std::fs::write(
        ws.join("workspace.json"),
        r#"{"workspaceId":"bench","name":"bench","bundle":"/bench/goondan.yaml","createdAt":1795700000000}"#,
    )
    .unwrap();
    let mut inbox = String::new();
    let mut files: std::collections::HashMap<String, (String, String, String)> = Default::default();
    let mut lines = 0;
    let mut t: u64 = 1_795_700_000_000;
    let mut a_trace = String::new();
    for n in 0..tickets {
        let key = format!("k-{}", n % KEYS);
        let trace = format!("{:032x}", n as u128 * 7919 + 1);
        if n == tickets / 2 {
            a_trace.clone_from(&trace);
        }
        let corr = format!("corr-{n}");
        let req = format!("req-{n}");
        let delivery = format!("hook/{n}");
        t += 1000;
        let _ = writeln!(
            inbox,
            r#"{{"op":"accept","seq":{n},"key":"{delivery}","at":{t},"connection":"hook","connector":"webhook","agent":"desk","instance":"{key}","event":{{"name":"ticket","message":{{"type":"text","text":"ticket number {n}"}},"properties":{{}},"instanceKey":"{key}"}}}}"#
        );
        lines += 1;
        let (dm, _, _) = files.entry(format!("desk@{key}")).or_default();
        let ev = |out: &mut String, kind: &str, span: u64, parent: Option<u64>, at: u64, extra: &str| {
            let parent = parent.map(|p| format!(r#","parentSpanId":"{p:016x}""#)).unwrap_or_default();
            let _ = writeln!(
                out,
                r#"{{"type":"{kind}","traceId":"{trace}","spanId":"{span:016x}"{parent},"timestamp":{at},"agentName":"{{AGENT}}","instanceKey":"{key}","turnId":"turn-{n}"{extra}}}"#
            );
        };
        let _ = writeln!(
            dm,
            r#"{{"id":"m{n}a","data":{{"role":"user","content":"ticket number {n}"}},"metadata":{{"__goondanInbound":{{"sourceKind":"connector","sourceName":"hook","eventName":"ticket","correlationId":"{corr}","eventMetadata":{{"deliveryKey":"{delivery}"}}}}}},"createdAt":{t},"source":{{"type":"user"}}}}"#
        );
        let mut desk = String::new();
        let _ = writeln!(
            desk,
            r#"{{"type":"agent.request.received","traceId":"","spanId":"00000000000000aa","timestamp":{t},"agentName":"{{AGENT}}","instanceKey":"{key}","turnId":"","correlationId":"{corr}","from":"cli","eventType":"ticket"}}"#
        );
        let base = n as u64 * 100;
        ev(&mut desk, "turn.started", base + 1, None, t, "");
        ev(&mut desk, "step.started", base + 2, Some(base + 1), t + 5, r#","stepId":"s1""#);
        ev(
            &mut desk,
            "tool.called",
            base + 3,
            Some(base + 2),
            t + 20,
            r#","stepId":"s1","toolCallId":"c1","toolName":"agents__request""#,
        );
        ev(
            &mut desk,
            "agent.request.sent",
            base + 4,
            None,
            t + 21,
            &format!(r#","correlationId":"{req}","target":"researcher","targetInstanceKey":"{key}","toolCallId":"c1""#),
        );
        // The researcher's turn.
        let (rm, re, rt) = files.entry(format!("researcher@{key}")).or_default();
        let _ = writeln!(
            rm,
            r#"{{"id":"m{n}r","data":{{"role":"user","content":"look into ticket {n}"}},"metadata":{{"__goondanInbound":{{"sourceKind":"agent","sourceName":"desk","correlationId":"{req}"}}}},"createdAt":{},"source":{{"type":"user"}}}}"#,
            t + 25
        );
        let mut res = String::new();
        let _ = writeln!(
            res,
            r#"{{"type":"agent.request.received","traceId":"{trace}","spanId":"00000000000000bb","timestamp":{},"agentName":"{{AGENT}}","instanceKey":"{key}","turnId":"","correlationId":"{req}","from":"desk@{key}","eventType":"agent.request"}}"#,
            t + 25
        );
        ev(&mut res, "turn.started", base + 10, None, t + 25, "");
        ev(&mut res, "step.started", base + 11, Some(base + 10), t + 26, r#","stepId":"s1""#);
        for c in 0..4u64 {
            ev(
                &mut res,
                "tool.called",
                base + 12 + c,
                Some(base + 11),
                t + 40 + c,
                &format!(r#","stepId":"s1","toolCallId":"r{c}","toolName":"bash__exec""#),
            );
        }
        for c in 0..4u64 {
            let failed = (n + c as usize).is_multiple_of(37);
            let kind = if failed { "tool.failed" } else { "tool.completed" };
            let status = if failed { r#","status":"error","errorCode":"E_TOOL_TIMEOUT""# } else { r#","status":"ok""# };
            ev(
                &mut res,
                kind,
                base + 12 + c,
                Some(base + 11),
                t + 80 + c * 10,
                &format!(
                    r#","stepId":"s1","toolCallId":"r{c}","toolName":"bash__exec"{status},"duration":{}"#,
                    40 + c * 10
                ),
            );
        }
        ev(
            &mut res,
            "step.completed",
            base + 11,
            Some(base + 10),
            t + 130,
            r#","stepId":"s1","stepIndex":0,"toolCalls":4"#,
        );
        ev(&mut res, "step.started", base + 20, Some(base + 10), t + 131, r#","stepId":"s2""#);
        ev(
            &mut res,
            "step.completed",
            base + 20,
            Some(base + 10),
            t + 150,
            r#","stepId":"s2","stepIndex":1,"toolCalls":0"#,
        );
        ev(
            &mut res,
            "turn.completed",
            base + 10,
            None,
            t + 151,
            r#","stepCount":2,"duration":126,"tokenUsage":{"inputTokens":900,"outputTokens":120,"totalTokens":1020},"end":"answered""#,
        );
        let _ = writeln!(
            res,
            r#"{{"type":"agent.response.sent","traceId":"{trace}","spanId":"00000000000000cc","timestamp":{},"agentName":"{{AGENT}}","instanceKey":"{key}","turnId":"","correlationId":"{req}","to":"desk@{key}","status":"ok"}}"#,
            t + 152
        );
        let _ = writeln!(
            rm,
            r#"{{"id":"m{n}s","data":{{"role":"assistant","content":"found what ticket {n} needs"}},"metadata":{{}},"createdAt":{},"source":{{"type":"assistant"}}}}"#,
            t + 150
        );
        if n.is_multiple_of(10) {
            let _ = writeln!(
                rt,
                r#"{{"op":"open","task":{{"handle":"task-{n}","tool":"bash__exec","callId":"r0","turnId":"turn-{n}","state":"working","createdAt":{},"updatedAt":0,"expiresAt":0,"received":false}}}}"#,
                t + 60
            );
            let _ = writeln!(
                rt,
                r#"{{"op":"end","handle":"task-{n}","state":"completed","result":{{"status":"ok"}},"at":{}}}"#,
                t + 900
            );
            lines += 2;
        }
        lines += res.lines().count() + 2;
        re.push_str(&res.replace("{AGENT}", "researcher"));
        let (dm, de, _) = files.get_mut(&format!("desk@{key}")).unwrap();
        let _ = writeln!(
            desk,
            r#"{{"type":"agent.response.received","traceId":"{trace}","spanId":"00000000000000dd","timestamp":{},"agentName":"{{AGENT}}","instanceKey":"{key}","turnId":"turn-{n}","correlationId":"{req}","from":"researcher","status":"ok"}}"#,
            t + 153
        );
        ev(
            &mut desk,
            "tool.completed",
            base + 3,
            Some(base + 2),
            t + 153,
            r#","stepId":"s1","toolCallId":"c1","toolName":"agents__request","status":"ok","duration":133"#,
        );
        ev(
            &mut desk,
            "step.completed",
            base + 2,
            Some(base + 1),
            t + 155,
            r#","stepId":"s1","stepIndex":0,"toolCalls":1"#,
        );
        ev(&mut desk, "step.started", base + 5, Some(base + 1), t + 156, r#","stepId":"s2""#);
        ev(
            &mut desk,
            "step.completed",
            base + 5,
            Some(base + 1),
            t + 170,
            r#","stepId":"s2","stepIndex":1,"toolCalls":0"#,
        );
        ev(&mut desk, "turn.completed", base + 1, None, t + 171, r#","stepCount":2,"duration":171,"end":"answered""#);
        let _ = writeln!(
            desk,
            r#"{{"type":"agent.response.sent","traceId":"","spanId":"00000000000000ee","timestamp":{},"agentName":"{{AGENT}}","instanceKey":"{key}","turnId":"","correlationId":"{corr}","to":"cli","status":"ok"}}"#,
            t + 172
        );
        let _ = writeln!(
            dm,
            r#"{{"id":"m{n}d","data":{{"role":"assistant","content":"ticket {n} answered"}},"metadata":{{}},"createdAt":{},"source":{{"type":"assistant"}}}}"#,
            t + 170
        );
        lines += desk.lines().count() + 2;
        de.push_str(&desk.replace("{AGENT}", "desk"));
        let _ = writeln!(inbox, r#"{{"op":"done","seq":{n},"at":{},"outcome":"answered"}}"#, t + 173);
        lines += 1;
    }
    std::fs::write(ws.join("ingress/inbox.jsonl"), inbox).unwrap();
    for (name, (messages, events, tasks)) in files {
        let dir = ws.join("instances").join(&name);
        std::fs::create_dir_all(&dir).unwrap();
        let (agent, key) = name.split_once('@').unwrap();
        std::fs::write(
            dir.join("instance.json"),
            format!(r#"{{"instanceKey":"{key}","agentName":"{agent}","bundle":"/bench/goondan.yaml","createdAt":1795700000000,"updatedAt":{t},"turns":10,"messages":20}}"#),
        )
        .unwrap();
        std::fs::write(dir.join("messages.jsonl"), messages).unwrap();
        std::fs::write(dir.join("events.jsonl"), events).unwrap();
        if !tasks.is_empty() {
            std::fs::write(dir.join("tasks.jsonl"), tasks).unwrap();
        }
    }
    (lines, a_trace)
}
