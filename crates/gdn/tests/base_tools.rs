//! Every built-in tool of `@goondan/base`, reached through `gdn tool call` on
//! a bundle that refers to the tools as bundles for the original do.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

fn bundle() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/base-tools")
}

/// Runs `gdn -c base-tools tool call NAME --args ARGS --workdir DIR` with `env`.
fn call(name: &str, args: Value, workdir: &Path, env: &[(&str, &str)]) -> (i32, Value) {
    // A state root of the call's own: never the user's ~/.goondan.
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut command = Command::new(env!("CARGO_BIN_EXE_gdn"));
    command
        .env("GOONDAN_STATE_ROOT", state.path())
        .arg("-c")
        .arg(bundle())
        .args(["--json", "tool", "call", name, "--args", &args.to_string(), "--workdir"])
        .arg(workdir)
        .env("NO_COLOR", "1")
        .env_remove("GOONDAN_HTTP_ALLOW")
        .env_remove("TELEGRAM_BOT_TOKEN")
        .env_remove("TELEGRAM_API_BASE_URL")
        .env_remove("SLACK_BOT_TOKEN")
        .env_remove("SLACK_API_BASE_URL")
        .stdin(Stdio::null());
    for (key, value) in env {
        command.env(key, value);
    }
    let output: Output = command.output().unwrap_or_else(|e| panic!("spawn gdn: {e}"));
    let result = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code().unwrap_or(-1), result)
}

fn workdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"))
}

/// One HTTP request as a tiny test server saw it.
#[derive(Debug, Clone, Default)]
struct Seen {
    request_line: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// An HTTP/1.1 server on 127.0.0.1 that answers every request with `reply`
/// (JSON) and records what it received. Serves until the test process ends.
fn serve(reply: Value) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
    let address = listener.local_addr().unwrap_or_else(|e| panic!("addr: {e}"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (request_line, headers, body) = goondan_test_support::model::read_http_request_line(&stream);
            let request = Seen { request_line, headers, body: String::from_utf8_lossy(&body).into_owned() };
            if let Ok(mut log) = log.lock() {
                log.push(request);
            }
            let payload = reply.to_string();
            let mut stream = &stream;
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{payload}",
                payload.len()
            );
        }
    });
    (format!("http://{address}"), seen)
}

fn requests(seen: &Arc<Mutex<Vec<Seen>>>) -> Vec<Seen> {
    seen.lock().map(|log| log.clone()).unwrap_or_default()
}

#[test]
fn bash_exec_and_script_run_in_the_workdir() {
    let dir = workdir();
    let (code, result) = call("bash__exec", json!({"command": "echo hello; pwd"}), dir.path(), &[]);
    assert_eq!(code, 0, "{result}");
    let stdout = result["output"]["stdout"].as_str().unwrap_or("");
    assert!(stdout.starts_with("hello\n"), "{stdout}");
    let real = std::fs::canonicalize(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert!(stdout.contains(&real.display().to_string()), "{stdout}");
    assert_eq!(result["output"]["exitCode"], 0);

    std::fs::write(dir.path().join("greet.sh"), "echo \"hi $1\"").unwrap_or_else(|e| panic!("{e}"));
    let (code, result) = call("bash__script", json!({"path": "greet.sh", "args": ["there"]}), dir.path(), &[]);
    assert_eq!(code, 0, "{result}");
    assert_eq!(result["output"]["stdout"], "hi there\n");

    let (code, result) = call("bash__exec", json!({"command": "true", "cwd": "../.."}), dir.path(), &[]);
    assert_eq!(code, 1);
    assert_eq!(result["error"]["code"], "E_PATH_OUTSIDE_WORKDIR");
}

#[test]
fn bash_timeout_is_reported() {
    let dir = workdir();
    let (code, result) = call("bash__exec", json!({"command": "sleep 5", "timeoutMs": 200}), dir.path(), &[]);
    assert_eq!(code, 0, "a timed-out command is an ok result with timedOut: {result}");
    assert_eq!(result["output"]["timedOut"], true);
}

#[test]
fn file_system_exports_work_and_stay_confined() {
    let dir = workdir();
    let (code, result) =
        call("file-system__write", json!({"path": "notes/a.txt", "content": "첫 줄\n"}), dir.path(), &[]);
    assert_eq!(code, 0, "{result}");
    assert_eq!(result["output"]["written"], true);
    let (code, result) = call("file-system__read", json!({"path": "notes/a.txt"}), dir.path(), &[]);
    assert_eq!(code, 0, "{result}");
    assert_eq!(result["output"]["content"], "첫 줄\n");
    let (code, result) = call("file-system__mkdir", json!({"path": "made/deep"}), dir.path(), &[]);
    assert_eq!(code, 0, "{result}");
    let (code, result) = call("file-system__list", json!({"recursive": true}), dir.path(), &[]);
    assert_eq!(code, 0, "{result}");
    let names: Vec<&str> =
        result["output"]["entries"].as_array().into_iter().flatten().filter_map(|e| e["name"].as_str()).collect();
    assert!(names.contains(&"a.txt") && names.contains(&"deep"), "{names:?}");

    for path in ["../escape.txt", "/etc/passwd"] {
        let (code, result) = call("file-system__read", json!({"path": path}), dir.path(), &[]);
        assert_eq!(code, 1, "{path}");
        assert_eq!(result["error"]["code"], "E_PATH_OUTSIDE_WORKDIR", "{path}: {result}");
    }
}

#[test]
fn http_fetch_reaches_a_local_server_only_when_allowed() {
    let dir = workdir();
    let (base, seen) = serve(json!({"pong": true}));
    let url = format!("{base}/ping");
    let (code, result) = call("http-fetch__get", json!({"url": url}), dir.path(), &[]);
    assert_eq!(code, 1, "{result}");
    assert_eq!(result["error"]["code"], "E_SSRF_BLOCKED");
    assert!(requests(&seen).is_empty(), "a refused request must not reach the server");

    let (code, result) = call(
        "http-fetch__post",
        json!({"url": url, "body": {"a": 1}}),
        dir.path(),
        &[("GOONDAN_HTTP_ALLOW", "127.0.0.1")],
    );
    assert_eq!(code, 0, "{result}");
    assert_eq!(result["output"]["status"], 200);
    assert_eq!(result["output"]["body"], r#"{"pong":true}"#);
    let request = requests(&seen).pop().unwrap_or_default();
    assert!(request.request_line.starts_with("POST /ping "), "{request:?}");
    assert_eq!(request.body, r#"{"a":1}"#);

    let (code, result) = call("http-fetch__get", json!({"url": "file:///etc/passwd"}), dir.path(), &[]);
    assert_eq!(code, 1);
    assert_eq!(result["error"]["code"], "E_PROTOCOL_NOT_ALLOWED", "{result}");
}

#[test]
fn telegram_sends_through_the_operators_base_url() {
    let dir = workdir();
    let (base, seen) = serve(json!({"ok": true, "result": {"message_id": 7, "chat": {"id": 42}, "date": 1}}));
    let env = [("TELEGRAM_BOT_TOKEN", "123:abc"), ("TELEGRAM_API_BASE_URL", base.as_str())];
    let (code, result) = call("telegram__send", json!({"chatId": 42, "text": "hello"}), dir.path(), &env);
    assert_eq!(code, 0, "{result}");
    let request = requests(&seen).pop().unwrap_or_default();
    assert!(request.request_line.starts_with("POST /bot123:abc/sendMessage "), "{request:?}");
    let body: Value = serde_json::from_str(&request.body).unwrap_or_default();
    assert_eq!(body["chat_id"], "42", "the original sends chat ids as strings");
    assert_eq!(body["text"], "hello");
    assert!(!result.to_string().contains("123:abc"), "the token must not appear in the result");

    // The operator's token never goes to a base URL the model picked.
    let (other, other_seen) = serve(json!({"ok": true, "result": true}));
    let (code, result) =
        call("telegram__send", json!({"chatId": 42, "text": "x", "apiBaseUrl": other}), dir.path(), &env);
    assert_eq!(code, 1, "{result}");
    assert_eq!(result["error"]["code"], "E_TOKEN_DESTINATION_REFUSED");
    assert!(requests(&other_seen).is_empty());
}

#[test]
fn slack_sends_with_a_bearer_token() {
    let dir = workdir();
    let (base, seen) = serve(json!({"ok": true, "channel": "C1", "ts": "1.5"}));
    let env = [("SLACK_BOT_TOKEN", "xoxb-test"), ("SLACK_API_BASE_URL", base.as_str())];
    let (code, result) = call("slack__send", json!({"channelId": "C1", "text": "hi"}), dir.path(), &env);
    assert_eq!(code, 0, "{result}");
    let request = requests(&seen).pop().unwrap_or_default();
    assert!(request.request_line.starts_with("POST /chat.postMessage "), "{request:?}");
    assert_eq!(request.header("authorization"), Some("Bearer xoxb-test"));
    let body: Value = serde_json::from_str(&request.body).unwrap_or_default();
    assert_eq!((body["channel"].as_str(), body["text"].as_str()), (Some("C1"), Some("hi")));

    let (code, result) = call("slack__send", json!({"channelId": "C1", "text": "hi"}), dir.path(), &[]);
    assert_eq!(code, 1);
    assert_eq!(result["error"]["code"], "E_TOKEN_MISSING", "{result}");
}
