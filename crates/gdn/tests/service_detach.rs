//! `gdn run --detach`: the service runs in the background and the command
//! returns once it serves (or with its start-up error); a second start is
//! refused while it runs; `gdn instance list` shows it; `gdn stop` drains
//! and stops it.

mod common;

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use goondan_test_support::{Agent, Bundle, reply_text};
use serde_json::json;

fn bundle(dir: &Path, port: u16) {
    Bundle::new()
        .scripted_model_as("m", "s", json!({"replies": [reply_text("pong")]}))
        .one_agent("bg", Agent::new("bot", "m"))
        .webhook("inbound", port, json!([]))
        .write(dir)
        .unwrap_or_else(|e| panic!("write: {e}"));
}

fn gdn(dir: &Path, state: &Path, args: &[&str]) -> Output {
    common::gdn_bin().project(dir).state(state).run(args)
}

fn post(port: u16, body: &str) -> String {
    let json = [("content-type", "application/json")];
    goondan_test_support::http::post(port, &json, body.as_bytes()).unwrap_or_else(|e| panic!("post: {e}"))
}

#[test]
fn a_detached_service_is_found_refused_twice_and_stopped() {
    let (dir, state, port) = common::project_on_a_free_port(bundle);

    let started = gdn(dir.path(), &state, &["run", "--detach"]);
    let said = String::from_utf8_lossy(&started.stderr).into_owned();
    assert_eq!(started.status.code(), Some(0), "{said}");
    assert!(said.contains("service started (pid ") && said.contains("logs: "), "{said}");
    // It serves after the command returned.
    assert!(post(port, r#"{"text":"ping"}"#).starts_with("HTTP/1.1 200"));

    let again = gdn(dir.path(), &state, &["run", "--detach"]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already runs"), "{again:?}");

    let deadline = Instant::now() + Duration::from_secs(30);
    let listed = loop {
        let list = gdn(dir.path(), &state, &["instance", "list", "--json"]);
        let listed: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap_or_default();
        if listed[0]["turns"].as_u64() == Some(1) {
            break listed;
        }
        assert!(Instant::now() < deadline, "no turn ran: {listed}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = listed[0]["service"]["log"].as_str().unwrap_or_default().to_owned();
    assert!(log.ends_with("logs/service.log"), "{listed}");
    assert!(std::fs::read_to_string(&log).unwrap_or_default().contains("serving 1 Connection(s)"));

    let stop = gdn(dir.path(), &state, &["stop"]);
    assert_eq!(stop.status.code(), Some(0), "{stop:?}");
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "still listening after gdn stop");
    let stopped = gdn(dir.path(), &state, &["stop"]);
    assert!(String::from_utf8_lossy(&stopped.stderr).contains("no service of this project is running"));
}

#[test]
fn a_detached_start_that_fails_says_why() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let state = dir.path().join("state");
    let taken = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
    let port = taken.local_addr().map(|a| a.port()).unwrap_or_else(|e| panic!("addr: {e}"));
    bundle(dir.path(), port);
    let started = gdn(dir.path(), &state, &["run", "--detach"]);
    let said = String::from_utf8_lossy(&started.stderr).into_owned();
    assert_eq!(started.status.code(), Some(3), "{said}");
    assert!(
        said.contains("Connection 'inbound': cannot listen on 127.0.0.1:") && said.contains("did not start"),
        "{said}"
    );
    drop(taken);
}
