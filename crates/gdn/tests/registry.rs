//! `gdn registry serve` as a process: it prints where it listens (port 0),
//! takes a publish with a token of `GOONDAN_REGISTRY_TOKENS`, serves the
//! packument, refuses a publish without a token, and stops on SIGTERM
//! with status 0.

use std::io::{Read as _, Write as _};
use std::time::Duration;

use goondan_test_support::process::Stream;
use serde_json::{Value, json};

mod common;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// One HTTP/1.1 request over a fresh connection: the status and the body.
fn http(
    address: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Result<(u16, Value), Box<dyn std::error::Error>> {
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let body = body.map(serde_json::to_vec).transpose()?.unwrap_or_default();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(token) = token {
        request.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    if !body.is_empty() {
        request.push_str("Content-Type: application/json\r\n");
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    stream.write_all(&body)?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let answer = String::from_utf8(answer)?;
    let (head, body) = answer.split_once("\r\n\r\n").ok_or("no end of headers")?;
    let status = head.split_whitespace().nth(1).ok_or("no status")?.parse()?;
    // Small JSON answers come whole (no chunking) from the registry.
    Ok((status, serde_json::from_str(body)?))
}

#[test]
fn registry_serve_publishes_and_serves_a_packument() -> TestResult {
    let storage = common::temp();
    let project = common::temp();
    let gdn = common::gdn_bin().env("GOONDAN_REGISTRY_TOKENS", " first-token , test-token ");
    let mut command = gdn.command(["registry", "serve", "--port", "0", "--storage"]);
    command.arg(storage.path()).current_dir(project.path());
    let mut server = goondan_test_support::process::Running::spawn(command)?;
    let line = server.wait_for_line(Stream::Stdout, "Registry listening on http://", Duration::from_secs(30))?;
    let address = line.trim().rsplit("http://").next().ok_or("no address")?.to_owned();
    assert!(address.starts_with("127.0.0.1:"), "{line}");

    let payload = json!({
        "name": "@goondan/base",
        "version": "1.0.0",
        "access": "public",
        "dependencies": {},
        "dist-tags": {"latest": "1.0.0"},
        "_attachments": {"base-1.0.0.tgz": {"data": "cmVnaXN0cnkgdGVzdA==", "contentType": "application/gzip", "length": 13}},
    });
    let (status, body) = http(&address, "PUT", "/%40goondan/base", None, Some(&payload))?;
    assert_eq!((status, &body["error"]), (401, &json!("PKG_AUTH_REQUIRED")));
    let (status, body) = http(&address, "PUT", "/%40goondan/base", Some("test-token"), Some(&payload))?;
    assert_eq!((status, body), (201, json!({"ok": true, "id": "@goondan/base", "version": "1.0.0"})));

    let (status, packument) = http(&address, "GET", "/@goondan/base", None, None)?;
    assert_eq!(status, 200);
    assert_eq!(packument["dist-tags"]["latest"], "1.0.0");
    let tarball = packument["versions"]["1.0.0"]["dist"]["tarball"].as_str().unwrap_or_default();
    assert_eq!(tarball, format!("http://{address}/%40goondan/base/-/base-1.0.0.tgz"));
    assert!(storage.path().join("packages/%40goondan/base/metadata.json").is_file());

    server.signal(nix::sys::signal::Signal::SIGTERM)?;
    let status = server.wait_exit(Duration::from_secs(20))?;
    assert_eq!(status.code(), Some(0), "stderr: {}", server.stderr());
    Ok(())
}

#[test]
fn registry_serve_without_tokens_is_read_only_and_says_so() -> TestResult {
    let storage = common::temp();
    let project = common::temp();
    let gdn = common::gdn_bin().env_remove("GOONDAN_REGISTRY_TOKENS");
    let mut command = gdn.command(["--json", "registry", "serve", "--port", "0", "--storage"]);
    command.arg(storage.path()).current_dir(project.path());
    let mut server = goondan_test_support::process::Running::spawn(command)?;
    let line = server.wait_for_line(Stream::Stdout, "\"url\"", Duration::from_secs(30))?;
    let announced: Value = serde_json::from_str(line.trim())?;
    let address = announced["url"].as_str().and_then(|url| url.strip_prefix("http://")).ok_or("no url")?.to_owned();
    server.wait_for_line(Stream::Stderr, "GOONDAN_REGISTRY_TOKENS is not set", Duration::from_secs(10))?;
    let (status, body) = http(&address, "GET", "/@goondan/base", None, None)?;
    assert_eq!((status, &body["error"]), (404, &json!("PKG_NOT_FOUND")));
    let (status, _) = http(&address, "DELETE", "/@goondan/base", Some("anything"), None)?;
    assert_eq!(status, 401);
    server.signal(nix::sys::signal::Signal::SIGTERM)?;
    assert_eq!(server.wait_exit(Duration::from_secs(20))?.code(), Some(0));
    Ok(())
}
