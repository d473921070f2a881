//! A client for the tests' HTTP/1.1 requests to a service on 127.0.0.1:
//! one POST on its own connection, the whole response read back.
//!
//! What is deliberately absent: keep-alive, chunked bodies, redirects; a
//! test that checks one of those writes its bytes itself.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

/// How long a response may take.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// POSTs `body` to `/` on 127.0.0.1:`port` with `headers` (besides `Host`,
/// `Content-Length` and `Connection: close`); the whole response as text
/// (as much as came, when the connection was cut).
pub fn post(port: u16, headers: &[(&str, &str)], body: &[u8]) -> std::io::Result<String> {
    post_within(port, headers, body, READ_TIMEOUT)
}

/// [`post`], the response given at most `timeout` between reads.
pub fn post_within(port: u16, headers: &[(&str, &str)], body: &[u8], timeout: Duration) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(timeout))?;
    let mut head =
        format!("POST / HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {}\r\nconnection: close\r\n", body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut response = Vec::new();
    // A connection cut after part of the response still gives that part
    // (a service killed mid-answer); with nothing read, the error.
    if let Err(error) = stream.read_to_end(&mut response)
        && response.is_empty()
    {
        return Err(error);
    }
    Ok(String::from_utf8_lossy(&response).into_owned())
}

/// POSTs `body` as JSON (`content-type: application/json`) with `headers`.
pub fn post_json(port: u16, headers: &[(&str, &str)], body: &serde_json::Value) -> std::io::Result<String> {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    post(port, &all, body.to_string().as_bytes())
}

/// The status code of a whole response (0 when it has none).
pub fn status(response: &str) -> u16 {
    response.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0)
}

/// The body of a whole response (empty when it has none).
pub fn body(response: &str) -> &str {
    response.split_once("\r\n\r\n").map_or("", |(_, body)| body)
}
